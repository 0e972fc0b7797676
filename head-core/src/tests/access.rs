//! Tests of how a request's target is resolved for authorization: a name a
//! non-admin gives that does not resolve among what they see is not found,
//! never judged as their own team's work, another team's exact id answers as
//! an unknown one, and prefixes match only experiments of teams they see.

use xp_runtime::protocol::{ErrorCode, RemoteError};

use super::*;
use crate::auth::access::{Access, Scope};
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

/// How a request names an experiment's work, given the experiment.
type Naming = fn(ExperimentId) -> Scope;

/// Trial 0 of `experiment`.
fn trial_zero(experiment: ExperimentId) -> TrialId {
    TrialId {
        experiment,
        index: 0,
    }
}

/// Every way a request names an exact id, with an action that takes it.
const EXACT_NAMINGS: [(Action, Naming); 7] = [
    (Action::Cancel, |id| Scope::Named(id.to_string())),
    (Action::Hold, |id| Scope::Named(trial_zero(id).to_string())),
    (Action::ReadExperiment, |id| {
        Scope::ExperimentNamed(id.to_string())
    }),
    (Action::ReadExperiment, Scope::Experiment),
    (Action::ReadExperiment, |id| Scope::Trial(trial_zero(id))),
    (Action::Move, |id| Scope::Move {
        named: id.to_string(),
        queue: "default".to_owned(),
    }),
    (Action::Cancel, |id| Scope::Named(format!("{id}-t7"))),
];

/// What `principal` gets for `naming` of `id` with `action`, with `id`
/// written as `ID`, so that answers about different ids compare.
fn answer_shape(
    core: &HeadCore,
    principal: &Principal,
    (action, naming): (Action, Naming),
    id: ExperimentId,
) -> (ErrorCode, String) {
    let error = judge(core, principal, action, naming(id)).unwrap_err();
    (error.code, error.message.replace(&id.to_string(), "ID"))
}

/// A member of alpha gets for each exact id of `theirs` (beta's) what they
/// get for the same id of `unknown`, which nobody holds: not found, naming
/// neither the team nor a role.
fn check_exact_ids_answer_as_unknown(core: &HeadCore, theirs: ExperimentId, unknown: ExperimentId) {
    let member = user("alpha", Role::Member);
    for naming in EXACT_NAMINGS {
        let existing = answer_shape(core, &member, naming, theirs);
        assert_eq!(existing.0, ErrorCode::NotFound, "{existing:?}");
        assert_eq!(existing, answer_shape(core, &member, naming, unknown));
        assert!(
            !existing.1.contains("beta") && !existing.1.contains("may not"),
            "{existing:?}"
        );
    }
    // Neither audited nor counted as a refusal, as an unknown id is not.
    let access = Access {
        action: Action::Cancel,
        scope: Scope::Named(theirs.to_string()),
    };
    let verdict = core.authorize(member, &access);
    assert!(
        matches!(verdict.outcome, Err(CoreError::NoExperimentMatches { .. })),
        "{verdict:?}"
    );
    assert!(
        verdict.audit.is_none() && verdict.refused_as.is_none(),
        "{verdict:?}"
    );
}

/// Beta's own members find it, an admin acts on it (and on a trial of it
/// that does not exist yet, failing later by itself), and a node's request is
/// judged as a node's, known id or not.
fn check_owners_admins_and_nodes_as_before(
    core: &HeadCore,
    theirs: ExperimentId,
    unknown: ExperimentId,
) {
    let named = |id: ExperimentId| Scope::Named(id.to_string());
    let viewer = user("beta", Role::Viewer);
    assert_eq!(
        judge(core, &viewer, Action::ReadExperiment, named(theirs)),
        Ok(Some(theirs))
    );
    let admin = user("ops", Role::Admin);
    assert_eq!(judge(core, &admin, Action::Cancel, named(theirs)), Ok(None));
    let later = Scope::Named(format!("{theirs}-t7"));
    assert_eq!(judge(core, &admin, Action::Cancel, later), Ok(None));
    for id in [theirs, unknown] {
        let scope = Scope::Experiment(id);
        let node = judge(core, &Principal::Node, Action::ReadExperiment, scope).unwrap_err();
        assert_eq!(node.code, ErrorCode::Forbidden, "{node:?}");
        assert!(node.message.contains("node credential"), "{node:?}");
    }
}

#[test]
fn another_teams_exact_ids_answer_as_unknown_ones() {
    let mut core = HeadCore::restore(CONFIG, LoadedState::default(), 0);
    let theirs = experiment(&mut core, "sweep", "beta");
    // An id of the same shape that nobody here holds.
    let mut elsewhere = HeadCore::restore(CONFIG, LoadedState::default(), 0);
    let unknown = experiment(&mut elsewhere, "x", "beta");
    check_exact_ids_answer_as_unknown(&core, theirs, unknown);
    check_owners_admins_and_nodes_as_before(&core, theirs, unknown);
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
