//! The object plane's requests: where a driver stores objects
//! (`Request::StoreTargets`), where an object is (`Request::Locate`), which
//! drivers share objects with an experiment (`Request::SharingDrivers`); the
//! object servers' capability is `capability.rs`.
//!
//! Access: a member stores objects and locates them; nodes locate objects
//! and ask which drivers share them.

use xp_runtime::ids::{ExperimentId, ObjectId};
use xp_runtime::protocol::Response;

use crate::HeadCore;
use crate::auth::Action;
use crate::auth::access::{Access, Scope};

/// What asking where to store (and for a capability) does: store objects.
pub(super) fn access_store() -> Access {
    Access::new(Action::StoreObjects, Scope::Cluster)
}

/// What a lookup does: locate an object.
pub(super) fn access_locate() -> Access {
    Access::new(Action::LocateObject, Scope::Cluster)
}

/// What asking for sharing drivers does (node work).
pub(super) fn access_sharing() -> Access {
    Access::new(Action::SharingDrivers, Scope::Cluster)
}

impl HeadCore {
    /// Where the connection's driver session stores its objects; what it stores
    /// is kept while it is connected.
    pub(super) fn apply_store_targets(&mut self, session: Option<&str>) -> Response {
        let session = session.unwrap_or_default().to_owned();
        let nodes = self.store_targets(&session);
        Response::StoreTargets { session, nodes }
    }

    /// The nodes holding `object`.
    pub(super) fn read_locate(&self, object: ObjectId) -> Response {
        Response::Located(self.locate(object))
    }

    /// Those of `sessions` whose objects `experiment`'s trials may read.
    pub(super) fn read_sharing_drivers(
        &self,
        experiment: ExperimentId,
        sessions: Vec<String>,
    ) -> Response {
        Response::Drivers(self.sharing_drivers(experiment, sessions))
    }
}
