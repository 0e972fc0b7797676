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
//! Indexes and complexity (n schedulable nodes, G GPUs on the largest node, W
//! workers in the gang, D distinct rooms among partly used GPUs): the pool keeps
//! schedulable nodes in buckets by whole free GPUs, each an ordered set keyed by
//! free CPU; the partly used GPUs in one ordered set keyed by room, then the
//! node's free CPU; a count of partly used GPUs per room; total free amounts;
//! and node sets per label and per GPU model. Every change to a node re-keys
//! only that node: O(G log n).
//! - A gang refused by the totals (free CPU, memory or GPU; workers the free
//!   GPUs hold, counted GPU by GPU; no node with its labels or models): O(G),
//!   or O(1000) for fractional workers.
//! - Bin-pack and spread, one node: a walk over the buckets from the smallest
//!   (bin-pack) or largest (spread) that can suffice, each entered at the least
//!   CPU that suffices, and for fractional workers over the partly used GPUs
//!   with room, one seek per distinct room: O(G log n + D log n) plus the nodes
//!   skipped for memory or constraints, which are not indexed.
//! - Fragmentation-aware: as bin-pack, but scores at most eight fitting nodes
//!   per bucket and eight with shared room for fractions, each in O(G).
//! - Random, one node: 32 uniform probes, then a list of every fitting node.
//! - Gangs that need several nodes: every node that holds a worker is visited,
//!   O(c log c) for c such nodes (spread stops at the first rack with enough).
//! - Labels and models: when the nodes carrying the rarest label (or the models)
//!   are fewer than the nodes with room, only those are visited.
//! - [`NodePool::find_with_freed`]: as `find`, plus O(t·G log t) for the t nodes
//!   the freed allocations touch; only those nodes' allocations are copied.
//!
//! Measured on 10,000 nodes of 8 GPUs (release build), 100,000 `find` calls on
//! a full pool take about 40 ms with bin-pack and 80 ms fragmentation-aware.

use std::cmp::Reverse;
use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::iter::Peekable;

use xp_runtime::ids::NodeId;
use xp_runtime::seeded::SplitMix64;

use super::{Amount, GPU_MILLI, GangShape, GpuShare, NodeSpec, WorkerPlacement};

/// One whole GPU in the thousandths that the per-GPU counters hold.
const WHOLE_GPU: u32 = 1000;

/// Fragmentation-aware placement scores at most this many nodes from the tight
/// end (least free CPU) of each whole-free-GPU bucket...
const FRAGMENTATION_CANDIDATES_LOW: usize = 6;
/// ...and this many from the loose end, so that a node with CPU to spare is
/// among the candidates too.
const FRAGMENTATION_CANDIDATES_HIGH: usize = 2;
/// Fragmentation-aware placement of a fractional worker scores at most this many
/// nodes that have a partly used GPU with room for it.
const FRAGMENTATION_CANDIDATES_SHARED: usize = 8;

/// Random placement first draws this many nodes uniformly and keeps the first
/// that holds the gang, before it lists every node that does.
const RANDOM_PROBES: usize = 32;

/// Worker shapes (GPU thousandths) that fragmentation-aware placement keeps
/// idle capacity usable for, as a last tie-break: the common sizes from a
/// quarter GPU to a whole 8-GPU machine.
const COMMON_SHAPES: [u32; 6] = [250, 500, 1000, 2000, 4000, 8000];

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

/// What is allocated on one node.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Usage {
    /// Thousandths used on each GPU, indexed like the node's GPUs.
    gpu_used: Vec<u32>,
    /// CPU thousandths held.
    cpu_milli: u64,
    /// Memory bytes held.
    memory_bytes: u64,
    /// GPUs nothing is held on; cached because every index key uses it.
    free_whole: u32,
}

impl Usage {
    fn empty(gpus: u32) -> Self {
        Self {
            gpu_used: vec![0; gpus as usize],
            cpu_milli: 0,
            memory_bytes: 0,
            free_whole: gpus,
        }
    }

    fn recount(&mut self) {
        self.free_whole = self.gpu_used.iter().filter(|used| **used == 0).count() as u32;
    }

    /// Adds what `worker` holds; the caller has checked that it fits, or works on
    /// a scratch copy.
    fn hold(&mut self, worker: &WorkerPlacement) {
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
    fn release(&mut self, worker: &WorkerPlacement) {
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
struct NodeState {
    spec: NodeSpec,
    schedulable: bool,
    usage: Usage,
}

impl NodeState {
    fn view(&self) -> NodeView<'_> {
        NodeView {
            spec: &self.spec,
            usage: &self.usage,
            schedulable: self.schedulable,
        }
    }
}

/// A node as a search sees it: its spec with either its real usage or a
/// what-if usage (after freeing, in [`NodePool::find_with_freed`]).
#[derive(Debug, Clone, Copy)]
struct NodeView<'a> {
    spec: &'a NodeSpec,
    usage: &'a Usage,
    schedulable: bool,
}

impl NodeView<'_> {
    /// Free thousandths on each GPU.
    fn rooms(self) -> impl Iterator<Item = u32> {
        self.usage
            .gpu_used
            .iter()
            .map(|used| WHOLE_GPU.saturating_sub(*used))
    }

    fn free_cpu(self) -> u64 {
        self.spec.cpu_milli.saturating_sub(self.usage.cpu_milli)
    }

    fn free_memory(self) -> u64 {
        self.spec
            .memory_bytes
            .saturating_sub(self.usage.memory_bytes)
    }

    fn free(self) -> Amount {
        Amount {
            gpu_milli: self.rooms().map(u64::from).sum(),
            cpu_milli: self.free_cpu(),
            memory_bytes: self.free_memory(),
        }
    }

    fn capacity(self) -> Amount {
        Amount {
            gpu_milli: u64::from(self.spec.gpus) * GPU_MILLI,
            cpu_milli: self.spec.cpu_milli,
            memory_bytes: self.spec.memory_bytes,
        }
    }

    /// GPUs that are partly used (so neither free nor full).
    fn partly_used(self) -> impl Iterator<Item = (u32, u32)> {
        self.rooms()
            .enumerate()
            .filter(|(_, room)| *room > 0 && *room < WHOLE_GPU)
            .map(|(gpu, room)| (gpu as u32, room))
    }

    /// How many workers of `demand` fit here now, at most `demand.workers`.
    /// Workers are identical, so each GPU independently holds `room / share`
    /// fractional workers, and the node as many as its scarcest resource allows.
    fn fit_count(self, demand: &Demand) -> u64 {
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
    fn place(self, demand: &Demand, count: u64, out: &mut Vec<WorkerPlacement>) {
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
}

/// The GPU part of one worker's demand.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum GpuNeed {
    None,
    /// Thousandths of one GPU, 1 to 999.
    Fraction(u32),
    /// Whole free GPUs, at least one.
    Whole(u32),
}

/// A gang's demand in the form the search uses.
#[derive(Debug, Clone, Copy)]
struct Demand {
    gpu: GpuNeed,
    cpu_milli: u64,
    memory_bytes: u64,
    workers: u64,
}

impl Demand {
    /// `None` for a GPU demand that is neither a fraction nor whole GPUs.
    fn of(gang: &GangShape) -> Option<Self> {
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

    fn needs_gpu(&self) -> bool {
        self.gpu != GpuNeed::None
    }

    /// The fewest whole free GPUs a node needs to hold `workers` workers with no
    /// help from partly used GPUs.
    fn whole_gpus_for(&self, workers: u64) -> usize {
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
fn matches_constraints(spec: &NodeSpec, gang: &GangShape, needs_gpu: bool) -> bool {
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

fn add_amount(total: &mut Amount, part: Amount) {
    total.gpu_milli = total.gpu_milli.saturating_add(part.gpu_milli);
    total.cpu_milli = total.cpu_milli.saturating_add(part.cpu_milli);
    total.memory_bytes = total.memory_bytes.saturating_add(part.memory_bytes);
}

fn sub_amount(total: &mut Amount, part: Amount) {
    total.gpu_milli = total.gpu_milli.saturating_sub(part.gpu_milli);
    total.cpu_milli = total.cpu_milli.saturating_sub(part.cpu_milli);
    total.memory_bytes = total.memory_bytes.saturating_sub(part.memory_bytes);
}

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
    /// The schedulable nodes' capacity.
    capacity_total: Amount,
    /// What is free on the schedulable nodes.
    free_total: Amount,
    /// Idle thousandths on partly used GPUs of schedulable nodes.
    shared_room_total: u64,
    /// Counts changes, so that random placement varies between calls.
    generation: u64,
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
        }
    }

    /// Holds the resources of `workers`, all or nothing: every worker's node must
    /// be known and schedulable and every share in range, and the request as a
    /// whole (workers sharing a GPU or node add up) must fit what is free.
    pub fn allocate(&mut self, workers: &[WorkerPlacement]) -> Result<(), PlaceError> {
        #[derive(Default)]
        struct Request {
            gpus: BTreeMap<u32, u64>,
            cpu_milli: u64,
            memory_bytes: u64,
        }
        let mut requests: BTreeMap<usize, Request> = BTreeMap::new();
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
        for (idx, request) in &requests {
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

    fn search(
        &self,
        gang: &GangShape,
        strategy: Strategy,
        overlay: &BTreeMap<usize, Usage>,
    ) -> Option<Vec<WorkerPlacement>> {
        let demand = Demand::of(gang)?;
        if demand.workers == 0 {
            return Some(Vec::new());
        }
        let search = Search::new(self, gang, demand, overlay)?;
        let strategy = match strategy {
            Strategy::Random { .. } => strategy,
            _ if gang.spread => Strategy::Spread,
            _ => strategy,
        };
        let mut rng = match strategy {
            Strategy::Random { seed } => {
                SplitMix64::new(seed ^ self.generation.wrapping_mul(0xD1B5_4A32_D192_ED03))
            }
            _ => SplitMix64::new(0),
        };
        let assignment = if strategy == Strategy::Spread && demand.workers > 1 {
            search.spread_over_nodes()?
        } else if let Some(idx) = search.pick_single(strategy, &mut rng) {
            vec![(idx, demand.workers)]
        } else if demand.workers > 1 {
            search.pack_over_nodes(strategy, &mut rng)?
        } else {
            return None;
        };
        let mut placements = Vec::with_capacity(demand.workers as usize);
        for (idx, count) in assignment {
            search.view(idx).place(&demand, count, &mut placements);
        }
        assert_eq!(
            placements.len() as u64,
            demand.workers,
            "a gang is placed whole"
        );
        Some(placements)
    }

    /// The node sets that a gang's constraints narrow the search to.
    fn narrowing(&self, gang: &GangShape, needs_gpu: bool) -> Narrowing<'_> {
        let mut best: Option<(usize, Vec<&BTreeSet<usize>>)> = None;
        for (key, value) in &gang.node_labels {
            let Some(set) = self.by_label.get(key).and_then(|values| values.get(value)) else {
                return Narrowing::Nothing;
            };
            if best.as_ref().is_none_or(|(size, _)| set.len() < *size) {
                best = Some((set.len(), vec![set]));
            }
        }
        if needs_gpu && !gang.gpu_models.is_empty() {
            let models: BTreeSet<&String> = gang.gpu_models.iter().collect();
            let sets: Vec<&BTreeSet<usize>> = models
                .into_iter()
                .filter_map(|model| self.by_model.get(model))
                .collect();
            if sets.is_empty() {
                return Narrowing::Nothing;
            }
            let size = sets.iter().map(|set| set.len()).sum();
            if best.as_ref().is_none_or(|(best_size, _)| size < *best_size) {
                best = Some((size, sets));
            }
        }
        best.map_or(Narrowing::Any, |(_, sets)| Narrowing::Among(sets))
    }

    /// Adds a node to the indexes and totals if it is schedulable.
    fn index(&mut self, idx: usize) {
        self.index_usage(idx);
        let node = &self.nodes[idx];
        if !node.schedulable {
            return;
        }
        for (key, value) in &node.spec.labels {
            self.by_label
                .entry(key.clone())
                .or_default()
                .entry(value.clone())
                .or_default()
                .insert(idx);
        }
        if let Some(model) = &node.spec.gpu_model {
            self.by_model.entry(model.clone()).or_default().insert(idx);
        }
    }

    /// Takes a node out of the indexes and totals; the mirror of [`Self::index`].
    fn unindex(&mut self, idx: usize) {
        self.unindex_usage(idx);
        let node = &self.nodes[idx];
        if !node.schedulable {
            return;
        }
        for (key, value) in &node.spec.labels {
            if let Some(values) = self.by_label.get_mut(key) {
                if let Some(set) = values.get_mut(value) {
                    set.remove(&idx);
                    if set.is_empty() {
                        values.remove(value);
                    }
                }
                if values.is_empty() {
                    self.by_label.remove(key);
                }
            }
        }
        if let Some(model) = &node.spec.gpu_model
            && let Some(set) = self.by_model.get_mut(model)
        {
            set.remove(&idx);
            if set.is_empty() {
                self.by_model.remove(model);
            }
        }
    }

    /// Adds a node's usage-dependent keys (bucket, partly used GPUs, totals).
    fn index_usage(&mut self, idx: usize) {
        let view = self.nodes[idx].view();
        if !view.schedulable {
            return;
        }
        let bucket = view.usage.free_whole as usize;
        if self.by_free_whole.len() <= bucket {
            self.by_free_whole.resize_with(bucket + 1, BTreeSet::new);
        }
        self.by_free_whole[bucket].insert((view.free_cpu(), idx));
        for (gpu, room) in view.partly_used() {
            self.shared.insert((room, view.free_cpu(), idx, gpu));
            self.shared_room_total += u64::from(room);
            if self.shared_by_room.len() < WHOLE_GPU as usize {
                self.shared_by_room.resize(WHOLE_GPU as usize, 0);
            }
            self.shared_by_room[room as usize] += 1;
        }
        add_amount(&mut self.capacity_total, view.capacity());
        add_amount(&mut self.free_total, view.free());
    }

    /// Removes what [`Self::index_usage`] added; call before the usage changes.
    fn unindex_usage(&mut self, idx: usize) {
        let view = self.nodes[idx].view();
        if !view.schedulable {
            return;
        }
        let bucket = view.usage.free_whole as usize;
        self.by_free_whole[bucket].remove(&(view.free_cpu(), idx));
        for (gpu, room) in view.partly_used() {
            self.shared.remove(&(room, view.free_cpu(), idx, gpu));
            self.shared_room_total -= u64::from(room);
            self.shared_by_room[room as usize] -= 1;
        }
        sub_amount(&mut self.capacity_total, view.capacity());
        sub_amount(&mut self.free_total, view.free());
    }

    /// Changes a node's usage, re-keying it in the indexes.
    fn update_usage(&mut self, idx: usize, change: impl FnOnce(&mut Usage)) {
        self.unindex_usage(idx);
        let usage = &mut self.nodes[idx].usage;
        change(usage);
        usage.recount();
        self.index_usage(idx);
    }

    /// Rebuilds every index from the nodes and asserts that it equals the kept one.
    #[cfg(test)]
    fn check_indexes(&self) {
        let mut rebuilt = Self {
            nodes: self.nodes.clone(),
            index_of: self.index_of.clone(),
            ..Self::default()
        };
        for idx in 0..rebuilt.nodes.len() {
            rebuilt.index(idx);
        }
        for (idx, node) in self.nodes.iter().enumerate() {
            assert_eq!(self.index_of[&node.spec.id], idx);
            assert_eq!(node.usage.gpu_used.len(), node.spec.gpus as usize);
        }
        assert_eq!(self.index_of.len(), self.nodes.len());
        let non_empty = |buckets: &Vec<BTreeSet<(u64, usize)>>| -> Vec<(usize, Vec<(u64, usize)>)> {
            buckets
                .iter()
                .enumerate()
                .filter(|(_, set)| !set.is_empty())
                .map(|(bucket, set)| (bucket, set.iter().copied().collect()))
                .collect()
        };
        assert_eq!(
            non_empty(&self.by_free_whole),
            non_empty(&rebuilt.by_free_whole)
        );
        assert_eq!(self.shared, rebuilt.shared);
        let non_zero = |counts: &Vec<u64>| -> Vec<(usize, u64)> {
            counts
                .iter()
                .copied()
                .enumerate()
                .filter(|(_, count)| *count > 0)
                .collect()
        };
        assert_eq!(
            non_zero(&self.shared_by_room),
            non_zero(&rebuilt.shared_by_room)
        );
        assert_eq!(self.by_label, rebuilt.by_label);
        assert_eq!(self.by_model, rebuilt.by_model);
        assert_eq!(self.capacity_total, rebuilt.capacity_total);
        assert_eq!(self.free_total, rebuilt.free_total);
        assert_eq!(self.shared_room_total, rebuilt.shared_room_total);
    }
}

/// Where a gang's constraints let it go.
enum Narrowing<'a> {
    /// No constraint narrows the search.
    Any,
    /// No schedulable node carries a label, or any of the models.
    Nothing,
    /// Only nodes in one of these sets can match (then check all constraints).
    Among(Vec<&'a BTreeSet<usize>>),
}

/// The nodes a constrained gang can use, indexed like the pool's indexes.
struct ListIndex {
    /// `(free CPU, node index)` by whole free GPUs, sorted.
    buckets: Vec<Vec<(u64, usize)>>,
    /// Partly used GPUs, sorted.
    shared: Vec<SharedKey>,
    /// The nodes, for random probes.
    nodes: Vec<usize>,
}

/// A node that can hold at least one worker of a gang that needs several nodes.
#[derive(Debug, Clone, Copy)]
struct Candidate<'a> {
    idx: usize,
    /// Workers it holds, at most the gang's.
    fits: u64,
    free_gpu_milli: u64,
    rack: Option<&'a str>,
}

/// Merges two iterators sorted the same way (ascending, or descending).
struct Merge<I: Iterator> {
    left: Peekable<I>,
    right: Peekable<I>,
    descending: bool,
}

impl<K: Ord, I: Iterator<Item = K>> Iterator for Merge<I> {
    type Item = K;

    fn next(&mut self) -> Option<K> {
        let take_left = match (self.left.peek(), self.right.peek()) {
            (Some(left), Some(right)) => {
                if self.descending {
                    left >= right
                } else {
                    left <= right
                }
            }
            (Some(_), None) => true,
            (None, _) => false,
        };
        if take_left {
            self.left.next()
        } else {
            self.right.next()
        }
    }
}

type NodeStream<'s> = Box<dyn Iterator<Item = usize> + 's>;

/// A partly used GPU: `(room, node's free CPU, node index, GPU index)`. Sorted,
/// the tightest GPUs come first and, among equal rooms, the nodes with least CPU.
type SharedKey = (u32, u64, usize, u32);

type SharedStream<'s> = Box<dyn Iterator<Item = SharedKey> + 's>;

/// Partly used GPUs with at least `min_room` room on nodes with at least
/// `min_cpu` free CPU, in key order: for each distinct room (found by one seek)
/// the range of nodes with enough CPU (another seek), so nodes short of CPU are
/// skipped without being visited.
fn skip_scan_set(set: &BTreeSet<SharedKey>, min_room: u32, min_cpu: u64) -> SharedStream<'_> {
    let first_room_from = move |from: u32| set.range((from, 0, 0, 0)..).next().map(|key| key.0);
    Box::new(
        std::iter::successors(first_room_from(min_room), move |room| {
            room.checked_add(1).and_then(first_room_from)
        })
        .flat_map(move |room| {
            set.range((room, min_cpu, 0, 0)..=(room, u64::MAX, usize::MAX, u32::MAX))
                .copied()
        }),
    )
}

/// [`skip_scan_set`] over a sorted slice.
fn skip_scan_slice(entries: &[SharedKey], min_room: u32, min_cpu: u64) -> SharedStream<'_> {
    let first_room_from = move |from: u32| {
        let at = entries.partition_point(|key| key.0 < from);
        entries.get(at).map(|key| key.0)
    };
    Box::new(
        std::iter::successors(first_room_from(min_room), move |room| {
            room.checked_add(1).and_then(first_room_from)
        })
        .flat_map(move |room| {
            let from = entries.partition_point(|key| (key.0, key.1) < (room, min_cpu));
            let to = entries.partition_point(|key| key.0 <= room).max(from);
            entries[from..to].iter().copied()
        }),
    )
}

/// One search: the pool as seen with the what-if usage of touched nodes, and, for
/// a gang whose labels or models select few nodes, a private index of those.
struct Search<'a> {
    pool: &'a NodePool,
    gang: &'a GangShape,
    demand: Demand,
    /// Touched nodes' usage after the what-if release; empty for plain `find`.
    overlay: &'a BTreeMap<usize, Usage>,
    /// Schedulable overlay nodes, keyed like `by_free_whole`, sorted.
    overlay_buckets: Vec<Vec<(u64, usize)>>,
    /// Partly used GPUs of schedulable overlay nodes, sorted.
    overlay_shared: Vec<SharedKey>,
    list: Option<ListIndex>,
    n_buckets: usize,
}

impl<'a> Search<'a> {
    /// Prepares a search, or `None` when counts alone show that the gang cannot
    /// fit: O(G + t log t) for t overlay nodes, plus O(l log l) when a constraint
    /// narrows the search to l nodes.
    fn new(
        pool: &'a NodePool,
        gang: &'a GangShape,
        demand: Demand,
        overlay: &'a BTreeMap<usize, Usage>,
    ) -> Option<Self> {
        let narrowing = pool.narrowing(gang, demand.needs_gpu());
        if matches!(narrowing, Narrowing::Nothing) {
            return None;
        }
        let mut bucket_sizes: Vec<u64> = pool
            .by_free_whole
            .iter()
            .map(|set| set.len() as u64)
            .collect();
        let mut shared_count = pool.shared.len() as u64;
        // Fractional workers that partly used GPUs hold, exactly.
        let partial_slots = |view: NodeView<'_>| -> u64 {
            match demand.gpu {
                GpuNeed::Fraction(share) => view
                    .partly_used()
                    .map(|(_, room)| u64::from(room / share))
                    .sum(),
                GpuNeed::None | GpuNeed::Whole(_) => 0,
            }
        };
        let mut shared_slots: u64 = match demand.gpu {
            GpuNeed::Fraction(share) => pool
                .shared_by_room
                .iter()
                .enumerate()
                .skip(share as usize)
                .map(|(room, count)| count * (room as u64 / u64::from(share)))
                .sum(),
            GpuNeed::None | GpuNeed::Whole(_) => 0,
        };
        let mut free = pool.free_total;
        let mut overlay_buckets: Vec<Vec<(u64, usize)>> = Vec::new();
        let mut overlay_shared = Vec::new();
        for (idx, usage) in overlay {
            let node = &pool.nodes[*idx];
            if !node.schedulable {
                continue;
            }
            let before = node.view();
            let after = NodeView { usage, ..before };
            bucket_sizes[before.usage.free_whole as usize] -= 1;
            shared_count -= before.partly_used().count() as u64;
            shared_slots -= partial_slots(before);
            sub_amount(&mut free, before.free());
            let bucket = after.usage.free_whole as usize;
            if bucket_sizes.len() <= bucket {
                bucket_sizes.resize(bucket + 1, 0);
            }
            bucket_sizes[bucket] += 1;
            shared_count += after.partly_used().count() as u64;
            shared_slots += partial_slots(after);
            add_amount(&mut free, after.free());
            if overlay_buckets.len() <= bucket {
                overlay_buckets.resize_with(bucket + 1, Vec::new);
            }
            overlay_buckets[bucket].push((after.free_cpu(), *idx));
            overlay_shared.extend(
                after
                    .partly_used()
                    .map(|(gpu, room)| (room, after.free_cpu(), *idx, gpu)),
            );
        }
        for bucket in &mut overlay_buckets {
            bucket.sort_unstable();
        }
        overlay_shared.sort_unstable();

        // Refuse what the totals cannot hold: the free amounts, and the workers
        // the free GPUs hold counted GPU by GPU (O(G), or O(1000) for fractions).
        let workers = demand.workers;
        let per_worker = gang.per_worker;
        if free.cpu_milli < per_worker.cpu_milli.saturating_mul(workers)
            || free.memory_bytes < per_worker.memory_bytes.saturating_mul(workers)
            || free.gpu_milli < per_worker.gpu_milli.saturating_mul(workers)
        {
            return None;
        }
        let gpu_slots: u64 = match demand.gpu {
            GpuNeed::None => u64::MAX,
            GpuNeed::Whole(gpus) => bucket_sizes
                .iter()
                .enumerate()
                .map(|(bucket, size)| size.saturating_mul(bucket as u64 / u64::from(gpus)))
                .fold(0, u64::saturating_add),
            GpuNeed::Fraction(share) => bucket_sizes
                .iter()
                .enumerate()
                .map(|(bucket, size)| {
                    size.saturating_mul(bucket as u64 * u64::from(WHOLE_GPU / share))
                })
                .fold(shared_slots, u64::saturating_add),
        };
        if gpu_slots < workers {
            return None;
        }

        let mut search = Self {
            pool,
            gang,
            demand,
            overlay,
            overlay_buckets,
            overlay_shared,
            list: None,
            n_buckets: bucket_sizes.len(),
        };
        if let Narrowing::Among(sets) = narrowing {
            // Visit the constrained nodes only when they are fewer than the nodes
            // with room for a worker; else the index walk finds them sooner.
            let constrained: u64 = sets.iter().map(|set| set.len() as u64).sum();
            let with_room: u64 = bucket_sizes
                .iter()
                .skip(demand.whole_gpus_for(1))
                .sum::<u64>()
                + if matches!(demand.gpu, GpuNeed::Fraction(_)) {
                    shared_count
                } else {
                    0
                };
            if constrained < with_room {
                search.list = Some(search.list_index(&sets));
            }
        }
        Some(search)
    }

    fn list_index(&self, sets: &[&BTreeSet<usize>]) -> ListIndex {
        let mut list = ListIndex {
            buckets: vec![Vec::new(); self.n_buckets],
            shared: Vec::new(),
            nodes: Vec::new(),
        };
        let mut seen = HashSet::new();
        for idx in sets.iter().copied().flatten() {
            if !seen.insert(*idx) || !self.usable(*idx) {
                continue;
            }
            let view = self.view(*idx);
            list.buckets[view.usage.free_whole as usize].push((view.free_cpu(), *idx));
            list.nodes.push(*idx);
            list.shared.extend(
                view.partly_used()
                    .map(|(gpu, room)| (room, view.free_cpu(), *idx, gpu)),
            );
        }
        for bucket in &mut list.buckets {
            bucket.sort_unstable();
        }
        list.shared.sort_unstable();
        list
    }

    fn view(&self, idx: usize) -> NodeView<'a> {
        let node = &self.pool.nodes[idx];
        NodeView {
            spec: &node.spec,
            usage: self.overlay.get(&idx).unwrap_or(&node.usage),
            schedulable: node.schedulable,
        }
    }

    fn usable(&self, idx: usize) -> bool {
        let node = &self.pool.nodes[idx];
        node.schedulable && matches_constraints(&node.spec, self.gang, self.demand.needs_gpu())
    }

    /// How many of the gang's workers node `idx` holds, 0 if it may not be used.
    fn fits(&self, idx: usize) -> u64 {
        if self.usable(idx) {
            self.view(idx).fit_count(&self.demand)
        } else {
            0
        }
    }

    /// Nodes with exactly `bucket` whole free GPUs and at least `min_cpu` free
    /// CPU, by free CPU (ascending, or descending).
    fn bucket_stream(&self, bucket: usize, min_cpu: u64, descending: bool) -> NodeStream<'_> {
        fn ordered<'s>(
            entries: &'s [(u64, usize)],
            min_cpu: u64,
            descending: bool,
        ) -> Box<dyn Iterator<Item = (u64, usize)> + 's> {
            let from = entries.partition_point(|(cpu, _)| *cpu < min_cpu);
            let entries = entries[from..].iter().copied();
            if descending {
                Box::new(entries.rev())
            } else {
                Box::new(entries)
            }
        }
        if let Some(list) = &self.list {
            let entries = list.buckets.get(bucket).map_or(&[][..], Vec::as_slice);
            return Box::new(ordered(entries, min_cpu, descending).map(|(_, idx)| idx));
        }
        let base: Box<dyn Iterator<Item = (u64, usize)> + '_> =
            match self.pool.by_free_whole.get(bucket) {
                None => Box::new(std::iter::empty()),
                Some(set) => {
                    let range = set.range((min_cpu, 0)..).copied();
                    if descending {
                        Box::new(range.rev())
                    } else {
                        Box::new(range)
                    }
                }
            };
        if self.overlay.is_empty() {
            return Box::new(base.map(|(_, idx)| idx));
        }
        let base: Box<dyn Iterator<Item = (u64, usize)> + '_> =
            Box::new(base.filter(|(_, idx)| !self.overlay.contains_key(idx)));
        let extra = self
            .overlay_buckets
            .get(bucket)
            .map_or(&[][..], Vec::as_slice);
        let merged = Merge {
            left: base.peekable(),
            right: ordered(extra, min_cpu, descending).peekable(),
            descending,
        };
        Box::new(merged.map(|(_, idx)| idx))
    }

    /// Partly used GPUs with at least `min_room` room on nodes with at least
    /// `min_cpu` free CPU, tightest first (see [`skip_scan_set`]).
    fn shared_stream(&self, min_room: u32, min_cpu: u64) -> SharedStream<'_> {
        if let Some(list) = &self.list {
            return skip_scan_slice(&list.shared, min_room, min_cpu);
        }
        let base = skip_scan_set(&self.pool.shared, min_room, min_cpu);
        if self.overlay.is_empty() {
            return base;
        }
        let base: SharedStream<'_> =
            Box::new(base.filter(|(_, _, idx, _)| !self.overlay.contains_key(idx)));
        Box::new(Merge {
            left: base.peekable(),
            right: skip_scan_slice(&self.overlay_shared, min_room, min_cpu).peekable(),
            descending: false,
        })
    }

    /// Nodes that may hold `workers` workers, fullest first: for a fractional
    /// worker, nodes with a partly used GPU that fits it (tightest GPU first),
    /// then every node by whole free GPUs ascending, then free CPU ascending.
    fn packed_order(&self, workers: u64) -> NodeStream<'_> {
        let min_cpu = self.demand.cpu_milli.saturating_mul(workers);
        let from = self.demand.whole_gpus_for(workers);
        let buckets = (from..self.n_buckets)
            .flat_map(move |bucket| self.bucket_stream(bucket, min_cpu, false));
        match self.demand.gpu {
            GpuNeed::Fraction(share) => {
                let mut seen = HashSet::new();
                let shared = self.shared_stream(share, min_cpu).map(|(_, _, idx, _)| idx);
                Box::new(shared.chain(buckets).filter(move |idx| seen.insert(*idx)))
            }
            GpuNeed::None | GpuNeed::Whole(_) => Box::new(buckets),
        }
    }

    /// Nodes that may hold `workers` workers, emptiest first: by whole free GPUs
    /// descending, then free CPU descending; for a fractional worker, then the
    /// nodes with no free GPU but a partly used one that fits.
    fn spread_order(&self, workers: u64) -> NodeStream<'_> {
        let min_cpu = self.demand.cpu_milli.saturating_mul(workers);
        let from = self.demand.whole_gpus_for(workers);
        let buckets = (from..self.n_buckets)
            .rev()
            .flat_map(move |bucket| self.bucket_stream(bucket, min_cpu, true));
        match self.demand.gpu {
            GpuNeed::Fraction(share) => {
                let mut seen = HashSet::new();
                let shared = self.shared_stream(share, min_cpu).map(|(_, _, idx, _)| idx);
                Box::new(buckets.chain(shared).filter(move |idx| seen.insert(*idx)))
            }
            GpuNeed::None | GpuNeed::Whole(_) => Box::new(buckets),
        }
    }

    /// One node that holds the whole gang, as the strategy prefers.
    fn pick_single(&self, strategy: Strategy, rng: &mut SplitMix64) -> Option<usize> {
        let workers = self.demand.workers;
        let holds_all = |idx: &usize| self.fits(*idx) >= workers;
        match strategy {
            Strategy::BinPack => self.packed_order(workers).find(holds_all),
            Strategy::Spread => self.spread_order(workers).find(holds_all),
            Strategy::Random { .. } => {
                // Rejection sampling: a node drawn uniformly that holds the gang
                // is a uniform draw among the nodes that do, so a few probes
                // usually answer without listing them; else list them all.
                let population = self
                    .list
                    .as_ref()
                    .map_or(self.pool.nodes.len(), |list| list.nodes.len());
                if population > 0 {
                    for _ in 0..RANDOM_PROBES {
                        let drawn = rng.index(population);
                        let idx = self.list.as_ref().map_or(drawn, |list| list.nodes[drawn]);
                        if self.fits(idx) >= workers {
                            return Some(idx);
                        }
                    }
                }
                let fitting: Vec<usize> = self.packed_order(workers).filter(holds_all).collect();
                (!fitting.is_empty()).then(|| fitting[rng.index(fitting.len())])
            }
            Strategy::FragmentationAware => self.pick_least_fragmenting(),
        }
    }

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
    fn pick_least_fragmenting(&self) -> Option<usize> {
        let workers = self.demand.workers;
        let min_cpu = self.demand.cpu_milli.saturating_mul(workers);
        let fractional = matches!(self.demand.gpu, GpuNeed::Fraction(_));
        let mut seen = HashSet::new();
        let mut candidates = Vec::new();
        if let GpuNeed::Fraction(share) = self.demand.gpu {
            let mut found = 0;
            for (_, _, idx, _) in self.shared_stream(share, min_cpu) {
                if found == FRAGMENTATION_CANDIDATES_SHARED {
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
            for (descending, limit) in [
                (false, FRAGMENTATION_CANDIDATES_LOW),
                (true, FRAGMENTATION_CANDIDATES_HIGH),
            ] {
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
                let before_rooms: Vec<u32> = view.rooms().collect();
                let after_rooms: Vec<u32> = NodeView {
                    usage: &after,
                    ..view
                }
                .rooms()
                .collect();
                // Fragmentation only grows or shrinks by what the gang takes.
                let growth = i128::from(common_shape_fragmentation(&after_rooms))
                    - i128::from(common_shape_fragmentation(&before_rooms));
                let free_whole = u64::from(view.usage.free_whole);
                // Most partly used GPUs first.
                let fewest_shared = u64::MAX - view.partly_used().count() as u64;
                let key = if fractional {
                    let breaks_free_gpu = after.free_whole < view.usage.free_whole;
                    (breaks_free_gpu, fewest_shared, free_whole)
                } else {
                    (false, free_whole, fewest_shared)
                };
                (key, growth, position, idx)
            })
            .min()
            .map(|(_, _, _, idx)| idx)
    }

    /// Node `idx` as a candidate for some of the gang's workers, if it holds one.
    fn candidate(&self, idx: usize) -> Option<Candidate<'a>> {
        let fits = self.fits(idx);
        (fits > 0).then(|| {
            let view = self.view(idx);
            Candidate {
                idx,
                fits,
                free_gpu_milli: view.free().gpu_milli,
                rack: view.spec.labels.get("rack").map(String::as_str),
            }
        })
    }

    /// A gang no single node holds: the fewest nodes of one rack, else the fewest
    /// nodes anywhere (random: a random rack, then nodes in random order).
    fn pack_over_nodes(
        &self,
        strategy: Strategy,
        rng: &mut SplitMix64,
    ) -> Option<Vec<(usize, u64)>> {
        let workers = self.demand.workers;
        let candidates: Vec<Candidate<'a>> = self
            .packed_order(1)
            .filter_map(|idx| self.candidate(idx))
            .collect();
        if total_fits(&candidates) < workers {
            return None;
        }
        let racks: Vec<Vec<Candidate<'a>>> = by_rack(&candidates)
            .into_values()
            .filter(|members| total_fits(members) >= workers)
            .collect();
        let random = matches!(strategy, Strategy::Random { .. });
        let chosen: &[Candidate<'a>] = if racks.is_empty() {
            &candidates
        } else if random {
            &racks[rng.index(racks.len())]
        } else {
            // The rack needing fewest nodes; then the fullest, keeping emptier
            // racks whole for bigger gangs.
            racks
                .iter()
                .min_by_key(|members| {
                    let free: u64 = members.iter().map(|member| member.free_gpu_milli).sum();
                    (fewest_nodes(members, workers).len(), free)
                })
                .expect("racks is not empty")
        };
        Some(if random {
            let mut shuffled = chosen.to_vec();
            rng.shuffle(&mut shuffled);
            fill_in_order(&shuffled, workers)
        } else {
            fewest_nodes(chosen, workers)
        })
    }

    /// A spread gang: one worker per node, within one rack if one has enough
    /// nodes (the first rack to have them, emptiest nodes first), else across
    /// racks; with too few nodes for that, workers go round the nodes (of one
    /// rack if it holds them), emptiest first. The walk stops at the first rack
    /// with enough nodes, so it visits every candidate only when none has.
    fn spread_over_nodes(&self) -> Option<Vec<(usize, u64)>> {
        let workers = self.demand.workers;
        let one_each = |members: &[Candidate<'a>]| -> Vec<(usize, u64)> {
            members[..workers as usize]
                .iter()
                .map(|member| (member.idx, 1))
                .collect()
        };
        let mut candidates = Vec::new();
        let mut racks: BTreeMap<&'a str, Vec<Candidate<'a>>> = BTreeMap::new();
        for idx in self.spread_order(1) {
            let Some(candidate) = self.candidate(idx) else {
                continue;
            };
            candidates.push(candidate);
            if let Some(rack) = candidate.rack {
                let members = racks.entry(rack).or_default();
                members.push(candidate);
                if members.len() as u64 >= workers {
                    return Some(one_each(members));
                }
            }
        }
        if total_fits(&candidates) < workers {
            return None;
        }
        if candidates.len() as u64 >= workers {
            return Some(one_each(&candidates));
        }
        let members = racks
            .into_values()
            .filter(|members| total_fits(members) >= workers)
            .min_by_key(|members| {
                let free: u64 = members.iter().map(|member| member.free_gpu_milli).sum();
                (Reverse(members.len()), Reverse(free))
            })
            .unwrap_or(candidates);
        Some(round_robin(&members, workers))
    }
}

fn total_fits(candidates: &[Candidate<'_>]) -> u64 {
    candidates
        .iter()
        .map(|candidate| candidate.fits)
        .fold(0, u64::saturating_add)
}

/// Candidates with a `rack` label, grouped by it, each group in the given order.
fn by_rack<'a>(candidates: &[Candidate<'a>]) -> BTreeMap<&'a str, Vec<Candidate<'a>>> {
    let mut racks: BTreeMap<&'a str, Vec<Candidate<'a>>> = BTreeMap::new();
    for candidate in candidates {
        if let Some(rack) = candidate.rack {
            racks.entry(rack).or_default().push(*candidate);
        }
    }
    racks
}

/// The fewest nodes that hold `workers`: the nodes holding most until one node
/// holds the rest, then the node among the others that holds the rest most
/// tightly. Among nodes holding as many, the earlier in `candidates` (fuller,
/// in bin-pack order) goes first. `candidates` hold `workers` in total.
fn fewest_nodes(candidates: &[Candidate<'_>], workers: u64) -> Vec<(usize, u64)> {
    let mut by_fits = candidates.to_vec();
    // Stable: equal holders keep the bin-pack order.
    by_fits.sort_by_key(|candidate| Reverse(candidate.fits));
    let mut chosen = Vec::new();
    let mut left = workers;
    let mut next = 0;
    while left > 0 {
        let rest = &by_fits[next..];
        let holding_rest = rest.partition_point(|candidate| candidate.fits >= left);
        if holding_rest > 0 {
            let tightest = rest[holding_rest - 1].fits;
            let first_tightest = rest.partition_point(|candidate| candidate.fits > tightest);
            chosen.push((rest[first_tightest].idx, left));
            left = 0;
        } else {
            let largest = rest.first().expect("the candidates hold the gang");
            chosen.push((largest.idx, largest.fits));
            left -= largest.fits;
            next += 1;
        }
    }
    chosen
}

/// Fills candidates in the given order, each as far as it holds.
fn fill_in_order(candidates: &[Candidate<'_>], workers: u64) -> Vec<(usize, u64)> {
    let mut chosen = Vec::new();
    let mut left = workers;
    for candidate in candidates {
        if left == 0 {
            break;
        }
        let count = candidate.fits.min(left);
        chosen.push((candidate.idx, count));
        left -= count;
    }
    chosen
}

/// Deals workers one at a time round the candidates, skipping full ones.
/// `candidates` hold `workers` in total.
fn round_robin(candidates: &[Candidate<'_>], workers: u64) -> Vec<(usize, u64)> {
    let mut counts = vec![0_u64; candidates.len()];
    let mut left = workers;
    while left > 0 {
        let before = left;
        for (count, candidate) in counts.iter_mut().zip(candidates) {
            if left > 0 && *count < candidate.fits {
                *count += 1;
                left -= 1;
            }
        }
        assert!(left < before, "the candidates hold the gang");
    }
    candidates
        .iter()
        .zip(counts)
        .filter(|(_, count)| *count > 0)
        .map(|(candidate, count)| (candidate.idx, count))
        .collect()
}

#[cfg(test)]
mod tests {
    use std::collections::{BTreeMap, BTreeSet};

    use proptest::prelude::{
        ProptestConfig, any, prop, prop_assert, prop_assert_eq, prop_oneof, proptest,
    };
    use proptest::strategy::Strategy as _;

    use super::*;

    const GIB: u64 = 1 << 30;

    fn node_id(seed: u8) -> NodeId {
        NodeId(uuid::Uuid::from_bytes([seed; 16]))
    }

    fn spec(seed: u8, gpus: u32, rack: &str) -> NodeSpec {
        NodeSpec {
            id: node_id(seed),
            gpus,
            gpu_model: Some("A100".to_string()),
            cpu_milli: 64_000,
            memory_bytes: 512 * GIB,
            labels: BTreeMap::from([("rack".to_string(), rack.to_string())]),
        }
    }

    fn gang(workers: u32, gpu_milli: u64) -> GangShape {
        GangShape {
            workers,
            per_worker: Amount {
                gpu_milli,
                cpu_milli: 1000,
                memory_bytes: GIB,
            },
            gpu_models: Vec::new(),
            node_labels: BTreeMap::new(),
            spread: false,
        }
    }

    fn pool_of(specs: Vec<NodeSpec>) -> NodePool {
        let mut pool = NodePool::new();
        for spec in specs {
            pool.upsert_node(spec);
        }
        pool.check_indexes();
        pool
    }

    fn must_place(
        pool: &mut NodePool,
        gang: &GangShape,
        strategy: Strategy,
    ) -> Vec<WorkerPlacement> {
        let placement = pool.find(gang, strategy).expect("the gang fits");
        assert_eq!(placement.len(), gang.workers as usize);
        pool.allocate(&placement)
            .expect("a placement from find allocates");
        pool.check_indexes();
        placement
    }

    fn worker(node: u8, gpus: &[(u32, u32)], cpu_milli: u64) -> WorkerPlacement {
        WorkerPlacement {
            node: node_id(node),
            gpus: gpus
                .iter()
                .map(|(index, milli)| GpuShare {
                    index: *index,
                    milli: *milli,
                })
                .collect(),
            cpu_milli,
            memory_bytes: GIB,
        }
    }

    fn nodes_used(placement: &[WorkerPlacement]) -> BTreeSet<NodeId> {
        placement.iter().map(|worker| worker.node).collect()
    }

    /// Places one worker of `gpu_milli` and says where its GPU share went.
    fn check_share(pool: &mut NodePool, gpu_milli: u64, strategy: Strategy, expected: (u8, u32)) {
        let placement = must_place(pool, &gang(1, gpu_milli), strategy);
        assert_eq!(placement[0].node, node_id(expected.0));
        assert_eq!(placement[0].gpus[0].index, expected.1);
    }

    #[test]
    fn fractional_workers_pack_onto_one_shared_gpu() {
        let mut pool = pool_of(vec![spec(1, 2, "r1")]);
        for _ in 0..4 {
            check_share(&mut pool, 250, Strategy::BinPack, (1, 0));
        }
        assert_eq!(pool.node_gpu_used(node_id(1)).unwrap(), &[1000, 0]);

        let mut pool = pool_of(vec![spec(1, 2, "r1")]);
        let placement = must_place(&mut pool, &gang(4, 250), Strategy::BinPack);
        let gpus: BTreeSet<u32> = placement
            .iter()
            .map(|worker| worker.gpus[0].index)
            .collect();
        assert_eq!(gpus, BTreeSet::from([0]));
    }

    #[test]
    fn a_fraction_goes_to_a_shared_gpu_first_and_never_to_one_held_whole() {
        let mut pool = pool_of(vec![spec(1, 2, "r1")]);
        check_share(&mut pool, 1000, Strategy::BinPack, (1, 0));
        check_share(&mut pool, 500, Strategy::BinPack, (1, 1));
        check_share(&mut pool, 500, Strategy::BinPack, (1, 1));
        assert_eq!(pool.find(&gang(1, 500), Strategy::BinPack), None);
        assert_eq!(pool.find(&gang(1, 1), Strategy::FragmentationAware), None);

        // A partly used GPU takes the fraction before a free one, with every strategy.
        for strategy in [
            Strategy::BinPack,
            Strategy::Spread,
            Strategy::Random { seed: 7 },
            Strategy::FragmentationAware,
        ] {
            let mut pool = pool_of(vec![spec(1, 2, "r1")]);
            pool.allocate(&[worker(1, &[(1, 250)], 0)]).unwrap();
            check_share(&mut pool, 500, strategy, (1, 1));
        }
    }

    #[test]
    fn a_fraction_takes_the_tightest_shared_gpu_across_nodes() {
        let mut pool = pool_of(vec![spec(1, 1, "r1"), spec(2, 1, "r1"), spec(3, 1, "r1")]);
        pool.allocate(&[worker(1, &[(0, 500)], 0), worker(2, &[(0, 750)], 0)])
            .unwrap();
        check_share(&mut pool, 250, Strategy::BinPack, (2, 0));
        check_share(&mut pool, 250, Strategy::BinPack, (1, 0));
        check_share(&mut pool, 400, Strategy::BinPack, (3, 0));
    }

    #[test]
    fn a_gang_prefers_one_node_then_one_rack() {
        // One node holds the whole gang.
        let mut pool = pool_of(vec![spec(1, 8, "r1"), spec(2, 4, "r2"), spec(3, 4, "r2")]);
        let placement = must_place(&mut pool, &gang(2, 4000), Strategy::BinPack);
        assert_eq!(nodes_used(&placement), BTreeSet::from([node_id(1)]));
        // No node holds it now, but rack r2 does.
        let placement = must_place(&mut pool, &gang(2, 4000), Strategy::BinPack);
        assert_eq!(
            nodes_used(&placement),
            BTreeSet::from([node_id(2), node_id(3)])
        );

        // Only across racks.
        let mut pool = pool_of(vec![spec(1, 4, "r1"), spec(2, 4, "r2")]);
        let placement = must_place(&mut pool, &gang(2, 4000), Strategy::FragmentationAware);
        assert_eq!(nodes_used(&placement).len(), 2);

        // The fewest nodes within the rack: the 8-GPU node and two 2-GPU nodes.
        let mut pool = pool_of(vec![
            spec(1, 2, "r1"),
            spec(2, 8, "r1"),
            spec(3, 2, "r1"),
            spec(4, 2, "r1"),
            spec(5, 8, "r2"),
        ]);
        pool.allocate(&[worker(5, &[(0, 1000)], 0)]).unwrap();
        let placement = must_place(&mut pool, &gang(6, 2000), Strategy::BinPack);
        let used = nodes_used(&placement);
        assert_eq!(used.len(), 3);
        assert!(used.contains(&node_id(2)));
        assert!(!used.contains(&node_id(5)));
    }

    #[test]
    fn bin_pack_takes_the_fullest_node_and_spread_the_emptiest() {
        let mut pool = pool_of(vec![spec(1, 8, "r1"), spec(2, 8, "r1")]);
        pool.allocate(&[worker(2, &[(0, 1000), (1, 1000), (2, 1000)], 0)])
            .unwrap();
        let one_gpu = gang(1, 1000);
        assert_eq!(
            pool.find(&one_gpu, Strategy::BinPack).unwrap()[0].node,
            node_id(2)
        );
        assert_eq!(
            pool.find(&one_gpu, Strategy::Spread).unwrap()[0].node,
            node_id(1)
        );
        // Among nodes with as many free GPUs, the one with less free CPU.
        let mut pool = pool_of(vec![spec(1, 8, "r1"), spec(2, 8, "r1")]);
        pool.allocate(&[worker(1, &[], 8000)]).unwrap();
        assert_eq!(
            pool.find(&one_gpu, Strategy::BinPack).unwrap()[0].node,
            node_id(1)
        );
        assert_eq!(
            pool.find(&one_gpu, Strategy::Spread).unwrap()[0].node,
            node_id(2)
        );
    }

    #[test]
    fn cpu_only_workers_keep_off_nodes_with_free_gpus() {
        let mut pool = pool_of(vec![spec(1, 8, "r1"), spec(2, 0, "r1")]);
        let placement = must_place(&mut pool, &gang(1, 0), Strategy::BinPack);
        assert!(placement[0].gpus.is_empty());
        assert_eq!(placement[0].node, node_id(2));
    }

    #[test]
    fn spread_puts_workers_on_different_nodes() {
        let specs = || (1..=4).map(|seed| spec(seed, 8, "r1")).collect::<Vec<_>>();
        let mut spread_gang = gang(3, 1000);
        spread_gang.spread = true;
        let mut pool = pool_of(specs());
        assert_eq!(
            nodes_used(&must_place(&mut pool, &spread_gang, Strategy::BinPack)).len(),
            3
        );
        let mut pool = pool_of(specs());
        assert_eq!(
            nodes_used(&must_place(&mut pool, &gang(3, 1000), Strategy::Spread)).len(),
            3
        );
        let mut pool = pool_of(specs());
        assert_eq!(
            nodes_used(&must_place(&mut pool, &gang(3, 1000), Strategy::BinPack)).len(),
            1
        );

        // More workers than nodes: dealt round the nodes.
        let mut pool = pool_of(vec![spec(1, 8, "r1"), spec(2, 8, "r1")]);
        let placement = must_place(&mut pool, &gang(4, 1000), Strategy::Spread);
        let on_first = placement
            .iter()
            .filter(|worker| worker.node == node_id(1))
            .count();
        assert_eq!(on_first, 2);

        // One rack with enough nodes is preferred.
        let mut pool = pool_of(vec![
            spec(1, 8, "r1"),
            spec(2, 8, "r1"),
            spec(3, 4, "r2"),
            spec(4, 4, "r2"),
            spec(5, 4, "r2"),
        ]);
        let placement = must_place(&mut pool, &gang(3, 1000), Strategy::Spread);
        assert_eq!(
            nodes_used(&placement),
            BTreeSet::from([node_id(3), node_id(4), node_id(5)])
        );
    }

    #[test]
    fn labels_and_gpu_models_are_respected() {
        let mut specs = vec![spec(1, 8, "r1"), spec(2, 8, "r1"), spec(3, 8, "r2")];
        specs[1].gpu_model = Some("H100".to_string());
        specs[2].gpu_model = Some("H100".to_string());
        specs[2].labels.insert("zone".to_string(), "a".to_string());
        specs[0].labels.insert("zone".to_string(), "a".to_string());
        // Many unlabelled nodes make the search visit the labelled ones only.
        specs.extend((10..60).map(|seed| spec(seed, 8, "r3")));
        let mut pool = pool_of(specs);
        let mut constrained = gang(1, 1000);
        constrained.gpu_models = vec!["H100".to_string()];
        constrained.node_labels = BTreeMap::from([("zone".to_string(), "a".to_string())]);
        for strategy in [
            Strategy::BinPack,
            Strategy::Spread,
            Strategy::Random { seed: 1 },
            Strategy::FragmentationAware,
        ] {
            assert_eq!(
                pool.find(&constrained, strategy).unwrap()[0].node,
                node_id(3)
            );
        }
        let mut two = constrained.clone();
        two.workers = 2;
        two.per_worker.gpu_milli = 8000;
        assert_eq!(pool.find(&two, Strategy::BinPack), None);
        assert!(!pool.could_ever_fit(&two));

        let mut unknown_model = gang(1, 500);
        unknown_model.gpu_models = vec!["V100".to_string()];
        assert_eq!(pool.find(&unknown_model, Strategy::BinPack), None);
        assert!(!pool.could_ever_fit(&unknown_model));
        // A worker without GPUs does not care about GPU models.
        unknown_model.per_worker.gpu_milli = 0;
        assert!(pool.find(&unknown_model, Strategy::BinPack).is_some());

        let mut unknown_label = gang(1, 0);
        unknown_label.node_labels = BTreeMap::from([("zone".to_string(), "b".to_string())]);
        assert_eq!(pool.find(&unknown_label, Strategy::BinPack), None);
        assert!(!pool.could_ever_fit(&unknown_label));

        must_place(&mut pool, &constrained, Strategy::BinPack);
        pool.set_schedulable(node_id(3), false);
        assert_eq!(pool.find(&constrained, Strategy::BinPack), None);
    }

    #[test]
    fn nodes_that_are_not_schedulable_get_nothing() {
        let mut pool = pool_of(vec![spec(1, 8, "r1"), spec(2, 2, "r1")]);
        let held = must_place(&mut pool, &gang(1, 4000), Strategy::BinPack);
        assert_eq!(held[0].node, node_id(1));
        pool.set_schedulable(node_id(1), false);
        pool.check_indexes();
        assert_eq!(pool.is_schedulable(node_id(1)), Some(false));
        assert_eq!(pool.capacity().gpu_milli, 2000);
        assert_eq!(pool.free().gpu_milli, 2000);
        assert_eq!(pool.find(&gang(1, 4000), Strategy::BinPack), None);
        assert!(!pool.could_ever_fit(&gang(1, 4000)));
        assert_eq!(
            pool.allocate(&[worker(1, &[(7, 1000)], 0)]),
            Err(PlaceError::NotSchedulable { node: node_id(1) })
        );
        // A draining node still gives back what it held.
        pool.release(&held);
        assert_eq!(pool.node_free(node_id(1)).unwrap().gpu_milli, 8000);
        pool.set_schedulable(node_id(1), true);
        pool.check_indexes();
        assert_eq!(
            pool.find(&gang(1, 8000), Strategy::BinPack).unwrap()[0].node,
            node_id(1)
        );
    }

    #[test]
    fn allocate_is_all_or_nothing() {
        let mut small = spec(1, 2, "r1");
        small.cpu_milli = 4000;
        small.memory_bytes = 4 * GIB;
        let mut pool = pool_of(vec![small]);
        let free = pool.free();
        let node = node_id(1);
        let cases = [
            (
                vec![worker(1, &[(0, 1000)], 1000), worker(1, &[], 3500)],
                PlaceError::CpuOverCapacity {
                    node,
                    requested: 4500,
                    free: 4000,
                },
            ),
            (
                vec![worker(1, &[(1, 600)], 0), worker(1, &[(1, 600)], 0)],
                PlaceError::GpuOverCapacity {
                    node,
                    index: 1,
                    requested: 1200,
                    free: 1000,
                },
            ),
            (
                vec![worker(1, &[(0, 500)], 0), worker(9, &[], 0)],
                PlaceError::UnknownNode { node: node_id(9) },
            ),
            (
                vec![worker(1, &[(2, 500)], 0)],
                PlaceError::GpuIndexOutOfRange {
                    node,
                    index: 2,
                    gpus: 2,
                },
            ),
            (
                vec![worker(1, &[(0, 0)], 0)],
                PlaceError::InvalidGpuShare {
                    node,
                    index: 0,
                    milli: 0,
                },
            ),
            (
                vec![worker(1, &[(0, 1001)], 0)],
                PlaceError::InvalidGpuShare {
                    node,
                    index: 0,
                    milli: 1001,
                },
            ),
            (
                (0..5).map(|_| worker(1, &[], 0)).collect(),
                PlaceError::MemoryOverCapacity {
                    node,
                    requested: 5 * GIB,
                    free: 4 * GIB,
                },
            ),
        ];
        for (workers, expected) in cases {
            assert_eq!(pool.allocate(&workers), Err(expected));
            assert_eq!(pool.free(), free, "a refused allocation holds nothing");
            assert_eq!(pool.node_gpu_used(node).unwrap(), &[0, 0]);
        }
        pool.allocate(&[worker(1, &[(1, 400)], 0)]).unwrap();
        assert_eq!(
            pool.allocate(&[worker(1, &[(1, 1000)], 0)]),
            Err(PlaceError::GpuOverCapacity {
                node,
                index: 1,
                requested: 1000,
                free: 600
            })
        );
        pool.check_indexes();
    }

    #[test]
    fn find_with_freed_finds_room_that_only_freeing_makes() {
        let mut pool = pool_of(vec![spec(1, 8, "r1"), spec(2, 3, "r1")]);
        let victim = must_place(&mut pool, &gang(1, 8000), Strategy::BinPack);
        let other = must_place(&mut pool, &gang(1, 2000), Strategy::BinPack);
        assert_eq!(other[0].node, node_id(2));
        let big = gang(1, 4000);
        assert_eq!(pool.find(&big, Strategy::BinPack), None);
        let free = pool.free();
        let found = pool
            .find_with_freed(&big, Strategy::BinPack, &[&victim])
            .expect("freeing the victim makes room");
        assert_eq!(found[0].node, node_id(1));
        assert_eq!(pool.free(), free, "a what-if changes nothing");
        pool.check_indexes();
        // Freeing the small one is not enough.
        assert_eq!(
            pool.find_with_freed(&big, Strategy::BinPack, &[&other]),
            None
        );
        // Both together: the gang of two fits.
        let pair = gang(2, 4000);
        assert!(
            pool.find_with_freed(&pair, Strategy::BinPack, &[&other])
                .is_none()
        );
        let found_pair = pool
            .find_with_freed(&pair, Strategy::FragmentationAware, &[&victim, &other])
            .unwrap();
        assert_eq!(nodes_used(&found_pair), BTreeSet::from([node_id(1)]));
        pool.release(&victim);
        pool.allocate(&found).unwrap();
        pool.check_indexes();
    }

    #[test]
    fn could_ever_fit_ignores_what_is_held() {
        let mut pool = pool_of(vec![spec(1, 8, "r1"), spec(2, 8, "r2")]);
        assert!(!pool.could_ever_fit(&gang(1, 16000)));
        assert!(pool.could_ever_fit(&gang(2, 8000)));
        assert!(!pool.could_ever_fit(&gang(3, 8000)));
        assert!(pool.could_ever_fit(&gang(64, 250)));
        assert!(!pool.could_ever_fit(&gang(65, 250)));
        must_place(&mut pool, &gang(2, 8000), Strategy::BinPack);
        assert!(pool.could_ever_fit(&gang(2, 8000)));
        assert_eq!(pool.find(&gang(1, 250), Strategy::BinPack), None);
        assert!(!NodePool::new().could_ever_fit(&gang(1, 0)));
    }

    #[test]
    fn odd_gpu_amounts_and_empty_gangs() {
        let pool = pool_of(vec![spec(1, 8, "r1")]);
        assert_eq!(pool.find(&gang(1, 1500), Strategy::BinPack), None);
        assert!(!pool.could_ever_fit(&gang(1, 1500)));
        assert_eq!(
            pool.find(&gang(0, 1000), Strategy::BinPack),
            Some(Vec::new())
        );
    }

    #[test]
    fn random_is_deterministic_and_varies_with_the_seed() {
        let pool = pool_of((1..=10).map(|seed| spec(seed, 8, "r1")).collect());
        let one = gang(1, 1000);
        let chosen: BTreeSet<NodeId> = (0..40)
            .map(|seed| {
                let first = pool.find(&one, Strategy::Random { seed }).unwrap();
                assert_eq!(pool.find(&one, Strategy::Random { seed }).unwrap(), first);
                first[0].node
            })
            .collect();
        assert!(
            chosen.len() >= 4,
            "random picks spread over nodes: {chosen:?}"
        );
    }

    #[test]
    fn fragmentation_aware_keeps_idle_capacity_usable() {
        // It does not break an idle node when a partly used one fits, and fills a
        // node exactly when it can.
        let mut pool = pool_of(vec![spec(1, 8, "r1"), spec(2, 8, "r1"), spec(3, 8, "r1")]);
        pool.allocate(&[worker(
            2,
            &[(0, 1000), (1, 1000), (2, 1000), (3, 1000), (4, 1000)],
            0,
        )])
        .unwrap();
        pool.allocate(&[worker(
            3,
            &[
                (0, 1000),
                (1, 1000),
                (2, 1000),
                (3, 1000),
                (4, 1000),
                (5, 1000),
                (6, 1000),
            ],
            0,
        )])
        .unwrap();
        let one = gang(1, 1000);
        assert_eq!(
            pool.find(&one, Strategy::FragmentationAware).unwrap()[0].node,
            node_id(3)
        );
        assert_eq!(
            pool.find(&gang(1, 3000), Strategy::FragmentationAware)
                .unwrap()[0]
                .node,
            node_id(2)
        );

        // A fraction goes where a GPU is already shared.
        let mut pool = pool_of(vec![spec(1, 8, "r1"), spec(2, 8, "r1")]);
        pool.allocate(&[worker(2, &[(3, 500)], 0)]).unwrap();
        let placement = pool
            .find(&gang(1, 500), Strategy::FragmentationAware)
            .unwrap();
        assert_eq!(
            (placement[0].node, placement[0].gpus[0].index),
            (node_id(2), 3)
        );

        // Fractions gather on the node that shares most GPUs, where bin-pack
        // takes the tightest shared GPU anywhere.
        let mut pool = pool_of(vec![spec(1, 8, "r1"), spec(2, 8, "r1")]);
        pool.allocate(&[worker(1, &[(0, 700)], 0)]).unwrap();
        pool.allocate(&[worker(2, &[(0, 400), (1, 400), (2, 400)], 0)])
            .unwrap();
        check_share(&mut pool.clone(), 250, Strategy::BinPack, (1, 0));
        check_share(&mut pool, 250, Strategy::FragmentationAware, (2, 0));

        // Among equally full nodes, whole GPUs go where GPUs are shared, where
        // bin-pack takes the node with less free CPU.
        let mut pool = pool_of(vec![spec(1, 4, "r1"), spec(2, 5, "r1")]);
        pool.allocate(&[worker(1, &[(0, 1000)], 8000)]).unwrap();
        pool.allocate(&[worker(2, &[(0, 500), (1, 500)], 0)])
            .unwrap();
        assert_eq!(
            pool.find(&one, Strategy::BinPack).unwrap()[0].node,
            node_id(1)
        );
        assert_eq!(
            pool.find(&one, Strategy::FragmentationAware).unwrap()[0].node,
            node_id(2)
        );
    }

    #[test]
    fn idle_gpu_fragmentation_counts_idle_room_on_shared_gpus() {
        let mut pool = pool_of(vec![spec(1, 2, "r1")]);
        assert_eq!(pool.idle_gpu_fragmentation(), 0.0);
        pool.allocate(&[worker(1, &[(0, 250)], 0)]).unwrap();
        assert!((pool.idle_gpu_fragmentation() - 750.0 / 1750.0).abs() < 1e-12);
        pool.allocate(&[worker(1, &[(0, 750), (1, 1000)], 0)])
            .unwrap();
        assert_eq!(pool.idle_gpu_fragmentation(), 0.0);
    }

    #[test]
    fn upsert_keeps_allocations_and_remove_forgets_the_node() {
        let mut pool = pool_of(vec![spec(1, 4, "r1"), spec(2, 4, "r1"), spec(3, 4, "r2")]);
        pool.allocate(&[worker(1, &[(0, 1000), (3, 500)], 2000)])
            .unwrap();
        let mut bigger = spec(1, 4, "r2");
        bigger.cpu_milli = 128_000;
        pool.upsert_node(bigger);
        pool.check_indexes();
        assert_eq!(pool.node_gpu_used(node_id(1)).unwrap(), &[1000, 0, 0, 500]);
        assert_eq!(pool.node_free(node_id(1)).unwrap().cpu_milli, 126_000);
        // Fewer GPUs: what was held on the lost ones is forgotten.
        pool.upsert_node(spec(1, 2, "r2"));
        pool.check_indexes();
        assert_eq!(pool.node_gpu_used(node_id(1)).unwrap(), &[1000, 0]);
        assert_eq!(pool.node_count(), 3);
        assert!(pool.remove_node(node_id(1)));
        assert!(!pool.remove_node(node_id(1)));
        pool.check_indexes();
        assert_eq!(pool.node_count(), 2);
        assert_eq!(pool.capacity().gpu_milli, 8000);
        assert_eq!(pool.node_free(node_id(1)), None);
        let listed: BTreeSet<NodeId> = pool.nodes().map(|(spec, _)| spec.id).collect();
        assert_eq!(listed, BTreeSet::from([node_id(2), node_id(3)]));
        // Releasing on a removed node is ignored.
        pool.release(&[worker(1, &[(0, 1000)], 0)]);
        assert_eq!(pool.free(), pool.capacity());
    }

    // Property tests: random pools and random sequences of placements, what-ifs,
    // releases and draining, checked against a brute-force count after every step.

    #[derive(Debug, Clone)]
    struct NodeGen {
        gpus: u32,
        cpu_cores: u64,
        memory_gib: u64,
        rack: u8,
        model: u8,
        zone: bool,
    }

    #[derive(Debug, Clone)]
    struct GangGen {
        workers: u32,
        gpu_milli: u64,
        cpu_milli: u64,
        memory_gib: u64,
        strategy: u8,
        spread: bool,
        model: Option<u8>,
        zone: bool,
    }

    #[derive(Debug, Clone)]
    enum Op {
        Place(GangGen),
        WhatIf(GangGen, usize),
        Release(usize),
        Schedulable(usize, bool),
        Remove(usize),
    }

    fn node_gen() -> impl proptest::strategy::Strategy<Value = NodeGen> {
        (0u32..8, 1u64..33, 1u64..65, 0u8..3, 0u8..3, any::<bool>()).prop_map(
            |(gpus, cpu_cores, memory_gib, rack, model, zone)| NodeGen {
                gpus,
                cpu_cores,
                memory_gib,
                rack,
                model,
                zone,
            },
        )
    }

    fn gang_gen() -> impl proptest::strategy::Strategy<Value = GangGen> {
        (
            1u32..6,
            prop::sample::select(vec![0u64, 250, 470, 500, 1000, 2000, 3000, 4000, 1500]),
            0u64..9000,
            0u64..17,
            0u8..4,
            prop::bool::weighted(0.2),
            prop::option::weighted(0.2, 0u8..3),
            prop::bool::weighted(0.15),
        )
            .prop_map(
                |(workers, gpu_milli, cpu_milli, memory_gib, strategy, spread, model, zone)| {
                    GangGen {
                        workers,
                        gpu_milli,
                        cpu_milli,
                        memory_gib,
                        strategy,
                        spread,
                        model,
                        zone,
                    }
                },
            )
    }

    fn op_gen() -> impl proptest::strategy::Strategy<Value = Op> {
        prop_oneof![
            6 => gang_gen().prop_map(Op::Place),
            2 => (gang_gen(), any::<usize>()).prop_map(|(gang, victim)| Op::WhatIf(gang, victim)),
            3 => any::<usize>().prop_map(Op::Release),
            1 => (any::<usize>(), any::<bool>()).prop_map(|(node, on)| Op::Schedulable(node, on)),
            1 => any::<usize>().prop_map(Op::Remove),
        ]
    }

    const MODELS: [&str; 2] = ["A100", "H100"];

    fn build_pool(nodes: &[NodeGen]) -> NodePool {
        let mut pool = NodePool::new();
        for (seed, node) in nodes.iter().enumerate() {
            let mut labels = BTreeMap::from([("rack".to_string(), format!("r{}", node.rack))]);
            if node.zone {
                labels.insert("zone".to_string(), "a".to_string());
            }
            pool.upsert_node(NodeSpec {
                id: node_id(seed as u8 + 1),
                gpus: node.gpus,
                gpu_model: MODELS
                    .get(usize::from(node.model))
                    .map(|model| model.to_string()),
                cpu_milli: node.cpu_cores * 1000,
                memory_bytes: node.memory_gib * GIB,
                labels,
            });
        }
        pool
    }

    fn gang_of(generated: &GangGen) -> (GangShape, Strategy) {
        let gang = GangShape {
            workers: generated.workers,
            per_worker: Amount {
                gpu_milli: generated.gpu_milli,
                cpu_milli: generated.cpu_milli,
                memory_bytes: generated.memory_gib * GIB,
            },
            gpu_models: generated
                .model
                .map(|model| {
                    MODELS
                        .get(usize::from(model))
                        .unwrap_or(&"V100")
                        .to_string()
                })
                .into_iter()
                .collect(),
            node_labels: if generated.zone {
                BTreeMap::from([("zone".to_string(), "a".to_string())])
            } else {
                BTreeMap::new()
            },
            spread: generated.spread,
        };
        let strategy = match generated.strategy {
            0 => Strategy::BinPack,
            1 => Strategy::Spread,
            2 => Strategy::Random {
                seed: u64::from(generated.workers) * 31 + generated.cpu_milli,
            },
            _ => Strategy::FragmentationAware,
        };
        (gang, strategy)
    }

    /// How many workers of `gang` each usable node holds, counted from first
    /// principles rather than through the pool's own helpers.
    fn brute_force_fits(pool: &NodePool, gang: &GangShape) -> Vec<(NodeId, Option<String>, u64)> {
        let per_worker = gang.per_worker;
        let needs_gpu = per_worker.gpu_milli > 0;
        pool.nodes
            .iter()
            .filter(|node| node.schedulable)
            .filter(|node| {
                gang.node_labels
                    .iter()
                    .all(|(key, value)| node.spec.labels.get(key) == Some(value))
                    && (!needs_gpu
                        || gang.gpu_models.is_empty()
                        || node
                            .spec
                            .gpu_model
                            .as_ref()
                            .is_some_and(|model| gang.gpu_models.contains(model)))
            })
            .map(|node| {
                let rooms = node
                    .usage
                    .gpu_used
                    .iter()
                    .map(|used| u64::from(1000 - *used));
                let by_gpu = match per_worker.gpu_milli {
                    0 => u64::MAX,
                    milli if milli < 1000 => rooms.map(|room| room / milli).sum(),
                    milli => rooms.filter(|room| *room == 1000).count() as u64 / (milli / 1000),
                };
                let by_cpu = (node.spec.cpu_milli - node.usage.cpu_milli)
                    .checked_div(per_worker.cpu_milli)
                    .unwrap_or(u64::MAX);
                let by_memory = (node.spec.memory_bytes - node.usage.memory_bytes)
                    .checked_div(per_worker.memory_bytes)
                    .unwrap_or(u64::MAX);
                let fits = by_gpu
                    .min(by_cpu)
                    .min(by_memory)
                    .min(u64::from(gang.workers));
                (node.spec.id, node.spec.labels.get("rack").cloned(), fits)
            })
            .filter(|(_, _, fits)| *fits > 0)
            .collect()
    }

    /// The fewest of these nodes that hold `workers`.
    fn fewest(fits: &[u64], workers: u64) -> usize {
        let mut sorted = fits.to_vec();
        sorted.sort_unstable_by(|left, right| right.cmp(left));
        let mut held = 0;
        for (count, fit) in sorted.iter().enumerate() {
            held += fit;
            if held >= workers {
                return count + 1;
            }
        }
        usize::MAX
    }

    /// Checks a placement `find` returned against the brute-force count.
    fn check_placement(
        pool: &NodePool,
        gang: &GangShape,
        strategy: Strategy,
        found: Option<&Vec<WorkerPlacement>>,
    ) -> Result<(), proptest::test_runner::TestCaseError> {
        if gang.per_worker.gpu_milli > 1000 && !gang.per_worker.gpu_milli.is_multiple_of(1000) {
            prop_assert!(found.is_none());
            return Ok(());
        }
        let workers = u64::from(gang.workers);
        let fits = brute_force_fits(pool, gang);
        let total: u64 = fits.iter().map(|(_, _, fit)| fit).sum();
        prop_assert_eq!(
            found.is_some(),
            total >= workers,
            "find is complete and sound"
        );
        let Some(found) = found else {
            return Ok(());
        };
        prop_assert!(pool.could_ever_fit(gang));
        prop_assert_eq!(found.len(), gang.workers as usize);
        let fit_of = |id: NodeId| {
            fits.iter()
                .find(|(node, _, _)| *node == id)
                .map(|(_, rack, fit)| (rack.clone(), *fit))
        };
        let used = nodes_used(found);
        for node in &used {
            let on_node = found.iter().filter(|worker| worker.node == *node).count() as u64;
            let (_, fit) = fit_of(*node).expect("placed on a usable node with room");
            prop_assert!(on_node <= fit);
        }
        for worker in found {
            let shares: u64 = worker.gpus.iter().map(|share| u64::from(share.milli)).sum();
            prop_assert_eq!(shares, gang.per_worker.gpu_milli);
        }
        let spread = !matches!(strategy, Strategy::Random { .. })
            && (gang.spread || strategy == Strategy::Spread);
        let one_node_holds_all = fits.iter().any(|(_, _, fit)| *fit >= workers);
        let mut racks: BTreeMap<Option<String>, Vec<u64>> = BTreeMap::new();
        for (_, rack, fit) in &fits {
            racks.entry(rack.clone()).or_default().push(*fit);
        }
        let rack_holds_all = racks
            .iter()
            .any(|(rack, fits)| rack.is_some() && fits.iter().sum::<u64>() >= workers);
        let placed_racks: BTreeSet<Option<String>> =
            used.iter().map(|node| fit_of(*node).unwrap().0).collect();
        if spread && workers > 1 {
            if fits.len() as u64 >= workers {
                prop_assert_eq!(
                    used.len() as u64,
                    workers,
                    "one worker per node when possible"
                );
            }
            if racks
                .iter()
                .any(|(rack, fits)| rack.is_some() && fits.len() as u64 >= workers)
            {
                prop_assert_eq!(placed_racks.len(), 1);
            }
        } else if one_node_holds_all {
            prop_assert_eq!(used.len(), 1, "one node when one holds the gang");
        } else if rack_holds_all {
            prop_assert_eq!(placed_racks.len(), 1, "one rack when one holds the gang");
            if matches!(strategy, Strategy::BinPack | Strategy::FragmentationAware) {
                let rack = placed_racks.iter().next().unwrap();
                prop_assert_eq!(
                    used.len(),
                    fewest(&racks[rack], workers),
                    "the fewest nodes of the rack"
                );
            }
        } else if matches!(strategy, Strategy::BinPack | Strategy::FragmentationAware) {
            let all: Vec<u64> = fits.iter().map(|(_, _, fit)| *fit).collect();
            prop_assert_eq!(used.len(), fewest(&all, workers), "the fewest nodes");
        }
        if workers == 1 && gang.per_worker.gpu_milli >= 1000 {
            let free_whole = |id: NodeId| pool.nodes[pool.index_of[&id]].usage.free_whole;
            let chosen = free_whole(found[0].node);
            let candidates = fits.iter().map(|(node, _, _)| free_whole(*node));
            if matches!(strategy, Strategy::BinPack | Strategy::FragmentationAware) && !gang.spread
            {
                prop_assert_eq!(
                    chosen,
                    candidates.min().unwrap(),
                    "bin-pack takes the fullest"
                );
            } else if spread {
                prop_assert_eq!(
                    chosen,
                    candidates.max().unwrap(),
                    "spread takes the emptiest"
                );
            }
        }
        let share = gang.per_worker.gpu_milli;
        if workers == 1
            && share > 0
            && share < 1000
            && matches!(strategy, Strategy::BinPack | Strategy::FragmentationAware)
            && !gang.spread
        {
            let room_before = |id: NodeId, index: u32| {
                1000 - pool.nodes[pool.index_of[&id]].usage.gpu_used[index as usize]
            };
            let shared_fits = fits.iter().any(|(id, _, _)| {
                pool.nodes[pool.index_of[id]]
                    .usage
                    .gpu_used
                    .iter()
                    .any(|used| *used > 0 && u64::from(1000 - *used) >= share)
            });
            let took_free_gpu = room_before(found[0].node, found[0].gpus[0].index) == 1000;
            prop_assert!(!(shared_fits && took_free_gpu), "a shared GPU goes first");
        }
        Ok(())
    }

    /// The pool's usage equals the sum of what is held, and stays within capacity.
    fn check_usage(
        pool: &NodePool,
        held: &[Vec<WorkerPlacement>],
    ) -> Result<(), proptest::test_runner::TestCaseError> {
        pool.check_indexes();
        let mut expected: BTreeMap<NodeId, Usage> = pool
            .nodes
            .iter()
            .map(|node| (node.spec.id, Usage::empty(node.spec.gpus)))
            .collect();
        for worker in held.iter().flatten() {
            if let Some(usage) = expected.get_mut(&worker.node) {
                usage.hold(worker);
            }
        }
        for node in &pool.nodes {
            prop_assert_eq!(&node.usage, &expected[&node.spec.id]);
            prop_assert!(node.usage.gpu_used.iter().all(|used| *used <= 1000));
            prop_assert!(node.usage.cpu_milli <= node.spec.cpu_milli);
            prop_assert!(node.usage.memory_bytes <= node.spec.memory_bytes);
        }
        Ok(())
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(160))]

        #[test]
        fn placements_allocate_and_never_overallocate(
            nodes in prop::collection::vec(node_gen(), 1..12),
            ops in prop::collection::vec(op_gen(), 1..40),
        ) {
            let mut pool = build_pool(&nodes);
            let mut held: Vec<Vec<WorkerPlacement>> = Vec::new();
            for op in ops {
                match op {
                    Op::Place(generated) => {
                        let (gang, strategy) = gang_of(&generated);
                        let found = pool.find(&gang, strategy);
                        check_placement(&pool, &gang, strategy, found.as_ref())?;
                        if let Some(found) = found {
                            prop_assert_eq!(pool.allocate(&found), Ok(()));
                            held.push(found);
                        }
                    }
                    Op::WhatIf(generated, victim) => {
                        let (gang, strategy) = gang_of(&generated);
                        // Distinct allocations: each is freed once.
                        let mut chosen: Vec<usize> = Vec::new();
                        if !held.is_empty() {
                            chosen.push(victim % held.len());
                            chosen.push((victim / 7) % held.len());
                            chosen.dedup();
                        }
                        let victims: Vec<&[WorkerPlacement]> =
                            chosen.iter().map(|which| held[*which].as_slice()).collect();
                        let before_free = pool.free();
                        let before_nodes: Vec<Usage> = pool.nodes.iter().map(|node| node.usage.clone()).collect();
                        let found = pool.find_with_freed(&gang, strategy, &victims);
                        prop_assert_eq!(pool.free(), before_free);
                        let after_nodes: Vec<Usage> = pool.nodes.iter().map(|node| node.usage.clone()).collect();
                        prop_assert_eq!(before_nodes, after_nodes);
                        let mut released = pool.clone();
                        for workers in &victims {
                            released.release(workers);
                        }
                        if matches!(strategy, Strategy::Random { .. }) {
                            prop_assert_eq!(found.is_some(), released.find(&gang, strategy).is_some());
                        } else {
                            prop_assert_eq!(&found, &released.find(&gang, strategy), "a what-if sees the pool after freeing");
                        }
                        check_placement(&released, &gang, strategy, found.as_ref())?;
                        if let Some(found) = found {
                            prop_assert_eq!(released.allocate(&found), Ok(()));
                            released.check_indexes();
                        }
                    }
                    Op::Release(which) => {
                        if !held.is_empty() {
                            let workers = held.swap_remove(which % held.len());
                            pool.release(&workers);
                        }
                    }
                    Op::Schedulable(which, on) => {
                        let id = pool.nodes[which % pool.nodes.len()].spec.id;
                        pool.set_schedulable(id, on);
                    }
                    Op::Remove(which) => {
                        if pool.node_count() > 1 {
                            let id = pool.nodes[which % pool.nodes.len()].spec.id;
                            prop_assert!(pool.remove_node(id));
                        }
                    }
                }
                check_usage(&pool, &held)?;
                prop_assert!((0.0..=1.0).contains(&pool.idle_gpu_fragmentation()));
            }
            for workers in held.drain(..) {
                pool.release(&workers);
            }
            for (spec, _) in pool.nodes().map(|(spec, on)| (spec.clone(), on)).collect::<Vec<_>>() {
                pool.set_schedulable(spec.id, true);
            }
            check_usage(&pool, &held)?;
            prop_assert_eq!(pool.free(), pool.capacity());
        }
    }
}
