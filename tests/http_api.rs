//! The head's HTTP API end to end: a real `xp-head` with `--http`, an
//! experiment of a few hundred waiting trials paged through (each trial exactly
//! once, in every order), the 400s for bad parameters, and, with a node running
//! real command trials, a metric history paged in order and a metric sort.
//!
//! Every request goes through [`request`], the one place where the credential
//! (the first admin's secret, as a bearer token) is added.

mod common;

use std::collections::BTreeSet;
use std::time::Duration;

use common::{TestCluster, free_tcp_port, http_exchange, wait_until};
use serde_json::Value;

/// The head's HTTP API, asked as the cluster's first admin.
struct Api {
    addr: String,
    /// The admin's secret, sent as the bearer token.
    secret: String,
}

/// Sends `method path` with `body` to the head's HTTP API and returns the status
/// and the body as JSON (`Value::String` when it is not JSON). The one place a
/// request is built, so the one place its credential is added.
fn request(api: &Api, method: &str, path: &str, body: &[u8]) -> (u16, Value) {
    let bearer = format!("Bearer {}", api.secret);
    let (status, _, body) =
        http_exchange(&api.addr, method, path, &[("Authorization", &bearer)], body);
    let value = serde_json::from_str(&body).unwrap_or(Value::String(body));
    (status, value)
}

fn get(api: &Api, path: &str) -> (u16, Value) {
    request(api, "GET", path, b"")
}

/// `GET path`, which must answer 200.
fn must_get(api: &Api, path: &str) -> Value {
    let (status, body) = get(api, path);
    assert_eq!(status, 200, "GET {path}: {body}");
    body
}

/// Every page of the listing at `path` (which has a query already), `limit` at a
/// time: the items in order, after checking each page's size, total and cursor.
fn walk(api: &Api, path: &str, limit: usize) -> (Vec<Value>, u64) {
    let mut items = Vec::new();
    let mut cursor: Option<String> = None;
    let mut total = None;
    for _ in 0..10_000 {
        let mut url = format!("{path}&limit={limit}");
        if let Some(cursor) = &cursor {
            url.push_str(&format!("&cursor={}", encode(cursor)));
        }
        let page = must_get(api, &url);
        let page_items = page["items"].as_array().expect("items").clone();
        assert!(
            page_items.len() <= limit,
            "{url}: {} items",
            page_items.len()
        );
        assert_eq!(page["limit"], limit);
        let page_total = page["total"].as_u64().expect("a total");
        assert_eq!(*total.get_or_insert(page_total), page_total, "{url}");
        items.extend(page_items);
        match page["next_cursor"].as_str() {
            Some(next) => cursor = Some(next.to_owned()),
            None => return (items, total.expect("a total")),
        }
    }
    panic!("{path} never ended");
}

/// Percent-encodes a query value.
fn encode(text: &str) -> String {
    text.bytes()
        .map(|byte| match byte {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'.' | b'_' | b'~' => {
                (byte as char).to_string()
            }
            _ => format!("%{byte:02X}"),
        })
        .collect()
}

fn ids(items: &[Value]) -> Vec<String> {
    items
        .iter()
        .map(|item| item["id"].as_str().expect("an id").to_owned())
        .collect()
}

/// Asserts a 400 naming `parameter`.
fn check_bad(api: &Api, path: &str, parameter: &str) {
    let (status, body) = get(api, path);
    assert_eq!(status, 400, "GET {path}: {body}");
    assert_eq!(body["parameter"], parameter, "GET {path}: {body}");
    assert!(body["error"].is_string(), "GET {path}: {body}");
}

fn start(head_args: &[&str]) -> (TestCluster, Api) {
    let http = format!("127.0.0.1:{}", free_tcp_port());
    let mut args = vec!["--http", http.as_str()];
    args.extend_from_slice(head_args);
    let cluster = TestCluster::start_prepared("10s", &args, |_| {});
    let admin: xp_runtime::join::JoinString = cluster.join.parse().expect("a credential");
    let api = Api {
        addr: http,
        secret: admin.token,
    };
    wait_until("the HTTP API", Duration::from_secs(30), || {
        std::net::TcpStream::connect(&api.addr)
            .is_ok()
            .then(|| get(&api, "/healthz"))
            .filter(|(status, _)| *status == 200)
    });
    (cluster, api)
}

#[test]
fn a_large_experiment_pages_through_every_trial_once() {
    let (cluster, api) = start(&[]);
    let experiment = must_submit_300_waiting_trials(&cluster);
    check_trials_page_once_in_order(&cluster, &api, &experiment);
    // Summaries, not trials.
    check_summaries_carry_no_trials(&api, &experiment);
    // Bad parameters are 400s that name the parameter.
    check_bad_parameters_named(&api, &experiment);
    // What does not exist is a 404; a body is refused unread.
    check_missing_and_oversized(&api, &experiment);
}

/// 20 x 15 = 300 trials; with no node they all wait. The experiment.
fn must_submit_300_waiting_trials(cluster: &TestCluster) -> String {
    let xs: Vec<String> = (0..20).map(|x| x.to_string()).collect();
    let ys: Vec<String> = (0..15).map(|y| y.to_string()).collect();
    let spec = cluster.write_file(
        "grid.yaml",
        &format!(
            "name: paged\nteam: pages\ntrial:\n  command: [echo, '{{x}} {{y}}']\nsearch:\n  algorithm: grid\n  space:\n    x: {{choice: [{}]}}\n    y: {{choice: [{}]}}\n  metric: loss\n",
            xs.join(", "),
            ys.join(", ")
        ),
    );
    cluster
        .must_xp(&["submit", spec.to_str().unwrap()])
        .trim()
        .to_owned()
}

/// Every trial once, in order, whatever the page size; newest first; by
/// metric; filtered by state. The trials are in `xp status --json`'s shape.
fn check_trials_page_once_in_order(cluster: &TestCluster, api: &Api, experiment: &str) {
    let trials_path = format!("/api/experiments/{experiment}/trials?sort=id");
    let expected: Vec<String> = (0..300)
        .map(|index| format!("{experiment}-t{index}"))
        .collect();
    for limit in [37, 300, 1000] {
        let (items, total) = walk(api, &trials_path, limit);
        assert_eq!(total, 300);
        assert_eq!(
            ids(&items),
            expected,
            "limit {limit}: every trial once, in order"
        );
    }
    // The trials are in `xp status --json`'s shape.
    let status = cluster.status(experiment);
    let (first, _) = walk(api, &trials_path, 1000);
    assert_eq!(first[0], common::trials(&status)[0]);

    let (newest_first, _) = walk(
        api,
        &format!("/api/experiments/{experiment}/trials?sort=-id"),
        64,
    );
    let mut reversed = expected.clone();
    reversed.reverse();
    assert_eq!(ids(&newest_first), reversed);
    // Metric order with no metric reported yet: all last, by index.
    let (by_metric, _) = walk(
        api,
        &format!("/api/experiments/{experiment}/trials?sort=-metric"),
        100,
    );
    assert_eq!(ids(&by_metric), expected);
    // Waiting trials are queued or pending; a filter on other states is empty.
    let (waiting, waiting_total) = walk(
        api,
        &format!("/api/experiments/{experiment}/trials?state=queued,pending"),
        99,
    );
    assert_eq!(waiting.len(), 300);
    assert_eq!(waiting_total, 300);
    let (running, running_total) = walk(
        api,
        &format!("/api/experiments/{experiment}/trials?state=running"),
        10,
    );
    assert_eq!((running.len(), running_total), (0, 0));
}

/// The experiments listing holds summaries with counts, not trials; an
/// experiment, its metrics, the nodes and the queues answer.
fn check_summaries_carry_no_trials(api: &Api, experiment: &str) {
    let listing = must_get(api, "/api/experiments?limit=10");
    assert_eq!(listing["total"], 1);
    assert_eq!(listing["next_cursor"], Value::Null);
    let summary = &listing["items"][0];
    assert_eq!(summary["id"], experiment);
    assert_eq!(summary["trial_count"], 300);
    assert!(
        summary.get("trials").is_none(),
        "a summary carries no trials"
    );
    let counted: u64 = summary["counts"]
        .as_object()
        .expect("counts")
        .values()
        .map(|count| count.as_u64().expect("a count"))
        .sum();
    assert_eq!(counted, 300);
    assert_eq!(summary["best"], Value::Null);
    assert_eq!(
        must_get(api, &format!("/api/experiments/{experiment}")),
        *summary
    );
    let metrics = must_get(api, &format!("/api/trials/{experiment}-t0/metrics"));
    assert_eq!(
        (metrics["total"].clone(), metrics["items"].clone()),
        (0.into(), Value::Array(Vec::new()))
    );
    let nodes = must_get(api, "/api/nodes");
    assert_eq!(nodes["total"], 0);
    let queues = must_get(api, "/api/queues?limit=1");
    assert!(
        queues["items"]
            .as_array()
            .is_some_and(|items| items.len() == 1)
    );
}

/// Bad parameters are 400s that name the parameter.
fn check_bad_parameters_named(api: &Api, experiment: &str) {
    let trials = format!("/api/experiments/{experiment}/trials");
    check_bad(api, &format!("{trials}?limit=0"), "limit");
    check_bad(api, &format!("{trials}?limit=100000"), "limit");
    check_bad(api, &format!("{trials}?limit=-1"), "limit");
    check_bad(api, &format!("{trials}?limit=ten"), "limit");
    check_bad(api, "/api/experiments?limit=0", "limit");
    check_bad(api, "/api/experiments?limit=100000", "limit");
    check_bad(api, &format!("{trials}?cursor=garbage"), "cursor");
    check_bad(api, "/api/experiments?cursor=garbage", "cursor");
    check_bad(api, "/api/nodes?cursor=garbage", "cursor");
    check_bad(
        api,
        &format!("/api/trials/{experiment}-t0/metrics?cursor=garbage"),
        "cursor",
    );
    let second_page = must_get(api, &format!("{trials}?sort=id&limit=5"));
    let id_cursor = encode(second_page["next_cursor"].as_str().expect("a cursor"));
    check_bad(
        api,
        &format!("{trials}?sort=metric&cursor={id_cursor}"),
        "cursor",
    );
    check_bad(api, &format!("{trials}?sort=loss"), "sort");
    check_bad(api, &format!("{trials}?state=asleep"), "state");
    check_bad(api, &format!("{trials}?limit=5&limit=6"), "limit");
    check_bad(api, "/api/experiments/not-an-id", "id");
    check_bad(api, "/api/trials/nonsense/metrics", "id");
    let (status, body) = get(api, &format!("{trials}?page=2"));
    assert_eq!(status, 400, "an unknown parameter: {body}");
    assert!(
        body["error"]
            .as_str()
            .is_some_and(|error| error.contains("page")),
        "{body}"
    );
}

/// What does not exist is a 404; a body is refused unread (413), a long query too (414).
fn check_missing_and_oversized(api: &Api, experiment: &str) {
    let unknown = "0123456789abcdef";
    assert_eq!(get(api, &format!("/api/experiments/{unknown}")).0, 404);
    assert_eq!(
        get(api, &format!("/api/experiments/{unknown}/trials")).0,
        404
    );
    assert_eq!(
        get(api, &format!("/api/trials/{experiment}-t300/metrics")).0,
        404
    );
    assert_eq!(request(api, "GET", "/api/nodes", &[b'x'; 1000]).0, 413);
    let long_query = format!("/api/nodes?cursor={}", "x".repeat(5000));
    assert_eq!(get(api, &long_query).0, 414);
}

#[test]
fn a_metric_history_pages_in_order_and_trials_sort_by_metric() {
    let (mut cluster, api) = start(&[]);
    cluster.start_node("n1", 0, 4);
    cluster.wait_for_nodes(1);
    // Three trials; each reports 250 steps of `loss`, ending at its `x`.
    let spec = cluster.write_file(
        "curves.yaml",
        "name: curves\ntrial:\n  command: [sh, -c, 'i=0; while [ $i -lt 250 ]; do echo \"XP_METRIC {\\\"step\\\": $i, \\\"loss\\\": {x}}\"; i=$((i+1)); done']\n  resources: {cpu: 1}\nsearch:\n  algorithm: grid\n  space: {x: {choice: [3, 1, 2]}}\n  metric: loss\n  mode: min\n",
    );
    let experiment = cluster
        .must_xp(&["submit", spec.to_str().unwrap()])
        .trim()
        .to_owned();
    cluster.wait_finished(&experiment, Duration::from_secs(120));
    // A node sends a worker's reports in order and the head stores each before
    // the exit that ends the trial, so all should be there already; waiting on
    // the count costs nothing then, and names the problem if they are not.
    for index in 0..3 {
        let path = format!("/api/trials/{experiment}-t{index}/metrics?");
        let (points, total) = wait_until("every metric report", Duration::from_secs(60), || {
            let (points, total) = walk(&api, &path, 100);
            (total == 250).then_some((points, total))
        });
        assert_eq!(total, 250);
        let steps: Vec<u64> = points
            .iter()
            .map(|point| point["step"].as_u64().expect("a step"))
            .collect();
        assert_eq!(
            steps,
            (0..250).collect::<Vec<_>>(),
            "trial {index}: in order, once each"
        );
        assert!(
            points
                .iter()
                .all(|point| point["rank"] == 0 && point["attempt"] == 1)
        );
    }
    let ascending = walk(
        &api,
        &format!("/api/experiments/{experiment}/trials?sort=metric"),
        1,
    )
    .0;
    let losses: Vec<f64> = ascending
        .iter()
        .map(|trial| trial["metrics"]["loss"].as_f64().expect("a loss"))
        .collect();
    assert_eq!(losses, [1.0, 2.0, 3.0]);
    let descending = walk(
        &api,
        &format!("/api/experiments/{experiment}/trials?sort=-metric&state=succeeded"),
        2,
    )
    .0;
    let mut reversed = ids(&ascending);
    reversed.reverse();
    assert_eq!(ids(&descending), reversed);
    let summary = must_get(&api, &format!("/api/experiments/{experiment}"));
    assert_eq!(summary["state"], "succeeded");
    assert_eq!(summary["counts"]["succeeded"], 3);
    assert_eq!(summary["best"]["trial"], format!("{experiment}-t1"));
    assert_eq!(summary["best"]["value"], 1.0);
    let nodes = must_get(&api, "/api/nodes");
    assert_eq!(nodes["total"], 1);
    assert_eq!(
        nodes["items"][0]["name"].as_str().map(str::is_empty),
        Some(false)
    );
    let distinct: BTreeSet<String> = ids(&ascending).into_iter().collect();
    assert_eq!(distinct.len(), 3);
}
