//! `xp submit`: submit an experiment declared in YAML and print its id.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context;
use xp::ExperimentSpec;
use xp::SubmitOptions;

use super::ClusterArg;
use super::connect;
use super::eprintln_note;
use super::status::print_status_table;

/// Submit an experiment declared in YAML and print its id.
#[derive(clap::Args, Debug)]
pub(crate) struct SubmitArgs {
    /// The experiment file.
    file: PathBuf,
    #[command(flatten)]
    cluster: ClusterArg,
    /// Run again even if an identical experiment already finished.
    #[arg(long)]
    rerun: bool,
    /// Wait for the experiment to finish, showing progress.
    #[arg(long)]
    wait: bool,
}

pub(crate) async fn run(args: SubmitArgs) -> anyhow::Result<()> {
    let SubmitArgs {
        file,
        cluster,
        rerun,
        wait,
    } = args;
    let text = std::fs::read_to_string(&file)
        .with_context(|| format!("cannot read {}", file.display()))?;
    let spec = ExperimentSpec::from_yaml(&text)
        .with_context(|| format!("{} is not a valid experiment", file.display()))?;
    let client = connect(&cluster).await?;
    let base_dir = file.parent().map(|dir| {
        if dir.as_os_str().is_empty() {
            PathBuf::from(".")
        } else {
            dir.to_owned()
        }
    });
    let submitted = client
        .submit(
            &spec,
            &SubmitOptions {
                rerun,
                base_dir,
                // A person at a prompt (or a script) hears "retry later" at
                // once; drivers built on the SDK wait and retry by themselves.
                admission_wait: Some(Duration::ZERO),
            },
        )
        .await
        .context("submission refused")?;
    outln!("{}", submitted.experiment);
    if submitted.reused {
        eprintln_note(
            "an identical experiment already finished; reusing its results (use --rerun to run it again)",
        );
    }
    if wait {
        let status = client
            .wait(submitted.experiment, |event| {
                eprintln_note(&format!("{} {} {}", event.trial, event.state, event.reason));
            })
            .await?;
        print_status_table(&status);
    }
    client.close().await;
    Ok(())
}
