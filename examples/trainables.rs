//! A driver binary with small Rust trainables, used by the end-to-end tests and as
//! a template for your own drivers.
//!
//! `trainables submit --cluster JOIN --trials N [--step-ms MS] [--steps S]` submits a
//! random search of the `quadratic` trainable and prints the experiment id. Nodes
//! re-execute this binary with `XP_ENTRY=quadratic` to run a trial.
#![allow(
    clippy::print_stdout,
    reason = "an example's output is for the person running it"
)]

use std::time::Duration;

use anyhow::Context;
use xp::{BoxError, Client, ExperimentSpec, SubmitOptions, Trainables, TrialContext};

/// Descends `(x - 3)^2` from the trial's `x` in `steps` steps, reporting the loss.
fn quadratic(ctx: &TrialContext) -> Result<(), BoxError> {
    let mut x = ctx.param_f64("x")?;
    let steps = ctx.param_i64("steps")?;
    let step_ms = u64::try_from(ctx.param_i64("step_ms")?)?;
    for step in 1..=steps {
        x -= 0.2 * 2.0 * (x - 3.0);
        ctx.report(
            step as u64,
            &[("loss", (x - 3.0).powi(2)), ("rank", f64::from(ctx.rank))],
        );
        #[expect(
            clippy::disallowed_methods,
            reason = "a synchronous trainable paces its steps"
        )]
        std::thread::sleep(Duration::from_millis(step_ms));
    }
    Ok(())
}

fn main() -> anyhow::Result<()> {
    Trainables::new()
        .register("quadratic", quadratic)
        .run_if_worker();
    let args: Vec<String> = std::env::args().collect();
    let value = |flag: &str| {
        args.iter()
            .position(|arg| arg == flag)
            .and_then(|idx| args.get(idx + 1))
            .cloned()
    };
    anyhow::ensure!(
        args.get(1).map(String::as_str) == Some("submit"),
        "usage: trainables submit --cluster JOIN --trials N [--step-ms MS] [--steps S]"
    );
    let cluster = value("--cluster")
        .or_else(|| std::env::var("XP_CLUSTER").ok())
        .context("--cluster is required")?;
    let trials: u32 = value("--trials")
        .unwrap_or_else(|| "6".to_owned())
        .parse()
        .context("--trials")?;
    let step_ms: u32 = value("--step-ms")
        .unwrap_or_else(|| "50".to_owned())
        .parse()
        .context("--step-ms")?;
    let steps: u32 = value("--steps")
        .unwrap_or_else(|| "5".to_owned())
        .parse()
        .context("--steps")?;
    let yaml = format!(
        "name: quadratic\nteam: tests\ntrial:\n  entry: quadratic\n  resources: {{cpu: 1}}\n  max_retries: 1\nsearch:\n  space:\n    x: {{uniform: [-10, 10]}}\n    steps: {{choice: [{steps}]}}\n    step_ms: {{choice: [{step_ms}]}}\n  metric: loss\n  trials: {trials}\n"
    );
    let spec = ExperimentSpec::from_yaml(&yaml)?;
    tokio::runtime::Runtime::new()?.block_on(async {
        let client = Client::connect(&cluster).await?;
        let submitted = client
            .submit(
                &spec,
                &SubmitOptions {
                    rerun: true,
                    ..SubmitOptions::default()
                },
            )
            .await?;
        println!("{}", submitted.experiment);
        client.close().await;
        Ok(())
    })
}
