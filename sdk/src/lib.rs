//! What xp drivers and trial code link. **API boundary.**
//!
//! - Drivers use [`Client`] to submit experiments, watch their events, read
//!   results and logs, and cancel.
//! - Trial code uses [`TrialContext`] to read its configuration and report
//!   metrics, and a driver binary registers Rust trainables with [`Trainables`] so
//!   that nodes can re-execute it in worker mode.
//!
//! This crate depends only on `xp-runtime` (no actor system), so worker processes
//! stay light.
#![warn(missing_docs)]

mod client;
mod versioning;
mod worker;

pub use client::{
    Client, DEFAULT_ADMISSION_WAIT, PipelineSubmitted, ResultRow, SdkError, SubmitOptions,
    Submitted,
};
pub use versioning::{VersionError, code_version, data_version};
pub use worker::{BoxError, Trainables, TrialContext, WorkerError};
pub use xp_runtime::collective::{BlockingCommunicator, ReduceOp};
pub use xp_runtime::ids::{ExperimentId, NodeId, ObjectId, TrialId};
pub use xp_runtime::protocol::{
    ExperimentState, ExperimentStatus, NodeStatus, TrialEvent, TrialState, TrialStatus,
};
pub use xp_runtime::protocol::{PipelineStatus, StageState, StageStatus};
pub use xp_runtime::spec::{
    ExperimentSpec, ParamValue, PipelineSpec, Resources, SearchSpec, TrialSpec,
};
