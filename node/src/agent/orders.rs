//! The head's orders on this node's object store (`Replicate`, `Pin`,
//! `DropObjects`, `ReleaseTrial`, `ReleaseDriver`) and its log reads, carried
//! out for the agent.
//!
//! Each order runs on a task of its own (the store blocks on disk and
//! hashing, so through `spawn_blocking`) and tells the head what changed
//! through the object-change channel, or, for a replication that could not
//! fetch everything, through the messages-for-the-head channel. A log read is
//! answered on the session at once.
//!
//! Not here: which orders to carry out (the head decides; the core passes
//! them on), and the store itself (`objects`).

use std::path::Path;

use tracing::{debug, info, warn};
use xp_runtime::ids::{ObjectId, TrialId, WorkerKey};
use xp_runtime::protocol::{
    ErrorCode, FetchPath, LogChunk, NodeMessage, ObjectSource, RemoteError,
};

use super::Agent;
use crate::checkpoint;
use crate::objects::remote::Wanted;
use crate::objects::{ObjectChange, Owner};
use crate::worker_log::{self, LogError};

impl Agent {
    /// Pins the objects of `objects` this node holds for `trial`.
    pub(super) fn pin(&self, trial: TrialId, objects: Vec<ObjectId>) {
        let store = self.objects.store.clone();
        xp_runtime::task::spawn("pin-objects", async move {
            let _ = tokio::task::spawn_blocking(move || {
                for id in objects {
                    if store.contains(id) {
                        let kept = store
                            .add_owner(id, Owner::Trial(trial))
                            .and_then(|()| store.pin(id));
                        if let Err(error) = kept {
                            warn!(%id, %error, "cannot pin a checkpoint object");
                        }
                    }
                }
            })
            .await;
        });
    }

    /// Deletes `objects` (from the backup too) as `trial`'s, or anybody's.
    pub(super) fn drop_objects(&self, trial: Option<TrialId>, objects: Vec<ObjectId>) {
        let owner = trial.map(Owner::Trial);
        let store = self.objects.store.clone();
        let backup = self.objects.backup.clone();
        let changes = self.objects.changes_tx.clone();
        xp_runtime::task::spawn("drop-objects", async move {
            let deleted = tokio::task::spawn_blocking(move || {
                if let Some(backup) = &backup {
                    checkpoint::remove_from_backup(backup, &objects);
                }
                objects
                    .into_iter()
                    .filter(|id| match store.retire(*id, owner.as_ref()) {
                        Ok(deleted) => deleted,
                        Err(error) => {
                            warn!(%id, %error, "cannot delete object");
                            false
                        }
                    })
                    .collect::<Vec<_>>()
            })
            .await
            .unwrap_or_default();
            debug!(count = deleted.len(), "objects deleted on the head's order");
            for id in deleted {
                let _ = changes.send(ObjectChange::Dropped(id));
            }
        });
    }

    /// Collects what `owner` alone kept, and tells the head.
    pub(super) fn release_owner(&self, owner: Owner) {
        match &owner {
            Owner::Trial(trial) => self.objects.access.forget_trial(*trial),
            Owner::Driver(session) => self.objects.access.forget_session(session),
        }
        let store = self.objects.store.clone();
        let changes = self.objects.changes_tx.clone();
        xp_runtime::task::spawn("release-owner", async move {
            let released = {
                let owner = owner.clone();
                tokio::task::spawn_blocking(move || store.release_owner(&owner)).await
            };
            match released {
                Ok(Ok(collected)) => {
                    if !collected.is_empty() {
                        info!(%owner, objects = collected.len(), "collected the objects of a finished owner");
                    }
                    for id in collected {
                        let _ = changes.send(ObjectChange::Dropped(id));
                    }
                }
                Ok(Err(error)) => warn!(%owner, %error, "cannot collect an owner's objects"),
                Err(error) => warn!(%owner, %error, "cannot collect an owner's objects"),
            }
        });
    }

    /// Fetches a checkpoint's objects from other nodes and keeps them pinned; tells
    /// the head which could not be fetched, so that it tries again.
    pub(super) fn replicate(
        &self,
        trial: TrialId,
        objects: Vec<(ObjectId, u64)>,
        sources: Vec<ObjectSource>,
        path: FetchPath,
    ) {
        let store = self.objects.store.clone();
        let fetcher = self.objects.fetcher.clone();
        let changes = self.objects.changes_tx.clone();
        let head_messages = self.objects.head_messages_tx.clone();
        let own = self.config.identity.node_id;
        xp_runtime::task::spawn("replicate", async move {
            let mut failed = Vec::new();
            let mut last_error = String::new();
            for (id, size) in objects {
                let wanted = Wanted {
                    id,
                    owner: Owner::Trial(trial),
                    pin: true,
                    size: Some(size),
                    path,
                };
                match fetcher.ensure(&store, wanted, &sources, Some(own)).await {
                    Ok(_) => {
                        let _ = changes.send(ObjectChange::Added(id));
                    }
                    Err(error) => {
                        last_error = xp_runtime::error_chain::error_chain(&error);
                        warn!(%trial, %id, error = %last_error, "replication failed");
                        failed.push(id);
                    }
                }
            }
            if !failed.is_empty() {
                let _ = head_messages.send(NodeMessage::ReplicationFailed {
                    trial,
                    objects: failed,
                    error: last_error,
                });
            }
        });
    }

    /// Answers the head's request `request_id` with a piece of worker `key`'s
    /// log from stream offset `offset`.
    pub(super) async fn answer_log_read(
        &mut self,
        request_id: u64,
        key: WorkerKey,
        offset: u64,
        max_bytes: u32,
        complete: bool,
    ) {
        let path = worker_log::log_path(&self.config.data_dir, key);
        let result = read_log(&path, offset, max_bytes, complete).await;
        self.write(NodeMessage::Logs { request_id, result }).await;
    }
}

/// A piece of a worker's capped log (`worker_log::read`: the head, a marker
/// where output was dropped, the tail) from stream offset `offset`.
async fn read_log(
    path: &Path,
    offset: u64,
    max_bytes: u32,
    complete: bool,
) -> Result<LogChunk, RemoteError> {
    let path = path.to_owned();
    let read = tokio::task::spawn_blocking(move || worker_log::read(&path, offset, max_bytes))
        .await
        .map_err(|error| RemoteError::new(ErrorCode::Internal, error.to_string()))?;
    match read {
        Ok(read) => Ok(LogChunk {
            data: read.data,
            next_offset: read.next_offset,
            complete,
        }),
        Err(LogError::NotFound { .. }) => Err(RemoteError::new(
            ErrorCode::NotFound,
            "no output recorded for this worker",
        )),
        Err(error) => Err(RemoteError::new(
            ErrorCode::Internal,
            xp_runtime::error_chain::error_chain(&error),
        )),
    }
}
