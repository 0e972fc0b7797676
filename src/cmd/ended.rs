//! How `xp run` and `xp submit --wait` end: their exit status says how the
//! experiment ended, so that a script or a CI job can tell (the codes are in
//! docs/reference/cli.md).
//!
//! 0: every trial ended normally (succeeded, or stopped by an early-stopping
//! rule); 1: `xp` itself failed (a bad spec, a refused submission, no
//! cluster); 2: a usage error; 3: the experiment failed (no trial ended
//! normally); 4: it succeeded but some trials failed; 5: it was cancelled;
//! 130: Ctrl-C stopped `xp run`.

use xp_runtime::protocol::{ExperimentState, ExperimentStatus, TrialState};

/// An experiment that did not end as a success with no failed trial.
#[derive(Debug, thiserror::Error)]
pub(crate) enum Ended {
    /// No trial ended normally.
    #[error("experiment {experiment} failed: {counts}")]
    Failed { experiment: String, counts: String },
    /// Some trials ended normally and some failed.
    #[error("experiment {experiment} succeeded, but {failed} of its {total} trials failed")]
    SomeFailed {
        experiment: String,
        failed: usize,
        total: usize,
    },
    /// A user cancelled it.
    #[error("experiment {experiment} was cancelled")]
    Cancelled { experiment: String },
    /// Ctrl-C stopped the run.
    #[error("interrupted: {finished} of {total} trials had finished")]
    Interrupted { finished: usize, total: usize },
}

impl Ended {
    /// The exit status that says it.
    pub(crate) fn exit_code(&self) -> u8 {
        match self {
            Self::Failed { .. } => 3,
            Self::SomeFailed { .. } => 4,
            Self::Cancelled { .. } => 5,
            Self::Interrupted { .. } => 130,
        }
    }
}

/// Whether the experiment that `status` shows ended as a success with no
/// failed trial.
pub(crate) fn judge(status: &ExperimentStatus) -> Result<(), Ended> {
    let experiment = status.id.to_string();
    let failed = status
        .trials
        .iter()
        .filter(|trial| trial.state == TrialState::Failed)
        .count();
    match status.state {
        ExperimentState::Succeeded if failed == 0 => Ok(()),
        ExperimentState::Succeeded => Err(Ended::SomeFailed {
            experiment,
            failed,
            total: status.trials.len(),
        }),
        ExperimentState::Cancelled => Err(Ended::Cancelled { experiment }),
        ExperimentState::Failed | ExperimentState::Running => Err(Ended::Failed {
            experiment,
            counts: super::status::counts_text(&status.trials),
        }),
    }
}
