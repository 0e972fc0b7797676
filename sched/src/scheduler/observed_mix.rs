//! The workload mix the core observes, for FGD placement (`placement: fgd`):
//! the worker asks of the last [`WINDOW`] trials submitted (or adopted),
//! rebuilt into the pool's [`TaskMix`] when enough new ones came.
//!
//! Why observed and windowed: FGD ("Beware of Fragmentation", ATC 2023)
//! measures fragmentation against the tasks expected next, which a live
//! cluster only knows from what it has seen; a window follows a workload that
//! changes, and bounds the memory and the rebuild whatever the history.

use std::collections::VecDeque;

use crate::place::{NodePool, TaskMix};
use crate::{Amount, GangShape};

/// How many trials' asks the mix is made of: the most recent.
const WINDOW: usize = 4096;
/// No mix (bin-pack order with the fragmentation of common shapes as a
/// tie-break) until this many trials have been seen: a handful of asks would
/// be taken for the whole workload.
const MIN_SEEN: usize = 16;
/// The mix is rebuilt once this many trials came since the last build (or
/// when [`MIN_SEEN`] is first reached): a rebuild walks the whole window.
const REBUILD_AFTER: usize = 64;

/// One trial's worker ask, the GPU models it accepts, and its workers.
type Ask = (Amount, Vec<String>, u64);

/// The recent asks and whether the mix built from them is due.
#[derive(Debug, Default)]
pub(super) struct ObservedMix {
    asks: VecDeque<Ask>,
    since_build: usize,
    built: bool,
}

impl ObservedMix {
    /// Counts a trial's gang (as charged: an oversubscribed share at its charge).
    pub(super) fn observe(&mut self, gang: &GangShape) {
        if self.asks.len() == WINDOW {
            self.asks.pop_front();
        }
        self.asks.push_back((
            gang.per_worker,
            gang.gpu_models.clone(),
            u64::from(gang.workers),
        ));
        self.since_build += 1;
    }

    /// Keeps `pool`'s mix in step: the observed one, rebuilt when due, while
    /// the policy places by FGD (`wanted`), none otherwise.
    pub(super) fn refresh(&mut self, pool: &mut NodePool, wanted: bool) {
        if !wanted {
            if self.built {
                pool.set_task_mix(None);
                self.built = false;
            }
            return;
        }
        if let Some(mix) = self.rebuild_if_due() {
            pool.set_task_mix(Some(mix));
        }
    }

    /// The mix to score against from now on, when one is due.
    fn rebuild_if_due(&mut self) -> Option<TaskMix> {
        let due = if self.built {
            self.since_build >= REBUILD_AFTER
        } else {
            self.asks.len() >= MIN_SEEN
        };
        if !due {
            return None;
        }
        self.built = true;
        self.since_build = 0;
        TaskMix::from_workers(
            self.asks
                .iter()
                .map(|(ask, models, workers)| (*ask, &models[..], *workers)),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn gang(gpu_milli: u64, workers: u32) -> GangShape {
        GangShape {
            workers,
            per_worker: Amount {
                gpu_milli,
                cpu_milli: 1000,
                memory_bytes: 1 << 30,
            },
            gpu_models: Vec::new(),
            node_labels: Default::default(),
            spread: false,
            leases: Default::default(),
            oversubscribe: false,
        }
    }

    #[test]
    fn a_mix_comes_after_enough_trials_then_every_few_and_forgets_the_oldest() {
        let mut observed = ObservedMix::default();
        let mut pool = NodePool::new();
        for _ in 0..MIN_SEEN - 1 {
            observed.observe(&gang(500, 1));
        }
        observed.refresh(&mut pool, true);
        assert!(pool.task_mix().is_none(), "too few to tell");
        observed.observe(&gang(500, 1));
        observed.refresh(&mut pool, true);
        assert_eq!(pool.task_mix().expect("enough seen").types().len(), 1);
        // A whole window of 8-GPU gangs: the half GPUs are forgotten.
        for _ in 0..WINDOW {
            observed.observe(&gang(8000, 2));
        }
        observed.refresh(&mut pool, true);
        let types = pool.task_mix().expect("rebuilt").types();
        assert_eq!((types.len(), types[0].gpu_milli), (1, 8000));
        assert_eq!(observed.asks.len(), WINDOW);
        // Another placement drops the mix; FGD again brings it back.
        observed.refresh(&mut pool, false);
        assert!(pool.task_mix().is_none());
        observed.refresh(&mut pool, true);
        assert!(pool.task_mix().is_some());
    }
}
