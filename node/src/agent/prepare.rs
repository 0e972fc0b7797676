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
    node_env.extend(local_channel_pass(objects, launch, &tree, owner)?);
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
        path_args: program.path_args,
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
        .claim_soon(key)
        .await
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
/// for the launch's worker, and the variables that hand it and the socket to it.
fn local_channel_pass(
    objects: &LaunchObjects,
    launch: &Launch,
    tree: &WorkTree,
    owner: Option<FileOwner>,
) -> Result<[(String, String); 2], PrepareError> {
    let secret = xp_runtime::tls::random_secret().ok_or_else(|| {
        PrepareError::Refused("the system has no entropy for a worker secret".to_owned())
    })?;
    objects.local_workers.insert(
        secret,
        crate::objects::local::LocalWorker {
            key: launch.key,
            work_dir: tree.path.clone(),
            tree: tree.clone(),
            owner,
            fetch_path: launch.object_path,
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
    /// The arguments found in the command's directory.
    path_args: Vec<PathBuf>,
    /// Variables it needs beyond the node's (`XP_ENTRY` for a Rust trainable).
    env: Vec<(String, String)>,
}

/// The program of `launch`: a command, its input markers replaced by the
/// directories in `inputs` and its relative paths found in its directory
/// ([`command_paths`]), or a driver binary fetched from the head once and
/// cached, with the entry it runs.
async fn resolve_program(
    data_dir: &Path,
    connection: &HeadConnection,
    launch: &Launch,
    inputs: &[(String, PathBuf)],
) -> Result<ResolvedProgram, PrepareError> {
    match &launch.program {
        Program::Command { argv } => {
            if argv.is_empty() {
                return Err(PrepareError::Invalid("empty command".to_owned()));
            }
            let argv: Vec<String> = argv
                .iter()
                .map(|arg| checkpoint::replace_markers(arg, inputs))
                .collect();
            let command_dir = launch.command_dir.clone();
            tokio::task::spawn_blocking(move || command_paths(argv, command_dir.as_deref()))
                .await
                .map_err(|error| PrepareError::Refused(error.to_string()))
        }
        Program::Entry { binary, entry } => {
            let path = cached_binary(data_dir, connection, *binary)
                .await
                .map_err(PrepareError::Refused)?;
            Ok(ResolvedProgram {
                path,
                args: Vec::new(),
                path_args: Vec::new(),
                env: vec![("XP_ENTRY".to_owned(), entry.clone())],
            })
        }
    }
}

/// A command (`argv`, not empty) with its relative paths found in
/// `command_dir` (the directory it was submitted from, when absolute), since
/// the worker runs in its own work directory: the program when written with a
/// slash (`./train.sh`; a bare name is looked up on `PATH`, as a shell does),
/// and each argument that is a relative path naming a file or directory there
/// (`train.py`, `data/digits`; not an option, `-x`), made absolute.
fn command_paths(mut argv: Vec<String>, command_dir: Option<&str>) -> ResolvedProgram {
    let command_dir = command_dir.map(Path::new).filter(|dir| dir.is_absolute());
    let program = argv.remove(0);
    let mut path = PathBuf::from(&program);
    if let Some(dir) = command_dir
        && program.contains('/')
    {
        // Without the `./` a program path is usually written with.
        path = dir.join(&program).components().collect();
    }
    let mut path_args = Vec::new();
    let args = argv
        .into_iter()
        .map(|arg| {
            let found = command_dir
                .filter(|_| {
                    !arg.is_empty() && !arg.starts_with('-') && Path::new(&arg).is_relative()
                })
                .map(|dir| dir.join(&arg).components().collect::<PathBuf>())
                .filter(|path| path.try_exists().unwrap_or(false));
            match found {
                Some(found) => {
                    let absolute = found.display().to_string();
                    path_args.push(found);
                    absolute
                }
                None => arg,
            }
        })
        .collect();
    ResolvedProgram {
        path,
        args,
        path_args,
        env: Vec::new(),
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

#[cfg(test)]
mod tests {
    use super::command_paths;

    /// What `argv` becomes with its directory `dir` (holding `train.py`,
    /// `run.sh` and `data/`): the program, then the arguments.
    fn check(argv: &[&str], dir: Option<&str>, expected: &[&str]) {
        let files = tempfile::tempdir().unwrap();
        std::fs::write(files.path().join("train.py"), "").unwrap();
        std::fs::write(files.path().join("run.sh"), "").unwrap();
        std::fs::create_dir(files.path().join("data")).unwrap();
        let root = files.path().display().to_string();
        let dir = dir.map(|dir| dir.replace("DIR", &root));
        let argv = argv.iter().map(|arg| (*arg).to_owned()).collect();
        let resolved = command_paths(argv, dir.as_deref());
        let mut got = vec![resolved.path.display().to_string()];
        got.extend(resolved.args);
        let expected: Vec<String> = expected
            .iter()
            .map(|arg| arg.replace("DIR", &root))
            .collect();
        assert_eq!(got, expected);
        let found: Vec<String> = expected[1..]
            .iter()
            .filter(|arg| arg.starts_with(&root))
            .cloned()
            .collect();
        let path_args: Vec<String> = resolved
            .path_args
            .iter()
            .map(|path| path.display().to_string())
            .collect();
        assert_eq!(path_args, found);
    }

    #[test]
    fn relative_paths_are_found_in_the_commands_directory() {
        check(
            &["python3", "train.py"],
            Some("DIR"),
            &["python3", "DIR/train.py"],
        );
        check(
            &[
                "python3",
                "train.py",
                "--data",
                "data",
                "-v",
                "missing.py",
                "0.1",
                "",
            ],
            Some("DIR"),
            &[
                "python3",
                "DIR/train.py",
                "--data",
                "DIR/data",
                "-v",
                "missing.py",
                "0.1",
                "",
            ],
        );
        check(
            &["./run.sh", "/etc/hostname"],
            Some("DIR"),
            &["DIR/run.sh", "/etc/hostname"],
        );
        check(&["bin/missing"], Some("DIR"), &["DIR/bin/missing"]);
        // A bare name is looked up on PATH, even when a file of that name is there.
        check(&["run.sh"], Some("DIR"), &["run.sh"]);
        // Without a directory, or with one that is not absolute, nothing changes.
        check(&["./run.sh", "train.py"], None, &["./run.sh", "train.py"]);
        check(
            &["./run.sh", "train.py"],
            Some("relative"),
            &["./run.sh", "train.py"],
        );
    }
}
