//! The worker side: what trial code sees when a node runs it.
//!
//! A node starts each worker with the environment contract of ARCHITECTURE.md
//! (`XP_TRIAL_ID`, `XP_CONFIG`, `XP_RANK`, ...). Rust trainables are functions
//! registered in a driver binary; the node re-executes that binary with
//! `XP_ENTRY=<name>`, and [`Trainables::run_if_worker`] runs the function instead
//! of the driver's `main`. Metrics leave through the same stdout line protocol
//! that command trials use, so the node parses one format.

use std::collections::BTreeMap;
use std::io::Write;
use std::sync::atomic::{AtomicBool, Ordering};

use xp_runtime::collective::BlockingCommunicator;
use xp_runtime::error_chain::error_chain;
use xp_runtime::ids::ObjectId;
use xp_runtime::metric_line::{CHECKPOINT_STATUS_DIR, format_checkpoint_line, format_metric_line};
use xp_runtime::object_wire::{LocalOp, LocalResponse};
use xp_runtime::protocol::ObjectCapability;

mod error;
mod gang;
mod node_channel;

pub use error::WorkerError;
use node_channel::{local_request, unexpected, wait_for_verdict};

/// The error type trainables return.
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

type TrainableFn = Box<dyn Fn(&TrialContext) -> Result<(), BoxError> + Send + Sync>;

/// What one worker knows about its trial.
#[derive(Debug, Clone)]
pub struct TrialContext {
    /// The trial id.
    pub trial_id: String,
    /// The attempt, from 1.
    pub attempt: u32,
    /// The trial's parameters and `seed`.
    pub config: serde_json::Map<String, serde_json::Value>,
    /// The replicate seed.
    pub seed: u64,
    /// This worker's rank.
    pub rank: u32,
    /// The number of workers.
    pub world_size: u32,
    /// A scratch directory for this worker.
    pub work_dir: std::path::PathBuf,
    /// Where checkpoint files go (`XP_CHECKPOINT_DIR`); filled with the
    /// checkpoint's files when this attempt resumes from one.
    pub checkpoint_dir: std::path::PathBuf,
    /// The step of the checkpoint this attempt resumed from (`XP_RESUME_STEP`).
    pub resume_step: Option<u64>,
}

/// Set by SIGTERM once a trainable watches for it (see [`TrialContext::stop_requested`]).
static STOP_REQUESTED: AtomicBool = AtomicBool::new(false);
/// Whether the SIGTERM watch is installed.
static STOP_WATCHED: AtomicBool = AtomicBool::new(false);
/// The exit status of a worker that returned after being asked to stop: the
/// shell convention for "ended by SIGTERM", so the head never mistakes a
/// trial cut short for one that finished.
const STOPPED_STATUS: i32 = 128 + libc::SIGTERM;

/// The file [`TrialContext::checkpoint`] writes its bytes to.
const STATE_FILE: &str = "state";

fn env(name: &'static str) -> Result<String, WorkerError> {
    std::env::var(name).map_err(|error| WorkerError::Env {
        name,
        reason: error.to_string(),
    })
}

/// A 32-byte secret the node hands over as 64 hex digits.
fn env_secret(name: &'static str) -> Result<[u8; 32], WorkerError> {
    let mut secret = [0u8; 32];
    hex::decode_to_slice(env(name)?.trim(), &mut secret).map_err(|_| WorkerError::Env {
        name,
        reason: "not 64 hex digits".to_owned(),
    })?;
    Ok(secret)
}

fn env_number<T: std::str::FromStr>(name: &'static str) -> Result<T, WorkerError> {
    env(name)?.parse().map_err(|_| WorkerError::Env {
        name,
        reason: "not a number".to_owned(),
    })
}

impl TrialContext {
    /// Reads the context a node gave this process.
    pub fn from_env() -> Result<Self, WorkerError> {
        let config_text = env("XP_CONFIG")?;
        let config = serde_json::from_str(&config_text).map_err(|error| WorkerError::Env {
            name: "XP_CONFIG",
            reason: error.to_string(),
        })?;
        Ok(Self {
            trial_id: env("XP_TRIAL_ID")?,
            attempt: env_number("XP_ATTEMPT")?,
            config,
            seed: env_number("XP_SEED")?,
            rank: env_number("XP_RANK")?,
            world_size: env_number("XP_WORLD_SIZE")?,
            work_dir: env("XP_WORK_DIR")?.into(),
            checkpoint_dir: env("XP_CHECKPOINT_DIR")?.into(),
            resume_step: match std::env::var("XP_RESUME_STEP") {
                Ok(_) => Some(env_number("XP_RESUME_STEP")?),
                Err(_) => None,
            },
        })
    }

    /// Whether this worker has been asked to stop: its trial is being preempted or
    /// cancelled, or its node is shutting down. The first call installs the watch:
    /// from then on SIGTERM no longer ends the process at once but sets this flag,
    /// so a trainable that checks it every step can save a checkpoint and return
    /// within the grace period before SIGKILL. A trainable that returns `Ok` after
    /// a stop was requested exits with status 143, as if SIGTERM had ended it, so
    /// the trial resumes later instead of counting as finished.
    pub fn stop_requested(&self) -> bool {
        if !STOP_WATCHED.swap(true, Ordering::AcqRel) {
            // SAFETY: the action only stores to an atomic, which is async-signal-safe.
            let installed = unsafe {
                signal_hook_registry::register(libc::SIGTERM, || {
                    STOP_REQUESTED.store(true, Ordering::Release);
                })
            };
            if let Err(error) = installed {
                tracing::warn!(%error, "cannot watch for SIGTERM; the worker will stop at once");
            }
        }
        STOP_REQUESTED.load(Ordering::Acquire)
    }

    /// Saves `state` as the trial's checkpoint at `step` and returns once the node
    /// has stored it (and will replicate it): a later attempt of this trial, on
    /// any node, starts with it in [`restore`](Self::restore).
    ///
    /// Only rank 0 writes: data-parallel ranks hold the same state, so on other
    /// ranks this returns at once. A full store or another failure on the node
    /// comes back as [`WorkerError::CheckpointRefused`]; the trial goes on either way.
    pub fn checkpoint(&self, step: u64, state: &[u8]) -> Result<(), WorkerError> {
        if self.rank != 0 {
            return Ok(());
        }
        std::fs::create_dir_all(&self.checkpoint_dir)
            .map_err(checkpoint_file("create", &self.checkpoint_dir))?;
        let temporary = self.checkpoint_dir.join(format!(".{STATE_FILE}.tmp"));
        std::fs::write(&temporary, state).map_err(checkpoint_file("write", &temporary))?;
        let state_path = self.checkpoint_dir.join(STATE_FILE);
        std::fs::rename(&temporary, &state_path).map_err(checkpoint_file("write", &state_path))?;
        self.commit_checkpoint(step)
    }

    /// Declares the files now in [`checkpoint_dir`](Self::checkpoint_dir) the
    /// trial's checkpoint at `step` and returns once the node has stored them (or
    /// with the node's error, as [`WorkerError::CheckpointRefused`]). For trial code that
    /// writes its own files there (the Python package's `xp.checkpoint`) rather
    /// than handing bytes to [`checkpoint`](Self::checkpoint). On ranks other than
    /// 0 it returns at once: only rank 0 checkpoints.
    pub fn commit_checkpoint(&self, step: u64) -> Result<(), WorkerError> {
        if self.rank != 0 {
            return Ok(());
        }
        let verdict_path = self
            .work_dir
            .join(CHECKPOINT_STATUS_DIR)
            .join(step.to_string());
        // A verdict left by an earlier attempt at the same step is stale.
        let _ = std::fs::remove_file(&verdict_path);
        {
            let mut stdout = std::io::stdout().lock();
            let _ = writeln!(stdout, "{}", format_checkpoint_line(step));
            let _ = stdout.flush();
        }
        wait_for_verdict(&verdict_path, step)
    }

    /// Stores `bytes` in this node's object store for the trial and returns their
    /// id; every worker of this trial, on any node, can [`get`](Self::get) them by
    /// it (no other trial can). Objects are collected when the trial ends.
    pub fn put(&self, bytes: &[u8]) -> Result<ObjectId, WorkerError> {
        let staging = self.work_dir.join(".objects-out");
        std::fs::create_dir_all(&staging).map_err(object_file("create", &staging))?;
        // Unique per call, so that threads putting at once never share a file.
        static NEXT_PUT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        let sequence = NEXT_PUT.fetch_add(1, Ordering::Relaxed);
        let path = staging.join(format!("{}-{sequence}.put", std::process::id()));
        std::fs::write(&path, bytes).map_err(object_file("write", &path))?;
        let stored = self.put_file(&path);
        let _ = std::fs::remove_file(&path);
        stored
    }

    /// Stores the file at `path` (the node copies it) and returns its id. The node
    /// copies only a regular file inside this worker's work or checkpoint
    /// directory (after following symlinks), and refuses anything else.
    pub fn put_file(&self, path: &std::path::Path) -> Result<ObjectId, WorkerError> {
        let path = std::path::absolute(path).map_err(object_file("resolve", path))?;
        match local_request(LocalOp::Put { path })? {
            LocalResponse::Stored { id, .. } => Ok(id),
            other => Err(unexpected(other)),
        }
    }

    /// A read-only file with object `id`'s bytes, fetched from another node if
    /// this one lacks it, and verified against the id.
    pub fn get_path(&self, id: ObjectId) -> Result<std::path::PathBuf, WorkerError> {
        match local_request(LocalOp::Get { id })? {
            LocalResponse::Got { path, .. } => Ok(path),
            other => Err(unexpected(other)),
        }
    }

    /// Object `id`'s bytes (see [`get_path`](Self::get_path)).
    pub fn get(&self, id: ObjectId) -> Result<Vec<u8>, WorkerError> {
        let path = self.get_path(id)?;
        std::fs::read(&path).map_err(object_file("read", &path))
    }

    /// Drops the trial's claim on object `id`; returns whether it had one. The
    /// object goes once nothing else claims it.
    pub fn delete(&self, id: ObjectId) -> Result<bool, WorkerError> {
        match local_request(LocalOp::Delete { id })? {
            LocalResponse::Released { existed } => Ok(existed),
            other => Err(unexpected(other)),
        }
    }

    /// This attempt's capability on the object plane, which its node holds
    /// for it (never in its environment): what a helper of this trial presents
    /// to fetch from the nodes' object servers directly
    /// (`xp_runtime::object_wire::ObjectClient`). It reads what the trial
    /// keeps and what its experiment's drivers stored, stores nothing, and
    /// stops working when the attempt ends. It lasts an hour
    /// (`xp_runtime::protocol::ATTEMPT_CAPABILITY_MS`); the head renews the
    /// one the node holds every half hour while the attempt lives, so a helper
    /// that runs longer asks again before its `grant.expires_ms`.
    pub fn object_capability(&self) -> Result<ObjectCapability, WorkerError> {
        match local_request(LocalOp::Capability)? {
            LocalResponse::Capability(capability) => Ok(*capability),
            other => Err(unexpected(other)),
        }
    }

    /// The checkpoint this attempt resumes from, as (step, state) saved by
    /// [`checkpoint`](Self::checkpoint); `None` on a fresh start.
    pub fn restore(&self) -> Result<Option<(u64, Vec<u8>)>, WorkerError> {
        let Some(step) = self.resume_step else {
            return Ok(None);
        };
        let path = self.checkpoint_dir.join(STATE_FILE);
        let state = std::fs::read(&path).map_err(|source| WorkerError::Restore {
            step,
            path: path.clone(),
            source,
        })?;
        Ok(Some((step, state)))
    }

    fn param(&self, name: &str) -> Result<&serde_json::Value, WorkerError> {
        self.config.get(name).ok_or_else(|| WorkerError::Param {
            name: name.to_owned(),
            reason: "is not in the config",
        })
    }

    /// A real-valued parameter (integers are accepted too).
    pub fn param_f64(&self, name: &str) -> Result<f64, WorkerError> {
        self.param(name)?
            .as_f64()
            .ok_or_else(|| WorkerError::Param {
                name: name.to_owned(),
                reason: "is not a number",
            })
    }

    /// An integer parameter.
    pub fn param_i64(&self, name: &str) -> Result<i64, WorkerError> {
        self.param(name)?
            .as_i64()
            .ok_or_else(|| WorkerError::Param {
                name: name.to_owned(),
                reason: "is not an integer",
            })
    }

    /// A text parameter.
    pub fn param_str(&self, name: &str) -> Result<&str, WorkerError> {
        self.param(name)?
            .as_str()
            .ok_or_else(|| WorkerError::Param {
                name: name.to_owned(),
                reason: "is not text",
            })
    }

    /// Joins the trial's gang for collectives: binds a data listener, meets the other
    /// ranks at rank 0's rendezvous store (its address and the per-attempt secret
    /// come from the head through the environment), and connects the ring.
    ///
    /// Every rank of the trial must call it. A rank that does not arrive within the
    /// timeout (`XP_COLLECTIVE_TIMEOUT_S`, 60 s by default) makes every other rank
    /// fail with an error naming it, so the attempt fails and is retried.
    pub fn collective(&self) -> Result<BlockingCommunicator, WorkerError> {
        gang::join_gang(self.rank, self.world_size)
    }

    /// Reports metrics at `step`; the node records them under this trial.
    pub fn report(&self, step: u64, metrics: &[(&str, f64)]) {
        let values: BTreeMap<String, f64> = metrics
            .iter()
            .map(|(name, value)| ((*name).to_owned(), *value))
            .collect();
        let line = format_metric_line(Some(step), &values);
        let mut stdout = std::io::stdout().lock();
        // A closed stdout means the node is gone; the worker is about to be killed anyway.
        let _ = writeln!(stdout, "{line}");
        let _ = stdout.flush();
    }
}

/// The error for a failed file operation on `path` while saving a checkpoint.
fn checkpoint_file(
    doing: &'static str,
    path: &std::path::Path,
) -> impl FnOnce(std::io::Error) -> WorkerError {
    let path = path.to_owned();
    move |source| WorkerError::CheckpointFile {
        doing,
        path,
        source,
    }
}

/// The error for a failed file operation on `path` while putting or getting an object.
fn object_file(
    doing: &'static str,
    path: &std::path::Path,
) -> impl FnOnce(std::io::Error) -> WorkerError {
    let path = path.to_owned();
    move |source| WorkerError::ObjectFile {
        doing,
        path,
        source,
    }
}

/// The Rust trainables a driver binary offers, by name.
#[derive(Default)]
pub struct Trainables {
    entries: BTreeMap<String, TrainableFn>,
}

impl std::fmt::Debug for Trainables {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Trainables")
            .field("entries", &self.entries.keys().collect::<Vec<_>>())
            .finish()
    }
}

/// The trainables this process registered, once it ran
/// [`Trainables::run_if_worker`]: what it may be shipped to nodes to run.
static REGISTERED: std::sync::OnceLock<std::collections::BTreeSet<String>> =
    std::sync::OnceLock::new();

/// The trainables this process registered, if it is a driver.
pub(crate) fn registered_trainables() -> Option<&'static std::collections::BTreeSet<String>> {
    REGISTERED.get()
}

impl Trainables {
    /// No trainables yet.
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds `trainable` under `name` (the `entry` of a trial spec).
    pub fn register(
        mut self,
        name: &str,
        trainable: impl Fn(&TrialContext) -> Result<(), BoxError> + Send + Sync + 'static,
    ) -> Self {
        self.entries.insert(name.to_owned(), Box::new(trainable));
        self
    }

    /// The registered names.
    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.entries.keys().map(String::as_str)
    }

    /// If a node started this process as a worker (`XP_ENTRY` is set), runs the
    /// trainable and exits: status 0 on success, 1 on error, 2 for an unknown
    /// entry or a broken environment. Otherwise returns, and the driver goes on.
    ///
    /// Call it first thing in `main`, before starting a runtime.
    pub fn run_if_worker(&self) {
        // Submissions from this process may ship it for these entries.
        let _ = REGISTERED.set(self.entries.keys().cloned().collect());
        let Ok(entry) = std::env::var("XP_ENTRY") else {
            return;
        };
        std::process::exit(self.run_worker(&entry));
    }

    #[expect(
        clippy::print_stderr,
        reason = "a worker's stderr is its log, read with `xp logs`"
    )]
    fn run_worker(&self, entry: &str) -> i32 {
        let Some(trainable) = self.entries.get(entry) else {
            let known: Vec<&str> = self.names().collect();
            eprintln!(
                "xp worker: no trainable named {entry:?} in this binary (it has: {})",
                known.join(", ")
            );
            return 2;
        };
        let context = match TrialContext::from_env() {
            Ok(context) => context,
            Err(error) => {
                eprintln!("xp worker: {}", error_chain(&error));
                return 2;
            }
        };
        match trainable(&context) {
            Ok(()) if STOP_REQUESTED.load(Ordering::Acquire) => {
                eprintln!("xp worker: stopped on request");
                STOPPED_STATUS
            }
            Ok(()) => 0,
            Err(error) => {
                eprintln!(
                    "xp worker: trainable {entry:?} failed: {}",
                    error_chain(&*error)
                );
                1
            }
        }
    }
}
