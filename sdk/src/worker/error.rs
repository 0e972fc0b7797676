//! Why a worker call failed: [`WorkerError`], one variant per thing that can go
//! wrong, each carrying what was being done and, where there is one, the cause
//! as its `source` (print it with `xp_runtime::error_chain` to see every level).
//!
//! The `Display` of a variant starts with its area (`collective:`,
//! `checkpoint:`, `object:`), which the Python package maps to its exception
//! classes. A refusal from the node is its text: the node's reason crosses a
//! process boundary as a string and has no typed cause here.

use std::path::PathBuf;
use std::time::Duration;

use xp_runtime::collective::CollectiveError;
use xp_runtime::object_wire::WireError;
use xp_runtime::rendezvous::RendezvousError;

/// Why a worker call failed.
#[derive(Debug, thiserror::Error)]
pub enum WorkerError {
    /// A variable of the contract is missing or malformed: not started by a node?
    #[error("environment variable {name} is missing or malformed: {reason}")]
    Env {
        /// The variable.
        name: &'static str,
        /// What is wrong.
        reason: String,
    },
    /// The ring's listener could not be bound, or the ring could not be connected.
    #[error("collective: cannot {doing}")]
    Collective {
        /// What this rank was doing: `bind the ring listener`, `connect the ring`.
        doing: &'static str,
        /// The cause, which names the rank at fault where there is one.
        #[source]
        source: CollectiveError,
    },
    /// The ranks could not meet at rank 0's rendezvous store (a rank that did
    /// not arrive in time is named in the cause).
    #[error("collective: cannot meet the other ranks")]
    Rendezvous(#[source] RendezvousError),
    /// The small runtime the rendezvous runs on could not start.
    #[error("collective: cannot start the rendezvous runtime")]
    RendezvousRuntime(#[source] std::io::Error),
    /// The gang's NCCL communicator could not be made.
    #[cfg(feature = "cuda")]
    #[error("collective: cannot join the gang's NCCL communicator")]
    Nccl(#[source] xp_runtime::nccl::NcclError),
    /// A checkpoint file or directory could not be written.
    #[error("checkpoint: cannot {doing} {}", .path.display())]
    CheckpointFile {
        /// What was being done: `create`, `write`, `read`.
        doing: &'static str,
        /// The file or directory.
        path: PathBuf,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// The checkpoint this attempt resumes from cannot be read.
    #[error("checkpoint: resuming from step {step} but cannot read {}", .path.display())]
    Restore {
        /// The checkpoint's step.
        step: u64,
        /// The state file.
        path: PathBuf,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// The node refused or failed to store the checkpoint; its reason.
    #[error("checkpoint: {reason}")]
    CheckpointRefused {
        /// The checkpoint's step.
        step: u64,
        /// The node's reason.
        reason: String,
    },
    /// The node gave no verdict on the checkpoint in time.
    #[error(
        "checkpoint: the node gave no verdict on the checkpoint at step {step} within {waited:?}"
    )]
    CheckpointTimeout {
        /// The checkpoint's step.
        step: u64,
        /// How long the worker waited.
        waited: Duration,
    },
    /// A file to put, or a got object's file, could not be written or read.
    #[error("object: cannot {doing} {}", .path.display())]
    ObjectFile {
        /// What was being done: `create`, `write`, `resolve`, `read`.
        doing: &'static str,
        /// The file or directory.
        path: PathBuf,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// The node's local object channel failed.
    #[error("object: cannot {doing} the node at {socket}")]
    NodeChannel {
        /// What was being done: `reach`, `write to`, `hear from`, `read the whole answer of`.
        doing: &'static str,
        /// The channel's socket (`XP_NODE_SOCKET`).
        socket: String,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// A message on the node's object channel could not be encoded or decoded.
    #[error("object: bad message on the node's channel")]
    ObjectMessage(#[source] WireError),
    /// The node refused the object request; its reason.
    #[error("object: {reason}")]
    ObjectRefused {
        /// The node's reason.
        reason: String,
    },
    /// The node answered with something other than the request's answer.
    #[error("object: unexpected answer from the node: {answer}")]
    ObjectUnexpected {
        /// The answer, as debug text.
        answer: String,
    },
    /// A parameter is missing or has another type.
    #[error("parameter `{name}` {reason}")]
    Param {
        /// The parameter.
        name: String,
        /// What is wrong.
        reason: &'static str,
    },
}
