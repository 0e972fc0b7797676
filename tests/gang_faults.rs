//! A data-parallel gang outlives its nodes (issue 27): with real processes on
//! separate machines (network namespaces, `common::netns`), a two-worker gang
//! whose node is killed with SIGKILL after a replicated checkpoint, or cut
//! off the network, ends `succeeded` with attempt 1 `lost: node N lost`
//! (no retry used, `max_retries: 0`), attempt 2 resumed from that checkpoint,
//! the final value bit-identical to an uninterrupted run, and `xp report`
//! booking the loss under `node_loss`. The gangs: a command whose ranks
//! exchange a number each step over TCP on `MASTER_ADDR:MASTER_PORT` and exit
//! 1 as soon as the peer's connection drops (as gloo and NCCL do;
//! `tests/gang/exchange.py`), xp's own all-reduce (`elastic_sgd`), an elastic
//! gang that shrinks to its one survivor, and PyTorch DDP over gloo where
//! torch is installed. A gang whose code fails on every rank, all nodes
//! healthy, still ends `failed`.
//!
//! Each prints how long after the fault the head ended the attempt (the
//! detection time). These skip, saying why, where namespaces cannot be made
//! (not root).

mod common;

use std::time::{Duration, Instant};

use common::netns::NetnsCluster;
use common::{trials, wait_until};
use serde_json::Value;

/// The command gang's program.
const EXCHANGE: &str = include_str!("gang/exchange.py");
/// Its steps, and the step the fault comes after.
const STEPS: u64 = 40;
const FAULT_AFTER: u64 = 8;

/// What the command gang ends with when nothing interrupts it.
fn exchange_final(steps: u64) -> f64 {
    (1..=steps).fold(0.5, |value, step| {
        let sum = step % 7 + (step * 2) % 7;
        value * 0.999 + sum as f64 / 1000.0
    })
}

/// A head and one-GPU nodes on machines `hosts`, with the default node timeout.
fn cluster_of(hosts: &[&str]) -> Option<NetnsCluster> {
    let mut cluster = NetnsCluster::start(hosts, "3s")?;
    for host in hosts {
        cluster.start_node(host, 1, 2, &[]);
    }
    cluster.wait_for_nodes(hosts.len());
    Some(cluster)
}

/// When the fault is made, to measure how long the head takes to end the
/// attempt.
#[expect(
    clippy::disallowed_methods,
    reason = "measures the detection time the test reports"
)]
fn started() -> Instant {
    Instant::now()
}

#[expect(clippy::print_stderr, reason = "the measurement the test reports")]
fn say(text: &str) {
    eprintln!("{text}");
}

/// Submits the command gang (`fail_at` makes every rank fail before that step).
fn submit_exchange(cluster: &NetnsCluster, step_ms: u64, fail_at: Option<u64>) -> String {
    let program = cluster.write_file("exchange.py", EXCHANGE);
    let fail = fail_at.map_or_else(String::new, |step| format!(", '{step}'"));
    let yaml = format!(
        "name: exchange\nteam: tests\ntrial:\n  command: [python3, {}, '{{steps}}', '{{step_ms}}'{fail}]\n  workers: 2\n  resources: {{gpu: 1, cpu: 0.5}}\nsearch:\n  algorithm: grid\n  space:\n    steps: {{choice: [{STEPS}]}}\n    step_ms: {{choice: [{step_ms}]}}\n",
        program.display()
    );
    let path = cluster.write_file("exchange.yaml", &yaml);
    cluster
        .must_xp(&["submit", path.to_str().expect("a UTF-8 path")])
        .trim()
        .to_owned()
}

/// Submits `elastic_sgd` through the trainables driver with `workers`.
fn submit_sgd(cluster: &NetnsCluster, workers: &str) -> String {
    let yaml = format!(
        "name: sgd\nteam: tests\ntrial:\n  entry: elastic_sgd\n  workers: {workers}\n  resources: {{cpu: 1, gpu: 1}}\nsearch:\n  algorithm: grid\n  space:\n    steps: {{choice: [{SGD_STEPS}]}}\n    every: {{choice: [1]}}\n    batch: {{choice: [{SGD_BATCH}]}}\n    step_ms: {{choice: [300]}}\n    data_seed: {{choice: [{SGD_SEED}]}}\n"
    );
    let path = cluster.write_file("sgd.yaml", &yaml);
    let path = path.to_str().expect("a UTF-8 path");
    cluster.run_driver("examples/trainables", &["submit", "--spec", path])
}

const SGD_STEPS: u64 = 60;
const SGD_BATCH: u64 = 16;
const SGD_SEED: u64 = 5;

/// Waits until the newest checkpoint is at `step` or later and held by two
/// nodes; returns its step.
fn wait_replicated_checkpoint(cluster: &NetnsCluster, experiment: &str, step: u64) -> u64 {
    wait_until(
        &format!("a checkpoint at step {step}+ on two machines"),
        Duration::from_secs(120),
        || {
            let listed = cluster.must_xp(&["checkpoints", experiment, "--json"]);
            let newest: Value = serde_json::from_str(listed.lines().last()?).ok()?;
            let at = newest["step"].as_u64()?;
            (at >= step
                && newest["replicas"].as_array()?.len() == 2
                && newest["replicated"] == true)
                .then_some(at)
        },
    )
}

/// The machine running rank `rank` of the first attempt.
fn machine_of_rank(cluster: &NetnsCluster, experiment: &str, rank: usize) -> (String, String) {
    let status = cluster.status(experiment);
    let node = trials(&status)[0]["attempts"][0]["nodes"][rank]
        .as_str()
        .expect("a node id")
        .to_owned();
    (cluster.node_named(&node), node)
}

/// Waits until the first attempt has an outcome; returns it, having said how
/// long after `fault` it came.
fn first_outcome_after(
    cluster: &NetnsCluster,
    experiment: &str,
    fault: Instant,
    what: &str,
) -> String {
    let outcome = wait_until("attempt 1's outcome", Duration::from_secs(60), || {
        let status = cluster.status(experiment);
        trials(&status)[0]["attempts"][0]["outcome"]
            .as_str()
            .map(str::to_owned)
    });
    say(&format!(
        "{what}: attempt 1 ended {:.1} s later: {outcome}",
        fault.elapsed().as_secs_f64()
    ));
    outcome
}

/// The trial succeeded after its first attempt was lost to `node`, without a
/// retry, resumed from `checkpoint` or later, and `xp report` books the loss
/// under `node_loss`; returns the trial.
fn check_lost_then_resumed(
    cluster: &NetnsCluster,
    experiment: &str,
    node: &str,
    checkpoint: u64,
) -> Value {
    let status = cluster.wait_finished(experiment, Duration::from_secs(240));
    assert_eq!(status["state"], "succeeded", "{status:#}");
    let trial = trials(&status)[0].clone();
    let attempts = trial["attempts"].as_array().expect("attempts");
    assert_eq!(attempts.len(), 2, "{status:#}");
    let outcome = attempts[0]["outcome"].as_str().unwrap_or_default();
    assert_eq!(outcome, format!("lost: node {node} lost"), "{status:#}");
    assert_eq!(attempts[1]["outcome"], "succeeded", "{status:#}");
    let resumed = attempts[1]["resumed_from"]["step"]
        .as_u64()
        .unwrap_or_else(|| panic!("attempt 2 resumed from a checkpoint: {status:#}"));
    assert!(
        resumed >= checkpoint,
        "resumed from {resumed}, not {checkpoint}+"
    );
    assert!(
        !attempts[1]["nodes"]
            .as_array()
            .expect("nodes")
            .iter()
            .any(|at| at == node),
        "placed on healthy nodes only: {status:#}"
    );
    let report = cluster.must_xp(&["report", "--experiment", experiment, "--json"]);
    let report: Value = serde_json::from_str(report.trim()).expect("a JSON report");
    let lost = &report["lost_by_cause"];
    assert!(lost["node_loss"].as_f64() > Some(0.0), "{report:#}");
    assert_eq!(lost["failure"].as_f64(), Some(0.0), "{report:#}");
    trial
}

/// Once `experiment`'s gang has a replicated checkpoint at [`FAULT_AFTER`]
/// or later, kills the machine of its rank `rank` (or, with `cut`, cuts it
/// off the network), says how long the head took to end the attempt, and
/// checks the trial then resumed and succeeded ([`check_lost_then_resumed`]);
/// returns the trial. `gang` names it in the measurement.
fn fault_after_checkpoint(
    cluster: &mut NetnsCluster,
    experiment: &str,
    (rank, cut): (usize, bool),
    gang: &str,
) -> Value {
    let checkpoint = wait_replicated_checkpoint(cluster, experiment, FAULT_AFTER);
    let (machine, node) = machine_of_rank(cluster, experiment, rank);
    let fault = started();
    if cut {
        cluster.cut_network(&machine);
    } else {
        cluster.kill_node(&machine);
    }
    let what = format!(
        "{gang}, rank {rank}'s node {}",
        if cut { "cut off" } else { "killed" }
    );
    first_outcome_after(cluster, experiment, fault, &what);
    check_lost_then_resumed(cluster, experiment, &node, checkpoint)
}

/// The command gang, with its rank `rank`'s machine killed (or, with `cut`,
/// cut off the network) after a replicated checkpoint.
fn command_gang_survives(rank: usize, cut: bool) {
    let Some(mut cluster) = cluster_of(&["a", "b", "c"]) else {
        return;
    };
    let experiment = submit_exchange(&cluster, 250, None);
    let trial = fault_after_checkpoint(&mut cluster, &experiment, (rank, cut), "command gang");
    let value = trial["metrics"]["final"].as_f64().expect("a final value");
    assert_eq!(
        value.to_bits(),
        exchange_final(STEPS).to_bits(),
        "resumed {value} vs uninterrupted {}",
        exchange_final(STEPS)
    );
}

#[test]
fn a_command_gang_resumes_after_rank_0_s_node_is_killed() {
    command_gang_survives(0, false);
}

#[test]
fn a_command_gang_resumes_after_rank_1_s_node_is_killed() {
    command_gang_survives(1, false);
}

#[test]
fn a_command_gang_resumes_after_rank_0_s_node_is_cut_off() {
    command_gang_survives(0, true);
}

#[test]
fn a_gang_on_xp_s_all_reduce_resumes_after_rank_0_s_node_is_killed() {
    let Some(mut cluster) = cluster_of(&["a", "b", "c"]) else {
        return;
    };
    let experiment = submit_sgd(&cluster, "2");
    let trial = fault_after_checkpoint(&mut cluster, &experiment, (0, false), "xp all-reduce gang");
    common::sgd::check_same_as_never_resized(&trial, SGD_STEPS, SGD_BATCH, SGD_SEED);
}

#[test]
fn an_elastic_gang_shrinks_to_its_one_survivor() {
    let Some(mut cluster) = cluster_of(&["a", "b"]) else {
        return;
    };
    let experiment = submit_sgd(&cluster, "{min: 1, max: 2}");
    let trial = fault_after_checkpoint(&mut cluster, &experiment, (1, false), "elastic gang");
    let survivors = trial["attempts"][1]["nodes"].as_array().expect("nodes");
    assert_eq!(survivors.len(), 1, "{trial:#}");
    common::sgd::check_same_as_never_resized(&trial, SGD_STEPS, SGD_BATCH, SGD_SEED);
}

#[test]
fn a_gang_whose_code_fails_on_every_rank_with_all_nodes_healthy_still_fails() {
    let Some(cluster) = cluster_of(&["a", "b"]) else {
        return;
    };
    let experiment = submit_exchange(&cluster, 100, Some(3));
    let status = cluster.wait_finished(&experiment, Duration::from_secs(120));
    assert_eq!(status["state"], "failed", "{status:#}");
    let trial = &trials(&status)[0];
    let attempts = trial["attempts"].as_array().expect("attempts");
    assert_eq!(attempts.len(), 1, "no retries: {status:#}");
    let outcome = attempts[0]["outcome"].as_str().unwrap_or_default();
    assert!(
        outcome.starts_with("failed: rank ")
            && outcome.contains(" exited with status 1: failing at step 3"),
        "{status:#}"
    );
    let report = cluster.must_xp(&["report", "--experiment", &experiment, "--json"]);
    let report: Value = serde_json::from_str(report.trim()).expect("a JSON report");
    assert_eq!(
        report["lost_by_cause"]["node_loss"].as_f64(),
        Some(0.0),
        "{report:#}"
    );
}

/// PyTorch's DDP program.
const DDP: &str = include_str!("gang/ddp.py");
const DDP_STEPS: u64 = 30;

/// An interpreter that imports torch (`XP_TEST_TORCH_PYTHON`, else
/// `python3`), or why there is none.
fn torch_python() -> Result<String, String> {
    let python = std::env::var("XP_TEST_TORCH_PYTHON").unwrap_or_else(|_| "python3".to_owned());
    match std::process::Command::new(&python)
        .args(["-c", "import torch"])
        .output()
    {
        Ok(output) if output.status.success() => Ok(python),
        Ok(output) => Err(format!(
            "{python} cannot import torch: {}",
            String::from_utf8_lossy(&output.stderr)
                .lines()
                .last()
                .unwrap_or_default()
        )),
        Err(error) => Err(format!("cannot run {python}: {error}")),
    }
}

/// Submits the DDP gang as experiment `name` with `python` (with `--rerun`,
/// so that it does not reuse the identical trial of an earlier one).
fn submit_ddp(cluster: &NetnsCluster, python: &str, name: &str) -> String {
    let program = cluster.write_file("ddp.py", DDP);
    let yaml = format!(
        "name: {name}\nteam: tests\ntrial:\n  command: [{python}, {}, '{{steps}}', '200']\n  workers: 2\n  resources: {{gpu: 1, cpu: 1}}\nsearch:\n  algorithm: grid\n  space:\n    steps: {{choice: [{DDP_STEPS}]}}\n",
        program.display()
    );
    let path = cluster.write_file(&format!("{name}.yaml"), &yaml);
    cluster
        .must_xp(&["submit", "--rerun", path.to_str().expect("a UTF-8 path")])
        .trim()
        .to_owned()
}

/// The parameters the DDP gang reported at its end.
fn ddp_parameters(trial: &Value) -> Vec<u64> {
    (0..9)
        .map(|index| {
            trial["metrics"][format!("p{index}")]
                .as_f64()
                .unwrap_or_else(|| panic!("parameter p{index}: {trial:#}"))
                .to_bits()
        })
        .collect()
}

#[test]
fn pytorch_ddp_over_gloo_resumes_after_rank_0_s_node_is_killed() {
    let python = match torch_python() {
        Ok(python) => python,
        Err(reason) => {
            say(&format!("skipped: {reason}"));
            return;
        }
    };
    let Some(mut cluster) = cluster_of(&["a", "b", "c"]) else {
        return;
    };
    let reference = submit_ddp(&cluster, &python, "ddp-uninterrupted");
    let reference = cluster.wait_finished(&reference, Duration::from_secs(240));
    assert_eq!(reference["state"], "succeeded", "{reference:#}");
    let expected = ddp_parameters(&trials(&reference)[0]);
    let experiment = submit_ddp(&cluster, &python, "ddp");
    let trial = fault_after_checkpoint(
        &mut cluster,
        &experiment,
        (0, false),
        "PyTorch DDP over gloo",
    );
    assert_eq!(ddp_parameters(&trial), expected, "{trial:#}");
}
