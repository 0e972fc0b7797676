//! Starting, watching and stopping one worker process.
//!
//! Each worker runs in its own process group (so a kill reaches the shell and its
//! children) and, where the machine allows, in its own cgroup with the CPU and
//! memory limits of its launch (`cgroup`), which it enters between fork and exec
//! and which is emptied with SIGKILL and removed when it ends, so that no process
//! it started (not even one that left its process group) outlives it; a worker
//! whose process the kernel killed for memory is reported `OomKilled`. On a root
//! node it then drops to the user id its trial attempt's ranks on this node
//! share (`isolation`; `setgroups([])`, `setgid`, `setuid`, in that order; the
//! id was cleared of any earlier holder before the first rank got it), and gets
//! `HOME` set to its work directory; when it ends, the node takes its work
//! directory back (owner root, mode 0700) and gives back its share of the id; the
//! attempt's last rank to end kills what still runs as the id and removes its
//! scratch files before the id returns, so a later holder of the id can read
//! nothing of it. It dies with the node
//! (`PR_SET_PDEATHSIG`, armed after the switch, which would clear it), and has
//! its stdout and stderr written to one capped log (`worker_log`) in whole
//! chunks, cut at line ends where a line ends soon enough, so the two streams
//! interleave by lines.
//! Metric lines on stdout become reports as they arrive; checkpoint lines are
//! handed to `checkpoint::CheckpointWatch`. Lines are split by a bounded
//! splitter, so a line too long to parse is skipped and the next one is parsed.
//!
//! Not here: preparing a launch (the agent resolves the program and restores the
//! checkpoint it resumes from), and storing or reporting checkpoints (the
//! `checkpoint` module); this module only says where the worker's checkpoint
//! directory is and waits for a checkpoint in flight before reporting the exit.
//!
//! Invariants: only this module spawns trial processes; a worker's metric and
//! checkpoint reports are sent before its exit report, unless its output stays
//! open (a grandchild holds it) past the drain grace; its log is complete on disk
//! before its exit report is sent.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use nix::sys::signal::Signal;
use nix::unistd::Pid;
use tokio::io::{AsyncRead, AsyncReadExt};
use tokio::sync::{mpsc, oneshot};
use tracing::{debug, info, warn};
use xp_runtime::clock::{Clock, SystemClock};
use xp_runtime::error_chain::error_chain;
use xp_runtime::ids::WorkerKey;
use xp_runtime::metric_line::{
    CHECKPOINT_PREFIX, MAX_METRIC_LINE, METRIC_PREFIX, parse_metric_line,
};
use xp_runtime::protocol::{Launch, WorkerReport};

use crate::cgroup::{Cgroups, Limits, WorkerCgroup};
use crate::checkpoint::{self, CheckpointSink, CheckpointWatch};
use crate::isolation::UidLease;
use crate::telemetry::eviction::Eviction;
use crate::worker_log::lines::{Line, LineSplitter};
use crate::worker_log::{self, LogCap, LogSender};

/// How long a worker has between SIGTERM and SIGKILL.
pub(crate) const KILL_GRACE: Duration = Duration::from_secs(5);

/// How long a worker that ended on SIGTERM, which nobody on the node sent, waits
/// for the node to notice a drain (the same signal reaching it).
const SIGTERM_DRAIN_WAIT: Duration = Duration::from_secs(1);

/// Whether a worker ended on SIGTERM: killed by it, or exiting 143 (128 + 15), as
/// shells and the SDK do on it.
fn ended_on_sigterm(status: &std::process::ExitStatus) -> bool {
    use std::os::unix::process::ExitStatusExt;
    status.signal() == Some(libc::SIGTERM) || status.code() == Some(128 + libc::SIGTERM)
}
/// The longest grace the head may ask for (a preempted trial checkpointing).
pub(crate) const MAX_KILL_GRACE: Duration = Duration::from_secs(600);

/// How long an oversubscribed worker evicted for GPU memory has between
/// SIGTERM and SIGKILL to save its checkpoint: shorter than a preemption's
/// usual grace, since the GPU's memory is running out meanwhile.
pub(crate) const EVICTION_GRACE: Duration = Duration::from_secs(30);

/// Why and how gently to stop a worker.
#[derive(Debug, Clone)]
pub(crate) struct StopRequest {
    /// For the log and the report.
    pub reason: String,
    /// How long after SIGTERM before SIGKILL.
    pub grace: Duration,
    /// The node stops it on its own for GPU memory: its end is reported
    /// `Evicted`, not `Stopped`.
    pub eviction: Option<Eviction>,
}

impl StopRequest {
    /// A stop with the default grace.
    pub(crate) fn new(reason: impl Into<String>) -> Self {
        Self {
            reason: reason.into(),
            grace: KILL_GRACE,
            eviction: None,
        }
    }

    /// A stop with `grace`, on the head's order or for the node's own reasons.
    pub(crate) fn with_grace(reason: impl Into<String>, grace: Duration) -> Self {
        Self {
            reason: reason.into(),
            grace,
            eviction: None,
        }
    }

    /// An eviction for GPU memory, with [`EVICTION_GRACE`].
    pub(crate) fn evict(eviction: Eviction) -> Self {
        Self {
            reason: format!(
                "evicted for GPU memory: GPU {} at {:.1}% of its memory",
                eviction.gpu.index,
                eviction.percent()
            ),
            grace: EVICTION_GRACE,
            eviction: Some(eviction),
        }
    }
}
/// How long to wait for output after the process exited (a grandchild may hold the pipes).
const DRAIN_GRACE: Duration = Duration::from_secs(2);
/// How much one read takes from a worker's pipe at most (besides what is held).
const READ_CHUNK: usize = 64 * 1024;
/// How long the end of a line still being printed is held back from the log, so
/// that stdout and stderr interleave by whole lines.
const PARTIAL_LINE_WAIT: Duration = Duration::from_millis(50);
/// The longest line end held back; a longer one goes to the log as it is.
const MAX_PARTIAL_LINE: usize = 64 * 1024;

/// Why a worker process could not be started.
#[derive(Debug, thiserror::Error)]
enum SpawnError {
    /// A directory the worker needs could not be created.
    #[error("cannot create {path}")]
    CreateDir {
        /// The directory.
        path: PathBuf,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// The program could not be executed.
    #[error("cannot start {program}")]
    Start {
        /// The program.
        program: PathBuf,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
}

/// What to execute for one worker, resolved by the agent.
#[derive(Debug)]
pub(crate) struct WorkerCommand {
    /// The program.
    pub program: PathBuf,
    /// Its arguments.
    pub args: Vec<String>,
    /// Extra environment (`XP_ENTRY` for Rust trainables).
    pub extra_env: Vec<(String, String)>,
    /// The combined stdout/stderr log (its head file; see `worker_log`).
    pub log_path: PathBuf,
    /// A scratch directory for the worker (`XP_WORK_DIR`).
    pub work_dir: PathBuf,
    /// Its checkpoint directory and the store its checkpoints go to.
    pub checkpoint: CheckpointSink,
    /// Its share of the user id its attempt's ranks run as, when they have one of
    /// their own; given back after the worker and everything in its cgroup are
    /// gone.
    pub uid: Option<UidLease>,
    /// Its output directory (`XP_OUTPUT_DIR`) and where rank 0's outputs go.
    pub output: OutputSink,
    /// The directory holding its pipeline inputs (`XP_INPUT_DIR`), when it has any.
    pub input_dir: Option<PathBuf>,
}

/// Where a worker's output files go: its `XP_OUTPUT_DIR`, taken into the
/// node's store when rank 0 exits with status 0.
#[derive(Debug, Clone)]
pub(crate) struct OutputSink {
    /// The directory (`XP_OUTPUT_DIR`).
    pub dir: PathBuf,
    /// The node's object store.
    pub store: std::sync::Arc<crate::objects::ObjectStore>,
    /// The worker's id, which must own every file taken.
    pub owner: Option<crate::isolation::fs::FileOwner>,
    /// The most files and bytes taken.
    pub limits: checkpoint::OutputLimits,
    /// Whether the files are taken at all (`Launch::collect_outputs`: a
    /// pipeline stage's trial); otherwise the directory is scratch space.
    pub collect: bool,
}

/// The environment contract of a worker process (documented in ARCHITECTURE.md).
pub(crate) fn worker_env(launch: &Launch) -> Vec<(String, String)> {
    let gpus: Vec<String> = launch.gpu_indices.iter().map(u32::to_string).collect();
    vec![
        ("XP_TRIAL_ID".to_owned(), launch.key.trial.to_string()),
        ("XP_ATTEMPT".to_owned(), launch.key.attempt.to_string()),
        ("XP_CONFIG".to_owned(), launch.config_json.clone()),
        ("XP_SEED".to_owned(), launch.seed.to_string()),
        ("XP_RANK".to_owned(), launch.key.rank.to_string()),
        ("XP_WORLD_SIZE".to_owned(), launch.world_size.to_string()),
        ("XP_LOCAL_RANK".to_owned(), launch.local_rank.to_string()),
        ("CUDA_VISIBLE_DEVICES".to_owned(), gpus.join(",")),
        ("MASTER_ADDR".to_owned(), launch.master_addr.clone()),
        ("MASTER_PORT".to_owned(), launch.master_port.to_string()),
        ("RANK".to_owned(), launch.key.rank.to_string()),
        ("WORLD_SIZE".to_owned(), launch.world_size.to_string()),
        ("LOCAL_RANK".to_owned(), launch.local_rank.to_string()),
        (
            "XP_COLLECTIVE_TOKEN".to_owned(),
            hex::encode(launch.collective_token),
        ),
        (
            "XP_COLLECTIVE_TRANSPORT".to_owned(),
            launch.transport.as_str().to_owned(),
        ),
        // The share of its GPU a fractional worker may use (for example with
        // torch.cuda.set_per_process_memory_fraction); 1 for whole GPUs.
        (
            "XP_GPU_FRACTION".to_owned(),
            format!("{}", f64::from(launch.gpu_milli.min(1000)) / 1000.0),
        ),
    ]
}

/// Runs one worker to its end and reports on `reports`: `Started` (or
/// `LaunchFailed`), its metrics, then `Exited`. A message on `stop` ends it:
/// SIGTERM to its process group, SIGKILL after [`KILL_GRACE`], and the final
/// report is `Stopped` with that message. Its output is kept under `log_cap`.
///
/// A worker that ends unsuccessfully on its own once `node_draining` is
/// cancelled is reported `Stopped` too: a job manager ending the node's job
/// (Slurm's `scancel`, or the job's time limit) signals every process of the
/// job, so the worker may get SIGTERM from it before the node asks, and it is
/// stopped by the drain, not failed.
pub(crate) async fn supervise(
    launch: Launch,
    mut command: WorkerCommand,
    log_cap: LogCap,
    reports: mpsc::UnboundedSender<WorkerReport>,
    stop: oneshot::Receiver<StopRequest>,
    telemetry: crate::telemetry::Targets,
    node_draining: tokio_util::sync::CancellationToken,
) {
    let key = launch.key;
    let cgroup = worker_cgroup(&launch);
    let procs_files = cgroup
        .as_ref()
        .map(WorkerCgroup::procs_files)
        .unwrap_or_default();
    let mut child = match spawn(&launch, &command, procs_files).await {
        Ok(child) => child,
        Err(error) => {
            if let Some(cgroup) = cgroup {
                cgroup.remove().await;
            }
            take_back(&mut command).await;
            warn!(worker = %key, error = %error_chain(&error), "worker could not start");
            let _ = reports.send(WorkerReport::LaunchFailed {
                key,
                error: error_chain(&error),
            });
            return;
        }
    };
    // One writer per worker, fed by both streams' pumps; its log exists before
    // the worker is reported started, so `xp logs` finds it from then on.
    let (log, log_writer) = worker_log::start(command.log_path.clone(), log_cap).await;
    let pid = child.id().unwrap_or_default();
    info!(worker = %key, pid, "worker started");
    let _ = reports.send(WorkerReport::Started { key, pid });
    // Sampled by telemetry until this function returns.
    let _sampled = telemetry.register(
        key,
        crate::telemetry::Target {
            pid,
            cgroup: cgroup.as_ref().map(WorkerCgroup::telemetry_files),
            gpu_indices: launch.gpu_indices.clone(),
            oversubscribed: oversubscribes(&launch),
            started_at: SystemClock.now(),
        },
    );
    let checkpoints = CheckpointWatch::new(command.checkpoint.clone(), key, reports.clone());
    let checkpoint_in_flight = checkpoints.in_flight();
    let stdout = child.stdout.take().map(|stdout| {
        let log = log.clone();
        let trial = TrialOutput {
            key,
            reports: reports.clone(),
            checkpoints,
            index: 0,
        };
        xp_runtime::task::spawn("worker-stdout", pump(stdout, log, Some(trial)))
    });
    let stderr = child
        .stderr
        .take()
        .map(|stderr| xp_runtime::task::spawn("worker-stderr", pump(stderr, log.clone(), None)));
    drop(log);

    let mut stopped_because = None;
    let mut evicted = None;
    let status = tokio::select! {
        status = child.wait() => {
            let succeeded = status.as_ref().is_ok_and(std::process::ExitStatus::success);
            // Slurm signals every process of the job at once, so a worker may die
            // of the job's SIGTERM a moment before the node's own signal task marks
            // the drain; such a worker waits a little for it, or it would count as
            // a failure and use a retry.
            if !succeeded
                && !node_draining.is_cancelled()
                && status.as_ref().is_ok_and(ended_on_sigterm)
            {
                let _ = tokio::time::timeout(SIGTERM_DRAIN_WAIT, node_draining.cancelled()).await;
            }
            if node_draining.is_cancelled() && !succeeded {
                info!(worker = %key, "worker ended while the node drains; reported stopped");
                stopped_because = Some("node draining (the worker ended on its job's signal)".to_owned());
            }
            status
        }
        request = stop => {
            let StopRequest { reason, grace, eviction } =
                request.unwrap_or_else(|_| StopRequest::new("node shutting down"));
            info!(worker = %key, %reason, ?grace, "stopping worker");
            stopped_because = Some(reason);
            evicted = eviction;
            signal_group(pid, Signal::SIGTERM);
            match tokio::time::timeout(grace, child.wait()).await {
                Ok(status) => status,
                Err(_) => {
                    warn!(worker = %key, "worker ignored SIGTERM; killing it");
                    signal_group(pid, Signal::SIGKILL);
                    child.wait().await
                }
            }
        }
    };
    // The process is gone; make sure nothing it started outlives it.
    signal_group(pid, Signal::SIGKILL);
    if let Some(cgroup) = &cgroup {
        cgroup.kill_all().await;
    }
    for mut pump_task in [stdout, stderr].into_iter().flatten() {
        if tokio::time::timeout(DRAIN_GRACE, &mut pump_task)
            .await
            .is_ok()
        {
            continue;
        }
        if checkpoint_in_flight.is_set() {
            info!(worker = %key, "waiting for the last checkpoint to be stored");
            if tokio::time::timeout(checkpoint::DRAIN_GRACE, &mut pump_task)
                .await
                .is_ok()
            {
                continue;
            }
        }
        debug!(worker = %key, "output still open after exit; stopped reading it");
        pump_task.abort();
        let _ = pump_task.await;
    }
    // Every pump has ended and dropped its sender: the writer finishes the log.
    if let Err(error) = log_writer.await {
        warn!(worker = %key, %error, "the worker log's writer failed");
    }
    let (code, signal) = match status {
        Ok(status) => {
            use std::os::unix::process::ExitStatusExt;
            (status.code(), status.signal())
        }
        Err(error) => {
            warn!(worker = %key, %error, "cannot read the worker's exit status");
            (None, None)
        }
    };
    info!(worker = %key, ?code, ?signal, "worker exited");
    let mut oom_limit = None;
    let had_cgroup = cgroup.is_some();
    if let Some(cgroup) = cgroup {
        let limits = cgroup.limits();
        if limits.memory_bytes > 0 && cgroup.oom_kills() > 0 {
            oom_limit = Some(limits.memory_bytes);
        }
        cgroup.remove().await;
    }
    if command.uid.is_some() && !had_cgroup {
        // What escaped the process group runs until the attempt's last rank
        // here ends and its id is scrubbed: killing all of the id now would
        // kill this rank's siblings.
        debug!(worker = %key, "no cgroup: leftovers of this rank go with its attempt's user id");
    }
    if key.rank == 0 && command.output.collect && stopped_because.is_none() && code == Some(0) {
        // Before the exit report, so the head has the outputs when the trial succeeds.
        let _ = reports.send(take_outputs(key, &command.output).await);
    }
    take_back(&mut command).await;
    let report = match (stopped_because, oom_limit) {
        (Some(_), _) if let Some(eviction) = evicted => WorkerReport::Evicted {
            key,
            gpu: eviction.gpu.index,
            used_bytes: eviction.gpu.used_bytes,
            total_bytes: eviction.gpu.total_bytes,
        },
        (Some(reason), _) => WorkerReport::Stopped { key, reason },
        // A worker that caught the kill of one of its processes and succeeded anyway succeeded.
        (None, Some(limit_bytes)) if code != Some(0) => {
            warn!(worker = %key, limit_bytes, "worker killed for going over its memory limit");
            WorkerReport::OomKilled {
                key,
                code,
                signal,
                limit_bytes,
            }
        }
        (None, _) => WorkerReport::Exited { key, code, signal },
    };
    let _ = reports.send(report);
}

/// Whether a launch opted its worker in to oversubscription: a fraction of one
/// GPU placed under a factor above 1, which its node may evict for GPU memory.
pub(crate) fn oversubscribes(launch: &Launch) -> bool {
    launch.oversubscription_milli > 1000 && launch.gpu_milli > 0 && launch.gpu_milli < 1000
}

/// Stores rank 0's output files and says which, or why they were not kept.
async fn take_outputs(key: WorkerKey, sink: &OutputSink) -> WorkerReport {
    let sink = sink.clone();
    let taken = tokio::task::spawn_blocking(move || {
        checkpoint::take_outputs(&sink.store, &sink.dir, sink.owner, key.trial, sink.limits)
    })
    .await;
    let (files, error) = match taken {
        Ok(Ok(files)) => {
            info!(worker = %key, files = files.len(), "outputs stored");
            (files, None)
        }
        Ok(Err(error)) => (Vec::new(), Some(error_chain(&error))),
        Err(error) => (Vec::new(), Some(error.to_string())),
    };
    if let Some(error) = &error {
        warn!(worker = %key, %error, "outputs not kept");
    }
    WorkerReport::Outputs { key, files, error }
}

/// The worker's cgroup with its launch's limits, if the node has cgroups; a
/// worker whose cgroup cannot be made runs without one (said at warn level).
fn worker_cgroup(launch: &Launch) -> Option<WorkerCgroup> {
    let limits = Limits {
        cpu_milli: launch.cpu_milli,
        memory_bytes: launch.memory_bytes,
    };
    match Cgroups::get()?.create(launch.key, limits) {
        Ok(cgroup) => Some(cgroup),
        Err(error) => {
            warn!(worker = %launch.key, error = %error_chain(&error), "worker runs without a cgroup (no limits)");
            None
        }
    }
}

/// Takes a worker's work directory back from its attempt's user id once the
/// worker is gone (owner root, mode 0700, by descriptor: the directory itself
/// cannot be swapped, as its parent is the node's), then gives back its share of
/// the id. The attempt's last rank to do so scrubs the id (everything still
/// running as it killed, what it left at the top of `/tmp`, `/var/tmp` and
/// `/dev/shm` removed) and returns it before this ends, so the next attempt given
/// the id finds nothing of this one.
async fn take_back(command: &mut WorkerCommand) {
    // Only an id of the attempt's own: never the node's.
    let Some(lease) = command.uid.take() else {
        return;
    };
    let work_dir = command.work_dir.clone();
    let taken =
        tokio::task::spawn_blocking(move || crate::isolation::take_back_dir(&work_dir)).await;
    if let Ok(Err(error)) | Err(error) = taken.map_err(std::io::Error::other) {
        warn!(dir = %command.work_dir.display(), %error, "cannot take a finished worker's work directory back from its user id");
    }
    lease.give_back().await;
}

/// Starts the worker's process. With `procs_files` the child moves itself into
/// its cgroup before it execs, so nothing it runs or starts is ever outside it
/// (moving it after the spawn would race with its first fork); with a user id of
/// its own it then drops root for it.
async fn spawn(
    launch: &Launch,
    command: &WorkerCommand,
    procs_files: Vec<std::ffi::CString>,
) -> Result<tokio::process::Child, SpawnError> {
    let create_dir = |path: &Path| {
        let path = path.to_owned();
        move |source| SpawnError::CreateDir { path, source }
    };
    if let Some(parent) = command.log_path.parent() {
        tokio::fs::create_dir_all(parent)
            .await
            .map_err(create_dir(parent))?;
    }
    // The agent made them for the worker's id; these only cover a missing one
    // (when the node runs workers as itself).
    for dir in [
        &command.work_dir,
        &command.checkpoint.dir,
        &command.output.dir,
    ] {
        if !tokio::fs::try_exists(dir).await.unwrap_or(false) {
            tokio::fs::create_dir_all(dir)
                .await
                .map_err(create_dir(dir))?;
        }
    }
    let uid = command.uid.as_ref().map(UidLease::uid);
    let mut process = tokio::process::Command::new(&command.program);
    process
        .args(&command.args)
        // A credential in the node's own environment (a user's `XP_CLUSTER`, which
        // `sbatch` and `srun` pass on) must never reach trial code.
        .env_remove("XP_CLUSTER")
        .envs(worker_env(launch))
        .envs(command.extra_env.iter().cloned())
        .env("XP_WORK_DIR", &command.work_dir)
        .env("XP_CHECKPOINT_DIR", &command.checkpoint.dir)
        .env("XP_OUTPUT_DIR", &command.output.dir)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .process_group(0);
    if let Some(inputs) = &command.input_dir {
        process.env("XP_INPUT_DIR", inputs);
    }
    if uid.is_some() {
        // An id made for the worker has no home of its own; the node's is not its.
        process.env("HOME", &command.work_dir);
    }
    let node_pid = std::process::id() as libc::pid_t;
    // SAFETY: between fork and exec the closure only calls open(2), write(2),
    // close(2), setgroups(2), setgid(2), setuid(2), prctl(2) and
    // getppid(2), which are async-signal-safe, on data made before the fork; the
    // child has one thread, so setuid needs no cross-thread broadcast. Nothing in
    // it allocates (errors are raw errno values), as the forked child of a
    // multi-threaded process may not.
    unsafe {
        process.pre_exec(move || {
            // Entering the cgroup needs root: first.
            crate::cgroup::enter(&procs_files)?;
            if let Some(uid) = uid {
                drop_to(uid)?;
            }
            // After the switch, which clears it.
            nix::sys::prctl::set_pdeathsig(Signal::SIGKILL).map_err(std::io::Error::from)?;
            if libc::getppid() != node_pid {
                // The node died before the death signal was armed. No
                // allocation here (this is between fork and exec): a plain errno.
                return Err(std::io::Error::from_raw_os_error(libc::ESRCH));
            }
            Ok(())
        });
    }
    // A driver binary another task has just written may still be open for
    // writing in a child some other thread forked meanwhile (the descriptor
    // lives until that child execs), and exec then fails with ETXTBSY: a few
    // short retries outlast that window.
    let mut busy_retries = 0;
    loop {
        match process.spawn() {
            Ok(child) => return Ok(child),
            Err(source)
                if source.raw_os_error() == Some(libc::ETXTBSY)
                    && busy_retries < SPAWN_BUSY_RETRIES =>
            {
                busy_retries += 1;
                debug!(program = %command.program.display(), busy_retries, "the program is still open for writing somewhere; retrying");
                tokio::time::sleep(Duration::from_millis(20 * u64::from(busy_retries))).await;
            }
            Err(source) => {
                return Err(SpawnError::Start {
                    program: command.program.clone(),
                    source,
                });
            }
        }
    }
}

/// How many times a spawn that fails with ETXTBSY is tried again (about a
/// second in all).
const SPAWN_BUSY_RETRIES: u32 = 10;

/// Drops every privilege for user and group id `uid`: no supplementary groups,
/// then the group, then the user (the other way round, the group could no longer
/// be changed), and no new privileges from then on. Called between fork and exec. It kills nothing: sibling ranks of
/// the attempt may already run as `uid`, and what an earlier holder left was
/// killed before the id was handed out (`UidLease::ready`).
fn drop_to(uid: u32) -> std::io::Result<()> {
    let check = |result: libc::c_int| {
        if result == 0 {
            Ok(())
        } else {
            Err(std::io::Error::last_os_error())
        }
    };
    // SAFETY: plain system calls on integers; setgroups reads no memory for 0 groups.
    unsafe {
        check(libc::setgroups(0, std::ptr::null()))?;
        check(libc::setgid(uid))?;
        check(libc::setuid(uid))?;
        // So that nothing the worker runs regains privileges through a setuid
        // or file-capability binary (sudo in a trial is not a feature).
        check(libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0))?;
    }
    Ok(())
}

fn signal_group(pid: u32, signal: Signal) {
    if pid == 0 {
        return;
    }
    // The worker leads its own process group, so its group id is its pid.
    let _ = nix::sys::signal::killpg(Pid::from_raw(pid as i32), signal);
}

/// Where a stdout pump sends what the trial reports.
struct TrialOutput {
    key: WorkerKey,
    reports: mpsc::UnboundedSender<WorkerReport>,
    /// What the trial's checkpoint lines are handed to.
    checkpoints: CheckpointWatch,
    /// The number of the last metric report.
    index: u64,
}

impl TrialOutput {
    /// The text of a line worth parsing: a metric or checkpoint line.
    fn wanted(&self, line: Line<'_>) -> Option<String> {
        let is_wanted = |bytes: &[u8]| {
            bytes.starts_with(METRIC_PREFIX.as_bytes())
                || bytes.starts_with(CHECKPOINT_PREFIX.as_bytes())
        };
        match line {
            Line::Whole(bytes) if is_wanted(bytes) => match std::str::from_utf8(bytes) {
                Ok(text) => Some(text.to_owned()),
                Err(_) => {
                    warn!(worker = %self.key, "metric or checkpoint line that is not UTF-8 ignored");
                    None
                }
            },
            Line::Whole(_) => None,
            Line::TooLong { start, len } => {
                if is_wanted(start) {
                    warn!(worker = %self.key, len, max = MAX_METRIC_LINE, "metric or checkpoint line too long; ignored");
                }
                None
            }
        }
    }

    /// Reports a metric line, or hands a checkpoint line to the watch (which
    /// notes the outcome in `log`).
    async fn handle(&mut self, text: &str, log: &LogSender) {
        if self.checkpoints.handle_line(text, Some(log)).await {
            return;
        }
        match parse_metric_line(text) {
            Ok(Some(report)) => {
                self.index += 1;
                let _ = self.reports.send(WorkerReport::Metric {
                    key: self.key,
                    index: self.index,
                    step: report.step,
                    values: report.values.into_iter().collect(),
                });
            }
            Ok(None) => {}
            Err(error) => warn!(worker = %self.key, %error, "metric line ignored"),
        }
    }
}

/// Copies a worker's output stream to its log in whole chunks; on stdout
/// (`trial` given) also parses each metric and checkpoint line as it ends. A
/// chunk is cut after its last newline and the rest held back until the line
/// ends, for at most [`PARTIAL_LINE_WAIT`] and [`MAX_PARTIAL_LINE`] bytes. The
/// bytes before a checkpoint line's end go to the log before the watch's note.
async fn pump(mut reader: impl AsyncRead + Unpin, log: LogSender, mut trial: Option<TrialOutput>) {
    let mut lines = LineSplitter::new(MAX_METRIC_LINE);
    // Output read but not yet sent to the log.
    let mut pending: Vec<u8> = Vec::new();
    loop {
        pending.reserve(READ_CHUNK);
        let read = if pending.is_empty() {
            reader.read_buf(&mut pending).await
        } else {
            // `read_buf` is cancel safe: on timeout nothing was read.
            match tokio::time::timeout(PARTIAL_LINE_WAIT, reader.read_buf(&mut pending)).await {
                Ok(read) => read,
                Err(_) => {
                    log.write(std::mem::take(&mut pending)).await;
                    continue;
                }
            }
        };
        let fresh = match read {
            Ok(0) => break,
            Ok(fresh) => fresh,
            Err(error) => {
                debug!(%error, "worker output read failed");
                break;
            }
        };
        if let Some(trial) = trial.as_mut() {
            let mut at = pending.len() - fresh;
            while at < pending.len() {
                let (taken, line) = lines.next(&pending[at..]);
                at += taken;
                let Some(text) = line.and_then(|line| trial.wanted(line)) else {
                    continue;
                };
                if text.starts_with(CHECKPOINT_PREFIX) {
                    let rest = pending.split_off(at);
                    log.write(std::mem::replace(&mut pending, rest)).await;
                    at = 0;
                }
                trial.handle(&text, &log).await;
            }
        }
        let held = pending
            .iter()
            .rposition(|byte| *byte == b'\n')
            .map_or(pending.len(), |newline| pending.len() - newline - 1);
        let cut = if held > MAX_PARTIAL_LINE {
            pending.len()
        } else {
            pending.len() - held
        };
        if cut > 0 {
            let rest = pending.split_off(cut);
            log.write(std::mem::replace(&mut pending, rest)).await;
        }
    }
    log.write(pending).await;
    if let Some(trial) = trial.as_mut()
        && let Some(text) = lines.finish().and_then(|line| trial.wanted(line))
    {
        trial.handle(&text, &log).await;
    }
}

#[cfg(test)]
mod tests {
    use std::os::unix::process::ExitStatusExt;
    use std::process::ExitStatus;

    use super::ended_on_sigterm;

    #[test]
    fn sigterm_endings_are_recognised() {
        // A raw wait status: the low 7 bits are the killing signal, the next
        // byte the exit code.
        assert!(ended_on_sigterm(&ExitStatus::from_raw(libc::SIGTERM)));
        assert!(ended_on_sigterm(&ExitStatus::from_raw(143 << 8)));
        assert!(!ended_on_sigterm(&ExitStatus::from_raw(libc::SIGKILL)));
        assert!(!ended_on_sigterm(&ExitStatus::from_raw(1 << 8)));
        assert!(!ended_on_sigterm(&ExitStatus::from_raw(0)));
    }
}
