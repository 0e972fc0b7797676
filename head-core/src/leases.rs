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

use std::collections::BTreeMap;

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
use crate::state::{Approvals, Involved};

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
            self.book
                .get_spec(trial.experiment)
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
        for trial in self.book.trials() {
            if trial.reused_from.is_some() {
                continue;
            }
            let keys = resources.entry(trial.id.experiment).or_insert_with(|| {
                self.book
                    .get_spec(trial.id.experiment)
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
            if waited && let Some(trial) = self.book.trial_mut(trial_id) {
                trial.waited = true;
            }
        }
        self.sync_approvals(now);
    }

    /// Records new pending requests and withdraws records the core no longer
    /// holds pending, telling the trials involved.
    fn sync_approvals(&mut self, now: UnixMillis) {
        let pending = self.placement.policy().approval_requests();
        let (added, withdrawn) = self
            .approvals
            .sync(now, &pending, |request| reason_text(&request.reason));
        for request in &added {
            let why = reason_text(&request.reason);
            info!(request = request.id, victim = %request.victim, claimant = %request.claimant, "preemption awaits approval");
            let text = format!(
                "preemption of {} for {} awaits an admin's approval (request {}): {why}",
                request.victim, request.claimant, request.id
            );
            self.trial_note(now, request.victim, &text);
            self.trial_note(now, request.claimant, &text);
        }
        for Involved {
            id,
            victim,
            claimant,
        } in &withdrawn
        {
            let text =
                format!("preemption request {id} withdrawn: {victim} or {claimant} left its place");
            self.trial_note(now, *victim, &text);
            self.trial_note(now, *claimant, &text);
        }
        if !added.is_empty() || !withdrawn.is_empty() {
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
        self.approvals.decide(now, request, state, who, why);
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
        let (approvals, changed) = Approvals::restore(records, now);
        self.approvals = approvals;
        let next = self.approvals.next_id();
        self.placement.policy_mut().set_next_approval_id(next);
        let unfinished = |trial: TrialId| {
            self.book
                .get_trial(trial)
                .is_some_and(|trial| !trial.state.is_terminal())
        };
        let standing: Vec<(u64, TrialId, TrialId)> = self
            .approvals
            .records()
            .iter()
            .filter(|record| record.state == ApprovalState::Denied)
            .filter(|record| unfinished(record.victim) && unfinished(record.claimant))
            .map(|record| (record.id, record.victim, record.claimant))
            .collect();
        for (id, victim, claimant) in standing {
            self.placement
                .policy_mut()
                .restore_denial(id, victim, claimant);
        }
        if changed {
            self.persist_approvals();
        }
    }

    /// Drops the oldest resolved approval records past the bound
    /// (`Approvals::trim`); a denial stands while both its trials are unfinished.
    pub(super) fn trim_approvals(&mut self) {
        let book = &self.book;
        self.approvals.trim(|trial| {
            book.get_trial(trial)
                .is_some_and(|trial| !trial.state.is_terminal())
        });
    }

    /// Writes the approval records with the policy record.
    pub(super) fn persist_approvals(&mut self) {
        let approvals = self.approvals.records().to_vec();
        if let Some(policy) = self.placement.record_mut() {
            policy.approvals = approvals;
        }
    }

    /// An event on a trial in its current state.
    fn trial_note(&mut self, now: UnixMillis, trial_id: TrialId, text: &str) {
        let Some(trial) = self.book.get_trial(trial_id) else {
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
