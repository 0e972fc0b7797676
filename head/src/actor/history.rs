//! Reads of the stored history (events, metric reports, telemetry, the audit
//! trail) made off the actor: a page of metric reports decodes up to 4 MiB,
//! and the dashboard's curves up to 100,000 reports (about 100 ms on a small
//! machine), and on PostgreSQL every read is a round trip. The actor decides
//! what to read and checks who may see it, then hands the read to a blocking
//! thread with a [`HistoryReader`] (which shares nothing with its commits),
//! and the answer goes straight from there. At most [`MAX_READING`] reads
//! run at once; the others wait their turn off the actor.
//!
//! A read sees the store as a commit left it, never a change the actor made
//! but has not committed: what it shows was acknowledged.

use std::sync::Arc;

use tokio::sync::Semaphore;
use xp_runtime::protocol::{ErrorCode, RemoteError};

use super::{HeadState, Reply};
use crate::registry::HistoryReads;

/// The most history reads made at once.
const MAX_READING: usize = 4;

/// Turns at reading the stored history.
#[derive(Debug, Clone)]
pub(super) struct HistoryTurns(Arc<Semaphore>);

impl HistoryTurns {
    pub(super) fn new() -> Self {
        Self(Arc::new(Semaphore::new(MAX_READING)))
    }
}

impl HeadState {
    /// Makes `read` of the stored history off the actor, in turn, and
    /// answers `reply` with what it gives; `what` names what is read should
    /// the read itself fail.
    pub(super) fn read_history<T: Send + 'static>(
        &self,
        what: &'static str,
        reply: Reply<T>,
        read: impl FnOnce(&dyn HistoryReads) -> Result<T, RemoteError> + Send + 'static,
    ) {
        let reader = self.args.registry.reader();
        let turns = Arc::clone(&self.history.0);
        xp_runtime::task::spawn("history read", async move {
            // The semaphore is never closed.
            let Ok(_turn) = turns.acquire_owned().await else {
                return;
            };
            if reply.is_closed() {
                return;
            }
            let read = tokio::task::spawn_blocking(move || read(&*reader)).await;
            let answer = read.unwrap_or_else(|error| {
                Err(RemoteError::new(
                    ErrorCode::Internal,
                    format!("the head could not read {what}: {error}"),
                ))
            });
            // An asker who left drops the answer.
            let _ = reply.send(answer);
        });
    }
}
