//! Reading a worker's checkpoint or output files as the worker would: every
//! directory is listed and every file opened on a thread with the worker's
//! file-system identity (`isolation::as_worker`), below the descriptor of the
//! directory being taken, with no link, `..` or mount point followed
//! (`isolation::beneath`). The caller reads the descriptors it gets back and
//! writes the store as the node.
//!
//! Not here: what is stored (`take`), or writing into a worker's tree.
//!
//! Invariant: nothing here opens a file or lists a directory with more
//! authority than the worker's own.

use std::ffi::{OsStr, OsString};
use std::fs::File;
use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use super::error::CheckpointError;
use crate::isolation::as_worker::AsWorker;
use crate::isolation::beneath::{self, TreeError};
use crate::isolation::fs::{self as lane_fs, EntryKind, FileOwner};

/// The most files one checkpoint may have.
pub(crate) const MAX_FILES: usize = 10_000;
/// How deep a checkpoint's directories may nest.
const MAX_DEPTH: usize = 16;

/// One directory of a worker's, opened as the worker.
pub(super) struct WorkerReader {
    thread: AsWorker,
    root: Arc<OwnedFd>,
    /// The directory's path as the worker knows it, for messages.
    shown: PathBuf,
    owner: Option<FileOwner>,
}

impl WorkerReader {
    /// Opens directory `name` in `parent` (which the node opened) as worker
    /// `owner`; `shown` is the path it is known by. `Ok(None)` when there is no
    /// such directory.
    pub(super) fn open(
        parent: &OwnedFd,
        name: &OsStr,
        shown: &Path,
        owner: Option<FileOwner>,
    ) -> Result<Option<Self>, CheckpointError> {
        let thread = AsWorker::start(owner).map_err(|source| CheckpointError::Io {
            what: "take on the worker's user id to read",
            path: shown.to_owned(),
            source,
        })?;
        let parent = parent
            .try_clone()
            .map_err(super::error::io("open", shown))?;
        let (name, above) = (
            PathBuf::from(name),
            shown.parent().unwrap_or(shown).to_owned(),
        );
        let worker = owner.map(|owner| owner.uid);
        let opened = thread
            .run(move || beneath::open_dir_beneath(&parent, &name, &above, worker))
            .map_err(super::error::io("open", shown))?;
        let root = match opened {
            Ok(root) => root,
            Err(TreeError::Io { source, .. }) if source.kind() == std::io::ErrorKind::NotFound => {
                return Ok(None);
            }
            Err(refusal) => return Err(refused(refusal)),
        };
        Ok(Some(Self {
            thread,
            root: Arc::new(root),
            shown: shown.to_owned(),
            owner,
        }))
    }

    /// Opens directory `path` (a test's, or one that is not a worker's) as the
    /// node.
    #[cfg(test)]
    pub(super) fn of_path(path: &Path) -> Self {
        Self {
            thread: AsWorker::start(None).expect("inline"),
            root: Arc::new(lane_fs::open_dir(path).expect("open")),
            shown: path.to_owned(),
            owner: None,
        }
    }

    /// The `/`-separated names of every file below the directory, at most
    /// [`MAX_FILES`] of them, at most [`MAX_DEPTH`] directories deep; anything
    /// but a file or a directory is refused by its rule.
    pub(super) fn list(&self) -> Result<Vec<String>, CheckpointError> {
        let (root, shown, worker) = (
            self.root.clone(),
            self.shown.clone(),
            self.owner.map(|owner| owner.uid),
        );
        self.thread
            .run(move || {
                let mut names = Vec::new();
                let listing = Listing {
                    root: &root,
                    shown: &shown,
                    worker,
                };
                listing.walk(&root, "", 0, &mut names)?;
                Ok(names)
            })
            .map_err(super::error::io("list", &self.shown))?
    }

    /// Opens file `name` (from [`WorkerReader::list`]) as the worker: a regular
    /// file of the worker's with one name, or an error naming the rule.
    pub(super) fn open_file(&self, name: &str) -> Result<File, CheckpointError> {
        let (root, shown, owner) = (self.root.clone(), self.shown.clone(), self.owner);
        let relative = PathBuf::from(name);
        self.thread
            .run(move || beneath::open_file_beneath(&*root, &relative, &shown, owner))
            .map_err(super::error::io("open", &self.shown.join(name)))?
            .map_err(|refusal| {
                CheckpointError::Invalid(format!(
                    "cannot read {name}: {}",
                    xp_runtime::error_chain::error_chain(&refusal)
                ))
            })
    }
}

/// Removes `name` in `parent` (which the node opened) and everything below it,
/// as worker `owner` (what the worker moved in from elsewhere is not the
/// node's to delete), following no link.
pub(super) fn remove_as_worker(
    parent: &OwnedFd,
    name: &OsStr,
    owner: Option<FileOwner>,
) -> std::io::Result<()> {
    let parent = parent.try_clone()?;
    let name = name.to_owned();
    AsWorker::start(owner)?.run(move || remove_tree(&parent, &name, 0))?
}

/// A refusal, as a checkpoint error whose message names the rule.
fn refused(refusal: TreeError) -> CheckpointError {
    CheckpointError::Invalid(xp_runtime::error_chain::error_chain(&refusal))
}

/// The walk of [`WorkerReader::list`], on the worker's thread.
struct Listing<'a> {
    root: &'a OwnedFd,
    shown: &'a Path,
    worker: Option<u32>,
}

impl Listing<'_> {
    fn walk(
        &self,
        dir: &OwnedFd,
        prefix: &str,
        depth: usize,
        out: &mut Vec<String>,
    ) -> Result<(), CheckpointError> {
        if depth > MAX_DEPTH {
            return Err(CheckpointError::Invalid(format!(
                "checkpoint directories nest deeper than {MAX_DEPTH}"
            )));
        }
        let listed =
            lane_fs::list(dir).map_err(super::error::io("list", &self.shown.join(prefix)))?;
        for (name, kind) in listed {
            let name = name.to_str().ok_or_else(|| {
                CheckpointError::Invalid(format!("{} is not a UTF-8 name", name.to_string_lossy()))
            })?;
            let relative = format!("{prefix}{name}");
            match kind {
                EntryKind::Dir => {
                    let sub = beneath::open_dir_beneath(
                        self.root,
                        Path::new(&relative),
                        self.shown,
                        self.worker,
                    )
                    .map_err(refused)?;
                    self.walk(&sub, &format!("{relative}/"), depth + 1, out)?;
                }
                EntryKind::File => {
                    out.push(relative);
                    if out.len() > MAX_FILES {
                        return Err(CheckpointError::Invalid(format!(
                            "a checkpoint may have at most {MAX_FILES} files"
                        )));
                    }
                }
                EntryKind::Other => {
                    // Opening it says which rule it breaks (a link, a FIFO, ...).
                    let opened = beneath::open_file_beneath(
                        self.root,
                        Path::new(&relative),
                        self.shown,
                        None,
                    );
                    return Err(match opened {
                        Err(refusal) => refused(refusal),
                        Ok(_) => CheckpointError::Invalid(format!(
                            "{relative} is neither a file nor a directory"
                        )),
                    });
                }
            }
        }
        Ok(())
    }
}

/// Removes `name` in `dir` and, for a directory, everything below it, by
/// descriptor (no link followed), at most [`MAX_DEPTH`] deep.
fn remove_tree(dir: &OwnedFd, name: &OsString, depth: usize) -> std::io::Result<()> {
    use nix::unistd::{UnlinkatFlags, unlinkat};
    let is_dir = nix::sys::stat::fstatat(
        dir,
        name.as_os_str(),
        nix::fcntl::AtFlags::AT_SYMLINK_NOFOLLOW,
    )
    .map(|stat| stat.st_mode & libc::S_IFMT == libc::S_IFDIR)
    .map_err(std::io::Error::from)?;
    if is_dir && depth <= MAX_DEPTH + 1 {
        let sub = lane_fs::open_dir_in(dir, name)?;
        for (entry, _) in lane_fs::list(&sub)? {
            remove_tree(&sub, &entry, depth + 1)?;
        }
    }
    let flags = if is_dir {
        UnlinkatFlags::RemoveDir
    } else {
        UnlinkatFlags::NoRemoveDir
    };
    unlinkat(dir, name.as_os_str(), flags).map_err(std::io::Error::from)
}
