//! The node's local object store: immutable blobs named by the blake3 hash of
//! their bytes, kept in a memory tier that spills least-recently-used objects to
//! a disk tier under the node's data directory (`<data_dir>/objects/`).
//!
//! The store does not persist owners and pins across restarts (a restarted store
//! knows its disk objects but nothing about who wanted them; see
//! [`ObjectStore::open`]; the head re-pins checkpoint objects at registration).
//! The memory tier is volatile: its objects are gone when the process ends.
//!
//! Around the store: `remote` moves objects between nodes, `local` serves the
//! workers of this node, `access` says who may fetch and store what through
//! `remote` (credentials, capabilities, team quotas, counts), and the head
//! keeps the directory of who holds what.
//!
//! Inside it: `types` (the vocabulary: owners, limits, stats, `object_id`) and
//! `error` (`StoreError`) are leaves; `index` (no I/O) and `disk` (files, no
//! index) use only those, and the store here drives both. Nothing imports back
//! up from `index` or `disk` to this module.
//!
//! Invariants:
//! - The bytes charged to each tier never exceed that tier's limit (counting disk
//!   space reserved for writes in progress), except after a restart with a lower
//!   disk limit, when nothing more is written until deletes make room.
//! - A file under an object's final name was fully written and fsynced before it
//!   was renamed there; temporary files start with `.tmp-` and are removed at open.
//! - Bytes returned by [`ObjectStore::get`] and [`ObjectStore::verify`] hash to the
//!   id asked for: memory objects were hashed when put, disk objects are hashed
//!   each time their file is mapped. [`ObjectStore::get_unverified`] is the one
//!   exception, for a receiver that hashes what it gets.
//! - The index lock is never held while hashing or writing object bytes; only
//!   renames (metadata operations) happen under it, so that a name on disk and its
//!   index entry change together.
//!
//! All methods block on disk I/O and hashing; async callers go through
//! `spawn_blocking`.

#![warn(missing_docs)]

pub(crate) mod access;
mod disk;
mod error;
mod index;
pub(crate) mod local;
mod object_bytes;
pub(crate) mod remote;
#[cfg(test)]
mod tests;
mod types;

use std::fs::File;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

pub(crate) use xp_runtime::ids::ObjectId;

use disk::{DiskDir, MapOutcome, StreamOutcome};
pub use error::{IoOperation, StoreError};
use index::{Index, Lookup, MemoryPlan};
pub use object_bytes::ObjectBytes;
pub(crate) use types::object_id;
pub use types::{ObjectChange, ObjectInfo, Owner, StoreLimits, StoreStats, Tier};

/// How many times [`ObjectStore::get`] looks again when the file it found bad
/// was replaced meanwhile by a concurrent delete and re-put of the same object.
const MAX_GET_ATTEMPTS: usize = 3;

/// What checking a disk entry's file found.
enum Checked {
    /// The file hashes to its id.
    Good(ObjectBytes),
    /// The file is damaged or gone, and was the entry's: the entry is dropped.
    Damaged(StoreError),
    /// The file failed, but the entry changed meanwhile (replaced or removed).
    Stale(StoreError),
}

/// Runs a blocking store operation off the async runtime.
pub(crate) async fn off_runtime<T: Send + 'static>(
    store: &Arc<ObjectStore>,
    work: impl FnOnce(&ObjectStore) -> Result<T, StoreError> + Send + 'static,
) -> Result<T, StoreError> {
    let store = store.clone();
    tokio::task::spawn_blocking(move || work(&store))
        .await
        .unwrap_or_else(|error| {
            Err(StoreError::Task {
                reason: error.to_string(),
            })
        })
}

/// A node's object store, shared behind an [`Arc`] by the node's tasks.
///
/// Objects are immutable and content-addressed, so putting the same bytes twice
/// stores them once and only adds the second owner.
#[derive(Debug)]
pub struct ObjectStore {
    limits: StoreLimits,
    disk: DiskDir,
    index: Mutex<Index>,
}

impl ObjectStore {
    /// Opens (creating if needed) the store under `dir`, normally
    /// `<data_dir>/objects`, and rebuilds the disk tier from the files there.
    ///
    /// Stray temporary files from a crash are removed. Files are not hashed here,
    /// to keep a restart fast with many large objects; [`get`](Self::get) hashes
    /// each file when it maps it. Recovered objects have no owners and are not
    /// pinned: they stay until deleted, or collected after [`add_owner`](Self::add_owner)
    /// and a release. The directory is locked so that two stores never share it.
    pub fn open(dir: impl Into<PathBuf>, limits: StoreLimits) -> Result<Self, StoreError> {
        let (disk, recovered) = DiskDir::open(dir.into())?;
        let mut index = Index::new(limits);
        for (id, size) in recovered {
            index.insert_recovered(id, size);
        }
        let stats = index.stats();
        if stats.disk_bytes > limits.disk_bytes {
            tracing::warn!(
                disk_bytes = stats.disk_bytes,
                limit = limits.disk_bytes,
                "object store holds more than its disk limit; no disk writes until deletes make room"
            );
        }
        tracing::info!(
            dir = %disk.dir().display(),
            disk_objects = stats.disk_objects,
            disk_bytes = stats.disk_bytes,
            "object store opened"
        );
        Ok(Self {
            limits,
            disk,
            index: Mutex::new(index),
        })
    }

    /// The directory the disk tier lives in.
    pub fn dir(&self) -> &Path {
        self.disk.dir()
    }

    /// The limits this store was opened with.
    pub fn limits(&self) -> StoreLimits {
        self.limits
    }

    /// Stores `bytes` for `owner` and returns their id.
    ///
    /// Objects up to the memory limit go to memory, spilling least-recently-used
    /// objects to disk to make room (or go to disk themselves when the spilled
    /// objects would not fit there); larger ones are written straight to disk.
    /// Passing an `Arc<[u8]>` keeps a memory object without copying it; a `Vec`
    /// is copied once into shared memory, and not at all when it goes to disk.
    /// Putting content that is already stored only adds `owner`.
    pub fn put<B>(&self, bytes: B, owner: Owner) -> Result<ObjectId, StoreError>
    where
        B: AsRef<[u8]> + Into<Arc<[u8]>>,
    {
        let size = bytes.as_ref().len() as u64;
        self.check_object_size(size)?;
        let id = object_id(bytes.as_ref());
        self.put_hashed(id, bytes, owner)
    }

    /// Like [`put`](Self::put) for bytes that should be object `expected` (fetched
    /// from another node, say): stores nothing and fails with
    /// [`StoreError::Mismatch`] unless they hash to it.
    pub fn put_expecting<B>(
        &self,
        expected: ObjectId,
        bytes: B,
        owner: Owner,
    ) -> Result<ObjectId, StoreError>
    where
        B: AsRef<[u8]> + Into<Arc<[u8]>>,
    {
        self.check_object_size(bytes.as_ref().len() as u64)?;
        let actual = object_id(bytes.as_ref());
        if actual != expected {
            return Err(StoreError::Mismatch { expected, actual });
        }
        self.put_hashed(actual, bytes, owner)
    }

    /// Like [`put_expecting`](Self::put_expecting), but always on the disk tier:
    /// for copies that must outlive this process (replicas of checkpoints).
    pub fn put_expecting_on_disk(
        &self,
        expected: ObjectId,
        bytes: &[u8],
        owner: Owner,
    ) -> Result<ObjectId, StoreError> {
        self.check_object_size(bytes.len() as u64)?;
        let actual = object_id(bytes);
        if actual != expected {
            return Err(StoreError::Mismatch { expected, actual });
        }
        self.put_on_disk(actual, bytes, owner)
    }

    fn put_hashed<B>(&self, id: ObjectId, bytes: B, owner: Owner) -> Result<ObjectId, StoreError>
    where
        B: AsRef<[u8]> + Into<Arc<[u8]>>,
    {
        let size = bytes.as_ref().len() as u64;
        if size > self.limits.memory_bytes {
            return self.put_on_disk(id, bytes.as_ref(), owner);
        }
        // Checked before converting, so that re-putting a large Vec does not copy it.
        if self.lock().add_owner(&id, &owner) {
            return Ok(id);
        }
        self.put_in_memory(id, bytes.into(), owner)
    }

    /// Stores everything `reader` yields for `owner`, on disk, hashing the bytes
    /// as they are written to a temporary file so that memory use stays at one
    /// buffer whatever the object's size.
    ///
    /// Gives up with [`StoreError::TooLarge`] as soon as the stream passes the
    /// object size limit. A stream larger than the free disk space is read to its
    /// end without being written, since only its hash can tell whether it is
    /// content already stored; if not, the put fails with [`StoreError::Full`].
    pub fn put_reader(&self, reader: impl Read, owner: Owner) -> Result<ObjectId, StoreError> {
        let available = self.lock().disk_available();
        match self
            .disk
            .write_stream(reader, self.limits.max_object_bytes, available)?
        {
            StreamOutcome::Written { id, size, temp } => self.publish_new(id, size, temp, 0, owner),
            StreamOutcome::Overflowed { id, size } => {
                let mut index = self.lock();
                if index.add_owner(&id, &owner) {
                    return Ok(id);
                }
                // The stream was not kept and may not be replayable, so the space
                // is reported as it was when the stream passed it.
                Err(StoreError::Full {
                    needed: size,
                    available,
                    limit: self.limits.disk_bytes,
                })
            }
        }
    }

    /// Stores the contents of the file at `path` for `owner`, like
    /// [`put_reader`](Self::put_reader). The file is copied, not moved.
    pub fn put_file(&self, path: &Path, owner: Owner) -> Result<ObjectId, StoreError> {
        let file = File::open(path).map_err(|source| StoreError::Io {
            operation: IoOperation::Open,
            path: path.to_owned(),
            source,
        })?;
        let size = file
            .metadata()
            .map_err(|source| StoreError::Io {
                operation: IoOperation::Open,
                path: path.to_owned(),
                source,
            })?
            .len();
        self.check_object_size(size)?;
        self.put_reader(file, owner)
    }

    /// The object's bytes: shared memory for memory objects, a read-only map of
    /// the file for disk objects, never a copy.
    ///
    /// A disk object is hashed when its file is mapped and the verified map is
    /// reused while any returned [`ObjectBytes`] still holds it. A file that does
    /// not match its id is deleted and reported as [`StoreError::Corrupt`].
    pub fn get(&self, id: ObjectId) -> Result<ObjectBytes, StoreError> {
        let mut attempts = 0;
        loop {
            attempts += 1;
            let generation = match self.lock().lookup(&id) {
                Lookup::Absent => return Err(StoreError::NotFound { id }),
                Lookup::Ready(object_bytes) => return Ok(object_bytes),
                Lookup::OnDisk { generation } => generation,
            };
            match self.check_disk_file(id, generation)? {
                Checked::Good(bytes) => return Ok(bytes),
                Checked::Damaged(failure) => return Err(failure),
                Checked::Stale(failure) if attempts >= MAX_GET_ATTEMPTS => return Err(failure),
                Checked::Stale(_) => {}
            }
        }
    }

    /// Maps and hashes the file of `id`'s disk entry at `generation`. Mapping and
    /// hashing happen without the lock; the generation tells afterwards whether
    /// the entry still names the file that was checked. A verified map is kept
    /// for later gets; a damaged file that is still the entry's is discarded.
    fn check_disk_file(&self, id: ObjectId, generation: u64) -> Result<Checked, StoreError> {
        let outcome = self.disk.map_verified(&id)?;
        let mut index = self.lock();
        let failure = match outcome {
            MapOutcome::Verified(map) => {
                // The bytes hash to `id`, so they are right to return even if
                // the entry changed meanwhile; only a current entry caches them.
                index.remember_map(&id, generation, &map);
                return Ok(Checked::Good(ObjectBytes::mapped(map)));
            }
            MapOutcome::Mismatch => StoreError::Corrupt { id },
            MapOutcome::Missing => StoreError::Missing { id },
        };
        if index.is_disk_generation(&id, generation) {
            self.discard_damaged(index, id, &failure);
            return Ok(Checked::Damaged(failure));
        }
        Ok(Checked::Stale(failure))
    }

    /// The object's bytes without hashing a disk object's file: only for handing
    /// them to a receiver that verifies them itself (the object server's
    /// fetchers do, and report a mismatch, which [`verify`](Self::verify) then
    /// settles). The unchecked map is never kept for later gets.
    pub fn get_unverified(&self, id: ObjectId) -> Result<ObjectBytes, StoreError> {
        match self.lock().lookup(&id) {
            Lookup::Absent => return Err(StoreError::NotFound { id }),
            Lookup::Ready(bytes) => return Ok(bytes),
            Lookup::OnDisk { .. } => {}
        }
        match self.disk.map(&id)? {
            Some(map) => Ok(ObjectBytes::mapped(Arc::new(map))),
            None => Err(StoreError::Missing { id }),
        }
    }

    /// The file of an object on the disk tier, opened for reading and not
    /// checked against its id (the fetcher checks what arrives): what a bulk
    /// fetch sends with `sendfile`. `None` for an object not on disk.
    pub(crate) fn open_disk_file(&self, id: ObjectId) -> Result<Option<File>, StoreError> {
        if self.lock().disk_generation(&id).is_none() {
            return Ok(None);
        }
        self.disk.open_file(&id)
    }

    /// The object's bytes, checked against its id now: a disk object's file is
    /// read again even if a map kept from an earlier check exists (a file changed
    /// in place shows through such a map). A damaged file is deleted and reported
    /// as [`StoreError::Corrupt`], as by [`get`](Self::get). Memory objects were
    /// hashed when put.
    pub fn verify(&self, id: ObjectId) -> Result<ObjectBytes, StoreError> {
        let Some(generation) = self.lock().disk_generation(&id) else {
            return self.get(id);
        };
        match self.check_disk_file(id, generation)? {
            Checked::Good(bytes) => Ok(bytes),
            Checked::Damaged(failure) | Checked::Stale(failure) => Err(failure),
        }
    }

    /// Drops a disk object whose file failed its check, and deletes the file.
    fn discard_damaged(
        &self,
        mut index: MutexGuard<'_, Index>,
        id: ObjectId,
        failure: &StoreError,
    ) {
        tracing::error!(%id, error = %failure, "object lost on disk");
        let moved_aside = self.remove_locked(&mut index, &id);
        drop(index);
        match moved_aside {
            Ok(Some(trash)) => self.disk.remove_quietly(&trash),
            Ok(None) => {}
            Err(error) => {
                tracing::error!(%id, %error, "cannot delete damaged object file");
            }
        }
    }

    /// Every object stored here, in no particular order.
    pub fn ids(&self) -> Vec<ObjectId> {
        self.lock().ids()
    }

    /// Every object stored here with who claims it, in no particular order.
    pub fn holdings(&self) -> Vec<(ObjectId, ObjectInfo)> {
        let index = self.lock();
        index
            .ids()
            .into_iter()
            .filter_map(|id| index.info(&id).map(|info| (id, info)))
            .collect()
    }

    /// Whether the object is stored here.
    pub fn contains(&self, id: ObjectId) -> bool {
        self.lock().info(&id).is_some()
    }

    /// Size, tier, owners and pin of the object, if stored.
    pub fn info(&self, id: ObjectId) -> Option<ObjectInfo> {
        self.lock().info(&id)
    }

    /// Deletes the object whatever its owners and pin; returns whether it existed.
    ///
    /// Readers holding its [`ObjectBytes`] keep valid bytes: memory is shared and
    /// an unlinked file stays mapped.
    pub fn delete(&self, id: ObjectId) -> Result<bool, StoreError> {
        let mut index = self.lock();
        if index.info(&id).is_none() {
            return Ok(false);
        }
        let moved_aside = self.remove_locked(&mut index, &id)?;
        drop(index);
        if let Some(trash) = moved_aside {
            self.disk.remove_quietly(&trash);
        }
        tracing::debug!(%id, "object deleted");
        Ok(true)
    }

    /// Adds `owner` to a stored object, for a new user of content already here
    /// (for example an object recovered at open).
    pub fn add_owner(&self, id: ObjectId, owner: Owner) -> Result<(), StoreError> {
        if self.lock().add_owner(&id, &owner) {
            Ok(())
        } else {
            Err(StoreError::NotFound { id })
        }
    }

    /// Removes `owner` from every object and deletes those left with no owner and
    /// no pin; returns the deleted ids.
    ///
    /// The owner is removed everywhere even when deleting some file fails; the
    /// first such error is returned and those objects stay, ownerless.
    pub fn release_owner(&self, owner: &Owner) -> Result<Vec<ObjectId>, StoreError> {
        let mut collected = Vec::new();
        let mut trash = Vec::new();
        let mut first_error = None;
        {
            let mut index = self.lock();
            for id in index.remove_owner_everywhere(owner) {
                match self.remove_locked(&mut index, &id) {
                    Ok(moved_aside) => {
                        collected.push(id);
                        trash.extend(moved_aside);
                    }
                    Err(error) => {
                        first_error.get_or_insert(error);
                    }
                }
            }
        }
        for path in &trash {
            self.disk.remove_quietly(path);
        }
        tracing::debug!(%owner, collected = collected.len(), "owner released");
        match first_error {
            Some(error) => Err(error),
            None => Ok(collected),
        }
    }

    /// Removes `owner`'s claim on one object, deleting the object if that was the
    /// last claim and it is not pinned. Returns whether `owner` had a claim.
    pub fn remove_owner(&self, id: ObjectId, owner: &Owner) -> Result<bool, StoreError> {
        let mut index = self.lock();
        let had = index.remove_owner(&id, owner);
        if had {
            self.collect_if_unclaimed(index, &id)?;
        }
        Ok(had)
    }

    /// Withdraws the object's pin and `owner`'s claim together (a checkpoint the
    /// head no longer keeps), deleting the object if no claim is left. Returns
    /// whether it was deleted.
    pub fn retire(&self, id: ObjectId, owner: Option<&Owner>) -> Result<bool, StoreError> {
        let mut index = self.lock();
        index.set_pinned(&id, false);
        if let Some(owner) = owner {
            index.remove_owner(&id, owner);
        }
        self.collect_if_unclaimed(index, &id)
    }

    /// Deletes the object if no owner and no pin keep it; returns whether it did.
    fn collect_if_unclaimed(
        &self,
        mut index: MutexGuard<'_, Index>,
        id: &ObjectId,
    ) -> Result<bool, StoreError> {
        if !index.is_collectable(id) {
            return Ok(false);
        }
        let moved_aside = self.remove_locked(&mut index, id)?;
        drop(index);
        if let Some(trash) = moved_aside {
            self.disk.remove_quietly(&trash);
        }
        Ok(true)
    }

    /// Keeps the object even when it has no owners.
    pub fn pin(&self, id: ObjectId) -> Result<(), StoreError> {
        if self.lock().set_pinned(&id, true) {
            Ok(())
        } else {
            Err(StoreError::NotFound { id })
        }
    }

    /// Undoes [`pin`](Self::pin); an object with no owners is then deleted, and
    /// the result says whether it was.
    pub fn unpin(&self, id: ObjectId) -> Result<bool, StoreError> {
        let mut index = self.lock();
        if !index.set_pinned(&id, false) {
            return Err(StoreError::NotFound { id });
        }
        self.collect_if_unclaimed(index, &id)
    }

    /// Bytes and object counts per tier.
    pub fn stat(&self) -> StoreStats {
        self.lock().stats()
    }

    fn check_object_size(&self, size: u64) -> Result<(), StoreError> {
        if size > self.limits.max_object_bytes {
            return Err(StoreError::TooLarge {
                size,
                limit: self.limits.max_object_bytes,
            });
        }
        Ok(())
    }

    fn lock(&self) -> MutexGuard<'_, Index> {
        // A panic while holding the lock can only come from a bug between two
        // consistent states; the index is still usable, so a poisoned lock must
        // not turn every later request into a panic too.
        self.index.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Puts an object that fits the memory tier, spilling older objects to disk
    /// when needed, or putting it on disk when they cannot spill.
    fn put_in_memory(
        &self,
        id: ObjectId,
        bytes: Arc<[u8]>,
        owner: Owner,
    ) -> Result<ObjectId, StoreError> {
        let size = bytes.len() as u64;
        let victims = {
            let mut index = self.lock();
            if index.add_owner(&id, &owner) {
                return Ok(id);
            }
            match index.plan_memory(size) {
                MemoryPlan::Fits => {
                    index.insert_memory(id, bytes, owner);
                    return Ok(id);
                }
                MemoryPlan::Spill(victims) => victims,
                MemoryPlan::NoRoom => Vec::new(),
            }
        };
        if !victims.is_empty() {
            // The victims stay readable from memory while their files are written.
            let written: Vec<_> = victims
                .into_iter()
                .map(|victim| {
                    let temp = self.disk.write_temp(&victim.bytes);
                    (victim, temp)
                })
                .collect();
            let mut discarded = Vec::new();
            let mut index = self.lock();
            for (victim, temp) in written {
                index.unreserve_disk(victim.size);
                let temp = match temp {
                    Ok(temp) => temp,
                    Err(error) => {
                        tracing::warn!(id = %victim.id, %error, "cannot spill object to disk; it stays in memory");
                        index.revert_spill(&victim.id, victim.generation);
                        continue;
                    }
                };
                if !index.is_spilling(&victim.id, victim.generation) {
                    // Deleted while it was being written.
                    discarded.push(temp);
                    continue;
                }
                match self.disk.rename_into_place(&temp, &victim.id) {
                    Ok(()) => index.complete_spill(&victim.id, victim.generation),
                    Err(error) => {
                        tracing::warn!(id = %victim.id, %error, "cannot spill object to disk; it stays in memory");
                        index.revert_spill(&victim.id, victim.generation);
                    }
                }
            }
            let inserted = if index.add_owner(&id, &owner) {
                true
            } else if index.memory_fits(size) {
                index.insert_memory(id, Arc::clone(&bytes), owner.clone());
                true
            } else {
                false
            };
            drop(index);
            for temp in &discarded {
                self.disk.remove_quietly(temp);
            }
            self.disk.sync_dir();
            if inserted {
                return Ok(id);
            }
            // A spill failed or a concurrent put took the room: fall back to disk.
        }
        self.put_on_disk(id, &bytes, owner)
    }

    /// Writes an object straight to the disk tier, reserving its space first so
    /// that concurrent writers cannot overcommit the tier.
    fn put_on_disk(
        &self,
        id: ObjectId,
        bytes: &[u8],
        owner: Owner,
    ) -> Result<ObjectId, StoreError> {
        let size = bytes.len() as u64;
        {
            let mut index = self.lock();
            if index.add_owner(&id, &owner) {
                return Ok(id);
            }
            index.reserve_disk(size)?;
        }
        let temp = match self.disk.write_temp(bytes) {
            Ok(temp) => temp,
            Err(error) => {
                self.lock().unreserve_disk(size);
                return Err(error);
            }
        };
        self.publish_new(id, size, temp, size, owner)
    }

    /// Gives a fully written temporary file its final name and indexes it, unless
    /// the same content arrived meanwhile or (for unreserved streams) it does not
    /// fit; `reserved` is the disk space reserved for it beforehand.
    fn publish_new(
        &self,
        id: ObjectId,
        size: u64,
        temp: PathBuf,
        reserved: u64,
        owner: Owner,
    ) -> Result<ObjectId, StoreError> {
        let mut index = self.lock();
        index.unreserve_disk(reserved);
        if index.add_owner(&id, &owner) {
            drop(index);
            self.disk.remove_quietly(&temp);
            return Ok(id);
        }
        if let Err(error) = index.check_disk_room(size) {
            drop(index);
            self.disk.remove_quietly(&temp);
            return Err(error);
        }
        // Renamed under the lock: a concurrent delete or corruption check of the
        // same id then always sees the file and the entry agree.
        self.disk.rename_into_place(&temp, &id)?;
        index.insert_disk(id, size, owner);
        drop(index);
        self.disk.sync_dir();
        tracing::debug!(%id, size, "object written to disk");
        Ok(id)
    }

    /// Drops an existing entry; a disk object's file is first moved aside (a
    /// quick rename, so a re-put of the same id cannot be deleted by mistake) and
    /// its new path returned for unlinking after the lock is released. On error
    /// the entry stays.
    fn remove_locked(
        &self,
        index: &mut Index,
        id: &ObjectId,
    ) -> Result<Option<PathBuf>, StoreError> {
        let moved_aside = if index.is_on_disk(id) {
            self.disk.move_aside(id)?
        } else {
            None
        };
        index.remove(id);
        Ok(moved_aside)
    }
}
