//! End-to-end pipelines with real head and node processes: a three-stage
//! pipeline whose last stage receives the sweep's best parameters and the file
//! the first stage wrote; a resubmission with only the last stage changed, which
//! reruns only that stage; a failing middle stage that leaves an independent
//! branch to succeed, and `xp pipeline retry` rerunning only the failed part; and
//! cycles, unknown needs and unknown outputs refused naming the stage.

mod common;

use std::time::Duration;

use common::{TestCluster, wait_until};
use serde_json::Value;

const WAIT: Duration = Duration::from_secs(120);

fn pipeline_status(cluster: &TestCluster, id: &str) -> Value {
    serde_json::from_str(&cluster.must_xp(&["pipeline", "status", id, "--json"]))
        .expect("status is JSON")
}

fn stage<'a>(status: &'a Value, name: &str) -> &'a Value {
    status["stages"]
        .as_array()
        .expect("stages")
        .iter()
        .find(|stage| stage["name"] == name)
        .unwrap_or_else(|| panic!("no stage {name} in {status:#}"))
}

/// `xp pipeline submit FILE --wait`; returns the pipeline id and whether it succeeded.
fn submit_and_wait(cluster: &TestCluster, file: &std::path::Path) -> (String, bool, String) {
    let output = cluster.xp(&["pipeline", "submit", file.to_str().unwrap(), "--wait"]);
    let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
    let id = stdout
        .lines()
        .next()
        .and_then(|line| line.strip_prefix("pipeline "))
        .and_then(|rest| rest.split_whitespace().next())
        .unwrap_or_else(|| {
            panic!(
                "no pipeline id in {stdout:?}; stderr: {}",
                String::from_utf8_lossy(&output.stderr)
            )
        })
        .to_owned();
    (id, output.status.success(), stdout)
}

/// Rank 0's log of trial 0 of `stage`'s experiment.
fn stage_log(cluster: &TestCluster, status: &Value, name: &str) -> String {
    let experiment = stage(status, name)["experiment"]
        .as_str()
        .unwrap_or_else(|| panic!("stage {name} has no experiment: {status:#}"))
        .to_owned();
    cluster.must_xp(&["logs", &format!("{experiment}-t0")])
}

const THREE: &str = r#"name: digits-pipeline
team: vision
stages:
  prepare:
    trial: {command: ["sh", "-c", "mkdir -p $XP_OUTPUT_DIR && echo 42 > $XP_OUTPUT_DIR/n.txt"]}
  sweep:
    needs: [prepare]
    trial: {command: ["sh", "-c", "n=$(cat {prepare.outputs}/n.txt); echo XP_METRIC '{\"step\": 1, \"y\": {x}, \"n\": '$n'}'"]}
    search: {algorithm: random, space: {x: {uniform: [0, 1]}}, metric: y, mode: max, trials: 4}
  evaluate:
    needs: [prepare, sweep]
    trial: {command: ["sh", "-c", "echo best x = {sweep.best.params.x}; echo n = $(cat {prepare.outputs}/n.txt)"]}
"#;

#[test]
fn three_stages_pass_results_downstream_and_a_resubmission_reruns_only_the_changed_stage() {
    let mut cluster = TestCluster::start("10s");
    cluster.start_node("a", 0, 4);
    cluster.wait_for_nodes(1);

    let file = cluster.write_file("three.yaml", THREE);
    let (id, succeeded, stdout) = submit_and_wait(&cluster, &file);
    if !succeeded {
        cluster.dump_logs();
    }
    assert!(succeeded, "{stdout}\n{:#}", pipeline_status(&cluster, &id));
    let status = pipeline_status(&cluster, &id);
    assert_eq!(status["state"], "succeeded", "{status:#}");

    // The sweep read prepare's file: every trial reported n = 42.
    let sweep = stage(&status, "sweep");
    let metrics: Vec<(String, f64)> =
        serde_json::from_value(sweep["best_metrics"].clone()).unwrap();
    assert!(metrics.contains(&("n".to_owned(), 42.0)), "{sweep:#}");
    let best: Value =
        serde_json::from_str(sweep["best_params_json"].as_str().expect("best params")).unwrap();
    let best_x = best["x"].as_f64().expect("x");
    // Prepare's output is a stored object named n.txt.
    let prepare = stage(&status, "prepare");
    assert_eq!(prepare["outputs"][0]["name"], "n.txt", "{prepare:#}");
    assert_eq!(prepare["outputs"][0]["size"], 3);

    // Evaluate got the best x and the file, as its log shows.
    let log = stage_log(&cluster, &status, "evaluate");
    let printed: f64 = log
        .lines()
        .find_map(|line| line.strip_prefix("best x = "))
        .unwrap_or_else(|| panic!("no best x in {log:?}"))
        .trim()
        .parse()
        .expect("a number");
    assert_eq!(printed, best_x, "{log}");
    assert!(log.contains("n = 42"), "{log}");
    let evaluate = stage(&status, "evaluate");
    assert!(
        evaluate["inputs"]
            .as_array()
            .unwrap()
            .iter()
            .any(|input| input["reference"] == "sweep.best.params.x"),
        "{evaluate:#}"
    );

    // Only evaluate changes: prepare and sweep are reused from the first run.
    let changed = cluster.write_file(
        "three-changed.yaml",
        &THREE.replace("echo best x = ", "echo the best x is "),
    );
    let (second, succeeded, stdout) = submit_and_wait(&cluster, &changed);
    assert!(succeeded, "{stdout}");
    assert!(stdout.contains("2 reused"), "{stdout}");
    let again = pipeline_status(&cluster, &second);
    for name in ["prepare", "sweep"] {
        let reused = stage(&again, name);
        assert_eq!(reused["state"], "reused", "{again:#}");
        assert_eq!(reused["reused_from"]["pipeline"].as_u64(), id.parse().ok());
        assert_eq!(reused["reused_from"]["stage"], name);
    }
    assert_eq!(stage(&again, "evaluate")["state"], "succeeded");
    assert_ne!(
        stage(&again, "evaluate")["experiment"],
        stage(&status, "evaluate")["experiment"]
    );
    let log = stage_log(&cluster, &again, "evaluate");
    assert!(log.contains(&format!("the best x is {best_x}")), "{log}");
    assert!(log.contains("n = 42"), "{log}");

    // The listing shows both.
    let list = cluster.must_xp(&["pipeline", "list"]);
    assert!(list.contains("digits-pipeline"), "{list}");
}

#[test]
fn a_failing_stage_leaves_its_sibling_branch_running_and_retry_reruns_only_the_failed_part() {
    let mut cluster = TestCluster::start("10s");
    cluster.start_node("a", 0, 4);
    cluster.wait_for_nodes(1);
    // In /tmp, which a worker under a user id of its own can pass through.
    let flag = std::env::temp_dir().join(format!("xp-pipeline-flag-{}", std::process::id()));
    let _ = std::fs::remove_file(&flag);
    let yaml = format!(
        r#"name: branches
stages:
  a:
    trial: {{command: ["sh", "-c", "echo a > $XP_OUTPUT_DIR/a.txt"]}}
  b:
    needs: [a]
    trial: {{command: ["sh", "-c", "cat {{a.outputs}}/a.txt && test -e {flag}"]}}
  c:
    needs: [b]
    trial: {{command: ["echo", "c"]}}
  d:
    needs: [a]
    trial: {{command: ["sh", "-c", "sleep 1; echo d"]}}
"#,
        flag = flag.display()
    );
    let file = cluster.write_file("branches.yaml", &yaml);
    let (id, succeeded, stdout) = submit_and_wait(&cluster, &file);
    assert!(!succeeded, "b must fail: {stdout}");
    let status = pipeline_status(&cluster, &id);
    assert_eq!(status["state"], "failed", "{status:#}");
    assert_eq!(stage(&status, "a")["state"], "succeeded");
    assert_eq!(stage(&status, "b")["state"], "failed");
    assert_eq!(stage(&status, "d")["state"], "succeeded", "{status:#}");
    assert_eq!(stage(&status, "c")["state"], "cancelled");
    assert_eq!(stage(&status, "c")["reason"], "needs `b`, which failed");

    std::fs::write(&flag, "fixed").unwrap();
    let retried = cluster.must_xp(&["pipeline", "retry", &id]);
    assert!(retried.contains("retrying 2 stage(s)"), "{retried}");
    let done = wait_until("the retried pipeline to finish", WAIT, || {
        let status = pipeline_status(&cluster, &id);
        (status["state"] != "running").then_some(status)
    });
    let _ = std::fs::remove_file(&flag);
    assert_eq!(done["state"], "succeeded", "{done:#}");
    // What succeeded kept its experiment; the failed part ran again.
    for name in ["a", "d"] {
        assert_eq!(
            stage(&done, name)["experiment"],
            stage(&status, name)["experiment"]
        );
    }
    assert_ne!(
        stage(&done, "b")["experiment"],
        stage(&status, "b")["experiment"]
    );
    assert_eq!(stage(&done, "c")["state"], "succeeded");
}

#[test]
fn cycles_unknown_needs_and_unknown_outputs_are_refused_naming_the_stage() {
    let cluster = TestCluster::start("10s");
    let refused = |name: &str, yaml: &str| -> String {
        let file = cluster.write_file(name, yaml);
        let output = cluster.xp(&["pipeline", "submit", file.to_str().unwrap()]);
        assert!(!output.status.success(), "{name} was accepted");
        String::from_utf8_lossy(&output.stderr).into_owned()
    };
    let message = refused(
        "cycle.yaml",
        "name: p\nstages:\n  train: {needs: [eval], trial: {command: [true]}}\n  eval: {needs: [prep], trial: {command: [true]}}\n  prep: {needs: [train], trial: {command: [true]}}\n",
    );
    for name in ["`train`", "`eval`", "`prep`"] {
        assert!(message.contains(name), "{message}");
    }
    assert!(message.contains("cycle"), "{message}");
    let message = refused(
        "need.yaml",
        "name: p\nstages:\n  train: {needs: [prepare], trial: {command: [true]}}\n",
    );
    assert!(
        message.contains("stage `train` needs `prepare`"),
        "{message}"
    );
    let message = refused(
        "output.yaml",
        "name: p\nstages:\n  sweep: {trial: {command: [true]}}\n  eval: {needs: [sweep], trial: {command: [echo, '{sweep.best.params.lr}']}}\n",
    );
    assert!(
        message.contains("stage `eval`") && message.contains("no search parameter `lr`"),
        "{message}"
    );
}

#[test]
fn a_stage_that_ends_while_the_head_is_down_releases_the_next_after_the_restart() {
    let mut cluster = TestCluster::start("10s");
    cluster.start_node("a", 0, 2);
    cluster.wait_for_nodes(1);
    // In /tmp, which a worker under a user id of its own can pass through.
    let gate = std::env::temp_dir().join(format!("xp-pipeline-gate-{}", std::process::id()));
    let _ = std::fs::remove_file(&gate);
    let yaml = format!(
        r#"name: restart
stages:
  first:
    trial: {{command: ["sh", "-c", "while [ ! -e {gate} ]; do sleep 0.1; done; echo kept > $XP_OUTPUT_DIR/x"]}}
  second:
    needs: [first]
    trial: {{command: ["sh", "-c", "echo got $(cat {{first.outputs}}/x)"]}}
"#,
        gate = gate.display()
    );
    let file = cluster.write_file("restart.yaml", &yaml);
    let submitted = cluster.must_xp(&["pipeline", "submit", file.to_str().unwrap()]);
    let id = submitted
        .split_whitespace()
        .nth(1)
        .expect("pipeline ID submitted")
        .to_owned();
    let experiment = wait_until("the first stage to run", WAIT, || {
        let status = pipeline_status(&cluster, &id);
        let experiment = stage(&status, "first")["experiment"].as_str()?.to_owned();
        (cluster.status(&experiment)["trials"][0]["state"] == "running").then_some(experiment)
    });
    cluster.kill_head();
    std::fs::write(&gate, "open").unwrap();
    // The node keeps the outputs and the exit until the head is back.
    wait_until("the first stage's outputs to be stored", WAIT, || {
        cluster
            .node_log("a")
            .contains("outputs stored")
            .then_some(())
    });
    cluster.restart_head();
    let done = wait_until("the pipeline to finish after the restart", WAIT, || {
        let status = pipeline_status(&cluster, &id);
        (status["state"] != "running").then_some(status)
    });
    let _ = std::fs::remove_file(&gate);
    assert_eq!(done["state"], "succeeded", "{done:#}");
    assert_eq!(stage(&done, "first")["experiment"], experiment.as_str());
    let log = stage_log(&cluster, &done, "second");
    assert!(log.contains("got kept"), "{log}");
}

#[test]
fn the_http_api_lists_and_shows_pipelines_to_credentialed_callers() {
    let http = format!("127.0.0.1:{}", common::free_tcp_port());
    let cluster = TestCluster::start_prepared("10s", &["--http", http.as_str()], |_| {});
    let admin: xp_runtime::join::JoinString = cluster.join.parse().expect("a credential");
    let bearer = format!("Bearer {}", admin.token);
    let get = |path: &str, authorized: bool| -> (u16, Value) {
        let headers: Vec<(&str, &str)> = if authorized {
            vec![("Authorization", bearer.as_str())]
        } else {
            Vec::new()
        };
        let (status, _, body) = common::http_exchange(&http, "GET", path, &headers, b"");
        (
            status,
            serde_json::from_str(&body).unwrap_or(Value::String(body)),
        )
    };
    wait_until("the HTTP API", WAIT, || {
        std::net::TcpStream::connect(&http)
            .is_ok()
            .then(|| get("/healthz", false))
            .filter(|(status, _)| *status == 200)
    });
    // No node: the first stage's trial waits, the second waits for it.
    let file = cluster.write_file(
        "http.yaml",
        "name: http\nstages:\n  a: {trial: {command: [true]}, estimate: 2m}\n  b: {needs: [a], trial: {command: [true]}, estimate: 1m}\n",
    );
    let submitted = cluster.must_xp(&["pipeline", "submit", file.to_str().unwrap()]);
    let id = submitted
        .split_whitespace()
        .nth(1)
        .expect("an id")
        .to_owned();
    let (status, list) = get("/api/pipelines", true);
    assert_eq!(status, 200, "{list}");
    assert_eq!(list["items"][0]["id"].as_u64(), id.parse().ok(), "{list:#}");
    let (status, one) = get(&format!("/api/pipelines/{id}"), true);
    assert_eq!(status, 200, "{one}");
    assert_eq!(one["state"], "running");
    assert_eq!(one["critical_path"], serde_json::json!(["a", "b"]));
    // Stage a runs (its trial waits for a node) and b's minute follows it:
    // whatever time has passed, between one and three minutes are left.
    let remaining = one["remaining_s"].as_f64().expect("an estimate");
    assert!((60.0..=180.0).contains(&remaining), "{one:#}");
    assert_eq!(stage(&one, "b")["reason"], "waiting for `a`");
    assert!(stage(&one, "a")["experiment"].is_string(), "{one:#}");
    assert_eq!(get("/api/pipelines/999", true).0, 404);
    assert_eq!(get("/api/pipelines/nope", true).0, 400);
    assert_eq!(get(&format!("/api/pipelines/{id}"), false).0, 401);
    // The text status shows the same.
    let text = cluster.must_xp(&["pipeline", "status", &id]);
    assert!(text.contains("critical path: a → b"), "{text}");
    assert!(text.contains("waiting for `a`"), "{text}");
}
