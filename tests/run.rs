//! End-to-end: `xp run` runs a small sweep of command trials on its embedded
//! local cluster, prints plain progress lines and the results table when its
//! output is not a terminal, and leaves a data directory that `xp status
//! --data-dir` and `xp logs --data-dir` read after it exited.

mod common;

use std::collections::BTreeMap;
use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::time::Duration;

use common::wait_until;
use serde_json::Value;

/// Four trials, `i` = 1..=4, each printing a line and the loss `(i - 3)^2`.
const SWEEP: &str = r#"
name: run-sweep
team: tests
trial:
  command: ["sh", "-c", 'echo "hello from {i}"; echo "XP_METRIC {\"step\": 1, \"loss\": $(( ({i} - 3) * ({i} - 3) ))}"']
  resources: {cpu: 1}
search:
  algorithm: grid
  space: {i: {int: [1, 4]}}
  metric: loss
  mode: min
"#;

/// Runs `xp ARGS` in `dir` with piped output, kills it if it outlives a
/// generous deadline, and returns what it printed.
fn xp(dir: &Path, args: &[&str]) -> Output {
    let mut child = Command::new(env!("CARGO_BIN_EXE_xp"))
        .args(args)
        .current_dir(dir)
        .env_remove("XP_CLUSTER")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("xp starts");
    let finished = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        wait_until(
            &format!("xp {}", args.join(" ")),
            Duration::from_secs(180),
            || child.try_wait().expect("xp can be waited for"),
        )
    }));
    if finished.is_err() {
        let _ = child.kill();
    }
    let output = child.wait_with_output().expect("xp's output");
    assert!(
        finished.is_ok() && output.status.success(),
        "xp {} failed ({:?})\nstdout:\n{}\nstderr:\n{}",
        args.join(" "),
        output.status,
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    output
}

/// The trial id and loss of every row of the results table.
fn table_rows(stdout: &str) -> BTreeMap<String, f64> {
    stdout
        .lines()
        .filter_map(|line| {
            let mut fields = line.split_whitespace();
            let id = fields.next()?;
            if !id.contains("-t") {
                return None;
            }
            assert_eq!(fields.next(), Some("succeeded"), "row: {line}");
            let loss = line
                .split_whitespace()
                .find_map(|field| field.strip_prefix("loss="))?;
            Some((id.to_owned(), loss.parse().expect("a loss")))
        })
        .collect()
}

#[test]
fn xp_run_runs_a_sweep_locally_and_leaves_its_records_readable() {
    let dir = tempfile::tempdir().expect("a temporary directory");
    std::fs::write(dir.path().join("sweep.yaml"), SWEEP).expect("the sweep is written");
    let data_dir = dir.path().join("state");
    let data_dir = data_dir.to_str().expect("a UTF-8 path");
    let rows = check_run_prints_table_and_progress(dir.path(), data_dir);
    // `xp run` has exited: the records are read from the data directory alone.
    let (experiment, best_trial) = check_status_from_data_dir(dir.path(), data_dir, &rows);
    check_logs_from_data_dir(dir.path(), data_dir, &best_trial);
    // `xp compare` reads the same records: one configuration per trial, best first.
    check_compare_from_data_dir(dir.path(), data_dir, &experiment);
}

/// `xp run` prints the results table (every trial succeeded, the best is i =
/// 3) and plain progress and event lines; the table's rows.
fn check_run_prints_table_and_progress(dir: &Path, data_dir: &str) -> BTreeMap<String, f64> {
    let run = xp(
        dir,
        &["run", "sweep.yaml", "--data-dir", data_dir, "--gpus", "0"],
    );
    let stdout = String::from_utf8(run.stdout).expect("UTF-8 output");
    let stderr = String::from_utf8(run.stderr).expect("UTF-8 output");
    assert!(
        stdout.contains("(4 trials: 4 succeeded)"),
        "the table's heading counts every trial succeeded:\n{stdout}"
    );
    let rows = table_rows(&stdout);
    assert_eq!(rows.len(), 4, "one row per trial:\n{stdout}");
    let best = stdout
        .lines()
        .find(|line| line.starts_with("best: "))
        .unwrap_or_else(|| panic!("a best line:\n{stdout}"));
    assert!(
        best.contains("loss=0.0000") && best.contains("\"i\":3"),
        "the best configuration is i = 3: {best}"
    );
    assert!(
        stderr.contains("progress: 4/4 finished"),
        "plain progress lines, not a bar:\n{stderr}"
    );
    for trial in rows.keys() {
        assert!(
            stderr.contains(&format!("{trial} succeeded")),
            "an event line for {trial}:\n{stderr}"
        );
    }
    rows
}

/// `xp status --data-dir` shows the experiment succeeded with the same trials
/// and losses as the run's table; the experiment and the best trial (i = 3).
fn check_status_from_data_dir(
    dir: &Path,
    data_dir: &str,
    rows: &BTreeMap<String, f64>,
) -> (String, String) {
    let status = xp(dir, &["status", "--data-dir", data_dir, "--json"]);
    let experiments: Vec<Value> = String::from_utf8(status.stdout)
        .expect("UTF-8 output")
        .lines()
        .map(|line| serde_json::from_str(line).expect("one JSON object per line"))
        .collect();
    assert_eq!(experiments.len(), 1);
    assert_eq!(experiments[0]["state"], "succeeded");
    let trials = experiments[0]["trials"].as_array().expect("trials");
    let mut stored = BTreeMap::new();
    let mut best_trial = None;
    for trial in trials {
        assert_eq!(trial["state"], "succeeded", "{trial}");
        let i = trial["config"]["i"].as_i64().expect("the parameter i");
        let loss = trial["metrics"]["loss"].as_f64().expect("the loss");
        assert_eq!(loss, ((i - 3) * (i - 3)) as f64, "{trial}");
        let id = trial["id"].as_str().expect("an id").to_owned();
        if i == 3 {
            best_trial = Some(id.clone());
        }
        stored.insert(id, loss);
    }
    assert_eq!(
        &stored, rows,
        "the same trials and metrics as the run's table"
    );

    let experiment = experiments[0]["id"].as_str().expect("an id").to_owned();
    (experiment, best_trial.expect("the trial with i = 3"))
}

/// `xp logs --data-dir` prints the best trial's output.
fn check_logs_from_data_dir(dir: &Path, data_dir: &str, best_trial: &str) {
    let logs = xp(dir, &["logs", "--data-dir", data_dir, best_trial]);
    let logs = String::from_utf8(logs.stdout).expect("UTF-8 output");
    assert!(
        logs.contains("hello from 3") && logs.contains("XP_METRIC"),
        "the trial's output:\n{logs}"
    );
}

/// `xp compare --data-dir` lists one configuration per trial, best first.
fn check_compare_from_data_dir(dir: &Path, data_dir: &str, experiment: &str) {
    let compare = xp(
        dir,
        &["compare", "--data-dir", data_dir, experiment, "--json"],
    );
    let configs: Vec<Value> = String::from_utf8(compare.stdout)
        .expect("UTF-8 output")
        .lines()
        .map(|line| serde_json::from_str(line).expect("one JSON object per line"))
        .collect();
    assert_eq!(configs.len(), 4, "{configs:?}");
    assert_eq!(configs[0]["config"]["i"], 3, "{configs:?}");
}
