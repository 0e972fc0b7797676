//! Writing one worker's capped log: [`LogWriter`] does the file work
//! synchronously, [`start`] runs it on a blocking thread fed by a bounded
//! channel that the worker's stdout and stderr pumps share through [`LogSender`].
//!
//! Not here: choosing chunk boundaries (the pumps send whole lines where they
//! can), and reading the log back (`reader`).
//!
//! Invariants: each chunk is written with one `write_all` per file it touches,
//! with no buffering in this process, so a reader sees every byte as soon as it
//! was handed over; the writer never stops draining its channel, even once its
//! files failed, so a worker never blocks on a log that cannot be written.

use std::collections::VecDeque;
use std::fs::File;
use std::io::Write;
use std::path::{Path, PathBuf};

use tokio::sync::mpsc;
use tracing::warn;
use xp_runtime::error_chain::error_chain;

use super::{
    LogCap, LogError, Segment, TAIL_SEGMENTS, list_segments, marker_line, marker_path, segment_path,
};

/// How many chunks may wait for the writer before the pumps (and so the worker)
/// wait too.
const CHANNEL_CHUNKS: usize = 16;

/// Writes one worker's output into its head file and rolling tail segments.
#[derive(Debug)]
pub(crate) struct LogWriter {
    head_path: PathBuf,
    cap: LogCap,
    /// The head file, open while it is not full and no tail exists.
    head: Option<File>,
    head_len: u64,
    /// The kept tail segments, oldest first.
    tail: VecDeque<Segment>,
    /// The newest tail segment's file.
    current: Option<File>,
    /// The stream offset of the next byte.
    end: u64,
}

impl LogWriter {
    /// Opens the log `head_path` under `cap`. A log already on disk (a worker
    /// launched again under the same key) is continued after its end.
    pub(crate) fn open(head_path: &Path, cap: LogCap) -> Result<Self, LogError> {
        let tail: VecDeque<Segment> = list_segments(head_path)?.into();
        let head_len = match std::fs::metadata(head_path) {
            Ok(metadata) => metadata.len(),
            Err(error) if error.kind() == std::io::ErrorKind::NotFound => 0,
            Err(error) => return Err(LogError::io(head_path)(error)),
        };
        let mut writer = Self {
            head_path: head_path.to_owned(),
            cap,
            head: None,
            head_len,
            end: tail.back().map_or(head_len, |segment| segment.end()),
            tail,
            current: None,
        };
        if writer.tail.is_empty() && head_len < cap.head() {
            writer.head = Some(append(head_path)?);
        } else if let Some(newest) = writer.tail.back() {
            writer.current = Some(append(&segment_path(head_path, newest.start))?);
        }
        Ok(writer)
    }

    /// Appends `bytes`, dropping the oldest tail segment when the cap needs it.
    pub(crate) fn write(&mut self, mut bytes: &[u8]) -> Result<(), LogError> {
        while !bytes.is_empty() {
            if self.tail.is_empty() && self.head_len < self.cap.head() {
                let room = self.cap.head() - self.head_len;
                let (now, rest) = bytes.split_at(fit(bytes, room));
                let head = match &mut self.head {
                    Some(head) => head,
                    None => self.head.insert(append(&self.head_path)?),
                };
                head.write_all(now).map_err(LogError::io(&self.head_path))?;
                self.head_len += now.len() as u64;
                self.end += now.len() as u64;
                bytes = rest;
                continue;
            }
            self.head = None;
            let newest = match self.tail.back() {
                Some(newest) if newest.len < self.cap.segment() && self.current.is_some() => {
                    *newest
                }
                _ => self.roll()?,
            };
            let (now, rest) = bytes.split_at(fit(bytes, self.cap.segment() - newest.len));
            let path = segment_path(&self.head_path, newest.start);
            self.current
                .as_mut()
                .expect("roll opened the newest segment")
                .write_all(now)
                .map_err(LogError::io(&path))?;
            if let Some(newest) = self.tail.back_mut() {
                newest.len += now.len() as u64;
            }
            self.end += now.len() as u64;
            bytes = rest;
        }
        Ok(())
    }

    /// Closes the log, leaving the final marker when anything was dropped.
    pub(crate) fn finish(self) -> Result<(), LogError> {
        self.leave_marker()
    }

    #[cfg(test)]
    /// The stream offset of the next byte: how much output the log was given.
    pub(crate) fn end(&self) -> u64 {
        self.end
    }

    /// Starts a new tail segment at the current end, then drops the oldest ones
    /// beyond [`TAIL_SEGMENTS`].
    fn roll(&mut self) -> Result<Segment, LogError> {
        let segment = Segment {
            start: self.end,
            len: 0,
        };
        self.current = Some(append(&segment_path(&self.head_path, segment.start))?);
        self.tail.push_back(segment);
        let mut dropped = false;
        while self.tail.len() > TAIL_SEGMENTS {
            let oldest = self.tail.pop_front().expect("more segments than the limit");
            let path = segment_path(&self.head_path, oldest.start);
            match std::fs::remove_file(&path) {
                Ok(()) => {}
                Err(error) if error.kind() == std::io::ErrorKind::NotFound => {}
                Err(error) => return Err(LogError::io(&path)(error)),
            }
            dropped = true;
        }
        if dropped {
            self.leave_marker()?;
        }
        Ok(segment)
    }

    /// Writes the marker file (atomically) when output was dropped.
    fn leave_marker(&self) -> Result<(), LogError> {
        let Some(oldest) = self.tail.front() else {
            return Ok(());
        };
        if oldest.start <= self.head_len {
            return Ok(());
        }
        let marker = marker_line(
            oldest.start - self.head_len,
            self.head_len,
            self.end - oldest.start,
        );
        let path = marker_path(&self.head_path);
        let mut temporary = path.clone();
        temporary.set_file_name(format!(
            ".{}.tmp",
            path.file_name()
                .map(|name| name.to_string_lossy().into_owned())
                .unwrap_or_default()
        ));
        std::fs::write(&temporary, marker).map_err(LogError::io(&temporary))?;
        std::fs::rename(&temporary, &path).map_err(LogError::io(&path))
    }
}

/// How many of `bytes` fit in `room`.
fn fit(bytes: &[u8], room: u64) -> usize {
    usize::try_from(room).map_or(bytes.len(), |room| room.min(bytes.len()))
}

fn append(path: &Path) -> Result<File, LogError> {
    std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
        .map_err(LogError::io(path))
}

/// Hands output to a worker's log writer; cloned for each of its pumps.
#[derive(Debug, Clone)]
pub(crate) struct LogSender {
    chunks: mpsc::Sender<Vec<u8>>,
}

impl LogSender {
    /// Queues `bytes` for the log, waiting while the writer is behind.
    pub(crate) async fn write(&self, bytes: Vec<u8>) {
        if bytes.is_empty() {
            return;
        }
        // A closed channel means the writer is gone; the worker's output is discarded.
        let _ = self.chunks.send(bytes).await;
    }
}

/// Opens the log `head_path` (so it exists once this returns) and starts its
/// writer on a thread of its own. The writer ends, and the handle resolves, once
/// every [`LogSender`] is dropped and all they sent is written. A log that
/// cannot be opened or written is reported once and its output discarded.
pub(crate) async fn start(
    head_path: PathBuf,
    cap: LogCap,
) -> (LogSender, tokio::task::JoinHandle<()>) {
    let (chunks, mut receiver) = mpsc::channel::<Vec<u8>>(CHANNEL_CHUNKS);
    let opened = {
        let head_path = head_path.clone();
        tokio::task::spawn_blocking(move || LogWriter::open(&head_path, cap)).await
    };
    let mut writer = match opened {
        Ok(Ok(writer)) => Some(writer),
        Ok(Err(error)) => {
            warn!(error = %error_chain(&error), "cannot open the worker log; output is discarded");
            None
        }
        Err(error) => {
            warn!(%error, path = %head_path.display(), "cannot open the worker log; output is discarded");
            None
        }
    };
    // A thread of its own for the worker's whole life, not one of tokio's blocking
    // pool: that pool is shared with the object store and log reads, and a node
    // with many workers must not starve them.
    let (done_tx, done_rx) = tokio::sync::oneshot::channel::<()>();
    let drain = move || {
        while let Some(chunk) = receiver.blocking_recv() {
            if let Some(open) = writer.as_mut()
                && let Err(error) = open.write(&chunk)
            {
                warn!(error = %error_chain(&error), "cannot write the worker log; output is discarded from now on");
                writer = None;
            }
        }
        if let Some(writer) = writer
            && let Err(error) = writer.finish()
        {
            warn!(error = %error_chain(&error), "cannot leave the worker log's marker");
        }
        let _ = done_tx.send(());
    };
    if let Err(error) = std::thread::Builder::new()
        .name("xp-worker-log".to_owned())
        .spawn(drain)
    {
        // The closure (and with it the receiver) is dropped: senders see a closed
        // channel and the output is discarded, as for a log that cannot be opened.
        warn!(%error, path = %head_path.display(), "cannot start the worker log's writer; output is discarded");
    }
    let task = xp_runtime::task::spawn("worker-log", async move {
        // Resolves when the writer has written everything, or could not start.
        let _ = done_rx.await;
    });
    (LogSender { chunks }, task)
}
