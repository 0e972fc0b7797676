//! The dashboard test's browser: headless Chromium through ChromeDriver
//! (`fantoccini`), one session for the whole test, and what every page check
//! shares: opening a page, waiting for a script's answer, collecting the
//! page's errors, and keeping a screenshot.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use serde_json::{Value, json};
use tokio::time::Instant;

use crate::common;

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

/// Where the screenshots go: `target/dashboard-screenshots/`.
fn screenshot_dir() -> PathBuf {
    let target = common::bin_dir()
        .parent()
        .map(Path::to_path_buf)
        .unwrap_or_else(common::bin_dir);
    target.join("dashboard-screenshots")
}

/// One browser session's settings.
pub(crate) struct Browser {
    driver_addr: String,
    pub(crate) base: String,
    shots: PathBuf,
}

/// A browser session held for the whole test, with the runtime that drives it.
pub(crate) struct BrowserRun {
    runtime: tokio::runtime::Runtime,
    client: fantoccini::Client,
    session: String,
    browser: Browser,
    _profile: tempfile::TempDir,
    _driver: Killed,
}

impl BrowserRun {
    /// A session of headless Chromium on the dashboard at `http`, or `None`
    /// (saying why) where Chromium or ChromeDriver is not installed.
    #[expect(clippy::print_stderr, reason = "say why the browser part is skipped")]
    pub(crate) fn start(http: &str) -> Option<Self> {
        let (Some(chromium), Some(chromedriver)) = (find("chromium"), find("chromedriver")) else {
            eprintln!(
                "skipped the browser: Debian's chromium and chromium-driver are not installed"
            );
            return None;
        };
        let port = common::free_tcp_port();
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
        let client = runtime.block_on(connect(&chromium, &driver_addr, profile.path()));
        let session = runtime
            .block_on(client.session_id())
            .expect("the session id")
            .expect("a session");
        Some(Self {
            runtime,
            client,
            session,
            browser: Browser {
                driver_addr,
                base: format!("http://{http}"),
                shots,
            },
            _profile: profile,
            _driver: driver,
        })
    }

    /// The browser on whatever page it shows.
    pub(crate) fn page(&self) -> Page<'_> {
        Page {
            client: &self.client,
            session: &self.session,
            browser: &self.browser,
        }
    }

    /// Runs one page check to its end.
    pub(crate) fn run<F: Future>(&self, check: F) -> F::Output {
        self.runtime.block_on(check)
    }

    /// Closes the browser and says where the screenshots are.
    #[expect(clippy::print_stderr, reason = "say where the screenshots are")]
    pub(crate) fn finish(self) {
        self.runtime
            .block_on(self.client.clone().close())
            .expect("close the browser");
        eprintln!("dashboard screenshots: {}", self.browser.shots.display());
    }
}

/// A ChromeDriver session of headless Chromium (WebGL by SwiftShader, for
/// the parallel coordinates); ChromeDriver takes a moment to listen, so this
/// tries until a deadline.
async fn connect(chromium: &Path, driver_addr: &str, profile: &Path) -> fantoccini::Client {
    let mut capabilities = serde_json::Map::new();
    capabilities.insert(
        "goog:chromeOptions".to_owned(),
        json!({
            "binary": chromium,
            "args": [
                "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
                "--enable-unsafe-swiftshader", "--use-angle=swiftshader",
                "--no-first-run", "--disable-background-networking",
                "--disable-component-update", "--disable-sync",
                "--disable-dev-shm-usage", "--window-size=1440,2000",
                format!("--user-data-dir={}", profile.display()),
            ],
        }),
    );
    capabilities.insert("goog:loggingPrefs".to_owned(), json!({"browser": "ALL"}));
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let connected = fantoccini::ClientBuilder::new(
            hyper_util::client::legacy::connect::HttpConnector::new(),
        )
        .capabilities(capabilities.clone())
        .connect(&format!("http://{driver_addr}"))
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
pub(crate) struct Page<'a> {
    pub(crate) client: &'a fantoccini::Client,
    session: &'a str,
    pub(crate) browser: &'a Browser,
}

impl Page<'_> {
    pub(crate) async fn open(&self, path: &str) {
        self.client
            .goto(&format!("{}{path}", self.browser.base))
            .await
            .unwrap_or_else(|error| panic!("open {path}: {error}"));
    }

    /// Runs `script` and answers its value.
    pub(crate) async fn value(&self, script: &str) -> Value {
        self.client
            .execute(script, Vec::new())
            .await
            .unwrap_or_else(|error| panic!("{script}: {error}"))
    }

    /// Runs `script` until `done` accepts its value, or panics after a minute.
    pub(crate) async fn wait_for(
        &self,
        what: &str,
        script: &str,
        done: impl Fn(&Value) -> bool,
    ) -> Value {
        let deadline = Instant::now() + Duration::from_secs(60);
        let mut last = Value::Null;
        while Instant::now() < deadline {
            match self.client.execute(script, Vec::new()).await {
                Ok(value) if done(&value) => return value,
                Ok(value) => last = value,
                Err(error) => last = json!(error.to_string()),
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
        let errors = self.errors().await;
        let footer = self
            .client
            .execute("const node = document.getElementById('status'); return node ? node.textContent : ''", Vec::new())
            .await
            .unwrap_or_default();
        panic!(
            "{what}: not shown within a minute (last: {last}; errors: {errors:?}; footer: {footer})"
        );
    }

    /// What went wrong on the page: the dashboard's own hook (unless
    /// `hooked` is false: the login page runs no script), and the browser's
    /// log at level SEVERE.
    async fn page_errors(&self, hooked: bool) -> Vec<String> {
        let mut errors: Vec<String> = if hooked {
            match self
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
            }
        } else {
            Vec::new()
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

    pub(crate) async fn errors(&self) -> Vec<String> {
        self.page_errors(true).await
    }

    /// Checks that the page logged no error and ran no injected HTML, and
    /// keeps its screenshot.
    pub(crate) async fn done(&self, name: &str) {
        self.done_with(name, true).await;
    }

    /// As [`Self::done`]; `hooked` says whether the page runs the dashboard's
    /// script (and so its error hook).
    pub(crate) async fn done_with(&self, name: &str, hooked: bool) {
        let errors = self.page_errors(hooked).await;
        assert!(
            errors.is_empty(),
            "the {name} page logged errors: {errors:#?}"
        );
        let injected = self.value("return window.__xss === undefined").await;
        assert_eq!(
            injected,
            json!(true),
            "HTML from a configuration ran on the {name} page"
        );
        self.screenshot(name).await;
    }

    /// Keeps a screenshot of what the window shows as `name.png`.
    pub(crate) async fn screenshot(&self, name: &str) {
        let png = self.client.screenshot().await.expect("a screenshot");
        let path = self.browser.shots.join(format!("{name}.png"));
        std::fs::write(&path, png).expect("write the screenshot");
    }

    /// Scrolls the element `selector` to the top of the window, then keeps
    /// a screenshot.
    pub(crate) async fn screenshot_at(&self, selector: &str, name: &str) {
        self.value(&format!(
            "const node = document.querySelector({selector:?}); node.scrollIntoView({{block: 'start'}}); window.scrollBy(0, -60); return true"
        ))
        .await;
        tokio::time::sleep(Duration::from_millis(300)).await;
        self.screenshot(name).await;
        self.value("window.scrollTo(0, 0); return true").await;
    }
}
