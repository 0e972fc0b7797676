//! The checkpoint module's errors: [`CheckpointError`] for one take, backup or
//! restore of files, and [`ResumeError`] for putting back the checkpoint a launch
//! resumes from.
//!
//! A leaf, so every step of the route returns these without importing from the
//! module above. Never serialized: what reaches the head is the message, in a
//! report or a refused launch.

use std::path::{Path, PathBuf};

use crate::objects::StoreError;
use crate::objects::remote::FetchError;

/// Why a checkpoint could not be taken, backed up or restored.
#[derive(Debug, thiserror::Error)]
pub enum CheckpointError {
    /// A file operation failed.
    #[error("cannot {what} {path}: {source}")]
    Io {
        /// What was being done.
        what: &'static str,
        /// On what.
        path: PathBuf,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// The object store refused a file (for example, its disk tier is full).
    #[error("cannot store {name}: {source}")]
    Store {
        /// The file.
        name: String,
        /// The store's reason.
        #[source]
        source: StoreError,
    },
    /// The directory holds something a checkpoint may not.
    #[error("{0}")]
    Invalid(String),
    /// The blocking task taking the checkpoint died.
    #[error(transparent)]
    Task(#[from] tokio::task::JoinError),
}

pub(super) fn io(
    what: &'static str,
    path: &Path,
) -> impl FnOnce(std::io::Error) -> CheckpointError {
    let path = path.to_owned();
    move |source| CheckpointError::Io { what, path, source }
}

/// Why the checkpoint a launch resumes from could not be put back. The worker is
/// not started; the agent refuses the launch, so the head places it again.
#[derive(Debug, thiserror::Error)]
pub(crate) enum ResumeError {
    /// No node could provide an object, and the checkpoint has no backup.
    #[error("cannot restore the checkpoint of step {step}: {source}")]
    Fetch {
        /// The checkpoint's step.
        step: u64,
        /// Why no node could provide it.
        #[source]
        source: FetchError,
    },
    /// No node could provide an object, and neither could the backup directory.
    #[error("cannot restore the checkpoint of step {step}: {fetch}; and from the backup: {source}")]
    Backup {
        /// The checkpoint's step.
        step: u64,
        /// Why no node could provide it.
        fetch: FetchError,
        /// Why the backup could not.
        #[source]
        source: CheckpointError,
    },
    /// The files could not be written into the worker's checkpoint directory.
    #[error("cannot restore the checkpoint of step {step}: {source}")]
    Write {
        /// The checkpoint's step.
        step: u64,
        /// The cause.
        #[source]
        source: CheckpointError,
    },
    /// A blocking task reading the backup or writing the files died.
    #[error("cannot restore the checkpoint of step {step}: {source}")]
    Task {
        /// The checkpoint's step.
        step: u64,
        /// The runtime's error.
        #[source]
        source: tokio::task::JoinError,
    },
}
