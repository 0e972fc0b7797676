//! Tests of the user id table, the pool's machine-wide claims, its scrubs
//! and its cursor across restarts.

use super::*;

fn key(trial: u32, rank: u32) -> WorkerKey {
    WorkerKey {
        trial: format!("3f2a9c0d11b2e4f7-t{trial}").parse().expect("trial"),
        attempt: 1,
        rank,
    }
}

#[track_caller]
fn check_parse(text: &str, expected: Result<WorkerUids, &str>) {
    let parsed = text
        .parse::<WorkerUids>()
        .map_err(|error| error.to_string());
    assert_eq!(parsed, expected.map_err(str::to_owned), "{text:?}");
}

fn range(start: u32, end: u32) -> WorkerUids {
    WorkerUids::Range(UidRange { start, end })
}

#[test]
fn ranges_parse_and_bad_ones_are_refused_clearly() {
    check_parse("none", Ok(WorkerUids::Off));
    check_parse("NONE", Ok(WorkerUids::Off));
    check_parse("100000-100009", Ok(range(100_000, 100_009)));
    check_parse(" 70000 - 70000 ", Ok(range(70_000, 70_000)));
    check_parse(
        "1900000000-1900009999",
        Ok(WorkerUids::Range(DEFAULT_RANGE)),
    );
    check_parse(
        "",
        Err("\"\" is neither `none` nor a range START-END such as 1900000000-1900009999"),
    );
    check_parse(
        "100000",
        Err("\"100000\" is neither `none` nor a range START-END such as 1900000000-1900009999"),
    );
    check_parse(
        "a-b",
        Err("\"a\" is not a user id (a whole number below 4294967295)"),
    );
    check_parse(
        "-5-10",
        Err("\"\" is not a user id (a whole number below 4294967295)"),
    );
    check_parse(
        "+5-10",
        Err("\"+5\" is not a user id (a whole number below 4294967295)"),
    );
    check_parse(
        "5-99999999999",
        Err("\"99999999999\" is not a user id (a whole number below 4294967295)"),
    );
    check_parse("10-5", Err("the range 10-5 ends before it starts"));
    check_parse(
        "0-10",
        Err("the range 0-10 holds 0 (root), which a worker must never run as"),
    );
    check_parse(
        "65000-66000",
        Err("the range 65000-66000 holds 65534 (nobody), which a worker must never run as"),
    );
    check_parse(
        "65535-65535",
        Err(
            "the range 65535-65535 holds 65535 (-1 to 16-bit interfaces), which a worker must never run as",
        ),
    );
    check_parse(
        "4294967000-4294967295",
        Err(
            "the range 4294967000-4294967295 holds 4294967295 (-1, no id at all), which a worker must never run as",
        ),
    );
}

fn attempt_key(trial: u32, attempt: u32, rank: u32) -> WorkerKey {
    WorkerKey {
        attempt,
        ..key(trial, rank)
    }
}

fn claim(table: &mut UidTable, key: WorkerKey) -> Option<Claimed> {
    table.claim(key, |_| true)
}

#[test]
fn ranks_of_one_attempt_share_an_id_and_other_attempts_never_do() {
    let mut table = UidTable::new(UidRange {
        start: 5000,
        end: 5003,
    });
    let rank0 = claim(&mut table, key(1, 0)).expect("an id");
    assert!(rank0.fresh);
    let rank1 = claim(&mut table, key(1, 1)).expect("an id");
    assert_eq!(
        rank1,
        Claimed {
            uid: rank0.uid,
            fresh: false
        },
        "the second rank joins the first's id"
    );
    let other_trial = claim(&mut table, key(2, 0)).expect("an id");
    let next_attempt = claim(&mut table, attempt_key(1, 2, 0)).expect("an id");
    let mut ids = vec![rank0.uid, other_trial.uid, next_attempt.uid];
    ids.sort_unstable();
    ids.dedup();
    assert_eq!(
        ids.len(),
        3,
        "another trial or attempt gets an id of its own"
    );
    assert!(other_trial.fresh && next_attempt.fresh);
    assert_eq!(
        table.holder(rank0.uid),
        Some((AttemptKey::of(key(1, 0)), 2))
    );
    assert_eq!(table.held(), 3, "three attempts, three ids");
}

#[test]
fn an_id_returns_only_when_its_last_rank_leaves() {
    let mut table = UidTable::new(UidRange {
        start: 6000,
        end: 6001,
    });
    let uid = claim(&mut table, key(1, 0)).expect("an id").uid;
    claim(&mut table, key(1, 1)).expect("joins");
    assert_eq!(table.leave(uid, key(2, 0)), Left::NotHeld, "not its id");
    assert_eq!(
        table.leave(uid, attempt_key(1, 2, 0)),
        Left::NotHeld,
        "nor another attempt's"
    );
    assert_eq!(
        table.leave(uid, key(1, 0)),
        Left::Shared,
        "rank 1 still runs"
    );
    assert_eq!(table.leave(uid, key(1, 0)), Left::NotHeld, "only once");
    assert!(!table.release(uid), "not while a rank holds it");
    assert_eq!(table.leave(uid, key(1, 1)), Left::Last);
    // Returning: nobody gets it, not even a late rank of the same attempt.
    let late = claim(&mut table, key(1, 2)).expect("an id");
    assert_ne!(late.uid, uid);
    assert!(late.fresh);
    assert_eq!(
        claim(&mut table, key(2, 0)),
        None,
        "the returning id is not free"
    );
    assert_eq!(table.leave(uid, key(1, 1)), Left::NotHeld);
    assert!(table.release(uid));
    assert!(!table.release(uid), "once");
    assert_eq!(
        claim(&mut table, key(2, 0)),
        Some(Claimed { uid, fresh: true }),
        "returned, it is free again"
    );
}

#[test]
fn a_returned_id_is_the_last_to_be_reused_and_refused_ids_are_skipped() {
    let mut table = UidTable::new(UidRange {
        start: 7000,
        end: 7004,
    });
    let uid = |claimed: Option<Claimed>| claimed.map(|claimed| claimed.uid);
    let first = claim(&mut table, key(1, 0)).expect("an id").uid;
    assert_eq!(first, 7000);
    assert_eq!(table.leave(first, key(1, 0)), Left::Last);
    assert!(table.release(first));
    // Round the range: the id just returned comes last.
    assert_eq!(uid(claim(&mut table, key(2, 0))), Some(7001));
    // An id held elsewhere (another node, an account) is skipped.
    assert_eq!(uid(table.claim(key(3, 0), |uid| uid != 7002)), Some(7003));
    assert_eq!(uid(claim(&mut table, key(4, 0))), Some(7004));
    assert_eq!(uid(claim(&mut table, key(5, 0))), Some(7000), "wraps round");
    assert_eq!(uid(claim(&mut table, key(6, 0))), Some(7002));
    assert_eq!(claim(&mut table, key(7, 0)), None);
    assert_eq!(
        uid(claim(&mut table, key(3, 1))),
        Some(7003),
        "a full range still takes ranks of a live attempt"
    );
}

/// A scrub that keeps the ids of each batch it ran.
fn counting_scrub() -> (Scrub, Arc<Mutex<Vec<BTreeSet<u32>>>>) {
    let batches = Arc::new(Mutex::new(Vec::new()));
    let seen = batches.clone();
    let scrub: Scrub = Arc::new(move |uids: &BTreeSet<u32>, _since| {
        seen.lock().expect("batches").push(uids.clone());
        Ok(())
    });
    (scrub, batches)
}

/// A pool over ids `start` to `end`, its claims in `dir`, no accounts.
fn pool_over(dir: &Path, start: u32, end: u32, scrub: Scrub) -> Arc<UidPool> {
    let range = UidRange { start, end };
    Arc::new(UidPool::new(range, dir, BTreeSet::new(), scrub).expect("pool"))
}

/// How many batches held `uid`.
fn scrubs_of(batches: &Mutex<Vec<BTreeSet<u32>>>, uid: u32) -> usize {
    let batches = batches.lock().expect("batches");
    batches.iter().filter(|batch| batch.contains(&uid)).count()
}

#[test]
fn the_ids_ahead_are_the_free_ones_in_claiming_order() {
    let mut table = UidTable::new(UidRange { start: 10, end: 14 });
    let uid = |claimed: Option<Claimed>| claimed.map(|claimed| claimed.uid);
    assert_eq!(table.upcoming(3), [10, 11, 12]);
    assert_eq!(uid(claim(&mut table, key(1, 0))), Some(10));
    assert_eq!(uid(claim(&mut table, key(2, 0))), Some(11));
    assert_eq!(table.upcoming(10), [12, 13, 14], "held ids are not ahead");
    assert_eq!(table.leave(10, key(1, 0)), Left::Last);
    assert_eq!(table.upcoming(10), [12, 13, 14], "nor returning ones");
    assert!(table.release(10));
    assert_eq!(table.upcoming(10), [12, 13, 14, 10], "round the range");
    assert_eq!(table.upcoming(0), Vec::<u32>::new());
}

#[tokio::test]
async fn two_pools_sharing_a_lock_directory_never_hand_out_the_same_id() {
    let dir = tempfile::tempdir().expect("tempdir");
    let locks = dir.path().join("uids");
    let range = UidRange {
        start: 8000,
        end: 8003,
    };
    let accounts = BTreeSet::from([8001]);
    let (scrub, scrubs) = counting_scrub();
    let here =
        Arc::new(UidPool::new(range, &locks, accounts.clone(), scrub.clone()).expect("pool"));
    let there = Arc::new(UidPool::new(range, &locks, accounts, scrub).expect("pool"));
    let a = here.claim(key(1, 0)).expect("an id");
    let a1 = here.claim(key(1, 1)).expect("rank 1 joins");
    assert_eq!(a1.uid(), a.uid());
    // Both ranks wait on one scrub.
    let (ready, ready1) = tokio::join!(a.ready(), a1.ready());
    ready.expect("scrubbed");
    ready1.expect("scrubbed");
    assert_eq!(scrubs_of(&scrubs, a.uid()), 1);
    here.swept().await;
    assert!(
        scrubs
            .lock()
            .expect("batches")
            .iter()
            .all(|batch| !batch.contains(&8001)),
        "an account's id is never scrubbed"
    );
    let b = there.claim(key(2, 0)).expect("an id");
    let c = here.claim(key(3, 0)).expect("an id");
    let mut ids = vec![a.uid(), b.uid(), c.uid()];
    ids.sort_unstable();
    assert_eq!(ids, [8000, 8002, 8003], "distinct, and never an account's");
    assert!(
        there.claim(key(1, 0)).is_err(),
        "the other node's attempt of the same key gets no share of this node's id"
    );
    let returned = b.uid();
    drop(b);
    there.swept().await;
    let d = here.claim(key(4, 0)).expect("a returned id is free again");
    assert_eq!(d.uid(), returned);
    // The first rank's share goes; the id stays with rank 1.
    let shared = a.uid();
    drop(a);
    here.swept().await;
    assert_eq!(here.held(), 3);
    assert_eq!(scrubs_of(&scrubs, shared), 1);
    drop(a1);
    here.swept().await;
    assert_eq!(here.held(), 2, "the last rank returned it");
    assert_eq!(
        scrubs_of(&scrubs, shared),
        2,
        "scrubbed before use and once more on return"
    );
    drop((c, d));
    here.swept().await;
    assert_eq!(here.held(), 0);
}

#[tokio::test]
async fn ids_returned_together_share_one_scrub_and_the_ids_ahead_are_scrubbed_before_claims() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (scrub, scrubs) = counting_scrub();
    let pool = pool_over(dir.path(), 7000, 7099, scrub);
    let first = pool.claim(key(0, 0)).expect("an id");
    first.ready().await.expect("scrubbed");
    pool.swept().await;
    let ahead = scrubs_of(&scrubs, 7001);
    assert_eq!(ahead, 1, "the next id was scrubbed ahead of its claim");
    let leases: Vec<UidLease> = (1..=10)
        .map(|trial| pool.claim(key(trial, 0)).expect("an id"))
        .collect();
    for lease in &leases {
        lease.ready().await.expect("clean already");
    }
    let batches_before = scrubs.lock().expect("batches").len();
    assert_eq!(
        scrubs_of(&scrubs, 7001),
        1,
        "claimed clean: no scrub on the way to its start"
    );
    let uids: BTreeSet<u32> = leases.iter().map(UidLease::uid).collect();
    drop(leases);
    pool.swept().await;
    let batches = scrubs.lock().expect("batches").clone();
    let returns: Vec<&BTreeSet<u32>> = batches[batches_before..]
        .iter()
        .filter(|batch| !batch.is_disjoint(&uids))
        .collect();
    assert_eq!(returns.len(), 1, "one scrub for all ten: {returns:?}");
    assert!(returns[0].is_superset(&uids));
    assert_eq!(pool.held(), 1, "all ten freed, the first still held");
    drop(first);
}

#[tokio::test]
async fn an_id_returned_scrubbed_is_not_scrubbed_again_and_one_in_use_is() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (scrub, scrubs) = counting_scrub();
    let pool = pool_over(dir.path(), 9100, 9100, scrub);
    let claim_file = dir.path().join("9100");
    let scrubbed = || scrubs_of(&scrubs, 9100);
    let first = pool.claim(key(1, 0)).expect("an id");
    first.ready().await.expect("scrubbed");
    assert_eq!(scrubbed(), 1, "never used: scrubbed before use");
    assert_eq!(std::fs::read(&claim_file).expect("claim file"), b"");
    drop(first);
    pool.swept().await;
    assert_eq!(scrubbed(), 2, "scrubbed on return");
    assert_eq!(std::fs::read(&claim_file).expect("claim file"), CLEAN);
    let second = pool.claim(key(2, 0)).expect("an id");
    second.ready().await.expect("ready");
    assert_eq!(scrubbed(), 2, "returned clean: no second scrub");
    assert_eq!(
        std::fs::read(&claim_file).expect("claim file"),
        b"",
        "in use: a node dying now leaves it unmarked"
    );
    drop(second);
    pool.swept().await;
    // What a node that died holding the id leaves: an unmarked file.
    std::fs::write(&claim_file, b"").expect("unmark");
    let third = pool.claim(key(3, 0)).expect("an id");
    third.ready().await.expect("scrubbed");
    assert_eq!(scrubbed(), 4, "unmarked: scrubbed before use");
}

#[tokio::test]
async fn a_failed_scrub_refuses_every_rank_and_the_id_still_returns() {
    let dir = tempfile::tempdir().expect("tempdir");
    let scrub: Scrub = Arc::new(|_: &BTreeSet<u32>, _| Err(std::io::Error::other("no shell")));
    let pool = pool_over(dir.path(), 9000, 9000, scrub);
    let first = pool.claim(key(1, 0)).expect("an id");
    let second = pool.claim(key(1, 1)).expect("joins");
    for lease in [&first, &second] {
        let refused = lease.ready().await.expect_err("refused");
        assert_eq!(
            refused.to_string(),
            "cannot clear user id 9000 of what an earlier holder left: no shell"
        );
    }
    drop((first, second));
    pool.swept().await;
    assert_eq!(pool.held(), 0, "returned even so");
    let next = pool.claim(key(2, 0)).expect("an id");
    assert!(
        next.ready().await.is_err(),
        "not marked clean: the next holder scrubs it again"
    );
}

#[tokio::test]
async fn a_starting_node_scrubs_the_ids_an_earlier_run_left_unmarked() {
    let dir = tempfile::tempdir().expect("tempdir");
    for (name, mark) in [
        ("9300", &b""[..]),
        ("9301", CLEAN),
        ("9302", b"garbage"),
        ("9399", b""),
        ("junk", b""),
    ] {
        std::fs::write(dir.path().join(name), mark).expect("claim file");
    }
    // Another node holds 9302 now: not this node's to scrub.
    let held = File::open(dir.path().join("9302")).expect("open");
    let held = Flock::lock(held, FlockArg::LockExclusiveNonblock).expect("lock");
    let (scrub, scrubs) = counting_scrub();
    let pool = pool_over(dir.path(), 9300, 9309, scrub);
    pool.sweep_leftovers();
    pool.swept().await;
    assert_eq!(
        *scrubs.lock().expect("batches"),
        [BTreeSet::from([9300])],
        "only the unmarked file of the range that nobody holds"
    );
    assert_eq!(std::fs::read(dir.path().join("9300")).expect("read"), CLEAN);
    assert_eq!(std::fs::read(dir.path().join("9399")).expect("read"), b"");
    drop(held);
}

#[tokio::test]
async fn a_claim_on_a_full_range_waits_for_ids_returning() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (scrub, _) = counting_scrub();
    let pool = pool_over(dir.path(), 9400, 9400, scrub);
    let first = pool.claim(key(1, 0)).expect("an id");
    first.ready().await.expect("scrubbed");
    drop(first);
    assert!(
        matches!(pool.claim(key(2, 0)), Err(UidClaimError::Exhausted(_))),
        "returning, not free yet"
    );
    let second = pool.claim_soon(key(2, 0)).await.expect("freed meanwhile");
    assert_eq!(second.uid(), 9400);
    let busy = pool.claim_soon(key(3, 0)).await;
    assert!(
        matches!(busy, Err(UidClaimError::Exhausted(_))),
        "held, not returning: refused at once"
    );
}

#[test]
fn a_pool_outside_a_runtime_scrubs_on_the_spot() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (scrub, scrubs) = counting_scrub();
    let pool = pool_over(dir.path(), 9200, 9201, scrub);
    let lease = pool.claim(key(1, 0)).expect("an id");
    let uid = lease.uid();
    drop(lease);
    assert_eq!(pool.held(), 0, "returned before the drop ended");
    assert_eq!(scrubs_of(&scrubs, uid), 1);
}

#[test]
fn a_cursor_file_is_read_only_as_an_id_of_the_range() {
    let range = UidRange {
        start: 5000,
        end: 5009,
    };
    assert_eq!(parse_cursor("5003\n", range), Some(5003));
    assert_eq!(parse_cursor(" 5009 ", range), Some(5009));
    assert_eq!(parse_cursor("4999", range), None, "below the range");
    assert_eq!(parse_cursor("5010", range), None, "above it");
    assert_eq!(parse_cursor("", range), None);
    assert_eq!(parse_cursor("+5003", range), None);
    assert_eq!(parse_cursor("5003 5004", range), None);
    assert_eq!(parse_cursor("99999999999", range), None);
}

#[tokio::test]
async fn a_restarted_pool_goes_on_round_the_range_where_it_stopped() {
    let dir = tempfile::tempdir().expect("tempdir");
    let range = UidRange {
        start: 8100,
        end: 8103,
    };
    let (scrub, _) = counting_scrub();
    let cursor = dir.path().join(CURSOR_FILE);
    let start = |locks: &str| {
        Arc::new(
            UidPool::new(
                range,
                &dir.path().join(locks),
                BTreeSet::new(),
                scrub.clone(),
            )
            .expect("pool")
            .with_cursor_file(cursor.clone()),
        )
    };
    let first = start("locks");
    let lease = first.claim(key(1, 0)).expect("an id");
    assert_eq!(lease.uid(), 8100);
    drop(lease);
    first.swept().await;
    assert_eq!(std::fs::read_to_string(&cursor).expect("kept"), "8101\n");
    drop(first);
    // The node restarts: the first trial gets the next id, not 8100 again.
    let second = start("locks");
    let lease = second.claim(key(2, 0)).expect("an id");
    assert_eq!(lease.uid(), 8101);
    let next = second.claim(key(3, 0)).expect("an id");
    assert_eq!(next.uid(), 8102);
    // A cursor naming no id of the range starts at its first.
    std::fs::write(&cursor, b"garbage").expect("write");
    let third = start("other-locks");
    assert_eq!(third.claim(key(4, 0)).expect("an id").uid(), 8100);
}

#[test]
fn accounts_come_from_the_third_field() {
    let passwd =
        "root:x:0:0:root:/root:/bin/bash\nbroken line\nsvc:x:1900000005:1900000005::/:/bin/false\n";
    assert_eq!(account_uids(passwd), BTreeSet::from([0, 1_900_000_005]));
}
