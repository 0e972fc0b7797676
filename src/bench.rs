//! `xp bench trials`: how fast the runtime turns submissions into running workers.
//!
//! Runs no-op command trials on an embedded cluster and reads the head's own event
//! timestamps, so the figures measure the runtime, not the client.
//!
//! [`bench_commits`] holds the head's group commit against one commit per
//! change in the same run: many trials print a metric line every few
//! milliseconds, on a head that stores each change alone (`--commit-batch 1`)
//! and on one that stores what arrives together in one transaction.
//!
//! `fleet` (`xp bench fleet`) soaks a real head with many simulated nodes.
//! The node's own benches sit beside it: `objects` (`xp bench objects`) and
//! `logs` (`xp bench logs`), through `xp_node`'s API and `test-util` helpers.

pub(crate) mod fleet;
pub(crate) mod logs;
pub(crate) mod objects;

use std::collections::BTreeMap;
use std::time::Duration;

use serde_json::json;
use xp_runtime::protocol::{TrialEvent, TrialState};
use xp_runtime::spec::{ExperimentSpec, Resources, SearchSpec, TrialSpec};
use xp_sdk::SubmitOptions;
use xp_tune::stats::quantile;

use crate::{Cluster, ClusterError, LocalOptions};

/// The result of one trials bench.
#[derive(Debug, Clone)]
pub struct TrialsBench {
    /// Trials run.
    pub trials: u32,
    /// Slots (CPU cores) the node offered.
    pub slots: u32,
    /// From submission to the last trial's success, in seconds.
    pub seconds: f64,
    /// Trials finished per second.
    pub trials_per_second: f64,
    /// Submission to all workers running, milliseconds: median and 99th percentile (includes queueing).
    pub submit_to_running_ms: (f64, f64),
    /// Placement to all workers running, milliseconds: median and 99th percentile (the runtime's start cost).
    pub placed_to_running_ms: (f64, f64),
    /// The reference, measured in the same run: the same processes spawned and
    /// reaped directly with `slots` at a time, per second.
    pub direct_spawns_per_second: f64,
}

impl TrialsBench {
    /// The JSON line `xp bench trials --json` prints.
    pub fn to_json(&self) -> serde_json::Value {
        json!({
            "bench": "trials",
            "trials": self.trials,
            "slots": self.slots,
            "seconds": self.seconds,
            "trials_per_second": self.trials_per_second,
            "submit_to_running_p50_ms": self.submit_to_running_ms.0,
            "submit_to_running_p99_ms": self.submit_to_running_ms.1,
            "placed_to_running_p50_ms": self.placed_to_running_ms.0,
            "placed_to_running_p99_ms": self.placed_to_running_ms.1,
            "direct_spawns_per_second": self.direct_spawns_per_second,
            "ratio_to_direct_spawn": self.trials_per_second / self.direct_spawns_per_second,
        })
    }
}

/// Runs `trials` no-op trials on an embedded cluster with `slots` one-core
/// slots, its head keeping its records in `store` (its data directory when
/// `None`).
pub async fn bench_trials(
    trials: u32,
    slots: u32,
    store: Option<xp_head::PostgresTarget>,
) -> Result<TrialsBench, ClusterError> {
    let cluster = Cluster::local_with(LocalOptions {
        cpus: Some(f64::from(slots)),
        gpus: Some(0),
        store,
        ..LocalOptions::default()
    })
    .await?;
    let spec = bench_spec("bench-trials".to_owned(), vec!["true".to_owned()], trials);
    let submitted = cluster
        .submit(
            &spec,
            &SubmitOptions {
                rerun: true,
                ..SubmitOptions::default()
            },
        )
        .await?;
    let mut events = Vec::new();
    let status = cluster
        .wait(submitted.experiment, |event| events.push(event.clone()))
        .await?;
    let submitted_at = status.submitted_at;
    let latencies = Latencies::of(&events, submitted_at);
    let seconds =
        Duration::from_millis(latencies.last_done.saturating_sub(submitted_at)).as_secs_f64();
    let finished = status
        .trials
        .iter()
        .filter(|trial| trial.state == TrialState::Succeeded)
        .count() as u32;
    cluster.shutdown().await;
    let direct_spawns_per_second = direct_spawns(trials, slots).await?;
    Ok(TrialsBench {
        trials: finished,
        slots,
        seconds,
        trials_per_second: f64::from(finished) / seconds.max(1e-9),
        submit_to_running_ms: median_and_p99(&latencies.submit_to_running),
        placed_to_running_ms: median_and_p99(&latencies.placed_to_running),
        direct_spawns_per_second,
    })
}

/// What the head's events say of a bench's trials.
struct Latencies {
    /// Milliseconds from submission to each worker running, sorted.
    submit_to_running: Vec<f64>,
    /// Milliseconds from placement to each worker running, sorted.
    placed_to_running: Vec<f64>,
    /// When the last trial succeeded or failed (the submission's time when none did).
    last_done: u64,
}

impl Latencies {
    fn of(events: &[TrialEvent], submitted_at: u64) -> Self {
        let mut placed_at = BTreeMap::new();
        let mut submit_to_running = Vec::new();
        let mut placed_to_running = Vec::new();
        let mut last_done = submitted_at;
        for event in events {
            match event.state {
                TrialState::Placed => {
                    placed_at.insert(event.trial, event.at);
                }
                TrialState::Running => {
                    submit_to_running.push(event.at.saturating_sub(submitted_at) as f64);
                    if let Some(placed) = placed_at.get(&event.trial) {
                        placed_to_running.push(event.at.saturating_sub(*placed) as f64);
                    }
                }
                TrialState::Succeeded | TrialState::Failed => last_done = last_done.max(event.at),
                _ => {}
            }
        }
        submit_to_running.sort_by(f64::total_cmp);
        placed_to_running.sort_by(f64::total_cmp);
        Self {
            submit_to_running,
            placed_to_running,
            last_done,
        }
    }
}

/// The median and the 99th percentile of sorted `values` (NaN when empty).
fn median_and_p99(values: &[f64]) -> (f64, f64) {
    (
        quantile(values, 0.5).unwrap_or(f64::NAN),
        quantile(values, 0.99).unwrap_or(f64::NAN),
    )
}

/// A bench experiment: `trials` trials of `command`, one CPU core and no GPU
/// each, in team `bench`.
fn bench_spec(name: String, command: Vec<String>, trials: u32) -> ExperimentSpec {
    ExperimentSpec {
        name,
        team: "bench".to_owned(),
        priority: Default::default(),
        queue: None,
        checkpoints: None,
        alerts: Vec::new(),
        code: None,
        data: Vec::new(),
        trial: TrialSpec {
            command: Some(command),
            resources: Resources {
                gpu: 0.0,
                cpu: 1.0,
                memory: Default::default(),
                leases: Default::default(),
                oversubscribe: false,
            },
            ..TrialSpec::default()
        },
        search: SearchSpec {
            trials: Some(trials),
            ..SearchSpec::default()
        },
    }
}

/// Metric reports per second stored by a head committing each change alone,
/// and by one with group commit, measured in the same run.
#[derive(Debug, Clone)]
pub struct CommitBench {
    /// Trials reporting at once.
    pub reporters: u32,
    /// Metric lines each prints.
    pub reports_each: u32,
    /// Milliseconds between two lines of one trial.
    pub every_ms: u32,
    /// Reports per second with one commit (one disk sync) per change.
    pub one_commit_each: f64,
    /// Reports per second with group commit.
    pub group_commit: f64,
}

impl CommitBench {
    /// The JSON line `xp bench trials --json` prints for it.
    pub fn to_json(&self) -> serde_json::Value {
        json!({
            "bench": "commit",
            "reporters": self.reporters,
            "reports_each": self.reports_each,
            "every_ms": self.every_ms,
            "reports_per_second_one_commit_each": self.one_commit_each,
            "reports_per_second_group_commit": self.group_commit,
            "ratio": self.group_commit / self.one_commit_each,
        })
    }
}

/// Runs `reporters` trials at once, each printing `reports_each` metric lines
/// `every_ms` apart, on a head committing each change alone and on one with
/// group commit; reports per second are from submission to the last trial's
/// end, as the head's events say (a trial ends only once its node's exit
/// report, behind its metrics, is stored). `stores` gives each head its
/// PostgreSQL database (one commit each, then group commit), or `None` for
/// their data directories.
pub async fn bench_commits(
    reporters: u32,
    reports_each: u32,
    every_ms: u32,
    stores: Option<[xp_head::PostgresTarget; 2]>,
) -> Result<CommitBench, ClusterError> {
    let [one_store, group_store] = stores.map_or([None, None], |stores| stores.map(Some));
    let one_commit_each = metric_reports(reporters, reports_each, every_ms, 1, one_store).await?;
    let group_commit = metric_reports(
        reporters,
        reports_each,
        every_ms,
        xp_head::DEFAULT_COMMIT_BATCH,
        group_store,
    )
    .await?;
    Ok(CommitBench {
        reporters,
        reports_each,
        every_ms,
        one_commit_each,
        group_commit,
    })
}

/// Stored metric reports per second with `commit_batch`.
async fn metric_reports(
    reporters: u32,
    reports_each: u32,
    every_ms: u32,
    commit_batch: usize,
    store: Option<xp_head::PostgresTarget>,
) -> Result<f64, ClusterError> {
    let cluster = Cluster::local_with(LocalOptions {
        cpus: Some(f64::from(reporters)),
        gpus: Some(0),
        commit_batch: Some(commit_batch),
        store,
        // Only metric reports: telemetry would add its own writes.
        telemetry_interval: Some(Duration::ZERO),
        ..LocalOptions::default()
    })
    .await?;
    // Without a pause the lines come as fast as a shell prints them.
    let pause = if every_ms == 0 {
        String::new()
    } else {
        format!(" sleep {};", f64::from(every_ms) / 1000.0)
    };
    let script = format!(
        "i=0; while [ $i -lt {reports_each} ]; do echo \"XP_METRIC {{\\\"step\\\": $i, \\\"loss\\\": 0.5}}\"; i=$((i+1));{pause} done"
    );
    let spec = bench_spec(
        format!("bench-commit-{commit_batch}"),
        vec!["sh".to_owned(), "-c".to_owned(), script],
        reporters,
    );
    let submitted = cluster
        .submit(
            &spec,
            &SubmitOptions {
                rerun: true,
                ..SubmitOptions::default()
            },
        )
        .await?;
    let mut last_done = 0;
    let status = cluster
        .wait(submitted.experiment, |event| {
            if event.state.is_terminal() {
                last_done = last_done.max(event.at);
            }
        })
        .await?;
    let succeeded = status
        .trials
        .iter()
        .filter(|trial| trial.state == TrialState::Succeeded)
        .count() as u32;
    cluster.shutdown().await;
    let seconds =
        Duration::from_millis(last_done.saturating_sub(status.submitted_at)).as_secs_f64();
    Ok(f64::from(succeeded) * f64::from(reports_each) / seconds.max(1e-9))
}

/// Spawns and reaps `count` `true` processes, `parallel` at a time, with no runtime
/// in between: the ceiling the trial rate is held against.
async fn direct_spawns(count: u32, parallel: u32) -> Result<f64, std::io::Error> {
    let started = tokio::time::Instant::now();
    let mut running = tokio::task::JoinSet::new();
    for _ in 0..count {
        if running.len() >= parallel as usize
            && let Some(done) = running.join_next().await
        {
            done.map_err(std::io::Error::other)??;
        }
        running.spawn(async { tokio::process::Command::new("true").status().await });
    }
    while let Some(done) = running.join_next().await {
        done.map_err(std::io::Error::other)??;
    }
    Ok(f64::from(count) / started.elapsed().as_secs_f64())
}
