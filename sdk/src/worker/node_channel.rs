//! The worker's two channels to its node, besides stdout: the local object
//! channel (`XP_NODE_SOCKET`, one request per connection, authenticated by the
//! worker's secret) and the checkpoint verdict file the node leaves once a
//! checkpoint is stored or refused.
//!
//! Not here: what the node does with a request (`node::objects::local`), and the
//! stdout line that asks for a checkpoint (`xp_runtime::metric_line`).

use std::io::{Read, Write};
use std::time::Duration;

use xp_runtime::object_wire::{self, LocalOp, LocalRequest, LocalResponse};

use super::{WorkerError, checkpoint_file, env, env_secret};

/// How long [`wait_for_verdict`] waits for the node's verdict.
const CHECKPOINT_WAIT: Duration = Duration::from_secs(600);

/// One request on the node's local object channel (`XP_NODE_SOCKET`).
pub(super) fn local_request(op: LocalOp) -> Result<LocalResponse, WorkerError> {
    let socket = env("XP_NODE_SOCKET")?;
    let secret = env_secret("XP_WORKER_SECRET")?;
    let failed = |doing: &'static str| {
        let socket = socket.clone();
        move |source| WorkerError::NodeChannel {
            doing,
            socket,
            source,
        }
    };
    let mut stream = std::os::unix::net::UnixStream::connect(&socket).map_err(failed("reach"))?;
    let framed = object_wire::encode_local(&LocalRequest { secret, op })
        .map_err(WorkerError::ObjectMessage)?;
    stream.write_all(&framed).map_err(failed("write to"))?;
    let mut prefix = [0u8; 4];
    stream
        .read_exact(&mut prefix)
        .map_err(failed("hear from"))?;
    let len = object_wire::local_length(prefix).map_err(WorkerError::ObjectMessage)?;
    let mut body = vec![0u8; len];
    stream
        .read_exact(&mut body)
        .map_err(failed("read the whole answer of"))?;
    object_wire::decode_local(&body).map_err(WorkerError::ObjectMessage)
}

/// The error for an answer other than the one the request expects: the node's
/// refusal, or something it should not have sent.
pub(super) fn unexpected(response: LocalResponse) -> WorkerError {
    match response {
        LocalResponse::Error { message } => WorkerError::ObjectRefused { reason: message },
        other => WorkerError::ObjectUnexpected {
            answer: format!("{other:?}"),
        },
    }
}

/// Waits for the node's verdict on the checkpoint of `step` (a file it leaves
/// once the checkpoint is stored or refused), and returns it.
#[expect(
    clippy::disallowed_methods,
    reason = "the worker API is synchronous: trial code blocks until its checkpoint is safe"
)]
pub(super) fn wait_for_verdict(
    verdict_path: &std::path::Path,
    step: u64,
) -> Result<(), WorkerError> {
    let deadline = std::time::Instant::now() + CHECKPOINT_WAIT;
    let mut pause = Duration::from_millis(1);
    loop {
        match std::fs::read_to_string(verdict_path) {
            Ok(verdict) => {
                let _ = std::fs::remove_file(verdict_path);
                return match verdict.strip_prefix("error: ") {
                    Some(reason) => Err(WorkerError::CheckpointRefused {
                        step,
                        reason: reason.to_owned(),
                    }),
                    None => Ok(()),
                };
            }
            Err(error) if error.kind() == std::io::ErrorKind::NotFound => {}
            Err(error) => {
                return Err(checkpoint_file("read the node's verdict in", verdict_path)(
                    error,
                ));
            }
        }
        if std::time::Instant::now() > deadline {
            return Err(WorkerError::CheckpointTimeout {
                step,
                waited: CHECKPOINT_WAIT,
            });
        }
        std::thread::sleep(pause);
        pause = (pause * 2).min(Duration::from_millis(50));
    }
}
