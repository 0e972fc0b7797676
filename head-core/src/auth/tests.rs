//! The authorization table, cell by cell: every role (and the node credential)
//! against every action, on its own team's work and on another team's.

use super::*;

/// One row per action: what viewer, member, team-admin, admin and a node may
/// do. `b` both on its own and another team's work, `o` on its own team's
/// only, `-` neither. Written out by hand from the table, not derived
/// from the code.
const TABLE: [(Action, [char; 5]); 17] = [
    //                          viewer member team-admin admin node
    (Action::ListExperiments, ['o', 'o', 'o', 'b', '-']),
    (Action::ReadExperiment, ['o', 'o', 'o', 'b', '-']),
    (Action::ReadCluster, ['o', 'o', 'o', 'b', '-']),
    (Action::ReadAudit, ['-', '-', '-', 'b', '-']),
    (Action::Submit, ['-', 'o', 'o', 'b', '-']),
    (Action::Cancel, ['-', 'o', 'o', 'b', '-']),
    (Action::Hold, ['-', 'o', 'o', 'b', '-']),
    (Action::Release, ['-', 'o', 'o', 'b', '-']),
    (Action::Priority, ['-', '-', 'o', 'b', '-']),
    (Action::Move, ['-', '-', 'o', 'b', '-']),
    (Action::ApplyPolicy, ['-', '-', '-', 'b', '-']),
    (Action::StoreObjects, ['-', 'o', 'o', 'b', '-']),
    (Action::LocateObject, ['-', 'o', 'o', 'b', 'b']),
    (Action::FetchBlob, ['-', '-', '-', '-', 'b']),
    (Action::SharingDrivers, ['-', '-', '-', '-', 'b']),
    (Action::ReadClusterReport, ['-', '-', '-', 'b', '-']),
    (Action::ArbitratePreemption, ['-', '-', '-', 'b', '-']),
];

fn user(role: Role) -> Principal {
    Principal::User {
        name: "ana".to_owned(),
        team: "vision".to_owned(),
        role,
    }
}

/// The targets that stand for "own team" and "another team" for `action`:
/// cluster-wide actions have no team, so both are the cluster.
fn targets(action: Action) -> [Target<'static>; 2] {
    match action {
        Action::ListExperiments
        | Action::ReadCluster
        | Action::ReadAudit
        | Action::ReadClusterReport
        | Action::ArbitratePreemption
        | Action::ApplyPolicy
        | Action::StoreObjects
        | Action::LocateObject
        | Action::FetchBlob
        | Action::SharingDrivers => [Target::Cluster, Target::Cluster],
        Action::Move => [
            Target::Queue {
                team: "vision",
                queue_owner: Some("vision"),
            },
            Target::Queue {
                team: "nlp",
                queue_owner: Some("nlp"),
            },
        ],
        _ => [Target::Team("vision"), Target::Team("nlp")],
    }
}

#[test]
fn every_cell_of_the_table() {
    assert_eq!(TABLE.len(), Action::ALL.len(), "every action has a row");
    let mut cells = 0;
    for (action, row) in TABLE {
        let principals = [
            user(Role::Viewer),
            user(Role::Member),
            user(Role::TeamAdmin),
            user(Role::Admin),
            Principal::Node,
        ];
        for (principal, cell) in principals.iter().zip(row) {
            let [own, other] = targets(action);
            let cluster_wide = own == other;
            let expected_own = cell != '-';
            // A cluster-wide action has no other team: `o` means allowed there.
            let expected_other = cell == 'b' || (cluster_wide && cell == 'o');
            for (target, expected) in [(own, expected_own), (other, expected_other)] {
                let result = authorize(principal, action, target);
                assert_eq!(
                    result.is_ok(),
                    expected,
                    "{principal} {action:?} on {target:?}: {result:?}"
                );
                if let Err(refusal) = result {
                    let text = refusal.to_string();
                    assert!(text.contains(action.describe()), "{text}");
                    assert!(
                        text.contains("needs role")
                            || text.contains("only an admin")
                            || text.contains("only nodes")
                            || text.contains("user credential"),
                        "a refusal says what would allow it: {text}"
                    );
                }
                cells += 1;
            }
        }
    }
    assert_eq!(cells, TABLE.len() * 5 * 2);
}

#[test]
fn a_refusal_names_the_role_that_would_allow_it() {
    let refusal = authorize(&user(Role::Viewer), Action::Submit, Target::Team("vision"))
        .unwrap_err()
        .to_string();
    assert_eq!(
        refusal,
        "user ana (viewer of team vision) may not submit work of team vision: needs role member or above (you are viewer)"
    );
    let refusal = authorize(&user(Role::Member), Action::Cancel, Target::Team("nlp"))
        .unwrap_err()
        .to_string();
    assert!(
        refusal.contains("only an admin may act on another team's work"),
        "{refusal}"
    );
    let refusal = authorize(&Principal::Node, Action::Submit, Target::Team("nlp"))
        .unwrap_err()
        .to_string();
    assert!(refusal.contains("needs a user credential"), "{refusal}");
}

#[test]
fn a_team_admin_moves_only_into_queues_its_team_may_use() {
    let principal = user(Role::TeamAdmin);
    let into = |queue_owner| Target::Queue {
        team: "vision",
        queue_owner,
    };
    assert!(authorize(&principal, Action::Move, into(Some("vision"))).is_ok());
    assert!(authorize(&principal, Action::Move, into(None)).is_ok());
    assert!(authorize(&principal, Action::Move, into(Some("nlp"))).is_err());
    assert!(authorize(&user(Role::Admin), Action::Move, into(Some("nlp"))).is_ok());
}

#[test]
fn visibility_and_the_submission_team() {
    assert!(user(Role::Member).visible_team().shows("vision"));
    assert!(!user(Role::Member).visible_team().shows("nlp"));
    assert!(user(Role::Admin).visible_team().shows("nlp"));
    assert!(!Principal::Node.visible_team().shows("vision"));
    assert_eq!(submit_team(&user(Role::Member), "default"), "vision");
    assert_eq!(submit_team(&user(Role::Member), "nlp"), "nlp");
    assert_eq!(submit_team(&user(Role::Admin), "default"), "default");
}

#[test]
fn roles_parse_and_print() {
    for role in Role::ALL {
        assert_eq!(role.as_str().parse::<Role>().unwrap(), role);
    }
    assert!(
        "owner"
            .parse::<Role>()
            .unwrap_err()
            .to_string()
            .contains("team-admin")
    );
}
