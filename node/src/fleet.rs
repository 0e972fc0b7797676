//! A simulated node for soaking the head with many nodes (`xp bench fleet`):
//! the real node's decisions (`node_core::NodeCore`: registering, resending
//! unacknowledged reports, heartbeats, back-off, launch admission on its GPU
//! slots, kills) on a QUIC session of its own, with workers that run no
//! process. Each worker reports that it started, one metric per step,
//! checkpoints into a pretend object store (whose objects the head's directory
//! learns of), resumes from the step its launch names, and exits 0; a kill
//! ends it as a stop.
//!
//! Many of them run in one process. Cancelling [`run_simulated`]'s token is
//! the node's process dying: its workers vanish with it and nothing more is
//! said to the head. What persists across such a death (the objects on its
//! disk) is in [`NodeDisk`], which the caller keeps for the node's next life.
//!
//! The pretend store keeps what the head's orders leave: pins, drops, and an
//! ended trial's unpinned objects released, so the head's directory and its
//! retention are exercised as with real stores.
//!
//! Not here: anything a real worker does (no process, no files, no object
//! bytes), telemetry beyond one sample of every live worker per interval, and
//! log reads (answered with an error).

mod worker;

use std::collections::{BTreeMap, HashMap};
use std::future::Future;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use xp_runtime::clock::{Clock, SystemClock};
use xp_runtime::frame;
use xp_runtime::ids::{NodeId, ObjectId, TrialId, WorkerKey};
use xp_runtime::join::JoinString;
use xp_runtime::protocol::{
    ErrorCode, GpuInfo, HeadCommand, HeldObject, Message, NodeIsolation, NodeMessage,
    NodeRegistration, NodeResources, NodeTelemetry, PeerRole, RemoteError, StoreUsage,
    WorkerReport, WorkerSample,
};
use xp_runtime::transport::{self, HeadConnection};

pub use self::worker::FakeWork;
use crate::node_core::{Action, CoreConfig, NodeCore};

/// What a simulated node saw, for the soak's ledger (times on the caller's clock).
#[derive(Debug, Clone)]
pub enum FleetEvent {
    /// The head registered the node on a new session.
    Registered {
        /// The node.
        node: NodeId,
        /// When.
        at: Instant,
    },
    /// A worker started on the node.
    Started {
        /// The node.
        node: NodeId,
        /// The worker.
        key: WorkerKey,
        /// When.
        at: Instant,
    },
    /// A worker ended on the node (`completed`: it did all its steps and exited 0).
    Ended {
        /// The node.
        node: NodeId,
        /// The worker.
        key: WorkerKey,
        /// When.
        at: Instant,
        /// It exited 0 after its last step.
        completed: bool,
    },
}

/// The objects a simulated node holds, with the trials that own them: what
/// survives the node's death, as a real node's disk does (its pins do not:
/// a real node keeps them in memory, and the head pins again at registration).
#[derive(Debug, Clone, Default)]
pub struct NodeDisk(Arc<Mutex<BTreeMap<ObjectId, Held>>>);

/// An object on a simulated node's disk.
#[derive(Debug, Clone, Copy)]
struct Held {
    /// The trial that owns it.
    trial: TrialId,
    /// The head keeps it (a checkpoint it retains): a release leaves it.
    pinned: bool,
}

impl NodeDisk {
    fn with<T>(&self, f: impl FnOnce(&mut BTreeMap<ObjectId, Held>) -> T) -> T {
        f(&mut self.0.lock().unwrap_or_else(PoisonError::into_inner))
    }

    fn add(&self, trial: TrialId, ids: impl IntoIterator<Item = ObjectId>) {
        self.with(|held| {
            for id in ids {
                held.entry(id).or_insert(Held {
                    trial,
                    pinned: false,
                });
            }
        });
    }

    /// How many objects it holds.
    pub fn len(&self) -> usize {
        self.with(|objects| objects.len())
    }

    /// Whether it holds none.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// One simulated node.
#[derive(Debug, Clone)]
pub struct SimulatedNode {
    /// Where the head is, with the node credential.
    pub join: JoinString,
    /// Its persistent id (the same on every life).
    pub node_id: NodeId,
    /// Its name.
    pub name: String,
    /// The address it gives for its gangs' `MASTER_ADDR` (the head hands
    /// out `MASTER_PORT`s per address, so nodes of one host share 500).
    pub advertise_host: String,
    /// Whole GPU slots it declares.
    pub gpus: u32,
    /// What its workers do.
    pub work: FakeWork,
    /// How often it sends a telemetry sample; zero for never.
    pub telemetry_interval: Duration,
    /// What it holds across lives.
    pub disk: NodeDisk,
    /// Where it tells what it saw.
    pub events: mpsc::UnboundedSender<FleetEvent>,
}

/// What the loop waits for.
enum Event {
    Timeout,
    Connected(Result<Session, transport::TransportError>),
    Command(Option<HeadCommand>),
    Worker(worker::Output),
    Telemetry,
}

/// An open session: the stream written to and the head's commands read.
struct Session {
    connection: HeadConnection,
    send: quinn::SendStream,
    commands: mpsc::UnboundedReceiver<HeadCommand>,
}

/// A connection attempt under way.
type Connecting =
    std::pin::Pin<Box<dyn Future<Output = Result<Session, transport::TransportError>> + Send>>;

/// The node's state for one life.
struct Simulated {
    node: SimulatedNode,
    core: NodeCore,
    session: Option<Session>,
    connecting: Option<Connecting>,
    workers: HashMap<WorkerKey, CancellationToken>,
    outputs_tx: mpsc::UnboundedSender<worker::Output>,
    outputs_rx: mpsc::UnboundedReceiver<worker::Output>,
    /// Every worker task dies with this life.
    life: CancellationToken,
}

/// Runs `node` until `death` is cancelled, which ends it at once (no drain,
/// no goodbye; its workers vanish).
pub async fn run_simulated(node: SimulatedNode, death: CancellationToken) {
    let (outputs_tx, outputs_rx) = mpsc::unbounded_channel();
    let core = NodeCore::new(CoreConfig {
        node_id: node.node_id,
        drain_timeout: Duration::from_secs(1),
        memory_watched: false,
    });
    // A new life: the pins died with the last one.
    node.disk.with(|held| {
        for object in held.values_mut() {
            object.pinned = false;
        }
    });
    let mut simulated = Simulated {
        node,
        core,
        session: None,
        connecting: None,
        workers: HashMap::new(),
        outputs_tx,
        outputs_rx,
        life: death.child_token(),
    };
    let _workers_die = simulated.life.clone().drop_guard();
    tokio::select! {
        () = death.cancelled() => {}
        () = simulated.run() => {}
    }
}

impl Simulated {
    async fn run(&mut self) {
        let interval = self.node.telemetry_interval;
        let mut telemetry = (!interval.is_zero()).then(|| tokio::time::interval(interval));
        loop {
            while let Some(action) = self.core.poll_action() {
                if !self.perform(action).await {
                    return;
                }
            }
            let event = self.next_event(&mut telemetry).await;
            self.handle(event);
        }
    }

    async fn next_event(&mut self, telemetry: &mut Option<tokio::time::Interval>) -> Event {
        let timeout = self.core.poll_timeout().map(tokio::time::Instant::from_std);
        let in_session = self.session.is_some();
        tokio::select! {
            () = crate::agent::sleep_until(timeout) => Event::Timeout,
            connected = connect_outcome(&mut self.connecting) => Event::Connected(connected),
            command = recv_command(&mut self.session) => Event::Command(command),
            Some(output) = self.outputs_rx.recv() => Event::Worker(output),
            () = tick(telemetry), if in_session => Event::Telemetry,
        }
    }

    fn handle(&mut self, event: Event) {
        let now = tokio::time::Instant::now().into_std();
        match event {
            Event::Timeout => self.core.handle_timeout(now),
            Event::Connected(connected) => {
                self.connecting = None;
                match connected {
                    Ok(session) => {
                        self.session = Some(session);
                        self.core.handle_connected(now);
                    }
                    Err(error) => self.core.handle_connect_failed(now, &error),
                }
            }
            Event::Command(Some(command)) => {
                if matches!(command, HeadCommand::Registered { .. }) {
                    self.tell(FleetEvent::Registered {
                        node: self.node.node_id,
                        at: now,
                    });
                }
                self.core.handle_command(now, command);
            }
            Event::Command(None) => self.core.handle_disconnected(now),
            Event::Worker(worker::Output::Object(id, trial)) => {
                self.node.disk.add(trial, [id]);
                self.core
                    .handle_object_changes(vec![crate::objects::ObjectChange::Added(id)]);
            }
            Event::Worker(worker::Output::Report(report)) => {
                self.note_for_ledger(&report, now);
                self.core.handle_report(now, SystemClock.now(), report);
            }
            Event::Telemetry => {
                let sample = self.telemetry();
                self.core
                    .handle_message_for_head(NodeMessage::Telemetry(sample));
            }
        }
    }

    /// Tells the ledger of a worker's start or end.
    fn note_for_ledger(&self, report: &WorkerReport, at: Instant) {
        let node = self.node.node_id;
        let event = match report {
            WorkerReport::Started { key, .. } => FleetEvent::Started {
                node,
                key: *key,
                at,
            },
            WorkerReport::Exited { key, code, .. } => FleetEvent::Ended {
                node,
                key: *key,
                at,
                completed: *code == Some(0),
            },
            WorkerReport::Stopped { key, .. } => FleetEvent::Ended {
                node,
                key: *key,
                at,
                completed: false,
            },
            _ => return,
        };
        self.tell(event);
    }

    fn tell(&self, event: FleetEvent) {
        let _ = self.node.events.send(event);
    }

    fn telemetry(&self) -> NodeTelemetry {
        NodeTelemetry {
            at: SystemClock.now(),
            workers: self
                .workers
                .keys()
                .map(|key| WorkerSample {
                    key: *key,
                    cpu_cores: Some(1.0),
                    rss_bytes: Some(1 << 30),
                    gpu_util: None,
                    gpu_mem_bytes: None,
                    gpu_power_w: None,
                })
                .collect(),
            gpus: Vec::new(),
            store: StoreUsage {
                memory_bytes: 0,
                disk_bytes: self.node.disk.len() as u64 * worker::OBJECT_BYTES,
            },
        }
    }

    /// Does what the core decided; false once the node has left.
    async fn perform(&mut self, action: Action) -> bool {
        match action {
            Action::Connect => self.connect(),
            Action::Register { running } => {
                let registration = self.registration(running);
                self.write(NodeMessage::Register(registration)).await;
            }
            Action::Send(message) => self.write(message).await,
            Action::Start(launch) => self.start(*launch),
            Action::Stop { key, .. } => {
                if let Some(stop) = self.workers.get(&key) {
                    stop.cancel();
                }
            }
            Action::Forget(key) => {
                self.workers.remove(&key);
            }
            Action::ReadLogs { request_id, .. } => {
                let refusal =
                    RemoteError::new(ErrorCode::NotFound, "a simulated node keeps no worker logs");
                let answer = NodeMessage::Logs {
                    request_id,
                    result: Err(refusal),
                };
                self.core.handle_message_for_head(answer);
            }
            Action::Replicate { trial, objects, .. } => self.replicate(trial, &objects),
            Action::DropObjects { objects, .. } => self.drop_objects(&objects),
            Action::Pin { objects, .. } => self.pin(&objects),
            Action::ReleaseOwner(crate::objects::Owner::Trial(trial)) => self.release_trial(trial),
            Action::ReleaseOwner(crate::objects::Owner::Driver(_))
            | Action::ObjectRules(_)
            | Action::RevokeCapabilities(_)
            | Action::RenewCapabilities(_) => {}
            Action::CloseSession { .. } => {
                if let Some(session) = self.session.take() {
                    session
                        .connection
                        .connection
                        .close(transport::CLOSE_SHUTDOWN.into(), b"node session ended");
                }
            }
            Action::Leave { .. } => return false,
        }
        true
    }

    fn connect(&mut self) {
        let join = self.node.join.clone();
        let life = self.life.clone();
        self.connecting = Some(Box::pin(async move {
            let (connection, send, recv) =
                transport::connect(&join, PeerRole::Node, "xp-node (simulated)").await?;
            let (commands_tx, commands) = mpsc::unbounded_channel();
            xp_runtime::task::spawn(
                "simulated-node-reader",
                read_commands(recv, commands_tx, life),
            );
            Ok(Session {
                connection,
                send,
                commands,
            })
        }));
    }

    fn registration(&self, running: Vec<WorkerKey>) -> NodeRegistration {
        let gpus = (0..self.node.gpus)
            .map(|index| GpuInfo {
                index,
                model: "simulated".to_owned(),
                memory_bytes: 80 << 30,
            })
            .collect();
        let held_objects = self.node.disk.with(|objects| {
            objects
                .iter()
                .map(|(id, held)| HeldObject {
                    id: *id,
                    pinned: held.pinned,
                    trials: vec![held.trial],
                    drivers: Vec::new(),
                })
                .collect()
        });
        NodeRegistration {
            node_id: self.node.node_id,
            name: self.node.name.clone(),
            advertise_host: self.node.advertise_host.clone(),
            resources: NodeResources {
                gpus,
                cpu_milli: 64_000,
                memory_bytes: 512 << 30,
            },
            labels: BTreeMap::new(),
            running,
            objects: None,
            held_objects,
            isolation: NodeIsolation::default(),
        }
    }

    async fn write(&mut self, message: NodeMessage) {
        let Some(session) = &mut self.session else {
            return;
        };
        let written = frame::write_message(&mut session.send, &Message::FromNode(message)).await;
        if written.is_err() {
            self.core
                .handle_disconnected(tokio::time::Instant::now().into_std());
        }
    }

    fn start(&mut self, launch: xp_runtime::protocol::Launch) {
        let stop = self.life.child_token();
        self.workers.insert(launch.key, stop.clone());
        let work = self.node.work;
        let outputs = self.outputs_tx.clone();
        xp_runtime::task::spawn("simulated-worker", worker::run(launch, work, outputs, stop));
    }

    /// A replica is "fetched" at once: the objects are now held here too.
    fn replicate(&mut self, trial: TrialId, objects: &[(ObjectId, u64)]) {
        let added: Vec<_> = objects.iter().map(|(id, _)| *id).collect();
        self.node.disk.add(trial, added.iter().copied());
        let changes = added
            .into_iter()
            .map(crate::objects::ObjectChange::Added)
            .collect();
        self.core.handle_object_changes(changes);
    }

    /// The head keeps these of `trial`'s objects: a release leaves them.
    fn pin(&mut self, objects: &[ObjectId]) {
        self.node.disk.with(|held| {
            for id in objects {
                if let Some(object) = held.get_mut(id) {
                    object.pinned = true;
                }
            }
        });
    }

    /// `trial` ended: what it owns and the head does not keep goes.
    fn release_trial(&mut self, trial: TrialId) {
        let released: Vec<_> = self.node.disk.with(|held| {
            held.iter()
                .filter(|(_, object)| object.trial == trial && !object.pinned)
                .map(|(id, _)| *id)
                .collect()
        });
        self.drop_objects(&released);
    }

    fn drop_objects(&mut self, objects: &[ObjectId]) {
        let dropped: Vec<_> = self.node.disk.with(|held| {
            objects
                .iter()
                .filter(|id| held.remove(id).is_some())
                .copied()
                .collect()
        });
        if !dropped.is_empty() {
            let changes = dropped
                .into_iter()
                .map(crate::objects::ObjectChange::Dropped)
                .collect();
            self.core.handle_object_changes(changes);
        }
    }
}

/// Reads the head's commands into `commands` until the stream ends or breaks,
/// or the node's life ends.
async fn read_commands(
    mut recv: quinn::RecvStream,
    commands: mpsc::UnboundedSender<HeadCommand>,
    life: CancellationToken,
) {
    loop {
        let read = tokio::select! {
            () = life.cancelled() => return,
            read = frame::read_message(&mut recv) => read,
        };
        let Ok(Some(Message::ToNode(command))) = read else {
            return;
        };
        if commands.send(command).is_err() {
            return;
        }
    }
}

/// The outcome of the connection attempt under way; never without one.
async fn connect_outcome(
    connecting: &mut Option<Connecting>,
) -> Result<Session, transport::TransportError> {
    match connecting {
        Some(connecting) => connecting.await,
        None => std::future::pending().await,
    }
}

/// The next command on the open session (`None` when it broke); never without one.
async fn recv_command(session: &mut Option<Session>) -> Option<HeadCommand> {
    match session {
        Some(session) => session.commands.recv().await,
        None => std::future::pending().await,
    }
}

/// The next telemetry tick; never without an interval.
async fn tick(telemetry: &mut Option<tokio::time::Interval>) {
    match telemetry {
        Some(interval) => {
            interval.tick().await;
        }
        None => std::future::pending().await,
    }
}

/// What a process has used: CPU seconds (its own and its reaped children's)
/// and resident memory, from `/proc`; `None` when it is gone.
pub fn process_usage(pid: u32) -> Option<(f64, u64)> {
    use crate::telemetry::proc;
    let read = |file: &str| -> Option<String> {
        use std::io::Read;
        let mut text = String::new();
        std::fs::File::open(format!("/proc/{pid}/{file}"))
            .ok()?
            .take(proc::MAX_FILE_BYTES)
            .read_to_string(&mut text)
            .ok()?;
        Some(text)
    };
    let stat = proc::parse_stat(&read("stat")?)?;
    let rss = proc::parse_vm_rss(&read("status")?)?;
    Some((stat.ticks as f64 / crate::telemetry::clock_ticks(), rss))
}
