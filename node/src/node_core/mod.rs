//! What the node agent decides, as a sans-io state machine: when to connect
//! to the head and how long to wait, what to register and resend on a new
//! session, which launches to start or refuse, which workers to stop (the
//! head's kills, the eviction watch's choices, a drain), when a drain is over,
//! and when the node leaves.
//!
//! [`NodeCore`] is driven by events and time: the agent (`agent`, the shell)
//! turns the head's commands, worker reports, evictions, connection outcomes
//! and SIGTERM into `handle_*(now, …)` calls, fires `handle_timeout(now)` at
//! [`NodeCore::poll_timeout`], and performs each [`Action`] that
//! [`NodeCore::poll_action`] hands out (connect, write a message, start or stop
//! a worker, carry out an order on the object store, close the session,
//! leave). The core does no I/O, never reads the clock and never spawns.
//!
//! Files: `session.rs` (connecting, back-off, registering, resending,
//! heartbeats, the session's end), `workers.rs` (launch admission, stops,
//! evictions, reports and the outbox), `drain.rs` (SIGTERM to leaving).
//!
//! Not here: the numbering of reports (`outbox`), the back-off's delays
//! (`reconnect`), GPU shares (`slots`), which worker the eviction watch picks
//! (`telemetry::eviction`), and everything a worker does once started
//! (`worker`).
//!
//! Invariants (the seeded property test in `tests.rs` checks them over random
//! event orderings):
//! - A worker is asked to stop at most once, and only while it is live.
//! - A live worker holds its GPU shares, and a worker holds none once its end
//!   was reported.
//! - Messages are written only on a session: between its registration and
//!   its close.
//! - No worker starts after SIGTERM, and the node leaves at the latest at
//!   SIGTERM plus the drain timeout.

mod drain;
mod session;
#[cfg(test)]
mod tests;
mod workers;

use std::collections::{BTreeMap, VecDeque};
use std::time::{Duration, Instant};

use xp_runtime::ids::{NodeId, ObjectId, TrialId, WorkerKey};
use xp_runtime::protocol::{
    FetchPath, Launch, NodeMessage, ObjectCapability, ObjectRules, ObjectSource, RevocationEntry,
};

pub use self::drain::{DEFAULT_DRAIN_TIMEOUT, DrainTimeoutError, check_drain_timeout};
pub(crate) use self::session::MAX_OBJECT_CHANGES;
use crate::objects::Owner;
use crate::outbox::Outbox;
use crate::reconnect::Backoff;
use crate::slots::SlotTable;
use crate::worker::StopRequest;

/// What the core is told once, at the start.
#[derive(Debug, Clone, Copy)]
pub(crate) struct CoreConfig {
    /// Seeds the back-off between connection attempts.
    pub(crate) node_id: NodeId,
    /// The most time from SIGTERM to leaving.
    pub(crate) drain_timeout: Duration,
    /// Telemetry runs, and with it the eviction watch on GPU memory.
    pub(crate) memory_watched: bool,
}

/// What the agent must do, in the order handed out.
#[derive(Debug)]
pub(crate) enum Action {
    /// Try to open a session with the head; the outcome comes back through
    /// [`NodeCore::handle_connected`] or [`NodeCore::handle_connect_failed`].
    Connect,
    /// Register on the new session (`NodeMessage::Register`), naming these
    /// workers as running: the live ones and those whose end the head has not
    /// acknowledged.
    Register {
        /// Sorted, without duplicates.
        running: Vec<WorkerKey>,
    },
    /// Write this message on the session.
    Send(NodeMessage),
    /// Prepare and start a worker for this launch (its GPU shares are held).
    Start(Box<Launch>),
    /// Stop a live worker.
    Stop {
        /// The worker.
        key: WorkerKey,
        /// Why, and with what grace.
        request: StopRequest,
    },
    /// A worker's end was reported: forget its task and its pass to the local
    /// object channel.
    Forget(WorkerKey),
    /// Read a piece of a worker's log and answer the head (`NodeMessage::Logs`).
    ReadLogs {
        /// The head's request.
        request_id: u64,
        /// The worker.
        key: WorkerKey,
        /// The stream offset to read from.
        offset: u64,
        /// The most bytes to answer.
        max_bytes: u32,
        /// The worker has ended: nothing more will be written.
        complete: bool,
    },
    /// Fetch a checkpoint's objects from other nodes and keep them pinned for
    /// `trial`; tell the head which could not be fetched.
    Replicate {
        /// The trial that owns them.
        trial: TrialId,
        /// Each object and its size.
        objects: Vec<(ObjectId, u64)>,
        /// The nodes that hold them.
        sources: Vec<ObjectSource>,
        /// The path their bytes take.
        path: FetchPath,
    },
    /// Pin the objects this node holds for `trial`.
    Pin {
        /// The trial.
        trial: TrialId,
        /// The objects.
        objects: Vec<ObjectId>,
    },
    /// Delete objects (from the backup too), as `trial`'s or anybody's.
    DropObjects {
        /// The owner giving them up; `None`: whoever holds them.
        trial: Option<TrialId>,
        /// The objects.
        objects: Vec<ObjectId>,
    },
    /// Collect what `owner` alone kept.
    ReleaseOwner(Owner),
    /// Apply the head's rules for the object server (quotas, revocations in force).
    ObjectRules(ObjectRules),
    /// Refuse these capabilities on the object server from now on.
    RevokeCapabilities(Vec<RevocationEntry>),
    /// Hand these new capabilities to their attempts' workers from now on.
    RenewCapabilities(Vec<ObjectCapability>),
    /// End the session: stop reading, and close the connection, first waiting
    /// until `linger_until` for the head to close its side (so nothing in
    /// flight is discarded) when given.
    CloseSession {
        /// How long the head may take to read to the end; `None`: close now.
        linger_until: Option<Instant>,
    },
    /// Leave: wait until `deadline` for every worker task to end (abort the
    /// rest), then stop. No action follows.
    Leave {
        /// The drain's deadline.
        deadline: Instant,
        /// The head refused this node's credentials (the agent's error).
        refused: bool,
    },
}

impl Action {
    /// Whether the action writes on the session, and so is moot once it ended.
    fn is_for_session(&self) -> bool {
        matches!(self, Self::Register { .. } | Self::Send(_))
    }
}

/// Where the node stands with the head.
#[derive(Debug)]
enum Phase {
    /// A connection attempt is under way.
    Connecting,
    /// The next attempt waits until then.
    Waiting { until: Instant },
    /// A session is open.
    Session(Session),
    /// The node has left; nothing more happens.
    Left,
}

/// One session with the head.
#[derive(Debug)]
struct Session {
    /// The head answered the registration.
    registered: bool,
    /// The period of this session's heartbeats.
    heartbeat: Duration,
    /// When the next heartbeat is due.
    next_heartbeat: Instant,
}

/// A live worker: started, its end not yet reported.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Worker {
    /// It was asked to stop (the head's kill, an eviction, the drain).
    stopping: bool,
}

/// The agent's decisions; see the module documentation.
#[derive(Debug)]
pub(crate) struct NodeCore {
    config: CoreConfig,
    phase: Phase,
    workers: BTreeMap<WorkerKey, Worker>,
    slots: SlotTable,
    outbox: Outbox,
    backoff: Backoff,
    /// The heartbeat period the head asked for at the last registration (1 s
    /// before any), used from the next session on.
    heartbeat: Duration,
    /// SIGTERM's drain, once it began.
    drain: Option<drain::Drain>,
    actions: VecDeque<Action>,
}

impl NodeCore {
    /// A core that wants to connect at once (the first [`Action::Connect`] is
    /// waiting).
    pub(crate) fn new(config: CoreConfig) -> Self {
        Self {
            config,
            phase: Phase::Connecting,
            workers: BTreeMap::new(),
            slots: SlotTable::default(),
            outbox: Outbox::default(),
            backoff: Backoff::new(config.node_id),
            heartbeat: Duration::from_secs(1),
            drain: None,
            actions: VecDeque::from([Action::Connect]),
        }
    }

    /// The next thing to do.
    pub(crate) fn poll_action(&mut self) -> Option<Action> {
        self.actions.pop_front()
    }

    /// When [`Self::handle_timeout`] is due: the next heartbeat, the drain's
    /// deadline or the next connection attempt.
    pub(crate) fn poll_timeout(&self) -> Option<Instant> {
        match &self.phase {
            Phase::Session(session) => {
                let deadline = self.drain.as_ref().map(|drain| drain.deadline);
                Some(deadline.map_or(session.next_heartbeat, |deadline| {
                    deadline.min(session.next_heartbeat)
                }))
            }
            Phase::Waiting { until } => Some(*until),
            Phase::Connecting | Phase::Left => None,
        }
    }

    /// Time has come to `now`: a heartbeat, the end of a back-off, or the end
    /// of the drain.
    pub(crate) fn handle_timeout(&mut self, now: Instant) {
        match &mut self.phase {
            Phase::Session(session) => {
                if now >= session.next_heartbeat {
                    session.next_heartbeat = now + session.heartbeat;
                    self.actions.push_back(Action::Send(NodeMessage::Heartbeat));
                }
                self.check_drain_deadline(now);
            }
            Phase::Waiting { until } if now >= *until => {
                self.phase = Phase::Connecting;
                self.actions.push_back(Action::Connect);
            }
            Phase::Waiting { .. } | Phase::Connecting | Phase::Left => {}
        }
    }

    /// Whether SIGTERM was handled: the drain began, or the node left.
    pub(crate) fn is_shutting_down(&self) -> bool {
        self.drain.is_some() || matches!(self.phase, Phase::Left)
    }

    /// Leaves: every live worker not yet stopping is stopped with what is left
    /// of the drain (the whole drain timeout when it had not begun), and the
    /// agent waits for them until the drain's deadline.
    fn leave(&mut self, now: Instant, reason: &str, refused: bool) {
        let deadline = self.drain_deadline(now);
        let grace = drain::drain_grace(deadline.saturating_duration_since(now));
        self.stop_every_worker(reason, grace);
        self.phase = Phase::Left;
        self.actions.push_back(Action::Leave { deadline, refused });
    }

    /// Stops every live worker that is not stopping yet.
    fn stop_every_worker(&mut self, reason: &str, grace: Duration) {
        for (key, worker) in &mut self.workers {
            if !worker.stopping {
                worker.stopping = true;
                self.actions.push_back(Action::Stop {
                    key: *key,
                    request: StopRequest::with_grace(reason, grace),
                });
            }
        }
    }
}
