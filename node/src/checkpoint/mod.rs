//! Checkpoint files in and out of the object store.
//!
//! A worker writes a checkpoint's files into its `XP_CHECKPOINT_DIR` and then
//! says `XP_CHECKPOINT {"step": N}` on stdout. [`take`] first renames the whole
//! directory aside (one atomic step, so the worker can start on the next
//! checkpoint at once and never mixes two), recreates it empty, and stores each
//! file as an object. Only when every file is stored does the node report the
//! checkpoint, so the head never records a half-written one. [`restore`] fills
//! a new worker's directory again before it starts.

use std::path::{Path, PathBuf};

use xp_runtime::ids::{ObjectId, TrialId};
use xp_runtime::protocol::CheckpointFile;

use crate::objects::{ObjectBytes, ObjectStore, Owner, StoreError};

/// The most files one checkpoint may have.
pub const MAX_FILES: usize = 10_000;
/// How deep a checkpoint's directories may nest.
const MAX_DEPTH: usize = 16;

/// Why a checkpoint could not be taken or restored.
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
}

fn io(what: &'static str, path: &Path) -> impl FnOnce(std::io::Error) -> CheckpointError {
    let path = path.to_owned();
    move |source| CheckpointError::Io { what, path, source }
}

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

/// A checkpoint file's object from `store`, verified.
fn stored_bytes(
    store: &ObjectStore,
    file: &CheckpointFile,
) -> Result<ObjectBytes, CheckpointError> {
    store
        .get(file.object)
        .map_err(|source| CheckpointError::Store {
            name: file.name.clone(),
            source,
        })
}

/// Writes `files` from `store` into `dir` (created if needed); see [`write_files`].
pub fn restore(
    store: &ObjectStore,
    dir: &Path,
    files: &[CheckpointFile],
) -> Result<(), CheckpointError> {
    let contents = files
        .iter()
        .map(|file| stored_bytes(store, file))
        .collect::<Result<Vec<_>, _>>()?;
    write_files(dir, files, &contents)
}

/// Writes each of `files` with its verified `contents` (in the same order) into
/// `dir`, created if needed. Each file is a copy, so the worker may change it
/// without touching the stored object.
pub fn write_files(
    dir: &Path,
    files: &[CheckpointFile],
    contents: &[ObjectBytes],
) -> Result<(), CheckpointError> {
    std::fs::create_dir_all(dir).map_err(io("create", dir))?;
    for (file, bytes) in files.iter().zip(contents) {
        if !xp_runtime::protocol::is_safe_checkpoint_name(&file.name) {
            return Err(CheckpointError::Invalid(format!(
                "checkpoint file name {:?} is not a plain relative path",
                file.name
            )));
        }
        let path = dir.join(&file.name);
        if let Some(parent) = path.parent() {
            std::fs::create_dir_all(parent).map_err(io("create", parent))?;
        }
        std::fs::write(&path, &bytes[..]).map_err(io("write", &path))?;
    }
    Ok(())
}

/// The file of object `id` in a backup directory.
pub fn backup_path(backup: &Path, id: ObjectId) -> PathBuf {
    backup.join("objects").join(id.to_string())
}

/// Writes `files`' objects into the durable `backup` directory (a shared or
/// otherwise safe file system), each atomically and fsynced; objects already
/// there are left alone.
pub fn back_up(
    store: &ObjectStore,
    backup: &Path,
    files: &[CheckpointFile],
) -> Result<(), CheckpointError> {
    use std::io::Write;
    let objects = backup.join("objects");
    std::fs::create_dir_all(&objects).map_err(io("create", &objects))?;
    for file in files {
        let target = backup_path(backup, file.object);
        if target.exists() {
            continue;
        }
        let bytes = stored_bytes(store, file)?;
        let temporary = objects.join(format!(
            ".{}.{}.tmp",
            file.object,
            uuid::Uuid::now_v7().simple()
        ));
        let write = || -> std::io::Result<()> {
            let mut out = std::fs::File::create(&temporary)?;
            out.write_all(&bytes)?;
            out.sync_all()?;
            std::fs::rename(&temporary, &target)
        };
        if let Err(source) = write() {
            let _ = std::fs::remove_file(&temporary);
            return Err(CheckpointError::Io {
                what: "back up to",
                path: target,
                source,
            });
        }
    }
    if let Ok(dir) = std::fs::File::open(&objects) {
        let _ = dir.sync_all();
    }
    Ok(())
}

/// Takes `file`'s object from the `backup` directory into `store`, pinned for
/// `trial`, if the file there has the manifest's size and hashes to the id;
/// returns its bytes.
pub fn restore_from_backup(
    store: &ObjectStore,
    backup: &Path,
    file: &CheckpointFile,
    trial: TrialId,
) -> Result<ObjectBytes, CheckpointError> {
    let path = backup_path(backup, file.object);
    let found = std::fs::metadata(&path).map_err(io("read", &path))?.len();
    let limit = store.limits().max_object_bytes;
    if found > limit {
        return Err(CheckpointError::Invalid(format!(
            "{} has {found} bytes, over the {limit}-byte object limit",
            path.display()
        )));
    }
    if found != file.size {
        return Err(CheckpointError::Invalid(format!(
            "{} has {found} bytes, not the {} of the checkpoint's manifest",
            path.display(),
            file.size
        )));
    }
    let bytes: std::sync::Arc<[u8]> = std::fs::read(&path).map_err(io("read", &path))?.into();
    store
        .put_expecting_on_disk(file.object, &bytes, Owner::Trial(trial))
        .and_then(|_| store.pin(file.object))
        .map_err(|source| CheckpointError::Store {
            name: path.display().to_string(),
            source,
        })?;
    Ok(ObjectBytes::shared(bytes))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::objects::StoreLimits;

    fn trial() -> TrialId {
        "3f2a9c0d11b2e4f7-t3".parse().expect("trial id")
    }

    #[test]
    fn take_then_restore_round_trips_and_empties_the_directory() {
        let temp = tempfile::tempdir().expect("tempdir");
        let store =
            ObjectStore::open(temp.path().join("objects"), StoreLimits::default()).expect("store");
        let dir = temp.path().join("work").join("checkpoint");
        std::fs::create_dir_all(dir.join("sub")).expect("mkdir");
        std::fs::write(dir.join("state"), b"weights").expect("write");
        std::fs::write(dir.join("sub").join("opt"), b"moments").expect("write");
        let files = take(&store, &dir, trial(), 7).expect("take");
        assert_eq!(
            files
                .iter()
                .map(|file| file.name.as_str())
                .collect::<Vec<_>>(),
            ["state", "sub/opt"]
        );
        assert!(std::fs::read_dir(&dir).expect("dir").next().is_none());
        assert!(
            files
                .iter()
                .all(|file| store.info(file.object).expect("stored").pinned)
        );
        let again = temp.path().join("restored");
        restore(&store, &again, &files).expect("restore");
        assert_eq!(
            std::fs::read(again.join("sub").join("opt")).expect("read"),
            b"moments"
        );
        assert_eq!(
            std::fs::read(again.join("state")).expect("read"),
            b"weights"
        );
    }

    #[test]
    fn a_full_store_refuses_the_checkpoint_and_keeps_nothing_of_it() {
        let temp = tempfile::tempdir().expect("tempdir");
        let limits = StoreLimits {
            memory_bytes: 0,
            disk_bytes: 1000,
            max_object_bytes: 1 << 20,
        };
        let store = ObjectStore::open(temp.path().join("objects"), limits).expect("store");
        let dir = temp.path().join("checkpoint");
        std::fs::create_dir_all(&dir).expect("mkdir");
        std::fs::write(dir.join("a"), vec![1u8; 600]).expect("write");
        std::fs::write(dir.join("b"), vec![2u8; 600]).expect("write");
        let error = take(&store, &dir, trial(), 1).expect_err("over the limit");
        assert!(error.to_string().contains("store full"), "{error}");
        assert_eq!(store.stat().disk_objects, 0);
    }

    #[test]
    fn an_empty_directory_or_an_unsafe_name_is_refused() {
        let temp = tempfile::tempdir().expect("tempdir");
        let store =
            ObjectStore::open(temp.path().join("objects"), StoreLimits::default()).expect("store");
        let dir = temp.path().join("checkpoint");
        std::fs::create_dir_all(&dir).expect("mkdir");
        assert!(matches!(
            take(&store, &dir, trial(), 1),
            Err(CheckpointError::Invalid(_))
        ));
        for name in ["../x", "/etc/passwd", "", "a/../../b"] {
            assert!(
                !xp_runtime::protocol::is_safe_checkpoint_name(name),
                "{name}"
            );
        }
        assert!(xp_runtime::protocol::is_safe_checkpoint_name(
            "model/weights.pt"
        ));
    }
}
