//! The node's tenant boundary on a root node, tried as a hostile member's trial
//! would (issue 26), through the documented channel: the SDK's `put` and
//! `get` on the node's local object channel (`examples/tenant_probe.rs`).
//!
//! - `a_trial_gets_back_nothing_but_its_own_files`: the checkpoint directory
//!   swapped for a link to `/` (then `etc/shadow`, the node's
//!   `/proc/self/environ`, another trial's file through it), a link to `/etc`
//!   in the work directory, a link to the node's `/proc/PID/environ`, a hard
//!   link to another user's file, a FIFO, another user's 0600 file moved in,
//!   another trial's path named directly and a `..` climb: each refused with a
//!   message naming its rule, and nothing but the trial's own file comes back.
//!
//! Only root can switch users, so elsewhere each test says why and passes.

mod common;

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use common::{TestCluster, binary, trials};

/// User ids outside the workers' default range, as other users of the machine.
const STRANGER: u32 = 1_899_000_700;
const ANOTHER_STRANGER: u32 = 1_899_000_701;

/// A directory any user may write in (sticky, like `/tmp`), in the cluster's.
fn must_make_exchange(cluster: &TestCluster) -> PathBuf {
    let exchange = cluster.dir.path().join("exchange");
    std::fs::create_dir(&exchange).expect("exchange");
    std::fs::set_permissions(&exchange, std::fs::Permissions::from_mode(0o1777)).expect("chmod");
    exchange
}

/// Writes `text` to `path` as `uid`'s file with `mode`.
fn must_plant(path: &Path, text: &str, uid: u32, mode: u32) {
    std::fs::write(path, text).expect("plant");
    std::os::unix::fs::chown(path, Some(uid), Some(uid)).expect("chown");
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).expect("chmod");
}

/// The file probes of `tenant_probe files`, with the metric each must report.
const FILE_PROBES: [&str; 10] = [
    "checkpoint_link_shadow",
    "checkpoint_link_environ",
    "checkpoint_link_other_trial",
    "work_link",
    "node_environ_link",
    "hard_link",
    "fifo",
    "foreign_moved_in",
    "other_trial_path",
    "dot_dot",
];

/// Keeps a secret in its work directory, says where, and waits for `done`.
const KEEPER: &str = r#"echo "another team's secret" > "$XP_WORK_DIR/secret"
echo "$XP_WORK_DIR/secret" > "$EXCHANGE/other.tmp"
mv "$EXCHANGE/other.tmp" "$EXCHANGE/other"
i=0
while [ ! -e "$EXCHANGE/done" ] && [ $i -lt 1200 ]; do sleep 0.1; i=$((i+1)); done
"#;

#[test]
fn a_trial_gets_back_nothing_but_its_own_files() {
    if common::skipped_without_root() {
        return;
    }
    let mut cluster = TestCluster::start("10s");
    cluster.start_node("a", 0, 4);
    cluster.wait_for_nodes(1);
    let exchange = must_make_exchange(&cluster);
    // Another user's private file in a directory anyone may write (and so
    // move files out of), and another user's file anyone may write.
    let open = exchange.join("open");
    std::fs::create_dir(&open).expect("open");
    std::fs::set_permissions(&open, std::fs::Permissions::from_mode(0o777)).expect("chmod");
    must_plant(
        &open.join("foreign"),
        "another user's secret",
        STRANGER,
        0o600,
    );
    must_plant(
        &exchange.join("shared"),
        "another user's shared file",
        ANOTHER_STRANGER,
        0o666,
    );
    let keeper_script = cluster.write_file("keeper.sh", KEEPER);
    std::fs::set_permissions(&keeper_script, std::fs::Permissions::from_mode(0o644))
        .expect("chmod");
    let exchange_env = format!("EXCHANGE={}", exchange.display());
    let keeper = common::submit_command(
        &cluster,
        "keeper",
        "others",
        "",
        &[
            "env",
            &exchange_env,
            "sh",
            keeper_script.to_str().expect("UTF-8"),
        ],
    );
    let probe = binary("examples/tenant_probe");
    let prober = common::submit_command(
        &cluster,
        "prober",
        "tests",
        "",
        &[
            "env",
            &exchange_env,
            probe.to_str().expect("UTF-8"),
            "files",
        ],
    );
    let status = cluster.wait_finished(&prober, Duration::from_secs(180));
    std::fs::write(exchange.join("done"), b"").expect("done");
    cluster.wait_finished(&keeper, Duration::from_secs(180));
    let trial = &trials(&status)[0];
    assert_eq!(trial["state"], "succeeded", "{status:#}");
    let log = cluster.must_xp(&["logs", &format!("{prober}-t0")]);
    show(&log, "probe ");
    for probe in FILE_PROBES {
        assert_eq!(
            common::metric(trial, probe),
            1.0,
            "{probe}: 1 refused naming a rule, 2 refused otherwise, 0 leaked: {log}"
        );
    }
    assert_eq!(common::metric(trial, "own_roundtrip"), 1.0, "{log}");
}

/// Writes the lines of `log` that start with `prefix` to stderr (shown with
/// `--nocapture`: the probes' findings, for the record).
#[expect(clippy::print_stderr, reason = "the probes' findings, for the record")]
fn show(log: &str, prefix: &str) {
    for line in log.lines().filter(|line| line.starts_with(prefix)) {
        eprintln!("{line}");
    }
}
