//! Checkpoints on a node: taking them from a worker, backing them up, and putting
//! them back for a resumed worker. The worker and the agent only call in here.
//!
//! The route of one checkpoint, in the order it runs:
//!
//! 1. `watch`: the worker writes the files into its `XP_CHECKPOINT_DIR` and then
//!    prints `XP_CHECKPOINT {"step": N}`. Its stdout pump hands every line to
//!    [`CheckpointWatch::handle_line`], which keeps only rank 0's checkpoints
//!    (data-parallel ranks hold the same state).
//! 2. `take`: [`take`] renames the whole directory aside (one atomic step, so the
//!    worker can start on the next checkpoint at once and never mixes two),
//!    recreates it empty, and stores each file as an object pinned for the trial.
//! 3. `backup`: when the node has a backup directory, [`back_up`] writes the
//!    objects there too. A failed backup leaves the checkpoint on this node only.
//! 4. `watch` again: the checkpoint is reported to the head
//!    (`WorkerReport::Checkpoint`), a note goes into the worker's log, and the
//!    verdict is left under the worker's `CHECKPOINT_STATUS_DIR`, where the SDK
//!    waits for it.
//! 5. `restore`, when a later attempt resumes: [`CheckpointSources::restore_for_launch`]
//!    gets each object from this node's store, from another node, or from the
//!    backup directory ([`restore_from_backup`]), and writes the files into the
//!    new worker's directory before it starts, with `XP_RESUME_STEP` set.
//!
//! Not here: which checkpoints are kept, replicated or dropped (the head decides;
//! the agent carries out `Replicate`, `Pin` and `DropObjects`), the object store
//! itself (`objects`), and the checkpoint line's format (`xp_runtime::metric_line`).
//!
//! `mod.rs` only names the parts; each step lives in its own file, and the
//! errors in `error.rs`, so no part imports from the module above it.
//!
//! Invariants:
//! - A checkpoint is reported only after every file of it is stored and pinned;
//!   a failed take removes the objects it added.
//! - A restored file is written from bytes that hashed to its id, wherever they
//!   came from.
//! - A backup file is written atomically and fsynced, and read back only if it
//!   has the manifest's size and hashes to its id.

mod backup;
mod error;
mod inputs;
mod reader;
mod restore;
mod take;
#[cfg(test)]
mod tests;
mod watch;

pub(crate) use backup::remove_from_backup;
pub use error::CheckpointError;
pub(crate) use inputs::replace_markers;
pub(crate) use restore::CheckpointSources;
#[cfg(any(test, feature = "test-util"))]
pub(crate) use restore::restore;
pub use take::OutputLimits;
#[cfg(any(test, feature = "test-util"))]
pub(crate) use take::take;
pub(crate) use take::take_outputs;
pub(crate) use watch::{CheckpointSink, CheckpointWatch, DRAIN_GRACE, InFlight};
