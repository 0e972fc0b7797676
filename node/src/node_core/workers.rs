//! The live workers: which launches start, which workers are asked to stop,
//! and what happens when one's end is reported.
//!
//! A launch starts unless its worker already runs (a duplicate), the node is
//! draining, its oversubscription factor is outside what any policy may set,
//! or its GPU shares are taken (a worker the head already gave up is still
//! stopping: not the trial's fault, so it is refused and placed again). Every
//! report is numbered in the outbox and sent while a session is open; a final
//! report forgets its worker and frees its shares.
//!
//! Evictions come from the telemetry sampler's eviction watch
//! (`telemetry::eviction`): the node stops each chosen worker through its
//! checkpoint on its own rather than asking the head (memory runs out in
//! seconds, and a head that is away must not let a GPU's workers fail), also
//! between sessions; the worker's end is reported `WorkerReport::Evicted`, so
//! the head requeues its trial without using a retry.

use std::time::{Duration, Instant};

use tracing::{debug, warn};
use xp_runtime::clock::UnixMillis;
use xp_runtime::ids::{TrialId, WorkerKey};
use xp_runtime::protocol::{AT_RECEIPT, Launch, NodeMessage, WorkerReport};
use xp_runtime::spec::MAX_OVERSUBSCRIPTION_MILLI;

use super::{Action, NodeCore, Phase, Worker};
use crate::outbox::is_final;
use crate::telemetry::eviction::Eviction;
use crate::worker::{MAX_KILL_GRACE, StopRequest};

/// Why a launch does not start, when it does not.
fn refusal(core: &mut NodeCore, launch: &Launch) -> Option<WorkerReport> {
    let key = launch.key;
    if core.drain.is_some() {
        return Some(WorkerReport::Refused {
            key,
            reason: "the node is shutting down".to_owned(),
        });
    }
    // The factor the policy placed this worker under; 0 reads as none.
    let factor_milli = match launch.oversubscription_milli {
        0 => 1000,
        factor => factor,
    };
    if !(1000..=MAX_OVERSUBSCRIPTION_MILLI).contains(&u64::from(factor_milli)) {
        let error = format!(
            "the launch's oversubscription factor {factor_milli}/1000 is outside 1000..={MAX_OVERSUBSCRIPTION_MILLI}"
        );
        warn!(worker = %key, %error, "launch refused");
        return Some(WorkerReport::LaunchFailed { key, error });
    }
    if factor_milli > 1000 && !core.config.memory_watched {
        warn!(
            worker = %key,
            "an oversubscribed worker starts with telemetry off: its GPU's memory is not watched, so none will be evicted before it runs out"
        );
    }
    let claimed =
        core.slots
            .claim_oversubscribed(key, &launch.gpu_indices, launch.gpu_milli, factor_milli);
    if let Err(busy) = claimed {
        // A worker the head already gave up is still stopping: not the trial's fault.
        warn!(worker = %key, %busy, "launch refused");
        return Some(WorkerReport::Refused {
            key,
            reason: busy.to_string(),
        });
    }
    None
}

impl NodeCore {
    /// The head's launch: start its worker, or report why not.
    pub(super) fn handle_launch(&mut self, launch: Launch) {
        let key = launch.key;
        if self.workers.contains_key(&key) {
            debug!(worker = %key, "duplicate launch ignored");
            return;
        }
        match refusal(self, &launch) {
            Some(report) => self.record_and_send(AT_RECEIPT, report),
            None => {
                self.workers.insert(key, Worker { stopping: false });
                self.actions.push_back(Action::Start(Box::new(launch)));
            }
        }
    }

    /// The head's kill of `trial`'s attempt `attempt`: its workers here stop
    /// with the head's grace (time to checkpoint when preempted), bounded by
    /// [`MAX_KILL_GRACE`] so a bad value cannot keep a GPU busy for hours.
    pub(super) fn handle_kill(
        &mut self,
        trial: TrialId,
        attempt: u32,
        reason: &str,
        grace_ms: u64,
    ) {
        let grace = Duration::from_millis(grace_ms).min(MAX_KILL_GRACE);
        for (key, worker) in &mut self.workers {
            if key.trial == trial && key.attempt == attempt && !worker.stopping {
                worker.stopping = true;
                self.actions.push_back(Action::Stop {
                    key: *key,
                    request: StopRequest::with_grace(reason, grace),
                });
            }
        }
    }

    /// The eviction watch chose a worker: it stops through its checkpoint,
    /// unless it is already stopping (the head's kill, a drain) or gone.
    pub(crate) fn handle_eviction(&mut self, eviction: Eviction) {
        let Some(worker) = self.workers.get_mut(&eviction.key) else {
            debug!(worker = %eviction.key, "eviction for a worker already gone");
            return;
        };
        if worker.stopping {
            debug!(worker = %eviction.key, "eviction for a worker already stopping");
            return;
        }
        worker.stopping = true;
        warn!(
            worker = %eviction.key,
            gpu = eviction.gpu.index,
            used_bytes = eviction.gpu.used_bytes,
            total_bytes = eviction.gpu.total_bytes,
            percent = format!("{:.1}", eviction.percent()),
            "GPU memory running short: evicting the youngest oversubscribed worker through its checkpoint"
        );
        self.actions.push_back(Action::Stop {
            key: eviction.key,
            request: StopRequest::evict(eviction),
        });
    }

    /// A worker's report: numbered, kept until the head acknowledges it, and
    /// sent now if a session is open.
    /// `at` is the wall-clock time it was made, which the head keeps.
    pub(crate) fn handle_report(&mut self, now: Instant, at: UnixMillis, report: WorkerReport) {
        self.record_and_send(at, report);
        self.check_drained(now);
    }

    /// Numbers `report` (forgetting its worker if it is the last) and sends it
    /// on the session, if one is open.
    fn record_and_send(&mut self, at: UnixMillis, report: WorkerReport) {
        if is_final(&report) {
            let key = report.key();
            self.forget(key);
        }
        let seq = self.outbox.push(at, report.clone());
        if matches!(self.phase, Phase::Session(_)) {
            self.actions
                .push_back(Action::Send(NodeMessage::Report { seq, at, report }));
        }
    }

    /// A worker has ended: its shares are free and the agent forgets it (a
    /// launch refused before it started left nothing to forget).
    fn forget(&mut self, key: WorkerKey) {
        if self.workers.remove(&key).is_some() {
            self.slots.release(key);
            self.actions.push_back(Action::Forget(key));
        }
    }
}
