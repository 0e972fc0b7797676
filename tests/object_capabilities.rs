//! Object access by capability against a real head and two nodes: a member of
//! team alpha cannot fetch team beta's checkpoint from either node's object
//! server, with their own session's capability, with one they forged, with
//! one taken from a beta session that ended, or with their trial's after its
//! attempt ended; revoking a user stops their capability within a measured
//! few seconds and frees what they stored beyond their pins; a team over its
//! quota is refused with a message naming the quota; refusals are in `xp
//! audit` and each team's fetches and stores in `/metrics`.

mod common;

use std::io::Write as _;
use std::process::Command;
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use common::{TestCluster, binary, free_tcp_port, http_exchange, wait_until};
use serde_json::Value;
use xp_runtime::ids::ObjectId;
use xp_runtime::join::JoinString;
use xp_runtime::object_wire::{Credential, FetchErrorCode, ObjectClient, ObjectClientError};
use xp_runtime::protocol::{
    CapabilityKey, ObjectCapability, ObjectSource, PeerRole, ReadScope, Request, Response,
};
use xp_runtime::transport::{self, HeadConnection};

/// Alpha may keep 2 MiB on a node, none of it in memory (so what it stores
/// is a file the test can watch); other teams the defaults.
const POLICY: &str = "objects: {teams: {alpha: {memory: 0, disk: 2MiB}}}\n";
/// A beta trial that stores a checkpoint and ends.
const BETA: &str = "name: beta-work\nteam: beta\ntrial:\n  command: [sh, -c, 'echo beta-secret > \"$XP_CHECKPOINT_DIR/model\"; echo \"XP_CHECKPOINT {\\\"step\\\": 1}\"; sleep 1']\n  resources: {cpu: 0.1}\n";
/// How long a capability may keep working after its end, at most.
const FEW_SECONDS: Duration = Duration::from_secs(5);

/// The users: a member of alpha and one of beta.
struct Users {
    alice: String,
    bob: String,
}

/// A cluster of a head (with its HTTP API) and nodes `a` and `b`.
fn must_start() -> (TestCluster, String) {
    let http = format!("127.0.0.1:{}", free_tcp_port());
    let policy_dir = tempfile::tempdir().expect("a temporary directory");
    let policy = policy_dir.path().join("policy.yaml");
    std::fs::write(&policy, POLICY).expect("policy file");
    let policy = policy.to_str().expect("UTF-8").to_owned();
    let mut cluster =
        TestCluster::start_prepared("10s", &["--http", &http, "--policy", &policy], |_| {});
    cluster.start_node("a", 0, 2);
    cluster.start_node("b", 0, 2);
    cluster.wait_for_nodes(2);
    (cluster, http)
}

fn xp_head_user(cluster: &TestCluster, args: &[&str]) -> String {
    let output = Command::new(binary("xp-head"))
        .arg("user")
        .args(args)
        .arg("--data-dir")
        .arg(cluster.head_dir())
        .env("XP_LOG", "warn")
        .output()
        .expect("xp-head runs");
    common::must_succeed(args, output).trim().to_owned()
}

fn must_add_users(cluster: &TestCluster) -> Users {
    let add = |name: &str, team: &str| {
        xp_head_user(cluster, &["add", name, "--team", team, "--role", "member"])
    };
    Users {
        alice: add("alice", "alpha"),
        bob: add("bob", "beta"),
    }
}

/// `xp ARGS` as the holder of `credential`: its stdout.
fn xp_as(credential: &str, args: &[&str]) -> String {
    let output = Command::new(env!("CARGO_BIN_EXE_xp"))
        .args(args)
        .env("XP_CLUSTER", credential)
        .output()
        .expect("xp runs");
    common::must_succeed(args, output)
}

/// The newest checkpoint's first file of `experiment` once `replicas` nodes hold it.
fn must_checkpoint_object(credential: &str, experiment: &str, replicas: usize) -> ObjectId {
    wait_until("a replicated checkpoint", Duration::from_secs(60), || {
        let line = xp_as(credential, &["checkpoints", experiment, "--json"]);
        let newest: Value = serde_json::from_str(line.lines().last()?).ok()?;
        if newest["replicas"].as_array()?.len() < replicas {
            return None;
        }
        newest["files"][0]["object"].as_str()?.parse().ok()
    })
}

/// A connection as `credential` and its session's capability, also naming `objects`.
async fn session(credential: &str, objects: Vec<ObjectId>) -> (HeadConnection, ObjectCapability) {
    let join: JoinString = credential.parse().expect("a join string");
    let (connection, mut send, _recv) = transport::connect(&join, PeerRole::Client, "test")
        .await
        .expect("connects");
    let _ = send.finish();
    let capability = match connection
        .request(Request::ObjectCapability { objects })
        .await
    {
        Ok(Response::ObjectCapability(capability)) => *capability,
        other => panic!("no capability: {other:?}"),
    };
    (connection, capability)
}

async fn locate(connection: &HeadConnection, object: ObjectId) -> Vec<ObjectSource> {
    match connection.request(Request::Locate { object }).await {
        Ok(Response::Located(sources)) => sources,
        other => panic!("not located: {other:?}"),
    }
}

/// Fetches `object` from `source` presenting `capability`.
async fn fetch(
    capability: &ObjectCapability,
    source: &ObjectSource,
    object: ObjectId,
) -> Result<Arc<[u8]>, ObjectClientError> {
    let credential = Credential::Capability(Box::new(capability.clone()));
    let client = ObjectClient::new(credential).expect("a client");
    client.fetch_from(source, object, None, 1 << 20).await
}

/// Fails unless fetching `object` from every one of `sources` with
/// `capability` is refused with `code` and a message holding `words`.
async fn check_refused_everywhere(
    what: &str,
    capability: &ObjectCapability,
    sources: &[ObjectSource],
    object: ObjectId,
    (code, words): (FetchErrorCode, &str),
) {
    assert_eq!(sources.len(), 2, "{what}: on both nodes");
    for source in sources {
        match fetch(capability, source, object).await {
            Err(ObjectClientError::Refused { code: got, message }) => {
                assert_eq!(got, code, "{what} on node {}: {message}", source.node);
                assert!(
                    message.contains(words),
                    "{what}: {words:?} not in {message:?}"
                );
            }
            other => panic!("{what} on node {}: not refused: {other:?}", source.node),
        }
    }
}

/// Says what was measured on the test's stderr (`--nocapture` shows it).
fn measured(what: &str) {
    let _ = writeln!(std::io::stderr(), "MEASURED {what}");
}

/// Polls until fetching `object` from every source with `capability` is
/// refused as revoked; how long that took after `since`.
async fn revoked_after(
    capability: &ObjectCapability,
    sources: &[ObjectSource],
    object: ObjectId,
    since: Instant,
) -> Duration {
    loop {
        let mut refused = 0;
        for source in sources {
            if let Err(ObjectClientError::Refused {
                code: FetchErrorCode::Revoked,
                ..
            }) = fetch(capability, source, object).await
            {
                refused += 1;
            }
        }
        if refused == sources.len() {
            return since.elapsed();
        }
        assert!(since.elapsed() < 4 * FEW_SECONDS, "still not revoked");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[test]
fn capabilities_keep_teams_apart_die_with_their_holder_and_are_counted() {
    let (cluster, http) = must_start();
    let users = must_add_users(&cluster);
    let runtime = tokio::runtime::Runtime::new().expect("a runtime");
    let beta_spec = write(&cluster, "beta.yaml", BETA);
    let beta_experiment = xp_as(&users.bob, &["submit", &beta_spec]).trim().to_owned();
    let beta_object = must_checkpoint_object(&users.bob, &beta_experiment, 2);
    let probe = must_start_alpha_probe(&cluster, &users.alice);
    runtime.block_on(async {
        check_other_team_is_refused(&users, beta_object).await;
        check_forged_capabilities_are_refused(&users, beta_object).await;
        check_another_sessions_capability_dies_with_it(&users, beta_object).await;
        check_attempt_capability_dies_with_it(&cluster, &users, &probe, beta_object).await;
        let alice_driver = must_store_within_the_quota_only(&cluster, &users).await;
        check_revocation_is_measured_and_frees_what_was_stored(&cluster, &users, &probe).await;
        drop(alice_driver);
    });
    check_refusals_are_audited(&cluster, beta_object);
    check_metrics_count_each_team(&cluster, &http);
}

/// Writes `text` to `name` in the cluster's directory; its path.
fn write(cluster: &TestCluster, name: &str, text: &str) -> String {
    let path = cluster.write_file(name, text);
    path.into_os_string().into_string().expect("UTF-8")
}

/// Alpha's probe trial: its experiment, the exchange directory where it left
/// its attempt's capability, the capability and its checkpoint's object.
struct Probe {
    experiment: String,
    exchange: std::path::PathBuf,
    capability: ObjectCapability,
    object: ObjectId,
}

fn must_start_alpha_probe(cluster: &TestCluster, alice: &str) -> Probe {
    use std::os::unix::fs::PermissionsExt;
    let exchange = cluster.dir.path().join("exchange");
    std::fs::create_dir(&exchange).expect("exchange directory");
    // The trial may run under a user id of its own.
    std::fs::set_permissions(&exchange, std::fs::Permissions::from_mode(0o777)).expect("chmod");
    let spec = format!(
        "name: alpha-probe\nteam: alpha\ntrial:\n  command: [{}, {}]\n  resources: {{cpu: 0.1}}\n",
        binary("examples/object_probe").display(),
        exchange.display()
    );
    let spec = write(cluster, "probe.yaml", &spec);
    let experiment = xp_as(alice, &["submit", &spec]).trim().to_owned();
    let capability: ObjectCapability =
        wait_until("the probe's capability", Duration::from_secs(60), || {
            let text = std::fs::read_to_string(exchange.join("capability.json")).ok()?;
            serde_json::from_str(&text).ok()
        });
    let object = must_checkpoint_object(alice, &experiment, 2);
    Probe {
        experiment,
        exchange,
        capability,
        object,
    }
}

/// Alice's own session's capability, and one asking for beta's checkpoint by
/// id, fetch it from neither node, nor does the SDK's get.
async fn check_other_team_is_refused(users: &Users, beta_object: ObjectId) {
    let (connection, capability) = session(&users.alice, vec![beta_object]).await;
    assert!(
        !capability
            .grant
            .read
            .contains(&ReadScope::Object(beta_object)),
        "the head granted beta's checkpoint to alpha: {capability:?}"
    );
    let sources = locate(&connection, beta_object).await;
    let forbidden = (FetchErrorCode::Forbidden, "does not cover object");
    check_refused_everywhere(
        "alpha's session",
        &capability,
        &sources,
        beta_object,
        forbidden,
    )
    .await;
    let client = xp::Client::connect(&users.alice).await.expect("connects");
    let error = client.get(beta_object).await.expect_err("refused");
    assert!(error.to_string().contains("Forbidden"), "{error}");
    client.close().await;
    connection.close().await;
}

/// A capability widened by hand, or signed with a guessed key, is refused by
/// both nodes as forged.
async fn check_forged_capabilities_are_refused(users: &Users, beta_object: ObjectId) {
    let (connection, capability) = session(&users.alice, Vec::new()).await;
    let sources = locate(&connection, beta_object).await;
    let forged = (FetchErrorCode::BadCredential, "signature");
    let mut widened = capability.clone();
    widened.grant.read.push(ReadScope::Object(beta_object));
    check_refused_everywhere(
        "a widened capability",
        &widened,
        &sources,
        beta_object,
        forged,
    )
    .await;
    let guessed = ObjectCapability::issue(&CapabilityKey::derive("guess"), widened.grant);
    check_refused_everywhere("a guessed key", &guessed, &sources, beta_object, forged).await;
    connection.close().await;
}

/// Bob's session fetches beta's checkpoint; once his connection ends, what
/// alice took of his capability is refused within a few seconds.
async fn check_another_sessions_capability_dies_with_it(users: &Users, beta_object: ObjectId) {
    let (connection, taken) = session(&users.bob, vec![beta_object]).await;
    let sources = locate(&connection, beta_object).await;
    for source in &sources {
        let bytes = fetch(&taken, source, beta_object).await.expect("bob's own");
        assert_eq!(&*bytes, b"beta-secret\n");
    }
    connection.close().await;
    let ended = Instant::now();
    let took = revoked_after(&taken, &sources, beta_object, ended).await;
    measured(&format!(
        "a session's capability refused {took:?} after its connection closed"
    ));
    assert!(took < FEW_SECONDS, "{took:?}");
}

/// The probe's attempt capability fetches its own checkpoint while the
/// attempt lives, never beta's, and nothing once the attempt ended.
async fn check_attempt_capability_dies_with_it(
    cluster: &TestCluster,
    users: &Users,
    probe: &Probe,
    beta_object: ObjectId,
) {
    let (connection, _) = session(&users.alice, Vec::new()).await;
    let own = locate(&connection, probe.object).await;
    let theirs = locate(&connection, beta_object).await;
    for source in &own {
        let bytes = fetch(&probe.capability, source, probe.object).await;
        assert_eq!(&*bytes.expect("its own"), b"the probe's own checkpoint");
    }
    let forbidden = (FetchErrorCode::Forbidden, "does not cover object");
    check_refused_everywhere(
        "the attempt's",
        &probe.capability,
        &theirs,
        beta_object,
        forbidden,
    )
    .await;
    std::fs::write(probe.exchange.join("done"), "").expect("signal the probe");
    let status = cluster.wait_finished(&probe.experiment, Duration::from_secs(60));
    assert_eq!(status["state"], "succeeded", "{status:#}");
    let took = revoked_after(&probe.capability, &own, probe.object, Instant::now()).await;
    measured(&format!(
        "an attempt's capability refused within {took:?} of its end being seen"
    ));
    connection.close().await;
}

/// Alpha's 2 MiB quota refuses a 3 MiB store naming the quota, and takes
/// 1 MiB (on disk: its memory quota is 0); beta stores 3 MiB under the
/// default quota. Alice's driver, which keeps the 1 MiB object.
async fn must_store_within_the_quota_only(cluster: &TestCluster, users: &Users) -> xp::Client {
    let big = vec![7u8; 3 << 20];
    let alice = xp::Client::connect(&users.alice).await.expect("connects");
    let error = alice.put(&big).await.expect_err("over alpha's quota");
    let message = error.to_string();
    assert!(
        message.contains("OverQuota")
            && message.contains("team alpha")
            && message.contains("2097152-byte disk quota (objects.disk)"),
        "{message}"
    );
    let stored = alice
        .put(&vec![8u8; 1 << 20])
        .await
        .expect("within the quota");
    let on_disk = |node: &str| {
        cluster
            .node_dir(node)
            .join("objects")
            .join(stored.to_string())
    };
    assert!(
        on_disk("a").exists() || on_disk("b").exists(),
        "alpha's memory quota is 0"
    );
    let bob = xp::Client::connect(&users.bob).await.expect("connects");
    bob.put(&big).await.expect("beta's quota is the default");
    bob.close().await;
    // Alice's connection stays open: what it stored is freed by her revocation.
    alice
}

/// After `xp-head user revoke alice`, her capability (which reads alpha's
/// pinned checkpoint) is refused on both nodes within a few seconds, measured;
/// the object her driver stored goes, the pinned checkpoint stays.
async fn check_revocation_is_measured_and_frees_what_was_stored(
    cluster: &TestCluster,
    users: &Users,
    probe: &Probe,
) {
    let (connection, capability) = session(&users.alice, vec![probe.object]).await;
    let sources = locate(&connection, probe.object).await;
    for source in &sources {
        fetch(&capability, source, probe.object)
            .await
            .expect("alpha's checkpoint, granted by id");
    }
    let stored = ObjectId::of(&vec![8u8; 1 << 20]).to_string();
    let revoked_at = Instant::now();
    xp_head_user(cluster, &["revoke", "alice"]);
    let took = revoked_after(&capability, &sources, probe.object, revoked_at).await;
    measured(&format!(
        "revocation: alice's capability refused on both nodes {took:?} after `xp-head user revoke` began"
    ));
    assert!(took < FEW_SECONDS, "{took:?}");
    let held_by = |object: &str| {
        ["a", "b"]
            .into_iter()
            .filter(|node| cluster.node_dir(node).join("objects").join(object).exists())
            .count()
    };
    wait_until("alice's stored object to be freed", FEW_SECONDS, || {
        (held_by(&stored) == 0).then_some(())
    });
    assert_eq!(held_by(&probe.object.to_string()), 2, "the pins stay");
}

/// The refusals are in the audit trail under the user their capability named.
fn check_refusals_are_audited(cluster: &TestCluster, beta_object: ObjectId) {
    let fetch = format!("fetch object {beta_object} on node");
    let entries = wait_until("the refusals in the audit trail", FEW_SECONDS, || {
        let entries: Vec<Value> = cluster
            .must_xp(&["audit", "--json", "--limit", "1000"])
            .lines()
            .filter_map(|line| serde_json::from_str(line).ok())
            .filter(|entry: &Value| entry["allowed"] == false)
            .collect();
        let has = |who: &str, action: &str, detail: &str| {
            entries.iter().any(|entry| {
                entry["who"]
                    .as_str()
                    .is_some_and(|text| text.starts_with(who))
                    && entry["action"]
                        .as_str()
                        .is_some_and(|text| text.contains(action))
                    && entry["detail"]
                        .as_str()
                        .is_some_and(|text| text.contains(detail))
            })
        };
        (has("alice", &fetch, "does not cover")
            && has("alice (unverified claim)", &fetch, "signature")
            && has("bob", &fetch, "revoked")
            && has("alice", "store an object of 3145728 bytes", "quota"))
        .then_some(entries)
    });
    assert!(entries.len() >= 4, "{entries:?}");
}

/// `/metrics` counts each team's fetches, stores and refusals.
fn check_metrics_count_each_team(cluster: &TestCluster, http: &str) {
    let admin: JoinString = cluster.join.parse().expect("the admin's join string");
    let bearer = format!("Bearer {}", admin.token);
    let sample = |text: &str, series: &str| -> f64 {
        text.lines()
            .find_map(|line| line.strip_prefix(series)?.strip_prefix(' '))
            .and_then(|value| value.parse().ok())
            .unwrap_or(0.0)
    };
    wait_until("per-team object counts in /metrics", FEW_SECONDS, || {
        let (status, _, text) =
            http_exchange(http, "GET", "/metrics", &[("Authorization", &bearer)], "");
        (status == 200
            && sample(&text, "xp_object_fetches_total{team=\"beta\"}") >= 2.0
            && sample(&text, "xp_object_fetched_bytes_total{team=\"beta\"}") >= 24.0
            && sample(&text, "xp_object_stores_total{team=\"beta\"}") >= 1.0
            && sample(&text, "xp_object_stored_bytes_total{team=\"alpha\"}")
                >= f64::from(1u32 << 20)
            && sample(&text, "xp_object_refusals_total{team=\"alpha\"}") >= 2.0)
            .then_some(())
    });
}
