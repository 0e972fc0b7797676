//! What the web dashboard (`crate::dashboard`) reads from the core beyond the
//! HTTP API's pages: one trial's detail (attempts, checkpoints, events), the
//! trials whose learning curves to draw, replicate statistics per
//! configuration, which trial holds each GPU of each node, and the cluster's
//! history (utilisation, throughput, time and number in system, GPU-hours by
//! team) computed from the attempts the core keeps.
//!
//! Pure like the rest of the core: `now` comes in, answers are JSON values in
//! the shapes `runtime::views` and the dashboard's JavaScript agree on. Every
//! answer is bounded (events, configurations, series, buckets), so one request
//! never builds a copy of a 10,000-trial experiment.

use std::collections::{BTreeMap, HashMap};

use serde_json::{Value, json};
use xp_runtime::clock::UnixMillis;
use xp_runtime::ids::{ExperimentId, TrialId};
use xp_runtime::protocol::{TrialEvent, TrialState};
use xp_runtime::spec::{Domain, Mode, ParamSpec};
use xp_runtime::views::{checkpoint_json, trial_json};

use super::HeadCore;
use super::importance;
use super::pages::PageError;
use super::records::{AttemptRecord, TrialRecord};
use super::state::Catalog;

mod cluster;
mod waiting;

pub use self::cluster::ClusterSnapshot;
pub(crate) use self::cluster::HistoryCache;
pub use self::waiting::WaitingSnapshot;

/// The most events one trial's detail carries (the newest).
pub const MAX_TRIAL_EVENTS: usize = 200;
/// The most configurations a replicate table lists (the best first).
pub const MAX_REPLICATE_GROUPS: usize = 200;
/// The most series one learning-curve request may draw.
pub const MAX_CURVE_SERIES: usize = 50;
/// The most buckets a cluster history has.
pub const MAX_HISTORY_BUCKETS: usize = 500;

/// The shortest bucket of a cluster history.
const MIN_BUCKET_MS: u64 = 1000;
/// Thousandths of a GPU in one GPU.
const GPU_MILLI: f64 = 1000.0;
/// Milliseconds in an hour.
const HOUR_MS: f64 = 3_600_000.0;
/// The trailing window a bucket's throughput is measured over.
pub const RATE_WINDOW_MS: u64 = 10 * 60 * 1000;
/// The shortest span a throughput is divided by.
pub const MIN_RATE_SPAN_MS: u64 = 60 * 1000;

impl HeadCore {
    /// Whether the experiment exists and the caller may see it.
    fn dashboard_visible(
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

    /// One trial as `xp status --json` shows it, plus its experiment, metric
    /// and mode, GPU-hours, world size, kept checkpoints and `events`, its
    /// newest events as the store gave them (newest first, at most
    /// [`MAX_TRIAL_EVENTS`] shown).
    pub fn trial_detail(
        &self,
        trial_id: TrialId,
        now: UnixMillis,
        visible_team: &dyn Fn(&str) -> bool,
        events: &[TrialEvent],
    ) -> Result<Value, PageError> {
        self.dashboard_visible(trial_id.experiment, visible_team)
            .map_err(|_| PageError::TrialNotFound { trial_id })?;
        let trial = self
            .book
            .get_trial(trial_id)
            .ok_or(PageError::TrialNotFound { trial_id })?;
        let spec = &self.book.spec(trial_id.experiment);
        let mut detail = trial_json(&self.trial_status(trial));
        let checkpoints: Vec<Value> = self
            .trial_checkpoints(trial_id)
            .unwrap_or_default()
            .iter()
            .map(checkpoint_json)
            .collect();
        let world_size = trial
            .attempts
            .last()
            .map_or(0, |attempt| attempt.workers.len());
        if let Value::Object(map) = &mut detail {
            map.insert("experiment".into(), json!(trial_id.experiment.to_string()));
            map.insert("metric".into(), json!(spec.search.metric));
            map.insert(
                "mode".into(),
                json!(if spec.search.mode == Mode::Max {
                    "max"
                } else {
                    "min"
                }),
            );
            map.insert("world_size".into(), json!(world_size));
            map.insert(
                "allocated_gpu_hours".into(),
                json!(trial_gpu_hours(trial, now)),
            );
            map.insert("checkpoints".into(), Value::Array(checkpoints));
            map.insert("events".into(), trial_events_json(trial_id, events));
        }
        Ok(detail)
    }

    /// The trials whose curves to draw: those named (visible ones of this
    /// experiment, in the order given), else the best `max_series` by the
    /// metric (then the lowest ids), at most [`MAX_CURVE_SERIES`].
    pub fn curve_trials(
        &self,
        experiment_id: ExperimentId,
        named: Option<&[TrialId]>,
        metric: Option<&str>,
        max_series: usize,
        visible_team: &dyn Fn(&str) -> bool,
    ) -> Result<(String, Vec<TrialId>), PageError> {
        self.dashboard_visible(experiment_id, visible_team)?;
        let spec = &self.book.spec(experiment_id);
        let metric = metric
            .or(spec.search.metric.as_deref())
            .ok_or(PageError::NoMetric { experiment_id })?
            .to_owned();
        let max_series = max_series.clamp(1, MAX_CURVE_SERIES);
        if let Some(named) = named {
            let chosen = named
                .iter()
                .filter(|id| id.experiment == experiment_id && self.book.contains_trial(**id))
                .take(max_series)
                .copied()
                .collect();
            return Ok((metric, chosen));
        }
        let sign = if spec.search.mode == Mode::Max {
            -1.0
        } else {
            1.0
        };
        let mut ranked: Vec<(f64, u32)> = self
            .book
            .trials_of(experiment_id)
            .map(|(id, trial)| {
                let value = trial
                    .metrics
                    .get(metric.as_str())
                    .copied()
                    .filter(|value| value.is_finite())
                    .map_or(f64::INFINITY, |value| sign * value);
                (value, id.index)
            })
            .collect();
        let keep = max_series.min(ranked.len());
        if keep > 0 && keep < ranked.len() {
            ranked.select_nth_unstable_by(keep - 1, |a, b| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1)));
        }
        ranked.truncate(keep);
        ranked.sort_by(|a, b| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1)));
        let chosen = ranked
            .into_iter()
            .map(|(_, index)| TrialId {
                experiment: experiment_id,
                index,
            })
            .collect();
        Ok((metric, chosen))
    }

    /// A trial's configuration as JSON text, for labelling its curve.
    pub fn trial_config_json(&self, trial_id: TrialId) -> Option<&str> {
        self.book
            .get_trial(trial_id)
            .map(|trial| trial.config_json.as_str())
    }

    /// What the replicate statistics of `experiment_id` read, for a caller
    /// who sees `visible_team`'s experiments (see [`ReplicateStudy`]).
    pub fn replicates(
        &self,
        experiment_id: ExperimentId,
        metric: Option<&str>,
        visible_team: &dyn Fn(&str) -> bool,
    ) -> Result<ReplicateStudy, PageError> {
        self.dashboard_visible(experiment_id, visible_team)?;
        let spec = &self.book.spec(experiment_id);
        let metric = metric
            .or(spec.search.metric.as_deref())
            .ok_or(PageError::NoMetric { experiment_id })?;
        Ok(ReplicateStudy {
            catalog: self.book.catalog(),
            experiment_id,
            metric: metric.to_owned(),
            maximize: spec.search.mode == Mode::Max,
        })
    }

    /// Every node's GPUs with the live workers holding each (trial, rank and
    /// share), plus its state and last heartbeat. Workers of experiments the
    /// caller may not see are counted in `busy_milli` but not named.
    pub fn gpu_slots(&self, visible_team: &dyn Fn(&str) -> bool) -> Value {
        let mut holders: BTreeMap<(xp_runtime::ids::NodeId, u32), Vec<Value>> = BTreeMap::new();
        for trial in self.book.active_trials() {
            let Some(attempt) = trial.attempts.last().filter(|attempt| attempt.is_live()) else {
                continue;
            };
            let shown = self
                .book
                .get_spec(trial.id.experiment)
                .is_some_and(|spec| visible_team(&spec.team));
            for worker in attempt
                .workers
                .iter()
                .filter(|worker| worker.state.holds_resources())
            {
                for gpu in &worker.gpu_indices {
                    holders.entry((worker.node, *gpu)).or_default().push(json!({
                        "trial": shown.then(|| trial.id.to_string()),
                        "rank": shown.then_some(worker.rank),
                        "milli": worker.gpu_milli,
                    }));
                }
            }
        }
        let nodes: Vec<Value> = self
            .membership
            .nodes()
            .map(|node| {
                let gpus: Vec<Value> = node
                    .resources
                    .gpus
                    .iter()
                    .enumerate()
                    .map(|(position, gpu)| {
                        let index = u32::try_from(position).unwrap_or(u32::MAX);
                        let workers = holders.remove(&(node.id, index)).unwrap_or_default();
                        let busy: u64 = workers
                            .iter()
                            .filter_map(|worker| worker["milli"].as_u64())
                            .sum();
                        json!({
                            "index": index,
                            "model": gpu.model,
                            "memory_bytes": gpu.memory_bytes,
                            "busy_milli": busy,
                            "workers": workers,
                        })
                    })
                    .collect();
                json!({
                    "id": node.id.to_string(),
                    "name": node.name,
                    "state": node.state.as_str(),
                    "last_seen_ms": node.last_seen,
                    "gpus": gpus,
                })
            })
            .collect();
        json!({ "nodes": nodes })
    }
}

/// What the experiment page's parameter panels read: the search space as
/// declared (kind, scale, bounds or choices of each parameter) and the
/// finished trials' values and metric, ready for
/// [`crate::importance::ped_anova`]. The core gathers it (bounded by
/// [`importance::MAX_TRIALS`]); the importance itself is computed by whoever
/// holds it, so the head's actor does only the gathering.
#[derive(Debug, Clone)]
pub struct ParameterStudy {
    /// The metric rated against, if the experiment names one.
    pub metric: Option<String>,
    /// Whether larger values of the metric are better.
    pub maximize: bool,
    /// Every parameter of the space, as the page describes it.
    pub parameters: Vec<Value>,
    /// The parameters rated: those every trial has.
    pub rated: Vec<importance::Param>,
    /// Parameters not rated, and why.
    pub unrated: Vec<(String, &'static str)>,
    /// Finished trials (succeeded or stopped with a finite metric), the
    /// newest [`importance::MAX_TRIALS`], with their loss (lower is better).
    pub observations: Vec<importance::Observation>,
}

impl ParameterStudy {
    /// The answer of the dashboard's `parameters` endpoint: the parameters,
    /// and their importance by PED-ANOVA or why there is none.
    pub fn to_json(&self) -> Value {
        let mut importance = json!({
            "method": importance::METHOD,
            "reference": "Watanabe, Bansal and Hutter (2023), as Optuna's PedAnovaImportanceEvaluator computes it",
            "gamma": importance::DEFAULT_GAMMA,
            "trials": self.observations.len(),
            "unrated": self.unrated.iter().map(|(name, why)| json!({"name": name, "why": why})).collect::<Vec<_>>(),
        });
        let outcome = if self.metric.is_none() {
            json!({"status": "no_metric", "message": "this experiment names no metric"})
        } else {
            match importance::ped_anova(&self.rated, &self.observations, importance::DEFAULT_GAMMA)
            {
                Ok(found) => json!({
                    "status": "rated",
                    "top_trials": found.top_trials,
                    "values": found.ranked.iter().map(|(name, value)| json!({"name": name, "importance": value})).collect::<Vec<_>>(),
                }),
                Err(error @ importance::ImportanceError::NotEnoughTrials { .. }) => {
                    json!({"status": "not_enough_trials", "message": error.to_string(), "needed": importance::MIN_TRIALS})
                }
                Err(error) => json!({"status": "no_parameters", "message": error.to_string()}),
            }
        };
        if let (Value::Object(map), Value::Object(more)) = (&mut importance, outcome) {
            map.extend(more);
        }
        json!({
            "metric": self.metric,
            "mode": if self.maximize { "max" } else { "min" },
            "parameters": self.parameters,
            "importance": importance,
        })
    }
}

impl HeadCore {
    /// The experiment's parameters and the finished trials' values of them,
    /// for the parameter panels and their importance (see [`ParameterStudy`]).
    pub fn parameter_study(
        &self,
        experiment_id: ExperimentId,
        metric: Option<&str>,
        visible_team: &dyn Fn(&str) -> bool,
    ) -> Result<ParameterStudy, PageError> {
        self.dashboard_visible(experiment_id, visible_team)?;
        let spec = &self.book.spec(experiment_id);
        let metric = metric.or(spec.search.metric.as_deref()).map(str::to_owned);
        let maximize = spec.search.mode == Mode::Max;
        let space = &spec.search.space;
        let parameters = space
            .iter()
            .map(|(name, param)| parameter_json(name, param))
            .collect();
        let (mut rated, mut unrated) = (Vec::new(), Vec::new());
        let mut columns = Vec::new();
        for (name, param) in space.iter() {
            if param.is_conditional() {
                unrated.push((name.clone(), "present in some trials only"));
            } else {
                rated.push(importance::Param {
                    name: name.clone(),
                    domain: importance_domain(&param.domain, param),
                });
                columns.push((name.as_str(), param));
            }
        }
        let sign = if maximize { -1.0 } else { 1.0 };
        let mut observations = Vec::new();
        if let Some(metric) = &metric {
            let finished = self
                .book
                .trials_of(experiment_id)
                .rev()
                .filter_map(|(_, trial)| {
                    let value = trial
                        .metrics
                        .get(metric.as_str())
                        .copied()
                        .filter(|v| v.is_finite())?;
                    matches!(trial.state, TrialState::Succeeded | TrialState::Stopped)
                        .then_some((trial, value))
                });
            for (trial, value) in finished.take(importance::MAX_TRIALS) {
                let config: serde_json::Map<String, Value> =
                    serde_json::from_str(&trial.config_json).unwrap_or_default();
                let values = columns
                    .iter()
                    .map(|(name, param)| value_on_axis(config.get(*name), &param.domain))
                    .collect::<Option<Vec<f64>>>();
                if let Some(values) = values {
                    observations.push(importance::Observation {
                        loss: sign * value,
                        values,
                    });
                }
            }
            observations.reverse();
        }
        Ok(ParameterStudy {
            metric,
            maximize,
            parameters,
            rated,
            unrated,
            observations,
        })
    }
}

/// One parameter as the page describes it: `kind` (`real`, `int`, `choice`),
/// `scale` (`linear`, `log`, `categorical`), bounds and step or choices, and
/// whether it is conditional.
fn parameter_json(name: &str, param: &ParamSpec) -> Value {
    let conditional = param.is_conditional();
    match &param.domain {
        Domain::Uniform([low, high]) => json!({
            "name": name, "kind": "real", "scale": "linear", "low": low, "high": high, "conditional": conditional,
        }),
        Domain::Loguniform([low, high]) => json!({
            "name": name, "kind": "real", "scale": "log", "low": low, "high": high, "conditional": conditional,
        }),
        Domain::Int([low, high]) => json!({
            "name": name, "kind": "int", "scale": if param.log { "log" } else { "linear" },
            "low": low, "high": high, "step": param.step, "conditional": conditional,
        }),
        Domain::Choice(values) => json!({
            "name": name, "kind": "choice", "scale": "categorical", "choices": values, "conditional": conditional,
        }),
    }
}

/// A declared domain as PED-ANOVA reads it.
fn importance_domain(domain: &Domain, param: &ParamSpec) -> importance::Domain {
    match domain {
        Domain::Uniform([low, high]) => importance::Domain::Real {
            low: *low,
            high: *high,
            log: false,
        },
        Domain::Loguniform([low, high]) => importance::Domain::Real {
            low: *low,
            high: *high,
            log: true,
        },
        Domain::Int([low, high]) => importance::Domain::Int {
            low: *low,
            high: *high,
            step: param.step,
            log: param.log,
        },
        Domain::Choice(values) => importance::Domain::Choice {
            choices: values.len(),
        },
    }
}

/// A trial's value of a parameter as a number on its axis: the number itself,
/// or the index of its choice; `None` when it has none or another.
fn value_on_axis(value: Option<&Value>, domain: &Domain) -> Option<f64> {
    let value = value?;
    match domain {
        Domain::Choice(choices) => choices
            .iter()
            .position(|choice| serde_json::to_value(choice).ok().as_ref() == Some(value))
            .map(|index| index as f64),
        _ => value.as_f64(),
    }
}

/// One configuration's replicates: the final values of its succeeded trials,
/// how many trials it has, and the first of them.
struct Group {
    values: Vec<f64>,
    trials: u32,
    first: u32,
}

/// The GPUs an attempt holds: each worker's GPUs times its share of each.
fn attempt_gpus(attempt: &AttemptRecord) -> f64 {
    attempt
        .workers
        .iter()
        .map(|worker| worker.gpu_indices.len() as f64 * f64::from(worker.gpu_milli) / GPU_MILLI)
        .sum()
}

/// GPU-hours a trial's attempts held, the live one up to `now`.
fn trial_gpu_hours(trial: &TrialRecord, now: UnixMillis) -> f64 {
    trial
        .attempts
        .iter()
        .map(|attempt| {
            let held = attempt
                .ended_at
                .unwrap_or(now)
                .saturating_sub(attempt.placed_at);
            attempt_gpus(attempt) * held as f64 / HOUR_MS
        })
        .sum()
}

/// When a trial entered the system: its first placement or its queueing,
/// whichever is earlier (`queued_at` moves on a requeue; the first placement
/// does not). `None` for a trial that reused another's result and never queued.
fn arrival_of(trial: &TrialRecord) -> Option<UnixMillis> {
    if trial.reused_from.is_some() && trial.attempts.is_empty() {
        return None;
    }
    Some(trial.attempts.first().map_or(trial.queued_at, |first| {
        first.placed_at.min(trial.queued_at)
    }))
}

/// When a finished trial left the system: the end of its last attempt, or its
/// queueing when it ended without one (cancelled while queued).
fn departure_of(trial: &TrialRecord) -> Option<UnixMillis> {
    match trial.attempts.last() {
        Some(attempt) => attempt.ended_at,
        None => Some(trial.queued_at),
    }
}

/// The best `MAX_REPLICATE_GROUPS` groups by mean (groups without a value
/// last, ties by first trial), best first. Only the groups shown are
/// summarised and turned into JSON: with 10,000 trials that is most of the
/// work saved.
fn best_groups(groups: HashMap<String, Group>, maximize: bool) -> Vec<(f64, u32, String, Group)> {
    let sort_key = |group: &Group| {
        if group.values.is_empty() {
            return f64::INFINITY;
        }
        let mean = group.values.iter().sum::<f64>() / group.values.len() as f64;
        if maximize { -mean } else { mean }
    };
    let mut ranked: Vec<(f64, u32, String, Group)> = groups
        .into_iter()
        .map(|(config, group)| (sort_key(&group), group.first, config, group))
        .collect();
    let order = |a: &(f64, u32, String, Group), b: &(f64, u32, String, Group)| {
        a.0.total_cmp(&b.0).then(a.1.cmp(&b.1))
    };
    let keep = MAX_REPLICATE_GROUPS.min(ranked.len());
    if keep > 0 && keep < ranked.len() {
        ranked.select_nth_unstable_by(keep - 1, order);
    }
    ranked.truncate(keep);
    ranked.sort_by(order);
    ranked
}

/// A trial detail's `events`: those of `events` (newest first, as the store
/// gave them) that are `trial_id`'s, at most [`MAX_TRIAL_EVENTS`].
pub fn trial_events_json(trial_id: TrialId, events: &[TrialEvent]) -> Value {
    let events = events
        .iter()
        .filter(|event| event.trial == trial_id)
        .take(MAX_TRIAL_EVENTS)
        .map(|event| {
            json!({
                "seq": event.seq,
                "at_ms": event.at,
                "state": event.state.as_str(),
                "attempt": event.attempt,
                "reason": event.reason,
            })
        })
        .collect();
    Value::Array(events)
}

/// What an experiment's replicate statistics read, as it was when they were
/// asked for: they walk every trial of the experiment (about 20 ms at
/// 10,000), so they are computed off the head's actor
/// ([`ReplicateStudy::to_json`]) on a copy of the book (a few reference
/// counts).
#[derive(Debug, Clone)]
pub struct ReplicateStudy {
    catalog: Catalog,
    experiment_id: ExperimentId,
    metric: String,
    maximize: bool,
}

impl ReplicateStudy {
    /// Replicate statistics: the experiment's trials grouped by configuration,
    /// each group's final `metric` values summarised (mean, standard deviation,
    /// Student-t 95% interval, by `xp_tune::stats::summarize`), best mean first,
    /// at most [`MAX_REPLICATE_GROUPS`]. As `xp compare` does, the seed is not
    /// part of a configuration and only succeeded trials with a finite value
    /// count; `total_groups` says how many configurations there are.
    pub fn to_json(&self) -> Value {
        let groups = replicate_groups(&self.catalog, self.experiment_id, &self.metric);
        let total_groups = groups.len();
        let maximize = self.maximize;
        let ranked = best_groups(groups, maximize);
        let finite = |value: f64| value.is_finite().then_some(value);
        let rows: Vec<Value> = ranked
            .into_iter()
            .map(|(_, first, config, group)| {
                let summary = xp_tune::stats::summarize(&group.values);
                json!({
                    "config": serde_json::from_str::<Value>(&config).unwrap_or(Value::Null),
                    "trials": group.trials,
                    "first_trial": TrialId { experiment: self.experiment_id, index: first }.to_string(),
                    "n": group.values.len(),
                    "mean": summary.as_ref().map(|summary| summary.mean),
                    "std_dev": summary.as_ref().and_then(|summary| finite(summary.std_dev)),
                    "ci95_low": summary.as_ref().and_then(|summary| finite(summary.ci95.0)),
                    "ci95_high": summary.as_ref().and_then(|summary| finite(summary.ci95.1)),
                })
            })
            .collect();
        json!({
            "metric": self.metric,
            "mode": if maximize { "max" } else { "min" },
            "total_groups": total_groups,
            "groups": rows,
        })
    }
}

/// An experiment's trials grouped as `xp compare` groups them: by
/// configuration without its seed, each group with the finite values of
/// `metric` its succeeded trials reached.
fn replicate_groups(
    catalog: &Catalog,
    experiment_id: ExperimentId,
    metric: &str,
) -> HashMap<String, Group> {
    let mut groups: HashMap<String, Group> = HashMap::new();
    for (_, trial) in catalog.trials_of(experiment_id) {
        let mut config: serde_json::Map<String, Value> =
            serde_json::from_str(&trial.config_json).unwrap_or_default();
        config.remove("seed");
        let group = groups
            .entry(Value::Object(config).to_string())
            .or_insert_with(|| Group {
                values: Vec::new(),
                trials: 0,
                first: trial.id.index,
            });
        group.trials += 1;
        if trial.state.ended_normally()
            && let Some(value) = trial
                .metrics
                .get(metric)
                .copied()
                .filter(|value| value.is_finite())
        {
            group.values.push(value);
        }
    }
    groups
}
