//! What the HTTP API reads from the actor: the pages, the dashboard's
//! queries, telemetry, pipelines, leases, reports and `/metrics`' snapshot,
//! each answered at once from the core (and, for history, the database),
//! filtered to what the caller's [`Visibility`] shows.
//!
//! Not here: what QUIC clients ask (`client`, through the core's request
//! table); these reads have no wire request of their own.

use ractor::ActorRef;
use xp_head_core::auth::Visibility;
use xp_head_core::metrics::MetricsSnapshot;
use xp_head_core::pages::{
    self, ExperimentCursor, ExperimentSummary, MetricCursor, NodeCursor, Page, PageError,
    QueueCursor, TrialQuery,
};
use xp_runtime::clock::UnixMillis;
use xp_runtime::ids::{ExperimentId, TrialId};
use xp_runtime::protocol::{
    MetricPoint, NodeStatus, QueueStatus, RemoteError, Response, TrialStatus, TrialTelemetry,
};

use super::{DashboardQuery, HeadMsg, HeadState, Reply, client, dashboard};

/// One read of the HTTP API, with where its answer goes.
#[derive(Debug)]
pub(crate) enum Read {
    /// The HTTP API reads one pipeline or lists them.
    Pipelines {
        /// One pipeline; every one the caller sees when absent.
        pipeline: Option<u64>,
        /// Which teams' pipelines the caller sees.
        visibility: Visibility,
        /// The pipelines.
        reply: Reply<Vec<xp_runtime::protocol::PipelineStatus>>,
    },
    /// The HTTP API lists the leases, pending approvals and conflict odds.
    Leases {
        /// The teams whose trials the caller sees.
        visibility: Visibility,
        /// The report.
        reply: Reply<Response>,
    },
    /// The HTTP API asks for a page of experiment summaries, newest first.
    ExperimentsPage {
        /// Items wanted.
        limit: usize,
        /// Where the listing continues.
        cursor: Option<ExperimentCursor>,
        /// Which teams the caller may see.
        visibility: Visibility,
        /// The page.
        reply: Reply<Page<ExperimentSummary>>,
    },
    /// The HTTP API asks for one experiment's summary.
    ExperimentSummary {
        /// The experiment.
        experiment: ExperimentId,
        /// Which teams the caller may see.
        visibility: Visibility,
        /// The summary.
        reply: Reply<Result<ExperimentSummary, PageError>>,
    },
    /// The HTTP API asks for a page of an experiment's trials.
    TrialsPage {
        /// The experiment.
        experiment: ExperimentId,
        /// Which trials, in what order, from where.
        query: TrialQuery,
        /// Which teams the caller may see.
        visibility: Visibility,
        /// The page.
        reply: Reply<Result<Page<TrialStatus>, PageError>>,
    },
    /// The HTTP API asks for a page of a trial's metric history.
    MetricsPage {
        /// The trial.
        trial: TrialId,
        /// Items wanted.
        limit: usize,
        /// Where the listing continues.
        cursor: Option<MetricCursor>,
        /// Which teams the caller may see.
        visibility: Visibility,
        /// The page.
        reply: Reply<Result<Page<MetricPoint>, PageError>>,
    },
    /// The HTTP API asks for a page of nodes.
    NodesPage {
        /// Items wanted.
        limit: usize,
        /// Where the listing continues.
        cursor: Option<NodeCursor>,
        /// The page.
        reply: Reply<Page<NodeStatus>>,
    },
    /// The HTTP API asks for a page of queues.
    QueuesPage {
        /// Items wanted.
        limit: usize,
        /// Where the listing continues.
        cursor: Option<QueueCursor>,
        /// Which teams the caller may see.
        visibility: Visibility,
        /// The page.
        reply: Reply<Page<QueueStatus>>,
    },
    /// `GET /api/report`, for a caller who sees `visible`.
    Report {
        /// The scope and window.
        request: xp_runtime::protocol::ReportRequest,
        /// The teams the caller sees.
        visible: Visibility,
        /// The report.
        reply: Reply<Response>,
    },
    /// `/metrics` asks for the state its gauges show.
    MetricsSnapshot(Reply<MetricsSnapshot>),
    /// The blob collector asks which driver binaries unfinished experiments run.
    BlobsInUse(Reply<std::collections::BTreeSet<xp_runtime::ids::BlobHash>>),
    /// The web dashboard asks for what the API's pages do not hold
    /// (`http::dashboard::api`), answered from `dashboard`.
    Dashboard {
        /// What.
        query: DashboardQuery,
        /// Which teams the caller may see.
        visibility: Visibility,
        /// The answer, as the dashboard's JSON.
        reply: Reply<Result<serde_json::Value, PageError>>,
    },
    /// The dashboard asks for what the cluster page's history reads, which it
    /// computes itself, off the actor.
    ClusterSnapshot {
        /// From when; the earliest submission when `None`.
        since: Option<UnixMillis>,
        /// How many buckets.
        buckets: usize,
        /// Which teams the caller may see.
        visibility: Visibility,
        /// The snapshot.
        reply: Reply<xp_head_core::dashboard::ClusterSnapshot>,
    },
    /// The dashboard asks for what its queue page's choice of the longest
    /// waiting trials reads, which it makes itself, off the actor.
    WaitingSnapshot {
        /// Which teams the caller may see.
        visibility: Visibility,
        /// The snapshot.
        reply: Reply<xp_head_core::dashboard::WaitingSnapshot>,
    },
    /// The dashboard asks for an experiment's parameters and finished trials,
    /// whose importance it computes itself, off the actor.
    Parameters {
        /// The experiment.
        experiment: ExperimentId,
        /// The metric, or the experiment's.
        metric: Option<String>,
        /// Which teams the caller may see.
        visibility: Visibility,
        /// The parameters and trials.
        reply: Reply<Result<xp_head_core::dashboard::ParameterStudy, PageError>>,
    },
    /// A trial's telemetry, per rank (QUIC callers are authorized before and
    /// see every team).
    Telemetry {
        /// The trial.
        trial: TrialId,
        /// Which teams the caller may see.
        visibility: Visibility,
        /// The series.
        reply: Reply<Result<TrialTelemetry, PageError>>,
    },
}

impl Read {
    /// Whether whoever asked has stopped waiting for the answer.
    pub(super) fn caller_gave_up(&self) -> bool {
        match self {
            Self::Pipelines { reply, .. } => reply.is_closed(),
            Self::Leases { reply, .. } => reply.is_closed(),
            Self::ExperimentsPage { reply, .. } => reply.is_closed(),
            Self::ExperimentSummary { reply, .. } => reply.is_closed(),
            Self::TrialsPage { reply, .. } => reply.is_closed(),
            Self::MetricsPage { reply, .. } => reply.is_closed(),
            Self::NodesPage { reply, .. } => reply.is_closed(),
            Self::QueuesPage { reply, .. } => reply.is_closed(),
            Self::Report { reply, .. } => reply.is_closed(),
            Self::MetricsSnapshot(reply) => reply.is_closed(),
            Self::BlobsInUse(reply) => reply.is_closed(),
            Self::Dashboard { reply, .. } => reply.is_closed(),
            Self::ClusterSnapshot { reply, .. } => reply.is_closed(),
            Self::WaitingSnapshot { reply, .. } => reply.is_closed(),
            Self::Parameters { reply, .. } => reply.is_closed(),
            Self::Telemetry { reply, .. } => reply.is_closed(),
        }
    }
}

/// Sends an answer; a caller that gave up is no one's concern.
fn answer<T>(reply: Reply<T>, result: Result<T, RemoteError>) {
    let _ = reply.send(result);
}

impl HeadState {
    /// Answers one read.
    pub(super) fn answer_read(&mut self, now: UnixMillis, myself: &ActorRef<HeadMsg>, read: Read) {
        let core = &self.args.core;
        match read {
            Read::Pipelines {
                pipeline,
                visibility,
                reply,
            } => answer(
                reply,
                core.pipelines_status(now, pipeline, &|team| visibility.shows(team))
                    .map_err(RemoteError::from),
            ),
            Read::Leases { visibility, reply } => answer(
                reply,
                Ok(Response::Leases(
                    core.lease_report(&|team| visibility.shows(team)),
                )),
            ),
            Read::ExperimentsPage {
                limit,
                cursor,
                visibility,
                reply,
            } => answer(
                reply,
                Ok(core.experiments_page(limit, cursor, &|team| visibility.shows(team))),
            ),
            Read::ExperimentSummary {
                experiment,
                visibility,
                reply,
            } => answer(
                reply,
                Ok(core.experiment_summary_of(experiment, &|team| visibility.shows(team))),
            ),
            Read::TrialsPage {
                experiment,
                query,
                visibility,
                reply,
            } => answer(
                reply,
                Ok(core.trials_page(experiment, &query, &|team| visibility.shows(team))),
            ),
            Read::MetricsPage {
                trial,
                limit,
                cursor,
                visibility,
                reply,
            } => self.metrics_page(trial, limit, cursor, &visibility, reply),
            Read::NodesPage {
                limit,
                cursor,
                reply,
            } => answer(reply, Ok(core.nodes_page(limit, cursor))),
            Read::QueuesPage {
                limit,
                cursor,
                visibility,
                reply,
            } => answer(
                reply,
                Ok(core.queues_page(limit, cursor.as_ref(), &|team| visibility.shows(team))),
            ),
            Read::Report {
                request,
                visible,
                reply,
            } => self.report_cached(
                now,
                myself,
                &request,
                &visible,
                Box::new(move |answered| answer(reply, answered)),
            ),
            Read::MetricsSnapshot(reply) => answer(reply, Ok(core.metrics_snapshot())),
            Read::BlobsInUse(reply) => answer(reply, Ok(core.blobs_in_use())),
            Read::Dashboard {
                query,
                visibility,
                reply,
            } => self.dashboard(now, query, &visibility, reply),
            Read::ClusterSnapshot {
                since,
                buckets,
                visibility,
                reply,
            } => answer(
                reply,
                Ok(core.cluster_snapshot(now, since, buckets, &|team| visibility.shows(team))),
            ),
            Read::WaitingSnapshot { visibility, reply } => answer(
                reply,
                Ok(core.waiting_snapshot(&|team| visibility.shows(team))),
            ),
            Read::Parameters {
                experiment,
                metric,
                visibility,
                reply,
            } => answer(
                reply,
                Ok(
                    core.parameter_study(experiment, metric.as_deref(), &|team| {
                        visibility.shows(team)
                    }),
                ),
            ),
            Read::Telemetry {
                trial,
                visibility,
                reply,
            } => self.telemetry(trial, &visibility, reply),
        }
    }

    /// A dashboard query; a trial's events and curves are read off the
    /// actor.
    fn dashboard(
        &self,
        now: UnixMillis,
        query: DashboardQuery,
        visibility: &Visibility,
        reply: Reply<Result<serde_json::Value, PageError>>,
    ) {
        match dashboard::answer(&self.args.core, now, query, visibility) {
            dashboard::Answered::Now(answered) => answer(reply, Ok(answered)),
            dashboard::Answered::Reading(read) => {
                self.read_history("its history", reply, move |reader| Ok(Ok(read(reader))));
            }
        }
    }

    /// A trial's telemetry, read off the actor; the trial must be one the
    /// caller may see.
    fn telemetry(
        &self,
        trial: TrialId,
        visibility: &Visibility,
        reply: Reply<Result<TrialTelemetry, PageError>>,
    ) {
        if let Err(error) = self
            .args
            .core
            .check_trial_visible(trial, &|team| visibility.shows(team))
        {
            return answer(reply, Ok(Err(error)));
        }
        self.read_history("telemetry", reply, move |reader| {
            client::telemetry_of(reader, trial).map(Ok)
        });
    }

    /// A page of a trial's metric history, read off the actor; the trial
    /// must be one the caller may see.
    fn metrics_page(
        &self,
        trial: TrialId,
        limit: usize,
        cursor: Option<MetricCursor>,
        visibility: &Visibility,
        reply: Reply<Result<Page<MetricPoint>, PageError>>,
    ) {
        if let Err(error) = self
            .args
            .core
            .check_trial_visible(trial, &|team| visibility.shows(team))
        {
            return answer(reply, Ok(Err(error)));
        }
        let limit = limit.clamp(1, pages::MAX_LIMIT);
        let after = cursor.map(|MetricCursor(seq)| seq);
        self.read_history("metric history", reply, move |reader| {
            let page = reader
                .metrics_page(trial, after, limit, pages::MAX_PAGE_BYTES)
                .map_err(|error| client::stored_read_error(error, "metric history"))?;
            let next_cursor = page
                .more
                .then(|| {
                    page.records
                        .last()
                        .map(|(seq, _)| MetricCursor(*seq).encode())
                })
                .flatten();
            Ok(Ok(Page {
                items: page
                    .records
                    .into_iter()
                    .map(|(_, record)| MetricPoint::from(record))
                    .collect(),
                next_cursor,
                total: page.total,
            }))
        });
    }
}
