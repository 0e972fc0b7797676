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
//! any size makes an answer larger than a frame. A page is made off the
//! actor (`PendingStatus`, from a copy of the book and the nodes): the actor
//! only collects why the queued trials it may hold wait. The unpaged request
//! is answered only when its estimated size fits a frame, and refused before
//! anything is built otherwise. An answer with a multi-objective
//! experiment's first trials carries its front, computed off the actor too.

use std::collections::HashMap;
use std::ops::Bound;

use xp_runtime::ids::{ExperimentId, TrialId};
use xp_runtime::protocol::{ExperimentStatus, Response, StatusCursor, StatusQuery};

use super::Served;
use crate::auth::Action;
use crate::auth::access::{Access, Authorized, Scope};
use crate::{CoreError, HeadCore, TrialRecord};

mod fronts;
mod page;

pub use self::fronts::PendingStatus;
use self::page::StatusPageSource;

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
        let source = StatusPageSource {
            catalog: self.book.catalog(),
            nodes: self.membership.nodes_copy(),
            prices: self.price_list(),
            waiting: self.page_wait_reasons(&ids, query.from),
        };
        Ok(Served::Status(Box::new(PendingStatus::page(
            source, ids, query.from,
        ))))
    }

    /// Why each queued trial that a page of `ids` from `from` may hold
    /// waits: the policy core's reasons, which only the actor can ask, for
    /// the first [`MAX_STATUS_PAGE_TRIALS`] trials from the cursor on.
    fn page_wait_reasons(
        &self,
        ids: &[ExperimentId],
        from: Option<StatusCursor>,
    ) -> HashMap<TrialId, String> {
        let trials = ids.iter().flat_map(|id| {
            let first = from
                .filter(|from| from.experiment == *id)
                .map_or(0, |from| from.trial);
            let start = Bound::Included(TrialId {
                experiment: *id,
                index: first,
            });
            let end = Bound::Included(TrialId {
                experiment: *id,
                index: u32::MAX,
            });
            self.book.trials_between(start, end)
        });
        trials
            .take(MAX_STATUS_PAGE_TRIALS)
            .filter_map(|trial| Some((trial.id, self.waiting_reason(trial)?)))
            .collect()
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
