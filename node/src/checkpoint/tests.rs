//! Tests of taking and restoring checkpoints through a real store in temporary
//! directories.

use xp_runtime::ids::TrialId;

use super::backup::{back_up, restore_from_backup};
use super::{CheckpointError, remove_from_backup, restore, take};
use crate::objects::{ObjectStore, StoreLimits};

fn trial() -> TrialId {
    "3f2a9c0d11b2e4f7-t3".parse().expect("trial id")
}

#[test]
fn take_then_restore_round_trips_and_empties_the_directory() {
    let temp = tempfile::tempdir().expect("tempdir");
    let store =
        ObjectStore::open(temp.path().join("objects"), StoreLimits::default()).expect("store");
    let dir = temp.path().join("work").join("checkpoint");
    std::fs::create_dir_all(dir.join("sub")).expect("mkdir");
    std::fs::write(dir.join("state"), b"weights").expect("write");
    std::fs::write(dir.join("sub").join("opt"), b"moments").expect("write");
    let files = take(&store, &dir, None, trial(), 7).expect("take");
    assert_eq!(
        files
            .iter()
            .map(|file| file.name.as_str())
            .collect::<Vec<_>>(),
        ["state", "sub/opt"]
    );
    assert!(std::fs::read_dir(&dir).expect("dir").next().is_none());
    assert!(
        files
            .iter()
            .all(|file| store.info(file.object).expect("stored").pinned)
    );
    let again = temp.path().join("restored");
    restore(&store, &again, &files).expect("restore");
    assert_eq!(
        std::fs::read(again.join("sub").join("opt")).expect("read"),
        b"moments"
    );
    assert_eq!(
        std::fs::read(again.join("state")).expect("read"),
        b"weights"
    );
}

#[test]
fn a_full_store_refuses_the_checkpoint_and_keeps_nothing_of_it() {
    let temp = tempfile::tempdir().expect("tempdir");
    let limits = StoreLimits {
        memory_bytes: 0,
        disk_bytes: 1000,
        max_object_bytes: 1 << 20,
    };
    let store = ObjectStore::open(temp.path().join("objects"), limits).expect("store");
    let dir = temp.path().join("checkpoint");
    std::fs::create_dir_all(&dir).expect("mkdir");
    std::fs::write(dir.join("a"), vec![1u8; 600]).expect("write");
    std::fs::write(dir.join("b"), vec![2u8; 600]).expect("write");
    let error = take(&store, &dir, None, trial(), 1).expect_err("over the limit");
    assert!(error.to_string().contains("store full"), "{error}");
    assert_eq!(store.stat().disk_objects, 0);
}

#[test]
fn an_empty_directory_or_an_unsafe_name_is_refused() {
    let temp = tempfile::tempdir().expect("tempdir");
    let store =
        ObjectStore::open(temp.path().join("objects"), StoreLimits::default()).expect("store");
    let dir = temp.path().join("checkpoint");
    std::fs::create_dir_all(&dir).expect("mkdir");
    assert!(matches!(
        take(&store, &dir, None, trial(), 1),
        Err(CheckpointError::Invalid(_))
    ));
    for name in ["../x", "/etc/passwd", "", "a/../../b"] {
        assert!(
            !xp_runtime::protocol::is_safe_checkpoint_name(name),
            "{name}"
        );
    }
    assert!(xp_runtime::protocol::is_safe_checkpoint_name(
        "model/weights.pt"
    ));
}

#[test]
fn a_backup_comes_back_verified_and_is_removed_on_request() {
    let temp = tempfile::tempdir().expect("tempdir");
    let store =
        ObjectStore::open(temp.path().join("objects"), StoreLimits::default()).expect("store");
    let dir = temp.path().join("checkpoint");
    std::fs::create_dir_all(&dir).expect("mkdir");
    std::fs::write(dir.join("state"), b"weights").expect("write");
    std::fs::write(dir.join("damaged"), b"moments").expect("write");
    let files = take(&store, &dir, None, trial(), 2).expect("take");
    let backup = temp.path().join("backup");
    back_up(&store, &backup, &files).expect("back up");

    // Another node's store, which has never seen the objects.
    let other =
        ObjectStore::open(temp.path().join("other"), StoreLimits::default()).expect("other store");
    let [damaged, state] = [&files[0], &files[1]];
    let bytes = restore_from_backup(&other, &backup, state, trial()).expect("restore");
    assert_eq!(&bytes[..], b"weights");
    assert!(other.info(state.object).expect("stored").pinned);

    let damaged_path = backup.join("objects").join(damaged.object.to_string());
    std::fs::write(&damaged_path, b"mOments").expect("damage");
    let error = restore_from_backup(&other, &backup, damaged, trial()).expect_err("damaged");
    assert!(matches!(error, CheckpointError::Store { .. }), "{error}");
    assert!(!other.contains(damaged.object));

    remove_from_backup(&backup, &[state.object, damaged.object]);
    assert!(
        std::fs::read_dir(backup.join("objects"))
            .expect("backup objects")
            .next()
            .is_none()
    );
}

#[test]
fn links_in_a_checkpoint_are_refused_and_never_read() {
    let temp = tempfile::tempdir().expect("tempdir");
    let store =
        ObjectStore::open(temp.path().join("objects"), StoreLimits::default()).expect("store");
    let secret_dir = temp.path().join("node-secrets");
    std::fs::create_dir_all(&secret_dir).expect("mkdir");
    std::fs::write(secret_dir.join("token"), b"the cluster token").expect("write");
    let work = temp.path().join("work");
    std::fs::create_dir_all(&work).expect("mkdir");
    let dir = work.join("checkpoint");
    // The whole checkpoint directory a link to the node's secrets.
    std::os::unix::fs::symlink(&secret_dir, &dir).expect("symlink");
    let error = take(&store, &dir, None, trial(), 1).expect_err("a linked directory");
    assert!(
        error.to_string().contains("the rule \"no symbolic links\""),
        "{error}"
    );
    assert!(
        dir.is_dir() && !dir.is_symlink(),
        "made afresh for the worker"
    );
    // A link to a secret file inside an ordinary checkpoint directory.
    std::fs::write(dir.join("state"), b"weights").expect("write");
    std::os::unix::fs::symlink(secret_dir.join("token"), dir.join("token")).expect("symlink");
    let error = take(&store, &dir, None, trial(), 2).expect_err("a linked file");
    assert!(
        error
            .to_string()
            .contains("the rule \"no symbolic links\" refuses")
            && error.to_string().contains("checkpoint/token"),
        "{error}"
    );
    assert_eq!(store.holdings().len(), 0, "nothing was stored");
    assert_eq!(
        std::fs::read(secret_dir.join("token")).expect("read"),
        b"the cluster token",
        "the target is untouched"
    );
}

#[test]
fn hard_linked_files_and_files_of_another_uid_are_refused_by_name() {
    let temp = tempfile::tempdir().expect("tempdir");
    let store =
        ObjectStore::open(temp.path().join("objects"), StoreLimits::default()).expect("store");
    let secret_dir = temp.path().join("node-secrets");
    std::fs::create_dir_all(&secret_dir).expect("mkdir");
    std::fs::write(secret_dir.join("token"), b"the cluster token").expect("write");
    let dir = temp.path().join("work").join("checkpoint");
    std::fs::create_dir_all(&dir).expect("mkdir");
    std::fs::write(dir.join("state"), b"weights").expect("write");
    // A hard link to another's file, made where the worker could make it.
    std::fs::hard_link(secret_dir.join("token"), dir.join("token")).expect("hard link");
    let error = take(&store, &dir, None, trial(), 1).expect_err("a hard-linked file");
    let message = error.to_string();
    assert!(
        message.contains("token") && message.contains("the rule \"no hard links\""),
        "{message}"
    );
    assert_eq!(store.holdings().len(), 0, "nothing was stored");

    // Under its own uid, a worker's checkpoint holds only files of that uid.
    if !nix::unistd::geteuid().is_root() {
        return;
    }
    let worker = crate::isolation::fs::FileOwner::of_uid(64_999);
    // The node made the directory for the worker.
    std::os::unix::fs::chown(&dir, Some(worker.uid), Some(worker.gid)).expect("chown");
    std::fs::write(dir.join("state"), b"weights").expect("write");
    std::os::unix::fs::chown(dir.join("state"), Some(worker.uid), Some(worker.gid)).expect("chown");
    std::fs::write(dir.join("other"), b"root's").expect("write");
    let error = take(&store, &dir, Some(worker), trial(), 2).expect_err("another uid's file");
    let message = error.to_string();
    assert!(
        message.contains("other") && message.contains("belongs to user id 0"),
        "{message}"
    );
    assert_eq!(store.holdings().len(), 0, "nothing was stored");
    // Its own files alone are taken.
    std::fs::write(dir.join("state"), b"weights").expect("write");
    std::os::unix::fs::chown(dir.join("state"), Some(worker.uid), Some(worker.gid)).expect("chown");
    let files = take(&store, &dir, Some(worker), trial(), 3).expect("own files");
    assert_eq!(files.len(), 1);
}

#[test]
fn outputs_are_stored_pinned_and_bounded_in_files_and_bytes() {
    use super::{OutputLimits, take_outputs};
    let temp = tempfile::tempdir().expect("tempdir");
    let store =
        ObjectStore::open(temp.path().join("objects"), StoreLimits::default()).expect("store");
    let dir = temp.path().join("output");
    let limits = OutputLimits {
        max_files: 2,
        max_bytes: 10,
    };
    // No directory, or an empty one: no outputs, no error.
    assert!(
        take_outputs(&store, &dir, None, trial(), limits)
            .expect("none")
            .is_empty()
    );
    std::fs::create_dir_all(dir.join("sub")).expect("mkdir");
    std::fs::write(dir.join("n.txt"), b"42\n").expect("write");
    std::fs::write(dir.join("sub").join("m"), b"7").expect("write");
    let files = take_outputs(&store, &dir, None, trial(), limits).expect("take");
    assert_eq!(
        files
            .iter()
            .map(|file| file.name.as_str())
            .collect::<Vec<_>>(),
        ["n.txt", "sub/m"]
    );
    assert!(
        files
            .iter()
            .all(|file| store.info(file.object).expect("stored").pinned)
    );
    assert_eq!(files[0].size, 3);
    // The directory is left as it is (the worker is gone; nothing reads it again).
    assert!(dir.join("n.txt").exists());
    std::fs::write(dir.join("third"), b"x").expect("write");
    let error = take_outputs(&store, &dir, None, trial(), limits).expect_err("too many");
    assert!(error.to_string().contains("--output-max-files"), "{error}");
    std::fs::remove_file(dir.join("third")).expect("rm");
    std::fs::write(dir.join("n.txt"), b"0123456789").expect("write");
    let error = take_outputs(&store, &dir, None, trial(), limits).expect_err("too large");
    assert!(error.to_string().contains("--output-max-bytes"), "{error}");
    // A link is refused, never followed.
    std::fs::remove_file(dir.join("n.txt")).expect("rm");
    std::os::unix::fs::symlink("/etc/passwd", dir.join("n.txt")).expect("symlink");
    let error = take_outputs(&store, &dir, None, trial(), limits).expect_err("a link");
    assert!(
        error.to_string().contains("the rule \"no symbolic links\""),
        "{error}"
    );
}

#[test]
fn an_output_that_grew_after_its_size_was_checked_is_refused_not_read_to_its_end() {
    let temp = tempfile::tempdir().expect("tempdir");
    let store =
        ObjectStore::open(temp.path().join("objects"), StoreLimits::default()).expect("store");
    let dir = temp.path().join("output");
    std::fs::create_dir_all(&dir).expect("mkdir");
    // Checked at 3 bytes; 1 MiB by the time it is stored.
    std::fs::write(dir.join("n.txt"), vec![b'x'; 1 << 20]).expect("write");
    let reader = super::reader::WorkerReader::of_path(&dir);
    let checked = [("n.txt".to_owned(), 3u64)].into();
    let error = take::store_named(
        &store,
        &reader,
        vec!["n.txt".to_owned()],
        trial(),
        Some(&checked),
    )
    .expect_err("grew");
    assert!(
        error.to_string().contains("changed while it was stored"),
        "{error}"
    );
    // Only the checked length and one byte more were read, and nothing was kept.
    assert!(store.info(crate::objects::object_id(b"xxxx")).is_none());
    assert!(
        store
            .info(crate::objects::object_id(&vec![b'x'; 1 << 20]))
            .is_none()
    );
}
