//! End-to-end: a trial's workers stay in their lane on the node's object channel
//! (issue 12). A Rust trainable (`lane_check` in `examples/trainables.rs`) asks
//! its node, through the SDK and the real channel, to store `/etc/passwd` and a
//! symlink to it, and to hand it another team's checkpoint object and an object
//! a driver that did not submit its experiment stored; each is refused, while
//! its own object and the one its experiment's driver shared come back.

mod common;

use std::time::Duration;

use common::{TestCluster, binary, trials};
use serde_json::Value;

/// Runs a checkpointing trial of another team to its end and returns the object
/// id of its kept checkpoint's file.
fn another_teams_checkpoint_object(cluster: &TestCluster) -> String {
    let yaml = "name: victim\nteam: others\ntrial:\n  entry: counter\n  resources: {cpu: 1, gpu: 1}\nsearch:\n  algorithm: grid\n  space:\n    steps: {choice: [4]}\n    every: {choice: [2]}\n    step_ms: {choice: [50]}\n    start: {choice: [0.5]}\n";
    let path = cluster.write_file("victim.yaml", yaml);
    let path = path.to_str().expect("a UTF-8 temporary path");
    let experiment = cluster.run_driver("examples/trainables", &["submit", "--spec", path]);
    let status = cluster.wait_finished(&experiment, Duration::from_secs(60));
    assert_eq!(status["state"], "succeeded", "{status:#}");
    let newest: Value = cluster
        .must_xp(&["checkpoints", &experiment, "--json"])
        .lines()
        .map(|line| serde_json::from_str(line).expect("a JSON checkpoint"))
        .next_back()
        .expect("the finished trial's checkpoint is kept");
    newest["files"][0]["object"]
        .as_str()
        .expect("a checkpoint file's object id")
        .to_owned()
}

#[test]
fn a_worker_stays_in_its_lane() {
    let mut cluster = TestCluster::start("10s");
    cluster.start_node_with("a", 2, 4, &[]);
    cluster.wait_for_nodes(1);
    let victim = another_teams_checkpoint_object(&cluster);
    let runtime = tokio::runtime::Runtime::new().expect("a runtime");
    let join = cluster.join.clone();
    let program = binary("examples/trainables");
    let (driver, stranger, experiment) = runtime.block_on(async {
        let driver = xp::Client::connect(&join).await.expect("connects");
        let stranger = xp::Client::connect(&join).await.expect("connects");
        let shared = driver.put(b"the driver's data").await.expect("put");
        let unshared = stranger.put(b"someone else's data").await.expect("put");
        let yaml = format!(
            "name: lane\nteam: tests\ntrial:\n  entry: lane_check\n  program: '{}'\n  resources: {{cpu: 1, gpu: 1}}\nsearch:\n  algorithm: grid\n  space:\n    victim: {{choice: ['{victim}']}}\n    shared: {{choice: ['{shared}']}}\n    unshared: {{choice: ['{unshared}']}}\n",
            program.display()
        );
        let spec = xp::ExperimentSpec::from_yaml(&yaml).expect("a valid spec");
        // Submitted on the connection that stored `shared`: that shares it.
        let submitted = driver
            .submit(&spec, &xp::SubmitOptions::default())
            .await
            .expect("submits");
        (driver, stranger, submitted.experiment.to_string())
    });
    // The connections stay open (their objects with them) while the trial runs.
    let status = cluster.wait_finished(&experiment, Duration::from_secs(120));
    runtime.block_on(async {
        driver.close().await;
        stranger.close().await;
    });
    assert_eq!(status["state"], "succeeded", "{status:#}");
    let metrics = &trials(&status)[0]["metrics"];
    for check in [
        "passwd_refused",
        "symlink_refused",
        "own_roundtrip",
        "victim_refused",
        "shared_read",
        "unshared_refused",
    ] {
        assert_eq!(metrics[check], 1.0, "{check}: {metrics:#}");
    }
    let log = cluster.node_log("a");
    assert!(
        log.contains("object put refused") && log.contains("object get refused"),
        "the node logged the refusals"
    );
}
