//! Joining a trial's gang for collectives ([`TrialContext::collective`]): read
//! where and how to meet from the node's environment, bind this rank's data
//! listener, exchange addresses at rank 0's rendezvous store, then connect the
//! ring (and NCCL beside it, with the `cuda` feature, when every rank can).
//!
//! Not here: the collectives themselves (`xp_runtime::collective`), and the
//! rendezvous protocol (`xp_runtime::rendezvous`).
//!
//! [`TrialContext::collective`]: super::TrialContext::collective

use std::time::Duration;

use xp_runtime::collective::{
    BlockingCommunicator, BlockingRingListener, CollectiveConfig, PeerInfo, TransportKind,
};
use xp_runtime::rendezvous::{self, RankAddress, machine_id};

use super::{WorkerError, env, env_number, env_secret};

/// How long a rank waits for the others when `XP_COLLECTIVE_TIMEOUT_S` is unset.
const DEFAULT_TIMEOUT: Duration = Duration::from_secs(60);

/// What the node's environment says about the gang.
struct GangEnv {
    /// The per-attempt secret every rank presents.
    token: [u8; 32],
    /// The transport the ring uses.
    kind: TransportKind,
    /// Rank 0's host and the port of its rendezvous store.
    master_addr: String,
    master_port: u16,
    /// The host other ranks reach this one at.
    host: String,
    /// How long to wait for the other ranks.
    timeout: Duration,
}

impl GangEnv {
    fn read() -> Result<Self, WorkerError> {
        let token = env_secret("XP_COLLECTIVE_TOKEN")?;
        let kind = match env("XP_COLLECTIVE_TRANSPORT")?.as_str() {
            "quic" => TransportKind::Quic,
            "tcp" => TransportKind::Tcp,
            "shm" => TransportKind::Shm,
            other => {
                return Err(WorkerError::Env {
                    name: "XP_COLLECTIVE_TRANSPORT",
                    reason: format!("unknown transport {other:?}"),
                });
            }
        };
        Ok(Self {
            token,
            kind,
            master_addr: env("MASTER_ADDR")?,
            master_port: env_number("MASTER_PORT")?,
            host: env("XP_NODE_HOST")?,
            timeout: std::env::var("XP_COLLECTIVE_TIMEOUT_S")
                .ok()
                .and_then(|text| text.parse().ok())
                .map_or(DEFAULT_TIMEOUT, Duration::from_secs),
        })
    }
}

/// Joins the gang as `rank` of `world_size` and returns the connected ring.
pub(super) fn join_gang(rank: u32, world_size: u32) -> Result<BlockingCommunicator, WorkerError> {
    // 1. Where and how to meet.
    let gang = GangEnv::read()?;
    // 2. This rank's data listener.
    let listener = BlockingRingListener::bind(gang.kind, "0.0.0.0", CollectiveConfig::default())
        .map_err(|source| WorkerError::Collective {
            doing: "bind the ring listener",
            source,
        })?;
    // 3. Everyone's addresses, from rank 0's store.
    let machine = machine_id();
    let own = own_address(rank, &gang.host, &listener, &machine);
    let table = meet(&gang, own, world_size)?;
    // 4. NCCL, decided by every rank from the same table.
    #[cfg(feature = "cuda")]
    let nccl = rendezvous::nccl_unique_id(&table)
        .map(|id| {
            // Device 0 is this worker's first GPU: the node hides the others.
            xp_runtime::nccl::NcclCommunicator::new(0, rank, world_size, id)
        })
        .transpose()
        .map_err(WorkerError::Nccl)?;
    // 5. The ring.
    let peers = peers_of(table, &machine);
    #[cfg_attr(
        not(feature = "cuda"),
        expect(unused_mut, reason = "NCCL attaches with cuda")
    )]
    let mut communicator = listener
        .connect_ring(rank, &peers, gang.kind, &gang.token, gang.timeout)
        .map_err(|source| WorkerError::Collective {
            doing: "connect the ring",
            source,
        })?;
    #[cfg(feature = "cuda")]
    if let Some(nccl) = nccl {
        communicator.attach_nccl(nccl);
    }
    Ok(communicator)
}

/// This rank's entry in the rendezvous table.
fn own_address(
    rank: u32,
    host: &str,
    listener: &BlockingRingListener,
    machine: &str,
) -> RankAddress {
    let (nccl_capable, nccl_id) = nccl_offer(rank);
    RankAddress {
        rank,
        host: host.to_owned(),
        port: listener.port(),
        machine: machine.to_owned(),
        cert_sha256: listener.cert_sha256(),
        shm_port: listener.shm_port(),
        nccl_capable,
        nccl_id,
    }
}

/// Exchanges addresses at rank 0's store, on a small runtime of its own (the
/// worker API is synchronous).
fn meet(
    gang: &GangEnv,
    own: RankAddress,
    world_size: u32,
) -> Result<Vec<RankAddress>, WorkerError> {
    let meeting = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(WorkerError::RendezvousRuntime)?;
    meeting
        .block_on(rendezvous::exchange(
            own,
            world_size,
            &gang.master_addr,
            gang.master_port,
            gang.token,
            gang.timeout,
        ))
        .map_err(WorkerError::Rendezvous)
}

/// The ring's view of the table: each rank's address, and whether it shares
/// this machine.
fn peers_of(table: Vec<RankAddress>, machine: &str) -> Vec<PeerInfo> {
    table
        .into_iter()
        .map(|address| PeerInfo {
            rank: address.rank,
            same_host: address.machine == machine,
            host: address.host,
            port: address.port,
            cert_sha256: address.cert_sha256,
            shm_port: address.shm_port,
        })
        .collect()
}

/// What this rank brings to the gang's NCCL decision: whether it can join, and on
/// rank 0 the unique id everyone joins with (see `rendezvous::nccl_unique_id`).
#[cfg(feature = "cuda")]
fn nccl_offer(rank: u32) -> (bool, Option<Vec<u8>>) {
    if let Err(reason) = xp_runtime::nccl::usable_here() {
        tracing::debug!(%reason, "this rank does not use NCCL");
        return (false, None);
    }
    if rank != 0 {
        return (true, None);
    }
    match xp_runtime::nccl::unique_id() {
        Ok(id) => (true, Some(id.to_vec())),
        Err(error) => {
            tracing::warn!(%error, "no NCCL unique id; the gang uses host collectives only");
            (false, None)
        }
    }
}

/// Without the `cuda` feature a rank never joins NCCL.
#[cfg(not(feature = "cuda"))]
fn nccl_offer(_rank: u32) -> (bool, Option<Vec<u8>>) {
    (false, None)
}
