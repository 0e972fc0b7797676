//! Elastic trials: gangs whose size the policy moves between a minimum and a
//! maximum.
//!
//! Rules (each a small hook elsewhere, the decisions here):
//! - *Start*: a waiting elastic trial waits at its minimum (so it is counted,
//!   ordered and preempted for like any gang of that size); when a pass visits
//!   it, `fit_elastic` sets it to the largest size in `[min, max]` that its
//!   quota and the free room allow now, and the visit goes on as for any trial.
//! - *Grow*: at the end of a pass in which no trial waits and no preemption is
//!   pending, each elastic trial below its maximum that has run
//!   `min_run_time` since it last started or resized grows to the largest size
//!   that fits idle room (its new workers' resources are held from now on),
//!   oldest submission first. The interval keeps it from thrashing: one resize
//!   per trial per `min_run_time`. Any waiting trial, even one that cannot
//!   start now for its quota or constraints, holds growth back: idle room is
//!   not given away while someone is in line for it.
//! - *Shrink*: before a trial that cannot start preempts anything, elastic trials of
//!   strictly lower priority that preemption could stop (preemptible, run
//!   `min_run_time` since they first started, in the queues that can relieve
//!   what blocks it, and not in a queue whose preemptions need an admin's
//!   approval) give up their
//!   highest ranks, never below their minimum and no more than needed: lowest
//!   priority first, then the most recently resized. A shrink restarts the
//!   whole gang from its checkpoint, so under `max_loss` it obeys the same
//!   rule as a preemption (`worth_its_loss`): one that would lose more waits
//!   until the claimant has waited as long as the GPU time it would lose. While such a shrink is in
//!   flight its beneficiary waits for it (`WaitingForPreemption`) instead of
//!   preempting; once it is done the freed room is free like any other.
//! - A resize is a [`Decision::Resize`]: the caller stops the gang through its
//!   checkpoint and, once it is gone, reports [`PolicyCore::resized`] and starts
//!   it again on the new placement. The lower ranks keep their places; a shrink
//!   releases the dropped workers' resources only then.
//!
//! Invariants (`check_elastic`, and the random event sequences of the tests):
//! a waiting elastic trial asks for its minimum; a placed one holds between its
//! minimum and maximum workers, its gang whole; a shrink in flight goes to a
//! prefix of what the trial holds; nothing is over-allocated during a resize,
//! since a growth allocates before it is decided and a shrink frees after.

use std::collections::BTreeMap;

use xp_runtime::clock::UnixMillis;
use xp_runtime::ids::TrialId;

use super::PolicyCore;
use super::pass::{MAX_PLACEMENT_CHECKS, Pass};
use super::preemption::MAX_PREEMPTION_ATTEMPTS_PER_PASS;
use super::quota::QuotaBlock;
use super::resource_vec::{ResourceVec, covers, gang_demand, minus, placement_total, plus};
use super::trial::Standing;
use crate::config::Approval;
use crate::place::Strategy;
use crate::{Decision, GangShape, ResizeReason, WaitReason, WorkerPlacement};

/// The most placement searches the growth step makes in one pass.
const MAX_GROW_CHECKS: usize = 64;

/// An elastic trial's range and its resize in flight.
#[derive(Debug, Clone, PartialEq)]
pub(super) struct Elastic {
    /// The fewest workers it runs with.
    pub(super) min: u32,
    /// The most workers it runs with.
    pub(super) max: u32,
    /// When it last started or resized: it is not resized again within
    /// `min_run_time` of that.
    pub(super) sized_at: UnixMillis,
    /// A resize decided and not yet reported done.
    pub(super) resize: Option<InFlight>,
}

/// A resize the caller is carrying out.
#[derive(Debug, Clone, PartialEq)]
pub(super) struct InFlight {
    /// Where the gang goes once restarted.
    pub(super) workers: Vec<WorkerPlacement>,
    /// The waiting trial a shrink makes room for; `None` for a growth.
    pub(super) for_trial: Option<TrialId>,
}

/// The elastic trials, by id.
pub(super) type ElasticTable = BTreeMap<TrialId, Elastic>;

impl PolicyCore {
    /// Makes a known trial elastic, between `min` and `max` workers (its
    /// request's `gang.workers` is its size now when placed, and is set to `min`
    /// while it waits). False if the trial is unknown or the range is empty,
    /// zero, or (for a placed trial) does not hold its size now.
    pub fn set_elastic(&mut self, trial: TrialId, min: u32, max: u32, now: UnixMillis) -> bool {
        let Some(entry) = self.trials.get(&trial) else {
            return false;
        };
        if min == 0 || min > max {
            return false;
        }
        let sized_at = match &entry.standing {
            Standing::Placed(placed) => {
                let size = entry.request.gang.workers;
                if size < min || size > max {
                    return false;
                }
                placed.started_at
            }
            Standing::Waiting | Standing::Held => {
                // It waits at its minimum, and queues by that size.
                self.set_size(trial, min);
                self.relevel(trial, |_| {});
                now
            }
        };
        self.elastic.insert(
            trial,
            Elastic {
                min,
                max,
                sized_at,
                resize: None,
            },
        );
        true
    }

    /// An elastic trial's `(min, max)`; `None` for a fixed gang.
    pub fn elastic_range(&self, trial: TrialId) -> Option<(u32, u32)> {
        self.elastic
            .get(&trial)
            .map(|elastic| (elastic.min, elastic.max))
    }

    /// Where a trial being resized goes once its gang is gone; `None` when no
    /// resize is in flight.
    pub fn resizing(&self, trial: TrialId) -> Option<&[WorkerPlacement]> {
        self.elastic
            .get(&trial)?
            .resize
            .as_ref()
            .map(|resize| resize.workers.as_slice())
    }

    /// Why a trial is being resized; `None` when no resize is in flight.
    pub fn resize_reason(&self, trial: TrialId) -> Option<ResizeReason> {
        let resize = self.elastic.get(&trial)?.resize.as_ref()?;
        Some(match resize.for_trial {
            Some(by) => ResizeReason::Shrink { by },
            None => ResizeReason::Grow,
        })
    }

    /// The caller reports that a resizing trial's old gang is gone: a shrink's
    /// dropped workers release their resources, and the placement to start the
    /// gang on comes back. `None` (and nothing changes) when no resize is in
    /// flight or the trial is being preempted (requeue it instead).
    pub fn resized(&mut self, trial: TrialId, now: UnixMillis) -> Option<Vec<WorkerPlacement>> {
        if self.is_preempting(trial) {
            return None;
        }
        let elastic = self.elastic.get_mut(&trial)?;
        let resize = elastic.resize.take()?;
        elastic.sized_at = now;
        let workers = resize.workers;
        let size = u32::try_from(workers.len()).expect("gangs are at most u32 workers");
        let dropped = self.change(trial, |entry| {
            let Standing::Placed(placed) = &mut entry.standing else {
                return Vec::new();
            };
            // A growth is in `placed.workers` already; a shrink keeps a prefix.
            let dropped: Vec<WorkerPlacement> = placed.workers[workers.len()..]
                .iter()
                .filter(|worker| !placed.lost_nodes.contains(&worker.node))
                .cloned()
                .collect();
            placed.workers.truncate(workers.len());
            entry.request.gang.workers = size;
            entry.demand = gang_demand(&entry.request.gang);
            dropped
        })?;
        self.release(&dropped);
        Some(workers)
    }

    /// Sets a trial's gang size, its demand and index entries with it.
    fn set_size(&mut self, trial: TrialId, size: u32) {
        self.change(trial, |entry| {
            if entry.request.gang.workers != size {
                entry.request.gang.workers = size;
                entry.demand = gang_demand(&entry.request.gang);
            }
        });
    }

    /// Hook of `requeue`: an elastic trial back in line waits at its minimum,
    /// and a resize in flight is dropped (the whole gang is gone).
    pub(super) fn elastic_requeued(&mut self, trial: TrialId, now: UnixMillis) {
        let Some(elastic) = self.elastic.get_mut(&trial) else {
            return;
        };
        elastic.resize = None;
        elastic.sized_at = now;
        let min = elastic.min;
        self.set_size(trial, min);
        self.relevel(trial, |_| {});
    }

    /// Hook of a pass's visit to a waiting trial: sets an elastic trial to the
    /// largest size that its quota and the free room allow now (its minimum when
    /// none does, so the visit goes on as for a gang of that size).
    pub(super) fn fit_elastic(&mut self, id: TrialId, queue: usize, pass: &Pass) {
        let Some(elastic) = self.elastic.get(&id) else {
            return;
        };
        let (min, max) = (elastic.min, elastic.max);
        let Some(trial) = self.trials.get(&id) else {
            return;
        };
        if !matches!(trial.standing, Standing::Waiting) || self.reservations.contains_key(&id) {
            return;
        }
        let strategy = self.strategy(id);
        let mut gang = trial.request.gang.clone();
        let mut checks = 0;
        let mut chosen = min;
        for size in (min + 1..=max).rev() {
            gang.workers = size;
            let demand = gang_demand(&gang);
            if !covers(pass.free, demand)
                || pass.shape_failed(&gang)
                || self.quota_block(queue, &demand, &pass.usage_view).is_some()
            {
                continue;
            }
            if checks >= MAX_PLACEMENT_CHECKS {
                break;
            }
            checks += 1;
            if let Some(workers) = self.pool.find(&gang, strategy)
                && self.plan_conflict(pass, &workers, &[]).is_none()
            {
                chosen = size;
                break;
            }
        }
        self.set_size(id, chosen);
    }

    /// Hook of a pass's end: when no trial waits and no preemption is pending,
    /// elastic trials grow into idle room (see the module's rules).
    pub(super) fn grow_elastic(&mut self, pass: &mut Pass, decisions: &mut Vec<Decision>) {
        if self.elastic.is_empty()
            || !self.reservations.is_empty()
            || self.index.queues.iter().any(|queue| queue.n_waiting > 0)
        {
            return;
        }
        let min_run = self.min_run_ms();
        let mut growable: Vec<(UnixMillis, TrialId)> = self
            .elastic
            .iter()
            .filter(|(_, elastic)| {
                elastic.resize.is_none() && pass.now.saturating_sub(elastic.sized_at) >= min_run
            })
            .filter_map(|(id, elastic)| {
                let trial = self.trials.get(id)?;
                let Standing::Placed(placed) = &trial.standing else {
                    return None;
                };
                (trial.request.gang.workers < elastic.max
                    && placed.preempt_deadline.is_none()
                    && placed.started_pass != self.pass
                    && placed.lost_nodes.is_empty())
                .then_some((trial.request.submitted_at, *id))
            })
            .collect();
        growable.sort_unstable();
        let mut checks = 0;
        for (_, id) in growable {
            if checks >= MAX_GROW_CHECKS {
                break;
            }
            let (Some(elastic), Some(trial)) = (self.elastic.get(&id), self.trials.get(&id)) else {
                continue;
            };
            let size = trial.request.gang.workers;
            let queue = trial.queue;
            let strategy = self.strategy(id);
            let mut extra = GangShape {
                workers: 0,
                ..trial.request.gang.clone()
            };
            // Leases are the gang's, held already: the new workers add none.
            extra.leases.clear();
            let mut found = None;
            for more in (1..=elastic.max - size).rev() {
                extra.workers = more;
                let demand = gang_demand(&extra);
                if !covers(pass.free, demand)
                    || self.quota_block(queue, &demand, &pass.usage_view).is_some()
                {
                    continue;
                }
                if checks >= MAX_GROW_CHECKS {
                    break;
                }
                checks += 1;
                if let Some(workers) = self.pool.find(&extra, strategy)
                    && self.plan_conflict(pass, &workers, &[]).is_none()
                {
                    found = Some((workers, demand));
                    break;
                }
            }
            let Some((new_workers, demand)) = found else {
                continue;
            };
            decisions.push(self.grow(id, size, new_workers, demand, pass));
        }
    }

    /// Grows a placed elastic trial by `new_workers`, holding them from now on.
    fn grow(
        &mut self,
        id: TrialId,
        from: u32,
        new_workers: Vec<WorkerPlacement>,
        demand: ResourceVec,
        pass: &mut Pass,
    ) -> Decision {
        self.pool
            .allocate(&new_workers)
            .expect("a placement the pool has just found is one it accepts");
        // Stopping the grown trial frees more than a search of before knew.
        self.room_epoch += 1;
        pass.free = minus(pass.free, placement_total(&new_workers));
        let workers = self
            .change(id, |entry| {
                let Standing::Placed(placed) = &mut entry.standing else {
                    unreachable!("only placed trials grow");
                };
                placed.workers.extend(new_workers.iter().cloned());
                entry.request.gang.workers =
                    u32::try_from(placed.workers.len()).expect("gangs are at most u32 workers");
                entry.demand = gang_demand(&entry.request.gang);
                pass.usage_view[entry.queue] = plus(pass.usage_view[entry.queue], demand);
                placed.workers.clone()
            })
            .expect("the trial was just looked up");
        if let Some(elastic) = self.elastic.get_mut(&id) {
            elastic.resize = Some(InFlight {
                workers: workers.clone(),
                for_trial: None,
            });
        }
        Decision::Resize {
            trial: id,
            from,
            workers,
            reason: ResizeReason::Grow,
            grace_ms: self.grace_ms(),
        }
    }

    /// Hook of preemption, tried before any victim is chosen: shrinks elastic
    /// trials of lower priority so that `id` fits (see the module's rules).
    /// True when `id` now waits for a shrink, decided now or earlier.
    pub(super) fn try_shrink(
        &mut self,
        id: TrialId,
        queue: usize,
        block: Option<QuotaBlock>,
        pass: &mut Pass,
        decisions: &mut Vec<Decision>,
    ) -> bool {
        if self.elastic.is_empty() {
            return false;
        }
        // 1. A shrink for `id` is already in flight: it waits for that one.
        if self.elastic.values().any(|elastic| {
            elastic
                .resize
                .as_ref()
                .is_some_and(|resize| resize.for_trial == Some(id))
        }) {
            self.set_reason(id, WaitReason::WaitingForPreemption);
            return true;
        }
        // 2. The same bounds as a preemption search, which this one goes before.
        if !self.config.preemption.enabled
            || pass.preemption_attempts >= MAX_PREEMPTION_ATTEMPTS_PER_PASS
            || !self.ever_fits(id)
        {
            return false;
        }
        let Some(trial) = self.trials.get(&id) else {
            return false;
        };
        let search = ShrinkSearch {
            queue,
            block,
            priority: trial.request.priority,
            demand: trial.demand,
            waited_ms: pass.now.saturating_sub(trial.waiting_since),
            gang: trial.request.gang.clone(),
            strategy: self.strategy(id),
            cutoff: pass.now.saturating_sub(self.min_run_ms()),
        };
        // 3. The elastic trials that may give up workers, in the order they are asked.
        let candidates = self.shrink_candidates(&search, pass);
        if candidates.is_empty() {
            return false;
        }
        pass.preemption_attempts += 1;
        // 4. How many workers each gives up, until `id` fits.
        let Some(chosen) = self.plan_shrinks(&search, candidates, pass) else {
            return false;
        };
        // 5. The resizes, which `id` waits for.
        self.decide_shrinks(id, chosen, decisions);
        self.set_reason(id, WaitReason::WaitingForPreemption);
        true
    }

    /// The elastic trials a shrink may take workers from, lowest priority
    /// first, then the most recently resized: placed above their minimum, no
    /// resize or preemption in flight, preemptible and of lower priority, run
    /// long enough, in a queue that can relieve the block and whose
    /// preemptions need no approval, and worth what a restart loses.
    fn shrink_candidates(&self, search: &ShrinkSearch, pass: &Pass) -> Vec<TrialId> {
        let cohort = self.queue_info[search.queue].cohort;
        let mut candidates: Vec<(i64, std::cmp::Reverse<UnixMillis>, TrialId)> = self
            .elastic
            .iter()
            .filter(|(_, elastic)| elastic.resize.is_none())
            .filter_map(|(victim, elastic)| {
                let entry = self.trials.get(victim)?;
                let Standing::Placed(placed) = &entry.standing else {
                    return None;
                };
                let in_scope = match search.block {
                    Some(QuotaBlock::Own(_)) => entry.queue == search.queue,
                    Some(QuotaBlock::Pool(_)) => {
                        cohort.is_some() && self.queue_info[entry.queue].cohort == cohort
                    }
                    None => true,
                };
                let manual = self
                    .config
                    .queue(&self.queue_info[entry.queue].name)
                    .is_some_and(|config| config.preemption.approval == Approval::Manual);
                (in_scope
                    && !manual
                    && entry.request.preemptible
                    && entry.request.priority < search.priority
                    && entry.request.gang.workers > elastic.min
                    && placed.preempt_deadline.is_none()
                    && placed.started_pass != self.pass
                    && placed.started_at <= search.cutoff
                    && placed.lost_nodes.is_empty()
                    && self.worth_its_loss(search.waited_ms, pass.now, entry))
                .then_some((
                    entry.request.priority,
                    std::cmp::Reverse(elastic.sized_at),
                    *victim,
                ))
            })
            .collect();
        candidates.sort_unstable();
        candidates
            .into_iter()
            .map(|(_, _, victim)| victim)
            .collect()
    }

    /// The size each candidate shrinks to, in order, until the claimant fits;
    /// `None` when even the candidates at their minimums do not make it fit
    /// (or the placement checks ran out first). Each candidate drops the
    /// fewest highest ranks that let the claimant fit, trying the largest drop
    /// first so that a candidate that cannot help costs one check.
    fn plan_shrinks(
        &self,
        search: &ShrinkSearch,
        candidates: Vec<TrialId>,
        pass: &Pass,
    ) -> Option<Vec<(TrialId, u32)>> {
        let mut freed = Freed {
            view: self.future_view(pass),
            total: pass.free,
            workers: Vec::new(),
            checks: 0,
        };
        let mut chosen: Vec<(TrialId, u32)> = Vec::new();
        let mut suffices = false;
        for id in candidates {
            let entry = &self.trials[&id];
            let Standing::Placed(placed) = &entry.standing else {
                continue;
            };
            let victim = Victim {
                queue: entry.queue,
                size: entry.request.gang.workers,
                workers: &placed.workers,
                per_worker: gang_demand(&GangShape {
                    workers: 1,
                    leases: BTreeMap::new(),
                    ..entry.request.gang.clone()
                }),
            };
            let most = victim.size - self.elastic[&id].min;
            let drop = if self.fits_after_drop(search, &victim, most, &mut freed, pass) {
                suffices = true;
                (1..most)
                    .find(|&drop| self.fits_after_drop(search, &victim, drop, &mut freed, pass))
                    .unwrap_or(most)
            } else {
                most
            };
            let tail = victim.tail(drop).to_vec();
            freed.total = plus(freed.total, placement_total(&tail));
            for _ in 0..drop {
                freed.view[victim.queue] = minus(freed.view[victim.queue], victim.per_worker);
            }
            freed.workers.push(tail);
            chosen.push((id, victim.size - drop));
            if suffices || freed.checks >= MAX_PLACEMENT_CHECKS {
                break;
            }
        }
        suffices.then_some(chosen)
    }

    /// Whether the claimant fits once `victim` drops its `drop` highest ranks
    /// on top of what is `freed` already: room in total, quota, then (counted
    /// in `freed.checks`) a placement that avoids nodes planned for others.
    fn fits_after_drop(
        &self,
        search: &ShrinkSearch,
        victim: &Victim<'_>,
        drop: u32,
        freed: &mut Freed,
        pass: &Pass,
    ) -> bool {
        let tail = victim.tail(drop);
        let mut quota_view = freed.view.clone();
        let mut dropped = ResourceVec::default();
        for _ in 0..drop {
            dropped = plus(dropped, victim.per_worker);
        }
        quota_view[victim.queue] = minus(quota_view[victim.queue], dropped);
        if !covers(plus(freed.total, placement_total(tail)), search.demand)
            || self
                .quota_block(search.queue, &search.demand, &quota_view)
                .is_some()
            || freed.checks >= MAX_PLACEMENT_CHECKS
        {
            return false;
        }
        freed.checks += 1;
        let mut all: Vec<&[WorkerPlacement]> = freed.workers.iter().map(Vec::as_slice).collect();
        all.push(tail);
        self.pool
            .find_with_freed(&search.gang, search.strategy, &all)
            .is_some_and(|plan| self.plan_conflict(pass, &plan, &all).is_none())
    }

    /// Asks each chosen trial to shrink to its size, for `id`.
    fn decide_shrinks(
        &mut self,
        id: TrialId,
        chosen: Vec<(TrialId, u32)>,
        decisions: &mut Vec<Decision>,
    ) {
        let grace_ms = self.grace_ms();
        for (victim, size) in chosen {
            let Some(Standing::Placed(placed)) = self.trials.get(&victim).map(|t| &t.standing)
            else {
                continue;
            };
            let from = u32::try_from(placed.workers.len()).expect("gangs are at most u32 workers");
            let workers = placed.workers[..size as usize].to_vec();
            if let Some(elastic) = self.elastic.get_mut(&victim) {
                elastic.resize = Some(InFlight {
                    workers: workers.clone(),
                    for_trial: Some(id),
                });
            }
            decisions.push(Decision::Resize {
                trial: victim,
                from,
                workers,
                reason: ResizeReason::Shrink { by: id },
                grace_ms,
            });
        }
    }

    /// The elastic table's own invariants (see the module's list).
    pub(super) fn check_elastic(&self) -> Result<(), ElasticViolation> {
        for (id, elastic) in &self.elastic {
            let trial = self
                .trials
                .get(id)
                .ok_or(ElasticViolation::NotInTable { trial: *id })?;
            let size = trial.request.gang.workers;
            if elastic.min == 0 || elastic.min > elastic.max {
                return Err(ElasticViolation::EmptyRange { trial: *id });
            }
            match &trial.standing {
                Standing::Waiting | Standing::Held => {
                    if elastic.resize.is_some() {
                        return Err(ElasticViolation::WaitingWithResize { trial: *id });
                    }
                    if size < elastic.min || size > elastic.max {
                        return Err(ElasticViolation::WaitingOutsideRange { trial: *id, size });
                    }
                }
                Standing::Placed(placed) => {
                    if size < elastic.min || size > elastic.max {
                        return Err(ElasticViolation::HeldOutsideRange {
                            trial: *id,
                            size,
                            min: elastic.min,
                            max: elastic.max,
                        });
                    }
                    if let Some(resize) = &elastic.resize {
                        let len = resize.workers.len();
                        if len < elastic.min as usize
                            || len > elastic.max as usize
                            || len > placed.workers.len()
                            || resize.workers[..] != placed.workers[..len]
                        {
                            return Err(ElasticViolation::ResizeNotAPrefix { trial: *id });
                        }
                    }
                }
            }
        }
        Ok(())
    }
}

/// What one shrink search looks for: room for the claimant.
struct ShrinkSearch {
    /// The claimant's queue.
    queue: usize,
    /// The quota constraint that stopped it; `None` when nodes did.
    block: Option<QuotaBlock>,
    /// Its priority: victims have less.
    priority: i64,
    /// What it asks for.
    demand: ResourceVec,
    /// How long it has waited (see `worth_its_loss`).
    waited_ms: u64,
    /// Its gang, to place.
    gang: GangShape,
    /// Its placement strategy.
    strategy: Strategy,
    /// Victims must have started at or before this.
    cutoff: UnixMillis,
}

/// An elastic trial a shrink search takes workers from.
struct Victim<'a> {
    /// Its queue.
    queue: usize,
    /// Its gang's size.
    size: u32,
    /// Its workers, rank order.
    workers: &'a [WorkerPlacement],
    /// What one of its workers asks for.
    per_worker: ResourceVec,
}

impl Victim<'_> {
    /// Its `drop` highest ranks.
    fn tail(&self, drop: u32) -> &[WorkerPlacement] {
        &self.workers[(self.size - drop) as usize..]
    }
}

/// What the victims chosen so far free.
struct Freed {
    /// Usage plus reservations per queue, less the dropped workers.
    view: Vec<ResourceVec>,
    /// Free room plus the dropped workers' resources.
    total: ResourceVec,
    /// The dropped workers, a list per victim.
    workers: Vec<Vec<WorkerPlacement>>,
    /// Placement searches made so far.
    checks: usize,
}

/// A broken invariant of the elastic table (see the module's list).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(super) enum ElasticViolation {
    /// An elastic entry names a trial the table does not have.
    #[error("elastic trial {trial} is not in the table")]
    NotInTable { trial: TrialId },
    /// The size range is empty or starts at zero.
    #[error("elastic trial {trial} has an empty range")]
    EmptyRange { trial: TrialId },
    /// A waiting trial has a resize under way.
    #[error("waiting elastic trial {trial} has a resize")]
    WaitingWithResize { trial: TrialId },
    /// A waiting trial asks for a size outside its range.
    #[error("waiting elastic trial {trial} asks for {size}")]
    WaitingOutsideRange { trial: TrialId, size: u32 },
    /// A placed trial holds a gang outside its range.
    #[error("elastic trial {trial} holds {size} workers outside {min}..={max}")]
    HeldOutsideRange {
        trial: TrialId,
        size: u32,
        min: u32,
        max: u32,
    },
    /// A resize's gang is not a prefix of the gang the trial holds.
    #[error("elastic trial {trial} resizes to a gang that is not a prefix of what it holds")]
    ResizeNotAPrefix { trial: TrialId },
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use xp_runtime::ids::{ExperimentId, NodeId};

    use super::*;
    use crate::{Amount, GPU_MILLI, NodeSpec, PolicyConfig, TrialRequest};

    const GIB: u64 = 1 << 30;
    const MINUTE: u64 = 60_000;
    const HOUR: u64 = 60 * MINUTE;

    fn id(index: u32) -> TrialId {
        TrialId {
            experiment: ExperimentId { digest: 5, run: 1 },
            index,
        }
    }

    /// One node of `gpus` GPUs, preemption after a minute's run with 30 s grace.
    fn core(gpus: u32) -> PolicyCore {
        core_with(
            "order: priority\npreemption: {grace_period: 30s, min_run_time: 1m}\n",
            gpus,
        )
    }

    fn core_with(yaml: &str, gpus: u32) -> PolicyCore {
        let config = PolicyConfig::from_yaml(yaml).unwrap();
        let mut core = PolicyCore::new(config);
        core.upsert_node(NodeSpec {
            id: NodeId(uuid::Uuid::from_u128(1)),
            gpus,
            gpu_model: None,
            cpu_milli: 64_000,
            memory_bytes: 256 * GIB,
            labels: BTreeMap::new(),
        });
        core
    }

    fn request(index: u32, workers: u32, priority: i64, at: UnixMillis) -> TrialRequest {
        TrialRequest {
            id: id(index),
            team: "default".to_owned(),
            queue: None,
            priority,
            gang: GangShape {
                workers,
                per_worker: Amount {
                    gpu_milli: GPU_MILLI,
                    cpu_milli: 1000,
                    memory_bytes: GIB,
                },
                gpu_models: Vec::new(),
                node_labels: BTreeMap::new(),
                spread: false,
                leases: BTreeMap::new(),
                oversubscribe: false,
            },
            preemptible: true,
            time_limit_ms: None,
            submitted_at: at,
            urgency: 0,
        }
    }

    fn decide(core: &mut PolicyCore, now: UnixMillis) -> Vec<Decision> {
        let decisions = core.decide(now);
        core.check_invariants().unwrap();
        decisions
    }

    fn resizes(decisions: &[Decision]) -> Vec<(TrialId, u32, usize, ResizeReason)> {
        decisions
            .iter()
            .filter_map(|decision| match decision {
                Decision::Resize {
                    trial,
                    from,
                    workers,
                    reason,
                    ..
                } => Some((*trial, *from, workers.len(), reason.clone())),
                _ => None,
            })
            .collect()
    }

    fn elastic(core: &mut PolicyCore, index: u32, min: u32, max: u32, at: UnixMillis) {
        core.submit(request(index, max, 0, at), at).unwrap();
        assert!(core.set_elastic(id(index), min, max, at));
    }

    #[test]
    fn an_elastic_trial_starts_as_large_as_fits_and_grows_into_idle_gpus() {
        let mut core = core(4);
        core.submit(request(0, 2, 0, 0), 0).unwrap();
        elastic(&mut core, 1, 1, 4, 1);
        let decisions = decide(&mut core, 10);
        assert_eq!(core.placement(id(0)).map(<[_]>::len), Some(2));
        assert_eq!(core.placement(id(1)).map(<[_]>::len), Some(2));
        assert!(resizes(&decisions).is_empty());
        // The fixed trial ends; no growth before a minute at its size.
        core.finish(id(0), 20, true);
        assert!(resizes(&decide(&mut core, 30)).is_empty());
        // A minute on, it grows into the two idle GPUs, holding them at once.
        let decisions = decide(&mut core, 10 + MINUTE);
        assert_eq!(resizes(&decisions), vec![(id(1), 2, 4, ResizeReason::Grow)]);
        assert_eq!(core.pool().free().gpu_milli, 0);
        assert_eq!(core.resizing(id(1)).map(<[_]>::len), Some(4));
        // Nothing more until the gang has restarted.
        assert!(resizes(&decide(&mut core, 20 + MINUTE)).is_empty());
        let workers = core.resized(id(1), 30 + MINUTE).unwrap();
        assert_eq!(workers.len(), 4);
        assert_eq!(core.placement(id(1)), Some(&workers[..]));
        assert_eq!(core.resizing(id(1)), None);
        core.check_invariants().unwrap();
    }

    #[test]
    fn an_elastic_trial_shrinks_for_higher_priority_instead_of_being_preempted() {
        let mut core = core(4);
        elastic(&mut core, 0, 2, 4, 0);
        decide(&mut core, 0);
        let held = core.placement(id(0)).unwrap().to_vec();
        assert_eq!(held.len(), 4);
        core.submit(request(1, 2, 100, MINUTE), MINUTE).unwrap();
        let decisions = decide(&mut core, 2 * MINUTE);
        assert_eq!(
            resizes(&decisions),
            vec![(id(0), 4, 2, ResizeReason::Shrink { by: id(1) })]
        );
        assert!(
            !decisions
                .iter()
                .any(|decision| matches!(decision, Decision::Preempt { .. }))
        );
        assert_eq!(
            core.wait_reason(id(1)),
            Some(WaitReason::WaitingForPreemption)
        );
        // It waits for the shrink, and asks for nothing more meanwhile.
        assert!(decide(&mut core, 2 * MINUTE + 1).is_empty());
        assert_eq!(
            core.wait_reason(id(1)),
            Some(WaitReason::WaitingForPreemption)
        );
        // Once the old gang is gone, the lower ranks keep their places and the
        // waiter starts on the freed ones.
        let workers = core.resized(id(0), 2 * MINUTE + 2).unwrap();
        assert_eq!(workers, held[..2].to_vec());
        let decisions = decide(&mut core, 2 * MINUTE + 3);
        assert!(matches!(&decisions[..], [Decision::Place { trial, .. }] if *trial == id(1)));
        // Below its minimum it never goes: a second claimant preempts it outright.
        core.submit(request(2, 2, 100, 3 * MINUTE), 3 * MINUTE)
            .unwrap();
        let decisions = decide(&mut core, 5 * MINUTE);
        assert!(resizes(&decisions).is_empty());
        assert!(decisions.iter().any(
            |decision| matches!(decision, Decision::Preempt { trial, .. } if *trial == id(0))
        ));
    }

    #[test]
    fn a_shrink_that_would_lose_much_waits_like_a_preemption() {
        let mut core = core_with(
            "order: priority\npreemption: {grace_period: 30s, min_run_time: 1m, max_loss: 30m}\n",
            4,
        );
        elastic(&mut core, 0, 2, 4, 0);
        decide(&mut core, 0);
        // An hour of unsaved work on four GPUs: not worth a minute's wait.
        core.submit(request(1, 2, 100, HOUR), HOUR).unwrap();
        assert!(decide(&mut core, HOUR + MINUTE).is_empty());
        // Once it has checkpointed, it shrinks.
        assert!(core.note_checkpoint(id(0), 2 * HOUR));
        let decisions = decide(&mut core, 2 * HOUR + MINUTE);
        assert_eq!(
            resizes(&decisions),
            vec![(id(0), 4, 2, ResizeReason::Shrink { by: id(1) })]
        );
    }

    #[test]
    fn no_growth_while_anyone_waits_and_a_requeued_trial_waits_at_its_minimum() {
        let mut core = core(4);
        elastic(&mut core, 0, 1, 2, 0);
        core.submit(request(1, 1, 0, 1), 1).unwrap();
        core.submit(request(2, 2, 0, 2), 2).unwrap();
        decide(&mut core, 10);
        // 2 + 1 placed; the 2-GPU trial waits, so the elastic one does not grow
        // into the last GPU even after its minimum run.
        assert_eq!(core.placement(id(0)).map(<[_]>::len), Some(2));
        assert!(core.wait_reason(id(2)).is_some());
        core.finish(id(1), 20, true);
        let decisions = decide(&mut core, 2 * MINUTE);
        assert!(resizes(&decisions).is_empty());
        core.requeue(id(0), 3 * MINUTE);
        core.check_invariants().unwrap();
        assert_eq!(core.trials[&id(0)].request.gang.workers, 1);
    }

    #[test]
    fn set_elastic_refuses_empty_ranges_and_unknown_trials() {
        let mut core = core(2);
        core.submit(request(0, 2, 0, 0), 0).unwrap();
        assert!(!core.set_elastic(id(0), 0, 2, 0));
        assert!(!core.set_elastic(id(0), 3, 2, 0));
        assert!(!core.set_elastic(id(9), 1, 2, 0));
        assert_eq!(core.elastic_range(id(0)), None);
        assert!(core.set_elastic(id(0), 1, 2, 0));
        assert_eq!(core.elastic_range(id(0)), Some((1, 2)));
    }
}
