//! `xp sim --place-once`: packing quality alone, with no departures and no queue.
//!
//! The arrivals are made as the FGD paper's simulator makes them from
//! Alibaba's trace: every job of the trace that asks for anything, once, then
//! copies drawn with replacement (from the seed) while the GPUs asked for stay
//! within `load` times the cluster's GPUs (or jobs dropped at random until
//! they are within it, when the trace alone asks for more), in a random order.
//! Each arrives in turn and is placed once, with the node pool's own
//! placement, or fails when it does not fit. CPU-only jobs arrive too: they
//! take CPU and memory on GPU nodes, which can strand those nodes' GPUs, but
//! add nothing to the load. The report is the GPU allocation ratio as the
//! arrived load passes 0.9, 1.0 and the final load, the fragmentation of the
//! idle GPUs, and the failures by kind. The same seed makes the same arrivals
//! for every strategy, so strategies are compared on equal input.

use super::cluster::ClusterSpec;
use super::engine::gang_of;
use super::trace::{Trace, TraceJob};
use std::collections::HashMap;

use super::gpu_memory::GpuMemoryModel;
use crate::place::{NodePool, Strategy, TaskMix};
use crate::{GPU_MILLI, GangShape, WorkerPlacement, oversubscribed_charge};
use xp_runtime::seeded::SplitMix64;

/// The largest load accepted, in multiples of the cluster's GPUs.
pub const MAX_LOAD: f64 = 100.0;
/// The most arrivals one measurement makes (each is held until placed).
pub const MAX_ARRIVALS: usize = 20_000_000;
/// Load levels reported on the way to the final load.
pub const CHECKPOINT_LOADS: [f64; 2] = [0.9, 1.0];

/// How to run the packing measurement.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct PlaceOnceOptions {
    /// Stop when the GPUs asked for reach this multiple of the cluster's GPUs.
    pub load: f64,
    /// How workers are laid out.
    pub strategy: Strategy,
    /// Draws the jobs (and seeds random placement).
    pub seed: u64,
    /// The policy's oversubscription factor in thousandths (1000: none):
    /// jobs that opt in are placed at their charge
    /// ([`crate::oversubscribed_charge`]) and evicted, youngest first, when
    /// the peaks of a GPU's workers overflow its memory.
    pub oversubscription_milli: u64,
}

/// Why the packing measurement cannot run.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum PlaceOnceError {
    /// The load is not a number in `(0, MAX_LOAD]`.
    #[error("the load must be above 0 and at most {MAX_LOAD} (got {load})")]
    Load {
        /// The value given.
        load: f64,
    },
    /// The trace has no job that asks for a GPU.
    #[error("the trace has no job that asks for a GPU")]
    NoGpuJobs,
    /// The cluster has no GPU.
    #[error("the cluster has no GPU")]
    NoGpus,
    /// The load takes more arrivals than are held in memory at once: the
    /// trace's jobs ask too little for the cluster and the load.
    #[error(
        "the load takes over {MAX_ARRIVALS} arrivals for this trace and cluster; lower --load or use bigger jobs"
    )]
    TooManyArrivals,
}

/// The kind of a job, for failure counts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum JobKind {
    /// Workers that each take a share of one GPU.
    Fractional,
    /// One worker with one whole GPU.
    WholeGpu,
    /// More than one GPU in all.
    MultiGpu,
    /// No GPU.
    CpuOnly,
}

impl JobKind {
    /// The kind of `job`.
    pub fn of(job: &TraceJob) -> Self {
        if job.gpu_milli_per_worker == 0 {
            Self::CpuOnly
        } else if job.gpu_milli_per_worker < GPU_MILLI {
            Self::Fractional
        } else if job.total_gpu_milli() == GPU_MILLI {
            Self::WholeGpu
        } else {
            Self::MultiGpu
        }
    }

    fn slot(self) -> usize {
        match self {
            Self::Fractional => 0,
            Self::WholeGpu => 1,
            Self::MultiGpu => 2,
            Self::CpuOnly => 3,
        }
    }
}

/// Counts per [`JobKind`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct KindCounts {
    /// Fractional-GPU jobs.
    pub fractional: u64,
    /// Single whole-GPU jobs.
    pub whole_gpu: u64,
    /// Multi-GPU jobs.
    pub multi_gpu: u64,
    /// CPU-only jobs.
    pub cpu_only: u64,
}

impl KindCounts {
    fn add(&mut self, kind: JobKind) {
        match kind.slot() {
            0 => self.fractional += 1,
            1 => self.whole_gpu += 1,
            2 => self.multi_gpu += 1,
            _ => self.cpu_only += 1,
        }
    }

    /// All kinds together.
    pub fn total(&self) -> u64 {
        self.fractional + self.whole_gpu + self.multi_gpu + self.cpu_only
    }
}

/// What the packing measurement found.
#[derive(Debug, Clone, PartialEq)]
pub struct PlaceOnceReport {
    /// Allocated GPUs over the cluster's GPUs at each load level passed, in order
    /// (`(load, ratio)`): 0.9, 1.0 (when below the final load) and the final load.
    pub alloc_ratio: Vec<(f64, f64)>,
    /// GPUs asked for over the cluster's GPUs when arrivals stopped.
    pub final_load: f64,
    /// The pool's fragmentation of idle GPUs at the end.
    pub idle_gpu_fragmentation: f64,
    /// Jobs drawn, by kind.
    pub attempted: KindCounts,
    /// Jobs that did not fit, by kind.
    pub failed: KindCounts,
    /// Jobs placed and then evicted because a GPU's memory overflowed (see
    /// `gpu_memory`); their GPUs are not counted as allocated.
    pub evictions: u64,
}

impl PlaceOnceReport {
    /// The report as one JSON object; `alloc_ratio` is keyed by load.
    pub fn to_json(&self) -> serde_json::Value {
        let alloc_ratio: serde_json::Map<String, serde_json::Value> = self
            .alloc_ratio
            .iter()
            .map(|(load, ratio)| (load_key(*load), serde_json::json!(ratio)))
            .collect();
        let counts = |counts: &KindCounts| {
            serde_json::json!({
                "fractional": counts.fractional,
                "whole_gpu": counts.whole_gpu,
                "multi_gpu": counts.multi_gpu,
                "cpu_only": counts.cpu_only,
                "total": counts.total(),
            })
        };
        serde_json::json!({
            "alloc_ratio": alloc_ratio,
            "final_load": self.final_load,
            "idle_gpu_fragmentation": self.idle_gpu_fragmentation,
            "jobs": self.attempted.total(),
            "attempted": counts(&self.attempted),
            "failed": counts(&self.failed),
            "evictions": self.evictions,
        })
    }
}

/// A load as a JSON key: `0.9`, `1.0`, `1.3`.
pub fn load_key(load: f64) -> String {
    let text = format!("{load:.3}");
    let trimmed = text.trim_end_matches('0');
    if trimmed.ends_with('.') {
        format!("{trimmed}0")
    } else {
        trimmed.to_owned()
    }
}

/// Runs the packing measurement.
pub fn place_once(
    trace: &Trace,
    cluster: &ClusterSpec,
    options: &PlaceOnceOptions,
) -> Result<PlaceOnceReport, PlaceOnceError> {
    // 1. The jobs to draw from, and the cluster they go to.
    let jobs = drawable_jobs(trace, options)?;
    let capacity_milli = cluster.total_gpus() * GPU_MILLI;
    if capacity_milli == 0 {
        return Err(PlaceOnceError::NoGpus);
    }
    let mut packing = Packing::new(cluster, &jobs, options);
    // 2. Draws, each placed once, until the load is reached. Separate streams:
    // the jobs drawn must not depend on the strategy.
    let mut draws = SplitMix64::new(options.seed);
    let mut placement_seeds = SplitMix64::new(options.seed ^ 0x7069_6163_656f_6e63);
    let capacity = capacity_milli as f64;
    let target = options.load * capacity;
    let mut arrived_milli: u64 = 0;
    let mut attempted = KindCounts::default();
    let mut failed = KindCounts::default();
    let mut alloc_ratio = Vec::new();
    let mut arrivals: u64 = 0;
    let mut checkpoints = CHECKPOINT_LOADS
        .iter()
        .copied()
        .filter(|&load| load < options.load)
        .peekable();
    for job in arrival_order(&jobs, target, &mut draws, MAX_ARRIVALS)? {
        let kind = JobKind::of(job);
        attempted.add(kind);
        arrived_milli += job.total_gpu_milli();
        let strategy = match options.strategy {
            Strategy::Random { .. } => Strategy::Random {
                seed: placement_seeds.next_u64(),
            },
            other => other,
        };
        arrivals += 1;
        if !packing.place(arrivals, job, strategy) {
            failed.add(kind);
        }
        // 3. The allocation ratio as the load passes each level.
        while let Some(&load) = checkpoints.peek() {
            if (arrived_milli as f64) < load * capacity {
                break;
            }
            alloc_ratio.push((load, packing.allocated_milli as f64 / capacity));
            checkpoints.next();
        }
    }
    alloc_ratio.push((options.load, packing.allocated_milli as f64 / capacity));
    Ok(PlaceOnceReport {
        alloc_ratio,
        final_load: arrived_milli as f64 / capacity,
        idle_gpu_fragmentation: packing.pool.idle_gpu_fragmentation(),
        attempted,
        failed,
        evictions: packing.evictions,
    })
}

/// The trace's jobs that ask for anything, refused when the load is out of
/// range or no job asks for a GPU.
fn drawable_jobs<'t>(
    trace: &'t Trace,
    options: &PlaceOnceOptions,
) -> Result<Vec<&'t TraceJob>, PlaceOnceError> {
    if !(options.load.is_finite() && options.load > 0.0 && options.load <= MAX_LOAD) {
        return Err(PlaceOnceError::Load { load: options.load });
    }
    if !trace.jobs.iter().any(|job| job.total_gpu_milli() > 0) {
        return Err(PlaceOnceError::NoGpuJobs);
    }
    let jobs: Vec<&TraceJob> = trace
        .jobs
        .iter()
        .filter(|job| {
            job.total_gpu_milli() > 0 || job.cpu_milli_per_worker > 0 || job.mem_mib_per_worker > 0
        })
        .collect();
    if jobs.is_empty() {
        return Err(PlaceOnceError::NoGpuJobs);
    }
    Ok(jobs)
}

/// The jobs in their order of arrival: each of `jobs` once, topped up with
/// copies drawn with replacement while the GPU thousandths asked for stay
/// within `target` (the paper's simulator stops at the first copy that would
/// pass it), or thinned at random until they are within it, then shuffled;
/// refused past `limit` arrivals.
fn arrival_order<'t>(
    jobs: &[&'t TraceJob],
    target: f64,
    draws: &mut SplitMix64,
    limit: usize,
) -> Result<Vec<&'t TraceJob>, PlaceOnceError> {
    let mut arrivals = jobs.to_vec();
    let mut asked: u64 = arrivals.iter().map(|job| job.total_gpu_milli()).sum();
    if asked as f64 > target {
        while asked as f64 > target && !arrivals.is_empty() {
            let dropped = arrivals.swap_remove(draws.index(arrivals.len()));
            asked -= dropped.total_gpu_milli();
        }
    } else {
        loop {
            let copy = jobs[draws.index(jobs.len())];
            if (asked + copy.total_gpu_milli()) as f64 > target {
                break;
            }
            if arrivals.len() >= limit {
                return Err(PlaceOnceError::TooManyArrivals);
            }
            asked += copy.total_gpu_milli();
            arrivals.push(copy);
        }
    }
    draws.shuffle(&mut arrivals);
    Ok(arrivals)
}

/// `job`'s gang as the policy core would place it: an opted-in share at its
/// charge (the core's one oversubscription hook, as `PolicyCore::submit`).
fn charged_gang(job: &TraceJob, oversubscription_milli: u64) -> GangShape {
    let mut gang = gang_of(job);
    if gang.oversubscribe {
        gang.per_worker.gpu_milli =
            oversubscribed_charge(gang.per_worker.gpu_milli, oversubscription_milli);
    }
    gang
}

/// The cluster as jobs are placed on it, and what placing them did.
struct Packing {
    pool: NodePool,
    oversubscription_milli: u64,
    /// GPU thousandths the placed jobs ask for.
    allocated_milli: u64,
    /// GPU memory peaks, for evictions of oversubscribed jobs.
    memory: GpuMemoryModel,
    /// Placed jobs by arrival number: their workers and GPU thousandths.
    placed_jobs: HashMap<u64, (Vec<WorkerPlacement>, u64)>,
    evictions: u64,
}

impl Packing {
    /// The cluster's nodes, empty, knowing the workload's mix up front as in
    /// the FGD paper's replay: the asks as placed, so an opted-in share
    /// counts at its charge.
    fn new(cluster: &ClusterSpec, jobs: &[&TraceJob], options: &PlaceOnceOptions) -> Self {
        let mut pool = NodePool::new();
        for node in &cluster.nodes {
            pool.upsert_node(node.clone());
        }
        pool.set_task_mix(TaskMix::from_workers(jobs.iter().map(|job| {
            let gang = charged_gang(job, options.oversubscription_milli);
            (gang.per_worker, &job.gpu_types[..], u64::from(gang.workers))
        })));
        Self {
            pool,
            oversubscription_milli: options.oversubscription_milli,
            allocated_milli: 0,
            memory: GpuMemoryModel::default(),
            placed_jobs: HashMap::new(),
            evictions: 0,
        }
    }

    /// Places arrival `arrival` of `job` if it fits, evicting what its memory
    /// peak pushes out; whether it was placed.
    fn place(&mut self, arrival: u64, job: &TraceJob, strategy: Strategy) -> bool {
        let gang = charged_gang(job, self.oversubscription_milli);
        let placed = self
            .pool
            .find(&gang, strategy)
            .filter(|workers| self.pool.allocate(workers).is_ok());
        let Some(workers) = placed else {
            return false;
        };
        self.allocated_milli += job.total_gpu_milli();
        let evicted = self.memory.place(
            arrival,
            &workers,
            job.gpu_mem_peak_milli,
            job.gpu_milli_per_worker,
            gang.oversubscribe,
        );
        self.placed_jobs
            .insert(arrival, (workers, job.total_gpu_milli()));
        for number in evicted {
            if let Some((workers, milli)) = self.placed_jobs.remove(&number) {
                self.pool.release(&workers);
                self.allocated_milli -= milli;
                self.evictions += 1;
            }
        }
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn arrivals_past_the_limit_are_refused_not_held() {
        let trace = super::super::trace::parse_trace(
            "job_id,submit_s,duration_s,num_workers,gpus_per_worker\nsliver,0,,1,0.001\n",
        )
        .unwrap();
        let jobs: Vec<&TraceJob> = trace.jobs.iter().collect();
        let mut draws = SplitMix64::new(1);
        // 100 thousandths: the job and 99 copies, within a limit of 100.
        let arrivals = arrival_order(&jobs, 100.0, &mut draws, 100).unwrap();
        assert_eq!(arrivals.len(), 100);
        assert!(matches!(
            arrival_order(&jobs, 101.0, &mut draws, 100),
            Err(PlaceOnceError::TooManyArrivals)
        ));
    }

    #[test]
    fn load_keys_read_naturally() {
        assert_eq!(load_key(0.9), "0.9");
        assert_eq!(load_key(1.0), "1.0");
        assert_eq!(load_key(1.3), "1.3");
        assert_eq!(load_key(2.0), "2.0");
        assert_eq!(load_key(1.25), "1.25");
    }
}
