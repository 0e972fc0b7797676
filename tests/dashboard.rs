//! The web dashboard in a real browser: a real `xp-head` with `--http` and a
//! node with two declared GPUs run a small sweep whose configuration holds
//! HTML (`<img src=x onerror=...>`); then headless Chromium, driven through
//! ChromeDriver by `fantoccini`, logs in and opens every page: experiments,
//! the experiment (its id, its trials, one learning curve per trial, read from
//! Plotly's `gd.data`, and the search's scatter), a trial (its log followed, its metrics), queues,
//! nodes and the cluster. On every page the dashboard's own error hook
//! (uncaught errors, rejected promises, Content-Security-Policy refusals) and
//! ChromeDriver's browser log must hold no error, and the HTML in the
//! configuration must show as text and never run. A screenshot of each page
//! is kept under `target/dashboard-screenshots/` (the path is printed).
//!
//! Also checked without the browser: every page and asset needs a credential
//! and carries the security headers, and plotly.js is served from the head.
//!
//! Skipped, with the reason printed, where Debian's `chromium` or
//! `chromium-driver` is not installed (`.ci/run` installs them).

mod common;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use tokio::time::Instant;

use common::{TestCluster, free_tcp_port, http_exchange, http_get, wait_until};
use serde_json::{Value, json};

/// Whether `program` is on the `PATH`, and where.
fn find(program: &str) -> Option<PathBuf> {
    let output = Command::new("sh")
        .args(["-c", &format!("command -v {program}")])
        .stderr(Stdio::null())
        .output()
        .ok()?;
    let path = String::from_utf8(output.stdout).ok()?.trim().to_owned();
    (output.status.success() && !path.is_empty()).then(|| PathBuf::from(path))
}

/// A child process killed when dropped (ChromeDriver must not outlive the test).
struct Killed(Child);

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// The HTML a trial's configuration carries: shown as text, it does nothing;
/// inserted as HTML, it sets `window.__xss`.
const HOSTILE: &str = "<img src=x onerror=window.__xss=1>";

/// Where the screenshots go: `target/dashboard-screenshots/`.
fn screenshot_dir() -> PathBuf {
    let target = common::bin_dir()
        .parent()
        .map(Path::to_path_buf)
        .unwrap_or_else(common::bin_dir);
    target.join("dashboard-screenshots")
}

#[test]
fn the_dashboard_shows_every_page_in_a_real_browser() {
    let http = format!("127.0.0.1:{}", free_tcp_port());
    let mut cluster = TestCluster::start_prepared("10s", &["--http", http.as_str()], |_| {});
    let admin: xp_runtime::join::JoinString = cluster.join.parse().expect("a credential");
    let secret = admin.token;
    wait_until("the HTTP API", Duration::from_secs(30), || {
        http_get(&http, "/healthz").filter(|(status, _)| *status == 200)
    });
    cluster.start_node("n1", 2, 4);
    cluster.wait_for_nodes(1);

    let experiment = must_run_dashboard_sweep(&cluster);
    let trial = format!("{experiment}-t0");
    // Without the browser: pages and assets need a credential and carry the
    // security headers; the page names its scripts, which are served.
    let bearer = format!("Bearer {secret}");
    let auth = [("Authorization", bearer.as_str())];
    check_pages_need_a_credential_and_carry_headers(&http, &auth, &experiment);
    // The dashboard's own endpoints answer.
    check_curves_endpoint(&http, &auth, &experiment);
    check_every_page_in_a_browser(&http, &secret, &experiment, &trial);
}

/// Three trials on the node's two declared GPUs, each reporting five steps of
/// `loss`; the `tag` parameter is HTML. Run to their end; the experiment.
fn must_run_dashboard_sweep(cluster: &TestCluster) -> String {
    let spec = cluster.write_file(
        "sweep.yaml",
        &format!(
            "name: dashboard\ntrial:\n  command: [sh, -c, 'for s in 1 2 3 4 5; do echo \"XP_METRIC {{\\\"step\\\": $s, \\\"loss\\\": $(( {{x}} * 100 / s ))}}\"; done; echo \"done {{tag}}\"']\n  resources: {{gpu: 1, cpu: 1}}\nsearch:\n  algorithm: grid\n  space:\n    x: {{choice: [1, 2, 3]}}\n    tag: {{choice: ['{HOSTILE}']}}\n  metric: loss\n"
        ),
    );
    let experiment = cluster
        .must_xp(&["submit", spec.to_str().expect("a UTF-8 path")])
        .trim()
        .to_owned();
    cluster.wait_finished(&experiment, Duration::from_secs(120));
    experiment
}

/// A page without a credential goes to the login, an asset is refused; with
/// one, a page carries the security headers and names plotly.js, which the
/// head serves.
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
    let (status, _, _) = http_exchange(http, "GET", "/assets/app.js", &[], "");
    assert_eq!(status, 401, "an asset without a credential");
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
        body.contains("plotly.js v"),
        "plotly.js is served from the head"
    );
}

/// The learning curves endpoint answers one series per trial, by step.
fn check_curves_endpoint(http: &str, auth: &[(&str, &str)], experiment: &str) {
    let (status, _, body) = http_exchange(
        http,
        "GET",
        &format!("/api/experiments/{experiment}/curves?series=50"),
        auth,
        "",
    );
    assert_eq!(status, 200, "{body}");
    let curves: Value = serde_json::from_str(&body).expect("curves are JSON");
    assert_eq!(curves["series"].as_array().map(Vec::len), Some(3), "{body}");
    assert_eq!(
        curves["series"][0]["steps"],
        json!([1, 2, 3, 4, 5]),
        "{body}"
    );
}

/// Visits every page in headless Chromium through ChromeDriver, where both
/// are installed, keeping a screenshot of each.
#[expect(
    clippy::print_stderr,
    reason = "say why the browser part is skipped and where the screenshots are"
)]
fn check_every_page_in_a_browser(http: &str, secret: &str, experiment: &str, trial: &str) {
    let (Some(chromium), Some(chromedriver)) = (find("chromium"), find("chromedriver")) else {
        eprintln!("skipped the browser: Debian's chromium and chromium-driver are not installed");
        return;
    };
    let port = free_tcp_port();
    let driver = Killed(
        Command::new(&chromedriver)
            .arg(format!("--port={port}"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start chromedriver"),
    );
    let driver_addr = format!("127.0.0.1:{port}");
    let profile = tempfile::tempdir().expect("a browser profile directory");
    let shots = screenshot_dir();
    std::fs::create_dir_all(&shots).expect("the screenshot directory");
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a tokio runtime");
    let browser = Browser {
        chromium,
        driver_addr,
        profile: profile.path().to_owned(),
        base: format!("http://{http}"),
        shots: shots.clone(),
    };
    runtime.block_on(browser.visit_every_page(secret, experiment, trial));
    drop(driver);
    eprintln!("dashboard screenshots: {}", shots.display());
}

/// One browser session's settings.
struct Browser {
    chromium: PathBuf,
    driver_addr: String,
    profile: PathBuf,
    base: String,
    shots: PathBuf,
}

impl Browser {
    async fn visit_every_page(&self, secret: &str, experiment: &str, trial: &str) {
        let client = self.connect().await;
        let session = client
            .session_id()
            .await
            .expect("the session id")
            .expect("a session");
        // Logging in sets the cookie and lands on the experiments page.
        client
            .goto(&format!("{}/login?token={secret}", self.base))
            .await
            .expect("open the login");
        let page = Page {
            client: &client,
            session: &session,
            browser: self,
        };
        page.check_experiments(experiment).await;
        page.check_experiment(experiment).await;
        page.check_trial(trial).await;
        page.check_queues_nodes_and_cluster().await;
        client.close().await.expect("close the browser");
    }

    /// A ChromeDriver session of headless Chromium; ChromeDriver takes a
    /// moment to listen, so this tries until a deadline.
    async fn connect(&self) -> fantoccini::Client {
        let mut capabilities = serde_json::Map::new();
        capabilities.insert(
            "goog:chromeOptions".to_owned(),
            json!({
                "binary": self.chromium,
                "args": [
                    "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
                    "--no-first-run", "--disable-background-networking",
                    "--disable-component-update", "--disable-sync",
                    "--disable-dev-shm-usage", "--window-size=1440,2000",
                    format!("--user-data-dir={}", self.profile.display()),
                ],
            }),
        );
        capabilities.insert("goog:loggingPrefs".to_owned(), json!({"browser": "ALL"}));
        // ChromeDriver takes a moment to listen: try until a deadline.
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let connected = fantoccini::ClientBuilder::new(
                hyper_util::client::legacy::connect::HttpConnector::new(),
            )
            .capabilities(capabilities.clone())
            .connect(&format!("http://{}", self.driver_addr))
            .await;
            match connected {
                Ok(client) => break client,
                Err(error) if Instant::now() > deadline => {
                    panic!("no ChromeDriver session within a minute: {error}")
                }
                Err(_) => tokio::time::sleep(Duration::from_millis(200)).await,
            }
        }
    }
}

impl Page<'_> {
    /// The experiments page lists the experiment.
    async fn check_experiments(&self, experiment: &str) {
        self.wait_for(
            "the experiment on the experiments page",
            "return (document.getElementById('experiments') || {}).textContent || ''",
            |text| text.as_str().is_some_and(|text| text.contains(experiment)),
        )
        .await;
        self.done("experiments").await;
    }

    /// The experiment's page: its id, its trials, their curves, the search
    /// plot, and the configuration's HTML shown as text.
    async fn check_experiment(&self, experiment: &str) {
        self.open(&format!("/experiments/{experiment}")).await;
        self.wait_for(
            "the experiment's id",
            "return document.getElementById('experiment-id').textContent",
            |text| text.as_str() == Some(experiment),
        )
        .await;
        self.wait_for(
            "its three trials in the table",
            "return document.querySelectorAll('#trials tbody tr').length",
            |rows| rows.as_u64() == Some(3),
        )
        .await;
        self.wait_for(
        "one learning curve per trial",
        "const gd = document.getElementById('curves'); return gd && gd.data ? gd.data.length : -1",
        |series| series.as_i64() == Some(3),
    )
    .await;
        self.wait_for(
        "a parameter against the metric, one point per trial",
        "const gd = document.getElementById('search'); return gd && gd.data ? gd.data[0].y.length : -1",
        |points| points.as_i64() == Some(3),
    )
    .await;
        self.wait_for(
            "the configuration's HTML shown as text",
            "return document.getElementById('trials').textContent",
            |text| text.as_str().is_some_and(|text| text.contains(HOSTILE)),
        )
        .await;
        self.wait_for(
        "the configuration's HTML as text in the curves' legend",
        "return [...document.querySelectorAll('#curves .legendtext')].map((e) => e.textContent).join('|')",
        |text| text.as_str().is_some_and(|text| text.contains("<img src=x")),
    )
    .await;
        self.done("experiment").await;
    }

    /// The trial's page: its id, its followed log and its loss curve.
    async fn check_trial(&self, trial: &str) {
        self.open(&format!("/trials/{trial}")).await;
        self.wait_for(
            "the trial's id",
            "return document.getElementById('trial-id').textContent",
            |text| text.as_str() == Some(trial),
        )
        .await;
        self.wait_for(
            "its log, followed",
            "return document.getElementById('log').textContent",
            |text| {
                text.as_str()
                    .is_some_and(|text| text.contains("XP_METRIC") && text.contains("done"))
            },
        )
        .await;
        self.wait_for(
        "its loss curve",
        "const gd = document.querySelector('#trial-curves .js-plotly-plot'); return gd && gd.data ? gd.data[0].x.length : -1",
        |points| points.as_i64() == Some(5),
    )
    .await;
        self.done("trial").await;
    }

    /// The queues, nodes and cluster pages.
    async fn check_queues_nodes_and_cluster(&self) {
        self.open("/queues").await;
        self.wait_for(
        "the default queue",
        "return document.querySelector('main table') ? document.querySelector('main table').textContent : ''",
        |text| text.as_str().is_some_and(|text| text.contains("default")),
    )
    .await;
        self.done("queues").await;

        self.open("/nodes").await;
        self.wait_for(
            "the node and its GPU slots",
            "return document.querySelectorAll('.slot').length",
            |slots| slots.as_u64() == Some(2),
        )
        .await;
        self.done("nodes").await;

        self.open("/cluster").await;
        self.wait_for(
        "the utilisation chart",
        "const gd = document.getElementById('utilization'); return gd && gd.data ? gd.data.length : -1",
        |series| series.as_i64() == Some(2),
    )
    .await;
        self.wait_for(
        "GPU-hours of the default team",
        "const gd = document.getElementById('gpu-hours-by-team'); return gd && gd.data ? gd.data[0].x : []",
        |teams| teams.as_array().is_some_and(|teams| teams.contains(&json!("default"))),
    )
    .await;
        self.done("cluster").await;
    }
}

/// `POST path` to ChromeDriver with a JSON body: its JSON answer, or `None`.
/// ChromeDriver keeps a connection open after `Connection: close`, so the
/// answer is read by its `Content-Length` rather than to the end.
fn driver_post(addr: &str, path: &str, body: &str) -> Option<Value> {
    use std::io::{BufRead, BufReader, Read, Write};
    let mut stream = std::net::TcpStream::connect(addr).ok()?;
    stream
        .set_read_timeout(Some(Duration::from_secs(30)))
        .ok()?;
    write!(
        stream,
        "POST {path} HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    )
    .ok()?;
    let mut reader = BufReader::new(stream);
    let mut length = None;
    loop {
        let mut line = String::new();
        reader.read_line(&mut line).ok()?;
        let line = line.trim_end();
        if line.is_empty() {
            break;
        }
        if let Some((name, value)) = line.split_once(':')
            && name.eq_ignore_ascii_case("content-length")
        {
            length = value.trim().parse::<usize>().ok();
        }
    }
    let mut answer = vec![0; length?];
    reader.read_exact(&mut answer).ok()?;
    serde_json::from_slice(&answer).ok()
}

/// Whether a browser log line is a 404 from an endpoint the dashboard reads
/// only where it exists (other parts' alerts, telemetry and cost report, and a
/// log not written yet): the pages handle those quietly, but Chromium logs
/// every failed load.
fn optional_absent(message: &str) -> bool {
    message.contains("status of 404")
        && ["/api/report", "/api/alerts", "/telemetry", "/logs?"]
            .iter()
            .any(|path| message.contains(path))
}

/// The browser on one page.
struct Page<'a> {
    client: &'a fantoccini::Client,
    session: &'a str,
    browser: &'a Browser,
}

impl Page<'_> {
    async fn open(&self, path: &str) {
        self.client
            .goto(&format!("{}{path}", self.browser.base))
            .await
            .unwrap_or_else(|error| panic!("open {path}: {error}"));
    }

    /// Runs `script` until `done` accepts its value, or panics after a minute.
    async fn wait_for(&self, what: &str, script: &str, done: impl Fn(&Value) -> bool) {
        let deadline = Instant::now() + Duration::from_secs(60);
        let mut last = Value::Null;
        while Instant::now() < deadline {
            match self.client.execute(script, Vec::new()).await {
                Ok(value) if done(&value) => return,
                Ok(value) => last = value,
                Err(error) => last = json!(error.to_string()),
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
        let errors = self.errors().await;
        panic!("{what}: not shown within a minute (last: {last}; errors: {errors:?})");
    }

    /// What went wrong on the page: the dashboard's own hook, and the
    /// browser's log at level SEVERE.
    async fn errors(&self) -> Vec<String> {
        let mut errors: Vec<String> = match self
            .client
            .execute(
                "return window.__xpErrors || ['the dashboard did not load']",
                Vec::new(),
            )
            .await
        {
            Ok(Value::Array(items)) => items.iter().map(ToString::to_string).collect(),
            Ok(other) => vec![format!("unexpected error list {other}")],
            Err(error) => vec![error.to_string()],
        };
        // ChromeDriver's (pre-W3C) log endpoint; fantoccini has no call for it.
        if let Some(log) = driver_post(
            &self.browser.driver_addr,
            &format!("/session/{}/se/log", self.session),
            "{\"type\": \"browser\"}",
        ) {
            for entry in log["value"].as_array().into_iter().flatten() {
                let message = entry["message"].as_str().unwrap_or_default();
                if entry["level"] == "SEVERE" && !optional_absent(message) {
                    errors.push(message.to_owned());
                }
            }
        }
        errors
    }

    /// Checks that the page logged no error and ran no injected HTML, and
    /// keeps its screenshot.
    async fn done(&self, name: &str) {
        let errors = self.errors().await;
        assert!(
            errors.is_empty(),
            "the {name} page logged errors: {errors:#?}"
        );
        let injected = self
            .client
            .execute("return window.__xss === undefined", Vec::new())
            .await
            .expect("run a script");
        assert_eq!(
            injected,
            json!(true),
            "HTML from a configuration ran on the {name} page"
        );
        let png = self.client.screenshot().await.expect("a screenshot");
        let path = self.browser.shots.join(format!("{name}.png"));
        std::fs::write(&path, png).expect("write the screenshot");
    }
}
