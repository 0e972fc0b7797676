//! The cluster page's history: what it reads, copied from the core
//! ([`ClusterSnapshot`]), each experiment's history kept by revision between
//! polls ([`HistoryCache`]), and the buckets made from them (`Timeline`).

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex, PoisonError};

use serde_json::{Value, json};
use xp_runtime::clock::UnixMillis;
use xp_runtime::ids::ExperimentId;

use super::{
    HOUR_MS, MAX_HISTORY_BUCKETS, MIN_BUCKET_MS, MIN_RATE_SPAN_MS, RATE_WINDOW_MS, arrival_of,
    attempt_gpus, departure_of,
};
use crate::HeadCore;
use crate::records::TrialRecord;
use crate::state::Catalog;

impl HeadCore {
    /// The cluster's history now (see [`ClusterSnapshot::to_json`]).
    #[cfg(test)]
    pub(crate) fn cluster_history(
        &self,
        now: UnixMillis,
        since: Option<UnixMillis>,
        buckets: usize,
        visible_team: &dyn Fn(&str) -> bool,
    ) -> Value {
        self.cluster_snapshot(now, since, buckets, visible_team)
            .to_json()
    }

    /// What the cluster page's history reads, copied as it is now (the catalog
    /// in a few reference counts, each visible experiment's revision, the
    /// GPUs of ready nodes), so the head computes the history off its actor.
    pub fn cluster_snapshot(
        &self,
        now: UnixMillis,
        since: Option<UnixMillis>,
        buckets: usize,
        visible_team: &dyn Fn(&str) -> bool,
    ) -> ClusterSnapshot {
        let visible: Vec<VisibleExperiment> = self
            .book
            .experiments()
            .filter_map(|experiment| {
                let spec = self.book.get_spec(experiment.id)?;
                visible_team(&spec.team).then(|| VisibleExperiment {
                    id: experiment.id,
                    team: spec.team.clone(),
                    submitted_at: experiment.submitted_at,
                    revision: self.book.revision(experiment.id),
                })
            })
            .collect();
        let capacity: f64 = self
            .membership
            .nodes()
            .filter(|node| node.state == xp_runtime::protocol::NodeState::Ready)
            .map(|node| node.resources.gpus.len() as f64)
            .sum::<f64>()
            // An empty sum of floats is -0.0, which JSON writes as `-0.0`
            // and a page as "-0 GPUs".
            + 0.0;
        ClusterSnapshot {
            catalog: self.book.catalog(),
            visible,
            capacity,
            histories: Arc::clone(&self.histories),
            now,
            since,
            buckets,
        }
    }
}

/// An experiment the cluster page's caller sees, as it stood.
#[derive(Debug, Clone)]
struct VisibleExperiment {
    id: ExperimentId,
    team: String,
    submitted_at: UnixMillis,
    revision: u64,
}

/// What the cluster page's history reads ([`HeadCore::cluster_snapshot`]);
/// the history itself is computed by whoever holds it, off the head's actor
/// (a million trials' histories take 0.12 s to make the first time).
#[derive(Debug, Clone)]
pub struct ClusterSnapshot {
    catalog: Catalog,
    visible: Vec<VisibleExperiment>,
    capacity: f64,
    histories: Arc<HistoryCache>,
    now: UnixMillis,
    since: Option<UnixMillis>,
    buckets: usize,
}

impl ClusterSnapshot {
    /// The cluster over time, in `buckets` equal buckets (fewer, of a second
    /// each, when the window is shorter) from `since` to `now` (the snapshot's)
    /// (the earliest visible submission when `since` is `None`), from the
    /// attempts and trials of visible experiments:
    /// - `allocated_gpus`: GPUs held by attempts, averaged over the bucket;
    /// - `utilization`: that over the GPUs of ready nodes now (the head keeps no
    ///   history of capacity, so a cluster that shrank shows its past against
    ///   today's size);
    /// - `finished`: trials that ended in the bucket;
    /// - `throughput_per_hour`: trials that ended in the trailing
    ///   [`RATE_WINDOW_MS`] (or the bucket, if longer) up to the bucket's end,
    ///   over that window's length within the history, but at least
    ///   [`MIN_RATE_SPAN_MS`]: three trials ending in a one-second bucket of
    ///   a young cluster are 180 an hour, not 10,800;
    /// - `mean_time_in_system_s`: of the trials that ended in it, from arrival
    ///   (first queued) to the end of their last attempt;
    /// - `in_system`: trials arrived and not yet ended, averaged over the bucket
    ///   (the L of Little's law);
    ///
    /// and `gpu_hours_by_team` over the whole window.
    ///
    /// Each experiment's history is the kept one where its revision stands.
    pub fn to_json(&self) -> Value {
        let now = self.now;
        let start = self
            .since
            .or_else(|| self.visible.iter().map(|seen| seen.submitted_at).min())
            .unwrap_or(now)
            .min(now);
        let mut timeline = Timeline::new(start, now, self.buckets);
        let mut by_team: BTreeMap<&str, f64> = BTreeMap::new();
        for seen in &self.visible {
            let history = self.histories.get_or_make(seen.id, seen.revision, now, || {
                ExperimentHistory::of(self.catalog.trials_of(seen.id).map(|(_, trial)| trial))
            });
            timeline.add_history(&history, |gpu_ms| {
                *by_team.entry(seen.team.as_str()).or_default() += gpu_ms / HOUR_MS;
            });
        }
        json!({
            "since_ms": start,
            "until_ms": now,
            "bucket_ms": timeline.width,
            "capacity_gpus": self.capacity,
            "buckets": timeline.rows(self.capacity),
            "gpu_hours_by_team": by_team,
        })
    }
}

/// One experiment's trials as the cluster's history counts them, made from
/// its records at one revision and kept while that stands
/// ([`HistoryCache`]): walking a million records on each poll of the cluster
/// page held the head's actor 0.16-0.21 s. Live attempts and trials have no
/// end: they run to the window's end.
#[derive(Debug, Default, PartialEq)]
pub(crate) struct ExperimentHistory {
    /// Attempts that held GPUs, in trial order: placed, ended, GPUs.
    attempts: Vec<(UnixMillis, Option<UnixMillis>, f64)>,
    /// Trials that entered the system, in order: arrival, departure.
    trials: Vec<(UnixMillis, Option<UnixMillis>)>,
}

impl ExperimentHistory {
    /// The history of `trials`, in their order.
    fn of<'a>(trials: impl Iterator<Item = &'a TrialRecord>) -> Self {
        let mut history = Self::default();
        for trial in trials {
            for attempt in &trial.attempts {
                let gpus = attempt_gpus(attempt);
                if gpus > 0.0 {
                    history
                        .attempts
                        .push((attempt.placed_at, attempt.ended_at, gpus));
                }
            }
            if let Some(arrival) = arrival_of(trial) {
                let departure = trial
                    .state
                    .is_terminal()
                    .then(|| departure_of(trial))
                    .flatten();
                history.trials.push((arrival, departure));
            }
        }
        history.attempts.shrink_to_fit();
        history.trials.shrink_to_fit();
        history
    }
}

/// How long kept histories outlive the last poll that read one.
const HISTORY_KEPT_MS: u64 = 60_000;

/// Experiments' histories kept between polls of the cluster page, each with
/// the experiment's revision it was made at (a revision names its records as
/// they stand), and when one was last read: all go once none was read for
/// [`HISTORY_KEPT_MS`], so a head nobody watches keeps none.
#[derive(Debug, Default)]
pub(crate) struct HistoryCache(Mutex<KeptHistories>);

#[derive(Debug, Default)]
struct KeptHistories {
    read_at: UnixMillis,
    by_experiment: HashMap<ExperimentId, (u64, Arc<ExperimentHistory>)>,
}

impl HistoryCache {
    /// `experiment`'s history at `revision`: the kept one, else `make`'s, kept.
    fn get_or_make(
        &self,
        experiment: ExperimentId,
        revision: u64,
        now: UnixMillis,
        make: impl FnOnce() -> ExperimentHistory,
    ) -> Arc<ExperimentHistory> {
        {
            let mut kept = self.0.lock().unwrap_or_else(PoisonError::into_inner);
            kept.read_at = now;
            if let Some((made_at, history)) = kept.by_experiment.get(&experiment)
                && *made_at == revision
            {
                return Arc::clone(history);
            }
        }
        // Made outside the lock: the actor's tick takes it too.
        let history = Arc::new(make());
        let mut kept = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        kept.by_experiment
            .insert(experiment, (revision, Arc::clone(&history)));
        history
    }

    /// Drops every kept history when none was read for [`HISTORY_KEPT_MS`].
    pub(crate) fn forget_unread(&self, now: UnixMillis) {
        let mut kept = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        if now.saturating_sub(kept.read_at) > HISTORY_KEPT_MS {
            kept.by_experiment = HashMap::new();
        }
    }
}

impl HeadCore {
    /// Panics if a kept history whose revision stands differs from one made
    /// afresh.
    pub(crate) fn check_kept_histories(&self) {
        let kept = self
            .histories
            .0
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        for (experiment, (revision, history)) in &kept.by_experiment {
            if self.book.revision(*experiment) == *revision {
                let fresh =
                    ExperimentHistory::of(self.book.trials_of(*experiment).map(|(_, trial)| trial));
                assert_eq!(
                    **history, fresh,
                    "the kept history of {experiment} is stale"
                );
            }
        }
    }
}

/// The cluster's history in buckets of equal width from `start` to `now`:
/// GPUs allocated, trials in the system, and those that left with their time
/// in it.
struct Timeline {
    start: UnixMillis,
    now: UnixMillis,
    width: u64,
    allocated_ms: Vec<f64>,
    in_system_ms: Vec<f64>,
    finished: Vec<u64>,
    time_in_system_ms: Vec<f64>,
}

impl Timeline {
    /// At most `buckets` (within `MAX_HISTORY_BUCKETS`) of at least a second:
    /// a young cluster's history is a few buckets, not spikes in slivers of
    /// milliseconds.
    fn new(start: UnixMillis, now: UnixMillis, buckets: usize) -> Self {
        let buckets = buckets.clamp(1, MAX_HISTORY_BUCKETS);
        let span = now.saturating_sub(start).max(1);
        let width = span.div_ceil(buckets as u64).max(MIN_BUCKET_MS);
        let buckets = span.div_ceil(width).clamp(1, buckets as u64) as usize;
        Self {
            start,
            now,
            width,
            allocated_ms: vec![0.0; buckets],
            in_system_ms: vec![0.0; buckets],
            finished: vec![0; buckets],
            time_in_system_ms: vec![0.0; buckets],
        }
    }

    fn buckets(&self) -> usize {
        self.finished.len()
    }

    /// The bucket holding `at`, if it is in the window.
    fn bucket_of(&self, at: UnixMillis) -> Option<usize> {
        (at >= self.start && at <= self.now)
            .then(|| ((at - self.start) / self.width).min(self.buckets() as u64 - 1) as usize)
    }

    /// Adds `weight` per millisecond of [from, to) to `series`, clipped to the
    /// window; returns the weight added.
    fn spread(&self, series: &mut [f64], from: UnixMillis, to: UnixMillis, weight: f64) -> f64 {
        let (from, to) = (from.max(self.start), to.min(self.now));
        if to <= from {
            return 0.0;
        }
        let last = self.buckets() as u64 - 1;
        let mut at = from;
        while at < to {
            let bucket = ((at - self.start) / self.width).min(last);
            let bucket_end = (self.start + (bucket + 1) * self.width).min(to).max(at + 1);
            series[bucket as usize] += weight * (bucket_end - at) as f64;
            at = bucket_end;
        }
        weight * (to - from) as f64
    }

    /// Adds one experiment's history: its attempts' GPUs (telling
    /// `on_gpu_ms` the GPU-milliseconds each held in the window), then its
    /// trials' time in the system and departures.
    fn add_history(&mut self, history: &ExperimentHistory, mut on_gpu_ms: impl FnMut(f64)) {
        let mut allocated = std::mem::take(&mut self.allocated_ms);
        for &(placed, ended, gpus) in &history.attempts {
            on_gpu_ms(self.spread(&mut allocated, placed, ended.unwrap_or(self.now), gpus));
        }
        self.allocated_ms = allocated;
        let mut in_system = std::mem::take(&mut self.in_system_ms);
        for &(arrival, departure) in &history.trials {
            self.spread(&mut in_system, arrival, departure.unwrap_or(self.now), 1.0);
            if let Some(departure) = departure
                && let Some(bucket) = self.bucket_of(departure)
            {
                self.finished[bucket] += 1;
                self.time_in_system_ms[bucket] += departure.saturating_sub(arrival) as f64;
            }
        }
        self.in_system_ms = in_system;
    }

    /// Trials finished per hour up to the end of `bucket`: those that ended
    /// in the buckets starting within the trailing [`RATE_WINDOW_MS`] (at
    /// least the bucket itself), over the time those buckets cover, but at
    /// least [`MIN_RATE_SPAN_MS`].
    fn throughput_per_hour(&self, bucket: usize) -> f64 {
        let end = (self.start + (bucket as u64 + 1) * self.width).min(self.now);
        let window = RATE_WINDOW_MS.max(self.width);
        let mut first = bucket;
        while first > 0
            && self.start + (first as u64 - 1) * self.width >= end.saturating_sub(window)
        {
            first -= 1;
        }
        let from = self.start + first as u64 * self.width;
        let finished: u64 = self.finished[first..=bucket].iter().sum();
        let span = end.saturating_sub(from).max(MIN_RATE_SPAN_MS);
        finished as f64 * HOUR_MS / span as f64
    }

    /// One row per bucket, utilisation against `capacity` GPUs.
    fn rows(&self, capacity: f64) -> Vec<Value> {
        (0..self.buckets())
            .map(|bucket| {
                let from = self.start + bucket as u64 * self.width;
                let length = (from + self.width)
                    .min(self.now)
                    .saturating_sub(from)
                    .max(1) as f64;
                let allocated = self.allocated_ms[bucket] / length;
                let finished = self.finished[bucket];
                let throughput = self.throughput_per_hour(bucket);
                json!({
                    "start_ms": from,
                    "allocated_gpus": allocated,
                    "utilization": (capacity > 0.0).then(|| allocated / capacity),
                    "finished": finished,
                    "throughput_per_hour": throughput,
                    "mean_time_in_system_s": (finished > 0)
                        .then(|| self.time_in_system_ms[bucket] / finished as f64 / 1000.0),
                    "in_system": self.in_system_ms[bucket] / length,
                })
            })
            .collect()
    }
}
