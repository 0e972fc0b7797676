//! Connecting a ring: each rank binds a [`RingListener`], rendezvous (elsewhere)
//! shares every rank's [`PeerInfo`], then every rank calls [`connect_ring`], which
//! connects to the next rank and accepts the previous one at the same time.
//!
//! Roles: rank r is the client of the link r → r+1 and the server of r−1 → r. The
//! client speaks first (a hello with the token and its rank, see `wire`); the server
//! answers one byte once it trusts the hello. A connection with the wrong token,
//! the wrong rank or a malformed hello is dropped and logged, and the server keeps
//! waiting for the right one until the deadline.
//!
//! It does not retry a failed ring: a failure names the rank, and building a new
//! ring (new token, new listeners) is the caller's decision.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::time::Instant;
use tracing::{debug, instrument, warn};

use super::communicator::{Communicator, Engine};
use super::link::{FwdReader, FwdWriter, Links, RevReader, RevWriter, StreamReader, StreamWriter};
use super::quic::{self, QuicConnections};
use super::wire::{ACK, HELLO_BYTES, Hello, LinkKind, MAX_PATH_BYTES, token_matches};
use super::{CollectiveConfig, CollectiveError, PeerInfo, TransportKind, shm};
use crate::transport::{self, QuicSetupError, SelfSignedIdentity};

/// The answer of a server that trusts the hello but cannot open the shared-memory
/// file (another mount namespace, say): the link carries TCP frames instead.
const ACK_WITHOUT_SHM: u8 = 0x5A;
/// How long a server waits for the hello of one accepted connection.
const HELLO_TIMEOUT: Duration = Duration::from_secs(5);
/// The pause between attempts to reach a peer that is not listening yet.
const CONNECT_RETRY: Duration = Duration::from_millis(20);

enum Listening {
    Tcp(TcpListener),
    Quic {
        endpoint: quinn::Endpoint,
        identity: SelfSignedIdentity,
    },
}

/// A rank's bound listener, created before rendezvous so its port (and QUIC
/// certificate hash) can be shared.
pub struct RingListener {
    kind: TransportKind,
    listening: Listening,
    /// Beside a QUIC listener: where ranks on this host open shared-memory links.
    shm: Option<TcpListener>,
    local_addr: SocketAddr,
    config: CollectiveConfig,
}

impl std::fmt::Debug for RingListener {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RingListener")
            .field("kind", &self.kind)
            .field("local_addr", &self.local_addr)
            .finish_non_exhaustive()
    }
}

fn listener_error(source: std::io::Error, addr: SocketAddr) -> CollectiveError {
    CollectiveError::Listener {
        rank: u32::MAX,
        source: QuicSetupError::Bind { addr, source },
    }
}

impl RingListener {
    /// Binds a listener for `kind` on `host` (an address such as `127.0.0.1` or
    /// `0.0.0.0`) and an ephemeral port, with the default configuration.
    pub async fn bind(kind: TransportKind, host: &str) -> Result<Self, CollectiveError> {
        Self::bind_with(kind, host, CollectiveConfig::default()).await
    }

    /// As [`RingListener::bind`], with `config` for the QUIC server side and for
    /// the communicator [`connect_ring`] builds from it.
    pub async fn bind_with(
        kind: TransportKind,
        host: &str,
        config: CollectiveConfig,
    ) -> Result<Self, CollectiveError> {
        let addr = resolve(host, 0)
            .await
            .map_err(|source| CollectiveError::Connect {
                rank: u32::MAX,
                addr: host.to_owned(),
                source,
            })?;
        let (listening, local_addr) = match kind {
            TransportKind::Tcp | TransportKind::Shm => {
                let listener = TcpListener::bind(addr)
                    .await
                    .map_err(|source| listener_error(source, addr))?;
                let local_addr = listener
                    .local_addr()
                    .map_err(|source| listener_error(source, addr))?;
                (Listening::Tcp(listener), local_addr)
            }
            TransportKind::Quic => {
                let setup = |source| CollectiveError::Listener {
                    rank: u32::MAX,
                    source,
                };
                let identity = SelfSignedIdentity::generate().map_err(setup)?;
                // The server side only sends aborts back; data flows client to server.
                let transport_config =
                    transport::bulk_transport_config(&config.quic, config.timeout, false);
                let server = identity
                    .server_config(transport_config, quic::ALPN)
                    .map_err(setup)?;
                let endpoint = transport::bind_bulk_endpoint(addr, Some(server)).map_err(setup)?;
                let local_addr = endpoint
                    .local_addr()
                    .map_err(|source| listener_error(source, addr))?;
                (Listening::Quic { endpoint, identity }, local_addr)
            }
        };
        let shm = if kind == TransportKind::Quic && config.same_host_shm {
            // Without it, ranks on this host fall back to QUIC between them.
            match TcpListener::bind(SocketAddr::new(local_addr.ip(), 0)).await {
                Ok(listener) => Some(listener),
                Err(error) => {
                    debug!(%error, "no shared-memory listener: QUIC between local ranks");
                    None
                }
            }
        } else {
            None
        };
        Ok(Self {
            kind,
            listening,
            shm,
            local_addr,
            config,
        })
    }

    /// The port peers connect to.
    pub fn port(&self) -> u16 {
        self.local_addr.port()
    }

    /// The address the listener is bound to.
    pub fn local_addr(&self) -> SocketAddr {
        self.local_addr
    }

    /// For QUIC, the SHA-256 of this listener's certificate, which rendezvous hands
    /// to the previous rank so it can pin it.
    pub fn cert_sha256(&self) -> Option<[u8; 32]> {
        match &self.listening {
            Listening::Quic { identity, .. } => Some(identity.sha256),
            Listening::Tcp(_) => None,
        }
    }

    /// For QUIC, the TCP port where ranks on this host open shared-memory links.
    pub fn shm_port(&self) -> Option<u16> {
        self.shm
            .as_ref()
            .and_then(|listener| listener.local_addr().ok())
            .map(|addr| addr.port())
    }

    /// This listener's entry for rendezvous.
    pub fn peer_info(&self, rank: u32, host: &str, same_host: bool) -> PeerInfo {
        PeerInfo {
            rank,
            host: host.to_owned(),
            port: self.port(),
            same_host,
            cert_sha256: self.cert_sha256(),
            shm_port: self.shm_port(),
        }
    }
}

async fn resolve(host: &str, port: u16) -> std::io::Result<SocketAddr> {
    tokio::net::lookup_host((host, port))
        .await?
        .next()
        .ok_or_else(|| std::io::Error::new(std::io::ErrorKind::NotFound, "no address"))
}

/// Connects this rank into the ring described by `peers` (one entry per rank,
/// any order), with `timeout` both as the setup deadline and as the collectives'
/// timeout.
pub async fn connect_ring(
    listener: RingListener,
    rank: u32,
    peers: &[PeerInfo],
    kind: TransportKind,
    token: &[u8; 32],
    timeout: Duration,
) -> Result<Communicator, CollectiveError> {
    let config = CollectiveConfig {
        timeout,
        ..listener.config.clone()
    };
    connect_ring_with(listener, rank, peers, kind, token, config).await
}

/// As [`connect_ring`], with every knob in `config`; `config.timeout` bounds setup.
#[instrument(skip_all, fields(rank, kind = kind.name()))]
pub async fn connect_ring_with(
    listener: RingListener,
    rank: u32,
    peers: &[PeerInfo],
    kind: TransportKind,
    token: &[u8; 32],
    config: CollectiveConfig,
) -> Result<Communicator, CollectiveError> {
    let world_size = u32::try_from(peers.len()).map_err(|_| CollectiveError::InvalidPeers {
        rank,
        reason: "more than 2^32 peers",
    })?;
    if rank >= world_size {
        return Err(CollectiveError::InvalidRank { rank, world_size });
    }
    let mut ordered: Vec<Option<&PeerInfo>> = vec![None; peers.len()];
    for peer in peers {
        let slot = ordered
            .get_mut(peer.rank as usize)
            .ok_or(CollectiveError::InvalidPeers {
                rank: peer.rank,
                reason: "rank out of range",
            })?;
        if slot.replace(peer).is_some() {
            return Err(CollectiveError::InvalidPeers {
                rank: peer.rank,
                reason: "rank listed twice",
            });
        }
    }
    let listener_is_quic = matches!(listener.listening, Listening::Quic { .. });
    if listener_is_quic != (kind == TransportKind::Quic) {
        return Err(CollectiveError::InvalidPeers {
            rank,
            reason: "the listener was bound for another transport kind",
        });
    }
    if world_size == 1 {
        return Ok(Communicator::new(Engine::new(rank, 1, config, None)));
    }
    let next = (rank + 1) % world_size;
    let prev = (rank + world_size - 1) % world_size;
    let next_peer = ordered[next as usize].expect("every rank in 0..world_size is present");
    let deadline = Instant::now() + config.timeout;
    let setup = SetupContext {
        rank,
        next,
        prev,
        token: *token,
        deadline,
        config: config.clone(),
    };
    let links = match listener.listening {
        Listening::Tcp(tcp) => {
            let use_shm =
                (kind == TransportKind::Shm || config.same_host_shm) && next_peer.same_host;
            if kind == TransportKind::Shm && !use_shm {
                debug!(
                    rank,
                    next, "next rank is on another host: TCP instead of shared memory"
                );
            }
            let ((to_next, from_next), (from_prev, to_prev)) = tokio::try_join!(
                setup.connect_tcp(next_peer, use_shm),
                setup.accept_tcp(&tcp)
            )?;
            Links {
                to_next,
                from_next,
                from_prev,
                to_prev,
                quic: QuicConnections::default(),
            }
        }
        Listening::Quic { endpoint, .. } => {
            let prev_peer = ordered[prev as usize].expect("every rank in 0..world_size is present");
            // Per link: shared memory to a rank on this host (both ends decide alike
            // from the same table), QUIC otherwise.
            let shm_to_next = next_peer
                .shm_port
                .filter(|_| config.same_host_shm && next_peer.same_host);
            let shm_from_prev = listener
                .shm
                .as_ref()
                .filter(|_| config.same_host_shm && prev_peer.same_host);
            let outgoing = async {
                match shm_to_next {
                    Some(shm_port) => {
                        let shm_peer = PeerInfo {
                            port: shm_port,
                            ..next_peer.clone()
                        };
                        let (to_next, from_next) = setup.connect_tcp(&shm_peer, true).await?;
                        Ok((to_next, from_next, None))
                    }
                    None => {
                        let pinned =
                            next_peer.cert_sha256.ok_or(CollectiveError::InvalidPeers {
                                rank: next,
                                reason: "no certificate hash for a QUIC peer",
                            })?;
                        let (to_next, from_next, connection) =
                            setup.connect_quic(&endpoint, next_peer, pinned).await?;
                        Ok((to_next, from_next, Some(connection)))
                    }
                }
            };
            let incoming = async {
                match shm_from_prev {
                    Some(tcp) => {
                        let (from_prev, to_prev) = setup.accept_tcp(tcp).await?;
                        Ok((from_prev, to_prev, None))
                    }
                    None => {
                        let (from_prev, to_prev, connection) =
                            setup.accept_quic(&endpoint, prev_peer.same_host).await?;
                        Ok((from_prev, to_prev, Some(connection)))
                    }
                }
            };
            let (outgoing, incoming) = tokio::try_join!(outgoing, incoming)?;
            let (to_next, from_next, client_connection) = outgoing;
            let (from_prev, to_prev, server_connection) = incoming;
            Links {
                to_next,
                from_next,
                from_prev,
                to_prev,
                quic: QuicConnections {
                    to_next: client_connection,
                    from_prev: server_connection,
                    endpoint: Some(endpoint),
                },
            }
        }
    };
    let [to_next, from_prev] = links.transports();
    debug!(rank, world_size, to_next, from_prev, "ring connected");
    Ok(Communicator::new(Engine::new(
        rank,
        world_size,
        config,
        Some(links),
    )))
}

struct SetupContext {
    rank: u32,
    next: u32,
    prev: u32,
    token: [u8; 32],
    deadline: Instant,
    config: CollectiveConfig,
}

impl SetupContext {
    fn remaining(&self) -> Duration {
        self.deadline.saturating_duration_since(Instant::now())
    }

    fn hello(&self, kind: LinkKind, stream: u32, extra: u16) -> Hello {
        Hello {
            kind,
            token: self.token,
            rank: self.rank,
            stream,
            extra,
        }
    }

    /// Checks a hello from the previous rank; logs and returns false if untrusted.
    fn trusts(&self, hello: Option<&Hello>, from: SocketAddr) -> bool {
        match hello {
            None => {
                warn!(rank = self.rank, %from, "refused a ring connection: not a collective hello");
                false
            }
            Some(hello) if !token_matches(&hello.token, &self.token) => {
                warn!(rank = self.rank, %from, "refused a ring connection: wrong token");
                false
            }
            Some(hello) if hello.rank != self.prev => {
                warn!(
                    rank = self.rank,
                    %from,
                    claimed = hello.rank,
                    expected = self.prev,
                    "refused a ring connection: not the previous rank"
                );
                false
            }
            Some(_) => true,
        }
    }

    /// Connects to the next rank over TCP and offers it a shared-memory ring
    /// when `use_shm` (it may decline, and the link stays on TCP).
    async fn connect_tcp(
        &self,
        peer: &PeerInfo,
        use_shm: bool,
    ) -> Result<(FwdWriter, RevReader), CollectiveError> {
        let connect_error = self.connect_error(peer);
        let mut stream = self.dial_next(peer).await?;
        let ring = if use_shm {
            self.create_shm_ring()
        } else {
            None
        };
        let introduced = tokio::time::timeout(
            self.remaining(),
            self.introduce(&mut stream, ring.as_ref().map(|(path, _)| path)),
        )
        .await;
        if let Some((path, _)) = &ring {
            // The reader has mapped it (or never will): the name is no longer needed.
            let _ = std::fs::remove_file(path);
        }
        let answer = match introduced {
            Err(_) => {
                return Err(CollectiveError::PeerTimeout {
                    rank: self.next,
                    after: self.config.timeout,
                });
            }
            Ok(Err(error)) if error.kind() == std::io::ErrorKind::ConnectionReset => None,
            Ok(Err(error)) => return Err(connect_error(error)),
            Ok(Ok(answer)) => answer,
        };
        let (read_half, write_half) = stream.into_split();
        match (answer, ring) {
            (Some(ACK), Some((_, ring))) => Ok((
                FwdWriter::Shm(ring.into_writer(write_half)),
                RevReader::new(Box::new(read_half)),
            )),
            (Some(ACK | ACK_WITHOUT_SHM), _) => Ok((
                FwdWriter::Streams(vec![StreamWriter::new(Box::new(write_half))]),
                RevReader::new(Box::new(read_half)),
            )),
            (None, _) => Err(CollectiveError::Refused { rank: self.next }),
            (Some(_), _) => Err(CollectiveError::Protocol { rank: self.next }),
        }
    }

    /// The error for a failed connection to the next rank at `peer`.
    fn connect_error(&self, peer: &PeerInfo) -> impl Fn(std::io::Error) -> CollectiveError {
        let rank = self.next;
        let addr = format!("{}:{}", peer.host, peer.port);
        move |source| CollectiveError::Connect {
            rank,
            addr: addr.clone(),
            source,
        }
    }

    /// A TCP connection to the next rank, retried while it is not listening yet
    /// and the deadline allows.
    async fn dial_next(&self, peer: &PeerInfo) -> Result<TcpStream, CollectiveError> {
        let connect_error = self.connect_error(peer);
        let addr = resolve(&peer.host, peer.port)
            .await
            .map_err(&connect_error)?;
        let stream = loop {
            match tokio::time::timeout(self.remaining(), TcpStream::connect(addr)).await {
                Ok(Ok(stream)) => break stream,
                Ok(Err(error)) if self.remaining() > CONNECT_RETRY => {
                    debug!(rank = self.rank, next = self.next, %error, "next rank not reachable yet");
                    tokio::time::sleep(CONNECT_RETRY).await;
                }
                Ok(Err(error)) => return Err(connect_error(error)),
                Err(_) => {
                    return Err(CollectiveError::PeerTimeout {
                        rank: self.next,
                        after: self.config.timeout,
                    });
                }
            }
        };
        stream.set_nodelay(true).map_err(&connect_error)?;
        Ok(stream)
    }

    /// A new shared-memory ring to offer the next rank, or `None` (and TCP) when
    /// one cannot be made or its path would not fit in a hello.
    fn create_shm_ring(&self) -> Option<(PathBuf, shm::RingFile)> {
        let directory = shm::ring_directory();
        match shm::create_ring(&directory, self.config.shm_ring_bytes) {
            Ok((path, ring)) if path.as_os_str().len() <= MAX_PATH_BYTES => Some((path, ring)),
            Ok((path, _)) => {
                let _ = std::fs::remove_file(&path);
                debug!(rank = self.rank, "shared-memory path too long: TCP instead");
                None
            }
            Err(error) => {
                debug!(rank = self.rank, %error, "cannot create a shared-memory ring: TCP instead");
                None
            }
        }
    }

    /// Sends the hello (with the ring's path, when offering one) and reads the
    /// next rank's one-byte answer; `None` when it closed without answering.
    async fn introduce(
        &self,
        stream: &mut TcpStream,
        ring_path: Option<&PathBuf>,
    ) -> std::io::Result<Option<u8>> {
        match ring_path {
            Some(path) => {
                let path_bytes = path.as_os_str().as_encoded_bytes();
                let extra =
                    u16::try_from(path_bytes.len()).expect("checked against MAX_PATH_BYTES");
                stream
                    .write_all(&self.hello(LinkKind::Shm, 0, extra).encode())
                    .await?;
                stream.write_all(path_bytes).await?;
            }
            None => {
                stream
                    .write_all(&self.hello(LinkKind::Tcp, 0, 0).encode())
                    .await?
            }
        }
        let mut answer = [0u8; 1];
        match stream.read_exact(&mut answer).await {
            Ok(_) => Ok(Some(answer[0])),
            Err(error) if error.kind() == std::io::ErrorKind::UnexpectedEof => Ok(None),
            Err(error) => Err(error),
        }
    }

    async fn accept_tcp(
        &self,
        listener: &TcpListener,
    ) -> Result<(FwdReader, RevWriter), CollectiveError> {
        loop {
            let accepted = tokio::time::timeout(self.remaining(), listener.accept()).await;
            let (mut stream, from) = match accepted {
                Err(_) => {
                    return Err(CollectiveError::PeerTimeout {
                        rank: self.prev,
                        after: self.config.timeout,
                    });
                }
                Ok(Err(error)) => {
                    debug!(rank = self.rank, %error, "accept failed");
                    continue;
                }
                Ok(Ok(accepted)) => accepted,
            };
            let wait = self.remaining().min(HELLO_TIMEOUT);
            let mut bytes = [0u8; HELLO_BYTES];
            let hello = match tokio::time::timeout(wait, stream.read_exact(&mut bytes)).await {
                Ok(Ok(_)) => Hello::decode(&bytes),
                _ => None,
            };
            if !self.trusts(hello.as_ref(), from) {
                continue;
            }
            let hello = hello.expect("trusted hellos exist");
            let _ = stream.set_nodelay(true);
            let ring = match hello.kind {
                LinkKind::Shm => {
                    let len = usize::from(hello.extra).min(MAX_PATH_BYTES);
                    let mut path = vec![0u8; len];
                    if tokio::time::timeout(wait, stream.read_exact(&mut path))
                        .await
                        .is_err()
                    {
                        warn!(rank = self.rank, %from, "ring connection sent no shared-memory path");
                        continue;
                    }
                    let path = PathBuf::from(String::from_utf8_lossy(&path).into_owned());
                    match shm::open_ring(&path) {
                        Ok(ring) => Some(ring),
                        Err(error) => {
                            debug!(rank = self.rank, %error, "cannot open the shared-memory ring: TCP instead");
                            None
                        }
                    }
                }
                LinkKind::Tcp => None,
                LinkKind::Quic => {
                    warn!(rank = self.rank, %from, "refused a ring connection: QUIC hello over TCP");
                    continue;
                }
            };
            let answer = if hello.kind == LinkKind::Shm && ring.is_none() {
                ACK_WITHOUT_SHM
            } else {
                ACK
            };
            if stream.write_all(&[answer]).await.is_err() {
                continue;
            }
            let (read_half, write_half) = stream.into_split();
            let reader = match ring {
                Some(ring) => FwdReader::Shm(ring.into_reader(read_half)),
                None => FwdReader::Streams(vec![StreamReader::new(Box::new(read_half))]),
            };
            return Ok((reader, RevWriter::new(Box::new(write_half))));
        }
    }

    async fn connect_quic(
        &self,
        endpoint: &quinn::Endpoint,
        peer: &PeerInfo,
        pinned: [u8; 32],
    ) -> Result<(FwdWriter, RevReader, quinn::Connection), CollectiveError> {
        let addr_text = format!("{}:{}", peer.host, peer.port);
        let addr =
            resolve(&peer.host, peer.port)
                .await
                .map_err(|source| CollectiveError::Connect {
                    rank: self.next,
                    addr: addr_text.clone(),
                    source,
                })?;
        let quic_error = |reason: String| CollectiveError::Quic {
            rank: self.next,
            reason,
        };
        let transport_config = transport::bulk_transport_config(
            &self.config.quic,
            self.config.timeout,
            peer.same_host,
        );
        let client = transport::bulk_client_config(pinned, transport_config, quic::ALPN).map_err(
            |source| CollectiveError::Listener {
                rank: self.rank,
                source,
            },
        )?;
        let exchange = async {
            let connection = endpoint
                .connect_with(client, addr, transport::SELF_SIGNED_SERVER_NAME)
                .map_err(|error| quic_error(error.to_string()))?
                .await
                .map_err(|error| quic_error(error.to_string()))?;
            let streams = self.config.quic.streams.max(1);
            let mut writers = Vec::new();
            let mut first_recv = None;
            for index in 0..streams {
                let (mut send, recv) = connection
                    .open_bi()
                    .await
                    .map_err(|error| quic_error(error.to_string()))?;
                let count = u16::try_from(streams).unwrap_or(u16::MAX);
                send.write_all(&self.hello(LinkKind::Quic, index, count).encode())
                    .await
                    .map_err(|error| quic_error(error.to_string()))?;
                writers.push(StreamWriter::with_max_write(
                    Box::new(send),
                    quic::MAX_WRITE_BYTES,
                ));
                if index == 0 {
                    first_recv = Some(recv);
                }
            }
            let mut recv = first_recv.expect("at least one stream");
            let mut answer = [0u8; 1];
            match recv.read_exact(&mut answer).await {
                Ok(()) if answer[0] == ACK => {}
                Ok(()) => return Err(CollectiveError::Protocol { rank: self.next }),
                Err(_) => return Err(CollectiveError::Refused { rank: self.next }),
            }
            transport::settle_mtu(
                &connection,
                self.config.quic.mtu_settle.min(self.remaining()),
            )
            .await;
            Ok((
                FwdWriter::Streams(writers),
                RevReader::new(Box::new(recv)),
                connection,
            ))
        };
        tokio::time::timeout(self.remaining(), exchange)
            .await
            .unwrap_or(Err(CollectiveError::PeerTimeout {
                rank: self.next,
                after: self.config.timeout,
            }))
    }

    async fn accept_quic(
        &self,
        endpoint: &quinn::Endpoint,
        same_host: bool,
    ) -> Result<(FwdReader, RevWriter, quinn::Connection), CollectiveError> {
        loop {
            let incoming = match tokio::time::timeout(self.remaining(), endpoint.accept()).await {
                Err(_) | Ok(None) => {
                    return Err(CollectiveError::PeerTimeout {
                        rank: self.prev,
                        after: self.config.timeout,
                    });
                }
                Ok(Some(incoming)) => incoming,
            };
            let from = incoming.remote_address();
            let wait = self.remaining().min(HELLO_TIMEOUT);
            let attempt = async {
                let connection = incoming.await.ok()?;
                let (send, mut recv) = connection.accept_bi().await.ok()?;
                let mut bytes = [0u8; HELLO_BYTES];
                recv.read_exact(&mut bytes).await.ok()?;
                Some((connection, send, recv, Hello::decode(&bytes)))
            };
            let Ok(Some((connection, mut send, recv, hello))) =
                tokio::time::timeout(wait, attempt).await
            else {
                warn!(rank = self.rank, %from, "refused a ring connection: no QUIC hello");
                continue;
            };
            if !self.trusts(hello.as_ref(), from) {
                connection.close(1u32.into(), b"refused");
                continue;
            }
            let hello = hello.expect("trusted hellos exist");
            let streams = u32::from(hello.extra).max(1);
            if hello.kind != LinkKind::Quic || hello.stream != 0 || streams > 64 {
                warn!(rank = self.rank, %from, "refused a ring connection: bad QUIC hello");
                connection.close(1u32.into(), b"refused");
                continue;
            }
            let mut readers = vec![StreamReader::new(Box::new(recv))];
            let more = async {
                for index in 1..streams {
                    let (other_send, mut other_recv) = connection.accept_bi().await.ok()?;
                    let mut bytes = [0u8; HELLO_BYTES];
                    other_recv.read_exact(&mut bytes).await.ok()?;
                    let other = Hello::decode(&bytes)?;
                    if other.stream != index || !token_matches(&other.token, &self.token) {
                        return None;
                    }
                    // The reverse half of extra streams is unused; it stays open
                    // with the connection.
                    drop(other_send);
                    readers.push(StreamReader::new(Box::new(other_recv)));
                }
                Some(())
            };
            if !matches!(tokio::time::timeout(wait, more).await, Ok(Some(()))) {
                warn!(rank = self.rank, %from, "refused a ring connection: bad QUIC streams");
                connection.close(1u32.into(), b"refused");
                continue;
            }
            if same_host {
                let window = quinn::VarInt::from_u64(self.config.quic.same_host_window_bytes)
                    .unwrap_or(quinn::VarInt::MAX);
                connection.set_receive_window(window);
            }
            if send.write_all(&[ACK]).await.is_err() {
                continue;
            }
            return Ok((
                FwdReader::Streams(readers),
                RevWriter::new(Box::new(send)),
                connection,
            ));
        }
    }
}

/// Binds `world` listeners on 127.0.0.1 and connects them into one ring inside
/// this process, for tests and benches.
pub async fn local_ring(
    world: u32,
    kind: TransportKind,
) -> Result<Vec<Communicator>, CollectiveError> {
    local_ring_with(world, kind, CollectiveConfig::default()).await
}

/// As [`local_ring`], with `config` for every rank.
pub async fn local_ring_with(
    world: u32,
    kind: TransportKind,
    config: CollectiveConfig,
) -> Result<Vec<Communicator>, CollectiveError> {
    let mut listeners = Vec::new();
    for _ in 0..world {
        listeners.push(RingListener::bind_with(kind, "127.0.0.1", config.clone()).await?);
    }
    let peers: Vec<PeerInfo> = listeners
        .iter()
        .enumerate()
        .map(|(rank, listener)| listener.peer_info(rank as u32, "127.0.0.1", true))
        .collect();
    let token: [u8; 32] = rand::random();
    let tasks: Vec<_> = listeners
        .into_iter()
        .enumerate()
        .map(|(rank, listener)| {
            let peers = peers.clone();
            let config = config.clone();
            crate::task::spawn("collective-local-ring", async move {
                connect_ring_with(listener, rank as u32, &peers, kind, &token, config).await
            })
        })
        .collect();
    let mut communicators = Vec::new();
    for (rank, task) in tasks.into_iter().enumerate() {
        let communicator = task
            .await
            .map_err(|_| CollectiveError::Shutdown { rank: rank as u32 })??;
        communicators.push(communicator);
    }
    Ok(communicators)
}
