//! What `xp report` answers: GPU-hours used and lost, cost, utilisation, the
//! queueing figures of Little's law, the return on GPU-hours and Amdahl fits.
//!
//! Plain data in the pure part of the crate, so that `xp-tune` (which computes
//! these figures and cannot link the protocol) and the wire
//! (`protocol::Response::Report`) share one shape; `views::report_json` is its
//! JSON form. The one rule computed here is [`lost_since`], so that `xp report`
//! and `xp sim` count work lost to a preemption the same way.
//!
//! Invariant: fields are append-only (this travels in bincode).

use serde::{Deserialize, Serialize};

use crate::clock::UnixMillis;
use crate::ids::{ExperimentId, TrialId};

/// From when an interrupted run's work is lost: the checkpoint it (or its next
/// run) resumes from, when that was taken during the run, else the run's start.
/// Everything from there to the end is done again.
pub fn lost_since(
    start: UnixMillis,
    end: UnixMillis,
    checkpoint_at: Option<UnixMillis>,
) -> UnixMillis {
    checkpoint_at
        .filter(|at| *at <= end)
        .map_or(start, |at| at.max(start))
}

/// The whole report for one scope (an experiment, a team or the cluster) and
/// one window of time.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct UsageReport {
    /// What the report covers, in words (`experiment 3f2a…-1`, `team vision`, `cluster`).
    pub scope: String,
    /// The window's start.
    pub window_start: UnixMillis,
    /// The window's end.
    pub window_end: UnixMillis,
    /// GPU-hours allocated to the scope's attempts inside the window (from
    /// placement to the attempt's end), fractional GPUs counted by their share.
    pub gpu_hours: f64,
    /// GPU-hours of work redone: from the last checkpoint an attempt's successor
    /// resumed from (or the attempt's start) to its end.
    pub gpu_hours_lost: f64,
    /// The lost GPU-hours by cause.
    pub lost_by_cause: LostByCause,
    /// GPU-hours per GPU model and what they cost.
    pub by_model: Vec<ModelUsage>,
    /// What the GPU-hours cost at the policy's prices; `None` when the policy
    /// names no prices.
    pub cost: Option<f64>,
    /// What the lost GPU-hours cost.
    pub cost_lost: Option<f64>,
    /// GPU-hours of models that have no price (and no `default`), counted as free.
    pub unpriced_gpu_hours: f64,
    /// GPU-hours the cluster's nodes offered inside the window (GPUs registered
    /// times the time each node was up).
    pub available_gpu_hours: f64,
    /// `gpu_hours / available_gpu_hours`; `None` when nothing was available.
    pub utilization: Option<f64>,
    /// GPU-hours the GPUs were busy, from node telemetry, where there is any.
    pub busy_gpu_hours: Option<f64>,
    /// `busy_gpu_hours / available_gpu_hours`.
    pub busy_utilization: Option<f64>,
    /// Arrivals, departures and Little's law.
    pub queueing: Queueing,
    /// The return on GPU-hours of each experiment in scope that declares a metric.
    pub returns: Vec<ExperimentReturn>,
    /// Amdahl's law fitted to groups of runs of the same work at several
    /// parallelism settings.
    pub amdahl: Vec<AmdahlFit>,
}

/// Lost GPU-hours by what ended the attempt.
#[derive(Debug, Clone, Copy, PartialEq, Default, Serialize, Deserialize)]
pub struct LostByCause {
    /// Preempted by the scheduler.
    pub preemption: f64,
    /// Failed through the trial's own fault (exit status, out of memory, time limit).
    pub failure: f64,
    /// Lost with its node (or refused, or stopped by it).
    pub node_loss: f64,
}

/// One GPU model's part of the usage.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct ModelUsage {
    /// The model (`declared` for `--gpus N` slots).
    pub model: String,
    /// GPU-hours used.
    pub gpu_hours: f64,
    /// Its price per GPU-hour, if the policy gives one.
    pub price_per_hour: Option<f64>,
    /// What they cost.
    pub cost: Option<f64>,
}

/// Trials arriving and leaving in the window, and the Little's-law check.
#[derive(Debug, Clone, Copy, PartialEq, Default, Serialize, Deserialize)]
pub struct Queueing {
    /// Trials that arrived (were created) inside the window.
    pub arrived: u64,
    /// Trials that finished inside the window.
    pub finished: u64,
    /// λ: trials finished per hour of the window.
    pub throughput_per_hour: f64,
    /// W: mean seconds from arrival to finish of the trials finished in the window.
    pub mean_time_in_system_s: Option<f64>,
    /// L: the time-average number of trials in the system over the window.
    pub mean_in_system: f64,
    /// L / (λ W): 1 when every trial counted arrives and leaves inside the window.
    pub littles_law_ratio: Option<f64>,
}

/// How the best metric of one experiment grew with the GPU-hours spent.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ExperimentReturn {
    /// The experiment.
    pub experiment: ExperimentId,
    /// Its metric.
    pub metric: String,
    /// Whether larger is better.
    pub maximize: bool,
    /// Its GPU-hours in the window.
    pub gpu_hours: f64,
    /// What they cost.
    pub cost: Option<f64>,
    /// The best metric so far at each finish that reported it, in finish order,
    /// against the GPU-hours spent by then.
    pub best_vs_gpu_hours: Vec<BestPoint>,
    /// The best value at the end.
    pub best: Option<f64>,
    /// How much the best improved during the last 25% of the GPU-hours (in the
    /// metric's units, positive when better).
    pub last_quarter_gain: Option<f64>,
    /// What a unit of the metric is worth, as the experiment declares.
    pub value_per_unit: Option<f64>,
    /// `(gain × value − cost) / cost` in percent for the last quarter of the
    /// GPU-hours: what that quarter bought against what it cost.
    pub roi_percent: Option<f64>,
}

/// One step of the best-so-far curve.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct BestPoint {
    /// GPU-hours spent when the trial finished.
    pub gpu_hours: f64,
    /// The best value so far.
    pub best: f64,
    /// The trial that finished.
    pub trial: TrialId,
    /// Its own value.
    pub value: f64,
}

/// Amdahl's law fitted to one group of runs of the same work.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct AmdahlFit {
    /// The work (experiment name).
    pub name: String,
    /// What was varied: `parallel` (a sweep's concurrent trials) or `workers`
    /// (a data-parallel trial's ranks).
    pub varied: String,
    /// The measurements, by parallelism.
    pub points: Vec<SpeedupPoint>,
    /// The serial fraction s fitted by least squares on 1/S(p) = s + (1 − s)/p.
    pub serial_fraction: f64,
    /// Twice the largest parallelism measured.
    pub predicted_parallelism: f64,
    /// The speed-up the fit predicts there.
    pub predicted_speedup: f64,
}

/// One measured parallelism setting.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct SpeedupPoint {
    /// The parallelism.
    pub parallelism: f64,
    /// The mean wall-clock seconds the work took there.
    pub seconds: f64,
    /// The measured speed-up against one (measured, or the fit's extrapolation
    /// when no run had parallelism 1).
    pub speedup: f64,
    /// The experiments measured.
    pub experiments: Vec<ExperimentId>,
}

#[cfg(test)]
mod tests {
    use super::lost_since;

    #[test]
    fn work_is_lost_from_the_checkpoint_taken_during_the_run() {
        assert_eq!(lost_since(100, 500, Some(300)), 300);
        // None, or one from before the run (an earlier attempt's): all of it.
        assert_eq!(lost_since(100, 500, None), 100);
        assert_eq!(lost_since(100, 500, Some(50)), 100);
        // One after the end cannot be what it resumes from.
        assert_eq!(lost_since(100, 500, Some(600)), 100);
    }
}
