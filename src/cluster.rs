//! [`Cluster`]: a client of a remote head, or an embedded local cluster.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use xp_runtime::join::JoinString;
use xp_runtime::protocol::NodeState;
use xp_sdk::{Client, SdkError};

/// Why a cluster could not be reached or started.
#[derive(Debug, thiserror::Error)]
pub enum ClusterError {
    /// The head refused or could not be reached.
    #[error(transparent)]
    Sdk(#[from] SdkError),
    /// The embedded head could not start.
    #[error("cannot start the embedded head: {0}")]
    Head(#[from] xp_head::HeadError),
    /// The embedded head could not make the local user's credential.
    #[error("the embedded head cannot make a credential: {0}")]
    Credential(String),
    /// The embedded node never registered.
    #[error("the embedded node did not join within {0:?}")]
    NodeTimeout(Duration),
    /// A temporary directory could not be made.
    #[error("cannot create a data directory: {0}")]
    Io(#[from] std::io::Error),
}

/// How to shape an embedded local cluster.
#[derive(Debug, Clone, Default)]
pub struct LocalOptions {
    /// Where to keep state; a temporary directory removed at shutdown when absent.
    pub data_dir: Option<PathBuf>,
    /// GPU slots to declare; NVML decides when absent.
    pub gpus: Option<u32>,
    /// CPU cores the node offers; all when absent.
    pub cpus: Option<f64>,
    /// Where the head serves its HTTP API; none when absent.
    pub http: Option<SocketAddr>,
    /// The most changes one commit of the head's database holds; the head's
    /// default when absent (1: one commit per change, for comparison).
    pub commit_batch: Option<usize>,
    /// How often the node samples its workers' and GPUs' use; the node's
    /// default when absent, none when zero.
    pub telemetry_interval: Option<Duration>,
    /// Keep the head's records in this PostgreSQL database instead of the
    /// data directory.
    pub store: Option<xp_head::PostgresTarget>,
}

struct Embedded {
    head: xp_head::RunningHead,
    node_shutdown: CancellationToken,
    node_task: JoinHandle<Result<(), xp_node::NodeError>>,
    _temporary: Option<tempfile::TempDir>,
}

/// A connected cluster; dereferences to the SDK [`Client`].
pub struct Cluster {
    client: Client,
    join: JoinString,
    embedded: Option<Embedded>,
}

impl std::fmt::Debug for Cluster {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Cluster")
            .field("join", &self.join)
            .field("embedded", &self.embedded.is_some())
            .finish()
    }
}

impl std::ops::Deref for Cluster {
    type Target = Client;
    fn deref(&self) -> &Client {
        &self.client
    }
}

/// The user an embedded cluster's own process acts as.
const LOCAL_USER: &str = "local";

/// A fresh credential for [`LOCAL_USER`] (an admin of team `default`), replacing
/// the one a previous start of the same data directory made.
async fn local_credential(head: &xp_head::RunningHead) -> Result<JoinString, ClusterError> {
    use xp_head::{UserAnswer, UserCommand};
    let answer = head
        .user_command(UserCommand::Add {
            name: LOCAL_USER.to_owned(),
            team: xp_runtime::spec::DEFAULT_TEAM.to_owned(),
            role: xp_head::Role::Admin,
            replace: true,
        })
        .await
        .map_err(|error| ClusterError::Credential(error.message))?;
    match answer {
        UserAnswer::Added { credential, .. } => {
            credential
                .0
                .parse()
                .map_err(|error: xp_runtime::join::JoinStringError| {
                    ClusterError::Credential(error.to_string())
                })
        }
        other => Err(ClusterError::Credential(format!(
            "unexpected answer {other:?}"
        ))),
    }
}

impl Cluster {
    /// Connects to the head named by `join`.
    pub async fn connect(join: &str) -> Result<Self, ClusterError> {
        let join: JoinString = join.parse().map_err(SdkError::from)?;
        Self::connect_to(join).await
    }

    /// Connects to the head named by an already parsed credential (one read
    /// from a file, say).
    pub async fn connect_to(join: JoinString) -> Result<Self, ClusterError> {
        let client = Client::connect_to(&join).await?;
        Ok(Self {
            client,
            join,
            embedded: None,
        })
    }

    /// The cluster named by `XP_CLUSTER`, or an embedded local one when it is unset.
    pub async fn from_env() -> Result<Self, ClusterError> {
        match std::env::var("XP_CLUSTER") {
            Ok(join) if !join.is_empty() => Self::connect(&join).await,
            _ => Self::local().await,
        }
    }

    /// An embedded local cluster with default options.
    pub async fn local() -> Result<Self, ClusterError> {
        Self::local_with(LocalOptions::default()).await
    }

    /// An embedded head and node in this process, on loopback QUIC.
    pub async fn local_with(options: LocalOptions) -> Result<Self, ClusterError> {
        let (data_dir, temporary) = match options.data_dir {
            Some(dir) => (dir, None),
            None => {
                let temporary = tempfile::Builder::new().prefix("xp-local-").tempdir()?;
                (temporary.path().to_owned(), Some(temporary))
            }
        };
        let head = xp_head::start(xp_head::HeadConfig {
            listen: "127.0.0.1:0".parse().expect("a literal socket address"),
            data_dir: data_dir.join("head"),
            http: options.http,
            advertise_host: None,
            core: xp_head::CoreConfig::default(),
            policy: None,
            commit_batch: options
                .commit_batch
                .unwrap_or(xp_head::DEFAULT_COMMIT_BATCH),
            store: options.store,
            peers: Vec::new(),
        })
        .await?;
        // The node joins with the node credential; this process acts as user
        // `local`, an admin whose secret is drawn afresh on every start (only
        // its hash is kept), so a kept data directory needs no set-up either.
        let credential = local_credential(&head).await?;
        let node_shutdown = CancellationToken::new();
        let node_config = xp_node::NodeConfig {
            join: head.join.clone(),
            data_dir: data_dir.join("node"),
            gpus: options.gpus,
            cpus: options.cpus,
            memory_bytes: None,
            labels: Default::default(),
            advertise_host: None,
            object_limits: xp_node::StoreLimits::default(),
            object_port: 0,
            checkpoint_backup: None,
            log_cap: xp_node::LogCap::default(),
            // As `xp-node join`: ids of their own where the node is root and
            // can make its work directories reachable.
            worker_uids: xp_node::WorkerUids::Auto,
            output_limits: xp_node::OutputLimits::default(),
            telemetry_interval: options
                .telemetry_interval
                .unwrap_or(xp_node::DEFAULT_TELEMETRY_INTERVAL),
            granted_gpus: None,
            drain_timeout: xp_node::DEFAULT_DRAIN_TIMEOUT,
            // NVML where present; no stand-in memory file for a local cluster.
            gpu_memory_file: None,
        };
        let node_task = xp_runtime::task::spawn(
            "local-node",
            xp_node::run(node_config, node_shutdown.clone()),
        );
        let client = Client::connect_to(&credential).await?;
        let cluster = Self {
            client,
            join: credential,
            embedded: Some(Embedded {
                head,
                node_shutdown,
                node_task,
                _temporary: temporary,
            }),
        };
        cluster.wait_for_nodes(1, Duration::from_secs(20)).await?;
        Ok(cluster)
    }

    /// Waits until at least `count` nodes are ready.
    pub async fn wait_for_nodes(
        &self,
        count: usize,
        timeout: Duration,
    ) -> Result<(), ClusterError> {
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            let ready = self
                .client
                .nodes()
                .await?
                .iter()
                .filter(|node| node.state == NodeState::Ready)
                .count();
            if ready >= count {
                return Ok(());
            }
            if tokio::time::Instant::now() >= deadline {
                return Err(ClusterError::NodeTimeout(timeout));
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// The credential this cluster is reached with (for an embedded one, the
    /// local admin's, valid until it starts again).
    pub fn join_string(&self) -> &JoinString {
        &self.join
    }

    /// The HTTP address of an embedded head that serves one.
    pub fn http_addr(&self) -> Option<SocketAddr> {
        self.embedded
            .as_ref()
            .and_then(|embedded| embedded.head.http_addr)
    }

    /// Closes the connection and, for an embedded cluster, stops its node (and
    /// workers) and then its head.
    pub async fn shutdown(self) {
        self.client.close().await;
        if let Some(embedded) = self.embedded {
            embedded.node_shutdown.cancel();
            if let Ok(Err(error)) = embedded.node_task.await {
                tracing::warn!(%error, "embedded node stopped with an error");
            }
            embedded.head.shutdown().await;
        }
    }
}
