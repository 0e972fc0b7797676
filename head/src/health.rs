//! The head's health: whether it can store what it is asked to change.
//!
//! The actor publishes a [`Health`] on a watch channel whenever it changes, and
//! `/healthz` answers from it. An [`Outage`] is the actor's account of a storage
//! failure: since when, why, how much it refused or deferred, and when to probe
//! for room again. [`LogThrottle`] keeps a repeating failure to one log line every
//! few seconds, with a count of what it left out.
//!
//! [`ActorPulse`] is when the actor last handled its tick: a tick waits in the
//! actor's mailbox behind everything sent before it, so a late tick means a
//! long queue, and `/healthz` says so rather than `ok`.
//!
//! Nothing here does I/O, and nothing but [`ActorPulse`] reads a clock (the
//! monotonic one); the judgements take the times as arguments.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use tokio::sync::watch;
use xp_runtime::clock::UnixMillis;
use xp_runtime::protocol::{ErrorCode, RemoteError};

use crate::registry::RegistryError;

/// How often the actor probes for room to re-open its database during an outage.
pub(crate) const PROBE_INTERVAL_MS: u64 = 1_000;

/// The least time between two log lines about the same ongoing failure.
pub(crate) const LOG_INTERVAL_MS: u64 = 10_000;

/// Whether the head can do its work.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Health {
    /// It stores and acknowledges changes.
    Healthy,
    /// It cannot store changes: it refuses new work and serves reads from what it stored.
    CannotStore {
        /// Why, in words ("its disk is full (…)").
        reason: String,
        /// When the outage began.
        since: UnixMillis,
    },
}

impl Health {
    /// What is wrong, or `None` when healthy.
    pub(crate) fn problem(&self) -> Option<String> {
        match self {
            Self::Healthy => None,
            Self::CannotStore { reason, .. } => {
                Some(format!("the head cannot store anything: {reason}"))
            }
        }
    }
}

/// How long the actor may go without handling its tick (sent every 250 ms)
/// before `/healthz` reports it as stalled.
pub(crate) const STALL_MS: u64 = 5_000;

/// When the actor last handled its tick, in milliseconds of a monotonic
/// clock shared by the actor (which beats) and `/healthz` (which looks).
#[derive(Debug, Clone)]
pub(crate) struct ActorPulse {
    epoch: tokio::time::Instant,
    last_ms: Arc<AtomicU64>,
}

impl ActorPulse {
    /// A pulse that beat now.
    pub(crate) fn new() -> Self {
        Self {
            epoch: tokio::time::Instant::now(),
            last_ms: Arc::new(AtomicU64::new(0)),
        }
    }

    fn now_ms(&self) -> u64 {
        u64::try_from(self.epoch.elapsed().as_millis()).unwrap_or(u64::MAX)
    }

    /// The actor handled its tick.
    pub(crate) fn beat(&self) {
        self.last_ms.store(self.now_ms(), Ordering::Relaxed);
    }

    /// Why the head is unhealthy, if its actor has not kept up.
    pub(crate) fn problem(&self) -> Option<String> {
        stall_problem(self.last_ms.load(Ordering::Relaxed), self.now_ms())
    }
}

/// Why the head is unhealthy when its actor last handled its tick at
/// `last_ms` and it is `now_ms`, if it is.
fn stall_problem(last_ms: u64, now_ms: u64) -> Option<String> {
    let late = now_ms.saturating_sub(last_ms);
    (late > STALL_MS).then(|| {
        format!(
            "the head actor has not kept up for {} s: its queue of work is long, and requests wait",
            late / 1_000
        )
    })
}

/// The receiving end of the head's health, for the HTTP server.
pub(crate) type HealthWatch = watch::Receiver<Health>;

/// A repeating condition, logged at most once per interval.
#[derive(Debug, Clone)]
pub(crate) struct LogThrottle {
    interval_ms: u64,
    last: Option<UnixMillis>,
    suppressed: u64,
}

impl LogThrottle {
    /// A throttle that admits one line per `interval_ms`.
    pub(crate) const fn new(interval_ms: u64) -> Self {
        Self {
            interval_ms,
            last: None,
            suppressed: 0,
        }
    }

    /// Counts one occurrence at `now`: `Some(left_out)` when it should be logged,
    /// with how many occurrences were left out since the last line.
    pub(crate) fn admit(&mut self, now: UnixMillis) -> Option<u64> {
        let due = self
            .last
            .is_none_or(|last| now >= last.saturating_add(self.interval_ms));
        if due {
            self.last = Some(now);
            Some(std::mem::take(&mut self.suppressed))
        } else {
            self.suppressed += 1;
            None
        }
    }
}

/// A storage outage: the database is closed after a failed write.
#[derive(Debug)]
pub(crate) struct Outage {
    /// When it began.
    pub since: UnixMillis,
    /// Whether the last failure was a full disk (or an exhausted quota).
    pub disk_full: bool,
    /// The last failure, in words.
    pub cause: String,
    /// When to probe for room next.
    pub next_probe: UnixMillis,
    /// Probes that failed.
    pub probes: u64,
    /// Requests refused.
    pub refused: u64,
    /// Node messages deferred (left unacknowledged, to be resent).
    pub deferred: u64,
    /// Paces the log lines while it lasts.
    pub log: LogThrottle,
}

impl Outage {
    /// An outage that began at `now` with `error`.
    pub(crate) fn new(now: UnixMillis, error: &RegistryError) -> Self {
        let mut log = LogThrottle::new(LOG_INTERVAL_MS);
        // The first line is the caller's, logged as the outage begins.
        log.admit(now);
        Self {
            since: now,
            disk_full: error.is_disk_full(),
            cause: error.to_string(),
            next_probe: now.saturating_add(PROBE_INTERVAL_MS),
            probes: 0,
            refused: 0,
            deferred: 0,
            log,
        }
    }

    /// Why nothing can be stored, in words.
    pub(crate) fn reason(&self) -> String {
        if self.disk_full {
            format!("its disk is full ({})", self.cause)
        } else {
            format!("its database failed ({})", self.cause)
        }
    }

    /// The answer to a request that would change something.
    pub(crate) fn refusal(&self) -> RemoteError {
        RemoteError::new(
            ErrorCode::StorageUnavailable,
            format!(
                "the head cannot store anything: {}; nothing was changed, retry later",
                self.reason()
            ),
        )
    }

    /// The health to publish while it lasts.
    pub(crate) fn health(&self) -> Health {
        Health::CannotStore {
            reason: self.reason(),
            since: self.since,
        }
    }

    /// Whether a probe for room is due at `now`.
    pub(crate) fn probe_due(&self, now: UnixMillis) -> bool {
        now >= self.next_probe
    }

    /// Records a failed probe at `now`.
    pub(crate) fn probe_failed(&mut self, now: UnixMillis, error: &RegistryError) {
        self.probes += 1;
        self.disk_full = error.is_disk_full();
        self.cause = error.to_string();
        self.next_probe = now.saturating_add(PROBE_INTERVAL_MS);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check_throttle(occurrences_at: &[UnixMillis], expected: &[Option<u64>]) {
        let mut throttle = LogThrottle::new(1_000);
        let admitted: Vec<Option<u64>> = occurrences_at
            .iter()
            .map(|now| throttle.admit(*now))
            .collect();
        assert_eq!(admitted, expected);
    }

    #[test]
    fn throttle_admits_one_line_per_interval_with_the_count_left_out() {
        check_throttle(&[0], &[Some(0)]);
        check_throttle(&[0, 10, 20, 999], &[Some(0), None, None, None]);
        check_throttle(
            &[0, 10, 20, 1_000, 1_500, 2_100],
            &[Some(0), None, None, Some(2), None, Some(1)],
        );
    }

    #[test]
    fn refusal_names_a_full_disk_and_carries_its_own_code() {
        let full = RegistryError::NoRoom {
            dir: "/data".into(),
            bytes: 1,
            source: std::io::Error::from(std::io::ErrorKind::StorageFull),
        };
        let outage = Outage::new(5, &full);
        let refusal = outage.refusal();
        assert_eq!(refusal.code, ErrorCode::StorageUnavailable);
        assert!(
            refusal
                .message
                .starts_with("the head cannot store anything: its disk is full ("),
            "{}",
            refusal.message
        );
        assert!(
            refusal.message.ends_with("retry later"),
            "{}",
            refusal.message
        );
        let health = outage.health();
        assert!(health.problem().unwrap().contains("its disk is full"));
        assert_eq!(Health::Healthy.problem(), None);

        let closed = Outage::new(5, &RegistryError::Closed);
        assert!(closed.refusal().message.contains("its database failed ("));
    }

    #[test]
    fn probes_are_paced() {
        let mut outage = Outage::new(1_000, &RegistryError::Closed);
        assert!(!outage.probe_due(1_500));
        assert!(outage.probe_due(2_000));
        outage.probe_failed(2_000, &RegistryError::Closed);
        assert_eq!(outage.probes, 1);
        assert!(!outage.probe_due(2_999));
        assert!(outage.probe_due(3_000));
    }

    #[test]
    fn an_actor_that_has_not_handled_its_tick_for_seconds_is_reported() {
        assert_eq!(stall_problem(1_000, 1_000), None);
        assert_eq!(stall_problem(1_000, 1_000 + STALL_MS), None);
        let problem = stall_problem(1_000, 13_500).expect("late by 12.5 s");
        assert!(
            problem.starts_with("the head actor has not kept up for 12 s"),
            "{problem}"
        );
        // A beat after the look is never a problem.
        assert_eq!(stall_problem(2_000, 1_000), None);
    }
}
