//! `xp submit --wait`'s and `xp run`'s event feed (`Request::Events`): an
//! experiment's events after the last one the asker has, waiting (bounded)
//! for new ones when there are none.
//!
//! Access: a viewer reads their own team's experiments.
//!
//! The wait is the server's (`ConnectionWork::AwaitEvents`): it names the
//! newest event the core had when it found none, so that an event stored
//! between this read and the wait is never missed.

use xp_runtime::ids::ExperimentId;
use xp_runtime::protocol::Response;

use super::{ConnectionWork, Served};
use crate::auth::Action;
use crate::auth::access::{Access, Scope};
use crate::{CoreError, HeadCore};

/// What an events request does: read the experiment it names.
pub(super) fn access(experiment: ExperimentId) -> Access {
    Access::new(Action::ReadExperiment, Scope::Experiment(experiment))
}

impl HeadCore {
    /// The events after `after`; none yet and `wait_ms` > 0: a wait.
    pub(super) fn read_events(
        &self,
        experiment: ExperimentId,
        after: u64,
        wait_ms: u32,
    ) -> Result<Served, CoreError> {
        let events = self.events_after(experiment, after)?;
        if events.is_empty() && wait_ms > 0 {
            return Ok(Served::Connection(ConnectionWork::AwaitEvents {
                experiment,
                after,
                wait_ms,
                newest: self.last_event_seq(),
            }));
        }
        Ok(Served::Answer(Response::Events(events)))
    }
}
