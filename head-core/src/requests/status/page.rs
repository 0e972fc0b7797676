//! A status page made off the head's actor (5,000 trials' statuses are
//! about 15 ms of work at a million trials): from a copy of what it reads,
//! the book's and the nodes' persistent maps (a few reference counts), the
//! prices, and why each of its queued trials waits, which only the actor
//! can ask the policy core and which it collects for the page's range.

use std::collections::HashMap;
use std::ops::Bound;

use xp_runtime::ids::{ExperimentId, NodeId, TrialId};
use xp_runtime::protocol::{ExperimentStatus, StatusCursor, StatusPage, TrialStatus};
use xp_tune::report::PriceList;

use super::fronts::header_bytes;
use super::{MAX_STATUS_PAGE_BYTES, MAX_STATUS_PAGE_TRIALS};
use crate::pages::estimated_bytes;
use crate::state::Catalog;
use crate::usage::trial_usage;
use crate::views::{experiment_status_without_trials, trial_status};
use crate::{NodeRecord, TrialRecord};

/// What a status page reads, as it was when the page was asked for.
#[derive(Debug)]
pub(super) struct StatusPageSource {
    pub(super) catalog: Catalog,
    pub(super) nodes: imbl::OrdMap<NodeId, NodeRecord>,
    pub(super) prices: PriceList,
    /// Why each queued trial the page may hold waits.
    pub(super) waiting: HashMap<TrialId, String>,
}

/// A page being filled: its experiments, what it holds so far, and the
/// experiments whose first trials it holds (they carry their front).
struct PageFill {
    experiments: Vec<ExperimentStatus>,
    bytes: usize,
    trials: usize,
    with_front: Vec<ExperimentId>,
}

impl PageFill {
    fn is_full(&self) -> bool {
        self.bytes >= MAX_STATUS_PAGE_BYTES || self.trials >= MAX_STATUS_PAGE_TRIALS
    }

    fn add_trial(&mut self, status: TrialStatus) {
        self.bytes += estimated_bytes(&status);
        self.trials += 1;
        if let Some(experiment) = self.experiments.last_mut() {
            experiment.trials.push(status);
        }
    }
}

impl StatusPageSource {
    /// The page of `ids` (in id order) that starts at `from`, and the
    /// experiments whose front it carries.
    pub(super) fn page(
        &self,
        ids: &[ExperimentId],
        from: Option<StatusCursor>,
    ) -> (StatusPage, Vec<ExperimentId>) {
        let mut fill = PageFill {
            experiments: Vec::new(),
            bytes: 0,
            trials: 0,
            with_front: Vec::new(),
        };
        for id in ids {
            let first = from
                .filter(|from| from.experiment == *id)
                .map_or(0, |from| from.trial);
            if fill.is_full() {
                let next = StatusCursor {
                    experiment: *id,
                    trial: first,
                };
                return finish(fill, Some(next));
            }
            if let Some(next) = self.fill_experiment(&mut fill, *id, first) {
                return finish(fill, Some(next));
            }
        }
        finish(fill, None)
    }

    /// Adds experiment `id` from trial `first` on to the page until it is
    /// full; where the next page starts if it filled inside the experiment.
    fn fill_experiment(
        &self,
        fill: &mut PageFill,
        id: ExperimentId,
        first: u32,
    ) -> Option<StatusCursor> {
        let header = experiment_status_without_trials(&self.catalog, id);
        fill.bytes += header_bytes(&header);
        fill.experiments.push(header);
        if first == 0 {
            fill.with_front.push(id);
        }
        let start = Bound::Included(TrialId {
            experiment: id,
            index: first,
        });
        let end = Bound::Included(TrialId {
            experiment: id,
            index: u32::MAX,
        });
        for trial in self.catalog.trials_between(start, end) {
            if fill.trials > 0 && fill.is_full() {
                return Some(StatusCursor {
                    experiment: id,
                    trial: trial.id.index,
                });
            }
            fill.add_trial(self.trial_status(trial));
        }
        None
    }

    /// One trial as `xp status` shows it.
    fn trial_status(&self, trial: &TrialRecord) -> TrialStatus {
        let usage = trial_usage(|id| self.nodes.get(&id), &self.prices, trial);
        trial_status(trial, usage, self.waiting.get(&trial.id).cloned())
    }
}

fn finish(fill: PageFill, next: Option<StatusCursor>) -> (StatusPage, Vec<ExperimentId>) {
    let page = StatusPage {
        experiments: fill.experiments,
        next,
    };
    (page, fill.with_front)
}
