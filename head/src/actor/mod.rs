//! The head actor: the one owner of [`HeadCore`] and the [`Registry`].
//!
//! Every request and node report becomes a message; the actor feeds it to the
//! core, commits the records the core produced, and only then replies, sends
//! node commands and acknowledges node reports.
//!
//! Invariant: the core never shows or acts on more than the registry holds. When
//! a commit fails, the change is answered with an error, the commands and
//! acknowledgements it produced are dropped, and the core is rebuilt from the
//! committed records ([`Registry::committed`]), as after a restart; the node
//! reports it carried stay unacknowledged on their nodes and come again.
//!
//! A failed write closes the database (a full disk): the head is then in an
//! [`Outage`]. It refuses every change with [`ErrorCode::StorageUnavailable`],
//! answers reads from the rebuilt core, defers node messages (accepts them but
//! neither applies nor acknowledges them), reports itself unhealthy, and probes
//! for room every second. Once the database opens again the core is rebuilt from
//! it, metric history included, and every node is asked to register again, which
//! makes it resend what was not acknowledged: each such report is applied once.
//!
//! Group commit: changes (submissions, cancels, admin actions, node messages)
//! are applied to the core as they arrive, but their answers wait in `pending`
//! until one commit stores everything applied since the last: at the first
//! message of any other kind (reads, ticks: so nothing is shown or acted on
//! before it is stored), when `commit_batch` changes wait, or when the actor
//! reaches the `Flush` it sent itself with the first of them (so a batch is
//! whatever arrived while the previous commit ran). A failed commit answers
//! every change of its batch with the error and acknowledges none of its node
//! reports. Node sessions gather what a node sends while its last batch commits
//! into one message (`server`). `commit_batch` 1 is one commit per change, for
//! `xp bench trials`' comparison.
//!
//! A client's request or read whose caller gave up before the actor reached
//! it (an HTTP request past its timeout, a closed QUIC stream) is skipped,
//! not served: a burst of abandoned requests costs the actor nothing.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use ractor::{Actor, ActorProcessingErr, ActorRef, RpcReplyPort};
use tokio::sync::watch;
use tracing::{debug, error, info, warn};
use xp_runtime::clock::{Clock, UnixMillis};
use xp_runtime::ids::NodeId;
use xp_runtime::protocol::{ErrorCode, HeadCommand, NodeMessage, NodeRegistration, RemoteError};

use xp_runtime::join::JoinString;

use crate::health::{Health, LOG_INTERVAL_MS, LogThrottle, Outage};
use crate::metrics::HeadMetrics;
use crate::registry::{Registry, RegistryError};
use crate::sessions::{Sessions, send_to_node};
use xp_head_core::auth::access::{Access, Authorized, Caller};
use xp_head_core::auth::users::{UserAnswer, UserCommand, Users};
use xp_head_core::requests;
use xp_head_core::{HeadCore, LoadedState};

mod alerts;
mod auth;
mod blocking;
mod client;
mod dashboard;
mod history;
mod reads;

pub(crate) use self::alerts::AlertMsg;
pub(crate) use self::auth::fresh_secret;
pub(crate) use self::client::{Answer, Asked};
pub(crate) use self::dashboard::DashboardQuery;
pub(crate) use self::reads::Read;
mod batch;
mod report;

/// How often the actor checks node heartbeats.
const TICK: Duration = Duration::from_millis(250);
/// Ticks further apart than this mean the head itself did not run (stopped,
/// starved of CPU, or the actor busy): it could not hear its nodes meanwhile,
/// so their silence is judged afresh (`HeadCore::handle_head_paused`).
const HEAD_PAUSE_MS: u64 = 1_000;

/// A reply port carrying a wire-ready result.
pub(crate) type Reply<T> = RpcReplyPort<Result<T, RemoteError>>;

/// How long a call to the actor may take before the caller gives up.
const CALL_TIMEOUT: Duration = Duration::from_secs(30);
/// The most status answers made off the actor at once.
const MAX_STATUSES_MADE: usize = 2;

/// Calls the head actor and flattens the two error layers.
pub(crate) async fn call<T: Send + 'static>(
    head: &ActorRef<HeadMsg>,
    build: impl FnOnce(Reply<T>) -> HeadMsg,
) -> Result<T, RemoteError> {
    match head.call(build, Some(CALL_TIMEOUT)).await {
        Ok(ractor::rpc::CallResult::Success(result)) => result,
        Ok(_) => Err(RemoteError::new(
            ErrorCode::Unavailable,
            "the head is busy or shutting down; try again",
        )),
        Err(error) => Err(RemoteError::new(
            ErrorCode::Unavailable,
            format!("the head is shutting down: {error}"),
        )),
    }
}

/// The head actor's messages.
#[derive(Debug)]
pub(crate) enum HeadMsg {
    /// A client's request, to authorize and serve (see `requests`).
    Request(Asked),
    /// A driver that stored objects went away.
    DriverGone(String),
    /// A node registered on a new session (its session id).
    NodeRegistered(NodeRegistration, u64, Reply<()>),
    /// Messages that arrived on a node's session (its session id), in order;
    /// answered once they are stored.
    FromNode(NodeId, u64, Vec<NodeMessage>, Reply<()>),
    /// A node's session ended.
    NodeDisconnected(NodeId, u64),
    /// Which user holds the secret with this hash (at a connection's hello).
    Identify([u8; 32], Reply<String>),
    /// May this caller make this request? Answers who they are now (refusals
    /// and audited actions are written to the audit trail first).
    Authorize(Caller, Access, Reply<Authorized>),
    /// A command on the user table, from the head machine's socket.
    Users(UserCommand, Reply<UserAnswer>),
    /// Commit the changes applied since the last commit (sent by the actor to
    /// itself with the first of them).
    Flush,
    /// Time passed.
    Tick,
    /// Alerts: listings and webhook outcomes (`alerts`).
    Alert(AlertMsg),
    /// The HTTP API reads (`reads`).
    Read(Read),
    /// A report computed off the actor (`report`).
    ReportComputed(Box<report::ComputedReport>),
}

impl HeadMsg {
    /// Whether the message is a client's request or read whose caller gave
    /// up waiting (a timeout, a closed connection) before the actor reached
    /// it: nobody would see its answer, so it is skipped.
    fn caller_gave_up(&self) -> bool {
        match self {
            Self::Request(asked) => asked.reply.is_closed(),
            Self::Read(read) => read.caller_gave_up(),
            _ => false,
        }
    }

    /// Whether the message is a change that may wait for a group commit; any
    /// other message first commits what waits.
    fn joins_batch(&self) -> bool {
        matches!(
            self,
            Self::Request(Asked { request, .. }) if requests::changes(request)
        ) || matches!(
            self,
            Self::NodeRegistered(..) | Self::FromNode(..) | Self::Flush
        )
    }
}

/// An answer waiting for its batch's commit: called with the commit's outcome.
type Pending = Box<dyn FnOnce(Result<(), RemoteError>) + Send>;

/// The head actor (behaviour only; the state is [`HeadState`]).
#[derive(Debug)]
pub(crate) struct HeadActor;

/// What the head actor starts from.
pub(crate) struct HeadArgs {
    /// The core, restored from the registry.
    pub core: HeadCore,
    /// The registry.
    pub registry: Registry,
    /// Node sessions.
    pub sessions: Sessions,
    /// Published after every commit: the newest event's sequence number.
    pub event_seq: watch::Sender<u64>,
    /// Published whenever it changes: whether the head can store changes.
    pub health: watch::Sender<Health>,
    /// The clock.
    pub clock: Arc<dyn Clock>,
    /// The user table, as stored.
    pub users: Users,
    /// Bumped after every change of the user table, so open connections check
    /// that their user may still connect.
    pub users_changed: watch::Sender<u64>,
    /// The node join string: the address and CA that credentials name.
    pub join: JoinString,
    /// The head's counters, shared with the servers that serve `/metrics`.
    pub metrics: Arc<HeadMetrics>,
    /// Alert webhooks waiting for the delivery task (`crate::webhooks`).
    pub webhooks: Arc<crate::webhooks::WebhookQueue>,
    /// The most changes one commit holds (at least 1; 1 commits each alone).
    pub commit_batch: usize,
    /// Beats at every tick, for `/healthz`.
    pub pulse: crate::health::ActorPulse,
}

/// The head actor's state.
pub(crate) struct HeadState {
    args: HeadArgs,
    acks: BTreeMap<NodeId, u64>,
    /// Set while the database is closed after a failed write.
    outage: Option<Outage>,
    /// Paces the log of commits that failed with the database still open.
    commit_log: LogThrottle,
    /// Answers of changes applied but not yet committed, in order.
    pending: Vec<Pending>,
    /// A `Flush` is in the mailbox.
    flush_scheduled: bool,
    /// Recent reports and the actor time spent computing them (`report`).
    reports: report::ReportCache,
    /// Turns at making status answers off the actor, two at a time
    /// (`client.rs`).
    statuses: blocking::BlockingTurns,
    /// Turns at reading the stored history off the actor (`history`).
    history: blocking::BlockingTurns,
    /// When the last tick was handled.
    last_tick: Option<UnixMillis>,
}

impl HeadState {
    /// The `Flush` the actor sent itself arrived: what waits is committed.
    fn flushed(&mut self, now: UnixMillis) {
        self.flush_scheduled = false;
        if !self.pending.is_empty() {
            self.commit_batch(now);
        }
    }

    /// Time passed: the core judges it, or, during an outage, the database is
    /// probed for room.
    fn tick(&mut self, now: UnixMillis) {
        let since_last = self.last_tick.map(|last| now.saturating_sub(last));
        self.last_tick = Some(now);
        if self.outage.is_some() {
            self.try_recover(now);
            return;
        }
        let core = &mut self.args.core;
        if let Some(paused_ms) = since_last.filter(|gap| *gap > HEAD_PAUSE_MS) {
            core.handle_head_paused(now, paused_ms);
        }
        // Liveness as the sessions read it, however long the actor took to
        // get to their messages.
        for session in self.args.sessions.iter() {
            core.handle_node_heard(now, *session.key(), session.last_heard());
        }
        self.core_call(|core| core.handle_tick(now));
        let _ = self.flush(now);
    }

    /// A driver session that stored objects ended: its capability is revoked
    /// and its objects go. Soft state and commands only: nothing to store, so
    /// also during an outage.
    fn driver_gone(&mut self, now: UnixMillis, session: &str) {
        self.args.core.end_driver_session(now, session);
        let _ = self.flush(now);
    }

    /// Commits what the core produced, then sends commands and acknowledgements.
    fn flush(&mut self, now: UnixMillis) -> Result<(), RemoteError> {
        let records = self.args.core.take_records();
        let mut commands = Vec::new();
        while let Some(command) = self.args.core.poll_command() {
            commands.push(command);
        }
        // Counted only once stored: a failed commit drops the change, and a
        // node resends its reports.
        let tally = self.args.core.take_tally();
        let alert_outputs = self.take_alert_outputs();
        let stored = records.len();
        let committed = tokio::task::block_in_place(|| self.args.registry.commit(records));
        if let Err(commit_error) = committed {
            return Err(self.commit_failed(now, commit_error));
        }
        self.args.metrics.committed(stored);
        self.args.metrics.observe(&tally);
        self.dispatch_alerts(now, alert_outputs);
        for (node_id, command) in commands {
            send_to_node(&self.args.sessions, node_id, command);
        }
        for (node_id, upto) in std::mem::take(&mut self.acks) {
            send_to_node(&self.args.sessions, node_id, HeadCommand::Ack { upto });
        }
        self.publish_event_seq();
        Ok(())
    }

    /// The answer to a change during an outage, counted and logged with back-off.
    fn refusal(&mut self, now: UnixMillis) -> Option<RemoteError> {
        let outage = self.outage.as_mut()?;
        outage.refused += 1;
        let refusal = outage.refusal();
        debug!(error = %refusal.message, "change refused");
        self.log_outage(now);
        Some(refusal)
    }

    /// Says that the outage goes on, at most once per [`LOG_INTERVAL_MS`].
    fn log_outage(&mut self, now: UnixMillis) {
        if let Some(outage) = self.outage.as_mut()
            && outage.log.admit(now).is_some()
        {
            warn!(
                reason = %outage.reason(),
                for_ms = now.saturating_sub(outage.since),
                refused = outage.refused,
                deferred = outage.deferred,
                probes = outage.probes,
                "the head still cannot store anything: changes refused, node reports deferred"
            );
        }
    }

    /// Whether `session_id` is the node's current session: messages from an
    /// ended or replaced one are refused (the node resends them on its new one).
    fn is_current_session(&self, node_id: NodeId, session_id: u64) -> bool {
        self.args
            .sessions
            .get(&node_id)
            .is_some_and(|session| session.session_id == session_id)
    }

    /// A commit failed: the core is ahead of the disk. Drops what it produced,
    /// rebuilds the core from the committed records, and either asks nodes to
    /// resend (the database still works) or begins an outage (it was closed).
    fn commit_failed(&mut self, now: UnixMillis, commit_error: RegistryError) -> RemoteError {
        self.acks.clear();
        let committed = self.args.registry.committed();
        self.replace_core(committed, now);
        if self.args.registry.is_open() {
            // Only a record that cannot be encoded fails a commit this way.
            if let Some(left_out) = self.commit_log.admit(now) {
                error!(error = %commit_error, left_out, "a change could not be stored and was dropped; the head's state was rebuilt from its registry");
            }
            if let Err(replay_error) = self.replay_metrics() {
                warn!(error = %replay_error, "cannot read metric history back; stopping rules start without it");
            }
            self.reconnect_nodes("the head dropped a change it could not store");
            return RemoteError::new(
                ErrorCode::Internal,
                format!("the head could not store this change: {commit_error}"),
            );
        }
        if let Some(outage) = &self.outage {
            // Already in an outage (the database was closed): the cause stays the first one.
            return outage.refusal();
        }
        let outage = Outage::new(now, &commit_error);
        error!(
            reason = %outage.reason(),
            "the head cannot store anything: refusing changes and serving what is stored until its database opens again"
        );
        let refusal = outage.refusal();
        self.args.health.send_replace(outage.health());
        self.outage = Some(outage);
        refusal
    }

    /// During an outage, probes for room and re-opens the database when there is:
    /// the core is rebuilt from it and every node registers again.
    fn try_recover(&mut self, now: UnixMillis) {
        let Some(outage) = self.outage.as_mut() else {
            return;
        };
        if !outage.probe_due(now) {
            return;
        }
        let reopened = tokio::task::block_in_place(|| self.args.registry.reopen());
        let loaded = match reopened {
            Ok(loaded) => loaded,
            Err(reopen_error) => {
                debug!(error = %reopen_error, "the database cannot be re-opened yet");
                outage.probe_failed(now, &reopen_error);
                self.log_outage(now);
                return;
            }
        };
        self.replace_core(loaded, now);
        if let Err(replay_error) = self.replay_metrics() {
            // A read failing right after the re-open: treat it as one more failed probe.
            self.args.registry.close();
            if let Some(outage) = self.outage.as_mut() {
                outage.probe_failed(now, &replay_error);
            }
            self.log_outage(now);
            return;
        }
        self.args.core.begin_restart_grace(self.args.clock.now());
        let outage = self.outage.take().expect("checked above");
        info!(
            down_ms = now.saturating_sub(outage.since),
            refused = outage.refused,
            deferred = outage.deferred,
            "the head can store again: database re-opened and state rebuilt from it; nodes register again"
        );
        self.reconnect_nodes("the head re-opened its database after a storage failure");
        self.args.health.send_replace(Health::Healthy);
    }

    /// Replaces the core with one rebuilt from `loaded` at `now`.
    fn replace_core(&mut self, loaded: LoadedState, now: UnixMillis) {
        self.args.core = self.args.core.rebuild(loaded, now);
        self.publish_event_seq();
    }

    /// Feeds the stopping rules the metric history the core asks for.
    fn replay_metrics(&mut self) -> Result<(), RegistryError> {
        tokio::task::block_in_place(|| replay_metrics(&mut self.args.core, &self.args.registry))
    }

    /// Ends every node session with a request to register again: what a node
    /// did not have acknowledged comes again, to the rebuilt core, and its
    /// workers and objects are reconciled from its registration.
    fn reconnect_nodes(&self, reason: &str) {
        self.args.sessions.retain(|_, session| {
            let _ = session.commands.send(HeadCommand::Reconnect {
                reason: reason.to_owned(),
            });
            false
        });
    }

    fn publish_event_seq(&self) {
        self.args
            .event_seq
            .send_replace(self.args.core.last_event_seq());
    }
}

/// Feeds `core`'s stopping rules the metric history of its unfinished trials.
pub(crate) fn replay_metrics(
    core: &mut HeadCore,
    registry: &Registry,
) -> Result<(), RegistryError> {
    let mut history = Vec::new();
    for trial in core.trials_needing_metric_replay() {
        history.extend(registry.metrics_of(trial)?);
    }
    core.replay_metrics(&history);
    Ok(())
}

impl Actor for HeadActor {
    type Msg = HeadMsg;
    type State = HeadState;
    type Arguments = HeadArgs;

    async fn pre_start(
        &self,
        myself: ActorRef<HeadMsg>,
        args: HeadArgs,
    ) -> Result<HeadState, ActorProcessingErr> {
        myself.send_interval(TICK, || HeadMsg::Tick);
        Ok(HeadState {
            args,
            acks: BTreeMap::new(),
            outage: None,
            commit_log: LogThrottle::new(LOG_INTERVAL_MS),
            pending: Vec::new(),
            flush_scheduled: false,
            reports: report::ReportCache::new(),
            statuses: blocking::BlockingTurns::new(MAX_STATUSES_MADE),
            history: blocking::BlockingTurns::new(history::MAX_READING),
            last_tick: None,
        })
    }

    async fn post_stop(
        &self,
        _myself: ActorRef<HeadMsg>,
        state: &mut HeadState,
    ) -> Result<(), ActorProcessingErr> {
        // Changes applied but not yet committed are stored and answered.
        if !state.pending.is_empty() {
            let now = state.args.clock.now();
            state.commit_batch(now);
        }
        Ok(())
    }

    async fn handle(
        &self,
        myself: ActorRef<HeadMsg>,
        message: HeadMsg,
        state: &mut HeadState,
    ) -> Result<(), ActorProcessingErr> {
        if message.caller_gave_up() {
            state.args.metrics.abandoned();
            return Ok(());
        }
        let now = state.args.clock.now();
        if !message.joins_batch() && !state.pending.is_empty() {
            // Nothing is shown or acted on before what was applied is stored.
            state.commit_batch(now);
        }
        let myself = &myself;
        match message {
            HeadMsg::Request(asked) => state.serve_request(now, myself, asked),
            // Reads are CPU work of up to tens of milliseconds: the worker
            // thread hands its other tasks (QUIC clients, HTTP) to another.
            HeadMsg::Read(read) => {
                tokio::task::block_in_place(|| state.answer_read(now, myself, read))
            }
            HeadMsg::ReportComputed(computed) => state.report_computed(*computed),
            HeadMsg::Flush => state.flushed(now),
            HeadMsg::Tick => {
                state.args.pulse.beat();
                state.tick(now);
            }
            HeadMsg::DriverGone(session) => state.driver_gone(now, &session),
            HeadMsg::NodeRegistered(registration, session_id, reply) => {
                state.node_registered(now, myself, registration, session_id, reply)
            }
            HeadMsg::FromNode(node_id, session_id, messages, reply) => {
                state.handle_node_messages(now, myself, node_id, session_id, messages, reply)
            }
            HeadMsg::NodeDisconnected(node_id, session_id) => {
                state.node_disconnected(now, node_id, session_id)
            }
            HeadMsg::Identify(hash, reply) => drop(reply.send(state.identify(&hash))),
            HeadMsg::Authorize(caller, access, reply) => {
                drop(reply.send(state.authorize(now, &caller, &access)))
            }
            HeadMsg::Users(command, reply) => drop(reply.send(state.user_command(now, command))),
            HeadMsg::Alert(message) => state.handle_alert_message(now, message),
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests;
