//! The JSON shapes people and scripts see, shared by `xp status --json` and the
//! head's HTTP API so the two never drift apart.

use serde_json::{Value, json};

use crate::protocol::{ExperimentStatus, NodeStatus, TrialStatus};

/// One experiment as a JSON object with `id`, `name`, `state` and `trials`.
pub fn experiment_json(experiment: &ExperimentStatus) -> Value {
    json!({
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
        "metrics": trial.metrics,
        "last_step": trial.last_step,
        "reason": trial.reason,
        "reused_from": trial.reused_from.map(|source| source.to_string()),
        "waiting": trial.waiting,
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
        "metric": checkpoint.metric,
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
    })
}
