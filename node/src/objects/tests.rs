//! Tests of the object store on small objects in temporary directories.

use std::collections::{BTreeMap, BTreeSet};
use std::io::{Read, Write};
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::sync::Arc;

use proptest::prelude::*;
use xp_runtime::ids::{ExperimentId, TrialId};

use super::*;

const KIB: u64 = 1024;

fn trial(index: u32) -> Owner {
    Owner::Trial(TrialId {
        experiment: ExperimentId { digest: 7, run: 1 },
        index,
    })
}

fn limits(memory_bytes: u64, disk_bytes: u64) -> StoreLimits {
    StoreLimits {
        memory_bytes,
        disk_bytes,
        ..StoreLimits::default()
    }
}

/// Opens (or reopens) a store. A reopen right after a drop may find the lock
/// still held for a moment: a process that another test of this binary forks
/// holds a copy of every descriptor (the lock's too) until it execs.
#[expect(
    clippy::disallowed_methods,
    reason = "a synchronous test waiting out another process's brief hold"
)]
fn must_open(dir: &Path, limits: StoreLimits) -> ObjectStore {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    loop {
        match ObjectStore::open(dir, limits) {
            Err(StoreError::Locked { .. }) if std::time::Instant::now() < deadline => {
                std::thread::sleep(std::time::Duration::from_millis(20));
            }
            result => return result.unwrap(),
        }
    }
}

/// Bytes that differ for every `seed`, so that different seeds never dedup.
fn content(seed: u8, len: usize) -> Vec<u8> {
    (0..len)
        .map(|position| seed.wrapping_mul(31).wrapping_add(position as u8) ^ (position >> 8) as u8)
        .collect()
}

/// Names in the store's directory, without the lock file.
fn files_in(dir: &Path) -> BTreeSet<String> {
    std::fs::read_dir(dir)
        .unwrap()
        .map(|dir_entry| dir_entry.unwrap().file_name().into_string().unwrap())
        .filter(|name| name != ".lock")
        .collect()
}

fn check_get(store: &ObjectStore, id: ObjectId, expected: &[u8], expected_mapped: bool) {
    let object_bytes = store.get(id).unwrap();
    assert_eq!(&*object_bytes, expected, "bytes of {id}");
    assert_eq!(object_bytes.is_mapped(), expected_mapped, "tier of {id}");
}

/// Stats agree with a recount, tiers are within limits, and the directory holds
/// exactly the disk objects' files.
fn check_consistent(store: &ObjectStore) {
    let (recount, on_disk) = store.lock().recount();
    let stats = store.stat();
    assert_eq!(stats, recount);
    assert!(
        stats.memory_bytes <= store.limits().memory_bytes,
        "{stats:?}"
    );
    assert!(stats.disk_bytes <= store.limits().disk_bytes, "{stats:?}");
    let expected_files: BTreeSet<String> = on_disk.iter().map(ToString::to_string).collect();
    assert_eq!(files_in(store.dir()), expected_files);
}

fn check_tier(store: &ObjectStore, id: ObjectId, expected: Option<Tier>) {
    assert_eq!(
        store.info(id).map(|info| info.tier),
        expected,
        "tier of {id}"
    );
}

#[test]
fn object_ids_print_and_parse_as_64_lowercase_hex_digits() {
    let id = ObjectId::of(b"weights");
    assert_eq!(id.to_string().len(), 64);
    assert_eq!(id.to_string().parse::<ObjectId>().unwrap(), id);
    for bad in [
        "",
        "00",
        &"A".repeat(64),
        &"g".repeat(64),
        &"0".repeat(65),
        "é".repeat(32).as_str(),
    ] {
        let error = bad.parse::<ObjectId>().unwrap_err();
        assert!(
            error.to_string().contains("64 lowercase hex digits"),
            "{error}"
        );
    }
    let error = "x".repeat(10_000).parse::<ObjectId>().unwrap_err();
    assert!(
        error.to_string().len() < 200,
        "a long id is not quoted whole"
    );
}

#[test]
fn put_and_get_round_trip_in_both_tiers() {
    let dir = tempfile::tempdir().unwrap();
    let store = must_open(dir.path(), limits(KIB, 64 * KIB));
    let small = content(1, 100);
    let large = content(2, 3000);
    let small_id = store.put(small.clone(), trial(0)).unwrap();
    let large_id = store.put(large.as_slice(), trial(0)).unwrap();
    assert_eq!(small_id, ObjectId::of(&small));
    assert_eq!(large_id, ObjectId::of(&large));
    check_tier(&store, small_id, Some(Tier::Memory));
    check_tier(&store, large_id, Some(Tier::Disk));
    check_get(&store, small_id, &small, false);
    check_get(&store, large_id, &large, true);
    let empty_id = store.put(Vec::new(), trial(0)).unwrap();
    check_get(&store, empty_id, &[], false);
    assert!(store.contains(small_id));
    assert!(matches!(
        store.get(ObjectId::of(b"absent")),
        Err(StoreError::NotFound { .. })
    ));
    check_consistent(&store);
}

#[test]
fn streamed_and_file_puts_hash_while_writing_to_disk() {
    let dir = tempfile::tempdir().unwrap();
    let store = must_open(&dir.path().join("objects"), StoreLimits::default());
    // Over one stream chunk, so hashing spans several reads.
    let large = content(3, 3 << 20);
    let id = store.put_reader(large.as_slice(), trial(0)).unwrap();
    assert_eq!(id, ObjectId::of(&large));
    check_get(&store, id, &large, true);

    let source_path = dir.path().join("source");
    File::create(&source_path)
        .unwrap()
        .write_all(b"from a file")
        .unwrap();
    let file_id = store.put_file(&source_path, trial(1)).unwrap();
    check_get(&store, file_id, b"from a file", true);
    // The same content streamed again only adds the owner.
    assert_eq!(
        store.put_reader(&b"from a file"[..], trial(2)).unwrap(),
        file_id
    );
    assert_eq!(
        store.info(file_id).unwrap().owners,
        vec![trial(1), trial(2)]
    );
    check_consistent(&store);
}

#[test]
fn a_verified_map_is_reused_while_held() {
    let dir = tempfile::tempdir().unwrap();
    let store = must_open(dir.path(), limits(0, 64 * KIB));
    let id = store.put(content(4, 500), trial(0)).unwrap();
    let first = store.get(id).unwrap();
    let second = store.get(id).unwrap();
    assert_eq!(
        first.as_ptr(),
        second.as_ptr(),
        "the second get reuses the verified map"
    );
}

#[test]
fn identical_content_is_stored_once_with_all_its_owners() {
    let dir = tempfile::tempdir().unwrap();
    let store = must_open(dir.path(), limits(KIB, 64 * KIB));
    let small = content(5, 10);
    let large = content(6, 2000);
    for owner in [
        trial(1),
        trial(0),
        Owner::Driver("notebook".to_owned()),
        trial(1),
    ] {
        assert_eq!(
            store.put(small.clone(), owner.clone()).unwrap(),
            ObjectId::of(&small)
        );
        assert_eq!(
            store.put(large.clone(), owner).unwrap(),
            ObjectId::of(&large)
        );
    }
    let expected_owners = vec![trial(0), trial(1), Owner::Driver("notebook".to_owned())];
    assert_eq!(
        store.info(ObjectId::of(&small)).unwrap().owners,
        expected_owners
    );
    assert_eq!(
        store.info(ObjectId::of(&large)).unwrap().owners,
        expected_owners
    );
    let stats = store.stat();
    assert_eq!((stats.memory_objects, stats.memory_bytes), (1, 10));
    assert_eq!((stats.disk_objects, stats.disk_bytes), (1, 2000));
    check_consistent(&store);
}

#[test]
fn least_recently_used_objects_spill_to_disk() {
    let dir = tempfile::tempdir().unwrap();
    let store = must_open(dir.path(), limits(100, 64 * KIB));
    let first = content(7, 40);
    let second = content(8, 40);
    let third = content(9, 40);
    let first_id = store.put(first.clone(), trial(0)).unwrap();
    let second_id = store.put(second.clone(), trial(0)).unwrap();
    // Using the first makes the second the least recently used.
    check_get(&store, first_id, &first, false);
    let third_id = store.put(third.clone(), trial(0)).unwrap();
    check_tier(&store, first_id, Some(Tier::Memory));
    check_tier(&store, second_id, Some(Tier::Disk));
    check_tier(&store, third_id, Some(Tier::Memory));
    check_get(&store, second_id, &second, true);
    check_get(&store, third_id, &third, false);
    check_consistent(&store);
}

#[test]
fn an_object_that_cannot_fit_is_refused_and_changes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let store = must_open(dir.path(), limits(100, 300));
    let kept_id = store.put(content(10, 80), trial(0)).unwrap();
    let on_disk_id = store.put(content(11, 250), trial(0)).unwrap();
    let before = store.stat();
    for too_big in [content(12, 150), content(13, 90)] {
        // 150 bytes fit neither tier; 90 would fit memory only by spilling 80
        // bytes to a disk with 50 free, which cannot take the 90 bytes either.
        let error = store.put(too_big.clone(), trial(1)).unwrap_err();
        assert!(
            matches!(
                error,
                StoreError::Full {
                    available: 50,
                    limit: 300,
                    ..
                }
            ),
            "{error}"
        );
        assert!(!store.contains(ObjectId::of(&too_big)));
    }
    let error = store
        .put_reader(&content(14, 150)[..], trial(1))
        .unwrap_err();
    assert!(matches!(error, StoreError::Full { .. }), "{error}");
    assert_eq!(store.stat(), before);
    check_tier(&store, kept_id, Some(Tier::Memory));
    check_tier(&store, on_disk_id, Some(Tier::Disk));
    check_consistent(&store);
    assert!(error.to_string().starts_with("store full"), "{error}");
}

#[test]
fn objects_over_the_size_limit_are_refused_before_writing() {
    let dir = tempfile::tempdir().unwrap();
    let store = must_open(
        dir.path(),
        StoreLimits {
            max_object_bytes: 10,
            ..StoreLimits::default()
        },
    );
    let error = store.put(content(15, 11), trial(0)).unwrap_err();
    assert!(
        matches!(
            error,
            StoreError::TooLarge {
                size: 11,
                limit: 10
            }
        ),
        "{error}"
    );
    let error = store
        .put_reader(&content(15, 11)[..], trial(0))
        .unwrap_err();
    assert!(
        matches!(error, StoreError::TooLarge { limit: 10, .. }),
        "{error}"
    );
    assert_eq!(store.stat(), StoreStats::default());
    check_consistent(&store);
}

#[test]
fn a_corrupted_file_is_reported_deleted_and_repaired_by_a_put() {
    let dir = tempfile::tempdir().unwrap();
    let store = must_open(dir.path(), limits(0, 64 * KIB));
    let original = content(16, 1000);
    let id = store.put(original.clone(), trial(0)).unwrap();
    let path = dir.path().join(id.to_string());
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
    let mut damaged = std::fs::read(&path).unwrap();
    damaged[500] ^= 0x01;
    std::fs::write(&path, &damaged).unwrap();

    let error = store.get(id).unwrap_err();
    assert!(
        matches!(error, StoreError::Corrupt { id: corrupt_id } if corrupt_id == id),
        "{error}"
    );
    assert!(!path.exists());
    assert!(!store.contains(id));
    check_consistent(&store);

    assert_eq!(store.put(original.clone(), trial(0)).unwrap(), id);
    check_get(&store, id, &original, true);
    check_consistent(&store);
}

#[test]
fn a_file_removed_behind_the_stores_back_is_reported_missing() {
    let dir = tempfile::tempdir().unwrap();
    let store = must_open(dir.path(), limits(0, 64 * KIB));
    let id = store.put(content(17, 100), trial(0)).unwrap();
    std::fs::remove_file(dir.path().join(id.to_string())).unwrap();
    assert!(matches!(store.get(id), Err(StoreError::Missing { .. })));
    assert!(!store.contains(id));
    check_consistent(&store);
}

#[test]
fn reopening_finds_disk_objects_and_removes_temporary_files() {
    let dir = tempfile::tempdir().unwrap();
    let large = content(18, 2000);
    let (large_id, small_id) = {
        let store = must_open(dir.path(), limits(KIB, 64 * KIB));
        let large_id = store.put(large.clone(), trial(0)).unwrap();
        let small_id = store.put(content(19, 10), trial(0)).unwrap();
        let error = ObjectStore::open(dir.path(), limits(KIB, 64 * KIB)).unwrap_err();
        assert!(matches!(error, StoreError::Locked { .. }), "{error}");
        (large_id, small_id)
    };
    std::fs::write(dir.path().join(".tmp-3"), b"half an object").unwrap();
    std::fs::write(dir.path().join("notes.txt"), b"not an object").unwrap();

    let store = must_open(dir.path(), limits(KIB, 64 * KIB));
    check_get(&store, large_id, &large, true);
    assert!(
        !store.contains(small_id),
        "the memory tier does not survive"
    );
    let info = store.info(large_id).unwrap();
    assert!(info.owners.is_empty() && !info.pinned);
    assert_eq!(
        files_in(dir.path()),
        BTreeSet::from([large_id.to_string(), "notes.txt".to_owned()])
    );
    assert_eq!(store.stat().disk_bytes, 2000);

    // A recovered object gets owners again and is collected like any other.
    store.add_owner(large_id, trial(3)).unwrap();
    assert_eq!(store.release_owner(&trial(3)).unwrap(), vec![large_id]);
    assert!(!dir.path().join(large_id.to_string()).exists());
}

#[test]
fn releasing_the_last_owner_deletes_unless_pinned() {
    let dir = tempfile::tempdir().unwrap();
    let store = must_open(dir.path(), limits(KIB, 64 * KIB));
    let shared_id = store.put(content(20, 10), trial(0)).unwrap();
    store.put(content(20, 10), trial(1)).unwrap();
    let disk_id = store.put(content(21, 2000), trial(0)).unwrap();
    let pinned_id = store.put(content(22, 10), trial(0)).unwrap();
    store.pin(pinned_id).unwrap();

    let mut collected = store.release_owner(&trial(0)).unwrap();
    collected.sort();
    assert_eq!(collected, vec![disk_id]);
    assert!(store.contains(shared_id) && store.contains(pinned_id));
    assert!(!dir.path().join(disk_id.to_string()).exists());
    assert_eq!(store.release_owner(&trial(1)).unwrap(), vec![shared_id]);
    assert!(store.release_owner(&trial(1)).unwrap().is_empty());

    assert!(
        store.unpin(pinned_id).unwrap(),
        "unpinning an ownerless object deletes it"
    );
    assert!(!store.contains(pinned_id));
    assert!(matches!(
        store.pin(pinned_id),
        Err(StoreError::NotFound { .. })
    ));
    assert_eq!(store.stat(), StoreStats::default());
    check_consistent(&store);
}

#[test]
fn delete_removes_any_object_and_readers_keep_their_bytes() {
    let dir = tempfile::tempdir().unwrap();
    let store = must_open(dir.path(), limits(KIB, 64 * KIB));
    let large = content(23, 2000);
    let id = store.put(large.clone(), trial(0)).unwrap();
    store.pin(id).unwrap();
    let held = store.get(id).unwrap();
    assert!(store.delete(id).unwrap());
    assert!(!store.delete(id).unwrap());
    assert_eq!(&*held, large.as_slice());
    check_consistent(&store);
}

#[test]
fn a_failing_directory_gives_the_os_cause_and_leaves_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let objects_dir = dir.path().join("objects");
    let store = must_open(&objects_dir, limits(KIB, 64 * KIB));
    let kept_id = store.put(content(24, 2000), trial(0)).unwrap();
    std::fs::remove_dir_all(&objects_dir).unwrap();
    let large = content(25, 2000);
    let error = store.put(large.clone(), trial(0)).unwrap_err();
    let StoreError::Io {
        operation,
        path,
        source,
    } = &error
    else {
        panic!("expected an I/O error, got {error}");
    };
    assert_eq!(*operation, IoOperation::CreateFile);
    assert!(path.starts_with(&objects_dir));
    assert_eq!(source.kind(), std::io::ErrorKind::NotFound);
    assert!(!store.contains(ObjectId::of(&large)));
    assert_eq!(store.stat().disk_objects, 1, "only the object put before");
    assert!(store.contains(kept_id));
}

#[test]
fn a_read_only_directory_gives_a_clear_error() {
    let dir = tempfile::tempdir().unwrap();
    let store = must_open(dir.path(), limits(KIB, 64 * KIB));
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o555)).unwrap();
    // Root ignores directory permissions; the removed-directory test covers the
    // same path there.
    let probe = dir.path().join("probe");
    if std::fs::write(&probe, b"").is_ok() {
        std::fs::remove_file(&probe).unwrap();
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
        return;
    }
    let error = store.put(content(26, 2000), trial(0)).unwrap_err();
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let StoreError::Io { source, .. } = &error else {
        panic!("expected an I/O error, got {error}");
    };
    assert_eq!(source.kind(), std::io::ErrorKind::PermissionDenied);
    assert!(error.to_string().starts_with("cannot create "), "{error}");
    check_consistent(&store);
}

#[test]
fn a_small_disk_limit_refuses_without_partial_files() {
    let dir = tempfile::tempdir().unwrap();
    let store = must_open(dir.path(), limits(0, 4 * KIB));
    store.put(content(27, 3000), trial(0)).unwrap();
    let error = store.put(content(28, 3000), trial(0)).unwrap_err();
    assert!(
        matches!(error, StoreError::Full { needed: 3000, .. }),
        "{error}"
    );
    // A stream past the free space is hashed to its end but not written.
    let error = store
        .put_reader(std::io::repeat(7).take(10 * KIB), trial(0))
        .unwrap_err();
    assert!(
        matches!(error, StoreError::Full { needed, .. } if needed == 10 * KIB),
        "{error}"
    );
    // Unless it is content already stored.
    let stored = content(27, 3000);
    assert_eq!(
        store.put_reader(stored.as_slice(), trial(1)).unwrap(),
        ObjectId::of(&stored)
    );
    check_consistent(&store);
}

#[test]
fn a_failing_reader_leaves_nothing() {
    struct Failing(usize);
    impl Read for Failing {
        fn read(&mut self, buffer: &mut [u8]) -> std::io::Result<usize> {
            if self.0 == 0 {
                return Err(std::io::Error::other("connection reset"));
            }
            self.0 -= 1;
            buffer[0] = 1;
            Ok(1)
        }
    }
    let dir = tempfile::tempdir().unwrap();
    let store = must_open(dir.path(), StoreLimits::default());
    let error = store.put_reader(Failing(3), trial(0)).unwrap_err();
    assert!(matches!(error, StoreError::Read { .. }), "{error}");
    check_consistent(&store);
}

#[test]
fn concurrent_puts_and_gets_stay_consistent() {
    let dir = tempfile::tempdir().unwrap();
    let store = Arc::new(must_open(dir.path(), limits(2 * KIB, 256 * KIB)));
    let threads: Vec<_> = (0..4u8)
        .map(|thread_idx| {
            let store = Arc::clone(&store);
            std::thread::spawn(move || {
                for round in 0..30u8 {
                    let bytes = content(round % 10, 100 + usize::from(round % 10) * 150);
                    let id = store
                        .put(bytes.clone(), trial(u32::from(thread_idx)))
                        .unwrap();
                    // Another thread may have deleted the same content meanwhile.
                    match store.get(id) {
                        Ok(object_bytes) => assert_eq!(&*object_bytes, bytes.as_slice()),
                        Err(StoreError::NotFound { .. }) => {}
                        Err(error) => panic!("{error}"),
                    }
                    if round % 7 == thread_idx {
                        store.delete(id).unwrap();
                    }
                }
            })
        })
        .collect();
    for thread in threads {
        thread.join().unwrap();
    }
    check_consistent(&store);
}

/// One step of the property test; indexes pick from small pools.
#[derive(Debug, Clone)]
enum Op {
    Put { content_idx: usize, owner_idx: u32 },
    PutReader { content_idx: usize, owner_idx: u32 },
    Get { content_idx: usize },
    Delete { content_idx: usize },
    Release { owner_idx: u32 },
    Pin { content_idx: usize },
    Unpin { content_idx: usize },
    Reopen,
}

/// Sizes chosen around the limits below: some fit memory, some only disk, one neither.
const POOL_SIZES: [usize; 8] = [0, 10, 50, 120, 200, 300, 600, 1100];
const PROP_MEMORY_BYTES: u64 = 256;
const PROP_DISK_BYTES: u64 = 1024;
const N_OWNERS: u32 = 3;

fn op_strategy() -> impl Strategy<Value = Op> {
    let content_idx = 0..POOL_SIZES.len();
    let owner_idx = 0..N_OWNERS;
    prop_oneof![
        4 => (content_idx.clone(), owner_idx.clone())
            .prop_map(|(content_idx, owner_idx)| Op::Put { content_idx, owner_idx }),
        1 => (content_idx.clone(), owner_idx.clone())
            .prop_map(|(content_idx, owner_idx)| Op::PutReader { content_idx, owner_idx }),
        3 => content_idx.clone().prop_map(|content_idx| Op::Get { content_idx }),
        1 => content_idx.clone().prop_map(|content_idx| Op::Delete { content_idx }),
        1 => owner_idx.prop_map(|owner_idx| Op::Release { owner_idx }),
        1 => content_idx.clone().prop_map(|content_idx| Op::Pin { content_idx }),
        1 => content_idx.prop_map(|content_idx| Op::Unpin { content_idx }),
        1 => Just(Op::Reopen),
    ]
}

/// What the model expects of one object.
#[derive(Debug, Default)]
struct ModelObject {
    owners: BTreeSet<u32>,
    pinned: bool,
}

/// A store under random operations, beside the model of what it must hold.
struct ModelRun {
    dir: tempfile::TempDir,
    store_limits: StoreLimits,
    /// The contents operations pick from, and their ids.
    pool: Vec<Vec<u8>>,
    ids: Vec<ObjectId>,
    /// The store; empty only while it is reopened.
    store: Option<ObjectStore>,
    model: BTreeMap<usize, ModelObject>,
}

impl ModelRun {
    fn new() -> Self {
        let dir = tempfile::tempdir().unwrap();
        let store_limits = limits(PROP_MEMORY_BYTES, PROP_DISK_BYTES);
        let pool: Vec<Vec<u8>> = POOL_SIZES
            .iter()
            .enumerate()
            .map(|(content_idx, size)| content(content_idx as u8, *size))
            .collect();
        let ids = pool.iter().map(|bytes| ObjectId::of(bytes)).collect();
        let store = Some(must_open(dir.path(), store_limits));
        Self {
            dir,
            store_limits,
            pool,
            ids,
            store,
            model: BTreeMap::new(),
        }
    }

    fn store(&self) -> &ObjectStore {
        self.store
            .as_ref()
            .expect("the store is open between operations")
    }

    /// Applies `op` to the store and the model, and checks they agree.
    fn apply(&mut self, op: Op) {
        match op {
            Op::Put {
                content_idx,
                owner_idx,
            } => self.put(content_idx, owner_idx, false),
            Op::PutReader {
                content_idx,
                owner_idx,
            } => self.put(content_idx, owner_idx, true),
            Op::Get { content_idx } => self.get(content_idx),
            Op::Delete { content_idx } => self.delete(content_idx),
            Op::Release { owner_idx } => self.release(owner_idx),
            Op::Pin { content_idx } => self.pin(content_idx),
            Op::Unpin { content_idx } => self.unpin(content_idx),
            Op::Reopen => self.reopen(),
        }
        check_consistent(self.store());
        for (content_idx, id) in self.ids.iter().enumerate() {
            assert_eq!(
                self.store().contains(*id),
                self.model.contains_key(&content_idx),
                "{id}"
            );
        }
    }

    fn put(&mut self, content_idx: usize, owner_idx: u32, from_reader: bool) {
        let before = self.store().stat();
        let result = if from_reader {
            self.store()
                .put_reader(self.pool[content_idx].as_slice(), trial(owner_idx))
        } else {
            self.store()
                .put(self.pool[content_idx].clone(), trial(owner_idx))
        };
        match result {
            Ok(id) => {
                assert_eq!(id, self.ids[content_idx]);
                self.model
                    .entry(content_idx)
                    .or_default()
                    .owners
                    .insert(owner_idx);
            }
            Err(StoreError::Full { .. }) => {
                assert!(
                    !self.model.contains_key(&content_idx),
                    "existing content is never refused"
                );
                assert_eq!(self.store().stat(), before, "a refused put changes nothing");
            }
            Err(error) => panic!("put of {content_idx}: {error}"),
        }
    }

    fn get(&mut self, content_idx: usize) {
        match self.store().get(self.ids[content_idx]) {
            Ok(object_bytes) => {
                assert!(self.model.contains_key(&content_idx));
                assert_eq!(&*object_bytes, self.pool[content_idx].as_slice());
            }
            Err(StoreError::NotFound { .. }) => assert!(!self.model.contains_key(&content_idx)),
            Err(error) => panic!("get of {content_idx}: {error}"),
        }
    }

    fn delete(&mut self, content_idx: usize) {
        let existed = self.store().delete(self.ids[content_idx]).unwrap();
        assert_eq!(existed, self.model.remove(&content_idx).is_some());
    }

    fn release(&mut self, owner_idx: u32) {
        let mut expected = Vec::new();
        for (content_idx, object) in &mut self.model {
            if object.owners.remove(&owner_idx) && object.owners.is_empty() && !object.pinned {
                expected.push(self.ids[*content_idx]);
            }
        }
        for id in &expected {
            let content_idx = self.ids.iter().position(|pool_id| pool_id == id).unwrap();
            self.model.remove(&content_idx);
        }
        let mut collected = self.store().release_owner(&trial(owner_idx)).unwrap();
        collected.sort();
        expected.sort();
        assert_eq!(collected, expected);
    }

    fn pin(&mut self, content_idx: usize) {
        let result = self.store().pin(self.ids[content_idx]);
        match self.model.get_mut(&content_idx) {
            Some(object) => {
                result.unwrap();
                object.pinned = true;
            }
            None => assert!(matches!(result, Err(StoreError::NotFound { .. }))),
        }
    }

    fn unpin(&mut self, content_idx: usize) {
        let result = self.store().unpin(self.ids[content_idx]);
        match self.model.get_mut(&content_idx) {
            Some(object) => {
                object.pinned = false;
                let expect_collected = object.owners.is_empty();
                assert_eq!(result.unwrap(), expect_collected);
                if expect_collected {
                    self.model.remove(&content_idx);
                }
            }
            None => assert!(matches!(result, Err(StoreError::NotFound { .. }))),
        }
    }

    fn reopen(&mut self) {
        let disk_ids: BTreeSet<ObjectId> = self
            .ids
            .iter()
            .copied()
            .filter(|id| {
                self.store()
                    .info(*id)
                    .is_some_and(|info| info.tier == Tier::Disk)
            })
            .collect();
        // The old store closes before the new one opens the directory.
        drop(self.store.take());
        self.store = Some(must_open(self.dir.path(), self.store_limits));
        // Only disk objects survive, without owners or pins.
        let ids = &self.ids;
        self.model
            .retain(|content_idx, _| disk_ids.contains(&ids[*content_idx]));
        for object in self.model.values_mut() {
            *object = ModelObject::default();
        }
    }
}

fn run_ops(ops: Vec<Op>) {
    let mut run = ModelRun::new();
    for op in ops {
        run.apply(op);
    }
}

proptest! {
    // Failures print the minimal case; no regression file is written outside this module.
    #![proptest_config(ProptestConfig {
        failure_persistence: None,
        ..ProptestConfig::default()
    })]

    #[test]
    fn random_operations_keep_the_store_consistent(ops in proptest::collection::vec(op_strategy(), 1..40)) {
        run_ops(ops);
    }
}

#[test]
fn verify_reads_the_file_again_even_while_a_verified_map_is_held() {
    let dir = tempfile::tempdir().unwrap();
    let store = must_open(dir.path(), limits(0, 64 * KIB));
    let original = content(16, 1000);
    let id = store.put(original.clone(), trial(0)).unwrap();
    let held = store.get(id).unwrap();
    let path = dir.path().join(id.to_string());
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
    let mut damaged = std::fs::read(&path).unwrap();
    damaged[10] ^= 0x01;
    // Written in place: the held map shows the damage too, but get trusts it.
    std::fs::write(&path, &damaged).unwrap();
    assert_eq!(held[10], damaged[10]);
    assert!(matches!(store.verify(id), Err(StoreError::Corrupt { .. })));
    assert!(!store.contains(id));
    assert!(matches!(store.verify(id), Err(StoreError::NotFound { .. })));
    check_consistent(&store);
}

#[test]
fn retire_unpins_and_withdraws_one_claim_but_keeps_other_owners_objects() {
    let dir = tempfile::tempdir().unwrap();
    let store = must_open(dir.path(), limits(64 * KIB, 64 * KIB));
    let shared = store.put(content(1, 100), trial(0)).unwrap();
    store.add_owner(shared, trial(1)).unwrap();
    store.pin(shared).unwrap();
    assert!(
        !store.retire(shared, Some(&trial(0))).unwrap(),
        "trial 1 still claims it"
    );
    assert!(store.contains(shared));
    assert!(!store.info(shared).unwrap().pinned);
    assert!(store.retire(shared, Some(&trial(1))).unwrap());
    assert!(!store.contains(shared));
    check_consistent(&store);
}
