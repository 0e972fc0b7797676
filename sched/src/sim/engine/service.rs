//! What the simulator tells the policy about work done: each running job's
//! periodic checkpoints, and, for the `srtf` oracle, every job's remaining
//! time.
//!
//! Checkpoints: a job with a checkpoint interval checkpoints every interval of
//! run time since its placement (the rule the loss on preemption counts
//! with, in `handle_stop`); each one is an event that reports it to the core
//! with [`PolicyCore::note_checkpoint`](crate::PolicyCore::note_checkpoint),
//! as the head does on a worker's checkpoint report, so that victim choice
//! sees what each victim would lose; while jobs wait, a checkpoint makes the
//! policy decide again, since it may have made a cheap victim. Attained service needs nothing from here:
//! the core counts it from the placements and stops it already sees.
//!
//! The `srtf` oracle is shortest-remaining-time-first that knows every job's
//! true remaining work: before each decision every job in the system gets the
//! base priority `-(remaining seconds)` under a priority order that skips
//! blocked gangs and preempts at once (no minimum run, no grace). It is a
//! reference for `xp sim` only: no live scheduler knows durations. It walks
//! every job in the system per decision, so it suits traces of thousands of
//! jobs, not millions.

use xp_runtime::clock::UnixMillis;

use super::{EventKind, Phase, Sim};
use crate::PolicyConfig;
use crate::config::{HeadOfLine, Order, PreemptionConfig};

/// The reference policies the simulator can apply beside a policy file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Oracle {
    /// Shortest remaining time first, knowing every duration, preemptive.
    Srtf,
}

/// The policy the `srtf` oracle runs under: one queue, priority order over
/// it, skip-ahead, preemption with no minimum run and no grace, and the
/// `default` preset's placement; priorities come from the oracle.
pub fn srtf_policy() -> PolicyConfig {
    let default = PolicyConfig::default();
    PolicyConfig {
        order: Order::Priority,
        head_of_line: HeadOfLine::Skip,
        backfill: false,
        aging: None,
        attained_service: None,
        preemption: PreemptionConfig {
            enabled: true,
            grace_period_ms: 0,
            min_run_time_ms: 0,
            max_loss_ms: None,
        },
        placement: default.placement,
        ..PolicyConfig::base()
    }
}

impl Sim<'_> {
    /// Schedules job `index`'s first checkpoint of the run that starts now.
    pub(super) fn schedule_checkpoint(&mut self, index: u32, now: UnixMillis) {
        let Some(interval) = self.trace.jobs[index as usize]
            .ckpt_interval_ms
            .filter(|interval| *interval > 0)
        else {
            return;
        };
        let epoch = self.runs[index as usize].epoch;
        self.push(
            now.saturating_add(interval),
            EventKind::Checkpoint,
            index,
            epoch,
        );
    }

    /// A running job checkpoints: the core hears of it, and the next one is
    /// scheduled. Events of an earlier run are ignored.
    pub(super) fn handle_checkpoint(&mut self, index: u32, epoch: u32, now: UnixMillis) {
        let run = &self.runs[index as usize];
        if run.epoch != epoch || !matches!(run.phase, Phase::Running | Phase::Stopping) {
            return;
        }
        self.core.note_checkpoint(self.trial_of(index), now);
        // A job that has just checkpointed is a cheap victim: while anyone
        // waits, the policy looks again (as the head does on a report).
        if self.waiting > 0 {
            self.changed = true;
        }
        if let Some(interval) = self.trace.jobs[index as usize].ckpt_interval_ms {
            self.push(
                now.saturating_add(interval),
                EventKind::Checkpoint,
                index,
                epoch,
            );
        }
    }

    /// Under the `srtf` oracle, gives every job in the system its priority:
    /// fewer remaining seconds, higher priority.
    pub(super) fn apply_oracle(&mut self, now: UnixMillis) {
        if self.oracle != Some(Oracle::Srtf) {
            return;
        }
        for index in 0..self.runs.len() {
            let run = &self.runs[index];
            let remaining = match run.phase {
                Phase::Waiting => run.remaining_ms,
                Phase::Running | Phase::Stopping => run
                    .remaining_ms
                    .map(|remaining| remaining.saturating_sub(now.saturating_sub(run.start_ms))),
                _ => continue,
            };
            let priority = remaining.map_or(i64::MIN / 2, |ms| {
                -i64::try_from(ms / 1000).unwrap_or(i64::MAX)
            });
            self.core
                .set_priority(self.trial_of(index as u32), priority);
        }
    }
}
