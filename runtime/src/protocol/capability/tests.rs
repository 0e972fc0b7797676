//! The capability's pure parts: signing and verifying, expiry, revocation and
//! scope, each checked against an expectation.

use proptest::prelude::*;

use super::*;

const NOW: u64 = 1_800_000_000_000;

fn key() -> CapabilityKey {
    CapabilityKey::derive("cluster-token")
}

fn experiment(digest: u64) -> ExperimentId {
    ExperimentId { digest, run: 1 }
}

fn trial(digest: u64, index: u32) -> TrialId {
    TrialId {
        experiment: experiment(digest),
        index,
    }
}

fn session_grant() -> Grant {
    Grant {
        holder: Holder::Session("driver-1".to_owned()),
        subject: "alice".to_owned(),
        team: "alpha".to_owned(),
        read: vec![
            ReadScope::Driver("driver-1".to_owned()),
            ReadScope::Experiment(experiment(7)),
        ],
        issued_ms: NOW,
        expires_ms: NOW + SESSION_CAPABILITY_MS,
    }
}

fn attempt_grant() -> Grant {
    Grant {
        holder: Holder::Attempt {
            trial: trial(7, 0),
            attempt: 2,
        },
        read: vec![ReadScope::Trial(trial(7, 0))],
        ..session_grant()
    }
}

/// Verifies `capability` at `now` against `revoked` and compares the outcome
/// with `expected` (`Ok(())` or the error).
fn check(
    capability: &ObjectCapability,
    now: u64,
    revoked: &RevocationList,
    expected: Result<(), CapabilityError>,
) {
    let outcome = capability.verify(&key(), now, revoked).map(|_| ());
    assert_eq!(outcome, expected, "{capability:?} at {now}");
}

fn revoked_with(entries: &[RevocationEntry]) -> RevocationList {
    let mut list = RevocationList::default();
    for entry in entries {
        list.add(entry.clone());
    }
    list
}

#[test]
fn an_issued_capability_verifies_and_any_change_to_it_does_not() {
    let none = RevocationList::default();
    let issued = ObjectCapability::issue(&key(), session_grant());
    check(&issued, NOW, &none, Ok(()));
    let altered: Vec<fn(&mut ObjectCapability)> = vec![
        |c| c.grant.subject = "mallory".to_owned(),
        |c| c.grant.team = "beta".to_owned(),
        |c| c.grant.holder = Holder::Session("driver-2".to_owned()),
        |c| c.grant.read.push(ReadScope::Everything),
        |c| c.grant.read[1] = ReadScope::Experiment(experiment(8)),
        |c| c.grant.expires_ms += 1,
        |c| c.grant.issued_ms += 1,
        |c| c.mac[0] ^= 1,
    ];
    for alter in altered {
        let mut forged = issued.clone();
        alter(&mut forged);
        check(&forged, NOW, &none, Err(CapabilityError::BadSignature));
    }
    let other_cluster = ObjectCapability::issue(&CapabilityKey::derive("other"), session_grant());
    check(
        &other_cluster,
        NOW,
        &none,
        Err(CapabilityError::BadSignature),
    );
    let mut future = issued.clone();
    future.format = 2;
    check(
        &future,
        NOW,
        &none,
        Err(CapabilityError::UnknownFormat { format: 2 }),
    );
}

#[test]
fn a_capability_expires_after_its_expiry_and_the_allowed_skew() {
    let none = RevocationList::default();
    let issued = ObjectCapability::issue(&key(), session_grant());
    let expires_ms = NOW + SESSION_CAPABILITY_MS;
    check(&issued, expires_ms, &none, Ok(()));
    check(&issued, expires_ms + CLOCK_SKEW_MS, &none, Ok(()));
    let late = expires_ms + CLOCK_SKEW_MS + 1;
    check(
        &issued,
        late,
        &none,
        Err(CapabilityError::Expired {
            expires_ms,
            now_ms: late,
        }),
    );
}

#[test]
fn revocations_cover_their_holder_their_subject_before_a_time_and_old_sessions() {
    let session = ObjectCapability::issue(&key(), session_grant());
    let attempt = ObjectCapability::issue(&key(), attempt_grant());
    let until_ms = NOW + SESSION_CAPABILITY_MS;
    let entry = |revocation| RevocationEntry {
        revocation,
        until_ms,
    };
    let revoked = |reason: &str| {
        Err(CapabilityError::Revoked {
            reason: reason.to_owned(),
        })
    };
    let ended = revoked_with(&[entry(Revocation::Holder(Holder::Session(
        "driver-1".to_owned(),
    )))]);
    check(
        &session,
        NOW,
        &ended,
        revoked("driver session driver-1 ended"),
    );
    check(&attempt, NOW, &ended, Ok(()));
    let attempt_ended = revoked_with(&[entry(Revocation::Holder(attempt_grant().holder))]);
    check(
        &attempt,
        NOW,
        &attempt_ended,
        revoked("trial 0000000000000007-t0 attempt 2 ended"),
    );
    let subject = |before_ms| {
        revoked_with(&[entry(Revocation::Subject {
            subject: "alice".to_owned(),
            before_ms,
        })])
    };
    let user = "user alice was revoked or changed after it was issued";
    check(&session, NOW, &subject(NOW + 1), revoked(user));
    check(&attempt, NOW, &subject(NOW + 1), revoked(user));
    check(&session, NOW, &subject(NOW), Ok(()));
    let restarted = revoked_with(&[entry(Revocation::SessionsBefore { before_ms: NOW + 1 })]);
    check(
        &session,
        NOW,
        &restarted,
        revoked("the head restarted after it was issued, ending its session"),
    );
    check(&attempt, NOW, &restarted, Ok(()));
}

#[test]
fn a_revocation_is_kept_until_what_it_covers_has_expired_and_is_handed_on_whole() {
    let until_ms = NOW + 1000;
    let entries = [
        RevocationEntry {
            revocation: Revocation::Holder(Holder::Session("driver-1".to_owned())),
            until_ms,
        },
        RevocationEntry {
            revocation: Revocation::Subject {
                subject: "alice".to_owned(),
                before_ms: NOW,
            },
            until_ms,
        },
        RevocationEntry {
            revocation: Revocation::SessionsBefore { before_ms: NOW },
            until_ms,
        },
    ];
    let mut list = revoked_with(&entries);
    assert_eq!(list.entries(), entries);
    assert_eq!(revoked_with(&list.entries()), list);
    list.prune(until_ms + CLOCK_SKEW_MS);
    assert_eq!(list.len(), 3, "kept through the allowed skew");
    list.prune(until_ms + CLOCK_SKEW_MS + 1);
    assert!(list.is_empty(), "{list:?}");
}

#[test]
fn a_grant_reads_what_its_scopes_name_and_writes_only_as_its_session() {
    let id = ObjectId::of(b"x");
    let other = ObjectId::of(b"y");
    let grant = |read: Vec<ReadScope>| Grant {
        read,
        ..session_grant()
    };
    let check_reads = |read: Vec<ReadScope>, trials: &[TrialId], drivers: &[&str], expected| {
        let drivers: Vec<String> = drivers.iter().map(|name| (*name).to_owned()).collect();
        assert_eq!(
            grant(read.clone()).may_read(id, trials, &drivers),
            expected,
            "{read:?} over {trials:?} {drivers:?}"
        );
    };
    check_reads(vec![ReadScope::Everything], &[], &[], true);
    check_reads(vec![ReadScope::Object(id)], &[], &[], true);
    check_reads(
        vec![ReadScope::Object(other)],
        &[trial(7, 0)],
        &["d"],
        false,
    );
    check_reads(
        vec![ReadScope::Experiment(experiment(7))],
        &[trial(7, 3)],
        &[],
        true,
    );
    check_reads(
        vec![ReadScope::Experiment(experiment(8))],
        &[trial(7, 3)],
        &[],
        false,
    );
    check_reads(
        vec![ReadScope::Trial(trial(7, 0))],
        &[trial(7, 0)],
        &[],
        true,
    );
    check_reads(
        vec![ReadScope::Trial(trial(7, 0))],
        &[trial(7, 1)],
        &[],
        false,
    );
    check_reads(vec![ReadScope::Driver("d".to_owned())], &[], &["d"], true);
    check_reads(vec![ReadScope::Driver("d".to_owned())], &[], &["e"], false);
    check_reads(vec![], &[trial(7, 0)], &["d"], false);
    assert_eq!(session_grant().writes_as(), Some("driver-1"));
    assert_eq!(attempt_grant().writes_as(), None);
}

#[test]
fn a_grant_over_its_bounds_is_refused_even_when_signed() {
    let none = RevocationList::default();
    let many = Grant {
        read: vec![ReadScope::Everything; MAX_READ_SCOPES + 1],
        ..session_grant()
    };
    check(
        &ObjectCapability::issue(&key(), many),
        NOW,
        &none,
        Err(CapabilityError::TooManyScopes {
            scopes: MAX_READ_SCOPES + 1,
        }),
    );
    let long = Grant {
        team: "t".repeat(MAX_GRANT_NAME_BYTES + 1),
        ..session_grant()
    };
    check(
        &ObjectCapability::issue(&key(), long),
        NOW,
        &none,
        Err(CapabilityError::NameTooLong {
            len: MAX_GRANT_NAME_BYTES + 1,
        }),
    );
}

#[test]
fn the_debug_of_a_capability_or_key_shows_no_secret() {
    let issued = ObjectCapability::issue(&key(), session_grant());
    let shown = format!("{issued:?} {:?}", key());
    assert!(!shown.contains(&format!("{:?}", issued.mac)), "{shown}");
    assert!(
        !shown.contains(&format!("{:?}", key().to_bytes())),
        "{shown}"
    );
    assert!(shown.contains("<redacted>"), "{shown}");
}

fn any_scope() -> impl Strategy<Value = ReadScope> {
    prop_oneof![
        Just(ReadScope::Everything),
        any::<u64>().prop_map(|digest| ReadScope::Experiment(experiment(digest))),
        (any::<u64>(), any::<u32>())
            .prop_map(|(digest, index)| ReadScope::Trial(trial(digest, index))),
        "[a-z0-9-]{0,20}".prop_map(ReadScope::Driver),
        any::<[u8; 32]>().prop_map(|bytes| ReadScope::Object(ObjectId(bytes))),
    ]
}

fn any_grant() -> impl Strategy<Value = Grant> {
    (
        "[a-z]{1,10}",
        "[a-z]{1,10}",
        proptest::collection::vec(any_scope(), 0..8),
        any::<u32>(),
        any::<bool>(),
    )
        .prop_map(|(subject, team, read, issued, session)| Grant {
            holder: if session {
                Holder::Session(format!("driver-{issued}"))
            } else {
                Holder::Attempt {
                    trial: trial(u64::from(issued), issued),
                    attempt: 1,
                }
            },
            subject,
            team,
            read,
            issued_ms: u64::from(issued),
            expires_ms: u64::from(issued) + 1000,
        })
}

proptest! {
    /// Whatever the grant, it survives the wire and verifies; one flipped bit
    /// anywhere in its signed fields does not.
    #[test]
    fn random_grants_round_trip_and_verify(grant in any_grant(), flip in any::<u8>()) {
        let issued = ObjectCapability::issue(&key(), grant);
        let config = bincode::config::standard();
        let bytes = bincode::serde::encode_to_vec(&issued, config).unwrap();
        let (decoded, _): (ObjectCapability, usize) =
            bincode::serde::decode_from_slice(&bytes, config).unwrap();
        prop_assert_eq!(&decoded, &issued);
        let none = RevocationList::default();
        prop_assert!(decoded.verify(&key(), decoded.grant.issued_ms, &none).is_ok());
        let mut forged = decoded.clone();
        forged.grant.issued_ms ^= 1 << (flip % 64);
        prop_assert_eq!(
            forged.verify(&key(), 0, &none).map(|_| ()),
            Err(CapabilityError::BadSignature)
        );
    }
}

/// One step of [`pruning_keeps_what_a_full_walk_keeps`].
#[derive(Debug, Clone)]
enum ListStep {
    Add(RevocationEntry),
    Prune(u64),
}

fn any_list_step() -> impl Strategy<Value = ListStep> {
    let revocation = prop_oneof![
        (0..4u32).prop_map(|n| Revocation::Holder(Holder::Session(format!("driver-{n}")))),
        (0..4u32).prop_map(|attempt| Revocation::Holder(Holder::Attempt {
            trial: trial(7, 0),
            attempt,
        })),
        (0..3u32, 0..100u64).prop_map(|(n, before_ms)| Revocation::Subject {
            subject: format!("user-{n}"),
            before_ms,
        }),
        (0..100u64).prop_map(|before_ms| Revocation::SessionsBefore { before_ms }),
    ];
    prop_oneof![
        (revocation, 0..200_000u64).prop_map(|(revocation, until_ms)| ListStep::Add(
            RevocationEntry {
                revocation,
                until_ms
            }
        )),
        (0..250_000u64).prop_map(ListStep::Prune),
    ]
}

proptest! {
    /// Pruning by expiry keeps exactly what a walk over every entry kept,
    /// whatever the order of additions (a holder revoked again later, a
    /// subject's entry extended) and prunes.
    #[test]
    fn pruning_keeps_what_a_full_walk_keeps(
        steps in proptest::collection::vec(any_list_step(), 0..60),
    ) {
        let mut list = RevocationList::default();
        let mut model: BTreeMap<String, RevocationEntry> = BTreeMap::new();
        let key_of = |revocation: &Revocation| match revocation {
            Revocation::Holder(holder) => format!("holder {holder}"),
            Revocation::Subject { subject, .. } => format!("subject {subject}"),
            Revocation::SessionsBefore { .. } => "sessions".to_owned(),
        };
        for step in steps {
            match step {
                ListStep::Add(entry) => {
                    let kept = model.entry(key_of(&entry.revocation)).or_insert_with(|| entry.clone());
                    kept.until_ms = kept.until_ms.max(entry.until_ms);
                    if let (
                        Revocation::Subject { before_ms: kept, .. }
                        | Revocation::SessionsBefore { before_ms: kept },
                        Revocation::Subject { before_ms: new, .. }
                        | Revocation::SessionsBefore { before_ms: new },
                    ) = (&mut kept.revocation, &entry.revocation)
                    {
                        *kept = (*kept).max(*new);
                    }
                    list.add(entry);
                }
                ListStep::Prune(now) => {
                    model.retain(|_, entry| entry.until_ms + CLOCK_SKEW_MS >= now);
                    list.prune(now);
                }
            }
            let mut expected: Vec<RevocationEntry> = model
                .values()
                .filter(|entry| !matches!(entry.revocation, Revocation::SessionsBefore { before_ms: 0 }))
                .cloned()
                .collect();
            let mut kept = list.entries();
            expected.sort_by_key(|entry| format!("{entry:?}"));
            kept.sort_by_key(|entry| format!("{entry:?}"));
            prop_assert_eq!(kept, expected);
        }
    }
}

proptest! {
    /// A list built at once from entries is the list adding them one by one
    /// makes.
    #[test]
    fn a_list_built_at_once_is_the_list_added_one_by_one(
        steps in proptest::collection::vec(any_list_step(), 0..60),
    ) {
        let entries: Vec<RevocationEntry> = steps
            .into_iter()
            .filter_map(|step| match step {
                ListStep::Add(entry) => Some(entry),
                ListStep::Prune(_) => None,
            })
            .collect();
        let mut added = RevocationList::default();
        for entry in entries.clone() {
            added.add(entry);
        }
        prop_assert_eq!(entries.into_iter().collect::<RevocationList>(), added);
    }
}

/// The head splits the revocations a registering node gets into commands of
/// at most `MAX_REVOCATIONS_PER_COMMAND`: one of that many, each of the
/// longest a grant may name, still fits a frame.
#[cfg(feature = "net")]
#[test]
fn a_command_of_the_most_revocations_of_the_longest_names_fits_a_frame() {
    use crate::protocol::{HeadCommand, Message};
    let name = "n".repeat(MAX_GRANT_NAME_BYTES);
    let entries = (0..MAX_REVOCATIONS_PER_COMMAND)
        .map(|n| RevocationEntry {
            revocation: if n % 2 == 0 {
                Revocation::Holder(Holder::Session(name.clone()))
            } else {
                Revocation::Subject {
                    subject: name.clone(),
                    before_ms: u64::MAX,
                }
            },
            until_ms: u64::MAX,
        })
        .collect();
    let message = Message::ToNode(HeadCommand::RevokeCapabilities(entries));
    let frame = crate::frame::encode(&message).expect("within a frame");
    assert!(frame.len() <= crate::frame::MAX_FRAME_BYTES);
}
