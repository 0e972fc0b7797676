//! The event loop of `xp sim`: replays a trace on a simulated clock through the
//! head's own [`PolicyCore`].
//!
//! Events (job ends, preemption stops, dependent and retried submissions) sit in
//! a binary heap; trace arrivals are read in submission order beside it. All
//! events of one timestamp are applied as a batch (ends, then stops, then
//! submissions), and `decide` is called once after each batch that changed the
//! core, then again at the same time while zero-length events keep coming.
//!
//! Semantics, each as the module's contract:
//!
//! - A job is one trial; trial `i` of the trace has experiment digest `i` XOR a
//!   mask drawn from the seed (0 for seed 0), so the way back from a [`TrialId`]
//!   is arithmetic, not a map. The core seeds random placement and breaks ties
//!   between equal trials by id, so the seed reaches both.
//! - `decide` looks at a bounded number of waiting trials per pass; when more than
//!   that many wait and a pass placed something, it is called again at the same
//!   time, so a burst of free room is used at once.
//! - A job with dependencies is submitted when all of them have completed; one
//!   whose dependency never completes (never finishes, killed, refused, blocked)
//!   is reported as blocked and never started.
//! - A placed job runs for its remaining duration, or until its time limit,
//!   counted from this placement (like a batch system's limit per run); at the
//!   limit it is killed (`finish` with `completed = false`).
//! - On a Preempt decision the victim keeps running (and may still finish) for the
//!   grace period, then stops and is requeued. The work since its last checkpoint
//!   (checkpoints every `ckpt_interval` of run time since this placement; none
//!   without an interval) is lost: it will need its remaining duration plus that.
//! - An elastic job (`min_workers`/`max_workers`) runs at the size the policy
//!   gives it; its work is counted at its nominal size (`num_workers`), and at
//!   `w` workers it goes `(w / num_workers)^scaling` times as fast. On a Resize
//!   decision it runs out the grace period, loses the work since its last
//!   checkpoint (as a preemption does), and restarts at once at the new size,
//!   paying [`RESIZE_RESTART_MS`] of restart on its new GPUs, counted as lost
//!   (`engine/elastic.rs`).
//! - A submission refused for too many pending trials goes to its team's
//!   backlog, and the team resubmits its backlog in order after the retry hint.
//! - With a critical-path boost, every `decide` is preceded by new urgencies
//!   for the waiting jobs of pipelines under way ([`super::pipeline`]).
//!
//! Nothing here reads a clock or draws entropy: the same inputs give the same report.

use std::cmp::Reverse;
use std::collections::{BTreeMap, BinaryHeap, HashMap, VecDeque};

use xp_runtime::clock::UnixMillis;
use xp_runtime::ids::{ExperimentId, NodeId, TrialId};

use super::cluster::ClusterSpec;
use super::pipeline::{Booster, CriticalPathBoost, Pipelines, progress_of};
use super::report::SimReport;
use super::trace::{JobPriority, Trace, TraceJob};
use crate::{
    Amount, Decision, GPU_MILLI, GangShape, PolicyConfig, PolicyCore, Refusal, TrialRequest,
    WorkerPlacement,
};
use xp_runtime::seeded::SplitMix64;

pub use self::elastic::RESIZE_RESTART_MS;

mod elastic;
mod service;
mod tally;

pub use self::service::{Oracle, srtf_policy};

/// Bytes in a MiB, for the trace's memory column.
const MIB: u64 = 1 << 20;
/// Decide rounds at one timestamp before the simulation gives up as livelocked.
const MAX_ROUNDS_AT_ONE_TIME: u64 = 1_000_000;

/// How to run a simulation.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SimOptions {
    /// Stop at this simulated time (milliseconds from the trace's zero), if set.
    /// Jobs still running when the events run out (never-finishing ones) hold their
    /// GPUs up to this horizon.
    pub until_ms: Option<u64>,
    /// Call the core's `check_invariants` after every `decide`.
    pub check_invariants: bool,
    /// Seeds the core's random choices: random placement, and the order among
    /// equal trials submitted at the same time. With 0, jobs keep trace order.
    pub seed: u64,
    /// Whether and how jobs on their pipeline's critical path go first.
    pub critical_path_boost: CriticalPathBoost,
}

/// Why a simulation could not run to its end.
#[derive(Debug, thiserror::Error)]
pub enum SimError {
    /// A job names a priority class the policy does not define.
    #[error(
        "line {line}: job {job_id:?} has priority class {class:?}, which the policy does not define"
    )]
    UnknownPriorityClass {
        /// The job's line in the trace.
        line: u64,
        /// The job.
        job_id: String,
        /// The class.
        class: String,
    },
    /// The core's own invariant check failed.
    #[error("policy invariant broken at t={at_s}s: {message}")]
    Invariant {
        /// When, in simulated seconds.
        at_s: f64,
        /// What the core reported.
        message: String,
    },
    /// The core decided something impossible for the job's state (such as placing a running job).
    #[error("at t={at_s}s the policy {what} job {job_id:?}, which is {state}")]
    UnexpectedDecision {
        /// When, in simulated seconds.
        at_s: f64,
        /// What it did.
        what: &'static str,
        /// The job.
        job_id: String,
        /// The job's state then.
        state: &'static str,
    },
    /// The core named a trial the simulation never submitted.
    #[error("at t={at_s}s the policy decided about unknown trial {trial}")]
    UnknownTrial {
        /// When, in simulated seconds.
        at_s: f64,
        /// The trial.
        trial: TrialId,
    },
    /// Decisions kept coming at one timestamp without time moving on.
    #[error(
        "the simulation made {MAX_ROUNDS_AT_ONE_TIME} decision rounds at t={at_s}s without time moving on"
    )]
    Livelock {
        /// When, in simulated seconds.
        at_s: f64,
    },
}

/// Where a job stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Phase {
    /// Not yet submitted (waiting for its time or its dependencies).
    Pending,
    /// Refused for too many pending trials; in its team's backlog.
    Backlogged,
    /// Submitted, waiting in the core.
    Waiting,
    /// Placed and running.
    Running,
    /// Placed, preempted, running out its grace period.
    Stopping,
    /// Placed, being resized, running out its grace period.
    Resizing,
    Completed,
    Killed,
    Refused,
}

impl Phase {
    fn name(self) -> &'static str {
        match self {
            Self::Pending => "not submitted",
            Self::Backlogged => "backlogged",
            Self::Waiting => "waiting",
            Self::Running => "running",
            Self::Stopping => "stopping",
            Self::Resizing => "resizing",
            Self::Completed => "completed",
            Self::Killed => "killed",
            Self::Refused => "refused",
        }
    }
}

/// What happens at an event; the order here is the order within one timestamp.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum EventKind {
    /// The job's run reaches its end or its time limit.
    End,
    /// A preempted job's grace period is over.
    Stop,
    /// A resized job's grace period is over.
    Resize,
    /// An elastic job may grow now: the policy is asked again.
    Wake,
    /// A job is submitted (after its dependencies).
    Submit,
    /// A team resubmits its backlog.
    Retry,
    /// A running job stores a periodic checkpoint.
    Checkpoint,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
struct Event {
    at: u64,
    kind: EventKind,
    seq: u64,
    /// A job index, or a team index for [`EventKind::Retry`].
    target: u32,
    /// The run the event belongs to; a stale event (an older run) is ignored.
    epoch: u32,
}

#[derive(Debug, Clone)]
pub(super) struct JobRun {
    pub(super) phase: Phase,
    /// Bumped on every placement, so events of earlier runs are recognised.
    epoch: u32,
    /// When it was first offered to the policy.
    arrival_ms: u64,
    first_start_ms: Option<u64>,
    pub(super) start_ms: u64,
    /// Work left, as of the start of the current run or the end of the last;
    /// `None` never finishes.
    pub(super) remaining_ms: Option<u64>,
    end_ms: u64,
    unmet_deps: u32,
    /// Workers in its current (or last) run.
    pub(super) size: u32,
}

struct Sim<'a> {
    trace: &'a Trace,
    core: PolicyCore,
    options: &'a SimOptions,
    priorities: Vec<i64>,
    runs: Vec<JobRun>,
    /// Dependents of job `i`: `dependents[offsets[i]..offsets[i + 1]]`.
    dependent_offsets: Vec<u32>,
    dependents: Vec<u32>,
    events: BinaryHeap<Reverse<Event>>,
    seq: u64,
    /// Rack index of each node (`u32::MAX` when it has none).
    racks: HashMap<NodeId, u32>,
    backlog: Vec<VecDeque<u32>>,
    retry_scheduled: Vec<bool>,
    retry_after_ms: u64,
    capacity_gpu_milli: u64,
    /// XORed into job indexes to make trial ids.
    id_mask: u64,
    /// Jobs in [`Phase::Waiting`].
    waiting: u64,
    /// GPU thousandths held now.
    busy_gpu_milli: u64,
    /// The latest submission time in the trace.
    last_arrival_ms: u64,
    /// GPU time held up to `last_arrival_ms`.
    busy_window_milli_ms: u128,
    // Accounting.
    in_system: u64,
    area_job_ms: u128,
    last_event_ms: u64,
    team_gpu_milli_ms: Vec<u128>,
    lost_gpu_milli_ms: u128,
    preemptions: u64,
    preempt_decisions: u64,
    resizes: u64,
    multi_gpu: u64,
    multi_gpu_one_node: u64,
    multi_gpu_one_rack: u64,
    submit_retries: u64,
    decide_calls: u64,
    placements: u64,
    events_done: u64,
    changed: bool,
    pipelines: Pipelines,
    booster: Option<Booster>,
    /// A reference policy applied before each decision (`service`).
    oracle: Option<Oracle>,
}

/// The core examines at most this many waiting trials in one pass
/// (`MAX_EXAMINED_PER_PASS` in the policy core).
const EXAMINED_PER_PASS: u64 = 4096;

fn seconds(millis: u64) -> f64 {
    millis as f64 / 1000.0
}

pub(super) fn gang_of(job: &TraceJob) -> GangShape {
    GangShape {
        workers: job.num_workers,
        per_worker: Amount {
            gpu_milli: job.gpu_milli_per_worker,
            cpu_milli: job.cpu_milli_per_worker,
            memory_bytes: job.mem_mib_per_worker * MIB,
        },
        gpu_models: job.gpu_types.clone(),
        node_labels: BTreeMap::new(),
        spread: false,
        leases: Default::default(),
        oversubscribe: job.oversubscribe,
    }
}

/// Resolves each job's priority through the policy's classes.
fn resolve_priorities(trace: &Trace, config: &PolicyConfig) -> Result<Vec<i64>, SimError> {
    trace
        .jobs
        .iter()
        .map(|job| match &job.priority {
            None => Ok(0),
            Some(JobPriority::Value(value)) => Ok(*value),
            Some(JobPriority::Class(class)) => {
                config
                    .priority_value(class)
                    .ok_or_else(|| SimError::UnknownPriorityClass {
                        line: job.line,
                        job_id: job.job_id.clone(),
                        class: class.clone(),
                    })
            }
        })
        .collect()
}

/// Replays `trace` on `cluster` under `config` and reports what happened.
pub fn simulate(
    trace: &Trace,
    cluster: &ClusterSpec,
    config: PolicyConfig,
    options: &SimOptions,
) -> Result<SimReport, SimError> {
    simulate_with(trace, cluster, config, options, None)
}

/// Replays `trace` on `cluster` under a reference policy that knows every
/// job's duration ([`Oracle`]), for comparison.
pub fn simulate_oracle(
    trace: &Trace,
    cluster: &ClusterSpec,
    oracle: Oracle,
    options: &SimOptions,
) -> Result<SimReport, SimError> {
    let config = match oracle {
        Oracle::Srtf => srtf_policy(),
    };
    simulate_with(trace, cluster, config, options, Some(oracle))
}

fn simulate_with(
    trace: &Trace,
    cluster: &ClusterSpec,
    config: PolicyConfig,
    options: &SimOptions,
    oracle: Option<Oracle>,
) -> Result<SimReport, SimError> {
    let priorities = resolve_priorities(trace, &config)?;
    let retry_after_ms = config.admission.retry_after_ms.max(1);
    let mut core = PolicyCore::new(config);
    for node in &cluster.nodes {
        core.upsert_node(node.clone());
    }
    let racks = rack_numbers(cluster);
    let (dependent_offsets, dependents) = dependents_of(trace);
    let runs = trace.jobs.iter().map(JobRun::pending).collect();
    let teams = trace.teams.len();
    let sim = Sim {
        trace,
        core,
        options,
        priorities,
        runs,
        dependent_offsets,
        dependents,
        events: BinaryHeap::new(),
        seq: 0,
        racks,
        backlog: vec![VecDeque::new(); teams],
        retry_scheduled: vec![false; teams],
        retry_after_ms,
        capacity_gpu_milli: cluster.total_gpus() * GPU_MILLI,
        id_mask: match options.seed {
            0 => 0,
            seed => SplitMix64::new(seed).next_u64(),
        },
        waiting: 0,
        busy_gpu_milli: 0,
        last_arrival_ms: trace
            .jobs
            .iter()
            .map(|job| job.submit_ms)
            .max()
            .unwrap_or(0),
        busy_window_milli_ms: 0,
        in_system: 0,
        area_job_ms: 0,
        last_event_ms: 0,
        team_gpu_milli_ms: vec![0; teams],
        lost_gpu_milli_ms: 0,
        preemptions: 0,
        preempt_decisions: 0,
        resizes: 0,
        multi_gpu: 0,
        multi_gpu_one_node: 0,
        multi_gpu_one_rack: 0,
        submit_retries: 0,
        decide_calls: 0,
        placements: 0,
        events_done: 0,
        changed: false,
        pipelines: Pipelines::new(trace),
        booster: Booster::new(trace, options.critical_path_boost),
        oracle,
    };
    sim.run()
}

impl JobRun {
    /// A job not yet submitted: all its duration ahead, all its dependencies unmet.
    fn pending(job: &TraceJob) -> Self {
        Self {
            phase: Phase::Pending,
            epoch: 0,
            arrival_ms: 0,
            first_start_ms: None,
            start_ms: 0,
            remaining_ms: job.duration_ms,
            end_ms: 0,
            unmet_deps: job.deps.len() as u32,
            size: job.num_workers,
        }
    }
}

/// Each node's rack as a number (racks numbered as first seen), or
/// `u32::MAX` for a node without a `rack` label.
fn rack_numbers(cluster: &ClusterSpec) -> HashMap<NodeId, u32> {
    let mut rack_names: HashMap<&str, u32> = HashMap::new();
    let mut racks = HashMap::with_capacity(cluster.nodes.len());
    for node in &cluster.nodes {
        let rack = match node.labels.get("rack") {
            Some(name) => {
                let next = u32::try_from(rack_names.len()).expect("fewer racks than nodes");
                *rack_names.entry(name.as_str()).or_insert(next)
            }
            None => u32::MAX,
        };
        racks.insert(node.id, rack);
    }
    racks
}

/// Each job's dependents, in compressed rows: job `i`'s are
/// `dependents[offsets[i]..offsets[i + 1]]`, in trace order.
fn dependents_of(trace: &Trace) -> (Vec<u32>, Vec<u32>) {
    let job_count = trace.jobs.len();
    let mut dependent_counts = vec![0u32; job_count + 1];
    for job in &trace.jobs {
        for &dep in &job.deps {
            dependent_counts[dep as usize + 1] += 1;
        }
    }
    for index in 1..=job_count {
        dependent_counts[index] += dependent_counts[index - 1];
    }
    let dependent_offsets = dependent_counts;
    let mut fill = dependent_offsets.clone();
    let mut dependents =
        vec![0u32; *dependent_offsets.last().expect("one more offset than jobs") as usize];
    for (index, job) in trace.jobs.iter().enumerate() {
        for &dep in &job.deps {
            dependents[fill[dep as usize] as usize] = index as u32;
            fill[dep as usize] += 1;
        }
    }
    (dependent_offsets, dependents)
}

impl Sim<'_> {
    fn push(&mut self, at: u64, kind: EventKind, target: u32, epoch: u32) {
        self.seq += 1;
        self.events.push(Reverse(Event {
            at,
            kind,
            seq: self.seq,
            target,
            epoch,
        }));
    }

    fn trial_of(&self, index: u32) -> TrialId {
        TrialId {
            experiment: ExperimentId {
                digest: u64::from(index) ^ self.id_mask,
                run: 1,
            },
            index: 0,
        }
    }

    fn job_index(&self, trial: TrialId, at: u64) -> Result<u32, SimError> {
        let index = trial.experiment.digest ^ self.id_mask;
        if trial.index != 0 || trial.experiment.run != 1 || index >= self.runs.len() as u64 {
            return Err(SimError::UnknownTrial {
                at_s: seconds(at),
                trial,
            });
        }
        Ok(index as u32)
    }

    fn run(mut self) -> Result<SimReport, SimError> {
        let arrivals = self.arrival_order();
        let first_arrival_ms = self
            .trace
            .jobs
            .iter()
            .map(|job| job.submit_ms)
            .min()
            .unwrap_or(0);
        self.last_event_ms = first_arrival_ms;
        let mut next_arrival = 0;
        let mut rounds_at_now = 0u64;
        let mut now = first_arrival_ms;
        let mut stopped_by_until = false;
        loop {
            // 1. The next time: the next event's or the next arrival's.
            let heap_next = self.events.peek().map(|Reverse(event)| event.at);
            let list_next = arrivals
                .get(next_arrival)
                .map(|&index| self.trace.jobs[index as usize].submit_ms);
            let Some(next) = [heap_next, list_next].into_iter().flatten().min() else {
                break;
            };
            if self.options.until_ms.is_some_and(|until| next > until) {
                stopped_by_until = true;
                break;
            }
            if next == now {
                rounds_at_now += 1;
                if rounds_at_now > MAX_ROUNDS_AT_ONE_TIME {
                    return Err(SimError::Livelock { at_s: seconds(now) });
                }
            } else {
                rounds_at_now = 0;
            }
            now = next;
            self.advance(now);
            self.changed = false;
            // 2. Its events, then its arrivals, then one decision if they changed anything.
            self.handle_events_at(now);
            while let Some(&index) = arrivals.get(next_arrival) {
                if self.trace.jobs[index as usize].submit_ms != now {
                    break;
                }
                next_arrival += 1;
                self.events_done += 1;
                self.submit(index, now);
            }
            if self.changed {
                self.decide(now)?;
            }
        }
        // 3. Jobs still running (never-finishing ones) hold their GPUs up to the horizon.
        let still_running = self.runs.iter().any(|run| {
            matches!(
                run.phase,
                Phase::Running | Phase::Stopping | Phase::Resizing
            )
        });
        let end_ms = match self.options.until_ms {
            Some(until) if stopped_by_until || (still_running && until > now) => until,
            _ => now,
        };
        self.advance(end_ms);
        Ok(self.report(first_arrival_ms, end_ms))
    }

    /// The jobs without dependencies, in submission order, ties in trace order.
    fn arrival_order(&self) -> Vec<u32> {
        let mut arrivals: Vec<u32> = (0..self.trace.jobs.len() as u32)
            .filter(|&index| self.trace.jobs[index as usize].deps.is_empty())
            .collect();
        arrivals.sort_by_key(|&index| self.trace.jobs[index as usize].submit_ms);
        arrivals
    }

    /// Applies every event due at `now`, in the heap's order.
    fn handle_events_at(&mut self, now: u64) {
        while let Some(&Reverse(event)) = self.events.peek() {
            if event.at != now {
                break;
            }
            self.events.pop();
            self.events_done += 1;
            match event.kind {
                EventKind::End => self.handle_end(event, now),
                EventKind::Stop => self.handle_stop(event, now),
                EventKind::Resize => self.handle_resize(event, now),
                EventKind::Wake => self.handle_wake(event),
                EventKind::Submit => self.submit(event.target, now),
                EventKind::Retry => self.handle_retry(event.target as usize, now),
                EventKind::Checkpoint => {
                    self.handle_checkpoint(event.target, event.epoch, now);
                }
            }
        }
    }

    /// Moves the Little's-law integral on to `now`.
    fn advance(&mut self, now: u64) {
        let elapsed = now.saturating_sub(self.last_event_ms);
        self.area_job_ms += u128::from(self.in_system) * u128::from(elapsed);
        let window = now.min(self.last_arrival_ms) - self.last_event_ms.min(self.last_arrival_ms);
        self.busy_window_milli_ms += u128::from(self.busy_gpu_milli) * u128::from(window);
        self.last_event_ms = self.last_event_ms.max(now);
    }

    fn submit(&mut self, index: u32, now: UnixMillis) {
        let run = &mut self.runs[index as usize];
        if run.phase == Phase::Pending {
            run.arrival_ms = now;
            self.in_system += 1;
            if let (Some(booster), Some(pipeline)) =
                (&mut self.booster, self.pipelines.of_job(index))
            {
                booster.activate(pipeline);
            }
        }
        let trace = self.trace;
        let job = &trace.jobs[index as usize];
        let request = TrialRequest {
            id: self.trial_of(index),
            team: trace.teams[job.team as usize].clone(),
            queue: None,
            priority: self.priorities[index as usize],
            gang: gang_of(job),
            preemptible: job.preemptible,
            time_limit_ms: job.time_limit_ms,
            submitted_at: now,
            urgency: self
                .booster
                .as_ref()
                .map_or(0, |booster| booster.urgency(index)),
        };
        match self.core.submit(request, now) {
            Ok(()) => {
                if let Some(elastic) = job.elastic {
                    let trial = self.trial_of(index);
                    self.core
                        .set_elastic(trial, elastic.min_workers, elastic.max_workers, now);
                }
                self.runs[index as usize].phase = Phase::Waiting;
                self.waiting += 1;
                self.changed = true;
            }
            Err(Refusal::TooManyPending { retry_after_ms, .. }) => {
                let team = job.team as usize;
                if self.runs[index as usize].phase == Phase::Pending {
                    self.backlog[team].push_back(index);
                } else {
                    self.backlog[team].push_front(index);
                }
                self.runs[index as usize].phase = Phase::Backlogged;
                if !self.retry_scheduled[team] {
                    self.retry_scheduled[team] = true;
                    let delay = retry_after_ms.max(self.retry_after_ms).max(1);
                    self.push(now + delay, EventKind::Retry, team as u32, 0);
                }
            }
            Err(_) => {
                let run = &mut self.runs[index as usize];
                run.phase = Phase::Refused;
                run.end_ms = now;
                self.in_system -= 1;
                self.release_dependents(index, now, false);
            }
        }
    }

    fn handle_retry(&mut self, team: usize, now: UnixMillis) {
        self.retry_scheduled[team] = false;
        while let Some(index) = self.backlog[team].pop_front() {
            self.submit_retries += 1;
            self.submit(index, now);
            if self.runs[index as usize].phase == Phase::Backlogged {
                // Refused again: it went back to the front and a retry is scheduled.
                break;
            }
        }
    }

    fn handle_end(&mut self, event: Event, now: UnixMillis) {
        let index = event.target;
        let run = &self.runs[index as usize];
        if run.epoch != event.epoch
            || !matches!(
                run.phase,
                Phase::Running | Phase::Stopping | Phase::Resizing
            )
        {
            return;
        }
        let ran = now - run.start_ms;
        let done = self.work_of(index, ran);
        let completed = run.remaining_ms.is_some_and(|remaining| done >= remaining);
        self.account_run(index, ran);
        self.busy_gpu_milli -= self.run_gpu_milli(index);
        let run = &mut self.runs[index as usize];
        run.phase = if completed {
            Phase::Completed
        } else {
            Phase::Killed
        };
        run.end_ms = now;
        if let Some(remaining) = &mut run.remaining_ms {
            *remaining = remaining.saturating_sub(done);
        }
        self.in_system -= 1;
        if let (Some(booster), true) = (&mut self.booster, completed) {
            let duration_ms = self.trace.jobs[index as usize].duration_ms.unwrap_or(0);
            booster.record(index, seconds(duration_ms));
        }
        self.core.finish(self.trial_of(index), now, completed);
        self.changed = true;
        self.release_dependents(index, now, completed);
    }

    fn handle_stop(&mut self, event: Event, now: UnixMillis) {
        let index = event.target;
        let run = &self.runs[index as usize];
        if run.epoch != event.epoch || run.phase != Phase::Stopping {
            return;
        }
        let gpu_milli = self.run_gpu_milli(index);
        self.close_run_at_checkpoint(index, now, gpu_milli, gpu_milli);
        self.preemptions += 1;
        let run = &mut self.runs[index as usize];
        run.phase = Phase::Waiting;
        self.waiting += 1;
        self.core.requeue(self.trial_of(index), now);
        self.changed = true;
    }

    fn release_dependents(&mut self, index: u32, now: UnixMillis, completed: bool) {
        if !completed {
            return;
        }
        let from = self.dependent_offsets[index as usize] as usize;
        let to = self.dependent_offsets[index as usize + 1] as usize;
        for position in from..to {
            let dependent = self.dependents[position];
            let run = &mut self.runs[dependent as usize];
            run.unmet_deps -= 1;
            if run.unmet_deps == 0 {
                // Never before its own submission time.
                let at = now.max(self.trace.jobs[dependent as usize].submit_ms);
                self.push(at, EventKind::Submit, dependent, 0);
            }
        }
    }

    /// Calls `decide` and carries out its decisions, again while a pass placed
    /// something and more trials wait than one pass examines.
    fn decide(&mut self, now: UnixMillis) -> Result<(), SimError> {
        self.apply_oracle(now);
        if let Some(booster) = &mut self.booster {
            let (runs, jobs) = (&self.runs, &self.trace.jobs);
            let changes = booster.refresh(&self.pipelines, self.trace, |job| {
                progress_of(&runs[job as usize], jobs[job as usize].duration_ms, now)
            });
            for (job, urgency) in changes {
                self.core.set_urgency(self.trial_of(job), urgency);
            }
        }
        for _ in 0..MAX_ROUNDS_AT_ONE_TIME {
            let waiting_before = self.waiting;
            let placed = self.decide_once(now)?;
            if placed == 0 || waiting_before <= EXAMINED_PER_PASS {
                return Ok(());
            }
        }
        Err(SimError::Livelock { at_s: seconds(now) })
    }

    /// One `decide` call; returns how many jobs it placed.
    fn decide_once(&mut self, now: UnixMillis) -> Result<u64, SimError> {
        self.decide_calls += 1;
        let placements_before = self.placements;
        let decisions = self.core.decide(now);
        if self.options.check_invariants {
            self.core
                .check_invariants()
                .map_err(|violation| SimError::Invariant {
                    at_s: seconds(now),
                    message: violation.to_string(),
                })?;
        }
        for decision in decisions {
            match decision {
                Decision::Place { trial, workers } => {
                    let index = self.job_index(trial, now)?;
                    self.place(index, &workers, now)?;
                }
                Decision::Preempt {
                    trial, grace_ms, ..
                } => {
                    let index = self.job_index(trial, now)?;
                    self.preempt_decisions += 1;
                    let run = &mut self.runs[index as usize];
                    match run.phase {
                        Phase::Running => {
                            run.phase = Phase::Stopping;
                            let epoch = run.epoch;
                            self.push(now + grace_ms, EventKind::Stop, index, epoch);
                        }
                        // Already asked to stop: the first grace period stands.
                        Phase::Stopping => {}
                        // Preempted while resizing: it stops instead of
                        // restarting, after a grace period of its own.
                        Phase::Resizing => {
                            run.phase = Phase::Stopping;
                            let epoch = run.epoch;
                            self.push(now + grace_ms, EventKind::Stop, index, epoch);
                        }
                        phase => {
                            return Err(SimError::UnexpectedDecision {
                                at_s: seconds(now),
                                what: "preempted",
                                job_id: self.trace.jobs[index as usize].job_id.clone(),
                                state: phase.name(),
                            });
                        }
                    }
                }
                Decision::Resize {
                    trial, grace_ms, ..
                } => self.resize_decision(trial, grace_ms, now)?,
            }
        }
        Ok(self.placements - placements_before)
    }

    fn place(
        &mut self,
        index: u32,
        workers: &[WorkerPlacement],
        now: UnixMillis,
    ) -> Result<(), SimError> {
        let trace = self.trace;
        let job = &trace.jobs[index as usize];
        let run = &mut self.runs[index as usize];
        if run.phase != Phase::Waiting {
            return Err(SimError::UnexpectedDecision {
                at_s: seconds(now),
                what: "placed",
                job_id: job.job_id.clone(),
                state: run.phase.name(),
            });
        }
        run.phase = Phase::Running;
        run.size = u32::try_from(workers.len()).expect("gangs are at most u32 workers");
        self.waiting -= 1;
        self.busy_gpu_milli += self.run_gpu_milli(index);
        let remaining_wall = self.runs[index as usize]
            .remaining_ms
            .map(|remaining| self.wall_for(index, remaining));
        let run = &mut self.runs[index as usize];
        run.epoch += 1;
        run.start_ms = now;
        run.first_start_ms.get_or_insert(now);
        let run_for = match (remaining_wall, job.time_limit_ms) {
            (Some(remaining), Some(limit)) => Some(remaining.min(limit)),
            (Some(remaining), None) => Some(remaining),
            (None, limit) => limit,
        };
        let epoch = run.epoch;
        if let Some(run_for) = run_for {
            self.push(now + run_for, EventKind::End, index, epoch);
        }
        self.wake_elastic(index, now);
        self.schedule_checkpoint(index, now);
        self.placements += 1;
        if job.total_gpu_milli() > GPU_MILLI {
            self.multi_gpu += 1;
            let first = workers.first().map(|worker| worker.node);
            let one_node = workers.iter().all(|worker| Some(worker.node) == first);
            let rack_of = |node: &NodeId| self.racks.get(node).copied().unwrap_or(u32::MAX);
            let first_rack = first.as_ref().map(rack_of).unwrap_or(u32::MAX);
            let one_rack = one_node
                || (first_rack != u32::MAX
                    && workers
                        .iter()
                        .all(|worker| rack_of(&worker.node) == first_rack));
            self.multi_gpu_one_node += u64::from(one_node);
            self.multi_gpu_one_rack += u64::from(one_rack);
        }
        Ok(())
    }
}
