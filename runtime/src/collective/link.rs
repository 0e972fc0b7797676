//! The two halves of a ring position: frames to the next rank and from the previous
//! one, over byte streams (TCP, QUIC, in-memory pipes) or a shared-memory ring.
//!
//! A link knows nothing of ranks or schedules: it moves frames (see `wire`) and
//! reports what went wrong as a [`LinkError`]; the communicator names the rank.
//! Each position holds four parts, borrowed separately so they run concurrently:
//! `to_next` and `from_prev` carry data forward, `from_next` and `to_prev` carry
//! aborts backward and show when a neighbour goes away.
//!
//! Invariant: the readers are used again only after every earlier read completed;
//! a collective that fails poisons its communicator, so a reader left mid-frame is
//! never read from again. Writers remember how much of a frame is unsent, so an
//! abort can still be written at a frame boundary after a cancelled write.

use std::io;
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

use super::element::Element;
use super::quic::QuicConnections;
use super::shm::{ShmReader, ShmWriter};
use super::wire::{FailureCause, FrameHeader, FrameSummary, HEADER_BYTES};

/// A boxed byte stream read half; TCP, QUIC and pipes look the same behind it.
pub(crate) type BoxRead = Box<dyn AsyncRead + Send + Unpin>;
/// A boxed byte stream write half.
pub(crate) type BoxWrite = Box<dyn AsyncWrite + Send + Unpin>;

/// Bytes read from a stream per addition, small enough to stay in cache.
const REDUCE_PIECE_BYTES: usize = 128 << 10;

/// What went wrong on a link, before the communicator names the rank.
#[derive(Debug)]
pub(crate) enum LinkError {
    /// The peer closed the link or its process went away.
    Closed,
    /// Nothing happened for this long.
    Timeout(Duration),
    /// The operating system reported an error.
    Io(io::Error),
    /// The peer gave up because of `culprit`.
    Aborted { culprit: u32, cause: FailureCause },
    /// The peer sent bytes that are not a frame.
    Garbage,
}

impl From<io::Error> for LinkError {
    fn from(error: io::Error) -> Self {
        use io::ErrorKind::{
            BrokenPipe, ConnectionAborted, ConnectionReset, NotConnected, UnexpectedEof,
        };
        match error.kind() {
            UnexpectedEof | ConnectionReset | ConnectionAborted | BrokenPipe | NotConnected => {
                Self::Closed
            }
            _ => Self::Io(error),
        }
    }
}

/// Runs `future` with a deadline of `after`.
pub(crate) async fn deadline<T>(
    after: Duration,
    future: impl Future<Output = Result<T, LinkError>>,
) -> Result<T, LinkError> {
    tokio::time::timeout(after, future)
        .await
        .unwrap_or(Err(LinkError::Timeout(after)))
}

/// One framed byte stream going out.
pub(crate) struct StreamWriter {
    inner: BoxWrite,
    /// Bytes of the current frame not yet written; non-zero only after a cancelled
    /// write.
    unsent: usize,
    /// The most bytes handed to `inner` in one write.
    max_write: usize,
}

impl StreamWriter {
    pub(crate) fn new(inner: BoxWrite) -> Self {
        Self {
            inner,
            unsent: 0,
            max_write: usize::MAX,
        }
    }

    /// A writer that hands `inner` at most `max_write` bytes at a time: quinn copies
    /// each write into one allocation, and small ones are recycled by the allocator
    /// instead of being mapped and faulted in afresh.
    pub(crate) fn with_max_write(inner: BoxWrite, max_write: usize) -> Self {
        Self {
            inner,
            unsent: 0,
            max_write: max_write.max(HEADER_BYTES),
        }
    }

    /// Writes one frame; cancel-safe in the sense that `unsent` stays exact.
    async fn write_frame(&mut self, header: &[u8; HEADER_BYTES], payload: &[u8]) -> io::Result<()> {
        let total = HEADER_BYTES + payload.len();
        self.unsent = total;
        while self.unsent > 0 {
            let written = total - self.unsent;
            let bufs;
            let slices: &[io::IoSlice<'_>] = if written < HEADER_BYTES {
                let rest = payload.len().min(self.max_write - (HEADER_BYTES - written));
                bufs = [
                    io::IoSlice::new(&header[written..]),
                    io::IoSlice::new(&payload[..rest]),
                ];
                &bufs
            } else {
                let start = written - HEADER_BYTES;
                let end = payload.len().min(start.saturating_add(self.max_write));
                bufs = [
                    io::IoSlice::new(&payload[start..end]),
                    io::IoSlice::new(&[]),
                ];
                &bufs[..1]
            };
            let count = self.inner.write_vectored(slices).await?;
            if count == 0 {
                return Err(io::ErrorKind::WriteZero.into());
            }
            self.unsent -= count;
        }
        Ok(())
    }

    /// Finishes a frame cut short by a cancelled write with zeros, so that the next
    /// header starts where the reader expects one.
    async fn finish_partial_frame(&mut self) -> io::Result<()> {
        let zeros = [0u8; 4096];
        while self.unsent > 0 {
            let count = self
                .inner
                .write(&zeros[..self.unsent.min(zeros.len())])
                .await?;
            if count == 0 {
                return Err(io::ErrorKind::WriteZero.into());
            }
            self.unsent -= count;
        }
        Ok(())
    }

    async fn flush(&mut self) -> io::Result<()> {
        self.inner.flush().await
    }
}

/// One framed byte stream coming in.
pub(crate) struct StreamReader {
    inner: BoxRead,
    scratch: Vec<u8>,
}

impl StreamReader {
    pub(crate) fn new(inner: BoxRead) -> Self {
        Self {
            inner,
            scratch: Vec::new(),
        }
    }

    async fn read_header(&mut self) -> Result<FrameHeader, LinkError> {
        let mut bytes = [0u8; HEADER_BYTES];
        self.inner.read_exact(&mut bytes).await?;
        FrameHeader::decode(&bytes).ok_or(LinkError::Garbage)
    }

    async fn read_copy(&mut self, target: &mut [u8]) -> Result<(), LinkError> {
        self.inner.read_exact(target).await?;
        Ok(())
    }

    async fn read_reduce<T: Element>(&mut self, target: &mut [T]) -> Result<(), LinkError> {
        let piece_elems = (REDUCE_PIECE_BYTES / T::SIZE).max(1);
        if self.scratch.len() < piece_elems * T::SIZE {
            self.scratch.resize(piece_elems * T::SIZE, 0);
        }
        for piece in target.chunks_mut(piece_elems) {
            let bytes = &mut self.scratch[..piece.len() * T::SIZE];
            self.inner.read_exact(bytes).await?;
            T::add_assign_bytes(piece, bytes);
        }
        Ok(())
    }
}

/// Frames to the next rank.
pub(crate) enum FwdWriter {
    /// One or more byte streams; data frame `i` goes on stream `i % len`, heartbeats
    /// and aborts on all of them.
    Streams(Vec<StreamWriter>),
    /// A shared-memory ring.
    Shm(ShmWriter),
}

impl FwdWriter {
    /// Sends data frame `index`.
    pub(crate) async fn send_data(
        &mut self,
        index: usize,
        summary: FrameSummary,
        payload: &[u8],
    ) -> Result<(), LinkError> {
        let header = FrameHeader::Data(summary).encode();
        match self {
            Self::Streams(streams) => {
                let count = streams.len();
                let stream = &mut streams[index % count];
                stream.write_frame(&header, payload).await?;
                Ok(())
            }
            Self::Shm(ring) => ring.write_frame(&header, payload).await,
        }
    }

    /// Tells the next rank that this one is alive and inside a collective.
    pub(crate) async fn send_heartbeat(&mut self) -> Result<(), LinkError> {
        let header = FrameHeader::Heartbeat.encode();
        match self {
            Self::Streams(streams) => {
                for stream in streams.iter_mut() {
                    stream.write_frame(&header, &[]).await?;
                    stream.flush().await?;
                }
                Ok(())
            }
            Self::Shm(ring) => ring.write_frame(&header, &[]).await,
        }
    }

    /// Tells the next rank that this one gave up because of `culprit`.
    pub(crate) async fn send_abort(
        &mut self,
        culprit: u32,
        cause: FailureCause,
    ) -> Result<(), LinkError> {
        let header = FrameHeader::Abort { culprit, cause }.encode();
        match self {
            Self::Streams(streams) => {
                for stream in streams.iter_mut() {
                    stream.finish_partial_frame().await?;
                    stream.write_frame(&header, &[]).await?;
                    stream.flush().await?;
                }
                Ok(())
            }
            Self::Shm(ring) => ring.abort(&header).await,
        }
    }
}

/// Frames from the previous rank.
pub(crate) enum FwdReader {
    /// One or more byte streams, as in [`FwdWriter::Streams`].
    Streams(Vec<StreamReader>),
    /// A shared-memory ring.
    Shm(ShmReader),
}

impl FwdReader {
    /// Reads headers of the stream that carries data frame `index` until a data
    /// header, skipping heartbeats; each header read has its own deadline, so a
    /// peer that keeps sending heartbeats is never timed out.
    pub(crate) async fn next_data(
        &mut self,
        index: usize,
        timeout: Duration,
    ) -> Result<FrameSummary, LinkError> {
        loop {
            let header = match self {
                Self::Streams(streams) => {
                    let count = streams.len();
                    let stream = &mut streams[index % count];
                    deadline(timeout, stream.read_header()).await?
                }
                Self::Shm(ring) => deadline(timeout, ring.read_header()).await?,
            };
            match header {
                FrameHeader::Data(summary) => return Ok(summary),
                FrameHeader::Heartbeat => {}
                FrameHeader::Abort { culprit, cause } => {
                    return Err(LinkError::Aborted { culprit, cause });
                }
            }
        }
    }

    /// Reads the payload of data frame `index` over `target`.
    pub(crate) async fn read_copy(
        &mut self,
        index: usize,
        target: &mut [u8],
        timeout: Duration,
    ) -> Result<(), LinkError> {
        match self {
            Self::Streams(streams) => {
                let count = streams.len();
                deadline(timeout, streams[index % count].read_copy(target)).await
            }
            Self::Shm(ring) => deadline(timeout, ring.read_copy(target)).await,
        }
    }

    /// Reads the payload of data frame `index` and adds it to `target`.
    pub(crate) async fn read_reduce<T: Element>(
        &mut self,
        index: usize,
        target: &mut [T],
        timeout: Duration,
    ) -> Result<(), LinkError> {
        match self {
            Self::Streams(streams) => {
                let count = streams.len();
                deadline(timeout, streams[index % count].read_reduce(target)).await
            }
            Self::Shm(ring) => deadline(timeout, ring.read_reduce(target)).await,
        }
    }
}

/// What came back from the next rank.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum RevEvent {
    /// The next rank closed the link.
    Closed,
    /// The next rank gave up because of `culprit`.
    Aborted { culprit: u32, cause: FailureCause },
    /// The next rank sent bytes that are not an abort frame.
    Garbage,
}

/// Aborts and closure from the next rank.
pub(crate) struct RevReader {
    inner: BoxRead,
    buffer: [u8; HEADER_BYTES],
    filled: usize,
    /// Once something happened it stays happened.
    seen: Option<RevEvent>,
}

impl RevReader {
    pub(crate) fn new(inner: BoxRead) -> Self {
        Self {
            inner,
            buffer: [0; HEADER_BYTES],
            filled: 0,
            seen: None,
        }
    }

    /// What the next rank already said, if anything.
    pub(crate) fn seen(&self) -> Option<RevEvent> {
        self.seen
    }

    /// Waits for the next rank to close or abort. Cancel-safe: partial frames are
    /// kept in `self`.
    pub(crate) async fn next_event(&mut self) -> RevEvent {
        if let Some(event) = self.seen {
            return event;
        }
        let event = loop {
            match self.inner.read(&mut self.buffer[self.filled..]).await {
                Ok(0) | Err(_) => break RevEvent::Closed,
                Ok(count) => {
                    self.filled += count;
                    if self.filled == HEADER_BYTES {
                        self.filled = 0;
                        match FrameHeader::decode(&self.buffer) {
                            Some(FrameHeader::Abort { culprit, cause }) => {
                                break RevEvent::Aborted { culprit, cause };
                            }
                            Some(FrameHeader::Heartbeat) => {}
                            _ => break RevEvent::Garbage,
                        }
                    }
                }
            }
        };
        self.seen = Some(event);
        event
    }
}

/// Aborts back to the previous rank.
pub(crate) struct RevWriter {
    inner: BoxWrite,
}

impl RevWriter {
    pub(crate) fn new(inner: BoxWrite) -> Self {
        Self { inner }
    }

    pub(crate) async fn send_abort(
        &mut self,
        culprit: u32,
        cause: FailureCause,
    ) -> Result<(), LinkError> {
        let header = FrameHeader::Abort { culprit, cause }.encode();
        self.inner.write_all(&header).await?;
        self.inner.flush().await?;
        Ok(())
    }
}

/// Everything one rank holds of its ring.
pub(crate) struct Links {
    pub(crate) to_next: FwdWriter,
    pub(crate) from_next: RevReader,
    pub(crate) from_prev: FwdReader,
    pub(crate) to_prev: RevWriter,
    /// The QUIC connections under the parts above, if any.
    pub(crate) quic: QuicConnections,
}

impl Links {
    /// What carries data to the next rank and from the previous one: `shm`, `quic`
    /// or `tcp`.
    pub(crate) fn transports(&self) -> [&'static str; 2] {
        let to_next = match (&self.to_next, &self.quic.to_next) {
            (FwdWriter::Shm(_), _) => "shm",
            (FwdWriter::Streams(_), Some(_)) => "quic",
            (FwdWriter::Streams(_), None) => "tcp",
        };
        let from_prev = match (&self.from_prev, &self.quic.from_prev) {
            (FwdReader::Shm(_), _) => "shm",
            (FwdReader::Streams(_), Some(_)) => "quic",
            (FwdReader::Streams(_), None) => "tcp",
        };
        [to_next, from_prev]
    }

    /// Closes the links without losing bytes still in flight (see
    /// [`QuicConnections::close`]); byte streams and shared memory deliver what was
    /// written before they close, so only QUIC needs to wait.
    pub(crate) async fn close(self, linger: Duration) {
        let Self {
            to_next,
            from_next,
            from_prev,
            to_prev,
            quic,
        } = self;
        quic.close(linger).await;
        drop((to_next, from_next, from_prev, to_prev));
    }
}

#[cfg(test)]
pub(crate) fn mem_pair(capacity: usize) -> ((FwdWriter, RevReader), (FwdReader, RevWriter)) {
    let (left, right) = tokio::io::duplex(capacity);
    let (left_read, left_write) = tokio::io::split(left);
    let (right_read, right_write) = tokio::io::split(right);
    (
        (
            FwdWriter::Streams(vec![StreamWriter::new(Box::new(left_write))]),
            RevReader::new(Box::new(left_read)),
        ),
        (
            FwdReader::Streams(vec![StreamReader::new(Box::new(right_read))]),
            RevWriter::new(Box::new(right_write)),
        ),
    )
}
