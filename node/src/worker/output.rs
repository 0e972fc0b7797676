//! A worker's output: its stdout and stderr copied to its log in whole
//! chunks, and its metric and checkpoint lines taken out of stdout as they end.
//!
//! Each stream has a pump task. A chunk is cut after its last newline and the
//! rest held back until the line ends (at most [`PARTIAL_LINE_WAIT`] and
//! [`MAX_PARTIAL_LINE`] bytes), so stdout and stderr interleave by lines. Lines
//! are split by a bounded splitter, so a line too long to parse is skipped and
//! the next one is parsed.
//!
//! The stderr pump also keeps the stream's last bytes ([`StderrTail`]), which a
//! failed worker's exit report carries as its last lines.
//!
//! Not here: the log's files (`worker_log`) and what a checkpoint line sets off
//! (`checkpoint::CheckpointWatch`).

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncReadExt};
use tokio::process::Child;
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tracing::{debug, warn};
use xp_runtime::ids::WorkerKey;
use xp_runtime::metric_line::{
    CHECKPOINT_PREFIX, MAX_METRIC_LINE, METRIC_PREFIX, parse_metric_line,
};
use xp_runtime::protocol::{MAX_MALFORMED_LINE_SHOWN, WorkerReport};
use xp_runtime::stderr_tail::{RAW_TAIL_BYTES, tail_of};

use crate::checkpoint::CheckpointWatch;
use crate::worker_log::LogSender;
use crate::worker_log::lines::{Line, LineSplitter};

/// How much one read takes from a worker's pipe at most (besides what is held).
const READ_CHUNK: usize = 64 * 1024;
/// How long the end of a line still being printed is held back from the log, so
/// that stdout and stderr interleave by whole lines.
const PARTIAL_LINE_WAIT: Duration = Duration::from_millis(50);
/// The longest line end held back; a longer one goes to the log as it is.
const MAX_PARTIAL_LINE: usize = 64 * 1024;

/// The last bytes a worker wrote on stderr (at most
/// [`RAW_TAIL_BYTES`]), shared by its stderr pump and its supervisor.
#[derive(Debug, Clone, Default)]
pub(super) struct StderrTail(Arc<Mutex<VecDeque<u8>>>);

impl StderrTail {
    /// Keeps `bytes`, letting go of the oldest beyond the bound.
    fn keep(&self, bytes: &[u8]) {
        let bytes = &bytes[bytes.len().saturating_sub(RAW_TAIL_BYTES)..];
        let mut kept = self.0.lock().expect("the tail's lock is never poisoned");
        kept.extend(bytes);
        let excess = kept.len().saturating_sub(RAW_TAIL_BYTES);
        kept.drain(..excess);
    }

    /// The last lines kept, bounded and escaped (`xp_runtime::stderr_tail`).
    pub(super) fn lines(&self) -> String {
        let mut kept = self.0.lock().expect("the tail's lock is never poisoned");
        tail_of(kept.make_contiguous())
    }
}

/// Starts the pumps of `child`'s stdout (parsing its lines, with `checkpoints`
/// for its checkpoint lines) and stderr (keeping its end in `stderr_tail`),
/// both into `log`.
pub(super) fn start_pumps(
    child: &mut Child,
    key: WorkerKey,
    log: LogSender,
    reports: &mpsc::UnboundedSender<WorkerReport>,
    checkpoints: CheckpointWatch,
    stderr_tail: StderrTail,
) -> [Option<JoinHandle<()>>; 2] {
    let stdout = child.stdout.take().map(|stdout| {
        let log = log.clone();
        let trial = TrialOutput {
            key,
            reports: reports.clone(),
            checkpoints,
            index: 0,
            malformed: 0,
        };
        xp_runtime::task::spawn("worker-stdout", pump(stdout, log, Some(trial), None))
    });
    let stderr = child.stderr.take().map(|stderr| {
        xp_runtime::task::spawn("worker-stderr", pump(stderr, log, None, Some(stderr_tail)))
    });
    [stdout, stderr]
}

/// Where a stdout pump sends what the trial reports.
struct TrialOutput {
    key: WorkerKey,
    reports: mpsc::UnboundedSender<WorkerReport>,
    /// What the trial's checkpoint lines are handed to.
    checkpoints: CheckpointWatch,
    /// The number of the last metric report.
    index: u64,
    /// How many metric lines could not be read.
    malformed: u64,
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
            Err(error) => {
                debug!(worker = %self.key, %error, "metric line could not be read");
                self.malformed += 1;
                // The first, then each time the count doubles: a trial printing
                // only bad lines costs a few reports, not one per line.
                if self.malformed.is_power_of_two() {
                    let shown: String = text.chars().take(MAX_MALFORMED_LINE_SHOWN).collect();
                    let _ = self.reports.send(WorkerReport::MalformedMetrics {
                        key: self.key,
                        count: self.malformed,
                        first: format!("{shown} ({error})"),
                    });
                }
            }
        }
    }
}

/// Copies a worker's output stream to its log in whole chunks; on stdout
/// (`trial` given) also parses each metric and checkpoint line as it ends, and
/// on stderr (`tail` given) keeps its end. A chunk is cut after its last
/// newline and the rest held back until the line ends, for at most
/// [`PARTIAL_LINE_WAIT`] and [`MAX_PARTIAL_LINE`] bytes. The bytes before a
/// checkpoint line's end go to the log before the watch's note.
async fn pump(
    mut reader: impl AsyncRead + Unpin,
    log: LogSender,
    mut trial: Option<TrialOutput>,
    tail: Option<StderrTail>,
) {
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
        if let Some(tail) = &tail {
            tail.keep(&pending[pending.len() - fresh..]);
        }
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
