//! `xp._native.Client`: a driver's connection to a head, over `xp_sdk::Client`.
//!
//! Each call blocks on a runtime the client owns, with the GIL released, so
//! other Python threads run meanwhile; `wait` returns to Python every second to
//! let Ctrl-C through. Views come back as the JSON of `xp status --json` (the
//! shapes of `xp_runtime::views`), so Python sees what the CLI and the HTTP API
//! show.

use std::collections::BTreeMap;
use std::future::Future;
use std::path::PathBuf;
use std::time::Duration;

use tokio::time::Instant;

use pyo3::prelude::*;
use xp_runtime::views;
use xp_sdk::{ExperimentSpec, ExperimentState, ExperimentStatus, ObjectId, SdkError, TrialId};

use crate::errors;

/// The most log bytes one `logs` call returns unless asked for more.
const DEFAULT_LOG_BYTES: u64 = 16 << 20;
/// The largest file `put` reads into memory.
const MAX_PUT_BYTES: u64 = 4 << 30;

/// A driver's authenticated connection to a head.
#[pyclass(module = "xp._native", frozen)]
pub(crate) struct Client {
    runtime: tokio::runtime::Runtime,
    client: xp_sdk::Client,
}

/// One row of `results`: trial id, state, config as JSON, last metric values.
type Row = (String, String, String, BTreeMap<String, f64>);

impl Client {
    /// Runs `future` on the client's runtime without the GIL.
    fn block<T: Send>(
        &self,
        py: Python<'_>,
        future: impl Future<Output = Result<T, SdkError>> + Send,
    ) -> PyResult<T> {
        py.detach(|| self.runtime.block_on(future))
            .map_err(|error| errors::sdk_error(py, error))
    }

    /// The one experiment `experiment` names (an id or unique prefix).
    fn one(&self, py: Python<'_>, experiment: &str) -> PyResult<ExperimentStatus> {
        let mut list = self.block(py, self.client.status(Some(experiment)))?;
        match list.len() {
            1 => Ok(list.remove(0)),
            0 => Err(errors::other(
                py,
                "NotFoundError",
                format!("no experiment {experiment:?}"),
            )),
            n => Err(errors::other(
                py,
                "XpError",
                format!("{experiment:?} names {n} experiments; give its id"),
            )),
        }
    }
}

#[pymethods]
impl Client {
    /// Connects to the head named by the join string (`xp://HOST:PORT?token=..&ca=..`).
    #[new]
    fn new(py: Python<'_>, join: &str) -> PyResult<Self> {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name("xp-client")
            .enable_all()
            .build()
            .map_err(|error| {
                errors::other(py, "XpError", format!("cannot start a runtime: {error}"))
            })?;
        let client = py
            .detach(|| runtime.block_on(xp_sdk::Client::connect(join)))
            .map_err(|error| errors::sdk_error(py, error))?;
        Ok(Self { runtime, client })
    }

    /// Parses `spec_yaml` (YAML or JSON), computes its code and data versions
    /// relative to `base_dir` and submits it; returns (experiment id, reused,
    /// number of trials).
    #[pyo3(signature = (spec_yaml, base_dir=None, rerun=false))]
    fn submit(
        &self,
        py: Python<'_>,
        spec_yaml: &str,
        base_dir: Option<PathBuf>,
        rerun: bool,
    ) -> PyResult<(String, bool, u32)> {
        let spec = ExperimentSpec::from_yaml(spec_yaml)
            .map_err(|error| errors::sdk_error(py, SdkError::Spec(error)))?;
        let options = xp_sdk::SubmitOptions {
            rerun,
            base_dir,
            ..Default::default()
        };
        let submitted = self.block(py, self.client.submit(&spec, &options))?;
        Ok((
            submitted.experiment.to_string(),
            submitted.reused,
            submitted.trials,
        ))
    }

    /// Experiments (one, by id or unique prefix; or all) as the JSON list
    /// `xp status --json` prints.
    #[pyo3(signature = (experiment=None))]
    fn status(&self, py: Python<'_>, experiment: Option<&str>) -> PyResult<String> {
        let list = self.block(py, self.client.status(experiment))?;
        let json: Vec<serde_json::Value> = list.iter().map(views::experiment_json).collect();
        Ok(serde_json::Value::Array(json).to_string())
    }

    /// The experiment's trials, best first by its metric.
    fn results(&self, py: Python<'_>, experiment: &str) -> PyResult<Vec<Row>> {
        let id = self.one(py, experiment)?.id;
        let rows = self.block(py, self.client.results(id))?;
        Ok(rows
            .into_iter()
            .map(|row| {
                (
                    row.trial.to_string(),
                    row.state.as_str().to_owned(),
                    serde_json::Value::Object(row.config).to_string(),
                    row.metrics,
                )
            })
            .collect())
    }

    /// Waits until the experiment is no longer running and returns its status
    /// (JSON). Raises `WaitTimeout` after `timeout_s` seconds when given;
    /// Ctrl-C interrupts it.
    #[pyo3(signature = (experiment, timeout_s=None))]
    fn wait(&self, py: Python<'_>, experiment: &str, timeout_s: Option<f64>) -> PyResult<String> {
        let deadline = match timeout_s {
            Some(seconds) if seconds.is_finite() && seconds >= 0.0 => {
                Some(Instant::now() + Duration::from_secs_f64(seconds.min(1e9)))
            }
            Some(seconds) => {
                return Err(errors::other(
                    py,
                    "XpError",
                    format!("timeout_s must be a non-negative number of seconds, not {seconds}"),
                ));
            }
            None => None,
        };
        let id = self.one(py, experiment)?.id;
        let mut after = 0;
        loop {
            let status = self.one(py, &id.to_string())?;
            if status.state != ExperimentState::Running {
                return Ok(views::experiment_json(&status).to_string());
            }
            if deadline.is_some_and(|deadline| Instant::now() >= deadline) {
                return Err(errors::other(
                    py,
                    "WaitTimeout",
                    format!("experiment {id} still running after {timeout_s:?} s"),
                ));
            }
            // A long poll: the head answers as soon as a trial changes state.
            let events = self.block(py, self.client.events(id, after, Duration::from_secs(1)))?;
            after = events.iter().map(|event| event.seq).fold(after, u64::max);
            py.check_signals()?;
        }
    }

    /// Cancels an experiment or a trial; returns how many trials it stopped.
    fn cancel(&self, py: Python<'_>, id: &str) -> PyResult<u32> {
        self.block(py, self.client.cancel(id))
    }

    /// One worker's output (rank `rank`, the latest attempt unless `attempt`),
    /// at most `max_bytes` of it from the start, as text (invalid UTF-8 replaced).
    #[pyo3(signature = (trial, rank=0, attempt=None, max_bytes=DEFAULT_LOG_BYTES))]
    fn logs(
        &self,
        py: Python<'_>,
        trial: &str,
        rank: u32,
        attempt: Option<u32>,
        max_bytes: u64,
    ) -> PyResult<String> {
        let trial: TrialId = trial.parse().map_err(|error| {
            errors::other(py, "XpError", format!("bad trial id {trial:?}: {error}"))
        })?;
        let mut text = Vec::new();
        let mut offset = 0;
        while (text.len() as u64) < max_bytes {
            let chunk = self.block(py, self.client.logs(trial, rank, attempt, offset))?;
            if chunk.data.is_empty() || chunk.next_offset <= offset {
                break;
            }
            text.extend_from_slice(&chunk.data);
            offset = chunk.next_offset;
        }
        text.truncate(usize::try_from(max_bytes).unwrap_or(usize::MAX));
        Ok(String::from_utf8_lossy(&text).into_owned())
    }

    /// The nodes as the JSON list `xp nodes --json` prints.
    fn nodes(&self, py: Python<'_>) -> PyResult<String> {
        let list = self.block(py, self.client.nodes())?;
        let json: Vec<serde_json::Value> = list.iter().map(views::node_json).collect();
        Ok(serde_json::Value::Array(json).to_string())
    }

    /// Stores the file at `path` in the cluster's object store; returns its id,
    /// which trials of experiments submitted on this connection can `xp.get`.
    fn put(&self, py: Python<'_>, path: PathBuf) -> PyResult<String> {
        let read = |path: &PathBuf| -> Result<Vec<u8>, String> {
            use std::io::Read;
            let file = std::fs::File::open(path)
                .map_err(|error| format!("cannot read {}: {error}", path.display()))?;
            let mut bytes = Vec::new();
            file.take(MAX_PUT_BYTES + 1)
                .read_to_end(&mut bytes)
                .map_err(|error| format!("cannot read {}: {error}", path.display()))?;
            if bytes.len() as u64 > MAX_PUT_BYTES {
                return Err(format!(
                    "{} is larger than {MAX_PUT_BYTES} bytes",
                    path.display()
                ));
            }
            Ok(bytes)
        };
        let bytes = py
            .detach(|| read(&path))
            .map_err(|message| errors::other(py, "ObjectError", message))?;
        let id = self.block(py, self.client.put(&bytes))?;
        Ok(id.to_string())
    }

    /// Writes object `object_id`'s bytes (verified against the id) to `destination`.
    fn get(&self, py: Python<'_>, object_id: &str, destination: PathBuf) -> PyResult<()> {
        let id: ObjectId = object_id.parse().map_err(|error| {
            errors::other(
                py,
                "ObjectError",
                format!("bad object id {object_id:?}: {error}"),
            )
        })?;
        let bytes = self.block(py, self.client.get(id))?;
        py.detach(|| std::fs::write(&destination, &bytes))
            .map_err(|error| {
                errors::other(
                    py,
                    "ObjectError",
                    format!("cannot write {}: {error}", destination.display()),
                )
            })
    }

    /// Closes the connection.
    fn close(&self, py: Python<'_>) {
        py.detach(|| self.runtime.block_on(self.client.close()));
    }
}
