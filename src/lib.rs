//! xp: run many machine-learning experiments in parallel on a GPU cluster and keep
//! an exact record of each.
//!
//! This crate re-exports the SDK and adds [`Cluster`], which either connects to a
//! running head or embeds a whole local cluster (a head and a node in this
//! process, workers as child processes) for laptops, examples and tests.
//!
//! Beside it sit the engines of the commands that need no cluster of their own,
//! for the `xp` binary: [`compare`] and [`compare_front`] (`xp compare`),
//! [`tune()`] (`xp tune`), and the runtime's measurements ([`bench_trials`],
//! [`bench_commits`], [`bench_logs`], [`bench_objects`], [`bench_fleet`]: `xp bench`).
//! Modules are private; what is public is the list below.

mod analysis;
mod bench;
mod cluster;
mod tune;

pub use analysis::{
    CompareError, Comparison, ConfigObjectives, ConfigSummary, FrontComparison, compare,
    compare_front,
};
pub use bench::fleet::{FleetError, FleetOptions, FleetReport, bench_fleet};
pub use bench::logs::{LogBench, LogBenchError, bench_logs};
pub use bench::objects::{ObjectBenchError, ObjectMeasurement, bench_objects};
pub use bench::{CommitBench, TrialsBench, bench_commits, bench_trials};
pub use cluster::{Cluster, ClusterError, LocalOptions};
pub use tune::{TuneError, TuneFront, TuneJob, TuneSummary, tune};
pub use xp_sdk::*;
