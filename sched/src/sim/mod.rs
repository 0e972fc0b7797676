//! `xp sim`: a trace-driven cluster scheduling simulator over the head's own
//! policy core.
//!
//! It replays a workload ([`trace`]) on a simulated cluster ([`cluster`]) with a
//! simulated clock through the very [`crate::PolicyCore`] the head runs
//! ([`engine`]), and reports completion times, queueing delays, utilisation,
//! fairness, preemption losses and gang locality ([`report`]). [`place_once`](mod@place_once)
//! measures packing alone, and [`generate`](mod@generate) writes synthetic traces
//! ([`pipeline_gen`] pipeline workloads, [`dl_gen`] deep-learning gangs of 1
//! to 32 GPUs, [`gpu_sharing_gen`] a GPU-sharing
//! workload and cluster shaped like Alibaba's openb trace; [`elastic_gen`] makes
//! a share of a workload's jobs elastic). [`pipeline`] cuts a trace into
//! pipelines, reports their makespans and drives the critical-path boost.
//!
//! Everything here is pure: inputs arrive as text or values, results leave as
//! values, and no clock, file, or entropy source is touched. The `xp sim` command
//! reads the files and prints.

pub mod cluster;
pub mod dl_gen;
pub mod elastic_gen;
pub mod engine;
pub mod generate;
mod gpu_memory;
pub mod gpu_sharing_gen;
pub mod pipeline;
pub mod pipeline_gen;
pub mod place_once;
pub mod report;
pub mod trace;

#[cfg(test)]
mod tests;

pub use self::cluster::{ClusterError, ClusterSpec, parse_cluster_csv, parse_cluster_yaml};
pub use self::dl_gen::{DeepLearningOptions, generate_deep_learning};
pub use self::elastic_gen::{ElasticShareError, make_elastic};
pub use self::engine::{Oracle, SimError, SimOptions, simulate, simulate_oracle, srtf_policy};
pub use self::generate::{GenerateError, GenerateOptions, generate, scale_time};
pub use self::gpu_sharing_gen::{GpuSharingOptions, GpuSharingWorkload, generate_gpu_sharing};
pub use self::pipeline::CriticalPathBoost;
pub use self::pipeline_gen::{PipelineOptions, generate_pipelines};
pub use self::place_once::{PlaceOnceError, PlaceOnceOptions, PlaceOnceReport, place_once};
pub use self::report::SimReport;
pub use self::trace::{Trace, TraceError, parse_trace};
