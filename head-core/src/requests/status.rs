//! `xp status` (`Request::StatusPage`, and the unpaged `Request::Status`):
//! one experiment, or every experiment the asker sees.
//!
//! Access: a viewer reads their own team's experiments; a list shows only
//! what the asker sees (all of it for an admin).
//!
//! A page holds experiments in id order with their trials in index order,
//! until the trials' estimated size passes [`MAX_STATUS_PAGE_BYTES`] or they
//! number [`MAX_STATUS_PAGE_TRIALS`] (always at least one trial, or one
//! experiment without trials, so every page moves on); its cursor is the
//! experiment and trial index where the next page starts. So no listing of
//! any size makes an answer larger than a frame, and a page costs the actor
//! only what it holds (plus one pass over the experiment's trials for its
//! state). The unpaged request is answered only when its estimated size fits
//! a frame, and refused before anything is built otherwise. An answer with a
//! multi-objective experiment's first trials carries its front, computed off
//! the actor (`PendingFronts`).

use std::ops::Bound;

use xp_runtime::ids::{ExperimentId, TrialId};
use xp_runtime::protocol::{
    ExperimentStatus, Response, StatusCursor, StatusPage, StatusQuery, TrialStatus,
};

use self::fronts::header_bytes;
use super::Served;
use crate::auth::Action;
use crate::auth::access::{Access, Authorized, Scope};
use crate::pages::estimated_bytes;
use crate::{CoreError, HeadCore, TrialRecord};

mod fronts;

pub use self::fronts::PendingFronts;

/// A status page ends, with a cursor, once its trials' estimated size
/// passes this (a quarter of a frame, so an estimate that is off by a factor
/// still fits).
pub(crate) const MAX_STATUS_PAGE_BYTES: usize = 4 << 20;
/// The largest frame (`xp_runtime::frame::MAX_FRAME_BYTES`, which this pure
/// crate cannot name: `frame` is behind the runtime's `net` feature).
const MAX_FRAME_BYTES: usize = 16 << 20;
/// A status page holds at most this many trials.
pub(crate) const MAX_STATUS_PAGE_TRIALS: usize = 5_000;

/// What a status request does: list experiments, or read the one it names.
pub(super) fn access(experiment: Option<&str>) -> Access {
    match experiment {
        None => Access::new(Action::ListExperiments, Scope::Cluster),
        Some(text) => Access::new(
            Action::ReadExperiment,
            Scope::ExperimentNamed(text.to_owned()),
        ),
    }
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

impl HeadCore {
    /// The experiment authorization resolved, or every one the asker sees,
    /// in one answer, if it fits one frame.
    pub(super) fn read_status(
        &self,
        asker: &Authorized,
        experiment: Option<String>,
    ) -> Result<Served, CoreError> {
        let ids = self.status_ids(asker, experiment.as_deref())?;
        let bytes: usize = ids
            .iter()
            .flat_map(|id| self.book.trials_of(*id))
            .map(|(_, trial)| estimated_record_bytes(trial))
            .sum();
        if bytes > MAX_FRAME_BYTES {
            return Err(CoreError::StatusTooLarge {
                bytes: bytes as u64,
                limit: MAX_FRAME_BYTES as u64,
            });
        }
        let statuses = ids.iter().map(|id| self.experiment_status(*id)).collect();
        Ok(self.with_fronts(Response::Status(statuses), ids))
    }

    /// One page of the experiment authorization resolved, or of every one
    /// the asker sees, from the query's cursor.
    pub(super) fn read_status_page(
        &self,
        asker: &Authorized,
        query: StatusQuery,
    ) -> Result<Served, CoreError> {
        let mut ids = self.status_ids(asker, query.experiment.as_deref())?;
        if let Some(from) = query.from {
            ids.retain(|id| *id >= from.experiment);
        }
        let (page, with_front) = self.status_page(&ids, query.from);
        Ok(self.with_fronts(Response::StatusPage(page), with_front))
    }

    /// The page of `ids` (in id order) that starts at `from`, and the
    /// experiments whose front it carries.
    fn status_page(
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
                return page(fill, Some(next));
            }
            if let Some(next) = self.fill_experiment(&mut fill, *id, first) {
                return page(fill, Some(next));
            }
        }
        page(fill, None)
    }

    /// Adds experiment `id` from trial `first` on to the page until it is
    /// full; where the next page starts if it filled inside the experiment.
    fn fill_experiment(
        &self,
        fill: &mut PageFill,
        id: ExperimentId,
        first: u32,
    ) -> Option<StatusCursor> {
        let header = self.experiment_status_without_trials(id);
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
        for trial in self.book.trials_between(start, end) {
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

    /// The experiments a status request shows, in id order: the one it names
    /// (resolved among what the asker sees), or every one the asker sees.
    fn status_ids(
        &self,
        asker: &Authorized,
        experiment: Option<&str>,
    ) -> Result<Vec<ExperimentId>, CoreError> {
        match experiment {
            Some(text) => Ok(vec![self.resolve_experiment(&asker.pinned(text))?]),
            None => {
                let visible = asker.principal.visible_team();
                Ok(self
                    .book
                    .specs()
                    .filter(|(_, spec)| visible.shows(&spec.team))
                    .map(|(id, _)| *id)
                    .collect())
            }
        }
    }

    /// Experiments matching `filter` (an id or unique prefix), or all, with
    /// their fronts.
    pub fn status(&self, filter: Option<&str>) -> Result<Vec<ExperimentStatus>, CoreError> {
        let ids: Vec<ExperimentId> = match filter {
            Some(text) => vec![self.resolve_experiment(text)?],
            None => self.book.experiment_ids().collect(),
        };
        let mut statuses: Vec<ExperimentStatus> =
            ids.iter().map(|id| self.experiment_status(*id)).collect();
        self.add_fronts(&mut statuses);
        Ok(statuses)
    }
}

fn page(fill: PageFill, next: Option<StatusCursor>) -> (StatusPage, Vec<ExperimentId>) {
    let page = StatusPage {
        experiments: fill.experiments,
        next,
    };
    (page, fill.with_front)
}

/// A trial's size in a status answer, estimated from its record without
/// building the answer (the unpaged request's check).
fn estimated_record_bytes(trial: &TrialRecord) -> usize {
    let attempts: usize = trial
        .attempts
        .iter()
        .map(|attempt| {
            64 + attempt.outcome.as_deref().map_or(0, str::len) + 17 * attempt.workers.len()
        })
        .sum();
    let metrics: usize = trial.metrics.keys().map(|name| name.len() + 10).sum();
    100 + trial.config_json.len() + trial.reason.as_deref().map_or(0, str::len) + attempts + metrics
}

#[cfg(test)]
mod tests;
