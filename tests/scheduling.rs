//! End-to-end scheduling with real processes: two teams share a cohort, one
//! borrows the other's idle GPU and gives it back when the lender needs it, and a
//! high-priority trial preempts a low-priority one, which is requeued and
//! finishes later; fractional-GPU trials share one GPU; of two running trials
//! of one priority, the one that checkpointed most recently is the one a
//! higher-priority trial preempts.

mod common;

use std::time::Duration;

use common::{TestCluster, trials, wait_until};
use serde_json::Value;

const POLICY: &str = "\
queues:
  - {name: qa, team: a, cohort: lab, quota: {gpu: 1}}
  - {name: qb, team: b, cohort: lab, quota: {gpu: 1}}
priority_classes: {low: 0, high: 100}
preemption: {grace_period: 1s, min_run_time: 0s}
";

fn queue(cluster: &TestCluster, name: &str) -> Value {
    cluster
        .must_xp(&["queue", "--json"])
        .lines()
        .map(|line| serde_json::from_str::<Value>(line).expect("a JSON queue"))
        .find(|queue| queue["name"] == name)
        .unwrap_or_else(|| panic!("no queue {name}"))
}

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

/// The attempts of `experiment`'s trials that ended preempted, and the reasons the
/// events gave.
fn preempted_attempts(status: &Value) -> usize {
    trials(status)
        .iter()
        .flat_map(|trial| trial["attempts"].as_array().cloned().unwrap_or_default())
        .filter(|attempt| attempt["outcome"] == "preempted")
        .count()
}

#[test]
fn cohorts_lend_and_reclaim_and_priority_preempts_then_requeues() {
    let mut cluster = TestCluster::start_with_policy("10s", Some(POLICY));
    cluster.start_node("n1", 2, 4);
    cluster.wait_for_nodes(1);

    // Team a takes both GPUs: its own quota and b's idle one.
    let borrower = submit(
        &cluster,
        "borrower",
        "name: borrower\nteam: a\ntrial:\n  command: [sleep, '{s}']\n  resources: {gpu: 1}\nsearch:\n  algorithm: grid\n  space: {s: {choice: [6, 7]}}\n",
    );
    wait_until("team a to borrow b's GPU", Duration::from_secs(60), || {
        let qa = queue(&cluster, "qa");
        (qa["running"] == 2 && qa["borrowed"]["gpu"].as_f64() == Some(1.0)).then_some(())
    });

    // Team b wants its GPU back: one of a's trials is preempted and requeued.
    let lender = submit(
        &cluster,
        "lender",
        "name: lender\nteam: b\ntrial:\n  command: [sleep, '1']\n  resources: {gpu: 1}\n",
    );
    let lender_done = cluster.wait_finished(&lender, Duration::from_secs(90));
    assert_eq!(lender_done["state"], "succeeded", "{lender_done:#}");
    let borrower_done = cluster.wait_finished(&borrower, Duration::from_secs(120));
    assert_eq!(borrower_done["state"], "succeeded", "{borrower_done:#}");
    assert_eq!(
        preempted_attempts(&borrower_done),
        1,
        "exactly one borrowed trial gives the GPU back: {borrower_done:#}"
    );

    // Priority: a low-priority sweep fills the node, a high-priority trial arrives.
    let low = submit(
        &cluster,
        "low",
        "name: low\nteam: a\npriority: low\ntrial:\n  command: [sleep, '{s}']\n  resources: {gpu: 1}\nsearch:\n  algorithm: grid\n  space: {s: {choice: [8, 9]}}\n",
    );
    wait_until("the low sweep to run", Duration::from_secs(60), || {
        (states(&cluster, &low) == ["running", "running"]).then_some(())
    });
    let high = submit(
        &cluster,
        "high",
        "name: high\nteam: a\npriority: high\ntrial:\n  command: [sleep, '2']\n  resources: {gpu: 1}\n",
    );
    let high_done = cluster.wait_finished(&high, Duration::from_secs(90));
    assert_eq!(high_done["state"], "succeeded", "{high_done:#}");
    let low_done = cluster.wait_finished(&low, Duration::from_secs(120));
    assert_eq!(low_done["state"], "succeeded", "{low_done:#}");
    assert_eq!(
        preempted_attempts(&low_done),
        1,
        "one low trial made room, then finished later: {low_done:#}"
    );
    // The high trial started before the preempted low trial's second attempt ended.
    let high_started = trials(&high_done)[0]["attempts"][0]["placed_at_ms"]
        .as_u64()
        .expect("placed_at_ms");
    let requeued_end = trials(&low_done)
        .iter()
        .filter_map(|trial| trial["attempts"].as_array())
        .filter(|attempts| attempts.len() == 2)
        .map(|attempts| attempts[1]["ended_at_ms"].as_u64().expect("ended_at_ms"))
        .next()
        .expect("a low trial with two attempts");
    assert!(high_started < requeued_end);
}

/// Four quarter-GPU trials share one GPU at once, each told its share.
#[test]
fn fractional_gpu_trials_share_one_gpu() {
    let mut cluster = TestCluster::start("10s");
    cluster.start_node("n1", 1, 4);
    cluster.wait_for_nodes(1);
    let experiment = submit(
        &cluster,
        "quarters",
        "name: quarters\ntrial:\n  command: [sh, -c, 'echo \"XP_METRIC {\\\"f\\\": $XP_GPU_FRACTION}\"; sleep {s}']\n  resources: {gpu: 0.25, cpu: 0.5}\nsearch:\n  algorithm: grid\n  space: {s: {choice: [3, 3.1, 3.2, 3.3]}}\n",
    );
    wait_until("four trials on one GPU", Duration::from_secs(60), || {
        (states(&cluster, &experiment)
            .iter()
            .filter(|state| *state == "running")
            .count()
            == 4)
            .then_some(())
    });
    let done = cluster.wait_finished(&experiment, Duration::from_secs(60));
    assert_eq!(done["state"], "succeeded", "{done:#}");
    for trial in trials(&done) {
        assert_eq!(trial["metrics"]["f"], 0.25, "{trial:#}");
    }
}

/// A team at its pending limit is told to retry later: the command line says so
/// at once, and the SDK waits and retries by itself until there is room.
#[test]
fn a_busy_team_is_told_to_retry_and_the_sdk_retries_by_itself() {
    let cluster = TestCluster::start_with_policy(
        "10s",
        Some("admission: {max_pending_per_team: 1, retry_after: 1s}\n"),
    );
    // No node joins: the first experiment's trial stays pending.
    let first = submit(
        &cluster,
        "first",
        "name: first\ntrial:\n  command: [sleep, '1']\n",
    );
    let second_yaml = "name: second\ntrial:\n  command: [sleep, '2']\n";
    let second_path = cluster.write_file("second.yaml", second_yaml);
    let refused = cluster.xp(&["submit", second_path.to_str().expect("a UTF-8 path")]);
    assert!(!refused.status.success());
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert!(
        stderr.contains("pending") && stderr.contains("retry"),
        "{stderr}"
    );

    let join = cluster.join.clone();
    let driver = std::thread::spawn(move || {
        let runtime = tokio::runtime::Runtime::new().expect("a runtime");
        runtime.block_on(async {
            let client = xp::Client::connect(&join).await.expect("connects");
            let spec = xp::ExperimentSpec::from_yaml(second_yaml).expect("a valid spec");
            client
                .submit(
                    &spec,
                    &xp::SubmitOptions {
                        admission_wait: Some(Duration::from_secs(60)),
                        ..xp::SubmitOptions::default()
                    },
                )
                .await
        })
    });
    // Room appears once the first experiment is cancelled, while the driver waits.
    #[expect(
        clippy::disallowed_methods,
        reason = "let the driver be refused at least once before there is room"
    )]
    std::thread::sleep(Duration::from_secs(2));
    assert_eq!(
        cluster.must_xp(&["cancel", &first]).trim(),
        "cancelled 1 trial(s)"
    );
    let submitted = driver
        .join()
        .expect("the driver thread")
        .expect("the SDK retried until the head accepted");
    assert!(!submitted.reused);
}

/// Priority classes and preemption with no minimum run: victims chosen by what
/// they would lose.
const COST_POLICY: &str = "\
priority_classes: {low: 0, high: 100}
preemption: {grace_period: 5s, min_run_time: 0s}
";

/// A low-priority trial that checkpoints every second.
const SAVER: &str = r#"name: saver
team: a
priority: low
trial:
  command: [sh, -c, 'i=0; while [ $i -lt 25 ]; do i=$((i+1)); echo $i > "$XP_CHECKPOINT_DIR/step"; echo "XP_CHECKPOINT {\"step\": $i}"; sleep 1; done']
  resources: {gpu: 1}
"#;

/// The newest checkpoint step the head recorded for `experiment`.
fn newest_checkpoint_step(cluster: &TestCluster, experiment: &str) -> Option<u64> {
    cluster
        .must_xp(&["checkpoints", experiment, "--json"])
        .lines()
        .filter_map(|line| serde_json::from_str::<Value>(line).ok())
        .filter_map(|checkpoint| checkpoint["step"].as_u64())
        .max()
}

/// Two low-priority trials run; the one started first checkpoints every
/// second, the other never. A high-priority trial needs one GPU: the
/// preemption takes the trial that checkpointed since the other started (it
/// loses a second of work), not the one started last (which would lose all of
/// its run, and which the rule before cost-aware victims picked).
#[test]
fn preemption_picks_the_victim_that_checkpointed_most_recently() {
    let mut cluster = TestCluster::start_with_policy("10s", Some(COST_POLICY));
    cluster.start_node("n1", 2, 4);
    cluster.wait_for_nodes(1);
    let saver = submit(&cluster, "saver", SAVER);
    wait_until(
        "the saver's first checkpoint",
        Duration::from_secs(60),
        || newest_checkpoint_step(&cluster, &saver).filter(|step| *step >= 1),
    );
    let idle = submit(
        &cluster,
        "idle",
        "name: idle\nteam: a\npriority: low\ntrial:\n  command: [sleep, '40']\n  resources: {gpu: 1}\n",
    );
    wait_until("the idle trial to run", Duration::from_secs(60), || {
        (states(&cluster, &idle) == ["running"]).then_some(())
    });
    // A checkpoint recorded after the idle trial started: the saver would now
    // lose less than the idle trial whatever the machine's pace.
    let before = newest_checkpoint_step(&cluster, &saver).unwrap_or(0);
    wait_until(
        "a checkpoint after the idle trial started",
        Duration::from_secs(60),
        || newest_checkpoint_step(&cluster, &saver).filter(|step| *step > before),
    );
    assert_eq!(states(&cluster, &saver), ["running"]);
    let high = submit(
        &cluster,
        "high",
        "name: high\nteam: a\npriority: high\ntrial:\n  command: [sleep, '1']\n  resources: {gpu: 1}\n",
    );
    let high_done = cluster.wait_finished(&high, Duration::from_secs(120));
    assert_eq!(high_done["state"], "succeeded", "{high_done:#}");
    let saver_done = cluster.wait_finished(&saver, Duration::from_secs(180));
    assert_eq!(saver_done["state"], "succeeded", "{saver_done:#}");
    assert_eq!(
        preempted_attempts(&saver_done),
        1,
        "the trial that checkpointed a moment ago made room: {saver_done:#}"
    );
    let idle_done = cluster.wait_finished(&idle, Duration::from_secs(180));
    assert_eq!(idle_done["state"], "succeeded", "{idle_done:#}");
    assert_eq!(
        preempted_attempts(&idle_done),
        0,
        "the trial that never checkpointed kept running: {idle_done:#}"
    );
}
