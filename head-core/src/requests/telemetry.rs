//! `xp status TRIAL`'s telemetry (`Request::Telemetry`): each rank's
//! downsampled series, which the database holds.
//!
//! Access: a viewer reads their own team's trials.

use xp_runtime::ids::TrialId;

use super::StoredRead;
use crate::auth::Action;
use crate::auth::access::{Access, Scope};
use crate::{CoreError, HeadCore};

/// What a telemetry request does: read the trial it names.
pub(super) fn access(trial: TrialId) -> Access {
    Access::new(Action::ReadExperiment, Scope::Trial(trial))
}

impl HeadCore {
    /// The stored series of a trial the core knows.
    pub(super) fn read_telemetry(&self, trial: TrialId) -> Result<StoredRead, CoreError> {
        if !self.book.contains_trial(trial) {
            return Err(CoreError::TrialNotFound { trial_id: trial });
        }
        Ok(StoredRead::Telemetry(trial))
    }
}
