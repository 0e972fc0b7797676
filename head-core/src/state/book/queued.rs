//! The queued trials in the order they were queued: what the dashboard's
//! queue page takes its longest waiting from, instead of walking every
//! unfinished trial (0.3 s at a million waiting, at every poll).
//!
//! Invariant (`Book::check_queued`): a trial the book is not holding out for
//! change is in the index, under its `queued_at`, exactly when it is queued,
//! and each experiment's count is the number of its trials in the index.

use xp_runtime::clock::UnixMillis;
use xp_runtime::ids::{ExperimentId, TrialId};
use xp_runtime::protocol::TrialState;

use crate::TrialRecord;

/// Queued trials by (queued at, id), and how many each experiment has there.
/// Persistent maps, so a read off the actor copies them for a few reference
/// counts.
#[derive(Debug, Clone, Default)]
pub(crate) struct QueuedIndex {
    by_time: imbl::OrdSet<(UnixMillis, TrialId)>,
    per_experiment: imbl::OrdMap<ExperimentId, u64>,
}

impl QueuedIndex {
    /// Indexes `trial` as it is, if queued.
    pub(crate) fn add(&mut self, trial: &TrialRecord) {
        if trial.state == TrialState::Queued
            && self.by_time.insert((trial.queued_at, trial.id)).is_none()
        {
            *self.per_experiment.entry(trial.id.experiment).or_default() += 1;
        }
    }

    /// Takes `trial` out, as it is (before it changes), if indexed.
    pub(crate) fn remove(&mut self, trial: &TrialRecord) {
        if self.contains(trial) {
            self.by_time.remove(&(trial.queued_at, trial.id));
            let experiment = trial.id.experiment;
            match self.per_experiment.get(&experiment).copied() {
                Some(count) if count > 1 => {
                    self.per_experiment.insert(experiment, count - 1);
                }
                _ => {
                    self.per_experiment.remove(&experiment);
                }
            }
        }
    }

    /// Whether `trial`, as it is, is indexed.
    pub(crate) fn contains(&self, trial: &TrialRecord) -> bool {
        self.by_time.contains(&(trial.queued_at, trial.id))
    }

    /// The indexed trials, longest queued first (then by id).
    pub(crate) fn oldest_first(&self) -> impl Iterator<Item = (UnixMillis, TrialId)> + '_ {
        self.by_time.iter().copied()
    }

    /// How many of `experiment`'s trials are indexed.
    pub(crate) fn count_of(&self, experiment: ExperimentId) -> u64 {
        self.per_experiment.get(&experiment).copied().unwrap_or(0)
    }

    /// How many trials are indexed.
    pub(crate) fn len(&self) -> usize {
        self.by_time.len()
    }
}
