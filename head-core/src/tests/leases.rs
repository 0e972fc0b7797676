//! Tests of leases and arbitration in the head: an undeclared lease refused
//! at submission by name, the lease report with holders, waiters and odds,
//! and approval requests recorded, decided with events, and carried across a
//! restart (pending ones withdrawn and asked again, denials kept, also past
//! the bound on resolved records), and the report showing only visible teams'
//! trials.

use super::*;
use crate::records::{ApprovalRecord, ApprovalState};
use crate::state::{Approvals, MAX_DECIDED_APPROVALS};

const POLICY: &str = "leases: {ps: 1}\npriority_classes: {low: 0, high: 100}\npreemption: {grace_period: 1s, min_run_time: 0s}\nqueues: [{name: guarded, team: g, preemption: {approval: manual}}, {name: default}]\n";

const VICTIM: &str = "name: victim\nteam: g\npriority: low\ntrial: {command: [sleep, '600'], resources: {leases: {ps: 1}}}\n";
const CLAIMANT: &str = "name: claimant\nteam: b\npriority: high\ntrial: {command: [sleep, '1'], resources: {leases: {ps: 1}}}\n";

/// A core under [`POLICY`] with one CPU node, the victim running on it and
/// the claimant waiting for an approval.
fn contended() -> (HeadCore, TrialId, TrialId, WorkerKey) {
    let mut core = HeadCore::restore(CONFIG, LoadedState::default(), 0);
    admin(
        &mut core,
        0,
        AdminAction::ApplyPolicy {
            yaml: POLICY.to_owned(),
        },
    )
    .unwrap();
    let node = node_id(1);
    core.handle_node_register(0, registration(node, 0, 4, Vec::new()));
    let victim = submit(&mut core, 1, VICTIM, false);
    let key = launches(&commands(&mut core))[0].1;
    report(&mut core, 2, node, WorkerReport::Started { key, pid: 7 });
    let claimant = submit(&mut core, 3, CLAIMANT, false);
    let victim = TrialId {
        experiment: victim,
        index: 0,
    };
    let claimant = TrialId {
        experiment: claimant,
        index: 0,
    };
    (core, victim, claimant, key)
}

#[test]
fn an_undeclared_lease_is_refused_by_name() {
    let (mut core, ..) = contended();
    let refused = try_submit(
        &mut core,
        5,
        "name: x\ntrial: {command: ['true'], resources: {leases: {matlab-licence: 1}}}\n",
        false,
    )
    .unwrap_err();
    assert!(refused.to_string().contains("matlab-licence"), "{refused}");
    let refused = try_submit(
        &mut core,
        5,
        "name: y\ntrial: {command: ['true'], resources: {leases: {ps: 2}}}\n",
        false,
    )
    .unwrap_err();
    assert!(refused.to_string().contains("capacity of 1"), "{refused}");
}

#[test]
fn a_pending_approval_is_reported_decided_and_evented() {
    let (mut core, victim, claimant, _) = contended();
    let report = core.lease_report(&|_| true);
    assert_eq!(report.leases[0].holders[0].trial, victim);
    assert_eq!(report.leases[0].waiters[0].trial, claimant);
    assert_eq!(report.approvals.len(), 1);
    let request = report.approvals[0].id;
    assert_eq!(
        (report.approvals[0].victim, report.approvals[0].claimant),
        (victim, claimant)
    );
    assert_eq!(core.book.trial(victim).state, TrialState::Running);
    let odds = report
        .odds
        .iter()
        .find(|odds| odds.resource == "lease ps")
        .unwrap();
    assert_eq!((odds.requests, odds.waited, odds.p), (2, 1, Some(0.5)));
    assert_eq!(odds.waiting_now, 1);
    assert!((odds.any_conflict - 0.5).abs() < 1e-12);

    let error = admin(&mut core, 4, AdminAction::Approve { request: 99 }).unwrap_err();
    assert!(error.to_string().contains("99"), "{error}");
    admin(&mut core, 4, AdminAction::Approve { request }).unwrap();
    // The victim is asked to stop; the claimant has its room once it has.
    assert!(commands(&mut core).iter().any(|(_, command)| matches!(
        command,
        HeadCommand::Kill { trial, .. } if *trial == victim
    )));
    assert_eq!(core.book.trial(victim).state, TrialState::Preempting);
    let events: Vec<String> = events_of(&core, victim.experiment)
        .into_iter()
        .map(|event| event.reason)
        .collect();
    assert!(
        events
            .iter()
            .any(|event| event.contains("awaits an admin's approval")),
        "{events:?}"
    );
    assert!(
        events
            .iter()
            .any(|event| event.contains("admin alice: approved preemption request")),
        "{events:?}"
    );
    assert_eq!(core.approvals.records()[0].state, ApprovalState::Approved);
    assert_eq!(
        core.approvals.records()[0].decided_by.as_deref(),
        Some("alice")
    );
}

#[test]
fn a_restart_keeps_denials_and_asks_pending_requests_again() {
    let (mut core, victim, claimant, key) = contended();
    let request = core.lease_report(&|_| true).approvals[0].id;
    admin(&mut core, 4, AdminAction::Deny { request }).unwrap();
    assert_eq!(core.book.trial(victim).state, TrialState::Running);
    let restarted = HeadCore::restore(CONFIG, loaded_from(core.take_records()), 10);
    assert_eq!(
        restarted.approvals.records()[0].state,
        ApprovalState::Denied
    );
    let mut restarted = restarted;
    restarted.handle_node_register(10, registration(node_id(1), 0, 4, vec![key]));
    assert_eq!(restarted.book.trial(victim).state, TrialState::Running);
    assert!(
        restarted.lease_report(&|_| true).approvals.is_empty(),
        "a denied pair is not asked again after a restart"
    );

    // A pending request at a restart is withdrawn and asked again, anew.
    let (mut core, _, _, key) = contended();
    let before = core.lease_report(&|_| true).approvals[0].id;
    let mut restarted = HeadCore::restore(CONFIG, loaded_from(core.take_records()), 10);
    assert_eq!(
        restarted.approvals.records()[0].state,
        ApprovalState::Withdrawn
    );
    restarted.handle_node_register(10, registration(node_id(1), 0, 4, vec![key]));
    let again = restarted.lease_report(&|_| true).approvals;
    assert_eq!(again.len(), 1, "{again:?}");
    assert!(again[0].id > before);
    assert_eq!(again[0].claimant, claimant);
}

#[test]
fn the_report_shows_other_teams_only_as_counts() {
    let (core, victim, claimant, _) = contended();
    // Team c has no trial here: whole counts, no trial, team or reason.
    let outsider = core.lease_report(&|team| team == "c");
    let lease = &outsider.leases[0];
    assert_eq!((lease.held, lease.holding, lease.waiting), (1, 1, 1));
    assert!(
        lease.holders.is_empty() && lease.waiters.is_empty(),
        "{lease:?}"
    );
    assert!(outsider.approvals.is_empty(), "{:?}", outsider.approvals);
    assert_eq!(outsider.odds, core.lease_report(&|_| true).odds);

    // The victim's team sees its holder and the request to stop it, not the
    // claimant's place in the waiting line.
    let owner = core.lease_report(&|team| team == "g");
    let lease = &owner.leases[0];
    assert_eq!(lease.holders.len(), 1);
    assert_eq!(lease.holders[0].trial, victim);
    assert!(lease.waiters.is_empty(), "{lease:?}");
    assert_eq!(lease.waiting, 1);
    assert_eq!(owner.approvals.len(), 1);
    // So does the claimant's team, from its side.
    let claiming = core.lease_report(&|team| team == "b");
    assert_eq!(claiming.leases[0].waiters[0].trial, claimant);
    assert!(claiming.leases[0].holders.is_empty());
    assert_eq!(claiming.approvals.len(), 1);
}

#[test]
fn a_standing_denial_outlives_the_bound_on_resolved_records() {
    let (mut core, victim, claimant, key) = contended();
    let request = core.lease_report(&|_| true).approvals[0].id;
    admin(&mut core, 4, AdminAction::Deny { request }).unwrap();
    // More resolved records than are kept, all newer than the denial, and
    // one old denial whose trials are gone (resolved, so trimmed first).
    let gone = TrialId {
        experiment: ExperimentId::from_content_hash(&[7; 32], 0),
        index: 0,
    };
    let resolved = |id: u64, state: ApprovalState, victim: TrialId| ApprovalRecord {
        id,
        victim,
        claimant,
        why: "filler".to_owned(),
        at: 5,
        state,
        decided_by: None,
        decided_why: None,
        decided_at: Some(5),
    };
    let mut records = core.approvals.records().to_vec();
    records.insert(0, resolved(request - 1, ApprovalState::Denied, gone));
    for index in 0..MAX_DECIDED_APPROVALS as u64 {
        records.push(resolved(
            request + 1 + index,
            ApprovalState::Withdrawn,
            victim,
        ));
    }
    core.approvals = Approvals::from_records(records);
    core.trim_approvals();
    core.persist_approvals();
    let kept = core.approvals.records();
    assert!(
        kept.iter()
            .any(|record| record.id == request && record.state == ApprovalState::Denied)
    );
    assert!(!kept.iter().any(|record| record.id == request - 1));
    assert_eq!(kept.len(), MAX_DECIDED_APPROVALS + 1);

    // After a restart the denial still stands: nobody is asked again.
    let mut restarted = HeadCore::restore(CONFIG, loaded_from(core.take_records()), 10);
    restarted.handle_node_register(10, registration(node_id(1), 0, 4, vec![key]));
    assert_eq!(restarted.book.trial(victim).state, TrialState::Running);
    assert!(
        restarted.lease_report(&|_| true).approvals.is_empty(),
        "a denied pair is not asked again after a restart"
    );
}
