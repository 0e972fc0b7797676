//! Rendezvous of a trial's data-parallel workers: who is where.
//!
//! The head picks the meeting point and the secret when it places a gang: rank 0's
//! host and a port it reserved there (`MASTER_ADDR`, `MASTER_PORT`), and a
//! per-attempt token (`XP_COLLECTIVE_TOKEN`). Rank 0 serves a small store on that
//! port; every other rank connects, proves the token and says where its own data
//! listener is; once all W have arrived, rank 0 sends everyone the full table. A
//! rank that does not arrive within the timeout makes the store fail with an error
//! naming it, and every waiting rank is told which ranks are missing.
//!
//! Messages are length-prefixed bincode with a 64 KiB limit.

use std::collections::BTreeMap;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tracing::{debug, warn};

/// How long one connection has to say who it is.
const ARRIVAL_TIMEOUT: Duration = Duration::from_secs(5);
/// The largest rendezvous message.
pub const MAX_MESSAGE: usize = 64 << 10;

const LIMIT: bincode::config::Configuration<
    bincode::config::LittleEndian,
    bincode::config::Varint,
    bincode::config::Limit<MAX_MESSAGE>,
> = bincode::config::standard().with_limit::<MAX_MESSAGE>();

/// Where one rank's data listener is.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RankAddress {
    /// The rank.
    pub rank: u32,
    /// The host other ranks reach it at.
    pub host: String,
    /// Its data listener's port.
    pub port: u16,
    /// Identifies the machine, so ranks on one machine can use shared memory.
    pub machine: String,
    /// SHA-256 of its QUIC certificate, when it listens on QUIC.
    pub cert_sha256: Option<[u8; 32]>,
    /// Beside a QUIC listener, the TCP port for shared-memory links on its machine.
    pub shm_port: Option<u16>,
    /// Whether this rank can join an NCCL communicator (the `cuda` feature is on,
    /// libcuda and libnccl load, and it has a GPU).
    pub nccl_capable: bool,
    /// Rank 0 only: the NCCL unique id the gang's communicator is made from
    /// ([`NCCL_UNIQUE_ID_BYTES`] bytes), when rank 0 can use NCCL.
    #[serde(deserialize_with = "crate::wire_seq::option_vec")]
    pub nccl_id: Option<Vec<u8>>,
}

/// The length of an NCCL unique id (`NCCL_UNIQUE_ID_BYTES` in `nccl.h`).
pub const NCCL_UNIQUE_ID_BYTES: usize = 128;

/// The NCCL unique id every rank of `table` joins with, or `None` when the gang
/// does not use NCCL.
///
/// Every rank decides from the same table, so all of them join or none does: a
/// rank that joined alone would wait in NCCL's initialisation for peers that never
/// come. NCCL is used only when every rank can use it and rank 0 made an id of the
/// right length.
pub fn nccl_unique_id(table: &[RankAddress]) -> Option<[u8; NCCL_UNIQUE_ID_BYTES]> {
    if table.is_empty() || !table.iter().all(|address| address.nccl_capable) {
        return None;
    }
    let rank0 = table.iter().find(|address| address.rank == 0)?;
    rank0.nccl_id.as_deref()?.try_into().ok()
}

/// One message between a rank and rank 0's store: a 4-byte big-endian length,
/// then bincode of at most [`MAX_MESSAGE`] bytes. Public so that the hostile-input
/// tests can reach its decoder.
#[derive(Debug, Serialize, Deserialize)]
pub enum StoreMessage {
    /// A rank arrives: its token and address.
    Arrive {
        /// The per-attempt token, which rank 0 checks.
        token: [u8; 32],
        /// Where the rank's data listener is.
        address: RankAddress,
    },
    /// Everyone's addresses, in rank order.
    Table(#[serde(deserialize_with = "crate::wire_seq::vec")] Vec<RankAddress>),
    /// The rendezvous failed.
    Failed(String),
}

/// Why a rendezvous failed.
#[derive(Debug, thiserror::Error)]
pub enum RendezvousError {
    /// Some ranks never arrived.
    #[error(
        "rendezvous timed out after {after:?}: rank(s) {missing:?} of {world_size} did not arrive"
    )]
    Missing {
        /// The ranks that did not arrive.
        missing: Vec<u32>,
        /// The gang's size.
        world_size: u32,
        /// How long the store waited.
        after: Duration,
    },
    /// Rank 0 could not listen on the store's port.
    #[error("cannot serve the rendezvous store at {addr}")]
    Listen {
        /// The address it listens on.
        addr: String,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// Rank 0's store was not reachable.
    #[error("cannot reach rank 0's rendezvous store at {addr}")]
    Connect {
        /// The store's address.
        addr: String,
        /// The cause of the last attempt.
        #[source]
        source: std::io::Error,
    },
    /// Rank 0's store did not answer in time.
    #[error("cannot reach rank 0's rendezvous store at {addr}: no answer in time")]
    NoAnswer {
        /// The store's address.
        addr: String,
    },
    /// Rank 0's answer could not be read.
    #[error("cannot read the answer of rank 0's rendezvous store at {addr}")]
    Answer {
        /// The store's address.
        addr: String,
        /// The cause.
        #[source]
        source: MessageError,
    },
    /// The store reported a failure.
    #[error("rendezvous failed: {0}")]
    Failed(String),
    /// A message could not be written.
    #[error(transparent)]
    Message(#[from] MessageError),
    /// The store's table is not in rank order, or lacks this rank.
    #[error("rendezvous message error: the store's table is not in rank order")]
    TableOutOfOrder,
    /// The store sent an arrival, which only ranks send.
    #[error("rendezvous message error: unexpected arrival message from the store")]
    UnexpectedArrival,
    /// This rank's number is not below the gang's size.
    #[error("invalid rendezvous: rank {rank} is not below the world size {world_size}")]
    RankOutOfRange {
        /// This rank.
        rank: u32,
        /// The gang's size.
        world_size: u32,
    },
}

/// Why one store message could not be written or read.
#[derive(Debug, thiserror::Error)]
pub enum MessageError {
    /// The message could not be encoded.
    #[error("cannot encode a rendezvous message")]
    Encode(#[source] bincode::error::EncodeError),
    /// The message is longer than [`MAX_MESSAGE`].
    #[error("rendezvous message of {len} bytes exceeds {MAX_MESSAGE}")]
    TooLong {
        /// Its length.
        len: usize,
    },
    /// The stream failed.
    #[error("cannot {doing} a rendezvous message")]
    Io {
        /// `read` or `write`.
        doing: &'static str,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// The bytes are not a valid message.
    #[error("malformed rendezvous message")]
    Decode(#[source] bincode::error::DecodeError),
}

/// `message` behind its length, ready to write.
pub fn encode_message(message: &StoreMessage) -> Result<Vec<u8>, MessageError> {
    let body = bincode::serde::encode_to_vec(message, LIMIT).map_err(MessageError::Encode)?;
    let len = u32::try_from(body.len()).map_err(|_| MessageError::TooLong { len: body.len() })?;
    let mut framed = len.to_be_bytes().to_vec();
    framed.extend_from_slice(&body);
    Ok(framed)
}

async fn write_message(stream: &mut TcpStream, message: &StoreMessage) -> Result<(), MessageError> {
    stream
        .write_all(&encode_message(message)?)
        .await
        .map_err(|source| MessageError::Io {
            doing: "write",
            source,
        })
}

/// Reads one message; a length over [`MAX_MESSAGE`] is refused before anything
/// is allocated for it.
pub async fn read_message(
    stream: &mut (impl AsyncRead + Unpin),
) -> Result<StoreMessage, MessageError> {
    let failed = |source| MessageError::Io {
        doing: "read",
        source,
    };
    let len = stream.read_u32().await.map_err(failed)? as usize;
    if len > MAX_MESSAGE {
        return Err(MessageError::TooLong { len });
    }
    let mut body = vec![0u8; len];
    stream.read_exact(&mut body).await.map_err(failed)?;
    let (message, _) =
        bincode::serde::decode_from_slice(&body, LIMIT).map_err(MessageError::Decode)?;
    Ok(message)
}

/// Exchanges addresses with the other ranks and returns everyone's, in rank order.
///
/// Rank 0 serves the store on `store_port` (all interfaces); the others connect to
/// `store_host:store_port`, retrying until `timeout` while rank 0 starts.
pub async fn exchange(
    own: RankAddress,
    world_size: u32,
    store_host: &str,
    store_port: u16,
    token: [u8; 32],
    timeout: Duration,
) -> Result<Vec<RankAddress>, RendezvousError> {
    if own.rank >= world_size {
        return Err(RendezvousError::RankOutOfRange {
            rank: own.rank,
            world_size,
        });
    }
    if world_size == 1 {
        return Ok(vec![own]);
    }
    if own.rank == 0 {
        serve(own, world_size, store_port, token, timeout).await
    } else {
        join(own, store_host, store_port, token, timeout).await
    }
}

async fn serve(
    own: RankAddress,
    world_size: u32,
    port: u16,
    token: [u8; 32],
    timeout: Duration,
) -> Result<Vec<RankAddress>, RendezvousError> {
    let listener = TcpListener::bind(("0.0.0.0", port))
        .await
        .map_err(|source| RendezvousError::Listen {
            addr: format!("0.0.0.0:{port}"),
            source,
        })?;
    let deadline = tokio::time::Instant::now() + timeout;
    let own_rank = own.rank;
    // Each connection is read in its own task, so one silent connection cannot hold
    // up the others.
    let (arrivals_tx, mut arrivals_rx) =
        tokio::sync::mpsc::channel::<(RankAddress, TcpStream)>(world_size as usize);
    let mut readers = tokio::task::JoinSet::new();
    let mut arrived: BTreeMap<u32, (RankAddress, TcpStream)> = BTreeMap::new();
    while arrived.len() + 1 < world_size as usize {
        tokio::select! {
            () = tokio::time::sleep_until(deadline) => {
                let missing: Vec<u32> = (1..world_size).filter(|rank| !arrived.contains_key(rank)).collect();
                let error = RendezvousError::Missing { missing, world_size, after: timeout };
                for (_, (_, mut stream)) in arrived {
                    let _ = write_message(&mut stream, &StoreMessage::Failed(error.to_string())).await;
                }
                return Err(error);
            }
            accepted = listener.accept() => {
                let Ok((mut stream, peer)) = accepted else { continue };
                let arrivals = arrivals_tx.clone();
                readers.spawn(async move {
                    match tokio::time::timeout(ARRIVAL_TIMEOUT, read_message(&mut stream)).await {
                        Ok(Ok(StoreMessage::Arrive { token: presented, address }))
                            if blake3::hash(&presented) == blake3::hash(&token)
                                && address.rank < world_size
                                && address.rank != own_rank =>
                        {
                            debug!(rank = address.rank, %peer, "rank arrived at the rendezvous");
                            let _ = arrivals.send((address, stream)).await;
                        }
                        Ok(Ok(_)) => warn!(%peer, "rendezvous connection refused: wrong token or rank"),
                        Ok(Err(error)) => warn!(%peer, error = %crate::error_chain::error_chain(&error), "rendezvous connection refused: bad message"),
                        Err(_) => warn!(%peer, "rendezvous connection refused: no message in time"),
                    }
                });
            }
            Some((address, stream)) = arrivals_rx.recv() => {
                arrived.insert(address.rank, (address, stream));
            }
            Some(_) = readers.join_next(), if !readers.is_empty() => {}
        }
    }
    let mut table = vec![own];
    table.extend(arrived.values().map(|(address, _)| address.clone()));
    for (_, (_, mut stream)) in arrived {
        write_message(&mut stream, &StoreMessage::Table(table.clone())).await?;
    }
    Ok(table)
}

async fn join(
    own: RankAddress,
    host: &str,
    port: u16,
    token: [u8; 32],
    timeout: Duration,
) -> Result<Vec<RankAddress>, RendezvousError> {
    let addr = format!("{host}:{port}");
    let deadline = tokio::time::Instant::now() + timeout;
    let rank = own.rank;
    let mut stream = loop {
        match TcpStream::connect(&addr).await {
            Ok(stream) => break stream,
            Err(error) if tokio::time::Instant::now() < deadline => {
                debug!(%addr, %error, "rendezvous store not up yet; retrying");
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            Err(source) => return Err(RendezvousError::Connect { addr, source }),
        }
    };
    write_message(
        &mut stream,
        &StoreMessage::Arrive {
            token,
            address: own,
        },
    )
    .await?;
    // The store answers when everyone arrived or its own deadline passed; allow a little more.
    let answer =
        tokio::time::timeout_at(deadline + Duration::from_secs(5), read_message(&mut stream))
            .await
            .map_err(|_| RendezvousError::NoAnswer { addr: addr.clone() })?;
    match answer {
        Ok(StoreMessage::Table(table)) => {
            let ranks_ok = table
                .iter()
                .enumerate()
                .all(|(idx, address)| address.rank == idx as u32);
            if !ranks_ok || table.get(rank as usize).is_none() {
                return Err(RendezvousError::TableOutOfOrder);
            }
            Ok(table)
        }
        Ok(StoreMessage::Failed(reason)) => Err(RendezvousError::Failed(reason)),
        Ok(StoreMessage::Arrive { .. }) => Err(RendezvousError::UnexpectedArrival),
        Err(source) => Err(RendezvousError::Answer { addr, source }),
    }
}

/// A string identifying this machine (its host name and boot id), for same-machine checks.
pub fn machine_id() -> String {
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap_or_default();
    let boot = std::fs::read_to_string("/proc/sys/kernel/random/boot_id").unwrap_or_default();
    format!("{}/{}", host.trim(), boot.trim())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn address(rank: u32) -> RankAddress {
        RankAddress {
            rank,
            host: "127.0.0.1".to_owned(),
            port: 1000 + rank as u16,
            machine: "m".to_owned(),
            cert_sha256: None,
            shm_port: None,
            nccl_capable: false,
            nccl_id: None,
        }
    }

    #[test]
    fn nccl_is_used_only_when_every_rank_can_and_rank0_made_an_id() {
        let id = vec![9u8; NCCL_UNIQUE_ID_BYTES];
        let capable = |rank: u32| RankAddress {
            nccl_capable: true,
            nccl_id: (rank == 0).then(|| id.clone()),
            ..address(rank)
        };
        let all: Vec<RankAddress> = (0..3).map(capable).collect();
        assert_eq!(nccl_unique_id(&all), Some([9u8; NCCL_UNIQUE_ID_BYTES]));

        let mut one_without_gpu = all.clone();
        one_without_gpu[2].nccl_capable = false;
        assert_eq!(nccl_unique_id(&one_without_gpu), None);

        let mut short_id = all.clone();
        short_id[0].nccl_id = Some(vec![9u8; 16]);
        assert_eq!(nccl_unique_id(&short_id), None);

        let mut no_id = all;
        no_id[0].nccl_id = None;
        assert_eq!(nccl_unique_id(&no_id), None);
        assert_eq!(nccl_unique_id(&[]), None);
    }

    fn free_port() -> u16 {
        std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port()
    }

    #[tokio::test]
    async fn four_ranks_learn_everyone_in_rank_order() {
        let port = free_port();
        let token = [7u8; 32];
        let tasks: Vec<_> = (0..4)
            .map(|rank| {
                crate::task::spawn(
                    "rendezvous-test",
                    exchange(
                        address(rank),
                        4,
                        "127.0.0.1",
                        port,
                        token,
                        Duration::from_secs(10),
                    ),
                )
            })
            .collect();
        for task in tasks {
            let table = task.await.unwrap().unwrap();
            assert_eq!(table, (0..4).map(address).collect::<Vec<_>>());
        }
    }

    #[tokio::test]
    async fn a_missing_rank_is_named_and_a_wrong_token_is_refused() {
        let port = free_port();
        let token = [7u8; 32];
        let store = crate::task::spawn(
            "rendezvous-test",
            exchange(
                address(0),
                3,
                "127.0.0.1",
                port,
                token,
                Duration::from_millis(800),
            ),
        );
        let intruder = crate::task::spawn(
            "rendezvous-test",
            exchange(
                address(2),
                3,
                "127.0.0.1",
                port,
                [9u8; 32],
                Duration::from_millis(800),
            ),
        );
        let waiting = exchange(
            address(1),
            3,
            "127.0.0.1",
            port,
            token,
            Duration::from_millis(800),
        )
        .await;
        match store.await.unwrap() {
            Err(RendezvousError::Missing { missing, .. }) => assert_eq!(missing, vec![2]),
            other => panic!("expected rank 2 to be missing, got {other:?}"),
        }
        assert!(waiting.unwrap_err().to_string().contains("[2]"));
        assert!(intruder.await.unwrap().is_err());
    }
}
