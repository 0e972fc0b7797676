//! Reading a capped log by stream offset: the head, then the marker where bytes
//! were dropped, then the tail, one piece per call.
//!
//! Not here: writing (`writer`), and deciding whether the worker has ended (the
//! agent knows, and says so in the chunk it answers).
//!
//! Invariants: a read returns the bytes at `[offset, next_offset)` exactly, or,
//! from an offset whose bytes were dropped, only the marker with `next_offset`
//! at the oldest byte still kept; so a reader that always continues at
//! `next_offset` never sees a kept byte twice and never misses one. Reads run
//! while the writer writes: the tail segments are listed before the head's length
//! is taken (so a head still growing is never mistaken for a cut one), and a
//! segment deleted between listing and opening makes the read start over.

use std::io::{Read, Seek, SeekFrom};
use std::path::Path;

use super::{LogError, Segment, list_segments, marker_line, segment_path};

/// One piece of a log.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LogRead {
    /// The bytes, or the marker line standing for dropped ones.
    pub data: Vec<u8>,
    /// Where the next read continues.
    pub next_offset: u64,
}

/// How often a read starts over because the segment it wanted was dropped
/// meanwhile; the second try already finds the offset dropped and answers the
/// marker, so more is only a guard.
const ATTEMPTS: usize = 4;

/// Reads at most `max_bytes` of the log `head_path` from stream offset `offset`
/// (the marker, when it is answered, may be longer). Empty data means nothing
/// after `offset` has been written yet.
pub fn read(head_path: &Path, offset: u64, max_bytes: u32) -> Result<LogRead, LogError> {
    let max_bytes = u64::from(max_bytes);
    for _ in 0..ATTEMPTS {
        let segments = list_segments(head_path)?;
        let head_len = match std::fs::metadata(head_path) {
            Ok(metadata) => metadata.len(),
            Err(error) if error.kind() == std::io::ErrorKind::NotFound => {
                return Err(LogError::NotFound {
                    path: head_path.to_owned(),
                });
            }
            Err(error) => return Err(LogError::io(head_path)(error)),
        };
        if offset < head_len {
            let data =
                read_at(head_path, offset, max_bytes.min(head_len - offset))?.ok_or_else(|| {
                    LogError::NotFound {
                        path: head_path.to_owned(),
                    }
                })?;
            return Ok(LogRead {
                next_offset: offset + data.len() as u64,
                data,
            });
        }
        let (Some(oldest), Some(newest)) = (segments.first(), segments.last()) else {
            return Ok(nothing_yet(offset));
        };
        if offset < oldest.start {
            return marker(head_path, head_len, offset, *oldest, *newest);
        }
        let segment = segments
            .iter()
            .rev()
            .find(|segment| segment.start <= offset)
            .expect("the oldest segment starts at or before the offset");
        let path = segment_path(head_path, segment.start);
        if let Some(data) = read_at(&path, offset - segment.start, max_bytes)? {
            return Ok(LogRead {
                next_offset: offset + data.len() as u64,
                data,
            });
        }
    }
    Ok(nothing_yet(offset))
}

fn nothing_yet(offset: u64) -> LogRead {
    LogRead {
        data: Vec::new(),
        next_offset: offset,
    }
}

/// The marker for a read from `offset`, dropped up to the `oldest` segment. It
/// starts a line of its own: after a newline when the byte before it is known to
/// be one, after an added newline otherwise.
fn marker(
    head_path: &Path,
    head_len: u64,
    offset: u64,
    oldest: Segment,
    newest: Segment,
) -> Result<LogRead, LogError> {
    let after_newline = match offset.checked_sub(1) {
        None => true,
        Some(last) if offset == head_len => {
            read_at(head_path, last, 1)?.is_some_and(|byte| byte == b"\n")
        }
        Some(_) => false,
    };
    let line = marker_line(oldest.start - offset, head_len, newest.end() - oldest.start);
    let mut data = Vec::with_capacity(line.len() + 1);
    if !after_newline {
        data.push(b'\n');
    }
    data.extend_from_slice(line.as_bytes());
    Ok(LogRead {
        data,
        next_offset: oldest.start,
    })
}

/// Up to `len` bytes of `path` from `at`; `None` when the file is gone.
fn read_at(path: &Path, at: u64, len: u64) -> Result<Option<Vec<u8>>, LogError> {
    let mut file = match std::fs::File::open(path) {
        Ok(file) => file,
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(error) => return Err(LogError::io(path)(error)),
    };
    file.seek(SeekFrom::Start(at)).map_err(LogError::io(path))?;
    let mut data = Vec::with_capacity(usize::try_from(len.min(1 << 20)).unwrap_or(1 << 20));
    file.take(len)
        .read_to_end(&mut data)
        .map_err(LogError::io(path))?;
    Ok(Some(data))
}
