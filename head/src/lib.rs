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
mod metrics;
mod offline;
mod registry;
mod server;
mod sessions;
mod users;
mod webhooks;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::AtomicU64;

use ractor::{Actor, ActorRef};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use tracing::info;
use xp_runtime::clock::{Clock, SystemClock};
use xp_runtime::join::JoinString;
use xp_runtime::tls::ClusterIdentity;

use crate::actor::{HeadActor, HeadArgs, HeadMsg};
use crate::registry::Registry;
use crate::server::ServerContext;
use xp_head_core::HeadCore;

pub use crate::offline::{OfflineError, OfflineHead, offline_status};
pub use crate::registry::RegistryError;
pub use crate::users::local::{LocalUserError, run as run_user_command};
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
    /// The policy given at start is invalid.
    #[error("the scheduling policy {source_name} is invalid: {message}")]
    Policy {
        /// Where it came from.
        source_name: String,
        /// What is wrong with it.
        message: String,
    },
}

/// Hands each webhook delivery's outcome to the actor, which stores it.
fn delivery_outcomes(actor: ActorRef<HeadMsg>) -> webhooks::Outcomes {
    Arc::new(move |alert, outcome| {
        let _ = actor.cast(HeadMsg::Alert(actor::AlertMsg::Delivered(alert, outcome)));
    })
}

/// A running head.
pub struct RunningHead {
    /// The node credential: the join string nodes use.
    pub join: JoinString,
    /// The first admin's credential, when this start created it (a new data
    /// directory, or one from a version without users); only its hash is kept,
    /// so later starts cannot show it again.
    pub admin: Option<JoinString>,
    /// The bound HTTP address, if any.
    pub http_addr: Option<SocketAddr>,
    shutdown: CancellationToken,
    actor: ActorRef<HeadMsg>,
    actor_task: JoinHandle<()>,
    tasks: Vec<JoinHandle<()>>,
}

/// Starts a head in the current runtime.
///
/// The runtime must be multi-threaded: the actor commits to disk with `block_in_place`.
pub async fn start(config: HeadConfig) -> Result<RunningHead, HeadError> {
    if tokio::runtime::Handle::current().runtime_flavor()
        == tokio::runtime::RuntimeFlavor::CurrentThread
    {
        return Err(HeadError::Actor(
            "the head needs a multi-threaded tokio runtime".to_owned(),
        ));
    }
    let io_error = |context: String| move |source| HeadError::Io { context, source };
    make_private(&config.data_dir, true)?;
    let identity = ClusterIdentity::load_or_create(&config.data_dir.join("tls"))?;
    let mut registry = Registry::open(&config.data_dir.join("head.redb"))?;
    make_data_private(&config.data_dir)?;
    // Collective tokens are keyed by a secret derived from the cluster token:
    // unguessable to outsiders, and stable across restarts of the head.
    let mut core_config = config.core;
    core_config.rendezvous_key =
        blake3::derive_key("xp rendezvous key v1", identity.token.as_bytes());
    let clock: Arc<dyn Clock> = Arc::new(SystemClock);
    let loaded = registry.load()?;
    info!(
        experiments = loaded.experiments.len(),
        trials = loaded.trials.len(),
        nodes = loaded.nodes.len(),
        "registry loaded"
    );
    let mut core = HeadCore::restore(core_config, loaded, clock.now());
    if let Some((yaml, source_name)) = config.policy.clone() {
        let request = xp_runtime::protocol::AdminRequest {
            action: xp_runtime::protocol::AdminAction::ApplyPolicy { yaml },
            who: "xp-head --policy".to_owned(),
            why: format!("given at start: {source_name}"),
        };
        core.handle_admin(clock.now(), request)
            .map_err(|error| HeadError::Policy {
                source_name,
                message: error.to_string(),
            })?;
    }
    // Early-stopping rules are rebuilt from the metric history of unfinished experiments.
    actor::replay_metrics(&mut core, &registry)?;
    core.begin_restart_grace(clock.now());
    let endpoint = xp_runtime::transport::bind_endpoint(
        config.listen,
        Some(xp_runtime::transport::server_config(&identity)?),
    )?;
    let bound = endpoint
        .local_addr()
        .map_err(io_error("cannot read the bound address".to_owned()))?;
    let join = JoinString {
        host: config
            .advertise_host
            .clone()
            .unwrap_or_else(|| bound.ip().to_string()),
        port: bound.port(),
        token: identity.token.clone(),
        ca_sha256: identity.ca_sha256(),
    };
    // The node join string, for `xp-head user add` while the head is stopped
    // (its address) and for the operator (0600, like the token it holds).
    xp_runtime::tls::write_private_file(
        &config.data_dir.join(users::local::NODE_JOIN_FILE),
        format!("{join}\n").as_bytes(),
    )?;
    let mut users = xp_head_core::auth::users::Users::from_records(registry.users()?);
    let admin = if users.is_empty() {
        Some(create_first_admin(
            &mut registry,
            &mut users,
            &join,
            clock.now(),
        )?)
    } else {
        None
    };
    let (event_seq_tx, event_seq_rx) = tokio::sync::watch::channel(core.last_event_seq());
    let (health_tx, health_rx) = tokio::sync::watch::channel(health::Health::Healthy);
    let (users_changed_tx, users_changed_rx) = tokio::sync::watch::channel(0u64);
    let sessions = Arc::new(dashmap::DashMap::new());
    // The one registry of the head's counters, shared with the servers.
    let metrics = Arc::new(metrics::HeadMetrics::new());
    // Alert webhooks: queued by the actor once stored, posted by their own task.
    let webhook_queue = Arc::new(webhooks::WebhookQueue::new(webhooks::QUEUE_CAPACITY));
    let (actor, actor_task) = Actor::spawn(
        Some("head".to_owned()),
        HeadActor,
        HeadArgs {
            core,
            registry,
            sessions: sessions.clone(),
            event_seq: event_seq_tx,
            health: health_tx,
            clock,
            users,
            users_changed: users_changed_tx,
            join: join.clone(),
            metrics: metrics.clone(),
            commit_batch: config.commit_batch.max(1),
            webhooks: webhook_queue.clone(),
        },
    )
    .await
    .map_err(|error| HeadError::Actor(error.to_string()))?;

    let shutdown = CancellationToken::new();
    let context = Arc::new(ServerContext {
        identity,
        head: actor.clone(),
        sessions,
        blobs: blobs::BlobStore::open(&config.data_dir.join("blobs"))
            .map_err(io_error("cannot create the blob directory".to_owned()))?,
        event_seq: event_seq_rx,
        users_changed: users_changed_rx,
        counter: AtomicU64::new(1),
        shutdown: shutdown.clone(),
        metrics: metrics.clone(),
        commit_batch: config.commit_batch.max(1),
    });
    let socket_path = users::socket::socket_path(&config.data_dir);
    let listener = users::socket::bind(&socket_path)?;
    let mut tasks = vec![
        xp_runtime::task::spawn("quic-server", server::serve(endpoint, context.clone())),
        xp_runtime::task::spawn(
            "alert-webhooks",
            webhooks::run(
                webhook_queue,
                delivery_outcomes(actor.clone()),
                metrics.clone(),
                shutdown.clone(),
            ),
        ),
        xp_runtime::task::spawn(
            "user-socket",
            users::socket::serve(listener, socket_path, actor.clone(), shutdown.clone()),
        ),
    ];
    let mut http_addr = None;
    if let Some(http) = config.http {
        let listener = tokio::net::TcpListener::bind(http)
            .await
            .map_err(io_error(format!("cannot bind HTTP on {http}")))?;
        http_addr = Some(
            listener
                .local_addr()
                .map_err(io_error("cannot read the HTTP address".to_owned()))?,
        );
        let router = http::router(actor.clone(), health_rx, metrics, context.sessions.clone());
        let http_shutdown = shutdown.clone();
        tasks.push(xp_runtime::task::spawn("http-server", async move {
            let served = axum::serve(listener, router)
                .with_graceful_shutdown(http_shutdown.cancelled_owned())
                .await;
            if let Err(error) = served {
                tracing::error!(%error, "HTTP server failed");
            }
        }));
    }
    info!(listen = %bound, http = ?http_addr, "head started");
    Ok(RunningHead {
        join,
        admin,
        http_addr,
        shutdown,
        actor,
        actor_task,
        tasks,
    })
}

/// Creates the first cluster admin (user `admin`, team `admin`) in an empty
/// user table and returns their credential, to be shown once.
fn create_first_admin(
    registry: &mut Registry,
    users: &mut xp_head_core::auth::users::Users,
    join: &JoinString,
    now: u64,
) -> Result<JoinString, HeadError> {
    let command = UserCommand::Add {
        name: xp_head_core::auth::users::FIRST_ADMIN.to_owned(),
        team: xp_head_core::auth::users::FIRST_ADMIN_TEAM.to_owned(),
        role: Role::Admin,
        replace: false,
    };
    let plan = users.plan(now, &command, actor::fresh_secret)?;
    let mut records: Vec<xp_head_core::Record> = plan
        .records
        .iter()
        .cloned()
        .map(xp_head_core::Record::User)
        .collect();
    records.push(xp_head_core::Record::Audit(command.audit_entry(now)));
    registry.commit(records)?;
    users.apply(plan.records);
    info!(
        user = xp_head_core::auth::users::FIRST_ADMIN,
        "first admin created; its credential is printed once"
    );
    let xp_head_core::auth::users::PlannedAnswer::Added(_, secret) = plan.answer else {
        unreachable!("an add answers with the secret");
    };
    Ok(JoinString {
        token: secret.0,
        ..join.clone()
    })
}

/// Makes `path` private to this user: a directory 0700 (created if missing), a
/// file 0600; warns when an existing one was open to others.
fn make_private(path: &std::path::Path, is_dir: bool) -> Result<(), HeadError> {
    let tightened = if is_dir {
        xp_runtime::tls::create_private_dir(path)
    } else {
        xp_runtime::tls::make_file_private(path)
    };
    let tightened = tightened.map_err(|source| HeadError::Io {
        context: format!("cannot make {} private", path.display()),
        source,
    })?;
    if let Some(mode) = tightened {
        tracing::warn!(path = %path.display(), mode = format!("{mode:o}"), "others could read this; made it private to this user");
    }
    Ok(())
}

/// Tightens what the data directory holds (the trust material, the database and
/// the blobs) to this user: a head started by an older version, or a copied
/// directory, may have left them readable by others.
fn make_data_private(data_dir: &std::path::Path) -> Result<(), HeadError> {
    let tls = data_dir.join("tls");
    make_private(&tls, true)?;
    for name in ClusterIdentity::FILES {
        make_private(&tls.join(name), false)?;
    }
    make_private(&data_dir.join("head.redb"), false)?;
    make_private(&data_dir.join("blobs"), true)
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

#[cfg(test)]
mod tests {
    use super::*;

    fn config(data_dir: &std::path::Path) -> HeadConfig {
        HeadConfig {
            listen: "127.0.0.1:0".parse().unwrap(),
            data_dir: data_dir.to_owned(),
            http: None,
            advertise_host: None,
            core: CoreConfig::default(),
            policy: None,
            commit_batch: DEFAULT_COMMIT_BATCH,
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_data_directory_without_users_gets_one_admin_shown_once() {
        let dir = tempfile::tempdir().unwrap();
        let data_dir = dir.path().join("head");
        // A database from a version without users: records, no user table rows.
        xp_runtime::tls::create_private_dir(&data_dir).unwrap();
        let mut old = Registry::open(&data_dir.join("head.redb")).unwrap();
        old.load().unwrap();
        let event = xp_runtime::protocol::TrialEvent {
            seq: 1,
            at: 1,
            trial: xp_runtime::ids::TrialId {
                experiment: xp_runtime::ids::ExperimentId { digest: 7, run: 1 },
                index: 0,
            },
            state: xp_runtime::protocol::TrialState::Running,
            attempt: 1,
            reason: "from an older head".to_owned(),
        };
        old.commit(vec![xp_head_core::Record::Event(event)])
            .unwrap();
        drop(old);

        let head = start(config(&data_dir)).await.unwrap();
        let admin = head
            .admin
            .clone()
            .expect("the first start after the upgrade shows it");
        assert_ne!(admin.token, head.join.token);
        assert_eq!(
            (admin.host.as_str(), admin.port),
            (head.join.host.as_str(), head.join.port)
        );
        let listed = head.user_command(UserCommand::List).await.unwrap();
        let UserAnswer::List { users } = listed else {
            panic!("a list");
        };
        assert_eq!(users.len(), 1);
        assert_eq!(
            (users[0].name.as_str(), users[0].role),
            ("admin", Role::Admin)
        );
        head.shutdown().await;

        let again = start(config(&data_dir)).await.unwrap();
        assert!(
            again.admin.is_none(),
            "only its hash is kept: it is not shown again"
        );
        again.shutdown().await;
    }
}
