//! `xp audit` (`Request::Audit`): the newest entries of the audit trail, which
//! the database holds.
//!
//! Access: admins only.

use super::StoredRead;
use crate::auth::Action;
use crate::auth::access::{Access, Scope};

/// The most audit entries one request returns.
pub(super) const MAX_AUDIT_ENTRIES: u32 = 10_000;

/// What an audit request does: read the audit trail.
pub(super) fn access() -> Access {
    Access::new(Action::ReadAudit, Scope::Cluster)
}

/// The newest `limit` entries, `limit` brought within 1 and [`MAX_AUDIT_ENTRIES`].
pub(super) fn read(limit: u32) -> StoredRead {
    StoredRead::Audit {
        limit: limit.clamp(1, MAX_AUDIT_ENTRIES),
    }
}
