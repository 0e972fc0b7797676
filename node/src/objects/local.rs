//! The node's local object channel: a Unix socket (`XP_NODE_SOCKET`) on which
//! its workers put, get and release objects.
//!
//! A worker proves which worker it is with its `XP_WORKER_SECRET`; what it
//! stores belongs to its trial, and is collected when the head says the trial
//! ended. A `get` of an object this node lacks asks the head which nodes hold it
//! and fetches it, verified, from one of them. The object is then linked (or, for
//! a memory object, written) into the worker's work directory, read-only, so the
//! worker reads a plain file and can never change the stored copy in place.
//!
//! Not here: which workers exist (the agent adds and removes their secrets) and
//! moving objects between nodes (`remote`).
//!
//! Invariant: a request is served only for a live worker's secret, and a
//! worker's objects are owned by its trial.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError};

use dashmap::DashMap;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{UnixListener, UnixStream};
use tokio::sync::mpsc;
use tracing::{debug, warn};
use xp_runtime::ids::{NodeId, ObjectId, WorkerKey};
use xp_runtime::object_wire::{self, LocalOp, LocalRequest, LocalResponse};
use xp_runtime::protocol::{Request, Response};
use xp_runtime::transport::HeadConnection;

use super::remote::{ObjectFetcher, Wanted};
use super::{ObjectChange, ObjectStore, Owner, StoreError, off_runtime};

/// A worker on this node, as its secret identifies it.
#[derive(Debug, Clone)]
pub struct LocalWorker {
    /// The worker.
    pub key: WorkerKey,
    /// Its work directory, where fetched objects are placed for it.
    pub work_dir: PathBuf,
}

/// Who may use the channel: live workers by secret.
pub type Workers = Arc<DashMap<[u8; 32], LocalWorker>>;

/// What the channel needs of the node.
#[derive(Clone)]
pub struct LocalContext {
    /// The store.
    pub store: Arc<ObjectStore>,
    /// Fetches from other nodes.
    pub fetcher: Arc<ObjectFetcher>,
    /// The live workers.
    pub workers: Workers,
    /// The head connection of the current session, for locating objects.
    pub head: Arc<Mutex<Option<HeadConnection>>>,
    /// This node.
    pub own_node: NodeId,
    /// Where to report objects this node gained or lost.
    pub changes: mpsc::UnboundedSender<ObjectChange>,
}

/// Why the local channel could not start.
#[derive(Debug, thiserror::Error)]
pub enum LocalChannelError {
    /// The socket's directory could not be created.
    #[error("cannot create {path}")]
    CreateDir {
        /// The directory.
        path: PathBuf,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// The socket could not be bound.
    #[error("cannot listen on {path}")]
    Listen {
        /// The socket.
        path: PathBuf,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// The socket could not be made private to this user.
    #[error("cannot restrict {path}")]
    Restrict {
        /// The socket.
        path: PathBuf,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
}

/// Serves the channel at `path` (replacing a stale socket) until the task is dropped.
pub fn start(path: &Path, context: LocalContext) -> Result<(), LocalChannelError> {
    use std::os::unix::fs::PermissionsExt;
    if let Some(parent) = path.parent() {
        std::fs::create_dir_all(parent).map_err(|source| LocalChannelError::CreateDir {
            path: parent.to_owned(),
            source,
        })?;
    }
    let _ = std::fs::remove_file(path);
    let listener = UnixListener::bind(path).map_err(|source| LocalChannelError::Listen {
        path: path.to_owned(),
        source,
    })?;
    // Only this user's processes; the secret tells workers apart.
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600)).map_err(|source| {
        LocalChannelError::Restrict {
            path: path.to_owned(),
            source,
        }
    })?;
    xp_runtime::task::spawn("object-channel", async move {
        loop {
            match listener.accept().await {
                Ok((stream, _)) => {
                    let context = context.clone();
                    xp_runtime::task::spawn("object-channel-client", async move {
                        serve(stream, context).await;
                    });
                }
                Err(error) => {
                    warn!(%error, "object channel accept failed");
                    return;
                }
            }
        }
    });
    Ok(())
}

async fn serve(mut stream: UnixStream, context: LocalContext) {
    loop {
        let mut prefix = [0u8; 4];
        if stream.read_exact(&mut prefix).await.is_err() {
            return;
        }
        let response = match object_wire::local_length(prefix) {
            Ok(len) => {
                let mut body = vec![0u8; len];
                if stream.read_exact(&mut body).await.is_err() {
                    return;
                }
                match object_wire::decode_local::<LocalRequest>(&body) {
                    Ok(request) => handle(&context, request).await,
                    Err(error) => LocalResponse::Error {
                        message: error.to_string(),
                    },
                }
            }
            Err(error) => {
                let answer = LocalResponse::Error {
                    message: error.to_string(),
                };
                let _ = write(&mut stream, &answer).await;
                // The stream's framing is lost.
                return;
            }
        };
        if write(&mut stream, &response).await.is_err() {
            return;
        }
    }
}

async fn write(stream: &mut UnixStream, response: &LocalResponse) -> std::io::Result<()> {
    let framed = object_wire::encode_local(response).map_err(std::io::Error::other)?;
    stream.write_all(&framed).await
}

fn refuse(message: impl Into<String>) -> LocalResponse {
    LocalResponse::Error {
        message: message.into(),
    }
}

async fn blocking<T: Send + 'static>(
    store: &Arc<ObjectStore>,
    work: impl FnOnce(&ObjectStore) -> Result<T, StoreError> + Send + 'static,
) -> Result<T, String> {
    off_runtime(store, work)
        .await
        .map_err(|error| error.to_string())
}

async fn handle(context: &LocalContext, request: LocalRequest) -> LocalResponse {
    let Some(worker) = context
        .workers
        .get(&request.secret)
        .map(|entry| entry.value().clone())
    else {
        warn!("object request with an unknown worker secret refused");
        return refuse(
            "unknown worker secret: only a running worker of this node may use its objects",
        );
    };
    let owner = Owner::Trial(worker.key.trial);
    match request.op {
        LocalOp::Put { path } => {
            let stored = blocking(&context.store, move |store| {
                let id = store.put_file(&path, owner)?;
                let size = store.info(id).map_or(0, |info| info.size);
                Ok((id, size))
            })
            .await;
            match stored {
                Ok((id, size)) => {
                    let _ = context.changes.send(ObjectChange::Added(id));
                    debug!(worker = %worker.key, %id, size, "object put");
                    LocalResponse::Stored { id, size }
                }
                Err(error) => refuse(format!("cannot store the object: {error}")),
            }
        }
        LocalOp::Get { id } => match get(context, &worker, id, owner).await {
            Ok((path, size)) => LocalResponse::Got { path, size },
            Err(error) => refuse(error),
        },
        LocalOp::Delete { id } => {
            let released = blocking(&context.store, move |store| {
                let existed = store.remove_owner(id, &owner)?;
                Ok((existed, store.contains(id)))
            })
            .await;
            match released {
                Ok((existed, still_here)) => {
                    if !still_here {
                        let _ = context.changes.send(ObjectChange::Dropped(id));
                    }
                    LocalResponse::Released { existed }
                }
                Err(error) => refuse(error),
            }
        }
    }
}

async fn get(
    context: &LocalContext,
    worker: &LocalWorker,
    id: ObjectId,
    owner: Owner,
) -> Result<(PathBuf, u64), String> {
    let fetched = if context.store.contains(id) {
        None
    } else {
        let head = context
            .head
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
            .ok_or("the node is not connected to the head, which knows where objects are")?;
        let sources = match head.request(Request::Locate { object: id }).await {
            Ok(Response::Located(sources)) => sources,
            Ok(other) => return Err(format!("unexpected answer from the head: {other:?}")),
            Err(error) => return Err(format!("cannot ask the head where {id} is: {error}")),
        };
        if sources.is_empty() {
            return Err(format!("no live node holds object {id}"));
        }
        let bytes = context
            .fetcher
            .ensure(
                &context.store,
                Wanted {
                    id,
                    owner: owner.clone(),
                    pin: false,
                    size: None,
                },
                &sources,
                Some(context.own_node),
            )
            .await
            .map_err(|error| error.to_string())?;
        let _ = context.changes.send(ObjectChange::Added(id));
        Some(bytes)
    };
    let target = worker.work_dir.join("objects").join(id.to_string());
    blocking(&context.store, move |store| {
        // The worker now depends on it too.
        store.add_owner(id, owner)?;
        // A fetched object was verified on arrival; hashing it again is waste.
        let bytes = match fetched {
            Some(bytes) => bytes,
            None => store.get(id)?,
        };
        let size = bytes.len() as u64;
        place(&bytes, &target).map_err(|source| StoreError::Io {
            operation: super::IoOperation::CreateFile,
            path: target.clone(),
            source,
        })?;
        Ok((target, size))
    })
    .await
}

/// Writes a read-only copy of the verified `bytes` at `target` (a copy, not a
/// link: the worker's file must not alias the stored one, nor keep its disk space
/// after the store deletes it).
fn place(bytes: &[u8], target: &Path) -> std::io::Result<()> {
    use std::os::unix::fs::PermissionsExt;
    if target.exists() {
        return Ok(());
    }
    if let Some(parent) = target.parent() {
        std::fs::create_dir_all(parent)?;
    }
    let temporary = target.with_extension(format!("{}.part", uuid::Uuid::now_v7().simple()));
    std::fs::write(&temporary, bytes)?;
    std::fs::set_permissions(&temporary, std::fs::Permissions::from_mode(0o444))?;
    std::fs::rename(&temporary, target)
}

#[cfg(test)]
mod tests {
    use std::io::{Read, Write};

    use super::*;
    use crate::objects::StoreLimits;

    fn ask(socket: &Path, frame: &[u8]) -> LocalResponse {
        let mut stream = std::os::unix::net::UnixStream::connect(socket).expect("connect");
        stream.write_all(frame).expect("write");
        let mut prefix = [0u8; 4];
        stream.read_exact(&mut prefix).expect("answer");
        let mut body = vec![0u8; object_wire::local_length(prefix).expect("length")];
        stream.read_exact(&mut body).expect("body");
        object_wire::decode_local(&body).expect("decode")
    }

    fn request(secret: [u8; 32], op: LocalOp) -> Vec<u8> {
        object_wire::encode_local(&LocalRequest { secret, op }).expect("encode")
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn workers_put_get_and_release_and_strangers_are_refused() {
        let temp = tempfile::tempdir().expect("tempdir");
        let store = Arc::new(
            ObjectStore::open(temp.path().join("objects"), StoreLimits::default()).expect("store"),
        );
        let workers = Workers::default();
        let secret = [7u8; 32];
        let work_dir = temp.path().join("work");
        workers.insert(
            secret,
            LocalWorker {
                key: WorkerKey {
                    trial: "3f2a9c0d11b2e4f7-t3".parse().expect("trial"),
                    attempt: 1,
                    rank: 0,
                },
                work_dir: work_dir.clone(),
            },
        );
        let (changes, _changes_rx) = mpsc::unbounded_channel();
        let socket = temp.path().join("run").join("objects.sock");
        start(
            &socket,
            LocalContext {
                store: store.clone(),
                fetcher: Arc::new(
                    ObjectFetcher::new(object_wire::token_digest("t")).expect("fetcher"),
                ),
                workers,
                head: Arc::default(),
                own_node: NodeId::random(),
                changes,
            },
        )
        .expect("channel");
        let file = temp.path().join("payload");
        std::fs::write(&file, b"hello objects").expect("write");
        let socket_for_blocking = socket.clone();
        let answers = tokio::task::spawn_blocking(move || {
            let socket = socket_for_blocking;
            let stored = ask(&socket, &request(secret, LocalOp::Put { path: file }));
            let LocalResponse::Stored { id, size } = stored else {
                panic!("{stored:?}")
            };
            assert_eq!(size, 13);
            let got = ask(&socket, &request(secret, LocalOp::Get { id }));
            let LocalResponse::Got { path, .. } = got else {
                panic!("{got:?}")
            };
            assert_eq!(std::fs::read(&path).expect("read"), b"hello objects");
            let stranger = ask(&socket, &request([9u8; 32], LocalOp::Get { id }));
            let released = ask(&socket, &request(secret, LocalOp::Delete { id }));
            let absent = ask(&socket, &request(secret, LocalOp::Get { id }));
            let garbage = ask(&socket, &[0xff, 0xff, 0xff, 0x7f, 1, 2, 3]);
            (id, stranger, released, absent, garbage)
        })
        .await
        .expect("client");
        let (id, stranger, released, absent, garbage) = answers;
        assert!(
            matches!(&stranger, LocalResponse::Error { message } if message.contains("unknown worker secret")),
            "{stranger:?}"
        );
        assert_eq!(released, LocalResponse::Released { existed: true });
        assert!(!store.contains(id), "its only owner released it");
        assert!(
            matches!(&absent, LocalResponse::Error { message } if message.contains("not connected to the head")),
            "{absent:?}"
        );
        assert!(
            matches!(&garbage, LocalResponse::Error { message } if message.contains("over the")),
            "{garbage:?}"
        );
    }
}
