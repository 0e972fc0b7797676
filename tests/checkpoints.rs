//! End-to-end checkpoints with real processes: a deterministic Rust trainable is
//! preempted, loses its node to SIGKILL, and fails over a corrupted object; each
//! time it resumes from its checkpoint and ends exactly where an uninterrupted run
//! ends, having repeated at most one checkpoint interval. A node whose object
//! store is full refuses a checkpoint clearly and goes on working.

mod common;

use std::collections::BTreeSet;
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

fn counter_spec(extra_trial: &str, extra_space: &str, step_ms: u64) -> String {
    format!(
        "name: counter\nteam: tests\n{extra_trial}trial:\n  entry: counter\n  resources: {{cpu: 1, gpu: 1}}\n  max_retries: 1\nsearch:\n  algorithm: grid\n  space:\n    steps: {{choice: [{STEPS}]}}\n    every: {{choice: [{EVERY}]}}\n    step_ms: {{choice: [{step_ms}]}}\n    start: {{choice: [{START}]}}\n{extra_space}"
    )
}

/// Submits `yaml` through the trainables driver (so `entry: counter` resolves).
fn submit_driver(cluster: &TestCluster, yaml: &str) -> String {
    let path = cluster.write_file("counter.yaml", yaml);
    let path = path.to_str().expect("a UTF-8 temporary path");
    cluster.run_driver("examples/trainables", &["submit", "--spec", path])
}

fn checkpoints(cluster: &TestCluster, experiment: &str) -> Vec<Value> {
    cluster
        .must_xp(&["checkpoints", experiment, "--json"])
        .lines()
        .map(|line| serde_json::from_str(line).expect("a JSON checkpoint"))
        .collect()
}

/// Waits until the newest checkpoint is at `min_step` or later and held by `replicas` nodes.
fn wait_for_checkpoint(cluster: &TestCluster, experiment: &str, min_step: u64, replicas: usize) {
    wait_until(
        &format!("a checkpoint at step {min_step}+ on {replicas} node(s)"),
        Duration::from_secs(60),
        || {
            let newest = checkpoints(cluster, experiment).pop()?;
            (newest["step"].as_u64()? >= min_step
                && newest["replicas"].as_array()?.len() >= replicas)
                .then_some(())
        },
    );
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

/// Checks the resumed run: succeeded in two attempts, the second resumed on
/// `resumed_node` from a checkpoint at most one interval behind the first
/// attempt's progress, and ended exactly as an uninterrupted run.
/// With `exact`, the first attempt saved where it stopped (it checkpoints when asked
/// to stop), so nothing at all is redone.
fn check_resumed(cluster: &TestCluster, experiment: &str, resumed_node: &str, exact: bool) -> u64 {
    let status = cluster.wait_finished(experiment, Duration::from_secs(120));
    assert_eq!(status["state"], "succeeded", "{status:#}");
    let trial = &trials(&status)[0];
    let attempts = trial["attempts"].as_array().expect("attempts");
    assert_eq!(attempts.len(), 2, "{status:#}");
    assert!(attempts[0]["resumed_from"].is_null(), "{status:#}");
    assert_eq!(attempts[1]["nodes"][0], resumed_node, "{status:#}");
    let resumed = attempts[1]["resumed_from"]["step"]
        .as_u64()
        .unwrap_or_else(|| panic!("attempt 2 resumed from a checkpoint: {status:#}"));
    assert_eq!(attempts[1]["resumed_from"]["attempt"], 1);
    let reached = last_step_of_first_attempt(cluster, trial["id"].as_str().expect("id"));
    assert!(
        reached >= resumed && reached - resumed <= EVERY,
        "attempt 1 reached step {reached}; attempt 2 resumed from {resumed}: more than one interval redone"
    );
    if exact {
        assert_eq!(
            resumed, reached,
            "the stop-time checkpoint is the one resumed from"
        );
    }
    let final_value = trial["metrics"]["final"].as_f64().expect("a final value");
    assert_eq!(
        final_value.to_bits(),
        uninterrupted_final().to_bits(),
        "resumed {final_value} vs uninterrupted {}",
        uninterrupted_final()
    );
    resumed
}

/// A grace long enough that even a loaded machine saves the stop-time checkpoint
/// before SIGKILL; the counter leaves as soon as it has.
const PREEMPTION_POLICY: &str = "\
priority_classes: {low: 0, high: 100}
preemption: {grace_period: 20s, min_run_time: 0s}
";

#[test]
fn a_preempted_trial_resumes_on_the_other_node_and_ends_as_if_uninterrupted() {
    let mut cluster = TestCluster::start_with_policy("10s", Some(PREEMPTION_POLICY));
    cluster.start_node("a", 1, 2);
    cluster.wait_for_nodes(1);
    let low = submit_driver(&cluster, &counter_spec("priority: low\n", "", 60));
    wait_for_checkpoint(&cluster, &low, 10, 1);
    cluster.start_node("b", 1, 2);
    cluster.wait_for_nodes(2);
    // The high-priority trial wants node a, so the counter must make room there.
    let high_yaml = "name: high\nteam: tests\npriority: high\ntrial:\n  command: [sleep, '1']\n  resources: {cpu: 1, gpu: 1}\n  node_labels: {name: a}\n";
    let path = cluster.write_file("high.yaml", high_yaml);
    let high = cluster
        .must_xp(&["submit", path.to_str().expect("UTF-8")])
        .trim()
        .to_owned();
    let high_done = cluster.wait_finished(&high, Duration::from_secs(90));
    assert_eq!(high_done["state"], "succeeded", "{high_done:#}");
    check_resumed(&cluster, &low, &cluster.node_id("b"), true);
    let status = cluster.status(&low);
    assert_eq!(
        trials(&status)[0]["attempts"][0]["outcome"],
        "preempted",
        "{status:#}"
    );
}

#[test]
fn a_trial_whose_node_is_killed_resumes_from_the_replica() {
    let mut cluster = TestCluster::start("3s");
    cluster.start_node("a", 1, 2);
    cluster.wait_for_nodes(1);
    // Steps slow enough that a checkpoint reaches its replica (milliseconds on
    // loopback) long before the next step, even on a loaded machine.
    let experiment = submit_driver(&cluster, &counter_spec("", "", 200));
    wait_until("the counter to run", Duration::from_secs(60), || {
        (trials(&cluster.status(&experiment))[0]["state"] == "running").then_some(())
    });
    cluster.start_node("b", 1, 2);
    cluster.wait_for_nodes(2);
    // Replicated to b, which never ran the trial: only the replica can resume it.
    wait_for_checkpoint(&cluster, &experiment, 15, 2);
    cluster.kill_node("a");
    check_resumed(&cluster, &experiment, &cluster.node_id("b"), false);
}

#[test]
fn a_corrupted_checkpoint_object_is_repaired_from_the_replica() {
    let mut cluster = TestCluster::start("10s");
    cluster.start_node("a", 1, 2);
    cluster.start_node("b", 1, 2);
    cluster.wait_for_nodes(2);
    let flag = cluster.dir.path().join("fail-now");
    let experiment = submit_driver(
        &cluster,
        &counter_spec(
            "",
            &format!("    fail_flag: {{choice: ['{}']}}\n", flag.display()),
            // Slow enough that the status polls below see a step early in an
            // interval before the run ends, even on a loaded 2-core machine.
            300,
        )
        .replace(
            "  max_retries: 1\n",
            "  max_retries: 1\n  node_labels: {name: a}\n",
        ),
    );
    wait_for_checkpoint(&cluster, &experiment, 15, 2);
    // Early in an interval (at least two steps before the next checkpoint), so that
    // none is taken between the damage and the failure.
    wait_until(
        "a step early in a checkpoint interval",
        Duration::from_secs(30),
        || {
            let status = cluster.status(&experiment);
            let step = trials(&status)[0]["last_step"].as_u64()?;
            (1..=2).contains(&(step % EVERY)).then_some(())
        },
    );
    let objects = cluster.node_dir("a").join("objects");
    let mut damaged = BTreeSet::new();
    for entry in std::fs::read_dir(&objects).expect("node a's objects") {
        let path = entry.expect("entry").path();
        let name = path
            .file_name()
            .and_then(|name| name.to_str())
            .unwrap_or_default()
            .to_owned();
        if name.len() == 64 {
            use std::os::unix::fs::PermissionsExt;
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).expect("chmod");
            let mut bytes = std::fs::read(&path).expect("read");
            bytes[0] ^= 0xff;
            std::fs::write(&path, &bytes).expect("damage");
            damaged.insert(name);
        }
    }
    assert!(
        !damaged.is_empty(),
        "node a holds checkpoint objects on disk"
    );
    std::fs::write(&flag, b"fail").expect("flag");
    let resumed = check_resumed(&cluster, &experiment, &cluster.node_id("a"), false);
    // The checkpoint it resumed from was one of the damaged objects on node a.
    let restored: Vec<String> = checkpoints(&cluster, &experiment)
        .iter()
        .filter(|checkpoint| checkpoint["step"].as_u64() == Some(resumed))
        .flat_map(|checkpoint| checkpoint["files"].as_array().cloned().unwrap_or_default())
        .filter_map(|file| file["object"].as_str().map(str::to_owned))
        .collect();
    // Retention may have dropped it since; when kept, it must be a repaired one.
    for object in &restored {
        assert!(
            damaged.contains(object),
            "resumed from an undamaged object {object}"
        );
    }
    let log = cluster.node_log("a");
    assert!(
        log.contains("local copy unusable; fetching it again"),
        "node a noticed the damage"
    );
}

#[test]
fn a_full_object_store_refuses_a_checkpoint_clearly_and_nothing_else_breaks() {
    let mut cluster = TestCluster::start("10s");
    cluster.start_node_with(
        "a",
        0,
        2,
        &["--object-memory", "0", "--object-disk", "2KiB"],
    );
    cluster.wait_for_nodes(1);
    let writer = |name: &str, bytes: u32| {
        format!(
            "name: {name}\nteam: tests\ntrial:\n  command: [sh, -c, 'head -c {bytes} /dev/zero > \"$XP_CHECKPOINT_DIR/blob\"; echo \"XP_CHECKPOINT {{\\\"step\\\": 1}}\"; sleep 1; cat \"$XP_WORK_DIR/.checkpoint-status/1\"']\n  resources: {{cpu: 1}}\n"
        )
    };
    let path = cluster.write_file("big.yaml", &writer("big", 8192));
    let big = cluster
        .must_xp(&["submit", path.to_str().expect("UTF-8")])
        .trim()
        .to_owned();
    let done = cluster.wait_finished(&big, Duration::from_secs(60));
    assert_eq!(
        done["state"], "succeeded",
        "a refused checkpoint does not fail the trial: {done:#}"
    );
    let trial = trials(&done)[0]["id"].as_str().expect("id").to_owned();
    let log = cluster.must_xp(&["logs", &trial]);
    assert!(
        log.contains("error: checkpoint at step 1 not stored") && log.contains("store full"),
        "the writer is told why: {log}"
    );
    assert!(checkpoints(&cluster, &big).is_empty());
    // A checkpoint that fits is stored on the same node afterwards.
    let path = cluster.write_file("small.yaml", &writer("small", 100));
    let small = cluster
        .must_xp(&["submit", path.to_str().expect("UTF-8")])
        .trim()
        .to_owned();
    let done = cluster.wait_finished(&small, Duration::from_secs(60));
    assert_eq!(done["state"], "succeeded", "{done:#}");
    let stored = checkpoints(&cluster, &small);
    assert_eq!(stored.len(), 1, "{stored:?}");
    assert_eq!(stored[0]["bytes"], 100);
}

#[test]
fn a_worker_gets_an_object_another_node_put() {
    let mut cluster = TestCluster::start("10s");
    // Objects go straight to disk, where the test can see them collected.
    cluster.start_node_with("a", 1, 2, &["--object-memory", "0"]);
    cluster.start_node_with("b", 1, 2, &["--object-memory", "0"]);
    cluster.wait_for_nodes(2);
    let exchange = cluster.dir.path().join("object-id");
    // One GPU per node and one per rank: the two ranks run on different nodes.
    let yaml = format!(
        "name: objects\nteam: tests\ntrial:\n  entry: objects_check\n  workers: 2\n  resources: {{cpu: 1, gpu: 1}}\nsearch:\n  algorithm: grid\n  space:\n    size: {{choice: [20000000]}}\n    exchange: {{choice: ['{}']}}\n",
        exchange.display()
    );
    let experiment = submit_driver(&cluster, &yaml);
    let status = cluster.wait_finished(&experiment, Duration::from_secs(120));
    assert_eq!(status["state"], "succeeded", "{status:#}");
    let trial = &trials(&status)[0];
    let nodes = trial["attempts"][0]["nodes"].as_array().expect("nodes");
    assert_ne!(
        nodes[0], nodes[1],
        "the ranks ran on different nodes: {status:#}"
    );
    let id = std::fs::read_to_string(&exchange).expect("the id");
    let log = cluster.node_log(if nodes[1] == cluster.node_id("a").as_str() {
        "a"
    } else {
        "b"
    });
    assert!(
        log.contains("object fetched") && log.contains(id.trim()),
        "rank 1's node fetched the object from rank 0's"
    );
    // The trial ended: its object is collected on both nodes.
    for name in ["a", "b"] {
        let path = cluster.node_dir(name).join("objects").join(id.trim());
        let log_path = cluster.node_log_path(name);
        wait_until(
            &format!("node {name} to collect the trial's object"),
            Duration::from_secs(30),
            || {
                let log = std::fs::read_to_string(&log_path).ok()?;
                (log.contains("collected the objects of a finished owner") && !path.exists())
                    .then_some(())
            },
        );
    }
}

#[test]
fn a_backed_up_checkpoint_survives_losing_its_only_node() {
    let mut cluster = TestCluster::start("3s");
    let backup = cluster.dir.path().join("backup");
    let backup_arg = backup.to_str().expect("UTF-8").to_owned();
    cluster.start_node_with("a", 1, 2, &["--checkpoint-backup", &backup_arg]);
    cluster.wait_for_nodes(1);
    let experiment = submit_driver(&cluster, &counter_spec("", "", 100));
    wait_until("a backed-up checkpoint", Duration::from_secs(60), || {
        let newest = checkpoints(&cluster, &experiment).pop()?;
        (newest["step"].as_u64()? >= 10 && newest["backup"].as_str() == Some(backup_arg.as_str()))
            .then_some(())
    });
    // The only node that held it is gone; a new machine with the same backup joins.
    cluster.kill_node("a");
    cluster.start_node_with("c", 1, 2, &["--checkpoint-backup", &backup_arg]);
    check_resumed(&cluster, &experiment, &cluster.node_id("c"), false);
    let log = cluster.node_log("c");
    assert!(
        log.contains("checkpoint object restored from the backup"),
        "node c read the backup"
    );
}

#[test]
fn a_driver_puts_and_gets_objects_and_they_go_with_its_connection() {
    let mut cluster = TestCluster::start("10s");
    cluster.start_node_with("a", 0, 2, &["--object-memory", "0"]);
    cluster.wait_for_nodes(1);
    let objects = cluster.node_dir("a").join("objects");
    let runtime = tokio::runtime::Runtime::new().expect("a runtime");
    let join = cluster.join.clone();
    let (kept, dropped) = runtime.block_on(async {
        let driver = xp::Client::connect(&join).await.expect("connects");
        let bytes: Vec<u8> = (0..3_000_000u32).map(|index| (index % 253) as u8).collect();
        let id = driver.put(&bytes).await.expect("put");
        assert_eq!(id, xp::ObjectId::of(&bytes));
        assert!(
            objects.join(id.to_string()).exists(),
            "stored on the node's disk"
        );
        // Another connection reads it by id.
        let reader = xp::Client::connect(&join).await.expect("connects");
        assert_eq!(reader.get(id).await.expect("get"), bytes);
        let missing = reader
            .get(xp::ObjectId::of(b"never put"))
            .await
            .expect_err("absent");
        assert!(
            missing.to_string().contains("no live node holds"),
            "{missing}"
        );
        assert!(
            driver.delete(id).await.expect("delete"),
            "the driver had a claim"
        );
        assert!(
            !objects.join(id.to_string()).exists(),
            "its only claim is gone"
        );
        // What the driver still holds when it goes away is collected.
        let kept = driver.put(b"left behind").await.expect("put");
        driver.close().await;
        reader.close().await;
        (kept, id)
    });
    assert_ne!(kept, dropped);
    let path = objects.join(kept.to_string());
    wait_until(
        "the driver's objects to be collected",
        Duration::from_secs(30),
        || (!path.exists()).then_some(()),
    );
}
