//! Reads of the stored history (events, metric reports, telemetry, the audit
//! trail) made off the actor: a page of metric reports decodes up to 4 MiB,
//! and the dashboard's curves up to 100,000 reports (about 100 ms on a small
//! machine), and on PostgreSQL every read is a round trip. The actor decides
//! what to read and checks who may see it, then hands the read to a blocking
//! thread with a [`HistoryReader`](crate::registry::HistoryReader) (which
//! shares nothing with its commits), and the answer goes straight from
//! there. At most [`MAX_READING`] reads run at once.
//!
//! A read sees the store as a commit left it, never a change the actor made
//! but has not committed: what it shows was acknowledged.

use xp_runtime::protocol::RemoteError;

use super::{HeadState, Reply};
use crate::registry::HistoryReads;

/// The most history reads made at once.
pub(super) const MAX_READING: usize = 4;

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
        self.history.answer(what, reply, move || read(&*reader));
    }
}
