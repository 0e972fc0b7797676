//! `xp queue` (`Request::Queues`): each queue's quota, use and waiting trials.
//!
//! Access: any user reads the cluster.

use xp_runtime::protocol::Response;

use crate::HeadCore;
use crate::auth::Action;
use crate::auth::access::{Access, Scope};

/// What a queues request does: read the cluster.
pub(super) fn access() -> Access {
    Access::new(Action::ReadCluster, Scope::Cluster)
}

impl HeadCore {
    /// Every queue as `xp queue` shows it.
    pub(super) fn read_queues(&self) -> Response {
        Response::Queues(self.queues())
    }
}
