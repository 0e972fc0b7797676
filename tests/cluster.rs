//! End-to-end: real `xp-head` and `xp-node` processes on 127.0.0.1 run sweeps,
//! survive a node killed mid-sweep and a head killed and restarted.

mod common;

use std::collections::BTreeSet;
use std::time::Duration;

use common::{TestCluster, trials, wait_until};
use serde_json::Value;

const COMMAND_SWEEP: &str = r#"
name: command-sweep
team: tests
trial:
  command: ["sh", "-c", 'echo "XP_METRIC {\"step\": 1, \"x\": {x}, \"gpu\": $CUDA_VISIBLE_DEVICES, \"rank\": $RANK, \"world\": $WORLD_SIZE, \"port\": $MASTER_PORT}"; sleep 0.3']
  workers: 2
  resources: {gpu: 1, cpu: 0.5}
search:
  algorithm: grid
  space:
    x: {int: [1, 6]}
  metric: x
"#;

fn node_ids_by_name(cluster: &TestCluster) -> Vec<(String, String)> {
    cluster
        .must_xp(&["nodes", "--json"])
        .lines()
        .map(|line| serde_json::from_str::<Value>(line).expect("node JSON"))
        .map(|node| {
            (
                node["labels"]["name"]
                    .as_str()
                    .unwrap_or_default()
                    .to_owned(),
                node["id"].as_str().unwrap_or_default().to_owned(),
            )
        })
        .collect()
}

#[test]
fn a_sweep_of_command_and_rust_trials_runs_on_two_nodes() {
    let mut cluster = TestCluster::start("10s");
    cluster.start_node("a", 2, 2);
    cluster.start_node("b", 2, 2);
    cluster.wait_for_nodes(2);

    let spec = cluster.write_file("commands.yaml", COMMAND_SWEEP);
    let command_experiment = cluster
        .must_xp(&["submit", spec.to_str().unwrap()])
        .trim()
        .to_owned();
    let rust_experiment = cluster.run_driver(
        "examples/trainables",
        &["submit", "--trials", "6", "--steps", "4", "--step-ms", "50"],
    );

    let mut nodes_used = BTreeSet::new();
    let commands = cluster.wait_finished(&command_experiment, Duration::from_secs(120));
    assert_eq!(commands["state"], "succeeded", "{commands:#}");
    assert_eq!(trials(&commands).len(), 6);
    for trial in trials(&commands) {
        assert_eq!(trial["state"], "succeeded", "{trial:#}");
        assert_eq!(
            trial["metrics"]["x"],
            trial["config"]["x"].as_f64().unwrap(),
            "the placeholder was filled in"
        );
        assert_eq!(trial["metrics"]["world"], 2.0, "a gang of two");
        assert_eq!(
            trial["metrics"]["rank"], 0.0,
            "status shows rank 0's metrics"
        );
        let gpu = trial["metrics"]["gpu"].as_f64().unwrap();
        assert!(
            gpu == 0.0 || gpu == 1.0,
            "CUDA_VISIBLE_DEVICES names one declared slot"
        );
        assert!(trial["metrics"]["port"].as_f64().unwrap() >= 29500.0);
        let attempt = &trial["attempts"][0];
        assert_eq!(attempt["nodes"].as_array().unwrap().len(), 2);
        nodes_used.extend(
            attempt["nodes"]
                .as_array()
                .unwrap()
                .iter()
                .map(|node| node.as_str().unwrap().to_owned()),
        );
    }

    let rust = cluster.wait_finished(&rust_experiment, Duration::from_secs(120));
    assert_eq!(rust["state"], "succeeded", "{rust:#}");
    assert_eq!(trials(&rust).len(), 6);
    for trial in trials(&rust) {
        assert_eq!(trial["state"], "succeeded", "{trial:#}");
        assert_eq!(trial["last_step"], 4);
        let x = trial["config"]["x"].as_f64().unwrap();
        let expected = (x - 3.0).powi(2) * 0.6f64.powi(8);
        assert!(
            (trial["metrics"]["loss"].as_f64().unwrap() - expected).abs() < 1e-9 * (1.0 + expected)
        );
        nodes_used.extend(
            trial["attempts"][0]["nodes"]
                .as_array()
                .unwrap()
                .iter()
                .map(|node| node.as_str().unwrap().to_owned()),
        );
    }
    assert_eq!(nodes_used.len(), 2, "both nodes ran work");

    let first_trial = trials(&commands)[0]["id"].as_str().unwrap().to_owned();
    let log = cluster.must_xp(&["logs", &first_trial, "--rank", "1"]);
    assert!(
        log.contains("XP_METRIC") && log.contains("\"rank\": 1"),
        "rank 1's log: {log}"
    );
}

#[test]
fn a_node_killed_mid_sweep_has_its_trials_retried_on_the_other() {
    let mut cluster = TestCluster::start("2s");
    cluster.start_node("a", 0, 2);
    cluster.start_node("b", 0, 2);
    cluster.wait_for_nodes(2);
    let node_b = node_ids_by_name(&cluster)
        .into_iter()
        .find(|(name, _)| name == "b")
        .expect("node b")
        .1;
    let spec = cluster.write_file(
        "slow.yaml",
        "name: slow\ntrial:\n  command: [sh, -c, 'echo \"XP_METRIC {\\\"step\\\": 1, \\\"i\\\": {i}}\"; sleep 3']\n  resources: {cpu: 1}\nsearch:\n  algorithm: grid\n  space: {i: {int: [1, 6]}}\n",
    );
    let experiment = cluster
        .must_xp(&["submit", spec.to_str().unwrap()])
        .trim()
        .to_owned();
    wait_until("a trial running on node b", Duration::from_secs(60), || {
        let status = cluster.status(&experiment);
        trials(&status)
            .iter()
            .any(|trial| {
                trial["state"] == "running"
                    && trial["attempts"].as_array().unwrap().last().unwrap()["nodes"][0]
                        == node_b.as_str()
            })
            .then_some(())
    });
    cluster.kill_node("b");

    let status = cluster.wait_finished(&experiment, Duration::from_secs(120));
    assert_eq!(status["state"], "succeeded", "{status:#}");
    let retried: Vec<&Value> = trials(&status)
        .iter()
        .filter(|trial| trial["attempts"].as_array().unwrap().len() > 1)
        .collect();
    assert!(
        !retried.is_empty(),
        "the trials of the killed node were retried: {status:#}"
    );
    for trial in &retried {
        assert_eq!(trial["state"], "succeeded");
        let first = &trial["attempts"][0];
        assert_eq!(first["nodes"][0], node_b.as_str());
        assert!(
            first["outcome"].as_str().unwrap().contains("lost"),
            "{first:#}"
        );
        assert_ne!(
            trial["attempts"].as_array().unwrap().last().unwrap()["nodes"][0],
            node_b.as_str()
        );
    }
}

#[test]
fn a_head_killed_and_restarted_loses_nothing_it_acknowledged() {
    let mut cluster = TestCluster::start("10s");
    cluster.start_node("a", 0, 2);
    cluster.wait_for_nodes(1);
    let spec = cluster.write_file(
        "steps.yaml",
        "name: steps\ntrial:\n  command: [sh, -c, 'for s in 1 2 3; do echo \"XP_METRIC {\\\"step\\\": $s, \\\"v\\\": {v}}\"; sleep 0.4; done']\n  resources: {cpu: 1}\nsearch:\n  algorithm: grid\n  space: {v: {int: [1, 8]}}\n",
    );
    let experiment = cluster
        .must_xp(&["submit", spec.to_str().unwrap()])
        .trim()
        .to_owned();
    let before = wait_until("three finished trials", Duration::from_secs(60), || {
        let status = cluster.status(&experiment);
        let finished = trials(&status)
            .iter()
            .filter(|trial| trial["state"] == "succeeded")
            .count();
        (finished >= 3).then_some(status)
    });
    cluster.kill_head();
    cluster.restart_head();

    let after = cluster.wait_finished(&experiment, Duration::from_secs(120));
    assert_eq!(after["state"], "succeeded", "{after:#}");
    for (old, new) in trials(&before).iter().zip(trials(&after)) {
        assert_eq!(old["id"], new["id"]);
        assert_eq!(old["config"], new["config"]);
        let old_attempts = old["attempts"].as_array().unwrap();
        let new_attempts = new["attempts"].as_array().unwrap();
        assert!(
            new_attempts.len() >= old_attempts.len(),
            "attempts were lost: {old:#} -> {new:#}"
        );
        for (old_attempt, new_attempt) in old_attempts.iter().zip(new_attempts) {
            assert_eq!(old_attempt["number"], new_attempt["number"]);
            assert_eq!(old_attempt["placed_at_ms"], new_attempt["placed_at_ms"]);
        }
        if old["state"] == "succeeded" {
            assert_eq!(old, new, "a finished trial changed across the restart");
        }
        for (name, value) in old["metrics"].as_object().unwrap() {
            assert!(
                new["metrics"].get(name).is_some(),
                "metric {name} ({value}) was lost"
            );
        }
        assert_eq!(new["metrics"]["v"], new["config"]["v"].as_f64().unwrap());
        assert_eq!(new["last_step"], 3);
    }
}
