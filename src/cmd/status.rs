//! `xp status`: show experiments and their trials.

use xp_runtime::ids::TrialId;
use xp_runtime::protocol::ExperimentStatus;
use xp_runtime::protocol::TrialState;
use xp_runtime::protocol::TrialTelemetry;
use xp_runtime::views::{experiment_json, telemetry_json};

use super::connect;
use super::offline::{self, Source, SourceArg};

/// Show experiments and their trials.
#[derive(clap::Args, Debug)]
pub(crate) struct StatusArgs {
    /// An experiment id or a unique prefix; all experiments when absent. A
    /// trial id (`EXP-tN`) shows its experiment and the trial's latest
    /// telemetry sample per rank.
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
    let trial: Option<TrialId> = experiment.as_deref().and_then(|text| text.parse().ok());
    let experiment = trial
        .map(|trial| trial.experiment.to_string())
        .or(experiment);
    let (list, telemetry) = match source.source()? {
        Source::DataDir(data_dir) => (offline::status(&data_dir, experiment.as_deref())?, None),
        Source::Cluster(cluster) => {
            let client = connect(&cluster).await?;
            let list = client.status(experiment.as_deref()).await?;
            let telemetry = match trial {
                Some(trial) => Some(client.telemetry(trial).await?),
                None => None,
            };
            client.close().await;
            (list, telemetry)
        }
    };
    for status in &list {
        if json {
            outln!("{}", experiment_json(status));
        } else {
            print_status_table(status);
        }
    }
    if let Some(telemetry) = telemetry {
        if json {
            outln!("{}", telemetry_json(&telemetry));
        } else {
            print_latest_sample(&telemetry);
        }
    }
    Ok(())
}

/// Each rank's latest telemetry window, one line each.
fn print_latest_sample(telemetry: &TrialTelemetry) {
    if telemetry.workers.is_empty() {
        outln!("trial {}: no telemetry yet", telemetry.trial);
    }
    for worker in &telemetry.workers {
        let Some(window) = worker.windows.last() else {
            continue;
        };
        let mut parts = Vec::new();
        if let Some(cpu) = window.cpu_cores {
            parts.push(format!("cpu {:.2} cores", cpu.mean()));
        }
        if let Some(rss) = window.rss_bytes {
            parts.push(format!("rss {:.0} MiB", rss.mean() / f64::from(1u32 << 20)));
        }
        if let Some(util) = window.gpu_util {
            parts.push(format!("gpu {:.0}%", util.mean()));
        }
        if let Some(memory) = window.gpu_mem_bytes {
            parts.push(format!(
                "gpu memory {:.0} MiB",
                memory.mean() / f64::from(1u32 << 20)
            ));
        }
        if let Some(power) = window.gpu_power_w {
            parts.push(format!("{:.0} W", power.mean()));
        }
        outln!(
            "trial {} rank {}: {} (latest of {} samples)",
            telemetry.trial,
            worker.rank,
            parts.join(", "),
            window.samples
        );
    }
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
        // Why a rule stopped it (an alert, early stopping) is worth a line.
        if trial.state == TrialState::Stopped
            && let Some(reason) = &trial.reason
        {
            outln!("  {:<24} stopped: {reason}", "");
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
