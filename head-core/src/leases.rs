//! Leases and arbitration by a person, as the head serves them: refusing a
//! submission that names an undeclared lease, the `xp leases` report with its
//! conflict odds, and the life of preemption approval requests (asked,
//! approved, denied, withdrawn), each a trial event and persisted.
//!
//! The policy core decides which preemptions need approval and keeps the
//! pending set; this module mirrors it into [`ApprovalRecord`]s kept with the
//! policy record, tells the trials involved, and carries out an admin's
//! verdict. Invariant: every request the core holds pending has a `Pending`
//! record, and every `Pending` record names a request the core holds (after a
//! restart the core asks afresh under new ids, and the old records are
//! marked withdrawn).

use std::collections::{BTreeMap, BTreeSet};

use tracing::info;
use xp_runtime::clock::UnixMillis;
use xp_runtime::ids::TrialId;
use xp_runtime::protocol::{
    ApprovalStatus, ConflictOdds, LeaseClaim, LeaseReport, LeaseStatus, TrialState,
};
use xp_runtime::spec::ExperimentSpec;
use xp_sched::odds::{any_of_n_conflict, observed_wait_probability};
use xp_sched::{ApprovalRequest, ApprovalVerdict, PreemptReason};

use super::records::{ApprovalRecord, ApprovalState};
use super::{CoreError, HeadCore};

/// The most resolved approval records kept (the newest); pending ones and
/// standing denials are always kept. Decisions stay in the trials' events and the audit trail.
pub(super) const MAX_DECIDED_APPROVALS: usize = 1000;

impl HeadCore {
    /// Refuses a spec whose trials name a lease the policy does not declare,
    /// or more units than it has: such a trial could never start.
    pub(super) fn check_leases(&self, spec: &ExperimentSpec) -> Result<(), CoreError> {
        let declared = &self.placement.policy().config().leases;
        for (name, units) in &spec.trial.resources.leases {
            let Some(capacity) = declared.get(name) else {
                return Err(CoreError::UnknownLease {
                    lease: name.clone(),
                    reason: "the scheduling policy declares no such lease".to_owned(),
                });
            };
            if units > capacity {
                return Err(CoreError::UnknownLease {
                    lease: name.clone(),
                    reason: format!("asks for {units} units of a capacity of {capacity}"),
                });
            }
        }
        Ok(())
    }

    /// Every lease with holders and waiters, the pending approvals and the
    /// conflict odds, for `xp leases` and `xp queue`. Holders, waiters and
    /// approvals are those of trials whose team `visible_team` shows (an
    /// approval when either of its trials' is: both trials' events already
    /// name it); the counts (units held, holders, waiters) and the odds cover
    /// every team, so a viewer sees how contended a lease is without seeing
    /// whose work contends.
    pub fn lease_report(&self, visible_team: &dyn Fn(&str) -> bool) -> LeaseReport {
        let shown = |trial: TrialId| {
            self.specs
                .get(&trial.experiment)
                .is_some_and(|spec| visible_team(&spec.team))
        };
        let claims = |claims: Vec<xp_sched::LeaseHolder>| -> Vec<LeaseClaim> {
            claims
                .into_iter()
                .filter(|holder| visible_team(&holder.team))
                .map(|holder| LeaseClaim {
                    trial: holder.trial,
                    team: holder.team,
                    units: holder.units,
                })
                .collect()
        };
        let leases = self
            .placement
            .policy()
            .leases()
            .into_iter()
            .map(|lease| LeaseStatus {
                name: lease.name,
                capacity: lease.capacity,
                held: lease.held,
                holding: lease.holders.len() as u64,
                waiting: lease.waiters.len() as u64,
                holders: claims(lease.holders),
                waiters: claims(lease.waiters),
            })
            .collect();
        let approvals = self
            .placement
            .policy()
            .approval_requests()
            .into_iter()
            .filter(|request| shown(request.victim) || shown(request.claimant))
            .map(|request| ApprovalStatus {
                id: request.id,
                victim: request.victim,
                claimant: request.claimant,
                why: reason_text(&request.reason),
                at: request.at,
            })
            .collect();
        let odds = self.conflict_odds();
        let none: f64 = odds
            .iter()
            .map(|odds| 1.0 - odds.any_conflict)
            .product::<f64>();
        LeaseReport {
            leases,
            approvals,
            odds,
            any_conflict: (1.0 - none).clamp(0.0, 1.0),
        }
    }

    /// Per lease and GPU model, from the trial records: how many trials asked
    /// for it (placed at least once, or waited), how many of them waited at
    /// least one scheduling pass, and the chance that one of those waiting
    /// now conflicts.
    fn conflict_odds(&self) -> Vec<ConflictOdds> {
        #[derive(Default)]
        struct Count {
            requests: u64,
            waited: u64,
            waiting_now: u64,
        }
        let mut counts: BTreeMap<String, Count> = self
            .placement
            .policy()
            .config()
            .leases
            .keys()
            .map(|name| (format!("lease {name}"), Count::default()))
            .collect();
        let mut resources: BTreeMap<_, Vec<String>> = BTreeMap::new();
        for trial in self.trials.values() {
            if trial.reused_from.is_some() {
                continue;
            }
            let keys = resources.entry(trial.id.experiment).or_insert_with(|| {
                self.specs
                    .get(&trial.id.experiment)
                    .map(contended_resources)
                    .unwrap_or_default()
            });
            if keys.is_empty() {
                continue;
            }
            let asked = trial.waited || !trial.attempts.is_empty();
            let waiting = trial.state == TrialState::Queued && !trial.held;
            for key in keys.iter() {
                let count = counts.entry(key.clone()).or_default();
                count.requests += u64::from(asked);
                count.waited += u64::from(trial.waited);
                count.waiting_now += u64::from(waiting);
            }
        }
        counts
            .into_iter()
            .map(|(resource, count)| {
                let p = observed_wait_probability(count.requests, count.waited);
                ConflictOdds {
                    resource,
                    requests: count.requests,
                    waited: count.waited,
                    p,
                    waiting_now: count.waiting_now,
                    any_conflict: any_of_n_conflict(p.unwrap_or(0.0), count.waiting_now),
                }
            })
            .collect()
    }

    /// After a pass: marks trials that waited through it (for the conflict
    /// odds), and mirrors the core's pending approval requests into records,
    /// telling the trials involved of new and withdrawn ones.
    pub(super) fn after_decide(&mut self, now: UnixMillis) {
        for (trial_id, waited) in self.placement.judge_first_pass() {
            if waited && let Some(trial) = self.trials.get_mut(&trial_id) {
                trial.waited = true;
                self.dirty_trials.insert(trial_id);
            }
        }
        self.sync_approvals(now);
    }

    /// Records new pending requests and withdraws records the core no longer
    /// holds pending.
    fn sync_approvals(&mut self, now: UnixMillis) {
        let pending = self.placement.policy().approval_requests();
        let pending_ids: BTreeSet<u64> = pending.iter().map(|request| request.id).collect();
        let known: BTreeSet<u64> = self.approvals.iter().map(|record| record.id).collect();
        let mut changed = false;
        for request in pending
            .iter()
            .filter(|request| !known.contains(&request.id))
        {
            let why = reason_text(&request.reason);
            info!(request = request.id, victim = %request.victim, claimant = %request.claimant, "preemption awaits approval");
            self.approvals.push(ApprovalRecord {
                id: request.id,
                victim: request.victim,
                claimant: request.claimant,
                why: why.clone(),
                at: request.at,
                state: ApprovalState::Pending,
                decided_by: None,
                decided_why: None,
                decided_at: None,
            });
            let text = format!(
                "preemption of {} for {} awaits an admin's approval (request {}): {why}",
                request.victim, request.claimant, request.id
            );
            self.trial_note(now, request.victim, &text);
            self.trial_note(now, request.claimant, &text);
            changed = true;
        }
        let mut withdrawn = Vec::new();
        for record in &mut self.approvals {
            if record.state == ApprovalState::Pending && !pending_ids.contains(&record.id) {
                record.state = ApprovalState::Withdrawn;
                record.decided_at = Some(now);
                withdrawn.push((record.id, record.victim, record.claimant));
            }
        }
        for (id, victim, claimant) in withdrawn {
            let text =
                format!("preemption request {id} withdrawn: {victim} or {claimant} left its place");
            self.trial_note(now, victim, &text);
            self.trial_note(now, claimant, &text);
            changed = true;
        }
        if changed {
            self.trim_approvals();
            self.persist_approvals();
        }
    }

    /// Carries out an admin's verdict on a pending request: the trials get an
    /// event naming who and why, and the next pass acts on it.
    pub(super) fn arbitrate(
        &mut self,
        now: UnixMillis,
        request: u64,
        verdict: ApprovalVerdict,
        who: &str,
        why: &str,
    ) -> Result<ApprovalRequest, CoreError> {
        let decided = self
            .placement
            .policy_mut()
            .decide_approval(request, verdict)?;
        let (state, word) = match verdict {
            ApprovalVerdict::Approve => (ApprovalState::Approved, "approved"),
            ApprovalVerdict::Deny => (ApprovalState::Denied, "denied"),
        };
        if let Some(record) = self
            .approvals
            .iter_mut()
            .find(|record| record.id == request)
        {
            record.state = state;
            record.decided_by = Some(who.to_owned());
            record.decided_why = Some(why.to_owned());
            record.decided_at = Some(now);
        }
        let text = format!(
            "admin {who}: {word} preemption request {request} of {} for {} ({why})",
            decided.victim, decided.claimant
        );
        self.trial_note(now, decided.victim, &text);
        self.trial_note(now, decided.claimant, &text);
        self.persist_approvals();
        self.placement.mark_stale();
        info!(%who, %why, request, verdict = word, "preemption request decided");
        Ok(decided)
    }

    /// Takes back the approval records a restarted head finds: pending ones
    /// are withdrawn (the core asks again under new ids), denials still
    /// standing hold, and new ids follow the largest one used.
    pub(super) fn restore_approvals(&mut self, records: Vec<ApprovalRecord>, now: UnixMillis) {
        let next = records
            .iter()
            .map(|record| record.id + 1)
            .max()
            .unwrap_or(1);
        self.placement.policy_mut().set_next_approval_id(next);
        self.approvals = records;
        let mut changed = false;
        for record in &mut self.approvals {
            match record.state {
                ApprovalState::Pending => {
                    record.state = ApprovalState::Withdrawn;
                    record.decided_at = Some(now);
                    changed = true;
                }
                ApprovalState::Denied => {
                    let unfinished = |trial: TrialId| {
                        self.trials
                            .get(&trial)
                            .is_some_and(|trial| !trial.state.is_terminal())
                    };
                    if unfinished(record.victim) && unfinished(record.claimant) {
                        self.placement.policy_mut().restore_denial(
                            record.id,
                            record.victim,
                            record.claimant,
                        );
                    }
                }
                ApprovalState::Approved | ApprovalState::Withdrawn => {}
            }
        }
        if changed {
            self.persist_approvals();
        }
    }

    /// Keeps every standing record (pending, or a denial whose victim and
    /// claimant are both still unfinished: the policy core holds it, and a
    /// restart restores it from here) and the newest resolved ones, dropping
    /// the oldest resolved first. Standing denials need no count bound: each
    /// names two live trials and ends with either.
    pub(super) fn trim_approvals(&mut self) {
        let unfinished = |trial: &TrialId| {
            self.trials
                .get(trial)
                .is_some_and(|trial| !trial.state.is_terminal())
        };
        let standing: Vec<bool> = self
            .approvals
            .iter()
            .map(|record| match record.state {
                ApprovalState::Pending => true,
                ApprovalState::Denied => unfinished(&record.victim) && unfinished(&record.claimant),
                ApprovalState::Approved | ApprovalState::Withdrawn => false,
            })
            .collect();
        let resolved = standing.iter().filter(|standing| !**standing).count();
        let mut excess = resolved.saturating_sub(MAX_DECIDED_APPROVALS);
        // Records are kept in the order they were asked, so this drops the
        // oldest resolved ones.
        let mut standing = standing.into_iter();
        self.approvals.retain(|_| {
            let standing = standing.next().unwrap_or(true);
            if excess > 0 && !standing {
                excess -= 1;
                return false;
            }
            true
        });
    }

    /// Writes the approval records with the policy record.
    pub(super) fn persist_approvals(&mut self) {
        let approvals = self.approvals.clone();
        if let Some(policy) = self.placement.record_mut() {
            policy.approvals = approvals;
        }
    }

    /// An event on a trial in its current state.
    fn trial_note(&mut self, now: UnixMillis, trial_id: TrialId, text: &str) {
        let Some(trial) = self.trials.get(&trial_id) else {
            return;
        };
        let (state, attempt) = (trial.state, trial.attempts.len() as u32);
        self.push_event(now, trial_id, state, attempt, text.to_owned());
    }
}

/// A preemption's reason in words.
fn reason_text(reason: &PreemptReason) -> String {
    match reason {
        PreemptReason::HigherPriority { by, priority } => {
            format!("{by} (priority {priority}) needs its room")
        }
        PreemptReason::Reclaim { queue, by } => {
            format!("queue {queue} reclaims its quota for {by}")
        }
        PreemptReason::LessService { by, level, .. } => {
            format!("{by} (attained-service level {level}) needs its room")
        }
    }
}

/// The contended resources a trial of `spec` asks for: `lease NAME` per lease,
/// and `gpu MODEL` per acceptable model (`gpu any` when it names none) when
/// it asks for GPUs.
fn contended_resources(spec: &ExperimentSpec) -> Vec<String> {
    let mut keys: Vec<String> = spec
        .trial
        .resources
        .leases
        .keys()
        .map(|name| format!("lease {name}"))
        .collect();
    if spec.trial.gpu_milli() > 0 {
        if spec.trial.gpu_models.is_empty() {
            keys.push("gpu any".to_owned());
        } else {
            keys.extend(
                spec.trial
                    .gpu_models
                    .iter()
                    .map(|model| format!("gpu {model}")),
            );
        }
    }
    keys
}
