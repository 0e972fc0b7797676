//! Fragmentation-aware placement of a gang on one node, and the fragmentation
//! measure it breaks ties with.
//!
//! The choice only orders nodes that already hold the whole gang; whether a
//! gang fits, and where its workers sit on the node, are decided elsewhere.

use std::collections::HashSet;

use super::WHOLE_GPU;
use super::node::{GpuNeed, NodeView};
use super::search::Search;

/// Fragmentation-aware placement scores at most this many nodes from the tight
/// end (least free CPU) of each whole-free-GPU bucket...
const FRAGMENTATION_CANDIDATES_LOW: usize = 6;
/// ...and this many from the loose end, so that a node with CPU to spare is
/// among the candidates too.
const FRAGMENTATION_CANDIDATES_HIGH: usize = 2;
/// Fragmentation-aware placement of a fractional worker scores at most this many
/// nodes that have a partly used GPU with room for it.
const FRAGMENTATION_CANDIDATES_SHARED: usize = 8;

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
}
