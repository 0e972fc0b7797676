//! What authorization needs to know about a request's target: which team owns
//! an experiment or trial, and which team a queue belongs to.
//!
//! Read-only lookups for the actor, which resolves a request's target here and
//! then asks `crate::auth::authorize`; nothing here decides who may do what.

use xp_runtime::ids::{ExperimentId, TrialId};

use super::{CoreError, HeadCore};

impl HeadCore {
    /// The team owning experiment `id`.
    pub fn team_of_experiment(&self, id: ExperimentId) -> Result<String, CoreError> {
        self.specs
            .get(&id)
            .map(|spec| spec.team.clone())
            .ok_or(CoreError::ExperimentNotFound { experiment_id: id })
    }

    /// The team owning the experiment named by `text` (an id or unique prefix).
    pub fn team_of_experiment_named(&self, text: &str) -> Result<String, CoreError> {
        self.team_of_experiment(self.resolve_experiment(text)?)
    }

    /// The team owning trial `id`.
    pub fn team_of_trial(&self, id: TrialId) -> Result<String, CoreError> {
        if !self.trials.contains_key(&id) {
            return Err(CoreError::TrialNotFound { trial_id: id });
        }
        self.team_of_experiment(id.experiment)
    }

    /// The team owning what `text` names: a trial id, else an experiment id or
    /// prefix (as cancel and admin actions read their `id`).
    pub fn team_of_named(&self, text: &str) -> Result<String, CoreError> {
        match text.parse::<TrialId>() {
            Ok(trial) => self.team_of_trial(trial),
            Err(_) => self.team_of_experiment_named(text),
        }
    }

    /// The team queue `name` belongs to: `Some(None)` for a queue open to every
    /// team, `None` when the policy has no such queue.
    pub fn queue_owner(&self, name: &str) -> Option<Option<String>> {
        self.policy
            .config()
            .queue(name)
            .map(|queue| queue.team.clone())
    }
}
