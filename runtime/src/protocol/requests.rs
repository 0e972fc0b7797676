//! Requests on a fresh stream and their answers: what drivers, the CLI and tools
//! ask of the head ([`Request`]), and what it answers ([`Response`]).
//!
//! Each request travels alone on its own bidirectional stream and is answered by
//! exactly one response or one [`super::RemoteError`]; blob transfers follow the
//! frame with the announced number of raw bytes. This module holds no node
//! session messages (see `node`) and no status shapes (see `status`).
//!
//! Invariant: enum variants and struct fields are append-only (bincode is not
//! self-describing); a removed variant keeps its slot.

use serde::{Deserialize, Serialize};

use super::{
    CheckpointStatus, ExperimentStatus, MetricsPage, NodeStatus, ObjectSource, QueueStatus,
    TrialEvent,
};
use crate::ids::{BlobHash, ExperimentId, ObjectId, TrialId};

/// The most alerts one [`Request::Alerts`] answers (the newest).
pub const MAX_ALERTS_LISTED: usize = 1000;

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
    /// One page of a trial's metric reports (all attempts and ranks), oldest
    /// first: at most `limit` (and at most 10,000 or about 4 MiB), after
    /// report `after` (the `next` of the page before; `None`: from the first).
    Metrics {
        /// The trial.
        trial: TrialId,
        /// Where the page starts: after this report.
        after: Option<u64>,
        /// How many reports at most.
        limit: u32,
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
    /// One page of the checkpoints the head keeps for an experiment's trials
    /// (in pages since version 13): in the order of trial, attempt and step,
    /// after `after` (the `next` of the page before; `None`: from the first),
    /// at most `limit` (and at most 1,000 or about 4 MiB). Answered by
    /// [`Response::CheckpointsPage`].
    Checkpoints {
        /// The experiment's id or a unique prefix of it.
        experiment: String,
        /// Where the page starts: after this checkpoint.
        after: Option<super::CheckpointCursor>,
        /// How many checkpoints at most.
        limit: u32,
    },
    /// Which of `sessions` (driver sessions that own an object) submitted
    /// `experiment` on their connection, and so share their objects with its
    /// trials (asked by a node before it serves a worker a driver's object);
    /// answered by [`Response::Drivers`]. Names only what the asker already knows.
    SharingDrivers {
        /// The worker's experiment.
        experiment: ExperimentId,
        /// The driver sessions that own the object.
        sessions: Vec<String>,
    },
    /// The newest entries of the head's audit trail (admin actions and
    /// refusals), newest last; admins only. Answered by [`Response::Audit`].
    Audit {
        /// At most this many entries (the head caps it).
        limit: u32,
    },
    /// The cluster-wide object key of versions 4 to 7. Kept for its slot:
    /// since version 8 the head refuses it (drivers ask
    /// [`Request::ObjectCapability`]).
    ObjectKey,
    /// A trial's resource telemetry, per rank, downsampled (viewers of its team).
    /// Answered by [`Response::Telemetry`].
    Telemetry {
        /// The trial.
        trial: TrialId,
    },
    /// Submit a pipeline (members of its team). Answered by
    /// [`Response::PipelineSubmitted`].
    SubmitPipeline(super::PipelineSubmit),
    /// One pipeline (by id) or every visible one, newest first (viewers).
    /// Answered by [`Response::Pipelines`].
    PipelineStatus {
        /// The pipeline's id; every pipeline when absent.
        pipeline: Option<u64>,
    },
    /// Cancel a pipeline's running and waiting stages (members of its team).
    /// Answered by [`Response::PipelineChanged`].
    CancelPipeline {
        /// The pipeline.
        pipeline: u64,
    },
    /// Rerun a pipeline's failed and cancelled stages and their descendants,
    /// reusing what succeeded (members of its team). Answered by
    /// [`Response::PipelineChanged`].
    RetryPipeline {
        /// The pipeline.
        pipeline: u64,
    },
    /// The alerts of one experiment (by id or prefix) or of every visible one,
    /// newest first, at most [`MAX_ALERTS_LISTED`] (viewers of its team).
    /// Answered by [`Response::Alerts`].
    Alerts {
        /// The experiment; every visible one when absent.
        experiment: Option<String>,
    },
    /// GPU-hours, cost, utilisation, Little's law, return on GPU-hours and
    /// Amdahl fits of one scope over a window (`xp report`): viewers of the
    /// experiment's or team's team, admins for the whole cluster. Answered by
    /// [`Response::Report`].
    Report(ReportRequest),
    /// Every lease of the policy with its capacity, holders and waiters, the
    /// preemptions waiting for an admin's approval, and the conflict odds of
    /// leases and GPU models (any user, like [`Request::Queues`]). Answered by
    /// [`Response::Leases`].
    Leases,
    /// A capability for the object servers (`crate::object_wire`) for this
    /// connection's driver session (members and above): it stores as the
    /// session and reads what the session and the team's other sessions
    /// keep, what the experiments the session submitted keep, and those of
    /// `objects` (at most [`MAX_CAPABILITY_OBJECTS`]) that the asker's team's
    /// checkpoints or outputs name. Answered by [`Response::ObjectCapability`].
    ObjectCapability {
        /// Objects to read by id.
        objects: Vec<ObjectId>,
    },
    /// One page of `xp status`: experiments in id order, with as many of their
    /// trials as one bounded answer holds (since version 8; the head still
    /// answers [`Request::Status`] while the answer fits one frame).
    /// Answered by [`Response::StatusPage`].
    StatusPage(super::StatusQuery),
    /// The newest events of one trial, oldest first: at most `limit`, and at
    /// most 1,000 (answered by [`Response::Events`]).
    TrialEvents {
        /// The trial.
        trial: TrialId,
        /// How many at most.
        limit: u32,
    },
    /// The checkpoints the head keeps for one trial (since version 12).
    /// Answered by [`Response::Checkpoints`].
    TrialCheckpoints {
        /// The trial.
        trial: TrialId,
    },
}

/// The most objects one [`Request::ObjectCapability`] names.
pub const MAX_CAPABILITY_OBJECTS: usize = 16;

/// The most checkpoints one page of [`Request::Checkpoints`] holds.
pub const MAX_CHECKPOINTS_PER_PAGE: u32 = 1000;

/// The scope and window of a [`Request::Report`].
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ReportRequest {
    /// One experiment (id or prefix); exclusive with `team`.
    pub experiment: Option<String>,
    /// One team's experiments; the whole cluster when neither is given.
    pub team: Option<String>,
    /// The window is the last this many milliseconds; from the first arrival in
    /// scope when absent.
    pub since_ms: Option<u64>,
}

/// An admin action and why (recorded in the events with the authenticated user).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct AdminRequest {
    /// What to do.
    pub action: AdminAction,
    /// Ignored by the head since protocol 4, which records the user the
    /// connection authenticated as; kept so the encoding keeps its order.
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
    /// Let a preemption waiting for approval go ahead.
    Approve {
        /// The pending request's id.
        request: u64,
    },
    /// Refuse a preemption waiting for approval; the same victim is not asked
    /// again for the same claimant while both stay where they are.
    Deny {
        /// The pending request's id.
        request: u64,
    },
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
    /// A page of a trial's metric history.
    Metrics(MetricsPage),
    /// The scheduling queues.
    Queues(Vec<QueueStatus>),
    /// One trial's checkpoints, oldest first.
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
    /// The driver sessions, among those asked, that share their objects with
    /// the experiment (answering [`Request::SharingDrivers`]).
    Drivers(Vec<String>),
    /// Audit entries, oldest first (answering [`Request::Audit`]).
    Audit(Vec<AuditEntry>),
    /// The object plane's key (answering [`Request::ObjectKey`] up to version 7).
    ObjectKey(ObjectKey),
    /// A trial's telemetry (answering [`Request::Telemetry`]).
    Telemetry(super::TrialTelemetry),
    /// A pipeline was created (answering [`Request::SubmitPipeline`]).
    PipelineSubmitted {
        /// Its id.
        pipeline: u64,
        /// Its stages.
        stages: u32,
        /// Of those, how many reuse an earlier identical stage's result.
        reused: u32,
    },
    /// Pipelines (answering [`Request::PipelineStatus`]).
    Pipelines(Vec<super::PipelineStatus>),
    /// How many stages a cancel or retry changed.
    PipelineChanged {
        /// The stages changed.
        stages: u32,
    },
    /// Alerts, newest first (answering [`Request::Alerts`]).
    Alerts(Vec<super::AlertStatus>),
    /// The report (answering [`Request::Report`]).
    Report(Box<crate::report::UsageReport>),
    /// Leases, pending approvals and conflict odds (answering
    /// [`Request::Leases`]).
    Leases(super::LeaseReport),
    /// A capability for the object servers (answering [`Request::ObjectCapability`]).
    ObjectCapability(Box<super::ObjectCapability>),
    /// One page of `xp status` (answering [`Request::StatusPage`]).
    StatusPage(super::StatusPage),
    /// A page of an experiment's checkpoints (`Request::CheckpointsPage`).
    CheckpointsPage(super::CheckpointsPage),
}

/// One entry of the head's audit trail: an admin action or a refusal.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AuditEntry {
    /// Its sequence number, increasing.
    pub seq: u64,
    /// When, in milliseconds since the Unix epoch.
    pub at: u64,
    /// The authenticated user (`node` for a node credential, `xp-head user`
    /// for the head machine's own user commands).
    pub who: String,
    /// What was asked, in words (`cancel 3f2a…`, `admin priority t-1 = 5`).
    pub action: String,
    /// Whether it was allowed.
    pub allowed: bool,
    /// Why it was refused (what role would allow it), or what was done.
    pub detail: String,
}

/// The object plane's cluster-wide key of versions 4 to 7, kept for the slot
/// of [`Response::ObjectKey`]; no head of version 8 hands one out. Its
/// `Debug` hides it.
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ObjectKey(pub [u8; 32]);

impl std::fmt::Debug for ObjectKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ObjectKey(<redacted>)")
    }
}
