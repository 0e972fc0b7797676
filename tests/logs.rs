//! End-to-end: a command trial printing well past its node's log cap, with
//! metric lines in between. Every metric arrives; `xp logs` shows the head, the
//! marker naming the dropped bytes and the tail, exactly; `xp logs --follow`,
//! started while the trial runs, never repeats or skips a kept byte; the log's
//! files never exceed the cap.

mod common;

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use common::{TestCluster, trials, wait_until};

/// The node's log cap in the test, and its half kept as the head.
const CAP: u64 = 2 << 20;
/// Output lines and the metric line interval: about 7.5 MB in all.
const LINES: u32 = 120_000;
const METRIC_EVERY: u32 = 1_000;

/// A script printing `LINES` lines with a metric line every `METRIC_EVERY`,
/// after two seconds (so a follower can attach first) unless `XP_TEST_NO_SLEEP`
/// is set.
fn script() -> String {
    format!(
        "[ -n \"$XP_TEST_NO_SLEEP\" ] || sleep 2\nawk 'BEGIN {{ for (i = 0; i < {LINES}; i++) {{ if (i % {METRIC_EVERY} == 0) printf \"XP_METRIC {{\\\"step\\\": %d, \\\"i\\\": %d}}\\n\", i, i; printf \"line %08d the quick brown fox jumps over the lazy dog\\n\", i }} print \"the last line\" }}'\n"
    )
}

/// What the script prints.
fn expected_output(script: &Path) -> Vec<u8> {
    let output = Command::new("sh")
        .arg(script)
        .env("XP_TEST_NO_SLEEP", "1")
        .output()
        .expect("sh runs the script");
    assert!(output.status.success());
    output.stdout
}

/// The numbers in a marker line `[xp: N bytes dropped here; the log keeps its
/// first X and last Y]`.
fn parse_marker(line: &str) -> (u64, u64, u64) {
    let numbers: Vec<u64> = line
        .split(|c: char| !c.is_ascii_digit())
        .filter(|part| !part.is_empty())
        .map(|part| part.parse().expect("a number"))
        .collect();
    assert_eq!(numbers.len(), 3, "{line}");
    (numbers[0], numbers[1], numbers[2])
}

/// Walks what a reader printed: kept bytes at their offsets, and markers that
/// move the offset past exactly the bytes they name. Returns the markers.
fn check_against_output(printed: &[u8], output: &[u8]) -> Vec<(u64, u64, u64)> {
    let mut markers = Vec::new();
    let mut offset = 0usize;
    let mut rest = printed;
    loop {
        let marker_at = rest.windows(5).position(|window| window == b"[xp: ");
        let kept = &rest[..marker_at.unwrap_or(rest.len())];
        let kept_matches = |kept: &[u8]| output.get(offset..offset + kept.len()) == Some(kept);
        let kept = if kept_matches(kept) {
            kept
        } else {
            // The marker starts a line of its own: a newline may have been added.
            let trimmed = kept
                .strip_suffix(b"\n")
                .expect("kept bytes at their offset");
            assert!(kept_matches(trimmed), "bytes at offset {offset} differ");
            trimmed
        };
        offset += kept.len();
        let Some(marker_at) = marker_at else {
            break;
        };
        let line_end = marker_at
            + rest[marker_at..]
                .iter()
                .position(|byte| *byte == b'\n')
                .expect("the marker ends its line");
        let marker = parse_marker(std::str::from_utf8(&rest[marker_at..line_end]).unwrap());
        offset += marker.0 as usize;
        markers.push(marker);
        rest = &rest[line_end + 1..];
    }
    assert_eq!(offset, output.len(), "the reader reached the end");
    markers
}

fn log_files(node_dir: &Path, trial: &str) -> Vec<PathBuf> {
    let dir = node_dir.join("logs").join(trial).join("a1");
    std::fs::read_dir(&dir)
        .expect("the worker's log directory")
        .map(|entry| entry.expect("an entry").path())
        .collect()
}

#[test]
fn a_trial_printing_past_the_cap_keeps_head_marker_tail_and_every_metric() {
    let mut cluster = TestCluster::start("10s");
    cluster.start_node_with("a", 0, 2, &["--log-cap", "2MiB"]);
    cluster.wait_for_nodes(1);
    let script_path = cluster.write_file("print.sh", &script());
    let output = expected_output(&script_path);
    assert!(
        output.len() as u64 > 3 * CAP,
        "the output is well past the cap"
    );
    let (experiment, trial) = must_start_printing_trial(&cluster, &script_path);
    // Follow while it prints.
    check_follow_sees_the_kept_output(&cluster, &experiment, &trial, &output);
    // Every metric line arrived.
    let metrics = cluster.must_xp(&["metrics", &trial, "--name", "i", "--json"]);
    let metrics: serde_json::Value = serde_json::from_str(metrics.trim()).expect("JSON");
    let values = metrics["values"].as_array().expect("values");
    assert_eq!(values.len(), (LINES / METRIC_EVERY) as usize, "{metrics}");
    assert_eq!(
        values.last().and_then(serde_json::Value::as_f64),
        Some(f64::from(LINES - METRIC_EVERY))
    );

    // `xp logs`: exactly the head, one marker, and the tail.
    let marker = check_logs_keep_head_marker_tail(&cluster, &trial, &output);
    // On disk: the head, the tail segments and the marker file, within the cap.
    check_log_files_within_the_cap(&cluster, &trial, marker);
}

/// Submits the printing trial and waits until it has started; the experiment
/// and the trial.
fn must_start_printing_trial(cluster: &TestCluster, script_path: &Path) -> (String, String) {
    let spec = cluster.write_file(
        "logs.yaml",
        &format!(
            "name: logs\ntrial:\n  command: [sh, '{}']\n  resources: {{cpu: 1}}\n",
            script_path.display()
        ),
    );
    let experiment = cluster
        .must_xp(&["submit", spec.to_str().expect("UTF-8")])
        .trim()
        .to_owned();
    let trial = wait_until("the trial to run", Duration::from_secs(30), || {
        let status = cluster.status(&experiment);
        let trial = trials(&status).first()?.clone();
        // Running, or (on a slow machine) already past it: the follower then
        // reads the finished log.
        let started = !matches!(
            trial["state"].as_str(),
            Some("pending" | "queued" | "placed")
        );
        started.then(|| trial["id"].as_str().expect("id").to_owned())
    });
    (experiment, trial)
}

/// `xp logs --follow` while the trial prints ends with it, having printed
/// what the cap keeps.
fn check_follow_sees_the_kept_output(
    cluster: &TestCluster,
    experiment: &str,
    trial: &str,
    output: &[u8],
) {
    let mut follower = Command::new(env!("CARGO_BIN_EXE_xp"))
        .args(["logs", trial, "--follow"])
        .env("XP_CLUSTER", &cluster.join)
        .stdout(Stdio::piped())
        .spawn()
        .expect("xp logs --follow starts");
    let mut follower_out = follower.stdout.take().expect("piped stdout");
    let followed = std::thread::spawn(move || {
        let mut printed = Vec::new();
        follower_out
            .read_to_end(&mut printed)
            .expect("read the follower");
        printed
    });
    let done = cluster.wait_finished(experiment, Duration::from_secs(120));
    assert_eq!(done["state"], "succeeded", "{done:#}");
    let status = wait_until(
        "xp logs --follow to end with the trial",
        Duration::from_secs(30),
        || follower.try_wait().expect("poll the follower"),
    );
    assert!(status.success(), "xp logs --follow failed");
    check_against_output(&followed.join().expect("the follower's reader"), output);
}

/// `xp logs` prints exactly the head, one marker, and the tail; the marker.
fn check_logs_keep_head_marker_tail(
    cluster: &TestCluster,
    trial: &str,
    output: &[u8],
) -> (u64, u64, u64) {
    let printed = cluster.xp(&["logs", trial]);
    assert!(printed.status.success());
    let markers = check_against_output(&printed.stdout, output);
    assert_eq!(markers.len(), 1, "{markers:?}");
    let (dropped, head, tail) = markers[0];
    assert_eq!(head, CAP / 2);
    assert!((3 * CAP / 8..=CAP / 2).contains(&tail), "tail of {tail}");
    assert_eq!(dropped + head + tail, output.len() as u64);
    let text = String::from_utf8(printed.stdout).expect("text");
    assert!(text.starts_with("XP_METRIC {\"step\": 0, \"i\": 0}\nline 00000000 the quick"));
    assert!(text.ends_with(&format!(
        "line {:08} the quick brown fox jumps over the lazy dog\nthe last line\n",
        LINES - 1
    )));

    markers[0]
}

/// The log's files (the head, the tail segments and the marker file) stay
/// within the cap, and the marker file says what `xp logs` says.
fn check_log_files_within_the_cap(cluster: &TestCluster, trial: &str, marker: (u64, u64, u64)) {
    let files = log_files(&cluster.node_dir("a"), trial);
    let on_disk: u64 = files
        .iter()
        .map(|file| std::fs::metadata(file).expect("a log file").len())
        .sum();
    assert!(on_disk <= CAP + 200, "{on_disk} bytes on disk: {files:?}");
    let marker_file = files
        .iter()
        .find(|file| file.to_string_lossy().ends_with(".dropped"))
        .expect("a marker file");
    assert_eq!(
        parse_marker(&std::fs::read_to_string(marker_file).expect("the marker")),
        marker,
        "the marker on disk says what `xp logs` says"
    );
}
