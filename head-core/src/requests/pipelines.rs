//! `xp pipeline` (`Request::SubmitPipeline`, `PipelineStatus`,
//! `CancelPipeline`, `RetryPipeline`): submit a pipeline of dependent stages,
//! read one or every visible one, cancel its running and waiting stages, or
//! rerun its failed and cancelled stages with their descendants.
//!
//! Access: as for experiments: a member submits into their team (a spec naming
//! no team goes into the submitter's) and cancels or retries their team's
//! pipelines; a viewer reads their team's.

use xp_runtime::clock::UnixMillis;
use xp_runtime::protocol::{PipelineSubmit, Response};

use super::submit::{into_asker_team, spec_team};
use crate::auth::Action;
use crate::auth::access::{Access, Authorized, Scope};
use crate::pipelines::PipelineChange;
use crate::{CoreError, HeadCore};

/// What a pipeline submission does: submit into the team its spec names.
pub(super) fn access_submit(submit: &PipelineSubmit) -> Access {
    Access::new(
        Action::Submit,
        Scope::Submit {
            team: spec_team(&submit.spec_json),
        },
    )
}

/// What a status request does: list pipelines, or read the one it names.
pub(super) fn access_status(pipeline: Option<u64>) -> Access {
    match pipeline {
        None => Access::new(Action::ListExperiments, Scope::Cluster),
        Some(id) => Access::new(Action::ReadExperiment, Scope::Pipeline(id)),
    }
}

/// What a cancel or a retry does: change the pipeline it names.
pub(super) fn access_change(pipeline: u64) -> Access {
    Access::new(Action::Cancel, Scope::Pipeline(pipeline))
}

impl HeadCore {
    /// Submits a pipeline into the team authorization chose.
    pub(super) fn apply_submit_pipeline(
        &mut self,
        now: UnixMillis,
        asker: &Authorized,
        mut submit: PipelineSubmit,
    ) -> Result<Response, CoreError> {
        submit.spec_json = into_asker_team(asker, submit.spec_json)?;
        self.handle_pipeline_change(now, PipelineChange::Submit(submit))
    }

    /// One pipeline, or every one the asker sees.
    pub(super) fn read_pipelines(
        &self,
        now: UnixMillis,
        asker: &Authorized,
        pipeline: Option<u64>,
    ) -> Result<Response, CoreError> {
        let visible = asker.principal.visible_team();
        self.pipelines_status(now, pipeline, &|team| visible.shows(team))
            .map(Response::Pipelines)
    }
}
