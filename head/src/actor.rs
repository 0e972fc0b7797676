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

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use ractor::{Actor, ActorProcessingErr, ActorRef, RpcReplyPort};
use tokio::sync::watch;
use tracing::{debug, error, info, warn};
use xp_runtime::clock::{Clock, UnixMillis};
use xp_runtime::ids::{ExperimentId, NodeId, TrialId};
use xp_runtime::protocol::{
    ErrorCode, HeadCommand, MetricPoint, NodeMessage, NodeRegistration, NodeStatus, QueueStatus,
    RemoteError, Response, TrialStatus,
};

use xp_head_core::auth::Visibility;
use xp_head_core::pages::{
    self, ExperimentCursor, ExperimentSummary, MetricCursor, NodeCursor, Page, PageError,
    QueueCursor, TrialQuery,
};
use xp_runtime::join::JoinString;

use crate::health::{Health, LOG_INTERVAL_MS, LogThrottle, Outage};
use crate::metrics::HeadMetrics;
use crate::registry::{Registry, RegistryError};
use crate::sessions::{Sessions, send_to_node};
use xp_head_core::auth::access::{Access, Authorized, Caller};
use xp_head_core::auth::users::{self, UserAnswer, UserCommand, Users};
use xp_head_core::metrics::MetricsSnapshot;
use xp_head_core::requests;
use xp_head_core::{HeadCore, LoadedState};

mod alerts;
mod auth;
mod client;
mod dashboard;

pub(crate) use self::alerts::AlertMsg;
pub(crate) use self::auth::fresh_secret;
pub(crate) use self::client::{Answer, Asked};
pub(crate) use self::dashboard::DashboardQuery;
mod batch;
mod report;

/// How often the actor checks node heartbeats.
const TICK: Duration = Duration::from_millis(250);

/// A reply port carrying a wire-ready result.
pub(crate) type Reply<T> = RpcReplyPort<Result<T, RemoteError>>;

/// How long a call to the actor may take before the caller gives up.
const CALL_TIMEOUT: Duration = Duration::from_secs(30);

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
    /// The HTTP API reads one pipeline or lists them.
    Pipelines {
        /// One pipeline; every one the caller sees when absent.
        pipeline: Option<u64>,
        /// Which teams' pipelines the caller sees.
        visibility: Visibility,
        /// The pipelines.
        reply: Reply<Vec<xp_runtime::protocol::PipelineStatus>>,
    },
    /// The HTTP API lists the leases, pending approvals and conflict odds.
    Leases {
        /// The teams whose trials the caller sees.
        visibility: Visibility,
        /// The report.
        reply: Reply<Response>,
    },
    /// A driver that stored objects went away.
    DriverGone(String),
    /// A node registered on a new session (its session id).
    NodeRegistered(NodeRegistration, u64, Reply<()>),
    /// Messages that arrived on a node's session (its session id), in order;
    /// answered once they are stored.
    FromNode(NodeId, u64, Vec<NodeMessage>, Reply<()>),
    /// A node's session ended.
    NodeDisconnected(NodeId, u64),
    /// The HTTP API asks for a page of experiment summaries, newest first.
    ExperimentsPage {
        /// Items wanted.
        limit: usize,
        /// Where the listing continues.
        cursor: Option<ExperimentCursor>,
        /// Which teams the caller may see.
        visibility: Visibility,
        /// The page.
        reply: Reply<Page<ExperimentSummary>>,
    },
    /// The HTTP API asks for one experiment's summary.
    ExperimentSummary {
        /// The experiment.
        experiment: ExperimentId,
        /// Which teams the caller may see.
        visibility: Visibility,
        /// The summary.
        reply: Reply<Result<ExperimentSummary, PageError>>,
    },
    /// The HTTP API asks for a page of an experiment's trials.
    TrialsPage {
        /// The experiment.
        experiment: ExperimentId,
        /// Which trials, in what order, from where.
        query: TrialQuery,
        /// Which teams the caller may see.
        visibility: Visibility,
        /// The page.
        reply: Reply<Result<Page<TrialStatus>, PageError>>,
    },
    /// The HTTP API asks for a page of a trial's metric history.
    MetricsPage {
        /// The trial.
        trial: TrialId,
        /// Items wanted.
        limit: usize,
        /// Where the listing continues.
        cursor: Option<MetricCursor>,
        /// Which teams the caller may see.
        visibility: Visibility,
        /// The page.
        reply: Reply<Result<Page<MetricPoint>, PageError>>,
    },
    /// The HTTP API asks for a page of nodes.
    NodesPage {
        /// Items wanted.
        limit: usize,
        /// Where the listing continues.
        cursor: Option<NodeCursor>,
        /// The page.
        reply: Reply<Page<NodeStatus>>,
    },
    /// The HTTP API asks for a page of queues.
    QueuesPage {
        /// Items wanted.
        limit: usize,
        /// Where the listing continues.
        cursor: Option<QueueCursor>,
        /// Which teams the caller may see.
        visibility: Visibility,
        /// The page.
        reply: Reply<Page<QueueStatus>>,
    },
    /// Which user holds the secret with this hash (at a connection's hello).
    Identify([u8; 32], Reply<String>),
    /// May this caller make this request? Answers who they are now (refusals
    /// and audited actions are written to the audit trail first).
    Authorize(Caller, Access, Reply<Authorized>),
    /// A command on the user table, from the head machine's socket.
    Users(UserCommand, Reply<UserAnswer>),
    /// `GET /api/report`, for a caller who sees `visible`.
    Report {
        /// The scope and window.
        request: xp_runtime::protocol::ReportRequest,
        /// The teams the caller sees.
        visible: Visibility,
        /// The report.
        reply: Reply<Response>,
    },
    /// `/metrics` asks for the state its gauges show.
    MetricsSnapshot(Reply<MetricsSnapshot>),
    /// The web dashboard asks for what the API's pages do not hold
    /// (`http::dashboard::api`), answered from `dashboard`.
    Dashboard {
        /// What.
        query: DashboardQuery,
        /// Which teams the caller may see.
        visibility: Visibility,
        /// The answer, as the dashboard's JSON.
        reply: Reply<Result<serde_json::Value, PageError>>,
    },
    /// A trial's telemetry, per rank (QUIC callers are authorized before and
    /// see every team).
    Telemetry {
        /// The trial.
        trial: TrialId,
        /// Which teams the caller may see.
        visibility: Visibility,
        /// The series.
        reply: Reply<Result<xp_runtime::protocol::TrialTelemetry, PageError>>,
    },
    /// Commit the changes applied since the last commit (sent by the actor to
    /// itself with the first of them).
    Flush,
    /// Time passed.
    Tick,
    /// Alerts: listings and webhook outcomes (`alerts`).
    Alert(AlertMsg),
}

impl HeadMsg {
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
}

impl HeadState {
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
        let committed = tokio::task::block_in_place(|| self.args.registry.commit(records));
        if let Err(commit_error) = committed {
            return Err(self.commit_failed(now, commit_error));
        }
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

    /// A page of a trial's metric history, read from the registry; the trial
    /// must be one the caller may see.
    fn metrics_page(
        &self,
        trial: TrialId,
        limit: usize,
        cursor: Option<MetricCursor>,
        visibility: &Visibility,
    ) -> Result<Result<Page<MetricPoint>, PageError>, RemoteError> {
        if let Err(error) = self
            .args
            .core
            .check_trial_visible(trial, &|team| visibility.shows(team))
        {
            return Ok(Err(error));
        }
        let limit = limit.clamp(1, pages::MAX_LIMIT);
        let after = cursor.map(|MetricCursor(seq)| seq);
        let page = tokio::task::block_in_place(|| {
            self.args
                .registry
                .metrics_page(trial, after, limit, pages::MAX_PAGE_BYTES)
        })
        .map_err(|error| client::stored_read_error(error, "metric history"))?;
        let next_cursor = page
            .more
            .then(|| {
                page.records
                    .last()
                    .map(|(seq, _)| MetricCursor(*seq).encode())
            })
            .flatten();
        Ok(Ok(Page {
            items: page
                .records
                .into_iter()
                .map(|(_, record)| MetricPoint::from(record))
                .collect(),
            next_cursor,
            total: page.total,
        }))
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
        let now = state.args.clock.now();
        if !message.joins_batch() && !state.pending.is_empty() {
            // Nothing is shown or acted on before what was applied is stored.
            state.commit_batch(now);
        }
        let myself = &myself;
        match message {
            HeadMsg::Flush => {
                state.flush_scheduled = false;
                if !state.pending.is_empty() {
                    state.commit_batch(now);
                }
            }
            HeadMsg::Telemetry {
                trial,
                visibility,
                reply,
            } => {
                let _ = reply.send(state.telemetry(trial, &visibility));
            }
            HeadMsg::Request(asked) => state.serve_request(now, myself, asked),
            HeadMsg::Pipelines {
                pipeline,
                visibility,
                reply,
            } => {
                let result = state
                    .args
                    .core
                    .pipelines_status(now, pipeline, &|team| visibility.shows(team))
                    .map_err(RemoteError::from);
                let _ = reply.send(result);
            }
            HeadMsg::Leases { visibility, reply } => {
                let report = state.args.core.lease_report(&|team| visibility.shows(team));
                let _ = reply.send(Ok(Response::Leases(report)));
            }
            HeadMsg::ExperimentsPage {
                limit,
                cursor,
                visibility,
                reply,
            } => {
                let page = state
                    .args
                    .core
                    .experiments_page(limit, cursor, &|team| visibility.shows(team));
                let _ = reply.send(Ok(page));
            }
            HeadMsg::ExperimentSummary {
                experiment,
                visibility,
                reply,
            } => {
                let summary = state
                    .args
                    .core
                    .experiment_summary_of(experiment, &|team| visibility.shows(team));
                let _ = reply.send(Ok(summary));
            }
            HeadMsg::TrialsPage {
                experiment,
                query,
                visibility,
                reply,
            } => {
                let page = state
                    .args
                    .core
                    .trials_page(experiment, &query, &|team| visibility.shows(team));
                let _ = reply.send(Ok(page));
            }
            HeadMsg::MetricsPage {
                trial,
                limit,
                cursor,
                visibility,
                reply,
            } => {
                let _ = reply.send(state.metrics_page(trial, limit, cursor, &visibility));
            }
            HeadMsg::Dashboard {
                query,
                visibility,
                reply,
            } => {
                let now = state.args.clock.now();
                // Curves read a bounded sample of the metric history from redb.
                let answer = tokio::task::block_in_place(|| {
                    dashboard::answer(
                        &state.args.core,
                        &state.args.registry,
                        now,
                        query,
                        &visibility,
                    )
                });
                let _ = reply.send(Ok(answer));
            }
            HeadMsg::NodesPage {
                limit,
                cursor,
                reply,
            } => {
                let _ = reply.send(Ok(state.args.core.nodes_page(limit, cursor)));
            }
            HeadMsg::QueuesPage {
                limit,
                cursor,
                visibility,
                reply,
            } => {
                let page = state
                    .args
                    .core
                    .queues_page(limit, cursor.as_ref(), &|team| visibility.shows(team));
                let _ = reply.send(Ok(page));
            }
            HeadMsg::DriverGone(session) => {
                // Soft state and commands only: nothing to store, so also during an outage.
                state.args.core.release_driver_objects(&session);
                let _ = state.flush(now);
            }
            HeadMsg::NodeRegistered(registration, session_id, reply) => {
                let node_id = registration.node_id;
                state.handle_node(
                    now,
                    myself,
                    node_id,
                    session_id,
                    1,
                    |state| state.core_call(|core| core.handle_node_register(now, registration)),
                    reply,
                );
            }
            HeadMsg::FromNode(node_id, session_id, messages, reply) => {
                state.handle_node_messages(now, myself, node_id, session_id, messages, reply);
            }
            HeadMsg::NodeDisconnected(node_id, session_id) => {
                let current = state
                    .args
                    .sessions
                    .remove_if(&node_id, |_, session| session.session_id == session_id)
                    .is_some();
                // The end of the node's current session: a draining node has left.
                if current && state.outage.is_none() {
                    state.core_call(|core| core.handle_node_left(now, node_id));
                    let _ = state.flush(now);
                }
            }
            HeadMsg::Identify(hash, reply) => {
                let result = match state.args.users.identify(&hash) {
                    Ok(user) => Ok(user.name.clone()),
                    Err(users::Unknown::Revoked) => Err(RemoteError::new(
                        ErrorCode::BadToken,
                        "this credential was revoked; ask an admin for a new one (`xp-head user add --replace`)",
                    )),
                    Err(users::Unknown::NoSuchSecret) => Err(RemoteError::new(
                        ErrorCode::BadToken,
                        "wrong token: the credential's token is not known to this cluster",
                    )),
                };
                let _ = reply.send(result);
            }
            HeadMsg::Authorize(caller, access, reply) => {
                let _ = reply.send(state.authorize(now, &caller, &access));
            }
            HeadMsg::Users(command, reply) => {
                let _ = reply.send(state.user_command(now, command));
            }
            HeadMsg::Report {
                request,
                visible,
                reply,
            } => {
                let _ = reply.send(state.report_cached(now, &request, &visible));
            }
            HeadMsg::MetricsSnapshot(reply) => {
                let _ = reply.send(Ok(state.args.core.metrics_snapshot()));
            }
            HeadMsg::Alert(message) => state.handle_alert_message(now, message),
            HeadMsg::Tick => {
                if state.outage.is_some() {
                    state.try_recover(now);
                } else {
                    state.core_call(|core| core.handle_tick(now));
                    let _ = state.flush(now);
                }
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests;
