//! The decision loop: queue ordering, quotas and borrowing, fair share, backfill
//! reservations, preemption and the reasons trials wait.
//!
//! [`PolicyCore`] owns the node pool, every trial the policy knows (waiting, held,
//! running, preempting), per-queue usage and the duration estimates. It does no
//! I/O and reads no clock: time comes in as [`UnixMillis`]. It does not launch or
//! kill anything; the caller carries out the [`Decision`]s and reports back with
//! [`PolicyCore::requeue`] and [`PolicyCore::finish`].
//!
//! # Quotas (Kueue semantics)
//!
//! Per resource, a queue has a nominal quota `N` (unlimited when absent), a lending
//! limit `L` (default `N`) and a borrowing limit `B` (default unlimited). The part
//! `G = N − L` is never lent. A queue in a cohort may use up to `N + B`, and the
//! cohort's queues together may use at most `Σ L` beyond their `G`s:
//! `Σ max(0, usage − G) ≤ Σ L`. So a queue borrows only what others leave idle and
//! lendable, and a queue with no cohort never exceeds `N`. Both hold after every
//! decision (`check_invariants`); only a new policy with smaller quotas can leave
//! running work above them, and that is tolerated until it drains.
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
//!    effective priority (base plus aging), then `submitted_at`, then id; `fifo`
//!    ignores priorities.
//! 3. A trial starts when its queue's quota allows it and the pool finds room for
//!    its whole gang. When it cannot start, preemption is tried (if enabled); then
//!    with backfill the queue's first such trial gets a reservation; otherwise a
//!    strict head of line stops the lane (a trial over its own queue's quota stops
//!    only its queue), and `skip` goes on.
//!
//! # Keeping a pass cheap
//!
//! Waiting trials sit in ordered sets per queue and base priority, keyed by
//! `(submitted_at, id)`. Aging never reorders such a set (an older trial has aged at
//! least as much), so a lane is a k-way merge of the sets' heads by current
//! effective priority: nothing is sorted per pass. A pass also stops early:
//! a lane ends after its first blocked trial once the free room in the cluster is
//! below the smallest waiting demand; under a backfill reservation the pass ends
//! as soon as no trial could backfill (the reservation is due, or nothing fits);
//! preemption candidates sit in sets ordered by priority then latest start, entered
//! per priority at the minimum-run-time cutoff; gang shapes that did not fit are remembered
//! for the pass (a larger one with the same constraints cannot fit either); at most
//! `MAX_EXAMINED_PER_PASS` trials that do not start are looked at, and at most
//! `MAX_PREEMPTION_ATTEMPTS_PER_PASS` preemption searches and
//! `MAX_BACKFILL_RESERVATIONS_PER_PASS` reservation searches are made. Trials
//! not reached keep the reason their lane gives (`BehindHigherPriority`, or
//! `GangDoesNotFit` when the cluster is full).
//!
//! # Backfill
//!
//! A blocked trial's reservation is the earliest time enough running work is
//! expected to end for its gang to fit: running trials in order of expected end
//! (start plus time limit, else plus the mean run time of completed trials of the
//! same experiment, fixed when the trial starts; a preempted trial ends by its
//! grace deadline) are released one by one against the pool until
//! [`NodePool::find_with_freed`] succeeds. Afterwards in the pass, a trial starts
//! only if its own time limit (or estimate) ends by the earliest reservation, so
//! no reservation is delayed while estimates hold. Trials with neither do not
//! backfill. When the time is unknown (the gang fits only once work with no known
//! end stops) the reservation is *now*: nothing backfills past it, so a big gang is
//! never starved by a stream of small trials. Each queue's first trial without
//! room gets a reservation; later trials that cannot start only because of a
//! reservation wait as `ReservedFor` and do not preempt. A trial held back by its
//! queue's quota gets no reservation (it waits for its own queue's work, which
//! must not hold up other queues) but stops its queue for the pass.
//!
//! # Preemption
//!
//! A trial T that cannot start may stop (a) running preemptible trials of strictly
//! lower base priority, or (b) when T's queue stays within its nominal quota, work
//! of other queues in its cohort that are borrowing ("reclaim"). Victims must have
//! run `min_run_time` since they (re)started. Candidates come borrowed work first,
//! then lowest priority, then most recently started; only queues that can relieve
//! what blocks T are searched (T's own queue when its own limit blocks it, the
//! cohort when the cohort's pool does, anyone when nodes do). The smallest prefix
//! of candidates that makes T fit is found with `find_with_freed`, then victims
//! that are not needed are dropped. Victims keep their resources until
//! [`PolicyCore::requeue`] or [`PolicyCore::finish`]; T keeps a reservation. Reclaim
//! takes only from queues that were borrowing when the pass began, so borrowing
//! started by the same pass never makes older work a victim. Quota checks for a
//! plan count stopping trials as gone and reservations as taken, so two trials
//! reclaiming in one pass do not stop twice what they need.

use std::cmp::Reverse;
use std::collections::{BTreeMap, BTreeSet, BinaryHeap, HashMap};
use std::ops::Bound;

use xp_runtime::clock::UnixMillis;
use xp_runtime::ids::{ExperimentId, NodeId, TrialId};

use super::config::{HeadOfLine, Order, RESOURCE_NAMES};
use super::place::{NodePool, Strategy};
use super::{
    Amount, Decision, GPU_MILLI, GangShape, NodeSpec, PolicyConfig, PolicyError, PreemptReason,
    QueueUsage, Refusal, TrialRequest, WaitReason, WorkerPlacement,
};

/// The most waiting trials one pass looks at; the rest keep their lane's reason.
const MAX_EXAMINED_PER_PASS: usize = 4096;
/// The most preemption searches one pass makes.
const MAX_PREEMPTION_ATTEMPTS_PER_PASS: usize = 4;
/// The most backfill reservations one pass computes.
const MAX_BACKFILL_RESERVATIONS_PER_PASS: usize = 8;
/// The most candidate victims one preemption search considers.
const MAX_VICTIM_CANDIDATES: usize = 256;
/// The most placement searches one preemption or reservation search makes.
const MAX_PLACEMENT_CHECKS: usize = 24;
/// The most victims a preemption search tries to spare once it has a set.
const MAX_PRUNE_CHECKS: usize = 8;
/// The most gang shapes remembered as not fitting in one pass.
const MAX_FAILED_SHAPES: usize = 64;

/// GPU thousandths, CPU thousandths and memory bytes, indexed like
/// [`RESOURCE_NAMES`].
type Resources = [u64; 3];

fn resources(amount: &Amount) -> Resources {
    [amount.gpu_milli, amount.cpu_milli, amount.memory_bytes]
}

fn plus(a: Resources, b: Resources) -> Resources {
    [
        a[0].saturating_add(b[0]),
        a[1].saturating_add(b[1]),
        a[2].saturating_add(b[2]),
    ]
}

fn minus(a: Resources, b: Resources) -> Resources {
    [
        a[0].saturating_sub(b[0]),
        a[1].saturating_sub(b[1]),
        a[2].saturating_sub(b[2]),
    ]
}

fn covers(have: Resources, need: Resources) -> bool {
    (0..3).all(|r| have[r] >= need[r])
}

fn gang_demand(gang: &GangShape) -> Resources {
    let workers = u64::from(gang.workers);
    resources(&gang.per_worker).map(|amount| amount.saturating_mul(workers))
}

fn placement_total(workers: &[WorkerPlacement]) -> Resources {
    workers.iter().fold([0; 3], |total, worker| {
        let gpu = worker.gpus.iter().map(|share| u64::from(share.milli)).sum();
        plus(total, [gpu, worker.cpu_milli, worker.memory_bytes])
    })
}

/// A queue's static description, from the policy.
#[derive(Debug, Clone)]
struct QueueInfo {
    name: String,
    team: Option<String>,
    cohort: Option<usize>,
    weight: f64,
    nominal: [Option<u64>; 3],
    borrowing: [Option<u64>; 3],
    lending: [Option<u64>; 3],
}

impl QueueInfo {
    fn accepts(&self, team: &str) -> bool {
        self.team.as_deref().is_none_or(|owner| owner == team)
    }

    /// What it lends to its cohort's pool and what it keeps, for a finite quota.
    fn lend_and_keep(&self, resource: usize) -> Option<(u64, u64)> {
        let nominal = self.nominal[resource]?;
        let lend = self.lending[resource].unwrap_or(nominal).min(nominal);
        Some((lend, nominal - lend))
    }

    fn is_borrowing(&self, usage: Resources) -> bool {
        (0..3).any(|r| self.nominal[r].is_some_and(|nominal| usage[r] > nominal))
    }
}

#[derive(Debug, Clone)]
struct Cohort {
    name: String,
    members: Vec<usize>,
}

fn build_queues(config: &PolicyConfig) -> (Vec<QueueInfo>, Vec<Cohort>, HashMap<String, usize>) {
    let mut cohort_index: BTreeMap<&str, usize> = BTreeMap::new();
    let mut cohorts: Vec<Cohort> = Vec::new();
    let mut infos = Vec::new();
    let mut by_name = HashMap::new();
    for queue in &config.queues {
        if by_name.contains_key(&queue.name) {
            // An unvalidated policy with a duplicate name: the first queue wins.
            continue;
        }
        let index = infos.len();
        let cohort = queue.cohort.as_deref().map(|name| {
            *cohort_index.entry(name).or_insert_with(|| {
                cohorts.push(Cohort {
                    name: name.to_owned(),
                    members: Vec::new(),
                });
                cohorts.len() - 1
            })
        });
        if let Some(cohort) = cohort {
            cohorts[cohort].members.push(index);
        }
        by_name.insert(queue.name.clone(), index);
        infos.push(QueueInfo {
            name: queue.name.clone(),
            team: queue.team.clone(),
            cohort,
            weight: queue.weight,
            nominal: queue.quota.as_array(),
            borrowing: queue.borrowing_limit.as_array(),
            lending: queue.lending_limit.as_array(),
        });
    }
    (infos, cohorts, by_name)
}

/// Where a trial stands.
#[derive(Debug, Clone)]
enum TrialState {
    /// In its queue's ordered set.
    Waiting,
    /// Put aside by an admin; not in the ordered set.
    Held,
    /// Holding resources, running or (with a deadline) being preempted.
    Placed(Placed),
}

#[derive(Debug, Clone)]
struct Placed {
    workers: Vec<WorkerPlacement>,
    started_at: UnixMillis,
    /// The pass that started it; it is not preempted in that same pass.
    started_pass: u64,
    /// Start plus time limit or estimate, when known.
    expected_end: Option<UnixMillis>,
    /// Set when it is asked to stop: when it will have been killed.
    preempt_deadline: Option<UnixMillis>,
    /// Nodes removed while it ran; what it held there is gone with them.
    lost_nodes: Vec<NodeId>,
}

impl Placed {
    fn end(&self) -> Option<UnixMillis> {
        match (self.expected_end, self.preempt_deadline) {
            (Some(expected), Some(deadline)) => Some(expected.min(deadline)),
            (expected, deadline) => expected.or(deadline),
        }
    }

    /// The workers whose resources the pool still holds.
    fn held_workers(&self) -> Vec<WorkerPlacement> {
        self.workers
            .iter()
            .filter(|worker| !self.lost_nodes.contains(&worker.node))
            .cloned()
            .collect()
    }
}

#[derive(Debug, Clone)]
struct Trial {
    request: TrialRequest,
    queue: usize,
    demand: Resources,
    state: TrialState,
    /// Why it waited when a pass last looked at it.
    reason: WaitReason,
    /// The pass that set `reason`.
    reason_pass: u64,
    /// The pass count when it last (re)entered the waiting line; until the next
    /// pass it is `NotYetConsidered`.
    entered_pass: u64,
    /// `could_ever_fit` and the node epoch it was computed at.
    fits_cache: Option<(u64, bool)>,
}

/// A preemption candidate: lowest priority first, then most recently started.
type VictimKey = (i64, Reverse<UnixMillis>, TrialId);

fn victim_key(id: TrialId, trial: &Trial, placed: &Placed) -> Option<VictimKey> {
    (trial.request.preemptible && placed.preempt_deadline.is_none()).then_some((
        trial.request.priority,
        Reverse(placed.started_at),
        id,
    ))
}

/// A trial that preempted others and waits for them to stop.
#[derive(Debug, Clone, PartialEq)]
struct Reservation {
    victims: Vec<TrialId>,
    queue: usize,
    demand: Resources,
}

#[derive(Debug, Clone, Default, PartialEq)]
struct QueueIndex {
    /// What its placed trials ask for (running and preempting).
    usage: Resources,
    /// What its trials waiting on preemption will take.
    reserved: Resources,
    /// What its placed trials that are being preempted hold (part of `usage`).
    stopping: Resources,
    /// Waiting trials by base priority, each set in FIFO order.
    waiting: BTreeMap<i64, BTreeSet<(UnixMillis, TrialId)>>,
    n_waiting: u64,
    n_held: u64,
    n_placed: u64,
    /// Its preemption candidates.
    victims: BTreeSet<VictimKey>,
}

/// Everything derived from the trial table, kept up to date by `insert` and
/// `remove` around every change and rebuilt from scratch by `check_invariants`.
#[derive(Debug, Clone, Default, PartialEq)]
struct Index {
    queues: Vec<QueueIndex>,
    /// Waiting and held trials per team, for admission.
    pending_by_team: BTreeMap<String, u64>,
    /// Placed trials per node they have workers on.
    node_trials: BTreeMap<NodeId, BTreeSet<TrialId>>,
    /// Placed trials with a known end, by that end.
    ends: BTreeSet<(UnixMillis, TrialId)>,
    /// Preemption candidates of every queue.
    victims: BTreeSet<VictimKey>,
    /// A multiset per resource of waiting trials' demands, for the smallest one.
    waiting_demand: [BTreeMap<u64, u64>; 3],
}

fn count_up<K: Ord>(map: &mut BTreeMap<K, u64>, key: K) {
    *map.entry(key).or_insert(0) += 1;
}

fn count_down<K: Ord>(map: &mut BTreeMap<K, u64>, key: K) {
    if let std::collections::btree_map::Entry::Occupied(mut entry) = map.entry(key) {
        *entry.get_mut() -= 1;
        if *entry.get() == 0 {
            entry.remove();
        }
    }
}

impl Index {
    fn new(n_queues: usize) -> Self {
        Self {
            queues: vec![QueueIndex::default(); n_queues],
            ..Self::default()
        }
    }

    fn rebuild(
        n_queues: usize,
        trials: &HashMap<TrialId, Trial>,
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

    fn insert(&mut self, id: TrialId, trial: &Trial) {
        let queue = &mut self.queues[trial.queue];
        match &trial.state {
            TrialState::Waiting => {
                queue
                    .waiting
                    .entry(trial.request.priority)
                    .or_default()
                    .insert((trial.request.submitted_at, id));
                queue.n_waiting += 1;
                count_up(&mut self.pending_by_team, trial.request.team.clone());
                for (resource, multiset) in self.waiting_demand.iter_mut().enumerate() {
                    count_up(multiset, trial.demand[resource]);
                }
            }
            TrialState::Held => {
                queue.n_held += 1;
                count_up(&mut self.pending_by_team, trial.request.team.clone());
            }
            TrialState::Placed(placed) => {
                queue.usage = plus(queue.usage, trial.demand);
                if placed.preempt_deadline.is_some() {
                    queue.stopping = plus(queue.stopping, trial.demand);
                }
                queue.n_placed += 1;
                if let Some(key) = victim_key(id, trial, placed) {
                    queue.victims.insert(key);
                    self.victims.insert(key);
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

    fn remove(&mut self, id: TrialId, trial: &Trial) {
        let queue = &mut self.queues[trial.queue];
        match &trial.state {
            TrialState::Waiting => {
                if let Some(set) = queue.waiting.get_mut(&trial.request.priority) {
                    set.remove(&(trial.request.submitted_at, id));
                    if set.is_empty() {
                        queue.waiting.remove(&trial.request.priority);
                    }
                }
                queue.n_waiting -= 1;
                count_down(&mut self.pending_by_team, trial.request.team.clone());
                for (resource, multiset) in self.waiting_demand.iter_mut().enumerate() {
                    count_down(multiset, trial.demand[resource]);
                }
            }
            TrialState::Held => {
                queue.n_held -= 1;
                count_down(&mut self.pending_by_team, trial.request.team.clone());
            }
            TrialState::Placed(placed) => {
                queue.usage = minus(queue.usage, trial.demand);
                if placed.preempt_deadline.is_some() {
                    queue.stopping = minus(queue.stopping, trial.demand);
                }
                queue.n_placed -= 1;
                if let Some(key) = victim_key(id, trial, placed) {
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

    fn reserve(&mut self, reservation: &Reservation) {
        let queue = &mut self.queues[reservation.queue];
        queue.reserved = plus(queue.reserved, reservation.demand);
    }

    fn unreserve(&mut self, reservation: &Reservation) {
        let queue = &mut self.queues[reservation.queue];
        queue.reserved = minus(queue.reserved, reservation.demand);
    }

    /// The smallest waiting demand per resource (each resource on its own).
    fn min_waiting_demand(&self) -> Resources {
        self.waiting_demand
            .each_ref()
            .map(|multiset| multiset.keys().next().copied().unwrap_or(u64::MAX))
    }
}

/// Mean run time of an experiment's completed trials.
#[derive(Debug, Clone, Copy, Default)]
struct Estimate {
    total_ms: u128,
    count: u64,
}

impl Estimate {
    fn mean_ms(self) -> Option<u64> {
        if self.count == 0 {
            return None;
        }
        let mean = self.total_ms.div_ceil(u128::from(self.count));
        Some(u64::try_from(mean).unwrap_or(u64::MAX))
    }
}

/// Which constraint of the quota model stops a trial.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum QuotaBlock {
    /// Its own queue's limit (quota, plus borrowing limit in a cohort).
    Own(usize),
    /// Its cohort's pool of lendable quota.
    Pool(usize),
}

impl QuotaBlock {
    fn resource(self) -> usize {
        match self {
            Self::Own(resource) | Self::Pool(resource) => resource,
        }
    }
}

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
}

/// An ordered walk over waiting trials: a k-way merge of per-(queue, priority)
/// FIFO sets by the current key of each set's head.
#[derive(Debug)]
struct Lane {
    queues: Vec<usize>,
    heap: BinaryHeap<Reverse<LaneEntry>>,
}

/// Effective priority (highest first), then FIFO order.
type OrderKey = (Reverse<i64>, UnixMillis, TrialId);

#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
struct LaneEntry {
    /// Where the trial goes in its lane (effective priority is zero under FIFO).
    key: OrderKey,
    queue: usize,
    priority: i64,
}

/// Scratch state of one pass.
#[derive(Debug)]
struct Pass {
    now: UnixMillis,
    capacity: Resources,
    /// Free room on schedulable nodes, less what this pass placed.
    free: Resources,
    /// The smallest waiting demand per resource at the start of the pass.
    min_waiting: Resources,
    /// Usage plus reservations per queue: what quota checks of new work see.
    usage_view: Vec<Resources>,
    /// Usage per queue when the pass began. Reclaim takes only from queues that
    /// were borrowing before the pass: borrowing that this very pass started is
    /// not undone by stopping older work.
    start_usage: Vec<Resources>,
    /// Queues whose remaining trials are not looked at in this pass.
    stopped: Vec<bool>,
    /// Queues whose first trial without room has been dealt with.
    blocked_seen: Vec<bool>,
    /// The earliest backfill reservation and its holder.
    backfill_limit: Option<(UnixMillis, TrialId)>,
    backfill_reservations: usize,
    /// Placements planned for trials waiting on preemption.
    plans: Vec<Plan>,
    /// The plans touching each node, as indexes into `plans`.
    plan_nodes: HashMap<NodeId, Vec<usize>>,
    failed_shapes: Vec<GangShape>,
    examined: usize,
    preemption_attempts: usize,
}

impl Pass {
    fn nothing_fits(&self) -> bool {
        (0..3).any(|r| self.free[r] < self.min_waiting[r])
    }

    /// Whether a gang at least as large, with the same constraints, did not fit.
    fn shape_failed(&self, gang: &GangShape) -> bool {
        self.failed_shapes.iter().any(|failed| {
            failed.spread == gang.spread
                && failed.gpu_models == gang.gpu_models
                && failed.node_labels == gang.node_labels
                && gang.workers >= failed.workers
                && covers(resources(&gang.per_worker), resources(&failed.per_worker))
        })
    }

    fn record_failed_shape(&mut self, gang: &GangShape) {
        if self.failed_shapes.len() < MAX_FAILED_SHAPES {
            self.failed_shapes.push(gang.clone());
        }
    }

    fn add_plan(&mut self, holder: TrialId, workers: Vec<WorkerPlacement>, victims: Vec<TrialId>) {
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

/// Where a trial waiting on preemption will go once its victims have stopped.
#[derive(Debug)]
struct Plan {
    holder: TrialId,
    workers: Vec<WorkerPlacement>,
    /// Its victims still stopping.
    victims: Vec<TrialId>,
}

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
    trials: HashMap<TrialId, Trial>,
    index: Index,
    /// Trials that preempted others, by preemptor.
    reservations: BTreeMap<TrialId, Reservation>,
    estimates: HashMap<ExperimentId, Estimate>,
    /// Per queue, the reason of trials the last pass did not reach.
    unexamined: Vec<WaitReason>,
    /// Passes run so far.
    pass: u64,
    /// Set when a new policy left running work above its quotas.
    quota_relaxed: bool,
}

impl PolicyCore {
    /// A core with no nodes and no trials. The policy should have passed
    /// [`PolicyConfig::validate`] (parsed files and presets have).
    pub fn new(config: PolicyConfig) -> Self {
        let (queue_info, cohorts, queue_by_name) = build_queues(&config);
        let n_queues = queue_info.len();
        Self {
            config,
            queue_info,
            queue_by_name,
            cohorts,
            pool: NodePool::new(),
            node_epoch: 0,
            trials: HashMap::new(),
            index: Index::new(n_queues),
            reservations: BTreeMap::new(),
            estimates: HashMap::new(),
            unexamined: vec![WaitReason::NotYetConsidered; n_queues],
            pass: 0,
            quota_relaxed: false,
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
        self.reservations.clear();
        let n_queues = self.queue_info.len();
        self.index = Index::rebuild(n_queues, &self.trials, &self.reservations);
        self.unexamined = vec![WaitReason::NotYetConsidered; n_queues];
        self.quota_relaxed = self.quota_report().is_some();
        Ok(())
    }

    /// Adds or updates a node.
    pub fn upsert_node(&mut self, spec: NodeSpec) {
        self.pool.upsert_node(spec);
        self.node_epoch += 1;
    }

    /// Stops or resumes giving a node work (draining, lost).
    pub fn set_node_schedulable(&mut self, id: NodeId, schedulable: bool) {
        self.pool.set_schedulable(id, schedulable);
        self.node_epoch += 1;
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
                if let Some(TrialState::Placed(placed)) =
                    self.trials.get_mut(trial_id).map(|trial| &mut trial.state)
                    && !placed.lost_nodes.contains(&id)
                {
                    placed.lost_nodes.push(id);
                }
            }
        }
        self.node_epoch += 1;
        affected
    }

    /// Queues a trial, or refuses it: a duplicate id, an invalid gang, a queue that
    /// does not exist or does not take the team, or a team with too many pending.
    pub fn submit(&mut self, request: TrialRequest, now: UnixMillis) -> Result<(), Refusal> {
        let _ = now;
        if self.trials.contains_key(&request.id) {
            return Err(Refusal::Duplicate(request.id));
        }
        check_gang(&request.gang)?;
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
        let trial = self.waiting_entry(request, queue);
        self.index.insert(id, &trial);
        self.trials.insert(id, trial);
        Ok(())
    }

    /// A new waiting entry for `request` in `queue`.
    fn waiting_entry(&self, request: TrialRequest, queue: usize) -> Trial {
        Trial {
            demand: gang_demand(&request.gang),
            request,
            queue,
            state: TrialState::Waiting,
            reason: WaitReason::NotYetConsidered,
            reason_pass: 0,
            entered_pass: self.pass,
            fits_cache: None,
        }
    }

    /// A placed trial goes back to its queue, releasing what it held; it keeps
    /// its `submitted_at`, so it keeps its place. False if it is not placed.
    pub fn requeue(&mut self, trial: TrialId, now: UnixMillis) -> bool {
        let _ = now;
        let Some(entry) = self.trials.get_mut(&trial) else {
            return false;
        };
        if !matches!(entry.state, TrialState::Placed(_)) {
            return false;
        }
        self.index.remove(trial, entry);
        if let TrialState::Placed(placed) = std::mem::replace(&mut entry.state, TrialState::Waiting)
        {
            self.pool.release(&placed.held_workers());
        }
        entry.entered_pass = self.pass;
        self.index.insert(trial, entry);
        true
    }

    /// A trial is done; releases what it held and forgets it. When it
    /// `completed`, its run time feeds its experiment's duration estimate.
    pub fn finish(&mut self, trial: TrialId, now: UnixMillis, completed: bool) -> bool {
        let Some(entry) = self.trials.remove(&trial) else {
            return false;
        };
        self.index.remove(trial, &entry);
        self.drop_reservation(trial, None);
        if let TrialState::Placed(placed) = entry.state {
            self.pool.release(&placed.held_workers());
            if completed {
                let estimate = self.estimates.entry(trial.experiment).or_default();
                estimate.total_ms += u128::from(now.saturating_sub(placed.started_at));
                estimate.count += 1;
            }
        }
        true
    }

    /// Holds a waiting trial. False if it is not waiting.
    pub fn hold(&mut self, trial: TrialId) -> bool {
        if !self
            .trials
            .get(&trial)
            .is_some_and(|entry| matches!(entry.state, TrialState::Waiting))
        {
            return false;
        }
        self.drop_reservation(trial, None);
        self.change(trial, |entry| entry.state = TrialState::Held);
        true
    }

    /// Releases a held trial. False if it is not held.
    pub fn release_hold(&mut self, trial: TrialId) -> bool {
        let pass = self.pass;
        self.change(trial, |entry| {
            if !matches!(entry.state, TrialState::Held) {
                return false;
            }
            entry.state = TrialState::Waiting;
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
            if matches!(entry.state, TrialState::Waiting) {
                entry.entered_pass = pass;
            }
        })
        .is_some()
    }

    /// Moves a waiting or held trial to another queue of its team (or an open
    /// one). A placed trial cannot move: its usage is accounted to its queue.
    pub fn move_to_queue(&mut self, trial: TrialId, queue: &str) -> Result<(), Refusal> {
        let Some(entry) = self.trials.get(&trial) else {
            return Err(Refusal::Invalid(format!("trial {trial} is not scheduled")));
        };
        if matches!(entry.state, TrialState::Placed(_)) {
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
        self.pass += 1;
        let n_queues = self.queue_info.len();
        let mut pass = Pass {
            now,
            capacity: resources(&self.pool.capacity()),
            free: resources(&self.pool.free()),
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
            examined: 0,
            preemption_attempts: 0,
        };
        for reason in &mut self.unexamined {
            *reason = WaitReason::BehindHigherPriority;
        }
        let mut decisions = Vec::new();
        self.serve_reservations(&mut pass, &mut decisions);
        self.run_lanes(&mut pass, &mut decisions);
        if self.quota_relaxed && self.quota_report().is_none() {
            self.quota_relaxed = false;
        }
        decisions
    }

    /// Why a waiting or held trial waits; `None` for placed or unknown trials.
    pub fn wait_reason(&self, trial: TrialId) -> Option<WaitReason> {
        let entry = self.trials.get(&trial)?;
        match entry.state {
            TrialState::Placed(_) => None,
            TrialState::Held => Some(WaitReason::Held),
            TrialState::Waiting => Some(if self.reservations.contains_key(&trial) {
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

    /// Every queue's standing, in declaration order. An unlimited quota shows as
    /// `u64::MAX`, and a queue open to every team has team `*`. `lent` attributes
    /// the cohort's borrowed amount to the lenders' idle lendable quota in
    /// declaration order.
    pub fn queues(&self) -> Vec<QueueUsage> {
        let capacity = resources(&self.pool.capacity());
        let mut lent = vec![[0_u64; 3]; self.queue_info.len()];
        for cohort in &self.cohorts {
            for (resource, _) in RESOURCE_NAMES.iter().enumerate() {
                let mut borrowed: u64 = cohort
                    .members
                    .iter()
                    .filter_map(|&member| {
                        let nominal = self.queue_info[member].nominal[resource]?;
                        Some(self.index.queues[member].usage[resource].saturating_sub(nominal))
                    })
                    .sum();
                for &member in &cohort.members {
                    let info = &self.queue_info[member];
                    let (Some(nominal), Some((lend, _))) =
                        (info.nominal[resource], info.lend_and_keep(resource))
                    else {
                        continue;
                    };
                    let idle = nominal.saturating_sub(self.index.queues[member].usage[resource]);
                    let taken = idle.min(lend).min(borrowed);
                    lent[member][resource] = taken;
                    borrowed -= taken;
                }
            }
        }
        self.queue_info
            .iter()
            .enumerate()
            .map(|(index, info)| {
                let queue = &self.index.queues[index];
                let quota = info.nominal.map(|nominal| nominal.unwrap_or(u64::MAX));
                let borrowed: Resources = std::array::from_fn(|r| {
                    info.nominal[r].map_or(0, |nominal| queue.usage[r].saturating_sub(nominal))
                });
                QueueUsage {
                    name: info.name.clone(),
                    team: info.team.clone().unwrap_or_else(|| "*".to_owned()),
                    cohort: info.cohort.map(|cohort| self.cohorts[cohort].name.clone()),
                    weight: info.weight,
                    usage: amount(queue.usage),
                    quota: amount(quota),
                    borrowed: amount(borrowed),
                    lent: amount(lent[index]),
                    pending: queue.n_waiting + queue.n_held,
                    running: queue.n_placed,
                    dominant_share: dominant_share(queue.usage, capacity, info.weight),
                }
            })
            .collect()
    }

    /// Where a placed trial's workers are.
    pub fn placement(&self, trial: TrialId) -> Option<&[WorkerPlacement]> {
        match &self.trials.get(&trial)?.state {
            TrialState::Placed(placed) => Some(&placed.workers),
            TrialState::Waiting | TrialState::Held => None,
        }
    }

    /// The node pool.
    pub fn pool(&self) -> &NodePool {
        &self.pool
    }

    /// Whether a placed trial has been asked to stop and not yet reported back.
    pub fn is_preempting(&self, trial: TrialId) -> bool {
        matches!(
            self.trials.get(&trial).map(|entry| &entry.state),
            Some(TrialState::Placed(placed)) if placed.preempt_deadline.is_some()
        )
    }

    /// The trials waiting (not held), in no particular order.
    pub fn waiting_trials(&self) -> impl Iterator<Item = TrialId> + '_ {
        self.trials
            .iter()
            .filter(|(_, entry)| matches!(entry.state, TrialState::Waiting))
            .map(|(id, _)| *id)
    }

    /// The expected run time of a trial of `experiment` with no time limit: the
    /// mean run time of its completed trials.
    pub fn estimate_ms(&self, experiment: ExperimentId) -> Option<u64> {
        self.estimates
            .get(&experiment)
            .and_then(|estimate| estimate.mean_ms())
    }

    /// Recomputes everything derived from scratch and checks it: indexes and
    /// usage, the pool's allocations node by node, gangs placed whole, quota and
    /// borrowing and lending limits, reservations. For tests and the simulator's
    /// debug mode.
    pub fn check_invariants(&self) -> Result<(), String> {
        let rebuilt = Index::rebuild(self.queue_info.len(), &self.trials, &self.reservations);
        if rebuilt != self.index {
            return Err(describe_index_difference(&rebuilt, &self.index));
        }
        for (id, trial) in &self.trials {
            let info = self
                .queue_info
                .get(trial.queue)
                .ok_or_else(|| format!("trial {id} is in a queue that does not exist"))?;
            if !info.accepts(&trial.request.team) {
                return Err(format!(
                    "trial {id} of team {} is in queue {}, which does not take it",
                    trial.request.team, info.name
                ));
            }
            if trial.demand != gang_demand(&trial.request.gang) {
                return Err(format!("trial {id} has a stale demand"));
            }
            if let TrialState::Placed(placed) = &trial.state {
                if placed.workers.len() != trial.request.gang.workers as usize {
                    return Err(format!(
                        "trial {id} holds {} workers of a gang of {}",
                        placed.workers.len(),
                        trial.request.gang.workers
                    ));
                }
                if self.reservations.contains_key(id) {
                    return Err(format!("placed trial {id} still has a reservation"));
                }
            }
        }
        for (id, reservation) in &self.reservations {
            let trial = self
                .trials
                .get(id)
                .ok_or_else(|| format!("reservation of unknown trial {id}"))?;
            if !matches!(trial.state, TrialState::Waiting) {
                return Err(format!("reservation of trial {id}, which is not waiting"));
            }
            if reservation.queue != trial.queue || reservation.demand != trial.demand {
                return Err(format!("reservation of trial {id} is stale"));
            }
        }
        self.check_pool()?;
        if !self.quota_relaxed
            && let Some(problem) = self.quota_report()
        {
            return Err(problem);
        }
        Ok(())
    }
}

// Admission and bookkeeping.
impl PolicyCore {
    fn resolve_queue(&self, team: &str, queue: Option<&str>) -> Result<usize, Refusal> {
        let unknown = |name: &str| Refusal::UnknownQueue {
            team: team.to_owned(),
            queue: name.to_owned(),
        };
        match queue {
            Some(name) => self
                .queue_by_name
                .get(name)
                .copied()
                .filter(|&index| self.queue_info[index].accepts(team))
                .ok_or_else(|| unknown(name)),
            None => self
                .config
                .default_queue_for(team)
                .and_then(|queue| self.queue_by_name.get(&queue.name).copied())
                .ok_or_else(|| unknown("default")),
        }
    }

    /// Changes a trial with its index entries kept in step.
    fn change<R>(&mut self, id: TrialId, change: impl FnOnce(&mut Trial) -> R) -> Option<R> {
        let trial = self.trials.get_mut(&id)?;
        self.index.remove(id, trial);
        let result = change(trial);
        self.index.insert(id, trial);
        Some(result)
    }

    fn drop_reservation(&mut self, id: TrialId, pass: Option<&mut Pass>) {
        if let Some(reservation) = self.reservations.remove(&id) {
            self.index.unreserve(&reservation);
            if let Some(pass) = pass {
                pass.usage_view[reservation.queue] =
                    minus(pass.usage_view[reservation.queue], reservation.demand);
            }
        }
    }

    fn set_reason(&mut self, id: TrialId, reason: WaitReason) {
        if let Some(trial) = self.trials.get_mut(&id) {
            trial.reason = reason;
            trial.reason_pass = self.pass;
        }
    }

    /// A trial's time limit, else its experiment's estimate.
    fn duration(&self, trial: &Trial) -> Option<u64> {
        trial
            .request
            .time_limit_ms
            .or_else(|| self.estimate_ms(trial.request.id.experiment))
    }

    fn strategy(&self, id: TrialId) -> Strategy {
        // The pool mixes this seed with its own change counter, so one seed per
        // trial is enough for varied yet replayable random placements.
        let seed = id.experiment.digest ^ u64::from(id.index).rotate_left(32);
        self.config.placement.strategy(seed)
    }

    fn ever_fits(&mut self, id: TrialId) -> bool {
        let epoch = self.node_epoch;
        let Some(trial) = self.trials.get_mut(&id) else {
            return false;
        };
        if let Some((cached_epoch, fits)) = trial.fits_cache
            && cached_epoch == epoch
        {
            return fits;
        }
        let fits = self.pool.could_ever_fit(&trial.request.gang);
        trial.fits_cache = Some((epoch, fits));
        fits
    }

    /// The first quota constraint that adding `demand` to `queue` breaks, with
    /// `usage` per queue. Resources the trial does not ask for are not checked,
    /// so work over a smaller new quota does not block work that adds nothing.
    fn quota_block(
        &self,
        queue: usize,
        demand: &Resources,
        usage: &[Resources],
    ) -> Option<QuotaBlock> {
        let info = &self.queue_info[queue];
        for resource in 0..3 {
            if demand[resource] == 0 {
                continue;
            }
            let Some(nominal) = info.nominal[resource] else {
                continue;
            };
            let new_usage = usage[queue][resource].saturating_add(demand[resource]);
            let Some(cohort) = info.cohort else {
                if new_usage > nominal {
                    return Some(QuotaBlock::Own(resource));
                }
                continue;
            };
            let cap =
                info.borrowing[resource].map_or(u64::MAX, |limit| nominal.saturating_add(limit));
            if new_usage > cap {
                return Some(QuotaBlock::Own(resource));
            }
            let (_, keep) = info.lend_and_keep(resource).expect("the quota is finite");
            if new_usage <= keep {
                continue;
            }
            let (pool_used, pool_size) = self.cohort_pool(cohort, resource, |member| {
                if member == queue {
                    new_usage
                } else {
                    usage[member][resource]
                }
            });
            if pool_used > pool_size {
                return Some(QuotaBlock::Pool(resource));
            }
        }
        None
    }

    /// What a cohort's queues use of its pool of lendable quota, and its size.
    fn cohort_pool(
        &self,
        cohort: usize,
        resource: usize,
        usage_of: impl Fn(usize) -> u64,
    ) -> (u64, u64) {
        let mut used: u64 = 0;
        let mut size: u64 = 0;
        for &member in &self.cohorts[cohort].members {
            let Some((lend, keep)) = self.queue_info[member].lend_and_keep(resource) else {
                continue;
            };
            used = used.saturating_add(usage_of(member).saturating_sub(keep));
            size = size.saturating_add(lend);
        }
        (used, size)
    }

    /// The first broken quota limit with the current usage, described.
    fn quota_report(&self) -> Option<String> {
        for (index, info) in self.queue_info.iter().enumerate() {
            let usage = self.index.queues[index].usage;
            for (resource, name) in RESOURCE_NAMES.iter().enumerate() {
                let Some(nominal) = info.nominal[resource] else {
                    continue;
                };
                let cap = match info.cohort {
                    None => nominal,
                    Some(_) => info.borrowing[resource]
                        .map_or(u64::MAX, |limit| nominal.saturating_add(limit)),
                };
                if usage[resource] > cap {
                    return Some(format!(
                        "queue {} uses {} {name}, above its limit {cap}",
                        info.name, usage[resource]
                    ));
                }
            }
        }
        for (cohort_index, cohort) in self.cohorts.iter().enumerate() {
            for (resource, name) in RESOURCE_NAMES.iter().enumerate() {
                let (used, size) = self.cohort_pool(cohort_index, resource, |member| {
                    self.index.queues[member].usage[resource]
                });
                if used > size {
                    let names: Vec<&str> = cohort
                        .members
                        .iter()
                        .map(|&member| self.queue_info[member].name.as_str())
                        .collect();
                    return Some(format!(
                        "cohort of {names:?} borrows {used} {name} of a lendable {size}"
                    ));
                }
            }
        }
        None
    }

    /// Compares the pool's allocations, node by node, with what placed trials hold.
    fn check_pool(&self) -> Result<(), String> {
        struct Held {
            gpus: BTreeMap<u32, u64>,
            cpu_milli: u64,
            memory_bytes: u64,
        }
        let mut held: BTreeMap<NodeId, Held> = BTreeMap::new();
        for (id, trial) in &self.trials {
            let TrialState::Placed(placed) = &trial.state else {
                continue;
            };
            for worker in placed.held_workers() {
                if self.pool.node_free(worker.node).is_none() {
                    return Err(format!(
                        "trial {id} holds resources on unknown node {}",
                        worker.node
                    ));
                }
                let entry = held.entry(worker.node).or_insert(Held {
                    gpus: BTreeMap::new(),
                    cpu_milli: 0,
                    memory_bytes: 0,
                });
                for share in &worker.gpus {
                    *entry.gpus.entry(share.index).or_insert(0) += u64::from(share.milli);
                }
                entry.cpu_milli += worker.cpu_milli;
                entry.memory_bytes += worker.memory_bytes;
            }
        }
        for (spec, _) in self.pool.nodes() {
            let node = spec.id;
            let used = self.pool.node_gpu_used(node).unwrap_or(&[]);
            let free = self.pool.node_free(node).unwrap_or_default();
            let expected = held.get(&node);
            for (index, used_milli) in used.iter().enumerate() {
                let want = expected
                    .and_then(|held| held.gpus.get(&(index as u32)).copied())
                    .unwrap_or(0);
                if u64::from(*used_milli) != want {
                    return Err(format!(
                        "node {node} GPU {index}: pool holds {used_milli} thousandths, trials hold {want}"
                    ));
                }
                if *used_milli > GPU_MILLI as u32 {
                    return Err(format!("node {node} GPU {index} is over-allocated"));
                }
            }
            let cpu = expected.map_or(0, |held| held.cpu_milli);
            let memory = expected.map_or(0, |held| held.memory_bytes);
            if cpu > spec.cpu_milli || memory > spec.memory_bytes {
                return Err(format!("node {node} is over-allocated"));
            }
            if free.cpu_milli != spec.cpu_milli - cpu
                || free.memory_bytes != spec.memory_bytes - memory
            {
                return Err(format!(
                    "node {node}: pool has {} CPU and {} memory free, trials leave {} and {}",
                    free.cpu_milli,
                    free.memory_bytes,
                    spec.cpu_milli - cpu,
                    spec.memory_bytes - memory
                ));
            }
        }
        Ok(())
    }
}

// The pass.
impl PolicyCore {
    /// Serves trials waiting on their victims, highest effective priority first.
    fn serve_reservations(&mut self, pass: &mut Pass, decisions: &mut Vec<Decision>) {
        let mut order: Vec<(OrderKey, TrialId)> = self
            .reservations
            .keys()
            .filter_map(|id| {
                let trial = self.trials.get(id)?;
                let effective = self.effective_priority(&trial.request, pass.now);
                Some(((Reverse(effective), trial.request.submitted_at, *id), *id))
            })
            .collect();
        order.sort_unstable();
        for (_, id) in order {
            let Some(reservation) = self.reservations.get(&id).cloned() else {
                continue;
            };
            let Some(trial) = self.trials.get(&id) else {
                self.drop_reservation(id, Some(pass));
                continue;
            };
            let queue = reservation.queue;
            let strategy = self.strategy(id);
            // Starting now needs the quota as it is now, victims still counted.
            let mut view = pass.usage_view.clone();
            view[queue] = minus(view[queue], reservation.demand);
            if self.quota_block(queue, &trial.demand, &view).is_none()
                && let Some(workers) = self.pool.find(&trial.request.gang, strategy)
                && self.plan_conflict(pass, &workers, &[]).is_none()
            {
                self.drop_reservation(id, Some(pass));
                decisions.push(self.start(id, workers, pass));
                continue;
            }
            let remaining: Vec<(TrialId, &[WorkerPlacement])> = reservation
                .victims
                .iter()
                .filter_map(|victim| match &self.trials.get(victim)?.state {
                    TrialState::Placed(placed) if placed.preempt_deadline.is_some() => {
                        Some((*victim, placed.workers.as_slice()))
                    }
                    _ => None,
                })
                .collect();
            let mut plan = None;
            if !remaining.is_empty() {
                // Once every stopping trial is gone, and reservations take over.
                let mut future = self.future_view(pass);
                future[queue] = minus(future[queue], reservation.demand);
                let freed: Vec<&[WorkerPlacement]> =
                    remaining.iter().map(|(_, workers)| *workers).collect();
                if self.quota_block(queue, &trial.demand, &future).is_none() {
                    plan = self
                        .pool
                        .find_with_freed(&trial.request.gang, strategy, &freed)
                        .filter(|plan| self.plan_conflict(pass, plan, &freed).is_none());
                }
            }
            match plan {
                Some(plan) => {
                    let victims = remaining.iter().map(|(victim, _)| *victim).collect();
                    pass.add_plan(id, plan, victims);
                    self.set_reason(id, WaitReason::WaitingForPreemption);
                }
                // The victims are gone or no longer enough: back to the line.
                None => self.drop_reservation(id, Some(pass)),
            }
        }
    }

    fn run_lanes(&mut self, pass: &mut Pass, decisions: &mut Vec<Decision>) {
        let n_queues = self.queue_info.len();
        let mut lanes: Vec<Lane> = match self.config.order {
            Order::Fair => (0..n_queues)
                .map(|queue| self.lane(vec![queue], pass.now))
                .collect(),
            Order::Fifo | Order::Priority => vec![self.lane((0..n_queues).collect(), pass.now)],
        };
        let mut active = vec![true; lanes.len()];
        let strict = self.config.head_of_line == HeadOfLine::Strict;
        let backfill = self.config.backfill;
        while let Some(lane) = self.pick_lane(&lanes, &active, pass.capacity) {
            if pass.examined >= MAX_EXAMINED_PER_PASS {
                for lane in &lanes {
                    self.stop_queues(&lane.queues, pass, &WaitReason::BehindHigherPriority);
                }
                break;
            }
            // Under a reservation a trial can only start by backfilling; when no
            // trial can (the reservation is due, or nothing waiting fits the free
            // room), the rest of the pass would refuse every trial one by one.
            if let Some((limit, holder)) = pass.backfill_limit
                && (limit <= pass.now || pass.nothing_fits())
            {
                let reason = WaitReason::ReservedFor { trial: holder };
                for lane in &lanes {
                    self.stop_queues(&lane.queues, pass, &reason);
                }
                break;
            }
            let Some((id, queue)) = self.pop(&mut lanes[lane], pass) else {
                active[lane] = false;
                continue;
            };
            let outcome = self.evaluate(id, queue, pass, decisions);
            // Starts are not limited: the budget bounds the work spent on trials
            // that stay waiting.
            if outcome != Outcome::Started {
                pass.examined += 1;
            }
            match outcome {
                Outcome::Started | Outcome::Passed | Outcome::NeverFits => {}
                Outcome::OverQuota(block) => {
                    if self.try_preempt(id, queue, Some(block), pass, decisions) {
                        continue;
                    }
                    if strict || backfill {
                        // Only this queue: its own quota holds it, not the nodes.
                        self.stop_queues(&[queue], pass, &WaitReason::BehindHigherPriority);
                        if self.config.order == Order::Fair {
                            active[lane] = false;
                        }
                    }
                }
                Outcome::NoRoom => {
                    if self.try_preempt(id, queue, None, pass, decisions) {
                        continue;
                    }
                    let nothing_fits = pass.nothing_fits();
                    if backfill {
                        if !nothing_fits
                            && !pass.blocked_seen[queue]
                            && pass.backfill_reservations < MAX_BACKFILL_RESERVATIONS_PER_PASS
                        {
                            pass.backfill_reservations += 1;
                            let start = self.reservation_time(id, pass).unwrap_or(pass.now);
                            if pass.backfill_limit.is_none_or(|(limit, _)| start < limit) {
                                pass.backfill_limit = Some((start, id));
                            }
                        }
                        pass.blocked_seen[queue] = true;
                    } else if strict {
                        let queues = lanes[lane].queues.clone();
                        self.stop_queues(&queues, pass, &WaitReason::BehindHigherPriority);
                        active[lane] = false;
                        continue;
                    }
                    if nothing_fits {
                        // Nothing behind it could start either.
                        let queues = lanes[lane].queues.clone();
                        self.stop_queues(&queues, pass, &WaitReason::GangDoesNotFit);
                        active[lane] = false;
                    }
                }
            }
        }
    }

    fn stop_queues(&mut self, queues: &[usize], pass: &mut Pass, reason: &WaitReason) {
        for &queue in queues {
            if !pass.stopped[queue] {
                pass.stopped[queue] = true;
                self.unexamined[queue] = reason.clone();
            }
        }
    }

    fn effective_priority(&self, request: &TrialRequest, now: UnixMillis) -> i64 {
        let boost = self.config.aging.map_or(0, |aging| {
            aging.boost(now.saturating_sub(request.submitted_at))
        });
        request.priority.saturating_add(boost)
    }

    fn lane_entry(
        &self,
        queue: usize,
        priority: i64,
        submitted_at: UnixMillis,
        id: TrialId,
        now: UnixMillis,
    ) -> LaneEntry {
        let effective = match self.config.order {
            Order::Fifo => 0,
            Order::Priority | Order::Fair => {
                let boost = self
                    .config
                    .aging
                    .map_or(0, |aging| aging.boost(now.saturating_sub(submitted_at)));
                priority.saturating_add(boost)
            }
        };
        LaneEntry {
            key: (Reverse(effective), submitted_at, id),
            queue,
            priority,
        }
    }

    fn lane(&self, queues: Vec<usize>, now: UnixMillis) -> Lane {
        let mut heap = BinaryHeap::new();
        for &queue in &queues {
            for (&priority, set) in &self.index.queues[queue].waiting {
                if let Some(&(submitted_at, id)) = set.first() {
                    heap.push(Reverse(self.lane_entry(
                        queue,
                        priority,
                        submitted_at,
                        id,
                        now,
                    )));
                }
            }
        }
        Lane { queues, heap }
    }

    fn pop(&self, lane: &mut Lane, pass: &Pass) -> Option<(TrialId, usize)> {
        while let Some(Reverse(entry)) = lane.heap.pop() {
            if pass.stopped[entry.queue] {
                continue;
            }
            let (_, submitted_at, id) = entry.key;
            let next = self.index.queues[entry.queue]
                .waiting
                .get(&entry.priority)
                .and_then(|set| {
                    set.range((Bound::Excluded((submitted_at, id)), Bound::Unbounded))
                        .next()
                        .copied()
                });
            if let Some((next_submitted_at, next_id)) = next {
                lane.heap.push(Reverse(self.lane_entry(
                    entry.queue,
                    entry.priority,
                    next_submitted_at,
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
    fn pick_lane(&self, lanes: &[Lane], active: &[bool], capacity: Resources) -> Option<usize> {
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

    fn evaluate(
        &mut self,
        id: TrialId,
        queue: usize,
        pass: &mut Pass,
        decisions: &mut Vec<Decision>,
    ) -> Outcome {
        let Some(trial) = self.trials.get(&id) else {
            return Outcome::Passed;
        };
        if !matches!(trial.state, TrialState::Waiting) || self.reservations.contains_key(&id) {
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
        if !self.ever_fits(id) {
            self.set_reason(id, WaitReason::NoMatchingNodes);
            return Outcome::NeverFits;
        }
        let gang = &self.trials[&id].request.gang;
        if !covers(pass.free, demand) || pass.shape_failed(gang) {
            self.set_reason(id, WaitReason::GangDoesNotFit);
            return Outcome::NoRoom;
        }
        let Some(workers) = self.pool.find(gang, self.strategy(id)) else {
            let gang = gang.clone();
            pass.record_failed_shape(&gang);
            self.set_reason(id, WaitReason::GangDoesNotFit);
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
    fn start(&mut self, id: TrialId, workers: Vec<WorkerPlacement>, pass: &mut Pass) -> Decision {
        self.pool
            .allocate(&workers)
            .expect("a placement the pool has just found is one it accepts");
        let now = pass.now;
        let started_pass = self.pass;
        let duration = self.trials.get(&id).and_then(|trial| self.duration(trial));
        let placed_workers = workers.clone();
        let queue_and_demand = self.change(id, |trial| {
            trial.state = TrialState::Placed(Placed {
                workers: placed_workers,
                started_at: now,
                started_pass,
                expected_end: duration.map(|duration| now.saturating_add(duration)),
                preempt_deadline: None,
                lost_nodes: Vec::new(),
            });
            (trial.queue, trial.demand)
        });
        if let Some((queue, demand)) = queue_and_demand {
            pass.usage_view[queue] = plus(pass.usage_view[queue], demand);
        }
        pass.free = minus(pass.free, placement_total(&workers));
        Decision::Place { trial: id, workers }
    }

    /// The earliest time the trial's gang is expected to fit, releasing running
    /// work in order of expected end; `None` when it never fits that way.
    fn reservation_time(&self, id: TrialId, pass: &Pass) -> Option<UnixMillis> {
        let trial = self.trials.get(&id)?;
        let gang = &trial.request.gang;
        let strategy = self.strategy(id);
        let fits = |freed: &[&[WorkerPlacement]]| {
            self.pool.find_with_freed(gang, strategy, freed).is_some()
        };
        let mut freed: Vec<&[WorkerPlacement]> = Vec::new();
        let mut ends: Vec<UnixMillis> = Vec::new();
        let mut total = pass.free;
        let mut checks = 0;
        // A prefix length known not to fit, the next to try, and the step to it.
        let mut failed = 0;
        let mut next_check = None;
        let mut step = 1;
        for &(end, running) in &self.index.ends {
            let Some(TrialState::Placed(placed)) =
                self.trials.get(&running).map(|trial| &trial.state)
            else {
                continue;
            };
            freed.push(&placed.workers);
            ends.push(end);
            total = plus(total, placement_total(&placed.workers));
            if !covers(total, trial.demand) {
                continue;
            }
            let count = freed.len();
            if next_check.is_some_and(|next| count < next) {
                continue;
            }
            if checks >= MAX_PLACEMENT_CHECKS {
                return None;
            }
            checks += 1;
            if fits(&freed) {
                // The smallest prefix that fits lies in (failed, count].
                let (mut low, mut high) = (failed, count);
                while high - low > 1 && checks < MAX_PLACEMENT_CHECKS {
                    let middle = low + (high - low) / 2;
                    checks += 1;
                    if fits(&freed[..middle]) {
                        high = middle;
                    } else {
                        low = middle;
                    }
                }
                return Some(ends[high - 1].max(pass.now));
            }
            failed = count;
            next_check = Some(count + step);
            step *= 2;
        }
        None
    }

    /// Looks for victims whose stopping lets `id` start; on success asks them to
    /// stop and gives `id` a reservation. `block` is the quota constraint that
    /// stopped it, `None` when nodes did.
    fn try_preempt(
        &mut self,
        id: TrialId,
        queue: usize,
        block: Option<QuotaBlock>,
        pass: &mut Pass,
        decisions: &mut Vec<Decision>,
    ) -> bool {
        if !self.config.preemption.enabled
            || pass.preemption_attempts >= MAX_PREEMPTION_ATTEMPTS_PER_PASS
            || !self.ever_fits(id)
        {
            return false;
        }
        let Some(trial) = self.trials.get(&id) else {
            return false;
        };
        let priority = trial.request.priority;
        let demand = trial.demand;
        let info = &self.queue_info[queue];
        let cohort = info.cohort;
        // Reclaim needs the preemptor's queue to stay within its nominal quota.
        let within_nominal = (0..3).all(|r| {
            demand[r] == 0
                || info.nominal[r].is_none_or(|nominal| {
                    pass.usage_view[queue][r].saturating_add(demand[r]) <= nominal
                })
        });
        let can_reclaim = cohort.is_some() && within_nominal;
        let lower_exists = self
            .index
            .victims
            .first()
            .is_some_and(|(lowest, _, _)| *lowest < priority);
        if !can_reclaim && !lower_exists {
            return false;
        }
        // Only queues that can relieve the constraint in the way are searched.
        let in_scope = |member: usize| match block {
            Some(QuotaBlock::Own(_)) => member == queue,
            Some(QuotaBlock::Pool(_)) => {
                cohort.is_some() && self.queue_info[member].cohort == cohort
            }
            None => true,
        };
        // Trials started after `cutoff` have not run their minimum yet; before the
        // minimum has passed since time zero, no trial has.
        let Some(cutoff) = pass.now.checked_sub(self.config.preemption.min_run_time_ms) else {
            return false;
        };
        pass.preemption_attempts += 1;
        let eligible = |victim: TrialId| -> Option<&Trial> {
            let trial = self.trials.get(&victim)?;
            let TrialState::Placed(placed) = &trial.state else {
                return None;
            };
            let ran_enough = placed.started_pass != self.pass && placed.started_at <= cutoff;
            ran_enough.then_some(trial)
        };
        // (victim, is reclaim)
        let mut candidates: Vec<(TrialId, bool)> = Vec::new();
        if can_reclaim && let Some(cohort) = cohort {
            let mut reclaimable: Vec<VictimKey> = Vec::new();
            for &member in &self.cohorts[cohort].members {
                if member == queue
                    || !in_scope(member)
                    || !self.queue_info[member].is_borrowing(self.borrowing_usage(member, pass))
                {
                    continue;
                }
                reclaimable.extend(ran_long_enough(
                    &self.index.queues[member].victims,
                    None,
                    cutoff,
                    MAX_VICTIM_CANDIDATES,
                ));
            }
            reclaimable.sort_unstable();
            // A queue is reclaimed from only while it still borrows.
            let mut remaining: HashMap<usize, Resources> = HashMap::new();
            for (_, _, victim) in reclaimable {
                let Some(trial) = eligible(victim) else {
                    continue;
                };
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
        }
        let by_priority: Vec<VictimKey> = match block {
            None => ran_long_enough(
                &self.index.victims,
                Some(priority),
                cutoff,
                MAX_VICTIM_CANDIDATES,
            ),
            Some(QuotaBlock::Own(_)) => ran_long_enough(
                &self.index.queues[queue].victims,
                Some(priority),
                cutoff,
                MAX_VICTIM_CANDIDATES,
            ),
            Some(QuotaBlock::Pool(_)) => {
                let mut keys: Vec<VictimKey> = cohort
                    .into_iter()
                    .flat_map(|cohort| self.cohorts[cohort].members.iter())
                    .flat_map(|&member| {
                        ran_long_enough(
                            &self.index.queues[member].victims,
                            Some(priority),
                            cutoff,
                            MAX_VICTIM_CANDIDATES,
                        )
                    })
                    .collect();
                keys.sort_unstable();
                keys
            }
        };
        for (_, _, victim) in by_priority {
            if candidates.len() >= MAX_VICTIM_CANDIDATES {
                break;
            }
            if eligible(victim).is_some() && !candidates.iter().any(|(chosen, _)| *chosen == victim)
            {
                candidates.push((victim, false));
            }
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
        let grace_ms = self.config.preemption.grace_period_ms;
        let deadline = pass.now.saturating_add(grace_ms);
        let queue_name = self.queue_info[queue].name.clone();
        for &(victim, reclaim) in &chosen {
            self.change(victim, |trial| {
                if let TrialState::Placed(placed) = &mut trial.state {
                    placed.preempt_deadline = Some(deadline);
                }
            });
            let reason = if reclaim {
                PreemptReason::Reclaim {
                    queue: queue_name.clone(),
                    by: id,
                }
            } else {
                PreemptReason::HigherPriority { by: id, priority }
            };
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
        };
        self.index.reserve(&reservation);
        pass.usage_view[queue] = plus(pass.usage_view[queue], demand);
        self.reservations.insert(id, reservation);
        pass.add_plan(id, plan, chosen.iter().map(|(victim, _)| *victim).collect());
        self.set_reason(id, WaitReason::WaitingForPreemption);
        true
    }

    /// The smallest prefix of `candidates` that lets the trial start, with the
    /// victims it does not need dropped again.
    fn choose_victims(
        &self,
        id: TrialId,
        queue: usize,
        candidates: &[(TrialId, bool)],
        future: &[Resources],
        pass: &Pass,
    ) -> Option<Vec<(TrialId, bool)>> {
        let trial = self.trials.get(&id)?;
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
        // The cheap checks (quota, room in total) first, growing the prefix.
        let mut view = future.to_vec();
        let mut total = pass.free;
        let mut first = None;
        for (count, (victim, _)) in candidates.iter().enumerate() {
            let Some(victim_trial) = self.trials.get(victim) else {
                continue;
            };
            view[victim_trial.queue] = minus(view[victim_trial.queue], victim_trial.demand);
            if let TrialState::Placed(placed) = &victim_trial.state {
                total = plus(total, placement_total(&placed.workers));
            }
            if covers(total, trial.demand)
                && self.quota_block(queue, &trial.demand, &view).is_none()
            {
                first = Some(count + 1);
                break;
            }
        }
        let first = first?;
        // Then placement checks at growing prefixes, and a bisection.
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
        let mut chosen = candidates[..high].to_vec();
        // Spare the least preferred victims the trial can do without.
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
        Some(chosen)
    }

    /// Where the trial would go if `victims` stopped, when that is enough for
    /// both its quota and the nodes (and avoids nodes planned for others).
    fn victims_suffice(
        &self,
        id: TrialId,
        queue: usize,
        victims: impl Iterator<Item = TrialId>,
        future: &[Resources],
        pass: &Pass,
    ) -> Option<Vec<WorkerPlacement>> {
        let trial = self.trials.get(&id)?;
        let mut view = future.to_vec();
        let mut total = pass.free;
        let mut freed: Vec<&[WorkerPlacement]> = Vec::new();
        for victim in victims {
            let victim_trial = self.trials.get(&victim)?;
            let TrialState::Placed(placed) = &victim_trial.state else {
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
    fn borrowing_usage(&self, queue: usize, pass: &Pass) -> Resources {
        minus(pass.start_usage[queue], self.index.queues[queue].stopping)
    }

    /// What quota checks of planned work see: usage and placements of this pass,
    /// plus reservations, less the trials being preempted (their reservations
    /// take their place).
    fn future_view(&self, pass: &Pass) -> Vec<Resources> {
        pass.usage_view
            .iter()
            .zip(&self.index.queues)
            .map(|(view, queue)| minus(*view, queue.stopping))
            .collect()
    }

    /// Whether placing `workers` now (with `extra_freed` released first, for a
    /// plan) leaves too little on some node for the placements planned for trials
    /// waiting on preemption, counting what their victims will give back; the
    /// holder of a plan on that node if so.
    fn plan_conflict(
        &self,
        pass: &Pass,
        workers: &[WorkerPlacement],
        extra_freed: &[&[WorkerPlacement]],
    ) -> Option<TrialId> {
        let mut nodes: Vec<NodeId> = workers
            .iter()
            .map(|worker| worker.node)
            .filter(|node| pass.plan_nodes.contains_key(node))
            .collect();
        nodes.sort_unstable();
        nodes.dedup();
        for node in nodes {
            let plans_here = &pass.plan_nodes[&node];
            let (Some(gpu_used), Some(free)) =
                (self.pool.node_gpu_used(node), self.pool.node_free(node))
            else {
                continue;
            };
            let mut gpu_used: Vec<i64> = gpu_used.iter().map(|used| i64::from(*used)).collect();
            let mut cpu_free = i128::from(free.cpu_milli);
            let mut memory_free = i128::from(free.memory_bytes);
            let mut apply = |worker: &WorkerPlacement, taken: bool| {
                if worker.node != node {
                    return;
                }
                let sign: i64 = if taken { 1 } else { -1 };
                for share in &worker.gpus {
                    if let Some(used) = gpu_used.get_mut(share.index as usize) {
                        *used += sign * i64::from(share.milli);
                    }
                }
                cpu_free -= i128::from(sign) * i128::from(worker.cpu_milli);
                memory_free -= i128::from(sign) * i128::from(worker.memory_bytes);
            };
            for plan in &pass.plans {
                for victim in &plan.victims {
                    if let Some(TrialState::Placed(placed)) =
                        self.trials.get(victim).map(|trial| &trial.state)
                    {
                        placed
                            .workers
                            .iter()
                            .for_each(|worker| apply(worker, false));
                    }
                }
            }
            for freed in extra_freed {
                freed.iter().for_each(|worker| apply(worker, false));
            }
            for &plan in plans_here {
                pass.plans[plan]
                    .workers
                    .iter()
                    .for_each(|worker| apply(worker, true));
            }
            workers.iter().for_each(|worker| apply(worker, true));
            let whole_gpu = GPU_MILLI as i64;
            if gpu_used.iter().any(|used| *used > whole_gpu) || cpu_free < 0 || memory_free < 0 {
                return Some(pass.plans[plans_here[0]].holder);
            }
        }
        None
    }
}

/// Up to `limit` candidates of `set` below priority `below` (all when `None`)
/// that started at or before `cutoff`, in preference order. Within a priority the
/// set runs from the latest start, so each level is entered at the cutoff
/// instead of walking past the trials that are too young.
fn ran_long_enough(
    set: &BTreeSet<VictimKey>,
    below: Option<i64>,
    cutoff: UnixMillis,
    limit: usize,
) -> Vec<VictimKey> {
    const FIRST: TrialId = TrialId {
        experiment: ExperimentId { digest: 0, run: 0 },
        index: 0,
    };
    const LAST: TrialId = TrialId {
        experiment: ExperimentId {
            digest: u64::MAX,
            run: u32::MAX,
        },
        index: u32::MAX,
    };
    let mut found = Vec::new();
    let mut level = set.first().map(|(priority, _, _)| *priority);
    while let Some(priority) = level {
        if below.is_some_and(|below| priority >= below) || found.len() >= limit {
            break;
        }
        let level_end = (priority, Reverse(0), LAST);
        found.extend(
            set.range((priority, Reverse(cutoff), FIRST)..=level_end)
                .take(limit - found.len())
                .copied(),
        );
        level = set
            .range((Bound::Excluded(level_end), Bound::Unbounded))
            .next()
            .map(|(priority, _, _)| *priority);
    }
    found
}

fn amount(resources: Resources) -> Amount {
    Amount {
        gpu_milli: resources[0],
        cpu_milli: resources[1],
        memory_bytes: resources[2],
    }
}

fn dominant_share(usage: Resources, capacity: Resources, weight: f64) -> f64 {
    let share = (0..3)
        .filter(|&r| capacity[r] > 0)
        .map(|r| usage[r] as f64 / capacity[r] as f64)
        .fold(0.0, f64::max);
    share / weight
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

fn describe_index_difference(rebuilt: &Index, kept: &Index) -> String {
    if rebuilt.queues.len() != kept.queues.len() {
        return "the index has the wrong number of queues".to_owned();
    }
    for (queue, (want, have)) in rebuilt.queues.iter().zip(&kept.queues).enumerate() {
        if want != have {
            return format!("queue {queue}: kept {have:?}, recomputed {want:?}");
        }
    }
    if rebuilt.pending_by_team != kept.pending_by_team {
        return format!(
            "pending per team: kept {:?}, recomputed {:?}",
            kept.pending_by_team, rebuilt.pending_by_team
        );
    }
    if rebuilt.node_trials != kept.node_trials {
        return "trials per node differ from a recount".to_owned();
    }
    if rebuilt.ends != kept.ends {
        return "expected ends differ from a recount".to_owned();
    }
    if rebuilt.victims != kept.victims {
        return "preemption candidates differ from a recount".to_owned();
    }
    "waiting demands differ from a recount".to_owned()
}

#[cfg(test)]
#[path = "scheduler_tests.rs"]
mod tests;

impl PolicyCore {
    /// Takes back a trial that already runs where `workers` say (the head
    /// restarted and reloaded it): it counts as placed since `started_at`, with
    /// its resources held, without a decision. It must fit the pool as it is.
    pub fn adopt(
        &mut self,
        request: TrialRequest,
        workers: Vec<WorkerPlacement>,
        started_at: UnixMillis,
    ) -> Result<(), String> {
        if self.trials.contains_key(&request.id) {
            return Err(format!("trial {} is already known", request.id));
        }
        let queue = self
            .resolve_queue(&request.team, request.queue.as_deref())
            .map_err(|refusal| refusal.to_string())?;
        self.pool
            .allocate(&workers)
            .map_err(|error| error.to_string())?;
        let id = request.id;
        let mut trial = self.waiting_entry(request, queue);
        let duration = self.duration(&trial);
        trial.state = TrialState::Placed(Placed {
            workers,
            started_at,
            started_pass: self.pass,
            expected_end: duration.map(|duration| started_at.saturating_add(duration)),
            preempt_deadline: None,
            lost_nodes: Vec::new(),
        });
        self.index.insert(id, &trial);
        self.trials.insert(id, trial);
        Ok(())
    }
}
