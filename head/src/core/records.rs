//! The head's persisted record types: experiments, trials, attempts, workers,
//! nodes, metric reports and the scheduling policy, and the [`Record`] the core
//! hands to the registry.
//!
//! These are plain data with serde derives, stored as JSON so the database stays
//! readable across versions (a deliberate deviation from the rule that only wire
//! types derive serde). They hold no logic beyond tiny predicates; the core decides
//! what goes into them.
//!
//! Invariant: fields are only ever added, with `#[serde(default)]` (or an alias for
//! a renamed field), so records written by an older head still load.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use xp_runtime::clock::UnixMillis;
use xp_runtime::ids::{BlobHash, ExperimentId, NodeId, TrialId, WorkerKey};
use xp_runtime::protocol::{NodeIsolation, NodeResources, NodeState, TrialEvent, TrialState};
use xp_sched::GPU_MILLI;

use crate::core::checkpoints::retention::CheckpointRecord;
use crate::sweep::SweepOp;

/// A submitted experiment, as persisted.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ExperimentRecord {
    /// The id.
    pub id: ExperimentId,
    /// The full content hash.
    pub content_hash: [u8; 32],
    /// The spec in canonical JSON.
    pub spec_json: String,
    /// The driver binary for `entry` trials.
    pub program: Option<BlobHash>,
    /// The code version.
    pub code_version: String,
    /// The data version.
    pub data_version: String,
    /// When it was submitted.
    pub submitted_at: UnixMillis,
    /// Whether a user cancelled it.
    pub cancelled: bool,
    /// Whether the submission asked to rerun rather than reuse finished results.
    #[serde(default)]
    pub rerun: bool,
    /// What the head did to the experiment's adaptive searcher, in order.
    #[serde(default)]
    pub sweep_log: Vec<SweepOp>,
}

/// A trial, as persisted.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct TrialRecord {
    /// The id.
    pub id: TrialId,
    /// Its configuration as JSON.
    pub config_json: String,
    /// Its replicate seed.
    pub seed: u64,
    /// Its state.
    pub state: TrialState,
    /// Every attempt, oldest first.
    pub attempts: Vec<AttemptRecord>,
    /// Attempts that failed through the trial's own fault (not lost nodes).
    pub failures: u32,
    /// The last value of each metric reported by rank 0.
    pub metrics: BTreeMap<String, f64>,
    /// The last step reported by rank 0.
    pub last_step: Option<u64>,
    /// Why it is in its state.
    pub reason: Option<String>,
    /// When it last entered the queue.
    pub queued_at: UnixMillis,
    /// The finished trial whose result this one reuses instead of running.
    #[serde(default)]
    pub reused_from: Option<TrialId>,
    /// Times the trial was requeued through no fault of its own.
    #[serde(default)]
    pub requeues: u32,
    /// Times the scheduler preempted it.
    #[serde(default)]
    pub preemptions: u32,
    /// An admin holds it out of the queue.
    #[serde(default)]
    pub held: bool,
    /// A base priority set by an admin, replacing the experiment's.
    #[serde(default)]
    pub priority_override: Option<i64>,
    /// A queue set by an admin, replacing the experiment's.
    #[serde(default)]
    pub queue_override: Option<String>,
    /// The checkpoints kept, oldest first.
    #[serde(default)]
    pub checkpoints: Vec<CheckpointRecord>,
}

/// The scheduling policy in force, as persisted: the text and who applied it.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct PolicyRecord {
    /// The policy file's text.
    pub yaml: String,
    /// Who applied it.
    pub applied_by: String,
    /// Why.
    pub why: String,
    /// When.
    pub at: UnixMillis,
}

/// One attempt of a trial.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct AttemptRecord {
    /// From 1.
    pub number: u32,
    /// One per rank, in rank order.
    pub workers: Vec<WorkerRecord>,
    /// `MASTER_ADDR`.
    pub master_host: String,
    /// `MASTER_PORT`.
    pub master_port: u16,
    /// When it was placed.
    pub placed_at: UnixMillis,
    /// When all workers were running.
    pub running_at: Option<UnixMillis>,
    /// When its outcome was decided.
    pub ended_at: Option<UnixMillis>,
    /// Its outcome in words.
    pub outcome: Option<String>,
    /// The checkpoint it resumed from: (step, attempt that wrote it).
    #[serde(default)]
    pub resumed_from: Option<(u64, u32)>,
}

impl AttemptRecord {
    /// Whether its outcome is still undecided (its workers may still run).
    pub(super) fn is_live(&self) -> bool {
        self.ended_at.is_none()
    }
}

/// One worker of an attempt.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct WorkerRecord {
    /// Its rank.
    pub rank: u32,
    /// Its node.
    pub node: NodeId,
    /// Its GPUs.
    pub gpu_indices: Vec<u32>,
    /// The thousandths of each of those GPUs it holds (1000: whole GPUs).
    #[serde(default = "whole_gpu")]
    pub gpu_milli: u32,
    /// Its CPU thousandths.
    // Records written before the rename say `milli_cpus`.
    #[serde(alias = "milli_cpus")]
    pub cpu_milli: u32,
    /// Its memory bytes.
    pub memory_bytes: u64,
    /// What the head knows of its process.
    pub state: WorkerState,
    /// The index of the last metric report taken from it.
    pub last_metric_index: Option<u64>,
}

fn whole_gpu() -> u32 {
    GPU_MILLI as u32
}

/// What the head knows of a worker process.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum WorkerState {
    /// Launch sent.
    Assigned,
    /// The process runs.
    Started,
    /// The process exited.
    Exited {
        /// Exit code.
        code: Option<i32>,
        /// Terminating signal.
        signal: Option<i32>,
    },
    /// Its node was lost or forgot it.
    Lost,
}

impl WorkerState {
    /// Whether the worker still holds its slot.
    pub fn holds_resources(self) -> bool {
        matches!(self, Self::Assigned | Self::Started)
    }
}

/// A node, as persisted.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct NodeRecord {
    /// The id.
    pub id: NodeId,
    /// Host name.
    pub name: String,
    /// Address for `MASTER_ADDR`.
    pub address: String,
    /// Capacity.
    pub resources: NodeResources,
    /// Labels.
    pub labels: BTreeMap<String, String>,
    /// Alive or lost.
    pub state: NodeState,
    /// Last heard from.
    pub last_seen: UnixMillis,
    /// What it enforces on its workers, as it registered (records from before
    /// nodes said read as none).
    #[serde(default)]
    pub isolation: NodeIsolation,
}

/// One metric report, appended to the registry's history.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct MetricRecord {
    /// The worker.
    pub key: WorkerKey,
    /// The step.
    pub step: Option<u64>,
    /// The values.
    pub values: BTreeMap<String, f64>,
    /// When the head received it.
    pub at: UnixMillis,
}

/// Something the registry must store before the change is acknowledged.
#[derive(Debug, Clone)]
pub enum Record {
    /// Insert or replace an experiment.
    Experiment(ExperimentRecord),
    /// Insert or replace a trial.
    Trial(TrialRecord),
    /// Insert or replace a node.
    Node(NodeRecord),
    /// Append an event.
    Event(TrialEvent),
    /// Append a metric report.
    Metric(MetricRecord),
    /// Replace the scheduling policy.
    Policy(PolicyRecord),
    /// Insert or replace a user (the actor's user table, not the core, makes these).
    User(crate::auth::users::UserRecord),
    /// Append an audit entry; the registry numbers it (its `seq` is ignored).
    Audit(xp_runtime::protocol::AuditEntry),
}

/// Everything the registry loaded at start.
#[derive(Debug, Default)]
pub struct LoadedState {
    /// Experiments.
    pub experiments: Vec<ExperimentRecord>,
    /// Trials.
    pub trials: Vec<TrialRecord>,
    /// Nodes.
    pub nodes: Vec<NodeRecord>,
    /// Events in sequence order.
    pub events: Vec<TrialEvent>,
    /// The policy last applied, if any.
    pub policy: Option<PolicyRecord>,
}
