//! The simulator's report and the statistics it is built from.
//!
//! Times are in seconds. Percentiles use the nearest-rank method; the median of
//! an even count is the mean of the two middle values. This module only
//! computes and formats numbers; the CLI prints them.

use std::collections::BTreeMap;

use serde_json::{Value, json};

use crate::GPU_MILLI;

/// Mean, median and 99th percentile of a sample.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Summary {
    /// How many values.
    pub count: u64,
    /// Their mean.
    pub mean: f64,
    /// Their median.
    pub median: f64,
    /// Their 99th percentile (nearest rank).
    pub p99: f64,
}

impl Summary {
    /// Summarises `values` (sorting them); `None` when empty.
    pub fn of(values: &mut [f64]) -> Option<Self> {
        if values.is_empty() {
            return None;
        }
        values.sort_unstable_by(f64::total_cmp);
        let count = values.len();
        let mean = values.iter().sum::<f64>() / count as f64;
        let median = if count % 2 == 1 {
            values[count / 2]
        } else {
            (values[count / 2 - 1] + values[count / 2]) / 2.0
        };
        Some(Self {
            count: count as u64,
            mean,
            median,
            p99: percentile_sorted(values, 0.99),
        })
    }
}

/// The nearest-rank percentile `fraction` (0 to 1) of sorted, non-empty `values`.
pub fn percentile_sorted(values: &[f64], fraction: f64) -> f64 {
    assert!(!values.is_empty(), "a percentile of nothing");
    let rank = (fraction * values.len() as f64).ceil() as usize;
    values[rank.clamp(1, values.len()) - 1]
}

/// Jain's fairness index `(Σx)² / (n Σx²)`: 1 when all are equal, `1/n` when one has
/// everything. An empty or all-zero input counts as perfectly fair.
pub fn jain_index(values: &[f64]) -> f64 {
    let sum: f64 = values.iter().sum();
    let squares: f64 = values.iter().map(|value| value * value).sum();
    if values.is_empty() || squares == 0.0 {
        return 1.0;
    }
    sum * sum / (values.len() as f64 * squares)
}

/// One team's part of the report.
#[derive(Debug, Clone, PartialEq)]
pub struct TeamReport {
    /// The team.
    pub name: String,
    /// Its jobs in the trace.
    pub jobs: u64,
    /// Its jobs that completed.
    pub completed: u64,
    /// GPU-hours its jobs held (including work later lost to preemption).
    pub gpu_hours: f64,
    /// Its fraction of all GPU-hours held.
    pub share: f64,
    /// Mean completion time of its completed jobs, in seconds.
    pub jct_mean: Option<f64>,
}

/// Little's law: the time-average number of jobs in the system, against the
/// arrival rate times the mean time in the system. They agree when the system
/// starts and ends empty.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LittlesLaw {
    /// The time-average number of jobs submitted and not yet ended.
    pub l: f64,
    /// Arrivals per second over the simulated span.
    pub lambda: f64,
    /// Mean seconds from submission to end, over the jobs that ended.
    pub w: f64,
}

/// Where each job stands when the simulation ends; every job is in exactly one.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Outcomes {
    /// Ran to the end of its duration.
    pub completed: u64,
    /// Killed at its time limit.
    pub killed: u64,
    /// Running (or stopping after a preemption) when the simulation ended.
    pub running: u64,
    /// Submitted and waiting when the simulation ended (never placed, or preempted and not placed again).
    pub waiting: u64,
    /// Never submitted because a dependency never completed.
    pub blocked: u64,
    /// Refused by the policy at submission (unknown queue, invalid shape).
    pub refused: u64,
    /// Never submitted because the simulation ended (`--until`) before its time.
    pub not_arrived: u64,
}

/// Everything `xp sim` reports.
#[derive(Debug, Clone, PartialEq)]
pub struct SimReport {
    /// Jobs in the trace.
    pub jobs: u64,
    /// Where they ended up.
    pub outcomes: Outcomes,
    /// Jobs never placed (waiting, blocked, refused or not arrived at the end).
    pub never_started: u64,
    /// Completion time (end minus submission) of completed jobs, seconds.
    pub jct: Option<Summary>,
    /// Delay from submission to first placement of every job placed, seconds.
    pub queue_delay: Option<Summary>,
    /// From the first submission to the last job's end (completed or killed), seconds.
    pub makespan: f64,
    /// The simulated span: from the first submission to the end of the simulation, seconds.
    pub span: f64,
    /// GPU time held over GPU time offered during the span, 0 to 1.
    pub gpu_utilization: f64,
    /// GPU time held over GPU time offered from the first to the last submission of
    /// the trace: the loaded part, without the drain at the end. `None` when all jobs
    /// are submitted at once.
    pub gpu_utilization_arrivals: Option<f64>,
    /// GPU-hours held by all jobs.
    pub gpu_hours: f64,
    /// Per team, in order of first appearance in the trace.
    pub teams: Vec<TeamReport>,
    /// Jain's index over the teams' GPU-hours.
    pub jain_fairness: f64,
    /// Preempted jobs that actually stopped (a victim that finishes within its grace period does not count).
    pub preemptions: u64,
    /// Preempt decisions the policy made.
    pub preempt_decisions: u64,
    /// Elastic jobs' resizes carried out (each a checkpoint and a restart).
    pub resizes: u64,
    /// Work lost to preemption (since the last checkpoint) times the GPUs held, GPU-seconds.
    pub gpu_seconds_lost: f64,
    /// Placements of gangs holding more than one GPU.
    pub multi_gpu_placements: u64,
    /// Of those, the fraction inside one node.
    pub multi_gpu_one_node: Option<f64>,
    /// Of those, the fraction inside one rack (one node counts as one rack).
    pub multi_gpu_one_rack: Option<f64>,
    /// The Little's-law check.
    pub littles_law: LittlesLaw,
    /// Submissions refused for too many pending trials and retried later.
    pub submit_retries: u64,
    /// Why the jobs still waiting at the end wait, counted by reason.
    pub wait_reasons: BTreeMap<String, u64>,
    /// Calls of the policy's `decide`.
    pub decide_calls: u64,
    /// Place decisions.
    pub placements: u64,
    /// Events processed (arrivals, ends, stops).
    pub events: u64,
    /// The pipelines (dependency-connected jobs); `None` when the trace has none.
    pub pipelines: Option<PipelineReport>,
}

/// The pipelines' part of the report.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct PipelineReport {
    /// Pipelines in the trace: connected parts of its dependency graph with at
    /// least two jobs.
    pub pipelines: u64,
    /// Those whose every job completed.
    pub completed: u64,
    /// Per completed pipeline, from its first submission to its last end, seconds.
    pub makespan: Option<Summary>,
    /// Those makespans summed, seconds.
    pub makespan_total: f64,
}

fn summary_json(summary: Option<Summary>, pick: fn(&Summary) -> f64) -> Value {
    summary.map_or(Value::Null, |summary| json!(pick(&summary)))
}

impl SimReport {
    /// The report as one JSON object (times in seconds).
    pub fn to_json(&self) -> Value {
        let teams: serde_json::Map<String, Value> = self
            .teams
            .iter()
            .map(|team| {
                (
                    team.name.clone(),
                    json!({
                        "jobs": team.jobs,
                        "completed": team.completed,
                        "gpu_hours": team.gpu_hours,
                        "share": team.share,
                        "jct_mean": team.jct_mean,
                    }),
                )
            })
            .collect();
        let outcomes = &self.outcomes;
        json!({
            "jobs": self.jobs,
            "completed": outcomes.completed,
            "killed": outcomes.killed,
            "unfinished": outcomes.running + outcomes.waiting + outcomes.blocked + outcomes.refused + outcomes.not_arrived,
            "never_started": self.never_started,
            "outcomes": {
                "completed": outcomes.completed,
                "killed": outcomes.killed,
                "running": outcomes.running,
                "waiting": outcomes.waiting,
                "blocked": outcomes.blocked,
                "refused": outcomes.refused,
                "not_arrived": outcomes.not_arrived,
            },
            "jct_mean": summary_json(self.jct, |summary| summary.mean),
            "jct_median": summary_json(self.jct, |summary| summary.median),
            "jct_p99": summary_json(self.jct, |summary| summary.p99),
            "queue_delay_mean": summary_json(self.queue_delay, |summary| summary.mean),
            "queue_delay_median": summary_json(self.queue_delay, |summary| summary.median),
            "queue_delay_p99": summary_json(self.queue_delay, |summary| summary.p99),
            "makespan": self.makespan,
            "span": self.span,
            "gpu_utilization": self.gpu_utilization,
            "gpu_utilization_arrivals": self.gpu_utilization_arrivals,
            "gpu_hours": self.gpu_hours,
            "jain_fairness": self.jain_fairness,
            "preemptions": self.preemptions,
            "preempt_decisions": self.preempt_decisions,
            "resizes": self.resizes,
            "gpu_seconds_lost": self.gpu_seconds_lost,
            "multi_gpu_placements": self.multi_gpu_placements,
            "multi_gpu_one_node": self.multi_gpu_one_node,
            "multi_gpu_one_rack": self.multi_gpu_one_rack,
            "littles_law": {
                "l": self.littles_law.l,
                "lambda_w": self.littles_law.lambda * self.littles_law.w,
                "lambda": self.littles_law.lambda,
                "w": self.littles_law.w,
            },
            "teams": teams,
            "submit_retries": self.submit_retries,
            "wait_reasons": self.wait_reasons,
            "decide_calls": self.decide_calls,
            "placements": self.placements,
            "events": self.events,
            "pipelines": self.pipelines.map_or(Value::Null, |pipelines| json!({
                "count": pipelines.pipelines,
                "completed": pipelines.completed,
                "makespan_mean": summary_json(pipelines.makespan, |summary| summary.mean),
                "makespan_median": summary_json(pipelines.makespan, |summary| summary.median),
                "makespan_p99": summary_json(pipelines.makespan, |summary| summary.p99),
                "makespan_total": pipelines.makespan_total,
            })),
        })
    }
}

/// GPU hours in this many GPU-thousandth milliseconds.
pub(super) fn gpu_hours_of(milli_ms: u128) -> f64 {
    milli_ms as f64 / (GPU_MILLI as f64 * 3_600_000.0)
}

/// Every job's outcome counted for the report, with the samples of its
/// distributions.
#[derive(Debug, Default)]
pub(super) struct Tally {
    pub(super) outcomes: Outcomes,
    /// Job completion times of completed jobs, in seconds.
    pub(super) jct: Vec<f64>,
    /// Waits before the first start, in seconds.
    pub(super) queue_delay: Vec<f64>,
    pub(super) never_started: u64,
    /// Time in the system of completed and killed jobs, summed.
    pub(super) time_in_system_ms: u128,
    /// Jobs completed or killed.
    pub(super) departed: u64,
    /// Jobs offered to the policy.
    pub(super) arrived: u64,
    /// Per team: jobs, completed jobs and their completion times summed.
    pub(super) team_jobs: Vec<u64>,
    pub(super) team_completed: Vec<u64>,
    pub(super) team_jct_sum: Vec<f64>,
    /// Jobs still waiting, by why.
    pub(super) wait_reasons: BTreeMap<String, u64>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn summary_of_known_values() {
        let summary = Summary::of(&mut [30.0, 10.0, 20.0]).unwrap();
        assert_eq!(
            (summary.count, summary.mean, summary.median, summary.p99),
            (3, 20.0, 20.0, 30.0)
        );
        let even = Summary::of(&mut [4.0, 1.0, 3.0, 2.0]).unwrap();
        assert_eq!(even.median, 2.5);
        assert_eq!(Summary::of(&mut []), None);
        let mut hundred: Vec<f64> = (1..=100).map(f64::from).collect();
        assert_eq!(Summary::of(&mut hundred).unwrap().p99, 99.0);
        let mut thousand: Vec<f64> = (1..=1000).map(f64::from).collect();
        assert_eq!(Summary::of(&mut thousand).unwrap().p99, 990.0);
    }

    #[test]
    fn jain_index_bounds() {
        assert_eq!(jain_index(&[5.0, 5.0, 5.0, 5.0]), 1.0);
        assert!((jain_index(&[1.0, 0.0, 0.0, 0.0]) - 0.25).abs() < 1e-12);
        assert!((jain_index(&[3.0, 1.0]) - 0.8).abs() < 1e-12);
        assert_eq!(jain_index(&[]), 1.0);
        assert_eq!(jain_index(&[0.0, 0.0]), 1.0);
    }
}
