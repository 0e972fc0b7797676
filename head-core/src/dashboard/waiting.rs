//! The dashboard's queue page (`/api/waiting`): queued trials of the visible
//! experiments, longest waiting first, each with its queue and why it waits.
//!
//! Finding the longest waiting walks every unfinished trial (about 0.3 s at
//! a million waiting), so it is done off the actor on a [`WaitingSnapshot`]
//! (copies of the book's persistent maps and of its set of unfinished
//! trials: a few reference counts); the actor then only says why each of
//! the few chosen waits (the policy core's reason), in
//! [`HeadCore::waiting_items`].

use std::collections::{BTreeSet, BinaryHeap};

use serde_json::{Value, json};
use xp_runtime::clock::UnixMillis;
use xp_runtime::ids::{ExperimentId, TrialId};
use xp_runtime::protocol::TrialState;

use crate::HeadCore;
use crate::state::Catalog;

/// What the queue page's choice reads, as it was when taken.
#[derive(Debug, Clone)]
pub struct WaitingSnapshot {
    catalog: Catalog,
    active: imbl::OrdSet<TrialId>,
    visible: BTreeSet<ExperimentId>,
}

impl WaitingSnapshot {
    /// The queued trials of the visible experiments that have waited
    /// longest (since they were queued, then by id), at most `limit` (at
    /// least one when any waits), and how many are queued in all.
    pub fn longest_waiting(&self, limit: usize) -> (Vec<TrialId>, usize) {
        // The longest waiting so far, the latest of them on top: memory in
        // `limit`, not in the number waiting.
        let keep = limit.max(1);
        let mut longest: BinaryHeap<(UnixMillis, TrialId)> = BinaryHeap::new();
        let mut total = 0;
        let queued = self
            .active
            .iter()
            .filter(|id| self.visible.contains(&id.experiment))
            .filter_map(|id| self.catalog.get_trial(*id))
            .filter(|trial| trial.state == TrialState::Queued);
        for trial in queued {
            total += 1;
            longest.push((trial.queued_at, trial.id));
            if longest.len() > keep {
                longest.pop();
            }
        }
        let chosen = longest.into_sorted_vec().into_iter().map(|(_, id)| id);
        (chosen.collect(), total)
    }
}

impl HeadCore {
    /// What the queue page reads for a caller who sees `visible_team`'s
    /// experiments; cheap whatever the number of trials.
    pub fn waiting_snapshot(&self, visible_team: &dyn Fn(&str) -> bool) -> WaitingSnapshot {
        WaitingSnapshot {
            catalog: self.book.catalog(),
            active: self.book.active_ids(),
            visible: self
                .book
                .specs()
                .filter(|(_, spec)| visible_team(&spec.team))
                .map(|(id, _)| *id)
                .collect(),
        }
    }

    /// The queue page of `chosen` (from [`WaitingSnapshot::longest_waiting`],
    /// in its order) out of `total`: each still queued with its queue and
    /// why it waits.
    pub fn waiting_items(&self, chosen: &[TrialId], total: usize) -> Value {
        let items: Vec<Value> = chosen
            .iter()
            .filter_map(|id| self.book.get_trial(*id))
            .filter(|trial| trial.state == TrialState::Queued)
            .map(|trial| {
                let queue = trial
                    .queue_override
                    .clone()
                    .or_else(|| self.book.spec(trial.id.experiment).queue.clone());
                json!({
                    "trial": trial.id.to_string(),
                    "experiment": trial.id.experiment.to_string(),
                    "queue": queue,
                    "queued_at_ms": trial.queued_at,
                    "waiting": self.waiting_reason(trial),
                })
            })
            .collect();
        json!({ "items": items, "total": total })
    }
}
