//! Whether a worker's program can run, asked before it is started and with the
//! worker's own authority, so that a launch that cannot work fails saying
//! which file is at fault and why, instead of with a bare exit status.
//!
//! [`check`] runs on a thread whose file-system identity is the worker's
//! (`isolation::as_worker`): every `stat`, `open` and access check there is
//! judged by the kernel as the worker's own would be. It finds the program as
//! `execvp` does (a name without a slash on the worker's `PATH`, going on past
//! directories the worker may not search or files it may not run; a path
//! relative to the worker's directory), checks that the worker may execute it
//! (`faccessat2` with `AT_EACCESS`, the kernel's own answer), reads its `#!`
//! line and checks the interpreter the same way (and, for `/usr/bin/env NAME`,
//! finds `NAME` on the `PATH`), and checks that the worker may read the
//! arguments the node found in the command's directory. It tells three
//! failures apart, each naming the path: not found, permission denied (with
//! what to do: make it readable by other users, or run the node with
//! `--worker-uids none`), and not executable. A name on the `PATH` that the
//! worker is refused only because it may not search a directory there is
//! looked up again as the node ([`check_as`]): a program that is nowhere is
//! not found, not refused.
//!
//! What it cannot see (an interpreter's own libraries, a file changed after the
//! check) exec's error still reports; the worker module maps its errno.
//!
//! Not here: where the command's relative paths are found (`agent::prepare`)
//! and starting the process (`worker::spawn`).

use std::collections::BTreeSet;
use std::ffi::{OsStr, OsString};
use std::fmt;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use crate::isolation::as_worker::AsWorker;

/// How many `#!` interpreters deep a program is followed.
const MAX_INTERPRETERS: usize = 4;
/// How much of a file is read for its `#!` line (what the kernel reads).
const HEAD_BYTES: usize = 256;
/// `execvp`'s `PATH` when the environment has none.
const DEFAULT_PATH: &str = "/bin:/usr/bin";

/// Who a worker runs as, for messages.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Runner {
    /// A user id of its own (a root node).
    OwnUid(u32),
    /// The node's own user.
    Node,
}

impl fmt::Display for Runner {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::OwnUid(uid) => write!(f, "the worker's user id {uid}"),
            Self::Node => f.write_str("the node's user"),
        }
    }
}

/// What the worker is refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Access {
    /// Executing the program or an interpreter.
    Run,
    /// Reading a file the command names.
    Read,
}

/// Why a worker's program cannot run.
#[derive(Debug, thiserror::Error)]
pub(crate) enum ProgramError {
    /// No directory of the worker's `PATH` holds the program.
    #[error("not found: no directory of the worker's PATH ({path}) holds `{program}`")]
    NotOnPath {
        /// The program's name.
        program: String,
        /// The `PATH` searched.
        path: String,
    },
    /// The path names nothing.
    #[error("not found: {} does not exist", path.display())]
    Missing {
        /// The path.
        path: PathBuf,
    },
    /// The worker may not run (or read) the file, or reach it.
    #[error("permission denied: {runner} may not {verb} {}: {why}{hint}", path.display(), verb = access.verb(), hint = runner.hint(*access))]
    Denied {
        /// The file.
        path: PathBuf,
        /// Who was refused.
        runner: Runner,
        /// What was refused.
        access: Access,
        /// What refused it (a directory above it, or its mode).
        why: String,
        /// It was a candidate on the worker's `PATH`, which may not be there at all.
        on_path: bool,
    },
    /// The file is not a program anyone may run.
    #[error("not executable: {}: {why}", path.display())]
    NotExecutable {
        /// The file.
        path: PathBuf,
        /// Why not.
        why: String,
    },
    /// The interpreter a script names on its `#!` line cannot run.
    #[error("the interpreter on the #! line of {} cannot run", script.display())]
    Interpreter {
        /// The script.
        script: PathBuf,
        /// Why its interpreter cannot run.
        #[source]
        source: Box<Self>,
    },
}

impl Access {
    fn verb(self) -> &'static str {
        match self {
            Self::Run => "run",
            Self::Read => "read",
        }
    }
}

impl Runner {
    /// What to do about a refusal, when the worker has an id of its own.
    fn hint(self, access: Access) -> &'static str {
        match (self, access) {
            (Self::Node, _) => "",
            (Self::OwnUid(_), Access::Run) => {
                "; make it readable and executable by other users (chmod o+rx on it, o+x on each directory above it), or run the node with --worker-uids none"
            }
            (Self::OwnUid(_), Access::Read) => {
                "; make it readable by other users (chmod o+r on it, o+x on each directory above it), or run the node with --worker-uids none"
            }
        }
    }
}

/// What a worker's program is looked up in.
#[derive(Debug, Clone)]
pub(crate) struct Surroundings {
    /// The worker's working directory.
    pub cwd: PathBuf,
    /// The worker's `PATH`.
    pub path: Option<OsString>,
    /// Who it runs as.
    pub runner: Runner,
    /// Candidates on the `PATH` that the worker may not reach and the node
    /// found are not there: not found, rather than refused.
    pub absent: BTreeSet<PathBuf>,
}

/// The most candidates on the `PATH` the node looks up for the worker.
const MAX_ABSENT: usize = 64;

/// Checks on `thread` (the worker's file thread) that `program` can run and
/// that the worker may read each of `read_args`; returns the file `exec` will
/// run (absolute, unless the worker's directory is not), or why it cannot.
///
/// A candidate on the `PATH` the worker may not reach (a directory it cannot
/// search, such as `/root/.cargo/bin`) is looked up as the node: one that is
/// not there is passed over as not found, so a program that exists nowhere is
/// reported not found, not refused. Only `PATH` candidates are: the node
/// tells nobody what else lies in directories the worker may not search.
pub(crate) fn check_as(
    thread: &AsWorker,
    program: &Path,
    read_args: &[PathBuf],
    around: Surroundings,
) -> std::io::Result<Result<PathBuf, ProgramError>> {
    let mut around = around;
    loop {
        let job = (program.to_owned(), read_args.to_vec(), around.clone());
        let checked = thread.run(move || {
            let (program, read_args, around) = job;
            check(&program, &read_args, &around)
        })?;
        match checked.as_ref().err().and_then(refused_on_path) {
            Some(path) if around.absent.len() < MAX_ABSENT && !path.exists() => {
                around.absent.insert(path.to_owned());
            }
            _ => return Ok(checked),
        }
    }
}

/// The `PATH` candidate whose refusal `error` reports, through interpreters.
fn refused_on_path(error: &ProgramError) -> Option<&Path> {
    match error {
        ProgramError::Denied {
            path,
            on_path: true,
            ..
        } => Some(path),
        ProgramError::Interpreter { source, .. } => refused_on_path(source),
        _ => None,
    }
}

/// Checks, with this thread's identity, that `program` can run and that the
/// worker may read each of `read_args`; returns the file `exec` will run.
pub(crate) fn check(
    program: &Path,
    read_args: &[PathBuf],
    around: &Surroundings,
) -> Result<PathBuf, ProgramError> {
    let executable = find(program.as_os_str(), around, 0)?;
    for path in read_args {
        check_readable(path, around.runner)?;
    }
    Ok(executable)
}

/// The file `name` names, as `execvp` finds it: on the `PATH` without a slash,
/// else as a path (relative ones from the worker's directory); checked.
fn find(name: &OsStr, around: &Surroundings, depth: usize) -> Result<PathBuf, ProgramError> {
    if name.as_bytes().contains(&b'/') {
        let path = around.cwd.join(name);
        probe(&path, around, depth)?;
        return Ok(path);
    }
    let path_var = around
        .path
        .clone()
        .unwrap_or_else(|| OsString::from(DEFAULT_PATH));
    let mut refusal = None;
    for dir in std::env::split_paths(&path_var) {
        // An empty entry is the current directory, as for execvp.
        let candidate = around.cwd.join(dir).join(name);
        match probe(&candidate, around, depth) {
            Ok(()) => return Ok(candidate),
            Err(ProgramError::Missing { .. }) => {}
            Err(ProgramError::Denied { path, .. })
                if path == candidate && around.absent.contains(&candidate) => {}
            // execvp goes on past what it may not run; the first refusal says why
            // none ran.
            Err(mut error) => {
                if let ProgramError::Denied { path, on_path, .. } = &mut error {
                    *on_path = *path == candidate;
                }
                refusal.get_or_insert(error);
            }
        }
    }
    Err(refusal.unwrap_or_else(|| ProgramError::NotOnPath {
        program: name.to_string_lossy().into_owned(),
        path: path_var.to_string_lossy().into_owned(),
    }))
}

/// Checks that the worker may execute `path`, and its interpreter if it is a script.
fn probe(path: &Path, around: &Surroundings, depth: usize) -> Result<(), ProgramError> {
    let metadata = std::fs::metadata(path)
        .map_err(|error| refused(path, &error, around.runner, Access::Run))?;
    let not_executable = |why: &str| ProgramError::NotExecutable {
        path: path.to_owned(),
        why: why.to_owned(),
    };
    if metadata.is_dir() {
        return Err(not_executable("it is a directory"));
    }
    if !metadata.is_file() {
        return Err(not_executable("it is not a regular file"));
    }
    if metadata.mode() & 0o111 == 0 {
        return Err(not_executable(
            "it has no execute permission (chmod +x it, or run it through its interpreter, such as [sh, FILE] or [python3, FILE])",
        ));
    }
    if may_execute(path) == Some(false) {
        return Err(ProgramError::Denied {
            path: path.to_owned(),
            runner: around.runner,
            access: Access::Run,
            why: format!("its mode is {}", mode_words(&metadata)),
            on_path: false,
        });
    }
    if depth >= MAX_INTERPRETERS {
        return Ok(());
    }
    let Some(line) = shebang(path) else {
        return Ok(());
    };
    check_interpreter(&line, around, depth).map_err(|source| ProgramError::Interpreter {
        script: path.to_owned(),
        source: Box::new(source),
    })
}

/// Checks the interpreter a `#!` line names (`line` is what follows `#!`), and
/// the program `/usr/bin/env` is asked to find.
fn check_interpreter(line: &str, around: &Surroundings, depth: usize) -> Result<(), ProgramError> {
    let mut words = line.split_whitespace();
    let Some(interpreter) = words.next() else {
        return Ok(());
    };
    let interpreter = around.cwd.join(interpreter);
    probe(&interpreter, around, depth + 1)?;
    if interpreter.file_name() == Some(OsStr::new("env")) {
        // `env NAME`, `env -S NAME ARGS`, `env VAR=VALUE NAME`: the first word
        // that is neither an option nor an assignment is what env runs.
        let named = words.find(|word| !word.starts_with('-') && !word.contains('='));
        if let Some(named) = named {
            find(OsStr::new(named), around, depth + 1)?;
        }
    }
    Ok(())
}

/// What follows `#!` on the first line of `path`, when the worker can read it
/// and it starts so.
fn shebang(path: &Path) -> Option<String> {
    use std::io::Read;
    use std::os::unix::fs::OpenOptionsExt;
    let mut file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK | libc::O_NOCTTY)
        .open(path)
        .ok()?;
    let mut head = Vec::with_capacity(HEAD_BYTES);
    file.by_ref()
        .take(HEAD_BYTES as u64)
        .read_to_end(&mut head)
        .ok()?;
    let rest = head.strip_prefix(b"#!")?;
    let line = rest.split(|byte| *byte == b'\n').next().unwrap_or(rest);
    Some(String::from_utf8_lossy(line).trim().to_owned())
}

/// Checks that the worker may read `path` (and list it, for a directory).
fn check_readable(path: &Path, runner: Runner) -> Result<(), ProgramError> {
    let metadata =
        std::fs::metadata(path).map_err(|error| refused(path, &error, runner, Access::Read))?;
    let opened = if metadata.is_dir() {
        std::fs::read_dir(path).map(drop)
    } else if metadata.is_file() {
        use std::os::unix::fs::OpenOptionsExt;
        std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_NONBLOCK | libc::O_NOCTTY)
            .open(path)
            .map(drop)
    } else {
        Ok(())
    };
    match opened {
        Err(error) if error.kind() == std::io::ErrorKind::PermissionDenied => {
            Err(ProgramError::Denied {
                path: path.to_owned(),
                runner,
                access: Access::Read,
                why: format!("its mode is {}", mode_words(&metadata)),
                on_path: false,
            })
        }
        _ => Ok(()),
    }
}

/// The error for a `stat` of `path` that failed with `error`.
fn refused(path: &Path, error: &std::io::Error, runner: Runner, access: Access) -> ProgramError {
    match error.raw_os_error() {
        Some(libc::ENOENT | libc::ENOTDIR) => ProgramError::Missing {
            path: path.to_owned(),
        },
        Some(libc::EACCES) => ProgramError::Denied {
            path: path.to_owned(),
            runner,
            access,
            why: blocking_dir(path),
            on_path: false,
        },
        _ => ProgramError::NotExecutable {
            path: path.to_owned(),
            why: error.to_string(),
        },
    }
}

/// Which directory above `path` the worker may not pass through, in words.
fn blocking_dir(path: &Path) -> String {
    let mut ancestors: Vec<&Path> = path.ancestors().skip(1).collect();
    ancestors.reverse();
    for dir in ancestors {
        // Reading `DIR/.` needs the right to pass through DIR itself.
        if let Err(error) = std::fs::metadata(dir.join("."))
            && error.raw_os_error() == Some(libc::EACCES)
        {
            return match std::fs::metadata(dir) {
                Ok(metadata) => format!(
                    "{} does not let it through (mode {})",
                    dir.display(),
                    mode_words(&metadata)
                ),
                Err(_) => format!("{} does not let it through", dir.display()),
            };
        }
    }
    "a directory above it does not let it through".to_owned()
}

/// A file's permission bits and owner, as `0700, owner 0:0`.
fn mode_words(metadata: &std::fs::Metadata) -> String {
    format!(
        "{:04o}, owner {}:{}",
        metadata.mode() & 0o7777,
        metadata.uid(),
        metadata.gid()
    )
}

/// Whether this thread's identity may execute `path`, as the kernel judges it
/// (`faccessat2` with `AT_EACCESS` uses the file-system ids the worker's file
/// thread took on); `None` when it cannot say (an older kernel).
fn may_execute(path: &Path) -> Option<bool> {
    let path = std::ffi::CString::new(path.as_os_str().as_bytes()).ok()?;
    // SAFETY: a system call on a NUL-terminated path that outlives it.
    let result = unsafe {
        libc::syscall(
            libc::SYS_faccessat2,
            libc::AT_FDCWD,
            path.as_ptr(),
            libc::X_OK,
            libc::AT_EACCESS,
        )
    };
    if result == 0 {
        return Some(true);
    }
    match std::io::Error::last_os_error().raw_os_error() {
        Some(libc::EACCES | libc::EPERM) => Some(false),
        _ => None,
    }
}

#[cfg(test)]
mod tests;
