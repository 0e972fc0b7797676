//! The dashboard's queue page (`/api/waiting`): queued trials of the visible
//! experiments, longest waiting first, each with its queue and why it waits.
//!
//! The longest waiting come from the book's index of queued trials by when
//! they were queued, so a page looks at about as many trials as it shows
//! (and at those of experiments the caller does not see that queued
//! earlier), not at every unfinished trial (0.3 s at a million waiting).
//! The choice is still made off the actor, on a [`WaitingSnapshot`] (copies
//! of the book's persistent maps and of the index: a few reference counts);
//! the actor then only says why each of the few chosen waits (the policy
//! core's reason), in [`HeadCore::waiting_items`].

use std::collections::BTreeSet;

use serde_json::{Value, json};
use xp_runtime::clock::UnixMillis;
use xp_runtime::ids::{ExperimentId, TrialId};
use xp_runtime::protocol::TrialState;

use crate::HeadCore;
use crate::state::{Catalog, QueuedIndex};

/// What the queue page's choice reads, as it was when taken.
#[derive(Debug, Clone)]
pub struct WaitingSnapshot {
    catalog: Catalog,
    queued: QueuedIndex,
    /// Trials changed since the index last took them: the index may lack
    /// them or hold them as they were, so they are looked at one by one.
    changed: BTreeSet<TrialId>,
    visible: BTreeSet<ExperimentId>,
}

impl WaitingSnapshot {
    /// The queued trials of the visible experiments that have waited
    /// longest (since they were queued, then by id), at most `limit` (at
    /// least one when any waits), and how many are queued in all.
    pub fn longest_waiting(&self, limit: usize) -> (Vec<TrialId>, usize) {
        let keep = limit.max(1);
        let shown = |id: &TrialId| self.visible.contains(&id.experiment);
        let mut changed: Vec<(UnixMillis, TrialId)> = Vec::new();
        // The index's entries of changed trials, which `count_of` counts.
        let mut indexed_changed = 0;
        for trial in self
            .changed
            .iter()
            .filter_map(|id| self.catalog.get_trial(*id))
        {
            if !shown(&trial.id) {
                continue;
            }
            if self.queued.contains(trial) {
                indexed_changed += 1;
            }
            if trial.state == TrialState::Queued {
                changed.push((trial.queued_at, trial.id));
            }
        }
        changed.sort_unstable();
        let indexed = self
            .queued
            .oldest_first()
            .filter(|(_, id)| shown(id) && !self.changed.contains(id));
        let chosen = merged(indexed, changed.iter().copied())
            .take(keep)
            .map(|(_, id)| id)
            .collect();
        let in_index: u64 = self
            .visible
            .iter()
            .map(|id| self.queued.count_of(*id))
            .sum();
        let total = (in_index as usize).saturating_sub(indexed_changed) + changed.len();
        (chosen, total)
    }
}

/// Two streams in ascending order, merged in ascending order.
fn merged<T: Ord>(
    left: impl Iterator<Item = T>,
    right: impl Iterator<Item = T>,
) -> impl Iterator<Item = T> {
    let (mut left, mut right) = (left.peekable(), right.peekable());
    std::iter::from_fn(move || match (left.peek(), right.peek()) {
        (Some(a), Some(b)) if b < a => right.next(),
        (Some(_), _) => left.next(),
        (None, _) => right.next(),
    })
}

impl HeadCore {
    /// What the queue page reads for a caller who sees `visible_team`'s
    /// experiments; cheap whatever the number of trials.
    pub fn waiting_snapshot(&self, visible_team: &dyn Fn(&str) -> bool) -> WaitingSnapshot {
        let (queued, changed) = self.book.queued_index();
        WaitingSnapshot {
            catalog: self.book.catalog(),
            queued,
            changed,
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
