//! The one way xp spawns a tokio task: named, and inside the caller's span.
//!
//! A task spawned here carries the current tracing span, so its logs keep the
//! trial, node or connection they belong to. Callers own the returned handle
//! (or a `JoinSet`): there are no fire-and-forget tasks.

use std::future::Future;

use tracing::Instrument;

/// Spawns `future` as a tokio task named `name`, inside the current span.
#[expect(clippy::disallowed_methods, reason = "this is the spawn wrapper")]
pub fn spawn<F>(name: &'static str, future: F) -> tokio::task::JoinHandle<F::Output>
where
    F: Future + Send + 'static,
    F::Output: Send + 'static,
{
    let span = tracing::debug_span!("task", task = name);
    tokio::spawn(future.instrument(span))
}
