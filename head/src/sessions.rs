//! The connected nodes' sessions, shared by the actor (which sends them
//! commands), the QUIC server (which runs them) and the HTTP API (which
//! relays log reads through them).
//!
//! Not here: the session's protocol (`server::node_session`) and what nodes
//! are known or lost (the core's membership).

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use dashmap::DashMap;
use tokio::sync::{mpsc, oneshot};
use tracing::debug;
use xp_runtime::ids::{NodeId, WorkerKey};
use xp_runtime::protocol::{ErrorCode, HeadCommand, LogChunk, LogRequest, RemoteError};

/// How long a log read waits for the node.
const LOG_READ_TIMEOUT: Duration = Duration::from_secs(10);
/// The most bytes one log read asks of a node.
const MAX_LOG_READ_BYTES: u32 = 4 << 20;

/// A log read waiting for its node's answer.
pub(crate) type LogWaiter = oneshot::Sender<Result<LogChunk, RemoteError>>;

/// What a connected node's session offers the rest of the head.
#[derive(Debug, Clone)]
pub(crate) struct NodeSessionHandle {
    /// Distinguishes this session from a later one of the same node.
    pub session_id: u64,
    /// Commands to write on the node's session stream.
    pub commands: mpsc::UnboundedSender<HeadCommand>,
    /// Log reads waiting for the node's answer, by request id.
    pub pending_logs: Arc<DashMap<u64, LogWaiter>>,
    /// When the session last read a frame from the node (Unix milliseconds).
    pub heard_at: Arc<AtomicU64>,
}

impl NodeSessionHandle {
    /// When the session last read a frame from the node.
    pub(crate) fn last_heard(&self) -> u64 {
        self.heard_at.load(Ordering::Relaxed)
    }
}

/// Connected node sessions.
pub(crate) type Sessions = Arc<DashMap<NodeId, NodeSessionHandle>>;

/// Sends `command` to `node_id`'s session; a node not connected gets it
/// reconciled when it registers again (said at debug level: a fleet's churn
/// drops thousands of them).
pub(crate) fn send_to_node(sessions: &Sessions, node_id: NodeId, command: HeadCommand) {
    let sender = sessions
        .get(&node_id)
        .map(|session| session.commands.clone());
    match sender {
        Some(sender) => {
            let _ = sender.send(command);
        }
        None => {
            debug!(%node_id, ?command, "node not connected; command dropped (reconciled when it returns)")
        }
    }
}

/// Numbers log reads, so that each answer finds its waiter.
static NEXT_LOG_READ: AtomicU64 = AtomicU64::new(1);

/// Reads a piece of `key`'s log from `node`, which holds it.
pub(crate) async fn relay_logs(
    sessions: &Sessions,
    node: NodeId,
    key: WorkerKey,
    request: &LogRequest,
) -> Result<LogChunk, RemoteError> {
    let session = sessions
        .get(&node)
        .map(|session| session.clone())
        .ok_or_else(|| {
            RemoteError::new(
                ErrorCode::Unavailable,
                format!("node {node}, which holds this log, is not connected"),
            )
        })?;
    let request_id = NEXT_LOG_READ.fetch_add(1, Ordering::Relaxed);
    let (reply_tx, reply_rx) = oneshot::channel();
    session.pending_logs.insert(request_id, reply_tx);
    let _ = session.commands.send(HeadCommand::ReadLogs {
        request_id,
        key,
        offset: request.offset,
        max_bytes: request.max_bytes.clamp(1, MAX_LOG_READ_BYTES),
    });
    let answer = tokio::time::timeout(LOG_READ_TIMEOUT, reply_rx).await;
    session.pending_logs.remove(&request_id);
    match answer {
        Ok(Ok(result)) => result,
        _ => Err(RemoteError::new(
            ErrorCode::Unavailable,
            format!("node {node} did not answer the log read"),
        )),
    }
}
