//! `xp bench trials`: how fast the runtime turns submissions into running workers.
//!
//! Runs no-op command trials on an embedded cluster and reads the head's own event
//! timestamps, so the figures measure the runtime, not the client.

use std::collections::BTreeMap;
use std::time::Duration;

use serde_json::json;
use xp_runtime::protocol::TrialState;
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

/// Runs `trials` no-op trials on an embedded cluster with `slots` one-core slots.
pub async fn trials(trials: u32, slots: u32) -> Result<TrialsBench, ClusterError> {
    let cluster = Cluster::local_with(LocalOptions {
        cpus: Some(f64::from(slots)),
        gpus: Some(0),
        ..LocalOptions::default()
    })
    .await?;
    let spec = ExperimentSpec {
        name: "bench-trials".to_owned(),
        team: "bench".to_owned(),
        priority: Default::default(),
        queue: None,
        checkpoints: None,
        code: None,
        data: Vec::new(),
        trial: TrialSpec {
            command: Some(vec!["true".to_owned()]),
            resources: Resources {
                gpu: 0.0,
                cpu: 1.0,
                memory: Default::default(),
            },
            ..TrialSpec::default()
        },
        search: SearchSpec {
            trials: Some(trials),
            ..SearchSpec::default()
        },
    };
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
    let mut placed_at = BTreeMap::new();
    let mut submit_to_running = Vec::new();
    let mut placed_to_running = Vec::new();
    let mut last_done = submitted_at;
    for event in &events {
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
    let seconds = Duration::from_millis(last_done.saturating_sub(submitted_at)).as_secs_f64();
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
        submit_to_running_ms: (
            quantile(&submit_to_running, 0.5).unwrap_or(f64::NAN),
            quantile(&submit_to_running, 0.99).unwrap_or(f64::NAN),
        ),
        placed_to_running_ms: (
            quantile(&placed_to_running, 0.5).unwrap_or(f64::NAN),
            quantile(&placed_to_running, 0.99).unwrap_or(f64::NAN),
        ),
        direct_spawns_per_second,
    })
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
