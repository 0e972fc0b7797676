//! The head's QUIC front door: authentication, request streams and node sessions.
//!
//! Each connection must open with a `Hello` carrying a credential: a node
//! presents the node credential (the cluster token), a client a user's secret.
//! Every request is then authorized and served by the actor (`stream`)
//! against the user table as it is at that moment, and a user's connections are closed
//! as soon as their credential is revoked. A bad frame on one stream is
//! answered with an error on that stream and logged; it never affects other
//! streams or connections. Bulk blob bytes are streamed
//! straight between the socket and the blob directory, never through the actor.

mod node_session;
mod stream;

use std::sync::Arc;
use std::sync::atomic::AtomicU64;
use std::time::Duration;

use quinn::{Connection, RecvStream, SendStream};
use ractor::ActorRef;
use tokio::sync::watch;
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;
use tracing::{Instrument, debug, info, info_span, warn};
use xp_head_core::auth::access::Caller;
use xp_head_core::auth::users;
use xp_runtime::frame::{self, FrameError};
use xp_runtime::protocol::{ErrorCode, Hello, Message, PeerRole, RemoteError, Welcome};
use xp_runtime::tls::ClusterIdentity;
use xp_runtime::transport::{
    self, CLOSE_BAD_TOKEN, CLOSE_PROTOCOL_ERROR, CLOSE_REVOKED, HANDSHAKE_TIMEOUT,
};

use crate::actor::{HeadMsg, call};
use crate::blobs::BlobStore;
use crate::sessions::Sessions;

/// The largest hello accepted from a peer not yet authenticated.
const MAX_HELLO_BYTES: usize = 16 << 10;

/// What every connection handler shares.
pub(crate) struct ServerContext {
    /// The cluster's trust material.
    pub identity: ClusterIdentity,
    /// The head actor.
    pub head: ActorRef<HeadMsg>,
    /// Connected nodes.
    pub sessions: Sessions,
    /// Driver binaries.
    pub blobs: BlobStore,
    /// The newest event's sequence number.
    pub event_seq: watch::Receiver<u64>,
    /// Changes whenever the user table changes.
    pub users_changed: watch::Receiver<u64>,
    /// Numbers sessions and log requests.
    pub counter: AtomicU64,
    /// Set when the head shuts down.
    pub shutdown: CancellationToken,
    /// The head's counters (requests and errors by kind).
    pub metrics: Arc<crate::metrics::HeadMetrics>,
    /// The most node messages one call to the actor carries (its group commit's size).
    pub commit_batch: usize,
    /// Every user's turns for heavy reads, shared with the HTTP API.
    pub turns: Arc<crate::turns::Turns>,
}

/// Accepts connections until shutdown.
pub(crate) async fn serve(endpoint: quinn::Endpoint, context: Arc<ServerContext>) {
    let mut connections = JoinSet::new();
    loop {
        tokio::select! {
            () = context.shutdown.cancelled() => break,
            incoming = endpoint.accept() => {
                let Some(incoming) = incoming else { break };
                let context = context.clone();
                let remote = incoming.remote_address();
                connections.spawn(handle_connection(incoming, context).instrument(info_span!("connection", %remote)));
            }
            Some(_) = connections.join_next(), if !connections.is_empty() => {}
        }
    }
    endpoint.close(transport::CLOSE_SHUTDOWN.into(), b"head shutting down");
    connections.shutdown().await;
}

async fn handle_connection(incoming: quinn::Incoming, context: Arc<ServerContext>) {
    let connection = match tokio::time::timeout(HANDSHAKE_TIMEOUT, incoming).await {
        Ok(Ok(connection)) => connection,
        Ok(Err(error)) => {
            debug!(%error, "QUIC handshake failed");
            return;
        }
        Err(_) => {
            debug!("QUIC handshake timed out");
            return;
        }
    };
    let Some((mut send, recv, hello)) = read_hello(&connection).await else {
        return;
    };
    // The agent is the client's text: cut what is logged of it.
    let agent = xp_head_core::auth::access::truncated(
        &hello.agent,
        xp_head_core::auth::access::MAX_AUDIT_TEXT_BYTES,
    );
    let caller = match authenticate(&context, &hello).await {
        Ok(caller) => caller,
        Err(error) => {
            warn!(%agent, role = ?hello.role, reason = %error.message, "connection refused");
            refuse(&connection, &mut send, error, CLOSE_BAD_TOKEN).await;
            return;
        }
    };
    let welcome = Message::Welcome(Welcome {
        agent: format!("xp-head {}", env!("CARGO_PKG_VERSION")),
    });
    if frame::write_message(&mut send, &welcome).await.is_err() {
        return;
    }
    match &caller {
        Caller::User { name, .. } => {
            info!(%agent, user = %name, "user connected");
            serve_requests(connection, context, caller).await;
        }
        Caller::Node => {
            debug!(%agent, "node authenticated");
            let requests = xp_runtime::task::spawn(
                "node-requests",
                serve_requests(connection.clone(), context.clone(), Caller::Node),
            );
            node_session::run_node_session(&connection, send, recv, &context).await;
            requests.abort();
        }
    }
}

/// The connection's first stream and its hello, read within the handshake
/// timeout and before anything else (nothing but a small hello is read
/// before the token is checked); `None` when the connection was refused.
async fn read_hello(connection: &Connection) -> Option<(SendStream, RecvStream, Hello)> {
    let first = tokio::time::timeout(HANDSHAKE_TIMEOUT, async {
        let (send, mut recv) = connection
            .accept_bi()
            .await
            .map_err(|error| FrameError::Io(std::io::Error::other(error)))?;
        let hello = frame::read_hello(&mut recv, MAX_HELLO_BYTES).await;
        Ok::<_, FrameError>((send, recv, hello))
    })
    .await;
    let (mut send, recv, hello) = match first {
        Ok(Ok(first)) => first,
        Ok(Err(error)) => {
            warn!(%error, "connection refused: bad first frame");
            connection.close(CLOSE_PROTOCOL_ERROR.into(), error.to_string().as_bytes());
            return None;
        }
        Err(_) => {
            warn!("connection refused: no hello in time");
            connection.close(CLOSE_PROTOCOL_ERROR.into(), b"no hello in time");
            return None;
        }
    };
    match hello {
        Ok(Some(hello)) => Some((send, recv, hello)),
        Ok(None) => None,
        Err(FrameError::NotHello) => {
            warn!("connection refused: first message is not a hello");
            refuse(
                connection,
                &mut send,
                RemoteError::new(ErrorCode::BadRequest, "the first message must be a hello"),
                CLOSE_PROTOCOL_ERROR,
            )
            .await;
            None
        }
        Err(error) => {
            warn!(%error, "connection refused: bad first frame");
            connection.close(CLOSE_PROTOCOL_ERROR.into(), error.to_string().as_bytes());
            None
        }
    }
}

/// Who a hello's credential names, or why it is refused: a node must present
/// the node credential and a client a user's, and each mistake is named.
async fn authenticate(context: &ServerContext, hello: &Hello) -> Result<Caller, RemoteError> {
    let is_node_credential = context.identity.token_matches(&hello.token);
    let secret_hash = users::secret_hash(&hello.token);
    match hello.role {
        PeerRole::Node if is_node_credential => Ok(Caller::Node),
        PeerRole::Node => {
            match call(&context.head, |reply| HeadMsg::Identify(secret_hash, reply)).await {
                Ok(_) => Err(RemoteError::new(
                    ErrorCode::BadToken,
                    "this is a user credential; nodes join with the node credential printed as `node:`",
                )),
                Err(error) if error.code == ErrorCode::BadToken => Err(RemoteError::new(
                    ErrorCode::BadToken,
                    "wrong token: the join string's token is not this cluster's node credential",
                )),
                Err(error) => Err(error),
            }
        }
        PeerRole::Client if is_node_credential => Err(RemoteError::new(
            ErrorCode::BadToken,
            "this is the node credential, which only nodes use; clients need a user credential (`xp-head user add NAME --team TEAM` on the head machine)",
        )),
        PeerRole::Client => call(&context.head, |reply| HeadMsg::Identify(secret_hash, reply))
            .await
            .map(|name| Caller::User { name, secret_hash }),
    }
}

/// Sends `error` and closes the connection once the peer has read it (or after a grace period).
async fn refuse(connection: &Connection, send: &mut SendStream, error: RemoteError, code: u32) {
    transport::send_error(send, error.clone()).await;
    let _ = tokio::time::timeout(Duration::from_secs(2), connection.closed()).await;
    connection.close(code.into(), error.message.as_bytes());
}

/// The driver session of one connection: named when it first asks where to
/// store objects, and ended (its objects collected) when the connection ends.
type DriverSession = Arc<std::sync::OnceLock<String>>;

async fn serve_requests(connection: Connection, context: Arc<ServerContext>, caller: Caller) {
    let mut streams = JoinSet::new();
    let session = DriverSession::default();
    // What this connection uploaded is kept until it closes (dropped last).
    let uploads = Arc::new(context.blobs.connection());
    let mut users_changed = context.users_changed.clone();
    let caller = Arc::new(caller);
    loop {
        tokio::select! {
            () = context.shutdown.cancelled() => break,
            accepted = connection.accept_bi() => {
                let Ok((send, recv)) = accepted else { break };
                streams.spawn(stream::handle_stream(send, recv, context.clone(), session.clone(), caller.clone(), uploads.clone()));
            }
            Ok(()) = users_changed.changed(), if matches!(*caller, Caller::User { .. }) => {
                if let Some(reason) = still_allowed(&context, &caller).await {
                    info!(%reason, "closing a user's connection: their credential no longer holds");
                    connection.close(CLOSE_REVOKED.into(), reason.as_bytes());
                    break;
                }
            }
            Some(_) = streams.join_next(), if !streams.is_empty() => {}
        }
    }
    streams.shutdown().await;
    if let Some(session) = session.get() {
        debug!(%session, "driver session ended; its objects go");
        let _ = context.head.cast(HeadMsg::DriverGone(session.clone()));
    }
}

/// Why `caller` may no longer use this connection (revoked, replaced or
/// removed), or `None` while they may.
async fn still_allowed(context: &ServerContext, caller: &Caller) -> Option<String> {
    let Caller::User { name, secret_hash } = caller else {
        return None;
    };
    match call(&context.head, |reply| {
        HeadMsg::Identify(*secret_hash, reply)
    })
    .await
    {
        Ok(current) if current == *name => None,
        Ok(_) | Err(_) => Some(format!(
            "the credential of user {name} was revoked; ask an admin for a new one"
        )),
    }
}

/// The name of this connection's driver session, drawn on first use.
fn session_name(session: &DriverSession) -> String {
    session
        .get_or_init(|| {
            // Without entropy, the session's address is unique among live connections.
            xp_runtime::tls::random_secret().map_or_else(
                || format!("{:p}", Arc::as_ptr(session)),
                |secret| format!("driver-{}", hex::encode(&secret[..12])),
            )
        })
        .clone()
}
