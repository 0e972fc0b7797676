//! `GET /api/alerts`: the alerts of `?experiment=ID` (a full id), or of every
//! experiment the credential sees, newest first, paged like the other lists
//! (`limit`, `cursor`; `{items, next_cursor, total, limit}`). Each item is
//! `views::alert_json`, the shape `xp alerts --json` prints.

use axum::extract::rejection::QueryRejection;
use axum::extract::{Query, State};
use axum::response::{IntoResponse, Json, Response};
use serde_json::json;
use xp_runtime::ids::ExperimentId;
use xp_runtime::views::alert_json;

use super::{ApiError, Caller, HttpState, Params, ask};
use crate::actor::{AlertMsg, HeadMsg};
use xp_head_core::alerts::AlertCursor;

pub(super) async fn alerts(
    State(HttpState { head, .. }): State<HttpState>,
    Caller(visibility): Caller,
    query: Result<Query<Vec<(String, String)>>, QueryRejection>,
) -> Result<Response, ApiError> {
    let params = Params::new(query, &["experiment", "limit", "cursor"])?;
    let limit = params.limit()?;
    let experiment = params
        .get("experiment")
        .map(|text| {
            text.parse::<ExperimentId>().map_err(|error| {
                ApiError::parameter("experiment", format!("not an experiment id: {error}"))
            })
        })
        .transpose()?;
    let cursor = params
        .get("cursor")
        .map(|text| {
            AlertCursor::decode(text).ok_or_else(|| {
                ApiError::parameter(
                    "cursor",
                    "not a cursor this listing handed out; start again without one",
                )
            })
        })
        .transpose()?;
    let page = ask(&head, |reply| {
        HeadMsg::Alert(AlertMsg::Page {
            experiment,
            limit,
            cursor,
            visibility,
            reply,
        })
    })
    .await??;
    Ok(Json(json!({
        "items": page.items.iter().map(alert_json).collect::<Vec<_>>(),
        "next_cursor": page.next_cursor,
        "total": page.total,
        "limit": limit,
    }))
    .into_response())
}
