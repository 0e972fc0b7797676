//! End-to-end leases and arbitration by a person, with real `xp-head` and
//! `xp-node` processes: two trials needing a lease of capacity 1 never overlap
//! (their own clocks say so) while a trial without it runs beside them; a
//! submission naming an undeclared lease is refused with its name; a
//! preemption of a trial in a queue with manual approval waits, the victim
//! running and `xp queue --json` showing the request (to a viewer of another
//! team only as counts, also on the dashboard's `/api/leases`), until an
//! admin approves it; a denial leaves the victim running; a non-admin's
//! approval is refused and audited.

mod common;

use std::process::Command;
use std::time::Duration;

use common::{TestCluster, binary, free_tcp_port, http_exchange, trials, wait_until};
use serde_json::Value;

const POLICY: &str = "\
leases: {ps: 1, feature-store: 8}
priority_classes: {low: 0, high: 100}
preemption: {grace_period: 1s, min_run_time: 0s}
queues:
  - {name: guarded, team: g, preemption: {approval: manual}}
  - {name: default}
";

fn submit(cluster: &TestCluster, name: &str, yaml: &str) -> String {
    let path = cluster.write_file(&format!("{name}.yaml"), yaml);
    cluster
        .must_xp(&["submit", path.to_str().expect("a UTF-8 path")])
        .trim()
        .to_owned()
}

fn states(cluster: &TestCluster, experiment: &str) -> Vec<String> {
    trials(&cluster.status(experiment))
        .iter()
        .map(|trial| trial["state"].as_str().unwrap_or_default().to_owned())
        .collect()
}

/// The object `xp queue --json` prints after the queues: leases, approvals, odds.
fn lease_report(cluster: &TestCluster) -> Value {
    cluster
        .must_xp(&["queue", "--json"])
        .lines()
        .map(|line| serde_json::from_str::<Value>(line).expect("a JSON line"))
        .find(|line| line.get("approvals").is_some())
        .expect("the lease report line")
}

/// What `xp ARGS` prints for the user with `credential`; it must succeed.
fn xp_as(credential: &str, args: &[&str]) -> String {
    let output = Command::new(env!("CARGO_BIN_EXE_xp"))
        .args(args)
        .env("XP_CLUSTER", credential)
        .output()
        .expect("xp runs");
    assert!(
        output.status.success(),
        "xp {args:?}: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8(output.stdout).expect("text")
}

/// The lease report line of `xp queue --json` as the user with `credential`.
fn lease_report_as(credential: &str) -> Value {
    xp_as(credential, &["queue", "--json"])
        .lines()
        .map(|line| serde_json::from_str::<Value>(line).expect("a JSON line"))
        .find(|line| line.get("approvals").is_some())
        .expect("the lease report line")
}

/// The pending approval requests, as `(id, victim, claimant)`.
fn approvals(cluster: &TestCluster) -> Vec<(u64, String, String)> {
    lease_report(cluster)["approvals"]
        .as_array()
        .expect("approvals")
        .iter()
        .map(|request| {
            (
                request["id"].as_u64().expect("an id"),
                request["victim"].as_str().expect("a victim").to_owned(),
                request["claimant"].as_str().expect("a claimant").to_owned(),
            )
        })
        .collect()
}

/// Adds a user on the head machine and returns their credential.
fn add_user(cluster: &TestCluster, name: &str, team: &str, role: &str) -> String {
    let output = Command::new(binary("xp-head"))
        .args(["user", "add", name, "--team", team, "--role", role])
        .arg("--data-dir")
        .arg(cluster.head_dir())
        .env("XP_LOG", "warn")
        .output()
        .expect("xp-head runs");
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8(output.stdout)
        .expect("text")
        .trim()
        .to_owned()
}

#[test]
fn a_mutex_lease_serialises_its_holders_while_others_run_beside() {
    let mut cluster = TestCluster::start_with_policy("10s", Some(POLICY));
    cluster.start_node("n1", 0, 4);
    cluster.wait_for_nodes(1);
    check_undeclared_lease_refused(&cluster);
    // Each trial reports its own start and end, by its own clock.
    let mutex = submit(
        &cluster,
        "mutex",
        "name: mutex\ntrial:\n  command: [sh, -c, 'echo \"XP_METRIC {\\\"step\\\": 1, \\\"start\\\": $(date +%s%3N)}\"; sleep {s}; echo \"XP_METRIC {\\\"step\\\": 2, \\\"end\\\": $(date +%s%3N)}\"']\n  resources: {cpu: 0.5, leases: {ps: 1}}\nsearch:\n  algorithm: grid\n  space: {s: {choice: [6, 6.1]}}\n",
    );
    let free = submit(
        &cluster,
        "free",
        "name: free\ntrial:\n  command: [sleep, '8']\n  resources: {cpu: 0.5}\n",
    );
    check_one_holds_one_waits_one_runs_beside(&cluster, &mutex, &free);
    check_holders_never_overlap(&cluster, &mutex, &free);
    check_odds_of_waiting(&cluster);
}

/// A lease the policy does not declare is refused at submission, by name.
fn check_undeclared_lease_refused(cluster: &TestCluster) {
    let path = cluster.write_file(
        "undeclared.yaml",
        "name: undeclared\ntrial:\n  command: ['true']\n  resources: {leases: {matlab-licence: 1}}\n",
    );
    let refused = cluster.xp(&["submit", path.to_str().expect("a UTF-8 path")]);
    assert!(
        !refused.status.success(),
        "an undeclared lease was accepted"
    );
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert!(stderr.contains("matlab-licence"), "{stderr}");
}

/// One holder of the lease runs, the other waits for it (and says so), and the
/// free trial runs beside them.
fn check_one_holds_one_waits_one_runs_beside(cluster: &TestCluster, mutex: &str, free: &str) {
    wait_until(
        "one lease holder, one waiter and the free trial beside them",
        Duration::from_secs(60),
        || {
            let mut holders = states(cluster, mutex);
            holders.sort();
            (holders == ["queued", "running"] && states(cluster, free) == ["running"]).then_some(())
        },
    );
    let leases: Vec<Value> = cluster
        .must_xp(&["leases", "--json"])
        .lines()
        .map(|line| serde_json::from_str(line).expect("a JSON lease"))
        .collect();
    let ps = leases
        .iter()
        .find(|lease| lease["name"] == "ps")
        .expect("lease ps");
    assert_eq!(ps["capacity"], 1, "{ps:#}");
    assert_eq!(ps["held"], 1, "{ps:#}");
    assert_eq!(ps["holders"].as_array().expect("holders").len(), 1);
    assert_eq!(ps["waiters"].as_array().expect("waiters").len(), 1);
    let waiting = trials(&cluster.status(mutex))
        .iter()
        .find(|trial| trial["state"] == "queued")
        .cloned()
        .expect("a waiting trial");
    assert!(
        waiting["waiting"]
            .as_str()
            .is_some_and(|reason| reason.contains("waiting for lease ps")),
        "{waiting:#}"
    );
}

/// Both holders succeed, one after the other, by their own clocks; the free
/// trial succeeds too.
fn check_holders_never_overlap(cluster: &TestCluster, mutex: &str, free: &str) {
    let done = cluster.wait_finished(mutex, Duration::from_secs(90));
    assert_eq!(done["state"], "succeeded", "{done:#}");
    let mut spans: Vec<(f64, f64)> = trials(&done)
        .iter()
        .map(|trial| {
            let metrics = &trial["metrics"];
            (
                metrics["start"].as_f64().expect("a start"),
                metrics["end"].as_f64().expect("an end"),
            )
        })
        .collect();
    spans.sort_by(|a, b| a.0.total_cmp(&b.0));
    assert!(
        spans[0].1 <= spans[1].0,
        "the two holders of a lease of capacity 1 overlapped: {spans:?}"
    );
    let free_done = cluster.wait_finished(free, Duration::from_secs(60));
    assert_eq!(free_done["state"], "succeeded", "{free_done:#}");
}

/// The history now says how often a request for `ps` waited: one of two.
fn check_odds_of_waiting(cluster: &TestCluster) {
    let report = lease_report(cluster);
    let odds = report["odds"]
        .as_array()
        .expect("odds")
        .iter()
        .find(|odds| odds["resource"] == "lease ps")
        .cloned()
        .expect("odds of lease ps");
    assert_eq!(odds["requests"], 2, "{odds:#}");
    assert_eq!(odds["waited"], 1, "{odds:#}");
    assert_eq!(odds["p"], 0.5, "{odds:#}");
}

/// What the approval test's trials are: the low-priority lease holder and the
/// first high-priority claimant, and the approval request between them.
struct Contention {
    victim: String,
    victim_trial: String,
    first: String,
    first_trial: String,
    request: u64,
}

#[test]
fn a_manual_approval_preemption_waits_for_an_admin() {
    let policy_dir = tempfile::tempdir().expect("a directory for the policy");
    let policy = policy_dir.path().join("policy.yaml");
    std::fs::write(&policy, POLICY).expect("policy");
    let policy_arg = policy.display().to_string();
    let http = format!("127.0.0.1:{}", free_tcp_port());
    let mut cluster =
        TestCluster::start_prepared("10s", &["--http", &http, "--policy", &policy_arg], |_| {});
    cluster.start_node("n1", 0, 4);
    cluster.wait_for_nodes(1);
    let team_admin = add_user(&cluster, "tara", "g", "team-admin");
    let contention = check_preemption_waits_for_approval(&cluster);
    // A viewer of another team sees how contended the lease is, not whose
    // trials contend nor the request; the victim's team sees its request.
    let outsider = add_user(&cluster, "olga", "c", "viewer");
    check_outsider_sees_only_contention(&http, &outsider, &contention);
    check_victims_team_sees_its_request(&http, &team_admin, &contention);
    check_team_admin_cannot_approve(&cluster, &team_admin, contention.request);
    check_denial_leaves_the_victim(&cluster, contention.request);
    let (second, approved) = check_another_claimant_asks_again(&cluster, &contention);
    check_approval_preempts_the_victim(&cluster, &contention, &second, approved);
    check_first_claimant_asks_again_and_runs(&cluster, &contention);
}

/// The victim runs holding the lease; a high-priority claimant of it waits
/// for an admin's approval of the preemption.
fn check_preemption_waits_for_approval(cluster: &TestCluster) -> Contention {
    let victim = submit(
        cluster,
        "victim",
        "name: victim\nteam: g\npriority: low\ntrial:\n  command: [sleep, '600']\n  resources: {cpu: 0.5, leases: {ps: 1}}\n",
    );
    wait_until("the victim to run", Duration::from_secs(60), || {
        (states(cluster, &victim) == ["running"]).then_some(())
    });
    let victim_trial = format!("{victim}-t0");
    let first = submit(
        cluster,
        "first",
        "name: first\nteam: b\npriority: high\ntrial:\n  command: [sleep, '1']\n  resources: {cpu: 0.5, leases: {ps: 1}}\n",
    );
    let first_trial = format!("{first}-t0");
    let (request, _, _) = wait_until(
        "a pending approval for the first claimant",
        Duration::from_secs(60),
        || approvals(cluster).into_iter().next(),
    );
    assert_eq!(
        approvals(cluster),
        [(request, victim_trial.clone(), first_trial.clone())]
    );
    assert_eq!(states(cluster, &victim), ["running"]);
    assert_eq!(states(cluster, &first), ["queued"]);
    let text = cluster.must_xp(&["queue"]);
    assert!(text.contains("waiting for approval"), "{text}");
    Contention {
        victim,
        victim_trial,
        first,
        first_trial,
        request,
    }
}

/// `/api/leases` as the user with `credential`: the report the dashboard's
/// queues page reads, as filtered for them.
fn leases_api(http: &str, credential: &str) -> Value {
    let join: xp_runtime::join::JoinString = credential.parse().expect("a credential");
    let bearer = format!("Bearer {}", join.token);
    let (status, headers, body) = http_exchange(
        http,
        "GET",
        "/api/leases",
        &[("Authorization", &bearer)],
        "",
    );
    assert_eq!(status, 200, "{headers}{body}");
    serde_json::from_str(&body).expect("JSON")
}

/// The lease `ps` of a lease report.
fn lease_ps(report: &Value) -> Value {
    report["leases"]
        .as_array()
        .and_then(|leases| leases.iter().find(|lease| lease["name"] == "ps"))
        .cloned()
        .expect("the ps lease")
}

/// Another team's viewer sees counts of holders and waiters, neither trials
/// nor the request, through `xp queue`, `xp leases` and the API.
fn check_outsider_sees_only_contention(http: &str, outsider: &str, contention: &Contention) {
    let Contention {
        victim_trial,
        first_trial,
        ..
    } = contention;
    let report = lease_report_as(outsider);
    assert_eq!(report["approvals"], Value::Array(Vec::new()), "{report:#}");
    let ps = lease_ps(&report);
    assert_eq!(
        (&ps["held"], &ps["holding"], &ps["waiting"]),
        (&Value::from(1), &Value::from(1), &Value::from(1)),
        "{ps:#}"
    );
    assert_eq!(ps["holders"], Value::Array(Vec::new()), "{ps:#}");
    assert_eq!(ps["waiters"], Value::Array(Vec::new()), "{ps:#}");
    let text = xp_as(outsider, &["leases"]);
    assert!(
        !text.contains(victim_trial) && !text.contains(first_trial),
        "{text}"
    );
    assert!(text.contains("1 of other teams"), "{text}");
    let seen = leases_api(http, outsider);
    assert_eq!(seen["approvals"], Value::Array(Vec::new()), "{seen:#}");
    assert!(!seen.to_string().contains(victim_trial), "{seen:#}");
}

/// The victim's team admin sees the request and the holder, through `xp
/// queue` and the API.
fn check_victims_team_sees_its_request(http: &str, team_admin: &str, contention: &Contention) {
    let owner = lease_report_as(team_admin);
    assert_eq!(
        owner["approvals"][0]["victim"],
        contention.victim_trial.as_str(),
        "{owner:#}"
    );
    let seen = leases_api(http, team_admin);
    assert_eq!(seen["approvals"][0]["id"], contention.request, "{seen:#}");
    assert_eq!(
        seen["approvals"][0]["victim"],
        contention.victim_trial.as_str(),
        "{seen:#}"
    );
    assert_eq!(
        seen["approvals"][0]["claimant"],
        contention.first_trial.as_str(),
        "{seen:#}"
    );
    let ps = lease_ps(&seen);
    assert_eq!(
        (&ps["holding"], &ps["waiting"]),
        (&Value::from(1), &Value::from(1))
    );
    assert_eq!(
        ps["holders"][0]["trial"],
        contention.victim_trial.as_str(),
        "{ps:#}"
    );
}

/// A team admin is no admin: refused, and the refusal is audited.
fn check_team_admin_cannot_approve(cluster: &TestCluster, team_admin: &str, request: u64) {
    let output = Command::new(env!("CARGO_BIN_EXE_xp"))
        .args(["admin", "approve", &request.to_string(), "--why", "mine"])
        .env("XP_CLUSTER", team_admin)
        .output()
        .expect("xp runs");
    assert!(!output.status.success(), "a team admin approved");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("needs role admin"), "{stderr}");
    let audit = cluster.must_xp(&["audit", "--json"]);
    assert!(
        audit.lines().any(|line| {
            let entry: Value = serde_json::from_str(line).expect("a JSON entry");
            entry["who"] == "tara"
                && entry["allowed"] == false
                && entry["action"]
                    .as_str()
                    .is_some_and(|action| action.contains(&format!("request {request}")))
        }),
        "{audit}"
    );
}

/// A denial leaves the victim running, is audited with its reason, and is
/// not asked again for it.
fn check_denial_leaves_the_victim(cluster: &TestCluster, request: u64) {
    cluster.must_xp(&[
        "admin",
        "deny",
        &request.to_string(),
        "--why",
        "the victim is nearly done",
    ]);
    assert!(approvals(cluster).is_empty());
    let audit = cluster.must_xp(&["audit", "--json"]);
    assert!(
        audit.contains(&format!(
            "request {request}: deny (the victim is nearly done)"
        )),
        "{audit}"
    );
}

/// Another claimant is a new situation: it asks again, under a new id, and
/// the denied pair is not asked again. The claimant's experiment and the request.
fn check_another_claimant_asks_again(
    cluster: &TestCluster,
    contention: &Contention,
) -> (String, u64) {
    let second = submit(
        cluster,
        "second",
        "name: second\nteam: b\npriority: high\ntrial:\n  command: [sleep, '1']\n  resources: {cpu: 0.5, leases: {ps: 1}}\n",
    );
    let second_trial = format!("{second}-t0");
    let (approved, _, claimant) = wait_until(
        "a pending approval for the second claimant",
        Duration::from_secs(60),
        || approvals(cluster).into_iter().next(),
    );
    assert_eq!(claimant, second_trial);
    assert_ne!(approved, contention.request);
    assert_eq!(
        approvals(cluster).len(),
        1,
        "the denied pair was asked again"
    );
    assert_eq!(states(cluster, &contention.victim), ["running"]);
    (second, approved)
}

/// An approval lets it go ahead: the victim is preempted, the claimant runs,
/// and the approval is audited with its reason.
fn check_approval_preempts_the_victim(
    cluster: &TestCluster,
    contention: &Contention,
    second: &str,
    approved: u64,
) {
    cluster.must_xp(&[
        "admin",
        "approve",
        &approved.to_string(),
        "--why",
        "the deadline is today",
    ]);
    let second_done = cluster.wait_finished(second, Duration::from_secs(90));
    assert_eq!(second_done["state"], "succeeded", "{second_done:#}");
    let victim_status = cluster.status(&contention.victim);
    let attempts = trials(&victim_status)[0]["attempts"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    assert_eq!(
        attempts.first().map(|attempt| attempt["outcome"].clone()),
        Some(Value::from("preempted")),
        "{victim_status:#}"
    );
    let audit = cluster.must_xp(&["audit", "--json"]);
    assert!(
        audit.lines().any(|line| {
            let entry: Value = serde_json::from_str(line).expect("a JSON entry");
            entry["allowed"] == true
                && entry["action"].as_str().is_some_and(|action| {
                    action.contains(&format!(
                        "request {approved}: approve (the deadline is today)"
                    ))
                })
        }),
        "{audit}"
    );
}

/// The victim stopped, so its denial for the first claimant went with it:
/// back in its place (its queue is first by fair share), it is asked for
/// again; once the victim is cancelled, the first claimant runs.
fn check_first_claimant_asks_again_and_runs(cluster: &TestCluster, contention: &Contention) {
    wait_until(
        "the first claimant to ask again",
        Duration::from_secs(60),
        || {
            approvals(cluster)
                .into_iter()
                .find(|(_, victim, claimant)| {
                    *victim == contention.victim_trial && *claimant == contention.first_trial
                })
        },
    );
    cluster.must_xp(&["cancel", &contention.victim]);
    let first_done = cluster.wait_finished(&contention.first, Duration::from_secs(90));
    assert_eq!(first_done["state"], "succeeded", "{first_done:#}");
    assert!(approvals(cluster).is_empty());
}
