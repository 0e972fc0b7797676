//! The wire protocol between drivers, the CLI, nodes and the head. **API boundary.**
//!
//! Roles and order: a peer opens a QUIC connection to the head, opens one
//! bidirectional stream and sends [`Message::Hello`]; the head answers
//! [`Message::Welcome`] or [`Message::Error`]. For a node that first stream then
//! stays open as the node's session: the node sends [`NodeMessage`]s, the head
//! sends [`HeadCommand`]s. Every other request is one [`Request`] on a fresh
//! stream, answered by one [`Response`] (or an error); blob transfers follow their
//! request or response frame with exactly the announced number of raw bytes.
//!
//! Compatibility: bincode is not self-describing, so enum variants are
//! append-only and a removed variant keeps its slot; every frame carries
//! [`PROTOCOL_VERSION`] (see [`crate::frame`]). Both sides tolerate duplicated
//! reports (nodes resend unacknowledged ones after a reconnect) and cancels that
//! race completion.

use std::collections::BTreeMap;
use std::fmt;

use serde::{Deserialize, Serialize};

use crate::clock::UnixMillis;
use crate::ids::{BlobHash, ExperimentId, NodeId, ObjectId, TrialId, WorkerKey};

/// The protocol version every frame carries.
pub const PROTOCOL_VERSION: u16 = 1;

/// Everything that crosses a connection.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub enum Message {
    /// The first frame of every connection.
    Hello(Hello),
    /// The head accepted a [`Hello`].
    Welcome(Welcome),
    /// A request from a client or node.
    Request(Request),
    /// The answer to a [`Request`].
    Response(Response),
    /// A node's report on its session stream.
    FromNode(NodeMessage),
    /// The head's command on a node's session stream.
    ToNode(HeadCommand),
    /// A refusal: of a hello, a request or a frame.
    Error(RemoteError),
}

/// Who is connecting, and their credential.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Hello {
    /// The cluster secret from the join string.
    pub token: String,
    /// Whether this is a node or a client (CLI, driver).
    pub role: PeerRole,
    /// Software name and version, for logs.
    pub agent: String,
}

/// The kind of peer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum PeerRole {
    /// A driver, the CLI or a tool.
    Client,
    /// A machine offering slots.
    Node,
}

/// The head's acceptance.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Welcome {
    /// The head's software name and version.
    pub agent: String,
}

/// A stable error code: clients may match on it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum ErrorCode {
    /// The token is not this cluster's.
    BadToken,
    /// The frame could not be decoded.
    MalformedFrame,
    /// The frame is larger than the limit.
    FrameTooLarge,
    /// The frame's protocol version is not spoken here.
    UnsupportedVersion,
    /// A well-formed message that is not valid here (wrong order, bad value).
    BadRequest,
    /// The named experiment, trial, node or blob does not exist.
    NotFound,
    /// The request conflicts with the current state.
    Conflict,
    /// The head cannot serve it now (node gone, shutting down).
    Unavailable,
    /// A fault in the head; the message says more.
    Internal,
    /// The team has too many pending trials: retry after `retry_after_ms`.
    TooManyPending,
}

/// An error as it crosses the wire.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, thiserror::Error)]
#[error("{message} ({code:?})")]
pub struct RemoteError {
    /// What kind of error.
    pub code: ErrorCode,
    /// A human explanation.
    pub message: String,
    /// When to try again, for [`ErrorCode::TooManyPending`].
    pub retry_after_ms: Option<u64>,
}

impl RemoteError {
    /// An error with `code` and `message`.
    pub fn new(code: ErrorCode, message: impl Into<String>) -> Self {
        Self {
            code,
            message: message.into(),
            retry_after_ms: None,
        }
    }

    /// A refusal that asks the caller to come back after `retry_after_ms`.
    pub fn retry_later(message: impl Into<String>, retry_after_ms: u64) -> Self {
        Self {
            code: ErrorCode::TooManyPending,
            message: message.into(),
            retry_after_ms: Some(retry_after_ms),
        }
    }
}

/// One request from a client (or a node, for blobs).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub enum Request {
    /// Create an experiment, or reuse a finished identical one.
    Submit(SubmitRequest),
    /// Experiments and their trials; all when `experiment` is `None`.
    Status {
        /// An experiment id, or a unique prefix of one.
        experiment: Option<String>,
    },
    /// Cancel an experiment or a single trial.
    Cancel {
        /// An experiment id (or prefix) or a trial id.
        id: String,
    },
    /// A chunk of one worker's output.
    ReadLogs(LogRequest),
    /// The nodes and their resources.
    Nodes,
    /// Upload a blob: `len` raw bytes follow this frame.
    PutBlob {
        /// The blake3 hash the bytes must have.
        hash: BlobHash,
        /// How many bytes follow.
        len: u64,
    },
    /// Download a blob; the response frame is followed by its bytes.
    GetBlob {
        /// The blob.
        hash: BlobHash,
    },
    /// Trial events of an experiment after sequence number `after`, waiting up to
    /// `wait_ms` for the first one.
    Events {
        /// The experiment.
        experiment: ExperimentId,
        /// Return events with a larger sequence number.
        after: u64,
        /// How long to wait when there are none yet.
        wait_ms: u32,
    },
    /// Every metric report of one trial (all attempts and ranks), oldest first.
    Metrics {
        /// The trial.
        trial: TrialId,
    },
    /// The scheduling queues and their standing.
    Queues,
    /// An admin's arbitration; recorded with who and why.
    Admin(AdminRequest),
    /// Where a driver may store objects, and the session name they belong to: the
    /// head collects them when this connection ends.
    StoreTargets,
    /// Which live nodes hold an object (asked by a node fetching it for a worker).
    Locate {
        /// The object.
        object: ObjectId,
    },
    /// The checkpoints the head keeps for an experiment's trials.
    Checkpoints {
        /// The experiment's id or a unique prefix of it.
        experiment: String,
    },
}

/// An admin action, with who asks and why (both recorded in the events).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct AdminRequest {
    /// What to do.
    pub action: AdminAction,
    /// Who asks (the client's user name).
    pub who: String,
    /// Why, in the admin's words.
    pub why: String,
}

/// What an admin can change.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub enum AdminAction {
    /// Replace the scheduling policy with this YAML document.
    ApplyPolicy {
        /// The policy file's text.
        yaml: String,
    },
    /// Set the base priority of a trial, or of every unfinished trial of an experiment.
    Priority {
        /// A trial id, or an experiment id (or prefix).
        id: String,
        /// The new base priority.
        value: i64,
    },
    /// Keep a trial (or an experiment's trials) from being placed.
    Hold {
        /// A trial id, or an experiment id (or prefix).
        id: String,
    },
    /// Undo a hold.
    Release {
        /// A trial id, or an experiment id (or prefix).
        id: String,
    },
    /// Move a trial (or an experiment's trials) to another queue.
    Move {
        /// A trial id, or an experiment id (or prefix).
        id: String,
        /// The queue.
        queue: String,
    },
}

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

/// What a submission carries besides the spec.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct SubmitRequest {
    /// The spec in canonical JSON ([`crate::spec::ExperimentSpec::to_canonical_json`]).
    pub spec_json: String,
    /// The uploaded driver binary, for `entry` trials.
    pub program: Option<BlobHash>,
    /// The code version computed by the client.
    pub code_version: String,
    /// The data version computed by the client.
    pub data_version: String,
    /// Run again even if an identical experiment finished.
    pub rerun: bool,
}

/// Which worker's output to read, and where.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct LogRequest {
    /// The trial.
    pub trial: TrialId,
    /// The worker's rank.
    pub rank: u32,
    /// The attempt; the latest when `None`.
    pub attempt: Option<u32>,
    /// Byte offset into the log.
    pub offset: u64,
    /// The most bytes to return.
    pub max_bytes: u32,
}

/// A chunk of a worker's log.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct LogChunk {
    /// The bytes read.
    pub data: Vec<u8>,
    /// Where the next read should start.
    pub next_offset: u64,
    /// The worker has exited, so no more bytes will come after the end.
    pub complete: bool,
}

/// The answer to a [`Request`].
#[derive(Debug, Clone, Serialize, Deserialize)]
pub enum Response {
    /// The experiment id; `reused` when an identical finished experiment answered.
    Submitted {
        /// The experiment.
        experiment: ExperimentId,
        /// Whether an identical finished experiment was reused instead of run.
        reused: bool,
        /// How many trials it has.
        trials: u32,
    },
    /// Experiments.
    Status(Vec<ExperimentStatus>),
    /// How many trials a cancel stopped.
    Cancelled {
        /// Trials moved to `cancelled`.
        trials: u32,
    },
    /// A log chunk.
    Logs(LogChunk),
    /// The nodes.
    Nodes(Vec<NodeStatus>),
    /// The blob is stored (or already was).
    BlobStored,
    /// The blob follows: `len` raw bytes.
    Blob {
        /// How many bytes follow.
        len: u64,
    },
    /// Trial events, oldest first.
    Events(Vec<TrialEvent>),
    /// A trial's metric history, oldest first.
    Metrics(Vec<MetricPoint>),
    /// The scheduling queues.
    Queues(Vec<QueueStatus>),
    /// Checkpoints, oldest first.
    Checkpoints(Vec<CheckpointStatus>),
    /// The nodes holding an object.
    Located(Vec<ObjectSource>),
    /// Ready nodes a driver may store objects on, best first, and its session.
    StoreTargets {
        /// The owner name of this connection's objects.
        session: String,
        /// The nodes.
        nodes: Vec<ObjectSource>,
    },
    /// What an admin action changed.
    Admin {
        /// How many trials it touched (0 for a policy).
        trials: u32,
        /// What was done, in words.
        message: String,
    },
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
    /// Every trial finished and at least one succeeded.
    Succeeded,
    /// Every trial finished and none succeeded.
    Failed,
    /// Cancelled by a user.
    Cancelled,
}

impl ExperimentState {
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
}

/// One GPU a node offers.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct GpuInfo {
    /// The device index, as `CUDA_VISIBLE_DEVICES` names it.
    pub index: u32,
    /// The model name, or `declared` for slots declared with `--gpus`.
    pub model: String,
    /// Device memory in bytes, 0 when unknown.
    pub memory_bytes: u64,
}

/// What a node offers.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeResources {
    /// GPU slots.
    pub gpus: Vec<GpuInfo>,
    /// CPU in thousandths of a core.
    // The head's node records, written as JSON before the rename, say `milli_cpus`.
    #[serde(alias = "milli_cpus")]
    pub cpu_milli: u32,
    /// Memory in bytes.
    pub memory_bytes: u64,
}

/// A node's first message on its session stream.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct NodeRegistration {
    /// The node's persistent id.
    pub node_id: NodeId,
    /// Its host name.
    pub name: String,
    /// The host workers on other nodes reach it at (for `MASTER_ADDR`).
    pub advertise_host: String,
    /// What it offers.
    pub resources: NodeResources,
    /// Labels such as `rack=r1`.
    pub labels: BTreeMap<String, String>,
    /// Workers it still runs from before (after a head or connection restart).
    pub running: Vec<WorkerKey>,
    /// Where other nodes fetch objects from this one.
    pub objects: Option<ObjectEndpoint>,
    /// The objects its store holds, with who claims them, for the head's
    /// directory and to settle what the node missed while it was away.
    pub held_objects: Vec<HeldObject>,
}

/// One object a registering node holds, and who keeps it there.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct HeldObject {
    /// The object.
    pub id: ObjectId,
    /// Pinned (a checkpoint's object).
    pub pinned: bool,
    /// The trials that claim it.
    pub trials: Vec<TrialId>,
    /// The driver sessions that claim it.
    pub drivers: Vec<String>,
}

/// A node's object server: QUIC on `port` of the node's advertised host, with a
/// self-signed certificate whose SHA-256 the head hands to fetching nodes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct ObjectEndpoint {
    /// The UDP port.
    pub port: u16,
    /// SHA-256 of the server's certificate (DER).
    pub cert_sha256: [u8; 32],
}

/// A node that holds an object, as a fetching node needs to reach it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ObjectSource {
    /// The node.
    pub node: NodeId,
    /// Its advertised host.
    pub host: String,
    /// Its object server.
    pub endpoint: ObjectEndpoint,
}

/// One file of a checkpoint: its name in the checkpoint directory and the object
/// holding its bytes.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CheckpointFile {
    /// The path relative to the checkpoint directory (`/`-separated, no `..`).
    pub name: String,
    /// The object with its bytes.
    pub object: ObjectId,
    /// Its length in bytes.
    pub size: u64,
}

/// Whether `name` may name a checkpoint file: a plain relative path, so that
/// restoring it cannot write outside the checkpoint directory.
pub fn is_safe_checkpoint_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 4096
        && std::path::Path::new(name)
            .components()
            .all(|component| matches!(component, std::path::Component::Normal(_)))
}

/// The checkpoint a launch resumes from: the node fills the worker's
/// `XP_CHECKPOINT_DIR` with these files before starting it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ResumeFrom {
    /// The step the checkpoint was taken at (`XP_RESUME_STEP`).
    pub step: u64,
    /// The attempt that wrote it.
    pub attempt: u32,
    /// Its files.
    pub files: Vec<CheckpointFile>,
    /// Nodes holding its objects, best first.
    pub sources: Vec<ObjectSource>,
    /// A durable backup directory holding its objects, tried when no node can
    /// provide them.
    pub backup: Option<String>,
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
}

/// What a node says on its session stream.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub enum NodeMessage {
    /// The first message: who the node is.
    Register(NodeRegistration),
    /// The node is alive.
    Heartbeat,
    /// A numbered report; the head acknowledges it with [`HeadCommand::Ack`] once persisted.
    Report {
        /// Per-node sequence number, strictly increasing across reconnects.
        seq: u64,
        /// What happened.
        report: WorkerReport,
    },
    /// The answer to [`HeadCommand::ReadLogs`].
    Logs {
        /// The request this answers.
        request_id: u64,
        /// The chunk, or why there is none.
        result: Result<LogChunk, RemoteError>,
    },
    /// The node is shutting down: place nothing more on it.
    Draining,
    /// Objects this node's store gained (a replica fetched) or lost (deleted,
    /// found corrupt), for the head's directory.
    Objects {
        /// Now held.
        added: Vec<ObjectId>,
        /// No longer held.
        dropped: Vec<ObjectId>,
    },
}

/// Something that happened to a worker.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum WorkerReport {
    /// The worker process started.
    Started {
        /// The worker.
        key: WorkerKey,
        /// Its process id on the node.
        pid: u32,
    },
    /// The worker could not be started.
    LaunchFailed {
        /// The worker.
        key: WorkerKey,
        /// Why.
        error: String,
    },
    /// The worker process exited.
    Exited {
        /// The worker.
        key: WorkerKey,
        /// Its exit code, if it exited normally.
        code: Option<i32>,
        /// The signal that ended it, if any.
        signal: Option<i32>,
    },
    /// The worker reported metrics.
    Metric {
        /// The worker.
        key: WorkerKey,
        /// The report's position in the worker's output, to discard duplicates.
        index: u64,
        /// The step, if given.
        step: Option<u64>,
        /// Values by name.
        values: Vec<(String, f64)>,
    },
    /// The node stopped the worker: on the head's order, or because the node
    /// itself is shutting down. Not the trial's fault.
    Stopped {
        /// The worker.
        key: WorkerKey,
        /// Why the node stopped it.
        reason: String,
    },
    /// The worker's checkpoint was taken into the node's object store.
    Checkpoint {
        /// The worker that wrote it.
        key: WorkerKey,
        /// The step it was taken at.
        step: u64,
        /// Its files, each an object in this node's store.
        files: Vec<CheckpointFile>,
        /// The durable backup directory its objects were also written to.
        backup: Option<String>,
    },
    /// The node could not start the worker through no fault of the trial (its GPU
    /// is still held by a stopping worker, the driver binary could not be fetched,
    /// the node is shutting down): the head places it again.
    Refused {
        /// The worker.
        key: WorkerKey,
        /// Why.
        reason: String,
    },
}

impl WorkerReport {
    /// The worker this report is about.
    pub fn key(&self) -> WorkerKey {
        match self {
            Self::Started { key, .. }
            | Self::LaunchFailed { key, .. }
            | Self::Exited { key, .. }
            | Self::Metric { key, .. }
            | Self::Stopped { key, .. }
            | Self::Refused { key, .. }
            | Self::Checkpoint { key, .. } => *key,
        }
    }
}

/// What the head tells a node on its session stream.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub enum HeadCommand {
    /// Registration accepted; send heartbeats at this interval.
    Registered {
        /// Heartbeat interval in milliseconds.
        heartbeat_interval_ms: u64,
    },
    /// Start one worker (boxed: it is much larger than the other commands).
    Launch(Box<Launch>),
    /// Stop every local worker of this attempt (SIGTERM, then SIGKILL after a grace period).
    Kill {
        /// The trial.
        trial: TrialId,
        /// The attempt.
        attempt: u32,
        /// Why, for the log.
        reason: String,
        /// How long after SIGTERM (time to checkpoint) before SIGKILL.
        grace_ms: u64,
    },
    /// Reports up to and including `upto` are persisted; the node may forget them.
    Ack {
        /// The highest persisted sequence number.
        upto: u64,
    },
    /// Read a worker's log and answer with [`NodeMessage::Logs`].
    ReadLogs {
        /// Echoed in the answer.
        request_id: u64,
        /// The worker.
        key: WorkerKey,
        /// Byte offset.
        offset: u64,
        /// The most bytes to return.
        max_bytes: u32,
    },
    /// These objects belong to checkpoints the head keeps: pin them (a node
    /// forgets pins when it restarts).
    Pin {
        /// The trial whose checkpoints name them.
        trial: TrialId,
        /// The objects.
        objects: Vec<ObjectId>,
    },
    /// Fetch these objects from other nodes and keep them, pinned, as replicas.
    Replicate {
        /// The trial whose checkpoint they belong to (their owner).
        trial: TrialId,
        /// The objects and their sizes.
        objects: Vec<(ObjectId, u64)>,
        /// Nodes that hold them.
        sources: Vec<ObjectSource>,
    },
    /// The trial ended: what its workers stored and nothing else claims (and no
    /// pin keeps) may go.
    ReleaseTrial {
        /// The trial.
        trial: TrialId,
    },
    /// A driver's connection ended: what it stored and nothing else claims may go.
    ReleaseDriver {
        /// The driver session's name.
        session: String,
    },
    /// No checkpoint the head keeps needs these objects of `trial` any more: unpin
    /// them and withdraw the trial's claim (they go unless something else claims them).
    DropObjects {
        /// The trial whose checkpoints named them; none for objects nothing
        /// claims any more.
        trial: Option<TrialId>,
        /// The objects.
        objects: Vec<ObjectId>,
    },
    /// The head gave this session up (it judged the node lost): end it, reconnect
    /// and register again so that what the node still runs is reconciled.
    Reconnect {
        /// Why, for the log.
        reason: String,
    },
}

/// Everything a node needs to start one worker.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Launch {
    /// The worker.
    pub key: WorkerKey,
    /// The number of workers in the gang.
    pub world_size: u32,
    /// The rank among the gang's workers on this node.
    pub local_rank: u32,
    /// What to run.
    pub program: Program,
    /// The trial's configuration as JSON (`XP_CONFIG`).
    pub config_json: String,
    /// The replicate seed (`XP_SEED`).
    pub seed: u64,
    /// GPU indices for `CUDA_VISIBLE_DEVICES`.
    pub gpu_indices: Vec<u32>,
    /// The thousandths of each of those GPUs this worker holds: 1000 for whole
    /// GPUs, less for a fraction of one shared GPU (`XP_GPU_FRACTION`).
    pub gpu_milli: u32,
    /// Rank 0's host (`MASTER_ADDR`).
    pub master_addr: String,
    /// A port reserved on rank 0's host (`MASTER_PORT`).
    pub master_port: u16,
    /// The per-attempt secret of the gang's rendezvous and data connections (`XP_COLLECTIVE_TOKEN`).
    pub collective_token: [u8; 32],
    /// The data path between machines (`XP_COLLECTIVE_TRANSPORT`).
    pub transport: crate::spec::CollectiveTransport,
    /// The checkpoint to restore before starting, if the trial has one.
    pub resume: Option<ResumeFrom>,
}

/// The code a worker runs.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum Program {
    /// An argv with placeholders already filled.
    Command {
        /// The argv.
        argv: Vec<String>,
    },
    /// A trainable registered in a driver binary, fetched by hash.
    Entry {
        /// The driver binary.
        binary: BlobHash,
        /// The trainable's name.
        entry: String,
    },
}
