//! Collectives for the data-parallel workers of one trial: ring all-reduce,
//! broadcast, all-gather and barrier over pluggable links.
//!
//! The ring schedule is a pure core (`ring`); links move bytes between neighbours
//! over TCP, QUIC or shared memory (`link`, `shm`, `quic`, framed as in `wire`);
//! `Communicator` drives the schedule over a ring of links, and
//! `BlockingCommunicator` does the same for synchronous trainer code. `setup`
//! connects a ring once rendezvous (written elsewhere) has told every rank where
//! the others listen. `bench` measures all of it against the machine's ceilings.
//!
//! It does not discover peers, pick ports or talk to the head, and it reduces only
//! floating-point types on the CPU.
//!
//! Invariants:
//! - Every rank ends a collective with bit-identical results (see `ring`).
//! - No collective waits on a peer without a deadline: a rank that dies or stalls
//!   makes every other rank's collective fail within about one timeout, with an
//!   error naming it (`CollectiveError::rank`), and poisons the communicator.
//! - A connection is trusted only after it presented the per-attempt token and the
//!   expected rank; anything else is dropped and logged.
//! - QUIC endpoints, certificates and TLS settings come from `runtime::transport`
//!   (its bulk links, sized by [`CollectiveConfig::quic`]); TCP and shared-memory
//!   links are opened here.

pub mod bench;
mod blocking;
mod communicator;
pub mod element;
mod link;
pub(crate) mod quic;
pub mod ring;
mod setup;
mod shm;
mod wire;

#[cfg(test)]
mod tests;

use std::time::Duration;

use crate::transport::{QuicSetupError, QuicTuning};

pub use blocking::{BlockingCommunicator, BlockingRingListener};
pub use communicator::{AllReduceHandle, Communicator};
pub use element::{Dtype, Element};
pub use ring::{Algorithm, Segmenting};
pub use setup::{RingListener, connect_ring, connect_ring_with, local_ring, local_ring_with};
pub use wire::{FailureCause, FrameSummary, OpCode};

/// How an all-reduce combines the ranks' values.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReduceOp {
    /// The sum over ranks.
    Sum,
    /// The sum divided by the world size, computed the same way on every rank.
    Mean,
}

/// Which links a ring uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TransportKind {
    /// Plain TCP, one connection per neighbour.
    Tcp,
    /// QUIC with TLS 1.3, the certificate pinned by hash.
    Quic,
    /// Shared memory between ranks on one host, TCP to the others.
    Shm,
}

impl TransportKind {
    /// The lowercase name used on command lines and in bench output.
    pub fn name(self) -> &'static str {
        match self {
            Self::Tcp => "tcp",
            Self::Quic => "quic",
            Self::Shm => "shm",
        }
    }
}

/// A transport name that is not `tcp`, `quic` or `shm`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown transport {name:?}: expected tcp, quic or shm")]
pub struct ParseTransportKindError {
    /// The name given.
    pub name: String,
}

impl std::str::FromStr for TransportKind {
    type Err = ParseTransportKindError;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        match text {
            "tcp" => Ok(Self::Tcp),
            "quic" => Ok(Self::Quic),
            "shm" => Ok(Self::Shm),
            other => Err(ParseTransportKindError {
                name: other.to_owned(),
            }),
        }
    }
}

/// Where one rank listens, as rendezvous hands it to every rank.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PeerInfo {
    /// The rank.
    pub rank: u32,
    /// The host or address its listener is reached at.
    pub host: String,
    /// Its listener's port.
    pub port: u16,
    /// Whether it runs on the same host as the rank reading this entry, which lets
    /// the link between them use shared memory.
    pub same_host: bool,
    /// The SHA-256 of its QUIC certificate ([`RingListener::cert_sha256`]); required
    /// for [`TransportKind::Quic`].
    pub cert_sha256: Option<[u8; 32]>,
    /// For a QUIC listener, the TCP port where it accepts shared-memory links from a
    /// rank on its host ([`RingListener::shm_port`]).
    pub shm_port: Option<u16>,
}

/// The knobs of a communicator; the defaults suit a data-centre network.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CollectiveConfig {
    /// How long any wait on a peer may last without progress: connecting, every
    /// receive, every send. Peers inside a collective send heartbeats, so only a
    /// dead or stalled rank, or one that is not calling the collective, runs it out.
    pub timeout: Duration,
    /// How buffers are cut into segments.
    pub segmenting: Segmenting,
    /// All-reduces of at most this many bytes use the latency-optimal path.
    pub small_buffer_bytes: usize,
    /// The data bytes of each shared-memory ring.
    pub shm_ring_bytes: usize,
    /// QUIC sizing.
    pub quic: QuicTuning,
    /// Links between ranks on one host use shared memory whatever the transport
    /// between hosts; off only to measure the network transports on one machine.
    pub same_host_shm: bool,
}

impl Default for CollectiveConfig {
    fn default() -> Self {
        Self {
            timeout: Duration::from_secs(30),
            segmenting: Segmenting::default(),
            small_buffer_bytes: 64 << 10,
            shm_ring_bytes: 8 << 20,
            quic: QuicTuning::default(),
            same_host_shm: true,
        }
    }
}

/// Why a collective, or setting up a ring, failed. Every variant names the rank
/// concerned (see [`CollectiveError::rank`]), so a trainer can report which worker
/// to blame.
#[derive(Debug, thiserror::Error)]
pub enum CollectiveError {
    /// A neighbour neither sent nor accepted anything for a whole timeout.
    #[error("rank {rank} made no progress for {after:?}")]
    PeerTimeout {
        /// The silent neighbour.
        rank: u32,
        /// The timeout.
        after: Duration,
    },
    /// A neighbour closed its link, usually because its process ended.
    #[error("rank {rank} closed its link")]
    PeerClosed {
        /// The neighbour.
        rank: u32,
    },
    /// Reading from or writing to a neighbour failed.
    #[error("i/o with rank {rank} failed")]
    PeerIo {
        /// The neighbour.
        rank: u32,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// Another rank gave up because of `rank` and said so.
    #[error("rank {rank} {cause} (reported by rank {reported_by})")]
    PeerFailed {
        /// The rank to blame.
        rank: u32,
        /// The neighbour that passed the news on.
        reported_by: u32,
        /// What the reporting side saw.
        cause: FailureCause,
    },
    /// A neighbour sent bytes that are not part of the protocol.
    #[error("rank {rank} broke the collective protocol")]
    Protocol {
        /// The neighbour.
        rank: u32,
    },
    /// A neighbour is running a different collective, element type or length.
    #[error("rank {rank} sent {got:?} where {expected:?} was due")]
    Mismatch {
        /// The neighbour.
        rank: u32,
        /// What this rank expected.
        expected: FrameSummary,
        /// What arrived.
        got: FrameSummary,
    },
    /// A peer would not accept this rank's connection (wrong token or rank).
    #[error("rank {rank} refused the connection")]
    Refused {
        /// The refusing peer.
        rank: u32,
    },
    /// A peer could not be reached.
    #[error("cannot connect to rank {rank} at {addr}")]
    Connect {
        /// The peer.
        rank: u32,
        /// Where it was looked for.
        addr: String,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// The QUIC handshake with a peer failed (for example, its certificate does not
    /// have the pinned hash).
    #[error("QUIC connection with rank {rank} failed: {reason}")]
    Quic {
        /// The peer.
        rank: u32,
        /// quinn's explanation.
        reason: String,
    },
    /// Binding or configuring this rank's own listener failed.
    #[error("rank {rank} cannot set up its listener")]
    Listener {
        /// This rank (`u32::MAX` before it knows its rank).
        rank: u32,
        /// The cause.
        #[source]
        source: QuicSetupError,
    },
    /// A peer is missing something rendezvous should have provided.
    #[error("invalid ring description for rank {rank}: {reason}")]
    InvalidPeers {
        /// The rank whose entry is wrong.
        rank: u32,
        /// What is wrong.
        reason: &'static str,
    },
    /// An argument is out of range.
    #[error("rank {rank} is not a rank of this {world_size}-rank ring")]
    InvalidRank {
        /// The argument.
        rank: u32,
        /// The ring's size.
        world_size: u32,
    },
    /// An earlier collective failed because of `rank`; the ring must be rebuilt.
    #[error("the communicator is unusable since rank {rank} failed")]
    Poisoned {
        /// The rank blamed by the earlier failure.
        rank: u32,
    },
    /// The communicator's background task is gone (it was dropped, or there is no
    /// tokio runtime to run it).
    #[error("the communicator of rank {rank} is shut down")]
    Shutdown {
        /// This rank.
        rank: u32,
    },
}

impl CollectiveError {
    /// The rank to blame, or for setup errors the rank concerned.
    pub fn rank(&self) -> u32 {
        match self {
            Self::PeerTimeout { rank, .. }
            | Self::PeerClosed { rank }
            | Self::PeerIo { rank, .. }
            | Self::PeerFailed { rank, .. }
            | Self::Protocol { rank }
            | Self::Mismatch { rank, .. }
            | Self::Refused { rank }
            | Self::Connect { rank, .. }
            | Self::Quic { rank, .. }
            | Self::Listener { rank, .. }
            | Self::InvalidPeers { rank, .. }
            | Self::InvalidRank { rank, .. }
            | Self::Poisoned { rank }
            | Self::Shutdown { rank } => *rank,
        }
    }

    /// What to tell the other ranks about this failure.
    pub fn cause(&self) -> FailureCause {
        match self {
            Self::PeerTimeout { .. } => FailureCause::Timeout,
            Self::PeerClosed { .. } | Self::Shutdown { .. } => FailureCause::Closed,
            Self::PeerFailed { cause, .. } => *cause,
            Self::Protocol { .. } => FailureCause::Protocol,
            Self::Mismatch { .. } => FailureCause::Mismatch,
            _ => FailureCause::Other,
        }
    }
}
