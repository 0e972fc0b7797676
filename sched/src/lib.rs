//! The scheduling policy core: pure (no I/O, time passed in), shared by the head
//! and by `xp sim`.
//!
//! The head's actor feeds a [`PolicyCore`] with nodes, submissions and
//! terminations, asks it to [`PolicyCore::decide`] and carries out the returned
//! [`Decision`]s; the simulator drives the very same core with a simulated clock.
//!
//! - [`config`]: the policy file (queues, cohorts, quotas, priority classes, aging,
//!   preemption, backfill, admission) and the built-in presets.
//! - [`place`]: the node pool and gang placement (bin-pack or spread, fewest nodes
//!   then same rack, label and GPU-model constraints, fractional GPUs).
//! - `scheduler` (private; [`PolicyCore`] and [`InvariantViolation`] are
//!   re-exported here): queue ordering, quotas and borrowing, fair share,
//!   backfill reservations, preemption and the reasons trials wait, one file per
//!   part of a decision pass.
//! - [`sim`]: the trace-driven simulator behind `xp sim`, which drives the same
//!   core on a simulated clock and reports what it did.
//!
//! Invariants (property-tested in the tests of `scheduler` and [`place`]): no node resource is ever
//! over-allocated; a gang is placed whole or not at all; quotas and borrowing and
//! lending limits hold after every decision; only lower-priority or borrowed work
//! is preempted; with aging on, every trial that fits the cluster is eventually
//! placed.

pub mod config;
pub mod place;
mod scheduler;
pub mod sim;

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use xp_runtime::clock::UnixMillis;
use xp_runtime::ids::{NodeId, TrialId};

pub use self::config::{PolicyConfig, PolicyError};
pub use self::scheduler::{AdoptError, InvariantViolation, PolicyCore};

/// GPU thousandths in one whole GPU.
pub const GPU_MILLI: u64 = 1000;

/// An amount of each schedulable resource. GPUs count in thousandths so that
/// fractional GPUs add up exactly.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Amount {
    /// GPU thousandths (1000 is one whole GPU).
    pub gpu_milli: u64,
    /// CPU thousandths (1000 is one core).
    pub cpu_milli: u64,
    /// Memory bytes.
    pub memory_bytes: u64,
}

/// One machine as the policy sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeSpec {
    /// The node.
    pub id: NodeId,
    /// Whole GPUs, indexed 0..gpus.
    pub gpus: u32,
    /// The GPU model (such as `A100`), when known.
    pub gpu_model: Option<String>,
    /// CPU thousandths offered.
    pub cpu_milli: u64,
    /// Memory bytes offered.
    pub memory_bytes: u64,
    /// Labels such as `rack=r1`; `rack` groups nodes for gang topology.
    pub labels: BTreeMap<String, String>,
}

/// The shape of a gang: `workers` identical workers placed together or not at all.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GangShape {
    /// Workers started together.
    pub workers: u32,
    /// What each worker needs. `gpu_milli` below 1000 is a fraction of one GPU
    /// (packed onto a shared GPU); otherwise it is a whole multiple of 1000.
    pub per_worker: Amount,
    /// Acceptable GPU models; empty accepts any.
    pub gpu_models: Vec<String>,
    /// Labels a node must carry, all of them.
    pub node_labels: BTreeMap<String, String>,
    /// Spread workers over nodes instead of packing them.
    pub spread: bool,
}

/// A trial handed to the policy.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TrialRequest {
    /// The trial; its experiment groups trials for duration estimates.
    pub id: TrialId,
    /// The owning team.
    pub team: String,
    /// The queue; `None` means the team's default queue (see [`config`]).
    pub queue: Option<String>,
    /// The base priority, already resolved from a priority class name.
    pub priority: i64,
    /// What it needs.
    pub gang: GangShape,
    /// `false` means it is never preempted.
    pub preemptible: bool,
    /// The longest it runs; used for backfill.
    pub time_limit_ms: Option<u64>,
    /// When it was first submitted; FIFO order and aging count from here.
    pub submitted_at: UnixMillis,
}

/// A share of one GPU given to one worker.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct GpuShare {
    /// The GPU's index on its node.
    pub index: u32,
    /// Thousandths of that GPU (1000 for a whole GPU).
    pub milli: u32,
}

/// Where one worker of a gang runs and what it holds there.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct WorkerPlacement {
    /// The node.
    pub node: NodeId,
    /// The GPU shares; empty for CPU-only workers.
    pub gpus: Vec<GpuShare>,
    /// CPU thousandths held.
    pub cpu_milli: u64,
    /// Memory bytes held.
    pub memory_bytes: u64,
}

/// Why a running trial is asked to stop.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum PreemptReason {
    /// A trial of higher priority needs the resources.
    HigherPriority {
        /// The trial that needs them.
        by: TrialId,
        /// Its priority.
        priority: i64,
    },
    /// The victim's queue borrowed quota that its lender now reclaims.
    Reclaim {
        /// The queue taking its quota back.
        queue: String,
        /// The trial that needs it.
        by: TrialId,
    },
}

/// What the policy wants done.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decision {
    /// Start the trial's gang here, worker `i` on `workers[i]`. The core counts the
    /// resources as held from now on.
    Place {
        /// The trial.
        trial: TrialId,
        /// One placement per worker, in rank order.
        workers: Vec<WorkerPlacement>,
    },
    /// Ask the trial to checkpoint and stop within `grace_ms`; its resources stay
    /// held until the caller reports it with [`PolicyCore::requeue`].
    Preempt {
        /// The victim.
        trial: TrialId,
        /// Why.
        reason: PreemptReason,
        /// How long it may take to checkpoint before it is killed.
        grace_ms: u64,
    },
}

/// Why a waiting trial is not running.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum WaitReason {
    /// An admin put it on hold.
    Held,
    /// Starting it would take its queue past its quota plus what it may borrow.
    OverQuota {
        /// The resource that runs out: `gpu`, `cpu` or `memory`.
        resource: String,
    },
    /// No set of nodes has room for the whole gang now.
    GangDoesNotFit,
    /// No node satisfies its constraints (labels, GPU model, size), even when empty.
    NoMatchingNodes,
    /// Trials ahead of it (higher priority, or earlier in FIFO order) go first.
    BehindHigherPriority,
    /// The resources it would use are reserved for another trial.
    ReservedFor {
        /// The trial holding the reservation.
        trial: TrialId,
    },
    /// It was placed or preempted work is stopping for it; it starts soon.
    WaitingForPreemption,
    /// The core has not looked at it yet.
    NotYetConsidered,
}

impl std::fmt::Display for WaitReason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Held => write!(f, "held by an admin"),
            Self::OverQuota { resource } => write!(f, "over quota ({resource})"),
            Self::GangDoesNotFit => write!(f, "gang does not fit"),
            Self::NoMatchingNodes => write!(f, "no node matches its constraints"),
            Self::BehindHigherPriority => write!(f, "behind higher priority"),
            Self::ReservedFor { trial } => write!(f, "resources reserved for {trial}"),
            Self::WaitingForPreemption => write!(f, "waiting for preempted work to stop"),
            Self::NotYetConsidered => write!(f, "not yet considered"),
        }
    }
}

/// Why a submission is refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Refusal {
    /// The team has too many pending trials; try again later.
    #[error(
        "team {team} has {pending} pending trials (limit {limit}); retry after {retry_after_ms} ms"
    )]
    TooManyPending {
        /// The team.
        team: String,
        /// Its pending trials.
        pending: u64,
        /// The limit.
        limit: u64,
        /// A hint for when to retry.
        retry_after_ms: u64,
    },
    /// No queue takes this team's work.
    #[error("no queue {queue:?} for team {team}")]
    UnknownQueue {
        /// The team.
        team: String,
        /// The queue asked for, or the team's default.
        queue: String,
    },
    /// The gang's shape is invalid (such as 1.5 GPUs per worker).
    #[error("invalid request: {0}")]
    Invalid(String),
    /// The trial is already known to the core.
    #[error("trial {0} is already scheduled")]
    Duplicate(TrialId),
}

/// One queue's standing, for `xp queue` and the simulator's report.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct QueueUsage {
    /// The queue.
    pub name: String,
    /// Its team.
    pub team: String,
    /// Its cohort, if any.
    pub cohort: Option<String>,
    /// Its fair-share weight.
    pub weight: f64,
    /// What its running trials hold.
    pub usage: Amount,
    /// Its nominal quota.
    pub quota: Amount,
    /// How much of `usage` is beyond its quota, borrowed from the cohort.
    pub borrowed: Amount,
    /// How much of its idle quota others in the cohort use.
    pub lent: Amount,
    /// Trials waiting in it.
    pub pending: u64,
    /// Trials running in it.
    pub running: u64,
    /// Its weighted dominant-resource share (usage's largest fraction of the
    /// cluster, divided by the weight); lower goes first.
    pub dominant_share: f64,
}
