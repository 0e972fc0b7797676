//! Backfill: a reservation for the first trial of each queue that has no room,
//! and when that reservation is expected to be due.
//!
//! A blocked trial's reservation is the earliest time enough running work is
//! expected to end for its gang to fit: running trials in order of expected end
//! (start plus time limit, else plus the mean run time of completed trials of the
//! same experiment, fixed when the trial starts; a preempted trial ends by its
//! grace deadline) are released one by one against the pool until
//! [`NodePool::find_with_freed`](crate::place::NodePool::find_with_freed) succeeds. Afterwards in the pass, a trial starts
//! only if its own time limit (or estimate) ends by the earliest reservation, so
//! no reservation is delayed while estimates hold. Trials with neither do not
//! backfill. When the time is unknown (the gang fits only once work with no known
//! end stops) the reservation is *now*: nothing backfills past it, so a big gang is
//! never starved by a stream of small trials. Each queue's first trial without
//! room gets a reservation; later trials that cannot start only because of a
//! reservation wait as `ReservedFor` and do not preempt. A trial held back by its
//! queue's quota gets no reservation (it waits for its own queue's work, which
//! must not hold up other queues) but stops its queue for the pass.
//!
//! Trials are held back by a reservation in `lanes`; this module only computes
//! it.

use xp_runtime::clock::UnixMillis;
use xp_runtime::ids::TrialId;

use super::PolicyCore;
use super::pass::{MAX_PLACEMENT_CHECKS, Pass};
use super::resource_vec::{covers, placement_total, plus};
use super::trial::Standing;
use crate::WorkerPlacement;

/// The most backfill reservations one pass computes.
pub(super) const MAX_BACKFILL_RESERVATIONS_PER_PASS: usize = 8;

impl PolicyCore {
    /// Deals with `id`, a trial of `queue` with no room now, under backfill:
    /// the queue's first such trial gets a reservation (while the budget lasts
    /// and something waiting could fit), and it becomes the pass's limit when it
    /// is the earliest.
    pub(super) fn reserve_for_backfill(
        &self,
        id: TrialId,
        queue: usize,
        nothing_fits: bool,
        pass: &mut Pass,
    ) {
        if !nothing_fits
            && !pass.blocked_seen[queue]
            && pass.backfill_reservations < MAX_BACKFILL_RESERVATIONS_PER_PASS
        {
            pass.backfill_reservations += 1;
            let start = self.reservation_time(id, pass).unwrap_or(pass.now);
            if pass.backfill_limit.is_none_or(|(limit, _)| start < limit) {
                pass.backfill_limit = Some((start, id));
            }
        }
        pass.blocked_seen[queue] = true;
    }

    /// The earliest time the trial's gang is expected to fit, releasing running
    /// work in order of expected end; `None` when it never fits that way.
    fn reservation_time(&self, id: TrialId, pass: &Pass) -> Option<UnixMillis> {
        let trial = self.trials.get(&id)?;
        let gang = &trial.request.gang;
        let strategy = self.strategy(id);
        let fits = |freed: &[&[WorkerPlacement]]| {
            self.pool.find_with_freed(gang, strategy, freed).is_some()
        };
        let mut freed: Vec<&[WorkerPlacement]> = Vec::new();
        let mut ends: Vec<UnixMillis> = Vec::new();
        let mut total = pass.free;
        let mut checks = 0;
        // A prefix length known not to fit, the next to try, and the step to it.
        let mut failed = 0;
        let mut next_check = None;
        let mut step = 1;
        for &(end, running) in &self.index.ends {
            let Some(Standing::Placed(placed)) =
                self.trials.get(&running).map(|trial| &trial.standing)
            else {
                continue;
            };
            freed.push(&placed.workers);
            ends.push(end);
            total = plus(total, placement_total(&placed.workers));
            if !covers(total, trial.demand) {
                continue;
            }
            let count = freed.len();
            if next_check.is_some_and(|next| count < next) {
                continue;
            }
            if checks >= MAX_PLACEMENT_CHECKS {
                return None;
            }
            checks += 1;
            if fits(&freed) {
                // The smallest prefix that fits lies in (failed, count].
                let (mut low, mut high) = (failed, count);
                while high - low > 1 && checks < MAX_PLACEMENT_CHECKS {
                    let middle = low + (high - low) / 2;
                    checks += 1;
                    if fits(&freed[..middle]) {
                        high = middle;
                    } else {
                        low = middle;
                    }
                }
                return Some(ends[high - 1].max(pass.now));
            }
            failed = count;
            next_check = Some(count + step);
            step *= 2;
        }
        None
    }
}
