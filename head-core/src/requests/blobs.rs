//! Driver binaries (`Request::PutBlob`, `Request::GetBlob`): a driver uploads
//! the binary its `entry` trials run, and nodes fetch it. The bytes stream
//! between the connection and the blob directory (`ConnectionWork`), never
//! through the core.
//!
//! Access: a member uploads (stores objects); only nodes fetch blobs.

use xp_runtime::ids::BlobHash;

use super::{ConnectionWork, Served};
use crate::auth::Action;
use crate::auth::access::{Access, Scope};

/// What an upload does: store objects.
pub(super) fn access_put() -> Access {
    Access::new(Action::StoreObjects, Scope::Cluster)
}

/// What a fetch does: fetch a blob (node work).
pub(super) fn access_get() -> Access {
    Access::new(Action::FetchBlob, Scope::Cluster)
}

/// Receive an upload's bytes.
pub(super) fn receive(hash: BlobHash, len: u64) -> Served {
    Served::Connection(ConnectionWork::ReceiveBlob { hash, len })
}

/// Send a blob's bytes.
pub(super) fn send(hash: BlobHash) -> Served {
    Served::Connection(ConnectionWork::SendBlob { hash })
}
