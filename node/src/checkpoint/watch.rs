//! Steps 1 and 4 of the route: a worker's `XP_CHECKPOINT` line in, a report, a
//! log note and a verdict out.
//!
//! The worker's stdout pump hands every line to [`CheckpointWatch::handle_line`].
//! A checkpoint line of rank 0 is taken ([`take`](super::take)), backed up when
//! the node has a backup directory, reported to the head as
//! `WorkerReport::Checkpoint`, noted in the worker's log, and answered with a
//! verdict file the worker's SDK waits for. Other ranks' checkpoint lines are only
//! answered: data-parallel ranks hold the same state as rank 0.
//!
//! Not here: reading the worker's output or writing the rest of its log (the
//! worker module's pump does), and parsing the line (`xp_runtime::metric_line`).
//!
//! Invariants: the report is sent only for a checkpoint whose every file is
//! stored; the verdict is written atomically, after the log note; [`InFlight`] is
//! set for exactly as long as a checkpoint is being stored, so the worker's
//! supervisor can wait for it before reporting the exit.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use tokio::sync::mpsc;
use tracing::{debug, warn};
use xp_runtime::ids::WorkerKey;
use xp_runtime::metric_line::{CHECKPOINT_STATUS_DIR, parse_checkpoint_line};
use xp_runtime::protocol::{CheckpointFile, WorkerReport};

use super::backup::back_up;
use super::error::CheckpointError;
use super::take::take;
use crate::isolation::fs::{self as lane_fs, FileOwner};
use crate::objects::ObjectStore;
use crate::worker_log::LogSender;

/// How long to wait after a worker exited for a checkpoint still being stored, so
/// that it is reported before the exit.
pub(crate) const DRAIN_GRACE: Duration = Duration::from_secs(300);

/// Where one worker's checkpoints go: its `XP_CHECKPOINT_DIR`, the node's store,
/// and the backup directory.
#[derive(Debug, Clone)]
pub(crate) struct CheckpointSink {
    /// The node's object store.
    pub store: Arc<ObjectStore>,
    /// The worker's checkpoint directory (`XP_CHECKPOINT_DIR`).
    pub dir: PathBuf,
    /// Where the verdict on each checkpoint is left for the worker
    /// (`CHECKPOINT_STATUS_DIR` under its work directory).
    pub status_dir: PathBuf,
    /// A durable directory each checkpoint is also written to.
    pub backup: Option<PathBuf>,
    /// The worker's id, which what the node makes in its directories belongs to.
    pub owner: Option<FileOwner>,
}

impl CheckpointSink {
    /// The sink of a worker whose work directory is `work_dir`: its checkpoint
    /// directory is `checkpoint` there, and its verdicts go to
    /// `CHECKPOINT_STATUS_DIR` there.
    pub(crate) fn new(store: Arc<ObjectStore>, work_dir: &Path, backup: Option<PathBuf>) -> Self {
        Self {
            store,
            dir: work_dir.join("checkpoint"),
            status_dir: work_dir.join(CHECKPOINT_STATUS_DIR),
            backup,
            owner: None,
        }
    }

    /// The same, for a worker running as `owner`.
    pub(crate) fn with_owner(mut self, owner: Option<FileOwner>) -> Self {
        self.owner = owner;
        self
    }
}

/// Whether a worker's checkpoint is being stored right now.
#[derive(Debug, Clone, Default)]
pub(crate) struct InFlight(Arc<AtomicBool>);

impl InFlight {
    /// True while a checkpoint is being taken or backed up.
    pub(crate) fn is_set(&self) -> bool {
        self.0.load(Ordering::Acquire)
    }

    fn set(&self, taking: bool) {
        self.0.store(taking, Ordering::Release);
    }
}

/// Handles one worker's checkpoint lines.
#[derive(Debug)]
pub(crate) struct CheckpointWatch {
    sink: CheckpointSink,
    key: WorkerKey,
    reports: mpsc::UnboundedSender<WorkerReport>,
    in_flight: InFlight,
}

impl CheckpointWatch {
    /// A watch for worker `key`, taking its checkpoints into `sink` and
    /// reporting them on `reports`.
    pub(crate) fn new(
        sink: CheckpointSink,
        key: WorkerKey,
        reports: mpsc::UnboundedSender<WorkerReport>,
    ) -> Self {
        Self {
            sink,
            key,
            reports,
            in_flight: InFlight::default(),
        }
    }

    /// The flag that says a checkpoint is being stored.
    pub(crate) fn in_flight(&self) -> InFlight {
        self.in_flight.clone()
    }

    /// Handles `line` if it is a checkpoint line (or a malformed one, which is
    /// logged and dropped) and returns true; returns false for any other line.
    /// The note on a kept checkpoint is appended to `log`.
    pub(crate) async fn handle_line(&self, line: &str, log: Option<&LogSender>) -> bool {
        let key = self.key;
        let step = match parse_checkpoint_line(line) {
            Ok(Some(step)) => step,
            Ok(None) => return false,
            Err(error) => {
                warn!(worker = %key, %error, "checkpoint line ignored");
                return true;
            }
        };
        if key.rank != 0 {
            debug!(worker = %key, "checkpoint line of a rank other than 0 not stored");
            let verdict = "ignored: only rank 0's checkpoints are kept (data-parallel ranks hold the same state)";
            leave_verdict(&self.sink, step, verdict).await;
            return true;
        }
        self.in_flight.set(true);
        let started = tokio::time::Instant::now();
        let outcome = take_and_back_up(&self.sink, key, step).await;
        let take_ms = u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX);
        self.in_flight.set(false);
        let (note, verdict) = match outcome {
            Ok((files, backup)) => {
                let bytes: u64 = files.iter().map(|file| file.size).sum();
                let what = format!(
                    "{} files, {bytes} bytes{}",
                    files.len(),
                    if backup.is_some() { ", backed up" } else { "" }
                );
                let _ = self.reports.send(WorkerReport::Checkpoint {
                    key,
                    step,
                    files,
                    backup,
                    take_ms,
                });
                (
                    format!("xp-node: checkpoint at step {step} stored ({what})\n"),
                    format!("stored: checkpoint at step {step} ({what})"),
                )
            }
            Err(error) => {
                warn!(worker = %key, step, %error, "checkpoint not stored");
                (
                    format!("xp-node: checkpoint at step {step} NOT stored: {error}\n"),
                    format!("error: checkpoint at step {step} not stored: {error}"),
                )
            }
        };
        if let Some(log) = log {
            log.write(note.into_bytes()).await;
        }
        leave_verdict(&self.sink, step, &verdict).await;
        true
    }
}

/// Writes the verdict on the checkpoint of `step` where the worker looks for it:
/// `stored: ...`, `error: ...` or, for a rank other than 0, `ignored: ...`
/// (documented in docs/guide/checkpoints.md); atomically, so it never reads
/// half of one. The directory is the worker's, so
/// nothing there is followed (`isolation::fs`): a link in place of the status
/// directory is refused, one in place of the file is replaced.
async fn leave_verdict(sink: &CheckpointSink, step: u64, verdict: &str) {
    let verdict = verdict.to_owned();
    let dir = sink.status_dir.clone();
    let owner = sink.owner;
    let write = tokio::task::spawn_blocking(move || {
        let name = dir.file_name().unwrap_or_default().to_owned();
        let parent = lane_fs::open_dir(dir.parent().unwrap_or(Path::new("/")))?;
        let status = lane_fs::make_dir_in(&parent, &name, 0o755, owner)?;
        let file = step.to_string();
        lane_fs::replace_file_in(&status, file.as_ref(), verdict.as_bytes(), 0o644, owner)
    });
    let result = match write.await {
        Ok(result) => result,
        Err(error) => Err(std::io::Error::other(error)),
    };
    if let Err(error) = result {
        warn!(%error, dir = %sink.status_dir.display(), "cannot leave the checkpoint verdict for the worker");
    }
}

/// Takes the checkpoint into the store and, when the node has a backup
/// directory, writes it there too; returns its files and the backup used. A
/// failed backup leaves the checkpoint stored on this node only, and says so.
async fn take_and_back_up(
    sink: &CheckpointSink,
    key: WorkerKey,
    step: u64,
) -> Result<(Vec<CheckpointFile>, Option<String>), CheckpointError> {
    let store = sink.store.clone();
    let dir = sink.dir.clone();
    let backup = sink.backup.clone();
    let owner = sink.owner;
    tokio::task::spawn_blocking(move || {
        let files = take(&store, &dir, owner, key.trial, step)?;
        let Some(backup) = backup else {
            return Ok((files, None));
        };
        match back_up(&store, &backup, &files) {
            Ok(()) => Ok((files, Some(backup.display().to_string()))),
            Err(error) => {
                warn!(worker = %key, step, %error, "checkpoint stored but not backed up");
                Ok((files, None))
            }
        }
    })
    .await?
}
