//! GPU memory in `xp sim --place-once`: which co-located workers' memory
//! overflows a GPU, and which oversubscribed worker is evicted for it.
//!
//! Each placed worker with a share of a GPU uses up to its peak memory
//! (`gpu_mem_peak`, as a fraction of the GPU's memory; a worker without one
//! uses its share, which is what a share promises). Place-once has no clock,
//! so every worker is taken at its peak: the count of evictions is the most a
//! placement could cause. When a GPU's peaks add up to more than its memory,
//! the youngest oversubscribed worker on it is evicted (its whole job released)
//! until they fit or none is left, the rule the node applies live
//! (`xp_node::telemetry::eviction`). Workers that did not opt in are never
//! evicted, and without oversubscription the policy never promises more than
//! a GPU, so a trace whose peaks stay within shares never evicts.

use std::collections::BTreeMap;

use xp_runtime::ids::NodeId;

use crate::WorkerPlacement;

/// One worker's memory on one GPU.
#[derive(Debug, Clone, Copy)]
struct Resident {
    /// Arrival number of its job; larger is younger.
    job: u64,
    /// Peak memory, thousandths of the GPU's memory.
    peak_milli: u64,
    /// Whether it opted in to oversubscription (and so may be evicted).
    oversubscribed: bool,
}

/// The memory of every GPU that holds shared workers.
#[derive(Debug, Default)]
pub(super) struct GpuMemoryModel {
    residents: BTreeMap<(NodeId, u32), Vec<Resident>>,
}

impl GpuMemoryModel {
    /// Records the fractional workers of job number `job` (placed on
    /// `workers`) with their peak memory, and returns the jobs to evict, youngest
    /// first, so that every GPU they touch fits its memory again. Whole-GPU
    /// workers never share, so they are not tracked.
    pub(super) fn place(
        &mut self,
        job: u64,
        workers: &[WorkerPlacement],
        peak_milli: Option<u32>,
        real_share_milli: u64,
        oversubscribed: bool,
    ) -> Vec<u64> {
        let mut touched = Vec::new();
        for worker in workers {
            for share in &worker.gpus {
                if u64::from(share.milli) >= crate::GPU_MILLI {
                    continue;
                }
                let key = (worker.node, share.index);
                self.residents.entry(key).or_default().push(Resident {
                    job,
                    peak_milli: peak_milli.map_or(real_share_milli, u64::from),
                    oversubscribed,
                });
                touched.push(key);
            }
        }
        let mut evicted: Vec<u64> = Vec::new();
        for key in touched {
            loop {
                let residents = &self.residents[&key];
                let used: u64 = residents
                    .iter()
                    .filter(|resident| !evicted.contains(&resident.job))
                    .map(|resident| resident.peak_milli)
                    .sum();
                if used <= crate::GPU_MILLI {
                    break;
                }
                let youngest = residents
                    .iter()
                    .filter(|resident| resident.oversubscribed && !evicted.contains(&resident.job))
                    .map(|resident| resident.job)
                    .max();
                match youngest {
                    Some(job) => evicted.push(job),
                    None => break,
                }
            }
        }
        // Most placements evict nobody: only then is every GPU walked.
        if !evicted.is_empty() {
            for residents in self.residents.values_mut() {
                residents.retain(|resident| !evicted.contains(&resident.job));
            }
        }
        evicted
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::GpuShare;

    fn on_gpu(gpu: u32, milli: u32) -> Vec<WorkerPlacement> {
        vec![WorkerPlacement {
            node: crate::sim::cluster::sim_node_id(0),
            gpus: vec![GpuShare { index: gpu, milli }],
            cpu_milli: 0,
            memory_bytes: 0,
        }]
    }

    #[test]
    fn the_youngest_oversubscribed_worker_goes_when_peaks_overflow() {
        let mut model = GpuMemoryModel::default();
        assert!(
            model
                .place(1, &on_gpu(0, 334), Some(450), 500, true)
                .is_empty()
        );
        assert!(
            model
                .place(2, &on_gpu(0, 334), Some(400), 500, false)
                .is_empty()
        );
        // 450 + 400 + 300 passes the GPU: the youngest opted-in job is 3.
        assert_eq!(
            model.place(3, &on_gpu(0, 200), Some(300), 300, true),
            vec![3]
        );
        // Job 3 left; job 4 overflows with 1, which goes as the youngest
        // opted-in after 4 itself is not: 4 did not opt in.
        assert_eq!(
            model.place(4, &on_gpu(0, 200), Some(200), 200, false),
            vec![1]
        );
        // Another GPU is untouched.
        assert!(
            model
                .place(5, &on_gpu(1, 334), Some(900), 500, true)
                .is_empty()
        );
    }

    #[test]
    fn workers_that_did_not_opt_in_are_never_evicted() {
        let mut model = GpuMemoryModel::default();
        assert!(
            model
                .place(1, &on_gpu(0, 600), Some(700), 600, false)
                .is_empty()
        );
        assert!(
            model
                .place(2, &on_gpu(0, 400), Some(400), 400, false)
                .is_empty()
        );
    }
}
