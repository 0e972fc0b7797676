//! `xp admin` (`Request::Admin`): apply a scheduling policy; set the priority,
//! hold, release or queue of unfinished trials; approve or deny a preemption
//! that waits for a person.
//!
//! Access: a member holds and releases their team's work, a team admin also
//! sets priorities and moves it between their team's queues, and only an
//! admin applies policies or decides preemptions. The action is recorded as
//! the authenticated user, never as the name the client gives.

use tracing::{debug, info};
use xp_runtime::clock::UnixMillis;
use xp_runtime::ids::TrialId;
use xp_runtime::protocol::{AdminAction, AdminRequest, Response};
use xp_sched::{ApprovalVerdict, PolicyConfig};

use crate::auth::Action;
use crate::auth::access::{Access, Authorized, Scope};
use crate::{CoreError, HeadCore, PolicyRecord};

/// The longest `who` an admin action may carry.
const MAX_WHO_BYTES: usize = 128;
/// The longest `why` an admin action may carry.
const MAX_WHY_BYTES: usize = 4096;

/// What an admin action does to each trial it names.
#[derive(Debug)]
enum TrialChange {
    /// A base priority replacing the experiment's.
    Priority(i64),
    /// Out of the queue until released.
    Hold,
    /// Back into the queue.
    Release,
    /// Into another queue.
    Move(String),
}

impl TrialChange {
    /// In words, for events and answers.
    fn describe(&self) -> String {
        match self {
            Self::Priority(value) => format!("priority set to {value}"),
            Self::Hold => "held".to_owned(),
            Self::Release => "released".to_owned(),
            Self::Move(queue) => format!("moved to queue {queue}"),
        }
    }
}

/// What an admin action does and names.
pub(super) fn access(admin: &AdminRequest) -> Access {
    let named = |id: &String| Scope::Named(id.clone());
    match &admin.action {
        AdminAction::ApplyPolicy { .. } => Access::new(Action::ApplyPolicy, Scope::Cluster),
        AdminAction::Priority { id, .. } => Access::new(Action::Priority, named(id)),
        AdminAction::Hold { id } => Access::new(Action::Hold, named(id)),
        AdminAction::Release { id } => Access::new(Action::Release, named(id)),
        AdminAction::Move { id, queue } => Access::new(
            Action::Move,
            Scope::Move {
                named: id.clone(),
                queue: queue.clone(),
            },
        ),
        AdminAction::Approve { request } | AdminAction::Deny { request } => Access::new(
            Action::ArbitratePreemption,
            Scope::PreemptionRequest {
                request: *request,
                verdict: if matches!(admin.action, AdminAction::Approve { .. }) {
                    "approve"
                } else {
                    "deny"
                },
                why: admin.why.clone(),
            },
        ),
    }
}

impl HeadCore {
    /// Carries out the action as the asker, on what authorization resolved.
    pub(super) fn apply_admin(
        &mut self,
        now: UnixMillis,
        asker: &Authorized,
        mut admin: AdminRequest,
    ) -> Result<Response, CoreError> {
        admin.who = asker.principal.name().to_owned();
        match &mut admin.action {
            AdminAction::Priority { id, .. }
            | AdminAction::Hold { id }
            | AdminAction::Release { id }
            | AdminAction::Move { id, .. } => *id = asker.pinned(id),
            AdminAction::ApplyPolicy { .. }
            | AdminAction::Approve { .. }
            | AdminAction::Deny { .. } => {}
        }
        let (trials, message) = self.handle_admin(now, admin)?;
        Ok(Response::Admin { trials, message })
    }

    /// Carries out an admin's action; every touched trial gets an event naming who
    /// and why.
    pub fn handle_admin(
        &mut self,
        now: UnixMillis,
        request: AdminRequest,
    ) -> Result<(u32, String), CoreError> {
        let AdminRequest { action, who, why } = request;
        if who.trim().is_empty() || who.len() > MAX_WHO_BYTES || why.len() > MAX_WHY_BYTES {
            return Err(CoreError::AdminUnattributed);
        }
        let (id, change) = match action {
            AdminAction::ApplyPolicy { yaml } => return self.apply_policy(now, yaml, &who, &why),
            AdminAction::Approve { request } => {
                return self.decide_preemption(now, request, ApprovalVerdict::Approve, &who, &why);
            }
            AdminAction::Deny { request } => {
                return self.decide_preemption(now, request, ApprovalVerdict::Deny, &who, &why);
            }
            AdminAction::Priority { id, value } => (id, TrialChange::Priority(value)),
            AdminAction::Hold { id } => (id, TrialChange::Hold),
            AdminAction::Release { id } => (id, TrialChange::Release),
            AdminAction::Move { id, queue } => (id, TrialChange::Move(queue)),
        };
        self.change_trials(now, &id, &change, &who, &why)
    }

    /// Puts a new scheduling policy in force, recorded with its author.
    fn apply_policy(
        &mut self,
        now: UnixMillis,
        yaml: String,
        who: &str,
        why: &str,
    ) -> Result<(u32, String), CoreError> {
        let config = PolicyConfig::from_yaml(&yaml)?;
        self.placement.policy_mut().set_config(config, now)?;
        self.placement.mark_stale();
        self.placement.set_record(PolicyRecord {
            yaml,
            applied_by: who.to_owned(),
            why: why.to_owned(),
            at: now,
            approvals: self.approvals.records().to_vec(),
        });
        info!(%who, %why, "scheduling policy replaced");
        // Its object quotas, before anything it places.
        self.send_object_rules_to_nodes();
        self.schedule(now);
        Ok((0, format!("policy applied by {who}")))
    }

    /// Approves or denies a preemption waiting for a person.
    fn decide_preemption(
        &mut self,
        now: UnixMillis,
        request: u64,
        verdict: ApprovalVerdict,
        who: &str,
        why: &str,
    ) -> Result<(u32, String), CoreError> {
        let decided = self.arbitrate(now, request, verdict, who, why)?;
        self.schedule(now);
        let word = match verdict {
            ApprovalVerdict::Approve => "approved",
            ApprovalVerdict::Deny => "denied",
        };
        Ok((
            2,
            format!(
                "preemption request {request} of {} for {} {word} by {who}",
                decided.victim, decided.claimant
            ),
        ))
    }

    /// Changes every unfinished trial `id` names, each with an event.
    fn change_trials(
        &mut self,
        now: UnixMillis,
        id: &str,
        change: &TrialChange,
        who: &str,
        why: &str,
    ) -> Result<(u32, String), CoreError> {
        if let TrialChange::Move(queue) = change
            && self.placement.policy().config().queue(queue).is_none()
        {
            return Err(CoreError::QueueNotFound {
                queue: queue.clone(),
            });
        }
        let targets = self.admin_targets(id)?;
        let what = change.describe();
        for &trial_id in &targets {
            self.change_trial(trial_id, change);
            let trial = self.book.trial(trial_id);
            let (state, attempt) = (trial.state, trial.attempts.len() as u32);
            self.push_event(
                now,
                trial_id,
                state,
                attempt,
                format!("admin {who}: {what} ({why})"),
            );
        }
        info!(%who, %why, trials = targets.len(), action = %what, "admin action");
        self.schedule(now);
        Ok((
            targets.len() as u32,
            format!("{} trials {what}", targets.len()),
        ))
    }

    /// One trial's record and its standing with the policy core changed.
    fn change_trial(&mut self, trial_id: TrialId, change: &TrialChange) {
        let trial = self.book.trial_mut(trial_id).expect("targets exist");
        match change {
            TrialChange::Priority(value) => trial.priority_override = Some(*value),
            TrialChange::Hold => trial.held = true,
            TrialChange::Release => trial.held = false,
            TrialChange::Move(queue) => trial.queue_override = Some(queue.clone()),
        }
        self.placement.mark_stale();
        let policy = self.placement.policy_mut();
        // Whether the policy core held the trial does not matter: its record
        // holds the change, and the trial is handed over with it when it waits.
        match change {
            TrialChange::Priority(value) => {
                policy.set_priority(trial_id, *value);
            }
            TrialChange::Hold => {
                policy.hold(trial_id);
            }
            TrialChange::Release => {
                policy.release_hold(trial_id);
            }
            TrialChange::Move(queue) => {
                if let Err(refusal) = policy.move_to_queue(trial_id, queue) {
                    debug!(%trial_id, %refusal, "queue change takes effect when it waits again");
                }
            }
        }
    }

    /// The unfinished trials an admin names: one trial id, or an experiment.
    fn admin_targets(&self, id: &str) -> Result<Vec<TrialId>, CoreError> {
        let ids: Vec<TrialId> = if let Ok(trial_id) = id.parse::<TrialId>() {
            if !self.book.contains_trial(trial_id) {
                return Err(CoreError::TrialNotFound { trial_id });
            }
            vec![trial_id]
        } else {
            let experiment = self.resolve_experiment(id)?;
            self.book.trials_of(experiment).map(|(id, _)| *id).collect()
        };
        Ok(ids
            .into_iter()
            .filter(|id| !self.book.trial(*id).state.is_terminal())
            .collect())
    }
}
