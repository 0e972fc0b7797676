//! The node agent: one session with the head at a time, reconnecting forever.
//!
//! The agent owns the worker table, the GPU slot table and the outbox. It
//! executes the head's commands and reports facts; it never decides placement.
//! Worker processes outlive a lost connection: after reconnecting, the agent
//! registers with the workers it still tracks and resends every report the head
//! has not acknowledged.
//!
//! Not here: running a worker process (`worker`), and taking, backing up or
//! restoring checkpoints (`checkpoint`): the agent prepares a launch by asking
//! `checkpoint` to restore what it resumes from, and carries out the head's
//! retention orders (`Replicate`, `Pin`, `DropObjects`) on the object store.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use quinn::{RecvStream, SendStream};
use tokio::sync::{mpsc, oneshot};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};
use xp_runtime::frame::{self, FrameError};
use xp_runtime::ids::{NodeId, ObjectId, TrialId, WorkerKey};
use xp_runtime::join::JoinString;
use xp_runtime::protocol::{
    ErrorCode, HeadCommand, HeldObject, Launch, LogChunk, Message, NodeMessage, NodeRegistration,
    NodeResources, ObjectEndpoint, ObjectSource, PeerRole, RemoteError, WorkerReport,
};
use xp_runtime::spec::MAX_OVERSUBSCRIPTION_MILLI;
use xp_runtime::transport::{self, HeadConnection, TransportError};

use crate::checkpoint::{self, CheckpointSources};
use crate::isolation::Isolation;
use crate::objects::remote::{ObjectFetcher, Wanted};
use crate::objects::{ObjectStore, Owner};
use crate::outbox::Outbox;
use crate::reconnect::Backoff;
use crate::slots::SlotTable;
use crate::telemetry::eviction::Eviction;
use crate::worker::{self, MAX_KILL_GRACE, StopRequest};
use crate::worker_log::{self, LogCap, LogError};

mod evict;
mod prepare;

use self::prepare::{LaunchObjects, PrepareError, resolve_command};

/// The most object changes sent to the head in one message.
const MAX_OBJECT_CHANGES: usize = 4096;

/// How long a node takes at most from SIGTERM to its exit by default: under
/// Slurm's default `KillWait` (30 s), after which Slurm sends SIGKILL.
pub const DEFAULT_DRAIN_TIMEOUT: Duration = Duration::from_secs(20);
/// The shortest drain: a second for workers to checkpoint, a second for the head.
pub(crate) const MIN_DRAIN_TIMEOUT: Duration = Duration::from_secs(2);

/// Checks a `--drain-timeout`: between [`MIN_DRAIN_TIMEOUT`] and the longest
/// grace a worker may have.
pub fn check_drain_timeout(timeout: Duration) -> Result<Duration, DrainTimeoutError> {
    if (MIN_DRAIN_TIMEOUT..=MAX_KILL_GRACE).contains(&timeout) {
        Ok(timeout)
    } else {
        Err(DrainTimeoutError::OutOfRange { timeout })
    }
}

/// Why a `--drain-timeout` is refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum DrainTimeoutError {
    /// Outside [`MIN_DRAIN_TIMEOUT`] to the longest grace a worker may have.
    #[error(
        "the drain timeout must be between {} and {}",
        humantime::format_duration(MIN_DRAIN_TIMEOUT),
        humantime::format_duration(MAX_KILL_GRACE)
    )]
    OutOfRange {
        /// The timeout asked for.
        timeout: Duration,
    },
}

/// Of the time left to drain, what workers get between SIGTERM and SIGKILL: all
/// but a quarter (at least a second), which is kept for storing a checkpoint a
/// worker printed as it exited and for the head to acknowledge the ends.
fn drain_grace(left: Duration) -> Duration {
    left.saturating_sub((left / 4).max(Duration::from_secs(1)))
}

use crate::objects::ObjectChange;

/// The node's object store and its links to other nodes.
pub(crate) struct NodeObjects {
    /// The local store.
    pub store: Arc<ObjectStore>,
    /// Pulls objects from other nodes.
    pub fetcher: Arc<ObjectFetcher>,
    /// Where other nodes reach this node's object server.
    pub endpoint: ObjectEndpoint,
    /// Changes to report (the object server sends copies it found corrupt here).
    pub changes_tx: mpsc::UnboundedSender<ObjectChange>,
    /// Their receiving end, drained by the session.
    pub changes_rx: mpsc::UnboundedReceiver<ObjectChange>,
    /// Workers allowed on the local object channel, by secret.
    pub local_workers: crate::objects::local::Workers,
    /// The current session's head connection, for the local channel's look-ups.
    pub head: Arc<std::sync::Mutex<Option<HeadConnection>>>,
    /// The local channel's socket (`XP_NODE_SOCKET`).
    pub socket: PathBuf,
    /// The durable directory checkpoints are also written to.
    pub backup: Option<PathBuf>,
    /// Messages for the head from the node's tasks (a failed replication); sent
    /// on the current session, or the next one.
    pub head_messages_tx: mpsc::UnboundedSender<NodeMessage>,
    /// Their receiving end, drained by the session.
    pub head_messages_rx: mpsc::UnboundedReceiver<NodeMessage>,
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
    pub node_id: NodeId,
    /// Host name.
    pub name: String,
    /// The host other nodes' workers reach this one at.
    pub advertise_host: String,
    /// No route to the head was found at start: advertise the local address of
    /// each connection to the head instead of `advertise_host`.
    pub advertise_from_connection: bool,
    /// Capacity.
    pub resources: NodeResources,
    /// Labels.
    pub labels: BTreeMap<String, String>,
}

struct RunningWorker {
    stop: Option<oneshot::Sender<StopRequest>>,
    task: JoinHandle<()>,
}

/// The agent's state.
pub(crate) struct Agent {
    join: JoinString,
    identity: NodeIdentity,
    data_dir: PathBuf,
    workers: HashMap<WorkerKey, RunningWorker>,
    slots: SlotTable,
    outbox: Outbox,
    reports_tx: mpsc::UnboundedSender<WorkerReport>,
    reports_rx: mpsc::UnboundedReceiver<WorkerReport>,
    heartbeat: Duration,
    /// Shutting down: new launches are refused.
    draining: bool,
    /// The head registered this node on the current (or last) session.
    registered: bool,
    objects: NodeObjects,
    /// The most each worker's log keeps on disk.
    log_cap: LogCap,
    output_limits: checkpoint::OutputLimits,
    /// User ids for workers, and what the node registers it enforces.
    isolation: Isolation,
    /// The workers telemetry samples (each worker task adds itself).
    telemetry_targets: crate::telemetry::Targets,
    /// How often telemetry samples; zero for never.
    telemetry_interval: Duration,
    /// Samples waiting for the session (a small queue: see `telemetry`).
    telemetry_rx: Option<mpsc::Receiver<xp_runtime::protocol::NodeTelemetry>>,
    /// The most time from SIGTERM to the node's exit.
    drain_timeout: Duration,
    /// When the drain must be over, once it began.
    drain_deadline: Option<tokio::time::Instant>,
    /// Cancelled when the node begins to drain; workers read it to tell a stop
    /// by the drain from a failure (see `worker::supervise`).
    node_draining: CancellationToken,
    /// Workers the eviction watch chose (sent by telemetry), acted on by `evict`.
    evictions_tx: mpsc::UnboundedSender<Eviction>,
    evictions_rx: mpsc::UnboundedReceiver<Eviction>,
    /// Where GPU memory is read instead of NVML (`--gpu-memory-file`).
    gpu_memory_file: Option<PathBuf>,
}

enum SessionEnd {
    Disconnected,
    Shutdown,
}

impl Agent {
    /// An agent for `identity`, keeping logs and binaries under `data_dir`.
    pub(crate) fn new(
        join: JoinString,
        identity: NodeIdentity,
        data_dir: PathBuf,
        objects: NodeObjects,
    ) -> Self {
        let (reports_tx, reports_rx) = mpsc::unbounded_channel();
        let (evictions_tx, evictions_rx) = mpsc::unbounded_channel();
        Self {
            join,
            identity,
            data_dir,
            workers: HashMap::new(),
            slots: SlotTable::default(),
            outbox: Outbox::default(),
            reports_tx,
            reports_rx,
            heartbeat: Duration::from_secs(1),
            draining: false,
            registered: false,
            objects,
            log_cap: LogCap::default(),
            output_limits: checkpoint::OutputLimits::default(),
            isolation: Isolation::shared(crate::cgroup::Cgroups::enforcement()),
            telemetry_targets: crate::telemetry::Targets::default(),
            telemetry_interval: crate::telemetry::DEFAULT_INTERVAL,
            telemetry_rx: None,
            drain_timeout: DEFAULT_DRAIN_TIMEOUT,
            drain_deadline: None,
            node_draining: CancellationToken::new(),
            evictions_tx,
            evictions_rx,
            gpu_memory_file: None,
        }
    }

    /// Reads GPU memory for the eviction watch from `path`, `INDEX USED TOTAL`
    /// per line, instead of NVML (`--gpu-memory-file`: machines without NVML, tests).
    pub(crate) fn with_gpu_memory_file(mut self, path: Option<PathBuf>) -> Self {
        self.gpu_memory_file = path;
        self
    }

    /// Bounds the time from shutdown to the end of [`Agent::run`] (the default is
    /// [`DEFAULT_DRAIN_TIMEOUT`]).
    pub(crate) fn with_drain_timeout(mut self, timeout: Duration) -> Self {
        self.drain_timeout = timeout;
        self
    }

    /// When the drain must be over; the drain begins with the first call.
    fn drain_deadline(&mut self) -> tokio::time::Instant {
        let timeout = self.drain_timeout;
        *self
            .drain_deadline
            .get_or_insert_with(|| tokio::time::Instant::now() + timeout)
    }

    /// Every worker has ended and the head has acknowledged every report.
    fn drained(&self) -> bool {
        self.workers.is_empty() && self.outbox.unacked().next().is_none()
    }

    /// Samples workers and GPUs every `interval` for the head (zero: never).
    pub(crate) fn with_telemetry(mut self, interval: Duration) -> Self {
        self.telemetry_interval = interval;
        self
    }

    /// Runs workers under user ids of their own as `isolation` says (by default
    /// they run as the node's user).
    pub(crate) fn with_isolation(mut self, isolation: Isolation) -> Self {
        self.isolation = isolation;
        self
    }

    /// Bounds what rank 0 may leave in `XP_OUTPUT_DIR` (`--output-max-files`,
    /// `--output-max-bytes`).
    pub(crate) fn with_output_limits(mut self, limits: checkpoint::OutputLimits) -> Self {
        self.output_limits = limits;
        self
    }

    /// Keeps each worker's log under `log_cap` (the default is `worker_log::DEFAULT_LOG_CAP`).
    pub(crate) fn with_log_cap(mut self, log_cap: LogCap) -> Self {
        self.log_cap = log_cap;
        self
    }

    /// Serves the head until `shutdown`, then stops every worker.
    ///
    /// A session that broke after the head registered this node is followed by
    /// an immediate attempt; failed attempts wait a jittered, doubling delay of at
    /// most `NODE_RECONNECT_MAX_BACKOFF`. With the node session's idle timeout, a
    /// node is back within `transport::NODE_RETURN_BOUND` of a restarted head.
    pub(crate) async fn run(mut self, shutdown: CancellationToken) -> Result<(), AgentError> {
        let mut backoff = Backoff::new(self.identity.node_id);
        self.node_draining = shutdown.clone();
        let agent_name = format!("xp-node {}", env!("CARGO_PKG_VERSION"));
        // Telemetry samples until the agent ends, whichever way.
        let telemetry_stop = shutdown.child_token();
        let _telemetry_stops = telemetry_stop.clone().drop_guard();
        if self.telemetry_interval.is_zero() {
            info!(
                "telemetry off (--telemetry-interval 0), and with it the eviction watch for GPU memory"
            );
        } else {
            let (samples, received) = mpsc::channel(crate::telemetry::QUEUE);
            self.telemetry_rx = Some(received);
            xp_runtime::task::spawn(
                "telemetry",
                crate::telemetry::run(
                    self.telemetry_interval,
                    self.telemetry_targets.clone(),
                    self.objects.store.clone(),
                    samples,
                    self.evictions_tx.clone(),
                    self.gpu_memory_file.clone(),
                    telemetry_stop,
                ),
            );
        }
        let join = self.join.clone();
        loop {
            let connected = tokio::select! {
                () = shutdown.cancelled() => break,
                connected = self.while_evicting(transport::connect(&join, PeerRole::Node, &agent_name)) => connected,
            };
            match connected {
                Ok((connection, send, recv)) => {
                    info!(head = %format!("{}:{}", self.join.host, self.join.port), "connected to the head");
                    let end = self.session(&connection, send, recv, &shutdown).await;
                    connection
                        .connection
                        .close(transport::CLOSE_SHUTDOWN.into(), b"node session ended");
                    if matches!(end, SessionEnd::Shutdown) {
                        self.stop_all_workers("node shutting down").await;
                        return Ok(());
                    }
                    if self.registered {
                        backoff.reset();
                        warn!("lost the head; reconnecting");
                    } else {
                        // Not registered (the head could not persist it, or went
                        // away at once): wait, so a failing head is not hammered.
                        let delay = backoff.next_delay();
                        warn!(retry_in = ?delay, "the session ended before the head registered this node");
                        tokio::select! {
                            () = shutdown.cancelled() => break,
                            () = self.while_evicting(tokio::time::sleep(delay)) => {}
                        }
                    }
                }
                Err(error @ (TransportError::BadToken(_) | TransportError::CaMismatch(_))) => {
                    self.stop_all_workers("node refused by the head").await;
                    return Err(AgentError::Refused(error));
                }
                Err(error) => {
                    let delay = backoff.next_delay();
                    warn!(%error, retry_in = ?delay, "cannot reach the head");
                    tokio::select! {
                        () = shutdown.cancelled() => break,
                        () = self.while_evicting(tokio::time::sleep(delay)) => {}
                    }
                }
            }
            // Reports produced while disconnected wait in the outbox.
            while let Ok(report) = self.reports_rx.try_recv() {
                self.record(report);
            }
        }
        self.stop_all_workers("node shutting down").await;
        Ok(())
    }

    /// Advertises the local address of `connection` when no route to the head was
    /// found at start: the address the head sees this node's packets come from.
    fn learn_advertise_host(&mut self, connection: &HeadConnection) {
        if !self.identity.advertise_from_connection {
            return;
        }
        if let Some(ip) = connection.connection.local_ip() {
            if self.identity.advertise_host != ip.to_string() {
                info!(%ip, "advertising the local address of the connection to the head");
            }
            self.identity.advertise_host = ip.to_string();
        }
    }

    fn registration(&self) -> NodeRegistration {
        let mut running: Vec<WorkerKey> = self.workers.keys().copied().collect();
        running.extend(self.outbox.unacked_final());
        running.sort();
        running.dedup();
        NodeRegistration {
            node_id: self.identity.node_id,
            name: self.identity.name.clone(),
            advertise_host: self.identity.advertise_host.clone(),
            resources: self.identity.resources.clone(),
            labels: self.identity.labels.clone(),
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
            isolation: self.isolation.summary(),
        }
    }

    async fn session(
        &mut self,
        connection: &HeadConnection,
        mut send: SendStream,
        recv: RecvStream,
        shutdown: &CancellationToken,
    ) -> SessionEnd {
        self.registered = false;
        *self
            .objects
            .head
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = Some(connection.clone());
        self.learn_advertise_host(connection);
        let registration = Message::FromNode(NodeMessage::Register(self.registration()));
        if frame::write_message(&mut send, &registration)
            .await
            .is_err()
        {
            return SessionEnd::Disconnected;
        }
        let resend: Vec<Message> = self
            .outbox
            .unacked()
            .map(|(seq, report)| {
                Message::FromNode(NodeMessage::Report {
                    seq,
                    report: report.clone(),
                })
            })
            .collect();
        for message in resend {
            if frame::write_message(&mut send, &message).await.is_err() {
                return SessionEnd::Disconnected;
            }
        }
        let (commands_tx, mut commands_rx) = mpsc::unbounded_channel();
        let reader =
            xp_runtime::task::spawn("node-session-reader", read_commands(recv, commands_tx));
        let mut heartbeat = tokio::time::interval(self.heartbeat);
        let mut draining_until: Option<tokio::time::Instant> = None;
        let end = loop {
            // Leave once the head has stored every end (so none is lost), or at the deadline.
            if draining_until.is_some() && self.drained() {
                info!("drained: every worker stopped and its end stored by the head");
                break SessionEnd::Shutdown;
            }
            let drain_deadline = draining_until.unwrap_or_else(tokio::time::Instant::now);
            tokio::select! {
                () = shutdown.cancelled(), if draining_until.is_none() => {
                    let deadline = self.drain_deadline();
                    let grace = drain_grace(self.drain_timeout);
                    info!(workers = self.workers.len(), ?grace, timeout = ?self.drain_timeout, "draining: stopping workers so they checkpoint and move elsewhere");
                    self.draining = true;
                    // Tell the head first, so nothing more is placed here and the
                    // stopped trials are requeued elsewhere.
                    let _ = frame::write_message(&mut send, &Message::FromNode(NodeMessage::Draining)).await;
                    for worker in self.workers.values_mut() {
                        if let Some(stop) = worker.stop.take() {
                            let _ = stop.send(StopRequest::with_grace("node draining", grace));
                        }
                    }
                    draining_until = Some(deadline);
                }
                () = tokio::time::sleep_until(drain_deadline), if draining_until.is_some() => {
                    warn!(workers = self.workers.len(), unacknowledged = self.outbox.unacked().count(), "drain timeout reached; leaving");
                    break SessionEnd::Shutdown;
                }
                command = commands_rx.recv() => {
                    let Some(command) = command else { break SessionEnd::Disconnected };
                    if let HeadCommand::Reconnect { reason } = &command {
                        warn!(%reason, "the head asked this node to register again");
                        break SessionEnd::Disconnected;
                    }
                    let replies = self.handle_command(connection, command).await;
                    if write_all(&mut send, replies).await.is_err() {
                        break SessionEnd::Disconnected;
                    }
                }
                report = self.reports_rx.recv() => {
                    let Some(report) = report else { break SessionEnd::Disconnected };
                    let seq = self.record(report.clone());
                    if frame::write_message(&mut send, &Message::FromNode(NodeMessage::Report { seq, report })).await.is_err() {
                        break SessionEnd::Disconnected;
                    }
                }
                change = self.objects.changes_rx.recv() => {
                    let Some(change) = change else { break SessionEnd::Disconnected };
                    let mut changes = vec![change];
                    while changes.len() < MAX_OBJECT_CHANGES {
                        let Ok(change) = self.objects.changes_rx.try_recv() else { break };
                        changes.push(change);
                    }
                    let (mut added, mut dropped) = (Vec::new(), Vec::new());
                    for change in changes {
                        match change {
                            ObjectChange::Added(id) => added.push(id),
                            ObjectChange::Dropped(id) => dropped.push(id),
                        }
                    }
                    if frame::write_message(&mut send, &Message::FromNode(NodeMessage::Objects { added, dropped })).await.is_err() {
                        break SessionEnd::Disconnected;
                    }
                }
                message = self.objects.head_messages_rx.recv() => {
                    let Some(message) = message else { break SessionEnd::Disconnected };
                    if frame::write_message(&mut send, &Message::FromNode(message)).await.is_err() {
                        break SessionEnd::Disconnected;
                    }
                }
                telemetry = async {
                    match self.telemetry_rx.as_mut() {
                        Some(received) => received.recv().await,
                        None => std::future::pending().await,
                    }
                } => {
                    let Some(telemetry) = telemetry else {
                        self.telemetry_rx = None;
                        continue;
                    };
                    // Best effort: not numbered, not kept for a later session.
                    if frame::write_message(&mut send, &Message::FromNode(NodeMessage::Telemetry(telemetry))).await.is_err() {
                        break SessionEnd::Disconnected;
                    }
                }
                Some(eviction) = self.evictions_rx.recv() => self.evict(eviction),
                _ = heartbeat.tick() => {
                    if frame::write_message(&mut send, &Message::FromNode(NodeMessage::Heartbeat)).await.is_err() {
                        break SessionEnd::Disconnected;
                    }
                }
            }
        };
        reader.abort();
        let _ = send.finish();
        if matches!(end, SessionEnd::Shutdown) {
            // Closing at once would discard what is still in flight (`Draining`,
            // the last heartbeat): wait, briefly and within the drain, until the
            // head has read to the end and closed its side, which also tells it
            // this node has left.
            let left = self
                .drain_deadline()
                .saturating_duration_since(tokio::time::Instant::now())
                .min(Duration::from_secs(2));
            let _ = tokio::time::timeout(left, connection.connection.closed()).await;
        }
        *self
            .objects
            .head
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = None;
        end
    }

    /// Numbers a report, and forgets a worker once it has ended.
    fn record(&mut self, report: WorkerReport) -> u64 {
        if let WorkerReport::Exited { key, .. }
        | WorkerReport::LaunchFailed { key, .. }
        | WorkerReport::Stopped { key, .. }
        | WorkerReport::Refused { key, .. }
        | WorkerReport::OomKilled { key, .. }
        | WorkerReport::Evicted { key, .. } = &report
        {
            self.workers.remove(key);
            self.slots.release(*key);
            self.objects
                .local_workers
                .retain(|_, worker| worker.key != *key);
        }
        self.outbox.push(report)
    }

    async fn handle_command(
        &mut self,
        connection: &HeadConnection,
        command: HeadCommand,
    ) -> Vec<Message> {
        match command {
            HeadCommand::Registered {
                heartbeat_interval_ms,
            } => {
                self.registered = true;
                self.heartbeat = Duration::from_millis(heartbeat_interval_ms.clamp(100, 60_000));
                debug!(?self.heartbeat, "registered");
                Vec::new()
            }
            HeadCommand::Ack { upto } => {
                self.outbox.ack(upto);
                Vec::new()
            }
            HeadCommand::Launch(launch) => {
                self.launch(connection, *launch);
                Vec::new()
            }
            HeadCommand::Kill {
                trial,
                attempt,
                reason,
                grace_ms,
            } => {
                // The head's grace (time to checkpoint when preempted), bounded so a
                // bad value cannot keep a GPU busy for hours.
                let grace = Duration::from_millis(grace_ms).min(MAX_KILL_GRACE);
                for (key, worker) in &mut self.workers {
                    if key.trial == trial
                        && key.attempt == attempt
                        && let Some(stop) = worker.stop.take()
                    {
                        let _ = stop.send(StopRequest::with_grace(reason.clone(), grace));
                    }
                }
                Vec::new()
            }
            // Handled by the session loop, which ends the session.
            HeadCommand::Reconnect { .. } => Vec::new(),
            HeadCommand::Replicate {
                trial,
                objects,
                sources,
            } => {
                self.replicate(trial, objects, sources);
                Vec::new()
            }
            HeadCommand::ReleaseDriver { session } => {
                self.release_owner(Owner::Driver(session));
                Vec::new()
            }
            HeadCommand::ReleaseTrial { trial } => {
                self.release_owner(Owner::Trial(trial));
                Vec::new()
            }
            HeadCommand::Pin { trial, objects } => {
                let store = self.objects.store.clone();
                xp_runtime::task::spawn("pin-objects", async move {
                    let _ = tokio::task::spawn_blocking(move || {
                        for id in objects {
                            if store.contains(id) {
                                let kept = store
                                    .add_owner(id, Owner::Trial(trial))
                                    .and_then(|()| store.pin(id));
                                if let Err(error) = kept {
                                    warn!(%id, %error, "cannot pin a checkpoint object");
                                }
                            }
                        }
                    })
                    .await;
                });
                Vec::new()
            }
            HeadCommand::DropObjects { trial, objects } => {
                let owner = trial.map(Owner::Trial);
                let store = self.objects.store.clone();
                let backup = self.objects.backup.clone();
                let changes = self.objects.changes_tx.clone();
                xp_runtime::task::spawn("drop-objects", async move {
                    let deleted = tokio::task::spawn_blocking(move || {
                        if let Some(backup) = &backup {
                            checkpoint::remove_from_backup(backup, &objects);
                        }
                        objects
                            .into_iter()
                            .filter(|id| match store.retire(*id, owner.as_ref()) {
                                Ok(deleted) => deleted,
                                Err(error) => {
                                    warn!(%id, %error, "cannot delete object");
                                    false
                                }
                            })
                            .collect::<Vec<_>>()
                    })
                    .await
                    .unwrap_or_default();
                    debug!(count = deleted.len(), "objects deleted on the head's order");
                    for id in deleted {
                        let _ = changes.send(ObjectChange::Dropped(id));
                    }
                });
                Vec::new()
            }
            HeadCommand::ReadLogs {
                request_id,
                key,
                offset,
                max_bytes,
            } => {
                let complete = !self.workers.contains_key(&key);
                let result = read_log(
                    &worker_log::log_path(&self.data_dir, key),
                    offset,
                    max_bytes,
                    complete,
                )
                .await;
                vec![Message::FromNode(NodeMessage::Logs { request_id, result })]
            }
        }
    }

    /// Collects what `owner` alone kept, and tells the head.
    fn release_owner(&self, owner: Owner) {
        let store = self.objects.store.clone();
        let changes = self.objects.changes_tx.clone();
        xp_runtime::task::spawn("release-owner", async move {
            let released = {
                let owner = owner.clone();
                tokio::task::spawn_blocking(move || store.release_owner(&owner)).await
            };
            match released {
                Ok(Ok(collected)) => {
                    if !collected.is_empty() {
                        info!(%owner, objects = collected.len(), "collected the objects of a finished owner");
                    }
                    for id in collected {
                        let _ = changes.send(ObjectChange::Dropped(id));
                    }
                }
                Ok(Err(error)) => warn!(%owner, %error, "cannot collect an owner's objects"),
                Err(error) => warn!(%owner, %error, "cannot collect an owner's objects"),
            }
        });
    }

    /// Fetches a checkpoint's objects from other nodes and keeps them pinned; tells
    /// the head which could not be fetched, so that it tries again.
    fn replicate(&self, trial: TrialId, objects: Vec<(ObjectId, u64)>, sources: Vec<ObjectSource>) {
        let store = self.objects.store.clone();
        let fetcher = self.objects.fetcher.clone();
        let changes = self.objects.changes_tx.clone();
        let head_messages = self.objects.head_messages_tx.clone();
        let own = self.identity.node_id;
        xp_runtime::task::spawn("replicate", async move {
            let mut failed = Vec::new();
            let mut last_error = String::new();
            for (id, size) in objects {
                match fetcher
                    .ensure(
                        &store,
                        Wanted {
                            id,
                            owner: Owner::Trial(trial),
                            pin: true,
                            size: Some(size),
                        },
                        &sources,
                        Some(own),
                    )
                    .await
                {
                    Ok(_) => {
                        let _ = changes.send(ObjectChange::Added(id));
                    }
                    Err(error) => {
                        last_error = xp_runtime::error_chain::error_chain(&error);
                        warn!(%trial, %id, error = %last_error, "replication failed");
                        failed.push(id);
                    }
                }
            }
            if !failed.is_empty() {
                let _ = head_messages.send(NodeMessage::ReplicationFailed {
                    trial,
                    objects: failed,
                    error: last_error,
                });
            }
        });
    }

    fn launch(&mut self, connection: &HeadConnection, launch: Launch) {
        let key = launch.key;
        if self.workers.contains_key(&key) {
            debug!(worker = %key, "duplicate launch ignored");
            return;
        }
        if self.draining {
            let _ = self.reports_tx.send(WorkerReport::Refused {
                key,
                reason: "the node is shutting down".to_owned(),
            });
            return;
        }
        // The factor the policy placed this worker under; 0 reads as none.
        let factor_milli = match launch.oversubscription_milli {
            0 => 1000,
            factor => factor,
        };
        if !(1000..=MAX_OVERSUBSCRIPTION_MILLI).contains(&u64::from(factor_milli)) {
            let error = format!(
                "the launch's oversubscription factor {factor_milli}/1000 is outside 1000..={MAX_OVERSUBSCRIPTION_MILLI}"
            );
            warn!(worker = %key, %error, "launch refused");
            let _ = self
                .reports_tx
                .send(WorkerReport::LaunchFailed { key, error });
            return;
        }
        if factor_milli > 1000 && self.telemetry_interval.is_zero() {
            warn!(
                worker = %key,
                "an oversubscribed worker starts with telemetry off: its GPU's memory is not watched, so none will be evicted before it runs out"
            );
        }
        if let Err(busy) = self.slots.claim_oversubscribed(
            key,
            &launch.gpu_indices,
            launch.gpu_milli,
            factor_milli,
        ) {
            // A worker the head already gave up is still stopping: not the trial's fault.
            warn!(worker = %key, %busy, "launch refused");
            let _ = self.reports_tx.send(WorkerReport::Refused {
                key,
                reason: busy.to_string(),
            });
            return;
        }
        let (stop_tx, stop_rx) = oneshot::channel();
        let reports = self.reports_tx.clone();
        let data_dir = self.data_dir.clone();
        let log_cap = self.log_cap;
        let telemetry = self.telemetry_targets.clone();
        let node_draining = self.node_draining.clone();
        let connection = connection.clone();
        let advertise_host = self.identity.advertise_host.clone();
        let objects = LaunchObjects {
            checkpoints: CheckpointSources {
                store: self.objects.store.clone(),
                fetcher: self.objects.fetcher.clone(),
                changes: self.objects.changes_tx.clone(),
                own_node: self.identity.node_id,
            },
            backup: self.objects.backup.clone(),
            local_workers: self.objects.local_workers.clone(),
            socket: self.objects.socket.clone(),
            uids: self.isolation.uids().cloned(),
            output_limits: self.output_limits,
        };
        let task = xp_runtime::task::spawn("worker", async move {
            match resolve_command(&data_dir, &advertise_host, &connection, &launch, &objects).await
            {
                Ok(command) => {
                    worker::supervise(
                        launch,
                        command,
                        log_cap,
                        reports,
                        stop_rx,
                        telemetry,
                        node_draining,
                    )
                    .await;
                }
                Err(PrepareError::Refused(reason)) => {
                    warn!(worker = %key, %reason, "worker could not be prepared");
                    let _ = reports.send(WorkerReport::Refused { key, reason });
                }
                Err(PrepareError::Invalid(error)) => {
                    warn!(worker = %key, %error, "worker could not be prepared");
                    let _ = reports.send(WorkerReport::LaunchFailed { key, error });
                }
            }
        });
        self.workers.insert(
            key,
            RunningWorker {
                stop: Some(stop_tx),
                task,
            },
        );
    }

    /// Stops every worker not yet stopped and waits for them, all within the
    /// drain's deadline; a worker task still running then is aborted (which
    /// SIGKILLs its process).
    async fn stop_all_workers(&mut self, reason: &str) {
        let deadline = self.drain_deadline();
        let grace = drain_grace(deadline.saturating_duration_since(tokio::time::Instant::now()));
        for worker in self.workers.values_mut() {
            if let Some(stop) = worker.stop.take() {
                let _ = stop.send(StopRequest::with_grace(reason, grace));
            }
        }
        for (key, mut worker) in self.workers.drain() {
            if tokio::time::timeout_at(deadline, &mut worker.task)
                .await
                .is_err()
            {
                warn!(worker = %key, "worker did not stop before the drain deadline; killing it");
                worker.task.abort();
            }
        }
    }
}

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

async fn write_all(send: &mut SendStream, messages: Vec<Message>) -> Result<(), FrameError> {
    for message in messages {
        frame::write_message(send, &message).await?;
    }
    Ok(())
}

/// A piece of a worker's capped log (`worker_log::read`: the head, a marker
/// where output was dropped, the tail) from stream offset `offset`.
async fn read_log(
    path: &Path,
    offset: u64,
    max_bytes: u32,
    complete: bool,
) -> Result<LogChunk, RemoteError> {
    let path = path.to_owned();
    let read = tokio::task::spawn_blocking(move || worker_log::read(&path, offset, max_bytes))
        .await
        .map_err(|error| RemoteError::new(ErrorCode::Internal, error.to_string()))?;
    match read {
        Ok(read) => Ok(LogChunk {
            data: read.data,
            next_offset: read.next_offset,
            complete,
        }),
        Err(LogError::NotFound { .. }) => Err(RemoteError::new(
            ErrorCode::NotFound,
            "no output recorded for this worker",
        )),
        Err(error) => Err(RemoteError::new(
            ErrorCode::Internal,
            xp_runtime::error_chain::error_chain(&error),
        )),
    }
}
