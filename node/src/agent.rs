//! The node agent: the async shell around the node's decisions
//! (`node_core::NodeCore`).
//!
//! The agent owns the I/O: the connection to the head, the worker tasks, the
//! object store's tasks and the channels from telemetry and the object server.
//! Its loop performs every action the core hands out, then waits for the next
//! event (SIGTERM, the core's timeout, a connection attempt's outcome, a
//! command from the head, a worker's report, an object change, a message for
//! the head, a telemetry sample, an eviction) and hands it to the core. It
//! decides nothing about workers, sessions or the drain: every such `if` is in
//! the core. Worker processes outlive a lost connection; reports made between
//! sessions wait in the core's outbox.
//!
//! Files: `session.rs` (the connection: registering, writing, reading the
//! head's commands, closing), `launch.rs` (worker tasks: starting, stopping,
//! waiting for them when leaving), `prepare.rs` (one launch before its worker
//! starts), `orders.rs` (the head's orders on the object store and log reads).
//!
//! Not here: running a worker process (`worker`), and taking, backing up or
//! restoring checkpoints (`checkpoint`).
//!
//! Invariant: from SIGTERM to the end of [`Agent::run`] takes at most the drain
//! timeout (the core's `Leave` names the deadline, and the agent waits for
//! worker tasks no longer than that).

mod launch;
mod orders;
mod prepare;
mod session;

use std::collections::{BTreeMap, HashMap};
use std::future::Future;
use std::path::PathBuf;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use quinn::{RecvStream, SendStream};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use tracing::info;
use xp_runtime::clock::{Clock, SystemClock};
use xp_runtime::ids::{NodeId, WorkerKey};
use xp_runtime::join::JoinString;
use xp_runtime::protocol::{
    HeadCommand, NodeMessage, NodeResources, NodeTelemetry, ObjectEndpoint, PeerRole, WorkerReport,
};
use xp_runtime::transport::{self, HeadConnection, TransportError};

use self::launch::RunningWorker;
use self::session::HeadSession;
use crate::checkpoint::OutputLimits;
use crate::isolation::Isolation;
use crate::node_core::{Action, CoreConfig, MAX_OBJECT_CHANGES, NodeCore};
use crate::objects::remote::ObjectFetcher;
use crate::objects::{ObjectChange, ObjectStore};
use crate::telemetry::eviction::Eviction;
use crate::worker_log::LogCap;

/// The node's object store and its links to other nodes.
pub(crate) struct NodeObjects {
    /// The local store.
    pub(crate) store: Arc<ObjectStore>,
    /// Who may fetch and store what through the object server.
    pub(crate) access: Arc<crate::objects::access::ObjectAccess>,
    /// Pulls objects from other nodes.
    pub(crate) fetcher: Arc<ObjectFetcher>,
    /// Where other nodes reach this node's object server.
    pub(crate) endpoint: ObjectEndpoint,
    /// Changes to report (the object server sends copies it found corrupt here).
    pub(crate) changes_tx: mpsc::UnboundedSender<ObjectChange>,
    /// Their receiving end, drained by the session.
    pub(crate) changes_rx: mpsc::UnboundedReceiver<ObjectChange>,
    /// Workers allowed on the local object channel, by secret.
    pub(crate) local_workers: crate::objects::local::Workers,
    /// The current session's head connection, for the local channel's look-ups.
    pub(crate) head: Arc<std::sync::Mutex<Option<HeadConnection>>>,
    /// The local channel's socket (`XP_NODE_SOCKET`).
    pub(crate) socket: PathBuf,
    /// The durable directory checkpoints are also written to.
    pub(crate) backup: Option<PathBuf>,
    /// Messages for the head from the node's tasks (a failed replication); sent
    /// on the current session, or the next one.
    pub(crate) head_messages_tx: mpsc::UnboundedSender<NodeMessage>,
    /// Their receiving end, drained by the session.
    pub(crate) head_messages_rx: mpsc::UnboundedReceiver<NodeMessage>,
}

/// Why the agent stopped for good.
#[derive(Debug, thiserror::Error)]
pub enum AgentError {
    /// The head refused this node's credentials: retrying cannot help.
    #[error("{0}")]
    Refused(TransportError),
}

/// Who this node is and what it offers.
#[derive(Debug, Clone)]
pub(crate) struct NodeIdentity {
    /// Persistent id.
    pub(crate) node_id: NodeId,
    /// Host name.
    pub(crate) name: String,
    /// The host other nodes' workers reach this one at.
    pub(crate) advertise_host: String,
    /// No route to the head was found at start: advertise the local address of
    /// each connection to the head instead of `advertise_host`.
    pub(crate) advertise_from_connection: bool,
    /// Capacity.
    pub(crate) resources: NodeResources,
    /// Labels.
    pub(crate) labels: BTreeMap<String, String>,
}

/// How to run the agent.
pub(crate) struct AgentConfig {
    /// Where the head is and how to trust it.
    pub(crate) join: JoinString,
    /// Who this node is.
    pub(crate) identity: NodeIdentity,
    /// Logs, cached binaries and work directories live under it.
    pub(crate) data_dir: PathBuf,
    /// The most each worker's log keeps on disk.
    pub(crate) log_cap: LogCap,
    /// The most files and bytes rank 0 may leave in `XP_OUTPUT_DIR`.
    pub(crate) output_limits: OutputLimits,
    /// User ids for workers, and what the node registers it enforces.
    pub(crate) isolation: Isolation,
    /// How often telemetry samples; zero for never (and no eviction watch).
    pub(crate) telemetry_interval: Duration,
    /// The most time from SIGTERM to the node's exit.
    pub(crate) drain_timeout: Duration,
    /// Where GPU memory is read instead of NVML (`--gpu-memory-file`).
    pub(crate) gpu_memory_file: Option<PathBuf>,
}

/// A connection attempt under way.
type Connecting = Pin<
    Box<
        dyn Future<Output = Result<(HeadConnection, SendStream, RecvStream), TransportError>>
            + Send,
    >,
>;

/// What the agent's loop waits for; each goes to the core.
enum Event {
    /// SIGTERM or Ctrl-C.
    Shutdown,
    /// The core's timeout is due.
    Timeout,
    /// The connection attempt ended.
    Connected(Result<(HeadConnection, SendStream, RecvStream), TransportError>),
    /// A command from the head; `None` when the session broke.
    Command(Option<HeadCommand>),
    /// A worker task reported.
    Report(WorkerReport),
    /// The object store added or dropped an object.
    ObjectChange(ObjectChange),
    /// Another task has a message for the head (a failed replication).
    ForHead(NodeMessage),
    /// A telemetry sample; `None` once the sampler ended.
    Telemetry(Option<NodeTelemetry>),
    /// The eviction watch chose a worker.
    Eviction(Eviction),
}

/// The agent: the core and everything it acts through.
pub(crate) struct Agent {
    config: AgentConfig,
    core: NodeCore,
    objects: NodeObjects,
    /// The workers started and not yet forgotten.
    workers: HashMap<WorkerKey, RunningWorker>,
    reports_tx: mpsc::UnboundedSender<WorkerReport>,
    reports_rx: mpsc::UnboundedReceiver<WorkerReport>,
    /// The open session, if any.
    session: Option<HeadSession>,
    /// The connection attempt under way, if any.
    connecting: Option<Connecting>,
    /// Why the last connection attempt failed: the agent's error when the
    /// core leaves because the head refused this node.
    last_connect_error: Option<TransportError>,
    /// The workers telemetry samples (each worker task adds itself).
    telemetry_targets: crate::telemetry::Targets,
    /// Samples waiting for the session (a small queue: see `telemetry`).
    telemetry_rx: Option<mpsc::Receiver<NodeTelemetry>>,
    /// Workers the eviction watch chose (sent by telemetry).
    evictions_tx: mpsc::UnboundedSender<Eviction>,
    evictions_rx: mpsc::UnboundedReceiver<Eviction>,
    /// Cancelled when the node begins to drain; workers read it to tell a stop
    /// by the drain from a failure (see `worker::supervise`).
    node_draining: CancellationToken,
}

impl Agent {
    /// An agent as `config` says, with the node's `objects`.
    pub(crate) fn new(config: AgentConfig, objects: NodeObjects) -> Self {
        let (reports_tx, reports_rx) = mpsc::unbounded_channel();
        let (evictions_tx, evictions_rx) = mpsc::unbounded_channel();
        let core = NodeCore::new(CoreConfig {
            node_id: config.identity.node_id,
            drain_timeout: config.drain_timeout,
            memory_watched: !config.telemetry_interval.is_zero(),
        });
        Self {
            config,
            core,
            objects,
            workers: HashMap::new(),
            reports_tx,
            reports_rx,
            session: None,
            connecting: None,
            last_connect_error: None,
            telemetry_targets: crate::telemetry::Targets::default(),
            telemetry_rx: None,
            evictions_tx,
            evictions_rx,
            node_draining: CancellationToken::new(),
        }
    }

    /// Serves the head until `shutdown`, then drains and stops every worker.
    ///
    /// A session that broke after the head registered this node is followed by
    /// an immediate attempt; failed attempts wait a jittered, doubling delay of at
    /// most `NODE_RECONNECT_MAX_BACKOFF`. With the node session's idle timeout, a
    /// node is back within `transport::NODE_RETURN_BOUND` of a restarted head.
    pub(crate) async fn run(mut self, shutdown: CancellationToken) -> Result<(), AgentError> {
        self.node_draining = shutdown.clone();
        // Telemetry samples until the agent ends, whichever way.
        let telemetry_stop = shutdown.child_token();
        let _telemetry_stops = telemetry_stop.clone().drop_guard();
        self.start_telemetry(telemetry_stop);
        loop {
            while let Some(action) = self.core.poll_action() {
                if let Some(ended) = self.perform(action).await {
                    return ended;
                }
            }
            let event = self.next_event(&shutdown).await;
            self.handle_event(event);
        }
    }

    /// Starts the telemetry sampler, unless its interval is zero.
    fn start_telemetry(&mut self, stop: CancellationToken) {
        let interval = self.config.telemetry_interval;
        if interval.is_zero() {
            info!(
                "telemetry off (--telemetry-interval 0), and with it the eviction watch for GPU memory"
            );
            return;
        }
        let (samples, received) = mpsc::channel(crate::telemetry::QUEUE);
        self.telemetry_rx = Some(received);
        xp_runtime::task::spawn(
            "telemetry",
            crate::telemetry::run(
                interval,
                self.telemetry_targets.clone(),
                self.objects.store.clone(),
                samples,
                self.evictions_tx.clone(),
                self.config.gpu_memory_file.clone(),
                stop,
            ),
        );
    }

    /// Waits for the next thing to hand to the core.
    async fn next_event(&mut self, shutdown: &CancellationToken) -> Event {
        let timeout = self.core.poll_timeout().map(tokio::time::Instant::from_std);
        let in_session = self.session.is_some();
        tokio::select! {
            () = shutdown.cancelled(), if !self.core.is_shutting_down() => Event::Shutdown,
            () = sleep_until(timeout) => Event::Timeout,
            connected = connect_outcome(&mut self.connecting) => Event::Connected(connected),
            command = recv_command(&mut self.session) => Event::Command(command),
            Some(report) = self.reports_rx.recv() => Event::Report(report),
            Some(change) = self.objects.changes_rx.recv(), if in_session => Event::ObjectChange(change),
            Some(message) = self.objects.head_messages_rx.recv(), if in_session => Event::ForHead(message),
            sample = recv_sample(&mut self.telemetry_rx), if in_session => Event::Telemetry(sample),
            Some(eviction) = self.evictions_rx.recv() => Event::Eviction(eviction),
        }
    }

    /// Hands `event` to the core (or, for what needs no decision, to the session).
    fn handle_event(&mut self, event: Event) {
        let now = tokio::time::Instant::now().into_std();
        match event {
            Event::Shutdown => self.core.handle_shutdown(now),
            Event::Timeout => self.core.handle_timeout(now),
            Event::Connected(connected) => self.handle_connected(connected),
            Event::Command(Some(command)) => self.core.handle_command(now, command),
            Event::Command(None) => self.core.handle_disconnected(now),
            Event::Report(report) => {
                self.core.handle_report(now, SystemClock.now(), report);
            }
            Event::ObjectChange(change) => self.handle_object_change(change),
            Event::ForHead(message) => self.core.handle_message_for_head(message),
            Event::Telemetry(Some(sample)) => {
                // Best effort: not numbered, not kept for a later session.
                self.core
                    .handle_message_for_head(NodeMessage::Telemetry(sample));
            }
            Event::Telemetry(None) => self.telemetry_rx = None,
            Event::Eviction(eviction) => self.core.handle_eviction(eviction),
        }
    }

    /// A connection attempt ended: open the session, or tell the core why not.
    fn handle_connected(
        &mut self,
        connected: Result<(HeadConnection, SendStream, RecvStream), TransportError>,
    ) {
        self.connecting = None;
        let now = tokio::time::Instant::now().into_std();
        match connected {
            Ok((connection, send, recv)) => {
                info!(head = %format!("{}:{}", self.config.join.host, self.config.join.port), "connected to the head");
                self.open_session(connection, send, recv);
                self.core.handle_connected(now);
            }
            Err(error) => {
                self.core.handle_connect_failed(now, &error);
                self.last_connect_error = Some(error);
            }
        }
    }

    /// An object this node added or dropped, with any others already waiting,
    /// up to one message's worth.
    fn handle_object_change(&mut self, change: ObjectChange) {
        let mut changes = vec![change];
        while changes.len() < MAX_OBJECT_CHANGES {
            let Ok(change) = self.objects.changes_rx.try_recv() else {
                break;
            };
            changes.push(change);
        }
        self.core.handle_object_changes(changes);
    }

    /// Does what the core decided; `Some` once the agent is done.
    async fn perform(&mut self, action: Action) -> Option<Result<(), AgentError>> {
        match action {
            Action::Connect => self.connect(),
            Action::Register { running } => self.register(running).await,
            Action::Send(message) => self.write(message).await,
            Action::Start(launch) => self.start_worker(*launch),
            Action::Stop { key, request } => self.stop_worker(key, request),
            Action::Forget(key) => self.forget_worker(key),
            Action::ReadLogs {
                request_id,
                key,
                offset,
                max_bytes,
                complete,
            } => {
                self.answer_log_read(request_id, key, offset, max_bytes, complete)
                    .await;
            }
            Action::Replicate {
                trial,
                objects,
                sources,
                path,
            } => self.replicate(trial, objects, sources, path),
            Action::Pin { trial, objects } => self.pin(trial, objects),
            Action::DropObjects { trial, objects } => self.drop_objects(trial, objects),
            Action::ReleaseOwner(owner) => self.release_owner(owner),
            Action::ObjectRules(rules) => self.objects.access.apply_rules(rules),
            Action::RevokeCapabilities(entries) => self.objects.access.revoke(entries),
            Action::RenewCapabilities(capabilities) => self.objects.access.renew(capabilities),
            Action::CloseSession { linger_until } => self.close_session(linger_until).await,
            Action::Leave { deadline, refused } => {
                return Some(self.leave(deadline, refused).await);
            }
        }
        None
    }

    /// Starts a connection attempt; its outcome is an event.
    fn connect(&mut self) {
        let join = self.config.join.clone();
        let agent_name = format!("xp-node {}", env!("CARGO_PKG_VERSION"));
        self.connecting = Some(Box::pin(async move {
            transport::connect(&join, PeerRole::Node, &agent_name).await
        }));
    }
}

/// Sleeps until `deadline`; forever without one.
pub(crate) async fn sleep_until(deadline: Option<tokio::time::Instant>) {
    match deadline {
        Some(deadline) => tokio::time::sleep_until(deadline).await,
        None => std::future::pending().await,
    }
}

/// The outcome of the connection attempt under way; never without one.
async fn connect_outcome(
    connecting: &mut Option<Connecting>,
) -> Result<(HeadConnection, SendStream, RecvStream), TransportError> {
    match connecting {
        Some(connecting) => connecting.await,
        None => std::future::pending().await,
    }
}

/// The next command on the open session (`None` when it broke); never without one.
async fn recv_command(session: &mut Option<HeadSession>) -> Option<HeadCommand> {
    match session {
        Some(session) => session.commands.recv().await,
        None => std::future::pending().await,
    }
}

/// The next telemetry sample (`None` once the sampler ended); never without one.
async fn recv_sample(
    telemetry: &mut Option<mpsc::Receiver<NodeTelemetry>>,
) -> Option<NodeTelemetry> {
    match telemetry {
        Some(received) => received.recv().await,
        None => std::future::pending().await,
    }
}
