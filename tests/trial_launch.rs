//! A trial's command as a user writes it, run by a real node (as root, under
//! per-trial user ids; elsewhere as the node's user):
//!
//! - the worker runs in its own work directory (`XP_WORK_DIR`), not where the
//!   node was started, so the relative files it writes land there; its
//!   command's relative paths (`./train.sh`, `data/value.txt`) are found in
//!   the directory the spec was submitted from, with `xp submit sweep.yaml`
//!   run there;
//! - a failed attempt's outcome ends with the last lines of the rank's stderr,
//!   as `xp status --json` shows it;
//! - a command that cannot run fails at launch saying which of not found, not
//!   executable and (as root) permission denied, naming the path and what to
//!   do.

mod common;

use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::Command;
use std::time::Duration;

use common::{TestCluster, must_succeed, trials};
use serde_json::Value;

/// The trial's script: checks where it runs, writes a relative checkpoint
/// directory as `xp.checkpoint(step, "ckpt")` would, reads the data file it
/// was given, and reports what it found.
const TRAIN: &str = r#"#!/bin/sh
set -e
mkdir -p ckpt
echo 1 > ckpt/state
in_work_dir=0
[ "$(pwd -P)" = "$(cd "$XP_WORK_DIR" && pwd -P)" ] && [ -f "$XP_WORK_DIR/ckpt/state" ] && in_work_dir=1
value=$(cat "$1")
echo "XP_METRIC {\"step\": 1, \"in_work_dir\": $in_work_dir, \"value\": $value, \"uid\": $(id -u)}"
"#;

/// Makes `dir` (with its files) and `chmod`s it to `mode`.
fn write(dir: &Path, name: &str, text: &str, mode: u32) {
    let path = dir.join(name);
    std::fs::create_dir_all(path.parent().expect("a parent")).expect("directories");
    std::fs::write(&path, text).expect("a file");
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(mode)).expect("chmod");
}

/// `xp submit FILE` run in `dir`, as a user does from their project; the
/// experiment id.
fn submit_from(cluster: &TestCluster, dir: &Path, file: &str) -> String {
    let args = ["submit", file];
    let output = Command::new(env!("CARGO_BIN_EXE_xp"))
        .args(args)
        .current_dir(dir)
        .env("XP_CLUSTER", &cluster.join)
        .output()
        .expect("xp runs");
    must_succeed(&args, output).trim().to_owned()
}

/// The outcome of the first attempt of the experiment's only trial, once it
/// finished.
fn first_outcome(cluster: &TestCluster, experiment: &str) -> (Value, String) {
    let status = cluster.wait_finished(experiment, Duration::from_secs(60));
    let trial = trials(&status)[0].clone();
    let outcome = trial["attempts"][0]["outcome"]
        .as_str()
        .unwrap_or_else(|| panic!("an outcome in {trial:#}"))
        .to_owned();
    (trial, outcome)
}

fn root() -> bool {
    nix::unistd::geteuid().is_root()
}

#[test]
fn a_trial_runs_in_its_work_dir_and_finds_its_files_where_it_was_submitted() {
    let mut cluster = TestCluster::start("10s");
    cluster.start_node("a", 0, 2);
    cluster.wait_for_nodes(1);
    let project = cluster.dir.path().join("project");
    write(&project, "train.sh", TRAIN, 0o755);
    write(&project, "data/value.txt", "42\n", 0o644);
    write(
        &project,
        "sweep.yaml",
        "name: relative\ntrial: {command: [./train.sh, data/value.txt]}\n",
        0o644,
    );
    let experiment = submit_from(&cluster, &project, "sweep.yaml");
    let status = cluster.wait_finished(&experiment, Duration::from_secs(60));
    let trial = &trials(&status)[0];
    assert_eq!(trial["state"], "succeeded", "{trial:#}");
    assert_eq!(trial["metrics"]["in_work_dir"], 1.0, "{trial:#}");
    assert_eq!(trial["metrics"]["value"], 42.0, "{trial:#}");
    if root() {
        assert_ne!(
            trial["metrics"]["uid"], 0.0,
            "a user id of its own: {trial:#}"
        );
    }
    // The same spec from elsewhere: `sh train.sh` finds the script as an argument.
    write(
        &project,
        "sh.yaml",
        "name: argument\ntrial: {command: [sh, train.sh, data/value.txt]}\n",
        0o644,
    );
    let experiment = submit_from(&cluster, cluster.dir.path(), "project/sh.yaml");
    let status = cluster.wait_finished(&experiment, Duration::from_secs(60));
    assert_eq!(trials(&status)[0]["state"], "succeeded", "{status:#}");
}

#[test]
fn a_failed_attempt_keeps_the_end_of_its_stderr() {
    let mut cluster = TestCluster::start("10s");
    cluster.start_node("a", 0, 2);
    cluster.wait_for_nodes(1);
    let script = r#"for i in $(seq 1 40); do echo "noise $i" >&2; done
echo 'Traceback (most recent call last):' >&2
printf '  File "train.py", line 3\nValueError: lr must be positive\n' >&2
exit 2"#;
    let spec = format!(
        "name: failing\ntrial: {{command: {}}}\n",
        serde_json::to_string(&["sh", "-c", script]).expect("JSON is YAML")
    );
    let path = cluster.write_file("failing.yaml", &spec);
    let experiment = cluster
        .must_xp(&["submit", path.to_str().expect("UTF-8")])
        .trim()
        .to_owned();
    let (trial, outcome) = first_outcome(&cluster, &experiment);
    assert_eq!(trial["state"], "failed", "{trial:#}");
    let expected_end = "Traceback (most recent call last):\n  File \"train.py\", line 3\nValueError: lr must be positive";
    assert!(
        outcome.starts_with("failed: rank 0 exited with status 2: noise 24\n")
            && outcome.ends_with(expected_end),
        "the last 20 lines of stderr after the exit: {outcome:?}"
    );
}

/// Submits a one-trial experiment running `command` (JSON); its first
/// attempt's outcome.
fn outcome_of(cluster: &TestCluster, name: &str, command: &str) -> String {
    let path = cluster.write_file(
        &format!("{name}.yaml"),
        &format!("name: {name}\ntrial: {{command: {command}}}\n"),
    );
    let experiment = cluster
        .must_xp(&["submit", path.to_str().expect("UTF-8")])
        .trim()
        .to_owned();
    first_outcome(cluster, &experiment).1
}

#[test]
fn a_command_that_cannot_run_fails_at_launch_saying_why() {
    let mut cluster = TestCluster::start("10s");
    cluster.start_node("a", 0, 2);
    cluster.wait_for_nodes(1);
    let dir = cluster.dir.path().to_owned();
    let show = |text: &str| text.replace("DIR", &dir.display().to_string());
    write(&dir, "plain.sh", "echo hi\n", 0o644);
    write(&dir, "lost.sh", "#!/no/such/python3\n", 0o755);
    let cases = [
        (
            "missing",
            r#"["no-such-program-xp", "--help"]"#.to_owned(),
            "failed: rank 0 could not start: cannot start no-such-program-xp: not found: no directory of the worker's PATH".to_owned(),
        ),
        (
            "plain",
            show(r#"["DIR/plain.sh"]"#),
            show("failed: rank 0 could not start: cannot start DIR/plain.sh: not executable: DIR/plain.sh: it has no execute permission"),
        ),
        (
            "interpreter",
            show(r#"["DIR/lost.sh"]"#),
            show("failed: rank 0 could not start: cannot start DIR/lost.sh: the interpreter on the #! line of DIR/lost.sh cannot run: not found: /no/such/python3 does not exist"),
        ),
    ];
    for (name, command, expected) in cases {
        let outcome = outcome_of(&cluster, name, &command);
        assert!(
            outcome.starts_with(&expected),
            "{name}: {outcome:?} does not start with {expected:?}"
        );
    }
    if !root() {
        return;
    }
    // As pyenv under /root: an interpreter the worker's user id cannot reach.
    write(&dir, "private/bin/python3", "#!/bin/sh\necho hi\n", 0o755);
    std::fs::set_permissions(dir.join("private"), std::fs::Permissions::from_mode(0o700))
        .expect("chmod");
    write(
        &dir,
        "train.sh",
        &show("#!DIR/private/bin/python3\n"),
        0o755,
    );
    let outcome = outcome_of(&cluster, "private", &show(r#"["DIR/train.sh"]"#));
    for expected in [
        show(
            "cannot start DIR/train.sh: the interpreter on the #! line of DIR/train.sh cannot run: permission denied: the worker's user id ",
        ),
        show(
            " may not run DIR/private/bin/python3: DIR/private does not let it through (mode 0700, owner 0:0); make it readable and executable by other users",
        ),
        "or run the node with --worker-uids none".to_owned(),
    ] {
        assert!(
            outcome.contains(&expected),
            "{expected:?} not in {outcome:?}"
        );
    }
}
