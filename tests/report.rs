//! `xp report` end to end with real processes: a sweep of four one-GPU trials,
//! two at a time, on a node with two declared GPUs and a policy price; the
//! report's GPU-hours, cost, utilisation, Little's-law figures and best-so-far
//! curve equal what this test computes by hand from the trials' own recorded
//! times (`xp status --json`), and `GET /api/report` answers the same object.
//! A trial whose first attempt fails and is retried shows that attempt's
//! GPU-hours as lost to a failure, priced; a preempted trial that checkpointed
//! loses only the work after the checkpoint its next attempt resumed from.

mod common;

use std::time::Duration;

use common::{TestCluster, free_tcp_port, http_exchange, trials, wait_until};
use serde_json::Value;

const MS_PER_HOUR: f64 = 3_600_000.0;
const PRICE: f64 = 2.5;

const SWEEP: &str = r#"name: known
trial:
  command: [sh, -c, 'sleep $0; echo "XP_METRIC {\"acc\": $0}"', '{s}']
  resources: {gpu: 1, cpu: 0.5}
search:
  algorithm: grid
  space: {s: {choice: [1, 1.5, 2, 2.5]}}
  metric: acc
  mode: max
  parallel: 2
  value: {per_unit: 10}
"#;

const FLAKY: &str = r#"name: flaky
trial:
  command: [sh, -c, 'sleep 1; [ "$XP_ATTEMPT" != 1 ]']
  resources: {gpu: 1, cpu: 0.5}
  max_retries: 1
"#;

fn close(what: &str, actual: &Value, expected: f64) {
    let actual = actual
        .as_f64()
        .unwrap_or_else(|| panic!("{what}: {actual} is not a number"));
    assert!(
        (actual - expected).abs() <= 1e-9 * expected.abs().max(1.0),
        "{what}: reported {actual}, computed {expected}"
    );
}

fn ms(value: &Value) -> u64 {
    value
        .as_u64()
        .unwrap_or_else(|| panic!("{value} is not a time"))
}

/// Each attempt's (placed, ended) times, in ms, per trial.
fn attempt_times(status: &Value) -> Vec<Vec<(u64, u64)>> {
    trials(status)
        .iter()
        .map(|trial| {
            trial["attempts"]
                .as_array()
                .expect("attempts")
                .iter()
                .map(|attempt| (ms(&attempt["placed_at_ms"]), ms(&attempt["ended_at_ms"])))
                .collect()
        })
        .collect()
}

fn submit(cluster: &TestCluster, name: &str, yaml: &str) -> String {
    let path = cluster.write_file(&format!("{name}.yaml"), yaml);
    cluster
        .must_xp(&["submit", path.to_str().expect("a UTF-8 path")])
        .trim()
        .to_owned()
}

fn report(cluster: &TestCluster, experiment: &str) -> Value {
    let text = cluster.must_xp(&["report", "--experiment", experiment, "--json"]);
    serde_json::from_str(text.trim()).unwrap_or_else(|error| panic!("{error}: {text}"))
}

#[test]
fn report_figures_equal_a_hand_computation_from_the_recorded_schedule() {
    let policy_dir = tempfile::tempdir().expect("a directory for the policy");
    let policy = policy_dir.path().join("policy.yaml");
    std::fs::write(&policy, format!("prices: {{default: {PRICE}}}\n")).expect("policy");
    let http = format!("127.0.0.1:{}", free_tcp_port());
    let policy_arg = policy.display().to_string();
    let mut cluster =
        TestCluster::start_prepared("10s", &["--http", &http, "--policy", &policy_arg], |_| {});
    cluster.start_node("n1", 2, 4);
    cluster.wait_for_nodes(1);

    let experiment = submit(&cluster, "known", SWEEP);
    let schedule = must_run_known_sweep(&cluster, &experiment);
    let figures = report(&cluster, &experiment);
    check_usage_and_queueing(&figures, &schedule);
    check_best_vs_gpu_hours(&figures, &schedule);
    // The experiment's and trials' views carry their GPU-hours and cost.
    check_views_carry_gpu_hours(&cluster, &experiment, &schedule);
    // The dashboard's route answers the same object.
    check_http_report(&cluster, &http, &experiment, &figures, schedule.gpu_hours);
    // The readable form says the same things in words.
    let text = cluster.must_xp(&["report", "--experiment", &experiment]);
    assert!(text.contains("Little's law"), "{text}");
    assert!(
        text.contains(&format!("{:.3} used", schedule.gpu_hours)),
        "{text}"
    );
    // A failed attempt that is retried: its GPU-hours are lost to the failure.
    let used = check_failed_attempt_is_lost(&cluster);
    // The whole cluster: both experiments, for an admin.
    check_cluster_report(&cluster, schedule.gpu_hours + used);
}

/// The known sweep's recorded schedule: when it was submitted, each trial's
/// one attempt as (placed, ended), and the GPU-hours they held.
struct Schedule {
    status: Value,
    submitted: u64,
    spans: Vec<(u64, u64)>,
    gpu_hours: f64,
}

/// Runs the known sweep to its end; each trial ran one attempt.
fn must_run_known_sweep(cluster: &TestCluster, experiment: &str) -> Schedule {
    let status = cluster.wait_finished(experiment, Duration::from_secs(180));
    assert_eq!(status["state"], "succeeded", "{status:#}");
    let submitted = ms(&status["submitted_at_ms"]);
    let times = attempt_times(&status);
    assert!(
        times.iter().all(|attempts| attempts.len() == 1),
        "{status:#}"
    );
    let spans: Vec<(u64, u64)> = times.iter().map(|attempts| attempts[0]).collect();
    // By hand: one GPU per attempt, from placement to end.
    let gpu_hours: f64 = spans
        .iter()
        .map(|(placed, ended)| (ended - placed) as f64 / MS_PER_HOUR)
        .sum();
    Schedule {
        status,
        submitted,
        spans,
        gpu_hours,
    }
}

/// GPU-hours, cost, the window, utilisation and Little's law, by hand: every
/// trial arrives at submission and leaves when its only attempt ends.
fn check_usage_and_queueing(figures: &Value, schedule: &Schedule) {
    let Schedule {
        submitted,
        spans,
        gpu_hours,
        ..
    } = schedule;
    let (submitted, gpu_hours) = (*submitted, *gpu_hours);
    let last_finish = spans.iter().map(|(_, ended)| *ended).max().expect("trials");
    let window_ms = (last_finish - submitted) as f64;
    let in_system_ms: f64 = spans
        .iter()
        .map(|(_, ended)| (ended - submitted) as f64)
        .sum();
    let lambda_per_hour = 4.0 / (window_ms / MS_PER_HOUR);
    let w_s = in_system_ms / 4.0 / 1000.0;
    let l = in_system_ms / window_ms;
    close("gpu_hours", &figures["gpu_hours"], gpu_hours);
    close("gpu_hours_lost", &figures["gpu_hours_lost"], 0.0);
    close("cost", &figures["cost"], PRICE * gpu_hours);
    assert_eq!(ms(&figures["window_start_ms"]), submitted, "{figures:#}");
    assert_eq!(ms(&figures["window_end_ms"]), last_finish, "{figures:#}");
    // The node's two GPUs were up the whole window.
    close(
        "available_gpu_hours",
        &figures["available_gpu_hours"],
        2.0 * window_ms / MS_PER_HOUR,
    );
    close(
        "utilization",
        &figures["utilization"],
        gpu_hours / (2.0 * window_ms / MS_PER_HOUR),
    );
    close(
        "throughput_per_hour",
        &figures["throughput_per_hour"],
        lambda_per_hour,
    );
    close(
        "mean_time_in_system_s",
        &figures["mean_time_in_system_s"],
        w_s,
    );
    close("mean_in_system", &figures["mean_in_system"], l);
    close("littles_law_ratio", &figures["littles_law_ratio"], 1.0);
    close("lambda_w", &figures["lambda_w"], l);
}

/// The best-so-far curve: at each finish, the GPU-hours spent by then, sent as
/// a step line; and what the last quarter of the GPU-hours bought.
fn check_best_vs_gpu_hours(figures: &Value, schedule: &Schedule) {
    let Schedule {
        status,
        spans,
        gpu_hours,
        ..
    } = schedule;
    let gpu_hours = *gpu_hours;
    // In finish order, ties by trial index (the order `xp status` lists them).
    let mut finishes: Vec<(u64, usize, f64)> = trials(status)
        .iter()
        .zip(spans)
        .enumerate()
        .map(|(index, (trial, (_, ended)))| {
            (
                *ended,
                index,
                trial["metrics"]["acc"].as_f64().expect("acc"),
            )
        })
        .collect();
    finishes.sort_by_key(|(ended, index, _)| (*ended, *index));
    let curve = figures["best_vs_gpu_hours"].as_array().expect("a curve");
    let mut best = f64::MIN;
    let mut expected_curve = Vec::new();
    for (finish, _, value) in &finishes {
        let spent: f64 = spans
            .iter()
            .map(|(placed, ended)| (*ended.min(finish)).saturating_sub(*placed) as f64)
            .sum::<f64>()
            / MS_PER_HOUR;
        best = best.max(*value);
        expected_curve.push((spent, best));
    }
    // Sent as a step line: the first point, each where the best changes, the last.
    let steps: Vec<(f64, f64)> = expected_curve
        .iter()
        .enumerate()
        .filter(|(index, (_, then))| {
            *index == 0
                || *index + 1 == expected_curve.len()
                || expected_curve[index - 1].1 != *then
        })
        .map(|(_, point)| *point)
        .collect();
    assert_eq!(curve.len(), steps.len(), "{figures:#}");
    for (point, (spent, then)) in curve.iter().zip(&steps) {
        close("curve gpu_hours", &point["gpu_hours"], *spent);
        close("curve best", &point["best"], *then);
    }
    close("final best", &curve[curve.len() - 1]["best"], 2.5);
    let at_three_quarters = expected_curve
        .iter()
        .take_while(|(spent, _)| *spent <= 0.75 * gpu_hours)
        .last();
    match at_three_quarters {
        Some((_, then)) => {
            let gain = best - then;
            close("last_quarter_gain", &figures["last_quarter_gain"], gain);
            let quarter_cost = PRICE * gpu_hours / 4.0;
            close(
                "roi_percent",
                &figures["roi_percent"],
                (gain * 10.0 - quarter_cost) / quarter_cost * 100.0,
            );
        }
        None => assert!(figures["last_quarter_gain"].is_null(), "{figures:#}"),
    }
    assert_eq!(figures["amdahl"], Value::Array(Vec::new()));
}

/// The experiment's and its trials' views carry their GPU-hours and cost.
fn check_views_carry_gpu_hours(cluster: &TestCluster, experiment: &str, schedule: &Schedule) {
    let status = cluster.status(experiment);
    for (trial, (placed, ended)) in trials(&status).iter().zip(&schedule.spans) {
        let hours = (ended - placed) as f64 / MS_PER_HOUR;
        close("trial gpu_hours", &trial["gpu_hours"], hours);
        close("trial cost", &trial["cost"], PRICE * hours);
    }
    close(
        "experiment gpu_hours",
        &status["gpu_hours"],
        schedule.gpu_hours,
    );
}

/// `/api/report` answers the same figures as `xp report`, an experiment's
/// summary its GPU-hours and cost, and a bad `since` is refused.
fn check_http_report(
    cluster: &TestCluster,
    http: &str,
    experiment: &str,
    figures: &Value,
    gpu_hours: f64,
) {
    let admin: xp_runtime::join::JoinString = cluster.join.parse().expect("a credential");
    let bearer = format!("Bearer {}", admin.token);
    let over_http = wait_until("the HTTP API", Duration::from_secs(30), || {
        std::net::TcpStream::connect(http).ok()?;
        let (code, _, body) = http_exchange(
            http,
            "GET",
            &format!("/api/report?experiment={experiment}"),
            &[("Authorization", &bearer)],
            b"",
        );
        (code == 200).then(|| serde_json::from_str::<Value>(&body).expect("JSON"))
    });
    assert_eq!(&over_http, figures);
    let (code, _, body) = http_exchange(
        http,
        "GET",
        &format!("/api/experiments/{experiment}"),
        &[("Authorization", &bearer)],
        b"",
    );
    assert_eq!(code, 200, "{body}");
    let summary: Value = serde_json::from_str(&body).expect("JSON");
    close("summary gpu_hours", &summary["gpu_hours"], gpu_hours);
    close("summary cost", &summary["cost"], PRICE * gpu_hours);
    let (code, _, body) = http_exchange(
        http,
        "GET",
        "/api/report?since=soon",
        &[("Authorization", &bearer)],
        b"",
    );
    assert_eq!(code, 400, "{body}");
}

/// A failed attempt that is retried: its GPU-hours are lost to the failure.
/// The GPU-hours both attempts used.
fn check_failed_attempt_is_lost(cluster: &TestCluster) -> f64 {
    let flaky = submit(cluster, "flaky", FLAKY);
    let status = cluster.wait_finished(&flaky, Duration::from_secs(120));
    assert_eq!(status["state"], "succeeded", "{status:#}");
    let attempts = &attempt_times(&status)[0];
    assert_eq!(attempts.len(), 2, "{status:#}");
    let lost = (attempts[0].1 - attempts[0].0) as f64 / MS_PER_HOUR;
    let used: f64 = attempts
        .iter()
        .map(|(placed, ended)| (ended - placed) as f64 / MS_PER_HOUR)
        .sum();
    let figures = report(cluster, &flaky);
    close("flaky gpu_hours", &figures["gpu_hours"], used);
    close("flaky gpu_hours_lost", &figures["gpu_hours_lost"], lost);
    close(
        "lost to failure",
        &figures["lost_by_cause"]["failure"],
        lost,
    );
    close(
        "lost to preemption",
        &figures["lost_by_cause"]["preemption"],
        0.0,
    );
    close("cost_lost", &figures["cost_lost"], PRICE * lost);
    used
}

/// The whole cluster's report, for an admin: both experiments.
fn check_cluster_report(cluster: &TestCluster, gpu_hours: f64) {
    let text = cluster.must_xp(&["report", "--json"]);
    let cluster_figures: Value = serde_json::from_str(text.trim()).expect("JSON");
    close(
        "cluster gpu_hours",
        &cluster_figures["gpu_hours"],
        gpu_hours,
    );
    assert_eq!(cluster_figures["scope"], "cluster");
    assert!(cluster_figures["best_vs_gpu_hours"].is_null());
    assert_eq!(cluster_figures["returns"].as_array().map(Vec::len), Some(1));
}

const PREEMPTION_POLICY: &str = "\
priority_classes: {low: 0, high: 100}
preemption: {grace_period: 5s, min_run_time: 0s}
prices: {declared: 4.0}
";

/// Checkpoints once, then waits to be preempted; resumed, it finishes at once.
const CHECKPOINTER: &str = r#"name: low
priority: low
trial:
  command: [sh, -c, 'if [ -n "$XP_RESUME_STEP" ]; then exit 0; fi; echo x > "$XP_CHECKPOINT_DIR/state"; echo "XP_CHECKPOINT {\"step\": 1}"; sleep 120']
  resources: {gpu: 1, cpu: 0.5}
"#;

const URGENT: &str = r#"name: high
priority: high
trial:
  command: [sleep, '1']
  resources: {gpu: 1, cpu: 0.5}
"#;

/// A preempted trial that checkpointed loses only what it did after the
/// checkpoint its next attempt resumed from: the attempt's end minus the time
/// the head recorded that checkpoint, on its one GPU, at the policy's price.
#[test]
fn a_preempted_attempt_loses_the_work_after_its_checkpoint() {
    let mut cluster = TestCluster::start_with_policy("10s", Some(PREEMPTION_POLICY));
    cluster.start_node("n1", 1, 2);
    cluster.wait_for_nodes(1);
    let low = submit(&cluster, "low", CHECKPOINTER);
    let checkpoint = wait_until("the checkpoint", Duration::from_secs(60), || {
        let text = cluster.must_xp(&["checkpoints", &low, "--json"]);
        let line = text.lines().next()?;
        serde_json::from_str::<Value>(line).ok()
    });
    let checkpoint_at = ms(&checkpoint["at_ms"]);
    let high = submit(&cluster, "high", URGENT);
    let high_done = cluster.wait_finished(&high, Duration::from_secs(90));
    assert_eq!(high_done["state"], "succeeded", "{high_done:#}");
    let status = cluster.wait_finished(&low, Duration::from_secs(90));
    assert_eq!(status["state"], "succeeded", "{status:#}");
    let attempts = trials(&status)[0]["attempts"]
        .as_array()
        .expect("attempts")
        .clone();
    assert_eq!(attempts.len(), 2, "{status:#}");
    assert_eq!(attempts[0]["outcome"], "preempted", "{status:#}");
    assert_eq!(attempts[1]["resumed_from"]["attempt"], 1, "{status:#}");
    let preempted_end = ms(&attempts[0]["ended_at_ms"]);
    assert!(checkpoint_at >= ms(&attempts[0]["placed_at_ms"]));
    let lost = (preempted_end - checkpoint_at) as f64 / MS_PER_HOUR;
    let used: f64 = attempt_times(&status)[0]
        .iter()
        .map(|(placed, ended)| (ended - placed) as f64 / MS_PER_HOUR)
        .sum();
    let figures = report(&cluster, &low);
    close("gpu_hours", &figures["gpu_hours"], used);
    close("gpu_hours_lost", &figures["gpu_hours_lost"], lost);
    close(
        "lost to preemption",
        &figures["lost_by_cause"]["preemption"],
        lost,
    );
    close("cost", &figures["cost"], 4.0 * used);
    close("cost_lost", &figures["cost_lost"], 4.0 * lost);
    assert!(
        lost < used,
        "the work before the checkpoint is kept: {figures:#}"
    );
}
