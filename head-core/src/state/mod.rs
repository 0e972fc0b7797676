//! The core's sub-states: each owns its fields (private to its module) and
//! keeps its own invariants; `HeadCore`'s steps are sequences of calls on them.

mod approvals;
mod book;
mod drivers;
mod grants;
mod held_exits;
mod master_ports;
mod membership;
mod objects;
mod outbox;
mod placement;
mod troubles;

#[cfg(test)]
pub(crate) use self::approvals::MAX_DECIDED_APPROVALS;
pub(crate) use self::approvals::{Approvals, Involved};
pub(crate) use self::book::{Book, Catalog, QueuedIndex};
pub(crate) use self::drivers::DriverSessions;
pub(crate) use self::grants::ObjectGrants;
pub(crate) use self::held_exits::{HeldExit, HeldExits};
pub(crate) use self::master_ports::MasterPorts;
pub(crate) use self::membership::{Membership, SilenceLimits};
pub(crate) use self::objects::ObjectBook;
pub(crate) use self::outbox::Outbox;
pub(crate) use self::placement::Placement;
