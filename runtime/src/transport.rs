//! QUIC endpoints and their TLS, for every plane, and the request/response
//! helpers of the control plane.
//!
//! Two kinds of endpoint are built here. The control plane: the head presents its
//! leaf and the cluster CA, clients pin the CA by hash and then present the token
//! in a [`Hello`]. Bulk links, the collectives between the ranks of a trial and
//! the object links between nodes: each listener presents a self-signed
//! certificate generated for it and never stored, and clients pin that
//! certificate by hash (the hash travels with the listener's address: through
//! rendezvous, or from the head). Either way TLS 1.3 only, and every client
//! verifies with [`crate::tls::PinnedVerifier`].
//!
//! Bulk endpoints accept datagrams up to 64 KiB, so that MTU discovery can use the
//! 64 KiB MTU of loopback, and the jumbo frames of a data centre, instead of
//! stopping at the Ethernet default of 1472 bytes. Measured on loopback (2 cores):
//! quinn spends its time per packet, so 64 KiB datagrams move about four times
//! the bytes per CPU-second of 1200-byte ones. Two quinn details shape the
//! settings: MTU probes are sent only when a connection has nothing else to send
//! (so a client waits for discovery to settle right after connecting, see
//! `settle_mtu`), and with segmentation offload on, large datagrams on loopback
//! were lost by the thousand and black-hole detection fell back to 1200 bytes, so
//! a link to a peer on the same host turns offload off.
//!
//! It does not decide who may talk: the head checks the cluster token, the
//! collective hello the per-attempt token, the object server the token's digest.
//! What is specific to a caller (its ALPN, its [`QuicTuning`], the ordered close
//! of a collective's links) is passed in or stays with the caller.
//!
//! Invariant: this is the only module that binds QUIC endpoints and builds their
//! TLS configurations.

use std::net::{Ipv4Addr, Ipv6Addr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use quinn::crypto::rustls::{QuicClientConfig, QuicServerConfig};
use quinn::{Connection, Endpoint, RecvStream, SendStream};
use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::frame::{self, FrameError};
use crate::join::JoinString;
use crate::protocol::{
    ErrorCode, Hello, Message, PeerRole, RemoteError, Request, Response, Welcome,
};
use crate::tls::{CaMismatch, ClusterIdentity, HEAD_SERVER_NAME, Pin, PinnedVerifier};

/// The ALPN protocol id of xp's control plane.
pub const ALPN: &[u8] = b"xp/1";
/// Application close code: the peer's token was wrong.
pub const CLOSE_BAD_TOKEN: u32 = 2;
/// Application close code: the peer broke the protocol.
pub const CLOSE_PROTOCOL_ERROR: u32 = 3;
/// Application close code: the connection's credential was revoked (or its
/// user removed) while it was open.
pub const CLOSE_REVOKED: u32 = 4;
/// Application close code: orderly shutdown.
pub const CLOSE_SHUTDOWN: u32 = 0;
/// Bytes per chunk when streaming blobs.
pub const BLOB_CHUNK_BYTES: usize = 1 << 20;
/// The largest blob accepted (driver binaries).
pub const MAX_BLOB_BYTES: u64 = 4 << 30;
/// How long a handshake may take before the peer gives up.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// How long a connection to one of several heads may take: standbys do not
/// answer, and a QUIC handshake to a port nobody listens on only ends with its
/// timeout, so the attempts are cut short and made again, keeping a change of
/// leader within seconds.
pub const STANDBY_CONNECT_TIMEOUT: Duration = Duration::from_secs(2);
// The session timings are part of the protocol (the head's restart grace is
// computed from them), so they live with it; re-exported where they are used.
pub use crate::protocol::{
    NODE_RECONNECT_MAX_BACKOFF, NODE_RETURN_BOUND, NODE_SESSION_IDLE_TIMEOUT,
    NODE_SESSION_KEEP_ALIVE,
};

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
    #[error(transparent)]
    TlsConfig(#[from] QuicSetupError),
    /// The head's host name did not resolve.
    #[error("cannot resolve {host}: {reason}")]
    Resolve {
        /// The host.
        host: String,
        /// Why.
        reason: String,
    },
    /// The head's certificate does not chain to the pinned CA.
    #[error(transparent)]
    CaMismatch(CaMismatch),
    /// The head refused the credential; the head's words say why (a wrong
    /// token, a revoked one, a user credential given to a node).
    #[error("the head refused the credential: {0}")]
    BadToken(String),
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

/// Why a QUIC configuration or endpoint could not be built.
#[derive(Debug, thiserror::Error)]
pub enum QuicSetupError {
    /// Certificate generation failed.
    #[error("cannot generate a certificate")]
    Certificate(#[from] rcgen::Error),
    /// rustls refused the configuration.
    #[error("TLS configuration failed")]
    Tls(#[from] rustls::Error),
    /// quinn refused the TLS configuration.
    #[error("QUIC TLS configuration failed")]
    NoInitialCipherSuite(#[from] quinn::crypto::rustls::NoInitialCipherSuite),
    /// A socket could not be bound.
    #[error("cannot bind {addr}")]
    Bind {
        /// The address.
        addr: SocketAddr,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
}

/// ring's provider as it comes, for the control plane.
fn control_plane_provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// ring's provider with AES-128-GCM preferred, for bulk links: it is the mandatory
/// TLS 1.3 suite, and with 10 rounds instead of 14 it costs less CPU per byte than
/// AES-256-GCM, which matters because quinn's throughput here is bound by CPU.
fn bulk_provider() -> Arc<rustls::crypto::CryptoProvider> {
    use rustls::crypto::ring::cipher_suite;
    let mut provider = rustls::crypto::ring::default_provider();
    provider.cipher_suites = vec![
        cipher_suite::TLS13_AES_128_GCM_SHA256,
        cipher_suite::TLS13_AES_256_GCM_SHA384,
        cipher_suite::TLS13_CHACHA20_POLY1305_SHA256,
    ];
    Arc::new(provider)
}

/// A TLS 1.3 server presenting `chain` (leaf first) with `key`, speaking `alpn`,
/// with `transport` settings.
fn tls_server_config(
    provider: Arc<rustls::crypto::CryptoProvider>,
    chain: Vec<CertificateDer<'static>>,
    key: PrivateKeyDer<'static>,
    transport: Arc<quinn::TransportConfig>,
    alpn: &[u8],
) -> Result<quinn::ServerConfig, QuicSetupError> {
    let mut tls = rustls::ServerConfig::builder_with_provider(provider)
        .with_protocol_versions(&[&rustls::version::TLS13])?
        .with_no_client_auth()
        .with_single_cert(chain, key)?;
    tls.alpn_protocols = vec![alpn.to_vec()];
    tls.max_early_data_size = 0;
    let quic = QuicServerConfig::try_from(tls)?;
    let mut config = quinn::ServerConfig::with_crypto(Arc::new(quic));
    config.transport_config(transport);
    Ok(config)
}

/// A TLS 1.3 client that trusts what `verifier` pins (with the verifier's
/// provider), speaking `alpn`, with `transport` settings.
fn pinned_client_config(
    verifier: Arc<PinnedVerifier>,
    transport: Arc<quinn::TransportConfig>,
    alpn: &[u8],
) -> Result<quinn::ClientConfig, QuicSetupError> {
    let mut tls = rustls::ClientConfig::builder_with_provider(verifier.provider().clone())
        .with_protocol_versions(&[&rustls::version::TLS13])?
        .dangerous()
        .with_custom_certificate_verifier(verifier)
        .with_no_client_auth();
    tls.alpn_protocols = vec![alpn.to_vec()];
    let quic = QuicClientConfig::try_from(tls)?;
    let mut config = quinn::ClientConfig::new(Arc::new(quic));
    config.transport_config(transport);
    Ok(config)
}

/// The control plane's transport settings. Drivers and tools keep a long idle
/// timeout (a long-polling client on a slow link is not dropped); a node's session
/// uses [`NODE_SESSION_IDLE_TIMEOUT`] and [`NODE_SESSION_KEEP_ALIVE`], so that it
/// notices a lost head within seconds.
fn control_plane_transport_config(role: PeerRole) -> Arc<quinn::TransportConfig> {
    let (keep_alive, idle) = match role {
        PeerRole::Node => (NODE_SESSION_KEEP_ALIVE, NODE_SESSION_IDLE_TIMEOUT),
        PeerRole::Client => (Duration::from_secs(2), Duration::from_secs(30)),
    };
    let mut config = quinn::TransportConfig::default();
    config.keep_alive_interval(Some(keep_alive));
    config.max_idle_timeout(Some(
        idle.try_into()
            .expect("the control plane's idle timeouts are valid"),
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
    Ok(tls_server_config(
        control_plane_provider(),
        chain,
        key,
        // The head's side keeps the long timeout: each connection uses the smaller
        // of the two sides' values, which for a node's session is the node's.
        control_plane_transport_config(PeerRole::Client),
        ALPN,
    )?)
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
/// raised for bulk transfer; the control plane and the bulk links share it.
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

/// The name in every self-signed certificate; the pinned hash is what identifies
/// the server, so bulk clients connect with this name whatever they reach.
pub(crate) const SELF_SIGNED_SERVER_NAME: &str = "xp-collective";
/// The largest UDP payload a bulk endpoint accepts.
const MAX_UDP_PAYLOAD: u16 = 65_527;

/// How bulk QUIC links are sized, from the network they are expected to cross.
///
/// The flow-control windows are the bandwidth-delay product (times two, so a lost
/// packet does not stall the sender), and never less than `min_window_bytes`, which
/// keeps several segments in flight on a fast, short path such as loopback.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QuicTuning {
    /// Parallel streams per link; data frames are spread over them round robin.
    pub streams: u32,
    /// The bandwidth the link should be able to fill, in bytes per second.
    pub bandwidth_bytes_per_s: u64,
    /// The round trip time to plan for.
    pub rtt: Duration,
    /// The smallest window, whatever the product.
    pub min_window_bytes: u64,
    /// The send window of a link to a peer on the same host, where the product is
    /// nothing: one segment in flight beyond the one being written, and small
    /// enough that a burst does not overflow the receiver's UDP buffer while it is
    /// descheduled (losses of 64 KiB datagrams make quinn fall back to 1200-byte
    /// ones). 1 MiB moved a two-rank ring 15% faster than 4 MiB on the 2-core
    /// development machine (`xp bench allreduce --transport quic`): the sender's
    /// data is still in cache when the receiver reads it.
    pub same_host_window_bytes: u64,
    /// The largest UDP payload MTU discovery may try towards another host: 1452
    /// (Ethernet) by default; raise it on networks with jumbo frames.
    pub max_mtu_remote: u16,
    /// How long a new connection waits for MTU discovery before carrying data.
    pub mtu_settle: Duration,
}

impl Default for QuicTuning {
    fn default() -> Self {
        Self {
            streams: 1,
            // 100 Gbit/s over a 1 ms round trip: a data-centre network.
            bandwidth_bytes_per_s: 12_500_000_000,
            rtt: Duration::from_millis(1),
            min_window_bytes: 16 << 20,
            same_host_window_bytes: 1 << 20,
            max_mtu_remote: 1452,
            mtu_settle: Duration::from_millis(100),
        }
    }
}

impl QuicTuning {
    /// The per-stream receive window.
    pub fn stream_window_bytes(&self) -> u64 {
        let product = u128::from(self.bandwidth_bytes_per_s) * self.rtt.as_micros() / 1_000_000;
        u64::try_from(2 * product)
            .unwrap_or(u64::MAX)
            .max(self.min_window_bytes)
            .min(1 << 30)
    }
}

/// The transport settings of a bulk link sized by `tuning`; `same_host` is whether
/// the peer runs on this machine, where datagrams can be 64 KiB. A peer that stays
/// silent for `timeout` (at least a second) is dropped.
pub(crate) fn bulk_transport_config(
    tuning: &QuicTuning,
    timeout: Duration,
    same_host: bool,
) -> Arc<quinn::TransportConfig> {
    let stream_window = tuning.stream_window_bytes();
    let streams = u64::from(tuning.streams.max(1));
    let connection_window = stream_window.saturating_mul(streams).min(1 << 31);
    let varint = |value: u64| quinn::VarInt::from_u64(value).unwrap_or(quinn::VarInt::MAX);
    let mut config = quinn::TransportConfig::default();
    config.stream_receive_window(varint(stream_window));
    config.receive_window(varint(connection_window));
    config.send_window(connection_window);
    config.max_concurrent_bidi_streams(varint(streams + 1));
    config.max_concurrent_uni_streams(0u32.into());
    let mut mtu = quinn::MtuDiscoveryConfig::default();
    // After a burst of losses quinn drops to 1200-byte datagrams; look again soon.
    mtu.black_hole_cooldown(Duration::from_secs(1));
    if same_host {
        mtu.upper_bound(MAX_UDP_PAYLOAD);
        config.enable_segmentation_offload(false);
        config.send_window(tuning.same_host_window_bytes);
    } else {
        mtu.upper_bound(tuning.max_mtu_remote.max(1200));
    }
    config.mtu_discovery_config(Some(mtu));
    let mut cubic = quinn::congestion::CubicConfig::default();
    cubic.initial_window((stream_window / 4).max(64 << 10));
    config.congestion_controller_factory(Arc::new(cubic));
    // Liveness: the connection outlives idle stretches between transfers, and a
    // peer that vanishes is noticed within the timeout.
    let idle = timeout.max(Duration::from_secs(1));
    config.keep_alive_interval(Some(idle / 4));
    config.max_idle_timeout(quinn::IdleTimeout::try_from(idle).ok());
    Arc::new(config)
}

/// A bulk listener's certificate: generated per listener, never stored.
pub(crate) struct SelfSignedIdentity {
    certificate: CertificateDer<'static>,
    key: PrivatePkcs8KeyDer<'static>,
    /// SHA-256 of the certificate's DER, what clients pin.
    pub(crate) sha256: [u8; 32],
}

impl SelfSignedIdentity {
    /// A fresh certificate naming [`SELF_SIGNED_SERVER_NAME`].
    pub(crate) fn generate() -> Result<Self, QuicSetupError> {
        let certified =
            rcgen::generate_simple_self_signed(vec![SELF_SIGNED_SERVER_NAME.to_owned()])?;
        let certificate = certified.cert.der().clone();
        let sha256 = crate::tls::sha256(&certificate);
        Ok(Self {
            certificate,
            key: PrivatePkcs8KeyDer::from(certified.signing_key.serialize_der()),
            sha256,
        })
    }

    /// The server side of a bulk listener presenting this certificate, speaking
    /// `alpn`, with `transport` settings; clients may not migrate.
    pub(crate) fn server_config(
        &self,
        transport: Arc<quinn::TransportConfig>,
        alpn: &[u8],
    ) -> Result<quinn::ServerConfig, QuicSetupError> {
        let mut config = tls_server_config(
            bulk_provider(),
            vec![self.certificate.clone()],
            PrivateKeyDer::Pkcs8(self.key.clone_key()),
            transport,
            alpn,
        )?;
        config.migration(false);
        Ok(config)
    }
}

/// The client side of a bulk link to a listener whose certificate hashes to
/// `pinned`, speaking `alpn`, with `transport` settings.
pub(crate) fn bulk_client_config(
    pinned: [u8; 32],
    transport: Arc<quinn::TransportConfig>,
    alpn: &[u8],
) -> Result<quinn::ClientConfig, QuicSetupError> {
    let verifier = PinnedVerifier::new(Pin::Leaf(pinned), bulk_provider());
    pinned_client_config(Arc::new(verifier), transport, alpn)
}

/// Binds a bulk endpoint: large socket buffers and 64 KiB datagrams.
pub(crate) fn bind_bulk_endpoint(
    addr: SocketAddr,
    server: Option<quinn::ServerConfig>,
) -> Result<Endpoint, QuicSetupError> {
    let mut endpoint_config = quinn::EndpointConfig::default();
    endpoint_config
        .max_udp_payload_size(MAX_UDP_PAYLOAD)
        .expect("65527 is the largest valid UDP payload");
    bind_udp_endpoint(addr, server, endpoint_config)
        .map_err(|source| QuicSetupError::Bind { addr, source })
}

/// Waits, at most `limit`, until MTU discovery on the idle `connection` stops
/// raising the datagram size, so bulk data does not start in 1200-byte datagrams
/// where 64 KiB ones fit.
pub(crate) async fn settle_mtu(connection: &Connection, limit: Duration) {
    const STEP: Duration = Duration::from_millis(2);
    let deadline = tokio::time::Instant::now() + limit;
    let mut last = connection.stats().path.current_mtu;
    let mut unchanged_steps = 0;
    while tokio::time::Instant::now() < deadline && unchanged_steps < 5 {
        tokio::time::sleep(STEP).await;
        let mtu = connection.stats().path.current_mtu;
        if mtu == last {
            unchanged_steps += 1;
        } else {
            last = mtu;
            unchanged_steps = 0;
        }
    }
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
        let mut written = Ok(());
        for chunk in bytes.chunks(BLOB_CHUNK_BYTES) {
            // A head that refuses the upload (a user over their limit) stops
            // reading it: its answer says why, so it is read either way.
            written = send.write_all(chunk).await;
            if written.is_err() {
                break;
            }
        }
        let _ = send.finish();
        match (read_response(&mut recv).await?, written) {
            (Response::BlobStored, Ok(())) => Ok(()),
            (Response::BlobStored, Err(error)) => Err(error.into()),
            (other, _) => Err(TransportError::Unexpected(format!("{other:?}"))),
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
    connect_as(join, PeerRole::Client).await
}

/// Opens a QUIC connection to the head with the transport settings of `role`:
/// to every head the join string names at once, keeping the first that
/// answers (standbys do not listen; the leader does).
async fn connect_as(
    join: &JoinString,
    role: PeerRole,
) -> Result<(Endpoint, Connection), TransportError> {
    if join.more_heads.is_empty() {
        return connect_one(join.host.clone(), join.port, join.ca_sha256, role).await;
    }
    let mut attempts = tokio::task::JoinSet::new();
    for (host, port) in join.heads() {
        let attempt = connect_one(host.to_owned(), port, join.ca_sha256, role);
        attempts.spawn(async move {
            tokio::time::timeout(STANDBY_CONNECT_TIMEOUT, attempt)
                .await
                .unwrap_or(Err(TransportError::Timeout(STANDBY_CONNECT_TIMEOUT)))
        });
    }
    let mut first_error = None;
    while let Some(attempt) = attempts.join_next().await {
        match attempt {
            Ok(Ok(connected)) => return Ok(connected),
            Ok(Err(error)) => {
                first_error.get_or_insert(error);
            }
            Err(join_error) => {
                first_error.get_or_insert(TransportError::Connect {
                    addr: (Ipv4Addr::UNSPECIFIED, 0).into(),
                    reason: join_error.to_string(),
                });
            }
        }
    }
    Err(first_error.expect("a join string names at least one head"))
}

/// Opens a QUIC connection to the head at `host:port`, verifying its CA.
async fn connect_one(
    host: String,
    port: u16,
    ca_sha256: [u8; 32],
    role: PeerRole,
) -> Result<(Endpoint, Connection), TransportError> {
    let addr = tokio::net::lookup_host((host.as_str(), port))
        .await
        .map_err(|error| TransportError::Resolve {
            host: host.clone(),
            reason: error.to_string(),
        })?
        .next()
        .ok_or_else(|| TransportError::Resolve {
            host: host.clone(),
            reason: "no address".to_owned(),
        })?;
    let local: SocketAddr = if addr.is_ipv4() {
        (Ipv4Addr::UNSPECIFIED, 0).into()
    } else {
        (Ipv6Addr::UNSPECIFIED, 0).into()
    };
    let mut endpoint = bind_endpoint(local, None)?;
    let verifier = Arc::new(PinnedVerifier::new(
        Pin::Ca(ca_sha256),
        control_plane_provider(),
    ));
    let client =
        pinned_client_config(verifier.clone(), control_plane_transport_config(role), ALPN)?;
    endpoint.set_default_client_config(client);
    let connecting =
        endpoint
            .connect(addr, HEAD_SERVER_NAME)
            .map_err(|error| TransportError::Connect {
                addr,
                reason: error.to_string(),
            })?;
    let outcome = tokio::time::timeout(HANDSHAKE_TIMEOUT, connecting).await;
    match outcome {
        Ok(Ok(connection)) => Ok((endpoint, connection)),
        Ok(Err(error)) => Err(match verifier.ca_mismatch() {
            Some(mismatch) => TransportError::CaMismatch(mismatch),
            None => TransportError::Connect {
                addr,
                reason: error.to_string(),
            },
        }),
        Err(_) => Err(match verifier.ca_mismatch() {
            Some(mismatch) => TransportError::CaMismatch(mismatch),
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
/// A node's connection notices a lost head within [`NODE_SESSION_IDLE_TIMEOUT`].
pub async fn connect(
    join: &JoinString,
    role: PeerRole,
    agent: &str,
) -> Result<(HeadConnection, SendStream, RecvStream), TransportError> {
    let (endpoint, connection) = connect_as(join, role).await?;
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
                Err(TransportError::BadToken(error.message))
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
                } if close.error_code == CLOSE_BAD_TOKEN.into() => {
                    TransportError::BadToken(String::from_utf8_lossy(&close.reason).into_owned())
                }
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
