//! Admission: the two limits a trial passes before the policy core sees it.
//!
//! A submission is refused (with a retry hint) while its team already has its
//! policy's limit of pending trials; a trial then waits as `Pending` until its
//! experiment has fewer than `parallel` unfinished trials in the queue or running.
//! Where and when a queued trial runs is not decided here but by the policy core.
//! A submission whose one worker no known node could ever hold is refused at
//! once, naming the largest capacity there is, instead of waiting forever.

use xp_runtime::clock::UnixMillis;
use xp_runtime::ids::ExperimentId;
use xp_runtime::protocol::TrialState;
use xp_runtime::spec::ExperimentSpec;

use xp_sched::GPU_MILLI;

use super::records::NodeRecord;
use super::{CoreError, HeadCore};

impl HeadCore {
    /// Refuses a submission while the team already has its limit of pending
    /// trials, with a hint of when to retry; the SDK backs off and retries.
    pub(super) fn admit(&self, spec: &ExperimentSpec) -> Result<(), CoreError> {
        let admission = &self.placement.policy().config().admission;
        let pending = self
            .book
            .trials()
            .filter(|trial| matches!(trial.state, TrialState::Pending | TrialState::Queued))
            .filter(|trial| {
                self.book
                    .get_spec(trial.id.experiment)
                    .is_some_and(|other| other.team == spec.team)
            })
            .count() as u64;
        if pending >= admission.max_pending_per_team {
            return Err(CoreError::TooManyPending {
                team: spec.team.clone(),
                pending,
                limit: admission.max_pending_per_team,
                retry_after_ms: admission.retry_after_ms,
            });
        }
        Ok(())
    }

    /// Refuses a submission when nodes have joined and none of them, even empty,
    /// could hold one of its workers: it would wait forever. With no node known
    /// yet the submission is accepted (nodes may still join), and its trials say
    /// why they wait.
    pub(super) fn check_capacity(&self, spec: &ExperimentSpec) -> Result<(), CoreError> {
        let gpu_milli = spec.trial.gpu_milli();
        let cpu_milli = u64::from(spec.trial.cpu_milli());
        let memory_bytes = spec.trial.resources.memory.0;
        let whole_gpus = gpu_milli.div_ceil(GPU_MILLI);
        let holds = |node: &NodeRecord| {
            let resources = &node.resources;
            resources.gpus.len() as u64 >= whole_gpus
                && u64::from(resources.cpu_milli) >= cpu_milli
                && resources.memory_bytes >= memory_bytes
        };
        if self.membership.is_empty() || self.membership.nodes().any(holds) {
            return Ok(());
        }
        let resources = || self.membership.nodes().map(|node| &node.resources);
        Err(CoreError::NoNodeCanHold {
            gpu_milli,
            cpu_milli,
            memory_bytes,
            largest_gpus: resources().map(|r| r.gpus.len() as u64).max().unwrap_or(0),
            largest_cpu_milli: resources()
                .map(|r| u64::from(r.cpu_milli))
                .max()
                .unwrap_or(0),
            largest_memory_bytes: resources().map(|r| r.memory_bytes).max().unwrap_or(0),
        })
    }

    /// Moves pending trials of each experiment into the queue while fewer than its
    /// `parallel` limit are queued, placed or running.
    pub(super) fn admit_pending(&mut self, now: UnixMillis) {
        let experiment_ids: Vec<ExperimentId> = self.book.experiment_ids().collect();
        for experiment_id in experiment_ids {
            let limit = self
                .book
                .spec(experiment_id)
                .search
                .parallel
                .map_or(usize::MAX, |limit| limit as usize);
            let (active, pending): (Vec<_>, Vec<_>) = self
                .book
                .trials_of(experiment_id)
                .filter(|(_, trial)| !trial.state.is_terminal())
                .map(|(id, trial)| (*id, trial.state))
                .partition(|(_, state)| *state != TrialState::Pending);
            let room = limit.saturating_sub(active.len());
            for (trial_id, _) in pending.into_iter().take(room) {
                if let Some(trial) = self.book.trial_mut(trial_id) {
                    trial.queued_at = now;
                }
                self.transition(
                    now,
                    trial_id,
                    TrialState::Queued,
                    "waiting for slots".to_owned(),
                );
            }
        }
    }
}
