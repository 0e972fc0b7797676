//! The wire of object transfers between nodes: QUIC with a per-node self-signed
//! certificate that fetching nodes pin (the head hands out its SHA-256), one
//! bidirectional stream per chunk request.
//!
//! A request is a length-prefixed bincode [`FetchRequest`] of at most
//! [`MAX_REQUEST_BYTES`]; the answer is a length-prefixed [`FetchHeader`] followed,
//! on success, by exactly the requested range of raw bytes. Requests carry the
//! blake3 hash of the cluster token, so only members of the cluster read objects.
//! Integrity does not rest on the server: the fetcher hashes what it assembled
//! and compares it with the object id before keeping anything.

use std::net::SocketAddr;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

use crate::collective::QuicSetupError;
use crate::collective::QuicTuning;
use crate::collective::quic;
use crate::ids::ObjectId;

/// The ALPN id of object links.
pub const ALPN: &[u8] = b"xp-objects/1";
/// The name to connect with; the pinned certificate hash is what identifies a server.
pub const SERVER_NAME: &str = quic::SERVER_NAME;
/// The largest range one request may ask for.
pub const MAX_CHUNK_BYTES: u64 = 16 << 20;
/// The range size fetchers ask for.
pub const CHUNK_BYTES: u64 = 8 << 20;
/// The largest request or header.
pub const MAX_REQUEST_BYTES: usize = 4096;
/// How long a link may stay silent before it is considered dead.
pub const IDLE_TIMEOUT: Duration = Duration::from_secs(30);

const LIMIT: bincode::config::Configuration<
    bincode::config::LittleEndian,
    bincode::config::Varint,
    bincode::config::Limit<MAX_REQUEST_BYTES>,
> = bincode::config::standard().with_limit::<MAX_REQUEST_BYTES>();

/// The hash of the cluster token that requests carry.
pub fn token_digest(token: &str) -> [u8; 32] {
    *blake3::hash(token.as_bytes()).as_bytes()
}

/// One chunk request.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FetchRequest {
    /// [`token_digest`] of the cluster token.
    pub token: [u8; 32],
    /// The object.
    pub id: ObjectId,
    /// The first byte wanted.
    pub offset: u64,
    /// How many bytes, at most [`MAX_CHUNK_BYTES`]; fewer come back at the end of the object.
    pub len: u64,
}

/// Why a server did not send the bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum FetchErrorCode {
    /// The token digest is not this cluster's.
    BadToken,
    /// The object is not on this node.
    NotFound,
    /// This node's copy failed its hash check and was deleted.
    Corrupt,
    /// The range is outside the object or too large.
    BadRange,
    /// The request could not be read.
    Malformed,
    /// The server failed for another reason.
    Internal,
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
    #[error("object stream: {0}")]
    Io(#[from] std::io::Error),
    /// The length prefix is over [`MAX_REQUEST_BYTES`].
    #[error("object message of {0} bytes is over the {MAX_REQUEST_BYTES}-byte limit")]
    TooLarge(usize),
    /// A local message's length prefix is over [`MAX_LOCAL_MESSAGE`].
    #[error("local object message of {0} bytes is over the {MAX_LOCAL_MESSAGE}-byte limit")]
    LocalTooLarge(usize),
    /// The bytes are not a valid message.
    #[error("malformed object message: {0}")]
    Malformed(String),
}

/// Writes one length-prefixed message.
pub async fn write_small<T: Serialize>(
    send: &mut (impl AsyncWrite + Unpin),
    message: &T,
) -> Result<(), WireError> {
    let body = bincode::serde::encode_to_vec(message, LIMIT)
        .map_err(|error| WireError::Malformed(error.to_string()))?;
    let len = u32::try_from(body.len()).map_err(|_| WireError::TooLarge(body.len()))?;
    send.write_all(&len.to_le_bytes()).await?;
    send.write_all(&body).await?;
    Ok(())
}

/// Reads one length-prefixed message.
pub async fn read_small<T: for<'de> Deserialize<'de>>(
    recv: &mut (impl AsyncRead + Unpin),
) -> Result<T, WireError> {
    let mut len = [0u8; 4];
    recv.read_exact(&mut len).await?;
    let len = u32::from_le_bytes(len) as usize;
    if len > MAX_REQUEST_BYTES {
        return Err(WireError::TooLarge(len));
    }
    let mut body = vec![0u8; len];
    recv.read_exact(&mut body).await?;
    bincode::serde::decode_from_slice(&body, LIMIT)
        .map(|(message, _)| message)
        .map_err(|error| WireError::Malformed(error.to_string()))
}

fn tuning() -> QuicTuning {
    QuicTuning {
        streams: 4,
        ..QuicTuning::default()
    }
}

/// An object server's endpoint bound to `addr`, and its certificate's SHA-256.
pub fn server_endpoint(addr: SocketAddr) -> Result<(quinn::Endpoint, [u8; 32]), QuicSetupError> {
    let identity = quic::Identity::generate()?;
    let transport = quic::transport_config(&tuning(), IDLE_TIMEOUT, addr.ip().is_loopback());
    let server = quic::server_config(&identity, transport, ALPN)?;
    let endpoint = quic::bind_endpoint(addr, Some(server))?;
    Ok((endpoint, identity.sha256))
}

/// A client endpoint for fetching objects.
pub fn client_endpoint() -> Result<quinn::Endpoint, QuicSetupError> {
    quic::bind_endpoint(SocketAddr::from(([0, 0, 0, 0], 0)), None)
}

/// Waits (at most 100 ms) for MTU discovery on a new `connection`, so bulk data
/// does not start in 1200-byte datagrams where 64 KiB ones fit.
pub async fn settle_mtu(connection: &quinn::Connection) {
    quic::settle_mtu(connection, QuicTuning::default().mtu_settle).await;
}

/// The client configuration for a server whose certificate hashes to `pinned`.
pub fn client_config(
    pinned: [u8; 32],
    same_host: bool,
) -> Result<quinn::ClientConfig, QuicSetupError> {
    let transport = quic::transport_config(&tuning(), IDLE_TIMEOUT, same_host);
    quic::client_config(pinned, transport, ALPN)
}

/// The largest message on a node's local object channel.
pub const MAX_LOCAL_MESSAGE: usize = 64 << 10;

const LOCAL_LIMIT: bincode::config::Configuration<
    bincode::config::LittleEndian,
    bincode::config::Varint,
    bincode::config::Limit<MAX_LOCAL_MESSAGE>,
> = bincode::config::standard().with_limit::<MAX_LOCAL_MESSAGE>();

/// What a worker asks of its node's object store over the node's Unix socket
/// (`XP_NODE_SOCKET`), proving who it is with `XP_WORKER_SECRET`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LocalRequest {
    /// The worker's secret, from its environment.
    pub secret: [u8; 32],
    /// What it wants.
    pub op: LocalOp,
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
}

/// One length-prefixed local message, ready to write.
pub fn encode_local<T: Serialize>(message: &T) -> Result<Vec<u8>, WireError> {
    let body = bincode::serde::encode_to_vec(message, LOCAL_LIMIT)
        .map_err(|error| WireError::Malformed(error.to_string()))?;
    let len = u32::try_from(body.len()).map_err(|_| WireError::LocalTooLarge(body.len()))?;
    let mut framed = len.to_le_bytes().to_vec();
    framed.extend_from_slice(&body);
    Ok(framed)
}

/// The body length a local message's 4-byte prefix announces, checked.
pub fn local_length(prefix: [u8; 4]) -> Result<usize, WireError> {
    let len = u32::from_le_bytes(prefix) as usize;
    if len > MAX_LOCAL_MESSAGE {
        return Err(WireError::LocalTooLarge(len));
    }
    Ok(len)
}

/// Decodes a local message's body.
pub fn decode_local<T: for<'de> Deserialize<'de>>(body: &[u8]) -> Result<T, WireError> {
    bincode::serde::decode_from_slice(body, LOCAL_LIMIT)
        .map(|(message, _)| message)
        .map_err(|error| WireError::Malformed(error.to_string()))
}
