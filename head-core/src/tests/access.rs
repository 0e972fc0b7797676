//! Tests of how a request's target is resolved for authorization: a name a
//! non-admin gives that does not resolve among what they see is not found,
//! never judged as their own team's work, and prefixes match only experiments
//! of teams they see.

use xp_runtime::protocol::{ErrorCode, RemoteError};

use super::*;
use crate::auth::access::Scope;
use crate::auth::{self, Action, Principal, Role, Target};

fn user(team: &str, role: Role) -> Principal {
    Principal::User {
        name: format!("{team}-{role}"),
        team: team.to_owned(),
        role,
    }
}

fn experiment(core: &mut HeadCore, name: &str, team: &str) -> ExperimentId {
    let yaml = format!(
        "name: {name}\nteam: {team}\ntrial: {{command: [echo, '{{x}}']}}\nsearch: {{algorithm: grid, space: {{x: {{choice: [1, 2]}}}}}}\n"
    );
    submit(core, 1, &yaml, false)
}

/// What the actor decides: the target resolved for `principal`, then judged.
fn judge(
    core: &HeadCore,
    principal: &Principal,
    action: Action,
    scope: Scope,
) -> Result<Option<ExperimentId>, RemoteError> {
    let resolved = core
        .resolve_scope(principal, &scope)
        .map_err(RemoteError::from)?;
    let target = match (&resolved.team, &resolved.queue_owner) {
        (None, _) => Target::Cluster,
        (Some(team), None) => Target::Team(team),
        (Some(team), Some(owner)) => Target::Queue {
            team,
            queue_owner: owner.as_deref(),
        },
    };
    auth::authorize(principal, action, target)
        .map_err(|refusal| RemoteError::new(ErrorCode::Forbidden, refusal.to_string()))?;
    Ok(resolved.experiment)
}

#[test]
fn a_trial_of_another_team_is_not_found_before_it_exists_and_refused_once_it_does() {
    let mut core = HeadCore::restore(CONFIG, LoadedState::default(), 0);
    let theirs = experiment(&mut core, "sweep", "beta");
    let member = user("alpha", Role::Member);
    let later = TrialId {
        experiment: theirs,
        index: 7,
    };
    let early = judge(
        &core,
        &member,
        Action::Cancel,
        Scope::Named(later.to_string()),
    )
    .unwrap_err();
    assert_eq!(early.code, ErrorCode::NotFound, "{early:?}");
    assert!(early.message.contains(&later.to_string()), "{early:?}");
    // Reading its metrics goes the same way (the registry is never asked).
    let read = judge(&core, &member, Action::ReadExperiment, Scope::Trial(later)).unwrap_err();
    assert_eq!(read.code, ErrorCode::NotFound, "{read:?}");

    let existing = TrialId {
        experiment: theirs,
        index: 0,
    };
    let refused = judge(
        &core,
        &member,
        Action::Cancel,
        Scope::Named(existing.to_string()),
    )
    .unwrap_err();
    assert_eq!(refused.code, ErrorCode::Forbidden, "{refused:?}");
    assert!(refused.message.contains("only an admin"), "{refused:?}");
    // Their experiment by its full id: refused naming the role, as work they know of.
    let full = judge(
        &core,
        &member,
        Action::Cancel,
        Scope::Named(theirs.to_string()),
    )
    .unwrap_err();
    assert_eq!(full.code, ErrorCode::Forbidden, "{full:?}");

    // An admin's request is judged as before: allowed, and the core then
    // says what is missing.
    let admin = user("ops", Role::Admin);
    assert_eq!(
        judge(
            &core,
            &admin,
            Action::Cancel,
            Scope::Named(later.to_string())
        ),
        Ok(None)
    );
}

#[test]
fn a_prefix_matches_only_experiments_of_teams_the_asker_sees() {
    let mut core = HeadCore::restore(CONFIG, LoadedState::default(), 0);
    let theirs = experiment(&mut core, "theirs", "beta");
    let theirs_text = theirs.to_string();
    // One of ours that shares the first digit of theirs (names are tried in
    // order; ids are content hashes, so this is deterministic).
    let ours = (0..256)
        .find(|index| {
            let mut probe = HeadCore::restore(CONFIG, LoadedState::default(), 0);
            let id = experiment(&mut probe, &format!("ours{index}"), "alpha");
            id.to_string()[..1] == theirs_text[..1]
        })
        .map(|index| experiment(&mut core, &format!("ours{index}"), "alpha"))
        .expect("one of 256 ids shares a hex digit");
    let ours_text = ours.to_string();
    let member = user("alpha", Role::Member);
    let viewer = user("alpha", Role::Viewer);

    // A prefix only theirs has: not found, nothing of theirs told.
    let only_theirs = (1..=theirs_text.len())
        .map(|len| &theirs_text[..len])
        .find(|prefix| !ours_text.starts_with(prefix))
        .unwrap();
    for (principal, action, scope) in [
        (
            &member,
            Action::Cancel,
            Scope::Named(only_theirs.to_owned()),
        ),
        (
            &viewer,
            Action::ReadExperiment,
            Scope::ExperimentNamed(only_theirs.to_owned()),
        ),
        (
            &member,
            Action::Move,
            Scope::Move {
                named: only_theirs.to_owned(),
                queue: "any".to_owned(),
            },
        ),
    ] {
        let error = judge(&core, principal, action, scope).unwrap_err();
        assert_eq!(error.code, ErrorCode::NotFound, "{error:?}");
        assert!(!error.message.contains("beta"), "{error:?}");
    }

    // A prefix both share names ours alone (not "ambiguous"), pinned to its full id.
    let shared = &ours_text[..1];
    assert_eq!(
        judge(
            &core,
            &member,
            Action::Cancel,
            Scope::Named(shared.to_owned())
        ),
        Ok(Some(ours))
    );
    // An admin sees both: the same prefix is ambiguous, as before.
    let admin = user("ops", Role::Admin);
    assert_eq!(
        judge(
            &core,
            &admin,
            Action::Cancel,
            Scope::Named(shared.to_owned())
        ),
        Ok(None)
    );
    assert!(matches!(
        core.resolve_experiment(shared),
        Err(CoreError::AmbiguousExperiment { matches: 2, .. })
    ));
}
