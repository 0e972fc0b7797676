//! The object server and fetcher over real QUIC and TCP on loopback: chunked
//! fetches, the bulk port's tickets, corrupt sources and local copies, refused
//! credentials, and what a capability may fetch and store.

use std::os::unix::fs::PermissionsExt;

use xp_runtime::ids::NodeId;

use xp_runtime::protocol::{
    CapabilityKey, Grant, Holder, ObjectCapability, ObjectRules, ReadScope, Revocation,
    RevocationEntry, TeamQuota,
};

use super::*;
use crate::objects::{StoreLimits, Tier};

const TOKEN: &str = "cluster-token";

struct Peer {
    _dir: tempfile::TempDir,
    store: Arc<ObjectStore>,
    access: Arc<ObjectAccess>,
    server: ObjectServer,
    source: ObjectSource,
    dropped: mpsc::UnboundedReceiver<ObjectChange>,
}

fn peer(memory_bytes: u64) -> Peer {
    let dir = tempfile::tempdir().expect("tempdir");
    let limits = StoreLimits {
        memory_bytes,
        ..StoreLimits::default()
    };
    let store = Arc::new(ObjectStore::open(dir.path().join("objects"), limits).expect("store"));
    let (dropped_tx, dropped) = mpsc::unbounded_channel();
    let access = Arc::new(ObjectAccess::new(TOKEN));
    let server = ObjectServer::start(
        store.clone(),
        "127.0.0.1:0".parse().expect("address"),
        access.clone(),
        dropped_tx,
    )
    .expect("server");
    let source = ObjectSource {
        node: NodeId::random(),
        host: "127.0.0.1".to_owned(),
        endpoint: server.endpoint().expect("endpoint"),
    };
    Peer {
        _dir: dir,
        store,
        access,
        server,
        source,
        dropped,
    }
}

fn node_fetcher(token: &str) -> ObjectFetcher {
    ObjectFetcher::new(Credential::Node(object_wire::node_credential(token))).expect("fetcher")
}

fn owner() -> Owner {
    Owner::Trial("3f2a9c0d11b2e4f7-t3".parse().expect("trial id"))
}

fn wanted(id: ObjectId, pin: bool) -> Wanted {
    Wanted {
        id,
        owner: owner(),
        pin,
        size: None,
        path: FetchPath::Quic,
    }
}

fn pattern(len: usize) -> Vec<u8> {
    (0..len).map(|index| (index * 31 % 251) as u8).collect()
}

/// Fetches an object of several chunks, the last one short, over `path`
/// from a holder whose memory tier is `memory_bytes`, and checks that it
/// arrived whole, verified and pinned.
async fn check_multi_chunk_fetch(memory_bytes: u64, path: FetchPath) {
    let holder = peer(memory_bytes);
    let fetching = peer(1 << 30);
    let bytes = pattern(3 * object_wire::CHUNK_BYTES as usize + 12_345);
    let id = holder.store.put(bytes.clone(), owner()).expect("put");
    let fetcher = node_fetcher(TOKEN);
    let wanted = Wanted {
        path,
        ..wanted(id, true)
    };
    let sources = std::slice::from_ref(&holder.source);
    fetcher
        .ensure(&fetching.store, wanted, sources, None)
        .await
        .expect("fetch");
    assert_eq!(&*fetching.store.get(id).expect("stored"), bytes.as_slice());
    assert!(fetching.store.info(id).expect("info").pinned);
    holder.server.close();
}

#[tokio::test]
async fn a_multi_chunk_object_arrives_whole_and_verified() {
    check_multi_chunk_fetch(1 << 30, FetchPath::Quic).await;
}

#[tokio::test]
async fn a_corrupt_source_is_skipped_and_reported_and_the_next_one_used() {
    // Memory limit 0: objects live on disk, where they can be damaged.
    let damaged = peer(0);
    let healthy = peer(0);
    let fetching = peer(0);
    let bytes = pattern(100_000);
    let id = damaged.store.put(bytes.clone(), owner()).expect("put");
    healthy.store.put(bytes.clone(), owner()).expect("put");
    let path = damaged.store.dir().join(id.to_string());
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).expect("chmod");
    let mut file = std::fs::read(&path).expect("read");
    file[777] ^= 0xff;
    std::fs::write(&path, &file).expect("write");

    let fetcher = node_fetcher(TOKEN);
    let sources = [damaged.source.clone(), healthy.source.clone()];
    fetcher
        .ensure(&fetching.store, wanted(id, false), &sources, None)
        .await
        .expect("fetched from the healthy source");
    assert_eq!(&*fetching.store.get(id).expect("stored"), bytes.as_slice());
    let mut damaged = damaged;
    assert_eq!(
        damaged.dropped.recv().await,
        Some(ObjectChange::Dropped(id)),
        "the damaged copy is reported"
    );
    assert!(!damaged.store.contains(id), "and deleted");
}

#[tokio::test]
async fn a_corrupt_local_copy_is_replaced_from_a_replica() {
    let holder = peer(0);
    let local = peer(0);
    let bytes = pattern(50_000);
    let id = holder.store.put(bytes.clone(), owner()).expect("put");
    local.store.put(bytes.clone(), owner()).expect("put");
    let path = local.store.dir().join(id.to_string());
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).expect("chmod");
    std::fs::write(&path, vec![0u8; bytes.len()]).expect("damage");
    let fetcher = node_fetcher(TOKEN);
    fetcher
        .ensure(
            &local.store,
            wanted(id, true),
            std::slice::from_ref(&holder.source),
            None,
        )
        .await
        .expect("repaired");
    assert_eq!(&*local.store.get(id).expect("good again"), bytes.as_slice());
}

#[tokio::test]
async fn a_wrong_token_or_a_missing_object_fails_clearly() {
    let holder = peer(1 << 20);
    let fetching = peer(1 << 20);
    let id = holder.store.put(pattern(10), owner()).expect("put");
    let intruder = node_fetcher("not the token");
    let error = intruder
        .ensure(
            &fetching.store,
            wanted(id, false),
            std::slice::from_ref(&holder.source),
            None,
        )
        .await
        .expect_err("refused");
    assert!(
        error.to_string().contains("wrong node credential"),
        "{error}"
    );
    let fetcher = node_fetcher(TOKEN);
    let absent = ObjectId::of(b"never stored");
    let error = fetcher
        .ensure(
            &fetching.store,
            wanted(absent, false),
            std::slice::from_ref(&holder.source),
            None,
        )
        .await
        .expect_err("absent");
    assert!(error.to_string().contains("NotFound"), "{error}");
    assert!(!fetching.store.contains(absent));
}

#[tokio::test]
async fn garbage_on_an_object_stream_gets_an_error_not_a_crash() {
    let holder = peer(1 << 20);
    let id = holder.store.put(pattern(10), owner()).expect("put");
    let (mut send, mut recv) = raw_stream(&holder).await;
    send.write_all(&[7, 0, 0, 0, 1, 2, 3, 4, 5, 6, 7])
        .await
        .expect("write");
    let _ = send.finish();
    let header: FetchHeader = object_wire::read_small(&mut recv).await.expect("answer");
    assert!(
        matches!(
            header,
            FetchHeader::Error {
                code: FetchErrorCode::Malformed,
                ..
            }
        ),
        "{header:?}"
    );
    // The server still serves proper requests.
    let fetching = peer(1 << 20);
    let fetcher = node_fetcher(TOKEN);
    fetcher
        .ensure(
            &fetching.store,
            wanted(id, false),
            std::slice::from_ref(&holder.source),
            None,
        )
        .await
        .expect("still serving");
}

const NOW_SLACK_MS: u64 = 60 * 60 * 1000;

/// A client presenting a capability of `holder` for user `subject` of `team`
/// reading `read`, signed with the cluster's key (or `key`'s).
fn capability_client(
    key: &str,
    holder: Holder,
    team: &str,
    read: Vec<ReadScope>,
) -> (ObjectClient, ObjectCapability) {
    let now = SystemClock.now();
    let grant = Grant {
        holder,
        subject: format!("{team}-user"),
        team: team.to_owned(),
        read,
        issued_ms: now,
        expires_ms: now + NOW_SLACK_MS,
    };
    let capability = ObjectCapability::issue(&CapabilityKey::derive(key), grant);
    let credential = Credential::Capability(Box::new(capability.clone()));
    (ObjectClient::new(credential).expect("client"), capability)
}

fn session(name: &str) -> Holder {
    Holder::Session(name.to_owned())
}

fn check_refused<T: std::fmt::Debug>(
    outcome: Result<T, object_wire::ObjectClientError>,
    code: FetchErrorCode,
    words: &str,
) {
    match outcome {
        Err(object_wire::ObjectClientError::Refused { code: got, message }) => {
            assert_eq!(got, code, "{message}");
            assert!(message.contains(words), "{words:?} not in {message:?}");
        }
        other => panic!("expected a {code:?} refusal, got {other:?}"),
    }
}

/// Puts an object of another team's trial (1000 bytes) and one of driver
/// session `driver-a` (2000 bytes) on `holder`.
fn another_trials_and_a_drivers(holder: &Peer) -> (ObjectId, ObjectId) {
    let theirs = holder
        .store
        .put(
            pattern(1000),
            Owner::Trial("00000000000000aa-t0".parse().expect("id")),
        )
        .expect("put");
    let ours = holder
        .store
        .put(pattern(2000), Owner::Driver("driver-a".to_owned()))
        .expect("put");
    (theirs, ours)
}

/// A client of driver session `driver-a` of team `alpha`, reading its session's objects.
fn driver_a_of_alpha() -> ObjectClient {
    let read = vec![ReadScope::Driver("driver-a".to_owned())];
    capability_client(TOKEN, session("driver-a"), "alpha", read).0
}

#[tokio::test]
async fn a_capability_fetches_only_what_its_grant_covers_and_is_counted_for_its_team() {
    let holder = peer(1 << 20);
    let (theirs, ours) = another_trials_and_a_drivers(&holder);
    let client = driver_a_of_alpha();
    let bytes = client
        .fetch_from(&holder.source, ours, None, 1 << 20)
        .await
        .expect("its own session's object");
    assert_eq!(bytes.len(), 2000);
    let refused = client
        .fetch_from(&holder.source, theirs, None, 1 << 20)
        .await;
    check_refused(refused, FetchErrorCode::Forbidden, "does not cover object");
    let granted = vec![ReadScope::Object(theirs)];
    let (client, _) = capability_client(TOKEN, session("driver-b"), "alpha", granted);
    client
        .fetch_from(&holder.source, theirs, None, 1 << 20)
        .await
        .expect("granted by id");
    let report = holder.access.take_report().expect("counted");
    assert_eq!(report.counts.len(), 1, "{report:?}");
    let alpha = &report.counts[0];
    assert_eq!(
        (
            alpha.team.as_str(),
            alpha.fetches,
            alpha.fetched_bytes,
            alpha.refusals
        ),
        ("alpha", 2, 3000, 1)
    );
    assert_eq!(report.refusals.len(), 1);
    assert_eq!(report.refusals[0].subject, "alpha-user");
    assert!(report.refusals[0].action.contains(&theirs.to_string()));
}

#[tokio::test]
async fn a_forged_revoked_or_expired_capability_is_refused() {
    let holder = peer(1 << 20);
    let id = holder
        .store
        .put(pattern(100), Owner::Driver("driver-a".to_owned()))
        .expect("put");
    let read = vec![ReadScope::Driver("driver-a".to_owned())];
    let (forged, _) = capability_client(
        "another cluster",
        session("driver-a"),
        "alpha",
        read.clone(),
    );
    let refused = forged.fetch_from(&holder.source, id, None, 1 << 20).await;
    check_refused(refused, FetchErrorCode::BadCredential, "signature");
    let (_, mut widened) = capability_client(TOKEN, session("driver-x"), "alpha", vec![]);
    widened.grant.read = read.clone();
    let client = ObjectClient::new(Credential::Capability(Box::new(widened))).expect("client");
    let refused = client.fetch_from(&holder.source, id, None, 1 << 20).await;
    check_refused(refused, FetchErrorCode::BadCredential, "signature");
    let (client, capability) = capability_client(TOKEN, session("driver-a"), "alpha", read);
    holder.access.revoke(vec![RevocationEntry {
        revocation: Revocation::Holder(capability.grant.holder.clone()),
        until_ms: capability.grant.expires_ms,
    }]);
    let refused = client.fetch_from(&holder.source, id, None, 1 << 20).await;
    check_refused(
        refused,
        FetchErrorCode::Revoked,
        "driver session driver-a ended",
    );
    let mut expired = capability.grant.clone();
    expired.holder = session("driver-b");
    expired.expires_ms = 1;
    let expired = ObjectCapability::issue(&CapabilityKey::derive(TOKEN), expired);
    let client = ObjectClient::new(Credential::Capability(Box::new(expired))).expect("client");
    let refused = client.fetch_from(&holder.source, id, None, 1 << 20).await;
    check_refused(refused, FetchErrorCode::Expired, "expired");
    let report = holder.access.take_report().expect("refusals");
    assert_eq!(report.refusals.len(), 4, "{report:?}");
    assert!(
        report.refusals[0].subject.contains("unverified"),
        "{report:?}"
    );
}

#[tokio::test]
async fn a_capability_stores_only_as_its_session_and_within_its_team_quota() {
    let holder = peer(1 << 20);
    holder.access.apply_rules(ObjectRules {
        default_quota: TeamQuota {
            team: String::new(),
            memory_bytes: 1000,
            disk_bytes: 1 << 20,
        },
        teams: vec![TeamQuota {
            team: "alpha".to_owned(),
            memory_bytes: 1000,
            disk_bytes: 5000,
        }],
        revoked: Vec::new(),
    });
    let (client, _) = capability_client(TOKEN, session("driver-a"), "alpha", vec![]);
    let id = client
        .store(&holder.source, "driver-a", &pattern(3000))
        .await
        .expect("within the quota");
    let info = holder.store.info(id).expect("stored");
    assert_eq!(info.tier, Tier::Disk, "over the memory quota: on disk");
    let refused = client.store(&holder.source, "driver-b", &pattern(10)).await;
    check_refused(
        refused,
        FetchErrorCode::Forbidden,
        "stores only as driver session driver-a",
    );
    let refused = client
        .store(&holder.source, "driver-a", &pattern(3000))
        .await;
    check_refused(
        refused,
        FetchErrorCode::OverQuota,
        "5000-byte disk quota (objects.disk)",
    );
    let attempt = Holder::Attempt {
        trial: "00000000000000aa-t0".parse().expect("id"),
        attempt: 1,
    };
    let (client, _) = capability_client(TOKEN, attempt, "alpha", vec![]);
    let refused = client.store(&holder.source, "driver-a", &pattern(10)).await;
    check_refused(
        refused,
        FetchErrorCode::Forbidden,
        "a trial stores through its node",
    );
    let (other_team, _) = capability_client(TOKEN, session("driver-c"), "beta", vec![]);
    other_team
        .store(&holder.source, "driver-c", &pattern(4000))
        .await
        .expect("another team's quota is its own");
    let report = holder.access.take_report().expect("counted");
    let stores: Vec<(String, u64, u64)> = report
        .counts
        .iter()
        .map(|counts| (counts.team.clone(), counts.stores, counts.stored_bytes))
        .collect();
    assert_eq!(
        stores,
        [("alpha".to_owned(), 1, 3000), ("beta".to_owned(), 1, 4000)]
    );
}

/// A QUIC stream to `holder`'s object server, as any client opens one.
async fn raw_stream(holder: &Peer) -> (quinn::SendStream, quinn::RecvStream) {
    let endpoint = object_wire::client_endpoint().expect("endpoint");
    let config =
        object_wire::client_config(holder.source.endpoint.cert_sha256, true).expect("config");
    let addr = SocketAddr::from(([127, 0, 0, 1], holder.source.endpoint.port));
    let connection = endpoint
        .connect_with(config, addr, object_wire::SERVER_NAME)
        .expect("connect")
        .await
        .expect("handshake");
    connection.open_bi().await.expect("stream")
}

/// A bulk ticket for `id` from `holder`, asked for as a node: the object's
/// size, the bulk port and the ticket.
async fn ask_ticket(holder: &Peer, id: ObjectId) -> (u64, u16, object_wire::BulkTicket) {
    let (mut send, mut recv) = raw_stream(holder).await;
    let request = ObjectRequest {
        credential: Credential::Node(object_wire::node_credential(TOKEN)),
        op: ObjectOp::Bulk { id },
    };
    object_wire::write_small(&mut send, &request)
        .await
        .expect("ask");
    let _ = send.finish();
    let header: FetchHeader = object_wire::read_small(&mut recv).await.expect("answer");
    let FetchHeader::Bulk { size, port, ticket } = header else {
        panic!("expected a ticket, got {header:?}");
    };
    (size, port, ticket)
}

/// Whether the bulk port closed `stream` (an end or a reset) within `within`.
async fn closed_within(stream: &mut tokio::net::TcpStream, within: std::time::Duration) -> bool {
    use tokio::io::AsyncReadExt;
    let mut byte = [0u8; 1];
    matches!(
        tokio::time::timeout(within, stream.read(&mut byte)).await,
        Ok(Ok(0) | Err(_))
    )
}

#[tokio::test]
async fn the_bulk_port_holds_few_silent_connections_and_only_for_a_while() {
    let holder = peer(1 << 20);
    let bytes = pattern(1000);
    let id = holder.store.put(bytes.clone(), owner()).expect("put");
    let port = holder.server.bulk_port().expect("a bulk port");
    let mut silent = Vec::new();
    for _ in 0..bulk::MAX_CONNECTIONS {
        let stream = tokio::net::TcpStream::connect(("127.0.0.1", port))
            .await
            .expect("connect");
        silent.push(stream);
    }
    // One more than the bound is closed at once, not queued behind the others.
    let mut extra = tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .expect("connect");
    let short = std::time::Duration::from_secs(2);
    assert!(
        closed_within(&mut extra, short).await,
        "the extra connection"
    );
    // The silent ones are dropped once their ticket is overdue...
    let overdue = object_wire::TICKET_WAIT + std::time::Duration::from_secs(5);
    for stream in &mut silent {
        assert!(closed_within(stream, overdue).await, "a silent connection");
    }
    // ...and the port serves tickets again.
    let (_, port, ticket) = ask_ticket(&holder, id).await;
    assert_eq!(present(port, &ticket.0).await, bytes);
}

/// What the bulk port sends after `ticket`, until it closes.
async fn present(port: u16, ticket: &[u8]) -> Vec<u8> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut stream = tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .expect("bulk port");
    stream.write_all(ticket).await.expect("ticket");
    let mut got = Vec::new();
    // A refused ticket ends in a close (or a reset): nothing is sent either way.
    let _ = stream.read_to_end(&mut got).await;
    got
}

#[tokio::test]
async fn a_bulk_ticket_opens_one_transfer_of_its_object_and_nothing_else() {
    // Both tiers: a disk object goes by sendfile, a memory one from memory.
    for memory_bytes in [0, 1 << 20] {
        let holder = peer(memory_bytes);
        let bytes = pattern(300_001);
        let id = holder.store.put(bytes.clone(), owner()).expect("put");
        let (size, port, ticket) = ask_ticket(&holder, id).await;
        assert_eq!(size, bytes.len() as u64);
        assert_eq!(Some(port), holder.server.bulk_port());
        let mut forged = ticket.0;
        forged[0] ^= 1;
        assert!(present(port, &forged).await.is_empty(), "a forged ticket");
        assert_eq!(present(port, &ticket.0).await, bytes, "tier {memory_bytes}");
        assert!(present(port, &ticket.0).await.is_empty(), "a used ticket");
        holder.server.close();
    }
}

#[tokio::test]
async fn a_fetch_over_the_bulk_path_is_verified_and_stored_like_a_quic_one() {
    // A disk object goes by sendfile, a memory one from memory.
    for memory_bytes in [0, 1 << 30] {
        check_multi_chunk_fetch(memory_bytes, FetchPath::Tcp).await;
    }
}

#[tokio::test]
async fn a_bulk_path_that_cannot_be_reached_falls_back_to_quic() {
    let holder = peer(1 << 20);
    let bytes = pattern(50_000);
    let id = holder.store.put(bytes.clone(), owner()).expect("put");
    let port = holder.server.bulk_port().expect("a bulk port");
    holder.server.bulk.as_ref().expect("bulk").close();
    // The listener goes with its task: wait until the port refuses.
    let mut tries = 0;
    while tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .is_ok()
    {
        tries += 1;
        assert!(tries < 500, "the bulk port still accepts");
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    let client =
        ObjectClient::new(Credential::Node(object_wire::node_credential(TOKEN))).expect("client");
    let (got, took) = client
        .fetch_over(FetchPath::Tcp, &holder.source, id, None, 1 << 20)
        .await
        .expect("fetched over QUIC");
    assert_eq!((&*got, took), (bytes.as_slice(), FetchPath::Quic));
}

#[tokio::test]
async fn a_capability_gets_a_bulk_ticket_only_for_what_it_may_read() {
    let holder = peer(1 << 20);
    let (theirs, ours) = another_trials_and_a_drivers(&holder);
    let client = driver_a_of_alpha();
    let (bytes, took) = client
        .fetch_over(FetchPath::Tcp, &holder.source, ours, None, 1 << 20)
        .await
        .expect("its own session's object");
    assert_eq!((bytes.len(), took), (2000, FetchPath::Tcp));
    // Refused outright: no ticket, and no second try over QUIC.
    let refused = client
        .fetch_over(FetchPath::Tcp, &holder.source, theirs, None, 1 << 20)
        .await;
    check_refused(refused, FetchErrorCode::Forbidden, "does not cover object");
    let report = holder.access.take_report().expect("counted");
    let alpha = &report.counts[0];
    assert_eq!(
        (alpha.fetches, alpha.fetched_bytes, alpha.refusals),
        (1, 2000, 1),
        "{report:?}"
    );
    assert!(report.refusals[0].action.contains("bulk port"));
}
