//! The head's QUIC front door: authentication, request streams and node sessions.
//!
//! Each connection must open with a `Hello` carrying a credential: a node
//! presents the node credential (the cluster token), a client a user's secret.
//! Every request is then authorized by the actor (`HeadMsg::Authorize`) against
//! the user table as it is at that moment, and a user's connections are closed
//! as soon as their credential is revoked. A bad frame on one stream is
//! answered with an error on that stream and logged; it never affects other
//! streams or connections. Bulk blob bytes are streamed
//! straight between the socket and the blob directory, never through the actor.

use xp_head_core::pipelines::PipelineChange;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use dashmap::DashMap;
use quinn::{Connection, RecvStream, SendStream};
use ractor::ActorRef;
use tokio::io::AsyncReadExt;
use tokio::sync::{mpsc, oneshot, watch};
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;
use tracing::{Instrument, debug, error, info, info_span, warn};
use xp_runtime::frame::{self, FrameError};
use xp_runtime::ids::NodeId;
use xp_runtime::protocol::{
    ErrorCode, HeadCommand, Message, NodeMessage, ObjectKey, PeerRole, RemoteError, Request,
    Response, Welcome,
};
use xp_runtime::tls::ClusterIdentity;
use xp_runtime::transport::{
    self, BLOB_CHUNK_BYTES, CLOSE_BAD_TOKEN, CLOSE_PROTOCOL_ERROR, CLOSE_REVOKED, HANDSHAKE_TIMEOUT,
};

use crate::actor::{HeadMsg, NodeSessionHandle, Reply, Sessions};
use xp_head_core::auth::requests::{
    Access, Caller, access_of, pin_experiment, spec_team as access_team, with_team,
};
use xp_head_core::auth::{Principal, submit_team, users};
use crate::blobs::BlobStore;

/// The largest hello accepted from a peer not yet authenticated.
const MAX_HELLO_BYTES: usize = 16 << 10;
/// How long a log read waits for the node.
const LOG_READ_TIMEOUT: Duration = Duration::from_secs(10);
/// How long an actor call may take before the request fails.
const ACTOR_CALL_TIMEOUT: Duration = Duration::from_secs(30);
/// The longest an `Events` request may wait.
const MAX_EVENTS_WAIT: Duration = Duration::from_secs(30);

/// What every connection handler shares.
pub struct ServerContext {
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
}

/// Reads a node's session stream until it ends: log answers go to their
/// waiters, everything else to the batch queue.
async fn read_node_messages(
    connection: Connection,
    mut recv: RecvStream,
    pending_logs: Arc<
        DashMap<u64, oneshot::Sender<Result<xp_runtime::protocol::LogChunk, RemoteError>>>,
    >,
    batches: mpsc::Sender<NodeMessage>,
    shutdown: CancellationToken,
) {
    loop {
        let message = tokio::select! {
            () = shutdown.cancelled() => break,
            message = frame::read_message(&mut recv) => message,
        };
        match message {
            Ok(Some(Message::FromNode(NodeMessage::Logs { request_id, result }))) => {
                if let Some((_, waiter)) = pending_logs.remove(&request_id) {
                    let _ = waiter.send(result);
                }
            }
            Ok(Some(Message::FromNode(message))) => {
                if batches.send(message).await.is_err() {
                    break;
                }
            }
            Ok(Some(other)) => {
                warn!(?other, "unexpected message on a node session; closing it");
                connection.close(
                    CLOSE_PROTOCOL_ERROR.into(),
                    b"unexpected message on node session",
                );
                break;
            }
            Ok(None) => break,
            Err(error) => {
                // Node loss is judged by missed heartbeats, not by this stream.
                info!(%error, "node session stream ended");
                break;
            }
        }
    }
}

/// Calls the head actor and flattens the two error layers.
pub async fn call<T: Send + 'static>(
    head: &ActorRef<HeadMsg>,
    build: impl FnOnce(Reply<T>) -> HeadMsg,
) -> Result<T, RemoteError> {
    match head.call(build, Some(ACTOR_CALL_TIMEOUT)).await {
        Ok(ractor::rpc::CallResult::Success(result)) => result,
        Ok(_) => Err(RemoteError::new(
            ErrorCode::Unavailable,
            "the head is busy or shutting down; try again",
        )),
        Err(error) => Err(RemoteError::new(
            ErrorCode::Unavailable,
            format!("the head is shutting down: {error}"),
        )),
    }
}

/// Accepts connections until shutdown.
pub async fn serve(endpoint: quinn::Endpoint, context: Arc<ServerContext>) {
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
    let first = tokio::time::timeout(HANDSHAKE_TIMEOUT, async {
        let (send, mut recv) = connection
            .accept_bi()
            .await
            .map_err(|error| FrameError::Io(std::io::Error::other(error)))?;
        // Nothing but a small hello is read before the token is checked.
        let hello = frame::read_hello(&mut recv, MAX_HELLO_BYTES).await;
        Ok::<_, FrameError>((send, recv, hello))
    })
    .await;
    let (mut send, recv, hello) = match first {
        Ok(Ok(first)) => first,
        Ok(Err(error)) => {
            warn!(%error, "connection refused: bad first frame");
            connection.close(CLOSE_PROTOCOL_ERROR.into(), error.to_string().as_bytes());
            return;
        }
        Err(_) => {
            warn!("connection refused: no hello in time");
            connection.close(CLOSE_PROTOCOL_ERROR.into(), b"no hello in time");
            return;
        }
    };
    let hello = match hello {
        Ok(Some(hello)) => hello,
        Ok(None) => return,
        Err(FrameError::NotHello) => {
            warn!("connection refused: first message is not a hello");
            refuse(
                &connection,
                &mut send,
                RemoteError::new(ErrorCode::BadRequest, "the first message must be a hello"),
                CLOSE_PROTOCOL_ERROR,
            )
            .await;
            return;
        }
        Err(error) => {
            warn!(%error, "connection refused: bad first frame");
            connection.close(CLOSE_PROTOCOL_ERROR.into(), error.to_string().as_bytes());
            return;
        }
    };
    // The agent is the client's text: cut what is logged of it.
    let agent =
        xp_head_core::auth::requests::truncated(&hello.agent, xp_head_core::auth::requests::MAX_AUDIT_TEXT_BYTES);
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
            run_node_session(&connection, send, recv, &context).await;
            requests.abort();
        }
    }
}

/// Who a hello's credential names, or why it is refused: a node must present
/// the node credential and a client a user's, and each mistake is named.
async fn authenticate(
    context: &ServerContext,
    hello: &xp_runtime::protocol::Hello,
) -> Result<Caller, RemoteError> {
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
    let mut users_changed = context.users_changed.clone();
    let caller = Arc::new(caller);
    loop {
        tokio::select! {
            () = context.shutdown.cancelled() => break,
            accepted = connection.accept_bi() => {
                let Ok((send, recv)) = accepted else { break };
                streams.spawn(handle_stream(send, recv, context.clone(), session.clone(), caller.clone()));
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

async fn handle_stream(
    mut send: SendStream,
    mut recv: RecvStream,
    context: Arc<ServerContext>,
    session: DriverSession,
    caller: Arc<Caller>,
) {
    let request = match frame::read_message(&mut recv).await {
        Ok(Some(Message::Request(request))) => request,
        Ok(Some(other)) => {
            warn!(?other, "stream refused: not a request");
            transport::send_error(
                &mut send,
                RemoteError::new(ErrorCode::BadRequest, "expected a request"),
            )
            .await;
            return;
        }
        Ok(None) => return,
        Err(error) => {
            warn!(%error, "stream refused: bad frame");
            transport::send_error(&mut send, error.to_remote()).await;
            let _ = recv.stop(0u32.into());
            return;
        }
    };
    let mut request = request;
    let access = access_of(&request);
    let kind = access.action.describe();
    let result = match checked(&request, &access) {
        Err(error) => Some(Err(error)),
        Ok(()) => match call(&context.head, |reply| {
            HeadMsg::Authorize((*caller).clone(), access, reply)
        })
        .await
        {
            Ok(authorized) => {
                if let Some(experiment) = authorized.experiment {
                    pin_experiment(&mut request, experiment);
                }
                let principal = authorized.principal;
                serve_request(&mut send, &mut recv, &context, &session, request, principal).await
            }
            Err(refusal) => Some(Err(refusal)),
        },
    };
    let error_code = match &result {
        Some(Err(error)) => Some(format!("{:?}", error.code)),
        _ => None,
    };
    context
        .metrics
        .request(crate::metrics::Api::Quic, kind, error_code.as_deref());
    let Some(result) = result else { return };
    let message = match result {
        Ok(response) => Message::Response(response),
        Err(error) => Message::Error(error),
    };
    match transport::send_final(&mut send, &message).await {
        Ok(()) => {}
        Err(transport::TransportError::Frame(FrameError::TooLarge { len })) => {
            // Say so instead of closing the stream without a word.
            warn!(len, "response larger than a frame; refused");
            let error = RemoteError::new(
                ErrorCode::BadRequest,
                format!(
                    "the answer ({len} bytes) exceeds the {} byte frame limit: ask for one experiment, or fewer trials",
                    frame::MAX_FRAME_BYTES
                ),
            );
            transport::send_error(&mut send, error).await;
        }
        Err(error) => debug!(%error, "response not delivered"),
    }
}

/// Refuses, before anything reads or records it, a name longer than
/// `MAX_NAME_BYTES` and a spec larger than `MAX_SPEC_BYTES` (whose team
/// authorization would otherwise parse).
fn checked(request: &Request, access: &Access) -> Result<(), RemoteError> {
    if let Request::Submit(submit) = request
        && submit.spec_json.len() > xp_runtime::spec::MAX_SPEC_BYTES
    {
        return Err(RemoteError::new(
            ErrorCode::BadRequest,
            format!(
                "the spec is {} bytes; at most {} are accepted",
                submit.spec_json.len(),
                xp_runtime::spec::MAX_SPEC_BYTES
            ),
        ));
    }
    access
        .check_lengths()
        .map_err(|message| RemoteError::new(ErrorCode::BadRequest, message))
}

/// Serves one authorized request; `None` when the answer was already sent
/// (a blob's bytes follow its response frame).
async fn serve_request(
    send: &mut SendStream,
    recv: &mut RecvStream,
    context: &Arc<ServerContext>,
    session: &DriverSession,
    request: Request,
    principal: Principal,
) -> Option<Result<Response, RemoteError>> {
    let result = match request {
        Request::PutBlob { hash, len } => match context.blobs.receive(hash, len, recv).await {
            Ok(()) => {
                info!(blob = %hash, len, "blob stored");
                Ok(Response::BlobStored)
            }
            Err(error) => {
                warn!(blob = %hash, %error, "blob upload refused");
                Err(blob_refusal(&error))
            }
        },
        Request::GetBlob { hash } => match send_blob(send, &context.blobs, hash).await {
            Ok(()) => return None,
            Err(error) => Err(error),
        },
        Request::ReadLogs(log_request) => read_logs(context, log_request).await.map(Response::Logs),
        Request::Events {
            experiment,
            after,
            wait_ms,
        } => events(
            context,
            experiment,
            after,
            Duration::from_millis(u64::from(wait_ms)).min(MAX_EVENTS_WAIT),
        )
        .await
        .map(Response::Events),
        Request::Submit(mut submit) => {
            // A spec naming no team goes into the submitter's (authorized so).
            let spec_team = access_team(&submit.spec_json);
            let team = submit_team(&principal, &spec_team);
            if team != spec_team {
                match with_team(&submit.spec_json, team) {
                    Ok(spec_json) => submit.spec_json = spec_json,
                    Err(error) => {
                        return Some(Err(RemoteError::new(ErrorCode::BadRequest, error)));
                    }
                }
            }
            let submitted = call(&context.head, |reply| HeadMsg::Submit(submit, reply)).await;
            if let Ok(Response::Submitted { experiment, .. }) = &submitted {
                // What this connection stores is shared with the trials it submitted.
                let name = session_name(session);
                let _ = context
                    .head
                    .cast(HeadMsg::DriverSubmitted(*experiment, name));
            }
            submitted
        }
        Request::Status { experiment } => {
            let listed = experiment.is_none();
            let answer = call(&context.head, |reply| HeadMsg::Status(experiment, reply)).await;
            match answer {
                // A list shows only what the principal may see.
                Ok(Response::Status(mut list)) if listed => {
                    let visible = principal.visible_team();
                    list.retain(|experiment| visible.shows(&experiment.team));
                    Ok(Response::Status(list))
                }
                other => other,
            }
        }
        Request::Cancel { id } => call(&context.head, |reply| HeadMsg::Cancel(id, reply)).await,
        Request::Nodes => call(&context.head, HeadMsg::Nodes).await,
        Request::Queues => call(&context.head, HeadMsg::Queues).await,
        Request::Leases => {
            // Other teams' trials, teams and reasons stay hidden; counts are whole.
            let visible = principal.visible_team();
            let visibility = xp_head_core::pages::Visibility::new(move |team| visible.shows(team));
            call(&context.head, |reply| HeadMsg::Leases { visibility, reply }).await
        }
        Request::StoreTargets => {
            let name = session_name(session);
            call(&context.head, |reply| HeadMsg::StoreTargets(name, reply)).await
        }
        Request::SharingDrivers {
            experiment,
            sessions,
        } => {
            call(&context.head, |reply| {
                HeadMsg::SharingDrivers(experiment, sessions, reply)
            })
            .await
        }
        Request::Locate { object } => {
            call(&context.head, |reply| HeadMsg::Locate(object, reply)).await
        }
        Request::Checkpoints { experiment } => {
            call(&context.head, |reply| {
                HeadMsg::Checkpoints(experiment, reply)
            })
            .await
        }
        Request::Admin(mut admin) => {
            // Recorded as the authenticated user, never as the name the client gives.
            admin.who = principal.name().to_owned();
            call(&context.head, |reply| HeadMsg::Admin(admin, reply)).await
        }
        Request::Metrics { trial } => call(&context.head, |reply| HeadMsg::Metrics(trial, reply))
            .await
            .map(Response::Metrics),
        Request::Audit { limit } => call(&context.head, |reply| HeadMsg::Audit(limit, reply)).await,
        Request::Alerts { experiment } => {
            let visibility = principal.visible_team();
            call(&context.head, |reply| {
                HeadMsg::Alert(crate::actor::AlertMsg::List {
                    experiment,
                    visibility,
                    reply,
                })
            })
            .await
        }
        Request::Report(request) => {
            let visible = principal.visible_team();
            call(&context.head, |reply| HeadMsg::Report {
                request,
                visible,
                reply,
            })
            .await
        }
        Request::SubmitPipeline(mut submit) => {
            // As for experiments: a spec naming no team goes into the submitter's.
            let spec_team = access_team(&submit.spec_json);
            let team = submit_team(&principal, &spec_team);
            if team != spec_team {
                match with_team(&submit.spec_json, team) {
                    Ok(spec_json) => submit.spec_json = spec_json,
                    Err(error) => {
                        return Some(Err(RemoteError::new(ErrorCode::BadRequest, error)));
                    }
                }
            }
            call(&context.head, |reply| {
                HeadMsg::PipelineChange(PipelineChange::Submit(submit), reply)
            })
            .await
        }
        Request::PipelineStatus { pipeline } => {
            let visible = principal.visible_team();
            let visibility = xp_head_core::pages::Visibility::new(move |team| visible.shows(team));
            call(&context.head, |reply| HeadMsg::Pipelines {
                pipeline,
                visibility,
                reply,
            })
            .await
            .map(Response::Pipelines)
        }
        Request::CancelPipeline { pipeline } => {
            call(&context.head, |reply| {
                HeadMsg::PipelineChange(PipelineChange::Cancel(pipeline), reply)
            })
            .await
        }
        Request::RetryPipeline { pipeline } => {
            call(&context.head, |reply| {
                HeadMsg::PipelineChange(PipelineChange::Retry(pipeline), reply)
            })
            .await
        }
        Request::ObjectKey => Ok(Response::ObjectKey(ObjectKey(
            xp_runtime::object_wire::token_digest(&context.identity.token),
        ))),
        Request::Telemetry { trial } => {
            // Authorized above for the trial's team.
            let answer = call(&context.head, |reply| HeadMsg::Telemetry {
                trial,
                visibility: xp_head_core::pages::Visibility::everyone(),
                reply,
            })
            .await;
            match answer {
                Ok(Ok(telemetry)) => Ok(Response::Telemetry(telemetry)),
                Ok(Err(error)) => Err(RemoteError::new(ErrorCode::NotFound, error.to_string())),
                Err(error) => Err(error),
            }
        }
    };
    Some(result)
}

/// The answer to a failed upload: a full disk is the head's storage outage
/// (retry later), anything else is the upload's fault.
fn blob_refusal(error: &crate::blobs::BlobError) -> RemoteError {
    let disk_full = matches!(
        error,
        crate::blobs::BlobError::Io(io) if matches!(
            io.kind(),
            std::io::ErrorKind::StorageFull | std::io::ErrorKind::QuotaExceeded
        )
    );
    if disk_full {
        RemoteError::new(
            ErrorCode::StorageUnavailable,
            format!(
                "the head cannot store anything: its disk is full ({error}); nothing was changed, retry later"
            ),
        )
    } else {
        RemoteError::new(ErrorCode::BadRequest, error.to_string())
    }
}

async fn send_blob(
    send: &mut SendStream,
    blobs: &BlobStore,
    hash: xp_runtime::ids::BlobHash,
) -> Result<(), RemoteError> {
    let mut file = tokio::fs::File::open(blobs.path(hash))
        .await
        .map_err(|_| RemoteError::new(ErrorCode::NotFound, format!("no blob {hash}")))?;
    let len = file
        .metadata()
        .await
        .map_err(|error| RemoteError::new(ErrorCode::Internal, error.to_string()))?
        .len();
    let io_error = |error: std::io::Error| RemoteError::new(ErrorCode::Internal, error.to_string());
    frame::write_message(send, &Message::Response(Response::Blob { len }))
        .await
        .map_err(|error| RemoteError::new(ErrorCode::Internal, error.to_string()))?;
    let mut buffer = vec![0u8; BLOB_CHUNK_BYTES];
    loop {
        let read = file.read(&mut buffer).await.map_err(io_error)?;
        if read == 0 {
            break;
        }
        send.write_all(&buffer[..read])
            .await
            .map_err(|error| RemoteError::new(ErrorCode::Internal, error.to_string()))?;
    }
    let _ = send.finish();
    Ok(())
}

pub(crate) async fn read_logs(
    context: &ServerContext,
    request: xp_runtime::protocol::LogRequest,
) -> Result<xp_runtime::protocol::LogChunk, RemoteError> {
    let max_bytes = request.max_bytes.clamp(1, 4 << 20);
    let offset = request.offset;
    let (node_id, key, _) =
        call(&context.head, |reply| HeadMsg::LocateWorker(request, reply)).await?;
    let session = context
        .sessions
        .get(&node_id)
        .map(|session| session.clone())
        .ok_or_else(|| {
            RemoteError::new(
                ErrorCode::Unavailable,
                format!("node {node_id}, which holds this log, is not connected"),
            )
        })?;
    let request_id = context.counter.fetch_add(1, Ordering::Relaxed);
    let (reply_tx, reply_rx) = oneshot::channel();
    session.pending_logs.insert(request_id, reply_tx);
    let _ = session.commands.send(HeadCommand::ReadLogs {
        request_id,
        key,
        offset,
        max_bytes,
    });
    let answer = tokio::time::timeout(LOG_READ_TIMEOUT, reply_rx).await;
    session.pending_logs.remove(&request_id);
    match answer {
        Ok(Ok(result)) => result,
        _ => Err(RemoteError::new(
            ErrorCode::Unavailable,
            format!("node {node_id} did not answer the log read"),
        )),
    }
}

async fn events(
    context: &ServerContext,
    experiment: xp_runtime::ids::ExperimentId,
    after: u64,
    wait: Duration,
) -> Result<Vec<xp_runtime::protocol::TrialEvent>, RemoteError> {
    let mut changes = context.event_seq.clone();
    let deadline = tokio::time::Instant::now() + wait;
    loop {
        changes.borrow_and_update();
        let found = call(&context.head, |reply| {
            HeadMsg::Events(experiment, after, reply)
        })
        .await?;
        if !found.is_empty() {
            return Ok(found);
        }
        if tokio::time::timeout_at(deadline, changes.changed())
            .await
            .is_err()
        {
            return Ok(Vec::new());
        }
    }
}

async fn run_node_session(
    connection: &Connection,
    mut send: SendStream,
    mut recv: RecvStream,
    context: &Arc<ServerContext>,
) {
    let registration = match frame::read_message(&mut recv).await {
        Ok(Some(Message::FromNode(NodeMessage::Register(registration)))) => registration,
        Ok(other) => {
            warn!(?other, "node session refused: expected a registration");
            transport::send_error(
                &mut send,
                RemoteError::new(ErrorCode::BadRequest, "a node must register first"),
            )
            .await;
            return;
        }
        Err(error) => {
            warn!(%error, "node session refused: bad frame");
            transport::send_error(&mut send, error.to_remote()).await;
            return;
        }
    };
    let node_id: NodeId = registration.node_id;
    let span = info_span!("node_session", %node_id);
    async {
        let session_id = context.counter.fetch_add(1, Ordering::Relaxed);
        let (commands_tx, mut commands_rx) = mpsc::unbounded_channel::<HeadCommand>();
        let pending_logs = Arc::new(DashMap::new());
        context.sessions.insert(
            node_id,
            NodeSessionHandle {
                session_id,
                commands: commands_tx,
                pending_logs: pending_logs.clone(),
            },
        );
        if let Err(error) = call(&context.head, |reply| {
            HeadMsg::NodeRegistered(registration, session_id, reply)
        })
        .await
        {
            warn!(%error, "node registration refused");
            transport::send_error(&mut send, error).await;
            context
                .sessions
                .remove_if(&node_id, |_, session| session.session_id == session_id);
            return;
        }
        let writer = xp_runtime::task::spawn("node-session-writer", async move {
            while let Some(command) = commands_rx.recv().await {
                if let Err(error) = frame::write_message(&mut send, &Message::ToNode(command)).await
                {
                    error!(%node_id, %error, "node session write failed");
                    break;
                }
            }
        });
        // The reader goes on reading while the actor stores the last batch, so
        // that what the node sent meanwhile goes to the actor as one batch (one
        // commit). Its queue is bounded: a node that reports faster than the
        // head stores is slowed by QUIC flow control.
        let (batch_tx, mut batch_rx) = mpsc::channel::<NodeMessage>(context.commit_batch.max(1));
        let reader = read_node_messages(connection.clone(), recv, pending_logs, batch_tx, context.shutdown.clone());
        let forward = async {
            while let Some(first) = batch_rx.recv().await {
                let mut batch = vec![first];
                while batch.len() < context.commit_batch.max(1) {
                    match batch_rx.try_recv() {
                        Ok(message) => batch.push(message),
                        Err(_) => break,
                    }
                }
                // During a storage outage the actor accepts messages without applying
                // or acknowledging them; it refuses those of a session it ended or replaced.
                if let Err(error) = call(&context.head, |reply| HeadMsg::FromNode(node_id, session_id, batch, reply)).await {
                    warn!(%error, "node reports not processed; the node resends them after reconnecting");
                    break;
                }
            }
        };
        // Either ending ends the session: the reader at the stream's end, the
        // forwarder when the actor refuses. What the reader read before the
        // stream's end still goes to the actor first (a node leaving sends
        // `Draining` and then ends its stream at once).
        tokio::pin!(forward);
        tokio::select! {
            () = reader => (&mut forward).await,
            () = &mut forward => {}
        }
        writer.abort();
        info!("node session closed");
        let _ = context
            .head
            .cast(HeadMsg::NodeDisconnected(node_id, session_id));
    }
    .instrument(span)
    .await;
}
