//! Helpers for tests and benches (feature `test-util`, and this crate's unit
//! tests): a worker run alone through the node's real worker path, generated
//! worker output, and checkpoint taking and restoring on a bare store.
//!
//! `xp bench logs` and `xp bench objects` (the root package's `bench` module)
//! measure the node through these; nothing here is part of a running node.
//!
//! Not here: fakes of the head or of a GPU (`gpu::declared_gpus` stands in for
//! NVML), and the benches themselves.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use tokio::sync::{mpsc, oneshot};
use tokio_util::sync::CancellationToken;
use xp_runtime::ids::{TrialId, WorkerKey};
use xp_runtime::protocol::{CheckpointFile, Launch, Program, WorkerReport};

use crate::checkpoint::{CheckpointError, CheckpointSink, OutputLimits};
use crate::objects::ObjectStore;
use crate::telemetry::Targets;
use crate::worker::{OutputSink, WorkerCommand, supervise};
use crate::worker_log::LogCap;

/// One line in this many of [`generate_output`]'s lines is a metric line.
pub const METRIC_EVERY: u64 = 100;

/// Writes `bytes` of worker output to `path`: text lines, with a metric line
/// every [`METRIC_EVERY`] lines; returns how many are metric lines.
pub fn generate_output(path: &Path, bytes: u64) -> std::io::Result<u64> {
    let mut file = std::io::BufWriter::with_capacity(1 << 20, std::fs::File::create(path)?);
    let mut written = 0u64;
    let mut metric_lines = 0u64;
    let mut line_idx = 0u64;
    let mut line = String::with_capacity(128);
    while written < bytes {
        line.clear();
        if line_idx.is_multiple_of(METRIC_EVERY) {
            metric_lines += 1;
            line.push_str(&format!(
                "XP_METRIC {{\"step\": {line_idx}, \"loss\": {}}}\n",
                1.0 / (line_idx + 1) as f64
            ));
        } else {
            line.push_str(&format!(
                "step {line_idx:>9}: the quick brown fox jumps over the lazy dog, loss still falling\n"
            ));
        }
        let room = usize::try_from(bytes - written).unwrap_or(usize::MAX);
        if line.len() > room {
            // The last, partial line is plain text.
            line = "x".repeat(room);
            if line_idx.is_multiple_of(METRIC_EVERY) {
                metric_lines -= 1;
            }
        }
        file.write_all(line.as_bytes())?;
        written += line.len() as u64;
        line_idx += 1;
    }
    file.flush()?;
    Ok(metric_lines)
}

/// A one-rank command worker running `argv` with its log at `log_path` and its
/// work directory under `dir`, as the agent would prepare it on a node that
/// runs workers as itself.
pub(crate) fn solo_worker(
    dir: &Path,
    key: WorkerKey,
    argv: Vec<String>,
    log_path: PathBuf,
    store: Arc<ObjectStore>,
) -> (Launch, WorkerCommand) {
    let launch = Launch {
        key,
        world_size: 1,
        local_rank: 0,
        program: Program::Command { argv: argv.clone() },
        config_json: "{}".to_owned(),
        seed: 0,
        gpu_indices: Vec::new(),
        gpu_milli: 0,
        master_addr: "127.0.0.1".to_owned(),
        master_port: 29500,
        collective_token: [0; 32],
        transport: Default::default(),
        resume: None,
        cpu_milli: 0,
        memory_bytes: 0,
        inputs: Vec::new(),
        collect_outputs: false,
        oversubscription_milli: 1000,
        object_capability: None,
        command_dir: None,
        object_path: Default::default(),
    };
    let work_dir = dir.join("work");
    let command = WorkerCommand {
        program: PathBuf::from(&argv[0]),
        args: argv[1..].to_vec(),
        path_args: Vec::new(),
        extra_env: Vec::new(),
        log_path,
        checkpoint: CheckpointSink::new(store.clone(), &work_dir, None),
        output: OutputSink {
            collect: false,
            dir: work_dir.join(crate::isolation::OUTPUT_DIR),
            store,
            owner: None,
            limits: OutputLimits::default(),
        },
        input_dir: None,
        work_dir,
        uid: None,
        master_port: None,
    };
    (launch, command)
}

/// Runs `argv` as worker `key` through the node's worker path (pipes, pumps,
/// metric parsing, the log capped at `cap` in `log_path`), with its work
/// directory under `dir`, on a node that is not draining; returns once it has
/// ended, with every report it sent waiting in the receiver.
pub async fn run_command_worker(
    dir: &Path,
    key: WorkerKey,
    argv: Vec<String>,
    log_path: PathBuf,
    store: Arc<ObjectStore>,
    cap: LogCap,
) -> mpsc::UnboundedReceiver<WorkerReport> {
    let (launch, command) = solo_worker(dir, key, argv, log_path, store);
    let (reports_tx, reports_rx) = mpsc::unbounded_channel();
    let (_stop_tx, stop_rx) = oneshot::channel();
    supervise(
        launch,
        command,
        cap,
        reports_tx,
        stop_rx,
        Targets::default(),
        CancellationToken::new(),
    )
    .await;
    reports_rx
}

/// Every file of the worker log `log_path` that exists, with its length:
/// what the log takes on disk.
pub fn log_files(log_path: &Path) -> Vec<(PathBuf, u64)> {
    crate::worker_log::files_on_disk(log_path)
}

/// Takes the checkpoint directory `dir` of `trial` at `step` into `store`, as a
/// worker's checkpoint line makes the node do (no user id of its own).
pub fn take_checkpoint(
    store: &ObjectStore,
    dir: &Path,
    trial: TrialId,
    step: u64,
) -> Result<Vec<CheckpointFile>, CheckpointError> {
    crate::checkpoint::take(store, dir, None, trial, step)
}

/// Writes the checkpoint `files` from `store` into `dir`.
pub fn restore_checkpoint(
    store: &ObjectStore,
    dir: &Path,
    files: &[CheckpointFile],
) -> Result<(), CheckpointError> {
    crate::checkpoint::restore(store, dir, files)
}
