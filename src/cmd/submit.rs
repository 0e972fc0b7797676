//! `xp submit`: submit an experiment declared in YAML and print its id.

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::Context;
use xp::{Client, ExperimentSpec, SubmitOptions, Submitted};

use super::ClusterArg;
use super::connect;
use super::eprintln_note;
use super::watch::{expected_trials, print_results, watch};

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
    let spec = read_spec(&file)?;
    let client = connect(&cluster).await?;
    let submitted = submit_spec(&client, &spec, &file, rerun).await?;
    outln!("{}", submitted.experiment);
    let ended = if wait {
        let status = watch(&client, submitted.experiment, expected_trials(&spec)).await?;
        print_results(&status);
        super::ended::judge(&status)
    } else {
        Ok(())
    };
    client.close().await;
    Ok(ended?)
}

/// Reads and checks the experiment file `file`.
pub(crate) fn read_spec(file: &Path) -> anyhow::Result<ExperimentSpec> {
    let text =
        std::fs::read_to_string(file).with_context(|| format!("cannot read {}", file.display()))?;
    ExperimentSpec::from_yaml(&text)
        .with_context(|| format!("{} is not a valid experiment", file.display()))
}

/// Submits `spec`, read from `file` (relative paths in it are taken from the
/// file's directory), and notes when an identical experiment's results are reused.
pub(crate) async fn submit_spec(
    client: &Client,
    spec: &ExperimentSpec,
    file: &Path,
    rerun: bool,
) -> anyhow::Result<Submitted> {
    let base_dir = file.parent().map(|dir| {
        if dir.as_os_str().is_empty() {
            PathBuf::from(".")
        } else {
            dir.to_owned()
        }
    });
    let submitted = client
        .submit(
            spec,
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
    if submitted.reused {
        eprintln_note(
            "an identical experiment already finished; reusing its results (use --rerun to run it again)",
        );
    }
    Ok(submitted)
}
