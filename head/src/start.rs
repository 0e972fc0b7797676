//! Starting a head: the data directory made private, the record restored
//! into the core, the QUIC endpoint and its join string, the user table (with
//! the first admin on a first start), then the actor and the tasks that serve
//! around it (QUIC, webhooks, the user socket, HTTP).

use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::AtomicU64;

use ractor::{Actor, ActorRef};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use tracing::info;
use xp_head_core::HeadCore;
use xp_head_core::auth::users::Users;
use xp_runtime::clock::{Clock, SystemClock};
use xp_runtime::join::JoinString;
use xp_runtime::tls::ClusterIdentity;

use crate::actor::{self, HeadActor, HeadArgs, HeadMsg};
use crate::registry::{Registry, StoreSpec};
use crate::server::ServerContext;
use crate::{
    HeadConfig, HeadError, PostgresTarget, Role, RunningHead, UserCommand, blobs, health, http,
    metrics, server, turns, users, webhooks,
};

/// Starts a head in the current runtime.
///
/// The runtime must be multi-threaded: the actor commits to disk with `block_in_place`.
pub async fn start(config: HeadConfig) -> Result<RunningHead, HeadError> {
    require_multi_thread()?;
    let (identity, mut registry) = open_data_dir(&config.data_dir, config.store.as_ref())?;
    let leadership = take_the_lead(&config, &mut registry).await?;
    let clock: Arc<dyn Clock> = Arc::new(SystemClock);
    let core = restore_core(&config, &identity, &mut registry, clock.as_ref())?;
    let endpoint = xp_runtime::transport::bind_endpoint(
        config.listen,
        Some(xp_runtime::transport::server_config(&identity)?),
    )?;
    let bound = endpoint
        .local_addr()
        .map_err(io_error("cannot read the bound address"))?;
    let (join, first_start) = node_join(&config, &identity, bound)?;
    let (users, admin) = load_users(&mut registry, &join, clock.now())?;
    let (shells, published) = Shells::new(core.last_event_seq());
    let (actor, actor_task) = Actor::spawn(
        Some("head".to_owned()),
        HeadActor,
        HeadArgs {
            core,
            registry,
            sessions: shells.context.sessions.clone(),
            event_seq: published.event_seq,
            health: published.health,
            clock,
            users,
            users_changed: published.users_changed,
            join: join.clone(),
            metrics: shells.metrics.clone(),
            commit_batch: config.commit_batch.max(1),
            webhooks: shells.webhook_queue.clone(),
            pulse: shells.pulse.clone(),
        },
    )
    .await
    .map_err(|error| HeadError::Actor(error.to_string()))?;
    let shutdown = CancellationToken::new();
    let stepped_down = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let context = Arc::new(
        shells
            .context
            .finish(&config, identity, &actor, &shutdown)?,
    );
    let mut tasks = serve(
        endpoint,
        context.clone(),
        &config,
        &actor,
        &shells,
        &shutdown,
    )?;
    let http_addr = match config.http {
        Some(http) => {
            let (addr, task) = serve_http(http, &actor, &shells, &context, &shutdown).await?;
            tasks.push(task);
            Some(addr)
        }
        None => None,
    };
    tasks.extend(leadership.map(|lead| {
        xp_runtime::task::spawn(
            "leader-lease",
            lead.keep(shutdown.clone(), stepped_down.clone()),
        )
    }));
    info!(listen = %bound, http = ?http_addr, "head started");
    Ok(RunningHead {
        join,
        first_start,
        admin,
        http_addr,
        shutdown,
        stepped_down,
        actor,
        actor_task,
        tasks,
    })
}

/// The data directory's trust material, made private to this user first, and
/// the registry: in `store`, or in the data directory's database without one.
fn open_data_dir(
    data_dir: &Path,
    store: Option<&PostgresTarget>,
) -> Result<(ClusterIdentity, Registry), HeadError> {
    make_private(data_dir, true)?;
    let tls = data_dir.join("tls");
    let spec = match store {
        Some(target) => {
            info!(store = %target, "keeping the registry in PostgreSQL");
            StoreSpec::Postgres(Box::new(target.clone()))
        }
        None => StoreSpec::Redb(data_dir.join("head.redb")),
    };
    // Opening the store first creates or migrates its schema.
    let registry = Registry::open_store(&spec)?;
    if let Some(target) = store {
        // Heads sharing a store share one identity: the store's, or this one's if first.
        crate::leader::share_identity(target, &tls, || {
            ClusterIdentity::load_or_create(&tls)
                .map(drop)
                .map_err(|error| error.to_string())
        })
        .map_err(|reason| HeadError::SharedIdentity {
            store: target.to_string(),
            reason,
        })?;
    }
    let identity = ClusterIdentity::load_or_create(&tls)?;
    make_data_private(data_dir)?;
    Ok((identity, registry))
}

/// The head needs a multi-threaded runtime: the actor commits with `block_in_place`.
fn require_multi_thread() -> Result<(), HeadError> {
    if tokio::runtime::Handle::current().runtime_flavor()
        == tokio::runtime::RuntimeFlavor::CurrentThread
    {
        return Err(HeadError::Actor(
            "the head needs a multi-threaded tokio runtime".to_owned(),
        ));
    }
    Ok(())
}

/// With a PostgreSQL store, waits until this head leads it (a standby waits for
/// the leader's lease to run out, following the store meanwhile), then fences
/// the registry's writes with its epoch; without one, there is no lead to take.
async fn take_the_lead(
    config: &HeadConfig,
    registry: &mut Registry,
) -> Result<Option<crate::leader::Leadership>, HeadError> {
    let Some(target) = &config.store else {
        return Ok(None);
    };
    let host = config
        .advertise_host
        .clone()
        .unwrap_or_else(|| config.listen.ip().to_string());
    let address = format!("{host}:{}", config.listen.port());
    let leadership = crate::leader::lead_warm(target, &address, registry).await;
    // A standby's connection may have outlived its database (a restart while
    // it waited): the lead's first reads go over a fresh one.
    registry.reconnect()?;
    registry.fence(leadership.epoch, &leadership.holder);
    Ok(Some(leadership))
}

/// The stored user table, and on a first start (no user yet) the first
/// admin's credential, to be shown once.
fn load_users(
    registry: &mut Registry,
    join: &JoinString,
    now: u64,
) -> Result<(Users, Option<JoinString>), HeadError> {
    let mut users = Users::from_records(registry.users()?);
    let admin = if users.is_empty() {
        Some(create_first_admin(registry, &mut users, join, now)?)
    } else {
        None
    };
    Ok((users, admin))
}

/// The core over what the registry holds, with the policy given at start in
/// force and the stopping rules fed the stored metric history; its restart
/// grace starts now.
fn restore_core(
    config: &HeadConfig,
    identity: &ClusterIdentity,
    registry: &mut Registry,
    clock: &dyn Clock,
) -> Result<HeadCore, HeadError> {
    // Collective tokens are keyed by a secret derived from the cluster token:
    // unguessable to outsiders, and stable across restarts of the head.
    let mut core_config = config.core;
    core_config.rendezvous_key =
        blake3::derive_key("xp rendezvous key v1", identity.token.as_bytes());
    // Object capabilities are signed with a key nodes derive from the same token.
    core_config.object_key = xp_runtime::protocol::CapabilityKey::derive(&identity.token);
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
    actor::replay_metrics(&mut core, registry)?;
    core.begin_restart_grace(clock.now());
    Ok(core)
}

/// The node join string of the bound endpoint, also written to the data
/// directory (0600, like the token it holds) for `xp-head user add` while
/// the head is stopped and for `xp-head node-credential`; and whether this is
/// the first start on the data directory (no join string was written before),
/// the only one that prints it.
fn node_join(
    config: &HeadConfig,
    identity: &ClusterIdentity,
    bound: SocketAddr,
) -> Result<(JoinString, bool), HeadError> {
    let join = JoinString {
        host: config
            .advertise_host
            .clone()
            .unwrap_or_else(|| bound.ip().to_string()),
        port: bound.port(),
        token: identity.token.clone(),
        ca_sha256: identity.ca_sha256(),
        more_heads: config.peers.clone(),
    };
    let path = config.data_dir.join(users::local::NODE_JOIN_FILE);
    let first_start = std::fs::symlink_metadata(&path).is_err();
    xp_runtime::tls::write_private_file(&path, format!("{join}\n").as_bytes())?;
    Ok((join, first_start))
}

/// What the actor publishes to the servers around it.
struct Published {
    event_seq: tokio::sync::watch::Sender<u64>,
    health: tokio::sync::watch::Sender<health::Health>,
    users_changed: tokio::sync::watch::Sender<u64>,
}

/// What the servers around the actor share, made before the actor.
struct Shells {
    health_rx: tokio::sync::watch::Receiver<health::Health>,
    /// When the actor last handled its tick, for `/healthz`.
    pulse: health::ActorPulse,
    /// The one registry of the head's counters.
    metrics: Arc<metrics::HeadMetrics>,
    /// Alert webhooks: queued by the actor once stored, posted by their own task.
    webhook_queue: Arc<webhooks::WebhookQueue>,
    context: ContextParts,
}

/// The QUIC server's context before the actor exists.
struct ContextParts {
    sessions: crate::sessions::Sessions,
    event_seq: tokio::sync::watch::Receiver<u64>,
    users_changed: tokio::sync::watch::Receiver<u64>,
    metrics: Arc<metrics::HeadMetrics>,
    /// Every user's turns, shared by the QUIC server and the HTTP API.
    turns: Arc<turns::Turns>,
}

impl Shells {
    fn new(last_event_seq: u64) -> (Self, Published) {
        let (event_seq, event_seq_rx) = tokio::sync::watch::channel(last_event_seq);
        let (health, health_rx) = tokio::sync::watch::channel(health::Health::Healthy);
        let (users_changed, users_changed_rx) = tokio::sync::watch::channel(0u64);
        let metrics = Arc::new(metrics::HeadMetrics::new());
        let shells = Self {
            health_rx,
            pulse: health::ActorPulse::new(),
            metrics: metrics.clone(),
            webhook_queue: Arc::new(webhooks::WebhookQueue::new(webhooks::QUEUE_CAPACITY)),
            context: ContextParts {
                sessions: Arc::new(dashmap::DashMap::new()),
                event_seq: event_seq_rx,
                users_changed: users_changed_rx,
                metrics,
                turns: Arc::new(turns::Turns::standard()),
            },
        };
        let published = Published {
            event_seq,
            health,
            users_changed,
        };
        (shells, published)
    }
}

impl ContextParts {
    /// The QUIC server's context, around `actor`.
    fn finish(
        &self,
        config: &HeadConfig,
        identity: ClusterIdentity,
        actor: &ActorRef<HeadMsg>,
        shutdown: &CancellationToken,
    ) -> Result<ServerContext, HeadError> {
        Ok(ServerContext {
            identity,
            head: actor.clone(),
            sessions: self.sessions.clone(),
            blobs: blobs::BlobStore::open(&config.data_dir.join("blobs"))
                .map_err(io_error("cannot create the blob directory"))?,
            event_seq: self.event_seq.clone(),
            users_changed: self.users_changed.clone(),
            counter: AtomicU64::new(1),
            shutdown: shutdown.clone(),
            metrics: self.metrics.clone(),
            commit_batch: config.commit_batch.max(1),
            turns: self.turns.clone(),
        })
    }
}

/// The tasks that serve around the actor: QUIC, webhook delivery and the
/// head machine's user socket.
fn serve(
    endpoint: quinn::Endpoint,
    context: Arc<ServerContext>,
    config: &HeadConfig,
    actor: &ActorRef<HeadMsg>,
    shells: &Shells,
    shutdown: &CancellationToken,
) -> Result<Vec<JoinHandle<()>>, HeadError> {
    let socket_path = users::socket::socket_path(&config.data_dir);
    let listener = users::socket::bind(&socket_path)?;
    Ok(vec![
        xp_runtime::task::spawn(
            "blob-collector",
            blobs::collector(context.blobs.clone(), actor.clone(), shutdown.clone()),
        ),
        xp_runtime::task::spawn("quic-server", server::serve(endpoint, context)),
        xp_runtime::task::spawn(
            "alert-webhooks",
            webhooks::run(
                shells.webhook_queue.clone(),
                delivery_outcomes(actor.clone()),
                shells.metrics.clone(),
                shutdown.clone(),
            ),
        ),
        xp_runtime::task::spawn(
            "user-socket",
            users::socket::serve(listener, socket_path, actor.clone(), shutdown.clone()),
        ),
    ])
}

/// The HTTP API and dashboard on `http`: its bound address and its task.
async fn serve_http(
    http: SocketAddr,
    actor: &ActorRef<HeadMsg>,
    shells: &Shells,
    context: &ServerContext,
    shutdown: &CancellationToken,
) -> Result<(SocketAddr, JoinHandle<()>), HeadError> {
    let listener = tokio::net::TcpListener::bind(http)
        .await
        .map_err(io_error(&format!("cannot bind HTTP on {http}")))?;
    let bound = listener
        .local_addr()
        .map_err(io_error("cannot read the HTTP address"))?;
    let router = http::router(http::HttpShared {
        head: actor.clone(),
        health: shells.health_rx.clone(),
        pulse: shells.pulse.clone(),
        metrics: shells.metrics.clone(),
        sessions: context.sessions.clone(),
        turns: context.turns.clone(),
    });
    let task = xp_runtime::task::spawn(
        "http-server",
        http::serve::serve(
            listener,
            router,
            shutdown.clone(),
            http::serve::ConnectionLimits::STANDARD,
        ),
    );
    Ok((bound, task))
}

/// A failed I/O step of the start, in words.
fn io_error(context: &str) -> impl FnOnce(std::io::Error) -> HeadError + '_ {
    move |source| HeadError::Io {
        context: context.to_owned(),
        source,
    }
}

/// Hands each webhook delivery's outcome to the actor, which stores it.
fn delivery_outcomes(actor: ActorRef<HeadMsg>) -> webhooks::Outcomes {
    Arc::new(move |alert, outcome| {
        let _ = actor.cast(HeadMsg::Alert(actor::AlertMsg::Delivered(alert, outcome)));
    })
}

/// Creates the first cluster admin (user `admin`, team `admin`) in an empty
/// user table and returns their credential, to be shown once.
fn create_first_admin(
    registry: &mut Registry,
    users: &mut Users,
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
fn make_private(path: &Path, is_dir: bool) -> Result<(), HeadError> {
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
fn make_data_private(data_dir: &Path) -> Result<(), HeadError> {
    let tls = data_dir.join("tls");
    make_private(&tls, true)?;
    for name in ClusterIdentity::FILES {
        make_private(&tls.join(name), false)?;
    }
    make_private(&data_dir.join("head.redb"), false)?;
    make_private(&data_dir.join("blobs"), true)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{CoreConfig, DEFAULT_COMMIT_BATCH, UserAnswer};

    fn config(data_dir: &Path) -> HeadConfig {
        HeadConfig {
            listen: "127.0.0.1:0".parse().unwrap(),
            data_dir: data_dir.to_owned(),
            http: None,
            advertise_host: None,
            core: CoreConfig::default(),
            policy: None,
            commit_batch: DEFAULT_COMMIT_BATCH,
            store: None,
            peers: Vec::new(),
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
