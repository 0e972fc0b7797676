//! The actor's group commit: changes are applied as they arrive and answered
//! together once one commit has stored them (see the module above), and node
//! messages, with telemetry's series read back from the registry first.

use ractor::ActorRef;
use tracing::debug;
use xp_runtime::clock::UnixMillis;
use xp_runtime::ids::NodeId;
use xp_runtime::protocol::{ErrorCode, NodeMessage, NodeRegistration, NodeTelemetry, RemoteError};

use super::{HeadMsg, HeadState, Pending, Reply};
use xp_head_core::HeadCore;

impl HeadState {
    /// Commits everything applied since the last commit (and sends what it
    /// produced), then answers each waiting change with the outcome.
    pub(super) fn commit_batch(&mut self, now: UnixMillis) {
        let flushed = self.flush(now);
        for done in std::mem::take(&mut self.pending) {
            done(flushed.clone());
        }
    }

    /// Holds a change's answer for the group commit: commits now when the batch
    /// is full, else makes sure a `Flush` follows in the mailbox.
    fn defer(&mut self, now: UnixMillis, myself: &ActorRef<HeadMsg>, done: Pending) {
        self.pending.push(done);
        if self.pending.len() >= self.args.commit_batch.max(1) {
            self.commit_batch(now);
        } else if !self.flush_scheduled {
            self.flush_scheduled = myself.cast(HeadMsg::Flush).is_ok();
            if !self.flush_scheduled {
                // The mailbox is closing: commit now rather than never.
                self.commit_batch(now);
            }
        }
    }

    /// Applies a change to the core and answers once it is stored (with its
    /// batch); during an outage the change is refused without touching the core.
    pub(super) fn change<T: Send + 'static, E: Into<RemoteError>>(
        &mut self,
        now: UnixMillis,
        myself: &ActorRef<HeadMsg>,
        reply: Reply<T>,
        apply: impl FnOnce(&mut HeadCore) -> Result<T, E>,
    ) {
        if let Some(refusal) = self.refusal(now) {
            let _ = reply.send(Err(refusal));
            return;
        }
        let result = self.core_call(apply).map_err(Into::into);
        self.defer(
            now,
            myself,
            Box::new(move |flushed| {
                let _ = reply.send(flushed.and(result));
            }),
        );
    }

    /// Runs one call into the core. The core takes no clock, so a call that ran
    /// a policy decision is timed here, around it, for `/metrics`.
    pub(super) fn core_call<T>(&mut self, call: impl FnOnce(&mut HeadCore) -> T) -> T {
        let before = self.args.core.decisions_made();
        #[expect(
            clippy::disallowed_methods,
            reason = "times the call for /metrics; never an input to a decision"
        )]
        let started = std::time::Instant::now();
        let result = call(&mut self.args.core);
        if self.args.core.decisions_made() != before {
            self.args.metrics.decision_took(started.elapsed());
        }
        result
    }

    /// A node registered on a new session.
    pub(super) fn node_registered(
        &mut self,
        now: UnixMillis,
        myself: &ActorRef<HeadMsg>,
        registration: NodeRegistration,
        session_id: u64,
        reply: Reply<()>,
    ) {
        let node_id = registration.node_id;
        let apply =
            |state: &mut Self| state.core_call(|core| core.handle_node_register(now, registration));
        self.handle_node(now, myself, node_id, session_id, 1, apply, reply);
    }

    /// A node's session ended: when it was the node's current one and the node
    /// was draining, the node has left.
    pub(super) fn node_disconnected(&mut self, now: UnixMillis, node_id: NodeId, session_id: u64) {
        let current = self
            .args
            .sessions
            .remove_if(&node_id, |_, session| session.session_id == session_id)
            .is_some();
        if current && self.outage.is_none() {
            self.core_call(|core| core.handle_node_left(now, node_id));
            let _ = self.flush(now);
        }
    }

    /// Handles a node's registration or messages; deferred during an outage.
    /// A telemetry message whose series cannot be read back first is dropped.
    pub(super) fn handle_node_messages(
        &mut self,
        now: UnixMillis,
        myself: &ActorRef<HeadMsg>,
        node_id: NodeId,
        session_id: u64,
        messages: Vec<NodeMessage>,
        reply: Reply<()>,
    ) {
        let count = messages.len() as u64;
        let apply = |state: &mut Self| {
            for message in messages {
                if let NodeMessage::Telemetry(telemetry) = &message
                    && !state.read_back_series(now, node_id, telemetry)
                {
                    continue;
                }
                if state.outage.is_some() || !state.is_current_session(node_id, session_id) {
                    // A commit for the series read-back failed: what is left comes again.
                    break;
                }
                if let NodeMessage::Report { seq, .. } = &message {
                    let ack = state.acks.entry(node_id).or_default();
                    *ack = (*ack).max(*seq);
                }
                state.core_call(|core| core.handle_node_message(now, node_id, message));
            }
        };
        self.handle_node(now, myself, node_id, session_id, count, apply, reply);
    }

    /// Hands the core the stored series `telemetry` adds to that it does not
    /// hold, committing first so that the registry holds everything applied;
    /// false when they cannot be read (the message is then dropped: telemetry
    /// is best effort, and a series started afresh would overwrite the stored one).
    fn read_back_series(
        &mut self,
        now: UnixMillis,
        node_id: NodeId,
        telemetry: &NodeTelemetry,
    ) -> bool {
        let needed = self.args.core.telemetry_series_needed(node_id, telemetry);
        if needed.is_empty() {
            return true;
        }
        self.commit_batch(now);
        if self.outage.is_some() {
            return false;
        }
        for (trial, rank) in needed {
            let read =
                tokio::task::block_in_place(|| self.args.registry.telemetry_series(trial, rank));
            match read {
                Ok(windows) => self
                    .args
                    .core
                    .restore_telemetry_series(trial, rank, windows),
                Err(error) => {
                    debug!(%error, %trial, rank, "telemetry series not readable; sample dropped");
                    return false;
                }
            }
        }
        true
    }

    /// Handles a node's registration or messages (`count` of them); deferred
    /// during an outage.
    #[expect(
        clippy::too_many_arguments,
        reason = "the actor's context and one node call"
    )]
    pub(super) fn handle_node(
        &mut self,
        now: UnixMillis,
        myself: &ActorRef<HeadMsg>,
        node_id: NodeId,
        session_id: u64,
        count: u64,
        apply: impl FnOnce(&mut Self),
        reply: Reply<()>,
    ) {
        if !self.is_current_session(node_id, session_id) {
            let _ = reply.send(Err(RemoteError::new(
                ErrorCode::Unavailable,
                "this node session was replaced or ended by the head; register again",
            )));
            return;
        }
        if let Some(outage) = self.outage.as_mut() {
            // Neither applied nor acknowledged: the node sends it again when the
            // head asks it to register after the outage.
            outage.deferred += count;
            self.log_outage(now);
            let _ = reply.send(Ok(()));
            return;
        }
        apply(self);
        // Answered (for the session's back-pressure) once its batch is
        // committed; a failed commit leaves its reports unacknowledged, and the
        // node resends them.
        self.defer(
            now,
            myself,
            Box::new(move |_| {
                let _ = reply.send(Ok(()));
            }),
        );
    }
}
