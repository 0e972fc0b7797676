//! Placement: the policy core (`xp_sched::PolicyCore`, the one owner of what
//! every node has allocated) and what keeps it in step with the trials: the
//! policy text in force, the trials whose standing may have changed, whether a
//! decision pass would find anything new, the trials whose first pass is not
//! judged yet, and the `MASTER_PORT`s of live attempts.
//!
//! Not here: what the core tells the policy of each trial and carries out of
//! its decisions (`scheduling`, `launch`); this keeps the books those steps use.
//!
//! Invariants: a pass runs only when something it decides on changed
//! (`mark_stale`; a tick marks the passing of time), and each pass is counted
//! (`decisions_made`), so the shell can time the calls that ran one; the policy
//! record is handed out for persisting once per change.

use std::collections::BTreeSet;

use xp_runtime::clock::UnixMillis;
use xp_runtime::ids::{NodeId, TrialId};
use xp_sched::{Decision, PolicyConfig, PolicyCore, WaitReason};

use super::MasterPorts;
use crate::PolicyRecord;

/// The policy core and its bookkeeping.
#[derive(Debug)]
pub(crate) struct Placement {
    policy: PolicyCore,
    /// The policy text in force, when one was applied.
    record: Option<PolicyRecord>,
    record_changed: bool,
    /// Trials whose standing with the policy core may have changed since the
    /// last pass (workers released, state changed).
    unsettled: BTreeSet<TrialId>,
    /// Trials that may be queued without the policy core holding them: their
    /// standing changed, they were restored, or the core refused them for now.
    /// A pass hands over these, not every trial of the book.
    handover: BTreeSet<TrialId>,
    /// Something the policy core decides on changed since its last pass.
    stale: bool,
    /// Trials handed to the policy core whose first pass is not judged yet:
    /// whether they wait through it sets `TrialRecord::waited` (soft state; a
    /// restart hands every queued trial over again).
    first_pass: BTreeSet<TrialId>,
    master_ports: MasterPorts,
    decisions_made: u64,
}

impl Default for Placement {
    fn default() -> Self {
        Self::new(PolicyConfig::default(), None)
    }
}

impl Placement {
    /// A placement under `config`, the policy `record` applied (none: the
    /// default). The first pass is due at once.
    pub(crate) fn new(config: PolicyConfig, record: Option<PolicyRecord>) -> Self {
        Self {
            policy: PolicyCore::new(config),
            record,
            record_changed: false,
            unsettled: BTreeSet::new(),
            handover: BTreeSet::new(),
            stale: true,
            first_pass: BTreeSet::new(),
            master_ports: MasterPorts::default(),
            decisions_made: 0,
        }
    }

    /// The policy core, to read.
    pub(crate) fn policy(&self) -> &PolicyCore {
        &self.policy
    }

    /// The policy core, to change. Not every change is one a pass decides on
    /// (an urgency, a checkpoint time), so the caller says when it is
    /// (`mark_stale`).
    pub(crate) fn policy_mut(&mut self) -> &mut PolicyCore {
        &mut self.policy
    }

    /// Something the policy decides on changed: the next pass runs.
    pub(crate) fn mark_stale(&mut self) {
        self.stale = true;
    }

    /// `trial` waits again.
    pub(crate) fn requeue(&mut self, trial: TrialId, now: UnixMillis) {
        self.policy.requeue(trial, now);
        self.stale = true;
    }

    /// `trial` leaves the policy core (it ended).
    pub(crate) fn finish(&mut self, trial: TrialId, now: UnixMillis, succeeded: bool) {
        self.policy.finish(trial, now, succeeded);
        self.stale = true;
    }

    /// Whether work may be placed on `node`.
    pub(crate) fn set_schedulable(&mut self, node: NodeId, schedulable: bool) {
        self.policy.set_node_schedulable(node, schedulable);
        self.stale = true;
    }

    /// Runs a pass when something changed since the last: the policy core's
    /// decisions, or `None` when nothing could have changed them.
    pub(crate) fn decide(&mut self, now: UnixMillis) -> Option<Vec<Decision>> {
        if !std::mem::take(&mut self.stale) {
            return None;
        }
        self.decisions_made += 1;
        Some(self.policy.decide(now))
    }

    /// How many passes ran.
    pub(crate) fn decisions_made(&self) -> u64 {
        self.decisions_made
    }

    /// `trial`'s standing with the policy core may have changed.
    pub(crate) fn unsettle(&mut self, trial: TrialId) {
        self.unsettled.insert(trial);
        self.handover.insert(trial);
    }

    /// `trial` may be queued without the policy core holding it: the next
    /// pass hands it over if so.
    pub(crate) fn offer(&mut self, trial: TrialId) {
        self.handover.insert(trial);
    }

    /// Whether `trial` was offered since the last pass (for the invariants).
    pub(crate) fn is_offered(&self, trial: TrialId) -> bool {
        self.handover.contains(&trial)
    }

    /// The trials offered since the last call (see [`Placement::offer`]).
    pub(crate) fn take_offered(&mut self) -> BTreeSet<TrialId> {
        std::mem::take(&mut self.handover)
    }

    /// The trials whose standing may have changed since the last call.
    pub(crate) fn take_unsettled(&mut self) -> BTreeSet<TrialId> {
        std::mem::take(&mut self.unsettled)
    }

    /// `trial` was handed over and has not been judged by a pass yet.
    pub(crate) fn await_first_pass(&mut self, trial: TrialId) {
        self.first_pass.insert(trial);
    }

    /// After a pass: the trials judged, each with whether it waited through
    /// its first pass (placed, or gone from the policy: it did not; held by an
    /// admin or not considered yet: not judged). Only trials not judged yet
    /// are looked at, so a pass costs what is new, not every waiting trial.
    pub(crate) fn judge_first_pass(&mut self) -> Vec<(TrialId, bool)> {
        let mut judged = Vec::new();
        for &trial in &self.first_pass {
            if self.policy.placement(trial).is_some() {
                judged.push((trial, false));
                continue;
            }
            match self.policy.wait_reason(trial) {
                Some(WaitReason::NotYetConsidered | WaitReason::Held) => {}
                Some(_) => judged.push((trial, true)),
                None => judged.push((trial, false)),
            }
        }
        for (trial, _) in &judged {
            self.first_pass.remove(trial);
        }
        judged
    }

    /// The `MASTER_PORT`s of live attempts.
    pub(crate) fn master_ports(&mut self) -> &mut MasterPorts {
        &mut self.master_ports
    }

    /// The policy text in force, when one was applied.
    pub(crate) fn record(&self) -> Option<&PolicyRecord> {
        self.record.as_ref()
    }

    /// The policy text in force changed (a new policy, its approvals): to persist.
    pub(crate) fn record_mut(&mut self) -> Option<&mut PolicyRecord> {
        self.record_changed |= self.record.is_some();
        self.record.as_mut()
    }

    /// A new policy text is in force.
    pub(crate) fn set_record(&mut self, record: PolicyRecord) {
        self.record = Some(record);
        self.record_changed = true;
    }

    /// The policy record, when it changed since the last call.
    pub(crate) fn take_changed_record(&mut self) -> Option<PolicyRecord> {
        std::mem::take(&mut self.record_changed)
            .then(|| self.record.clone())
            .flatten()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_pass_runs_only_after_a_change_and_is_counted() {
        let mut placement = Placement::default();
        assert!(
            placement.decide(0).is_some(),
            "the first pass is due at once"
        );
        assert!(placement.decide(1).is_none(), "nothing changed");
        placement.mark_stale();
        assert!(placement.decide(2).is_some());
        assert_eq!(placement.decisions_made(), 2);
    }

    #[test]
    fn the_policy_record_is_handed_out_once_per_change() {
        let mut placement = Placement::default();
        assert!(placement.record_mut().is_none());
        assert!(
            placement.take_changed_record().is_none(),
            "no record, nothing to store"
        );
        placement.set_record(PolicyRecord {
            yaml: "{}".to_owned(),
            applied_by: "ana".to_owned(),
            why: String::new(),
            at: 1,
            approvals: Vec::new(),
        });
        assert!(placement.take_changed_record().is_some());
        assert!(placement.take_changed_record().is_none());
        placement.record_mut().expect("in force").at = 2;
        assert_eq!(
            placement.take_changed_record().map(|record| record.at),
            Some(2)
        );
    }

    #[test]
    fn unsettled_trials_are_handed_out_once() {
        let mut placement = Placement::default();
        let trial = TrialId {
            experiment: xp_runtime::ids::ExperimentId::from_content_hash(&[1; 32], 1),
            index: 0,
        };
        placement.unsettle(trial);
        placement.unsettle(trial);
        assert_eq!(placement.take_unsettled(), BTreeSet::from([trial]));
        assert!(placement.take_unsettled().is_empty());
        // A trial the policy never saw is gone from it: judged as not waiting.
        placement.await_first_pass(trial);
        assert_eq!(placement.judge_first_pass(), [(trial, false)]);
        assert!(placement.judge_first_pass().is_empty());
    }
}
