//! Everything two xp processes must agree on, and the pure engines they share.
//!
//! This crate holds the wire protocol and its framing, the QUIC transport with the
//! cluster's trust model, ids, the experiment specification and its validation,
//! experiment identity hashing and the search-space samplers. It has no actor
//! system and no knowledge of head or node internals, so a worker process that
//! links it stays light.
#![warn(missing_docs)]

pub mod clock;
pub mod collective;
mod fill_buffer;
pub mod frame;
pub mod identity;
pub mod ids;
pub mod join;
pub mod metric_line;
#[cfg(feature = "cuda")]
pub mod nccl;
pub mod object_wire;
pub mod protocol;
pub mod rendezvous;
pub mod search;
pub mod spec;
pub mod stats;
pub mod stopping;
pub mod task;
pub mod testfns;
pub mod tls;
pub mod transport;
pub mod views;
