//! Paged views for the HTTP API (and the dashboard it will serve): experiment
//! summaries, one experiment's trials, nodes and queues, one bounded page at a
//! time.
//!
//! A page walks only the records it must look at and clones only what it
//! returns: the trials of one experiment are a contiguous range of the core's
//! trial map, the page's items are chosen with a heap of at most `limit + 1`
//! references, and only those are turned into answers. So a page costs one pass
//! over the experiment's trials (for the total and, for metric sorts, the
//! choice) and memory for `limit` items, never a copy of the experiment.
//!
//! Cursors are keyset cursors: the sort key of the last item returned, written as
//! text the client hands back unchanged (opaque to clients; `cursor.rs` owns its
//! form). The next page starts strictly after that key, so
//! trials added meanwhile (adaptive searches add them) do not shift a page
//! boundary, repeat an item or skip one, as offsets would. A trial whose metric
//! changes between two pages of a metric sort moves in the order; that is the
//! order changing, not the cursor.
//!
//! Every function takes `visible_team`, which teams' experiments the caller may
//! see: what is not visible is neither counted nor named, and asking for it by id
//! is answered as if it did not exist.

use std::cmp::Ordering;
use std::collections::BinaryHeap;
use std::ops::Bound;

use xp_runtime::clock::UnixMillis;
use xp_runtime::ids::{ExperimentId, TrialId};
use xp_runtime::protocol::{ExperimentState, NodeStatus, QueueStatus, TrialState, TrialStatus};
use xp_runtime::spec::Mode;

use super::{HeadCore, TrialRecord};

mod cursor;
mod summaries;
#[cfg(test)]
mod tests;

use self::cursor::SortKey;
pub use self::cursor::{
    CursorError, ExperimentCursor, MetricCursor, NodeCursor, QueueCursor, TrialCursor, TrialSort,
};
pub(crate) use self::summaries::SummaryCache;

/// Items in a page when the client names no limit.
pub const DEFAULT_LIMIT: usize = 100;
/// The most items a client may ask for in one page.
pub const MAX_LIMIT: usize = 1000;
/// A page ends early, with a cursor, once its items' estimated size passes this:
/// `MAX_LIMIT` trials with large configurations or many metric names would
/// otherwise make one answer as large as the records allow.
pub const MAX_PAGE_BYTES: usize = 4 << 20;

/// One page of a listing.
#[derive(Debug, Clone, PartialEq)]
pub struct Page<T> {
    /// The items, in the listing's order.
    pub items: Vec<T>,
    /// Where the next page starts; `None` on the last page.
    pub next_cursor: Option<String>,
    /// How many items the whole listing has (with its filters), over all pages.
    pub total: u64,
}

/// Why a page cannot be built.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PageError {
    /// No such experiment, or not one the caller may see.
    #[error("no experiment {experiment_id}")]
    ExperimentNotFound {
        /// The experiment asked for.
        experiment_id: ExperimentId,
    },
    /// No such trial, or not one the caller may see.
    #[error("no trial {trial_id}")]
    TrialNotFound {
        /// The trial asked for.
        trial_id: TrialId,
    },
    /// A metric sort of an experiment that names no metric, with none given.
    #[error("experiment {experiment_id} names no metric to sort by: say which with metric=NAME")]
    NoMetric {
        /// The experiment.
        experiment_id: ExperimentId,
    },
}

/// Every trial state, in the order the counts list them.
const STATES: [TrialState; 10] = [
    TrialState::Pending,
    TrialState::Queued,
    TrialState::Placed,
    TrialState::Starting,
    TrialState::Running,
    TrialState::Preempting,
    TrialState::Succeeded,
    TrialState::Failed,
    TrialState::Stopped,
    TrialState::Cancelled,
];

/// A state's slot in [`STATES`]. Exhaustive on purpose: a new state fails to
/// compile here until it has a slot there.
fn state_slot(state: TrialState) -> usize {
    match state {
        TrialState::Pending => 0,
        TrialState::Queued => 1,
        TrialState::Placed => 2,
        TrialState::Starting => 3,
        TrialState::Running => 4,
        TrialState::Preempting => 5,
        TrialState::Succeeded => 6,
        TrialState::Failed => 7,
        TrialState::Stopped => 8,
        TrialState::Cancelled => 9,
    }
}

/// A set of trial states: the `state=` filter of a trial listing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StateSet(u16);

/// A name in a state filter that is not a trial state.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("`{}` is not a trial state", .name.chars().take(64).collect::<String>())]
pub struct UnknownState {
    /// The name given.
    pub name: String,
}

impl StateSet {
    /// Every state.
    pub const ALL: Self = Self((1 << STATES.len()) - 1);

    /// The states named in `text`, separated by commas (`running,queued`); the
    /// error names the first name that is not a state.
    pub fn parse(text: &str) -> Result<Self, UnknownState> {
        let mut bits = 0;
        for name in text.split(',') {
            let state = STATES
                .iter()
                .find(|state| state.as_str() == name)
                .ok_or_else(|| UnknownState {
                    name: name.to_owned(),
                })?;
            bits |= 1 << state_slot(*state);
        }
        Ok(Self(bits))
    }

    /// Whether `state` is in the set.
    pub fn contains(self, state: TrialState) -> bool {
        self.0 & (1 << state_slot(state)) != 0
    }
}

/// How many trials are in each state.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct StateCounts([u64; STATES.len()]);

impl StateCounts {
    fn add(&mut self, state: TrialState) {
        self.0[state_slot(state)] += 1;
    }

    /// How many trials are in `state`.
    pub fn get(&self, state: TrialState) -> u64 {
        self.0[state_slot(state)]
    }

    /// The states that have trials, with their counts.
    pub fn nonzero(&self) -> impl Iterator<Item = (TrialState, u64)> + '_ {
        STATES
            .iter()
            .map(|state| (*state, self.get(*state)))
            .filter(|(_, count)| *count > 0)
    }
}

/// The best succeeded trial of an experiment by its metric.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct BestTrial {
    /// The trial.
    pub trial: TrialId,
    /// Its last value of the experiment's metric.
    pub value: f64,
}

/// An experiment without its trials: what a listing of experiments shows.
#[derive(Debug, Clone, PartialEq)]
pub struct ExperimentSummary {
    /// The id.
    pub id: ExperimentId,
    /// The spec's name.
    pub name: String,
    /// The spec's team.
    pub team: String,
    /// Derived from its trials, as `xp status` derives it.
    pub state: ExperimentState,
    /// The metric it optimizes, if any.
    pub metric: Option<String>,
    /// Whether larger values of the metric are better.
    pub maximize: bool,
    /// When it was submitted.
    pub submitted_at: UnixMillis,
    /// The code version.
    pub code_version: String,
    /// The data version.
    pub data_version: String,
    /// How many trials it has.
    pub trials: u64,
    /// How many of them are in each state.
    pub counts: StateCounts,
    /// Its best succeeded trial (the first of equals; NaN never counts), as
    /// `xp run`'s progress line chooses it.
    pub best: Option<BestTrial>,
    /// GPU-hours its trials' attempts were allocated (`xp report`'s rule).
    pub gpu_hours: f64,
    /// What they cost at the policy's prices; `None` without prices.
    pub cost: Option<f64>,
}

/// What a trial listing asks for.
#[derive(Debug, Clone, PartialEq)]
pub struct TrialQuery {
    /// At most this many trials (clamped to `1..=MAX_LIMIT`).
    pub limit: usize,
    /// Continue after this cursor, in its order.
    pub cursor: Option<TrialCursor>,
    /// The order.
    pub sort: TrialSort,
    /// Only trials in these states.
    pub states: StateSet,
    /// The metric a metric order sorts by; the experiment's metric when `None`.
    pub metric: Option<String>,
}

impl Default for TrialQuery {
    fn default() -> Self {
        Self {
            limit: DEFAULT_LIMIT,
            cursor: None,
            sort: TrialSort::Id,
            states: StateSet::ALL,
            metric: None,
        }
    }
}

/// A heap entry ordered by its key only.
struct Ranked<K, T> {
    key: K,
    item: T,
}

impl<K: Ord, T> PartialEq for Ranked<K, T> {
    fn eq(&self, other: &Self) -> bool {
        self.key == other.key
    }
}

impl<K: Ord, T> Eq for Ranked<K, T> {}

impl<K: Ord, T> PartialOrd for Ranked<K, T> {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl<K: Ord, T> Ord for Ranked<K, T> {
    fn cmp(&self, other: &Self) -> Ordering {
        self.key.cmp(&other.key)
    }
}

/// The `keep` smallest of `items` by key, smallest first, holding at most
/// `keep` of them at any time (a max-heap whose top is the one to drop).
fn smallest<K: Ord, T>(keep: usize, items: impl Iterator<Item = (K, T)>) -> Vec<(K, T)> {
    let mut heap: BinaryHeap<Ranked<K, T>> = BinaryHeap::with_capacity(keep + 1);
    for (key, item) in items {
        if heap.len() < keep {
            heap.push(Ranked { key, item });
        } else if heap.peek().is_some_and(|top| key < top.key) {
            heap.pop();
            heap.push(Ranked { key, item });
        }
    }
    heap.into_sorted_vec()
        .into_iter()
        .map(|ranked| (ranked.key, ranked.item))
        .collect()
}

/// A rough upper estimate of a trial's size as JSON, for [`MAX_PAGE_BYTES`]
/// (and so also of its size in a frame, where nothing is escaped).
pub(crate) fn estimated_bytes(trial: &TrialStatus) -> usize {
    let attempts: usize = trial
        .attempts
        .iter()
        .map(|attempt| {
            200 + attempt.outcome.as_ref().map_or(0, String::len) + 40 * attempt.nodes.len()
        })
        .sum();
    let metrics: usize = trial.metrics.keys().map(|name| name.len() + 30).sum();
    300 + 2 * trial.config_json.len()
        + trial.reason.as_ref().map_or(0, String::len)
        + trial.waiting.as_ref().map_or(0, String::len)
        + attempts
        + metrics
}

impl HeadCore {
    /// A page of the visible experiments, newest first, as summaries.
    pub fn experiments_page(
        &self,
        limit: usize,
        cursor: Option<ExperimentCursor>,
        visible_team: &dyn Fn(&str) -> bool,
    ) -> Page<ExperimentSummary> {
        let limit = limit.clamp(1, MAX_LIMIT);
        let after = cursor.map(|cursor| cursor.key());
        let mut total = 0;
        let visible = self.book.experiments().filter(|experiment| {
            self.book
                .get_spec(experiment.id)
                .is_some_and(|spec| visible_team(&spec.team))
        });
        let candidates = visible.filter_map(|experiment| {
            total += 1;
            let key = ExperimentCursor {
                submitted_at: experiment.submitted_at,
                id: experiment.id,
            };
            after
                .is_none_or(|after| key.key() > after)
                .then_some((key.key(), key))
        });
        let mut chosen = smallest(limit + 1, candidates);
        let more = chosen.len() > limit;
        chosen.truncate(limit);
        let next_cursor = more
            .then(|| chosen.last().map(|(_, cursor)| cursor.encode()))
            .flatten();
        Page {
            items: chosen
                .iter()
                .map(|(_, cursor)| self.experiment_summary(cursor.id))
                .collect(),
            next_cursor,
            total,
        }
    }

    /// One visible experiment's summary.
    pub fn experiment_summary_of(
        &self,
        experiment_id: ExperimentId,
        visible_team: &dyn Fn(&str) -> bool,
    ) -> Result<ExperimentSummary, PageError> {
        self.check_visible(experiment_id, visible_team)?;
        Ok(self.experiment_summary(experiment_id))
    }

    /// Whether `trial_id` exists in an experiment the caller may see.
    pub fn check_trial_visible(
        &self,
        trial_id: TrialId,
        visible_team: &dyn Fn(&str) -> bool,
    ) -> Result<(), PageError> {
        self.check_visible(trial_id.experiment, visible_team)
            .ok()
            .filter(|()| self.book.contains_trial(trial_id))
            .ok_or(PageError::TrialNotFound { trial_id })
    }

    /// A page of one visible experiment's trials.
    pub fn trials_page(
        &self,
        experiment_id: ExperimentId,
        query: &TrialQuery,
        visible_team: &dyn Fn(&str) -> bool,
    ) -> Result<Page<TrialStatus>, PageError> {
        self.check_visible(experiment_id, visible_team)?;
        let limit = query.limit.clamp(1, MAX_LIMIT);
        let sort = query.sort;
        let metric = if sort.by_metric() {
            let named = query.metric.as_deref();
            let own = self.book.spec(experiment_id).search.metric.as_deref();
            Some(named.or(own).ok_or(PageError::NoMetric { experiment_id })?)
        } else {
            None
        };
        let value_of =
            |trial: &TrialRecord| metric.and_then(|name| trial.metrics.get(name).copied());
        let total = self.book.count_trials_of(experiment_id, |name| {
            STATES
                .iter()
                .any(|state| state.as_str() == name && query.states.contains(*state))
        });
        // The page plus one more trial, which says whether there is a next page.
        let chosen = self.chosen_trials(experiment_id, query, limit + 1, &value_of);
        let mut more = chosen.len() > limit;
        let mut items = Vec::with_capacity(chosen.len().min(limit));
        let mut bytes = 0;
        for trial in chosen.iter().take(limit) {
            if !items.is_empty() && bytes >= MAX_PAGE_BYTES {
                more = true;
                break;
            }
            let status = self.trial_status(trial);
            bytes += estimated_bytes(&status);
            items.push(status);
        }
        let next_cursor = more
            .then(|| {
                chosen.get(items.len().checked_sub(1)?).map(|last| {
                    TrialCursor {
                        sort,
                        index: last.id.index,
                        value: value_of(last).filter(|value| !value.is_nan()),
                    }
                    .encode()
                })
            })
            .flatten();
        Ok(Page {
            items,
            next_cursor,
            total,
        })
    }

    /// The first `count` wanted trials after the query's cursor, in its
    /// order: by id it walks only the range it needs; by metric it keeps the
    /// `count` smallest keys of one pass.
    fn chosen_trials<'a>(
        &'a self,
        experiment_id: ExperimentId,
        query: &TrialQuery,
        count: usize,
        value_of: &dyn Fn(&TrialRecord) -> Option<f64>,
    ) -> Vec<&'a TrialRecord> {
        let wanted = |trial: &&TrialRecord| query.states.contains(trial.state);
        let after = |index| Bound::Excluded(trial_id(experiment_id, index));
        let first = Bound::Included(trial_id(experiment_id, 0));
        let last = Bound::Included(trial_id(experiment_id, u32::MAX));
        match query.sort {
            TrialSort::Id => {
                let start = query.cursor.map_or(first, |cursor| after(cursor.index));
                self.book
                    .trials_between(start, last)
                    .filter(wanted)
                    .take(count)
                    .collect()
            }
            TrialSort::IdDesc => {
                let end = query.cursor.map_or(last, |cursor| after(cursor.index));
                self.book
                    .trials_between(first, end)
                    .rev()
                    .filter(wanted)
                    .take(count)
                    .collect()
            }
            TrialSort::Metric | TrialSort::MetricDesc => {
                let cursor_key = query.cursor.map(|cursor| cursor.key());
                let candidates = self
                    .book
                    .trials_of(experiment_id)
                    .map(|(_, trial)| trial)
                    .filter(wanted)
                    .filter_map(|trial| {
                        let key = SortKey::new(query.sort, trial.id.index, value_of(trial));
                        cursor_key
                            .is_none_or(|after| key > after)
                            .then_some((key, trial))
                    });
                smallest(count, candidates)
                    .into_iter()
                    .map(|(_, trial)| trial)
                    .collect()
            }
        }
    }

    /// A page of the nodes, by id.
    pub fn nodes_page(&self, limit: usize, cursor: Option<NodeCursor>) -> Page<NodeStatus> {
        let limit = limit.clamp(1, MAX_LIMIT);
        let start = cursor.map_or(Bound::Unbounded, |NodeCursor(id)| Bound::Excluded(id));
        let chosen: Vec<_> = self.membership.nodes_from(start).take(limit + 1).collect();
        let more = chosen.len() > limit;
        let running = self.running_workers_by_node();
        let items: Vec<NodeStatus> = chosen
            .iter()
            .take(limit)
            .map(|node| self.node_status(node, &running))
            .collect();
        Page {
            next_cursor: more
                .then(|| items.last().map(|node| NodeCursor(node.id).encode()))
                .flatten(),
            items,
            total: self.membership.len() as u64,
        }
    }

    /// A page of the queues the caller may see (those of visible teams, and those
    /// open to every team), by name.
    pub fn queues_page(
        &self,
        limit: usize,
        cursor: Option<&QueueCursor>,
        visible_team: &dyn Fn(&str) -> bool,
    ) -> Page<QueueStatus> {
        let limit = limit.clamp(1, MAX_LIMIT);
        // The policy file bounds the number of queues; the books are computed for
        // all of them at once, and only the page is kept.
        let mut queues: Vec<QueueStatus> = self
            .queues()
            .into_iter()
            // `*`: a queue open to every team, which every caller may see.
            .filter(|queue| queue.team == "*" || visible_team(&queue.team))
            .collect();
        queues.sort_by(|one, other| one.name.cmp(&other.name));
        let total = queues.len() as u64;
        let mut page: Vec<QueueStatus> = queues
            .into_iter()
            .filter(|queue| cursor.is_none_or(|QueueCursor(after)| queue.name > *after))
            .take(limit + 1)
            .collect();
        let more = page.len() > limit;
        page.truncate(limit);
        Page {
            next_cursor: more
                .then(|| {
                    page.last()
                        .map(|queue| QueueCursor(queue.name.clone()).encode())
                })
                .flatten(),
            items: page,
            total,
        }
    }

    /// `Ok` when `experiment_id` exists and its team is visible.
    fn check_visible(
        &self,
        experiment_id: ExperimentId,
        visible_team: &dyn Fn(&str) -> bool,
    ) -> Result<(), PageError> {
        match self.book.get_spec(experiment_id) {
            Some(spec)
                if self.book.contains_experiment(experiment_id) && visible_team(&spec.team) =>
            {
                Ok(())
            }
            _ => Err(PageError::ExperimentNotFound { experiment_id }),
        }
    }

    /// An experiment's summary, from one pass over its trials.
    /// `id`'s summary: the one kept while it stands, else made afresh (and
    /// kept when none of its trials has a live attempt).
    pub(crate) fn experiment_summary(&self, id: ExperimentId) -> ExperimentSummary {
        let made = summaries::Made {
            revision: self.book.revision(id),
            resources: self.membership.resources_revision(),
            prices: self.placement.policy().config().prices.clone(),
        };
        if let Some(summary) = self.summaries.get(id, &made) {
            return summary;
        }
        let (summary, settled) = self.summarize(id);
        if settled {
            self.summaries.keep(id, made, summary.clone());
        }
        summary
    }

    /// Panics if a kept summary differs from one made afresh (asking keeps
    /// it, so the next check finds it kept across whatever step came between).
    pub(crate) fn check_kept_summaries(&self) {
        for experiment in self.book.experiments() {
            assert_eq!(
                self.experiment_summary(experiment.id),
                self.summarize(experiment.id).0,
                "the kept summary of {} is stale",
                experiment.id
            );
        }
    }

    /// `id`'s summary made afresh, and whether none of its trials has a live
    /// attempt.
    fn summarize(&self, id: ExperimentId) -> (ExperimentSummary, bool) {
        let experiment = &self.book.experiment(id);
        let spec = &self.book.spec(id);
        let maximize = spec.search.mode == Mode::Max;
        let mut counts = StateCounts::default();
        let mut trials = 0;
        let mut best: Option<BestTrial> = None;
        let (mut gpu_hours, mut cost) = (0.0, None::<f64>);
        let mut settled = true;
        for (_, trial) in self.book.trials_of(id) {
            trials += 1;
            settled &= trial
                .attempts
                .iter()
                .all(|attempt| attempt.ended_at.is_some());
            counts.add(trial.state);
            let (trial_hours, trial_cost) = self.trial_usage(trial);
            gpu_hours += trial_hours;
            if let Some(trial_cost) = trial_cost {
                *cost.get_or_insert(0.0) += trial_cost;
            }
            let value = spec
                .search
                .metric
                .as_ref()
                .filter(|_| trial.state.ended_normally())
                .and_then(|metric| trial.metrics.get(metric.as_str()).copied())
                // A NaN or infinite result never wins.
                .filter(|value| value.is_finite());
            if let Some(value) = value {
                let better = best.is_none_or(|best| {
                    if maximize {
                        value > best.value
                    } else {
                        value < best.value
                    }
                });
                if better {
                    best = Some(BestTrial {
                        trial: trial.id,
                        value,
                    });
                }
            }
        }
        // The same rule as `experiment_state`, from the counts already taken.
        let unfinished = STATES
            .iter()
            .filter(|state| !state.is_terminal())
            .map(|state| counts.get(*state))
            .sum::<u64>();
        let state = ExperimentState::of(
            experiment.cancelled,
            unfinished > 0,
            counts.get(TrialState::Succeeded) + counts.get(TrialState::Stopped) > 0,
        );
        let summary = ExperimentSummary {
            id,
            name: spec.name.clone(),
            team: spec.team.clone(),
            state,
            metric: spec.search.metric.clone(),
            maximize,
            submitted_at: experiment.submitted_at,
            code_version: experiment.code_version.clone(),
            data_version: experiment.data_version.clone(),
            trials,
            counts,
            best,
            gpu_hours,
            cost,
        };
        (summary, settled)
    }
}

fn trial_id(experiment: ExperimentId, index: u32) -> TrialId {
    TrialId { experiment, index }
}
