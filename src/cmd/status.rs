//! `xp status`: show experiments and their trials.

use xp_runtime::protocol::ExperimentStatus;
use xp_runtime::protocol::TrialState;
use xp_runtime::views::experiment_json;

use super::connect;
use super::offline::{self, Source, SourceArg};

/// Show experiments and their trials.
#[derive(clap::Args, Debug)]
pub(crate) struct StatusArgs {
    /// An experiment id or a unique prefix; all experiments when absent.
    experiment: Option<String>,
    #[command(flatten)]
    source: SourceArg,
    /// One JSON object per experiment, one per line.
    #[arg(long)]
    json: bool,
}

pub(crate) async fn run(args: StatusArgs) -> anyhow::Result<()> {
    let StatusArgs {
        experiment,
        source,
        json,
    } = args;
    let list = match source.source()? {
        Source::DataDir(data_dir) => offline::status(&data_dir, experiment.as_deref())?,
        Source::Cluster(cluster) => {
            let client = connect(&cluster).await?;
            let list = client.status(experiment.as_deref()).await?;
            client.close().await;
            list
        }
    };
    for status in &list {
        if json {
            outln!("{}", experiment_json(status));
        } else {
            print_status_table(status);
        }
    }
    Ok(())
}

pub(crate) fn print_status_table(status: &ExperimentStatus) {
    let count = |state: TrialState| {
        status
            .trials
            .iter()
            .filter(|trial| trial.state == state)
            .count()
    };
    outln!(
        "experiment {}  {}  team {}  {}  ({} trials: {} succeeded, {} failed, {} running, {} waiting)",
        status.id,
        status.name,
        status.team,
        status.state.as_str(),
        status.trials.len(),
        count(TrialState::Succeeded),
        count(TrialState::Failed),
        count(TrialState::Running) + count(TrialState::Starting) + count(TrialState::Placed),
        count(TrialState::Pending) + count(TrialState::Queued),
    );
    outln!(
        "  {:<24} {:<10} {:>8}  {:<40} CONFIG",
        "TRIAL",
        "STATE",
        "ATTEMPTS",
        "METRICS"
    );
    for trial in &status.trials {
        let metrics: Vec<String> = trial
            .metrics
            .iter()
            .map(|(name, value)| format!("{name}={value:.4}"))
            .collect();
        outln!(
            "  {:<24} {:<10} {:>8}  {:<40} {}",
            trial.id.to_string(),
            trial.state.as_str(),
            trial.attempts.len(),
            metrics.join(" "),
            trial.config_json
        );
        if let Some(waiting) = &trial.waiting {
            outln!("  {:<24} waits: {waiting}", "");
        }
        if trial.attempts.len() > 1 || trial.attempts.iter().any(|a| a.resumed_from.is_some()) {
            for attempt in &trial.attempts {
                let nodes: Vec<String> = attempt
                    .nodes
                    .iter()
                    .map(|node| node.to_string().chars().take(8).collect())
                    .collect();
                let resumed = attempt.resumed_from.map_or_else(
                    || "from the start".to_owned(),
                    |(step, from)| format!("resumed from step {step} (attempt {from})"),
                );
                outln!(
                    "  {:<24} attempt {} on {}: {resumed}; {}",
                    "",
                    attempt.number,
                    nodes.join(","),
                    attempt.outcome.as_deref().unwrap_or("running")
                );
            }
        }
    }
}
