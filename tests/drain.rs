//! End-to-end drain, as the end of a Slurm job causes it: a node that gets
//! SIGTERM tells the head it is leaving, stops its running trial so that it
//! checkpoints where it is, waits until the head has stored its end, and exits
//! cleanly; the head marks it lost at once (not after the heartbeat timeout) and
//! requeues the trial without using a retry, and the trial resumes on a node that
//! joins later from the checkpoint taken at the drain, read from the backup
//! directory, ending exactly as an uninterrupted run; an idle node's SIGTERM is
//! heard as a departure too. `scripts/slurm-e2e.sh` runs the same under real Slurm.

mod common;

use std::time::Duration;

use common::{TestCluster, trials, wait_until};
use serde_json::Value;

const STEPS: u64 = 60;
const EVERY: u64 = 5;
const START: f64 = 0.5;

/// What an uninterrupted run ends with (the recurrence of `examples/trainables.rs`).
fn uninterrupted_final() -> f64 {
    (1..=STEPS).fold(START, |value, step| value * 0.999 + (step as f64).sin())
}

/// The trial's last step reported by attempt 1.
fn last_step_of_first_attempt(cluster: &TestCluster, trial: &str) -> u64 {
    let line = cluster.must_xp(&["metrics", trial, "--name", "attempt", "--json"]);
    let series: Value = serde_json::from_str(line.trim()).expect("metric JSON");
    let steps = series["steps"].as_array().expect("steps");
    let values = series["values"].as_array().expect("values");
    steps
        .iter()
        .zip(values)
        .filter(|(_, attempt)| attempt.as_f64() == Some(1.0))
        .filter_map(|(step, _)| step.as_u64())
        .max()
        .expect("attempt 1 reported steps")
}

fn node_state(cluster: &TestCluster, node_id: &str) -> Option<String> {
    cluster
        .must_xp(&["nodes", "--json"])
        .lines()
        .filter_map(|line| serde_json::from_str::<Value>(line).ok())
        .find(|node| node["id"] == node_id)
        .and_then(|node| node["state"].as_str().map(str::to_owned))
}

#[test]
fn a_terminated_node_drains_its_trial_to_a_later_node_without_a_retry() {
    // A heartbeat timeout far beyond the test: only the drain can make the
    // head give the node up.
    let mut cluster = TestCluster::start("600s");
    let backup = cluster.dir.path().join("backup");
    let backup = backup.to_str().expect("UTF-8").to_owned();
    let node_args = [
        "--checkpoint-backup",
        backup.as_str(),
        "--drain-timeout",
        "15s",
    ];
    cluster.start_node_with("a", 1, 2, &node_args);
    cluster.wait_for_nodes(1);
    let node_a = cluster.node_id("a");
    let experiment = must_run_counter_past_a_checkpoint(&cluster);
    check_drain_requeues_without_a_retry(&mut cluster, &experiment, &node_a);
    // A later node (the next Slurm job) with the same backup finishes it.
    cluster.start_node_with("b", 1, 2, &node_args);
    check_later_node_resumes_from_the_drain(&cluster, &experiment, &node_a);
    // An idle node leaves at once too, and the head hears it leave.
    check_idle_node_leaves_at_once(&mut cluster);
}

/// Submits the counter (no retry allowed: a drain must not use one) and waits
/// until it has checkpointed at step 10; the experiment.
fn must_run_counter_past_a_checkpoint(cluster: &TestCluster) -> String {
    let yaml = format!(
        "name: drain\nteam: tests\ntrial:\n  entry: counter\n  resources: {{cpu: 1, gpu: 1}}\n  max_retries: 0\nsearch:\n  algorithm: grid\n  space:\n    steps: {{choice: [{STEPS}]}}\n    every: {{choice: [{EVERY}]}}\n    step_ms: {{choice: [100]}}\n    start: {{choice: [{START}]}}\n"
    );
    let path = cluster.write_file("drain.yaml", &yaml);
    let experiment = cluster.run_driver(
        "examples/trainables",
        &["submit", "--spec", path.to_str().expect("UTF-8")],
    );
    wait_until("a checkpoint at step 10", Duration::from_secs(60), || {
        let status = cluster.status(&experiment);
        (trials(&status)[0]["last_step"].as_u64()? >= 10).then_some(())
    });
    experiment
}

/// SIGTERM: node `a` drains (exits cleanly once the head stored its worker's
/// end), the head marks it lost at once, and the trial is queued again with
/// its one attempt.
fn check_drain_requeues_without_a_retry(cluster: &mut TestCluster, experiment: &str, node_a: &str) {
    let exit = cluster.terminate_node("a");
    assert!(
        exit.success(),
        "the node exits cleanly after draining: {exit:?}"
    );
    let log = cluster.node_log("a");
    assert!(
        log.contains("drained: every worker stopped and its end stored by the head"),
        "the node left only once the head had stored its worker's end:\n{log}"
    );
    wait_until(
        "the head to mark the drained node lost",
        Duration::from_secs(30),
        || (node_state(cluster, node_a)? == "lost").then_some(()),
    );
    let status = cluster.status(experiment);
    let trial = &trials(&status)[0];
    assert_eq!(trial["state"], "queued", "requeued, not failed: {status:#}");
    assert_eq!(
        trial["attempts"].as_array().map(Vec::len),
        Some(1),
        "{status:#}"
    );
}

/// Node `b` finishes the trial from the checkpoint taken at the drain, read
/// from the backup, ending exactly as an uninterrupted run.
fn check_later_node_resumes_from_the_drain(cluster: &TestCluster, experiment: &str, node_a: &str) {
    let status = cluster.wait_finished(experiment, Duration::from_secs(120));
    assert_eq!(status["state"], "succeeded", "{status:#}");
    let trial = &trials(&status)[0];
    let attempts = trial["attempts"].as_array().expect("attempts");
    assert_eq!(attempts.len(), 2, "{status:#}");
    assert_eq!(attempts[0]["nodes"][0], node_a, "{status:#}");
    assert_eq!(
        attempts[1]["nodes"][0],
        cluster.node_id("b").as_str(),
        "{status:#}"
    );
    let resumed = attempts[1]["resumed_from"]["step"]
        .as_u64()
        .unwrap_or_else(|| panic!("attempt 2 resumed from a checkpoint: {status:#}"));
    let reached = last_step_of_first_attempt(cluster, trial["id"].as_str().expect("id"));
    assert_eq!(
        resumed, reached,
        "the checkpoint taken at the drain is the one resumed from: nothing is redone"
    );
    assert_eq!(
        trial["metrics"]["final"].as_f64().map(f64::to_bits),
        Some(uninterrupted_final().to_bits()),
        "{status:#}"
    );
    assert!(
        cluster
            .node_log("b")
            .contains("checkpoint object restored from the backup"),
        "node b read the checkpoint from the backup, as its only other holder left"
    );
}

/// An idle node's SIGTERM: it exits cleanly at once, and the head hears it leave.
fn check_idle_node_leaves_at_once(cluster: &mut TestCluster) {
    let node_b = cluster.node_id("b");
    let exit = cluster.terminate_node("b");
    assert!(exit.success(), "the idle node exits cleanly: {exit:?}");
    wait_until(
        "the head to mark the idle node lost",
        Duration::from_secs(30),
        || (node_state(cluster, &node_b)? == "lost").then_some(()),
    );
}
