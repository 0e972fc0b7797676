//! Collectives for synchronous trainer code: the same operations as
//! [`Communicator`], each blocking the calling thread, on a small tokio runtime the
//! facade owns.
//!
//! The runtime has one worker thread, so background all-reduces and QUIC's
//! keep-alives progress while the trainer computes. Calling these methods from
//! inside an async context panics (tokio refuses to block there); async code uses
//! [`Communicator`] directly.

use std::time::Duration;

use tokio::runtime::Runtime;

use super::communicator::{AllReduceHandle, Communicator};
use super::element::Element;
use super::setup::{RingListener, connect_ring};
use super::{CollectiveConfig, CollectiveError, PeerInfo, ReduceOp, TransportKind};

fn small_runtime(rank: u32) -> Result<Runtime, CollectiveError> {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .thread_name("xp-collective")
        .enable_all()
        .build()
        .map_err(|source| CollectiveError::PeerIo { rank, source })
}

/// A listener bound inside the runtime its [`BlockingCommunicator`] will use.
#[derive(Debug)]
pub struct BlockingRingListener {
    runtime: Runtime,
    listener: RingListener,
}

impl BlockingRingListener {
    /// Binds a listener as [`RingListener::bind_with`] does, on a new small runtime.
    pub fn bind(
        kind: TransportKind,
        host: &str,
        config: CollectiveConfig,
    ) -> Result<Self, CollectiveError> {
        let runtime = small_runtime(u32::MAX)?;
        let listener = runtime.block_on(RingListener::bind_with(kind, host, config))?;
        Ok(Self { runtime, listener })
    }

    /// The port peers connect to.
    pub fn port(&self) -> u16 {
        self.listener.port()
    }

    /// For QUIC, the hash of this listener's certificate.
    pub fn cert_sha256(&self) -> Option<[u8; 32]> {
        self.listener.cert_sha256()
    }

    /// This listener's entry for rendezvous.
    pub fn peer_info(&self, rank: u32, host: &str, same_host: bool) -> PeerInfo {
        self.listener.peer_info(rank, host, same_host)
    }

    /// For QUIC, the TCP port for shared-memory links on this host.
    pub fn shm_port(&self) -> Option<u16> {
        self.listener.shm_port()
    }

    /// Connects into the ring, as [`super::connect_ring`] does, with the
    /// configuration given to [`BlockingRingListener::bind`] and `timeout`.
    pub fn connect_ring(
        self,
        rank: u32,
        peers: &[PeerInfo],
        kind: TransportKind,
        token: &[u8; 32],
        timeout: Duration,
    ) -> Result<BlockingCommunicator, CollectiveError> {
        let Self { runtime, listener } = self;
        let communicator =
            runtime.block_on(connect_ring(listener, rank, peers, kind, token, timeout))?;
        Ok(BlockingCommunicator {
            communicator: Some(communicator),
            runtime,
            #[cfg(feature = "cuda")]
            nccl: None,
        })
    }
}

/// A [`Communicator`] for synchronous code.
#[derive(Debug)]
pub struct BlockingCommunicator {
    /// Dropped inside the runtime before it (see `Drop`).
    communicator: Option<Communicator>,
    runtime: Runtime,
    /// The gang's NCCL communicator for device buffers, when every rank has a GPU
    /// and NCCL (see `rendezvous::nccl_unique_id`).
    #[cfg(feature = "cuda")]
    nccl: Option<crate::nccl::NcclCommunicator>,
}

impl BlockingCommunicator {
    fn inner(&mut self) -> &mut Communicator {
        self.communicator.as_mut().expect("present until drop")
    }

    /// This rank.
    pub fn rank(&self) -> u32 {
        self.communicator.as_ref().map_or(0, Communicator::rank)
    }

    /// The number of ranks.
    pub fn world_size(&self) -> u32 {
        self.communicator
            .as_ref()
            .map_or(0, Communicator::world_size)
    }

    /// As [`Communicator::all_reduce`], blocking.
    pub fn all_reduce<T: Element>(
        &mut self,
        data: &mut [T],
        op: ReduceOp,
    ) -> Result<(), CollectiveError> {
        let communicator = self.communicator.as_mut().expect("present until drop");
        self.runtime.block_on(communicator.all_reduce(data, op))
    }

    /// As [`Communicator::broadcast`], blocking.
    pub fn broadcast<T: Element>(
        &mut self,
        data: &mut [T],
        root: u32,
    ) -> Result<(), CollectiveError> {
        let communicator = self.communicator.as_mut().expect("present until drop");
        self.runtime.block_on(communicator.broadcast(data, root))
    }

    /// As [`Communicator::all_gather`], blocking.
    pub fn all_gather<T: Element>(&mut self, local: &[T]) -> Result<Vec<T>, CollectiveError> {
        let communicator = self.communicator.as_mut().expect("present until drop");
        self.runtime.block_on(communicator.all_gather(local))
    }

    /// As [`Communicator::barrier`], blocking.
    pub fn barrier(&mut self) -> Result<(), CollectiveError> {
        let communicator = self.communicator.as_mut().expect("present until drop");
        self.runtime.block_on(communicator.barrier())
    }

    /// As [`Communicator::all_reduce_async`]: returns at once; wait on the handle
    /// with [`AllReduceHandle::wait_blocking`].
    pub fn all_reduce_async<T: Element>(
        &mut self,
        data: Vec<T>,
        op: ReduceOp,
    ) -> AllReduceHandle<T> {
        let _entered = self.runtime.enter();
        let communicator = self.communicator.as_mut().expect("present until drop");
        communicator.all_reduce_async(data, op)
    }

    /// The async communicator, for code that mixes both styles.
    pub fn communicator(&mut self) -> &mut Communicator {
        self.inner()
    }

    /// Adds the gang's NCCL communicator, joined after the same rendezvous.
    #[cfg(feature = "cuda")]
    pub fn attach_nccl(&mut self, nccl: crate::nccl::NcclCommunicator) {
        self.nccl = Some(nccl);
    }

    /// The gang's NCCL communicator for all-reducing device buffers, or `None`
    /// when some rank has no GPU or no NCCL (the host collectives above still work).
    #[cfg(feature = "cuda")]
    pub fn nccl(&self) -> Option<&crate::nccl::NcclCommunicator> {
        self.nccl.as_ref()
    }
}

impl Drop for BlockingCommunicator {
    fn drop(&mut self) {
        // Closing waits until the next rank has read what this one sent, so a
        // process that exits right after dropping loses nothing in flight.
        if let Some(communicator) = self.communicator.take() {
            self.runtime.block_on(communicator.close());
        }
    }
}
