//! End-to-end oversubscription of fractional GPUs with real processes: under a
//! policy of `oversubscription: 1.5`, three checkpointing trials asking
//! `gpu: 0.45, oversubscribe: true` run at once on one GPU (1.35 GPUs
//! promised) beside a small trial that did not opt in; when the node's GPU
//! memory (a stand-in `--gpu-memory-file`, since these machines have no NVML)
//! reaches 97%, the youngest oversubscribed trial is evicted through its
//! checkpoint, requeued without using a retry (`max_retries: 0`), and ends
//! exactly where an uninterrupted run ends, the eviction shown by `xp status`,
//! its events and `/metrics`; the trial that did not opt in is
//! never evicted, even at 99%. A spec opting in on whole GPUs is refused.

mod common;

use std::path::Path;
use std::time::Duration;

use common::{TestCluster, free_tcp_port, http_exchange, trials, wait_until};
use serde_json::Value;

const STEPS: u64 = 400;
const EVERY: u64 = 5;
const STEP_MS: u64 = 100;
const GIB: u64 = 1 << 30;
const TOTAL: u64 = 80 * GIB;

/// What an uninterrupted `counter` run from `start` ends with (see
/// `examples/trainables.rs`), bit for bit: the value crosses JSON twice (the
/// worker's metric line read by its node, the status read by this test), and
/// serde_json's `float_roundtrip` reads back exactly what was written.
fn uninterrupted_final(start: f64) -> f64 {
    (1..=STEPS).fold(start, |value, step| value * 0.999 + (step as f64).sin())
}

fn start_of(index: usize) -> f64 {
    0.5 + index as f64
}

fn counter_spec(index: usize) -> String {
    format!(
        "name: over{index}\nteam: tests\ntrial:\n  entry: counter\n  resources: {{gpu: 0.45, oversubscribe: true}}\n  max_retries: 0\nsearch:\n  algorithm: grid\n  space:\n    steps: {{choice: [{STEPS}]}}\n    every: {{choice: [{EVERY}]}}\n    step_ms: {{choice: [{STEP_MS}]}}\n    start: {{choice: [{}]}}\n",
        start_of(index)
    )
}

/// Says the GPU's memory in use is `percent` of 80 GiB, replacing the file in
/// one step so the node never reads half of it.
fn set_gpu_memory(file: &Path, percent: u64) {
    let temporary = file.with_extension("tmp");
    std::fs::write(&temporary, format!("0 {} {TOTAL}\n", TOTAL / 100 * percent))
        .expect("write the GPU memory file");
    std::fs::rename(&temporary, file).expect("replace the GPU memory file");
}

fn trial_of(cluster: &TestCluster, experiment: &str) -> Value {
    trials(&cluster.status(experiment))[0].clone()
}

fn wait_running(cluster: &TestCluster, experiment: &str) {
    wait_until(
        &format!("{experiment} to run"),
        Duration::from_secs(90),
        || (trial_of(cluster, experiment)["state"] == "running").then_some(()),
    );
}

/// Waits until `experiment`'s trial has stored a checkpoint at `min_step` or later.
fn wait_for_checkpoint(cluster: &TestCluster, experiment: &str, min_step: u64) {
    wait_until(
        &format!("a checkpoint of {experiment} at step {min_step}+"),
        Duration::from_secs(60),
        || {
            let newest = cluster
                .must_xp(&["checkpoints", experiment, "--json"])
                .lines()
                .filter_map(|line| serde_json::from_str::<Value>(line).ok())
                .filter_map(|checkpoint| checkpoint["step"].as_u64())
                .max()?;
            (newest >= min_step).then_some(())
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

/// Every event reason of `experiment`.
fn event_reasons(cluster: &TestCluster, experiment: &str) -> Vec<String> {
    tokio::runtime::Runtime::new()
        .expect("a runtime")
        .block_on(async {
            let client = xp::Client::connect(&cluster.join).await.expect("connects");
            let id = experiment.parse().expect("an experiment id");
            let events = client
                .events(id, 0, Duration::ZERO)
                .await
                .expect("the events");
            client.close().await;
            events.into_iter().map(|event| event.reason).collect()
        })
}

#[test]
fn the_youngest_oversubscribed_trial_is_evicted_through_its_checkpoint_and_resumes() {
    let policy_dir = tempfile::tempdir().expect("a directory for the policy");
    let policy = policy_dir.path().join("policy.yaml");
    std::fs::write(&policy, "oversubscription: 1.5\n").expect("policy");
    let policy_arg = policy.display().to_string();
    let http = format!("127.0.0.1:{}", free_tcp_port());
    let mut cluster =
        TestCluster::start_prepared("10s", &["--http", &http, "--policy", &policy_arg], |_| {});
    let memory_file = cluster.write_file("gpu-memory", "");
    set_gpu_memory(&memory_file, 10);
    let memory_arg = memory_file.to_str().expect("a UTF-8 path").to_owned();
    cluster.start_node_with(
        "n1",
        1,
        8,
        &[
            "--gpu-memory-file",
            &memory_arg,
            "--telemetry-interval",
            "200ms",
        ],
    );
    cluster.wait_for_nodes(1);

    check_whole_gpus_cannot_opt_in(&cluster);
    let (counters, plain) = must_promise_more_than_the_gpu(&cluster);
    // Memory reaches 97%: the youngest opted-in trial (over2) is evicted.
    let youngest = &counters[2];
    check_youngest_is_evicted(&cluster, &memory_file, youngest);
    // Everything ends; only the evicted trial ran twice, resuming exactly
    // where its stop-time checkpoint left it, with no retry to spend.
    check_all_end_the_evicted_resumed(&cluster, &counters, &plain);
    // The eviction is in `xp status`, the trial's events, the node's log and /metrics.
    check_eviction_is_shown(&cluster, &http, youngest);
    // At 99% a trial that did not opt in runs to its end.
    check_plain_trial_runs_at_99_percent(&cluster, &memory_file);
}

/// Opting in on whole GPUs is refused before anything is submitted.
fn check_whole_gpus_cannot_opt_in(cluster: &TestCluster) {
    let whole = cluster.write_file(
        "whole.yaml",
        "name: whole\ntrial:\n  command: [sleep, '1']\n  resources: {gpu: 2, oversubscribe: true}\n",
    );
    let refused = cluster.xp(&["submit", whole.to_str().expect("UTF-8")]);
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert!(!refused.status.success());
    assert!(
        stderr.contains("trial.resources.oversubscribe")
            && stderr.contains("needs a fraction of one GPU (0 < gpu < 1)"),
        "{stderr}"
    );
}

/// Three opted-in trials, started one after another so the youngest is
/// known, and a plain one: all four run at once, more than the whole GPU
/// promised. The three counters' experiments and the plain one.
fn must_promise_more_than_the_gpu(cluster: &TestCluster) -> (Vec<String>, String) {
    // 0.45 / 1.5 = 0.3 of the GPU each, so all three fit.
    let mut counters = Vec::new();
    for index in 0..3 {
        let path = cluster.write_file(&format!("over{index}.yaml"), &counter_spec(index));
        let experiment = cluster.run_driver(
            "examples/trainables",
            &["submit", "--spec", path.to_str().expect("UTF-8")],
        );
        wait_running(cluster, &experiment);
        counters.push(experiment);
    }
    // A trial that did not opt in starts last: the youngest of all, yet never
    // a candidate (0.9 + 0.1 fills the GPU exactly).
    let plain_path = cluster.write_file(
        "plain.yaml",
        "name: plain\nteam: tests\ntrial:\n  command: [sleep, '8']\n  resources: {gpu: 0.1}\n  max_retries: 0\n",
    );
    let plain = cluster
        .must_xp(&["submit", plain_path.to_str().expect("UTF-8")])
        .trim()
        .to_owned();
    wait_running(cluster, &plain);
    for experiment in &counters {
        wait_for_checkpoint(cluster, experiment, EVERY);
    }
    // All four run at once: more than the whole GPU is promised.
    for experiment in counters.iter().chain([&plain]) {
        let trial = trial_of(cluster, experiment);
        assert_eq!(trial["state"], "running", "{experiment}: {trial:#}");
        assert_eq!(trial["attempts"].as_array().map(Vec::len), Some(1));
    }
    (counters, plain)
}

/// With the GPU's memory at 97%, the youngest opted-in trial is evicted (and
/// its memory given back), saying why.
fn check_youngest_is_evicted(cluster: &TestCluster, memory_file: &Path, youngest: &str) {
    set_gpu_memory(memory_file, 97);
    let outcome = wait_until(
        "the youngest oversubscribed trial to be evicted",
        Duration::from_secs(60),
        || {
            trial_of(cluster, youngest)["attempts"][0]["outcome"]
                .as_str()
                .map(str::to_owned)
        },
    );
    // The evicted worker's memory is given back.
    set_gpu_memory(memory_file, 50);
    assert!(
        outcome.starts_with("evicted: ")
            && outcome.contains("for GPU memory: GPU 0 had 97.0% in use"),
        "{outcome}"
    );
}

/// Every trial succeeds with the final value of an uninterrupted run; only the
/// evicted one ran twice, resuming from the checkpoint saved on eviction.
fn check_all_end_the_evicted_resumed(cluster: &TestCluster, counters: &[String], plain: &str) {
    for (index, experiment) in counters.iter().enumerate() {
        let status = cluster.wait_finished(experiment, Duration::from_secs(120));
        assert_eq!(status["state"], "succeeded", "{status:#}");
        let trial = &trials(&status)[0];
        let attempts = trial["attempts"].as_array().expect("attempts");
        let final_value = trial["metrics"]["final"].as_f64().expect("a final value");
        assert_eq!(
            final_value.to_bits(),
            uninterrupted_final(start_of(index)).to_bits(),
            "{experiment}: {final_value} vs {}",
            uninterrupted_final(start_of(index))
        );
        if index < 2 {
            assert_eq!(attempts.len(), 1, "{status:#}");
            continue;
        }
        assert_eq!(attempts.len(), 2, "{status:#}");
        let resumed = attempts[1]["resumed_from"]["step"]
            .as_u64()
            .unwrap_or_else(|| panic!("attempt 2 resumed from a checkpoint: {status:#}"));
        assert_eq!(attempts[1]["resumed_from"]["attempt"], 1);
        let reached = last_step_of_first_attempt(cluster, trial["id"].as_str().expect("id"));
        assert_eq!(
            resumed, reached,
            "the checkpoint saved on eviction is the one resumed from"
        );
        assert!((EVERY..STEPS).contains(&resumed), "{resumed}");
    }
    let plain_done = cluster.wait_finished(plain, Duration::from_secs(60));
    assert_eq!(plain_done["state"], "succeeded", "{plain_done:#}");
    assert_eq!(
        trials(&plain_done)[0]["attempts"].as_array().map(Vec::len),
        Some(1)
    );
}

/// The eviction in `xp status`, the trial's events, the node's log and /metrics.
fn check_eviction_is_shown(cluster: &TestCluster, http: &str, youngest: &str) {
    let text = cluster.must_xp(&["status", youngest]);
    assert!(
        text.contains("evicted: ") && text.contains("for GPU memory"),
        "{text}"
    );
    let reasons = event_reasons(cluster, youngest);
    assert!(
        reasons
            .iter()
            .any(|reason| reason.starts_with("requeued: node ")
                && reason.contains("evicted rank 0 for GPU memory: GPU 0 had 97.0% in use")),
        "{reasons:#?}"
    );
    assert!(
        cluster
            .node_log("n1")
            .contains("evicting the youngest oversubscribed worker"),
        "the node says why it stopped the worker"
    );
    let admin: xp_runtime::join::JoinString = cluster.join.parse().expect("a credential");
    let bearer = format!("Bearer {}", admin.token);
    let (status, _, metrics) =
        http_exchange(http, "GET", "/metrics", &[("Authorization", &bearer)], "");
    assert_eq!(status, 200, "{metrics}");
    assert!(
        metrics
            .lines()
            .any(|line| line.starts_with("xp_gpu_memory_evictions_total ")
                && line.split_whitespace().nth(1) == Some("1")),
        "{metrics}"
    );
}

/// At 99% a trial that did not opt in runs to its end in one attempt.
fn check_plain_trial_runs_at_99_percent(cluster: &TestCluster, memory_file: &Path) {
    set_gpu_memory(memory_file, 99);
    let plain_again = cluster.write_file(
        "plain-again.yaml",
        "name: plain-again\nteam: tests\ntrial:\n  command: [sleep, '2']\n  resources: {gpu: 0.5}\n  max_retries: 0\n",
    );
    let plain_again = cluster
        .must_xp(&["submit", plain_again.to_str().expect("UTF-8")])
        .trim()
        .to_owned();
    let done = cluster.wait_finished(&plain_again, Duration::from_secs(60));
    assert_eq!(done["state"], "succeeded", "{done:#}");
    let attempts = trials(&done)[0]["attempts"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    assert_eq!(attempts.len(), 1, "{done:#}");
    assert_eq!(attempts[0]["outcome"], "succeeded", "{done:#}");
}
