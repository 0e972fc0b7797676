//! The scheduling policy core: pure (no I/O, time passed in), shared by the head
//! and by `xp sim`.
//!
//! The head's actor feeds a [`PolicyCore`] with nodes, submissions and
//! terminations, asks it to [`PolicyCore::decide`] and carries out the returned
//! [`Decision`]s; the simulator drives the very same core with a simulated clock.
//!
//! - [`config`]: the policy file (queues, cohorts, quotas, priority classes, aging,
//!   preemption, backfill, admission) and the built-in presets.
//! - [`dag`]: dependency graphs: topological order, cycles, the critical path
//!   and slack, duration estimates (pipelines in the head, pipeline workloads in
//!   [`sim`]).
//! - [`place`]: the node pool and gang placement (bin-pack or spread, fewest nodes
//!   then same rack, label and GPU-model constraints, fractional GPUs).
//! - `scheduler` (private; [`PolicyCore`] and [`InvariantViolation`] are
//!   re-exported here): queue ordering, quotas and borrowing, fair share,
//!   backfill reservations, preemption and the reasons trials wait, one file per
//!   part of a decision pass.
//! - [`odds`]: the conflict odds of shared resources (`1 − Π(1 − p_i)`).
//! - [`sim`]: the trace-driven simulator behind `xp sim`, which drives the same
//!   core on a simulated clock and reports what it did.
//!
//! Invariants (property-tested in the tests of `scheduler` and [`place`]): no node resource is ever
//! over-allocated; no lease is granted beyond its capacity; a gang is placed whole or not at all; quotas and borrowing and
//! lending limits hold after every decision; only lower-priority or borrowed work
//! is preempted; with aging on, every trial that fits the cluster is eventually
//! placed.

pub mod config;
pub mod dag;
pub mod odds;
pub mod place;
mod scheduler;
pub mod sim;

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use xp_runtime::clock::UnixMillis;
use xp_runtime::ids::{NodeId, TrialId};

pub use self::config::{PolicyConfig, PolicyError};
pub use self::scheduler::{AdoptError, AttainedService, InvariantViolation, PolicyCore};

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
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
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
    /// Units of named leases the whole gang holds while it runs (once for the
    /// gang, not per worker), by lease name.
    pub leases: BTreeMap<String, u64>,
    /// Whether its fractional workers opt in to the policy's
    /// `oversubscription`: placed at their share divided by the factor (see
    /// [`oversubscribed_charge`]), and evictable for GPU memory.
    pub oversubscribe: bool,
}

/// The oversubscription charge rule, shared with the head and the node.
pub use xp_runtime::spec::oversubscribed_charge;

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
    /// Goes before trials of its queue with equal effective priority and less
    /// urgency (0 is none): a pipeline stage on its critical path. Ignored under
    /// `order: fifo`; never beats priority, quotas or fair share.
    pub urgency: u32,
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
    /// A trial of its queue and priority that has received less GPU time
    /// (a lower attained-service level) needs the resources.
    LessService {
        /// The trial that needs them.
        by: TrialId,
        /// Its level.
        level: u8,
        /// The victim's level.
        victim_level: u8,
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
    /// Resize an elastic trial's gang: ask its workers to checkpoint and stop
    /// within `grace_ms`, then (once the caller reports them gone with
    /// [`PolicyCore::resized`]) start it again on `workers`, resuming from that
    /// checkpoint. A growth holds the new workers' resources from now on; a
    /// shrink keeps holding the dropped ones until the old gang is gone.
    Resize {
        /// The elastic trial.
        trial: TrialId,
        /// Its gang now, in rank order.
        from: u32,
        /// Where its workers go once restarted, in rank order; its old
        /// placement's first ranks keep their places.
        workers: Vec<WorkerPlacement>,
        /// Why.
        reason: ResizeReason,
        /// How long it may take to checkpoint before it is killed.
        grace_ms: u64,
    },
}

/// Why an elastic trial's gang changes size.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum ResizeReason {
    /// GPUs were idle and no trial waited: it grows into them.
    Grow,
    /// A trial that the scheduler would otherwise preempt for needs room: it
    /// shrinks (not below its minimum) instead of being stopped outright.
    Shrink {
        /// The waiting trial that needs the room.
        by: TrialId,
    },
}

impl std::fmt::Display for ResizeReason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Grow => write!(f, "GPUs idle and no trial waiting"),
            Self::Shrink { by } => write!(f, "{by} (higher priority) needs the GPUs"),
        }
    }
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
    /// Nothing waiting fits in what is free now, so the pass stopped before
    /// it: it waits for room.
    GangDoesNotFit,
    /// What is free now does not hold it (one worker) or its whole gang.
    NoRoom {
        /// Its workers.
        workers: u32,
        /// What each needs.
        per_worker: Amount,
        /// What is free on the schedulable nodes, all together.
        free: Amount,
    },
    /// No node satisfies its constraints (labels, GPU model, size), even when empty.
    NoMatchingNodes,
    /// No node is schedulable: none has joined, or every one is lost or draining.
    NoNodes,
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
    /// Not enough units of this lease are free (or trials ahead of it wait
    /// for the same lease).
    WaitingForLease {
        /// The lease.
        lease: String,
    },
    /// The preemption that would make room for it waits for an admin's
    /// approval.
    WaitingForApproval {
        /// The pending approval request.
        request: u64,
    },
}

/// `1 GPU, 2 CPUs, 4.0 GiB`: the parts of `amount` that are not zero.
fn amount_words(amount: &Amount) -> String {
    let mut parts = Vec::new();
    let units = |milli: u64, one: &str, many: &str| {
        let value = milli as f64 / 1000.0;
        let unit = if milli == 1000 { one } else { many };
        if milli.is_multiple_of(1000) {
            format!("{} {unit}", milli / 1000)
        } else {
            format!("{value:.2} {unit}")
        }
    };
    if amount.gpu_milli > 0 {
        parts.push(units(amount.gpu_milli, "GPU", "GPUs"));
    }
    if amount.cpu_milli > 0 {
        parts.push(units(amount.cpu_milli, "CPU", "CPUs"));
    }
    if amount.memory_bytes > 0 {
        parts.push(format!(
            "{:.1} GiB",
            amount.memory_bytes as f64 / f64::from(1u32 << 30)
        ));
    }
    if parts.is_empty() {
        "nothing".to_owned()
    } else {
        parts.join(", ")
    }
}

impl std::fmt::Display for WaitReason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Held => write!(f, "held by an admin"),
            Self::OverQuota { resource } => write!(f, "over quota ({resource})"),
            Self::GangDoesNotFit => write!(
                f,
                "waiting for room: nothing waiting fits in what is free now"
            ),
            Self::NoRoom {
                workers: 1,
                per_worker,
                free,
            } => write!(
                f,
                "waiting for room: it needs {}; free now: {}",
                amount_words(per_worker),
                amount_words(free)
            ),
            Self::NoRoom {
                workers,
                per_worker,
                free,
            } => write!(
                f,
                "waiting for room: its gang of {workers} workers needs {} each, on nodes that hold them at once; free now: {}",
                amount_words(per_worker),
                amount_words(free)
            ),
            Self::NoMatchingNodes => write!(
                f,
                "no node matches its constraints (labels, GPU model, or a node large enough), even empty"
            ),
            Self::NoNodes => write!(
                f,
                "no node is schedulable: none has joined (start one with `xp-node join`), or all are lost or draining"
            ),
            Self::BehindHigherPriority => write!(f, "behind higher priority"),
            Self::ReservedFor { trial } => write!(f, "resources reserved for {trial}"),
            Self::WaitingForPreemption => write!(f, "waiting for preempted work to stop"),
            Self::NotYetConsidered => write!(f, "not yet considered"),
            Self::WaitingForLease { lease } => write!(f, "waiting for lease {lease}"),
            Self::WaitingForApproval { request } => {
                write!(f, "waiting for approval of preemption request {request}")
            }
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
    /// The trial asks for a lease the policy does not declare, or for more
    /// units than the lease has: it could never start.
    #[error("lease {lease}: {reason}")]
    Lease {
        /// The lease.
        lease: String,
        /// What is wrong.
        reason: String,
    },
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
    /// Lease units its running trials hold, by lease.
    pub leases: BTreeMap<String, u64>,
    /// Its lease quotas, by lease (a lease not named is unlimited).
    pub lease_quota: BTreeMap<String, u64>,
}

/// A preemption the policy wants that waits for an admin, because the
/// victim's queue says `preemption: {approval: manual}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ApprovalRequest {
    /// Its id, increasing.
    pub id: u64,
    /// The running trial that would be stopped.
    pub victim: TrialId,
    /// The waiting trial that wants its room.
    pub claimant: TrialId,
    /// Why the policy wants it.
    pub reason: PreemptReason,
    /// When it was first asked.
    pub at: UnixMillis,
}

/// One lease's standing, for `xp leases`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LeaseUsage {
    /// The lease.
    pub name: String,
    /// Its capacity in units.
    pub capacity: u64,
    /// Units held by placed trials (running or stopping).
    pub held: u64,
    /// The placed trials holding units, by id.
    pub holders: Vec<LeaseHolder>,
    /// The waiting (or held) trials that ask for units, by id.
    pub waiters: Vec<LeaseHolder>,
}

/// A trial holding or wanting units of a lease.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LeaseHolder {
    /// The trial.
    pub trial: TrialId,
    /// Its team.
    pub team: String,
    /// The units.
    pub units: u64,
}

/// What became of an approval request.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum ApprovalVerdict {
    /// The preemption may go ahead.
    Approve,
    /// It may not; not asked again while victim and claimant stay as they are.
    Deny,
}

/// An approval decision the core cannot take.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ApprovalError {
    /// No pending request has this id (decided already, withdrawn, or never made).
    #[error("no pending preemption request {0}")]
    NotPending(u64),
}
