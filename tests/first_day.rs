//! A new user's first day (issue 28), with a real head and node and the `xp`
//! CLI as the docs tell a newcomer to use it:
//!
//! - an early-stopped sweep (every trial ends `stopped`, even the one that ran
//!   to `max_t`) is `succeeded`, has a best, and `xp submit --wait` exits 0;
//! - a sweep whose trials all fail exits 3, one where some fail exits 4;
//! - resubmitting a failed experiment after a fix reruns its failed trials
//!   and reuses its succeeded ones, without `--rerun`;
//! - a trial that exits 0 without reporting the search's metric fails and
//!   says so; numbers as bc prints them (`.0333`) are read, and a malformed
//!   metric line is counted, kept and warned about in the trial's events;
//! - `xp status` orders trials by number and counts every state, and
//!   `xp status EXP-tN` shows that trial;
//! - `xp submit` of a spec whose `entry:` names no program is refused with
//!   the fix.

mod common;

use common::{TestCluster, trials};
use serde_json::Value;

/// Submits `yaml` as `name` with `--wait`; the exit status and the output.
fn submit_wait(cluster: &TestCluster, name: &str, yaml: &str) -> (Option<i32>, String, String) {
    let path = cluster.write_file(&format!("{name}.yaml"), yaml);
    let output = cluster.xp(&["submit", "--wait", path.to_str().expect("a UTF-8 path")]);
    (
        output.status.code(),
        String::from_utf8_lossy(&output.stdout).into_owned(),
        String::from_utf8_lossy(&output.stderr).into_owned(),
    )
}

/// The experiment id `xp submit` printed first.
fn experiment_of(stdout: &str) -> String {
    stdout
        .lines()
        .next()
        .expect("the experiment id")
        .trim()
        .to_owned()
}

fn started() -> TestCluster {
    let mut cluster = TestCluster::start("10s");
    cluster.start_node("n1", 0, 4);
    cluster.wait_for_nodes(1);
    cluster
}

#[test]
fn an_early_stopped_sweep_succeeds_and_has_a_best() {
    let cluster = started();
    // One trial at a time, best first: ASHA keeps the first at every rung and
    // stops it at max_t; each later one falls behind at rung 1.
    let yaml = "name: asha\nteam: tests\ntrial:\n  command: [sh, -c, 'for s in 1 2 3 4 5 6; do echo \"XP_METRIC {\\\"step\\\": $s, \\\"acc\\\": 0.{x}$s}\"; sleep 0.2; done']\n  resources: {cpu: 1}\nsearch:\n  algorithm: grid\n  space: {x: {choice: [9, 5, 3, 1]}}\n  metric: acc\n  mode: max\n  parallel: 1\n  early_stopping: {rule: asha, grace_period: 1, max_t: 6, reduction_factor: 2}\n";
    let (code, stdout, stderr) = submit_wait(&cluster, "asha", yaml);
    let experiment = experiment_of(&stdout);
    let status = cluster.status(&experiment);
    let states: Vec<&str> = trials(&status)
        .iter()
        .map(|trial| trial["state"].as_str().unwrap_or_default())
        .collect();
    assert!(states.iter().all(|state| *state == "stopped"), "{status:#}");
    assert_eq!(status["state"], "succeeded", "{status:#}");
    assert_eq!(code, Some(0), "{stdout}\n{stderr}");
    assert!(
        stdout.contains(&format!("best: {experiment}-t0 acc=0.9600")),
        "{stdout}"
    );
    // Values keep their sign in the stop reasons of a maximised metric.
    let reason = trials(&status)[1]["reason"].as_str().unwrap_or_default();
    assert!(reason.contains("value 0.51 at step 1"), "{reason}");
}

#[test]
fn exit_codes_say_how_the_experiment_ended() {
    let cluster = started();
    let sweep = |name: &str, failing: &str| {
        format!(
            "name: {name}\nteam: tests\ntrial:\n  command: [sh, -c, 'case \" {failing} \" in *\" {{x}} \"*) exit 2;; esac']\n  resources: {{cpu: 1}}\nsearch:\n  algorithm: grid\n  space: {{x: {{choice: [1, 2, 3]}}}}\n"
        )
    };
    let (code, stdout, stderr) = submit_wait(&cluster, "all-fail", &sweep("all-fail", "1 2 3"));
    assert_eq!(code, Some(3), "{stdout}\n{stderr}");
    assert!(stderr.contains("failed: 3 trials: 3 failed"), "{stderr}");
    let (code, _, stderr) = submit_wait(&cluster, "some-fail", &sweep("some-fail", "2"));
    assert_eq!(code, Some(4), "{stderr}");
    assert!(
        stderr.contains("succeeded, but 1 of its 3 trials failed"),
        "{stderr}"
    );
}

#[test]
fn resubmitting_a_failed_experiment_reruns_only_what_failed() {
    let cluster = started();
    let fixed = cluster.dir.path().join("fixed");
    let yaml = format!(
        "name: fixme\nteam: tests\ntrial:\n  command: [sh, -c, 'test {{x}} -ne 2 || test -e {}']\n  resources: {{cpu: 1}}\nsearch:\n  algorithm: grid\n  space: {{x: {{choice: [1, 2, 3]}}}}\n",
        fixed.display()
    );
    let (code, stdout, _) = submit_wait(&cluster, "fixme", &yaml);
    assert_eq!(code, Some(4));
    let first = experiment_of(&stdout);
    std::fs::write(&fixed, "fixed\n").expect("the fix");
    let (code, stdout, stderr) = submit_wait(&cluster, "fixme", &yaml);
    assert_eq!(code, Some(0), "{stdout}\n{stderr}");
    let second = experiment_of(&stdout);
    assert_ne!(first, second, "a new run, not the failed one again");
    let status = cluster.status(&second);
    for trial in trials(&status) {
        let reused = trial["reused_from"].as_str();
        if trial["id"].as_str().is_some_and(|id| id.ends_with("-t1")) {
            assert_eq!(reused, None, "the failed trial ran again: {trial:#}");
        } else {
            assert!(
                reused.is_some_and(|source| source.starts_with(&first)),
                "{trial:#}"
            );
        }
        assert_eq!(trial["state"], "succeeded", "{trial:#}");
    }
}

#[test]
fn metric_lines_are_read_as_printed_and_never_lost_silently() {
    let cluster = started();
    let yaml = "name: metrics\nteam: tests\ntrial:\n  command: [sh, -c, 'case {x} in 1) echo \"XP_METRIC {\\\"step\\\": 1, \\\"acc\\\": .0333}\";; 2) echo \"XP_METRIC {\\\"acc\\\": 1,}\"; echo \"XP_METRIC {\\\"acc\\\": oops}\";; 3) true;; esac']\n  resources: {cpu: 1}\nsearch:\n  algorithm: grid\n  space: {x: {choice: [1, 2, 3]}}\n  metric: acc\n  mode: max\n";
    let (_, stdout, _) = submit_wait(&cluster, "metrics", yaml);
    let experiment = experiment_of(&stdout);
    let status = cluster.status(&experiment);
    let trial = |index: usize| trials(&status)[index].clone();
    assert_eq!(trial(0)["state"], "succeeded", "{status:#}");
    assert_eq!(trial(0)["metrics"]["acc"].as_f64(), Some(0.0333));
    // Malformed lines: counted, the first kept, the trial failed for the
    // metric it never reported, and a warning in its events.
    let malformed = &trial(1)["malformed_metrics"];
    assert_eq!(malformed["count"].as_u64(), Some(2), "{status:#}");
    let first = malformed["first"].as_str().unwrap_or_default();
    assert!(first.starts_with(r#"XP_METRIC {"acc": 1,}"#), "{first}");
    for index in [1, 2] {
        assert_eq!(trial(index)["state"], "failed", "{status:#}");
        let outcome = trial(index)["attempts"][0]["outcome"]
            .as_str()
            .unwrap_or_default()
            .to_owned();
        assert!(
            outcome.contains("exited with status 0 without reporting acc"),
            "{outcome}"
        );
    }
    let id = trial(1)["id"].as_str().expect("an id").to_owned();
    let shown = cluster.must_xp(&["status", &id]);
    assert!(
        shown.contains("2 metric lines could not be read; the first: XP_METRIC"),
        "{shown}"
    );
    assert!(
        shown.contains("printed a metric line that could not be read"),
        "the warning among its events: {shown}"
    );
}

#[test]
fn status_orders_trials_by_number_and_shows_one_trial() {
    let cluster = started();
    let yaml = "name: many\nteam: tests\ntrial:\n  command: [sh, -c, 'test {x} -ne 4']\n  resources: {cpu: 1}\nsearch:\n  algorithm: grid\n  space: {x: {int: [0, 11]}}\n";
    let (_, stdout, _) = submit_wait(&cluster, "many", yaml);
    let experiment = experiment_of(&stdout);
    let table = cluster.must_xp(&["status", &experiment]);
    assert!(
        table.contains("12 trials: 11 succeeded, 1 failed"),
        "{table}"
    );
    let order: Vec<u32> = table
        .lines()
        .filter_map(|line| line.trim().strip_prefix(&format!("{experiment}-t")))
        .filter_map(|rest| rest.split_whitespace().next()?.parse().ok())
        .collect();
    assert_eq!(order, (0..12).collect::<Vec<_>>(), "{table}");
    let one = cluster.must_xp(&["status", &format!("{experiment}-t4")]);
    assert!(
        one.starts_with(&format!("trial {experiment}-t4  failed")),
        "{one}"
    );
    assert!(one.contains("attempt 1 on "), "{one}");
    assert!(
        !one.contains(&format!("{experiment}-t5")),
        "only that trial: {one}"
    );
    let json = cluster.must_xp(&["status", &format!("{experiment}-t4"), "--json"]);
    let json: Value = serde_json::from_str(json.lines().next().unwrap_or_default())
        .expect("the trial's JSON object first");
    assert_eq!(json["state"], "failed");
}

#[test]
fn an_entry_without_a_program_is_refused_with_the_fix() {
    let cluster = started();
    let sweep = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/examples/quickstart/sweep.yaml"
    );
    let output = cluster.xp(&["submit", sweep]);
    assert_eq!(output.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("trial.entry `digits` names a trainable of a Rust driver program")
            && stderr.contains("add `program: PATH`"),
        "{stderr}"
    );
    let listed = cluster.must_xp(&["status"]);
    assert!(
        !listed.contains("digits-quickstart"),
        "nothing was submitted: {listed}"
    );
}
