//! The head's HTTP API: read-only JSON views of experiments, nodes and queues,
//! and `/healthz`.
//!
//! It goes through the same actor calls as the QUIC API and shares the JSON shapes
//! of `xp status --json` (`xp_runtime::views`). The dashboard will be served here.
//! `/healthz` answers 200 `ok` only while the head actor runs and can store
//! changes; otherwise 503 with the reason (a full disk, say), so a supervisor or
//! load balancer sees a head that refuses work.

use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Json};
use axum::routing::get;
use ractor::{ActorRef, ActorStatus};
use xp_runtime::protocol::{ErrorCode, RemoteError, Response};
use xp_runtime::views::{experiment_json, node_json};

use crate::actor::HeadMsg;
use crate::health::HealthWatch;
use crate::server::call;

/// What the handlers share.
#[derive(Clone)]
struct HttpState {
    head: ActorRef<HeadMsg>,
    health: HealthWatch,
}

/// The router.
pub fn router(head: ActorRef<HeadMsg>, health: HealthWatch) -> axum::Router {
    axum::Router::new()
        .route("/healthz", get(healthz))
        .route("/api/experiments", get(experiments))
        .route("/api/nodes", get(nodes))
        .route("/api/queues", get(queues))
        .with_state(HttpState { head, health })
}

async fn healthz(State(state): State<HttpState>) -> axum::response::Response {
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

fn error_response(error: RemoteError) -> axum::response::Response {
    let status = match error.code {
        ErrorCode::NotFound => StatusCode::NOT_FOUND,
        ErrorCode::Unavailable | ErrorCode::StorageUnavailable => StatusCode::SERVICE_UNAVAILABLE,
        _ => StatusCode::INTERNAL_SERVER_ERROR,
    };
    (status, Json(serde_json::json!({ "error": error.message }))).into_response()
}

async fn experiments(State(HttpState { head, .. }): State<HttpState>) -> axum::response::Response {
    match call(&head, |reply| HeadMsg::Status(None, reply)).await {
        Ok(Response::Status(list)) => {
            Json(list.iter().map(experiment_json).collect::<Vec<_>>()).into_response()
        }
        Ok(_) => error_response(RemoteError::new(ErrorCode::Internal, "unexpected answer")),
        Err(error) => error_response(error),
    }
}

async fn nodes(State(HttpState { head, .. }): State<HttpState>) -> axum::response::Response {
    match call(&head, HeadMsg::Nodes).await {
        Ok(Response::Nodes(list)) => {
            Json(list.iter().map(node_json).collect::<Vec<_>>()).into_response()
        }
        Ok(_) => error_response(RemoteError::new(ErrorCode::Internal, "unexpected answer")),
        Err(error) => error_response(error),
    }
}

async fn queues(State(HttpState { head, .. }): State<HttpState>) -> axum::response::Response {
    match call(&head, HeadMsg::Queues).await {
        Ok(Response::Queues(list)) => Json(list).into_response(),
        Ok(_) => error_response(RemoteError::new(ErrorCode::Internal, "unexpected answer")),
        Err(error) => error_response(error),
    }
}
