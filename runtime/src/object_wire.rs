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
