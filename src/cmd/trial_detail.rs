//! `xp status EXP-tN`: one trial in full: its state and why, each attempt
//! with its nodes and outcome (a failure's outcome ends with its stderr's last
//! lines), its metrics, the metric lines that could not be read, its events
//! (warnings among them), its checkpoints and its configuration.

use std::fmt::Write as _;

use xp_runtime::ids::TrialId;
use xp_runtime::protocol::{CheckpointStatus, ExperimentStatus, TrialEvent, TrialStatus};

/// Prints `trial` of `status` (with its `checkpoints`), or says it is not there.
pub(crate) fn print_trial(
    status: &ExperimentStatus,
    trial: TrialId,
    checkpoints: &[CheckpointStatus],
    events: &[TrialEvent],
) -> anyhow::Result<()> {
    let Some(found) = status.trials.iter().find(|shown| shown.id == trial) else {
        anyhow::bail!("experiment {} has no trial {trial}", status.id);
    };
    outln!(
        "trial {}  {}  (experiment {} {}, team {})",
        found.id,
        found.state.as_str(),
        status.id,
        status.name,
        status.team
    );
    if let Some(reason) = &found.reason {
        outln!("  why:      {reason}");
    }
    if let Some(waiting) = &found.waiting {
        outln!("  waits:    {waiting}");
    }
    if let Some(source) = found.reused_from {
        outln!("  reuses:   the result of {source}");
    }
    outln!("  config:   {}", found.config_json);
    print_metrics(status, found);
    print_attempts(found);
    let mine: Vec<&TrialEvent> = events.iter().filter(|event| event.trial == trial).collect();
    if !mine.is_empty() {
        outln!("  events:");
        for event in mine {
            let at = std::time::UNIX_EPOCH + std::time::Duration::from_millis(event.at);
            outln!(
                "    {}  attempt {}  {:<10} {}",
                humantime::format_rfc3339_seconds(at),
                event.attempt,
                event.state.as_str(),
                event.reason
            );
        }
    }
    let mine: Vec<&CheckpointStatus> = checkpoints
        .iter()
        .filter(|checkpoint| checkpoint.trial == trial)
        .collect();
    if !mine.is_empty() {
        outln!("  checkpoints:");
        for checkpoint in mine {
            outln!(
                "    step {:<8} attempt {}  {} bytes in {} files, {} replicas{}",
                checkpoint.step,
                checkpoint.attempt,
                checkpoint.bytes,
                checkpoint.files.len(),
                checkpoint.replicas.len(),
                checkpoint
                    .unreplicated
                    .as_deref()
                    .map_or_else(String::new, |why| format!(" ({why})"))
            );
        }
    }
    Ok(())
}

/// Its metrics at full precision, the search's first, and the lines that
/// could not be read.
fn print_metrics(status: &ExperimentStatus, trial: &TrialStatus) {
    let mut names: Vec<&String> = trial.metrics.keys().collect();
    names.sort_by_key(|name| Some(*name) != status.metric.as_ref());
    let mut line = String::new();
    for name in names {
        let _ = write!(line, " {name}={}", trial.metrics[name]);
    }
    match (line.is_empty(), &status.metric) {
        (false, _) => outln!("  metrics: {line}"),
        (true, Some(metric)) => {
            outln!("  metrics:  none reported (the search's metric is {metric})")
        }
        (true, None) => outln!("  metrics:  none reported"),
    }
    if let Some(step) = trial.last_step {
        outln!("  step:     {step}");
    }
    if let Some(malformed) = &trial.malformed_metrics {
        outln!(
            "  unread:   {} metric line{} could not be read; the first: {}",
            malformed.count,
            if malformed.count == 1 { "" } else { "s" },
            malformed.first
        );
    }
}

/// Each attempt: its gang's nodes, where it resumed from, and its outcome
/// (a multi-line one indented under it).
fn print_attempts(trial: &TrialStatus) {
    for attempt in &trial.attempts {
        let nodes: Vec<String> = attempt
            .nodes
            .iter()
            .map(|node| node.to_string().chars().take(8).collect())
            .collect();
        let size = match attempt.nodes.len() {
            1 => String::new(),
            workers => format!(" ({workers} workers)"),
        };
        let resumed = attempt.resumed_from.map_or_else(
            || "from the start".to_owned(),
            |(step, from)| format!("resumed from step {step} (attempt {from})"),
        );
        let outcome = attempt.outcome.as_deref().unwrap_or("running");
        let mut lines = outcome.lines();
        outln!(
            "  attempt {}{size} on {}: {resumed}; {}",
            attempt.number,
            nodes.join(","),
            lines.next().unwrap_or_default()
        );
        for line in lines {
            outln!("      | {line}");
        }
    }
}
