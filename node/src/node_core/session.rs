//! One session with the head at a time: connecting, waiting between attempts,
//! registering, resending, heartbeats, the head's commands, and what follows
//! a session's end.
//!
//! A new session registers first (with the workers the node still tracks and
//! those whose end the head has not acknowledged), then resends every
//! unacknowledged report in order, then heartbeats every period. A session that
//! broke after the head registered the node is followed by an immediate
//! attempt (the head may be back already); failed attempts, and sessions the
//! head ended before registering the node, wait the back-off's next delay
//! (`reconnect`). A refusal of the node's credentials ends the node: retrying
//! cannot help.
//!
//! The heartbeat period of a session is the interval the head asked for at the
//! last registration before it began (1 s before any): a `Registered` sets the
//! period of the sessions after it.

use std::time::{Duration, Instant};

use tracing::{debug, warn};
use xp_runtime::protocol::{HeadCommand, NodeMessage};
use xp_runtime::transport::TransportError;

use super::{Action, NodeCore, Phase, Session};
use crate::objects::{ObjectChange, Owner};

/// The most object changes sent to the head in one message.
pub(crate) const MAX_OBJECT_CHANGES: usize = 4096;

impl NodeCore {
    /// The connection attempt succeeded: register, resend what the head has not
    /// acknowledged, and heartbeat.
    pub(crate) fn handle_connected(&mut self, now: Instant) {
        if !matches!(self.phase, Phase::Connecting) {
            return;
        }
        self.phase = Phase::Session(Session {
            registered: false,
            heartbeat: self.heartbeat,
            next_heartbeat: now + self.heartbeat,
        });
        let mut running: Vec<_> = self.workers.keys().copied().collect();
        running.extend(self.outbox.unacked_final());
        running.sort();
        running.dedup();
        self.actions.push_back(Action::Register { running });
        let resend = self.outbox.unacked().map(|(seq, at, report)| {
            Action::Send(NodeMessage::Report {
                seq,
                at,
                report: report.clone(),
            })
        });
        self.actions.extend(resend);
        self.actions.push_back(Action::Send(NodeMessage::Heartbeat));
    }

    /// The connection attempt failed with `error`: wait and try again, unless
    /// the head refused this node's credentials.
    pub(crate) fn handle_connect_failed(&mut self, now: Instant, error: &TransportError) {
        if !matches!(self.phase, Phase::Connecting) {
            return;
        }
        if matches!(
            error,
            TransportError::BadToken(_) | TransportError::CaMismatch(_)
        ) {
            self.leave(now, "node refused by the head", true);
            return;
        }
        let delay = self.backoff.next_delay();
        warn!(%error, retry_in = ?delay, "cannot reach the head");
        self.phase = Phase::Waiting { until: now + delay };
    }

    /// The session broke (a write failed, the head closed it, or it asked the
    /// node to register again).
    pub(crate) fn handle_disconnected(&mut self, now: Instant) {
        let Phase::Session(session) = &self.phase else {
            return;
        };
        let registered = session.registered;
        // What was to be written on it is moot: reports wait in the outbox.
        self.actions.retain(|action| !action.is_for_session());
        self.actions
            .push_back(Action::CloseSession { linger_until: None });
        if self.drain.is_some() {
            warn!("lost the head while draining; leaving");
            self.leave(now, "node shutting down", false);
        } else if registered {
            warn!("lost the head; reconnecting");
            self.backoff.reset();
            self.phase = Phase::Connecting;
            self.actions.push_back(Action::Connect);
        } else {
            // Not registered (the head could not persist it, or went away at
            // once): wait, so a failing head is not hammered.
            let delay = self.backoff.next_delay();
            warn!(retry_in = ?delay, "the session ended before the head registered this node");
            self.phase = Phase::Waiting { until: now + delay };
        }
    }

    /// A command from the head.
    pub(crate) fn handle_command(&mut self, now: Instant, command: HeadCommand) {
        if !matches!(self.phase, Phase::Session(_)) {
            return;
        }
        match command {
            HeadCommand::Registered {
                heartbeat_interval_ms,
            } => self.handle_registered(heartbeat_interval_ms),
            HeadCommand::Ack { upto } => self.handle_ack(now, upto),
            HeadCommand::Launch(launch) => self.handle_launch(*launch),
            HeadCommand::Kill {
                trial,
                attempt,
                reason,
                grace_ms,
            } => self.handle_kill(trial, attempt, &reason, grace_ms),
            HeadCommand::Reconnect { reason } => {
                warn!(%reason, "the head asked this node to register again");
                self.handle_disconnected(now);
            }
            HeadCommand::ReadLogs {
                request_id,
                key,
                offset,
                max_bytes,
            } => self.actions.push_back(Action::ReadLogs {
                request_id,
                key,
                offset,
                max_bytes,
                complete: !self.workers.contains_key(&key),
            }),
            command => self.handle_store_order(command),
        }
    }

    /// The head registered this node; `heartbeat_interval_ms` is the period it
    /// asks for (bounded to 100 ms to 60 s).
    fn handle_registered(&mut self, heartbeat_interval_ms: u64) {
        if let Phase::Session(session) = &mut self.phase {
            session.registered = true;
        }
        self.heartbeat = Duration::from_millis(heartbeat_interval_ms.clamp(100, 60_000));
        debug!(heartbeat = ?self.heartbeat, "registered");
    }

    /// The head stored every report up to `upto`.
    fn handle_ack(&mut self, now: Instant, upto: u64) {
        self.outbox.ack(upto);
        self.check_drained(now);
    }

    /// The head's retention orders for the object store and its rules for the
    /// object server, carried out as they come.
    fn handle_store_order(&mut self, command: HeadCommand) {
        let action = match command {
            HeadCommand::Replicate {
                trial,
                objects,
                sources,
                path,
            } => Action::Replicate {
                trial,
                objects,
                sources,
                path,
            },
            HeadCommand::Pin { trial, objects } => Action::Pin { trial, objects },
            HeadCommand::DropObjects { trial, objects } => Action::DropObjects { trial, objects },
            HeadCommand::ReleaseDriver { session } => Action::ReleaseOwner(Owner::Driver(session)),
            HeadCommand::ReleaseTrial { trial } => Action::ReleaseOwner(Owner::Trial(trial)),
            HeadCommand::ObjectRules(rules) => Action::ObjectRules(rules),
            HeadCommand::RevokeCapabilities(entries) => Action::RevokeCapabilities(entries),
            HeadCommand::RenewCapabilities(capabilities) => Action::RenewCapabilities(capabilities),
            other => {
                debug!(?other, "not an order for the object store");
                return;
            }
        };
        self.actions.push_back(action);
    }

    /// A message another task has for the head (a failed replication, a
    /// telemetry sample): sent as it is while a session is open.
    pub(crate) fn handle_message_for_head(&mut self, message: NodeMessage) {
        if matches!(self.phase, Phase::Session(_)) {
            self.actions.push_back(Action::Send(message));
        }
    }

    /// Objects this node added or dropped (at most [`MAX_OBJECT_CHANGES`]),
    /// told to the head in one message.
    pub(crate) fn handle_object_changes(&mut self, changes: Vec<ObjectChange>) {
        if !matches!(self.phase, Phase::Session(_)) {
            return;
        }
        let (mut added, mut dropped) = (Vec::new(), Vec::new());
        for change in changes {
            match change {
                ObjectChange::Added(id) => added.push(id),
                ObjectChange::Dropped(id) => dropped.push(id),
            }
        }
        self.actions
            .push_back(Action::Send(NodeMessage::Objects { added, dropped }));
    }
}
