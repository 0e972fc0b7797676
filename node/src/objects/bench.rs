//! `xp bench objects`: object store throughput on this machine, each figure
//! held against a limit measured in the same run: single-thread memory copy for
//! local operations, one loopback TCP stream for fetches between two stores.
//!
//! Every operation is timed whole, as a caller sees it: a `put` hashes and stores
//! (on disk: writes and fsyncs), a disk-tier `get` maps and verifies the file
//! against its id, a `remote_get` pulls the object over QUIC, verifies and stores
//! it, a checkpoint save takes a directory into the store and a restore writes it
//! back out. Best of three runs, each on fresh content so deduplication never
//! short-cuts one.
//!
//! Not a test: it asserts nothing about the figures, and is run only by
//! `xp bench objects`, never by `cargo test`.

use std::path::Path;
use std::sync::Arc;

use tokio::sync::mpsc;
use xp_runtime::collective::CollectiveError;
use xp_runtime::collective::bench::{memcpy_gbps, stopwatch, tcp_loopback_gbps};
use xp_runtime::ids::NodeId;
use xp_runtime::object_wire;
use xp_runtime::protocol::ObjectSource;

use super::remote::{FetchError, ObjectFetcher, ObjectServer, ObjectServerError, Wanted};
use super::{ObjectStore, Owner, StoreError, StoreLimits};
use crate::checkpoint::CheckpointError;

/// Why the bench could not finish: the first operation that failed.
#[derive(Debug, thiserror::Error)]
pub enum BenchError {
    /// The loopback TCP reference could not be measured.
    #[error("loopback TCP")]
    Loopback(#[source] CollectiveError),
    /// A store refused an operation.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// The object server could not start.
    #[error(transparent)]
    Server(#[from] ObjectServerError),
    /// An object could not be fetched between the two stores.
    #[error(transparent)]
    Fetch(#[from] FetchError),
    /// The checkpoint could not be taken or restored.
    #[error(transparent)]
    Checkpoint(#[from] CheckpointError),
    /// The checkpoint's files could not be written.
    #[error(transparent)]
    Io(#[from] std::io::Error),
}

/// One measured figure.
#[derive(Debug, Clone, PartialEq)]
pub struct Measurement {
    /// `put`, `get`, `remote_get`, `checkpoint_save` or `checkpoint_restore`.
    pub op: &'static str,
    /// Where the object lived: `memory` or `disk` (for puts and gets).
    pub tier: &'static str,
    /// The object (or checkpoint) size.
    pub size_bytes: u64,
    /// Gigabytes (1e9 bytes) per second.
    pub gbps: f64,
    /// The limit it is held against, in the same unit.
    pub reference_gbps: f64,
    /// What that limit is: `memcpy` or `tcp_loopback`.
    pub reference: &'static str,
}

const RUNS: usize = 3;
const TOKEN: &str = "bench";

fn content(size: u64, run: usize) -> Vec<u8> {
    let mut bytes = vec![0u8; size as usize];
    for (index, chunk) in bytes.chunks_mut(4096).enumerate() {
        chunk[0] = (index % 251) as u8;
    }
    if let Some(first) = bytes.first_mut() {
        *first = run as u8;
    }
    bytes
}

fn gbps(bytes: u64, seconds: f64) -> f64 {
    bytes as f64 / seconds.max(1e-9) / 1e9
}

fn owner() -> Owner {
    Owner::Driver("bench".to_owned())
}

fn open(dir: &Path, name: &str, memory_bytes: u64) -> Result<Arc<ObjectStore>, StoreError> {
    let limits = StoreLimits {
        memory_bytes,
        disk_bytes: u64::MAX / 2,
        max_object_bytes: u64::MAX / 2,
    };
    ObjectStore::open(dir.join(name), limits).map(Arc::new)
}

/// Runs every measurement for `sizes`, and a checkpoint of `checkpoint_bytes`,
/// with stores under `dir`.
pub async fn run(
    dir: &Path,
    sizes: &[u64],
    checkpoint_bytes: u64,
) -> Result<Vec<Measurement>, BenchError> {
    let memcpy = memcpy_gbps(64 << 20);
    let tcp = tcp_loopback_gbps(256 << 20)
        .await
        .map_err(BenchError::Loopback)?;
    let largest = sizes.iter().copied().max().unwrap_or(0);
    let memory_store = open(dir, "memory", largest.saturating_mul(2).max(1 << 20))?;
    let disk_store = open(dir, "disk", 0)?;
    let fetching_store = open(dir, "fetching", largest.saturating_mul(2).max(1 << 20))?;
    let (dropped, _dropped_rx) = mpsc::unbounded_channel();
    let digest = object_wire::token_digest(TOKEN);
    let server = ObjectServer::start(
        disk_store.clone(),
        "127.0.0.1:0".parse().expect("a literal socket address"),
        digest,
        dropped,
    )?;
    let source = ObjectSource {
        node: NodeId::random(),
        host: "127.0.0.1".to_owned(),
        endpoint: server.endpoint()?,
    };
    let fetcher = ObjectFetcher::new(digest)?;
    let local = |op, tier, size, gbps| Measurement {
        op,
        tier,
        size_bytes: size,
        gbps,
        reference_gbps: memcpy,
        reference: "memcpy",
    };
    let mut out = Vec::new();
    for &size in sizes {
        let (mut put_memory, mut put_disk, mut get_disk, mut remote) = (0f64, 0f64, 0f64, 0f64);
        for run in 0..RUNS {
            let bytes: Arc<[u8]> = content(size, run).into();
            let started = stopwatch();
            let id = memory_store.put(bytes.clone(), owner())?;
            put_memory = put_memory.max(gbps(size, started.elapsed().as_secs_f64()));
            memory_store.delete(id)?;

            let started = stopwatch();
            disk_store.put(bytes.clone(), owner())?;
            put_disk = put_disk.max(gbps(size, started.elapsed().as_secs_f64()));
            drop(bytes);

            // Each get maps the file afresh and hashes it: no earlier map is held.
            let started = stopwatch();
            let got = disk_store.get(id)?;
            get_disk = get_disk.max(gbps(size, started.elapsed().as_secs_f64()));
            drop(got);

            let started = stopwatch();
            fetcher
                .ensure(
                    &fetching_store,
                    Wanted {
                        id,
                        owner: owner(),
                        pin: false,
                        size: Some(size),
                    },
                    std::slice::from_ref(&source),
                    None,
                )
                .await?;
            remote = remote.max(gbps(size, started.elapsed().as_secs_f64()));
            fetching_store.delete(id)?;
            disk_store.delete(id)?;
        }
        out.push(local("put", "memory", size, put_memory));
        out.push(local("put", "disk", size, put_disk));
        out.push(local("get", "disk", size, get_disk));
        out.push(Measurement {
            op: "remote_get",
            tier: "disk",
            size_bytes: size,
            gbps: remote,
            reference_gbps: tcp,
            reference: "tcp_loopback",
        });
    }
    server.close();
    if checkpoint_bytes > 0 {
        let (save, restore) = checkpoint(dir, &disk_store, checkpoint_bytes)?;
        out.push(local("checkpoint_save", "disk", checkpoint_bytes, save));
        out.push(local(
            "checkpoint_restore",
            "disk",
            checkpoint_bytes,
            restore,
        ));
    }
    Ok(out)
}

/// Saves and restores a one-file checkpoint of `size` bytes; best of three each.
fn checkpoint(dir: &Path, store: &ObjectStore, size: u64) -> Result<(f64, f64), BenchError> {
    let trial = "3f2a9c0d11b2e4f7-t0".parse().expect("a literal trial id");
    let checkpoint_dir = dir.join("work").join("checkpoint");
    let restored_dir = dir.join("restored");
    let (mut save, mut restore) = (0f64, 0f64);
    for run in 0..RUNS {
        std::fs::create_dir_all(&checkpoint_dir)?;
        std::fs::write(checkpoint_dir.join("state"), content(size, 100 + run))?;
        let started = stopwatch();
        let files = crate::checkpoint::take(store, &checkpoint_dir, None, trial, run as u64)?;
        save = save.max(gbps(size, started.elapsed().as_secs_f64()));
        let _ = std::fs::remove_dir_all(&restored_dir);
        let started = stopwatch();
        crate::checkpoint::restore(store, &restored_dir, &files)?;
        restore = restore.max(gbps(size, started.elapsed().as_secs_f64()));
        for file in files {
            store.delete(file.object)?;
        }
    }
    let _ = std::fs::remove_dir_all(&restored_dir);
    Ok((save, restore))
}
