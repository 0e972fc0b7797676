//! Status answers made off the actor ([`PendingStatus`]): a page of 5,000
//! trials' statuses, and the front of a multi-objective experiment, which
//! walks every trial of it (tens of milliseconds at 100,000), are made on a
//! blocking thread, on the copy of what they read that the core took with
//! the request, and the answer goes straight from there. At most
//! [`MAX_COMPUTING`] are made at once; the others wait their turn off the
//! actor.

use std::sync::Arc;

use tokio::sync::Semaphore;
use xp_head_core::requests::PendingStatus;
use xp_runtime::protocol::{ErrorCode, RemoteError};

use super::Reply;
use super::client::Answer;
use super::report::give_back_freed_memory;

/// The most status answers made at once.
const MAX_COMPUTING: usize = 2;

/// Turns at making status answers.
#[derive(Debug, Clone)]
pub(super) struct StatusTurns(Arc<Semaphore>);

impl StatusTurns {
    pub(super) fn new() -> Self {
        Self(Arc::new(Semaphore::new(MAX_COMPUTING)))
    }

    /// Makes `pending` off the actor, in turn, and answers `reply`.
    pub(super) fn answer(&self, pending: Box<PendingStatus>, reply: Reply<Answer>) {
        let turns = Arc::clone(&self.0);
        xp_runtime::task::spawn("status answer", async move {
            // The semaphore is never closed.
            let Ok(_turn) = turns.acquire_owned().await else {
                return;
            };
            let computed = tokio::task::spawn_blocking(move || {
                let answer = pending.complete();
                give_back_freed_memory();
                answer
            })
            .await;
            let answer = computed.map(Answer::Response).map_err(|error| {
                RemoteError::new(
                    ErrorCode::Internal,
                    format!("the head could not make the status answer: {error}"),
                )
            });
            // An asker who left drops the answer.
            let _ = reply.send(answer);
        });
    }
}
