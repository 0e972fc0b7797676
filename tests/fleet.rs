//! `xp bench fleet` as CI runs it, for about a minute: a real `xp-head`
//! process and 100 simulated nodes (each its own QUIC session, registration,
//! heartbeats, telemetry, checkpoints in its pretend store) run 16 sweeps of
//! 100 trials, one of them of gangs of two whole nodes, while nodes die and
//! come back and the head is killed with SIGKILL halfway and started again.
//! Every trial must succeed, none may run twice at once, and the head must
//! have taken every node back after its restart.

mod common;

use std::process::Command;

use common::binary;

#[test]
fn a_hundred_simulated_nodes_run_sweeps_through_node_deaths_and_a_head_kill_without_losing_a_trial()
{
    let output = Command::new(binary("xp"))
        .args(["bench", "fleet", "--nodes", "100", "--trials", "1600"])
        .args(["--churn", "0.2", "--timeout", "4m", "--json", "--head-bin"])
        .arg(binary("xp-head"))
        .env("XP_LOG", "error")
        .output()
        .expect("xp runs");
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        output.status.success(),
        "xp bench fleet failed:\n{stdout}\n{stderr}"
    );
    let line = stdout.lines().last().expect("one JSON line");
    let report: serde_json::Value = serde_json::from_str(line).expect("JSON");
    let number = |key: &str| {
        report[key]
            .as_f64()
            .unwrap_or_else(|| panic!("{key} in {report}"))
    };
    assert_eq!(number("succeeded"), 1600.0, "{report}");
    assert_eq!(number("lost"), 0.0, "{report}");
    assert_eq!(number("duplicated"), 0.0, "{report}");
    assert_eq!(number("head_restarts"), 1.0, "{report}");
    assert!(number("node_kills") >= 1.0, "nodes died: {report}");
    assert!(
        number("registrations") >= 200.0 - number("node_kills"),
        "every node registered, and again after the head's restart (but those dead then): {report}"
    );
    // Every trial started, plus the gangs' second workers (100 gangs).
    assert!(number("placements") >= 1700.0, "{report}");
    assert!(
        number("commits") > 0.0,
        "the head's /metrics read: {report}"
    );
}
