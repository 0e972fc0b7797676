//! `xp bench logs`: how fast a worker's output reaches its log through the
//! node's real path, held against copying the same bytes without the node in
//! the same run.
//!
//! The same generated output (text lines with a metric line every
//! [`xp_node::METRIC_EVERY`] lines) is printed by `cat` three ways: as a worker through
//! the node's worker path (`xp_node::run_command_worker`: pipes, pumps, metric
//! parsing, the capped writer), as `cat FILE > OUT` (the kernel copying into a
//! file: the ceiling), and as `cat FILE | cat > OUT` (one pipe hop and a plain
//! copy: what any capture costs). Each is timed whole, from spawn to exit with
//! everything written; best of three. The worker's metric reports are counted,
//! and its log's files are summed to show the cap held.
//!
//! Not a test: it asserts nothing about the figures, and is run only by
//! `xp bench logs`, never by `cargo test`.

use std::path::Path;
use std::sync::Arc;

use xp_node::{LogCap, ObjectStore, StoreError, StoreLimits};
use xp_runtime::collective::bench::stopwatch;
use xp_runtime::ids::{ExperimentId, TrialId, WorkerKey};
use xp_runtime::protocol::WorkerReport;

/// How many times each way is run; the best counts.
const RUNS: u32 = 3;

/// Why the bench could not finish.
#[derive(Debug, thiserror::Error)]
pub enum LogBenchError {
    /// A file or process of the bench could not be used.
    #[error("{what}")]
    Io {
        /// What was being done.
        what: String,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// The worker's object store (its checkpoint sink) could not open.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// The worker did not exit cleanly.
    #[error("the worker ended with {report}")]
    Worker {
        /// Its final report.
        report: String,
    },
    /// A reference copy failed.
    #[error("`{command}` failed")]
    Reference {
        /// The shell command.
        command: String,
    },
}

/// What the bench measured.
#[derive(Debug, Clone, PartialEq)]
pub struct LogBench {
    /// Bytes of output per run.
    pub bytes: u64,
    /// The log cap the worker ran under.
    pub cap: u64,
    /// Metric lines in the output.
    pub metric_lines: u64,
    /// Metric reports the node sent for them (best run's).
    pub metrics_reported: u64,
    /// The best run through the node, in seconds.
    pub node_seconds: f64,
    /// The best `cat FILE > OUT`, in seconds.
    pub direct_seconds: f64,
    /// The best `cat FILE | cat > OUT`, in seconds.
    pub piped_seconds: f64,
    /// What the worker's log kept on disk, all files together.
    pub kept_bytes: u64,
}

impl LogBench {
    /// Megabytes (10^6 bytes) per second in `seconds`.
    pub fn mbps(&self, seconds: f64) -> f64 {
        self.bytes as f64 / seconds / 1e6
    }
}

/// Runs the bench in `dir` with `bytes` of output and the log cap `cap`.
pub async fn bench_logs(dir: &Path, bytes: u64, cap: LogCap) -> Result<LogBench, LogBenchError> {
    let input = dir.join("output.txt");
    let metric_lines = {
        let input = input.clone();
        tokio::task::spawn_blocking(move || xp_node::generate_output(&input, bytes))
            .await
            .map_err(|error| io("generating the output", error.into()))?
            .map_err(|error| io("generating the output", error))?
    };
    let store = Arc::new(ObjectStore::open(
        dir.join("objects"),
        StoreLimits::default(),
    )?);
    let mut best = LogBench {
        bytes,
        cap: cap.bytes(),
        metric_lines,
        metrics_reported: 0,
        node_seconds: f64::MAX,
        direct_seconds: f64::MAX,
        piped_seconds: f64::MAX,
        kept_bytes: 0,
    };
    for run in 0..RUNS {
        let out = dir.join(format!("direct-{run}.out"));
        let command = format!("cat '{}' > '{}'", input.display(), out.display());
        best.direct_seconds = best.direct_seconds.min(shell(&command).await?);
        remove(&out).await;
        let command = format!("cat '{}' | cat > '{}'", input.display(), out.display());
        best.piped_seconds = best.piped_seconds.min(shell(&command).await?);
        remove(&out).await;
        let run_dir = dir.join(format!("node-{run}"));
        let (seconds, metrics, kept) = through_node(&run_dir, run, &input, cap, &store).await?;
        if seconds < best.node_seconds {
            best.node_seconds = seconds;
            best.metrics_reported = metrics;
            best.kept_bytes = kept;
        }
        let _ = tokio::fs::remove_dir_all(&run_dir).await;
    }
    Ok(best)
}

/// Runs `cat input` as a worker; returns its time, its metric reports and what
/// its log kept on disk.
async fn through_node(
    dir: &Path,
    run: u32,
    input: &Path,
    cap: LogCap,
    store: &Arc<ObjectStore>,
) -> Result<(f64, u64, u64), LogBenchError> {
    let key = WorkerKey {
        trial: TrialId {
            experiment: ExperimentId::from_content_hash(&[0; 32], 1),
            index: run,
        },
        attempt: 1,
        rank: 0,
    };
    let argv = vec!["cat".to_owned(), input.display().to_string()];
    let log_path = dir.join("rank0.log");
    let started = stopwatch();
    let mut reports_rx =
        xp_node::run_command_worker(dir, key, argv, log_path.clone(), store.clone(), cap).await;
    let seconds = started.elapsed().as_secs_f64();
    let mut metrics = 0;
    while let Some(report) = reports_rx.recv().await {
        match report {
            WorkerReport::Metric { .. } => metrics += 1,
            WorkerReport::Started { .. } => {}
            WorkerReport::Exited {
                code: Some(0),
                signal: None,
                ..
            } => {}
            other => {
                return Err(LogBenchError::Worker {
                    report: format!("{other:?}"),
                });
            }
        }
    }
    let kept = xp_node::log_files(&log_path)
        .iter()
        .map(|(_, len)| len)
        .sum();
    Ok((seconds, metrics, kept))
}

/// Runs `command` with `sh -c`; returns its time.
async fn shell(command: &str) -> Result<f64, LogBenchError> {
    let started = stopwatch();
    let status = tokio::process::Command::new("sh")
        .args(["-c", command])
        .status()
        .await
        .map_err(|error| io("starting sh", error))?;
    let seconds = started.elapsed().as_secs_f64();
    if !status.success() {
        return Err(LogBenchError::Reference {
            command: command.to_owned(),
        });
    }
    Ok(seconds)
}

async fn remove(path: &Path) {
    let _ = tokio::fs::remove_file(path).await;
}

fn io(what: &str, source: std::io::Error) -> LogBenchError {
    LogBenchError::Io {
        what: what.to_owned(),
        source,
    }
}
