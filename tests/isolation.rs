//! Workers stay in their lane on a root node: two command trials running at the
//! same time on one node each run under a user id of their own (not root, not
//! each other's), and the second cannot read the first's environment
//! (`/proc/PID/environ`), its work directory, nor the node's data directory (its
//! join file, node id, logs, objects, the list of work directories); both still
//! succeed and report metrics, and `xp nodes --json` shows the node's isolation.
//! The ranks of one trial on one node share their id: they read each other's
//! private files (one rank's 0600 file in `/dev/shm` stays for the other after
//! the first ends, and goes when the last does), and their collective ring runs
//! over shared memory.
//!
//! Only root can switch users, so elsewhere the test says why and passes.

mod common;

use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::time::Duration;

use common::{TestCluster, trials};
use serde_json::Value;

/// The first trial: reports its id, leaves a secret in its work directory (and
/// has one in its environment), says where both are, and runs until the second
/// is done looking.
const KEEPER: &str = r#"set -e
echo "XP_METRIC {\"step\": 1, \"uid\": $(id -u), \"no_new_privs\": $(awk '/^NoNewPrivs:/ {print $2}' /proc/self/status)}"
echo "$ISOLATION_SECRET" > "$XP_WORK_DIR/secret"
echo "$$ $XP_WORK_DIR" > "$EXCHANGE/keeper.tmp"
mv "$EXCHANGE/keeper.tmp" "$EXCHANGE/keeper"
i=0
while [ ! -e "$EXCHANGE/done" ] && [ $i -lt 1200 ]; do sleep 0.1; i=$((i+1)); done
[ -e "$EXCHANGE/done" ]
"#;

/// The second trial: tries to read what is not its own while the first runs, and
/// reports each try as a metric: 1 refused with "Permission denied", 0 read, 2
/// failed otherwise.
const PROBER: &str = r#"i=0
while [ ! -e "$EXCHANGE/keeper" ] && [ $i -lt 1200 ]; do sleep 0.1; i=$((i+1)); done
read -r pid dir < "$EXCHANGE/keeper"
denied() {
  if out=$("$@" 2>&1 >/dev/null); then echo 0; else
    case "$out" in *"ermission denied"*) echo 1 ;; *) echo "probe $* failed: $out" >&2; echo 2 ;; esac
  fi
}
environ=$(denied cat "/proc/$pid/environ")
work_file=$(denied cat "$dir/secret")
work_dir=$(denied ls "$dir")
join_file=$(denied cat "$NODE_DIR/join")
node_id=$(denied cat "$NODE_DIR/node_id")
node_dir=$(denied ls "$NODE_DIR")
logs=$(denied ls "$NODE_DIR/logs")
objects=$(denied ls "$NODE_DIR/objects")
work=$(denied ls "$NODE_DIR/work")
echo "XP_METRIC {\"step\": 1, \"uid\": $(id -u), \"environ\": $environ, \"work_file\": $work_file, \"work_dir\": $work_dir, \"join_file\": $join_file, \"node_id\": $node_id, \"node_dir\": $node_dir, \"logs\": $logs, \"objects\": $objects, \"work\": $work}"
touch "$EXCHANGE/done"
"#;

/// Both ranks of one trial: each notes its user id; rank 0 leaves a private
/// (0600) file in `/dev/shm` and ends at once; rank 1 waits until rank 0 is gone
/// and its work directory taken back by the node, then reads that file.
const GANG: &str = r#"set -e
id -u > "$EXCHANGE/uid.$RANK.tmp"
mv "$EXCHANGE/uid.$RANK.tmp" "$EXCHANGE/uid.$RANK"
if [ "$RANK" = 0 ]; then
  file="/dev/shm/xp-isolation-$$"
  (umask 077; echo shared > "$file")
  echo "$$ $XP_WORK_DIR $file" > "$EXCHANGE/rank0.tmp"
  mv "$EXCHANGE/rank0.tmp" "$EXCHANGE/rank0"
  exit 0
fi
i=0
while [ ! -e "$EXCHANGE/rank0" ] && [ $i -lt 1200 ]; do sleep 0.1; i=$((i+1)); done
read -r pid dir file < "$EXCHANGE/rank0"
i=0
while { kill -0 "$pid" 2>/dev/null || [ "$(stat -c %u "$dir")" != 0 ]; } && [ $i -lt 1200 ]; do sleep 0.1; i=$((i+1)); done
cat "$file" > "$EXCHANGE/read"
"#;

/// Submits a trial running `script` (a file in `exchange`) with `env` set.
fn submit(cluster: &TestCluster, name: &str, script: &Path, env: &[(&str, &str)]) -> String {
    let mut command = vec!["env".to_owned()];
    command.extend(env.iter().map(|(key, value)| format!("{key}={value}")));
    command.extend(["sh".to_owned(), script.display().to_string()]);
    let yaml = format!(
        "name: {name}\ntrial:\n  command: {}\n",
        serde_json::to_string(&command).expect("JSON is YAML")
    );
    let path = cluster.write_file(&format!("{name}.yaml"), &yaml);
    cluster
        .must_xp(&["submit", path.to_str().expect("a UTF-8 path")])
        .trim()
        .to_owned()
}

#[test]
fn workers_of_different_trials_cannot_read_each_other_nor_the_node() {
    if common::skipped_without_root() {
        return;
    }
    let mut cluster = TestCluster::start("10s");
    let node_dir = must_start_node_with_a_join_file(&mut cluster);
    // Where the two trials meet: any user may write there.
    let exchange = cluster.dir.path().join("exchange");
    let secret = "a-secret-only-the-keeper-knows";
    let (keeper, prober) = must_submit_keeper_and_prober(&cluster, &exchange, &node_dir, secret);
    check_prober_was_refused_everything(&cluster, &keeper, &prober);
    // The keeper's directory went back to the node when the keeper ended, and
    // its file is still there, untouched by the prober.
    let keeper_dir = std::fs::read_to_string(exchange.join("keeper")).expect("keeper's note");
    let keeper_dir = Path::new(keeper_dir.split_whitespace().nth(1).expect("a directory"));
    let metadata = std::fs::metadata(keeper_dir).expect("work dir");
    assert_eq!(metadata.uid(), 0, "taken back from the worker's id");
    assert_eq!(metadata.permissions().mode() & 0o777, 0o700);
    assert_eq!(
        std::fs::read_to_string(keeper_dir.join("secret")).expect("secret"),
        format!("{secret}\n")
    );

    check_nodes_show_isolation(&cluster);
}

/// Starts node `a`, which reads its join string from a file in its own
/// (private) data directory; that directory.
fn must_start_node_with_a_join_file(cluster: &mut TestCluster) -> PathBuf {
    let node_dir = cluster.node_dir("a");
    // The node reads its join string from a file in its own data directory.
    std::fs::create_dir(&node_dir).expect("node dir");
    std::fs::set_permissions(&node_dir, std::fs::Permissions::from_mode(0o700)).expect("chmod");
    let join_file = node_dir.join("join");
    std::fs::write(&join_file, &cluster.node_join).expect("join file");
    std::fs::set_permissions(&join_file, std::fs::Permissions::from_mode(0o600)).expect("chmod");
    let join_arg = join_file.display().to_string();
    cluster.start_node_with("a", 0, 2, &["--join-file", &join_arg]);
    cluster.wait_for_nodes(1);
    node_dir
}

/// Writes the keeper's and the prober's scripts into the world-writable
/// `exchange` and submits both; their experiments.
fn must_submit_keeper_and_prober(
    cluster: &TestCluster,
    exchange: &Path,
    node_dir: &Path,
    secret: &str,
) -> (String, String) {
    std::fs::create_dir(exchange).expect("exchange");
    std::fs::set_permissions(exchange, std::fs::Permissions::from_mode(0o1777)).expect("chmod");
    let keeper_script = exchange.join("keeper.sh");
    let prober_script = exchange.join("prober.sh");
    for (path, text) in [(&keeper_script, KEEPER), (&prober_script, PROBER)] {
        std::fs::write(path, text).expect("script");
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o644)).expect("chmod");
    }
    let exchange_env = exchange.display().to_string();
    let node_env = node_dir.display().to_string();
    let keeper = submit(
        cluster,
        "keeper",
        &keeper_script,
        &[("EXCHANGE", &exchange_env), ("ISOLATION_SECRET", secret)],
    );
    let prober = submit(
        cluster,
        "prober",
        &prober_script,
        &[("EXCHANGE", &exchange_env), ("NODE_DIR", &node_env)],
    );
    (keeper, prober)
}

/// Both trials succeeded under ids of their own (not root, no new
/// privileges), and every read the prober tried was refused.
fn check_prober_was_refused_everything(cluster: &TestCluster, keeper: &str, prober: &str) {
    let keeper_status = cluster.wait_finished(keeper, Duration::from_secs(180));
    let prober_status = cluster.wait_finished(prober, Duration::from_secs(180));
    let keeper_trial = &trials(&keeper_status)[0];
    let prober_trial = &trials(&prober_status)[0];
    assert_eq!(keeper_trial["state"], "succeeded", "{keeper_status:#}");
    assert_eq!(prober_trial["state"], "succeeded", "{prober_status:#}");
    let (keeper_uid, prober_uid) = (
        common::metric(keeper_trial, "uid"),
        common::metric(prober_trial, "uid"),
    );
    assert_ne!(keeper_uid, 0.0, "the keeper does not run as root");
    assert_ne!(prober_uid, 0.0, "the prober does not run as root");
    assert_ne!(keeper_uid, prober_uid, "each worker has an id of its own");
    // Nothing it runs regains privileges through a setuid binary.
    assert_eq!(common::metric(keeper_trial, "no_new_privs"), 1.0);
    for probe in [
        "environ",
        "work_file",
        "work_dir",
        "join_file",
        "node_id",
        "node_dir",
        "logs",
        "objects",
        "work",
    ] {
        assert_eq!(
            common::metric(prober_trial, probe),
            1.0,
            "reading {probe} is refused with permission denied (1; 0: it was read, 2: another error, in the prober's log): {prober_status:#}"
        );
    }
}

/// `xp nodes` shows the node runs workers under ids of their own, and its
/// isolation and limits.
fn check_nodes_show_isolation(cluster: &TestCluster) {
    let nodes = cluster.must_xp(&["nodes", "--json"]);
    let node: Value = serde_json::from_str(nodes.lines().next().expect("a node")).expect("JSON");
    assert_eq!(node["worker_uids"], true, "{node:#}");
    let isolation = node["isolation"].as_str().expect("isolation");
    assert!(isolation.starts_with("uid"), "{node:#}");
    assert_eq!(
        isolation.strip_prefix("uid+").unwrap_or("none"),
        node["limits"].as_str().expect("limits"),
        "{node:#}"
    );
    let table = cluster.must_xp(&["nodes"]);
    assert!(
        table.contains("ISOLATION") && table.contains(isolation),
        "{table}"
    );
}

#[test]
fn ranks_of_one_trial_share_their_id_and_a_shared_memory_ring() {
    if common::skipped_without_root() {
        return;
    }
    let mut cluster = TestCluster::start("10s");
    cluster.start_node("a", 0, 2);
    cluster.wait_for_nodes(1);
    let exchange = cluster.dir.path().join("exchange");
    std::fs::create_dir(&exchange).expect("exchange");
    std::fs::set_permissions(&exchange, std::fs::Permissions::from_mode(0o1777)).expect("chmod");
    let script = exchange.join("gang.sh");
    std::fs::write(&script, GANG).expect("script");
    std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o644)).expect("chmod");
    let yaml = format!(
        "name: gang\ntrial:\n  command: {}\n  workers: 2\n  resources: {{cpu: 1}}\n",
        serde_json::to_string(&[
            "env",
            &format!("EXCHANGE={}", exchange.display()),
            "sh",
            &script.display().to_string(),
        ])
        .expect("JSON is YAML")
    );
    let spec = cluster.write_file("gang.yaml", &yaml);
    let experiment = cluster
        .must_xp(&["submit", spec.to_str().expect("a UTF-8 path")])
        .trim()
        .to_owned();
    let status = cluster.wait_finished(&experiment, Duration::from_secs(180));
    let trial = &trials(&status)[0];
    assert_eq!(trial["state"], "succeeded", "{status:#}");
    let read = |name: &str| {
        std::fs::read_to_string(exchange.join(name))
            .unwrap_or_else(|error| panic!("{name}: {error}"))
    };
    let (uid0, uid1) = (read("uid.0"), read("uid.1"));
    assert_ne!(uid0.trim(), "0", "the ranks do not run as root");
    assert_eq!(uid0, uid1, "both ranks of the trial run as one id");
    assert_eq!(
        read("read"),
        "shared\n",
        "rank 1 read rank 0's private file after rank 0 ended"
    );
    let rank0 = read("rank0");
    let file = Path::new(rank0.split_whitespace().nth(2).expect("a file"));
    // The node scrubs a returned id in the background, soon after the end.
    common::wait_until(
        &format!("{} to go with the trial's last rank", file.display()),
        Duration::from_secs(30),
        || (!file.exists()).then_some(()),
    );

    // A Rust gang on the same node: its ring runs over shared memory both ways.
    let experiment = cluster.run_driver(
        "examples/trainables",
        &["submit", "--entry", "allreduce_check", "--workers", "2"],
    );
    let status = cluster.wait_finished(&experiment, Duration::from_secs(180));
    let trial = &trials(&status)[0];
    assert_eq!(trial["state"], "succeeded", "{status:#}");
    assert_eq!(common::metric(trial, "sum"), 3.0, "{status:#}");
    assert_ne!(common::metric(trial, "uid"), 0.0, "{status:#}");
    assert_eq!(
        common::metric(trial, "shm_links"),
        2.0,
        "both links of the ring over shared memory: {status:#}"
    );
}
