//! A trial's entry in the policy core's table: its request, where it stands
//! (waiting, held or placed) and why it waits, with the helpers that change an
//! entry.
//!
//! Invariant: an entry changes only between `index.remove` and `index.insert`
//! (see [`PolicyCore::change`]), so the derived index never goes stale. Nothing
//! here decides what to place or preempt.

use xp_runtime::clock::UnixMillis;
use xp_runtime::ids::{NodeId, TrialId};

use super::PolicyCore;
use super::resource_vec::ResourceVec;
use crate::place::Strategy;
use crate::{TrialRequest, WaitReason, WorkerPlacement};

/// Where a trial stands in the policy: in line, put aside, or holding
/// resources. (Not the trial's lifecycle, which the head tracks.)
#[derive(Debug, Clone)]
pub(super) enum Standing {
    /// In its queue's ordered set.
    Waiting,
    /// Put aside by an admin; not in the ordered set.
    Held,
    /// Holding resources, running or (with a deadline) being preempted.
    Placed(Placed),
}

/// What a placed trial holds and since when.
#[derive(Debug, Clone)]
pub(super) struct Placed {
    /// One placement per worker, in rank order.
    pub(super) workers: Vec<WorkerPlacement>,
    /// When it (re)started.
    pub(super) started_at: UnixMillis,
    /// The pass that started it; it is not preempted in that same pass.
    pub(super) started_pass: u64,
    /// Start plus time limit or estimate, when known.
    pub(super) expected_end: Option<UnixMillis>,
    /// Set when it is asked to stop: when it will have been killed.
    pub(super) preempt_deadline: Option<UnixMillis>,
    /// Nodes removed while it ran; what it held there is gone with them.
    pub(super) lost_nodes: Vec<NodeId>,
    /// Its latest checkpoint in this run, as the caller reported it
    /// ([`PolicyCore::note_checkpoint`]): what a preemption would lose counts
    /// from here.
    pub(super) last_checkpoint: Option<UnixMillis>,
}

impl Placed {
    /// When it is expected to end: its expected end or its preemption
    /// deadline, whichever comes first.
    pub(super) fn end(&self) -> Option<UnixMillis> {
        match (self.expected_end, self.preempt_deadline) {
            (Some(expected), Some(deadline)) => Some(expected.min(deadline)),
            (expected, deadline) => expected.or(deadline),
        }
    }

    /// The run time a preemption at `now` would lose: since the last checkpoint
    /// of this run, else since it started.
    pub(super) fn loss_ms(&self, now: UnixMillis) -> u64 {
        now.saturating_sub(self.loss_from())
    }

    /// Where what a preemption would lose counts from: the last checkpoint
    /// of this run, else its start.
    pub(super) fn loss_from(&self) -> UnixMillis {
        self.last_checkpoint
            .unwrap_or(self.started_at)
            .max(self.started_at)
    }

    /// The workers whose resources the pool still holds.
    pub(super) fn held_workers(&self) -> Vec<WorkerPlacement> {
        self.workers
            .iter()
            .filter(|worker| !self.lost_nodes.contains(&worker.node))
            .cloned()
            .collect()
    }
}

/// A trial the policy knows.
#[derive(Debug, Clone)]
pub(super) struct Trial {
    /// What was submitted (with priority and queue as changed since).
    pub(super) request: TrialRequest,
    /// Its queue, an index into the core's queues.
    pub(super) queue: usize,
    /// What its whole gang asks for.
    pub(super) demand: ResourceVec,
    /// Where it stands.
    pub(super) standing: Standing,
    /// Why it waited when a pass last looked at it.
    pub(super) reason: WaitReason,
    /// The pass that set `reason`.
    pub(super) reason_pass: u64,
    /// The pass count when it last (re)entered the waiting line; until the next
    /// pass it is `NotYetConsidered`.
    pub(super) entered_pass: u64,
    /// `could_ever_fit` and the node epoch it was computed at.
    pub(super) fits_cache: Option<(u64, bool)>,
    /// GPU time received in earlier runs, in GPU-milliseconds (its gang's GPU
    /// thousandths × milliseconds run / 1000), counted by the core at each stop.
    pub(super) attained_gpu_ms: u64,
    /// Wall time run in earlier runs.
    pub(super) run_ms: u64,
    /// Its service when it was last promoted: its level counts what it
    /// received beyond this.
    pub(super) level_base_gpu_ms: u64,
    /// When it last entered the waiting line (submitted or requeued).
    pub(super) waiting_since: UnixMillis,
    /// Its attained-service level while waiting; 0 without `attained_service`.
    /// Part of its place in the index, so it changes only inside `change`.
    pub(super) level: u8,
    /// When a waiting trial above level 0 goes back to level 0.
    pub(super) promote_at: Option<UnixMillis>,
    /// Where it stands in its set of waiting trials: its `submitted_at`,
    /// made later by `attained_service.delay_per_gpu` for each GPU it asks
    /// beyond one (without aging). Part of its place in the index.
    pub(super) line_at: UnixMillis,
}

impl Trial {
    /// Sets when it is promoted to level 0: `promote_after` times its run
    /// time after it entered the line when above level 0 (and promotion is
    /// on), or `reserve_after` after it, whichever comes first. (A size delay
    /// is not promoted away: it is capped at `reserve_after` instead; see
    /// `set_level`.)
    pub(super) fn promote_after_set(&mut self, promote_after: u32, reserve_after: Option<u64>) {
        let by_service = (self.level > 0 && promote_after > 0).then(|| {
            let wait = self.run_ms.saturating_mul(u64::from(promote_after));
            self.waiting_since.saturating_add(wait)
        });
        let by_wait = reserve_after
            .filter(|_| self.level > 0)
            .map(|wait| self.waiting_since.saturating_add(wait));
        self.promote_at = match (by_service, by_wait) {
            (Some(service), Some(wait)) => Some(service.min(wait)),
            (service, wait) => service.or(wait),
        };
    }

    /// GPU time received up to `now`, the current run included.
    pub(super) fn attained_at(&self, now: UnixMillis) -> u64 {
        match &self.standing {
            Standing::Placed(placed) => self.attained_gpu_ms.saturating_add(gpu_ms(
                self.demand[0],
                now.saturating_sub(placed.started_at),
            )),
            Standing::Waiting | Standing::Held => self.attained_gpu_ms,
        }
    }
}

/// GPU-milliseconds of `gpu_milli` GPU thousandths held for `ms`.
pub(super) fn gpu_ms(gpu_milli: u64, ms: u64) -> u64 {
    let product = u128::from(gpu_milli) * u128::from(ms) / 1000;
    u64::try_from(product).unwrap_or(u64::MAX)
}

/// Mean run time of an experiment's completed trials.
#[derive(Debug, Clone, Copy, Default)]
pub(super) struct Estimate {
    /// Run times summed.
    pub(super) total_ms: u128,
    /// Completed trials counted.
    pub(super) count: u64,
}

impl Estimate {
    /// The mean, rounded up; `None` before the first completion.
    pub(super) fn mean_ms(self) -> Option<u64> {
        if self.count == 0 {
            return None;
        }
        let mean = self.total_ms.div_ceil(u128::from(self.count));
        Some(u64::try_from(mean).unwrap_or(u64::MAX))
    }
}

// Bookkeeping on entries.
impl PolicyCore {
    /// Changes a trial with its index entries kept in step.
    pub(super) fn change<R>(
        &mut self,
        id: TrialId,
        change: impl FnOnce(&mut Trial) -> R,
    ) -> Option<R> {
        let trial = self.trials.get_mut(&id)?;
        self.index.remove(id, trial);
        let result = change(trial);
        self.index.insert(id, trial);
        Some(result)
    }

    /// Records why a trial waits, as found by this pass.
    pub(super) fn set_reason(&mut self, id: TrialId, reason: WaitReason) {
        if let Some(trial) = self.trials.get_mut(&id) {
            trial.reason = reason;
            trial.reason_pass = self.pass;
        }
    }

    /// A trial's time limit, else its experiment's estimate.
    pub(super) fn duration(&self, trial: &Trial) -> Option<u64> {
        trial
            .request
            .time_limit_ms
            .or_else(|| self.estimate_ms(trial.request.id.experiment))
    }

    /// The placement strategy for a trial, seeded by its id.
    pub(super) fn strategy(&self, id: TrialId) -> Strategy {
        // The pool mixes this seed with its own change counter, so one seed per
        // trial is enough for varied yet replayable random placements.
        let seed = id.experiment.digest ^ u64::from(id.index).rotate_left(32);
        self.config.placement.strategy(seed)
    }

    /// Whether the trial's gang would fit the schedulable nodes were they
    /// empty, cached until nodes change.
    pub(super) fn ever_fits(&mut self, id: TrialId) -> bool {
        let epoch = self.node_epoch;
        let Some(trial) = self.trials.get_mut(&id) else {
            return false;
        };
        if let Some((cached_epoch, fits)) = trial.fits_cache
            && cached_epoch == epoch
        {
            return fits;
        }
        let fits = self.pool.could_ever_fit(&trial.request.gang);
        trial.fits_cache = Some((epoch, fits));
        fits
    }
}
