//! From SIGTERM to leaving: the node's drain.
//!
//! On SIGTERM during a session the node tells the head it is draining
//! (`NodeMessage::Draining`, so nothing more is placed here and the stopped
//! trials are requeued elsewhere), refuses new launches, and stops every worker
//! with SIGTERM and [`drain_grace`] of the drain timeout before SIGKILL. It
//! leaves once every worker has ended and the head has acknowledged every
//! report (so no end is lost), lingering briefly for the head to close the
//! connection, or at the deadline, whichever comes first. Without a session it
//! leaves at once, giving its workers what is left of the drain.
//!
//! Invariant: the node leaves at the latest at SIGTERM plus the drain timeout,
//! and its `Leave` names that deadline.

use std::time::{Duration, Instant};

use tracing::{info, warn};
use xp_runtime::protocol::NodeMessage;

use super::{Action, NodeCore, Phase};
use crate::worker::MAX_KILL_GRACE;

/// How long a node takes at most from SIGTERM to its exit by default: under
/// Slurm's default `KillWait` (30 s), after which Slurm sends SIGKILL.
pub const DEFAULT_DRAIN_TIMEOUT: Duration = Duration::from_secs(20);
/// The shortest drain: a second for workers to checkpoint, a second for the head.
pub(crate) const MIN_DRAIN_TIMEOUT: Duration = Duration::from_secs(2);
/// The longest a drained node waits for the head to close the connection.
pub(crate) const CLOSE_LINGER: Duration = Duration::from_secs(2);

/// Checks a `--drain-timeout`: between 2 s (a second for workers to checkpoint,
/// a second for the head) and 10 min, the longest grace a worker may have.
pub fn check_drain_timeout(timeout: Duration) -> Result<Duration, DrainTimeoutError> {
    if (MIN_DRAIN_TIMEOUT..=MAX_KILL_GRACE).contains(&timeout) {
        Ok(timeout)
    } else {
        Err(DrainTimeoutError::OutOfRange { timeout })
    }
}

/// Why a `--drain-timeout` is refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum DrainTimeoutError {
    /// Outside 2 s to 10 min.
    #[error(
        "the drain timeout must be between {} and {}",
        humantime::format_duration(MIN_DRAIN_TIMEOUT),
        humantime::format_duration(MAX_KILL_GRACE)
    )]
    OutOfRange {
        /// The timeout asked for.
        timeout: Duration,
    },
}

/// Of the time left to drain, what workers get between SIGTERM and SIGKILL: all
/// but a quarter (at least a second), which is kept for storing a checkpoint a
/// worker printed as it exited and for the head to acknowledge the ends.
pub(crate) fn drain_grace(left: Duration) -> Duration {
    left.saturating_sub((left / 4).max(Duration::from_secs(1)))
}

/// A drain under way.
#[derive(Debug, Clone, Copy)]
pub(super) struct Drain {
    /// When the node leaves at the latest.
    pub(super) deadline: Instant,
}

impl NodeCore {
    /// SIGTERM (or Ctrl-C): drain, or leave at once without a session.
    pub(crate) fn handle_shutdown(&mut self, now: Instant) {
        if self.is_shutting_down() {
            return;
        }
        // The drain begins: its deadline is fixed from here.
        self.drain_deadline(now);
        if !matches!(self.phase, Phase::Session(_)) {
            self.leave(now, "node shutting down", false);
            return;
        }
        let grace = drain_grace(self.config.drain_timeout);
        info!(workers = self.workers.len(), ?grace, timeout = ?self.config.drain_timeout, "draining: stopping workers so they checkpoint and move elsewhere");
        // Tell the head first, so nothing more is placed here and the stopped
        // trials are requeued elsewhere.
        self.actions.push_back(Action::Send(NodeMessage::Draining));
        self.stop_every_worker("node draining", grace);
        self.check_drained(now);
    }

    /// When the drain must be over; the drain begins with the first call.
    pub(super) fn drain_deadline(&mut self, now: Instant) -> Instant {
        let timeout = self.config.drain_timeout;
        self.drain
            .get_or_insert(Drain {
                deadline: now + timeout,
            })
            .deadline
    }

    /// Leaves once the drain is done: every worker has ended and the head has
    /// acknowledged every report.
    pub(super) fn check_drained(&mut self, now: Instant) {
        let draining = self.drain.is_some() && matches!(self.phase, Phase::Session(_));
        if draining && self.workers.is_empty() && self.outbox.unacked().next().is_none() {
            info!("drained: every worker stopped and its end stored by the head");
            self.leave_session(now);
        }
    }

    /// Leaves at the drain's deadline, whatever is still running.
    pub(super) fn check_drain_deadline(&mut self, now: Instant) {
        let Some(drain) = self.drain else {
            return;
        };
        if now >= drain.deadline && matches!(self.phase, Phase::Session(_)) {
            warn!(
                workers = self.workers.len(),
                unacknowledged = self.outbox.unacked().count(),
                "drain timeout reached; leaving"
            );
            self.leave_session(now);
        }
    }

    /// Ends the session of a drain that is over, giving the head a moment to
    /// read to the end and close its side, and leaves.
    fn leave_session(&mut self, now: Instant) {
        let deadline = self.drain_deadline(now);
        self.actions.push_back(Action::CloseSession {
            linger_until: Some(deadline.min(now + CLOSE_LINGER)),
        });
        self.leave(now, "node shutting down", false);
    }
}
