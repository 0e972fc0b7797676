//! `Request::ObjectCapability`: the object servers' capability for the
//! connection's driver session, which replaces version 7's cluster-wide
//! object key (`Request::ObjectKey`, now refused).
//!
//! Access: members and above (storing objects, as the key was); what the
//! capability reads is decided in `object_access` from who asks and what
//! their team's work names.

use xp_runtime::clock::UnixMillis;
use xp_runtime::ids::ObjectId;
use xp_runtime::protocol::Response;

use crate::auth::Principal;
use crate::auth::access::{Access, Authorized};
use crate::{CoreError, HeadCore};

/// What asking for a capability does: store objects (and read them).
pub(super) fn access() -> Access {
    super::objects::access_store()
}

impl HeadCore {
    /// A capability for the asker's driver session `session`, reading also those
    /// of `objects` that their team's checkpoints or outputs name.
    pub(super) fn apply_object_capability(
        &mut self,
        now: UnixMillis,
        asker: &Authorized,
        session: Option<&str>,
        objects: &[ObjectId],
    ) -> Result<Response, CoreError> {
        let (Some(session), Principal::User { name, team, .. }) = (session, &asker.principal)
        else {
            return Err(CoreError::NoDriverSession);
        };
        let visible = asker.principal.visible_team();
        let capability = self.session_capability(now, (name, team, &visible), session, objects);
        Ok(Response::ObjectCapability(Box::new(capability)))
    }
}
