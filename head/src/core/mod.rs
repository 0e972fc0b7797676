//! The head's state machine: experiments, trials, attempts, nodes and slots.
//!
//! Sans-io: inputs arrive through `handle_*` methods with the time as an argument;
//! outputs leave through [`HeadCore::take_records`] (what must be persisted before
//! anyone is told) and [`HeadCore::poll_command`] (what to send to which node).
//! The actor in `actor.rs` owns one `HeadCore` and performs those outputs.
//!
//! Invariants (checked by `check_invariants` in tests after every step):
//! - a GPU index of a node is held by at most one live worker;
//! - no node's CPU or memory is allocated beyond its capacity;
//! - a trial has at most one live attempt, and every worker of a live attempt was
//!   placed at once (gang placement is all or nothing).

use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};

use serde::{Deserialize, Serialize};
use tracing::{debug, info, warn};
use xp_runtime::clock::UnixMillis;
use xp_runtime::identity::experiment_content_hash;
use xp_runtime::ids::{BlobHash, ExperimentId, NodeId, ObjectId, TrialId, WorkerKey};
use xp_runtime::protocol::{
    AdminAction, AdminRequest, AttemptStatus, ErrorCode, ExperimentState, ExperimentStatus,
    HeadCommand, Launch, LogRequest, NodeMessage, NodeRegistration, NodeResources, NodeState,
    NodeStatus, Program, QueueStatus, RemoteError, ResourceAmounts, SubmitRequest, TrialEvent,
    TrialState, TrialStatus, WorkerReport,
};
use xp_runtime::spec::{CollectiveTransport, ExperimentSpec, Mode, Priority, render_arg};
use xp_tune::search::{TrialPlan, plan_trials};
use xp_tune::stopping::{StoppingRule, Verdict, make_rule};

use crate::checkpoints::{CheckpointRecord, ObjectDirectory};
use crate::sweep::{DEFAULT_ADAPTIVE_PARALLEL, Sweep, SweepOp};
use xp_sched::{
    Amount, Decision, GPU_MILLI, GangShape, NodeSpec, PolicyConfig, PolicyCore, PreemptReason,
    QueueUsage, Refusal, TrialRequest, WorkerPlacement,
};

/// How often a trial may be requeued for reasons not its own (lost nodes, refused
/// launches) before it fails, so that a trial that kills its nodes cannot loop.
const MAX_REQUEUES: u32 = 20;
/// The most distinct metric names a trial's summary keeps (the history keeps all).
const MAX_METRIC_NAMES: usize = 1024;
/// How long a stopped worker has between SIGTERM and SIGKILL, unless preempted.
const KILL_GRACE_MS: u64 = 5_000;
/// The first port handed out as `MASTER_PORT`, as torchrun does.
const FIRST_MASTER_PORT: u16 = 29500;
/// The last port handed out as `MASTER_PORT`.
const LAST_MASTER_PORT: u16 = 29999;

/// Tunables of the core.
#[derive(Debug, Clone, Copy)]
pub struct CoreConfig {
    /// A node silent for longer than this is lost.
    pub node_timeout_ms: u64,
    /// How often nodes send heartbeats.
    pub heartbeat_interval_ms: u64,
    /// Keys the per-attempt collective tokens; drawn at random when the head starts.
    pub rendezvous_key: [u8; 32],
}

impl Default for CoreConfig {
    fn default() -> Self {
        Self {
            node_timeout_ms: 10_000,
            heartbeat_interval_ms: 1_000,
            rendezvous_key: [0; 32],
        }
    }
}

/// A submitted experiment, as persisted.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ExperimentRecord {
    /// The id.
    pub id: ExperimentId,
    /// The full content hash.
    pub content_hash: [u8; 32],
    /// The spec in canonical JSON.
    pub spec_json: String,
    /// The driver binary for `entry` trials.
    pub program: Option<BlobHash>,
    /// The code version.
    pub code_version: String,
    /// The data version.
    pub data_version: String,
    /// When it was submitted.
    pub submitted_at: UnixMillis,
    /// Whether a user cancelled it.
    pub cancelled: bool,
    /// Whether the submission asked to rerun rather than reuse finished results.
    #[serde(default)]
    pub rerun: bool,
    /// What the head did to the experiment's adaptive searcher, in order.
    #[serde(default)]
    pub sweep_log: Vec<SweepOp>,
}

/// A trial, as persisted.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct TrialRecord {
    /// The id.
    pub id: TrialId,
    /// Its configuration as JSON.
    pub config_json: String,
    /// Its replicate seed.
    pub seed: u64,
    /// Its state.
    pub state: TrialState,
    /// Every attempt, oldest first.
    pub attempts: Vec<AttemptRecord>,
    /// Attempts that failed through the trial's own fault (not lost nodes).
    pub failures: u32,
    /// The last value of each metric reported by rank 0.
    pub metrics: BTreeMap<String, f64>,
    /// The last step reported by rank 0.
    pub last_step: Option<u64>,
    /// Why it is in its state.
    pub reason: Option<String>,
    /// When it last entered the queue.
    pub queued_at: UnixMillis,
    /// The finished trial whose result this one reuses instead of running.
    #[serde(default)]
    pub reused_from: Option<TrialId>,
    /// Times the trial was requeued through no fault of its own.
    #[serde(default)]
    pub requeues: u32,
    /// Times the scheduler preempted it.
    #[serde(default)]
    pub preemptions: u32,
    /// An admin holds it out of the queue.
    #[serde(default)]
    pub held: bool,
    /// A base priority set by an admin, replacing the experiment's.
    #[serde(default)]
    pub priority_override: Option<i64>,
    /// A queue set by an admin, replacing the experiment's.
    #[serde(default)]
    pub queue_override: Option<String>,
    /// The checkpoints kept, oldest first.
    #[serde(default)]
    pub checkpoints: Vec<CheckpointRecord>,
}

/// The scheduling policy in force, as persisted: the text and who applied it.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct PolicyRecord {
    /// The policy file's text.
    pub yaml: String,
    /// Who applied it.
    pub applied_by: String,
    /// Why.
    pub why: String,
    /// When.
    pub at: UnixMillis,
}

/// One attempt of a trial.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct AttemptRecord {
    /// From 1.
    pub number: u32,
    /// One per rank, in rank order.
    pub workers: Vec<WorkerRecord>,
    /// `MASTER_ADDR`.
    pub master_host: String,
    /// `MASTER_PORT`.
    pub master_port: u16,
    /// When it was placed.
    pub placed_at: UnixMillis,
    /// When all workers were running.
    pub running_at: Option<UnixMillis>,
    /// When its outcome was decided.
    pub ended_at: Option<UnixMillis>,
    /// Its outcome in words.
    pub outcome: Option<String>,
    /// The checkpoint it resumed from: (step, attempt that wrote it).
    #[serde(default)]
    pub resumed_from: Option<(u64, u32)>,
}

impl AttemptRecord {
    fn is_live(&self) -> bool {
        self.ended_at.is_none()
    }
}

/// One worker of an attempt.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct WorkerRecord {
    /// Its rank.
    pub rank: u32,
    /// Its node.
    pub node: NodeId,
    /// Its GPUs.
    pub gpu_indices: Vec<u32>,
    /// The thousandths of each of those GPUs it holds (1000: whole GPUs).
    #[serde(default = "whole_gpu")]
    pub gpu_milli: u32,
    /// Its CPU thousandths.
    // Records written before the rename say `milli_cpus`.
    #[serde(alias = "milli_cpus")]
    pub cpu_milli: u32,
    /// Its memory bytes.
    pub memory_bytes: u64,
    /// What the head knows of its process.
    pub state: WorkerState,
    /// The index of the last metric report taken from it.
    pub last_metric_index: Option<u64>,
}

fn whole_gpu() -> u32 {
    GPU_MILLI as u32
}

/// What the head knows of a worker process.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum WorkerState {
    /// Launch sent.
    Assigned,
    /// The process runs.
    Started,
    /// The process exited.
    Exited {
        /// Exit code.
        code: Option<i32>,
        /// Terminating signal.
        signal: Option<i32>,
    },
    /// Its node was lost or forgot it.
    Lost,
}

impl WorkerState {
    /// Whether the worker still holds its slot.
    pub fn holds_resources(self) -> bool {
        matches!(self, Self::Assigned | Self::Started)
    }
}

/// A node, as persisted.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct NodeRecord {
    /// The id.
    pub id: NodeId,
    /// Host name.
    pub name: String,
    /// Address for `MASTER_ADDR`.
    pub address: String,
    /// Capacity.
    pub resources: NodeResources,
    /// Labels.
    pub labels: BTreeMap<String, String>,
    /// Alive or lost.
    pub state: NodeState,
    /// Last heard from.
    pub last_seen: UnixMillis,
}

/// One metric report, appended to the registry's history.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct MetricRecord {
    /// The worker.
    pub key: WorkerKey,
    /// The step.
    pub step: Option<u64>,
    /// The values.
    pub values: BTreeMap<String, f64>,
    /// When the head received it.
    pub at: UnixMillis,
}

/// Something the registry must store before the change is acknowledged.
#[derive(Debug, Clone)]
pub enum Record {
    /// Insert or replace an experiment.
    Experiment(ExperimentRecord),
    /// Insert or replace a trial.
    Trial(TrialRecord),
    /// Insert or replace a node.
    Node(NodeRecord),
    /// Append an event.
    Event(TrialEvent),
    /// Append a metric report.
    Metric(MetricRecord),
    /// Replace the scheduling policy.
    Policy(PolicyRecord),
}

/// Everything the registry loaded at start.
#[derive(Debug, Default)]
pub struct LoadedState {
    /// Experiments.
    pub experiments: Vec<ExperimentRecord>,
    /// Trials.
    pub trials: Vec<TrialRecord>,
    /// Nodes.
    pub nodes: Vec<NodeRecord>,
    /// Events in sequence order.
    pub events: Vec<TrialEvent>,
    /// The policy last applied, if any.
    pub policy: Option<PolicyRecord>,
}

/// The head's whole state.
pub struct HeadCore {
    config: CoreConfig,
    experiments: BTreeMap<ExperimentId, ExperimentRecord>,
    specs: BTreeMap<ExperimentId, ExperimentSpec>,
    trials: BTreeMap<TrialId, TrialRecord>,
    nodes: BTreeMap<NodeId, NodeRecord>,
    /// The scheduling policy core: the one owner of what every node has allocated.
    policy: PolicyCore,
    /// The policy text in force, when one was applied.
    policy_record: Option<PolicyRecord>,
    dirty_policy: bool,
    /// Trials whose standing with the policy core may have changed since the last
    /// scheduling pass (workers released, state changed).
    unsettled: BTreeSet<TrialId>,
    /// Something the policy core decides on changed since its last pass (or time
    /// passed); a pass when nothing changed would find nothing new to do.
    policy_stale: bool,
    ports_in_use: BTreeMap<String, BTreeSet<u16>>,
    /// Where the next `MASTER_PORT` search starts, per host.
    port_cursor: BTreeMap<String, u16>,
    events: BTreeMap<ExperimentId, Vec<TrialEvent>>,
    /// Succeeded trials that ran themselves, by trial identity: what new trials may reuse.
    succeeded_by_identity: BTreeMap<[u8; 32], TrialId>,
    /// Trials that reached a terminal state since the sweeps last looked.
    newly_finished: Vec<TrialId>,
    next_event_seq: u64,
    dirty_experiments: BTreeSet<ExperimentId>,
    dirty_trials: BTreeSet<TrialId>,
    dirty_nodes: BTreeSet<NodeId>,
    appended: Vec<Record>,
    commands: VecDeque<(NodeId, HeadCommand)>,
    /// Adaptive sweeps of experiments that still run.
    sweeps: BTreeMap<ExperimentId, Sweep>,
    /// Early-stopping rules of experiments that declare one.
    rules: BTreeMap<ExperimentId, Box<dyn StoppingRule>>,
    /// Which node holds which object; rebuilt from node registrations.
    directory: ObjectDirectory,
    /// How many kept checkpoints (of all trials) name each object: content
    /// addressing lets two trials share one.
    object_refs: HashMap<ObjectId, u32>,
    /// When this core started: until one node timeout later, nodes may still be
    /// coming back with the objects they hold.
    started_at: UnixMillis,
    /// Driver sessions that asked where to store objects and are still connected.
    live_drivers: BTreeSet<String>,
}

impl std::fmt::Debug for HeadCore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HeadCore")
            .field("experiments", &self.experiments.len())
            .field("trials", &self.trials.len())
            .field("nodes", &self.nodes.len())
            .field("sweeps", &self.sweeps)
            .finish_non_exhaustive()
    }
}

fn not_found(what: impl Into<String>) -> RemoteError {
    RemoteError::new(ErrorCode::NotFound, what)
}

impl HeadCore {
    /// A core over previously persisted state; nodes get one timeout from `now` to return.
    pub fn restore(config: CoreConfig, loaded: LoadedState, now: UnixMillis) -> Self {
        let mut core = Self {
            config,
            experiments: BTreeMap::new(),
            specs: BTreeMap::new(),
            trials: BTreeMap::new(),
            nodes: BTreeMap::new(),
            policy: PolicyCore::new(PolicyConfig::default()),
            policy_record: None,
            dirty_policy: false,
            unsettled: BTreeSet::new(),
            policy_stale: true,
            ports_in_use: BTreeMap::new(),
            port_cursor: BTreeMap::new(),
            events: BTreeMap::new(),
            succeeded_by_identity: BTreeMap::new(),
            newly_finished: Vec::new(),
            next_event_seq: 1,
            dirty_experiments: BTreeSet::new(),
            dirty_trials: BTreeSet::new(),
            dirty_nodes: BTreeSet::new(),
            appended: Vec::new(),
            commands: VecDeque::new(),
            sweeps: BTreeMap::new(),
            rules: BTreeMap::new(),
            directory: ObjectDirectory::default(),
            object_refs: HashMap::new(),
            started_at: now,
            live_drivers: BTreeSet::new(),
        };
        if let Some(record) = loaded.policy {
            match PolicyConfig::from_yaml(&record.yaml) {
                Ok(config) => {
                    core.policy = PolicyCore::new(config);
                    core.policy_record = Some(record);
                }
                Err(error) => {
                    warn!(%error, "the stored policy no longer validates; using the default policy")
                }
            }
        }
        for experiment in loaded.experiments {
            match ExperimentSpec::from_json(&experiment.spec_json) {
                Ok(spec) => {
                    if Sweep::is_adaptive(&spec.search) {
                        match Sweep::replay(&spec.search, &experiment.sweep_log) {
                            Ok((sweep, divergences)) => {
                                for divergence in divergences {
                                    warn!(experiment_id = %experiment.id, %divergence, "sweep replay diverged");
                                }
                                core.sweeps.insert(experiment.id, sweep);
                            }
                            Err(error) => {
                                warn!(experiment_id = %experiment.id, %error, "cannot rebuild the sweep; it asks no more")
                            }
                        }
                    }
                    if let Some(early_stopping) = &spec.search.early_stopping {
                        core.rules.insert(experiment.id, make_rule(early_stopping));
                    }
                    core.specs.insert(experiment.id, spec);
                    core.experiments.insert(experiment.id, experiment);
                }
                Err(error) => {
                    warn!(experiment_id = %experiment.id, %error, "stored experiment spec no longer validates; skipped")
                }
            }
        }
        for trial in loaded.trials {
            if core.experiments.contains_key(&trial.id.experiment) {
                if trial.state == TrialState::Succeeded && trial.reused_from.is_none() {
                    let identity = core.trial_identity(trial.id.experiment, &trial.config_json);
                    core.succeeded_by_identity
                        .entry(identity)
                        .or_insert(trial.id);
                }
                for checkpoint in &trial.checkpoints {
                    for id in checkpoint.objects() {
                        *core.object_refs.entry(id).or_default() += 1;
                    }
                }
                core.trials.insert(trial.id, trial);
            }
        }
        for mut node in loaded.nodes {
            node.last_seen = now;
            // Schedulable until the running trials are adopted: the pool takes
            // allocations only on schedulable nodes.
            core.policy.upsert_node(node_spec(&node));
            core.nodes.insert(node.id, node);
        }
        for event in loaded.events {
            core.next_event_seq = core.next_event_seq.max(event.seq + 1);
            core.events
                .entry(event.trial.experiment)
                .or_default()
                .push(event);
        }
        let adopted: BTreeSet<TrialId> = core
            .trials
            .values()
            .filter(|trial| {
                trial
                    .attempts
                    .iter()
                    .flat_map(|attempt| &attempt.workers)
                    .any(|worker| worker.state.holds_resources())
            })
            .map(|trial| trial.id)
            .collect();
        for trial_id in adopted {
            core.adopt_running(now, trial_id);
        }
        for node in core.nodes.values() {
            core.policy
                .set_node_schedulable(node.id, node.state == NodeState::Ready);
        }
        for trial in core.trials.values() {
            for attempt in trial.attempts.iter().filter(|attempt| attempt.is_live()) {
                core.ports_in_use
                    .entry(attempt.master_host.clone())
                    .or_default()
                    .insert(attempt.master_port);
            }
        }
        core
    }

    /// Records to persist, in order; the caller stores them before acknowledging anything.
    pub fn take_records(&mut self) -> Vec<Record> {
        let mut records = Vec::new();
        for id in std::mem::take(&mut self.dirty_experiments) {
            if let Some(experiment) = self.experiments.get(&id) {
                records.push(Record::Experiment(experiment.clone()));
            }
        }
        for id in std::mem::take(&mut self.dirty_trials) {
            if let Some(trial) = self.trials.get(&id) {
                records.push(Record::Trial(trial.clone()));
            }
        }
        for id in std::mem::take(&mut self.dirty_nodes) {
            if let Some(node) = self.nodes.get(&id) {
                records.push(Record::Node(node.clone()));
            }
        }
        records.append(&mut self.appended);
        if std::mem::take(&mut self.dirty_policy)
            && let Some(policy) = &self.policy_record
        {
            records.push(Record::Policy(policy.clone()));
        }
        records
    }

    /// The next command for a node.
    pub fn poll_command(&mut self) -> Option<(NodeId, HeadCommand)> {
        self.commands.pop_front()
    }

    /// The sequence number of the newest event.
    pub fn last_event_seq(&self) -> u64 {
        self.next_event_seq - 1
    }

    // ---- Requests from clients ----

    /// Creates an experiment and its trials, or returns an identical one.
    pub fn handle_submit(
        &mut self,
        now: UnixMillis,
        request: &SubmitRequest,
    ) -> Result<(ExperimentId, bool, u32), RemoteError> {
        let spec = ExperimentSpec::from_json(&request.spec_json)
            .map_err(|error| RemoteError::new(ErrorCode::BadRequest, error.to_string()))?;
        if spec.trial.entry.is_some() && request.program.is_none() {
            return Err(RemoteError::new(
                ErrorCode::BadRequest,
                "an `entry` trial needs its driver binary uploaded",
            ));
        }
        if let Some(program) = request.program
            && spec.trial.entry.is_none()
        {
            return Err(RemoteError::new(
                ErrorCode::BadRequest,
                format!("binary {program} given for a command trial"),
            ));
        }
        if request.code_version.len() > 512 || request.data_version.len() > 512 {
            return Err(RemoteError::new(
                ErrorCode::BadRequest,
                "code or data version is longer than 512 bytes",
            ));
        }
        self.admit(&spec)?;
        // Identity: the config without the local program path, and the binary's hash as code.
        let mut identity_spec = spec.clone();
        identity_spec.trial.program = None;
        let code_identity = match request.program {
            Some(program) => format!("{}|binary:{program}", request.code_version),
            None => request.code_version.clone(),
        };
        let content_hash = experiment_content_hash(
            &identity_spec.to_canonical_json(),
            &code_identity,
            &request.data_version,
        );
        let latest = self
            .experiments
            .values()
            .filter(|experiment| experiment.content_hash == content_hash)
            .max_by_key(|experiment| experiment.id.run);
        if let Some(latest) = latest {
            let state = self.experiment_state(latest.id);
            if !request.rerun && state != ExperimentState::Cancelled {
                let trials = self.trials.range(trial_range(latest.id)).count() as u32;
                info!(experiment_id = %latest.id, state = state.as_str(), "identical experiment submitted; reusing it");
                return Ok((latest.id, state != ExperimentState::Running, trials));
            }
        }
        let run = latest.map_or(1, |experiment| experiment.id.run + 1);
        let id = ExperimentId::from_content_hash(&content_hash, run);
        let adaptive = Sweep::is_adaptive(&spec.search);
        let plans = if adaptive {
            Vec::new()
        } else {
            plan_trials(&spec.search)
        };
        if adaptive {
            let sweep = Sweep::new(&spec.search)
                .map_err(|error| RemoteError::new(ErrorCode::BadRequest, error))?;
            self.sweeps.insert(id, sweep);
        }
        if let Some(early_stopping) = &spec.search.early_stopping {
            self.rules.insert(id, make_rule(early_stopping));
        }
        let record = ExperimentRecord {
            id,
            content_hash,
            spec_json: spec.to_canonical_json(),
            program: request.program,
            code_version: request.code_version.clone(),
            data_version: request.data_version.clone(),
            submitted_at: now,
            cancelled: false,
            rerun: request.rerun,
            sweep_log: Vec::new(),
        };
        self.experiments.insert(id, record);
        self.dirty_experiments.insert(id);
        self.specs.insert(id, spec);
        for (index, plan) in plans.iter().enumerate() {
            self.create_trial(now, id, index as u32, plan.config_json(), plan.seed);
        }
        if adaptive {
            self.fill_sweep(now, id);
        }
        let trials = self.trials.range(trial_range(id)).count() as u32;
        let planned = if adaptive {
            self.specs[&id].trial_count() as u32
        } else {
            trials
        };
        info!(experiment_id = %id, name = %self.specs[&id].name, trials = planned, "experiment submitted");
        self.schedule(now);
        Ok((id, false, planned))
    }

    /// Creates trial `index` of `experiment`, or, unless the experiment asked to
    /// rerun, a trial that reuses the result of an identical finished trial.
    fn create_trial(
        &mut self,
        now: UnixMillis,
        experiment: ExperimentId,
        index: u32,
        config_json: String,
        seed: u64,
    ) {
        let trial_id = TrialId { experiment, index };
        let identity = self.trial_identity(experiment, &config_json);
        let source = (!self.experiments[&experiment].rerun)
            .then(|| self.succeeded_by_identity.get(&identity).copied())
            .flatten()
            .and_then(|source| self.trials.get(&source));
        let mut record = TrialRecord {
            id: trial_id,
            config_json,
            seed,
            state: TrialState::Pending,
            attempts: Vec::new(),
            failures: 0,
            metrics: BTreeMap::new(),
            last_step: None,
            reason: None,
            queued_at: now,
            reused_from: None,
            requeues: 0,
            preemptions: 0,
            checkpoints: Vec::new(),
            held: false,
            priority_override: None,
            queue_override: None,
        };
        let (state, reason) = match source {
            Some(source) => {
                record.metrics = source.metrics.clone();
                record.last_step = source.last_step;
                record.reused_from = Some(source.id);
                (
                    TrialState::Succeeded,
                    format!(
                        "reused the result of trial {} (same config, code and data)",
                        source.id
                    ),
                )
            }
            None => (TrialState::Pending, "submitted".to_owned()),
        };
        record.state = state;
        record.reason = Some(reason.clone());
        if state.is_terminal() {
            self.newly_finished.push(trial_id);
        }
        self.trials.insert(trial_id, record);
        self.push_event(now, trial_id, state, 0, reason);
        self.dirty_trials.insert(trial_id);
    }

    /// What makes two trials the same work: the trial template, the config, the
    /// code (and binary) and the data.
    fn trial_identity(&self, experiment: ExperimentId, config_json: &str) -> [u8; 32] {
        let record = &self.experiments[&experiment];
        let mut template = self.specs[&experiment].trial.clone();
        template.program = None;
        let template = serde_json::to_string(&template).expect("a trial spec serialises");
        let code = match record.program {
            Some(program) => format!("{}|binary:{program}", record.code_version),
            None => record.code_version.clone(),
        };
        let mut hasher = blake3::Hasher::new_derive_key("xp trial identity v1");
        for part in [
            template.as_str(),
            config_json,
            code.as_str(),
            record.data_version.as_str(),
        ] {
            hasher.update(&(part.len() as u64).to_le_bytes());
            hasher.update(part.as_bytes());
        }
        *hasher.finalize().as_bytes()
    }

    /// Cancels an experiment (by id or unique prefix) or one trial.
    pub fn handle_cancel(&mut self, now: UnixMillis, id_text: &str) -> Result<u32, RemoteError> {
        let targets: Vec<TrialId> = if let Ok(trial_id) = id_text.parse::<TrialId>() {
            if !self.trials.contains_key(&trial_id) {
                return Err(not_found(format!("no trial {trial_id}")));
            }
            vec![trial_id]
        } else {
            let experiment = self.resolve_experiment(id_text)?;
            if let Some(record) = self.experiments.get_mut(&experiment) {
                record.cancelled = true;
                self.dirty_experiments.insert(experiment);
            }
            self.trials
                .range(trial_range(experiment))
                .map(|(id, _)| *id)
                .collect()
        };
        let mut cancelled = 0;
        for trial_id in targets {
            if self.trials[&trial_id].state.is_terminal() {
                continue;
            }
            self.end_live_attempt(now, trial_id, "cancelled by user");
            self.transition(
                now,
                trial_id,
                TrialState::Cancelled,
                "cancelled by user".to_owned(),
            );
            cancelled += 1;
        }
        self.schedule(now);
        Ok(cancelled)
    }

    /// Experiments matching `filter` (an id or unique prefix), or all.
    pub fn status(&self, filter: Option<&str>) -> Result<Vec<ExperimentStatus>, RemoteError> {
        let ids: Vec<ExperimentId> = match filter {
            Some(text) => vec![self.resolve_experiment(text)?],
            None => self.experiments.keys().copied().collect(),
        };
        Ok(ids
            .into_iter()
            .map(|id| self.experiment_status(id))
            .collect())
    }

    /// The nodes as `xp nodes` shows them.
    pub fn nodes_status(&self) -> Vec<NodeStatus> {
        // One pass over the workers, not one per node.
        let mut running: BTreeMap<NodeId, u32> = BTreeMap::new();
        for worker in self
            .trials
            .values()
            .flat_map(|trial| &trial.attempts)
            .flat_map(|attempt| &attempt.workers)
            .filter(|worker| worker.state.holds_resources())
        {
            *running.entry(worker.node).or_default() += 1;
        }
        self.nodes
            .values()
            .map(|node| {
                let free = self.policy.pool().node_free(node.id).unwrap_or_default();
                NodeStatus {
                    id: node.id,
                    name: node.name.clone(),
                    address: node.address.clone(),
                    state: node.state,
                    capacity: node.resources.clone(),
                    // Whole idle GPUs; shares of partly used ones do not add up to one.
                    free_gpus: self
                        .policy
                        .pool()
                        .node_gpu_used(node.id)
                        .map_or(0, |used| used.iter().filter(|milli| **milli == 0).count())
                        as u32,
                    free_cpu_milli: u32::try_from(free.cpu_milli).unwrap_or(u32::MAX),
                    free_memory_bytes: free.memory_bytes,
                    labels: node.labels.clone(),
                    running_workers: running.get(&node.id).copied().unwrap_or(0),
                    last_seen: node.last_seen,
                }
            })
            .collect()
    }

    /// Where a worker's log lives: its node, its key, and whether it has exited.
    pub fn locate_worker(
        &self,
        request: &LogRequest,
    ) -> Result<(NodeId, WorkerKey, bool), RemoteError> {
        let trial = self
            .trials
            .get(&request.trial)
            .ok_or_else(|| not_found(format!("no trial {}", request.trial)))?;
        let attempt = match request.attempt {
            Some(number) => trial
                .attempts
                .iter()
                .find(|attempt| attempt.number == number),
            None => trial.attempts.last(),
        }
        .ok_or_else(|| not_found(format!("trial {} has no such attempt yet", request.trial)))?;
        let worker = attempt
            .workers
            .iter()
            .find(|worker| worker.rank == request.rank)
            .ok_or_else(|| {
                not_found(format!(
                    "trial {} has no rank {}",
                    request.trial, request.rank
                ))
            })?;
        let key = WorkerKey {
            trial: trial.id,
            attempt: attempt.number,
            rank: worker.rank,
        };
        Ok((worker.node, key, !worker.state.holds_resources()))
    }

    /// Events of `experiment` with sequence numbers above `after`.
    pub fn events_after(
        &self,
        experiment: ExperimentId,
        after: u64,
    ) -> Result<Vec<TrialEvent>, RemoteError> {
        if !self.experiments.contains_key(&experiment) {
            return Err(not_found(format!("no experiment {experiment}")));
        }
        let events = self
            .events
            .get(&experiment)
            .map(Vec::as_slice)
            .unwrap_or_default();
        let start = events.partition_point(|event| event.seq <= after);
        Ok(events[start..].iter().take(1000).cloned().collect())
    }

    // ---- Nodes ----

    /// A node (re)connected: record it, reconcile what it still runs, and schedule.
    pub fn handle_node_register(&mut self, now: UnixMillis, registration: NodeRegistration) {
        let node_id = registration.node_id;
        let returning = self.nodes.contains_key(&node_id);
        info!(%node_id, name = %registration.name, gpus = registration.resources.gpus.len(), returning, "node registered");
        let record = NodeRecord {
            id: node_id,
            name: registration.name,
            address: registration.advertise_host,
            resources: registration.resources,
            labels: registration.labels,
            state: NodeState::Ready,
            last_seen: now,
        };
        self.policy.upsert_node(node_spec(&record));
        self.directory.register(
            node_id,
            registration.objects,
            registration.held_objects.iter().map(|held| held.id),
        );
        self.reconcile_objects(node_id, &registration.held_objects);
        self.policy_stale = true;
        self.policy.set_node_schedulable(node_id, true);
        self.policy_stale = true;
        self.nodes.insert(node_id, record);
        self.dirty_nodes.insert(node_id);
        self.commands.push_back((
            node_id,
            HeadCommand::Registered {
                heartbeat_interval_ms: self.config.heartbeat_interval_ms,
            },
        ));
        let still_running: BTreeSet<WorkerKey> = registration.running.into_iter().collect();
        // Workers the head placed here that the node no longer knows: their launch or
        // their process was lost with the old connection.
        let vanished: Vec<WorkerKey> = self
            .live_workers_on(node_id)
            .into_iter()
            .filter(|key| !still_running.contains(key))
            .collect();
        for key in vanished {
            self.lose_worker(
                now,
                key,
                format!("node {node_id} no longer runs rank {}", key.rank),
            );
        }
        // Workers the node runs that belong to no live attempt must stop.
        for key in still_running {
            let live = self.worker(key).is_some_and(|(attempt, worker)| {
                attempt.is_live() && worker.state.holds_resources()
            });
            if !live {
                self.kill_on(
                    node_id,
                    key.trial,
                    key.attempt,
                    "stale worker found at node registration",
                );
            }
        }
        self.schedule(now);
    }

    /// A message on a node's session.
    pub fn handle_node_message(&mut self, now: UnixMillis, node_id: NodeId, message: NodeMessage) {
        let Some(node) = self.nodes.get_mut(&node_id) else {
            warn!(%node_id, "message from an unregistered node ignored");
            return;
        };
        node.last_seen = now;
        if node.state == NodeState::Lost {
            // Its work was already rescheduled; make it register again so that what it
            // still runs is reconciled (killed) and it becomes schedulable again.
            self.commands.push_back((
                node_id,
                HeadCommand::Reconnect {
                    reason: "the head had given this node up as lost".to_owned(),
                },
            ));
            return;
        }
        match message {
            NodeMessage::Register(_) => warn!(%node_id, "duplicate registration ignored"),
            NodeMessage::Heartbeat | NodeMessage::Logs { .. } => {}
            NodeMessage::Draining => {
                info!(%node_id, "node draining: nothing more is placed on it");
                node.state = NodeState::Draining;
                self.dirty_nodes.insert(node_id);
                self.policy.set_node_schedulable(node_id, false);
                self.policy_stale = true;
            }
            NodeMessage::Report { report, .. } => {
                self.handle_report(now, node_id, report);
                self.schedule(now);
            }
            NodeMessage::Objects { added, dropped } => {
                for id in added {
                    self.directory.add(node_id, id);
                }
                for id in dropped {
                    self.directory.drop_object(node_id, id);
                }
            }
        }
    }

    /// Marks nodes lost whose heartbeats stopped, and reschedules their work.
    pub fn handle_tick(&mut self, now: UnixMillis) {
        let timed_out: Vec<NodeId> = self
            .nodes
            .values()
            .filter(|node| {
                node.state != NodeState::Lost
                    && now.saturating_sub(node.last_seen) > self.config.node_timeout_ms
            })
            .map(|node| node.id)
            .collect();
        for node_id in timed_out {
            warn!(%node_id, timeout_ms = self.config.node_timeout_ms, "node lost: no heartbeat within the timeout");
            if let Some(node) = self.nodes.get_mut(&node_id) {
                node.state = NodeState::Lost;
            }
            self.dirty_nodes.insert(node_id);
            self.policy.set_node_schedulable(node_id, false);
            self.policy_stale = true;
            for key in self.live_workers_on(node_id) {
                self.lose_worker(now, key, format!("node {node_id} lost"));
            }
        }
        // Time alone changes decisions: aging, reservations, minimum run times.
        self.policy_stale = true;
        self.schedule(now);
    }

    fn handle_report(&mut self, now: UnixMillis, node_id: NodeId, report: WorkerReport) {
        let key = report.key();
        let Some((attempt, worker)) = self.worker(key) else {
            debug!(worker = %key, "report for an unknown worker ignored");
            return;
        };
        let attempt_live = attempt.is_live();
        let worker_state = worker.state;
        if worker.node != node_id {
            warn!(worker = %key, %node_id, "report from a node that does not host this worker ignored");
            return;
        }
        match report {
            WorkerReport::Checkpoint {
                step,
                files,
                backup,
                ..
            } => {
                self.record_checkpoint(now, key, node_id, step, files, backup);
            }
            WorkerReport::Started { pid, .. } => {
                if !attempt_live {
                    self.kill_on(node_id, key.trial, key.attempt, "attempt already ended");
                    return;
                }
                if worker_state != WorkerState::Assigned {
                    return;
                }
                debug!(worker = %key, pid, "worker started");
                self.set_worker_state(key, WorkerState::Started);
                let all_started = self.worker(key).is_some_and(|(attempt, _)| {
                    attempt
                        .workers
                        .iter()
                        .all(|worker| worker.state == WorkerState::Started)
                });
                if all_started {
                    if let Some(attempt) = self.attempt_mut(key) {
                        attempt.running_at = Some(now);
                    }
                    self.transition(
                        now,
                        key.trial,
                        TrialState::Running,
                        format!("all workers of attempt {} running", key.attempt),
                    );
                } else if self.trials[&key.trial].state == TrialState::Placed {
                    self.transition(
                        now,
                        key.trial,
                        TrialState::Starting,
                        format!("rank {} started", key.rank),
                    );
                }
            }
            WorkerReport::LaunchFailed { error, .. } => {
                if !worker_state.holds_resources() {
                    return;
                }
                self.release_worker(
                    key,
                    WorkerState::Exited {
                        code: None,
                        signal: None,
                    },
                );
                if attempt_live && self.trials[&key.trial].state == TrialState::Preempting {
                    self.preempted_worker_gone(now, key);
                } else if attempt_live {
                    self.fail_attempt(
                        now,
                        key,
                        format!("rank {} could not start: {error}", key.rank),
                    );
                }
            }
            WorkerReport::Exited { code, signal, .. } => {
                if !worker_state.holds_resources() {
                    return;
                }
                self.release_worker(key, WorkerState::Exited { code, signal });
                if !attempt_live {
                    return;
                }
                if code != Some(0) && self.trials[&key.trial].state == TrialState::Preempting {
                    self.preempted_worker_gone(now, key);
                    return;
                }
                if code == Some(0) {
                    let all_succeeded = self.worker(key).is_some_and(|(attempt, _)| {
                        attempt.workers.iter().all(|worker| {
                            worker.state
                                == WorkerState::Exited {
                                    code: Some(0),
                                    signal: None,
                                }
                        })
                    });
                    if all_succeeded {
                        self.finish_attempt(now, key, "succeeded");
                        self.transition(
                            now,
                            key.trial,
                            TrialState::Succeeded,
                            "all workers exited with status 0".to_owned(),
                        );
                    }
                } else {
                    let how = match (code, signal) {
                        (Some(code), _) => format!("exited with status {code}"),
                        (None, Some(signal)) => format!("was killed by signal {signal}"),
                        (None, None) => "ended without a status".to_owned(),
                    };
                    self.fail_attempt(now, key, format!("rank {} {how}", key.rank));
                }
            }
            WorkerReport::Refused { reason, .. } => {
                if worker_state.holds_resources() {
                    self.lose_worker(
                        now,
                        key,
                        format!("node {node_id} refused rank {}: {reason}", key.rank),
                    );
                }
            }
            WorkerReport::Stopped { reason, .. } => {
                if !worker_state.holds_resources() {
                    return;
                }
                if attempt_live && self.trials[&key.trial].state == TrialState::Preempting {
                    self.release_worker(
                        key,
                        WorkerState::Exited {
                            code: None,
                            signal: None,
                        },
                    );
                    self.preempted_worker_gone(now, key);
                } else if attempt_live {
                    // The node stopped it on its own (shutting down): not the trial's fault.
                    self.lose_worker(
                        now,
                        key,
                        format!("node {node_id} stopped rank {}: {reason}", key.rank),
                    );
                } else {
                    self.release_worker(
                        key,
                        WorkerState::Exited {
                            code: None,
                            signal: None,
                        },
                    );
                }
            }
            WorkerReport::Metric {
                index,
                step,
                values,
                ..
            } => {
                if worker.last_metric_index.is_some_and(|last| index <= last) {
                    return;
                }
                if let Some(worker) = self.worker_mut(key) {
                    worker.last_metric_index = Some(index);
                }
                let values: BTreeMap<String, f64> = values.into_iter().collect();
                // Only the live attempt speaks for the trial; a lost attempt's late
                // reports stay in the history but do not overwrite the result.
                let speaks_for_trial = attempt_live && !self.trials[&key.trial].state.is_terminal();
                if key.rank == 0 && speaks_for_trial {
                    let trial = self
                        .trials
                        .get_mut(&key.trial)
                        .expect("worker lookup found the trial");
                    let room = MAX_METRIC_NAMES.saturating_sub(trial.metrics.len());
                    let mut new_names = 0;
                    for (name, value) in &values {
                        if let Some(slot) = trial.metrics.get_mut(name) {
                            *slot = *value;
                        } else if new_names < room {
                            trial.metrics.insert(name.clone(), *value);
                            new_names += 1;
                        } else {
                            warn!(trial_id = %key.trial, metric = %name, "more than {MAX_METRIC_NAMES} metric names; this one is kept in the history only");
                        }
                    }
                    if step.is_some() {
                        trial.last_step = step;
                    }
                }
                self.dirty_trials.insert(key.trial);
                let judged = self.judge_early_stopping(key, step, &values);
                self.appended.push(Record::Metric(MetricRecord {
                    key,
                    step,
                    values,
                    at: now,
                }));
                if let Some(reason) = judged {
                    self.finish_attempt(now, key, "stopped early");
                    self.transition(now, key.trial, TrialState::Stopped, reason);
                }
            }
        }
    }

    /// Asks the experiment's stopping rule about a live rank-0 report; `Some(reason)` means stop.
    fn judge_early_stopping(
        &mut self,
        key: WorkerKey,
        step: Option<u64>,
        values: &BTreeMap<String, f64>,
    ) -> Option<String> {
        let experiment = key.trial.experiment;
        let spec = &self.specs[&experiment];
        let step = step?;
        let value = *values.get(spec.search.metric.as_ref()?)?;
        if key.rank != 0 || !value.is_finite() {
            return None;
        }
        let live = self
            .worker(key)
            .is_some_and(|(attempt, _)| attempt.is_live());
        if !live || self.trials[&key.trial].state.is_terminal() {
            return None;
        }
        let sign = if spec.search.mode == Mode::Max {
            -1.0
        } else {
            1.0
        };
        match self.rules.get_mut(&experiment)?.report(
            u64::from(key.trial.index),
            step,
            sign * value,
        ) {
            Verdict::Continue => None,
            Verdict::Stop { rule, reason } => {
                Some(format!("stopped early by {rule} at step {step}: {reason}"))
            }
        }
    }

    // ---- Scheduling ----

    fn schedule(&mut self, now: UnixMillis) {
        // Invariant: drained on every scheduling pass; the sweeps consume it. Settling
        // a suggestion can create reused (already finished) trials: loop until none.
        loop {
            let finished = std::mem::take(&mut self.newly_finished);
            if finished.is_empty() {
                break;
            }
            self.advance_sweeps(now, &finished);
        }
        self.admit_pending(now);
        self.settle_all(now);
        let fresh: Vec<TrialId> = self
            .trials
            .values()
            .filter(|trial| {
                trial.state == TrialState::Queued
                    && self.policy.wait_reason(trial.id).is_none()
                    && self.policy.placement(trial.id).is_none()
            })
            .map(|trial| trial.id)
            .collect();
        for trial_id in fresh {
            self.submit_to_policy(now, trial_id);
        }
        let decisions = if std::mem::take(&mut self.policy_stale) {
            self.policy.decide(now)
        } else {
            Vec::new()
        };
        for decision in decisions {
            match decision {
                Decision::Place { trial, workers } => self.launch(now, trial, &workers),
                Decision::Preempt {
                    trial,
                    reason,
                    grace_ms,
                } => self.preempt(now, trial, &reason, grace_ms),
            }
        }
        // Launches that failed at once release their resources in this same pass.
        self.settle_all(now);
    }

    fn settle_all(&mut self, now: UnixMillis) {
        for trial_id in std::mem::take(&mut self.unsettled) {
            self.settle_with_policy(now, trial_id);
        }
    }

    /// Brings the policy core in line with a trial: a trial whose workers all let
    /// go of their resources is requeued (when it waits again) or forgotten (when it
    /// ended); a trial that ended while waiting leaves the queue.
    fn settle_with_policy(&mut self, now: UnixMillis, trial_id: TrialId) {
        let Some(trial) = self.trials.get(&trial_id) else {
            return;
        };
        let holds = trial
            .attempts
            .iter()
            .flat_map(|attempt| &attempt.workers)
            .any(|worker| worker.state.holds_resources());
        if self.policy.placement(trial_id).is_some() {
            if holds {
                return;
            }
            match trial.state {
                TrialState::Queued => {
                    self.policy.requeue(trial_id, now);
                    self.policy_stale = true;
                }
                state if state.is_terminal() => {
                    self.policy
                        .finish(trial_id, now, state == TrialState::Succeeded);
                    self.policy_stale = true;
                }
                _ => {}
            }
        } else if self.policy.wait_reason(trial_id).is_some() && trial.state != TrialState::Queued {
            self.policy.finish(trial_id, now, false);
            self.policy_stale = true;
        }
    }

    /// What the policy core needs to know of a trial.
    fn trial_request(&self, trial: &TrialRecord) -> Result<TrialRequest, String> {
        let spec = &self.specs[&trial.id.experiment];
        let priority = match (trial.priority_override, &spec.priority) {
            (Some(value), _) | (None, &Priority::Value(value)) => value,
            (None, Priority::Class(class)) => {
                self.policy.config().priority_value(class).ok_or_else(|| {
                    let known: Vec<&str> = self
                        .policy
                        .config()
                        .priority_classes
                        .keys()
                        .map(String::as_str)
                        .collect();
                    format!(
                        "priority class {class:?} is not in the policy (it has: {})",
                        known.join(", ")
                    )
                })?
            }
        };
        Ok(TrialRequest {
            id: trial.id,
            team: spec.team.clone(),
            queue: trial.queue_override.clone().or_else(|| spec.queue.clone()),
            priority,
            gang: GangShape {
                workers: spec.trial.workers,
                per_worker: Amount {
                    gpu_milli: spec.trial.gpu_milli(),
                    cpu_milli: u64::from(spec.trial.cpu_milli()),
                    memory_bytes: spec.trial.resources.memory.0,
                },
                gpu_models: spec.trial.gpu_models.clone(),
                node_labels: spec.trial.node_labels.clone(),
                spread: spec.trial.spread,
            },
            preemptible: spec.trial.preemptible,
            time_limit_ms: spec.trial.time_limit_ms(),
            submitted_at: trial.queued_at,
        })
    }

    /// Hands a queued trial to the policy core; a refusal other than "too many
    /// pending" (which clears as the team's queue drains) fails the trial.
    fn submit_to_policy(&mut self, now: UnixMillis, trial_id: TrialId) {
        let trial = &self.trials[&trial_id];
        let held = trial.held;
        let request = match self.trial_request(trial) {
            Ok(request) => request,
            Err(reason) => {
                self.transition(now, trial_id, TrialState::Failed, reason);
                return;
            }
        };
        match self.policy.submit(request, now) {
            Ok(()) => {
                self.policy_stale = true;
                if held {
                    self.policy.hold(trial_id);
                }
            }
            Err(Refusal::TooManyPending { .. } | Refusal::Duplicate(_)) => {}
            Err(refusal) => self.transition(
                now,
                trial_id,
                TrialState::Failed,
                format!("the scheduler refused it: {refusal}"),
            ),
        }
    }

    /// A placed, running trial that the policy chose to stop for other work: its
    /// workers get SIGTERM and `grace_ms` to checkpoint, and the trial returns to
    /// the queue once all are gone (see `preempted_worker_gone`).
    fn preempt(
        &mut self,
        now: UnixMillis,
        trial_id: TrialId,
        reason: &PreemptReason,
        grace_ms: u64,
    ) {
        let Some(trial) = self.trials.get_mut(&trial_id) else {
            return;
        };
        if !matches!(
            trial.state,
            TrialState::Placed | TrialState::Starting | TrialState::Running
        ) {
            return;
        }
        trial.preemptions += 1;
        let Some(attempt) = trial.attempts.last().filter(|attempt| attempt.is_live()) else {
            return;
        };
        let number = attempt.number;
        let nodes: BTreeSet<NodeId> = attempt
            .workers
            .iter()
            .filter(|worker| worker.state.holds_resources())
            .map(|worker| worker.node)
            .collect();
        let why = match reason {
            PreemptReason::HigherPriority { by, priority } => {
                format!("preempted for {by} (priority {priority})")
            }
            PreemptReason::Reclaim { queue, by } => {
                format!("preempted: queue {queue} reclaims its quota for {by}")
            }
        };
        for node in nodes {
            self.commands.push_back((
                node,
                HeadCommand::Kill {
                    trial: trial_id,
                    attempt: number,
                    reason: why.clone(),
                    grace_ms,
                },
            ));
        }
        self.transition(
            now,
            trial_id,
            TrialState::Preempting,
            format!("{why}; {} s to checkpoint", grace_ms / 1000),
        );
    }

    /// A worker of a preempting attempt is gone; once the last one is, the attempt
    /// ends and the trial waits again, without using a retry.
    fn preempted_worker_gone(&mut self, now: UnixMillis, key: WorkerKey) {
        let all_gone = self.worker(key).is_some_and(|(attempt, _)| {
            attempt
                .workers
                .iter()
                .all(|worker| !worker.state.holds_resources())
        });
        if !all_gone {
            return;
        }
        self.finish_attempt(now, key, "preempted");
        self.transition(
            now,
            key.trial,
            TrialState::Queued,
            "requeued after preemption; resumes from its last checkpoint".to_owned(),
        );
    }

    /// Takes a trial that the registry shows running (after a head restart) back
    /// into the policy core's books, where its workers are.
    fn adopt_running(&mut self, now: UnixMillis, trial_id: TrialId) {
        let trial = &self.trials[&trial_id];
        let Some(attempt) = trial.attempts.iter().rev().find(|attempt| {
            attempt
                .workers
                .iter()
                .any(|worker| worker.state.holds_resources())
        }) else {
            return;
        };
        let started_at = attempt.running_at.unwrap_or(attempt.placed_at);
        let placements: Vec<WorkerPlacement> = attempt
            .workers
            .iter()
            .filter(|worker| worker.state.holds_resources())
            .map(|worker| self.worker_placement(worker))
            .collect();
        match self.trial_request(trial) {
            Ok(request) => {
                if let Err(error) = self.policy.adopt(request, placements, started_at) {
                    warn!(%trial_id, %error, "cannot restore a running trial's resources in the scheduler");
                }
            }
            Err(reason) => {
                warn!(%trial_id, %reason, "cannot restore a running trial in the scheduler")
            }
        }
        let _ = now;
    }

    /// A worker's holdings in the policy core's terms.
    fn worker_placement(&self, worker: &WorkerRecord) -> WorkerPlacement {
        let devices = self
            .nodes
            .get(&worker.node)
            .map(|node| &node.resources.gpus[..])
            .unwrap_or_default();
        WorkerPlacement {
            node: worker.node,
            gpus: worker
                .gpu_indices
                .iter()
                .map(|device| xp_sched::GpuShare {
                    index: devices
                        .iter()
                        .position(|gpu| gpu.index == *device)
                        .map_or(*device, |slot| slot as u32),
                    milli: worker.gpu_milli,
                })
                .collect(),
            cpu_milli: u64::from(worker.cpu_milli),
            memory_bytes: worker.memory_bytes,
        }
    }

    /// Refuses a submission while the team already has its limit of pending
    /// trials, with a hint of when to retry; the SDK backs off and retries.
    fn admit(&self, spec: &ExperimentSpec) -> Result<(), RemoteError> {
        let admission = &self.policy.config().admission;
        let pending = self
            .trials
            .values()
            .filter(|trial| matches!(trial.state, TrialState::Pending | TrialState::Queued))
            .filter(|trial| {
                self.specs
                    .get(&trial.id.experiment)
                    .is_some_and(|other| other.team == spec.team)
            })
            .count() as u64;
        if pending >= admission.max_pending_per_team {
            return Err(RemoteError::retry_later(
                format!(
                    "team {} has {pending} pending trials, its limit is {}; retry later",
                    spec.team, admission.max_pending_per_team
                ),
                admission.retry_after_ms,
            ));
        }
        Ok(())
    }

    /// Finished trials leave their stopping rule, settle their suggestion once every
    /// replicate is done, and adaptive sweeps ask for more configurations.
    fn advance_sweeps(&mut self, now: UnixMillis, finished: &[TrialId]) {
        let mut touched = BTreeSet::new();
        for trial_id in finished {
            let experiment = trial_id.experiment;
            if let Some(rule) = self.rules.get_mut(&experiment) {
                rule.finished(u64::from(trial_id.index));
            }
            let Some(sweep) = self.sweeps.get(&experiment) else {
                continue;
            };
            touched.insert(experiment);
            let Some((suggestion, replicates)) = sweep.open_suggestion_of(trial_id.index) else {
                continue;
            };
            let replicates = replicates.to_vec();
            let all_done = replicates.iter().all(|index| {
                self.trials
                    .get(&TrialId {
                        experiment,
                        index: *index,
                    })
                    .is_some_and(|trial| trial.state.is_terminal())
            });
            if !all_done {
                continue;
            }
            let spec = &self.specs[&experiment];
            let sign = if spec.search.mode == Mode::Max {
                -1.0
            } else {
                1.0
            };
            let values: Vec<f64> = spec
                .search
                .metric
                .as_ref()
                .map(|metric| {
                    replicates
                        .iter()
                        .filter_map(|index| {
                            self.trials[&TrialId {
                                experiment,
                                index: *index,
                            }]
                                .metrics
                                .get(metric)
                                .copied()
                        })
                        .filter(|value| value.is_finite())
                        .collect()
                })
                .unwrap_or_default();
            let objective = (!values.is_empty())
                .then(|| sign * values.iter().sum::<f64>() / values.len() as f64);
            let op = self
                .sweeps
                .get_mut(&experiment)
                .expect("checked above")
                .settle(suggestion, objective);
            self.log_sweep(experiment, op);
        }
        for experiment in touched {
            self.fill_sweep(now, experiment);
        }
    }

    /// Asks the experiment's adaptive searcher for configurations while its budget
    /// and `parallel` allow, and creates their trials.
    fn fill_sweep(&mut self, now: UnixMillis, experiment: ExperimentId) {
        if self
            .experiments
            .get(&experiment)
            .is_none_or(|record| record.cancelled)
        {
            return;
        }
        let spec = &self.specs[&experiment];
        let replicates = spec.search.seeds;
        let limit = spec.search.parallel.unwrap_or(DEFAULT_ADAPTIVE_PARALLEL);
        let base_seed = spec.search.seed;
        loop {
            let first_trial = self.trials.range(trial_range(experiment)).count() as u32;
            let Some(sweep) = self.sweeps.get_mut(&experiment) else {
                return;
            };
            let Some((suggestion, op)) = sweep.ask(first_trial, replicates, limit) else {
                return;
            };
            self.log_sweep(experiment, op);
            for replicate in 0..replicates {
                let plan = TrialPlan {
                    params: suggestion.config.clone(),
                    seed: base_seed.wrapping_add(u64::from(replicate)),
                };
                self.create_trial(
                    now,
                    experiment,
                    first_trial + replicate,
                    plan.config_json(),
                    plan.seed,
                );
            }
        }
    }

    fn log_sweep(&mut self, experiment: ExperimentId, op: SweepOp) {
        if let Some(record) = self.experiments.get_mut(&experiment) {
            record.sweep_log.push(op);
            self.dirty_experiments.insert(experiment);
        }
    }

    /// Trials whose metric history must be replayed into their experiment's
    /// stopping rule after a restart: those of unfinished experiments with a rule.
    pub fn trials_needing_metric_replay(&self) -> Vec<TrialId> {
        self.rules
            .keys()
            .filter(|experiment| self.experiment_state(**experiment) == ExperimentState::Running)
            .flat_map(|experiment| {
                self.trials
                    .range(trial_range(*experiment))
                    .map(|(id, _)| *id)
            })
            .collect()
    }

    /// Feeds stored metric reports to the stopping rules (decisions were already
    /// taken and are ignored), then tells them which trials have ended.
    pub fn replay_metrics(&mut self, records: &[MetricRecord]) {
        for record in records.iter().filter(|record| record.key.rank == 0) {
            let experiment = record.key.trial.experiment;
            let spec = &self.specs[&experiment];
            let (Some(metric), Some(step)) = (spec.search.metric.as_ref(), record.step) else {
                continue;
            };
            let Some(value) = record.values.get(metric).copied() else {
                continue;
            };
            let sign = if spec.search.mode == Mode::Max {
                -1.0
            } else {
                1.0
            };
            if let Some(rule) = self.rules.get_mut(&experiment) {
                let _ = rule.report(u64::from(record.key.trial.index), step, sign * value);
            }
        }
        for (experiment, rule) in &mut self.rules {
            for (id, trial) in self.trials.range(trial_range(*experiment)) {
                if trial.state.is_terminal() {
                    rule.finished(u64::from(id.index));
                }
            }
        }
    }

    fn admit_pending(&mut self, now: UnixMillis) {
        let experiment_ids: Vec<ExperimentId> = self.experiments.keys().copied().collect();
        for experiment_id in experiment_ids {
            let limit = self.specs[&experiment_id]
                .search
                .parallel
                .map_or(usize::MAX, |limit| limit as usize);
            let (active, pending): (Vec<_>, Vec<_>) = self
                .trials
                .range(trial_range(experiment_id))
                .filter(|(_, trial)| !trial.state.is_terminal())
                .map(|(id, trial)| (*id, trial.state))
                .partition(|(_, state)| *state != TrialState::Pending);
            let room = limit.saturating_sub(active.len());
            for (trial_id, _) in pending.into_iter().take(room) {
                if let Some(trial) = self.trials.get_mut(&trial_id) {
                    trial.queued_at = now;
                }
                self.transition(
                    now,
                    trial_id,
                    TrialState::Queued,
                    "waiting for slots".to_owned(),
                );
            }
        }
    }

    /// Starts the gang the policy core placed: one worker per placement, in rank order.
    fn launch(&mut self, now: UnixMillis, trial_id: TrialId, slots: &[WorkerPlacement]) {
        let Some(first) = slots.first() else {
            return;
        };
        if self.awaiting_newest_checkpoint(now, trial_id) {
            debug!(%trial_id, "waiting for nodes to return with the newest checkpoint");
            self.policy.requeue(trial_id, now);
            self.policy_stale = true;
            return;
        }
        let spec = &self.specs[&trial_id.experiment];
        let master_host = self.nodes[&first.node].address.clone();
        // Rotate through the range, so a retry never reuses the port an old rank 0,
        // still being stopped, may hold.
        let used_ports = self.ports_in_use.entry(master_host.clone()).or_default();
        let cursor = self
            .port_cursor
            .get(&master_host)
            .copied()
            .unwrap_or(FIRST_MASTER_PORT);
        let Some(master_port) = (cursor..=LAST_MASTER_PORT)
            .chain(FIRST_MASTER_PORT..cursor)
            .find(|port| !used_ports.contains(port))
        else {
            warn!(host = %master_host, "no free MASTER_PORT left on this host");
            self.policy.requeue(trial_id, now);
            self.policy_stale = true;
            return;
        };
        used_ports.insert(master_port);
        self.port_cursor.insert(
            master_host.clone(),
            if master_port == LAST_MASTER_PORT {
                FIRST_MASTER_PORT
            } else {
                master_port + 1
            },
        );
        let trial = &self.trials[&trial_id];
        let number = trial.attempts.len() as u32 + 1;
        let workers: Vec<WorkerRecord> = slots
            .iter()
            .enumerate()
            .map(|(rank, slot)| {
                // The pool numbers a node's GPUs 0..n; the node names them by device index.
                let devices = &self.nodes[&slot.node].resources.gpus;
                WorkerRecord {
                    rank: rank as u32,
                    node: slot.node,
                    gpu_indices: slot
                        .gpus
                        .iter()
                        .map(|share| {
                            devices
                                .get(share.index as usize)
                                .map_or(share.index, |gpu| gpu.index)
                        })
                        .collect(),
                    gpu_milli: slot
                        .gpus
                        .first()
                        .map_or(GPU_MILLI as u32, |share| share.milli),
                    cpu_milli: u32::try_from(slot.cpu_milli).unwrap_or(u32::MAX),
                    memory_bytes: slot.memory_bytes,
                    state: WorkerState::Assigned,
                    last_metric_index: None,
                }
            })
            .collect();
        // A gang on one machine talks through shared memory whatever the spec says.
        let one_machine = workers.iter().all(|worker| worker.node == workers[0].node);
        let gang_transport = if one_machine {
            CollectiveTransport::Shm
        } else {
            spec.trial.transport
        };
        let resume = self.resume_point(trial_id);
        let trial = &self.trials[&trial_id];
        let mut launches = Vec::with_capacity(workers.len());
        let mut local_ranks: BTreeMap<NodeId, u32> = BTreeMap::new();
        for worker in &workers {
            let local_rank = local_ranks.entry(worker.node).or_default();
            let key = WorkerKey {
                trial: trial_id,
                attempt: number,
                rank: worker.rank,
            };
            let program = match self.program_for(trial, worker.rank) {
                Ok(program) => program,
                Err(reason) => {
                    self.ports_in_use
                        .entry(master_host)
                        .or_default()
                        .remove(&master_port);
                    self.transition(now, trial_id, TrialState::Failed, reason);
                    return;
                }
            };
            launches.push((
                worker.node,
                Launch {
                    key,
                    world_size: workers.len() as u32,
                    local_rank: *local_rank,
                    program,
                    config_json: trial.config_json.clone(),
                    seed: trial.seed,
                    gpu_indices: worker.gpu_indices.clone(),
                    gpu_milli: worker.gpu_milli,
                    master_addr: master_host.clone(),
                    master_port,
                    collective_token: *blake3::keyed_hash(
                        &self.config.rendezvous_key,
                        format!("{trial_id}/{number}").as_bytes(),
                    )
                    .as_bytes(),
                    transport: gang_transport,
                    resume: resume.clone(),
                },
            ));
            *local_rank += 1;
        }
        let nodes: BTreeSet<String> = workers
            .iter()
            .map(|worker| worker.node.to_string())
            .collect();
        let trial = self.trials.get_mut(&trial_id).expect("trial exists");
        trial.attempts.push(AttemptRecord {
            number,
            workers,
            master_host,
            master_port,
            placed_at: now,
            running_at: None,
            ended_at: None,
            outcome: None,
            resumed_from: resume.as_ref().map(|resume| (resume.step, resume.attempt)),
        });
        for (node, launch) in launches {
            self.commands
                .push_back((node, HeadCommand::Launch(Box::new(launch))));
        }
        let nodes: Vec<String> = nodes.into_iter().collect();
        let resuming = resume.map_or_else(String::new, |resume| {
            format!(
                ", resuming from the checkpoint at step {} (attempt {})",
                resume.step, resume.attempt
            )
        });
        self.transition(
            now,
            trial_id,
            TrialState::Placed,
            format!("attempt {number} placed on {}{resuming}", nodes.join(",")),
        );
    }

    fn program_for(&self, trial: &TrialRecord, rank: u32) -> Result<Program, String> {
        let experiment = &self.experiments[&trial.id.experiment];
        let spec = &self.specs[&trial.id.experiment];
        if let Some(entry) = &spec.trial.entry {
            let binary = experiment
                .program
                .ok_or_else(|| "entry trial without a binary".to_owned())?;
            return Ok(Program::Entry {
                binary,
                entry: entry.clone(),
            });
        }
        let config: serde_json::Map<String, serde_json::Value> =
            serde_json::from_str(&trial.config_json)
                .map_err(|error| format!("stored config is corrupt: {error}"))?;
        let lookup = |name: &str| -> Option<String> {
            match name {
                "trial_id" => Some(trial.id.to_string()),
                "rank" => Some(rank.to_string()),
                _ => config.get(name).map(|value| match value {
                    serde_json::Value::String(text) => text.clone(),
                    other => other.to_string(),
                }),
            }
        };
        let argv = spec
            .trial
            .command
            .as_ref()
            .ok_or_else(|| "trial has neither command nor entry".to_owned())?
            .iter()
            .map(|arg| render_arg(arg, lookup))
            .collect::<Result<Vec<_>, _>>()
            .map_err(|error| error.to_string())?;
        Ok(Program::Command { argv })
    }

    // ---- Attempt and worker bookkeeping ----

    fn worker(&self, key: WorkerKey) -> Option<(&AttemptRecord, &WorkerRecord)> {
        let attempt = self
            .trials
            .get(&key.trial)?
            .attempts
            .iter()
            .find(|attempt| attempt.number == key.attempt)?;
        let worker = attempt.workers.get(key.rank as usize)?;
        Some((attempt, worker))
    }

    fn attempt_mut(&mut self, key: WorkerKey) -> Option<&mut AttemptRecord> {
        self.dirty_trials.insert(key.trial);
        self.trials
            .get_mut(&key.trial)?
            .attempts
            .iter_mut()
            .find(|attempt| attempt.number == key.attempt)
    }

    fn worker_mut(&mut self, key: WorkerKey) -> Option<&mut WorkerRecord> {
        self.attempt_mut(key)?.workers.get_mut(key.rank as usize)
    }

    fn set_worker_state(&mut self, key: WorkerKey, state: WorkerState) {
        if let Some(worker) = self.worker_mut(key) {
            worker.state = state;
        }
    }

    fn live_workers_on(&self, node_id: NodeId) -> Vec<WorkerKey> {
        let mut keys = Vec::new();
        for trial in self.trials.values() {
            for attempt in &trial.attempts {
                for worker in &attempt.workers {
                    if worker.node == node_id && worker.state.holds_resources() {
                        keys.push(WorkerKey {
                            trial: trial.id,
                            attempt: attempt.number,
                            rank: worker.rank,
                        });
                    }
                }
            }
        }
        keys
    }

    /// Frees a worker's slot and records its final state.
    fn release_worker(&mut self, key: WorkerKey, state: WorkerState) {
        let Some(worker) = self.worker_mut(key) else {
            return;
        };
        if !worker.state.holds_resources() {
            return;
        }
        worker.state = state;
        // The policy core frees the gang's resources once its last worker is gone.
        self.unsettled.insert(key.trial);
    }

    /// Ends the attempt of `key` (if live) with `outcome`, freeing its port and
    /// stopping its other workers.
    fn finish_attempt(&mut self, now: UnixMillis, key: WorkerKey, outcome: &str) {
        let Some(attempt) = self.attempt_mut(key) else {
            return;
        };
        if !attempt.is_live() {
            return;
        }
        attempt.ended_at = Some(now);
        attempt.outcome = Some(outcome.to_owned());
        let host = attempt.master_host.clone();
        let port = attempt.master_port;
        let live_nodes: BTreeSet<NodeId> = attempt
            .workers
            .iter()
            .filter(|worker| worker.state.holds_resources())
            .map(|worker| worker.node)
            .collect();
        if let Some(ports) = self.ports_in_use.get_mut(&host) {
            ports.remove(&port);
        }
        for node in live_nodes {
            self.kill_on(node, key.trial, key.attempt, outcome);
        }
    }

    fn end_live_attempt(&mut self, now: UnixMillis, trial_id: TrialId, outcome: &str) {
        let live = self.trials[&trial_id]
            .attempts
            .last()
            .filter(|attempt| attempt.is_live())
            .map(|attempt| attempt.number);
        if let Some(number) = live {
            self.finish_attempt(
                now,
                WorkerKey {
                    trial: trial_id,
                    attempt: number,
                    rank: 0,
                },
                outcome,
            );
        }
    }

    /// The attempt failed through the trial's fault: retry under `max_retries`.
    fn fail_attempt(&mut self, now: UnixMillis, key: WorkerKey, reason: String) {
        self.finish_attempt(now, key, &format!("failed: {reason}"));
        let max_retries = self.specs[&key.trial.experiment].trial.max_retries;
        let trial = self
            .trials
            .get_mut(&key.trial)
            .expect("failing attempt has a trial");
        trial.failures += 1;
        if trial.state.is_terminal() {
            return;
        }
        if trial.failures <= max_retries {
            trial.queued_at = now;
            let retry = trial.failures;
            self.transition(
                now,
                key.trial,
                TrialState::Queued,
                format!("retry {retry} of {max_retries} after: {reason}"),
            );
        } else {
            self.transition(
                now,
                key.trial,
                TrialState::Failed,
                format!("{reason} (no retries left of {max_retries})"),
            );
        }
    }

    /// The worker's process is gone through no fault of the trial (node lost or
    /// restarted): the attempt ends and the trial is requeued without using a retry.
    fn lose_worker(&mut self, now: UnixMillis, key: WorkerKey, reason: String) {
        let Some((attempt, worker)) = self.worker(key) else {
            return;
        };
        let attempt_live = attempt.is_live();
        let (node, held) = (worker.node, worker.state.holds_resources());
        if held {
            // Should the process still exist (a node that only looked lost), stop it.
            self.kill_on(node, key.trial, key.attempt, &reason);
        }
        self.release_worker(key, WorkerState::Lost);
        if !attempt_live {
            return;
        }
        self.finish_attempt(now, key, &format!("lost: {reason}"));
        let trial = self
            .trials
            .get_mut(&key.trial)
            .expect("lost worker has a trial");
        if trial.state.is_terminal() {
            return;
        }
        trial.requeues += 1;
        trial.queued_at = now;
        if trial.requeues > MAX_REQUEUES {
            self.transition(
                now,
                key.trial,
                TrialState::Failed,
                format!("requeued {MAX_REQUEUES} times without finishing; last: {reason}"),
            );
        } else {
            self.transition(
                now,
                key.trial,
                TrialState::Queued,
                format!("requeued: {reason}"),
            );
        }
    }

    fn kill_on(&mut self, node: NodeId, trial: TrialId, attempt: u32, reason: &str) {
        self.commands.push_back((
            node,
            HeadCommand::Kill {
                trial,
                attempt,
                reason: reason.to_owned(),
                grace_ms: KILL_GRACE_MS,
            },
        ));
    }

    fn transition(
        &mut self,
        now: UnixMillis,
        trial_id: TrialId,
        state: TrialState,
        reason: String,
    ) {
        let Some(trial) = self.trials.get_mut(&trial_id) else {
            return;
        };
        if trial.state == state && trial.reason.as_deref() == Some(reason.as_str()) {
            return;
        }
        let was_terminal = trial.state.is_terminal();
        trial.state = state;
        trial.reason = Some(reason.clone());
        self.unsettled.insert(trial_id);
        let attempt = trial.attempts.len() as u32;
        let config_json = trial.config_json.clone();
        self.dirty_trials.insert(trial_id);
        if state == TrialState::Succeeded {
            let identity = self.trial_identity(trial_id.experiment, &config_json);
            self.succeeded_by_identity
                .entry(identity)
                .or_insert(trial_id);
        }
        if state.is_terminal() && !was_terminal {
            self.newly_finished.push(trial_id);
            self.release_trial_objects(trial_id);
        }
        info!(%trial_id, state = state.as_str(), attempt, %reason, "trial state changed");
        self.push_event(now, trial_id, state, attempt, reason);
    }

    fn push_event(
        &mut self,
        now: UnixMillis,
        trial: TrialId,
        state: TrialState,
        attempt: u32,
        reason: String,
    ) {
        let event = TrialEvent {
            seq: self.next_event_seq,
            at: now,
            trial,
            state,
            attempt,
            reason,
        };
        self.next_event_seq += 1;
        self.events
            .entry(trial.experiment)
            .or_default()
            .push(event.clone());
        self.appended.push(Record::Event(event));
    }

    // ---- Views ----

    fn resolve_experiment(&self, text: &str) -> Result<ExperimentId, RemoteError> {
        if let Ok(id) = text.parse::<ExperimentId>()
            && self.experiments.contains_key(&id)
        {
            return Ok(id);
        }
        let matches: Vec<ExperimentId> = self
            .experiments
            .keys()
            .filter(|id| id.to_string().starts_with(text))
            .copied()
            .collect();
        match matches.as_slice() {
            [id] if !text.is_empty() => Ok(*id),
            [] | [_] => Err(not_found(format!("no experiment {text:?}"))),
            _ => Err(RemoteError::new(
                ErrorCode::BadRequest,
                format!(
                    "{text:?} matches {} experiments; give more digits",
                    matches.len()
                ),
            )),
        }
    }

    fn experiment_state(&self, id: ExperimentId) -> ExperimentState {
        if self.experiments[&id].cancelled {
            return ExperimentState::Cancelled;
        }
        let mut any_succeeded = false;
        for (_, trial) in self.trials.range(trial_range(id)) {
            if !trial.state.is_terminal() {
                return ExperimentState::Running;
            }
            any_succeeded |= trial.state == TrialState::Succeeded;
        }
        if any_succeeded {
            ExperimentState::Succeeded
        } else {
            ExperimentState::Failed
        }
    }

    fn experiment_status(&self, id: ExperimentId) -> ExperimentStatus {
        let experiment = &self.experiments[&id];
        let spec = &self.specs[&id];
        ExperimentStatus {
            id,
            name: spec.name.clone(),
            team: spec.team.clone(),
            state: self.experiment_state(id),
            metric: spec.search.metric.clone(),
            maximize: spec.search.mode == Mode::Max,
            submitted_at: experiment.submitted_at,
            code_version: experiment.code_version.clone(),
            data_version: experiment.data_version.clone(),
            trials: self
                .trials
                .range(trial_range(id))
                .map(|(_, trial)| TrialStatus {
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
                            outcome: attempt.outcome.clone(),
                            resumed_from: attempt.resumed_from,
                        })
                        .collect(),
                    metrics: trial.metrics.clone(),
                    last_step: trial.last_step,
                    reason: trial.reason.clone(),
                    reused_from: trial.reused_from,
                    waiting: (trial.state == TrialState::Queued).then(|| {
                        self.policy.wait_reason(trial.id).map_or_else(
                            || "admission: its team is at its pending limit".to_owned(),
                            |reason| reason.to_string(),
                        )
                    }),
                })
                .collect(),
        }
    }

    /// Panics if an invariant of the module documentation is broken.
    pub fn check_invariants(&self) {
        let mut gpus: BTreeMap<(NodeId, u32), u32> = BTreeMap::new();
        let mut cpu: BTreeMap<NodeId, u64> = BTreeMap::new();
        let mut memory: BTreeMap<NodeId, u64> = BTreeMap::new();
        for trial in self.trials.values() {
            let live = trial
                .attempts
                .iter()
                .filter(|attempt| attempt.is_live())
                .count();
            assert!(live <= 1, "trial {} has {live} live attempts", trial.id);
            for worker in trial.attempts.iter().flat_map(|attempt| &attempt.workers) {
                if worker.state.holds_resources() {
                    for gpu in &worker.gpu_indices {
                        let held = gpus.entry((worker.node, *gpu)).or_default();
                        *held += worker.gpu_milli;
                        assert!(
                            *held <= GPU_MILLI as u32,
                            "GPU {gpu} of node {} held beyond its whole",
                            worker.node
                        );
                    }
                    *cpu.entry(worker.node).or_default() += u64::from(worker.cpu_milli);
                    *memory.entry(worker.node).or_default() += worker.memory_bytes;
                }
            }
        }
        for (node_id, used) in &cpu {
            let node = &self.nodes[node_id];
            assert!(
                *used <= u64::from(node.resources.cpu_milli),
                "node {node_id} CPU over-allocated"
            );
            assert!(
                memory[node_id] <= node.resources.memory_bytes,
                "node {node_id} memory over-allocated"
            );
        }
        if let Err(broken) = self.policy.check_invariants() {
            panic!("scheduler invariant broken: {broken}");
        }
        // The object reference counts are a cache of what kept checkpoints name.
        let mut recount: HashMap<ObjectId, u32> = HashMap::new();
        for trial in self.trials.values() {
            for checkpoint in &trial.checkpoints {
                for id in checkpoint.objects() {
                    *recount.entry(id).or_default() += 1;
                }
            }
        }
        assert_eq!(recount, self.object_refs, "object reference counts drifted");
    }

    // ---- Scheduling queues and admin arbitration ----

    /// Every queue's standing, for `xp queue`.
    pub fn queues(&self) -> Vec<QueueStatus> {
        self.policy.queues().into_iter().map(queue_status).collect()
    }

    /// Carries out an admin's action; every touched trial gets an event naming who
    /// and why.
    pub fn handle_admin(
        &mut self,
        now: UnixMillis,
        request: AdminRequest,
    ) -> Result<(u32, String), RemoteError> {
        let AdminRequest { action, who, why } = request;
        let bad = |message: String| RemoteError::new(ErrorCode::BadRequest, message);
        if who.trim().is_empty() || who.len() > 128 || why.len() > 4096 {
            return Err(bad(
                "an admin action needs who (1-128 characters) and why (at most 4096)".to_owned(),
            ));
        }
        let (targets, what) = match &action {
            AdminAction::ApplyPolicy { yaml } => {
                let config =
                    PolicyConfig::from_yaml(yaml).map_err(|error| bad(error.to_string()))?;
                self.policy
                    .set_config(config, now)
                    .map_err(|error| bad(error.to_string()))?;
                self.policy_stale = true;
                self.policy_record = Some(PolicyRecord {
                    yaml: yaml.clone(),
                    applied_by: who.clone(),
                    why: why.clone(),
                    at: now,
                });
                self.dirty_policy = true;
                info!(%who, %why, "scheduling policy replaced");
                self.schedule(now);
                return Ok((0, format!("policy applied by {who}")));
            }
            AdminAction::Priority { id, value } => {
                (self.admin_targets(id)?, format!("priority set to {value}"))
            }
            AdminAction::Hold { id } => (self.admin_targets(id)?, "held".to_owned()),
            AdminAction::Release { id } => (self.admin_targets(id)?, "released".to_owned()),
            AdminAction::Move { id, queue } => {
                if self.policy.config().queue(queue).is_none() {
                    return Err(not_found(format!("no queue {queue:?} in the policy")));
                }
                (self.admin_targets(id)?, format!("moved to queue {queue}"))
            }
        };
        for trial_id in &targets {
            let trial_id = *trial_id;
            let trial = self.trials.get_mut(&trial_id).expect("targets exist");
            match &action {
                AdminAction::Priority { value, .. } => {
                    trial.priority_override = Some(*value);
                    self.policy.set_priority(trial_id, *value);
                    self.policy_stale = true;
                }
                AdminAction::Hold { .. } => {
                    trial.held = true;
                    self.policy.hold(trial_id);
                    self.policy_stale = true;
                }
                AdminAction::Release { .. } => {
                    trial.held = false;
                    self.policy.release_hold(trial_id);
                    self.policy_stale = true;
                }
                AdminAction::Move { queue, .. } => {
                    trial.queue_override = Some(queue.clone());
                    self.policy_stale = true;
                    if let Err(refusal) = self.policy.move_to_queue(trial_id, queue) {
                        debug!(%trial_id, %refusal, "queue change takes effect when it waits again");
                    }
                }
                AdminAction::ApplyPolicy { .. } => unreachable!("returned above"),
            }
            let (state, attempt) = (trial.state, trial.attempts.len() as u32);
            self.dirty_trials.insert(trial_id);
            self.push_event(
                now,
                trial_id,
                state,
                attempt,
                format!("admin {who}: {what} ({why})"),
            );
        }
        info!(%who, %why, trials = targets.len(), action = %what, "admin action");
        self.schedule(now);
        Ok((
            targets.len() as u32,
            format!("{} trials {what}", targets.len()),
        ))
    }

    /// The unfinished trials an admin names: one trial id, or an experiment.
    fn admin_targets(&self, id: &str) -> Result<Vec<TrialId>, RemoteError> {
        let ids: Vec<TrialId> = if let Ok(trial_id) = id.parse::<TrialId>() {
            if !self.trials.contains_key(&trial_id) {
                return Err(not_found(format!("no trial {trial_id}")));
            }
            vec![trial_id]
        } else {
            let experiment = self.resolve_experiment(id)?;
            self.trials
                .range(trial_range(experiment))
                .map(|(id, _)| *id)
                .collect()
        };
        Ok(ids
            .into_iter()
            .filter(|id| !self.trials[id].state.is_terminal())
            .collect())
    }
}

/// A node as the policy core sees it.
fn node_spec(node: &NodeRecord) -> NodeSpec {
    NodeSpec {
        id: node.id,
        gpus: node.resources.gpus.len() as u32,
        gpu_model: node
            .resources
            .gpus
            .first()
            .map(|gpu| gpu.model.clone())
            .filter(|model| model != "declared"),
        cpu_milli: u64::from(node.resources.cpu_milli),
        memory_bytes: node.resources.memory_bytes,
        labels: node.labels.clone(),
    }
}

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
    }
}

fn trial_range(experiment: ExperimentId) -> std::ops::RangeInclusive<TrialId> {
    TrialId {
        experiment,
        index: 0,
    }..=TrialId {
        experiment,
        index: u32::MAX,
    }
}

#[path = "core_checkpoints.rs"]
mod checkpointing;

#[cfg(test)]
#[path = "core_tests.rs"]
mod tests;
