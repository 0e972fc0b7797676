//! The attempt and worker lifecycle: looking workers up, releasing them, ending
//! attempts (succeeded, failed, lost), and trial state transitions with their
//! events.
//!
//! These are the bookkeeping primitives the rest of the core is built on; they
//! decide nothing about placement. An attempt that fails through the trial's own
//! fault uses a retry (`max_retries`); one lost through no fault of the trial (a
//! node lost, restarted or refusing) is requeued without one, up to
//! `MAX_REQUEUES` times in a row without a new checkpoint (each new one starts the
//! count again), so that a trial that kills its nodes cannot loop.
//!
//! Invariants: a trial has at most one live attempt; ending an attempt frees its
//! `MASTER_PORT`, stops its remaining workers and revokes its object capability; a worker's resources are given
//! back to the policy core only through `release_worker`, once.

use std::collections::BTreeSet;

use tracing::info;
use xp_runtime::clock::UnixMillis;
use xp_runtime::ids::{NodeId, TrialId, WorkerKey};
use xp_runtime::protocol::{HeadCommand, TrialState};

use super::{AttemptRecord, HeadCore, Record, TrialRecord, WorkerRecord, WorkerState};
use crate::shared_text;

/// How often a trial may be requeued for reasons not its own (lost nodes, refused
/// launches) before it fails, so that a trial that kills its nodes cannot loop.
const MAX_REQUEUES: u32 = 20;
/// How long a stopped worker has between SIGTERM and SIGKILL, unless preempted.
const KILL_GRACE_MS: u64 = 5_000;

impl HeadCore {
    /// A worker and its attempt, if the head knows them.
    pub(super) fn worker(&self, key: WorkerKey) -> Option<(&AttemptRecord, &WorkerRecord)> {
        let attempt = self
            .book
            .get_trial(key.trial)?
            .attempts
            .iter()
            .find(|attempt| attempt.number == key.attempt)?;
        let worker = attempt.workers.get(key.rank as usize)?;
        Some((attempt, worker))
    }

    /// An attempt to change; its trial is marked for persisting.
    pub(super) fn attempt_mut(&mut self, key: WorkerKey) -> Option<&mut AttemptRecord> {
        self.book
            .trial_mut(key.trial)?
            .attempts
            .iter_mut()
            .find(|attempt| attempt.number == key.attempt)
    }

    /// A worker to change; its trial is marked for persisting.
    pub(super) fn worker_mut(&mut self, key: WorkerKey) -> Option<&mut WorkerRecord> {
        self.attempt_mut(key)?.workers.get_mut(key.rank as usize)
    }

    /// Sets what the head knows of a worker's process.
    pub(super) fn set_worker_state(&mut self, key: WorkerKey, state: WorkerState) {
        if let Some(worker) = self.worker_mut(key) {
            worker.state = state;
        }
    }

    /// Frees a worker's slot and records its final state.
    pub(super) fn release_worker(&mut self, key: WorkerKey, state: WorkerState) {
        let Some(worker) = self.worker_mut(key) else {
            return;
        };
        if !worker.state.holds_resources() {
            return;
        }
        worker.state = state;
        // The policy core frees the gang's resources once its last worker is gone.
        self.placement.unsettle(key.trial);
    }

    /// Ends the attempt of `key` (if live) with `outcome`, freeing its port and
    /// stopping its other workers.
    pub(super) fn finish_attempt(&mut self, now: UnixMillis, key: WorkerKey, outcome: &str) {
        let Some(attempt) = self.attempt_mut(key) else {
            return;
        };
        if !attempt.is_live() {
            return;
        }
        attempt.ended_at = Some(now);
        attempt.outcome = Some(shared_text::shared(outcome));
        let host = attempt.master_host.clone();
        let port = attempt.master_port;
        let live_nodes: BTreeSet<NodeId> = attempt
            .workers
            .iter()
            .filter(|worker| worker.state.holds_resources())
            .map(|worker| worker.node)
            .collect();
        self.placement.master_ports().release(&host, port);
        for node in live_nodes {
            self.kill_on(node, key.trial, key.attempt, outcome);
        }
        self.revoke_attempt(now, key.trial, key.attempt);
    }

    /// Ends the trial's live attempt, if it has one, with `outcome`.
    pub(super) fn end_live_attempt(&mut self, now: UnixMillis, trial_id: TrialId, outcome: &str) {
        let live = self
            .book
            .trial(trial_id)
            .attempts
            .last()
            .filter(|attempt| attempt.is_live())
            .map(|attempt| attempt.number);
        if let Some(number) = live {
            self.finish_attempt(
                now,
                WorkerKey {
                    trial: trial_id,
                    attempt: number,
                    rank: 0,
                },
                outcome,
            );
        }
    }

    /// The attempt failed through the trial's fault: retry under `max_retries`.
    pub(super) fn fail_attempt(&mut self, now: UnixMillis, key: WorkerKey, reason: String) {
        self.fail_attempt_as(now, key, "failed", reason);
    }

    /// The attempt failed through the trial's fault in a way with a name of its
    /// own (`oom-killed`, `time-limit`, `failed`): its outcome is `kind: reason`,
    /// and it is retried under `max_retries` like any failure.
    pub(super) fn fail_attempt_as(
        &mut self,
        now: UnixMillis,
        key: WorkerKey,
        kind: &str,
        reason: String,
    ) {
        self.finish_attempt(now, key, &format!("{kind}: {reason}"));
        let max_retries = self.book.spec(key.trial.experiment).trial.max_retries;
        let trial = self
            .book
            .trial_mut(key.trial)
            .expect("failing attempt has a trial");
        trial.failures += 1;
        *self
            .outbox
            .tally()
            .attempt_failures
            .entry(kind.to_owned())
            .or_default() += 1;
        if trial.state.is_terminal() {
            return;
        }
        if trial.failures <= max_retries {
            trial.queued_at = now;
            let retry = trial.failures;
            self.transition(
                now,
                key.trial,
                TrialState::Queued,
                format!("retry {retry} of {max_retries} after: {reason}"),
            );
        } else {
            self.transition(
                now,
                key.trial,
                TrialState::Failed,
                format!("{reason} (no retries left of {max_retries})"),
            );
        }
    }

    /// The worker's process is gone through no fault of the trial (node lost or
    /// restarted): the attempt ends and the trial is requeued without using a retry.
    pub(super) fn lose_worker(&mut self, now: UnixMillis, key: WorkerKey, reason: String) {
        let Some((attempt, worker)) = self.worker(key) else {
            return;
        };
        let attempt_live = attempt.is_live();
        let (node, held) = (worker.node, worker.state.holds_resources());
        if held {
            // Should the process still exist (a node that only looked lost), stop it.
            self.kill_on(node, key.trial, key.attempt, &reason);
        }
        self.release_worker(key, WorkerState::Lost);
        if !attempt_live {
            return;
        }
        self.finish_attempt(now, key, &format!("lost: {reason}"));
        self.requeue_without_retry(now, key.trial, &reason);
    }

    /// Requeues a trial whose attempt ended through no fault of its own, using
    /// no retry; past `MAX_REQUEUES` without a new checkpoint it fails instead.
    pub(super) fn requeue_without_retry(
        &mut self,
        now: UnixMillis,
        trial_id: TrialId,
        reason: &str,
    ) {
        let trial = self
            .book
            .trial_mut(trial_id)
            .expect("a requeued trial exists");
        if trial.state.is_terminal() {
            return;
        }
        trial.requeues += 1;
        trial.queued_at = now;
        if trial.requeues > MAX_REQUEUES {
            self.transition(
                now,
                trial_id,
                TrialState::Failed,
                format!("requeued {MAX_REQUEUES} times without finishing; last: {reason}"),
            );
        } else {
            self.transition(
                now,
                trial_id,
                TrialState::Queued,
                format!("requeued: {reason}"),
            );
        }
    }

    /// Ends the running attempts that ran past their trial's `time_limit` (from
    /// when all their workers ran): outcome `time-limit`, a failure retried under
    /// `max_retries`. Their workers get SIGTERM, the usual grace, then SIGKILL.
    pub(super) fn enforce_time_limits(&mut self, now: UnixMillis) {
        let mut overdue = Vec::new();
        // Only experiments with a limit: this runs every tick, and most have none.
        let limited = self.book.specs().filter_map(|(experiment, spec)| {
            Some((*experiment, &spec.trial, spec.trial.time_limit_ms()?))
        });
        for (experiment, trial_spec, limit_ms) in limited {
            for (_, trial) in self.book.trials_of(experiment) {
                if trial.state != TrialState::Running {
                    continue;
                }
                let Some(attempt) = trial.attempts.last().filter(|attempt| attempt.is_live())
                else {
                    continue;
                };
                let Some(running_at) = attempt.running_at else {
                    continue;
                };
                if now.saturating_sub(running_at) > limit_ms {
                    let limit = trial_spec.time_limit.clone().unwrap_or_default();
                    overdue.push((trial.id, attempt.number, limit));
                }
            }
        }
        for (trial, attempt, limit) in overdue {
            let key = WorkerKey {
                trial,
                attempt,
                rank: 0,
            };
            info!(worker = %key, %limit, "attempt ran past its time limit");
            self.fail_attempt_as(
                now,
                key,
                "time-limit",
                format!("ran past its time limit of {limit}"),
            );
        }
    }

    /// Tells `node` to stop the workers of an attempt, with the usual grace.
    pub(super) fn kill_on(&mut self, node: NodeId, trial: TrialId, attempt: u32, reason: &str) {
        self.outbox.send(
            node,
            HeadCommand::Kill {
                trial,
                attempt,
                reason: reason.to_owned(),
                grace_ms: KILL_GRACE_MS,
            },
        );
    }

    /// Moves a trial to `state` for `reason`, with an event; a repeat of the same
    /// state and reason changes nothing.
    pub(super) fn transition(
        &mut self,
        now: UnixMillis,
        trial_id: TrialId,
        state: TrialState,
        reason: String,
    ) {
        let unchanged = |trial: &TrialRecord| {
            trial.state == state && trial.reason.as_deref() == Some(reason.as_str())
        };
        if self.book.get_trial(trial_id).is_none_or(unchanged) {
            return;
        }
        let trial = self.book.trial_mut(trial_id).expect("checked above");
        let was_terminal = trial.state.is_terminal();
        if trial.state != state {
            self.outbox.tally().transition(state);
        }
        trial.state = state;
        trial.reason = Some(shared_text::shared(&reason));
        if state.is_terminal() && !was_terminal {
            trial.finished_at = Some(now);
        }
        self.placement.unsettle(trial_id);
        let attempt = trial.attempts.len() as u32;
        let config_json = trial.config_json.clone();
        if state == TrialState::Succeeded {
            let identity = self.trial_identity(trial_id.experiment, &config_json);
            self.book.remember_success(identity, trial_id);
        }
        if state.is_terminal() && !was_terminal {
            self.sweep_state.trial_finished(trial_id);
            self.release_trial_objects(trial_id);
            self.pipelines.trial_ended(trial_id.experiment);
        }
        info!(%trial_id, state = state.as_str(), attempt, %reason, "trial state changed");
        self.push_event(now, trial_id, state, attempt, reason);
    }

    /// Appends a trial event (kept in memory for the event feed and persisted).
    pub(super) fn push_event(
        &mut self,
        now: UnixMillis,
        trial: TrialId,
        state: TrialState,
        attempt: u32,
        reason: String,
    ) {
        let event = self.book.push_event(now, trial, state, attempt, reason);
        self.outbox.record(Record::Event(event));
    }
}
