//! `xp alerts` (`Request::Alerts`): one experiment's alerts, or those of every
//! experiment the asker sees, newest first.
//!
//! Access: a viewer reads their own team's.

use xp_runtime::protocol::Response;

use crate::auth::Action;
use crate::auth::access::{Access, Authorized, Scope};
use crate::{CoreError, HeadCore};

/// What an alerts request does: list, or read the experiment it names.
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
    /// The alerts of what authorization resolved, as the asker may see them.
    pub(super) fn read_alerts(
        &self,
        asker: &Authorized,
        experiment: Option<String>,
    ) -> Result<Response, CoreError> {
        let visible = asker.principal.visible_team();
        let experiment = experiment.map(|text| asker.pinned(&text));
        self.alerts_list(experiment.as_deref(), &|team| visible.shows(team))
            .map(Response::Alerts)
    }
}
