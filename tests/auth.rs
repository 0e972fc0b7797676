//! Users, teams and roles against a real head and node: what each role may do
//! and is refused (with the refusal in the audit trail under the authenticated
//! user), a revoked user cut off on an open connection and in a running `xp
//! logs --follow`, a node credential that cannot act as a user and a user
//! credential that cannot register a node, user commands on a stopped head's
//! database, and secrets in no command line nor log.

mod common;

use std::process::{Command, Stdio};
use std::time::Duration;

use common::{TestCluster, binary, http_exchange as http, trials, wait_until};
use xp::Client;
use xp_runtime::join::JoinString;
use xp_runtime::protocol::{ErrorCode, PeerRole, Request, SubmitRequest};
use xp_runtime::transport::TransportError;
use xp_sdk::SdkError;

/// A long-running trial that prints a line every half second.
const TICKING: &str = "name: ticking\ntrial:\n  command: [sh, -c, 'while true; do echo tick; sleep 0.5; done']\n  resources: {cpu: 0.1}\n";

/// Runs `xp-head user ARGS --data-dir HEAD_DIR`; its stdout, or a panic with stderr.
fn xp_head_user(cluster: &TestCluster, args: &[&str]) -> String {
    let output = xp_head_user_output(cluster, args);
    assert!(
        output.status.success(),
        "xp-head user {args:?} failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8(output.stdout).expect("text")
}

fn xp_head_user_output(cluster: &TestCluster, args: &[&str]) -> std::process::Output {
    Command::new(binary("xp-head"))
        .arg("user")
        .args(args)
        .arg("--data-dir")
        .arg(cluster.head_dir())
        .env("XP_LOG", "warn")
        .output()
        .expect("xp-head runs")
}

/// Adds a user and returns their credential (the one line `user add` prints).
fn add_user(cluster: &TestCluster, name: &str, team: &str, role: &str) -> String {
    let printed = xp_head_user(cluster, &["add", name, "--team", team, "--role", role]);
    let credential = printed.trim().to_owned();
    assert!(credential.starts_with("xp://"), "{printed}");
    assert_eq!(printed.lines().count(), 1, "{printed}");
    credential
}

/// Runs `xp ARGS` as the holder of `credential`.
fn xp_as(credential: &str, args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_xp"))
        .args(args)
        .env("XP_CLUSTER", credential)
        .output()
        .expect("xp runs")
}

fn stderr_of(output: &std::process::Output) -> String {
    String::from_utf8_lossy(&output.stderr).into_owned()
}

fn must(args: &[&str], output: std::process::Output) -> String {
    common::must_succeed(args, output)
}

/// Fails unless `output` failed with a refusal containing each of `words`.
fn refused(what: &str, output: &std::process::Output, words: &[&str]) {
    assert!(!output.status.success(), "{what} was allowed");
    let stderr = stderr_of(output);
    for word in words {
        assert!(stderr.contains(word), "{what}: {word:?} not in: {stderr}");
    }
}

/// The audit trail as JSON lines, read with the admin's credential.
fn audit(cluster: &TestCluster) -> Vec<serde_json::Value> {
    cluster
        .must_xp(&["audit", "--json", "--limit", "1000"])
        .lines()
        .map(|line| serde_json::from_str(line).expect("JSON"))
        .collect()
}

fn submit_spec(spec: &xp_runtime::spec::ExperimentSpec) -> Request {
    Request::Submit(SubmitRequest {
        spec_json: spec.to_canonical_json(),
        program: None,
        code_version: "none".to_owned(),
        data_version: "none".to_owned(),
        rerun: false,
    })
}

/// The users of the roles test: a viewer and a member of team alpha, a member
/// of team beta.
struct Users {
    viewer: String,
    alpha: String,
    beta: String,
}

impl Users {
    /// Every user credential of the test and the admin's and node's, with
    /// `more` (a replaced credential).
    fn secrets<'a>(&'a self, cluster: &'a TestCluster, more: &[&'a str]) -> Vec<&'a str> {
        let mut all = vec![
            self.viewer.as_str(),
            self.alpha.as_str(),
            self.beta.as_str(),
        ];
        all.extend_from_slice(more);
        all.extend([cluster.join.as_str(), cluster.node_join.as_str()]);
        all
    }
}

#[test]
fn roles_teams_revocation_and_credentials_of_the_wrong_kind() {
    let mut cluster = TestCluster::start("10s");
    cluster.start_node("a", 0, 2);
    cluster.wait_for_nodes(1);
    let ticking = cluster.write_file("ticking.yaml", TICKING);
    let ticking = ticking.to_str().unwrap();
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let users = must_add_users(&cluster);

    check_viewer_reads_but_cannot_submit(&users.viewer, ticking);
    let beta_experiment = must_submit_into_own_team(&users.beta, ticking);
    check_other_team_is_out_of_reach(&runtime, &users.alpha, &beta_experiment);
    check_member_and_team_admin_rights(&cluster, &users.alpha, ticking);
    check_admin_acts_as_itself(&cluster, &runtime, &beta_experiment);
    check_audit_trail(&cluster, &users.beta, &beta_experiment);
    cluster.must_xp(&["cancel", &beta_experiment]);
    check_credentials_of_the_wrong_kind(&cluster, &runtime, &users.beta, ticking);

    // Revocation: an open connection's next request fails, a follow ends.
    let running = must(
        &["submit"],
        xp_as(&users.beta, &["submit", ticking, "--rerun"]),
    )
    .trim()
    .to_owned();
    let trial = must_wait_running_trial(&cluster, &running);
    let mut follower = must_follow_logs(&users.beta, &trial);
    check_no_secret_in_command_lines(&users.secrets(&cluster, &[]));
    check_revocation_closes_the_connection(&cluster, &runtime, &users.beta, &running);
    check_revoked_follow_ends(&mut follower);
    let again = check_replaced_credential_works_again(&cluster, &users.beta);
    check_no_secret_in_logs(&cluster, &users.secrets(&cluster, &[again.as_str()]));
    cluster.must_xp(&["cancel", &running]);
}

/// Adds the three users, checks `user list` shows them without secrets and
/// that a name cannot be added twice.
fn must_add_users(cluster: &TestCluster) -> Users {
    let users = Users {
        viewer: add_user(cluster, "vera", "alpha", "viewer"),
        alpha: add_user(cluster, "alma", "alpha", "member"),
        beta: add_user(cluster, "bert", "beta", "member"),
    };
    let listed = xp_head_user(cluster, &["list"]);
    for name in ["admin", "vera", "alma", "bert"] {
        assert!(listed.contains(name), "{listed}");
    }
    assert!(!listed.contains("token="), "{listed}");
    let taken = xp_head_user_output(cluster, &["add", "alma", "--team", "alpha"]);
    refused("adding a name twice", &taken, &["exists already"]);
    users
}

/// A viewer reads but cannot submit; the refusal names the role that would allow it.
fn check_viewer_reads_but_cannot_submit(viewer: &str, ticking: &str) {
    must(&["nodes"], xp_as(viewer, &["nodes"]));
    refused(
        "a viewer's submission",
        &xp_as(viewer, &["submit", ticking]),
        &["vera", "may not submit", "needs role member"],
    );
}

/// A member's spec that names no team goes into their team; the experiment.
fn must_submit_into_own_team(beta: &str, ticking: &str) -> String {
    let beta_experiment = must(&["submit"], xp_as(beta, &["submit", ticking]))
        .trim()
        .to_owned();
    let status: serde_json::Value = serde_json::from_str(
        must(
            &["status"],
            xp_as(beta, &["status", &beta_experiment, "--json"]),
        )
        .trim(),
    )
    .unwrap();
    assert_eq!(status["team"], "beta", "{status:#}");
    beta_experiment
}

/// Team alpha's member cannot touch team beta's work, nor even read or list
/// it: its exact ids answer as ids nobody holds do.
fn check_other_team_is_out_of_reach(
    runtime: &tokio::runtime::Runtime,
    alpha: &str,
    beta_experiment: &str,
) {
    // An id of the same shape that nobody holds.
    let flipped = if beta_experiment.starts_with('0') {
        "1"
    } else {
        "0"
    };
    let unknown = format!("{flipped}{}", &beta_experiment[1..]);
    for (what, args) in [
        ("cancel", vec!["cancel", "ID"]),
        ("trial cancel", vec!["cancel", "ID-t0"]),
        ("hold", vec!["admin", "hold", "ID"]),
        ("priority", vec!["admin", "priority", "ID", "9"]),
        ("status", vec!["status", "ID"]),
        ("metrics", vec!["metrics", "ID-t0"]),
    ] {
        let answer = |id: &str| {
            let args: Vec<String> = args.iter().map(|arg| arg.replace("ID", id)).collect();
            let args: Vec<&str> = args.iter().map(String::as_str).collect();
            let output = xp_as(alpha, &args);
            assert!(
                !output.status.success(),
                "alpha's {what} of {id} was allowed"
            );
            stderr_of(&output).replace(id, "ID")
        };
        let theirs = answer(beta_experiment);
        assert_eq!(
            theirs,
            answer(&unknown),
            "alpha's {what} of beta's experiment answers as an unknown id"
        );
        assert!(
            theirs.contains("no ") && !theirs.contains("beta") && !theirs.contains("may not"),
            "alpha's {what}: {theirs}"
        );
    }
    // Nor list it: alpha's list has none of beta's experiments.
    runtime.block_on(async {
        let client = Client::connect(alpha).await.unwrap();
        assert!(client.status(None).await.unwrap().is_empty());
        client.close().await;
    });
}

/// A member may hold and release its own team's work but not reprioritise it:
/// a team admin may.
fn check_member_and_team_admin_rights(cluster: &TestCluster, alpha: &str, ticking: &str) {
    let own = must(&["submit"], xp_as(alpha, &["submit", ticking]))
        .trim()
        .to_owned();
    refused(
        "a member's priority",
        &xp_as(alpha, &["admin", "priority", &own, "3"]),
        &["needs role team-admin"],
    );
    must(&["hold"], xp_as(alpha, &["admin", "hold", &own]));
    must(&["release"], xp_as(alpha, &["admin", "release", &own]));
    xp_head_user(cluster, &["role", "alma", "team-admin"]);
    must(
        &["priority"],
        xp_as(alpha, &["admin", "priority", &own, "3"]),
    );
    must(&["cancel"], xp_as(alpha, &["cancel", &own]));
}

/// The admin can act on another team's work, and is recorded as who they are,
/// whatever $USER says: the trial events name the authenticated admin.
fn check_admin_acts_as_itself(
    cluster: &TestCluster,
    runtime: &tokio::runtime::Runtime,
    beta_experiment: &str,
) {
    let held = Command::new(env!("CARGO_BIN_EXE_xp"))
        .args(["admin", "--why", "test", "hold", beta_experiment])
        .env("XP_CLUSTER", &cluster.join)
        .env("USER", "mallory")
        .output()
        .unwrap();
    must(&["admin hold"], held);
    cluster.must_xp(&["admin", "priority", beta_experiment, "7"]);
    let reasons: Vec<String> = runtime.block_on(async {
        let client = Client::connect(&cluster.join).await.unwrap();
        let experiment = beta_experiment.parse().unwrap();
        let events = client.events(experiment, 0, Duration::ZERO).await.unwrap();
        client.close().await;
        events.into_iter().map(|event| event.reason).collect()
    });
    assert!(
        reasons
            .iter()
            .any(|reason| reason.starts_with("admin admin: held (test)")),
        "{reasons:#?}"
    );
    assert!(
        reasons.iter().all(|reason| !reason.contains("mallory")),
        "{reasons:#?}"
    );
}

/// The audit trail holds alma's refusals, the admin's hold (under its own
/// name), the user commands; only an admin reads it. Alma's tries at beta's
/// ids are not there: they were answered as unknown ids, which are not audited.
fn check_audit_trail(cluster: &TestCluster, beta: &str, beta_experiment: &str) {
    let entries = audit(cluster);
    let refusals: Vec<&serde_json::Value> = entries
        .iter()
        .filter(|entry| entry["allowed"] == false && entry["who"] == "alma")
        .collect();
    assert!(
        refusals.iter().any(|entry| entry["action"]
            .as_str()
            .unwrap()
            .starts_with("reprioritise")),
        "{refusals:#?}"
    );
    assert!(
        refusals
            .iter()
            .all(|entry| !entry.to_string().contains(beta_experiment)),
        "{refusals:#?}"
    );
    assert!(
        entries.iter().any(|entry| entry["allowed"] == true
            && entry["who"] == "admin"
            && entry["action"].as_str().unwrap().starts_with("hold")),
        "{entries:#?}"
    );
    assert!(entries.iter().all(|entry| entry["who"] != "mallory"));
    assert!(
        entries
            .iter()
            .any(|entry| entry["action"].as_str().unwrap().contains("user add vera")),
        "{entries:#?}"
    );
    refused(
        "a member's audit read",
        &xp_as(beta, &["audit"]),
        &["needs role admin"],
    );
}

/// A node credential cannot act as a user (through `xp`, or on a node's own
/// connection), nor a user credential register a node.
fn check_credentials_of_the_wrong_kind(
    cluster: &TestCluster,
    runtime: &tokio::runtime::Runtime,
    beta: &str,
    ticking: &str,
) {
    refused(
        "the node credential as a client",
        &xp_as(&cluster.node_join, &["submit", ticking]),
        &["node credential", "xp-head user add"],
    );
    let node_join: JoinString = cluster.node_join.parse().unwrap();
    runtime.block_on(async {
        // On a node's own connection, a submission is refused by role.
        let (connection, _send, _recv) =
            xp_runtime::transport::connect(&node_join, PeerRole::Node, "auth-test")
                .await
                .unwrap();
        let spec = xp_runtime::spec::ExperimentSpec::from_yaml(TICKING).unwrap();
        match connection.request(submit_spec(&spec)).await {
            Err(TransportError::Remote(error)) => {
                assert_eq!(error.code, ErrorCode::Forbidden, "{error:?}");
                assert!(
                    error.message.contains("needs a user credential"),
                    "{error:?}"
                );
            }
            other => panic!("a node's submission was not refused: {other:?}"),
        }
        connection.close().await;
    });
    let as_node = Command::new(binary("xp-node"))
        .args(["join", "--data-dir"])
        .arg(cluster.dir.path().join("node-as-user"))
        .env("XP_JOIN", beta)
        .env("XP_LOG", "info")
        .output()
        .unwrap();
    refused(
        "a user credential registering a node",
        &as_node,
        &["this is a user credential; nodes join with the node credential printed as `node:`"],
    );
    assert_eq!(
        cluster.must_xp(&["nodes", "--json"]).lines().count(),
        1,
        "no second node registered"
    );
}

/// Waits until the experiment's first trial runs; its id.
fn must_wait_running_trial(cluster: &TestCluster, experiment: &str) -> String {
    wait_until("beta's trial to run", Duration::from_secs(60), || {
        let status = cluster.status(experiment);
        let trial = trials(&status).first()?.clone();
        (trial["state"] == "running").then(|| trial["id"].as_str().unwrap().to_owned())
    })
}

/// Starts `xp logs TRIAL --follow` as the holder of `credential`, and waits
/// until it prints: it is following.
fn must_follow_logs(credential: &str, trial: &str) -> std::process::Child {
    let mut follower = Command::new(env!("CARGO_BIN_EXE_xp"))
        .args(["logs", trial, "--follow"])
        .env("XP_CLUSTER", credential)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut follower_out = follower.stdout.take().unwrap();
    let (first_sender, first) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        use std::io::Read;
        let mut byte = [0u8; 4];
        let _ = first_sender.send(follower_out.read_exact(&mut byte).map(|()| byte));
        // Keeps reading: a closed pipe would end the follow (quietly, as
        // `xp logs | head` does) before the revocation could.
        let _ = std::io::copy(&mut follower_out, &mut std::io::sink());
    });
    assert_eq!(&first.recv().unwrap().unwrap(), b"tick");
    follower
}

/// Secrets travel in the environment, never in a command line.
fn check_no_secret_in_command_lines(credentials: &[&str]) {
    for pid in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(cmdline) = std::fs::read(pid.path().join("cmdline")) else {
            continue;
        };
        let cmdline = String::from_utf8_lossy(&cmdline).into_owned();
        for credential in credentials {
            let secret: JoinString = credential.parse().unwrap();
            assert!(!cmdline.contains(&secret.token), "a secret in {cmdline:?}");
        }
    }
}

/// Revokes bert while a wait of his is in flight: the head closes the
/// connection with the reason, and the next request fails.
fn check_revocation_closes_the_connection(
    cluster: &TestCluster,
    runtime: &tokio::runtime::Runtime,
    beta: &str,
    running: &str,
) {
    runtime.block_on(async {
        let client = Client::connect(beta).await.unwrap();
        assert_eq!(client.status(None).await.unwrap().len(), 2);
        // A wait in flight (no event ever follows u64::MAX, so only its 30 s
        // cap would end it) is ended by the head closing the connection, with
        // the close's reason: not by a refusal of the next request.
        let experiment: xp_runtime::ids::ExperimentId = running.parse().unwrap();
        let (waited, _) = tokio::join!(
            client.events(experiment, u64::MAX, Duration::from_secs(30)),
            async {
                // Gives the wait time to reach the head; were it late, the
                // connection would be closed by then all the same.
                tokio::time::sleep(Duration::from_secs(1)).await;
                xp_head_user(cluster, &["revoke", "bert"])
            }
        );
        let closed = error_text(&waited.expect_err("the wait outlived the revocation"));
        assert!(
            closed.contains("credential of user bert was revoked; ask an admin"),
            "{closed}"
        );
        let error = wait_for_refusal(&client).await;
        assert!(error.contains("revoked"), "{error}");
    });
}

/// The revoked user's `xp logs --follow` ends with a failure that says so.
fn check_revoked_follow_ends(follower: &mut std::process::Child) {
    let ended = wait_until("the follow to end", Duration::from_secs(30), || {
        follower.try_wait().unwrap()
    });
    assert!(!ended.success(), "a revoked follow ended with success");
    let mut follower_err = String::new();
    std::io::Read::read_to_string(&mut follower.stderr.take().unwrap(), &mut follower_err).unwrap();
    assert!(follower_err.contains("revoked"), "{follower_err}");
}

/// The revoked credential is refused; a replaced one works again while the
/// revoked one stays out. The new credential.
fn check_replaced_credential_works_again(cluster: &TestCluster, beta: &str) -> String {
    refused(
        "a revoked credential",
        &xp_as(beta, &["nodes"]),
        &["revoked"],
    );
    let again = xp_head_user(cluster, &["add", "bert", "--team", "beta", "--replace"]);
    must(&["nodes"], xp_as(again.trim(), &["nodes"]));
    refused(
        "the old credential",
        &xp_as(beta, &["nodes"]),
        &["wrong token"],
    );
    again.trim().to_owned()
}

/// No log line holds a secret: neither the head's and nodes' logs (stderr)
/// nor what they printed on stdout (the head's after its credentials), all of
/// which the harness keeps.
fn check_no_secret_in_logs(cluster: &TestCluster, credentials: &[&str]) {
    let mut kept = 0;
    for entry in std::fs::read_dir(cluster.dir.path()).unwrap().flatten() {
        if entry
            .path()
            .extension()
            .is_some_and(|ext| ext == "log" || ext == "stdout")
        {
            kept += 1;
            let text = std::fs::read_to_string(entry.path()).unwrap();
            for credential in credentials {
                let secret: JoinString = credential.parse().unwrap();
                assert!(
                    !text.contains(&secret.token),
                    "{} logs a secret",
                    entry.path().display()
                );
            }
        }
    }
    // The head's and each node's stderr and stdout.
    assert!(kept >= 4, "only {kept} captures kept");
}

/// Polls with `client` until a request fails (the revocation reached the
/// connection); the error's text.
async fn wait_for_refusal(client: &Client) -> String {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        match client.nodes().await {
            Err(error) => return error_text(&error),
            Ok(_) => {
                assert!(
                    tokio::time::Instant::now() < deadline,
                    "the revoked connection still answers"
                );
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    }
}

fn error_text(error: &SdkError) -> String {
    xp_runtime::error_chain::error_chain(error)
}

#[test]
fn user_commands_work_on_a_stopped_heads_database_and_the_admin_survives_restarts() {
    let mut cluster = TestCluster::start("10s");
    let admin = cluster.join.clone();
    cluster.kill_head();
    // The head is down: the command opens its database itself.
    let credential = add_user(&cluster, "offline", "gamma", "viewer");
    cluster.restart_head();
    // The restart printed no new admin credential: the first one still works.
    assert_eq!(cluster.join, admin);
    cluster.must_xp(&["nodes"]);
    must(&["nodes"], xp_as(&credential, &["nodes"]));
    let entries = audit(&cluster);
    assert!(
        entries.iter().any(|entry| entry["action"]
            .as_str()
            .unwrap()
            .contains("user add offline")),
        "{entries:#?}"
    );
}

/// The experiment ids a JSON page of `/api/experiments` lists.
fn listed_ids(body: &str) -> Vec<String> {
    let page: serde_json::Value =
        serde_json::from_str(body).unwrap_or_else(|error| panic!("{error}: {body}"));
    page["items"]
        .as_array()
        .expect("items")
        .iter()
        .map(|item| item["id"].as_str().expect("an id").to_owned())
        .collect()
}

#[test]
fn the_http_api_needs_a_credential_and_shows_each_user_their_team() {
    let http_addr = format!("127.0.0.1:{}", common::free_tcp_port());
    let cluster = TestCluster::start_prepared("10s", &["--http", &http_addr], |_| {});
    wait_until("the HTTP API", Duration::from_secs(30), || {
        common::http_get(&http_addr, "/healthz").filter(|(status, _)| *status == 200)
    });
    let alpha = add_user(&cluster, "alma", "alpha", "viewer");
    let beta = add_user(&cluster, "bert", "beta", "member");
    let spec = cluster.write_file("ticking.yaml", TICKING);
    let beta_experiment = must(
        &["submit"],
        xp_as(&beta, &["submit", spec.to_str().unwrap()]),
    )
    .trim()
    .to_owned();
    check_no_credential_no_answer(&http_addr, &beta_experiment);
    check_each_user_sees_their_team(&http_addr, &cluster, &alpha, &beta, &beta_experiment);
    let cookie = check_login_sets_a_cookie(&http_addr, &alpha);
    check_login_form(&http_addr, &beta);
    check_login_from_another_site_refused(&http_addr, &beta);
    // A revoked user's cookie stops working at once.
    xp_head_user(&cluster, &["revoke", "alma"]);
    let (status, _, body) = http(&http_addr, "GET", "/api/nodes", &[("Cookie", &cookie)], "");
    assert_eq!(status, 401, "{body}");
    assert!(body.contains("revoked"), "{body}");
    let (status, head, _) = http(&http_addr, "GET", "/", &[("Cookie", &cookie)], "");
    assert_eq!((status, head.contains("location: /login")), (303, true));
}

/// The secret of a credential.
fn secret(credential: &str) -> String {
    credential.parse::<JoinString>().unwrap().token
}

/// The `Authorization` header value of a credential.
fn bearer(credential: &str) -> String {
    format!("Bearer {}", secret(credential))
}

/// No credential: 401 everywhere but /healthz; a wrong one too.
fn check_no_credential_no_answer(http_addr: &str, beta_experiment: &str) {
    let (status, head, body) = http(http_addr, "GET", "/api/experiments", &[], "");
    assert_eq!(status, 401, "{body}");
    assert!(head.contains("www-authenticate: bearer"), "{head}");
    assert!(body.contains("log in at /login"), "{body}");
    for path in [
        "/api/nodes",
        "/api/queues",
        &format!("/api/experiments/{beta_experiment}"),
    ] {
        assert_eq!(http(http_addr, "GET", path, &[], "").0, 401, "{path}");
    }
    let wrong = format!("Bearer {}", "00".repeat(32));
    let (status, _, body) = http(
        http_addr,
        "GET",
        "/api/nodes",
        &[("Authorization", &wrong)],
        "",
    );
    assert_eq!(status, 401, "{body}");
    assert!(body.contains("wrong token"), "{body}");
}

/// Each user sees their team's experiments; the admin sees all.
fn check_each_user_sees_their_team(
    http_addr: &str,
    cluster: &TestCluster,
    alpha: &str,
    beta: &str,
    beta_experiment: &str,
) {
    let (status, _, body) = http(
        http_addr,
        "GET",
        "/api/experiments",
        &[("Authorization", &bearer(beta))],
        "",
    );
    assert_eq!(status, 200, "{body}");
    assert_eq!(listed_ids(&body), [beta_experiment]);
    let (status, _, body) = http(
        http_addr,
        "GET",
        "/api/experiments",
        &[("Authorization", &bearer(alpha))],
        "",
    );
    assert_eq!(status, 200, "{body}");
    assert!(listed_ids(&body).is_empty(), "{body}");
    let (status, _, _) = http(
        http_addr,
        "GET",
        &format!("/api/experiments/{beta_experiment}"),
        &[("Authorization", &bearer(alpha))],
        "",
    );
    assert_eq!(status, 404, "another team's experiment is not shown");
    let (status, _, body) = http(
        http_addr,
        "GET",
        "/api/experiments",
        &[("Authorization", &bearer(&cluster.join))],
        "",
    );
    assert_eq!(status, 200);
    assert_eq!(listed_ids(&body), [beta_experiment]);
}

/// The login page, and `/login?token=` setting an HttpOnly, SameSite=Strict
/// cookie that the dashboard and the API accept; the cookie.
fn check_login_sets_a_cookie(http_addr: &str, alpha: &str) -> String {
    let (status, head, body) = http(http_addr, "GET", "/login", &[], "");
    assert_eq!(status, 200);
    assert!(head.contains("cache-control: no-store\r\n"), "{head}");
    assert!(
        body.contains("<form method=\"post\" action=\"/login\">"),
        "{body}"
    );
    let (status, head, _) = http(
        http_addr,
        "GET",
        &format!("/login?token={}", secret(alpha)),
        &[],
        "",
    );
    assert_eq!(status, 303, "{head}");
    assert!(head.contains("location: /\r\n"), "{head}");
    assert!(
        head.contains("httponly") && head.contains("samesite=strict"),
        "{head}"
    );
    // The secret in that URL is kept out of caches and Referer headers, and
    // the cookie expires.
    assert!(
        head.contains("cache-control: no-store\r\n")
            && head.contains("referrer-policy: no-referrer\r\n")
            && head.contains("max-age=604800"),
        "{head}"
    );
    let cookie = format!("xp_session={}", secret(alpha));
    // The dashboard's page, and who it says is logged in.
    let (status, _, body) = http(http_addr, "GET", "/", &[("Cookie", &cookie)], "");
    assert_eq!(status, 200, "{body}");
    let (status, _, body) = http(http_addr, "GET", "/api/whoami", &[("Cookie", &cookie)], "");
    assert_eq!(status, 200);
    assert!(body.contains("user alma (viewer of team alpha)"), "{body}");
    assert_eq!(
        http(http_addr, "GET", "/api/nodes", &[("Cookie", &cookie)], "").0,
        200
    );
    cookie
}

/// A login another site's page asks for (login CSRF: it would log the victim
/// in as the attacker) is refused and sets no cookie, whether the form is
/// posted or `/login?token=` opened; the head's own page and a typed address
/// log in, and so does a client that is no browser.
fn check_login_from_another_site_refused(http_addr: &str, beta: &str) {
    let form = format!("token={}", secret(beta));
    let own_origin = format!("http://{http_addr}");
    let form_type = ("Content-Type", "application/x-www-form-urlencoded");
    for (headers, status) in [
        (vec![form_type, ("Sec-Fetch-Site", "cross-site")], 403),
        (vec![form_type, ("Origin", "http://evil.example")], 403),
        (
            vec![
                form_type,
                ("Sec-Fetch-Site", "same-origin"),
                ("Origin", own_origin.as_str()),
            ],
            303,
        ),
        (vec![form_type, ("Origin", own_origin.as_str())], 303),
    ] {
        let (got, head, body) = http(http_addr, "POST", "/login", &headers, &form);
        assert_eq!(got, status, "{headers:?}: {head}{body}");
        assert_eq!(
            head.contains("set-cookie"),
            status == 303,
            "{headers:?}: {head}"
        );
        if status == 403 {
            assert!(body.contains("another site"), "{body}");
        }
    }
    let by_url = format!("/login?token={}", secret(beta));
    for (site, status) in [("cross-site", 403), ("same-site", 403), ("none", 303)] {
        let (got, head, _) = http(http_addr, "GET", &by_url, &[("Sec-Fetch-Site", site)], "");
        assert_eq!(got, status, "Sec-Fetch-Site: {site}: {head}");
        assert_eq!(head.contains("set-cookie"), status == 303, "{head}");
    }
    let (got, head, _) = http(
        http_addr,
        "GET",
        "/logout",
        &[("Sec-Fetch-Site", "cross-site")],
        "",
    );
    assert_eq!((got, head.contains("set-cookie")), (403, false), "{head}");
}

/// The login form sets the cookie of a right token and refuses a wrong one.
fn check_login_form(http_addr: &str, beta: &str) {
    let form = format!("token={}", secret(beta));
    let (status, head, _) = http(
        http_addr,
        "POST",
        "/login",
        &[("Content-Type", "application/x-www-form-urlencoded")],
        &form,
    );
    assert_eq!(status, 303, "{head}");
    assert!(
        head.contains(&format!("set-cookie: xp_session={}", secret(beta))),
        "{head}"
    );
    let (status, _, body) = http(
        http_addr,
        "POST",
        "/login",
        &[("Content-Type", "application/x-www-form-urlencoded")],
        "token=nonsense",
    );
    assert_eq!(status, 401);
    assert!(body.contains("wrong token"), "{body}");
}
