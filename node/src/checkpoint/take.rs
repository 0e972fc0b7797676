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
//! so the node, which may be root, never follows a link there: the staging copy
//! and everything in it are opened with `O_NOFOLLOW` relative to descriptors
//! (`isolation::fs`), a link or special file is refused, and the directory made
//! afresh is given to the worker's id by descriptor.
//!
//! Invariant: either every file is stored and pinned, or the objects this call
//! added are withdrawn again and an error is returned; the staging copy is
//! removed either way.

use std::ffi::OsStr;
use std::io::Read;
use std::os::fd::OwnedFd;
use std::path::Path;

use xp_runtime::ids::{ObjectId, TrialId};
use xp_runtime::protocol::CheckpointFile;

use super::error::{CheckpointError, io};
use crate::isolation::fs::{self as lane_fs, EntryKind, FileOwner};
use crate::objects::{ObjectStore, Owner};

/// The most files one checkpoint may have.
pub(crate) const MAX_FILES: usize = 10_000;
/// How deep a checkpoint's directories may nest.
const MAX_DEPTH: usize = 16;

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
    let parent = dir.parent().unwrap_or(Path::new("/"));
    let staging = dir.with_file_name(format!(
        ".{}-step{step}-{}",
        name.to_str().unwrap_or("checkpoint"),
        uuid::Uuid::now_v7().simple()
    ));
    // rename(2) moves a link itself, never its target.
    std::fs::rename(dir, &staging).map_err(io("move aside", dir))?;
    let recreated = lane_fs::open_dir(parent)
        .and_then(|parent| lane_fs::make_dir_in(&parent, name, 0o700, owner));
    let result = match recreated {
        Ok(_) => lane_fs::open_dir(&staging)
            .map_err(io("open", &staging))
            .and_then(|root| store_tree(store, &root, trial, owner)),
        Err(error) => Err(io("recreate", dir)(error)),
    };
    // remove_dir_all does not follow links either.
    if let Err(error) = std::fs::remove_dir_all(&staging) {
        tracing::warn!(%error, staging = %staging.display(), "cannot remove a taken checkpoint's files");
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
    let root = match lane_fs::open_dir(dir) {
        Ok(root) => root,
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(error) => return Err(io("open", dir)(error)),
    };
    let mut names = Vec::new();
    list_files(&root, "", 0, &mut names)?;
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
        let file = open_below(&root, name, owner).map_err(|source| {
            CheckpointError::Invalid(format!("cannot read output {name}: {source}"))
        })?;
        let len = file
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
    store_named(store, &root, names, trial, owner, Some(&lengths))
}

fn store_tree(
    store: &ObjectStore,
    root: &OwnedFd,
    trial: TrialId,
    owner: Option<FileOwner>,
) -> Result<Vec<CheckpointFile>, CheckpointError> {
    let mut names = Vec::new();
    list_files(root, "", 0, &mut names)?;
    if names.is_empty() {
        return Err(CheckpointError::Invalid(
            "the checkpoint directory is empty: write the files before printing XP_CHECKPOINT"
                .to_owned(),
        ));
    }
    store_named(store, root, names, trial, owner, None)
}

/// Stores the files `names` below `root` as `trial`'s pinned objects; on any
/// failure withdraws what it added.
pub(super) fn store_named(
    store: &ObjectStore,
    root: &OwnedFd,
    mut names: Vec<String>,
    trial: TrialId,
    owner: Option<FileOwner>,
    checked: Option<&std::collections::BTreeMap<String, u64>>,
) -> Result<Vec<CheckpointFile>, CheckpointError> {
    names.sort();
    let mut files = Vec::with_capacity(names.len());
    let mut added: Vec<ObjectId> = Vec::new();
    for name in names {
        // Why a file cannot be read (a hard link, another uid's file) is said
        // in the message itself: it reaches the worker as its verdict.
        let stored = open_below(root, &name, owner)
            .map_err(|source| CheckpointError::Invalid(format!("cannot read {name}: {source}")))
            .and_then(|file| {
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

/// Opens regular file `relative` (a `/`-separated name from [`list_files`])
/// below `root`, one directory at a time, following no link; a hard-linked
/// file, or one `owner` (the worker's own uid) does not own, is refused.
fn open_below(
    root: &OwnedFd,
    relative: &str,
    owner: Option<FileOwner>,
) -> std::io::Result<std::fs::File> {
    let mut parts: Vec<&str> = relative.split('/').collect();
    let file_name = parts.pop().unwrap_or_default();
    let mut dir = root.try_clone()?;
    for part in parts {
        dir = lane_fs::open_dir_in(&dir, OsStr::new(part))?;
    }
    lane_fs::open_regular_in(&dir, OsStr::new(file_name), owner)
}

fn list_files(
    dir: &OwnedFd,
    prefix: &str,
    depth: usize,
    out: &mut Vec<String>,
) -> Result<(), CheckpointError> {
    if depth > MAX_DEPTH {
        return Err(CheckpointError::Invalid(format!(
            "checkpoint directories nest deeper than {MAX_DEPTH}"
        )));
    }
    let shown = |name: &str| format!("{prefix}{name}");
    let listed = lane_fs::list(dir).map_err(io("list", Path::new(prefix)))?;
    for (name, kind) in listed {
        let name = name.to_str().ok_or_else(|| {
            CheckpointError::Invalid(format!("{} is not a UTF-8 name", name.to_string_lossy()))
        })?;
        let relative = shown(name);
        match kind {
            EntryKind::Dir => {
                let sub = lane_fs::open_dir_in(dir, OsStr::new(name))
                    .map_err(io("open", Path::new(&relative)))?;
                list_files(&sub, &format!("{relative}/"), depth + 1, out)?;
            }
            EntryKind::File => {
                out.push(relative);
                if out.len() > MAX_FILES {
                    return Err(CheckpointError::Invalid(format!(
                        "a checkpoint may have at most {MAX_FILES} files"
                    )));
                }
            }
            EntryKind::Other => {
                return Err(CheckpointError::Invalid(format!(
                    "{relative} is neither a file nor a directory (symbolic links are not followed)"
                )));
            }
        }
    }
    Ok(())
}
