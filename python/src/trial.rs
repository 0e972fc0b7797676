//! `xp._native.Trial`: what a worker process does, over `xp_sdk::TrialContext`.
//!
//! Metric and checkpoint lines, the wait for the node's verdict on a checkpoint,
//! the SIGTERM watch and the node's local object channel all stay in the Rust
//! SDK; this class only converts arguments and errors.

use std::path::{Path, PathBuf};

use pyo3::prelude::*;
use xp_sdk::{ObjectId, TrialContext};

use crate::errors;

/// The trial this process runs as, read from the node's environment contract.
#[pyclass(module = "xp._native", frozen)]
pub(crate) struct Trial {
    context: TrialContext,
}

#[pymethods]
impl Trial {
    /// Reads the context a node gave this process (`XP_TRIAL_ID`, `XP_CONFIG`, ...);
    /// raises `TrialEnvironmentError` naming the variable that is missing or malformed.
    #[staticmethod]
    fn from_env(py: Python<'_>) -> PyResult<Self> {
        TrialContext::from_env()
            .map(|context| Self { context })
            .map_err(|error| errors::worker_error(py, error))
    }

    #[getter]
    fn trial_id(&self) -> &str {
        &self.context.trial_id
    }

    #[getter]
    fn attempt(&self) -> u32 {
        self.context.attempt
    }

    #[getter]
    fn seed(&self) -> u64 {
        self.context.seed
    }

    #[getter]
    fn rank(&self) -> u32 {
        self.context.rank
    }

    #[getter]
    fn world_size(&self) -> u32 {
        self.context.world_size
    }

    #[getter]
    fn work_dir(&self) -> PathBuf {
        self.context.work_dir.clone()
    }

    #[getter]
    fn checkpoint_dir(&self) -> PathBuf {
        self.context.checkpoint_dir.clone()
    }

    #[getter]
    fn resume_step(&self) -> Option<u64> {
        self.context.resume_step
    }

    /// The parameters as JSON text, so Python reads each value with the type it
    /// was given (an int stays an int).
    #[getter]
    fn config_json(&self) -> String {
        serde_json::Value::Object(self.context.config.clone()).to_string()
    }

    /// Writes one metric line for `step`; the node records it under this trial.
    fn report(&self, step: u64, metrics: Vec<(String, f64)>) {
        let metrics: Vec<(&str, f64)> = metrics
            .iter()
            .map(|(name, value)| (name.as_str(), *value))
            .collect();
        self.context.report(step, &metrics);
    }

    /// Declares the files in `checkpoint_dir` the checkpoint at `step` and blocks
    /// (without the GIL) until the node has stored them; raises `CheckpointError`
    /// with the node's words when it refused them.
    fn commit_checkpoint(&self, py: Python<'_>, step: u64) -> PyResult<()> {
        py.detach(|| self.context.commit_checkpoint(step))
            .map_err(|error| errors::worker_error(py, error))
    }

    /// Whether SIGTERM has arrived (preemption, cancellation, the node leaving);
    /// the first call installs the watch, after which SIGTERM no longer ends the
    /// process at once.
    fn stop_requested(&self) -> bool {
        self.context.stop_requested()
    }

    /// Stores the file at `path` in the node's object store for this trial and
    /// returns the object's id. The node takes only files inside the worker's
    /// work or checkpoint directory, so a file elsewhere is first copied into
    /// the work directory (and that copy removed after).
    fn put(&self, py: Python<'_>, path: PathBuf) -> PyResult<String> {
        py.detach(|| self.put_anywhere(&path))
            .map(|id| id.to_string())
            .map_err(|error| match error {
                PutError::Worker(error) => errors::worker_error(py, error),
                PutError::Io(message) => errors::other(py, "ObjectError", message),
            })
    }

    /// Copies object `object_id` (fetched from another node when this one lacks
    /// it, verified against its id) to the file `destination`, creating its
    /// parent directories.
    fn get(&self, py: Python<'_>, object_id: &str, destination: PathBuf) -> PyResult<()> {
        let id: ObjectId = object_id.parse().map_err(|error| {
            errors::other(
                py,
                "ObjectError",
                format!("bad object id {object_id:?}: {error}"),
            )
        })?;
        py.detach(|| -> Result<(), PutError> {
            let source = self.context.get_path(id).map_err(PutError::Worker)?;
            if let Some(parent) = destination.parent().filter(|p| !p.as_os_str().is_empty()) {
                std::fs::create_dir_all(parent).map_err(|error| {
                    PutError::Io(format!("cannot create {}: {error}", parent.display()))
                })?;
            }
            std::fs::copy(&source, &destination).map_err(|error| {
                PutError::Io(format!(
                    "cannot copy object {id} to {}: {error}",
                    destination.display()
                ))
            })?;
            Ok(())
        })
        .map_err(|error| match error {
            PutError::Worker(error) => errors::worker_error(py, error),
            PutError::Io(message) => errors::other(py, "ObjectError", message),
        })
    }
}

/// Why a put or get failed: the SDK's error, or a local copy.
enum PutError {
    Worker(xp_sdk::WorkerError),
    Io(String),
}

impl Trial {
    fn put_anywhere(&self, path: &Path) -> Result<ObjectId, PutError> {
        let resolved = std::fs::canonicalize(path)
            .map_err(|error| PutError::Io(format!("cannot read {}: {error}", path.display())))?;
        let inside =
            |dir: &Path| std::fs::canonicalize(dir).is_ok_and(|dir| resolved.starts_with(&dir));
        if inside(&self.context.work_dir) || inside(&self.context.checkpoint_dir) {
            return self.context.put_file(&resolved).map_err(PutError::Worker);
        }
        let staging = self.context.work_dir.join(".objects-py");
        std::fs::create_dir_all(&staging).map_err(|error| {
            PutError::Io(format!("cannot create {}: {error}", staging.display()))
        })?;
        // Unique per call, so that threads putting at once never share a file.
        static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        let sequence = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let copy = staging.join(format!("{}-{sequence}", std::process::id()));
        std::fs::copy(&resolved, &copy).map_err(|error| {
            PutError::Io(format!(
                "cannot copy {} into the work directory: {error}",
                resolved.display()
            ))
        })?;
        let stored = self.context.put_file(&copy).map_err(PutError::Worker);
        let _ = std::fs::remove_file(&copy);
        stored
    }
}
