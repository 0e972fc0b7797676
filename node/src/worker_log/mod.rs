//! A worker's log on disk: written fast in whole chunks, capped, and read back
//! by byte offset for `xp logs` (and `--follow`).
//!
//! A log keeps the beginning of a worker's output and a rolling tail; what falls
//! between is dropped, and readers are told so with a marker line
//! ([`marker_line`]). On disk, for the log named `rank0.log`:
//!
//! - `rank0.log`, the head: the first [`LogCap::head`] bytes of output;
//! - `rank0.log.tail-<START>`, up to [`TAIL_SEGMENTS`] tail segments, each holding
//!   at most [`LogCap::segment`] bytes of output from stream offset `START`
//!   (20 zero-padded digits, so names sort in stream order); the newest is being
//!   written, the older ones are full and never change again;
//! - `rank0.log.dropped`, once anything was dropped: the marker line, rewritten
//!   at each drop and when the log closes, so `cat rank0.log*` shows head, marker
//!   and tail in that order.
//!
//! Offsets are positions in the worker's whole output, kept or not: the byte at
//! offset `o` is always the same byte, a reader gets exactly the kept bytes after
//! its offset, and a read from a dropped offset answers the marker and moves the
//! offset to the oldest byte still kept. The layout describes itself (the head's
//! length and the segments' names and lengths are all a reader needs), so logs
//! stay readable after the node restarts, even with another cap.
//!
//! Not here: reading the worker's pipes and parsing its metric lines (the
//! `worker` module's pump; `lines` is its bounded line splitter), and the wire
//! format of a chunk (`LogChunk` in `xp_runtime::protocol`).
//!
//! Invariants: the files of one log never hold more than the cap plus the marker
//! file; the head is full before the first tail segment exists; a segment is
//! created before the one it pushes out is deleted.

pub(crate) mod lines;
mod reader;
mod writer;

#[cfg(test)]
mod tests;

use std::path::{Path, PathBuf};

use xp_runtime::ids::WorkerKey;

pub use reader::{LogRead, read};
#[cfg(test)]
use writer::LogWriter;
pub(crate) use writer::{LogSender, start};

/// Where worker `key`'s combined output is kept under the node's data
/// directory: the head file of its log (`logs/TRIAL/aN/rankN.log`).
pub fn log_path(data_dir: &Path, key: WorkerKey) -> PathBuf {
    data_dir
        .join("logs")
        .join(key.trial.to_string())
        .join(format!("a{}", key.attempt))
        .join(format!("rank{}.log", key.rank))
}

/// The default cap of one worker's log: see [`LogCap`].
pub(crate) const DEFAULT_LOG_CAP: u64 = 64 << 20;
/// The smallest cap: room for a marker line and some output on either side of it.
pub(crate) const MIN_LOG_CAP: u64 = 4 << 10;
/// How many segments the tail is kept in. The tail rolls one segment at a time,
/// so it holds between three quarters and all of its half of the cap.
pub(crate) const TAIL_SEGMENTS: usize = 4;

/// The most bytes one worker's log keeps on disk: the first half of the cap
/// holds the beginning of its output, the second half a rolling tail.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LogCap {
    bytes: u64,
}

impl LogCap {
    /// A cap of `bytes`, at least 4 KiB.
    pub fn new(bytes: u64) -> Result<Self, LogError> {
        if bytes < MIN_LOG_CAP {
            return Err(LogError::CapTooSmall { bytes });
        }
        Ok(Self { bytes })
    }

    /// The whole cap.
    pub fn bytes(self) -> u64 {
        self.bytes
    }

    /// How much of the beginning of the output is kept.
    pub fn head(self) -> u64 {
        self.bytes / 2
    }

    /// The most bytes one tail segment holds.
    pub fn segment(self) -> u64 {
        (self.bytes - self.head()) / TAIL_SEGMENTS as u64
    }
}

impl Default for LogCap {
    fn default() -> Self {
        Self {
            bytes: DEFAULT_LOG_CAP,
        }
    }
}

/// Why a log could not be written or read.
#[derive(Debug, thiserror::Error)]
pub enum LogError {
    /// The cap asked for is below 4 KiB, the minimum.
    #[error("a log cap of {bytes} bytes is below the minimum of {MIN_LOG_CAP}")]
    CapTooSmall {
        /// The cap asked for.
        bytes: u64,
    },
    /// Nothing was ever written for this worker.
    #[error("no log at {path}")]
    NotFound {
        /// The head file.
        path: PathBuf,
    },
    /// A file of the log could not be used.
    #[error("cannot use {path}")]
    Io {
        /// The file or directory.
        path: PathBuf,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
}

impl LogError {
    fn io(path: &Path) -> impl FnOnce(std::io::Error) -> Self + '_ {
        move |source| Self::Io {
            path: path.to_owned(),
            source,
        }
    }
}

/// The marker that stands where `dropped` bytes were cut out of a log that keeps
/// its first `head` and last `tail` bytes.
pub(crate) fn marker_line(dropped: u64, head: u64, tail: u64) -> String {
    format!("[xp: {dropped} bytes dropped here; the log keeps its first {head} and last {tail}]\n")
}

/// One tail segment: its first byte's stream offset and its length.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Segment {
    start: u64,
    len: u64,
}

impl Segment {
    fn end(self) -> u64 {
        self.start + self.len
    }
}

/// The prefix of the tail segments' file names of the log `head_path`.
fn segment_prefix(head_path: &Path) -> String {
    let name = head_path
        .file_name()
        .map(|name| name.to_string_lossy().into_owned())
        .unwrap_or_default();
    format!("{name}.tail-")
}

/// The file of the tail segment starting at stream offset `start`.
fn segment_path(head_path: &Path, start: u64) -> PathBuf {
    head_path.with_file_name(format!("{}{start:020}", segment_prefix(head_path)))
}

/// The file that holds the marker once anything was dropped.
pub(crate) fn marker_path(head_path: &Path) -> PathBuf {
    let mut name = head_path.as_os_str().to_owned();
    name.push(".dropped");
    PathBuf::from(name)
}

/// The log's tail segments on disk, oldest first. A segment deleted while the
/// directory is read is left out.
fn list_segments(head_path: &Path) -> Result<Vec<Segment>, LogError> {
    let dir = head_path.parent().unwrap_or(Path::new("."));
    let prefix = segment_prefix(head_path);
    let entries = match std::fs::read_dir(dir) {
        Ok(entries) => entries,
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(error) => return Err(LogError::io(dir)(error)),
    };
    let mut segments = Vec::new();
    for entry in entries {
        let entry = entry.map_err(LogError::io(dir))?;
        let name = entry.file_name();
        let Some(start) = name
            .to_str()
            .and_then(|name| name.strip_prefix(&prefix))
            .and_then(|start| start.parse::<u64>().ok())
        else {
            continue;
        };
        match entry.metadata() {
            Ok(metadata) => segments.push(Segment {
                start,
                len: metadata.len(),
            }),
            Err(error) if error.kind() == std::io::ErrorKind::NotFound => {}
            Err(error) => return Err(LogError::io(&entry.path())(error)),
        }
    }
    segments.sort_by_key(|segment| segment.start);
    Ok(segments)
}

#[cfg(any(test, feature = "test-util"))]
/// Every file of the log `head_path` that exists, with its length: what the
/// log takes on disk.
pub(crate) fn files_on_disk(head_path: &Path) -> Vec<(PathBuf, u64)> {
    let mut files: Vec<(PathBuf, u64)> = [head_path.to_owned(), marker_path(head_path)]
        .into_iter()
        .filter_map(|path| {
            let len = std::fs::metadata(&path).ok()?.len();
            Some((path, len))
        })
        .collect();
    for segment in list_segments(head_path).unwrap_or_default() {
        files.push((segment_path(head_path, segment.start), segment.len));
    }
    files
}
