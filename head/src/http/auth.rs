//! Who is asking the HTTP API: every route but `/healthz` needs a user's
//! secret, as `Authorization: Bearer SECRET` (the secret, or the whole
//! credential string) or the session cookie that `/login` sets.
//!
//! `/login` is a small embedded HTML form; posting it, or opening
//! `/login?token=SECRET` (as Jupyter does), checks the secret, sets an
//! HttpOnly, SameSite=Strict cookie and redirects to `/`. The cookie holds the
//! user's secret itself, so a revocation applies to the next request as it does
//! on QUIC; the head serves plain HTTP, so the cookie is not marked Secure, and
//! the API should listen on loopback or behind a TLS proxy.
//!
//! The authenticated user goes through the same actor decision as a QUIC
//! request (`HeadMsg::Identify`, then `HeadMsg::Authorize` of a read), and the
//! pages show only what their `Visibility` allows: an admin every team, anyone
//! else their own team's experiments.

use axum::extract::{Form, Query, Request, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::middleware::Next;
use axum::response::{Html, IntoResponse, Redirect, Response};
use serde::Deserialize;
use serde_json::json;
use xp_runtime::protocol::{ErrorCode, RemoteError};

use super::HttpState;
use crate::actor::HeadMsg;
use crate::actor::call;
use xp_head_core::auth::Visibility;
use xp_head_core::auth::access::{Access, Caller, Scope};
use xp_head_core::auth::{Action, Principal, users};

/// The session cookie's name.
pub(super) const COOKIE: &str = "xp_session";

/// The longest secret (or credential string) read from a request.
const MAX_SECRET_BYTES: usize = 1024;

/// The largest login form body.
pub(super) const MAX_FORM_BYTES: usize = 4096;

/// The authenticated user, in the request's extensions for the handlers.
#[derive(Clone)]
pub(crate) struct Authenticated {
    /// Who, as the connection presented them (for requests the actor judges).
    pub(crate) caller: Caller,
    /// Who.
    pub(crate) principal: Principal,
    /// Which teams' experiments they see.
    pub(crate) visibility: Visibility,
}

/// The secret a request carries: the bearer token, else the session cookie.
fn presented_secret(headers: &HeaderMap) -> Option<String> {
    let bearer = headers
        .get(header::AUTHORIZATION)
        .and_then(|value| value.to_str().ok())
        .and_then(|value| value.strip_prefix("Bearer "))
        .map(str::trim);
    let cookie = || {
        headers
            .get_all(header::COOKIE)
            .iter()
            .filter_map(|value| value.to_str().ok())
            .flat_map(|value| value.split(';'))
            .find_map(|pair| pair.trim().strip_prefix(&format!("{COOKIE}=")))
    };
    bearer.or_else(cookie).map(secret_of)
}

/// The secret in `text`: a credential string's token, or `text` itself.
fn secret_of(text: &str) -> String {
    text.parse::<xp_runtime::join::JoinString>()
        .map_or_else(|_| text.trim().to_owned(), |join| join.token)
}

/// Why a request is not let in.
struct Unauthorized(RemoteError);

impl IntoResponse for Unauthorized {
    fn into_response(self) -> Response {
        let status = match self.0.code {
            ErrorCode::Forbidden => StatusCode::FORBIDDEN,
            ErrorCode::Unavailable | ErrorCode::StorageUnavailable => {
                StatusCode::SERVICE_UNAVAILABLE
            }
            _ => StatusCode::UNAUTHORIZED,
        };
        let mut response = (status, axum::Json(json!({ "error": self.0.message }))).into_response();
        if status == StatusCode::UNAUTHORIZED {
            response.headers_mut().insert(
                header::WWW_AUTHENTICATE,
                HeaderValue::from_static("Bearer realm=\"xp\""),
            );
        }
        response
    }
}

/// The user holding `secret`, as the actor judges them now.
async fn authenticate(
    state: &HttpState,
    secret: Option<String>,
) -> Result<Authenticated, Unauthorized> {
    let secret = secret.filter(|secret| !secret.is_empty()).ok_or_else(|| {
        Unauthorized(RemoteError::new(
            ErrorCode::BadToken,
            "no credential: send `Authorization: Bearer SECRET` or log in at /login",
        ))
    })?;
    if secret.len() > MAX_SECRET_BYTES {
        return Err(Unauthorized(RemoteError::new(
            ErrorCode::BadToken,
            "the credential is too long",
        )));
    }
    let secret_hash = users::secret_hash(&secret);
    let name = call(&state.head, |reply| HeadMsg::Identify(secret_hash, reply))
        .await
        .map_err(Unauthorized)?;
    let access = Access {
        action: Action::ListExperiments,
        scope: Scope::Cluster,
    };
    let caller = Caller::User { name, secret_hash };
    let principal = call(&state.head, |reply| {
        HeadMsg::Authorize(caller.clone(), access, reply)
    })
    .await
    .map_err(Unauthorized)?
    .principal;
    let shown = principal.visible_team();
    Ok(Authenticated {
        caller,
        principal,
        visibility: shown,
    })
}

/// The user whose credential a request's headers carry.
pub(crate) async fn authenticate_request(
    state: &HttpState,
    headers: &HeaderMap,
) -> Result<Authenticated, impl IntoResponse> {
    authenticate(state, presented_secret(headers)).await
}

/// Lets a request in only with a user's credential, which the handlers then
/// find in its extensions.
pub(crate) async fn require_user(
    State(state): State<HttpState>,
    mut request: Request,
    next: Next,
) -> Response {
    match authenticate(&state, presented_secret(request.headers())).await {
        Ok(authenticated) => {
            request.extensions_mut().insert(authenticated);
            next.run(request).await
        }
        Err(refusal) => refusal.into_response(),
    }
}

/// The login routes, outside the API's limits (the login form has a small
/// body); `/` is the dashboard (`super::dashboard`).
pub(super) fn routes() -> axum::Router<HttpState> {
    axum::Router::new()
        .route("/login", axum::routing::get(login_page).post(login_form))
        .route("/logout", axum::routing::get(logout))
        .layer(axum::extract::DefaultBodyLimit::max(MAX_FORM_BYTES))
}

const LOGIN_PAGE: &str = r#"<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>xp: log in</title>
<style>body{font-family:sans-serif;max-width:32em;margin:4em auto}input{width:100%;padding:.4em;margin:.4em 0}</style>
</head><body><h1>xp</h1>
<p>Paste your credential (from <code>xp-head user add</code>) or its secret.</p>
<form method="post" action="/login">
<input type="password" name="token" autocomplete="current-password" autofocus required>
<input type="submit" value="Log in">
</form>{problem}</body></html>
"#;

fn login_html(problem: Option<&str>) -> Html<String> {
    let problem = problem.map_or_else(String::new, |text| {
        format!("<p role=\"alert\">{}</p>", escape(text))
    });
    Html(LOGIN_PAGE.replace("{problem}", &problem))
}

/// Text safe inside HTML.
fn escape(text: &str) -> String {
    text.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

/// Checks `secret` and answers with the cookie and a redirect to `/`, or the
/// form again with the reason.
async fn log_in(state: &HttpState, secret: String) -> Response {
    let secret = secret_of(&secret);
    match authenticate(state, Some(secret.clone())).await {
        Ok(_) => {
            let cookie = format!(
                "{COOKIE}={secret}; HttpOnly; SameSite=Strict; Path=/; Max-Age={SESSION_MAX_AGE_S}"
            );
            let mut response = Redirect::to("/").into_response();
            match HeaderValue::from_str(&cookie) {
                Ok(value) => {
                    response.headers_mut().insert(header::SET_COOKIE, value);
                    response
                }
                Err(_) => (
                    StatusCode::BAD_REQUEST,
                    login_html(Some("the secret holds characters a cookie cannot")),
                )
                    .into_response(),
            }
        }
        Err(Unauthorized(error)) => {
            (StatusCode::UNAUTHORIZED, login_html(Some(&error.message))).into_response()
        }
    }
}

/// `GET /login`: the form, or with `?token=SECRET` a login.
async fn login_page(
    State(state): State<HttpState>,
    Query(query): Query<Vec<(String, String)>>,
) -> Response {
    let response = match query.into_iter().find(|(name, _)| name == "token") {
        Some((_, secret)) => log_in(&state, secret).await,
        None => login_html(None).into_response(),
    };
    kept_private(response)
}

/// How long a login cookie lasts: a week, then the user logs in again.
const SESSION_MAX_AGE_S: u64 = 7 * 24 * 3600;

/// `response` marked so that neither a cache keeps it nor a link followed
/// from it names its address: `/login?token=` carries a secret in its URL.
fn kept_private(mut response: Response) -> Response {
    let headers = response.headers_mut();
    headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    headers.insert(
        header::REFERRER_POLICY,
        HeaderValue::from_static("no-referrer"),
    );
    response
}

/// The login form's fields.
#[derive(Deserialize)]
struct LoginForm {
    token: String,
}

/// `POST /login`.
async fn login_form(State(state): State<HttpState>, Form(form): Form<LoginForm>) -> Response {
    kept_private(log_in(&state, form.token).await)
}

/// `GET /logout`: forgets the cookie.
async fn logout() -> Response {
    let mut response = Redirect::to("/login").into_response();
    response.headers_mut().insert(
        header::SET_COOKIE,
        HeaderValue::from_static("xp_session=; HttpOnly; SameSite=Strict; Path=/; Max-Age=0"),
    );
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_secret_comes_from_the_bearer_header_or_the_cookie() {
        let mut headers = HeaderMap::new();
        assert_eq!(presented_secret(&headers), None);
        headers.insert(
            header::COOKIE,
            HeaderValue::from_static("other=1; xp_session=abc"),
        );
        assert_eq!(presented_secret(&headers).as_deref(), Some("abc"));
        headers.insert(
            header::AUTHORIZATION,
            HeaderValue::from_static("Bearer def"),
        );
        assert_eq!(presented_secret(&headers).as_deref(), Some("def"));
        let credential = format!("xp://h:1?token=ghi&ca={}", "00".repeat(32));
        assert_eq!(secret_of(&credential), "ghi");
        assert_eq!(
            escape("<a href=\"x\">&"),
            "&lt;a href=&quot;x&quot;&gt;&amp;"
        );
    }
}
