//! The scratch state of one decision pass: free room, the quota view, which
//! queues are stopped, backfill limits, the placements planned for preemptors and
//! the counters of the budgets that keep a pass cheap.
//!
//! A [`Pass`] lives for one [`PolicyCore::decide`] call and is dropped with it;
//! nothing in it outlives the pass or is read by the public API.

use std::collections::{BTreeSet, HashMap};

use xp_runtime::clock::UnixMillis;
use xp_runtime::ids::{NodeId, TrialId};

use super::PolicyCore;
use super::no_room::{at_least_as_hard, is_sorted_subset};
use super::resource_vec::{ResourceVec, plus, resource_vec};
use crate::{GangShape, WorkerPlacement};

/// The most placement searches one preemption or reservation search makes.
pub(super) const MAX_PLACEMENT_CHECKS: usize = 24;
/// The most gang shapes remembered as not fitting in one pass.
const MAX_FAILED_SHAPES: usize = 64;

/// Scratch state of one pass.
#[derive(Debug)]
pub(super) struct Pass {
    /// The time of the pass.
    pub(super) now: UnixMillis,
    /// The schedulable nodes' capacity.
    pub(super) capacity: ResourceVec,
    /// Free room on schedulable nodes, less what this pass placed.
    pub(super) free: ResourceVec,
    /// The smallest waiting demand per resource at the start of the pass.
    min_waiting: ResourceVec,
    /// Usage plus reservations per queue: what quota checks of new work see.
    pub(super) usage_view: Vec<ResourceVec>,
    /// Usage per queue when the pass began. Reclaim takes only from queues that
    /// were borrowing before the pass: borrowing that this very pass started is
    /// not undone by stopping older work.
    pub(super) start_usage: Vec<ResourceVec>,
    /// Queues whose remaining trials are not looked at in this pass.
    pub(super) stopped: Vec<bool>,
    /// Queues whose first trial without room has been dealt with.
    pub(super) blocked_seen: Vec<bool>,
    /// The earliest backfill reservation and its holder.
    pub(super) backfill_limit: Option<(UnixMillis, TrialId)>,
    /// Backfill reservations computed so far.
    pub(super) backfill_reservations: usize,
    /// Placements planned for trials waiting on preemption.
    pub(super) plans: Vec<Plan>,
    /// The plans touching each node, as indexes into `plans`.
    pub(super) plan_nodes: HashMap<NodeId, Vec<usize>>,
    /// Gang shapes that did not fit in this pass.
    failed_shapes: Vec<GangShape>,
    /// Gang shapes that did not fit even with all the candidate victims of a
    /// search gone, with those candidates (sorted). Room only shrinks during a
    /// pass, so a gang at least as large fails among any of them too.
    failed_with_freed: Vec<(GangShape, Vec<TrialId>)>,
    /// The last answer of the preemption search's `more_served`, and what it
    /// answered.
    more_served: Option<(MoreServedKey, Vec<TrialId>)>,
    /// Trials looked at that did not start.
    pub(super) examined: usize,
    /// Per queue, its trials looked at in this pass that still wait.
    pub(super) visited_waiting: Vec<u64>,
    /// Preemption searches made.
    pub(super) preemption_attempts: usize,
    /// Leases a trial of this pass found short: later trials naming them wait
    /// behind it.
    pub(super) lease_blocked: BTreeSet<String>,
}

impl Pass {
    /// Whether the free room is below the smallest waiting demand in some
    /// resource, so no waiting trial can start.
    pub(super) fn nothing_fits(&self) -> bool {
        (0..3).any(|r| self.free[r] < self.min_waiting[r])
    }

    /// Whether a gang at least as large, with the same constraints, did not fit.
    pub(super) fn shape_failed(&self, gang: &GangShape) -> bool {
        self.failed_shapes
            .iter()
            .any(|failed| at_least_as_hard(gang, failed))
    }

    /// How many gang shapes this pass found no room for: it only grows.
    pub(super) fn failed_shape_count(&self) -> usize {
        self.failed_shapes.len()
    }

    /// Remembers a gang shape that did not fit, while there is room to.
    pub(super) fn record_failed_shape(&mut self, gang: &GangShape) {
        if self.failed_shapes.len() < MAX_FAILED_SHAPES {
            self.failed_shapes.push(gang.clone());
        }
    }

    /// Whether a gang at least as large did not fit with a superset of
    /// `freed` (sorted) gone.
    pub(super) fn failed_with_freed(&self, gang: &GangShape, freed: &[TrialId]) -> bool {
        self.failed_with_freed
            .iter()
            .any(|(failed, among)| at_least_as_hard(gang, failed) && is_sorted_subset(freed, among))
    }

    /// Remembers that `gang` did not fit with `freed` (sorted) gone, while
    /// there is room to.
    pub(super) fn record_failed_with_freed(&mut self, gang: &GangShape, freed: Vec<TrialId>) {
        if self.failed_with_freed.len() < MAX_FAILED_SHAPES {
            self.failed_with_freed.push((gang.clone(), freed));
        }
    }

    /// The `more_served` answer to `key`: the remembered one when `key` was
    /// the last asked, else what `walk` finds, remembered.
    pub(super) fn more_served(
        &mut self,
        key: MoreServedKey,
        walk: impl FnOnce() -> Vec<TrialId>,
    ) -> &[TrialId] {
        if self
            .more_served
            .as_ref()
            .is_none_or(|(last, _)| *last != key)
        {
            self.more_served = Some((key, walk()));
        }
        self.more_served
            .as_ref()
            .map_or(&[], |(_, victims)| victims.as_slice())
    }

    /// Records where `holder` will go once `victims` have stopped.
    pub(super) fn add_plan(
        &mut self,
        holder: TrialId,
        workers: Vec<WorkerPlacement>,
        victims: Vec<TrialId>,
    ) {
        let index = self.plans.len();
        for worker in &workers {
            let on_node = self.plan_nodes.entry(worker.node).or_default();
            if on_node.last() != Some(&index) {
                on_node.push(index);
            }
        }
        self.plans.push(Plan {
            holder,
            workers,
            victims,
        });
    }
}

/// What the running work that a preemptor may stop for service alone
/// depends on within a pass: its queue, priority and attained-service level,
/// and how many decisions the pass had made (each may change placed work).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct MoreServedKey {
    pub(super) queue: usize,
    pub(super) priority: i64,
    pub(super) level: u8,
    pub(super) decisions_made: usize,
}

/// Where a trial waiting on preemption will go once its victims have stopped.
#[derive(Debug)]
pub(super) struct Plan {
    /// The trial waiting on preemption.
    pub(super) holder: TrialId,
    /// Where its workers will go.
    pub(super) workers: Vec<WorkerPlacement>,
    /// Its victims still stopping.
    pub(super) victims: Vec<TrialId>,
}

impl PolicyCore {
    /// The scratch state of a new pass at `now`.
    pub(super) fn begin_pass(&self, now: UnixMillis) -> Pass {
        let n_queues = self.queue_info.len();
        Pass {
            now,
            capacity: resource_vec(&self.pool.capacity()),
            free: resource_vec(&self.pool.free()),
            min_waiting: self.index.min_waiting_demand(),
            usage_view: self
                .index
                .queues
                .iter()
                .map(|queue| plus(queue.usage, queue.reserved))
                .collect(),
            start_usage: self.index.queues.iter().map(|queue| queue.usage).collect(),
            stopped: vec![false; n_queues],
            blocked_seen: vec![false; n_queues],
            backfill_limit: None,
            backfill_reservations: 0,
            plans: Vec::new(),
            plan_nodes: HashMap::new(),
            failed_shapes: Vec::new(),
            failed_with_freed: Vec::new(),
            more_served: None,
            examined: 0,
            visited_waiting: vec![0; n_queues],
            preemption_attempts: 0,
            lease_blocked: BTreeSet::new(),
        }
    }
}
