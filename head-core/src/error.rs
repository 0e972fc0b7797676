//! Why the head core refused a request: [`CoreError`], and its one conversion into
//! the wire error.
//!
//! Variants carry the ids a caller needs to act on (which trial, which
//! experiment, which queue), not preformatted text; `Display` is the message users
//! see. This module deliberately knows nothing of actors or sockets: the shell turns
//! a `CoreError` into a `RemoteError` only through the `From` impl below.
//!
//! Invariant: `impl From<CoreError> for RemoteError` is the only place where the
//! core's failures get a wire `ErrorCode`; codes are part of the protocol and stay
//! stable.

use xp_runtime::ids::{BlobHash, ExperimentId, TrialId};
use xp_runtime::protocol::{ErrorCode, RemoteError};
use xp_runtime::spec::SpecError;
use xp_sched::PolicyError;

use crate::sweep::SweepError;

/// The longest code or data version a submission may carry.
pub(super) const MAX_VERSION_BYTES: usize = 512;

/// Why the head core refused a request from a client or an admin.
#[derive(Debug, thiserror::Error)]
pub enum CoreError {
    /// The submitted spec does not validate.
    #[error(transparent)]
    InvalidSpec(#[from] SpecError),
    /// An `entry` trial was submitted without its driver binary.
    #[error("an `entry` trial needs its driver binary uploaded")]
    EntryWithoutBinary,
    /// A binary was uploaded for trials that run a command.
    #[error("binary {program} given for a command trial")]
    BinaryForCommandTrial {
        /// The uploaded binary.
        program: BlobHash,
    },
    /// The code or data version is too long to keep.
    #[error("code or data version is longer than {} bytes", MAX_VERSION_BYTES)]
    VersionTooLong,
    /// The team's pending trials and the submission's would pass its limit;
    /// the caller should retry once some have started.
    #[error(
        "team {team} has {pending} pending trials and this submission adds {adding}, over its limit of {limit} (admission.max_pending_per_team); retry later"
    )]
    TooManyPending {
        /// The submitting team.
        team: String,
        /// Its pending trials now.
        pending: u64,
        /// The trials the submission creates at once.
        adding: u64,
        /// The policy's limit.
        limit: u64,
        /// When to try again.
        retry_after_ms: u64,
    },
    /// The submission alone creates more trials at once than its team may
    /// have pending: it can never be admitted as it is.
    #[error(
        "this submission creates {trials} trials at once, more than team {team} may have pending ({limit}, admission.max_pending_per_team); split it into smaller experiments"
    )]
    OverPendingLimit {
        /// The submitting team.
        team: String,
        /// The trials the submission creates at once.
        trials: u64,
        /// The policy's limit.
        limit: u64,
    },
    /// The submission's expanded size (its trials times the bytes of their
    /// rendered configs and commands) is over the policy's limit.
    #[error(
        "this submission expands to {bytes} bytes ({trials} trials of {per_trial} bytes of rendered config and command each), over the limit of {limit} bytes (admission.max_submission_bytes); use fewer trials or smaller values"
    )]
    SubmissionTooLarge {
        /// The estimated expanded size.
        bytes: u64,
        /// Its trials.
        trials: u64,
        /// The bytes of one trial's rendered config and command.
        per_trial: u64,
        /// The policy's limit.
        limit: u64,
    },
    /// The team's unfinished trials and the submission would pass the team's
    /// expanded-size limit; the caller should retry once some have finished.
    #[error(
        "team {team}'s unfinished trials expand to {held} bytes and this submission to {adding}, over the team's limit of {limit} bytes (admission.max_team_bytes); retry once some finish"
    )]
    TeamTooLarge {
        /// The submitting team.
        team: String,
        /// The expanded size of its unfinished trials now.
        held: u64,
        /// The submission's expanded size.
        adding: u64,
        /// The policy's limit.
        limit: u64,
        /// When to try again.
        retry_after_ms: u64,
    },
    /// No node that has joined could hold one worker of the submission, even empty.
    #[error(
        "no node can hold one worker of this experiment: it asks for {} GPU, {} CPU and {} of memory per worker, and the largest nodes offer {largest_gpus} GPU, {} CPU and {} of memory; ask for less or add a larger node",
        *gpu_milli as f64 / 1000.0,
        *cpu_milli as f64 / 1000.0,
        bytesize::ByteSize(*memory_bytes),
        *largest_cpu_milli as f64 / 1000.0,
        bytesize::ByteSize(*largest_memory_bytes)
    )]
    NoNodeCanHold {
        /// GPU thousandths per worker asked for.
        gpu_milli: u64,
        /// CPU thousandths per worker asked for.
        cpu_milli: u64,
        /// Memory bytes per worker asked for.
        memory_bytes: u64,
        /// The most GPUs any node offers.
        largest_gpus: u64,
        /// The most CPU thousandths any node offers.
        largest_cpu_milli: u64,
        /// The most memory any node offers.
        largest_memory_bytes: u64,
    },
    /// The adaptive search of the submission cannot start.
    #[error(transparent)]
    Sweep(#[from] SweepError),
    /// No trial has this id.
    #[error("no trial {trial_id}")]
    TrialNotFound {
        /// The trial asked for.
        trial_id: TrialId,
    },
    /// No experiment has this id.
    #[error("no experiment {experiment_id}")]
    ExperimentNotFound {
        /// The experiment asked for.
        experiment_id: ExperimentId,
    },
    /// No experiment id is or starts with this text.
    #[error("no experiment {prefix:?}")]
    NoExperimentMatches {
        /// The id or prefix given.
        prefix: String,
    },
    /// More than one experiment id starts with this text.
    #[error("{prefix:?} matches {matches} experiments; give more digits")]
    AmbiguousExperiment {
        /// The prefix given.
        prefix: String,
        /// How many experiments it matches.
        matches: usize,
    },
    /// The trial has no such attempt (or none yet).
    #[error("trial {trial_id} has no such attempt yet")]
    AttemptNotFound {
        /// The trial.
        trial_id: TrialId,
        /// The attempt asked for; `None` asked for the latest.
        attempt: Option<u32>,
    },
    /// The attempt has no worker of this rank.
    #[error("trial {trial_id} has no rank {rank}")]
    RankNotFound {
        /// The trial.
        trial_id: TrialId,
        /// The attempt looked in.
        attempt: u32,
        /// The rank asked for.
        rank: u32,
    },
    /// An admin action did not say who takes it and why, within the limits.
    #[error("an admin action needs who (1-128 characters) and why (at most 4096)")]
    AdminUnattributed,
    /// A policy given by an admin is invalid, or cannot replace the one in force.
    #[error(transparent)]
    InvalidPolicy(#[from] PolicyError),
    /// The policy has no queue of this name.
    #[error("no queue {queue:?} in the policy")]
    QueueNotFound {
        /// The queue asked for.
        queue: String,
    },
    /// No pipeline has this id.
    #[error("no pipeline {pipeline}")]
    PipelineNotFound {
        /// The pipeline asked for.
        pipeline: u64,
    },
    /// A report asked for an experiment and a team at once.
    #[error("a report covers one experiment or one team, not both")]
    ReportScopeConflict,
    /// A report of a team the asker does not see, or of the whole cluster by a
    /// non-admin.
    #[error("only an admin may read the report of {scope}")]
    ReportForbidden {
        /// The scope asked for (`team T`, `the whole cluster`).
        scope: String,
    },
    /// A trial names a lease the policy does not declare, or more units than
    /// it has: it could never start.
    #[error("lease {lease}: {reason}")]
    UnknownLease {
        /// The lease.
        lease: String,
        /// What is wrong.
        reason: String,
    },
    /// An approval decision on a request that is not pending.
    #[error(transparent)]
    Approval(#[from] xp_sched::ApprovalError),
    /// The asker may not do what the request does (`crate::auth::authorize`).
    #[error(transparent)]
    Refused(#[from] crate::auth::Refusal),
    /// A user credential that no longer names its user: revoked or replaced.
    #[error("the credential of user {name} was revoked or replaced; ask an admin for a new one")]
    UnknownUser {
        /// The name the connection was made with (cut for the audit trail).
        name: String,
    },
    /// A name the request gives is too long to resolve, log or audit.
    #[error(transparent)]
    NameTooLong(#[from] crate::auth::access::NameTooLong),
    /// A submitted spec is larger than the head reads.
    #[error(
        "the spec is {len} bytes; at most {} are accepted",
        xp_runtime::spec::MAX_SPEC_BYTES
    )]
    SpecTooLarge {
        /// Its length.
        len: usize,
    },
    /// An upload would take a user past what the policy lets one user keep
    /// of driver binaries.
    #[error(
        "user {user} keeps {count} driver binaries ({bytes} bytes) on the head, and one more of {len} bytes would pass the limit of {max_count} binaries and {max_bytes} bytes (admission.max_blobs_per_user, admission.max_blob_bytes_per_user); a binary is collected once no unfinished experiment runs it and its upload's connection has closed"
    )]
    TooManyBlobs {
        /// The uploading user.
        user: String,
        /// How many binaries they keep.
        count: u64,
        /// Their bytes.
        bytes: u64,
        /// The upload's length.
        len: u64,
        /// The policy's limit on binaries.
        max_count: u64,
        /// The policy's limit on bytes.
        max_bytes: u64,
    },
    /// An unpaged status answer would not fit one frame.
    #[error(
        "the status asked for is about {bytes} bytes, more than one answer holds ({limit}); ask with a client that pages (`xp status` of protocol 8 or later)"
    )]
    StatusTooLarge {
        /// Its estimated size.
        bytes: u64,
        /// The frame limit.
        limit: u64,
    },
    /// A submitted spec is not JSON (its team cannot be set).
    #[error("the spec is not JSON: {source}")]
    SpecNotJson {
        /// What the JSON reader said.
        #[source]
        source: serde_json::Error,
    },
    /// A request for the cluster-wide object key, which no head hands out
    /// since protocol version 8.
    #[error(
        "the cluster-wide object key is no longer handed out: ask for an object capability (upgrade the client)"
    )]
    ObjectKeyRetired,
    /// A request that needs the connection's driver session came without one.
    #[error("this request needs a driver session, which only a user's connection has")]
    NoDriverSession,
}

impl CoreError {
    /// Whether the refusal is for now only (the same request may succeed later).
    pub fn is_temporary(&self) -> bool {
        matches!(
            self,
            Self::TooManyPending { .. } | Self::TeamTooLarge { .. }
        )
    }
}

impl From<CoreError> for RemoteError {
    fn from(error: CoreError) -> Self {
        let message = error.to_string();
        let code = match &error {
            CoreError::TooManyPending { retry_after_ms, .. }
            | CoreError::TeamTooLarge { retry_after_ms, .. } => {
                return Self::retry_later(message, *retry_after_ms);
            }
            CoreError::Approval(_) => ErrorCode::NotFound,
            CoreError::InvalidSpec(_)
            | CoreError::UnknownLease { .. }
            | CoreError::EntryWithoutBinary
            | CoreError::BinaryForCommandTrial { .. }
            | CoreError::VersionTooLong
            | CoreError::NoNodeCanHold { .. }
            | CoreError::Sweep(_)
            | CoreError::AmbiguousExperiment { .. }
            | CoreError::AdminUnattributed
            | CoreError::ReportScopeConflict
            | CoreError::NameTooLong(_)
            | CoreError::SpecTooLarge { .. }
            | CoreError::SubmissionTooLarge { .. }
            | CoreError::StatusTooLarge { .. }
            | CoreError::TooManyBlobs { .. }
            | CoreError::OverPendingLimit { .. }
            | CoreError::SpecNotJson { .. }
            | CoreError::ObjectKeyRetired
            | CoreError::NoDriverSession
            | CoreError::InvalidPolicy(_) => ErrorCode::BadRequest,
            CoreError::ReportForbidden { .. }
            | CoreError::Refused(_)
            | CoreError::UnknownUser { .. } => ErrorCode::Forbidden,
            CoreError::TrialNotFound { .. }
            | CoreError::ExperimentNotFound { .. }
            | CoreError::NoExperimentMatches { .. }
            | CoreError::AttemptNotFound { .. }
            | CoreError::RankNotFound { .. }
            | CoreError::QueueNotFound { .. }
            | CoreError::PipelineNotFound { .. } => ErrorCode::NotFound,
        };
        Self::new(code, message)
    }
}

#[cfg(test)]
mod tests {
    use xp_runtime::ids::{ExperimentId, TrialId};
    use xp_runtime::protocol::{ErrorCode, RemoteError};

    use super::CoreError;

    fn check(error: CoreError, code: ErrorCode, message: &str) {
        let remote = RemoteError::from(error);
        assert_eq!((remote.code, remote.message.as_str()), (code, message));
    }

    #[test]
    fn each_error_keeps_its_wire_code_and_message() {
        let experiment = ExperimentId::from_content_hash(&[7; 32], 1);
        let trial_id = TrialId {
            experiment,
            index: 3,
        };
        check(
            CoreError::EntryWithoutBinary,
            ErrorCode::BadRequest,
            "an `entry` trial needs its driver binary uploaded",
        );
        check(
            CoreError::VersionTooLong,
            ErrorCode::BadRequest,
            "code or data version is longer than 512 bytes",
        );
        check(
            CoreError::TrialNotFound { trial_id },
            ErrorCode::NotFound,
            &format!("no trial {trial_id}"),
        );
        check(
            CoreError::ExperimentNotFound {
                experiment_id: experiment,
            },
            ErrorCode::NotFound,
            &format!("no experiment {experiment}"),
        );
        check(
            CoreError::NoExperimentMatches {
                prefix: "ab".to_owned(),
            },
            ErrorCode::NotFound,
            "no experiment \"ab\"",
        );
        check(
            CoreError::AmbiguousExperiment {
                prefix: "a".to_owned(),
                matches: 2,
            },
            ErrorCode::BadRequest,
            "\"a\" matches 2 experiments; give more digits",
        );
        check(
            CoreError::AttemptNotFound {
                trial_id,
                attempt: Some(4),
            },
            ErrorCode::NotFound,
            &format!("trial {trial_id} has no such attempt yet"),
        );
        check(
            CoreError::RankNotFound {
                trial_id,
                attempt: 1,
                rank: 5,
            },
            ErrorCode::NotFound,
            &format!("trial {trial_id} has no rank 5"),
        );
        check(
            CoreError::AdminUnattributed,
            ErrorCode::BadRequest,
            "an admin action needs who (1-128 characters) and why (at most 4096)",
        );
        check(
            CoreError::QueueNotFound {
                queue: "gpu".to_owned(),
            },
            ErrorCode::NotFound,
            "no queue \"gpu\" in the policy",
        );
    }

    #[test]
    fn too_many_pending_carries_its_retry_hint() {
        let remote = RemoteError::from(CoreError::TooManyPending {
            team: "a".to_owned(),
            pending: 3,
            adding: 2,
            limit: 4,
            retry_after_ms: 7_000,
        });
        assert_eq!(remote.code, ErrorCode::TooManyPending);
        assert_eq!(remote.retry_after_ms, Some(7_000));
        assert_eq!(
            remote.message,
            "team a has 3 pending trials and this submission adds 2, over its limit of 4 (admission.max_pending_per_team); retry later"
        );
    }
}
