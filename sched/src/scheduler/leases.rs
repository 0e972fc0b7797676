//! Leases and manual approval: whether a trial's lease units are free, lease
//! quotas, what each lease's holders and waiters are, and preemptions that
//! wait for an admin.
//!
//! # Leases
//!
//! A lease is a named shared thing with a capacity in units (the policy's
//! `leases`). A trial's gang asks for units of some leases (once for the gang).
//! It is placed only when, for every lease it names, its units fit in the
//! capacity less what placed trials hold (running and stopping alike: a victim
//! still holds its units until it is gone) less what trials waiting on
//! preemption have reserved. Held units are derived from the trial table (the
//! index), so they are released exactly when a placement is: on requeue and
//! finish, which the caller reports once the last worker is gone. A trial that
//! finds its lease short waits with `waiting for lease NAME` and, for the rest
//! of the pass, so does every later trial that names the same lease: a small
//! request does not overtake a larger one that came first, while trials that
//! need other things go on. A queue's `quota.leases` caps its trials' units
//! (held plus reserved).
//!
//! # Manual approval
//!
//! When the victims chosen for a preemption include trials of a queue with
//! `preemption: {approval: manual}`, nothing is stopped: each such
//! victim–claimant pair not approved yet becomes a pending [`ApprovalRequest`]
//! (asked once; later passes find it pending) and the claimant waits with
//! `WaitingForApproval`. An approval lets the next pass that chooses that
//! victim for that claimant stop it; a denial removes the victim from that
//! claimant's candidates. Pending requests, approvals and denials are
//! forgotten when the victim or the claimant leaves its place (the claimant
//! starts, is held or ends; the victim is requeued or ends), since the
//! situation that led to them is gone; a new policy withdraws pending requests.
//!
//! Invariant: no lease is held beyond its capacity, and no queue beyond its
//! lease quota, unless a new policy lowered them under running work
//! (`check_leases`).

use std::collections::BTreeMap;

use xp_runtime::clock::UnixMillis;
use xp_runtime::ids::TrialId;

use super::PolicyCore;
use super::pass::Pass;
use super::trial::Standing;
use crate::config::{Approval, MAX_LEASE_UNITS, MAX_LEASES};
use crate::{
    ApprovalError, ApprovalRequest, ApprovalVerdict, LeaseHolder, LeaseUsage, PreemptReason,
    Refusal,
};

/// Adds `units` of every lease in `leases` (times `sign`) to `totals`,
/// dropping leases that reach zero so that an index equals its rebuild.
pub(super) fn add_leases(
    totals: &mut BTreeMap<String, u64>,
    leases: &BTreeMap<String, u64>,
    add: bool,
) {
    for (name, units) in leases {
        if *units == 0 {
            continue;
        }
        let entry = totals.entry(name.clone()).or_insert(0);
        *entry = if add {
            entry.saturating_add(*units)
        } else {
            entry.saturating_sub(*units)
        };
        if *entry == 0 {
            totals.remove(name);
        }
    }
}

/// The pending approval requests and the verdicts in force.
#[derive(Debug, Clone, Default)]
pub(super) struct Approvals {
    /// Pending requests by id.
    pub(super) pending: BTreeMap<u64, ApprovalRequest>,
    /// Approved (victim, claimant) pairs not carried out yet.
    approved: BTreeMap<(TrialId, TrialId), u64>,
    /// Denied (victim, claimant) pairs.
    denied: BTreeMap<(TrialId, TrialId), u64>,
    /// The id of the next request.
    next_id: u64,
}

impl Approvals {
    /// Forgets everything that names `trial`, as victim or claimant.
    fn forget(&mut self, trial: TrialId) {
        self.pending
            .retain(|_, request| request.victim != trial && request.claimant != trial);
        self.approved
            .retain(|(victim, claimant), _| *victim != trial && *claimant != trial);
        self.denied
            .retain(|(victim, claimant), _| *victim != trial && *claimant != trial);
    }
}

impl PolicyCore {
    /// Refuses a request whose leases the policy does not declare, or that asks
    /// for more units than a lease has (it could never start).
    pub(super) fn check_leases_of(&self, leases: &BTreeMap<String, u64>) -> Result<(), Refusal> {
        if leases.len() > MAX_LEASES {
            return Err(Refusal::Invalid(format!(
                "{} leases, more than {MAX_LEASES}",
                leases.len()
            )));
        }
        for (name, units) in leases {
            let refuse = |reason: String| Refusal::Lease {
                lease: name.clone(),
                reason,
            };
            let Some(capacity) = self.config.leases.get(name) else {
                return Err(refuse("the policy declares no such lease".to_owned()));
            };
            if *units == 0 || *units > MAX_LEASE_UNITS {
                return Err(refuse(format!("{units} units is not a positive count")));
            }
            if units > capacity {
                return Err(refuse(format!(
                    "asks for {units} units of a capacity of {capacity}"
                )));
            }
        }
        Ok(())
    }

    /// The first lease `id` names that lacks the units it asks for: capacity
    /// less held less reserved by others, or one a trial before it in this pass
    /// waits for.
    pub(super) fn lease_shortage(&self, id: TrialId, pass: Option<&Pass>) -> Option<String> {
        let trial = self.trials.get(&id)?;
        let own = self
            .reservations
            .get(&id)
            .map(|reservation| &reservation.leases);
        trial
            .request
            .gang
            .leases
            .iter()
            .find(|(name, units)| {
                if pass.is_some_and(|pass| pass.lease_blocked.contains(*name)) {
                    return true;
                }
                let capacity = self.config.leases.get(*name).copied().unwrap_or(0);
                let held = self.index.lease_held.get(*name).copied().unwrap_or(0);
                let reserved = self.index.lease_reserved.get(*name).copied().unwrap_or(0);
                let own = own.and_then(|own| own.get(*name)).copied().unwrap_or(0);
                let free = capacity
                    .saturating_sub(held)
                    .saturating_sub(reserved.saturating_sub(own));
                **units > free
            })
            .map(|(name, _)| name.clone())
    }

    /// Whether `id`'s leases fit once `victims` have given theirs back
    /// (capacity less held less reserved by others).
    pub(super) fn leases_fit_with_freed(&self, id: TrialId, victims: &[TrialId]) -> bool {
        let Some(trial) = self.trials.get(&id) else {
            return false;
        };
        trial.request.gang.leases.iter().all(|(name, units)| {
            let capacity = self.config.leases.get(name).copied().unwrap_or(0);
            let held = self.index.lease_held.get(name).copied().unwrap_or(0);
            let reserved = self.index.lease_reserved.get(name).copied().unwrap_or(0);
            let own = self
                .reservations
                .get(&id)
                .and_then(|reservation| reservation.leases.get(name))
                .copied()
                .unwrap_or(0);
            let freed: u64 = victims
                .iter()
                .filter_map(|victim| self.trials.get(victim))
                .filter_map(|victim| victim.request.gang.leases.get(name))
                .sum();
            let free = capacity
                .saturating_sub(held.saturating_sub(freed))
                .saturating_sub(reserved.saturating_sub(own));
            *units <= free
        })
    }

    /// The first lease whose quota in `id`'s queue its units would break
    /// (held plus reserved by the queue's other trials).
    pub(super) fn lease_quota_block(&self, id: TrialId) -> Option<String> {
        let trial = self.trials.get(&id)?;
        let info = &self.queue_info[trial.queue];
        let queue = &self.index.queues[trial.queue];
        let own = self
            .reservations
            .get(&id)
            .map(|reservation| &reservation.leases);
        trial
            .request
            .gang
            .leases
            .iter()
            .find(|(name, units)| {
                let Some(quota) = info.lease_quota.get(*name) else {
                    return false;
                };
                let used = queue.lease_usage.get(*name).copied().unwrap_or(0);
                let reserved = queue.lease_reserved.get(*name).copied().unwrap_or(0);
                let own = own.and_then(|own| own.get(*name)).copied().unwrap_or(0);
                used.saturating_add(reserved.saturating_sub(own))
                    .saturating_add(**units)
                    > *quota
            })
            .map(|(name, _)| name.clone())
    }

    /// Each declared lease with its capacity, holders and waiters (waiting or
    /// held trials that name it), in name order.
    pub fn leases(&self) -> Vec<LeaseUsage> {
        let mut usage: BTreeMap<&str, LeaseUsage> = self
            .config
            .leases
            .iter()
            .map(|(name, capacity)| {
                (
                    name.as_str(),
                    LeaseUsage {
                        name: name.clone(),
                        capacity: *capacity,
                        held: self.index.lease_held.get(name).copied().unwrap_or(0),
                        holders: Vec::new(),
                        waiters: Vec::new(),
                    },
                )
            })
            .collect();
        let mut ids: Vec<&TrialId> = self.trials.keys().collect();
        ids.sort_unstable();
        for id in ids {
            let trial = &self.trials[id];
            for (name, units) in &trial.request.gang.leases {
                let Some(lease) = usage.get_mut(name.as_str()) else {
                    continue;
                };
                let holder = LeaseHolder {
                    trial: *id,
                    team: trial.request.team.clone(),
                    units: *units,
                };
                match trial.standing {
                    Standing::Placed(_) => lease.holders.push(holder),
                    Standing::Waiting | Standing::Held => lease.waiters.push(holder),
                }
            }
        }
        usage.into_values().collect()
    }

    /// Whether stopping `victims` for `claimant` needs approvals not given yet;
    /// if so, asks for them (once per pair) and returns the first pending id.
    pub(super) fn approval_needed(
        &mut self,
        claimant: TrialId,
        victims: &[(TrialId, PreemptReason)],
        now: UnixMillis,
    ) -> Option<u64> {
        let mut first = None;
        for (victim, reason) in victims {
            let manual = self.trials.get(victim).is_some_and(|trial| {
                self.config
                    .queue(&self.queue_info[trial.queue].name)
                    .is_some_and(|queue| queue.preemption.approval == Approval::Manual)
            });
            if !manual || self.approvals.approved.contains_key(&(*victim, claimant)) {
                continue;
            }
            let existing = self
                .approvals
                .pending
                .values()
                .find(|request| request.victim == *victim && request.claimant == claimant)
                .map(|request| request.id);
            let id = existing.unwrap_or_else(|| {
                let id = self.approvals.next_id.max(1);
                self.approvals.next_id = id + 1;
                self.approvals.pending.insert(
                    id,
                    ApprovalRequest {
                        id,
                        victim: *victim,
                        claimant,
                        reason: reason.clone(),
                        at: now,
                    },
                );
                id
            });
            first.get_or_insert(id);
        }
        first
    }

    /// Whether `victim` was denied to `claimant`.
    pub(super) fn is_denied(&self, victim: TrialId, claimant: TrialId) -> bool {
        self.approvals.denied.contains_key(&(victim, claimant))
    }

    /// Forgets approvals naming `trial`, which left its place.
    pub(super) fn forget_approvals(&mut self, trial: TrialId) {
        self.approvals.forget(trial);
    }

    /// Drops the approval of a pair whose preemption has been carried out.
    pub(super) fn approval_used(&mut self, victim: TrialId, claimant: TrialId) {
        self.approvals.approved.remove(&(victim, claimant));
    }

    /// Withdraws every pending request (a new policy decides afresh).
    pub(super) fn withdraw_pending_approvals(&mut self) {
        self.approvals.pending.clear();
        self.approvals.approved.clear();
    }

    /// The preemptions waiting for an admin, oldest first.
    pub fn approval_requests(&self) -> Vec<ApprovalRequest> {
        self.approvals.pending.values().cloned().collect()
    }

    /// An admin's verdict on a pending request; the next pass acts on it.
    pub fn decide_approval(
        &mut self,
        request: u64,
        verdict: ApprovalVerdict,
    ) -> Result<ApprovalRequest, ApprovalError> {
        let decided = self
            .approvals
            .pending
            .remove(&request)
            .ok_or(ApprovalError::NotPending(request))?;
        let pair = (decided.victim, decided.claimant);
        match verdict {
            ApprovalVerdict::Approve => {
                self.approvals.approved.insert(pair, request);
            }
            ApprovalVerdict::Deny => {
                self.approvals.denied.insert(pair, request);
            }
        }
        Ok(decided)
    }

    /// Makes new request ids start at `next` at least (ids a restarted head
    /// already used stay unique).
    pub fn set_next_approval_id(&mut self, next: u64) {
        self.approvals.next_id = self.approvals.next_id.max(next);
    }

    /// Re-applies a denial found in the caller's records (after a restart), so
    /// that the pair is not asked again while both trials stay where they are.
    pub fn restore_denial(&mut self, request: u64, victim: TrialId, claimant: TrialId) {
        self.approvals.denied.insert((victim, claimant), request);
    }

    /// Checks that no lease is held beyond its capacity and no queue beyond
    /// its lease quota, from a recount of the placed trials.
    pub(super) fn check_leases(&self) -> Result<(), LeaseViolation> {
        let mut held: BTreeMap<String, u64> = BTreeMap::new();
        let mut by_queue: Vec<BTreeMap<String, u64>> = vec![BTreeMap::new(); self.queue_info.len()];
        for trial in self.trials.values() {
            if let Standing::Placed(_) = trial.standing {
                add_leases(&mut held, &trial.request.gang.leases, true);
                add_leases(&mut by_queue[trial.queue], &trial.request.gang.leases, true);
            }
        }
        if self.leases_relaxed {
            return Ok(());
        }
        for (name, units) in &held {
            let capacity = self.config.leases.get(name).copied().unwrap_or(0);
            if *units > capacity {
                return Err(LeaseViolation::OverCapacity {
                    lease: name.clone(),
                    units: *units,
                    capacity,
                });
            }
        }
        for (queue, usage) in by_queue.iter().enumerate() {
            let info = &self.queue_info[queue];
            for (name, units) in usage {
                if let Some(quota) = info.lease_quota.get(name)
                    && units > quota
                {
                    return Err(LeaseViolation::OverQuota {
                        queue: info.name.clone(),
                        lease: name.clone(),
                        units: *units,
                        quota: *quota,
                    });
                }
            }
        }
        Ok(())
    }

    /// Whether held leases exceed a capacity or lease quota of the policy in
    /// force (only a new policy can make it so).
    pub(super) fn leases_over_policy(&self) -> bool {
        let over_capacity = self
            .index
            .lease_held
            .iter()
            .any(|(name, units)| *units > self.config.leases.get(name).copied().unwrap_or(0));
        over_capacity
            || self
                .queue_info
                .iter()
                .zip(&self.index.queues)
                .any(|(info, queue)| {
                    queue.lease_usage.iter().any(|(name, units)| {
                        info.lease_quota
                            .get(name)
                            .is_some_and(|quota| units > quota)
                    })
                })
    }
}

/// A lease held beyond what the policy allows, found by a recount (see
/// `check_leases`).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(super) enum LeaseViolation {
    /// Placed trials together hold more units than the lease's capacity.
    #[error("lease {lease} is granted {units} units of a capacity of {capacity}")]
    OverCapacity {
        lease: String,
        units: u64,
        capacity: u64,
    },
    /// One queue's placed trials hold more units than its lease quota.
    #[error("queue {queue} holds {units} units of lease {lease}, above its quota {quota}")]
    OverQuota {
        queue: String,
        lease: String,
        units: u64,
        quota: u64,
    },
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use xp_runtime::ids::{ExperimentId, NodeId, TrialId};

    use crate::{
        Amount, ApprovalVerdict, Decision, GangShape, NodeSpec, PolicyConfig, PolicyCore, Refusal,
        TrialRequest, WaitReason,
    };

    const GIB: u64 = 1 << 30;

    fn id(index: u32) -> TrialId {
        TrialId {
            experiment: ExperimentId { digest: 3, run: 1 },
            index,
        }
    }

    /// A core over one node of `gpus` GPUs under the policy `yaml`.
    fn core(yaml: &str, gpus: u32) -> PolicyCore {
        let mut core = PolicyCore::new(PolicyConfig::from_yaml(yaml).unwrap());
        core.upsert_node(NodeSpec {
            id: NodeId(uuid::Uuid::from_u128(1)),
            gpus,
            gpu_model: None,
            cpu_milli: 64_000,
            memory_bytes: 64 * GIB,
            labels: BTreeMap::new(),
        });
        core
    }

    /// A trial of `workers` CPU workers of `team`, asking for `leases`.
    fn request(index: u32, team: &str, workers: u32, leases: &[(&str, u64)]) -> TrialRequest {
        TrialRequest {
            id: id(index),
            team: team.to_owned(),
            queue: None,
            priority: 0,
            urgency: 0,
            gang: GangShape {
                workers,
                per_worker: Amount {
                    gpu_milli: 0,
                    cpu_milli: 1000,
                    memory_bytes: GIB,
                },
                gpu_models: Vec::new(),
                node_labels: BTreeMap::new(),
                spread: false,
                leases: leases
                    .iter()
                    .map(|(name, units)| ((*name).to_owned(), *units))
                    .collect(),
                oversubscribe: false,
            },
            preemptible: true,
            time_limit_ms: None,
            submitted_at: u64::from(index),
        }
    }

    fn placed(decisions: &[Decision]) -> Vec<TrialId> {
        decisions
            .iter()
            .filter_map(|decision| match decision {
                Decision::Place { trial, .. } => Some(*trial),
                Decision::Preempt { .. } | Decision::Resize { .. } => None,
            })
            .collect()
    }

    fn preempted(decisions: &[Decision]) -> Vec<TrialId> {
        decisions
            .iter()
            .filter_map(|decision| match decision {
                Decision::Preempt { trial, .. } => Some(*trial),
                Decision::Place { .. } | Decision::Resize { .. } => None,
            })
            .collect()
    }

    fn decide(core: &mut PolicyCore, now: u64) -> Vec<Decision> {
        let decisions = core.decide(now);
        core.check_invariants().unwrap();
        decisions
    }

    #[test]
    fn a_lease_of_one_is_a_mutex_and_others_run_beside() {
        let mut core = core("leases: {param-server-7: 1}\n", 0);
        core.submit(request(1, "a", 1, &[("param-server-7", 1)]), 1)
            .unwrap();
        core.submit(request(2, "a", 1, &[("param-server-7", 1)]), 2)
            .unwrap();
        core.submit(request(3, "a", 1, &[]), 3).unwrap();
        assert_eq!(placed(&decide(&mut core, 10)), vec![id(1), id(3)]);
        assert_eq!(
            core.wait_reason(id(2)),
            Some(WaitReason::WaitingForLease {
                lease: "param-server-7".to_owned()
            })
        );
        assert_eq!(
            core.wait_reason(id(2)).unwrap().to_string(),
            "waiting for lease param-server-7"
        );
        let leases = core.leases();
        assert_eq!(leases[0].held, 1);
        assert_eq!(leases[0].holders[0].trial, id(1));
        assert_eq!(leases[0].waiters[0].trial, id(2));
        // Released when the holder leaves: the waiter starts.
        assert!(core.finish(id(1), 20, true));
        assert_eq!(placed(&decide(&mut core, 20)), vec![id(2)]);
        // A requeue releases it too.
        assert!(core.requeue(id(2), 30));
        core.submit(request(4, "a", 1, &[("param-server-7", 1)]), 31)
            .unwrap();
        assert_eq!(placed(&decide(&mut core, 40)), vec![id(2)]);
        assert_eq!(core.leases()[0].held, 1);
    }

    #[test]
    fn a_gang_holds_its_units_once() {
        let mut core = core("leases: {licence: 2}\n", 0);
        core.submit(request(1, "a", 4, &[("licence", 2)]), 1)
            .unwrap();
        assert_eq!(placed(&decide(&mut core, 10)), vec![id(1)]);
        assert_eq!(core.leases()[0].held, 2);
        assert_eq!(core.queues()[0].leases["licence"], 2);
    }

    #[test]
    fn undeclared_or_oversized_leases_are_refused_by_name() {
        let mut core = core("leases: {licence: 2}\n", 0);
        let refusal = core
            .submit(request(1, "a", 1, &[("feature-store", 1)]), 1)
            .unwrap_err();
        assert!(
            matches!(&refusal, Refusal::Lease { lease, .. } if lease == "feature-store"),
            "{refusal}"
        );
        assert!(refusal.to_string().contains("feature-store"));
        let refusal = core
            .submit(request(2, "a", 1, &[("licence", 3)]), 1)
            .unwrap_err();
        assert!(refusal.to_string().contains("capacity of 2"), "{refusal}");
        assert!(
            core.submit(request(3, "a", 1, &[("licence", 0)]), 1)
                .is_err()
        );
    }

    #[test]
    fn a_queue_quota_caps_its_lease_units() {
        let mut core = core(
            "leases: {fs: 8}\nqueues: [{name: qa, team: a, quota: {leases: {fs: 1}}}, {name: default}]\n",
            0,
        );
        core.submit(request(1, "a", 1, &[("fs", 1)]), 1).unwrap();
        core.submit(request(2, "a", 1, &[("fs", 1)]), 2).unwrap();
        core.submit(request(3, "b", 1, &[("fs", 1)]), 3).unwrap();
        assert_eq!(placed(&decide(&mut core, 10)), vec![id(1), id(3)]);
        assert_eq!(
            core.wait_reason(id(2)),
            Some(WaitReason::OverQuota {
                resource: "lease fs".to_owned()
            })
        );
        assert_eq!(core.queues()[0].lease_quota["fs"], 1);
    }

    #[test]
    fn a_smaller_request_does_not_overtake_a_larger_one() {
        let mut core = core("leases: {fs: 2}\n", 0);
        core.submit(request(1, "a", 1, &[("fs", 1)]), 1).unwrap();
        assert_eq!(placed(&decide(&mut core, 10)), vec![id(1)]);
        core.submit(request(2, "a", 1, &[("fs", 2)]), 11).unwrap();
        core.submit(request(3, "a", 1, &[("fs", 1)]), 12).unwrap();
        core.submit(request(4, "a", 1, &[]), 13).unwrap();
        assert_eq!(placed(&decide(&mut core, 20)), vec![id(4)]);
        assert!(matches!(
            core.wait_reason(id(3)),
            Some(WaitReason::WaitingForLease { .. })
        ));
        core.finish(id(1), 30, true);
        assert_eq!(placed(&decide(&mut core, 30)), vec![id(2)]);
    }

    const PREEMPTING: &str = "leases: {ps: 1}\npriority_classes: {low: 0, high: 100}\npreemption: {grace_period: 1s, min_run_time: 0s}\n";

    #[test]
    fn preemption_frees_a_lease_for_higher_priority() {
        let mut core = core(PREEMPTING, 0);
        core.submit(request(1, "a", 1, &[("ps", 1)]), 1).unwrap();
        core.submit(request(2, "a", 1, &[]), 2).unwrap();
        assert_eq!(placed(&decide(&mut core, 10)), vec![id(1), id(2)]);
        let mut high = request(3, "a", 1, &[("ps", 1)]);
        high.priority = 100;
        core.submit(high, 20).unwrap();
        let decisions = decide(&mut core, 20);
        // Only the holder of the lease is stopped.
        assert_eq!(preempted(&decisions), vec![id(1)]);
        assert_eq!(
            core.wait_reason(id(3)),
            Some(WaitReason::WaitingForPreemption)
        );
        assert!(core.requeue(id(1), 25));
        assert_eq!(placed(&decide(&mut core, 30)), vec![id(3)]);
        assert!(matches!(
            core.wait_reason(id(1)),
            Some(WaitReason::WaitingForLease { .. })
        ));
    }

    const MANUAL: &str = "leases: {ps: 1}\npriority_classes: {low: 0, high: 100}\npreemption: {grace_period: 1s, min_run_time: 0s}\nqueues: [{name: guarded, team: a, preemption: {approval: manual}}, {name: default}]\n";

    #[test]
    fn manual_approval_waits_for_an_admin() {
        let mut core = core(MANUAL, 0);
        core.submit(request(1, "a", 1, &[("ps", 1)]), 1).unwrap();
        assert_eq!(placed(&decide(&mut core, 10)), vec![id(1)]);
        let mut claimant = request(2, "b", 1, &[("ps", 1)]);
        claimant.priority = 100;
        core.submit(claimant, 20).unwrap();
        for now in [20, 30, 40] {
            assert!(decide(&mut core, now).is_empty());
        }
        let pending = core.approval_requests();
        assert_eq!(pending.len(), 1, "asked once: {pending:?}");
        let request = pending[0].clone();
        assert_eq!((request.victim, request.claimant), (id(1), id(2)));
        assert_eq!(
            core.wait_reason(id(2)),
            Some(WaitReason::WaitingForApproval {
                request: request.id
            })
        );
        core.decide_approval(request.id, ApprovalVerdict::Approve)
            .unwrap();
        assert!(
            core.decide_approval(request.id, ApprovalVerdict::Deny)
                .is_err()
        );
        assert_eq!(preempted(&decide(&mut core, 50)), vec![id(1)]);
        core.requeue(id(1), 55);
        assert_eq!(placed(&decide(&mut core, 60)), vec![id(2)]);
        assert!(core.approval_requests().is_empty());
    }

    #[test]
    fn a_denial_is_not_asked_again_while_the_situation_lasts() {
        let mut core = core(MANUAL, 0);
        core.set_next_approval_id(7);
        core.submit(request(1, "a", 1, &[("ps", 1)]), 1).unwrap();
        decide(&mut core, 10);
        let mut claimant = request(2, "b", 1, &[("ps", 1)]);
        claimant.priority = 100;
        core.submit(claimant, 20).unwrap();
        decide(&mut core, 20);
        let request = core.approval_requests().remove(0);
        assert_eq!(request.id, 7);
        core.decide_approval(request.id, ApprovalVerdict::Deny)
            .unwrap();
        for now in [30, 40] {
            assert!(decide(&mut core, now).is_empty());
            assert!(core.approval_requests().is_empty());
        }
        assert!(matches!(
            core.wait_reason(id(2)),
            Some(WaitReason::WaitingForLease { .. })
        ));
        // The victim leaves by itself: the claimant starts.
        core.finish(id(1), 50, true);
        assert_eq!(placed(&decide(&mut core, 50)), vec![id(2)]);
    }

    #[test]
    fn after_a_denial_another_claimant_asks_and_an_approval_preempts() {
        let mut core = core(MANUAL, 0);
        core.submit(request(1, "a", 1, &[("ps", 1)]), 1).unwrap();
        decide(&mut core, 10);
        let mut first = request(2, "b", 1, &[("ps", 1)]);
        first.priority = 100;
        core.submit(first, 20).unwrap();
        decide(&mut core, 20);
        let denied = core.approval_requests().remove(0);
        core.decide_approval(denied.id, ApprovalVerdict::Deny)
            .unwrap();
        assert!(decide(&mut core, 30).is_empty());
        let mut second = request(3, "b", 1, &[("ps", 1)]);
        second.priority = 100;
        core.submit(second, 40).unwrap();
        assert!(decide(&mut core, 40).is_empty());
        let pending = core.approval_requests();
        assert_eq!(pending.len(), 1, "{pending:?}");
        assert_eq!(pending[0].claimant, id(3));
        core.decide_approval(pending[0].id, ApprovalVerdict::Approve)
            .unwrap();
        assert_eq!(preempted(&decide(&mut core, 50)), vec![id(1)]);
        core.requeue(id(1), 55);
        assert_eq!(placed(&decide(&mut core, 60)), vec![id(3)]);
        // Fair share between the two queues (both idle) puts the victim's
        // queue first; the first claimant then asks again, since the victim
        // stopped and its denial went with that.
        core.finish(id(3), 70, true);
        assert_eq!(placed(&decide(&mut core, 70)), vec![id(1)]);
        assert!(decide(&mut core, 80).is_empty());
        let again = core.approval_requests();
        assert_eq!(again.len(), 1, "{again:?}");
        assert_eq!((again[0].victim, again[0].claimant), (id(1), id(2)));
    }

    #[test]
    fn policy_leases_and_approval_parse_and_validate() {
        let config = PolicyConfig::from_yaml(
            "leases: {matlab-licence: 2, feature-store: 8, param-server-7: 1}\nqueues: [{name: q, quota: {gpu: 1, leases: {feature-store: 2}}, preemption: {approval: manual}}]\n",
        )
        .unwrap();
        assert_eq!(config.leases["feature-store"], 8);
        let text = serde_saphyr::to_string(&config).unwrap();
        assert_eq!(PolicyConfig::from_yaml(&text).unwrap(), config);
        for (yaml, field) in [
            ("leases: {'bad name': 1}\n", "leases"),
            ("leases: {ok: 0}\n", "leases.ok"),
            (
                "queues: [{name: q, quota: {leases: {nope: 1}}}]\n",
                "queues[q].quota.leases.nope",
            ),
            (
                "leases: {x: 1}\nqueues: [{name: q, cohort: c, quota: {gpu: 1}, borrowing_limit: {leases: {x: 1}}}]\n",
                "queues[q].borrowing_limit.leases",
            ),
        ] {
            let error = PolicyConfig::from_yaml(yaml).unwrap_err().to_string();
            assert!(error.contains(field), "{error:?} does not name {field}");
        }
        let long = format!("leases: {{{}: 1}}\n", "x".repeat(65));
        assert!(PolicyConfig::from_yaml(&long).is_err());
        assert!(
            PolicyConfig::from_yaml("queues: [{name: q, preemption: {approval: sometimes}}]\n")
                .is_err()
        );
    }
}
