//! `Communicator`: one rank's handle on a ring, and the async shell that performs a
//! [`Schedule`] over its links.
//!
//! The shell runs three things at once for each collective: a send loop (frames to
//! the next rank, each after the receive it forwards, with heartbeats while it
//! waits), a receive loop (frames from the previous rank, added or copied into
//! place), and a watchdog on the reverse direction of the next rank's link. Every
//! wait on a peer has the configured deadline. The first failure is sent as an
//! abort to both neighbours, who pass it on, and poisons the communicator.
//!
//! Asynchronous all-reduces move the engine (links and state) into a background
//! task that runs queued operations in order; the next blocking-style call waits
//! for the queue to drain and takes the engine back, so operations never reorder.
//!
//! Invariant: the send loop only reads, and the receive loop only writes, ranges
//! that the schedule orders against each other (see `ring`), which is what makes the
//! shared buffer below sound.

use std::marker::PhantomData;
use std::ops::Range;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use tokio::sync::{Notify, mpsc, oneshot};
use tracing::{debug, instrument, warn};

use super::element::{Dtype, Element};
use super::link::{FwdReader, FwdWriter, LinkError, Links, RevEvent};
use super::ring::{Algorithm, RecvAction, Schedule};
use super::wire::{FrameSummary, OpCode};
use super::{CollectiveConfig, CollectiveError, ReduceOp};

/// A slice shared by the send and receive loops of one collective.
///
/// Both loops run inside one task (`try_join!`), but each holds its part across
/// awaits, so the borrow checker cannot see that their ranges never overlap while
/// both are in use; the schedule guarantees it.
struct SharedSlice<'a, T> {
    ptr: *mut T,
    len: usize,
    _borrow: PhantomData<&'a mut [T]>,
}

// SAFETY: the slice is only reached through `part`/`part_mut`, whose callers keep
// the ranges disjoint; `T: Element` is `Send + Sync` plain data.
unsafe impl<T: Element> Send for SharedSlice<'_, T> {}
// SAFETY: as above.
unsafe impl<T: Element> Sync for SharedSlice<'_, T> {}

impl<'a, T: Element> SharedSlice<'a, T> {
    fn new(slice: &'a mut [T]) -> Self {
        Self {
            ptr: slice.as_mut_ptr(),
            len: slice.len(),
            _borrow: PhantomData,
        }
    }

    /// # Safety
    /// No `part_mut` of an overlapping range may be alive while the result is.
    unsafe fn part(&self, range: Range<usize>) -> &[T] {
        assert!(
            range.start <= range.end && range.end <= self.len,
            "range {range:?} of {}",
            self.len
        );
        // SAFETY: in bounds (checked), and the caller rules out aliasing writes.
        unsafe { std::slice::from_raw_parts(self.ptr.add(range.start), range.len()) }
    }

    /// # Safety
    /// No other part of an overlapping range may be alive while the result is.
    #[expect(clippy::mut_from_ref, reason = "disjointness is the caller's contract")]
    unsafe fn part_mut(&self, range: Range<usize>) -> &mut [T] {
        assert!(
            range.start <= range.end && range.end <= self.len,
            "range {range:?} of {}",
            self.len
        );
        // SAFETY: in bounds (checked), and the caller rules out aliasing.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.add(range.start), range.len()) }
    }
}

/// What one collective needs to know besides its schedule.
#[derive(Debug, Clone, Copy)]
struct Context {
    rank: u32,
    prev: u32,
    next: u32,
    seq: u32,
    op: OpCode,
    dtype: Dtype,
    timeout: Duration,
    heartbeat: Duration,
}

impl Context {
    fn summary(&self, index: usize, range: &Range<usize>, elem_size: usize) -> FrameSummary {
        FrameSummary {
            op: self.op,
            dtype: self.dtype,
            seq: self.seq,
            index: u32::try_from(index).unwrap_or(u32::MAX),
            len: (range.len() * elem_size) as u64,
        }
    }

    /// Names the rank behind a link error: `peer` is the neighbour on that link.
    fn blame(&self, peer: u32, error: LinkError) -> CollectiveError {
        match error {
            LinkError::Closed => CollectiveError::PeerClosed { rank: peer },
            LinkError::Timeout(after) => CollectiveError::PeerTimeout { rank: peer, after },
            LinkError::Io(source) => CollectiveError::PeerIo { rank: peer, source },
            LinkError::Aborted { culprit, cause } => CollectiveError::PeerFailed {
                rank: culprit,
                reported_by: peer,
                cause,
            },
            LinkError::Garbage => CollectiveError::Protocol { rank: peer },
        }
    }
}

/// How far the two loops of one collective got.
struct Progress {
    sent: AtomicUsize,
    received: AtomicUsize,
    sent_changed: Notify,
    received_changed: Notify,
}

impl Progress {
    fn new() -> Self {
        Self {
            sent: AtomicUsize::new(0),
            received: AtomicUsize::new(0),
            sent_changed: Notify::new(),
            received_changed: Notify::new(),
        }
    }

    /// Waits for `count` receives, sending heartbeats to the next rank meanwhile.
    async fn wait_received(
        &self,
        count: usize,
        writer: &mut FwdWriter,
        ctx: &Context,
    ) -> Result<(), CollectiveError> {
        while self.received.load(Ordering::Acquire) < count {
            tokio::select! {
                () = self.received_changed.notified() => {}
                () = tokio::time::sleep(ctx.heartbeat) => {
                    super::link::deadline(ctx.timeout, writer.send_heartbeat())
                        .await
                        .map_err(|error| ctx.blame(ctx.next, error))?;
                }
            }
        }
        Ok(())
    }

    /// Waits for `count` sends; they are local and bounded by their own deadlines.
    async fn wait_sent(&self, count: usize) {
        while self.sent.load(Ordering::Acquire) < count {
            self.sent_changed.notified().await;
        }
    }
}

async fn send_loop<T: Element>(
    writer: &mut FwdWriter,
    ctx: &Context,
    schedule: &Schedule,
    shared: &SharedSlice<'_, T>,
    progress: &Progress,
) -> Result<(), CollectiveError> {
    for (index, op) in schedule.sends.iter().enumerate() {
        progress.wait_received(op.after_recvs, writer, ctx).await?;
        // SAFETY: the schedule orders every receive overlapping this range before
        // or after this send (`after_recvs`/`after_sends`), and both loops wait
        // for those counts.
        let values = unsafe { shared.part(op.range.clone()) };
        let summary = ctx.summary(index, &op.range, T::SIZE);
        super::link::deadline(
            ctx.timeout,
            writer.send_data(index, summary, T::as_bytes(values)),
        )
        .await
        .map_err(|error| ctx.blame(ctx.next, error))?;
        progress.sent.store(index + 1, Ordering::Release);
        progress.sent_changed.notify_one();
    }
    // Keep the next rank from timing out while this one still receives.
    progress
        .wait_received(schedule.recvs.len(), writer, ctx)
        .await
}

async fn recv_loop<T: Element>(
    reader: &mut FwdReader,
    ctx: &Context,
    schedule: &Schedule,
    shared: &SharedSlice<'_, T>,
    progress: &Progress,
) -> Result<(), CollectiveError> {
    for (index, op) in schedule.recvs.iter().enumerate() {
        progress.wait_sent(op.after_sends).await;
        let got = reader
            .next_data(index, ctx.timeout)
            .await
            .map_err(|error| ctx.blame(ctx.prev, error))?;
        let expected = ctx.summary(index, &op.range, T::SIZE);
        if got != expected {
            return Err(CollectiveError::Mismatch {
                rank: ctx.prev,
                expected,
                got,
            });
        }
        // SAFETY: as in `send_loop`; receives run one at a time.
        let target = unsafe { shared.part_mut(op.range.clone()) };
        let received = match op.action {
            RecvAction::Copy => {
                reader
                    .read_copy(index, T::as_bytes_mut(target), ctx.timeout)
                    .await
            }
            RecvAction::Reduce => reader.read_reduce(index, target, ctx.timeout).await,
        };
        received.map_err(|error| ctx.blame(ctx.prev, error))?;
        progress.received.store(index + 1, Ordering::Release);
        progress.received_changed.notify_one();
    }
    Ok(())
}

fn rev_error(ctx: &Context, event: RevEvent) -> CollectiveError {
    match event {
        RevEvent::Closed => CollectiveError::PeerClosed { rank: ctx.next },
        RevEvent::Aborted { culprit, cause } => CollectiveError::PeerFailed {
            rank: culprit,
            reported_by: ctx.next,
            cause,
        },
        RevEvent::Garbage => CollectiveError::Protocol { rank: ctx.next },
    }
}

/// Performs `schedule` over `links`, in place on `workspace`.
async fn drive<T: Element>(
    links: &mut Links,
    ctx: &Context,
    schedule: &Schedule,
    workspace: &mut [T],
) -> Result<(), CollectiveError> {
    if cfg!(debug_assertions) {
        schedule.check_invariants();
    }
    assert_eq!(
        workspace.len(),
        schedule.workspace_len,
        "workspace does not fit the schedule"
    );
    let Links {
        to_next,
        from_next,
        from_prev,
        ..
    } = links;
    if let Some(event) = from_next.seen()
        && !schedule.sends.is_empty()
    {
        return Err(rev_error(ctx, event));
    }
    let shared = SharedSlice::new(workspace);
    let progress = Progress::new();
    let work = async {
        tokio::try_join!(
            send_loop(to_next, ctx, schedule, &shared, &progress),
            recv_loop(from_prev, ctx, schedule, &shared, &progress),
        )
        .map(|_| ())
    };
    let watchdog = async {
        let event = from_next.next_event().await;
        if progress.sent.load(Ordering::Acquire) == schedule.sends.len() {
            // This collective needs nothing more from the next rank; the event
            // stays recorded and fails the next collective.
            std::future::pending::<()>().await;
        }
        rev_error(ctx, event)
    };
    tokio::select! {
        biased;
        result = work => result,
        error = watchdog => Err(error),
    }
}

/// One rank's state: its links and what it has done so far.
pub(crate) struct Engine {
    rank: u32,
    world_size: u32,
    config: CollectiveConfig,
    links: Option<Links>,
    seq: u32,
    /// The rank an earlier failure blamed.
    poisoned: Option<u32>,
}

impl Engine {
    pub(crate) fn new(
        rank: u32,
        world_size: u32,
        config: CollectiveConfig,
        links: Option<Links>,
    ) -> Self {
        Self {
            rank,
            world_size,
            config,
            links,
            seq: 0,
            poisoned: None,
        }
    }

    fn prev(&self) -> u32 {
        (self.rank + self.world_size - 1) % self.world_size
    }

    /// Closes the links: gracefully while the ring is healthy; at once after a
    /// failure, when the neighbours have given up and waiting would only delay the
    /// exit.
    async fn close_links(&mut self) {
        if let Some(links) = self.links.take() {
            if self.poisoned.is_some() {
                drop(links);
            } else {
                links.close(self.config.timeout).await;
            }
        }
    }

    fn next(&self) -> u32 {
        (self.rank + 1) % self.world_size
    }

    async fn run<T: Element>(
        &mut self,
        op: OpCode,
        schedule: &Schedule,
        workspace: &mut [T],
    ) -> Result<(), CollectiveError> {
        if let Some(rank) = self.poisoned {
            return Err(CollectiveError::Poisoned { rank });
        }
        let ctx = Context {
            rank: self.rank,
            prev: self.prev(),
            next: self.next(),
            seq: self.seq,
            op,
            dtype: T::DTYPE,
            timeout: self.config.timeout,
            heartbeat: (self.config.timeout / 4).max(Duration::from_millis(1)),
        };
        self.seq = self.seq.wrapping_add(1);
        if schedule.sends.is_empty() && schedule.recvs.is_empty() {
            return Ok(());
        }
        let links = self
            .links
            .as_mut()
            .expect("a ring of more than one rank has links");
        let result = drive(links, &ctx, schedule, workspace).await;
        if let Err(error) = &result {
            self.fail(&ctx, error).await;
        }
        result
    }

    /// Poisons this engine and tells both neighbours whom to blame.
    async fn fail(&mut self, ctx: &Context, error: &CollectiveError) {
        let culprit = error.rank();
        let cause = error.cause();
        warn!(rank = ctx.rank, culprit, error = %error, "collective failed");
        self.poisoned = Some(culprit);
        let Some(links) = self.links.as_mut() else {
            return;
        };
        let grace = ctx.timeout.min(Duration::from_secs(1));
        let forward = super::link::deadline(grace, links.to_next.send_abort(culprit, cause));
        let backward = super::link::deadline(grace, links.to_prev.send_abort(culprit, cause));
        let (forward, backward) = tokio::join!(forward, backward);
        if forward.is_err() || backward.is_err() {
            debug!(
                rank = ctx.rank,
                culprit, "could not pass the abort on to every neighbour"
            );
        }
    }

    pub(crate) async fn all_reduce<T: Element>(
        &mut self,
        data: &mut [T],
        op: ReduceOp,
    ) -> Result<(), CollectiveError> {
        let schedule = Schedule::all_reduce(
            self.rank,
            self.world_size,
            data.len(),
            T::SIZE,
            self.config.small_buffer_bytes,
            &self.config.segmenting,
        );
        match schedule.algorithm {
            Algorithm::Ring => self.run(OpCode::AllReduce, &schedule, data).await?,
            _ => {
                let len = data.len();
                let mut workspace = vec![T::default(); schedule.workspace_len];
                let own = self.rank as usize * len;
                workspace[own..own + len].copy_from_slice(data);
                self.run(OpCode::AllReduce, &schedule, &mut workspace)
                    .await?;
                // Every rank adds in rank order 0..W, so every rank gets the same bits.
                data.copy_from_slice(&workspace[..len]);
                for block in workspace.chunks_exact(len.max(1)).skip(1) {
                    T::add_assign(data, block);
                }
            }
        }
        if op == ReduceOp::Mean {
            T::divide(data, self.world_size);
        }
        Ok(())
    }

    pub(crate) async fn broadcast<T: Element>(
        &mut self,
        data: &mut [T],
        root: u32,
    ) -> Result<(), CollectiveError> {
        if root >= self.world_size {
            return Err(CollectiveError::InvalidRank {
                rank: root,
                world_size: self.world_size,
            });
        }
        let schedule = Schedule::broadcast(
            self.rank,
            self.world_size,
            root,
            data.len(),
            T::SIZE,
            &self.config.segmenting,
        );
        self.run(OpCode::Broadcast, &schedule, data).await
    }

    pub(crate) async fn all_gather<T: Element>(
        &mut self,
        local: &[T],
    ) -> Result<Vec<T>, CollectiveError> {
        let len = local.len();
        let schedule = Schedule::all_gather(
            self.rank,
            self.world_size,
            len,
            T::SIZE,
            &self.config.segmenting,
        );
        let mut gathered = vec![T::default(); schedule.workspace_len];
        let own = self.rank as usize * len;
        gathered[own..own + len].copy_from_slice(local);
        self.run(OpCode::AllGather, &schedule, &mut gathered)
            .await?;
        Ok(gathered)
    }

    pub(crate) async fn barrier(&mut self) -> Result<(), CollectiveError> {
        // An all-gather of nothing: a rank receives W−1 empty frames, each one sent
        // after its origin entered the barrier.
        let schedule =
            Schedule::all_gather(self.rank, self.world_size, 0, 4, &self.config.segmenting);
        self.run::<f32>(OpCode::Barrier, &schedule, &mut []).await
    }
}

type Job =
    Box<dyn for<'a> FnOnce(&'a mut Engine) -> Pin<Box<dyn Future<Output = ()> + Send + 'a>> + Send>;

/// Where the engine is: here, or in the background task that runs queued jobs.
enum Place {
    Here(Box<Engine>),
    Background {
        jobs: mpsc::UnboundedSender<Job>,
        task: tokio::task::JoinHandle<Box<Engine>>,
    },
    /// The background task panicked or was cancelled.
    Gone,
}

/// One rank's handle on a ring of workers, for collectives over its buffers.
///
/// Every rank must call the same collectives in the same order with buffers of the
/// same length; a rank that does not is detected (`Mismatch`) or, if it calls
/// nothing, times out. After any error the communicator is poisoned and every
/// later call fails: build a new ring. On error a buffer's contents are unspecified.
pub struct Communicator {
    rank: u32,
    world_size: u32,
    transports: [&'static str; 2],
    place: Place,
}

impl std::fmt::Debug for Communicator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Communicator")
            .field("rank", &self.rank)
            .field("world_size", &self.world_size)
            .finish_non_exhaustive()
    }
}

impl Communicator {
    pub(crate) fn new(engine: Engine) -> Self {
        Self {
            rank: engine.rank,
            world_size: engine.world_size,
            transports: engine
                .links
                .as_ref()
                .map_or(["none", "none"], Links::transports),
            place: Place::Here(Box::new(engine)),
        }
    }

    /// This rank, in `0..world_size`.
    pub fn rank(&self) -> u32 {
        self.rank
    }

    /// The number of ranks in the ring.
    pub fn world_size(&self) -> u32 {
        self.world_size
    }

    /// What carries data to the next rank and from the previous one: `shm` between
    /// ranks on one host, else `quic` or `tcp`; `none` in a ring of one.
    pub fn link_transports(&self) -> [&'static str; 2] {
        self.transports
    }

    /// The engine, waiting for queued asynchronous operations to finish first.
    async fn engine(&mut self) -> Result<&mut Engine, CollectiveError> {
        if let Place::Background { .. } = self.place {
            let Place::Background { jobs, task } = std::mem::replace(&mut self.place, Place::Gone)
            else {
                unreachable!("matched above");
            };
            drop(jobs);
            match task.await {
                Ok(engine) => self.place = Place::Here(engine),
                Err(error) => warn!(rank = self.rank, %error, "collective background task failed"),
            }
        }
        match &mut self.place {
            Place::Here(engine) => Ok(engine),
            _ => Err(CollectiveError::Shutdown { rank: self.rank }),
        }
    }

    /// Sums (or averages) `data` over all ranks, in place; every rank ends with the
    /// same bits.
    #[instrument(skip_all, fields(rank = self.rank, len = data.len()))]
    pub async fn all_reduce<T: Element>(
        &mut self,
        data: &mut [T],
        op: ReduceOp,
    ) -> Result<(), CollectiveError> {
        self.engine().await?.all_reduce(data, op).await
    }

    /// Copies `root`'s `data` into every other rank's `data`.
    #[instrument(skip_all, fields(rank = self.rank, len = data.len(), root))]
    pub async fn broadcast<T: Element>(
        &mut self,
        data: &mut [T],
        root: u32,
    ) -> Result<(), CollectiveError> {
        self.engine().await?.broadcast(data, root).await
    }

    /// Concatenates every rank's `local` in rank order; all must have one length.
    #[instrument(skip_all, fields(rank = self.rank, len = local.len()))]
    pub async fn all_gather<T: Element>(&mut self, local: &[T]) -> Result<Vec<T>, CollectiveError> {
        self.engine().await?.all_gather(local).await
    }

    /// Returns once every rank has entered the barrier.
    #[instrument(skip_all, fields(rank = self.rank))]
    pub async fn barrier(&mut self) -> Result<(), CollectiveError> {
        self.engine().await?.barrier().await
    }

    /// Finishes queued asynchronous operations, then closes the links without losing
    /// bytes still in flight to the next rank: over QUIC this waits (up to the
    /// collective timeout) until the next rank has read everything. Call it before
    /// the process exits; dropping the communicator instead closes in the background,
    /// which a process that exits at once may cut short.
    pub async fn close(mut self) {
        if let Ok(engine) = self.engine().await {
            engine.close_links().await;
        }
    }

    /// Starts an all-reduce of `data` in the background and returns at once, so a
    /// trainer can reduce one gradient bucket while it computes the next.
    ///
    /// Operations run in the order they were started, before any later call on this
    /// communicator. Must be called inside a tokio runtime; without one the handle
    /// reports [`CollectiveError::Shutdown`].
    pub fn all_reduce_async<T: Element>(
        &mut self,
        data: Vec<T>,
        op: ReduceOp,
    ) -> AllReduceHandle<T> {
        let (reply, receiver) = oneshot::channel();
        let job: Job = Box::new(move |engine: &mut Engine| {
            Box::pin(async move {
                let mut data = data;
                let result = engine.all_reduce(&mut data, op).await.map(|()| data);
                let _ = reply.send(result);
            })
        });
        self.submit(job);
        AllReduceHandle {
            rank: self.rank,
            receiver,
        }
    }

    fn submit(&mut self, job: Job) {
        if let Place::Here(_) = self.place {
            if tokio::runtime::Handle::try_current().is_err() {
                // Dropping the job drops its reply sender: the handle reports Shutdown.
                return;
            }
            let Place::Here(mut engine) = std::mem::replace(&mut self.place, Place::Gone) else {
                unreachable!("matched above");
            };
            let (jobs, mut queue) = mpsc::unbounded_channel::<Job>();
            let task = crate::task::spawn("collective-background", async move {
                while let Some(job) = queue.recv().await {
                    job(&mut engine).await;
                }
                engine
            });
            self.place = Place::Background { jobs, task };
        }
        if let Place::Background { jobs, .. } = &self.place {
            // A send fails only if the task ended, and then the handle reports it.
            let _ = jobs.send(job);
        }
    }
}

impl Drop for Communicator {
    fn drop(&mut self) {
        let place = std::mem::replace(&mut self.place, Place::Gone);
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            // Without a runtime nothing can wait: the links close at once.
            if let Place::Background { task, .. } = place {
                task.abort();
            }
            return;
        };
        // The neighbours are inside the same collectives as this rank: let queued
        // ones finish, then close gracefully, in the background.
        let _entered = runtime.enter();
        match place {
            Place::Background { jobs, task } => {
                drop(jobs);
                drop(crate::task::spawn("collective-close", async move {
                    if let Ok(mut engine) = task.await {
                        engine.close_links().await;
                    }
                }));
            }
            Place::Here(mut engine) => {
                if engine.links.is_some() {
                    drop(crate::task::spawn("collective-close", async move {
                        engine.close_links().await;
                    }));
                }
            }
            Place::Gone => {}
        }
    }
}

/// An all-reduce running in the background; [`AllReduceHandle::wait`] returns the
/// reduced buffer.
#[derive(Debug)]
#[must_use = "the result of an all-reduce is only available through its handle"]
pub struct AllReduceHandle<T> {
    rank: u32,
    receiver: oneshot::Receiver<Result<Vec<T>, CollectiveError>>,
}

impl<T> AllReduceHandle<T> {
    /// Waits for the all-reduce and returns the reduced buffer.
    pub async fn wait(self) -> Result<Vec<T>, CollectiveError> {
        self.receiver
            .await
            .unwrap_or(Err(CollectiveError::Shutdown { rank: self.rank }))
    }

    /// Waits from synchronous code; panics if called inside an async context.
    pub fn wait_blocking(self) -> Result<Vec<T>, CollectiveError> {
        self.receiver
            .blocking_recv()
            .unwrap_or(Err(CollectiveError::Shutdown { rank: self.rank }))
    }
}
