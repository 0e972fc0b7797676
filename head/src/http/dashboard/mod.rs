//! The web dashboard, served by the head on its `--http` address beside the
//! JSON API: experiments, one experiment, one trial, queues, nodes and the
//! cluster, each page live (it polls the API every few seconds) with
//! interactive plotly.js charts.
//!
//! What is served:
//! - `/`, `/experiments/{id}`, `/trials/{id}`, `/queues`, `/nodes`,
//!   `/cluster`: one HTML shell (`assets/index.html`); the page's script
//!   (`assets/app.js`, `assets/pages.js`) reads the path and draws that page
//!   from the JSON API;
//! - `/assets/app.js`, `/assets/experiment.js`, `/assets/pages.js`,
//!   `/assets/app.css`: our own code, embedded with `include_str!`,
//!   revalidated by `ETag`; the stylesheet is served without a credential,
//!   since the login page (`login_page`, `assets/login.html`) wears it too;
//! - `/assets/plotly-HASH.min.js`: plotly.js 3.0.1's strict bundle
//!   (`assets/vendor/plotly-strict.min.js`, MIT, from the npm package
//!   `plotly.js-strict-dist-min`), so nothing comes from a CDN; its address
//!   carries a hash of its bytes, so it is cached for a year. The strict
//!   bundle is plotly.js with its WebGL code (regl) compiled ahead of time:
//!   the default bundle builds it with `new Function` when a WebGL trace
//!   (the parallel coordinates) is drawn, which the policy's `script-src`
//!   without `'unsafe-eval'` refuses.
//!
//! Figures are built in the browser from the JSON API, not on the head with
//! the crate's figure types: the pages poll and redraw in place
//! (`Plotly.react`), the smoothing slider and metric choice redraw without a
//! round trip, and the API the pages read is the same one scripts use. The
//! head's part is bounded data (paged listings, downsampled curves,
//! `api.rs`).
//!
//! Security: pages and assets need the same credential as the API (the login
//! cookie or a bearer token); a page without one redirects to `/login`.
//! Every answer of the HTTP server carries [`CONTENT_SECURITY_POLICY`] (scripts
//! only from the head's own files, no inline script, no `eval`), `nosniff`
//! and `X-Frame-Options: DENY` ([`security_headers`]). The scripts insert
//! every value from the API as text (`textContent`, never `innerHTML`):
//! configurations and metric names are the users' own text.

use std::sync::LazyLock;

use axum::extract::{Request, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Redirect, Response};
use axum::routing::get;

use super::HttpState;
use super::auth::authenticate_request;

pub(crate) mod api;

/// The policy every answer carries. `style-src 'unsafe-inline'`: plotly.js
/// sets `style` attributes on the elements it draws, which a stricter policy
/// refuses; scripts stay limited to the head's own files.
pub(crate) const CONTENT_SECURITY_POLICY: &str = "default-src 'none'; script-src 'self'; \
     style-src 'self' 'unsafe-inline'; img-src 'self' data: blob:; font-src 'self' data:; \
     connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'";

const INDEX_HTML: &str = include_str!("assets/index.html");
const APP_JS: &str = include_str!("assets/app.js");
const PAGES_JS: &str = include_str!("assets/pages.js");
const EXPERIMENT_JS: &str = include_str!("assets/experiment.js");
const LOGIN_HTML: &str = include_str!("assets/login.html");
const APP_CSS: &str = include_str!("assets/app.css");

/// plotly.js, vendored: its strict bundle (see the module's comment).
const PLOTLY_JS: &str = include_str!("assets/vendor/plotly-strict.min.js");

/// plotly.js and the address it is served at.
struct Plotly {
    source: &'static str,
    path: String,
}

static PLOTLY: LazyLock<Plotly> = LazyLock::new(|| {
    let hash = blake3::hash(PLOTLY_JS.as_bytes()).to_hex();
    Plotly {
        path: format!("/assets/plotly-{}.min.js", &hash[..16]),
        source: PLOTLY_JS,
    }
});

/// The HTML shell with the addresses of its assets filled in.
static SHELL: LazyLock<String> = LazyLock::new(|| {
    INDEX_HTML
        .replace("{plotly}", &PLOTLY.path)
        .replace("{app_js}", &versioned("app.js", APP_JS))
        .replace("{pages_js}", &versioned("pages.js", PAGES_JS))
        .replace(
            "{experiment_js}",
            &versioned("experiment.js", EXPERIMENT_JS),
        )
        .replace("{app_css}", &versioned("app.css", APP_CSS))
});

/// The login page, in the dashboard's style, with `problem` (HTML the
/// caller escaped) under the form.
pub(crate) fn login_page(problem: &str) -> String {
    LOGIN_HTML
        .replace("{app_css}", &versioned("app.css", APP_CSS))
        .replace("{problem}", problem)
}

/// An asset's address with its hash as a query, so a new build is fetched anew.
fn versioned(name: &str, text: &str) -> String {
    format!("/assets/{name}?v={}", &etag(text)[1..17])
}

fn etag(text: &str) -> String {
    format!("\"{}\"", blake3::hash(text.as_bytes()).to_hex())
}

/// The pages and assets, each behind the credential check.
pub(crate) fn routes(state: HttpState) -> axum::Router<HttpState> {
    let pages = axum::Router::new()
        .route("/", get(shell))
        .route("/experiments/{id}", get(shell))
        .route("/trials/{id}", get(shell))
        .route("/queues", get(shell))
        .route("/nodes", get(shell))
        .route("/cluster", get(shell))
        .route_layer(middleware::from_fn_with_state(state.clone(), require_login));
    let assets = axum::Router::new()
        .route(
            "/assets/app.js",
            get(|headers| own_asset(headers, APP_JS, JS)),
        )
        .route(
            "/assets/pages.js",
            get(|headers| own_asset(headers, PAGES_JS, JS)),
        )
        .route(
            "/assets/experiment.js",
            get(|headers| own_asset(headers, EXPERIMENT_JS, JS)),
        )
        .route(&PLOTLY.path, get(plotly_js))
        .route_layer(middleware::from_fn_with_state(
            state,
            super::auth::require_user,
        ));
    // The stylesheet holds nothing secret and the login page needs it.
    let public = axum::Router::new().route(
        "/assets/app.css",
        get(|headers| own_asset(headers, APP_CSS, CSS)),
    );
    pages.merge(assets).merge(public)
}

const JS: &str = "text/javascript; charset=utf-8";
const CSS: &str = "text/css; charset=utf-8";

/// Adds the security headers to every answer of the HTTP server.
pub(crate) async fn security_headers(request: Request, next: Next) -> Response {
    let mut response = next.run(request).await;
    let headers = response.headers_mut();
    headers.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(CONTENT_SECURITY_POLICY),
    );
    headers.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    headers.insert(header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
    response
}

/// Lets a page request in with a credential; sends a browser without one to
/// the login form.
async fn require_login(State(state): State<HttpState>, request: Request, next: Next) -> Response {
    let known = authenticate_request(&state, request.headers())
        .await
        .is_ok();
    if known {
        next.run(request).await
    } else {
        Redirect::to("/login").into_response()
    }
}

async fn shell() -> Response {
    (
        [
            (header::CONTENT_TYPE, "text/html; charset=utf-8"),
            (header::CACHE_CONTROL, "no-cache"),
        ],
        SHELL.as_str(),
    )
        .into_response()
}

/// One of our own assets, revalidated by its `ETag`.
async fn own_asset(headers: HeaderMap, text: &'static str, content_type: &'static str) -> Response {
    let tag = etag(text);
    let matches = headers
        .get(header::IF_NONE_MATCH)
        .and_then(|value| value.to_str().ok())
        .is_some_and(|value| value.split(',').any(|candidate| candidate.trim() == tag));
    let cache = [
        (header::CONTENT_TYPE, content_type.to_owned()),
        (header::CACHE_CONTROL, "private, no-cache".to_owned()),
        (header::ETAG, tag),
    ];
    if matches {
        return (StatusCode::NOT_MODIFIED, cache).into_response();
    }
    (cache, text).into_response()
}

/// plotly.js; its address changes with its bytes, so it may be kept a year.
async fn plotly_js() -> Response {
    (
        [
            (header::CONTENT_TYPE, JS),
            (
                header::CACHE_CONTROL,
                "private, max-age=31536000, immutable",
            ),
        ],
        PLOTLY.source,
    )
        .into_response()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plotly_js_is_the_strict_bundle() {
        assert!(
            PLOTLY
                .source
                .starts_with("/**\n* plotly.js (strict - minified) v3."),
            "{}",
            &PLOTLY.source[..PLOTLY.source.len().min(80)]
        );
        assert!(PLOTLY.source.len() > 1 << 20);
        assert!(!PLOTLY.source.contains("</script>"));
        assert!(PLOTLY.path.starts_with("/assets/plotly-"));
    }

    #[test]
    fn the_shell_names_every_asset_and_runs_no_inline_script() {
        assert!(SHELL.contains(&PLOTLY.path));
        assert!(!SHELL.contains('{'), "every placeholder is filled");
        // Every script comes from a file: no inline code, no handler attribute.
        for piece in SHELL.split("<script").skip(1) {
            let tag_end = piece.find('>').expect("a closed tag");
            assert!(piece[..tag_end].contains("src="), "{piece}");
            assert!(piece[tag_end + 1..].starts_with("</script>"), "{piece}");
        }
        assert!(!SHELL.to_lowercase().contains(" on"), "no inline handlers");
    }

    #[test]
    fn the_login_page_wears_the_stylesheet_and_runs_no_script() {
        let page = login_page("<p role=\"alert\">no</p>");
        assert!(page.contains("/assets/app.css?v="), "{page}");
        assert!(page.contains("<p role=\"alert\">no</p>"));
        assert!(!page.contains('{'), "every placeholder is filled");
        assert!(!page.contains("<script"), "no script on the login page");
        assert!(!page.contains("<style"), "no inline style");
    }

    #[test]
    fn our_scripts_never_insert_html() {
        for script in [APP_JS, PAGES_JS, EXPERIMENT_JS] {
            for forbidden in [
                "innerHTML",
                "outerHTML",
                "insertAdjacentHTML",
                "document.write",
                "eval(",
            ] {
                assert!(!script.contains(forbidden), "{forbidden}");
            }
        }
    }
}
