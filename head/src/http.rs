//! The head's HTTP API: read-only JSON views of experiments, nodes and queues.
//!
//! It goes through the same actor calls as the QUIC API and shares the JSON shapes
//! of `xp status --json` (`xp_runtime::views`). The dashboard will be served here.

use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Json};
use axum::routing::get;
use ractor::ActorRef;
use xp_runtime::protocol::{ErrorCode, RemoteError, Response};
use xp_runtime::views::{experiment_json, node_json};

use crate::actor::HeadMsg;
use crate::server::call;

/// The router.
pub fn router(head: ActorRef<HeadMsg>) -> axum::Router {
    axum::Router::new()
        .route("/healthz", get(|| async { "ok" }))
        .route("/api/experiments", get(experiments))
        .route("/api/nodes", get(nodes))
        .route("/api/queues", get(queues))
        .with_state(head)
}

fn error_response(error: RemoteError) -> axum::response::Response {
    let status = match error.code {
        ErrorCode::NotFound => StatusCode::NOT_FOUND,
        ErrorCode::Unavailable => StatusCode::SERVICE_UNAVAILABLE,
        _ => StatusCode::INTERNAL_SERVER_ERROR,
    };
    (status, Json(serde_json::json!({ "error": error.message }))).into_response()
}

async fn experiments(State(head): State<ActorRef<HeadMsg>>) -> axum::response::Response {
    match call(&head, |reply| HeadMsg::Status(None, reply)).await {
        Ok(Response::Status(list)) => {
            Json(list.iter().map(experiment_json).collect::<Vec<_>>()).into_response()
        }
        Ok(_) => error_response(RemoteError::new(ErrorCode::Internal, "unexpected answer")),
        Err(error) => error_response(error),
    }
}

async fn nodes(State(head): State<ActorRef<HeadMsg>>) -> axum::response::Response {
    match call(&head, HeadMsg::Nodes).await {
        Ok(Response::Nodes(list)) => {
            Json(list.iter().map(node_json).collect::<Vec<_>>()).into_response()
        }
        Ok(_) => error_response(RemoteError::new(ErrorCode::Internal, "unexpected answer")),
        Err(error) => error_response(error),
    }
}

async fn queues(State(head): State<ActorRef<HeadMsg>>) -> axum::response::Response {
    match call(&head, HeadMsg::Queues).await {
        Ok(Response::Queues(list)) => Json(list).into_response(),
        Ok(_) => error_response(RemoteError::new(ErrorCode::Internal, "unexpected answer")),
        Err(error) => error_response(error),
    }
}
