//! The object store's vocabulary: who owns an object ([`Owner`]), the limits it
//! is opened with, what it reports about an object and its tiers, the changes it
//! tells the head about, and how an object's id is computed ([`object_id`]).
//!
//! Plain data and one pure function: no I/O, no locking, nothing that knows how
//! the store keeps its objects. It is a leaf, so the index, the disk tier and the
//! store itself can all use these types without importing from one another.
//!
//! Invariant: [`object_id`] returns exactly what [`ObjectId::of`] does for the
//! same bytes, however it spreads the hashing over cores.

use std::fmt;

use xp_runtime::ids::{ObjectId, TrialId};

/// Inputs at least this large are hashed on all cores.
const PARALLEL_HASH_BYTES: usize = 4 << 20;

/// The id of `bytes`, as [`ObjectId::of`] computes it, using every core for large
/// objects: verifying a large object is what bounds a local `get`.
pub(crate) fn object_id(bytes: &[u8]) -> ObjectId {
    if bytes.len() < PARALLEL_HASH_BYTES {
        return ObjectId::of(bytes);
    }
    let mut hasher = blake3::Hasher::new();
    hasher.update_rayon(bytes);
    ObjectId(*hasher.finalize().as_bytes())
}

/// A change to what this node's store holds, for the head's directory.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ObjectChange {
    /// Now held.
    Added(ObjectId),
    /// No longer held.
    Dropped(ObjectId),
}

/// Who keeps an object alive; an object whose last owner is released (and that
/// is not pinned) is deleted.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Owner {
    /// A trial's workers, released when the trial ends.
    Trial(TrialId),
    /// A driver program, by the name it registered under.
    Driver(String),
}

impl Owner {
    /// The trials and the driver sessions among `owners`, as the wire and the
    /// lane rules take them.
    pub(crate) fn split(owners: Vec<Self>) -> (Vec<TrialId>, Vec<String>) {
        let mut trials = Vec::new();
        let mut drivers = Vec::new();
        for owner in owners {
            match owner {
                Self::Trial(trial_id) => trials.push(trial_id),
                Self::Driver(session) => drivers.push(session),
            }
        }
        (trials, drivers)
    }
}

impl fmt::Display for Owner {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Trial(trial_id) => write!(f, "trial {trial_id}"),
            Self::Driver(name) => write!(f, "driver {name:?}"),
        }
    }
}

/// How much the store may hold.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StoreLimits {
    /// Bytes the memory tier may hold; an object larger than this goes straight to disk.
    pub memory_bytes: u64,
    /// Bytes the disk tier may hold: the store's final capacity.
    pub disk_bytes: u64,
    /// The largest single object accepted, checked before anything is written.
    pub max_object_bytes: u64,
}

impl Default for StoreLimits {
    /// 1 GiB of memory, 256 GiB of disk, objects up to 64 GiB.
    fn default() -> Self {
        Self {
            memory_bytes: 1 << 30,
            disk_bytes: 256 << 30,
            max_object_bytes: 64 << 30,
        }
    }
}

/// Where an object lives now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Tier {
    /// In this process's memory (including while it is being spilled to disk).
    Memory,
    /// In a file under the store's directory.
    Disk,
}

/// What the store knows about one object.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ObjectInfo {
    /// The object's length in bytes.
    pub size: u64,
    /// The tier it is charged to.
    pub tier: Tier,
    /// Who keeps it alive, in order.
    pub owners: Vec<Owner>,
    /// Whether it survives losing all its owners.
    pub pinned: bool,
}

/// Bytes and object counts per tier.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct StoreStats {
    /// Bytes charged to the memory tier.
    pub memory_bytes: u64,
    /// Objects in the memory tier.
    pub memory_objects: u64,
    /// Bytes charged to the disk tier (without writes still in progress).
    pub disk_bytes: u64,
    /// Objects in the disk tier.
    pub disk_objects: u64,
}
