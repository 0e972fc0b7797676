//! End-to-end data parallelism: gangs rendezvous through rank 0's store, all-reduce
//! across two real nodes, survive a rank that dies, and train the digits model with
//! two workers on one node (their ring over shared memory) to the same loss curve
//! as one.

mod common;

use std::time::Duration;

use common::{TestCluster, trials};

#[test]
fn gangs_all_reduce_across_nodes_and_a_dead_rank_fails_the_attempt_which_is_retried() {
    let mut cluster = TestCluster::start("10s");
    cluster.start_node("a", 0, 1);
    cluster.start_node("b", 0, 1);
    cluster.wait_for_nodes(2);
    // Two nodes with one slot each: the gang of two spans both, over QUIC.
    let experiment = cluster.run_driver(
        "examples/trainables",
        &[
            "submit",
            "--entry",
            "allreduce_check",
            "--workers",
            "2",
            "--crash-rank",
            "1",
        ],
    );
    let status = cluster.wait_finished(&experiment, Duration::from_secs(120));
    let trial = &trials(&status)[0];
    if trial["state"] != "succeeded" {
        let id = trial["id"].as_str().unwrap();
        for attempt in 1..=trial["attempts"].as_array().unwrap().len() {
            for rank in ["0", "1"] {
                let log = cluster.xp(&[
                    "logs",
                    id,
                    "--rank",
                    rank,
                    "--attempt",
                    &attempt.to_string(),
                ]);
                #[expect(
                    clippy::print_stderr,
                    reason = "show the workers' logs of a failing test"
                )]
                {
                    eprintln!(
                        "--- attempt {attempt} rank {rank}:\n{}",
                        String::from_utf8_lossy(&log.stdout)
                    );
                }
            }
        }
    }
    assert_eq!(trial["state"], "succeeded", "{status:#}");
    assert_eq!(trial["metrics"]["sum"], 3.0);
    let attempts = trial["attempts"].as_array().unwrap();
    assert_eq!(
        attempts.len(),
        2,
        "the first attempt failed and was retried: {status:#}"
    );
    assert!(
        attempts[0]["outcome"].as_str().unwrap().contains("rank"),
        "{:#}",
        attempts[0]
    );
    assert_ne!(
        attempts[1]["nodes"][0], attempts[1]["nodes"][1],
        "the gang spans both nodes"
    );
}

#[test]
fn two_workers_train_the_digits_model_like_one() {
    let mut cluster = TestCluster::start("10s");
    cluster.start_node("a", 0, 2);
    cluster.wait_for_nodes(1);
    let single = cluster.run_driver(
        "examples/ddp_digits",
        &["--workers", "1", "--epochs", "3", "--no-wait"],
    );
    let parallel = cluster.run_driver(
        "examples/ddp_digits",
        &["--workers", "2", "--epochs", "3", "--no-wait"],
    );
    let curve = |experiment: &str| -> Vec<f64> {
        let status = cluster.wait_finished(experiment, Duration::from_secs(300));
        let trial = &trials(&status)[0];
        assert_eq!(trial["state"], "succeeded", "{status:#}");
        let history = cluster.must_xp(&[
            "metrics",
            trial["id"].as_str().unwrap(),
            "--name",
            "train_loss",
            "--json",
        ]);
        let line: serde_json::Value = serde_json::from_str(history.trim()).unwrap();
        line["values"]
            .as_array()
            .unwrap()
            .iter()
            .map(|value| value.as_f64().unwrap())
            .collect()
    };
    // The gang of two shares node a: its ring runs over shared memory both ways
    // (also where the node gives the trial's ranks a user id of their own).
    let parallel_status = cluster.wait_finished(&parallel, Duration::from_secs(300));
    assert_eq!(
        trials(&parallel_status)[0]["metrics"]["shm_links"],
        2.0,
        "{parallel_status:#}"
    );
    let (one, two) = (curve(&single), curve(&parallel));
    assert_eq!(one.len(), 3);
    assert_eq!(two.len(), 3);
    // Stated tolerance: the two sum the same gradients in a different order (f32), so
    // the curves agree to 1e-4 relative; a wrong shard or reduction is off by far more.
    for (epoch, (a, b)) in one.iter().zip(&two).enumerate() {
        assert!(
            (a - b).abs() <= 1e-4 * a.abs(),
            "epoch {}: one worker {a}, two workers {b}",
            epoch + 1
        );
    }
}
