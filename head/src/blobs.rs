//! The head's content-addressed blob directory (driver binaries for `entry`
//! trials): who keeps each blob, uploads within each user's limits, and the
//! collection of blobs nobody needs.
//!
//! A blob is kept while the connection that uploaded it is open (its driver
//! submits next) and while an unfinished experiment runs it
//! (`HeadCore::blobs_in_use`, asked by the collector); a blob neither holds,
//! and that no connection held for [`COLLECT_GRACE`], is deleted by
//! [`collect`], which runs every [`COLLECT_INTERVAL`]. Each blob's uploaders
//! are kept beside it (`HASH.owners`, one user per line), so a restarted head
//! still counts them: a user keeps at most the policy's count and bytes of
//! blobs (`BlobLimits`), checked, and the upload reserved, before a byte is
//! read.
//!
//! Invariant: a file `HASH` under `blobs/` is complete and matches its name's
//! blake3 hash: uploads go to a temporary file that is verified before the
//! rename; temporaries a crash left are removed at open.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use ractor::ActorRef;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};
use xp_head_core::requests::{BlobLimits, BlobUsage};
use xp_runtime::ids::BlobHash;
use xp_runtime::transport::{BLOB_CHUNK_BYTES, MAX_BLOB_BYTES};

use crate::actor::{HeadMsg, Read, call};

/// How often unneeded blobs are collected.
pub(crate) const COLLECT_INTERVAL: Duration = Duration::from_secs(10);
/// How long a blob stays after the last connection that uploaded it closed,
/// so that a submission racing the collector still finds its binary.
pub(crate) const COLLECT_GRACE: Duration = Duration::from_secs(30);

/// Why a blob could not be stored.
#[derive(Debug, thiserror::Error)]
pub(crate) enum BlobError {
    /// The announced length is over the limit.
    #[error("blob of {len} bytes exceeds the limit of {MAX_BLOB_BYTES}")]
    TooLarge {
        /// The announced length.
        len: u64,
    },
    /// The user keeps as many blobs, or bytes, as they may.
    #[error("{0}")]
    OverLimit(#[from] xp_head_core::CoreError),
    /// Fewer bytes arrived than announced.
    #[error("upload ended after {got} of {len} bytes")]
    Truncated {
        /// Bytes received.
        got: u64,
        /// Bytes announced.
        len: u64,
    },
    /// The bytes do not hash to the announced hash.
    #[error("uploaded bytes hash to {actual}, not the announced {announced}")]
    HashMismatch {
        /// What the client said.
        announced: BlobHash,
        /// What the bytes hash to.
        actual: BlobHash,
    },
    /// A file could not be written (a full disk, say).
    #[error("cannot store blob: {0}")]
    Io(#[from] std::io::Error),
}

static UPLOAD_SEQUENCE: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// What the head knows of one blob.
#[derive(Debug)]
struct BlobEntry {
    /// Its length (announced, for an upload in progress).
    len: u64,
    /// The users who uploaded it.
    owners: BTreeSet<String>,
    /// Open connections that uploaded it (or are uploading it).
    pins: u32,
    /// Whether its file is complete.
    stored: bool,
    /// When its last pin was let go.
    unpinned_at: Instant,
}

/// Every blob the directory holds or is receiving.
#[derive(Debug, Default)]
struct BlobIndex(BTreeMap<BlobHash, BlobEntry>);

impl BlobIndex {
    /// What `user` keeps, besides `except`.
    fn usage(&self, user: &str, except: Option<BlobHash>) -> BlobUsage {
        self.0
            .iter()
            .filter(|(hash, entry)| Some(**hash) != except && entry.owners.contains(user))
            .fold(BlobUsage::default(), |usage, (_, entry)| BlobUsage {
                count: usage.count + 1,
                bytes: usage.bytes.saturating_add(entry.len),
            })
    }

    /// Pins `hash` for one more connection, `user` among its owners; a blob
    /// new to the index is counted at `len` until its upload ends.
    fn pin(&mut self, hash: BlobHash, len: u64, user: &str) {
        let entry = self.0.entry(hash).or_insert_with(|| BlobEntry {
            len,
            owners: BTreeSet::new(),
            pins: 0,
            stored: false,
            unpinned_at: Instant::now(),
        });
        entry.owners.insert(user.to_owned());
        entry.pins += 1;
    }

    /// Lets one pin of `hash` go; an upload that never completed leaves no trace.
    fn unpin(&mut self, hash: BlobHash) {
        if let Some(entry) = self.0.get_mut(&hash) {
            entry.pins = entry.pins.saturating_sub(1);
            entry.unpinned_at = Instant::now();
            if entry.pins == 0 && !entry.stored {
                self.0.remove(&hash);
            }
        }
    }

    /// The blobs to delete: stored, unpinned for [`COLLECT_GRACE`], and not
    /// in `in_use`; taken out of the index.
    fn take_collectible(&mut self, in_use: &BTreeSet<BlobHash>) -> Vec<BlobHash> {
        let collectible: Vec<BlobHash> = self
            .0
            .iter()
            .filter(|(hash, entry)| {
                entry.stored
                    && entry.pins == 0
                    && entry.unpinned_at.elapsed() >= COLLECT_GRACE
                    && !in_use.contains(*hash)
            })
            .map(|(hash, _)| *hash)
            .collect();
        for hash in &collectible {
            self.0.remove(hash);
        }
        collectible
    }
}

/// The blob directory.
#[derive(Debug, Clone)]
pub(crate) struct BlobStore {
    dir: PathBuf,
    index: Arc<Mutex<BlobIndex>>,
}

/// The blobs one connection uploaded, pinned until it closes (dropped).
#[derive(Debug)]
pub(crate) struct ConnectionBlobs {
    store: BlobStore,
    pinned: Mutex<Vec<BlobHash>>,
}

impl Drop for ConnectionBlobs {
    fn drop(&mut self) {
        let pinned = std::mem::take(
            &mut *self
                .pinned
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner),
        );
        let mut index = self.store.index();
        for hash in pinned {
            index.unpin(hash);
        }
    }
}

impl BlobStore {
    /// A store in `dir`, created if needed: what it holds is indexed with
    /// its owners, and temporaries a crash left are removed.
    pub(crate) fn open(dir: &Path) -> Result<Self, std::io::Error> {
        std::fs::create_dir_all(dir)?;
        let mut index = BlobIndex::default();
        for entry in std::fs::read_dir(dir)? {
            let entry = entry?;
            let name = entry.file_name().to_string_lossy().into_owned();
            if name.ends_with(".part") {
                let _ = std::fs::remove_file(entry.path());
                continue;
            }
            let Ok(hash) = name.parse::<BlobHash>() else {
                continue;
            };
            let owners = std::fs::read_to_string(dir.join(format!("{name}.owners")))
                .map(|text| text.lines().map(str::to_owned).collect())
                .unwrap_or_default();
            let blob = BlobEntry {
                len: entry.metadata()?.len(),
                owners,
                pins: 0,
                stored: true,
                unpinned_at: Instant::now(),
            };
            index.0.insert(hash, blob);
        }
        Ok(Self {
            dir: dir.to_owned(),
            index: Arc::new(Mutex::new(index)),
        })
    }

    fn index(&self) -> MutexGuard<'_, BlobIndex> {
        self.index
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// The path of `hash`, whether or not it exists.
    pub(crate) fn path(&self, hash: BlobHash) -> PathBuf {
        self.dir.join(hash.to_string())
    }

    /// The pins of a new connection.
    pub(crate) fn connection(&self) -> ConnectionBlobs {
        ConnectionBlobs {
            store: self.clone(),
            pinned: Mutex::new(Vec::new()),
        }
    }

    /// What `user` keeps now.
    pub(crate) fn usage(&self, user: &str) -> BlobUsage {
        self.index().usage(user, None)
    }

    /// Receives `len` bytes from `reader` and stores them as `hash`, uploaded
    /// by `user` on `connection`, after checking what `user` keeps against
    /// `limits` and verifying the bytes.
    pub(crate) async fn receive(
        &self,
        upload: Upload<'_>,
        reader: &mut (impl tokio::io::AsyncRead + Unpin),
    ) -> Result<(), BlobError> {
        let Upload {
            hash,
            len,
            user,
            limits,
            connection,
        } = upload;
        if len > MAX_BLOB_BYTES {
            return Err(BlobError::TooLarge { len });
        }
        {
            let mut index = self.index();
            let owned = index
                .0
                .get(&hash)
                .is_some_and(|entry| entry.owners.contains(user));
            if !owned {
                limits.check(user, index.usage(user, Some(hash)), len)?;
            }
            index.pin(hash, len, user);
        }
        if let Err(error) = self.write_blob(hash, len, reader).await {
            // A failed upload holds nothing of its user's.
            self.index().unpin(hash);
            return Err(error);
        }
        connection
            .pinned
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .push(hash);
        self.note_stored(hash, len).await
    }

    /// Marks `hash` complete and writes its owners beside it.
    async fn note_stored(&self, hash: BlobHash, len: u64) -> Result<(), BlobError> {
        let owners = {
            let mut index = self.index();
            let Some(entry) = index.0.get_mut(&hash) else {
                return Ok(());
            };
            entry.stored = true;
            entry.len = len;
            entry.owners.iter().cloned().collect::<Vec<_>>().join("\n")
        };
        let owners_path = self.dir.join(format!("{hash}.owners"));
        tokio::fs::write(&owners_path, format!("{owners}\n")).await?;
        Ok(())
    }

    /// Receives the bytes into a temporary file, verifies them and renames it.
    async fn write_blob(
        &self,
        hash: BlobHash,
        len: u64,
        reader: &mut (impl tokio::io::AsyncRead + Unpin),
    ) -> Result<(), BlobError> {
        let final_path = self.path(hash);
        // Uploads of one hash may race: each writes its own temporary file.
        let sequence = UPLOAD_SEQUENCE.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let temporary = self
            .dir
            .join(format!(".{hash}.{}.{sequence}.part", std::process::id()));
        let result = async {
            let mut file = tokio::fs::File::create(&temporary).await?;
            let mut hasher = blake3::Hasher::new();
            let mut buffer = vec![0u8; BLOB_CHUNK_BYTES];
            let mut got = 0u64;
            let mut limited = reader.take(len);
            loop {
                let read = limited.read(&mut buffer).await?;
                if read == 0 {
                    break;
                }
                hasher.update(&buffer[..read]);
                file.write_all(&buffer[..read]).await?;
                got += read as u64;
            }
            if got != len {
                return Err(BlobError::Truncated { got, len });
            }
            let actual = BlobHash(*hasher.finalize().as_bytes());
            if actual != hash {
                return Err(BlobError::HashMismatch {
                    announced: hash,
                    actual,
                });
            }
            file.sync_all().await?;
            tokio::fs::rename(&temporary, &final_path).await?;
            // The rename is durable only once the directory is synced.
            tokio::fs::File::open(&self.dir).await?.sync_all().await?;
            Ok(())
        }
        .await;
        if result.is_err() {
            let _ = tokio::fs::remove_file(&temporary).await;
        }
        result
    }

    /// Deletes every blob that no open connection and no experiment in
    /// `in_use` needs (and none has needed for [`COLLECT_GRACE`]).
    pub(crate) async fn collect(&self, in_use: &BTreeSet<BlobHash>) -> Vec<BlobHash> {
        let collectible = self.index().take_collectible(in_use);
        for hash in &collectible {
            let path = self.path(*hash);
            if let Err(error) = tokio::fs::remove_file(&path).await {
                warn!(blob = %hash, %error, "cannot delete a collected blob");
            }
            let _ = tokio::fs::remove_file(self.dir.join(format!("{hash}.owners"))).await;
            info!(blob = %hash, "blob collected: no unfinished experiment runs it");
        }
        collectible
    }
}

/// One upload: what, by whom, within which limits, on which connection.
pub(crate) struct Upload<'a> {
    /// The blob's hash.
    pub(crate) hash: BlobHash,
    /// Its announced length.
    pub(crate) len: u64,
    /// Who uploads it.
    pub(crate) user: &'a str,
    /// What a user may keep.
    pub(crate) limits: BlobLimits,
    /// The uploading connection, which pins it while open.
    pub(crate) connection: &'a ConnectionBlobs,
}

/// Collects unneeded blobs every [`COLLECT_INTERVAL`] until `shutdown`.
pub(crate) async fn collector(
    store: BlobStore,
    head: ActorRef<HeadMsg>,
    shutdown: CancellationToken,
) {
    let mut interval = tokio::time::interval(COLLECT_INTERVAL);
    interval.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            () = shutdown.cancelled() => return,
            _ = interval.tick() => {}
        }
        match call(&head, |reply| HeadMsg::Read(Read::BlobsInUse(reply))).await {
            Ok(in_use) => {
                store.collect(&in_use).await;
            }
            Err(error) => warn!(%error, "cannot ask which blobs are in use; collecting later"),
        }
    }
}

#[cfg(test)]
mod tests;
