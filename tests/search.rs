//! End-to-end search: an adaptive (TPE) sweep with ASHA early stopping on a real
//! cluster, `xp compare` over seed replicates, and `xp tune` on a local command.

mod common;

use std::time::Duration;

use common::{TestCluster, trials};

/// A learning curve that ends near (x - 1)^2: `sh curve.sh X`.
const CURVE: &str = r#"for s in 1 2 3 4 5 6; do echo "XP_METRIC {\"step\": $s, \"loss\": $(awk -v x="$1" -v s=$s 'BEGIN { print (x - 1) * (x - 1) + 4 / s }')}"; sleep 0.1; done
"#;

/// A replicate's accuracy, Q plus a seed-dependent wobble: `sh acc.sh Q SEED`.
const ACCURACY: &str = r#"echo "XP_METRIC {\"acc\": $(awk -v q="$1" -v s="$2" 'BEGIN { print q + s / 1000 }')}"
"#;

#[test]
fn an_adaptive_sweep_with_early_stopping_runs_on_a_cluster_and_compares() {
    let mut cluster = TestCluster::start("10s");
    cluster.start_node("a", 0, 3);
    cluster.wait_for_nodes(1);
    let curve = cluster.write_file("curve.sh", CURVE);
    let spec = cluster.write_file(
        "tpe.yaml",
        &format!(
            "name: tpe\ntrial:\n  command: [sh, {}, '{{x}}']\nsearch:\n  algorithm: tpe\n  space: {{x: {{uniform: [-4, 4]}}}}\n  metric: loss\n  trials: 8\n  parallel: 3\n  seed: 5\n  early_stopping: {{rule: asha, grace_period: 1, reduction_factor: 2, max_t: 6}}\n",
            curve.display()
        ),
    );
    let experiment = cluster
        .must_xp(&["submit", spec.to_str().unwrap()])
        .trim()
        .to_owned();
    let status = cluster.wait_finished(&experiment, Duration::from_secs(120));
    let all = trials(&status);
    assert_eq!(all.len(), 8, "the budget of 8 configurations: {status:#}");
    assert!(
        all.iter()
            .all(|trial| trial["state"] == "succeeded" || trial["state"] == "stopped"),
        "{status:#}"
    );
    let stopped: Vec<_> = all
        .iter()
        .filter(|trial| trial["state"] == "stopped")
        .collect();
    assert!(!stopped.is_empty(), "ASHA stopped some trials: {status:#}");
    for trial in &stopped {
        assert!(
            trial["reason"].as_str().unwrap().contains("asha"),
            "{trial:#}"
        );
    }

    // Replicates: a grid of two configurations with three seeds each.
    let accuracy = cluster.write_file("acc.sh", ACCURACY);
    let replicates = cluster.write_file(
        "replicates.yaml",
        &format!(
            "name: replicates\ntrial:\n  command: [sh, {}, '{{q}}', '{{seed}}']\nsearch:\n  algorithm: grid\n  space: {{q: {{choice: [0.5, 0.9]}}}}\n  metric: acc\n  mode: max\n  seeds: 3\n",
            accuracy.display()
        ),
    );
    let experiment = cluster
        .must_xp(&["submit", replicates.to_str().unwrap()])
        .trim()
        .to_owned();
    cluster.wait_finished(&experiment, Duration::from_secs(60));
    let compare = cluster.must_xp(&["compare", &experiment, "--json"]);
    let lines: Vec<serde_json::Value> = compare
        .lines()
        .map(|line| serde_json::from_str(line).unwrap())
        .collect();
    assert_eq!(lines.len(), 2, "{compare}");
    assert_eq!(lines[0]["config"]["q"], 0.9);
    assert_eq!(lines[0]["n"], 3);
    assert!((lines[0]["mean"].as_f64().unwrap() - 0.901).abs() < 1e-9);
    assert_eq!(lines[1]["vs_best"]["significant"], true);
    let table = cluster.must_xp(&["compare", &experiment]);
    assert!(table.contains("significant"), "{table}");
    let first_trial = trials(&cluster.status(&experiment))[0]["id"]
        .as_str()
        .unwrap()
        .to_owned();
    let metrics = cluster.must_xp(&["metrics", &first_trial, "--json", "--ema", "0.5"]);
    assert!(metrics.contains("\"metric\":\"acc\""), "{metrics}");
}

#[test]
fn tune_optimises_a_local_command_and_stops_bad_trials_early() {
    let dir = tempfile::tempdir().unwrap();
    let space = dir.path().join("space.yaml");
    std::fs::write(&space, "x: {uniform: [-4, 4]}\n").unwrap();
    let script = r#"for s in 1 2 3 4; do echo "XP_METRIC {\"step\": $s, \"value\": $(awk -v x=$XP_PARAM_X -v s=$s 'BEGIN { print (x - 1) * (x - 1) + 1 / s }')}"; done; awk -v x=$XP_PARAM_X 'BEGIN { print (x - 1) * (x - 1) + 0.25 }'"#;
    let output = std::process::Command::new(env!("CARGO_BIN_EXE_xp"))
        .args([
            "tune",
            "--space",
            space.to_str().unwrap(),
            "--algo",
            "tpe",
            "--budget",
            "12",
            "--seed",
            "4",
            "--parallel",
            "2",
        ])
        .args([
            "--early-stopping",
            "asha",
            "--max-t",
            "4",
            "--",
            "sh",
            "-c",
            script,
        ])
        .output()
        .unwrap();
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let lines: Vec<serde_json::Value> = String::from_utf8(output.stdout)
        .unwrap()
        .lines()
        .map(|line| serde_json::from_str(line).unwrap())
        .collect();
    assert_eq!(lines.len(), 13, "twelve evaluations and a summary");
    let summary = &lines[12]["summary"];
    assert_eq!(summary["evaluations"], 12);
    assert!(
        summary["steps"].as_u64().unwrap() < 12 * 4,
        "early stopping saved steps: {summary}"
    );
    assert!(
        lines[..12]
            .iter()
            .any(|line| line["stopped_at"].as_u64().is_some_and(|step| step < 4))
    );
    for line in &lines[..12] {
        assert!(line["params"]["x"].as_f64().is_some() && line["best"].as_f64().is_some());
    }
}
