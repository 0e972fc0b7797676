//! Touching a worker's directories as root without being fooled by the worker.
//!
//! A worker owns its work directory and may put anything there, symbolic links
//! to `/etc` included. The node, running as root, never follows a link the
//! worker could have made: it opens each directory on the way with
//! `O_NOFOLLOW | O_DIRECTORY`, creates files with `O_CREAT | O_EXCL |
//! O_NOFOLLOW` relative to the opened directory, changes owners with `fchown` on
//! descriptors it opened (never `chown` on a path), and renames within an opened
//! directory. What it makes for the worker it gives to the worker's id.
//!
//! The paths given here as a starting point (`open_dir`) lie in directories the
//! worker cannot write (the node's data directory down to the worker's own work
//! directory), so only what is below them is the worker's to change.
//!
//! Invariant: no function here follows a symbolic link below its starting
//! directory, and none changes the owner of anything it did not open itself.

use std::ffi::OsStr;
use std::fs::File;
use std::io::Write;
use std::os::fd::{AsFd, OwnedFd};
use std::path::{Component, Path};

use nix::errno::Errno;
use nix::fcntl::{AtFlags, OFlag};
use nix::sys::stat::Mode;
use nix::unistd::{Gid, Uid};

/// The owner of what the node makes for a worker: the worker's user id (and the
/// group id of the same number). `None` where workers run as the node's user.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct FileOwner {
    /// The user id.
    pub uid: u32,
    /// The group id.
    pub gid: u32,
}

impl FileOwner {
    /// The owner `uid` with the group of the same number.
    pub(crate) fn of_uid(uid: u32) -> Self {
        Self { uid, gid: uid }
    }
}

fn io(errno: Errno) -> std::io::Error {
    std::io::Error::from(errno)
}

const DIR_FLAGS: OFlag = OFlag::O_RDONLY
    .union(OFlag::O_DIRECTORY)
    .union(OFlag::O_NOFOLLOW)
    .union(OFlag::O_CLOEXEC);

/// Opens directory `path`, refusing a symbolic link as its last component.
pub(crate) fn open_dir(path: &Path) -> std::io::Result<OwnedFd> {
    nix::fcntl::open(path, DIR_FLAGS, Mode::empty()).map_err(io)
}

/// Gives `fd` to `owner` (nothing without one).
pub(crate) fn give(fd: impl AsFd, owner: Option<FileOwner>) -> std::io::Result<()> {
    let Some(owner) = owner else {
        return Ok(());
    };
    nix::unistd::fchown(
        fd,
        Some(Uid::from_raw(owner.uid)),
        Some(Gid::from_raw(owner.gid)),
    )
    .map_err(io)
}

/// Opens subdirectory `name` of `parent`, making it (mode `mode`, given to
/// `owner`) when missing; a symbolic link there is refused. A directory that
/// was there already keeps its owner.
pub(crate) fn make_dir_in(
    parent: impl AsFd,
    name: &OsStr,
    mode: u32,
    owner: Option<FileOwner>,
) -> std::io::Result<OwnedFd> {
    let created = match nix::sys::stat::mkdirat(&parent, name, Mode::from_bits_truncate(mode)) {
        Ok(()) => true,
        Err(Errno::EEXIST) => false,
        Err(errno) => return Err(io(errno)),
    };
    let dir = nix::fcntl::openat(&parent, name, DIR_FLAGS, Mode::empty()).map_err(io)?;
    if created {
        // The mode again: mkdirat's was cut by the umask.
        nix::sys::stat::fchmod(&dir, Mode::from_bits_truncate(mode)).map_err(io)?;
        give(&dir, owner)?;
    }
    Ok(dir)
}

/// Opens (making what is missing) the directory `relative` below `root`, one
/// plain component at a time; `..`, absolute paths and symbolic links are refused.
pub(crate) fn make_dirs_in(
    root: &OwnedFd,
    relative: &Path,
    owner: Option<FileOwner>,
) -> std::io::Result<OwnedFd> {
    let mut dir = root.try_clone()?;
    for component in relative.components() {
        let Component::Normal(name) = component else {
            return Err(std::io::Error::new(
                std::io::ErrorKind::InvalidInput,
                format!("{} is not a plain relative path", relative.display()),
            ));
        };
        dir = make_dir_in(&dir, name, 0o700, owner)?;
    }
    Ok(dir)
}

/// Creates the new file `name` in `dir` (mode `mode`, given to `owner`); an
/// existing file or link of that name is an error, never followed.
pub(crate) fn create_file_in(
    dir: impl AsFd,
    name: &OsStr,
    mode: u32,
    owner: Option<FileOwner>,
) -> std::io::Result<File> {
    let flags =
        OFlag::O_WRONLY | OFlag::O_CREAT | OFlag::O_EXCL | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC;
    let fd = nix::fcntl::openat(&dir, name, flags, Mode::from_bits_truncate(mode)).map_err(io)?;
    nix::sys::stat::fchmod(&fd, Mode::from_bits_truncate(mode)).map_err(io)?;
    give(&fd, owner)?;
    Ok(File::from(fd))
}

/// Writes `bytes` to `name` in `dir` through a new temporary file renamed over
/// it, so a reader sees the old file or the whole new one and a link at `name`
/// is replaced, not followed.
pub(crate) fn replace_file_in(
    dir: &OwnedFd,
    name: &OsStr,
    bytes: &[u8],
    mode: u32,
    owner: Option<FileOwner>,
) -> std::io::Result<()> {
    let mut temporary_name = std::ffi::OsString::from(".");
    temporary_name.push(name);
    temporary_name.push(format!(".{}.tmp", uuid::Uuid::now_v7().simple()));
    let written = create_file_in(dir, &temporary_name, mode, owner)
        .and_then(|mut file| file.write_all(bytes));
    let renamed = written.and_then(|()| {
        nix::fcntl::renameat(dir, temporary_name.as_os_str(), dir, name).map_err(io)
    });
    if renamed.is_err() {
        let _ = nix::unistd::unlinkat(
            dir,
            temporary_name.as_os_str(),
            nix::unistd::UnlinkatFlags::NoRemoveDir,
        );
    }
    renamed
}

/// Whether `name` exists in `dir` (a link counts as itself, not its target).
pub(crate) fn exists_in(dir: impl AsFd, name: &OsStr) -> bool {
    nix::sys::stat::fstatat(dir, name, AtFlags::AT_SYMLINK_NOFOLLOW).is_ok()
}

/// Opens subdirectory `name` of `dir`; a link there is refused.
pub(crate) fn open_dir_in(dir: impl AsFd, name: &OsStr) -> std::io::Result<OwnedFd> {
    nix::fcntl::openat(dir, name, DIR_FLAGS, Mode::empty()).map_err(io)
}

/// The kind of one directory entry, as `lstat` says (links are not followed).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum EntryKind {
    /// A directory.
    Dir,
    /// A regular file.
    File,
    /// Anything else: a symbolic link, FIFO, socket or device.
    Other,
}

/// The entries of directory `dir` (without `.` and `..`), with their kinds.
pub(crate) fn list(dir: &OwnedFd) -> std::io::Result<Vec<(std::ffi::OsString, EntryKind)>> {
    use std::os::unix::ffi::OsStrExt;
    let mut listed = nix::dir::Dir::from_fd(dir.try_clone()?).map_err(io)?;
    let mut entries = Vec::new();
    for entry in listed.iter() {
        let entry = entry.map_err(io)?;
        let name = entry.file_name().to_bytes();
        if name == b"." || name == b".." {
            continue;
        }
        let name = OsStr::from_bytes(name).to_owned();
        let stat = nix::sys::stat::fstatat(dir, name.as_os_str(), AtFlags::AT_SYMLINK_NOFOLLOW)
            .map_err(io)?;
        let kind = match stat.st_mode & libc::S_IFMT {
            libc::S_IFDIR => EntryKind::Dir,
            libc::S_IFREG => EntryKind::File,
            _ => EntryKind::Other,
        };
        entries.push((name, kind));
    }
    Ok(entries)
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::{MetadataExt, PermissionsExt};

    use super::*;

    #[test]
    fn links_the_worker_made_are_never_followed() {
        let temp = tempfile::tempdir().expect("tempdir");
        let outside = temp.path().join("outside");
        std::fs::create_dir(&outside).expect("outside");
        std::fs::write(outside.join("secret"), b"root's").expect("secret");
        let work = temp.path().join("work");
        std::fs::create_dir(&work).expect("work");
        std::os::unix::fs::symlink(&outside, work.join("status")).expect("symlink");
        std::os::unix::fs::symlink(outside.join("secret"), work.join("file")).expect("symlink");
        let root = open_dir(&work).expect("open");
        assert!(
            make_dir_in(&root, OsStr::new("status"), 0o700, None).is_err(),
            "a linked directory is refused"
        );
        assert!(
            create_file_in(&root, OsStr::new("file"), 0o600, None).is_err(),
            "a link is not written through"
        );
        assert!(
            super::super::beneath::open_file_beneath(&root, Path::new("file"), &work, None)
                .is_err(),
            "a link is not read through"
        );
        assert!(
            open_dir(&work.join("status")).is_err(),
            "a linked start is refused"
        );
        assert!(make_dirs_in(&root, Path::new("../outside"), None).is_err());
        // Replacing a link renames over the link itself.
        replace_file_in(&root, OsStr::new("file"), b"verdict", 0o644, None).expect("replace");
        assert_eq!(std::fs::read(work.join("file")).expect("read"), b"verdict");
        assert_eq!(
            std::fs::read(outside.join("secret")).expect("read"),
            b"root's"
        );
        assert!(exists_in(&root, OsStr::new("status")));
        assert!(!exists_in(&root, OsStr::new("missing")));
        let mut kinds = list(&root).expect("list");
        kinds.sort_by(|a, b| a.0.cmp(&b.0));
        assert_eq!(
            kinds,
            [
                ("file".into(), EntryKind::File),
                ("status".into(), EntryKind::Other)
            ]
        );
    }

    #[test]
    fn made_directories_and_files_have_the_asked_mode_and_owner() {
        let temp = tempfile::tempdir().expect("tempdir");
        let root = open_dir(temp.path()).expect("open");
        let me = nix::unistd::geteuid().as_raw();
        let owner = Some(FileOwner::of_uid(me));
        let nested = make_dirs_in(&root, Path::new("a/b"), owner).expect("dirs");
        create_file_in(&nested, OsStr::new("f"), 0o640, owner)
            .and_then(|mut file| file.write_all(b"x"))
            .expect("file");
        let metadata = std::fs::metadata(temp.path().join("a/b/f")).expect("metadata");
        assert_eq!(metadata.permissions().mode() & 0o777, 0o640);
        assert_eq!(metadata.uid(), me);
        let dir = std::fs::metadata(temp.path().join("a")).expect("metadata");
        assert_eq!(dir.permissions().mode() & 0o777, 0o700);
    }
}
