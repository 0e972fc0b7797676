//! Shared harness for the end-to-end tests: real `xp-head` and `xp-node`
//! processes on 127.0.0.1 with temporary data directories and ephemeral ports.
//!
//! A [`TestCluster`] kills every process it started when dropped, and waits use
//! [`wait_until`] (polling until a deadline), never a bare sleep.

#![allow(
    dead_code,
    reason = "each test binary uses a different part of the harness"
)]

pub(crate) mod netns;
pub(crate) mod sgd;

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

/// A test (or a part of one) that cannot run here says why. Where CI runs
/// (`CI` set: `.ci/run` sets it, and installs every part the tests need),
/// that is a failure, never a silent pass.
pub(crate) fn cannot_run(reason: &str) {
    assert!(
        std::env::var_os("CI").is_none(),
        "cannot run in CI, which installs what the tests need: {reason}"
    );
    #[expect(clippy::print_stderr, reason = "say why a test is skipped")]
    {
        eprintln!("skipped: {reason}");
    }
}

/// Whether a test that needs per-worker user ids must be skipped because this
/// process is not root (it says so, and fails where CI runs).
pub(crate) fn skipped_without_root() -> bool {
    let root = nix::unistd::geteuid().is_root();
    if !root {
        cannot_run("only a node running as root gives workers user ids of their own");
    }
    !root
}

/// Submits a command trial of `team` running `command` (its argv), with
/// `extra` lines in its `trial:` section; the experiment id.
pub(crate) fn submit_command(
    cluster: &TestCluster,
    name: &str,
    team: &str,
    extra: &str,
    command: &[&str],
) -> String {
    let yaml = format!(
        "name: {name}\nteam: {team}\ntrial:\n  command: {}\n  resources: {{cpu: 1}}\n{extra}",
        serde_json::to_string(command).expect("JSON is YAML")
    );
    let path = cluster.write_file(&format!("{name}.yaml"), &yaml);
    cluster
        .must_xp(&["submit", path.to_str().expect("a UTF-8 path")])
        .trim()
        .to_owned()
}

/// The metric `name` a trial reported (panics, showing the trial, when absent).
pub(crate) fn metric(trial: &Value, name: &str) -> f64 {
    trial["metrics"][name]
        .as_f64()
        .unwrap_or_else(|| panic!("metric {name} in {trial:#}"))
}

/// The directory holding the workspace's binaries (`target/debug`).
pub(crate) fn bin_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("the test binary has a path");
    exe.parent()
        .and_then(Path::parent)
        .expect("test binaries live in target/<profile>/deps")
        .to_owned()
}

/// The path of a workspace binary, checked to exist.
pub(crate) fn binary(name: &str) -> PathBuf {
    let path = bin_dir().join(name);
    assert!(
        path.exists(),
        "{} is missing: run the tests with `cargo test --workspace`",
        path.display()
    );
    path
}

/// Polls `check` every 100 ms until it returns `Some`, or panics after `timeout`.
pub(crate) fn wait_until<T>(
    what: &str,
    timeout: Duration,
    mut check: impl FnMut() -> Option<T>,
) -> T {
    #[expect(
        clippy::disallowed_methods,
        reason = "the test harness measures its own deadline"
    )]
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(value) = check() {
            return value;
        }
        #[expect(
            clippy::disallowed_methods,
            reason = "the test harness measures its own deadline"
        )]
        let now = Instant::now();
        assert!(
            now < deadline,
            "timed out after {timeout:?} waiting for {what}"
        );
        #[expect(
            clippy::disallowed_methods,
            reason = "tests poll real processes from a plain thread"
        )]
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// What a head prints on start: the first admin's credential (when this
/// start created it) and, on its first start only, the node credential
/// (later starts print `head: HOST:PORT ...` instead).
pub(crate) struct HeadCredentials {
    /// `admin: xp://...`, when this start created the first admin.
    pub(crate) admin: Option<String>,
    /// `node: xp://...`, on the first start.
    pub(crate) node: Option<String>,
    /// The port the head listens on.
    pub(crate) port: u16,
}

/// Reads the head's credential lines from its stdout, up to the `node:` or
/// `head:` line; `None` when stdout ends first.
pub(crate) fn read_head_credentials(
    lines: &mut impl Iterator<Item = std::io::Result<String>>,
) -> Option<HeadCredentials> {
    let mut admin = None;
    for line in lines {
        let line = line.expect("head stdout is text");
        if let Some(credential) = line.strip_prefix("admin: ") {
            admin = Some(credential.to_owned());
        } else if let Some(credential) = line.strip_prefix("node: ") {
            let join: xp_runtime::join::JoinString = credential.parse().expect("a join string");
            return Some(HeadCredentials {
                admin,
                node: Some(credential.to_owned()),
                port: join.port,
            });
        } else if let Some(address) = line.strip_prefix("head: ") {
            assert!(
                !address.contains("token"),
                "a restart printed a secret: {line}"
            );
            let port = address
                .split_whitespace()
                .next()
                .and_then(|address| address.rsplit(':').next())
                .and_then(|port| port.parse().ok())
                .expect("a port in the head line");
            return Some(HeadCredentials {
                admin,
                node: None,
                port,
            });
        }
    }
    None
}

/// A temporary directory for a cluster's data directories and logs, open like
/// `/tmp` (1777): a node running as root runs its workers under user ids of
/// their own, which must reach their work directories inside it, and tests have
/// workers leave files here (a pid, an object id). Everything secret inside is
/// private to its owner (the head's and the nodes' data directories). It lies
/// under the build's own temporary directory, not `/tmp`: a root node removes
/// what a worker's user id left anywhere under `/tmp` once its last worker is
/// gone, and the tests read what their workers left after they ended.
pub(crate) fn cluster_dir() -> tempfile::TempDir {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).expect("a temporary directory");
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o1777))
        .expect("let workers into the cluster directory");
    dir
}

/// Processes of one test cluster.
pub(crate) struct TestCluster {
    pub(crate) dir: tempfile::TempDir,
    /// The first admin's credential: what `xp` and drivers use.
    pub(crate) join: String,
    /// The node credential: what nodes join with.
    pub(crate) node_join: String,
    pub(crate) port: u16,
    head: Option<Child>,
    nodes: BTreeMap<String, Child>,
    node_timeout: String,
    /// Extra arguments for `xp-head start` (such as `--policy FILE`).
    head_args: Vec<String>,
    /// The PostgreSQL server the head keeps its records in, if not its data
    /// directory; stopped after the head (fields drop after `drop`).
    postgres: Option<xp_head::test_postgres::TestPostgres>,
    /// Where the current head writes its log.
    head_log: PathBuf,
}

impl TestCluster {
    /// Starts a head with the given node timeout (such as `10s`).
    pub(crate) fn start(node_timeout: &str) -> Self {
        Self::start_with_policy(node_timeout, None)
    }

    /// Starts a head that schedules with the policy file `policy` (YAML text).
    pub(crate) fn start_with_policy(node_timeout: &str, policy: Option<&str>) -> Self {
        let dir = cluster_dir();
        let mut head_args = Vec::new();
        if let Some(policy) = policy {
            let path = dir.path().join("policy.yaml");
            std::fs::write(&path, policy).expect("policy file");
            head_args = vec!["--policy".to_owned(), path.display().to_string()];
        }
        Self::start_head_in(dir, node_timeout, head_args, None)
    }

    /// Starts a head in `dir` (its data directory `dir/head`), keeping its
    /// records in `postgres` where given.
    fn start_head_in(
        dir: tempfile::TempDir,
        node_timeout: &str,
        head_args: Vec<String>,
        postgres: Option<xp_head::test_postgres::TestPostgres>,
    ) -> Self {
        let mut cluster = Self {
            dir,
            join: String::new(),
            node_join: String::new(),
            port: 0,
            head: None,
            nodes: BTreeMap::new(),
            node_timeout: node_timeout.to_owned(),
            head_args,
            postgres,
            head_log: PathBuf::new(),
        };
        cluster.start_head("127.0.0.1:0");
        cluster
    }

    fn start_head(&mut self, listen: &str) {
        // One log per port the head starts on (the first start's: port 0).
        self.head_log = self.dir.path().join(format!("head-{}.log", self.port));
        let log = std::fs::File::create(&self.head_log).expect("head log");
        let mut child = Command::new(binary("xp-head"))
            .args(["start", "--listen", listen, "--data-dir"])
            .arg(self.dir.path().join("head"))
            .args(["--node-timeout", &self.node_timeout])
            .args(&self.head_args)
            .env("XP_LOG", "info")
            .stdout(Stdio::piped())
            .stderr(log)
            .spawn()
            .expect("xp-head starts");
        let stdout = child.stdout.take().expect("piped stdout");
        let mut lines = BufReader::new(stdout).lines();
        let credentials =
            read_head_credentials(&mut lines).expect("the head prints its node credential");
        // Keep draining stdout so the head never blocks on a full pipe, and
        // keep what follows the credentials, for tests that check no secret
        // is printed after them.
        let kept = self.dir.path().join(format!("head-{}.stdout", self.port));
        std::thread::spawn(move || {
            let mut file = std::fs::File::create(kept).ok();
            for line in lines.map_while(Result::ok) {
                if let Some(file) = file.as_mut() {
                    let _ = writeln!(file, "{line}");
                }
            }
        });
        self.port = credentials.port;
        // Both credentials are printed on the first start only; a restart keeps them.
        if let Some(admin) = credentials.admin {
            self.join = admin;
        }
        if let Some(node) = credentials.node {
            self.node_join = node;
        }
        assert!(
            !self.join.is_empty() && !self.node_join.is_empty(),
            "the head printed no admin or node credential"
        );
        self.head = Some(child);
    }

    /// Where the current head writes its log.
    pub(crate) fn head_log_path(&self) -> PathBuf {
        self.head_log.clone()
    }

    /// The head's process id, while it runs.
    pub(crate) fn head_pid(&self) -> Option<u32> {
        self.head.as_ref().map(Child::id)
    }

    /// The head's exit status once it exited by itself (reaped).
    pub(crate) fn try_wait_head(&mut self) -> Option<std::process::ExitStatus> {
        let status = self.head.as_mut()?.try_wait().expect("poll the head")?;
        self.head = None;
        Some(status)
    }

    /// Kills the head with SIGKILL.
    pub(crate) fn kill_head(&mut self) {
        if let Some(mut head) = self.head.take() {
            head.kill().expect("kill the head");
            head.wait().expect("reap the head");
        }
    }

    /// Starts the head again on the same port and data directory.
    pub(crate) fn restart_head(&mut self) {
        let listen = format!("127.0.0.1:{}", self.port);
        self.start_head(&listen);
    }

    /// Starts the head again, as [`restart_head`](Self::restart_head) does,
    /// with these `xp-head start` arguments from now on.
    pub(crate) fn restart_head_with(&mut self, head_args: &[&str]) {
        self.head_args = head_args.iter().map(|arg| (*arg).to_owned()).collect();
        self.restart_head();
    }

    /// Starts a node named `name` with `gpus` declared GPU slots and `cpus` cores.
    pub(crate) fn start_node(&mut self, name: &str, gpus: u32, cpus: u32) {
        self.start_node_with(name, gpus, cpus, &[]);
    }

    /// Like [`start_node`](Self::start_node), with extra `xp-node join` arguments.
    pub(crate) fn start_node_with(&mut self, name: &str, gpus: u32, cpus: u32, extra: &[&str]) {
        let log = std::fs::File::create(self.node_log_path(name)).expect("node log");
        // Kept (not discarded) so that tests can check it holds no secret.
        let stdout = std::fs::File::create(self.dir.path().join(format!("node-{name}.stdout")))
            .expect("node stdout");
        // The join string travels in the environment, never in the arguments `ps` shows.
        let child = Command::new(binary("xp-node"))
            .args(["join", "--data-dir"])
            .arg(self.dir.path().join(format!("node-{name}")))
            .args([
                "--gpus",
                &gpus.to_string(),
                "--cpus",
                &cpus.to_string(),
                "--label",
                &format!("name={name}"),
            ])
            .args(extra)
            .env("XP_JOIN", &self.node_join)
            .env("XP_LOG", "info")
            .stdout(stdout)
            .stderr(log)
            .spawn()
            .expect("xp-node starts");
        self.nodes.insert(name.to_owned(), child);
    }

    /// The data directory of node `name`.
    pub(crate) fn node_dir(&self, name: &str) -> PathBuf {
        self.dir.path().join(format!("node-{name}"))
    }

    /// The id node `name` chose on its first start (waiting for it to start).
    pub(crate) fn node_id(&self, name: &str) -> String {
        let path = self.node_dir(name).join("node_id");
        wait_until(
            &format!("node {name} to write its id"),
            Duration::from_secs(30),
            || std::fs::read_to_string(&path).ok(),
        )
        .trim()
        .to_owned()
    }

    /// Kills node `name` with SIGKILL.
    pub(crate) fn kill_node(&mut self, name: &str) {
        let mut node = self.nodes.remove(name).expect("a node of that name");
        node.kill().expect("kill the node");
        node.wait().expect("reap the node");
    }

    /// Sends SIGTERM to node `name` and waits for it to exit.
    pub(crate) fn terminate_node(&mut self, name: &str) -> std::process::ExitStatus {
        let mut node = self.nodes.remove(name).expect("a node of that name");
        let pid = nix::unistd::Pid::from_raw(node.id() as i32);
        nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM).expect("signal the node");
        wait_until(
            "the node to exit after SIGTERM",
            Duration::from_secs(30),
            || node.try_wait().expect("poll the node"),
        )
    }

    /// Runs the `xp` CLI against this cluster.
    pub(crate) fn xp(&self, args: &[&str]) -> Output {
        Command::new(env!("CARGO_BIN_EXE_xp"))
            .args(args)
            .env("XP_CLUSTER", &self.join)
            .output()
            .expect("xp runs")
    }

    /// Where node `name` writes its log.
    pub(crate) fn node_log_path(&self, name: &str) -> PathBuf {
        self.dir.path().join(format!("node-{name}.log"))
    }

    /// Everything node `name` has logged so far.
    pub(crate) fn node_log(&self, name: &str) -> String {
        std::fs::read_to_string(self.node_log_path(name)).expect("node log")
    }

    /// Runs a driver program (`examples/...`) against this cluster with `args`
    /// and returns the first line it prints (the experiment id), panicking with
    /// its stderr on failure.
    pub(crate) fn run_driver(&self, program: &str, args: &[&str]) -> String {
        let output = Command::new(binary(program))
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

    /// Runs `xp` and returns its stdout, panicking with its stderr on failure.
    pub(crate) fn must_xp(&self, args: &[&str]) -> String {
        must_succeed(args, self.xp(args))
    }

    /// `xp status EXPERIMENT --json`, parsed.
    pub(crate) fn status(&self, experiment: &str) -> Value {
        serde_json::from_str(self.must_xp(&["status", experiment, "--json"]).trim())
            .expect("status is JSON")
    }

    /// Waits until `count` nodes are ready.
    pub(crate) fn wait_for_nodes(&self, count: usize) {
        wait_for_ready_nodes(count, Duration::from_secs(30), || {
            self.xp(&["nodes", "--json"])
        });
    }

    /// Waits until the experiment is no longer running and returns its status.
    pub(crate) fn wait_finished(&self, experiment: &str, timeout: Duration) -> Value {
        wait_not_running(experiment, timeout, || self.status(experiment))
    }

    /// Writes `text` to a file in the cluster's directory and returns its path.
    pub(crate) fn write_file(&self, name: &str, text: &str) -> PathBuf {
        write_file_in(self.dir.path(), name, text)
    }

    /// Prints the processes' logs (for failing tests).
    pub(crate) fn dump_logs(&self) {
        dump_logs_in(self.dir.path());
    }
}

impl Drop for TestCluster {
    fn drop(&mut self) {
        if std::thread::panicking() {
            self.dump_logs();
        }
        for (_, mut node) in std::mem::take(&mut self.nodes) {
            let _ = node.kill();
            let _ = node.wait();
        }
        self.kill_head();
    }
}

/// Fails the test with `xp`'s stderr unless `output` succeeded; its stdout.
pub(crate) fn must_succeed(args: &[&str], output: Output) -> String {
    assert!(
        output.status.success(),
        "xp {args:?} failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8(output.stdout).expect("xp prints text")
}

/// Polls `nodes_json` (the output of `xp nodes --json`) until `count` nodes are ready.
pub(crate) fn wait_for_ready_nodes(
    count: usize,
    timeout: Duration,
    nodes_json: impl Fn() -> Output,
) {
    wait_until(&format!("{count} ready nodes"), timeout, || {
        let output = nodes_json();
        let ready = String::from_utf8_lossy(&output.stdout)
            .lines()
            .filter(|line| line.contains("\"state\":\"ready\""))
            .count();
        (ready >= count).then_some(())
    });
}

/// Polls `status` until the experiment is no longer running; its last status.
pub(crate) fn wait_not_running(
    experiment: &str,
    timeout: Duration,
    status: impl Fn() -> Value,
) -> Value {
    wait_until(
        &format!("experiment {experiment} to finish"),
        timeout,
        || {
            let status = status();
            (status["state"] != "running").then_some(status)
        },
    )
}

/// Writes `text` to `dir/name` and returns its path.
pub(crate) fn write_file_in(dir: &Path, name: &str, text: &str) -> PathBuf {
    let path = dir.join(name);
    std::fs::write(&path, text).expect("write a test file");
    path
}

/// Writes the last 40 lines of every `*.log` in `dir` to stderr (for failing
/// tests). Written, not printed: a closed stderr must not panic in a drop.
pub(crate) fn dump_logs_in(dir: &Path) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        if entry
            .path()
            .extension()
            .is_some_and(|extension| extension == "log")
        {
            let text = std::fs::read_to_string(entry.path()).unwrap_or_default();
            let tail: Vec<&str> = text.lines().rev().take(40).collect();
            let mut stderr = std::io::stderr().lock();
            let _ = writeln!(stderr, "==== {} ====", entry.path().display());
            for line in tail.iter().rev() {
                let _ = writeln!(stderr, "{line}");
            }
        }
    }
}

/// Every trial of an experiment's status JSON.
pub(crate) fn trials(status: &Value) -> &Vec<Value> {
    status["trials"].as_array().expect("trials is an array")
}

impl TestCluster {
    /// Starts a head whose data directory is first prepared by `prepare` (given
    /// its path, not yet created: a test may mount a file system there), with
    /// extra `xp-head start` arguments.
    pub(crate) fn start_prepared(
        node_timeout: &str,
        head_args: &[&str],
        prepare: impl FnOnce(&Path),
    ) -> Self {
        let dir = cluster_dir();
        prepare(&dir.path().join("head"));
        let head_args = head_args.iter().map(|arg| (*arg).to_owned()).collect();
        Self::start_head_in(dir, node_timeout, head_args, None)
    }

    /// Starts a head that keeps its records in a PostgreSQL server of its own
    /// (made with `initdb` for the test), with extra `xp-head start` arguments;
    /// `None` where PostgreSQL is not installed (a failure where CI runs).
    pub(crate) fn start_on_postgres(node_timeout: &str, head_args: &[&str]) -> Option<Self> {
        let postgres = match xp_head::test_postgres::TestPostgres::start(false) {
            Ok(postgres) => postgres,
            Err(reason) => {
                cannot_run(&reason);
                return None;
            }
        };
        let url = postgres.url();
        let mut args = vec!["--store", url.as_str()];
        args.extend_from_slice(head_args);
        let head_args = args.iter().map(|arg| (*arg).to_owned()).collect();
        Some(Self::start_head_in(
            cluster_dir(),
            node_timeout,
            head_args,
            Some(postgres),
        ))
    }

    /// The address of the PostgreSQL database the head keeps its records in, if any.
    pub(crate) fn store_url(&self) -> Option<String> {
        self.postgres
            .as_ref()
            .map(xp_head::test_postgres::TestPostgres::url)
    }

    /// The PostgreSQL server of a cluster made by [`start_on_postgres`](Self::start_on_postgres).
    pub(crate) fn postgres(&mut self) -> &mut xp_head::test_postgres::TestPostgres {
        self.postgres.as_mut().expect("a cluster on PostgreSQL")
    }

    /// The head's data directory.
    pub(crate) fn head_dir(&self) -> PathBuf {
        self.dir.path().join("head")
    }
}

/// A free TCP port on 127.0.0.1 (free when asked; a test binds it soon after).
pub(crate) fn free_tcp_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|listener| listener.local_addr())
        .expect("a free port")
        .port()
}

/// One HTTP/1.1 exchange with `addr`: the status, the header block (lower
/// case) and the body (de-chunked). The body is sent after the headers and a
/// failure to send it is ignored, since a server may answer (413, say) before
/// reading a body it refuses. The one hand-rolled client of the tests, kept to
/// what they need: no keep-alive, no redirects.
pub(crate) fn http_exchange(
    addr: &str,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: impl AsRef<[u8]>,
) -> (u16, String, String) {
    use std::io::{Read, Write};
    let body = body.as_ref();
    let mut stream = std::net::TcpStream::connect(addr).expect("connect to the HTTP API");
    stream
        .set_read_timeout(Some(Duration::from_secs(60)))
        .expect("a read timeout");
    let mut request = format!("{method} {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n");
    for (name, value) in headers {
        request.push_str(&format!("{name}: {value}\r\n"));
    }
    if !body.is_empty() {
        request.push_str(&format!("Content-Length: {}\r\n", body.len()));
    }
    request.push_str("\r\n");
    stream
        .write_all(request.as_bytes())
        .expect("send the request");
    let _ = stream.write_all(body);
    let mut answer = Vec::new();
    stream.read_to_end(&mut answer).expect("read the answer");
    let answer = String::from_utf8(answer).expect("the answer is text");
    let (head, body) = answer.split_once("\r\n\r\n").expect("a header block");
    let status = head
        .split_whitespace()
        .nth(1)
        .and_then(|code| code.parse().ok())
        .expect("a status code");
    let head = head.to_ascii_lowercase();
    let body = if head.contains("transfer-encoding: chunked") {
        dechunk(body)
    } else {
        body.to_owned()
    };
    (status, head, body)
}

/// The payload of a chunked body.
fn dechunk(mut body: &str) -> String {
    let mut out = String::new();
    loop {
        let (size, rest) = body.split_once("\r\n").expect("a chunk size");
        let size = usize::from_str_radix(size.trim(), 16).expect("a hex chunk size");
        if size == 0 {
            return out;
        }
        out.push_str(&rest[..size]);
        body = &rest[size + 2..];
    }
}

/// `GET path` over HTTP/1.1 from `addr`: the status code and the body, or `None`
/// when the server cannot be reached.
pub(crate) fn http_get(addr: &str, path: &str) -> Option<(u16, String)> {
    use std::io::{Read, Write};
    let mut stream = std::net::TcpStream::connect(addr).ok()?;
    stream
        .set_read_timeout(Some(Duration::from_secs(30)))
        .ok()?;
    write!(
        stream,
        "GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n"
    )
    .ok()?;
    let mut answer = String::new();
    stream.read_to_string(&mut answer).ok()?;
    let status = answer.split_whitespace().nth(1)?.parse().ok()?;
    let body = answer
        .split_once("\r\n\r\n")
        .map_or(String::new(), |(_, body)| body.to_owned());
    Some((status, body))
}
