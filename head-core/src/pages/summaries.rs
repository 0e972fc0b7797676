//! Experiment summaries kept between reads, so that a listing of experiments
//! does not add up every trial of every experiment on it each time: at a
//! million trials that took 1.1–1.5 s per page.
//!
//! A summary is kept only when none of its trials has a live attempt (a live
//! attempt's GPU-hours grow with its nodes' heartbeats, which change no
//! record), and is used only while the experiment's revision in the book, the
//! prices and the nodes' resources (GPU-hours are priced by GPU model) are
//! those it was made under. Reads take `&HeadCore`, hence the lock; it is
//! never held while a summary is made.
//!
//! Invariant: a summary handed out from here equals the one made afresh
//! (`HeadCore::check_invariants` checks it).

use std::collections::{BTreeMap, HashMap};
use std::sync::{Mutex, PoisonError};

use xp_runtime::ids::ExperimentId;

use super::ExperimentSummary;

/// What a kept summary was made under.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Made {
    /// The experiment's revision in the book.
    pub(crate) revision: u64,
    /// The nodes' resources revision.
    pub(crate) resources: u64,
    /// The prices per GPU-hour by model.
    pub(crate) prices: BTreeMap<String, f64>,
}

/// Summaries of experiments with no live attempt.
#[derive(Debug, Default)]
pub(crate) struct SummaryCache(Mutex<HashMap<ExperimentId, (Made, ExperimentSummary)>>);

impl SummaryCache {
    /// The summary of `id` kept under `made`, if any.
    pub(crate) fn get(&self, id: ExperimentId, made: &Made) -> Option<ExperimentSummary> {
        let kept = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        kept.get(&id)
            .filter(|(kept_made, _)| kept_made == made)
            .map(|(_, summary)| summary.clone())
    }

    /// Keeps `summary` of `id`, made under `made`.
    pub(crate) fn keep(&self, id: ExperimentId, made: Made, summary: ExperimentSummary) {
        self.0
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(id, (made, summary));
    }
}
