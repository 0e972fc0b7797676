//! `xp cancel` (`Request::Cancel`): an experiment (by id or unique prefix) or
//! one trial.
//!
//! Access: a member cancels their own team's work; the name resolves among
//! what the asker sees, and the cancel goes to exactly what it resolved to.

use xp_runtime::clock::UnixMillis;
use xp_runtime::ids::TrialId;
use xp_runtime::protocol::{Response, TrialState};

use crate::auth::Action;
use crate::auth::access::{Access, Authorized, Scope};
use crate::{CoreError, HeadCore};

/// What a cancel does: cancel the trial or experiment it names.
pub(super) fn access(id: &str) -> Access {
    Access::new(Action::Cancel, Scope::Named(id.to_owned()))
}

impl HeadCore {
    /// Cancels what authorization resolved `id` to.
    pub(super) fn apply_cancel(
        &mut self,
        now: UnixMillis,
        asker: &Authorized,
        id: &str,
    ) -> Result<Response, CoreError> {
        let trials = self.handle_cancel(now, &asker.pinned(id))?;
        Ok(Response::Cancelled { trials })
    }

    /// Cancels an experiment (by id or unique prefix) or one trial.
    pub fn handle_cancel(&mut self, now: UnixMillis, id_text: &str) -> Result<u32, CoreError> {
        let targets: Vec<TrialId> = if let Ok(trial_id) = id_text.parse::<TrialId>() {
            if !self.book.contains_trial(trial_id) {
                return Err(CoreError::TrialNotFound { trial_id });
            }
            vec![trial_id]
        } else {
            let experiment = self.resolve_experiment(id_text)?;
            if let Some(record) = self.book.experiment_mut(experiment) {
                record.cancelled = true;
            }
            self.book.trials_of(experiment).map(|(id, _)| *id).collect()
        };
        let mut cancelled = 0;
        for trial_id in targets {
            if self.book.trial(trial_id).state.is_terminal() {
                continue;
            }
            self.end_live_attempt(now, trial_id, "cancelled by user");
            self.transition(
                now,
                trial_id,
                TrialState::Cancelled,
                "cancelled by user".to_owned(),
            );
            cancelled += 1;
        }
        self.schedule(now);
        Ok(cancelled)
    }
}
