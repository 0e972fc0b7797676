//! What `/metrics` shows of the head's state, computed at scrape time from the
//! core so that it can never drift from it: trials by queue and state, waiting
//! trials per queue, GPUs per node and model, nodes by state.
//!
//! [`snapshot`] is the pure part (tested below); [`HeadCore::metrics_snapshot`]
//! feeds it the core's tables. Every label is bounded by the cluster's
//! configuration (queues, nodes, GPU models, states), never by the work
//! submitted to it: no trial or experiment id becomes a label. [`Tally`] is
//! what the core counts as it happens, for the actor to take after each commit.

use std::collections::BTreeMap;
use std::time::Duration;

use xp_runtime::ids::ExperimentId;
use xp_runtime::protocol::{NodeResources, NodeState, QueueStatus, TeamObjectCounts, TrialState};

use super::{HeadCore, WorkerRecord};

/// The label of a trial whose queue no policy names (no queue fits its team).
pub const NO_QUEUE: &str = "none";

/// The most decision timings and transitions kept between two drains; the
/// actor drains them on every commit, so this only bounds a long outage.
const MAX_TALLIED: usize = 4096;

/// What happened since the actor last took the tally: counted where it
/// happens (a trial's state changed, a checkpoint was recorded for the first
/// time, a policy decision ran), counted by the actor once stored.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Tally {
    /// The new state of each trial that changed state (a repeat of its state
    /// with a new reason is not a change).
    pub transitions: Vec<TrialState>,
    /// Attempts that failed through the trial's fault, by kind (`failed`,
    /// `oom-killed`, `time-limit`: the callers' few names).
    pub attempt_failures: BTreeMap<String, u64>,
    /// Checkpoints recorded (a report resent after a reconnect is not counted again).
    pub checkpoints: u64,
    /// Their bytes.
    pub checkpoint_bytes: u64,
    /// How long the node took to store each new checkpoint.
    pub checkpoint_takes: Vec<Duration>,
    /// Oversubscribed workers their nodes evicted for GPU memory.
    pub gpu_memory_evictions: u64,
    /// What users fetched and stored through the nodes' object servers (and
    /// what was refused), per team, as the nodes reported it.
    pub object_access: BTreeMap<String, TeamObjectCounts>,
}

impl Tally {
    /// A trial changed to `state`.
    pub(super) fn transition(&mut self, state: TrialState) {
        if self.transitions.len() < MAX_TALLIED {
            self.transitions.push(state);
        }
    }

    /// Adds what a node's object server counted, per team (at most
    /// [`MAX_TALLIED`] teams between two drains).
    pub(super) fn object_access(&mut self, counts: Vec<TeamObjectCounts>) {
        for count in counts {
            if !self.object_access.contains_key(&count.team)
                && self.object_access.len() >= MAX_TALLIED
            {
                continue;
            }
            let tallied = self
                .object_access
                .entry(count.team.clone())
                .or_insert_with(|| TeamObjectCounts {
                    team: count.team.clone(),
                    ..TeamObjectCounts::default()
                });
            tallied.fetches += count.fetches;
            tallied.fetched_bytes += count.fetched_bytes;
            tallied.stores += count.stores;
            tallied.stored_bytes += count.stored_bytes;
            tallied.refusals += count.refusals;
        }
    }

    /// A new checkpoint took `took` to store on its node.
    pub(super) fn checkpoint_take(&mut self, took: Duration) {
        if self.checkpoint_takes.len() < MAX_TALLIED {
            self.checkpoint_takes.push(took);
        }
    }
}

/// GPUs of one model on one node.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct GpuCount {
    /// GPUs the node offers.
    pub total: u64,
    /// GPUs assigned to live workers (a fractional share counts as its fraction).
    pub allocated: f64,
}

/// The head's state as `/metrics` shows it.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct MetricsSnapshot {
    /// Trials by (queue, state name).
    pub trials: BTreeMap<(String, &'static str), u64>,
    /// Trials waiting to be placed, per queue (the policy core's count).
    pub pending: BTreeMap<String, u64>,
    /// GPUs by (node, model).
    pub gpus: BTreeMap<(String, String), GpuCount>,
    /// Nodes by state name.
    pub nodes: BTreeMap<&'static str, u64>,
    /// GPUs busier than `telemetry::IN_USE_UTIL` in the latest
    /// telemetry, by (node, model).
    pub gpus_in_use: BTreeMap<(String, String), u64>,
    /// Each GPU's latest utilisation (percent) and memory in use (bytes), by
    /// (node, GPU index).
    pub gpu_figures: BTreeMap<(String, u32), (f64, u64)>,
    /// Object store bytes by (node, tier: `memory` or `disk`).
    pub store_bytes: BTreeMap<(String, &'static str), u64>,
}

/// Adds one node's latest telemetry to `out`: its GPUs in use by model, each
/// GPU's figures, and its object store by tier.
pub fn add_node_figures(
    out: &mut MetricsSnapshot,
    label: &str,
    resources: &NodeResources,
    figures: &super::telemetry::NodeFigures,
) {
    for gpu in &figures.gpus {
        out.gpu_figures.insert(
            (label.to_owned(), gpu.index),
            (gpu.util, gpu.memory_used_bytes),
        );
        let model = resources
            .gpus
            .iter()
            .find(|offered| offered.index == gpu.index)
            .map_or("unknown", |offered| offered.model.as_str());
        let in_use = out
            .gpus_in_use
            .entry((label.to_owned(), model.to_owned()))
            .or_default();
        if gpu.util > super::telemetry::IN_USE_UTIL {
            *in_use += 1;
        }
    }
    out.store_bytes
        .insert((label.to_owned(), "memory"), figures.store.memory_bytes);
    out.store_bytes
        .insert((label.to_owned(), "disk"), figures.store.disk_bytes);
}

/// One node as the snapshot needs it.
#[derive(Debug, Clone, Copy)]
pub struct NodeView<'a> {
    /// Its label (the node id).
    pub label: &'a str,
    /// Whether the head hears from it.
    pub state: NodeState,
    /// What it offers.
    pub resources: &'a NodeResources,
}

/// Builds the snapshot from how many trials each queue has in each state,
/// the policy core's queues, the nodes, and the workers (live or not: only
/// live ones count).
pub fn snapshot<'a>(
    trials: impl IntoIterator<Item = (&'a str, &'static str, u64)>,
    queues: &[QueueStatus],
    nodes: &BTreeMap<xp_runtime::ids::NodeId, NodeView<'a>>,
    workers: impl IntoIterator<Item = &'a WorkerRecord>,
) -> MetricsSnapshot {
    let mut out = MetricsSnapshot::default();
    for (queue, state, count) in trials {
        *out.trials.entry((queue.to_owned(), state)).or_default() += count;
    }
    for queue in queues {
        out.pending.insert(queue.name.clone(), queue.pending);
    }
    for node in nodes.values() {
        *out.nodes.entry(node.state.as_str()).or_default() += 1;
        for gpu in &node.resources.gpus {
            out.gpus
                .entry((node.label.to_owned(), gpu.model.clone()))
                .or_default()
                .total += 1;
        }
    }
    for worker in workers {
        if !worker.state.holds_resources() {
            continue;
        }
        let Some(node) = nodes.get(&worker.node) else {
            continue;
        };
        let share = f64::from(worker.gpu_milli) / xp_sched::GPU_MILLI as f64;
        for index in &worker.gpu_indices {
            // A slot the node no longer offers (it re-registered with fewer
            // GPUs) is counted under an "unknown" model rather than dropped.
            let model = node
                .resources
                .gpus
                .iter()
                .find(|gpu| gpu.index == *index)
                .map_or("unknown", |gpu| gpu.model.as_str());
            out.gpus
                .entry((node.label.to_owned(), model.to_owned()))
                .or_default()
                .allocated += share;
        }
    }
    out
}

impl HeadCore {
    /// A trial's queue: its own, its experiment's, or its team's default
    /// (under the policy in force, so not kept with the book's counts).
    fn queue_name<'s>(&'s self, experiment: ExperimentId, own: Option<&'s str>) -> &'s str {
        let spec = self.book.get_spec(experiment);
        own.or_else(|| spec.and_then(|spec| spec.queue.as_deref()))
            .or_else(|| {
                let config = self.placement.policy().config();
                spec.and_then(|spec| config.default_queue_for(&spec.team))
                    .map(|queue| queue.name.as_str())
            })
            .unwrap_or(NO_QUEUE)
    }

    /// The snapshot of the core's state now (one pass over the active trials
    /// and their workers, and the book's counts of the others).
    pub fn metrics_snapshot(&self) -> MetricsSnapshot {
        let labels: BTreeMap<_, String> = self
            .membership
            .nodes()
            .map(|node| (node.id, node.id.to_string()))
            .collect();
        let nodes = self
            .membership
            .nodes()
            .map(|node| {
                (
                    node.id,
                    NodeView {
                        label: &labels[&node.id],
                        state: node.state,
                        resources: &node.resources,
                    },
                )
            })
            .collect();
        // Finished trials are counted by the book as they finish: a million of
        // them are not walked at every scrape.
        let active = self.book.active_trials().map(|trial| {
            let queue = self.queue_name(trial.id.experiment, trial.queue_override.as_deref());
            (queue, trial.state.as_str(), 1)
        });
        let inactive =
            self.book
                .inactive_counts()
                .map(|((experiment, queue_override, state), count)| {
                    let queue = self.queue_name(*experiment, queue_override.as_deref());
                    (queue, *state, count)
                });
        let trials = active.chain(inactive);
        // Only workers holding resources count, and their trials are active.
        let workers = self
            .book
            .active_trials()
            .flat_map(|trial| &trial.attempts)
            .flat_map(|attempt| &attempt.workers);
        let mut out = snapshot(trials, &self.queues(), &nodes, workers);
        for node in self.membership.nodes() {
            // A lost node's last figures no longer describe anything.
            if node.state == NodeState::Lost {
                continue;
            }
            if let Some(figures) = self.telemetry.node(node.id) {
                add_node_figures(&mut out, &labels[&node.id], &node.resources, figures);
            }
        }
        out
    }

    /// How many policy decisions this core has run: the shell times each of
    /// its calls into the core and keeps, for `/metrics`, the wall time of
    /// those during which this grew (the core itself takes no clock).
    pub fn decisions_made(&self) -> u64 {
        self.placement.decisions_made()
    }

    /// What happened since the last call.
    pub fn take_tally(&mut self) -> Tally {
        self.outbox.take_tally()
    }
}

#[cfg(test)]
mod tests {
    use xp_runtime::ids::NodeId;
    use xp_runtime::protocol::{GpuInfo, ResourceAmounts};

    use super::*;
    use crate::WorkerState;

    fn gpus(model: &str, count: u32) -> NodeResources {
        NodeResources {
            gpus: (0..count)
                .map(|index| GpuInfo {
                    index,
                    model: model.to_owned(),
                    memory_bytes: 0,
                })
                .collect(),
            cpu_milli: 1000,
            memory_bytes: 0,
        }
    }

    fn worker(node: NodeId, gpu_indices: Vec<u32>, gpu_milli: u32, live: bool) -> WorkerRecord {
        WorkerRecord {
            rank: 0,
            node,
            gpu_indices,
            gpu_milli,
            cpu_milli: 1000,
            memory_bytes: 0,
            state: if live {
                WorkerState::Started
            } else {
                WorkerState::Exited {
                    code: Some(0),
                    signal: None,
                }
            },
            last_metric_index: None,
        }
    }

    fn queue(name: &str, pending: u64) -> QueueStatus {
        let none = ResourceAmounts {
            gpu: None,
            cpu: None,
            memory_bytes: None,
        };
        QueueStatus {
            name: name.to_owned(),
            team: String::new(),
            cohort: None,
            weight: 1.0,
            usage: none,
            quota: none,
            borrowed: none,
            lent: none,
            pending,
            running: 0,
            fair_share: 0.0,
            leases: Default::default(),
            lease_quota: Default::default(),
        }
    }

    #[test]
    fn counts_trials_queues_gpus_and_nodes() {
        let (a, b, c) = (NodeId::random(), NodeId::random(), NodeId::random());
        let (a_label, b_label, c_label) = (a.to_string(), b.to_string(), c.to_string());
        let (a_res, b_res, c_res) = (gpus("H100", 4), gpus("A10", 2), gpus("H100", 0));
        let nodes: BTreeMap<_, _> = [
            (a, &a_label, NodeState::Ready, &a_res),
            (b, &b_label, NodeState::Ready, &b_res),
            (c, &c_label, NodeState::Lost, &c_res),
        ]
        .into_iter()
        .map(|(id, label, state, resources)| {
            (
                id,
                NodeView {
                    label,
                    state,
                    resources,
                },
            )
        })
        .collect();
        // Counts of one queue and state may come in several parts.
        let trials = [
            ("default", "succeeded", 1),
            ("default", "succeeded", 1),
            ("default", "running", 1),
            ("vision", "queued", 1),
        ];
        let workers = [
            // Two whole GPUs on a, one live gang member.
            worker(a, vec![0, 1], 1000, true),
            // Two halves of b's GPU 0 and a worker that ended (not counted).
            worker(b, vec![0], 500, true),
            worker(b, vec![0], 500, true),
            worker(b, vec![1], 1000, false),
            // A slot b does not offer any more.
            worker(b, vec![7], 1000, true),
            // A worker on a node the head forgot.
            worker(NodeId::random(), vec![0], 1000, true),
        ];
        let queues = [queue("default", 0), queue("vision", 1)];
        let snap = snapshot(trials, &queues, &nodes, &workers);

        assert_eq!(snap.trials[&("default".to_owned(), "succeeded")], 2);
        assert_eq!(snap.trials[&("default".to_owned(), "running")], 1);
        assert_eq!(snap.trials[&("vision".to_owned(), "queued")], 1);
        assert_eq!(snap.trials.len(), 3);
        assert_eq!(snap.pending["vision"], 1);
        assert_eq!(snap.pending["default"], 0);
        assert_eq!(snap.nodes["ready"], 2);
        assert_eq!(snap.nodes["lost"], 1);
        assert!(!snap.nodes.contains_key("draining"));
        let gpu = |node: &str, model: &str| snap.gpus[&(node.to_owned(), model.to_owned())].clone();
        assert_eq!(
            gpu(&a_label, "H100"),
            GpuCount {
                total: 4,
                allocated: 2.0
            }
        );
        assert_eq!(
            gpu(&b_label, "A10"),
            GpuCount {
                total: 2,
                allocated: 1.0
            }
        );
        assert_eq!(
            gpu(&b_label, "unknown"),
            GpuCount {
                total: 0,
                allocated: 1.0
            }
        );
        // A node with no GPUs has no GPU series.
        assert!(!snap.gpus.keys().any(|(node, _)| *node == c_label));
        assert_eq!(snap.gpus.len(), 3);
    }

    #[test]
    fn an_empty_head_has_an_empty_snapshot() {
        let snap = snapshot([], &[], &BTreeMap::new(), []);
        assert_eq!(snap, MetricsSnapshot::default());
    }
}
