//! QUIC endpoints and the request/response helpers every process uses.
//!
//! Invariant: this is the only module that opens network sockets for the control
//! plane. TLS 1.3 only; the server presents its leaf and the cluster CA, clients
//! pin the CA by hash ([`crate::tls::PinnedCaVerifier`]) and then present the
//! token in a [`Hello`].

use std::net::{Ipv4Addr, Ipv6Addr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use quinn::crypto::rustls::{QuicClientConfig, QuicServerConfig};
use quinn::{Connection, Endpoint, RecvStream, SendStream};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::frame::{self, FrameError};
use crate::join::JoinString;
use crate::protocol::{
    ErrorCode, Hello, Message, PeerRole, RemoteError, Request, Response, Welcome,
};
use crate::tls::{ClusterIdentity, HEAD_SERVER_NAME, PinnedCaVerifier};

/// The ALPN protocol id of xp's control plane.
pub const ALPN: &[u8] = b"xp/1";
/// Application close code: the peer's token was wrong.
pub const CLOSE_BAD_TOKEN: u32 = 2;
/// Application close code: the peer broke the protocol.
pub const CLOSE_PROTOCOL_ERROR: u32 = 3;
/// Application close code: orderly shutdown.
pub const CLOSE_SHUTDOWN: u32 = 0;
/// Bytes per chunk when streaming blobs.
pub const BLOB_CHUNK_BYTES: usize = 1 << 20;
/// The largest blob accepted (driver binaries).
pub const MAX_BLOB_BYTES: u64 = 4 << 30;
/// How long a handshake may take before the peer gives up.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// Why a connection or exchange failed.
#[derive(Debug, thiserror::Error)]
pub enum TransportError {
    /// A UDP socket could not be bound.
    #[error("cannot bind {addr}: {source}")]
    Bind {
        /// The address.
        addr: SocketAddr,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// The TLS configuration could not be built.
    #[error("TLS configuration failed: {0}")]
    TlsConfig(String),
    /// The head's host name did not resolve.
    #[error("cannot resolve {host}: {reason}")]
    Resolve {
        /// The host.
        host: String,
        /// Why.
        reason: String,
    },
    /// The head's certificate does not chain to the pinned CA.
    #[error("{0}")]
    CaMismatch(String),
    /// The head refused the token.
    #[error(
        "the head refused the token: wrong token (the token in the join string is not this cluster's)"
    )]
    BadToken,
    /// The QUIC connection could not be made.
    #[error("cannot connect to the head at {addr}: {reason}")]
    Connect {
        /// The address.
        addr: SocketAddr,
        /// Why.
        reason: String,
    },
    /// The connection was lost or closed.
    #[error("connection to {peer} lost: {source}")]
    Connection {
        /// Which peer.
        peer: String,
        /// The cause.
        #[source]
        source: quinn::ConnectionError,
    },
    /// The peer answered with an error.
    #[error("{}", .0.message)]
    Remote(RemoteError),
    /// A frame could not be read or written.
    #[error(transparent)]
    Frame(#[from] FrameError),
    /// A stream could not be written.
    #[error("stream write failed: {0}")]
    Write(#[from] quinn::WriteError),
    /// The stream closed before the expected message.
    #[error("the peer closed the stream before answering")]
    ClosedEarly,
    /// The peer sent a message that makes no sense here.
    #[error("unexpected message from the peer: {0}")]
    Unexpected(String),
    /// A blob's bytes did not match its hash or length.
    #[error("blob transfer failed: {0}")]
    Blob(String),
    /// No answer in time.
    #[error("timed out after {0:?} waiting for the head")]
    Timeout(Duration),
}

impl From<quinn::ConnectionError> for TransportError {
    fn from(source: quinn::ConnectionError) -> Self {
        Self::Connection {
            peer: "head".to_owned(),
            source,
        }
    }
}

fn crypto_provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

fn transport_config() -> Arc<quinn::TransportConfig> {
    let mut config = quinn::TransportConfig::default();
    config.keep_alive_interval(Some(Duration::from_secs(2)));
    config.max_idle_timeout(Some(
        Duration::from_secs(30)
            .try_into()
            .expect("30 s is a valid idle timeout"),
    ));
    config.max_concurrent_bidi_streams(1024u32.into());
    config.stream_receive_window((8u32 << 20).into());
    config.receive_window((32u32 << 20).into());
    config.send_window(32 << 20);
    Arc::new(config)
}

/// The head's QUIC server configuration.
pub fn server_config(identity: &ClusterIdentity) -> Result<quinn::ServerConfig, TransportError> {
    let (chain, key) = identity.server_chain();
    let mut tls = rustls::ServerConfig::builder_with_provider(crypto_provider())
        .with_protocol_versions(&[&rustls::version::TLS13])
        .map_err(|error| TransportError::TlsConfig(error.to_string()))?
        .with_no_client_auth()
        .with_single_cert(chain, key)
        .map_err(|error| TransportError::TlsConfig(error.to_string()))?;
    tls.alpn_protocols = vec![ALPN.to_vec()];
    let quic = QuicServerConfig::try_from(tls)
        .map_err(|error| TransportError::TlsConfig(error.to_string()))?;
    let mut config = quinn::ServerConfig::with_crypto(Arc::new(quic));
    config.transport_config(transport_config());
    Ok(config)
}

/// Binds a QUIC endpoint with socket buffers large enough for bulk transfers.
pub fn bind_endpoint(
    addr: SocketAddr,
    server: Option<quinn::ServerConfig>,
) -> Result<Endpoint, TransportError> {
    bind_udp_endpoint(addr, server, quinn::EndpointConfig::default())
        .map_err(|source| TransportError::Bind { addr, source })
}

/// Binds a QUIC endpoint with `endpoint_config` on a UDP socket whose buffers are
/// raised for bulk transfer; the control plane and the collectives' links share it.
pub fn bind_udp_endpoint(
    addr: SocketAddr,
    server: Option<quinn::ServerConfig>,
    endpoint_config: quinn::EndpointConfig,
) -> Result<Endpoint, std::io::Error> {
    let socket = socket2::Socket::new(
        socket2::Domain::for_address(addr),
        socket2::Type::DGRAM,
        Some(socket2::Protocol::UDP),
    )?;
    // The 208 KiB default drops thousands of packets per GiB under load; failing to
    // raise it only costs speed.
    let _ = socket.set_recv_buffer_size(4 << 20);
    let _ = socket.set_send_buffer_size(4 << 20);
    socket.bind(&addr.into())?;
    let socket: std::net::UdpSocket = socket.into();
    Endpoint::new(
        endpoint_config,
        server,
        socket,
        Arc::new(quinn::TokioRuntime),
    )
}

/// A client's authenticated connection to the head.
#[derive(Debug, Clone)]
pub struct HeadConnection {
    /// Kept so the endpoint lives as long as the connection.
    endpoint: Endpoint,
    /// The QUIC connection.
    pub connection: Connection,
}

impl HeadConnection {
    /// Sends one request on a fresh stream and reads its response.
    pub async fn request(&self, request: Request) -> Result<Response, TransportError> {
        let (mut send, mut recv) = self.connection.open_bi().await?;
        frame::write_message(&mut send, &Message::Request(request)).await?;
        let _ = send.finish();
        read_response(&mut recv).await
    }

    /// Uploads `bytes` as a blob with `hash`.
    pub async fn put_blob(
        &self,
        hash: crate::ids::BlobHash,
        bytes: &[u8],
    ) -> Result<(), TransportError> {
        let (mut send, mut recv) = self.connection.open_bi().await?;
        let request = Request::PutBlob {
            hash,
            len: bytes.len() as u64,
        };
        frame::write_message(&mut send, &Message::Request(request)).await?;
        for chunk in bytes.chunks(BLOB_CHUNK_BYTES) {
            send.write_all(chunk).await?;
        }
        let _ = send.finish();
        match read_response(&mut recv).await? {
            Response::BlobStored => Ok(()),
            other => Err(TransportError::Unexpected(format!("{other:?}"))),
        }
    }

    /// Downloads the blob `hash`, verifying its hash.
    pub async fn get_blob(&self, hash: crate::ids::BlobHash) -> Result<Vec<u8>, TransportError> {
        let (mut send, mut recv) = self.connection.open_bi().await?;
        frame::write_message(&mut send, &Message::Request(Request::GetBlob { hash })).await?;
        let _ = send.finish();
        let len = match read_response(&mut recv).await? {
            Response::Blob { len } if len <= MAX_BLOB_BYTES => len,
            Response::Blob { len } => {
                return Err(TransportError::Blob(format!(
                    "announced {len} bytes, over the limit"
                )));
            }
            other => return Err(TransportError::Unexpected(format!("{other:?}"))),
        };
        let mut bytes = Vec::with_capacity(len.min(64 << 20) as usize);
        (&mut recv)
            .take(len)
            .read_to_end(&mut bytes)
            .await
            .map_err(FrameError::Io)?;
        if bytes.len() as u64 != len {
            return Err(TransportError::Blob(format!(
                "got {} of {len} bytes",
                bytes.len()
            )));
        }
        if crate::ids::BlobHash::of(&bytes) != hash {
            return Err(TransportError::Blob(format!(
                "bytes received for {hash} do not match its hash"
            )));
        }
        Ok(bytes)
    }

    /// Closes the connection politely.
    pub async fn close(&self) {
        self.connection.close(CLOSE_SHUTDOWN.into(), b"bye");
        self.endpoint.wait_idle().await;
    }
}

/// Reads one response frame, turning an error frame into [`TransportError::Remote`].
pub async fn read_response(recv: &mut RecvStream) -> Result<Response, TransportError> {
    match frame::read_message(recv).await? {
        Some(Message::Response(response)) => Ok(response),
        Some(Message::Error(error)) => Err(TransportError::Remote(error)),
        Some(other) => Err(TransportError::Unexpected(format!("{other:?}"))),
        None => Err(TransportError::ClosedEarly),
    }
}

/// Opens a QUIC connection to the head, verifying its CA, without saying hello.
///
/// Tools and tests use this to probe the head with raw frames; everything else
/// calls [`connect`].
pub async fn connect_unauthenticated(
    join: &JoinString,
) -> Result<(Endpoint, Connection), TransportError> {
    let addr = tokio::net::lookup_host((join.host.as_str(), join.port))
        .await
        .map_err(|error| TransportError::Resolve {
            host: join.host.clone(),
            reason: error.to_string(),
        })?
        .next()
        .ok_or_else(|| TransportError::Resolve {
            host: join.host.clone(),
            reason: "no address".to_owned(),
        })?;
    let local: SocketAddr = if addr.is_ipv4() {
        (Ipv4Addr::UNSPECIFIED, 0).into()
    } else {
        (Ipv6Addr::UNSPECIFIED, 0).into()
    };
    let mut endpoint = bind_endpoint(local, None)?;
    let verifier = Arc::new(PinnedCaVerifier::new(join.ca_sha256, crypto_provider()));
    let failure = verifier.failure.clone();
    let mut tls = rustls::ClientConfig::builder_with_provider(crypto_provider())
        .with_protocol_versions(&[&rustls::version::TLS13])
        .map_err(|error| TransportError::TlsConfig(error.to_string()))?
        .dangerous()
        .with_custom_certificate_verifier(verifier)
        .with_no_client_auth();
    tls.alpn_protocols = vec![ALPN.to_vec()];
    let quic = QuicClientConfig::try_from(tls)
        .map_err(|error| TransportError::TlsConfig(error.to_string()))?;
    let mut client = quinn::ClientConfig::new(Arc::new(quic));
    client.transport_config(transport_config());
    endpoint.set_default_client_config(client);
    let connecting =
        endpoint
            .connect(addr, HEAD_SERVER_NAME)
            .map_err(|error| TransportError::Connect {
                addr,
                reason: error.to_string(),
            })?;
    let outcome = tokio::time::timeout(HANDSHAKE_TIMEOUT, connecting).await;
    let ca_failure = || {
        failure
            .lock()
            .expect("verifier failure lock is never poisoned")
            .clone()
    };
    match outcome {
        Ok(Ok(connection)) => Ok((endpoint, connection)),
        Ok(Err(error)) => Err(match ca_failure() {
            Some(message) => TransportError::CaMismatch(message),
            None => TransportError::Connect {
                addr,
                reason: error.to_string(),
            },
        }),
        Err(_) => Err(match ca_failure() {
            Some(message) => TransportError::CaMismatch(message),
            None => TransportError::Connect {
                addr,
                reason: format!("no answer within {HANDSHAKE_TIMEOUT:?}"),
            },
        }),
    }
}

/// Connects to the head and authenticates with the join string's token.
///
/// Returns the connection and the first stream, which a node keeps as its session.
pub async fn connect(
    join: &JoinString,
    role: PeerRole,
    agent: &str,
) -> Result<(HeadConnection, SendStream, RecvStream), TransportError> {
    let (endpoint, connection) = connect_unauthenticated(join).await?;
    let hello = Message::Hello(Hello {
        token: join.token.clone(),
        role,
        agent: agent.to_owned(),
    });
    let exchange = async {
        let (mut send, mut recv) = connection.open_bi().await?;
        frame::write_message(&mut send, &hello).await?;
        match frame::read_message(&mut recv).await? {
            Some(Message::Welcome(Welcome { .. })) => Ok((send, recv)),
            Some(Message::Error(error)) if error.code == ErrorCode::BadToken => {
                Err(TransportError::BadToken)
            }
            Some(Message::Error(error)) => Err(TransportError::Remote(error)),
            Some(other) => Err(TransportError::Unexpected(format!("{other:?}"))),
            None => Err(TransportError::ClosedEarly),
        }
    };
    let outcome = tokio::time::timeout(HANDSHAKE_TIMEOUT, exchange)
        .await
        .unwrap_or(Err(TransportError::Timeout(HANDSHAKE_TIMEOUT)));
    match outcome {
        Ok((send, recv)) => Ok((
            HeadConnection {
                endpoint,
                connection,
            },
            send,
            recv,
        )),
        Err(error) => {
            connection.close(CLOSE_SHUTDOWN.into(), b"handshake failed");
            Err(match error {
                TransportError::Connection {
                    source: quinn::ConnectionError::ApplicationClosed(close),
                    ..
                } if close.error_code == CLOSE_BAD_TOKEN.into() => TransportError::BadToken,
                other => other,
            })
        }
    }
}

/// Writes an error frame on `send` and finishes the stream.
pub async fn send_error(send: &mut SendStream, error: RemoteError) {
    if frame::write_message(send, &Message::Error(error))
        .await
        .is_ok()
    {
        let _ = send.finish();
    }
}

/// Writes `message` on `send` and finishes the stream.
pub async fn send_final(send: &mut SendStream, message: &Message) -> Result<(), TransportError> {
    frame::write_message(send, message).await?;
    let _ = send.finish();
    send.flush().await.map_err(FrameError::Io)?;
    Ok(())
}
