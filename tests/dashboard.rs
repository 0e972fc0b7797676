//! The web dashboard in a real browser: a real `xp-head` with `--http`, and
//! headless Chromium driven through ChromeDriver by `fantoccini`.
//!
//! Before any node joins, the browser sees the login page (styled like the
//! rest) and the empty states: the experiments page says how to submit, the
//! nodes and cluster pages how to join a node (`xp-node join`), and the
//! cluster page says no "-0 GPUs" and draws no negative axis. Then a node with
//! two declared GPUs runs a random search of eight trials over an integer `x`
//! (which decides `loss`), a log-uniform `lr` and a `tag` holding HTML
//! (`<img src=x onerror=...>`), and a one-trial experiment holds a GPU; the
//! browser opens every page: the experiment page shows one column per
//! parameter with numbers to 4 significant digits on one line, the scatter
//! starts on the most important parameter and uses a log axis for `lr` (read
//! from Plotly's layout), parameter importance names its method (PED-ANOVA),
//! parallel coordinates hold one dimension per parameter plus the metric and
//! filter by a constraint range, two chosen trials show side by side with
//! their curves, and no legend covers an axis title; the nodes page names the
//! trial on a GPU by its id. On every page the dashboard's own error hook
//! (uncaught errors, rejected promises, Content-Security-Policy refusals) and
//! ChromeDriver's browser log must hold no error, and the HTML in the
//! configuration must show as text and never run. Screenshots of each page
//! and view are kept under `target/dashboard-screenshots/` (the path is
//! printed).
//!
//! Also checked without the browser: every page and asset but the stylesheet
//! needs a credential and carries the security headers, plotly.js is served
//! from the head, the parameters endpoint rates the parameters, and the
//! cluster's throughput stays within what a minute's window allows.
//!
//! The browser part is skipped, with the reason printed, where Debian's
//! `chromium` or `chromium-driver` is not installed (`.ci/run` installs them).

mod common;

#[path = "dashboard/browser.rs"]
mod browser;
#[path = "dashboard/pages.rs"]
mod pages;

use std::time::Duration;

use common::{TestCluster, free_tcp_port, http_exchange, http_get, wait_until};
use serde_json::{Value, json};

use browser::BrowserRun;

/// The HTML a trial's configuration carries: shown as text, it does nothing;
/// inserted as HTML, it sets `window.__xss`.
pub(crate) const HOSTILE: &str = "<img src=x onerror=window.__xss=1>";

/// How many trials the sweep runs.
const TRIALS: usize = 8;

#[test]
fn the_dashboard_shows_every_page_in_a_real_browser() {
    let http = format!("127.0.0.1:{}", free_tcp_port());
    let mut cluster = TestCluster::start_prepared("10s", &["--http", http.as_str()], |_| {});
    let admin: xp_runtime::join::JoinString = cluster.join.parse().expect("a credential");
    let secret = admin.token;
    wait_until("the HTTP API", Duration::from_secs(30), || {
        http_get(&http, "/healthz").filter(|(status, _)| *status == 200)
    });
    let browser = BrowserRun::start(&http);
    if let Some(run) = &browser {
        run.run(run.page().check_login_page());
        run.run(run.page().log_in(&secret));
        run.run(run.page().check_empty_cluster());
    }
    cluster.start_node("n1", 2, 4);
    cluster.wait_for_nodes(1);

    let experiment = must_run_dashboard_sweep(&cluster);
    // Without the browser: pages and assets need a credential and carry the
    // security headers; the page names its scripts, which are served.
    let bearer = format!("Bearer {secret}");
    let auth = [("Authorization", bearer.as_str())];
    check_pages_need_a_credential_and_carry_headers(&http, &auth, &experiment);
    // The dashboard's own endpoints answer.
    check_curves_endpoint(&http, &auth, &experiment);
    check_parameters_endpoint(&http, &auth, &experiment);
    check_throughput_is_sane(&http, &auth);
    let held = must_hold_a_gpu(&cluster, &http, &auth);
    if let Some(run) = browser {
        run.run(run.page().check_experiments(&experiment));
        run.run(run.page().check_experiment(&experiment));
        run.run(run.page().check_trial(&format!("{experiment}-t0")));
        run.run(run.page().check_queues_nodes_and_cluster(&held));
        run.finish();
    }
    cluster.must_xp(&["cancel", &held]);
}

/// Eight trials of a random search on the node's two declared GPUs, each
/// reporting five steps of `loss = 100 x / step`; `lr` is log-uniform (so
/// its values carry a float's full digits) and the `tag` parameter is HTML.
/// Run to their end; the experiment.
fn must_run_dashboard_sweep(cluster: &TestCluster) -> String {
    let spec = cluster.write_file(
        "sweep.yaml",
        &format!(
            "name: dashboard\ntrial:\n  command: [sh, -c, 'for s in 1 2 3 4 5; do echo \"XP_METRIC {{\\\"step\\\": $s, \\\"loss\\\": $(( {{x}} * 100 / s ))}}\"; done; echo \"done {{tag}} {{lr}}\"']\n  resources: {{gpu: 1, cpu: 1}}\nsearch:\n  algorithm: random\n  trials: {TRIALS}\n  space:\n    x: {{int: [1, 3]}}\n    lr: {{loguniform: [0.00001, 0.1]}}\n    tag: {{choice: ['{HOSTILE}']}}\n  metric: loss\n"
        ),
    );
    let experiment = cluster
        .must_xp(&["submit", spec.to_str().expect("a UTF-8 path")])
        .trim()
        .to_owned();
    cluster.wait_finished(&experiment, Duration::from_secs(180));
    experiment
}

/// A one-trial experiment that sleeps on a GPU until cancelled, once the
/// head shows it on a GPU; its trial id.
fn must_hold_a_gpu(cluster: &TestCluster, http: &str, auth: &[(&str, &str)]) -> String {
    let spec = cluster.write_file(
        "hold.yaml",
        "name: hold\ntrial:\n  command: [sleep, '300']\n  resources: {gpu: 1, cpu: 1}\n",
    );
    let experiment = cluster
        .must_xp(&["submit", spec.to_str().expect("a UTF-8 path")])
        .trim()
        .to_owned();
    let trial = format!("{experiment}-t0");
    wait_until("the held trial on a GPU", Duration::from_secs(60), || {
        let (status, _, body) = http_exchange(http, "GET", "/api/gpus", auth, "");
        (status == 200 && body.contains(&format!("\"{trial}\""))).then_some(())
    });
    trial
}

/// A page without a credential goes to the login, an asset is refused (but
/// the stylesheet, which the login page wears); with one, a page carries the
/// security headers and names plotly.js, which the head serves.
fn check_pages_need_a_credential_and_carry_headers(
    http: &str,
    auth: &[(&str, &str)],
    experiment: &str,
) {
    let (status, headers, _) = http_exchange(http, "GET", "/", &[], "");
    assert_eq!(
        status, 303,
        "a page without a credential goes to the login: {headers}"
    );
    assert!(headers.contains("location: /login"), "{headers}");
    for script in [
        "/assets/app.js",
        "/assets/experiment.js",
        "/assets/pages.js",
    ] {
        let (status, _, _) = http_exchange(http, "GET", script, &[], "");
        assert_eq!(status, 401, "{script} without a credential");
    }
    let (status, headers, _) = http_exchange(http, "GET", "/assets/app.css", &[], "");
    assert_eq!(status, 200, "the stylesheet is public: {headers}");
    let (status, headers, shell) =
        http_exchange(http, "GET", &format!("/experiments/{experiment}"), auth, "");
    assert_eq!(status, 200, "{headers}");
    for header in [
        "content-security-policy: default-src 'none'; script-src 'self';",
        "x-content-type-options: nosniff",
        "x-frame-options: deny",
        "content-type: text/html",
    ] {
        assert!(
            headers.to_lowercase().contains(&header.to_lowercase()),
            "{header} missing: {headers}"
        );
    }
    let plotly = shell
        .split('"')
        .find(|piece| piece.starts_with("/assets/plotly-"))
        .expect("the page names plotly.js")
        .to_owned();
    let (status, headers, body) = http_exchange(http, "GET", &plotly, auth, "");
    assert_eq!(status, 200, "{headers}");
    assert!(
        headers.contains("content-type: text/javascript"),
        "{headers}"
    );
    assert!(headers.contains("immutable"), "{headers}");
    assert!(
        body.contains("plotly.js (strict - minified) v"),
        "plotly.js is served from the head"
    );
}

/// `GET path` with the credential, as JSON.
fn get_json(http: &str, auth: &[(&str, &str)], path: &str) -> Value {
    let (status, _, body) = http_exchange(http, "GET", path, auth, "");
    assert_eq!(status, 200, "{path}: {body}");
    serde_json::from_str(&body).unwrap_or_else(|error| panic!("{path}: {error}: {body}"))
}

/// The learning curves endpoint answers one series per trial, by step.
fn check_curves_endpoint(http: &str, auth: &[(&str, &str)], experiment: &str) {
    let curves = get_json(
        http,
        auth,
        &format!("/api/experiments/{experiment}/curves?series=50"),
    );
    assert_eq!(
        curves["series"].as_array().map(Vec::len),
        Some(TRIALS),
        "{curves}"
    );
    assert_eq!(
        curves["series"][0]["steps"],
        json!([1, 2, 3, 4, 5]),
        "{curves}"
    );
}

/// The parameters endpoint describes the space (lr on a log scale) and rates
/// every parameter by PED-ANOVA, the importances adding up to 1 and the
/// single-valued `tag` at 0.
fn check_parameters_endpoint(http: &str, auth: &[(&str, &str)], experiment: &str) {
    let answer = get_json(
        http,
        auth,
        &format!("/api/experiments/{experiment}/parameters"),
    );
    let scales: Vec<(&str, &str)> = answer["parameters"]
        .as_array()
        .expect("parameters")
        .iter()
        .map(|p| (p["name"].as_str().unwrap(), p["scale"].as_str().unwrap()))
        .collect();
    assert_eq!(
        scales,
        [("lr", "log"), ("tag", "categorical"), ("x", "linear")],
        "{answer}"
    );
    let importance = &answer["importance"];
    assert_eq!(importance["method"], "PED-ANOVA", "{answer}");
    assert_eq!(importance["status"], "rated", "{answer}");
    assert_eq!(importance["trials"], TRIALS, "{answer}");
    let values = importance["values"].as_array().expect("values");
    let sum: f64 = values
        .iter()
        .map(|v| v["importance"].as_f64().unwrap())
        .sum();
    assert!((sum - 1.0).abs() < 1e-9, "{answer}");
    assert_eq!(
        values[2],
        json!({"name": "tag", "importance": 0.0}),
        "{answer}"
    );
}

/// No bucket's throughput is above what the finished trials give over the
/// shortest span a rate is divided by (a minute): no 20,000 trials an hour
/// from a few seconds' window.
fn check_throughput_is_sane(http: &str, auth: &[(&str, &str)]) {
    let history = get_json(http, auth, "/api/cluster?buckets=60");
    let finished: u64 = history["buckets"]
        .as_array()
        .expect("buckets")
        .iter()
        .map(|bucket| bucket["finished"].as_u64().unwrap())
        .sum();
    for bucket in history["buckets"].as_array().expect("buckets") {
        let rate = bucket["throughput_per_hour"].as_f64().unwrap();
        assert!(rate <= finished as f64 * 60.0 + 1e-9, "{history}");
    }
    assert!(history["capacity_gpus"].as_f64() == Some(2.0), "{history}");
}
