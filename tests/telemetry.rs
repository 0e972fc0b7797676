//! Telemetry end to end: a real `xp-head` with `--http` and an `xp-node`
//! sampling every second run a command trial that burns CPU and holds about
//! 200 MB; within a generous deadline `/api/trials/{id}/telemetry` shows its
//! rank 0 using more than half a core and more than 150 MB. Without a GPU the
//! GPU fields are absent and the node says once why; `xp status TRIAL` shows the
//! latest sample over QUIC, and `xp nodes --json` the node's GPU figures (none).

mod common;

use std::time::Duration;

use common::{TestCluster, free_tcp_port, http_exchange, http_get, wait_until};
use serde_json::Value;

/// `GET path` with `secret` as the bearer token: the status and the JSON body.
fn get_json(addr: &str, path: &str, secret: &str) -> (u16, Value) {
    let bearer = format!("Bearer {secret}");
    let (status, _, body) = http_exchange(addr, "GET", path, &[("Authorization", &bearer)], "");
    (status, serde_json::from_str(&body).unwrap_or(Value::Null))
}

/// The points of rank 0's series.
fn rank0_points(telemetry: &Value) -> Vec<Value> {
    telemetry["workers"]
        .as_array()
        .and_then(|workers| workers.iter().find(|worker| worker["rank"] == 0))
        .and_then(|worker| worker["series"].as_array().cloned())
        .unwrap_or_default()
}

#[test]
fn a_busy_trial_shows_its_cpu_and_memory() {
    let http = format!("127.0.0.1:{}", free_tcp_port());
    let mut cluster = TestCluster::start_prepared("10s", &["--http", http.as_str()], |_| {});
    let admin: xp_runtime::join::JoinString = cluster.join.parse().expect("a credential");
    let secret = admin.token;
    wait_until("the HTTP API", Duration::from_secs(30), || {
        http_get(&http, "/healthz").filter(|(status, _)| *status == 200)
    });
    cluster.start_node_with("n1", 0, 2, &["--telemetry-interval", "1s"]);
    cluster.wait_for_nodes(1);

    let experiment = must_submit_busy_trial(&cluster);
    let trial = format!("{experiment}-t0");
    check_api_shows_cpu_and_memory(&http, &secret, &trial);
    // Without a credential, refused; an unknown trial, not found.
    let (status, _) =
        http_get(&http, &format!("/api/trials/{trial}/telemetry")).expect("the HTTP API answers");
    assert_eq!(status, 401);
    let (status, _) = get_json(
        &http,
        &format!("/api/trials/{experiment}-t9/telemetry"),
        &secret,
    );
    assert_eq!(status, 404);

    // The CLI: the latest sample over QUIC, and the node's GPU figures.
    let shown = cluster.must_xp(&["status", &trial]);
    assert!(
        shown.contains(&format!("trial {trial} rank 0: cpu ")),
        "{shown}"
    );
    let nodes = cluster.must_xp(&["nodes", "--json"]);
    let node: Value = serde_json::from_str(nodes.lines().next().unwrap_or_default())
        .expect("xp nodes --json is a JSON line per node");
    assert!(node["gpu_telemetry"].is_array(), "{node}");

    cluster.must_xp(&["cancel", &experiment]);
    cluster.wait_finished(&experiment, Duration::from_secs(60));

    // Where NVML cannot load, the node says why once, not at every sample.
    let log = std::fs::read_to_string(cluster.node_log_path("n1")).expect("the node log");
    let said = log.matches("telemetry has no GPU figures").count();
    assert!(said <= 1, "said {said} times:\n{log}");
    if !std::path::Path::new("/dev/nvidia0").exists() {
        assert_eq!(said, 1, "{log}");
    }
}

/// A trial whose `tail` keeps the last 200 MB of a stream that never ends,
/// while its shell spins; the experiment.
fn must_submit_busy_trial(cluster: &TestCluster) -> String {
    let spec = cluster.write_file(
        "busy.yaml",
        "name: busy\ntrial:\n  command: [sh, -c, '{ head -c 200000000 /dev/zero; sleep 100000; } | tail -c 200000000 > /dev/null & while :; do :; done']\n  resources: {cpu: 1}\nsearch:\n  algorithm: grid\n  space: {x: {choice: [1]}}\n",
    );
    cluster
        .must_xp(&["submit", spec.to_str().unwrap()])
        .trim()
        .to_owned()
}

/// Within a generous deadline the trial's telemetry shows rank 0 using more
/// than half a core and more than 150 MB; every point has its time and
/// sample count, and no GPU field.
fn check_api_shows_cpu_and_memory(http: &str, secret: &str, trial: &str) {
    let path = format!("/api/trials/{trial}/telemetry");
    let points = wait_until(
        "telemetry showing > 0.5 cores and > 150 MB",
        Duration::from_secs(240),
        || {
            let (status, telemetry) = get_json(http, &path, secret);
            assert_eq!(status, 200, "{telemetry}");
            assert_eq!(telemetry["trial"], trial, "{telemetry}");
            let points = rank0_points(&telemetry);
            let busy = points
                .iter()
                .any(|point| point["cpu_cores"].as_f64().is_some_and(|cores| cores > 0.5));
            let resident = points.iter().any(|point| {
                point["rss_bytes"]
                    .as_u64()
                    .is_some_and(|bytes| bytes > 150_000_000)
            });
            (busy && resident).then_some(points)
        },
    );
    for point in &points {
        assert!(point["t_ms"].as_u64().is_some(), "{point}");
        assert!(point["samples"].as_u64().is_some_and(|n| n >= 1), "{point}");
        for field in ["gpu_util", "gpu_mem_bytes", "gpu_power_w"] {
            assert!(
                point.get(field).is_none(),
                "a worker without GPUs has no {field}: {point}"
            );
        }
    }
}
