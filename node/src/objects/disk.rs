//! The disk tier's files: one file per object, named by its id, in one directory.
//!
//! Writes go to a temporary file (`.tmp-N`) in the same directory, are fsynced,
//! and only then renamed to the object's name, so a crash leaves either the whole
//! object or a temporary file that the next open removes. Deletes first rename the
//! file to a temporary name, which is quick enough to do under the store's lock,
//! and unlink it after.
//!
//! Object files are never opened for writing once they have their final name:
//! that is what makes mapping them sound (see [`DiskDir::map_verified`]).
//!
//! This module keeps no index; it only does the file work the store asks for.

use std::fs::{self, File, OpenOptions, TryLockError};
use std::io::{self, Read, Write};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use memmap2::Mmap;
use xp_runtime::ids::ObjectId;

use super::error::{IoOperation, StoreError};
use super::types::object_id;

/// Names starting with this are temporary files, removed at open.
const TEMP_PREFIX: &str = ".tmp-";

/// The file whose lock says which store has the directory open.
const LOCK_FILE_NAME: &str = ".lock";

/// How much of a stream is read, hashed and written at a time.
const STREAM_CHUNK_BYTES: usize = 1 << 20;

/// A closure turning an I/O error into [`StoreError::Io`] for `path`.
fn io_error(operation: IoOperation, path: &Path) -> impl FnOnce(io::Error) -> StoreError + '_ {
    move |source| StoreError::Io {
        operation,
        path: path.to_owned(),
        source,
    }
}

/// What copying a stream to a temporary file gave.
#[derive(Debug)]
pub(crate) enum StreamOutcome {
    /// The whole stream is in `temp`, fsynced.
    Written {
        id: ObjectId,
        size: u64,
        temp: PathBuf,
    },
    /// The stream passed the free space, so it was only hashed from there on
    /// and nothing is left on disk; it can still be content already stored.
    Overflowed { id: ObjectId, size: u64 },
}

/// What mapping an object's file found.
#[derive(Debug)]
pub(crate) enum MapOutcome {
    /// The mapped bytes hash to the object's id.
    Verified(Arc<Mmap>),
    /// They do not.
    Mismatch,
    /// There is no file.
    Missing,
}

/// The disk tier's directory, locked for as long as this lives.
#[derive(Debug)]
pub(crate) struct DiskDir {
    dir: PathBuf,
    next_temp: AtomicU64,
    /// Held for its lock, released when the store is dropped.
    _lock_file: File,
}

impl DiskDir {
    /// Creates and locks `dir`, removes temporary files left by a crash, and lists
    /// the objects there with their sizes.
    pub(crate) fn open(dir: PathBuf) -> Result<(Self, Vec<(ObjectId, u64)>), StoreError> {
        fs::create_dir_all(&dir).map_err(io_error(IoOperation::CreateDirectory, &dir))?;
        let lock_path = dir.join(LOCK_FILE_NAME);
        let lock_file = OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&lock_path)
            .map_err(io_error(IoOperation::LockDirectory, &lock_path))?;
        match lock_file.try_lock() {
            Ok(()) => {}
            Err(TryLockError::WouldBlock) => return Err(StoreError::Locked { dir }),
            Err(TryLockError::Error(source)) => {
                return Err(StoreError::Io {
                    operation: IoOperation::LockDirectory,
                    path: lock_path,
                    source,
                });
            }
        }
        let mut recovered = Vec::new();
        let mut n_temps_removed = 0;
        for dir_entry in fs::read_dir(&dir).map_err(io_error(IoOperation::ReadDirectory, &dir))? {
            let dir_entry = dir_entry.map_err(io_error(IoOperation::ReadDirectory, &dir))?;
            let path = dir_entry.path();
            let file_name = dir_entry.file_name();
            let file_name = file_name.to_string_lossy();
            if file_name.starts_with(TEMP_PREFIX) {
                fs::remove_file(&path).map_err(io_error(IoOperation::Remove, &path))?;
                n_temps_removed += 1;
                continue;
            }
            if file_name == LOCK_FILE_NAME {
                continue;
            }
            // Symbolic links are not followed: every object file is one this store wrote.
            let metadata = dir_entry
                .metadata()
                .map_err(io_error(IoOperation::ReadDirectory, &path))?;
            match file_name.parse::<ObjectId>() {
                Ok(id) if metadata.is_file() => recovered.push((id, metadata.len())),
                _ => {
                    tracing::warn!(path = %path.display(), "ignoring a file that is not an object")
                }
            }
        }
        if n_temps_removed > 0 {
            tracing::info!(dir = %dir.display(), n_temps_removed, "removed unfinished object files");
        }
        let disk_dir = Self {
            dir,
            next_temp: AtomicU64::new(0),
            _lock_file: lock_file,
        };
        Ok((disk_dir, recovered))
    }

    pub(crate) fn dir(&self) -> &Path {
        &self.dir
    }

    fn object_path(&self, id: &ObjectId) -> PathBuf {
        self.dir.join(id.to_string())
    }

    /// A new temporary file. The directory lock makes this store the only writer,
    /// and open removed older temporary files, so the counter alone is unique.
    fn create_temp(&self) -> Result<(PathBuf, File), StoreError> {
        let n = self.next_temp.fetch_add(1, Ordering::Relaxed);
        let path = self.dir.join(format!("{TEMP_PREFIX}{n}"));
        let file = OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(&path)
            .map_err(io_error(IoOperation::CreateFile, &path))?;
        Ok((path, file))
    }

    /// Flushes a finished temporary file and makes it read-only, since nothing
    /// may write an object file once it can be mapped.
    fn finish_temp(path: &Path, file: &File) -> Result<(), StoreError> {
        file.sync_all().map_err(io_error(IoOperation::Sync, path))?;
        let mut permissions = file
            .metadata()
            .map_err(io_error(IoOperation::Sync, path))?
            .permissions();
        permissions.set_readonly(true);
        file.set_permissions(permissions)
            .map_err(io_error(IoOperation::Sync, path))
    }

    /// Writes `bytes` to a fsynced temporary file and returns its path; on error
    /// nothing is left behind.
    pub(crate) fn write_temp(&self, bytes: &[u8]) -> Result<PathBuf, StoreError> {
        let (path, mut file) = self.create_temp()?;
        let result = file
            .write_all(bytes)
            .map_err(io_error(IoOperation::Write, &path))
            .and_then(|()| Self::finish_temp(&path, &file));
        drop(file);
        match result {
            Ok(()) => Ok(path),
            Err(error) => {
                self.remove_quietly(&path);
                Err(error)
            }
        }
    }

    /// Copies `reader` to a fsynced temporary file, hashing on the way. Gives up
    /// once more than `max_object_bytes` arrive; past `available` bytes it stops
    /// writing but keeps hashing, so that re-putting stored content still works
    /// when the disk tier is full. On error nothing is left behind.
    pub(crate) fn write_stream(
        &self,
        mut reader: impl Read,
        max_object_bytes: u64,
        available: u64,
    ) -> Result<StreamOutcome, StoreError> {
        let (path, file) = self.create_temp()?;
        let mut file = Some(file);
        let mut copy = || -> Result<(ObjectId, u64), StoreError> {
            let mut hasher = blake3::Hasher::new();
            let mut buffer = vec![0u8; STREAM_CHUNK_BYTES];
            let mut size: u64 = 0;
            loop {
                let n_read = match reader.read(&mut buffer) {
                    Ok(0) => break,
                    Ok(n_read) => n_read,
                    Err(error) if error.kind() == io::ErrorKind::Interrupted => continue,
                    Err(source) => return Err(StoreError::Read { source }),
                };
                size += n_read as u64;
                if size > max_object_bytes {
                    return Err(StoreError::TooLarge {
                        size,
                        limit: max_object_bytes,
                    });
                }
                let chunk = &buffer[..n_read];
                // Both cores hash while the page cache absorbs the write.
                hasher.update_rayon(chunk);
                if size > available {
                    file = None;
                }
                if let Some(file) = &mut file {
                    file.write_all(chunk)
                        .map_err(io_error(IoOperation::Write, &path))?;
                }
            }
            if let Some(file) = &file {
                Self::finish_temp(&path, file)?;
            }
            Ok((ObjectId(*hasher.finalize().as_bytes()), size))
        };
        let result = copy();
        let written = file.is_some();
        drop(file);
        match result {
            Ok((id, size)) if written => Ok(StreamOutcome::Written {
                id,
                size,
                temp: path,
            }),
            Ok((id, size)) => {
                self.remove_quietly(&path);
                Ok(StreamOutcome::Overflowed { id, size })
            }
            Err(error) => {
                self.remove_quietly(&path);
                Err(error)
            }
        }
    }

    /// Gives a finished temporary file the object's name; on error the temporary
    /// file is removed.
    pub(crate) fn rename_into_place(&self, temp: &Path, id: &ObjectId) -> Result<(), StoreError> {
        let path = self.object_path(id);
        if let Err(source) = fs::rename(temp, &path) {
            self.remove_quietly(temp);
            return Err(StoreError::Io {
                operation: IoOperation::RenameIntoPlace,
                path,
                source,
            });
        }
        Ok(())
    }

    /// Renames the object's file to a temporary name for unlinking later; `None`
    /// when there was no file.
    pub(crate) fn move_aside(&self, id: &ObjectId) -> Result<Option<PathBuf>, StoreError> {
        let path = self.object_path(id);
        let n = self.next_temp.fetch_add(1, Ordering::Relaxed);
        let aside = self.dir.join(format!("{TEMP_PREFIX}{n}"));
        match fs::rename(&path, &aside) {
            Ok(()) => Ok(Some(aside)),
            Err(error) if error.kind() == io::ErrorKind::NotFound => Ok(None),
            Err(source) => Err(StoreError::Io {
                operation: IoOperation::MoveAside,
                path,
                source,
            }),
        }
    }

    /// Removes a temporary file. A failure only leaves a file the next open
    /// removes, so it is logged rather than returned.
    pub(crate) fn remove_quietly(&self, path: &Path) {
        if let Err(error) = fs::remove_file(path)
            && error.kind() != io::ErrorKind::NotFound
        {
            tracing::warn!(path = %path.display(), %error, "cannot remove temporary object file");
        }
    }

    /// Makes renames in the directory durable. A failure is logged, not returned:
    /// the object file itself is complete and synced, and the worst a crash can
    /// then do is undo the rename, which leaves the object absent, not damaged.
    pub(crate) fn sync_dir(&self) {
        if let Err(error) = File::open(&self.dir).and_then(|dir| dir.sync_all()) {
            tracing::warn!(dir = %self.dir.display(), %error, "cannot sync object directory");
        }
    }

    /// Maps the object's file read-only and checks that it hashes to `id`.
    pub(crate) fn map_verified(&self, id: &ObjectId) -> Result<MapOutcome, StoreError> {
        let Some(map) = self.map(id)? else {
            return Ok(MapOutcome::Missing);
        };
        if object_id(&map) != *id {
            return Ok(MapOutcome::Mismatch);
        }
        Ok(MapOutcome::Verified(Arc::new(map)))
    }

    /// The object's file, opened for reading; `None` when there is none.
    pub(crate) fn open_file(&self, id: &ObjectId) -> Result<Option<File>, StoreError> {
        let path = self.object_path(id);
        match File::open(&path) {
            Ok(file) => Ok(Some(file)),
            Err(error) if error.kind() == io::ErrorKind::NotFound => Ok(None),
            Err(source) => Err(StoreError::Io {
                operation: IoOperation::Open,
                path,
                source,
            }),
        }
    }

    /// A read-only map of the object's file, not checked against its id; `None`
    /// when there is no file.
    pub(crate) fn map(&self, id: &ObjectId) -> Result<Option<Mmap>, StoreError> {
        let path = self.object_path(id);
        let Some(file) = self.open_file(id)? else {
            return Ok(None);
        };
        // SAFETY: a map is sound while nobody truncates or writes the file. This
        // store never opens an object file for writing (files get their final
        // name only when complete, and are read-only), and replaces or deletes
        // them only by rename and unlink, which leave existing maps intact. The
        // directory lock keeps other stores out; a process writing into the
        // directory behind the store's back is outside what this can defend.
        let map = unsafe { Mmap::map(&file) }.map_err(io_error(IoOperation::Map, &path))?;
        Ok(Some(map))
    }
}
