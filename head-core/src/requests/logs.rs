//! `xp logs` (`Request::ReadLogs`): a piece of one rank's log, which its node
//! holds; the core says where, the server relays the read.
//!
//! Access: a viewer reads their own team's trials.

use xp_runtime::protocol::LogRequest;

use super::ConnectionWork;
use crate::auth::Action;
use crate::auth::access::{Access, Scope};
use crate::{CoreError, HeadCore};

/// What a log read does: read the trial it names.
pub(super) fn access(log: &LogRequest) -> Access {
    Access::new(Action::ReadExperiment, Scope::Trial(log.trial))
}

impl HeadCore {
    /// The node holding the log, for the server to ask.
    pub(super) fn read_logs(&self, request: LogRequest) -> Result<ConnectionWork, CoreError> {
        let (node, key, ended) = self.locate_worker(&request)?;
        Ok(ConnectionWork::RelayLogs {
            node,
            key,
            ended,
            request,
        })
    }
}
