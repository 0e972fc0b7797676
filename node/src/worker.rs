//! Starting, watching and stopping one worker process.
//!
//! Invariant: only this module spawns trial processes. Each worker runs in its own
//! process group (so a kill reaches the shell and its children), dies with the
//! node (`PR_SET_PDEATHSIG`), and has its stdout and stderr appended to one log
//! file. Metric lines on stdout become reports, sent before the exit report.

use std::path::PathBuf;
use std::process::Stdio;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use nix::sys::signal::Signal;
use nix::unistd::Pid;
use tokio::io::{AsyncBufRead, AsyncWriteExt, BufReader};
use tokio::sync::{mpsc, oneshot};
use tracing::{debug, info, warn};
use xp_runtime::ids::WorkerKey;
use xp_runtime::metric_line::{
    MAX_METRIC_LINE, parse_checkpoint_line, parse_metric_line, read_bounded_line,
};
use xp_runtime::protocol::{Launch, WorkerReport};

/// How long a worker has between SIGTERM and SIGKILL.
pub const KILL_GRACE: Duration = Duration::from_secs(5);
/// The longest grace the head may ask for (a preempted trial checkpointing).
pub const MAX_KILL_GRACE: Duration = Duration::from_secs(600);

/// Why and how gently to stop a worker.
#[derive(Debug, Clone)]
pub struct StopRequest {
    /// For the log and the report.
    pub reason: String,
    /// How long after SIGTERM before SIGKILL.
    pub grace: Duration,
}

impl StopRequest {
    /// A stop with the default grace.
    pub fn new(reason: impl Into<String>) -> Self {
        Self {
            reason: reason.into(),
            grace: KILL_GRACE,
        }
    }
}
/// How long to wait for output after the process exited (a grandchild may hold the pipes).
const DRAIN_GRACE: Duration = Duration::from_secs(2);
/// How long to wait after the exit for a checkpoint still being stored, so that it
/// is reported before the exit.
const CHECKPOINT_DRAIN_GRACE: Duration = Duration::from_secs(300);

/// Where a worker's checkpoints go: its `XP_CHECKPOINT_DIR` and the node's store.
#[derive(Debug, Clone)]
pub struct CheckpointSink {
    /// The node's object store.
    pub store: Arc<crate::objects::ObjectStore>,
    /// The worker's checkpoint directory.
    pub dir: PathBuf,
    /// Where the verdict on each checkpoint is left for the worker
    /// (`CHECKPOINT_STATUS_DIR` under its work directory).
    pub status_dir: PathBuf,
    /// A durable directory each checkpoint is also written to.
    pub backup: Option<PathBuf>,
}

/// What to execute for one worker, resolved by the agent.
#[derive(Debug)]
pub struct WorkerCommand {
    /// The program.
    pub program: PathBuf,
    /// Its arguments.
    pub args: Vec<String>,
    /// Extra environment (`XP_ENTRY` for Rust trainables).
    pub extra_env: Vec<(String, String)>,
    /// The combined stdout/stderr log.
    pub log_path: PathBuf,
    /// A scratch directory for the worker (`XP_WORK_DIR`).
    pub work_dir: PathBuf,
    /// Its checkpoint directory and the store its checkpoints go to.
    pub checkpoint: CheckpointSink,
}

/// The environment contract of a worker process (documented in ARCHITECTURE.md).
pub fn worker_env(launch: &Launch) -> Vec<(String, String)> {
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
/// report is `Stopped` with that message.
pub async fn supervise(
    launch: Launch,
    command: WorkerCommand,
    reports: mpsc::UnboundedSender<WorkerReport>,
    stop: oneshot::Receiver<StopRequest>,
) {
    let key = launch.key;
    let mut child = match spawn(&launch, &command).await {
        Ok(child) => child,
        Err(error) => {
            warn!(worker = %key, %error, "worker could not start");
            let _ = reports.send(WorkerReport::LaunchFailed { key, error });
            return;
        }
    };
    let pid = child.id().unwrap_or_default();
    info!(worker = %key, pid, "worker started");
    let _ = reports.send(WorkerReport::Started { key, pid });
    // One append-mode handle per stream: both land in the same file, line by line.
    let checkpointing = Arc::new(AtomicBool::new(false));
    let stdout = child.stdout.take().map(|stdout| {
        let log_path = command.log_path.clone();
        let reports = reports.clone();
        let sink = (command.checkpoint.clone(), checkpointing.clone());
        xp_runtime::task::spawn("worker-stdout", async move {
            let trial = TrialOutput { key, reports, sink };
            pump(
                BufReader::new(stdout),
                open_log(&log_path).await,
                Some(trial),
            )
            .await
        })
    });
    let stderr = child.stderr.take().map(|stderr| {
        let log_path = command.log_path.clone();
        xp_runtime::task::spawn("worker-stderr", async move {
            pump(BufReader::new(stderr), open_log(&log_path).await, None).await
        })
    });

    let mut stopped_because = None;
    let status = tokio::select! {
        status = child.wait() => status,
        request = stop => {
            let StopRequest { reason, grace } =
                request.unwrap_or_else(|_| StopRequest::new("node shutting down"));
            info!(worker = %key, %reason, ?grace, "stopping worker");
            stopped_because = Some(reason);
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
    for mut pump_task in [stdout, stderr].into_iter().flatten() {
        if tokio::time::timeout(DRAIN_GRACE, &mut pump_task)
            .await
            .is_ok()
        {
            continue;
        }
        if checkpointing.load(Ordering::Acquire) {
            info!(worker = %key, "waiting for the last checkpoint to be stored");
            if tokio::time::timeout(CHECKPOINT_DRAIN_GRACE, pump_task)
                .await
                .is_ok()
            {
                continue;
            }
        }
        debug!(worker = %key, "output still open after exit; stopped reading it");
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
    let report = match stopped_because {
        Some(reason) => WorkerReport::Stopped { key, reason },
        None => WorkerReport::Exited { key, code, signal },
    };
    let _ = reports.send(report);
}

async fn open_log(path: &std::path::Path) -> Option<tokio::fs::File> {
    match tokio::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
        .await
    {
        Ok(file) => Some(file),
        Err(error) => {
            warn!(%error, path = %path.display(), "cannot open the worker log; output is discarded");
            None
        }
    }
}

async fn spawn(launch: &Launch, command: &WorkerCommand) -> Result<tokio::process::Child, String> {
    if let Some(parent) = command.log_path.parent() {
        tokio::fs::create_dir_all(parent)
            .await
            .map_err(|error| format!("cannot create {}: {error}", parent.display()))?;
    }
    for dir in [&command.work_dir, &command.checkpoint.dir] {
        tokio::fs::create_dir_all(dir)
            .await
            .map_err(|error| format!("cannot create {}: {error}", dir.display()))?;
    }
    let mut process = tokio::process::Command::new(&command.program);
    process
        .args(&command.args)
        .envs(worker_env(launch))
        .envs(command.extra_env.iter().cloned())
        .env("XP_WORK_DIR", &command.work_dir)
        .env("XP_CHECKPOINT_DIR", &command.checkpoint.dir)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .process_group(0);
    // SAFETY: the closure only calls prctl(2), which is async-signal-safe, between fork and exec.
    unsafe {
        process.pre_exec(|| {
            nix::sys::prctl::set_pdeathsig(Signal::SIGKILL).map_err(std::io::Error::from)?;
            Ok(())
        });
    }
    process
        .spawn()
        .map_err(|error| format!("cannot start {}: {error}", command.program.display()))
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
    /// Where checkpoints go, and the flag that one is being stored. Only rank
    /// 0's are kept (data-parallel ranks hold the same state); the others are
    /// answered without being stored.
    sink: (CheckpointSink, Arc<AtomicBool>),
}

/// Copies output lines to the log; on stdout also turns metric lines into reports
/// and takes checkpoints.
async fn pump(
    mut reader: impl AsyncBufRead + Unpin,
    mut log: Option<tokio::fs::File>,
    metrics: Option<TrialOutput>,
) {
    let mut line = Vec::with_capacity(1024);
    let mut index = 0u64;
    loop {
        match read_bounded_line(&mut reader, &mut line, MAX_METRIC_LINE).await {
            Ok(0) => break,
            Ok(_) => {}
            Err(error) => {
                debug!(%error, "worker output read failed");
                break;
            }
        }
        if let Some(file) = log.as_mut()
            && let Err(error) = file.write_all(&line).await
        {
            warn!(%error, "cannot write the worker log; output is discarded from now on");
            log = None;
        }
        let Some(TrialOutput { key, reports, sink }) = &metrics else {
            continue;
        };
        let Ok(text) = std::str::from_utf8(&line) else {
            continue;
        };
        match parse_checkpoint_line(text) {
            Ok(Some(step)) => {
                let (sink, checkpointing) = sink;
                if key.rank != 0 {
                    debug!(worker = %key, "checkpoint line of a rank other than 0 not stored");
                    let verdict = "not stored: only rank 0's checkpoints are kept (data-parallel ranks hold the same state)";
                    leave_verdict(&sink.status_dir, step, verdict).await;
                    continue;
                }
                checkpointing.store(true, Ordering::Release);
                let outcome = take_checkpoint(sink, *key, step).await;
                checkpointing.store(false, Ordering::Release);
                let note = match outcome {
                    Ok((files, backup)) => {
                        let bytes: u64 = files.iter().map(|file| file.size).sum();
                        let note = format!(
                            "xp-node: checkpoint at step {step} stored ({} files, {bytes} bytes{})\n",
                            files.len(),
                            if backup.is_some() { ", backed up" } else { "" }
                        );
                        let _ = reports.send(WorkerReport::Checkpoint {
                            key: *key,
                            step,
                            files,
                            backup,
                        });
                        note
                    }
                    Err(error) => {
                        warn!(worker = %key, step, %error, "checkpoint not stored");
                        format!("xp-node: checkpoint at step {step} NOT stored: {error}\n")
                    }
                };
                if let Some(file) = log.as_mut() {
                    let _ = file.write_all(note.as_bytes()).await;
                }
                leave_verdict(&sink.status_dir, step, note.trim_end()).await;
                continue;
            }
            Ok(None) => {}
            Err(error) => {
                warn!(worker = %key, %error, "checkpoint line ignored");
                continue;
            }
        }
        match parse_metric_line(text) {
            Ok(Some(report)) => {
                index += 1;
                let _ = reports.send(WorkerReport::Metric {
                    key: *key,
                    index,
                    step: report.step,
                    values: report.values.into_iter().collect(),
                });
            }
            Ok(None) => {}
            Err(error) => warn!(worker = %key, %error, "metric line ignored"),
        }
    }
    if let Some(mut file) = log {
        let _ = file.flush().await;
    }
}

/// Writes the verdict on the checkpoint of `step` where the worker looks for it;
/// atomically, so it never reads half of one.
async fn leave_verdict(dir: &std::path::Path, step: u64, verdict: &str) {
    let verdict = verdict.trim_start_matches("xp-node: ");
    let verdict = if verdict.contains("NOT stored") {
        format!("error: {verdict}")
    } else {
        verdict.to_owned()
    };
    let temporary = dir.join(format!(".{step}.tmp"));
    let write = async {
        tokio::fs::create_dir_all(dir).await?;
        tokio::fs::write(&temporary, verdict.as_bytes()).await?;
        tokio::fs::rename(&temporary, dir.join(step.to_string())).await
    };
    if let Err(error) = write.await {
        warn!(%error, dir = %dir.display(), "cannot leave the checkpoint verdict for the worker");
    }
}

/// Takes the checkpoint into the store and, when the node has a backup
/// directory, writes it there too; returns its files and the backup used. A
/// failed backup leaves the checkpoint stored on this node only, and says so.
async fn take_checkpoint(
    sink: &CheckpointSink,
    key: WorkerKey,
    step: u64,
) -> Result<(Vec<xp_runtime::protocol::CheckpointFile>, Option<String>), String> {
    let store = sink.store.clone();
    let dir = sink.dir.clone();
    let backup = sink.backup.clone();
    tokio::task::spawn_blocking(move || {
        let files = crate::checkpoint::take(&store, &dir, key.trial, step)?;
        let Some(backup) = backup else {
            return Ok((files, None));
        };
        match crate::checkpoint::back_up(&store, &backup, &files) {
            Ok(()) => Ok((files, Some(backup.display().to_string()))),
            Err(error) => {
                warn!(worker = %key, step, %error, "checkpoint stored but not backed up");
                Ok((files, None))
            }
        }
    })
    .await
    .map_err(|error| error.to_string())?
    .map_err(|error: crate::checkpoint::CheckpointError| error.to_string())
}
