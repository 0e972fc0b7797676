//! User ids for workers: the configured range (`--worker-uids`), the table of
//! which live trial attempt holds which id, and the machine-wide claim that keeps
//! two nodes on one machine from handing out the same id.
//!
//! All ranks of one trial attempt on a node share one id (so they can open each
//! other's shared-memory rings and files, which are 0600), each holding a share
//! ([`UidLease`]). The first rank claims a fresh id; one not known clean is
//! scrubbed (everything running as it killed, what it owns in `/tmp`,
//! `/var/tmp`, `/dev/shm` removed: an earlier holder may have left them, for
//! example under a node that crashed) before any rank runs as it, and later
//! ranks of the attempt wait for that scrub and join. A worker's supervisor
//! gives its share back only after the worker and everything left in its cgroup
//! are gone; the last share given back hands the id to the pool's sweeper,
//! which scrubs it and only then frees it. The sweeper (`sweeper`) scrubs in
//! batches, one walk of the scratch directories for every id that waits, and
//! scrubs ahead of the cursor the ids not known clean, so that neither a
//! trial's start nor its end report waits for a walk. Ids are handed out round
//! the range from where the last one was taken, so a returned id is the last to
//! be used again. The cursor is kept in the node's data directory
//! ([`CURSOR_FILE`]), so a restarted node goes on round the range where it
//! stopped instead of handing the first id out again.
//!
//! Other nodes on the same machine use the same default range, so an id is also
//! claimed machine-wide: an exclusive `flock` on `/run/xp-node/uids/<uid>`, held
//! until the id has returned. The kernel drops the lock when the node process
//! dies, so a crashed node leaves no stale claim. The file says `clean` while its
//! id is free after a return whose scrub worked, and is emptied before the id is
//! used; only an id whose file says `clean` skips the scrub before use, so what
//! the workers of a crashed node left is scrubbed by the next claimant, and by
//! the next node to start on the machine, in the background.
//!
//! Invariant: no two live attempts, on this node or another node of this machine
//! that shares the lock directory, hold the same id, and an id is handed to a new
//! attempt only after its last holder's processes and scratch files are gone; an
//! id that `/etc/passwd` names is never handed out.

mod sweeper;

use std::collections::{BTreeMap, BTreeSet};
use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, OnceLock, PoisonError};

use nix::fcntl::{Flock, FlockArg};
use xp_runtime::clock::{Clock, SystemClock, UnixMillis};
use xp_runtime::ids::{TrialId, WorkerKey};

/// The range used when the node runs as root and `--worker-uids` is not given.
/// systemd's allocation (`UIDS-GIDS.md`) leaves 1879048192-2147483647 unused:
/// above regular users (1000-60000), dynamic service users (61184-65519),
/// `nobody` (65534), subordinate ids (`/etc/subuid`, usually from 100000) and
/// nspawn containers (524288-1879048191), and below 2^31, which some tools
/// mishandle as negative.
pub(crate) const DEFAULT_RANGE: UidRange = UidRange {
    start: 1_900_000_000,
    end: 1_900_009_999,
};

/// The file in the node's data directory that keeps where the next search
/// for a free id starts.
pub(crate) const CURSOR_FILE: &str = "uid-cursor";

/// The cursor kept in a cursor file's `text`, when it is an id of `range`.
pub(crate) fn parse_cursor(text: &str, range: UidRange) -> Option<u32> {
    let text = text.trim();
    if text.is_empty() || !text.bytes().all(|byte| byte.is_ascii_digit()) {
        return None;
    }
    text.parse().ok().filter(|uid| range.contains(*uid))
}

/// Where the machine-wide claims live.
pub(crate) const LOCK_DIR: &str = "/run/xp-node/uids";

/// What a claim file holds while its id is free and was scrubbed when returned;
/// empty (or anything else) means the id must be scrubbed before use.
const CLEAN: &[u8] = b"clean\n";

/// An inclusive range of user ids (and the same group ids).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct UidRange {
    /// The first id.
    pub start: u32,
    /// The last id.
    pub end: u32,
}

impl UidRange {
    /// How many ids it holds.
    pub fn len(self) -> u64 {
        u64::from(self.end) - u64::from(self.start) + 1
    }

    /// Never true: a range holds at least one id.
    pub fn is_empty(self) -> bool {
        false
    }

    /// Whether `uid` is in it.
    pub fn contains(self, uid: u32) -> bool {
        (self.start..=self.end).contains(&uid)
    }
}

impl std::fmt::Display for UidRange {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}-{}", self.start, self.end)
    }
}

/// What `--worker-uids` asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum WorkerUids {
    /// Not given: the default range, 1900000000-1900009999, when the node runs
    /// as root, else none.
    #[default]
    Auto,
    /// `none`: workers run under the node's own user id.
    Off,
    /// `START-END`.
    Range(UidRange),
}

/// Why a `--worker-uids` value is refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum UidRangeError {
    /// Not `none` and not `START-END`.
    #[error("{0:?} is neither `none` nor a range START-END such as 1900000000-1900009999")]
    Syntax(String),
    /// An end is not a number that fits a user id.
    #[error("{0:?} is not a user id (a whole number below 4294967295)")]
    NotANumber(String),
    /// The range is backwards.
    #[error("the range {start}-{end} ends before it starts")]
    Backwards {
        /// Its start.
        start: u32,
        /// Its end.
        end: u32,
    },
    /// The range holds an id that must never be a worker's.
    #[error("the range {start}-{end} holds {uid} ({what}), which a worker must never run as")]
    Reserved {
        /// Its start.
        start: u32,
        /// Its end.
        end: u32,
        /// The reserved id.
        uid: u32,
        /// What that id is.
        what: &'static str,
    },
}

/// Ids that are never a worker's: root, `nobody`, and the two values that mean
/// "no id" (-1 as a 16- and a 32-bit number).
const RESERVED: [(u32, &str); 4] = [
    (0, "root"),
    (65_534, "nobody"),
    (65_535, "-1 to 16-bit interfaces"),
    (u32::MAX, "-1, no id at all"),
];

impl std::str::FromStr for WorkerUids {
    type Err = UidRangeError;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        let text = text.trim();
        if text.eq_ignore_ascii_case("none") {
            return Ok(Self::Off);
        }
        let (start, end) = text
            .split_once('-')
            .ok_or_else(|| UidRangeError::Syntax(text.to_owned()))?;
        let number = |part: &str| {
            let part = part.trim();
            // Digits only: `+5` or ` 5` would parse, and a sign means a typo here.
            if part.is_empty() || !part.bytes().all(|byte| byte.is_ascii_digit()) {
                return Err(UidRangeError::NotANumber(part.to_owned()));
            }
            part.parse::<u32>()
                .map_err(|_| UidRangeError::NotANumber(part.to_owned()))
        };
        let (start, end) = (number(start)?, number(end)?);
        if end < start {
            return Err(UidRangeError::Backwards { start, end });
        }
        let range = UidRange { start, end };
        if let Some((uid, what)) = RESERVED.iter().find(|(uid, _)| range.contains(*uid)) {
            return Err(UidRangeError::Reserved {
                start,
                end,
                uid: *uid,
                what,
            });
        }
        Ok(Self::Range(range))
    }
}

/// The ranks of one trial attempt on a node, which share a user id.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub(crate) struct AttemptKey {
    /// The trial.
    pub trial: TrialId,
    /// Its attempt.
    pub attempt: u32,
}

impl AttemptKey {
    /// The attempt worker `key` belongs to.
    pub(crate) fn of(key: WorkerKey) -> Self {
        Self {
            trial: key.trial,
            attempt: key.attempt,
        }
    }
}

impl std::fmt::Display for AttemptKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/a{}", self.trial, self.attempt)
    }
}

/// Who holds an id: the live ranks of one attempt, or nobody while the id is
/// being returned (its last rank gone, its processes and files not yet).
#[derive(Debug)]
struct Holder {
    attempt: AttemptKey,
    ranks: BTreeSet<u32>,
    returning: bool,
}

/// An id as [`UidTable::claim`] hands it out.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Claimed {
    /// The id.
    pub uid: u32,
    /// Whether the id was free (a fresh lease, to be scrubbed before use) rather
    /// than already held by another rank of the same attempt.
    pub fresh: bool,
}

/// What [`UidTable::leave`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Left {
    /// Other ranks of the attempt still hold the id.
    Shared,
    /// That was the attempt's last rank: the id is now returning; no rank gets
    /// it until [`UidTable::release`].
    Last,
    /// The worker held no share of the id.
    NotHeld,
}

/// Which live attempt holds which id; pure, so the rules are tested without
/// root. Ranks of one attempt share an id; no two attempts (of one trial or of
/// two) hold the same id at once, nor does an attempt get an id still returning.
#[derive(Debug)]
pub(crate) struct UidTable {
    range: UidRange,
    /// Where the next search starts.
    cursor: u32,
    held: BTreeMap<u32, Holder>,
    /// The id each live attempt holds (none while its id is returning).
    by_attempt: BTreeMap<AttemptKey, u32>,
}

impl UidTable {
    /// An empty table over `range`.
    pub(crate) fn new(range: UidRange) -> Self {
        Self {
            range,
            cursor: range.start,
            held: BTreeMap::new(),
            by_attempt: BTreeMap::new(),
        }
    }

    /// An id for worker `key`: the one its attempt's live ranks hold, else the
    /// first id from the cursor round the range that nobody holds (nor is
    /// returning) and `usable` accepts (it may claim it elsewhere too); `None`
    /// when every id is taken.
    pub(crate) fn claim(
        &mut self,
        key: WorkerKey,
        mut usable: impl FnMut(u32) -> bool,
    ) -> Option<Claimed> {
        let attempt = AttemptKey::of(key);
        if let Some(&uid) = self.by_attempt.get(&attempt)
            && let Some(holder) = self.held.get_mut(&uid)
        {
            holder.ranks.insert(key.rank);
            return Some(Claimed { uid, fresh: false });
        }
        let len = self.range.len();
        for step in 0..len {
            let offset = (u64::from(self.cursor - self.range.start) + step) % len;
            let uid = self.range.start + offset as u32;
            if self.held.contains_key(&uid) || !usable(uid) {
                continue;
            }
            self.held.insert(
                uid,
                Holder {
                    attempt,
                    ranks: BTreeSet::from([key.rank]),
                    returning: false,
                },
            );
            self.by_attempt.insert(attempt, uid);
            self.cursor = if uid == self.range.end {
                self.range.start
            } else {
                uid + 1
            };
            return Some(Claimed { uid, fresh: true });
        }
        None
    }

    /// Worker `key` gives up its share of `uid`. When it was the attempt's last
    /// rank the id starts returning: held by nobody, handed to nobody (not even a
    /// late rank of the same attempt, which gets a fresh id) until
    /// [`UidTable::release`].
    pub(crate) fn leave(&mut self, uid: u32, key: WorkerKey) -> Left {
        let Some(holder) = self.held.get_mut(&uid) else {
            return Left::NotHeld;
        };
        if holder.returning
            || holder.attempt != AttemptKey::of(key)
            || !holder.ranks.remove(&key.rank)
        {
            return Left::NotHeld;
        }
        if !holder.ranks.is_empty() {
            return Left::Shared;
        }
        holder.returning = true;
        self.by_attempt.remove(&holder.attempt);
        Left::Last
    }

    /// Frees `uid` once it has returned (its last rank left); false, and nothing
    /// changes, while ranks still hold it.
    pub(crate) fn release(&mut self, uid: u32) -> bool {
        if self.held.get(&uid).is_some_and(|holder| holder.returning) {
            self.held.remove(&uid);
            true
        } else {
            false
        }
    }

    /// Up to `count` ids that nobody holds, in the order [`UidTable::claim`]
    /// would try them from the cursor.
    pub(crate) fn upcoming(&self, count: usize) -> Vec<u32> {
        let len = self.range.len();
        (0..len)
            .map(|step| {
                let offset = (u64::from(self.cursor - self.range.start) + step) % len;
                self.range.start + offset as u32
            })
            .filter(|uid| !self.held.contains_key(uid))
            .take(count)
            .collect()
    }

    /// How many ids are returning (their last rank gone, not yet freed).
    pub(crate) fn returning(&self) -> usize {
        self.held.values().filter(|holder| holder.returning).count()
    }

    /// Whether an attempt holds `uid` (or it is returning).
    pub(crate) fn is_held(&self, uid: u32) -> bool {
        self.held.contains_key(&uid)
    }

    /// Where the next search for a free id starts.
    pub(crate) fn cursor(&self) -> u32 {
        self.cursor
    }

    /// Starts the next search at `cursor` (an id of the range; anything else
    /// is ignored).
    pub(crate) fn set_cursor(&mut self, cursor: u32) {
        if self.range.contains(cursor) {
            self.cursor = cursor;
        }
    }

    #[cfg(test)]
    /// The attempt holding `uid` (also while it is returning) and how many of
    /// its ranks still do.
    pub(crate) fn holder(&self, uid: u32) -> Option<(AttemptKey, usize)> {
        self.held
            .get(&uid)
            .map(|holder| (holder.attempt, holder.ranks.len()))
    }

    #[cfg(test)]
    /// How many ids are held (returning ones included).
    pub(crate) fn held(&self) -> usize {
        self.held.len()
    }
}

/// Why no id could be had.
#[derive(Debug, thiserror::Error)]
pub(crate) enum UidClaimError {
    /// Every id of the range is held (here, by another node, or by an account).
    #[error("every user id of the range {0} is in use; widen --worker-uids")]
    Exhausted(UidRange),
    /// What an earlier holder of the id may have left could not be removed.
    #[error("cannot clear user id {uid} of what an earlier holder left: {why}")]
    Scrub {
        /// The id.
        uid: u32,
        /// What failed.
        why: String,
    },
}

/// Clears ids of their earlier holders, all in one go: kills everything running
/// as them and removes what they left in shared places; given since when
/// (Unix milliseconds) their holders could have written anything, when that is
/// known. Blocking; run before an id not known clean is used and after its last
/// rank is gone.
pub(crate) type Scrub =
    Arc<dyn Fn(&BTreeSet<u32>, Option<UnixMillis>) -> std::io::Result<()> + Send + Sync>;

/// The node's ids: its table, the machine-wide claims and the shares of them.
pub(crate) struct UidPool {
    range: UidRange,
    lock_dir: PathBuf,
    /// Where the cursor is kept across restarts, if anywhere.
    cursor_file: Option<PathBuf>,
    /// Ids that accounts in `/etc/passwd` use.
    accounts: BTreeSet<u32>,
    scrub: Scrub,
    state: Mutex<PoolState>,
    /// Where ids to scrub go, once the sweeper has started.
    sweeper: OnceLock<sweeper::Jobs>,
}

impl std::fmt::Debug for UidPool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("UidPool")
            .field("range", &self.range)
            .field("lock_dir", &self.lock_dir)
            .finish_non_exhaustive()
    }
}

#[derive(Debug)]
struct PoolState {
    table: UidTable,
    /// The share every rank of an id's attempt holds, by id.
    shares: BTreeMap<u32, Arc<SharedUid>>,
}

/// One id as the ranks of its attempt share it.
#[derive(Debug)]
struct SharedUid {
    uid: u32,
    /// When it was claimed: its holders ran nothing as it before.
    claimed_at: UnixMillis,
    /// Set once the id has been scrubbed for its attempt (the error, if that
    /// failed); the first rank asks for it, the others wait for it.
    scrubbed: tokio::sync::OnceCell<Result<(), String>>,
    /// The machine-wide claim, dropped when the id has returned.
    lock: Mutex<Option<Flock<File>>>,
}

impl UidPool {
    /// A pool over `range` whose machine-wide claims live in `lock_dir` (made
    /// 0700 if missing), never handing out an id in `accounts`, clearing ids
    /// with `scrub`.
    pub(crate) fn new(
        range: UidRange,
        lock_dir: &Path,
        accounts: BTreeSet<u32>,
        scrub: Scrub,
    ) -> std::io::Result<Self> {
        use std::os::unix::fs::DirBuilderExt;
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(lock_dir)?;
        Ok(Self {
            range,
            lock_dir: lock_dir.to_owned(),
            cursor_file: None,
            accounts,
            scrub,
            state: Mutex::new(PoolState {
                table: UidTable::new(range),
                shares: BTreeMap::new(),
            }),
            sweeper: OnceLock::new(),
        })
    }

    /// The same, keeping its cursor in `path` across restarts: it starts
    /// where the cursor there says (from the range's start when the file is
    /// missing or holds no id of the range).
    pub(crate) fn with_cursor_file(mut self, path: PathBuf) -> Self {
        match std::fs::read_to_string(&path) {
            Ok(text) => match parse_cursor(&text, self.range) {
                Some(cursor) => self.state().table.set_cursor(cursor),
                None => {
                    tracing::warn!(path = %path.display(), range = %self.range, "the user id cursor names no id of the range; starting at its first");
                }
            },
            Err(error) if error.kind() == std::io::ErrorKind::NotFound => {}
            Err(error) => {
                tracing::warn!(path = %path.display(), %error, "cannot read the user id cursor; starting at the range's first id");
            }
        }
        self.cursor_file = Some(path);
        self
    }

    /// Keeps `cursor` in the cursor file (a new file renamed over the old, so
    /// a crash leaves one or the other). A failure is logged: ids stay apart
    /// on this run either way.
    fn keep_cursor(&self, cursor: u32) {
        let Some(path) = &self.cursor_file else {
            return;
        };
        let temporary = path.with_extension("tmp");
        let written = std::fs::write(&temporary, format!("{cursor}\n"))
            .and_then(|()| std::fs::rename(&temporary, path));
        if let Err(error) = written {
            tracing::warn!(path = %path.display(), %error, "cannot keep the user id cursor; a restart would hand out recently used ids first");
        }
    }

    fn state(&self) -> std::sync::MutexGuard<'_, PoolState> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// A share of the id of `key`'s attempt, claiming a fresh one (here and
    /// machine-wide) when no other rank of the attempt holds one. Await
    /// [`UidLease::ready`] before running anything as it.
    pub(crate) fn claim(self: &Arc<Self>, key: WorkerKey) -> Result<UidLease, UidClaimError> {
        let mut state = self.state();
        let mut lock = None;
        let claimed = state
            .table
            .claim(key, |uid| {
                if self.accounts.contains(&uid) {
                    return false;
                }
                lock = self.lock_machine_wide(uid);
                lock.is_some()
            })
            .ok_or(UidClaimError::Exhausted(self.range))?;
        if claimed.fresh {
            self.keep_cursor(state.table.cursor());
        }
        let shared = if claimed.fresh {
            let (lock, clean) = lock.map_or((None, false), |(lock, clean)| (Some(lock), clean));
            // An id its last holder returned scrubbed needs no scrub now.
            let scrubbed = tokio::sync::OnceCell::new_with(clean.then_some(Ok(())));
            let shared = Arc::new(SharedUid {
                uid: claimed.uid,
                claimed_at: SystemClock.now(),
                scrubbed,
                lock: Mutex::new(lock),
            });
            state.shares.insert(claimed.uid, shared.clone());
            shared
        } else {
            state
                .shares
                .get(&claimed.uid)
                .cloned()
                .expect("every id held in the table has its share")
        };
        drop(state);
        if claimed.fresh {
            // Keeps the ids the next claims will take clean ahead of them; no
            // sweeper outside a runtime, where the next claim scrubs its own.
            let _ = self.sweep(sweeper::Job::TopUp);
        }
        Ok(UidLease {
            key,
            shared,
            pool: self.clone(),
        })
    }

    /// A share as [`UidPool::claim`] gives it, except that when every id is
    /// taken but some are returning (a small range, its trials just ended), it
    /// waits for the sweeper to free them and tries once more, rather than
    /// refusing the launch.
    pub(crate) async fn claim_soon(
        self: &Arc<Self>,
        key: WorkerKey,
    ) -> Result<UidLease, UidClaimError> {
        match self.claim(key) {
            Err(UidClaimError::Exhausted(_)) if self.state().table.returning() > 0 => {
                self.swept().await;
                self.claim(key)
            }
            claimed => claimed,
        }
    }

    /// Waits until the sweeper has done every job sent so far.
    pub(crate) async fn swept(self: &Arc<Self>) {
        let (done, swept) = tokio::sync::oneshot::channel();
        if self.sweep(sweeper::Job::Swept(done)).is_ok() {
            let _ = swept.await;
        }
    }

    /// An exclusive lock on `uid`'s claim file, unless another holds it, and
    /// whether the file said the id was returned scrubbed ([`CLEAN`]). The mark
    /// is cleared before the id is used, so a node that dies holding the id
    /// leaves it unmarked and the next claimant scrubs it.
    fn lock_machine_wide(&self, uid: u32) -> Option<(Flock<File>, bool)> {
        let (lock, clean) = self.open_claim_file(uid)?;
        if clean && let Err(error) = lock.set_len(0) {
            // The mark would outlive this use of the id.
            tracing::warn!(uid, %error, "cannot clear a user id's claim file; skipping the id");
            return None;
        }
        Some((lock, clean))
    }

    /// An exclusive lock on `uid`'s claim file, unless another holds it, and
    /// whether the file says the id is clean; the file is left as it was.
    fn open_claim_file(&self, uid: u32) -> Option<(Flock<File>, bool)> {
        use std::os::unix::fs::{FileExt, OpenOptionsExt};
        let file = std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .read(true)
            .write(true)
            .mode(0o600)
            .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
            .open(self.lock_dir.join(uid.to_string()));
        let file = match file {
            Ok(file) => file,
            Err(error) => {
                tracing::warn!(uid, %error, dir = %self.lock_dir.display(), "cannot open a user id's claim file; skipping the id");
                return None;
            }
        };
        let lock = Flock::lock(file, FlockArg::LockExclusiveNonblock).ok()?;
        let mut mark = [0u8; CLEAN.len() + 1];
        let clean = lock
            .read_at(&mut mark, 0)
            .is_ok_and(|len| mark[..len] == *CLEAN);
        Some((lock, clean))
    }

    /// Hands `job` to the pool's sweeper, starting it on the current runtime
    /// the first time; the job back when there is no runtime to run it on.
    fn sweep(self: &Arc<Self>, job: sweeper::Job) -> Result<(), sweeper::Job> {
        let jobs = match self.sweeper.get() {
            Some(jobs) => jobs,
            None if tokio::runtime::Handle::try_current().is_ok() => self
                .sweeper
                .get_or_init(|| sweeper::start(Arc::downgrade(self))),
            None => return Err(job),
        };
        jobs.send(job).map_err(|refused| refused.0)
    }

    /// Has the sweeper scrub, in the background, every id of the range that an
    /// earlier run of a node on this machine left not marked clean (a node
    /// stopped or killed before its returns were scrubbed). Call once, when the
    /// node starts, on its runtime.
    pub(crate) fn sweep_leftovers(self: &Arc<Self>) {
        let _ = self.sweep(sweeper::Job::Leftovers);
    }

    /// `key` gives up its share; the last share given back sends the id to the
    /// sweeper, or, with no runtime to sweep on, returns it here (blocking).
    fn give_back(self: &Arc<Self>, key: WorkerKey, shared: &SharedUid) {
        let last = {
            let mut state = self.state();
            match state.table.leave(shared.uid, key) {
                Left::Last => state.shares.remove(&shared.uid),
                Left::Shared | Left::NotHeld => None,
            }
        };
        let Some(shared) = last else {
            return;
        };
        if let Err(sweeper::Job::Returned(shared)) = self.sweep(sweeper::Job::Returned(shared)) {
            let scrubbed = (self.scrub)(&BTreeSet::from([shared.uid]), Some(shared.claimed_at));
            if let Err(error) = &scrubbed {
                tracing::warn!(uid = shared.uid, %error, "cannot clear a returned user id of what its workers left; it is cleared again before its next use");
            }
            self.finish_return(&shared, scrubbed);
        }
    }

    /// Ends the return of an id whose last rank is gone and whose scrub ended
    /// as `scrubbed`: marks its claim file [`CLEAN`] when the scrub worked, then
    /// drops its machine-wide claim and frees it.
    fn finish_return(&self, shared: &SharedUid, scrubbed: std::io::Result<()>) {
        use std::os::unix::fs::FileExt;
        let lock = shared
            .lock
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take();
        if let (Ok(()), Some(lock)) = (scrubbed, &lock)
            && let Err(error) = lock.write_all_at(CLEAN, 0)
        {
            // Unmarked (or half-marked), the next claimant scrubs it again.
            tracing::debug!(uid = shared.uid, %error, "cannot mark a returned user id clean");
        }
        drop(lock);
        self.state().table.release(shared.uid);
    }

    /// Scrubs `uid`, a fresh id not known clean, before its attempt's first
    /// rank runs: in the sweeper's next batch.
    async fn scrub_before_use(self: &Arc<Self>, uid: u32) -> Result<(), String> {
        let stopped = || Err("the node's user id sweeper has stopped".to_owned());
        let (done, scrubbed) = tokio::sync::oneshot::channel();
        if self.sweep(sweeper::Job::Claimed { uid, done }).is_err() {
            return stopped();
        }
        scrubbed.await.unwrap_or_else(|_| stopped())
    }

    #[cfg(test)]
    /// How many ids live attempts hold (and ids not yet returned).
    pub(crate) fn held(&self) -> usize {
        self.state().table.held()
    }
}

/// One rank's share of its attempt's user id. The id is returned to the pool
/// (scrubbed, its machine-wide claim dropped, in the background) when the
/// attempt's last share is dropped.
#[derive(Debug)]
pub(crate) struct UidLease {
    key: WorkerKey,
    shared: Arc<SharedUid>,
    pool: Arc<UidPool>,
}

impl UidLease {
    /// The user id, and the group id of the same number.
    pub(crate) fn uid(&self) -> u32 {
        self.shared.uid
    }

    /// Waits until the id is clear of any earlier holder: the first rank of a
    /// fresh lease not known clean has the sweeper scrub it, the attempt's other
    /// ranks wait for that, so no rank starts before it and the scrub never
    /// kills a sibling.
    pub(crate) async fn ready(&self) -> Result<(), UidClaimError> {
        let uid = self.shared.uid;
        self.shared
            .scrubbed
            .get_or_init(|| self.pool.scrub_before_use(uid))
            .await
            .clone()
            .map_err(|why| UidClaimError::Scrub { uid, why })
    }
}

impl Drop for UidLease {
    fn drop(&mut self) {
        self.pool.give_back(self.key, &self.shared);
    }
}

/// The user ids `/etc/passwd` gives accounts (empty when it cannot be read).
pub(crate) fn account_uids(passwd: &str) -> BTreeSet<u32> {
    passwd
        .lines()
        .filter_map(|line| line.split(':').nth(2)?.parse().ok())
        .collect()
}

#[cfg(test)]
mod tests;
