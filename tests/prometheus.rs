//! The head's `/metrics` end to end: a real `xp-head` with `--http` and a node
//! with two declared GPUs and telemetry every second run a small sweep whose
//! trials each store a checkpoint; then `/metrics` is refused without a
//! credential and served with one, shows the sweep (trials by state, starts,
//! finishes, GPUs, nodes, decision timings, checkpoint bytes and take times,
//! the node's object store by tier, the refused requests), passes
//! `promtool check metrics`, and a real Prometheus server scraping the head on
//! loopback with the bearer credential answers a query with the sweep's
//! succeeded trials. promtool and prometheus (Debian's `prometheus` package)
//! are skipped, with the reason printed, where they are not installed.

mod common;

use std::io::Write;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use common::{TestCluster, free_tcp_port, http_exchange, http_get, wait_until};

/// `GET path` from the head's HTTP API with `secret` as the bearer token: the
/// status and the body.
fn get_with(addr: &str, path: &str, secret: &str) -> (u16, String) {
    let bearer = format!("Bearer {secret}");
    let (status, _, body) = http_exchange(addr, "GET", path, &[("Authorization", &bearer)], "");
    (status, body)
}

/// The sum of the samples of `name` whose labels contain every one of `labels`
/// (`key="value"` each); `None` when there is none.
fn sum_of(text: &str, name: &str, labels: &[&str]) -> Option<f64> {
    let values: Vec<f64> = text
        .lines()
        .filter(|line| !line.starts_with('#'))
        .filter_map(|line| {
            let (series, value) = line.rsplit_once(' ')?;
            let (series_name, rest) = series.split_once('{').unwrap_or((series, ""));
            (series_name == name && labels.iter().all(|label| rest.contains(label)))
                .then(|| value.parse::<f64>().ok())
                .flatten()
        })
        .collect();
    (!values.is_empty()).then(|| values.iter().sum())
}

/// Whether `program` is on the `PATH`.
fn installed(program: &str) -> bool {
    Command::new("sh")
        .args(["-c", &format!("command -v {program}")])
        .stdout(Stdio::null())
        .status()
        .is_ok_and(|status| status.success())
}

/// A child process killed when dropped (Prometheus must not outlive the test).
struct Killed(Child);

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[test]
fn prometheus_scrapes_the_head_with_a_credential() {
    let http = format!("127.0.0.1:{}", free_tcp_port());
    let mut cluster = TestCluster::start_prepared("10s", &["--http", http.as_str()], |_| {});
    let admin: xp_runtime::join::JoinString = cluster.join.parse().expect("a credential");
    let secret = admin.token;
    wait_until("the HTTP API", Duration::from_secs(30), || {
        http_get(&http, "/healthz").filter(|(status, _)| *status == 200)
    });
    // Telemetry every second: the object store's bytes reach `/metrics` soon.
    cluster.start_node_with("n1", 2, 4, &["--telemetry-interval", "1s"]);
    cluster.wait_for_nodes(1);
    let node = cluster.node_id("n1");
    let experiment = must_run_checkpointed_sweep(&cluster);
    let on_node = format!("node=\"{node}\"");
    check_checkpoints_and_store(&http, &secret, &on_node);
    must_refuse_a_viewers_cancel(&cluster, &experiment);
    // (1) A credential is required, like on every route but /healthz.
    let text = check_metrics_need_a_credential(&http, &secret);
    check_sweep_in_metrics(&text, &on_node, &experiment);
    // (2) promtool accepts the exposition.
    check_promtool_accepts(&text);
    // (3) A real Prometheus scrapes the head and answers a query.
    check_prometheus_scrapes(&http, &secret);
}

/// Three trials, each on one of the node's two declared GPUs, each storing a
/// checkpoint, run to their end; the experiment.
fn must_run_checkpointed_sweep(cluster: &TestCluster) -> String {
    // Three trials, each on one of the node's two declared GPUs, each storing a checkpoint.
    let spec = cluster.write_file(
        "sweep.yaml",
        "name: scraped\ntrial:\n  command: [sh, -c, 'echo {x} > \"$XP_CHECKPOINT_DIR/state\" && echo \"XP_CHECKPOINT {\\\"step\\\": 1}\" && sleep 1 && echo \"XP_METRIC {\\\"loss\\\": {x}}\"']\n  resources: {gpu: 1, cpu: 1}\nsearch:\n  algorithm: grid\n  space: {x: {choice: [1, 2, 3]}}\n  metric: loss\n",
    );
    let experiment = cluster
        .must_xp(&["submit", spec.to_str().unwrap()])
        .trim()
        .to_owned();
    cluster.wait_finished(&experiment, Duration::from_secs(120));
    experiment
}

/// The checkpoints as counted by the head, and the store that holds them as
/// the node's telemetry reports it (by tier); no GPU seen in use without NVML.
fn check_checkpoints_and_store(http: &str, secret: &str, on_node: &str) {
    let text = wait_until(
        "checkpoints and the object store in /metrics",
        Duration::from_secs(60),
        || {
            let (status, text) = get_with(http, "/metrics", secret);
            let stored =
                sum_of(&text, "xp_object_store_bytes", &[on_node]).is_some_and(|bytes| bytes > 0.0);
            let takes = sum_of(&text, "xp_checkpoint_take_seconds_count", &[]);
            (status == 200 && stored && takes == Some(3.0)).then_some(text)
        },
    );
    assert!(
        sum_of(&text, "xp_checkpoint_bytes_total", &[]).is_some_and(|bytes| bytes >= 3.0),
        "{text}"
    );
    assert!(
        sum_of(
            &text,
            "xp_object_store_bytes",
            &[on_node, "tier=\"memory\""]
        )
        .is_some()
            && sum_of(&text, "xp_object_store_bytes", &[on_node, "tier=\"disk\""]).is_some(),
        "{text}"
    );
    if !Path::new("/dev/nvidia0").exists() {
        // Declared GPUs and no NVML: no GPU is seen in use, no utilisation.
        assert_eq!(sum_of(&text, "xp_gpus_in_use", &[]), None, "{text}");
        assert_eq!(
            sum_of(&text, "xp_gpu_utilization_ratios", &[]),
            None,
            "{text}"
        );
    }
}

/// A viewer's cancel is refused by authorization (and so counted).
fn must_refuse_a_viewers_cancel(cluster: &TestCluster, experiment: &str) {
    let added = Command::new(common::binary("xp-head"))
        .args([
            "user", "add", "vera", "--team", "default", "--role", "viewer",
        ])
        .arg("--data-dir")
        .arg(cluster.head_dir())
        .env("XP_LOG", "warn")
        .output()
        .expect("xp-head user add runs");
    assert!(
        added.status.success(),
        "xp-head user add: {}",
        String::from_utf8_lossy(&added.stderr)
    );
    let viewer = String::from_utf8(added.stdout).expect("a credential");
    let cancel = Command::new(env!("CARGO_BIN_EXE_xp"))
        .args(["cancel", experiment])
        .env("XP_CLUSTER", viewer.trim())
        .output()
        .expect("xp runs");
    assert!(!cancel.status.success(), "a viewer's cancel was allowed");
}

/// `/metrics` refused without a credential and with a wrong one, served with
/// the admin's; its text.
fn check_metrics_need_a_credential(http: &str, secret: &str) -> String {
    let (status, _) = http_get(http, "/metrics").expect("the HTTP API answers");
    assert_eq!(status, 401, "/metrics without a credential");
    let (status, text) = get_with(http, "/metrics", "not-a-secret");
    assert_eq!(status, 401, "/metrics with a wrong credential: {text}");
    let (status, text) = get_with(http, "/metrics", secret);
    assert_eq!(status, 200, "/metrics: {text}");
    text
}

/// The sweep as the metrics show it: trials, starts, finishes, decisions,
/// GPUs, nodes, refusals; and no id as a label.
fn check_sweep_in_metrics(text: &str, on_node: &str, experiment: &str) {
    assert_eq!(
        sum_of(text, "xp_trials", &["state=\"succeeded\""]),
        Some(3.0),
        "{text}"
    );
    assert_eq!(
        sum_of(text, "xp_trial_finishes_total", &["outcome=\"succeeded\""]),
        Some(3.0),
        "{text}"
    );
    assert!(
        sum_of(text, "xp_trial_starts_total", &[]).is_some_and(|starts| starts >= 3.0),
        "{text}"
    );
    assert!(
        sum_of(text, "xp_scheduling_decision_seconds_count", &[]).is_some_and(|count| count >= 1.0),
        "{text}"
    );
    assert_eq!(
        sum_of(text, "xp_gpus", &[on_node, "model=\"declared\""]),
        Some(2.0),
        "{text}"
    );
    assert_eq!(
        sum_of(text, "xp_gpus_allocated", &[on_node]),
        Some(0.0),
        "{text}"
    );
    assert_eq!(
        sum_of(text, "xp_nodes", &["state=\"ready\""]),
        Some(1.0),
        "{text}"
    );
    // The two refused scrapes, and the submission over QUIC.
    assert_eq!(
        sum_of(
            text,
            "xp_api_errors_total",
            &["api=\"http\"", "kind=\"/metrics\"", "code=\"401\""]
        ),
        Some(2.0),
        "{text}"
    );
    assert_eq!(
        sum_of(
            text,
            "xp_api_requests_total",
            &["api=\"quic\"", "kind=\"submit\""]
        ),
        Some(1.0),
        "{text}"
    );
    assert_eq!(
        sum_of(
            text,
            "xp_authorization_refusals_total",
            &["action=\"cancel\"", "role=\"viewer\""]
        ),
        Some(1.0),
        "{text}"
    );
    // No trial or experiment id is a label.
    assert!(!text.contains(experiment), "{text}");
}

/// `promtool check metrics` accepts the exposition, where promtool is installed.
fn check_promtool_accepts(text: &str) {
    if installed("promtool") {
        let mut promtool = Command::new("promtool")
            .args(["check", "metrics"])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start promtool");
        promtool
            .stdin
            .take()
            .expect("promtool's stdin")
            .write_all(text.as_bytes())
            .expect("write to promtool");
        let checked = promtool.wait_with_output().expect("promtool ends");
        assert!(
            checked.status.success(),
            "promtool check metrics: {}{}\n{text}",
            String::from_utf8_lossy(&checked.stdout),
            String::from_utf8_lossy(&checked.stderr)
        );
    } else {
        common::cannot_run(
            "promtool check metrics: promtool is not installed (apt-get install prometheus)",
        );
    }
}

/// A real Prometheus scraping the head with the bearer credential answers a
/// query with the sweep's succeeded trials, where prometheus is installed.
fn check_prometheus_scrapes(http: &str, secret: &str) {
    if !installed("prometheus") {
        common::cannot_run(
            "the Prometheus scrape: prometheus is not installed (apt-get install prometheus)",
        );
        return;
    }
    let dir = tempfile::tempdir().expect("a temporary directory");
    let credentials = dir.path().join("secret");
    std::fs::write(&credentials, secret).expect("write the credentials file");
    let config = dir.path().join("prometheus.yml");
    std::fs::write(
        &config,
        format!(
            "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\nscrape_configs:\n  - job_name: xp\n    authorization:\n      type: Bearer\n      credentials_file: {}\n    static_configs:\n      - targets: ['{http}']\n",
            credentials.display()
        ),
    )
    .expect("write the Prometheus configuration");
    let web = format!("127.0.0.1:{}", free_tcp_port());
    let log = std::fs::File::create(dir.path().join("prometheus.log")).expect("a log file");
    let _prometheus = Killed(
        Command::new("prometheus")
            .arg(format!("--config.file={}", config.display()))
            .arg(format!(
                "--storage.tsdb.path={}",
                dir.path().join("data").display()
            ))
            .arg(format!("--web.listen-address={web}"))
            .stdout(log.try_clone().expect("the log file"))
            .stderr(log)
            .spawn()
            .expect("start prometheus"),
    );
    // sum(xp_trials{state="succeeded"}), URL-encoded.
    let query = "/api/v1/query?query=sum%28xp_trials%7Bstate%3D%22succeeded%22%7D%29";
    let answered = std::panic::catch_unwind(|| {
        wait_until(
            "Prometheus to scrape 3 succeeded trials",
            Duration::from_secs(120),
            || {
                let (status, body) = http_get(&web, query)?;
                let answer: serde_json::Value = serde_json::from_str(&body).ok()?;
                let value = answer["data"]["result"][0]["value"][1].as_str()?.to_owned();
                (status == 200 && value == "3").then_some(value)
            },
        )
    });
    if answered.is_err() {
        print_prometheus_state(&web, dir.path());
        panic!("Prometheus never answered 3 succeeded trials");
    }
    // The target is up: the scrape carried the credential.
    let (_, up) = http_get(&web, "/api/v1/query?query=up%7Bjob%3D%22xp%22%7D").expect("up");
    assert!(up.contains("\"1\"]"), "up{{job=\"xp\"}}: {up}");
}

/// What Prometheus says of its targets, and its log, for a failed wait.
#[expect(clippy::print_stderr, reason = "show why a wait failed")]
fn print_prometheus_state(web: &str, dir: &Path) {
    eprintln!("targets: {:?}", http_get(web, "/api/v1/targets"));
    eprintln!(
        "prometheus log:\n{}",
        std::fs::read_to_string(dir.join("prometheus.log")).unwrap_or_default()
    );
}
