//! A single-producer single-consumer byte ring in a memory-mapped file, the link
//! between two ranks on one machine.
//!
//! The file lives in `/dev/shm` when it exists (else the temporary directory), is
//! created by the writing rank, opened by the reading rank after the hello on their
//! TCP connection, and unlinked by the writer as soon as the reader has it mapped,
//! so nothing is left behind once both have it. The TCP connection stays open: its
//! end shows that the other process went away, and aborts travel back on it.
//!
//! Layout: one 4 KiB header page (magic, capacity, then the writer's `head` and
//! the reader's `tail` byte counters on their own cache lines, the closed flags and
//! the writer's abort word), then `capacity` data bytes.
//!
//! Invariants:
//! - Only the writer stores `head` and only the reader stores `tail`; `head − tail`
//!   never exceeds the capacity. Bytes between `tail` and `head` belong to the
//!   reader, the rest to the writer (release stores, acquire loads). Each side
//!   checks the other's counter on every load: one that breaks this bound is
//!   [`LinkError::Garbage`], so no copy runs past the mapping.
//! - Every frame is padded to a multiple of 8 bytes and the writer publishes `head`
//!   in multiples of 8, so every piece the reader sees holds whole elements, even
//!   across the wrap (the capacity is a multiple of 8).
//!
//! Waiting: a side that finds nothing to do spins briefly, then yields to the
//! runtime for a short while (cheap when each rank has a core, harmful when ranks
//! outnumber cores), then sleeps. A sleeping reader raises a flag in the header and
//! waits on the TCP connection; the writer, seeing the flag after it publishes,
//! sends one doorbell byte there. A writer waiting for room sleeps a millisecond at
//! a time. Every wait also watches the peer's flags, the TCP connection and the
//! caller's deadline.

use std::io;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};

use memmap2::MmapRaw;
use tokio::io::AsyncReadExt;
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};

use super::element::Element;
use super::link::LinkError;
use super::wire::{FailureCause, FrameHeader, HEADER_BYTES};

const MAGIC: u64 = u64::from_le_bytes(*b"xpshmrg1");
const HEADER_PAGE: usize = 4096;
const OFFSET_MAGIC: usize = 0;
const OFFSET_CAPACITY: usize = 8;
const OFFSET_HEAD: usize = 64;
const OFFSET_TAIL: usize = 128;
const OFFSET_WRITER_CLOSED: usize = 192;
const OFFSET_READER_CLOSED: usize = 256;
const OFFSET_ABORT: usize = 320;
const OFFSET_READER_SLEEPING: usize = 384;

/// The writer publishes at most this many bytes at a time, so the reader can start
/// adding before a whole segment has been copied in.
const MAX_PUBLISH_BYTES: usize = 256 << 10;
/// The writer waits for at least this much room (or the rest of the frame).
const MIN_PUBLISH_BYTES: usize = 32 << 10;
/// How long a reader yields before it sleeps until the doorbell rings.
const READER_YIELD_PHASE: std::time::Duration = std::time::Duration::from_micros(200);
/// How long a writer yields before it sleeps a step at a time.
const WRITER_YIELD_PHASE: std::time::Duration = std::time::Duration::from_millis(1);
/// The writer's sleep between checks, and the longest a reader sleeps without a
/// doorbell before it looks at the flags again.
const SLEEP_STEP: std::time::Duration = std::time::Duration::from_millis(1);
const DOORBELL_WAIT: std::time::Duration = std::time::Duration::from_millis(50);

/// The directory ring files go in: `/dev/shm` when it exists.
pub(crate) fn ring_directory() -> PathBuf {
    let shm = Path::new("/dev/shm");
    if shm.is_dir() {
        shm.to_path_buf()
    } else {
        std::env::temp_dir()
    }
}

/// A mapped ring file.
struct Mapping {
    map: MmapRaw,
    capacity: usize,
}

impl Mapping {
    fn word(&self, offset: usize) -> &AtomicU64 {
        debug_assert!(offset.is_multiple_of(8) && offset + 8 <= HEADER_PAGE);
        // SAFETY: the map is page-aligned and at least a header page long, so the
        // offset is in bounds and 8-aligned; the memory lives as long as `self`,
        // and the other process only ever touches it atomically too.
        unsafe { &*self.map.as_mut_ptr().add(offset).cast::<AtomicU64>() }
    }

    fn flag(&self, offset: usize) -> &AtomicU32 {
        debug_assert!(offset.is_multiple_of(8) && offset + 4 <= HEADER_PAGE);
        // SAFETY: as for `word`.
        unsafe { &*self.map.as_mut_ptr().add(offset).cast::<AtomicU32>() }
    }

    fn data(&self) -> *mut u8 {
        // SAFETY: the map is `HEADER_PAGE + capacity` bytes long.
        unsafe { self.map.as_mut_ptr().add(HEADER_PAGE) }
    }

    /// Copies `bytes` into the ring at stream position `position`.
    ///
    /// The caller must own those ring bytes (they lie between `head` and
    /// `tail + capacity`).
    fn copy_in(&self, position: u64, bytes: &[u8]) {
        let start = (position % self.capacity as u64) as usize;
        let first = bytes.len().min(self.capacity - start);
        // SAFETY: both ranges lie inside the data area (`start + first <=
        // capacity`, the rest wraps to 0 and `bytes.len() <= capacity`), the reader
        // does not touch bytes past `head`, and the source is a different buffer.
        unsafe {
            std::ptr::copy_nonoverlapping(bytes.as_ptr(), self.data().add(start), first);
            std::ptr::copy_nonoverlapping(
                bytes.as_ptr().add(first),
                self.data(),
                bytes.len() - first,
            );
        }
    }

    /// Copies ring bytes at stream position `position` out into `target`.
    ///
    /// The caller must own those ring bytes (they lie between `tail` and `head`).
    fn copy_out(&self, position: u64, target: &mut [u8]) {
        let start = (position % self.capacity as u64) as usize;
        let first = target.len().min(self.capacity - start);
        // SAFETY: as for `copy_in`, with the roles swapped.
        unsafe {
            std::ptr::copy_nonoverlapping(self.data().add(start), target.as_mut_ptr(), first);
            std::ptr::copy_nonoverlapping(
                self.data(),
                target.as_mut_ptr().add(first),
                target.len() - first,
            );
        }
    }

    /// The readable bytes at `position`, up to `len` and the end of the data area.
    fn readable(&self, position: u64, len: usize) -> &[u8] {
        let start = (position % self.capacity as u64) as usize;
        let len = len.min(self.capacity - start);
        // SAFETY: in bounds as above; the caller owns these bytes (between `tail`
        // and `head`), so the writer does not change them while the slice lives.
        unsafe { std::slice::from_raw_parts(self.data().add(start), len) }
    }
}

fn open_mapping(path: &Path, create_capacity: Option<usize>) -> io::Result<Mapping> {
    use std::os::unix::fs::OpenOptionsExt;
    let file = match create_capacity {
        Some(capacity) => {
            let file = std::fs::OpenOptions::new()
                .read(true)
                .write(true)
                .create_new(true)
                .mode(0o600)
                .open(path)?;
            file.set_len((HEADER_PAGE + capacity) as u64)?;
            file
        }
        None => std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(path)?,
    };
    let map = MmapRaw::map_raw(&file)?;
    let invalid = |what: &str| {
        io::Error::new(
            io::ErrorKind::InvalidData,
            format!("{}: {what}", path.display()),
        )
    };
    if map.len() < HEADER_PAGE + 8 {
        return Err(invalid("too small for a ring"));
    }
    let mut mapping = Mapping { map, capacity: 0 };
    match create_capacity {
        Some(capacity) => {
            mapping.capacity = capacity;
            mapping
                .word(OFFSET_CAPACITY)
                .store(capacity as u64, Ordering::Relaxed);
            mapping.word(OFFSET_MAGIC).store(MAGIC, Ordering::Release);
        }
        None => {
            if mapping.word(OFFSET_MAGIC).load(Ordering::Acquire) != MAGIC {
                return Err(invalid("not an xp ring"));
            }
            let capacity = usize::try_from(mapping.word(OFFSET_CAPACITY).load(Ordering::Relaxed))
                .map_err(|_| invalid("capacity out of range"))?;
            if capacity == 0
                || !capacity.is_multiple_of(8)
                || mapping.map.len() != HEADER_PAGE + capacity
            {
                return Err(invalid("capacity does not match the file"));
            }
            mapping.capacity = capacity;
        }
    }
    Ok(mapping)
}

/// Creates a ring file of `capacity` data bytes (rounded up to a multiple of 8, at
/// least 64 KiB) in `dir`; returns its path and the writing end's mapping.
pub(crate) fn create_ring(dir: &Path, capacity: usize) -> io::Result<(PathBuf, RingFile)> {
    let capacity = capacity.max(64 << 10).next_multiple_of(8);
    let path = dir.join(format!("xp-ring-{:016x}", rand::random::<u64>()));
    let mapping = open_mapping(&path, Some(capacity))?;
    Ok((path, RingFile(mapping)))
}

/// Opens the ring file at `path` that another rank created.
pub(crate) fn open_ring(path: &Path) -> io::Result<RingFile> {
    open_mapping(path, None).map(RingFile)
}

/// A mapped ring not yet given a role.
pub(crate) struct RingFile(Mapping);

impl RingFile {
    /// The writing end, keeping `control` (the TCP connection's write half) open.
    pub(crate) fn into_writer(self, control: OwnedWriteHalf) -> ShmWriter {
        ShmWriter {
            ring: self.0,
            head: 0,
            tail: 0,
            control,
        }
    }

    /// The reading end, watching `control` (the TCP connection's read half) for
    /// the writer's process going away.
    pub(crate) fn into_reader(self, control: OwnedReadHalf) -> ShmReader {
        ShmReader {
            ring: self.0,
            head: 0,
            tail: 0,
            control,
        }
    }
}

/// Waits a little longer each time: spin, then yield, then sleep.
struct Backoff {
    rounds: u32,
    since: Option<tokio::time::Instant>,
    yield_phase: std::time::Duration,
}

impl Backoff {
    fn new(yield_phase: std::time::Duration) -> Self {
        Self {
            rounds: 0,
            since: None,
            yield_phase,
        }
    }

    /// Whether the next snooze sleeps rather than spinning or yielding.
    fn sleeping(&mut self) -> bool {
        let since = *self.since.get_or_insert_with(tokio::time::Instant::now);
        self.rounds >= 16 && since.elapsed() >= self.yield_phase
    }

    async fn snooze(&mut self) {
        self.rounds = self.rounds.saturating_add(1);
        if self.rounds < 16 {
            std::hint::spin_loop();
        } else if self.sleeping() {
            tokio::time::sleep(SLEEP_STEP).await;
        } else {
            // Let the operating system run the peer's thread if it shares this
            // core, then let the runtime run other tasks.
            std::thread::yield_now();
            tokio::task::yield_now().await;
        }
    }
}

/// The writing end of a ring.
pub(crate) struct ShmWriter {
    ring: Mapping,
    /// Bytes written so far (this side owns `head`).
    head: u64,
    /// The reader's `tail` as last seen.
    tail: u64,
    /// Where doorbells go; kept open so the reader does not see the connection end.
    control: OwnedWriteHalf,
}

impl ShmWriter {
    fn free(&self) -> usize {
        self.ring.capacity - (self.head - self.tail) as usize
    }

    /// Writes one frame: the header, the payload and zeros up to a multiple of 8.
    pub(crate) async fn write_frame(
        &mut self,
        header: &[u8; HEADER_BYTES],
        payload: &[u8],
    ) -> Result<(), LinkError> {
        let total = (HEADER_BYTES + payload.len()).next_multiple_of(8);
        let mut done = 0;
        let mut backoff = Backoff::new(WRITER_YIELD_PHASE);
        while done < total {
            let wanted = (total - done).min(MIN_PUBLISH_BYTES);
            if self.free() < wanted {
                let tail = self.ring.word(OFFSET_TAIL).load(Ordering::Acquire);
                // Another process stores `tail`: one ahead of `head` or a whole
                // ring behind would make `free` exceed the capacity and the copy
                // run past the mapping.
                if tail > self.head || self.head - tail > self.ring.capacity as u64 {
                    return Err(LinkError::Garbage);
                }
                self.tail = tail;
                if self.free() < wanted {
                    if self.ring.flag(OFFSET_READER_CLOSED).load(Ordering::Acquire) != 0 {
                        return Err(LinkError::Closed);
                    }
                    backoff.snooze().await;
                    continue;
                }
            }
            let count = (total - done)
                .min(self.free() / 8 * 8)
                .min(MAX_PUBLISH_BYTES);
            self.copy_frame_range(header, payload, done, count);
            done += count;
            self.head += count as u64;
            self.ring
                .word(OFFSET_HEAD)
                .store(self.head, Ordering::Release);
            self.ring_doorbell();
            backoff = Backoff::new(WRITER_YIELD_PHASE);
        }
        Ok(())
    }

    /// Wakes the reader if it went to sleep.
    fn ring_doorbell(&self) {
        // Pairs with the fence in `ShmReader::sleep`: either the reader sees the new
        // `head`, or this side sees its flag.
        std::sync::atomic::fence(Ordering::SeqCst);
        if self
            .ring
            .flag(OFFSET_READER_SLEEPING)
            .swap(0, Ordering::SeqCst)
            != 0
        {
            // A full socket buffer already holds doorbells; an error shows up on
            // the reader's side as the connection's end.
            let _ = self.control.try_write(&[1]);
        }
    }

    /// Copies bytes `from..from + count` of the frame `header ++ payload ++ padding`
    /// to the ring at `head`. Padding is left as whatever the ring held.
    fn copy_frame_range(
        &self,
        header: &[u8; HEADER_BYTES],
        payload: &[u8],
        from: usize,
        count: usize,
    ) {
        let end = from + count;
        if from < HEADER_BYTES {
            let part = &header[from..end.min(HEADER_BYTES)];
            self.ring.copy_in(self.head, part);
        }
        let payload_from = from.max(HEADER_BYTES) - HEADER_BYTES;
        let payload_to = (end.max(HEADER_BYTES) - HEADER_BYTES).min(payload.len());
        if payload_from < payload_to {
            let position = self.head + (payload_from + HEADER_BYTES - from) as u64;
            self.ring
                .copy_in(position, &payload[payload_from..payload_to]);
        }
    }

    /// Tells the reader that this side gave up because of `culprit`; it sees this
    /// after the frames already in the ring.
    pub(crate) async fn abort(&mut self, header: &[u8; HEADER_BYTES]) -> Result<(), LinkError> {
        if let Some(FrameHeader::Abort { culprit, cause }) = FrameHeader::decode(header) {
            let word = (u64::from(cause as u32) << 32) | u64::from(culprit);
            self.ring
                .word(OFFSET_ABORT)
                .store(word | (1 << 63), Ordering::Release);
        }
        Ok(())
    }
}

impl Drop for ShmWriter {
    fn drop(&mut self) {
        self.ring
            .flag(OFFSET_WRITER_CLOSED)
            .store(1, Ordering::Release);
    }
}

/// The reading end of a ring.
pub(crate) struct ShmReader {
    ring: Mapping,
    /// The writer's `head` as last seen.
    head: u64,
    /// Bytes consumed so far (this side owns `tail`).
    tail: u64,
    control: OwnedReadHalf,
}

impl ShmReader {
    fn available(&self) -> usize {
        (self.head - self.tail) as usize
    }

    fn consume(&mut self, count: usize) {
        self.tail += count as u64;
        self.ring
            .word(OFFSET_TAIL)
            .store(self.tail, Ordering::Release);
    }

    /// Waits until at least `wanted` bytes are readable; returns how many are.
    async fn wait_readable(&mut self, wanted: usize) -> Result<usize, LinkError> {
        if self.available() >= wanted {
            return Ok(self.available());
        }
        let mut backoff = Backoff::new(READER_YIELD_PHASE);
        loop {
            let head = self.ring.word(OFFSET_HEAD).load(Ordering::Acquire);
            // Another process stores `head`: one behind `tail` or more than a ring
            // ahead would make `available` exceed the capacity and a copy run past
            // the mapping.
            if head < self.tail || head - self.tail > self.ring.capacity as u64 {
                return Err(LinkError::Garbage);
            }
            self.head = head;
            if self.available() >= wanted {
                return Ok(self.available());
            }
            self.check_writer()?;
            if backoff.sleeping() {
                self.sleep().await?;
            } else {
                let mut byte = [0u8; 1];
                match self.control.try_read(&mut byte) {
                    Ok(0) => return Err(LinkError::Closed),
                    // A doorbell that arrived after all.
                    Ok(_) => {}
                    Err(error) if error.kind() == io::ErrorKind::WouldBlock => {}
                    Err(_) => return Err(LinkError::Closed),
                }
                backoff.snooze().await;
            }
        }
    }

    /// Fails if the writer gave up or went away.
    fn check_writer(&self) -> Result<(), LinkError> {
        let abort = self.ring.word(OFFSET_ABORT).load(Ordering::Acquire);
        if abort != 0 {
            return Err(LinkError::Aborted {
                culprit: abort as u32,
                cause: cause_from_code((abort >> 32) as u32 & 0x7fff_ffff),
            });
        }
        if self.ring.flag(OFFSET_WRITER_CLOSED).load(Ordering::Acquire) != 0 {
            return Err(LinkError::Closed);
        }
        Ok(())
    }

    /// Sleeps until the doorbell rings, the connection ends or a short while passed.
    async fn sleep(&mut self) -> Result<(), LinkError> {
        let sleeping = self.ring.flag(OFFSET_READER_SLEEPING);
        sleeping.store(1, Ordering::SeqCst);
        // Pairs with the fence in `ShmWriter::ring_doorbell`.
        std::sync::atomic::fence(Ordering::SeqCst);
        let head = self.ring.word(OFFSET_HEAD).load(Ordering::SeqCst);
        if head != self.head {
            sleeping.store(0, Ordering::Relaxed);
            return Ok(());
        }
        let mut doorbells = [0u8; 64];
        tokio::select! {
            () = tokio::time::sleep(DOORBELL_WAIT) => Ok(()),
            read = self.control.read(&mut doorbells) => match read {
                Ok(0) | Err(_) => Err(LinkError::Closed),
                Ok(_) => Ok(()),
            },
        }
    }

    pub(crate) async fn read_header(&mut self) -> Result<FrameHeader, LinkError> {
        self.wait_readable(HEADER_BYTES).await?;
        let mut bytes = [0u8; HEADER_BYTES];
        self.ring.copy_out(self.tail, &mut bytes);
        self.consume(HEADER_BYTES);
        FrameHeader::decode(&bytes).ok_or(LinkError::Garbage)
    }

    /// Skips the padding after a payload of `len` bytes.
    async fn skip_padding(&mut self, len: usize) -> Result<(), LinkError> {
        let padding = (HEADER_BYTES + len).next_multiple_of(8) - HEADER_BYTES - len;
        if padding > 0 {
            self.wait_readable(padding).await?;
            self.consume(padding);
        }
        Ok(())
    }

    pub(crate) async fn read_copy(&mut self, target: &mut [u8]) -> Result<(), LinkError> {
        let mut done = 0;
        while done < target.len() {
            let available = self.wait_readable(1).await?;
            let count = available.min(target.len() - done);
            self.ring
                .copy_out(self.tail, &mut target[done..done + count]);
            done += count;
            self.consume(count);
        }
        self.skip_padding(target.len()).await
    }

    pub(crate) async fn read_reduce<T: Element>(
        &mut self,
        target: &mut [T],
    ) -> Result<(), LinkError> {
        let len = target.len() * T::SIZE;
        let mut done = 0;
        while done < len {
            let available = self.wait_readable(1).await?;
            let piece = self.ring.readable(self.tail, available.min(len - done));
            // Invariant: frames and publications are 8-byte aligned, so a piece
            // holds whole elements.
            assert!(
                piece.len().is_multiple_of(T::SIZE),
                "a ring piece splits an element"
            );
            let first = done / T::SIZE;
            let count = piece.len();
            T::add_assign_bytes(&mut target[first..first + count / T::SIZE], piece);
            done += count;
            self.consume(count);
        }
        self.skip_padding(len).await
    }
}

impl Drop for ShmReader {
    fn drop(&mut self) {
        self.ring
            .flag(OFFSET_READER_CLOSED)
            .store(1, Ordering::Release);
    }
}

fn cause_from_code(code: u32) -> FailureCause {
    match code {
        1 => FailureCause::Closed,
        2 => FailureCause::Timeout,
        3 => FailureCause::Protocol,
        4 => FailureCause::Mismatch,
        _ => FailureCause::Other,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::collective::element::Dtype;
    use crate::collective::wire::{FrameSummary, OpCode};

    async fn tcp_pair() -> (tokio::net::TcpStream, tokio::net::TcpStream) {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let address = listener.local_addr().unwrap();
        let (left, right) =
            tokio::join!(tokio::net::TcpStream::connect(address), listener.accept());
        (left.unwrap(), right.unwrap().0)
    }

    fn summary(len: usize) -> FrameSummary {
        FrameSummary {
            op: OpCode::AllReduce,
            dtype: Dtype::F32,
            seq: 0,
            index: 0,
            len: len as u64,
        }
    }

    #[tokio::test]
    async fn frames_wrap_around_a_small_ring_and_close_is_seen() {
        let dir = tempfile::tempdir().unwrap();
        let (path, file) = create_ring(dir.path(), 64 << 10).unwrap();
        let reader_file = open_ring(&path).unwrap();
        std::fs::remove_file(&path).unwrap();
        let (left, right) = tcp_pair().await;
        let (_left_read, left_write) = left.into_split();
        let (right_read, _right_write) = right.into_split();
        let mut writer = file.into_writer(left_write);
        let mut reader = reader_file.into_reader(right_read);
        // 3 frames of odd sizes, several times the capacity in all.
        let payloads: Vec<Vec<f32>> = (0..12)
            .map(|i| (0..(7000 + i * 13)).map(|x| x as f32).collect())
            .collect();
        let sender = async {
            for payload in &payloads {
                let bytes = f32::as_bytes(payload);
                let header = FrameHeader::Data(summary(bytes.len())).encode();
                writer.write_frame(&header, bytes).await.unwrap();
            }
            writer
        };
        let receiver = async {
            for (i, payload) in payloads.iter().enumerate() {
                let header = reader.read_header().await.unwrap();
                assert_eq!(header, FrameHeader::Data(summary(payload.len() * 4)));
                let mut target = vec![1.0f32; payload.len()];
                if i.is_multiple_of(2) {
                    reader.read_reduce(&mut target).await.unwrap();
                    let expected: Vec<f32> = payload.iter().map(|x| x + 1.0).collect();
                    assert_eq!(target, expected);
                } else {
                    reader
                        .read_copy(f32::as_bytes_mut(&mut target))
                        .await
                        .unwrap();
                    assert_eq!(&target, payload);
                }
            }
        };
        let (writer, ()) = tokio::join!(sender, receiver);
        drop(writer);
        assert!(matches!(reader.read_header().await, Err(LinkError::Closed)));
    }

    /// Hostile counters: the other rank's process writes `head` (or `tail`) in
    /// the shared header; one that runs backwards or more than a ring ahead is
    /// `Garbage`, not an overflow or a copy past the mapping (before the check, a
    /// debug build panicked on the subtraction and a release build copied out of
    /// bounds).
    #[tokio::test]
    async fn counters_out_of_range_are_garbage() {
        let dir = tempfile::tempdir().unwrap();
        let (path, file) = create_ring(dir.path(), 64 << 10).unwrap();
        let reader_file = open_ring(&path).unwrap();
        let hostile = open_ring(&path).unwrap();
        let capacity = hostile.0.capacity as u64;
        let (left, right) = tcp_pair().await;
        let (_left_read, left_write) = left.into_split();
        let (right_read, _right_write) = right.into_split();
        let mut writer = file.into_writer(left_write);
        let mut reader = reader_file.into_reader(right_read);
        let header = FrameHeader::Heartbeat.encode();
        writer.write_frame(&header, &[]).await.unwrap();
        assert_eq!(reader.read_header().await.unwrap(), FrameHeader::Heartbeat);
        let head = hostile.0.word(OFFSET_HEAD);
        for bad_head in [0, HEADER_BYTES as u64 + capacity + 8] {
            head.store(bad_head, Ordering::Release);
            assert!(
                matches!(reader.read_header().await, Err(LinkError::Garbage)),
                "head {bad_head}"
            );
        }
        // Fill the ring exactly, so the writer must look at the reader's tail.
        let payload = vec![0u8; capacity as usize - 2 * HEADER_BYTES];
        writer.write_frame(&header, &payload).await.unwrap();
        let tail = hostile.0.word(OFFSET_TAIL);
        for bad_tail in [writer.head + 8, u64::MAX] {
            tail.store(bad_tail, Ordering::Release);
            assert!(
                matches!(
                    writer.write_frame(&header, &[]).await,
                    Err(LinkError::Garbage)
                ),
                "tail {bad_tail}"
            );
        }
    }
}
