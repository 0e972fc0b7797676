//! `xp status`: show experiments and their trials.

use xp_runtime::ids::TrialId;
use xp_runtime::protocol::TrialTelemetry;
use xp_runtime::protocol::{ExperimentStatus, StatusCursor};
use xp_runtime::protocol::{FrontStatus, ObjectiveStatus};
use xp_runtime::protocol::{TrialState, TrialStatus};
use xp_runtime::views::{experiment_json, telemetry_json, trial_json};

use super::connect;
use super::offline::{self, Source, SourceArg};

/// The most events `xp status EXPERIMENT-tN` shows: the trial's newest.
const TRIAL_EVENTS_SHOWN: u32 = 1000;

/// Show experiments and their trials.
#[derive(clap::Args, Debug)]
pub(crate) struct StatusArgs {
    /// An experiment id or a unique prefix; all experiments when absent. A
    /// trial id (`EXP-tN`) shows that trial in full (attempts and outcomes,
    /// metrics, checkpoints) and its latest telemetry sample per rank.
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
    let telemetry = match (source.source()?, trial) {
        (Source::DataDir(data_dir), Some(trial)) => {
            for status in offline::status(&data_dir, experiment.as_deref())? {
                print_one_trial(&status, trial, (&[], &[]), json)?;
            }
            None
        }
        (Source::DataDir(data_dir), None) => {
            offline::status(&data_dir, experiment.as_deref())?
                .iter()
                .for_each(print);
            None
        }
        (Source::Cluster(cluster), trial) => {
            let client = connect(&cluster).await?;
            let telemetry = match trial {
                Some(trial) => {
                    let status = experiment_from(&client, trial).await?;
                    let checkpoints = client.trial_checkpoints(trial).await?;
                    let events = client.trial_events(trial, TRIAL_EVENTS_SHOWN).await?;
                    print_one_trial(&status, trial, (&checkpoints, &events), json)?;
                    Some(client.telemetry(trial).await?)
                }
                None => {
                    print_pages(&client, experiment.as_deref(), print).await?;
                    None
                }
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

/// The experiment of `trial`, with its trials from `trial` on: one page of
/// the paged status, which the head starts at that trial, rather than every
/// trial of an experiment that may hold 100,000.
async fn experiment_from(client: &xp::Client, trial: TrialId) -> anyhow::Result<ExperimentStatus> {
    let from = StatusCursor {
        experiment: trial.experiment,
        trial: trial.index,
    };
    let page = client
        .status_page(Some(&trial.experiment.to_string()), Some(from))
        .await?;
    page.experiments
        .into_iter()
        .find(|status| status.id == trial.experiment)
        .ok_or_else(|| anyhow::anyhow!("no experiment {}", trial.experiment))
}

/// One trial of `status`: in full, or as its JSON object.
fn print_one_trial(
    status: &ExperimentStatus,
    trial: TrialId,
    (checkpoints, events): (
        &[xp_runtime::protocol::CheckpointStatus],
        &[xp_runtime::protocol::TrialEvent],
    ),
    json: bool,
) -> anyhow::Result<()> {
    if !json {
        return super::trial_detail::print_trial(status, trial, checkpoints, events);
    }
    let found = status
        .trials
        .iter()
        .find(|shown| shown.id == trial)
        .ok_or_else(|| anyhow::anyhow!("experiment {} has no trial {trial}", status.id))?;
    outln!("{}", trial_json(found));
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

/// `12 trials: 2 succeeded, 9 stopped, 1 failed`: every state that has trials,
/// in the order a trial goes through them.
pub(crate) fn counts_text(trials: &[TrialStatus]) -> String {
    const ORDER: [TrialState; 10] = [
        TrialState::Succeeded,
        TrialState::Stopped,
        TrialState::Failed,
        TrialState::Cancelled,
        TrialState::Running,
        TrialState::Preempting,
        TrialState::Starting,
        TrialState::Placed,
        TrialState::Queued,
        TrialState::Pending,
    ];
    let counts: Vec<String> = ORDER
        .iter()
        .map(|state| {
            (
                state,
                trials.iter().filter(|trial| trial.state == *state).count(),
            )
        })
        .filter(|(_, count)| *count > 0)
        .map(|(state, count)| format!("{count} {}", state.as_str()))
        .collect();
    let total = trials.len();
    let noun = if total == 1 { "trial" } else { "trials" };
    if counts.is_empty() {
        format!("{total} {noun}")
    } else {
        format!("{total} {noun}: {}", counts.join(", "))
    }
}

pub(crate) fn print_status_table(status: &ExperimentStatus) {
    outln!(
        "experiment {}  {}  team {}  {}  ({})",
        status.id,
        status.name,
        status.team,
        status.state.as_str(),
        counts_text(&status.trials),
    );
    outln!(
        "  {:<24} {:<10} {:>8}  {:<40} CONFIG",
        "TRIAL",
        "STATE",
        "ATTEMPTS",
        "METRICS"
    );
    let mut ordered: Vec<&TrialStatus> = status.trials.iter().collect();
    ordered.sort_by_key(|trial| trial.id.index);
    for trial in ordered {
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
