//! User commands on the head machine: the running head's local command socket
//! (`socket`) and `xp-head user ...` (`local`), through that socket or on a
//! stopped head's database. The user table itself and every authorization
//! decision are pure and live in `xp_head_core::auth`.

pub(crate) mod local;
pub(crate) mod socket;
