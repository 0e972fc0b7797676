//! Read-only answers for clients: experiment and trial status, nodes, queues,
//! where a worker's log lives, and the event feed.
//!
//! Nothing here changes state or decides anything; each view reads the core's
//! records and the policy core's books as they are at the moment of the call.

use std::collections::BTreeMap;

use xp_runtime::ids::{ExperimentId, NodeId, WorkerKey};
use xp_runtime::protocol::{
    AttemptStatus, ExperimentState, ExperimentStatus, LogRequest, NodeStatus, QueueStatus,
    ResourceAmounts, TrialState, TrialStatus,
};
use xp_runtime::spec::Mode;
use xp_sched::{Amount, GPU_MILLI, QueueUsage};

use super::{CoreError, HeadCore, NodeRecord, TrialRecord};
use crate::front::objectives_status;
use crate::state::Catalog;
use crate::usage::trial_usage;

impl HeadCore {
    /// The nodes as `xp nodes` shows them.
    pub fn nodes_status(&self) -> Vec<NodeStatus> {
        let running = self.running_workers_by_node();
        self.membership
            .nodes()
            .map(|node| self.node_status(node, &running))
            .collect()
    }

    /// How many live workers each node runs, in one pass over the workers (not
    /// one per node).
    pub(super) fn running_workers_by_node(&self) -> BTreeMap<NodeId, u32> {
        let mut running: BTreeMap<NodeId, u32> = BTreeMap::new();
        for worker in self
            .book
            .trials()
            .flat_map(|trial| &trial.attempts)
            .flat_map(|attempt| &attempt.workers)
            .filter(|worker| worker.state.holds_resources())
        {
            *running.entry(worker.node).or_default() += 1;
        }
        running
    }

    /// One node as `xp nodes` shows it; `running` is [`Self::running_workers_by_node`].
    pub(super) fn node_status(
        &self,
        node: &NodeRecord,
        running: &BTreeMap<NodeId, u32>,
    ) -> NodeStatus {
        let free = self
            .placement
            .policy()
            .pool()
            .node_free(node.id)
            .unwrap_or_default();
        NodeStatus {
            id: node.id,
            name: node.name.clone(),
            address: node.address.clone(),
            state: node.state,
            capacity: node.resources.clone(),
            // Whole idle GPUs; shares of partly used ones do not add up to one.
            free_gpus: self
                .placement
                .policy()
                .pool()
                .node_gpu_used(node.id)
                .map_or(0, |used| used.iter().filter(|milli| **milli == 0).count())
                as u32,
            free_cpu_milli: u32::try_from(free.cpu_milli).unwrap_or(u32::MAX),
            free_memory_bytes: free.memory_bytes,
            labels: node.labels.clone(),
            running_workers: running.get(&node.id).copied().unwrap_or(0),
            last_seen: node.last_seen,
            isolation: node.isolation,
            gpu_telemetry: self.node_gpu_telemetry(node.id),
        }
    }

    /// Where a worker's log lives: its node, its key, and whether it has exited.
    pub fn locate_worker(
        &self,
        request: &LogRequest,
    ) -> Result<(NodeId, WorkerKey, bool), CoreError> {
        let trial = self
            .book
            .get_trial(request.trial)
            .ok_or(CoreError::TrialNotFound {
                trial_id: request.trial,
            })?;
        let attempt = match request.attempt {
            Some(number) => trial
                .attempts
                .iter()
                .find(|attempt| attempt.number == number),
            None => trial.attempts.last(),
        }
        .ok_or(CoreError::AttemptNotFound {
            trial_id: request.trial,
            attempt: request.attempt,
        })?;
        let worker = attempt
            .workers
            .iter()
            .find(|worker| worker.rank == request.rank)
            .ok_or(CoreError::RankNotFound {
                trial_id: request.trial,
                attempt: attempt.number,
                rank: request.rank,
            })?;
        let key = WorkerKey {
            trial: trial.id,
            attempt: attempt.number,
            rank: worker.rank,
        };
        Ok((worker.node, key, !worker.state.holds_resources()))
    }

    /// The experiment's state ([`ExperimentState::of`]).
    pub(super) fn experiment_state(&self, id: ExperimentId) -> ExperimentState {
        experiment_state(&self.book, id)
    }

    /// An experiment and its trials as `xp status` shows them, without its
    /// Pareto front.
    pub(crate) fn experiment_status(&self, id: ExperimentId) -> ExperimentStatus {
        let mut status = self.experiment_status_without_trials(id);
        // The prices once, not once per trial.
        let prices = self.price_list();
        let node = |node| self.membership.node(node);
        status.trials = self
            .book
            .trials_of(id)
            .map(|(_, trial)| {
                let usage = trial_usage(node, &prices, trial);
                trial_status(trial, usage, self.waiting_reason(trial))
            })
            .collect();
        status
    }

    /// An experiment as `xp status` shows it, without its trials and its
    /// Pareto front (`PendingStatus` adds that, off the actor).
    pub(crate) fn experiment_status_without_trials(&self, id: ExperimentId) -> ExperimentStatus {
        experiment_status_without_trials(&self.book, id)
    }

    /// Why a queued trial waits (the policy core's reason, or admission's
    /// when the core does not hold it yet); `None` for any other state.
    pub(crate) fn waiting_reason(&self, trial: &TrialRecord) -> Option<String> {
        (trial.state == TrialState::Queued).then(|| {
            self.placement.policy().wait_reason(trial.id).map_or_else(
                || "admission: its team is at its pending limit".to_owned(),
                |reason| reason.to_string(),
            )
        })
    }

    /// One trial as `xp status` shows it.
    pub(super) fn trial_status(&self, trial: &TrialRecord) -> TrialStatus {
        trial_status(trial, self.trial_usage(trial), self.waiting_reason(trial))
    }

    /// Every queue's standing, for `xp queue`.
    pub fn queues(&self) -> Vec<QueueStatus> {
        self.placement
            .policy()
            .queues()
            .into_iter()
            .map(queue_status)
            .collect()
    }
}

/// A queue's standing in wire terms; an unlimited amount (`u64::MAX`) is left out.
fn queue_status(usage: QueueUsage) -> QueueStatus {
    let amounts = |amount: Amount| ResourceAmounts {
        gpu: (amount.gpu_milli != u64::MAX).then(|| amount.gpu_milli as f64 / GPU_MILLI as f64),
        cpu: (amount.cpu_milli != u64::MAX).then(|| amount.cpu_milli as f64 / 1000.0),
        memory_bytes: (amount.memory_bytes != u64::MAX).then_some(amount.memory_bytes),
    };
    QueueStatus {
        name: usage.name,
        team: usage.team,
        cohort: usage.cohort,
        weight: usage.weight,
        usage: amounts(usage.usage),
        quota: amounts(usage.quota),
        borrowed: amounts(usage.borrowed),
        lent: amounts(usage.lent),
        pending: usage.pending,
        running: usage.running,
        fair_share: usage.dominant_share,
        leases: usage.leases,
        lease_quota: usage.lease_quota,
    }
}

/// The state of experiment `id` of `catalog` ([`ExperimentState::of`]).
pub(crate) fn experiment_state(catalog: &Catalog, id: ExperimentId) -> ExperimentState {
    let cancelled = catalog.experiment(id).cancelled;
    let (mut unfinished, mut ended_normally) = (false, false);
    // `of` looks no further than a cancel or one unfinished trial: nor does
    // this (an experiment may hold 100,000 trials, and this runs for every
    // experiment in a listing and every second for the alerts).
    if !cancelled {
        for (_, trial) in catalog.trials_of(id) {
            if !trial.state.is_terminal() {
                unfinished = true;
                break;
            }
            ended_normally |= trial.state.ended_normally();
        }
    }
    ExperimentState::of(cancelled, unfinished, ended_normally)
}

/// Experiment `id` of `catalog` as `xp status` shows it, without its trials
/// and its Pareto front.
pub(crate) fn experiment_status_without_trials(
    catalog: &Catalog,
    id: ExperimentId,
) -> ExperimentStatus {
    let experiment = &catalog.experiment(id);
    let spec = &catalog.spec(id);
    ExperimentStatus {
        id,
        name: spec.name.clone(),
        team: spec.team.clone(),
        state: experiment_state(catalog, id),
        metric: spec.search.metric.clone(),
        maximize: spec.search.mode == Mode::Max,
        submitted_at: experiment.submitted_at,
        code_version: experiment.code_version.clone(),
        data_version: experiment.data_version.clone(),
        trials: Vec::new(),
        objectives: objectives_status(&spec.search),
        front: None,
    }
}

/// One trial as `xp status` shows it, with its `(gpu_hours, cost)` and why
/// it waits.
pub(crate) fn trial_status(
    trial: &TrialRecord,
    (gpu_hours, cost): (f64, Option<f64>),
    waiting: Option<String>,
) -> TrialStatus {
    TrialStatus {
        id: trial.id,
        state: trial.state,
        config_json: trial.config_json.clone(),
        attempts: trial
            .attempts
            .iter()
            .map(|attempt| AttemptStatus {
                number: attempt.number,
                nodes: attempt.workers.iter().map(|worker| worker.node).collect(),
                placed_at: attempt.placed_at,
                running_at: attempt.running_at,
                ended_at: attempt.ended_at,
                outcome: attempt.outcome.as_deref().map(str::to_owned),
                resumed_from: attempt.resumed_from,
            })
            .collect(),
        metrics: trial
            .metrics
            .iter()
            .map(|(name, value)| (name.to_string(), *value))
            .collect(),
        last_step: trial.last_step,
        reason: trial.reason.as_deref().map(str::to_owned),
        reused_from: trial.reused_from,
        waiting,
        gpu_hours,
        cost,
        malformed_metrics: trial.malformed_metrics.as_deref().cloned(),
    }
}
