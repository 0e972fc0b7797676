//! The head's decisions, pure: experiments, trials, attempts, nodes, placement,
//! authorization and every client request, with no I/O (this crate links no
//! async runtime, database or network; `tests/tidy.rs` checks it).
//!
//! Sans-io: inputs arrive through `handle_*` methods and [`HeadCore::serve`]
//! with the time as an argument; outputs leave through
//! [`HeadCore::take_records`] (what must be persisted before anyone is told)
//! and [`HeadCore::poll_command`] (what to send to which node). The head's
//! actor (`xp-head`) owns one `HeadCore` and performs those outputs.
//!
//! The map:
//! - `state/`: the sub-states, each owning its fields: the experiments and
//!   trials book, node membership, placement (the policy core and its books),
//!   the object book, driver sessions, approvals and the outbox; `sweeps`,
//!   `pipelines`, `telemetry` and `alerts` are sub-states with their steps.
//! - `requests/`: one file per client request, its access rule and its apply
//!   or read; `auth/` (roles, principals, the decision, the user table) and
//!   `authorize` (the decision over the core's state).
//! - The steps, written once as calls on sub-states: `submission`,
//!   `admission`, `scheduling`, `launch`, `attempts`, `nodes`,
//!   `worker_reports`, `checkpoints`, `leases`.
//! - What is read: `views` (status), `pages` (the HTTP API's bounded pages),
//!   `dashboard`, `usage` (`xp report`), `front`, `metrics`.
//! - `records` (the persisted types) and `error` ([`CoreError`], the one
//!   conversion to the wire error).
//!
//! Invariants (checked by `check_invariants` in tests after every step):
//! - a GPU index of a node is held by at most one live worker, or by fractional
//!   workers whose shares add up to at most the whole GPU;
//! - no node's CPU or memory is allocated beyond its capacity;
//! - a trial has at most one live attempt, and every worker of a live attempt was
//!   placed at once (gang placement is all or nothing);
//! - the object reference counts equal what the kept checkpoints name;
//! - the policy core's own invariants hold.

mod admission;
pub mod alerts;
mod attempts;
pub mod auth;
mod authorize;
mod checkpoints;
pub mod dashboard;
mod error;
mod front;
mod gang_faults;
pub mod importance;
mod launch;
mod leases;
pub mod metrics;
mod nodes;
mod object_access;
pub mod pages;
mod pipelines;
mod records;
pub mod requests;
mod scheduling;
mod shared_text;
mod state;
mod submission;
mod sweep;
mod sweeps;
mod telemetry;
mod usage;
mod views;
mod worker_reports;

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;

use tracing::warn;
use xp_runtime::clock::UnixMillis;
use xp_runtime::ids::{NodeId, ObjectId, TrialId};
use xp_runtime::protocol::{HeadCommand, NodeState, TrialState};
use xp_runtime::spec::ExperimentSpec;
use xp_sched::{GPU_MILLI, PolicyConfig};

pub use self::authorize::{AuditNote, Resolved, Verdict};
pub use self::error::CoreError;
pub use self::records::TelemetryRecord;
pub use self::records::{
    AlertRecord, AttemptRecord, Attempts, ExperimentRecord, LoadedState, MetricRecord, NodeRecord,
    PolicyRecord, Record, TrialRecord, UpInterval, WorkerRecord, WorkerState, Workers,
};
pub use self::records::{InputDir, PipelineRecord, StageRecord, StageResult};
pub use self::usage::{ReportScope, ReportSnapshot};

use self::nodes::node_spec;
use self::sweeps::SweepState;

/// Tunables of the core.
#[derive(Debug, Clone, Copy)]
pub struct CoreConfig {
    /// A node silent for longer than this is lost.
    pub node_timeout_ms: u64,
    /// How often nodes send heartbeats.
    pub heartbeat_interval_ms: u64,
    /// Keys the per-attempt collective tokens; drawn at random when the head starts.
    pub rendezvous_key: [u8; 32],
    /// Signs object capabilities; derived from the cluster token, which nodes
    /// hold too, so that their object servers can check them.
    pub object_key: xp_runtime::protocol::CapabilityKey,
    /// The longest a node takes to notice that the head went away and register
    /// with it again ([`xp_runtime::protocol::NODE_RETURN_BOUND`]): see
    /// [`CoreConfig::restart_grace_ms`].
    pub node_return_ms: u64,
}

impl Default for CoreConfig {
    fn default() -> Self {
        Self {
            node_timeout_ms: 3_000,
            heartbeat_interval_ms: 500,
            rendezvous_key: [0; 32],
            object_key: xp_runtime::protocol::CapabilityKey::from_bytes([0; 32]),
            node_return_ms: xp_runtime::protocol::NODE_RETURN_BOUND.as_millis() as u64,
        }
    }
}

impl CoreConfig {
    /// How long a restarted head waits for a node it knew to register again
    /// before judging it lost: the node's return time (noticing the old session
    /// died, reconnecting with back-off) plus the ordinary node timeout, the
    /// allowance the head gives any node between two signs of life. Until then
    /// the node's workers are held as they were, so that what they finished or
    /// still run while the head was away is adopted, not redone. With the
    /// defaults: 12 s + 3 s = 15 s.
    pub fn restart_grace_ms(&self) -> u64 {
        self.node_return_ms.saturating_add(self.node_timeout_ms)
    }
}

/// The placement under the stored policy, or the default one when none was
/// applied or the stored one no longer validates.
fn restored_placement(policy: Option<PolicyRecord>) -> state::Placement {
    let Some(record) = policy else {
        return state::Placement::default();
    };
    match PolicyConfig::from_yaml(&record.yaml) {
        Ok(config) => state::Placement::new(config, Some(record)),
        Err(error) => {
            warn!(%error, "the stored policy no longer validates; using the default policy");
            state::Placement::default()
        }
    }
}

/// The head's whole state.
pub struct HeadCore {
    config: CoreConfig,
    /// Experiments, their specs, trials with their attempts, and events.
    book: state::Book,
    /// The nodes, what each last said, and which a restarted head waits for.
    membership: state::Membership,
    /// The policy core and what keeps it in step with the trials.
    placement: state::Placement,
    /// Adaptive sweeps and early-stopping rules of the experiments that have them.
    sweep_state: SweepState,
    /// Which node holds which object, the copies to a second node under way,
    /// and how many kept checkpoints and outputs name each object.
    objects: state::ObjectBook,
    /// Connected driver sessions and what their objects are shared with.
    drivers: state::DriverSessions,
    /// Records to append, node commands and the `/metrics` tally, until the
    /// shell takes them.
    outbox: state::Outbox,
    /// Pipelines of dependent stages (`pipelines`).
    pipelines: pipelines::Pipelines,
    /// Node figures and worker series from telemetry (`telemetry.rs`).
    telemetry: telemetry::TelemetryState,
    /// Alert rules' evaluation and the alerts raised (`alerts`).
    alerts: alerts::AlertState,
    /// Preemption approval requests, pending and recently decided (persisted
    /// with the policy record; see `leases`).
    approvals: state::Approvals,
    grants: state::ObjectGrants,
    /// Failed exits of gangs across nodes, waiting to be judged (`gang_faults`).
    held_exits: state::HeldExits,
    /// Experiment summaries kept between reads (`pages`).
    summaries: pages::SummaryCache,
    /// Experiments' histories kept between polls of the cluster page.
    histories: Arc<dashboard::HistoryCache>,
}

impl std::fmt::Debug for HeadCore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HeadCore")
            .field("experiments", &self.book.experiment_count())
            .field("trials", &self.book.trial_count())
            .field("nodes", &self.membership.len())
            .field("sweeps", &self.sweep_state)
            .field("held_exits", &self.held_exits.len())
            .finish_non_exhaustive()
    }
}

impl HeadCore {
    /// A core over previously persisted state; the nodes it knew get the restart
    /// grace ([`CoreConfig::restart_grace_ms`]) from `now` to register again.
    pub fn restore(config: CoreConfig, loaded: LoadedState, now: UnixMillis) -> Self {
        let LoadedState {
            experiments,
            trials,
            nodes,
            last_event_seq,
            policy,
            pipelines,
            next_pipeline_id,
            alerts,
        } = loaded;
        let mut core = Self {
            config,
            book: state::Book::default(),
            membership: state::Membership::restore(nodes, now),
            placement: restored_placement(policy),
            sweep_state: SweepState::default(),
            objects: state::ObjectBook::default(),
            drivers: state::DriverSessions::default(),
            outbox: state::Outbox::default(),
            pipelines: pipelines::Pipelines::restore(pipelines, next_pipeline_id),
            telemetry: telemetry::TelemetryState::default(),
            alerts: alerts::AlertState::restore(alerts),
            approvals: state::Approvals::default(),
            grants: state::ObjectGrants::default(),
            held_exits: state::HeldExits::default(),
            summaries: pages::SummaryCache::default(),
            histories: Arc::default(),
        };
        // 1. The record: experiments with their sweeps, trials with what they
        //    keep, and the event numbering.
        core.restore_experiments(experiments);
        core.restore_trials(trials);
        core.book.restore_last_event_seq(last_event_seq);
        // 2. The policy's books: every node, schedulable until the running
        //    trials are adopted (the pool takes allocations only on
        //    schedulable nodes), the service of the last completed trials
        //    (adaptive level edges follow it), then the running trials where
        //    their workers are, and the approvals asked under the stored policy.
        for node in core.membership.nodes() {
            core.placement.policy_mut().upsert_node(node_spec(node));
        }
        core.restore_completed_service();
        core.adopt_all_running(now);
        core.hold_restored_exits(now);
        core.grants = state::ObjectGrants::started(now, core.ended_attempts());
        let approvals = core
            .placement
            .record()
            .map(|record| record.approvals.clone())
            .unwrap_or_default();
        core.restore_approvals(approvals, now);
        // 3. A node becomes schedulable again when it registers; the ports of
        //    live attempts stay taken.
        for node in core.membership.nodes() {
            let schedulable =
                node.state == NodeState::Ready && !core.membership.is_awaited(node.id);
            core.placement
                .policy_mut()
                .set_node_schedulable(node.id, schedulable);
        }
        core.placement.master_ports().start_rotation_at(now);
        for trial in core.book.trials() {
            for attempt in trial.attempts.iter().filter(|attempt| attempt.is_live()) {
                core.placement
                    .master_ports()
                    .mark_in_use(&attempt.master_host, attempt.master_port);
            }
        }
        core
    }

    /// Takes back stored experiments whose specs still validate, with their
    /// adaptive sweeps replayed from their logs.
    fn restore_experiments(&mut self, experiments: Vec<ExperimentRecord>) {
        for experiment in experiments {
            match ExperimentSpec::from_json(&experiment.spec_json) {
                Ok(spec) => {
                    self.sweep_state
                        .restore(experiment.id, &spec, &experiment.sweep_log);
                    self.book.restore_experiment(experiment, spec);
                }
                Err(error) => {
                    warn!(experiment_id = %experiment.id, %error, "stored experiment spec no longer validates; skipped")
                }
            }
        }
    }

    /// Takes back the stored trials of known experiments, with the successes
    /// new trials may reuse and the objects their checkpoints and outputs keep.
    fn restore_trials(&mut self, mut trials: Vec<Arc<TrialRecord>>) {
        trials.retain(|trial| self.book.contains_experiment(trial.id.experiment));
        let mut successes = Vec::new();
        for trial in &trials {
            if trial.state == TrialState::Succeeded && trial.reused_from.is_none() {
                let identity = self.trial_identity(trial.id.experiment, &trial.config_json);
                successes.push((identity, trial.id));
            }
            self.objects.keep(
                trial
                    .checkpoints
                    .iter()
                    .flat_map(|checkpoint| checkpoint.objects()),
            );
            self.objects.keep(records::output_objects(&trial.outputs));
            if trial.state == TrialState::Queued {
                self.placement.offer(trial.id);
            }
        }
        self.book.restore_successes(successes);
        self.book.restore_trials(trials);
    }

    /// Adopts every trial the record shows holding resources.
    fn adopt_all_running(&mut self, now: UnixMillis) {
        let running: BTreeSet<TrialId> = self
            .book
            .trials()
            .filter(|trial| {
                trial
                    .attempts
                    .iter()
                    .flat_map(|attempt| &attempt.workers)
                    .any(|worker| worker.state.holds_resources())
            })
            .map(|trial| trial.id)
            .collect();
        for trial_id in running {
            self.adopt_running(now, trial_id);
        }
    }

    /// A core rebuilt from what the registry holds (`loaded`), for when a change
    /// failed to commit and left this one ahead of the disk: as after a restart,
    /// except that the driver sessions still connected to this head stay live, so
    /// their objects are kept when nodes register again.
    pub fn rebuild(&self, loaded: LoadedState, now: UnixMillis) -> Self {
        let mut core = Self::restore(self.config, loaded, now);
        core.drivers = self.drivers.clone();
        core.grants = self.grants.clone();
        core.telemetry = self.telemetry.soft_copy();
        // This head's delivery task still holds the stored pending webhooks.
        core.take_webhook_deliveries();
        core
    }

    /// Records to persist, in order; the caller stores them before acknowledging anything.
    pub fn take_records(&mut self) -> Vec<Record> {
        let mut records = self.book.take_records();
        records.extend(self.membership.take_records());
        records.extend(self.pipelines.take_records());
        records.extend(self.outbox.take_records());
        records.extend(self.placement.take_changed_record().map(Record::Policy));
        records
    }

    /// Starts the restart grace at `now`: the moment this head can hear its nodes.
    /// Loading and replaying the history can take seconds; none of it may come
    /// out of the time a node has to come back.
    pub fn begin_restart_grace(&mut self, now: UnixMillis) {
        self.membership.begin_restart_grace(now);
    }

    /// Whether nodes may still be coming back to this head after its start.
    pub(crate) fn in_restart_grace(&self, now: UnixMillis) -> bool {
        self.membership
            .in_restart_grace(now, self.config.restart_grace_ms())
    }

    /// The next command for a node.
    pub fn poll_command(&mut self) -> Option<(NodeId, HeadCommand)> {
        self.outbox.poll_command()
    }

    /// The sequence number of the newest event.
    pub fn last_event_seq(&self) -> u64 {
        self.book.last_event_seq()
    }

    /// Panics if an invariant of the module documentation is broken.
    pub fn check_invariants(&self) {
        self.check_kept_summaries();
        self.check_kept_histories();
        self.book.check_active_trials();
        let mut gpus: BTreeMap<(NodeId, u32), u32> = BTreeMap::new();
        let mut cpu: BTreeMap<NodeId, u64> = BTreeMap::new();
        let mut memory: BTreeMap<NodeId, u64> = BTreeMap::new();
        for trial in self.book.trials() {
            // What a pass hands over and admits is found from what changed.
            assert!(
                trial.state != TrialState::Pending
                    || self.book.may_have_pending(trial.id.experiment),
                "pending trial {} unknown to admission",
                trial.id
            );
            assert!(
                trial.state != TrialState::Queued
                    || self.placement.policy().holds(trial.id)
                    || self.placement.is_offered(trial.id),
                "queued trial {} neither held by the policy nor offered to it",
                trial.id
            );
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
            let node = self
                .membership
                .node(*node_id)
                .expect("workers are on known nodes");
            assert!(
                *used <= u64::from(node.resources.cpu_milli),
                "node {node_id} CPU over-allocated"
            );
            assert!(
                memory[node_id] <= node.resources.memory_bytes,
                "node {node_id} memory over-allocated"
            );
        }
        if let Err(broken) = self.placement.policy().check_invariants() {
            panic!("scheduler invariant broken: {broken}");
        }
        // The object reference counts are a cache of what kept checkpoints and
        // outputs name.
        let mut recount: HashMap<ObjectId, u32> = HashMap::new();
        for trial in self.book.trials() {
            for checkpoint in &trial.checkpoints {
                for id in checkpoint.objects() {
                    *recount.entry(id).or_default() += 1;
                }
            }
            for id in records::output_objects(&trial.outputs) {
                *recount.entry(id).or_default() += 1;
            }
        }
        assert_eq!(
            &recount,
            self.objects.references(),
            "object reference counts drifted"
        );
    }
}

#[cfg(test)]
mod tests;
