//! A node's session with the head: its registration, then its messages read
//! and handed to the actor in batches (one commit each), and the head's
//! commands written back, until the stream ends or the actor refuses.
//!
//! Node loss is judged by the core from missed heartbeats, not by this stream:
//! the reader notes when it last read a frame (`NodeSessionHandle::heard_at`),
//! which the actor hands the core at every tick, and the session's end is
//! reported to the actor (a trouble for the node's gangs unless it drained).
//! While the reader waits for the actor to take what it read (the head is
//! behind on storing this node's reports), the node counts as heard: its
//! heartbeats queue behind those reports, and the silence is the head's.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use dashmap::DashMap;
use quinn::{Connection, RecvStream, SendStream};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use tracing::{Instrument, error, info, info_span, warn};
use xp_runtime::clock::{Clock, SystemClock};
use xp_runtime::frame;
use xp_runtime::ids::NodeId;
use xp_runtime::protocol::{
    ErrorCode, HeadCommand, Message, NodeMessage, NodeRegistration, RemoteError,
};
use xp_runtime::transport::{self, CLOSE_PROTOCOL_ERROR};

use super::ServerContext;
use crate::actor::{HeadMsg, call};
use crate::sessions::{LogWaiter, NodeSessionHandle};

pub(super) async fn run_node_session(
    connection: &Connection,
    mut send: SendStream,
    mut recv: RecvStream,
    context: &Arc<ServerContext>,
) {
    let Some(registration) = read_registration(&mut send, &mut recv).await else {
        return;
    };
    let node_id: NodeId = registration.node_id;
    let span = info_span!("node_session", %node_id);
    async {
        let session_id = context.counter.fetch_add(1, Ordering::Relaxed);
        let (commands_tx, commands_rx) = mpsc::unbounded_channel::<HeadCommand>();
        let pending_logs = Arc::new(DashMap::new());
        let heard_at = Arc::new(AtomicU64::new(SystemClock.now()));
        context.sessions.insert(
            node_id,
            NodeSessionHandle {
                session_id,
                commands: commands_tx,
                pending_logs: pending_logs.clone(),
                heard_at: heard_at.clone(),
            },
        );
        if let Err(error) = call(&context.head, |reply| {
            HeadMsg::NodeRegistered(registration, session_id, reply)
        })
        .await
        {
            warn!(%error, "node registration refused");
            transport::send_error(&mut send, error).await;
            context
                .sessions
                .remove_if(&node_id, |_, session| session.session_id == session_id);
            return;
        }
        let writer = xp_runtime::task::spawn(
            "node-session-writer",
            write_commands(node_id, send, commands_rx),
        );
        // The reader goes on reading while the actor stores the last batch, so
        // that what the node sent meanwhile goes to the actor as one batch (one
        // commit). Its queue is bounded: a node that reports faster than the
        // head stores is slowed by QUIC flow control.
        let (batch_tx, batch_rx) = mpsc::channel::<NodeMessage>(context.commit_batch.max(1));
        let reader = read_node_messages(
            connection.clone(),
            recv,
            Heard {
                at: heard_at,
                pending_logs,
            },
            batch_tx,
            context.shutdown.clone(),
        );
        let forward = forward_batches(context, node_id, session_id, batch_rx);
        // Either ending ends the session: the reader at the stream's end, the
        // forwarder when the actor refuses. What the reader read before the
        // stream's end still goes to the actor first (a node leaving sends
        // `Draining` and then ends its stream at once).
        tokio::pin!(forward);
        tokio::select! {
            () = reader => (&mut forward).await,
            () = &mut forward => {}
        }
        writer.abort();
        info!("node session closed");
        let _ = context
            .head
            .cast(HeadMsg::NodeDisconnected(node_id, session_id));
    }
    .instrument(span)
    .await;
}

/// The registration a node session must open with; `None` (answered) when
/// it opens with anything else.
async fn read_registration(
    send: &mut SendStream,
    recv: &mut RecvStream,
) -> Option<NodeRegistration> {
    match frame::read_message(recv).await {
        Ok(Some(Message::FromNode(NodeMessage::Register(registration)))) => Some(registration),
        Ok(other) => {
            warn!(?other, "node session refused: expected a registration");
            transport::send_error(
                send,
                RemoteError::new(ErrorCode::BadRequest, "a node must register first"),
            )
            .await;
            None
        }
        Err(error) => {
            warn!(%error, "node session refused: bad frame");
            transport::send_error(send, error.to_remote()).await;
            None
        }
    }
}

/// Writes the head's commands on the node's session stream until it fails.
async fn write_commands(
    node_id: NodeId,
    mut send: SendStream,
    mut commands: mpsc::UnboundedReceiver<HeadCommand>,
) {
    while let Some(command) = commands.recv().await {
        if let Err(error) = frame::write_message(&mut send, &Message::ToNode(command)).await {
            error!(%node_id, %error, "node session write failed");
            break;
        }
    }
}

/// Hands the actor what the node sent, as many messages at once as wait (up
/// to the commit batch), until the actor refuses. During a storage outage the
/// actor accepts messages without applying or acknowledging them; it refuses
/// those of a session it ended or replaced.
async fn forward_batches(
    context: &ServerContext,
    node_id: NodeId,
    session_id: u64,
    mut batches: mpsc::Receiver<NodeMessage>,
) {
    while let Some(first) = batches.recv().await {
        let mut batch = vec![first];
        while batch.len() < context.commit_batch.max(1) {
            match batches.try_recv() {
                Ok(message) => batch.push(message),
                Err(_) => break,
            }
        }
        let forwarded = call(&context.head, |reply| {
            HeadMsg::FromNode(node_id, session_id, batch, reply)
        })
        .await;
        if let Err(error) = forwarded {
            warn!(%error, "node reports not processed; the node resends them after reconnecting");
            break;
        }
    }
}

/// Where the reader leaves what it heard outside the batch queue.
struct Heard {
    /// When it last read a frame.
    at: Arc<AtomicU64>,
    /// Log reads waiting for their answer.
    pending_logs: Arc<DashMap<u64, LogWaiter>>,
}

/// Reads a node's session stream until it ends: log answers go to their
/// waiters, everything else to the batch queue; every frame read is a sign
/// of life.
async fn read_node_messages(
    connection: Connection,
    mut recv: RecvStream,
    heard: Heard,
    batches: mpsc::Sender<NodeMessage>,
    shutdown: CancellationToken,
) {
    loop {
        let message = tokio::select! {
            () = shutdown.cancelled() => break,
            message = frame::read_message(&mut recv) => message,
        };
        if matches!(message, Ok(Some(_))) {
            heard.at.fetch_max(SystemClock.now(), Ordering::Relaxed);
        }
        match message {
            Ok(Some(Message::FromNode(NodeMessage::Logs { request_id, result }))) => {
                if let Some((_, waiter)) = heard.pending_logs.remove(&request_id) {
                    let _ = waiter.send(result);
                }
            }
            Ok(Some(Message::FromNode(message))) => {
                if !queue_for_the_actor(&batches, message, &heard.at).await {
                    break;
                }
            }
            Ok(Some(other)) => {
                warn!(?other, "unexpected message on a node session; closing it");
                connection.close(
                    CLOSE_PROTOCOL_ERROR.into(),
                    b"unexpected message on node session",
                );
                break;
            }
            Ok(None) => break,
            Err(error) => {
                // Node loss is judged by missed heartbeats, not by this stream.
                info!(%error, "node session stream ended");
                break;
            }
        }
    }
}

/// How often a reader waiting on the actor notes the node as heard.
const HEARD_WHILE_WAITING: std::time::Duration = std::time::Duration::from_millis(250);

/// Queues `message` for the actor, noting the node as heard while the queue
/// is full (the head, not the node, is behind); false once the actor side is gone.
async fn queue_for_the_actor(
    batches: &mpsc::Sender<NodeMessage>,
    message: NodeMessage,
    heard_at: &AtomicU64,
) -> bool {
    let message = match batches.try_send(message) {
        Ok(()) => return true,
        Err(mpsc::error::TrySendError::Closed(_)) => return false,
        Err(mpsc::error::TrySendError::Full(message)) => message,
    };
    let send = batches.send(message);
    tokio::pin!(send);
    let mut waiting = tokio::time::interval(HEARD_WHILE_WAITING);
    loop {
        tokio::select! {
            sent = &mut send => return sent.is_ok(),
            _ = waiting.tick() => {
                heard_at.fetch_max(SystemClock.now(), Ordering::Relaxed);
            }
        }
    }
}
