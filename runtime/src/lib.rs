//! Everything two xp processes must agree on.
//!
//! This crate holds the wire protocol and its framing, the QUIC transport with the
//! cluster's trust model, ids, the experiment specification (the search space
//! declaration included) and its validation, experiment identity hashing, the
//! collectives and the object wire. The search engines and stopping rules live in
//! `xp-tune`, the scheduling policy in `xp-sched`. It has no actor system and no
//! knowledge of head or node internals, so a worker process that links it stays
//! light.
#![warn(missing_docs)]

pub mod clock;
#[cfg(feature = "net")]
pub mod collective;
pub mod error_chain;
#[cfg(feature = "net")]
mod fill_buffer;
#[cfg(feature = "net")]
pub mod frame;
pub mod identity;
pub mod ids;
pub mod join;
#[cfg(feature = "net")]
pub mod metric_line;
pub mod metric_value;
#[cfg(feature = "cuda")]
pub mod nccl;
#[cfg(feature = "net")]
pub mod object_wire;
pub mod protocol;
#[cfg(feature = "net")]
pub mod rendezvous;
pub mod report;
pub mod seeded;
pub mod spec;
pub mod stderr_tail;
#[cfg(feature = "net")]
pub mod task;
#[cfg(feature = "net")]
pub mod tls;
#[cfg(feature = "net")]
pub mod transport;
pub mod views;
mod wire_seq;
