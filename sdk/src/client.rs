//! The driver API: a connection to a head and typed requests over it.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use xp_runtime::ids::{BlobHash, ExperimentId, NodeId, ObjectId, TrialId};
use xp_runtime::join::{JoinString, JoinStringError};
use xp_runtime::object_wire::ObjectClientError;
use xp_runtime::protocol::{
    AdminAction, AdminRequest, AuditEntry, CheckpointCursor, CheckpointStatus, CheckpointsPage,
    ErrorCode, ExperimentState, ExperimentStatus, LogChunk, LogRequest, MAX_CHECKPOINTS_PER_PAGE,
    MetricPoint, MetricsPage, NodeStatus, PeerRole, QueueStatus, Request, Response, StatusCursor,
    StatusPage, StatusQuery, SubmitRequest, TrialEvent, TrialState,
};
use xp_runtime::spec::{Algorithm, Domain, ExperimentSpec, ParamValue, SearchSpec, TrialSpec};
use xp_runtime::transport::{self, HeadConnection, QuicSetupError, TransportError};

use crate::versioning::{VersionError, code_version, data_version};

pub use pipelines::PipelineSubmitted;

/// Why a driver request failed.
#[derive(Debug, thiserror::Error)]
pub enum SdkError {
    /// The join string is malformed.
    #[error(transparent)]
    JoinString(#[from] JoinStringError),
    /// The head could not be reached, refused us, or answered with an error.
    #[error(transparent)]
    Transport(#[from] TransportError),
    /// The code or data version could not be computed.
    #[error(transparent)]
    Version(#[from] VersionError),
    /// The spec is invalid.
    #[error(transparent)]
    Spec(#[from] xp_runtime::spec::SpecError),
    /// The driver binary could not be read.
    #[error("cannot read the program {path}: {source}")]
    Program {
        /// The binary.
        path: PathBuf,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// A trial's `entry` names a Rust trainable, but no program that has it
    /// is named, and this process is not such a driver.
    #[error(
        "trial.entry `{entry}` names a trainable of a Rust driver program, and {why}: add `program: PATH` to the trial (a binary built with the xp SDK that registers `{entry}`), or submit from that driver (its `main` calls `Trainables::run_if_worker` first)"
    )]
    EntryWithoutProgram {
        /// The entry.
        entry: String,
        /// What this process is.
        why: String,
    },
    /// The head answered something unexpected.
    #[error("unexpected answer from the head: {0}")]
    Unexpected(String),
    /// An object could not be stored, found or fetched: why, for each node
    /// that was tried.
    #[error("object: {0}")]
    Object(String),
    /// The link to the nodes' object servers could not be set up.
    #[error("object: cannot set up the link to the object servers")]
    ObjectLink(#[source] QuicSetupError),
    /// A node did not release this connection's claim on an object.
    #[error("object: node {node} cannot release object {object}")]
    ObjectRelease {
        /// The node.
        node: NodeId,
        /// The object.
        object: ObjectId,
        /// The cause (boxed: it is large, and rare).
        #[source]
        source: Box<ObjectClientError>,
    },
}

/// This very binary, when it is a driver that registers `entry` (its
/// `Trainables::run_if_worker` ran): nodes run it with `XP_ENTRY=entry`.
/// Anything else (the `xp` CLI, a Python interpreter, a driver without that
/// trainable) would be shipped to the nodes only to fail there.
fn this_driver_for(entry: &str) -> Result<PathBuf, SdkError> {
    let refuse = |why: String| SdkError::EntryWithoutProgram {
        entry: entry.to_owned(),
        why,
    };
    let Some(names) = crate::worker::registered_trainables() else {
        return Err(refuse("this program is no xp driver".to_owned()));
    };
    if !names.contains(entry) {
        let known: Vec<&str> = names.iter().map(String::as_str).collect();
        return Err(refuse(format!(
            "this driver has no trainable of that name (it has: {})",
            known.join(", ")
        )));
    }
    std::env::current_exe().map_err(|source| SdkError::Program {
        path: "current executable".into(),
        source,
    })
}

/// The largest object [`Client::get`] accepts.
const MAX_GET_BYTES: u64 = 16 << 30;

/// How to submit.
#[derive(Debug, Clone, Default)]
pub struct SubmitOptions {
    /// Run again even if an identical experiment finished.
    pub rerun: bool,
    /// The directory `code`, `data` and `program` paths, and a command's
    /// relative paths (`trial.command_dir`), are relative to (the spec file's
    /// directory); the current directory when absent.
    pub base_dir: Option<PathBuf>,
    /// How long to keep retrying while the head refuses because the team has too
    /// many pending trials (backing off exponentially, with jitter); `None` waits
    /// [`DEFAULT_ADMISSION_WAIT`].
    pub admission_wait: Option<Duration>,
}

/// The metric reports [`Client::metrics`] asks for a page: the most the
/// head sends in one.
const METRICS_PER_PAGE: u32 = 10_000;

/// How long a submission keeps retrying a busy head by default.
pub const DEFAULT_ADMISSION_WAIT: Duration = Duration::from_secs(3600);
/// The longest pause between two retries of a refused submission.
const MAX_ADMISSION_BACKOFF: Duration = Duration::from_secs(60);

/// The head's answer to a submission.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Submitted {
    /// The experiment id.
    pub experiment: ExperimentId,
    /// Whether an identical finished experiment was reused.
    pub reused: bool,
    /// How many trials it has.
    pub trials: u32,
}

/// One row of [`Client::results`].
#[derive(Debug, Clone, PartialEq)]
pub struct ResultRow {
    /// The trial.
    pub trial: TrialId,
    /// Its state.
    pub state: TrialState,
    /// Its parameters and seed.
    pub config: serde_json::Map<String, serde_json::Value>,
    /// The last value of each metric.
    pub metrics: BTreeMap<String, f64>,
}

/// A driver's connection to a head.
#[derive(Debug, Clone)]
pub struct Client {
    connection: HeadConnection,
    /// Links to the nodes' object servers, made on first use.
    objects: std::sync::Arc<objects::ObjectLink>,
    /// The name this connection's objects are stored under, once it stored one.
    session: std::sync::Arc<std::sync::OnceLock<String>>,
}

macro_rules! expect_response {
    ($response:expr, $pattern:pat => $value:expr) => {
        match $response {
            $pattern => Ok($value),
            other => Err(SdkError::Unexpected(format!("{other:?}"))),
        }
    };
}

// After the macro, which they use.
mod objects;
mod pipelines;

impl Client {
    /// Connects to the head named by `join` and authenticates.
    pub async fn connect(join: &str) -> Result<Self, SdkError> {
        let join: JoinString = join.parse()?;
        Self::connect_to(&join).await
    }

    /// Connects to the head named by a parsed join string.
    pub async fn connect_to(join: &JoinString) -> Result<Self, SdkError> {
        let agent = format!("xp-sdk {}", env!("CARGO_PKG_VERSION"));
        let (connection, mut send, _recv) =
            transport::connect(join, PeerRole::Client, &agent).await?;
        let _ = send.finish();
        Ok(Self {
            connection,
            objects: std::sync::Arc::default(),
            session: std::sync::Arc::default(),
        })
    }

    async fn request(&self, request: Request) -> Result<Response, SdkError> {
        Ok(self.connection.request(request).await?)
    }

    /// Submits `spec`, computing its code and data versions and uploading the
    /// driver binary for `entry` trials (the spec's `program`, or this very binary).
    pub async fn submit(
        &self,
        spec: &ExperimentSpec,
        options: &SubmitOptions,
    ) -> Result<Submitted, SdkError> {
        spec.validate()?;
        let base = match &options.base_dir {
            Some(base) => base.clone(),
            None => std::env::current_dir().map_err(|source| SdkError::Program {
                path: ".".into(),
                source,
            })?,
        };
        let code = match &spec.code {
            Some(dir) => code_version(&base.join(dir))?,
            None => "none".to_owned(),
        };
        let data = data_version(&base, &spec.data)?;
        // Workers run in their own directories: a command's relative paths
        // are found where it was submitted from.
        let mut spec = spec.clone();
        let absolute_base = std::path::absolute(&base).unwrap_or_else(|_| base.clone());
        spec.trial.fill_command_dir(&absolute_base);
        let program = match &spec.trial.entry {
            Some(_) => {
                let path = match &spec.trial.program {
                    Some(path) => base.join(path),
                    None => this_driver_for(spec.trial.entry.as_deref().unwrap_or_default())?,
                };
                Some(self.upload_program(&path).await?)
            }
            None => None,
        };
        let request = SubmitRequest {
            spec_json: spec.to_canonical_json(),
            program,
            code_version: code,
            data_version: data,
            rerun: options.rerun,
        };
        let patience = options.admission_wait.unwrap_or(DEFAULT_ADMISSION_WAIT);
        let started = tokio::time::Instant::now();
        let mut backoff = Duration::from_secs(1);
        loop {
            match self.request(Request::Submit(request.clone())).await {
                Err(SdkError::Transport(TransportError::Remote(refusal)))
                    if refusal.code == ErrorCode::TooManyPending
                        && started.elapsed() < patience =>
                {
                    // Slow down rather than fail: wait at least what the head asks,
                    // growing, with jitter so that many drivers do not return at once.
                    let asked = Duration::from_millis(refusal.retry_after_ms.unwrap_or(1000));
                    let jitter = rand::random_range(0.5..1.5);
                    let pause = asked.max(backoff).mul_f64(jitter);
                    tracing::info!(message = %refusal.message, ?pause, "the head is busy; retrying the submission");
                    tokio::time::sleep(pause).await;
                    backoff = (backoff * 2).min(MAX_ADMISSION_BACKOFF);
                }
                result => {
                    return expect_response!(result?,
                        Response::Submitted { experiment, reused, trials } => Submitted { experiment, reused, trials });
                }
            }
        }
    }

    /// The scheduling queues and their standing.
    pub async fn queues(&self) -> Result<Vec<QueueStatus>, SdkError> {
        expect_response!(self.request(Request::Queues).await?, Response::Queues(list) => list)
    }

    /// Every lease with its holders and waiters, the preemptions waiting for an
    /// admin's approval, and the conflict odds of leases and GPU models.
    pub async fn leases(&self) -> Result<xp_runtime::protocol::LeaseReport, SdkError> {
        expect_response!(self.request(Request::Leases).await?, Response::Leases(report) => report)
    }

    /// The alerts of `experiment` (an id, unique prefix or name), or of every
    /// experiment this credential sees, newest first (at most
    /// [`xp_runtime::protocol::MAX_ALERTS_LISTED`]).
    pub async fn alerts(
        &self,
        experiment: Option<&str>,
    ) -> Result<Vec<xp_runtime::protocol::AlertStatus>, SdkError> {
        let experiment = experiment.map(str::to_owned);
        expect_response!(
            self.request(Request::Alerts { experiment }).await?,
            Response::Alerts(list) => list
        )
    }

    /// The checkpoints kept for the trials of `experiment` (an id, unique
    /// prefix or name), read page by page ([`Client::checkpoints_page`]).
    pub async fn checkpoints(&self, experiment: &str) -> Result<Vec<CheckpointStatus>, SdkError> {
        let mut checkpoints = Vec::new();
        let mut after = None;
        loop {
            let page = self
                .checkpoints_page(experiment, after, MAX_CHECKPOINTS_PER_PAGE)
                .await?;
            checkpoints.extend(page.checkpoints);
            match page.next {
                Some(next) => after = Some(next),
                None => return Ok(checkpoints),
            }
        }
    }

    /// One page of the checkpoints kept for the trials of `experiment`, in
    /// the order of trial, attempt and step: at most `limit` (the head sends
    /// at most 1,000, about 4 MiB) after `after` (the `next` of the page
    /// before; `None`: from the first).
    pub async fn checkpoints_page(
        &self,
        experiment: &str,
        after: Option<CheckpointCursor>,
        limit: u32,
    ) -> Result<CheckpointsPage, SdkError> {
        let experiment = experiment.to_owned();
        expect_response!(
            self.request(Request::Checkpoints { experiment, after, limit }).await?,
            Response::CheckpointsPage(page) => page
        )
    }

    /// An admin action, recorded with the authenticated user and `why`; returns
    /// how many trials it touched and what it did.
    pub async fn admin(&self, action: AdminAction, why: &str) -> Result<(u32, String), SdkError> {
        // The head records the user this connection authenticated as.
        let request = AdminRequest {
            action,
            who: String::new(),
            why: why.to_owned(),
        };
        expect_response!(self.request(Request::Admin(request)).await?,
            Response::Admin { trials, message } => (trials, message))
    }

    /// The newest `limit` entries of the head's audit trail (admins only).
    pub async fn audit(&self, limit: u32) -> Result<Vec<AuditEntry>, SdkError> {
        expect_response!(self.request(Request::Audit { limit }).await?,
            Response::Audit(entries) => entries)
    }

    /// GPU-hours, cost, utilisation, Little's law, the return on GPU-hours and
    /// Amdahl fits for one experiment, one team or (admins) the whole cluster.
    pub async fn report(
        &self,
        request: xp_runtime::protocol::ReportRequest,
    ) -> Result<xp_runtime::report::UsageReport, SdkError> {
        expect_response!(self.request(Request::Report(request)).await?,
            Response::Report(report) => *report)
    }

    async fn upload_program(&self, path: &Path) -> Result<BlobHash, SdkError> {
        let bytes = tokio::fs::read(path)
            .await
            .map_err(|source| SdkError::Program {
                path: path.to_owned(),
                source,
            })?;
        let hash = BlobHash::of(&bytes);
        self.connection.put_blob(hash, &bytes).await?;
        Ok(hash)
    }

    /// Experiments (one, by id or unique prefix, or all) with their trials,
    /// gathered from the head's pages (each a bounded answer), in id order.
    pub async fn status(
        &self,
        experiment: Option<&str>,
    ) -> Result<Vec<ExperimentStatus>, SdkError> {
        let mut whole = Vec::new();
        let mut from = None;
        loop {
            let page = self.status_page(experiment, from).await?;
            from = page.next;
            page.merge_into(&mut whole);
            if from.is_none() {
                return Ok(whole);
            }
        }
    }

    /// One page of [`Client::status`], from `from` (the previous page's
    /// `next`; the beginning when `None`): experiments in id order, the first
    /// continuing the previous page's last when the cursor fell inside it
    /// (see [`StatusPage::merge_into`]).
    pub async fn status_page(
        &self,
        experiment: Option<&str>,
        from: Option<StatusCursor>,
    ) -> Result<StatusPage, SdkError> {
        let query = StatusQuery {
            experiment: experiment.map(str::to_owned),
            from,
        };
        expect_response!(self.request(Request::StatusPage(query)).await?,
            Response::StatusPage(page) => page)
    }

    /// One experiment.
    pub async fn experiment(&self, experiment: ExperimentId) -> Result<ExperimentStatus, SdkError> {
        let mut list = self.status(Some(&experiment.to_string())).await?;
        list.pop()
            .ok_or_else(|| SdkError::Unexpected(format!("no status for {experiment}")))
    }

    /// Cancels an experiment or a trial; returns how many trials it stopped.
    pub async fn cancel(&self, id: &str) -> Result<u32, SdkError> {
        expect_response!(self.request(Request::Cancel { id: id.to_owned() }).await?, Response::Cancelled { trials } => trials)
    }

    /// The nodes.
    pub async fn nodes(&self) -> Result<Vec<NodeStatus>, SdkError> {
        expect_response!(self.request(Request::Nodes).await?, Response::Nodes(list) => list)
    }

    /// A chunk of one worker's output.
    pub async fn logs(
        &self,
        trial: TrialId,
        rank: u32,
        attempt: Option<u32>,
        offset: u64,
    ) -> Result<LogChunk, SdkError> {
        let request = LogRequest {
            trial,
            rank,
            attempt,
            offset,
            max_bytes: 1 << 20,
        };
        expect_response!(self.request(Request::ReadLogs(request)).await?, Response::Logs(chunk) => chunk)
    }

    /// Every metric report of a trial, oldest first, read a page at a time.
    pub async fn metrics(&self, trial: TrialId) -> Result<Vec<MetricPoint>, SdkError> {
        let mut points = Vec::new();
        let mut after = None;
        loop {
            let page = self.metrics_page(trial, after, METRICS_PER_PAGE).await?;
            points.extend(page.points);
            match page.next {
                Some(next) => after = Some(next),
                None => return Ok(points),
            }
        }
    }

    /// One page of a trial's metric history, oldest first: at most `limit`
    /// reports (the head sends at most 10,000, about 4 MiB) after report
    /// `after` (the `next` of the page before; `None`: from the first).
    pub async fn metrics_page(
        &self,
        trial: TrialId,
        after: Option<u64>,
        limit: u32,
    ) -> Result<MetricsPage, SdkError> {
        expect_response!(self.request(Request::Metrics { trial, after, limit }).await?, Response::Metrics(page) => page)
    }

    /// A trial's resource telemetry, per rank, downsampled (oldest window first).
    pub async fn telemetry(
        &self,
        trial: TrialId,
    ) -> Result<xp_runtime::protocol::TrialTelemetry, SdkError> {
        expect_response!(self.request(Request::Telemetry { trial }).await?, Response::Telemetry(telemetry) => telemetry)
    }

    /// Events after `after`, waiting up to `wait` for the first.
    pub async fn events(
        &self,
        experiment: ExperimentId,
        after: u64,
        wait: Duration,
    ) -> Result<Vec<TrialEvent>, SdkError> {
        let wait_ms = u32::try_from(wait.as_millis()).unwrap_or(u32::MAX);
        expect_response!(self.request(Request::Events { experiment, after, wait_ms }).await?, Response::Events(events) => events)
    }

    /// The newest `limit` events of one trial (at most 1,000), oldest first.
    pub async fn trial_events(
        &self,
        trial: TrialId,
        limit: u32,
    ) -> Result<Vec<TrialEvent>, SdkError> {
        expect_response!(self.request(Request::TrialEvents { trial, limit }).await?, Response::Events(events) => events)
    }

    /// The checkpoints the head keeps for one trial, oldest first.
    pub async fn trial_checkpoints(
        &self,
        trial: TrialId,
    ) -> Result<Vec<CheckpointStatus>, SdkError> {
        expect_response!(self.request(Request::TrialCheckpoints { trial }).await?, Response::Checkpoints(list) => list)
    }

    /// Follows the experiment's events until it is no longer running, then returns its status.
    pub async fn wait(
        &self,
        experiment: ExperimentId,
        mut on_event: impl FnMut(&TrialEvent),
    ) -> Result<ExperimentStatus, SdkError> {
        let mut after = 0;
        loop {
            let status = self.experiment(experiment).await?;
            if status.state != ExperimentState::Running {
                // Deliver what is left, then stop.
                loop {
                    let events = self.events(experiment, after, Duration::ZERO).await?;
                    if events.is_empty() {
                        return Ok(status);
                    }
                    for event in events {
                        after = after.max(event.seq);
                        on_event(&event);
                    }
                }
            }
            for event in self.events_while_running(experiment, after).await? {
                after = after.max(event.seq);
                on_event(&event);
            }
        }
    }

    /// The events after `after` of a running experiment, waiting up to 2 s for
    /// the first. A head whose store is out (it reads events from there)
    /// answers none after a pause: it stores nothing new meanwhile, and the
    /// feed goes on from `after` once the store is back.
    async fn events_while_running(
        &self,
        experiment: ExperimentId,
        after: u64,
    ) -> Result<Vec<TrialEvent>, SdkError> {
        match self.events(experiment, after, Duration::from_secs(2)).await {
            Err(SdkError::Transport(TransportError::Remote(refusal)))
                if refusal.code == ErrorCode::StorageUnavailable =>
            {
                tracing::info!(message = %refusal.message, "the head cannot read events now; waiting");
                tokio::time::sleep(Duration::from_secs(2)).await;
                Ok(Vec::new())
            }
            answer => answer,
        }
    }

    /// Runs one trial of `trial` with fixed `params` as an experiment of its own
    /// named `name`, and returns the trial's id.
    pub async fn spawn_trial(
        &self,
        name: &str,
        trial: TrialSpec,
        params: BTreeMap<String, ParamValue>,
    ) -> Result<TrialId, SdkError> {
        let space = params
            .into_iter()
            .map(|(param, value)| (param, Domain::Choice(vec![value])))
            .collect();
        let spec = ExperimentSpec {
            name: name.to_owned(),
            team: "default".to_owned(),
            priority: Default::default(),
            queue: None,
            checkpoints: None,
            alerts: Vec::new(),
            code: None,
            data: Vec::new(),
            trial,
            search: SearchSpec {
                algorithm: Algorithm::Grid,
                space,
                ..SearchSpec::default()
            },
        };
        let submitted = self
            .submit(
                &spec,
                &SubmitOptions {
                    rerun: true,
                    ..SubmitOptions::default()
                },
            )
            .await?;
        Ok(TrialId {
            experiment: submitted.experiment,
            index: 0,
        })
    }

    /// The experiment's trials as a results table, best first by its metric
    /// (trials without the metric last).
    pub async fn results(&self, experiment: ExperimentId) -> Result<Vec<ResultRow>, SdkError> {
        let status = self.experiment(experiment).await?;
        let mut rows: Vec<ResultRow> = status
            .trials
            .iter()
            .map(|trial| ResultRow {
                trial: trial.id,
                state: trial.state,
                config: serde_json::from_str(&trial.config_json).unwrap_or_default(),
                metrics: trial.metrics.clone(),
            })
            .collect();
        if let Some(metric) = &status.metric {
            let key = |row: &ResultRow| {
                row.metrics
                    .get(metric)
                    .copied()
                    .filter(|value| value.is_finite())
            };
            rows.sort_by(|a, b| match (key(a), key(b)) {
                (Some(x), Some(y)) if status.maximize => y.total_cmp(&x),
                (Some(x), Some(y)) => x.total_cmp(&y),
                (Some(_), None) => std::cmp::Ordering::Less,
                (None, Some(_)) => std::cmp::Ordering::Greater,
                (None, None) => std::cmp::Ordering::Equal,
            });
        }
        Ok(rows)
    }

    /// Closes the connection.
    pub async fn close(&self) {
        self.connection.close().await;
    }
}
