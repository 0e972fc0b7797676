//! GPU discovery behind a trait: NVML when the driver library is present,
//! nothing otherwise; and [`GpuSampler`], telemetry's utilisation, memory and
//! power of each GPU and device memory of each process.
//!
//! Invariant: only this module calls NVML. `libnvidia-ml.so.1` is loaded at run
//! time, so the node builds and runs on machines without NVIDIA drivers; there
//! slots come from `--gpus N`.
//!
//! Not here: which GPUs a worker gets (the head places, `slots` enforces) or
//! anything about CUDA itself (`xp_runtime`, behind its `cuda` feature).

use std::collections::HashMap;

use nvml_wrapper::enums::device::UsedGpuMemory;
use nvml_wrapper::error::NvmlError;
use xp_runtime::error_chain::error_chain;
use xp_runtime::protocol::{GpuInfo, GpuSample};

/// Why a machine's GPUs could not be listed.
#[derive(Debug, thiserror::Error)]
pub(crate) enum GpuError {
    /// The NVML library could not be loaded or initialized (no NVIDIA driver).
    #[error("NVML unavailable")]
    Unavailable(#[source] NvmlError),
    /// NVML could not count the devices.
    #[error("NVML device count failed")]
    DeviceCount(#[source] NvmlError),
    /// NVML could not open one device.
    #[error("NVML device {index}")]
    Device {
        /// The device's NVML index.
        index: u32,
        /// NVML's reason.
        #[source]
        source: NvmlError,
    },
}

/// Something that can list a machine's GPUs.
pub(crate) trait GpuProbe {
    /// The GPUs, or why they cannot be listed.
    fn probe(&self) -> Result<Vec<GpuInfo>, GpuError>;
}

/// Lists NVIDIA GPUs through NVML.
#[derive(Debug, Default)]
pub(crate) struct NvmlProbe;

impl GpuProbe for NvmlProbe {
    fn probe(&self) -> Result<Vec<GpuInfo>, GpuError> {
        let nvml = nvml_wrapper::Nvml::init().map_err(GpuError::Unavailable)?;
        let count = nvml.device_count().map_err(GpuError::DeviceCount)?;
        (0..count)
            .map(|index| {
                let device = nvml
                    .device_by_index(index)
                    .map_err(|source| GpuError::Device { index, source })?;
                Ok(GpuInfo {
                    index,
                    model: device
                        .name()
                        .unwrap_or_else(|_| "unknown NVIDIA GPU".to_owned()),
                    memory_bytes: device.memory_info().map(|memory| memory.total).unwrap_or(0),
                })
            })
            .collect()
    }
}

/// One GPU's memory as last sampled (NVML, or `--gpu-memory-file`), which the
/// eviction watch (`telemetry::eviction`) judges.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct GpuMemory {
    /// The device index.
    pub index: u32,
    /// Bytes in use.
    pub used_bytes: u64,
    /// Bytes the device has; 0 when unknown (never evicts).
    pub total_bytes: u64,
}

/// One sample of every GPU, and the device memory each process uses.
#[derive(Debug, Clone, Default, PartialEq)]
pub(crate) struct GpuReading {
    /// Each GPU.
    pub gpus: Vec<GpuSample>,
    /// Device memory in use by process id, over every GPU.
    pub process_memory: HashMap<u32, u64>,
    /// Each GPU's memory in use and its total, for the eviction watch.
    pub memory: Vec<GpuMemory>,
}

/// Samples GPUs through NVML for telemetry; NVML is loaded once.
pub(crate) struct GpuSampler {
    nvml: nvml_wrapper::Nvml,
}

impl std::fmt::Debug for GpuSampler {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("GpuSampler")
    }
}

impl GpuSampler {
    /// Loads NVML, or says why it cannot.
    pub(crate) fn new() -> Result<Self, GpuError> {
        let nvml = nvml_wrapper::Nvml::init().map_err(GpuError::Unavailable)?;
        Ok(Self { nvml })
    }

    /// Each GPU's utilisation, memory in use and power (what a device cannot
    /// say is left out or absent), and each process's device memory.
    pub(crate) fn sample(&self) -> Result<GpuReading, GpuError> {
        let count = self.nvml.device_count().map_err(GpuError::DeviceCount)?;
        let mut reading = GpuReading::default();
        for index in 0..count.min(xp_runtime::protocol::MAX_TELEMETRY_GPUS as u32) {
            let device = self
                .nvml
                .device_by_index(index)
                .map_err(|source| GpuError::Device { index, source })?;
            // Memory first: the eviction watch needs it even where a device
            // (a MIG slice, say) reports no utilisation.
            let memory = device.memory_info().ok();
            if let Some(memory) = &memory {
                reading.memory.push(GpuMemory {
                    index,
                    used_bytes: memory.used,
                    total_bytes: memory.total,
                });
            }
            let Ok(util) = device.utilization_rates() else {
                continue;
            };
            let memory_used_bytes = memory.as_ref().map_or(0, |memory| memory.used);
            let power_w = device
                .power_usage()
                .ok()
                .map(|milliwatts| f64::from(milliwatts) / 1000.0);
            reading.gpus.push(GpuSample {
                index,
                util: f64::from(util.gpu),
                memory_used_bytes,
                power_w,
            });
            let processes = device.running_compute_processes().unwrap_or_default();
            for process in processes {
                if let UsedGpuMemory::Used(bytes) = process.used_gpu_memory {
                    *reading.process_memory.entry(process.pid).or_default() += bytes;
                }
            }
        }
        Ok(reading)
    }
}

/// `n` slots declared by the operator, for machines without NVML.
pub(crate) fn declared_gpus(n: u32) -> Vec<GpuInfo> {
    (0..n)
        .map(|index| GpuInfo {
            index,
            model: "declared".to_owned(),
            memory_bytes: 0,
        })
        .collect()
}

/// The node's GPU slots: `--gpus` when given, else what NVML finds, else none.
pub(crate) fn discover(declared: Option<u32>, probe: &dyn GpuProbe) -> Vec<GpuInfo> {
    if let Some(n) = declared {
        tracing::info!(gpus = n, "GPU slots declared with --gpus");
        return declared_gpus(n);
    }
    match probe.probe() {
        Ok(gpus) => {
            tracing::info!(gpus = gpus.len(), "GPU slots discovered through NVML");
            gpus
        }
        Err(error) => {
            let reason = error_chain(&error);
            tracing::info!(%reason, "no NVIDIA GPUs found; this node offers no GPU slots (use --gpus N to declare some)");
            Vec::new()
        }
    }
}

/// The slots of GPUs an allocation granted (a Slurm job's ordinals, as its
/// `CUDA_VISIBLE_DEVICES` numbers them): exactly those, described by NVML where it
/// lists a GPU of that index, and as `granted` slots elsewhere.
pub(crate) fn granted(indices: &[u32], probe: &dyn GpuProbe) -> Vec<GpuInfo> {
    if indices.is_empty() {
        return Vec::new();
    }
    let known = match probe.probe() {
        Ok(gpus) => gpus,
        Err(error) => {
            let reason = error_chain(&error);
            tracing::info!(%reason, "NVML cannot describe the granted GPUs; offering them as slots");
            Vec::new()
        }
    };
    indices
        .iter()
        .map(|index| {
            known
                .iter()
                .find(|gpu| gpu.index == *index)
                .cloned()
                .unwrap_or_else(|| GpuInfo {
                    index: *index,
                    model: "granted".to_owned(),
                    memory_bytes: 0,
                })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The GPUs it lists, or none: NVML's driver is not loaded.
    struct FakeProbe(Option<Vec<GpuInfo>>);

    impl GpuProbe for FakeProbe {
        fn probe(&self) -> Result<Vec<GpuInfo>, GpuError> {
            self.0
                .clone()
                .ok_or(GpuError::Unavailable(NvmlError::DriverNotLoaded))
        }
    }

    #[test]
    fn declared_slots_win_and_a_missing_driver_means_none() {
        let found = FakeProbe(Some(declared_gpus(8)));
        assert_eq!(discover(Some(2), &found).len(), 2);
        assert_eq!(discover(None, &found).len(), 8);
        assert!(discover(None, &FakeProbe(None)).is_empty());
    }

    #[test]
    fn granted_gpus_are_exactly_the_grant() {
        let found = FakeProbe(Some(vec![
            GpuInfo {
                index: 2,
                model: "H100".to_owned(),
                memory_bytes: 80,
            },
            GpuInfo {
                index: 3,
                model: "H100".to_owned(),
                memory_bytes: 80,
            },
        ]));
        // NVML lists more than the job holds: only the grant is offered.
        let gpus = granted(&[3, 5], &found);
        assert_eq!(gpus.iter().map(|gpu| gpu.index).collect::<Vec<_>>(), [3, 5]);
        assert_eq!(gpus[0].model, "H100");
        assert_eq!(gpus[1].model, "granted");
        assert!(granted(&[], &found).is_empty());
        assert_eq!(granted(&[0, 1], &FakeProbe(None)).len(), 2);
    }

    #[test]
    fn gpu_sampler_reads_real_gpus_or_says_why_not() {
        // The GPU path of telemetry: runs where NVML exists, skips with the reason elsewhere.
        match GpuSampler::new().and_then(|sampler| sampler.sample()) {
            Ok(reading) => {
                assert!(!reading.gpus.is_empty(), "NVML loaded but sampled no GPU");
                for gpu in &reading.gpus {
                    assert!((0.0..=100.0).contains(&gpu.util), "{gpu:?}");
                    assert!(gpu.power_w.is_none_or(|watts| watts >= 0.0), "{gpu:?}");
                }
                // The eviction watch's figures: each GPU's memory, within its total.
                assert!(!reading.memory.is_empty(), "NVML gave no GPU memory");
                for memory in &reading.memory {
                    assert!(
                        memory.total_bytes > 0 && memory.used_bytes <= memory.total_bytes,
                        "{memory:?}"
                    );
                }
            }
            Err(reason) => {
                assert!(
                    std::env::var("XP_GPU_TESTS").as_deref() != Ok("1"),
                    "XP_GPU_TESTS=1 but NVML sampled no GPU: {reason}"
                );
                #[expect(
                    clippy::print_stderr,
                    reason = "tell the reader why the GPU path was skipped"
                )]
                {
                    eprintln!(
                        "skipping the NVML telemetry check: {}",
                        error_chain(&reason)
                    );
                }
            }
        }
    }

    #[test]
    fn nvml_probe_reports_a_reason_or_real_gpus() {
        // Where a GPU exists this lists it; elsewhere it must fail cleanly, not panic.
        match NvmlProbe.probe() {
            Ok(gpus) => assert!(gpus.iter().all(|gpu| !gpu.model.is_empty())),
            Err(reason) => {
                // The GPU check script runs this where a GPU must be found.
                assert!(
                    std::env::var("XP_GPU_TESTS").as_deref() != Ok("1"),
                    "XP_GPU_TESTS=1 but NVML found no GPU: {reason}"
                );
                #[expect(
                    clippy::print_stderr,
                    reason = "tell the reader why the GPU path was skipped"
                )]
                {
                    eprintln!("skipping NVML check: {}", error_chain(&reason));
                }
                assert!(reason.to_string().contains("NVML"));
            }
        }
    }
}
