//! Everything the policy core derives from its trial table: waiting trials in
//! FIFO sets per queue and priority, per-queue usage and reservations, pending
//! counts per team, trials per node, expected ends, preemption candidates with
//! the facts a search reads of them, waiting trials with service (whose levels
//! follow the edges) and the smallest waiting demand.
//!
//! Invariant: the index equals one rebuilt from scratch from the trials and
//! reservations. Every change to an entry removes it from the index first and
//! inserts it again after, but for a checkpoint, which only refreshes its
//! candidate's facts in place (`note_checkpoint`); `check_invariants` compares
//! with a rebuild. The index answers lookups only; it makes no decisions.

use std::cmp::Reverse;
use std::collections::{BTreeMap, BTreeSet, HashMap};

use ahash::AHashMap;

use xp_runtime::clock::UnixMillis;
use xp_runtime::ids::{NodeId, TrialId};

use super::leases::add_leases;
use super::reservations::Reservation;
use super::resource_vec::{ResourceVec, minus, plus};
use super::trial::{Placed, Standing, Trial};
use crate::GangShape;

/// A preemption candidate: lowest priority first, then most recently started.
pub(super) type VictimKey = (i64, Reverse<UnixMillis>, TrialId);

/// What a preemption search reads of a candidate, kept beside its key so
/// that a walk over many candidates reads no trial entries: its run's start
/// pass, where its loss counts from, and its service.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct VictimFacts {
    /// The pass that started it.
    pub(super) started_pass: u64,
    /// Its latest checkpoint in this run, else its start.
    pub(super) loss_from: UnixMillis,
    /// GPU thousandths its gang holds.
    pub(super) gpu_milli: u64,
    /// GPU time received before this run.
    pub(super) attained_gpu_ms: u64,
    /// Where its attained-service level counts from.
    pub(super) level_base_gpu_ms: u64,
}

/// Preemption candidates in preference order, each with its facts.
pub(super) type Victims = BTreeMap<VictimKey, VictimFacts>;

/// The trial's key among preemption candidates and its facts, if it is one:
/// preemptible and not already stopping.
pub(super) fn victim_entry(
    id: TrialId,
    trial: &Trial,
    placed: &Placed,
) -> Option<(VictimKey, VictimFacts)> {
    (trial.request.preemptible && placed.preempt_deadline.is_none()).then(|| {
        let key = (trial.request.priority, Reverse(placed.started_at), id);
        let facts = VictimFacts {
            started_pass: placed.started_pass,
            loss_from: placed.loss_from(),
            gpu_milli: trial.demand[0],
            attained_gpu_ms: trial.attained_gpu_ms,
            level_base_gpu_ms: trial.level_base_gpu_ms,
        };
        (key, facts)
    })
}

/// The key of a set of waiting trials: base priority, attained-service level,
/// urgency.
pub(super) type WaitingSet = (i64, u8, u32);

/// The set a waiting trial sits in.
fn waiting_set(trial: &Trial) -> WaitingSet {
    (trial.request.priority, trial.level, trial.request.urgency)
}

/// What is derived per queue.
#[derive(Debug, Clone, Default, PartialEq)]
pub(super) struct QueueIndex {
    /// What its placed trials ask for (running and preempting).
    pub(super) usage: ResourceVec,
    /// What its trials waiting on preemption will take.
    pub(super) reserved: ResourceVec,
    /// What its placed trials that are being preempted hold (part of `usage`).
    pub(super) stopping: ResourceVec,
    /// Waiting trials by base priority, attained-service level and urgency,
    /// each set in FIFO order (so that aging, which favours the oldest, never
    /// reorders a set).
    pub(super) waiting: BTreeMap<WaitingSet, BTreeSet<(UnixMillis, TrialId)>>,
    /// The gangs of its waiting trials that name no lease, each with what it
    /// asks in all and how many trials wait with it: a pass reads them to
    /// know that none of the queue's trials can start (`lanes`).
    pub(super) waiting_shapes: HashMap<GangShape, (ResourceVec, u64)>,
    /// How many of its waiting trials name a lease.
    pub(super) waiting_with_leases: u64,
    /// When its waiting trials last entered the line, counted: the oldest
    /// says whether every one of them still skips ahead (`service`).
    pub(super) waiting_since: BTreeMap<UnixMillis, u64>,
    /// Its trials waiting, held and placed.
    pub(super) n_waiting: u64,
    pub(super) n_held: u64,
    pub(super) n_placed: u64,
    /// Its preemption candidates.
    pub(super) victims: Victims,
    /// Lease units its placed trials hold.
    pub(super) lease_usage: BTreeMap<String, u64>,
    /// Lease units its trials waiting on preemption will take.
    pub(super) lease_reserved: BTreeMap<String, u64>,
}

impl QueueIndex {
    /// Counts a waiting trial's gang in (`add`) or out of the queue's shapes.
    fn count_shape(&mut self, trial: &Trial, add: bool) {
        let gang = &trial.request.gang;
        if !gang.leases.is_empty() {
            self.waiting_with_leases = if add {
                self.waiting_with_leases + 1
            } else {
                self.waiting_with_leases.saturating_sub(1)
            };
            return;
        }
        if add {
            match self.waiting_shapes.get_mut(gang) {
                Some((_, count)) => *count += 1,
                None => {
                    self.waiting_shapes.insert(gang.clone(), (trial.demand, 1));
                }
            }
        } else if let Some((_, count)) = self.waiting_shapes.get_mut(gang) {
            *count -= 1;
            if *count == 0 {
                self.waiting_shapes.remove(gang);
            }
        }
    }
}

/// Everything derived from the trial table, kept up to date by `insert` and
/// `remove` around every change and rebuilt from scratch by `check_invariants`.
#[derive(Debug, Clone, Default, PartialEq)]
pub(super) struct Index {
    /// Per queue, indexed like the core's queues.
    pub(super) queues: Vec<QueueIndex>,
    /// Waiting and held trials per team, for admission.
    pub(super) pending_by_team: BTreeMap<String, u64>,
    /// Placed trials per node they have workers on.
    pub(super) node_trials: BTreeMap<NodeId, BTreeSet<TrialId>>,
    /// Placed trials with a known end, by that end.
    pub(super) ends: BTreeSet<(UnixMillis, TrialId)>,
    /// Preemption candidates of every queue.
    pub(super) victims: Victims,
    /// A multiset per resource of waiting trials' demands, for the smallest one.
    waiting_demand: [BTreeMap<u64, u64>; 3],
    /// Lease units placed trials hold, by lease.
    pub(super) lease_held: BTreeMap<String, u64>,
    /// Lease units trials waiting on preemption will take, by lease.
    pub(super) lease_reserved: BTreeMap<String, u64>,
    /// Waiting trials above attained-service level 0 by when they are
    /// promoted back to it.
    pub(super) promotions: BTreeSet<(UnixMillis, TrialId)>,
    /// Waiting and held trials with service above their level's base: the
    /// only ones whose level can change when the level edges move.
    pub(super) pending_with_service: BTreeSet<TrialId>,
}

/// Whether a trial that is not placed has service above its level's base.
fn has_service(trial: &Trial) -> bool {
    trial.attained_gpu_ms > trial.level_base_gpu_ms
}

/// Adds one `key` to a multiset.
fn count_up<K: Ord>(map: &mut BTreeMap<K, u64>, key: K) {
    *map.entry(key).or_insert(0) += 1;
}

/// Takes one `key` out of a multiset.
fn count_down<K: Ord>(map: &mut BTreeMap<K, u64>, key: K) {
    if let std::collections::btree_map::Entry::Occupied(mut entry) = map.entry(key) {
        *entry.get_mut() -= 1;
        if *entry.get() == 0 {
            entry.remove();
        }
    }
}

impl Index {
    /// An empty index for `n_queues` queues.
    pub(super) fn new(n_queues: usize) -> Self {
        Self {
            queues: vec![QueueIndex::default(); n_queues],
            ..Self::default()
        }
    }

    /// The index of these trials and reservations, built from scratch.
    pub(super) fn rebuild(
        n_queues: usize,
        trials: &AHashMap<TrialId, Trial>,
        reservations: &BTreeMap<TrialId, Reservation>,
    ) -> Self {
        let mut index = Self::new(n_queues);
        for (id, trial) in trials {
            index.insert(*id, trial);
        }
        for reservation in reservations.values() {
            index.reserve(reservation);
        }
        index
    }

    /// Adds a trial's entries as it stands now.
    pub(super) fn insert(&mut self, id: TrialId, trial: &Trial) {
        let queue = &mut self.queues[trial.queue];
        match &trial.standing {
            Standing::Waiting => {
                queue
                    .waiting
                    .entry(waiting_set(trial))
                    .or_default()
                    .insert((trial.line_at, id));
                if let Some(at) = trial.promote_at {
                    self.promotions.insert((at, id));
                }
                queue.count_shape(trial, true);
                count_up(&mut queue.waiting_since, trial.waiting_since);
                queue.n_waiting += 1;
                if has_service(trial) {
                    self.pending_with_service.insert(id);
                }
                count_up(&mut self.pending_by_team, trial.request.team.clone());
                for (resource, multiset) in self.waiting_demand.iter_mut().enumerate() {
                    count_up(multiset, trial.demand[resource]);
                }
            }
            Standing::Held => {
                queue.n_held += 1;
                if has_service(trial) {
                    self.pending_with_service.insert(id);
                }
                count_up(&mut self.pending_by_team, trial.request.team.clone());
            }
            Standing::Placed(placed) => {
                add_leases(&mut queue.lease_usage, &trial.request.gang.leases, true);
                add_leases(&mut self.lease_held, &trial.request.gang.leases, true);
                queue.usage = plus(queue.usage, trial.demand);
                if placed.preempt_deadline.is_some() {
                    queue.stopping = plus(queue.stopping, trial.demand);
                }
                queue.n_placed += 1;
                if let Some((key, facts)) = victim_entry(id, trial, placed) {
                    queue.victims.insert(key, facts);
                    self.victims.insert(key, facts);
                }
                for worker in &placed.workers {
                    self.node_trials.entry(worker.node).or_default().insert(id);
                }
                if let Some(end) = placed.end() {
                    self.ends.insert((end, id));
                }
            }
        }
    }

    /// Takes out a trial's entries; call before it changes.
    pub(super) fn remove(&mut self, id: TrialId, trial: &Trial) {
        let queue = &mut self.queues[trial.queue];
        match &trial.standing {
            Standing::Waiting => {
                let set_key = waiting_set(trial);
                if let Some(set) = queue.waiting.get_mut(&set_key) {
                    set.remove(&(trial.line_at, id));
                    if set.is_empty() {
                        queue.waiting.remove(&set_key);
                    }
                }
                if let Some(at) = trial.promote_at {
                    self.promotions.remove(&(at, id));
                }
                queue.count_shape(trial, false);
                count_down(&mut queue.waiting_since, trial.waiting_since);
                queue.n_waiting -= 1;
                if has_service(trial) {
                    self.pending_with_service.remove(&id);
                }
                count_down(&mut self.pending_by_team, trial.request.team.clone());
                for (resource, multiset) in self.waiting_demand.iter_mut().enumerate() {
                    count_down(multiset, trial.demand[resource]);
                }
            }
            Standing::Held => {
                queue.n_held -= 1;
                if has_service(trial) {
                    self.pending_with_service.remove(&id);
                }
                count_down(&mut self.pending_by_team, trial.request.team.clone());
            }
            Standing::Placed(placed) => {
                add_leases(&mut queue.lease_usage, &trial.request.gang.leases, false);
                add_leases(&mut self.lease_held, &trial.request.gang.leases, false);
                queue.usage = minus(queue.usage, trial.demand);
                if placed.preempt_deadline.is_some() {
                    queue.stopping = minus(queue.stopping, trial.demand);
                }
                queue.n_placed -= 1;
                if let Some((key, _)) = victim_entry(id, trial, placed) {
                    queue.victims.remove(&key);
                    self.victims.remove(&key);
                }
                for worker in &placed.workers {
                    if let Some(set) = self.node_trials.get_mut(&worker.node) {
                        set.remove(&id);
                        if set.is_empty() {
                            self.node_trials.remove(&worker.node);
                        }
                    }
                }
                if let Some(end) = placed.end() {
                    self.ends.remove(&(end, id));
                }
            }
        }
    }

    /// Counts a reservation against its queue.
    pub(super) fn reserve(&mut self, reservation: &Reservation) {
        let queue = &mut self.queues[reservation.queue];
        queue.reserved = plus(queue.reserved, reservation.demand);
        add_leases(&mut queue.lease_reserved, &reservation.leases, true);
        add_leases(&mut self.lease_reserved, &reservation.leases, true);
    }

    /// Takes back what [`Self::reserve`] counted.
    pub(super) fn unreserve(&mut self, reservation: &Reservation) {
        let queue = &mut self.queues[reservation.queue];
        queue.reserved = minus(queue.reserved, reservation.demand);
        add_leases(&mut queue.lease_reserved, &reservation.leases, false);
        add_leases(&mut self.lease_reserved, &reservation.leases, false);
    }

    /// The smallest waiting demand per resource (each resource on its own).
    pub(super) fn min_waiting_demand(&self) -> ResourceVec {
        self.waiting_demand
            .each_ref()
            .map(|multiset| multiset.keys().next().copied().unwrap_or(u64::MAX))
    }
}
