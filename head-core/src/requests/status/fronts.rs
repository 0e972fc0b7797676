//! Status answers made off the head's actor: a page (its 5,000 trials'
//! statuses) and the fronts it carries (a front walks every trial of its
//! experiment, tens of milliseconds at 100,000) leave the core as a
//! [`PendingStatus`] with a copy of what they read (cheap whatever its size:
//! the book's and the nodes' maps are persistent), and so does an unpaged
//! answer's fronts.

use xp_runtime::ids::ExperimentId;
use xp_runtime::protocol::{ExperimentStatus, Response, StatusCursor, StatusPage};

use super::MAX_STATUS_PAGE_BYTES;
use super::page::StatusPageSource;
use crate::HeadCore;
use crate::front::front_status;
use crate::pages::estimated_bytes;
use crate::requests::Served;
use crate::state::Catalog;

/// A status answer still to be made, or whose multi-objective experiments
/// still lack their fronts, with what it reads as it was when asked for.
#[derive(Debug)]
pub struct PendingStatus(Pending);

#[derive(Debug)]
enum Pending {
    /// An unpaged answer without its fronts.
    Fronts {
        catalog: Catalog,
        answer: Response,
        /// The experiments of the answer that carry a front.
        wanted: Vec<ExperimentId>,
    },
    /// The page of `ids` (in id order) from `from`, with its fronts.
    Page {
        source: Box<StatusPageSource>,
        ids: Vec<ExperimentId>,
        from: Option<StatusCursor>,
    },
}

impl PendingStatus {
    /// The page of `ids` from `from`, made from `source`.
    pub(super) fn page(
        source: StatusPageSource,
        ids: Vec<ExperimentId>,
        from: Option<StatusCursor>,
    ) -> Self {
        Self(Pending::Page {
            source: Box::new(source),
            ids,
            from,
        })
    }

    /// The answer with its fronts. A page that the fronts take over its
    /// budget gives up its last trials (and experiments) to the next page,
    /// keeping at least one.
    pub fn complete(self) -> Response {
        match self.0 {
            Pending::Fronts {
                catalog,
                mut answer,
                wanted,
            } => {
                if let Response::Status(experiments) = &mut answer {
                    add_fronts(&catalog, experiments, &wanted);
                }
                answer
            }
            Pending::Page { source, ids, from } => {
                let (mut page, mut with_front) = source.page(&ids, from);
                with_front.retain(|id| source.catalog.spec(*id).search.is_multi_objective());
                add_fronts(&source.catalog, &mut page.experiments, &with_front);
                trim_to_budget(&mut page);
                Response::StatusPage(page)
            }
        }
    }
}

impl HeadCore {
    /// `answer` (an unpaged status) as served: at once when none of
    /// `wanted` (the experiments in it that carry a front) is
    /// multi-objective, else without its fronts.
    pub(super) fn with_fronts(&self, answer: Response, mut wanted: Vec<ExperimentId>) -> Served {
        wanted.retain(|id| self.book.spec(*id).search.is_multi_objective());
        if wanted.is_empty() {
            return Served::Answer(answer);
        }
        Served::Status(Box::new(PendingStatus(Pending::Fronts {
            catalog: self.book.catalog(),
            answer,
            wanted,
        })))
    }

    /// Adds the fronts of the multi-objective experiments among `experiments`
    /// here and now (`HeadCore::status`: `xp status --data-dir` and tests,
    /// with no actor to hold up).
    pub(super) fn add_fronts(&self, experiments: &mut [ExperimentStatus]) {
        let every: Vec<ExperimentId> = experiments.iter().map(|experiment| experiment.id).collect();
        add_fronts(&self.book, experiments, &every);
    }
}

/// Sets the front of each of `experiments` named in `wanted` (`None` for
/// one metric).
fn add_fronts(catalog: &Catalog, experiments: &mut [ExperimentStatus], wanted: &[ExperimentId]) {
    for experiment in experiments {
        if wanted.contains(&experiment.id) {
            experiment.front = front_status(catalog, experiment.id);
        }
    }
}

/// An experiment's header in a status page, as the page's budget counts it.
pub(super) fn header_bytes(experiment: &ExperimentStatus) -> usize {
    512 + experiment
        .front
        .as_ref()
        .map_or(0, |front| 64 * front.trials.len())
}

/// Moves the page's last trials (and experiments left without trials) to the
/// next page until its estimated size is within [`MAX_STATUS_PAGE_BYTES`] or
/// it holds one experiment with at most one trial.
pub(super) fn trim_to_budget(page: &mut StatusPage) {
    let mut bytes: usize = page
        .experiments
        .iter()
        .map(|experiment| {
            header_bytes(experiment) + experiment.trials.iter().map(estimated_bytes).sum::<usize>()
        })
        .sum();
    while bytes > MAX_STATUS_PAGE_BYTES {
        let alone = page.experiments.len() == 1;
        let Some(last) = page.experiments.last_mut() else {
            return;
        };
        if alone && last.trials.len() <= 1 {
            return;
        }
        // An experiment left without trials here is not the page's first,
        // so not one continued from the page before: it starts at trial 0.
        let (experiment, trial) = match last.trials.pop() {
            Some(trial) => {
                bytes -= estimated_bytes(&trial);
                (last.id, trial.id.index)
            }
            None => {
                bytes -= header_bytes(last);
                let id = last.id;
                page.experiments.pop();
                (id, 0)
            }
        };
        page.next = Some(StatusCursor { experiment, trial });
    }
}
