//! QUIC for bulk transfer between ranks: a self-signed certificate per listener,
//! clients that pin it by SHA-256, and transport settings sized for throughput.
//!
//! This is the data plane between the workers of one trial, not the control plane
//! of `runtime::transport`: there is no cluster CA here, the per-attempt token
//! (sent in the hello, see `wire`) is what admits a peer, and the certificate hash
//! travels with the rendezvous so the connecting rank knows whom it talks to.
//!
//! The endpoint is built like `transport::bind_endpoint` (UDP buffers raised), with
//! one difference: the endpoint accepts datagrams up to 64 KiB, so that MTU
//! discovery can use the 64 KiB MTU of loopback, and the jumbo frames of a data
//! centre, instead of stopping at the Ethernet default of 1472 bytes.
//!
//! Measured on loopback (2 cores): quinn spends its time per packet, so 64 KiB
//! datagrams move about four times the bytes per CPU-second of 1200-byte ones. Two
//! quinn details shape the settings: MTU probes are sent only when a connection
//! has nothing else to send (so the client waits for discovery to settle right
//! after connecting), and with segmentation offload on, large datagrams on loopback
//! were lost by the thousand and black-hole detection fell back to 1200 bytes, so a
//! link to a peer on the same host turns offload off.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use quinn::crypto::rustls::{QuicClientConfig, QuicServerConfig};
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer, ServerName, UnixTime};
use rustls::{DigitallySignedStruct, SignatureScheme};

/// The ALPN id of collective links.
pub(crate) const ALPN: &[u8] = b"xp-collective/1";
/// The name in every collective certificate; the pinned hash is what identifies it.
pub(crate) const SERVER_NAME: &str = "xp-collective";
/// The most bytes handed to a quinn stream in one write (see `StreamWriter`).
pub(crate) const MAX_WRITE_BYTES: usize = 64 << 10;
/// The largest UDP payload the endpoint accepts.
const MAX_UDP_PAYLOAD: u16 = 65_527;

/// How QUIC links are sized, from the network they are expected to cross.
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

/// Why a QUIC configuration could not be built.
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

/// ring's provider with AES-128-GCM preferred: it is the mandatory TLS 1.3 suite,
/// and with 10 rounds instead of 14 it costs less CPU per byte than AES-256-GCM,
/// which matters because quinn's throughput here is bound by CPU.
fn crypto_provider() -> Arc<rustls::crypto::CryptoProvider> {
    use rustls::crypto::ring::cipher_suite;
    let mut provider = rustls::crypto::ring::default_provider();
    provider.cipher_suites = vec![
        cipher_suite::TLS13_AES_128_GCM_SHA256,
        cipher_suite::TLS13_AES_256_GCM_SHA384,
        cipher_suite::TLS13_CHACHA20_POLY1305_SHA256,
    ];
    Arc::new(provider)
}

/// The transport settings of every collective connection; `same_host` is whether
/// the peer runs on this machine, where datagrams can be 64 KiB.
pub(crate) fn transport_config(
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
    // Liveness: the connection outlives idle stretches between collectives, and a
    // peer that vanishes is noticed within the collective timeout.
    let idle = timeout.max(Duration::from_secs(1));
    config.keep_alive_interval(Some(idle / 4));
    config.max_idle_timeout(quinn::IdleTimeout::try_from(idle).ok());
    Arc::new(config)
}

/// A listener's certificate: generated per communicator, never stored.
pub(crate) struct Identity {
    certificate: CertificateDer<'static>,
    key: PrivatePkcs8KeyDer<'static>,
    /// SHA-256 of the certificate's DER, what peers pin.
    pub(crate) sha256: [u8; 32],
}

impl Identity {
    pub(crate) fn generate() -> Result<Self, QuicSetupError> {
        let certified = rcgen::generate_simple_self_signed(vec![SERVER_NAME.to_owned()])?;
        let certificate = certified.cert.der().clone();
        let sha256 = crate::tls::sha256(&certificate);
        Ok(Self {
            certificate,
            key: PrivatePkcs8KeyDer::from(certified.signing_key.serialize_der()),
            sha256,
        })
    }
}

/// The server side of a listener, with `transport` settings.
pub(crate) fn server_config(
    identity: &Identity,
    transport: Arc<quinn::TransportConfig>,
    alpn: &[u8],
) -> Result<quinn::ServerConfig, QuicSetupError> {
    let mut tls = rustls::ServerConfig::builder_with_provider(crypto_provider())
        .with_protocol_versions(&[&rustls::version::TLS13])?
        .with_no_client_auth()
        .with_single_cert(
            vec![identity.certificate.clone()],
            PrivateKeyDer::Pkcs8(identity.key.clone_key()),
        )?;
    tls.alpn_protocols = vec![alpn.to_vec()];
    tls.max_early_data_size = 0;
    let quic = QuicServerConfig::try_from(tls)?;
    let mut config = quinn::ServerConfig::with_crypto(Arc::new(quic));
    config.transport_config(transport);
    config.migration(false);
    Ok(config)
}

/// The client side of a link to a listener whose certificate hashes to `pinned`,
/// with `transport` settings.
pub(crate) fn client_config(
    pinned: [u8; 32],
    transport: Arc<quinn::TransportConfig>,
    alpn: &[u8],
) -> Result<quinn::ClientConfig, QuicSetupError> {
    let provider = crypto_provider();
    let verifier = Arc::new(PinnedLeafVerifier {
        pinned,
        provider: provider.clone(),
    });
    let mut tls = rustls::ClientConfig::builder_with_provider(provider)
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

/// Waits, at most `limit`, until MTU discovery on the idle `connection` stops
/// raising the datagram size.
pub(crate) async fn settle_mtu(connection: &quinn::Connection, limit: Duration) {
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

/// Binds a UDP endpoint with large socket buffers and 64 KiB datagrams.
pub(crate) fn bind_endpoint(
    addr: SocketAddr,
    server: Option<quinn::ServerConfig>,
) -> Result<quinn::Endpoint, QuicSetupError> {
    let mut endpoint_config = quinn::EndpointConfig::default();
    endpoint_config
        .max_udp_payload_size(MAX_UDP_PAYLOAD)
        .expect("65527 is the largest valid UDP payload");
    crate::transport::bind_udp_endpoint(addr, server, endpoint_config)
        .map_err(|source| QuicSetupError::Bind { addr, source })
}

/// Accepts the server's certificate only if its SHA-256 is the pinned one; the
/// TLS 1.3 handshake signature then proves the server holds its key.
#[derive(Debug)]
struct PinnedLeafVerifier {
    pinned: [u8; 32],
    provider: Arc<rustls::crypto::CryptoProvider>,
}

impl ServerCertVerifier for PinnedLeafVerifier {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        _now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        if crate::tls::sha256(end_entity) == self.pinned {
            Ok(ServerCertVerified::assertion())
        } else {
            Err(rustls::Error::InvalidCertificate(
                rustls::CertificateError::ApplicationVerificationFailure,
            ))
        }
    }

    fn verify_tls12_signature(
        &self,
        _message: &[u8],
        _cert: &CertificateDer<'_>,
        _dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        // Only TLS 1.3 is offered.
        Err(rustls::Error::PeerIncompatible(
            rustls::PeerIncompatible::Tls12NotOffered,
        ))
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(
            message,
            cert,
            dss,
            &self.provider.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.provider
            .signature_verification_algorithms
            .supported_schemes()
    }
}

/// The QUIC connections (and endpoint) under one rank's links.
///
/// Closing a QUIC connection discards what it has not delivered yet, and a rank's
/// last collective returns once its bytes are handed to quinn, not once they
/// arrived. So [`QuicConnections::close`] closes in an order that loses nothing:
/// the connection from the previous rank first (every collective that read from it
/// has returned, so nothing more is needed from it), then it waits for the next rank
/// to do the same with the connection this rank sends on, which proves that rank
/// has read everything. Dropping without `close` closes at once (after a failure).
#[derive(Default)]
pub(crate) struct QuicConnections {
    /// The connection this rank sends data on (it is the client).
    pub(crate) to_next: Option<quinn::Connection>,
    /// The connection this rank receives data on (it is the server).
    pub(crate) from_prev: Option<quinn::Connection>,
    /// Kept so the connections' socket lives as long as they do.
    pub(crate) endpoint: Option<quinn::Endpoint>,
}

/// How long a closed endpoint may take to tell its peers.
const ENDPOINT_DRAIN: Duration = Duration::from_millis(200);

impl QuicConnections {
    /// Closes without losing bytes in flight, waiting at most `linger` for the next
    /// rank (which may still be computing) to finish reading.
    pub(crate) async fn close(mut self, linger: Duration) {
        if let Some(from_prev) = self.from_prev.take() {
            from_prev.close(0u32.into(), b"done");
        }
        if let Some(to_next) = self.to_next.take() {
            if tokio::time::timeout(linger, to_next.closed())
                .await
                .is_err()
            {
                tracing::warn!(
                    ?linger,
                    "the next rank did not close its link in time; closing anyway"
                );
            }
            to_next.close(0u32.into(), b"done");
        }
        if let Some(endpoint) = self.endpoint.take() {
            let _ = tokio::time::timeout(ENDPOINT_DRAIN, endpoint.wait_idle()).await;
        }
    }
}

impl Drop for QuicConnections {
    fn drop(&mut self) {
        for connection in [self.to_next.take(), self.from_prev.take()]
            .into_iter()
            .flatten()
        {
            connection.close(0u32.into(), b"communicator dropped");
        }
    }
}
