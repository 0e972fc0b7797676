//! The wire of object transfers between nodes: QUIC with a per-node self-signed
//! certificate that fetching nodes pin (the head hands out its SHA-256), one
//! bidirectional stream per chunk request.
//!
//! A request is a length-prefixed bincode [`ObjectRequest`] of at most
//! [`MAX_REQUEST_BYTES`]; the answer is a length-prefixed [`FetchHeader`] followed,
//! on success, by exactly the requested range of raw bytes. Every request
//! carries a [`Credential`]: a node's (derived from the cluster token, which
//! only nodes hold: a node fetching for its own workers, restores, inputs and
//! replicas) or an [`ObjectCapability`] the head issued to a driver session or
//! a trial attempt, which the server checks on every request (signature,
//! expiry, revocations, and what it may read or store as). Integrity does not
//! rest on the server: the fetcher hashes what it assembled and compares it
//! with the object id before keeping anything.
//!
//! Version 2 (ALPN `xp-objects/2`): credentials instead of version 1's
//! cluster-wide token digest, which every member could ask the head for and
//! which outlived revocation; the codes `Expired`, `Revoked`, `Forbidden` and
//! `OverQuota`; requests up to 16 KiB (a capability rides on each).
//!
//! A fetch for a trial on a trusted network (`transport: tcp`) may instead
//! take a ticket over that link and read the whole object from the node's
//! plain TCP bulk port (`bulk`); a server of before that path answers the
//! ticket request `Malformed`, and the fetch goes on over QUIC.
//!
//! The endpoints, the certificate and the pinning client come from
//! `crate::transport` (its bulk links); this module adds only the objects' ALPN,
//! their [`QuicTuning`] (four streams' worth of window) and [`IDLE_TIMEOUT`].

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use serde::{Deserialize, Serialize};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tracing::Instrument as _;

use crate::fill_buffer::{FillBuffer, FillRange};
use crate::ids::{ObjectId, TrialId};
use crate::protocol::{ObjectCapability, ObjectSource};
use crate::transport::{self, QuicSetupError, QuicTuning, SelfSignedIdentity};

mod bulk;

pub use crate::protocol::FetchPath;
pub use bulk::{BulkTicket, TICKET_LIFETIME, TICKET_WAIT};

/// The ALPN id of object links (version 2: credentials and capabilities).
pub const ALPN: &[u8] = b"xp-objects/2";
/// The name to connect with; the pinned certificate hash is what identifies a server.
pub const SERVER_NAME: &str = transport::SELF_SIGNED_SERVER_NAME;
/// The largest range one request may ask for.
pub const MAX_CHUNK_BYTES: u64 = 16 << 20;
/// The range size fetchers ask for.
pub const CHUNK_BYTES: u64 = 8 << 20;
/// The largest request or header (a request carries a capability).
pub const MAX_REQUEST_BYTES: usize = 16 << 10;
/// How long a link may stay silent before it is considered dead.
pub const IDLE_TIMEOUT: Duration = Duration::from_secs(30);

/// The credential a node presents: derived from the cluster token (which only
/// nodes hold), and unlike version 1's digest never handed to anyone.
pub fn node_credential(cluster_token: &str) -> [u8; 32] {
    blake3::derive_key(
        "xp 2026-12 object node credential v2",
        cluster_token.as_bytes(),
    )
}

/// Who asks an object server. Its `Debug` leaves secrets out.
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum Credential {
    /// A node, by [`node_credential`]: may do anything.
    Node([u8; 32]),
    /// A driver session or trial attempt, by what the head granted it.
    Capability(Box<ObjectCapability>),
}

impl std::fmt::Debug for Credential {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Node(_) => f.write_str("Node(<redacted>)"),
            Self::Capability(capability) => f.debug_tuple("Capability").field(capability).finish(),
        }
    }
}

/// One request on an object stream.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ObjectRequest {
    /// Who asks.
    pub credential: Credential,
    /// What is asked.
    pub op: ObjectOp,
}

/// What an object stream asks of a node.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum ObjectOp {
    /// A range of an object; answered by a [`FetchHeader`] and the bytes.
    Fetch {
        /// The object.
        id: ObjectId,
        /// The first byte wanted.
        offset: u64,
        /// How many bytes, at most [`MAX_CHUNK_BYTES`]; fewer come back at the end of the object.
        len: u64,
    },
    /// `size` raw bytes follow: store them for the driver session `owner`
    /// (the capability's own session); answered by a [`StoreAnswer`].
    Store {
        /// The driver session that owns the object.
        owner: String,
        /// How many bytes follow.
        size: u64,
    },
    /// The bytes served for `id` did not hash to it: check the copy (and delete it
    /// if damaged); answered by a [`StoreAnswer::Released`] saying whether it was.
    Damaged {
        /// The object.
        id: ObjectId,
    },
    /// Drop the driver session `owner`'s claim on `id` (the capability's own
    /// session); answered by a [`StoreAnswer`].
    Release {
        /// The driver session.
        owner: String,
        /// The object.
        id: ObjectId,
    },
    /// Who keeps `id` on this node, so that a node can check a worker may read it
    /// before fetching it (nodes only); answered by a [`StoreAnswer::Owners`].
    Owners {
        /// The object.
        id: ObjectId,
    },
    /// A ticket to read the whole object on this node's plain TCP bulk port
    /// (`bulk`); answered by a [`FetchHeader::Bulk`].
    Bulk {
        /// The object.
        id: ObjectId,
    },
}

/// The answer to a store or release.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum StoreAnswer {
    /// Stored under this id.
    Stored {
        /// The id.
        id: ObjectId,
    },
    /// The claim is gone; `existed` says whether there was one.
    Released {
        /// Whether the session had a claim.
        existed: bool,
    },
    /// Refused.
    Error {
        /// What went wrong.
        code: FetchErrorCode,
        /// In words.
        message: String,
    },
    /// The owners of an object this node holds (answering [`ObjectOp::Owners`]).
    Owners {
        /// The trials that keep it.
        #[serde(deserialize_with = "crate::wire_seq::vec")]
        trials: Vec<TrialId>,
        /// The driver sessions that keep it.
        #[serde(deserialize_with = "crate::wire_seq::vec")]
        drivers: Vec<String>,
    },
}

/// Why a server did not send the bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum FetchErrorCode {
    /// The credential is not valid here: not this cluster's node credential,
    /// or a capability whose signature does not match (forged or altered).
    BadCredential,
    /// The object is not on this node.
    NotFound,
    /// This node's copy failed its hash check and was deleted.
    Corrupt,
    /// The range is outside the object or too large.
    BadRange,
    /// The request could not be read.
    Malformed,
    /// The store refused the object (full, too large).
    Refused,
    /// The server failed for another reason.
    Internal,
    /// The capability has expired: ask the head for a new one.
    Expired,
    /// The capability was revoked (its session or attempt ended, its user was
    /// revoked or changed).
    Revoked,
    /// The capability does not cover this object or this store.
    Forbidden,
    /// The store would take the capability's team over its quota on this node.
    OverQuota,
    /// This node has no TCP bulk port: fetch over QUIC.
    Unoffered,
}

/// The answer before the bytes.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum FetchHeader {
    /// `len` bytes follow; the whole object is `size` bytes.
    Bytes {
        /// The object's size.
        size: u64,
        /// The bytes that follow.
        len: u64,
    },
    /// Nothing follows: connect to the TCP bulk `port` and present `ticket` for
    /// the whole object of `size` bytes.
    Bulk {
        /// The object's size.
        size: u64,
        /// The TCP port.
        port: u16,
        /// The one-time ticket.
        ticket: BulkTicket,
    },
    /// Nothing follows.
    Error {
        /// What went wrong.
        code: FetchErrorCode,
        /// In words.
        message: String,
    },
}

/// Why a small message could not be exchanged.
#[derive(Debug, thiserror::Error)]
pub enum WireError {
    /// The stream failed or ended early.
    #[error("object stream failed")]
    Io(#[from] std::io::Error),
    /// A message (or a length prefix) is over its channel's limit:
    /// [`MAX_REQUEST_BYTES`] between nodes, [`MAX_LOCAL_MESSAGE`] locally.
    #[error("object message of {len} bytes is over the {limit}-byte limit")]
    TooLarge {
        /// The message's length.
        len: usize,
        /// The channel's limit.
        limit: usize,
    },
    /// The message could not be encoded.
    #[error("cannot encode an object message")]
    Encode(#[source] bincode::error::EncodeError),
    /// The bytes are not a valid message.
    #[error("malformed object message")]
    Malformed(#[source] bincode::error::DecodeError),
}

/// `message` in bincode behind a 4-byte little-endian length, refused if the body
/// is over `LIMIT` bytes (the receiver would refuse it).
fn encode_prefixed<const LIMIT: usize, T: Serialize>(message: &T) -> Result<Vec<u8>, WireError> {
    let config = bincode::config::standard().with_limit::<LIMIT>();
    let body = bincode::serde::encode_to_vec(message, config).map_err(WireError::Encode)?;
    let too_large = || WireError::TooLarge {
        len: body.len(),
        limit: LIMIT,
    };
    if body.len() > LIMIT {
        return Err(too_large());
    }
    let len = u32::try_from(body.len()).map_err(|_| too_large())?;
    let mut framed = len.to_le_bytes().to_vec();
    framed.extend_from_slice(&body);
    Ok(framed)
}

/// The body length a 4-byte prefix announces, refused over `LIMIT`.
fn checked_length<const LIMIT: usize>(prefix: [u8; 4]) -> Result<usize, WireError> {
    let len = u32::from_le_bytes(prefix) as usize;
    if len > LIMIT {
        return Err(WireError::TooLarge { len, limit: LIMIT });
    }
    Ok(len)
}

/// A message's body, decoded with at most `LIMIT` bytes of allocation.
fn decode_body<const LIMIT: usize, T: for<'de> Deserialize<'de>>(
    body: &[u8],
) -> Result<T, WireError> {
    let config = bincode::config::standard().with_limit::<LIMIT>();
    bincode::serde::decode_from_slice(body, config)
        .map(|(message, _)| message)
        .map_err(WireError::Malformed)
}

/// Writes one length-prefixed message.
pub async fn write_small<T: Serialize>(
    send: &mut (impl AsyncWrite + Unpin),
    message: &T,
) -> Result<(), WireError> {
    send.write_all(&encode_prefixed::<MAX_REQUEST_BYTES, _>(message)?)
        .await?;
    Ok(())
}

/// Reads one length-prefixed message.
pub async fn read_small<T: for<'de> Deserialize<'de>>(
    recv: &mut (impl AsyncRead + Unpin),
) -> Result<T, WireError> {
    let mut prefix = [0u8; 4];
    recv.read_exact(&mut prefix).await?;
    let mut body = vec![0u8; checked_length::<MAX_REQUEST_BYTES>(prefix)?];
    recv.read_exact(&mut body).await?;
    decode_body::<MAX_REQUEST_BYTES, _>(&body)
}

fn tuning() -> QuicTuning {
    QuicTuning {
        streams: 4,
        ..QuicTuning::default()
    }
}

/// An object server's endpoint bound to `addr`, and its certificate's SHA-256.
pub fn server_endpoint(addr: SocketAddr) -> Result<(quinn::Endpoint, [u8; 32]), QuicSetupError> {
    let identity = SelfSignedIdentity::generate()?;
    let transport_config =
        transport::bulk_transport_config(&tuning(), IDLE_TIMEOUT, addr.ip().is_loopback());
    let server = identity.server_config(transport_config, ALPN)?;
    let endpoint = transport::bind_bulk_endpoint(addr, Some(server))?;
    Ok((endpoint, identity.sha256))
}

/// A client endpoint for fetching objects.
pub fn client_endpoint() -> Result<quinn::Endpoint, QuicSetupError> {
    transport::bind_bulk_endpoint(SocketAddr::from(([0, 0, 0, 0], 0)), None)
}

/// Waits (at most 100 ms) for MTU discovery on a new `connection`, so bulk data
/// does not start in 1200-byte datagrams where 64 KiB ones fit.
pub async fn settle_mtu(connection: &quinn::Connection) {
    transport::settle_mtu(connection, QuicTuning::default().mtu_settle).await;
}

/// The client configuration for a server whose certificate hashes to `pinned`.
pub fn client_config(
    pinned: [u8; 32],
    same_host: bool,
) -> Result<quinn::ClientConfig, QuicSetupError> {
    let transport_config = transport::bulk_transport_config(&tuning(), IDLE_TIMEOUT, same_host);
    transport::bulk_client_config(pinned, transport_config, ALPN)
}

/// The largest message on a node's local object channel.
pub const MAX_LOCAL_MESSAGE: usize = 64 << 10;

/// What a worker asks of its node's object store over the node's Unix socket
/// (`XP_NODE_SOCKET`), proving who it is with `XP_WORKER_SECRET`. Its `Debug`
/// leaves the secret out.
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LocalRequest {
    /// The worker's secret, from its environment.
    pub secret: [u8; 32],
    /// What it wants.
    pub op: LocalOp,
}

impl std::fmt::Debug for LocalRequest {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LocalRequest")
            .field("secret", &"<redacted>")
            .field("op", &self.op)
            .finish()
    }
}

/// One operation on the local object channel.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum LocalOp {
    /// Store the file at this path (the node copies it) for the worker's trial.
    Put {
        /// An absolute path the node can read.
        path: std::path::PathBuf,
    },
    /// Make the object readable at a path inside the worker's work directory,
    /// fetching it from another node if need be.
    Get {
        /// The object.
        id: ObjectId,
    },
    /// The trial no longer needs the object (others may still).
    Delete {
        /// The object.
        id: ObjectId,
    },
    /// The attempt's capability on the object plane, to fetch from object
    /// servers directly; answered by [`LocalResponse::Capability`].
    Capability,
}

/// The node's answer on the local object channel.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum LocalResponse {
    /// Stored.
    Stored {
        /// Its id.
        id: ObjectId,
        /// Its size.
        size: u64,
    },
    /// Readable (read-only) at `path`.
    Got {
        /// Where.
        path: std::path::PathBuf,
        /// Its size.
        size: u64,
    },
    /// The trial's claim on it is gone; `existed` says whether it had one.
    Released {
        /// Whether the trial owned it.
        existed: bool,
    },
    /// Refused or failed, in words.
    Error {
        /// Why.
        message: String,
    },
    /// The attempt's capability (answering [`LocalOp::Capability`]).
    Capability(Box<ObjectCapability>),
}

/// One length-prefixed local message, ready to write.
pub fn encode_local<T: Serialize>(message: &T) -> Result<Vec<u8>, WireError> {
    encode_prefixed::<MAX_LOCAL_MESSAGE, _>(message)
}

/// The body length a local message's 4-byte prefix announces, checked.
pub fn local_length(prefix: [u8; 4]) -> Result<usize, WireError> {
    checked_length::<MAX_LOCAL_MESSAGE>(prefix)
}

/// Decodes a local message's body.
pub fn decode_local<T: for<'de> Deserialize<'de>>(body: &[u8]) -> Result<T, WireError> {
    decode_body::<MAX_LOCAL_MESSAGE, _>(body)
}

/// What an open object link is kept under: the host and port a source names,
/// and the certificate it is pinned to.
type LinkKey = (String, u16, [u8; 32]);

/// Why an [`ObjectClient`]'s exchange with a node failed.
#[derive(Debug, thiserror::Error)]
pub enum ObjectClientError {
    /// The node's host did not resolve.
    #[error("cannot resolve {host}")]
    Resolve {
        /// The host.
        host: String,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// The node's host resolved to no address.
    #[error("{host} has no address")]
    NoAddress {
        /// The host.
        host: String,
    },
    /// The link's configuration could not be built.
    #[error("cannot configure the object link")]
    Setup(#[from] QuicSetupError),
    /// quinn refused to start a connection.
    #[error("cannot connect to {addr}")]
    Connect {
        /// The node's address.
        addr: SocketAddr,
        /// The cause.
        #[source]
        source: quinn::ConnectError,
    },
    /// The connection failed, the handshake included (a node whose certificate
    /// is not the pinned one fails here).
    #[error("cannot connect to {addr}")]
    Connection {
        /// The node's address.
        addr: SocketAddr,
        /// The cause.
        #[source]
        source: quinn::ConnectionError,
    },
    /// No stream could be opened on the link.
    #[error("cannot open a stream")]
    OpenStream(#[source] quinn::ConnectionError),
    /// A request or an answer could not be exchanged.
    #[error(transparent)]
    Wire(#[from] WireError),
    /// The object's bytes could not be sent.
    #[error("cannot send the object")]
    Send(#[source] quinn::WriteError),
    /// The node refused the request.
    #[error("{code:?}: {message}")]
    Refused {
        /// Why, as a code.
        code: FetchErrorCode,
        /// Why, in the node's words.
        message: String,
    },
    /// The node answered something the request does not call for.
    #[error("unexpected answer {answer:?}")]
    UnexpectedAnswer {
        /// The answer.
        answer: StoreAnswer,
    },
    /// The object is larger than one fetch may assemble.
    #[error("object of {size} bytes is over the {limit}-byte limit of one fetch")]
    TooLarge {
        /// The object's size.
        size: u64,
        /// The limit.
        limit: u64,
    },
    /// A chunk's answer gives the object another size than expected.
    #[error("the object is {size} bytes, not the {expected} expected")]
    SizeMismatch {
        /// The size the node gave.
        size: u64,
        /// The size expected (from the head, or the first answer).
        expected: u64,
    },
    /// A chunk's answer announces another length than asked for.
    #[error("asked {len} bytes at {offset}, told {got}")]
    RangeMismatch {
        /// Where the chunk starts.
        offset: u64,
        /// The bytes asked for.
        len: u64,
        /// The bytes announced.
        got: u64,
    },
    /// A chunk's bytes ended early.
    #[error("chunk at {offset} cut short")]
    CutShort {
        /// Where the chunk starts.
        offset: u64,
        /// The cause.
        #[source]
        source: quinn::ReadExactError,
    },
    /// The TCP bulk port could not be reached.
    #[error("cannot connect to the bulk port {addr}")]
    BulkConnect {
        /// The port's address.
        addr: SocketAddr,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// The bulk connection failed before the whole object came.
    #[error("the bulk connection to {addr} was cut short")]
    BulkCutShort {
        /// The port's address.
        addr: SocketAddr,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// A task fetching chunks failed (it panicked or was cancelled).
    #[error("a fetch task failed")]
    Task(#[source] tokio::task::JoinError),
    /// A task fetching chunks still held its range when the fetch ended.
    #[error("a fetch task outlived its fetch")]
    Outlived,
}

/// The client side of object links: one QUIC connection per node, reused; pulls
/// objects in parallel chunks, stores and releases driver objects, presenting
/// its credential (replaceable: a driver renews its capability).
#[derive(Debug)]
pub struct ObjectClient {
    endpoint: quinn::Endpoint,
    credential: Mutex<Arc<Credential>>,
    connections: Mutex<HashMap<LinkKey, quinn::Connection>>,
}

/// The largest object one fetch assembles in memory.
pub const MAX_FETCH_BYTES: u64 = 8 << 30;

/// How many chunk requests one fetch keeps in flight.
const PARALLEL_CHUNKS: usize = 4;

impl ObjectClient {
    /// A client presenting `credential`.
    pub fn new(credential: Credential) -> Result<Self, QuicSetupError> {
        Ok(Self {
            endpoint: client_endpoint()?,
            credential: Mutex::new(Arc::new(credential)),
            connections: Mutex::default(),
        })
    }

    /// Presents `credential` from now on (a renewed capability).
    pub fn set_credential(&self, credential: Credential) {
        *self
            .credential
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = Arc::new(credential);
    }

    /// The credential presented now.
    pub fn credential(&self) -> Arc<Credential> {
        self.credential
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    fn wrap(&self, op: ObjectOp) -> ObjectRequest {
        ObjectRequest {
            credential: Credential::clone(&self.credential()),
            op,
        }
    }

    /// One store-style exchange: `op` and then `payload` out, a [`StoreAnswer`] back.
    async fn ask(
        &self,
        source: &ObjectSource,
        op: ObjectOp,
        payload: &[u8],
    ) -> Result<StoreAnswer, ObjectClientError> {
        let connection = self.connection(source).await?;
        let (mut send, mut recv) = connection
            .open_bi()
            .await
            .map_err(ObjectClientError::OpenStream)?;
        write_small(&mut send, &self.wrap(op)).await?;
        let mut written = Ok(());
        for piece in payload.chunks(64 << 10) {
            if let Err(error) = send.write_all(piece).await {
                written = Err(ObjectClientError::Send(error));
                break;
            }
        }
        let _ = send.finish();
        // A server that refuses a store answers without reading its bytes (and
        // stops the stream): its answer says why, not the failed write.
        match read_small::<StoreAnswer>(&mut recv).await {
            Ok(StoreAnswer::Error { code, message }) => {
                Err(ObjectClientError::Refused { code, message })
            }
            Ok(answer) => written.map(|()| answer),
            Err(error) => Err(written.err().unwrap_or(error.into())),
        }
    }

    /// Stores `bytes` on the node at `source` for the driver session `owner`.
    pub async fn store(
        &self,
        source: &ObjectSource,
        owner: &str,
        bytes: &[u8],
    ) -> Result<ObjectId, ObjectClientError> {
        let op = ObjectOp::Store {
            owner: owner.to_owned(),
            size: bytes.len() as u64,
        };
        match self.ask(source, op, bytes).await? {
            StoreAnswer::Stored { id } => Ok(id),
            answer => Err(ObjectClientError::UnexpectedAnswer { answer }),
        }
    }

    /// Tells `source` that what it served for `id` did not hash to it; returns
    /// whether it found its copy damaged (and deleted it).
    pub async fn report_damaged(
        &self,
        source: &ObjectSource,
        id: ObjectId,
    ) -> Result<bool, ObjectClientError> {
        match self.ask(source, ObjectOp::Damaged { id }, &[]).await? {
            StoreAnswer::Released { existed } => Ok(existed),
            answer => Err(ObjectClientError::UnexpectedAnswer { answer }),
        }
    }

    /// Who keeps `id` at `source`: its trials and its driver sessions.
    pub async fn owners(
        &self,
        source: &ObjectSource,
        id: ObjectId,
    ) -> Result<(Vec<TrialId>, Vec<String>), ObjectClientError> {
        match self.ask(source, ObjectOp::Owners { id }, &[]).await? {
            StoreAnswer::Owners { trials, drivers } => Ok((trials, drivers)),
            answer => Err(ObjectClientError::UnexpectedAnswer { answer }),
        }
    }

    /// Drops the driver session `owner`'s claim on `id` at `source`.
    pub async fn release(
        &self,
        source: &ObjectSource,
        owner: &str,
        id: ObjectId,
    ) -> Result<bool, ObjectClientError> {
        let op = ObjectOp::Release {
            owner: owner.to_owned(),
            id,
        };
        match self.ask(source, op, &[]).await? {
            StoreAnswer::Released { existed } => Ok(existed),
            answer => Err(ObjectClientError::UnexpectedAnswer { answer }),
        }
    }

    async fn connection(
        &self,
        source: &ObjectSource,
    ) -> Result<quinn::Connection, ObjectClientError> {
        let cache_key = (
            source.host.clone(),
            source.endpoint.port,
            source.endpoint.cert_sha256,
        );
        if let Some(connection) = self
            .connections
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get(&cache_key)
            && connection.close_reason().is_none()
        {
            return Ok(connection.clone());
        }
        // Resolved only for a new connection, not on every fetch.
        let addr = tokio::net::lookup_host((source.host.as_str(), source.endpoint.port))
            .await
            .map_err(|error| ObjectClientError::Resolve {
                host: source.host.clone(),
                source: error,
            })?
            .next()
            .ok_or_else(|| ObjectClientError::NoAddress {
                host: source.host.clone(),
            })?;
        let config = client_config(source.endpoint.cert_sha256, addr.ip().is_loopback())?;
        let connection = self
            .endpoint
            .connect_with(config, addr, SERVER_NAME)
            .map_err(|error| ObjectClientError::Connect {
                addr,
                source: error,
            })?
            .await
            .map_err(|error| ObjectClientError::Connection {
                addr,
                source: error,
            })?;
        settle_mtu(&connection).await;
        self.connections
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(cache_key, connection.clone());
        Ok(connection)
    }

    /// The object's bytes from one source, in parallel chunks; not yet verified.
    /// With `size_hint` (from the head's manifest) every chunk is asked for at
    /// once; without it, a first empty request learns the size.
    pub async fn fetch_from(
        &self,
        source: &ObjectSource,
        id: ObjectId,
        size_hint: Option<u64>,
        max_bytes: u64,
    ) -> Result<Arc<[u8]>, ObjectClientError> {
        self.fetch_from_as(self.credential(), source, id, size_hint, max_bytes)
            .await
    }

    /// Like [`fetch_from`](Self::fetch_from), presenting `credential` instead
    /// of the client's (a capability granted for this one object).
    pub async fn fetch_from_as(
        &self,
        credential: Arc<Credential>,
        source: &ObjectSource,
        id: ObjectId,
        size_hint: Option<u64>,
        max_bytes: u64,
    ) -> Result<Arc<[u8]>, ObjectClientError> {
        let connection = self.connection(source).await?;
        let size = match size_hint {
            Some(size) => size,
            None => fetch_chunk(&connection, &credential, id, 0, &mut [], None).await?,
        };
        let max_bytes = max_bytes.min(MAX_FETCH_BYTES);
        if size > max_bytes {
            return Err(ObjectClientError::TooLarge {
                size,
                limit: max_bytes,
            });
        }
        let size_usize = usize::try_from(size).map_err(|_| ObjectClientError::TooLarge {
            size,
            limit: usize::MAX as u64,
        })?;
        // Received straight into the shared allocation the store keeps, so a
        // fetched object is never copied after it arrives; each lane is its own
        // task, so the copies out of quinn and the page faults of the fresh buffer
        // run on every runtime thread.
        let mut buffer = FillBuffer::zeroed(size_usize);
        // A bounded number in flight: lane k takes every PARALLEL_CHUNKS-th chunk.
        let mut lanes: Vec<Vec<(usize, FillRange)>> =
            (0..PARALLEL_CHUNKS).map(|_| Vec::new()).collect();
        for (index, chunk) in buffer.split(CHUNK_BYTES as usize).into_iter().enumerate() {
            lanes[index % PARALLEL_CHUNKS].push(chunk);
        }
        // Dropping the set (an error, or the fetch cancelled) aborts the others.
        let mut tasks = tokio::task::JoinSet::new();
        for lane in lanes.into_iter().filter(|lane| !lane.is_empty()) {
            let connection = connection.clone();
            let credential = credential.clone();
            tasks.spawn(
                async move {
                    for (offset, mut range) in lane {
                        let target = range.bytes_mut();
                        fetch_chunk(
                            &connection,
                            &credential,
                            id,
                            offset as u64,
                            target,
                            Some(size),
                        )
                        .await?;
                    }
                    Ok::<(), ObjectClientError>(())
                }
                .in_current_span(),
            );
        }
        while let Some(finished) = tasks.join_next().await {
            finished.map_err(ObjectClientError::Task)??;
        }
        buffer.finish().map_err(|_| ObjectClientError::Outlived)
    }
}

/// Reads the range of `target`'s length at `offset` into `target`, presenting
/// `credential`, and checks the object's size against `expected_size`; returns
/// the object's size.
async fn fetch_chunk(
    connection: &quinn::Connection,
    credential: &Credential,
    id: ObjectId,
    offset: u64,
    target: &mut [u8],
    expected_size: Option<u64>,
) -> Result<u64, ObjectClientError> {
    let (mut send, mut recv) = connection
        .open_bi()
        .await
        .map_err(ObjectClientError::OpenStream)?;
    let len = target.len() as u64;
    let request = ObjectRequest {
        credential: credential.clone(),
        op: ObjectOp::Fetch { id, offset, len },
    };
    write_small(&mut send, &request).await?;
    let _ = send.finish();
    let (size, got) = match read_small(&mut recv).await? {
        FetchHeader::Bytes { size, len: got } => (size, got),
        FetchHeader::Error { code, message } => {
            return Err(ObjectClientError::Refused { code, message });
        }
        FetchHeader::Bulk { .. } => {
            return Err(ObjectClientError::Refused {
                code: FetchErrorCode::Malformed,
                message: "a bulk ticket answered a chunk request".to_owned(),
            });
        }
    };
    if let Some(expected) = expected_size
        && expected != size
    {
        return Err(ObjectClientError::SizeMismatch { size, expected });
    }
    if got != len {
        return Err(ObjectClientError::RangeMismatch { offset, len, got });
    }
    recv.read_exact(target)
        .await
        .map_err(|source| ObjectClientError::CutShort { offset, source })?;
    Ok(size)
}

/// How long a lookup waits for an object to appear in the head's directory
/// ([`locate_settled`]).
pub const LOCATE_SETTLE: Duration = Duration::from_secs(3);

/// The holders `ask` finds for an object, asked again (after 20 ms, doubling
/// to 500 ms) for up to [`LOCATE_SETTLE`] while there are none: a node tells
/// the head of a put after it answered it, so an object that another process
/// put a moment ago, and passed the id of, may not be in the directory yet.
pub async fn locate_settled<E, F, Fut>(mut ask: F) -> Result<Vec<ObjectSource>, E>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<Vec<ObjectSource>, E>>,
{
    let deadline = tokio::time::Instant::now() + LOCATE_SETTLE;
    let mut pause = Duration::from_millis(20);
    loop {
        let sources = ask().await?;
        if !sources.is_empty() || tokio::time::Instant::now() + pause > deadline {
            return Ok(sources);
        }
        tokio::time::sleep(pause).await;
        pause = (pause * 2).min(Duration::from_millis(500));
    }
}

#[cfg(test)]
mod locate_tests {
    use std::sync::atomic::{AtomicU32, Ordering};

    use super::*;
    use crate::ids::NodeId;
    use crate::protocol::ObjectEndpoint;

    fn source() -> ObjectSource {
        ObjectSource {
            node: NodeId::random(),
            host: "127.0.0.1".to_owned(),
            endpoint: ObjectEndpoint {
                port: 1,
                cert_sha256: [0; 32],
            },
        }
    }

    #[tokio::test]
    async fn an_object_put_a_moment_ago_is_found_once_the_head_knows_it() {
        let asks = AtomicU32::new(0);
        let found = locate_settled(|| async {
            let ask = asks.fetch_add(1, Ordering::SeqCst);
            Ok::<_, String>(if ask < 2 { Vec::new() } else { vec![source()] })
        })
        .await
        .unwrap();
        assert_eq!((found.len(), asks.load(Ordering::SeqCst)), (1, 3));
    }

    #[tokio::test]
    async fn an_error_ends_the_lookup_and_an_absent_object_ends_it_after_the_settle() {
        let failed = locate_settled(|| async { Err::<Vec<ObjectSource>, _>("head gone") });
        assert_eq!(failed.await.unwrap_err(), "head gone");
        let started = tokio::time::Instant::now();
        let asks = AtomicU32::new(0);
        let absent = locate_settled(|| async {
            asks.fetch_add(1, Ordering::SeqCst);
            Ok::<_, String>(Vec::new())
        })
        .await
        .unwrap();
        assert!(absent.is_empty());
        // It waited (the pauses alone add up to 2.6 s) and did not ask in a busy loop.
        assert!(started.elapsed() >= Duration::from_millis(2_000));
        assert!(asks.load(Ordering::SeqCst) <= 10, "asked with backoff");
    }
}
