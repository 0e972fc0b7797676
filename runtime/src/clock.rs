//! Wall-clock time as an argument.
//!
//! Cores never read the clock: shells call [`Clock::now`] and pass the value in,
//! so tests can drive cores with any time they like.

use std::time::{SystemTime, UNIX_EPOCH};

/// Milliseconds since the Unix epoch: the one time unit that crosses the wire
/// and goes into the registry.
pub type UnixMillis = u64;

/// A source of wall-clock time.
pub trait Clock: Send + Sync {
    /// The current time in milliseconds since the Unix epoch.
    fn now(&self) -> UnixMillis;
}

/// The operating system's clock, the only one binaries use.
#[derive(Debug, Clone, Copy, Default)]
pub struct SystemClock;

impl Clock for SystemClock {
    #[expect(
        clippy::disallowed_methods,
        reason = "the system clock is the one place that reads the time"
    )]
    fn now(&self) -> UnixMillis {
        let since_epoch = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap_or_default();
        u64::try_from(since_epoch.as_millis()).unwrap_or(u64::MAX)
    }
}
