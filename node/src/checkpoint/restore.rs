//! Step 5 of the route: the checkpoint a launch resumes from, put back into the
//! new worker's `XP_CHECKPOINT_DIR` before the worker starts.
//!
//! [`CheckpointSources::restore_for_launch`] makes sure this node holds a good
//! copy of every object (its own, a verified one fetched from another node, or,
//! when no node can provide one, the backup directory's), reports what it gained
//! or lost to the head's directory, and writes the files from the bytes it
//! verified. [`restore`] is the same from this node's store alone.
//!
//! Not here: choosing the checkpoint or the nodes to fetch from (the head puts
//! both in the launch), or starting the worker.
//!
//! Invariants: every file is written from bytes that hashed to its id; a name
//! that is not a plain relative path is refused before anything is written under
//! it; the worker gets copies, so it cannot change a stored object.

use std::path::Path;
use std::sync::Arc;

use tokio::sync::mpsc;
use tracing::info;
use xp_runtime::ids::NodeId;
use xp_runtime::protocol::{CheckpointFile, Launch};

use super::backup::restore_from_backup;
use super::error::{CheckpointError, ResumeError, io};
use crate::isolation::fs::{self as lane_fs, FileOwner};
use crate::objects::remote::{ObjectFetcher, Wanted};
use crate::objects::{ObjectBytes, ObjectChange, ObjectStore, Owner};

/// Where a resumed worker's checkpoint objects can come from: this node's store
/// and, through the fetcher, the nodes the launch names.
#[derive(Clone)]
pub(crate) struct CheckpointSources {
    /// The local store; restored objects are kept in it, pinned for the trial.
    pub store: Arc<ObjectStore>,
    /// Pulls objects this node lacks (or holds a corrupt copy of).
    pub fetcher: Arc<ObjectFetcher>,
    /// Where to report objects this node gained or lost, for the head's directory.
    pub changes: mpsc::UnboundedSender<ObjectChange>,
    /// This node, skipped among the sources of a fetch.
    pub own_node: NodeId,
}

impl CheckpointSources {
    /// Fills `dir` with the checkpoint `launch` resumes from, fetching objects
    /// this node lacks (or holds a corrupt copy of) from the nodes that have
    /// them, and from the launch's backup directory when none can; the files
    /// belong to `owner` (the worker's id). Returns the environment that tells the
    /// worker it resumes (`XP_RESUME_STEP`); nothing when the launch starts afresh.
    pub(crate) async fn restore_for_launch(
        &self,
        launch: &Launch,
        dir: &Path,
        owner: Option<FileOwner>,
    ) -> Result<Vec<(String, String)>, ResumeError> {
        let Some(resume) = &launch.resume else {
            return Ok(Vec::new());
        };
        let step = resume.step;
        let mut contents = Vec::with_capacity(resume.files.len());
        for file in &resume.files {
            let fetched = self
                .fetcher
                .ensure(
                    &self.store,
                    Wanted {
                        id: file.object,
                        owner: Owner::Trial(launch.key.trial),
                        pin: true,
                        size: Some(file.size),
                        path: launch.object_path,
                    },
                    &resume.sources,
                    Some(self.own_node),
                )
                .await;
            let bytes = match fetched {
                Ok(bytes) => bytes,
                Err(fetch) => {
                    // The head's directory must learn that this node has no good copy
                    // (the store may just have deleted a damaged one), so that the next
                    // attempt resumes from a checkpoint that can still be had.
                    if !self.store.contains(file.object) {
                        let _ = self.changes.send(ObjectChange::Dropped(file.object));
                    }
                    // No node could provide it: the durable backup, when there is one.
                    let Some(backup) = resume.backup.clone() else {
                        return Err(ResumeError::Fetch {
                            step,
                            source: fetch,
                        });
                    };
                    let (wanted, trial) = (file.clone(), launch.key.trial);
                    let store = self.store.clone();
                    let restored = tokio::task::spawn_blocking(move || {
                        restore_from_backup(&store, Path::new(&backup), &wanted, trial)
                    })
                    .await
                    .map_err(|source| ResumeError::Task { step, source })?
                    .map_err(|source| ResumeError::Backup {
                        step,
                        fetch,
                        source,
                    })?;
                    info!(worker = %launch.key, object = %file.object, "checkpoint object restored from the backup");
                    restored
                }
            };
            // Also after a damaged copy was replaced: the head may have heard it dropped.
            let _ = self.changes.send(ObjectChange::Added(file.object));
            contents.push(bytes);
        }
        // Written from the bytes verified above: no second hash of the checkpoint.
        let files = resume.files.clone();
        let target = dir.to_owned();
        tokio::task::spawn_blocking(move || write_files(&target, owner, &files, &contents))
            .await
            .map_err(|source| ResumeError::Task { step, source })?
            .map_err(|source| ResumeError::Write { step, source })?;
        info!(worker = %launch.key, step, from_attempt = resume.attempt, "checkpoint restored");
        Ok(vec![("XP_RESUME_STEP".to_owned(), step.to_string())])
    }
}

#[cfg(any(test, feature = "test-util"))]
/// Writes `files` from `store` into `dir` (created if needed); see [`write_files`].
pub(crate) fn restore(
    store: &ObjectStore,
    dir: &Path,
    files: &[CheckpointFile],
) -> Result<(), CheckpointError> {
    let contents = files
        .iter()
        .map(|file| {
            store
                .get(file.object)
                .map_err(|source| CheckpointError::Store {
                    name: file.name.clone(),
                    source,
                })
        })
        .collect::<Result<Vec<_>, _>>()?;
    write_files(dir, None, files, &contents)
}

/// Opens directory `dir`, or makes it (mode 0700, given to `owner`) from its
/// parent's descriptor. `dir` itself may be in a worker's directory: a link
/// there is refused, never followed. Only what is above it (the node's own
/// path) is made by path.
fn open_or_make(dir: &Path, owner: Option<FileOwner>) -> std::io::Result<std::os::fd::OwnedFd> {
    match lane_fs::open_dir(dir) {
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => {
            let (Some(parent), Some(name)) = (dir.parent(), dir.file_name()) else {
                return Err(error);
            };
            std::fs::create_dir_all(parent)?;
            let parent = lane_fs::open_dir(parent)?;
            lane_fs::make_dir_in(&parent, name, 0o700, owner)
        }
        opened => opened,
    }
}

/// Writes each of `files` with its verified `contents` (in the same order) into
/// `dir`, created if needed, as files and directories of `owner`. Each file is a
/// copy, so the worker may change it without touching the stored object. Below
/// `dir` no link is followed (`isolation::fs`).
pub(crate) fn write_files(
    dir: &Path,
    owner: Option<FileOwner>,
    files: &[CheckpointFile],
    contents: &[ObjectBytes],
) -> Result<(), CheckpointError> {
    let root = open_or_make(dir, owner).map_err(io("open", dir))?;
    for (file, bytes) in files.iter().zip(contents) {
        if !xp_runtime::protocol::is_safe_checkpoint_name(&file.name) {
            return Err(CheckpointError::Invalid(format!(
                "checkpoint file name {:?} is not a plain relative path",
                file.name
            )));
        }
        let relative = Path::new(&file.name);
        let path = dir.join(relative);
        let parent =
            lane_fs::make_dirs_in(&root, relative.parent().unwrap_or(Path::new("")), owner)
                .map_err(io("create", &path))?;
        let name = relative.file_name().unwrap_or_default();
        lane_fs::replace_file_in(&parent, name, &bytes[..], 0o644, owner)
            .map_err(io("write", &path))?;
    }
    Ok(())
}
