//! What one tenant could leave for or take from another through the machine
//! a root node shares between them (issue 26), tried with real processes:
//!
//! - `what_a_trial_leaves_is_gone_before_another_team_runs`: a 0600 file in a
//!   nested directory of a shared temporary directory and a SysV
//!   shared-memory segment, a node restart, and a trial of another team that
//!   finds neither (and runs under another user id).
//!
//! - `a_squatter_cannot_take_a_rendezvous_port`: a co-tenant binds what it can
//!   of 29500-29999 while a two-rank command trial still meets on its
//!   `MASTER_PORT` (`examples/tenant_probe.rs`).
//! - `the_running_node_holds_no_secret_in_environ_or_cmdline`: a node given
//!   its join string in `XP_JOIN` (and a user's `XP_CLUSTER`) keeps neither in
//!   `/proc/PID/environ` nor in `cmdline`.
//!
//! Only root can switch users, so elsewhere each test says why and passes.

mod common;

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use common::{TestCluster, binary, trials};
use serde_json::Value;

/// The first trial: leaves a private file in a nested directory of a shared
/// temporary directory and a private SysV shared-memory segment, and reports
/// its user id and the segment's id.
const LEAVER: &str = r#"set -e
(umask 077; mkdir -p "$SHARED/nested"; echo "the leaver's secret" > "$SHARED/nested/secret")
shmid=$(ipcmk -M 4096 -p 0600 | awk '{print $NF}')
echo "XP_METRIC {\"step\": 1, \"uid\": $(id -u), \"shmid\": $shmid}"
"#;

/// The second trial, of another team: reports its user id and whether it
/// finds the file and the segment `SHMID`.
const FINDER: &str = r#"file=0; shm=0
if cat "$SHARED/nested/secret" >/dev/null 2>&1; then file=1; fi
if awk -v id="$SHMID" '$2 == id' /proc/sysvipc/shm | grep -q .; then shm=1; fi
echo "XP_METRIC {\"step\": 1, \"uid\": $(id -u), \"file_found\": $file, \"shm_found\": $shm}"
"#;

/// Removes what the leaver left, should the node not have.
struct Leftovers {
    shared: PathBuf,
    shmid: Option<u32>,
}

impl Drop for Leftovers {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.shared);
        if let Some(id) = self.shmid {
            let _ = std::process::Command::new("ipcrm")
                .args(["-m", &id.to_string()])
                .stderr(std::process::Stdio::null())
                .status();
        }
    }
}

#[test]
fn what_a_trial_leaves_is_gone_before_another_team_runs() {
    if common::skipped_without_root() {
        return;
    }
    let mut cluster = TestCluster::start("10s");
    cluster.start_node("a", 0, 2);
    cluster.wait_for_nodes(1);
    // A shared temporary directory anyone may write in, as many programs make.
    let shared = Path::new("/tmp").join(format!("xp-tenant-shared-{}", std::process::id()));
    std::fs::create_dir(&shared).expect("shared");
    std::fs::set_permissions(&shared, std::fs::Permissions::from_mode(0o777)).expect("chmod");
    let mut leftovers = Leftovers {
        shared: shared.clone(),
        shmid: None,
    };
    let shared_env = format!("SHARED={}", shared.display());
    let leaver = run_script(&cluster, "leaver", "tests", LEAVER, &[&shared_env]);
    let leaver = &trials(&leaver)[0];
    assert_eq!(leaver["state"], "succeeded", "{leaver:#}");
    leftovers.shmid = Some(common::metric(leaver, "shmid") as u32);
    show_metrics("leaver", leaver, &["uid", "shmid"]);
    // The node restarts.
    cluster.terminate_node("a");
    cluster.start_node("a", 0, 2);
    cluster.wait_for_nodes(1);
    let shmid_env = format!("SHMID={}", common::metric(leaver, "shmid"));
    let finder = run_script(
        &cluster,
        "finder",
        "others",
        FINDER,
        &[&shared_env, &shmid_env],
    );
    let trial = &trials(&finder)[0];
    assert_eq!(trial["state"], "succeeded", "{finder:#}");
    show_metrics("finder", trial, &["uid", "file_found", "shm_found"]);
    assert_ne!(
        common::metric(trial, "uid"),
        common::metric(leaver, "uid"),
        "the restarted node hands out another user id"
    );
    assert_eq!(
        common::metric(trial, "file_found"),
        0.0,
        "the nested file is gone"
    );
    assert_eq!(
        common::metric(trial, "shm_found"),
        0.0,
        "the segment is gone"
    );
    assert!(
        !shared.join("nested").exists(),
        "the leaver's directory went with its user id"
    );
}

/// Runs `script` as a command trial of `team` with `env` set, to its end; its
/// status.
fn run_script(cluster: &TestCluster, name: &str, team: &str, script: &str, env: &[&str]) -> Value {
    let path = cluster.write_file(&format!("{name}.sh"), script);
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).expect("chmod");
    let mut command = vec!["env"];
    command.extend(env);
    command.extend(["sh", path.to_str().expect("UTF-8")]);
    let experiment = common::submit_command(cluster, name, team, "", &command);
    cluster.wait_finished(&experiment, Duration::from_secs(120))
}

/// Writes `names` of `trial`'s metrics to stderr (for the record).
#[expect(clippy::print_stderr, reason = "the probes' findings, for the record")]
fn show_metrics(what: &str, trial: &Value, names: &[&str]) {
    let shown: Vec<String> = names
        .iter()
        .map(|name| format!("{name}={}", trial["metrics"][name]))
        .collect();
    eprintln!("{what}: {}", shown.join(" "));
}

/// Kills a process when dropped.
struct Killed(std::process::Child);

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[test]
fn the_running_node_holds_no_secret_in_environ_or_cmdline() {
    let cluster = TestCluster::start("10s");
    // As `sbatch` would start it: the node credential in XP_JOIN, and the
    // user's own credential in XP_CLUSTER.
    let node_dir = cluster.node_dir("a");
    let log = std::fs::File::create(cluster.node_log_path("a")).expect("log");
    let node = std::process::Command::new(binary("xp-node"))
        .args(["join", "--data-dir"])
        .arg(&node_dir)
        .args(["--gpus", "0", "--cpus", "1", "--label", "name=a"])
        .env("XP_JOIN", &cluster.node_join)
        .env("XP_CLUSTER", &cluster.join)
        .env("XP_LOG", "info")
        .stdout(std::process::Stdio::null())
        .stderr(log)
        .spawn()
        .expect("xp-node starts");
    let node = Killed(node);
    cluster.wait_for_nodes(1);
    let secrets: Vec<xp_runtime::join::JoinString> = [&cluster.node_join, &cluster.join]
        .iter()
        .map(|join| join.parse().expect("a join string"))
        .collect();
    for file in ["environ", "cmdline"] {
        let path = format!("/proc/{}/{file}", node.0.id());
        let bytes = std::fs::read(&path).expect("readable by the node's user");
        let text = String::from_utf8_lossy(&bytes);
        let holds = |secret: &str| text.contains(secret);
        show_record(&format!(
            "{file}: XP_JOIN {} XP_CLUSTER {} node token {} user token {}",
            holds("XP_JOIN="),
            holds("XP_CLUSTER="),
            holds(&secrets[0].token),
            holds(&secrets[1].token),
        ));
        for secret in &secrets {
            assert!(!holds(&secret.token), "{path} holds a token");
        }
        assert!(!holds("XP_JOIN=") && !holds("XP_CLUSTER="), "{path}");
    }
}

#[expect(clippy::print_stderr, reason = "the probes' findings, for the record")]
fn show_record(line: &str) {
    eprintln!("{line}");
}

/// A directory any user may write in (sticky, like `/tmp`), in the cluster's.
fn must_make_exchange(cluster: &TestCluster) -> PathBuf {
    let exchange = cluster.dir.path().join("exchange");
    std::fs::create_dir(&exchange).expect("exchange");
    std::fs::set_permissions(&exchange, std::fs::Permissions::from_mode(0o1777)).expect("chmod");
    exchange
}

#[test]
fn a_squatter_cannot_take_a_rendezvous_port() {
    if common::skipped_without_root() {
        return;
    }
    let mut cluster = TestCluster::start("10s");
    cluster.start_node("a", 0, 4);
    cluster.wait_for_nodes(1);
    let exchange = must_make_exchange(&cluster);
    let exchange_env = format!("EXCHANGE={}", exchange.display());
    let probe = binary("examples/tenant_probe");
    let probe = probe.to_str().expect("UTF-8");
    let squatter = common::submit_command(
        &cluster,
        "squatter",
        "others",
        "",
        &["env", &exchange_env, probe, "squat", "29500", "29999"],
    );
    common::wait_until("the squatter to bind", Duration::from_secs(60), || {
        exchange.join("squatting").exists().then_some(())
    });
    let gang = common::submit_command(
        &cluster,
        "gang",
        "tests",
        "  workers: 2\n  max_retries: 0\n",
        &[probe, "rendezvous"],
    );
    let status = cluster.wait_finished(&gang, Duration::from_secs(120));
    std::fs::write(exchange.join("done"), b"").expect("done");
    let squatted = cluster.wait_finished(&squatter, Duration::from_secs(120));
    show_metrics("squatter", &trials(&squatted)[0], &["squatted"]);
    let trial = &trials(&status)[0];
    show_metrics("gang", trial, &["rendezvous", "port"]);
    // Once seen failing with every port squatted: what the node said of its
    // isolation and its hold on the range says why.
    let node_log = std::fs::read_to_string(cluster.node_log_path("a")).unwrap_or_default();
    let isolation: Vec<&str> = node_log
        .lines()
        .filter(|line| line.contains("rendezvous ports") || line.contains("user id"))
        .collect();
    assert_eq!(
        trial["state"], "succeeded",
        "{status:#}\nthe node on its isolation: {isolation:#?}"
    );
    assert_eq!(common::metric(trial, "rendezvous"), 1.0, "{status:#}");
}
