//! Keeping the policy core in step with the trials: the scheduling pass, what the
//! policy core is told of each trial, preemption, and adopting running trials
//! after a restart, with the completed trials' service that adaptive level
//! edges follow.
//!
//! Placement decisions are not made here: `PolicyCore::decide` makes them, and this
//! module carries them out (a launch, or a kill with grace for a preemption). It
//! also never picks a `MASTER_PORT` or builds a launch (see `launch`).
//!
//! Invariants: a trial's resources are released in the policy core only when its
//! last worker is gone (`settle_with_policy`); a preempted trial is requeued
//! without using a retry; a running trial found in the registry at start is
//! adopted back where its workers are.

use std::collections::BTreeSet;

use tracing::warn;
use xp_runtime::clock::UnixMillis;
use xp_runtime::ids::{NodeId, TrialId, WorkerKey};
use xp_runtime::protocol::{HeadCommand, NodeState, TrialState};
use xp_runtime::spec::{ExperimentSpec, Priority};
use xp_sched::{
    Amount, Decision, GangShape, PolicyCore, PreemptReason, Refusal, ResizeReason, TrialRequest,
    WorkerPlacement,
};

use super::launch::LaunchError;
use super::{HeadCore, TrialRecord, WorkerRecord};

impl HeadCore {
    /// One scheduling pass: settles finished trials with their sweeps, admits
    /// pending trials, brings the policy core in line, hands it the new queued
    /// trials, and carries out its decisions (launches and preemptions).
    pub(super) fn schedule(&mut self, now: UnixMillis) {
        // Invariant: drained on every scheduling pass; the sweeps consume it. Settling
        // a suggestion can create reused (already finished) trials: loop until none.
        loop {
            let finished = self.sweep_state.take_finished();
            if finished.is_empty() {
                break;
            }
            self.advance_sweeps(now, &finished);
        }
        // Stages whose experiments ended release what needs them, in this same pass.
        self.advance_pipelines(now);
        self.admit_pending(now);
        self.settle_all(now);
        self.hand_over_queued(now);
        let decisions = match self.placement.decide(now) {
            Some(decisions) => {
                self.after_decide(now);
                decisions
            }
            None => Vec::new(),
        };
        for decision in decisions {
            match decision {
                Decision::Place { trial, workers } => self.launch(now, trial, &workers),
                Decision::Preempt {
                    trial,
                    reason,
                    grace_ms,
                } => self.preempt(now, trial, &reason, grace_ms),
                Decision::Resize {
                    trial,
                    from,
                    workers,
                    reason,
                    grace_ms,
                } => self.resize(now, trial, from, workers.len(), &reason, grace_ms),
            }
        }
        // Launches that failed at once release their resources in this same pass.
        self.settle_all(now);
    }

    /// Settles every trial whose standing may have changed (see `settle_with_policy`).
    fn settle_all(&mut self, now: UnixMillis) {
        for trial_id in self.placement.take_unsettled() {
            self.settle_with_policy(now, trial_id);
        }
    }

    /// Brings the policy core in line with a trial: a trial whose workers all let
    /// go of their resources is requeued (when it waits again) or forgotten (when it
    /// ended); a trial that ended while waiting leaves the queue.
    fn settle_with_policy(&mut self, now: UnixMillis, trial_id: TrialId) {
        let Some(trial) = self.book.get_trial(trial_id) else {
            return;
        };
        let holds = trial
            .attempts
            .iter()
            .flat_map(|attempt| &attempt.workers)
            .any(|worker| worker.state.holds_resources());
        if self.placement.policy().placement(trial_id).is_some() {
            if holds {
                return;
            }
            match trial.state {
                TrialState::Queued => {
                    self.placement.requeue(trial_id, now);
                }
                state if state.is_terminal() => {
                    self.placement
                        .finish(trial_id, now, state == TrialState::Succeeded);
                }
                _ => {}
            }
        } else if self.placement.policy().wait_reason(trial_id).is_some()
            && trial.state != TrialState::Queued
        {
            self.placement.finish(trial_id, now, false);
        }
    }

    /// The memory each worker of `spec`'s trials is limited to and counted
    /// at: what it declares, else the policy's `default_memory_per_worker`,
    /// but no more than its CPUs' share of the smallest ready node's memory
    /// (a Slurm allocation of 2 CPUs and 1 GiB gives a 1-CPU worker 512 MiB),
    /// so that an undeclared trial fits wherever its CPUs do.
    pub(super) fn worker_memory(&self, spec: &ExperimentSpec) -> u64 {
        let declared = spec.trial.resources.memory.0;
        if declared > 0 {
            return declared;
        }
        let default = self
            .placement
            .policy()
            .config()
            .admission
            .default_memory_per_worker;
        let cpu_milli = u128::from(spec.trial.cpu_milli().max(1));
        self.membership
            .nodes()
            .filter(|node| node.state == NodeState::Ready && node.resources.cpu_milli > 0)
            .map(|node| {
                let share = u128::from(node.resources.memory_bytes) * cpu_milli
                    / u128::from(node.resources.cpu_milli);
                u64::try_from(share).unwrap_or(u64::MAX)
            })
            .min()
            .map_or(default, |share| share.min(default))
    }

    /// What the policy core needs to know of a trial.
    fn trial_request(&self, trial: &TrialRecord) -> Result<TrialRequest, LaunchError> {
        let spec = &self.book.spec(trial.id.experiment);
        let priority = match (trial.priority_override, &spec.priority) {
            (Some(value), _) | (None, &Priority::Value(value)) => value,
            (None, Priority::Class(class)) => self
                .placement
                .policy()
                .config()
                .priority_value(class)
                .ok_or_else(|| LaunchError::UnknownPriorityClass {
                    class: class.clone(),
                    known: self
                        .placement
                        .policy()
                        .config()
                        .priority_classes
                        .keys()
                        .cloned()
                        .collect(),
                })?,
        };
        Ok(TrialRequest {
            id: trial.id,
            team: spec.team.clone(),
            queue: trial.queue_override.clone().or_else(|| spec.queue.clone()),
            priority,
            gang: GangShape {
                // An elastic trial's size is the policy's to set (`set_elastic`).
                workers: spec.trial.workers.max,
                per_worker: Amount {
                    gpu_milli: spec.trial.gpu_milli(),
                    cpu_milli: u64::from(spec.trial.cpu_milli()),
                    memory_bytes: self.worker_memory(spec),
                },
                gpu_models: spec.trial.gpu_models.clone(),
                node_labels: spec.trial.node_labels.clone(),
                spread: spec.trial.spread,
                leases: spec.trial.resources.leases.clone(),
                // The policy charges an opted-in fraction its share over the
                // factor (`oversubscribed_charge`); launches say which factor.
                oversubscribe: spec.trial.resources.oversubscribe,
            },
            preemptible: spec.trial.preemptible,
            time_limit_ms: spec.trial.time_limit_ms(),
            submitted_at: trial.queued_at,
            urgency: self.pipeline_urgency(trial.id),
        })
    }

    /// Hands the policy core the queued trials it does not hold, of those
    /// offered since the last pass (their state changed, they were restored, or
    /// the core refused them for now), in id order. An experiment refused for
    /// too many pending waits for the next pass whole, untried.
    fn hand_over_queued(&mut self, now: UnixMillis) {
        let mut refused = BTreeSet::new();
        for trial_id in self.placement.take_offered() {
            let queued = self
                .book
                .get_trial(trial_id)
                .is_some_and(|trial| trial.state == TrialState::Queued);
            if !queued || self.placement.policy().holds(trial_id) {
                continue;
            }
            if refused.contains(&trial_id.experiment) || !self.submit_to_policy(now, trial_id) {
                refused.insert(trial_id.experiment);
                self.placement.offer(trial_id);
            }
        }
    }

    /// Hands a queued trial to the policy core; `false` when the core refused
    /// it for too many pending, which clears as the team's queue drains (any
    /// other refusal fails the trial).
    fn submit_to_policy(&mut self, now: UnixMillis, trial_id: TrialId) -> bool {
        let trial = &self.book.trial(trial_id);
        let held = trial.held;
        let waited = trial.waited;
        let request = match self.trial_request(trial) {
            Ok(request) => request,
            Err(error) => {
                self.transition(now, trial_id, TrialState::Failed, error.to_string());
                return true;
            }
        };
        let workers = self.book.spec(trial_id.experiment).trial.workers;
        let (past_gpu_ms, past_run_ms) = past_service(trial);
        match self.placement.policy_mut().submit(request, now) {
            Ok(()) => {
                // Runs the core did not see (before a restart, or attempts
                // that ended before a retry) count toward attained service.
                if past_run_ms > 0 {
                    self.placement.policy_mut().add_past_service(
                        trial_id,
                        past_gpu_ms,
                        past_run_ms,
                    );
                }
                if workers.is_elastic() {
                    self.placement.policy_mut().set_elastic(
                        trial_id,
                        workers.min,
                        workers.max,
                        now,
                    );
                }
                self.placement.mark_stale();
                if !waited {
                    self.placement.await_first_pass(trial_id);
                }
                if held {
                    self.placement.policy_mut().hold(trial_id);
                }
            }
            Err(Refusal::TooManyPending { .. }) => return false,
            Err(Refusal::Duplicate(_)) => {}
            Err(refusal) => self.transition(
                now,
                trial_id,
                TrialState::Failed,
                format!("the scheduler refused it: {refusal}"),
            ),
        }
        true
    }

    /// Stops a trial's live gang so that it checkpoints: every node holding one of
    /// its workers gets a `Kill` with `grace_ms`, and the trial is `Preempting`
    /// until they are gone (see `preempted_worker_gone`). Preemption and resizing
    /// both stop a gang this way.
    fn stop_to_checkpoint(
        &mut self,
        now: UnixMillis,
        trial_id: TrialId,
        why: String,
        grace_ms: u64,
    ) {
        let Some(attempt) = self
            .book
            .get_trial(trial_id)
            .and_then(|trial| trial.attempts.last().filter(|attempt| attempt.is_live()))
        else {
            return;
        };
        let number = attempt.number;
        let nodes: BTreeSet<NodeId> = attempt
            .workers
            .iter()
            .filter(|worker| worker.state.holds_resources())
            .map(|worker| worker.node)
            .collect();
        for node in nodes {
            self.outbox.send(
                node,
                HeadCommand::Kill {
                    trial: trial_id,
                    attempt: number,
                    reason: why.clone(),
                    grace_ms,
                },
            );
        }
        self.transition(
            now,
            trial_id,
            TrialState::Preempting,
            format!("{why}; {} s to checkpoint", grace_ms / 1000),
        );
    }

    /// A placed, running trial that the policy chose to stop for other work: its
    /// workers get SIGTERM and `grace_ms` to checkpoint, and the trial returns to
    /// the queue once all are gone (see `preempted_worker_gone`).
    fn preempt(
        &mut self,
        now: UnixMillis,
        trial_id: TrialId,
        reason: &PreemptReason,
        grace_ms: u64,
    ) {
        let Some(trial) = self.book.trial_mut(trial_id) else {
            return;
        };
        if !matches!(
            trial.state,
            TrialState::Placed | TrialState::Starting | TrialState::Running
        ) {
            return;
        }
        trial.preemptions += 1;
        let why = match reason {
            PreemptReason::HigherPriority { by, priority } => {
                format!("preempted for {by} (priority {priority})")
            }
            PreemptReason::Reclaim { queue, by } => {
                format!("preempted: queue {queue} reclaims its quota for {by}")
            }
            PreemptReason::LessService {
                by,
                level,
                victim_level,
            } => format!(
                "preempted for {by}, which has received less GPU time (level {level}, this trial {victim_level})"
            ),
        };
        self.stop_to_checkpoint(now, trial_id, why, grace_ms);
    }

    /// A worker of a preempting attempt is gone; once the last one is, the attempt
    /// ends and the trial waits again, without using a retry (or, when it was
    /// resized, starts again at once at its new size, resuming from the
    /// checkpoint its workers took on the way out, without using a retry).
    pub(super) fn preempted_worker_gone(&mut self, now: UnixMillis, key: WorkerKey) {
        let Some(from) = self.worker(key).and_then(|(attempt, _)| {
            attempt
                .workers
                .iter()
                .all(|worker| !worker.state.holds_resources())
                .then_some(attempt.workers.len())
        }) else {
            return;
        };
        if let (Some(to), Some(why)) = (
            self.placement.policy().resizing(key.trial).map(<[_]>::len),
            self.placement.policy().resize_reason(key.trial),
        ) && !self.placement.policy().is_preempting(key.trial)
        {
            self.finish_attempt(now, key, &format!("resized: {from} to {to} workers, {why}"));
            if let Some(workers) = self.placement.policy_mut().resized(key.trial, now) {
                self.launch(now, key.trial, &workers);
            }
            self.placement.mark_stale();
            return;
        }
        self.finish_attempt(now, key, "preempted");
        self.transition(
            now,
            key.trial,
            TrialState::Queued,
            "requeued after preemption; resumes from its last checkpoint".to_owned(),
        );
    }

    /// A running elastic trial that the policy resizes: its workers get SIGTERM
    /// and `grace_ms` to checkpoint, as in a preemption, and once all are gone
    /// the gang starts again at its new size (see `preempted_worker_gone`).
    /// Not a preemption: it counts in neither `preemptions` nor retries.
    fn resize(
        &mut self,
        now: UnixMillis,
        trial_id: TrialId,
        from: u32,
        to: usize,
        reason: &ResizeReason,
        grace_ms: u64,
    ) {
        let Some(trial) = self.book.get_trial(trial_id) else {
            return;
        };
        if !matches!(
            trial.state,
            TrialState::Placed | TrialState::Starting | TrialState::Running
        ) {
            return;
        }
        let why = format!("resizing from {from} to {to} workers: {reason}");
        self.stop_to_checkpoint(now, trial_id, why, grace_ms);
    }

    /// Takes a trial that the registry shows running (after a head restart) back
    /// into the policy core's books, where its workers are.
    pub(super) fn adopt_running(&mut self, now: UnixMillis, trial_id: TrialId) {
        let trial = &self.book.trial(trial_id);
        let Some(attempt) = trial.attempts.iter().rev().find(|attempt| {
            attempt
                .workers
                .iter()
                .any(|worker| worker.state.holds_resources())
        }) else {
            return;
        };
        let started_at = attempt.running_at.unwrap_or(attempt.placed_at);
        let placements: Vec<WorkerPlacement> = attempt
            .workers
            .iter()
            .filter(|worker| worker.state.holds_resources())
            .map(|worker| self.worker_placement(worker))
            .collect();
        let number = attempt.number;
        let last_checkpoint = trial
            .checkpoints
            .iter()
            .filter(|checkpoint| checkpoint.attempt == number)
            .map(|checkpoint| checkpoint.at)
            .max();
        let (past_gpu_ms, past_run_ms) = past_service(trial);
        match self.trial_request(trial) {
            Ok(mut request) => {
                // An elastic trial runs at the size it was given.
                let workers = self.book.spec(trial_id.experiment).trial.workers;
                if workers.is_elastic() {
                    request.gang.workers = u32::try_from(placements.len()).unwrap_or(u32::MAX);
                }
                match self
                    .placement
                    .policy_mut()
                    .adopt(request, placements, started_at)
                {
                    Ok(()) if workers.is_elastic() => {
                        self.placement.policy_mut().set_elastic(
                            trial_id,
                            workers.min,
                            workers.max,
                            now,
                        );
                    }
                    Ok(()) => {}
                    Err(error) => {
                        warn!(%trial_id, %error, "cannot restore a running trial's resources in the scheduler");
                    }
                }
            }
            Err(error) => {
                warn!(%trial_id, reason = %error, "cannot restore a running trial in the scheduler")
            }
        }
        if self.placement.policy().placement(trial_id).is_some() {
            // What it received before, and what a preemption would lose now.
            self.placement
                .policy_mut()
                .add_past_service(trial_id, past_gpu_ms, past_run_ms);
            if let Some(at) = last_checkpoint {
                self.placement.policy_mut().note_checkpoint(trial_id, at);
            }
        }
    }

    /// A worker's holdings in the policy core's terms.
    fn worker_placement(&self, worker: &WorkerRecord) -> WorkerPlacement {
        let devices = self
            .membership
            .node(worker.node)
            .map(|node| &node.resources.gpus[..])
            .unwrap_or_default();
        WorkerPlacement {
            node: worker.node,
            gpus: worker
                .gpu_indices
                .iter()
                .map(|device| xp_sched::GpuShare {
                    index: devices
                        .iter()
                        .position(|gpu| gpu.index == *device)
                        .map_or(*device, |slot| slot as u32),
                    milli: worker.gpu_milli,
                })
                .collect(),
            cpu_milli: u64::from(worker.cpu_milli),
            memory_bytes: worker.memory_bytes,
        }
    }

    /// Hands the policy core the service of the last completed trials, oldest
    /// first by when their last attempt ended, as it counted them before a
    /// restart, so adaptive level edges (and the durations that follow them)
    /// come back before any trial is adopted or queued. Only the last
    /// [`PolicyCore::COMPLETED_SERVICE_WINDOW`] count; the edges follow the
    /// same window as before, though one may sit a grid step from where it
    /// stood, since an edge's path over older completions is not kept.
    pub(super) fn restore_completed_service(&mut self) {
        let mut completed: Vec<(UnixMillis, TrialId, u64)> = self
            .book
            .trials()
            .filter(|trial| trial.state == TrialState::Succeeded && trial.reused_from.is_none())
            .filter_map(|trial| {
                let ended = trial
                    .attempts
                    .iter()
                    .filter_map(|attempt| attempt.ended_at)
                    .max()?;
                let (gpu_ms, _) = past_service(trial);
                Some((ended, trial.id, gpu_ms))
            })
            .collect();
        completed.sort_unstable();
        let older = completed
            .len()
            .saturating_sub(PolicyCore::COMPLETED_SERVICE_WINDOW);
        for (_, _, gpu_ms) in completed.into_iter().skip(older) {
            self.placement.policy_mut().add_completed_service(gpu_ms);
        }
    }
}

/// Why a gang changes size, in the words of its trial's events.
/// The GPU time (GPU-milliseconds) and wall time a trial's ended attempts
/// ran, from their records: what the policy core counts as attained service
/// for runs it did not see itself.
fn past_service(trial: &TrialRecord) -> (u64, u64) {
    let mut gpu_ms: u64 = 0;
    let mut run_ms: u64 = 0;
    for attempt in &trial.attempts {
        let (Some(ended), Some(started)) = (attempt.ended_at, attempt.running_at) else {
            continue;
        };
        let ran = ended.saturating_sub(started);
        let gpu_milli: u64 = attempt
            .workers
            .iter()
            .map(|worker| worker.gpu_indices.len() as u64 * u64::from(worker.gpu_milli))
            .sum();
        let product = u128::from(gpu_milli) * u128::from(ran) / 1000;
        gpu_ms = gpu_ms.saturating_add(u64::try_from(product).unwrap_or(u64::MAX));
        run_ms = run_ms.saturating_add(ran);
    }
    (gpu_ms, run_ms)
}
