//! Status answers that carry a multi-objective experiment's front
//! ([`PendingFronts`]): the front walks every trial of its experiment (tens of
//! milliseconds at 100,000), so it is computed on a blocking thread, on the
//! copy of the book the core took with the answer, and the answer goes
//! straight from there. At most [`MAX_COMPUTING`] are computed at once; the
//! others wait their turn off the actor.

use std::sync::Arc;

use tokio::sync::Semaphore;
use xp_head_core::requests::PendingFronts;
use xp_runtime::protocol::{ErrorCode, RemoteError};

use super::Reply;
use super::client::Answer;
use super::report::give_back_freed_memory;

/// The most fronts computed at once.
const MAX_COMPUTING: usize = 2;

/// Turns at computing fronts.
#[derive(Debug, Clone)]
pub(super) struct FrontTurns(Arc<Semaphore>);

impl FrontTurns {
    pub(super) fn new() -> Self {
        Self(Arc::new(Semaphore::new(MAX_COMPUTING)))
    }

    /// Computes `pending`'s fronts off the actor, in turn, and answers `reply`.
    pub(super) fn answer(&self, pending: Box<PendingFronts>, reply: Reply<Answer>) {
        let turns = Arc::clone(&self.0);
        xp_runtime::task::spawn("status fronts", async move {
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
                    format!("the head could not compute the front: {error}"),
                )
            });
            // An asker who left drops the answer.
            let _ = reply.send(answer);
        });
    }
}
