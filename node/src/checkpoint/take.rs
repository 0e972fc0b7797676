//! Step 2 of the route: a worker's checkpoint directory into the object store.
//!
//! [`take`] renames the directory aside in one step and recreates it empty, so the
//! worker may start on its next checkpoint at once and never mixes two; then it
//! stores each file as an object owned by the trial and pins them all.
//!
//! Not here: deciding whether a checkpoint is kept (only rank 0's are; see
//! `watch`), reporting it, or backing it up.
//!
//! Invariant: either every file is stored and pinned, or the objects this call
//! added are withdrawn again and an error is returned; the staging copy is
//! removed either way.

use std::path::Path;

use xp_runtime::ids::{ObjectId, TrialId};
use xp_runtime::protocol::CheckpointFile;

use super::error::{CheckpointError, io};
use crate::objects::{ObjectStore, Owner};

/// The most files one checkpoint may have.
pub const MAX_FILES: usize = 10_000;
/// How deep a checkpoint's directories may nest.
const MAX_DEPTH: usize = 16;

/// Takes the files in `dir` into `store` as `trial`'s pinned objects and leaves
/// `dir` empty. On failure nothing is reported and the objects this call added
/// are removed again.
pub fn take(
    store: &ObjectStore,
    dir: &Path,
    trial: TrialId,
    step: u64,
) -> Result<Vec<CheckpointFile>, CheckpointError> {
    let staging = dir.with_file_name(format!(
        ".{}-step{step}-{}",
        dir.file_name()
            .and_then(|name| name.to_str())
            .unwrap_or("checkpoint"),
        uuid::Uuid::now_v7().simple()
    ));
    std::fs::rename(dir, &staging).map_err(io("move aside", dir))?;
    std::fs::create_dir_all(dir).map_err(io("recreate", dir))?;
    let result = store_tree(store, &staging, trial);
    if let Err(error) = std::fs::remove_dir_all(&staging) {
        tracing::warn!(%error, staging = %staging.display(), "cannot remove a taken checkpoint's files");
    }
    result
}

fn store_tree(
    store: &ObjectStore,
    root: &Path,
    trial: TrialId,
) -> Result<Vec<CheckpointFile>, CheckpointError> {
    let mut names = Vec::new();
    list_files(root, root, 0, &mut names)?;
    if names.is_empty() {
        return Err(CheckpointError::Invalid(
            "the checkpoint directory is empty: write the files before printing XP_CHECKPOINT"
                .to_owned(),
        ));
    }
    names.sort();
    let mut files = Vec::with_capacity(names.len());
    let mut added: Vec<ObjectId> = Vec::new();
    for name in names {
        let path = root.join(&name);
        match store.put_file(&path, Owner::Trial(trial)) {
            Ok(object) => {
                if !store.info(object).is_some_and(|info| info.pinned) {
                    added.push(object);
                }
                let size = store.info(object).map_or(0, |info| info.size);
                files.push(CheckpointFile { name, object, size });
            }
            Err(source) => {
                // Withdraw only this trial's claim: the same bytes may be another
                // owner's object, which must stay.
                for object in added {
                    let _ = store.remove_owner(object, &Owner::Trial(trial));
                }
                return Err(CheckpointError::Store { name, source });
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

fn list_files(
    root: &Path,
    dir: &Path,
    depth: usize,
    out: &mut Vec<String>,
) -> Result<(), CheckpointError> {
    if depth > MAX_DEPTH {
        return Err(CheckpointError::Invalid(format!(
            "checkpoint directories nest deeper than {MAX_DEPTH}"
        )));
    }
    for entry in std::fs::read_dir(dir).map_err(io("list", dir))? {
        let entry = entry.map_err(io("list", dir))?;
        let path = entry.path();
        let kind = entry.file_type().map_err(io("inspect", &path))?;
        if kind.is_dir() {
            list_files(root, &path, depth + 1, out)?;
        } else if kind.is_file() {
            let relative = path
                .strip_prefix(root)
                .ok()
                .and_then(Path::to_str)
                .ok_or_else(|| {
                    CheckpointError::Invalid(format!("{} is not a UTF-8 name", path.display()))
                })?;
            out.push(relative.to_owned());
            if out.len() > MAX_FILES {
                return Err(CheckpointError::Invalid(format!(
                    "a checkpoint may have at most {MAX_FILES} files"
                )));
            }
        } else {
            return Err(CheckpointError::Invalid(format!(
                "{} is neither a file nor a directory (symbolic links are not followed)",
                path.display()
            )));
        }
    }
    Ok(())
}
