//! The book's experiments, their specs and their trials, in persistent maps:
//! a copy shares every node with the book's and costs a few reference counts
//! whatever the size, so a read that walks a million trials (a cluster
//! report) runs on a copy off the head's actor while the book changes. A
//! change made while a copy lives copies only the path to what it changes.

use std::ops::Bound;
use std::sync::Arc;

use imbl::OrdMap;
use xp_runtime::ids::{ExperimentId, TrialId};
use xp_runtime::spec::ExperimentSpec;

use crate::{ExperimentRecord, TrialRecord};

/// Experiments, specs and trials, by id; read-only but for the book.
#[derive(Debug, Clone, Default)]
pub(crate) struct Catalog {
    pub(super) experiments: OrdMap<ExperimentId, ExperimentRecord>,
    pub(super) specs: OrdMap<ExperimentId, ExperimentSpec>,
    /// Shared with the registry's committed copy until changed: a finished
    /// trial is held once.
    pub(super) trials: OrdMap<TrialId, Arc<TrialRecord>>,
}

/// Every trial id an experiment can have, for range queries over trials.
pub(super) fn trial_range(experiment: ExperimentId) -> std::ops::RangeInclusive<TrialId> {
    TrialId {
        experiment,
        index: 0,
    }..=TrialId {
        experiment,
        index: u32::MAX,
    }
}

impl Catalog {
    /// An experiment the catalog holds (every trial's and every lookup's is).
    pub(crate) fn experiment(&self, id: ExperimentId) -> &ExperimentRecord {
        self.experiments
            .get(&id)
            .expect("an experiment named by a trial or a lookup is in the book")
    }

    /// An experiment, if the catalog holds it.
    pub(crate) fn get_experiment(&self, id: ExperimentId) -> Option<&ExperimentRecord> {
        self.experiments.get(&id)
    }

    /// Whether the catalog holds the experiment.
    pub(crate) fn contains_experiment(&self, id: ExperimentId) -> bool {
        self.experiments.contains_key(&id)
    }

    /// Every experiment, by id.
    pub(crate) fn experiments(&self) -> impl DoubleEndedIterator<Item = &ExperimentRecord> {
        self.experiments.values()
    }

    /// Every experiment's id, in order.
    pub(crate) fn experiment_ids(&self) -> impl DoubleEndedIterator<Item = ExperimentId> + '_ {
        self.experiments.keys().copied()
    }

    /// How many experiments the catalog holds.
    pub(crate) fn experiment_count(&self) -> usize {
        self.experiments.len()
    }

    /// The spec of an experiment the catalog holds.
    pub(crate) fn spec(&self, experiment: ExperimentId) -> &ExperimentSpec {
        self.specs
            .get(&experiment)
            .expect("every experiment in the book has its spec")
    }

    /// Every experiment's spec, by id.
    pub(crate) fn specs(&self) -> impl Iterator<Item = (&ExperimentId, &ExperimentSpec)> {
        self.specs.iter()
    }

    /// The spec of an experiment, if the catalog holds it.
    pub(crate) fn get_spec(&self, experiment: ExperimentId) -> Option<&ExperimentSpec> {
        self.specs.get(&experiment)
    }

    /// A trial the catalog holds (every attempt's, report's and lookup's is).
    pub(crate) fn trial(&self, id: TrialId) -> &TrialRecord {
        self.trials
            .get(&id)
            .expect("a trial named by an attempt, a report or a lookup is in the book")
            .as_ref()
    }

    /// A trial, if the catalog holds it.
    pub(crate) fn get_trial(&self, id: TrialId) -> Option<&TrialRecord> {
        self.trials.get(&id).map(Arc::as_ref)
    }

    /// Whether the catalog holds the trial.
    pub(crate) fn contains_trial(&self, id: TrialId) -> bool {
        self.trials.contains_key(&id)
    }

    /// Every trial, by id.
    pub(crate) fn trials(&self) -> impl DoubleEndedIterator<Item = &TrialRecord> {
        self.trials.values().map(Arc::as_ref)
    }

    /// The trials of one experiment by index, each with its id.
    pub(crate) fn trials_of(
        &self,
        experiment: ExperimentId,
    ) -> impl DoubleEndedIterator<Item = (&TrialId, &TrialRecord)> {
        self.trials
            .range(trial_range(experiment))
            .map(|(id, trial)| (id, trial.as_ref()))
    }

    /// The trials between two bounds, by id (a page's listing).
    pub(crate) fn trials_between(
        &self,
        start: Bound<TrialId>,
        end: Bound<TrialId>,
    ) -> impl DoubleEndedIterator<Item = &TrialRecord> {
        self.trials
            .range((start, end))
            .map(|(_, trial)| trial.as_ref())
    }

    /// How many trials the catalog holds.
    pub(crate) fn trial_count(&self) -> usize {
        self.trials.len()
    }
}
