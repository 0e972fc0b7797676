//! Preparing one launch before its worker starts: its user id and work
//! directory, the checkpoint it resumes from, the pipeline inputs it reads, its
//! environment, and the program (a command, or a driver binary fetched from the
//! head once and cached).
//!
//! Split from `agent` along the seam between the session (which receives the
//! launch) and the worker (which runs it). Not here: running the worker
//! (`worker`).

use std::path::{Path, PathBuf};
use std::sync::Arc;

use tracing::{info, warn};
use xp_runtime::ids::{BlobHash, WorkerKey};
use xp_runtime::protocol::{Launch, Program};
use xp_runtime::transport::HeadConnection;

use crate::checkpoint::{self, CheckpointSink, CheckpointSources};
use crate::isolation::fs::FileOwner;
use crate::isolation::{UidLease, UidPool, WorkTree};
use crate::worker::{self, WorkerCommand};
use crate::worker_log::log_path;

/// Why a worker could not be prepared.
pub(super) enum PrepareError {
    /// Not the trial's fault (the binary could not be fetched): the head places it again.
    Refused(String),
    /// The launch itself is unusable.
    Invalid(String),
}

/// What preparing a launch needs of the node's objects.
pub(super) struct LaunchObjects {
    /// Where a resumed worker's checkpoint comes from.
    pub(super) checkpoints: CheckpointSources,
    /// The durable directory the worker's checkpoints are also written to.
    pub(super) backup: Option<PathBuf>,
    pub(super) local_workers: crate::objects::local::Workers,
    pub(super) socket: PathBuf,
    /// Where workers' user ids come from, when they get their own.
    pub(super) uids: Option<Arc<UidPool>>,
    /// The rendezvous ports held until their rank 0s start, where workers get
    /// ids of their own.
    pub(super) ports: Option<Arc<crate::isolation::ports::PortHold>>,
    /// The most files and bytes rank 0's outputs may have.
    pub(super) output_limits: checkpoint::OutputLimits,
}

/// Prepares `launch`'s worker, in order: its share of a user id (waiting until
/// a fresh id is scrubbed), its work directory, its checkpoint sink, its
/// environment (the node's address, the gang's interfaces, the checkpoint it
/// resumes from), its pipeline inputs, its pass to the local object channel,
/// and its program.
pub(super) async fn resolve_command(
    data_dir: &Path,
    advertise_host: &str,
    connection: &HeadConnection,
    launch: &Launch,
    objects: &LaunchObjects,
) -> Result<WorkerCommand, PrepareError> {
    let key = launch.key;
    let uid = claim_uid(objects, key).await?;
    let owner = uid.as_ref().map(|lease| FileOwner::of_uid(lease.uid()));
    let tree = make_work_dir(data_dir, key, owner).await?;
    let work_dir = tree.path.clone();
    // Should preparing fail from here on, the directory goes back to the node
    // with the id: a later holder of the id must not find this one's files.
    let mut given = GivenWorkDir {
        path: owner.map(|_| work_dir.clone()),
    };
    let checkpoint = CheckpointSink::new(
        objects.checkpoints.store.clone(),
        &work_dir,
        objects.backup.clone(),
    )
    .with_owner(owner);
    let mut node_env = vec![("XP_NODE_HOST".to_owned(), advertise_host.to_owned())];
    node_env.extend(socket_ifname_env(launch).await);
    let resume_env = objects
        .checkpoints
        .restore_for_launch(launch, &checkpoint.dir, owner)
        .await
        .map_err(|error| PrepareError::Refused(error.to_string()))?;
    node_env.extend(resume_env);
    // Upstream stages' files, before anything of the worker runs; an input that
    // cannot be had fails the attempt (retried under max_retries), since
    // placing it again elsewhere would not bring the objects back.
    let inputs = objects
        .checkpoints
        .fill_inputs(launch, &work_dir)
        .await
        .map_err(PrepareError::Invalid)?;
    node_env.extend(local_channel_pass(objects, key, &tree, owner)?);
    let program = resolve_program(data_dir, connection, launch, &inputs).await?;
    node_env.extend(program.env);
    // Last, just before the process starts: the port is let go for rank 0.
    let master_port = match (&objects.ports, key.rank) {
        (Some(ports), 0) => ports.hand_over(launch.master_port).await,
        _ => None,
    };
    given.path = None;
    Ok(WorkerCommand {
        program: program.path,
        args: program.args,
        extra_env: node_env,
        log_path: log_path(data_dir, key),
        input_dir: (!inputs.is_empty()).then(|| work_dir.join(crate::isolation::INPUT_DIR)),
        output: worker::OutputSink {
            dir: work_dir.join(crate::isolation::OUTPUT_DIR),
            store: objects.checkpoints.store.clone(),
            owner,
            limits: objects.output_limits,
            collect: launch.collect_outputs,
        },
        work_dir,
        checkpoint,
        uid,
        master_port,
    })
}

/// A share of the user id `key`'s attempt runs as, when workers get ids of
/// their own, once a fresh id is cleared of its earlier holder. Not the trial's
/// fault when the ids are used up: the head places it again.
async fn claim_uid(
    objects: &LaunchObjects,
    key: WorkerKey,
) -> Result<Option<UidLease>, PrepareError> {
    let Some(pool) = &objects.uids else {
        return Ok(None);
    };
    let lease = pool
        .claim(key)
        .map_err(|error| PrepareError::Refused(error.to_string()))?;
    lease
        .ready()
        .await
        .map_err(|error| PrepareError::Refused(error.to_string()))?;
    Ok(Some(lease))
}

/// Makes `key`'s work directory under `data_dir`, owned by `owner`.
async fn make_work_dir(
    data_dir: &Path,
    key: WorkerKey,
    owner: Option<FileOwner>,
) -> Result<WorkTree, PrepareError> {
    let data_dir = data_dir.to_owned();
    tokio::task::spawn_blocking(move || crate::isolation::make_work_dir(&data_dir, key, owner))
        .await
        .map_err(|error| PrepareError::Refused(error.to_string()))?
        .map_err(|error| PrepareError::Refused(format!("cannot make the work directory: {error}")))
}

/// The worker's pass to the local object channel: a fresh secret, registered
/// for `key`, and the variables that hand it and the socket to the worker.
fn local_channel_pass(
    objects: &LaunchObjects,
    key: WorkerKey,
    tree: &WorkTree,
    owner: Option<FileOwner>,
) -> Result<[(String, String); 2], PrepareError> {
    let secret = xp_runtime::tls::random_secret().ok_or_else(|| {
        PrepareError::Refused("the system has no entropy for a worker secret".to_owned())
    })?;
    objects.local_workers.insert(
        secret,
        crate::objects::local::LocalWorker {
            key,
            work_dir: tree.path.clone(),
            tree: tree.clone(),
            owner,
        },
    );
    Ok([
        (
            "XP_NODE_SOCKET".to_owned(),
            objects.socket.display().to_string(),
        ),
        ("XP_WORKER_SECRET".to_owned(), hex::encode(secret)),
    ])
}

/// What a worker executes.
struct ResolvedProgram {
    path: PathBuf,
    args: Vec<String>,
    /// Variables it needs beyond the node's (`XP_ENTRY` for a Rust trainable).
    env: Vec<(String, String)>,
}

/// The program of `launch`: a command, its input markers replaced by the
/// directories in `inputs`, or a driver binary fetched from the head once and
/// cached, with the entry it runs.
async fn resolve_program(
    data_dir: &Path,
    connection: &HeadConnection,
    launch: &Launch,
    inputs: &[(String, PathBuf)],
) -> Result<ResolvedProgram, PrepareError> {
    match &launch.program {
        Program::Command { argv } => {
            let (program, args) = argv
                .split_first()
                .ok_or_else(|| PrepareError::Invalid("empty command".to_owned()))?;
            Ok(ResolvedProgram {
                path: checkpoint::replace_markers(program, inputs).into(),
                args: args
                    .iter()
                    .map(|arg| checkpoint::replace_markers(arg, inputs))
                    .collect(),
                env: Vec::new(),
            })
        }
        Program::Entry { binary, entry } => {
            let path = cached_binary(data_dir, connection, *binary)
                .await
                .map_err(PrepareError::Refused)?;
            Ok(ResolvedProgram {
                path,
                args: Vec::new(),
                env: vec![("XP_ENTRY".to_owned(), entry.clone())],
            })
        }
    }
}

/// A work directory given to a worker's id that is taken back when dropped
/// armed (`path` set): its launch could not be prepared.
struct GivenWorkDir {
    path: Option<PathBuf>,
}

impl Drop for GivenWorkDir {
    fn drop(&mut self) {
        if let Some(path) = self.path.take()
            && let Err(error) = crate::isolation::take_back_dir(&path)
        {
            warn!(dir = %path.display(), %error, "cannot take an unused work directory back from its user id");
        }
    }
}

/// `GLOO_SOCKET_IFNAME`, `NCCL_SOCKET_IFNAME` and `TP_SOCKET_IFNAME`: the
/// interface carrying this node's route to rank 0 (`MASTER_ADDR`), unless the
/// node's own environment, which the worker inherits, sets them. None when there
/// is no such route: the libraries then choose as they would without xp.
async fn socket_ifname_env(launch: &Launch) -> Vec<(String, String)> {
    let inherited = |name: &str| std::env::var_os(name).is_some();
    crate::route::socket_ifname_env(&launch.master_addr, launch.master_port, inherited)
        .await
        .unwrap_or_else(|error| {
            warn!(
                worker = %launch.key,
                master_addr = %launch.master_addr,
                error = %xp_runtime::error_chain::error_chain(&error),
                "no interface found for the gang's sockets"
            );
            Vec::new()
        })
}

/// The path of driver binary `hash`, fetched from the head on first use.
async fn cached_binary(
    data_dir: &Path,
    connection: &HeadConnection,
    hash: BlobHash,
) -> Result<PathBuf, String> {
    use std::os::unix::fs::PermissionsExt;
    let dir = data_dir.join("bin");
    let path = dir.join(hash.to_string());
    if tokio::fs::try_exists(&path).await.unwrap_or(false) {
        return Ok(path);
    }
    info!(binary = %hash, "fetching driver binary from the head");
    let bytes = connection
        .get_blob(hash)
        .await
        .map_err(|error| format!("cannot fetch binary {hash}: {error}"))?;
    let temporary = dir.join(format!(".{hash}.{}.part", uuid::Uuid::now_v7().simple()));
    let write = async {
        tokio::fs::create_dir_all(&dir).await?;
        tokio::fs::write(&temporary, &bytes).await?;
        tokio::fs::set_permissions(&temporary, std::fs::Permissions::from_mode(0o755)).await?;
        tokio::fs::rename(&temporary, &path).await
    };
    if let Err(error) = write.await {
        let _ = tokio::fs::remove_file(&temporary).await;
        return Err(format!("cannot store binary {hash}: {error}"));
    }
    Ok(path)
}
