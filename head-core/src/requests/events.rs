//! `xp submit --wait`'s and `xp run`'s event feed (`Request::Events`): an
//! experiment's events after the last one the asker has, waiting (bounded)
//! for new ones when there are none; and one trial's newest events
//! (`Request::TrialEvents`, for `xp status EXPERIMENT-tN`).
//!
//! Access: a viewer reads their own team's experiments.
//!
//! The events are read from the store by the shell, which holds it (a head
//! that ran a million trials has five million). The wait is the server's
//! (`ConnectionWork::AwaitEvents`): it names the newest event stored when the
//! read found none, so that an event stored between the read and the wait is
//! never missed.

use xp_runtime::ids::{ExperimentId, TrialId};

use super::{Served, StoredRead};
use crate::auth::Action;
use crate::auth::access::{Access, Scope};
use crate::{CoreError, HeadCore};

/// The most events one answer carries: a feed that is behind asks again.
pub const MAX_EVENTS_PER_ANSWER: usize = 1000;

/// What an events request does: read the experiment it names.
pub(super) fn access(experiment: ExperimentId) -> Access {
    Access::new(Action::ReadExperiment, Scope::Experiment(experiment))
}

/// What a trial's events request does: read the trial it names.
pub(super) fn access_trial(trial: TrialId) -> Access {
    Access::new(Action::ReadExperiment, Scope::Trial(trial))
}

impl HeadCore {
    /// The events after `after`, read from the store (the core keeps none);
    /// the shell turns an empty answer with `wait_ms` > 0 into a wait.
    pub(super) fn read_events(
        &self,
        experiment: ExperimentId,
        after: u64,
        wait_ms: u32,
    ) -> Result<Served, CoreError> {
        if !self.book.contains_experiment(experiment) {
            return Err(CoreError::ExperimentNotFound {
                experiment_id: experiment,
            });
        }
        Ok(Served::Stored(StoredRead::Events {
            experiment,
            after,
            wait_ms,
        }))
    }

    /// The newest `limit` events of a trial the core knows, read from the
    /// store (at most [`MAX_EVENTS_PER_ANSWER`]).
    pub(super) fn read_trial_events(
        &self,
        trial: TrialId,
        limit: u32,
    ) -> Result<Served, CoreError> {
        self.team_of_trial(trial)?;
        let limit = usize::try_from(limit).map_or(MAX_EVENTS_PER_ANSWER, |limit| {
            limit.min(MAX_EVENTS_PER_ANSWER)
        });
        Ok(Served::Stored(StoredRead::TrialEvents { trial, limit }))
    }
}
