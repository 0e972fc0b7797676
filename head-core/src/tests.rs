//! Tests of the head's core: lifecycle cases and a randomised simulation against
//! fake nodes that checks the invariants after every step.

use std::collections::{BTreeMap, BTreeSet};

use proptest::prelude::*;
use xp_runtime::ids::{ExperimentId, NodeId, TrialId, WorkerKey};
use xp_runtime::protocol::{
    AdminAction, AdminRequest, HeadCommand, NodeMessage, NodeRegistration, NodeResources,
    SubmitRequest, TrialEvent, TrialState, WorkerReport,
};

use super::{CoreConfig, CoreError, HeadCore, LoadedState};
use crate::Record;

mod access;
mod alerts;
mod bohb;
mod checkpoint_pages;
mod dashboard;
mod front;
mod gang_faults;
mod leases;
mod levels;
mod limits;
mod metrics;
mod object_access;
mod oversubscription;
mod pipelines;
mod reuse;
mod telemetry;
mod usage;

const CONFIG: CoreConfig = CoreConfig {
    node_timeout_ms: 10_000,
    heartbeat_interval_ms: 1_000,
    rendezvous_key: [3; 32],
    object_key: xp_runtime::protocol::CapabilityKey::from_bytes([4; 32]),
    node_return_ms: 12_000,
};

fn node_id(seed: u8) -> NodeId {
    NodeId(uuid::Uuid::from_bytes([seed; 16]))
}

fn registration(node: NodeId, gpus: u32, cpus: u32, running: Vec<WorkerKey>) -> NodeRegistration {
    NodeRegistration {
        node_id: node,
        name: format!("node-{node}"),
        advertise_host: "127.0.0.1".to_owned(),
        resources: NodeResources {
            gpus: xp_runtime_declared(gpus),
            cpu_milli: cpus * 1000,
            memory_bytes: 1 << 34,
        },
        labels: BTreeMap::new(),
        running,
        objects: Some(xp_runtime::protocol::ObjectEndpoint {
            port: 7000,
            cert_sha256: [0; 32],
        }),
        held_objects: Vec::new(),
        isolation: xp_runtime::protocol::NodeIsolation::default(),
    }
}

fn xp_runtime_declared(n: u32) -> Vec<xp_runtime::protocol::GpuInfo> {
    (0..n)
        .map(|index| xp_runtime::protocol::GpuInfo {
            index,
            model: "declared".to_owned(),
            memory_bytes: 0,
        })
        .collect()
}

fn submit(core: &mut HeadCore, now: u64, yaml: &str, rerun: bool) -> ExperimentId {
    try_submit(core, now, yaml, rerun).unwrap()
}

fn try_submit(
    core: &mut HeadCore,
    now: u64,
    yaml: &str,
    rerun: bool,
) -> Result<ExperimentId, CoreError> {
    let spec = xp_runtime::spec::ExperimentSpec::from_yaml(yaml).unwrap();
    let request = SubmitRequest {
        spec_json: spec.to_canonical_json(),
        program: None,
        code_version: "none".to_owned(),
        data_version: "none".to_owned(),
        rerun,
    };
    core.handle_submit(now, &request).map(|(id, _, _)| id)
}

fn commands(core: &mut HeadCore) -> Vec<(NodeId, HeadCommand)> {
    std::iter::from_fn(|| core.poll_command()).collect()
}

fn launches(commands: &[(NodeId, HeadCommand)]) -> Vec<(NodeId, WorkerKey)> {
    commands
        .iter()
        .filter_map(|(node, command)| match command {
            HeadCommand::Launch(launch) => Some((*node, launch.key)),
            _ => None,
        })
        .collect()
}

fn report(core: &mut HeadCore, now: u64, node: NodeId, report: WorkerReport) {
    core.handle_node_message(
        now,
        node,
        NodeMessage::Report {
            seq: 0,
            at: now,
            report,
        },
    );
}

/// `experiment`'s events not yet taken for the store, oldest first (where the
/// shell would read them back from the store).
pub(crate) fn events_of(core: &HeadCore, experiment: ExperimentId) -> Vec<TrialEvent> {
    core.outbox
        .events()
        .filter(|event| event.trial.experiment == experiment)
        .cloned()
        .collect()
}

fn trial_state(core: &HeadCore, experiment: ExperimentId, index: u32) -> TrialState {
    core.book.trial(TrialId { experiment, index }).state
}

/// A core with one node of `gpus` GPUs and `cpus` CPUs, registered at 0.
fn cluster(gpus: u32, cpus: u32) -> (HeadCore, NodeId) {
    let mut core = HeadCore::restore(CONFIG, LoadedState::default(), 0);
    let node = node_id(1);
    core.handle_node_register(0, registration(node, gpus, cpus, Vec::new()));
    (core, node)
}

/// Reports that `key`'s worker on `node` exited with `code`.
fn exited(core: &mut HeadCore, now: u64, node: NodeId, key: WorkerKey, code: i32) {
    report(
        core,
        now,
        node,
        WorkerReport::Exited {
            key,
            code: Some(code),
            signal: None,
        },
    );
}

/// `action` as alice, an admin, asks it.
fn admin(core: &mut HeadCore, now: u64, action: AdminAction) -> Result<(u32, String), CoreError> {
    core.handle_admin(
        now,
        AdminRequest {
            action,
            who: "alice".to_owned(),
            why: "testing".to_owned(),
        },
    )
}

/// Applies the policy `yaml` as an admin; panics if it is refused.
fn must_apply_policy(core: &mut HeadCore, now: u64, yaml: &str) {
    admin(
        core,
        now,
        AdminAction::ApplyPolicy {
            yaml: yaml.to_owned(),
        },
    )
    .unwrap();
}

const ONE: &str = "name: one\ntrial: {command: [echo, '{x}'], max_retries: 1}\nsearch: {algorithm: grid, space: {x: {choice: [1]}}}\n";

#[test]
fn a_trial_runs_reports_and_succeeds() {
    let mut core = HeadCore::restore(CONFIG, LoadedState::default(), 0);
    let node = node_id(1);
    core.handle_node_register(0, registration(node, 0, 2, Vec::new()));
    let experiment = submit(&mut core, 1, ONE, false);
    let placed = launches(&commands(&mut core));
    assert_eq!(placed.len(), 1);
    let key = placed[0].1;
    assert_eq!(trial_state(&core, experiment, 0), TrialState::Placed);
    report(&mut core, 2, node, WorkerReport::Started { key, pid: 7 });
    assert_eq!(trial_state(&core, experiment, 0), TrialState::Running);
    let metric = |index| WorkerReport::Metric {
        key,
        index,
        step: Some(index),
        values: vec![("loss".to_owned(), index as f64)],
    };
    report(&mut core, 3, node, metric(1));
    report(&mut core, 3, node, metric(2));
    report(&mut core, 3, node, metric(1));
    let trial = &core.book.trial(key.trial);
    assert_eq!(
        trial.metrics.get("loss"),
        Some(&2.0),
        "a resent older report does not overwrite a newer one"
    );
    assert_eq!(trial.last_step, Some(2));
    report(
        &mut core,
        4,
        node,
        WorkerReport::Exited {
            key,
            code: Some(0),
            signal: None,
        },
    );
    assert_eq!(trial_state(&core, experiment, 0), TrialState::Succeeded);
    let records = core.take_records();
    assert_eq!(
        records
            .iter()
            .filter(|record| matches!(record, Record::Metric(_)))
            .count(),
        2
    );
    core.check_invariants();
}

#[test]
fn failures_are_retried_up_to_max_retries_and_lost_nodes_do_not_count() {
    let mut core = HeadCore::restore(CONFIG, LoadedState::default(), 0);
    let (a, b) = (node_id(1), node_id(2));
    core.handle_node_register(0, registration(a, 0, 1, Vec::new()));
    let experiment = submit(&mut core, 0, ONE, false);
    let key = launches(&commands(&mut core))[0].1;
    report(
        &mut core,
        1,
        a,
        WorkerReport::Exited {
            key,
            code: Some(3),
            signal: None,
        },
    );
    assert_eq!(
        trial_state(&core, experiment, 0),
        TrialState::Placed,
        "retry 1 of 1 placed at once"
    );
    let key = launches(&commands(&mut core))[0].1;
    assert_eq!(key.attempt, 2);
    // The node goes silent: the attempt is lost, and that does not use up a retry.
    core.handle_node_register(1, registration(b, 0, 1, Vec::new()));
    core.handle_node_message(19_999, b, NodeMessage::Heartbeat);
    core.handle_tick(20_000);
    assert_eq!(core.book.trial(key.trial).failures, 1);
    let key = launches(&commands(&mut core))
        .into_iter()
        .find(|(node, _)| *node == b)
        .expect("retried on b")
        .1;
    assert_eq!(key.attempt, 3);
    report(
        &mut core,
        20_001,
        b,
        WorkerReport::Exited {
            key,
            code: None,
            signal: Some(9),
        },
    );
    assert_eq!(trial_state(&core, experiment, 0), TrialState::Failed);
    assert!(
        core.book
            .trial(key.trial)
            .reason
            .as_deref()
            .unwrap()
            .contains("no retries left")
    );
    core.check_invariants();
}

#[test]
fn identical_submissions_are_reused_and_rerun_makes_a_new_run() {
    let mut core = HeadCore::restore(CONFIG, LoadedState::default(), 0);
    let node = node_id(1);
    core.handle_node_register(0, registration(node, 0, 1, Vec::new()));
    let first = submit(&mut core, 0, ONE, false);
    assert_eq!(
        submit(&mut core, 1, ONE, false),
        first,
        "a running identical experiment is returned"
    );
    let key = launches(&commands(&mut core))[0].1;
    report(
        &mut core,
        2,
        node,
        WorkerReport::Exited {
            key,
            code: Some(0),
            signal: None,
        },
    );
    let spec = xp_runtime::spec::ExperimentSpec::from_yaml(ONE).unwrap();
    let request = SubmitRequest {
        spec_json: spec.to_canonical_json(),
        program: None,
        code_version: "none".to_owned(),
        data_version: "none".to_owned(),
        rerun: false,
    };
    assert_eq!(core.handle_submit(3, &request).unwrap(), (first, true, 1));
    let rerun = submit(&mut core, 4, ONE, true);
    assert_eq!((rerun.digest, rerun.run), (first.digest, 2));
    let other_code = SubmitRequest {
        code_version: "git:abc".to_owned(),
        ..request
    };
    assert_ne!(
        core.handle_submit(5, &other_code).unwrap().0.digest,
        first.digest
    );
}

#[test]
fn finished_trials_are_reused_by_a_different_experiment_unless_rerun() {
    let mut core = HeadCore::restore(CONFIG, LoadedState::default(), 0);
    let node = node_id(1);
    core.handle_node_register(0, registration(node, 0, 4, Vec::new()));
    let grid = |values: &str| {
        format!(
            "name: g\ntrial: {{command: [echo, '{{x}}']}}\nsearch: {{algorithm: grid, space: {{x: {{choice: [{values}]}}}}}}\n"
        )
    };
    let first = submit(&mut core, 0, &grid("1, 2"), false);
    for (_, key) in launches(&commands(&mut core)) {
        report(
            &mut core,
            1,
            node,
            WorkerReport::Metric {
                key,
                index: 1,
                step: Some(1),
                values: vec![("v".to_owned(), f64::from(key.trial.index))],
            },
        );
        report(
            &mut core,
            1,
            node,
            WorkerReport::Exited {
                key,
                code: Some(0),
                signal: None,
            },
        );
    }
    let second = submit(&mut core, 2, &grid("1, 2, 3"), false);
    assert_ne!(first, second);
    let launched = launches(&commands(&mut core));
    assert_eq!(launched.len(), 1, "only the new configuration runs");
    assert_eq!(launched[0].1.trial.index, 2);
    for index in 0..2 {
        let trial = &core.book.trial(TrialId {
            experiment: second,
            index,
        });
        assert_eq!(trial.state, TrialState::Succeeded);
        assert_eq!(
            trial.reused_from,
            Some(TrialId {
                experiment: first,
                index
            })
        );
        assert_eq!(trial.metrics.get("v"), Some(&f64::from(index)));
    }
    let rerun = submit(&mut core, 3, &grid("1, 2, 3"), true);
    assert!((0..3).all(|index| {
        core.book
            .trial(TrialId {
                experiment: rerun,
                index,
            })
            .reused_from
            .is_none()
    }));
    core.check_invariants();
}

#[test]
fn parallel_limits_how_many_trials_are_queued_and_cancel_stops_workers() {
    let mut core = HeadCore::restore(CONFIG, LoadedState::default(), 0);
    let node = node_id(1);
    core.handle_node_register(0, registration(node, 0, 8, Vec::new()));
    let experiment = submit(
        &mut core,
        0,
        "name: p\ntrial: {command: [echo]}\nsearch: {trials: 5, parallel: 2}\n",
        false,
    );
    assert_eq!(launches(&commands(&mut core)).len(), 2);
    assert_eq!(trial_state(&core, experiment, 2), TrialState::Pending);
    assert_eq!(core.handle_cancel(1, &experiment.to_string()).unwrap(), 5);
    let kills = commands(&mut core)
        .into_iter()
        .filter(|(_, command)| matches!(command, HeadCommand::Kill { .. }))
        .count();
    assert_eq!(kills, 2);
    assert!((0..5).all(|index| trial_state(&core, experiment, index) == TrialState::Cancelled));
    core.check_invariants();
}

#[test]
fn a_returning_node_that_forgot_its_workers_gets_them_rescheduled() {
    let mut core = HeadCore::restore(CONFIG, LoadedState::default(), 0);
    let node = node_id(1);
    core.handle_node_register(0, registration(node, 0, 1, Vec::new()));
    let experiment = submit(&mut core, 0, ONE, false);
    let key = launches(&commands(&mut core))[0].1;
    report(&mut core, 1, node, WorkerReport::Started { key, pid: 1 });
    core.handle_node_register(2, registration(node, 0, 1, Vec::new()));
    let relaunched = launches(&commands(&mut core));
    assert_eq!(relaunched.len(), 1);
    assert_eq!(relaunched[0].1.attempt, 2);
    assert_eq!(core.book.trial(key.trial).failures, 0);
    assert_eq!(trial_state(&core, experiment, 0), TrialState::Placed);
}

/// A fake node for the simulation: which of its GPUs each live worker holds.
#[derive(Default)]
struct FakeNode {
    launched: BTreeMap<WorkerKey, Vec<u32>>,
    started: BTreeSet<WorkerKey>,
    silent: bool,
}

/// The simulated cluster of the property test: the core, its fake nodes (node
/// `i + 1` registered with `shapes[i]`, as `(gpus, cpus)`), the experiments
/// submitted so far and the time.
struct Simulation {
    core: HeadCore,
    nodes: BTreeMap<NodeId, FakeNode>,
    shapes: Vec<(u32, u32)>,
    experiments: u32,
    now: u64,
}

impl Simulation {
    /// A core with one fake node per shape, all registered at 0.
    fn new(shapes: Vec<(u32, u32)>) -> Self {
        let mut core = HeadCore::restore(CONFIG, LoadedState::default(), 0);
        let mut nodes = BTreeMap::new();
        for (idx, (gpus, cpus)) in shapes.iter().enumerate() {
            let id = node_id(idx as u8 + 1);
            core.handle_node_register(0, registration(id, *gpus, *cpus, Vec::new()));
            nodes.insert(id, FakeNode::default());
        }
        Self {
            core,
            nodes,
            shapes,
            experiments: 0,
            now: 0,
        }
    }

    /// Submits an experiment whose shape `pick` chooses, and checks that only
    /// a GPU worker on a cluster without GPUs is refused.
    fn check_submission(&mut self, pick: u16) -> Result<(), TestCaseError> {
        self.experiments += 1;
        let experiments = self.experiments;
        let workers = u32::from(pick % 3) + 1;
        let gpu = u32::from(pick / 3 % 2);
        let yaml = format!(
            "name: e{experiments}\ntrial: {{command: [echo], workers: {workers}, resources: {{gpu: {gpu}, cpu: 1}}, max_retries: 1}}\nsearch: {{trials: {}}}\n",
            pick % 4 + 1
        );
        // A GPU worker on a cluster without GPUs is refused at once
        // (it would wait forever); everything else is accepted.
        let any_gpu = self.shapes.iter().any(|(gpus, _)| *gpus > 0);
        match try_submit(&mut self.core, self.now, &yaml, true) {
            Ok(_) => prop_assert!(gpu == 0 || any_gpu),
            Err(CoreError::NoNodeCanHold { .. }) => prop_assert!(gpu == 1 && !any_gpu),
            Err(other) => panic!("unexpected refusal: {other}"),
        }
        Ok(())
    }

    /// Starts the launched, not yet started worker that `pick` chooses, if any.
    fn start_one(&mut self, pick: u16) {
        let all: Vec<(NodeId, WorkerKey)> = self
            .nodes
            .iter()
            .flat_map(|(id, node)| {
                node.launched
                    .keys()
                    .filter(|key| !node.started.contains(key))
                    .map(move |key| (*id, *key))
            })
            .collect();
        if let Some((id, key)) = all.get(usize::from(pick) % all.len().max(1)).copied() {
            self.nodes.get_mut(&id).unwrap().started.insert(key);
            report(
                &mut self.core,
                self.now,
                id,
                WorkerReport::Started { key, pid: 1 },
            );
        }
    }

    /// Ends the started worker that `pick` chooses, if any: it fails when
    /// `pick` is a multiple of 5.
    fn exit_one(&mut self, pick: u16) {
        let all: Vec<(NodeId, WorkerKey)> = self
            .nodes
            .iter()
            .flat_map(|(id, node)| node.started.iter().map(move |key| (*id, *key)))
            .collect();
        if let Some((id, key)) = all.get(usize::from(pick) % all.len().max(1)).copied() {
            let node = self.nodes.get_mut(&id).unwrap();
            node.started.remove(&key);
            node.launched.remove(&key);
            let code = if pick.is_multiple_of(5) { 1 } else { 0 };
            exited(&mut self.core, self.now, id, key, code);
        }
    }

    /// Silences the node that `pick` chooses, long enough for it to be lost, or
    /// brings it back empty if it was silent.
    fn silence_or_return(&mut self, pick: u16) {
        let ids: Vec<NodeId> = self.nodes.keys().copied().collect();
        let id = ids[usize::from(pick) % ids.len()];
        let node = self.nodes.get_mut(&id).unwrap();
        if node.silent {
            node.silent = false;
            node.launched.clear();
            node.started.clear();
            let (gpus, cpus) = self.shapes[usize::from(id.0.as_bytes()[0]) - 1];
            self.core
                .handle_node_register(self.now, registration(id, gpus, cpus, Vec::new()));
        } else {
            node.silent = true;
        }
    }

    /// Cancels the experiment that `pick` chooses, one time in three.
    fn maybe_cancel(&mut self, pick: u16) {
        let statuses = self.core.status(None).unwrap();
        // Submissions no node could hold were refused: there may be none.
        if !statuses.is_empty() && pick.is_multiple_of(3) {
            let victim = &statuses[usize::from(pick) % statuses.len()];
            self.core
                .handle_cancel(self.now, &victim.id.to_string())
                .unwrap();
        }
    }

    /// Heartbeats from every node that is not silent, then a tick, past the
    /// node timeout when `lose`.
    fn heartbeat_and_tick(&mut self, lose: bool) {
        for (id, node) in &self.nodes {
            if !node.silent {
                self.core
                    .handle_node_message(self.now, *id, NodeMessage::Heartbeat);
            }
        }
        self.core.handle_tick(self.now + 10_001 * u64::from(lose));
    }

    /// Carries out the core's commands on the fake nodes, checking that no GPU
    /// is given while another worker holds it and that every attempt is
    /// launched whole.
    fn check_commands(&mut self) -> Result<(), TestCaseError> {
        let now = self.now;
        let mut placed_per_attempt: BTreeMap<(TrialId, u32), (u32, u32)> = BTreeMap::new();
        for (id, command) in commands(&mut self.core) {
            let node = self.nodes.get_mut(&id).unwrap();
            match command {
                HeadCommand::Launch(launch) => {
                    for gpu in &launch.gpu_indices {
                        let holder = node.launched.iter().find(|(_, gpus)| gpus.contains(gpu));
                        prop_assert!(
                            holder.is_none(),
                            "GPU {gpu} of {id} given to {} while {:?} holds it",
                            launch.key,
                            holder
                        );
                    }
                    node.launched.insert(launch.key, launch.gpu_indices.clone());
                    let entry = placed_per_attempt
                        .entry((launch.key.trial, launch.key.attempt))
                        .or_insert((0, launch.world_size));
                    entry.0 += 1;
                }
                HeadCommand::Kill { trial, attempt, .. } => {
                    let killed: Vec<WorkerKey> = node
                        .launched
                        .keys()
                        .filter(|key| key.trial == trial && key.attempt == attempt)
                        .copied()
                        .collect();
                    for key in killed {
                        node.launched.remove(&key);
                        node.started.remove(&key);
                        if !node.silent {
                            let reason = "killed".to_owned();
                            report(
                                &mut self.core,
                                now,
                                id,
                                WorkerReport::Stopped { key, reason },
                            );
                        }
                    }
                }
                _ => {}
            }
        }
        for ((trial, attempt), (launched, world)) in placed_per_attempt {
            prop_assert_eq!(
                launched,
                world,
                "attempt {} of {} launched partially",
                attempt,
                trial
            );
        }
        Ok(())
    }

    /// Records on the fake nodes the launches the core commands.
    fn take_launches(&mut self) {
        for (id, command) in commands(&mut self.core) {
            if let HeadCommand::Launch(launch) = command {
                let node = self.nodes.get_mut(&id).unwrap();
                node.launched.insert(launch.key, launch.gpu_indices.clone());
            }
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

    #[test]
    fn random_clusters_never_double_book_and_place_gangs_whole(
        shapes in proptest::collection::vec((0u32..4, 1u32..5), 1..4),
        actions in proptest::collection::vec((0u8..8, any::<u16>()), 1..150),
    ) {
        let mut simulation = Simulation::new(shapes);
        for (selector, pick) in actions {
            simulation.now += 100;
            match selector {
                0 | 1 => simulation.check_submission(pick)?,
                2 | 3 => simulation.start_one(pick),
                4 | 5 => simulation.exit_one(pick),
                // A node goes silent long enough to be lost, and later comes back empty.
                6 => simulation.silence_or_return(pick),
                _ => simulation.maybe_cancel(pick),
            }
            simulation.heartbeat_and_tick(selector == 6);
            simulation.check_commands()?;
            simulation.core.check_invariants();
            // Kills answered above can free slots and place more; drain those too.
            simulation.take_launches();
            simulation.core.check_invariants();
        }
    }
}

/// Runs every launched worker of `core` to a successful end, reporting `loss` from `loss_of(config)`.
fn finish_all(
    core: &mut HeadCore,
    now: u64,
    node: NodeId,
    loss_of: impl Fn(&serde_json::Value) -> f64,
) -> usize {
    let launched = launches(&commands(core));
    for (_, key) in &launched {
        let config: serde_json::Value =
            serde_json::from_str(&core.book.trial(key.trial).config_json).unwrap();
        report(core, now, node, WorkerReport::Started { key: *key, pid: 1 });
        report(
            core,
            now,
            node,
            WorkerReport::Metric {
                key: *key,
                index: 1,
                step: Some(1),
                values: vec![("loss".to_owned(), loss_of(&config))],
            },
        );
        report(
            core,
            now,
            node,
            WorkerReport::Exited {
                key: *key,
                code: Some(0),
                signal: None,
            },
        );
    }
    launched.len()
}

const ADAPTIVE: &str = "name: a\ntrial: {command: [echo, '{x}']}\nsearch:\n  algorithm: tpe\n  space: {x: {uniform: [-5, 5]}}\n  metric: loss\n  trials: 7\n  parallel: 2\n  seed: 3\n";

fn loaded_from(records: Vec<Record>) -> LoadedState {
    let mut loaded = LoadedState::default();
    let mut experiments = BTreeMap::new();
    let mut trials = BTreeMap::new();
    let mut nodes = BTreeMap::new();
    let mut pipelines = BTreeMap::new();
    let mut alerts = BTreeMap::new();
    for record in records {
        match record {
            Record::Experiment(experiment) => {
                experiments.insert(experiment.id, experiment);
            }
            Record::Trial(trial) => {
                trials.insert(trial.id, trial);
            }
            Record::Node(node) => {
                nodes.insert(node.id, node);
            }
            Record::Event(event) => loaded.last_event_seq = loaded.last_event_seq.max(event.seq),
            Record::Metric(_) | Record::User(_) | Record::Audit(_) | Record::Telemetry(_) => {}
            Record::Policy(policy) => loaded.policy = Some(policy),
            Record::Pipeline(pipeline) => {
                pipelines.insert(pipeline.id, pipeline);
            }
            Record::Alert(alert) => {
                alerts.insert(alert.id, alert);
            }
        }
    }
    loaded.pipelines = pipelines.into_values().collect();
    loaded.alerts = alerts.into_values().collect();
    loaded.experiments = experiments.into_values().collect();
    loaded.trials = trials.into_values().collect();
    loaded.nodes = nodes.into_values().collect();
    loaded
}

#[test]
fn an_adaptive_sweep_asks_as_trials_finish_and_survives_a_restart() {
    let mut core = HeadCore::restore(CONFIG, LoadedState::default(), 0);
    let node = node_id(1);
    core.handle_node_register(0, registration(node, 0, 8, Vec::new()));
    let experiment = submit(&mut core, 0, ADAPTIVE, false);
    let loss = |config: &serde_json::Value| (config["x"].as_f64().unwrap() - 1.0).powi(2);
    assert_eq!(
        finish_all(&mut core, 1, node, loss),
        2,
        "parallel: 2 configurations at a time"
    );
    assert_eq!(finish_all(&mut core, 2, node, loss), 2);
    let mut records = core.take_records();

    // A copy restored from the records must propose what the original proposes next.
    let mut twin = HeadCore::restore(CONFIG, loaded_from(records.clone()), 3);
    twin.handle_node_register(3, registration(node, 0, 8, Vec::new()));
    assert_eq!(finish_all(&mut core, 3, node, loss), 2);
    assert_eq!(finish_all(&mut twin, 3, node, loss), 2);
    let next_configs = |core: &HeadCore| -> Vec<String> {
        (0..7)
            .filter_map(|index| {
                core.book
                    .get_trial(TrialId { experiment, index })
                    .map(|trial| trial.config_json.clone())
            })
            .collect()
    };
    assert_eq!(next_configs(&core), next_configs(&twin));
    assert_eq!(
        finish_all(&mut core, 4, node, loss),
        1,
        "the budget of 7 configurations ends the sweep"
    );
    assert_eq!(finish_all(&mut core, 5, node, loss), 0);
    assert_eq!(
        core.status(None).unwrap()[0].state,
        xp_runtime::protocol::ExperimentState::Succeeded
    );
    records.extend(core.take_records());
    let told = records
        .iter()
        .filter_map(|record| match record {
            Record::Experiment(experiment) => Some(
                experiment
                    .sweep_log
                    .iter()
                    .filter(|op| matches!(op, crate::sweep::SweepOp::Told { .. }))
                    .count(),
            ),
            _ => None,
        })
        .max()
        .unwrap();
    assert_eq!(told, 7);
    core.check_invariants();
}

#[test]
fn early_stopping_stops_a_bad_trial_and_frees_its_slot() {
    let mut core = HeadCore::restore(CONFIG, LoadedState::default(), 0);
    let node = node_id(1);
    core.handle_node_register(0, registration(node, 0, 8, Vec::new()));
    let yaml = "name: es\ntrial: {command: [echo, '{x}']}\nsearch:\n  algorithm: grid\n  space: {x: {choice: [1, 2, 3, 4]}}\n  metric: loss\n  early_stopping: {rule: asha, grace_period: 1, reduction_factor: 2, max_t: 8}\n";
    let experiment = submit(&mut core, 0, yaml, false);
    let launched = launches(&commands(&mut core));
    assert_eq!(launched.len(), 4);
    for (_, key) in &launched {
        report(
            &mut core,
            1,
            node,
            WorkerReport::Started { key: *key, pid: 1 },
        );
    }
    // Losses grow with x: the worst trials must not survive the first rung.
    for (_, key) in &launched {
        let loss = f64::from(key.trial.index + 1);
        report(
            &mut core,
            2,
            node,
            WorkerReport::Metric {
                key: *key,
                index: 1,
                step: Some(1),
                values: vec![("loss".to_owned(), loss)],
            },
        );
    }
    let stopped: Vec<u32> = (0..4)
        .filter(|index| trial_state(&core, experiment, *index) == TrialState::Stopped)
        .collect();
    assert!(
        stopped.contains(&3),
        "the worst trial is stopped: {stopped:?}"
    );
    assert!(!stopped.contains(&0), "the best trial runs on");
    let reason = core
        .book
        .trial(TrialId {
            experiment,
            index: 3,
        })
        .reason
        .clone()
        .unwrap();
    assert!(reason.contains("asha"), "{reason}");
    let kills = commands(&mut core)
        .into_iter()
        .filter(|(_, command)| matches!(command, HeadCommand::Kill { .. }))
        .count();
    assert_eq!(kills, stopped.len());
    core.check_invariants();
}

#[test]
fn a_lost_node_that_speaks_again_is_asked_to_register_and_old_reports_do_not_overwrite() {
    let mut core = HeadCore::restore(CONFIG, LoadedState::default(), 0);
    let (a, b) = (node_id(1), node_id(2));
    core.handle_node_register(0, registration(a, 0, 1, Vec::new()));
    let experiment = submit(&mut core, 0, ONE, false);
    let old = launches(&commands(&mut core))[0].1;
    report(&mut core, 1, a, WorkerReport::Started { key: old, pid: 1 });
    core.handle_node_register(2, registration(b, 0, 1, Vec::new()));
    core.handle_node_message(11_000, b, NodeMessage::Heartbeat);
    core.handle_tick(11_001);
    let after_loss = commands(&mut core);
    assert!(
        after_loss
            .iter()
            .any(|(node, command)| *node == a && matches!(command, HeadCommand::Kill { .. })),
        "the lost worker is told to stop"
    );
    let new = launches(&after_loss)
        .into_iter()
        .find(|(node, _)| *node == b)
        .unwrap()
        .1;
    // The lost node was only partitioned: it speaks on its old session.
    core.handle_node_message(11_500, a, NodeMessage::Heartbeat);
    assert!(
        commands(&mut core)
            .iter()
            .any(|(node, command)| *node == a && matches!(command, HeadCommand::Reconnect { .. }))
    );
    report(
        &mut core,
        12_000,
        b,
        WorkerReport::Started { key: new, pid: 2 },
    );
    report(
        &mut core,
        12_000,
        b,
        WorkerReport::Metric {
            key: new,
            index: 1,
            step: Some(5),
            values: vec![("loss".to_owned(), 0.1)],
        },
    );
    report(
        &mut core,
        12_000,
        b,
        WorkerReport::Exited {
            key: new,
            code: Some(0),
            signal: None,
        },
    );
    // The old attempt's late report, resent after the partition, changes nothing.
    core.handle_node_register(12_500, registration(a, 0, 1, vec![old]));
    report(
        &mut core,
        12_600,
        a,
        WorkerReport::Metric {
            key: old,
            index: 1,
            step: Some(9),
            values: vec![("loss".to_owned(), 9.0)],
        },
    );
    let trial = &core.book.trial(TrialId {
        experiment,
        index: 0,
    });
    assert_eq!(trial.state, TrialState::Succeeded);
    assert_eq!(trial.metrics.get("loss"), Some(&0.1));
    assert_eq!(trial.last_step, Some(5));
    core.check_invariants();
}

#[test]
fn a_sweep_whose_suggestions_are_all_reused_keeps_asking() {
    let mut core = HeadCore::restore(CONFIG, LoadedState::default(), 0);
    let node = node_id(1);
    core.handle_node_register(0, registration(node, 0, 8, Vec::new()));
    let loss = |config: &serde_json::Value| (config["x"].as_f64().unwrap() - 1.0).powi(2);
    let small = ADAPTIVE.replace("trials: 7", "trials: 2");
    submit(&mut core, 0, &small, false);
    assert_eq!(finish_all(&mut core, 1, node, loss), 2);
    // The same start-up suggestions with a bigger budget: the first two are reused.
    let bigger = submit(&mut core, 2, &ADAPTIVE.replace("name: a", "name: b"), false);
    assert_eq!(
        core.book
            .trial(TrialId {
                experiment: bigger,
                index: 0
            })
            .reused_from
            .map(|id| id.index),
        Some(0)
    );
    let mut ran = 0;
    for now in 3..20 {
        ran += finish_all(&mut core, now, node, loss);
    }
    assert_eq!(ran, 5, "the other five configurations still run");
    assert_eq!(core.book.trials_of(bigger).count(), 7);
}

#[test]
fn master_ports_rotate_so_a_retry_never_reuses_a_stopping_rank_zero_port() {
    let mut core = HeadCore::restore(CONFIG, LoadedState::default(), 0);
    let node = node_id(1);
    core.handle_node_register(0, registration(node, 0, 1, Vec::new()));
    submit(&mut core, 0, ONE, false);
    let port_of = |commands: &[(NodeId, HeadCommand)]| {
        commands.iter().find_map(|(_, command)| match command {
            HeadCommand::Launch(launch) => Some(launch.master_port),
            _ => None,
        })
    };
    let first = commands(&mut core);
    let key = launches(&first)[0].1;
    report(
        &mut core,
        1,
        node,
        WorkerReport::Exited {
            key,
            code: Some(1),
            signal: None,
        },
    );
    let second = commands(&mut core);
    assert_ne!(port_of(&first), port_of(&second));
}

const TWO_GPU_TRIALS: &str = "name: two\nteam: a\ntrial: {command: [sleep, '{s}'], resources: {gpu: 1}}\nsearch: {algorithm: grid, space: {s: {choice: [1, 2]}}}\n";

/// Checks that the trials of `experiment` all wait and that the team, at its
/// pending limit, is refused another experiment with the policy's retry time.
fn check_team_at_its_pending_limit(core: &mut HeadCore, experiment: ExperimentId) {
    let status = core.status(Some(&experiment.to_string())).unwrap();
    assert!(
        status[0].trials.iter().all(|trial| trial.waiting.is_some()),
        "{status:?}"
    );
    let three = TWO_GPU_TRIALS.replace("two", "three");
    let refused = try_submit(core, 2, &three, false).unwrap_err();
    let refused = xp_runtime::protocol::RemoteError::from(refused);
    assert_eq!(
        refused.code,
        xp_runtime::protocol::ErrorCode::TooManyPending
    );
    assert_eq!(refused.retry_after_ms, Some(7_000));
}

/// Checks that trial 0 of `experiment` waits for alice's hold and that its
/// events say so.
fn check_held_by_alice(core: &HeadCore, experiment: ExperimentId) {
    let status = core.status(Some(&experiment.to_string())).unwrap();
    assert_eq!(
        status[0].trials[0].waiting.as_deref(),
        Some("held by an admin")
    );
    let events = events_of(core, experiment);
    assert!(
        events
            .iter()
            .any(|event| event.reason == "admin alice: held (testing)"),
        "{events:?}"
    );
}

#[test]
fn admin_holds_and_reprioritises_and_a_restart_adopts_running_trials() {
    let mut core = HeadCore::restore(CONFIG, LoadedState::default(), 0);
    let policy =
        "queues: [{name: qa, team: a}]\nadmission: {max_pending_per_team: 2, retry_after: 7s}\n";
    must_apply_policy(&mut core, 0, policy);
    let experiment = submit(&mut core, 1, TWO_GPU_TRIALS, false);
    // No node yet: both trials wait, and the team is at its pending limit.
    check_team_at_its_pending_limit(&mut core, experiment);

    // Hold trial 0: only trial 1 starts when a node with one GPU arrives.
    let held = TrialId {
        experiment,
        index: 0,
    };
    let id = held.to_string();
    let (touched, _) = admin(&mut core, 3, AdminAction::Hold { id }).unwrap();
    assert_eq!(touched, 1);
    let node = node_id(1);
    core.handle_node_register(4, registration(node, 1, 4, Vec::new()));
    let placed = launches(&commands(&mut core));
    assert_eq!(placed.len(), 1);
    assert_eq!(placed[0].1.trial.index, 1);
    check_held_by_alice(&core, experiment);
    core.check_invariants();

    // After a restart the running trial still holds its GPU: the released trial
    // does not start on top of it.
    let mut records = core.take_records();
    records.retain(|record| !matches!(record, Record::Metric(_)));
    let mut restarted = HeadCore::restore(CONFIG, loaded_from(records), 10);
    let id = held.to_string();
    admin(&mut restarted, 11, AdminAction::Release { id }).unwrap();
    restarted.handle_node_register(12, registration(node, 1, 4, vec![placed[0].1]));
    assert!(launches(&commands(&mut restarted)).is_empty());
    restarted.check_invariants();
    let status = restarted.status(Some(&experiment.to_string())).unwrap();
    assert_eq!(status[0].trials[0].state, TrialState::Queued);
}

/// Two priority classes, and 30 s for preempted work to stop.
const PREEMPTING: &str =
    "priority_classes: {low: 0, high: 100}\npreemption: {grace_period: 30s, min_run_time: 0s}\n";

const LOW: &str = "name: low\npriority: low\ntrial: {command: [sleep, '9'], resources: {gpu: 1}, max_retries: 0}\n";

const HIGH: &str =
    "name: high\npriority: high\ntrial: {command: [sleep, '1'], resources: {gpu: 1}}\n";

/// A core under [`PREEMPTING`] with one node of one GPU and the trial of
/// [`LOW`] running on it since 2: the core, the node, the experiment and the
/// worker.
fn low_running() -> (HeadCore, NodeId, ExperimentId, WorkerKey) {
    let mut core = HeadCore::restore(CONFIG, LoadedState::default(), 0);
    must_apply_policy(&mut core, 0, PREEMPTING);
    let node = node_id(1);
    core.handle_node_register(0, registration(node, 1, 4, Vec::new()));
    let low = submit(&mut core, 1, LOW, false);
    let placed = launches(&commands(&mut core));
    assert_eq!(placed.len(), 1);
    let low_key = placed[0].1;
    let started = WorkerReport::Started {
        key: low_key,
        pid: 7,
    };
    report(&mut core, 2, node, started);
    assert_eq!(trial_state(&core, low, 0), TrialState::Running);
    (core, node, low, low_key)
}

/// Checks the commands after `high` arrived: the low trial's worker is asked
/// to stop with the grace, nothing is launched, and `high` says what it waits for.
fn check_asked_to_stop_with_the_grace(
    core: &mut HeadCore,
    low: ExperimentId,
    low_key: WorkerKey,
    high: ExperimentId,
) {
    let sent = commands(core);
    assert!(
        sent.iter().any(|(_, command)| matches!(
            command,
            HeadCommand::Kill { trial, grace_ms: 30_000, .. } if *trial == low_key.trial
        )),
        "{sent:?}"
    );
    assert!(launches(&sent).is_empty(), "the GPU is still held");
    assert_eq!(trial_state(core, low, 0), TrialState::Preempting);
    let status = core.status(Some(&high.to_string())).unwrap();
    assert_eq!(
        status[0].trials[0].waiting.as_deref(),
        Some("waiting for preempted work to stop")
    );
}

/// Checks that the trial of `key` is queued again as preempted, no retry used.
fn check_requeued_without_a_retry(core: &HeadCore, key: WorkerKey) {
    let trial = &core.book.trial(key.trial);
    assert_eq!(trial.state, TrialState::Queued);
    assert_eq!(trial.failures, 0);
    assert_eq!(trial.preemptions, 1);
    assert_eq!(trial.attempts[0].outcome.as_deref(), Some("preempted"));
}

#[test]
fn a_preempted_trial_is_stopped_with_grace_requeued_without_a_retry_and_runs_again() {
    let (mut core, node, low, low_key) = low_running();

    // A high-priority trial arrives: the low one is asked to stop with the grace.
    let high = submit(&mut core, 3, HIGH, false);
    check_asked_to_stop_with_the_grace(&mut core, low, low_key, high);
    core.check_invariants();

    // It stops within its grace (killed by SIGTERM): requeued, no retry used, and
    // the high trial takes the GPU.
    let terminated = WorkerReport::Exited {
        key: low_key,
        code: None,
        signal: Some(15),
    };
    report(&mut core, 4, node, terminated);
    check_requeued_without_a_retry(&core, low_key);
    let placed = launches(&commands(&mut core));
    assert_eq!(placed.len(), 1);
    assert_eq!(placed[0].1.trial.experiment, high);
    core.check_invariants();

    // When the high trial is done, the low one runs again (attempt 2).
    let high_key = placed[0].1;
    let started = WorkerReport::Started {
        key: high_key,
        pid: 8,
    };
    report(&mut core, 5, node, started);
    exited(&mut core, 6, node, high_key, 0);
    let placed = launches(&commands(&mut core));
    assert_eq!(placed.len(), 1);
    assert_eq!(placed[0].1.trial, low_key.trial);
    assert_eq!(placed[0].1.attempt, 2);
    core.check_invariants();
}

fn checkpoint_report(key: WorkerKey, step: u64, bytes: &[u8]) -> WorkerReport {
    WorkerReport::Checkpoint {
        key,
        step,
        files: vec![xp_runtime::protocol::CheckpointFile {
            name: "state".to_owned(),
            object: xp_runtime::ids::ObjectId::of(bytes),
            size: bytes.len() as u64,
        }],
        backup: None,
        take_ms: 3,
    }
}

/// One trial that keeps its last two checkpoints and may be retried twice.
const CHECKPOINTED: &str = "name: ck\ntrial: {command: [train], max_retries: 2, resources: {cpu: 1}}\ncheckpoints: {keep_last: 2, keep_best: 0}\n";

/// Checks the commands after the checkpoints of steps 10, 20 and 30 were
/// taken on `node`: each goes to `other`, step 10 is dropped, and the last
/// two are kept.
fn check_replicated_and_retained(
    core: &mut HeadCore,
    experiment: ExperimentId,
    node: NodeId,
    other: NodeId,
) {
    let sent = commands(core);
    let replications: Vec<_> = sent
        .iter()
        .filter_map(|(to, command)| match command {
            HeadCommand::Replicate {
                objects, sources, ..
            } => Some((*to, objects.len(), sources[0].node)),
            _ => None,
        })
        .collect();
    assert_eq!(
        replications,
        vec![(other, 1, node); 3],
        "each kept checkpoint goes to the other node"
    );
    let dropped: Vec<_> = sent
        .iter()
        .filter_map(|(to, command)| match command {
            HeadCommand::DropObjects { objects, .. } => Some((*to, objects.clone())),
            _ => None,
        })
        .collect();
    let first = xp_runtime::ids::ObjectId::of(&10u64.to_le_bytes());
    assert_eq!(
        dropped,
        vec![(node, vec![first])],
        "keep_last 2 drops step 10 where it is held"
    );
    assert_eq!(
        core.checkpoints(&experiment.to_string())
            .unwrap()
            .iter()
            .map(|checkpoint| checkpoint.step)
            .collect::<Vec<_>>(),
        [20, 30]
    );
}

/// Checks that the failed trial of `key` is launched again, resuming from its
/// step 30 in the replica `last`; returns the node it runs on.
fn check_resumed_from_the_replica(
    core: &mut HeadCore,
    key: WorkerKey,
    last: xp_runtime::ids::ObjectId,
) -> NodeId {
    let relaunch = commands(core)
        .into_iter()
        .find_map(|(to, command)| match command {
            HeadCommand::Launch(launch) => Some((to, launch)),
            _ => None,
        })
        .expect("the failed trial is retried");
    let resume = relaunch.1.resume.expect("it resumes from a checkpoint");
    assert_eq!((resume.step, resume.attempt), (30, 1));
    assert_eq!(resume.files[0].object, last);
    assert!(!resume.sources.is_empty());
    let trial = &core.book.trial(key.trial);
    assert_eq!(trial.attempts[1].resumed_from, Some((30, 1)));
    relaunch.0
}

#[test]
fn checkpoints_are_replicated_retained_and_resumed_from() {
    let mut core = HeadCore::restore(CONFIG, LoadedState::default(), 0);
    let (a, b) = (node_id(1), node_id(2));
    core.handle_node_register(0, registration(a, 0, 1, Vec::new()));
    core.handle_node_register(0, registration(b, 0, 1, Vec::new()));
    let experiment = submit(&mut core, 1, CHECKPOINTED, false);
    let placed = launches(&commands(&mut core));
    let (node, key) = placed[0];
    let other = if node == a { b } else { a };
    report(&mut core, 2, node, WorkerReport::Started { key, pid: 1 });
    for step in [10u64, 20, 30] {
        let checkpoint = checkpoint_report(key, step, &step.to_le_bytes());
        report(&mut core, 3 + step, node, checkpoint);
    }
    check_replicated_and_retained(&mut core, experiment, node, other);
    // The replica of step 30 arrives; then the trial's node dies.
    let last = xp_runtime::ids::ObjectId::of(&30u64.to_le_bytes());
    let added = NodeMessage::Objects {
        added: vec![last],
        dropped: Vec::new(),
    };
    core.handle_node_message(50, other, added);
    exited(&mut core, 60, node, key, 1);
    let relaunched_on = check_resumed_from_the_replica(&mut core, key, last);
    // A malformed manifest (an escaping file name) is ignored.
    let mut bad = checkpoint_report(WorkerKey { attempt: 2, ..key }, 40, b"x");
    if let WorkerReport::Checkpoint { files, .. } = &mut bad {
        files[0].name = "../escape".to_owned();
    }
    report(&mut core, 70, relaunched_on, bad);
    assert_eq!(core.book.trial(key.trial).checkpoints.len(), 2);
    core.check_invariants();
}

/// Checks what the head asks of `node` when it registers again at 5, restarted
/// and holding `kept` and `orphan` unpinned: `kept` is pinned again and
/// `orphan`, which nothing claims, dropped.
fn check_repinned_on_return(
    core: &mut HeadCore,
    node: NodeId,
    kept: xp_runtime::ids::ObjectId,
    orphan: xp_runtime::ids::ObjectId,
) {
    let forgotten = |id| xp_runtime::protocol::HeldObject {
        id,
        pinned: false,
        trials: Vec::new(),
        drivers: Vec::new(),
    };
    let mut returning = registration(node, 0, 1, Vec::new());
    returning.held_objects = vec![forgotten(kept), forgotten(orphan)];
    core.handle_node_register(5, returning);
    let sent = commands(core);
    let pins: Vec<_> = sent
        .iter()
        .filter_map(|(_, command)| match command {
            HeadCommand::Pin { objects, .. } => Some(objects.clone()),
            _ => None,
        })
        .collect();
    assert_eq!(pins, vec![vec![kept]]);
    let drops: Vec<_> = sent
        .iter()
        .filter_map(|(_, command)| match command {
            HeadCommand::DropObjects { trial, objects } => Some((*trial, objects.clone())),
            _ => None,
        })
        .collect();
    assert_eq!(drops, vec![(None, vec![orphan])]);
}

#[test]
fn late_checkpoint_reports_count_by_attempt_and_step_and_returning_nodes_repin() {
    let (mut core, node) = cluster(0, 1);
    let experiment = submit(&mut core, 1, CHECKPOINTED, false);
    let (_, key) = launches(&commands(&mut core))[0];
    report(&mut core, 2, node, WorkerReport::Started { key, pid: 1 });
    exited(&mut core, 2, node, key, 1);
    let (_, second) = launches(&commands(&mut core))[0];
    assert_eq!(second.attempt, 2);
    let started = WorkerReport::Started {
        key: second,
        pid: 2,
    };
    report(&mut core, 2, node, started);
    let two_hundred = checkpoint_report(second, 200, b"two hundred");
    report(&mut core, 2, node, two_hundred);
    let two_hundred_ten = checkpoint_report(second, 210, b"two hundred ten");
    report(&mut core, 3, node, two_hundred_ten);
    // A report of attempt 1 resent late is older, whatever its arrival.
    report(&mut core, 4, node, checkpoint_report(key, 80, b"eighty"));
    let kept: Vec<(u32, u64)> = core
        .checkpoints(&experiment.to_string())
        .unwrap()
        .iter()
        .map(|checkpoint| (checkpoint.attempt, checkpoint.step))
        .collect();
    assert_eq!(kept, [(2, 200), (2, 210)]);
    // One trial's alone, as `xp status EXPERIMENT-tN` asks for them.
    let of_trial: Vec<(u32, u64)> = core
        .trial_checkpoints(key.trial)
        .unwrap()
        .iter()
        .map(|checkpoint| (checkpoint.attempt, checkpoint.step))
        .collect();
    assert_eq!(of_trial, kept);
    let unknown = TrialId {
        experiment: key.trial.experiment,
        index: 99,
    };
    assert!(core.trial_checkpoints(unknown).is_err());
    // The node comes back restarted: it forgot its pins and claims. The head pins
    // the kept checkpoint's object again and drops what nothing claims.
    let _ = commands(&mut core);
    let kept_id = xp_runtime::ids::ObjectId::of(b"two hundred ten");
    let orphan = xp_runtime::ids::ObjectId::of(b"unrelated");
    check_repinned_on_return(&mut core, node, kept_id, orphan);
}

/// When the restarted head of the restart tests started.
const RESTARTED_AT: u64 = 100_000;

/// A head that placed ONE's trial on a node, saw it start and report a metric,
/// and was then killed and restarted at `RESTARTED_AT`: the restarted core, the
/// node and the running worker.
fn restarted_with_a_running_trial() -> (HeadCore, NodeId, WorkerKey) {
    let mut core = HeadCore::restore(CONFIG, LoadedState::default(), 0);
    let node = node_id(1);
    core.handle_node_register(0, registration(node, 0, 2, Vec::new()));
    submit(&mut core, 1, ONE, false);
    let key = launches(&commands(&mut core))[0].1;
    report(&mut core, 2, node, WorkerReport::Started { key, pid: 7 });
    let records = core.take_records();
    let restarted = HeadCore::restore(CONFIG, loaded_from(records), RESTARTED_AT);
    (restarted, node, key)
}

#[test]
fn an_exit_while_the_head_was_away_keeps_the_time_the_node_recorded() {
    let (mut core, node, key) = restarted_with_a_running_trial();
    // The node registers naming the worker whose end the head has not
    // acknowledged, then resends that end with the time it recorded.
    core.handle_node_register(RESTARTED_AT + 1_000, registration(node, 0, 2, vec![key]));
    let exited_at = RESTARTED_AT - 5_000;
    core.handle_node_message(
        RESTARTED_AT + 1_000,
        node,
        NodeMessage::Report {
            seq: 2,
            at: exited_at,
            report: WorkerReport::Exited {
                key,
                code: Some(0),
                signal: None,
            },
        },
    );
    let trial = core.book.trial(key.trial);
    assert_eq!(trial.state, TrialState::Succeeded);
    assert_eq!(trial.finished_at, Some(exited_at));
    assert_eq!(trial.attempts[0].ended_at, Some(exited_at));
    // A node clock ahead of the head's is not believed.
    let (mut core, node, key) = restarted_with_a_running_trial();
    core.handle_node_register(RESTARTED_AT + 1_000, registration(node, 0, 2, vec![key]));
    core.handle_node_message(
        RESTARTED_AT + 2_000,
        node,
        NodeMessage::Report {
            seq: 2,
            at: RESTARTED_AT + 60_000,
            report: WorkerReport::Exited {
                key,
                code: Some(0),
                signal: None,
            },
        },
    );
    assert_eq!(
        core.book.trial(key.trial).finished_at,
        Some(RESTARTED_AT + 2_000)
    );
}

/// Whether the node of [`restarted_with_a_running_trial`] is judged lost by a
/// tick `tick_after_ms` after the restart, when it registers again
/// `registers_after_ms` after the restart (or never) and is silent since.
fn check_restart_grace(registers_after_ms: Option<u64>, tick_after_ms: u64, expected_lost: bool) {
    let (mut core, node, key) = restarted_with_a_running_trial();
    if let Some(after) = registers_after_ms {
        core.handle_node_register(RESTARTED_AT + after, registration(node, 0, 2, vec![key]));
    }
    core.handle_tick(RESTARTED_AT + tick_after_ms);
    let lost = core.membership.node(node).unwrap().state == xp_runtime::protocol::NodeState::Lost;
    assert_eq!(
        lost, expected_lost,
        "registered after {registers_after_ms:?} ms, tick after {tick_after_ms} ms"
    );
    let attempts = &core.book.trial(key.trial).attempts;
    assert_eq!(attempts[0].is_live(), !expected_lost);
    core.check_invariants();
}

#[test]
fn a_restarted_head_waits_the_node_return_time_plus_the_timeout_before_judging_a_node_lost() {
    let grace = CONFIG.restart_grace_ms();
    assert_eq!(
        grace, 22_000,
        "the node's return time plus the node timeout"
    );
    // Not lost by the node timeout alone: the node may not yet have noticed.
    check_restart_grace(None, CONFIG.node_timeout_ms + 1, false);
    check_restart_grace(None, grace, false);
    check_restart_grace(None, grace + 1, true);
    // A node that came back is judged by the ordinary timeout from then on.
    check_restart_grace(Some(grace - 1), grace + 1, false);
    check_restart_grace(Some(1_000), 1_000 + CONFIG.node_timeout_ms, false);
    check_restart_grace(Some(1_000), 1_000 + CONFIG.node_timeout_ms + 1, true);
}

#[test]
fn a_restarted_head_adopts_an_exit_its_node_buffered_while_it_was_down() {
    let (mut core, node, key) = restarted_with_a_running_trial();
    let experiment = key.trial.experiment;
    // Work submitted before the node is back waits for it: a launch sent to a
    // node that has not registered would be dropped and the attempt lost.
    let later = submit(
        &mut core,
        RESTARTED_AT + 1,
        &ONE.replace("one", "later"),
        false,
    );
    core.handle_tick(RESTARTED_AT + CONFIG.node_timeout_ms + 1);
    assert!(launches(&commands(&mut core)).is_empty());
    assert_eq!(trial_state(&core, experiment, 0), TrialState::Running);

    // The node registers with the worker whose exit the old head never
    // acknowledged, then resends its unacknowledged reports in order.
    let back = RESTARTED_AT + CONFIG.node_timeout_ms + 2;
    core.handle_node_register(back, registration(node, 0, 2, vec![key]));
    let metric = WorkerReport::Metric {
        key,
        index: 1,
        step: Some(1),
        values: vec![("loss".to_owned(), 0.5)],
    };
    report(&mut core, back, node, metric);
    let exited = WorkerReport::Exited {
        key,
        code: Some(0),
        signal: None,
    };
    report(&mut core, back, node, exited);
    let after = commands(&mut core);
    assert!(
        !after
            .iter()
            .any(|(_, command)| matches!(command, HeadCommand::Kill { .. })),
        "{after:?}"
    );
    let placed = launches(&after);
    assert_eq!(placed.len(), 1, "only the later experiment's trial starts");
    assert_eq!(placed[0].1.trial.experiment, later);
    let trial = &core.book.trial(key.trial);
    assert_eq!(trial.state, TrialState::Succeeded);
    assert_eq!(trial.attempts.len(), 1, "the trial was not run again");
    assert_eq!(trial.metrics.get("loss"), Some(&0.5));
    core.check_invariants();
}

#[test]
fn a_worker_no_node_could_hold_is_refused_at_submission() {
    let spec = |resources: &str| {
        format!("name: big\ntrial: {{command: [echo], resources: {{{resources}}}}}\n")
    };
    let mut core = HeadCore::restore(CONFIG, LoadedState::default(), 0);
    // With no node known yet, nodes may still join: accepted, and the trial waits.
    try_submit(&mut core, 1, &spec("memory: 1EiB"), true).unwrap();
    core.handle_node_register(2, registration(node_id(1), 2, 8, Vec::new()));
    core.handle_node_register(2, registration(node_id(2), 4, 4, Vec::new()));
    for (resources, refused) in [
        ("memory: 1EiB", true),
        ("gpu: 5", true),
        ("cpu: 9", true),
        ("gpu: 4, cpu: 8", true),
        ("gpu: 4, cpu: 4, memory: 16GiB", false),
        ("gpu: 0.5, cpu: 8", false),
    ] {
        match try_submit(&mut core, 3, &spec(resources), true) {
            Err(CoreError::NoNodeCanHold {
                largest_gpus,
                largest_cpu_milli,
                largest_memory_bytes,
                ..
            }) => {
                assert!(refused, "{resources} was refused");
                assert_eq!(
                    (largest_gpus, largest_cpu_milli, largest_memory_bytes),
                    (4, 8000, 1 << 34)
                );
            }
            Ok(_) => assert!(!refused, "{resources} was accepted"),
            Err(other) => panic!("{resources}: unexpected refusal {other}"),
        }
    }
}

#[test]
fn the_restart_grace_starts_when_the_head_can_hear_its_nodes() {
    // Loading and replaying history took 15 s: the grace counts from then.
    let (mut core, node, _key) = restarted_with_a_running_trial();
    let ready_at = RESTARTED_AT + 15_000;
    core.begin_restart_grace(ready_at);
    let grace = CONFIG.restart_grace_ms();
    core.handle_tick(RESTARTED_AT + grace + 1);
    assert_ne!(
        core.membership.node(node).unwrap().state,
        xp_runtime::protocol::NodeState::Lost
    );
    core.handle_tick(ready_at + grace + 1);
    assert_eq!(
        core.membership.node(node).unwrap().state,
        xp_runtime::protocol::NodeState::Lost
    );
    core.check_invariants();
}

#[test]
fn a_draining_node_moves_its_trial_elsewhere_without_a_retry_and_leaves_at_once() {
    // A node leaving on SIGTERM (a Slurm job ending): it says it drains, its
    // worker checkpoints and is stopped, and its session closes.
    let mut core = HeadCore::restore(CONFIG, LoadedState::default(), 0);
    let (leaving, staying) = (node_id(1), node_id(2));
    core.handle_node_register(0, registration(leaving, 0, 1, Vec::new()));
    let yaml = "name: drain\ntrial: {command: [train], max_retries: 0, resources: {cpu: 1}}\n";
    let experiment = submit(&mut core, 1, yaml, false);
    let (node, key) = launches(&commands(&mut core))[0];
    assert_eq!(node, leaving);
    report(&mut core, 2, leaving, WorkerReport::Started { key, pid: 1 });
    let mut checkpoint = checkpoint_report(key, 10, b"ten");
    if let WorkerReport::Checkpoint { backup, .. } = &mut checkpoint {
        *backup = Some("/shared/backup".to_owned());
    }
    core.handle_node_message(3, leaving, NodeMessage::Draining);
    report(&mut core, 4, leaving, checkpoint);
    report(
        &mut core,
        5,
        leaving,
        WorkerReport::Stopped {
            key,
            reason: "node draining".to_owned(),
        },
    );
    // Requeued although it may not retry, and nothing goes back to the draining node.
    assert_eq!(trial_state(&core, experiment, 0), TrialState::Queued);
    assert!(launches(&commands(&mut core)).is_empty());
    core.handle_node_left(6, leaving);
    assert_eq!(
        core.membership.node(leaving).unwrap().state,
        xp_runtime::protocol::NodeState::Lost
    );
    // A node that only lost its connection is left to the heartbeat timeout.
    core.handle_node_left(6, staying);
    core.handle_node_register(7, registration(staying, 0, 1, Vec::new()));
    core.handle_node_left(8, staying);
    assert_eq!(
        core.membership.node(staying).unwrap().state,
        xp_runtime::protocol::NodeState::Ready
    );
    let relaunch = commands(&mut core)
        .into_iter()
        .find_map(|(to, command)| match command {
            HeadCommand::Launch(launch) => Some((to, launch)),
            _ => None,
        })
        .expect("the trial runs again on the node that stays");
    assert_eq!(relaunch.0, staying);
    assert_eq!(relaunch.1.key.attempt, 2);
    let resume = relaunch.1.resume.expect("it resumes from its checkpoint");
    assert_eq!(
        (resume.step, resume.backup.as_deref()),
        (10, Some("/shared/backup"))
    );
    // The node that left is no source: the resume goes to the backup at once.
    assert!(resume.sources.iter().all(|source| source.node != leaving));
    core.check_invariants();
}

#[test]
fn trials_over_the_pending_limit_after_a_restart_are_handed_over_as_room_frees() {
    const THREE: &str = "name: three\nteam: a\ntrial: {command: [sleep, '{s}'], resources: {gpu: 1}}\nsearch: {algorithm: grid, space: {s: {choice: [1, 2, 3]}}}\n";
    let mut core = HeadCore::restore(CONFIG, LoadedState::default(), 0);
    must_apply_policy(&mut core, 0, "admission: {max_pending_per_team: 3}\n");
    let experiment = submit(&mut core, 1, THREE, false);
    let mut loaded = loaded_from(core.take_records());
    // Restarted under a policy that lets the team have two pending trials.
    loaded.policy.as_mut().expect("applied").yaml =
        "admission: {max_pending_per_team: 2}\n".to_owned();
    let mut restarted = HeadCore::restore(CONFIG, loaded, 10);
    restarted.handle_tick(11);
    let trial = |index| TrialId { experiment, index };
    let held: Vec<bool> = (0..3)
        .map(|index| restarted.placement.policy().holds(trial(index)))
        .collect();
    assert_eq!(held, [true, true, false]);

    // A node takes one: the third is handed over in a later pass, untouched meanwhile.
    restarted.handle_node_register(12, registration(node_id(1), 1, 4, Vec::new()));
    assert_eq!(launches(&commands(&mut restarted)).len(), 1);
    restarted.handle_tick(13);
    assert!(restarted.placement.policy().holds(trial(2)));
    restarted.check_invariants();
}
