//! `xp metrics` (`Request::Metrics`): a page of a trial's metric history,
//! which the database holds; the core only checks that the trial exists and
//! bounds the page.
//!
//! Access: a viewer reads their own team's trials.

use xp_runtime::ids::TrialId;

use super::StoredRead;
use crate::auth::Action;
use crate::auth::access::{Access, Scope};
use crate::{CoreError, HeadCore};

/// The most metric reports one page carries (and at most about
/// [`crate::pages::MAX_PAGE_BYTES`] of them).
pub const MAX_METRICS_PER_PAGE: usize = 10_000;

/// What a metrics request does: read the trial it names.
pub(super) fn access(trial: TrialId) -> Access {
    Access::new(Action::ReadExperiment, Scope::Trial(trial))
}

impl HeadCore {
    /// A page of the stored history of a trial the core knows (the one
    /// authorization judged: the core keeps every trial).
    pub(super) fn read_metrics(
        &self,
        trial: TrialId,
        after: Option<u64>,
        limit: u32,
    ) -> Result<StoredRead, CoreError> {
        self.team_of_trial(trial)?;
        let limit = usize::try_from(limit).unwrap_or(usize::MAX);
        Ok(StoredRead::MetricHistory {
            trial,
            after,
            limit: limit.clamp(1, MAX_METRICS_PER_PAGE),
        })
    }
}
