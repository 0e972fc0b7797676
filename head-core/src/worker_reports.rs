//! Worker reports: what a node says happened to one of its workers (started,
//! could not start, exited, refused, stopped, a metric line, a checkpoint), and
//! what the trial's lifecycle makes of it.
//!
//! [`HeadCore::handle_report`] checks that the report is about a known worker on
//! the node that hosts it, and hands it to one function per kind of report. Those
//! functions tolerate duplicates and stale reports (a node resends unacknowledged
//! reports after a reconnect, and a lost attempt's workers may still speak): a
//! report about a worker that already let go of its resources changes nothing,
//! and only the live attempt speaks for its trial.
//!
//! Invariant: only rank 0 of the live attempt of an unfinished trial updates the
//! trial's metric summary, and a metric report whose index is not newer than the
//! last one taken from that worker is ignored.

use std::collections::BTreeMap;

use tracing::{debug, warn};
use xp_runtime::clock::UnixMillis;
use xp_runtime::ids::{NodeId, TrialId, WorkerKey};
use xp_runtime::protocol::{
    CheckpointFile, MAX_MALFORMED_LINE_SHOWN, MalformedMetrics, TrialState, WorkerReport,
};

use super::{HeadCore, MetricRecord, Record, WorkerState};
use crate::shared_text;

/// The most distinct metric names a trial's summary keeps (the history keeps all).
const MAX_METRIC_NAMES: usize = 1024;

/// What the head knew of a reporting worker when its report arrived.
#[derive(Debug, Clone, Copy)]
struct Reporter {
    key: WorkerKey,
    node_id: NodeId,
    /// Whether the worker's attempt was still live.
    attempt_live: bool,
    /// The worker's state before the report.
    state: WorkerState,
    /// The index of the last metric report taken from it.
    last_metric_index: Option<u64>,
}

impl HeadCore {
    /// A worker's report, as its node relayed it.
    pub(super) fn handle_report(&mut self, now: UnixMillis, node_id: NodeId, report: WorkerReport) {
        let key = report.key();
        let Some((attempt, worker)) = self.worker(key) else {
            debug!(worker = %key, "report for an unknown worker ignored");
            return;
        };
        let reporter = Reporter {
            key,
            node_id,
            attempt_live: attempt.is_live(),
            state: worker.state,
            last_metric_index: worker.last_metric_index,
        };
        if worker.node != node_id {
            warn!(worker = %key, %node_id, "report from a node that does not host this worker ignored");
            return;
        }
        match report {
            WorkerReport::Checkpoint {
                step,
                files,
                backup,
                take_ms,
                ..
            } => self.worker_checkpoint(now, reporter, step, files, backup, take_ms),
            WorkerReport::Started { pid, .. } => self.worker_started(now, reporter, pid),
            WorkerReport::LaunchFailed { error, .. } => {
                self.worker_launch_failed(now, reporter, &error);
            }
            WorkerReport::Exited { code, signal, .. } => {
                self.worker_exited(now, reporter, (code, signal), "");
            }
            WorkerReport::ExitedWithStderr {
                code,
                signal,
                stderr_tail,
                ..
            } => self.worker_exited(now, reporter, (code, signal), &stderr_tail),
            WorkerReport::OomKilled {
                code,
                signal,
                limit_bytes,
                ..
            } => {
                self.worker_oom_killed(now, reporter, (code, signal), limit_bytes);
            }
            WorkerReport::Refused { reason, .. } => {
                self.worker_refused(now, reporter, &reason);
            }
            WorkerReport::Stopped { reason, .. } => {
                self.worker_stopped(now, reporter, &reason);
            }
            WorkerReport::Metric {
                index,
                step,
                values,
                ..
            } => {
                self.worker_metric(now, reporter, index, step, values);
            }
            WorkerReport::MalformedMetrics { count, first, .. } => {
                self.worker_malformed_metrics(now, reporter.key, count, first);
            }
            WorkerReport::Outputs { files, error, .. } => {
                self.worker_outputs(now, reporter, files, error);
            }
            WorkerReport::Evicted {
                gpu,
                used_bytes,
                total_bytes,
                ..
            } => self.worker_evicted(now, reporter, gpu, used_bytes, total_bytes),
        }
    }

    /// A checkpoint the worker's node stored; a new one's take is timed once
    /// (a report resent after a reconnect is not).
    fn worker_checkpoint(
        &mut self,
        now: UnixMillis,
        reporter: Reporter,
        step: u64,
        files: Vec<CheckpointFile>,
        backup: Option<String>,
        take_ms: u64,
    ) {
        let counted = self.outbox.tally().checkpoints;
        self.record_checkpoint(now, reporter.key, reporter.node_id, step, files, backup);
        if self.outbox.tally().checkpoints > counted {
            self.outbox
                .tally()
                .checkpoint_take(std::time::Duration::from_millis(take_ms));
        }
    }

    /// The worker's process runs; once every rank runs, so does the trial.
    fn worker_started(&mut self, now: UnixMillis, reporter: Reporter, pid: u32) {
        let Reporter {
            key,
            node_id,
            attempt_live,
            state,
            ..
        } = reporter;
        if !attempt_live {
            self.kill_on(node_id, key.trial, key.attempt, "attempt already ended");
            return;
        }
        if state != WorkerState::Assigned {
            return;
        }
        debug!(worker = %key, pid, "worker started");
        self.set_worker_state(key, WorkerState::Started);
        let all_started = self.worker(key).is_some_and(|(attempt, _)| {
            attempt
                .workers
                .iter()
                .all(|worker| worker.state == WorkerState::Started)
        });
        if all_started {
            if let Some(attempt) = self.attempt_mut(key) {
                attempt.running_at = Some(now);
            }
            self.transition(
                now,
                key.trial,
                TrialState::Running,
                format!("all workers of attempt {} running", key.attempt),
            );
        } else if self.book.trial(key.trial).state == TrialState::Placed {
            self.transition(
                now,
                key.trial,
                TrialState::Starting,
                format!("rank {} started", key.rank),
            );
        }
    }

    /// Rank 0's output files are stored on its node (or could not be, which
    /// fails the attempt): kept on the trial for the pipelines that read them.
    fn worker_outputs(
        &mut self,
        now: UnixMillis,
        reporter: Reporter,
        files: Vec<CheckpointFile>,
        error: Option<String>,
    ) {
        let Reporter {
            key,
            node_id,
            attempt_live,
            state,
            ..
        } = reporter;
        if !attempt_live || !state.holds_resources() || key.rank != 0 {
            return;
        }
        if let Some(error) = error {
            self.fail_attempt(now, key, format!("rank 0's outputs were not kept: {error}"));
            return;
        }
        for file in &files {
            self.objects.node_holds(node_id, file.object);
        }
        let Some(trial) = self.book.trial_mut(key.trial) else {
            return;
        };
        // Outputs hold their objects like kept checkpoints do (the object book),
        // so retiring a checkpoint with the same bytes never deletes an output.
        let before = super::records::output_objects(&trial.outputs);
        trial.outputs = files;
        let after = super::records::output_objects(&trial.outputs);
        let released = self.objects.rekeep(before, after);
        self.drop_everywhere(key.trial, released);
    }

    /// The node could not start the worker's process: the trial's fault, unless
    /// the attempt was being preempted anyway.
    fn worker_launch_failed(&mut self, now: UnixMillis, reporter: Reporter, error: &str) {
        let Reporter {
            key,
            attempt_live,
            state,
            ..
        } = reporter;
        if !state.holds_resources() {
            return;
        }
        self.release_worker(
            key,
            WorkerState::Exited {
                code: None,
                signal: None,
            },
        );
        if attempt_live && self.book.trial(key.trial).state == TrialState::Preempting {
            self.preempted_worker_gone(now, key);
        } else if attempt_live {
            self.fail_attempt(
                now,
                key,
                format!("rank {} could not start: {error}", key.rank),
            );
        }
    }

    /// The worker's process exited: the attempt succeeds when every rank exited
    /// with status 0, and fails (or, when preempting, is gone) on any other
    /// exit, its outcome saying how with the last lines of the rank's stderr
    /// (`stderr_tail`, bounded again here: a node's word is not trusted to be
    /// small); a gang across nodes has that exit judged once its nodes are
    /// (`gang_faults`).
    fn worker_exited(
        &mut self,
        now: UnixMillis,
        reporter: Reporter,
        (code, signal): (Option<i32>, Option<i32>),
        stderr_tail: &str,
    ) {
        let Reporter {
            key,
            attempt_live,
            state,
            ..
        } = reporter;
        if !state.holds_resources() {
            return;
        }
        self.release_worker(key, WorkerState::Exited { code, signal });
        if !attempt_live {
            return;
        }
        if code != Some(0) && self.book.trial(key.trial).state == TrialState::Preempting {
            self.preempted_worker_gone(now, key);
            return;
        }
        if code == Some(0) {
            let all_succeeded = self.worker(key).is_some_and(|(attempt, _)| {
                attempt.workers.iter().all(|worker| {
                    worker.state
                        == WorkerState::Exited {
                            code: Some(0),
                            signal: None,
                        }
                })
            });
            if all_succeeded && let Some(missing) = self.unreported_objective(key.trial) {
                // Exiting 0 without the result the search asked for is no success.
                self.fail_attempt(
                    now,
                    key,
                    format!(
                        "exited with status 0 without reporting {missing}, the search's metric"
                    ),
                );
            } else if all_succeeded {
                self.finish_attempt(now, key, "succeeded");
                self.transition(
                    now,
                    key.trial,
                    TrialState::Succeeded,
                    "all workers exited with status 0".to_owned(),
                );
            } else if self.book.trial(key.trial).state == TrialState::Preempting {
                // A rank that left with 0 while its gang stops (its peers told it
                // to) is gone like the others; the last one gone ends the attempt.
                self.preempted_worker_gone(now, key);
            }
        } else {
            let mut how = super::gang_faults::exit_words(key.rank, code, signal);
            let stderr_tail = xp_runtime::stderr_tail::tail_of(stderr_tail.as_bytes());
            if !stderr_tail.is_empty() {
                how = format!("{how}: {stderr_tail}");
            }
            if !self.hold_gang_exit(now, key, &how) {
                self.fail_attempt(now, key, how);
            }
        }
    }

    /// The kernel killed the worker's process for going over its memory limit:
    /// outcome `oom-killed`, a failure retried under `max_retries` (or, when
    /// preempting, the worker is gone).
    fn worker_oom_killed(
        &mut self,
        now: UnixMillis,
        reporter: Reporter,
        (code, signal): (Option<i32>, Option<i32>),
        limit_bytes: u64,
    ) {
        let Reporter {
            key,
            attempt_live,
            state,
            ..
        } = reporter;
        if !state.holds_resources() {
            return;
        }
        self.release_worker(key, WorkerState::Exited { code, signal });
        if !attempt_live {
            return;
        }
        if self.book.trial(key.trial).state == TrialState::Preempting {
            self.preempted_worker_gone(now, key);
            return;
        }
        let limit = bytesize::ByteSize(limit_bytes);
        self.fail_attempt_as(
            now,
            key,
            "oom-killed",
            format!(
                "rank {} was killed for going over its memory limit of {limit}",
                key.rank
            ),
        );
    }

    /// The node could not start the worker through no fault of the trial (a GPU
    /// still held, a binary it could not fetch): requeued without using a retry.
    fn worker_refused(&mut self, now: UnixMillis, reporter: Reporter, reason: &str) {
        let Reporter {
            key,
            node_id,
            state,
            ..
        } = reporter;
        if state.holds_resources() {
            self.lose_worker(
                now,
                key,
                format!("node {node_id} refused rank {}: {reason}", key.rank),
            );
        }
    }

    /// The node stopped the worker: as asked (preemption, an ended attempt) or on
    /// its own (shutting down), which is not the trial's fault.
    fn worker_stopped(&mut self, now: UnixMillis, reporter: Reporter, reason: &str) {
        let Reporter {
            key,
            node_id,
            attempt_live,
            state,
            ..
        } = reporter;
        if !state.holds_resources() {
            return;
        }
        if attempt_live && self.book.trial(key.trial).state == TrialState::Preempting {
            self.release_worker(
                key,
                WorkerState::Exited {
                    code: None,
                    signal: None,
                },
            );
            self.preempted_worker_gone(now, key);
        } else if attempt_live {
            // The node stopped it on its own (shutting down): not the trial's fault.
            self.lose_worker(
                now,
                key,
                format!("node {node_id} stopped rank {}: {reason}", key.rank),
            );
        } else {
            self.release_worker(
                key,
                WorkerState::Exited {
                    code: None,
                    signal: None,
                },
            );
        }
    }

    /// The node stopped a worker through its checkpoint for GPU memory. Only
    /// opted-in workers are ever evicted: a node saying otherwise is wrong, and
    /// its worker is treated as stopped (no free requeue, no eviction counted).
    fn worker_evicted(
        &mut self,
        now: UnixMillis,
        reporter: Reporter,
        gpu: u32,
        used_bytes: u64,
        total_bytes: u64,
    ) {
        let opted_in = self
            .book
            .get_spec(reporter.key.trial.experiment)
            .is_some_and(|spec| spec.trial.resources.oversubscribe);
        if opted_in {
            self.opted_in_worker_evicted(now, reporter, gpu, used_bytes, total_bytes);
        } else {
            warn!(worker = %reporter.key, node = %reporter.node_id, "a node reports an eviction for GPU memory of a worker that did not opt in to oversubscription; taken as stopped");
            self.worker_stopped(
                now,
                reporter,
                "stopped by its node (reported as an eviction, but it did not opt in to oversubscription)",
            );
        }
    }

    /// The node evicted an oversubscribed worker through its checkpoint because
    /// GPU `gpu` ran short of memory: the attempt ends `evicted: ...` (its other
    /// ranks are stopped) and the trial is requeued without using a retry, to
    /// resume from its last checkpoint. During a preemption the worker is simply
    /// gone, as a stopped one would be.
    fn opted_in_worker_evicted(
        &mut self,
        now: UnixMillis,
        reporter: Reporter,
        gpu: u32,
        used_bytes: u64,
        total_bytes: u64,
    ) {
        let Reporter {
            key,
            node_id,
            attempt_live,
            state,
            ..
        } = reporter;
        if !state.holds_resources() {
            return;
        }
        self.release_worker(
            key,
            WorkerState::Exited {
                code: None,
                signal: None,
            },
        );
        if !attempt_live {
            return;
        }
        if self.book.trial(key.trial).state == TrialState::Preempting {
            self.preempted_worker_gone(now, key);
            return;
        }
        self.outbox.tally().gpu_memory_evictions += 1;
        let why = eviction_reason(node_id, key.rank, gpu, used_bytes, total_bytes);
        self.finish_attempt(now, key, &format!("evicted: {why}"));
        self.requeue_without_retry(
            now,
            key.trial,
            &format!("{why}; resumes from its last checkpoint"),
        );
    }

    /// A metric line: appended to the history, kept in the trial's summary when
    /// the live rank 0 sent it, and judged by the experiment's stopping rule.
    fn worker_metric(
        &mut self,
        now: UnixMillis,
        reporter: Reporter,
        index: u64,
        step: Option<u64>,
        values: Vec<(String, f64)>,
    ) {
        let Reporter {
            key,
            attempt_live,
            last_metric_index,
            ..
        } = reporter;
        if last_metric_index.is_some_and(|last| index <= last) {
            return;
        }
        if let Some(worker) = self.worker_mut(key) {
            worker.last_metric_index = Some(index);
        }
        let values: BTreeMap<String, f64> = values.into_iter().collect();
        // Only the live attempt speaks for the trial; a lost attempt's late
        // reports stay in the history but do not overwrite the result.
        let speaks_for_trial = attempt_live && !self.book.trial(key.trial).state.is_terminal();
        // Alerts judge what speaks for the trial: rank 0 of the live attempt.
        let mut alerted = None;
        if key.rank == 0 && speaks_for_trial {
            self.summarise_metrics(key, step, &values);
            alerted = self.judge_alerts(now, key, step, &values);
        }
        let judged = self.judge_early_stopping(key, step, &values);
        self.outbox.record(Record::Metric(MetricRecord {
            key,
            step,
            values,
            at: now,
        }));
        if let Some(reason) = alerted {
            self.finish_attempt(now, key, "stopped by an alert");
            self.transition(now, key.trial, TrialState::Stopped, reason);
        } else if let Some(reason) = judged {
            self.finish_attempt(now, key, "stopped early");
            self.transition(now, key.trial, TrialState::Stopped, reason);
        }
    }

    /// Keeps the last value of each metric (up to `MAX_METRIC_NAMES` names) and
    /// the last step in the trial's summary.
    fn summarise_metrics(
        &mut self,
        key: WorkerKey,
        step: Option<u64>,
        values: &BTreeMap<String, f64>,
    ) {
        let trial = self
            .book
            .trial_mut(key.trial)
            .expect("worker lookup found the trial");
        let room = MAX_METRIC_NAMES.saturating_sub(trial.metrics.len());
        let mut new_names = 0;
        for (name, value) in values {
            if let Some(slot) = trial.metrics.get_mut(name.as_str()) {
                *slot = *value;
            } else if new_names < room {
                trial.metrics.insert(shared_text::shared(name), *value);
                new_names += 1;
            } else {
                warn!(trial_id = %key.trial, metric = %name, "more than {MAX_METRIC_NAMES} metric names; this one is kept in the history only");
            }
        }
        if step.is_some() {
            trial.last_step = step;
        }
    }
}

/// The words of an eviction for GPU memory in an attempt's outcome and the
/// trial's events: which node, rank and GPU, and the memory the node saw.
fn eviction_reason(
    node_id: NodeId,
    rank: u32,
    gpu: u32,
    used_bytes: u64,
    total_bytes: u64,
) -> String {
    let percent = if total_bytes == 0 {
        0.0
    } else {
        used_bytes as f64 * 100.0 / total_bytes as f64
    };
    format!(
        "node {node_id} evicted rank {rank} for GPU memory: GPU {gpu} had {percent:.1}% in use ({} of {})",
        bytesize::ByteSize(used_bytes),
        bytesize::ByteSize(total_bytes)
    )
}

impl HeadCore {
    /// The first of the search's objectives the trial never reported (a
    /// finite or non-finite value both count as reported), if any.
    fn unreported_objective(&self, trial: TrialId) -> Option<String> {
        let record = self.book.get_trial(trial)?;
        self.book
            .spec(trial.experiment)
            .search
            .objectives()
            .into_iter()
            .find(|objective| !record.metrics.contains_key(objective.metric))
            .map(|objective| objective.metric.to_owned())
    }

    /// The worker printed metric lines its node could not read: kept on the
    /// trial (the count and the first line), and the first time a warning in
    /// its events, so a trial that reports nothing says why.
    fn worker_malformed_metrics(
        &mut self,
        now: UnixMillis,
        key: WorkerKey,
        count: u64,
        first: String,
    ) {
        let Some(trial) = self.book.trial_mut(key.trial) else {
            return;
        };
        let first_time = trial.malformed_metrics.is_none();
        let malformed = trial.malformed_metrics.get_or_insert_with(|| {
            Box::new(MalformedMetrics {
                count: 0,
                first: first.chars().take(MAX_MALFORMED_LINE_SHOWN).collect(),
            })
        });
        malformed.count = malformed.count.max(count);
        let state = trial.state;
        if first_time {
            let warning = format!(
                "warning: rank {} printed a metric line that could not be read: {}",
                key.rank, malformed.first
            );
            self.push_event(now, key.trial, state, key.attempt, warning);
        }
    }
}
