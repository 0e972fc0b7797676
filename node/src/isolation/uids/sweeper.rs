//! The pool's sweeper: one task that scrubs user ids in batches, off the paths
//! of a trial's start and end. Each batch is the ids returned since the last
//! (their last rank gone), the fresh ids claims found not known clean (their
//! first rank waits for this), the unclaimed ids the next claims will take
//! that are not known clean, and, in the first batch of a node, every id of the
//! range whose claim file is not marked clean (one an earlier run of a node
//! held when it stopped or crashed); one scrub, so one walk of the scratch
//! directories, serves them all. Batches start at least [`GAP`] apart, so that
//! ids arriving together share a walk instead of each paying for one.
//!
//! Invariant: an id is freed, or marked clean, only after a scrub that covered
//! it ended well; while the sweeper scrubs an unclaimed id it holds that id's
//! machine-wide claim, so no node hands it out meanwhile.

use std::collections::BTreeSet;
use std::fs::File;
use std::sync::{Arc, Weak};
use std::time::Duration;

use nix::fcntl::Flock;
use tokio::sync::{mpsc, oneshot};

use super::{CLEAN, SharedUid, UidPool};

/// Least time between the starts of two batches.
const GAP: Duration = Duration::from_secs(1);

/// How many unclaimed ids ahead of the cursor each batch makes sure are clean.
const AHEAD: usize = 256;

/// Where jobs for a pool's sweeper go.
pub(super) type Jobs = mpsc::UnboundedSender<Job>;

/// What the sweeper is asked to do.
pub(super) enum Job {
    /// Scrub an id whose attempt's last rank is gone, then free it.
    Returned(Arc<SharedUid>),
    /// Scrub a claimed id not known clean before its first rank runs, and say
    /// how that went.
    Claimed {
        uid: u32,
        done: oneshot::Sender<Result<(), String>>,
    },
    /// A fresh id was claimed: scrub the ids the next claims will take.
    TopUp,
    /// The node starts: scrub every id an earlier run left unmarked.
    Leftovers,
    /// Say when every job sent before this one is done.
    Swept(oneshot::Sender<()>),
}

/// Starts the sweeper of `pool` on the current runtime. It ends when the pool
/// is dropped (and with it the sender), or with the runtime; ids it had not
/// scrubbed by then stay unmarked, so their next claimant scrubs them.
pub(super) fn start(pool: Weak<UidPool>) -> Jobs {
    let (jobs, received) = mpsc::unbounded_channel();
    xp_runtime::task::spawn("uid-sweeper", run(pool, received));
    jobs
}

async fn run(pool: Weak<UidPool>, mut received: mpsc::UnboundedReceiver<Job>) {
    let mut next_batch = tokio::time::Instant::now();
    // Ids ahead found or made clean by earlier batches, so that their claim
    // files are not read again each batch. Only a hint: a claim reads its id's
    // file itself, and scrubs one that is not clean after all.
    let mut known_clean = BTreeSet::new();
    while let Some(first) = received.recv().await {
        // Jobs that come meanwhile join this batch.
        tokio::time::sleep_until(next_batch).await;
        let mut batch = Batch::default();
        batch.add(first);
        while let Ok(job) = received.try_recv() {
            batch.add(job);
        }
        let Some(pool) = pool.upgrade() else {
            return;
        };
        let started = tokio::time::Instant::now();
        let hint = std::mem::take(&mut known_clean);
        match tokio::task::spawn_blocking(move || batch.sweep(&pool, hint)).await {
            Ok((scrubbed, clean)) => {
                known_clean = clean;
                if scrubbed {
                    next_batch = started + GAP;
                }
            }
            Err(error) => {
                tracing::warn!(%error, "a batch of user id scrubs did not finish; its ids are scrubbed again before use");
            }
        }
    }
}

/// The ids of one scrub.
#[derive(Default)]
struct Batch {
    returned: Vec<Arc<SharedUid>>,
    claimed: Vec<(u32, oneshot::Sender<Result<(), String>>)>,
    ahead: bool,
    leftovers: bool,
    swept: Vec<oneshot::Sender<()>>,
}

impl Batch {
    fn add(&mut self, job: Job) {
        match job {
            Job::Returned(shared) => self.returned.push(shared),
            Job::Claimed { uid, done } => self.claimed.push((uid, done)),
            Job::TopUp => self.ahead = true,
            Job::Leftovers => self.leftovers = true,
            Job::Swept(done) => self.swept.push(done),
        }
    }

    /// Scrubs every id of the batch, and the ids ahead not known clean, in one
    /// go, then marks the ids ahead clean and lets them go, frees the returned
    /// ids and answers the claims (each only if the scrub worked); whether
    /// there was anything to scrub, and the ids ahead now known clean (given
    /// those `known_clean` before, whose claim files are not read again).
    /// Blocking.
    fn sweep(mut self, pool: &UidPool, known_clean: BTreeSet<u32>) -> (bool, BTreeSet<u32>) {
        let (scrubbed, clean) = self.scrub(pool, known_clean);
        for done in self.swept {
            let _ = done.send(());
        }
        (scrubbed, clean)
    }

    fn scrub(&mut self, pool: &UidPool, known_clean: BTreeSet<u32>) -> (bool, BTreeSet<u32>) {
        let mut ahead = if self.leftovers {
            unclean_leftovers(pool)
        } else {
            Vec::new()
        };
        let mut clean = BTreeSet::new();
        if self.ahead {
            let taken: BTreeSet<u32> = ahead.iter().map(|(uid, _)| *uid).collect();
            let upcoming = pool.state().table.upcoming(AHEAD);
            let (known, to_read): (Vec<u32>, Vec<u32>) = upcoming
                .into_iter()
                .filter(|uid| !taken.contains(uid))
                .partition(|uid| known_clean.contains(uid));
            clean.extend(known);
            let (unclean, read_clean) = unclean(pool, to_read.into_iter());
            clean.extend(read_clean);
            ahead.extend(unclean);
        }
        let uids: BTreeSet<u32> = self
            .returned
            .iter()
            .map(|shared| shared.uid)
            .chain(self.claimed.iter().map(|(uid, _)| *uid))
            .chain(ahead.iter().map(|(uid, _)| *uid))
            .collect();
        if uids.is_empty() {
            return (false, clean);
        }
        // Returned ids' holders wrote nothing before their claims; of the
        // others nothing is known.
        let since = if self.claimed.is_empty() && ahead.is_empty() {
            self.returned.iter().map(|shared| shared.claimed_at).min()
        } else {
            None
        };
        let started = tokio::time::Instant::now();
        let scrubbed = (pool.scrub)(&uids, since).map_err(|error| error.to_string());
        tracing::debug!(
            returned = self.returned.len(),
            claimed = self.claimed.len(),
            ahead = ahead.len(),
            ok = scrubbed.is_ok(),
            whole_walk = since.is_none(),
            took_ms = started.elapsed().as_millis(),
            "scrubbed a batch of user ids"
        );
        match &scrubbed {
            Ok(()) => {
                for (uid, lock) in &ahead {
                    mark_clean(*uid, lock);
                    clean.insert(*uid);
                }
            }
            Err(error) => {
                tracing::warn!(ids = uids.len(), %error, "cannot clear user ids of what their holders left; each is cleared again before its next use, and a launch given one waits for that");
            }
        }
        // Their claims go before any claimant hears back, so a claim made then
        // does not skip them.
        drop(ahead);
        for shared in &self.returned {
            pool.finish_return(shared, scrubbed.clone().map_err(std::io::Error::other));
        }
        for (_, done) in self.claimed.drain(..) {
            // The claimant may have gone (its launch cancelled): nothing to tell.
            let _ = done.send(scrubbed.clone());
        }
        (true, clean)
    }
}

/// Those of `uids` (unclaimed here) whose claim files do not say clean, each
/// with its claim held, and those whose files do (ids another node holds, and
/// accounts', are in neither).
fn unclean(pool: &UidPool, uids: impl Iterator<Item = u32>) -> (Vec<(u32, Flock<File>)>, Vec<u32>) {
    let mut unclean = Vec::new();
    let mut clean = Vec::new();
    for uid in uids.filter(|uid| !pool.accounts.contains(uid)) {
        match pool.open_claim_file(uid) {
            Some((_, true)) => clean.push(uid),
            Some((lock, false)) => unclean.push((uid, lock)),
            None => {}
        }
    }
    (unclean, clean)
}

/// The ids of the range with a claim file that no node holds now and that is
/// not marked clean: ids whose holders' node stopped before their return was
/// scrubbed.
fn unclean_leftovers(pool: &UidPool) -> Vec<(u32, Flock<File>)> {
    let Ok(entries) = std::fs::read_dir(&pool.lock_dir) else {
        return Vec::new();
    };
    let named: Vec<u32> = entries
        .filter_map(Result::ok)
        .filter_map(|entry| entry.file_name().to_str()?.parse().ok())
        .filter(|uid| pool.range.contains(*uid))
        .collect();
    let free: Vec<u32> = {
        let state = pool.state();
        named
            .into_iter()
            .filter(|uid| !state.table.is_held(*uid))
            .collect()
    };
    unclean(pool, free.into_iter()).0
}

/// Marks a scrubbed, unclaimed id clean in its claim file.
fn mark_clean(uid: u32, lock: &Flock<File>) {
    use std::os::unix::fs::FileExt;
    if let Err(error) = lock.write_all_at(CLEAN, 0) {
        // Unmarked, its claimant scrubs it again.
        tracing::debug!(uid, %error, "cannot mark a scrubbed user id clean");
    }
}
