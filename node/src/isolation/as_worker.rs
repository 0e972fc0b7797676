//! File work on a worker's behalf with the worker's authority, not root's: a
//! thread of its own whose file-system identity is the worker's.
//!
//! [`AsWorker::start`] spawns a thread that first makes its own credentials the
//! worker's for every file check (raw `setgroups(0)`, `setfsgid`, `setfsuid`
//! system calls, each of which changes the calling thread only, then `capset`
//! with an empty effective set), and then runs the jobs it is given
//! ([`AsWorker::run`]) until it is dropped. A job opens what the node will read
//! (a `put`'s file, a checkpoint's or the outputs' files and directories); the
//! kernel checks each open against the worker's user and group, no supplementary
//! group and no capability, exactly as if the worker opened it. The descriptors
//! come back to the caller, which reads them and writes the store as root.
//!
//! Why a thread and not a helper process per attempt running as the worker's
//! user: the thread gets the same kernel checks, with no second program, no
//! protocol to pass descriptors back (`SCM_RIGHTS`) and no decoder of what a
//! process the worker could attach to (it runs as the worker) sends; its
//! identity dies with it, and nothing else ever runs on it. The one care it
//! needs is to switch by raw system call: glibc's `setgroups` (and `setuid`)
//! apply to every thread of the process, while the kernel's calls apply to the
//! caller's own credentials.
//!
//! Not here: which files may be opened (`beneath`), and writing into a
//! worker's tree (`fs`: root creates new files there with `O_EXCL`, opening no
//! existing name).
//!
//! Invariant: a job given to [`AsWorker::run`] with an owner runs only after its
//! thread's file-system user, group, supplementary groups and effective
//! capabilities are the worker's (or none), and on no other thread.

use std::sync::mpsc;

use super::fs::FileOwner;

/// A job for the thread.
type Job = Box<dyn FnOnce() + Send + 'static>;

/// A thread doing file work with a worker's identity (or, without an owner,
/// the caller itself, inline).
#[derive(Debug)]
pub(crate) struct AsWorker {
    jobs: Option<mpsc::Sender<Job>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl AsWorker {
    /// A thread with `owner`'s file-system identity; with `None` (workers run
    /// as the node's own user) jobs run inline on the caller.
    pub(crate) fn start(owner: Option<FileOwner>) -> std::io::Result<Self> {
        let Some(file_owner) = owner else {
            return Ok(Self {
                jobs: None,
                thread: None,
            });
        };
        let (jobs_tx, jobs_rx) = mpsc::channel::<Job>();
        let (switched_tx, switched_rx) = mpsc::sync_channel(1);
        let thread = std::thread::Builder::new()
            .name(format!("as-uid-{}", file_owner.uid))
            .spawn(move || {
                let switched = become_owner(file_owner);
                let ok = switched.is_ok();
                let _ = switched_tx.send(switched);
                if ok {
                    for job in jobs_rx {
                        job();
                    }
                }
            })?;
        let switched = switched_rx
            .recv()
            .map_err(|_| std::io::Error::other("the worker's file thread ended at its start"))
            .and_then(|switched| switched);
        if let Err(error) = switched {
            let _ = thread.join();
            return Err(std::io::Error::new(
                error.kind(),
                format!("cannot take on user id {}: {error}", file_owner.uid),
            ));
        }
        Ok(Self {
            jobs: Some(jobs_tx),
            thread: Some(thread),
        })
    }

    /// Runs `job` on the thread and returns what it returned; an error only
    /// when the thread is gone (the job panicked).
    pub(crate) fn run<T: Send + 'static>(
        &self,
        job: impl FnOnce() -> T + Send + 'static,
    ) -> std::io::Result<T> {
        let Some(jobs) = &self.jobs else {
            return Ok(job());
        };
        let (done_tx, done_rx) = mpsc::sync_channel(1);
        jobs.send(Box::new(move || {
            let _ = done_tx.send(job());
        }))
        .map_err(|_| std::io::Error::other("the worker's file thread is gone"))?;
        done_rx
            .recv()
            .map_err(|_| std::io::Error::other("a job on the worker's file thread failed"))
    }
}

impl Drop for AsWorker {
    fn drop(&mut self) {
        // The thread ends once its queue closes.
        self.jobs.take();
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// The header of `capget`/`capset` (`struct __user_cap_header_struct`).
#[repr(C)]
struct CapHeader {
    version: u32,
    pid: libc::c_int,
}

/// One half of the capability sets (`struct __user_cap_data_struct`).
#[repr(C)]
#[derive(Clone, Copy, Default)]
struct CapData {
    effective: u32,
    permitted: u32,
    inheritable: u32,
}

/// `_LINUX_CAPABILITY_VERSION_3`: 64-bit sets in two halves.
const CAPABILITY_VERSION_3: u32 = 0x2008_0522;

/// Makes this thread's file checks the worker's: no supplementary groups,
/// file-system group and user `owner`, no effective capability. Only this
/// thread changes.
fn become_owner(owner: FileOwner) -> std::io::Result<()> {
    let last_error = std::io::Error::last_os_error;
    let (uid, gid) = (libc::c_long::from(owner.uid), libc::c_long::from(owner.gid));
    // What setfsuid and setfsgid take for "no id": they change nothing then and
    // return the id in force, which reads it back.
    let no_id = libc::c_long::from(u32::MAX);
    // SAFETY: raw system calls on integers (setgroups reads no memory for zero
    // groups); each changes only the calling thread's credentials.
    let (fsuid, fsgid) = unsafe {
        if libc::syscall(libc::SYS_setgroups, 0, std::ptr::null::<libc::gid_t>()) != 0 {
            return Err(last_error());
        }
        libc::syscall(libc::SYS_setfsgid, gid);
        libc::syscall(libc::SYS_setfsuid, uid);
        (
            libc::syscall(libc::SYS_setfsuid, no_id),
            libc::syscall(libc::SYS_setfsgid, no_id),
        )
    };
    if fsuid != uid || fsgid != gid {
        return Err(std::io::Error::other(format!(
            "the file-system ids are {fsuid}:{fsgid}, not {uid}:{gid}"
        )));
    }
    let mut header = CapHeader {
        version: CAPABILITY_VERSION_3,
        pid: 0,
    };
    let mut sets = [CapData::default(); 2];
    // SAFETY: the version 3 header and the two halves it describes; pid 0 is
    // the calling thread.
    unsafe {
        if libc::syscall(libc::SYS_capget, &mut header, sets.as_mut_ptr()) != 0 {
            return Err(last_error());
        }
        for half in &mut sets {
            half.effective = 0;
        }
        if libc::syscall(libc::SYS_capset, &mut header, sets.as_ptr()) != 0 {
            return Err(last_error());
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::PermissionsExt;

    use super::*;

    /// Outside the default range, so no node on this machine hands it out.
    const UID: u32 = 1_899_000_611;

    /// As root: the thread opens what the worker could and nothing else, its
    /// status shows the worker's file-system ids, no groups and no
    /// capabilities, and the rest of the process stays root.
    #[test]
    #[expect(clippy::print_stderr, reason = "say why the test is skipped")]
    fn the_thread_has_the_workers_authority_and_nobody_else_does() {
        if !nix::unistd::geteuid().is_root() {
            eprintln!("skipped: only root can take on another user id");
            return;
        }
        let temp = tempfile::tempdir().expect("tempdir");
        std::fs::set_permissions(temp.path(), std::fs::Permissions::from_mode(0o755))
            .expect("chmod");
        let roots = temp.path().join("roots");
        std::fs::write(&roots, b"root's").expect("file");
        std::fs::set_permissions(&roots, std::fs::Permissions::from_mode(0o600)).expect("chmod");
        let theirs = temp.path().join("theirs");
        std::fs::write(&theirs, b"the worker's").expect("file");
        std::os::unix::fs::chown(&theirs, Some(UID), Some(UID)).expect("chown");
        std::fs::set_permissions(&theirs, std::fs::Permissions::from_mode(0o600)).expect("chmod");

        let worker = AsWorker::start(Some(FileOwner::of_uid(UID))).expect("thread");
        let open = |path: &std::path::Path| {
            let path = path.to_owned();
            worker
                .run(move || std::fs::read(path).map_err(|error| error.kind()))
                .expect("ran")
        };
        assert_eq!(open(&roots), Err(std::io::ErrorKind::PermissionDenied));
        assert_eq!(open(&theirs), Ok(b"the worker's".to_vec()));
        let status = worker
            .run(|| std::fs::read_to_string("/proc/thread-self/status").expect("status"))
            .expect("ran");
        let line = |name: &str| {
            status
                .lines()
                .find(|line| line.starts_with(name))
                .map(|line| line[name.len()..].split_whitespace().collect::<Vec<_>>())
                .unwrap_or_default()
        };
        assert_eq!(line("Uid:")[3], UID.to_string(), "{status}");
        assert_eq!(line("Gid:")[3], UID.to_string(), "{status}");
        assert!(line("Groups:").is_empty(), "{status}");
        assert_eq!(line("CapEff:"), ["0000000000000000"], "{status}");
        // This thread is still root.
        assert_eq!(std::fs::read(&roots).expect("read"), b"root's");
        drop(worker);
        // Without an owner, jobs run inline.
        let inline = AsWorker::start(None).expect("inline");
        assert_eq!(
            inline.run(std::thread::current).expect("ran").id(),
            std::thread::current().id()
        );
    }
}
