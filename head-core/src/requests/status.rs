//! `xp status` (`Request::Status`): one experiment, or every experiment the
//! asker sees.
//!
//! Access: a viewer reads their own team's experiments; a list shows only
//! what the asker sees (all of it for an admin).

use xp_runtime::ids::ExperimentId;
use xp_runtime::protocol::{ExperimentStatus, Response};

use crate::auth::Action;
use crate::auth::access::{Access, Authorized, Scope};
use crate::{CoreError, HeadCore};

/// What a status request does: list experiments, or read the one it names.
pub(super) fn access(experiment: Option<&str>) -> Access {
    match experiment {
        None => Access::new(Action::ListExperiments, Scope::Cluster),
        Some(text) => Access::new(
            Action::ReadExperiment,
            Scope::ExperimentNamed(text.to_owned()),
        ),
    }
}

impl HeadCore {
    /// The experiment authorization resolved, or every one the asker sees.
    pub(super) fn read_status(
        &self,
        asker: &Authorized,
        experiment: Option<String>,
    ) -> Result<Response, CoreError> {
        let Some(text) = experiment else {
            let visible = asker.principal.visible_team();
            let list = self
                .book
                .specs()
                .filter(|(_, spec)| visible.shows(&spec.team))
                .map(|(id, _)| self.experiment_status(*id))
                .collect();
            return Ok(Response::Status(list));
        };
        self.status(Some(&asker.pinned(&text)))
            .map(Response::Status)
    }

    /// Experiments matching `filter` (an id or unique prefix), or all.
    pub fn status(&self, filter: Option<&str>) -> Result<Vec<ExperimentStatus>, CoreError> {
        let ids: Vec<ExperimentId> = match filter {
            Some(text) => vec![self.resolve_experiment(text)?],
            None => self.book.experiment_ids().collect(),
        };
        Ok(ids
            .into_iter()
            .map(|id| self.experiment_status(id))
            .collect())
    }
}
