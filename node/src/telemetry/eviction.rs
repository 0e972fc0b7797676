//! Which oversubscribed worker to evict before a GPU runs out of memory.
//!
//! A policy with `oversubscription` above 1 lets fractional workers that opt in
//! share a GPU promised beyond its capacity, betting that they do not all fill
//! their memory at once. When a GPU's memory in use reaches the threshold, the
//! youngest oversubscribed worker on it is evicted through its checkpoint (the
//! node stops it with grace and reports it preempted, so the head requeues it
//! without using a retry): the youngest has lost the least work and is the most
//! likely to be the one whose growth tipped the GPU over.
//!
//! Pure: samples in, decisions out, so that it is tested without a GPU. Not yet
//! called by the agent or the telemetry sampler: no launch says yet that a
//! worker oversubscribes.

use std::collections::BTreeSet;

use xp_runtime::clock::UnixMillis;
use xp_runtime::ids::WorkerKey;

/// The default share of a GPU's memory at which eviction starts, in
/// thousandths: 95%, leaving room for the evicted worker's checkpoint.
pub const DEFAULT_THRESHOLD_MILLI: u32 = 950;

/// One GPU's memory as last sampled.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GpuMemory {
    /// The device index.
    pub index: u32,
    /// Bytes in use.
    pub used_bytes: u64,
    /// Bytes the device has; 0 when unknown (never evicts).
    pub total_bytes: u64,
}

/// A live worker that may be evicted: it opted in to oversubscription.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Oversubscribed {
    /// The worker.
    pub key: WorkerKey,
    /// The device indices it uses.
    pub gpus: Vec<u32>,
    /// When it started; the latest start is the youngest.
    pub started_at: UnixMillis,
}

/// The workers to evict now, at most one per GPU over the threshold: on each
/// GPU whose memory in use is at least `threshold_milli` thousandths of its
/// memory, the youngest oversubscribed worker on it that is not already being
/// evicted (`evicting`). Youngest is the latest start; equal starts go to the
/// largest key, so the choice is the same on every run. A worker chosen for one
/// GPU is not chosen again for another. A GPU with no such worker is left
/// alone: workers that did not opt in are never evicted for memory.
pub fn choose_evictions(
    gpus: &[GpuMemory],
    workers: &[Oversubscribed],
    evicting: &BTreeSet<WorkerKey>,
    threshold_milli: u32,
) -> Vec<WorkerKey> {
    let mut chosen: Vec<WorkerKey> = Vec::new();
    for gpu in gpus {
        if gpu.total_bytes == 0 {
            continue;
        }
        // used / total >= threshold / 1000, in integers.
        let over = u128::from(gpu.used_bytes) * 1000
            >= u128::from(gpu.total_bytes) * u128::from(threshold_milli);
        if !over {
            continue;
        }
        // A GPU already giving back memory through an eviction waits for it.
        let relieving = workers
            .iter()
            .any(|worker| worker.gpus.contains(&gpu.index) && evicting.contains(&worker.key));
        if relieving {
            continue;
        }
        let youngest = workers
            .iter()
            .filter(|worker| worker.gpus.contains(&gpu.index))
            .filter(|worker| !chosen.contains(&worker.key))
            .max_by_key(|worker| (worker.started_at, worker.key));
        if let Some(worker) = youngest {
            chosen.push(worker.key);
        }
    }
    chosen
}

#[cfg(test)]
mod tests {
    use xp_runtime::ids::{ExperimentId, TrialId};

    use super::*;

    const GIB: u64 = 1 << 30;

    fn key(index: u32) -> WorkerKey {
        WorkerKey {
            trial: TrialId {
                experiment: ExperimentId { digest: 1, run: 1 },
                index,
            },
            attempt: 1,
            rank: 0,
        }
    }

    fn worker(index: u32, gpus: &[u32], started: u64) -> Oversubscribed {
        Oversubscribed {
            key: key(index),
            gpus: gpus.to_vec(),
            started_at: started,
        }
    }

    fn gpu(index: u32, used_gib: u64) -> GpuMemory {
        GpuMemory {
            index,
            used_bytes: used_gib * GIB,
            total_bytes: 80 * GIB,
        }
    }

    #[test]
    fn the_youngest_on_a_full_gpu_goes() {
        let workers = [
            worker(1, &[0], 100),
            worker(2, &[0], 300),
            worker(3, &[0], 200),
        ];
        let chosen = choose_evictions(&[gpu(0, 78)], &workers, &BTreeSet::new(), 950);
        assert_eq!(chosen, vec![key(2)]);
    }

    #[test]
    fn below_the_threshold_nobody_goes() {
        let workers = [worker(1, &[0], 100), worker(2, &[0], 300)];
        // 75 GiB of 80 is 93.75%, under 95%.
        assert!(choose_evictions(&[gpu(0, 75)], &workers, &BTreeSet::new(), 950).is_empty());
        // Exactly at the threshold counts: 76 of 80 is 95%.
        assert_eq!(
            choose_evictions(&[gpu(0, 76)], &workers, &BTreeSet::new(), 950),
            vec![key(2)]
        );
    }

    #[test]
    fn only_oversubscribed_workers_on_that_gpu_are_candidates() {
        // Worker 2 is on another GPU; the full GPU 1 holds only worker 1.
        let workers = [worker(1, &[1], 100), worker(2, &[0], 900)];
        assert_eq!(
            choose_evictions(&[gpu(0, 10), gpu(1, 79)], &workers, &BTreeSet::new(), 950),
            vec![key(1)]
        );
        // A full GPU with no oversubscribed worker is left alone.
        assert!(choose_evictions(&[gpu(2, 80)], &workers, &BTreeSet::new(), 950).is_empty());
    }

    #[test]
    fn a_gpu_already_relieved_waits_and_nobody_is_chosen_twice() {
        let workers = [worker(1, &[0], 100), worker(2, &[0], 300)];
        let evicting = BTreeSet::from([key(2)]);
        assert!(choose_evictions(&[gpu(0, 79)], &workers, &evicting, 950).is_empty());
        // One worker spanning two full GPUs is chosen once; the other GPU
        // then takes its next youngest.
        let workers = [worker(1, &[0, 1], 300), worker(2, &[1], 100)];
        assert_eq!(
            choose_evictions(&[gpu(0, 79), gpu(1, 79)], &workers, &BTreeSet::new(), 950),
            vec![key(1), key(2)]
        );
    }

    #[test]
    fn equal_starts_break_by_key_and_unknown_memory_never_evicts() {
        let workers = [worker(1, &[0], 100), worker(2, &[0], 100)];
        assert_eq!(
            choose_evictions(&[gpu(0, 80)], &workers, &BTreeSet::new(), 950),
            vec![key(2)]
        );
        let unknown = GpuMemory {
            index: 0,
            used_bytes: 80 * GIB,
            total_bytes: 0,
        };
        assert!(choose_evictions(&[unknown], &workers, &BTreeSet::new(), 950).is_empty());
    }
}
