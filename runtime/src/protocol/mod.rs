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
//! [`PROTOCOL_VERSION`] (see `crate::frame`). Both sides tolerate duplicated
//! reports (nodes resend unacknowledged ones after a reconnect) and cancels that
//! race completion.
//!
//! Layout: this module holds the envelope ([`Message`]), the handshake
//! ([`Hello`], [`Welcome`]), versioning and wire errors; `requests` holds driver
//! and CLI requests with their answers, `node` a node's session, `status` the
//! status views, `objects` object locations and checkpoint files. Every type is
//! re-exported here, so its path is `xp_runtime::protocol::Type` whichever file
//! holds it.

mod alerts;
mod capability;
mod node;
mod objects;
mod pipelines;
mod requests;
mod status;
mod telemetry;

pub use alerts::{AlertStatus, DeliveryState};
pub use capability::{
    ATTEMPT_CAPABILITY_MS, CAPABILITY_FORMAT, CLOCK_SKEW_MS, CapabilityError, CapabilityKey, Grant,
    Holder, MAX_GRANT_NAME_BYTES, MAX_READ_SCOPES, MAX_RENEWALS_PER_COMMAND, MAX_REPORTED_REFUSALS,
    MAX_REVOCATIONS_PER_COMMAND, ObjectAccessReport, ObjectCapability, ObjectRefusal, ObjectRules,
    ReadScope, Revocation, RevocationEntry, RevocationList, SESSION_CAPABILITY_MS,
    TeamObjectCounts, TeamQuota,
};
pub use node::{
    AT_RECEIPT, GpuInfo, HeadCommand, HeldObject, Launch, LimitEnforcement,
    MAX_MALFORMED_LINE_SHOWN, NodeIsolation, NodeMessage, NodeRegistration, NodeResources, Program,
    WorkerReport,
};
pub use objects::{
    CheckpointFile, FetchPath, ObjectEndpoint, ObjectSource, ResumeFrom, is_safe_checkpoint_name,
};
pub use pipelines::{
    LaunchInput, PipelineStatus, PipelineSubmit, ReusedFrom, StageInput, StageState, StageStatus,
};
pub use requests::{
    AdminAction, AdminRequest, AuditEntry, LogChunk, LogRequest, MAX_ALERTS_LISTED,
    MAX_CAPABILITY_OBJECTS, MAX_CHECKPOINTS_PER_PAGE, ObjectKey, ReportRequest, Request, Response,
    SubmitRequest,
};
pub use status::{
    ApprovalStatus, AttemptStatus, CheckpointCursor, CheckpointStatus, CheckpointsPage,
    ConflictOdds, ExperimentState, ExperimentStatus, FrontStatus, FrontTrial, LeaseClaim,
    LeaseReport, LeaseStatus, MalformedMetrics, MetricPoint, MetricsPage, NodeState, NodeStatus,
    ObjectiveStatus, QueueStatus, ResourceAmounts, StatusCursor, StatusPage, StatusQuery,
    TrialEvent, TrialState, TrialStatus,
};
pub use telemetry::{
    FieldStats, GpuSample, MAX_SERIES_POINTS, MAX_TELEMETRY_GPUS, MAX_TELEMETRY_WORKERS,
    NodeTelemetry, StoreUsage, TelemetryWindow, TrialTelemetry, WorkerSample, WorkerTelemetry,
};

use std::time::Duration;

use serde::{Deserialize, Serialize};

/// The protocol version every frame carries. Bumped whenever a message's encoding
/// changes (bincode is not self-describing: a field added to a struct changes it,
/// and so does a variant a peer of the same version would not know). 2: a
/// checkpoint status says why it is unreplicated, `NodeMessage::ReplicationFailed`
/// and `ErrorCode::StorageUnavailable`. 3: a launch carries the worker's CPU
/// and memory limits, and `WorkerReport::OomKilled`. 4: users and roles:
/// `Request::Audit`, `Request::ObjectKey`, their answers, `ErrorCode::Forbidden`;
/// what a node enforces on its workers (`NodeRegistration::isolation`,
/// `NodeStatus::isolation`). 5: telemetry (`NodeMessage::Telemetry`,
/// `Request::Telemetry`, `Response::Telemetry`, `NodeStatus::gpus`) and a
/// checkpoint's take duration (`WorkerReport::Checkpoint::take_ms`); pipelines
/// (`Request::SubmitPipeline` and the others after it, their answers,
/// `WorkerReport::Outputs`, `Launch::inputs`); `xp report` (`Request::Report`,
/// `Response::Report`, `TrialStatus::gpu_hours` and `cost`). 6: multi-objective
/// searches (`ExperimentStatus::objectives` and `front`). 7: oversubscribed
/// fractional GPUs (`Launch::oversubscription_milli`, `WorkerReport::Evicted`).
/// 8: object capabilities (`Request::ObjectCapability` and its answer, which
/// replace `Request::ObjectKey`; `Launch::object_capability`;
/// `HeadCommand::ObjectRules` and `RevokeCapabilities`;
/// `NodeMessage::ObjectAccess`); `xp status` in bounded pages
/// (`Request::StatusPage`, `Response::StatusPage`). 9: a failed worker's
/// stderr tail (`WorkerReport::ExitedWithStderr`) and the directory a
/// command's relative paths are found in (`Launch::command_dir`); metric
/// lines the node could not read (`WorkerReport::MalformedMetrics`); when the
/// node made each report (`NodeMessage::Report::at`). 10: the path a trial's
/// objects take between nodes, by its spec's `transport`
/// (`Launch::object_path`, `HeadCommand::Replicate::path`). 11: one trial's
/// newest events (`Request::TrialEvents`), read from the head's store; a
/// trial's metric history in pages (`Request::Metrics`, `MetricsPage`).
/// 12: one trial's checkpoints (`Request::TrialCheckpoints`). 13: an
/// experiment's checkpoints in pages (`Request::Checkpoints`'s `after` and
/// `limit`, `Response::CheckpointsPage`). 14: attempts' capabilities last an
/// hour and are renewed while the attempt lives
/// (`HeadCommand::RenewCapabilities`).
pub const PROTOCOL_VERSION: u16 = 14;

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

/// Who is connecting, and their credential. Its `Debug` leaves the token out,
/// so a hello that is logged (a second one on a connection, say) never shows it.
#[derive(Clone, Serialize, Deserialize)]
pub struct Hello {
    /// The secret from the join string: a user's personal secret (clients) or
    /// the cluster's node secret (nodes).
    pub token: String,
    /// Whether this is a node or a client (CLI, driver).
    pub role: PeerRole,
    /// Software name and version, for logs.
    pub agent: String,
}

impl std::fmt::Debug for Hello {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Hello")
            .field("token", &"<redacted>")
            .field("role", &self.role)
            .field("agent", &self.agent)
            .finish()
    }
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
    /// The head cannot store changes now (its disk is full or its database
    /// failed): nothing was changed; it still answers reads, and takes changes
    /// again by itself once it can store them, so retry later.
    StorageUnavailable,
    /// The authenticated user (or node) may not do this: the message says what
    /// was refused and which role would allow it.
    Forbidden,
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

/// How often a node's session with the head sends a QUIC keep-alive when it has
/// nothing else to send, so that an idle session is never mistaken for a dead one.
pub const NODE_SESSION_KEEP_ALIVE: Duration = Duration::from_secs(1);
/// How long a node's session with the head may go without a packet before it is
/// dropped: the time a node takes to notice that the head is gone (a head killed
/// without closing, or restarted, which cannot reset the old connection). QUIC
/// uses the smaller of the two sides' values, so this holds on the head's side of
/// the session too. Five keep-alives missed in a row: short enough to come back
/// quickly, long enough that a loaded machine's pause is not taken for a loss.
/// A connection attempt to a head that is not there gives up after as long.
pub const NODE_SESSION_IDLE_TIMEOUT: Duration = Duration::from_secs(5);
/// The longest wait between a node's failed connection attempts (each wait is
/// drawn in the upper half of a doubling ceiling, up to this).
pub const NODE_RECONNECT_MAX_BACKOFF: Duration = Duration::from_secs(2);
/// The longest a node takes to come back to a head that was killed and started
/// again: noticing that the old session is dead ([`NODE_SESSION_IDLE_TIMEOUT`]),
/// a connection attempt begun while the head was away (which fails after as
/// long), then the longest back-off before the attempt that succeeds. A sum of
/// the worst cases, so that a slow handshake on a loaded machine still fits; a
/// restarted head waits at least this long (plus its node timeout) before it
/// judges a node that has not come back lost.
pub const NODE_RETURN_BOUND: Duration = Duration::from_millis(
    2 * NODE_SESSION_IDLE_TIMEOUT.as_millis() as u64
        + NODE_RECONNECT_MAX_BACKOFF.as_millis() as u64,
);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn debug_of_a_hello_hides_its_token() {
        let hello = Hello {
            token: "f00dcafe".repeat(8),
            role: PeerRole::Node,
            agent: "xp-node 0.1".to_owned(),
        };
        for text in [
            format!("{hello:?}"),
            format!("{:?}", Message::Hello(hello.clone())),
        ] {
            assert!(!text.contains("f00dcafe"), "{text}");
            assert!(text.contains("xp-node 0.1"), "{text}");
        }
    }
}
