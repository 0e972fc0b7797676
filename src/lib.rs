//! xp: run many machine-learning experiments in parallel on a GPU cluster and keep
//! an exact record of each.
//!
//! This crate re-exports the SDK and adds [`Cluster`], which either connects to a
//! running head or embeds a whole local cluster (a head and a node in this
//! process, workers as child processes) for laptops, examples and tests.

pub mod analysis;
pub mod bench;
mod cluster;
pub mod tune;

pub use cluster::{Cluster, ClusterError, LocalOptions};
pub use xp_sdk::*;
