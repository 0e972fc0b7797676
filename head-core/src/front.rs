//! The Pareto front of a multi-objective experiment (`metric: [a, b]`): its
//! objectives and front as `xp status` carries them, and the one trial that
//! stands for the front where one must be named (a pipeline stage's result).
//!
//! A trial's objective vector is the last value it reported of each metric, as
//! a single objective's best trial is judged by its last value; only succeeded
//! trials count, one missing an objective is not on the front, and a non-finite
//! value never counts.
//!
//! A front walks every trial of its experiment (tens of milliseconds at
//! 100,000): `xp status` has it computed off the head's actor
//! (`requests::status::fronts`).

use xp_runtime::ids::{ExperimentId, TrialId};
use xp_runtime::protocol::{FrontStatus, FrontTrial, ObjectiveStatus};
use xp_runtime::spec::{Mode, SearchSpec};
use xp_tune::search::front::{FrontSummary, summarize_front};

use super::HeadCore;
use crate::state::Catalog;

/// The objectives of a multi-objective search; empty for one metric.
pub(crate) fn objectives_status(search: &SearchSpec) -> Vec<ObjectiveStatus> {
    if !search.is_multi_objective() {
        return Vec::new();
    }
    search
        .objectives()
        .into_iter()
        .map(|objective| ObjectiveStatus {
            metric: objective.metric.to_owned(),
            maximize: objective.mode == Mode::Max,
        })
        .collect()
}

impl HeadCore {
    /// The front's trial with the largest hypervolume contribution (the first
    /// of equals): what stands for a multi-objective experiment where one trial
    /// must be named.
    pub(super) fn front_top(&self, id: ExperimentId) -> Option<TrialId> {
        front_summary(&self.book, id)?
            .front
            .first()
            .map(|point| point.key)
    }
}

/// The front of a multi-objective experiment's succeeded trials; `None` for
/// one metric.
fn front_summary(catalog: &Catalog, id: ExperimentId) -> Option<FrontSummary<TrialId>> {
    let search = &catalog.spec(id).search;
    if !search.is_multi_objective() {
        return None;
    }
    let objectives = search.objectives();
    let maximize: Vec<bool> = objectives
        .iter()
        .map(|objective| objective.mode == Mode::Max)
        .collect();
    let candidates: Vec<(TrialId, Vec<Option<f64>>)> = catalog
        .trials_of(id)
        .filter(|(_, trial)| trial.state.ended_normally())
        .map(|(trial_id, trial)| {
            let values = objectives
                .iter()
                .map(|objective| trial.metrics.get(objective.metric).copied())
                .collect();
            (*trial_id, values)
        })
        .collect();
    // Validated specs give 2 to 4 objectives and a finite reference of their
    // length, so this cannot fail; a front is left out rather than the status.
    summarize_front(&candidates, &maximize, search.reference.as_deref()).ok()
}

/// The front as `xp status` carries it; `None` for one metric.
pub(crate) fn front_status(catalog: &Catalog, id: ExperimentId) -> Option<FrontStatus> {
    let summary = front_summary(catalog, id)?;
    Some(FrontStatus {
        reference: summary.reference.unwrap_or_default(),
        reference_declared: summary.reference_declared,
        hypervolume: summary.hypervolume,
        evaluated: u32::try_from(summary.evaluated).unwrap_or(u32::MAX),
        trials: summary
            .front
            .into_iter()
            .map(|point| FrontTrial {
                trial: point.key,
                values: point.values,
                contribution: point.contribution,
            })
            .collect(),
    })
}
