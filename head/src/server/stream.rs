//! One request stream: decode the request, hand it to the actor (which
//! authorizes and serves it, `actor::Asked`), do the work it sends back for
//! the connection (blob bytes, a log read relayed to a node, a wait for
//! events), and encode the answer.
//!
//! Nothing here decides who may do what or reads the core: every rule is in
//! the request's file in `xp_head_core::requests`.

use std::sync::Arc;
use std::time::Duration;

use quinn::{RecvStream, SendStream};
use tokio::io::AsyncReadExt;
use tracing::{debug, info, warn};
use xp_head_core::auth::access::Caller;
use xp_head_core::requests::{self, ConnectionWork};
use xp_runtime::frame::{self, FrameError};
use xp_runtime::ids::ExperimentId;
use xp_runtime::protocol::{ErrorCode, Message, RemoteError, Request, Response};
use xp_runtime::transport::{self, BLOB_CHUNK_BYTES};

use super::{DriverSession, ServerContext, session_name};
use crate::actor::{Answer, Asked, HeadMsg, call};
use crate::blobs::{BlobStore, ConnectionBlobs, Upload};

/// The longest an `Events` request may wait.
const MAX_EVENTS_WAIT: Duration = Duration::from_secs(30);
/// The longest a heavy read waits for a turn.
const MAX_TURN_WAIT: Duration = Duration::from_secs(30);

/// Serves the one request of a stream.
pub(super) async fn handle_stream(
    mut send: SendStream,
    mut recv: RecvStream,
    context: Arc<ServerContext>,
    session: DriverSession,
    caller: Arc<Caller>,
    uploads: Arc<ConnectionBlobs>,
) {
    let Some(request) = read_request(&mut send, &mut recv).await else {
        return;
    };
    let kind = requests::access(&request).action.describe();
    let session = requests::names_session(&request).then(|| session_name(&session));
    let turn = match take_turn(&context, &caller, &request).await {
        Ok(turn) => turn,
        Err(busy) => {
            context
                .metrics
                .request(crate::metrics::Api::Quic, kind, Some("Unavailable"));
            send_answer(&mut send, Err(busy)).await;
            return;
        }
    };
    let asked = ask(&context, &caller, session, request).await;
    drop(turn);
    let result = match asked {
        Ok(Answer::Response(response)) => Some(Ok(response)),
        Ok(Answer::Connection(work)) => {
            let streams = (&mut send, &mut recv);
            connection_work(streams, &context, &caller, &uploads, work).await
        }
        Err(error) => Some(Err(error)),
    };
    let error_code = match &result {
        Some(Err(error)) => Some(format!("{:?}", error.code)),
        _ => None,
    };
    context
        .metrics
        .request(crate::metrics::Api::Quic, kind, error_code.as_deref());
    if let Some(result) = result {
        send_answer(&mut send, result).await;
    }
}

/// A turn for a heavy read (`requests::heavy`): one of the caller's, then
/// one of everyone's (`crate::turns`), within [`MAX_TURN_WAIT`]; no turn for
/// anything else. Past the wait the request is refused as busy.
async fn take_turn(
    context: &ServerContext,
    caller: &Caller,
    request: &Request,
) -> Result<Option<crate::turns::Turn>, RemoteError> {
    if !requests::heavy(request) {
        return Ok(None);
    }
    tokio::time::timeout(MAX_TURN_WAIT, context.turns.take(caller_name(caller)))
        .await
        .map(Some)
        .map_err(|_| {
            RemoteError::new(
                ErrorCode::Unavailable,
                format!(
                    "the head is busy with your other requests (at most {} of a user's reads that grow with what it keeps run at once); try again",
                    crate::turns::MAX_TURNS_PER_USER
                ),
            )
        })
}

/// Who asks, by name (`node` for the node credential).
fn caller_name(caller: &Caller) -> &str {
    match caller {
        Caller::User { name, .. } => name,
        Caller::Node => "node",
    }
}

/// The stream's request; `None` (answered) when the stream holds none.
async fn read_request(send: &mut SendStream, recv: &mut RecvStream) -> Option<Request> {
    match frame::read_message(recv).await {
        Ok(Some(Message::Request(request))) => Some(request),
        Ok(Some(other)) => {
            warn!(?other, "stream refused: not a request");
            transport::send_error(
                send,
                RemoteError::new(ErrorCode::BadRequest, "expected a request"),
            )
            .await;
            None
        }
        Ok(None) => None,
        Err(error) => {
            warn!(%error, "stream refused: bad frame");
            transport::send_error(send, error.to_remote()).await;
            let _ = recv.stop(0u32.into());
            None
        }
    }
}

/// Hands `request` to the actor as `caller`.
async fn ask(
    context: &ServerContext,
    caller: &Caller,
    session: Option<String>,
    request: Request,
) -> Result<Answer, RemoteError> {
    let access = requests::access(&request);
    call(&context.head, |reply| {
        HeadMsg::Request(Asked {
            caller: caller.clone(),
            access,
            session,
            request,
            reply,
        })
    })
    .await
}

/// Writes the answer; one too large for a frame is refused in words.
async fn send_answer(send: &mut SendStream, result: Result<Response, RemoteError>) {
    let message = match result {
        Ok(response) => Message::Response(response),
        Err(error) => Message::Error(error),
    };
    match transport::send_final(send, &message).await {
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
            transport::send_error(send, error).await;
        }
        Err(error) => debug!(%error, "response not delivered"),
    }
}

/// Does what the actor left to the connection; `None` when the answer was
/// already sent (a blob's bytes follow its response frame).
async fn connection_work(
    (send, recv): (&mut SendStream, &mut RecvStream),
    context: &ServerContext,
    caller: &Caller,
    uploads: &ConnectionBlobs,
    work: ConnectionWork,
) -> Option<Result<Response, RemoteError>> {
    Some(match work {
        ConnectionWork::ReceiveBlob { hash, len, limits } => {
            let upload = Upload {
                hash,
                len,
                user: caller_name(caller),
                limits,
                connection: uploads,
            };
            receive_blob(context, recv, upload).await
        }
        ConnectionWork::SendBlob { hash } => {
            return send_blob(send, &context.blobs, hash).await.err().map(Err);
        }
        ConnectionWork::RelayLogs {
            node, key, request, ..
        } => crate::sessions::relay_logs(&context.sessions, node, key, &request)
            .await
            .map(Response::Logs),
        ConnectionWork::AwaitEvents {
            experiment,
            after,
            wait_ms,
            newest,
        } => await_events(context, caller, experiment, after, wait_ms, newest).await,
    })
}

/// Receives an upload into the blob directory.
async fn receive_blob(
    context: &ServerContext,
    recv: &mut RecvStream,
    upload: Upload<'_>,
) -> Result<Response, RemoteError> {
    let (hash, len, user) = (upload.hash, upload.len, upload.user);
    match context.blobs.receive(upload, recv).await {
        Ok(()) => {
            let kept = context.blobs.usage(user);
            info!(blob = %hash, len, %user, kept = kept.count, kept_bytes = kept.bytes, "blob stored");
            Ok(Response::BlobStored)
        }
        Err(error) => {
            warn!(blob = %hash, %error, "blob upload refused");
            Err(blob_refusal(&error))
        }
    }
}

/// Waits (bounded) for an event newer than `newest`, then asks again; the
/// answer is the events after `after`, or none once the wait is over.
async fn await_events(
    context: &ServerContext,
    caller: &Caller,
    experiment: ExperimentId,
    after: u64,
    wait_ms: u32,
    mut newest: u64,
) -> Result<Response, RemoteError> {
    let wait = Duration::from_millis(u64::from(wait_ms)).min(MAX_EVENTS_WAIT);
    let deadline = tokio::time::Instant::now() + wait;
    let mut changes = context.event_seq.clone();
    loop {
        let newer = tokio::time::timeout_at(deadline, changes.wait_for(|seq| *seq > newest))
            .await
            .is_ok_and(|changed| changed.is_ok());
        if !newer {
            return Ok(Response::Events(Vec::new()));
        }
        let left = deadline.saturating_duration_since(tokio::time::Instant::now());
        let again = Request::Events {
            experiment,
            after,
            wait_ms: u32::try_from(left.as_millis()).unwrap_or(u32::MAX).max(1),
        };
        match ask(context, caller, None, again).await? {
            Answer::Response(response) => return Ok(response),
            Answer::Connection(ConnectionWork::AwaitEvents { newest: now, .. }) => newest = now,
            Answer::Connection(other) => {
                return Err(RemoteError::new(
                    ErrorCode::Internal,
                    format!("an events request asked for other work: {other:?}"),
                ));
            }
        }
    }
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
