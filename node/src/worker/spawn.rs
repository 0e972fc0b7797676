//! Starting a worker's process: its directories, its environment, and what
//! the child does between fork and exec (enter its cgroup, drop to its user
//! id, arm its death signal).
//!
//! Not here: what to run (the agent prepares it: `agent::prepare`) and
//! watching the process once started (`worker`).
//!
//! Invariant: nothing between fork and exec allocates; it only makes
//! async-signal-safe system calls on data made before the fork.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use nix::sys::signal::Signal;
use tracing::{debug, warn};
use xp_runtime::protocol::Launch;

use super::exec_check::{self, ProgramError, Runner, Surroundings};
use super::{WorkerCommand, worker_env};
use crate::isolation::UidLease;
use crate::isolation::as_worker::AsWorker;
use crate::isolation::fs::FileOwner;

/// Why a worker process could not be started.
#[derive(Debug, thiserror::Error)]
pub(super) enum SpawnError {
    /// A directory the worker needs could not be created.
    #[error("cannot create {path}")]
    CreateDir {
        /// The directory.
        path: PathBuf,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// The program could not be executed: exec failed in the child.
    #[error("cannot start {}: {}", program.display(), exec_words(source))]
    Start {
        /// The program.
        program: PathBuf,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// The launch check found that the program cannot run.
    #[error("cannot start {}", program.display())]
    Program {
        /// The program, as the command names it.
        program: PathBuf,
        /// Why it cannot run.
        #[source]
        source: ProgramError,
    },
}

/// What exec's error means for the user, in words that tell the three usual
/// failures apart (the launch check catches most of them before).
fn exec_words(error: &std::io::Error) -> &'static str {
    match error.raw_os_error() {
        Some(libc::ENOENT) => {
            "not found: the program, or the interpreter on its #! line, does not exist"
        }
        Some(libc::EACCES) => {
            "permission denied: the worker may not run the program (or its interpreter) or pass through a directory above it"
        }
        Some(libc::ENOEXEC) => "not executable: not a program this machine runs",
        Some(libc::E2BIG) => "its arguments and environment are too long",
        _ => "exec failed",
    }
}

/// Starts the worker's process. With `procs_files` the child moves itself into
/// its cgroup before it execs, so nothing it runs or starts is ever outside it
/// (moving it after the spawn would race with its first fork); with a user id of
/// its own it then drops root for it.
pub(super) async fn spawn(
    launch: &Launch,
    command: &WorkerCommand,
    procs_files: Vec<std::ffi::CString>,
) -> Result<tokio::process::Child, SpawnError> {
    let executable = make_dirs_and_check_program(command).await?;
    let mut process = process_command(launch, command, &executable);
    let uid = command.uid.as_ref().map(UidLease::uid);
    arm_before_exec(&mut process, procs_files, uid);
    spawn_retrying(&mut process, &executable).await
}

/// Makes the directories the worker writes to where they are missing, then
/// checks, as the worker, that its program can run and that it may read the
/// files its arguments name in the command's directory (`exec_check`); returns
/// the file to execute. Both in one trip to a blocking thread, since on a busy
/// node each trip costs milliseconds of a launch. When the check itself cannot
/// run (the worker's file thread does not start), exec decides.
async fn make_dirs_and_check_program(command: &WorkerCommand) -> Result<PathBuf, SpawnError> {
    let owner = command
        .uid
        .as_ref()
        .map(|lease| FileOwner::of_uid(lease.uid()));
    let around = Surroundings {
        cwd: command.work_dir.clone(),
        path: command
            .extra_env
            .iter()
            .find(|(name, _)| name == "PATH")
            .map(|(_, value)| value.into())
            .or_else(|| std::env::var_os("PATH")),
        runner: owner.map_or(Runner::Node, |owner| Runner::OwnUid(owner.uid)),
        absent: Default::default(),
    };
    let program = command.program.clone();
    let read_args = command.path_args.clone();
    let dirs = [
        command.log_path.parent().map(Path::to_owned),
        Some(command.work_dir.clone()),
        Some(command.checkpoint.dir.clone()),
        Some(command.output.dir.clone()),
    ];
    let made_and_checked = tokio::task::spawn_blocking(move || {
        make_dirs(dirs.iter().flatten())?;
        Ok(AsWorker::start(owner)
            .and_then(|thread| exec_check::check_as(&thread, &program, &read_args, around)))
    })
    .await;
    let checked = match made_and_checked {
        Ok(made_and_checked) => made_and_checked?,
        // The check could not run: exec decides, as when its thread cannot start.
        Err(error) => Err(std::io::Error::other(error)),
    };
    match checked {
        Ok(Ok(executable)) => Ok(executable),
        Ok(Err(source)) => Err(SpawnError::Program {
            program: command.program.clone(),
            source,
        }),
        Err(error) => {
            warn!(program = %command.program.display(), %error, "cannot check the program before starting it");
            Ok(command.program.clone())
        }
    }
}

/// Makes each of `dirs` where it is missing. The agent made the worker's for
/// its id; this only covers a missing one (when the node runs workers as
/// itself) and the log directory. Blocking.
fn make_dirs<'a>(dirs: impl Iterator<Item = &'a PathBuf>) -> Result<(), SpawnError> {
    for dir in dirs {
        if !dir.is_dir() {
            std::fs::create_dir_all(dir).map_err(|source| SpawnError::CreateDir {
                path: dir.clone(),
                source,
            })?;
        }
    }
    Ok(())
}

/// The worker's program (`executable`, the file the check found, run under the
/// name the command gives it) with its arguments, its environment (the
/// contract of [`worker_env`], the agent's extra variables, its directories)
/// and its pipes, in a process group of its own, in its work directory.
fn process_command(
    launch: &Launch,
    command: &WorkerCommand,
    executable: &Path,
) -> tokio::process::Command {
    let mut process = tokio::process::Command::new(executable);
    process
        .arg0(&command.program)
        .args(&command.args)
        .current_dir(&command.work_dir)
        // A credential in the node's own environment (a user's `XP_CLUSTER`, which
        // `sbatch` and `srun` pass on) must never reach trial code.
        .env_remove("XP_CLUSTER")
        .envs(worker_env(launch))
        .envs(command.extra_env.iter().cloned())
        .env("XP_WORK_DIR", &command.work_dir)
        .env("XP_CHECKPOINT_DIR", &command.checkpoint.dir)
        .env("XP_OUTPUT_DIR", &command.output.dir)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .process_group(0);
    if let Some(inputs) = &command.input_dir {
        process.env("XP_INPUT_DIR", inputs);
    }
    if command.uid.is_some() {
        // An id made for the worker has no home of its own; the node's is not its.
        process.env("HOME", &command.work_dir);
    }
    process
}

/// What the child does between fork and exec: enter its cgroup (`procs_files`),
/// drop to `uid` where it has one, and arm its death signal.
fn arm_before_exec(
    process: &mut tokio::process::Command,
    procs_files: Vec<std::ffi::CString>,
    uid: Option<u32>,
) {
    let node_pid = std::process::id() as libc::pid_t;
    // SAFETY: between fork and exec the closure only calls open(2), write(2),
    // close(2), setgroups(2), setgid(2), setuid(2), prctl(2) and
    // getppid(2), which are async-signal-safe, on data made before the fork; the
    // child has one thread, so setuid needs no cross-thread broadcast. Nothing in
    // it allocates (errors are raw errno values), as the forked child of a
    // multi-threaded process may not.
    unsafe {
        process.pre_exec(move || {
            // Entering the cgroup needs root: first.
            crate::cgroup::enter(&procs_files)?;
            if let Some(uid) = uid {
                drop_to(uid)?;
            }
            // After the switch, which clears it.
            nix::sys::prctl::set_pdeathsig(Signal::SIGKILL).map_err(std::io::Error::from)?;
            if libc::getppid() != node_pid {
                // The node died before the death signal was armed. No
                // allocation here (this is between fork and exec): a plain errno.
                return Err(std::io::Error::from_raw_os_error(libc::ESRCH));
            }
            Ok(())
        });
    }
}

/// Spawns `process`. A driver binary another task has just written may still be
/// open for writing in a child some other thread forked meanwhile (the
/// descriptor lives until that child execs), and exec then fails with ETXTBSY:
/// a few short retries outlast that window.
async fn spawn_retrying(
    process: &mut tokio::process::Command,
    program: &Path,
) -> Result<tokio::process::Child, SpawnError> {
    let mut busy_retries = 0;
    loop {
        match process.spawn() {
            Ok(child) => return Ok(child),
            Err(source)
                if source.raw_os_error() == Some(libc::ETXTBSY)
                    && busy_retries < SPAWN_BUSY_RETRIES =>
            {
                busy_retries += 1;
                debug!(program = %program.display(), busy_retries, "the program is still open for writing somewhere; retrying");
                tokio::time::sleep(Duration::from_millis(20 * u64::from(busy_retries))).await;
            }
            Err(source) => {
                return Err(SpawnError::Start {
                    program: program.to_owned(),
                    source,
                });
            }
        }
    }
}

/// How many times a spawn that fails with ETXTBSY is tried again (about a
/// second in all).
const SPAWN_BUSY_RETRIES: u32 = 10;

/// Drops every privilege for user and group id `uid`: no supplementary groups,
/// then the group, then the user (the other way round, the group could no longer
/// be changed), and no new privileges from then on. Called between fork and exec. It kills nothing: sibling ranks of
/// the attempt may already run as `uid`, and what an earlier holder left was
/// killed before the id was handed out (`UidLease::ready`).
fn drop_to(uid: u32) -> std::io::Result<()> {
    let check = |result: libc::c_int| {
        if result == 0 {
            Ok(())
        } else {
            Err(std::io::Error::last_os_error())
        }
    };
    // SAFETY: plain system calls on integers; setgroups reads no memory for 0 groups.
    unsafe {
        check(libc::setgroups(0, std::ptr::null()))?;
        check(libc::setgid(uid))?;
        check(libc::setuid(uid))?;
        // So that nothing the worker runs regains privileges through a setuid
        // or file-capability binary (sudo in a trial is not a feature).
        check(libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0))?;
    }
    Ok(())
}
