//! One placement search: the totals that refuse a gang early, the ordered walks
//! over the pool's indexes (with what-if usage for `find_with_freed` and a
//! private index for narrow constraints), and the choice of one node that holds
//! the whole gang.
//!
//! Complexity (n schedulable nodes, G GPUs on the largest node, W workers in the
//! gang, D distinct rooms among partly used GPUs):
//! - A gang refused by the totals (free CPU, memory or GPU; workers the free
//!   GPUs hold, counted GPU by GPU; no node with its labels or models): O(G),
//!   or O(1000) for fractional workers.
//! - Bin-pack and spread, one node: a walk over the buckets from the smallest
//!   (bin-pack) or largest (spread) that can suffice, each entered at the least
//!   CPU that suffices, and for fractional workers over the partly used GPUs
//!   with room, one seek per distinct room: O(G log n + D log n) plus the nodes
//!   skipped for memory or constraints, which are not indexed.
//! - Fragmentation-aware: as bin-pack, but scores at most eight fitting nodes
//!   per bucket and eight with shared room for fractions, each in O(G); with a
//!   workload mix of T types (FGD), every fitting node, each distinct node
//!   state once, in O(T·G²) for a fractional worker (one score per distinct
//!   room) and O(T·G) else.
//! - Random, one node: 32 uniform probes, then a list of every fitting node.
//! - Gangs that need several nodes: every node that holds a worker is visited,
//!   O(c log c) for c such nodes (spread stops at the first rack with enough).
//! - Labels and models: when the nodes carrying the rarest label (or the models)
//!   are fewer than the nodes with room, only those are visited.
//! - [`NodePool::find_with_freed`]: as `find`, plus O(t·G log t) for the t nodes
//!   the freed allocations touch; only those nodes' allocations are copied.
//!
//! A search reads the pool and changes nothing; the caller allocates what it
//! returns.

use ahash::AHashSet;
use std::collections::{BTreeMap, BTreeSet};
use std::iter::Peekable;

use xp_runtime::seeded::SplitMix64;

use super::index::{ModelUsage, Narrowing, SharedKey};
use super::node::{Demand, GpuNeed, NodeView, Usage, add_amount, matches_constraints, sub_amount};
use super::{NodePool, Strategy, TaskMix, WHOLE_GPU};
use crate::{Amount, GangShape, WorkerPlacement};

/// The node a single-node search picked and, when the strategy chose it, the
/// GPU of a single fractional worker (else workers go where
/// [`NodeView::place`] puts them).
pub(super) struct Choice {
    pub(super) node: usize,
    pub(super) gpu: Option<u32>,
}

/// Random placement first draws this many nodes uniformly and keeps the first
/// that holds the gang, before it lists every node that does.
const RANDOM_PROBES: usize = 32;

/// The nodes a constrained gang can use, indexed like the pool's indexes.
struct ListIndex {
    /// `(free CPU, node index)` by whole free GPUs, sorted.
    buckets: Vec<Vec<(u64, usize)>>,
    /// Partly used GPUs, sorted.
    shared: Vec<SharedKey>,
    /// The nodes, for random probes.
    nodes: Vec<usize>,
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

/// Node indexes in the order a walk visits them.
type NodeStream<'s> = Box<dyn Iterator<Item = usize> + 's>;

/// Partly used GPUs in the order a walk visits them.
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

/// The pool's counts as a search sees them: with the overlay's nodes as the
/// overlay leaves them.
struct Counts {
    /// Schedulable nodes by whole free GPUs.
    bucket_sizes: Vec<u64>,
    /// Partly used GPUs.
    shared_count: u64,
    /// Fractional workers of the demand's share that partly used GPUs hold.
    shared_slots: u64,
    /// Free amounts in total.
    free: Amount,
    /// Schedulable overlay nodes, keyed like `by_free_whole`, sorted.
    overlay_buckets: Vec<Vec<(u64, usize)>>,
    /// Partly used GPUs of schedulable overlay nodes, sorted.
    overlay_shared: Vec<SharedKey>,
}

impl Counts {
    /// The pool's counts, each overlay node's taken out as it is and put back
    /// as the overlay leaves it.
    fn with_overlay(pool: &NodePool, demand: &Demand, overlay: &BTreeMap<usize, Usage>) -> Self {
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
        let mut counts = Self {
            bucket_sizes: pool
                .by_free_whole
                .iter()
                .map(|set| set.len() as u64)
                .collect(),
            shared_count: pool.shared.len() as u64,
            shared_slots: match demand.gpu {
                GpuNeed::Fraction(share) => pool
                    .shared_by_room
                    .iter()
                    .enumerate()
                    .skip(share as usize)
                    .map(|(room, count)| count * (room as u64 / u64::from(share)))
                    .sum(),
                GpuNeed::None | GpuNeed::Whole(_) => 0,
            },
            free: pool.free_total,
            overlay_buckets: Vec::new(),
            overlay_shared: Vec::new(),
        };
        for (idx, usage) in overlay {
            let node = &pool.nodes[*idx];
            if !node.schedulable {
                continue;
            }
            let before = node.view();
            let after = NodeView { usage, ..before };
            counts.bucket_sizes[before.usage.free_whole as usize] -= 1;
            counts.shared_count -= before.partly_used().count() as u64;
            counts.shared_slots -= partial_slots(before);
            sub_amount(&mut counts.free, before.free());
            let bucket = after.usage.free_whole as usize;
            if counts.bucket_sizes.len() <= bucket {
                counts.bucket_sizes.resize(bucket + 1, 0);
            }
            counts.bucket_sizes[bucket] += 1;
            counts.shared_count += after.partly_used().count() as u64;
            counts.shared_slots += partial_slots(after);
            add_amount(&mut counts.free, after.free());
            if counts.overlay_buckets.len() <= bucket {
                counts.overlay_buckets.resize_with(bucket + 1, Vec::new);
            }
            counts.overlay_buckets[bucket].push((after.free_cpu(), *idx));
            counts.overlay_shared.extend(
                after
                    .partly_used()
                    .map(|(gpu, room)| (room, after.free_cpu(), *idx, gpu)),
            );
        }
        for bucket in &mut counts.overlay_buckets {
            bucket.sort_unstable();
        }
        counts.overlay_shared.sort_unstable();
        counts
    }

    /// Whether the totals could hold the gang: the free amounts, and the
    /// workers the free GPUs hold counted GPU by GPU (O(G), or O(1000) for
    /// fractions).
    fn could_hold(&self, gang: &GangShape, demand: &Demand) -> bool {
        let workers = demand.workers;
        let per_worker = gang.per_worker;
        if self.free.cpu_milli < per_worker.cpu_milli.saturating_mul(workers)
            || self.free.memory_bytes < per_worker.memory_bytes.saturating_mul(workers)
            || self.free.gpu_milli < per_worker.gpu_milli.saturating_mul(workers)
        {
            return false;
        }
        let gpu_slots: u64 = match demand.gpu {
            GpuNeed::None => u64::MAX,
            GpuNeed::Whole(gpus) => self
                .bucket_sizes
                .iter()
                .enumerate()
                .map(|(bucket, size)| size.saturating_mul(bucket as u64 / u64::from(gpus)))
                .fold(0, u64::saturating_add),
            GpuNeed::Fraction(share) => self
                .bucket_sizes
                .iter()
                .enumerate()
                .map(|(bucket, size)| {
                    size.saturating_mul(bucket as u64 * u64::from(WHOLE_GPU / share))
                })
                .fold(self.shared_slots, u64::saturating_add),
        };
        gpu_slots >= workers
    }
}

/// One search: the pool as seen with the what-if usage of touched nodes, and, for
/// a gang whose labels or models select few nodes, a private index of those.
pub(super) struct Search<'a> {
    pool: &'a NodePool,
    gang: &'a GangShape,
    pub(super) demand: Demand,
    /// Touched nodes' usage after the what-if release; empty for plain `find`.
    overlay: &'a BTreeMap<usize, Usage>,
    /// Schedulable overlay nodes, keyed like `by_free_whole`, sorted.
    overlay_buckets: Vec<Vec<(u64, usize)>>,
    /// Partly used GPUs of schedulable overlay nodes, sorted.
    overlay_shared: Vec<SharedKey>,
    list: Option<ListIndex>,
    /// The kept index of the one GPU model the gang asks for, searched in
    /// place of the pool's (the overlay merged in as for the pool's).
    model: Option<&'a ModelUsage>,
    pub(super) n_buckets: usize,
}

impl NodePool {
    /// Where the gang goes with `overlay` standing in for the touched nodes'
    /// usage: one node if one holds it, else several, as the strategy says.
    pub(super) fn search(
        &self,
        gang: &GangShape,
        strategy: Strategy,
        overlay: &BTreeMap<usize, Usage>,
    ) -> Option<Vec<WorkerPlacement>> {
        let demand = Demand::of(gang)?;
        if demand.workers == 0 {
            return Some(Vec::new());
        }
        let random = matches!(strategy, Strategy::Random { .. });
        let search = Search::new(self, gang, demand, overlay, random)?;
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
        // FGD may pick the GPU of a single fractional worker too.
        let mut chosen_gpu = None;
        let assignment = if strategy == Strategy::Spread && demand.workers > 1 {
            search.spread_over_nodes()?
        } else if let Some(choice) = search.pick_single(strategy, &mut rng) {
            chosen_gpu = choice.gpu;
            vec![(choice.node, demand.workers)]
        } else if demand.workers > 1 {
            search.pack_over_nodes(strategy, &mut rng)?
        } else {
            return None;
        };
        let mut placements = Vec::with_capacity(demand.workers as usize);
        for (idx, count) in assignment {
            match (chosen_gpu, demand.gpu) {
                (Some(gpu), GpuNeed::Fraction(share)) => {
                    search
                        .view(idx)
                        .place_share_on(&demand, share, gpu, &mut placements);
                }
                _ => search.view(idx).place(&demand, count, &mut placements),
            }
        }
        assert_eq!(
            placements.len() as u64,
            demand.workers,
            "a gang is placed whole"
        );
        Some(placements)
    }
}

impl<'a> Search<'a> {
    /// Prepares a search, or `None` when counts alone show that the gang cannot
    /// fit: O(G + t log t) for t overlay nodes, plus O(l log l) when a constraint
    /// other than one GPU model narrows the search to l nodes (or the
    /// placement is `random`, which draws among them).
    fn new(
        pool: &'a NodePool,
        gang: &'a GangShape,
        demand: Demand,
        overlay: &'a BTreeMap<usize, Usage>,
        random: bool,
    ) -> Option<Self> {
        let mut model = None;
        let narrowing = match pool.narrowing(gang, demand.needs_gpu()) {
            Narrowing::Nothing => return None,
            Narrowing::OneModel(name) if !random => {
                // Walked in the same order as a private index of the model's
                // nodes would be, the nodes the gang may not use skipped.
                model = pool.model_usage.get(name);
                Narrowing::Any
            }
            Narrowing::OneModel(name) => {
                Narrowing::Among(pool.by_model.get(name).into_iter().collect())
            }
            narrowing => narrowing,
        };
        let counts = Counts::with_overlay(pool, &demand, overlay);
        if !counts.could_hold(gang, &demand) {
            return None;
        }
        let Counts {
            bucket_sizes,
            shared_count,
            overlay_buckets,
            overlay_shared,
            ..
        } = counts;
        let mut search = Self {
            pool,
            gang,
            demand,
            overlay,
            overlay_buckets,
            overlay_shared,
            list: None,
            model,
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

    /// The private index of the nodes in `sets` that the gang may use.
    fn list_index(&self, sets: &[&BTreeSet<usize>]) -> ListIndex {
        let mut list = ListIndex {
            buckets: vec![Vec::new(); self.n_buckets],
            shared: Vec::new(),
            nodes: Vec::new(),
        };
        let mut seen = AHashSet::new();
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

    /// Node `idx` with its what-if usage, if it has one.
    pub(super) fn view(&self, idx: usize) -> NodeView<'a> {
        let node = &self.pool.nodes[idx];
        NodeView {
            spec: &node.spec,
            usage: self.overlay.get(&idx).unwrap_or(&node.usage),
            schedulable: node.schedulable,
        }
    }

    /// The workload mix fragmentation-aware placement scores against, if set.
    pub(super) fn task_mix(&self) -> Option<&'a TaskMix> {
        self.pool.task_mix.as_ref()
    }

    /// Whether the gang may use node `idx` at all (schedulable, constraints).
    fn usable(&self, idx: usize) -> bool {
        let node = &self.pool.nodes[idx];
        node.schedulable && matches_constraints(&node.spec, self.gang, self.demand.needs_gpu())
    }

    /// How many of the gang's workers node `idx` holds, 0 if it may not be used.
    pub(super) fn fits(&self, idx: usize) -> u64 {
        if self.usable(idx) {
            self.view(idx).fit_count(&self.demand)
        } else {
            0
        }
    }

    /// Nodes with exactly `bucket` whole free GPUs and at least `min_cpu` free
    /// CPU, by free CPU (ascending, or descending).
    pub(super) fn bucket_stream(
        &self,
        bucket: usize,
        min_cpu: u64,
        descending: bool,
    ) -> NodeStream<'_> {
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
        let by_free_whole = self
            .model
            .map_or(&self.pool.by_free_whole, |model| &model.by_free_whole);
        let base: Box<dyn Iterator<Item = (u64, usize)> + '_> = match by_free_whole.get(bucket) {
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
    pub(super) fn shared_stream(&self, min_room: u32, min_cpu: u64) -> SharedStream<'_> {
        if let Some(list) = &self.list {
            return skip_scan_slice(&list.shared, min_room, min_cpu);
        }
        let shared = self.model.map_or(&self.pool.shared, |model| &model.shared);
        let base = skip_scan_set(shared, min_room, min_cpu);
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
    pub(super) fn packed_order(&self, workers: u64) -> NodeStream<'_> {
        let min_cpu = self.demand.cpu_milli.saturating_mul(workers);
        let from = self.demand.whole_gpus_for(workers);
        let buckets = (from..self.n_buckets)
            .flat_map(move |bucket| self.bucket_stream(bucket, min_cpu, false));
        match self.demand.gpu {
            GpuNeed::Fraction(share) => {
                let mut seen = AHashSet::new();
                let shared = self.shared_stream(share, min_cpu).map(|(_, _, idx, _)| idx);
                Box::new(shared.chain(buckets).filter(move |idx| seen.insert(*idx)))
            }
            GpuNeed::None | GpuNeed::Whole(_) => Box::new(buckets),
        }
    }

    /// Nodes that may hold `workers` workers, emptiest first: by whole free GPUs
    /// descending, then free CPU descending; for a fractional worker, then the
    /// nodes with no free GPU but a partly used one that fits.
    pub(super) fn spread_order(&self, workers: u64) -> NodeStream<'_> {
        let min_cpu = self.demand.cpu_milli.saturating_mul(workers);
        let from = self.demand.whole_gpus_for(workers);
        let buckets = (from..self.n_buckets)
            .rev()
            .flat_map(move |bucket| self.bucket_stream(bucket, min_cpu, true));
        match self.demand.gpu {
            GpuNeed::Fraction(share) => {
                let mut seen = AHashSet::new();
                let shared = self.shared_stream(share, min_cpu).map(|(_, _, idx, _)| idx);
                Box::new(buckets.chain(shared).filter(move |idx| seen.insert(*idx)))
            }
            GpuNeed::None | GpuNeed::Whole(_) => Box::new(buckets),
        }
    }

    /// One node that holds the whole gang, as the strategy prefers.
    fn pick_single(&self, strategy: Strategy, rng: &mut SplitMix64) -> Option<Choice> {
        let workers = self.demand.workers;
        let holds_all = |idx: &usize| self.fits(*idx) >= workers;
        let node = match strategy {
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
                            return Some(Choice {
                                node: idx,
                                gpu: None,
                            });
                        }
                    }
                }
                let fitting: Vec<usize> = self.packed_order(workers).filter(holds_all).collect();
                (!fitting.is_empty()).then(|| fitting[rng.index(fitting.len())])
            }
            Strategy::FragmentationAware => match self.task_mix() {
                Some(mix) => return self.pick_by_expected_fragmentation(mix),
                None => self.pick_least_fragmenting(),
            },
        };
        node.map(|node| Choice { node, gpu: None })
    }
}
