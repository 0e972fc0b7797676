//! Reaching a file in a worker's tree the way the worker itself could, and no
//! further: below a directory descriptor the node opened, through no symbolic
//! link, `/proc` magic link, `..` or mount point.
//!
//! A worker names files to the node (a `put`'s path) and leaves files for it
//! (checkpoints, outputs); everything below its work directory is the worker's
//! to change, at any moment. So the node never resolves such a path by name from
//! `/`, and never trusts a resolution it did not make itself:
//!
//! - a path a worker names must lie, as written, under the work directory the
//!   node told it (`XP_WORK_DIR`, or that path's canonical form); the rest may
//!   hold only plain names ([`relative_in_tree`]);
//! - that rest is opened below the descriptor of the work directory with
//!   `openat2(RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS |
//!   RESOLVE_NO_XDEV)`, atomically for the whole path; where the kernel lacks
//!   `openat2` (before 5.6, or a seccomp filter that refuses it) one component
//!   at a time with `openat(O_NOFOLLOW | O_DIRECTORY)`, checking that no step
//!   changes device ([`open_beneath`]);
//! - what was opened must be a regular file with one name, owned by the worker
//!   ([`check_file`]).
//!
//! Every refusal names its rule ([`Rule`]), so a worker, and whoever reads its
//! log, learns which rule it broke. Run on the thread of `as_worker`, every open
//! is also checked against the worker's own file-system identity, so a file the
//! worker could not read itself is refused even where every rule here holds.
//!
//! Not here: whose identity opens (`as_worker`), and writing into a worker's tree
//! (`isolation::fs`, whose files are created with `O_EXCL` and never opened by
//! an existing name).
//!
//! Invariant: no function here follows a symbolic link, climbs with `..` or
//! crosses a mount point below the descriptor it starts from.

use std::ffi::OsStr;
use std::fs::File;
use std::os::fd::{AsFd, OwnedFd};
use std::path::{Component, Path, PathBuf};

use nix::errno::Errno;
use nix::fcntl::{OFlag, OpenHow, ResolveFlag};
use nix::sys::stat::{FileStat, Mode};

use super::fs::FileOwner;

/// The rules a worker's file must keep to before the node reads it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Rule {
    /// The path lies under the worker's work directory as the node named it.
    OwnDirectory,
    /// No `..` on the way.
    NoDotDot,
    /// No symbolic link on the way, nor at the end.
    NoLinks,
    /// No link into `/proc` (a magic link such as `/proc/self/environ`).
    NoMagicLinks,
    /// No mount point on the way.
    NoMounts,
    /// Regular files only: no FIFO, socket, device or directory.
    RegularFiles,
    /// A file with one name only: a hard link may be another user's file.
    NoHardLinks,
    /// Files the worker's user id owns.
    OwnFiles,
    /// What the worker's user id may open itself.
    WorkerAuthority,
}

impl std::fmt::Display for Rule {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Self::OwnDirectory => "only the worker's own directory",
            Self::NoDotDot => "no `..`",
            Self::NoLinks => "no symbolic links",
            Self::NoMagicLinks => "no /proc magic links",
            Self::NoMounts => "no mount points",
            Self::RegularFiles => "regular files only",
            Self::NoHardLinks => "no hard links",
            Self::OwnFiles => "only the worker's own files",
            Self::WorkerAuthority => "only what the worker may open",
        })
    }
}

/// Why a file in a worker's tree was not opened.
#[derive(Debug, thiserror::Error)]
pub(crate) enum TreeError {
    /// The path does not lie under the work directory.
    #[error("the rule \"{}\" refuses {}: it is not under {}", Rule::OwnDirectory, path.display(), tree.display())]
    Outside {
        /// The path named.
        path: PathBuf,
        /// The work directory.
        tree: PathBuf,
    },
    /// The path climbs with `..`.
    #[error("the rule \"{}\" refuses {}", Rule::NoDotDot, path.display())]
    DotDot {
        /// The path named.
        path: PathBuf,
    },
    /// A component is a symbolic link.
    #[error("the rule \"{}\" refuses {}: it is a symbolic link (to {}), and the node follows no link in a worker's directory", Rule::NoLinks, link.display(), target.display())]
    Link {
        /// The link.
        link: PathBuf,
        /// Where it points.
        target: PathBuf,
    },
    /// A component is a link into `/proc`.
    #[error("the rule \"{}\" refuses {}: it is a link to {}", Rule::NoMagicLinks, link.display(), target.display())]
    MagicLink {
        /// The link.
        link: PathBuf,
        /// Where it points.
        target: PathBuf,
    },
    /// A component is a mount point.
    #[error("the rule \"{}\" refuses {}: a file system is mounted there", Rule::NoMounts, at.display())]
    Mount {
        /// Where.
        at: PathBuf,
    },
    /// Not a regular file.
    #[error("the rule \"{}\" refuses {}: it is {kind}", Rule::RegularFiles, path.display())]
    NotRegular {
        /// The path.
        path: PathBuf,
        /// What it is.
        kind: &'static str,
    },
    /// More than one name.
    #[error("the rule \"{}\" refuses {}: it has {links} names, and another may be another user's", Rule::NoHardLinks, path.display())]
    HardLinked {
        /// The path.
        path: PathBuf,
        /// How many names it has.
        links: u64,
    },
    /// Another user's file.
    #[error("the rule \"{}\" refuses {}: it belongs to user id {uid}, not to the worker's {worker}", Rule::OwnFiles, path.display())]
    Foreign {
        /// The path.
        path: PathBuf,
        /// Its owner.
        uid: u32,
        /// The worker's id.
        worker: u32,
    },
    /// The worker's id may not open it.
    #[error("the rule \"{}\" refuses {}: user id {worker} may not open it, and the node opens it as that user", Rule::WorkerAuthority, path.display())]
    Denied {
        /// The path.
        path: PathBuf,
        /// The worker's id.
        worker: u32,
    },
    /// Opening failed otherwise (it does not exist, say).
    #[error("cannot open {}", path.display())]
    Io {
        /// The path.
        path: PathBuf,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
}

impl TreeError {
    /// The rule this refusal names; `None` for a plain failure.
    #[cfg(test)]
    pub(crate) fn rule(&self) -> Option<Rule> {
        Some(match self {
            Self::Outside { .. } => Rule::OwnDirectory,
            Self::DotDot { .. } => Rule::NoDotDot,
            Self::Link { .. } => Rule::NoLinks,
            Self::MagicLink { .. } => Rule::NoMagicLinks,
            Self::Mount { .. } => Rule::NoMounts,
            Self::NotRegular { .. } => Rule::RegularFiles,
            Self::HardLinked { .. } => Rule::NoHardLinks,
            Self::Foreign { .. } => Rule::OwnFiles,
            Self::Denied { .. } => Rule::WorkerAuthority,
            Self::Io { .. } => return None,
        })
    }
}

/// The part of `requested` below the work directory `roots[0]` (or another
/// spelling of it in `roots`, such as its canonical path), as plain names only;
/// empty for the directory itself. Pure: nothing is looked up.
pub(crate) fn relative_in_tree(requested: &Path, roots: &[&Path]) -> Result<PathBuf, TreeError> {
    let rest = roots
        .iter()
        .filter(|root| root.is_absolute())
        .find_map(|root| requested.strip_prefix(root).ok())
        .ok_or_else(|| TreeError::Outside {
            path: requested.to_owned(),
            tree: roots
                .first()
                .map(|root| root.to_path_buf())
                .unwrap_or_default(),
        })?;
    let mut relative = PathBuf::new();
    for component in rest.components() {
        match component {
            Component::Normal(name) => relative.push(name),
            Component::CurDir => {}
            Component::ParentDir => {
                return Err(TreeError::DotDot {
                    path: requested.to_owned(),
                });
            }
            Component::RootDir | Component::Prefix(_) => {
                return Err(TreeError::Outside {
                    path: requested.to_owned(),
                    tree: roots
                        .first()
                        .map(|root| root.to_path_buf())
                        .unwrap_or_default(),
                });
            }
        }
    }
    Ok(relative)
}

/// How `openat2` resolves below a worker's directory.
const RESOLVE: ResolveFlag = ResolveFlag::RESOLVE_BENEATH
    .union(ResolveFlag::RESOLVE_NO_SYMLINKS)
    .union(ResolveFlag::RESOLVE_NO_MAGICLINKS)
    .union(ResolveFlag::RESOLVE_NO_XDEV);

/// How a directory on the way is opened in the fallback walk.
const STEP_FLAGS: OFlag = OFlag::O_RDONLY
    .union(OFlag::O_DIRECTORY)
    .union(OFlag::O_NOFOLLOW)
    .union(OFlag::O_CLOEXEC);

/// Opens `relative` (plain names, as [`relative_in_tree`] gives) below `root`
/// with `flags` (`O_NOFOLLOW` and `O_CLOEXEC` added), following no link,
/// magic link or mount point. `shown` is the root's path, for messages;
/// `worker` the worker's user id, when the caller runs as it (a refusal of
/// access then names that rule).
pub(crate) fn open_beneath(
    root: impl AsFd,
    relative: &Path,
    flags: OFlag,
    shown: &Path,
    worker: Option<u32>,
) -> Result<OwnedFd, TreeError> {
    let flags = flags | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC;
    let name: &Path = if relative.as_os_str().is_empty() {
        Path::new(".")
    } else {
        relative
    };
    let how = OpenHow::new().flags(flags).resolve(RESOLVE);
    match nix::fcntl::openat2(root.as_fd(), name, how) {
        Ok(fd) => Ok(fd),
        // No openat2 here (an old kernel, or a seccomp filter refusing it).
        Err(Errno::ENOSYS | Errno::EPERM | Errno::E2BIG) => {
            walk(root.as_fd(), relative, flags, shown, worker)
        }
        // A link or a mount on the way: the walk names which, and refuses too
        // where it cannot tell (a bind mount of the same file system, or a
        // path that changed in between).
        Err(errno @ (Errno::ELOOP | Errno::EXDEV | Errno::EAGAIN | Errno::ENOTDIR)) => {
            match walk(root.as_fd(), relative, flags, shown, worker) {
                Err(refusal) => Err(refusal),
                Ok(_) if errno == Errno::ENOTDIR => {
                    Err(open_error(errno, shown.join(relative), worker))
                }
                Ok(_) if errno == Errno::EXDEV => Err(TreeError::Mount {
                    at: shown.join(relative),
                }),
                Ok(_) => Err(TreeError::Link {
                    link: shown.join(relative),
                    target: PathBuf::from("(changed while it was opened)"),
                }),
            }
        }
        Err(errno) => Err(open_error(errno, shown.join(relative), worker)),
    }
}

/// The fallback: one plain name at a time, each directory opened with
/// `O_NOFOLLOW | O_DIRECTORY` from the one before, none on another device.
fn walk(
    root: std::os::fd::BorrowedFd<'_>,
    relative: &Path,
    flags: OFlag,
    shown: &Path,
    worker: Option<u32>,
) -> Result<OwnedFd, TreeError> {
    let io = |path: &Path| {
        let path = path.to_owned();
        move |errno: Errno| open_error(errno, path, worker)
    };
    let root_device = nix::sys::stat::fstat(root).map_err(io(shown))?.st_dev;
    let names: Vec<&OsStr> = relative
        .components()
        .filter_map(|component| match component {
            Component::Normal(name) => Some(name),
            _ => None,
        })
        .collect();
    let Some((last, on_the_way)) = names.split_last() else {
        return nix::fcntl::openat(root, ".", flags, Mode::empty()).map_err(io(shown));
    };
    let mut dir = root.try_clone_to_owned().map_err(|source| TreeError::Io {
        path: shown.to_owned(),
        source,
    })?;
    let mut walked = shown.to_owned();
    for name in on_the_way {
        walked.push(name);
        dir = step(&dir, name, STEP_FLAGS, &walked, root_device, worker)?;
    }
    walked.push(last);
    step(&dir, last, flags, &walked, root_device, worker)
}

/// Opens `name` in `dir` without following it; a link there is named, and so
/// is a step onto another device.
fn step(
    dir: &OwnedFd,
    name: &OsStr,
    flags: OFlag,
    walked: &Path,
    root_device: libc::dev_t,
    worker: Option<u32>,
) -> Result<OwnedFd, TreeError> {
    match nix::fcntl::openat(dir, name, flags, Mode::empty()) {
        Ok(fd) => {
            let device = nix::sys::stat::fstat(&fd)
                .map_err(|errno| open_error(errno, walked.to_owned(), worker))?
                .st_dev;
            if device == root_device {
                Ok(fd)
            } else {
                Err(TreeError::Mount {
                    at: walked.to_owned(),
                })
            }
        }
        Err(errno @ (Errno::ELOOP | Errno::ENOTDIR)) => match nix::fcntl::readlinkat(dir, name) {
            Ok(target) => Err(link_refusal(walked, PathBuf::from(target))),
            Err(_) => Err(open_error(errno, walked.to_owned(), worker)),
        },
        Err(errno) => Err(open_error(errno, walked.to_owned(), worker)),
    }
}

/// The refusal of link `link` to `target`: a magic link when it leads into `/proc`.
fn link_refusal(link: &Path, target: PathBuf) -> TreeError {
    if target.starts_with("/proc") {
        TreeError::MagicLink {
            link: link.to_owned(),
            target,
        }
    } else {
        TreeError::Link {
            link: link.to_owned(),
            target,
        }
    }
}

/// What an `errno` from opening `path` means: no access for the worker (when
/// the open ran as it), a socket, or a plain failure.
fn open_error(errno: Errno, path: PathBuf, worker: Option<u32>) -> TreeError {
    match (errno, worker) {
        (Errno::EACCES, Some(worker)) => TreeError::Denied { path, worker },
        (Errno::ENXIO, _) => TreeError::NotRegular {
            path,
            kind: "a socket",
        },
        _ => TreeError::Io {
            path,
            source: std::io::Error::from(errno),
        },
    }
}

/// What the file type bits of `mode` name, for a refusal.
fn kind(mode: libc::mode_t) -> &'static str {
    match mode & libc::S_IFMT {
        libc::S_IFREG => "a regular file",
        libc::S_IFDIR => "a directory",
        libc::S_IFIFO => "a FIFO",
        libc::S_IFSOCK => "a socket",
        libc::S_IFCHR => "a character device",
        libc::S_IFBLK => "a block device",
        libc::S_IFLNK => "a symbolic link",
        _ => "not a regular file",
    }
}

/// Whether what `stat` describes may be read for a worker of `owner` (any,
/// without one): a regular file with one name, the worker's own.
pub(crate) fn check_file(
    stat: &FileStat,
    path: &Path,
    owner: Option<FileOwner>,
) -> Result<(), TreeError> {
    if stat.st_mode & libc::S_IFMT != libc::S_IFREG {
        return Err(TreeError::NotRegular {
            path: path.to_owned(),
            kind: kind(stat.st_mode),
        });
    }
    if stat.st_nlink != 1 {
        return Err(TreeError::HardLinked {
            path: path.to_owned(),
            links: stat.st_nlink,
        });
    }
    match owner {
        Some(owner) if stat.st_uid != owner.uid => Err(TreeError::Foreign {
            path: path.to_owned(),
            uid: stat.st_uid,
            worker: owner.uid,
        }),
        _ => Ok(()),
    }
}

/// Opens regular file `relative` below `root` for reading ([`open_beneath`]),
/// a FIFO without blocking, and keeps it only if [`check_file`] agrees.
pub(crate) fn open_file_beneath(
    root: impl AsFd,
    relative: &Path,
    shown: &Path,
    owner: Option<FileOwner>,
) -> Result<File, TreeError> {
    let flags = OFlag::O_RDONLY | OFlag::O_NONBLOCK | OFlag::O_NOCTTY;
    let path = shown.join(relative);
    let fd = open_beneath(root, relative, flags, shown, owner.map(|owner| owner.uid))?;
    let stat = nix::sys::stat::fstat(&fd).map_err(|errno| open_error(errno, path.clone(), None))?;
    check_file(&stat, &path, owner)?;
    Ok(File::from(fd))
}

/// Opens directory `relative` below `root` ([`open_beneath`]); an empty path
/// opens `root` again (with the caller's identity).
pub(crate) fn open_dir_beneath(
    root: impl AsFd,
    relative: &Path,
    shown: &Path,
    worker: Option<u32>,
) -> Result<OwnedFd, TreeError> {
    open_beneath(
        root,
        relative,
        OFlag::O_RDONLY | OFlag::O_DIRECTORY,
        shown,
        worker,
    )
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::PermissionsExt;

    use super::*;

    #[track_caller]
    fn check_relative(requested: &str, expected: Result<&str, Rule>) {
        let roots = [
            Path::new("/data/work/t/a1/rank0"),
            Path::new("/real/t/a1/rank0"),
        ];
        let got = relative_in_tree(Path::new(requested), &roots);
        match (got, expected) {
            (Ok(relative), Ok(expected)) => {
                assert_eq!(relative, Path::new(expected), "{requested}")
            }
            (Err(error), Err(rule)) => assert_eq!(error.rule(), Some(rule), "{requested}: {error}"),
            (got, expected) => panic!("{requested}: got {got:?}, expected {expected:?}"),
        }
    }

    #[test]
    fn a_named_path_must_lie_under_the_work_directory_as_written() {
        check_relative("/data/work/t/a1/rank0/x", Ok("x"));
        check_relative(
            "/data/work/t/a1/rank0/checkpoint/./state",
            Ok("checkpoint/state"),
        );
        check_relative(
            "/real/t/a1/rank0/objects-out/1.put",
            Ok("objects-out/1.put"),
        );
        check_relative("/data/work/t/a1/rank0", Ok(""));
        check_relative("/data/work/t/a1/rank0/../rank1/x", Err(Rule::NoDotDot));
        check_relative("/data/work/t/a1/rank0/a/../../rank1", Err(Rule::NoDotDot));
        check_relative("/data/work/t/a1/rank01/x", Err(Rule::OwnDirectory));
        check_relative("/etc/shadow", Err(Rule::OwnDirectory));
        check_relative("/proc/self/environ", Err(Rule::OwnDirectory));
        check_relative("relative/x", Err(Rule::OwnDirectory));
        check_relative("/data/work/t/a1/../a1/rank0/x", Err(Rule::OwnDirectory));
    }

    fn stat(mode: libc::mode_t, nlink: u64, uid: u32) -> FileStat {
        // SAFETY: `stat` is plain integers, for which all zeroes is a value.
        let mut stat: FileStat = unsafe { std::mem::zeroed() };
        stat.st_mode = mode;
        stat.st_nlink = nlink as _;
        stat.st_uid = uid;
        stat
    }

    #[track_caller]
    fn check_stat(stat: FileStat, expected: Option<Rule>) {
        let owner = Some(FileOwner::of_uid(1000));
        let got = check_file(&stat, Path::new("/w/f"), owner).err();
        assert_eq!(got.as_ref().and_then(TreeError::rule), expected, "{got:?}");
    }

    #[test]
    fn only_a_regular_file_of_the_worker_with_one_name_is_read() {
        check_stat(stat(libc::S_IFREG | 0o600, 1, 1000), None);
        check_stat(
            stat(libc::S_IFIFO | 0o600, 1, 1000),
            Some(Rule::RegularFiles),
        );
        check_stat(
            stat(libc::S_IFSOCK | 0o600, 1, 1000),
            Some(Rule::RegularFiles),
        );
        check_stat(
            stat(libc::S_IFCHR | 0o600, 1, 1000),
            Some(Rule::RegularFiles),
        );
        check_stat(
            stat(libc::S_IFDIR | 0o700, 2, 1000),
            Some(Rule::RegularFiles),
        );
        check_stat(
            stat(libc::S_IFREG | 0o644, 2, 1000),
            Some(Rule::NoHardLinks),
        );
        check_stat(stat(libc::S_IFREG | 0o644, 1, 0), Some(Rule::OwnFiles));
        // Without a worker id of its own, any owner will do.
        assert!(check_file(&stat(libc::S_IFREG | 0o600, 1, 0), Path::new("/w/f"), None).is_ok());
    }

    /// A work directory with the usual traps, and `outside` with a secret.
    struct Traps {
        temp: tempfile::TempDir,
        work: PathBuf,
    }

    impl Traps {
        fn must_lay_out() -> Self {
            let temp = tempfile::tempdir().expect("tempdir");
            let outside = temp.path().join("outside");
            std::fs::create_dir(&outside).expect("outside");
            std::fs::write(outside.join("secret"), b"root's").expect("secret");
            let work = temp.path().join("work");
            std::fs::create_dir_all(work.join("checkpoint/deep")).expect("work");
            std::fs::write(work.join("checkpoint/deep/state"), b"mine").expect("state");
            std::os::unix::fs::symlink(&outside, work.join("linked_dir")).expect("symlink");
            std::os::unix::fs::symlink(outside.join("secret"), work.join("linked_file"))
                .expect("symlink");
            std::os::unix::fs::symlink("/proc/self/environ", work.join("environ"))
                .expect("symlink");
            std::fs::hard_link(outside.join("secret"), work.join("hard")).expect("hard link");
            nix::unistd::mkfifo(&work.join("fifo"), Mode::from_bits_truncate(0o600)).expect("fifo");
            let _socket =
                std::os::unix::net::UnixListener::bind(work.join("socket")).expect("socket");
            Self { temp, work }
        }

        fn open(&self, relative: &str) -> Result<File, TreeError> {
            let root = super::super::fs::open_dir(&self.work).expect("open");
            open_file_beneath(&root, Path::new(relative), &self.work, None)
        }
    }

    #[track_caller]
    fn check_refused(opened: Result<File, TreeError>, rule: Rule, says: &str) {
        match opened {
            Ok(_) => panic!("opened, expected the rule {rule}"),
            Err(error) => {
                assert_eq!(error.rule(), Some(rule), "{error}");
                assert!(error.to_string().contains(says), "{error}");
            }
        }
    }

    #[test]
    fn links_fifos_sockets_and_hard_links_are_refused_naming_their_rule() {
        let traps = Traps::must_lay_out();
        let mut state = String::new();
        std::io::Read::read_to_string(
            &mut traps.open("checkpoint/deep/state").expect("open"),
            &mut state,
        )
        .expect("read");
        assert_eq!(state, "mine");
        check_refused(
            traps.open("linked_dir/secret"),
            Rule::NoLinks,
            "linked_dir: it is a symbolic link",
        );
        check_refused(traps.open("linked_file"), Rule::NoLinks, "outside/secret");
        check_refused(
            traps.open("environ"),
            Rule::NoMagicLinks,
            "/proc/self/environ",
        );
        check_refused(traps.open("hard"), Rule::NoHardLinks, "2 names");
        check_refused(traps.open("fifo"), Rule::RegularFiles, "a FIFO");
        check_refused(traps.open("socket"), Rule::RegularFiles, "a socket");
        check_refused(traps.open("checkpoint"), Rule::RegularFiles, "a directory");
        assert!(matches!(traps.open("missing"), Err(TreeError::Io { .. })));
        // The fallback walk says the same.
        let root = super::super::fs::open_dir(&traps.work).expect("open");
        let walked = |relative: &str| {
            walk(
                root.as_fd(),
                Path::new(relative),
                OFlag::O_RDONLY | OFlag::O_NOFOLLOW,
                &traps.work,
                None,
            )
        };
        assert!(walked("checkpoint/deep/state").is_ok());
        for (relative, rule) in [
            ("linked_dir/secret", Rule::NoLinks),
            ("linked_file", Rule::NoLinks),
            ("environ", Rule::NoMagicLinks),
        ] {
            let refused = walked(relative).expect_err(relative);
            assert_eq!(refused.rule(), Some(rule), "{refused}");
        }
        let _ = std::fs::set_permissions(traps.temp.path(), std::fs::Permissions::from_mode(0o700));
    }

    /// As root: a file system mounted inside the work directory (a bind of
    /// another trial's directory, say) is not crossed.
    #[test]
    #[expect(clippy::print_stderr, reason = "say why the test is skipped")]
    fn a_mount_point_inside_is_not_crossed() {
        let traps = Traps::must_lay_out();
        let mounted = traps.work.join("mounted");
        std::fs::create_dir(&mounted).expect("mount point");
        let source = traps.temp.path().join("outside");
        let c_path = |path: &Path| {
            std::ffi::CString::new(std::os::unix::ffi::OsStrExt::as_bytes(path.as_os_str()))
                .expect("no NUL")
        };
        let (source, target) = (c_path(&source), c_path(&mounted));
        // SAFETY: two NUL-terminated paths; no file system type nor data.
        let bound = unsafe {
            libc::mount(
                source.as_ptr(),
                target.as_ptr(),
                std::ptr::null(),
                libc::MS_BIND,
                std::ptr::null(),
            )
        };
        if bound != 0 {
            eprintln!(
                "skipped: cannot bind-mount here ({})",
                std::io::Error::last_os_error()
            );
            return;
        }
        let opened = traps.open("mounted/secret");
        // SAFETY: a NUL-terminated path.
        unsafe { libc::umount2(target.as_ptr(), libc::MNT_DETACH) };
        check_refused(opened, Rule::NoMounts, "mounted");
    }
}
