//! Tests of the registry over real redb files: what a fresh load returns, users
//! and the audit trail, read-only loads, a full disk on a tmpfs, metric pages.

use std::io::Write;
use std::process::Command;

use redb::Database;

use xp_runtime::ids::ExperimentId;
use xp_runtime::protocol::TrialState;

use super::redb_store::PIPELINES;
use super::*;

/// The experiment of the events below.
const EVENTS_OF: ExperimentId = ExperimentId { digest: 7, run: 1 };

/// An event whose reason pads it to about `bytes`, so the database must grow.
fn event(seq: u64, bytes: usize) -> Record {
    Record::Event(TrialEvent {
        reason: "x".repeat(bytes),
        ..event_of(seq, EVENTS_OF.run, 0)
    })
}

/// The numbers of the events stored, as the event feed reads them, checking
/// that `loaded` (the registry's load) numbers new events after them.
fn event_seqs(registry: &Registry, loaded: &LoadedState) -> Vec<u64> {
    let seqs: Vec<u64> = registry
        .reader()
        .events_after(EVENTS_OF, 0, usize::MAX)
        .unwrap()
        .iter()
        .map(|event| event.seq)
        .collect();
    assert_eq!(loaded.last_event_seq, seqs.last().copied().unwrap_or(0));
    seqs
}

/// A registry opened by `open`, loaded, and the numbers of its events.
fn loaded_event_seqs(mut registry: Registry) -> Vec<u64> {
    let loaded = registry.load().unwrap();
    event_seqs(&registry, &loaded)
}

/// A small tmpfs, unmounted on drop (also used by the actor's tests).
pub(crate) struct Tmpfs {
    pub(crate) path: PathBuf,
    _dir: tempfile::TempDir,
}

impl Tmpfs {
    /// Mounts one, or `None` where that is not allowed (not root).
    pub(crate) fn mount(size: &str) -> Option<Self> {
        let dir = tempfile::tempdir().expect("a temporary directory");
        let path = dir.path().join("mnt");
        std::fs::create_dir(&path).expect("a mount point");
        let mounted = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size}"), "tmpfs"])
            .arg(&path)
            .output()
            .is_ok_and(|output| output.status.success());
        mounted.then_some(Self { path, _dir: dir })
    }

    /// Fills it with a filler file until the disk is full; returns the file's path.
    pub(crate) fn fill(&self) -> PathBuf {
        let path = self.path.join("filler");
        let mut file = std::fs::File::create(&path).expect("the filler file");
        let chunk = vec![1u8; 64 << 10];
        loop {
            if let Err(error) = file.write_all(&chunk).and_then(|()| file.sync_all()) {
                assert_eq!(error.kind(), std::io::ErrorKind::StorageFull, "{error}");
                break;
            }
        }
        // Fill the last partial page too.
        while file.write_all(&[1u8]).is_ok() {}
        path
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(&self.path).status();
    }
}

/// Opens the same store again, as a restarted head would.
type Opener<'a> = &'a dyn Fn() -> Registry;

/// The stores every test below runs on: a redb file, and (in `postgres`) a
/// database of a real PostgreSQL server.
fn redb_opener(dir: &tempfile::TempDir) -> impl Fn() -> Registry + '_ {
    move || Registry::open(&dir.path().join("head.redb")).unwrap()
}

pub(super) fn committed_is_what_a_fresh_load_returns(open: Opener<'_>) {
    let mut registry = open();
    registry.load().unwrap();
    registry.commit(vec![event(1, 10), event(2, 10)]).unwrap();
    registry.commit(vec![event(3, 10)]).unwrap();
    assert_eq!(registry.committed_event_seq(), 3);
    assert_eq!(registry.committed().last_event_seq, 3);
    drop(registry);
    let again = open();
    assert_eq!(loaded_event_seqs(again), [1, 2, 3]);
}

#[test]
fn the_embedded_store_has_no_standbys_to_follow_it() {
    let dir = tempfile::tempdir().unwrap();
    let mut registry = Registry::open(&dir.path().join("head.redb")).unwrap();
    assert_eq!(registry.follow().unwrap(), None);
}

#[test]
fn an_unreadable_pipeline_record_still_holds_its_id() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("head.redb");
    {
        let database = Database::create(&path).unwrap();
        let txn = database.begin_write().unwrap();
        txn.open_table(PIPELINES)
            .unwrap()
            .insert(7, b"{not json".as_slice())
            .unwrap();
        txn.commit().unwrap();
    }
    let loaded = Registry::open(&path).unwrap().load().unwrap();
    assert!(loaded.pipelines.is_empty());
    assert_eq!(loaded.next_pipeline_id, 8);
}

pub(super) fn users_and_the_audit_trail_are_stored_and_numbered(open: Opener<'_>) {
    let user = |role| UserRecord {
        name: "ana".to_owned(),
        team: "vision".to_owned(),
        role,
        secret_hash: "00".repeat(32),
        created_at: 1,
        revoked_at: None,
    };
    let entry = |action: &str| {
        Record::Audit(AuditEntry {
            seq: 0,
            at: 2,
            who: "ana".to_owned(),
            action: action.to_owned(),
            allowed: false,
            detail: "needs role admin".to_owned(),
        })
    };
    let mut registry = open();
    registry.load().unwrap();
    registry
        .commit(vec![
            Record::User(user(xp_head_core::auth::Role::Viewer)),
            entry("one"),
        ])
        .unwrap();
    registry
        .commit(vec![
            Record::User(user(xp_head_core::auth::Role::Member)),
            entry("two"),
            entry("three"),
        ])
        .unwrap();
    drop(registry);
    let mut again = open();
    again.load().unwrap();
    assert_eq!(
        again.users().unwrap(),
        [user(xp_head_core::auth::Role::Member)]
    );
    again.commit(vec![entry("four")]).unwrap();
    let trail = again.reader().audit(3).unwrap();
    let seqs: Vec<(u64, &str)> = trail
        .iter()
        .map(|entry| (entry.seq, entry.action.as_str()))
        .collect();
    assert_eq!(seqs, [(2, "two"), (3, "three"), (4, "four")]);
}

#[test]
fn a_read_only_load_is_refused_while_open_and_reads_what_was_committed() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("head.redb");
    let mut registry = Registry::open(&path).unwrap();
    registry.load().unwrap();
    registry.commit(vec![event(1, 10), event(2, 10)]).unwrap();
    assert!(
        Registry::load_read_only(&path).is_err(),
        "a running head holds it"
    );
    drop(registry);
    assert_eq!(Registry::load_read_only(&path).unwrap().last_event_seq, 2);
    // Reading wrote nothing: the database opens for writing as before.
    assert_eq!(loaded_event_seqs(Registry::open(&path).unwrap()), [1, 2]);
}

pub(super) fn a_closed_registry_refuses_commits_and_reads_but_answers_committed(open: Opener<'_>) {
    let mut registry = open();
    registry.load().unwrap();
    registry.commit(vec![event(1, 10)]).unwrap();
    registry.close();
    assert!(!registry.is_open());
    assert!(matches!(
        registry.commit(vec![event(2, 10)]),
        Err(RegistryError::Closed)
    ));
    assert!(matches!(
        registry.metrics_of(TrialId {
            experiment: ExperimentId { digest: 7, run: 1 },
            index: 0,
        }),
        Err(RegistryError::Closed)
    ));
    // A reader of the closed embedded store reads nothing; PostgreSQL's has
    // a connection of its own and reads what was committed.
    match registry.reader().events_after(EVENTS_OF, 0, 10) {
        Err(RegistryError::Closed) => {}
        Ok(events) => assert_eq!(events.len(), 1),
        Err(other) => panic!("{other}"),
    }
    assert_eq!(registry.committed_event_seq(), 1);
    let loaded = registry.reopen().unwrap();
    assert!(registry.is_open());
    assert_eq!(event_seqs(&registry, &loaded), [1]);
    assert_eq!(
        registry
            .reader()
            .events_after(EVENTS_OF, 0, 10)
            .unwrap()
            .len(),
        1
    );
    registry.commit(vec![event(2, 10)]).unwrap();
    assert_eq!(registry.committed_event_seq(), 2);
}

#[test]
#[expect(clippy::print_stderr, reason = "say why the test is skipped")]
fn a_full_disk_closes_the_database_and_it_reopens_once_there_is_room() {
    let Some(tmpfs) = Tmpfs::mount("8m") else {
        eprintln!("skipped: cannot mount a tmpfs here (needs root)");
        return;
    };
    let mut registry = Registry::open(&tmpfs.path.join("head.redb")).unwrap();
    registry.load().unwrap();
    registry.commit(vec![event(1, 100)]).unwrap();
    let filler = tmpfs.fill();

    // Commit until the database must grow and cannot.
    let mut seq = 2;
    let failure = loop {
        match registry.commit(vec![event(seq, 16 << 10)]) {
            Ok(()) => seq += 1,
            Err(error) => break error,
        }
        assert!(seq < 10_000, "commits kept succeeding on a full disk");
    };
    assert!(failure.is_disk_full(), "{failure}");
    assert!(!registry.is_open());
    let stored: Vec<u64> = (1..seq).collect();
    assert_eq!(registry.committed_event_seq(), seq - 1);
    assert!(matches!(
        registry.commit(vec![event(seq, 10)]),
        Err(RegistryError::Closed)
    ));

    // Still full: the probe finds no room and the database stays closed.
    let refused = registry.reopen().unwrap_err();
    assert!(refused.is_disk_full(), "{refused}");
    assert!(!registry.is_open());

    // Room again: it re-opens with exactly what was committed, and takes more.
    std::fs::remove_file(filler).unwrap();
    let loaded = registry.reopen().unwrap();
    assert_eq!(event_seqs(&registry, &loaded), stored);
    registry.commit(vec![event(seq, 100)]).unwrap();
    drop(registry);
    let again = Registry::open(&tmpfs.path.join("head.redb")).unwrap();
    let mut expected = stored;
    expected.push(seq);
    assert_eq!(loaded_event_seqs(again), expected);
}

pub(super) fn metric_pages_hold_each_report_of_their_trial_once(open: Opener<'_>) {
    let mut registry = open();
    registry.load().unwrap();
    let trial = |index| TrialId {
        experiment: ExperimentId { digest: 7, run: 1 },
        index,
    };
    let metric = |index, step: u64| {
        Record::Metric(MetricRecord {
            key: xp_runtime::ids::WorkerKey {
                trial: trial(index),
                attempt: 1,
                rank: 0,
            },
            step: Some(step),
            values: [("loss".to_owned(), step as f64)].into(),
            at: step,
        })
    };
    // Trial 1's reports interleaved with trial 10's, whose id shares its prefix.
    for step in 0..250 {
        registry
            .commit(vec![metric(1, step), metric(10, step)])
            .unwrap();
    }
    let walk = |limit, max_bytes| {
        let mut steps = Vec::new();
        let mut after = None;
        loop {
            let page = registry
                .reader()
                .metrics_page(trial(1), after, limit, max_bytes)
                .unwrap();
            assert_eq!(page.total, 250);
            assert!(!page.records.is_empty() && page.records.len() <= limit);
            steps.extend(page.records.iter().map(|(_, record)| record.step.unwrap()));
            if !page.more {
                return steps;
            }
            after = page.records.last().map(|(seq, _)| *seq);
        }
    };
    let all: Vec<u64> = (0..250).collect();
    assert_eq!(walk(100, usize::MAX), all);
    assert_eq!(walk(1, usize::MAX), all);
    // A byte budget smaller than one report still moves one at a time.
    assert_eq!(walk(1000, 1), all);
    let empty = registry
        .reader()
        .metrics_page(trial(2), None, 100, usize::MAX)
        .unwrap();
    assert_eq!(
        (empty.records.len(), empty.total, empty.more),
        (0, 0, false)
    );
    let past_the_end = registry
        .reader()
        .metrics_page(trial(1), Some(u64::MAX), 100, usize::MAX)
        .unwrap();
    assert_eq!((past_the_end.records.len(), past_the_end.total), (0, 250));
}

fn a_trial(index: u32) -> TrialId {
    TrialId {
        experiment: ExperimentId { digest: 7, run: 1 },
        index,
    }
}

/// A metric report of trial `index` at `step`, whose value is the step.
fn a_metric(index: u32, step: u64) -> Record {
    Record::Metric(MetricRecord {
        key: xp_runtime::ids::WorkerKey {
            trial: a_trial(index),
            attempt: 1,
            rank: 0,
        },
        step: Some(step),
        values: [("loss".to_owned(), step as f64)].into(),
        at: step,
    })
}

pub(super) fn a_batch_keeps_the_last_record_of_a_key(open: Opener<'_>) {
    let mut registry = open();
    registry.load().unwrap();
    registry
        .commit(vec![event(1, 10), event(2, 10), event(1, 30)])
        .unwrap();
    registry.commit(vec![event(2, 40)]).unwrap();
    drop(registry);
    let reasons: Vec<(u64, usize)> = open()
        .reader()
        .events_after(EVENTS_OF, 0, usize::MAX)
        .unwrap()
        .iter()
        .map(|event| (event.seq, event.reason.len()))
        .collect();
    assert_eq!(reasons, [(1, 30), (2, 40)]);
}

pub(super) fn telemetry_windows_are_stored_replaced_and_removed(open: Opener<'_>) {
    let window = |start_ms| TelemetryWindow {
        start_ms,
        end_ms: start_ms + 1,
        samples: 1,
        cpu_cores: None,
        rss_bytes: None,
        gpu_util: None,
        gpu_mem_bytes: None,
        gpu_power_w: None,
    };
    let slot = |rank, slot, start_ms: Option<u64>| {
        Record::Telemetry(xp_head_core::TelemetryRecord {
            trial: a_trial(3),
            rank,
            slot,
            window: start_ms.map(window),
        })
    };
    let mut registry = open();
    registry.load().unwrap();
    registry
        .commit(vec![
            slot(1, 0, Some(10)),
            slot(1, 1, Some(20)),
            slot(0, 0, Some(5)),
        ])
        .unwrap();
    // Replaced, removed and stored again in one batch: the last of each slot wins.
    registry
        .commit(vec![
            slot(1, 0, Some(11)),
            slot(1, 1, None),
            slot(0, 0, None),
            slot(0, 0, Some(6)),
        ])
        .unwrap();
    drop(registry);
    let again = open();
    let starts = |windows: &[TelemetryWindow]| -> Vec<u64> {
        windows.iter().map(|window| window.start_ms).collect()
    };
    let workers = again.reader().telemetry_of(a_trial(3)).unwrap();
    let by_rank: Vec<(u32, Vec<u64>)> = workers
        .iter()
        .map(|worker| (worker.rank, starts(&worker.windows)))
        .collect();
    assert_eq!(by_rank, [(0, vec![6]), (1, vec![11])]);
    assert_eq!(
        starts(&again.telemetry_series(a_trial(3), 1).unwrap()),
        [11]
    );
    assert!(again.telemetry_series(a_trial(4), 1).unwrap().is_empty());
}

pub(super) fn metric_samples_stride_over_the_history_and_keep_the_newest(open: Opener<'_>) {
    let mut registry = open();
    registry.load().unwrap();
    registry
        .commit((0..25).map(|step| a_metric(5, step)).collect())
        .unwrap();
    let steps = |max| -> Vec<u64> {
        registry
            .reader()
            .metric_samples(a_trial(5), max)
            .unwrap()
            .iter()
            .map(|record| record.step.unwrap())
            .collect()
    };
    assert_eq!(steps(10), [0, 3, 6, 9, 12, 15, 18, 21, 24]);
    assert_eq!(steps(4), [0, 7, 14, 21, 24]);
    assert_eq!(steps(100), (0..25).collect::<Vec<_>>());
    assert!(
        registry
            .reader()
            .metric_samples(a_trial(6), 10)
            .unwrap()
            .is_empty()
    );
    assert_eq!(registry.metrics_of(a_trial(5)).unwrap().len(), 25);
}

/// Event `seq` of trial `index` of experiment `run` (of the digest of
/// [`EVENTS_OF`]).
fn event_of(seq: u64, run: u32, index: u32) -> TrialEvent {
    TrialEvent {
        seq,
        at: seq,
        trial: TrialId {
            experiment: ExperimentId {
                digest: EVENTS_OF.digest,
                run,
            },
            index,
        },
        state: TrialState::Running,
        attempt: 1,
        reason: format!("event {seq}"),
    }
}

pub(super) fn events_are_read_by_experiment_and_by_trial(open: Opener<'_>) {
    let mut registry = open();
    registry.load().unwrap();
    // Two experiments of one digest (runs 1 and 2), two trials each, interleaved.
    let events: Vec<TrialEvent> = (1..=40)
        .map(|seq| event_of(seq, 1 + (seq % 2) as u32, (seq % 4 / 2) as u32))
        .collect();
    for batch in events.chunks(7) {
        registry
            .commit(batch.iter().cloned().map(Record::Event).collect())
            .unwrap();
    }
    let reader = registry.reader();
    let run = |run| ExperimentId { digest: 7, run };
    let seqs = |events: Vec<TrialEvent>| events.iter().map(|event| event.seq).collect::<Vec<_>>();
    let odd: Vec<u64> = (1..=40).filter(|seq| seq % 2 == 1).collect();
    assert_eq!(seqs(reader.events_after(run(2), 0, 100).unwrap()), odd);
    // A page after `after`, at most `limit`.
    assert_eq!(seqs(reader.events_after(run(2), 5, 3).unwrap()), [7, 9, 11]);
    assert!(reader.events_after(run(2), 40, 10).unwrap().is_empty());
    assert!(
        reader
            .events_after(run(2), u64::MAX, 10)
            .unwrap()
            .is_empty()
    );
    assert!(reader.events_after(run(3), 0, 10).unwrap().is_empty());
    // A trial's newest first: trial 1 of run 1 has the seqs 2, 6, 10, ... (seq % 4 == 2).
    let trial = TrialId {
        experiment: run(1),
        index: 1,
    };
    assert_eq!(
        seqs(reader.newest_events_of_trial(trial, 3).unwrap()),
        [38, 34, 30]
    );
    let all = reader.newest_events_of_trial(trial, 100).unwrap();
    assert_eq!(all.len(), 10);
    assert_eq!(all[0], events[37], "read back as written");
}

#[test]
fn events_stored_before_their_index_are_indexed_when_the_store_opens() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("head.redb");
    {
        // A store as an earlier version left it: events by number only.
        let database = Database::create(&path).unwrap();
        let txn = database.begin_write().unwrap();
        {
            let mut events = txn.open_table(redb_store::EVENTS).unwrap();
            for seq in 1..=5 {
                let bytes = serde_json::to_vec(&event_of(seq, 1, 0)).unwrap();
                events.insert(seq, bytes.as_slice()).unwrap();
            }
            events.insert(6, b"not json".as_slice()).unwrap();
        }
        txn.commit().unwrap();
    }
    let mut registry = Registry::open(&path).unwrap();
    let trial = event_of(1, 1, 0).trial;
    assert_eq!(
        registry
            .reader()
            .newest_events_of_trial(trial, 2)
            .unwrap()
            .len(),
        2
    );
    let stored: Vec<u64> = registry
        .reader()
        .events_after(trial.experiment, 0, 100)
        .unwrap()
        .iter()
        .map(|event| event.seq)
        .collect();
    assert_eq!(stored, [1, 2, 3, 4, 5], "the unreadable one left out");
    // Numbering goes on after the unreadable one too.
    assert_eq!(registry.load().unwrap().last_event_seq, 6);
}

/// Every test above on a redb file.
mod on_redb {
    use super::*;

    macro_rules! on_redb {
        ($($name:ident),* $(,)?) => {$(
            #[test]
            fn $name() {
                let dir = tempfile::tempdir().unwrap();
                super::$name(&redb_opener(&dir));
            }
        )*};
    }

    on_redb!(
        committed_is_what_a_fresh_load_returns,
        users_and_the_audit_trail_are_stored_and_numbered,
        a_closed_registry_refuses_commits_and_reads_but_answers_committed,
        metric_pages_hold_each_report_of_their_trial_once,
        a_batch_keeps_the_last_record_of_a_key,
        telemetry_windows_are_stored_replaced_and_removed,
        metric_samples_stride_over_the_history_and_keep_the_newest,
        events_are_read_by_experiment_and_by_trial,
    );
}

mod postgres;
