//! End-to-end across separate hosts: the head and two nodes each on a machine of
//! their own (a network namespace with its own address, host name and
//! `/etc/hosts`, see `common::netns`), where each machine's host name resolves to
//! a loopback address as on Debian. Nodes must advertise an address the others
//! reach: across them a sweep runs, a gang all-reduces, a worker fetches an object
//! another node holds, and a trial resumes from its replicated checkpoint on the
//! other node after SIGKILL of its own. These skip, saying why, where namespaces
//! cannot be made (not root).
//!
//! Also here, on loopback: a checkpoint that cannot be replicated is tried again,
//! given up on after a bounded number of tries, shown as unreplicated and
//! reported in its trial's events.

mod common;

use std::collections::BTreeSet;
use std::time::Duration;

use common::netns::NetnsCluster;
use common::{TestCluster, trials, wait_until};
use serde_json::Value;

/// A gang of two, one rank per node (one GPU slot each), that prints what it was
/// told about the network and reports one metric.
const ENV_SWEEP: &str = r#"
name: env-sweep
team: tests
trial:
  command: ["sh", "-c", 'echo "NET MASTER_ADDR=$MASTER_ADDR GLOO=$GLOO_SOCKET_IFNAME NCCL=$NCCL_SOCKET_IFNAME TP=$TP_SOCKET_IFNAME HOST=$XP_NODE_HOST"; echo "XP_METRIC {\"step\": 1, \"x\": {x}}"']
  workers: 2
  resources: {gpu: 1, cpu: 0.5}
search:
  algorithm: grid
  space:
    x: {int: [1, 3]}
"#;

const ALLREDUCE: &str = "name: allreduce\nteam: tests\ntrial:\n  entry: allreduce_check\n  workers: 2\n  resources: {cpu: 1, gpu: 1}\n  max_retries: 1\nsearch:\n  algorithm: grid\n  space:\n    crash_rank: {choice: [-1]}\n";

/// The nodes `xp nodes --json` lists, by their `name` label.
fn nodes_by_name(cluster: &NetnsCluster) -> Vec<(String, Value)> {
    cluster
        .nodes_json()
        .into_iter()
        .map(|node| {
            let name = node["labels"]["name"]
                .as_str()
                .unwrap_or_default()
                .to_owned();
            (name, node)
        })
        .collect()
}

/// Every node advertises its own machine's address, never a loopback one, in
/// `xp nodes --json` and in the table.
fn check_addresses(cluster: &NetnsCluster) {
    let nodes = nodes_by_name(cluster);
    assert_eq!(nodes.len(), 2, "{nodes:?}");
    for (name, node) in &nodes {
        assert_eq!(node["address"], cluster.ip_of(name), "{node:#}");
    }
    let table = cluster.must_xp(&["nodes"]);
    assert!(
        table.contains("ADDRESS")
            && table.contains(cluster.ip_of("a"))
            && table.contains(cluster.ip_of("b")),
        "{table}"
    );
}

/// Submits the spec `yaml` through the trainables driver.
fn submit_spec(cluster: &NetnsCluster, file: &str, yaml: &str) -> String {
    let path = cluster.write_file(file, yaml);
    let path = path.to_str().expect("a UTF-8 temporary path");
    cluster.run_driver("examples/trainables", &["submit", "--spec", path])
}

/// The `NET ...` line a worker printed, as its `KEY=VALUE` pairs.
fn network_line(cluster: &NetnsCluster, trial: &str, rank: u32) -> Vec<(String, String)> {
    let log = cluster.must_xp(&["logs", trial, "--rank", &rank.to_string()]);
    let line = log
        .lines()
        .find_map(|line| line.strip_prefix("NET "))
        .unwrap_or_else(|| panic!("rank {rank} printed its network: {log}"));
    line.split_whitespace()
        .filter_map(|pair| pair.split_once('='))
        .map(|(key, value)| (key.to_owned(), value.to_owned()))
        .collect()
}

/// A gang's ranks got rank 0's machine as `MASTER_ADDR`, their own as
/// `XP_NODE_HOST`, and the interface on the bridge for gloo, NCCL and TensorPipe.
fn check_gang_environment(cluster: &NetnsCluster, trial: &Value) {
    let id = trial["id"].as_str().expect("id");
    let nodes = trial["attempts"][0]["nodes"].as_array().expect("nodes");
    let machine = |rank: usize| cluster.node_named(nodes[rank].as_str().expect("a node id"));
    assert_ne!(
        machine(0),
        machine(1),
        "the gang spans both nodes: {trial:#}"
    );
    let master = cluster.ip_of(&machine(0)).to_owned();
    for rank in 0..2 {
        let seen = network_line(cluster, id, rank as u32);
        let expected = [
            ("MASTER_ADDR", master.as_str()),
            ("GLOO", "eth0"),
            ("NCCL", "eth0"),
            ("TP", "eth0"),
            ("HOST", cluster.ip_of(&machine(rank))),
        ];
        for (key, value) in expected {
            assert!(
                seen.iter().any(|(name, got)| name == key && got == value),
                "rank {rank}: {key} should be {value}: {seen:?}"
            );
        }
    }
}

#[test]
fn nodes_on_separate_hosts_run_sweeps_gangs_and_object_fetches() {
    let Some(mut cluster) = NetnsCluster::start(&["a", "b"], "10s") else {
        return;
    };
    cluster.check_hostnames_resolve_to_loopback();
    cluster.start_node("a", 1, 2, &[]);
    cluster.start_node("b", 1, 2, &[]);
    cluster.wait_for_nodes(2);
    check_addresses(&cluster);

    // Submitted together: they queue for the two GPU slots.
    let env_spec = cluster.write_file("env.yaml", ENV_SWEEP);
    let env_sweep = cluster
        .must_xp(&["submit", env_spec.to_str().expect("UTF-8")])
        .trim()
        .to_owned();
    let rust_sweep = cluster.run_driver(
        "examples/trainables",
        &["submit", "--trials", "4", "--steps", "3", "--step-ms", "50"],
    );
    let allreduce = submit_spec(&cluster, "allreduce.yaml", ALLREDUCE);
    let objects = submit_objects(&cluster, "quic");
    let objects_tcp = submit_objects(&cluster, "tcp");

    // A sweep of gangs across both machines, told how to reach rank 0.
    let status = cluster.wait_finished(&env_sweep, Duration::from_secs(300));
    assert_eq!(status["state"], "succeeded", "{status:#}");
    assert_eq!(trials(&status).len(), 3);
    for trial in trials(&status) {
        assert_eq!(trial["state"], "succeeded", "{trial:#}");
        assert_eq!(
            trial["metrics"]["x"].as_f64(),
            trial["config"]["x"].as_f64(),
            "{trial:#}"
        );
    }
    check_gang_environment(&cluster, &trials(&status)[0]);

    // A sweep of Rust trials spread over the machines.
    let status = cluster.wait_finished(&rust_sweep, Duration::from_secs(300));
    assert_eq!(status["state"], "succeeded", "{status:#}");
    for trial in trials(&status) {
        assert_eq!(trial["state"], "succeeded", "{trial:#}");
        assert_eq!(trial["last_step"], 3);
    }

    // A ring all-reduce across the two machines, right the first time.
    let status = cluster.wait_finished(&allreduce, Duration::from_secs(300));
    let trial = &trials(&status)[0];
    assert_eq!(trial["state"], "succeeded", "{status:#}");
    assert_eq!(trial["metrics"]["sum"], 3.0);
    let attempts = trial["attempts"].as_array().expect("attempts");
    assert_eq!(attempts.len(), 1, "no attempt failed: {status:#}");
    assert_ne!(attempts[0]["nodes"][0], attempts[0]["nodes"][1]);

    // An object put on one machine and fetched by the other, over QUIC, and
    // over the plain TCP bulk path for a trial whose network is trusted.
    check_object_fetched(&cluster, &objects, "quic", "path=Quic");
    check_object_fetched(&cluster, &objects_tcp, "tcp", "path=Tcp");
}

/// The object id file of the `objects_check` gang over `transport`.
fn exchange_file(cluster: &NetnsCluster, transport: &str) -> std::path::PathBuf {
    cluster.dir.path().join(format!("object-id-{transport}"))
}

/// Submits an `objects_check` gang of two whose trial's `transport` is `transport`.
fn submit_objects(cluster: &NetnsCluster, transport: &str) -> String {
    submit_spec(
        cluster,
        &format!("objects-{transport}.yaml"),
        &format!(
            "name: objects-{transport}\nteam: tests\ntrial:\n  entry: objects_check\n  workers: 2\n  transport: {transport}\n  resources: {{cpu: 1, gpu: 1}}\nsearch:\n  algorithm: grid\n  space:\n    size: {{choice: [20000000]}}\n    exchange: {{choice: ['{}']}}\n",
            exchange_file(cluster, transport).display()
        ),
    )
}

/// Checks that the gang succeeded across the machines and that rank 1's node
/// fetched rank 0's object with a log line saying `path`.
fn check_object_fetched(cluster: &NetnsCluster, experiment: &str, transport: &str, path: &str) {
    let status = cluster.wait_finished(experiment, Duration::from_secs(300));
    assert_eq!(status["state"], "succeeded", "{status:#}");
    let nodes = trials(&status)[0]["attempts"][0]["nodes"]
        .as_array()
        .expect("nodes")
        .clone();
    assert_ne!(nodes[0], nodes[1], "{status:#}");
    let id = std::fs::read_to_string(exchange_file(cluster, transport)).expect("the object id");
    let fetcher = cluster.node_named(nodes[1].as_str().expect("a node id"));
    let log = cluster.node_log(&fetcher);
    assert!(
        log.lines().any(|line| line.contains("object fetched")
            && line.contains(id.trim())
            && line.contains(path)),
        "rank 1's node fetched the object from rank 0's with {path}: {log}"
    );
}

const STEPS: u64 = 60;
const EVERY: u64 = 5;
const START: f64 = 0.5;

/// What an uninterrupted `counter` run ends with (see `examples/trainables.rs`).
fn uninterrupted_final() -> f64 {
    (1..=STEPS).fold(START, |value, step| value * 0.999 + (step as f64).sin())
}

fn counter_spec(extra_trial: &str, steps: u64, every: u64, step_ms: u64) -> String {
    format!(
        "name: counter\nteam: tests\ntrial:\n  entry: counter\n  resources: {{cpu: 1, gpu: 1}}\n  max_retries: 1\n{extra_trial}search:\n  algorithm: grid\n  space:\n    steps: {{choice: [{steps}]}}\n    every: {{choice: [{every}]}}\n    step_ms: {{choice: [{step_ms}]}}\n    start: {{choice: [{START}]}}\n"
    )
}

/// `xp checkpoints EXPERIMENT --json`, parsed.
fn checkpoints_of(output: &str) -> Vec<Value> {
    output
        .lines()
        .map(|line| serde_json::from_str(line).expect("a JSON checkpoint"))
        .collect()
}

#[test]
fn a_checkpoint_resumes_on_the_other_host_after_its_node_is_killed() {
    let Some(mut cluster) = NetnsCluster::start(&["a", "b"], "3s") else {
        return;
    };
    cluster.check_hostnames_resolve_to_loopback();
    cluster.start_node("a", 1, 2, &[]);
    cluster.start_node("b", 1, 2, &[]);
    cluster.wait_for_nodes(2);
    let experiment = submit_spec(
        &cluster,
        "counter.yaml",
        &counter_spec("", STEPS, EVERY, 200),
    );
    // Replicated across machines: held by both nodes.
    wait_until(
        "a checkpoint at step 15+ on both machines",
        Duration::from_secs(120),
        || {
            let newest =
                checkpoints_of(&cluster.must_xp(&["checkpoints", &experiment, "--json"])).pop()?;
            (newest["step"].as_u64()? >= 15
                && newest["replicas"].as_array()?.len() == 2
                && newest["replicated"] == true)
                .then_some(())
        },
    );
    let status = cluster.status(&experiment);
    let first = trials(&status)[0]["attempts"][0]["nodes"][0]
        .as_str()
        .expect("a node id")
        .to_owned();
    let doomed = cluster.node_named(&first);
    let survivor = if doomed == "a" { "b" } else { "a" };
    cluster.kill_node(&doomed);

    let status = cluster.wait_finished(&experiment, Duration::from_secs(180));
    assert_eq!(status["state"], "succeeded", "{status:#}");
    let trial = &trials(&status)[0];
    let attempts = trial["attempts"].as_array().expect("attempts");
    assert_eq!(attempts.len(), 2, "{status:#}");
    assert_eq!(
        attempts[1]["nodes"][0],
        cluster.node_id(survivor),
        "{status:#}"
    );
    let resumed = attempts[1]["resumed_from"]["step"]
        .as_u64()
        .unwrap_or_else(|| panic!("attempt 2 resumed from a checkpoint: {status:#}"));
    assert!(
        resumed >= 15,
        "resumed from step {resumed}, not from the start"
    );
    let final_value = trial["metrics"]["final"].as_f64().expect("a final value");
    assert_eq!(
        final_value.to_bits(),
        uninterrupted_final().to_bits(),
        "resumed {final_value} vs uninterrupted {}",
        uninterrupted_final()
    );
}

#[test]
fn a_checkpoint_that_cannot_be_replicated_is_retried_shown_and_reported() {
    let mut cluster = TestCluster::start("10s");
    cluster.start_node("a", 1, 2);
    // Node b's store holds 4 bytes: no checkpoint of 8 fits, so every copy fails.
    cluster.start_node_with("b", 1, 2, &["--object-memory", "0", "--object-disk", "4"]);
    cluster.wait_for_nodes(2);
    let spec = counter_spec("  node_labels: {name: a}\n", 40, 20, 100);
    let path = cluster.write_file("counter.yaml", &spec);
    let experiment = cluster.run_driver(
        "examples/trainables",
        &["submit", "--spec", path.to_str().expect("UTF-8")],
    );
    let given_up = check_copy_retried_then_given_up(&cluster, &experiment);
    let step = given_up["step"].as_u64().expect("a step");
    check_events_report_each_try(&cluster, &experiment, step);
    let status = cluster.wait_finished(&experiment, Duration::from_secs(120));
    assert_eq!(
        status["state"], "succeeded",
        "an unreplicated checkpoint does not fail the trial: {status:#}"
    );
}

/// The checkpoint's copy is tried again, then given up on after 5 tries: so
/// say `xp checkpoints` (JSON and table) and node b's log. The checkpoint.
fn check_copy_retried_then_given_up(cluster: &TestCluster, experiment: &str) -> Value {
    let checkpoints = || checkpoints_of(&cluster.must_xp(&["checkpoints", experiment, "--json"]));
    wait_until(
        "a checkpoint whose copy is tried again",
        Duration::from_secs(120),
        || {
            checkpoints().into_iter().find(|checkpoint| {
                checkpoint["unreplicated"]
                    .as_str()
                    .is_some_and(|reason| reason.contains("trying again"))
            })
        },
    );
    let given_up = wait_until(
        "a checkpoint whose copy is given up on",
        Duration::from_secs(180),
        || {
            checkpoints().into_iter().find(|checkpoint| {
                checkpoint["unreplicated"]
                    .as_str()
                    .is_some_and(|reason| reason.contains("given up after 5 tries"))
            })
        },
    );
    assert_eq!(given_up["replicated"], false, "{given_up:#}");
    assert_eq!(
        given_up["replicas"],
        serde_json::json!([cluster.node_id("a")]),
        "{given_up:#}"
    );
    let table = cluster.must_xp(&["checkpoints", experiment]);
    assert!(table.contains("UNREPLICATED: copy given up"), "{table}");
    assert!(cluster.node_log("b").contains("replication failed"));
    given_up
}

/// The experiment's events report each failed try of the checkpoint at
/// `step` but the last, and that it was given up on.
fn check_events_report_each_try(cluster: &TestCluster, experiment: &str, step: u64) {
    let reasons: Vec<String> = tokio::runtime::Runtime::new()
        .expect("a runtime")
        .block_on(async {
            let client = xp::Client::connect(&cluster.join).await.expect("connects");
            let id = experiment.parse().expect("an experiment id");
            let events = client
                .events(id, 0, Duration::ZERO)
                .await
                .expect("the events");
            client.close().await;
            events.into_iter().map(|event| event.reason).collect()
        });
    for expected in [
        format!("checkpoint at step {step} not replicated (try 1 of 5)"),
        format!("checkpoint at step {step} is not replicated: given up after 5 tries"),
    ] {
        assert!(
            reasons.iter().any(|reason| reason.starts_with(&expected)),
            "an event starts with {expected:?}: {reasons:#?}"
        );
    }
    let retries: BTreeSet<&String> = reasons
        .iter()
        .filter(|reason| {
            reason.starts_with(&format!("checkpoint at step {step} not replicated (try"))
        })
        .collect();
    assert_eq!(
        retries.len(),
        4,
        "one event per failed try before the last: {reasons:#?}"
    );
}
