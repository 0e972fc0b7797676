//! Tests of the node's decisions on a virtual clock: one `check_*` helper per
//! feature, each case a line, and a seeded property test that replays random
//! event orderings against the invariants in the module documentation.

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use proptest::prelude::*;
use xp_runtime::ids::{ExperimentId, NodeId, ObjectId, TrialId, WorkerKey};
use xp_runtime::protocol::{HeadCommand, Launch, NodeMessage, Program, WorkerReport};
use xp_runtime::transport::TransportError;

use super::{Action, CoreConfig, NodeCore, check_drain_timeout, drain::drain_grace};
use crate::gpu::GpuMemory;
use crate::objects::{ObjectChange, Owner};
use crate::telemetry::eviction::Eviction;

/// The drain timeout of every test: 20 s, the default.
const DRAIN: Duration = Duration::from_secs(20);
/// The most timeouts one wait may fire: more is a livelock.
const MAX_STEPS: usize = 10_000;

#[expect(
    clippy::disallowed_methods,
    reason = "a fixed origin for the virtual clock; the core only ever sees offsets from it"
)]
fn origin() -> Instant {
    Instant::now()
}

fn trial(index: u32) -> TrialId {
    TrialId {
        experiment: ExperimentId { digest: 5, run: 1 },
        index,
    }
}

/// Rank `rank` of trial `index`'s first attempt.
fn key(index: u32, rank: u32) -> WorkerKey {
    WorkerKey {
        trial: trial(index),
        attempt: 1,
        rank,
    }
}

/// How a worker appears in the expectations: `w1.0` is trial 1's rank 0.
fn name(key: WorkerKey) -> String {
    format!("w{}.{}", key.trial.index, key.rank)
}

/// A launch of `key` holding the whole GPUs `gpus`.
fn launch(key: WorkerKey, gpus: &[u32]) -> Launch {
    Launch {
        key,
        world_size: 1,
        local_rank: 0,
        program: Program::Command {
            argv: vec!["true".to_owned()],
        },
        config_json: "{}".to_owned(),
        seed: 0,
        gpu_indices: gpus.to_vec(),
        gpu_milli: if gpus.is_empty() { 0 } else { 1000 },
        master_addr: "127.0.0.1".to_owned(),
        master_port: 29500,
        collective_token: [0; 32],
        transport: Default::default(),
        resume: None,
        cpu_milli: 0,
        memory_bytes: 0,
        inputs: Vec::new(),
        collect_outputs: false,
        oversubscription_milli: 1000,
        object_capability: None,
        command_dir: None,
        object_path: Default::default(),
    }
}

fn report_name(report: &WorkerReport) -> String {
    let kind = match report {
        WorkerReport::Started { .. } => "started",
        WorkerReport::Metric { .. } => "metric",
        WorkerReport::Exited { .. } => "exited",
        WorkerReport::Stopped { .. } => "stopped",
        WorkerReport::Refused { .. } => "refused",
        WorkerReport::LaunchFailed { .. } => "failed",
        WorkerReport::Evicted { .. } => "evicted",
        WorkerReport::OomKilled { .. } => "oom",
        _ => "other",
    };
    format!("{kind} {}", name(report.key()))
}

/// An action as the expectations write it; times are offsets from `origin`.
fn describe(action: &Action, origin: Instant) -> String {
    let at = |instant: Instant| format!("{}ms", (instant - origin).as_millis());
    match action {
        Action::Connect => "connect".to_owned(),
        Action::Register { running } => {
            let running: Vec<String> = running.iter().map(|key| name(*key)).collect();
            format!("register [{}]", running.join(" "))
        }
        Action::Send(NodeMessage::Report { seq, report, .. }) => {
            format!("report {seq} {}", report_name(report))
        }
        Action::Send(NodeMessage::Heartbeat) => "heartbeat".to_owned(),
        Action::Send(NodeMessage::Draining) => "draining".to_owned(),
        Action::Send(NodeMessage::Objects { added, dropped }) => {
            format!("objects +{} -{}", added.len(), dropped.len())
        }
        Action::Send(other) => format!("send {other:?}"),
        Action::Start(launch) => format!("start {}", name(launch.key)),
        Action::Stop { key, request } => {
            let evicted = if request.eviction.is_some() {
                " evict"
            } else {
                ""
            };
            format!(
                "stop {} {}ms{evicted}",
                name(*key),
                request.grace.as_millis()
            )
        }
        Action::Forget(key) => format!("forget {}", name(*key)),
        Action::ReadLogs { key, complete, .. } => format!("read-logs {} {complete}", name(*key)),
        Action::Replicate { objects, .. } => format!("replicate {}", objects.len()),
        Action::Pin { objects, .. } => format!("pin {}", objects.len()),
        Action::DropObjects { objects, .. } => format!("drop {}", objects.len()),
        Action::ReleaseOwner(owner) => format!("release {owner}"),
        Action::ObjectRules(rules) => format!("object rules {}", rules.revoked.len()),
        Action::RevokeCapabilities(entries) => format!("revoke {}", entries.len()),
        Action::RenewCapabilities(capabilities) => format!("renew {}", capabilities.len()),
        Action::CloseSession { linger_until } => match linger_until {
            Some(until) => format!("close until {}", at(*until)),
            None => "close".to_owned(),
        },
        Action::Leave { deadline, refused } => {
            let refused = if *refused { " refused" } else { "" };
            format!("leave by {}{refused}", at(*deadline))
        }
    }
}

/// A core on a virtual clock, driven as the agent drives it.
struct Driven {
    core: NodeCore,
    origin: Instant,
    now: Instant,
}

impl Driven {
    fn new(memory_watched: bool) -> Self {
        let origin = origin();
        let core = NodeCore::new(CoreConfig {
            node_id: NodeId(uuid::Uuid::from_bytes([3; 16])),
            drain_timeout: DRAIN,
            memory_watched,
        });
        Self {
            core,
            origin,
            now: origin,
        }
    }

    /// A core whose session is open and registered, with nothing left to do.
    fn in_session() -> Self {
        let mut driven = Self::new(true);
        driven.core.handle_connected(driven.now);
        driven.command(HeadCommand::Registered {
            heartbeat_interval_ms: 1000,
        });
        driven.actions();
        driven
    }

    /// The actions handed out since the last call.
    fn actions(&mut self) -> Vec<String> {
        let mut out = Vec::new();
        while let Some(action) = self.core.poll_action() {
            out.push(describe(&action, self.origin));
        }
        out
    }

    fn command(&mut self, command: HeadCommand) {
        self.core.handle_command(self.now, command);
    }

    fn report(&mut self, report: WorkerReport) {
        let at = u64::try_from((self.now - self.origin).as_millis()).unwrap_or(u64::MAX);
        self.core.handle_report(self.now, at, report);
    }

    /// Starts `key` on `gpus` and forgets what that did.
    fn must_start(&mut self, key: WorkerKey, gpus: &[u32]) {
        self.command(HeadCommand::Launch(Box::new(launch(key, gpus))));
        assert_eq!(self.actions(), [format!("start {}", name(key))]);
    }

    /// Moves the clock on by `ms`, firing every timeout on the way as the agent
    /// does, and taking each one's actions with `take`.
    fn advance_with(&mut self, ms: u64, mut take: impl FnMut(&mut Self)) {
        let target = self.now + Duration::from_millis(ms);
        let mut steps = 0;
        while let Some(due) = self.core.poll_timeout().filter(|due| *due <= target) {
            steps += 1;
            assert!(
                steps < MAX_STEPS,
                "livelock: the timeout at {due:?} never moves on"
            );
            self.now = self.now.max(due);
            self.core.handle_timeout(self.now);
            take(self);
        }
        self.now = target;
    }

    /// Moves the clock on by `ms`, leaving the actions of the timeouts on the way.
    fn advance(&mut self, ms: u64) {
        self.advance_with(ms, |_| {});
    }
}

fn exited(key: WorkerKey) -> WorkerReport {
    WorkerReport::Exited {
        key,
        code: Some(0),
        signal: None,
    }
}

fn eviction(key: WorkerKey) -> Eviction {
    Eviction {
        key,
        gpu: GpuMemory {
            index: 0,
            used_bytes: 97,
            total_bytes: 100,
        },
    }
}

/// Launches `launched` (each a worker and its GPUs) on a session where
/// `running` already run (and the node drains first when `draining`): what
/// the core does for the last launch.
fn check_launch(running: &[(WorkerKey, &[u32])], draining: bool, last: Launch, expected: &[&str]) {
    let mut driven = Driven::in_session();
    for (key, gpus) in running {
        driven.must_start(*key, gpus);
    }
    if draining {
        driven.core.handle_shutdown(driven.now);
        driven.actions();
    }
    driven.command(HeadCommand::Launch(Box::new(last)));
    assert_eq!(driven.actions(), expected);
}

fn oversubscribed(key: WorkerKey, factor_milli: u32) -> Launch {
    Launch {
        gpu_milli: 400,
        oversubscription_milli: factor_milli,
        ..launch(key, &[0])
    }
}

#[test]
fn launches_start_unless_duplicate_draining_out_of_range_or_busy() {
    check_launch(&[], false, launch(key(1, 0), &[0]), &["start w1.0"]);
    check_launch(&[(key(1, 0), &[0])], false, launch(key(1, 0), &[0]), &[]);
    check_launch(
        &[(key(1, 0), &[0])],
        false,
        launch(key(2, 0), &[1]),
        &["start w2.0"],
    );
    check_launch(
        &[(key(1, 0), &[0])],
        false,
        launch(key(2, 0), &[0]),
        &["report 1 refused w2.0"],
    );
    check_launch(
        &[(key(1, 0), &[0])],
        true,
        launch(key(2, 0), &[1]),
        &["report 1 refused w2.0"],
    );
    check_launch(&[], false, oversubscribed(key(1, 0), 0), &["start w1.0"]);
    check_launch(&[], false, oversubscribed(key(1, 0), 1500), &["start w1.0"]);
    check_launch(
        &[],
        false,
        oversubscribed(key(1, 0), 999),
        &["report 1 failed w1.0"],
    );
    check_launch(
        &[],
        false,
        oversubscribed(key(1, 0), 4001),
        &["report 1 failed w1.0"],
    );
}

#[test]
fn an_ended_worker_frees_its_gpus() {
    let mut driven = Driven::in_session();
    driven.must_start(key(1, 0), &[0]);
    driven.report(exited(key(1, 0)));
    assert_eq!(driven.actions(), ["forget w1.0", "report 1 exited w1.0"]);
    driven.must_start(key(2, 0), &[0]);
}

/// Kills `trial`'s attempt `attempt` with `grace_ms` among the running `workers`.
fn check_kill(workers: &[WorkerKey], attempt: u32, grace_ms: u64, expected: &[&str]) {
    let mut driven = Driven::in_session();
    for key in workers {
        driven.must_start(*key, &[]);
    }
    driven.command(HeadCommand::Kill {
        trial: trial(1),
        attempt,
        reason: "preempted".to_owned(),
        grace_ms,
    });
    assert_eq!(driven.actions(), expected);
}

#[test]
fn a_kill_stops_its_attempts_ranks_once_with_a_bounded_grace() {
    let both = [key(1, 0), key(1, 1), key(2, 0)];
    check_kill(&both, 1, 5000, &["stop w1.0 5000ms", "stop w1.1 5000ms"]);
    check_kill(&both, 2, 5000, &[]);
    check_kill(&[key(1, 0)], 1, 86_400_000, &["stop w1.0 600000ms"]);
    let mut driven = Driven::in_session();
    driven.must_start(key(1, 0), &[]);
    let kill = || HeadCommand::Kill {
        trial: trial(1),
        attempt: 1,
        reason: "preempted".to_owned(),
        grace_ms: 100,
    };
    driven.command(kill());
    driven.actions();
    driven.command(kill());
    assert_eq!(driven.actions(), Vec::<String>::new(), "stopped once");
}

/// Evicts `key` after `before` happened to the running worker `w1.0`.
fn check_eviction(before: &str, key: WorkerKey, expected: &[&str]) {
    let mut driven = Driven::in_session();
    driven.must_start(self::key(1, 0), &[0]);
    match before {
        "killed" => driven.command(HeadCommand::Kill {
            trial: trial(1),
            attempt: 1,
            reason: "preempted".to_owned(),
            grace_ms: 100,
        }),
        "ended" => driven.report(exited(self::key(1, 0))),
        "disconnected" => driven.core.handle_disconnected(driven.now),
        _ => {}
    }
    driven.actions();
    driven.core.handle_eviction(eviction(key));
    assert_eq!(driven.actions(), expected);
}

#[test]
fn an_eviction_stops_a_live_worker_through_its_checkpoint_once() {
    check_eviction("", key(1, 0), &["stop w1.0 30000ms evict"]);
    check_eviction("disconnected", key(1, 0), &["stop w1.0 30000ms evict"]);
    check_eviction("killed", key(1, 0), &[]);
    check_eviction("ended", key(1, 0), &[]);
    check_eviction("", key(9, 0), &[]);
}

/// Ends a session in which the head registered the node or not (`registered`),
/// after `failures` failed attempts: what the core does, and when it asks to
/// connect again, in milliseconds from the session's end.
fn check_session_end(registered: bool, failures: u32, expected: &[&str], retry_ms: Option<u64>) {
    let mut driven = Driven::new(true);
    driven.actions();
    for _ in 0..failures {
        driven
            .core
            .handle_connect_failed(driven.now, &TransportError::ClosedEarly);
        driven.advance(2_000);
        assert_eq!(driven.actions(), ["connect"]);
    }
    driven.core.handle_connected(driven.now);
    if registered {
        driven.command(HeadCommand::Registered {
            heartbeat_interval_ms: 1000,
        });
    }
    driven.actions();
    let ended = driven.now;
    driven.core.handle_disconnected(ended);
    assert_eq!(driven.actions(), expected);
    let retry = driven
        .core
        .poll_timeout()
        .map(|at| (at - ended).as_millis() as u64);
    match (retry, retry_ms) {
        (Some(retry), Some(ceiling)) => {
            assert!((ceiling / 2..=ceiling).contains(&retry), "{retry} ms");
        }
        (retry, expected) => assert_eq!(retry, expected),
    }
}

#[test]
fn a_registered_session_reconnects_at_once_and_others_back_off() {
    check_session_end(true, 0, &["close", "connect"], None);
    check_session_end(true, 3, &["close", "connect"], None);
    check_session_end(false, 0, &["close"], Some(200));
    check_session_end(false, 2, &["close"], Some(800));
}

#[test]
fn a_refused_node_leaves_and_an_unreachable_head_is_tried_again() {
    let mut driven = Driven::new(true);
    assert_eq!(driven.actions(), ["connect"]);
    driven
        .core
        .handle_connect_failed(driven.now, &TransportError::BadToken("no".to_owned()));
    assert_eq!(driven.actions(), ["leave by 20000ms refused"]);
    let mut driven = Driven::new(true);
    driven.actions();
    driven
        .core
        .handle_connect_failed(driven.now, &TransportError::ClosedEarly);
    assert_eq!(driven.actions(), Vec::<String>::new());
    driven.advance(200);
    assert_eq!(driven.actions(), ["connect"]);
}

#[test]
fn a_new_session_registers_resends_in_order_and_heartbeats() {
    let mut driven = Driven::in_session();
    driven.must_start(key(1, 0), &[]);
    driven.must_start(key(2, 0), &[]);
    driven.report(WorkerReport::Started {
        key: key(1, 0),
        pid: 7,
    });
    driven.report(exited(key(2, 0)));
    driven.command(HeadCommand::Ack { upto: 1 });
    driven.core.handle_disconnected(driven.now);
    driven.report(exited(key(1, 0)));
    driven.actions();
    driven.core.handle_connected(driven.now);
    assert_eq!(
        driven.actions(),
        [
            "register [w1.0 w2.0]",
            "report 2 exited w2.0",
            "report 3 exited w1.0",
            "heartbeat",
        ]
    );
    driven.command(HeadCommand::Registered {
        heartbeat_interval_ms: 5000,
    });
    driven.advance(2500);
    assert_eq!(
        driven.actions(),
        ["heartbeat", "heartbeat"],
        "this session's period"
    );
}

#[test]
fn the_heads_orders_are_carried_out_and_log_reads_say_whether_complete() {
    let mut driven = Driven::in_session();
    driven.must_start(key(1, 0), &[]);
    let read = |key| HeadCommand::ReadLogs {
        request_id: 1,
        key,
        offset: 0,
        max_bytes: 10,
    };
    driven.command(read(key(1, 0)));
    driven.command(read(key(2, 0)));
    driven.command(HeadCommand::Pin {
        trial: trial(1),
        objects: vec![ObjectId::of(b"a")],
    });
    driven.command(HeadCommand::DropObjects {
        trial: None,
        objects: vec![ObjectId::of(b"a"), ObjectId::of(b"b")],
    });
    driven.command(HeadCommand::ReleaseTrial { trial: trial(1) });
    driven.command(HeadCommand::Replicate {
        trial: trial(1),
        objects: vec![(ObjectId::of(b"a"), 1)],
        sources: Vec::new(),
        path: Default::default(),
    });
    driven.core.handle_object_changes(vec![
        ObjectChange::Added(ObjectId::of(b"a")),
        ObjectChange::Dropped(ObjectId::of(b"b")),
        ObjectChange::Dropped(ObjectId::of(b"c")),
    ]);
    assert_eq!(
        driven.actions(),
        [
            "read-logs w1.0 false",
            "read-logs w2.0 true",
            "pin 1",
            "drop 2",
            &format!("release {}", Owner::Trial(trial(1))),
            "replicate 1",
            "objects +1 -2",
        ]
    );
}

/// SIGTERM during a session with `workers` running; then each of `events`
/// (`ended N`, `ack N`, `wait MS`): every action from SIGTERM on.
fn check_drain(workers: &[u32], events: &[&str], expected: &[&str]) {
    let mut driven = Driven::in_session();
    for index in workers {
        driven.must_start(key(*index, 0), &[]);
    }
    driven.core.handle_shutdown(driven.now);
    for event in events {
        let (what, number) = event.split_once(' ').expect("an event and its number");
        let number: u64 = number.parse().expect("a number");
        match what {
            "ended" => driven.report(WorkerReport::Stopped {
                key: key(number as u32, 0),
                reason: "node draining".to_owned(),
            }),
            "ack" => driven.command(HeadCommand::Ack { upto: number }),
            "wait" => driven.advance(number),
            _ => panic!("unknown event {event}"),
        }
    }
    assert_eq!(driven.actions(), expected);
}

#[test]
fn a_drain_stops_every_worker_and_leaves_once_the_head_stored_their_ends() {
    let stop = |index| format!("stop w{index}.0 15000ms");
    check_drain(
        &[],
        &[],
        &["draining", "close until 2000ms", "leave by 20000ms"],
    );
    check_drain(
        &[1],
        &["ended 1"],
        &["draining", &stop(1), "forget w1.0", "report 1 stopped w1.0"],
    );
    check_drain(
        &[1, 2],
        &["ended 1", "ended 2", "ack 2"],
        &[
            "draining",
            &stop(1),
            &stop(2),
            "forget w1.0",
            "report 1 stopped w1.0",
            "forget w2.0",
            "report 2 stopped w2.0",
            "close until 2000ms",
            "leave by 20000ms",
        ],
    );
    check_drain(
        &[1],
        &["wait 19000"],
        &["draining", &stop(1), "heartbeat", "heartbeat"]
            .into_iter()
            .chain(["heartbeat"; 17])
            .collect::<Vec<_>>(),
    );
    check_drain(
        &[1],
        &["wait 20000"],
        &["draining", &stop(1)]
            .into_iter()
            .chain(["heartbeat"; 20])
            .chain(["close until 20000ms", "leave by 20000ms"])
            .collect::<Vec<_>>(),
    );
}

#[test]
fn shutting_down_without_a_session_leaves_at_once_and_a_lost_head_ends_a_drain() {
    let mut driven = Driven::new(true);
    driven.actions();
    driven
        .core
        .handle_connect_failed(driven.now, &TransportError::ClosedEarly);
    driven.core.handle_eviction(eviction(key(1, 0)));
    driven.core.handle_shutdown(driven.now);
    assert_eq!(driven.actions(), ["leave by 20000ms"]);
    driven.core.handle_shutdown(driven.now);
    assert_eq!(driven.actions(), Vec::<String>::new(), "once");
    let mut driven = Driven::in_session();
    driven.must_start(key(1, 0), &[]);
    driven.advance(5_000);
    driven.core.handle_shutdown(driven.now);
    driven.actions();
    driven.advance(1_000);
    driven.core.handle_disconnected(driven.now);
    assert_eq!(driven.actions(), ["close", "leave by 25000ms"]);
}

#[test]
fn workers_get_most_of_what_is_left_of_the_drain() {
    let check = |left_ms: u64, grace_ms: u64| {
        let grace = drain_grace(Duration::from_millis(left_ms));
        assert_eq!(grace, Duration::from_millis(grace_ms), "{left_ms} ms left");
    };
    check(20_000, 15_000);
    check(2_000, 1_000);
    check(800, 0);
    check(0, 0);
    assert!(check_drain_timeout(Duration::from_secs(20)).is_ok());
    assert!(check_drain_timeout(Duration::from_secs(1)).is_err());
    assert!(check_drain_timeout(Duration::from_secs(601)).is_err());
}

/// One thing that may happen to a node, for the property test.
#[derive(Debug, Clone)]
enum Event {
    /// The pending connection attempt succeeds, or fails.
    Connect(bool),
    /// The session breaks.
    Disconnect,
    /// The head registers the node.
    Registered,
    /// The head acknowledges every report so far.
    AckAll,
    /// The head launches trial `index`'s rank 0 on GPU `gpu`.
    Launch { index: u32, gpu: u32 },
    /// The head kills trial `index`'s first attempt.
    Kill { index: u32 },
    /// Trial `index`'s worker ends (if it is live).
    End { index: u32 },
    /// The eviction watch picks trial `index`'s worker.
    Evict { index: u32 },
    /// SIGTERM.
    Shutdown,
    /// Time passes.
    Wait { ms: u64 },
}

fn event() -> impl Strategy<Value = Event> {
    prop_oneof![
        4 => prop::bool::weighted(0.8).prop_map(Event::Connect),
        1 => Just(Event::Disconnect),
        2 => Just(Event::Registered),
        3 => Just(Event::AckAll),
        4 => (0..6u32, 0..3u32).prop_map(|(index, gpu)| Event::Launch { index, gpu }),
        1 => (0..6u32).prop_map(|index| Event::Kill { index }),
        3 => (0..6u32).prop_map(|index| Event::End { index }),
        1 => (0..6u32).prop_map(|index| Event::Evict { index }),
        1 => Just(Event::Shutdown),
        3 => (0..8_000u64).prop_map(|ms| Event::Wait { ms }),
    ]
}

/// What the agent knows, checked against every action the core hands out.
#[derive(Debug, Default)]
struct Model {
    connecting: bool,
    session: bool,
    /// Live workers and the GPUs they hold.
    live: BTreeMap<WorkerKey, Vec<u32>>,
    stopped: BTreeSet<WorkerKey>,
    /// When SIGTERM came.
    shutdown_at: Option<Instant>,
    left: bool,
    seq: u64,
}

impl Model {
    /// Takes every action of `driven`, asserting the invariants.
    fn perform(&mut self, driven: &mut Driven) {
        while let Some(action) = driven.core.poll_action() {
            assert!(!self.left, "nothing after leaving: {action:?}");
            match action {
                Action::Connect => {
                    assert!(!self.session && !self.connecting);
                    self.connecting = true;
                }
                Action::Register { .. } => assert!(self.session, "registering without a session"),
                Action::Send(message) => {
                    assert!(self.session, "writing without a session: {message:?}");
                    if let NodeMessage::Report { seq, .. } = message {
                        self.seq = self.seq.max(seq);
                    }
                }
                Action::Start(launch) => self.start(&launch),
                Action::Stop { key, .. } => {
                    assert!(self.live.contains_key(&key), "stopping {key}, not live");
                    assert!(self.stopped.insert(key), "stopping {key} twice");
                }
                Action::Forget(key) => {
                    assert!(
                        self.live.remove(&key).is_some(),
                        "forgetting {key}, not live"
                    );
                    self.stopped.remove(&key);
                }
                Action::CloseSession { .. } => {
                    assert!(self.session);
                    self.session = false;
                }
                Action::Leave { deadline, .. } => {
                    if let Some(shutdown_at) = self.shutdown_at {
                        assert_eq!(deadline, shutdown_at + DRAIN);
                    }
                    self.left = true;
                }
                Action::ReadLogs { .. }
                | Action::Replicate { .. }
                | Action::Pin { .. }
                | Action::DropObjects { .. }
                | Action::ReleaseOwner(_)
                | Action::ObjectRules(_)
                | Action::RevokeCapabilities(_)
                | Action::RenewCapabilities(_) => {}
            }
        }
        let core_live: BTreeSet<_> = driven.core.workers.keys().copied().collect();
        let model_live: BTreeSet<_> = self.live.keys().copied().collect();
        assert_eq!(core_live, model_live);
        if let Some(shutdown_at) = self.shutdown_at {
            assert!(
                self.left || driven.now < shutdown_at + DRAIN,
                "still here at the drain's deadline"
            );
        }
    }

    fn start(&mut self, launch: &Launch) {
        assert!(self.shutdown_at.is_none(), "a start after SIGTERM");
        for (key, gpus) in &self.live {
            assert!(
                gpus.iter().all(|gpu| !launch.gpu_indices.contains(gpu)),
                "{} shares a GPU with {key}",
                launch.key
            );
        }
        assert!(
            self.live
                .insert(launch.key, launch.gpu_indices.clone())
                .is_none()
        );
    }

    /// Whether the core must start `key` on `gpu` now.
    fn admits(&self, key: WorkerKey, gpu: u32) -> bool {
        self.session
            && self.shutdown_at.is_none()
            && !self.live.contains_key(&key)
            && self.live.values().all(|gpus| !gpus.contains(&gpu))
    }
}

/// Plays `events` on a fresh core the way the agent would, then SIGTERM and
/// the whole drain timeout: the node must have left by then.
fn replay(events: &[Event]) {
    let mut driven = Driven::new(true);
    let mut model = Model::default();
    model.perform(&mut driven);
    let drain_ms = DRAIN.as_millis() as u64;
    let ending = [Event::Shutdown, Event::Wait { ms: drain_ms }];
    for event in events.iter().chain(&ending) {
        if model.left {
            break;
        }
        play(event, &mut driven, &mut model);
    }
    assert!(model.left, "still here at the drain's deadline");
}

/// Plays one event, if it can happen now.
fn play(event: &Event, driven: &mut Driven, model: &mut Model) {
    let now = driven.now;
    match event.clone() {
        Event::Connect(succeeds) if model.connecting => {
            model.connecting = false;
            if succeeds {
                model.session = true;
                driven.core.handle_connected(now);
            } else {
                driven
                    .core
                    .handle_connect_failed(now, &TransportError::ClosedEarly);
            }
        }
        Event::Disconnect if model.session => driven.core.handle_disconnected(now),
        Event::Registered if model.session => driven.command(HeadCommand::Registered {
            heartbeat_interval_ms: 500,
        }),
        Event::AckAll if model.session => driven.command(HeadCommand::Ack { upto: model.seq }),
        Event::Launch { index, gpu } if model.session => {
            let admits = model.admits(key(index, 0), gpu);
            driven.command(HeadCommand::Launch(Box::new(launch(key(index, 0), &[gpu]))));
            let started = driven
                .core
                .actions
                .iter()
                .any(|action| matches!(action, Action::Start(_)));
            assert_eq!(started, admits, "launch of {index} on GPU {gpu}");
        }
        Event::Kill { index } if model.session => driven.command(HeadCommand::Kill {
            trial: trial(index),
            attempt: 1,
            reason: "preempted".to_owned(),
            grace_ms: 1000,
        }),
        Event::End { index } if model.live.contains_key(&key(index, 0)) => {
            driven.report(exited(key(index, 0)));
        }
        Event::Evict { index } => driven.core.handle_eviction(eviction(key(index, 0))),
        Event::Shutdown => {
            if model.shutdown_at.is_none() {
                model.shutdown_at = Some(now);
            }
            driven.core.handle_shutdown(now);
        }
        // Each timeout due on the way fires, and its actions are taken then.
        Event::Wait { ms } => driven.advance_with(ms, |driven| model.perform(driven)),
        _ => {}
    }
    model.perform(driven);
}

proptest! {
    // Failures print the minimal event list, which replays exactly; no
    // regression file is written outside this module.
    #![proptest_config(ProptestConfig {
        cases: 512,
        failure_persistence: None,
        ..ProptestConfig::default()
    })]

    #[test]
    fn random_event_orderings_keep_the_invariants(events in prop::collection::vec(event(), 0..80)) {
        replay(&events);
    }
}
