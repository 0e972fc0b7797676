//! The workload mix that FGD ("Beware of Fragmentation", ATC 2023) measures
//! expected fragmentation against, and that measure for one node.
//!
//! A mix is a list of task types with weights summing to 1; the expected
//! fragmentation of a node is the idle GPU that a task drawn from the mix could
//! not use there, CPU, memory and GPU models included. Pure arithmetic: nothing
//! here knows about the pool or chooses nodes (`fragmentation` does).

use std::collections::BTreeMap;

use super::WHOLE_GPU;
use crate::{Amount, GPU_MILLI};

/// Shares are rounded up to this many thousandths when workers are grouped
/// into classes, so that 0.22 and 0.215 are one class and a worker is never
/// thought smaller than it is.
const SHARE_STEP: u64 = 10;

/// One kind of worker in the workload mix that expected fragmentation is
/// measured against: what one worker asks for, and how common it is.
#[derive(Debug, Clone, PartialEq)]
pub struct TaskType {
    /// GPU thousandths: below 1000 a share of one GPU, else whole GPUs.
    pub gpu_milli: u64,
    /// CPU thousandths.
    pub cpu_milli: u64,
    /// Memory bytes.
    pub memory_bytes: u64,
    /// The GPU models it accepts, sorted; empty accepts any.
    pub gpu_models: Vec<String>,
    /// Its share of the mix; the weights sum to 1.
    pub weight: f64,
}

/// A class of workers: its GPU ask (rounded) and the models it accepts.
type ClassKey = (u64, Vec<String>);

/// A class's host asks, sorted: `(CPU, memory, workers)`.
type HostAsks = Vec<(u64, u64, u64)>;

/// The workload's worker classes and their popularity, for the expected
/// fragmentation of FGD: the idle GPU on a node that a worker drawn from the
/// mix could not use, CPU and memory included.
#[derive(Debug, Clone, PartialEq)]
pub struct TaskMix {
    types: Vec<TaskType>,
    /// CPU thousandths per GPU thousandth that the GPU types ask, weighted.
    cpu_per_gpu: f64,
}

impl TaskMix {
    /// The most types a mix keeps (the most common ones), so that a score stays
    /// O(types × GPUs) whatever the workload.
    pub const MAX_TYPES: usize = 256;

    /// The mix of `workers` (one worker's ask, the models it accepts, and how
    /// many such workers): workers grouped into classes by GPU ask (a share
    /// rounded up to `SHARE_STEP`, 10 thousandths, whole GPUs as asked, or none)
    /// and models, each class stood for by its distinct host asks (CPU and
    /// memory), each weighted by its workers. When the distinct asks of all
    /// classes would make more than [`Self::MAX_TYPES`] types, each class is
    /// stood for instead by the medians of `k` equal parts of its workers
    /// (sorted by CPU, then memory), `k` the largest that keeps the mix within
    /// the bound; then, only if the classes alone are too many, the most common
    /// types are kept. Weights are scaled to sum to 1. Workers asking no GPU
    /// are in the mix (they are part of what arrives) but never count as
    /// fragmentation (see [`Self::expected_fragmentation`]). `None` when
    /// nothing is given.
    ///
    /// Why classes by GPU ask, every class kept: keeping the most common exact
    /// asks of a workload whose asks vary pod by pod left whole classes out
    /// (the multi-GPU ones first: 4 % of pods but over a quarter of the GPUs
    /// asked), so FGD never weighed keeping 8-GPU nodes whole. Why the exact
    /// asks when they fit: on Alibaba's openb trace four medians per class
    /// stood for the 8-GPU pods by 64 and 88 cores, so no type of the mix
    /// needed the 120 cores that only one node model offers; FGD broke those
    /// nodes for single GPUs from 37 % load on, and refused 8-GPU pods that
    /// bin-pack placed before 90 % arrived (`docs/measurements/scheduling.md`).
    pub fn from_workers<'m>(
        workers: impl IntoIterator<Item = (Amount, &'m [String], u64)>,
    ) -> Option<Self> {
        let classes = classes_of(workers);
        // Exact asks if they fit, else the most quantiles per class that do.
        let parts = quantiles_that_fit(&classes, Self::MAX_TYPES);
        let mut kept: Vec<(u64, ClassKey, (u64, u64))> = Vec::new();
        for (key, asks) in &classes {
            let points: Vec<(u64, (u64, u64))> = match parts {
                None => asks
                    .iter()
                    .map(|(cpu, memory, workers)| (*workers, (*cpu, *memory)))
                    .collect(),
                Some(parts) => quantile_asks(asks, parts),
            };
            for (count, ask) in points {
                kept.push((count, key.clone(), ask));
            }
        }
        // Most common first; equal counts in key order, so a mix is deterministic.
        kept.sort_by(|a, b| b.0.cmp(&a.0).then_with(|| a.1.cmp(&b.1)));
        kept.truncate(Self::MAX_TYPES);
        let total = kept
            .iter()
            .fold(0_u64, |sum, (count, _, _)| sum.saturating_add(*count));
        if total == 0 {
            return None;
        }
        let types: Vec<TaskType> = kept
            .into_iter()
            .map(
                |(count, (gpu_milli, gpu_models), (cpu_milli, memory_bytes))| TaskType {
                    gpu_milli,
                    cpu_milli,
                    memory_bytes,
                    gpu_models,
                    weight: count as f64 / total as f64,
                },
            )
            .collect();
        let (cpu, gpu) =
            types
                .iter()
                .filter(|kind| kind.gpu_milli > 0)
                .fold((0.0, 0.0), |(cpu, gpu), kind| {
                    (
                        cpu + kind.weight * kind.cpu_milli as f64,
                        gpu + kind.weight * kind.gpu_milli as f64,
                    )
                });
        let cpu_per_gpu = if gpu > 0.0 { cpu / gpu } else { 0.0 };
        Some(Self { types, cpu_per_gpu })
    }

    /// The CPU thousandths the mix's GPU work asks per GPU thousandth (each
    /// type weighted by its share; 0 without GPU work).
    pub fn cpu_per_gpu(&self) -> f64 {
        self.cpu_per_gpu
    }

    /// The classes, most common first.
    pub fn types(&self) -> &[TaskType] {
        &self.types
    }

    /// The expected idle GPU thousandths a worker drawn from the mix could not
    /// use on a node of GPU model `model` with these GPU rooms and this free CPU
    /// and memory: for each type, all the idle GPU when one such worker does not
    /// fit the node at all (its models, GPU, CPU or memory), else the rooms too
    /// small for its share (fractional) or the partly used rooms (whole GPUs),
    /// weighted by the type's share; nothing for a type that asks no GPU.
    pub fn expected_fragmentation(
        &self,
        model: Option<&str>,
        rooms: &[u32],
        free_cpu: u64,
        free_memory: u64,
    ) -> f64 {
        let idle: u64 = rooms.iter().copied().map(u64::from).sum();
        if idle == 0 {
            return 0.0;
        }
        let whole_free = rooms.iter().filter(|room| **room == WHOLE_GPU).count() as u64;
        let largest = u64::from(rooms.iter().copied().max().unwrap_or(0));
        let partly_used_room: u64 = rooms
            .iter()
            .filter(|room| **room < WHOLE_GPU)
            .copied()
            .map(u64::from)
            .sum();
        self.types
            .iter()
            .map(|kind| {
                let model_fits = kind.gpu_models.is_empty()
                    || model.is_some_and(|model| kind.gpu_models.iter().any(|name| name == model));
                let host_fits = kind.cpu_milli <= free_cpu && kind.memory_bytes <= free_memory;
                let unusable = if kind.gpu_milli == 0 {
                    // A CPU-only worker uses no GPU wherever it fits, so it
                    // tells nothing about which idle GPU is usable: the paper
                    // counts all idle GPU for it on every node, the same
                    // growth wherever a gang goes, and so no term at all.
                    // Counting the idle GPU only where its CPU no longer fits
                    // drew GPU work to the nodes with the most CPU, the only
                    // ones that hold the biggest 8-GPU asks.
                    0
                } else if !host_fits || !model_fits {
                    idle
                } else if kind.gpu_milli < GPU_MILLI {
                    if largest < kind.gpu_milli {
                        idle
                    } else {
                        rooms
                            .iter()
                            .filter(|room| u64::from(**room) < kind.gpu_milli)
                            .copied()
                            .map(u64::from)
                            .sum()
                    }
                } else if whole_free < kind.gpu_milli / GPU_MILLI {
                    idle
                } else {
                    partly_used_room
                };
                kind.weight * unusable as f64
            })
            .sum()
    }
}

/// Workers grouped into classes by GPU ask (fractions rounded up to
/// [`SHARE_STEP`]) and acceptable models (none for CPU-only work), each with
/// its distinct host asks (CPU, memory, how many), sorted.
fn classes_of<'m>(
    workers: impl IntoIterator<Item = (Amount, &'m [String], u64)>,
) -> Vec<(ClassKey, HostAsks)> {
    let mut classes: BTreeMap<ClassKey, HostAsks> = BTreeMap::new();
    for (ask, models, count) in workers {
        if count == 0 {
            continue;
        }
        let gpu = if ask.gpu_milli < GPU_MILLI {
            ask.gpu_milli.div_ceil(SHARE_STEP) * SHARE_STEP
        } else {
            ask.gpu_milli
        };
        let mut models = if ask.gpu_milli == 0 {
            Vec::new()
        } else {
            models.to_vec()
        };
        models.sort_unstable();
        models.dedup();
        classes
            .entry((gpu, models))
            .or_default()
            .push((ask.cpu_milli, ask.memory_bytes, count));
    }
    classes
        .into_iter()
        .map(|(key, mut asks)| {
            asks.sort_unstable();
            (key, merge_equal_asks(&asks))
        })
        .collect()
}

/// `None` when every class's distinct asks make at most `max_types` types;
/// else the most quantiles per class that keep the mix within it (at least 1).
fn quantiles_that_fit(classes: &[(ClassKey, HostAsks)], max_types: usize) -> Option<u64> {
    let distinct: usize = classes.iter().map(|(_, asks)| asks.len()).sum();
    if distinct <= max_types {
        return None;
    }
    let fits = |parts: usize| {
        classes
            .iter()
            .map(|(_, asks)| asks.len().min(parts))
            .sum::<usize>()
            <= max_types
    };
    Some((1..max_types).rev().find(|parts| fits(*parts)).unwrap_or(1) as u64)
}

/// `asks` (sorted, each `(CPU, memory, workers)`) with equal asks merged.
fn merge_equal_asks(asks: &[(u64, u64, u64)]) -> HostAsks {
    let mut merged: HostAsks = Vec::with_capacity(asks.len());
    for &(cpu, memory, workers) in asks {
        match merged.last_mut() {
            Some(last) if (last.0, last.1) == (cpu, memory) => {
                last.2 = last.2.saturating_add(workers);
            }
            _ => merged.push((cpu, memory, workers)),
        }
    }
    merged
}

/// Up to `parts` host asks standing for `asks` (sorted, each `(CPU, memory,
/// workers)`): the median of each of that many equal parts of the workers,
/// with the workers of the part; equal medians merged.
fn quantile_asks(asks: &[(u64, u64, u64)], parts: u64) -> Vec<(u64, (u64, u64))> {
    let count = asks
        .iter()
        .fold(0_u64, |sum, (_, _, workers)| sum.saturating_add(*workers));
    let parts = parts.min(count).max(1);
    // The boundary of part `part`, in u128 so that no count overflows.
    let boundary = |part: u64| (u128::from(part) * u128::from(count) / u128::from(parts)) as u64;
    let mut points: Vec<(u64, (u64, u64))> = Vec::new();
    for part in 0..parts {
        let (from, to) = (boundary(part), boundary(part + 1));
        if to == from {
            continue;
        }
        let ask = nth_ask(asks, from + (to - from) / 2);
        match points.last_mut() {
            Some((workers, last)) if *last == ask => *workers += to - from,
            _ => points.push((to - from, ask)),
        }
    }
    points
}

/// The `(CPU, memory)` of worker number `index` (from 0) of `asks`, each ask
/// standing for its count of workers.
fn nth_ask(asks: &[(u64, u64, u64)], index: u64) -> (u64, u64) {
    let mut seen = 0_u64;
    for (cpu, memory, workers) in asks {
        seen = seen.saturating_add(*workers);
        if seen > index {
            return (*cpu, *memory);
        }
    }
    asks.last()
        .map_or((0, 0), |(cpu, memory, _)| (*cpu, *memory))
}
