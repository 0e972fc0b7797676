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

/// Two conflicting objectives from one parameter: `a = x` (maximised) and
/// `b = 10·x` (minimised), so every trial is on the front, but for x = 0.5,
/// which reports (0.4, 6): worse than x = 0.6's (0.6, 6) and better than none.
/// x = 0.9 fails. The first report of each is a worse one, so only the last counts.
const FRONT: &str = r#"a=$(awk -v x="$1" 'BEGIN { print x }'); b=$(awk -v x="$1" 'BEGIN { print 10 * x }')
if [ "$1" = "0.5" ]; then a=0.4; b=6; fi
if [ "$1" = "0.9" ]; then exit 3; fi
echo "XP_METRIC {\"step\": 1, \"a\": -5.0, \"b\": 99.0}"
echo "XP_METRIC {\"step\": 2, \"a\": $a, \"b\": $b}"
"#;

#[test]
fn a_multi_objective_sweep_reports_its_pareto_front() {
    let mut cluster = TestCluster::start("10s");
    cluster.start_node("a", 0, 4);
    cluster.wait_for_nodes(1);
    let script = cluster.write_file("front.sh", FRONT);
    // A grid: x = 0.5 is dominated by x = 0.6 and x = 0.9 fails, so the front
    // is x in {0, 0.25, 0.6, 1}.
    let spec = cluster.write_file(
        "front.yaml",
        &format!(
            "name: front\ntrial:\n  command: [sh, {}, '{{x}}']\nsearch:\n  algorithm: grid\n  space: {{x: {{choice: [0.0, 0.25, 0.5, 0.6, 0.9, 1.0]}}}}\n  metric: [a, b]\n  mode: [max, min]\n  reference: [-1.0, 12.0]\n",
            script.display()
        ),
    );
    let experiment = cluster
        .must_xp(&["submit", spec.to_str().unwrap()])
        .trim()
        .to_owned();
    let expected = check_grid_front(&cluster, &experiment);
    // The table says the same, and `xp compare` reports the front of configurations.
    check_front_in_status_and_compare(&cluster, &experiment, expected);
    // An adaptive multi-objective sweep (MOTPE) runs its budget and reports a front
    // with the default reference point.
    check_tpe_front(&cluster, &script);
    // A spec the front cannot serve is refused naming the field.
    let bad = cluster.write_file(
        "front-gp.yaml",
        "name: bad\ntrial: {command: [true]}\nsearch:\n  algorithm: gp\n  space: {x: {uniform: [0, 1]}}\n  metric: [a, b]\n  mode: [max, min]\n  trials: 2\n",
    );
    let refused = cluster.xp(&["submit", bad.to_str().unwrap()]);
    assert!(!refused.status.success());
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert!(stderr.contains("search.algorithm"), "{stderr}");
}

/// The grid's front: its members and their values, its hypervolume by hand,
/// and each member's contribution, largest first. The hypervolume.
fn check_grid_front(cluster: &TestCluster, experiment: &str) -> f64 {
    let status = cluster.wait_finished(experiment, Duration::from_secs(120));
    assert_eq!(trials(&status).len(), 6, "{status:#}");
    assert_eq!(status["metric"], "a", "{status:#}");
    assert_eq!(
        status["objectives"],
        serde_json::json!([{"metric": "a", "mode": "max"}, {"metric": "b", "mode": "min"}])
    );
    let front = &status["front"];
    assert_eq!(front["evaluated"], 5, "{front:#}");
    assert_eq!(front["reference"], serde_json::json!([-1.0, 12.0]));
    assert_eq!(front["reference_declared"], true);
    let mut xs: Vec<f64> = front["trials"]
        .as_array()
        .unwrap()
        .iter()
        .map(|member| {
            let x = member["config"]["x"].as_f64().unwrap();
            // Each member's values are its last report: (x, 10·x).
            assert!((member["values"]["a"].as_f64().unwrap() - x).abs() < 1e-9);
            assert!((member["values"]["b"].as_f64().unwrap() - 10.0 * x).abs() < 1e-9);
            x
        })
        .collect();
    xs.sort_by(f64::total_cmp);
    assert_eq!(xs, vec![0.0, 0.25, 0.6, 1.0], "{front:#}");
    // By hand: slices of a from the best down to the reference's −1, each as
    // far below b = 12 as the best b of the members at least that good in a:
    // a in (0.6, 1] → b 10; (0.25, 0.6] → b 6; (0, 0.25] → b 2.5; (−1, 0] → b 0.
    let expected = 0.4 * 2.0 + 0.35 * 6.0 + 0.25 * 9.5 + 1.0 * 12.0;
    let hypervolume = front["hypervolume"].as_f64().unwrap();
    assert!(
        (hypervolume - expected).abs() < 1e-9,
        "{hypervolume} {front:#}"
    );
    // Every member adds something, and the largest contribution comes first.
    let contributions: Vec<f64> = front["trials"]
        .as_array()
        .unwrap()
        .iter()
        .map(|member| member["contribution"].as_f64().unwrap())
        .collect();
    assert!(contributions.iter().all(|value| *value > 0.0));
    assert!(contributions.windows(2).all(|pair| pair[0] >= pair[1]));
    expected
}

/// `xp status` says how many trials are on the front and that the reference
/// was declared; `xp compare --json` reports the front first.
fn check_front_in_status_and_compare(cluster: &TestCluster, experiment: &str, expected: f64) {
    let table = cluster.must_xp(&["status", experiment]);
    assert!(
        table.contains("Pareto front: 4 of 5 evaluated trials"),
        "{table}"
    );
    assert!(table.contains("(declared)"), "{table}");
    let compare = cluster.must_xp(&["compare", experiment, "--json"]);
    let lines: Vec<serde_json::Value> = compare
        .lines()
        .map(|line| serde_json::from_str(line).unwrap())
        .collect();
    assert_eq!(lines[0]["front"]["size"], 4, "{compare}");
    assert!((lines[0]["front"]["hypervolume"].as_f64().unwrap() - expected).abs() < 1e-9);
    assert_eq!(lines.len(), 1 + 6, "{compare}");
}

/// A MOTPE sweep runs its budget and reports a front on the script's line,
/// with the default reference point.
fn check_tpe_front(cluster: &TestCluster, script: &std::path::Path) {
    let tpe = cluster.write_file(
        "front-tpe.yaml",
        &format!(
            "name: front-tpe\ntrial:\n  command: [sh, {}, '{{x}}']\nsearch:\n  algorithm: tpe\n  space: {{x: {{uniform: [0.0, 1.0]}}}}\n  metric: [a, b]\n  mode: [max, min]\n  trials: 8\n  parallel: 2\n  seed: 3\n",
            script.display()
        ),
    );
    let experiment = cluster
        .must_xp(&["submit", tpe.to_str().unwrap()])
        .trim()
        .to_owned();
    let status = cluster.wait_finished(&experiment, Duration::from_secs(120));
    assert_eq!(trials(&status).len(), 8, "{status:#}");
    let front = &status["front"];
    assert_eq!(front["reference_declared"], false, "{front:#}");
    // Its members lie on the line b = 10·a the script draws (awk prints b
    // with six significant digits).
    assert!(front["size"].as_u64().unwrap() >= 1, "{front:#}");
    for member in front["trials"].as_array().unwrap() {
        let a = member["values"]["a"].as_f64().unwrap();
        let b = member["values"]["b"].as_f64().unwrap();
        assert!((b - 10.0 * a).abs() < 1e-4, "{member:#}");
    }
    assert!(front["hypervolume"].as_f64().unwrap() > 0.0, "{front:#}");
}

#[test]
fn tune_reports_a_pareto_front_of_a_local_command() {
    let dir = tempfile::tempdir().unwrap();
    let space = dir.path().join("space.yaml");
    std::fs::write(&space, "x: {uniform: [0, 1]}\n").unwrap();
    let script =
        r#"awk -v x=$XP_PARAM_X 'BEGIN { printf "XP_METRIC {\"a\": %s, \"b\": %s}\n", x, x * x }'"#;
    let output = std::process::Command::new(env!("CARGO_BIN_EXE_xp"))
        .args(["tune", "--space", space.to_str().unwrap(), "--algo", "tpe"])
        .args(["--budget", "12", "--seed", "2", "--metric", "a,b"])
        .args([
            "--mode",
            "max,min",
            "--reference=0,1",
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
    assert_eq!(summary["evaluated"], 12, "{summary}");
    assert_eq!(summary["reference"], serde_json::json!([0.0, 1.0]));
    // a = x against b = x²: larger x is better in a and worse in b, so every
    // evaluation is on the front, and the hypervolume is the area under the
    // staircase of the points, which a recomputation from the lines must match.
    let front = summary["front"].as_array().unwrap();
    assert_eq!(front.len(), 12, "{summary}");
    let mut points: Vec<(f64, f64)> = lines[..12]
        .iter()
        .map(|line| {
            (
                line["values"]["a"].as_f64().unwrap(),
                line["values"]["b"].as_f64().unwrap(),
            )
        })
        .collect();
    points.sort_by(|left, right| right.0.total_cmp(&left.0));
    let mut expected = 0.0;
    let mut best_b = 1.0_f64;
    for (idx, (a, b)) in points.iter().enumerate() {
        best_b = best_b.min(*b);
        let next_a = points.get(idx + 1).map_or(0.0, |next| next.0);
        expected += (a - next_a) * (1.0 - best_b);
    }
    let hypervolume = summary["hypervolume"].as_f64().unwrap();
    assert!(
        (hypervolume - expected).abs() < 1e-9,
        "{hypervolume} {expected}"
    );
    // Several objectives with early stopping are refused, naming the option.
    let refused = std::process::Command::new(env!("CARGO_BIN_EXE_xp"))
        .args(["tune", "--space", space.to_str().unwrap(), "--budget", "2"])
        .args([
            "--metric",
            "a,b",
            "--mode",
            "max,min",
            "--early-stopping",
            "asha",
        ])
        .args(["--", "true"])
        .output()
        .unwrap();
    assert!(!refused.status.success());
    assert!(String::from_utf8_lossy(&refused.stderr).contains("--early-stopping"));
}
