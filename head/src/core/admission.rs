//! Admission: the two limits a trial passes before the policy core sees it.
//!
//! A submission is refused (with a retry hint) while its team already has its
//! policy's limit of pending trials; a trial then waits as `Pending` until its
//! experiment has fewer than `parallel` unfinished trials in the queue or running.
//! Where and when a queued trial runs is not decided here but by the policy core.

use xp_runtime::clock::UnixMillis;
use xp_runtime::ids::ExperimentId;
use xp_runtime::protocol::TrialState;
use xp_runtime::spec::ExperimentSpec;

use super::{CoreError, HeadCore, trial_range};

impl HeadCore {
    /// Refuses a submission while the team already has its limit of pending
    /// trials, with a hint of when to retry; the SDK backs off and retries.
    pub(super) fn admit(&self, spec: &ExperimentSpec) -> Result<(), CoreError> {
        let admission = &self.policy.config().admission;
        let pending = self
            .trials
            .values()
            .filter(|trial| matches!(trial.state, TrialState::Pending | TrialState::Queued))
            .filter(|trial| {
                self.specs
                    .get(&trial.id.experiment)
                    .is_some_and(|other| other.team == spec.team)
            })
            .count() as u64;
        if pending >= admission.max_pending_per_team {
            return Err(CoreError::TooManyPending {
                team: spec.team.clone(),
                pending,
                limit: admission.max_pending_per_team,
                retry_after_ms: admission.retry_after_ms,
            });
        }
        Ok(())
    }

    /// Moves pending trials of each experiment into the queue while fewer than its
    /// `parallel` limit are queued, placed or running.
    pub(super) fn admit_pending(&mut self, now: UnixMillis) {
        let experiment_ids: Vec<ExperimentId> = self.experiments.keys().copied().collect();
        for experiment_id in experiment_ids {
            let limit = self.specs[&experiment_id]
                .search
                .parallel
                .map_or(usize::MAX, |limit| limit as usize);
            let (active, pending): (Vec<_>, Vec<_>) = self
                .trials
                .range(trial_range(experiment_id))
                .filter(|(_, trial)| !trial.state.is_terminal())
                .map(|(id, trial)| (*id, trial.state))
                .partition(|(_, state)| *state != TrialState::Pending);
            let room = limit.saturating_sub(active.len());
            for (trial_id, _) in pending.into_iter().take(room) {
                if let Some(trial) = self.trials.get_mut(&trial_id) {
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
