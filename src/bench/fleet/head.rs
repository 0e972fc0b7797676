//! The soak's head: a real `xp-head` process on loopback, which the soak can
//! kill with SIGKILL and start again on the same port and data directory, and
//! whose CPU time and memory it reads from `/proc`.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};

use super::FleetError;

/// How long a head may take to print its address.
const START_TIMEOUT: Duration = Duration::from_secs(60);

/// The running head and what its earlier lives used.
pub(super) struct HeadProcess {
    binary: PathBuf,
    dir: PathBuf,
    node_timeout: String,
    /// The HTTP API, for `/metrics`.
    pub(super) http: SocketAddr,
    /// The QUIC port, kept across restarts.
    port: u16,
    child: Option<Child>,
    /// CPU seconds of the lives that ended.
    past_cpu: f64,
    /// The most resident memory seen, in bytes.
    pub(super) peak_rss: u64,
    /// The admin's and the nodes' credentials, printed by the first start.
    pub(super) admin: String,
    pub(super) node: String,
}

impl HeadProcess {
    /// Starts `binary` on a fresh data directory under `dir`.
    pub(super) async fn start(
        binary: &Path,
        dir: &Path,
        node_timeout: &str,
    ) -> Result<Self, FleetError> {
        let http = free_tcp_port()?;
        let mut head = Self {
            binary: binary.to_owned(),
            dir: dir.to_owned(),
            node_timeout: node_timeout.to_owned(),
            http,
            port: 0,
            child: None,
            past_cpu: 0.0,
            peak_rss: 0,
            admin: String::new(),
            node: String::new(),
        };
        head.launch().await?;
        if head.admin.is_empty() || head.node.is_empty() {
            return Err(FleetError::Head(
                "the head printed no admin or node credential".to_owned(),
            ));
        }
        Ok(head)
    }

    /// Starts a life of the head and reads what it prints until its address.
    async fn launch(&mut self) -> Result<(), FleetError> {
        let log = std::fs::File::options()
            .create(true)
            .append(true)
            .open(self.dir.join("head.log"))?;
        let mut child = Command::new(&self.binary)
            .args(["start", "--listen"])
            .arg(format!("127.0.0.1:{}", self.port))
            .arg("--data-dir")
            .arg(self.dir.join("head"))
            .args(["--node-timeout", &self.node_timeout])
            .arg("--http")
            .arg(self.http.to_string())
            .env("XP_LOG", "info")
            .stdout(Stdio::piped())
            .stderr(log)
            .kill_on_drop(true)
            .spawn()
            .map_err(|error| {
                FleetError::Head(format!("cannot run {}: {error}", self.binary.display()))
            })?;
        let stdout = child.stdout.take().expect("stdout is piped");
        self.child = Some(child);
        let mut lines = BufReader::new(stdout).lines();
        let printed = tokio::time::timeout(START_TIMEOUT, async {
            while let Some(line) = lines.next_line().await? {
                if let Some(admin) = line.strip_prefix("admin: ") {
                    self.admin = admin.to_owned();
                } else if let Some(node) = line.strip_prefix("node: ") {
                    self.node = node.to_owned();
                    return Ok(Some(line));
                } else if line.starts_with("head: ") {
                    return Ok(Some(line));
                }
            }
            Ok::<_, std::io::Error>(None)
        })
        .await;
        let Ok(Ok(Some(_))) = printed else {
            return Err(FleetError::Head(format!(
                "the head printed no address within {START_TIMEOUT:?} (see {})",
                self.dir.join("head.log").display()
            )));
        };
        // Keep reading so that the head never blocks on a full pipe.
        xp_runtime::task::spawn("head-stdout", async move {
            while let Ok(Some(_)) = lines.next_line().await {}
        });
        if self.port == 0 {
            let join: xp_runtime::join::JoinString = self
                .node
                .parse()
                .map_err(|error| FleetError::Head(format!("a bad node credential: {error}")))?;
            self.port = join.port;
        }
        Ok(())
    }

    /// Reads the running head's CPU time and memory; its total CPU seconds so far.
    pub(super) fn sample(&mut self) -> f64 {
        let usage = self
            .child
            .as_ref()
            .and_then(Child::id)
            .and_then(xp_node::fleet::process_usage);
        let Some((cpu, rss)) = usage else {
            return self.past_cpu;
        };
        self.peak_rss = self.peak_rss.max(rss);
        self.past_cpu + cpu
    }

    /// Kills the head with SIGKILL, then starts it again on the same port and
    /// data directory.
    pub(super) async fn kill_and_restart(&mut self) -> Result<(), FleetError> {
        self.past_cpu = self.sample();
        self.stop().await;
        self.launch().await
    }

    /// Kills the head.
    pub(super) async fn stop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill().await;
        }
    }
}

/// A loopback TCP port free a moment ago.
fn free_tcp_port() -> Result<SocketAddr, FleetError> {
    let listener = std::net::TcpListener::bind("127.0.0.1:0")?;
    Ok(listener.local_addr()?)
}
