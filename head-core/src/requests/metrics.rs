//! `xp metrics` (`Request::Metrics`): a trial's whole metric history, which
//! the database holds; the core only checks that the trial exists.
//!
//! Access: a viewer reads their own team's trials.

use xp_runtime::ids::TrialId;

use super::StoredRead;
use crate::auth::Action;
use crate::auth::access::{Access, Scope};
use crate::{CoreError, HeadCore};

/// What a metrics request does: read the trial it names.
pub(super) fn access(trial: TrialId) -> Access {
    Access::new(Action::ReadExperiment, Scope::Trial(trial))
}

impl HeadCore {
    /// The stored history of a trial the core knows (the one authorization
    /// judged: the core keeps every trial).
    pub(super) fn read_metrics(&self, trial: TrialId) -> Result<StoredRead, CoreError> {
        self.team_of_trial(trial)?;
        Ok(StoredRead::MetricHistory(trial))
    }
}
