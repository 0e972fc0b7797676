//! `xp checkpoints` (`Request::Checkpoints`): a page of the checkpoints an
//! experiment's trials keep, where their copies are and why one is not
//! replicated yet.
//!
//! Access: a viewer reads their own team's.

use xp_runtime::protocol::{CheckpointCursor, Response};

use crate::auth::Action;
use crate::auth::access::{Access, Authorized, Scope};
use crate::{CoreError, HeadCore};

/// What a checkpoints request does: read the experiment it names.
pub(super) fn access(experiment: &str) -> Access {
    Access::new(
        Action::ReadExperiment,
        Scope::ExperimentNamed(experiment.to_owned()),
    )
}

impl HeadCore {
    /// One page of the checkpoints of the experiment authorization resolved.
    pub(super) fn read_checkpoints(
        &self,
        asker: &Authorized,
        experiment: &str,
        after: Option<CheckpointCursor>,
        limit: u32,
    ) -> Result<Response, CoreError> {
        self.checkpoints_page(&asker.pinned(experiment), after, limit)
            .map(Response::CheckpointsPage)
    }
}
