//! Preemption: choosing running trials to stop so that a trial that cannot
//! start can.
//!
//! A trial T that cannot start may stop (a) running preemptible trials of strictly
//! lower base priority, or (b) when T's queue stays within its nominal quota, work
//! of other queues in its cohort that are borrowing ("reclaim"). Victims must have
//! run `min_run_time` since they (re)started. Candidates come borrowed work first,
//! then lowest priority, then most recently started; only queues that can relieve
//! what blocks T are searched (T's own queue when its own limit blocks it, the
//! cohort when the cohort's pool does, anyone when nodes do). The smallest prefix
//! of candidates that makes T fit is found with `find_with_freed`, then victims
//! that are not needed are dropped; one placement with every candidate gone
//! comes first, since when it fails (most searches on a full cluster) no prefix
//! fits. Victims keep their resources until
//! [`PolicyCore::requeue`] or [`PolicyCore::finish`]; T keeps a reservation. Reclaim
//! takes only from queues that were borrowing when the pass began, so borrowing
//! started by the same pass never makes older work a victim. Quota checks for a
//! plan count stopping trials as gone and reservations as taken, so two trials
//! reclaiming in one pass do not stop twice what they need.
//!
//! A trial short of a lease may preempt in the same way: victims holding that
//! lease come first among the candidates, and a set of victims suffices only
//! when, once they are gone, the trial's lease units are free too. Victims an
//! admin denied to this trial are not candidates; when a chosen victim's queue
//! wants manual approval, nothing is stopped and the pair becomes a pending
//! request (`leases`).
//!
//! Under `attained_service` a trial may also stop running work of its own
//! queue and base priority that sits at a higher level than its own (has
//! received more GPU time), but only work that would lose at most
//! `preemption.max_loss`: a preemption for service alone is a bet, not a
//! claim, so it is never made at a high cost.
//!
//! Candidates are ordered by what stopping them costs (`victim_cost`):
//! reclaims first (they take back what is owed), then victims within
//! `max_loss` before those over it, then lowest priority, then (within the
//! limit) the highest attained-service level (under `attained_service`: the
//! work most likely to run long), then least GPU time lost (GPUs × time since the last checkpoint
//! of the run, all of the run when it never checkpointed; the caller reports
//! checkpoints with [`PolicyCore::note_checkpoint`]), then most service
//! received, then latest start. So a victim over the limit is taken only when no cheaper set makes
//! room, and only once the preemptor has waited as long as the GPU time that
//! victim would lose (`worth_its_loss`, a ski-rental rule): until then the
//! preemptor waits for work to end or checkpoint. Reclaims are exempt: a queue
//! taking back its nominal quota is owed it. GPU time is counted at least one
//! thousandth of a GPU, so CPU-only work is barely protected by the rule.
//!
//! What happens once victims are chosen (the reservation and the planned
//! placement) is `reservations`' work.

use std::cmp::Reverse;
use std::collections::HashMap;
use std::ops::Bound;

use xp_runtime::clock::UnixMillis;
use xp_runtime::ids::{ExperimentId, TrialId};

use super::PolicyCore;
use super::index::{VictimKey, Victims};
use super::pass::{MAX_PLACEMENT_CHECKS, MoreServedKey, Pass};
use super::quota::QuotaBlock;
use super::reservations::Reservation;
use super::resource_vec::{ResourceVec, covers, minus, placement_total, plus};
use super::trial::{Standing, Trial, gpu_ms};
use crate::{Decision, PreemptReason, WaitReason, WorkerPlacement};

/// The most preemption searches one pass makes.
pub(super) const MAX_PREEMPTION_ATTEMPTS_PER_PASS: usize = 4;
/// The most candidate victims one preemption search considers.
const MAX_VICTIM_CANDIDATES: usize = 256;
/// The most victims a preemption search tries to spare once it has a set.
const MAX_PRUNE_CHECKS: usize = 8;
/// How long a trial waits at most before it may stop lower-priority work
/// whatever that work would lose (see `worth_its_loss`): a day, so that work
/// that never checkpoints and never ends cannot hold a higher priority off
/// forever.
pub(super) const MAX_LOSS_WAIT_MS: u64 = 24 * 3_600_000;

/// What one preemption search looks for.
#[derive(Debug, Clone, Copy)]
struct VictimSearch {
    /// The trial that cannot start.
    preemptor: TrialId,
    /// Its queue.
    queue: usize,
    /// Its base priority.
    priority: i64,
    /// What it asks for.
    demand: ResourceVec,
    /// The quota constraint that stopped it; `None` when nodes did.
    block: Option<QuotaBlock>,
    /// Its queue's cohort.
    cohort: Option<usize>,
    /// Victims must have started at or before this.
    cutoff: UnixMillis,
    /// Its attained-service level, when work of its own queue and priority at
    /// a higher level may be stopped for it.
    level: Option<u8>,
    /// The time of the pass.
    now: UnixMillis,
    /// How long the preemptor has waited since it was last queued: the GPU
    /// time (one GPU for as long) it may destroy in a victim over `max_loss`.
    waited_ms: u64,
}

/// What stopping a victim costs, in preference order (smallest first): over
/// `max_loss`, priority, a lower attained-service level, GPU time lost, less
/// service received, earlier start.
type VictimCost = (
    bool,
    i64,
    Reverse<u8>,
    u128,
    Reverse<u64>,
    Reverse<UnixMillis>,
    TrialId,
);

impl PolicyCore {
    /// Looks for victims whose stopping lets `id` start; on success asks them to
    /// stop and gives `id` a reservation. `block` is the quota constraint that
    /// stopped it, `None` when nodes did.
    pub(super) fn try_preempt(
        &mut self,
        id: TrialId,
        queue: usize,
        block: Option<QuotaBlock>,
        pass: &mut Pass,
        decisions: &mut Vec<Decision>,
    ) -> bool {
        // 1. Elastic trials shrink before anything is preempted outright.
        if self.try_shrink(id, queue, block, pass, decisions) {
            return true;
        }
        // 2. Whether a search may run now, and what it looks for.
        let Some((search, can_reclaim)) = self.start_victim_search(id, queue, block, pass) else {
            return false;
        };
        // 3. The fewest victims that let it start, and where it would go.
        let mut candidates = self.victim_candidates(&search, can_reclaim, decisions.len(), pass);
        if let Some(lease) = self.lease_shortage(id, None) {
            // Short of a lease: its holders first (in their order), so that the
            // prefix that frees it stops as few others as possible.
            candidates.sort_by_key(|(victim, _)| {
                !self
                    .trials
                    .get(victim)
                    .is_some_and(|trial| trial.request.gang.leases.contains_key(&lease))
            });
        }
        let future = self.future_view(pass);
        let Some(chosen) = self.choose_victims(id, queue, &candidates, &future, pass) else {
            return false;
        };
        let Some(plan) = self.victims_suffice(
            id,
            queue,
            chosen.iter().map(|(victim, _)| *victim),
            &future,
            pass,
        ) else {
            return false;
        };
        // 4. An admin's approval where a victim's queue needs one; else they stop.
        let reasons: Vec<(TrialId, PreemptReason)> = chosen
            .iter()
            .map(|&(victim, reclaim)| (victim, self.preempt_reason(&search, victim, reclaim)))
            .collect();
        if let Some(request) = self.approval_needed(id, &reasons, pass.now) {
            // Nothing stops until an admin approves; the claimant waits.
            self.set_reason(id, WaitReason::WaitingForApproval { request });
            return true;
        }
        for (victim, _) in &chosen {
            self.approval_used(*victim, id);
        }
        self.stop_victims(&search, &chosen, plan, pass, decisions);
        true
    }

    /// The search for victims for `id`, and whether it may reclaim lent quota;
    /// `None` when no search may run: preemption is off, this pass has made its
    /// searches, `id` could never fit, nothing could be stopped for it, or no
    /// trial has run its minimum yet. Counts the search in the pass.
    fn start_victim_search(
        &mut self,
        id: TrialId,
        queue: usize,
        block: Option<QuotaBlock>,
        pass: &mut Pass,
    ) -> Option<(VictimSearch, bool)> {
        if !self.config.preemption.enabled
            || pass.preemption_attempts >= MAX_PREEMPTION_ATTEMPTS_PER_PASS
            || !self.ever_fits(id)
        {
            return None;
        }
        let trial = self.trials.get(&id)?;
        let priority = trial.request.priority;
        let demand = trial.demand;
        let waited_ms = pass.now.saturating_sub(trial.waiting_since);
        let cohort = self.queue_info[queue].cohort;
        // Reclaim needs the preemptor's queue to stay within its nominal quota.
        let can_reclaim = cohort.is_some() && self.stays_within_nominal(queue, demand, pass);
        let lower_exists = self
            .index
            .victims
            .first_key_value()
            .is_some_and(|((lowest, _, _), _)| *lowest < priority);
        let level = self.service_level_to_claim(trial, queue);
        if !can_reclaim && !lower_exists && level.is_none() {
            return None;
        }
        // Trials started after `cutoff` have not run their minimum yet; before the
        // minimum has passed since time zero, no trial has.
        let cutoff = pass.now.checked_sub(self.min_run_ms())?;
        pass.preemption_attempts += 1;
        let search = VictimSearch {
            preemptor: id,
            queue,
            priority,
            demand,
            block,
            cohort,
            cutoff,
            level,
            now: pass.now,
            waited_ms,
        };
        Some((search, can_reclaim))
    }

    /// Why the search stops a victim: a reclaim, higher priority, or less
    /// service received.
    fn preempt_reason(
        &self,
        search: &VictimSearch,
        victim: TrialId,
        reclaim: bool,
    ) -> PreemptReason {
        let victim_trial = self.trials.get(&victim);
        if reclaim {
            PreemptReason::Reclaim {
                queue: self.queue_info[search.queue].name.clone(),
                by: search.preemptor,
            }
        } else if let (Some(level), Some(victim_trial)) = (search.level, victim_trial)
            && victim_trial.request.priority >= search.priority
        {
            PreemptReason::LessService {
                by: search.preemptor,
                level,
                victim_level: self.running_level(victim_trial, search.now),
            }
        } else {
            PreemptReason::HigherPriority {
                by: search.preemptor,
                priority: search.priority,
            }
        }
    }

    /// Whether adding `demand` keeps `queue` within its nominal quota in every
    /// resource the demand asks for.
    fn stays_within_nominal(&self, queue: usize, demand: ResourceVec, pass: &Pass) -> bool {
        let info = &self.queue_info[queue];
        (0..3).all(|r| {
            demand[r] == 0
                || info.nominal[r].is_none_or(|nominal| {
                    pass.usage_view[queue][r].saturating_add(demand[r]) <= nominal
                })
        })
    }

    /// Whether a queue can relieve the constraint in the search's way, so its
    /// work may be searched for victims.
    fn in_scope(&self, search: &VictimSearch, member: usize) -> bool {
        match search.block {
            Some(QuotaBlock::Own(_)) => member == search.queue,
            Some(QuotaBlock::Pool(_)) => {
                search.cohort.is_some() && self.queue_info[member].cohort == search.cohort
            }
            None => true,
        }
    }

    /// The trial, when it is placed and has run long enough to be a victim: it
    /// did not start in this pass and started at or before `cutoff`.
    fn eligible_victim(&self, victim: TrialId, cutoff: UnixMillis) -> Option<&Trial> {
        let trial = self.trials.get(&victim)?;
        let Standing::Placed(placed) = &trial.standing else {
            return None;
        };
        let ran_enough = placed.started_pass != self.pass && placed.started_at <= cutoff;
        ran_enough.then_some(trial)
    }

    /// Whether a victim of lower priority may be stopped for the preemptor
    /// yet: always within `max_loss`; over it, only once the preemptor has
    /// waited at least as long as the GPU time the victim would lose (its
    /// GPUs times its run since its last checkpoint), counting an hour
    /// waited worth one GPU-hour destroyed; and after
    /// [`MAX_LOSS_WAIT_MS`] whatever it would lose. It is the ski-rental
    /// rule: stopping at once may destroy hours of work to save minutes of
    /// waiting, when running work is about to end or checkpoint, which the
    /// core cannot know. Work that never checkpoints keeps losing as fast as
    /// the preemptor waits, so it is in effect left to end unless the
    /// preemptor is large.
    /// The same rule holds for shrinking an elastic trial, which restarts its
    /// whole gang from its checkpoint.
    pub(super) fn worth_its_loss(&self, waited_ms: u64, now: UnixMillis, trial: &Trial) -> bool {
        let (Some(limit), Standing::Placed(placed)) = (self.max_loss_ms(), &trial.standing) else {
            return true;
        };
        let loss_ms = placed.loss_ms(now);
        if loss_ms <= limit || waited_ms >= self.max_loss_wait_ms() {
            return true;
        }
        let lost_gpu_ms = u128::from(trial.demand[0].max(1)) * u128::from(loss_ms) / 1000;
        u128::from(waited_ms) >= lost_gpu_ms
    }

    /// Candidate victims in preference order, each with whether stopping it is
    /// a reclaim: borrowed work of the cohort first (when `can_reclaim`), then
    /// work of lower priority, at most [`MAX_VICTIM_CANDIDATES`].
    fn victim_candidates(
        &self,
        search: &VictimSearch,
        can_reclaim: bool,
        decisions_made: usize,
        pass: &mut Pass,
    ) -> Vec<(TrialId, bool)> {
        let mut candidates = match search.cohort {
            Some(cohort) if can_reclaim => self.reclaim_candidates(search, cohort, pass),
            _ => Vec::new(),
        };
        let reclaims = candidates.len();
        for (_, _, victim) in self.lower_priority_keys(search) {
            if candidates.len() >= MAX_VICTIM_CANDIDATES {
                break;
            }
            if self
                .eligible_victim(victim, search.cutoff)
                .is_some_and(|trial| self.worth_its_loss(search.waited_ms, search.now, trial))
                && !self.is_denied(victim, search.preemptor)
                && !candidates[..reclaims]
                    .iter()
                    .any(|(chosen, _)| *chosen == victim)
            {
                candidates.push((victim, false));
            }
        }
        // Work of the preemptor's own queue and priority: neither a reclaim
        // (another queue) nor of lower priority, so not a candidate yet.
        for &victim in self.more_served(search, decisions_made, pass) {
            if candidates.len() >= MAX_VICTIM_CANDIDATES {
                break;
            }
            if !self.is_denied(victim, search.preemptor) {
                candidates.push((victim, false));
            }
        }
        // Reclaims stay first; the rest go cheapest first.
        candidates[reclaims..]
            .sort_by_cached_key(|(victim, _)| self.victim_cost(*victim, search.now));
        candidates
    }

    /// What stopping `victim` at `now` costs, in preference order.
    fn victim_cost(&self, victim: TrialId, now: UnixMillis) -> VictimCost {
        // A trial that is gone or not placed costs the most: it is tried last.
        let Some((trial, placed)) =
            self.trials
                .get(&victim)
                .and_then(|trial| match &trial.standing {
                    Standing::Placed(placed) => Some((trial, placed)),
                    _ => None,
                })
        else {
            return (
                true,
                i64::MAX,
                Reverse(0),
                u128::MAX,
                Reverse(0),
                Reverse(0),
                victim,
            );
        };
        let loss_ms = placed.loss_ms(now);
        let over = self.max_loss_ms().is_some_and(|limit| loss_ms > limit);
        let lost = u128::from(trial.demand[0].max(1)) * u128::from(loss_ms);
        (
            over,
            trial.request.priority,
            // Among victims over the limit only the loss counts.
            Reverse(if over {
                0
            } else {
                self.running_level(trial, now)
            }),
            lost,
            Reverse(trial.attained_at(now)),
            Reverse(placed.started_at),
            victim,
        )
    }

    /// The preemptor's attained-service level, when running work of its queue
    /// and priority may sit at a higher one: under `attained_service` (not
    /// `fifo`), below the top level, with such work running. `None` otherwise.
    fn service_level_to_claim(&self, trial: &Trial, queue: usize) -> Option<u8> {
        let edges = self.levels.edges();
        if edges.is_empty() || trial.level as usize >= edges.len() {
            return None;
        }
        let priority = trial.request.priority;
        let candidates_exist = self.index.queues[queue]
            .victims
            .range(
                (priority, Reverse(UnixMillis::MAX), FIRST_TRIAL)
                    ..=(priority, Reverse(0), LAST_TRIAL),
            )
            .next()
            .is_some();
        candidates_exist.then_some(trial.level)
    }

    /// A placed trial's attained-service level at `now`.
    pub(super) fn running_level(&self, trial: &Trial, now: UnixMillis) -> u8 {
        self.level_of(
            trial
                .attained_at(now)
                .saturating_sub(trial.level_base_gpu_ms),
        )
    }

    /// Running work of the preemptor's queue and base priority that has run
    /// its minimum, sits at a higher attained-service level than the
    /// preemptor, and would lose at most `max_loss`: what may be stopped for
    /// service alone.
    ///
    /// The answer is kept for the rest of the pass while no decision is made:
    /// only decisions change placed work during a pass, and the time is the
    /// pass's, so later searches of the same queue, priority and level get
    /// it without walking the candidates again.
    fn more_served<'pass>(
        &self,
        search: &VictimSearch,
        decisions_made: usize,
        pass: &'pass mut Pass,
    ) -> &'pass [TrialId] {
        let Some(level) = search.level else {
            return &[];
        };
        let key = MoreServedKey {
            queue: search.queue,
            priority: search.priority,
            level,
            decisions_made,
        };
        pass.more_served(key, || self.walk_more_served(search, level))
    }

    /// [`Self::more_served`] without the pass's memory.
    fn walk_more_served(&self, search: &VictimSearch, level: u8) -> Vec<TrialId> {
        let max_loss = self.max_loss_ms();
        let priority = search.priority;
        self.index.queues[search.queue]
            .victims
            .range(
                (priority, Reverse(search.cutoff), FIRST_TRIAL)
                    ..=(priority, Reverse(0), LAST_TRIAL),
            )
            .take(MAX_VICTIM_CANDIDATES)
            .filter_map(|(&(_, Reverse(started_at), victim), facts)| {
                // What `eligible_victim`, `Placed::loss_ms` and `running_level`
                // would say, from the facts kept beside the key: the range
                // starts at the cutoff.
                let eligible = facts.started_pass != self.pass;
                let now = search.now;
                let affordable =
                    max_loss.is_none_or(|limit| now.saturating_sub(facts.loss_from) <= limit);
                let attained = facts
                    .attained_gpu_ms
                    .saturating_add(gpu_ms(facts.gpu_milli, now.saturating_sub(started_at)));
                let running_level = self.level_of(attained.saturating_sub(facts.level_base_gpu_ms));
                (eligible && affordable && running_level > level).then_some(victim)
            })
            .collect()
    }

    /// Work of the cohort's other queues that were borrowing when the pass
    /// began, in preference order; a queue is reclaimed from only while it
    /// still borrows.
    fn reclaim_candidates(
        &self,
        search: &VictimSearch,
        cohort: usize,
        pass: &Pass,
    ) -> Vec<(TrialId, bool)> {
        let mut reclaimable: Vec<VictimKey> = Vec::new();
        for &member in &self.cohorts[cohort].members {
            if member == search.queue
                || !self.in_scope(search, member)
                || !self.queue_info[member].is_borrowing(self.borrowing_usage(member, pass))
            {
                continue;
            }
            reclaimable.extend(ran_long_enough(
                &self.index.queues[member].victims,
                None,
                search.cutoff,
                MAX_VICTIM_CANDIDATES,
            ));
        }
        reclaimable.sort_by_cached_key(|(_, _, victim)| self.victim_cost(*victim, search.now));
        let mut candidates = Vec::new();
        let mut remaining: HashMap<usize, ResourceVec> = HashMap::new();
        for (_, _, victim) in reclaimable {
            let Some(trial) = self.eligible_victim(victim, search.cutoff) else {
                continue;
            };
            if self.is_denied(victim, search.preemptor) {
                continue;
            }
            let usage = remaining
                .entry(trial.queue)
                .or_insert_with(|| self.borrowing_usage(trial.queue, pass));
            if !self.queue_info[trial.queue].is_borrowing(*usage) {
                continue;
            }
            *usage = minus(*usage, trial.demand);
            candidates.push((victim, true));
            if candidates.len() >= MAX_VICTIM_CANDIDATES {
                break;
            }
        }
        candidates
    }

    /// Work of lower priority than the preemptor's in the queues in scope, in
    /// preference order.
    fn lower_priority_keys(&self, search: &VictimSearch) -> Vec<VictimKey> {
        let below = Some(search.priority);
        match search.block {
            None => ran_long_enough(
                &self.index.victims,
                below,
                search.cutoff,
                MAX_VICTIM_CANDIDATES,
            ),
            Some(QuotaBlock::Own(_)) => ran_long_enough(
                &self.index.queues[search.queue].victims,
                below,
                search.cutoff,
                MAX_VICTIM_CANDIDATES,
            ),
            Some(QuotaBlock::Pool(_)) => {
                let mut keys: Vec<VictimKey> = search
                    .cohort
                    .into_iter()
                    .flat_map(|cohort| self.cohorts[cohort].members.iter())
                    .flat_map(|&member| {
                        ran_long_enough(
                            &self.index.queues[member].victims,
                            below,
                            search.cutoff,
                            MAX_VICTIM_CANDIDATES,
                        )
                    })
                    .collect();
                keys.sort_unstable();
                keys
            }
        }
    }

    /// Asks the chosen victims to stop, and gives the preemptor a reservation
    /// and `plan`, the placement it will take once they have.
    fn stop_victims(
        &mut self,
        search: &VictimSearch,
        chosen: &[(TrialId, bool)],
        plan: Vec<WorkerPlacement>,
        pass: &mut Pass,
        decisions: &mut Vec<Decision>,
    ) {
        let VictimSearch {
            preemptor: id,
            queue,
            demand,
            ..
        } = *search;
        let grace_ms = self.grace_ms();
        let deadline = pass.now.saturating_add(grace_ms);
        for &(victim, reclaim) in chosen {
            self.change(victim, |trial| {
                if let Standing::Placed(placed) = &mut trial.standing {
                    placed.preempt_deadline = Some(deadline);
                }
            });
            let reason = self.preempt_reason(search, victim, reclaim);
            decisions.push(Decision::Preempt {
                trial: victim,
                reason,
                grace_ms,
            });
        }
        let reservation = Reservation {
            victims: chosen.iter().map(|(victim, _)| *victim).collect(),
            queue,
            demand,
            leases: self
                .trials
                .get(&id)
                .map(|trial| trial.request.gang.leases.clone())
                .unwrap_or_default(),
        };
        self.index.reserve(&reservation);
        pass.usage_view[queue] = plus(pass.usage_view[queue], demand);
        self.reservations.insert(id, reservation);
        pass.add_plan(id, plan, chosen.iter().map(|(victim, _)| *victim).collect());
        self.set_reason(id, WaitReason::WaitingForPreemption);
    }

    /// The smallest prefix of `candidates` that lets the trial start, with the
    /// victims it does not need dropped again.
    fn choose_victims(
        &mut self,
        id: TrialId,
        queue: usize,
        candidates: &[(TrialId, bool)],
        future: &[ResourceVec],
        pass: &mut Pass,
    ) -> Option<Vec<(TrialId, bool)>> {
        let trial = self.trials.get(&id)?;
        // The cheap checks (quota, room in total) first, growing the prefix;
        // then one placement with every candidate gone: freeing more never
        // leaves less room, so when that fails no prefix fits, which is how
        // most searches of a full cluster end (and a later search of the pass
        // for a gang as large among the same candidates is answered from
        // memory). Then placement checks, and the victims it can do without
        // spared.
        let first = self.cheap_prefix(id, queue, trial.demand, candidates, future, pass)?;
        let mut all = prefix_ids(candidates);
        all.sort_unstable();
        if pass.failed_with_freed(&trial.request.gang, &all) {
            return None;
        }
        let epoch = self.room_epoch;
        if self
            .no_room
            .failed_with_freed(epoch, &trial.request.gang, &all)
        {
            // As in an earlier pass, with no room gained since.
            pass.record_failed_with_freed(&trial.request.gang, all);
            return None;
        }
        if !self.fits_without(id, candidates) {
            self.no_room
                .record_with_freed(epoch, &trial.request.gang, all.clone());
            pass.record_failed_with_freed(&trial.request.gang, all);
            return None;
        }
        let pass: &Pass = pass;
        let suffices = |set: &[(TrialId, bool)]| {
            self.victims_suffice(
                id,
                queue,
                set.iter().map(|(victim, _)| *victim),
                future,
                pass,
            )
            .is_some()
        };
        let size = smallest_sufficient_prefix(candidates, first, &suffices)?;
        Some(spare_unneeded(candidates[..size].to_vec(), &suffices))
    }

    /// The length of the shortest prefix of `candidates` whose stopping gives
    /// `id` (asking `demand` in `queue`) room in total, quota and leases.
    fn cheap_prefix(
        &self,
        id: TrialId,
        queue: usize,
        demand: ResourceVec,
        candidates: &[(TrialId, bool)],
        future: &[ResourceVec],
        pass: &Pass,
    ) -> Option<usize> {
        let mut view = future.to_vec();
        let mut total = pass.free;
        for (count, (victim, _)) in candidates.iter().enumerate() {
            let Some(victim_trial) = self.trials.get(victim) else {
                continue;
            };
            view[victim_trial.queue] = minus(view[victim_trial.queue], victim_trial.demand);
            if let Standing::Placed(placed) = &victim_trial.standing {
                total = plus(total, placement_total(&placed.workers));
            }
            if covers(total, demand)
                && self.quota_block(queue, &demand, &view).is_none()
                && self.leases_fit_with_freed(id, &prefix_ids(&candidates[..=count]))
            {
                return Some(count + 1);
            }
        }
        None
    }

    /// Whether the pool holds the trial's gang once all of `victims` have
    /// stopped, whatever is planned for others.
    fn fits_without(&self, id: TrialId, victims: &[(TrialId, bool)]) -> bool {
        let Some(trial) = self.trials.get(&id) else {
            return false;
        };
        let freed: Vec<&[WorkerPlacement]> = victims
            .iter()
            .filter_map(|(victim, _)| match &self.trials.get(victim)?.standing {
                Standing::Placed(placed) => Some(placed.workers.as_slice()),
                Standing::Waiting | Standing::Held => None,
            })
            .collect();
        self.pool
            .find_with_freed(&trial.request.gang, self.strategy(id), &freed)
            .is_some()
    }

    /// Where the trial would go if `victims` stopped, when that is enough for
    /// both its quota and the nodes (and avoids nodes planned for others).
    fn victims_suffice(
        &self,
        id: TrialId,
        queue: usize,
        victims: impl Iterator<Item = TrialId>,
        future: &[ResourceVec],
        pass: &Pass,
    ) -> Option<Vec<WorkerPlacement>> {
        let trial = self.trials.get(&id)?;
        let mut view = future.to_vec();
        let mut total = pass.free;
        let mut freed: Vec<&[WorkerPlacement]> = Vec::new();
        let victims: Vec<TrialId> = victims.collect();
        if !self.leases_fit_with_freed(id, &victims) {
            return None;
        }
        for victim in victims {
            let victim_trial = self.trials.get(&victim)?;
            let Standing::Placed(placed) = &victim_trial.standing else {
                return None;
            };
            view[victim_trial.queue] = minus(view[victim_trial.queue], victim_trial.demand);
            total = plus(total, placement_total(&placed.workers));
            freed.push(&placed.workers);
        }
        if !covers(total, trial.demand) || self.quota_block(queue, &trial.demand, &view).is_some() {
            return None;
        }
        self.pool
            .find_with_freed(&trial.request.gang, self.strategy(id), &freed)
            .filter(|plan| self.plan_conflict(pass, plan, &freed).is_none())
    }

    /// What counts as a queue's usage when deciding whether it borrows, for
    /// reclaim: its usage when the pass began, less its trials already stopping.
    fn borrowing_usage(&self, queue: usize, pass: &Pass) -> ResourceVec {
        minus(pass.start_usage[queue], self.index.queues[queue].stopping)
    }
}

/// The smallest trial id, for ranges over victim keys.
const FIRST_TRIAL: TrialId = TrialId {
    experiment: ExperimentId { digest: 0, run: 0 },
    index: 0,
};
/// The largest trial id, for ranges over victim keys.
const LAST_TRIAL: TrialId = TrialId {
    experiment: ExperimentId {
        digest: u64::MAX,
        run: u32::MAX,
    },
    index: u32::MAX,
};

/// The trial ids of candidate victims.
fn prefix_ids(candidates: &[(TrialId, bool)]) -> Vec<TrialId> {
    candidates.iter().map(|(victim, _)| *victim).collect()
}

/// Up to `limit` candidates of `set` below priority `below` (all when `None`)
/// that started at or before `cutoff`, in preference order. Within a priority the
/// set runs from the latest start, so each level is entered at the cutoff
/// instead of walking past the trials that are too young.
fn ran_long_enough(
    set: &Victims,
    below: Option<i64>,
    cutoff: UnixMillis,
    limit: usize,
) -> Vec<VictimKey> {
    const FIRST: TrialId = FIRST_TRIAL;
    const LAST: TrialId = LAST_TRIAL;
    let mut found = Vec::new();
    let mut level = set.first_key_value().map(|((priority, _, _), _)| *priority);
    while let Some(priority) = level {
        if below.is_some_and(|below| priority >= below) || found.len() >= limit {
            break;
        }
        let level_end = (priority, Reverse(0), LAST);
        found.extend(
            set.range((priority, Reverse(cutoff), FIRST)..=level_end)
                .take(limit - found.len())
                .map(|(key, _)| *key),
        );
        level = set
            .range((Bound::Excluded(level_end), Bound::Unbounded))
            .next()
            .map(|((priority, _, _), _)| *priority);
    }
    found
}
/// The length of the shortest prefix of `candidates`, from `first` on, that
/// `suffices`: prefixes growing by doubling steps, then a bisection between
/// the last that failed and the first that sufficed, within
/// [`MAX_PLACEMENT_CHECKS`] checks in all.
fn smallest_sufficient_prefix(
    candidates: &[(TrialId, bool)],
    first: usize,
    suffices: &impl Fn(&[(TrialId, bool)]) -> bool,
) -> Option<usize> {
    let mut checks = 0;
    let mut failed = first - 1;
    let mut size = first;
    let mut step = 1;
    let found = loop {
        if checks >= MAX_PLACEMENT_CHECKS {
            return None;
        }
        checks += 1;
        if suffices(&candidates[..size]) {
            break size;
        }
        if size == candidates.len() {
            return None;
        }
        failed = size;
        size = (size + step).min(candidates.len());
        step *= 2;
    };
    let (mut low, mut high) = (failed, found);
    while high - low > 1 && checks < MAX_PLACEMENT_CHECKS {
        let middle = low + (high - low) / 2;
        checks += 1;
        if suffices(&candidates[..middle]) {
            high = middle;
        } else {
            low = middle;
        }
    }
    Some(high)
}

/// `chosen` without the least preferred victims the trial can do without,
/// trying at most [`MAX_PRUNE_CHECKS`] of them from the end.
fn spare_unneeded(
    mut chosen: Vec<(TrialId, bool)>,
    suffices: &impl Fn(&[(TrialId, bool)]) -> bool,
) -> Vec<(TrialId, bool)> {
    let mut prune_checks = 0;
    let mut position = chosen.len().saturating_sub(1);
    while position > 0 && prune_checks < MAX_PRUNE_CHECKS {
        position -= 1;
        prune_checks += 1;
        let mut without = chosen.clone();
        without.remove(position);
        if suffices(&without) {
            chosen = without;
        }
    }
    chosen
}
