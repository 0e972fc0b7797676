//! `xp report` (`Request::Report`): GPU-hours, cost, waiting and what was
//! lost, of one experiment, one team or the cluster.
//!
//! Access: a viewer reads their own team's experiments and team report; the
//! cluster's report is an admin's. The report is computed by the shell
//! (`StoredRead::Report`): busy GPU-time comes from stored telemetry.

use xp_runtime::protocol::ReportRequest;

use super::StoredRead;
use crate::auth::Action;
use crate::auth::access::{Access, Authorized, Scope};

/// What a report request does: read its experiment, its team, or the cluster.
pub(super) fn access(report: &ReportRequest) -> Access {
    match (&report.experiment, &report.team) {
        (Some(text), _) => {
            Access::new(Action::ReadExperiment, Scope::ExperimentNamed(text.clone()))
        }
        (None, Some(team)) => Access::new(Action::ReadExperiment, Scope::Team(team.clone())),
        (None, None) => Access::new(Action::ReadClusterReport, Scope::Cluster),
    }
}

/// The report of what authorization resolved, as the asker may see it.
pub(super) fn read(asker: &Authorized, mut request: ReportRequest) -> StoredRead {
    request.experiment = request.experiment.map(|text| asker.pinned(&text));
    StoredRead::Report {
        request,
        visible: asker.principal.visible_team(),
    }
}
