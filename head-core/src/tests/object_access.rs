//! Object access by capability in the core: what an attempt's launch and a
//! driver session's request grant, what is revoked when an attempt or a
//! session ends or a user is revoked, the rules a registering node gets, and
//! what a node's report of the object plane becomes (tally, audit entries).

use xp_runtime::ids::ObjectId;
use xp_runtime::protocol::{
    ATTEMPT_CAPABILITY_MS, AdminAction, AdminRequest, CapabilityKey, Holder,
    MAX_REVOCATIONS_PER_COMMAND, ObjectAccessReport, ObjectCapability, ObjectRefusal, ReadScope,
    Request, Response, Revocation, RevocationList, TeamObjectCounts,
};

use super::*;
use crate::auth::access::Authorized;
use crate::auth::{Principal, Role};
use crate::requests::Served;

const ALPHA: &str = "name: a\nteam: alpha\ntrial: {command: [train], resources: {cpu: 1}}\n";
const BETA: &str = "name: b\nteam: beta\ntrial: {command: [train], resources: {cpu: 1}}\n";
/// Two trials of team alpha.
const ALPHA_TWO: &str =
    "name: a2\nteam: alpha\ntrial: {command: [train], resources: {cpu: 1}}\nsearch: {trials: 2}\n";

fn key() -> CapabilityKey {
    CONFIG.object_key
}

fn asker(name: &str, team: &str, role: Role) -> Authorized {
    Authorized {
        principal: Principal::User {
            name: name.to_owned(),
            team: team.to_owned(),
            role,
        },
        experiment: None,
    }
}

/// The capability `asker`'s session `session` gets, asking for `objects`.
fn session_capability(
    core: &mut HeadCore,
    now: u64,
    asker: &Authorized,
    session: &str,
    objects: Vec<ObjectId>,
) -> ObjectCapability {
    let request = Request::ObjectCapability { objects };
    match core.serve(now, asker, Some(session), request) {
        Ok(Served::Answer(Response::ObjectCapability(capability))) => *capability,
        other => panic!("no capability: {other:?}"),
    }
}

/// The revocations among `sent` for `node`.
fn revocations_to(sent: &[(NodeId, HeadCommand)], node: NodeId) -> Vec<Revocation> {
    sent.iter()
        .filter(|(to, _)| *to == node)
        .filter_map(|(_, command)| match command {
            HeadCommand::RevokeCapabilities(entries) => Some(entries.clone()),
            _ => None,
        })
        .flatten()
        .map(|entry| entry.revocation)
        .collect()
}

#[test]
fn a_registering_node_gets_the_quotas_and_what_the_start_revoked_before_any_launch() {
    let mut core = HeadCore::restore(CONFIG, LoadedState::default(), 100);
    let node = node_id(1);
    core.handle_node_register(100, registration(node, 0, 4, Vec::new()));
    let sent = commands(&mut core);
    let rules = sent
        .iter()
        .find_map(|(_, command)| match command {
            HeadCommand::ObjectRules(rules) => Some(rules.clone()),
            _ => None,
        })
        .expect("rules sent at registration");
    assert_eq!(rules.default_quota.memory_bytes, 1 << 30);
    assert_eq!(rules.default_quota.disk_bytes, 64 << 30);
    assert_eq!(
        rules.revoked[0].revocation,
        Revocation::SessionsBefore { before_ms: 100 },
        "capabilities of sessions of an earlier head are void"
    );
}

#[test]
fn a_registering_node_gets_a_busy_days_revocations_in_commands_a_frame_holds() {
    let mut core = HeadCore::restore(CONFIG, LoadedState::default(), 100);
    let trial = TrialId {
        experiment: ExperimentId { digest: 7, run: 1 },
        index: 0,
    };
    let ended = 2 * MAX_REVOCATIONS_PER_COMMAND + 1;
    core.grants = crate::state::ObjectGrants::started(
        100,
        (1..=ended as u32).map(|attempt| (trial, attempt, 50)),
    );
    let node = node_id(1);
    core.handle_node_register(100, registration(node, 0, 4, Vec::new()));
    let sent = commands(&mut core);
    let mut lists = sent
        .iter()
        .filter(|(to, _)| *to == node)
        .filter_map(|(_, command)| match command {
            HeadCommand::ObjectRules(rules) => Some(rules.revoked.len()),
            HeadCommand::RevokeCapabilities(entries) => Some(entries.len()),
            _ => None,
        });
    assert_eq!(
        lists.next(),
        Some(MAX_REVOCATIONS_PER_COMMAND),
        "the rules come first"
    );
    let sizes: Vec<usize> = lists.collect();
    assert!(
        sizes
            .iter()
            .all(|&size| size <= MAX_REVOCATIONS_PER_COMMAND),
        "{sizes:?}"
    );
    // Every attempt and the start's void of older sessions.
    assert_eq!(
        MAX_REVOCATIONS_PER_COMMAND + sizes.iter().sum::<usize>(),
        ended + 1
    );
    // A policy change tells the quotas alone: the node holds the rest.
    core.handle_admin(
        101,
        AdminRequest {
            action: AdminAction::ApplyPolicy {
                yaml: "{}".to_owned(),
            },
            who: "admin".to_owned(),
            why: "test".to_owned(),
        },
    )
    .expect("applied");
    let rules: Vec<usize> = commands(&mut core)
        .into_iter()
        .filter_map(|(_, command)| match command {
            HeadCommand::ObjectRules(rules) => Some(rules.revoked.len()),
            _ => None,
        })
        .collect();
    assert_eq!(rules, [0]);
}

#[test]
fn an_attempt_reads_its_trial_and_its_drivers_and_is_revoked_when_it_ends() {
    let (mut core, node) = cluster(0, 4);
    commands(&mut core);
    let experiment = submit(&mut core, 1, ALPHA, false);
    let sent = commands(&mut core);
    let launch = sent
        .iter()
        .find_map(|(_, command)| match command {
            HeadCommand::Launch(launch) => Some(launch.clone()),
            _ => None,
        })
        .expect("launched");
    let capability = launch.object_capability.expect("the launch carries one");
    let grant = capability
        .verify(&key(), 1, &RevocationList::default())
        .expect("signed with the cluster's key");
    let trial = TrialId {
        experiment,
        index: 0,
    };
    assert_eq!(grant.holder, Holder::Attempt { trial, attempt: 1 });
    assert_eq!(grant.team, "alpha");
    assert_eq!(grant.read, [ReadScope::Trial(trial)]);
    assert_eq!(grant.writes_as(), None);
    exited(&mut core, 2, node, launch.key, 0);
    assert_eq!(
        revocations_to(&commands(&mut core), node),
        [],
        "an ended attempt is told with the next tick's"
    );
    core.handle_tick(3);
    assert_eq!(
        revocations_to(&commands(&mut core), node),
        [Revocation::Holder(Holder::Attempt { trial, attempt: 1 })]
    );
}

#[test]
fn an_ended_trial_is_told_to_the_nodes_that_ran_it_and_ended_attempts_to_every_node_in_one_command()
{
    let (mut core, node) = cluster(0, 4);
    let other = node_id(2);
    core.handle_node_register(0, registration(other, 0, 0, Vec::new()));
    commands(&mut core);
    let experiment = submit(&mut core, 1, ALPHA_TWO, false);
    let launches: Vec<_> = commands(&mut core)
        .into_iter()
        .filter_map(|(to, command)| match command {
            HeadCommand::Launch(launch) => Some((to, launch.key)),
            _ => None,
        })
        .collect();
    assert_eq!(launches.len(), 2);
    assert!(
        launches.iter().all(|(to, _)| *to == node),
        "only it has CPUs"
    );
    for (at, (_, key)) in (2..).zip(&launches) {
        exited(&mut core, at, node, *key, 0);
    }
    let sent = commands(&mut core);
    let released = |to: NodeId| {
        sent.iter()
            .filter(|(at, command)| {
                *at == to && matches!(command, HeadCommand::ReleaseTrial { trial } if trial.experiment == experiment)
            })
            .count()
    };
    assert_eq!(released(node), 2, "the node the trials ran on");
    assert_eq!(released(other), 0, "not a node that never held them");
    core.handle_tick(5);
    let sent = commands(&mut core);
    for to in [node, other] {
        let told: Vec<_> = sent
            .iter()
            .filter(|(at, command)| {
                *at == to && matches!(command, HeadCommand::RevokeCapabilities(_))
            })
            .collect();
        assert_eq!(told.len(), 1, "one command per node per tick");
        assert_eq!(revocations_to(&sent, to).len(), 2, "both attempts");
    }
}

#[test]
fn a_session_reads_its_teams_sessions_its_experiments_and_the_teams_checkpoints_it_names() {
    let (mut core, node) = cluster(0, 4);
    let alice = asker("alice", "alpha", Role::Member);
    let bob = asker("bob", "beta", Role::Member);
    session_capability(&mut core, 1, &bob, "s-bob", Vec::new());
    session_capability(
        &mut core,
        1,
        &asker("carol", "alpha", Role::Member),
        "s-carol",
        Vec::new(),
    );
    let beta = submit(&mut core, 2, BETA, false);
    core.record_driver_experiment("s-bob", beta);
    let beta_key = WorkerKey {
        trial: TrialId {
            experiment: beta,
            index: 0,
        },
        attempt: 1,
        rank: 0,
    };
    report(
        &mut core,
        3,
        node,
        checkpoint_report(beta_key, 10, b"beta state"),
    );
    let beta_object = ObjectId::of(b"beta state");
    let alpha = submit(&mut core, 4, ALPHA, false);
    core.record_driver_experiment("s-alice", alpha);
    let capability = session_capability(&mut core, 5, &alice, "s-alice", vec![beta_object]);
    let grant = capability
        .verify(&key(), 5, &RevocationList::default())
        .expect("verifies");
    assert_eq!(grant.holder, Holder::Session("s-alice".to_owned()));
    assert_eq!(
        (grant.subject.as_str(), grant.team.as_str()),
        ("alice", "alpha")
    );
    assert_eq!(grant.writes_as(), Some("s-alice"));
    assert_eq!(
        grant.read,
        [
            ReadScope::Driver("s-alice".to_owned()),
            ReadScope::Driver("s-carol".to_owned()),
            ReadScope::Experiment(alpha),
        ],
        "not bob's session, nor beta's checkpoint"
    );
    let granted = session_capability(&mut core, 6, &bob, "s-bob", vec![beta_object]);
    assert!(
        granted.grant.read.contains(&ReadScope::Object(beta_object)),
        "{granted:?}"
    );
    assert!(granted.grant.read.contains(&ReadScope::Experiment(beta)));
    let admin = session_capability(
        &mut core,
        6,
        &asker("root", "ops", Role::Admin),
        "s-root",
        vec![],
    );
    assert!(admin.grant.read.contains(&ReadScope::Everything));
    let refused = core.serve(
        6,
        &alice,
        None,
        Request::ObjectCapability { objects: vec![] },
    );
    assert!(
        matches!(refused, Err(CoreError::NoDriverSession)),
        "{refused:?}"
    );
    let retired = core.serve(6, &alice, Some("s-alice"), Request::ObjectKey);
    assert!(
        matches!(retired, Err(CoreError::ObjectKeyRetired)),
        "{retired:?}"
    );
}

#[test]
fn an_ended_session_and_a_revoked_user_are_told_to_every_node_at_once() {
    let (mut core, node) = cluster(0, 4);
    let other = node_id(2);
    core.handle_node_register(0, registration(other, 0, 4, Vec::new()));
    let alice = asker("alice", "alpha", Role::Member);
    session_capability(&mut core, 1, &alice, "s-alice", Vec::new());
    commands(&mut core);
    core.end_driver_session(2, "s-alice");
    core.revoke_user(3, "alice");
    let sent = commands(&mut core);
    let expected = [
        Revocation::Holder(Holder::Session("s-alice".to_owned())),
        Revocation::Subject {
            subject: "alice".to_owned(),
            before_ms: 3,
        },
    ];
    assert_eq!(revocations_to(&sent, node), expected);
    assert_eq!(revocations_to(&sent, other), expected);
    assert!(sent.iter().any(|(_, command)| matches!(
        command,
        HeadCommand::ReleaseDriver { session } if session == "s-alice"
    )));
    // A node that registers later gets them too.
    let late = node_id(3);
    core.handle_node_register(4, registration(late, 0, 4, Vec::new()));
    let rules = commands(&mut core)
        .into_iter()
        .find_map(|(_, command)| match command {
            HeadCommand::ObjectRules(rules) => Some(rules),
            _ => None,
        })
        .expect("rules");
    let revoked: Vec<Revocation> = rules
        .revoked
        .into_iter()
        .map(|entry| entry.revocation)
        .collect();
    for revocation in expected {
        assert!(revoked.contains(&revocation), "{revoked:?}");
    }
    // Kept across a rebuild after a failed commit (the sessions stay connected).
    let rebuilt = core.rebuild(LoadedState::default(), 5);
    assert_eq!(rebuilt.grants.clone().in_force(5), core.grants.in_force(5));
}

#[test]
fn a_nodes_object_report_is_tallied_per_team_and_its_refusals_audited() {
    let (mut core, node) = cluster(0, 4);
    let counts = TeamObjectCounts {
        team: "alpha".to_owned(),
        fetches: 2,
        fetched_bytes: 100,
        stores: 1,
        stored_bytes: 7,
        refusals: 1,
    };
    let refusal = ObjectRefusal {
        at_ms: 9,
        subject: "alice".to_owned(),
        team: "alpha".to_owned(),
        action: "fetch object 0101".to_owned(),
        reason: "the capability was revoked: user alice was revoked".to_owned(),
    };
    let report = ObjectAccessReport {
        counts: vec![counts.clone()],
        refusals: vec![refusal],
    };
    core.handle_node_message(10, node, NodeMessage::ObjectAccess(report.clone()));
    core.handle_node_message(11, node, NodeMessage::ObjectAccess(report));
    let tally = core.take_tally();
    let alpha = &tally.object_access["alpha"];
    assert_eq!(
        (
            alpha.fetches,
            alpha.fetched_bytes,
            alpha.stores,
            alpha.refusals
        ),
        (4, 200, 2, 2)
    );
    let audited: Vec<_> = core
        .take_records()
        .into_iter()
        .filter_map(|record| match record {
            Record::Audit(entry) => Some(entry),
            _ => None,
        })
        .collect();
    assert_eq!(audited.len(), 2);
    assert_eq!(audited[0].who, "alice");
    assert!(!audited[0].allowed);
    assert_eq!(
        audited[0].action,
        format!("fetch object 0101 on node node-{node}")
    );
    assert!(audited[0].detail.contains("revoked"), "{audited:?}");
}

/// A checkpointing trial whose spec declares its network trusted.
const TRUSTED: &str = "name: t\ntrial: {command: [train], transport: tcp, resources: {cpu: 1}}\ncheckpoints: {keep_last: 2, keep_best: 0}\n";

#[test]
fn a_trials_objects_take_the_path_its_spec_says_whatever_its_gang_uses() {
    use xp_runtime::protocol::{FetchPath, Launch};
    use xp_runtime::spec::CollectiveTransport;
    let mut core = HeadCore::restore(CONFIG, LoadedState::default(), 0);
    let (a, b) = (node_id(1), node_id(2));
    core.handle_node_register(0, registration(a, 0, 2, Vec::new()));
    core.handle_node_register(0, registration(b, 0, 2, Vec::new()));
    let trusted = submit(&mut core, 1, TRUSTED, false);
    submit(&mut core, 1, ALPHA, false);
    let launched: Vec<(NodeId, Launch)> = commands(&mut core)
        .into_iter()
        .filter_map(|(to, command)| match command {
            HeadCommand::Launch(launch) => Some((to, *launch)),
            _ => None,
        })
        .collect();
    assert_eq!(launched.len(), 2, "{launched:?}");
    for (_, launch) in &launched {
        // One worker on one machine: the gang's own path is shared memory,
        // which says nothing of the network between machines.
        assert_eq!(launch.transport, CollectiveTransport::Shm);
        let spec_says = if launch.key.trial.experiment == trusted {
            FetchPath::Tcp
        } else {
            FetchPath::Quic
        };
        assert_eq!(launch.object_path, spec_says, "{launch:?}");
    }
    // The replica of its checkpoint is fetched the way its spec says too.
    let (node, launch) = launched
        .iter()
        .find(|(_, launch)| launch.key.trial.experiment == trusted)
        .expect("the trusted trial's launch");
    let key = launch.key;
    report(&mut core, 2, *node, WorkerReport::Started { key, pid: 1 });
    report(&mut core, 3, *node, checkpoint_report(key, 10, b"ten"));
    let paths: Vec<FetchPath> = commands(&mut core)
        .into_iter()
        .filter_map(|(_, command)| match command {
            HeadCommand::Replicate { path, .. } => Some(path),
            _ => None,
        })
        .collect();
    assert_eq!(paths, vec![FetchPath::Tcp]);
}

/// The capabilities among `sent` for `node`, each as (holder, issued at).
fn renewals_to(sent: &[(NodeId, HeadCommand)], node: NodeId) -> Vec<(Holder, u64)> {
    sent.iter()
        .filter(|(to, _)| *to == node)
        .filter_map(|(_, command)| match command {
            HeadCommand::RenewCapabilities(capabilities) => Some(capabilities.clone()),
            _ => None,
        })
        .flatten()
        .map(|capability| {
            let grant = capability
                .verify(
                    &key(),
                    capability.grant.issued_ms,
                    &RevocationList::default(),
                )
                .expect("signed with the cluster's key");
            (grant.holder.clone(), grant.issued_ms)
        })
        .collect()
}

/// `node` heartbeats at `now`, then the head ticks.
fn alive_at(core: &mut HeadCore, node: NodeId, now: u64) -> Vec<(NodeId, HeadCommand)> {
    core.handle_node_message(now, node, NodeMessage::Heartbeat);
    core.handle_tick(now);
    commands(core)
}

#[test]
fn a_live_attempts_capability_is_renewed_at_half_its_life_and_at_its_nodes_registration() {
    let (mut core, node) = cluster(0, 4);
    commands(&mut core);
    submit(&mut core, 1, ALPHA, false);
    let key = launches(&commands(&mut core))[0].1;
    report(&mut core, 2, node, WorkerReport::Started { key, pid: 7 });
    let holder = Holder::Attempt {
        trial: key.trial,
        attempt: key.attempt,
    };
    let half = ATTEMPT_CAPABILITY_MS / 2;
    assert_eq!(renewals_to(&alive_at(&mut core, node, half), node), []);
    let renewed = renewals_to(&alive_at(&mut core, node, 1 + half), node);
    assert_eq!(
        renewed,
        [(holder.clone(), 1 + half)],
        "issued at the launch"
    );
    // Its node registers again (its session was lost): it gets one at once,
    // and the next renewal counts from then.
    core.handle_node_register(5 + half, registration(node, 0, 4, vec![key]));
    let at_registration = renewals_to(&commands(&mut core), node);
    assert_eq!(at_registration, [(holder.clone(), 5 + half)]);
    assert_eq!(
        renewals_to(&alive_at(&mut core, node, 1 + 2 * half), node),
        []
    );
    let renewed = renewals_to(&alive_at(&mut core, node, 5 + 2 * half), node);
    assert_eq!(renewed, [(holder.clone(), 5 + 2 * half)]);
    // It ends: revoked until its last capability expires, and never renewed.
    let end = 6 + 2 * half;
    exited(&mut core, end, node, key, 0);
    alive_at(&mut core, node, end);
    let in_force = core.grants.in_force(end);
    let revoked = in_force
        .iter()
        .find(|entry| entry.revocation == Revocation::Holder(holder.clone()))
        .expect("revoked");
    assert_eq!(revoked.until_ms, end + ATTEMPT_CAPABILITY_MS);
    assert_eq!(
        renewals_to(&alive_at(&mut core, node, end + 2 * half), node),
        []
    );
}
