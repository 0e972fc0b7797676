//! A simulated node's worker: no process, only the reports a real worker's
//! node would make, paced by the clock.

use std::time::Duration;

use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use xp_runtime::ids::{ObjectId, TrialId};
use xp_runtime::protocol::{CheckpointFile, Launch, WorkerReport};

/// The size a simulated checkpoint's one object claims.
pub(super) const OBJECT_BYTES: u64 = 1 << 20;

/// What every worker of a simulated node does.
#[derive(Debug, Clone, Copy)]
pub struct FakeWork {
    /// Steps to the end (a resumed attempt starts at its checkpoint's step).
    pub steps: u32,
    /// Time per step; each step reports one metric.
    pub step_time: Duration,
    /// Rank 0 checkpoints every this many steps (0: never).
    pub checkpoint_every: u32,
}

/// What a worker hands its node.
#[derive(Debug)]
pub(super) enum Output {
    /// A report for the head.
    Report(WorkerReport),
    /// An object the worker's checkpoint put in the node's store, owned by the trial.
    Object(ObjectId, TrialId),
}

/// Runs one worker: started, a metric per step, checkpoints, exit 0; `stop`
/// ends it with a stop report instead. A worker whose node died says nothing
/// more (its output channel is gone).
pub(super) async fn run(
    launch: Launch,
    work: FakeWork,
    outputs: mpsc::UnboundedSender<Output>,
    stop: CancellationToken,
) {
    let key = launch.key;
    let send = |output: Output| outputs.send(output).is_ok();
    if !send(Output::Report(WorkerReport::Started { key, pid: 0 })) {
        return;
    }
    let first = launch.resume.as_ref().map_or(0, |resume| resume.step);
    for step in first..u64::from(work.steps) {
        tokio::select! {
            () = stop.cancelled() => {
                let reason = "stopped by the simulated node".to_owned();
                send(Output::Report(WorkerReport::Stopped { key, reason }));
                return;
            }
            () = tokio::time::sleep(work.step_time) => {}
        }
        let metric = WorkerReport::Metric {
            key,
            index: step,
            step: Some(step),
            values: vec![("loss".to_owned(), 1.0 / (step as f64 + 1.0))],
        };
        if !send(Output::Report(metric)) {
            return;
        }
        let done = step + 1;
        let every = u64::from(work.checkpoint_every);
        if key.rank == 0 && every > 0 && done % every == 0 && done < u64::from(work.steps) {
            let object = ObjectId::of(format!("{key} step {done}").as_bytes());
            let checkpoint = WorkerReport::Checkpoint {
                key,
                step: done,
                files: vec![CheckpointFile {
                    name: "state".to_owned(),
                    object,
                    size: OBJECT_BYTES,
                }],
                backup: None,
                take_ms: 1,
            };
            if !send(Output::Object(object, key.trial)) || !send(Output::Report(checkpoint)) {
                return;
            }
        }
    }
    send(Output::Report(WorkerReport::Exited {
        key,
        code: Some(0),
        signal: None,
    }));
}
