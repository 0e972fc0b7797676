//! Attained service: how much GPU time each trial has received, the discrete
//! levels it falls in, promotion of long waiters back to level 0, when a trial
//! with no room lets smaller work pass, and the checkpoints that bound what a
//! victim would lose.
//!
//! The core is the one owner of attained service: it adds a run's GPU time
//! (its gang's GPUs × the time it held them) when the run stops
//! ([`PolicyCore::requeue`]), so no caller reports it, and a placed trial's
//! current run counts as it goes (`Trial::attained_at`). Only the head's
//! restarts need [`PolicyCore::add_past_service`]. A waiting trial's level is
//! fixed while it waits (its service does not change) except for promotion,
//! which happens at the start of a pass for every trial whose promotion time
//! (`waiting_since` + `promote_after` × the time it has run) has come; so the
//! level can be part of a waiting trial's index key.
//!
//! Checkpoint times come from the caller ([`PolicyCore::note_checkpoint`]) and
//! live in the placement they belong to, so a new run starts with none.
//! Nothing here chooses victims or orders lanes; `preemption` and `lanes` ask.

use xp_runtime::clock::UnixMillis;
use xp_runtime::ids::TrialId;

use super::PolicyCore;
use super::index::victim_entry;
use super::preemption::MAX_LOSS_WAIT_MS;
use super::trial::{Standing, Trial};
use crate::config::Order;

/// The shortest grace period that scaling to a workload of short trials
/// gives (`levels`), unless the policy's own is shorter.
pub(super) const MIN_SCALED_GRACE_MS: u64 = 10_000;

/// A trial's attained service, for views and tests.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AttainedService {
    /// GPU-milliseconds received (GPU thousandths × milliseconds / 1000).
    pub gpu_ms: u64,
    /// Its level now (0 without `attained_service`).
    pub level: u8,
    /// When its current run last checkpointed, as reported.
    pub last_checkpoint: Option<UnixMillis>,
}

impl PolicyCore {
    /// A placed trial's worker stored a checkpoint at `at`: a preemption from
    /// now on loses only the work since. False if it is not placed (a late
    /// report of an earlier run) or `at` is before its current run.
    pub fn note_checkpoint(&mut self, trial: TrialId, at: UnixMillis) -> bool {
        let Some(entry) = self.trials.get_mut(&trial) else {
            return false;
        };
        let Standing::Placed(placed) = &mut entry.standing else {
            return false;
        };
        if at < placed.started_at {
            return false;
        }
        placed.last_checkpoint = Some(placed.last_checkpoint.map_or(at, |last| last.max(at)));
        // Only where its loss counts from changed: the candidate's facts.
        let entry = &self.trials[&trial];
        if let Standing::Placed(placed) = &entry.standing
            && let Some((key, facts)) = victim_entry(trial, entry, placed)
        {
            for victims in [
                &mut self.index.victims,
                &mut self.index.queues[entry.queue].victims,
            ] {
                if let Some(kept) = victims.get_mut(&key) {
                    *kept = facts;
                }
            }
        }
        true
    }

    /// The GPU time a trial has received up to `now` (GPU-milliseconds, over
    /// all its runs since the core has known it), its attained-service level
    /// and when its current run last checkpointed. `None` for unknown trials.
    pub fn attained_service(&self, trial: TrialId, now: UnixMillis) -> Option<AttainedService> {
        let entry = self.trials.get(&trial)?;
        let gpu_ms = entry.attained_at(now);
        let last_checkpoint = match &entry.standing {
            Standing::Placed(placed) => placed.last_checkpoint,
            Standing::Waiting | Standing::Held => None,
        };
        Some(AttainedService {
            gpu_ms,
            level: self.level_of(gpu_ms.saturating_sub(entry.level_base_gpu_ms)),
            last_checkpoint,
        })
    }

    /// Gives a trial the service of runs the core did not see (the head
    /// restarted): GPU-milliseconds and wall time run in earlier attempts.
    /// False if the trial is unknown.
    pub fn add_past_service(&mut self, trial: TrialId, gpu_ms: u64, run_ms: u64) -> bool {
        self.relevel(trial, |entry| {
            entry.attained_gpu_ms = entry.attained_gpu_ms.saturating_add(gpu_ms);
            entry.run_ms = entry.run_ms.saturating_add(run_ms);
        })
    }

    /// How many completed trials' service the adaptive level edges follow:
    /// all a restarted head needs to hand [`Self::add_completed_service`].
    pub const COMPLETED_SERVICE_WINDOW: usize = super::levels::WINDOW;

    /// A trial completed with `gpu_ms` of service (over all its runs): under
    /// adaptive levels the edges follow it (`levels`), and waiting trials'
    /// levels with them. The core calls it itself when a placed trial
    /// finishes completed; a restarted head hands it its completed trials'
    /// service, oldest first, so the edges are as before the restart.
    /// Trials that received no service are left out.
    pub fn add_completed_service(&mut self, gpu_ms: u64) {
        let zero_edge_before = self.levels.edges().first() == Some(&0);
        if gpu_ms > 0 && self.levels.note_completed(gpu_ms) {
            let zero_edge = zero_edge_before || self.levels.edges().first() == Some(&0);
            self.relevel_waiting(zero_edge);
        }
    }

    /// The attained-service level edges in force, in GPU-milliseconds.
    pub fn level_edges_gpu_ms(&self) -> &[u64] {
        self.levels.edges()
    }

    /// Recomputes the level and promotion time of every waiting and held
    /// trial after the edges moved (`reserve_after` may have scaled with
    /// them); places in line stay as they are, size delays included.
    /// Under edges above 0, a trial without service sits at level 0 and has
    /// no promotion time whatever the edges, so only trials with service are
    /// looked at (a handful beside a queue of never-run trials), unless
    /// `zero_edge` says an edge was or is 0.
    fn relevel_waiting(&mut self, zero_edge: bool) {
        let ids: Vec<TrialId> = if zero_edge {
            let mut ids: Vec<TrialId> = self
                .trials
                .iter()
                .filter(|(_, trial)| !matches!(trial.standing, Standing::Placed(_)))
                .map(|(id, _)| *id)
                .collect();
            ids.sort_unstable();
            ids
        } else {
            self.index.pending_with_service.iter().copied().collect()
        };
        let (promote_after, reserve_after) = self.las_promote_after();
        for id in ids {
            let Some(trial) = self.trials.get(&id) else {
                continue;
            };
            let level = self.level_of(
                trial
                    .attained_gpu_ms
                    .saturating_sub(trial.level_base_gpu_ms),
            );
            if level != trial.level || trial.promote_at.is_some() {
                self.change(id, |trial| {
                    trial.level = level;
                    trial.promote_after_set(promote_after, reserve_after);
                });
            }
        }
    }

    /// `promote_after` and `reserve_after` of the policy in force (0 and
    /// none without attained service, or under `fifo`).
    fn las_promote_after(&self) -> (u32, Option<u64>) {
        let las = (self.config.order != Order::Fifo)
            .then_some(self.config.attained_service.as_ref())
            .flatten();
        (
            las.map_or(0, |las| las.promote_after),
            las.map(|las| self.levels.lengthened(las.reserve_after_ms)),
        )
    }

    /// `preemption.min_run_time`, scaled to the workload (`levels`).
    pub(super) fn min_run_ms(&self) -> u64 {
        self.levels.scaled(self.config.preemption.min_run_time_ms)
    }

    /// `preemption.max_loss`, scaled to the workload (`levels`).
    pub(super) fn max_loss_ms(&self) -> Option<u64> {
        self.config
            .preemption
            .max_loss_ms
            .map(|limit| self.levels.scaled(limit).min(limit))
    }

    /// `preemption.grace_period`, shortened for a workload of shorter trials
    /// than the prior's (`levels`) but never under [`MIN_SCALED_GRACE_MS`]
    /// (or the configured period when shorter), and never lengthened: it is
    /// how long a process may take to stop, which its workload does not
    /// lengthen, and what a victim runs in it is lost unless it checkpoints.
    pub(super) fn grace_ms(&self) -> u64 {
        let grace = self.config.preemption.grace_period_ms;
        self.levels
            .scaled(grace)
            .clamp(grace.min(MIN_SCALED_GRACE_MS), grace)
    }

    /// The wait after which a claimant accepts any loss ([`MAX_LOSS_WAIT_MS`]),
    /// lengthened for a workload of longer trials (`levels`), never shortened.
    pub(super) fn max_loss_wait_ms(&self) -> u64 {
        self.levels.lengthened(MAX_LOSS_WAIT_MS)
    }

    /// Applies `change` to a trial's service or size, then recomputes its
    /// level, place in line and promotion time from them, with its index
    /// entries, unless it is placed. False if the trial is unknown.
    pub(super) fn relevel(&mut self, trial: TrialId, change: impl FnOnce(&mut Trial)) -> bool {
        let Some(mut entry) = self.trials.remove(&trial) else {
            return false;
        };
        self.index.remove(trial, &entry);
        change(&mut entry);
        if !matches!(entry.standing, Standing::Placed(_)) {
            self.set_level(&mut entry);
        }
        self.index.insert(trial, &entry);
        self.trials.insert(trial, entry);
        true
    }

    /// Waiting trials whose wait has passed their promotion time go back to
    /// level 0, their service counted afresh from here, and join its line as
    /// of their promotion time (whatever their size): behind the trials that
    /// entered level 0 before, never-run ones included, and ahead of those that
    /// come after. Keeping their submission time instead let two trials that
    /// take turns on a node (one preempted for service, promoted, preempting
    /// the other) stay ahead of never-run trials of their level for ever.
    pub(super) fn promote_due(&mut self, now: UnixMillis) {
        while let Some(&(at, id)) = self.index.promotions.first() {
            if at > now {
                break;
            }
            let promoted = self.change(id, |trial| {
                trial.level_base_gpu_ms = trial.attained_gpu_ms;
                trial.level = 0;
                trial.line_at = at.max(trial.request.submitted_at);
                trial.promote_at = None;
            });
            if promoted.is_none() {
                // Cannot happen (the index holds only known trials); never loop.
                self.index.promotions.remove(&(at, id));
            }
        }
    }

    /// The attained-service level of `service` GPU-milliseconds above a
    /// trial's base: how many thresholds it has passed (0 without
    /// `attained_service`).
    pub(super) fn level_of(&self, service: u64) -> u8 {
        let passed = self.levels.edges().partition_point(|edge| *edge <= service);
        u8::try_from(passed).unwrap_or(u8::MAX)
    }

    /// Sets a trial's level and promotion time from its service, as it
    /// (re)enters the waiting line or the policy changes; call inside
    /// `change` (or before the trial enters the index).
    pub(super) fn set_level(&self, trial: &mut Trial) {
        trial.level = self.level_of(
            trial
                .attained_gpu_ms
                .saturating_sub(trial.level_base_gpu_ms),
        );
        // `fifo` ignores attained service altogether.
        let las = (self.config.order != Order::Fifo)
            .then_some(self.config.attained_service.as_ref())
            .flatten();
        let promote_after = las.map_or(0, |las| las.promote_after);
        // Aging counts the wait from `submitted_at` and relies on each set
        // being in that order, so the delay is left out beside it.
        let delay_per_gpu = las
            .filter(|_| self.config.aging.is_none())
            .map_or(0, |las| self.levels.lengthened(las.delay_per_gpu_ms));
        let reserve_after = las.map(|las| self.levels.lengthened(las.reserve_after_ms));
        let extra_gpus = trial.demand[0].saturating_sub(1000);
        // Capped at `reserve_after`, so a gang is passed by no trial submitted
        // more than that after it, whatever its size.
        let delay = u64::try_from(u128::from(extra_gpus) * u128::from(delay_per_gpu) / 1000)
            .unwrap_or(u64::MAX)
            .min(reserve_after.unwrap_or(0));
        trial.line_at = trial.request.submitted_at.saturating_add(delay);
        trial.promote_after_set(promote_after, reserve_after);
    }

    /// Whether every trial waiting in `queue` would let the trials behind it
    /// go on ([`Self::skips_ahead`]): none has waited `reserve_after` yet.
    pub(super) fn all_skip_ahead(&self, queue: usize, now: UnixMillis) -> bool {
        let Some(las) = &self.config.attained_service else {
            return false;
        };
        self.config.order != Order::Fifo
            && self.index.queues[queue]
                .waiting_since
                .keys()
                .next()
                .is_none_or(|oldest| {
                    now.saturating_sub(*oldest) < self.levels.lengthened(las.reserve_after_ms)
                })
    }

    /// Whether a trial with no room lets the trials behind it go on: under
    /// `attained_service` (not `fifo`), until it has waited `reserve_after`
    /// since it was last queued.
    pub(super) fn skips_ahead(&self, id: TrialId, now: UnixMillis) -> bool {
        let Some(las) = &self.config.attained_service else {
            return false;
        };
        self.config.order != Order::Fifo
            && self.trials.get(&id).is_some_and(|trial| {
                now.saturating_sub(trial.waiting_since)
                    < self.levels.lengthened(las.reserve_after_ms)
            })
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use xp_runtime::ids::{ExperimentId, NodeId};

    use super::*;
    use crate::{
        Amount, Decision, GangShape, NodeSpec, PolicyConfig, PreemptReason, TrialRequest,
        WaitReason,
    };

    const MINUTE: u64 = 60_000;
    const HOUR: u64 = 60 * MINUTE;

    fn id(index: u32) -> TrialId {
        TrialId {
            experiment: ExperimentId { digest: 3, run: 1 },
            index,
        }
    }

    /// One worker of `gpus` GPUs at priority `priority`, submitted at `at`.
    fn request(index: u32, gpus: u64, priority: i64, at: UnixMillis) -> TrialRequest {
        TrialRequest {
            id: id(index),
            team: "t".to_owned(),
            queue: None,
            priority,
            gang: GangShape {
                workers: 1,
                per_worker: Amount {
                    gpu_milli: gpus * 1000,
                    cpu_milli: 1000,
                    memory_bytes: 1 << 30,
                },
                gpu_models: Vec::new(),
                node_labels: BTreeMap::new(),
                spread: false,
                leases: BTreeMap::new(),
                oversubscribe: false,
            },
            preemptible: true,
            time_limit_ms: None,
            submitted_at: at,
            urgency: 0,
        }
    }

    fn core(yaml: &str, gpus: u32) -> PolicyCore {
        let mut core = PolicyCore::new(PolicyConfig::from_yaml(yaml).unwrap());
        core.upsert_node(NodeSpec {
            id: NodeId(uuid::Uuid::from_u128(1)),
            gpus,
            gpu_model: None,
            cpu_milli: 64_000,
            memory_bytes: 256 << 30,
            labels: BTreeMap::new(),
        });
        core
    }

    fn submit(core: &mut PolicyCore, index: u32, gpus: u64, priority: i64, at: UnixMillis) {
        core.submit(request(index, gpus, priority, at), at).unwrap();
    }

    /// Decides at `now`, checks the invariants, and returns the placed and
    /// the preempted trials.
    fn decide(core: &mut PolicyCore, now: UnixMillis) -> (Vec<u32>, Vec<(u32, PreemptReason)>) {
        let decisions = core.decide(now);
        core.check_invariants().unwrap();
        let mut placed = Vec::new();
        let mut preempted = Vec::new();
        for decision in decisions {
            match decision {
                Decision::Place { trial, .. } => placed.push(trial.index),
                Decision::Preempt { trial, reason, .. } => preempted.push((trial.index, reason)),
                Decision::Resize { .. } => {}
            }
        }
        (placed, preempted)
    }

    const LAS: &str = "attained_service: {thresholds_gpu_hours: [1], promote_after: 0}\n";

    #[test]
    fn less_served_trials_go_first_and_fifo_ignores_service() {
        for (order, first) in [("fair", 2), ("priority", 2), ("fifo", 1)] {
            let mut core = core(&format!("{LAS}order: {order}\n"), 1);
            submit(&mut core, 1, 1, 0, 0);
            assert_eq!(decide(&mut core, 0).0, vec![1]);
            // Two hours on one GPU: two GPU-hours, past the 1 GPU-hour edge.
            assert!(core.requeue(id(1), 2 * HOUR));
            let service = core.attained_service(id(1), 2 * HOUR).unwrap();
            assert_eq!(service.gpu_ms, 2 * HOUR);
            assert_eq!(service.level, u8::from(order != "fifo"));
            submit(&mut core, 2, 1, 0, 2 * HOUR + 1);
            assert_eq!(decide(&mut core, 3 * HOUR).0, vec![first], "order {order}");
            let other = 3 - first;
            assert!(core.finish(id(first), 4 * HOUR, true));
            assert_eq!(decide(&mut core, 4 * HOUR).0, vec![other]);
        }
    }

    #[test]
    fn waiting_levels_follow_the_edges_and_past_service() {
        let mut core = core("attained_service: {promote_after: 0}\n", 1);
        submit(&mut core, 1, 1, 0, 0);
        decide(&mut core, 0);
        // Ten GPU-minutes of service, then back in line beside a never-run trial.
        assert!(core.requeue(id(1), 10 * MINUTE));
        submit(&mut core, 2, 1, 0, 10 * MINUTE);
        let levels = |core: &PolicyCore| {
            core.check_invariants().unwrap();
            [1, 2].map(|index| core.trials[&id(index)].level)
        };
        // Completions far shorter than its service pull the edges below it...
        for _ in 0..300 {
            core.add_completed_service(MINUTE / 10);
        }
        let [served, never_run] = levels(&core);
        assert!(served > 0, "edges {:?}", core.level_edges_gpu_ms());
        assert_eq!(never_run, 0);
        // ...far longer ones lift them above it again.
        for _ in 0..300 {
            core.add_completed_service(100 * HOUR);
        }
        assert_eq!(
            levels(&core),
            [0, 0],
            "edges {:?}",
            core.level_edges_gpu_ms()
        );
        // Service the core did not see (a restarted head) counts at once.
        assert!(core.add_past_service(id(2), 1000 * HOUR, 1000 * HOUR));
        assert!(levels(&core)[1] > 0);
        assert!(!core.add_past_service(id(9), HOUR, HOUR));
    }

    #[test]
    fn priority_still_beats_levels() {
        let mut core = core(LAS, 1);
        submit(&mut core, 1, 1, 100, 0);
        decide(&mut core, 0);
        assert!(core.requeue(id(1), 3 * HOUR));
        submit(&mut core, 2, 1, 0, 3 * HOUR);
        assert_eq!(decide(&mut core, 3 * HOUR).0, vec![1]);
    }

    #[test]
    fn a_long_waiter_goes_back_to_level_zero() {
        let mut core = core(
            "attained_service: {thresholds_gpu_hours: [0.5], promote_after: 2}\n",
            1,
        );
        submit(&mut core, 1, 1, 0, 0);
        decide(&mut core, 0);
        assert!(core.requeue(id(1), HOUR));
        submit(&mut core, 2, 1, 0, HOUR + 1);
        assert_eq!(decide(&mut core, HOUR + 1).0, vec![2]);
        // Trial 1 ran an hour: it is promoted once it has waited two.
        submit(&mut core, 3, 1, 0, 2 * HOUR);
        core.finish(id(2), 2 * HOUR + 30 * MINUTE, true);
        assert_eq!(decide(&mut core, 2 * HOUR + 30 * MINUTE).0, vec![3]);
        // It is promoted at 3 h and joins level 0 then: behind trial 4,
        // which entered it before, ahead of trial 5, which came after.
        submit(&mut core, 4, 1, 0, 3 * HOUR - 1);
        submit(&mut core, 5, 1, 0, 3 * HOUR + 1);
        core.finish(id(3), 3 * HOUR + 1, true);
        assert_eq!(decide(&mut core, 3 * HOUR + 1).0, vec![4]);
        core.finish(id(4), 3 * HOUR + 2, true);
        assert_eq!(decide(&mut core, 3 * HOUR + 2).0, vec![1]);
        let service = core.attained_service(id(1), 3 * HOUR + 2).unwrap();
        assert_eq!((service.gpu_ms, service.level), (HOUR, 0));
    }

    #[test]
    fn a_gang_without_room_lets_smaller_work_pass_until_reserve_after() {
        for backfill in [false, true] {
            let mut core = core(
                &format!("attained_service: {{reserve_after: 1h}}\nbackfill: {backfill}\n"),
                2,
            );
            submit(&mut core, 1, 1, 0, 0);
            decide(&mut core, 0);
            submit(&mut core, 2, 2, 0, MINUTE);
            submit(&mut core, 3, 1, 0, 2 * MINUTE);
            // The gang has no room; the small trial behind it starts.
            assert_eq!(decide(&mut core, 3 * MINUTE).0, vec![3]);
            assert!(matches!(
                core.wait_reason(id(2)),
                Some(WaitReason::NoRoom { .. })
            ));
            core.finish(id(3), 30 * MINUTE, true);
            submit(&mut core, 4, 1, 0, 30 * MINUTE);
            assert_eq!(decide(&mut core, 30 * MINUTE).0, vec![4]);
            // After an hour of waiting the gang holds the line.
            core.finish(id(4), 2 * HOUR, true);
            submit(&mut core, 5, 1, 0, 2 * HOUR);
            assert!(
                decide(&mut core, 2 * HOUR).0.is_empty(),
                "backfill {backfill}"
            );
            core.finish(id(1), 3 * HOUR, true);
            assert_eq!(decide(&mut core, 3 * HOUR).0, vec![2]);
        }
    }

    const SERVICE_PREEMPTION: &str = "attained_service: {thresholds_gpu_hours: [1]}\n\
        preemption: {grace_period: 30s, min_run_time: 1m, max_loss: 30m}\n";

    #[test]
    fn more_served_work_is_preempted_only_within_max_loss() {
        for checkpointed in [true, false] {
            let mut core = core(SERVICE_PREEMPTION, 1);
            submit(&mut core, 1, 1, 0, 0);
            decide(&mut core, 0);
            if checkpointed {
                assert!(core.note_checkpoint(id(1), 110 * MINUTE));
            }
            submit(&mut core, 2, 1, 0, 2 * HOUR);
            let (placed, preempted) = decide(&mut core, 2 * HOUR);
            assert!(placed.is_empty());
            if checkpointed {
                assert_eq!(
                    preempted,
                    vec![(
                        1,
                        PreemptReason::LessService {
                            by: id(2),
                            level: 0,
                            victim_level: 1
                        }
                    )]
                );
            } else {
                // Two hours of work lost is more than the bet is worth.
                assert!(preempted.is_empty());
            }
        }
    }

    #[test]
    fn equal_levels_are_not_preempted_for_service() {
        let mut core = core(SERVICE_PREEMPTION, 1);
        submit(&mut core, 1, 1, 0, 0);
        decide(&mut core, 0);
        core.note_checkpoint(id(1), 50 * MINUTE);
        submit(&mut core, 2, 1, 0, 55 * MINUTE);
        // Trial 1 has 55 GPU-minutes: still level 0, like trial 2.
        assert_eq!(decide(&mut core, 55 * MINUTE), (vec![], vec![]));
    }

    const PRIORITY_PREEMPTION: &str =
        "order: priority\npreemption: {grace_period: 30s, min_run_time: 1m, max_loss: 30m}\n";

    #[test]
    fn the_victim_that_checkpointed_last_goes_first() {
        let mut core = core(PRIORITY_PREEMPTION, 2);
        submit(&mut core, 1, 1, 0, 0);
        decide(&mut core, 0);
        submit(&mut core, 2, 1, 0, 10 * MINUTE);
        decide(&mut core, 10 * MINUTE);
        // Trial 1 checkpointed 10 minutes ago; trial 2, started later, never.
        assert!(core.note_checkpoint(id(1), 50 * MINUTE));
        assert!(!core.note_checkpoint(id(7), 50 * MINUTE));
        submit(&mut core, 3, 1, 100, HOUR);
        let (_, preempted) = decide(&mut core, HOUR);
        assert_eq!(preempted.len(), 1);
        assert_eq!(preempted[0].0, 1);
        // A checkpoint of an earlier run does not count for the next one.
        assert!(core.requeue(id(1), HOUR + MINUTE));
        assert!(!core.note_checkpoint(id(1), HOUR));
    }

    #[test]
    fn max_loss_passes_over_a_costly_victim_of_lower_priority() {
        for (limit, victim) in [("max_loss: 30m", 2), ("", 1)] {
            let yaml = format!(
                "order: priority\npreemption: {{grace_period: 30s, min_run_time: 1m{}}}\n",
                if limit.is_empty() {
                    String::new()
                } else {
                    format!(", {limit}")
                }
            );
            let mut core = core(&yaml, 2);
            submit(&mut core, 1, 1, 0, 0);
            submit(&mut core, 2, 1, 50, 0);
            decide(&mut core, 0);
            // Trial 1 would lose two hours, trial 2 five minutes.
            core.note_checkpoint(id(2), 115 * MINUTE);
            submit(&mut core, 3, 1, 100, 2 * HOUR);
            let (_, preempted) = decide(&mut core, 2 * HOUR);
            let victims: Vec<u32> = preempted.iter().map(|(trial, _)| *trial).collect();
            assert_eq!(victims, vec![victim], "{limit:?}");
        }
    }

    #[test]
    fn a_costly_victim_is_stopped_only_once_the_wait_has_cost_as_much() {
        // One GPU, taken by a trial that never checkpoints: stopping it after
        // an hour destroys one GPU-hour, so the higher priority waits.
        let mut core = core(PRIORITY_PREEMPTION, 1);
        submit(&mut core, 1, 1, 0, 0);
        decide(&mut core, 0);
        submit(&mut core, 2, 1, 100, HOUR);
        assert_eq!(decide(&mut core, HOUR), (vec![], vec![]));
        // It keeps losing as fast as the newcomer waits: still nothing.
        assert_eq!(decide(&mut core, 3 * HOUR), (vec![], vec![]));
        // It checkpoints: the newcomer, which has waited two hours, may now
        // stop it at a loss of 40 minutes (over the limit of 30).
        core.note_checkpoint(id(1), 3 * HOUR);
        let (_, preempted) = decide(&mut core, 3 * HOUR + 40 * MINUTE);
        assert_eq!(preempted.len(), 1, "{preempted:?}");
        assert_eq!(preempted[0].0, 1);
    }

    #[test]
    fn after_a_day_of_waiting_any_loss_is_accepted() {
        let mut core = core(PRIORITY_PREEMPTION, 1);
        submit(&mut core, 1, 1, 0, 0);
        decide(&mut core, 0);
        submit(&mut core, 2, 1, 100, HOUR);
        assert_eq!(decide(&mut core, 24 * HOUR), (vec![], vec![]));
        let (_, preempted) = decide(&mut core, 25 * HOUR);
        assert_eq!(preempted.len(), 1, "{preempted:?}");
    }

    #[test]
    fn smaller_gangs_go_first_by_a_bounded_delay() {
        // Two GPUs, both held until 3 h. A two-GPU gang submitted at 1 min
        // queues as if submitted an hour later: a one-GPU trial submitted
        // within that hour goes first, one submitted after it does not.
        // Beside aging the delay is ignored: FIFO.
        let delay = "attained_service: {delay_per_gpu: 1h}\n";
        let aging = "attained_service: {delay_per_gpu: 1h}\naging: {rate_per_hour: 1, cap: 1}\n";
        for (yaml, small_at, first) in [
            (delay, 30 * MINUTE, 3),
            (delay, 2 * HOUR, 2),
            (aging, 30 * MINUTE, 2),
        ] {
            let mut core = core(yaml, 2);
            submit(&mut core, 1, 2, 0, 0);
            decide(&mut core, 0);
            submit(&mut core, 2, 2, 0, MINUTE);
            submit(&mut core, 3, 1, 0, small_at);
            core.finish(id(1), 3 * HOUR, true);
            let (placed, _) = decide(&mut core, 3 * HOUR);
            assert_eq!(placed, vec![first], "{yaml} {small_at}");
        }
    }
}
