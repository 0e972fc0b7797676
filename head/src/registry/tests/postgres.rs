//! The registry's tests on a real PostgreSQL server (one per test, made with
//! `initdb`), and what only PostgreSQL has: a server restarted under an open
//! registry, a password in the address, the schema made once by two heads.

use std::collections::BTreeMap;

use super::*;
use crate::registry::{CopyError, copy_store, off_runtime};
use crate::test_postgres::TestPostgres;

/// A server, or `None` where PostgreSQL is not installed; where CI runs (`CI`
/// set), which installs it, that is a failure.
fn server() -> Option<TestPostgres> {
    match TestPostgres::start(false) {
        Ok(server) => Some(server),
        Err(reason) => {
            assert!(
                std::env::var_os("CI").is_none(),
                "cannot run in CI, which installs PostgreSQL: {reason}"
            );
            #[expect(clippy::print_stderr, reason = "say why the test is skipped")]
            {
                eprintln!("skipped: {reason}");
            }
            None
        }
    }
}

fn target(server: &TestPostgres) -> PostgresTarget {
    PostgresTarget::parse(&server.address(), None).unwrap()
}

fn opener(server: &TestPostgres) -> impl Fn() -> Registry + '_ {
    move || Registry::open_store(&StoreSpec::Postgres(Box::new(target(server)))).unwrap()
}

macro_rules! on_postgres {
    ($($name:ident),* $(,)?) => {$(
        #[test]
        fn $name() {
            let Some(server) = server() else { return };
            super::$name(&opener(&server));
        }
    )*};
}

on_postgres!(
    committed_is_what_a_fresh_load_returns,
    users_and_the_audit_trail_are_stored_and_numbered,
    a_closed_registry_refuses_commits_and_reads_but_answers_committed,
    metric_pages_hold_each_report_of_their_trial_once,
    a_batch_keeps_the_last_record_of_a_key,
    telemetry_windows_are_stored_replaced_and_removed,
    metric_samples_stride_over_the_history_and_keep_the_newest,
    events_are_read_by_experiment_and_by_trial,
);

#[test]
fn a_restarted_server_closes_the_registry_until_it_answers_again() {
    let Some(mut server) = server() else { return };
    let mut registry = opener(&server)();
    registry.load().unwrap();
    registry.commit(vec![event(1, 10)]).unwrap();
    let reader = registry.reader();
    let read = || reader.events_after(EVENTS_OF, 0, 10);
    assert_eq!(read().unwrap().len(), 1);
    server.stop();
    assert!(read().is_err(), "the reader's connection is gone");
    let failure = registry.commit(vec![event(2, 10)]).unwrap_err();
    assert!(matches!(failure, RegistryError::Postgres(_)), "{failure:?}");
    assert!(!registry.is_open(), "a failed write closes the store");
    assert!(matches!(
        registry.commit(vec![event(2, 10)]),
        Err(RegistryError::Closed)
    ));
    assert!(registry.reopen().is_err(), "the server is still down");
    assert_eq!(registry.committed_event_seq(), 1);
    server.restart().unwrap();
    assert_eq!(read().unwrap().len(), 1, "the reader connects again");
    let loaded = registry.reopen().unwrap();
    assert_eq!(
        event_seqs(&registry, &loaded),
        [1],
        "nothing of the failed commit is stored"
    );
    registry.commit(vec![event(2, 10)]).unwrap();
    assert_eq!(loaded_event_seqs(opener(&server)()), [1, 2]);
}

#[test]
fn an_address_with_a_password_is_refused() {
    let refused = PostgresTarget::parse("postgres://xp:secret@db.example/xp", None).unwrap_err();
    let message = refused.to_string();
    assert!(message.contains("password"), "{message}");
    assert!(
        !message.contains("secret"),
        "the password is not repeated: {message}"
    );
    let kept = PostgresTarget::parse("postgres://xp@db.example/xp", Some("secret")).unwrap();
    assert!(!format!("{kept:?} {kept}").contains("secret"));
    assert!(PostgresTarget::parse("postgres://[", None).is_err());
}

#[test]
fn heads_opening_one_database_at_once_make_its_schema_once() {
    let Some(server) = server() else { return };
    let target = target(&server);
    let opened: Vec<Result<Registry, RegistryError>> = std::thread::scope(|scope| {
        let opens: Vec<_> = (0..4)
            .map(|_| {
                scope.spawn(|| Registry::open_store(&StoreSpec::Postgres(Box::new(target.clone()))))
            })
            .collect();
        opens.into_iter().map(|open| open.join().unwrap()).collect()
    });
    for registry in opened {
        registry.unwrap();
    }
}

#[test]
fn a_record_with_a_nul_character_is_stored_and_read_back() {
    let Some(server) = server() else { return };
    let mut registry = opener(&server)();
    registry.load().unwrap();
    let Record::Event(mut hostile) = event(1, 0) else {
        unreachable!()
    };
    hostile.reason = "before\0after \u{1F600} \\u0000 \"quoted\"".to_owned();
    registry
        .commit(vec![Record::Event(hostile.clone())])
        .unwrap();
    let again = opener(&server)();
    let stored = again.reader().events_after(EVENTS_OF, 0, 10).unwrap();
    assert_eq!(stored[0].reason, hostile.reason);
    let newest = again
        .reader()
        .newest_events_of_trial(hostile.trial, 10)
        .unwrap();
    assert_eq!(newest[0].reason, hostile.reason);
}

#[test]
fn a_store_is_copied_to_postgres_and_back_row_for_row() {
    let Some(server) = server() else { return };
    let dir = tempfile::tempdir().unwrap();
    let redb = StoreSpec::Redb(dir.path().join("head.redb"));
    let mut registry = Registry::open_store(&redb).unwrap();
    registry.load().unwrap();
    // More metric reports than one page of a copy, over trials whose ids share prefixes.
    for page in 0..3 {
        let reports = (0..4_000).map(|step| a_metric(step % 11, page * 4_000 + u64::from(step)));
        registry.commit(reports.collect()).unwrap();
    }
    registry
        .commit((1..=50).map(|seq| event(seq, 20)).collect())
        .unwrap();
    drop(registry);
    super::users_and_the_audit_trail_are_stored_and_numbered(&|| {
        Registry::open_store(&redb).unwrap()
    });
    let next = Registry::open_store(&redb).unwrap().next;

    let postgres = StoreSpec::Postgres(Box::new(target(&server)));
    let copied = copy_store(&redb, &postgres).unwrap();
    let rows = |name| {
        copied
            .iter()
            .find(|table| table.table == name)
            .unwrap()
            .rows
    };
    assert_eq!(
        (
            rows("metrics"),
            rows("events"),
            rows("users"),
            rows("audit")
        ),
        (12_000, 50, 1, 4)
    );
    assert_eq!(
        Registry::open_store(&postgres).unwrap().next,
        next,
        "numbering goes on"
    );
    let refused = copy_store(&redb, &postgres).unwrap_err();
    assert!(matches!(refused, CopyError::NotEmpty { .. }), "{refused}");
    let missing = StoreSpec::Redb(dir.path().join("no-such.redb"));
    let refused = copy_store(&missing, &postgres).unwrap_err();
    assert!(matches!(refused, CopyError::NoSource { .. }), "{refused}");
    assert!(
        !dir.path().join("no-such.redb").exists(),
        "a missing source was created"
    );

    let back = StoreSpec::Redb(dir.path().join("back.redb"));
    assert_eq!(copy_store(&postgres, &back).unwrap(), copied);
    let again = Registry::open_store(&back).unwrap();
    // The copy's events are indexed as they are imported.
    assert_eq!(loaded_event_seqs(again), (1..=50).collect::<Vec<_>>());
    let again = Registry::open_store(&back).unwrap();
    let of_trial_3 = 3 * (0..4_000).filter(|step| step % 11 == 3).count();
    assert_eq!(again.metrics_of(a_trial(3)).unwrap().len(), of_trial_3);
}

/// A pipeline record whose code version says which write it was.
fn pipeline(id: u64, version: &str) -> Record {
    Record::Pipeline(xp_head_core::PipelineRecord {
        id,
        spec_json: "{}".to_owned(),
        code_version: version.to_owned(),
        data_version: String::new(),
        submitted_at: 1,
        cancelled: false,
        stages: BTreeMap::new(),
    })
}

#[test]
fn a_standby_following_the_store_loads_what_a_fresh_load_returns() {
    let Some(server) = server() else { return };
    let open = opener(&server);
    let mut leader = open();
    leader.load().unwrap();
    leader
        .commit(vec![
            pipeline(1, "a"),
            pipeline(2, "a"),
            event(1, 10),
            event(2, 10),
        ])
        .unwrap();
    let mut standby = open();
    assert_eq!(
        standby.follow().unwrap(),
        Some(2),
        "events are numbered, not read"
    );
    assert_eq!(standby.committed_event_seq(), 2);

    // A replaced row and a new one are what changed, and all a follow reads;
    // of the events changed, only the newest number.
    leader
        .commit(vec![
            pipeline(2, "b"),
            pipeline(3, "a"),
            event(2, 30),
            event(3, 10),
        ])
        .unwrap();
    let through = standby.following.unwrap();
    let changed = standby.store.changes(through).unwrap().unwrap();
    assert_eq!(changed.records.len(), 2, "{changed:?}");
    assert_eq!(changed.last_event_seq, Some(3));
    assert_eq!(standby.follow().unwrap(), Some(2));
    let unchanged = standby
        .store
        .changes(standby.following.unwrap())
        .unwrap()
        .unwrap();
    assert!(unchanged.records.is_empty());
    assert_eq!(unchanged.last_event_seq, None);

    // Taking over reads the last changes; the copy is what a fresh load returns.
    leader.commit(vec![event(4, 10)]).unwrap();
    let taken_over = standby.load().unwrap();
    let fresh = open().load().unwrap();
    assert_eq!(event_seqs(&standby, &taken_over), [1, 2, 3, 4]);
    assert_eq!(fresh.last_event_seq, 4);
    assert_eq!(
        format!("{:?}", taken_over.pipelines),
        format!("{:?}", fresh.pipelines)
    );
    assert_eq!(taken_over.pipelines[1].code_version, "b");
    let replaced = standby.reader().events_after(EVENTS_OF, 1, 1).unwrap();
    assert_eq!(replaced[0].reason.len(), 30);
    assert!(
        standby.following.is_none(),
        "a leader's commits keep its copy"
    );
    assert_eq!(standby.committed_event_seq(), 4);
}

/// Ends the lead's lease at once, as if its holder stopped renewing it long ago.
fn expire_the_lease(server: &TestPostgres) {
    let target = target(server);
    off_runtime(move || {
        let mut client = target.connect().unwrap();
        client
            .execute(
                "UPDATE xp_leader SET expires_at = now() - interval '1 second'",
                &[],
            )
            .unwrap();
    });
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deposed_leader_cannot_commit_and_the_new_one_can() {
    let Some(server) = server() else { return };
    let mut old = opener(&server)();
    old.load().unwrap();
    let first = crate::leader::lead(&target(&server), "h1:1").await;
    old.fence(first.epoch, &first.holder);
    old.commit(vec![event(1, 10)]).unwrap();

    // While the lease runs, no other head takes the lead.
    let store = target(&server);
    let waiting = tokio::time::timeout(
        std::time::Duration::from_millis(600),
        crate::leader::lead(&store, "h2:1"),
    );
    assert!(
        waiting.await.is_err(),
        "a second head led while the lease ran"
    );

    expire_the_lease(&server);
    let second = crate::leader::lead(&target(&server), "h2:1").await;
    assert_eq!(second.epoch, first.epoch + 1);
    let refused = old.commit(vec![event(2, 10)]).unwrap_err();
    assert!(
        matches!(refused, RegistryError::Fenced { epoch } if epoch == first.epoch),
        "{refused}"
    );
    assert!(
        refused.to_string().contains("another head leads"),
        "{refused}"
    );

    let mut new = opener(&server)();
    let loaded = new.load().unwrap();
    assert_eq!(
        event_seqs(&new, &loaded),
        [1],
        "nothing of the refused commit is stored"
    );
    new.fence(second.epoch, &second.holder);
    new.commit(vec![event(2, 10)]).unwrap();
    assert_eq!(loaded_event_seqs(opener(&server)()), [1, 2]);
}

#[test]
fn a_store_over_tls_is_verified_and_encrypted() {
    let server = match TestPostgres::start_tls() {
        Ok(server) => server,
        Err(reason) => {
            assert!(
                std::env::var_os("CI").is_none(),
                "cannot run in CI: {reason}"
            );
            return;
        }
    };
    let address = server.tls_address().unwrap();
    let target = PostgresTarget::parse(&address, None)
        .unwrap()
        .with_ca_file(&server.ca_file())
        .unwrap();
    let mut registry =
        Registry::open_store(&StoreSpec::Postgres(Box::new(target.clone()))).unwrap();
    registry.load().unwrap();
    registry.commit(vec![event(1, 10)]).unwrap();
    let encrypted: bool = off_runtime(|| {
        let mut client = target.connect().unwrap();
        client
            .query_one(
                "SELECT ssl FROM pg_stat_ssl WHERE pid = pg_backend_pid()",
                &[],
            )
            .unwrap()
            .get(0)
    });
    assert!(encrypted, "the connection is not TLS");

    // Asking for TLS without a CA to check the server against is refused, and
    // a server whose certificate another CA signed is refused.
    let unverified = PostgresTarget::parse(&address, None).unwrap();
    assert!(Registry::open_store(&StoreSpec::Postgres(Box::new(unverified))).is_err());
    let other = TestPostgres::start_tls().unwrap();
    let wrong_ca = PostgresTarget::parse(&address, None)
        .unwrap()
        .with_ca_file(&other.ca_file())
        .unwrap();
    let refused = Registry::open_store(&StoreSpec::Postgres(Box::new(wrong_ca))).unwrap_err();
    assert!(refused.to_string().contains("certificate"), "{refused}");
}
