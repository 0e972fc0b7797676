//! Tests of the blob directory: a user's limits are checked before a byte is
//! read, owners survive a reopen, and a blob is collected only once no open
//! connection and no unfinished experiment needs it, after the grace.

use super::*;

const LIMITS: BlobLimits = BlobLimits {
    count: 2,
    bytes: 1_000,
};

/// Uploads `bytes` as `user` on `connection`.
async fn upload(
    store: &BlobStore,
    connection: &ConnectionBlobs,
    user: &str,
    bytes: &[u8],
) -> Result<BlobHash, BlobError> {
    let hash = BlobHash::of(bytes);
    let upload = Upload {
        hash,
        len: bytes.len() as u64,
        user,
        limits: LIMITS,
        connection,
    };
    store.receive(upload, &mut &bytes[..]).await.map(|()| hash)
}

#[tokio::test(start_paused = true)]
async fn a_user_over_their_limit_is_refused_and_blobs_go_once_unneeded() {
    let dir = tempfile::tempdir().unwrap();
    let store = BlobStore::open(dir.path()).unwrap();
    let alice = store.connection();
    let first = upload(&store, &alice, "alice", b"first").await.unwrap();
    let second = upload(&store, &alice, "alice", b"second").await.unwrap();
    // Her own blob again is no new one.
    upload(&store, &alice, "alice", b"first").await.unwrap();
    let refused = upload(&store, &alice, "alice", b"third").await.unwrap_err();
    assert!(
        refused
            .to_string()
            .starts_with("user alice keeps 2 driver binaries (11 bytes)"),
        "{refused}"
    );
    assert!(
        !store.path(BlobHash::of(b"third")).exists(),
        "nothing was stored"
    );
    let bob = store.connection();
    upload(&store, &bob, "bob", &[7; 1_000]).await.unwrap();
    assert!(
        upload(&store, &bob, "bob", b"x").await.is_err(),
        "bob is at his bytes"
    );
    // Pinned by its connection: nothing goes, however old.
    tokio::time::advance(COLLECT_GRACE * 2).await;
    assert!(store.collect(&BTreeSet::new()).await.is_empty());
    drop(alice);
    // Within the grace after the connection closed, still kept.
    assert!(store.collect(&BTreeSet::new()).await.is_empty());
    tokio::time::advance(COLLECT_GRACE).await;
    let collected = store.collect(&BTreeSet::from([second])).await;
    assert_eq!(collected, vec![first], "the one an experiment runs stays");
    assert!(!store.path(first).exists() && store.path(second).exists());
    assert_eq!(store.usage("alice").count, 1);
}

#[tokio::test]
async fn owners_survive_a_reopen_and_leftover_temporaries_go() {
    let dir = tempfile::tempdir().unwrap();
    let store = BlobStore::open(dir.path()).unwrap();
    let connection = store.connection();
    upload(&store, &connection, "alice", b"kept").await.unwrap();
    std::fs::write(dir.path().join(".abc.1.2.part"), b"half").unwrap();
    let reopened = BlobStore::open(dir.path()).unwrap();
    assert_eq!(reopened.usage("alice"), BlobUsage { count: 1, bytes: 4 });
    assert!(!dir.path().join(".abc.1.2.part").exists());
}

#[tokio::test]
async fn a_failed_upload_holds_nothing_of_its_user() {
    let dir = tempfile::tempdir().unwrap();
    let store = BlobStore::open(dir.path()).unwrap();
    let connection = store.connection();
    let upload = Upload {
        hash: BlobHash::of(b"announced"),
        len: 9,
        user: "alice",
        limits: LIMITS,
        connection: &connection,
    };
    let truncated = store.receive(upload, &mut &b"ann"[..]).await.unwrap_err();
    assert!(matches!(truncated, BlobError::Truncated { got: 3, len: 9 }));
    assert_eq!(store.usage("alice"), BlobUsage::default());
}
