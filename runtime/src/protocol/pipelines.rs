//! Pipelines on the wire: a submission, the status of a pipeline and its stages,
//! and the inputs a launch carries from upstream stages.
//!
//! The spec itself travels as canonical JSON (like an experiment's), since its
//! parameter values are dynamically typed. The status types also derive
//! `Serialize` for `xp pipeline status --json` and the HTTP API.
//!
//! Invariant: struct fields and enum variants are append-only (bincode is not
//! self-describing).

use serde::{Deserialize, Serialize};

use super::{CheckpointFile, ObjectSource};
use crate::ids::ExperimentId;

/// `Request::SubmitPipeline`'s body.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct PipelineSubmit {
    /// The pipeline spec in canonical JSON.
    pub spec_json: String,
    /// The code version of every stage.
    pub code_version: String,
    /// The data version of every stage.
    pub data_version: String,
}

/// Where a stage is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum StageState {
    /// Something it needs has not succeeded yet.
    Waiting,
    /// Everything it needs succeeded; its experiment is about to be submitted.
    Ready,
    /// Its experiment runs.
    Running,
    /// Its experiment succeeded.
    Succeeded,
    /// Its experiment failed (or its inputs could not be resolved).
    Failed,
    /// Cancelled by a user, or because a stage it needs failed.
    Cancelled,
    /// An earlier identical stage's result is used instead of running it.
    Reused,
}

impl StageState {
    /// The lowercase name.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Waiting => "waiting",
            Self::Ready => "ready",
            Self::Running => "running",
            Self::Succeeded => "succeeded",
            Self::Failed => "failed",
            Self::Cancelled => "cancelled",
            Self::Reused => "reused",
        }
    }

    /// Whether its result is available to the stages that need it.
    pub fn has_result(self) -> bool {
        matches!(self, Self::Succeeded | Self::Reused)
    }

    /// Whether it will not change without a retry.
    pub fn is_terminal(self) -> bool {
        matches!(
            self,
            Self::Succeeded | Self::Failed | Self::Cancelled | Self::Reused
        )
    }
}

/// The stage a reused stage took its result from.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReusedFrom {
    /// The pipeline.
    pub pipeline: u64,
    /// The stage.
    pub stage: String,
}

/// One resolved reference of a stage: `{sweep.best.params.x}` and its value
/// (a directory reference's value names the upstream files instead).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StageInput {
    /// The reference, without braces.
    pub reference: String,
    /// Its value, or for a directory the number of files.
    pub value: String,
}

/// One stage as `xp pipeline status` shows it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StageStatus {
    /// Its name.
    pub name: String,
    /// Where it is.
    pub state: StageState,
    /// The stages it needs.
    pub needs: Vec<String>,
    /// Its experiment, once submitted.
    pub experiment: Option<ExperimentId>,
    /// Why it is in its state (why it waits, why it was cancelled).
    pub reason: String,
    /// Where its result came from, when reused.
    pub reused_from: Option<ReusedFrom>,
    /// Its resolved references.
    pub inputs: Vec<StageInput>,
    /// The files its best (or only) trial wrote under `XP_OUTPUT_DIR`.
    pub outputs: Vec<CheckpointFile>,
    /// Its best configuration's parameters as JSON, once finished.
    pub best_params_json: Option<String>,
    /// Its best trial's metrics, once finished.
    pub best_metrics: Vec<(String, f64)>,
    /// Its estimated duration in seconds, when known.
    pub estimate_s: Option<f64>,
    /// Whether it lies on the critical path.
    pub critical: bool,
    /// Its cache identity (blake3, hex), once everything it needs has a result.
    pub identity: Option<String>,
}

/// A pipeline as `xp pipeline status` shows it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PipelineStatus {
    /// Its id.
    pub id: u64,
    /// Its name.
    pub name: String,
    /// Its team.
    pub team: String,
    /// `running`, `succeeded`, `failed` or `cancelled`.
    pub state: String,
    /// When it was submitted (Unix milliseconds).
    pub submitted_at: u64,
    /// Its stages in execution order.
    pub stages: Vec<StageStatus>,
    /// The stages on the longest remaining path, in order.
    pub critical_path: Vec<String>,
    /// The estimated time left in seconds (unlimited capacity), when every
    /// unfinished stage has an estimate.
    pub remaining_s: Option<f64>,
    /// The estimated finish (Unix milliseconds), when `remaining_s` is known.
    pub estimated_finish: Option<u64>,
}

/// A directory of upstream files a launch carries: the node fetches each
/// object (verified by its hash), writes the files into a directory of the
/// worker's that the worker cannot change, and replaces `marker` in the
/// worker's argv with that directory's absolute path.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LaunchInput {
    /// The directory's name under the worker's `XP_INPUT_DIR` (`STAGE.outputs`).
    pub name: String,
    /// The text to replace in argv (`spec::input_marker`).
    pub marker: String,
    /// The files.
    pub files: Vec<CheckpointFile>,
    /// Nodes holding its objects, best first.
    pub sources: Vec<ObjectSource>,
}

impl PipelineStatus {
    /// The JSON of `xp pipeline status --json` and `/api/pipelines`: the
    /// serde form with experiment and object ids written as their text.
    pub fn to_json(&self) -> serde_json::Value {
        let mut value = serde_json::to_value(self).expect("a status of plain data serialises");
        if let Some(stages) = value
            .get_mut("stages")
            .and_then(serde_json::Value::as_array_mut)
        {
            for (stage, status) in stages.iter_mut().zip(&self.stages) {
                stage["experiment"] = status
                    .experiment
                    .map_or(serde_json::Value::Null, |id| id.to_string().into());
                stage["outputs"] = status
                    .outputs
                    .iter()
                    .map(|file| {
                        serde_json::json!({
                            "name": file.name,
                            "object": file.object.to_string(),
                            "size": file.size,
                        })
                    })
                    .collect();
            }
        }
        value
    }
}
