//! End-to-end lifecycle: cancel frees slots, identical submissions are reused,
//! the SDK spawns single trials and reads results, and a node stops its workers
//! on SIGTERM.

mod common;

use std::collections::BTreeMap;
use std::time::Duration;

use common::{TestCluster, trials, wait_until};
use xp::{Client, ParamValue, TrialSpec};

fn free_gpus_and_workers(cluster: &TestCluster) -> (u64, u64) {
    let line = cluster.must_xp(&["nodes", "--json"]);
    let node: serde_json::Value =
        serde_json::from_str(line.lines().next().expect("one node")).unwrap();
    (
        node["free_gpus"].as_u64().unwrap(),
        node["running_workers"].as_u64().unwrap(),
    )
}

#[test]
fn cancel_reuse_spawn_trial_results_and_graceful_node_shutdown() {
    let mut cluster = TestCluster::start("10s");
    cluster.start_node("a", 1, 2);
    cluster.wait_for_nodes(1);
    // Cancel: the running worker is killed and its GPU is free again.
    check_cancel_frees_the_slot(&cluster);
    // Reuse: an identical finished experiment answers with its id; --rerun makes a new run.
    check_identical_submission_reused(&cluster);
    // The SDK: spawn one trial with fixed parameters, then read the results table.
    check_sdk_spawns_a_trial_and_reads_results(&cluster);
    // SIGTERM: the node stops its worker (and the worker's children) and exits cleanly.
    check_sigterm_stops_workers(&mut cluster);
}

/// Cancelling a running experiment kills its worker and frees its GPU; every
/// trial is cancelled.
fn check_cancel_frees_the_slot(cluster: &TestCluster) {
    let sleepy = cluster.write_file("sleepy.yaml", "name: sleepy\ntrial:\n  command: [sleep, '{s}']\n  resources: {gpu: 1}\nsearch:\n  algorithm: grid\n  space: {s: {choice: [30, 31]}}\n");
    let experiment = cluster
        .must_xp(&["submit", sleepy.to_str().unwrap()])
        .trim()
        .to_owned();
    wait_until("a running trial", Duration::from_secs(30), || {
        (free_gpus_and_workers(cluster) == (0, 1)).then_some(())
    });
    assert_eq!(
        cluster.must_xp(&["cancel", &experiment]).trim(),
        "cancelled 2 trial(s)"
    );
    wait_until("the slot to be freed", Duration::from_secs(30), || {
        (free_gpus_and_workers(cluster) == (1, 0)).then_some(())
    });
    let status = cluster.status(&experiment);
    assert_eq!(status["state"], "cancelled");
    assert!(
        trials(&status)
            .iter()
            .all(|trial| trial["state"] == "cancelled"),
        "{status:#}"
    );
}

/// An identical finished experiment answers with its id; `--rerun` makes a new run.
fn check_identical_submission_reused(cluster: &TestCluster) {
    let quick = cluster.write_file(
        "quick.yaml",
        "name: quick\ntrial:\n  command: [sh, -c, 'echo \"XP_METRIC {\\\"v\\\": 1}\"']\n",
    );
    let first = cluster
        .must_xp(&["submit", quick.to_str().unwrap()])
        .trim()
        .to_owned();
    cluster.wait_finished(&first, Duration::from_secs(30));
    let again = cluster.xp(&["submit", quick.to_str().unwrap()]);
    assert_eq!(String::from_utf8_lossy(&again.stdout).trim(), first);
    assert!(String::from_utf8_lossy(&again.stderr).contains("reusing"));
    let rerun = cluster
        .must_xp(&["submit", quick.to_str().unwrap(), "--rerun"])
        .trim()
        .to_owned();
    assert_eq!(rerun, format!("{first}.2"));
}

/// The SDK spawns one trial with fixed parameters and reads the results table.
fn check_sdk_spawns_a_trial_and_reads_results(cluster: &TestCluster) {
    let runtime = tokio::runtime::Runtime::new().unwrap();
    runtime.block_on(async {
        let client = Client::connect(&cluster.join).await.unwrap();
        let trial = TrialSpec {
            command: Some(vec![
                "sh".into(),
                "-c".into(),
                "echo \"XP_METRIC {\\\"a\\\": {a}}\"".into(),
            ]),
            ..TrialSpec::default()
        };
        let trial_id = client
            .spawn_trial(
                "single",
                trial,
                BTreeMap::from([("a".to_owned(), ParamValue::Int(5))]),
            )
            .await
            .unwrap();
        let status = client.wait(trial_id.experiment, |_| {}).await.unwrap();
        assert_eq!(status.state, xp::ExperimentState::Succeeded);
        let rows = client.results(trial_id.experiment).await.unwrap();
        assert_eq!(rows.len(), 1);
        assert_eq!(rows[0].trial, trial_id);
        assert_eq!(rows[0].metrics["a"], 5.0);
        assert_eq!(rows[0].config["a"], 5);
        client.close().await;
    });
}

/// On SIGTERM the node stops its worker (and the worker's children), exits
/// cleanly, and the head hears the worker's end.
fn check_sigterm_stops_workers(cluster: &mut TestCluster) {
    let pid_file = cluster.dir.path().join("worker.pid");
    let long = cluster.write_file(
        "long.yaml",
        &format!(
            "name: long\ntrial:\n  command: [sh, -c, 'echo $$ > {}; sleep 60']\n",
            pid_file.display()
        ),
    );
    let long_experiment = cluster
        .must_xp(&["submit", long.to_str().unwrap()])
        .trim()
        .to_owned();
    let worker_pid: i32 = wait_until(
        "the worker to write its pid",
        Duration::from_secs(30),
        || {
            std::fs::read_to_string(&pid_file)
                .ok()
                .and_then(|text| text.trim().parse().ok())
        },
    );
    let exit = cluster.terminate_node("a");
    assert!(
        exit.success(),
        "the node exits cleanly on SIGTERM: {exit:?}"
    );
    let alive = nix::sys::signal::kill(nix::unistd::Pid::from_raw(worker_pid), None).is_ok();
    assert!(!alive, "worker {worker_pid} outlived its node");
    let status = cluster.status(&long_experiment);
    let attempt = &trials(&status)[0]["attempts"][0];
    assert!(
        attempt["ended_at_ms"].is_number(),
        "the head heard the worker's end: {status:#}"
    );
}
