//! `xp-head user ...` on the head machine: through the running head's socket
//! when it runs (its database is locked by it), else on the stopped head's
//! database directly. Both paths plan, store and apply with [`super::users`],
//! and both write the change to the audit trail.

use std::path::Path;

use xp_runtime::clock::{Clock, SystemClock};
use xp_runtime::join::{JoinFileError, JoinString};

use super::socket::{self, SocketError};
use crate::registry::{Registry, RegistryError};
use xp_head_core::Record;
use xp_head_core::auth::users::{self, UserAnswer, UserCommand, UserError, Users};

/// The file in the data directory holding the node join string (0600): what
/// credentials made while the head is stopped take their address from.
pub(crate) const NODE_JOIN_FILE: &str = "node.join";

/// The node credential of the head whose data directory is `data_dir`, as its
/// first start printed it (`xp-head node-credential`): read from the join
/// file, which only the head's user may read.
pub fn node_credential(data_dir: &Path) -> Result<JoinString, JoinFileError> {
    xp_runtime::join::read_join_file(&data_dir.join(NODE_JOIN_FILE))
}

/// Why a user command failed.
#[derive(Debug, thiserror::Error)]
pub enum LocalUserError {
    /// The running head refused it or could not be asked.
    #[error(transparent)]
    Socket(#[from] SocketError),
    /// The stopped head's database could not be used.
    #[error("cannot use the head's database {path}: {source}")]
    Registry {
        /// The database.
        path: String,
        /// The cause.
        #[source]
        source: RegistryError,
    },
    /// The command itself is wrong.
    #[error(transparent)]
    User(#[from] UserError),
    /// The head never started here, so there is no address for a credential.
    #[error(
        "{path} is missing or unreadable ({reason}): start the head once on this data directory so credentials can name its address"
    )]
    NoAddress {
        /// The join file.
        path: String,
        /// Why.
        reason: String,
    },
}

/// Runs `command` against the head whose data directory is `data_dir`.
pub async fn run(data_dir: &Path, command: &UserCommand) -> Result<UserAnswer, LocalUserError> {
    let socket_path = socket::socket_path(data_dir);
    if socket_path.exists() {
        match socket::request(&socket_path, command).await {
            Ok(answer) => return Ok(answer),
            // A socket nobody listens on: a head that was killed left it behind.
            Err(SocketError::Io { source, .. })
                if matches!(
                    source.kind(),
                    std::io::ErrorKind::ConnectionRefused | std::io::ErrorKind::NotFound
                ) => {}
            Err(error) => return Err(error.into()),
        }
    }
    let data_dir = data_dir.to_owned();
    let command = command.clone();
    tokio::task::spawn_blocking(move || run_offline(&data_dir, &command))
        .await
        .unwrap_or_else(|error| {
            Err(LocalUserError::Socket(SocketError::Malformed(format!(
                "the user command failed: {error}"
            ))))
        })
}

/// Runs `command` on a stopped head's database.
pub(crate) fn run_offline(
    data_dir: &Path,
    command: &UserCommand,
) -> Result<UserAnswer, LocalUserError> {
    let path = data_dir.join("head.redb");
    let registry_error = |source| LocalUserError::Registry {
        path: path.display().to_string(),
        source,
    };
    if !path.exists() {
        return Err(registry_error(RegistryError::Database(redb::Error::Io(
            std::io::Error::new(
                std::io::ErrorKind::NotFound,
                "no database: start the head once on this data directory",
            ),
        ))));
    }
    let mut registry = Registry::open(&path).map_err(registry_error)?;
    let mut table = Users::from_records(registry.users().map_err(registry_error)?);
    let now = SystemClock.now();
    let plan = table.plan(now, command, crate::actor::fresh_secret)?;
    if !plan.records.is_empty() {
        let mut records: Vec<Record> = plan.records.iter().cloned().map(Record::User).collect();
        records.push(Record::Audit(command.audit_entry(now)));
        registry.commit(records).map_err(registry_error)?;
        table.apply(plan.records);
    }
    let join_path = data_dir.join(NODE_JOIN_FILE);
    let join = match &plan.answer {
        users::PlannedAnswer::Added(..) => read_node_join(&join_path)?,
        // Answers without a credential need no address.
        _ => placeholder_join(),
    };
    Ok(users::answer(plan.answer, &join))
}

fn read_node_join(path: &Path) -> Result<JoinString, LocalUserError> {
    xp_runtime::join::read_join_file(path).map_err(|error| LocalUserError::NoAddress {
        path: path.display().to_string(),
        reason: error.to_string(),
    })
}

fn placeholder_join() -> JoinString {
    JoinString {
        host: String::new(),
        port: 0,
        token: String::new(),
        ca_sha256: [0; 32],
        more_heads: Vec::new(),
    }
}
