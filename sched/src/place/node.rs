//! One node as a search sees it: its usage, its free room, and how many
//! identical workers of a gang fit on it and where.
//!
//! Invariant: [`NodeView::place`] places exactly the workers that
//! [`NodeView::fit_count`] counted, so a gang the search found always fits.
//! Nothing here knows about other nodes or the pool's indexes.

use super::WHOLE_GPU;
use crate::{Amount, GPU_MILLI, GangShape, GpuShare, NodeSpec, WorkerPlacement};

/// What is allocated on one node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Usage {
    /// Thousandths used on each GPU, indexed like the node's GPUs.
    pub(super) gpu_used: Vec<u32>,
    /// CPU thousandths held.
    pub(super) cpu_milli: u64,
    /// Memory bytes held.
    pub(super) memory_bytes: u64,
    /// GPUs nothing is held on; cached because every index key uses it.
    pub(super) free_whole: u32,
}

impl Usage {
    /// Nothing held on a node with `gpus` GPUs.
    pub(super) fn empty(gpus: u32) -> Self {
        Self {
            gpu_used: vec![0; gpus as usize],
            cpu_milli: 0,
            memory_bytes: 0,
            free_whole: gpus,
        }
    }

    /// Recomputes `free_whole` after `gpu_used` changed.
    pub(super) fn recount(&mut self) {
        self.free_whole = self.gpu_used.iter().filter(|used| **used == 0).count() as u32;
    }

    /// Adds what `worker` holds; the caller has checked that it fits, or works on
    /// a scratch copy.
    pub(super) fn hold(&mut self, worker: &WorkerPlacement) {
        for share in &worker.gpus {
            if let Some(used) = self.gpu_used.get_mut(share.index as usize) {
                *used = used.saturating_add(share.milli);
            }
        }
        self.cpu_milli = self.cpu_milli.saturating_add(worker.cpu_milli);
        self.memory_bytes = self.memory_bytes.saturating_add(worker.memory_bytes);
        self.recount();
    }

    /// Takes away what `worker` held, never below zero, ignoring GPUs the node no
    /// longer has.
    pub(super) fn release(&mut self, worker: &WorkerPlacement) {
        for share in &worker.gpus {
            if let Some(used) = self.gpu_used.get_mut(share.index as usize) {
                *used = used.saturating_sub(share.milli);
            }
        }
        self.cpu_milli = self.cpu_milli.saturating_sub(worker.cpu_milli);
        self.memory_bytes = self.memory_bytes.saturating_sub(worker.memory_bytes);
        self.recount();
    }
}

/// One node in the pool.
#[derive(Debug, Clone)]
pub(super) struct NodeState {
    /// What it offers.
    pub(super) spec: NodeSpec,
    /// Whether it takes new work.
    pub(super) schedulable: bool,
    /// What is held on it.
    pub(super) usage: Usage,
}

impl NodeState {
    /// The node with its real usage.
    pub(super) fn view(&self) -> NodeView<'_> {
        NodeView {
            spec: &self.spec,
            usage: &self.usage,
            schedulable: self.schedulable,
        }
    }
}

/// A node as a search sees it: its spec with either its real usage or a
/// what-if usage (after freeing, in
/// [`NodePool::find_with_freed`](super::NodePool::find_with_freed)).
#[derive(Debug, Clone, Copy)]
pub(super) struct NodeView<'a> {
    pub(super) spec: &'a NodeSpec,
    pub(super) usage: &'a Usage,
    pub(super) schedulable: bool,
}

impl NodeView<'_> {
    /// Free thousandths on each GPU.
    pub(super) fn rooms(self) -> impl Iterator<Item = u32> {
        self.usage
            .gpu_used
            .iter()
            .map(|used| WHOLE_GPU.saturating_sub(*used))
    }

    /// CPU thousandths not held.
    pub(super) fn free_cpu(self) -> u64 {
        self.spec.cpu_milli.saturating_sub(self.usage.cpu_milli)
    }

    /// Memory bytes not held.
    pub(super) fn free_memory(self) -> u64 {
        self.spec
            .memory_bytes
            .saturating_sub(self.usage.memory_bytes)
    }

    /// Everything not held.
    pub(super) fn free(self) -> Amount {
        Amount {
            gpu_milli: self.rooms().map(u64::from).sum(),
            cpu_milli: self.free_cpu(),
            memory_bytes: self.free_memory(),
        }
    }

    /// Everything it offers.
    pub(super) fn capacity(self) -> Amount {
        Amount {
            gpu_milli: u64::from(self.spec.gpus) * GPU_MILLI,
            cpu_milli: self.spec.cpu_milli,
            memory_bytes: self.spec.memory_bytes,
        }
    }

    /// GPUs that are partly used (so neither free nor full).
    pub(super) fn partly_used(self) -> impl Iterator<Item = (u32, u32)> {
        self.rooms()
            .enumerate()
            .filter(|(_, room)| *room > 0 && *room < WHOLE_GPU)
            .map(|(gpu, room)| (gpu as u32, room))
    }

    /// How many workers of `demand` fit here now, at most `demand.workers`.
    /// Workers are identical, so each GPU independently holds `room / share`
    /// fractional workers, and the node as many as its scarcest resource allows.
    pub(super) fn fit_count(self, demand: &Demand) -> u64 {
        let mut count = demand.workers;
        match demand.gpu {
            GpuNeed::None => {}
            GpuNeed::Fraction(share) => {
                let slots: u64 = self.rooms().map(|room| u64::from(room / share)).sum();
                count = count.min(slots);
            }
            GpuNeed::Whole(gpus) => {
                count = count.min(u64::from(self.usage.free_whole / gpus));
            }
        }
        // Asking for none of a resource puts no limit on the count.
        if let Some(by_cpu) = self.free_cpu().checked_div(demand.cpu_milli) {
            count = count.min(by_cpu);
        }
        if let Some(by_memory) = self.free_memory().checked_div(demand.memory_bytes) {
            count = count.min(by_memory);
        }
        count
    }

    /// Places `count` workers here; the caller has checked [`Self::fit_count`].
    /// A fractional worker takes the GPU with the least room that fits it (so a
    /// partly used GPU before a free one); a whole-GPU worker takes the lowest
    /// free indices.
    pub(super) fn place(self, demand: &Demand, count: u64, out: &mut Vec<WorkerPlacement>) {
        let mut rooms: Vec<u32> = self.rooms().collect();
        for _ in 0..count {
            let gpus = match demand.gpu {
                GpuNeed::None => Vec::new(),
                GpuNeed::Fraction(share) => {
                    let (index, room) = rooms
                        .iter_mut()
                        .enumerate()
                        .filter(|(_, room)| **room >= share)
                        .min_by_key(|(index, room)| (**room, *index))
                        .expect("fit_count counted a GPU with room for this share");
                    *room -= share;
                    vec![GpuShare {
                        index: index as u32,
                        milli: share,
                    }]
                }
                GpuNeed::Whole(wanted) => {
                    let shares: Vec<GpuShare> = rooms
                        .iter_mut()
                        .enumerate()
                        .filter(|(_, room)| **room == WHOLE_GPU)
                        .take(wanted as usize)
                        .map(|(index, room)| {
                            *room = 0;
                            GpuShare {
                                index: index as u32,
                                milli: WHOLE_GPU,
                            }
                        })
                        .collect();
                    assert_eq!(shares.len(), wanted as usize, "fit_count counted free GPUs");
                    shares
                }
            };
            out.push(WorkerPlacement {
                node: self.spec.id,
                gpus,
                cpu_milli: demand.cpu_milli,
                memory_bytes: demand.memory_bytes,
            });
        }
    }

    /// Places one worker taking `share` of GPU `gpu`, which the caller has
    /// checked has room for it.
    pub(super) fn place_share_on(
        self,
        demand: &Demand,
        share: u32,
        gpu: u32,
        out: &mut Vec<WorkerPlacement>,
    ) {
        assert!(
            self.rooms()
                .nth(gpu as usize)
                .is_some_and(|room| room >= share),
            "the chosen GPU has room for the share"
        );
        out.push(WorkerPlacement {
            node: self.spec.id,
            gpus: vec![GpuShare {
                index: gpu,
                milli: share,
            }],
            cpu_milli: demand.cpu_milli,
            memory_bytes: demand.memory_bytes,
        });
    }
}

/// The GPU part of one worker's demand.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum GpuNeed {
    /// No GPU.
    None,
    /// Thousandths of one GPU, 1 to 999.
    Fraction(u32),
    /// Whole free GPUs, at least one.
    Whole(u32),
}

/// A gang's demand in the form the search uses.
#[derive(Debug, Clone, Copy)]
pub(super) struct Demand {
    /// Per worker.
    pub(super) gpu: GpuNeed,
    /// Per worker.
    pub(super) cpu_milli: u64,
    /// Per worker.
    pub(super) memory_bytes: u64,
    /// Workers in the gang.
    pub(super) workers: u64,
}

impl Demand {
    /// `None` for a GPU demand that is neither a fraction nor whole GPUs.
    pub(super) fn of(gang: &GangShape) -> Option<Self> {
        let milli = gang.per_worker.gpu_milli;
        let gpu = if milli == 0 {
            GpuNeed::None
        } else if milli < GPU_MILLI {
            GpuNeed::Fraction(milli as u32)
        } else if milli.is_multiple_of(GPU_MILLI) {
            GpuNeed::Whole(u32::try_from(milli / GPU_MILLI).ok()?)
        } else {
            return None;
        };
        Some(Self {
            gpu,
            cpu_milli: gang.per_worker.cpu_milli,
            memory_bytes: gang.per_worker.memory_bytes,
            workers: u64::from(gang.workers),
        })
    }

    /// Whether a worker needs any GPU.
    pub(super) fn needs_gpu(&self) -> bool {
        self.gpu != GpuNeed::None
    }

    /// The fewest whole free GPUs a node needs to hold `workers` workers with no
    /// help from partly used GPUs.
    pub(super) fn whole_gpus_for(&self, workers: u64) -> usize {
        match self.gpu {
            GpuNeed::None => 0,
            GpuNeed::Fraction(_) => 1,
            GpuNeed::Whole(gpus) => {
                usize::try_from(u64::from(gpus).saturating_mul(workers)).unwrap_or(usize::MAX)
            }
        }
    }
}

/// Whether a node carries every label the gang asks for and, when the gang needs
/// GPUs and names models, one of those models.
pub(super) fn matches_constraints(spec: &NodeSpec, gang: &GangShape, needs_gpu: bool) -> bool {
    let labels_match = gang
        .node_labels
        .iter()
        .all(|(key, value)| spec.labels.get(key) == Some(value));
    let model_matches = !needs_gpu
        || gang.gpu_models.is_empty()
        || spec
            .gpu_model
            .as_ref()
            .is_some_and(|model| gang.gpu_models.contains(model));
    labels_match && model_matches
}

/// `total += part`, saturating.
pub(super) fn add_amount(total: &mut Amount, part: Amount) {
    total.gpu_milli = total.gpu_milli.saturating_add(part.gpu_milli);
    total.cpu_milli = total.cpu_milli.saturating_add(part.cpu_milli);
    total.memory_bytes = total.memory_bytes.saturating_add(part.memory_bytes);
}

/// `total -= part`, never below zero.
pub(super) fn sub_amount(total: &mut Amount, part: Amount) {
    total.gpu_milli = total.gpu_milli.saturating_sub(part.gpu_milli);
    total.cpu_milli = total.cpu_milli.saturating_sub(part.cpu_milli);
    total.memory_bytes = total.memory_bytes.saturating_sub(part.memory_bytes);
}
