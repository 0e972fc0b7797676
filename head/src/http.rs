//! The head's HTTP API: read-only JSON pages of experiments, trials, metric
//! histories, nodes and queues, `/metrics` for Prometheus, and `/healthz`;
//! it also serves the web dashboard's pages, assets and endpoints
//! (`dashboard`), under the same credential check and limits.
//!
//! Routes (every list is paged, see below):
//! - `GET /api/experiments?limit=&cursor=`: experiment summaries, newest first
//!   (state counts and the best trial, not the trials);
//! - `GET /api/experiments/{id}`: one experiment's summary;
//! - `GET /api/experiments/{id}/trials?limit=&cursor=&sort=&state=&metric=`: one
//!   page of its trials (`sort`: `id`, `-id`, `metric`, `-metric`; `state`: a
//!   comma-separated list of states; `metric`: what a metric sort sorts by,
//!   the experiment's metric by default); each trial in `xp status --json`'s shape;
//! - `GET /api/trials/{id}/metrics?limit=&cursor=`: a trial's metric reports in
//!   arrival order;
//! - `GET /api/nodes?limit=&cursor=`, `GET /api/queues?limit=&cursor=`;
//! - `GET /api/pipelines`: the newest 1,000 pipelines the caller sees, each
//!   in `xp pipeline status --json`'s shape (not paged: a pipeline is small
//!   and the list is cut at 1,000); `GET /api/pipelines/{id}`: one pipeline;
//! - `GET /metrics`: the head's metrics in the Prometheus text format
//!   (OpenMetrics when asked for), see `crate::metrics`.
//!
//! A page is `{"items": [...], "next_cursor": TEXT or null, "total": N,
//! "limit": L}`: `total` counts the whole listing with its filters, and a client
//! pages by handing `next_cursor` back as `cursor` until it is null. Cursors are
//! opaque and stable under inserts (the last item's key, not an offset).
//! `limit` is 1 to 1,000 (100 when absent). A bad parameter is answered 400 with
//! `{"error": ..., "parameter": NAME}`; an unknown one too, so a typo is not
//! silently ignored.
//!
//! Memory per request is bounded: a page holds at most `limit` items and ends
//! early past `core::pages::MAX_PAGE_BYTES`; the API serves at most
//! [`MAX_CONCURRENT_REQUESTS`] requests at once (others wait their turn, within
//! the timeout, holding only their parsed request); a request may wait and run
//! at most [`REQUEST_TIMEOUT`]; a request with a body or a query over
//! [`MAX_QUERY_BYTES`] is refused before any work.
//! Pages are built inside the head actor from its state (`core::pages`), which
//! walks only what the page needs; nothing clones a whole experiment.
//!
//! `/healthz` answers 200 `ok` only while the head actor runs and can store
//! changes; otherwise 503 with the reason (a full disk, say), so a supervisor or
//! load balancer sees a head that refuses work. It is outside the concurrency
//! limit, so a busy API does not look like a dead head.

use std::sync::Arc;
use std::time::Duration;

use axum::extract::rejection::{PathRejection, QueryRejection};
use axum::extract::{FromRequestParts, MatchedPath, Path, Query, Request, State};
use axum::http::request::Parts;
use axum::http::{StatusCode, header};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Json, Response};
use axum::routing::get;
use ractor::{ActorRef, ActorStatus};
use serde_json::{Value, json};
use tokio::sync::Semaphore;
use xp_runtime::ids::{ExperimentId, TrialId};
use xp_runtime::protocol::{ErrorCode, MetricPoint, RemoteError};
use xp_runtime::views::{node_json, trial_json};

use crate::actor::call;
use crate::actor::{HeadMsg, Read, Reply};
use crate::health::HealthWatch;
use crate::metrics::{Api, HeadMetrics, OPENMETRICS_TEXT, PROMETHEUS_TEXT};
use crate::sessions::Sessions;
use xp_head_core::auth::Visibility;
use xp_head_core::pages::{
    CursorError, DEFAULT_LIMIT, ExperimentCursor, ExperimentSummary, MAX_LIMIT, MetricCursor,
    NodeCursor, Page, PageError, QueueCursor, StateSet, TrialCursor, TrialQuery, TrialSort,
};

mod alerts;
pub(crate) mod auth;
pub(crate) mod dashboard;
mod report;

/// Requests the API serves at once; more wait for a turn. Each holds at most one
/// page while it is built and written, so this bounds the API's memory.
pub(crate) const MAX_CONCURRENT_REQUESTS: usize = 8;
/// The longest a request may wait for its turn and be served.
pub(crate) const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);
/// The longest query string the API reads.
pub(crate) const MAX_QUERY_BYTES: usize = 4096;
/// The longest metric name a trial listing may sort by.
const MAX_METRIC_NAME_BYTES: usize = 256;

/// What the handlers share.
#[derive(Clone)]
pub(crate) struct HttpState {
    pub(crate) head: ActorRef<HeadMsg>,
    health: HealthWatch,
    metrics: Arc<HeadMetrics>,
    /// The nodes' sessions, through which log reads reach the nodes.
    pub(crate) sessions: Sessions,
}

/// The router.
pub(crate) fn router(
    head: ActorRef<HeadMsg>,
    health: HealthWatch,
    counters: Arc<HeadMetrics>,
    sessions: Sessions,
) -> axum::Router {
    let state = HttpState {
        head,
        health,
        metrics: counters,
        sessions,
    };
    let api = axum::Router::new()
        .route("/metrics", get(prometheus))
        .route("/api/experiments", get(experiments))
        .route("/api/experiments/{id}", get(experiment))
        .route("/api/experiments/{id}/trials", get(trials))
        .route("/api/trials/{id}/metrics", get(metrics))
        .route("/api/trials/{id}/telemetry", get(telemetry))
        .route("/api/nodes", get(nodes))
        .route("/api/queues", get(queues))
        .route("/api/pipelines", get(pipelines))
        .route("/api/pipelines/{id}", get(pipeline))
        .route("/api/alerts", get(alerts::alerts))
        .route("/api/report", get(report::report))
        .merge(dashboard::api::routes())
        // Every API route needs a user's credential (see `auth`).
        .route_layer(middleware::from_fn_with_state(
            state.clone(),
            auth::require_user,
        ))
        // Outside the credential check, so refused requests are counted too;
        // a route layer, so the route (a bounded label) is known.
        .route_layer(middleware::from_fn_with_state(state.clone(), count_request))
        // One semaphore for every route. tower's `ConcurrencyLimit` waits for a
        // turn in `poll_ready`, before tower's `Timeout` starts its clock in
        // `call`, so together they would leave the wait unbounded; here one
        // timeout covers the wait and the work.
        .layer(middleware::from_fn_with_state(
            Arc::new(Semaphore::new(MAX_CONCURRENT_REQUESTS)),
            take_turn,
        ));
    axum::Router::new()
        .route("/healthz", get(healthz))
        .merge(api)
        .layer(middleware::from_fn(refuse_oversized))
        // The login form has a (small, bounded) body, so it is merged after
        // the refusal of bodies.
        .merge(auth::routes())
        // The dashboard's pages and assets, each behind the credential check.
        .merge(dashboard::routes(state.clone()))
        .layer(middleware::from_fn(dashboard::security_headers))
        .with_state(state)
}

async fn healthz(State(state): State<HttpState>) -> Response {
    let problem = match state.head.get_status() {
        ActorStatus::Running => state.health.borrow().problem(),
        status => Some(format!("the head actor is not running ({status:?})")),
    };
    match problem {
        None => "ok".into_response(),
        Some(problem) => (
            StatusCode::SERVICE_UNAVAILABLE,
            format!("unhealthy: {problem}\n"),
        )
            .into_response(),
    }
}

/// `GET /metrics`: the head's metrics for Prometheus (see `crate::metrics`):
/// OpenMetrics when the scraper asks for it, else Prometheus text.
async fn prometheus(
    State(state): State<HttpState>,
    headers: axum::http::HeaderMap,
) -> Result<Response, ApiError> {
    let snapshot = call(&state.head, |reply| {
        HeadMsg::Read(Read::MetricsSnapshot(reply))
    })
    .await?;
    let openmetrics = headers
        .get(header::ACCEPT)
        .and_then(|accept| accept.to_str().ok())
        .is_some_and(|accept| accept.contains("application/openmetrics-text"));
    let (content_type, body) = if openmetrics {
        (OPENMETRICS_TEXT, state.metrics.render(&snapshot, true))
    } else {
        (PROMETHEUS_TEXT, state.metrics.render(&snapshot, false))
    };
    Ok(([(header::CONTENT_TYPE, content_type)], body).into_response())
}

/// Counts a request by its route, and its status when it is an error.
async fn count_request(
    State(state): State<HttpState>,
    route: MatchedPath,
    request: Request,
    next: Next,
) -> Response {
    let response = next.run(request).await;
    let status = response.status();
    let error = (status.is_client_error() || status.is_server_error()).then(|| status.as_str());
    state.metrics.request(Api::Http, route.as_str(), error);
    response
}

/// Refuses, before any work, a request with a body (the API reads none) or an
/// overlong query string.
async fn refuse_oversized(request: Request, next: Next) -> Response {
    let headers = request.headers();
    let has_body = headers.contains_key(header::TRANSFER_ENCODING)
        || headers
            .get(header::CONTENT_LENGTH)
            .is_some_and(|length| length.as_bytes() != b"0");
    if has_body {
        return ApiError::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            "the API takes no request body",
        )
        .into_response();
    }
    if request
        .uri()
        .query()
        .is_some_and(|query| query.len() > MAX_QUERY_BYTES)
    {
        return ApiError::new(
            StatusCode::URI_TOO_LONG,
            format!("the query string is over {MAX_QUERY_BYTES} bytes"),
        )
        .into_response();
    }
    next.run(request).await
}

/// Serves a request once one of the [`MAX_CONCURRENT_REQUESTS`] turns is free,
/// waiting and being served within [`REQUEST_TIMEOUT`]; past it the request is
/// dropped (its page, if the actor builds it, goes nowhere) and answered 503.
async fn take_turn(State(turns): State<Arc<Semaphore>>, request: Request, next: Next) -> Response {
    within_turn(&turns, REQUEST_TIMEOUT, next.run(request))
        .await
        .unwrap_or_else(|| {
            ApiError::new(
                StatusCode::SERVICE_UNAVAILABLE,
                format!(
                    "the head did not answer within {}s; it is busy, try again",
                    REQUEST_TIMEOUT.as_secs()
                ),
            )
            .into_response()
        })
}

/// `work`'s output if a turn of `turns` comes and `work` ends within `timeout`,
/// both counted together; `None` otherwise.
async fn within_turn<T>(
    turns: &Semaphore,
    timeout: Duration,
    work: impl Future<Output = T>,
) -> Option<T> {
    tokio::time::timeout(timeout, async {
        // The semaphore is never closed, so `acquire` does not fail.
        let _turn = turns.acquire().await.ok()?;
        Some(work.await)
    })
    .await
    .ok()
    .flatten()
}

/// Who is asking, as far as the pages are concerned: which teams' experiments
/// they may see, as `auth::require_user` found them for this request.
pub(crate) struct Caller(pub(crate) Visibility);

impl<S: Send + Sync> FromRequestParts<S> for Caller {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, _state: &S) -> Result<Self, ApiError> {
        parts
            .extensions
            .get::<auth::Authenticated>()
            .map(|authenticated| Self(authenticated.visibility.clone()))
            .ok_or_else(|| ApiError::new(StatusCode::UNAUTHORIZED, "no credential"))
    }
}

/// An answer other than 200, as `{"error": ..., "parameter": ...}`.
#[derive(Debug)]
pub(crate) struct ApiError {
    status: StatusCode,
    message: String,
    parameter: Option<&'static str>,
}

impl ApiError {
    pub(crate) fn new(status: StatusCode, message: impl Into<String>) -> Self {
        Self {
            status,
            message: message.into(),
            parameter: None,
        }
    }

    /// 400 for the query or path parameter `parameter`.
    pub(crate) fn parameter(parameter: &'static str, message: impl Into<String>) -> Self {
        Self {
            status: StatusCode::BAD_REQUEST,
            message: format!("{parameter}: {}", message.into()),
            parameter: Some(parameter),
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let mut body = json!({ "error": self.message });
        if let Some(parameter) = self.parameter {
            body["parameter"] = json!(parameter);
        }
        (self.status, Json(body)).into_response()
    }
}

impl From<RemoteError> for ApiError {
    fn from(error: RemoteError) -> Self {
        let status = match error.code {
            ErrorCode::NotFound => StatusCode::NOT_FOUND,
            ErrorCode::BadRequest => StatusCode::BAD_REQUEST,
            ErrorCode::Forbidden | ErrorCode::BadToken => StatusCode::FORBIDDEN,
            ErrorCode::Unavailable | ErrorCode::StorageUnavailable => {
                StatusCode::SERVICE_UNAVAILABLE
            }
            _ => StatusCode::INTERNAL_SERVER_ERROR,
        };
        Self::new(status, error.message)
    }
}

impl From<PageError> for ApiError {
    fn from(error: PageError) -> Self {
        match error {
            PageError::ExperimentNotFound { .. } | PageError::TrialNotFound { .. } => {
                Self::new(StatusCode::NOT_FOUND, error.to_string())
            }
            PageError::NoMetric { .. } => Self::parameter("metric", error.to_string()),
        }
    }
}

/// A request's query parameters, checked against the names its route takes.
pub(crate) struct Params(Vec<(String, String)>);

impl Params {
    pub(crate) fn new(
        query: Result<Query<Vec<(String, String)>>, QueryRejection>,
        allowed: &[&'static str],
    ) -> Result<Self, ApiError> {
        let Query(pairs) =
            query.map_err(|rejection| ApiError::parameter("query", rejection.body_text()))?;
        for (position, (name, _)) in pairs.iter().enumerate() {
            let Some(known) = allowed.iter().find(|known| **known == name) else {
                let takes = if allowed.is_empty() {
                    "none".to_owned()
                } else {
                    allowed.join(", ")
                };
                return Err(ApiError::new(
                    StatusCode::BAD_REQUEST,
                    format!(
                        "unknown parameter `{}`; this route takes {takes}",
                        name.chars().take(64).collect::<String>(),
                    ),
                ));
            };
            if pairs[..position].iter().any(|(earlier, _)| earlier == name) {
                return Err(ApiError::parameter(known, "given more than once"));
            }
        }
        Ok(Self(pairs))
    }

    pub(crate) fn get(&self, name: &str) -> Option<&str> {
        self.0
            .iter()
            .find(|(key, _)| key == name)
            .map(|(_, value)| value.as_str())
    }

    /// `limit`: 1 to [`MAX_LIMIT`], [`DEFAULT_LIMIT`] when absent.
    pub(crate) fn limit(&self) -> Result<usize, ApiError> {
        Ok(self
            .number("limit", 1..=MAX_LIMIT, Some(DEFAULT_LIMIT))?
            .unwrap_or(DEFAULT_LIMIT))
    }

    /// A whole number parameter within `range`, `default` when absent.
    pub(crate) fn number<T>(
        &self,
        name: &'static str,
        range: std::ops::RangeInclusive<T>,
        default: Option<T>,
    ) -> Result<Option<T>, ApiError>
    where
        T: std::str::FromStr + PartialOrd + std::fmt::Display + Copy,
    {
        let Some(text) = self.get(name) else {
            return Ok(default);
        };
        let bad = || {
            ApiError::parameter(
                name,
                format!(
                    "must be a whole number from {} to {}",
                    range.start(),
                    range.end()
                ),
            )
        };
        // At most 20 digits: `u64::MAX` has 20, and nothing longer is parsed.
        if text.is_empty() || text.len() > 20 || !text.bytes().all(|byte| byte.is_ascii_digit()) {
            return Err(bad());
        }
        let value = text.parse::<T>().map_err(|_| bad())?;
        range
            .contains(&value)
            .then_some(Some(value))
            .ok_or_else(bad)
    }

    /// `cursor`, decoded by `decode`.
    fn cursor<T>(
        &self,
        decode: impl FnOnce(&str) -> Result<T, CursorError>,
    ) -> Result<Option<T>, ApiError> {
        self.get("cursor")
            .map(|text| {
                decode(text).map_err(|error| ApiError::parameter("cursor", error.to_string()))
            })
            .transpose()
    }
}

/// Asks the actor; an actor that does not answer is a 503.
pub(crate) async fn ask<T: Send + 'static>(
    head: &ActorRef<HeadMsg>,
    build: impl FnOnce(Reply<T>) -> HeadMsg,
) -> Result<T, ApiError> {
    call(head, build).await.map_err(ApiError::from)
}

/// A page as JSON, its items shaped by `item`.
fn page_json<T>(page: &Page<T>, limit: usize, item: impl Fn(&T) -> Value) -> Response {
    Json(json!({
        "items": page.items.iter().map(item).collect::<Vec<_>>(),
        "next_cursor": page.next_cursor,
        "total": page.total,
        "limit": limit,
    }))
    .into_response()
}

/// An experiment's summary: `xp status --json`'s experiment without its trials,
/// plus `trial_count`, `counts` (trials per state, states with none left out)
/// and `best` (the best succeeded trial and its value, or null).
fn summary_json(summary: &ExperimentSummary) -> Value {
    json!({
        "id": summary.id.to_string(),
        "name": summary.name,
        "team": summary.team,
        "state": summary.state.as_str(),
        "metric": summary.metric,
        "mode": if summary.maximize { "max" } else { "min" },
        "submitted_at_ms": summary.submitted_at,
        "code_version": summary.code_version,
        "data_version": summary.data_version,
        "trial_count": summary.trials,
        "counts": summary
            .counts
            .nonzero()
            .map(|(state, count)| (state.as_str().to_owned(), json!(count)))
            .collect::<serde_json::Map<_, _>>(),
        "best": summary.best.map(|best| json!({
            "trial": best.trial.to_string(),
            "value": best.value,
        })),
        "gpu_hours": summary.gpu_hours,
        "cost": summary.cost,
    })
}

/// One metric report: its attempt, rank, step, values by name and arrival time.
fn metric_point_json(point: &MetricPoint) -> Value {
    json!({
        "attempt": point.attempt,
        "rank": point.rank,
        "step": point.step,
        "values": point
            .values
            .iter()
            .map(|(name, value)| (name.clone(), xp_runtime::metric_value::value_json(*value)))
            .collect::<serde_json::Map<_, _>>(),
        "at_ms": point.at,
    })
}

pub(crate) fn experiment_id(
    path: Result<Path<String>, PathRejection>,
) -> Result<ExperimentId, ApiError> {
    let Path(text) = path.map_err(|rejection| ApiError::parameter("id", rejection.body_text()))?;
    text.parse()
        .map_err(|error: xp_runtime::ids::IdError| ApiError::parameter("id", error.to_string()))
}

pub(crate) fn trial_id(path: Result<Path<String>, PathRejection>) -> Result<TrialId, ApiError> {
    let Path(text) = path.map_err(|rejection| ApiError::parameter("id", rejection.body_text()))?;
    text.parse()
        .map_err(|error: xp_runtime::ids::IdError| ApiError::parameter("id", error.to_string()))
}

async fn experiments(
    State(HttpState { head, .. }): State<HttpState>,
    Caller(visibility): Caller,
    query: Result<Query<Vec<(String, String)>>, QueryRejection>,
) -> Result<Response, ApiError> {
    let params = Params::new(query, &["limit", "cursor"])?;
    let limit = params.limit()?;
    let cursor = params.cursor(ExperimentCursor::decode)?;
    let page = ask(&head, |reply| {
        HeadMsg::Read(Read::ExperimentsPage {
            limit,
            cursor,
            visibility,
            reply,
        })
    })
    .await?;
    Ok(page_json(&page, limit, summary_json))
}

async fn experiment(
    State(HttpState { head, .. }): State<HttpState>,
    Caller(visibility): Caller,
    path: Result<Path<String>, PathRejection>,
    query: Result<Query<Vec<(String, String)>>, QueryRejection>,
) -> Result<Response, ApiError> {
    Params::new(query, &[])?;
    let experiment = experiment_id(path)?;
    let summary = ask(&head, |reply| {
        HeadMsg::Read(Read::ExperimentSummary {
            experiment,
            visibility,
            reply,
        })
    })
    .await??;
    Ok(Json(summary_json(&summary)).into_response())
}

async fn pipelines(
    State(HttpState { head, .. }): State<HttpState>,
    Caller(visibility): Caller,
    query: Result<Query<Vec<(String, String)>>, QueryRejection>,
) -> Result<Response, ApiError> {
    Params::new(query, &[])?;
    let list = ask(&head, |reply| {
        HeadMsg::Read(Read::Pipelines {
            pipeline: None,
            visibility,
            reply,
        })
    })
    .await?;
    let items: Vec<Value> = list.iter().map(|status| status.to_json()).collect();
    Ok(Json(json!({ "items": items })).into_response())
}

async fn pipeline(
    State(HttpState { head, .. }): State<HttpState>,
    Caller(visibility): Caller,
    path: Result<Path<String>, PathRejection>,
    query: Result<Query<Vec<(String, String)>>, QueryRejection>,
) -> Result<Response, ApiError> {
    Params::new(query, &[])?;
    let Path(text) = path.map_err(|_| ApiError::parameter("id", "missing pipeline id"))?;
    let id: u64 = text
        .strip_prefix('p')
        .unwrap_or(&text)
        .parse()
        .map_err(|_| ApiError::parameter("id", format!("`{text}` is not a pipeline id")))?;
    let list = ask(&head, |reply| {
        HeadMsg::Read(Read::Pipelines {
            pipeline: Some(id),
            visibility,
            reply,
        })
    })
    .await?;
    let status = list.into_iter().next().ok_or_else(|| {
        ApiError::from(RemoteError::new(
            ErrorCode::NotFound,
            format!("no pipeline {id}"),
        ))
    })?;
    Ok(Json(status.to_json()).into_response())
}

async fn trials(
    State(HttpState { head, .. }): State<HttpState>,
    Caller(visibility): Caller,
    path: Result<Path<String>, PathRejection>,
    query: Result<Query<Vec<(String, String)>>, QueryRejection>,
) -> Result<Response, ApiError> {
    let params = Params::new(query, &["limit", "cursor", "sort", "state", "metric"])?;
    let experiment = experiment_id(path)?;
    let limit = params.limit()?;
    let sort = match params.get("sort") {
        None => TrialSort::Id,
        Some(text) => TrialSort::parse(text).ok_or_else(|| {
            let names: Vec<&str> = TrialSort::ALL.iter().map(|sort| sort.as_str()).collect();
            ApiError::parameter("sort", format!("must be one of {}", names.join(", ")))
        })?,
    };
    let cursor = params.cursor(|text| TrialCursor::decode(text, sort))?;
    let states = match params.get("state") {
        None => StateSet::ALL,
        Some(text) => StateSet::parse(text)
            .map_err(|unknown| ApiError::parameter("state", unknown.to_string()))?,
    };
    let metric = match params.get("metric") {
        None => None,
        Some(name) if name.is_empty() || name.len() > MAX_METRIC_NAME_BYTES => {
            return Err(ApiError::parameter(
                "metric",
                format!("must be a metric name of 1 to {MAX_METRIC_NAME_BYTES} bytes"),
            ));
        }
        Some(name) => Some(name.to_owned()),
    };
    let query = TrialQuery {
        limit,
        cursor,
        sort,
        states,
        metric,
    };
    let page = ask(&head, |reply| {
        HeadMsg::Read(Read::TrialsPage {
            experiment,
            query,
            visibility,
            reply,
        })
    })
    .await??;
    Ok(page_json(&page, limit, trial_json))
}

async fn metrics(
    State(HttpState { head, .. }): State<HttpState>,
    Caller(visibility): Caller,
    path: Result<Path<String>, PathRejection>,
    query: Result<Query<Vec<(String, String)>>, QueryRejection>,
) -> Result<Response, ApiError> {
    let params = Params::new(query, &["limit", "cursor"])?;
    let trial = trial_id(path)?;
    let limit = params.limit()?;
    let cursor = params.cursor(MetricCursor::decode)?;
    let page = ask(&head, |reply| {
        HeadMsg::Read(Read::MetricsPage {
            trial,
            limit,
            cursor,
            visibility,
            reply,
        })
    })
    .await??;
    Ok(page_json(&page, limit, metric_point_json))
}

/// A trial's telemetry: per rank, its downsampled series (at most
/// `MAX_SERIES_POINTS` points each, so the answer is bounded without paging).
async fn telemetry(
    State(HttpState { head, .. }): State<HttpState>,
    Caller(visibility): Caller,
    path: Result<Path<String>, PathRejection>,
    query: Result<Query<Vec<(String, String)>>, QueryRejection>,
) -> Result<Response, ApiError> {
    Params::new(query, &[])?;
    let trial = trial_id(path)?;
    let telemetry = ask(&head, |reply| {
        HeadMsg::Read(Read::Telemetry {
            trial,
            visibility,
            reply,
        })
    })
    .await??;
    Ok(Json(xp_runtime::views::telemetry_json(&telemetry)).into_response())
}

async fn nodes(
    State(HttpState { head, .. }): State<HttpState>,
    query: Result<Query<Vec<(String, String)>>, QueryRejection>,
) -> Result<Response, ApiError> {
    let params = Params::new(query, &["limit", "cursor"])?;
    let limit = params.limit()?;
    let cursor = params.cursor(NodeCursor::decode)?;
    let page = ask(&head, |reply| {
        HeadMsg::Read(Read::NodesPage {
            limit,
            cursor,
            reply,
        })
    })
    .await?;
    Ok(page_json(&page, limit, node_json))
}

async fn queues(
    State(HttpState { head, .. }): State<HttpState>,
    Caller(visibility): Caller,
    query: Result<Query<Vec<(String, String)>>, QueryRejection>,
) -> Result<Response, ApiError> {
    let params = Params::new(query, &["limit", "cursor"])?;
    let limit = params.limit()?;
    let cursor = params.cursor(QueueCursor::decode)?;
    let page = ask(&head, |reply| {
        HeadMsg::Read(Read::QueuesPage {
            limit,
            cursor,
            visibility,
            reply,
        })
    })
    .await?;
    Ok(page_json(&page, limit, |queue| {
        serde_json::to_value(queue).unwrap_or(Value::Null)
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_request_waits_for_a_turn_only_within_the_timeout() {
        let turns = Semaphore::new(2);
        let short = Duration::from_millis(50);
        assert_eq!(within_turn(&turns, short, async { 7 }).await, Some(7));
        // Every turn taken: the wait itself runs out.
        let held = turns.acquire_many(2).await.unwrap();
        assert_eq!(within_turn(&turns, short, async { 7 }).await, None);
        drop(held);
        // A turn, but work that never ends: the same timeout ends it.
        assert_eq!(
            within_turn(&turns, short, std::future::pending::<u8>()).await,
            None
        );
        assert_eq!(turns.available_permits(), 2, "turns are given back");
    }
}
