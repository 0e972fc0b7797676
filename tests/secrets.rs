//! The cluster secret stays secret: no process started for a cluster carries the
//! token in its command line (where `ps` shows it to every local user), no log
//! line holds it (not even after a peer sends a second hello), the head's and the
//! node's data directories are private to their user, `xp-node join` refuses
//! a join string given as an argument, and the head prints the node credential
//! at its first start only.

mod common;

use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use common::{TestCluster, binary};
use xp_runtime::frame;
use xp_runtime::join::JoinString;
use xp_runtime::protocol::{Hello, Message, PeerRole};

fn mode_of(path: &Path) -> u32 {
    std::fs::metadata(path)
        .unwrap_or_else(|error| panic!("{}: {error}", path.display()))
        .permissions()
        .mode()
        & 0o777
}

/// The ids of this test's descendants, from the parent ids in `/proc/PID/stat`.
fn descendants() -> Vec<u32> {
    let mut parents = Vec::new();
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|name| name.parse::<u32>().ok())
        else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(entry.path().join("stat")) else {
            continue;
        };
        // The command name may hold spaces and parentheses: fields follow the last ')'.
        let Some(rest) = stat.rsplit_once(')').map(|(_, rest)| rest) else {
            continue;
        };
        if let Some(ppid) = rest
            .split_whitespace()
            .nth(1)
            .and_then(|ppid| ppid.parse::<u32>().ok())
        {
            parents.push((pid, ppid));
        }
    }
    let mut found = vec![std::process::id()];
    let mut idx = 0;
    while idx < found.len() {
        let parent = found[idx];
        found.extend(
            parents
                .iter()
                .filter(|(_, ppid)| *ppid == parent)
                .map(|(pid, _)| *pid),
        );
        idx += 1;
    }
    found.remove(0);
    found
}

/// Sends a second hello, holding the token, on a fresh stream of an
/// authenticated connection: the head refuses it, and must not log it.
fn send_a_second_hello(join: &JoinString) {
    let runtime = tokio::runtime::Runtime::new().unwrap();
    runtime.block_on(async {
        let (connection, _send, _recv) =
            xp_runtime::transport::connect(join, PeerRole::Client, "secrets-test")
                .await
                .unwrap();
        let (mut send, mut recv) = connection.connection.open_bi().await.unwrap();
        let hello = Message::Hello(Hello {
            token: join.token.clone(),
            role: PeerRole::Client,
            agent: "secrets-test".to_owned(),
        });
        send.write_all(&frame::encode(&hello).unwrap())
            .await
            .unwrap();
        let _ = send.finish();
        let answer = tokio::time::timeout(Duration::from_secs(10), frame::read_message(&mut recv))
            .await
            .unwrap()
            .unwrap()
            .unwrap();
        assert!(matches!(answer, Message::Error(_)), "{answer:?}");
        connection.close().await;
    });
}

fn check_no_log_holds(dir: &Path, token: &str) {
    let mut logs = 0;
    for entry in std::fs::read_dir(dir).unwrap().flatten() {
        if entry
            .path()
            .extension()
            .is_some_and(|extension| extension == "log")
        {
            logs += 1;
            let text = std::fs::read_to_string(entry.path()).unwrap();
            for line in text.lines() {
                assert!(
                    !line.contains(token),
                    "{} logs the token: {line}",
                    entry.path().display()
                );
            }
        }
    }
    assert!(
        logs >= 2,
        "the head's and the node's logs are in {}",
        dir.display()
    );
}

/// The head logged the second hello (so the check above saw it), redacted.
fn check_the_head_logged_the_hello(dir: &Path) {
    let head_log = std::fs::read_to_string(dir.join("head-0.log")).unwrap();
    assert!(
        head_log
            .lines()
            .any(|line| line.contains("Hello") && line.contains("<redacted>")),
        "{head_log}"
    );
}

/// A node's data directory is its user's alone (0700), or, on a root node whose
/// workers run under ids of their own, passable (0711) with only the work
/// directories, cached binaries and socket directory passable too (0711) and
/// everything else in it private (no permission for group or others).
fn check_node_dir_private(dir: &Path) {
    let mode = mode_of(dir);
    if mode == 0o700 {
        return;
    }
    assert_eq!(mode, 0o711, "{}", dir.display());
    assert!(
        nix::unistd::geteuid().is_root(),
        "only a root node lets workers through"
    );
    for entry in std::fs::read_dir(dir).unwrap().flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        let mode = entry.metadata().unwrap().permissions().mode() & 0o777;
        if xp_node::PASSABLE_DIRS.contains(&name.as_str()) {
            assert_eq!(mode, 0o711, "{name}");
        } else {
            assert_eq!(mode & 0o077, 0, "{name} is private: {mode:o}");
        }
    }
}

#[test]
fn the_token_is_in_no_command_line_nor_log_and_data_dirs_are_private() {
    let mut cluster = TestCluster::start("10s");
    cluster.start_node("a", 0, 2);
    cluster.wait_for_nodes(1);
    let join: JoinString = cluster.join.parse().unwrap();
    let node_join: JoinString = cluster.node_join.parse().unwrap();
    // The admin's secret and the node credential's.
    let tokens = [join.token.clone(), node_join.token.clone()];

    let children = descendants();
    assert!(
        children.len() >= 2,
        "the head and the node run: {children:?}"
    );
    for pid in children {
        // A process that already exited has no command line left to leak.
        let Ok(cmdline) = std::fs::read(format!("/proc/{pid}/cmdline")) else {
            continue;
        };
        let cmdline = String::from_utf8_lossy(&cmdline).replace('\0', " ");
        for token in &tokens {
            assert!(
                !cmdline.contains(token),
                "process {pid} shows a secret: {cmdline}"
            );
        }
    }

    send_a_second_hello(&join);
    // The head logs the refusal before it answers; the node logs as it runs.
    for token in &tokens {
        check_no_log_holds(cluster.dir.path(), token);
    }
    check_the_head_logged_the_hello(cluster.dir.path());

    let head_dir = cluster.head_dir();
    assert_eq!(mode_of(&head_dir), 0o700);
    assert_eq!(mode_of(&head_dir.join("tls")), 0o700);
    for name in xp_runtime::tls::ClusterIdentity::FILES {
        assert_eq!(
            mode_of(&head_dir.join("tls").join(name)),
            0o600,
            "tls/{name}"
        );
    }
    assert_eq!(mode_of(&head_dir.join("head.redb")), 0o600);
    assert_eq!(mode_of(&head_dir.join("node.join")), 0o600);
    assert_eq!(mode_of(&head_dir.join("admin.sock")) & 0o777, 0o600);
    assert_eq!(mode_of(&head_dir.join("blobs")), 0o700);
    check_node_dir_private(&cluster.node_dir("a"));
}

#[test]
fn xp_node_takes_the_join_string_from_a_private_file_only() {
    let cluster = TestCluster::start("10s");
    let refused = Command::new(binary("xp-node"))
        .args(["join", &cluster.join, "--data-dir"])
        .arg(cluster.dir.path().join("node-refused"))
        .env_remove("XP_JOIN")
        .output()
        .unwrap();
    assert!(!refused.status.success());
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert!(
        stderr.contains("refusing a join string given as an argument"),
        "{stderr}"
    );
    assert!(
        stderr.contains("--join-file") && stderr.contains("XP_JOIN"),
        "{stderr}"
    );

    let join_file = cluster.write_file("join", &format!("{}\n", cluster.node_join));
    std::fs::set_permissions(&join_file, std::fs::Permissions::from_mode(0o644)).unwrap();
    let too_open = Command::new(binary("xp-node"))
        .arg("join")
        .arg("--join-file")
        .arg(&join_file)
        .arg("--data-dir")
        .arg(cluster.dir.path().join("node-open"))
        .env_remove("XP_JOIN")
        .output()
        .unwrap();
    assert!(!too_open.status.success());
    let stderr = String::from_utf8_lossy(&too_open.stderr);
    assert!(stderr.contains("chmod 600"), "{stderr}");

    std::fs::set_permissions(&join_file, std::fs::Permissions::from_mode(0o600)).unwrap();
    let log = std::fs::File::create(cluster.dir.path().join("node-file.log")).unwrap();
    let node = Command::new(binary("xp-node"))
        .arg("join")
        .arg("--join-file")
        .arg(&join_file)
        .arg("--data-dir")
        .arg(cluster.dir.path().join("node-file"))
        .args(["--gpus", "0", "--cpus", "1"])
        .env_remove("XP_JOIN")
        .stdout(Stdio::null())
        .stderr(log)
        .spawn()
        .unwrap();
    let _node = KillOnDrop(node);
    cluster.wait_for_nodes(1);

    // `xp` takes a user's credential from a file the same way; `--cluster`
    // still works, with a warning.
    let join_file = cluster.write_file("credential", &format!("{}\n", cluster.join));
    std::fs::set_permissions(&join_file, std::fs::Permissions::from_mode(0o600)).unwrap();
    // Commands that talk to a cluster and those that may also read a kept
    // data directory take it alike.
    for command in ["nodes", "status"] {
        let from_file = Command::new(env!("CARGO_BIN_EXE_xp"))
            .arg(command)
            .arg("--cluster-file")
            .arg(&join_file)
            .env_remove("XP_CLUSTER")
            .output()
            .unwrap();
        assert!(
            from_file.status.success(),
            "xp {command}: {}",
            String::from_utf8_lossy(&from_file.stderr)
        );
    }
    let from_argument = Command::new(env!("CARGO_BIN_EXE_xp"))
        .args(["nodes", "--cluster", &cluster.join])
        .env_remove("XP_CLUSTER")
        .output()
        .unwrap();
    assert!(from_argument.status.success());
    let stderr = String::from_utf8_lossy(&from_argument.stderr);
    assert_eq!(stderr.matches("`ps`").count(), 1, "{stderr}");
}

/// Starts `xp-head` on `data_dir` and returns it with what it printed, up to
/// its `node:` or `head:` line.
fn start_head_printing(data_dir: &Path) -> (KillOnDrop, Vec<String>) {
    use std::io::BufRead;
    let mut head = Command::new(binary("xp-head"))
        .args(["start", "--listen", "127.0.0.1:0", "--data-dir"])
        .arg(data_dir)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let stdout = std::io::BufReader::new(head.stdout.take().unwrap());
    let mut printed = Vec::new();
    for line in stdout.lines() {
        let line = line.unwrap();
        let last = line.starts_with("node: ") || line.starts_with("head: ");
        printed.push(line);
        if last {
            break;
        }
    }
    (KillOnDrop(head), printed)
}

/// `xp-head node-credential --data-dir DIR`'s output.
fn node_credential(data_dir: &Path) -> std::process::Output {
    Command::new(binary("xp-head"))
        .args(["node-credential", "--data-dir"])
        .arg(data_dir)
        .output()
        .unwrap()
}

#[test]
fn the_node_credential_is_printed_at_the_first_start_only() {
    let dir = tempfile::tempdir().unwrap();
    let data_dir = dir.path().join("head");
    let missing = node_credential(&data_dir);
    assert!(!missing.status.success());
    let stderr = String::from_utf8_lossy(&missing.stderr);
    assert!(stderr.contains("start the head once"), "{stderr}");

    let (first, printed) = start_head_printing(&data_dir);
    drop(first);
    let node_line = printed
        .iter()
        .find_map(|line| line.strip_prefix("node: "))
        .unwrap_or_else(|| panic!("the first start prints the node credential: {printed:?}"));
    let node_join: JoinString = node_line.parse().unwrap();

    // A later start prints its address and where the credential is, no secret.
    let (again, printed) = start_head_printing(&data_dir);
    let head_line = printed.last().unwrap();
    assert!(head_line.starts_with("head: 127.0.0.1:"), "{printed:?}");
    assert!(head_line.contains("xp-head node-credential"), "{printed:?}");
    assert!(
        printed.iter().all(|line| !line.contains(&node_join.token)),
        "a restart printed the node credential: {printed:?}"
    );
    // On the head machine it is shown again, with the address of this start.
    let shown = node_credential(&data_dir);
    assert!(shown.status.success(), "{shown:?}");
    let shown: JoinString = String::from_utf8(shown.stdout)
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    assert_eq!(shown.token, node_join.token);
    let address = head_line["head: ".len()..]
        .split_whitespace()
        .next()
        .unwrap();
    let port = address.rsplit(':').next().unwrap();
    assert_eq!(shown.port.to_string(), port, "{head_line}");
    drop(again);
}

/// A process killed and reaped when the test ends, passed or failed.
struct KillOnDrop(std::process::Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}
