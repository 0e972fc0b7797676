//! What one submission may cost the head, with real processes: the issue's
//! 205 KB spec (two 100 KB choices times 1,000 integers) is refused before
//! anything is stored, naming the limit and the size; a team near its
//! pending limit is refused a submission that would pass it; and a head that
//! already holds an experiment whose status is larger than a frame (stored
//! under a looser policy, then restarted with the default one) stays usable:
//! `xp status` pages through it, and other work goes on.

mod common;

use std::time::Duration;

use common::{TestCluster, trials, wait_until};

/// A head with the policy `yaml` (none: the default).
fn start(policy: Option<&str>) -> TestCluster {
    TestCluster::start_with_policy("10s", policy)
}

/// `xp submit` of `yaml` (written to `name.yaml`); its output.
fn submit(cluster: &TestCluster, name: &str, yaml: &str) -> std::process::Output {
    let path = cluster.write_file(&format!("{name}.yaml"), yaml);
    cluster.xp(&["submit", path.to_str().expect("a UTF-8 path")])
}

/// A grid of two `bytes`-long strings times `integers` integers, each value
/// also in the command.
fn two_large_choices(name: &str, bytes: usize, integers: u32) -> String {
    let (a, b) = ("a".repeat(bytes), "b".repeat(bytes));
    format!(
        "name: {name}\ntrial:\n  command: [echo, '{{s}}', '{{n}}']\nsearch:\n  algorithm: grid\n  space:\n    s: {{choice: ['{a}', '{b}']}}\n    n: {{int: [1, {integers}]}}\n"
    )
}

fn stderr(output: &std::process::Output) -> String {
    String::from_utf8_lossy(&output.stderr).into_owned()
}

/// The head's database size in bytes.
fn database_bytes(cluster: &TestCluster) -> u64 {
    std::fs::metadata(cluster.head_dir().join("head.redb"))
        .expect("the head's database")
        .len()
}

#[test]
fn the_issues_205_kb_spec_is_refused_before_anything_is_stored() {
    let cluster = start(None);
    let yaml = two_large_choices("big", 100_000, 1_000);
    assert!(yaml.len() > 200_000, "{} bytes", yaml.len());
    let before = database_bytes(&cluster);
    let refused = submit(&cluster, "big", &yaml);
    assert!(!refused.status.success(), "the 205 KB spec was admitted");
    let message = stderr(&refused);
    for part in [
        "this submission expands to 400",
        "(2000 trials of 200",
        "over the limit of 16777216 bytes (admission.max_submission_bytes)",
    ] {
        assert!(message.contains(part), "{part:?} missing from: {message}");
    }
    assert_eq!(
        cluster.must_xp(&["status"]).trim(),
        "",
        "nothing was stored"
    );
    assert!(
        database_bytes(&cluster) < before + (1 << 20),
        "the database grew"
    );
}

#[test]
fn a_team_near_its_pending_limit_is_refused_a_submission_that_would_pass_it() {
    let cluster = start(Some("admission: {max_pending_per_team: 5}\n"));
    let grid = |name: &str, count: u32| {
        format!(
            "name: {name}\ntrial: {{command: [echo, '{{n}}']}}\nsearch: {{algorithm: grid, space: {{n: {{int: [1, {count}]}}}}}}\n"
        )
    };
    // No node: every trial waits.
    let first = submit(&cluster, "first", &grid("first", 3));
    assert!(first.status.success(), "{}", stderr(&first));
    let passing = submit(&cluster, "second", &grid("second", 3));
    assert!(
        !passing.status.success(),
        "a submission passed the pending limit"
    );
    let message = stderr(&passing);
    assert!(
        message.contains("has 3 pending trials and this submission adds 3, over its limit of 5"),
        "{message}"
    );
    let alone = submit(&cluster, "alone", &grid("alone", 6));
    assert!(
        stderr(&alone).contains(
            "this submission creates 6 trials at once, more than team default may have pending (5"
        ),
        "{}",
        stderr(&alone)
    );
    let fitting = submit(&cluster, "third", &grid("third", 2));
    assert!(fitting.status.success(), "{}", stderr(&fitting));
}

#[test]
fn a_head_holding_a_status_larger_than_a_frame_stays_usable() {
    // 400 trials of 100 KB configs: about 40 MB of status, over a 16 MiB frame.
    let mut cluster = start(Some(
        "admission: {max_submission_bytes: 1GiB, max_team_bytes: 1GiB}\n",
    ));
    let stored = submit(&cluster, "large", &two_large_choices("large", 100_000, 200));
    assert!(stored.status.success(), "{}", stderr(&stored));
    let large = String::from_utf8_lossy(&stored.stdout).trim().to_owned();
    // Held from before: the head restarts with the default policy.
    cluster.kill_head();
    cluster.restart_head_with(&["--policy", "default"]);
    wait_until("the restarted head", Duration::from_secs(30), || {
        cluster.xp(&["nodes"]).status.success().then_some(())
    });
    let listed = cluster.must_xp(&["status", "--json"]);
    let lines: Vec<&str> = listed.lines().collect();
    assert_eq!(lines.len(), 1, "one experiment");
    let status: serde_json::Value = serde_json::from_str(lines[0]).expect("status is JSON");
    assert_eq!(status["id"], large.as_str());
    assert_eq!(trials(&status).len(), 400, "every trial, over many pages");
    let table = cluster.must_xp(&["status", &large]);
    let rows = format!("  {large}-t");
    assert_eq!(
        table.lines().filter(|line| line.starts_with(&rows)).count(),
        400
    );
    // The team holding it is over its limit now, and told so; another
    // team's work goes on.
    let over = submit(
        &cluster,
        "same-team",
        "name: same-team\ntrial: {command: [echo]}\n",
    );
    assert!(
        stderr(&over).contains("admission.max_team_bytes"),
        "{}",
        stderr(&over)
    );
    let small = submit(
        &cluster,
        "small",
        "name: small\nteam: other\ntrial: {command: [echo]}\n",
    );
    assert!(small.status.success(), "{}", stderr(&small));
    // And the issue's spec is refused by the policy now in force.
    let big = submit(&cluster, "big", &two_large_choices("big", 100_000, 1_000));
    assert!(
        stderr(&big).contains("admission.max_submission_bytes"),
        "{}",
        stderr(&big)
    );
}
