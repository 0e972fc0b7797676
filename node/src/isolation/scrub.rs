//! Clearing worker user ids of everything their last holders left on the
//! machine, so the next holder, perhaps another team's trial, finds none of it:
//! their processes, their files anywhere under the shared scratch directories
//! (`/tmp`, `/var/tmp`, `/dev/shm`, and `/dev/mqueue` where POSIX message
//! queues are mounted), nested ones included, and their SysV IPC objects
//! (shared memory segments, semaphore sets, message queues).
//!
//! Ids are cleared in batches: one walk of the scratch directories serves every
//! id of the batch, since on a machine whose `/tmp` holds tens of thousands of
//! entries the walk is most of the cost of a trial's start and end. When the
//! batch says since when its ids' holders could have written anything, a
//! directory whose status last changed well before that is only searched for
//! subdirectories (named by the listing's entry types, without a `stat` of each
//! file): any entry made, linked or renamed into a directory changes that
//! directory's status time, which nobody can set back, so such a directory
//! holds nothing those holders made.
//!
//! The scratch directories are walked by descriptor (`openat` with
//! `O_NOFOLLOW | O_DIRECTORY`, `unlinkat`), so no link anyone planted is
//! followed; the walk stays on each directory's own file system, enters only
//! directories one of the ids could search (a file left behind anywhere else is
//! out of its holder's reach, and of the next holder's), and is bounded in depth
//! and in entries visited: a walk cut short is an error, so no id of the batch
//! is marked clean and each next claimant scrubs it again. SysV objects are
//! found in `/proc/sysvipc/*` and removed with `IPC_RMID` once `IPC_STAT`
//! confirms they are still an id's (owner or creator).
//!
//! Not here: when to scrub (`uids`: before an id not known clean is used, and in
//! the background once its last worker is gone).
//!
//! Invariant: nothing that the ids neither own nor created is removed, except
//! what lies inside a directory one of them owns; no link is followed.

use std::collections::BTreeSet;
use std::ffi::{OsStr, OsString};
use std::os::fd::OwnedFd;
use std::path::Path;

use nix::fcntl::{AtFlags, OFlag};
use nix::sys::stat::{FileStat, Mode};
use nix::unistd::UnlinkatFlags;
use tracing::{debug, warn};

/// The shared scratch directories a worker may leave files in.
pub(crate) const SCRATCH_DIRS: [&str; 4] = ["/tmp", "/var/tmp", "/dev/shm", "/dev/mqueue"];

/// How deep a walk of one scratch directory goes.
const MAX_DEPTH: usize = 32;
/// How many entries a scrub visits at most, in all its scratch directories.
const MAX_ENTRIES: usize = 20_000_000;
/// How long before a batch's `since` a directory's status must have last
/// changed for its files to be skipped: room for the file system's coarse
/// clock and for the system clock stepping back a little.
const CLOCK_MARGIN_MS: u64 = 10 * 60 * 1000;

/// What a scrub of the scratch directories found and did.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Swept {
    /// Entries removed (a directory with all it held counts once).
    pub removed: usize,
    /// Entries visited.
    pub visited: usize,
    /// Whether a bound cut the walk short.
    pub cut_short: bool,
}

/// Clears each of `uids` of whatever a holder left: kills every process running
/// as it (for each id that `/proc` shows running anything, a short-lived child
/// that becomes the id and runs `kill -9 -1`, which signals all of the id's
/// processes but itself, repeated while it finds any, so that one forking at
/// that moment is caught too, within a bound), then removes their SysV IPC
/// objects and what they own under [`SCRATCH_DIRS`], in one walk. Blocking. Run
/// as root before an id not known clean is given to an attempt (an earlier
/// holder, say under a node that crashed, may have left some) and after the
/// attempt's last rank is gone. `since`, when known, is the earliest time (Unix
/// milliseconds) any of the ids' holders could have run anything since each id
/// was last scrubbed: it lets the walk skip the files of directories that have
/// not changed since.
pub(crate) fn scrub_uids(uids: &BTreeSet<u32>, since: Option<u64>) -> std::io::Result<()> {
    for uid in running_uids(uids) {
        kill_all_of(uid)?;
    }
    let ipc = remove_ipc_objects(uids);
    let scratch = SCRATCH_DIRS.map(Path::new);
    let swept = remove_leftovers(uids, since, &scratch);
    if swept.removed > 0 || ipc > 0 {
        debug!(
            ids = uids.len(),
            files = swept.removed,
            ipc_objects = ipc,
            "removed what user ids left"
        );
    }
    if swept.cut_short {
        return Err(std::io::Error::other(format!(
            "the scratch directories hold more than {MAX_ENTRIES} entries or nest deeper than {MAX_DEPTH}; what {} user ids left there may remain",
            uids.len()
        )));
    }
    Ok(())
}

/// Which of `uids` some process runs as (its real, effective, saved or file
/// system id), by `/proc/<pid>/status`. A process of an id that is forking
/// shows as its parent, so an id none runs as now has nothing left to kill:
/// only a node hands an id's first process out, and only to an attempt holding
/// it.
fn running_uids(uids: &BTreeSet<u32>) -> BTreeSet<u32> {
    let Ok(processes) = std::fs::read_dir("/proc") else {
        // No `/proc` to look in: try every id.
        return uids.clone();
    };
    let mut running = BTreeSet::new();
    for entry in processes.filter_map(Result::ok) {
        let name = entry.file_name();
        if !name.as_encoded_bytes().iter().all(u8::is_ascii_digit) {
            continue;
        }
        let Ok(status) = std::fs::read_to_string(entry.path().join("status")) else {
            continue;
        };
        running.extend(status_uids(&status).filter(|uid| uids.contains(uid)));
    }
    running
}

/// The ids on the `Uid:` line of a `/proc/<pid>/status` text.
pub(crate) fn status_uids(status: &str) -> impl Iterator<Item = u32> + '_ {
    status
        .lines()
        .find_map(|line| line.strip_prefix("Uid:"))
        .into_iter()
        .flat_map(str::split_whitespace)
        .filter_map(|field| field.parse().ok())
}

/// Kills every process of `uid` (see [`scrub_uids`]).
fn kill_all_of(uid: u32) -> std::io::Result<()> {
    use std::os::unix::process::CommandExt;
    let status = std::process::Command::new("/bin/sh")
        .args([
            "-c",
            "i=0; while kill -9 -1 2>/dev/null && [ $i -lt 100 ]; do i=$((i+1)); done",
        ])
        .uid(uid)
        .gid(uid)
        .env_clear()
        .current_dir("/")
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .status()?;
    if status.success() {
        Ok(())
    } else {
        Err(std::io::Error::other(format!(
            "killing the processes of user id {uid} ended with {status}"
        )))
    }
}

/// Removes what any of `uids` owns anywhere under each of `scratch_dirs`
/// (files, links, whole directories; no link is followed), within the bounds.
/// Called once the ids' processes are gone. With `since` (see [`scrub_uids`]),
/// the files of directories unchanged since are not looked at.
pub(crate) fn remove_leftovers(
    uids: &BTreeSet<u32>,
    since: Option<u64>,
    scratch_dirs: &[&Path],
) -> Swept {
    let mut sweep = Sweep {
        uids,
        unchanged_before: since.map(|since| since.saturating_sub(CLOCK_MARGIN_MS)),
        swept: Swept::default(),
    };
    for dir in scratch_dirs {
        let flags = OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC;
        let Ok(opened) = nix::fcntl::open(*dir, flags, Mode::empty()) else {
            continue;
        };
        let Ok(stat) = nix::sys::stat::fstat(&opened) else {
            continue;
        };
        sweep.walk(&opened, dir, stat.st_dev, 0);
    }
    sweep.swept
}

/// One scrub's walk.
struct Sweep<'a> {
    uids: &'a BTreeSet<u32>,
    /// A directory whose status last changed before this (Unix milliseconds)
    /// holds nothing the ids' holders made; none when that time is not known.
    unchanged_before: Option<u64>,
    swept: Swept,
}

impl Sweep<'_> {
    /// Whether another entry may be visited (counting it).
    fn visit(&mut self) -> bool {
        if self.swept.visited >= MAX_ENTRIES {
            self.swept.cut_short = true;
            return false;
        }
        self.swept.visited += 1;
        true
    }

    /// Whether the directory open as `dir` may hold what the ids' holders
    /// made, by its own status (not its name's: it may have been swapped).
    fn may_hold_new_entries(&self, dir: &OwnedFd) -> bool {
        let Some(unchanged_before) = self.unchanged_before else {
            return true;
        };
        let Ok(stat) = nix::sys::stat::fstat(dir) else {
            return true;
        };
        let changed_ms = u64::try_from(stat.st_ctime)
            .unwrap_or(0)
            .saturating_mul(1000)
            .saturating_add(u64::try_from(stat.st_ctime_nsec).unwrap_or(0) / 1_000_000);
        changed_ms >= unchanged_before
    }

    fn walk(&mut self, dir: &OwnedFd, path: &Path, device: libc::dev_t, depth: usize) {
        if depth > MAX_DEPTH {
            self.swept.cut_short = true;
            return;
        }
        let every_entry = self.may_hold_new_entries(dir);
        for (name, kind) in names(dir) {
            if !self.visit() {
                return;
            }
            if !every_entry && kind.is_some_and(|kind| kind != nix::dir::Type::Directory) {
                // Not a directory, in one nobody changed since: not theirs.
                continue;
            }
            let Ok(stat) =
                nix::sys::stat::fstatat(dir, name.as_os_str(), AtFlags::AT_SYMLINK_NOFOLLOW)
            else {
                continue;
            };
            let is_dir = stat.st_mode & libc::S_IFMT == libc::S_IFDIR;
            if self.uids.contains(&stat.st_uid) {
                match self.remove(dir, &name, is_dir, depth) {
                    Ok(()) => self.swept.removed += 1,
                    Err(error) => {
                        warn!(path = %path.join(&name).display(), %error, "cannot remove what a finished worker left");
                    }
                }
            } else if is_dir && stat.st_dev == device && searchable_by(&stat, self.uids) {
                let flags =
                    OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC;
                if let Ok(sub) = nix::fcntl::openat(dir, name.as_os_str(), flags, Mode::empty()) {
                    self.walk(&sub, &path.join(&name), device, depth + 1);
                }
            }
        }
    }

    /// Removes `name` in `dir`, a directory with everything in it.
    fn remove(
        &mut self,
        dir: &OwnedFd,
        name: &OsStr,
        is_dir: bool,
        depth: usize,
    ) -> std::io::Result<()> {
        if is_dir {
            if depth > MAX_DEPTH {
                self.swept.cut_short = true;
                return Err(std::io::Error::other("nested too deep"));
            }
            let flags = OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC;
            let sub = nix::fcntl::openat(dir, name, flags, Mode::empty())?;
            for (entry, _) in names(&sub) {
                if !self.visit() {
                    return Err(std::io::Error::other("too many entries"));
                }
                let entry_is_dir =
                    nix::sys::stat::fstatat(&sub, entry.as_os_str(), AtFlags::AT_SYMLINK_NOFOLLOW)
                        .is_ok_and(|stat| stat.st_mode & libc::S_IFMT == libc::S_IFDIR);
                self.remove(&sub, &entry, entry_is_dir, depth + 1)?;
            }
        }
        let flags = if is_dir {
            UnlinkatFlags::RemoveDir
        } else {
            UnlinkatFlags::NoRemoveDir
        };
        nix::unistd::unlinkat(dir, name, flags).map_err(std::io::Error::from)
    }
}

/// The names in directory `dir` but `.` and `..`, with their types where the
/// listing gives them (none when it cannot be read).
fn names(dir: &OwnedFd) -> Vec<(OsString, Option<nix::dir::Type>)> {
    use std::os::unix::ffi::OsStrExt;
    let Ok(listed) = dir.try_clone().map(nix::dir::Dir::from_fd) else {
        return Vec::new();
    };
    let Ok(mut listed) = listed else {
        return Vec::new();
    };
    listed
        .iter()
        .filter_map(Result::ok)
        .filter(|entry| ![&b"."[..], b".."].contains(&entry.file_name().to_bytes()))
        .map(|entry| {
            let name = OsStr::from_bytes(entry.file_name().to_bytes()).to_owned();
            (name, entry.file_type())
        })
        .collect()
}

/// Whether one of `uids` (whose group ids are the same numbers) could search
/// the directory `stat` describes, not owning it.
fn searchable_by(stat: &FileStat, uids: &BTreeSet<u32>) -> bool {
    stat.st_mode & 0o001 != 0 || (uids.contains(&stat.st_gid) && stat.st_mode & 0o010 != 0)
}

/// The kinds of SysV IPC object.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum IpcKind {
    SharedMemory,
    Semaphores,
    MessageQueue,
}

impl IpcKind {
    const ALL: [Self; 3] = [Self::SharedMemory, Self::Semaphores, Self::MessageQueue];

    /// The table in `/proc/sysvipc` and its id column.
    fn table(self) -> (&'static str, &'static str) {
        match self {
            Self::SharedMemory => ("/proc/sysvipc/shm", "shmid"),
            Self::Semaphores => ("/proc/sysvipc/sem", "semid"),
            Self::MessageQueue => ("/proc/sysvipc/msg", "msqid"),
        }
    }
}

/// The ids in `table` (the text of a `/proc/sysvipc` file, whose first line
/// names the columns) of the objects one of `uids` owns or created, with that
/// id.
pub(crate) fn ipc_ids_of(table: &str, id_column: &str, uids: &BTreeSet<u32>) -> Vec<(i32, u32)> {
    let mut lines = table.lines();
    let Some(header) = lines.next() else {
        return Vec::new();
    };
    let columns: Vec<&str> = header.split_whitespace().collect();
    let column = |name: &str| columns.iter().position(|column| *column == name);
    let (Some(id), Some(owner), Some(creator)) = (column(id_column), column("uid"), column("cuid"))
    else {
        return Vec::new();
    };
    lines
        .filter_map(|line| {
            let fields: Vec<&str> = line.split_whitespace().collect();
            let number = |index: usize| fields.get(index)?.parse::<u32>().ok();
            let holder = [number(owner), number(creator)]
                .into_iter()
                .flatten()
                .find(|uid| uids.contains(uid))?;
            Some((fields.get(id)?.parse().ok()?, holder))
        })
        .collect()
}

/// Removes every SysV IPC object one of `uids` owns or created; how many went.
fn remove_ipc_objects(uids: &BTreeSet<u32>) -> usize {
    let mut removed = 0;
    for kind in IpcKind::ALL {
        let (table, id_column) = kind.table();
        let Ok(text) = std::fs::read_to_string(table) else {
            continue;
        };
        for (id, uid) in ipc_ids_of(&text, id_column, uids) {
            match remove_ipc(kind, id, uid) {
                Ok(true) => removed += 1,
                Ok(false) => {}
                Err(error) => {
                    warn!(uid, id, ?kind, %error, "cannot remove an IPC object a finished worker left")
                }
            }
        }
    }
    removed
}

/// Removes IPC object `id` of `kind` if it is still `uid`'s (its owner or
/// creator: an id may have been reused since the table was read).
fn remove_ipc(kind: IpcKind, id: i32, uid: u32) -> std::io::Result<bool> {
    let check = |result: libc::c_int| {
        if result == 0 {
            Ok(())
        } else {
            Err(std::io::Error::last_os_error())
        }
    };
    let ours = |perm: &libc::ipc_perm| perm.uid == uid || perm.cuid == uid;
    // SAFETY: each call gets a zeroed buffer of the type it fills (IPC_STAT) or
    // none (IPC_RMID); semctl's fourth argument is the union's pointer member.
    unsafe {
        match kind {
            IpcKind::SharedMemory => {
                let mut stat: libc::shmid_ds = std::mem::zeroed();
                check(libc::shmctl(id, libc::IPC_STAT, &mut stat))?;
                if !ours(&stat.shm_perm) {
                    return Ok(false);
                }
                check(libc::shmctl(id, libc::IPC_RMID, std::ptr::null_mut()))?;
            }
            IpcKind::Semaphores => {
                let mut stat: libc::semid_ds = std::mem::zeroed();
                check(libc::semctl(
                    id,
                    0,
                    libc::IPC_STAT,
                    &mut stat as *mut libc::semid_ds,
                ))?;
                if !ours(&stat.sem_perm) {
                    return Ok(false);
                }
                check(libc::semctl(id, 0, libc::IPC_RMID))?;
            }
            IpcKind::MessageQueue => {
                let mut stat: libc::msqid_ds = std::mem::zeroed();
                check(libc::msgctl(id, libc::IPC_STAT, &mut stat))?;
                if !ours(&stat.msg_perm) {
                    return Ok(false);
                }
                check(libc::msgctl(id, libc::IPC_RMID, std::ptr::null_mut()))?;
            }
        }
    }
    Ok(true)
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::{MetadataExt, PermissionsExt};

    use super::*;

    #[test]
    fn ipc_tables_give_the_ids_an_id_owns_or_created() {
        let shm = "       key      shmid perms                  size  cpid  lpid nattch   uid   gid  cuid  cgid      atime      dtime      ctime                   rss                  swap\n\
                   \x20        0      32768   600                  4096  1234     0      0  1900000000  1900000000  1900000000  1900000000          0          0 1700000000                     0                     0\n\
                   \x20 12345678      32769   644                  4096  1235     0      0     0     0  1900000000     0          0          0 1700000000                     0                     0\n\
                   \x20        0      32770   600                  4096  1236     0      0  1000  1000  1000  1000          0          0 1700000000                     0                     0\n";
        let ids = |uids: &[u32]| BTreeSet::from_iter(uids.iter().copied());
        assert_eq!(
            ipc_ids_of(shm, "shmid", &ids(&[1_900_000_000])),
            [(32768, 1_900_000_000), (32769, 1_900_000_000)]
        );
        assert_eq!(ipc_ids_of(shm, "shmid", &ids(&[1000])), [(32770, 1000)]);
        assert_eq!(
            ipc_ids_of(shm, "shmid", &ids(&[1000, 1_900_000_000])).len(),
            3,
            "a batch finds every id's"
        );
        assert!(ipc_ids_of(shm, "shmid", &ids(&[7])).is_empty());
        let sem = "       key      semid perms      nsems   uid   gid  cuid  cgid      otime      ctime\n\
                   \x20        0          3   600          1  1900000005  1900000005  1900000005  1900000005          0 1700000000\n";
        assert_eq!(
            ipc_ids_of(sem, "semid", &ids(&[1_900_000_005])),
            [(3, 1_900_000_005)]
        );
        let msg = "       key      msqid perms      cbytes       qnum lspid lrpid   uid   gid  cuid  cgid      stime      rtime      ctime\n\
                   \x20        0          0   600           0          0     0     0    42    42    42    42          0          0 1700000000\n";
        assert_eq!(ipc_ids_of(msg, "msqid", &ids(&[42])), [(0, 42)]);
        // A table with no header, or none of the columns, yields nothing.
        assert!(ipc_ids_of("", "shmid", &ids(&[0])).is_empty());
        assert!(ipc_ids_of("a b c\n1 2 3\n", "shmid", &ids(&[1])).is_empty());
        assert!(ipc_ids_of("key shmid uid cuid\nx garbage 5 5\n", "shmid", &ids(&[5])).is_empty());
    }

    #[test]
    fn a_status_gives_the_ids_a_process_runs_as() {
        let status = "Name:\tsleep\nUmask:\t0022\nState:\tS (sleeping)\nUid:\t1900000001\t1900000001\t0\t1900000001\nGid:\t5\t5\t5\t5\n";
        assert_eq!(
            BTreeSet::from_iter(status_uids(status)),
            BTreeSet::from([0, 1_900_000_001])
        );
        assert_eq!(status_uids("Name:\tx\nGid:\t1\t1\t1\t1\n").count(), 0);
        let own = std::fs::read_to_string("/proc/self/status").expect("own status");
        assert_eq!(
            status_uids(&own).next(),
            Some(nix::unistd::getuid().as_raw()),
            "the real id comes first"
        );
    }

    #[test]
    fn leftovers_of_an_id_are_removed_at_any_depth_and_nothing_else() {
        let temp = tempfile::tempdir().expect("tempdir");
        let scratch = temp.path().join("tmp");
        std::fs::create_dir_all(scratch.join("dir/sub")).expect("dirs");
        std::fs::write(scratch.join("file"), b"x").expect("file");
        std::fs::write(scratch.join("dir/sub/deep"), b"x").expect("file");
        let elsewhere = temp.path().join("elsewhere");
        std::fs::create_dir(&elsewhere).expect("dir");
        std::fs::write(elsewhere.join("kept"), b"x").expect("file");
        std::os::unix::fs::symlink(&elsewhere, scratch.join("link")).expect("symlink");
        let me = std::fs::metadata(&scratch).expect("metadata").uid();
        let other = me.wrapping_add(1);
        assert_eq!(
            remove_leftovers(&BTreeSet::from([other]), None, &[&scratch]).removed,
            0,
            "another id's"
        );
        let swept = remove_leftovers(
            &BTreeSet::from([other, me]),
            None,
            &[&scratch, Path::new("/nonexistent")],
        );
        assert_eq!(swept.removed, 3, "{swept:?}");
        assert!(!swept.cut_short);
        assert!(std::fs::read_dir(&scratch).expect("dir").next().is_none());
        assert!(
            elsewhere.join("kept").exists(),
            "a link is removed, not followed"
        );
    }

    /// As root: a directory unchanged since well before the batch's holders
    /// could write is searched for subdirectories only; one changed since is
    /// searched whole, at any depth.
    #[test]
    #[expect(clippy::print_stderr, reason = "say why the test is skipped")]
    fn files_of_directories_unchanged_since_the_holders_began_are_not_looked_at() {
        if !nix::unistd::geteuid().is_root() {
            eprintln!("skipped: only root can make files of other ids");
            return;
        }
        let uid = 1_899_000_733;
        let temp = tempfile::tempdir().expect("tempdir");
        let scratch = temp.path().join("tmp");
        let nested = scratch.join("shared/nested");
        std::fs::create_dir_all(&nested).expect("dirs");
        for (dir, name) in [(scratch.join("shared"), "top"), (nested.clone(), "deep")] {
            std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o777)).expect("chmod");
            std::fs::write(dir.join(name), b"x").expect("file");
            std::os::unix::fs::chown(dir.join(name), Some(uid), Some(uid)).expect("chown");
        }
        let ids = BTreeSet::from([uid]);
        let changed_ms = |path: &Path| {
            let changed = std::fs::metadata(path).expect("metadata");
            u64::try_from(changed.ctime()).expect("after 1970") * 1000
        };
        // Every directory changed before the holders began (by more than the
        // margin): nothing in them is theirs, so their files are not looked at.
        let later = changed_ms(&nested) + 2 * CLOCK_MARGIN_MS + 1000;
        let swept = remove_leftovers(&ids, Some(later), &[&scratch]);
        assert_eq!(swept.removed, 0, "{swept:?}");
        assert!(nested.join("deep").exists());
        // The holders began before these changed: all of it is looked at.
        let earlier = changed_ms(&scratch).saturating_sub(1000);
        let swept = remove_leftovers(&ids, Some(earlier), &[&scratch]);
        assert_eq!(swept.removed, 2, "{swept:?}");
        assert!(!scratch.join("shared/top").exists());
        assert!(!nested.join("deep").exists());
    }

    /// As root: an id's files nested in directories of others are found, in
    /// directories it could enter only; others' files stay.
    #[test]
    #[expect(clippy::print_stderr, reason = "say why the test is skipped")]
    fn nested_leftovers_in_others_directories_are_found() {
        if !nix::unistd::geteuid().is_root() {
            eprintln!("skipped: only root can make files of other ids");
            return;
        }
        let uid = 1_899_000_621;
        let temp = tempfile::tempdir().expect("tempdir");
        let scratch = temp.path().join("tmp");
        let open = scratch.join("shared/open");
        let closed = scratch.join("closed");
        std::fs::create_dir_all(&open).expect("dirs");
        std::fs::create_dir_all(&closed).expect("dirs");
        std::fs::set_permissions(&open, std::fs::Permissions::from_mode(0o777)).expect("chmod");
        std::fs::set_permissions(&closed, std::fs::Permissions::from_mode(0o700)).expect("chmod");
        let plant = |path: &Path| {
            std::fs::write(path, b"x").expect("file");
            std::os::unix::fs::chown(path, Some(uid), Some(uid)).expect("chown");
        };
        plant(&open.join("secret"));
        plant(&closed.join("unreachable"));
        std::fs::write(open.join("roots"), b"x").expect("file");
        let swept = remove_leftovers(&BTreeSet::from([uid]), None, &[&scratch]);
        assert_eq!(swept.removed, 1, "{swept:?}");
        assert!(!open.join("secret").exists());
        assert!(open.join("roots").exists(), "root's file stays");
        assert!(
            closed.join("unreachable").exists(),
            "out of the id's reach, and so of its next holder's"
        );
    }

    /// As root: a scrub kills what runs as the id (however it was started),
    /// removes what the id owns in the scratch directories and its SysV shared
    /// memory, and nothing else.
    #[test]
    #[expect(clippy::print_stderr, reason = "say why the test is skipped")]
    fn a_scrub_kills_what_runs_as_the_id_and_removes_its_files_and_segments() {
        use std::os::unix::process::{CommandExt, ExitStatusExt};
        if !nix::unistd::geteuid().is_root() {
            eprintln!("skipped: only root can run processes as another id");
            return;
        }
        // Outside the default range, so no node on this machine hands it out.
        let uid = 1_899_000_517;
        let spawn = || {
            std::process::Command::new("/bin/sleep")
                .arg("600")
                .uid(uid)
                .gid(uid)
                .process_group(0)
                .spawn()
                .expect("sleep as the id")
        };
        let mut running = [spawn(), spawn()];
        let file = Path::new("/dev/shm").join(format!("xp-scrub-test-{}", std::process::id()));
        std::fs::write(&file, b"x").expect("file");
        std::os::unix::fs::chown(&file, Some(uid), Some(uid)).expect("chown");
        let kept = Path::new("/dev/shm").join(format!("xp-scrub-kept-{}", std::process::id()));
        std::fs::write(&kept, b"x").expect("file");
        let segment = shared_memory_of(uid);
        scrub_uids(&BTreeSet::from([uid, uid + 1]), None).expect("scrubbed");
        for child in &mut running {
            let status = child.wait().expect("reaped");
            assert_eq!(status.signal(), Some(libc::SIGKILL), "{status}");
        }
        assert!(!file.exists(), "the id's file went");
        assert!(kept.exists(), "root's file stays");
        std::fs::remove_file(&kept).expect("cleanup");
        // SAFETY: IPC_STAT into a zeroed buffer of its type.
        let gone = unsafe {
            let mut stat: libc::shmid_ds = std::mem::zeroed();
            libc::shmctl(segment, libc::IPC_STAT, &mut stat) != 0
        };
        assert!(gone, "the id's segment went");
        // Nothing left to kill is no error.
        scrub_uids(&BTreeSet::from([uid]), None).expect("scrubbed again");
    }

    /// A private SysV shared-memory segment made for `uid`.
    fn shared_memory_of(uid: u32) -> i32 {
        // SAFETY: plain calls on integers and a zeroed buffer of the type
        // IPC_STAT and IPC_SET use.
        unsafe {
            let id = libc::shmget(libc::IPC_PRIVATE, 4096, libc::IPC_CREAT | 0o600);
            assert!(id >= 0, "shmget: {}", std::io::Error::last_os_error());
            let mut stat: libc::shmid_ds = std::mem::zeroed();
            assert_eq!(libc::shmctl(id, libc::IPC_STAT, &mut stat), 0);
            stat.shm_perm.uid = uid;
            stat.shm_perm.gid = uid;
            assert_eq!(libc::shmctl(id, libc::IPC_SET, &mut stat), 0);
            id
        }
    }
}
