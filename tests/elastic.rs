//! End-to-end elastic trials with real processes: a data-parallel Rust
//! trainable with `workers: {min: 2, max: 4}` starts at 2 while two of the
//! node's four GPU slots are busy, grows to 4 when they free up, shrinks back
//! to 2 when a higher-priority trial arrives, and ends with the parameters of a
//! run that never resized (same global batch and seed; to the last bit but for
//! JSON's float parsing).

mod common;

use std::path::PathBuf;
use std::time::Duration;

use common::{TestCluster, trials, wait_until};
use serde_json::Value;

const STEPS: u64 = 400;
const BATCH: u64 = 16;
const DATA_SEED: u64 = 7;

/// Growth waits `min_run_time` after each start or resize; the grace is long
/// enough for a loaded machine to save the stop-time checkpoint.
const POLICY: &str = "\
order: priority
priority_classes: {low: 0, high: 100}
preemption: {grace_period: 20s, min_run_time: 2s}
";

/// Shown when the test fails: where the trial stood.
#[expect(clippy::print_stderr, reason = "where the trial stood, for a failure")]
fn show(text: &str) {
    eprintln!("{text}");
}

fn submit(cluster: &TestCluster, name: &str, yaml: &str) -> String {
    let path = cluster.write_file(&format!("{name}.yaml"), yaml);
    cluster
        .must_xp(&["submit", path.to_str().expect("a UTF-8 path")])
        .trim()
        .to_owned()
}

/// The elastic trial's attempts, its state and its last step.
fn elastic_trial(cluster: &TestCluster, experiment: &str) -> (Vec<Value>, String, u64) {
    let status = cluster.status(experiment);
    let trial = &trials(&status)[0];
    (
        trial["attempts"].as_array().cloned().unwrap_or_default(),
        trial["state"].as_str().unwrap_or_default().to_owned(),
        trial["last_step"].as_u64().unwrap_or(0),
    )
}

/// Waits until attempt `number` runs with `workers` ranks and has gone `steps`
/// steps past `from`; returns the last step then.
fn wait_running_at(
    cluster: &TestCluster,
    experiment: &str,
    number: usize,
    workers: usize,
    from: u64,
    steps: u64,
) -> u64 {
    let mut polls = 0u64;
    wait_until(
        &format!("attempt {number} running with {workers} workers past step {from} + {steps}"),
        Duration::from_secs(120),
        || {
            let (attempts, state, last_step) = elastic_trial(cluster, experiment);
            polls += 1;
            if polls.is_multiple_of(50) {
                let status = cluster.status(experiment);
                let waiting = &trials(&status)[0]["waiting"];
                show(&format!(
                    "{state} at step {last_step}, attempts {attempts:?}, waiting: {waiting}"
                ));
            }
            let attempt = attempts.get(number - 1)?;
            (attempts.len() == number
                && state == "running"
                && attempt["nodes"].as_array()?.len() == workers
                && attempt["running_at_ms"].is_u64()
                && last_step >= from + steps)
                .then_some(last_step)
        },
    )
}

#[test]
fn an_elastic_trial_grows_shrinks_and_ends_as_if_never_resized() {
    let mut cluster = TestCluster::start_with_policy("10s", Some(POLICY));
    cluster.start_node("n1", 4, 8);
    cluster.wait_for_nodes(1);
    // One trial holds two of the four slots until the flag appears (one
    // trial, so both slots free at once and the growth is one step, 2 to 4).
    let (blockers, flag) = must_block_two_slots(&cluster);
    let elastic = must_submit_elastic(&cluster);
    // It starts with the two free slots.
    let before_growth = wait_running_at(&cluster, &elastic, 1, 2, 0, 10);

    // The blockers end: nobody waits, so it grows into the idle slots.
    std::fs::write(&flag, "go").expect("the flag");
    let blockers_done = cluster.wait_finished(&blockers, Duration::from_secs(60));
    assert_eq!(blockers_done["state"], "succeeded", "{blockers_done:#}");
    let grown = wait_running_at(&cluster, &elastic, 2, 4, before_growth, 40);

    // A higher-priority trial wants two GPUs: the elastic trial shrinks to its
    // minimum instead of being preempted.
    let done = check_shrinks_for_a_higher_priority(&cluster, &elastic);
    let trial = &trials(&done)[0];
    check_resizes_resumed_and_never_preempted(&done, before_growth.min(grown));
    // The same parameters as one process that never resized.
    common::sgd::check_same_as_never_resized(trial, STEPS, BATCH, DATA_SEED);
    // `xp status TRIAL` shows each size and why it changed.
    let trial_id = trial["id"].as_str().expect("an id");
    let text = cluster.must_xp(&["status", trial_id]);
    assert!(text.contains("(4 workers)"), "{text}");
    assert!(text.contains("resized: 4 to 2 workers"), "{text}");
    // And the checkpoints it resized through, asked for by the trial alone.
    assert!(text.contains("  checkpoints:\n"), "{text}");
}

/// A trial holding two of the four GPU slots until its flag file appears:
/// the experiment and the flag's path.
fn must_block_two_slots(cluster: &TestCluster) -> (String, PathBuf) {
    let flag = cluster
        .write_file("blockers.txt", "blockers wait for blockers.go\n")
        .with_extension("go");
    let blockers = submit(
        cluster,
        "blockers",
        &format!(
            "name: blockers\ntrial:\n  command: [sh, -c, 'while [ ! -e {} ]; do sleep 0.1; done']\n  resources: {{gpu: 2}}\n",
            flag.display()
        ),
    );
    wait_until("the blocker to run", Duration::from_secs(60), || {
        trials(&cluster.status(&blockers))
            .iter()
            .all(|trial| trial["state"] == "running")
            .then_some(())
    });
    (blockers, flag)
}

/// Submits the elastic trial (2 to 4 workers) through the trainables driver;
/// the experiment.
fn must_submit_elastic(cluster: &TestCluster) -> String {
    let spec = format!(
        "name: elastic\nteam: tests\ntrial:\n  entry: elastic_sgd\n  workers: {{min: 2, max: 4}}\n  resources: {{cpu: 1, gpu: 1}}\nsearch:\n  algorithm: grid\n  space:\n    steps: {{choice: [{STEPS}]}}\n    every: {{choice: [20]}}\n    batch: {{choice: [{BATCH}]}}\n    step_ms: {{choice: [50]}}\n    data_seed: {{choice: [{DATA_SEED}]}}\n"
    );
    let path = cluster.write_file("elastic.yaml", &spec);
    cluster.run_driver(
        "examples/trainables",
        &["submit", "--spec", path.to_str().expect("a UTF-8 path")],
    )
}

/// The higher-priority trial runs while the elastic one shrinks; both
/// succeed. The elastic experiment's final status.
fn check_shrinks_for_a_higher_priority(cluster: &TestCluster, elastic: &str) -> Value {
    let high = submit(
        cluster,
        "high",
        "name: high\npriority: high\ntrial:\n  command: [sleep, '1']\n  resources: {gpu: 2}\n",
    );
    let high_done = cluster.wait_finished(&high, Duration::from_secs(120));
    assert_eq!(high_done["state"], "succeeded", "{high_done:#}");
    let done = cluster.wait_finished(elastic, Duration::from_secs(180));
    assert_eq!(done["state"], "succeeded", "{done:#}");
    done
}

/// The attempts' sizes (2, 4, 2) and outcomes (resized, then succeeded);
/// each restart resumed from the checkpoint taken as the gang stopped, at or
/// after `first_resumable` (a resize repeats no step); no preemption.
fn check_resizes_resumed_and_never_preempted(done: &Value, first_resumable: u64) {
    let trial = &trials(done)[0];
    let attempts = trial["attempts"].as_array().expect("attempts");
    let sizes: Vec<usize> = attempts
        .iter()
        .map(|attempt| attempt["nodes"].as_array().map_or(0, Vec::len))
        .collect();
    // Once the high trial is done nobody waits, so it may grow again.
    assert_eq!(sizes[..3], [2, 4, 2], "{done:#}");
    let outcomes: Vec<&str> = attempts
        .iter()
        .map(|attempt| attempt["outcome"].as_str().unwrap_or_default())
        .collect();
    assert!(
        outcomes[0].starts_with("resized: 2 to 4 workers, GPUs idle"),
        "{outcomes:?}"
    );
    assert!(
        outcomes[1].starts_with("resized: 4 to 2 workers, ")
            && outcomes[1].contains("needs the GPUs"),
        "{outcomes:?}"
    );
    let (last, resizes) = outcomes.split_last().expect("attempts");
    assert_eq!(*last, "succeeded");
    assert!(
        resizes
            .iter()
            .all(|outcome| outcome.starts_with("resized: ")),
        "{outcomes:?}"
    );
    // Each restart resumed from the checkpoint taken as the gang stopped, not
    // from the start: a resize repeats no step.
    for attempt in &attempts[1..] {
        let resumed = attempt["resumed_from"]["step"].as_u64().expect("resumed");
        assert!(resumed >= first_resumable, "{attempt:#}");
    }
    // No retry was used and no attempt was a preemption.
    assert!(
        attempts
            .iter()
            .all(|attempt| attempt["outcome"] != "preempted"),
        "{done:#}"
    );
}
