//! The read endpoints the dashboard needs beyond the HTTP API's pages, under
//! the same credential check, limits and error shapes (`crate::http`):
//!
//! - `GET /api/whoami`: `{"user": ...}`, who the credential names;
//! - `GET /api/trials/{id}`: one trial as `xp status --json` shows it, plus
//!   `experiment`, `metric`, `mode`, `world_size`, `allocated_gpu_hours`,
//!   `checkpoints` (kept, `xp checkpoints --json`'s shape) and `events` (the
//!   newest 200, newest first);
//! - `GET /api/trials/{id}/logs?rank=&attempt=&offset=&max_bytes=`: a piece
//!   of one rank's log from its node (as `xp logs` reads it), `{data,
//!   next_offset, complete}`, `data` as text (invalid UTF-8 replaced);
//!   `max_bytes` 1 to 256 KiB (64 KiB by default); a client follows by asking
//!   again from `next_offset`;
//! - `GET /api/experiments/{id}/curves?metric=&trials=&series=&points=`:
//!   learning curves of rank 0's reports of `metric` (the experiment's by
//!   default) for the trials named (comma-separated ids) or the best `series`
//!   (10 by default, at most 50), each downsampled on the head to at most
//!   `points` points (500 by default, 50 to 2,000), with `smoothing` (0 to
//!   0.999) also their EMA as `smoothed`;
//! - `GET /api/experiments/{id}/replicates?metric=`: per configuration, the
//!   mean and Student-t 95% interval of its finished trials' final values;
//! - `GET /api/experiments/{id}/parameters?metric=`: the search space's
//!   parameters (kind, scale: `linear`, `log` or `categorical`, bounds or
//!   choices) and their importance for `metric` (the experiment's by default)
//!   by PED-ANOVA over the newest 10,000 finished trials
//!   (`core::importance`), or why there is none (`status`: `rated`,
//!   `not_enough_trials`, `no_metric`, `no_parameters`); the actor only
//!   gathers the trials, the importance is computed on a blocking thread;
//! - `GET /api/cluster?buckets=&since_ms=`: utilisation, throughput, time and
//!   number in system over time and GPU-hours by team
//!   (`core::dashboard::cluster_history`); the actor only copies what it
//!   reads (`ClusterSnapshot`), the history is made on a blocking thread;
//! - `GET /api/gpus`: every node's GPUs and the trial on each;
//! - `GET /api/waiting?limit=`: queued trials, longest waiting first, with
//!   their queue and why they wait (`{items, total}`); the actor copies what
//!   the choice reads (`WaitingSnapshot`), the choice is made on a blocking
//!   thread, and the actor says why each chosen trial waits.
//!
//! Each answer is bounded by its parameters' limits, so none grows with the
//! size of an experiment (see `core::dashboard`).

use axum::extract::rejection::{PathRejection, QueryRejection};
use axum::extract::{Extension, Path, Query, State};
use axum::response::{IntoResponse, Json, Response};
use axum::routing::get;
use serde_json::{Value, json};
use xp_runtime::ids::TrialId;
use xp_runtime::protocol::LogRequest;

use xp_head_core::requests::{self, ConnectionWork};
use xp_runtime::protocol::{ErrorCode, RemoteError, Request};

use super::super::auth::Authenticated;
use super::super::{ApiError, Caller, HttpState, Params, ask, experiment_id, trial_id};
use crate::actor::{Answer, Asked, DashboardQuery, HeadMsg, Read, call};
use crate::sessions::relay_logs;
use xp_head_core::auth::Visibility;
use xp_head_core::dashboard::MAX_CURVE_SERIES;

/// The default and largest piece of a log one request reads.
const DEFAULT_LOG_BYTES: u32 = 64 << 10;
const MAX_LOG_BYTES: u32 = 256 << 10;
/// The default, fewest and most points of one learning curve.
const DEFAULT_POINTS: usize = 500;
const MIN_POINTS: usize = 50;
const MAX_POINTS: usize = 2000;
/// The default number of curves when no trials are named.
const DEFAULT_SERIES: usize = 10;
/// The most smoothing the curves take (`xp_tune::stats::ema` clamps there too).
const MAX_SMOOTHING: f64 = 0.999;
/// The longest metric name a request may name.
const MAX_METRIC_NAME_BYTES: usize = 256;
/// The default and largest number of buckets of the cluster history.
const DEFAULT_BUCKETS: usize = 60;

/// The routes, merged into the API's router (so under its credential check
/// and limits).
pub(crate) fn routes() -> axum::Router<HttpState> {
    axum::Router::new()
        .route("/api/whoami", get(whoami))
        .route("/api/trials/{id}", get(trial))
        .route("/api/trials/{id}/logs", get(logs))
        .route("/api/experiments/{id}/curves", get(curves))
        .route("/api/experiments/{id}/replicates", get(replicates))
        .route("/api/experiments/{id}/parameters", get(parameters))
        .route("/api/cluster", get(cluster))
        .route("/api/gpus", get(gpus))
        .route("/api/waiting", get(waiting))
        .route("/api/leases", get(leases))
}

async fn dashboard(
    state: &HttpState,
    visibility: Visibility,
    query: DashboardQuery,
) -> Result<Value, ApiError> {
    Ok(ask(&state.head, |reply| {
        HeadMsg::Read(Read::Dashboard {
            query,
            visibility,
            reply,
        })
    })
    .await??)
}

async fn whoami(
    Extension(authenticated): Extension<Authenticated>,
    query: Result<Query<Vec<(String, String)>>, QueryRejection>,
) -> Result<Response, ApiError> {
    Params::new(query, &[])?;
    Ok(Json(json!({ "user": authenticated.principal.to_string() })).into_response())
}

async fn trial(
    State(state): State<HttpState>,
    Caller(visibility): Caller,
    path: Result<Path<String>, PathRejection>,
    query: Result<Query<Vec<(String, String)>>, QueryRejection>,
) -> Result<Response, ApiError> {
    Params::new(query, &[])?;
    let trial = trial_id(path)?;
    let detail = dashboard(&state, visibility, DashboardQuery::Trial(trial)).await?;
    Ok(Json(detail).into_response())
}

/// `GET /api/waiting?limit=`: queued trials of the visible experiments,
/// longest waiting first, each with its queue and why it waits.
async fn waiting(
    State(state): State<HttpState>,
    Caller(visibility): Caller,
    query: Result<Query<Vec<(String, String)>>, QueryRejection>,
) -> Result<Response, ApiError> {
    let params = Params::new(query, &["limit"])?;
    let limit = params.limit()?;
    let snapshot = ask(&state.head, |reply| {
        HeadMsg::Read(Read::WaitingSnapshot {
            visibility: visibility.clone(),
            reply,
        })
    })
    .await?;
    // Finding the longest waiting walks every unfinished trial (about 0.3 s
    // at a million waiting); the actor says only why the chosen ones wait.
    let (trials, total) = off_the_actor("choose the longest waiting", move || {
        snapshot.longest_waiting(limit)
    })
    .await?;
    let query = DashboardQuery::WaitingItems { trials, total };
    let answer = dashboard(&state, visibility, query).await?;
    Ok(Json(answer).into_response())
}

/// `GET /api/leases`: what `xp leases` reports, trial ids as text: each
/// lease's capacity and counts (units held, holders, waiters: every team's)
/// with the holders and waiters of visible teams, and the preemptions waiting
/// for an admin that involve a visible team's trial.
async fn leases(
    State(state): State<HttpState>,
    Caller(visibility): Caller,
    query: Result<Query<Vec<(String, String)>>, QueryRejection>,
) -> Result<Response, ApiError> {
    Params::new(query, &[])?;
    let answer = ask(&state.head, |reply| {
        HeadMsg::Read(Read::Leases { visibility, reply })
    })
    .await?;
    let xp_runtime::protocol::Response::Leases(report) = answer else {
        return Err(ApiError::new(
            axum::http::StatusCode::INTERNAL_SERVER_ERROR,
            "the head answered a lease report with something else",
        ));
    };
    let claims = |claims: &[xp_runtime::protocol::LeaseClaim]| -> Vec<Value> {
        claims
            .iter()
            .map(|claim| json!({"trial": claim.trial.to_string(), "team": claim.team, "units": claim.units}))
            .collect()
    };
    let leases: Vec<Value> = report
        .leases
        .iter()
        .map(|lease| {
            json!({
                "name": lease.name,
                "capacity": lease.capacity,
                "held": lease.held,
                "holding": lease.holding,
                "waiting": lease.waiting,
                "holders": claims(&lease.holders),
                "waiters": claims(&lease.waiters),
            })
        })
        .collect();
    let approvals: Vec<Value> = report
        .approvals
        .iter()
        .map(|approval| {
            json!({
                "id": approval.id,
                "victim": approval.victim.to_string(),
                "claimant": approval.claimant.to_string(),
                "why": approval.why,
                "at_ms": approval.at,
            })
        })
        .collect();
    Ok(Json(json!({ "leases": leases, "approvals": approvals })).into_response())
}

fn metric_name(params: &Params) -> Result<Option<String>, ApiError> {
    match params.get("metric") {
        None => Ok(None),
        Some(name) if name.is_empty() || name.len() > MAX_METRIC_NAME_BYTES => {
            Err(ApiError::parameter(
                "metric",
                format!("must be a metric name of 1 to {MAX_METRIC_NAME_BYTES} bytes"),
            ))
        }
        Some(name) => Ok(Some(name.to_owned())),
    }
}

async fn logs(
    State(state): State<HttpState>,
    Caller(visibility): Caller,
    Extension(authenticated): Extension<Authenticated>,
    path: Result<Path<String>, PathRejection>,
    query: Result<Query<Vec<(String, String)>>, QueryRejection>,
) -> Result<Response, ApiError> {
    let params = Params::new(query, &["rank", "attempt", "offset", "max_bytes"])?;
    let trial = trial_id(path)?;
    let rank = params.number("rank", 0..=u32::MAX, Some(0))?.unwrap_or(0);
    let attempt = params.number("attempt", 1..=u32::MAX, None)?;
    let offset = params.number("offset", 0..=u64::MAX, Some(0))?.unwrap_or(0);
    let max_bytes = params
        .number("max_bytes", 1..=MAX_LOG_BYTES, Some(DEFAULT_LOG_BYTES))?
        .unwrap_or(DEFAULT_LOG_BYTES);
    // The node answers for any trial it holds: the caller's sight is judged first.
    dashboard(&state, visibility, DashboardQuery::TrialVisible(trial)).await?;
    let request = LogRequest {
        trial,
        rank,
        attempt,
        offset,
        max_bytes,
    };
    let chunk = read_logs(&state, &authenticated, request)
        .await
        .map_err(ApiError::from)?;
    Ok(Json(json!({
        "data": String::from_utf8_lossy(&chunk.data),
        "next_offset": chunk.next_offset,
        "complete": chunk.complete,
    }))
    .into_response())
}

/// A log read as `xp logs` makes it: the actor authorizes it and says which
/// node holds the log, and the read is relayed to that node.
async fn read_logs(
    state: &HttpState,
    authenticated: &Authenticated,
    request: LogRequest,
) -> Result<xp_runtime::protocol::LogChunk, RemoteError> {
    let request = Request::ReadLogs(request);
    let access = requests::access(&request);
    let answer = call(&state.head, |reply| {
        HeadMsg::Request(Asked {
            caller: authenticated.caller.clone(),
            access,
            session: None,
            request,
            reply,
        })
    })
    .await?;
    match answer {
        Answer::Connection(ConnectionWork::RelayLogs {
            node, key, request, ..
        }) => relay_logs(&state.sessions, node, key, &request).await,
        other => Err(RemoteError::new(
            ErrorCode::Internal,
            format!("a log read was answered without its node: {other:?}"),
        )),
    }
}

async fn curves(
    State(state): State<HttpState>,
    Caller(visibility): Caller,
    path: Result<Path<String>, PathRejection>,
    query: Result<Query<Vec<(String, String)>>, QueryRejection>,
) -> Result<Response, ApiError> {
    let params = Params::new(
        query,
        &["metric", "trials", "series", "points", "smoothing"],
    )?;
    let experiment = experiment_id(path)?;
    let metric = metric_name(&params)?;
    let series = params
        .number("series", 1..=MAX_CURVE_SERIES, Some(DEFAULT_SERIES))?
        .unwrap_or(DEFAULT_SERIES);
    let points = params
        .number("points", MIN_POINTS..=MAX_POINTS, Some(DEFAULT_POINTS))?
        .unwrap_or(DEFAULT_POINTS);
    let smoothing = match params.get("smoothing") {
        None => 0.0,
        Some(text) => text
            .parse::<f64>()
            .ok()
            .filter(|value| (0.0..=MAX_SMOOTHING).contains(value))
            .ok_or_else(|| {
                ApiError::parameter(
                    "smoothing",
                    format!("must be a number from 0 to {MAX_SMOOTHING}"),
                )
            })?,
    };
    let trials = match params.get("trials") {
        None => None,
        Some(text) => {
            let names: Vec<&str> = text.split(',').filter(|name| !name.is_empty()).collect();
            if names.is_empty() || names.len() > MAX_CURVE_SERIES {
                return Err(ApiError::parameter(
                    "trials",
                    format!("must name 1 to {MAX_CURVE_SERIES} trials, comma-separated"),
                ));
            }
            let ids = names
                .iter()
                .map(|name| {
                    name.parse::<TrialId>()
                        .map_err(|error| ApiError::parameter("trials", error.to_string()))
                })
                .collect::<Result<Vec<_>, _>>()?;
            Some(ids)
        }
    };
    let answer = dashboard(
        &state,
        visibility,
        DashboardQuery::Curves {
            experiment,
            trials,
            metric,
            series,
            points,
            smoothing,
        },
    )
    .await?;
    Ok(Json(answer).into_response())
}

async fn replicates(
    State(state): State<HttpState>,
    Caller(visibility): Caller,
    path: Result<Path<String>, PathRejection>,
    query: Result<Query<Vec<(String, String)>>, QueryRejection>,
) -> Result<Response, ApiError> {
    let params = Params::new(query, &["metric"])?;
    let experiment = experiment_id(path)?;
    let metric = metric_name(&params)?;
    let answer = dashboard(
        &state,
        visibility,
        DashboardQuery::Replicates { experiment, metric },
    )
    .await?;
    Ok(Json(answer).into_response())
}

/// `make`'s answer, made on a blocking thread from what the actor gathered:
/// the actor only copies, so its other work (every scheduling decision) does
/// not wait for the making.
async fn off_the_actor<T: Send + 'static>(
    what: &'static str,
    make: impl FnOnce() -> T + Send + 'static,
) -> Result<T, ApiError> {
    tokio::task::spawn_blocking(make).await.map_err(|error| {
        ApiError::new(
            axum::http::StatusCode::INTERNAL_SERVER_ERROR,
            format!("cannot {what}: {error}"),
        )
    })
}

/// `GET /api/experiments/{id}/parameters?metric=`: the actor gathers the
/// parameters and finished trials; PED-ANOVA runs on a blocking thread, so
/// neither the actor nor the async workers wait for it.
async fn parameters(
    State(state): State<HttpState>,
    Caller(visibility): Caller,
    path: Result<Path<String>, PathRejection>,
    query: Result<Query<Vec<(String, String)>>, QueryRejection>,
) -> Result<Response, ApiError> {
    let params = Params::new(query, &["metric"])?;
    let experiment = experiment_id(path)?;
    let metric = metric_name(&params)?;
    let study = ask(&state.head, |reply| {
        HeadMsg::Read(Read::Parameters {
            experiment,
            metric,
            visibility,
            reply,
        })
    })
    .await??;
    let answer = off_the_actor("rate the parameters", move || study.to_json()).await?;
    Ok(Json(answer).into_response())
}

async fn cluster(
    State(state): State<HttpState>,
    Caller(visibility): Caller,
    query: Result<Query<Vec<(String, String)>>, QueryRejection>,
) -> Result<Response, ApiError> {
    let params = Params::new(query, &["buckets", "since_ms"])?;
    let buckets = params
        .number(
            "buckets",
            1..=xp_head_core::dashboard::MAX_HISTORY_BUCKETS,
            Some(DEFAULT_BUCKETS),
        )?
        .unwrap_or(DEFAULT_BUCKETS);
    let since = params.number("since_ms", 0..=u64::MAX, None)?;
    let snapshot = ask(&state.head, |reply| {
        HeadMsg::Read(Read::ClusterSnapshot {
            since,
            buckets,
            visibility,
            reply,
        })
    })
    .await?;
    // A million trials' histories take 0.12 s to make the first time.
    let answer = off_the_actor("make the cluster's history", move || snapshot.to_json()).await?;
    Ok(Json(answer).into_response())
}

async fn gpus(
    State(state): State<HttpState>,
    Caller(visibility): Caller,
    query: Result<Query<Vec<(String, String)>>, QueryRejection>,
) -> Result<Response, ApiError> {
    Params::new(query, &[])?;
    let answer = dashboard(&state, visibility, DashboardQuery::Gpus).await?;
    Ok(Json(answer).into_response())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn params(pairs: &[(&str, &str)]) -> Params {
        let pairs = pairs
            .iter()
            .map(|(name, value)| ((*name).to_owned(), (*value).to_owned()))
            .collect();
        Params::new(Ok(Query(pairs)), &["points", "rank"]).expect("known parameters")
    }

    #[test]
    fn numbers_are_whole_and_within_their_range_or_refused_naming_the_parameter() {
        let range = MIN_POINTS..=MAX_POINTS;
        assert_eq!(
            params(&[]).number("points", range.clone(), Some(7)).ok(),
            Some(Some(7))
        );
        assert_eq!(
            params(&[("points", "60")])
                .number("points", range.clone(), None)
                .ok(),
            Some(Some(60))
        );
        for bad in [
            "",
            "-1",
            "1e3",
            "49",
            "2001",
            "99999999999999999999999",
            " 60",
        ] {
            let refused = params(&[("points", bad)]).number("points", range.clone(), None);
            let error = refused.expect_err(bad);
            assert_eq!(
                error.into_response().status(),
                axum::http::StatusCode::BAD_REQUEST,
                "{bad}"
            );
        }
        assert!(
            params(&[("rank", "4294967296")])
                .number("rank", 0..=u32::MAX, None)
                .is_err()
        );
    }
}
