//! Limits that hold, with real processes: a trial that allocates past its memory
//! limit ends `oom-killed` while its neighbour runs on, a trial past its
//! `time_limit` ends `time-limit`, and a grandchild that left the worker's
//! process group with `setsid` is gone after a cancel.
//!
//! The memory and `setsid` cases need per-worker cgroups (Linux, root, the cpu,
//! memory and pids controllers); where those are missing they say why and pass.

mod common;

use std::time::Duration;

use common::{TestCluster, trials, wait_until};
use serde_json::Value;

/// Why per-worker cgroups cannot be used here, if they cannot.
fn cgroups_missing() -> Option<&'static str> {
    if !cfg!(target_os = "linux") {
        return Some("not Linux");
    }
    // The effective user id is the second field of the `Uid:` line.
    let root = std::fs::read_to_string("/proc/self/status").is_ok_and(|text| {
        text.lines()
            .find_map(|line| line.strip_prefix("Uid:"))
            .and_then(|ids| ids.split_whitespace().nth(1))
            == Some("0")
    });
    if !root {
        return Some("not root");
    }
    let v2 = std::fs::read_to_string("/sys/fs/cgroup/cgroup.controllers")
        .is_ok_and(|controllers| controllers.contains("memory") && controllers.contains("pids"));
    let v1 = ["cpu", "memory", "pids"].iter().all(|controller| {
        std::path::Path::new("/sys/fs/cgroup")
            .join(controller)
            .is_dir()
    });
    (!v1 && !v2).then_some("no cgroup hierarchy with the cpu, memory and pids controllers")
}

/// Whether the test must be skipped for want of cgroups (it says why).
fn skipped_without_cgroups() -> bool {
    let missing = cgroups_missing();
    if let Some(why) = missing {
        common::cannot_run(&format!("per-worker cgroups are not usable here ({why})"));
    }
    missing.is_some()
}

/// Submits the experiment in `yaml` and returns its id.
fn submit(cluster: &TestCluster, name: &str, yaml: &str) -> String {
    let path = cluster.write_file(&format!("{name}.yaml"), yaml);
    cluster
        .must_xp(&["submit", path.to_str().unwrap()])
        .trim()
        .to_owned()
}

/// The outcomes of the experiment's only trial's attempts.
fn outcomes(status: &Value) -> Vec<String> {
    trials(status)[0]["attempts"]
        .as_array()
        .expect("attempts")
        .iter()
        .map(|attempt| attempt["outcome"].as_str().unwrap_or_default().to_owned())
        .collect()
}

/// Whether some process's command line contains `marker`.
fn process_with(marker: &str) -> bool {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return false;
    };
    entries.flatten().any(|entry| {
        std::fs::read(entry.path().join("cmdline"))
            .is_ok_and(|cmdline| String::from_utf8_lossy(&cmdline).contains(marker))
    })
}

#[test]
fn a_trial_past_its_memory_limit_is_oom_killed_and_its_neighbour_runs_on() {
    if skipped_without_cgroups() {
        return;
    }
    let mut cluster = TestCluster::start("10s");
    cluster.start_node("a", 0, 2);
    cluster.wait_for_nodes(1);
    let neighbour = submit(
        &cluster,
        "neighbour",
        "name: neighbour\ntrial:\n  command: [sh, -c, 'sleep 6']\n  resources: {memory: 64MiB}\n",
    );
    wait_until("the neighbour to run", Duration::from_secs(60), || {
        (trials(&cluster.status(&neighbour))[0]["state"] == "running").then_some(())
    });
    // `tail` keeps the last line whole, and /dev/zero has no line end: it allocates 200 MiB.
    let hungry = submit(
        &cluster,
        "hungry",
        "name: hungry\ntrial:\n  command: [sh, -c, 'head -c 200M /dev/zero | tail']\n  resources: {memory: 64MiB}\n  max_retries: 1\n",
    );
    let status = cluster.wait_finished(&hungry, Duration::from_secs(120));
    let outcomes = outcomes(&status);
    assert_eq!(outcomes.len(), 2, "retried once: {status:#}");
    for outcome in &outcomes {
        assert!(
            outcome
                .starts_with("oom-killed: rank 0 was killed for going over its memory limit of 64"),
            "{status:#}"
        );
    }
    assert_eq!(trials(&status)[0]["state"], "failed", "{status:#}");
    let neighbour_status = cluster.wait_finished(&neighbour, Duration::from_secs(120));
    assert_eq!(
        trials(&neighbour_status)[0]["state"],
        "succeeded",
        "{neighbour_status:#}"
    );
}

#[test]
fn a_trial_that_declares_no_memory_runs_under_the_policy_default() {
    if skipped_without_cgroups() {
        return;
    }
    let policy = "admission: {default_memory_per_worker: 64MiB}\n";
    let mut cluster = TestCluster::start_with_policy("10s", Some(policy));
    cluster.start_node("a", 0, 2);
    cluster.wait_for_nodes(1);
    let hungry = submit(
        &cluster,
        "undeclared",
        "name: undeclared\ntrial:\n  command: [sh, -c, 'head -c 200M /dev/zero | tail']\n",
    );
    let status = cluster.wait_finished(&hungry, Duration::from_secs(120));
    assert!(
        outcomes(&status)[0]
            .starts_with("oom-killed: rank 0 was killed for going over its memory limit of 64"),
        "{status:#}"
    );
}

#[test]
fn a_trial_past_its_time_limit_ends_time_limit() {
    let mut cluster = TestCluster::start("10s");
    cluster.start_node("a", 0, 2);
    cluster.wait_for_nodes(1);
    let slow = submit(
        &cluster,
        "slow",
        "name: slow\ntrial:\n  command: [sleep, '300']\n  time_limit: 2s\n",
    );
    let status = cluster.wait_finished(&slow, Duration::from_secs(120));
    assert_eq!(
        outcomes(&status),
        vec!["time-limit: ran past its time limit of 2s".to_owned()],
        "{status:#}"
    );
    let trial = &trials(&status)[0];
    assert_eq!(trial["state"], "failed", "{status:#}");
    assert!(
        trial["reason"]
            .as_str()
            .is_some_and(|reason| reason.contains("time limit")),
        "{status:#}"
    );
}

#[test]
fn a_setsid_grandchild_is_gone_after_cancel() {
    if skipped_without_cgroups() {
        return;
    }
    let mut cluster = TestCluster::start("10s");
    cluster.start_node("a", 0, 2);
    cluster.wait_for_nodes(1);
    // A duration no other process on the machine sleeps for: the marker.
    let marker = format!(
        "{}.{}",
        3000 + std::process::id() % 1000,
        std::process::id()
    );
    let escaping = submit(
        &cluster,
        "escaping",
        &format!(
            "name: escaping\ntrial:\n  command: [sh, -c, 'setsid sleep {marker} & sleep 300']\n"
        ),
    );
    wait_until(
        "the setsid grandchild to run",
        Duration::from_secs(60),
        || process_with(&marker).then_some(()),
    );
    cluster.must_xp(&["cancel", &escaping]);
    wait_until(
        "the setsid grandchild to be gone",
        Duration::from_secs(60),
        || (!process_with(&marker)).then_some(()),
    );
}
