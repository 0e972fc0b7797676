//! The xp node: offers a machine's GPU slots, CPU and memory to the head and runs
//! the worker processes it is told to run.
//!
//! [`run`] is the whole node inside the current tokio runtime; the `xp-node`
//! binary and the embedded local cluster both use it.
//!
//! Not here: command-line parsing and the tracing subscriber (the binary's
//! `main.rs`), and any placement decision (the head makes them all; the node
//! executes them and reports facts).
//!
//! The modules, each importing only those below it (no two import each other):
//!
//! - `agent`: the async shell; one loop performs `node_core`'s actions (the
//!   session with the head, worker tasks, the head's orders on the object store).
//! - `node_core`: what the agent decides (sessions, back-off, launches, stops,
//!   evictions, reports, the drain), sans-io; with `outbox` (numbered reports
//!   until acknowledged), `reconnect` (the back-off) and `slots` (GPU shares).
//! - `worker`: one worker process, from spawn to its final report.
//! - `checkpoint`: a checkpoint's route on a node (take, back up, restore,
//!   pipeline inputs); `worker_log`: each worker's capped log.
//! - `telemetry`: samples workers and GPUs, and the eviction watch.
//! - `objects`: the node's object store, its server and fetcher, and the
//!   workers' local channel.
//! - `isolation`: user ids and directories that keep workers apart; `cgroup`:
//!   per-worker limits; `gpu`: NVML; `route`: which address reaches a peer;
//!   `slurm`: what a Slurm job grants.
//!
//! The modules are private; what other crates use is re-exported below: the
//! node's configuration and errors, the object store with its server and
//! fetcher (for benches and tools), reading a worker's log from a data
//! directory, and, with feature `test-util`, helpers for tests and benches
//! (`test_util`) and simulated nodes for soaking the head (`fleet`).

mod agent;
mod cgroup;
mod checkpoint;
#[cfg(feature = "test-util")]
pub mod fleet;
mod gpu;
mod isolation;
mod node_core;
mod objects;
mod outbox;
mod reconnect;
mod route;
mod slots;
mod slurm;
mod telemetry;
#[cfg(any(test, feature = "test-util"))]
mod test_util;
mod worker;
mod worker_log;

pub use agent::AgentError;
pub use checkpoint::{CheckpointError, OutputLimits};
pub use isolation::{IsolationError, PASSABLE_DIRS, WorkerUids};
pub use node_core::{DEFAULT_DRAIN_TIMEOUT, DrainTimeoutError, check_drain_timeout};
pub use objects::access::ObjectAccess;
pub use objects::remote::{FetchError, ObjectFetcher, ObjectServer, ObjectServerError, Wanted};
pub use objects::{
    IoOperation, ObjectBytes, ObjectChange, ObjectInfo, ObjectStore, Owner, StoreError,
    StoreLimits, StoreStats, Tier,
};
pub use slurm::{Detected, ExplicitFlags, SLURM_JOB_LABEL, SlurmError, SlurmOffer, detect_slurm};
pub use telemetry::{
    DEFAULT_INTERVAL as DEFAULT_TELEMETRY_INTERVAL, TelemetryIntervalError,
    check_interval as check_telemetry_interval,
};
#[cfg(any(test, feature = "test-util"))]
pub use test_util::{
    METRIC_EVERY, generate_output, log_files, restore_checkpoint, run_command_worker,
    take_checkpoint,
};
pub use worker_log::{LogCap, LogError, LogRead, log_path, read as read_log};

use std::collections::BTreeMap;
use std::path::PathBuf;

use tokio_util::sync::CancellationToken;
use xp_runtime::error_chain::error_chain;
use xp_runtime::ids::NodeId;
use xp_runtime::join::JoinString;
use xp_runtime::protocol::NodeResources;

/// How to run a node.
#[derive(Debug, Clone)]
pub struct NodeConfig {
    /// Where the head is and how to trust it.
    pub join: JoinString,
    /// Logs, cached binaries, the node id.
    pub data_dir: PathBuf,
    /// Declared GPU slots; NVML decides when absent.
    pub gpus: Option<u32>,
    /// CPU cores offered; all when absent.
    pub cpus: Option<f64>,
    /// Memory offered in bytes; all when absent.
    pub memory_bytes: Option<u64>,
    /// Labels such as `rack=r1`.
    pub labels: BTreeMap<String, String>,
    /// The host other nodes reach this one at; the local address of the route
    /// to the head when absent.
    pub advertise_host: Option<String>,
    /// How much the object store may hold.
    pub object_limits: StoreLimits,
    /// The UDP port of the object server; 0 picks a free one.
    pub object_port: u16,
    /// A durable directory (shared between nodes, or otherwise safe) that every
    /// checkpoint taken here is also written to.
    pub checkpoint_backup: Option<PathBuf>,
    /// The most each worker's log keeps on disk (its beginning and a rolling tail).
    pub log_cap: LogCap,
    /// Which user ids workers run under (`--worker-uids`).
    pub worker_uids: WorkerUids,
    /// The most files and bytes rank 0 may leave in `XP_OUTPUT_DIR`
    /// (`--output-max-files`, `--output-max-bytes`).
    pub output_limits: OutputLimits,
    /// How often workers and GPUs are sampled for the head (`--telemetry-interval`; zero: never).
    pub telemetry_interval: std::time::Duration,
    /// The GPU ordinals an allocation granted (a Slurm job's, `slurm::offer`):
    /// exactly these are offered; `gpus` wins when both are set.
    pub granted_gpus: Option<Vec<u32>>,
    /// How long the node takes at most from SIGTERM to its exit: its workers get
    /// SIGTERM and most of it to checkpoint, the head the rest to store their
    /// ends (`--drain-timeout`; keep it under Slurm's `KillWait`).
    pub drain_timeout: std::time::Duration,
    /// A file giving each GPU's memory in use and total, `INDEX USED TOTAL` per
    /// line, read by the eviction watch instead of NVML (`--gpu-memory-file`:
    /// machines without NVML, stand-in GPUs, tests).
    pub gpu_memory_file: Option<PathBuf>,
}

/// Why the node stopped.
#[derive(Debug, thiserror::Error)]
pub enum NodeError {
    /// The data directory could not be used.
    #[error("{context}: {source}")]
    Io {
        /// What was being done.
        context: String,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// The head refused this node.
    #[error(transparent)]
    Agent(#[from] AgentError),
    /// The object store or its server could not start.
    #[error("object store: {0}")]
    Objects(String),
    /// Workers cannot be isolated as asked.
    #[error(transparent)]
    Isolation(#[from] IsolationError),
}

/// Runs the node until `shutdown`.
pub async fn run(config: NodeConfig, shutdown: CancellationToken) -> Result<(), NodeError> {
    let io_error = |context: String| move |source| NodeError::Io { context, source };
    // The data directory holds user data (objects, checkpoints, worker logs and
    // work directories): only this user may enter it, or, where workers run
    // under ids of their own, pass through it to their own parts (`isolation`).
    let tightened = xp_runtime::tls::create_private_dir(&config.data_dir).map_err(io_error(
        format!("cannot create {} (mode 0700)", config.data_dir.display()),
    ))?;
    let node_id = load_or_create_node_id(&config.data_dir)
        .map_err(io_error("cannot read or write the node id".to_owned()))?;
    // Says once whether workers get cgroups (cpu, memory and process limits),
    // and then whether they get user ids of their own.
    let isolation = isolation::Isolation::start(
        config.worker_uids,
        &config.data_dir,
        cgroup::Cgroups::enforcement(),
    )?;
    let isolated = isolation.uids().is_some();
    isolation::prepare_data_dir(&config.data_dir, isolated)?;
    // An isolating node's own 0711 from its last start is no news.
    if let Some(mode) = tightened
        && (mode & 0o066 != 0 || !isolated)
    {
        tracing::warn!(dir = %config.data_dir.display(), mode = format!("{mode:o}"), "others could enter the data directory; made it private to this user");
    }
    let gpus = match (config.gpus, &config.granted_gpus) {
        (None, Some(granted)) => gpu::granted(granted, &gpu::NvmlProbe),
        (declared, _) => gpu::discover(declared, &gpu::NvmlProbe),
    };
    let cpus = config
        .cpus
        .unwrap_or_else(|| std::thread::available_parallelism().map_or(1.0, |n| n.get() as f64));
    let memory_bytes = config.memory_bytes.unwrap_or_else(total_memory_bytes);
    let name = nix::unistd::gethostname()
        .ok()
        .and_then(|name| name.into_string().ok())
        .unwrap_or_else(|| "node".to_owned());
    let (advertise_host, advertise_from_connection) = advertised_host(&config, &name).await;
    let identity = agent::NodeIdentity {
        node_id,
        name,
        advertise_host,
        advertise_from_connection,
        resources: NodeResources {
            gpus,
            cpu_milli: (cpus * 1000.0).round() as u32,
            memory_bytes,
        },
        labels: config.labels.clone(),
    };
    tracing::info!(%node_id, gpus = identity.resources.gpus.len(), cpus, memory_bytes, isolation = %isolation.summary().label(), "node starting");
    let objects = start_objects(&config, &identity.advertise_host, node_id, isolated)?;
    let server = objects.1;
    let agent_config = agent::AgentConfig {
        join: config.join,
        identity,
        data_dir: config.data_dir,
        log_cap: config.log_cap,
        output_limits: config.output_limits,
        isolation,
        telemetry_interval: config.telemetry_interval,
        drain_timeout: config.drain_timeout,
        gpu_memory_file: config.gpu_memory_file,
    };
    let result = agent::Agent::new(agent_config, objects.0)
        .run(shutdown)
        .await;
    server.close();
    if let Some(cgroups) = cgroup::Cgroups::get() {
        cgroups.remove_node_dirs();
    }
    result?;
    tracing::info!("node stopped");
    Ok(())
}

/// The host this node advertises to the others: `--advertise`, else the local
/// address of its route to the head (`route`), never its host name, which may
/// resolve to a loopback address. With no route yet (the head does not resolve),
/// the host name stands in until the first connection to the head, whose local
/// address is then advertised; the `bool` says so.
async fn advertised_host(config: &NodeConfig, name: &str) -> (String, bool) {
    if let Some(host) = &config.advertise_host {
        return (host.clone(), false);
    }
    match route::local_address_toward(&config.join.host, config.join.port).await {
        Ok(ip) => {
            tracing::info!(%ip, "advertising the local address of the route to the head");
            let named_loopback = ip.is_loopback()
                && config.join.host != "localhost"
                && config.join.host.parse::<std::net::IpAddr>().is_err();
            if named_loopback {
                // The head is on this machine and its name resolves to loopback
                // (Debian's `127.0.1.1 HOST`): the head is reachable from other
                // machines too, so this node must be. Advertise the address of the
                // machine's default route instead.
                if let Some(outward) = default_route_address() {
                    tracing::info!(%outward, head = %config.join.host, "the head's name resolves to loopback here; advertising the default route's address");
                    return (outward.to_string(), false);
                }
                tracing::warn!(
                    head = %config.join.host,
                    "the head's name resolves to a loopback address here and this machine has no default route, so nodes on other machines cannot reach this one; pass --advertise, or join with the head's address"
                );
            }
            (ip.to_string(), false)
        }
        Err(error) => {
            tracing::warn!(
                error = %error_chain(&error),
                "no route to the head yet: advertising the local address of the connection to it once connected (or pass --advertise)"
            );
            (name.to_owned(), true)
        }
    }
}

/// The local address of this machine's default route, if it has one and it is not
/// loopback. Asking the routing table (a UDP socket `connect`ed to a documentation
/// address, TEST-NET-1) sends no packet.
fn default_route_address() -> Option<std::net::IpAddr> {
    let probe = std::net::SocketAddr::from(([192, 0, 2, 1], 9));
    route::local_address_to(probe)
        .ok()
        .filter(|ip| !ip.is_loopback() && !ip.is_unspecified())
}

/// Opens the store under `<data_dir>/objects` and starts its server.
fn start_objects(
    config: &NodeConfig,
    advertise_host: &str,
    own_node: NodeId,
    open_to_workers: bool,
) -> Result<(agent::NodeObjects, ObjectServer), NodeError> {
    let store = std::sync::Arc::new(
        ObjectStore::open(config.data_dir.join("objects"), config.object_limits)
            .map_err(|error| NodeError::Objects(error_chain(&error)))?,
    );
    let loopback = advertise_host == "localhost"
        || advertise_host
            .parse::<std::net::IpAddr>()
            .is_ok_and(|ip| ip.is_loopback());
    let bind_ip: std::net::IpAddr = if loopback {
        std::net::Ipv4Addr::LOCALHOST.into()
    } else {
        std::net::Ipv4Addr::UNSPECIFIED.into()
    };
    let access = std::sync::Arc::new(ObjectAccess::new(&config.join.token));
    let (changes_tx, changes_rx) = tokio::sync::mpsc::unbounded_channel();
    let (head_messages_tx, head_messages_rx) = tokio::sync::mpsc::unbounded_channel();
    let server = ObjectServer::start(
        store.clone(),
        std::net::SocketAddr::new(bind_ip, config.object_port),
        access.clone(),
        changes_tx.clone(),
    )
    .map_err(|error| NodeError::Objects(error_chain(&error)))?;
    objects::access::report_to_head(access.clone(), head_messages_tx.clone());
    let credential = xp_runtime::object_wire::Credential::Node(
        xp_runtime::object_wire::node_credential(&config.join.token),
    );
    let fetcher =
        ObjectFetcher::new(credential).map_err(|error| NodeError::Objects(error_chain(&error)))?;
    let endpoint = server
        .endpoint()
        .map_err(|error| NodeError::Objects(error_chain(&error)))?;
    let fetcher = std::sync::Arc::new(fetcher);
    let local_workers = objects::local::Workers::default();
    let head = std::sync::Arc::new(std::sync::Mutex::new(None));
    let socket = config.data_dir.join("run").join("objects.sock");
    objects::local::start(
        &socket,
        open_to_workers,
        objects::local::LocalContext {
            store: store.clone(),
            fetcher: fetcher.clone(),
            workers: local_workers.clone(),
            head: head.clone(),
            own_node,
            changes: changes_tx.clone(),
            access: access.clone(),
        },
    )
    .map_err(|error| NodeError::Objects(error_chain(&error)))?;
    tracing::info!(port = endpoint.port, bulk_port = ?server.bulk_port(), dir = %store.dir().display(), socket = %socket.display(), "object store ready");
    Ok((
        agent::NodeObjects {
            store,
            access,
            fetcher,
            endpoint,
            changes_tx,
            changes_rx,
            local_workers,
            head,
            socket,
            backup: config.checkpoint_backup.clone(),
            head_messages_tx,
            head_messages_rx,
        },
        server,
    ))
}

fn load_or_create_node_id(data_dir: &std::path::Path) -> std::io::Result<NodeId> {
    let path = data_dir.join("node_id");
    match std::fs::read_to_string(&path) {
        Ok(text) => text.trim().parse().map_err(|error| {
            std::io::Error::new(
                std::io::ErrorKind::InvalidData,
                format!("{}: {error}", path.display()),
            )
        }),
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => {
            let node_id = NodeId::random();
            let temporary = path.with_extension("tmp");
            std::fs::write(&temporary, node_id.to_string())?;
            std::fs::rename(&temporary, &path)?;
            Ok(node_id)
        }
        Err(error) => Err(error),
    }
}

fn total_memory_bytes() -> u64 {
    std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|meminfo| {
            let line = meminfo.lines().find(|line| line.starts_with("MemTotal:"))?;
            let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
            Some(kib * 1024)
        })
        .unwrap_or(0)
}
