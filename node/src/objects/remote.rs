//! Objects between nodes: the server that lends this node's objects to other
//! nodes, and the fetcher that pulls objects from them in parallel chunks.
//!
//! The wire is `xp_runtime::object_wire`. A fetched object is assembled in
//! memory, hashed, and stored only if it hashes to its id, so a corrupt or
//! malicious source can cost a retry but never a wrong object. A source whose
//! own copy fails its hash check deletes it (the store does) and says so, and
//! the server tells the agent, which tells the head's directory.
//!
//! Every request is checked by `access` first: its credential (this cluster's
//! node credential, or a capability the head signed, verified and not revoked),
//! then what it asks against what the capability covers (reading an object
//! its grant names, storing and releasing only as its own driver session,
//! within its team's quota). Refusals are answered with their reason and kept
//! for the head's audit trail; users' fetches and stores are counted per team.
//!
//! A trial whose spec says its network is trusted (`transport: tcp`) reads
//! whole objects from the server's plain TCP bulk port instead (`bulk`), with a
//! one-time ticket the object link issued after the same checks.
//!
//! Not here: knowing which node holds what (the head's directory does; callers
//! pass the sources), and the wire format and QUIC setup (`xp_runtime`).

use std::net::SocketAddr;
use std::sync::Arc;

use tokio::sync::mpsc;
use tracing::{debug, info, warn};
use xp_runtime::clock::{Clock, SystemClock};
use xp_runtime::error_chain::error_chain;
use xp_runtime::ids::{ObjectId, TrialId};
use xp_runtime::object_wire::{
    self, Credential, FetchErrorCode, FetchHeader, FetchPath, MAX_CHUNK_BYTES, ObjectClient,
    ObjectOp, ObjectRequest, StoreAnswer,
};
use xp_runtime::protocol::{ObjectEndpoint, ObjectSource};
use xp_runtime::transport::QuicSetupError;

use super::access::{Asker, ObjectAccess, Refusal, StorePlan};
use super::{ObjectBytes, ObjectChange, ObjectStore, Owner, StoreError, off_runtime};
use bulk::{BulkPort, Payload as BulkPayload};

mod bulk;

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
    bulk: Option<Arc<BulkPort>>,
}

impl ObjectServer {
    /// Listens on `bind`; every request is checked by `access`. What the store
    /// gains (driver puts) or loses (releases, copies found corrupt while
    /// serving) is sent on `changes`.
    pub fn start(
        store: Arc<ObjectStore>,
        bind: SocketAddr,
        access: Arc<ObjectAccess>,
        changes: mpsc::UnboundedSender<ObjectChange>,
    ) -> Result<Self, ObjectServerError> {
        let (endpoint, cert_sha256) = object_wire::server_endpoint(bind)
            .map_err(|source| ObjectServerError::Start { bind, source })?;
        let port = endpoint
            .local_addr()
            .map_err(ObjectServerError::Address)?
            .port();
        // Without it, fetchers are told to use QUIC: a node still serves.
        let bulk = match BulkPort::start(bind.ip(), port, access.clone()) {
            Ok(bulk) => Some(Arc::new(bulk)),
            Err(error) => {
                warn!(%error, "cannot open the object bulk port; objects go over QUIC only");
                None
            }
        };
        let accepting = endpoint.clone();
        let server = Served {
            store,
            access,
            changes,
            bulk: bulk.clone(),
        };
        xp_runtime::task::spawn("object-server", async move {
            while let Some(incoming) = accepting.accept().await {
                let server = server.clone();
                xp_runtime::task::spawn("object-connection", async move {
                    match incoming.await {
                        Ok(connection) => serve_connection(connection, server).await,
                        Err(error) => debug!(%error, "object connection failed"),
                    }
                });
            }
        });
        Ok(Self {
            endpoint,
            cert_sha256,
            bulk,
        })
    }

    /// The TCP port of the bulk path, if it is open.
    pub fn bulk_port(&self) -> Option<u16> {
        self.bulk.as_ref().map(|bulk| bulk.port())
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
        if let Some(bulk) = &self.bulk {
            bulk.close();
        }
    }
}

/// What every request of the server reaches: the store, the access rules and
/// where changes to the store are told.
#[derive(Clone)]
struct Served {
    store: Arc<ObjectStore>,
    access: Arc<ObjectAccess>,
    changes: mpsc::UnboundedSender<ObjectChange>,
    bulk: Option<Arc<BulkPort>>,
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

async fn serve_connection(connection: quinn::Connection, server: Served) {
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
        let server = server.clone();
        let recent = recent.clone();
        xp_runtime::task::spawn("object-request", async move {
            if let Err(error) = serve_request(send, recv, &server, recent).await {
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
    server: &Served,
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
    let now_ms = SystemClock.now();
    let checked = server
        .access
        .authenticate(&request.credential, now_ms)
        .and_then(|asker| permitted(server, &asker, &request.op).map(|()| asker));
    let asker = match checked {
        Ok(asker) => asker,
        Err(refusal) => {
            let action = describe(&request.op);
            warn!(%action, reason = %refusal.message, "object request refused");
            server
                .access
                .refused(now_ms, &request.credential, action, &refusal);
            write_refusal(&mut send, &request.op, refusal).await?;
            let _ = send.finish();
            return Ok(());
        }
    };
    let team = match &asker {
        Asker::Node => None,
        Asker::Capability(grant) => Some(grant.team.as_str()),
    };
    let asked = Asked {
        team,
        credential: &request.credential,
        now_ms,
    };
    serve_op(&mut send, &mut recv, server, &recent, &asked, request.op).await?;
    let _ = send.finish();
    Ok(())
}

/// Who asked a permitted request: their team (`None` for a node) and
/// credential, and when.
struct Asked<'a> {
    team: Option<&'a str>,
    credential: &'a Credential,
    now_ms: u64,
}

/// Whether `asker` may ask `op`: a node may ask anything; a capability reads
/// what its grant covers, writes only as its own session, and asks no owners.
fn permitted(server: &Served, asker: &Asker, op: &ObjectOp) -> Result<(), Refusal> {
    let Asker::Capability(grant) = asker else {
        return Ok(());
    };
    match op {
        ObjectOp::Fetch { id, .. } | ObjectOp::Bulk { id } | ObjectOp::Damaged { id } => {
            let owners = server.store.info(*id).map(|info| info.owners);
            ObjectAccess::check_read(grant, *id, owners)
        }
        ObjectOp::Store { owner, .. } | ObjectOp::Release { owner, .. } => {
            ObjectAccess::check_write(grant, owner)
        }
        ObjectOp::Owners { .. } => Err(Refusal {
            code: FetchErrorCode::Forbidden,
            message: "only nodes ask who keeps an object".to_owned(),
        }),
    }
}

/// What `op` asks, in words, for the log and the audit trail.
fn describe(op: &ObjectOp) -> String {
    match op {
        ObjectOp::Fetch { id, .. } => format!("fetch object {id}"),
        ObjectOp::Bulk { id } => format!("fetch object {id} over the bulk port"),
        ObjectOp::Store { size, .. } => format!("store an object of {size} bytes"),
        ObjectOp::Damaged { id } => format!("report object {id} damaged"),
        ObjectOp::Release { id, .. } => format!("release object {id}"),
        ObjectOp::Owners { id } => format!("ask who keeps object {id}"),
    }
}

/// Answers `op` with `refusal` in the answer its asker reads.
async fn write_refusal(
    send: &mut quinn::SendStream,
    op: &ObjectOp,
    refusal: Refusal,
) -> Result<(), object_wire::WireError> {
    let Refusal { code, message } = refusal;
    match op {
        ObjectOp::Fetch { .. } | ObjectOp::Bulk { .. } => {
            object_wire::write_small(send, &FetchHeader::Error { code, message }).await
        }
        ObjectOp::Store { .. }
        | ObjectOp::Release { .. }
        | ObjectOp::Damaged { .. }
        | ObjectOp::Owners { .. } => {
            object_wire::write_small(send, &StoreAnswer::Error { code, message }).await
        }
    }
}

/// Serves a permitted `op` for `asked`.
async fn serve_op(
    send: &mut quinn::SendStream,
    recv: &mut quinn::RecvStream,
    server: &Served,
    recent: &Recent,
    asked: &Asked<'_>,
    op: ObjectOp,
) -> Result<(), object_wire::WireError> {
    let team = asked.team;
    let Served {
        store,
        access,
        changes,
        bulk,
    } = server;
    match op {
        ObjectOp::Fetch { id, offset, len } => {
            let served = serve_fetch(send, store, changes, recent, id, offset, len).await?;
            if let (Some(team), Some(bytes)) = (team, served) {
                access.count_fetch(team, bytes, offset == 0 && bytes > 0);
            }
        }
        ObjectOp::Bulk { id } => {
            let header = bulk_ticket(bulk.as_deref(), store, changes, recent, id, team).await;
            object_wire::write_small(send, &header).await?;
        }
        ObjectOp::Store { owner, size } => {
            let answer = match receive_store(recv, server, team, owner, size).await {
                Ok(answer) => answer,
                Err(refusal) => {
                    let action = format!("store an object of {size} bytes");
                    warn!(%action, reason = %refusal.message, "object store refused");
                    access.refused(asked.now_ms, asked.credential, action, &refusal);
                    StoreAnswer::Error {
                        code: refusal.code,
                        message: refusal.message,
                    }
                }
            };
            object_wire::write_small(send, &answer).await?;
        }
        ObjectOp::Damaged { id } => {
            recent.lock().await.retain(|(cached, _, _)| *cached != id);
            let checked = off_runtime(store, move |store| store.verify(id)).await;
            let damaged = matches!(
                checked,
                Err(StoreError::Corrupt { .. } | StoreError::Missing { .. })
            );
            if damaged {
                warn!(%id, "a fetcher found this node's copy damaged; deleted");
                let _ = changes.send(ObjectChange::Dropped(id));
            }
            object_wire::write_small(send, &StoreAnswer::Released { existed: damaged }).await?;
        }
        ObjectOp::Release { owner, id } => {
            let answer = release(store, changes, owner, id).await;
            object_wire::write_small(send, &answer).await?;
        }
        ObjectOp::Owners { id } => {
            let answer = match store.info(id) {
                Some(info) => owners_answer(info.owners),
                None => StoreAnswer::Error {
                    code: FetchErrorCode::NotFound,
                    message: format!("object {id} is not on this node"),
                },
            };
            object_wire::write_small(send, &answer).await?;
        }
    }
    Ok(())
}

/// Drops driver session `owner`'s claim on `id`.
async fn release(
    store: &Arc<ObjectStore>,
    changes: &mpsc::UnboundedSender<ObjectChange>,
    owner: String,
    id: ObjectId,
) -> StoreAnswer {
    let released = off_runtime(store, move |store| {
        let existed = store.remove_owner(id, &Owner::Driver(owner))?;
        Ok((existed, store.contains(id)))
    })
    .await;
    match released {
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
    }
}

/// The wire form of an object's owners.
fn owners_answer(owners: Vec<Owner>) -> StoreAnswer {
    let (trials, drivers) = Owner::split(owners);
    StoreAnswer::Owners { trials, drivers }
}

/// The longest driver session name a store request may carry.
const MAX_OWNER_CHARS: usize = 128;

/// Reads `size` bytes a driver sends and stores them for its session, within
/// its `team`'s quota (checked on the announced size before a byte is read,
/// and again, one store at a time, before the put); a quota refusal is the
/// error, for the audit trail.
async fn receive_store(
    recv: &mut quinn::RecvStream,
    server: &Served,
    team: Option<&str>,
    owner: String,
    size: u64,
) -> Result<StoreAnswer, Refusal> {
    let refuse = |code, message: String| Ok(StoreAnswer::Error { code, message });
    if owner.is_empty() || owner.len() > MAX_OWNER_CHARS {
        return refuse(
            FetchErrorCode::Malformed,
            format!("a driver session name must be 1 to {MAX_OWNER_CHARS} bytes"),
        );
    }
    let store = &server.store;
    let limit = store.limits().max_object_bytes.min(MAX_STORE_BYTES);
    if size > limit {
        return refuse(
            FetchErrorCode::Refused,
            format!("object of {size} bytes is over the {limit}-byte limit"),
        );
    }
    if let Some(team) = team {
        let holdings = || store.holdings();
        server
            .access
            .admit_store(team, &owner, size, holdings, |_| ())?;
    }
    let bytes = match receive_bytes(recv, size).await {
        Ok(bytes) => bytes,
        Err(message) => return refuse(FetchErrorCode::Malformed, message),
    };
    let put = put_for(server.access.clone(), team.map(str::to_owned), owner, bytes);
    match off_runtime(store, put).await {
        Ok(Ok(id)) => {
            let _ = server.changes.send(ObjectChange::Added(id));
            if let Some(team) = team {
                server.access.count_store(team, size);
            }
            Ok(StoreAnswer::Stored { id })
        }
        Ok(Err(refusal)) => Err(refusal),
        Err(error @ StoreError::Task { .. }) => refuse(FetchErrorCode::Internal, error.to_string()),
        Err(error) => refuse(FetchErrorCode::Refused, error.to_string()),
    }
}

/// The `size` bytes that follow a store request, or why they did not arrive.
async fn receive_bytes(recv: &mut quinn::RecvStream, size: u64) -> Result<Vec<u8>, String> {
    // Grown as bytes arrive, so an announced size costs nothing until it is sent.
    let mut bytes = Vec::with_capacity(size.min(64 << 20) as usize);
    while (bytes.len() as u64) < size {
        let wanted = (size - bytes.len() as u64).min(1 << 20) as usize;
        match recv.read_chunk(wanted, true).await {
            Ok(Some(chunk)) => bytes.extend_from_slice(&chunk.bytes),
            Ok(None) => {
                return Err(format!(
                    "the object's bytes ended after {} of {size}",
                    bytes.len()
                ));
            }
            Err(error) => return Err(format!("the object's bytes were cut short: {error}")),
        }
    }
    Ok(bytes)
}

/// The put of a driver's `bytes` for session `owner`: for a user's (with a
/// `team`) admitted under the team's quota, and on disk when its memory
/// quota is full.
fn put_for(
    access: Arc<ObjectAccess>,
    team: Option<String>,
    owner: String,
    bytes: Vec<u8>,
) -> impl FnOnce(&ObjectStore) -> Result<Result<ObjectId, Refusal>, StoreError> + Send + 'static {
    move |store| {
        let Some(team) = team else {
            return store.put(bytes, Owner::Driver(owner)).map(Ok);
        };
        let size = bytes.len() as u64;
        let session = owner.clone();
        let admitted = access.admit_store(
            &team,
            &session,
            size,
            || store.holdings(),
            |plan| match plan {
                StorePlan::Anywhere => store.put(bytes, Owner::Driver(owner)),
                StorePlan::Disk => {
                    let id = super::object_id(&bytes);
                    store.put_expecting_on_disk(id, &bytes, Owner::Driver(owner))
                }
            },
        );
        match admitted {
            Ok(stored) => stored.map(Ok),
            Err(refusal) => Ok(Err(refusal)),
        }
    }
}

/// Serves a chunk; returns how many bytes were sent (`None`: none, refused).
async fn serve_fetch(
    send: &mut quinn::SendStream,
    store: &Arc<ObjectStore>,
    changes: &mpsc::UnboundedSender<ObjectChange>,
    recent: &Recent,
    id: ObjectId,
    offset: u64,
    len: u64,
) -> Result<Option<u64>, object_wire::WireError> {
    let refuse = |code, message: String| FetchHeader::Error { code, message };
    let bytes = match lookup(store, recent, id).await {
        Ok(bytes) => bytes,
        Err(error) => {
            object_wire::write_small(send, &lookup_refusal(changes, id, error)).await?;
            return Ok(None);
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
        object_wire::write_small(send, &header).await?;
        return Ok(None);
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
    Ok(Some(end - offset))
}

/// The answer to a ticket request for `id`: a ticket on the bulk port, or
/// why not (no port, too many tickets out: the fetcher takes QUIC).
async fn bulk_ticket(
    bulk: Option<&BulkPort>,
    store: &Arc<ObjectStore>,
    changes: &mpsc::UnboundedSender<ObjectChange>,
    recent: &Recent,
    id: ObjectId,
    team: Option<&str>,
) -> FetchHeader {
    let Some(bulk) = bulk else {
        return FetchHeader::Error {
            code: FetchErrorCode::Unoffered,
            message: "this node has no bulk port".to_owned(),
        };
    };
    // A file on disk goes by `sendfile`; an object in memory from memory.
    let file = off_runtime(store, move |store| {
        let Some(file) = store.open_disk_file(id)? else {
            return Ok(None);
        };
        Ok(file.metadata().ok().map(|meta| (file, meta.len())))
    })
    .await;
    let payload = match file {
        Ok(Some((file, size))) => BulkPayload::File { file, size },
        Ok(None) => match lookup(store, recent, id).await {
            Ok(bytes) => BulkPayload::Bytes(bytes),
            Err(error) => return lookup_refusal(changes, id, error),
        },
        Err(error) => return lookup_refusal(changes, id, error),
    };
    let size = payload.size();
    match bulk.issue(payload, team) {
        Ok(ticket) => FetchHeader::Bulk {
            size,
            port: bulk.port(),
            ticket,
        },
        Err(reason) => FetchHeader::Error {
            code: FetchErrorCode::Unoffered,
            message: reason.to_owned(),
        },
    }
}

/// The refusal of a fetch whose object `lookup` failed; tells the head's
/// directory when this node turns out not to hold it.
fn lookup_refusal(
    changes: &mpsc::UnboundedSender<ObjectChange>,
    id: ObjectId,
    error: StoreError,
) -> FetchHeader {
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
    FetchHeader::Error {
        code,
        message: error.to_string(),
    }
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
    /// The path its bytes take: the plain TCP bulk path only for a trial whose
    /// network its spec says is trusted (`FetchPath::for_transport`).
    pub path: FetchPath,
}

/// Pulls objects from other nodes into this node's store.
pub struct ObjectFetcher {
    client: ObjectClient,
}

impl ObjectFetcher {
    /// A fetcher presenting `credential` (a node's: see
    /// `object_wire::node_credential`).
    pub fn new(credential: Credential) -> Result<Self, FetchError> {
        let client = ObjectClient::new(credential)
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
            path,
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
                .fetch_over(path, source, id, size_hint, store.limits().max_object_bytes)
                .await
            {
                Ok((bytes, took)) => {
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
                            info!(%id, size, from = %source.node, path = ?took, "object fetched");
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
mod tests;
