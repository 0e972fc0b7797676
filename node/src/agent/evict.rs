//! The agent's part of evicting oversubscribed workers for GPU memory: the
//! telemetry sampler's eviction watch (`telemetry::eviction`) chooses, the
//! agent stops each chosen worker through its checkpoint (SIGTERM, then
//! `worker::EVICTION_GRACE` to save it), the way a head-ordered preemption
//! stops one, and the worker's end is reported `WorkerReport::Evicted`, so the
//! head requeues its trial without using a retry.
//!
//! The node acts on its own rather than asking the head: memory runs out in
//! seconds, and a head that is away (or a round trip through it) must not let
//! a GPU's workers fail. So evictions are also acted on while no session runs
//! (`while_evicting`); their reports wait in the outbox like any other.

use std::future::Future;

use tracing::{debug, warn};

use super::Agent;
use crate::telemetry::eviction::Eviction;
use crate::worker::StopRequest;

impl Agent {
    /// Stops `eviction`'s worker through its checkpoint, unless it is already
    /// stopping (the head's `Kill`, a drain) or gone.
    pub(super) fn evict(&mut self, eviction: Eviction) {
        let Some(worker) = self.workers.get_mut(&eviction.key) else {
            debug!(worker = %eviction.key, "eviction for a worker already gone");
            return;
        };
        let Some(stop) = worker.stop.take() else {
            debug!(worker = %eviction.key, "eviction for a worker already stopping");
            return;
        };
        warn!(
            worker = %eviction.key,
            gpu = eviction.gpu.index,
            used_bytes = eviction.gpu.used_bytes,
            total_bytes = eviction.gpu.total_bytes,
            percent = format!("{:.1}", eviction.percent()),
            "GPU memory running short: evicting the youngest oversubscribed worker through its checkpoint"
        );
        let _ = stop.send(StopRequest::evict(eviction));
    }

    /// Awaits `future` (a connection attempt, a back-off) while still acting on
    /// evictions, which do not wait for the head.
    pub(super) async fn while_evicting<F: Future>(&mut self, future: F) -> F::Output {
        let mut future = std::pin::pin!(future);
        loop {
            tokio::select! {
                output = &mut future => return output,
                Some(eviction) = self.evictions_rx.recv() => self.evict(eviction),
            }
        }
    }
}
