//! Tests of the request table: every request maps to its action, long names
//! and large specs are refused before anything reads them.

use xp_runtime::ids::BlobHash;
use xp_runtime::protocol::{AdminAction, AdminRequest, Request};

use super::*;
use crate::auth::Action;

fn action_of(request: &Request) -> Action {
    access(request).action
}

fn admitted(request: &Request) -> Result<(), CoreError> {
    admit(request, &access(request))
}

#[test]
fn node_work_and_admin_actions_map_to_their_actions() {
    let hash = BlobHash::of(b"x");
    assert_eq!(action_of(&Request::GetBlob { hash }), Action::FetchBlob);
    assert_eq!(
        action_of(&Request::PutBlob { hash, len: 1 }),
        Action::StoreObjects
    );
    assert_eq!(action_of(&Request::ObjectKey), Action::StoreObjects);
    let admin = Request::Admin(AdminRequest {
        action: AdminAction::Move {
            id: "abc".to_owned(),
            queue: "q".to_owned(),
        },
        who: "whoever the client says".to_owned(),
        why: String::new(),
    });
    let moved = access(&admin);
    assert_eq!(moved.action, Action::Move);
    assert_eq!(moved.describe(), "move abc to queue q");
}

#[test]
fn a_name_too_long_is_refused_before_it_is_resolved() {
    let long = "a".repeat(crate::auth::access::MAX_NAME_BYTES + 1);
    let refused = admitted(&Request::Cancel { id: long }).unwrap_err();
    assert!(matches!(refused, CoreError::NameTooLong(_)), "{refused}");
    let refused = admitted(&Request::Admin(AdminRequest {
        action: AdminAction::Move {
            id: "abc".to_owned(),
            queue: "q".repeat(crate::auth::access::MAX_NAME_BYTES + 1),
        },
        who: String::new(),
        why: String::new(),
    }))
    .unwrap_err();
    assert!(refused.to_string().contains("queue name"), "{refused}");
}

#[test]
fn changes_wait_for_their_commit_and_reads_do_not() {
    assert!(changes(&Request::Cancel { id: "a".to_owned() }));
    assert!(changes(&Request::RetryPipeline { pipeline: 1 }));
    assert!(!changes(&Request::Nodes));
    assert!(
        !changes(&Request::StoreTargets),
        "driver sessions are soft state"
    );
    assert!(names_session(&Request::StoreTargets));
    assert!(!names_session(&Request::Nodes));
}

#[test]
fn reads_that_grow_with_what_the_head_keeps_are_heavy() {
    assert!(heavy(&Request::Status { experiment: None }));
    assert!(heavy(&Request::Audit { limit: 10 }));
    assert!(!heavy(&Request::Nodes));
    assert!(!heavy(&Request::Cancel { id: "a".to_owned() }));
    let events = Request::Events {
        experiment: ExperimentId::from_content_hash(&[1; 32], 1),
        after: 0,
        wait_ms: 1_000,
    };
    assert!(!heavy(&events), "a wait holds no turn");
}
