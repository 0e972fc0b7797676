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
//! Workers stay in their lane:
//!
//! - A `put` names a file the node copies. The path must lie, as written, under
//!   the worker's work directory (`XP_WORK_DIR`, or its canonical form); the
//!   rest is opened below the descriptor the node kept when it made that
//!   directory, through no symbolic link, `/proc` magic link, `..` or mount
//!   point (`isolation::beneath`), on a thread whose file-system identity is
//!   the worker's (`isolation::as_worker`), so the node opens nothing the
//!   worker could not open itself. What was opened must be a regular file with
//!   one name, the worker's own. Each refusal names its rule. Bytes the SDK's
//!   `put` sends are staged in the work directory, so they pass.
//! - A `get` is served only for an object the worker's trial may read: one whose
//!   owners on a node that holds it include its trial (what any rank of the
//!   trial put, what it fetched before, its trial's checkpoints, which are
//!   stored and replicated for the trial), or a driver session that shared it:
//!   one that submitted the worker's experiment (the head answers
//!   `Request::ExperimentDrivers`). The node checks its own store first; for an
//!   object it lacks (or keeps only for others) it asks the holders the head
//!   names for the object's owners (`ObjectOp::Owners`) before fetching
//!   anything. An object id alone is no capability: ids are visible outside the
//!   trial (`xp checkpoints`, logs).
//!
//! Not here: which workers exist (the agent adds and removes their secrets) and
//! moving objects between nodes (`remote`).
//!
//! Invariant: a request is served only for a live worker's secret, a worker's
//! objects are owned by its trial, a `put` stores only a regular file of the
//! worker's own, with one name, reached below its work directory without
//! following a link and opened with the worker's authority, and a `get` returns
//! only an object its trial owns or its experiment's driver stored.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError};

use dashmap::DashMap;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{UnixListener, UnixStream};
use tokio::sync::mpsc;
use tracing::{debug, warn};
use xp_runtime::ids::{NodeId, ObjectId, TrialId, WorkerKey};
use xp_runtime::object_wire::{self, FetchPath, LocalOp, LocalRequest, LocalResponse};
use xp_runtime::protocol::{ObjectSource, Request, Response};
use xp_runtime::transport::HeadConnection;

use super::remote::{ObjectFetcher, Wanted};
use super::{ObjectChange, ObjectStore, Owner, StoreError, off_runtime};
use crate::isolation::WorkTree;
use crate::isolation::as_worker::AsWorker;
use crate::isolation::beneath::{self, TreeError};
use crate::isolation::fs::{self as lane_fs, FileOwner};

/// A worker on this node, as its secret identifies it.
#[derive(Debug, Clone)]
pub(crate) struct LocalWorker {
    /// The worker.
    pub key: WorkerKey,
    /// Its work directory, where fetched objects are placed for it.
    pub work_dir: PathBuf,
    /// The same, as the node made it: what a `put` is resolved below.
    pub tree: WorkTree,
    /// Its user id, which the directory fetched objects go to belongs to.
    pub owner: Option<FileOwner>,
    /// The path the objects it gets from other nodes take (its trial's transport).
    pub fetch_path: FetchPath,
}

/// Who may use the channel: live workers by secret.
pub(crate) type Workers = Arc<DashMap<[u8; 32], LocalWorker>>;

/// What the channel needs of the node.
#[derive(Clone)]
pub(crate) struct LocalContext {
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
    /// The object server's rules, which keep each worker's capability.
    pub access: Arc<super::access::ObjectAccess>,
}

/// Why the local channel could not start.
#[derive(Debug, thiserror::Error)]
pub(crate) enum LocalChannelError {
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

/// Serves the channel at `path` (replacing a stale socket) until the task is
/// dropped. With `open_to_workers` (workers run under ids of their own) every
/// user may connect, else only the node's: either way a request counts only with
/// a live worker's secret.
pub(crate) fn start(
    path: &Path,
    open_to_workers: bool,
    context: LocalContext,
) -> Result<(), LocalChannelError> {
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
    // Connecting takes write permission on the socket. The secret tells workers apart.
    let mode = if open_to_workers { 0o666 } else { 0o600 };
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).map_err(|source| {
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
            let lane = worker.clone();
            let stored = off_runtime(&context.store, move |store| {
                let file = match open_in_lane(&lane, &path) {
                    Ok(file) => file,
                    Err(refusal) => return Ok(Err(refusal)),
                };
                let id = store.put_reader(file, owner)?;
                let size = store.info(id).map_or(0, |info| info.size);
                Ok(Ok((id, size)))
            })
            .await;
            match stored {
                Ok(Ok((id, size))) => {
                    let _ = context.changes.send(ObjectChange::Added(id));
                    debug!(worker = %worker.key, %id, size, "object put");
                    LocalResponse::Stored { id, size }
                }
                Ok(Err(refusal)) => {
                    warn!(worker = %worker.key, %refusal, "object put refused");
                    refuse(xp_runtime::error_chain::error_chain(&refusal))
                }
                Err(error) => refuse(format!("cannot store the object: {error}")),
            }
        }
        LocalOp::Get { id } => {
            if let Err(refusal) = check_readable(context, &worker, id).await {
                warn!(worker = %worker.key, %id, %refusal, "object get refused");
                return refuse(refusal);
            }
            match get(context, &worker, id, owner).await {
                Ok((path, size)) => LocalResponse::Got { path, size },
                Err(error) => refuse(error),
            }
        }
        LocalOp::Capability => super::access::hand_capability(&context.access, worker.key),
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

/// Why a worker's request left its lane.
#[derive(Debug, thiserror::Error)]
pub(crate) enum LaneError {
    /// The file named is not one the node reads for a worker (the cause names
    /// the rule).
    #[error("put refused")]
    Refused(#[from] TreeError),
    /// The node could not take on the worker's identity to open it.
    #[error("put refused: cannot open {} as the worker", path.display())]
    AsWorker {
        /// The path the worker named.
        path: PathBuf,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// The object is neither the trial's nor shared with its experiment.
    #[error(
        "get refused: object {id} belongs neither to trial {trial_id} nor to a driver of its experiment"
    )]
    NotShared {
        /// The object.
        id: ObjectId,
        /// The asking worker's trial.
        trial_id: TrialId,
    },
}

/// The checkpoint directory's name inside a work directory (`CheckpointSink::new`).
#[cfg(test)]
const CHECKPOINT_DIR_NAME: &str = "checkpoint";

/// Opens the file a worker asked to put: below its work directory, following
/// no link, with the worker's own authority, and only a regular file of the
/// worker's with one name (`isolation::beneath`).
fn open_in_lane(worker: &LocalWorker, path: &Path) -> Result<std::fs::File, LaneError> {
    let relative = worker.tree.relative(path)?;
    let as_worker = |source| LaneError::AsWorker {
        path: path.to_owned(),
        source,
    };
    let thread = AsWorker::start(worker.owner).map_err(as_worker)?;
    let (root, shown, owner) = (
        worker.tree.dir.clone(),
        worker.tree.path.clone(),
        worker.owner,
    );
    let opened = thread
        .run(move || beneath::open_file_beneath(&*root, &relative, &shown, owner))
        .map_err(as_worker)?;
    Ok(opened?)
}

/// Whether `owners` let a worker of `trial_id` read the object: its trial keeps
/// it, or a driver session in `drivers` (those of its experiment) does.
fn owners_allow(
    trial_id: TrialId,
    trials: &[TrialId],
    owner_drivers: &[String],
    drivers: &[String],
) -> bool {
    trials.contains(&trial_id)
        || owner_drivers
            .iter()
            .any(|session| drivers.contains(session))
}

/// Refuses a `get` of an object the worker's trial may not read (see the module
/// docs): the local store's owners first, then each holder's.
async fn check_readable(
    context: &LocalContext,
    worker: &LocalWorker,
    id: ObjectId,
) -> Result<(), String> {
    let trial_id = worker.key.trial;
    let refusal = || LaneError::NotShared { id, trial_id }.to_string();
    let mut owner_sets: Vec<(Vec<TrialId>, Vec<String>)> = Vec::new();
    if let Some(info) = context.store.info(id) {
        let (trials, owner_drivers) = Owner::split(info.owners);
        if trials.contains(&trial_id) {
            return Ok(());
        }
        owner_sets.push((trials, owner_drivers));
    }
    let Ok(head) = head_connection(context) else {
        if owner_sets.is_empty() {
            return Err(
                "the node is not connected to the head, which knows where objects are".to_owned(),
            );
        }
        return Err(refusal());
    };
    // Holders elsewhere may keep it for this trial (another rank put it there).
    let sources = locate(&head, id).await?;
    let elsewhere: Vec<&ObjectSource> = sources
        .iter()
        .filter(|source| source.node != context.own_node)
        .collect();
    if owner_sets.is_empty() && elsewhere.is_empty() {
        return Err(format!("no live node holds object {id}"));
    }
    for source in elsewhere {
        let Ok(owners) = context
            .fetcher
            .owners(id, std::slice::from_ref(source), Some(context.own_node))
            .await
        else {
            continue;
        };
        if owners.0.contains(&trial_id) {
            return Ok(());
        }
        owner_sets.push(owners);
    }
    let mut sessions: Vec<String> = owner_sets
        .iter()
        .flat_map(|(_, owner_drivers)| owner_drivers.iter().cloned())
        .collect();
    if sessions.is_empty() {
        return Err(refusal());
    }
    sessions.sort();
    sessions.dedup();
    let sharing = sharing_drivers(&head, trial_id, sessions).await?;
    let shared = owner_sets
        .iter()
        .any(|(trials, owner_drivers)| owners_allow(trial_id, trials, owner_drivers, &sharing));
    if shared { Ok(()) } else { Err(refusal()) }
}

fn head_connection(context: &LocalContext) -> Result<HeadConnection, String> {
    context
        .head
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .clone()
        .ok_or_else(|| {
            "the node is not connected to the head, which knows where objects are".to_owned()
        })
}

/// Where object `id` is, as the head knows (waiting a moment for a put on
/// another node to reach it: [`object_wire::locate_settled`]).
async fn locate(head: &HeadConnection, id: ObjectId) -> Result<Vec<ObjectSource>, String> {
    object_wire::locate_settled(|| async {
        match head.request(Request::Locate { object: id }).await {
            Ok(Response::Located(sources)) => Ok(sources),
            Ok(other) => Err(format!("unexpected answer from the head: {other:?}")),
            Err(error) => Err(format!("cannot ask the head where {id} is: {error}")),
        }
    })
    .await
}

/// Those of `sessions` that submitted `trial_id`'s experiment, as the head knows them.
async fn sharing_drivers(
    head: &HeadConnection,
    trial_id: TrialId,
    sessions: Vec<String>,
) -> Result<Vec<String>, String> {
    let experiment = trial_id.experiment;
    match head
        .request(Request::SharingDrivers {
            experiment,
            sessions,
        })
        .await
    {
        Ok(Response::Drivers(sessions)) => Ok(sessions),
        Ok(other) => Err(format!("unexpected answer from the head: {other:?}")),
        Err(error) => Err(format!(
            "cannot ask the head which drivers share objects with experiment {experiment}: {error}"
        )),
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
        let head = head_connection(context)?;
        let sources = locate(&head, id).await?;
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
                    path: worker.fetch_path,
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
    let work_dir = worker.tree.dir.clone();
    let dir_owner = worker.owner;
    blocking(&context.store, move |store| {
        // The worker now depends on it too.
        store.add_owner(id, owner)?;
        // A fetched object was verified on arrival; hashing it again is waste.
        let bytes = match fetched {
            Some(bytes) => bytes,
            None => store.get(id)?,
        };
        let size = bytes.len() as u64;
        place(&bytes, &work_dir, id, dir_owner).map_err(|source| StoreError::Io {
            operation: super::IoOperation::CreateFile,
            path: target.clone(),
            source,
        })?;
        Ok((target, size))
    })
    .await
}

/// Writes a read-only copy of the verified `bytes` as `objects/ID` in the
/// worker's work directory `work` (a copy, not a link: the worker's file must
/// not alias the stored one, nor keep its disk space after the store deletes
/// it). The node's own file, readable by all, made new (`O_EXCL`) in a
/// directory of the worker's (`dir_owner`); a link the worker left there is
/// neither followed nor written through.
fn place(
    bytes: &[u8],
    work: &std::os::fd::OwnedFd,
    id: ObjectId,
    dir_owner: Option<FileOwner>,
) -> std::io::Result<()> {
    let objects = lane_fs::make_dir_in(work, "objects".as_ref(), 0o755, dir_owner)?;
    let name = id.to_string();
    if lane_fs::exists_in(&objects, name.as_ref()) {
        return Ok(());
    }
    lane_fs::replace_file_in(&objects, name.as_ref(), bytes, 0o444, None)
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

    const SECRET: [u8; 32] = [7u8; 32];

    /// A channel with one worker (of trial `3f2a9c0d11b2e4f7-t3`) and no head.
    struct Channel {
        temp: tempfile::TempDir,
        store: Arc<ObjectStore>,
        socket: PathBuf,
        work_dir: PathBuf,
    }

    impl Channel {
        fn must_start() -> Self {
            let temp = tempfile::tempdir().expect("tempdir");
            let store = Arc::new(
                ObjectStore::open(temp.path().join("objects"), StoreLimits::default())
                    .expect("store"),
            );
            let workers = Workers::default();
            let work_dir = temp.path().join("work");
            std::fs::create_dir_all(work_dir.join(CHECKPOINT_DIR_NAME)).expect("work dir");
            workers.insert(
                SECRET,
                LocalWorker {
                    key: WorkerKey {
                        trial: "3f2a9c0d11b2e4f7-t3".parse().expect("trial"),
                        attempt: 1,
                        rank: 0,
                    },
                    work_dir: work_dir.clone(),
                    tree: WorkTree::open(&work_dir).expect("tree"),
                    owner: None,
                    fetch_path: FetchPath::Quic,
                },
            );
            let (changes, _changes_rx) = mpsc::unbounded_channel();
            let socket = temp.path().join("run").join("objects.sock");
            start(
                &socket,
                false,
                LocalContext {
                    store: store.clone(),
                    fetcher: Arc::new(
                        ObjectFetcher::new(object_wire::Credential::Node([0; 32]))
                            .expect("fetcher"),
                    ),
                    workers,
                    head: Arc::default(),
                    own_node: NodeId::random(),
                    changes,
                    access: Arc::new(crate::objects::access::ObjectAccess::new("t")),
                },
            )
            .expect("channel");
            Self {
                temp,
                store,
                socket,
                work_dir,
            }
        }

        /// Sends `frame` from a blocking thread, as a worker would.
        async fn ask(&self, frame: Vec<u8>) -> LocalResponse {
            let socket = self.socket.clone();
            tokio::task::spawn_blocking(move || ask(&socket, &frame))
                .await
                .expect("client")
        }

        async fn op(&self, op: LocalOp) -> LocalResponse {
            self.ask(request(SECRET, op)).await
        }

        async fn put(&self, path: &Path) -> LocalResponse {
            self.op(LocalOp::Put {
                path: path.to_owned(),
            })
            .await
        }
    }

    #[track_caller]
    fn check_refused(answer: &LocalResponse, expected: &str) {
        assert!(
            matches!(answer, LocalResponse::Error { message } if message.contains(expected)),
            "expected a refusal saying {expected:?}, got {answer:?}"
        );
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn workers_put_get_and_release_and_strangers_are_refused() {
        let channel = Channel::must_start();
        let file = channel.work_dir.join("payload");
        std::fs::write(&file, b"hello objects").expect("write");
        let stored = channel.put(&file).await;
        let LocalResponse::Stored { id, size } = stored else {
            panic!("{stored:?}")
        };
        assert_eq!(size, 13);
        let got = channel.op(LocalOp::Get { id }).await;
        let LocalResponse::Got { path, .. } = got else {
            panic!("{got:?}")
        };
        assert_eq!(std::fs::read(&path).expect("read"), b"hello objects");
        let stranger = channel.ask(request([9u8; 32], LocalOp::Get { id })).await;
        check_refused(&stranger, "unknown worker secret");
        let released = channel.op(LocalOp::Delete { id }).await;
        assert_eq!(released, LocalResponse::Released { existed: true });
        assert!(!channel.store.contains(id), "its only owner released it");
        let absent = channel.op(LocalOp::Get { id }).await;
        check_refused(&absent, "not connected to the head");
        let garbage = channel.ask(vec![0xff, 0xff, 0xff, 0x7f, 1, 2, 3]).await;
        check_refused(&garbage, "over the");
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_put_outside_the_work_directory_or_through_a_link_is_refused() {
        let channel = Channel::must_start();
        check_refused(
            &channel.put(Path::new("/etc/passwd")).await,
            "put refused: the rule \"only the worker's own directory\" refuses /etc/passwd",
        );
        let outside = channel.temp.path().join("secret");
        std::fs::write(&outside, b"the head's token").expect("write");
        let link = channel.work_dir.join("innocent");
        std::os::unix::fs::symlink(&outside, &link).expect("symlink");
        check_refused(&channel.put(&link).await, "the rule \"no symbolic links\"");
        let up = channel.work_dir.join("..").join("secret");
        check_refused(&channel.put(&up).await, "the rule \"no `..`\"");
        let linked_dir = channel.work_dir.join("etc");
        std::os::unix::fs::symlink("/etc", &linked_dir).expect("symlink");
        check_refused(
            &channel.put(&linked_dir.join("passwd")).await,
            "the rule \"no symbolic links\"",
        );
        // The checkpoint directory, swapped for a link to `/`.
        let checkpoint = channel.work_dir.join(CHECKPOINT_DIR_NAME);
        std::fs::remove_dir(&checkpoint).expect("rmdir");
        std::os::unix::fs::symlink("/", &checkpoint).expect("symlink");
        check_refused(
            &channel.put(&checkpoint.join("proc/self/environ")).await,
            "the rule \"no symbolic links\"",
        );
        let environ = channel.work_dir.join("environ");
        std::os::unix::fs::symlink("/proc/self/environ", &environ).expect("symlink");
        check_refused(
            &channel.put(&environ).await,
            "the rule \"no /proc magic links\"",
        );
        let hard = channel.work_dir.join("hard");
        std::fs::hard_link(&outside, &hard).expect("hard link");
        check_refused(&channel.put(&hard).await, "the rule \"no hard links\"");
        check_refused(&channel.put(&channel.work_dir).await, "it is a directory");
        check_refused(
            &channel.put(&channel.work_dir.join("missing")).await,
            "put refused: cannot open",
        );
        assert_eq!(channel.store.holdings().len(), 0, "nothing was stored");
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_put_inside_the_work_or_checkpoint_directory_is_stored() {
        let channel = Channel::must_start();
        let file = channel.work_dir.join("weights.bin");
        std::fs::write(&file, b"weights").expect("write");
        assert!(matches!(
            channel.put(&file).await,
            LocalResponse::Stored { size: 7, .. }
        ));
        let state = channel.work_dir.join(CHECKPOINT_DIR_NAME).join("state");
        std::fs::write(&state, b"state").expect("write");
        assert!(matches!(
            channel.put(&state).await,
            LocalResponse::Stored { size: 5, .. }
        ));
        // The canonical spelling of the work directory names it too.
        let canonical = channel.work_dir.canonicalize().expect("canonical");
        assert!(matches!(
            channel.put(&canonical.join("weights.bin")).await,
            LocalResponse::Stored { size: 7, .. }
        ));
        // A link, even one that stays inside, is not followed.
        let inner_link = channel.work_dir.join("latest");
        std::os::unix::fs::symlink(&state, &inner_link).expect("symlink");
        check_refused(
            &channel.put(&inner_link).await,
            "the rule \"no symbolic links\"",
        );
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_get_of_another_trials_object_is_refused() {
        let channel = Channel::must_start();
        let other: TrialId = "9e8d7c6b5a493827-t0".parse().expect("trial");
        let theirs = channel
            .store
            .put(&b"another team's checkpoint"[..], Owner::Trial(other))
            .expect("put");
        check_refused(
            &channel.op(LocalOp::Get { id: theirs }).await,
            &format!(
                "get refused: object {theirs} belongs neither to trial 3f2a9c0d11b2e4f7-t3 nor to a driver of its experiment"
            ),
        );
        let drivers = channel
            .store
            .put(
                &b"a driver's data"[..],
                Owner::Driver("driver-x".to_owned()),
            )
            .expect("put");
        check_refused(
            &channel.op(LocalOp::Get { id: drivers }).await,
            "get refused",
        );
        let own_trial: TrialId = "3f2a9c0d11b2e4f7-t3".parse().expect("trial");
        let ours = channel
            .store
            .put(&b"rank 1's shard"[..], Owner::Trial(own_trial))
            .expect("put");
        let got = channel.op(LocalOp::Get { id: ours }).await;
        let LocalResponse::Got { path, .. } = got else {
            panic!("{got:?}")
        };
        assert_eq!(std::fs::read(path).expect("read"), b"rank 1's shard");
        assert!(
            !channel
                .work_dir
                .join("objects")
                .join(theirs.to_string())
                .exists(),
            "nothing of the refused object reached the worker"
        );
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_get_never_writes_through_a_link_the_worker_left() {
        let channel = Channel::must_start();
        let elsewhere = channel.temp.path().join("elsewhere");
        std::fs::create_dir(&elsewhere).expect("mkdir");
        std::os::unix::fs::symlink(&elsewhere, channel.work_dir.join("objects")).expect("symlink");
        let own_trial: TrialId = "3f2a9c0d11b2e4f7-t3".parse().expect("trial");
        let ours = channel
            .store
            .put(&b"rank 1's shard"[..], Owner::Trial(own_trial))
            .expect("put");
        check_refused(&channel.op(LocalOp::Get { id: ours }).await, "cannot");
        assert!(
            std::fs::read_dir(&elsewhere).expect("dir").next().is_none(),
            "nothing was written where the link points"
        );
    }

    #[test]
    fn owners_allow_the_trial_and_its_experiments_drivers() {
        let trial: TrialId = "3f2a9c0d11b2e4f7-t3".parse().expect("trial");
        let other: TrialId = "3f2a9c0d11b2e4f7-t4".parse().expect("trial");
        let driver = |name: &str| vec![name.to_owned()];
        assert!(owners_allow(trial, &[other, trial], &[], &[]));
        assert!(!owners_allow(trial, &[other], &[], &[]));
        assert!(owners_allow(trial, &[], &driver("d1"), &driver("d1")));
        assert!(!owners_allow(trial, &[], &driver("d1"), &driver("d2")));
        assert!(!owners_allow(trial, &[], &[], &driver("d1")));
    }
}
