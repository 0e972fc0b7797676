//! Telemetry: every `--telemetry-interval` the node samples each live worker's
//! CPU use and resident memory, and its GPUs through NVML (`gpu`), and sends
//! the head one `NodeMessage::Telemetry`.
//!
//! Where a worker has a cgroup its cgroup is measured, so children that left its
//! process group count: CPU from `cpuacct.usage` (v1, where `cpuacct` shares
//! the `cpu` hierarchy) or `cpu.stat`'s `usage_usec` (v2), memory as the
//! cgroup's working set. Otherwise (or where the cgroup lacks the file) its
//! processes are summed: those its cgroup lists, else its process group, each
//! from `/proc/PID/stat` (own and reaped children's CPU ticks) and
//! `/proc/PID/status` (`VmRSS`). CPU use is the change since the worker's
//! previous sample, so its first sample has none.
//!
//! Telemetry is best effort: samples go through a small queue to the session
//! (`QUEUE`), and one made while no session can take it is dropped, so a head
//! that is away costs a few samples, never unbounded memory.
//!
//! Each sample also runs the eviction watch (`eviction`): on a GPU whose
//! memory in use reaches 95%, the youngest live worker whose launch opted in to
//! oversubscription is handed to the agent to be stopped through its
//! checkpoint. GPU memory comes from NVML, or from `--gpu-memory-file` where
//! given (machines without NVML, tests). With telemetry off there is no watch.
//!
//! Invariant: every kernel file is read with a bound (`proc::MAX_FILE_BYTES`),
//! at most [`MAX_PROCESSES`] processes are read per worker, and what cannot be
//! read or parsed leaves its field absent.

pub(crate) mod eviction;
pub(crate) mod proc;

use std::collections::{BTreeSet, HashMap};
use std::io::Read;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};
use xp_runtime::clock::{Clock, SystemClock, UnixMillis};
use xp_runtime::ids::WorkerKey;
use xp_runtime::protocol::{
    GpuSample, MAX_TELEMETRY_WORKERS, NodeTelemetry, StoreUsage, WorkerSample,
};

use self::eviction::{Eviction, Oversubscribed};
use crate::cgroup::{CgroupFiles, Version};
use crate::gpu::{GpuMemory, GpuReading, GpuSampler};
use crate::objects::ObjectStore;

/// How often a node samples by default.
pub const DEFAULT_INTERVAL: Duration = Duration::from_secs(5);
/// The shortest interval accepted (0 turns telemetry off).
pub(crate) const MIN_INTERVAL: Duration = Duration::from_millis(200);
/// The longest interval accepted.
pub(crate) const MAX_INTERVAL: Duration = Duration::from_secs(3600);
/// The most processes read for one worker in one sample.
pub(crate) const MAX_PROCESSES: usize = 4096;
/// Samples waiting for the session; more are dropped.
pub(crate) const QUEUE: usize = 2;

/// Why a `--telemetry-interval` is refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum TelemetryIntervalError {
    /// Neither 0 (off) nor between 200 ms and 1 h.
    #[error(
        "the telemetry interval must be 0 (off) or between {} and {}",
        humantime::format_duration(MIN_INTERVAL),
        humantime::format_duration(MAX_INTERVAL)
    )]
    OutOfRange {
        /// The interval asked for.
        interval: Duration,
    },
}

/// Checks `--telemetry-interval`: 0 (off) or between 200 ms and 1 h.
pub fn check_interval(interval: Duration) -> Result<Duration, TelemetryIntervalError> {
    if interval.is_zero() || (MIN_INTERVAL..=MAX_INTERVAL).contains(&interval) {
        Ok(interval)
    } else {
        Err(TelemetryIntervalError::OutOfRange { interval })
    }
}

/// Where to measure one worker.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Target {
    /// Its process id, also its process group's.
    pub pid: u32,
    /// Its cgroup, where it has one.
    pub cgroup: Option<CgroupFiles>,
    /// The GPUs it holds.
    pub gpu_indices: Vec<u32>,
    /// Its launch opted in to oversubscription: it may be evicted for GPU memory.
    pub oversubscribed: bool,
    /// When it started (the youngest is evicted first).
    pub started_at: UnixMillis,
}

/// The live workers to sample, shared by the worker tasks (each adds itself
/// once started and is removed when its [`TargetGuard`] drops) and the sampler.
#[derive(Debug, Clone, Default)]
pub(crate) struct Targets(Arc<Mutex<HashMap<WorkerKey, Target>>>);

impl Targets {
    /// Samples `key` at `target` until the guard drops.
    pub(crate) fn register(&self, key: WorkerKey, target: Target) -> TargetGuard {
        self.0
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(key, target);
        TargetGuard {
            targets: self.clone(),
            key,
        }
    }

    /// The workers now, at most [`MAX_TELEMETRY_WORKERS`].
    pub(crate) fn snapshot(&self) -> Vec<(WorkerKey, Target)> {
        let targets = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        targets
            .iter()
            .take(MAX_TELEMETRY_WORKERS)
            .map(|(key, target)| (*key, target.clone()))
            .collect()
    }
}

/// Keeps a worker sampled; dropping it stops that.
#[derive(Debug)]
pub(crate) struct TargetGuard {
    targets: Targets,
    key: WorkerKey,
}

impl Drop for TargetGuard {
    fn drop(&mut self) {
        self.targets
            .0
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(&self.key);
    }
}

/// Reads at most [`proc::MAX_FILE_BYTES`] of a kernel file as text.
fn read_bounded(path: &Path) -> Option<String> {
    read_text_bounded(path, proc::MAX_FILE_BYTES)
}

/// Reads at most `max_bytes` of a kernel file as text; `None` when it cannot
/// be read or is not UTF-8.
pub(crate) fn read_text_bounded(path: &Path, max_bytes: u64) -> Option<String> {
    let file = std::fs::File::open(path).ok()?;
    let mut text = String::new();
    file.take(max_bytes).read_to_string(&mut text).ok()?;
    Some(text)
}

/// The processes of a process group, found by scanning `/proc` (bounded).
fn group_members(pgrp: u32) -> Vec<u32> {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    let mut members = Vec::new();
    for entry in entries.flatten() {
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|name| name.parse::<u32>().ok())
        else {
            continue;
        };
        let in_group = read_bounded(&entry.path().join("stat"))
            .and_then(|text| proc::parse_stat(&text))
            .is_some_and(|stat| stat.pgrp == pgrp);
        if in_group {
            members.push(pid);
            if members.len() >= MAX_PROCESSES {
                break;
            }
        }
    }
    members
}

/// CPU seconds used so far, and resident bytes, of one worker.
fn measure(target: &Target, clock_ticks: f64) -> (Option<f64>, Option<u64>) {
    let mut cpu_seconds = None;
    let mut rss = None;
    let mut listed = None;
    if let Some(cgroup) = &target.cgroup {
        cpu_seconds = match cgroup.version {
            Version::V1 => read_bounded(&cgroup.cpu_dir.join("cpuacct.usage"))
                .and_then(|text| proc::parse_number(&text))
                .map(|nanos| nanos as f64 / 1e9),
            Version::V2 => read_bounded(&cgroup.cpu_dir.join("cpu.stat"))
                .and_then(|text| proc::keyed(&text, "usage_usec"))
                .map(|micros| micros as f64 / 1e6),
        };
        let (usage_file, v2) = match cgroup.version {
            Version::V1 => ("memory.usage_in_bytes", false),
            Version::V2 => ("memory.current", true),
        };
        rss = read_bounded(&cgroup.memory_dir.join(usage_file))
            .and_then(|text| proc::parse_number(&text))
            .map(|usage| {
                let stat = read_bounded(&cgroup.memory_dir.join("memory.stat")).unwrap_or_default();
                proc::working_set(usage, &stat, v2)
            });
        listed = read_bounded(&cgroup.procs).map(|text| {
            let mut pids = proc::parse_pids(&text);
            pids.truncate(MAX_PROCESSES);
            pids
        });
    }
    if cpu_seconds.is_some() && rss.is_some() {
        return (cpu_seconds, rss);
    }
    let pids = listed.unwrap_or_else(|| group_members(target.pid));
    if pids.is_empty() {
        return (cpu_seconds, rss);
    }
    let mut ticks = 0u64;
    let mut rss_sum = 0u64;
    for pid in &pids {
        let dir = PathBuf::from(format!("/proc/{pid}"));
        if let Some(stat) = read_bounded(&dir.join("stat")).and_then(|text| proc::parse_stat(&text))
        {
            ticks = ticks.saturating_add(stat.ticks);
        }
        if let Some(bytes) =
            read_bounded(&dir.join("status")).and_then(|text| proc::parse_vm_rss(&text))
        {
            rss_sum = rss_sum.saturating_add(bytes);
        }
    }
    (
        cpu_seconds.or(Some(ticks as f64 / clock_ticks)),
        rss.or(Some(rss_sum)),
    )
}

/// The system's clock ticks per second (`_SC_CLK_TCK`), 100 where it cannot say.
pub(crate) fn clock_ticks() -> f64 {
    // SAFETY: sysconf only reads a configuration value.
    let ticks = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    if ticks > 0 { ticks as f64 } else { 100.0 }
}

/// What a sample needs to remember: each worker's CPU seconds at its last
/// sample, and NVML (or why there is none).
pub(crate) struct Sampler {
    last_cpu: HashMap<WorkerKey, (tokio::time::Instant, f64)>,
    gpu: Option<GpuSampler>,
    clock_ticks: f64,
    /// Where GPU memory is read instead of NVML (`--gpu-memory-file`).
    memory_file: Option<PathBuf>,
    /// Workers chosen for eviction that are still live.
    evicting: BTreeSet<WorkerKey>,
    /// Per GPU, the memory in use of the reading that chose its last eviction:
    /// the same figure again is no news (memory not yet given back, or a
    /// stand-in file not rewritten), so it evicts nobody more.
    judged: HashMap<u32, u64>,
    /// The last complaint about the memory file, said once until it changes.
    memory_file_error: Option<String>,
    /// Whether it has said that oversubscribed workers run with no memory
    /// reading to watch (no NVML and no memory file).
    said_unwatched: bool,
}

impl std::fmt::Debug for Sampler {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Sampler")
            .field("workers", &self.last_cpu.len())
            .field("gpu", &self.gpu.is_some())
            .finish()
    }
}

impl Sampler {
    /// A sampler; says once why GPU figures will be absent when NVML cannot load.
    pub(crate) fn new() -> Self {
        let gpu = match GpuSampler::new() {
            Ok(gpu) => Some(gpu),
            Err(error) => {
                info!(reason = %xp_runtime::error_chain::error_chain(&error), "telemetry has no GPU figures (CPU and memory are still sampled)");
                None
            }
        };
        Self {
            last_cpu: HashMap::new(),
            gpu,
            clock_ticks: clock_ticks(),
            memory_file: None,
            evicting: BTreeSet::new(),
            judged: HashMap::new(),
            memory_file_error: None,
            said_unwatched: false,
        }
    }

    /// Reads GPU memory for the eviction watch from `path` (`--gpu-memory-file`)
    /// instead of NVML.
    pub(crate) fn with_memory_file(mut self, path: Option<PathBuf>) -> Self {
        self.memory_file = path;
        self
    }

    #[cfg(test)]
    /// Samples `targets` (blocking: it reads kernel files and calls NVML).
    pub(crate) fn sample(
        &mut self,
        now: tokio::time::Instant,
        at: u64,
        targets: &[(WorkerKey, Target)],
        store: StoreUsage,
    ) -> NodeTelemetry {
        self.sample_and_evict(now, at, targets, store).0
    }

    /// Samples `targets` as [`Self::sample`] does, and says which oversubscribed
    /// workers to evict for GPU memory now.
    pub(crate) fn sample_and_evict(
        &mut self,
        now: tokio::time::Instant,
        at: u64,
        targets: &[(WorkerKey, Target)],
        store: StoreUsage,
    ) -> (NodeTelemetry, Vec<Eviction>) {
        let reading = match &self.gpu {
            Some(gpu) => gpu.sample().unwrap_or_else(|error| {
                debug!(error = %xp_runtime::error_chain::error_chain(&error), "GPU sample failed");
                GpuReading::default()
            }),
            None => GpuReading::default(),
        };
        let evictions = self.evictions(&reading.memory, targets);
        let mut workers = Vec::with_capacity(targets.len());
        let mut seen = HashMap::with_capacity(targets.len());
        for (key, target) in targets {
            let (cpu_seconds, rss_bytes) = measure(target, self.clock_ticks);
            let cpu_cores = cpu_seconds.and_then(|seconds| {
                seen.insert(*key, (now, seconds));
                let (then, before) = self.last_cpu.get(key)?;
                let elapsed = now.saturating_duration_since(*then).as_secs_f64();
                (elapsed > 0.0).then(|| ((seconds - before) / elapsed).max(0.0))
            });
            let gpus: Vec<&GpuSample> = reading
                .gpus
                .iter()
                .filter(|gpu| target.gpu_indices.contains(&gpu.index))
                .collect();
            let gpu_util = (!gpus.is_empty())
                .then(|| gpus.iter().map(|gpu| gpu.util).sum::<f64>() / gpus.len() as f64);
            let gpu_power_w = gpus.iter().map(|gpu| gpu.power_w).sum::<Option<f64>>();
            let gpu_mem_bytes = (!reading.process_memory.is_empty())
                .then(|| process_gpu_memory(target, &reading.process_memory))
                .flatten();
            workers.push(WorkerSample {
                key: *key,
                cpu_cores,
                rss_bytes,
                gpu_util,
                gpu_mem_bytes,
                gpu_power_w: gpu_power_w.filter(|_| !gpus.is_empty()),
            });
        }
        // Workers that are gone are forgotten.
        self.last_cpu = seen;
        let telemetry = NodeTelemetry {
            at,
            workers,
            gpus: reading.gpus,
            store,
        };
        (telemetry, evictions)
    }

    /// The eviction watch on one sample: GPU memory from the memory file where
    /// one is given, else from NVML's `nvml_memory`; nothing is read while no
    /// live worker oversubscribes.
    fn evictions(
        &mut self,
        nvml_memory: &[GpuMemory],
        targets: &[(WorkerKey, Target)],
    ) -> Vec<Eviction> {
        self.evicting
            .retain(|key| targets.iter().any(|(live, _)| live == key));
        let workers: Vec<Oversubscribed> = targets
            .iter()
            .filter(|(_, target)| target.oversubscribed)
            .map(|(key, target)| Oversubscribed {
                key: *key,
                gpus: target.gpu_indices.clone(),
                started_at: target.started_at,
            })
            .collect();
        if workers.is_empty() {
            return Vec::new();
        }
        let memory = match &self.memory_file {
            Some(path) => match eviction::read_memory_file(path) {
                Ok(memory) => {
                    if self.memory_file_error.take().is_some() {
                        info!(file = %path.display(), "the GPU memory file is usable again");
                    }
                    memory
                }
                Err(error) => {
                    let error = xp_runtime::error_chain::error_chain(&error);
                    if self.memory_file_error.as_deref() != Some(error.as_str()) {
                        warn!(file = %path.display(), %error, "cannot use the GPU memory file; no eviction for GPU memory until it is fixed");
                        self.memory_file_error = Some(error);
                    }
                    return Vec::new();
                }
            },
            None => {
                if nvml_memory.is_empty() && !self.said_unwatched {
                    warn!(
                        "oversubscribed workers run here, but no GPU memory can be read (no NVML, no --gpu-memory-file): none will be evicted before memory runs out"
                    );
                    self.said_unwatched = true;
                }
                nvml_memory.to_vec()
            }
        };
        let judged = &mut self.judged;
        let fresh: Vec<GpuMemory> = memory
            .into_iter()
            .filter(|gpu| {
                if judged.get(&gpu.index) == Some(&gpu.used_bytes) {
                    return false;
                }
                judged.remove(&gpu.index);
                true
            })
            .collect();
        let chosen = eviction::choose_evictions(
            &fresh,
            &workers,
            &self.evicting,
            eviction::DEFAULT_THRESHOLD_MILLI,
        );
        for eviction in &chosen {
            self.evicting.insert(eviction.key);
            self.judged
                .insert(eviction.gpu.index, eviction.gpu.used_bytes);
        }
        chosen
    }
}

impl Default for Sampler {
    fn default() -> Self {
        Self::new()
    }
}

/// The device memory of a worker's processes (its cgroup's, else its group's).
fn process_gpu_memory(target: &Target, by_pid: &HashMap<u32, u64>) -> Option<u64> {
    let pids = target
        .cgroup
        .as_ref()
        .and_then(|cgroup| read_bounded(&cgroup.procs))
        .map(|text| proc::parse_pids(&text))
        .unwrap_or_else(|| group_members(target.pid));
    let used: Vec<u64> = pids
        .iter()
        .filter_map(|pid| by_pid.get(pid).copied())
        .collect();
    (!used.is_empty()).then(|| used.iter().sum())
}

/// Samples every `interval` until `shutdown`, queueing each sample for the
/// session (dropped when the queue is full: no session is taking them) and
/// handing each eviction the watch chooses to the agent on `evictions`.
pub(crate) async fn run(
    interval: Duration,
    targets: Targets,
    store: Arc<ObjectStore>,
    out: mpsc::Sender<NodeTelemetry>,
    evictions: mpsc::UnboundedSender<Eviction>,
    memory_file: Option<PathBuf>,
    shutdown: CancellationToken,
) {
    let mut sampler = Some(
        tokio::task::spawn_blocking(Sampler::new)
            .await
            .unwrap_or_default()
            .with_memory_file(memory_file),
    );
    let mut ticks = tokio::time::interval(interval);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut dropped = 0u64;
    loop {
        tokio::select! {
            () = shutdown.cancelled() => return,
            _ = ticks.tick() => {}
        }
        let Some(mut taken) = sampler.take() else {
            return;
        };
        let workers = targets.snapshot();
        let stats = store.stat();
        let usage = StoreUsage {
            memory_bytes: stats.memory_bytes,
            disk_bytes: stats.disk_bytes,
        };
        let now = tokio::time::Instant::now();
        let at = SystemClock.now();
        let sampled = tokio::task::spawn_blocking(move || {
            let (telemetry, chosen) = taken.sample_and_evict(now, at, &workers, usage);
            (taken, telemetry, chosen)
        })
        .await;
        let Ok((returned, telemetry, chosen)) = sampled else {
            return;
        };
        sampler = Some(returned);
        for eviction in chosen {
            let _ = evictions.send(eviction);
        }
        if out.try_send(telemetry).is_err() {
            dropped += 1;
            if dropped.is_power_of_two() {
                debug!(
                    dropped,
                    "telemetry samples dropped while no session took them"
                );
            }
        }
    }
}

#[cfg(test)]
mod tests;
