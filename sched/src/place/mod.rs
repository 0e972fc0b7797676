//! The node pool and gang placement: every node's capacity and what is held on
//! it, and where the workers of a gang can go.
//!
//! [`NodePool`] keeps each node's capacity (its [`NodeSpec`]) and its allocations
//! (thousandths used on each GPU, CPU thousandths, memory bytes), and answers
//! [`NodePool::find`] with one [`WorkerPlacement`] per worker or nothing. It does
//! not order trials and holds nothing by itself: the core calls
//! [`NodePool::allocate`] with what `find` returned, and [`NodePool::release`]
//! when the trial stops.
//!
//! Placement rules, in this order:
//! 1. A gang is placed whole or not at all, on schedulable nodes that carry all its
//!    labels and, when it needs GPUs and names models, one of its GPU models.
//! 2. A worker asking for less than one GPU gets a share of one GPU, packed onto
//!    the partly used GPU with the least room that still fits it; a worker asking
//!    for whole GPUs gets that many GPUs nobody uses.
//! 3. Topology: one node if one node holds the whole gang; else nodes of one rack
//!    (the `rack` label); else any nodes. Within a tier the fewest nodes are used.
//! 4. The [`Strategy`] picks among the nodes that fit (see its variants).
//!
//! `find` is complete: it returns a placement exactly when the nodes' free room,
//! counted node by node, holds the gang (the property tests check this against a
//! brute-force count).
//!
//! Invariants: no GPU holds more than 1000 thousandths, and no node more CPU or
//! memory than it offers (`allocate` checks the whole request against what is free
//! and changes nothing when any part fails); a node that is not schedulable gets
//! nothing new but keeps what it holds; every placement `find` returns is one that
//! `allocate` accepts.
//!
//! The parts live beside this file:
//! - `node`: one node's usage and how many workers of a gang it holds;
//! - `index`: the pool's search indexes and totals, kept in step with every
//!   change to a node;
//! - `search`: one search over the indexes, from the totals check to the node
//!   (or nodes) a strategy picks;
//! - `fragmentation`: the fragmentation-aware choice of one node (FGD when the
//!   pool has a workload mix);
//! - `mix`: the workload mix and the expected fragmentation FGD scores with;
//! - `multi_node`: gangs that no single node holds (fewest nodes, one rack,
//!   spread).
//!
//! Measured on 10,000 nodes of 8 GPUs (release build), 100,000 `find` calls on
//! a full pool take about 40 ms with bin-pack and 80 ms fragmentation-aware.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use xp_runtime::ids::NodeId;

use self::index::{ModelUsage, Narrowing, SharedKey};
use self::node::{Demand, NodeState, NodeView, Usage, matches_constraints};
use super::{Amount, GangShape, NodeSpec, WorkerPlacement};

mod fragmentation;
mod index;
mod mix;

pub use self::mix::{TaskMix, TaskType};
mod multi_node;
mod node;
mod search;

#[cfg(test)]
mod tests;

/// One whole GPU in the thousandths that the per-GPU counters hold.
const WHOLE_GPU: u32 = 1000;

/// How workers are spread over nodes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Strategy {
    /// Fill the fullest nodes that fit first (least free GPU, then least free CPU),
    /// so that whole nodes stay free for big gangs.
    #[default]
    BinPack,
    /// Prefer the emptiest nodes, and one worker per node when there are enough.
    Spread,
    /// Any fitting nodes, chosen at random from `seed` (a baseline for `xp sim`).
    /// The seed is mixed with a counter of the pool's changes, so successive
    /// placements with one seed differ while a replay gives the same choices.
    Random {
        /// Chooses among fitting nodes.
        seed: u64,
    },
    /// Bin-pack that also keeps idle capacity usable: fractional workers never
    /// break a free GPU while a shared one fits and gather on the nodes that
    /// already share most GPUs, whole-GPU work prefers such nodes among equally
    /// full ones, and the last tie-break is the growth of idle GPU that common
    /// shapes (a quarter GPU to eight GPUs) could not use. Confining fractional
    /// work lets the other nodes drain whole for big gangs.
    ///
    /// With a workload mix ([`NodePool::set_task_mix`]: the policy core's
    /// observed one, the recent trials' asks, or the trace's in `xp sim
    /// --place-once`) it is FGD ("Beware of Fragmentation", ATC 2023)
    /// instead: of the nodes that hold the gang, the one whose expected
    /// fragmentation against the mix (CPU, memory and GPU models included)
    /// grows least wins (ties go to the node whose CPU left stays in step
    /// with its GPUs left, then to bin-pack order), and a single fractional
    /// worker takes the GPU that makes it grow least.
    FragmentationAware,
}

/// Why an allocation was refused. Nothing is held when one is returned.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PlaceError {
    /// No node with this id is in the pool.
    #[error("unknown node {node}")]
    UnknownNode {
        /// The node.
        node: NodeId,
    },
    /// The node is draining or lost and takes no new work.
    #[error("node {node} is not schedulable")]
    NotSchedulable {
        /// The node.
        node: NodeId,
    },
    /// The node has no GPU with this index.
    #[error("node {node} has no GPU {index} (it has {gpus})")]
    GpuIndexOutOfRange {
        /// The node.
        node: NodeId,
        /// The GPU index asked for.
        index: u32,
        /// The node's GPUs.
        gpus: u32,
    },
    /// A share that is not between 1 and 1000 thousandths.
    #[error("share of {milli} thousandths of GPU {index} on node {node} is not 1 to 1000")]
    InvalidGpuShare {
        /// The node.
        node: NodeId,
        /// The GPU index.
        index: u32,
        /// The share asked for.
        milli: u32,
    },
    /// The shares asked of one GPU exceed what is free on it.
    #[error("GPU {index} on node {node}: {requested} thousandths requested, {free} free")]
    GpuOverCapacity {
        /// The node.
        node: NodeId,
        /// The GPU index.
        index: u32,
        /// Thousandths asked for, all workers of the request together.
        requested: u64,
        /// Thousandths free.
        free: u64,
    },
    /// The CPU asked of one node exceeds what is free on it.
    #[error("node {node}: {requested} CPU thousandths requested, {free} free")]
    CpuOverCapacity {
        /// The node.
        node: NodeId,
        /// CPU thousandths asked for, all workers of the request together.
        requested: u64,
        /// CPU thousandths free.
        free: u64,
    },
    /// The memory asked of one node exceeds what is free on it.
    #[error("node {node}: {requested} memory bytes requested, {free} free")]
    MemoryOverCapacity {
        /// The node.
        node: NodeId,
        /// Memory bytes asked for, all workers of the request together.
        requested: u64,
        /// Memory bytes free.
        free: u64,
    },
}

/// Every node's capacity and what is allocated on it.
///
/// Nodes live in a dense vector (removal swaps the last node in), found by id
/// through a map; only schedulable nodes are in the search indexes and totals.
#[derive(Debug, Clone, Default)]
pub struct NodePool {
    nodes: Vec<NodeState>,
    index_of: HashMap<NodeId, usize>,
    /// Schedulable nodes by whole free GPUs: bucket `b` holds `(free CPU, node
    /// index)` of the nodes with exactly `b` free GPUs, so bin-pack walks up from
    /// the smallest bucket that suffices and spread down from the largest.
    by_free_whole: Vec<BTreeSet<(u64, usize)>>,
    /// Partly used GPUs of schedulable nodes, so a fractional worker finds the
    /// tightest GPU on a node with enough CPU in O(D log n) for D distinct rooms.
    shared: BTreeSet<SharedKey>,
    /// Partly used GPUs of schedulable nodes by room (index 0 to 999), so that
    /// the fractional workers all idle GPUs hold is counted exactly in O(1000).
    shared_by_room: Vec<u64>,
    /// Schedulable nodes by label key, then value.
    by_label: BTreeMap<String, BTreeMap<String, BTreeSet<usize>>>,
    /// Schedulable nodes by GPU model.
    by_model: BTreeMap<String, BTreeSet<usize>>,
    /// Per GPU model, its schedulable nodes keyed like `by_free_whole` and
    /// `shared` (a model's entry stays, empty, once it has had nodes).
    model_usage: BTreeMap<String, ModelUsage>,
    /// The schedulable nodes' capacity.
    capacity_total: Amount,
    /// What is free on the schedulable nodes.
    free_total: Amount,
    /// Idle thousandths on partly used GPUs of schedulable nodes.
    shared_room_total: u64,
    /// Counts changes, so that random placement varies between calls.
    generation: u64,
    /// The workload mix fragmentation-aware placement scores against; `None`
    /// keeps the bin-pack-first order (see [`Strategy::FragmentationAware`]).
    task_mix: Option<TaskMix>,
}

/// What an allocation asks of one node: thousandths per GPU index, CPU and memory.
#[derive(Default)]
struct NodeRequest {
    gpus: BTreeMap<u32, u64>,
    cpu_milli: u64,
    memory_bytes: u64,
}

impl NodePool {
    /// An empty pool.
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds a node, schedulable, or updates its capacity and labels keeping its
    /// allocations and its schedulable flag. GPUs beyond a smaller new count are
    /// forgotten with what was held on them.
    pub fn upsert_node(&mut self, spec: NodeSpec) {
        if let Some(&idx) = self.index_of.get(&spec.id) {
            self.unindex(idx);
            let node = &mut self.nodes[idx];
            node.usage.gpu_used.resize(spec.gpus as usize, 0);
            node.usage.recount();
            node.spec = spec;
            self.index(idx);
        } else {
            let idx = self.nodes.len();
            self.index_of.insert(spec.id, idx);
            self.nodes.push(NodeState {
                usage: Usage::empty(spec.gpus),
                spec,
                schedulable: true,
            });
            self.index(idx);
        }
        self.generation += 1;
    }

    /// Removes a node and its allocations; false if unknown.
    pub fn remove_node(&mut self, id: NodeId) -> bool {
        let Some(idx) = self.index_of.remove(&id) else {
            return false;
        };
        self.unindex(idx);
        let last = self.nodes.len() - 1;
        if idx != last {
            // The last node moves into the hole; its index keys change with it.
            self.unindex(last);
            self.nodes.swap_remove(idx);
            self.index_of.insert(self.nodes[idx].spec.id, idx);
            self.index(idx);
        } else {
            self.nodes.pop();
        }
        self.generation += 1;
        true
    }

    /// A node that is not schedulable keeps its allocations but gets no new work.
    pub fn set_schedulable(&mut self, id: NodeId, schedulable: bool) {
        let Some(&idx) = self.index_of.get(&id) else {
            return;
        };
        if self.nodes[idx].schedulable == schedulable {
            return;
        }
        self.unindex(idx);
        self.nodes[idx].schedulable = schedulable;
        self.index(idx);
        self.generation += 1;
    }

    /// Where the gang would go now, worker `i` at index `i`, or `None` if it does
    /// not fit whole (or asks for a GPU amount that is neither a fraction nor
    /// whole GPUs). `gang.spread` turns every strategy but random into spread.
    pub fn find(&self, gang: &GangShape, strategy: Strategy) -> Option<Vec<WorkerPlacement>> {
        self.search(gang, strategy, &BTreeMap::new())
    }

    /// As [`NodePool::find`], as if the allocations in `freed` were released.
    /// The pool is not changed; only the touched nodes' allocations are copied.
    pub fn find_with_freed(
        &self,
        gang: &GangShape,
        strategy: Strategy,
        freed: &[&[WorkerPlacement]],
    ) -> Option<Vec<WorkerPlacement>> {
        let mut overlay: BTreeMap<usize, Usage> = BTreeMap::new();
        for workers in freed {
            for worker in *workers {
                if let Some(&idx) = self.index_of.get(&worker.node) {
                    overlay
                        .entry(idx)
                        .or_insert_with(|| self.nodes[idx].usage.clone())
                        .release(worker);
                }
            }
        }
        self.search(gang, strategy, &overlay)
    }

    /// Whether the gang would fit on the schedulable nodes if they were empty.
    /// Stops at the first nodes that hold it: O(n) at worst.
    pub fn could_ever_fit(&self, gang: &GangShape) -> bool {
        let Some(demand) = Demand::of(gang) else {
            return false;
        };
        if demand.workers == 0 {
            return true;
        }
        let mut held = 0_u64;
        let mut holds_rest = |idx: usize| {
            let node = &self.nodes[idx];
            if !node.schedulable || !matches_constraints(&node.spec, gang, demand.needs_gpu()) {
                return false;
            }
            let empty = Usage::empty(node.spec.gpus);
            let view = NodeView {
                spec: &node.spec,
                usage: &empty,
                schedulable: true,
            };
            held = held.saturating_add(view.fit_count(&demand));
            held >= demand.workers
        };
        match self.narrowing(gang, demand.needs_gpu()) {
            Narrowing::Nothing => false,
            Narrowing::Any => (0..self.nodes.len()).any(holds_rest),
            Narrowing::Among(sets) => sets.into_iter().flatten().any(|idx| holds_rest(*idx)),
            Narrowing::OneModel(model) => self.model_nodes(model).any(|idx| holds_rest(*idx)),
        }
    }

    /// Holds the resources of `workers`, all or nothing: every worker's node must
    /// be known and schedulable and every share in range, and the request as a
    /// whole (workers sharing a GPU or node add up) must fit what is free.
    pub fn allocate(&mut self, workers: &[WorkerPlacement]) -> Result<(), PlaceError> {
        let requests = self.requests_by_node(workers)?;
        self.check_room(&requests)?;
        for (idx, request) in requests {
            self.update_usage(idx, |usage| {
                for (index, milli) in &request.gpus {
                    // Checked above: the sum stays within one GPU.
                    usage.gpu_used[*index as usize] += *milli as u32;
                }
                usage.cpu_milli += request.cpu_milli;
                usage.memory_bytes += request.memory_bytes;
            });
        }
        self.generation += 1;
        Ok(())
    }

    /// What `workers` ask of each node (by index), summed; refused when a node
    /// is unknown or not schedulable, or a share is out of range.
    fn requests_by_node(
        &self,
        workers: &[WorkerPlacement],
    ) -> Result<BTreeMap<usize, NodeRequest>, PlaceError> {
        let mut requests: BTreeMap<usize, NodeRequest> = BTreeMap::new();
        for worker in workers {
            let node = worker.node;
            let idx = *self
                .index_of
                .get(&node)
                .ok_or(PlaceError::UnknownNode { node })?;
            let state = &self.nodes[idx];
            if !state.schedulable {
                return Err(PlaceError::NotSchedulable { node });
            }
            let request = requests.entry(idx).or_default();
            for share in &worker.gpus {
                if share.index >= state.spec.gpus {
                    return Err(PlaceError::GpuIndexOutOfRange {
                        node,
                        index: share.index,
                        gpus: state.spec.gpus,
                    });
                }
                if share.milli == 0 || share.milli > WHOLE_GPU {
                    return Err(PlaceError::InvalidGpuShare {
                        node,
                        index: share.index,
                        milli: share.milli,
                    });
                }
                *request.gpus.entry(share.index).or_default() += u64::from(share.milli);
            }
            request.cpu_milli = request.cpu_milli.saturating_add(worker.cpu_milli);
            request.memory_bytes = request.memory_bytes.saturating_add(worker.memory_bytes);
        }
        Ok(requests)
    }

    /// Whether each node has the room `requests` ask of it: every GPU, CPU and
    /// memory.
    fn check_room(&self, requests: &BTreeMap<usize, NodeRequest>) -> Result<(), PlaceError> {
        for (idx, request) in requests {
            let view = self.nodes[*idx].view();
            let node = view.spec.id;
            for (index, requested) in &request.gpus {
                let free =
                    u64::from(WHOLE_GPU.saturating_sub(view.usage.gpu_used[*index as usize]));
                if *requested > free {
                    return Err(PlaceError::GpuOverCapacity {
                        node,
                        index: *index,
                        requested: *requested,
                        free,
                    });
                }
            }
            if request.cpu_milli > view.free_cpu() {
                return Err(PlaceError::CpuOverCapacity {
                    node,
                    requested: request.cpu_milli,
                    free: view.free_cpu(),
                });
            }
            if request.memory_bytes > view.free_memory() {
                return Err(PlaceError::MemoryOverCapacity {
                    node,
                    requested: request.memory_bytes,
                    free: view.free_memory(),
                });
            }
        }
        Ok(())
    }

    /// Gives back what `workers` held (on nodes still present), never going
    /// below zero.
    pub fn release(&mut self, workers: &[WorkerPlacement]) {
        for worker in workers {
            if let Some(&idx) = self.index_of.get(&worker.node) {
                self.update_usage(idx, |usage| usage.release(worker));
            }
        }
        self.generation += 1;
    }

    /// The schedulable nodes' total capacity.
    pub fn capacity(&self) -> Amount {
        self.capacity_total
    }

    /// What is free on schedulable nodes.
    pub fn free(&self) -> Amount {
        self.free_total
    }

    /// The share of idle GPU capacity (on schedulable nodes) that a worker asking
    /// for one whole GPU could not use: idle thousandths on partly used GPUs over
    /// all idle thousandths, in `[0, 1]`; 0 when nothing is idle. It is the
    /// simplest standard measure (the fragmentation of "Beware of Fragmentation"
    /// for a workload of one-GPU tasks), cheap because the pool keeps both sums.
    pub fn idle_gpu_fragmentation(&self) -> f64 {
        if self.free_total.gpu_milli == 0 {
            return 0.0;
        }
        self.shared_room_total as f64 / self.free_total.gpu_milli as f64
    }

    /// Sets the workload mix that fragmentation-aware placement measures
    /// expected fragmentation against (see [`TaskMix`]); it changes no
    /// allocation.
    pub fn set_task_mix(&mut self, mix: Option<TaskMix>) {
        self.task_mix = mix;
    }

    /// The workload mix fragmentation-aware placement scores against, if set.
    pub fn task_mix(&self) -> Option<&TaskMix> {
        self.task_mix.as_ref()
    }

    /// Nodes in the pool, schedulable or not.
    pub fn node_count(&self) -> usize {
        self.nodes.len()
    }

    /// Every node's spec and whether it is schedulable.
    pub fn nodes(&self) -> impl Iterator<Item = (&NodeSpec, bool)> + '_ {
        self.nodes.iter().map(|node| (&node.spec, node.schedulable))
    }

    /// What is free on one node (schedulable or not); `None` if unknown.
    pub fn node_free(&self, id: NodeId) -> Option<Amount> {
        let idx = *self.index_of.get(&id)?;
        Some(self.nodes[idx].view().free())
    }

    /// Thousandths used on each GPU of one node; `None` if unknown.
    pub fn node_gpu_used(&self, id: NodeId) -> Option<&[u32]> {
        let idx = *self.index_of.get(&id)?;
        Some(&self.nodes[idx].usage.gpu_used)
    }

    /// Whether a node takes new work; `None` if unknown.
    pub fn is_schedulable(&self, id: NodeId) -> Option<bool> {
        let idx = *self.index_of.get(&id)?;
        Some(self.nodes[idx].schedulable)
    }
}
