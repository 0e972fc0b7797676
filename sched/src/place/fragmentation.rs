//! Fragmentation-aware placement of a gang on one node, and the fragmentation
//! measure it breaks ties with.
//!
//! The choice only orders nodes that already hold the whole gang; whether a
//! gang fits, and where its workers sit on the node, are decided elsewhere.

use std::collections::{BTreeMap, HashSet};

use super::WHOLE_GPU;
use super::node::{GpuNeed, NodeView};
use super::search::Search;
use crate::{Amount, GPU_MILLI};

/// Fragmentation-aware placement scores at most this many nodes from the tight
/// end (least free CPU) of each whole-free-GPU bucket...
const FRAGMENTATION_CANDIDATES_LOW: usize = 6;
/// ...and this many from the loose end, so that a node with CPU to spare is
/// among the candidates too.
const FRAGMENTATION_CANDIDATES_HIGH: usize = 2;
/// Fragmentation-aware placement of a fractional worker scores at most this many
/// nodes that have a partly used GPU with room for it.
const FRAGMENTATION_CANDIDATES_SHARED: usize = 8;

/// With a workload mix ([`TaskMix`]), expected fragmentation decides first and
/// more candidates are worth scoring: this many from the tight end, the loose
/// end, and among partly used GPUs.
const MIX_CANDIDATES: (usize, usize, usize) = (128, 64, 256);

/// Worker shapes (GPU thousandths) that fragmentation-aware placement keeps
/// idle capacity usable for, as a last tie-break: the common sizes from a
/// quarter GPU to a whole 8-GPU machine.
const COMMON_SHAPES: [u32; 6] = [250, 500, 1000, 2000, 4000, 8000];

/// The idle GPU thousandths on a node with these GPU rooms that workers of
/// each [`COMMON_SHAPES`] size could not use, summed over the sizes (the
/// fragmentation measure of "Beware of Fragmentation", ATC 2023, for an even
/// mix of those sizes): all the idle GPU when one such worker does not fit,
/// else the rooms too small for a fractional worker, or the partly used rooms
/// for a whole-GPU worker.
fn common_shape_fragmentation(rooms: &[u32]) -> u64 {
    let idle: u64 = rooms.iter().copied().map(u64::from).sum();
    if idle == 0 {
        return 0;
    }
    let whole_free = rooms.iter().filter(|room| **room == WHOLE_GPU).count() as u32;
    let partly_used_room: u64 = rooms
        .iter()
        .filter(|room| **room < WHOLE_GPU)
        .copied()
        .map(u64::from)
        .sum();
    COMMON_SHAPES
        .iter()
        .map(|shape| {
            if *shape < WHOLE_GPU {
                if rooms.iter().any(|room| room >= shape) {
                    rooms
                        .iter()
                        .filter(|room| *room < shape)
                        .copied()
                        .map(u64::from)
                        .sum()
                } else {
                    idle
                }
            } else if whole_free >= shape / WHOLE_GPU {
                partly_used_room
            } else {
                idle
            }
        })
        .sum()
}

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

/// A kind's asks as rounded: GPU, CPU and memory, and its models.
type KindKey = (u64, u64, u64, Vec<String>);

/// The workload's worker kinds and their popularity, for the expected
/// fragmentation of FGD ("Beware of Fragmentation", ATC 2023): the idle GPU
/// on a node that a worker drawn from the mix could not use, CPU and memory
/// included.
#[derive(Debug, Clone, PartialEq)]
pub struct TaskMix {
    types: Vec<TaskType>,
}

impl TaskMix {
    /// The most kinds a mix keeps (the most common ones), so that a score stays
    /// O(kinds × GPUs) whatever the workload.
    pub const MAX_TYPES: usize = 48;

    /// The mix of `workers` (one worker's ask and how many such workers),
    /// asks rounded up into kinds (shares to 50 thousandths, CPU to a whole
    /// core, memory to 4 GiB, so a near-identical ask counts as its kind and a
    /// worker is never thought smaller than it is), the [`Self::MAX_TYPES`] most
    /// common kinds kept. Workers asking no GPU count too: they take CPU and
    /// memory that GPU workers need. `None` when nothing is given.
    pub fn from_workers<'m>(
        workers: impl IntoIterator<Item = (Amount, &'m [String], u64)>,
    ) -> Option<Self> {
        const GIB4: u64 = 4 << 30;
        let mut counts: BTreeMap<KindKey, u64> = BTreeMap::new();
        for (ask, models, count) in workers {
            let gpu = if ask.gpu_milli < GPU_MILLI {
                ask.gpu_milli.div_ceil(50) * 50
            } else {
                ask.gpu_milli
            };
            let cpu = ask.cpu_milli.div_ceil(1000) * 1000;
            let memory = ask.memory_bytes.div_ceil(GIB4).saturating_mul(GIB4);
            let mut models = if ask.gpu_milli == 0 {
                Vec::new()
            } else {
                models.to_vec()
            };
            models.sort_unstable();
            models.dedup();
            *counts.entry((gpu, cpu, memory, models)).or_default() += count;
        }
        let mut kinds: Vec<(KindKey, u64)> = counts.into_iter().collect();
        // Most common first; equal counts in key order, so a mix is deterministic.
        kinds.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
        kinds.truncate(Self::MAX_TYPES);
        let total: u64 = kinds.iter().map(|(_, count)| count).sum();
        if total == 0 {
            return None;
        }
        Some(Self {
            types: kinds
                .into_iter()
                .map(
                    |((gpu_milli, cpu_milli, memory_bytes, gpu_models), count)| TaskType {
                        gpu_milli,
                        cpu_milli,
                        memory_bytes,
                        gpu_models,
                        weight: count as f64 / total as f64,
                    },
                )
                .collect(),
        })
    }

    /// The kinds, most common first.
    pub fn types(&self) -> &[TaskType] {
        &self.types
    }

    /// The expected idle GPU thousandths a worker drawn from the mix could not
    /// use on a node of GPU model `model` with these GPU rooms and this free CPU
    /// and memory: for each kind, all the idle GPU when one such worker does not
    /// fit the node at all (its models, GPU, CPU or memory), else the rooms too
    /// small for its share (fractional) or the partly used rooms (whole GPUs),
    /// weighted by the kind's share.
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
                    // A CPU-only worker uses no GPU: it strands none by itself.
                    if host_fits { 0 } else { idle }
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

impl Search<'_> {
    /// Fragmentation-aware choice of one node for the whole gang.
    ///
    /// Candidates: the first few fitting nodes of every whole-free-GPU bucket
    /// that can suffice, from both ends of its CPU order, and for fractional
    /// workers also the first few nodes with a partly used GPU that fits.
    /// The smallest key wins:
    /// - fractional workers: whether the gang must break a free GPU (never while
    ///   a shared one fits), then the most partly used GPUs on the node, then
    ///   the fewest free whole GPUs;
    /// - whole GPUs or none: the fewest free whole GPUs (as bin-pack), then the
    ///   most partly used GPUs;
    /// - then the growth of [`common_shape_fragmentation`] (exact fills and
    ///   remainders that common shapes use win), then the bin-pack order.
    ///
    /// Why: under load, the idle capacity that waits longest is whole GPUs and
    /// whole nodes for big gangs (in simulations the head of the queue was a
    /// 4- or 8-GPU gang almost all the time), so keeping bin-pack's fullest-node
    /// order and confining fractional work, whose leftovers whole-GPU work
    /// cannot use, to the nodes that already hold some lets the other nodes
    /// drain whole sooner. Scoring by fragmentation growth first (as the paper
    /// does) placed fewer GPUs than bin-pack in those simulations, because it
    /// spreads work and no node drains whole.
    pub(super) fn pick_least_fragmenting(&self) -> Option<usize> {
        let workers = self.demand.workers;
        let min_cpu = self.demand.cpu_milli.saturating_mul(workers);
        let fractional = matches!(self.demand.gpu, GpuNeed::Fraction(_));
        let mix = self.task_mix();
        let limits = if mix.is_some() {
            MIX_CANDIDATES
        } else {
            (
                FRAGMENTATION_CANDIDATES_LOW,
                FRAGMENTATION_CANDIDATES_HIGH,
                FRAGMENTATION_CANDIDATES_SHARED,
            )
        };
        let mut seen = HashSet::new();
        let mut candidates = Vec::new();
        if let GpuNeed::Fraction(share) = self.demand.gpu {
            let mut found = 0;
            for (_, _, idx, _) in self.shared_stream(share, min_cpu) {
                if found == limits.2 {
                    break;
                }
                if seen.insert(idx) && self.fits(idx) >= workers {
                    candidates.push(idx);
                    found += 1;
                }
            }
        }
        // Nodes with no free GPU that hold fractional workers came from the
        // shared GPUs above; the buckets add the nodes with free GPUs.
        for bucket in self.demand.whole_gpus_for(workers)..self.n_buckets {
            for (descending, limit) in [(false, limits.0), (true, limits.1)] {
                let fitting = self
                    .bucket_stream(bucket, min_cpu, descending)
                    .filter(|idx| !seen.contains(idx) && self.fits(*idx) >= workers)
                    .take(limit)
                    .collect::<Vec<_>>();
                for idx in fitting {
                    seen.insert(idx);
                    candidates.push(idx);
                }
            }
        }
        candidates
            .into_iter()
            .enumerate()
            .map(|(position, idx)| {
                let view = self.view(idx);
                let mut placed = Vec::new();
                view.place(&self.demand, workers, &mut placed);
                let mut after = view.usage.clone();
                for worker in &placed {
                    after.hold(worker);
                }
                let after_view = NodeView {
                    usage: &after,
                    ..view
                };
                let before_rooms: Vec<u32> = view.rooms().collect();
                let after_rooms: Vec<u32> = after_view.rooms().collect();
                // Fragmentation only grows or shrinks by what the gang takes.
                let growth = match mix {
                    Some(mix) => {
                        let model = view.spec.gpu_model.as_deref();
                        let after = mix.expected_fragmentation(
                            model,
                            &after_rooms,
                            after_view.free_cpu(),
                            after_view.free_memory(),
                        );
                        let before = mix.expected_fragmentation(
                            model,
                            &before_rooms,
                            view.free_cpu(),
                            view.free_memory(),
                        );
                        // Growths within a thousandth of a GPU are equal, so the
                        // order below decides between them.
                        ((after - before) * 1000.0).round() as i128
                    }
                    None => {
                        i128::from(common_shape_fragmentation(&after_rooms))
                            - i128::from(common_shape_fragmentation(&before_rooms))
                    }
                };
                let free_whole = u64::from(view.usage.free_whole);
                // Most partly used GPUs first.
                let fewest_shared = u64::MAX - view.partly_used().count() as u64;
                let key = if mix.is_some() {
                    // FGD: the expected fragmentation growth decides first.
                    (growth, false, 0, 0)
                } else if fractional {
                    let breaks_free_gpu = after.free_whole < view.usage.free_whole;
                    (0, breaks_free_gpu, fewest_shared, free_whole)
                } else {
                    (0, false, free_whole, fewest_shared)
                };
                (key, growth, position, idx)
            })
            .min()
            .map(|(_, _, _, idx)| idx)
    }
}
