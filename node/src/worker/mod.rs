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

mod exec_check;
mod output;
mod spawn;

use std::path::PathBuf;
use std::time::Duration;

use nix::sys::signal::Signal;
use nix::unistd::Pid;
use tokio::sync::{mpsc, oneshot};
use tracing::{debug, info, warn};
use xp_runtime::clock::{Clock, SystemClock};
use xp_runtime::error_chain::error_chain;
use xp_runtime::ids::WorkerKey;
use xp_runtime::protocol::{Launch, WorkerReport};

use crate::cgroup::{Cgroups, Limits, WorkerCgroup};
use crate::checkpoint::{self, CheckpointSink, CheckpointWatch};
use crate::isolation::UidLease;
use crate::telemetry::eviction::Eviction;
use crate::worker_log::{self, LogCap};

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

/// What to execute for one worker, resolved by the agent.
#[derive(Debug)]
pub(crate) struct WorkerCommand {
    /// The program.
    pub program: PathBuf,
    /// Its arguments.
    pub args: Vec<String>,
    /// The arguments that name files or directories in the command's directory
    /// (made absolute), which the worker must be able to read.
    pub path_args: Vec<PathBuf>,
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
    /// Rank 0's `MASTER_PORT`, let go by the node for it; taken back when this
    /// command is dropped, after the worker is gone.
    pub master_port: Option<crate::isolation::ports::PortLease>,
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
///
/// The steps: [`start`] the process and its output pumps, wait for its end
/// ([`wait_for_end`]), [`Running::finish_output`], remove its cgroup (which
/// says whether the kernel killed it for memory), store rank 0's outputs, take
/// its work directory back, and report its [`final_report`].
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
    let Some(mut running) = start(&launch, &mut command, log_cap, &reports, &telemetry).await
    else {
        return;
    };
    let ending = wait_for_end(key, &mut running, stop, &node_draining).await;
    running.finish_output(key).await;
    let (code, signal) = match &ending.status {
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
    let oom_limit = remove_cgroup(running.cgroup.take()).await;
    if command.uid.is_some() && !running.had_cgroup {
        // What escaped the process group runs until the attempt's last rank
        // here ends and its id is scrubbed: killing all of the id now would
        // kill this rank's siblings.
        debug!(worker = %key, "no cgroup: leftovers of this rank go with its attempt's user id");
    }
    if key.rank == 0
        && command.output.collect
        && ending.stopped_because.is_none()
        && code == Some(0)
    {
        // Before the exit report, so the head has the outputs when the trial succeeds.
        let _ = reports.send(take_outputs(key, &command.output).await);
    }
    take_back(&mut command).await;
    let exit = Exit {
        code,
        signal,
        stderr_tail: &running.stderr_tail,
    };
    let _ = reports.send(final_report(key, ending, oom_limit, exit));
}

/// How a worker's process exited on its own, and the end of its stderr.
struct Exit<'a> {
    code: Option<i32>,
    signal: Option<i32>,
    stderr_tail: &'a output::StderrTail,
}

/// A worker process that started, and what watches it.
struct Running {
    child: tokio::process::Child,
    pid: u32,
    /// Its cgroup, until it is removed.
    cgroup: Option<WorkerCgroup>,
    had_cgroup: bool,
    /// The stdout and stderr pumps.
    pumps: [Option<tokio::task::JoinHandle<()>>; 2],
    /// Ends once both pumps have ended, with the log complete on disk.
    log_writer: tokio::task::JoinHandle<()>,
    /// Set while a checkpoint the worker printed is being stored.
    checkpoint_in_flight: checkpoint::InFlight,
    /// The end of its stderr, for a failed exit's report.
    stderr_tail: output::StderrTail,
    /// Keeps the worker sampled by telemetry until it is reported ended.
    _sampled: crate::telemetry::TargetGuard,
}

/// Starts `launch`'s process in its cgroup, its log and its output pumps, and
/// reports it `Started`; `None` (reported `LaunchFailed`) when it cannot start.
async fn start(
    launch: &Launch,
    command: &mut WorkerCommand,
    log_cap: LogCap,
    reports: &mpsc::UnboundedSender<WorkerReport>,
    telemetry: &crate::telemetry::Targets,
) -> Option<Running> {
    let key = launch.key;
    let cgroup = worker_cgroup(launch);
    let procs_files = cgroup
        .as_ref()
        .map(WorkerCgroup::procs_files)
        .unwrap_or_default();
    let mut child = match spawn::spawn(launch, command, procs_files).await {
        Ok(child) => child,
        Err(error) => {
            if let Some(cgroup) = cgroup {
                cgroup.remove().await;
            }
            take_back(command).await;
            warn!(worker = %key, error = %error_chain(&error), "worker could not start");
            let _ = reports.send(WorkerReport::LaunchFailed {
                key,
                error: error_chain(&error),
            });
            return None;
        }
    };
    // One writer per worker, fed by both streams' pumps; its log exists before
    // the worker is reported started, so `xp logs` finds it from then on.
    let (log, log_writer) = worker_log::start(command.log_path.clone(), log_cap).await;
    let pid = child.id().unwrap_or_default();
    info!(worker = %key, pid, "worker started");
    let _ = reports.send(WorkerReport::Started { key, pid });
    // Sampled by telemetry until `supervise` returns.
    let sampled = telemetry.register(
        key,
        crate::telemetry::Target {
            pid,
            cgroup: cgroup.as_ref().map(WorkerCgroup::telemetry_files),
            gpu_indices: launch.gpu_indices.clone(),
            oversubscribed: oversubscribes(launch),
            started_at: SystemClock.now(),
        },
    );
    let checkpoints = CheckpointWatch::new(command.checkpoint.clone(), key, reports.clone());
    let checkpoint_in_flight = checkpoints.in_flight();
    let stderr_tail = output::StderrTail::default();
    let pumps = output::start_pumps(
        &mut child,
        key,
        log,
        reports,
        checkpoints,
        stderr_tail.clone(),
    );
    Some(Running {
        stderr_tail,
        child,
        pid,
        had_cgroup: cgroup.is_some(),
        cgroup,
        pumps,
        log_writer,
        checkpoint_in_flight,
        _sampled: sampled,
    })
}

/// How a worker's process ended.
struct Ending {
    status: std::io::Result<std::process::ExitStatus>,
    /// It was stopped (by the node, or by the drain's signal): why.
    stopped_because: Option<String>,
    /// It was stopped for GPU memory.
    evicted: Option<Eviction>,
}

/// Waits until the process ends on its own or `stop` asks it to: SIGTERM to
/// its group, SIGKILL after the request's grace.
async fn wait_for_end(
    key: WorkerKey,
    running: &mut Running,
    stop: oneshot::Receiver<StopRequest>,
    node_draining: &tokio_util::sync::CancellationToken,
) -> Ending {
    let child = &mut running.child;
    tokio::select! {
        status = child.wait() => ended_on_its_own(key, status, node_draining).await,
        request = stop => {
            let StopRequest { reason, grace, eviction } =
                request.unwrap_or_else(|_| StopRequest::new("node shutting down"));
            info!(worker = %key, %reason, ?grace, "stopping worker");
            signal_group(running.pid, Signal::SIGTERM);
            let status = match tokio::time::timeout(grace, child.wait()).await {
                Ok(status) => status,
                Err(_) => {
                    warn!(worker = %key, "worker ignored SIGTERM; killing it");
                    signal_group(running.pid, Signal::SIGKILL);
                    child.wait().await
                }
            };
            Ending { status, stopped_because: Some(reason), evicted: eviction }
        }
    }
}

/// A process that ended without being asked: stopped rather than failed when
/// the node drains (see [`supervise`]).
async fn ended_on_its_own(
    key: WorkerKey,
    status: std::io::Result<std::process::ExitStatus>,
    node_draining: &tokio_util::sync::CancellationToken,
) -> Ending {
    let succeeded = status.as_ref().is_ok_and(std::process::ExitStatus::success);
    // Slurm signals every process of the job at once, so a worker may die of the
    // job's SIGTERM a moment before the node's own signal task marks the drain;
    // such a worker waits a little for it, or it would count as a failure and
    // use a retry.
    if !succeeded && !node_draining.is_cancelled() && status.as_ref().is_ok_and(ended_on_sigterm) {
        let _ = tokio::time::timeout(SIGTERM_DRAIN_WAIT, node_draining.cancelled()).await;
    }
    let mut stopped_because = None;
    if node_draining.is_cancelled() && !succeeded {
        info!(worker = %key, "worker ended while the node drains; reported stopped");
        stopped_because = Some("node draining (the worker ended on its job's signal)".to_owned());
    }
    Ending {
        status,
        stopped_because,
        evicted: None,
    }
}

impl Running {
    /// The process is gone: kills what it left (its group, its cgroup), reads
    /// its output to the end (waiting for a checkpoint in flight, within
    /// bounds), and waits until its log is complete on disk.
    async fn finish_output(&mut self, key: WorkerKey) {
        signal_group(self.pid, Signal::SIGKILL);
        if let Some(cgroup) = &self.cgroup {
            cgroup.kill_all().await;
        }
        for mut pump_task in self.pumps.iter_mut().filter_map(Option::take) {
            if tokio::time::timeout(DRAIN_GRACE, &mut pump_task)
                .await
                .is_ok()
            {
                continue;
            }
            if self.checkpoint_in_flight.is_set() {
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
        if let Err(error) = (&mut self.log_writer).await {
            warn!(worker = %key, %error, "the worker log's writer failed");
        }
    }
}

/// Removes a worker's cgroup once it is empty; returns its memory limit when
/// the kernel killed one of its processes for going over it.
async fn remove_cgroup(cgroup: Option<WorkerCgroup>) -> Option<u64> {
    let cgroup = cgroup?;
    let limits = cgroup.limits();
    let oom_limit =
        (limits.memory_bytes > 0 && cgroup.oom_kills() > 0).then_some(limits.memory_bytes);
    cgroup.remove().await;
    oom_limit
}

/// The report that ends a worker: evicted or stopped when it was asked to stop,
/// killed for memory when it failed over its limit, else exited (with the last
/// lines of its stderr when it failed and wrote any).
fn final_report(
    key: WorkerKey,
    ending: Ending,
    oom_limit: Option<u64>,
    exit: Exit<'_>,
) -> WorkerReport {
    let Exit { code, signal, .. } = exit;
    match (ending.stopped_because, oom_limit) {
        (Some(_), _) if let Some(eviction) = ending.evicted => WorkerReport::Evicted {
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
        (None, _) if code == Some(0) => WorkerReport::Exited { key, code, signal },
        (None, _) => match exit.stderr_tail.lines() {
            stderr_tail if stderr_tail.is_empty() => WorkerReport::Exited { key, code, signal },
            stderr_tail => WorkerReport::ExitedWithStderr {
                key,
                code,
                signal,
                stderr_tail,
            },
        },
    }
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

/// Takes rank 0's `MASTER_PORT` back (`isolation::ports`), and a worker's work
/// directory back from its attempt's user id, once the worker is gone (owner
/// root, mode 0700, by descriptor: the directory itself cannot be swapped, as its
/// parent is the node's), then gives back its share of the id. When the
/// attempt's last rank does so, the pool's sweeper scrubs the id (everything
/// still running as it killed, what it left in `/tmp`, `/var/tmp` and `/dev/shm`
/// removed) before any other attempt gets it, so the next holder finds nothing
/// of this one; the worker's end report does not wait for that.
async fn take_back(command: &mut WorkerCommand) {
    // Rank 0 is gone: the node holds its MASTER_PORT again.
    drop(command.master_port.take());
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
    drop(lease);
}

fn signal_group(pid: u32, signal: Signal) {
    if pid == 0 {
        return;
    }
    // The worker leads its own process group, so its group id is its pid.
    let _ = nix::sys::signal::killpg(Pid::from_raw(pid as i32), signal);
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::PermissionsExt;
    use std::os::unix::process::ExitStatusExt;
    use std::path::Path;
    use std::process::ExitStatus;
    use std::sync::Arc;

    use xp_runtime::ids::{ExperimentId, TrialId, WorkerKey};
    use xp_runtime::protocol::WorkerReport;

    use super::ended_on_sigterm;
    use crate::objects::{ObjectStore, StoreLimits};
    use crate::worker_log::LogCap;

    /// Runs `argv` as a one-rank worker with its directories under `dir`;
    /// every report it sent.
    async fn run(dir: &Path, argv: &[&str]) -> Vec<WorkerReport> {
        let store =
            Arc::new(ObjectStore::open(dir.join("objects"), StoreLimits::default()).unwrap());
        let key = WorkerKey {
            trial: TrialId {
                experiment: ExperimentId::from_content_hash(&[9; 32], 1),
                index: 0,
            },
            attempt: 1,
            rank: 0,
        };
        let argv = argv.iter().map(|arg| (*arg).to_owned()).collect();
        let log_path = dir.join("logs").join("rank0.log");
        let mut reports = crate::test_util::run_command_worker(
            dir,
            key,
            argv,
            log_path,
            store,
            LogCap::default(),
        )
        .await;
        let mut all = Vec::new();
        while let Ok(report) = reports.try_recv() {
            all.push(report);
        }
        all
    }

    /// A failing worker's exit report carries the last 20 lines of its stderr
    /// as a terminal shows them (a progress bar's last state), and it ran in
    /// its work directory, where its relative paths land.
    #[tokio::test]
    async fn a_failed_worker_reports_the_end_of_its_stderr_and_ran_in_its_work_dir() {
        let dir = tempfile::tempdir().unwrap();
        let script = r"pwd > where; echo out; for i in $(seq 1 30); do echo line $i >&2; done
printf ' 10%%\r100%%\n' >&2; exit 2";
        let reports = run(dir.path(), &["sh", "-c", script]).await;
        let expected: Vec<String> = (12..=30)
            .map(|i| format!("line {i}"))
            .chain(["100%".to_owned()])
            .collect();
        match reports.last() {
            Some(WorkerReport::ExitedWithStderr {
                code: Some(2),
                signal: None,
                stderr_tail,
                ..
            }) => assert_eq!(stderr_tail, &expected.join("\n")),
            other => panic!("{other:?} in {reports:?}"),
        }
        let work_dir = dir.path().join("work");
        let written = std::fs::read_to_string(work_dir.join("where")).unwrap();
        assert_eq!(written.trim(), work_dir.display().to_string());
        // A failure with nothing on stderr, and a success, say only how they ended.
        let reports = run(dir.path(), &["sh", "-c", "echo out; exit 3"]).await;
        assert!(
            matches!(
                reports.last(),
                Some(WorkerReport::Exited { code: Some(3), .. })
            ),
            "{reports:?}"
        );
        let reports = run(dir.path(), &["sh", "-c", "echo err >&2"]).await;
        assert!(
            matches!(
                reports.last(),
                Some(WorkerReport::Exited { code: Some(0), .. })
            ),
            "{reports:?}"
        );
    }

    /// A program that cannot run fails at launch, saying which of not found,
    /// not executable and permission denied, and naming the path.
    #[tokio::test]
    async fn a_program_that_cannot_run_fails_at_launch_naming_it() {
        let dir = tempfile::tempdir().unwrap();
        let plain = dir.path().join("train.sh");
        std::fs::write(&plain, "echo hi\n").unwrap();
        std::fs::set_permissions(&plain, std::fs::Permissions::from_mode(0o644)).unwrap();
        let plain = plain.display().to_string();
        let cases = [
            (
                "/no/such/program",
                "cannot start /no/such/program: not found: /no/such/program does not exist"
                    .to_owned(),
            ),
            (
                "no-such-program-xp",
                "cannot start no-such-program-xp: not found: no directory of the worker's PATH"
                    .to_owned(),
            ),
            (
                plain.as_str(),
                format!(
                    "cannot start {plain}: not executable: {plain}: it has no execute permission"
                ),
            ),
        ];
        for (program, expected) in cases {
            let reports = run(dir.path(), &[program]).await;
            match reports.last() {
                Some(WorkerReport::LaunchFailed { error, .. }) => {
                    assert!(
                        error.starts_with(&expected),
                        "{error:?} does not start with {expected:?}"
                    );
                }
                other => panic!("{program}: {other:?}"),
            }
        }
    }

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
