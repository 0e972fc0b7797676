//! Client requests, one file each: a file holds its request's access rule
//! (`access`: the action it takes and what it names, refused before anything
//! reads it when it is too large) and what the core does with it (`apply` for
//! a change, `read` otherwise).
//!
//! The shell's path for every request is the same: decode it, [`access`] and
//! [`admit`], resolve who asks and [`HeadCore::authorize`], then
//! [`HeadCore::serve`], and
//! encode what comes back. A change ([`changes`]) is answered only once what it
//! did is stored. What the core cannot answer by itself comes back as work for
//! the shell: a read of the stored history ([`StoredRead`], done by the actor,
//! which owns the database) or work on the connection or a node
//! ([`ConnectionWork`], done by the server task: bytes streamed, logs relayed,
//! waits), or a status answer to make ([`PendingStatus`], done off the actor).
//!
//! Adding a request: its variant in `xp_runtime::protocol`, its file here, and
//! one line in each of the matches below (`access`, `serve`, and `changes`
//! for a change).

mod admin;
mod alerts;
mod audit;
mod blobs;
mod cancel;
mod capability;
mod checkpoints;
mod events;
mod leases;
mod logs;
mod metrics;
mod nodes;
mod objects;
mod pipelines;
mod queues;
mod report;
mod status;
mod submit;
mod telemetry;

pub use self::blobs::{BlobLimits, BlobUsage};
pub use self::events::MAX_EVENTS_PER_ANSWER;
pub use self::metrics::MAX_METRICS_PER_PAGE;
pub use self::status::PendingStatus;

use xp_runtime::clock::UnixMillis;
use xp_runtime::ids::{BlobHash, ExperimentId, NodeId, TrialId, WorkerKey};
use xp_runtime::protocol::{LogRequest, ReportRequest, Request, Response};

use crate::auth::Visibility;
use crate::auth::access::{Access, Authorized};
use crate::pipelines::PipelineChange;
use crate::{CoreError, HeadCore};

/// What the core makes of an authorized request.
#[derive(Debug)]
pub enum Served {
    /// The answer.
    Answer(Response),
    /// The answer needs the stored history, which the core does not hold.
    Stored(StoredRead),
    /// The answer needs the connection or a node.
    Connection(ConnectionWork),
    /// The answer once its multi-objective experiments' fronts are computed,
    /// which the shell does off its actor.
    Status(Box<PendingStatus>),
}

/// A read of what the head stored, done by the shell that owns the database.
#[derive(Debug)]
pub enum StoredRead {
    /// A page of a trial's metric history (`xp metrics`).
    MetricHistory {
        /// The trial.
        trial: TrialId,
        /// Where the page starts: after this report.
        after: Option<u64>,
        /// At most this many (at most [`MAX_METRICS_PER_PAGE`]).
        limit: usize,
    },
    /// A trial's telemetry series, per rank.
    Telemetry(TrialId),
    /// An experiment's events after `after`, oldest first, at most
    /// [`MAX_EVENTS_PER_ANSWER`]; none and `wait_ms` > 0: a wait
    /// ([`ConnectionWork::AwaitEvents`]).
    Events {
        /// The experiment (it exists).
        experiment: ExperimentId,
        /// The newest event the asker has.
        after: u64,
        /// How long the asker waits for one.
        wait_ms: u32,
    },
    /// A trial's newest `limit` events, oldest first.
    TrialEvents {
        /// The trial (it exists).
        trial: TrialId,
        /// At most this many (at most [`MAX_EVENTS_PER_ANSWER`]).
        limit: usize,
    },
    /// The newest entries of the audit trail.
    Audit {
        /// At most this many (at least 1).
        limit: u32,
    },
    /// A usage report (`xp report`), with busy GPU-time from stored telemetry.
    Report {
        /// What was asked.
        request: ReportRequest,
        /// Which teams' work the asker sees.
        visible: Visibility,
    },
}

/// Work on the request's own connection, or with a node, done by the server.
#[derive(Debug)]
pub enum ConnectionWork {
    /// Receive a blob's bytes (a driver binary) after the request.
    ReceiveBlob {
        /// Its content hash.
        hash: BlobHash,
        /// Its length.
        len: u64,
        /// What the uploading user may keep ([`BlobLimits::check`]).
        limits: BlobLimits,
    },
    /// Send a stored blob's bytes after the answer.
    SendBlob {
        /// Its content hash.
        hash: BlobHash,
    },
    /// Relay a log read to the node that holds the log.
    RelayLogs {
        /// The node.
        node: NodeId,
        /// The worker.
        key: WorkerKey,
        /// Whether the worker has ended (its log is complete).
        ended: bool,
        /// What was asked.
        request: LogRequest,
    },
    /// Wait (bounded) for an event newer than `newest`, then ask again.
    AwaitEvents {
        /// The experiment.
        experiment: ExperimentId,
        /// The last event the asker has.
        after: u64,
        /// How long to wait at most, in milliseconds.
        wait_ms: u32,
        /// The newest event the core had when it found none for the asker.
        newest: u64,
    },
}

/// What `request` does and names.
pub fn access(request: &Request) -> Access {
    match request {
        Request::Submit(submit) => submit::access(submit),
        Request::Status { experiment } => status::access(experiment.as_deref()),
        Request::Cancel { id } => cancel::access(id),
        Request::ReadLogs(log) => logs::access(log),
        Request::Nodes => nodes::access(),
        Request::PutBlob { .. } => blobs::access_put(),
        Request::GetBlob { .. } => blobs::access_get(),
        Request::Events { experiment, .. } => events::access(*experiment),
        Request::Metrics { trial, .. } => metrics::access(*trial),
        Request::Queues => queues::access(),
        Request::Admin(admin) => admin::access(admin),
        Request::StoreTargets | Request::ObjectKey => objects::access_store(),
        Request::Locate { .. } => objects::access_locate(),
        Request::SharingDrivers { .. } => objects::access_sharing(),
        Request::Checkpoints { experiment, .. } => checkpoints::access(experiment),
        Request::Audit { .. } => audit::access(),
        Request::Telemetry { trial } => telemetry::access(*trial),
        Request::SubmitPipeline(submit) => pipelines::access_submit(submit),
        Request::PipelineStatus { pipeline } => pipelines::access_status(*pipeline),
        Request::CancelPipeline { pipeline } | Request::RetryPipeline { pipeline } => {
            pipelines::access_change(*pipeline)
        }
        Request::Alerts { experiment } => alerts::access(experiment.as_deref()),
        Request::Report(report) => report::access(report),
        Request::Leases => leases::access(),
        Request::StatusPage(query) => status::access(query.experiment.as_deref()),
        Request::ObjectCapability { .. } => capability::access(),
        Request::TrialEvents { trial, .. } => events::access_trial(*trial),
        Request::TrialCheckpoints { trial } => events::access_trial(*trial),
    }
}

/// Refuses, before anything resolves, logs or audits it, a request that
/// gives a name too long for that (`access`), or carries a spec larger than
/// the head reads.
pub fn admit(request: &Request, access: &Access) -> Result<(), CoreError> {
    access.check_lengths()?;
    match request {
        Request::Submit(submit) => submit::check_size(&submit.spec_json),
        _ => Ok(()),
    }
}

/// Whether `request` changes what the head stores: its answer waits until
/// the change is stored.
pub fn changes(request: &Request) -> bool {
    matches!(
        request,
        Request::Submit(_)
            | Request::Cancel { .. }
            | Request::Admin(_)
            | Request::SubmitPipeline(_)
            | Request::CancelPipeline { .. }
            | Request::RetryPipeline { .. }
    )
}

/// Whether `request` is a read whose cost grows with what the head keeps
/// (trials, history, reports): the shell lets each user have only a few of
/// these in the head at once, so one user's burst cannot keep the head from
/// everyone else. Waits (`Events`) and small answers are not heavy.
pub fn heavy(request: &Request) -> bool {
    matches!(
        request,
        Request::Status { .. }
            | Request::StatusPage(_)
            | Request::Metrics { .. }
            | Request::Checkpoints { .. }
            | Request::TrialCheckpoints { .. }
            | Request::Audit { .. }
            | Request::Telemetry { .. }
            | Request::Report(_)
            | Request::Alerts { .. }
            | Request::PipelineStatus { .. }
    )
}

/// Whether `request` needs its connection's driver session: what a driver
/// stores is kept while it is connected and shared with what it submitted.
pub fn names_session(request: &Request) -> bool {
    matches!(
        request,
        Request::Submit(_) | Request::StoreTargets | Request::ObjectCapability { .. }
    )
}

impl HeadCore {
    /// Serves an authorized request at `now`; `session` is the connection's
    /// driver session when the request names one ([`names_session`]).
    pub fn serve(
        &mut self,
        now: UnixMillis,
        asker: &Authorized,
        session: Option<&str>,
        request: Request,
    ) -> Result<Served, CoreError> {
        let answer = |response: Response| Served::Answer(response);
        Ok(match request {
            Request::Submit(submit) => answer(self.apply_submit(now, asker, session, submit)?),
            Request::Status { experiment } => self.read_status(asker, experiment)?,
            Request::Cancel { id } => answer(self.apply_cancel(now, asker, &id)?),
            Request::ReadLogs(log) => Served::Connection(self.read_logs(log)?),
            Request::Nodes => answer(self.read_nodes()),
            Request::PutBlob { hash, len } => self.receive_blob(hash, len),
            Request::GetBlob { hash } => blobs::send(hash),
            Request::Events {
                experiment,
                after,
                wait_ms,
            } => self.read_events(experiment, after, wait_ms)?,
            Request::Metrics {
                trial,
                after,
                limit,
            } => Served::Stored(self.read_metrics(trial, after, limit)?),
            Request::Queues => answer(self.read_queues()),
            Request::Admin(admin) => answer(self.apply_admin(now, asker, admin)?),
            Request::StoreTargets => answer(self.apply_store_targets(session)),
            Request::Locate { object } => answer(self.read_locate(object)),
            Request::SharingDrivers {
                experiment,
                sessions,
            } => answer(self.read_sharing_drivers(experiment, sessions)),
            Request::ObjectKey => return Err(CoreError::ObjectKeyRetired),
            Request::TrialCheckpoints { trial } => {
                answer(self.trial_checkpoints(trial).map(Response::Checkpoints)?)
            }
            Request::Checkpoints {
                experiment,
                after,
                limit,
            } => answer(self.read_checkpoints(asker, &experiment, after, limit)?),
            Request::Audit { limit } => Served::Stored(audit::read(limit)),
            Request::TrialEvents { trial, limit } => self.read_trial_events(trial, limit)?,
            Request::Telemetry { trial } => Served::Stored(self.read_telemetry(trial)?),
            Request::SubmitPipeline(submit) => {
                answer(self.apply_submit_pipeline(now, asker, submit)?)
            }
            Request::PipelineStatus { pipeline } => {
                answer(self.read_pipelines(now, asker, pipeline)?)
            }
            Request::CancelPipeline { pipeline } => {
                answer(self.handle_pipeline_change(now, PipelineChange::Cancel(pipeline))?)
            }
            Request::RetryPipeline { pipeline } => {
                answer(self.handle_pipeline_change(now, PipelineChange::Retry(pipeline))?)
            }
            Request::Alerts { experiment } => answer(self.read_alerts(asker, experiment)?),
            Request::Report(report) => Served::Stored(report::read(asker, report)),
            Request::Leases => answer(self.read_leases(asker)),
            Request::StatusPage(query) => self.read_status_page(asker, query)?,
            Request::ObjectCapability { objects } => {
                answer(self.apply_object_capability(now, asker, session, &objects)?)
            }
        })
    }
}

#[cfg(test)]
mod tests;
