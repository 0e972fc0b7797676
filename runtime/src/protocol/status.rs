//! What the head reports about experiments, trials, nodes, queues and
//! checkpoints: the shapes of `xp status`, `xp nodes`, `xp queues` and
//! `xp checkpoints`, as they cross the wire inside a [`super::Response`].
//!
//! These are views assembled by the head; nothing here decides a state change,
//! and the HTTP API's JSON shapes live in `crate::views`, not here.
//!
//! Invariant: enum variants and struct fields are append-only (bincode is not
//! self-describing); a removed variant keeps its slot.

use std::collections::BTreeMap;
use std::fmt;

use serde::{Deserialize, Serialize};

use super::{CheckpointFile, NodeIsolation, NodeResources};
use crate::clock::UnixMillis;
use crate::ids::{ExperimentId, NodeId, TrialId};

/// One scheduling queue's standing. Amounts are GPUs and CPU cores (fractional)
/// and memory bytes; `None` in a quota means unlimited.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct QueueStatus {
    /// The queue.
    pub name: String,
    /// The team it serves, if only one.
    pub team: String,
    /// Its cohort.
    pub cohort: Option<String>,
    /// Its fair-share weight.
    pub weight: f64,
    /// What its running trials hold: GPUs, CPUs, memory bytes.
    pub usage: ResourceAmounts,
    /// Its nominal quota.
    pub quota: ResourceAmounts,
    /// How much of its usage is borrowed from its cohort.
    pub borrowed: ResourceAmounts,
    /// How much of its idle quota others use.
    pub lent: ResourceAmounts,
    /// Trials waiting.
    pub pending: u64,
    /// Trials running.
    pub running: u64,
    /// Its weighted dominant-resource share; lower goes first.
    pub fair_share: f64,
    /// Lease units its running trials hold, by lease.
    pub leases: BTreeMap<String, u64>,
    /// Its lease quotas, by lease (a lease not named is unlimited).
    pub lease_quota: BTreeMap<String, u64>,
}

/// GPUs, CPU cores and memory; `None` means unlimited (quotas only).
#[derive(Debug, Clone, Copy, PartialEq, Default, Serialize, Deserialize)]
pub struct ResourceAmounts {
    /// GPUs (fractions allowed).
    pub gpu: Option<f64>,
    /// CPU cores.
    pub cpu: Option<f64>,
    /// Memory bytes.
    pub memory_bytes: Option<u64>,
}

/// One metric report as stored by the head.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct MetricPoint {
    /// The attempt it came from.
    pub attempt: u32,
    /// The worker's rank.
    pub rank: u32,
    /// The step, if the worker gave one.
    pub step: Option<u64>,
    /// Values by name.
    pub values: Vec<(String, f64)>,
    /// When the head received it.
    pub at: UnixMillis,
}

/// One page of a trial's metric history (`Request::Metrics`).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct MetricsPage {
    /// The reports, oldest first.
    pub points: Vec<MetricPoint>,
    /// Where the next page starts (`Request::Metrics::after`); `None`: this
    /// is the last.
    pub next: Option<u64>,
    /// How many reports the trial has in all.
    pub total: u64,
}

/// The lifecycle state of a trial.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum TrialState {
    /// Waiting for the experiment's `parallel` limit.
    Pending,
    /// Eligible for placement.
    Queued,
    /// Slots assigned; launch sent to the nodes.
    Placed,
    /// Some workers have started.
    Starting,
    /// All workers run.
    Running,
    /// All workers exited with status 0.
    Succeeded,
    /// An attempt failed and no retry is left.
    Failed,
    /// Cancelled by a user.
    Cancelled,
    /// Stopped early by a rule.
    Stopped,
    /// Asked to checkpoint and stop, to be requeued.
    Preempting,
}

impl TrialState {
    /// The lowercase name used in JSON and tables.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Pending => "pending",
            Self::Queued => "queued",
            Self::Placed => "placed",
            Self::Starting => "starting",
            Self::Running => "running",
            Self::Succeeded => "succeeded",
            Self::Failed => "failed",
            Self::Cancelled => "cancelled",
            Self::Stopped => "stopped",
            Self::Preempting => "preempting",
        }
    }

    /// Whether the trial will never run again.
    pub fn is_terminal(self) -> bool {
        matches!(
            self,
            Self::Succeeded | Self::Failed | Self::Cancelled | Self::Stopped
        )
    }

    /// Whether the trial ended normally: it succeeded, or a rule (early
    /// stopping, Hyperband, BOHB) stopped it. Its last metrics are a result:
    /// they count for the best, `xp compare` and the Pareto front.
    pub fn ended_normally(self) -> bool {
        matches!(self, Self::Succeeded | Self::Stopped)
    }

    /// Whether the trial holds slots.
    pub fn holds_slots(self) -> bool {
        matches!(
            self,
            Self::Placed | Self::Starting | Self::Running | Self::Preempting
        )
    }
}

impl fmt::Display for TrialState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The state of an experiment, derived from its trials.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum ExperimentState {
    /// Some trial is not finished.
    Running,
    /// Every trial finished and at least one ended normally (succeeded, or
    /// was stopped by an early-stopping rule).
    Succeeded,
    /// Every trial finished and none ended normally.
    Failed,
    /// Cancelled by a user.
    Cancelled,
}

impl ExperimentState {
    /// The state of an experiment: cancelled when a user cancelled it,
    /// running while any trial is unfinished, else succeeded when any trial
    /// ended normally ([`TrialState::ended_normally`]) and failed when none did.
    pub fn of(cancelled: bool, any_unfinished: bool, any_ended_normally: bool) -> Self {
        if cancelled {
            Self::Cancelled
        } else if any_unfinished {
            Self::Running
        } else if any_ended_normally {
            Self::Succeeded
        } else {
            Self::Failed
        }
    }

    /// The lowercase name used in JSON and tables.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Running => "running",
            Self::Succeeded => "succeeded",
            Self::Failed => "failed",
            Self::Cancelled => "cancelled",
        }
    }
}

/// An experiment as `xp status` shows it.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ExperimentStatus {
    /// The id.
    pub id: ExperimentId,
    /// The name from the spec.
    pub name: String,
    /// The owning team.
    pub team: String,
    /// The state.
    pub state: ExperimentState,
    /// The metric that ranks trials, if declared.
    pub metric: Option<String>,
    /// `true` when larger metric values are better.
    pub maximize: bool,
    /// When it was submitted.
    pub submitted_at: UnixMillis,
    /// The code version it was submitted with.
    pub code_version: String,
    /// The data version it was submitted with.
    pub data_version: String,
    /// The trials, by index.
    pub trials: Vec<TrialStatus>,
    /// Every objective of a multi-objective search, in declared order (`metric`
    /// and `maximize` are the first's); empty for one metric or none.
    pub objectives: Vec<ObjectiveStatus>,
    /// The Pareto front of a multi-objective search; `None` otherwise.
    pub front: Option<FrontStatus>,
}

/// What one page of `xp status` asks for ([`super::Request::StatusPage`]).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StatusQuery {
    /// An experiment id or a unique prefix of one; every experiment the asker
    /// sees when absent.
    pub experiment: Option<String>,
    /// Where the page starts: the previous page's `next`; the beginning when
    /// absent.
    pub from: Option<StatusCursor>,
}

/// Where a paged status continues: an experiment, and the index of its first
/// trial not yet sent. Experiments come in id order and trials in index
/// order, so trials or experiments added meanwhile never repeat or shift one.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct StatusCursor {
    /// The experiment the next page starts in.
    pub experiment: ExperimentId,
    /// Its first trial index the next page holds.
    pub trial: u32,
}

/// One page of `xp status` ([`super::Response::StatusPage`]): each page is a
/// bounded answer, and a client follows `next` until it is `None`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct StatusPage {
    /// Experiments in id order. The first continues the previous page's last
    /// one when the cursor fell inside it: it then holds only the trials from
    /// the cursor on, and no front (an experiment's `objectives` and `front`
    /// come with its first trials). Append the trials of an experiment that
    /// continues to what came before.
    pub experiments: Vec<ExperimentStatus>,
    /// Where the next page starts; `None` on the last page.
    pub next: Option<StatusCursor>,
}

impl StatusPage {
    /// Adds this page to `whole` (the experiments of the pages before, in
    /// order): an experiment that continues gets the page's trials appended.
    pub fn merge_into(self, whole: &mut Vec<ExperimentStatus>) {
        for experiment in self.experiments {
            match whole.last_mut() {
                Some(last) if last.id == experiment.id => {
                    last.trials.extend(experiment.trials);
                    last.state = experiment.state;
                }
                _ => whole.push(experiment),
            }
        }
    }
}

/// One objective of a multi-objective search.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ObjectiveStatus {
    /// The metric.
    pub metric: String,
    /// `true` when larger values are better.
    pub maximize: bool,
}

/// The Pareto front of a multi-objective experiment's succeeded trials: those no
/// other beats in every objective, over trials that reported every objective as
/// a finite number (their last reported values).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FrontStatus {
    /// The hypervolume's reference point, one value per objective in the metric's
    /// own units; empty when none was declared and no trial has every objective.
    pub reference: Vec<f64>,
    /// Whether the spec declared it; else it is each objective's worst value over
    /// the evaluated trials, 10% of its range further (so it moves as trials finish).
    pub reference_declared: bool,
    /// The volume the front dominates up to the reference; NaN when a front of
    /// 3 or 4 objectives is too large to slice exactly (`xp_tune`'s
    /// `MAX_SLICING_WORK`), as is then each member's contribution.
    pub hypervolume: f64,
    /// How many succeeded trials reported every objective.
    pub evaluated: u32,
    /// The front, largest hypervolume contribution first.
    pub trials: Vec<FrontTrial>,
}

/// A trial on the Pareto front.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FrontTrial {
    /// The trial.
    pub trial: TrialId,
    /// Its objective values, in declared order.
    pub values: Vec<f64>,
    /// The hypervolume the front loses without it.
    pub contribution: f64,
}

/// A trial as `xp status` shows it.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct TrialStatus {
    /// The id.
    pub id: TrialId,
    /// The state.
    pub state: TrialState,
    /// The configuration as JSON.
    pub config_json: String,
    /// Every attempt so far, oldest first.
    pub attempts: Vec<AttemptStatus>,
    /// The last value reported under each metric name (by rank 0).
    pub metrics: BTreeMap<String, f64>,
    /// The last step reported.
    pub last_step: Option<u64>,
    /// Why the trial is in its state, when there is something to say.
    pub reason: Option<String>,
    /// The finished trial whose result this one reuses instead of running.
    pub reused_from: Option<TrialId>,
    /// For a queued trial, why the scheduler has not placed it yet.
    pub waiting: Option<String>,
    /// GPU-hours its attempts were allocated, up to now for a running one.
    pub gpu_hours: f64,
    /// What they cost at the policy's prices; `None` when it names none.
    pub cost: Option<f64>,
    /// Metric lines it printed that could not be read, if any.
    pub malformed_metrics: Option<MalformedMetrics>,
}

/// Metric lines of a trial that could not be read: how many, and the first
/// with why (at most [`super::MAX_MALFORMED_LINE_SHOWN`] bytes of the line).
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct MalformedMetrics {
    /// How many lines.
    pub count: u64,
    /// The first, and why it was refused.
    pub first: String,
}

/// One attempt of a trial.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct AttemptStatus {
    /// The attempt number, from 1.
    pub number: u32,
    /// The node of each rank.
    pub nodes: Vec<NodeId>,
    /// When it was placed.
    pub placed_at: UnixMillis,
    /// When all its workers were running.
    pub running_at: Option<UnixMillis>,
    /// When it ended.
    pub ended_at: Option<UnixMillis>,
    /// How it ended, in words.
    pub outcome: Option<String>,
    /// The checkpoint it resumed from: (step, attempt that wrote it).
    pub resumed_from: Option<(u64, u32)>,
}

/// A trial state change.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct TrialEvent {
    /// Position in the head's event log; strictly increasing.
    pub seq: u64,
    /// When it happened.
    pub at: UnixMillis,
    /// The trial.
    pub trial: TrialId,
    /// The new state.
    pub state: TrialState,
    /// The attempt concerned (0 before the first).
    pub attempt: u32,
    /// Why.
    pub reason: String,
}

/// Whether the head hears from a node.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum NodeState {
    /// Heartbeats arrive.
    Ready,
    /// No heartbeat within the timeout; its work was rescheduled.
    Lost,
    /// Shutting down: its work is moving elsewhere.
    Draining,
}

impl NodeState {
    /// The lowercase name used in JSON and tables.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Ready => "ready",
            Self::Lost => "lost",
            Self::Draining => "draining",
        }
    }
}

/// A node as `xp nodes` shows it.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct NodeStatus {
    /// The id.
    pub id: NodeId,
    /// Its host name.
    pub name: String,
    /// The address workers on other nodes use to reach it.
    pub address: String,
    /// Whether it is alive.
    pub state: NodeState,
    /// Its capacity.
    pub capacity: NodeResources,
    /// GPUs not assigned to a worker.
    pub free_gpus: u32,
    /// CPU thousandths not assigned.
    pub free_cpu_milli: u32,
    /// Memory bytes not assigned.
    pub free_memory_bytes: u64,
    /// Its labels.
    pub labels: BTreeMap<String, String>,
    /// Workers it runs now.
    pub running_workers: u32,
    /// When the head last heard from it.
    pub last_seen: UnixMillis,
    /// What it enforces on its workers (user ids of their own, limits).
    pub isolation: NodeIsolation,
    /// Its GPUs as its latest telemetry saw them (empty without NVML or telemetry).
    #[serde(default)]
    pub gpu_telemetry: Vec<super::GpuSample>,
}

/// A checkpoint as `xp checkpoints` shows it.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct CheckpointStatus {
    /// The trial.
    pub trial: TrialId,
    /// The attempt that wrote it.
    pub attempt: u32,
    /// The step.
    pub step: u64,
    /// When the head recorded it.
    pub at: UnixMillis,
    /// Total bytes of its files.
    pub bytes: u64,
    /// Its files.
    pub files: Vec<CheckpointFile>,
    /// The experiment's metric when it was taken, if reported.
    pub metric: Option<f64>,
    /// Live nodes that hold every one of its objects.
    pub replicas: Vec<NodeId>,
    /// The durable backup directory that also holds them, if any.
    pub backup: Option<String>,
    /// Why it has a single copy, when it has: neither two live nodes nor a backup
    /// hold it (being copied, a copy that failed and is tried again, one given up
    /// on, or no other node to copy it to). `None` once it is held twice.
    pub unreplicated: Option<String>,
}

/// One page of an experiment's checkpoints (`Request::Checkpoints`).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct CheckpointsPage {
    /// The checkpoints in the order of trial, attempt and step.
    pub checkpoints: Vec<CheckpointStatus>,
    /// The last checkpoint of this page, where the next starts
    /// (`Request::Checkpoints::after`); `None`: this is the last page.
    pub next: Option<CheckpointCursor>,
}

/// Where a page of checkpoints ends: a checkpoint's key, which later pages
/// start strictly after, so a checkpoint kept or dropped meanwhile shifts
/// nothing.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub struct CheckpointCursor {
    /// Its trial.
    pub trial: TrialId,
    /// The attempt that wrote it.
    pub attempt: u32,
    /// Its step.
    pub step: u64,
}

/// The answer to `Request::Leases`: each lease, the preemptions waiting for an
/// admin, and how likely requests are to wait.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LeaseReport {
    /// Every lease the policy declares, by name.
    pub leases: Vec<LeaseStatus>,
    /// Preemptions waiting for an admin's approval, oldest first: those
    /// involving a trial of a team the caller sees.
    pub approvals: Vec<ApprovalStatus>,
    /// Per lease and per GPU model: the observed chance that a request waited.
    pub odds: Vec<ConflictOdds>,
    /// The chance that at least one of the requests waiting now conflicts,
    /// `1 − Π(1 − p_i)` over them, each with its resources' observed `p`.
    pub any_conflict: f64,
}

/// One lease's standing.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LeaseStatus {
    /// The lease.
    pub name: String,
    /// Its capacity in units.
    pub capacity: u64,
    /// Units held now.
    pub held: u64,
    /// Placed trials holding units.
    pub holders: Vec<LeaseClaim>,
    /// Waiting (or held) trials asking for units.
    pub waiters: Vec<LeaseClaim>,
    /// How many trials hold units, of every team (`holders` lists only
    /// those of teams the caller sees).
    pub holding: u64,
    /// How many trials wait for units, of every team (`waiters` lists only
    /// those of teams the caller sees).
    pub waiting: u64,
}

/// A trial holding or wanting lease units.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LeaseClaim {
    /// The trial.
    pub trial: TrialId,
    /// Its team.
    pub team: String,
    /// The units.
    pub units: u64,
}

/// A preemption waiting for an admin.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ApprovalStatus {
    /// The request's id (`xp admin approve ID`).
    pub id: u64,
    /// The running trial that would be stopped.
    pub victim: TrialId,
    /// The waiting trial that wants its room.
    pub claimant: TrialId,
    /// Why the policy wants it, in words.
    pub why: String,
    /// When it was asked, in milliseconds since the Unix epoch.
    pub at: u64,
}

/// How often requests for one lease or GPU model had to wait.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ConflictOdds {
    /// `lease NAME` or `gpu MODEL` (`gpu any` for GPU trials naming no model).
    pub resource: String,
    /// Trials that asked for it and were placed or still wait (from records).
    pub requests: u64,
    /// Of those, the ones that waited at least one scheduling pass.
    pub waited: u64,
    /// `waited / requests`; absent with no request yet.
    pub p: Option<f64>,
    /// Trials asking for it that wait now.
    pub waiting_now: u64,
    /// The chance that at least one of those conflicts: `1 − (1 − p)^n`.
    pub any_conflict: f64,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn experiment(id: u8, trials: std::ops::Range<u32>) -> ExperimentStatus {
        let id = ExperimentId::from_content_hash(&[id; 32], 1);
        ExperimentStatus {
            id,
            name: "e".to_owned(),
            team: "t".to_owned(),
            state: ExperimentState::Running,
            metric: None,
            maximize: false,
            submitted_at: 0,
            code_version: String::new(),
            data_version: String::new(),
            trials: trials
                .map(|index| TrialStatus {
                    id: TrialId {
                        experiment: id,
                        index,
                    },
                    state: TrialState::Pending,
                    config_json: "{}".to_owned(),
                    attempts: Vec::new(),
                    metrics: BTreeMap::new(),
                    last_step: None,
                    reason: None,
                    reused_from: None,
                    waiting: None,
                    gpu_hours: 0.0,
                    cost: None,
                    malformed_metrics: None,
                })
                .collect(),
            objectives: Vec::new(),
            front: None,
        }
    }

    #[test]
    fn pages_merge_an_experiment_that_continues_into_one() {
        let mut whole = Vec::new();
        let page = |experiments| StatusPage {
            experiments,
            next: None,
        };
        page(vec![experiment(1, 0..3), experiment(2, 0..2)]).merge_into(&mut whole);
        page(vec![experiment(2, 2..5)]).merge_into(&mut whole);
        page(vec![experiment(2, 5..6), experiment(3, 0..1)]).merge_into(&mut whole);
        let shown: Vec<Vec<u32>> = whole
            .iter()
            .map(|experiment| {
                experiment
                    .trials
                    .iter()
                    .map(|trial| trial.id.index)
                    .collect()
            })
            .collect();
        assert_eq!(shown, vec![vec![0, 1, 2], vec![0, 1, 2, 3, 4, 5], vec![0]]);
    }
}
