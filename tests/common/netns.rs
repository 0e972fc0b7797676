//! Separate hosts on one machine, for end-to-end tests across the network: the
//! head and each node run in a network namespace of their own, with their own
//! address on a bridge (10.77.0.0/24; the head is 10.77.0.1), their own host name
//! (a UTS namespace) and their own `/etc/hosts` (a mount namespace) in which that
//! name resolves to 127.0.1.1, as on Debian.
//!
//! A [`NetnsCluster`] kills every process it started and deletes its namespaces
//! (and with them the bridge and the veth pairs) when dropped. Making namespaces
//! needs root (CI runs as root): [`NetnsCluster::start`] prints why and returns
//! `None` where they cannot be made, and the test returns. No traffic leaves the
//! namespaces: every address used is on their bridge or their loopback.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use anyhow::Context;
use serde_json::Value;

use super::{
    binary, dump_logs_in, must_succeed, wait_for_ready_nodes, wait_not_running, wait_until,
    write_file_in,
};

/// The head's address on the bridge.
pub(crate) const HEAD_IP: &str = "10.77.0.1";

/// Numbers the clusters of one test process, so their namespaces' names differ.
static CLUSTERS: AtomicU32 = AtomicU32::new(0);

/// Runs `ip` with `args`; the error says what failed.
fn ip(args: &[&str]) -> anyhow::Result<()> {
    let output = Command::new("ip")
        .args(args)
        .output()
        .context("cannot run ip")?;
    anyhow::ensure!(
        output.status.success(),
        "ip {}: {}",
        args.join(" "),
        String::from_utf8_lossy(&output.stderr).trim()
    );
    Ok(())
}

/// One simulated machine.
#[derive(Debug, Clone)]
struct Host {
    /// Its network namespace.
    namespace: String,
    /// Its address on the bridge.
    ip: String,
    /// Its host name, which resolves to 127.0.1.1 on it.
    hostname: String,
    /// Its `/etc/hosts`.
    hosts_file: PathBuf,
}

/// A head and nodes on separate simulated machines.
pub(crate) struct NetnsCluster {
    pub(crate) dir: tempfile::TempDir,
    /// The first admin's credential, for `xp`.
    pub(crate) join: String,
    /// The node credential, for nodes.
    pub(crate) node_join: String,
    /// Namespaces created, deleted on drop.
    namespaces: Vec<String>,
    hosts: BTreeMap<String, Host>,
    head: Option<Child>,
    nodes: BTreeMap<String, Child>,
}

impl NetnsCluster {
    /// Makes a machine for the head and one for each of `nodes`, and starts the
    /// head with node timeout `node_timeout`; `None` (with the reason printed)
    /// where network namespaces cannot be made here.
    pub(crate) fn start(nodes: &[&str], node_timeout: &str) -> Option<Self> {
        if !is_root() {
            skip("network namespaces need root");
            return None;
        }
        for tool in ["ip", "unshare", "getent", "sh"] {
            if Command::new("sh")
                .args(["-c", &format!("command -v {tool}")])
                .stdout(Stdio::null())
                .status()
                .map_or(true, |status| !status.success())
            {
                skip(&format!("`{tool}` is not installed"));
                return None;
            }
        }
        let number = CLUSTERS.fetch_add(1, Ordering::Relaxed);
        let prefix = format!("xpt{}-{number}", std::process::id());
        let mut cluster = Self {
            dir: super::cluster_dir(),
            join: String::new(),
            node_join: String::new(),
            namespaces: Vec::new(),
            hosts: BTreeMap::new(),
            head: None,
            nodes: BTreeMap::new(),
        };
        if let Err(reason) = cluster.make_network(&prefix, nodes) {
            // Dropping the cluster deletes what was made.
            skip(&format!("cannot make network namespaces: {reason:#}"));
            return None;
        }
        cluster.start_head(node_timeout);
        Some(cluster)
    }

    /// The namespaces, the bridge in the head's, one veth pair per node and the
    /// machines' `/etc/hosts`.
    fn make_network(&mut self, prefix: &str, nodes: &[&str]) -> anyhow::Result<()> {
        let head_namespace = format!("{prefix}-head");
        self.add_host("head", &head_namespace, HEAD_IP)?;
        let head = head_namespace.as_str();
        ip(&["-n", head, "link", "add", "br0", "type", "bridge"])?;
        ip(&[
            "-n",
            head,
            "addr",
            "add",
            &format!("{HEAD_IP}/24"),
            "dev",
            "br0",
        ])?;
        ip(&["-n", head, "link", "set", "br0", "up"])?;
        for (index, name) in nodes.iter().enumerate() {
            let namespace = format!("{prefix}-{name}");
            let address = format!("10.77.0.{}", index + 2);
            self.add_host(name, &namespace, &address)?;
            let port = format!("port{index}");
            ip(&[
                "-n", &namespace, "link", "add", "eth0", "type", "veth", "peer", "name", &port,
                "netns", head,
            ])?;
            ip(&["-n", head, "link", "set", &port, "master", "br0"])?;
            ip(&["-n", head, "link", "set", &port, "up"])?;
            ip(&[
                "-n",
                &namespace,
                "addr",
                "add",
                &format!("{address}/24"),
                "dev",
                "eth0",
            ])?;
            ip(&["-n", &namespace, "link", "set", "eth0", "up"])?;
        }
        Ok(())
    }

    /// A namespace with loopback up, and the machine's host name and hosts file.
    fn add_host(&mut self, name: &str, namespace: &str, address: &str) -> anyhow::Result<()> {
        ip(&["netns", "add", namespace])?;
        self.namespaces.push(namespace.to_owned());
        ip(&["-n", namespace, "link", "set", "lo", "up"])?;
        let hostname = format!("xp-test-{name}");
        let hosts_file = self.dir.path().join(format!("hosts-{name}"));
        // The Debian default: the machine's own name on a loopback address.
        std::fs::write(
            &hosts_file,
            format!("127.0.0.1 localhost\n127.0.1.1 {hostname}\n"),
        )
        .with_context(|| format!("cannot write {}", hosts_file.display()))?;
        self.hosts.insert(
            name.to_owned(),
            Host {
                namespace: namespace.to_owned(),
                ip: address.to_owned(),
                hostname,
                hosts_file,
            },
        );
        Ok(())
    }

    /// A command that runs `program` on machine `host`: in its network namespace,
    /// under its host name and with its `/etc/hosts`.
    pub(crate) fn command_on(&self, host: &str, program: impl AsRef<Path>) -> Command {
        let machine = &self.hosts[host];
        let mut command = Command::new("ip");
        command
            .args(["netns", "exec", &machine.namespace])
            .args(["unshare", "--uts", "--mount", "--", "sh", "-c"])
            .arg(r#"hostname "$XP_TEST_HOSTNAME" && mount --bind "$XP_TEST_HOSTS" /etc/hosts && exec "$@""#)
            .arg("sh")
            .arg(program.as_ref())
            .env("XP_TEST_HOSTNAME", &machine.hostname)
            .env("XP_TEST_HOSTS", &machine.hosts_file);
        command
    }

    /// The address of machine `host` on the bridge.
    pub(crate) fn ip_of(&self, host: &str) -> &str {
        &self.hosts[host].ip
    }

    /// Checks, on every machine, that its host name resolves to a loopback
    /// address, as on Debian, and says so.
    pub(crate) fn check_hostnames_resolve_to_loopback(&self) {
        for (name, machine) in &self.hosts {
            let output = self
                .command_on(name, "sh")
                .args(["-c", "getent hosts \"$(hostname)\""])
                .output()
                .expect("getent runs");
            let text = String::from_utf8_lossy(&output.stdout);
            assert!(
                output.status.success() && text.starts_with("127."),
                "{} should resolve to a loopback address on {name}: {text:?} {}",
                machine.hostname,
                String::from_utf8_lossy(&output.stderr)
            );
            #[expect(clippy::print_stderr, reason = "tell what the test checked")]
            {
                eprintln!(
                    "machine {name} ({}): its host name {} resolves to {}",
                    machine.ip,
                    machine.hostname,
                    text.split_whitespace().next().unwrap_or_default()
                );
            }
        }
    }

    fn start_head(&mut self, node_timeout: &str) {
        let log = std::fs::File::create(self.dir.path().join("head.log")).expect("head log");
        let mut child = self
            .command_on("head", binary("xp-head"))
            .args(["start", "--listen", &format!("{HEAD_IP}:0"), "--data-dir"])
            .arg(self.dir.path().join("head"))
            .args(["--node-timeout", node_timeout])
            .env("XP_LOG", "info")
            .stdout(Stdio::piped())
            .stderr(log)
            .spawn()
            .expect("xp-head starts");
        let stdout = child.stdout.take().expect("piped stdout");
        let mut lines = BufReader::new(stdout).lines();
        let credentials = super::read_head_credentials(&mut lines);
        // Keep draining stdout so the head never blocks on a full pipe.
        std::thread::spawn(move || lines.for_each(drop));
        self.head = Some(child);
        let Some(super::HeadCredentials {
            admin: Some(admin),
            node: Some(node),
            ..
        }) = credentials
        else {
            self.dump_logs();
            panic!("the head printed no admin and node credentials");
        };
        assert!(
            node.starts_with(&format!("xp://{HEAD_IP}:")),
            "the join string names the head's address: {node}"
        );
        self.join = admin;
        self.node_join = node;
    }

    /// Starts a node on machine `name` with `gpus` declared GPU slots, `cpus`
    /// cores and `extra` arguments; it advertises whatever it chooses by default.
    pub(crate) fn start_node(&mut self, name: &str, gpus: u32, cpus: u32, extra: &[&str]) {
        let log = std::fs::File::create(self.node_log_path(name)).expect("node log");
        let child = self
            .command_on(name, binary("xp-node"))
            .args(["join", "--data-dir"])
            .arg(self.node_dir(name))
            .args(["--gpus", &gpus.to_string(), "--cpus", &cpus.to_string()])
            .args(["--label", &format!("name={name}")])
            .args(extra)
            .env("XP_JOIN", &self.node_join)
            .env("XP_LOG", "info")
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("xp-node starts");
        self.nodes.insert(name.to_owned(), child);
    }

    /// Kills node `name` with SIGKILL (its workers die with it).
    pub(crate) fn kill_node(&mut self, name: &str) {
        let mut node = self.nodes.remove(name).expect("a node of that name");
        node.kill().expect("kill the node");
        node.wait().expect("reap the node");
    }

    /// Cuts machine `name` off the network (`ip link set eth0 down` in its
    /// namespace): its processes live on, unreachable.
    pub(crate) fn cut_network(&self, name: &str) {
        let namespace = &self.hosts[name].namespace;
        ip(&["-n", namespace, "link", "set", "eth0", "down"]).expect("cut the machine off");
    }

    /// The data directory of node `name`.
    pub(crate) fn node_dir(&self, name: &str) -> PathBuf {
        self.dir.path().join(format!("node-{name}"))
    }

    fn node_log_path(&self, name: &str) -> PathBuf {
        self.dir.path().join(format!("node-{name}.log"))
    }

    /// Everything node `name` has logged so far.
    pub(crate) fn node_log(&self, name: &str) -> String {
        std::fs::read_to_string(self.node_log_path(name)).expect("node log")
    }

    /// The id node `name` chose (waiting for it to start).
    pub(crate) fn node_id(&self, name: &str) -> String {
        let path = self.node_dir(name).join("node_id");
        wait_until(
            &format!("node {name} to write its id"),
            Duration::from_secs(60),
            || std::fs::read_to_string(&path).ok(),
        )
        .trim()
        .to_owned()
    }

    /// The name of the node whose id is `id`.
    pub(crate) fn node_named(&self, id: &str) -> String {
        self.hosts
            .keys()
            .find(|name| {
                std::fs::read_to_string(self.node_dir(name).join("node_id"))
                    .is_ok_and(|text| text.trim() == id)
            })
            .unwrap_or_else(|| panic!("no node has id {id}"))
            .clone()
    }

    /// Runs the `xp` CLI on the head's machine.
    pub(crate) fn xp(&self, args: &[&str]) -> Output {
        self.command_on("head", env!("CARGO_BIN_EXE_xp"))
            .args(args)
            .env("XP_CLUSTER", &self.join)
            .output()
            .expect("xp runs")
    }

    /// Runs `xp` and returns its stdout, panicking with its stderr on failure.
    pub(crate) fn must_xp(&self, args: &[&str]) -> String {
        must_succeed(args, self.xp(args))
    }

    /// `xp nodes --json`, parsed.
    pub(crate) fn nodes_json(&self) -> Vec<Value> {
        self.must_xp(&["nodes", "--json"])
            .lines()
            .map(|line| serde_json::from_str(line).expect("node JSON"))
            .collect()
    }

    /// Waits until `count` nodes are ready.
    pub(crate) fn wait_for_nodes(&self, count: usize) {
        wait_for_ready_nodes(count, Duration::from_secs(60), || {
            self.xp(&["nodes", "--json"])
        });
    }

    /// Runs a driver program (`examples/...`) on the head's machine with `args`
    /// and returns the first line it prints (the experiment id).
    pub(crate) fn run_driver(&self, program: &str, args: &[&str]) -> String {
        let output = self
            .command_on("head", binary(program))
            .args(args)
            .env("XP_CLUSTER", &self.join)
            .output()
            .expect("the driver runs");
        assert!(
            output.status.success(),
            "driver failed: {}",
            String::from_utf8_lossy(&output.stderr)
        );
        String::from_utf8(output.stdout)
            .expect("the driver prints text")
            .lines()
            .next()
            .expect("the driver prints the experiment id")
            .trim()
            .to_owned()
    }

    /// `xp status EXPERIMENT --json`, parsed.
    pub(crate) fn status(&self, experiment: &str) -> Value {
        serde_json::from_str(self.must_xp(&["status", experiment, "--json"]).trim())
            .expect("status is JSON")
    }

    /// Waits until the experiment is no longer running and returns its status.
    pub(crate) fn wait_finished(&self, experiment: &str, timeout: Duration) -> Value {
        wait_not_running(experiment, timeout, || self.status(experiment))
    }

    /// Writes `text` to a file in the cluster's directory (which every machine
    /// sees) and returns its path.
    pub(crate) fn write_file(&self, name: &str, text: &str) -> PathBuf {
        write_file_in(self.dir.path(), name, text)
    }

    /// Prints the processes' logs (for failing tests).
    pub(crate) fn dump_logs(&self) {
        dump_logs_in(self.dir.path());
    }
}

impl Drop for NetnsCluster {
    fn drop(&mut self) {
        // Clean up first: printing logs can fail (a closed stderr), and a panic
        // while panicking aborts before anything else is cleaned up.
        for (_, mut node) in std::mem::take(&mut self.nodes) {
            let _ = node.kill();
            let _ = node.wait();
        }
        if let Some(mut head) = self.head.take() {
            let _ = head.kill();
            let _ = head.wait();
        }
        for namespace in std::mem::take(&mut self.namespaces).into_iter().rev() {
            kill_everything_in(&namespace);
            // Deleting a namespace deletes the interfaces in it, and so both ends
            // of every veth pair and the bridge.
            if let Err(error) = ip(&["netns", "del", &namespace]) {
                let _ = writeln!(
                    std::io::stderr(),
                    "cannot delete network namespace {namespace}: {error:#}"
                );
            }
        }
        if std::thread::panicking() {
            self.dump_logs();
        }
    }
}

/// Kills what still runs in `namespace` (a worker whose node was killed is
/// already gone with it; this is the safety net).
fn kill_everything_in(namespace: &str) {
    let Ok(output) = Command::new("ip")
        .args(["netns", "pids", namespace])
        .output()
    else {
        return;
    };
    for pid in String::from_utf8_lossy(&output.stdout).split_whitespace() {
        if let Ok(pid) = pid.parse::<i32>() {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(pid),
                nix::sys::signal::Signal::SIGKILL,
            );
        }
    }
}

/// Whether this process runs with effective user id 0.
fn is_root() -> bool {
    std::fs::read_to_string("/proc/self/status").is_ok_and(|status| {
        status
            .lines()
            .find_map(|line| line.strip_prefix("Uid:"))
            .and_then(|ids| ids.split_whitespace().nth(1).map(|euid| euid == "0"))
            .unwrap_or(false)
    })
}

fn skip(reason: &str) {
    super::cannot_run(reason);
}
