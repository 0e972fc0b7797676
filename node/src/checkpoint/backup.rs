//! Step 3 of the route, and the last resort of step 5: the durable backup
//! directory (a shared or otherwise safe file system, `--checkpoint-backup`).
//!
//! Objects are kept as `objects/<id>` under it, whatever checkpoint or trial they
//! belong to, so content shared between checkpoints is written once.
//!
//! Not here: deciding when a backup copy is no longer needed (the head's
//! `DropObjects` says so, and the agent calls [`remove_from_backup`]).
//!
//! Invariants: a file under an object's name was fully written and fsynced
//! before it was renamed there; a file is taken back into the store only if it
//! has the manifest's size, fits the store's object limit, and hashes to its id.

use std::path::{Path, PathBuf};

use xp_runtime::ids::{ObjectId, TrialId};
use xp_runtime::protocol::CheckpointFile;

use super::error::{CheckpointError, io};
use crate::objects::{ObjectBytes, ObjectStore, Owner};

/// The file of object `id` in a backup directory.
fn backup_path(backup: &Path, id: ObjectId) -> PathBuf {
    backup.join("objects").join(id.to_string())
}

/// Deletes the backup copies of `objects` (no kept checkpoint names them any
/// more). Best effort: a file that cannot be removed only costs space.
pub(crate) fn remove_from_backup(backup: &Path, objects: &[ObjectId]) {
    for id in objects {
        let _ = std::fs::remove_file(backup_path(backup, *id));
    }
}

/// Writes `files`' objects into the durable `backup` directory (a shared or
/// otherwise safe file system), each atomically and fsynced; objects already
/// there are left alone.
pub(crate) fn back_up(
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
        let bytes = store
            .get(file.object)
            .map_err(|source| CheckpointError::Store {
                name: file.name.clone(),
                source,
            })?;
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
pub(crate) fn restore_from_backup(
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
