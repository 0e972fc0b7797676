//! Preemption approval records: the requests the policy core raised for a
//! person to decide, pending and recently decided, persisted with the policy
//! record (`leases` tells the trials involved and the policy core).
//!
//! Invariants: a record is added once per request id, in the order asked;
//! pending records and standing denials are always kept, and at most
//! `MAX_DECIDED_APPROVALS` resolved ones (the newest).

use std::collections::BTreeSet;

use xp_runtime::clock::UnixMillis;
use xp_runtime::ids::TrialId;
use xp_sched::ApprovalRequest;

use crate::records::{ApprovalRecord, ApprovalState};

/// The most resolved approval records kept (the newest); pending ones and
/// standing denials are always kept. Decisions stay in the trials' events and
/// the audit trail.
pub(crate) const MAX_DECIDED_APPROVALS: usize = 1000;

/// A request whose record changed in a sync, named by its two trials.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Involved {
    /// The request.
    pub(crate) id: u64,
    /// The running trial that would be stopped.
    pub(crate) victim: TrialId,
    /// The waiting trial that wanted its room.
    pub(crate) claimant: TrialId,
}

/// The approval records.
#[derive(Debug, Default)]
pub(crate) struct Approvals {
    records: Vec<ApprovalRecord>,
}

impl Approvals {
    /// The records a restarted head found: pending ones are withdrawn at
    /// `now` (the policy core asks again under new ids). Returns the records
    /// and whether any changed.
    pub(crate) fn restore(records: Vec<ApprovalRecord>, now: UnixMillis) -> (Self, bool) {
        let mut approvals = Self { records };
        let mut changed = false;
        for record in &mut approvals.records {
            if record.state == ApprovalState::Pending {
                record.state = ApprovalState::Withdrawn;
                record.decided_at = Some(now);
                changed = true;
            }
        }
        (approvals, changed)
    }

    /// Approvals holding exactly `records`, for tests that need a given history.
    #[cfg(test)]
    pub(crate) fn from_records(records: Vec<ApprovalRecord>) -> Self {
        Self { records }
    }

    /// Every record, in the order asked.
    pub(crate) fn records(&self) -> &[ApprovalRecord] {
        &self.records
    }

    /// The id after the largest one used.
    pub(crate) fn next_id(&self) -> u64 {
        self.records
            .iter()
            .map(|record| record.id + 1)
            .max()
            .unwrap_or(1)
    }

    /// Brings the records in line with the requests the policy core holds
    /// pending: a record for each new one (its reason in words from
    /// `describe`), and pending records it no longer holds withdrawn at
    /// `now`. Returns the new requests and the withdrawn ones.
    pub(crate) fn sync(
        &mut self,
        now: UnixMillis,
        pending: &[ApprovalRequest],
        describe: impl Fn(&ApprovalRequest) -> String,
    ) -> (Vec<ApprovalRequest>, Vec<Involved>) {
        let pending_ids: BTreeSet<u64> = pending.iter().map(|request| request.id).collect();
        let known: BTreeSet<u64> = self.records.iter().map(|record| record.id).collect();
        let added: Vec<ApprovalRequest> = pending
            .iter()
            .filter(|request| !known.contains(&request.id))
            .cloned()
            .collect();
        for request in &added {
            self.records.push(ApprovalRecord {
                id: request.id,
                victim: request.victim,
                claimant: request.claimant,
                why: describe(request),
                at: request.at,
                state: ApprovalState::Pending,
                decided_by: None,
                decided_why: None,
                decided_at: None,
            });
        }
        let mut withdrawn = Vec::new();
        for record in &mut self.records {
            if record.state == ApprovalState::Pending && !pending_ids.contains(&record.id) {
                record.state = ApprovalState::Withdrawn;
                record.decided_at = Some(now);
                withdrawn.push(Involved {
                    id: record.id,
                    victim: record.victim,
                    claimant: record.claimant,
                });
            }
        }
        (added, withdrawn)
    }

    /// A person decided request `id`.
    pub(crate) fn decide(
        &mut self,
        now: UnixMillis,
        id: u64,
        state: ApprovalState,
        who: &str,
        why: &str,
    ) {
        if let Some(record) = self.records.iter_mut().find(|record| record.id == id) {
            record.state = state;
            record.decided_by = Some(who.to_owned());
            record.decided_why = Some(why.to_owned());
            record.decided_at = Some(now);
        }
    }

    /// Keeps every standing record (pending, or a denial whose victim and
    /// claimant are both `unfinished`: the policy core holds it, and a restart
    /// restores it from here) and the newest resolved ones, dropping the
    /// oldest resolved first. Standing denials need no count bound: each names
    /// two live trials and ends with either.
    pub(crate) fn trim(&mut self, unfinished: impl Fn(TrialId) -> bool) {
        let standing: Vec<bool> = self
            .records
            .iter()
            .map(|record| match record.state {
                ApprovalState::Pending => true,
                ApprovalState::Denied => unfinished(record.victim) && unfinished(record.claimant),
                ApprovalState::Approved | ApprovalState::Withdrawn => false,
            })
            .collect();
        let resolved = standing.iter().filter(|standing| !**standing).count();
        let mut excess = resolved.saturating_sub(MAX_DECIDED_APPROVALS);
        // Records are kept in the order they were asked, so this drops the
        // oldest resolved ones.
        let mut standing = standing.into_iter();
        self.records.retain(|_| {
            let standing = standing.next().unwrap_or(true);
            if excess > 0 && !standing {
                excess -= 1;
                return false;
            }
            true
        });
    }
}

#[cfg(test)]
mod tests {
    use xp_runtime::ids::ExperimentId;
    use xp_sched::PreemptReason;

    use super::*;

    fn trial(index: u32) -> TrialId {
        TrialId {
            experiment: ExperimentId::from_content_hash(&[1; 32], 1),
            index,
        }
    }

    fn request(id: u64) -> ApprovalRequest {
        ApprovalRequest {
            id,
            victim: trial(0),
            claimant: trial(1),
            reason: PreemptReason::HigherPriority {
                by: trial(1),
                priority: 10,
            },
            at: 5,
        }
    }

    fn states(approvals: &Approvals) -> Vec<(u64, ApprovalState)> {
        approvals
            .records()
            .iter()
            .map(|record| (record.id, record.state))
            .collect()
    }

    #[test]
    fn records_follow_the_pending_requests_and_a_restart_withdraws_them() {
        let mut approvals = Approvals::default();
        let (added, withdrawn) =
            approvals.sync(10, &[request(1), request(2)], |_| "why".to_owned());
        assert_eq!(added.len(), 2);
        assert!(withdrawn.is_empty());
        let (added, withdrawn) = approvals.sync(11, &[request(2)], |_| "why".to_owned());
        assert!(added.is_empty(), "a request is recorded once");
        assert_eq!(
            withdrawn.iter().map(|gone| gone.id).collect::<Vec<_>>(),
            [1]
        );
        approvals.decide(12, 2, ApprovalState::Denied, "ana", "not now");
        assert_eq!(
            states(&approvals),
            [(1, ApprovalState::Withdrawn), (2, ApprovalState::Denied)]
        );
        assert_eq!(approvals.next_id(), 3);
        approvals.sync(13, &[request(3)], |_| "why".to_owned());
        let (restored, changed) = Approvals::restore(approvals.records().to_vec(), 20);
        assert!(changed, "the pending request 3 is withdrawn");
        assert_eq!(states(&restored)[2], (3, ApprovalState::Withdrawn));
    }

    #[test]
    fn trimming_keeps_standing_records_and_the_newest_resolved() {
        let mut approvals = Approvals::default();
        let requests: Vec<ApprovalRequest> = (1..=MAX_DECIDED_APPROVALS as u64 + 3)
            .map(request)
            .collect();
        approvals.sync(0, &requests, |_| String::new());
        approvals.decide(1, 1, ApprovalState::Denied, "ana", "");
        approvals.sync(2, &requests[1..2], |_| String::new());
        approvals.trim(|_| true);
        let kept = states(&approvals);
        assert_eq!(
            kept[0],
            (1, ApprovalState::Denied),
            "a standing denial stays"
        );
        assert_eq!(
            kept[1],
            (2, ApprovalState::Pending),
            "a pending request stays"
        );
        assert_eq!(
            kept.len(),
            MAX_DECIDED_APPROVALS + 2,
            "only the oldest withdrawn went"
        );
        assert_eq!(kept[2].0, 4);
    }
}
