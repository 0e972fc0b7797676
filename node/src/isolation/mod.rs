//! Keeping a node's workers apart: the ranks of each trial attempt on a root
//! node run under a user id of their own, shared by them only (`uids`), each
//! rank's work directory owned by that id, and the node touches what workers
//! wrote without following their links (`fs`).
//!
//! [`Isolation::start`] decides once, at start-up, from `--worker-uids`:
//!
//! - as root with a range (the default range when none is given), each live
//!   trial attempt gets an id of its own for its ranks here, and the data
//!   directory is laid out so that a worker reaches only its own work
//!   directory, the cached driver binaries it runs and the node's socket (see
//!   [`prepare_data_dir`]);
//! - otherwise (not root, `--worker-uids none`, a data directory inside one
//!   other users cannot enter, or ids the node cannot switch to, as in a user
//!   namespace that does not map them) workers run as the node's user and can
//!   read each other; the node says so once at warn level and registers it, so
//!   `xp nodes` shows it (`NodeIsolation`).
//!
//! Not here: switching to the id (the worker module does, between fork and exec)
//! and the cgroups that hold limits (`cgroup`; the registration reports both).

pub(crate) mod as_worker;
pub(crate) mod beneath;
pub(crate) mod fs;
pub(crate) mod ports;
mod scrub;
pub(crate) mod uids;

use std::collections::BTreeSet;
use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use tracing::{info, warn};
use xp_runtime::ids::WorkerKey;
use xp_runtime::protocol::{LimitEnforcement, NodeIsolation};

use self::fs::{self as lane_fs, FileOwner};

pub use uids::WorkerUids;
pub(crate) use uids::{UidLease, UidPool, UidRange};

/// The data directory's entries a worker must reach by name (mode 0711: others
/// may pass through, not list): work directories, cached driver binaries, the
/// node's socket. Everything else in it is the node's alone (0700 or 0600).
pub const PASSABLE_DIRS: [&str; 3] = ["work", "bin", "run"];
/// Entries made private before anything writes there, so that nothing lands in
/// them with the umask's mode first.
const PRIVATE: [&str; 2] = ["objects", "logs"];

/// Why the isolation asked for cannot be had.
#[derive(Debug, thiserror::Error)]
pub enum IsolationError {
    /// A directory above the data directory does not let other users through,
    /// so workers under their own ids could not reach their work directories.
    #[error(
        "workers under their own user ids could not reach their work directories: other users may not enter {}; allow them through (`chmod o+x {}`) or choose a --data-dir they can reach",
        dir.display(),
        dir.display()
    )]
    Unreachable {
        /// The directory.
        dir: PathBuf,
    },
    /// The machine-wide claims could not be kept.
    #[error("cannot create {}", dir.display())]
    LockDir {
        /// The directory.
        dir: PathBuf,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// This process cannot become the range's ids (a user namespace that does
    /// not map them, or no right to change ids).
    #[error("cannot run workers under the user ids {range}: {why}")]
    CannotSwitch {
        /// The range.
        range: UidRange,
        /// What failed.
        why: String,
    },
    /// The data directory could not be laid out.
    #[error("cannot set the mode of {}", path.display())]
    Layout {
        /// The file or directory.
        path: PathBuf,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
}

/// What this node enforces on its workers.
#[derive(Debug, Clone)]
pub(crate) struct Isolation {
    uids: Option<Arc<UidPool>>,
    /// The rendezvous ports held for their rank 0s, where workers get ids of
    /// their own.
    ports: Option<Arc<ports::PortHold>>,
    limits: LimitEnforcement,
}

impl Isolation {
    /// Decides from `asked` (and whether this process is root) whether workers
    /// get ids of their own, says so once, and records the limits in force.
    /// A range given explicitly that cannot be used is an error; the default
    /// falls back to the node's id with a warning.
    pub(crate) fn start(
        asked: WorkerUids,
        data_dir: &Path,
        limits: LimitEnforcement,
    ) -> Result<Self, IsolationError> {
        let shared = |why: &str| {
            warn!(
                why,
                "workers run under the node's own user id and can read each other's memory, environment and files; `xp nodes` shows it (no `uid` in its isolation)"
            );
            Self::shared(limits)
        };
        let range = match asked {
            WorkerUids::Off => return Ok(shared("--worker-uids none")),
            _ if !nix::unistd::geteuid().is_root() => {
                return Ok(shared(
                    "the node does not run as root, so it cannot switch users",
                ));
            }
            WorkerUids::Auto => uids::DEFAULT_RANGE,
            WorkerUids::Range(range) => range,
        };
        let pool = unreachable_ancestor(data_dir)
            .map_or(Ok(()), |dir| Err(IsolationError::Unreachable { dir }))
            .and_then(|()| check_switchable(range))
            .and_then(|()| {
                let accounts = std::fs::read_to_string("/etc/passwd")
                    .map(|passwd| uids::account_uids(&passwd))
                    .unwrap_or_default();
                let taken: BTreeSet<u32> = accounts
                    .into_iter()
                    .filter(|uid| range.contains(*uid))
                    .collect();
                if !taken.is_empty() {
                    warn!(%range, accounts = taken.len(), "accounts in /etc/passwd use ids of the worker range; they are never handed out");
                }
                let lock_dir = Path::new(uids::LOCK_DIR);
                UidPool::new(range, lock_dir, taken, Arc::new(scrub::scrub_uids))
                    .map(|pool| pool.with_cursor_file(data_dir.join(uids::CURSOR_FILE)))
                    .map_err(|source| IsolationError::LockDir {
                        dir: lock_dir.to_owned(),
                        source,
                    })
            });
        match (pool, asked) {
            (Ok(pool), _) => {
                info!(%range, "each trial attempt's workers run under a user id of their own");
                let pool = Arc::new(pool);
                pool.sweep_leftovers();
                Ok(Self {
                    uids: Some(pool),
                    ports: hold_master_ports(),
                    limits,
                })
            }
            (Err(error), WorkerUids::Range(_)) => Err(error),
            (Err(error), _) => Ok(shared(&xp_runtime::error_chain::error_chain(&error))),
        }
    }

    /// Workers under the node's own id, with `limits` (the default before
    /// [`Isolation::start`] decides, and what it falls back to).
    pub(crate) fn shared(limits: LimitEnforcement) -> Self {
        Self {
            uids: None,
            ports: None,
            limits,
        }
    }

    /// The id pool, when workers get ids of their own.
    pub(crate) fn uids(&self) -> Option<&Arc<UidPool>> {
        self.uids.as_ref()
    }

    /// The rendezvous ports held for their rank 0s, when workers get ids of
    /// their own.
    pub(crate) fn ports(&self) -> Option<&Arc<ports::PortHold>> {
        self.ports.as_ref()
    }

    /// What the node registers.
    pub(crate) fn summary(&self) -> NodeIsolation {
        NodeIsolation {
            worker_uids: self.uids.is_some(),
            limits: self.limits,
        }
    }
}

/// Holds the `MASTER_PORT` range for the rank 0s it is handed to
/// (`ports`); without it (the marker directory cannot be made) co-tenants
/// could take a rendezvous port first, which is said at warn level.
fn hold_master_ports() -> Option<Arc<ports::PortHold>> {
    match ports::PortHold::start(ports::MASTER_PORTS, Path::new(ports::MARKER_DIR)) {
        Ok(hold) => Some(hold),
        Err(error) => {
            warn!(%error, dir = ports::MARKER_DIR, "rendezvous ports are not held: another trial's worker could take a MASTER_PORT first");
            None
        }
    }
}

/// The worker's output directory (`XP_OUTPUT_DIR`) under its work directory.
pub(crate) const OUTPUT_DIR: &str = "output";

/// The directory under a worker's work directory that holds its pipeline
/// inputs (`XP_INPUT_DIR`, filled by `checkpoint::inputs`).
pub(crate) const INPUT_DIR: &str = "inputs";

/// A worker's work directory as the node made it: the path the worker is told
/// (`XP_WORK_DIR`), that path resolved when the node made it (the directories
/// above are the node's, so the worker cannot change what it resolves to), and
/// the descriptor the node opened then, below which everything the worker
/// names is reached (`beneath`).
#[derive(Debug, Clone)]
pub(crate) struct WorkTree {
    /// `XP_WORK_DIR`.
    pub path: PathBuf,
    /// The same, canonical (what `realpath` in the worker says).
    pub canonical: PathBuf,
    /// The directory itself.
    pub dir: Arc<OwnedFd>,
}

impl WorkTree {
    /// The tree of the directory `dir` the node opened at `path`.
    fn of(path: PathBuf, dir: OwnedFd) -> Self {
        use std::os::fd::AsRawFd;
        let canonical = std::fs::read_link(format!("/proc/self/fd/{}", dir.as_raw_fd()))
            .unwrap_or_else(|_| path.clone());
        Self {
            path,
            canonical,
            dir: Arc::new(dir),
        }
    }

    /// Opens the existing work directory `path` (not following a link there);
    /// for tests.
    #[cfg(test)]
    pub(crate) fn open(path: &Path) -> std::io::Result<Self> {
        Ok(Self::of(path.to_owned(), lane_fs::open_dir(path)?))
    }

    /// The part of `requested`, a path the worker named, below this directory
    /// (by its path or its canonical path), as plain names.
    pub(crate) fn relative(&self, requested: &Path) -> Result<PathBuf, beneath::TreeError> {
        beneath::relative_in_tree(requested, &[&self.path, &self.canonical])
    }
}

/// Makes worker `key`'s work directory `work/TRIAL/aN/rankN` under `data_dir`,
/// with its `checkpoint` and `output` directories, all of `owner`, and an
/// `inputs` directory of the node's (pipeline inputs go there); the trial and attempt
/// directories are the node's (0711: a worker passes through to its own, lists
/// nothing, and cannot swap its directory for a link). A directory left by an
/// earlier run of the node for the same worker is removed first. The tree
/// keeps the descriptor of the directory made.
pub(crate) fn make_work_dir(
    data_dir: &Path,
    key: WorkerKey,
    owner: Option<FileOwner>,
) -> std::io::Result<WorkTree> {
    let root = data_dir.join("work");
    std::fs::create_dir_all(&root)?;
    let (trial, attempt, rank) = (
        key.trial.to_string(),
        format!("a{}", key.attempt),
        format!("rank{}", key.rank),
    );
    let root_dir = lane_fs::open_dir(&root)?;
    let trial_dir = lane_fs::make_dir_in(&root_dir, trial.as_ref(), 0o711, None)?;
    let attempt_dir = lane_fs::make_dir_in(&trial_dir, attempt.as_ref(), 0o711, None)?;
    let path = root.join(trial).join(attempt).join(&rank);
    if lane_fs::exists_in(&attempt_dir, rank.as_ref()) {
        // remove_dir_all follows no link.
        std::fs::remove_dir_all(&path)?;
    }
    let rank_dir = lane_fs::make_dir_in(&attempt_dir, rank.as_ref(), 0o700, owner)?;
    lane_fs::make_dir_in(&rank_dir, "checkpoint".as_ref(), 0o700, owner)?;
    lane_fs::make_dir_in(&rank_dir, OUTPUT_DIR.as_ref(), 0o700, owner)?;
    // The node's, before anything of the worker runs: pipeline inputs are
    // written in it by descriptor (`checkpoint::inputs`).
    lane_fs::make_dir_in(&rank_dir, INPUT_DIR.as_ref(), 0o755, None)?;
    Ok(WorkTree::of(path, rank_dir))
}

/// Takes a work directory back from its worker's id (owner root, mode 0700, by
/// descriptor: the directory itself cannot be swapped, as its parent is the
/// node's), so a later holder of the id cannot enter it.
pub(crate) fn take_back_dir(work_dir: &Path) -> std::io::Result<()> {
    use std::os::unix::fs::PermissionsExt;
    let dir = lane_fs::open_dir(work_dir)?;
    nix::unistd::fchown(
        &dir,
        Some(nix::unistd::Uid::from_raw(0)),
        Some(nix::unistd::Gid::from_raw(0)),
    )
    .map_err(std::io::Error::from)?;
    std::fs::File::from(dir).set_permissions(std::fs::Permissions::from_mode(0o700))
}

/// Whether this process can become the ids of `range`: its user namespace maps
/// every one of them (`/proc/self/uid_map`, `gid_map`), and a child switched to
/// the first one starts (`setgroups`, `setgid`, `setuid`, as a worker does).
fn check_switchable(range: UidRange) -> Result<(), IsolationError> {
    use std::os::unix::process::CommandExt;
    let cannot = |why: String| IsolationError::CannotSwitch { range, why };
    for map in ["/proc/self/uid_map", "/proc/self/gid_map"] {
        // Without the file (not Linux, no /proc) the probe below decides.
        if let Ok(text) = std::fs::read_to_string(map)
            && !mapped(&text, range)
        {
            return Err(cannot(format!("{map} does not map them")));
        }
    }
    std::process::Command::new("/bin/sh")
        .args(["-c", ":"])
        .uid(range.start)
        .gid(range.start)
        .env_clear()
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .status()
        .map_err(|error| cannot(format!("a probe as {} did not start: {error}", range.start)))
        .and_then(|status| {
            status
                .success()
                .then_some(())
                .ok_or_else(|| cannot(format!("a probe as {} ended with {status}", range.start)))
        })
}

/// Whether the id map `text` (`inside outside count` lines) maps all of `range`.
fn mapped(text: &str, range: UidRange) -> bool {
    let mut extents: Vec<(u64, u64)> = text
        .lines()
        .filter_map(|line| {
            let mut fields = line
                .split_whitespace()
                .map(|field| field.parse::<u64>().ok());
            let (inside, _outside, count) = (fields.next()??, fields.next()??, fields.next()??);
            Some((inside, inside + count))
        })
        .collect();
    extents.sort_unstable();
    let mut next = u64::from(range.start);
    for (start, end) in extents {
        if start <= next && next < end {
            next = end;
        }
    }
    next > u64::from(range.end)
}

/// The first directory above `data_dir` that other users may not pass through.
fn unreachable_ancestor(data_dir: &Path) -> Option<PathBuf> {
    use std::os::unix::fs::PermissionsExt;
    let resolved = std::fs::canonicalize(data_dir).unwrap_or_else(|_| data_dir.to_owned());
    resolved
        .ancestors()
        .skip(1)
        .find(|dir| {
            std::fs::metadata(dir)
                .map_or(true, |metadata| metadata.permissions().mode() & 0o001 == 0)
        })
        .map(Path::to_owned)
}

/// Lays out the node's data directory (already made 0700) for its workers. With
/// workers under ids of their own it becomes 0711: [`PASSABLE_DIRS`] entries 0711,
/// every other entry 0700 (directories) or 0600 (files), so a worker reaches its
/// own work directory, the cached binaries and the socket by name and nothing
/// else. Without, it stays 0700 and nothing in it is reachable by others anyway.
pub(crate) fn prepare_data_dir(data_dir: &Path, isolated: bool) -> Result<(), IsolationError> {
    use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
    let set_mode = |path: &Path, mode: u32| {
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).map_err(|source| {
            IsolationError::Layout {
                path: path.to_owned(),
                source,
            }
        })
    };
    let layout = |path: &Path| IsolationError::Layout {
        path: path.to_owned(),
        source: std::io::Error::other("cannot create"),
    };
    for name in PASSABLE_DIRS.iter().chain(&PRIVATE) {
        let dir = data_dir.join(name);
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(&dir)
            .map_err(|_| layout(&dir))?;
    }
    if !isolated {
        for name in PASSABLE_DIRS {
            set_mode(&data_dir.join(name), 0o700)?;
        }
        return set_mode(data_dir, 0o700);
    }
    let entries = std::fs::read_dir(data_dir).map_err(|source| IsolationError::Layout {
        path: data_dir.to_owned(),
        source,
    })?;
    for entry in entries.flatten() {
        let path = entry.path();
        let Ok(kind) = entry.file_type() else {
            continue;
        };
        let passable = entry
            .file_name()
            .to_str()
            .is_some_and(|name| PASSABLE_DIRS.contains(&name));
        if passable && kind.is_dir() {
            set_mode(&path, 0o711)?;
        } else if kind.is_dir() {
            tighten(&path, 0o700).map_err(|source| IsolationError::Layout { path, source })?;
        } else if kind.is_file() {
            tighten(&path, 0o600).map_err(|source| IsolationError::Layout { path, source })?;
        }
    }
    set_mode(data_dir, 0o711)
}

/// Takes group and others' permissions from `path` (not following a link).
fn tighten(path: &Path, private_mode: u32) -> std::io::Result<()> {
    use std::os::unix::fs::PermissionsExt;
    let mode = std::fs::symlink_metadata(path)?.permissions().mode() & 0o7777;
    if mode & 0o077 != 0 {
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(private_mode))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::PermissionsExt;

    use super::*;

    fn mode(path: &Path) -> u32 {
        std::fs::metadata(path)
            .expect("metadata")
            .permissions()
            .mode()
            & 0o777
    }

    #[test]
    fn an_isolating_data_dir_lets_workers_through_to_their_parts_only() {
        let temp = tempfile::tempdir().expect("tempdir");
        let data = temp.path().join("node");
        std::fs::create_dir(&data).expect("data dir");
        std::fs::write(data.join("node_id"), b"id").expect("id");
        std::fs::set_permissions(data.join("node_id"), std::fs::Permissions::from_mode(0o644))
            .expect("chmod");
        std::fs::create_dir(data.join("stray")).expect("stray");
        std::fs::set_permissions(data.join("stray"), std::fs::Permissions::from_mode(0o755))
            .expect("chmod");
        prepare_data_dir(&data, true).expect("layout");
        assert_eq!(mode(&data), 0o711);
        for name in PASSABLE_DIRS {
            assert_eq!(mode(&data.join(name)), 0o711, "{name}");
        }
        for name in PRIVATE.iter().chain(&["stray"]) {
            assert_eq!(mode(&data.join(name)), 0o700, "{name}");
        }
        assert_eq!(mode(&data.join("node_id")), 0o600);
        // Without isolation it is private again.
        prepare_data_dir(&data, false).expect("layout");
        assert_eq!(mode(&data), 0o700);
        assert_eq!(mode(&data.join("work")), 0o700);
    }

    #[test]
    fn a_range_must_be_mapped_whole() {
        let range = |start, end| UidRange { start, end };
        let host = "         0          0 4294967295\n";
        assert!(mapped(host, range(1_900_000_000, 1_900_009_999)));
        let rootless = "0 1000 1\n1 100000 65536\n";
        assert!(mapped(rootless, range(1000, 2000)));
        assert!(!mapped(rootless, range(1_900_000_000, 1_900_009_999)));
        assert!(
            !mapped(rootless, range(60_000, 70_000)),
            "runs past the map"
        );
        let split = "0 0 100\n100 5000 100\n";
        assert!(mapped(split, range(50, 150)), "two extents that touch");
        assert!(!mapped("", range(1, 1)));
        assert!(!mapped("garbage\n", range(1, 1)));
    }

    #[test]
    fn a_work_dir_is_made_afresh_with_passable_parents() {
        let temp = tempfile::tempdir().expect("tempdir");
        let key = WorkerKey {
            trial: "3f2a9c0d11b2e4f7-t3".parse().expect("trial"),
            attempt: 2,
            rank: 1,
        };
        let outside = temp.path().join("outside");
        std::fs::create_dir(&outside).expect("outside");
        std::fs::write(outside.join("kept"), b"x").expect("file");
        let tree = make_work_dir(temp.path(), key, None).expect("work dir");
        let made = tree.path.clone();
        assert_eq!(made, temp.path().join("work/3f2a9c0d11b2e4f7-t3/a2/rank1"));
        assert_eq!(tree.canonical, made.canonicalize().expect("canonical"));
        assert_eq!(mode(made.parent().expect("attempt")), 0o711);
        assert_eq!(mode(&temp.path().join("work/3f2a9c0d11b2e4f7-t3")), 0o711);
        assert_eq!(mode(&made), 0o700);
        assert!(made.join("checkpoint").is_dir());
        // What an earlier run of the node left for the same worker goes, links
        // removed rather than followed.
        std::fs::write(made.join("stale"), b"x").expect("file");
        std::os::unix::fs::symlink(&outside, made.join("link")).expect("symlink");
        let again = make_work_dir(temp.path(), key, None).expect("work dir");
        assert_eq!(again.path, made);
        assert!(!made.join("stale").exists() && !made.join("link").exists());
        assert!(outside.join("kept").exists());
    }

    #[test]
    fn a_directory_others_cannot_enter_is_named() {
        let temp = tempfile::tempdir().expect("tempdir");
        let closed = temp.path().join("closed");
        let data = closed.join("node");
        std::fs::create_dir_all(&data).expect("dirs");
        std::fs::set_permissions(&closed, std::fs::Permissions::from_mode(0o700)).expect("chmod");
        // The nearest one is named.
        assert_eq!(
            unreachable_ancestor(&data),
            Some(closed.canonicalize().expect("path"))
        );
        std::fs::set_permissions(&closed, std::fs::Permissions::from_mode(0o711)).expect("chmod");
        std::fs::set_permissions(temp.path(), std::fs::Permissions::from_mode(0o711))
            .expect("chmod");
        let above = unreachable_ancestor(&data);
        assert!(
            above
                .as_deref()
                .is_none_or(|dir| !dir.starts_with(temp.path())),
            "{above:?}"
        );
    }
}
