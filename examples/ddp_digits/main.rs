//! Data-parallel training: the digits MLP trained by W workers that split every
//! global batch and sum their gradient shards with a ring all-reduce, so each step
//! equals single-worker training on the same global batch and seed.
//!
//! `ddp_digits [--workers W] [--epochs E] [--sweep]` submits the training (or,
//! with `--sweep`, a small sweep of data-parallel trials) to the cluster named by
//! `XP_CLUSTER`, waits, and prints the loss curve. Without `XP_CLUSTER` it runs on
//! an embedded local cluster. (`--cluster JOIN` also works, but shows the cluster
//! secret to every local user in `ps`.)
#![allow(
    clippy::print_stdout,
    reason = "an example's output is for the person running it"
)]

#[path = "../quickstart/digits.rs"]
mod digits;

use anyhow::Context;
use xp::{
    BoxError, Cluster, ExperimentSpec, LocalOptions, ReduceOp, SubmitOptions, Trainables,
    TrialContext,
};

fn train(ctx: &TrialContext) -> Result<(), BoxError> {
    let config = digits::DigitsConfig {
        learning_rate: ctx.param_f64("lr")?,
        hidden: usize::try_from(ctx.param_i64("hidden")?)?,
        epochs: usize::try_from(ctx.param_i64("epochs")?)?,
        batch_size: 32,
        weight_decay: 1e-4,
        seed: ctx.seed,
    };
    let (rank, world) = (ctx.rank as usize, ctx.world_size as usize);
    let mut communicator = if world > 1 {
        Some(ctx.collective()?)
    } else {
        None
    };
    // How many of rank 0's ring links use shared memory (2 when the gang shares
    // a node), reported so the tests see the ring took the fast path.
    let shm_links = communicator.as_mut().map_or(0, |communicator| {
        communicator
            .communicator()
            .link_transports()
            .iter()
            .filter(|transport| **transport == "shm")
            .count()
    });
    let mut sum_across_ranks = |buffer: &mut [f32]| -> anyhow::Result<()> {
        if let Some(communicator) = communicator.as_mut() {
            communicator.all_reduce(buffer, ReduceOp::Sum)?;
        }
        Ok(())
    };
    digits::train_sharded(&config, rank, world, &mut sum_across_ranks, |report| {
        // Every rank holds the same model; rank 0 speaks for the trial.
        if rank == 0 {
            ctx.report(
                report.epoch as u64,
                &[
                    ("train_loss", report.train_loss),
                    ("val_loss", report.val_loss),
                    ("val_accuracy", report.val_accuracy),
                    ("shm_links", shm_links as f64),
                ],
            );
        }
    })?;
    Ok(())
}

fn main() -> anyhow::Result<()> {
    Trainables::new()
        .register("digits_ddp", train)
        .run_if_worker();
    let args: Vec<String> = std::env::args().collect();
    let value = |flag: &str| {
        args.iter()
            .position(|arg| arg == flag)
            .and_then(|idx| args.get(idx + 1))
            .cloned()
    };
    let workers: u32 = value("--workers")
        .unwrap_or_else(|| "2".to_owned())
        .parse()
        .context("--workers")?;
    let epochs: u32 = value("--epochs")
        .unwrap_or_else(|| "10".to_owned())
        .parse()
        .context("--epochs")?;
    let sweep = args.iter().any(|arg| arg == "--sweep");
    let cluster_arg = value("--cluster").or_else(|| std::env::var("XP_CLUSTER").ok());
    let learning_rates = if sweep { "[0.02, 0.05, 0.1]" } else { "[0.05]" };
    let yaml = format!(
        "name: ddp-digits\nteam: examples\ntrial:\n  entry: digits_ddp\n  workers: {workers}\n  resources: {{cpu: 1}}\n  max_retries: 1\nsearch:\n  algorithm: grid\n  space:\n    lr: {{choice: {learning_rates}}}\n    hidden: {{choice: [64]}}\n    epochs: {{choice: [{epochs}]}}\n  metric: val_accuracy\n  mode: max\n  seed: 3\n"
    );
    let spec = ExperimentSpec::from_yaml(&yaml)?;
    tokio::runtime::Runtime::new()?.block_on(async {
        let cluster = match cluster_arg {
            Some(join) => Cluster::connect(&join).await?,
            None => {
                Cluster::local_with(LocalOptions {
                    cpus: Some(f64::from(workers.max(2))),
                    ..LocalOptions::default()
                })
                .await?
            }
        };
        let submitted = cluster
            .submit(
                &spec,
                &SubmitOptions {
                    rerun: true,
                    ..SubmitOptions::default()
                },
            )
            .await?;
        println!("{}", submitted.experiment);
        if args.iter().any(|arg| arg == "--no-wait") {
            cluster.shutdown().await;
            return Ok(());
        }
        let status = cluster.wait(submitted.experiment, |_| {}).await?;
        for trial in &status.trials {
            println!("{} {} {}", trial.id, trial.state, trial.config_json);
            for point in cluster
                .metrics(trial.id)
                .await?
                .iter()
                .filter(|point| point.rank == 0)
            {
                let values: Vec<String> = point
                    .values
                    .iter()
                    .map(|(name, value)| format!("{name}={value:.5}"))
                    .collect();
                println!(
                    "  epoch {:>3}  {}",
                    point.step.unwrap_or_default(),
                    values.join("  ")
                );
            }
        }
        cluster.shutdown().await;
        anyhow::Ok(())
    })
}
