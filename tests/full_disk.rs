//! A full disk under the head, or its PostgreSQL server stopped under it, is
//! survived without a restart.
//!
//! The head's data directory is a small tmpfs. While trials report metrics the
//! tmpfs is filled: the head must refuse new work with a clear error, report
//! itself unhealthy on `/healthz`, and still answer `xp status` with nothing ahead
//! of what it stored: nothing changes while nothing can be stored, not even a
//! trial whose worker exits meanwhile. Once the filler is deleted it must re-open
//! its database by itself, run new work, and end every trial with one succeeded
//! attempt and each metric step stored once; a restart afterwards shows the
//! same, so what it showed was stored.
//!
//! The same holds for a head on PostgreSQL whose server is stopped while trials
//! report, and started again.
//!
//! Skipped with a printed reason where a tmpfs cannot be mounted (not root), or
//! PostgreSQL is not installed; where CI runs, those are failures.

mod common;

use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use anyhow::Context;
use common::{TestCluster, free_tcp_port, http_get, trials, wait_until};
use serde_json::Value;

/// Steps a trial reports, but for those with `i` of 1 or 11.
const LONG_STEPS: u64 = 300;
/// Steps the trials with `i` of 1 (it ends while the disk is full) or 11 report.
const SHORT_STEPS: u64 = 100;

/// A tmpfs mounted for the test, lazily unmounted on drop.
struct Tmpfs {
    path: PathBuf,
}

impl Tmpfs {
    /// Mounts a tmpfs of `size` at `path` (created), or says why it cannot.
    fn mount(path: &Path, size: &str) -> anyhow::Result<Self> {
        std::fs::create_dir_all(path)?;
        let output = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size}"), "tmpfs"])
            .arg(path)
            .output()
            .context("cannot run mount")?;
        anyhow::ensure!(
            output.status.success(),
            "{}",
            String::from_utf8_lossy(&output.stderr).trim()
        );
        Ok(Self {
            path: path.to_owned(),
        })
    }

    /// Whether this process may mount a tmpfs at all.
    fn can_mount() -> anyhow::Result<()> {
        let dir = tempfile::tempdir()?;
        Self::mount(&dir.path().join("probe"), "1m").map(drop)
    }

    /// Writes a filler file until the disk is full; returns its path.
    fn fill(&self) -> PathBuf {
        let path = self.path.join("filler");
        let mut file = std::fs::File::create(&path).expect("the filler file");
        let chunk = vec![7u8; 64 << 10];
        while file.write_all(&chunk).is_ok() {}
        while file.write_all(&[7u8]).is_ok() {}
        let _ = file.sync_all();
        path
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(&self.path).status();
    }
}

/// A trial program that reports a loss and twenty long-named metrics (so the
/// head's database grows quickly), a little apart: [`SHORT_STEPS`] steps when its
/// argument is 1 or 11, else [`LONG_STEPS`].
fn emitter_script() -> String {
    let padding: String = (0..20)
        .map(|index| format!(", \\\"padding_metric_with_a_long_name_number_{index:02}\\\": 1.5"))
        .collect();
    format!(
        "steps={LONG_STEPS}\ncase \"$1\" in 1|11) steps={SHORT_STEPS};; esac\nstep=0\nwhile [ \"$step\" -lt \"$steps\" ]; do\n  step=$((step + 1))\n  echo \"XP_METRIC {{\\\"step\\\": $step, \\\"loss\\\": $step{padding}}}\"\n  sleep 0.05\ndone\n"
    )
}

/// How many steps `trial` reports.
fn steps_of(trial: &Value) -> u64 {
    if trial["config"]["i"] == 1 || trial["config"]["i"] == 11 {
        SHORT_STEPS
    } else {
        LONG_STEPS
    }
}

fn experiment_yaml(name: &str, script: &Path, trials: &[u32]) -> String {
    let values: Vec<String> = trials.iter().map(ToString::to_string).collect();
    format!(
        "name: {name}\ntrial:\n  command: [sh, {}, '{{i}}']\nsearch:\n  algorithm: grid\n  space: {{i: {{choice: [{}]}}}}\n",
        script.display(),
        values.join(", ")
    )
}

/// Each trial's state, number of attempts and last step, by trial id.
fn shown(status: &Value) -> BTreeMap<String, (String, usize, Value)> {
    trials(status)
        .iter()
        .map(|trial| {
            (
                trial["id"].as_str().expect("a trial id").to_owned(),
                (
                    trial["state"].as_str().expect("a state").to_owned(),
                    trial["attempts"].as_array().expect("attempts").len(),
                    trial["last_step"].clone(),
                ),
            )
        })
        .collect()
}

fn healthz(http: &str) -> Option<(u16, String)> {
    http_get(http, "/healthz")
}

/// Checks that every trial of `experiment` succeeded in one attempt and stored
/// each of its metric steps once.
fn check_ran_once(cluster: &TestCluster, experiment: &str) {
    let status = cluster.status(experiment);
    assert_eq!(status["state"], "succeeded", "{status:#}");
    for trial in trials(&status) {
        let attempts = trial["attempts"].as_array().expect("attempts");
        assert_eq!(attempts.len(), 1, "{trial:#}");
        assert_eq!(attempts[0]["outcome"], "succeeded", "{trial:#}");
        let id = trial["id"].as_str().expect("a trial id");
        let line = cluster.must_xp(&["metrics", id, "--name", "loss", "--json"]);
        let series: Value = serde_json::from_str(line.trim()).expect("metrics are JSON");
        let stored: Vec<u64> = series["steps"]
            .as_array()
            .expect("steps")
            .iter()
            .map(|step| step.as_u64().expect("a step"))
            .collect();
        let expected: Vec<u64> = (1..=steps_of(trial)).collect();
        assert_eq!(stored, expected, "trial {id}: each step once, in order");
    }
}

fn head_log(cluster: &TestCluster) -> String {
    let mut text = String::new();
    for entry in std::fs::read_dir(cluster.dir.path())
        .expect("cluster dir")
        .flatten()
    {
        let name = entry.file_name().to_string_lossy().into_owned();
        if name.starts_with("head-") && name.ends_with(".log") {
            text.push_str(&std::fs::read_to_string(entry.path()).unwrap_or_default());
        }
    }
    text
}

#[test]
fn a_full_disk_is_survived_without_a_restart() {
    if !can_mount_or_say_why() {
        return;
    }
    let http = format!("127.0.0.1:{}", free_tcp_port());
    let mut mounted = None;
    let mut cluster = TestCluster::start_prepared("10s", &["--http", &http], |head_dir| {
        mounted = Some(Tmpfs::mount(head_dir, "24m").expect("mount the head's tmpfs"));
    });
    // Dropped before the cluster: unmounted lazily while the processes still run.
    let tmpfs = mounted.take().expect("mounted");
    cluster.start_node("a", 0, 4);
    cluster.wait_for_nodes(1);
    wait_until("a healthy head", Duration::from_secs(30), || {
        healthz(&http).filter(|(code, _)| *code == 200)
    });

    let (long, short_yaml) = must_run_reporting_trials(&cluster);
    // Fill the disk while the trials report: the head must notice and refuse work.
    let filler = tmpfs.fill();
    check_outage_refuses_work(&cluster, &http, &short_yaml, "its disk is full");
    // Reads still answer, and nothing changes while nothing can be stored.
    let during = check_nothing_changes_while_full(&cluster, &http, &long);
    // Room again: the head re-opens its database by itself and carries on.
    std::fs::remove_file(&filler).expect("delete the filler");
    let short = check_head_carries_on(&cluster, &http, &long, &short_yaml, &during);
    // The error was logged with back-off, not in a loop.
    check_storage_error_logged_with_backoff(&cluster);
    // A restart shows the same: everything shown was stored.
    check_restart_shows_the_same(&mut cluster, &long, &short);
    drop(tmpfs);
}

#[test]
fn a_stopped_postgres_is_survived_without_a_restart() {
    let http = format!("127.0.0.1:{}", free_tcp_port());
    let Some(mut cluster) = TestCluster::start_on_postgres("10s", &["--http", &http]) else {
        return;
    };
    cluster.start_node("a", 0, 4);
    cluster.wait_for_nodes(1);
    let (long, short_yaml) = must_run_reporting_trials(&cluster);
    cluster.postgres().stop();
    check_outage_refuses_work(&cluster, &http, &short_yaml, "its database failed");
    let during = check_nothing_changes_while_full(&cluster, &http, &long);
    cluster
        .postgres()
        .restart()
        .expect("PostgreSQL starts again");
    let short = check_head_carries_on(&cluster, &http, &long, &short_yaml, &during);
    check_storage_error_logged_with_backoff(&cluster);
    check_restart_shows_the_same(&mut cluster, &long, &short);
}

/// Whether a tmpfs can be mounted here; says why the test is skipped when not.
fn can_mount_or_say_why() -> bool {
    match Tmpfs::can_mount() {
        Ok(()) => true,
        Err(reason) => {
            common::cannot_run(&format!(
                "cannot mount a tmpfs here (needs root): {reason:#}"
            ));
            false
        }
    }
}

/// Writes the long experiment (four trials) and the short one (one), submits
/// the long one and waits until every trial runs and reports; the long
/// experiment and the short one's file.
fn must_run_reporting_trials(cluster: &TestCluster) -> (String, PathBuf) {
    let script = cluster.write_file("emit.sh", &emitter_script());
    let long_yaml = cluster.write_file(
        "long.yaml",
        &experiment_yaml("long", &script, &[1, 2, 3, 4]),
    );
    let short_yaml = cluster.write_file("short.yaml", &experiment_yaml("short", &script, &[11]));
    let long = cluster
        .must_xp(&["submit", long_yaml.to_str().expect("UTF-8")])
        .trim()
        .to_owned();
    wait_until("every trial reporting", Duration::from_secs(120), || {
        let status = cluster.status(&long);
        trials(&status)
            .iter()
            .all(|trial| trial["state"] == "running" && trial["last_step"].as_u64() >= Some(5))
            .then_some(())
    });
    (long, short_yaml)
}

/// Without storage the head reports itself unhealthy and refuses a submission,
/// saying why (`cause`).
fn check_outage_refuses_work(cluster: &TestCluster, http: &str, short_yaml: &Path, cause: &str) {
    let (_, problem) = wait_until(
        "the head to report itself unhealthy",
        Duration::from_secs(90),
        || healthz(http).filter(|(code, _)| *code != 200),
    );
    assert!(problem.contains(cause), "{problem}");
    let refused = cluster.xp(&["submit", short_yaml.to_str().expect("UTF-8")]);
    let refusal = String::from_utf8_lossy(&refused.stderr);
    assert!(
        !refused.status.success(),
        "a submit was taken on a full disk"
    );
    assert!(
        refusal.contains(&format!("the head cannot store anything: {cause}"))
            && refusal.contains("retry later"),
        "{refusal}"
    );
}

/// Reads still answer, and nothing changes while nothing can be stored: not
/// even the trial whose worker exits meanwhile (its exit is not stored yet).
/// What was shown.
fn check_nothing_changes_while_full(
    cluster: &TestCluster,
    http: &str,
    long: &str,
) -> BTreeMap<String, (String, usize, Value)> {
    let status = cluster.status(long);
    let during = shown(&status);
    let ending = trials(&status)
        .iter()
        .find(|trial| steps_of(trial) == SHORT_STEPS)
        .and_then(|trial| trial["id"].as_str())
        .expect("the short trial")
        .to_owned();
    cluster.must_xp(&["nodes"]);
    assert!(!cluster.xp(&["cancel", long]).status.success());
    wait_until(
        "the short trial's worker to exit",
        Duration::from_secs(60),
        || {
            cluster
                .node_log("a")
                .contains(&format!("worker exited worker={ending}/a1/r0"))
                .then_some(())
        },
    );
    assert_eq!(shown(&cluster.status(long)), during);
    assert!(healthz(http).is_some_and(|(code, _)| code != 200));
    during
}

/// With room again the head is healthy by itself, takes the short
/// experiment, and every trial runs once; what was shown during the outage
/// was stored. The short experiment.
fn check_head_carries_on(
    cluster: &TestCluster,
    http: &str,
    long: &str,
    short_yaml: &Path,
    during: &BTreeMap<String, (String, usize, Value)>,
) -> String {
    wait_until(
        "the head to be healthy again",
        Duration::from_secs(60),
        || healthz(http).filter(|(code, _)| *code == 200),
    );
    let short = cluster
        .must_xp(&["submit", short_yaml.to_str().expect("UTF-8")])
        .trim()
        .to_owned();
    cluster.wait_finished(long, Duration::from_secs(240));
    cluster.wait_finished(&short, Duration::from_secs(120));
    check_ran_once(cluster, long);
    check_ran_once(cluster, &short);
    // What was shown during the outage was stored: nothing went back.
    let after = shown(&cluster.status(long));
    for (trial, (state, attempts, _)) in during {
        assert!(
            *attempts <= 1,
            "{trial} had {attempts} attempts during the outage"
        );
        if state == "succeeded" {
            assert_eq!(after[trial].0, "succeeded", "{trial}");
        }
    }
    short
}

/// The storage error was logged with back-off, not in a loop, and the
/// recovery too.
fn check_storage_error_logged_with_backoff(cluster: &TestCluster) {
    let log = head_log(cluster);
    let storage_lines = log
        .lines()
        .filter(|line| line.contains("cannot store anything"))
        .count();
    assert!(
        (1..=20).contains(&storage_lines),
        "{storage_lines} log lines about the storage failure"
    );
    assert!(log.contains("the head can store again"), "{log}");
}

/// After a restart of the head, everything shown before is shown again.
fn check_restart_shows_the_same(cluster: &mut TestCluster, long: &str, short: &str) {
    let before_restart = (shown(&cluster.status(long)), shown(&cluster.status(short)));
    cluster.kill_head();
    cluster.restart_head();
    cluster.wait_for_nodes(1);
    assert_eq!(
        (shown(&cluster.status(long)), shown(&cluster.status(short))),
        before_restart
    );
}
