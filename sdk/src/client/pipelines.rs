//! Pipelines from a driver: submit one (its code and data versions computed
//! here, as for an experiment), read its status, cancel, retry, and wait for it.

use std::path::Path;
use std::time::Duration;

use xp_runtime::protocol::{PipelineStatus, PipelineSubmit, Request, Response};
use xp_runtime::spec::PipelineSpec;

use super::{Client, SdkError};
use crate::versioning::{code_version, data_version};

/// How often [`Client::wait_pipeline`] asks for the status.
const WAIT_POLL: Duration = Duration::from_secs(1);

/// A submitted pipeline.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PipelineSubmitted {
    /// Its id.
    pub pipeline: u64,
    /// Its stages.
    pub stages: u32,
    /// How many of them reuse an earlier identical stage's result.
    pub reused: u32,
}

impl Client {
    /// Submits `spec`; its `code` and `data` paths are relative to `base_dir`.
    pub async fn submit_pipeline(
        &self,
        spec: &PipelineSpec,
        base_dir: &Path,
    ) -> Result<PipelineSubmitted, SdkError> {
        spec.validate()?;
        let code = match &spec.code {
            Some(dir) => code_version(&base_dir.join(dir))?,
            None => "none".to_owned(),
        };
        let data = data_version(base_dir, &spec.data)?;
        // Workers run in their own directories: stages' relative paths are
        // found where the pipeline was submitted from.
        let mut spec = spec.clone();
        let base = std::path::absolute(base_dir).unwrap_or_else(|_| base_dir.to_owned());
        for stage in spec.stages.values_mut() {
            stage.trial.fill_command_dir(&base);
        }
        let request = Request::SubmitPipeline(PipelineSubmit {
            spec_json: spec.to_canonical_json(),
            code_version: code,
            data_version: data,
        });
        expect_response!(self.request(request).await?,
            Response::PipelineSubmitted { pipeline, stages, reused } => PipelineSubmitted { pipeline, stages, reused })
    }

    /// One pipeline's status.
    pub async fn pipeline_status(&self, pipeline: u64) -> Result<PipelineStatus, SdkError> {
        let list = expect_response!(
            self.request(Request::PipelineStatus { pipeline: Some(pipeline) }).await?,
            Response::Pipelines(list) => list
        )?;
        list.into_iter()
            .next()
            .ok_or_else(|| SdkError::Unexpected(format!("no status for pipeline {pipeline}")))
    }

    /// Every pipeline the caller may see, newest first.
    pub async fn pipelines(&self) -> Result<Vec<PipelineStatus>, SdkError> {
        expect_response!(
            self.request(Request::PipelineStatus { pipeline: None }).await?,
            Response::Pipelines(list) => list
        )
    }

    /// Cancels a pipeline's running and waiting stages; returns how many.
    pub async fn cancel_pipeline(&self, pipeline: u64) -> Result<u32, SdkError> {
        expect_response!(
            self.request(Request::CancelPipeline { pipeline }).await?,
            Response::PipelineChanged { stages } => stages
        )
    }

    /// Reruns a pipeline's failed and cancelled stages, those whose outputs no
    /// live node holds, and their descendants, reusing the rest; returns how
    /// many stages were reset.
    pub async fn retry_pipeline(&self, pipeline: u64) -> Result<u32, SdkError> {
        expect_response!(
            self.request(Request::RetryPipeline { pipeline }).await?,
            Response::PipelineChanged { stages } => stages
        )
    }

    /// Waits until no stage of the pipeline runs or waits, calling `on_status`
    /// with each status seen; returns the last.
    pub async fn wait_pipeline(
        &self,
        pipeline: u64,
        mut on_status: impl FnMut(&PipelineStatus),
    ) -> Result<PipelineStatus, SdkError> {
        loop {
            let status = self.pipeline_status(pipeline).await?;
            on_status(&status);
            if status.state != "running" {
                return Ok(status);
            }
            tokio::time::sleep(WAIT_POLL).await;
        }
    }
}
