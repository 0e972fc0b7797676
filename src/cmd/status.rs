//! `xp status`: show experiments and their trials.

use xp_runtime::ids::TrialId;
use xp_runtime::protocol::ExperimentStatus;
use xp_runtime::protocol::TrialState;
use xp_runtime::protocol::TrialTelemetry;
use xp_runtime::protocol::{FrontStatus, ObjectiveStatus};
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
    let print = |status: &ExperimentStatus| {
        if json {
            outln!("{}", experiment_json(status));
        } else {
            print_status_table(status);
        }
    };
    let telemetry = match source.source()? {
        Source::DataDir(data_dir) => {
            offline::status(&data_dir, experiment.as_deref())?
                .iter()
                .for_each(print);
            None
        }
        Source::Cluster(cluster) => {
            let client = connect(&cluster).await?;
            print_pages(&client, experiment.as_deref(), print).await?;
            let telemetry = match trial {
                Some(trial) => Some(client.telemetry(trial).await?),
                None => None,
            };
            client.close().await;
            telemetry
        }
    };
    if let Some(telemetry) = telemetry {
        if json {
            outln!("{}", telemetry_json(&telemetry));
        } else {
            print_latest_sample(&telemetry);
        }
    }
    Ok(())
}

/// Follows the head's status pages, printing each experiment once all its
/// trials have come: one experiment at a time is held, however many there are.
async fn print_pages(
    client: &xp::Client,
    experiment: Option<&str>,
    print: impl Fn(&ExperimentStatus),
) -> anyhow::Result<()> {
    let mut held: Vec<ExperimentStatus> = Vec::new();
    let mut from = None;
    loop {
        let page = client.status_page(experiment, from).await?;
        from = page.next;
        page.merge_into(&mut held);
        // The last experiment may continue on the next page.
        let complete = held.len() - usize::from(from.is_some() && !held.is_empty());
        held.drain(..complete).for_each(|status| print(&status));
        if from.is_none() {
            return Ok(());
        }
    }
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

/// `val_acc (max), latency_ms (min)`.
pub(crate) fn objectives_text(objectives: &[ObjectiveStatus]) -> String {
    objectives
        .iter()
        .map(|objective| {
            format!(
                "{} ({})",
                objective.metric,
                if objective.maximize { "max" } else { "min" }
            )
        })
        .collect::<Vec<_>>()
        .join(", ")
}

/// The reference point and where it came from.
pub(crate) fn reference_text(reference: Option<&[f64]>, declared: bool) -> String {
    let Some(reference) = reference.filter(|reference| !reference.is_empty()) else {
        return "no reference yet (no trial reported every objective)".to_owned();
    };
    let values: Vec<String> = reference.iter().map(|value| format!("{value}")).collect();
    if declared {
        format!("reference [{}] (declared)", values.join(", "))
    } else {
        format!(
            "reference [{}] (default: {}; declare `search.reference` for a fixed one)",
            values.join(", "),
            xp_tune::search::front::DEFAULT_REFERENCE_RULE
        )
    }
}

/// A hypervolume, or why there is none (a front too large to slice exactly in
/// 3 or 4 objectives).
pub(crate) fn volume_text(volume: f64) -> String {
    if volume.is_nan() {
        "not computed (too large a front to slice exactly)".to_owned()
    } else {
        format!("{volume:.6}")
    }
}

/// A multi-objective experiment's front: its trials, their values and
/// configurations, largest hypervolume contribution first.
fn print_front(status: &ExperimentStatus, front: &FrontStatus) {
    outln!("  objectives: {}", objectives_text(&status.objectives));
    outln!(
        "  Pareto front: {} of {} evaluated trials, hypervolume {} against {}",
        front.trials.len(),
        front.evaluated,
        volume_text(front.hypervolume),
        reference_text(Some(&front.reference), front.reference_declared)
    );
    let mut header = format!("  {:<24}", "FRONT TRIAL");
    for objective in &status.objectives {
        header.push_str(&format!(" {:>14}", objective.metric));
    }
    outln!("{header} {:>12}  CONFIG", "CONTRIBUTION");
    for member in &front.trials {
        let mut row = format!("  {:<24}", member.trial.to_string());
        for value in &member.values {
            row.push_str(&format!(" {value:>14.6}"));
        }
        let config = status
            .trials
            .iter()
            .find(|trial| trial.id == member.trial)
            .map_or("", |trial| trial.config_json.as_str());
        outln!("{row} {:>12.6}  {config}", member.contribution);
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
                // The gang's size, which an elastic trial's resizes change.
                let size = match attempt.nodes.len() {
                    1 => String::new(),
                    workers => format!(" ({workers} workers)"),
                };
                outln!(
                    "  {:<24} attempt {}{size} on {}: {resumed}; {}",
                    "",
                    attempt.number,
                    nodes.join(","),
                    attempt.outcome.as_deref().unwrap_or("running")
                );
            }
        }
    }
    if let Some(front) = &status.front {
        print_front(status, front);
    }
}
