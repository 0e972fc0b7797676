//! The policy core: queue ordering, quotas and borrowing, fair share, backfill
//! reservations, preemption and the reasons trials wait.
//!
//! [`PolicyCore`] owns the node pool, every trial the policy knows (waiting, held,
//! running, preempting), per-queue usage and the duration estimates. It does no
//! I/O and reads no clock: time comes in as [`UnixMillis`]. It does not launch or
//! kill anything; the caller carries out the [`Decision`]s and reports back with
//! [`PolicyCore::requeue`] and [`PolicyCore::finish`].
//!
//! This file holds the core's state and its public API, but for
//! [`PolicyCore::queues`] (with the quotas) and [`PolicyCore::check_invariants`]
//! (with the checks). The parts of a decision pass live beside it, each with the
//! rules it upholds written at its top:
//! - `resource_vec`: the three resources as one array, and its arithmetic;
//! - `trial`: a trial's entry in the table and how it stands (waiting, held,
//!   placed), with the helpers that change an entry;
//! - `index`: what is derived from the trial table (waiting sets, usage,
//!   preemption candidates, expected ends), kept in step with every change;
//! - `quota`: queues and cohorts, quota checks and borrowing, queue standings;
//! - `pass`: the scratch state of one pass;
//! - `reservations`: trials that preempted others, served first in a pass, and
//!   the placements planned for them;
//! - `lanes`: the ordered walk over waiting trials and what each visit decides;
//! - `backfill`: reservations for blocked trials and when they are due;
//! - `preemption`: choosing victims for a trial that cannot start;
//! - `service`: attained service (levels, promotion, skip-ahead) and what a
//!   victim would lose (checkpoints);
//! - `leases`: lease units (free, reserved, quotas) and preemptions that wait
//!   for an admin's approval;
//! - `invariants`: the from-scratch check of all of the above.
//!
//! # One pass of [`PolicyCore::decide`]
//!
//! 1. Trials that preempted others are served first: once their victims are gone
//!    they start. While victims are stopping, the trial's demand counts against
//!    its queue's quota for everyone else, and its planned placement is kept: a
//!    new placement on a node of the plan must leave room, node by node and GPU by
//!    GPU, for the plan once the victims there have stopped.
//! 2. Waiting trials are visited in *lanes*: with `order: fair` one lane per queue,
//!    and at each step the lane of the queue with the lowest weighted dominant
//!    share goes; otherwise one lane over all queues. Inside a lane the order is
//!    effective priority (base plus aging), then the attained-service level,
//!    then urgency, then `line_at` (`submitted_at`, later by `delay_per_gpu`
//!    per GPU beyond one), then id; `fifo` ignores all but `submitted_at`.
//! 3. A trial starts when its queue's quota allows it, its lease units are free
//!    and the pool finds room for its whole gang. When it cannot start, preemption is tried (if enabled); then
//!    with backfill the queue's first such trial gets a reservation; otherwise a
//!    strict head of line stops the lane (a trial over its own queue's quota stops
//!    only its queue), and `skip` goes on.

use std::collections::{BTreeMap, HashMap};

use ahash::AHashMap;

use xp_runtime::clock::UnixMillis;
use xp_runtime::ids::{ExperimentId, NodeId, TrialId};

use self::index::Index;
use self::leases::Approvals;
use self::quota::{Cohort, QueueInfo, build_queues};
use self::reservations::Reservation;
use self::resource_vec::gang_demand;
use self::trial::{Estimate, Placed, Standing, Trial};
use super::config::PlacementKind;
use super::place::{NodePool, PlaceError};
use super::{
    Decision, GPU_MILLI, GangShape, NodeSpec, PolicyConfig, PolicyError, Refusal, TrialRequest,
    WaitReason, WorkerPlacement,
};

pub use self::invariants::InvariantViolation;
pub use self::service::AttainedService;

mod backfill;
mod elastic;
mod index;
mod invariants;
mod lanes;
mod leases;
mod levels;
mod no_room;
mod observed_mix;
mod pass;
mod preemption;
mod quota;
mod reservations;
mod resource_vec;
mod service;
mod trial;

#[cfg(test)]
mod tests;

/// The policy core: one owner of the node pool, the queues and every trial.
#[derive(Debug)]
pub struct PolicyCore {
    config: PolicyConfig,
    queue_info: Vec<QueueInfo>,
    queue_by_name: HashMap<String, usize>,
    cohorts: Vec<Cohort>,
    pool: NodePool,
    /// Bumped when nodes change, to refresh `could_ever_fit` answers.
    node_epoch: u64,
    /// Bumped whenever the pool may have gained room: resources released,
    /// nodes changed, a placed trial grown (`no_room`).
    room_epoch: u64,
    /// Placement searches that found no room in this room epoch.
    no_room: no_room::NoRoom,
    trials: AHashMap<TrialId, Trial>,
    index: Index,
    /// Trials that preempted others, by preemptor.
    reservations: BTreeMap<TrialId, Reservation>,
    estimates: AHashMap<ExperimentId, Estimate>,
    /// Per queue, the reason of trials the last pass did not reach.
    unexamined: Vec<WaitReason>,
    /// Tests only: every pass walks each lane to its end, as before
    /// `lane_cannot_start` could stop it early.
    #[cfg(test)]
    walk_every_trial: bool,
    /// Tests only: a smaller budget of trials a pass looks at, so that
    /// small cases reach it.
    #[cfg(test)]
    examined_budget_override: Option<usize>,
    /// Passes run so far.
    pass: u64,
    /// Set when a new policy left running work above its quotas.
    quota_relaxed: bool,
    /// Set when a new policy (or an adoption) left leases held beyond their
    /// capacity or a queue's lease quota.
    leases_relaxed: bool,
    /// Preemptions waiting for an admin, and the verdicts in force.
    approvals: Approvals,
    /// The attained-service level edges, fixed or following the service of
    /// completed trials (`levels`).
    levels: levels::ServiceLevels,
    /// Elastic trials' ranges and resizes in flight (`elastic`).
    elastic: elastic::ElasticTable,
    /// The recent trials' asks that `placement: fgd` scores against
    /// (`observed_mix`).
    observed_mix: observed_mix::ObservedMix,
}

impl PolicyCore {
    /// A core with no nodes and no trials. The policy should have passed
    /// [`PolicyConfig::validate`] (parsed files and presets have).
    pub fn new(config: PolicyConfig) -> Self {
        let (queue_info, cohorts, queue_by_name) = build_queues(&config);
        let n_queues = queue_info.len();
        Self {
            levels: levels::ServiceLevels::new(&config),
            config,
            queue_info,
            queue_by_name,
            cohorts,
            pool: NodePool::new(),
            node_epoch: 0,
            room_epoch: 0,
            no_room: no_room::NoRoom::default(),
            trials: AHashMap::new(),
            index: Index::new(n_queues),
            reservations: BTreeMap::new(),
            estimates: AHashMap::new(),
            unexamined: vec![WaitReason::NotYetConsidered; n_queues],
            #[cfg(test)]
            walk_every_trial: false,
            #[cfg(test)]
            examined_budget_override: None,
            pass: 0,
            quota_relaxed: false,
            leases_relaxed: false,
            approvals: Approvals::default(),
            elastic: elastic::ElasticTable::new(),
            observed_mix: observed_mix::ObservedMix::default(),
        }
    }

    /// The policy in force.
    pub fn config(&self) -> &PolicyConfig {
        &self.config
    }

    /// Replaces the policy; trials keep their places. Trials whose queue is gone
    /// (or no longer takes their team) move to their team's default queue; if a
    /// team has none, nothing changes and the error names it. Pending preemption
    /// reservations are dropped (their victims still stop) and earned again under
    /// the new policy. Running work above smaller new quotas keeps running.
    pub fn set_config(&mut self, config: PolicyConfig, now: UnixMillis) -> Result<(), PolicyError> {
        let _ = now;
        config.validate()?;
        let (queue_info, cohorts, queue_by_name) = build_queues(&config);
        let mut ids: Vec<TrialId> = self.trials.keys().copied().collect();
        ids.sort_unstable();
        let mut targets = Vec::with_capacity(ids.len());
        for id in ids {
            let trial = &self.trials[&id];
            let team = trial.request.team.as_str();
            let old_name = &self.queue_info[trial.queue].name;
            let target = queue_by_name
                .get(old_name)
                .copied()
                .filter(|&index| queue_info[index].accepts(team))
                .or_else(|| {
                    config
                        .default_queue_for(team)
                        .and_then(|queue| queue_by_name.get(&queue.name).copied())
                });
            let Some(target) = target else {
                return Err(PolicyError::NoQueueForTeam {
                    team: team.to_owned(),
                    queue: old_name.clone(),
                });
            };
            targets.push((id, target));
        }
        self.levels.reconfigure(&config);
        // A new placement strategy may place what the old one could not.
        self.room_epoch += 1;
        self.config = config;
        self.queue_info = queue_info;
        self.cohorts = cohorts;
        self.queue_by_name = queue_by_name;
        for (id, target) in targets {
            let trial = self.trials.get_mut(&id).expect("ids come from the table");
            // A trial that named its queue now names the one it is in.
            if trial.request.queue.is_some() {
                trial.request.queue = Some(self.queue_info[target].name.clone());
            }
            trial.queue = target;
            trial.entered_pass = self.pass;
        }
        // Levels follow the new thresholds; the index is rebuilt just below.
        let mut trials = std::mem::take(&mut self.trials);
        for trial in trials.values_mut() {
            self.set_level(trial);
        }
        self.trials = trials;
        self.reservations.clear();
        let n_queues = self.queue_info.len();
        self.index = Index::rebuild(n_queues, &self.trials, &self.reservations);
        self.unexamined = vec![WaitReason::NotYetConsidered; n_queues];
        self.quota_relaxed = self.quota_report().is_some();
        self.leases_relaxed = self.leases_over_policy();
        self.withdraw_pending_approvals();
        Ok(())
    }

    /// Adds or updates a node.
    pub fn upsert_node(&mut self, spec: NodeSpec) {
        self.pool.upsert_node(spec);
        self.node_epoch += 1;
        self.room_epoch += 1;
    }

    /// Stops or resumes giving a node work (draining, lost).
    pub fn set_node_schedulable(&mut self, id: NodeId, schedulable: bool) {
        self.pool.set_schedulable(id, schedulable);
        self.node_epoch += 1;
        self.room_epoch += 1;
    }

    /// Forgets a node; returns the trials that had workers on it. They keep their
    /// other workers' resources until the caller requeues or finishes them.
    pub fn remove_node(&mut self, id: NodeId) -> Vec<TrialId> {
        let affected: Vec<TrialId> = self
            .index
            .node_trials
            .get(&id)
            .map(|set| set.iter().copied().collect())
            .unwrap_or_default();
        if self.pool.remove_node(id) {
            for trial_id in &affected {
                if let Some(Standing::Placed(placed)) = self
                    .trials
                    .get_mut(trial_id)
                    .map(|trial| &mut trial.standing)
                    && !placed.lost_nodes.contains(&id)
                {
                    placed.lost_nodes.push(id);
                }
            }
        }
        self.node_epoch += 1;
        self.room_epoch += 1;
        affected
    }

    /// Queues a trial, or refuses it: a duplicate id, an invalid gang, a queue that
    /// does not exist or does not take the team, or a team with too many pending.
    pub fn submit(&mut self, mut request: TrialRequest, now: UnixMillis) -> Result<(), Refusal> {
        let _ = now;
        if self.trials.contains_key(&request.id) {
            return Err(Refusal::Duplicate(request.id));
        }
        check_gang(&request.gang)?;
        self.check_leases_of(&request.gang.leases)?;
        // Where oversubscription enters (with `adopt`): an opted-in fractional worker asks
        // for its charge, and everything after (placement, quotas, invariants)
        // counts that.
        if request.gang.oversubscribe {
            request.gang.per_worker.gpu_milli = crate::oversubscribed_charge(
                request.gang.per_worker.gpu_milli,
                self.config.oversubscription_milli(),
            );
        }
        let queue = self.resolve_queue(&request.team, request.queue.as_deref())?;
        let pending = self
            .index
            .pending_by_team
            .get(&request.team)
            .copied()
            .unwrap_or(0);
        let limit = self.config.admission.max_pending_per_team;
        if pending >= limit {
            return Err(Refusal::TooManyPending {
                team: request.team,
                pending,
                limit,
                retry_after_ms: self.config.admission.retry_after_ms,
            });
        }
        let id = request.id;
        self.observed_mix.observe(&request.gang);
        let trial = self.waiting_entry(request, queue);
        self.index.insert(id, &trial);
        self.trials.insert(id, trial);
        Ok(())
    }

    /// A new waiting entry for `request` in `queue`.
    fn waiting_entry(&self, request: TrialRequest, queue: usize) -> Trial {
        let mut trial = Trial {
            demand: gang_demand(&request.gang),
            queue,
            standing: Standing::Waiting,
            reason: WaitReason::NotYetConsidered,
            reason_pass: 0,
            entered_pass: self.pass,
            fits_cache: None,
            attained_gpu_ms: 0,
            run_ms: 0,
            level_base_gpu_ms: 0,
            waiting_since: request.submitted_at,
            level: 0,
            promote_at: None,
            line_at: request.submitted_at,
            request,
        };
        self.set_level(&mut trial);
        trial
    }

    /// A placed trial goes back to its queue, releasing what it held; it keeps
    /// its `submitted_at`, so it keeps its place (within its attained-service
    /// level, which the run just ended may have raised). False if it is not
    /// placed.
    pub fn requeue(&mut self, trial: TrialId, now: UnixMillis) -> bool {
        let Some(mut entry) = self.trials.remove(&trial) else {
            return false;
        };
        if !matches!(entry.standing, Standing::Placed(_)) {
            self.trials.insert(trial, entry);
            return false;
        }
        self.index.remove(trial, &entry);
        entry.attained_gpu_ms = entry.attained_at(now);
        if let Standing::Placed(placed) = std::mem::replace(&mut entry.standing, Standing::Waiting)
        {
            entry.run_ms = entry
                .run_ms
                .saturating_add(now.saturating_sub(placed.started_at));
            self.release(&placed.held_workers());
        }
        entry.entered_pass = self.pass;
        entry.waiting_since = now;
        self.set_level(&mut entry);
        self.index.insert(trial, &entry);
        self.trials.insert(trial, entry);
        self.forget_approvals(trial);
        self.elastic_requeued(trial, now);
        true
    }

    /// Gives `workers`' resources back to the pool, which may now hold what
    /// it could not (`no_room`).
    fn release(&mut self, workers: &[WorkerPlacement]) {
        self.pool.release(workers);
        self.room_epoch += 1;
    }

    /// A trial is done; releases what it held and forgets it. When it
    /// `completed`, its run time feeds its experiment's duration estimate.
    pub fn finish(&mut self, trial: TrialId, now: UnixMillis, completed: bool) -> bool {
        let Some(entry) = self.trials.remove(&trial) else {
            return false;
        };
        self.index.remove(trial, &entry);
        self.drop_reservation(trial, None);
        self.forget_approvals(trial);
        self.elastic.remove(&trial);
        let service = entry.attained_at(now);
        if let Standing::Placed(placed) = entry.standing {
            self.release(&placed.held_workers());
            if completed {
                let estimate = self.estimates.entry(trial.experiment).or_default();
                estimate.total_ms += u128::from(now.saturating_sub(placed.started_at));
                estimate.count += 1;
                self.add_completed_service(service);
            }
        }
        true
    }

    /// Holds a waiting trial. False if it is not waiting.
    pub fn hold(&mut self, trial: TrialId) -> bool {
        if !self
            .trials
            .get(&trial)
            .is_some_and(|entry| matches!(entry.standing, Standing::Waiting))
        {
            return false;
        }
        self.drop_reservation(trial, None);
        self.forget_approvals(trial);
        self.change(trial, |entry| entry.standing = Standing::Held);
        true
    }

    /// Releases a held trial. False if it is not held.
    pub fn release_hold(&mut self, trial: TrialId) -> bool {
        let pass = self.pass;
        self.change(trial, |entry| {
            if !matches!(entry.standing, Standing::Held) {
                return false;
            }
            entry.standing = Standing::Waiting;
            entry.entered_pass = pass;
            true
        })
        .unwrap_or(false)
    }

    /// Sets a trial's base priority (waiting, held or running). False if unknown.
    pub fn set_priority(&mut self, trial: TrialId, priority: i64) -> bool {
        let pass = self.pass;
        self.change(trial, |entry| {
            entry.request.priority = priority;
            if matches!(entry.standing, Standing::Waiting) {
                entry.entered_pass = pass;
            }
        })
        .is_some()
    }

    /// Sets a trial's urgency (waiting, held or running), as a pipeline's
    /// critical path moves. False if unknown.
    pub fn set_urgency(&mut self, trial: TrialId, urgency: u32) -> bool {
        self.change(trial, |entry| entry.request.urgency = urgency)
            .is_some()
    }

    /// Moves a waiting or held trial to another queue of its team (or an open
    /// one). A placed trial cannot move: its usage is accounted to its queue.
    pub fn move_to_queue(&mut self, trial: TrialId, queue: &str) -> Result<(), Refusal> {
        let Some(entry) = self.trials.get(&trial) else {
            return Err(Refusal::Invalid(format!("trial {trial} is not scheduled")));
        };
        if matches!(entry.standing, Standing::Placed(_)) {
            return Err(Refusal::Invalid(format!(
                "trial {trial} is running; requeue it before moving it"
            )));
        }
        let target = self.resolve_queue(&entry.request.team, Some(queue))?;
        self.drop_reservation(trial, None);
        let pass = self.pass;
        self.change(trial, |entry| {
            entry.queue = target;
            entry.request.queue = Some(queue.to_owned());
            entry.entered_pass = pass;
        });
        Ok(())
    }

    /// What to place and preempt now. Every waiting trial has a
    /// [`PolicyCore::wait_reason`] afterwards.
    pub fn decide(&mut self, now: UnixMillis) -> Vec<Decision> {
        self.promote_due(now);
        let fgd = self.config.placement == PlacementKind::Fgd;
        self.observed_mix.refresh(&mut self.pool, fgd);
        self.pass += 1;
        let mut pass = self.begin_pass(now);
        for reason in &mut self.unexamined {
            *reason = WaitReason::BehindHigherPriority;
        }
        let mut decisions = Vec::new();
        self.serve_reservations(&mut pass, &mut decisions);
        self.run_lanes(&mut pass, &mut decisions);
        self.grow_elastic(&mut pass, &mut decisions);
        if self.quota_relaxed && self.quota_report().is_none() {
            self.quota_relaxed = false;
        }
        if self.leases_relaxed && !self.leases_over_policy() {
            self.leases_relaxed = false;
        }
        decisions
    }

    /// Why a waiting or held trial waits; `None` for placed or unknown trials.
    pub fn wait_reason(&self, trial: TrialId) -> Option<WaitReason> {
        let entry = self.trials.get(&trial)?;
        match entry.standing {
            Standing::Placed(_) => None,
            Standing::Held => Some(WaitReason::Held),
            Standing::Waiting => Some(if self.reservations.contains_key(&trial) {
                WaitReason::WaitingForPreemption
            } else if entry.entered_pass == self.pass {
                WaitReason::NotYetConsidered
            } else if entry.reason_pass == self.pass {
                entry.reason.clone()
            } else {
                self.unexamined[entry.queue].clone()
            }),
        }
    }

    /// Whether the core holds `trial` (waiting, held or placed).
    pub fn holds(&self, trial: TrialId) -> bool {
        self.trials.contains_key(&trial)
    }

    /// Where a placed trial's workers are.
    pub fn placement(&self, trial: TrialId) -> Option<&[WorkerPlacement]> {
        match &self.trials.get(&trial)?.standing {
            Standing::Placed(placed) => Some(&placed.workers),
            Standing::Waiting | Standing::Held => None,
        }
    }

    /// The node pool.
    pub fn pool(&self) -> &NodePool {
        &self.pool
    }

    /// Whether a placed trial has been asked to stop and not yet reported back.
    pub fn is_preempting(&self, trial: TrialId) -> bool {
        matches!(
            self.trials.get(&trial).map(|entry| &entry.standing),
            Some(Standing::Placed(placed)) if placed.preempt_deadline.is_some()
        )
    }

    /// The trials waiting (not held), in no particular order.
    pub fn waiting_trials(&self) -> impl Iterator<Item = TrialId> + '_ {
        self.trials
            .iter()
            .filter(|(_, entry)| matches!(entry.standing, Standing::Waiting))
            .map(|(id, _)| *id)
    }

    /// The expected run time of a trial of `experiment` with no time limit: the
    /// mean run time of its completed trials.
    pub fn estimate_ms(&self, experiment: ExperimentId) -> Option<u64> {
        self.estimates
            .get(&experiment)
            .and_then(|estimate| estimate.mean_ms())
    }

    /// Takes back a trial that already runs where `workers` say (the head
    /// restarted and reloaded it): it counts as placed since `started_at`, with
    /// its resources held, without a decision. It must fit the pool as it is.
    pub fn adopt(
        &mut self,
        mut request: TrialRequest,
        workers: Vec<WorkerPlacement>,
        started_at: UnixMillis,
    ) -> Result<(), AdoptError> {
        if self.trials.contains_key(&request.id) {
            return Err(Refusal::Duplicate(request.id).into());
        }
        // An oversubscribed worker holds its charge, which the factor in force
        // when it was submitted set: what it holds is what it asks.
        if request.gang.oversubscribe
            && let Some(share) = workers
                .first()
                .and_then(|worker| worker.gpus.first())
                .map(|share| u64::from(share.milli))
        {
            request.gang.per_worker.gpu_milli = share.min(request.gang.per_worker.gpu_milli);
        }
        let queue = self.resolve_queue(&request.team, request.queue.as_deref())?;
        self.pool.allocate(&workers)?;
        let id = request.id;
        self.observed_mix.observe(&request.gang);
        let mut trial = self.waiting_entry(request, queue);
        let duration = self.duration(&trial);
        trial.standing = Standing::Placed(Placed {
            workers,
            started_at,
            started_pass: self.pass,
            expected_end: duration.map(|duration| started_at.saturating_add(duration)),
            preempt_deadline: None,
            lost_nodes: Vec::new(),
            last_checkpoint: None,
        });
        self.index.insert(id, &trial);
        self.trials.insert(id, trial);
        // It runs already: leases a new policy lowered are tolerated until it ends.
        if self.leases_over_policy() {
            self.leases_relaxed = true;
        }
        Ok(())
    }
}

/// Why a running trial could not be taken back after a restart.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AdoptError {
    /// The trial is known already, or its queue no longer takes it.
    #[error(transparent)]
    Refused(#[from] Refusal),
    /// Its workers do not fit the pool as it is.
    #[error(transparent)]
    Place(#[from] PlaceError),
}

fn check_gang(gang: &GangShape) -> Result<(), Refusal> {
    if gang.workers == 0 {
        return Err(Refusal::Invalid(
            "a gang needs at least one worker".to_owned(),
        ));
    }
    let gpu_milli = gang.per_worker.gpu_milli;
    if gpu_milli > GPU_MILLI && !gpu_milli.is_multiple_of(GPU_MILLI) {
        return Err(Refusal::Invalid(format!(
            "{} GPUs per worker is neither a fraction of one GPU nor whole GPUs",
            gpu_milli as f64 / GPU_MILLI as f64
        )));
    }
    Ok(())
}
