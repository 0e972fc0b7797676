//! `GET /api/report`: `xp report --json` for the dashboard, with
//! `?experiment=ID` (an id or unique prefix), `?team=T`, or neither (the whole
//! cluster, admins only), and `&since=1h` (a humantime duration) for the last
//! stretch of time instead of everything since the scope's first arrival.
//!
//! The scope is judged by the core against what the credential sees, as for
//! `xp report`; the JSON is `views::report_json`, the one shape both share.

use axum::extract::rejection::QueryRejection;
use axum::extract::{Extension, Query, State};
use axum::response::{IntoResponse, Json, Response};
use xp_runtime::protocol::{ReportRequest, Response as WireResponse};
use xp_runtime::views::report_json;

use super::auth::Authenticated;
use super::{ApiError, HttpState, Params, ask};
use crate::actor::{HeadMsg, Read};

/// The longest window `since` may name: ten years.
const MAX_SINCE_MS: u64 = 10 * 366 * 24 * 3_600_000;

pub(super) async fn report(
    State(HttpState { head, .. }): State<HttpState>,
    Extension(authenticated): Extension<Authenticated>,
    query: Result<Query<Vec<(String, String)>>, QueryRejection>,
) -> Result<Response, ApiError> {
    let params = Params::new(query, &["experiment", "team", "since"])?;
    let name = |parameter: &'static str| -> Result<Option<String>, ApiError> {
        match params.get(parameter) {
            None => Ok(None),
            Some(text)
                if text.is_empty() || text.len() > xp_head_core::auth::access::MAX_NAME_BYTES =>
            {
                Err(ApiError::parameter(
                    parameter,
                    format!(
                        "must be 1 to {} bytes",
                        xp_head_core::auth::access::MAX_NAME_BYTES
                    ),
                ))
            }
            Some(text) => Ok(Some(text.to_owned())),
        }
    };
    let experiment = name("experiment")?;
    let team = name("team")?;
    if experiment.is_some() && team.is_some() {
        return Err(ApiError::parameter(
            "team",
            "give an experiment or a team, not both",
        ));
    }
    let since_ms = params.get("since").map(parse_since).transpose()?;
    let request = ReportRequest {
        experiment,
        team,
        since_ms,
    };
    let visible = authenticated.principal.visible_team();
    let answer = ask(&head, |reply| {
        HeadMsg::Read(Read::Report {
            request,
            visible,
            reply,
        })
    })
    .await?;
    match answer {
        WireResponse::Report(report) => Ok(Json(report_json(&report)).into_response()),
        _ => Err(ApiError::new(
            axum::http::StatusCode::INTERNAL_SERVER_ERROR,
            "the head answered a report with something else",
        )),
    }
}

/// `since`: a humantime duration (`90s`, `1h`, `7days`) of at most ten years.
fn parse_since(text: &str) -> Result<u64, ApiError> {
    let bad = || {
        ApiError::parameter(
            "since",
            "must be a duration such as 30m, 1h or 7days, of at most ten years",
        )
    };
    if text.len() > 64 {
        return Err(bad());
    }
    let duration = humantime::parse_duration(text).map_err(|_| bad())?;
    u64::try_from(duration.as_millis())
        .ok()
        .filter(|ms| *ms > 0 && *ms <= MAX_SINCE_MS)
        .ok_or_else(bad)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn since_takes_bounded_durations_only() {
        assert_eq!(parse_since("1h").unwrap(), 3_600_000);
        assert_eq!(parse_since("90s").unwrap(), 90_000);
        for bad in ["", "0s", "soon", "-1h", "100years", &"9".repeat(100)] {
            assert!(parse_since(bad).is_err(), "{bad:?} accepted");
        }
    }
}
