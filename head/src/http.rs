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
//! Memory and the head's time per request are bounded: a page holds at most
//! `limit` items and ends early past `core::pages::MAX_PAGE_BYTES`; every API
//! request takes a turn (`crate::turns`: one of one user's at a time, eight in
//! all, with heavy QUIC reads) after its credential is checked, so one
//! user's burst waits behind that user's own requests; a request may be
//! checked, wait and run at most [`REQUEST_TIMEOUT`], and a request whose
//! caller gave up (past the timeout, or by closing the connection) is
//! skipped by the actor if it has not reached it yet; a request with a body
//! or a query over [`MAX_QUERY_BYTES`] is refused before any work.
//! Connections that send no complete request head within
//! `serve::HEADER_TIMEOUT` (idle keep-alive ones included) are closed, and so
//! are those that stop reading their answer (`serve::WRITE_STALL_TIMEOUT`).
//! Pages are built inside the head actor from its state (`core::pages`), which
//! walks only what the page needs; nothing clones a whole experiment.
//!
//! `/healthz` answers 200 `ok` only while the head actor runs, keeps up with
//! its work and can store changes; otherwise 503 with the reason (a full
//! disk, or an actor that has not handled its tick for seconds), so a
//! supervisor or load balancer sees a head that refuses or stalls work. It
//! takes no turn, so a busy API does not look like a dead head.

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
use xp_runtime::ids::{ExperimentId, TrialId};
use xp_runtime::protocol::{ErrorCode, MetricPoint, RemoteError};
use xp_runtime::views::{node_json, trial_json};

use crate::actor::call;
use crate::actor::{HeadMsg, Read, Reply};
use crate::health::{ActorPulse, HealthWatch};
use crate::metrics::{Api, HeadMetrics, OPENMETRICS_TEXT, PROMETHEUS_TEXT};
use crate::sessions::Sessions;
use crate::turns::Turns;
use xp_head_core::auth::Visibility;
use xp_head_core::pages::{
    CursorError, DEFAULT_LIMIT, ExperimentCursor, ExperimentSummary, MAX_LIMIT, MetricCursor,
    NodeCursor, Page, PageError, QueueCursor, StateSet, TrialCursor, TrialQuery, TrialSort,
};

mod alerts;
pub(crate) mod auth;
pub(crate) mod dashboard;
mod report;
pub(crate) mod serve;

/// The longest a request may be checked, wait for its turn and be served.
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
    /// When the actor last handled its tick.
    pulse: ActorPulse,
    metrics: Arc<HeadMetrics>,
    /// The nodes' sessions, through which log reads reach the nodes.
    pub(crate) sessions: Sessions,
    /// Every user's turns, shared with the QUIC server's heavy reads.
    turns: Arc<Turns>,
}

/// What the HTTP API shares with the rest of the head.
pub(crate) struct HttpShared {
    /// The head actor.
    pub(crate) head: ActorRef<HeadMsg>,
    /// Whether the head can store changes.
    pub(crate) health: HealthWatch,
    /// When the actor last handled its tick.
    pub(crate) pulse: ActorPulse,
    /// The head's counters.
    pub(crate) metrics: Arc<HeadMetrics>,
    /// The nodes' sessions.
    pub(crate) sessions: Sessions,
    /// Every user's turns.
    pub(crate) turns: Arc<Turns>,
}

/// The router.
pub(crate) fn router(shared: HttpShared) -> axum::Router {
    let state = HttpState {
        head: shared.head,
        health: shared.health,
        pulse: shared.pulse,
        metrics: shared.metrics,
        sessions: shared.sessions,
        turns: shared.turns,
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
        // A turn of the caller's, then one of everyone's: inside the
        // credential check, which says who the caller is.
        .route_layer(middleware::from_fn_with_state(state.clone(), take_turn))
        // Every API route needs a user's credential (see `auth`).
        .route_layer(middleware::from_fn_with_state(
            state.clone(),
            auth::require_user,
        ))
        // Outside the credential check, so refused requests are counted too;
        // a route layer, so the route (a bounded label) is known.
        .route_layer(middleware::from_fn_with_state(state.clone(), count_request))
        // One timeout covers the credential check, the wait for a turn and
        // the work (tower's `ConcurrencyLimit` would wait in `poll_ready`,
        // before tower's `Timeout` starts its clock).
        .layer(middleware::from_fn(time_limit));
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
        ActorStatus::Running => state
            .health
            .borrow()
            .problem()
            .or_else(|| state.pulse.problem()),
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

/// Answers 503 for a request not served within [`REQUEST_TIMEOUT`]: its
/// work is dropped (and skipped by the actor if it has not reached it yet).
async fn time_limit(request: Request, next: Next) -> Response {
    tokio::time::timeout(REQUEST_TIMEOUT, next.run(request))
        .await
        .unwrap_or_else(|_| {
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

/// Serves a request once its user has a turn free, and then everyone has
/// (`crate::turns`); the time limit around it bounds the wait.
async fn take_turn(State(state): State<HttpState>, request: Request, next: Next) -> Response {
    let user = request
        .extensions()
        .get::<auth::Authenticated>()
        .map(auth::Authenticated::name)
        .unwrap_or_default();
    let _turn = state.turns.take(&user).await;
    next.run(request).await
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

/// A page as JSON, its items shaped by `item`: on a blocking thread, since
/// shaping a thousand items takes milliseconds that the async workers owe
/// the QUIC clients and the actor meanwhile.
async fn page_json<T: Send + 'static>(
    page: Page<T>,
    limit: usize,
    item: fn(&T) -> Value,
) -> Response {
    tokio::task::spawn_blocking(move || {
        Json(json!({
            "items": page.items.iter().map(item).collect::<Vec<_>>(),
            "next_cursor": page.next_cursor,
            "total": page.total,
            "limit": limit,
        }))
        .into_response()
    })
    .await
    .unwrap_or_else(|error| {
        ApiError::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            format!("cannot shape the page: {error}"),
        )
        .into_response()
    })
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
    Ok(page_json(page, limit, summary_json).await)
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
    Ok(page_json(page, limit, trial_json).await)
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
    Ok(page_json(page, limit, metric_point_json).await)
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
    Ok(page_json(page, limit, node_json).await)
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
    Ok(page_json(page, limit, |queue| {
        serde_json::to_value(queue).unwrap_or(Value::Null)
    })
    .await)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_request_waits_for_a_turn_only_within_the_timeout() {
        let short = Duration::from_millis(50);
        let turns = Arc::new(Turns::new(2, 1));
        let held = turns.take("alice").await;
        let waited = tokio::time::timeout(short, turns.take("alice")).await;
        assert!(
            waited.is_err(),
            "alice's second request waits out the timeout"
        );
        let bob = tokio::time::timeout(short, turns.take("bob")).await;
        assert!(bob.is_ok(), "bob is not behind alice");
        drop((held, bob));
        let again = tokio::time::timeout(short, turns.take("alice")).await;
        assert!(again.is_ok(), "turns are given back");
    }
}
