//! Driver binaries (`Request::PutBlob`, `Request::GetBlob`): a driver uploads
//! the binary its `entry` trials run, and nodes fetch it. The bytes stream
//! between the connection and the blob directory (`ConnectionWork`), never
//! through the core.
//!
//! Access: a member uploads (stores objects); only nodes fetch blobs.
//!
//! What a user may keep is bounded by the policy (`admission`:
//! `max_blobs_per_user`, `max_blob_bytes_per_user`): the core hands the
//! shell, which owns the blob directory, the [`BlobLimits`] with the upload,
//! and the shell refuses an upload that [`BlobLimits::check`] refuses before
//! it reads a byte. A blob is kept while its uploading connection is open or
//! an unfinished experiment runs it ([`HeadCore::blobs_in_use`]); the shell
//! collects the others.

use std::collections::BTreeSet;

use xp_runtime::ids::BlobHash;

use super::{ConnectionWork, Served};
use crate::auth::Action;
use crate::auth::access::{Access, Scope};
use crate::{CoreError, HeadCore};

/// What one user keeps of driver binaries on the head.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct BlobUsage {
    /// How many.
    pub count: u64,
    /// Their bytes.
    pub bytes: u64,
}

/// The most driver binaries, and bytes of them, one user keeps on the head.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BlobLimits {
    /// The most binaries.
    pub count: u64,
    /// The most bytes.
    pub bytes: u64,
}

impl BlobLimits {
    /// Refuses an upload of `len` bytes by `user`, who keeps `held` (not
    /// counting this blob), when it would take them past a limit.
    pub fn check(&self, user: &str, held: BlobUsage, len: u64) -> Result<(), CoreError> {
        if held.count.saturating_add(1) > self.count || held.bytes.saturating_add(len) > self.bytes
        {
            return Err(CoreError::TooManyBlobs {
                user: user.to_owned(),
                count: held.count,
                bytes: held.bytes,
                len,
                max_count: self.count,
                max_bytes: self.bytes,
            });
        }
        Ok(())
    }
}

/// What an upload does: store objects.
pub(super) fn access_put() -> Access {
    Access::new(Action::StoreObjects, Scope::Cluster)
}

/// What a fetch does: fetch a blob (node work).
pub(super) fn access_get() -> Access {
    Access::new(Action::FetchBlob, Scope::Cluster)
}

/// Send a blob's bytes.
pub(super) fn send(hash: BlobHash) -> Served {
    Served::Connection(ConnectionWork::SendBlob { hash })
}

impl HeadCore {
    /// Receive an upload's bytes, within the policy's limits on a user's blobs.
    pub(super) fn receive_blob(&self, hash: BlobHash, len: u64) -> Served {
        let admission = &self.placement.policy().config().admission;
        Served::Connection(ConnectionWork::ReceiveBlob {
            hash,
            len,
            limits: BlobLimits {
                count: admission.max_blobs_per_user,
                bytes: admission.max_blob_bytes_per_user,
            },
        })
    }

    /// The driver binaries an unfinished experiment runs: the shell keeps
    /// these (and those whose uploading connection is open), and collects
    /// the rest.
    pub fn blobs_in_use(&self) -> BTreeSet<BlobHash> {
        self.book
            .experiments()
            .filter_map(|experiment| Some((experiment.id, experiment.program?)))
            .filter(|(id, _)| {
                self.book
                    .trials_of(*id)
                    .any(|(_, trial)| !trial.state.is_terminal())
            })
            .map(|(_, program)| program)
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use xp_runtime::protocol::SubmitRequest;
    use xp_runtime::spec::ExperimentSpec;

    use super::*;
    use crate::{CoreConfig, LoadedState};

    #[test]
    fn a_binary_is_in_use_while_an_experiment_that_runs_it_is_unfinished() {
        let mut core = HeadCore::restore(CoreConfig::default(), LoadedState::default(), 0);
        let spec = ExperimentSpec::from_yaml("name: e\ntrial: {entry: train}\n").unwrap();
        let program = BlobHash::of(b"driver");
        let request = SubmitRequest {
            spec_json: spec.to_canonical_json(),
            program: Some(program),
            code_version: "none".to_owned(),
            data_version: "none".to_owned(),
            rerun: false,
        };
        let (experiment, _, _) = core.handle_submit(1, &request).unwrap();
        assert_eq!(core.blobs_in_use(), BTreeSet::from([program]));
        core.handle_cancel(2, &experiment.to_string()).unwrap();
        assert!(core.blobs_in_use().is_empty());
    }

    fn check(held: (u64, u64), len: u64, expected: &str) {
        let limits = BlobLimits {
            count: 2,
            bytes: 1_000,
        };
        let held = BlobUsage {
            count: held.0,
            bytes: held.1,
        };
        let outcome = limits
            .check("alice", held, len)
            .map_or_else(|refusal| refusal.to_string(), |()| "stored".to_owned());
        assert!(outcome.starts_with(expected), "{outcome}");
    }

    #[test]
    fn a_user_keeps_at_most_so_many_binaries_and_bytes() {
        check((0, 0), 1_000, "stored");
        check((1, 500), 500, "stored");
        check(
            (2, 10),
            1,
            "user alice keeps 2 driver binaries (10 bytes) on the head, and one more of 1 bytes would pass the limit of 2 binaries and 1000 bytes",
        );
        check(
            (1, 900),
            101,
            "user alice keeps 1 driver binaries (900 bytes)",
        );
        check((0, 0), u64::MAX, "user alice keeps 0 driver binaries");
    }
}
