//! Telemetry on the wire: what a node samples every `--telemetry-interval`
//! ([`NodeTelemetry`], sent as `NodeMessage::Telemetry`), and what the head
//! answers about a trial ([`TrialTelemetry`], `Response::Telemetry`).
//!
//! Telemetry is best effort: it is not numbered or acknowledged, and a sample
//! sent while the head is away is lost, so a node never buffers more than a few.
//! Every count is bounded ([`MAX_TELEMETRY_WORKERS`], [`MAX_TELEMETRY_GPUS`],
//! [`MAX_SERIES_POINTS`]) and the head drops what is not finite or out of range.
//!
//! Invariant: fields are append-only, like every protocol type.

use serde::{Deserialize, Serialize};

use crate::clock::UnixMillis;
use crate::ids::{TrialId, WorkerKey};

/// The most worker samples one [`NodeTelemetry`] may carry; the head ignores the rest.
pub const MAX_TELEMETRY_WORKERS: usize = 4096;

/// The most GPU samples one [`NodeTelemetry`] may carry; the head ignores the rest.
pub const MAX_TELEMETRY_GPUS: usize = 64;

/// The most points one worker's series holds at the head, whatever the trial's length.
pub const MAX_SERIES_POINTS: usize = 256;

/// One worker's resource use, sampled on its node. A field is absent when the
/// node could not measure it (no GPU, the first sample of a CPU rate).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct WorkerSample {
    /// The worker.
    pub key: WorkerKey,
    /// CPU use in cores since the previous sample (its cgroup, or its process group).
    pub cpu_cores: Option<f64>,
    /// Resident memory in bytes (its cgroup's usage, or its processes' `VmRSS`).
    pub rss_bytes: Option<u64>,
    /// The mean utilisation (percent) of the GPUs it holds.
    pub gpu_util: Option<f64>,
    /// Device memory its processes use, in bytes (NVML's running processes).
    pub gpu_mem_bytes: Option<u64>,
    /// The power drawn by the GPUs it holds, in watts.
    pub gpu_power_w: Option<f64>,
}

/// One GPU of a node, sampled through NVML.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct GpuSample {
    /// The device index, as `CUDA_VISIBLE_DEVICES` names it.
    pub index: u32,
    /// Utilisation in percent (0–100).
    pub util: f64,
    /// Device memory in use, in bytes.
    pub memory_used_bytes: u64,
    /// Power drawn in watts, when NVML can say.
    pub power_w: Option<f64>,
}

/// A node's object store, by tier.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct StoreUsage {
    /// Bytes in the memory tier.
    pub memory_bytes: u64,
    /// Bytes in the disk tier.
    pub disk_bytes: u64,
}

/// What a node sampled at one instant.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct NodeTelemetry {
    /// When, on the node's clock.
    pub at: UnixMillis,
    /// Each live worker.
    pub workers: Vec<WorkerSample>,
    /// Each GPU (empty without NVML).
    pub gpus: Vec<GpuSample>,
    /// Its object store.
    pub store: StoreUsage,
}

/// The summary of one field over a window of samples: enough to merge two
/// windows exactly (min, max, sum and count; the mean is `sum / n`).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct FieldStats {
    /// The smallest value.
    pub min: f64,
    /// The largest value.
    pub max: f64,
    /// The sum of the values.
    pub sum: f64,
    /// How many values.
    pub n: u64,
}

impl FieldStats {
    /// One value.
    pub fn of(value: f64) -> Self {
        Self {
            min: value,
            max: value,
            sum: value,
            n: 1,
        }
    }

    /// The mean of the values.
    pub fn mean(&self) -> f64 {
        if self.n == 0 {
            0.0
        } else {
            self.sum / self.n as f64
        }
    }

    /// Both windows' values together.
    pub fn merge(self, other: Self) -> Self {
        Self {
            min: self.min.min(other.min),
            max: self.max.max(other.max),
            sum: self.sum + other.sum,
            n: self.n + other.n,
        }
    }

    /// Merges two optional summaries: absent means no value.
    pub fn merge_opt(a: Option<Self>, b: Option<Self>) -> Option<Self> {
        match (a, b) {
            (Some(a), Some(b)) => Some(a.merge(b)),
            (a, b) => a.or(b),
        }
    }
}

/// A window of consecutive samples of one worker, each field summarised.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TelemetryWindow {
    /// The first sample's time.
    pub start_ms: UnixMillis,
    /// The last sample's time.
    pub end_ms: UnixMillis,
    /// How many samples it holds.
    pub samples: u64,
    /// CPU cores.
    pub cpu_cores: Option<FieldStats>,
    /// Resident bytes.
    pub rss_bytes: Option<FieldStats>,
    /// GPU utilisation, percent.
    pub gpu_util: Option<FieldStats>,
    /// GPU memory bytes.
    pub gpu_mem_bytes: Option<FieldStats>,
    /// GPU power, watts.
    pub gpu_power_w: Option<FieldStats>,
}

/// One rank's downsampled series.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct WorkerTelemetry {
    /// The rank.
    pub rank: u32,
    /// Its windows, oldest first (at most [`MAX_SERIES_POINTS`]).
    pub windows: Vec<TelemetryWindow>,
}

/// A trial's telemetry, per rank (`Response::Telemetry`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TrialTelemetry {
    /// The trial.
    pub trial: TrialId,
    /// Each rank that reported, by rank.
    pub workers: Vec<WorkerTelemetry>,
}
