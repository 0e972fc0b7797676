//! Objects between nodes: the server that lends this node's objects to other
//! nodes, and the fetcher that pulls objects from them in parallel chunks.
//!
//! The wire is `xp_runtime::object_wire`. A fetched object is assembled in
//! memory, hashed, and stored only if it hashes to its id, so a corrupt or
//! malicious source can cost a retry but never a wrong object. A source whose
//! own copy fails its hash check deletes it (the store does) and says so, and
//! the server tells the agent, which tells the head's directory.
//!
//! Not here: knowing which node holds what (the head's directory does; callers
//! pass the sources), and the wire format and QUIC setup (`xp_runtime`).

use std::net::SocketAddr;
use std::sync::Arc;

use tokio::sync::mpsc;
use tracing::{debug, info, warn};
use xp_runtime::error_chain::error_chain;
use xp_runtime::ids::{ObjectId, TrialId};
use xp_runtime::object_wire::{
    self, FetchErrorCode, FetchHeader, MAX_CHUNK_BYTES, ObjectClient, ObjectOp, ObjectRequest,
    StoreAnswer,
};
use xp_runtime::protocol::{ObjectEndpoint, ObjectSource};
use xp_runtime::transport::QuicSetupError;

use super::{ObjectBytes, ObjectChange, ObjectStore, Owner, StoreError, off_runtime};

/// The largest object a driver may store in one request.
const MAX_STORE_BYTES: u64 = 4 << 30;
/// The most bytes handed to a QUIC stream in one write: quinn copies each write
/// into its own allocation, and small ones are recycled by the allocator instead
/// of being mapped and faulted in afresh (as in the collective's links).
const WRITE_BYTES: usize = 64 << 10;

/// Why an object could not be fetched.
#[derive(Debug, thiserror::Error)]
pub enum FetchError {
    /// No source is left to try; each tried source's failure is listed.
    #[error("object {id} could not be fetched from any of {} source(s): {}", .failures.len(), .failures.join("; "))]
    Exhausted {
        /// The object.
        id: ObjectId,
        /// One line per source tried.
        failures: Vec<String>,
    },
    /// The bytes arrived and checked out, but the local store refused them.
    #[error("object {id} fetched but not stored: {source}")]
    Store {
        /// The object.
        id: ObjectId,
        /// The store's reason (full disk, too large).
        #[source]
        source: StoreError,
    },
    /// The client endpoint could not be created.
    #[error("cannot open a QUIC endpoint for fetching: {0}")]
    Endpoint(String),
}

/// Why the object server could not start or say where it listens.
#[derive(Debug, thiserror::Error)]
pub enum ObjectServerError {
    /// The QUIC endpoint could not be bound or configured.
    #[error("cannot start the object server on {bind}")]
    Start {
        /// The address asked for.
        bind: SocketAddr,
        /// The cause.
        #[source]
        source: QuicSetupError,
    },
    /// The bound endpoint could not tell its address.
    #[error("object server address")]
    Address(#[source] std::io::Error),
}

/// Serves this node's objects to other nodes until the endpoint is closed.
pub struct ObjectServer {
    endpoint: quinn::Endpoint,
    cert_sha256: [u8; 32],
}

impl ObjectServer {
    /// Listens on `bind`; requests must carry `token_digest`. What the store gains
    /// (driver puts) or loses (releases, copies found corrupt while serving) is
    /// sent on `changes`.
    pub fn start(
        store: Arc<ObjectStore>,
        bind: SocketAddr,
        token_digest: [u8; 32],
        changes: mpsc::UnboundedSender<ObjectChange>,
    ) -> Result<Self, ObjectServerError> {
        let (endpoint, cert_sha256) = object_wire::server_endpoint(bind)
            .map_err(|source| ObjectServerError::Start { bind, source })?;
        let accepting = endpoint.clone();
        xp_runtime::task::spawn("object-server", async move {
            while let Some(incoming) = accepting.accept().await {
                let store = store.clone();
                let changes = changes.clone();
                xp_runtime::task::spawn("object-connection", async move {
                    match incoming.await {
                        Ok(connection) => {
                            serve_connection(connection, store, token_digest, changes).await;
                        }
                        Err(error) => debug!(%error, "object connection failed"),
                    }
                });
            }
        });
        Ok(Self {
            endpoint,
            cert_sha256,
        })
    }

    /// What the head tells fetching nodes.
    pub fn endpoint(&self) -> Result<ObjectEndpoint, ObjectServerError> {
        let port = self
            .endpoint
            .local_addr()
            .map_err(ObjectServerError::Address)?
            .port();
        Ok(ObjectEndpoint {
            port,
            cert_sha256: self.cert_sha256,
        })
    }

    /// Stops accepting and closes every connection.
    pub fn close(&self) {
        self.endpoint.close(0u32.into(), b"object server closed");
    }
}

/// The objects a connection served last, kept mapped (and so verified once)
/// while a fetcher pulls their remaining chunks. Held across a miss, so chunk
/// requests arriving together wait for one verification instead of each
/// hashing the whole object.
type Recent = Arc<tokio::sync::Mutex<Vec<(ObjectId, ObjectBytes, tokio::time::Instant)>>>;

/// How many objects a connection keeps mapped between chunk requests.
const RECENT_OBJECTS: usize = 4;
/// How long an object stays mapped after its last chunk was asked for: a kept
/// map also keeps a deleted object's disk space.
const RECENT_IDLE: std::time::Duration = std::time::Duration::from_secs(5);

async fn serve_connection(
    connection: quinn::Connection,
    store: Arc<ObjectStore>,
    token_digest: [u8; 32],
    changes: mpsc::UnboundedSender<ObjectChange>,
) {
    let recent: Recent = Arc::default();
    let mut prune = tokio::time::interval(RECENT_IDLE);
    loop {
        let accepted = tokio::select! {
            accepted = connection.accept_bi() => accepted,
            _ = prune.tick() => {
                let now = tokio::time::Instant::now();
                recent.lock().await.retain(|(_, _, used)| now.duration_since(*used) < RECENT_IDLE);
                continue;
            }
        };
        let Ok((send, recv)) = accepted else { break };
        let store = store.clone();
        let changes = changes.clone();
        let recent = recent.clone();
        xp_runtime::task::spawn("object-request", async move {
            if let Err(error) =
                serve_request(send, recv, store, token_digest, changes, recent).await
            {
                debug!(%error, "object request ended early");
            }
        });
    }
}

async fn lookup(
    store: &Arc<ObjectStore>,
    recent: &Recent,
    id: ObjectId,
) -> Result<ObjectBytes, StoreError> {
    let mut recent = recent.lock().await;
    let now = tokio::time::Instant::now();
    if let Some((_, bytes, used)) = recent.iter_mut().find(|(cached, _, _)| *cached == id) {
        *used = now;
        return Ok(bytes.clone());
    }
    // Served unverified: every fetcher hashes what it receives and reports a
    // mismatch (`Damaged`), which `verify` settles; hashing here as well would
    // hash every served object twice.
    let bytes = off_runtime(store, move |store| match store.get_unverified(id) {
        Err(StoreError::Missing { .. }) => store.verify(id),
        other => other,
    })
    .await?;
    if recent.len() >= RECENT_OBJECTS {
        recent.remove(0);
    }
    recent.push((id, bytes.clone(), now));
    Ok(bytes)
}

async fn serve_request(
    mut send: quinn::SendStream,
    mut recv: quinn::RecvStream,
    store: Arc<ObjectStore>,
    token_digest: [u8; 32],
    changes: mpsc::UnboundedSender<ObjectChange>,
    recent: Recent,
) -> Result<(), object_wire::WireError> {
    let request: ObjectRequest = match object_wire::read_small(&mut recv).await {
        Ok(request) => request,
        Err(error) => {
            warn!(%error, "malformed object request");
            let header = FetchHeader::Error {
                code: FetchErrorCode::Malformed,
                message: error.to_string(),
            };
            object_wire::write_small(&mut send, &header).await?;
            let _ = send.finish();
            return Ok(());
        }
    };
    // Compared as blake3 hashes, whose equality is constant-time, so the
    // answer's timing tells nothing of where a guessed token differs.
    if blake3::Hash::from_bytes(request.token) != blake3::Hash::from_bytes(token_digest) {
        warn!("object request with a wrong token refused");
        let (code, message) = (FetchErrorCode::BadToken, "wrong cluster token".to_owned());
        match request.op {
            ObjectOp::Fetch { .. } => {
                object_wire::write_small(&mut send, &FetchHeader::Error { code, message }).await?;
            }
            ObjectOp::Store { .. }
            | ObjectOp::Release { .. }
            | ObjectOp::Damaged { .. }
            | ObjectOp::Owners { .. } => {
                object_wire::write_small(&mut send, &StoreAnswer::Error { code, message }).await?;
            }
        }
        let _ = send.finish();
        return Ok(());
    }
    match request.op {
        ObjectOp::Fetch { id, offset, len } => {
            serve_fetch(&mut send, &store, &changes, &recent, id, offset, len).await?;
        }
        ObjectOp::Store { owner, size } => {
            let answer = receive_store(&mut recv, &store, &changes, owner, size).await;
            object_wire::write_small(&mut send, &answer).await?;
        }
        ObjectOp::Damaged { id } => {
            recent.lock().await.retain(|(cached, _, _)| *cached != id);
            let checked = off_runtime(&store, move |store| store.verify(id)).await;
            let damaged = matches!(
                checked,
                Err(StoreError::Corrupt { .. } | StoreError::Missing { .. })
            );
            if damaged {
                warn!(%id, "a fetcher found this node's copy damaged; deleted");
                let _ = changes.send(ObjectChange::Dropped(id));
            }
            object_wire::write_small(&mut send, &StoreAnswer::Released { existed: damaged })
                .await?;
        }
        ObjectOp::Release { owner, id } => {
            let released = off_runtime(&store, move |store| {
                let existed = store.remove_owner(id, &Owner::Driver(owner))?;
                Ok((existed, store.contains(id)))
            })
            .await;
            let answer = match released {
                Ok((existed, still_here)) => {
                    if !still_here {
                        let _ = changes.send(ObjectChange::Dropped(id));
                    }
                    StoreAnswer::Released { existed }
                }
                Err(error) => StoreAnswer::Error {
                    code: FetchErrorCode::Internal,
                    message: error.to_string(),
                },
            };
            object_wire::write_small(&mut send, &answer).await?;
        }
        ObjectOp::Owners { id } => {
            let answer = match store.info(id) {
                Some(info) => owners_answer(info.owners),
                None => StoreAnswer::Error {
                    code: FetchErrorCode::NotFound,
                    message: format!("object {id} is not on this node"),
                },
            };
            object_wire::write_small(&mut send, &answer).await?;
        }
    }
    let _ = send.finish();
    Ok(())
}

/// The wire form of an object's owners.
fn owners_answer(owners: Vec<Owner>) -> StoreAnswer {
    let (trials, drivers) = Owner::split(owners);
    StoreAnswer::Owners { trials, drivers }
}

/// The longest driver session name a store request may carry.
const MAX_OWNER_CHARS: usize = 128;

/// Reads `size` bytes a driver sends and stores them for its session.
async fn receive_store(
    recv: &mut quinn::RecvStream,
    store: &Arc<ObjectStore>,
    changes: &mpsc::UnboundedSender<ObjectChange>,
    owner: String,
    size: u64,
) -> StoreAnswer {
    let refuse = |code, message: String| StoreAnswer::Error { code, message };
    if owner.is_empty() || owner.len() > MAX_OWNER_CHARS {
        return refuse(
            FetchErrorCode::Malformed,
            format!("a driver session name must be 1 to {MAX_OWNER_CHARS} bytes"),
        );
    }
    let limit = store.limits().max_object_bytes.min(MAX_STORE_BYTES);
    if size > limit {
        return refuse(
            FetchErrorCode::Refused,
            format!("object of {size} bytes is over the {limit}-byte limit"),
        );
    }
    // Grown as bytes arrive, so an announced size costs nothing until it is sent.
    let mut bytes = Vec::with_capacity(size.min(64 << 20) as usize);
    while (bytes.len() as u64) < size {
        let wanted = (size - bytes.len() as u64).min(1 << 20) as usize;
        match recv.read_chunk(wanted, true).await {
            Ok(Some(chunk)) => bytes.extend_from_slice(&chunk.bytes),
            Ok(None) => {
                return refuse(
                    FetchErrorCode::Malformed,
                    format!("the object's bytes ended after {} of {size}", bytes.len()),
                );
            }
            Err(error) => {
                return refuse(
                    FetchErrorCode::Malformed,
                    format!("the object's bytes were cut short: {error}"),
                );
            }
        }
    }
    match off_runtime(store, move |store| store.put(bytes, Owner::Driver(owner))).await {
        Ok(id) => {
            let _ = changes.send(ObjectChange::Added(id));
            StoreAnswer::Stored { id }
        }
        Err(error @ StoreError::Task { .. }) => refuse(FetchErrorCode::Internal, error.to_string()),
        Err(error) => refuse(FetchErrorCode::Refused, error.to_string()),
    }
}

async fn serve_fetch(
    send: &mut quinn::SendStream,
    store: &Arc<ObjectStore>,
    changes: &mpsc::UnboundedSender<ObjectChange>,
    recent: &Recent,
    id: ObjectId,
    offset: u64,
    len: u64,
) -> Result<(), object_wire::WireError> {
    let refuse = |code, message: String| FetchHeader::Error { code, message };
    let bytes = match lookup(store, recent, id).await {
        Ok(bytes) => bytes,
        Err(error) => {
            let code = match error {
                StoreError::NotFound { .. } => {
                    // Whoever sent the fetcher here thinks this node has it.
                    let _ = changes.send(ObjectChange::Dropped(id));
                    FetchErrorCode::NotFound
                }
                StoreError::Corrupt { .. } | StoreError::Missing { .. } => {
                    let _ = changes.send(ObjectChange::Dropped(id));
                    FetchErrorCode::Corrupt
                }
                _ => FetchErrorCode::Internal,
            };
            return object_wire::write_small(send, &refuse(code, error.to_string())).await;
        }
    };
    let size = bytes.len() as u64;
    if len > MAX_CHUNK_BYTES || offset > size {
        let header = refuse(
            FetchErrorCode::BadRange,
            format!(
                "range {offset}+{len} is outside object of {size} bytes or over {MAX_CHUNK_BYTES}"
            ),
        );
        return object_wire::write_small(send, &header).await;
    }
    let end = offset.saturating_add(len).min(size);
    object_wire::write_small(
        send,
        &FetchHeader::Bytes {
            size,
            len: end - offset,
        },
    )
    .await?;
    // Handed to quinn as shared slices of the map or buffer, not copied into its
    // send buffer. Offsets fit in usize: the object is mapped or in memory.
    let mut range = bytes::Bytes::from_owner(bytes).slice(offset as usize..end as usize);
    while !range.is_empty() {
        let piece = range.split_to(WRITE_BYTES.min(range.len()));
        send.write_chunk(piece)
            .await
            .map_err(std::io::Error::from)?;
    }
    Ok(())
}

/// An object a node wants a good local copy of.
#[derive(Debug, Clone)]
pub struct Wanted {
    /// The object.
    pub id: ObjectId,
    /// Who keeps it alive here.
    pub owner: Owner,
    /// Whether to pin it (checkpoint data: deleted only on the head's order).
    pub pin: bool,
    /// Its size from the head's manifest, if known: every chunk is then asked
    /// for at once.
    pub size: Option<u64>,
}

/// Pulls objects from other nodes into this node's store.
pub struct ObjectFetcher {
    client: ObjectClient,
}

impl ObjectFetcher {
    /// A fetcher presenting `token_digest`.
    pub fn new(token_digest: [u8; 32]) -> Result<Self, FetchError> {
        let client = ObjectClient::new(token_digest)
            .map_err(|error| FetchError::Endpoint(error.to_string()))?;
        Ok(Self { client })
    }

    /// The owners of `id` as the first of `sources` (skipping `own_node`) that
    /// holds it reports them: its trials and its driver sessions.
    pub async fn owners(
        &self,
        id: ObjectId,
        sources: &[ObjectSource],
        own_node: Option<xp_runtime::ids::NodeId>,
    ) -> Result<(Vec<TrialId>, Vec<String>), FetchError> {
        let mut failures = Vec::new();
        for source in sources
            .iter()
            .filter(|source| Some(source.node) != own_node)
        {
            match self.client.owners(source, id).await {
                Ok(owners) => return Ok(owners),
                Err(error) => {
                    failures.push(format!("node {}: {}", source.node, error_chain(&error)))
                }
            }
        }
        Err(FetchError::Exhausted { id, failures })
    }

    /// Makes sure `store` holds a good copy of the wanted object, fetching it from
    /// the first of `sources` that has one (skipping `own_node`), adds its owner
    /// (and a pin), and returns its bytes, verified against its id.
    ///
    /// A local copy that fails its hash check is discarded by the store and
    /// fetched again.
    pub async fn ensure(
        &self,
        store: &Arc<ObjectStore>,
        wanted: Wanted,
        sources: &[ObjectSource],
        own_node: Option<xp_runtime::ids::NodeId>,
    ) -> Result<ObjectBytes, FetchError> {
        let Wanted {
            id,
            owner,
            pin,
            size: size_hint,
        } = wanted;
        // Read afresh: a map kept by the server would hide a file damaged in place.
        match off_runtime(store, move |store| store.verify(id)).await {
            Ok(bytes) => {
                keep(store, id, owner, pin).await?;
                return Ok(bytes);
            }
            Err(StoreError::NotFound { .. }) => {}
            Err(error) => warn!(%id, %error, "local copy unusable; fetching it again"),
        }
        let mut failures = Vec::new();
        for source in sources
            .iter()
            .filter(|source| Some(source.node) != own_node)
        {
            match self
                .client
                .fetch_from(source, id, size_hint, store.limits().max_object_bytes)
                .await
            {
                Ok(bytes) => {
                    let size = bytes.len();
                    let kept = bytes.clone();
                    let claim = owner.clone();
                    let stored = off_runtime(store, move |store| {
                        // Pinned copies (checkpoint replicas) must outlive this process.
                        if pin {
                            store.put_expecting_on_disk(id, &bytes, claim)
                        } else {
                            store.put_expecting(id, bytes, claim)
                        }
                    })
                    .await;
                    match stored {
                        Ok(_) => {
                            info!(%id, size, from = %source.node, "object fetched");
                            keep(store, id, owner, pin).await?;
                            return Ok(ObjectBytes::shared(kept));
                        }
                        Err(StoreError::Mismatch { actual, .. }) => {
                            let checked = self.client.report_damaged(source, id).await;
                            failures.push(format!(
                                "node {} sent bytes that hash to {actual} (its copy {})",
                                source.node,
                                match checked {
                                    Ok(true) => "was damaged and is deleted".to_owned(),
                                    Ok(false) => "checks out: the damage was in transit".to_owned(),
                                    Err(error) =>
                                        format!("could not be checked: {}", error_chain(&error)),
                                }
                            ));
                        }
                        Err(source) => return Err(FetchError::Store { id, source }),
                    }
                }
                Err(reason) => {
                    failures.push(format!("node {}: {}", source.node, error_chain(&reason)))
                }
            }
        }
        Err(FetchError::Exhausted { id, failures })
    }
}

async fn keep(
    store: &Arc<ObjectStore>,
    id: ObjectId,
    owner: Owner,
    pin: bool,
) -> Result<(), FetchError> {
    off_runtime(store, move |store| {
        store.add_owner(id, owner)?;
        if pin {
            store.pin(id)?;
        }
        Ok(())
    })
    .await
    .map_err(|source| FetchError::Store { id, source })
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::PermissionsExt;

    use xp_runtime::ids::NodeId;

    use super::*;
    use crate::objects::StoreLimits;

    const TOKEN: &str = "cluster-token";

    struct Peer {
        _dir: tempfile::TempDir,
        store: Arc<ObjectStore>,
        server: ObjectServer,
        source: ObjectSource,
        dropped: mpsc::UnboundedReceiver<ObjectChange>,
    }

    fn peer(memory_bytes: u64) -> Peer {
        let dir = tempfile::tempdir().expect("tempdir");
        let limits = StoreLimits {
            memory_bytes,
            ..StoreLimits::default()
        };
        let store = Arc::new(ObjectStore::open(dir.path().join("objects"), limits).expect("store"));
        let (dropped_tx, dropped) = mpsc::unbounded_channel();
        let server = ObjectServer::start(
            store.clone(),
            "127.0.0.1:0".parse().expect("address"),
            object_wire::token_digest(TOKEN),
            dropped_tx,
        )
        .expect("server");
        let source = ObjectSource {
            node: NodeId::random(),
            host: "127.0.0.1".to_owned(),
            endpoint: server.endpoint().expect("endpoint"),
        };
        Peer {
            _dir: dir,
            store,
            server,
            source,
            dropped,
        }
    }

    fn owner() -> Owner {
        Owner::Trial("3f2a9c0d11b2e4f7-t3".parse().expect("trial id"))
    }

    fn wanted(id: ObjectId, pin: bool) -> Wanted {
        Wanted {
            id,
            owner: owner(),
            pin,
            size: None,
        }
    }

    fn pattern(len: usize) -> Vec<u8> {
        (0..len).map(|index| (index * 31 % 251) as u8).collect()
    }

    #[tokio::test]
    async fn a_multi_chunk_object_arrives_whole_and_verified() {
        let holder = peer(1 << 30);
        let fetching = peer(1 << 30);
        // Not a multiple of the chunk size, so the last chunk is short.
        let bytes = pattern(3 * object_wire::CHUNK_BYTES as usize + 12_345);
        let id = holder.store.put(bytes.clone(), owner()).expect("put");
        let fetcher = ObjectFetcher::new(object_wire::token_digest(TOKEN)).expect("fetcher");
        fetcher
            .ensure(
                &fetching.store,
                wanted(id, true),
                std::slice::from_ref(&holder.source),
                None,
            )
            .await
            .expect("fetch");
        assert_eq!(&*fetching.store.get(id).expect("stored"), bytes.as_slice());
        assert!(fetching.store.info(id).expect("info").pinned);
        holder.server.close();
    }

    #[tokio::test]
    async fn a_corrupt_source_is_skipped_and_reported_and_the_next_one_used() {
        // Memory limit 0: objects live on disk, where they can be damaged.
        let damaged = peer(0);
        let healthy = peer(0);
        let fetching = peer(0);
        let bytes = pattern(100_000);
        let id = damaged.store.put(bytes.clone(), owner()).expect("put");
        healthy.store.put(bytes.clone(), owner()).expect("put");
        let path = damaged.store.dir().join(id.to_string());
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).expect("chmod");
        let mut file = std::fs::read(&path).expect("read");
        file[777] ^= 0xff;
        std::fs::write(&path, &file).expect("write");

        let fetcher = ObjectFetcher::new(object_wire::token_digest(TOKEN)).expect("fetcher");
        let sources = [damaged.source.clone(), healthy.source.clone()];
        fetcher
            .ensure(&fetching.store, wanted(id, false), &sources, None)
            .await
            .expect("fetched from the healthy source");
        assert_eq!(&*fetching.store.get(id).expect("stored"), bytes.as_slice());
        let mut damaged = damaged;
        assert_eq!(
            damaged.dropped.recv().await,
            Some(ObjectChange::Dropped(id)),
            "the damaged copy is reported"
        );
        assert!(!damaged.store.contains(id), "and deleted");
    }

    #[tokio::test]
    async fn a_corrupt_local_copy_is_replaced_from_a_replica() {
        let holder = peer(0);
        let local = peer(0);
        let bytes = pattern(50_000);
        let id = holder.store.put(bytes.clone(), owner()).expect("put");
        local.store.put(bytes.clone(), owner()).expect("put");
        let path = local.store.dir().join(id.to_string());
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).expect("chmod");
        std::fs::write(&path, vec![0u8; bytes.len()]).expect("damage");
        let fetcher = ObjectFetcher::new(object_wire::token_digest(TOKEN)).expect("fetcher");
        fetcher
            .ensure(
                &local.store,
                wanted(id, true),
                std::slice::from_ref(&holder.source),
                None,
            )
            .await
            .expect("repaired");
        assert_eq!(&*local.store.get(id).expect("good again"), bytes.as_slice());
    }

    #[tokio::test]
    async fn a_wrong_token_or_a_missing_object_fails_clearly() {
        let holder = peer(1 << 20);
        let fetching = peer(1 << 20);
        let id = holder.store.put(pattern(10), owner()).expect("put");
        let intruder =
            ObjectFetcher::new(object_wire::token_digest("not the token")).expect("fetcher");
        let error = intruder
            .ensure(
                &fetching.store,
                wanted(id, false),
                std::slice::from_ref(&holder.source),
                None,
            )
            .await
            .expect_err("refused");
        assert!(error.to_string().contains("wrong cluster token"), "{error}");
        let fetcher = ObjectFetcher::new(object_wire::token_digest(TOKEN)).expect("fetcher");
        let absent = ObjectId::of(b"never stored");
        let error = fetcher
            .ensure(
                &fetching.store,
                wanted(absent, false),
                std::slice::from_ref(&holder.source),
                None,
            )
            .await
            .expect_err("absent");
        assert!(error.to_string().contains("NotFound"), "{error}");
        assert!(!fetching.store.contains(absent));
    }

    #[tokio::test]
    async fn garbage_on_an_object_stream_gets_an_error_not_a_crash() {
        let holder = peer(1 << 20);
        let id = holder.store.put(pattern(10), owner()).expect("put");
        let endpoint = object_wire::client_endpoint().expect("endpoint");
        let config =
            object_wire::client_config(holder.source.endpoint.cert_sha256, true).expect("config");
        let addr = SocketAddr::from(([127, 0, 0, 1], holder.source.endpoint.port));
        let connection = endpoint
            .connect_with(config, addr, object_wire::SERVER_NAME)
            .expect("connect")
            .await
            .expect("handshake");
        let (mut send, mut recv) = connection.open_bi().await.expect("stream");
        send.write_all(&[7, 0, 0, 0, 1, 2, 3, 4, 5, 6, 7])
            .await
            .expect("write");
        let _ = send.finish();
        let header: FetchHeader = object_wire::read_small(&mut recv).await.expect("answer");
        assert!(
            matches!(
                header,
                FetchHeader::Error {
                    code: FetchErrorCode::Malformed,
                    ..
                }
            ),
            "{header:?}"
        );
        // The server still serves proper requests.
        let fetching = peer(1 << 20);
        let fetcher = ObjectFetcher::new(object_wire::token_digest(TOKEN)).expect("fetcher");
        fetcher
            .ensure(
                &fetching.store,
                wanted(id, false),
                std::slice::from_ref(&holder.source),
                None,
            )
            .await
            .expect("still serving");
    }
}
