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
use std::sync::Arc;

use litemap::LiteMap;
use smallvec::SmallVec;

use serde::{Deserialize, Serialize};
use xp_runtime::clock::UnixMillis;
use xp_runtime::ids::{BlobHash, ExperimentId, NodeId, TrialId, WorkerKey};
use xp_runtime::protocol::{
    CheckpointFile, MalformedMetrics, NodeIsolation, NodeResources, NodeState, ReusedFrom,
    StageInput, StageState, TrialEvent, TrialState,
};
use xp_sched::GPU_MILLI;

use crate::checkpoints::retention::CheckpointRecord;
use crate::shared_text;
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

/// A list cut to its length once read: serde grows a list of unknown length
/// to four entries or more (an attempt, a worker), which a head holding a
/// million finished trials would keep for good.
pub(crate) fn exact_list<'de, D, T>(deserializer: D) -> Result<Vec<T>, D::Error>
where
    D: serde::Deserializer<'de>,
    T: Deserialize<'de>,
{
    let mut list = Vec::<T>::deserialize(deserializer)?;
    list.shrink_to_fit();
    Ok(list)
}

/// A trial's attempts: most trials have one, held in the record itself.
pub type Attempts = SmallVec<[AttemptRecord; 1]>;

/// An attempt's workers: most attempts have one, held in the attempt itself.
pub type Workers = SmallVec<[WorkerRecord; 1]>;

/// A list held in its owner while it has one entry, cut to its length once
/// read as [`exact_list`] cuts lists: a million finished trials each kept an
/// allocation for one attempt and one for its worker.
fn exact_small<'de, D, T>(deserializer: D) -> Result<SmallVec<[T; 1]>, D::Error>
where
    D: serde::Deserializer<'de>,
    T: Deserialize<'de>,
{
    let mut list = SmallVec::<[T; 1]>::deserialize(deserializer)?;
    list.shrink_to_fit();
    Ok(list)
}

/// Metric values cut to their number once read, as [`exact_list`] cuts
/// lists (the map's vector grows to four entries or more as it is read), their
/// names shared.
fn exact_values<'de, D>(deserializer: D) -> Result<LiteMap<Arc<str>, f64>, D::Error>
where
    D: serde::Deserializer<'de>,
{
    let values: LiteMap<String, f64> =
        xp_runtime::metric_value::serde_map::deserialize(deserializer)?;
    let mut entries: Vec<(Arc<str>, f64)> = values
        .into_tuple_vec()
        .into_iter()
        .map(|(name, value)| (shared_text::shared(&name), value))
        .collect();
    // Collected in place, into the grown vector's room: cut that too.
    entries.shrink_to_fit();
    // Still in the map's order.
    Ok(LiteMap::from_sorted_store_unchecked(entries))
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
    #[serde(deserialize_with = "exact_small")]
    pub attempts: Attempts,
    /// Attempts that failed through the trial's own fault (not lost nodes).
    pub failures: u32,
    /// The last value of each metric reported by rank 0 (non-finite ones
    /// stored as their names, `crate::metric_value`).
    #[serde(
        serialize_with = "xp_runtime::metric_value::serde_map::serialize",
        deserialize_with = "exact_values"
    )]
    pub metrics: LiteMap<Arc<str>, f64>,
    /// The last step reported by rank 0.
    pub last_step: Option<u64>,
    /// Why it is in its state.
    #[serde(default, deserialize_with = "shared_text::deserialize_option")]
    pub reason: Option<Arc<str>>,
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
    #[serde(default, deserialize_with = "exact_list")]
    pub checkpoints: Vec<CheckpointRecord>,
    /// When it was created (records from before say none: the experiment's
    /// submission is used).
    #[serde(default)]
    pub created_at: Option<UnixMillis>,
    /// When it reached a final state (records from before say none: its last
    /// attempt's end is used).
    #[serde(default)]
    pub finished_at: Option<UnixMillis>,
    /// The files rank 0 of its successful attempt wrote under `XP_OUTPUT_DIR`,
    /// each an object pinned for the trial on the node that reported it.
    #[serde(default, deserialize_with = "exact_list")]
    pub outputs: Vec<CheckpointFile>,
    /// It waited through at least one scheduling pass before it was placed
    /// (counted for the conflict odds of what it asked for).
    #[serde(default)]
    pub waited: bool,
    /// Metric lines the node could not read, if any (boxed: most trials have
    /// none, and a million finished ones each kept the room).
    #[serde(default)]
    pub malformed_metrics: Option<Box<MalformedMetrics>>,
}

/// A submitted pipeline, as persisted.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct PipelineRecord {
    /// The id (from 1, in submission order).
    pub id: u64,
    /// The spec in canonical JSON.
    pub spec_json: String,
    /// The code version of every stage.
    pub code_version: String,
    /// The data version of every stage.
    pub data_version: String,
    /// When it was submitted.
    pub submitted_at: UnixMillis,
    /// Whether a user cancelled it (until a retry).
    #[serde(default)]
    pub cancelled: bool,
    /// Its stages by name.
    pub stages: BTreeMap<String, StageRecord>,
}

/// One stage of a pipeline, as persisted.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct StageRecord {
    /// Where it is.
    pub state: StageState,
    /// Why, in words.
    pub reason: String,
    /// Its experiment, once submitted (the latest, after a retry).
    #[serde(default)]
    pub experiment: Option<ExperimentId>,
    /// Its cache identity, once everything it needs has a result.
    #[serde(default)]
    pub identity: Option<[u8; 32]>,
    /// The stage whose result it reuses.
    #[serde(default)]
    pub reused_from: Option<ReusedFrom>,
    /// Its resolved references.
    #[serde(default)]
    pub inputs: Vec<StageInput>,
    /// The upstream files its trials get, one directory per reference.
    #[serde(default)]
    pub input_dirs: Vec<InputDir>,
    /// What it produced, once it succeeded (or what it reuses).
    #[serde(default)]
    pub result: Option<StageResult>,
    /// When its experiment was submitted.
    #[serde(default)]
    pub started_at: Option<UnixMillis>,
    /// When it reached its final state.
    #[serde(default)]
    pub finished_at: Option<UnixMillis>,
}

/// The distinct objects of a trial's output files: each holds one reference
/// in `object_refs`, like a kept checkpoint's objects.
pub(super) fn output_objects(
    files: &[CheckpointFile],
) -> std::collections::BTreeSet<xp_runtime::ids::ObjectId> {
    files.iter().map(|file| file.object).collect()
}

/// A directory of upstream files a stage's trials get.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct InputDir {
    /// Its name under `XP_INPUT_DIR` (`STAGE.outputs`).
    pub name: String,
    /// The argv text the node replaces with the directory.
    pub marker: String,
    /// Its files.
    pub files: Vec<CheckpointFile>,
}

/// What a finished stage produced: its best (or only) trial's parameters,
/// metrics, output files and last checkpoint.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StageResult {
    /// The trial.
    pub best_trial: Option<TrialId>,
    /// Its configuration as JSON.
    pub params_json: String,
    /// Its last metric values (NaN and infinities stored as their names,
    /// `xp_runtime::metric_value`, so a NaN never makes the record unreadable).
    #[serde(with = "xp_runtime::metric_value::serde_map")]
    pub metrics: BTreeMap<String, f64>,
    /// The files it wrote under `XP_OUTPUT_DIR`.
    pub outputs: Vec<CheckpointFile>,
    /// The files of its last kept checkpoint.
    pub checkpoint: Vec<CheckpointFile>,
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
    /// Preemptions that waited for an admin's approval: pending ones and the
    /// newest decided, kept with the policy that asked for them.
    #[serde(default)]
    pub approvals: Vec<ApprovalRecord>,
}

/// A preemption that needed a person's approval, and what became of it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ApprovalRecord {
    /// The request's id.
    pub id: u64,
    /// The running trial that would be stopped.
    pub victim: TrialId,
    /// The waiting trial that wanted its room.
    pub claimant: TrialId,
    /// Why the policy wanted it, in words.
    pub why: String,
    /// When it was asked.
    pub at: UnixMillis,
    /// Where it stands.
    pub state: ApprovalState,
    /// The admin who decided it.
    pub decided_by: Option<String>,
    /// Their reason.
    pub decided_why: Option<String>,
    /// When it was decided or withdrawn.
    pub decided_at: Option<UnixMillis>,
}

/// Where an approval request stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ApprovalState {
    /// Waiting for an admin.
    Pending,
    /// An admin let it go ahead.
    Approved,
    /// An admin refused it.
    Denied,
    /// The situation that led to it is gone (or the head restarted).
    Withdrawn,
}

/// One attempt of a trial.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct AttemptRecord {
    /// From 1.
    pub number: u32,
    /// One per rank, in rank order.
    #[serde(deserialize_with = "exact_small")]
    pub workers: Workers,
    /// `MASTER_ADDR`.
    #[serde(deserialize_with = "shared_text::deserialize")]
    pub master_host: Arc<str>,
    /// `MASTER_PORT`.
    pub master_port: u16,
    /// When it was placed.
    pub placed_at: UnixMillis,
    /// When all workers were running.
    pub running_at: Option<UnixMillis>,
    /// When its outcome was decided.
    pub ended_at: Option<UnixMillis>,
    /// Its outcome in words.
    #[serde(default, deserialize_with = "shared_text::deserialize_option")]
    pub outcome: Option<Arc<str>>,
    /// The checkpoint it resumed from: (step, attempt that wrote it).
    #[serde(default)]
    pub resumed_from: Option<(u64, u32)>,
    /// When the head recorded that checkpoint: the work of the attempt that
    /// wrote it after this time was lost.
    #[serde(default)]
    pub resumed_checkpoint_at: Option<UnixMillis>,
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
    #[serde(deserialize_with = "exact_list")]
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
    /// The intervals it was up, oldest first (at most
    /// `state::membership::MAX_UP_INTERVALS`): from a registration to the last sign of
    /// life before it was judged lost, the last one open while it is up.
    #[serde(default)]
    pub up: Vec<UpInterval>,
}

/// One interval a node was up.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct UpInterval {
    /// From its registration.
    pub from: UnixMillis,
    /// To its last sign of life before it was lost; `None` while up.
    pub to: Option<UnixMillis>,
}

/// One metric report, appended to the registry's history.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct MetricRecord {
    /// The worker.
    pub key: WorkerKey,
    /// The step.
    pub step: Option<u64>,
    /// The values (non-finite ones stored as their names).
    #[serde(with = "xp_runtime::metric_value::serde_map")]
    pub values: BTreeMap<String, f64>,
    /// When the head received it.
    pub at: UnixMillis,
}

impl From<MetricRecord> for xp_runtime::protocol::MetricPoint {
    fn from(record: MetricRecord) -> Self {
        Self {
            attempt: record.key.attempt,
            rank: record.key.rank,
            step: record.step,
            values: record.values.into_iter().collect(),
            at: record.at,
        }
    }
}

/// Something the registry must store before the change is acknowledged.
#[derive(Debug, Clone)]
pub enum Record {
    /// Insert or replace an experiment.
    Experiment(ExperimentRecord),
    /// Insert or replace a trial: shared with the book and the registry's
    /// committed copy, which hold one allocation per unchanged trial.
    Trial(Arc<TrialRecord>),
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
    /// Store (or, with no window, remove) one window of a worker's telemetry series.
    Telemetry(TelemetryRecord),
    /// Insert or replace a pipeline.
    Pipeline(PipelineRecord),
    /// Insert or replace an alert.
    Alert(AlertRecord),
}

/// One window of a worker's telemetry series, at its position (`slot`) in the
/// series: stored under (trial, rank, slot), so that a new sample rewrites one
/// window, not the series.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TelemetryRecord {
    /// The trial.
    pub trial: TrialId,
    /// The worker's rank.
    pub rank: u32,
    /// The window's position, oldest first.
    pub slot: u32,
    /// The window; `None` removes the slot (the series merged to fewer windows).
    pub window: Option<xp_runtime::protocol::TelemetryWindow>,
}

/// Everything the registry loaded at start.
#[derive(Debug, Default)]
pub struct LoadedState {
    /// Experiments.
    pub experiments: Vec<ExperimentRecord>,
    /// Trials.
    pub trials: Vec<Arc<TrialRecord>>,
    /// Nodes.
    pub nodes: Vec<NodeRecord>,
    /// The number of the newest event stored (0: none). The events stay in
    /// the store, read on demand.
    pub last_event_seq: u64,
    /// The policy last applied, if any.
    pub policy: Option<PolicyRecord>,
    /// Pipelines.
    pub pipelines: Vec<PipelineRecord>,
    /// The next pipeline id: past the largest key in the table, also when that
    /// record could not be decoded, so an id is never given out twice.
    pub next_pipeline_id: u64,
    /// Alerts, by id.
    pub alerts: Vec<AlertRecord>,
}

/// An alert raised on a trial, as persisted (see `core::alerts`).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct AlertRecord {
    /// Its number on this head, increasing.
    pub id: u64,
    /// The trial.
    pub trial: TrialId,
    /// The rule's name.
    pub rule: String,
    /// The rule's kind.
    pub kind: xp_runtime::spec::AlertKind,
    /// The metric concerned.
    #[serde(default)]
    pub metric: Option<String>,
    /// The value that fired it (a non-finite one stored as its name).
    #[serde(default, with = "xp_runtime::metric_value::serde_option")]
    pub value: Option<f64>,
    /// The step of the report that fired it.
    #[serde(default)]
    pub step: Option<u64>,
    /// When it was raised.
    pub at: UnixMillis,
    /// What happened.
    pub message: String,
    /// The rule's actions when it fired.
    pub actions: Vec<xp_runtime::spec::AlertAction>,
    /// Where its webhook deliveries stand.
    pub delivery: xp_runtime::protocol::DeliveryState,
    /// When its condition cleared.
    #[serde(default)]
    pub cleared_at: Option<UnixMillis>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_decoded_trial_keeps_no_spare_room_in_its_lists_and_values() {
        let stored = r#"{"id":{"experiment":{"digest":7,"run":1},"index":0},"config_json":"{}","seed":0,"state":"Succeeded","attempts":[{"number":1,"workers":[{"rank":0,"node":"00000000-0000-0000-0000-000000000001","gpu_indices":[],"gpu_milli":0,"cpu_milli":1000,"memory_bytes":0,"state":{"Exited":{"code":0,"signal":null}},"last_metric_index":null}],"master_host":"h","master_port":1,"placed_at":1,"running_at":2,"ended_at":3,"outcome":null,"resumed_from":null}],"failures":0,"metrics":{"accuracy":0.9,"loss":0.1},"last_step":10,"reason":null,"queued_at":0}"#;
        let trial: TrialRecord = serde_json::from_str(stored).unwrap();
        assert!(!trial.attempts.spilled(), "held in the record");
        assert!(!trial.attempts[0].workers.spilled(), "held in the attempt");
        assert_eq!(trial.metrics.get("loss"), Some(&0.1));
        assert_eq!(trial.metrics.into_tuple_vec().capacity(), 2);
    }

    #[test]
    fn decoded_trials_share_their_repeated_texts_and_encode_as_before() {
        let stored = r#"{"id":{"experiment":{"digest":7,"run":1},"index":0},"config_json":"{}","seed":0,"state":"Succeeded","attempts":[{"number":1,"workers":[],"master_host":"10.0.0.7","master_port":1,"placed_at":1,"running_at":2,"ended_at":3,"outcome":"succeeded","resumed_from":null}],"failures":0,"metrics":{"loss":"NaN"},"last_step":10,"reason":"all workers exited with status 0","queued_at":0}"#;
        let one: TrialRecord = serde_json::from_str(stored).unwrap();
        let two: TrialRecord = serde_json::from_str(stored).unwrap();
        let (first, second) = (&one.attempts[0], &two.attempts[0]);
        assert!(Arc::ptr_eq(&first.master_host, &second.master_host));
        let outcomes = (first.outcome.as_ref(), second.outcome.as_ref());
        assert!(Arc::ptr_eq(outcomes.0.unwrap(), outcomes.1.unwrap()));
        assert!(Arc::ptr_eq(
            one.reason.as_ref().unwrap(),
            two.reason.as_ref().unwrap()
        ));
        let names = (one.metrics.iter().next(), two.metrics.iter().next());
        assert!(Arc::ptr_eq(names.0.unwrap().0, names.1.unwrap().0));
        let encoded = serde_json::to_value(&one).unwrap();
        assert_eq!(encoded["reason"], "all workers exited with status 0");
        assert_eq!(encoded["metrics"], serde_json::json!({"loss": "NaN"}));
        assert_eq!(encoded["attempts"][0]["master_host"], "10.0.0.7");
        assert_eq!(encoded["attempts"][0]["outcome"], "succeeded");
    }
}
