//! The xp head: global placement, the experiment registry, node membership and
//! the client APIs.
//!
//! [`start`] runs a whole head inside the current tokio runtime; the `xp-head`
//! binary and the embedded local cluster both use it. The head never touches GPUs
//! or trial processes: it decides and records, nodes execute.

mod actor;
mod blobs;
mod health;
mod http;
mod leader;
mod metrics;
mod offline;
mod registry;
mod server;
mod sessions;
mod start;
#[doc(hidden)]
pub mod test_postgres;
mod turns;
mod users;
mod webhooks;

use std::net::SocketAddr;
use std::path::PathBuf;

use ractor::ActorRef;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use tracing::info;
use xp_runtime::join::JoinString;

use crate::actor::HeadMsg;

pub use crate::offline::{OfflineError, OfflineHead, offline_status};
pub use crate::registry::{
    CopyError, PostgresTarget, RegistryError, StoreSpec, TableDigest, copy_store,
};
pub use crate::start::start;
pub use crate::users::local::{LocalUserError, node_credential, run as run_user_command};
pub use crate::users::socket::SocketError;
pub use xp_head_core::CoreConfig;
pub use xp_head_core::auth::Role;
pub use xp_head_core::auth::users::{UserAnswer, UserCommand};

/// How to run a head.
#[derive(Debug, Clone)]
pub struct HeadConfig {
    /// The UDP address to listen on; port 0 picks one.
    pub listen: SocketAddr,
    /// Where the database, trust material and blobs live.
    pub data_dir: PathBuf,
    /// The HTTP address, if the HTTP API is wanted.
    pub http: Option<SocketAddr>,
    /// The host put in the join string; the listen address when absent.
    pub advertise_host: Option<String>,
    /// Core tunables.
    pub core: CoreConfig,
    /// A scheduling policy to apply at start: its YAML text and where it came from.
    /// Without one the head keeps the policy it last applied (or the default).
    pub policy: Option<(String, String)>,
    /// The most changes one commit of the head's database holds
    /// ([`DEFAULT_COMMIT_BATCH`]; 1 commits each change alone, for comparison).
    pub commit_batch: usize,
    /// Where the records are kept: a PostgreSQL database, or without one
    /// `head.redb` in the data directory (the default).
    pub store: Option<PostgresTarget>,
    /// The other heads sharing `store` (standbys), as (host, UDP port): the
    /// join strings this head prints name them too, so nodes and clients
    /// follow whichever leads.
    pub peers: Vec<(String, u16)>,
}

/// How many changes one group commit holds at most by default: enough that a
/// commit's fsync is shared by whatever arrives while the previous one runs.
pub const DEFAULT_COMMIT_BATCH: usize = 1024;

/// Why the head could not start.
#[derive(Debug, thiserror::Error)]
pub enum HeadError {
    /// Trust material could not be loaded or created.
    #[error(transparent)]
    Tls(#[from] xp_runtime::tls::TlsError),
    /// The database could not be opened.
    #[error(transparent)]
    Registry(#[from] RegistryError),
    /// The QUIC endpoint could not be set up.
    #[error(transparent)]
    Transport(#[from] xp_runtime::transport::TransportError),
    /// A directory or socket could not be used.
    #[error("{context}: {source}")]
    Io {
        /// What was being done.
        context: String,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// The head actor could not start.
    #[error("head actor failed to start: {0}")]
    Actor(String),
    /// The head machine's user socket could not be set up.
    #[error(transparent)]
    Socket(#[from] SocketError),
    /// The first admin could not be created.
    #[error("cannot create the first admin: {0}")]
    FirstAdmin(#[from] xp_head_core::auth::users::UserError),
    /// The cluster's trust material could not be shared through the store.
    #[error("cannot share the cluster identity through {store}: {reason}")]
    SharedIdentity {
        /// The store, as shown.
        store: String,
        /// Why.
        reason: String,
    },
    /// The policy given at start is invalid.
    #[error("the scheduling policy {source_name} is invalid: {message}")]
    Policy {
        /// Where it came from.
        source_name: String,
        /// What is wrong with it.
        message: String,
    },
}

/// A running head.
pub struct RunningHead {
    /// The node credential: the join string nodes use.
    pub join: JoinString,
    /// Whether this is the first start on its data directory: the only one
    /// that prints the node credential (`xp-head node-credential` shows it
    /// again).
    pub first_start: bool,
    /// The first admin's credential, when this start created it (a new data
    /// directory, or one from a version without users); only its hash is kept,
    /// so later starts cannot show it again.
    pub admin: Option<JoinString>,
    /// The bound HTTP address, if any.
    pub http_addr: Option<SocketAddr>,
    shutdown: CancellationToken,
    /// Set when this head stopped leading its store (standby heads) and stepped down.
    stepped_down: std::sync::Arc<std::sync::atomic::AtomicBool>,
    actor: ActorRef<HeadMsg>,
    actor_task: JoinHandle<()>,
    tasks: Vec<JoinHandle<()>>,
}

impl RunningHead {
    /// Runs a command on the user table, as `xp-head user` does on the head
    /// machine (the embedded local cluster makes its own credential with it).
    pub async fn user_command(
        &self,
        command: UserCommand,
    ) -> Result<UserAnswer, xp_runtime::protocol::RemoteError> {
        actor::call(&self.actor, |reply| HeadMsg::Users(command, reply)).await
    }

    /// Waits until the head stops serving by itself: a head on a shared store
    /// that lost its lead steps down. Whether it stepped down.
    pub async fn stopped(&self) -> bool {
        self.shutdown.cancelled().await;
        self.stepped_down.load(std::sync::atomic::Ordering::SeqCst)
    }

    /// Stops serving, lets in-flight work finish, and stops the actor; every
    /// acknowledged change is already on disk.
    pub async fn shutdown(self) {
        self.shutdown.cancel();
        for task in self.tasks {
            let _ = task.await;
        }
        self.actor.stop(Some("shutdown".to_owned()));
        let _ = self.actor_task.await;
        info!("head stopped");
    }
}
