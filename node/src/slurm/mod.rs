//! A node inside a Slurm job offers exactly what the job's allocation grants.
//!
//! When `SLURM_JOB_ID` is set, [`offer`] turns the job's environment and the
//! node's cgroup limits into the GPUs, CPUs and memory to register, each with the
//! source it came from so the node can say so: GPUs from `CUDA_VISIBLE_DEVICES`,
//! else `SLURM_STEP_GPUS`, `SLURM_JOB_GPUS`, `SLURM_GPUS_ON_NODE` (a count), and
//! none when the job was granted none (the machine's other GPUs belong to other
//! jobs, so NVML's list is never offered whole); CPUs as the least of
//! `SLURM_CPUS_ON_NODE`, the cgroup's cpuset and its CPU quota; memory as the
//! least of `SLURM_MEM_PER_NODE` (or `SLURM_MEM_PER_CPU` times the CPUs) and the
//! cgroup's memory limit. What an explicit flag sets is not detected at all, so a
//! malformed variable for it does not matter.
//!
//! [`offer`] is pure (environment and cgroup readings in, the offer out); `host`
//! reads them from the process and the kernel, and [`detect_slurm`] puts the
//! two together for the binary and says what it found.
//!
//! Not here: leaving when the job ends (SIGTERM drains the node: `node_core`'s
//! drain), or GPU models and memory (`gpu::granted` asks NVML about the granted
//! ordinals).
//!
//! Invariant: inside a job, nothing is offered beyond what one of the job's
//! grants or limits allows; a malformed value is an error naming the variable,
//! never a guess.

mod host;

#[cfg(test)]
mod tests;

use std::collections::BTreeMap;

pub(crate) use host::{read_cgroup_limits, read_env};

/// Set inside every Slurm job (and job step): the job's id.
pub(crate) const JOB_ID: &str = "SLURM_JOB_ID";
/// The label a node inside a Slurm job adds to its registration: the job's id.
pub const SLURM_JOB_LABEL: &str = "slurm_job";
/// The most GPUs one allocation may list (far more than any machine has).
pub(crate) const MAX_GRANTED_GPUS: usize = 256;
/// The longest variable value read; Slurm's values are short lists and numbers.
pub(crate) const MAX_VALUE_BYTES: usize = 4096;
/// Bytes in Slurm's memory unit (`--mem` and `SLURM_MEM_PER_*` count mebibytes).
const SLURM_MIB: u64 = 1024 * 1024;

/// The variables [`offer`] reads, in the order they are looked at.
pub(crate) const VARIABLES: [&str; 9] = [
    JOB_ID,
    "SLURM_ARRAY_JOB_ID",
    "CUDA_VISIBLE_DEVICES",
    "SLURM_STEP_GPUS",
    "SLURM_JOB_GPUS",
    "SLURM_GPUS_ON_NODE",
    "SLURM_CPUS_ON_NODE",
    "SLURM_MEM_PER_NODE",
    "SLURM_MEM_PER_CPU",
];

/// The Slurm-related environment of the node: each of [`VARIABLES`] that is set.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct SlurmEnv {
    values: BTreeMap<&'static str, String>,
}

impl SlurmEnv {
    /// An environment holding `pairs` (names outside [`VARIABLES`] are ignored).
    pub(crate) fn from_pairs<'a>(pairs: impl IntoIterator<Item = (&'a str, &'a str)>) -> Self {
        let mut values = BTreeMap::new();
        for (name, value) in pairs {
            if let Some(known) = VARIABLES.iter().find(|known| **known == name) {
                values.insert(*known, value.to_owned());
            }
        }
        Self { values }
    }

    fn get(&self, name: &str) -> Option<&str> {
        self.values.get(name).map(String::as_str)
    }
}

/// What the cgroup the node runs in allows (the tightest of it and its
/// ancestors); each `None` where the machine sets no such limit or has no cgroup.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub(crate) struct CgroupLimits {
    /// CPUs in the cgroup's cpuset.
    pub cpuset_cpus: Option<u32>,
    /// Cores the CPU quota allows (quota over period).
    pub quota_cores: Option<f64>,
    /// The memory limit in bytes.
    pub memory_bytes: Option<u64>,
}

/// Which resources were set by flags, and so are not detected.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ExplicitFlags {
    /// `--gpus` was given.
    pub gpus: bool,
    /// `--cpus` was given.
    pub cpus: bool,
    /// `--memory` was given.
    pub memory: bool,
}

/// A detected amount and where it came from, for the node's log.
#[derive(Debug, Clone, PartialEq)]
pub struct Detected<T> {
    /// The amount.
    pub value: T,
    /// The variable or cgroup file that decided it.
    pub source: &'static str,
}

/// What a node inside a Slurm job offers; a `None` is left to the flag or the
/// node's usual default.
#[derive(Debug, Clone, PartialEq)]
pub struct SlurmOffer {
    /// The job's id (`SLURM_JOB_ID`, also for an array's task).
    pub job_id: String,
    /// The array's job id when the job is a task of an array.
    pub array_job_id: Option<String>,
    /// The GPU ordinals the job was granted, as `CUDA_VISIBLE_DEVICES` numbers
    /// them for its processes (empty: none); `None` when `--gpus` was given.
    pub gpus: Option<Detected<Vec<u32>>>,
    /// CPU cores; `None` when `--cpus` was given or nothing limits them.
    pub cpus: Option<Detected<f64>>,
    /// Memory in bytes; `None` when `--memory` was given or nothing limits it.
    pub memory_bytes: Option<Detected<u64>>,
}

/// A Slurm variable the node cannot use.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SlurmError {
    /// A variable holds something other than what Slurm writes there.
    #[error(
        "{name}={value:?} inside Slurm job {job}: expected {expected}; pass {flag} to set it yourself"
    )]
    Invalid {
        /// The job.
        job: String,
        /// The variable.
        name: &'static str,
        /// Its value (cut at 64 characters).
        value: String,
        /// What it should hold.
        expected: &'static str,
        /// The flag that overrides it.
        flag: &'static str,
    },
}

/// Inside a Slurm job: what the allocation grants, for each resource no flag
/// set (said in the log), read from this process's environment and cgroup;
/// `None` outside a job. Warns when the node has no `checkpoint_backup`, since a
/// checkpoint held only here leaves with the job.
pub fn detect_slurm(
    explicit: ExplicitFlags,
    checkpoint_backup: bool,
) -> Result<Option<SlurmOffer>, SlurmError> {
    let env = read_env();
    let cgroup = read_cgroup_limits();
    let Some(offer) = offer(explicit, &env, &cgroup)? else {
        return Ok(None);
    };
    let describe = |detected: Option<String>, flag: bool| match (detected, flag) {
        (_, true) => "set by flag".to_owned(),
        (Some(detected), false) => detected,
        (None, false) => "no limit found; the machine's".to_owned(),
    };
    tracing::info!(
        job = %offer.job_id,
        array = offer.array_job_id.as_deref().unwrap_or("-"),
        gpus = %describe(offer.gpus.as_ref().map(|gpus| format!("{:?} from {}", gpus.value, gpus.source)), explicit.gpus),
        cpus = %describe(offer.cpus.as_ref().map(|cpus| format!("{} from {}", cpus.value, cpus.source)), explicit.cpus),
        memory = %describe(offer.memory_bytes.as_ref().map(|memory| format!("{} from {}", bytesize::ByteSize::b(memory.value), memory.source)), explicit.memory),
        "inside a Slurm job: offering what the allocation grants"
    );
    if !checkpoint_backup {
        tracing::warn!(
            "inside a Slurm job without --checkpoint-backup: a checkpoint held only by this node leaves with it when the job ends; pass a directory on the shared file system"
        );
    }
    Ok(Some(offer))
}

/// The offer of a node whose environment is `env` and whose cgroup allows
/// `cgroup`: `None` outside a Slurm job (no `SLURM_JOB_ID`).
pub(crate) fn offer(
    explicit: ExplicitFlags,
    env: &SlurmEnv,
    cgroup: &CgroupLimits,
) -> Result<Option<SlurmOffer>, SlurmError> {
    let Some(job) = env.get(JOB_ID).map(str::trim).filter(|job| !job.is_empty()) else {
        return Ok(None);
    };
    let job_id: String = job.chars().take(64).collect();
    let array_job_id = env
        .get("SLURM_ARRAY_JOB_ID")
        .map(str::trim)
        .filter(|array| !array.is_empty() && *array != job)
        .map(|array| array.chars().take(64).collect());
    let reader = Reader { env, job };
    let gpus = (!explicit.gpus).then(|| reader.gpus()).transpose()?;
    // The CPUs granted also size `SLURM_MEM_PER_CPU`'s memory.
    let granted_cpus = if explicit.cpus && explicit.memory {
        None
    } else {
        reader.whole("SLURM_CPUS_ON_NODE", "--cpus")?
    };
    let cpus = if explicit.cpus {
        None
    } else {
        least([
            granted_cpus.map(|cpus| (cpus as f64, "SLURM_CPUS_ON_NODE")),
            cgroup
                .cpuset_cpus
                .map(|cpus| (f64::from(cpus), "the cgroup's cpuset")),
            cgroup
                .quota_cores
                .filter(|cores| cores.is_finite() && *cores > 0.0)
                .map(|cores| (cores, "the cgroup's CPU quota")),
        ])
    };
    let memory_bytes = if explicit.memory {
        None
    } else {
        least([
            reader.memory(granted_cpus)?,
            cgroup
                .memory_bytes
                .filter(|bytes| *bytes > 0)
                .map(|bytes| (bytes, "the cgroup's memory limit")),
        ])
    };
    Ok(Some(SlurmOffer {
        job_id,
        array_job_id,
        gpus,
        cpus,
        memory_bytes,
    }))
}

/// The least of the amounts present, with its source.
fn least<T: PartialOrd + Copy, const N: usize>(
    candidates: [Option<(T, &'static str)>; N],
) -> Option<Detected<T>> {
    candidates
        .into_iter()
        .flatten()
        .fold(
            None,
            |best: Option<(T, &'static str)>, candidate| match best {
                Some(best) if best.0 <= candidate.0 => Some(best),
                _ => Some(candidate),
            },
        )
        .map(|(value, source)| Detected { value, source })
}

/// Reads the job's variables, naming the job in its errors.
struct Reader<'a> {
    env: &'a SlurmEnv,
    job: &'a str,
}

impl Reader<'_> {
    fn invalid(
        &self,
        name: &'static str,
        value: &str,
        expected: &'static str,
        flag: &'static str,
    ) -> SlurmError {
        SlurmError::Invalid {
            job: self.job.chars().take(64).collect(),
            name,
            value: value.chars().take(64).collect(),
            expected,
            flag,
        }
    }

    /// A positive whole number, or `None` when unset (or, for memory, 0).
    fn whole(&self, name: &'static str, flag: &'static str) -> Result<Option<u64>, SlurmError> {
        let Some(value) = self.env.get(name) else {
            return Ok(None);
        };
        match value.trim().parse::<u64>() {
            Ok(number) if number > 0 => Ok(Some(number)),
            _ => Err(self.invalid(name, value, "a positive whole number", flag)),
        }
    }

    /// The job's memory: `SLURM_MEM_PER_NODE`, else `SLURM_MEM_PER_CPU` times the
    /// CPUs granted here. `0` means the whole node (`--mem=0`), so no limit.
    fn memory(&self, granted_cpus: Option<u64>) -> Result<Option<(u64, &'static str)>, SlurmError> {
        let mebibytes = |name: &'static str| -> Result<Option<u64>, SlurmError> {
            let Some(value) = self.env.get(name) else {
                return Ok(None);
            };
            match value.trim().parse::<u64>() {
                Ok(0) => Ok(None),
                Ok(number) => number.checked_mul(SLURM_MIB).map(Some).ok_or_else(|| {
                    self.invalid(name, value, "mebibytes that fit in 64 bits", "--memory")
                }),
                Err(_) => Err(self.invalid(name, value, "a whole number of mebibytes", "--memory")),
            }
        };
        if let Some(bytes) = mebibytes("SLURM_MEM_PER_NODE")? {
            return Ok(Some((bytes, "SLURM_MEM_PER_NODE")));
        }
        match (mebibytes("SLURM_MEM_PER_CPU")?, granted_cpus) {
            (Some(per_cpu), Some(cpus)) => Ok(Some((
                per_cpu.saturating_mul(cpus),
                "SLURM_MEM_PER_CPU times SLURM_CPUS_ON_NODE",
            ))),
            _ => Ok(None),
        }
    }

    /// The GPU ordinals granted, from the first variable set.
    fn gpus(&self) -> Result<Detected<Vec<u32>>, SlurmError> {
        const LISTS: [&str; 3] = ["CUDA_VISIBLE_DEVICES", "SLURM_STEP_GPUS", "SLURM_JOB_GPUS"];
        for name in LISTS {
            let Some(value) = self.env.get(name) else {
                continue;
            };
            // Slurm writes `NoDevFiles` where a GPU GRES has no device files:
            // nothing to hand to a worker, so the next variable decides.
            if value.trim() == "NoDevFiles" {
                continue;
            }
            let indices = self.ordinals(name, value)?;
            return Ok(Detected {
                value: indices,
                source: name,
            });
        }
        if let Some(count) =
            self.whole("SLURM_GPUS_ON_NODE", "--gpus")
                .or_else(
                    |error| match self.env.get("SLURM_GPUS_ON_NODE").map(str::trim) {
                        // Slurm sets 0 for a job without GPUs.
                        Some("0") => Ok(None),
                        _ => Err(error),
                    },
                )?
        {
            if count as usize > MAX_GRANTED_GPUS {
                let value = count.to_string();
                return Err(self.invalid(
                    "SLURM_GPUS_ON_NODE",
                    &value,
                    "at most 256 GPUs",
                    "--gpus",
                ));
            }
            return Ok(Detected {
                value: (0..count as u32).collect(),
                source: "SLURM_GPUS_ON_NODE",
            });
        }
        Ok(Detected {
            value: Vec::new(),
            source: "no GPU variable: the job was granted none",
        })
    }

    /// A comma-separated list of device ordinals (an empty list is no GPU).
    fn ordinals(&self, name: &'static str, value: &str) -> Result<Vec<u32>, SlurmError> {
        const EXPECTED: &str = "comma-separated GPU ordinals such as 0,1 (not UUIDs), at most 256";
        let mut indices = Vec::new();
        for part in value
            .split(',')
            .map(str::trim)
            .filter(|part| !part.is_empty())
        {
            let index = part
                .parse::<u32>()
                .map_err(|_| self.invalid(name, value, EXPECTED, "--gpus"))?;
            if !indices.contains(&index) {
                indices.push(index);
            }
            if indices.len() > MAX_GRANTED_GPUS {
                return Err(self.invalid(name, value, EXPECTED, "--gpus"));
            }
        }
        Ok(indices)
    }
}

/// A cpuset list such as `0-3,8,10-11`: how many CPUs it names (`None` when
/// malformed, so an unreadable cpuset limits nothing rather than everything).
pub(crate) fn cpuset_count(list: &str) -> Option<u32> {
    let mut count: u32 = 0;
    for part in list.trim().split(',').filter(|part| !part.is_empty()) {
        let (first, last) = match part.split_once('-') {
            Some((first, last)) => (first.parse::<u32>().ok()?, last.parse::<u32>().ok()?),
            None => {
                let cpu = part.parse::<u32>().ok()?;
                (cpu, cpu)
            }
        };
        if last < first {
            return None;
        }
        count = count.checked_add(last - first + 1)?;
    }
    (count > 0).then_some(count)
}

/// Cores a v2 `cpu.max` (`QUOTA PERIOD`, or `max PERIOD`) allows.
pub(crate) fn v2_quota_cores(cpu_max: &str) -> Option<f64> {
    let mut fields = cpu_max.split_whitespace();
    let quota: u64 = fields.next()?.parse().ok()?;
    let period: u64 = fields.next()?.parse().ok()?;
    quota_cores(quota, period)
}

/// Cores a v1 `cpu.cfs_quota_us` over `cpu.cfs_period_us` allows (`-1`: no quota).
pub(crate) fn v1_quota_cores(quota_us: &str, period_us: &str) -> Option<f64> {
    let quota: u64 = quota_us.trim().parse().ok()?;
    let period: u64 = period_us.trim().parse().ok()?;
    quota_cores(quota, period)
}

fn quota_cores(quota: u64, period: u64) -> Option<f64> {
    (quota > 0 && period > 0).then(|| quota as f64 / period as f64)
}

/// A memory limit file (`memory.max` or v1 `memory.limit_in_bytes`): `None` for
/// `max`, and for v1's "unlimited" (the largest page-aligned value, past 2^62).
pub(crate) fn memory_limit(text: &str) -> Option<u64> {
    let bytes: u64 = text.trim().parse().ok()?;
    (bytes > 0 && bytes < 1 << 62).then_some(bytes)
}
