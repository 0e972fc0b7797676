//! Step 2 of the route: a worker's checkpoint directory into the object store.
//!
//! [`take`] renames the directory aside in one step and recreates it empty, so the
//! worker may start on its next checkpoint at once and never mixes two; then it
//! stores each file as an object owned by the trial and pins them all.
//!
//! Not here: deciding whether a checkpoint is kept (only rank 0's are; see
//! `watch`), reporting it, or backing it up.
//!
//! The worker owns the directory and may still be changing it while it is read,
//! so the node, which may be root, reads it as the worker would (`reader`): the
//! staging copy and everything in it are listed and opened on a thread with the
//! worker's file-system identity, below the staging directory's descriptor,
//! following no link; a link, a special file, a hard link or another user's
//! file is refused by the rule it breaks, and the staging copy is removed as
//! the worker too. The directory made afresh is given to the worker's id by
//! descriptor.
//!
//! Invariant: either every file is stored and pinned, or the objects this call
//! added are withdrawn again and an error is returned; the staging copy is
//! removed either way.

use std::ffi::OsStr;
use std::io::Read;
use std::path::Path;

use xp_runtime::ids::{ObjectId, TrialId};
use xp_runtime::protocol::CheckpointFile;

use super::error::{CheckpointError, io};
use super::reader::{WorkerReader, remove_as_worker};
use crate::isolation::fs::{self as lane_fs, FileOwner};
use crate::objects::{ObjectStore, Owner};

/// Takes the files in `dir` into `store` as `trial`'s pinned objects and leaves
/// `dir` empty (made again for `owner`). On failure nothing is reported and the
/// objects this call added are removed again.
pub(crate) fn take(
    store: &ObjectStore,
    dir: &Path,
    owner: Option<FileOwner>,
    trial: TrialId,
    step: u64,
) -> Result<Vec<CheckpointFile>, CheckpointError> {
    let name = dir.file_name().unwrap_or(OsStr::new("checkpoint"));
    let parent_path = dir.parent().unwrap_or(Path::new("/"));
    let staging = format!(
        ".{}-step{step}-{}",
        name.to_str().unwrap_or("checkpoint"),
        uuid::Uuid::now_v7().simple()
    );
    // The work directory's own parent is the node's: it cannot be swapped.
    let parent = lane_fs::open_dir(parent_path).map_err(io("open", parent_path))?;
    // renameat(2) moves a link itself, never its target.
    nix::fcntl::renameat(&parent, name, &parent, staging.as_str())
        .map_err(|errno| io("move aside", dir)(errno.into()))?;
    let result = lane_fs::make_dir_in(&parent, name, 0o700, owner)
        .map_err(io("recreate", dir))
        .and_then(|_| WorkerReader::open(&parent, staging.as_ref(), dir, owner))
        .and_then(|reader| match reader {
            Some(reader) => store_tree(store, &reader, trial),
            None => Err(CheckpointError::Invalid(format!(
                "{} went while it was taken",
                dir.display()
            ))),
        });
    if let Err(error) = remove_as_worker(&parent, staging.as_ref(), owner) {
        tracing::warn!(%error, staging, "cannot remove a taken checkpoint's files");
    }
    result
}

/// The most files and bytes a trial's outputs may have (`xp-node join
/// --output-max-files`, `--output-max-bytes`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OutputLimits {
    /// Files.
    pub max_files: usize,
    /// Bytes, all files together.
    pub max_bytes: u64,
}

impl Default for OutputLimits {
    fn default() -> Self {
        Self {
            max_files: 1_000,
            max_bytes: 1 << 30,
        }
    }
}

/// Stores every regular file under `dir` (rank 0's `XP_OUTPUT_DIR`, after it
/// exited) as `trial`'s pinned objects, read like a checkpoint (no link
/// followed; hard-linked or, under a worker uid, foreign files refused). An
/// empty or missing directory has no outputs. Past `limits` nothing is stored
/// and the error says which limit.
pub(crate) fn take_outputs(
    store: &ObjectStore,
    dir: &Path,
    owner: Option<FileOwner>,
    trial: TrialId,
    limits: OutputLimits,
) -> Result<Vec<CheckpointFile>, CheckpointError> {
    let parent_path = dir.parent().unwrap_or(Path::new("/"));
    let name = dir.file_name().unwrap_or(OsStr::new("output"));
    let parent = match lane_fs::open_dir(parent_path) {
        Ok(parent) => parent,
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(error) => return Err(io("open", parent_path)(error)),
    };
    let Some(reader) = WorkerReader::open(&parent, name, dir, owner)? else {
        return Ok(Vec::new());
    };
    let names = reader.list()?;
    if names.len() > limits.max_files {
        return Err(CheckpointError::Invalid(format!(
            "XP_OUTPUT_DIR holds {} files, more than the node's limit of {} (--output-max-files)",
            names.len(),
            limits.max_files
        )));
    }
    let mut total: u64 = 0;
    let mut lengths = std::collections::BTreeMap::new();
    for name in &names {
        let len = reader
            .open_file(name)?
            .metadata()
            .map_err(|source| {
                CheckpointError::Invalid(format!("cannot read output {name}: {source}"))
            })?
            .len();
        lengths.insert(name.clone(), len);
        total = total.saturating_add(len);
        if total > limits.max_bytes {
            return Err(CheckpointError::Invalid(format!(
                "XP_OUTPUT_DIR holds more than the node's limit of {} (--output-max-bytes)",
                bytesize::ByteSize(limits.max_bytes)
            )));
        }
    }
    store_named(store, &reader, names, trial, Some(&lengths))
}

fn store_tree(
    store: &ObjectStore,
    reader: &WorkerReader,
    trial: TrialId,
) -> Result<Vec<CheckpointFile>, CheckpointError> {
    let names = reader.list()?;
    if names.is_empty() {
        return Err(CheckpointError::Invalid(
            "the checkpoint directory is empty: write the files before printing XP_CHECKPOINT"
                .to_owned(),
        ));
    }
    store_named(store, reader, names, trial, None)
}

/// Stores the files `names` of `reader`'s directory as `trial`'s pinned
/// objects; on any failure withdraws what it added.
pub(super) fn store_named(
    store: &ObjectStore,
    reader: &WorkerReader,
    mut names: Vec<String>,
    trial: TrialId,
    checked: Option<&std::collections::BTreeMap<String, u64>>,
) -> Result<Vec<CheckpointFile>, CheckpointError> {
    names.sort();
    let mut files = Vec::with_capacity(names.len());
    let mut added: Vec<ObjectId> = Vec::new();
    for name in names {
        // Why a file cannot be read (a hard link, another uid's file) is said
        // in the message itself: it reaches the worker as its verdict.
        let stored = reader.open_file(&name).and_then(|file| {
            let stored = match checked.and_then(|checked| checked.get(&name)) {
                // At most one byte past the length the limit was checked
                // against: a file that grew since is refused, not read to its end.
                Some(&len) => store
                    .put_reader(file.take(len.saturating_add(1)), Owner::Trial(trial))
                    .map(|object| (object, Some(len))),
                None => store
                    .put_reader(file, Owner::Trial(trial))
                    .map(|object| (object, None)),
            };
            let (object, len) = stored.map_err(|source| CheckpointError::Store {
                name: name.clone(),
                source,
            })?;
            let size = store.info(object).map_or(0, |info| info.size);
            match len {
                Some(len) if size != len => {
                    if !store.info(object).is_some_and(|info| info.pinned) {
                        let _ = store.remove_owner(object, &Owner::Trial(trial));
                    }
                    Err(CheckpointError::Invalid(format!(
                        "output {name} changed while it was stored ({len} bytes when checked)"
                    )))
                }
                _ => Ok(object),
            }
        });
        match stored {
            Ok(object) => {
                if !store.info(object).is_some_and(|info| info.pinned) {
                    added.push(object);
                }
                let size = store.info(object).map_or(0, |info| info.size);
                files.push(CheckpointFile { name, object, size });
            }
            Err(error) => {
                // Withdraw only this trial's claim: the same bytes may be another
                // owner's object, which must stay.
                for object in added {
                    let _ = store.remove_owner(object, &Owner::Trial(trial));
                }
                return Err(error);
            }
        }
    }
    for file in &files {
        store
            .pin(file.object)
            .map_err(|source| CheckpointError::Store {
                name: file.name.clone(),
                source,
            })?;
    }
    Ok(files)
}
