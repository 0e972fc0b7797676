//! `xp leases` (`Request::Leases`): each lease's holders and waiters, the
//! preemptions waiting for approval, and the odds of conflict.
//!
//! Access: any user reads the cluster; other teams' trials, teams and
//! reasons stay hidden, and counts are whole.

use xp_runtime::protocol::Response;

use crate::HeadCore;
use crate::auth::Action;
use crate::auth::access::{Access, Authorized, Scope};

/// What a leases request does: read the cluster.
pub(super) fn access() -> Access {
    Access::new(Action::ReadCluster, Scope::Cluster)
}

impl HeadCore {
    /// The lease report as the asker may see it.
    pub(super) fn read_leases(&self, asker: &Authorized) -> Response {
        let visible = asker.principal.visible_team();
        Response::Leases(self.lease_report(&|team| visible.shows(team)))
    }
}
