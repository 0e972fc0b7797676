//! The access rules without a server: credentials, quotas and the usage they
//! are checked against, what a grant may read and write, and the report.

use xp_runtime::protocol::{Holder, ReadScope, Revocation};

use super::*;

const TOKEN: &str = "cluster-token";
const NOW: u64 = 1_800_000_000_000;

fn quota(memory_bytes: u64, disk_bytes: u64) -> TeamQuota {
    TeamQuota {
        team: "alpha".to_owned(),
        memory_bytes,
        disk_bytes,
    }
}

fn usage(memory_bytes: u64, total_bytes: u64) -> TeamUsage {
    TeamUsage {
        memory_bytes,
        total_bytes,
    }
}

/// Plans a store of `size` for a team holding `held` under `limits`, and
/// compares the outcome with `expected` (a plan, or the refusal's code).
fn check_plan(
    limits: TeamQuota,
    held: TeamUsage,
    size: u64,
    expected: Result<StorePlan, FetchErrorCode>,
) {
    let planned = plan_store(&limits, "alpha", held, size).map_err(|refusal| refusal.code);
    assert_eq!(planned, expected, "{held:?} + {size} under {limits:?}");
}

#[test]
fn a_store_goes_anywhere_to_disk_or_nowhere_by_the_team_quota() {
    check_plan(quota(100, 1000), usage(0, 0), 100, Ok(StorePlan::Anywhere));
    check_plan(quota(100, 1000), usage(50, 50), 51, Ok(StorePlan::Disk));
    check_plan(
        quota(100, 1000),
        usage(0, 900),
        100,
        Ok(StorePlan::Anywhere),
    );
    check_plan(
        quota(100, 1000),
        usage(0, 900),
        101,
        Err(FetchErrorCode::OverQuota),
    );
    check_plan(quota(0, 0), usage(0, 0), 0, Ok(StorePlan::Anywhere));
    check_plan(quota(0, 0), usage(0, 0), 1, Err(FetchErrorCode::OverQuota));
    let refusal = plan_store(&quota(1, 10), "alpha", usage(0, 8), 5).expect_err("over");
    assert_eq!(
        refusal.message,
        "team alpha is over its object quota on this node: it keeps 8 of its 10-byte disk quota (objects.disk), and this object is 5 bytes"
    );
}

fn grant(holder: Holder, read: Vec<ReadScope>) -> Grant {
    Grant {
        holder,
        subject: "alice".to_owned(),
        team: "alpha".to_owned(),
        read,
        issued_ms: NOW,
        expires_ms: NOW + 1000,
    }
}

fn session(name: &str) -> Holder {
    Holder::Session(name.to_owned())
}

#[test]
fn only_this_clusters_node_credential_or_a_valid_capability_authenticates() {
    let access = ObjectAccess::new(TOKEN);
    let node = Credential::Node(xp_runtime::object_wire::node_credential(TOKEN));
    assert_eq!(access.authenticate(&node, NOW), Ok(Asker::Node));
    let stranger = Credential::Node(xp_runtime::object_wire::node_credential("other"));
    let refused = access.authenticate(&stranger, NOW).expect_err("refused");
    assert_eq!(refused.code, FetchErrorCode::BadCredential);
    let issued = ObjectCapability::issue(
        &CapabilityKey::derive(TOKEN),
        grant(session("driver-1"), vec![]),
    );
    let capability = Credential::Capability(Box::new(issued.clone()));
    assert_eq!(
        access.authenticate(&capability, NOW),
        Ok(Asker::Capability(issued.grant.clone()))
    );
    access.revoke(vec![RevocationEntry {
        revocation: Revocation::Holder(session("driver-1")),
        until_ms: NOW + 1000,
    }]);
    let refused = access.authenticate(&capability, NOW).expect_err("revoked");
    assert_eq!(refused.code, FetchErrorCode::Revoked);
    let late = NOW + 1000 + xp_runtime::protocol::CLOCK_SKEW_MS + 1;
    let refused = access.authenticate(&capability, late).expect_err("expired");
    assert_eq!(refused.code, FetchErrorCode::Expired);
}

#[test]
fn a_grant_reads_by_owner_and_writes_only_as_its_session() {
    let id = ObjectId::of(b"x");
    let trial: TrialId = "00000000000000aa-t0".parse().expect("trial");
    let by_trial = grant(session("driver-1"), vec![ReadScope::Trial(trial)]);
    let owned_by_trial = Some(vec![Owner::Trial(trial)]);
    let owned_by_other = Some(vec![Owner::Driver("driver-2".to_owned())]);
    assert!(ObjectAccess::check_read(&by_trial, id, owned_by_trial).is_ok());
    let refused = ObjectAccess::check_read(&by_trial, id, owned_by_other).expect_err("out");
    assert_eq!(refused.code, FetchErrorCode::Forbidden);
    assert!(
        refused.message.contains("user alice, team alpha"),
        "{refused:?}"
    );
    assert!(
        ObjectAccess::check_read(&by_trial, id, None).is_ok(),
        "not here: NotFound answers"
    );
    assert!(ObjectAccess::check_write(&by_trial, "driver-1").is_ok());
    let refused = ObjectAccess::check_write(&by_trial, "driver-2").expect_err("another session");
    assert_eq!(refused.code, FetchErrorCode::Forbidden);
    let attempt = grant(Holder::Attempt { trial, attempt: 1 }, vec![]);
    let refused = ObjectAccess::check_write(&attempt, "driver-1").expect_err("a trial");
    assert_eq!(refused.code, FetchErrorCode::Forbidden);
}

fn held(size: u64, tier: Tier, owners: Vec<Owner>) -> (ObjectId, ObjectInfo) {
    (
        ObjectId::of(&size.to_le_bytes()),
        ObjectInfo {
            size,
            tier,
            owners,
            pinned: false,
        },
    )
}

#[test]
fn a_teams_usage_counts_its_sessions_and_trials_objects_and_nothing_else() {
    let access = ObjectAccess::new(TOKEN);
    let trial: TrialId = "00000000000000aa-t0".parse().expect("trial");
    let key = WorkerKey {
        trial,
        attempt: 1,
        rank: 0,
    };
    let attempt = ObjectCapability::issue(
        &CapabilityKey::derive(TOKEN),
        grant(Holder::Attempt { trial, attempt: 1 }, vec![]),
    );
    access.hold_worker(key, attempt.clone());
    assert_eq!(access.capability_of(key), Some(attempt));
    access.apply_rules(ObjectRules {
        default_quota: quota(1 << 30, 1 << 30),
        teams: vec![quota(100, 1000)],
        revoked: Vec::new(),
    });
    let holdings = vec![
        held(
            300,
            Tier::Memory,
            vec![Owner::Driver("driver-1".to_owned())],
        ),
        held(400, Tier::Disk, vec![Owner::Trial(trial)]),
        held(5000, Tier::Disk, vec![Owner::Driver("stranger".to_owned())]),
    ];
    // The first store names driver-1's team; the object it keeps then counts.
    let first = access.admit_store("alpha", "driver-1", 200, || holdings.clone(), |plan| plan);
    assert_eq!(
        first,
        Ok(StorePlan::Disk),
        "700 held, 300 of them in memory"
    );
    let over = access.admit_store("alpha", "driver-1", 301, || holdings.clone(), |plan| plan);
    assert_eq!(
        over.map_err(|refusal| refusal.code),
        Err(FetchErrorCode::OverQuota)
    );
    access.forget_worker(key);
    assert_eq!(access.capability_of(key), None);
    access.forget_trial(trial);
    let freed = access.admit_store("alpha", "driver-1", 301, || holdings.clone(), |plan| plan);
    assert_eq!(
        freed,
        Ok(StorePlan::Disk),
        "the trial's objects no longer count"
    );
}

#[test]
fn a_renewal_replaces_the_capability_of_its_attempts_workers_here_and_no_other() {
    let access = ObjectAccess::new(TOKEN);
    let key = CapabilityKey::derive(TOKEN);
    let trial: TrialId = "00000000000000aa-t0".parse().expect("trial");
    let worker = |attempt, rank| WorkerKey {
        trial,
        attempt,
        rank,
    };
    let of_attempt = |attempt, issued_ms| {
        let mut grant = grant(Holder::Attempt { trial, attempt }, vec![]);
        grant.issued_ms = issued_ms;
        ObjectCapability::issue(&key, grant)
    };
    let first = of_attempt(1, NOW);
    access.hold_worker(worker(1, 0), first.clone());
    access.hold_worker(worker(1, 1), first.clone());
    let other = of_attempt(2, NOW);
    access.hold_worker(worker(2, 0), other.clone());
    let renewed = of_attempt(1, NOW + 10);
    let stray = ObjectCapability::issue(&key, grant(session("s"), vec![]));
    access.renew(vec![stray, renewed.clone(), of_attempt(3, NOW + 10)]);
    assert_eq!(access.capability_of(worker(1, 0)), Some(renewed.clone()));
    assert_eq!(access.capability_of(worker(1, 1)), Some(renewed));
    assert_eq!(access.capability_of(worker(2, 0)), Some(other));
    assert_eq!(access.capability_of(worker(3, 0)), None, "none held here");
}

#[test]
fn the_report_holds_what_was_counted_once() {
    let access = ObjectAccess::new(TOKEN);
    assert_eq!(access.take_report(), None);
    access.count_fetch("alpha", 10, true);
    access.count_fetch("alpha", 5, false);
    access.count_store("beta", 7);
    let forged = ObjectCapability {
        mac: [0; 32],
        ..ObjectCapability::issue(&CapabilityKey::derive(TOKEN), grant(session("d"), vec![]))
    };
    let refusal = Refusal::new(FetchErrorCode::BadCredential, "forged");
    access.refused(
        NOW,
        &Credential::Capability(Box::new(forged)),
        "fetch".to_owned(),
        &refusal,
    );
    let report = access.take_report().expect("counted");
    let counts: Vec<(&str, u64, u64, u64, u64, u64)> = report
        .counts
        .iter()
        .map(|c| {
            (
                c.team.as_str(),
                c.fetches,
                c.fetched_bytes,
                c.stores,
                c.stored_bytes,
                c.refusals,
            )
        })
        .collect();
    assert_eq!(
        counts,
        [("alpha", 1, 15, 0, 0, 0), ("beta", 0, 0, 1, 7, 0)],
        "a forged claim is not counted"
    );
    assert_eq!(report.refusals[0].subject, "alice (unverified claim)");
    assert_eq!(access.take_report(), None);
}
