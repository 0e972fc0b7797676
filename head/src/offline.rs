//! Answers from a stopped head's data directory: `xp status --data-dir` and
//! where `xp logs --data-dir` finds a worker's log, with no head running.
//!
//! The database is opened read-only and the core is restored from it exactly as
//! a starting head restores it, so the views are the ones a running head would
//! answer. Nothing here writes, places or serves anything; a database still held
//! by a running head is refused (ask that head instead).

use std::path::{Path, PathBuf};

use xp_runtime::clock::{Clock, SystemClock};
use xp_runtime::ids::{NodeId, WorkerKey};
use xp_runtime::protocol::{ExperimentStatus, LogRequest};

use crate::registry::{Registry, RegistryError};
use xp_head_core::{CoreConfig, CoreError, HeadCore};

/// Why a stopped head's data could not be read.
#[derive(Debug, thiserror::Error)]
pub enum OfflineError {
    /// The directory holds no head database.
    #[error("no head database at {}", path.display())]
    Missing {
        /// Where it was looked for.
        path: PathBuf,
    },
    /// The database could not be read (a running head holds it, or it is damaged).
    #[error("cannot read {}: {source}", path.display())]
    Registry {
        /// The database file.
        path: PathBuf,
        /// The cause.
        #[source]
        source: RegistryError,
    },
    /// The request names something the records do not hold.
    #[error(transparent)]
    Core(#[from] CoreError),
}

/// A head's records restored from its data directory, for reading only.
pub struct OfflineHead {
    core: HeadCore,
}

impl std::fmt::Debug for OfflineHead {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OfflineHead").finish_non_exhaustive()
    }
}

impl OfflineHead {
    /// Loads the records kept in `data_dir` (the head's `--data-dir`).
    pub fn open(data_dir: &Path) -> Result<Self, OfflineError> {
        let path = data_dir.join("head.redb");
        if !path.is_file() {
            return Err(OfflineError::Missing { path });
        }
        let loaded = Registry::load_read_only(&path)
            .map_err(|source| OfflineError::Registry { path, source })?;
        let core = HeadCore::restore(CoreConfig::default(), loaded, SystemClock.now());
        Ok(Self { core })
    }

    /// Experiments matching `filter` (an id or unique prefix), or all, as `xp status` shows them.
    pub fn status(&self, filter: Option<&str>) -> Result<Vec<ExperimentStatus>, OfflineError> {
        Ok(self.core.status(filter)?)
    }

    /// Where a worker's log lives: its node and its key.
    pub fn locate_worker(&self, request: &LogRequest) -> Result<(NodeId, WorkerKey), OfflineError> {
        let (node, key, _exited) = self.core.locate_worker(request)?;
        Ok((node, key))
    }
}

/// The status of the experiments matching `filter` kept in a stopped head's `data_dir`.
pub fn offline_status(
    data_dir: &Path,
    filter: Option<&str>,
) -> Result<Vec<ExperimentStatus>, OfflineError> {
    OfflineHead::open(data_dir)?.status(filter)
}
