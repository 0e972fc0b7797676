//! Alerts end to end: a real `xp-head` (with a policy declaring a default
//! threshold rule, and `--http`) and a real `xp-node`, command trials that
//! print what real trainers print, and a tiny HTTP receiver on 127.0.0.1 in
//! the test standing in for a webhook.
//!
//! - A trial that prints a NaN loss (Python's bare `NaN` token) raises its
//!   `nonfinite` rule, which stops it with the alert as its reason and posts
//!   the alert to the receiver; `xp alerts --json`, `GET /api/alerts`,
//!   `xp metrics --json`, `xp status --json` show the value as "NaN".
//! - A receiver that fails the first two requests gets the third (retried
//!   with back-off), and the alert says it was delivered after 3 attempts.
//! - The policy's default threshold rule fires on an experiment that declares
//!   no rule, as an event only (the trial succeeds).
//! - `/metrics` counts the alerts by kind and action.
//! - Without the policy's allowance, a webhook to 127.0.0.1 is refused: the
//!   delivery fails with the reason, and the receiver is never connected to.

mod common;

use std::io::{Read, Write};
use std::net::TcpListener;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::{TestCluster, free_tcp_port, http_exchange, http_get, wait_until};
use serde_json::Value;

/// One request the receiver got: its path and body.
#[derive(Debug, Clone)]
struct Received {
    path: String,
    body: String,
}

/// A webhook receiver on 127.0.0.1: answers `/flaky` with 500 to its first two
/// requests and 200 after, every other path with 200, and keeps every request.
struct Receiver {
    addr: String,
    received: Arc<Mutex<Vec<Received>>>,
}

impl Receiver {
    fn start() -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind the receiver");
        let addr = listener.local_addr().expect("its address").to_string();
        let received: Arc<Mutex<Vec<Received>>> = Arc::default();
        let kept = received.clone();
        std::thread::spawn(move || {
            for stream in listener.incoming() {
                let Ok(mut stream) = stream else { continue };
                let Some(request) = read_request(&mut stream) else {
                    continue;
                };
                let flaky_seen = {
                    let mut kept = kept.lock().unwrap();
                    kept.push(request.clone());
                    kept.iter().filter(|seen| seen.path == "/flaky").count()
                };
                let status = if request.path == "/flaky" && flaky_seen <= 2 {
                    "500 Internal Server Error"
                } else {
                    "200 OK"
                };
                let _ = stream.write_all(
                    format!("HTTP/1.1 {status}\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
                        .as_bytes(),
                );
            }
        });
        Self { addr, received }
    }

    fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.addr)
    }

    fn requests_to(&self, path: &str) -> Vec<Received> {
        self.received
            .lock()
            .unwrap()
            .iter()
            .filter(|request| request.path == path)
            .cloned()
            .collect()
    }
}

/// Reads one HTTP/1.1 request: its path and its body (by `Content-Length`).
fn read_request(stream: &mut std::net::TcpStream) -> Option<Received> {
    stream
        .set_read_timeout(Some(Duration::from_secs(10)))
        .ok()?;
    let mut bytes = Vec::new();
    let mut chunk = [0u8; 4096];
    let header_end = loop {
        if let Some(end) = bytes.windows(4).position(|window| window == b"\r\n\r\n") {
            break end + 4;
        }
        let read = stream.read(&mut chunk).ok()?;
        if read == 0 || bytes.len() > 1 << 20 {
            return None;
        }
        bytes.extend_from_slice(&chunk[..read]);
    };
    let head = String::from_utf8_lossy(&bytes[..header_end]).to_string();
    let path = head.split_whitespace().nth(1)?.to_owned();
    let length: usize = head
        .lines()
        .find_map(|line| {
            let (name, value) = line.split_once(':')?;
            name.eq_ignore_ascii_case("content-length")
                .then(|| value.trim().parse().ok())
                .flatten()
        })
        .unwrap_or(0);
    while bytes.len() < header_end + length {
        let read = stream.read(&mut chunk).ok()?;
        if read == 0 {
            return None;
        }
        bytes.extend_from_slice(&chunk[..read]);
    }
    let body = String::from_utf8_lossy(&bytes[header_end..header_end + length]).to_string();
    Some(Received { path, body })
}

/// `xp alerts EXPERIMENT --json`, one object per line.
fn alerts(cluster: &TestCluster, experiment: &str) -> Vec<Value> {
    cluster
        .must_xp(&["alerts", experiment, "--json"])
        .lines()
        .map(|line| serde_json::from_str(line).expect("an alert is JSON"))
        .collect()
}

fn submit(cluster: &TestCluster, name: &str, yaml: &str) -> String {
    let spec = cluster.write_file(name, yaml);
    cluster
        .must_xp(&["submit", spec.to_str().unwrap()])
        .trim()
        .to_owned()
}

#[test]
fn nan_alerts_stop_post_retry_and_policy_defaults_fire() {
    let receiver = Receiver::start();
    let policy_dir = tempfile::tempdir().expect("a directory for the policy");
    let policy = policy_dir.path().join("policy.yaml");
    std::fs::write(
        &policy,
        // The receiver is on loopback, which webhooks may reach only when the
        // policy allows it.
        "alerts:\n  - {name: grad-explodes, kind: threshold, metric: grad_norm, above: 1000}\nwebhooks: {allow: [127.0.0.0/8]}\n",
    )
    .expect("write the policy");
    let http = format!("127.0.0.1:{}", free_tcp_port());
    let mut cluster = TestCluster::start_prepared(
        "10s",
        &[
            "--policy",
            policy.to_str().unwrap(),
            "--http",
            http.as_str(),
        ],
        |_| {},
    );
    let admin: xp_runtime::join::JoinString = cluster.join.parse().expect("a credential");
    cluster.start_node("n1", 0, 4);
    cluster.wait_for_nodes(1);

    // (1) A NaN loss, as Python's json.dumps prints it, stops the trial and is posted.
    let (nan, trial_id) = check_nan_loss_stops_its_trial(&cluster, &receiver);
    check_nan_alert_posted_and_recorded(&cluster, &receiver, &nan, &trial_id);
    // (2) A receiver that fails twice gets the third attempt.
    check_flaky_receiver_gets_the_third_attempt(&cluster, &receiver);
    check_dead_receiver_is_given_up(&cluster);
    // (3) The policy's threshold rule fires on an experiment that declares none.
    let plain = check_policy_threshold_fires(&cluster);
    check_every_alert_newest_first(&cluster, &plain);
    check_http_pages_and_counts_alerts(&http, &admin.token, &nan);
}

/// An experiment whose loss becomes NaN is stopped by its `nan-loss` rule, and
/// its status and metrics say so; the experiment and its trial.
fn check_nan_loss_stops_its_trial(cluster: &TestCluster, receiver: &Receiver) -> (String, String) {
    let nan = submit(
        cluster,
        "nan.yaml",
        &format!(
            "name: nan-stop\ntrial:\n  command: [sh, -c, 'echo \"XP_METRIC {{\\\"step\\\": 1, \\\"loss\\\": 0.5}}\"; echo \"XP_METRIC {{\\\"step\\\": 2, \\\"loss\\\": NaN}}\"; sleep 120']\n  resources: {{cpu: 1}}\nsearch: {{metric: loss}}\nalerts:\n  - name: nan-loss\n    kind: nonfinite\n    metric: loss\n    action: [stop, {{webhook: \"{}\"}}]\n",
            receiver.url("/hook")
        ),
    );
    let status = cluster.wait_finished(&nan, Duration::from_secs(120));
    let trial = &status["trials"][0];
    assert_eq!(trial["state"], "stopped", "{status}");
    let reason = trial["reason"].as_str().unwrap();
    assert!(
        reason.starts_with("alert `nan-loss`: loss is NaN at step 2"),
        "{reason}"
    );
    assert_eq!(trial["metrics"]["loss"], "NaN", "{trial}");
    assert_eq!(trial["nonfinite"]["loss"], "NaN", "{trial}");
    let trial_id = trial["id"].as_str().unwrap().to_owned();
    let history = cluster.must_xp(&["metrics", &trial_id, "--json"]);
    let loss: Value = serde_json::from_str(history.lines().next().unwrap()).unwrap();
    assert_eq!(loss["values"], serde_json::json!([0.5, "NaN"]), "{loss}");
    // The text view says so too, with the reason.
    let text = cluster.must_xp(&["status", &nan]);
    assert!(text.contains("loss=NaN"), "{text}");
    assert!(text.contains("stopped: alert `nan-loss`"), "{text}");
    (nan, trial_id)
}

/// The `nan-loss` alert is posted to the webhook with its fields, and recorded
/// as delivered beside the built-in rule's.
fn check_nan_alert_posted_and_recorded(
    cluster: &TestCluster,
    receiver: &Receiver,
    nan: &str,
    trial_id: &str,
) {
    let posted = wait_until("the webhook POST", Duration::from_secs(60), || {
        receiver.requests_to("/hook").first().cloned()
    });
    let body: Value = serde_json::from_str(&posted.body).expect("the body is JSON");
    assert_eq!(body["rule"], "nan-loss", "{body}");
    assert_eq!(body["experiment"], nan, "{body}");
    assert_eq!(body["trial"], trial_id, "{body}");
    assert_eq!(body["metric"], "loss", "{body}");
    assert_eq!(body["value"], "NaN", "{body}");
    assert_eq!(body["step"], 2, "{body}");
    assert!(
        body["time"]
            .as_str()
            .is_some_and(|time| time.ends_with('Z')),
        "{body}"
    );
    assert!(body["message"].as_str().is_some(), "{body}");
    let listed = wait_until(
        "the delivery to be recorded",
        Duration::from_secs(60),
        || {
            let listed = alerts(cluster, nan);
            listed
                .iter()
                .any(|alert| alert["rule"] == "nan-loss" && alert["delivery"] == "delivered")
                .then_some(listed)
        },
    );
    let raised = listed
        .iter()
        .find(|alert| alert["rule"] == "nan-loss")
        .unwrap();
    assert_eq!(raised["value"], "NaN");
    assert_eq!(raised["trial"], trial_id);
    assert_eq!(
        raised["actions"],
        serde_json::json!(["event", "stop", "webhook"])
    );
    // The built-in rule caught the same value, as an event.
    assert!(
        listed.iter().any(|alert| alert["rule"] == "nonfinite"),
        "{listed:?}"
    );
}

/// A receiver that fails twice gets the third attempt, and the table says so.
fn check_flaky_receiver_gets_the_third_attempt(cluster: &TestCluster, receiver: &Receiver) {
    let flaky = submit(
        cluster,
        "flaky.yaml",
        &format!(
            "name: flaky\ntrial:\n  command: [sh, -c, 'echo \"XP_METRIC {{\\\"loss\\\": \\\"inf\\\"}}\"']\n  resources: {{cpu: 1}}\nalerts:\n  - kind: nonfinite\n    action: {{webhook: \"{}\"}}\n",
            receiver.url("/flaky")
        ),
    );
    let status = cluster.wait_finished(&flaky, Duration::from_secs(120));
    assert_eq!(
        status["trials"][0]["state"], "succeeded",
        "an event and a webhook do not stop it: {status}"
    );
    let delivered = wait_until("the retried delivery", Duration::from_secs(60), || {
        alerts(cluster, &flaky)
            .into_iter()
            .find(|alert| alert["delivery"] == "delivered")
    });
    assert_eq!(delivered["delivery_attempts"], 3, "{delivered}");
    assert_eq!(delivered["value"], "Infinity", "{delivered}");
    assert_eq!(receiver.requests_to("/flaky").len(), 3);
    let table = cluster.must_xp(&["alerts", &flaky]);
    assert!(table.contains("delivered (3 tries)"), "{table}");
}

/// A receiver that never answers is given up on after every attempt, and says why.
fn check_dead_receiver_is_given_up(cluster: &TestCluster) {
    let closed = format!("http://127.0.0.1:{}/gone", free_tcp_port());
    let dead = submit(
        cluster,
        "dead.yaml",
        &format!(
            "name: dead\ntrial:\n  command: [sh, -c, 'echo \"XP_METRIC {{\\\"loss\\\": null}}\"']\n  resources: {{cpu: 1}}\nalerts:\n  - kind: nonfinite\n    action: {{webhook: \"{closed}\"}}\n",
        ),
    );
    let failed = wait_until(
        "the delivery to be given up",
        Duration::from_secs(120),
        || {
            alerts(cluster, &dead)
                .into_iter()
                .find(|alert| alert["delivery"] == "failed")
        },
    );
    assert_eq!(failed["delivery_attempts"], 5, "{failed}");
    // A few words, never the URL (it may hold a secret token).
    assert_eq!(failed["delivery_error"], "connection refused", "{failed}");
    assert_eq!(failed["value"], "NaN", "a null is a NaN: {failed}");
}

/// The policy's threshold rule fires on an experiment that declares none; the experiment.
fn check_policy_threshold_fires(cluster: &TestCluster) -> String {
    let plain = submit(
        cluster,
        "plain.yaml",
        "name: plain\ntrial:\n  command: [sh, -c, 'echo \"XP_METRIC {\\\"step\\\": 5, \\\"grad_norm\\\": 5000}\"']\n  resources: {cpu: 1}\n",
    );
    let status = cluster.wait_finished(&plain, Duration::from_secs(120));
    assert_eq!(status["trials"][0]["state"], "succeeded", "{status}");
    let listed = alerts(cluster, &plain);
    assert_eq!(listed.len(), 1, "{listed:?}");
    assert_eq!(listed[0]["rule"], "grad-explodes");
    assert_eq!(listed[0]["kind"], "threshold");
    assert_eq!(listed[0]["value"], 5000.0);
    assert_eq!(listed[0]["step"], 5);
    assert_eq!(listed[0]["actions"], serde_json::json!(["event"]));
    plain
}

/// Every experiment's alerts, newest first, without naming one.
fn check_every_alert_newest_first(cluster: &TestCluster, plain: &str) {
    let all: Vec<Value> = cluster
        .must_xp(&["alerts", "--json"])
        .lines()
        .map(|line| serde_json::from_str(line).unwrap())
        .collect();
    assert!(all.len() >= 5, "{all:?}");
    assert_eq!(all[0]["experiment"], plain);
}

/// The HTTP API pages the alerts (and needs a credential), and /metrics counts them.
fn check_http_pages_and_counts_alerts(http: &str, token: &str, nan: &str) {
    wait_until("the HTTP API", Duration::from_secs(30), || {
        http_get(http, "/healthz").filter(|(status, _)| *status == 200)
    });
    let bearer = format!("Bearer {}", token);
    let (code, _, body) = http_exchange(
        http,
        "GET",
        &format!("/api/alerts?experiment={nan}&limit=1"),
        &[("Authorization", &bearer)],
        "",
    );
    assert_eq!(code, 200, "{body}");
    let page: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(page["total"], 2, "{page}");
    assert_eq!(page["items"].as_array().unwrap().len(), 1, "{page}");
    let cursor = page["next_cursor"]
        .as_str()
        .expect("a second page")
        .to_owned();
    let (code, _, body) = http_exchange(
        http,
        "GET",
        &format!("/api/alerts?experiment={nan}&limit=1&cursor={cursor}"),
        &[("Authorization", &bearer)],
        "",
    );
    assert_eq!(code, 200, "{body}");
    let second: Value = serde_json::from_str(&body).unwrap();
    assert_ne!(second["items"][0]["id"], page["items"][0]["id"]);
    assert!(second["next_cursor"].is_null(), "{second}");
    let (code, _, _) = http_exchange(
        http,
        "GET",
        "/api/alerts?experiment=nope",
        &[("Authorization", &bearer)],
        "",
    );
    assert_eq!(code, 400);
    let (code, _) = http_get(http, "/api/alerts").unwrap();
    assert_eq!(code, 401, "a credential is needed");
    let (code, _, metrics) =
        http_exchange(http, "GET", "/metrics", &[("Authorization", &bearer)], "");
    assert_eq!(code, 200);
    for series in [
        "xp_alerts_raised_total{kind=\"nonfinite\",action=\"stop\"} 1",
        "xp_alerts_raised_total{kind=\"threshold\",action=\"event\"} 1",
        "xp_alert_webhook_deliveries_total{outcome=\"delivered\"} 2",
        "xp_alert_webhook_deliveries_total{outcome=\"failed\"} 1",
    ] {
        assert!(
            metrics.contains(series),
            "{series} missing from:\n{metrics}"
        );
    }
}

#[test]
fn a_webhook_to_loopback_is_refused_without_the_allowance() {
    let receiver = Receiver::start();
    let mut cluster = TestCluster::start_prepared("10s", &[], |_| {});
    cluster.start_node("n1", 0, 2);
    cluster.wait_for_nodes(1);
    let url = receiver.url("/hook?token=secret");
    let experiment = submit(
        &cluster,
        "refused.yaml",
        &format!(
            "name: refused\ntrial:\n  command: [sh, -c, 'echo \"XP_METRIC {{\\\"loss\\\": NaN}}\"']\n  resources: {{cpu: 1}}\nalerts:\n  - kind: nonfinite\n    action: {{webhook: \"{url}\"}}\n",
        ),
    );
    let failed = wait_until(
        "the delivery to be refused",
        Duration::from_secs(120),
        || {
            alerts(&cluster, &experiment)
                .into_iter()
                .find(|alert| alert["delivery"] == "failed")
        },
    );
    assert_eq!(
        failed["delivery_attempts"], 0,
        "no attempt was made: {failed}"
    );
    let error = failed["delivery_error"].as_str().expect("a reason");
    assert!(
        error.contains("loopback") && error.contains("webhooks"),
        "{error}"
    );
    assert!(
        !error.contains("secret") && !error.contains("/hook"),
        "{error}"
    );
    assert!(
        receiver.received.lock().unwrap().is_empty(),
        "the receiver was connected to"
    );
    let table = cluster.must_xp(&["alerts", &experiment]);
    assert!(
        table.contains("failed (0 tries): address not allowed"),
        "{table}"
    );
}
