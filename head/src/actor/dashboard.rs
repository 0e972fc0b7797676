//! The actor's side of the dashboard's endpoints beyond the API's pages
//! (`http::dashboard::api`): each [`DashboardQuery`] answered from the core
//! and, for a trial's events and learning curves (a bounded sample of each
//! stored metric history), a read of the store made off the actor.
//!
//! Each answer is bounded by its query's limits, so none grows with the size
//! of an experiment (see `xp_head_core::dashboard`).

use serde_json::{Value, json};
use xp_head_core::HeadCore;
use xp_head_core::auth::Visibility;
use xp_head_core::dashboard::{MAX_TRIAL_EVENTS, trial_events_json};
use xp_head_core::pages::PageError;
use xp_runtime::clock::UnixMillis;
use xp_runtime::ids::{ExperimentId, TrialId};

use crate::registry::HistoryReads;

/// Reports read from the registry per point drawn: more than one, so that
/// reports of other ranks or other metrics interleaved in the history still
/// leave enough of rank 0's to fill the curve.
const RECORDS_PER_POINT: usize = 4;
/// The most reports one curves request decodes, over all its series (about
/// 100 ms of decoding on a small machine, off the actor).
const MAX_RECORDS_PER_REQUEST: usize = 100_000;
/// What the dashboard asks the head actor, answered by [`answer`] inside it.
#[derive(Debug)]
pub(crate) enum DashboardQuery {
    /// A trial's detail.
    Trial(TrialId),
    /// Whether a trial exists and is visible (before its log is read).
    TrialVisible(TrialId),
    /// Learning curves.
    Curves {
        /// The experiment.
        experiment: ExperimentId,
        /// The trials named, or the best.
        trials: Option<Vec<TrialId>>,
        /// The metric, or the experiment's.
        metric: Option<String>,
        /// How many series when none are named.
        series: usize,
        /// Points per series.
        points: usize,
        /// The EMA smoothing (0: none).
        smoothing: f64,
    },
    /// Replicate statistics.
    Replicates {
        /// The experiment.
        experiment: ExperimentId,
        /// The metric, or the experiment's.
        metric: Option<String>,
    },
    /// GPUs and their holders.
    Gpus,
    /// The queue page's chosen trials, out of how many wait, with why
    /// each waits (the choice is made off the actor, from a
    /// `WaitingSnapshot`).
    WaitingItems {
        /// The trials chosen, longest waiting first.
        trials: Vec<TrialId>,
        /// How many wait in all.
        total: usize,
    },
}

/// How a dashboard query is answered: from the core at once, or off the
/// actor (on a copy of the book, or with a reader of the stored history).
pub(super) enum Answered {
    /// The answer.
    Now(Result<Value, PageError>),
    /// The work that makes the answer off the actor.
    Reading(HistoryRead),
}

/// Work that makes a dashboard answer off the actor, given a reader of the
/// stored history (which replicate statistics, made on a copy of the book,
/// do not use).
pub(super) type HistoryRead = Box<dyn FnOnce(&dyn HistoryReads) -> Value + Send>;

/// Answers `query` from the core, or says what to make off the actor to
/// answer it (a trial's newest events, a bounded sample of each curve's
/// metric history, replicate statistics, which walk every trial of the
/// experiment), once the core said what the caller may see.
pub(super) fn answer(
    core: &HeadCore,
    now: UnixMillis,
    query: DashboardQuery,
    visibility: &Visibility,
) -> Answered {
    let visible = |team: &str| visibility.shows(team);
    match query {
        DashboardQuery::Trial(trial) => trial_detail(core, now, trial, &visible),
        DashboardQuery::TrialVisible(trial) => Answered::Now(
            core.check_trial_visible(trial, &visible)
                .map(|()| Value::Null),
        ),
        DashboardQuery::Curves {
            experiment,
            trials,
            metric,
            series,
            points,
            smoothing,
        } => {
            let (metric, chosen) = match core.curve_trials(
                experiment,
                trials.as_deref(),
                metric.as_deref(),
                series,
                &visible,
            ) {
                Ok(chosen) => chosen,
                Err(error) => return Answered::Now(Err(error)),
            };
            let budget = (MAX_RECORDS_PER_REQUEST / chosen.len().max(1))
                .min(points.saturating_mul(RECORDS_PER_POINT));
            let configs: Vec<(TrialId, Option<Value>)> = chosen
                .into_iter()
                .map(|trial| {
                    let config = core
                        .trial_config_json(trial)
                        .and_then(|config| serde_json::from_str::<Value>(config).ok());
                    (trial, config)
                })
                .collect();
            Answered::Reading(Box::new(move |reader| {
                let series: Vec<Value> = configs
                    .into_iter()
                    .map(|(trial, config)| {
                        curve(reader, trial, config, &metric, points, budget, smoothing)
                    })
                    .collect();
                json!({
                    "metric": metric,
                    "points": points,
                    "smoothing": smoothing,
                    "series": series,
                })
            }))
        }
        DashboardQuery::Replicates { experiment, metric } => {
            match core.replicates(experiment, metric.as_deref(), &visible) {
                Ok(study) => Answered::Reading(Box::new(move |_| study.to_json())),
                Err(error) => Answered::Now(Err(error)),
            }
        }
        DashboardQuery::Gpus => Answered::Now(Ok(core.gpu_slots(&visible))),
        DashboardQuery::WaitingItems { trials, total } => {
            Answered::Now(Ok(core.waiting_items(&trials, total)))
        }
    }
}

/// A trial's detail, then its newest events from the store; events it
/// cannot read leave the detail without them, saying why.
fn trial_detail(
    core: &HeadCore,
    now: UnixMillis,
    trial: TrialId,
    visible: &dyn Fn(&str) -> bool,
) -> Answered {
    let detail = core
        .check_trial_visible(trial, visible)
        .and_then(|()| core.trial_detail(trial, now, visible, &[]));
    let mut detail = match detail {
        Ok(detail) => detail,
        Err(error) => return Answered::Now(Err(error)),
    };
    Answered::Reading(Box::new(move |reader| {
        let (events, error) = match reader.newest_events_of_trial(trial, MAX_TRIAL_EVENTS) {
            Ok(events) => (trial_events_json(trial, &events), None),
            Err(failure) => (Value::Array(Vec::new()), Some(failure.to_string())),
        };
        if let Some(map) = detail.as_object_mut() {
            map.insert("events".into(), events);
            if let Some(error) = error {
                map.insert("events_error".into(), Value::String(error));
            }
        }
        detail
    }))
}

/// One trial's curve of `metric`: rank 0's reports among about `records`
/// read evenly over its history, at most `points` of them, and with
/// `smoothing` above 0 their EMA (`xp_tune::stats::ema`, taken over every
/// report read before the curve is thinned).
fn curve(
    reader: &dyn HistoryReads,
    trial: TrialId,
    config: Option<Value>,
    metric: &str,
    points: usize,
    records: usize,
    smoothing: f64,
) -> Value {
    let (mut steps, mut values) = (Vec::new(), Vec::new());
    let mut error = None;
    match reader.metric_samples(trial, records) {
        Ok(records) => {
            for (position, record) in records
                .iter()
                .filter(|record| record.key.rank == 0)
                .enumerate()
            {
                if let Some(value) = record.values.get(metric).filter(|value| value.is_finite()) {
                    steps.push(record.step.unwrap_or(position as u64));
                    values.push(*value);
                }
            }
        }
        Err(failure) => error = Some(failure.to_string()),
    }
    let keep = xp_tune::stats::evenly_spaced(steps.len(), points);
    let smoothed = (smoothing > 0.0).then(|| {
        let smoothed = xp_tune::stats::ema(&values, smoothing);
        keep.iter()
            .map(|&index| smoothed[index])
            .collect::<Vec<_>>()
    });
    json!({
        "trial": trial.to_string(),
        "config": config,
        "steps": keep.iter().map(|&index| steps[index]).collect::<Vec<_>>(),
        "values": keep.iter().map(|&index| values[index]).collect::<Vec<_>>(),
        "smoothed": smoothed,
        "error": error,
    })
}
