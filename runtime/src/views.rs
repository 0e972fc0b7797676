//! The JSON shapes people and scripts see, shared by `xp status --json` and the
//! head's HTTP API so the two never drift apart.
//!
//! A non-finite metric value is the string `"NaN"`, `"Infinity"` or `"-Infinity"`
//! (JSON has no such numbers), and a trial's `nonfinite` map names which of its
//! metrics are (`crate::metric_value`).

use serde_json::{Value, json};

use crate::protocol::{ExperimentStatus, FrontStatus, NodeStatus, ObjectiveStatus, TrialStatus};

/// One experiment as a JSON object with `id`, `name`, `state` and `trials`; a
/// multi-objective one also has `objectives` and `front` ([`front_json`]).
pub fn experiment_json(experiment: &ExperimentStatus) -> Value {
    let mut value = json!({
        "id": experiment.id.to_string(),
        "name": experiment.name,
        "team": experiment.team,
        "state": experiment.state.as_str(),
        "metric": experiment.metric,
        "mode": if experiment.maximize { "max" } else { "min" },
        "submitted_at_ms": experiment.submitted_at,
        "code_version": experiment.code_version,
        "data_version": experiment.data_version,
        "trials": experiment.trials.iter().map(trial_json).collect::<Vec<_>>(),
        "gpu_hours": experiment.trials.iter().map(|trial| trial.gpu_hours).sum::<f64>(),
        "cost": experiment.trials.iter().map(|trial| trial.cost).sum::<Option<f64>>(),
    });
    if let Some(front) = &experiment.front {
        value["objectives"] = objectives_json(&experiment.objectives);
        value["front"] = front_json(experiment, front);
    }
    value
}

/// The objectives as `[{"metric": NAME, "mode": "max"|"min"}]`.
pub fn objectives_json(objectives: &[ObjectiveStatus]) -> Value {
    objectives
        .iter()
        .map(|objective| {
            json!({
                "metric": objective.metric,
                "mode": if objective.maximize { "max" } else { "min" },
            })
        })
        .collect()
}

/// The Pareto front: `hypervolume`, `reference` (with `reference_declared`),
/// `evaluated` and `trials`, each with its `id`, `config`, `values` (metric to
/// value) and `contribution`, largest contribution first.
pub fn front_json(experiment: &ExperimentStatus, front: &FrontStatus) -> Value {
    // One lookup table, not a scan of every trial per member of the front.
    let config_json: std::collections::HashMap<_, &str> = experiment
        .trials
        .iter()
        .map(|trial| (trial.id, trial.config_json.as_str()))
        .collect();
    let trials: Vec<Value> = front
        .trials
        .iter()
        .map(|member| {
            let config = config_json
                .get(&member.trial)
                .and_then(|text| serde_json::from_str::<Value>(text).ok())
                .unwrap_or(Value::Null);
            let values: serde_json::Map<String, Value> = experiment
                .objectives
                .iter()
                .zip(&member.values)
                .map(|(objective, value)| {
                    (
                        objective.metric.clone(),
                        crate::metric_value::value_json(*value),
                    )
                })
                .collect();
            json!({
                "id": member.trial.to_string(),
                "config": config,
                "values": values,
                "contribution": crate::metric_value::value_json(member.contribution),
            })
        })
        .collect();
    json!({
        "hypervolume": crate::metric_value::value_json(front.hypervolume),
        "reference": front.reference.iter().map(|value| crate::metric_value::value_json(*value)).collect::<Vec<_>>(),
        "reference_declared": front.reference_declared,
        "evaluated": front.evaluated,
        "size": front.trials.len(),
        "trials": trials,
    })
}

/// One trial as a JSON object with `id`, `state`, `config`, `attempts` and `metrics`.
pub fn trial_json(trial: &TrialStatus) -> Value {
    let config: Value = serde_json::from_str(&trial.config_json).unwrap_or(Value::Null);
    json!({
        "id": trial.id.to_string(),
        "state": trial.state.as_str(),
        "config": config,
        "attempts": trial.attempts.iter().map(|attempt| json!({
            "number": attempt.number,
            "nodes": attempt.nodes.iter().map(ToString::to_string).collect::<Vec<_>>(),
            "placed_at_ms": attempt.placed_at,
            "running_at_ms": attempt.running_at,
            "ended_at_ms": attempt.ended_at,
            "outcome": attempt.outcome,
            "resumed_from": attempt.resumed_from.map(|(step, attempt)| json!({"step": step, "attempt": attempt})),
        })).collect::<Vec<_>>(),
        "metrics": crate::metric_value::values_json(&trial.metrics),
        "nonfinite": crate::metric_value::nonfinite_json(&trial.metrics),
        "last_step": trial.last_step,
        "reason": trial.reason,
        "reused_from": trial.reused_from.map(|source| source.to_string()),
        "gpu_hours": trial.gpu_hours,
        "cost": trial.cost,
        "waiting": trial.waiting,
        "malformed_metrics": trial.malformed_metrics.as_ref().map(|malformed| json!({
            "count": malformed.count,
            "first": malformed.first,
        })),
    })
}

/// One checkpoint as a JSON object; `replicated` is false, with the reason in
/// `unreplicated`, while neither two live nodes nor a backup hold it.
pub fn checkpoint_json(checkpoint: &crate::protocol::CheckpointStatus) -> Value {
    json!({
        "trial": checkpoint.trial.to_string(),
        "attempt": checkpoint.attempt,
        "step": checkpoint.step,
        "at_ms": checkpoint.at,
        "bytes": checkpoint.bytes,
        "files": checkpoint.files.iter().map(|file| json!({
            "name": file.name,
            "object": file.object.to_string(),
            "size": file.size,
        })).collect::<Vec<_>>(),
        "metric": checkpoint.metric.map(crate::metric_value::value_json),
        "replicas": checkpoint.replicas.iter().map(ToString::to_string).collect::<Vec<_>>(),
        "backup": checkpoint.backup,
        "replicated": checkpoint.unreplicated.is_none(),
        "unreplicated": checkpoint.unreplicated,
    })
}

/// One node as a JSON object; `address` is the host or address the others
/// reach it at (its workers' `MASTER_ADDR` when it runs rank 0).
pub fn node_json(node: &NodeStatus) -> Value {
    json!({
        "id": node.id.to_string(),
        "name": node.name,
        "address": node.address,
        "state": node.state.as_str(),
        "gpus": node.capacity.gpus.len(),
        "gpu_models": node.capacity.gpus.iter().map(|gpu| gpu.model.clone()).collect::<Vec<_>>(),
        "free_gpus": node.free_gpus,
        "cpus": f64::from(node.capacity.cpu_milli) / 1000.0,
        "free_cpus": f64::from(node.free_cpu_milli) / 1000.0,
        "memory_bytes": node.capacity.memory_bytes,
        "free_memory_bytes": node.free_memory_bytes,
        "labels": node.labels,
        "running_workers": node.running_workers,
        "last_seen_ms": node.last_seen,
        "isolation": node.isolation.label(),
        "worker_uids": node.isolation.worker_uids,
        "limits": node.isolation.limits.as_str(),
        "gpu_telemetry": node.gpu_telemetry.iter().map(|gpu| {
            let mut sample = serde_json::Map::new();
            sample.insert("index".into(), json!(gpu.index));
            sample.insert("util".into(), json!(gpu.util));
            sample.insert("memory_used_bytes".into(), json!(gpu.memory_used_bytes));
            if let Some(power) = gpu.power_w {
                sample.insert("power_w".into(), json!(power));
            }
            Value::Object(sample)
        }).collect::<Vec<_>>(),
    })
}

/// A trial's telemetry as `{trial, workers: [{rank, series: [point]}]}`, each
/// point `{t_ms, samples, cpu_cores, rss_bytes, gpu_util, gpu_mem_bytes,
/// gpu_power_w}` (the means over its window; `t_ms` is its last sample's time),
/// with `cpu_cores_max` and `rss_bytes_max`, and every field the node could not
/// measure left out.
pub fn telemetry_json(telemetry: &crate::protocol::TrialTelemetry) -> Value {
    json!({
        "trial": telemetry.trial.to_string(),
        "workers": telemetry.workers.iter().map(|worker| json!({
            "rank": worker.rank,
            "series": worker.windows.iter().map(telemetry_point_json).collect::<Vec<_>>(),
        })).collect::<Vec<_>>(),
    })
}

/// One window of a worker's series as a JSON point (see [`telemetry_json`]).
pub fn telemetry_point_json(window: &crate::protocol::TelemetryWindow) -> Value {
    let mut point = serde_json::Map::new();
    point.insert("t_ms".into(), json!(window.end_ms));
    point.insert("samples".into(), json!(window.samples));
    if let Some(cpu) = window.cpu_cores {
        point.insert("cpu_cores".into(), json!(cpu.mean()));
        point.insert("cpu_cores_max".into(), json!(cpu.max));
    }
    if let Some(rss) = window.rss_bytes {
        point.insert("rss_bytes".into(), json!(rss.mean().round() as u64));
        point.insert("rss_bytes_max".into(), json!(rss.max.round() as u64));
    }
    if let Some(util) = window.gpu_util {
        point.insert("gpu_util".into(), json!(util.mean()));
    }
    if let Some(memory) = window.gpu_mem_bytes {
        point.insert("gpu_mem_bytes".into(), json!(memory.mean().round() as u64));
    }
    if let Some(power) = window.gpu_power_w {
        point.insert("gpu_power_w".into(), json!(power.mean()));
    }
    Value::Object(point)
}

/// One alert as a JSON object: `id`, `experiment`, `trial`, `rule`, `kind`,
/// `metric`, `value` (a non-finite one as its name), `step`, `at_ms`, `message`,
/// `actions`, `delivery` (`none`, `pending`, `delivered`, `failed`, `dropped`,
/// with `delivery_attempts` and `delivery_error`) and `cleared_at_ms`.
pub fn alert_json(alert: &crate::protocol::AlertStatus) -> Value {
    use crate::protocol::DeliveryState;
    let (attempts, error) = match &alert.delivery {
        DeliveryState::Pending { attempts } | DeliveryState::Delivered { attempts, .. } => {
            (Some(*attempts), None)
        }
        DeliveryState::Failed { attempts, error } => (Some(*attempts), Some(error.clone())),
        DeliveryState::DroppedBecause { reason } => (None, Some(reason.clone())),
        DeliveryState::NotRequested | DeliveryState::Dropped => (None, None),
    };
    json!({
        "id": alert.id,
        "experiment": alert.trial.experiment.to_string(),
        "trial": alert.trial.to_string(),
        "rule": alert.rule,
        "kind": alert.kind,
        "metric": alert.metric,
        "value": alert.value.map(crate::metric_value::value_json),
        "step": alert.step,
        "at_ms": alert.at,
        "message": alert.message,
        "actions": alert.actions,
        "delivery": alert.delivery.label(),
        "delivery_attempts": attempts,
        "delivery_error": error,
        "cleared_at_ms": alert.cleared_at,
    })
}

/// `xp report --json` and `GET /api/report`: one object with the scope and
/// window, `gpu_hours`, `gpu_hours_lost` (and `lost_by_cause`), `cost`,
/// `utilization`, `throughput_per_hour`, `mean_time_in_system_s`,
/// `mean_in_system`, `littles_law_ratio`, the return on GPU-hours (top level:
/// `best_vs_gpu_hours`, `last_quarter_gain` and `roi_percent` of the one
/// experiment when the scope is one, else null; every experiment's under
/// `returns`) and `amdahl` (a list of fits, empty where none applies).
pub fn report_json(report: &crate::report::UsageReport) -> Value {
    let queueing = &report.queueing;
    let only = match report.returns.as_slice() {
        [only] if report.scope.starts_with("experiment") => Some(only),
        _ => None,
    };
    let lambda_w = queueing
        .mean_time_in_system_s
        .map(|w| queueing.throughput_per_hour / 3600.0 * w);
    json!({
        "scope": report.scope,
        "window_start_ms": report.window_start,
        "window_end_ms": report.window_end,
        "window_s": report.window_end.saturating_sub(report.window_start) as f64 / 1000.0,
        "gpu_hours": report.gpu_hours,
        "gpu_hours_lost": report.gpu_hours_lost,
        "lost_by_cause": {
            "preemption": report.lost_by_cause.preemption,
            "failure": report.lost_by_cause.failure,
            "node_loss": report.lost_by_cause.node_loss,
        },
        "by_model": report.by_model.iter().map(|model| json!({
            "model": model.model,
            "gpu_hours": model.gpu_hours,
            "price_per_hour": model.price_per_hour,
            "cost": model.cost,
        })).collect::<Vec<_>>(),
        "cost": report.cost,
        "cost_lost": report.cost_lost,
        "unpriced_gpu_hours": report.unpriced_gpu_hours,
        "available_gpu_hours": report.available_gpu_hours,
        "utilization": report.utilization,
        "busy_gpu_hours": report.busy_gpu_hours,
        "busy_utilization": report.busy_utilization,
        "arrived": queueing.arrived,
        "finished": queueing.finished,
        "throughput_per_hour": queueing.throughput_per_hour,
        "mean_time_in_system_s": queueing.mean_time_in_system_s,
        "mean_in_system": queueing.mean_in_system,
        "lambda_w": lambda_w,
        "littles_law_ratio": queueing.littles_law_ratio,
        "best_vs_gpu_hours": only.map(curve_json),
        "last_quarter_gain": only.and_then(|figures| figures.last_quarter_gain),
        "roi_percent": only.and_then(|figures| figures.roi_percent),
        "returns": report.returns.iter().map(return_json).collect::<Vec<_>>(),
        "amdahl": report.amdahl.iter().map(amdahl_json).collect::<Vec<_>>(),
    })
}

/// An experiment's best value against the GPU-hours spent to reach it.
fn curve_json(figures: &crate::report::ExperimentReturn) -> Vec<Value> {
    figures
        .best_vs_gpu_hours
        .iter()
        .map(|point| {
            json!({
                "gpu_hours": point.gpu_hours,
                "best": point.best,
                "trial": point.trial.to_string(),
                "value": point.value,
            })
        })
        .collect()
}

/// One experiment's return on its GPU-hours, for `returns`.
fn return_json(figures: &crate::report::ExperimentReturn) -> Value {
    json!({
        "experiment": figures.experiment.to_string(),
        "metric": figures.metric,
        "mode": if figures.maximize { "max" } else { "min" },
        "gpu_hours": figures.gpu_hours,
        "cost": figures.cost,
        "best": figures.best,
        "best_vs_gpu_hours": curve_json(figures),
        "last_quarter_gain": figures.last_quarter_gain,
        "value_per_unit": figures.value_per_unit,
        "roi_percent": figures.roi_percent,
    })
}

/// One Amdahl fit and the points it was fitted to, for `amdahl`.
fn amdahl_json(fit: &crate::report::AmdahlFit) -> Value {
    json!({
        "name": fit.name,
        "varied": fit.varied,
        "serial_fraction": fit.serial_fraction,
        "predicted_parallelism": fit.predicted_parallelism,
        "predicted_speedup": fit.predicted_speedup,
        "points": fit.points.iter().map(|point| json!({
            "parallelism": point.parallelism,
            "seconds": point.seconds,
            "speedup": point.speedup,
            "experiments": point.experiments.iter().map(ToString::to_string).collect::<Vec<_>>(),
        })).collect::<Vec<_>>(),
    })
}
