//! The main job: an embedded local cluster runs a random-search sweep of a real
//! classifier of handwritten digits, shows progress, and ends with a table of
//! configurations and validation accuracy.
//!
//! The binary is its own worker: the node re-executes it with `XP_ENTRY=digits`,
//! and `Trainables::run_if_worker` runs the training function instead of `main`.
#![allow(
    clippy::print_stdout,
    reason = "an example's output is for the person running it"
)]

mod digits;

use anyhow::Context;
use xp::{
    BoxError, Cluster, ExperimentSpec, LocalOptions, SubmitOptions, Trainables, TrialContext,
    TrialState,
};

const SWEEP: &str = include_str!("sweep.yaml");

fn train_digits(ctx: &TrialContext) -> Result<(), BoxError> {
    let config = digits::DigitsConfig {
        learning_rate: ctx.param_f64("lr")?,
        hidden: usize::try_from(ctx.param_i64("hidden")?)?,
        epochs: usize::try_from(ctx.param_i64("epochs")?)?,
        batch_size: 32,
        weight_decay: ctx.param_f64("weight_decay")?,
        seed: ctx.seed,
    };
    digits::train(&config, |report| {
        ctx.report(
            report.epoch as u64,
            &[
                ("train_loss", report.train_loss),
                ("val_loss", report.val_loss),
                ("val_accuracy", report.val_accuracy),
            ],
        );
    })?;
    Ok(())
}

fn main() -> anyhow::Result<()> {
    Trainables::new()
        .register("digits", train_digits)
        .run_if_worker();
    tokio::runtime::Runtime::new()
        .context("cannot start the async runtime")?
        .block_on(drive())
}

async fn drive() -> anyhow::Result<()> {
    let spec = ExperimentSpec::from_yaml(SWEEP).context("the bundled sweep.yaml is invalid")?;
    let cores = std::thread::available_parallelism().map_or(2, |n| n.get());
    println!(
        "starting a local cluster (one head, one node offering {} CPU slots)",
        cores.max(2)
    );
    let cluster = Cluster::local_with(LocalOptions {
        cpus: Some(cores.max(2) as f64),
        ..LocalOptions::default()
    })
    .await
    .context("cannot start the local cluster")?;
    let submitted = cluster
        .submit(&spec, &SubmitOptions::default())
        .await
        .context("submission refused")?;
    println!(
        "experiment {} submitted: {} trials of `{}`",
        submitted.experiment, submitted.trials, spec.name
    );
    let total = submitted.trials;
    let mut done = 0;
    let status = cluster
        .wait(submitted.experiment, |event| {
            if event.state.is_terminal() {
                done += 1;
                println!(
                    "[{done:>2}/{total}] {} {} ({})",
                    event.trial, event.state, event.reason
                );
            } else if event.state == TrialState::Running {
                println!("        {} running", event.trial);
            }
        })
        .await?;

    let mut rows: Vec<_> = status
        .trials
        .iter()
        .map(|trial| {
            (
                trial
                    .metrics
                    .get("val_accuracy")
                    .copied()
                    .unwrap_or(f64::NAN),
                trial,
            )
        })
        .collect();
    rows.sort_by(|a, b| b.0.total_cmp(&a.0));
    println!(
        "\n{:<22} {:<10} {:>9} {:>7} {:>7} {:>12} {:>8}",
        "trial", "state", "lr", "hidden", "epochs", "weight_decay", "val_acc"
    );
    for (accuracy, trial) in &rows {
        let config: serde_json::Value = serde_json::from_str(&trial.config_json)?;
        println!(
            "{:<22} {:<10} {:>9.5} {:>7} {:>7} {:>12.2e} {:>8.4}",
            trial.id.to_string(),
            trial.state.as_str(),
            config["lr"].as_f64().unwrap_or(f64::NAN),
            config["hidden"].as_i64().unwrap_or_default(),
            config["epochs"].as_i64().unwrap_or_default(),
            config["weight_decay"].as_f64().unwrap_or(f64::NAN),
            accuracy
        );
    }
    let best = rows.first().map_or(f64::NAN, |row| row.0);
    println!("\nbest validation accuracy: {best:.4}");
    cluster.shutdown().await;
    anyhow::ensure!(
        best >= 0.90,
        "the best trial reached only {best:.4} validation accuracy"
    );
    Ok(())
}
