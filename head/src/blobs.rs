//! The head's content-addressed blob directory (driver binaries for `entry` trials).
//!
//! Invariant: a file under `blobs/` is complete and matches its name's blake3
//! hash: uploads go to a temporary file that is verified before the rename.

use std::path::{Path, PathBuf};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use xp_runtime::ids::BlobHash;
use xp_runtime::transport::{BLOB_CHUNK_BYTES, MAX_BLOB_BYTES};

/// Why a blob could not be stored.
#[derive(Debug, thiserror::Error)]
pub(crate) enum BlobError {
    /// The announced length is over the limit.
    #[error("blob of {len} bytes exceeds the limit of {MAX_BLOB_BYTES}")]
    TooLarge {
        /// The announced length.
        len: u64,
    },
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

/// The blob directory.
#[derive(Debug, Clone)]
pub(crate) struct BlobStore {
    dir: PathBuf,
}

impl BlobStore {
    /// A store in `dir`, created if needed.
    pub(crate) fn open(dir: &Path) -> Result<Self, std::io::Error> {
        std::fs::create_dir_all(dir)?;
        Ok(Self {
            dir: dir.to_owned(),
        })
    }

    /// The path of `hash`, whether or not it exists.
    pub(crate) fn path(&self, hash: BlobHash) -> PathBuf {
        self.dir.join(hash.to_string())
    }

    /// Receives `len` bytes from `reader` and stores them as `hash` after verifying it.
    pub(crate) async fn receive(
        &self,
        hash: BlobHash,
        len: u64,
        reader: &mut (impl tokio::io::AsyncRead + Unpin),
    ) -> Result<(), BlobError> {
        if len > MAX_BLOB_BYTES {
            return Err(BlobError::TooLarge { len });
        }
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
}
