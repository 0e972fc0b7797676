//! [`StoreError`], why an object store operation failed, and [`IoOperation`],
//! the file operation named in its I/O variant.
//!
//! A leaf: the store, its index and its disk tier all return these, and none of
//! them is imported from here back up. Errors are never serialized; what crosses
//! the wire is the object protocol's own error codes, chosen by the server.

use std::fmt;
use std::path::PathBuf;

use xp_runtime::ids::ObjectId;

/// The file operation that failed, for [`StoreError::Io`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IoOperation {
    /// Creating the store's directory.
    CreateDirectory,
    /// Taking the directory's lock file.
    LockDirectory,
    /// Listing the directory at open.
    ReadDirectory,
    /// Creating a temporary file.
    CreateFile,
    /// Writing object bytes.
    Write,
    /// Flushing a file to stable storage.
    Sync,
    /// Renaming a finished file to its final name.
    RenameIntoPlace,
    /// Moving a file aside before deleting it.
    MoveAside,
    /// Removing a stale temporary file.
    Remove,
    /// Opening a file to read it.
    Open,
    /// Memory-mapping a file.
    Map,
}

impl fmt::Display for IoOperation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::CreateDirectory => "create directory",
            Self::LockDirectory => "lock directory",
            Self::ReadDirectory => "read directory",
            Self::CreateFile => "create",
            Self::Write => "write",
            Self::Sync => "sync",
            Self::RenameIntoPlace => "rename into place",
            Self::MoveAside => "move aside",
            Self::Remove => "remove",
            Self::Open => "open",
            Self::Map => "map",
        })
    }
}

/// Why a store operation failed.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// No object with this id is stored here.
    #[error("object {id} is not in the store")]
    NotFound {
        /// The object asked for.
        id: ObjectId,
    },
    /// The object is over the configured size limit; nothing was stored.
    #[error("object of {size} bytes is over the {limit}-byte object size limit")]
    TooLarge {
        /// The object's size; for a stream, the bytes read before giving up.
        size: u64,
        /// The configured limit.
        limit: u64,
    },
    /// Even after spilling everything that can spill, the object does not fit;
    /// nothing was stored and nothing was evicted.
    #[error("store full: {needed} bytes needed, {available} of the disk tier's {limit} bytes free")]
    Full {
        /// The object's size; for a stream, the bytes read before giving up.
        needed: u64,
        /// Disk-tier bytes free when the put was refused.
        available: u64,
        /// The disk tier's limit.
        limit: u64,
    },
    /// Bytes that should have been one object hash to another; nothing was stored.
    #[error("bytes expected to be object {expected} hash to {actual}")]
    Mismatch {
        /// The object they should have been.
        expected: ObjectId,
        /// What they hash to.
        actual: ObjectId,
    },
    /// The object's file did not hash to its id; the file was deleted, so a later
    /// put (for example from a replica) repairs it.
    #[error("object {id} failed its hash check on disk and was deleted")]
    Corrupt {
        /// The damaged object.
        id: ObjectId,
    },
    /// The object was indexed on disk but its file was gone (removed behind the
    /// store's back); the entry was dropped.
    #[error("object {id} was on disk but its file is gone")]
    Missing {
        /// The lost object.
        id: ObjectId,
    },
    /// Another store in this or another process has the directory open.
    #[error("object directory {dir} is already open in another store")]
    Locked {
        /// The directory.
        dir: PathBuf,
    },
    /// The reader given to `ObjectStore::put_reader` failed; nothing was stored.
    #[error("cannot read the object's bytes")]
    Read {
        /// The reader's error.
        #[source]
        source: std::io::Error,
    },
    /// The blocking task running a store operation for an async caller died.
    #[error("the store operation's task failed: {reason}")]
    Task {
        /// The runtime's words.
        reason: String,
    },
    /// A file operation failed; no partial object was left under a final name.
    #[error("cannot {operation} {path}")]
    Io {
        /// What was being done.
        operation: IoOperation,
        /// The file or directory it was done to.
        path: PathBuf,
        /// The operating system's error.
        #[source]
        source: std::io::Error,
    },
}
