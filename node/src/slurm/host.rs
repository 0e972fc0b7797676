//! Reading what `offer` needs from this process: its Slurm variables and the
//! limits of the cgroup it runs in (v2, or the v1 `cpuset`, `cpu` and `memory`
//! hierarchies), the tightest of that cgroup and its ancestors.
//!
//! Not here: judging the readings (the pure `offer`). Every kernel file is read
//! with a bound, and a file that cannot be read or parsed limits nothing.

use std::path::{Path, PathBuf};

use super::{CgroupLimits, MAX_VALUE_BYTES, SlurmEnv, VARIABLES};
use crate::cgroup::{cgroup_dir, own_path, v1_mount};

/// The most bytes read from one kernel file (cgroup files are a line long;
/// `/proc/self/mountinfo` can be a few hundred lines).
const MAX_FILE_BYTES: u64 = 256 * 1024;
/// The most ancestors walked above the node's own cgroup.
const MAX_DEPTH: usize = 64;
/// Where cgroup v2 is mounted when it is the only hierarchy.
const UNIFIED: &str = "/sys/fs/cgroup";

/// This process's Slurm variables; a value longer than Slurm would write is cut
/// (and then refused by `offer` as malformed), one not in UTF-8 is read lossily.
pub(crate) fn read_env() -> SlurmEnv {
    let mut pairs = Vec::new();
    for name in VARIABLES {
        if let Some(value) = std::env::var_os(name) {
            let value = value.to_string_lossy();
            let cut: String = value.chars().take(MAX_VALUE_BYTES).collect();
            pairs.push((name, cut));
        }
    }
    SlurmEnv::from_pairs(pairs.iter().map(|(name, value)| (*name, value.as_str())))
}

/// The limits of the cgroup this process runs in; all `None` where there is no
/// cgroup file system or it cannot be read.
pub(crate) fn read_cgroup_limits() -> CgroupLimits {
    let Some(own) = read_bounded(Path::new("/proc/self/cgroup")) else {
        return CgroupLimits::default();
    };
    if Path::new(UNIFIED).join("cgroup.controllers").exists() {
        return own_path(&own, "")
            .map(|path| v2_limits(&cgroup_dir(Path::new(UNIFIED), "/", &path)))
            .unwrap_or_default();
    }
    let Some(mountinfo) = read_bounded(Path::new("/proc/self/mountinfo")) else {
        return CgroupLimits::default();
    };
    let dir_of = |controller: &str| -> Option<(PathBuf, PathBuf)> {
        let (mount_point, mount_root) = v1_mount(&mountinfo, controller)?;
        let path = own_path(&own, controller)?;
        Some((cgroup_dir(&mount_point, &mount_root, &path), mount_point))
    };
    let mut limits = CgroupLimits::default();
    if let Some((dir, _)) = dir_of("cpuset") {
        limits.cpuset_cpus =
            read_bounded(&dir.join("cpuset.cpus")).and_then(|list| super::cpuset_count(&list));
    }
    if let Some((dir, top)) = dir_of("cpu") {
        limits.quota_cores = tightest(&dir, &top, |level| {
            super::v1_quota_cores(
                &read_bounded(&level.join("cpu.cfs_quota_us"))?,
                &read_bounded(&level.join("cpu.cfs_period_us"))?,
            )
        });
    }
    if let Some((dir, top)) = dir_of("memory") {
        limits.memory_bytes = tightest(&dir, &top, |level| {
            super::memory_limit(&read_bounded(&level.join("memory.limit_in_bytes"))?)
        });
    }
    limits
}

/// The v2 limits of the cgroup at `dir`: its effective cpuset (which already
/// holds its ancestors'), and the tightest CPU quota and memory limit up to the root.
fn v2_limits(dir: &Path) -> CgroupLimits {
    let top = Path::new(UNIFIED);
    CgroupLimits {
        cpuset_cpus: read_bounded(&dir.join("cpuset.cpus.effective"))
            .and_then(|list| super::cpuset_count(&list)),
        quota_cores: tightest(dir, top, |level| {
            super::v2_quota_cores(&read_bounded(&level.join("cpu.max"))?)
        }),
        memory_bytes: tightest(dir, top, |level| {
            super::memory_limit(&read_bounded(&level.join("memory.max"))?)
        }),
    }
}

/// The least value `read` finds at `dir` and each ancestor up to `top`.
fn tightest<T: PartialOrd>(dir: &Path, top: &Path, read: impl Fn(&Path) -> Option<T>) -> Option<T> {
    let mut best: Option<T> = None;
    let mut level = Some(dir);
    for _ in 0..MAX_DEPTH {
        let Some(current) = level.filter(|current| current.starts_with(top)) else {
            break;
        };
        if let Some(value) = read(current)
            && best.as_ref().is_none_or(|best| value < *best)
        {
            best = Some(value);
        }
        if current == top {
            break;
        }
        level = current.parent();
    }
    best
}

/// Reads at most [`MAX_FILE_BYTES`] of a kernel file as text.
fn read_bounded(path: &Path) -> Option<String> {
    crate::telemetry::read_text_bounded(path, MAX_FILE_BYTES)
}
