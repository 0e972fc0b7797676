//! Admission: the limits a submission passes before anything of it is
//! stored, and the one a trial passes before the policy core sees it.
//!
//! A submission is refused, before it is expanded, when its expanded size
//! (`expanded`: trials times the bytes of their rendered configs and
//! commands) is over the policy's `max_submission_bytes`, or when it creates
//! more trials at once than its team may have pending; and refused with a
//! retry hint while its team's pending trials plus its own would pass
//! `max_pending_per_team`, or its team's unfinished trials plus its own
//! expanded size would pass `max_team_bytes`. A trial then waits as
//! `Pending` until its experiment has fewer than `parallel` unfinished trials
//! in the queue or running. Where and when a queued trial runs is not decided
//! here but by the policy core. A submission whose one worker no known node
//! could ever hold is refused at once, naming the largest capacity there is,
//! instead of waiting forever.

use xp_runtime::clock::UnixMillis;
use xp_runtime::protocol::TrialState;
use xp_runtime::spec::ExperimentSpec;

use xp_sched::GPU_MILLI;
use xp_sched::config::AdmissionConfig;

use super::records::NodeRecord;
use super::{CoreError, HeadCore};
use crate::sweep::DEFAULT_ADAPTIVE_PARALLEL;

mod expanded;

pub(crate) use self::expanded::ExpandedSize;

/// What a team's unfinished work holds now.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
struct TeamLoad {
    /// Its pending (and queued) trials.
    pending: u64,
    /// The expanded size of its unfinished trials.
    bytes: u64,
}

impl HeadCore {
    /// Refuses a submission whose expanded size is over the policy's limit,
    /// or that would take its team past its pending or expanded-size limit
    /// (those two with a hint of when to retry; the SDK backs off and
    /// retries). Nothing of the submission is expanded or stored first.
    pub(super) fn admit(&self, spec: &ExperimentSpec) -> Result<(), CoreError> {
        let admission = self.placement.policy().config().admission;
        let size = ExpandedSize::of(spec, DEFAULT_ADAPTIVE_PARALLEL);
        check_admission(&admission, &spec.team, size, self.team_load(&spec.team))
    }

    /// The team's pending trials and the expanded size of its unfinished ones.
    fn team_load(&self, team: &str) -> TeamLoad {
        let mut load = TeamLoad::default();
        for (id, spec) in self.book.specs().filter(|(_, spec)| spec.team == team) {
            let mut unfinished = 0u64;
            for (_, trial) in self.book.trials_of(*id) {
                if matches!(trial.state, TrialState::Pending | TrialState::Queued) {
                    load.pending += 1;
                }
                if !trial.state.is_terminal() {
                    unfinished += 1;
                }
            }
            if unfinished > 0 {
                let per_trial = ExpandedSize::of(spec, DEFAULT_ADAPTIVE_PARALLEL).per_trial;
                load.bytes = load
                    .bytes
                    .saturating_add(unfinished.saturating_mul(per_trial));
            }
        }
        load
    }

    /// Refuses a submission when nodes have joined and none of them, even empty,
    /// could hold one of its workers: it would wait forever. With no node known
    /// yet the submission is accepted (nodes may still join), and its trials say
    /// why they wait.
    pub(super) fn check_capacity(&self, spec: &ExperimentSpec) -> Result<(), CoreError> {
        let gpu_milli = spec.trial.gpu_milli();
        let cpu_milli = u64::from(spec.trial.cpu_milli());
        let memory_bytes = self.worker_memory(spec);
        let whole_gpus = gpu_milli.div_ceil(GPU_MILLI);
        let holds = |node: &NodeRecord| {
            let resources = &node.resources;
            resources.gpus.len() as u64 >= whole_gpus
                && u64::from(resources.cpu_milli) >= cpu_milli
                && resources.memory_bytes >= memory_bytes
        };
        if self.membership.is_empty() || self.membership.nodes().any(holds) {
            return Ok(());
        }
        let resources = || self.membership.nodes().map(|node| &node.resources);
        Err(CoreError::NoNodeCanHold {
            gpu_milli,
            cpu_milli,
            memory_bytes,
            largest_gpus: resources().map(|r| r.gpus.len() as u64).max().unwrap_or(0),
            largest_cpu_milli: resources()
                .map(|r| u64::from(r.cpu_milli))
                .max()
                .unwrap_or(0),
            largest_memory_bytes: resources().map(|r| r.memory_bytes).max().unwrap_or(0),
        })
    }

    /// Moves pending trials of each experiment into the queue while fewer than its
    /// `parallel` limit are queued, placed or running.
    pub(super) fn admit_pending(&mut self, now: UnixMillis) {
        for experiment_id in self.book.take_with_pending() {
            let limit = self
                .book
                .spec(experiment_id)
                .search
                .parallel
                .map_or(usize::MAX, |limit| limit as usize);
            let (active, pending): (Vec<_>, Vec<_>) = self
                .book
                .trials_of(experiment_id)
                .filter(|(_, trial)| !trial.state.is_terminal())
                .map(|(id, trial)| (*id, trial.state))
                .partition(|(_, state)| *state != TrialState::Pending);
            let room = limit.saturating_sub(active.len());
            if pending.len() > room {
                self.book.note_pending(experiment_id);
            }
            for (trial_id, _) in pending.into_iter().take(room) {
                if let Some(trial) = self.book.trial_mut(trial_id) {
                    trial.queued_at = now;
                }
                self.transition(
                    now,
                    trial_id,
                    TrialState::Queued,
                    "waiting for slots".to_owned(),
                );
            }
        }
    }
}

/// The admission decision for a submission of `size` into `team`, whose
/// unfinished work is `load`: the submission is counted with what the team
/// has, so no submission takes a team past a limit.
fn check_admission(
    admission: &AdmissionConfig,
    team: &str,
    size: ExpandedSize,
    load: TeamLoad,
) -> Result<(), CoreError> {
    if size.bytes() > admission.max_submission_bytes {
        return Err(CoreError::SubmissionTooLarge {
            bytes: size.bytes(),
            trials: size.trials,
            per_trial: size.per_trial,
            limit: admission.max_submission_bytes,
        });
    }
    if size.at_once > admission.max_pending_per_team {
        return Err(CoreError::OverPendingLimit {
            team: team.to_owned(),
            trials: size.at_once,
            limit: admission.max_pending_per_team,
        });
    }
    if load.pending.saturating_add(size.at_once) > admission.max_pending_per_team {
        return Err(CoreError::TooManyPending {
            team: team.to_owned(),
            pending: load.pending,
            adding: size.at_once,
            limit: admission.max_pending_per_team,
            retry_after_ms: admission.retry_after_ms,
        });
    }
    if load.bytes.saturating_add(size.bytes()) > admission.max_team_bytes {
        return Err(CoreError::TeamTooLarge {
            team: team.to_owned(),
            held: load.bytes,
            adding: size.bytes(),
            limit: admission.max_team_bytes,
            retry_after_ms: admission.retry_after_ms,
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limits() -> AdmissionConfig {
        AdmissionConfig {
            max_pending_per_team: 100,
            retry_after_ms: 5_000,
            max_submission_bytes: 10_000,
            max_team_bytes: 30_000,
            ..AdmissionConfig::default()
        }
    }

    fn size(trials: u64, per_trial: u64) -> ExpandedSize {
        ExpandedSize {
            trials,
            at_once: trials,
            per_trial,
        }
    }

    fn load(pending: u64, bytes: u64) -> TeamLoad {
        TeamLoad { pending, bytes }
    }

    /// The refusal's message for a submission of `size` into a team of `load`,
    /// or `"admitted"`.
    fn check(size: ExpandedSize, load: TeamLoad, expected: &str) {
        let outcome = check_admission(&limits(), "nlp", size, load)
            .map_or_else(|refusal| refusal.to_string(), |()| "admitted".to_owned());
        assert!(outcome.starts_with(expected), "{outcome}");
    }

    #[test]
    fn a_submission_is_counted_with_what_its_team_already_has() {
        check(size(10, 100), load(0, 0), "admitted");
        check(size(100, 100), load(0, 0), "admitted");
        check(size(10, 100), load(90, 0), "admitted");
        check(
            size(11, 100),
            load(90, 0),
            "team nlp has 90 pending trials and this submission adds 11, over its limit of 100",
        );
        check(
            size(101, 10),
            load(0, 0),
            "this submission creates 101 trials at once, more than team nlp may have pending (100",
        );
        check(
            size(20, 1_000),
            load(0, 0),
            "this submission expands to 20000 bytes (20 trials of 1000 bytes of rendered config and command each), over the limit of 10000 bytes (admission.max_submission_bytes)",
        );
        check(size(10, 1_000), load(0, 20_000), "admitted");
        check(
            size(10, 1_000),
            load(0, 20_001),
            "team nlp's unfinished trials expand to 20001 bytes and this submission to 10000, over the team's limit of 30000 bytes (admission.max_team_bytes)",
        );
    }

    #[test]
    fn only_what_a_team_may_wait_for_is_retryable() {
        let refusal = |size, load| check_admission(&limits(), "nlp", size, load).unwrap_err();
        assert!(refusal(size(11, 1), load(90, 0)).is_temporary());
        assert!(refusal(size(10, 1_000), load(0, 25_000)).is_temporary());
        assert!(!refusal(size(101, 1), load(0, 0)).is_temporary());
        assert!(!refusal(size(11, 1_000), load(0, 0)).is_temporary());
    }

    #[test]
    fn sizes_that_overflow_are_refused_not_wrapped() {
        check(
            size(u64::MAX, u64::MAX),
            load(0, 0),
            "this submission expands to 18446744073709551615 bytes",
        );
        check(
            size(1, 1),
            load(0, u64::MAX),
            "team nlp's unfinished trials",
        );
    }
}
