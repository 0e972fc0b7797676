//! Standby heads on one PostgreSQL store, with real processes: a leader killed
//! with SIGKILL in the middle of a sweep is replaced by its standby, which the
//! node and the CLI find through their two-head join string, and every trial
//! ends with one attempt and each metric step stored once; a leader paused
//! (SIGSTOP) past its lease finds another head leading when it resumes, and
//! steps down.
//!
//! Skipped with a printed reason where PostgreSQL is not installed; where CI
//! runs, that is a failure.

mod common;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::{TestCluster, binary, trials, wait_until};
use serde_json::Value;

/// Steps each trial reports, 0.1 s apart.
const STEPS: u64 = 40;

fn free_udp_port() -> u16 {
    std::net::UdpSocket::bind("127.0.0.1:0")
        .and_then(|socket| socket.local_addr())
        .expect("a free port")
        .port()
}

/// A second head on the cluster's store, standing by until it leads.
struct Standby {
    child: Child,
    log: PathBuf,
    port: u16,
}

impl Standby {
    /// Starts it on `cluster`'s store, listening on `port`, naming the first head.
    fn start(cluster: &TestCluster, port: u16) -> Self {
        Self::start_as(cluster, "standby", port, cluster.port)
    }

    /// Starts head `name` (its data directory so named) on `cluster`'s store,
    /// listening on `port`, naming the head on `peer`; waits until it stands by.
    fn start_as(cluster: &TestCluster, name: &str, port: u16, peer: u16) -> Self {
        let store = cluster.store_url().expect("a cluster on PostgreSQL");
        let count = std::fs::read_dir(cluster.dir.path()).map_or(0, Iterator::count);
        let log = cluster.dir.path().join(format!("{name}-{count}.log"));
        let child = Command::new(binary("xp-head"))
            .args([
                "start",
                "--listen",
                &format!("127.0.0.1:{port}"),
                "--data-dir",
            ])
            .arg(cluster.dir.path().join(name))
            .args(["--node-timeout", "10s", "--store", &store])
            .args(["--peer", &format!("127.0.0.1:{peer}")])
            .env("XP_LOG", "info")
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).expect("standby log"))
            .spawn()
            .expect("the standby starts");
        let standby = Self { child, log, port };
        wait_until("the standby to stand by", Duration::from_secs(30), || {
            standby.logged("standing by").then_some(())
        });
        standby
    }

    fn logged(&self, text: &str) -> bool {
        std::fs::read_to_string(&self.log).is_ok_and(|log| log.contains(text))
    }
}

impl Drop for Standby {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A cluster on PostgreSQL whose head names a standby on a port chosen here,
/// the standby, and one node; `None` without PostgreSQL.
fn two_heads() -> Option<(TestCluster, Standby)> {
    let standby_port = free_udp_port();
    let peer = format!("127.0.0.1:{standby_port}");
    let mut cluster = TestCluster::start_on_postgres("10s", &["--peer", &peer])?;
    let standby = Standby::start(&cluster, standby_port);
    cluster.start_node("a", 0, 8);
    cluster.wait_for_nodes(1);
    Some((cluster, standby))
}

/// Submits 16 trials reporting [`STEPS`] steps of `loss` each, with a
/// checkpoint every ten, and waits until all of them run and report; the
/// experiment.
fn must_run_sweep(cluster: &TestCluster) -> String {
    let script = cluster.write_file(
        "steps.sh",
        &format!(
            "step=0\nwhile [ $step -lt {STEPS} ]; do\n  step=$((step + 1))\n  echo \"XP_METRIC {{\\\"step\\\": $step, \\\"loss\\\": $step}}\"\n  if [ $((step % 10)) -eq 0 ]; then\n    echo $step > \"$XP_CHECKPOINT_DIR/step\"\n    echo \"XP_CHECKPOINT {{\\\"step\\\": $step}}\"\n  fi\n  sleep 0.1\ndone\n"
        ),
    );
    let values: Vec<String> = (0..16).map(|index| index.to_string()).collect();
    let spec = cluster.write_file(
        "sweep.yaml",
        &format!(
            "name: standby-sweep\ntrial:\n  command: [sh, {}, '{{i}}']\n  resources: {{cpu: 0.5}}\nsearch:\n  algorithm: grid\n  space: {{i: {{choice: [{}]}}}}\n",
            script.display(),
            values.join(", ")
        ),
    );
    let experiment = cluster
        .must_xp(&["submit", spec.to_str().expect("UTF-8")])
        .trim()
        .to_owned();
    wait_until("every trial reporting", Duration::from_secs(120), || {
        let status = cluster.status(&experiment);
        let trials = trials(&status);
        (trials.len() == 16
            && trials
                .iter()
                .all(|trial| trial["state"] == "running" && trial["last_step"].as_u64() >= Some(3)))
        .then_some(())
    });
    experiment
}

/// Every trial succeeded in one attempt, stored each step once, and its last
/// checkpoint (step [`STEPS`], taken after the fail-over) is recorded.
fn check_every_trial_ran_once(cluster: &TestCluster, experiment: &str) {
    let status = cluster.wait_finished(experiment, Duration::from_secs(180));
    let checkpoints: Vec<Value> = cluster
        .must_xp(&["checkpoints", experiment, "--json"])
        .lines()
        .map(|line| serde_json::from_str(line).expect("a JSON checkpoint"))
        .collect();
    assert_eq!(status["state"], "succeeded", "{status:#}");
    for trial in trials(&status) {
        let attempts = trial["attempts"].as_array().expect("attempts");
        assert_eq!(attempts.len(), 1, "{trial:#}");
        let id = trial["id"].as_str().expect("an id");
        let line = cluster.must_xp(&["metrics", id, "--name", "loss", "--json"]);
        let series: Value = serde_json::from_str(line.trim()).expect("metrics are JSON");
        let steps: Vec<u64> = series["steps"]
            .as_array()
            .expect("steps")
            .iter()
            .map(|step| step.as_u64().expect("a step"))
            .collect();
        assert_eq!(steps, (1..=STEPS).collect::<Vec<_>>(), "trial {id}");
        assert!(
            checkpoints
                .iter()
                .any(|checkpoint| checkpoint["trial"] == id && checkpoint["step"] == STEPS),
            "trial {id} has no checkpoint at step {STEPS}: {checkpoints:#?}"
        );
    }
}

/// How long from `since` until `check` holds, polling.
fn time_until(what: &str, since: Instant, check: impl FnMut() -> Option<()>) -> Duration {
    wait_until(what, Duration::from_secs(60), check);
    since.elapsed()
}

#[test]
#[expect(
    clippy::print_stderr,
    reason = "the fail-over's breakdown, for the measurement"
)]
fn a_standby_takes_over_from_a_killed_leader_and_every_trial_runs_once() {
    let Some((mut cluster, standby)) = two_heads() else {
        return;
    };
    let experiment = must_run_sweep(&cluster);
    assert!(
        standby.logged("standing by warm"),
        "the standby does not follow the store"
    );
    #[expect(clippy::disallowed_methods, reason = "the test measures a fail-over")]
    let killed = Instant::now();
    cluster.kill_head();
    let leads = time_until("the standby to lead", killed, || {
        standby.logged("this head leads the store").then_some(())
    });
    let serves = time_until("the standby to serve", killed, || {
        standby.logged("head started").then_some(())
    });
    let node_back = time_until("the node back", killed, || {
        let nodes = cluster.xp(&["nodes", "--json"]);
        String::from_utf8_lossy(&nodes.stdout)
            .contains("\"ready\"")
            .then_some(())
    });
    let one = cluster.write_file(
        "one.yaml",
        "name: after-fail-over\ntrial:\n  command: [sleep, '5']\n  resources: {cpu: 0.5}\n",
    );
    let after = cluster
        .must_xp(&["submit", one.to_str().expect("UTF-8")])
        .trim()
        .to_owned();
    let placing = time_until("new work running", killed, || {
        let status = cluster.status(&after);
        (trials(&status)[0]["state"] == "running").then_some(())
    });
    assert!(
        standby.logged("loaded from the followed copy"),
        "the new leader read the whole store again"
    );
    eprintln!(
        "fail-over after SIGKILL: leads {leads:?}, serves {serves:?}, node back {node_back:?}, new work running {placing:?}"
    );
    check_every_trial_ran_once(&cluster, &experiment);
}

fn signal(child_pid: u32, signal: nix::sys::signal::Signal) {
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(child_pid as i32), signal)
        .expect("signal the head");
}

fn log_of(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_default()
}

#[test]
fn a_leader_paused_past_its_lease_is_refused_and_steps_down() {
    let Some((mut cluster, standby)) = two_heads() else {
        return;
    };
    let experiment = must_run_sweep(&cluster);
    let leader = cluster.head_pid().expect("the leader runs");
    signal(leader, nix::sys::signal::Signal::SIGSTOP);
    wait_until("the standby to serve", Duration::from_secs(60), || {
        standby.logged("head started").then_some(())
    });
    signal(leader, nix::sys::signal::Signal::SIGCONT);
    let status = wait_until("the old leader to exit", Duration::from_secs(30), || {
        cluster.try_wait_head()
    });
    assert!(
        !status.success(),
        "a head that stepped down exits with an error"
    );
    let log = log_of(&cluster.head_log_path());
    assert!(
        log.contains("stepping down") && log.contains("refused"),
        "the old leader's log:\n{log}"
    );
    check_every_trial_ran_once(&cluster, &experiment);
}

/// Kills the leader, process `leader`, with SIGKILL and measures until
/// `standby` serves and places new work on the node that followed it.
fn fail_over(cluster: &TestCluster, leader: u32, standby: &Standby, round: usize) -> Duration {
    #[expect(clippy::disallowed_methods, reason = "the test measures a fail-over")]
    let killed = Instant::now();
    signal(leader, nix::sys::signal::Signal::SIGKILL);
    time_until("the standby to serve", killed, || {
        standby.logged("head started").then_some(())
    });
    let one = cluster.write_file(
        &format!("round-{round}.yaml"),
        &format!(
            "name: round-{round}\ntrial:\n  command: [sleep, '1']\n  resources: {{cpu: 0.5}}\n"
        ),
    );
    let submitted = cluster
        .must_xp(&["submit", one.to_str().expect("UTF-8")])
        .trim()
        .to_owned();
    time_until("new work running", killed, || {
        let status = cluster.status(&submitted);
        let state = trials(&status)[0]["state"]
            .as_str()
            .unwrap_or_default()
            .to_owned();
        ["placed", "starting", "running", "succeeded"]
            .contains(&state.as_str())
            .then_some(())
    })
}

/// Ten fail-overs in a row, the two heads taking turns, each killed one
/// started again as the standby; prints the times from the kill until new
/// work runs (`cargo build --bins && cargo test --test standby_heads -- --ignored
/// --nocapture`). Ignored in the suite for its minute and a half.
#[test]
#[ignore = "a measurement: ten fail-overs take about a minute and a half"]
#[expect(clippy::print_stderr, reason = "the measurement")]
fn ten_fail_overs() {
    let Some((mut cluster, first_standby)) = two_heads() else {
        return;
    };
    let first_port = cluster.port;
    let first = cluster.head_pid().expect("the first head runs");
    let mut times = vec![fail_over(&cluster, first, &first_standby, 0)];
    cluster.kill_head();
    let mut leader = first_standby;
    let mut standby = Standby::start_as(&cluster, "head", first_port, leader.port);
    for round in 1..10 {
        let peer = standby.port;
        let port = leader.port;
        times.push(fail_over(&cluster, leader.child.id(), &standby, round));
        drop(leader);
        let name = if port == first_port {
            "head"
        } else {
            "standby"
        };
        leader = standby;
        standby = Standby::start_as(&cluster, name, port, peer);
    }
    times.sort();
    eprintln!(
        "ten fail-overs, kill to new work placed: min {:?}, median {:?}, max {:?}; all {times:?}",
        times[0], times[5], times[9]
    );
}
