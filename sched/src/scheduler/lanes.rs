//! The ordered walk over waiting trials: lanes, queue ordering and fair share,
//! and what visiting one trial decides (start it, or why it waits).
//!
//! # Keeping a pass cheap
//!
//!
//! Waiting trials sit in ordered sets per queue, base priority, attained-service
//! level and urgency, keyed by `(line_at, id)`: the submission time, later by
//! `attained_service.delay_per_gpu` per GPU beyond one when aging is off. Aging
//! never reorders such a set (with aging on, `line_at` is `submitted_at`, and an
//! older trial has aged at least as much), so a lane is a k-way merge of the sets' heads by current
//! effective priority, then urgency: nothing is sorted per pass.
//!
//! Urgency (a pipeline stage on its critical path) only breaks ties between
//! equal effective priorities: it never beats a priority class, a quota or
//! fair share between queues, and a long waiter that aging has lifted a step
//! goes before any urgent trial still below it, so urgency cannot starve
//! anyone aging would not. Under `order: fifo` it is ignored like priority. A pass also stops early:
//! a lane ends after its first blocked trial once the free room in the cluster is
//! below the smallest waiting demand; under a backfill reservation the pass ends
//! as soon as no trial could backfill (the reservation is due, or nothing fits);
//! preemption candidates sit in sets ordered by priority then latest start, entered
//! per priority at the minimum-run-time cutoff; gang shapes that did not fit are remembered
//! for the pass (a larger one with the same constraints cannot fit either); at most
//! `MAX_EXAMINED_PER_PASS` trials that do not start are looked at, and at most
//! `MAX_PREEMPTION_ATTEMPTS_PER_PASS` preemption searches and
//! `MAX_BACKFILL_RESERVATIONS_PER_PASS` reservation searches are made; a lane
//! stops once none of its trials can start and looking at them would change
//! nothing else (`lane_cannot_start`: every gang waiting in it is ruled out by
//! the free room or a failed placement, which the index's per-queue counts of
//! waiting gangs tell without visiting them). Trials not reached keep the
//! reason their lane gives (`BehindHigherPriority`, or `GangDoesNotFit` when
//! nothing of it fits).
//!
//! Preemption and backfill reservations are asked for here but computed in
//! their own modules.

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::ops::Bound;

use xp_runtime::clock::UnixMillis;
use xp_runtime::ids::TrialId;

use super::PolicyCore;
use super::backfill::MAX_BACKFILL_RESERVATIONS_PER_PASS;
use super::index::WaitingSet;
use super::pass::Pass;
use super::preemption::MAX_PREEMPTION_ATTEMPTS_PER_PASS;
use super::quota::QuotaBlock;
use super::resource_vec::{ResourceVec, covers, dominant_share, minus, placement_total, plus};
use super::trial::{Placed, Standing};
use crate::config::{HeadOfLine, Order, RESOURCE_NAMES};
use crate::{Amount, Decision, TrialRequest, WaitReason, WorkerPlacement};

/// The most waiting trials one pass looks at; the rest keep their lane's reason.
const MAX_EXAMINED_PER_PASS: usize = 4096;
/// The most distinct gangs of a lane's waiting trials that `lane_cannot_start`
/// compares with the pass's failures; a lane of more is walked trial by trial.
const MAX_SHAPES_CHECKED: usize = 64;

/// What looking at one trial led to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Outcome {
    /// It was placed.
    Started,
    /// It waits for a reason that does not hold up the trials behind it.
    Passed,
    /// No node set could ever hold it.
    NeverFits,
    /// Its queue's quota stops it.
    OverQuota(QuotaBlock),
    /// There is no room for it now.
    NoRoom,
    /// Units of a lease it names are not free now.
    NoLease,
}

/// An ordered walk over waiting trials: a k-way merge of per-(queue, priority,
/// urgency) FIFO sets by the current key of each set's head.
#[derive(Debug)]
struct Lane {
    queues: Vec<usize>,
    heap: BinaryHeap<Reverse<LaneEntry>>,
}

/// Effective priority (highest first), then attained-service level (lowest
/// first), then urgency (highest first), then `line_at` (submission, later
/// by `delay_per_gpu` per GPU beyond one), then id.
pub(super) type OrderKey = (Reverse<i64>, u8, Reverse<u32>, UnixMillis, TrialId);

#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
struct LaneEntry {
    /// Where the trial goes in its lane (effective priority and urgency are
    /// zero under FIFO).
    key: OrderKey,
    queue: usize,
    /// The set it heads: base priority, level and urgency.
    set: WaitingSet,
}

/// The lanes of one pass and how far each may go.
struct Walk {
    lanes: Vec<Lane>,
    /// Lanes that may still start trials.
    active: Vec<bool>,
    /// Per lane, the highest effective priority of a trial that skipped
    /// ahead for lack of room: work of lower priority does not start in
    /// the room it waits for (it would only be preempted for it).
    skip_floor: Vec<Option<i64>>,
    /// Per lane, the free room and count of failed gang shapes at which some
    /// gang of it could still start: no need to look again until either
    /// changes.
    could_start_at: Vec<Option<(ResourceVec, usize)>>,
}

impl Walk {
    /// Stops `lane`'s queues for the pass, their trials keeping `reason`.
    fn stop_lane(
        &mut self,
        core: &mut PolicyCore,
        lane: usize,
        pass: &mut Pass,
        reason: &WaitReason,
    ) {
        core.stop_queues(&self.lanes[lane].queues, pass, reason);
        self.active[lane] = false;
    }
}

/// The trial a walk is visiting, and its lane.
#[derive(Debug, Clone, Copy)]
struct Visit {
    lane: usize,
    id: TrialId,
    queue: usize,
}

impl PolicyCore {
    /// Step 2 of a pass: visits waiting trials lane by lane, starting what can
    /// start and asking for preemption or a backfill reservation for what
    /// cannot, until every lane is done or stopped.
    pub(super) fn run_lanes(&mut self, pass: &mut Pass, decisions: &mut Vec<Decision>) {
        let n_queues = self.queue_info.len();
        let lanes: Vec<Lane> = match self.config.order {
            Order::Fair => (0..n_queues)
                .map(|queue| self.lane(vec![queue], pass.now))
                .collect(),
            Order::Fifo | Order::Priority => vec![self.lane((0..n_queues).collect(), pass.now)],
        };
        let mut walk = Walk {
            active: vec![true; lanes.len()],
            skip_floor: vec![None; lanes.len()],
            could_start_at: vec![None; lanes.len()],
            lanes,
        };
        while let Some(lane) = self.pick_lane(&walk.lanes, &walk.active, pass.capacity) {
            // 1. The whole pass ends once its budget is spent or nothing can backfill.
            if self.pass_ends_early(&walk.lanes, pass) {
                break;
            }
            // 2. The lane's next trial, unless it is below one that skipped ahead.
            let Some((id, queue)) = self.pop(&mut walk.lanes[lane], pass) else {
                walk.active[lane] = false;
                continue;
            };
            let visit = Visit { lane, id, queue };
            pass.visited_waiting[queue] += 1;
            if self.below_skip_floor(&mut walk, visit, pass) {
                continue;
            }
            // 3. The visit, and what its outcome asks of the lane.
            let outcome = self.evaluate(id, queue, pass, decisions);
            // Starts are not limited: the budget bounds the work spent on trials
            // that stay waiting.
            if outcome == Outcome::Started {
                pass.visited_waiting[queue] -= 1;
            } else {
                pass.examined += 1;
            }
            match outcome {
                Outcome::Started | Outcome::Passed | Outcome::NeverFits => {}
                Outcome::OverQuota(block) => {
                    self.after_over_quota(&mut walk, visit, block, pass, decisions);
                }
                Outcome::NoLease => {
                    // A lease, not the nodes, holds it: the lane goes on, and
                    // later trials naming the same lease wait behind it.
                    // A trial only behind another's wait for the lease does
                    // not preempt: the one ahead goes first.
                    if let Some(lease) = self.lease_shortage(id, None)
                        && !self.try_preempt(id, queue, None, pass, decisions)
                    {
                        pass.lease_blocked.insert(lease);
                    }
                }
                Outcome::NoRoom => self.after_no_room(&mut walk, visit, pass, decisions),
            }
            // 4. The rest of the lane, when none of it can start.
            if outcome != Outcome::Started && walk.active[lane] {
                self.skip_idle_rest(&mut walk, lane, pass);
            }
        }
    }

    /// Ends `lane`'s walk when none of its trials left can start and looking
    /// at each would change nothing but its wait reason (`lane_cannot_start`),
    /// and the pass cannot reach its budget of trials looked at whatever they
    /// would count towards it. (Where it can, the walk would end the pass at
    /// the budget, or stop the lane first for a reason its trials hold: it
    /// goes on.)
    fn skip_idle_rest(&mut self, walk: &mut Walk, lane: usize, pass: &mut Pass) {
        let left_everywhere = (0..self.queue_info.len())
            .filter(|&queue| !pass.stopped[queue])
            .map(|queue| {
                let left = self.index.queues[queue]
                    .n_waiting
                    .saturating_sub(pass.visited_waiting[queue]);
                usize::try_from(left).unwrap_or(usize::MAX)
            })
            .fold(pass.examined, usize::saturating_add);
        if left_everywhere < self.examined_budget() && self.lane_cannot_start(walk, lane, pass) {
            walk.stop_lane(self, lane, pass, &WaitReason::GangDoesNotFit);
        }
    }

    /// The most trials one pass looks at that do not start.
    fn examined_budget(&self) -> usize {
        #[cfg(test)]
        if let Some(budget) = self.examined_budget_override {
            return budget;
        }
        MAX_EXAMINED_PER_PASS
    }

    /// Whether no trial left in `lane` can start in this pass, and looking at
    /// each would change nothing but its wait reason, so the lane may stop
    /// with the same decisions. Every gang waiting in the lane's queues is one
    /// the free room or a failed placement already rules out (room only
    /// shrinks during a pass); none names a lease (a short lease makes later
    /// trials of other lanes wait); the pass has no preemption search left
    /// to make for them, nor a backfill reservation (its queues have had
    /// theirs, or all their trials still skip ahead). The budget of trials
    /// looked at, which their visits would count towards, is
    /// `skip_idle_rest`'s to check. Without this a pass on a congested cluster walked the whole queue:
    /// at 200,000 generated jobs, nine visits in ten found no room this way.
    fn lane_cannot_start(&self, walk: &mut Walk, lane: usize, pass: &Pass) -> bool {
        #[cfg(test)]
        if self.walk_every_trial {
            return false;
        }
        let searches_left = self.config.preemption.enabled
            && pass.preemption_attempts < MAX_PREEMPTION_ATTEMPTS_PER_PASS;
        let reservations_left = self.config.backfill
            && pass.backfill_reservations < MAX_BACKFILL_RESERVATIONS_PER_PASS
            && !pass.nothing_fits();
        let queues = &walk.lanes[lane].queues;
        let open = || queues.iter().copied().filter(|&queue| !pass.stopped[queue]);
        if searches_left
            || open().any(|queue| {
                self.index.queues[queue].waiting_with_leases > 0
                    || (reservations_left
                        && !pass.blocked_seen[queue]
                        && !self.all_skip_ahead(queue, pass.now))
            })
        {
            return false;
        }
        let state = (pass.free, pass.failed_shape_count());
        if walk.could_start_at[lane] == Some(state) {
            return false;
        }
        let shapes: usize = open()
            .map(|queue| self.index.queues[queue].waiting_shapes.len())
            .sum();
        let none_fits = shapes <= MAX_SHAPES_CHECKED
            && open().all(|queue| {
                self.index.queues[queue]
                    .waiting_shapes
                    .iter()
                    .all(|(gang, (demand, _))| {
                        !covers(pass.free, *demand) || pass.shape_failed(gang)
                    })
            });
        if !none_fits {
            walk.could_start_at[lane] = Some(state);
        }
        none_fits
    }

    /// Whether the rest of the pass is skipped, every lane's trials keeping the
    /// reason why: the pass looked at its most trials, or under a reservation
    /// no trial can start (by backfilling) any more.
    fn pass_ends_early(&mut self, lanes: &[Lane], pass: &mut Pass) -> bool {
        if pass.examined >= self.examined_budget() {
            for lane in lanes {
                self.stop_queues(&lane.queues, pass, &WaitReason::BehindHigherPriority);
            }
            return true;
        }
        // Under a reservation a trial can only start by backfilling; when no
        // trial can (the reservation is due, or nothing waiting fits the free
        // room), the rest of the pass would refuse every trial one by one.
        if let Some((limit, holder)) = pass.backfill_limit
            && (limit <= pass.now || pass.nothing_fits())
        {
            let reason = WaitReason::ReservedFor { trial: holder };
            for lane in lanes {
                self.stop_queues(&lane.queues, pass, &reason);
            }
            return true;
        }
        false
    }

    /// Whether the visited trial's priority is below that of a trial that
    /// skipped ahead in its lane, which then stops: it would start in the
    /// room the other waits for.
    fn below_skip_floor(&mut self, walk: &mut Walk, visit: Visit, pass: &mut Pass) -> bool {
        let Some(floor) = walk.skip_floor[visit.lane] else {
            return false;
        };
        let below = self
            .trials
            .get(&visit.id)
            .is_some_and(|trial| self.effective_priority(&trial.request, pass.now) < floor);
        if below {
            self.set_reason(visit.id, WaitReason::BehindHigherPriority);
            walk.stop_lane(self, visit.lane, pass, &WaitReason::BehindHigherPriority);
        }
        below
    }

    /// Its queue's quota holds the visited trial: preempt for it, or (under
    /// strict head of line or backfill) stop its queue.
    fn after_over_quota(
        &mut self,
        walk: &mut Walk,
        visit: Visit,
        block: QuotaBlock,
        pass: &mut Pass,
        decisions: &mut Vec<Decision>,
    ) {
        if self.try_preempt(visit.id, visit.queue, Some(block), pass, decisions) {
            return;
        }
        if self.config.head_of_line == HeadOfLine::Strict || self.config.backfill {
            // Only this queue: its own quota holds it, not the nodes.
            self.stop_queues(&[visit.queue], pass, &WaitReason::BehindHigherPriority);
            if self.config.order == Order::Fair {
                walk.active[visit.lane] = false;
            }
        }
    }

    /// No room for the visited trial: preempt for it, let smaller work skip
    /// ahead of it, reserve room for it under backfill, or stop its lane.
    fn after_no_room(
        &mut self,
        walk: &mut Walk,
        visit: Visit,
        pass: &mut Pass,
        decisions: &mut Vec<Decision>,
    ) {
        let Visit { lane, id, queue } = visit;
        if self.try_preempt(id, queue, None, pass, decisions) {
            return;
        }
        let nothing_fits = pass.nothing_fits();
        if !nothing_fits && self.skips_ahead(id, pass.now) {
            // Least attained service: smaller work of its priority
            // behind it that fits now goes ahead until it has
            // waited long enough to hold the line.
            let effective = self.trials.get(&id).map_or(i64::MIN, |trial| {
                self.effective_priority(&trial.request, pass.now)
            });
            walk.skip_floor[lane] =
                Some(walk.skip_floor[lane].map_or(effective, |floor| floor.max(effective)));
            return;
        }
        if self.config.backfill {
            self.reserve_for_backfill(id, queue, nothing_fits, pass);
        } else if self.config.head_of_line == HeadOfLine::Strict {
            walk.stop_lane(self, lane, pass, &WaitReason::BehindHigherPriority);
            return;
        }
        if nothing_fits {
            // Nothing behind it could start either.
            walk.stop_lane(self, lane, pass, &WaitReason::GangDoesNotFit);
        }
    }

    /// Why a trial that fits no node even when empty waits: no node is
    /// schedulable at all, or none matches it.
    fn never_fits_reason(&self) -> WaitReason {
        if self.pool.nodes().any(|(_, schedulable)| schedulable) {
            WaitReason::NoMatchingNodes
        } else {
            WaitReason::NoNodes
        }
    }

    /// Stops the pass for these queues; their trials not yet looked at keep
    /// `reason`.
    fn stop_queues(&mut self, queues: &[usize], pass: &mut Pass, reason: &WaitReason) {
        for &queue in queues {
            if !pass.stopped[queue] {
                pass.stopped[queue] = true;
                self.unexamined[queue] = reason.clone();
            }
        }
    }

    /// Base priority plus the aging boost at `now`.
    pub(super) fn effective_priority(&self, request: &TrialRequest, now: UnixMillis) -> i64 {
        let boost = self.config.aging.map_or(0, |aging| {
            aging.boost(now.saturating_sub(request.submitted_at))
        });
        request.priority.saturating_add(boost)
    }

    /// The heap entry of a waiting trial at the head of its FIFO set.
    fn lane_entry(
        &self,
        queue: usize,
        set: WaitingSet,
        line_at: UnixMillis,
        id: TrialId,
        now: UnixMillis,
    ) -> LaneEntry {
        let (priority, level, urgency) = set;
        let (effective, level, urgency) = match self.config.order {
            Order::Fifo => (0, 0, 0),
            Order::Priority | Order::Fair => {
                // With aging on, `line_at` is `submitted_at` (no size delay).
                let boost = self
                    .config
                    .aging
                    .map_or(0, |aging| aging.boost(now.saturating_sub(line_at)));
                (priority.saturating_add(boost), level, urgency)
            }
        };
        LaneEntry {
            key: (Reverse(effective), level, Reverse(urgency), line_at, id),
            queue,
            set,
        }
    }

    /// A lane over these queues, holding the head of each of their sets.
    fn lane(&self, queues: Vec<usize>, now: UnixMillis) -> Lane {
        let mut heap = BinaryHeap::new();
        for &queue in &queues {
            for (&set_key, set) in &self.index.queues[queue].waiting {
                if let Some(&(line_at, id)) = set.first() {
                    heap.push(Reverse(self.lane_entry(queue, set_key, line_at, id, now)));
                }
            }
        }
        Lane { queues, heap }
    }

    /// The lane's next trial and its queue, skipping stopped queues; the set
    /// it came from puts its next trial in the heap.
    fn pop(&self, lane: &mut Lane, pass: &Pass) -> Option<(TrialId, usize)> {
        while let Some(Reverse(entry)) = lane.heap.pop() {
            if pass.stopped[entry.queue] {
                continue;
            }
            let (_, _, _, line_at, id) = entry.key;
            let next = self.index.queues[entry.queue]
                .waiting
                .get(&entry.set)
                .and_then(|set| {
                    set.range((Bound::Excluded((line_at, id)), Bound::Unbounded))
                        .next()
                        .copied()
                });
            if let Some((next_line_at, next_id)) = next {
                lane.heap.push(Reverse(self.lane_entry(
                    entry.queue,
                    entry.set,
                    next_line_at,
                    next_id,
                    pass.now,
                )));
            }
            return Some((id, entry.queue));
        }
        None
    }

    /// The lane to take the next trial from: under fair share, the queue with the
    /// lowest weighted dominant share (ties to the first declared).
    fn pick_lane(&self, lanes: &[Lane], active: &[bool], capacity: ResourceVec) -> Option<usize> {
        if self.config.order != Order::Fair {
            return active.first().copied().filter(|active| *active).map(|_| 0);
        }
        let mut best: Option<(f64, usize)> = None;
        for (lane_index, lane) in lanes.iter().enumerate() {
            if !active[lane_index] {
                continue;
            }
            let queue = lane.queues[0];
            let share = dominant_share(
                self.index.queues[queue].usage,
                capacity,
                self.queue_info[queue].weight,
            );
            if best.is_none_or(|(best_share, _)| share < best_share) {
                best = Some((share, lane_index));
            }
        }
        best.map(|(_, lane_index)| lane_index)
    }

    /// Looks at one waiting trial: starts it if its quota and the pool allow
    /// it, else records why it waits.
    fn evaluate(
        &mut self,
        id: TrialId,
        queue: usize,
        pass: &mut Pass,
        decisions: &mut Vec<Decision>,
    ) -> Outcome {
        self.fit_elastic(id, queue, pass);
        let Some(trial) = self.trials.get(&id) else {
            return Outcome::Passed;
        };
        if !matches!(trial.standing, Standing::Waiting) || self.reservations.contains_key(&id) {
            return Outcome::Passed;
        }
        if let Some((limit, holder)) = pass.backfill_limit {
            let ends_in_time = self
                .duration(trial)
                .is_some_and(|duration| pass.now.saturating_add(duration) <= limit);
            if !ends_in_time {
                self.set_reason(id, WaitReason::ReservedFor { trial: holder });
                return Outcome::Passed;
            }
        }
        let demand = trial.demand;
        if let Some(block) = self.quota_block(queue, &demand, &pass.usage_view) {
            self.set_reason(
                id,
                WaitReason::OverQuota {
                    resource: RESOURCE_NAMES[block.resource()].to_owned(),
                },
            );
            return Outcome::OverQuota(block);
        }
        if let Some(lease) = self.lease_quota_block(id) {
            self.set_reason(
                id,
                WaitReason::OverQuota {
                    resource: format!("lease {lease}"),
                },
            );
            return Outcome::Passed;
        }
        if !self.ever_fits(id) {
            self.set_reason(id, self.never_fits_reason());
            return Outcome::NeverFits;
        }
        if let Some(lease) = self.lease_shortage(id, Some(pass)) {
            self.set_reason(id, WaitReason::WaitingForLease { lease });
            return Outcome::NoLease;
        }
        let gang = &self.trials[&id].request.gang;
        let no_room = no_room(gang, pass.free);
        if !covers(pass.free, demand) || pass.shape_failed(gang) {
            self.set_reason(id, no_room);
            return Outcome::NoRoom;
        }
        // Found no room before, with no room gained since: the search would
        // fail again.
        let failed_before = self.no_room.shape_failed(self.room_epoch, gang);
        let found = if failed_before {
            None
        } else {
            self.pool.find(gang, self.strategy(id))
        };
        let Some(workers) = found else {
            let gang = gang.clone();
            pass.record_failed_shape(&gang);
            if !failed_before {
                self.no_room.record_shape(self.room_epoch, &gang);
            }
            self.set_reason(id, no_room);
            return Outcome::NoRoom;
        };
        if let Some(holder) = self.plan_conflict(pass, &workers, &[]) {
            self.set_reason(id, WaitReason::ReservedFor { trial: holder });
            return Outcome::Passed;
        }
        decisions.push(self.start(id, workers, pass));
        Outcome::Started
    }

    /// Places a waiting trial where the pool said it fits.
    pub(super) fn start(
        &mut self,
        id: TrialId,
        workers: Vec<WorkerPlacement>,
        pass: &mut Pass,
    ) -> Decision {
        self.pool
            .allocate(&workers)
            .expect("a placement the pool has just found is one it accepts");
        let now = pass.now;
        let started_pass = self.pass;
        let duration = self.trials.get(&id).and_then(|trial| self.duration(trial));
        let placed_workers = workers.clone();
        let queue_and_demand = self.change(id, |trial| {
            trial.standing = Standing::Placed(Placed {
                workers: placed_workers,
                started_at: now,
                started_pass,
                expected_end: duration.map(|duration| now.saturating_add(duration)),
                preempt_deadline: None,
                lost_nodes: Vec::new(),
                last_checkpoint: None,
            });
            (trial.queue, trial.demand)
        });
        if let Some((queue, demand)) = queue_and_demand {
            pass.usage_view[queue] = plus(pass.usage_view[queue], demand);
        }
        pass.free = minus(pass.free, placement_total(&workers));
        self.forget_approvals(id);
        Decision::Place { trial: id, workers }
    }
}

/// Why `gang` waits when `free` (all schedulable nodes together) does not
/// hold it now.
fn no_room(gang: &crate::GangShape, free: ResourceVec) -> WaitReason {
    WaitReason::NoRoom {
        workers: gang.workers,
        per_worker: gang.per_worker,
        free: Amount {
            gpu_milli: free[0],
            cpu_milli: free[1],
            memory_bytes: free[2],
        },
    }
}
