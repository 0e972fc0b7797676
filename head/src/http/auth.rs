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
//! Login CSRF: SameSite=Strict keeps the browser from sending the cookie with
//! another site's requests, but not from storing a cookie that another site's
//! page makes it ask for. A foreign page that auto-posts the form (or opens
//! `/login?token=`) with the attacker's own credential would log the victim in
//! as the attacker: the dashboard they then open shows the attacker's team
//! (whose experiment names, metric names and logs the attacker wrote), and
//! their own session is gone. So logging in and out is refused when the
//! browser says another site asked for it ([`foreign_request`]).
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

impl Authenticated {
    /// The user's name (`node` for the node credential, which the API refuses).
    pub(crate) fn name(&self) -> String {
        match &self.principal {
            Principal::User { name, .. } => name.clone(),
            Principal::Node => "node".to_owned(),
        }
    }
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

/// The login form, in the dashboard's style (`super::dashboard::login_page`),
/// with the reason a login was refused under it.
fn login_html(problem: Option<&str>) -> Html<String> {
    let problem = problem.map_or_else(String::new, |text| {
        format!("<p role=\"alert\">{}</p>", escape(text))
    });
    Html(super::dashboard::login_page(&problem))
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

/// Why a login or logout is refused as another site's doing (login CSRF, see
/// the module documentation), or `None` when the head's own page or the user
/// asked, or no browser did. A browser says where a request came from in
/// `Sec-Fetch-Site` (to HTTPS and loopback addresses): only `same-origin` and
/// `none` (typed, a bookmark, a link from another program) pass. Where it does
/// not send that header (plain HTTP to another machine) it sends `Origin` with
/// every POST, which must then name this address (`Host`). A request with
/// neither comes from no browser, which no other site can drive.
pub(super) fn foreign_request(headers: &HeaderMap) -> Option<String> {
    let text = |name: header::HeaderName| headers.get(name).and_then(|value| value.to_str().ok());
    if let Some(site) = text(header::HeaderName::from_static("sec-fetch-site")) {
        return (!matches!(site, "same-origin" | "none"))
            .then(|| format!("Sec-Fetch-Site: {site}"));
    }
    let origin = text(header::ORIGIN)?;
    let host = text(header::HOST).filter(|host| !host.is_empty());
    let own = host.is_some_and(|host| {
        ["http://", "https://"]
            .iter()
            .any(|scheme| origin.strip_prefix(scheme) == Some(host))
    });
    (!own).then(|| format!("Origin: {origin}"))
}

/// The answer to a login or logout another site asked for: 403, the form,
/// and why.
fn refused_as_foreign(why: &str) -> Response {
    let problem = format!(
        "refused: another site asked for this ({why}); open /login on this address yourself"
    );
    (StatusCode::FORBIDDEN, login_html(Some(&problem))).into_response()
}

/// `GET /login`: the form, or with `?token=SECRET` a login (unless another
/// site's page asked for it).
async fn login_page(
    State(state): State<HttpState>,
    headers: HeaderMap,
    Query(query): Query<Vec<(String, String)>>,
) -> Response {
    let response = match query.into_iter().find(|(name, _)| name == "token") {
        Some((_, secret)) => match foreign_request(&headers) {
            Some(why) => refused_as_foreign(&why),
            None => log_in(&state, secret).await,
        },
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

/// `POST /login`, unless another site's page posted it.
async fn login_form(
    State(state): State<HttpState>,
    headers: HeaderMap,
    Form(form): Form<LoginForm>,
) -> Response {
    let response = match foreign_request(&headers) {
        Some(why) => refused_as_foreign(&why),
        None => log_in(&state, form.token).await,
    };
    kept_private(response)
}

/// `GET /logout`: forgets the cookie, unless another site's page asked.
async fn logout(headers: HeaderMap) -> Response {
    if let Some(why) = foreign_request(&headers) {
        return refused_as_foreign(&why);
    }
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

    /// Whether a login with `headers` (name, value) is refused as another site's.
    fn check(headers: &[(&'static str, &str)], refused: bool) {
        let mut map = HeaderMap::new();
        for (name, value) in headers {
            map.insert(*name, HeaderValue::from_str(value).unwrap());
        }
        assert_eq!(foreign_request(&map).is_some(), refused, "{headers:?}");
    }

    #[test]
    fn a_login_another_site_asked_for_is_refused() {
        let host = ("host", "127.0.0.1:8080");
        // No browser (curl, a script): nothing another site can drive.
        check(&[host], false);
        check(&[], false);
        // What the browser says about where the request came from decides.
        check(&[host, ("sec-fetch-site", "same-origin")], false);
        check(&[host, ("sec-fetch-site", "none")], false);
        check(&[host, ("sec-fetch-site", "cross-site")], true);
        check(&[host, ("sec-fetch-site", "same-site")], true);
        check(
            &[
                host,
                ("sec-fetch-site", "cross-site"),
                ("origin", "http://127.0.0.1:8080"),
            ],
            true,
        );
        check(
            &[
                host,
                ("sec-fetch-site", "same-origin"),
                ("origin", "https://proxy.example"),
            ],
            false,
        );
        // Without it, the Origin must be this address.
        check(&[host, ("origin", "http://127.0.0.1:8080")], false);
        check(&[host, ("origin", "https://127.0.0.1:8080")], false);
        check(&[host, ("origin", "http://evil.example")], true);
        check(
            &[host, ("origin", "http://127.0.0.1:8080.evil.example")],
            true,
        );
        check(&[host, ("origin", "null")], true);
        check(&[("origin", "http://127.0.0.1:8080")], true);
    }
}
