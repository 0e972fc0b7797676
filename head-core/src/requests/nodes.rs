//! `xp nodes` (`Request::Nodes`): every node with its capacity, what is free
//! and its latest GPU figures.
//!
//! Access: any user reads the cluster.

use xp_runtime::protocol::Response;

use crate::HeadCore;
use crate::auth::Action;
use crate::auth::access::{Access, Scope};

/// What a nodes request does: read the cluster.
pub(super) fn access() -> Access {
    Access::new(Action::ReadCluster, Scope::Cluster)
}

impl HeadCore {
    /// Every node as `xp nodes` shows it.
    pub(super) fn read_nodes(&self) -> Response {
        Response::Nodes(self.nodes_status())
    }
}
