//! Measures all-reduce over a local ring, and the ceilings it should be held
//! against on the same machine in the same run: one QUIC connection's throughput
//! with the same TLS and transport settings, one loopback TCP stream, and a
//! single-threaded memory copy.
//!
//! Bandwidths follow the NCCL convention: algorithm bandwidth is the buffer size
//! over the time, bus bandwidth is that times 2(W−1)/W, which is what each rank's
//! links carry and so compares with point-to-point throughput. GB/s is 1e9 bytes/s.
//!
//! It reads the wall clock (that is its job) and is meant for `benches/allreduce.rs`
//! and `xp bench allreduce`, not for production code paths.

use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};

use super::quic;
use super::ring::{Algorithm, Schedule};
use super::{
    CollectiveConfig, CollectiveError, Communicator, ReduceOp, TransportKind, local_ring_with,
};
use crate::transport::{self, SelfSignedIdentity};

/// One all-reduce size measured on one ring.
#[derive(Debug, Clone, PartialEq)]
pub struct AllReduceMeasurement {
    /// Buffer size in bytes (f32 elements).
    pub size_bytes: usize,
    /// Ranks in the ring.
    pub workers: u32,
    /// The links.
    pub transport: TransportKind,
    /// The algorithm the size selected.
    pub algorithm: Algorithm,
    /// Timed iterations per trial.
    pub iterations: u32,
    /// Mean seconds per all-reduce in the fastest of three trials, from a common
    /// start to the last rank's end.
    pub time_s: f64,
    /// Algorithm bandwidth, GB/s.
    pub algbw_gbps: f64,
    /// Bus bandwidth, GB/s.
    pub busbw_gbps: f64,
    /// The process's CPU time over the wall time of the timed iterations (all ranks
    /// run in this process), or 0 where `/proc` is not available: shows when a run
    /// is bound by the machine's cores.
    pub cpu_cores: f64,
}

/// What the machine can do at best, measured in the same run.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Ceilings {
    /// One QUIC connection, one stream, one direction, with the collective's TLS and
    /// transport settings, GB/s.
    pub quic_p2p_gbps: f64,
    /// CPU cores that QUIC transfer kept busy (sender and receiver together).
    pub quic_p2p_cpu_cores: f64,
    /// The same with quinn's default transport settings and the control plane's
    /// endpoint (`transport::bind_endpoint`), for comparison, GB/s.
    pub quic_p2p_default_gbps: f64,
    /// One loopback TCP stream, GB/s.
    pub tcp_loopback_gbps: f64,
    /// A single-threaded copy between two large buffers, GB/s of bytes copied.
    pub memcpy_gbps: f64,
}

/// The start of a wall-clock measurement (benches measure wall time).
#[expect(clippy::disallowed_methods, reason = "a bench measures wall time")]
pub fn stopwatch() -> std::time::Instant {
    std::time::Instant::now()
}

/// The CPU seconds this process has used, from `/proc/self/stat` (0 elsewhere).
fn process_cpu_seconds() -> f64 {
    let Ok(stat) = std::fs::read_to_string("/proc/self/stat") else {
        return 0.0;
    };
    // Fields after the parenthesised command name; utime and stime are the 12th
    // and 13th of them, in clock ticks (100 per second on Linux).
    let after_name = stat.rsplit(')').next().unwrap_or_default();
    let fields: Vec<&str> = after_name.split_whitespace().collect();
    let ticks = |index: usize| {
        fields
            .get(index)
            .and_then(|field| field.parse::<f64>().ok())
            .unwrap_or(0.0)
    };
    (ticks(11) + ticks(12)) / 100.0
}

fn gbps(bytes: usize, seconds: f64) -> f64 {
    bytes as f64 / seconds.max(1e-12) / 1e9
}

/// How many timed iterations a trial of a size gets: about 512 MiB moved, between
/// 3 and 1000.
fn iterations_for(size_bytes: usize) -> u32 {
    u32::try_from(((512usize << 20) / size_bytes.max(1)).clamp(3, 1000)).expect("clamped")
}

/// Timed trials per size; the fastest counts, so that a burst of load from other
/// processes on a shared machine does not decide the result.
const TRIALS: u32 = 3;

/// Measures `sizes` (bytes, as f32 buffers) on a `workers`-rank ring of `kind`
/// links with the default configuration.
pub async fn bench_allreduce(
    workers: u32,
    sizes: &[usize],
    kind: TransportKind,
) -> Result<Vec<AllReduceMeasurement>, CollectiveError> {
    bench_allreduce_with(workers, sizes, kind, CollectiveConfig::default()).await
}

/// As [`bench_allreduce`], with `config`.
pub async fn bench_allreduce_with(
    workers: u32,
    sizes: &[usize],
    kind: TransportKind,
    config: CollectiveConfig,
) -> Result<Vec<AllReduceMeasurement>, CollectiveError> {
    // The ranks share this machine: measure the transport named, not shared memory.
    let config = CollectiveConfig {
        same_host_shm: kind == TransportKind::Shm,
        ..config
    };
    let mut communicators = local_ring_with(workers, kind, config.clone()).await?;
    let mut measurements = Vec::new();
    for &size_bytes in sizes {
        measurements.push(measure_size(&mut communicators, size_bytes, kind, &config).await?);
    }
    Ok(measurements)
}

/// One buffer size on the ring: [`TRIALS`] timed runs (the first after a longer
/// warm-up), of which the fastest counts.
async fn measure_size(
    communicators: &mut Vec<Communicator>,
    size_bytes: usize,
    kind: TransportKind,
    config: &CollectiveConfig,
) -> Result<AllReduceMeasurement, CollectiveError> {
    let workers = u32::try_from(communicators.len()).expect("a ring's size fits its ranks' type");
    let len = size_bytes / 4;
    let iterations = iterations_for(size_bytes);
    let warmup = (iterations / 10).clamp(2, 50);
    let mut best: Option<(Duration, f64)> = None;
    let mut buffers: Vec<Vec<f32>> = (0..workers).map(|_| vec![1.0f32; len]).collect();
    for trial in 0..TRIALS {
        let warmup = if trial == 0 { warmup } else { 1 };
        let (slowest, cpu_cores) =
            timed_run(communicators, &mut buffers, warmup, iterations).await?;
        if best.is_none_or(|(fastest, _)| slowest < fastest) {
            best = Some((slowest, cpu_cores));
        }
    }
    let (fastest, cpu_cores) = best.expect("at least one trial");
    let time_s = fastest.as_secs_f64() / f64::from(iterations);
    let algbw_gbps = gbps(size_bytes, time_s);
    let factor = 2.0 * f64::from(workers - 1) / f64::from(workers);
    let algorithm = Schedule::all_reduce(
        0,
        workers,
        len,
        4,
        config.small_buffer_bytes,
        &config.segmenting,
    )
    .algorithm;
    Ok(AllReduceMeasurement {
        size_bytes,
        workers,
        transport: kind,
        algorithm,
        iterations,
        time_s,
        algbw_gbps,
        busbw_gbps: algbw_gbps * factor,
        cpu_cores,
    })
}

/// Every rank runs `warmup` all-reduces, then all start together on `iterations`
/// timed ones; returns the slowest rank's time and the CPU cores the process
/// used meanwhile. The communicators and buffers come back in rank order.
async fn timed_run(
    communicators: &mut Vec<Communicator>,
    buffers: &mut Vec<Vec<f32>>,
    warmup: u32,
    iterations: u32,
) -> Result<(Duration, f64), CollectiveError> {
    let start = Arc::new(tokio::sync::Barrier::new(communicators.len()));
    let tasks: Vec<_> = communicators
        .drain(..)
        .zip(buffers.drain(..))
        .map(|(mut communicator, mut buffer)| {
            let start = start.clone();
            crate::task::spawn("bench-allreduce-rank", async move {
                // Sums of ones grow to infinity, never into slow subnormals.
                for _ in 0..warmup {
                    communicator.all_reduce(&mut buffer, ReduceOp::Sum).await?;
                }
                start.wait().await;
                let cpu_at_start = process_cpu_seconds();
                let started = stopwatch();
                for _ in 0..iterations {
                    communicator.all_reduce(&mut buffer, ReduceOp::Sum).await?;
                }
                let elapsed = started.elapsed();
                Ok::<_, CollectiveError>((communicator, buffer, elapsed, cpu_at_start))
            })
        })
        .collect();
    let mut slowest = Duration::ZERO;
    let mut cpu_at_start = f64::MAX;
    for (rank, task) in tasks.into_iter().enumerate() {
        let (communicator, buffer, elapsed, cpu) = task
            .await
            .map_err(|_| CollectiveError::Shutdown { rank: rank as u32 })??;
        slowest = slowest.max(elapsed);
        cpu_at_start = cpu_at_start.min(cpu);
        communicators.push(communicator);
        buffers.push(buffer);
    }
    let cpu_cores =
        (process_cpu_seconds() - cpu_at_start).max(0.0) / slowest.as_secs_f64().max(1e-9);
    Ok((slowest, cpu_cores))
}

/// Measures every ceiling, moving `bytes` through each network path.
pub async fn ceilings(
    bytes: usize,
    config: &CollectiveConfig,
) -> Result<Ceilings, CollectiveError> {
    let tcp_loopback_gbps = tcp_loopback_gbps(bytes).await?;
    let tuned = quic_transfer(bytes, config, true).await?;
    let default = quic_transfer(bytes, config, false).await?;
    let memcpy_gbps = memcpy_gbps(64 << 20);
    Ok(Ceilings {
        quic_p2p_gbps: tuned.gbps,
        quic_p2p_cpu_cores: tuned.cpu_cores,
        quic_p2p_default_gbps: default.gbps,
        tcp_loopback_gbps,
        memcpy_gbps,
    })
}

const CHUNK_BYTES: usize = 1 << 20;

/// One loopback TCP stream, 1 MiB writes and reads, best of three runs.
pub async fn tcp_loopback_gbps(bytes: usize) -> Result<f64, CollectiveError> {
    let io_error = |source| CollectiveError::PeerIo { rank: 0, source };
    let mut best: f64 = 0.0;
    for _ in 0..3 {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .map_err(io_error)?;
        let addr = listener.local_addr().map_err(io_error)?;
        let reader = crate::task::spawn("bench-tcp-reader", async move {
            let (mut stream, _) = listener.accept().await?;
            let mut buffer = vec![0u8; CHUNK_BYTES];
            let mut total = 0;
            while total < bytes {
                let count = stream.read(&mut buffer).await?;
                if count == 0 {
                    break;
                }
                total += count;
            }
            Ok::<_, std::io::Error>(stopwatch())
        });
        let mut stream = tokio::net::TcpStream::connect(addr)
            .await
            .map_err(io_error)?;
        stream.set_nodelay(true).map_err(io_error)?;
        let chunk = vec![7u8; CHUNK_BYTES];
        let started = stopwatch();
        let mut sent = 0;
        while sent < bytes {
            let count = CHUNK_BYTES.min(bytes - sent);
            stream.write_all(&chunk[..count]).await.map_err(io_error)?;
            sent += count;
        }
        let finished = reader
            .await
            .map_err(|_| CollectiveError::Shutdown { rank: 0 })?
            .map_err(io_error)?;
        best = best.max(gbps(bytes, (finished - started).as_secs_f64()));
    }
    Ok(best)
}

/// One QUIC connection and stream between two endpoints on 127.0.0.1 with the
/// collective's TLS and transport settings, best of three runs.
pub async fn quic_p2p_gbps(
    bytes: usize,
    config: &CollectiveConfig,
) -> Result<f64, CollectiveError> {
    Ok(quic_transfer(bytes, config, true).await?.gbps)
}

struct Transfer {
    gbps: f64,
    cpu_cores: f64,
}

/// Moves `bytes` over one QUIC stream, best of three runs: with the collective's
/// endpoint and transport settings when `tuned`, else with the control plane's
/// endpoint and quinn's defaults; the TLS settings are the collective's either way.
async fn quic_transfer(
    bytes: usize,
    config: &CollectiveConfig,
    tuned: bool,
) -> Result<Transfer, CollectiveError> {
    let pair = QuicPair::bind(config, tuned)?;
    let mut best = Transfer {
        gbps: 0.0,
        cpu_cores: 0.0,
    };
    for _ in 0..3 {
        let transfer = pair.transfer(bytes, config).await?;
        if transfer.gbps > best.gbps {
            best = transfer;
        }
    }
    Ok(best)
}

/// A server and a client endpoint on 127.0.0.1, and how the client reaches the server.
struct QuicPair {
    server: quinn::Endpoint,
    client: quinn::Endpoint,
    client_config: quinn::ClientConfig,
    server_addr: std::net::SocketAddr,
    tuned: bool,
}

impl QuicPair {
    /// Binds both endpoints: the collective's when `tuned`, else the control plane's.
    fn bind(config: &CollectiveConfig, tuned: bool) -> Result<Self, CollectiveError> {
        let setup = |source| CollectiveError::Listener { rank: 0, source };
        let loopback = std::net::SocketAddr::from(([127, 0, 0, 1], 0));
        let identity = SelfSignedIdentity::generate().map_err(setup)?;
        let (server_transport, client_transport) = if tuned {
            (
                transport::bulk_transport_config(&config.quic, config.timeout, false),
                transport::bulk_transport_config(&config.quic, config.timeout, true),
            )
        } else {
            (Arc::default(), Arc::default())
        };
        let server_config = identity
            .server_config(server_transport, quic::ALPN)
            .map_err(setup)?;
        let client_config =
            transport::bulk_client_config(identity.sha256, client_transport, quic::ALPN)
                .map_err(setup)?;
        let control_plane = |error: transport::TransportError| CollectiveError::Quic {
            rank: 0,
            reason: error.to_string(),
        };
        let (server, client) = if tuned {
            (
                transport::bind_bulk_endpoint(loopback, Some(server_config)).map_err(setup)?,
                transport::bind_bulk_endpoint(loopback, None).map_err(setup)?,
            )
        } else {
            (
                transport::bind_endpoint(loopback, Some(server_config)).map_err(control_plane)?,
                transport::bind_endpoint(loopback, None).map_err(control_plane)?,
            )
        };
        let server_addr = server
            .local_addr()
            .map_err(|source| CollectiveError::PeerIo { rank: 1, source })?;
        Ok(Self {
            server,
            client,
            client_config,
            server_addr,
            tuned,
        })
    }

    /// Moves `bytes` from the client to the server over a new connection.
    async fn transfer(
        &self,
        bytes: usize,
        config: &CollectiveConfig,
    ) -> Result<Transfer, CollectiveError> {
        let quic_error = |reason: String| CollectiveError::Quic { rank: 1, reason };
        let window = self.tuned.then_some(config.quic.same_host_window_bytes);
        let reader = receive(self.server.clone(), bytes, window);
        let connection = self
            .client
            .connect_with(
                self.client_config.clone(),
                self.server_addr,
                transport::SELF_SIGNED_SERVER_NAME,
            )
            .map_err(|error| quic_error(error.to_string()))?
            .await
            .map_err(|error| quic_error(error.to_string()))?;
        // As `connect_ring` does: let MTU discovery finish on the idle connection.
        transport::settle_mtu(&connection, config.quic.mtu_settle).await;
        let (mut send, _recv) = connection
            .open_bi()
            .await
            .map_err(|error| quic_error(error.to_string()))?;
        // Written in the pieces the collective's links use.
        let chunk = vec![7u8; quic::MAX_WRITE_BYTES];
        let cpu_at_start = process_cpu_seconds();
        let started = stopwatch();
        let mut sent = 0;
        while sent < bytes {
            let count = quic::MAX_WRITE_BYTES.min(bytes - sent);
            send.write_all(&chunk[..count])
                .await
                .map_err(|error| quic_error(error.to_string()))?;
            sent += count;
        }
        let finished = reader
            .await
            .map_err(|_| CollectiveError::Shutdown { rank: 1 })?
            .map_err(|reason| quic_error(reason.to_owned()))?;
        let seconds = (finished - started).as_secs_f64();
        let transfer = Transfer {
            gbps: gbps(bytes, seconds),
            cpu_cores: (process_cpu_seconds() - cpu_at_start) / seconds.max(1e-9),
        };
        connection.close(0u32.into(), b"done");
        Ok(transfer)
    }
}

/// Accepts one connection on `server` and reads `bytes` from its first stream
/// (with a receive window of `window` bytes, when given); returns when it was done.
fn receive(
    server: quinn::Endpoint,
    bytes: usize,
    window: Option<u64>,
) -> tokio::task::JoinHandle<Result<std::time::Instant, &'static str>> {
    crate::task::spawn("bench-quic-reader", async move {
        let incoming = server.accept().await.ok_or("endpoint closed")?;
        let connection = incoming.await.map_err(|_| "handshake failed")?;
        if let Some(window) = window {
            connection
                .set_receive_window(quinn::VarInt::from_u64(window).unwrap_or(quinn::VarInt::MAX));
        }
        let (_send, mut recv) = connection.accept_bi().await.map_err(|_| "no stream")?;
        let mut buffer = vec![0u8; CHUNK_BYTES];
        let mut total = 0;
        while total < bytes {
            match recv.read(&mut buffer).await.map_err(|_| "read failed")? {
                Some(count) => total += count,
                None => break,
            }
        }
        let finished = stopwatch();
        connection.close(0u32.into(), b"done");
        Ok(finished)
    })
}

/// A single-threaded copy of `bytes` between two buffers, best of five.
pub fn memcpy_gbps(bytes: usize) -> f64 {
    let source = vec![1u8; bytes];
    let mut target = vec![2u8; bytes];
    let mut best: f64 = 0.0;
    for _ in 0..5 {
        let started = stopwatch();
        target.copy_from_slice(std::hint::black_box(&source));
        std::hint::black_box(&mut target);
        best = best.max(gbps(bytes, started.elapsed().as_secs_f64()));
    }
    best
}
