//! The actor over a real registry: a full disk refuses changes, shows what is
//! stored, and recovers by itself.

use std::sync::atomic::{AtomicU64, Ordering};

use dashmap::DashMap;
use tokio::sync::mpsc;
use xp_head_core::CoreConfig;
use xp_head_core::auth::Role;
use xp_head_core::auth::users::{UserRecord, secret_hash};
use xp_runtime::ids::{TrialId, WorkerKey};
use xp_runtime::protocol::{
    ExperimentStatus, MetricsPage, NodeResources, Request, Response, SubmitRequest,
};

use super::*;
use crate::registry::tests::Tmpfs;
use crate::sessions::NodeSessionHandle;

/// The secret of the tests' admin.
const ADMIN_SECRET: &str = "the admin's secret";

/// A user table holding the tests' admin.
fn admin_users() -> Users {
    Users::from_records(vec![UserRecord {
        name: "root".to_owned(),
        team: "ops".to_owned(),
        role: Role::Admin,
        secret_hash: hex::encode(secret_hash(ADMIN_SECRET)),
        created_at: 0,
        revoked_at: None,
    }])
}

/// `request` as the tests' admin asks it, answered as a response.
async fn ask(actor: &ActorRef<HeadMsg>, request: Request) -> Result<Response, RemoteError> {
    let access = requests::access(&request);
    let caller = Caller::User {
        name: "root".to_owned(),
        secret_hash: secret_hash(ADMIN_SECRET),
    };
    let answer = call(actor, |reply| {
        HeadMsg::Request(Asked {
            caller,
            access,
            session: None,
            request,
            reply,
        })
    })
    .await?;
    match answer {
        Answer::Response(response) => Ok(response),
        Answer::Connection(work) => panic!("unexpected work for the connection: {work:?}"),
    }
}

/// A clock the test moves by hand.
#[derive(Debug, Default)]
struct ManualClock(AtomicU64);

impl Clock for ManualClock {
    fn now(&self) -> UnixMillis {
        self.0.load(Ordering::SeqCst)
    }
}

const SESSION: u64 = 7;

fn node() -> NodeId {
    NodeId(uuid::Uuid::from_bytes([1; 16]))
}

fn registration() -> NodeRegistration {
    NodeRegistration {
        node_id: node(),
        name: "node".to_owned(),
        advertise_host: "127.0.0.1".to_owned(),
        resources: NodeResources {
            gpus: Vec::new(),
            cpu_milli: 1_000_000,
            memory_bytes: 1 << 40,
        },
        labels: BTreeMap::new(),
        running: Vec::new(),
        objects: None,
        held_objects: Vec::new(),
        isolation: xp_runtime::protocol::NodeIsolation::default(),
    }
}

/// A submission of `trials` trials, named `name`, whose records are large.
fn submission(name: &str, trials: u32) -> SubmitRequest {
    let choices: Vec<String> = (0..trials).map(|index| index.to_string()).collect();
    let yaml = format!(
        "name: {name}\ntrial: {{command: [echo, '{{x}}', {}]}}\nsearch: {{algorithm: grid, space: {{x: {{choice: [{}]}}}}}}\n",
        "y".repeat(2_000),
        choices.join(", ")
    );
    let spec = xp_runtime::spec::ExperimentSpec::from_yaml(&yaml).unwrap();
    SubmitRequest {
        spec_json: spec.to_canonical_json(),
        program: None,
        code_version: "none".to_owned(),
        data_version: "none".to_owned(),
        rerun: false,
    }
}

async fn status(actor: &ActorRef<HeadMsg>) -> Vec<ExperimentStatus> {
    match ask(actor, Request::Status { experiment: None }).await {
        Ok(Response::Status(list)) => list,
        other => panic!("unexpected status answer: {other:?}"),
    }
}

fn names(list: &[ExperimentStatus]) -> Vec<String> {
    let mut names: Vec<String> = list.iter().map(|status| status.name.clone()).collect();
    names.sort();
    names
}

/// Registers the test's node on a fresh session; returns its command stream.
async fn connect(
    actor: &ActorRef<HeadMsg>,
    sessions: &Sessions,
) -> mpsc::UnboundedReceiver<HeadCommand> {
    let (commands, received) = mpsc::unbounded_channel();
    sessions.insert(
        node(),
        NodeSessionHandle {
            session_id: SESSION,
            commands,
            pending_logs: Arc::new(DashMap::new()),
            heard_at: Arc::new(AtomicU64::new(0)),
        },
    );
    call(actor, |reply| {
        HeadMsg::NodeRegistered(registration(), SESSION, reply)
    })
    .await
    .unwrap();
    received
}

fn drain(received: &mut mpsc::UnboundedReceiver<HeadCommand>) -> Vec<HeadCommand> {
    std::iter::from_fn(|| received.try_recv().ok()).collect()
}

/// A head actor over a registry in a small tmpfs, serving the tests' admin, on
/// a clock the test moves.
struct OnTmpfs {
    /// The registry's database file.
    path: std::path::PathBuf,
    actor: ActorRef<HeadMsg>,
    actor_task: tokio::task::JoinHandle<()>,
    sessions: Sessions,
    health: watch::Receiver<Health>,
    clock: Arc<ManualClock>,
    /// Last, so that it is unmounted after the rest is dropped.
    tmpfs: Tmpfs,
}

/// Spawns the head actor over a fresh registry in an 8 MiB tmpfs, or says why
/// the test is skipped and returns `None` where no tmpfs can be mounted.
#[expect(clippy::print_stderr, reason = "say why the test is skipped")]
async fn must_spawn_on_tmpfs() -> Option<OnTmpfs> {
    let Some(tmpfs) = Tmpfs::mount("8m") else {
        eprintln!("skipped: cannot mount a tmpfs here (needs root)");
        return None;
    };
    let path = tmpfs.path.join("head.redb");
    let mut registry = Registry::open(&path).unwrap();
    let clock = Arc::new(ManualClock::default());
    let core = HeadCore::restore(CoreConfig::default(), registry.load().unwrap(), 0);
    let sessions: Sessions = Arc::new(DashMap::new());
    let (health, health_rx) = watch::channel(Health::Healthy);
    let (actor, actor_task) = Actor::spawn(
        None,
        HeadActor,
        HeadArgs {
            core,
            registry,
            sessions: sessions.clone(),
            event_seq: watch::channel(0).0,
            health,
            clock: clock.clone(),
            users: admin_users(),
            users_changed: watch::channel(0).0,
            join: format!("xp://127.0.0.1:1?token=t&ca={}", "00".repeat(32))
                .parse()
                .unwrap(),
            metrics: Arc::new(HeadMetrics::new()),
            webhooks: Arc::new(crate::webhooks::WebhookQueue::new(16)),
            commit_batch: crate::DEFAULT_COMMIT_BATCH,
            pulse: crate::health::ActorPulse::new(),
        },
    )
    .await
    .unwrap();
    Some(OnTmpfs {
        path,
        actor,
        actor_task,
        sessions,
        health: health_rx,
        clock,
        tmpfs,
    })
}

/// `messages` from the test's node on the session [`SESSION`].
async fn from_node(
    actor: &ActorRef<HeadMsg>,
    messages: Vec<NodeMessage>,
) -> Result<(), RemoteError> {
    call(actor, |reply| {
        HeadMsg::FromNode(node(), SESSION, messages, reply)
    })
    .await
}

/// Makes room again by removing `filler`, moves the clock to the next probe,
/// and waits until the head says it is healthy again.
async fn must_recover(head: &OnTmpfs, filler: std::path::PathBuf) {
    std::fs::remove_file(filler).unwrap();
    head.clock.0.store(10_000, Ordering::SeqCst);
    let mut healthy = head.health.clone();
    tokio::time::timeout(
        Duration::from_secs(30),
        healthy.wait_for(|health| *health == Health::Healthy),
    )
    .await
    .expect("healthy again within the deadline")
    .unwrap();
}

/// Submits experiments to the head on its full disk until one is refused;
/// returns the refusal and the names of those stored (sorted), `first`
/// included.
async fn must_submit_until_refused(actor: &ActorRef<HeadMsg>) -> (RemoteError, Vec<String>) {
    let mut stored = vec!["first".to_owned()];
    let refusal = loop {
        let name = format!("more-{}", stored.len());
        match ask(actor, Request::Submit(submission(&name, 40))).await {
            Ok(_) => stored.push(name),
            Err(refusal) => break refusal,
        }
        assert!(
            stored.len() < 500,
            "submissions kept succeeding on a full disk"
        );
    };
    stored.sort();
    (refusal, stored)
}

/// Checks that `refusal` says the disk is full and the head is unhealthy.
fn check_refused_for_a_full_disk(refusal: &RemoteError, health: &watch::Receiver<Health>) {
    assert_eq!(refusal.code, ErrorCode::StorageUnavailable, "{refusal:?}");
    assert!(
        refusal
            .message
            .starts_with("the head cannot store anything: its disk is full ("),
        "{}",
        refusal.message
    );
    assert!(health.borrow().problem().is_some());
}

/// Checks the head in an outage: changes are refused, node reports neither
/// applied nor acknowledged, and reads still answer.
async fn check_the_outage(
    actor: &ActorRef<HeadMsg>,
    received: &mut mpsc::UnboundedReceiver<HeadCommand>,
) {
    let cancel = Request::Cancel {
        id: "first".to_owned(),
    };
    let refused = ask(actor, cancel).await;
    assert_eq!(refused.unwrap_err().code, ErrorCode::StorageUnavailable);
    from_node(actor, vec![NodeMessage::Heartbeat])
        .await
        .unwrap();
    let sent = drain(received);
    assert!(sent.is_empty(), "{sent:?}");
    // Reads still answer.
    ask(actor, Request::Nodes).await.unwrap();
}

/// Checks that the recovered head asked the node to register again, dropped
/// its session, and refuses what comes on the old one.
async fn check_asked_to_register_again(
    head: &OnTmpfs,
    received: &mut mpsc::UnboundedReceiver<HeadCommand>,
) {
    let asked: Vec<HeadCommand> = drain(received);
    assert!(
        asked
            .iter()
            .any(|command| matches!(command, HeadCommand::Reconnect { .. })),
        "{asked:?}"
    );
    assert!(head.sessions.is_empty());
    // The old session's messages are refused.
    let stale = from_node(&head.actor, vec![NodeMessage::Heartbeat]).await;
    assert_eq!(stale.unwrap_err().code, ErrorCode::Unavailable);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_disk_refuses_changes_shows_what_is_stored_and_recovers_by_itself() {
    let Some(head) = must_spawn_on_tmpfs().await else {
        return;
    };
    let actor = &head.actor;
    let mut received = connect(actor, &head.sessions).await;
    let Ok(Response::Submitted { experiment, .. }) =
        ask(actor, Request::Submit(submission("first", 2))).await
    else {
        panic!("the first submission is taken");
    };
    let events_of_first = Request::Events {
        experiment,
        after: 0,
        wait_ms: 0,
    };
    let Ok(Response::Events(first_events)) = ask(actor, events_of_first.clone()).await else {
        panic!("the first submission's events are read");
    };

    // Fill the disk, then submit until the database must grow and cannot.
    let filler = head.tmpfs.fill();
    let (refusal, mut stored) = must_submit_until_refused(actor).await;
    check_refused_for_a_full_disk(&refusal, &head.health);
    // What is shown is what is stored: the refused submission is not there.
    // Events are read from the store, so not until it opens again.
    assert_eq!(names(&status(actor).await), stored);
    let unreadable = ask(actor, events_of_first.clone()).await.unwrap_err();
    assert_eq!(
        unreadable.code,
        ErrorCode::StorageUnavailable,
        "{unreadable:?}"
    );
    assert!(!first_events.is_empty());
    drain(&mut received);

    // During the outage changes are refused, and node reports neither applied nor acknowledged.
    check_the_outage(actor, &mut received).await;

    // Room again: at the next probe the database re-opens and the node is asked to register.
    must_recover(&head, filler).await;
    check_asked_to_register_again(&head, &mut received).await;
    let Ok(Response::Events(shown)) = ask(actor, events_of_first).await else {
        panic!("the first submission's events are read once the store opens again");
    };
    assert_eq!(shown, first_events);
    // One trial's newest, oldest first.
    let trial = first_events[0].trial;
    let of_trial: Vec<_> = first_events
        .iter()
        .filter(|event| event.trial == trial)
        .cloned()
        .collect();
    assert!(of_trial.len() >= 2, "{first_events:?}");
    let Ok(Response::Events(newest)) = ask(actor, Request::TrialEvents { trial, limit: 2 }).await
    else {
        panic!("a trial's events are read");
    };
    assert_eq!(newest, of_trial[of_trial.len() - 2..]);
    // A new session registers and work goes on.
    let _received = connect(actor, &head.sessions).await;
    ask(actor, Request::Submit(submission("after", 1)))
        .await
        .unwrap();
    stored.push("after".to_owned());
    stored.sort();
    assert_eq!(names(&status(actor).await), stored);

    // A restart shows the same.
    actor.stop(None);
    let OnTmpfs {
        path, actor_task, ..
    } = head;
    actor_task.await.unwrap();
    let mut registry = Registry::open(&path).unwrap();
    let restored = HeadCore::restore(CoreConfig::default(), registry.load().unwrap(), 0);
    assert_eq!(names(&restored.status(None).unwrap()), stored);
}

/// The highest sequence number acknowledged among `commands`.
fn acked(commands: &[HeadCommand]) -> Option<u64> {
    commands
        .iter()
        .filter_map(|command| match command {
            HeadCommand::Ack { upto } => Some(*upto),
            _ => None,
        })
        .max()
}

/// One node batch of `count` metric reports from `key`, numbered from `seq`,
/// each with a large value name so that a few batches fill a small disk.
fn metric_batch(key: WorkerKey, seq: u64, count: u64) -> Vec<NodeMessage> {
    (seq..seq + count)
        .map(|seq| NodeMessage::Report {
            seq,
            // Later than the head's clock: the head's time is taken.
            at: u64::MAX,
            report: xp_runtime::protocol::WorkerReport::Metric {
                key,
                index: seq,
                step: Some(seq),
                values: vec![(format!("loss-{}", "x".repeat(4_000)), seq as f64)],
            },
        })
        .collect()
}

/// Submits one trial and reports from the node that its worker started (report
/// 1); returns the worker once that is acknowledged.
async fn must_start_a_trial(
    actor: &ActorRef<HeadMsg>,
    received: &mut mpsc::UnboundedReceiver<HeadCommand>,
) -> WorkerKey {
    ask(actor, Request::Submit(submission("batch", 1)))
        .await
        .unwrap();
    let key = drain(received)
        .into_iter()
        .find_map(|command| match command {
            HeadCommand::Launch(launch) => Some(launch.key),
            _ => None,
        })
        .expect("the trial is launched");
    let started = vec![NodeMessage::Report {
        seq: 1,
        at: u64::MAX,
        report: xp_runtime::protocol::WorkerReport::Started { key, pid: 9 },
    }];
    from_node(actor, started).await.unwrap();
    assert_eq!(acked(&drain(received)), Some(1));
    key
}

/// Sends batches of `batch` metric reports of `key`, numbered from 2, each
/// acknowledged whole up to its last, until one is not (its commit failed);
/// returns that batch's first number.
async fn must_send_batches_until_one_fails(
    actor: &ActorRef<HeadMsg>,
    received: &mut mpsc::UnboundedReceiver<HeadCommand>,
    key: WorkerKey,
    batch: u64,
) -> u64 {
    let mut seq = 2;
    loop {
        from_node(actor, metric_batch(key, seq, batch))
            .await
            .unwrap();
        let sent = drain(received);
        match acked(&sent) {
            // The whole batch in one commit: acknowledged up to its last.
            Some(upto) => assert_eq!(upto, seq + batch - 1, "{sent:?}"),
            None => return seq,
        }
        seq += batch;
        assert!(seq < 10_000, "batches kept being stored on a full disk");
    }
}

/// A page of `trial`'s metric history.
async fn metrics_page(
    actor: &ActorRef<HeadMsg>,
    trial: TrialId,
    after: Option<u64>,
    limit: u32,
) -> MetricsPage {
    let answer = ask(
        actor,
        Request::Metrics {
            trial,
            after,
            limit,
        },
    )
    .await
    .unwrap();
    let Response::Metrics(page) = answer else {
        panic!("unexpected answer: {answer:?}")
    };
    page
}

/// The steps of the metric history the head stores of `trial`: read whole
/// in one page, and again three reports a page, the same.
async fn stored_steps(actor: &ActorRef<HeadMsg>, trial: TrialId) -> Vec<u64> {
    let whole = metrics_page(actor, trial, None, u32::MAX).await;
    assert_eq!(whole.next, None, "one page");
    assert_eq!(whole.total, whole.points.len() as u64);
    let mut paged = Vec::new();
    let mut after = None;
    loop {
        let page = metrics_page(actor, trial, after, 3).await;
        assert!(page.points.len() <= 3);
        assert_eq!(page.total, whole.total);
        paged.extend(page.points);
        match page.next {
            Some(next) => after = Some(next),
            None => break,
        }
    }
    assert_eq!(paged, whole.points);
    whole.points.iter().filter_map(|point| point.step).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_whose_commit_fails_acknowledges_none_of_it_and_comes_again_once() {
    let Some(head) = must_spawn_on_tmpfs().await else {
        return;
    };
    let actor = &head.actor;
    let mut received = connect(actor, &head.sessions).await;
    let key = must_start_a_trial(actor, &mut received).await;

    // Batches of 40 reports, each stored by one commit, until the disk is full.
    let filler = head.tmpfs.fill();
    let batch = 40;
    let failed_from = must_send_batches_until_one_fails(actor, &mut received, key, batch).await;
    assert!(head.health.borrow().problem().is_some());

    // Room again: the head recovers and asks the node to register again.
    must_recover(&head, filler).await;
    let stored = stored_steps(actor, key.trial).await;
    assert!(
        stored.iter().all(|step| *step < failed_from),
        "nothing of the failed batch (from {failed_from}) is stored"
    );
    assert_eq!(stored.len() as u64, failed_from - 2);

    // The node resends what was not acknowledged, on a new session: stored once.
    let mut received = connect(actor, &head.sessions).await;
    from_node(actor, metric_batch(key, failed_from, batch))
        .await
        .unwrap();
    assert_eq!(acked(&drain(&mut received)), Some(failed_from + batch - 1));
    let stored = stored_steps(actor, key.trial).await;
    assert_eq!(stored, (2..failed_from + batch).collect::<Vec<_>>());
}

/// A head actor over a fresh registry in `dir`, serving the tests' admin;
/// its counters.
async fn must_spawn_in(dir: &std::path::Path) -> (ActorRef<HeadMsg>, Arc<HeadMetrics>) {
    let mut registry = Registry::open(&dir.join("head.redb")).unwrap();
    let core = HeadCore::restore(CoreConfig::default(), registry.load().unwrap(), 0);
    let metrics = Arc::new(HeadMetrics::new());
    let (actor, _task) = Actor::spawn(
        None,
        HeadActor,
        HeadArgs {
            core,
            registry,
            sessions: Arc::new(DashMap::new()),
            event_seq: watch::channel(0).0,
            health: watch::channel(Health::Healthy).0,
            clock: Arc::new(ManualClock::default()),
            users: admin_users(),
            users_changed: watch::channel(0).0,
            join: format!("xp://127.0.0.1:1?token=t&ca={}", "00".repeat(32))
                .parse()
                .unwrap(),
            metrics: metrics.clone(),
            webhooks: Arc::new(crate::webhooks::WebhookQueue::new(16)),
            commit_batch: crate::DEFAULT_COMMIT_BATCH,
            pulse: crate::health::ActorPulse::new(),
        },
    )
    .await
    .unwrap();
    (actor, metrics)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_whose_caller_gave_up_is_skipped_not_served() {
    let dir = tempfile::tempdir().unwrap();
    let (actor, metrics) = must_spawn_in(dir.path()).await;
    let request = Request::Submit(submission("abandoned", 3));
    let (reply, gone) = ractor::concurrency::oneshot();
    drop(gone);
    let asked = Asked {
        caller: Caller::User {
            name: "root".to_owned(),
            secret_hash: secret_hash(ADMIN_SECRET),
        },
        access: requests::access(&request),
        session: None,
        request,
        reply: reply.into(),
    };
    actor.cast(HeadMsg::Request(asked)).unwrap();
    let (reply, gone) = ractor::concurrency::oneshot();
    drop(gone);
    let read = Read::NodesPage {
        limit: 10,
        cursor: None,
        reply: reply.into(),
    };
    actor.cast(HeadMsg::Read(read)).unwrap();
    // Answered in order after the two: nothing was submitted.
    assert!(status(&actor).await.is_empty());
    let rendered = metrics.render(&xp_head_core::metrics::MetricsSnapshot::default(), false);
    assert!(
        rendered.contains("xp_abandoned_requests_total 2"),
        "{rendered}"
    );
}

/// Reports are computed off the actor and answered when they come back:
/// requests that arrive meanwhile (the same report, an unknown experiment's,
/// other reads) are all answered, and alike.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reports_computed_off_the_actor_answer_everyone_who_asked() {
    let dir = tempfile::tempdir().unwrap();
    let (actor, _) = must_spawn_in(dir.path()).await;
    ask(&actor, Request::Submit(submission("reported", 3)))
        .await
        .unwrap();
    let cluster = || {
        Request::Report(xp_runtime::protocol::ReportRequest {
            experiment: None,
            team: None,
            since_ms: None,
        })
    };
    let unknown = Request::Report(xp_runtime::protocol::ReportRequest {
        experiment: Some("0123456789abcdef".to_owned()),
        team: None,
        since_ms: None,
    });
    let (first, second, third, missing, listed) = tokio::join!(
        ask(&actor, cluster()),
        ask(&actor, cluster()),
        ask(&actor, cluster()),
        ask(&actor, unknown),
        status(&actor),
    );
    let reports: Vec<_> = [first, second, third]
        .into_iter()
        .map(|answer| match answer.unwrap() {
            Response::Report(report) => report,
            other => panic!("not a report: {other:?}"),
        })
        .collect();
    assert_eq!(reports[0].scope, "cluster");
    assert!(reports.iter().all(|report| *report == reports[0]));
    assert_eq!(missing.unwrap_err().code, ErrorCode::NotFound);
    assert_eq!(names(&listed), ["reported"]);
}
