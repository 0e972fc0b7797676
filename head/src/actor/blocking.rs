//! Work the actor hands to blocking threads and answers from there: status
//! answers (a page of 5,000 trials' statuses, a multi-objective front that
//! walks every trial of its experiment) and reads of the stored history. The
//! actor takes what the work reads (a copy of the book, a store reader) and
//! goes on deciding; at most a few of each kind run at once, the others wait
//! their turn off the actor.

use std::sync::Arc;

use tokio::sync::Semaphore;
use xp_runtime::protocol::{ErrorCode, RemoteError};

use super::Reply;

/// Turns at one kind of blocking work.
#[derive(Debug, Clone)]
pub(super) struct BlockingTurns(Arc<Semaphore>);

impl BlockingTurns {
    /// At most `at_once` running at once.
    pub(super) fn new(at_once: usize) -> Self {
        Self(Arc::new(Semaphore::new(at_once)))
    }

    /// Runs `work` on a blocking thread, in turn, and answers `reply` with
    /// what it gives; `what` names what it makes should it panic.
    pub(super) fn answer<T: Send + 'static>(
        &self,
        what: &'static str,
        reply: Reply<T>,
        work: impl FnOnce() -> Result<T, RemoteError> + Send + 'static,
    ) {
        let turns = Arc::clone(&self.0);
        xp_runtime::task::spawn(what, async move {
            // The semaphore is never closed.
            let Ok(_turn) = turns.acquire_owned().await else {
                return;
            };
            if reply.is_closed() {
                return;
            }
            let made = tokio::task::spawn_blocking(work).await;
            let answer = made.unwrap_or_else(|error| {
                Err(RemoteError::new(
                    ErrorCode::Internal,
                    format!("the head could not make {what}: {error}"),
                ))
            });
            // An asker who left drops the answer.
            let _ = reply.send(answer);
        });
    }
}
