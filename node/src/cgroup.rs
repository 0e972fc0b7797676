//! Per-worker Linux cgroups: a CPU quota, a memory limit and a process-count
//! limit for each worker, and a way to kill every process a worker left behind.
//!
//! [`Cgroups::get`] finds what the machine offers once, at start-up: cgroup v2
//! when `/sys/fs/cgroup/cgroup.controllers` lists `cpu`, `memory` and `pids`, else
//! the v1 hierarchies `cpu`, `memory` and `pids` (as their mounts and the node's
//! own `/proc/self/cgroup` lines say). It makes one directory `xp-node-<pid>`
//! under the node's own cgroup in each hierarchy; each worker gets a
//! [`WorkerCgroup`] below it. The worker moves itself in between fork and exec
//! (it writes `0`, "the writer", to `cgroup.procs`), so nothing it starts can run
//! outside it. When the worker ends, [`WorkerCgroup::kill_all`] kills whatever is
//! left (also a grandchild that called `setsid`) and [`WorkerCgroup::remove`]
//! removes the directories.
//!
//! Not here: deciding the limits (the head sends them in the launch) or judging
//! the exit (the worker module asks [`WorkerCgroup::oom_kills`] and reports).
//! Where no cgroup is usable (not Linux, not root, no controllers) the node runs
//! workers without limits, and descendants that leave the worker's process group
//! are not tracked.
//!
//! Invariant: a worker's cgroup directories are removed only once no process is
//! left in them.

use std::ffi::CString;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;
use std::time::Duration;

use tracing::{debug, info, warn};
use xp_runtime::ids::WorkerKey;

/// The CFS period the CPU quota is expressed in (the kernel's default).
const CPU_PERIOD_US: u64 = 100_000;
/// The smallest quota the kernel accepts.
const MIN_CPU_QUOTA_US: u64 = 1_000;
/// The most processes and threads one worker may have (a guard against fork
/// bombs; data loaders with many threads stay well below it).
pub(crate) const PIDS_MAX: u64 = 16_384;
/// How often removing a cgroup is tried while its last processes are reaped.
const REMOVE_TRIES: u32 = 50;
/// The controllers a worker's limits need.
const CONTROLLERS: [&str; 3] = ["cpu", "memory", "pids"];

/// Why cgroups cannot be used, or a worker's cgroup could not be set up.
#[derive(Debug, thiserror::Error)]
pub(crate) enum CgroupError {
    /// This is not Linux.
    #[error("cgroups exist only on Linux")]
    NotLinux,
    /// Neither a v2 hierarchy with the controllers nor the v1 ones are mounted.
    #[error("no cgroup hierarchy with the cpu, memory and pids controllers is mounted")]
    NoControllers,
    /// The node's own cgroup for a controller is not listed in `/proc/self/cgroup`.
    #[error("the node's own {controller} cgroup is unknown")]
    OwnCgroupUnknown {
        /// The controller.
        controller: &'static str,
    },
    /// A cgroup file or directory could not be read or written.
    #[error("cannot {action} {path}")]
    Io {
        /// What was being done.
        action: &'static str,
        /// The file or directory.
        path: PathBuf,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
}

impl CgroupError {
    fn io(action: &'static str, path: &Path) -> impl FnOnce(std::io::Error) -> Self {
        let path = path.to_owned();
        move |source| Self::Io {
            action,
            path,
            source,
        }
    }
}

/// The limits of one worker.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Limits {
    /// CPU in thousandths of a core; 0 for no quota.
    pub cpu_milli: u32,
    /// Memory in bytes; 0 for no limit.
    pub memory_bytes: u64,
}

/// The cgroup version in use.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Version {
    /// One hierarchy per controller.
    V1,
    /// The unified hierarchy.
    V2,
}

/// The file and the text that set one limit.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Setting {
    /// The controller whose directory holds the file (v1; ignored on v2).
    pub controller: &'static str,
    /// The file name.
    pub file: &'static str,
    /// What is written to it.
    pub value: String,
}

impl Version {
    /// The files and values that put `limits` (and the process-count limit) in force.
    pub(crate) fn settings(self, limits: Limits) -> Vec<Setting> {
        let setting = |controller, file, value: String| Setting {
            controller,
            file,
            value,
        };
        let quota_us = (limits.cpu_milli > 0)
            .then(|| (u64::from(limits.cpu_milli) * CPU_PERIOD_US / 1000).max(MIN_CPU_QUOTA_US));
        let mut settings = Vec::new();
        match self {
            Self::V1 => {
                settings.push(setting(
                    "cpu",
                    "cpu.cfs_period_us",
                    CPU_PERIOD_US.to_string(),
                ));
                let quota = quota_us.map_or_else(|| "-1".to_owned(), |quota| quota.to_string());
                settings.push(setting("cpu", "cpu.cfs_quota_us", quota));
                if limits.memory_bytes > 0 {
                    let bytes = limits.memory_bytes.to_string();
                    settings.push(setting("memory", "memory.limit_in_bytes", bytes));
                }
                settings.push(setting("pids", "pids.max", PIDS_MAX.to_string()));
            }
            Self::V2 => {
                let quota = quota_us.map_or_else(|| "max".to_owned(), |quota| quota.to_string());
                settings.push(setting(
                    "cpu",
                    "cpu.max",
                    format!("{quota} {CPU_PERIOD_US}"),
                ));
                if limits.memory_bytes > 0 {
                    let bytes = limits.memory_bytes.to_string();
                    settings.push(setting("memory", "memory.max", bytes));
                    settings.push(setting("memory", "memory.swap.max", "0".to_owned()));
                }
                settings.push(setting("pids", "pids.max", PIDS_MAX.to_string()));
            }
        }
        settings
    }

    /// The file that counts the cgroup's OOM kills, and the key of the count in it.
    fn oom_file(self) -> (&'static str, &'static str) {
        match self {
            Self::V1 => ("memory.oom_control", "oom_kill"),
            Self::V2 => ("memory.events", "oom_kill"),
        }
    }
}

/// The value of `key` in a flat keyed file such as `memory.events` (`key value` lines).
pub(crate) fn keyed_value(text: &str, key: &str) -> Option<u64> {
    text.lines().find_map(|line| {
        let (name, value) = line.split_once(' ')?;
        (name == key).then(|| value.trim().parse().ok()).flatten()
    })
}

/// The node's own cgroup path for `controller` from `/proc/self/cgroup` (`""` for v2).
pub(crate) fn own_path(proc_self_cgroup: &str, controller: &str) -> Option<String> {
    proc_self_cgroup.lines().find_map(|line| {
        let mut fields = line.splitn(3, ':');
        let (_id, controllers, path) = (fields.next()?, fields.next()?, fields.next()?);
        let listed = if controller.is_empty() {
            controllers.is_empty()
        } else {
            controllers.split(',').any(|name| name == controller)
        };
        listed.then(|| path.to_owned())
    })
}

/// Where the v1 hierarchy of `controller` is mounted, and the cgroup path that
/// mount shows as its root, from `/proc/self/mountinfo`.
pub(crate) fn v1_mount(mountinfo: &str, controller: &str) -> Option<(PathBuf, String)> {
    mountinfo.lines().find_map(|line| {
        let (mount, tail) = line.split_once(" - ")?;
        let mut tail = tail.split(' ');
        if tail.next()? != "cgroup" {
            return None;
        }
        let options = tail.nth(1)?;
        if !options.split(',').any(|option| option == controller) {
            return None;
        }
        let fields: Vec<&str> = mount.split(' ').collect();
        Some((PathBuf::from(fields.get(4)?), (*fields.get(3)?).to_owned()))
    })
}

/// The directory of cgroup `path` in a hierarchy mounted at `mount_point` whose
/// mount shows `mount_root`.
pub(crate) fn cgroup_dir(mount_point: &Path, mount_root: &str, path: &str) -> PathBuf {
    let relative = path.strip_prefix(mount_root).unwrap_or(path);
    mount_point.join(relative.trim_start_matches('/'))
}

/// The directory name of a worker's cgroup.
pub(crate) fn worker_dir_name(key: WorkerKey) -> String {
    format!("{}-a{}-r{}", key.trial, key.attempt, key.rank).replace('/', "-")
}

/// The node's cgroups: one directory per hierarchy that workers' cgroups go under.
#[derive(Debug)]
pub(crate) struct Cgroups {
    version: Version,
    /// v1: `(controller, directory)` for each controller; v2: one entry, `""`.
    parents: Vec<(&'static str, PathBuf)>,
}

static DETECTED: OnceLock<Result<Cgroups, CgroupError>> = OnceLock::new();

impl Cgroups {
    /// The node's cgroups, found (and its directories made) on the first call;
    /// `None` where they are not usable (said once, at warn level).
    pub(crate) fn get() -> Option<&'static Self> {
        let detected = DETECTED.get_or_init(|| {
            let detected = Self::detect();
            match &detected {
                Ok(cgroups) => {
                    info!(version = ?cgroups.version, parents = ?cgroups.parents, "workers run in cgroups with cpu, memory and process limits");
                }
                Err(error) => {
                    warn!(error = %xp_runtime::error_chain::error_chain(error), "cgroups not usable: workers run without cpu, memory and process limits, and their descendants that leave the process group are not tracked");
                }
            }
            detected
        });
        detected.as_ref().ok()
    }

    /// Finds the hierarchy to use and makes the node's directory in it.
    fn detect() -> Result<Self, CgroupError> {
        if !cfg!(target_os = "linux") {
            return Err(CgroupError::NotLinux);
        }
        let read = |path: &str| {
            std::fs::read_to_string(path).map_err(CgroupError::io("read", Path::new(path)))
        };
        let own = read("/proc/self/cgroup")?;
        let node_dir = format!("xp-node-{}", std::process::id());
        let unified = std::fs::read_to_string("/sys/fs/cgroup/cgroup.controllers").ok();
        if let Some(controllers) = unified
            && CONTROLLERS
                .iter()
                .all(|name| controllers.split_whitespace().any(|listed| listed == *name))
        {
            let path =
                own_path(&own, "").ok_or(CgroupError::OwnCgroupUnknown { controller: "" })?;
            let own_dir = cgroup_dir(Path::new("/sys/fs/cgroup"), "/", &path);
            remove_stale(&own_dir);
            let parent = prepare_v2(&own_dir, &node_dir)?;
            return Ok(Self {
                version: Version::V2,
                parents: vec![("", parent)],
            });
        }
        let mountinfo = read("/proc/self/mountinfo")?;
        let mut parents = Vec::new();
        for controller in CONTROLLERS {
            let (mount_point, mount_root) =
                v1_mount(&mountinfo, controller).ok_or(CgroupError::NoControllers)?;
            let path =
                own_path(&own, controller).ok_or(CgroupError::OwnCgroupUnknown { controller })?;
            let own_dir = cgroup_dir(&mount_point, &mount_root, &path);
            remove_stale(&own_dir);
            let parent = own_dir.join(&node_dir);
            make_dir(&parent)?;
            parents.push((controller, parent));
        }
        Ok(Self {
            version: Version::V1,
            parents,
        })
    }

    /// The version in use.
    pub(crate) fn version(&self) -> Version {
        self.version
    }

    /// How this node enforces its workers' limits, for its registration.
    pub(crate) fn enforcement() -> xp_runtime::protocol::LimitEnforcement {
        use xp_runtime::protocol::LimitEnforcement;
        match Self::get().map(Self::version) {
            Some(Version::V1) => LimitEnforcement::CgroupV1,
            Some(Version::V2) => LimitEnforcement::CgroupV2,
            None => LimitEnforcement::None,
        }
    }

    /// Removes the node's directories (at a clean stop, once its workers are
    /// gone). Nothing is killed: nodes run in one process (`Cluster::local`)
    /// share them, and a cgroup with processes stays.
    pub(crate) fn remove_node_dirs(&self) {
        for (_, parent) in &self.parents {
            remove_tree(parent, false);
        }
    }

    /// Makes the cgroup of `key` with `limits` in force.
    pub(crate) fn create(
        &self,
        key: WorkerKey,
        limits: Limits,
    ) -> Result<WorkerCgroup, CgroupError> {
        let name = worker_dir_name(key);
        let cgroup = WorkerCgroup {
            version: self.version,
            dirs: self
                .parents
                .iter()
                .map(|(controller, parent)| (*controller, parent.join(&name)))
                .collect(),
            limits,
        };
        for (_, dir) in &cgroup.dirs {
            make_dir(dir)?;
        }
        for setting in self.version.settings(limits) {
            let path = cgroup.dir_of(setting.controller).join(setting.file);
            std::fs::write(&path, &setting.value).map_err(CgroupError::io("write", &path))?;
        }
        if self.version == Version::V1 && limits.memory_bytes > 0 {
            // Without swap accounting the file is absent, and swap needs no limit.
            let memsw = cgroup.dir_of("memory").join("memory.memsw.limit_in_bytes");
            let _ = std::fs::write(memsw, limits.memory_bytes.to_string());
        }
        Ok(cgroup)
    }
}

/// Kills what is left in the directories of nodes that are gone (`xp-node-<pid>`
/// with no such process: a node killed without a clean stop) and removes them.
fn remove_stale(own_dir: &Path) {
    let Ok(entries) = std::fs::read_dir(own_dir) else {
        return;
    };
    for entry in entries.flatten() {
        let name = entry.file_name();
        let Some(pid) = name
            .to_str()
            .and_then(|name| name.strip_prefix("xp-node-"))
            .and_then(|pid| pid.parse::<u32>().ok())
        else {
            continue;
        };
        if Path::new("/proc").join(pid.to_string()).exists() {
            continue;
        }
        info!(dir = %entry.path().display(), "removing the cgroup of a node that is gone");
        remove_tree(&entry.path(), true);
    }
}

/// Removes a node directory's worker cgroups and it, as far as the kernel lets
/// (a cgroup with processes stays); with `kill`, kills their processes first.
fn remove_tree(dir: &Path, kill: bool) {
    if let Ok(children) = std::fs::read_dir(dir) {
        for child in children.flatten().filter(|child| child.path().is_dir()) {
            let procs =
                std::fs::read_to_string(child.path().join("cgroup.procs")).unwrap_or_default();
            let pids = procs.lines().filter_map(|line| line.trim().parse().ok());
            for pid in pids.filter(|_| kill) {
                let _ = nix::sys::signal::kill(
                    nix::unistd::Pid::from_raw(pid),
                    nix::sys::signal::Signal::SIGKILL,
                );
            }
            let _ = std::fs::remove_dir(child.path());
        }
    }
    if let Err(error) = std::fs::remove_dir(dir) {
        debug!(dir = %dir.display(), %error, "cannot remove a node's cgroup yet");
    }
}

/// Makes a directory that may already exist.
fn make_dir(dir: &Path) -> Result<(), CgroupError> {
    match std::fs::create_dir(dir) {
        Err(error) if error.kind() != std::io::ErrorKind::AlreadyExists => {
            Err(CgroupError::io("create", dir)(error))
        }
        _ => Ok(()),
    }
}

/// Makes the node's v2 directory with the controllers enabled for its children.
/// A cgroup with processes cannot hand controllers down, so when the node's own
/// cgroup refuses, the node moves itself into a leaf `xp-node-self` first.
fn prepare_v2(own_dir: &Path, node_dir: &str) -> Result<PathBuf, CgroupError> {
    let enable = |dir: &Path| {
        let path = dir.join("cgroup.subtree_control");
        std::fs::write(&path, "+cpu +memory +pids").map_err(CgroupError::io("write", &path))
    };
    if enable(own_dir).is_err() {
        let leaf = own_dir.join("xp-node-self");
        make_dir(&leaf)?;
        let procs = leaf.join("cgroup.procs");
        std::fs::write(&procs, "0").map_err(CgroupError::io("write", &procs))?;
        enable(own_dir)?;
    }
    let parent = own_dir.join(node_dir);
    make_dir(&parent)?;
    enable(&parent)?;
    Ok(parent)
}

/// A worker's cgroup files, as telemetry reads them (`WorkerCgroup::telemetry_files`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct CgroupFiles {
    /// The hierarchy's version.
    pub version: Version,
    /// The directory holding its CPU accounting (v1: the `cpu` controller's).
    pub cpu_dir: PathBuf,
    /// The directory holding its memory accounting.
    pub memory_dir: PathBuf,
    /// A `cgroup.procs` that lists its processes.
    pub procs: PathBuf,
}

/// One worker's cgroup.
#[derive(Debug)]
pub(crate) struct WorkerCgroup {
    version: Version,
    dirs: Vec<(&'static str, PathBuf)>,
    limits: Limits,
}

impl WorkerCgroup {
    fn dir_of(&self, controller: &str) -> &Path {
        let found = self
            .dirs
            .iter()
            .find(|(name, _)| self.version == Version::V2 || *name == controller);
        &found
            .expect("a worker cgroup has a directory per controller")
            .1
    }

    /// Its limits.
    pub(crate) fn limits(&self) -> Limits {
        self.limits
    }

    /// The `cgroup.procs` files a process writes `0` to, to move itself in; made
    /// before the fork, so the child only opens and writes (async-signal-safe).
    pub(crate) fn procs_files(&self) -> Vec<CString> {
        self.dirs
            .iter()
            .map(|(_, dir)| {
                CString::new(dir.join("cgroup.procs").as_os_str().as_bytes())
                    .expect("a cgroup path has no NUL byte")
            })
            .collect()
    }

    /// The files telemetry reads to measure the worker.
    pub(crate) fn telemetry_files(&self) -> CgroupFiles {
        CgroupFiles {
            version: self.version,
            cpu_dir: self.dir_of("cpu").to_owned(),
            memory_dir: self.dir_of("memory").to_owned(),
            procs: self.dir_of("pids").join("cgroup.procs"),
        }
    }

    /// How many processes of the worker the kernel killed for memory.
    pub(crate) fn oom_kills(&self) -> u64 {
        let (file, key) = self.version.oom_file();
        std::fs::read_to_string(self.dir_of("memory").join(file))
            .ok()
            .and_then(|text| keyed_value(&text, key))
            .unwrap_or(0)
    }

    /// The processes still in the cgroup.
    fn pids(&self) -> Vec<i32> {
        std::fs::read_to_string(self.dir_of("pids").join("cgroup.procs"))
            .map(|text| {
                text.lines()
                    .filter_map(|line| line.trim().parse().ok())
                    .collect()
            })
            .unwrap_or_default()
    }

    /// Kills every process left in the cgroup, until none is left.
    pub(crate) async fn kill_all(&self) {
        if self.version == Version::V2 {
            let _ = std::fs::write(self.dir_of("pids").join("cgroup.kill"), "1");
        }
        for _ in 0..REMOVE_TRIES {
            let pids = self.pids();
            if pids.is_empty() {
                return;
            }
            debug!(
                n_processes = pids.len(),
                "killing what the worker left behind"
            );
            for pid in pids {
                let _ = nix::sys::signal::kill(
                    nix::unistd::Pid::from_raw(pid),
                    nix::sys::signal::Signal::SIGKILL,
                );
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        warn!(dir = %self.dir_of("pids").display(), "processes still in a worker's cgroup after SIGKILL");
    }

    /// Removes the cgroup's directories (retrying while exited processes are reaped).
    pub(crate) async fn remove(self) {
        for (_, dir) in &self.dirs {
            let mut tries = 0;
            while let Err(error) = std::fs::remove_dir(dir) {
                tries += 1;
                if error.kind() == std::io::ErrorKind::NotFound {
                    break;
                }
                if tries >= REMOVE_TRIES {
                    warn!(dir = %dir.display(), %error, "cannot remove a worker's cgroup");
                    break;
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
    }
}

/// Moves the calling process into the cgroups whose `cgroup.procs` files are
/// given. Called between fork and exec: it only opens, writes and closes.
pub(crate) fn enter(procs_files: &[CString]) -> std::io::Result<()> {
    for path in procs_files {
        // SAFETY: `path` is a valid NUL-terminated string; open, write and close
        // are async-signal-safe and take no locks.
        unsafe {
            let fd = libc::open(path.as_ptr(), libc::O_WRONLY | libc::O_CLOEXEC);
            if fd < 0 {
                return Err(std::io::Error::last_os_error());
            }
            let written = libc::write(fd, b"0".as_ptr().cast(), 1);
            let error = std::io::Error::last_os_error();
            libc::close(fd);
            if written != 1 {
                return Err(error);
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check_settings(version: Version, limits: Limits, expected: &[(&str, &str)]) {
        let settings: Vec<(&str, String)> = version
            .settings(limits)
            .into_iter()
            .map(|setting| (setting.file, setting.value))
            .collect();
        let expected: Vec<(&str, String)> = expected
            .iter()
            .map(|(file, value)| (*file, (*value).to_owned()))
            .collect();
        assert_eq!(settings, expected);
    }

    const MIB_64: u64 = 64 << 20;

    #[test]
    fn v1_settings() {
        let limits = Limits {
            cpu_milli: 1500,
            memory_bytes: MIB_64,
        };
        check_settings(
            Version::V1,
            limits,
            &[
                ("cpu.cfs_period_us", "100000"),
                ("cpu.cfs_quota_us", "150000"),
                ("memory.limit_in_bytes", "67108864"),
                ("pids.max", "16384"),
            ],
        );
        let unlimited = Limits {
            cpu_milli: 0,
            memory_bytes: 0,
        };
        check_settings(
            Version::V1,
            unlimited,
            &[
                ("cpu.cfs_period_us", "100000"),
                ("cpu.cfs_quota_us", "-1"),
                ("pids.max", "16384"),
            ],
        );
        let tiny = Limits {
            cpu_milli: 1,
            memory_bytes: 0,
        };
        assert_eq!(Version::V1.settings(tiny)[1].value, "1000");
    }

    #[test]
    fn v2_settings() {
        let limits = Limits {
            cpu_milli: 250,
            memory_bytes: MIB_64,
        };
        check_settings(
            Version::V2,
            limits,
            &[
                ("cpu.max", "25000 100000"),
                ("memory.max", "67108864"),
                ("memory.swap.max", "0"),
                ("pids.max", "16384"),
            ],
        );
        let unlimited = Limits {
            cpu_milli: 0,
            memory_bytes: 0,
        };
        check_settings(
            Version::V2,
            unlimited,
            &[("cpu.max", "max 100000"), ("pids.max", "16384")],
        );
    }

    #[test]
    fn oom_counts() {
        let v1 = "oom_kill_disable 0\nunder_oom 0\noom_kill 3\n";
        assert_eq!(keyed_value(v1, "oom_kill"), Some(3));
        let v2 = "low 0\nhigh 0\nmax 12\noom 1\noom_kill 1\noom_group_kill 0\n";
        assert_eq!(keyed_value(v2, "oom_kill"), Some(1));
        assert_eq!(keyed_value(v2, "missing"), None);
    }

    #[test]
    fn own_paths() {
        let text = "9:name=systemd:/\n8:pids:/\n4:memory:/process_api/abc\n1:cpu,cpuacct:/a\n0::/user.slice\n";
        assert_eq!(
            own_path(text, "memory").as_deref(),
            Some("/process_api/abc")
        );
        assert_eq!(own_path(text, "cpu").as_deref(), Some("/a"));
        assert_eq!(own_path(text, "pids").as_deref(), Some("/"));
        assert_eq!(own_path(text, "").as_deref(), Some("/user.slice"));
        assert_eq!(own_path(text, "blkio"), None);
    }

    #[test]
    fn v1_mounts_and_dirs() {
        let mountinfo = "31 23 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755\n\
            32 31 0:29 / /sys/fs/cgroup/cpu,cpuacct rw,relatime - cgroup cgroup rw,cpu,cpuacct\n\
            35 31 0:32 /outer /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory\n\
            41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw\n";
        let (cpu_mount, cpu_root) = v1_mount(mountinfo, "cpu").unwrap();
        assert_eq!(cpu_mount, Path::new("/sys/fs/cgroup/cpu,cpuacct"));
        assert_eq!(
            cgroup_dir(&cpu_mount, &cpu_root, "/"),
            Path::new("/sys/fs/cgroup/cpu,cpuacct")
        );
        let (memory_mount, memory_root) = v1_mount(mountinfo, "memory").unwrap();
        assert_eq!(
            cgroup_dir(&memory_mount, &memory_root, "/outer/inner"),
            Path::new("/sys/fs/cgroup/memory/inner")
        );
        assert_eq!(v1_mount(mountinfo, "pids"), None);
    }
}
