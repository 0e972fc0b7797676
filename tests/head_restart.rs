//! End-to-end: a head killed with SIGKILL while trials run, and started again
//! (at once, or after its nodes noticed and began to retry), adopts what its
//! nodes finished and still run while it was away instead of running it again.
//!
//! Each trial appends a line to a file shared by the test when it starts and when
//! it ends, so a trial run twice shows up twice; trials wait on gate files that
//! the test creates, so which trials end while the head is down, while the nodes
//! come back, and after they are back does not depend on timing.

mod common;

use std::path::{Path, PathBuf};
use std::time::Duration;

use common::{TestCluster, trials, wait_until};

/// The trial program: `trial.sh DIR I`. Trials 1 and 2 end once `DIR/outage`
/// exists, 3 and 4 once `DIR/restarted` does, 5 and 6 once `DIR/returned` does.
const TRIAL_SCRIPT: &str = r#"
dir="$1"
i="$2"
echo "start $i attempt $XP_ATTEMPT" >> "$dir/runs"
echo "XP_METRIC {\"step\": 1, \"i\": $i}"
case "$i" in
  1|2) gate=outage ;;
  3|4) gate=restarted ;;
  *) gate=returned ;;
esac
while [ ! -e "$dir/$gate" ]; do sleep 0.1; done
echo "XP_METRIC {\"step\": 2, \"i\": $i, \"done\": 1}"
echo "end $i" >> "$dir/ends"
"#;

/// The lines of `path`, none when it does not exist yet.
fn lines_of(path: &Path) -> Vec<String> {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .map(str::to_owned)
        .collect()
}

/// Creates the gate file `name` in `dir`.
fn open_gate(dir: &Path, name: &str) {
    std::fs::write(dir.join(name), "").expect("create a gate file");
}

/// How many times `message` appears in node `name`'s log.
fn node_logged(cluster: &TestCluster, name: &str, message: &str) -> usize {
    cluster.node_log(name).matches(message).count()
}

#[test]
fn a_head_restarted_at_once_adopts_trials_that_ended_or_ran_while_it_was_down() {
    let cluster = check_restart_adopts_everything(TestCluster::start("10s"), false);
    // The embedded store a SIGKILL left is repaired before the head serves,
    // and the head says so.
    let log = std::fs::read_to_string(cluster.head_log_path()).expect("the head's log");
    assert!(
        log.contains("repairing the registry database after an unclean stop"),
        "{log}"
    );
}

#[test]
fn a_head_restarted_after_its_nodes_gave_up_on_it_adopts_everything_too() {
    check_restart_adopts_everything(TestCluster::start("10s"), true);
}

/// The same on a head that keeps its records in PostgreSQL: killed with
/// SIGKILL, started again on the same database.
#[test]
fn a_head_on_postgres_restarted_at_once_adopts_everything_too() {
    if let Some(cluster) = TestCluster::start_on_postgres("10s", &[]) {
        check_restart_adopts_everything(cluster, false);
    }
}

/// Runs six gated trials on two nodes, kills the head while they run, lets two
/// end, and starts the head again: at once (before the nodes notice), or, with
/// `after_nodes_noticed`, once both nodes have seen the session die and failed
/// to reach the head. Then checks that every trial ran exactly once and that
/// its last metrics arrived.
/// Returns the cluster, its head restarted.
fn check_restart_adopts_everything(
    mut cluster: TestCluster,
    after_nodes_noticed: bool,
) -> TestCluster {
    cluster.start_node("a", 0, 3);
    cluster.start_node("b", 0, 3);
    cluster.wait_for_nodes(2);
    let shared = must_make_shared_files(&cluster);
    let experiment = must_submit_gated_trials(&cluster, &shared);
    // Every trial runs (the head has recorded its start) before the head dies.
    wait_until("six running trials", Duration::from_secs(120), || {
        let status = cluster.status(&experiment);
        let running = trials(&status)
            .iter()
            .filter(|trial| trial["state"] == "running")
            .count();
        (running == 6 && lines_of(&shared.join("runs")).len() == 6).then_some(())
    });
    cluster.kill_head();
    must_restart_through_the_gates(&mut cluster, &shared, after_nodes_noticed);
    check_every_trial_ran_once(&cluster, &experiment, &shared);
    cluster
}

/// The directory the trials share, with the two files they append to.
/// Workers of a root node run under ids of their own, and all append to the
/// same two files: made here, writable by every user.
fn must_make_shared_files(cluster: &TestCluster) -> PathBuf {
    let shared = cluster.dir.path().join("shared");
    std::fs::create_dir(&shared).expect("the shared directory");
    for (path, mode) in [
        (shared.clone(), 0o1777),
        (shared.join("runs"), 0o666),
        (shared.join("ends"), 0o666),
    ] {
        if mode == 0o666 {
            std::fs::write(&path, "").expect("a shared file");
        }
        std::fs::set_permissions(&path, std::os::unix::fs::PermissionsExt::from_mode(mode))
            .expect("writable by every worker");
    }
    shared
}

/// Submits the six gated trials; the experiment.
fn must_submit_gated_trials(cluster: &TestCluster, shared: &Path) -> String {
    let script = cluster.write_file("trial.sh", TRIAL_SCRIPT);
    let spec = cluster.write_file(
        "restart.yaml",
        &format!(
            "name: restart\ntrial:\n  command: [sh, '{}', '{}', '{{i}}']\n  resources: {{cpu: 1}}\nsearch:\n  algorithm: grid\n  space: {{i: {{int: [1, 6]}}}}\n",
            script.display(),
            shared.display()
        ),
    );
    cluster
        .must_xp(&["submit", spec.to_str().unwrap()])
        .trim()
        .to_owned()
}

/// With the head down, trials 1 and 2 end; the head starts again (with
/// `after_nodes_noticed`, once both nodes failed to reach it), trials 3 and 4
/// end while the nodes come back, 5 and 6 on the new sessions.
fn must_restart_through_the_gates(
    cluster: &mut TestCluster,
    shared: &Path,
    after_nodes_noticed: bool,
) {
    // Trials 1 and 2 end while no head is there to hear it.
    open_gate(shared, "outage");
    wait_until(
        "two trials to end while the head is down",
        Duration::from_secs(60),
        || (lines_of(&shared.join("ends")).len() >= 2).then_some(()),
    );
    if after_nodes_noticed {
        for name in ["a", "b"] {
            wait_until(
                &format!("node {name} to fail to reach the head"),
                Duration::from_secs(120),
                || (node_logged(cluster, name, "cannot reach the head") >= 1).then_some(()),
            );
        }
    }
    cluster.restart_head();
    // Trials 3 and 4 end while the nodes are still coming back.
    open_gate(shared, "restarted");
    for name in ["a", "b"] {
        wait_until(
            &format!("node {name} to reconnect"),
            Duration::from_secs(120),
            || (node_logged(cluster, name, "connected to the head") >= 2).then_some(()),
        );
    }
    // Trials 5 and 6 end on the new sessions.
    open_gate(shared, "returned");
}

/// Every trial succeeded in one attempt with its last metrics, and started
/// and ended exactly once.
fn check_every_trial_ran_once(cluster: &TestCluster, experiment: &str, shared: &Path) {
    let status = cluster.wait_finished(experiment, Duration::from_secs(180));
    assert_eq!(status["state"], "succeeded", "{status:#}");
    assert_eq!(trials(&status).len(), 6, "{status:#}");
    for trial in trials(&status) {
        assert_eq!(trial["state"], "succeeded", "{trial:#}");
        let attempts = trial["attempts"].as_array().expect("attempts");
        assert_eq!(attempts.len(), 1, "the trial ran more than once: {trial:#}");
        let index = trial["config"]["i"].as_f64().expect("the trial's i");
        assert_eq!(trial["metrics"]["i"], index, "{trial:#}");
        assert_eq!(
            trial["metrics"]["done"], 1.0,
            "the final metric was lost: {trial:#}"
        );
        assert_eq!(trial["last_step"], 2, "{trial:#}");
    }
    let mut runs = lines_of(&shared.join("runs"));
    runs.sort();
    let expected: Vec<String> = (1..=6).map(|i| format!("start {i} attempt 1")).collect();
    assert_eq!(runs, expected, "every trial started exactly once");
    assert_eq!(lines_of(&shared.join("ends")).len(), 6);
}
