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
use std::sync::{Arc, Mutex, PoisonError};

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
use crate::state::Catalog;

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
    /// An experiment's trials grouped as `xp compare` groups them: by
    /// configuration without its seed, each group with the finite values of
    /// `metric` its succeeded trials reached.
    fn replicate_groups(
        &self,
        experiment_id: ExperimentId,
        metric: &str,
    ) -> HashMap<String, Group> {
        let mut groups: HashMap<String, Group> = HashMap::new();
        for (_, trial) in self.book.trials_of(experiment_id) {
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
        let events: Vec<Value> = events
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
            map.insert("events".into(), Value::Array(events));
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

    /// Replicate statistics: the experiment's trials grouped by configuration,
    /// each group's final `metric` values summarised (mean, standard deviation,
    /// Student-t 95% interval, by `xp_tune::stats::summarize`), best mean first,
    /// at most [`MAX_REPLICATE_GROUPS`]. As `xp compare` does, the seed is not
    /// part of a configuration and only succeeded trials with a finite value count; `total_groups` says how many configurations there are.
    pub fn replicates(
        &self,
        experiment_id: ExperimentId,
        metric: Option<&str>,
        visible_team: &dyn Fn(&str) -> bool,
    ) -> Result<Value, PageError> {
        self.dashboard_visible(experiment_id, visible_team)?;
        let spec = &self.book.spec(experiment_id);
        let metric = metric
            .or(spec.search.metric.as_deref())
            .ok_or(PageError::NoMetric { experiment_id })?;
        let groups = self.replicate_groups(experiment_id, metric);
        let total_groups = groups.len();
        let maximize = spec.search.mode == Mode::Max;
        let ranked = best_groups(groups, maximize);
        let finite = |value: f64| value.is_finite().then_some(value);
        let rows: Vec<Value> = ranked
            .into_iter()
            .map(|(_, first, config, group)| {
                let summary = xp_tune::stats::summarize(&group.values);
                json!({
                    "config": serde_json::from_str::<Value>(&config).unwrap_or(Value::Null),
                    "trials": group.trials,
                    "first_trial": TrialId { experiment: experiment_id, index: first }.to_string(),
                    "n": group.values.len(),
                    "mean": summary.as_ref().map(|summary| summary.mean),
                    "std_dev": summary.as_ref().and_then(|summary| finite(summary.std_dev)),
                    "ci95_low": summary.as_ref().and_then(|summary| finite(summary.ci95.0)),
                    "ci95_high": summary.as_ref().and_then(|summary| finite(summary.ci95.1)),
                })
            })
            .collect();
        Ok(json!({
            "metric": metric,
            "mode": if maximize { "max" } else { "min" },
            "total_groups": total_groups,
            "groups": rows,
        }))
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

    /// Queued trials of visible experiments, longest waiting first, at most
    /// `limit`, each with its queue and why it waits; `total` counts them all.
    pub fn waiting_trials(&self, limit: usize, visible_team: &dyn Fn(&str) -> bool) -> Value {
        let mut queued: Vec<&TrialRecord> = self
            .book
            .active_trials()
            .filter(|trial| trial.state == TrialState::Queued)
            .filter(|trial| {
                self.book
                    .get_spec(trial.id.experiment)
                    .is_some_and(|spec| visible_team(&spec.team))
            })
            .collect();
        let total = queued.len();
        let keep = limit.max(1).min(total);
        let order =
            |a: &&TrialRecord, b: &&TrialRecord| (a.queued_at, a.id).cmp(&(b.queued_at, b.id));
        if keep > 0 && keep < total {
            queued.select_nth_unstable_by(keep - 1, order);
        }
        queued.truncate(keep);
        queued.sort_by(order);
        let items: Vec<Value> = queued
            .into_iter()
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
                    "waiting": self.trial_status(trial).waiting,
                })
            })
            .collect();
        json!({ "items": items, "total": total })
    }

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
/// (a million trials' histories take 0.15 s to make the first time).
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
