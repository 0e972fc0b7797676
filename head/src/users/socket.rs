//! The head machine's own door to the user table: a Unix socket in the data
//! directory (`DATA_DIR/admin.sock`, mode 0600 inside the 0700 directory), so
//! only the operating-system user that runs the head can use it. That is what
//! "run on the head machine" means for `xp-head user ...`: whoever can read the
//! head's data directory could take its database and trust material anyway.
//!
//! One connection carries one command: a JSON line (at most
//! [`MAX_COMMAND_BYTES`]) holding a [`UserCommand`], answered by a JSON line
//! holding `{"ok": UserAnswer}` or `{"error": "..."}`. The running head answers
//! through its actor; a stopped head's database is changed by `xp-head user`
//! itself with the same [`super::users`] code.

use std::path::{Path, PathBuf};
use std::time::Duration;

use ractor::ActorRef;
use serde::{Deserialize, Serialize};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::net::{UnixListener, UnixStream};
use tokio_util::sync::CancellationToken;
use tracing::{debug, warn};

use crate::actor::HeadMsg;
use xp_head_core::auth::users::{UserAnswer, UserCommand};

/// The socket's file name in the data directory.
pub(crate) const SOCKET_NAME: &str = "admin.sock";

/// The longest command or answer line.
pub(crate) const MAX_COMMAND_BYTES: u64 = 64 << 10;

/// How long one exchange may take.
const EXCHANGE_TIMEOUT: Duration = Duration::from_secs(30);

/// The socket of the head whose data directory is `data_dir`.
pub(crate) fn socket_path(data_dir: &Path) -> PathBuf {
    data_dir.join(SOCKET_NAME)
}

/// What travels back.
#[derive(Debug, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
enum Reply {
    Ok(UserAnswer),
    Error(String),
}

/// Why talking to the head's socket failed.
#[derive(Debug, thiserror::Error)]
pub enum SocketError {
    /// The socket could not be bound, reached, read or written.
    #[error("{context}: {source}")]
    Io {
        /// What was being done.
        context: String,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// The other side sent something that is not a command or an answer.
    #[error("malformed message on the head's user socket: {0}")]
    Malformed(String),
    /// The head refused the command.
    #[error("{0}")]
    Refused(String),
    /// No answer in time.
    #[error("the head did not answer within {0:?}")]
    Timeout(Duration),
}

fn io(context: impl Into<String>) -> impl FnOnce(std::io::Error) -> SocketError {
    let context = context.into();
    move |source| SocketError::Io { context, source }
}

/// Binds the socket at `path` (replacing a stale one a killed head left: the
/// caller holds the database, so no other head uses this directory), private
/// to this user.
pub(crate) fn bind(path: &Path) -> Result<UnixListener, SocketError> {
    match std::fs::remove_file(path) {
        Ok(()) => debug!(path = %path.display(), "stale user socket removed"),
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => {}
        Err(error) => return Err(io(format!("cannot remove {}", path.display()))(error)),
    }
    let listener =
        UnixListener::bind(path).map_err(io(format!("cannot bind {}", path.display())))?;
    // The directory is 0700 already, so nobody else could reach it meanwhile.
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))
        .map_err(io(format!("cannot make {} private", path.display())))?;
    Ok(listener)
}

/// Answers commands until `shutdown`, one connection at a time (they are rare
/// and quick), then removes the socket file.
pub(crate) async fn serve(
    listener: UnixListener,
    path: PathBuf,
    head: ActorRef<HeadMsg>,
    shutdown: CancellationToken,
) {
    loop {
        let stream = tokio::select! {
            () = shutdown.cancelled() => break,
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => stream,
                Err(error) => {
                    warn!(%error, "user socket accept failed");
                    continue;
                }
            },
        };
        let exchange = tokio::time::timeout(EXCHANGE_TIMEOUT, answer_one(stream, &head)).await;
        match exchange {
            Ok(Ok(())) => {}
            Ok(Err(error)) => warn!(%error, "user socket exchange failed"),
            Err(_) => warn!("user socket exchange timed out"),
        }
    }
    let _ = std::fs::remove_file(&path);
}

async fn answer_one(stream: UnixStream, head: &ActorRef<HeadMsg>) -> Result<(), SocketError> {
    let (read, mut write) = stream.into_split();
    let line = read_line(read).await?;
    let reply = match serde_json::from_str::<UserCommand>(&line) {
        Ok(command) => {
            match crate::actor::call(head, |reply| HeadMsg::Users(command, reply)).await {
                Ok(answer) => Reply::Ok(answer),
                Err(error) => Reply::Error(error.message),
            }
        }
        Err(error) => Reply::Error(format!("not a user command: {error}")),
    };
    write_line(&mut write, &reply).await
}

/// Sends `command` to the head listening at `path` and returns its answer.
pub(crate) async fn request(path: &Path, command: &UserCommand) -> Result<UserAnswer, SocketError> {
    let exchange = async {
        let stream = UnixStream::connect(path)
            .await
            .map_err(io(format!("cannot connect to {}", path.display())))?;
        let (read, mut write) = stream.into_split();
        write_line(&mut write, command).await?;
        let line = read_line(read).await?;
        match serde_json::from_str::<Reply>(&line) {
            Ok(Reply::Ok(answer)) => Ok(answer),
            Ok(Reply::Error(message)) => Err(SocketError::Refused(message)),
            Err(error) => Err(SocketError::Malformed(error.to_string())),
        }
    };
    tokio::time::timeout(EXCHANGE_TIMEOUT, exchange)
        .await
        .unwrap_or(Err(SocketError::Timeout(EXCHANGE_TIMEOUT)))
}

/// One line, bounded: a longer one is refused, not buffered.
async fn read_line(read: tokio::net::unix::OwnedReadHalf) -> Result<String, SocketError> {
    use tokio::io::AsyncReadExt;
    let mut line = String::new();
    let mut limited = BufReader::new(read.take(MAX_COMMAND_BYTES + 1));
    limited
        .read_line(&mut line)
        .await
        .map_err(io("cannot read from the user socket"))?;
    if line.len() as u64 > MAX_COMMAND_BYTES {
        return Err(SocketError::Malformed(format!(
            "a line longer than {MAX_COMMAND_BYTES} bytes"
        )));
    }
    Ok(line)
}

async fn write_line(
    write: &mut tokio::net::unix::OwnedWriteHalf,
    value: &impl Serialize,
) -> Result<(), SocketError> {
    let mut text =
        serde_json::to_string(value).map_err(|error| SocketError::Malformed(error.to_string()))?;
    text.push('\n');
    write
        .write_all(text.as_bytes())
        .await
        .map_err(io("cannot write to the user socket"))?;
    write
        .shutdown()
        .await
        .map_err(io("cannot finish the user socket"))
}
