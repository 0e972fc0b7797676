//! A node's session with the head: its registration, the reports it sends
//! ([`NodeMessage`], [`WorkerReport`]) and the commands it receives
//! ([`HeadCommand`], [`Launch`]).
//!
//! Order: the first message on the session stream is [`NodeMessage::Register`],
//! answered by [`HeadCommand::Registered`]; then both sides send freely. Reports
//! are numbered and acknowledged once persisted, so a node resends unacknowledged
//! ones after a reconnect and the head tolerates duplicates. It does not cover
//! requests on fresh streams (see `requests`).
//!
//! Invariant: enum variants and struct fields are append-only (bincode is not
//! self-describing); a removed variant keeps its slot.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::{CheckpointFile, LogChunk, ObjectEndpoint, ObjectSource, RemoteError, ResumeFrom};
use crate::clock::UnixMillis;
use crate::ids::{BlobHash, NodeId, ObjectId, TrialId, WorkerKey};

/// One GPU a node offers.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct GpuInfo {
    /// The device index, as `CUDA_VISIBLE_DEVICES` names it.
    pub index: u32,
    /// The model name, or `declared` for slots declared with `--gpus`.
    pub model: String,
    /// Device memory in bytes, 0 when unknown.
    pub memory_bytes: u64,
}

/// What a node offers.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeResources {
    /// GPU slots.
    pub gpus: Vec<GpuInfo>,
    /// CPU in thousandths of a core.
    // The head's node records, written as JSON before the rename, say `milli_cpus`.
    #[serde(alias = "milli_cpus")]
    pub cpu_milli: u32,
    /// Memory in bytes.
    pub memory_bytes: u64,
}

/// A node's first message on its session stream.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct NodeRegistration {
    /// The node's persistent id.
    pub node_id: NodeId,
    /// Its host name.
    pub name: String,
    /// The host or address workers on other nodes reach it at (for
    /// `MASTER_ADDR`): its `--advertise`, else the local address of its route
    /// to the head.
    pub advertise_host: String,
    /// What it offers.
    pub resources: NodeResources,
    /// Labels such as `rack=r1`.
    pub labels: BTreeMap<String, String>,
    /// Workers it still runs from before (after a head or connection restart).
    pub running: Vec<WorkerKey>,
    /// Where other nodes fetch objects from this one.
    pub objects: Option<ObjectEndpoint>,
    /// The objects its store holds, with who claims them, for the head's
    /// directory and to settle what the node missed while it was away.
    pub held_objects: Vec<HeldObject>,
    /// What it enforces on its workers (`xp nodes` shows it).
    pub isolation: NodeIsolation,
}

/// What a node enforces on its workers: whether each runs under a user id of
/// its own (so workers of different trials cannot read each other's memory,
/// environment or files), and which cgroups hold its limits.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeIsolation {
    /// Each live worker runs under a user id no other live worker has.
    pub worker_uids: bool,
    /// How CPU, memory and process limits are enforced, if at all.
    pub limits: LimitEnforcement,
}

impl NodeIsolation {
    /// The short form `xp nodes` shows: `uid+cgroup-v1`, `uid`, `cgroup-v2`, `none`.
    pub fn label(self) -> String {
        match (self.worker_uids, self.limits) {
            (false, LimitEnforcement::None) => "none".to_owned(),
            (true, LimitEnforcement::None) => "uid".to_owned(),
            (false, limits) => limits.as_str().to_owned(),
            (true, limits) => format!("uid+{}", limits.as_str()),
        }
    }
}

/// How a node enforces its workers' CPU, memory and process limits.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub enum LimitEnforcement {
    /// Not at all: no usable cgroup hierarchy (or a record from before nodes said).
    #[default]
    None,
    /// Per-worker cgroups in the v1 hierarchies.
    CgroupV1,
    /// Per-worker cgroups in the unified (v2) hierarchy.
    CgroupV2,
}

impl LimitEnforcement {
    /// The lowercase name used in JSON and tables.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::None => "none",
            Self::CgroupV1 => "cgroup-v1",
            Self::CgroupV2 => "cgroup-v2",
        }
    }
}

/// One object a registering node holds, and who keeps it there.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct HeldObject {
    /// The object.
    pub id: ObjectId,
    /// Pinned (a checkpoint's object).
    pub pinned: bool,
    /// The trials that claim it.
    pub trials: Vec<TrialId>,
    /// The driver sessions that claim it.
    pub drivers: Vec<String>,
}

/// What a node says on its session stream.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub enum NodeMessage {
    /// The first message: who the node is.
    Register(NodeRegistration),
    /// The node is alive.
    Heartbeat,
    /// A numbered report; the head acknowledges it with [`HeadCommand::Ack`] once persisted.
    Report {
        /// Per-node sequence number, strictly increasing across reconnects.
        seq: u64,
        /// When the node made it (its clock, Unix milliseconds): a report
        /// resent after the head was away keeps the time of what happened.
        at: UnixMillis,
        /// What happened.
        report: WorkerReport,
    },
    /// The answer to [`HeadCommand::ReadLogs`].
    Logs {
        /// The request this answers.
        request_id: u64,
        /// The chunk, or why there is none.
        result: Result<LogChunk, RemoteError>,
    },
    /// The node is shutting down: place nothing more on it.
    Draining,
    /// Objects this node's store gained (a replica fetched) or lost (deleted,
    /// found corrupt), for the head's directory.
    Objects {
        /// Now held.
        added: Vec<ObjectId>,
        /// No longer held.
        dropped: Vec<ObjectId>,
    },
    /// A [`HeadCommand::Replicate`] was not carried out in full: these objects of
    /// the trial's checkpoint could not be fetched and are not held here. The
    /// head tries again (with back-off, on another node when there is one) and
    /// tells the trial's events.
    ReplicationFailed {
        /// The trial whose checkpoint they belong to.
        trial: TrialId,
        /// The objects not fetched.
        objects: Vec<ObjectId>,
        /// Why, in words.
        error: String,
    },
    /// What the node sampled (best effort: neither numbered nor acknowledged).
    Telemetry(super::NodeTelemetry),
    /// What users fetched and stored through the node's object server, per
    /// team, and what it refused (best effort, like telemetry).
    ObjectAccess(super::ObjectAccessReport),
}

/// Something that happened to a worker.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum WorkerReport {
    /// The worker process started.
    Started {
        /// The worker.
        key: WorkerKey,
        /// Its process id on the node.
        pid: u32,
    },
    /// The worker could not be started.
    LaunchFailed {
        /// The worker.
        key: WorkerKey,
        /// Why.
        error: String,
    },
    /// The worker process exited.
    Exited {
        /// The worker.
        key: WorkerKey,
        /// Its exit code, if it exited normally.
        code: Option<i32>,
        /// The signal that ended it, if any.
        signal: Option<i32>,
    },
    /// The worker reported metrics.
    Metric {
        /// The worker.
        key: WorkerKey,
        /// The report's position in the worker's output, to discard duplicates.
        index: u64,
        /// The step, if given.
        step: Option<u64>,
        /// Values by name.
        values: Vec<(String, f64)>,
    },
    /// The node stopped the worker: on the head's order, or because the node
    /// itself is shutting down. Not the trial's fault.
    Stopped {
        /// The worker.
        key: WorkerKey,
        /// Why the node stopped it.
        reason: String,
    },
    /// The worker's checkpoint was taken into the node's object store.
    Checkpoint {
        /// The worker that wrote it.
        key: WorkerKey,
        /// The step it was taken at.
        step: u64,
        /// Its files, each an object in this node's store.
        files: Vec<CheckpointFile>,
        /// The durable backup directory its objects were also written to.
        backup: Option<String>,
        /// How long the node took to store it, in milliseconds.
        take_ms: u64,
    },
    /// The node could not start the worker through no fault of the trial (its GPU
    /// is still held by a stopping worker, the driver binary could not be fetched,
    /// the node is shutting down): the head places it again.
    Refused {
        /// The worker.
        key: WorkerKey,
        /// Why.
        reason: String,
    },
    /// The worker process ended after the kernel killed one of its processes
    /// for going over the worker's memory limit: the trial's fault.
    OomKilled {
        /// The worker.
        key: WorkerKey,
        /// Its exit code, if it exited normally.
        code: Option<i32>,
        /// The signal that ended it, if any.
        signal: Option<i32>,
        /// The memory limit it went over, in bytes.
        limit_bytes: u64,
    },
    /// Rank 0 exited successfully and the files it wrote under `XP_OUTPUT_DIR`
    /// are stored, pinned for the trial (sent before its `Exited`). With
    /// `error`, they could not be (too many, too large, a link): the attempt fails
    /// with that reason.
    Outputs {
        /// The worker.
        key: WorkerKey,
        /// The files, each an object in this node's store.
        files: Vec<CheckpointFile>,
        /// Why they could not be stored.
        error: Option<String>,
    },
    /// The node stopped an oversubscribed worker on its own, through its
    /// checkpoint (SIGTERM and a grace), because a GPU it shares ran short of
    /// memory: not the trial's fault, so the head requeues it without using a
    /// retry.
    Evicted {
        /// The worker.
        key: WorkerKey,
        /// The device index of the GPU whose memory ran short.
        gpu: u32,
        /// That GPU's memory in use when the node decided, in bytes.
        used_bytes: u64,
        /// That GPU's memory, in bytes.
        total_bytes: u64,
    },
    /// The worker process exited unsuccessfully (a status other than 0, or a
    /// signal), with the last lines of its stderr: what `Exited` says, and why
    /// in the trial's own words. Sent instead of `Exited` by nodes since
    /// protocol 9 when the worker wrote anything on stderr.
    ExitedWithStderr {
        /// The worker.
        key: WorkerKey,
        /// Its exit code, if it exited normally.
        code: Option<i32>,
        /// The signal that ended it, if any.
        signal: Option<i32>,
        /// The last lines of its stderr, bounded and escaped
        /// ([`crate::stderr_tail::tail_of`]); the head bounds it again.
        stderr_tail: String,
    },
    /// The worker printed metric lines the node could not read: how many so
    /// far and the first, with why. Sent at the first, then each time the
    /// count doubles, so a worker printing nothing else is a few reports.
    MalformedMetrics {
        /// The worker.
        key: WorkerKey,
        /// How many malformed lines so far.
        count: u64,
        /// The first one (at most [`MAX_MALFORMED_LINE_SHOWN`] bytes) and why
        /// it was refused.
        first: String,
    },
}

/// A report's `at` that asks the head to take its own time, for a report
/// answered at once (a launch refused on arrival).
pub const AT_RECEIPT: UnixMillis = UnixMillis::MAX;

/// How much of a malformed metric line is kept to show.
pub const MAX_MALFORMED_LINE_SHOWN: usize = 512;

impl WorkerReport {
    /// The worker this report is about.
    pub fn key(&self) -> WorkerKey {
        match self {
            Self::Started { key, .. }
            | Self::LaunchFailed { key, .. }
            | Self::Exited { key, .. }
            | Self::Metric { key, .. }
            | Self::MalformedMetrics { key, .. }
            | Self::Stopped { key, .. }
            | Self::Refused { key, .. }
            | Self::Checkpoint { key, .. }
            | Self::OomKilled { key, .. }
            | Self::Outputs { key, .. }
            | Self::Evicted { key, .. }
            | Self::ExitedWithStderr { key, .. } => *key,
        }
    }
}

/// What the head tells a node on its session stream.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub enum HeadCommand {
    /// Registration accepted; send heartbeats at this interval.
    Registered {
        /// Heartbeat interval in milliseconds.
        heartbeat_interval_ms: u64,
    },
    /// Start one worker (boxed: it is much larger than the other commands).
    Launch(Box<Launch>),
    /// Stop every local worker of this attempt (SIGTERM, then SIGKILL after a grace period).
    Kill {
        /// The trial.
        trial: TrialId,
        /// The attempt.
        attempt: u32,
        /// Why, for the log.
        reason: String,
        /// How long after SIGTERM (time to checkpoint) before SIGKILL.
        grace_ms: u64,
    },
    /// Reports up to and including `upto` are persisted; the node may forget them.
    Ack {
        /// The highest persisted sequence number.
        upto: u64,
    },
    /// Read a worker's log and answer with [`NodeMessage::Logs`].
    ReadLogs {
        /// Echoed in the answer.
        request_id: u64,
        /// The worker.
        key: WorkerKey,
        /// Byte offset.
        offset: u64,
        /// The most bytes to return.
        max_bytes: u32,
    },
    /// These objects belong to checkpoints the head keeps: pin them (a node
    /// forgets pins when it restarts).
    Pin {
        /// The trial whose checkpoints name them.
        trial: TrialId,
        /// The objects.
        objects: Vec<ObjectId>,
    },
    /// Fetch these objects from other nodes and keep them, pinned, as replicas.
    Replicate {
        /// The trial whose checkpoint they belong to (their owner).
        trial: TrialId,
        /// The objects and their sizes.
        objects: Vec<(ObjectId, u64)>,
        /// Nodes that hold them.
        sources: Vec<ObjectSource>,
        /// The path their bytes take, by the trial's spec (as its launches').
        path: super::FetchPath,
    },
    /// The trial ended: what its workers stored and nothing else claims (and no
    /// pin keeps) may go.
    ReleaseTrial {
        /// The trial.
        trial: TrialId,
    },
    /// A driver's connection ended: what it stored and nothing else claims may go.
    ReleaseDriver {
        /// The driver session's name.
        session: String,
    },
    /// No checkpoint the head keeps needs these objects of `trial` any more: unpin
    /// them and withdraw the trial's claim (they go unless something else claims them).
    DropObjects {
        /// The trial whose checkpoints named them; none for objects nothing
        /// claims any more.
        trial: Option<TrialId>,
        /// The objects.
        objects: Vec<ObjectId>,
    },
    /// The head gave this session up (it judged the node lost): end it, reconnect
    /// and register again so that what the node still runs is reconciled.
    Reconnect {
        /// Why, for the log.
        reason: String,
    },
    /// The object plane's rules: per-team quotas and every revocation in
    /// force (after registering, and when the policy changes).
    ObjectRules(super::ObjectRules),
    /// Capabilities revoked since (a session or attempt ended, a user was
    /// revoked): refuse them from now on.
    RevokeCapabilities(Vec<super::RevocationEntry>),
    /// New capabilities of live attempts whose workers run here, issued before
    /// the old ones expire (and when the node registers): hand these to the
    /// attempts' workers from now on. At most
    /// [`MAX_RENEWALS_PER_COMMAND`](super::MAX_RENEWALS_PER_COMMAND).
    RenewCapabilities(Vec<super::ObjectCapability>),
}

/// Everything a node needs to start one worker. Its `Debug` leaves the
/// collective token out.
#[derive(Clone, PartialEq, Serialize, Deserialize)]
pub struct Launch {
    /// The worker.
    pub key: WorkerKey,
    /// The number of workers in the gang.
    pub world_size: u32,
    /// The rank among the gang's workers on this node.
    pub local_rank: u32,
    /// What to run.
    pub program: Program,
    /// The trial's configuration as JSON (`XP_CONFIG`).
    pub config_json: String,
    /// The replicate seed (`XP_SEED`).
    pub seed: u64,
    /// GPU indices for `CUDA_VISIBLE_DEVICES`.
    pub gpu_indices: Vec<u32>,
    /// The thousandths of each of those GPUs this worker holds: 1000 for whole
    /// GPUs, less for a fraction of one shared GPU (`XP_GPU_FRACTION`).
    pub gpu_milli: u32,
    /// The address rank 0's node advertises (`MASTER_ADDR`).
    pub master_addr: String,
    /// A port reserved on rank 0's host (`MASTER_PORT`).
    pub master_port: u16,
    /// The per-attempt secret of the gang's rendezvous and data connections (`XP_COLLECTIVE_TOKEN`).
    pub collective_token: [u8; 32],
    /// The data path between machines (`XP_COLLECTIVE_TRANSPORT`).
    pub transport: crate::spec::CollectiveTransport,
    /// The checkpoint to restore before starting, if the trial has one.
    pub resume: Option<ResumeFrom>,
    /// The CPU quota in thousandths of a core (the trial's `resources.cpu`); 0 for none.
    #[serde(default)]
    pub cpu_milli: u32,
    /// The memory limit in bytes (the trial's `resources.memory`); 0 for none.
    #[serde(default)]
    pub memory_bytes: u64,
    /// Directories of upstream pipeline stages' files, filled before the worker starts.
    #[serde(default)]
    pub inputs: Vec<super::LaunchInput>,
    /// Whether rank 0's `XP_OUTPUT_DIR` is stored and reported when it exits 0:
    /// only for a pipeline stage's trials (later stages read those files);
    /// other workers get the directory as scratch space that nothing keeps.
    #[serde(default)]
    pub collect_outputs: bool,
    /// The oversubscription factor in thousandths (1500 for 1.5×) this
    /// worker's fractional `gpu_milli` was placed under: it holds
    /// `gpu_milli` divided by this of its GPU (rounded up), and its node may
    /// evict it for GPU memory. 1000 (or 0, read as 1000) for a worker that
    /// did not opt in.
    #[serde(default)]
    pub oversubscription_milli: u32,
    /// The attempt's capability on the object plane, which the worker may ask
    /// its node for on the local object channel (never in its argv or
    /// environment).
    #[serde(default)]
    pub object_capability: Option<Box<super::ObjectCapability>>,
    /// The directory a command's relative program and arguments are found in
    /// (the spec's `trial.command_dir`: where it was submitted from), as a path
    /// on the node's file system; the worker itself runs in its work directory.
    #[serde(default)]
    pub command_dir: Option<String>,
    /// The path its restores, inputs and object gets from other nodes take: the
    /// plain TCP bulk path only where the trial's spec declares its network
    /// trusted (`FetchPath::for_transport` of the spec's `transport`).
    #[serde(default)]
    pub object_path: super::FetchPath,
}

impl std::fmt::Debug for Launch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Launch")
            .field("key", &self.key)
            .field("world_size", &self.world_size)
            .field("local_rank", &self.local_rank)
            .field("program", &self.program)
            .field("config_json", &self.config_json)
            .field("seed", &self.seed)
            .field("gpu_indices", &self.gpu_indices)
            .field("gpu_milli", &self.gpu_milli)
            .field("master_addr", &self.master_addr)
            .field("master_port", &self.master_port)
            .field("collective_token", &"<redacted>")
            .field("transport", &self.transport)
            .field("resume", &self.resume)
            .field("cpu_milli", &self.cpu_milli)
            .field("memory_bytes", &self.memory_bytes)
            .field("inputs", &self.inputs)
            .field("collect_outputs", &self.collect_outputs)
            .field("oversubscription_milli", &self.oversubscription_milli)
            .field("object_capability", &self.object_capability)
            .field("command_dir", &self.command_dir)
            .field("object_path", &self.object_path)
            .finish()
    }
}

/// The code a worker runs.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum Program {
    /// An argv with placeholders already filled.
    Command {
        /// The argv.
        argv: Vec<String>,
    },
    /// A trainable registered in a driver binary, fetched by hash.
    Entry {
        /// The driver binary.
        binary: BlobHash,
        /// The trainable's name.
        entry: String,
    },
}
