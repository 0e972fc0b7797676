//! `xp bench objects`: object store throughput on this machine, each figure
//! held against a limit measured in the same run: single-thread memory copy for
//! local operations, one loopback TCP stream for fetches between two stores.
//!
//! Every operation is timed whole, as a caller sees it: a `put` hashes and stores
//! (on disk: writes and fsyncs), a disk-tier `get` maps and verifies the file
//! against its id, a `remote_get` pulls the object over QUIC (tier `quic`) or
//! over the plain TCP bulk path of trusted networks (tier `tcp`), verifies and
//! stores it, a checkpoint save takes a directory into the store and a restore
//! writes it back out. Best of three runs, each on fresh content so
//! deduplication never short-cuts one.
//!
//! Not a test: it asserts nothing about the figures, and is run only by
//! `xp bench objects`, never by `cargo test`. It drives the node's object store
//! through `xp_node`'s public API and its `test-util` checkpoint helpers.

use std::path::Path;
use std::sync::Arc;

use tokio::sync::mpsc;
use xp_node::{
    CheckpointError, FetchError, ObjectAccess, ObjectChange, ObjectFetcher, ObjectServer,
    ObjectServerError, ObjectStore, Owner, StoreError, StoreLimits, Wanted,
};
use xp_runtime::collective::CollectiveError;
use xp_runtime::collective::bench::{memcpy_gbps, stopwatch, tcp_loopback_gbps};
use xp_runtime::ids::{NodeId, ObjectId};
use xp_runtime::object_wire::{self, FetchPath};
use xp_runtime::protocol::ObjectSource;

/// Why the bench could not finish: the first operation that failed.
#[derive(Debug, thiserror::Error)]
pub enum ObjectBenchError {
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
pub struct ObjectMeasurement {
    /// `put`, `get`, `remote_get`, `tcp_new_buffer` (a second reference:
    /// loopback TCP into a new buffer of the object's size), `checkpoint_save`
    /// or `checkpoint_restore`.
    pub op: &'static str,
    /// Where the object lived: `memory` or `disk` (puts, gets, checkpoints); the
    /// path a `remote_get` took: `quic` or `tcp`.
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

/// The stores of one bench and the server between them: puts go to a memory
/// store and a disk store, and a third store fetches from the disk store's server.
struct Stores {
    memory: Arc<ObjectStore>,
    disk: Arc<ObjectStore>,
    fetching: Arc<ObjectStore>,
    server: ObjectServer,
    source: ObjectSource,
    fetcher: ObjectFetcher,
    /// What the server reports (copies it found damaged), unread.
    _changes: mpsc::UnboundedReceiver<ObjectChange>,
}

impl Stores {
    /// Opens the stores under `dir`, the memory tiers large enough for `largest`.
    fn open(dir: &Path, largest: u64) -> Result<Self, ObjectBenchError> {
        let memory = open(dir, "memory", largest.saturating_mul(2).max(1 << 20))?;
        let disk = open(dir, "disk", 0)?;
        let fetching = open(dir, "fetching", largest.saturating_mul(2).max(1 << 20))?;
        let (dropped, changes) = mpsc::unbounded_channel();
        let server = ObjectServer::start(
            disk.clone(),
            "127.0.0.1:0".parse().expect("a literal socket address"),
            Arc::new(ObjectAccess::new(TOKEN)),
            dropped,
        )?;
        let source = ObjectSource {
            node: NodeId::random(),
            host: "127.0.0.1".to_owned(),
            endpoint: server.endpoint()?,
        };
        let fetcher = ObjectFetcher::new(object_wire::Credential::Node(
            object_wire::node_credential(TOKEN),
        ))?;
        Ok(Self {
            memory,
            disk,
            fetching,
            server,
            source,
            fetcher,
            _changes: changes,
        })
    }

    /// Fetches `id` of `size` bytes from the disk store's server over `path`.
    async fn fetch(&self, id: ObjectId, size: u64, path: FetchPath) -> Result<(), FetchError> {
        let wanted = Wanted {
            id,
            owner: owner(),
            pin: false,
            size: Some(size),
            path,
        };
        let sources = std::slice::from_ref(&self.source);
        self.fetcher
            .ensure(&self.fetching, wanted, sources, None)
            .await
            .map(drop)
    }
}

/// The best of [`RUNS`] for one size, in GB/s: a put to memory, a put to disk,
/// a get from disk, and a fetch from the other store over each path.
#[derive(Debug, Default)]
struct SizeFigures {
    put_memory: f64,
    put_disk: f64,
    get_disk: f64,
    remote: f64,
    remote_tcp: f64,
}

/// Runs every measurement for `sizes`, and a checkpoint of `checkpoint_bytes`,
/// with stores under `dir`.
pub async fn bench_objects(
    dir: &Path,
    sizes: &[u64],
    checkpoint_bytes: u64,
) -> Result<Vec<ObjectMeasurement>, ObjectBenchError> {
    let memcpy = memcpy_gbps(64 << 20);
    let tcp = tcp_loopback_gbps(256 << 20)
        .await
        .map_err(ObjectBenchError::Loopback)?;
    let largest = sizes.iter().copied().max().unwrap_or(0);
    let stores = Stores::open(dir, largest)?;
    let local = |op, tier, size, gbps| ObjectMeasurement {
        op,
        tier,
        size_bytes: size,
        gbps,
        reference_gbps: memcpy,
        reference: "memcpy",
    };
    let mut out = Vec::new();
    for &size in sizes {
        let figures = measure_size(&stores, size).await?;
        out.push(local("put", "memory", size, figures.put_memory));
        out.push(local("put", "disk", size, figures.put_disk));
        out.push(local("get", "disk", size, figures.get_disk));
        let fresh = tcp_into_new_buffer_gbps(size)
            .await
            .map_err(ObjectBenchError::Io)?;
        for (op, tier, gbps) in [
            ("remote_get", "quic", figures.remote),
            ("remote_get", "tcp", figures.remote_tcp),
            ("tcp_new_buffer", "memory", fresh),
        ] {
            out.push(ObjectMeasurement {
                op,
                tier,
                size_bytes: size,
                gbps,
                reference_gbps: tcp,
                reference: "tcp_loopback",
            });
        }
    }
    stores.server.close();
    if checkpoint_bytes > 0 {
        let (save, restore) = checkpoint(dir, &stores.disk, checkpoint_bytes)?;
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

/// Puts, gets and fetches an object of `size` bytes [`RUNS`] times; the best of each.
async fn measure_size(stores: &Stores, size: u64) -> Result<SizeFigures, ObjectBenchError> {
    let mut best = SizeFigures::default();
    for run in 0..RUNS {
        let bytes: Arc<[u8]> = content(size, run).into();
        let started = stopwatch();
        let id = stores.memory.put(bytes.clone(), owner())?;
        best.put_memory = best
            .put_memory
            .max(gbps(size, started.elapsed().as_secs_f64()));
        stores.memory.delete(id)?;

        let started = stopwatch();
        stores.disk.put(bytes.clone(), owner())?;
        best.put_disk = best
            .put_disk
            .max(gbps(size, started.elapsed().as_secs_f64()));
        drop(bytes);

        // Each get maps the file afresh and hashes it: no earlier map is held.
        let started = stopwatch();
        let got = stores.disk.get(id)?;
        best.get_disk = best
            .get_disk
            .max(gbps(size, started.elapsed().as_secs_f64()));
        drop(got);

        for (path, best) in [
            (FetchPath::Quic, &mut best.remote),
            (FetchPath::Tcp, &mut best.remote_tcp),
        ] {
            let started = stopwatch();
            stores.fetch(id, size, path).await?;
            *best = best.max(gbps(size, started.elapsed().as_secs_f64()));
            stores.fetching.delete(id)?;
        }
        stores.disk.delete(id)?;
    }
    Ok(best)
}

/// One loopback TCP stream of `size` bytes received into a new buffer of
/// that size, as any receiver of a new object must (best of [`RUNS`]): the
/// loopback reference receives into one small buffer it reuses, which stays in
/// cache, while a fetch writes every byte to fresh memory.
async fn tcp_into_new_buffer_gbps(size: u64) -> std::io::Result<f64> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let size = usize::try_from(size).map_err(std::io::Error::other)?;
    let mut best: f64 = 0.0;
    for _ in 0..RUNS {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let sender = xp_runtime::task::spawn("bench-tcp-sender", async move {
            let (mut stream, _) = listener.accept().await?;
            let chunk = vec![7u8; 1 << 20];
            let mut sent = 0;
            while sent < size {
                let count = chunk.len().min(size - sent);
                stream.write_all(&chunk[..count]).await?;
                sent += count;
            }
            Ok::<_, std::io::Error>(())
        });
        let started = stopwatch();
        let mut stream = tokio::net::TcpStream::connect(addr).await?;
        let mut buffer = vec![0u8; size];
        stream.read_exact(&mut buffer).await?;
        best = best.max(gbps(size as u64, started.elapsed().as_secs_f64()));
        sender.await.map_err(std::io::Error::other)??;
    }
    Ok(best)
}

/// Saves and restores a one-file checkpoint of `size` bytes; best of three each.
fn checkpoint(dir: &Path, store: &ObjectStore, size: u64) -> Result<(f64, f64), ObjectBenchError> {
    let trial = "3f2a9c0d11b2e4f7-t0".parse().expect("a literal trial id");
    let checkpoint_dir = dir.join("work").join("checkpoint");
    let restored_dir = dir.join("restored");
    let (mut save, mut restore) = (0f64, 0f64);
    for run in 0..RUNS {
        std::fs::create_dir_all(&checkpoint_dir)?;
        std::fs::write(checkpoint_dir.join("state"), content(size, 100 + run))?;
        let started = stopwatch();
        let files = xp_node::take_checkpoint(store, &checkpoint_dir, trial, run as u64)?;
        save = save.max(gbps(size, started.elapsed().as_secs_f64()));
        let _ = std::fs::remove_dir_all(&restored_dir);
        let started = stopwatch();
        xp_node::restore_checkpoint(store, &restored_dir, &files)?;
        restore = restore.max(gbps(size, started.elapsed().as_secs_f64()));
        for file in files {
            store.delete(file.object)?;
        }
    }
    let _ = std::fs::remove_dir_all(&restored_dir);
    Ok((save, restore))
}
