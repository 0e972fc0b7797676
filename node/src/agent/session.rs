//! The agent's connection to the head: opening a session, registering,
//! writing messages, reading the head's commands, and closing.
//!
//! A task reads the head's stream and hands each command to the agent's loop;
//! the loop writes. A write that fails, or a stream that ends, is told to the
//! core as a broken session (`NodeCore::handle_disconnected`), which decides
//! what follows.
//!
//! Not here: what to register, resend or write when (the core decides), and
//! the connection itself (`xp_runtime::transport`).

use std::time::Instant;

use quinn::{RecvStream, SendStream};
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tracing::{info, warn};
use xp_runtime::frame;
use xp_runtime::ids::WorkerKey;
use xp_runtime::protocol::{HeadCommand, HeldObject, Message, NodeMessage, NodeRegistration};
use xp_runtime::transport::{self, HeadConnection};

use super::Agent;
use crate::objects::Owner;

/// An open session with the head.
pub(super) struct HeadSession {
    pub(super) connection: HeadConnection,
    send: SendStream,
    /// The head's commands, as the reader task reads them; closed when the
    /// stream ends or breaks.
    pub(super) commands: mpsc::UnboundedReceiver<HeadCommand>,
    reader: JoinHandle<()>,
}

impl Agent {
    /// Opens a session on a new connection: its reader starts, and the local
    /// object channel looks things up through it.
    pub(super) fn open_session(
        &mut self,
        connection: HeadConnection,
        send: SendStream,
        recv: RecvStream,
    ) {
        self.learn_advertise_host(&connection);
        *self
            .objects
            .head
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = Some(connection.clone());
        let (commands_tx, commands) = mpsc::unbounded_channel();
        let reader =
            xp_runtime::task::spawn("node-session-reader", read_commands(recv, commands_tx));
        self.session = Some(HeadSession {
            connection,
            send,
            commands,
            reader,
        });
    }

    /// Advertises the local address of `connection` when no route to the head was
    /// found at start: the address the head sees this node's packets come from.
    fn learn_advertise_host(&mut self, connection: &HeadConnection) {
        let identity = &mut self.config.identity;
        if !identity.advertise_from_connection {
            return;
        }
        if let Some(ip) = connection.connection.local_ip() {
            if identity.advertise_host != ip.to_string() {
                info!(%ip, "advertising the local address of the connection to the head");
            }
            identity.advertise_host = ip.to_string();
        }
    }

    /// Registers this node on the session, with `running` as its workers.
    pub(super) async fn register(&mut self, running: Vec<WorkerKey>) {
        let registration = self.registration(running);
        self.write(NodeMessage::Register(registration)).await;
    }

    fn registration(&self, running: Vec<WorkerKey>) -> NodeRegistration {
        let identity = &self.config.identity;
        NodeRegistration {
            node_id: identity.node_id,
            name: identity.name.clone(),
            advertise_host: identity.advertise_host.clone(),
            resources: identity.resources.clone(),
            labels: identity.labels.clone(),
            running,
            objects: Some(self.objects.endpoint),
            held_objects: self
                .objects
                .store
                .holdings()
                .into_iter()
                .map(|(id, info)| {
                    let mut held = HeldObject {
                        id,
                        pinned: info.pinned,
                        trials: Vec::new(),
                        drivers: Vec::new(),
                    };
                    for owner in info.owners {
                        match owner {
                            Owner::Trial(trial) => held.trials.push(trial),
                            Owner::Driver(session) => held.drivers.push(session),
                        }
                    }
                    held
                })
                .collect(),
            isolation: self.config.isolation.summary(),
        }
    }

    /// Writes `message` on the session; a failed write breaks it.
    pub(super) async fn write(&mut self, message: NodeMessage) {
        let Some(session) = &mut self.session else {
            return;
        };
        let written = frame::write_message(&mut session.send, &Message::FromNode(message)).await;
        if written.is_err() {
            self.core
                .handle_disconnected(tokio::time::Instant::now().into_std());
        }
    }

    /// Ends the session: stops reading and closes the connection, first waiting
    /// until `linger_until` for the head to read to the end and close its side
    /// (closing at once would discard what is still in flight: `Draining`, the
    /// last heartbeat), which also tells it this node has left.
    pub(super) async fn close_session(&mut self, linger_until: Option<Instant>) {
        let Some(mut session) = self.session.take() else {
            return;
        };
        session.reader.abort();
        let _ = session.send.finish();
        if let Some(until) = linger_until {
            let until = tokio::time::Instant::from_std(until);
            let _ = tokio::time::timeout_at(until, session.connection.connection.closed()).await;
        }
        *self
            .objects
            .head
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = None;
        session
            .connection
            .connection
            .close(transport::CLOSE_SHUTDOWN.into(), b"node session ended");
    }
}

/// Reads the head's commands into `commands` until the stream ends or breaks.
async fn read_commands(mut recv: RecvStream, commands: mpsc::UnboundedSender<HeadCommand>) {
    loop {
        match frame::read_message(&mut recv).await {
            Ok(Some(Message::ToNode(command))) => {
                if commands.send(command).is_err() {
                    return;
                }
            }
            Ok(Some(Message::Error(error))) => {
                warn!(%error, "the head refused this session");
                return;
            }
            Ok(Some(other)) => {
                warn!(?other, "unexpected message from the head");
                return;
            }
            Ok(None) => return,
            Err(error) => {
                warn!(%error, "session with the head broke");
                return;
            }
        }
    }
}
