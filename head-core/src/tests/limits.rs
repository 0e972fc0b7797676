//! Tests of the limits the head judges: an attempt past its `time_limit` and a
//! worker killed for memory both end with outcomes of their own and are retried
//! under `max_retries`.

use super::*;

const LIMITED: &str = "name: limited\ntrial: {command: [sleep, '{x}'], max_retries: 1, time_limit: 30s, resources: {memory: 64MiB}}\nsearch: {algorithm: grid, space: {x: {choice: [1]}}}\n";

/// A core with one node and the trial of [`LIMITED`] running on it since `2`.
fn running() -> (HeadCore, NodeId, WorkerKey) {
    let mut core = HeadCore::restore(CONFIG, LoadedState::default(), 0);
    let node = node_id(1);
    core.handle_node_register(0, registration(node, 0, 2, Vec::new()));
    submit(&mut core, 1, LIMITED, false);
    let placed = launches(&commands(&mut core));
    let key = placed[0].1;
    report(&mut core, 2, node, WorkerReport::Started { key, pid: 7 });
    assert_eq!(core.book.trial(key.trial).state, TrialState::Running);
    (core, node, key)
}

/// The attempt of `key` failed and the trial is to be retried (queued or placed again).
fn check_retried(core: &HeadCore, key: WorkerKey) {
    let trial = &core.book.trial(key.trial);
    assert_eq!(trial.failures, 1);
    assert!(
        matches!(trial.state, TrialState::Queued | TrialState::Placed),
        "{:?}",
        trial.state
    );
}

fn outcome(core: &HeadCore, key: WorkerKey) -> String {
    core.book.trial(key.trial).attempts[key.attempt as usize - 1]
        .outcome
        .as_deref()
        .unwrap_or_default()
        .to_owned()
}

#[test]
fn the_launch_carries_the_memory_and_cpu_limits() {
    let mut core = HeadCore::restore(CONFIG, LoadedState::default(), 0);
    core.handle_node_register(0, registration(node_id(1), 0, 2, Vec::new()));
    submit(&mut core, 1, LIMITED, false);
    let launch = commands(&mut core)
        .into_iter()
        .find_map(|(_, command)| match command {
            HeadCommand::Launch(launch) => Some(launch),
            _ => None,
        })
        .unwrap();
    assert_eq!((launch.cpu_milli, launch.memory_bytes), (1000, 64 << 20));
}

#[test]
fn a_trial_without_memory_is_limited_and_counted_at_the_policy_default() {
    let mut core = HeadCore::restore(CONFIG, LoadedState::default(), 0);
    let node = node_id(1);
    core.handle_node_register(0, registration(node, 0, 8, Vec::new()));
    let launched = |core: &mut HeadCore| {
        commands(core)
            .into_iter()
            .filter_map(|(_, command)| match command {
                HeadCommand::Launch(launch) => Some(launch.memory_bytes),
                _ => None,
            })
            .collect::<Vec<_>>()
    };
    submit(&mut core, 1, ONE, false);
    assert_eq!(launched(&mut core), [2 << 30], "the default: 2 GiB");
    must_apply_policy(
        &mut core,
        2,
        "admission: {default_memory_per_worker: 96MiB}\n",
    );
    let unlimited = ONE.replace("name: one", "name: two");
    submit(&mut core, 3, &unlimited, false);
    assert_eq!(launched(&mut core), [96 << 20], "the policy's");
    // The node's memory is counted at that size, so it is not offered twice.
    let free = core.placement.policy().pool().free().memory_bytes;
    assert_eq!(free, (1 << 34) - (2 << 30) - (96 << 20));
    core.check_invariants();
}

#[test]
fn an_undeclared_worker_gets_no_more_than_its_cpu_share_of_the_smallest_node() {
    // A Slurm allocation: 2 CPUs and 1 GiB.
    let mut core = HeadCore::restore(CONFIG, LoadedState::default(), 0);
    let mut small = registration(node_id(1), 0, 2, Vec::new());
    small.resources.memory_bytes = 1 << 30;
    core.handle_node_register(0, small);
    let two = ONE.replace("choice: [1]", "choice: [1, 2]");
    submit(&mut core, 1, &two, false);
    let memory: Vec<u64> = commands(&mut core)
        .into_iter()
        .filter_map(|(_, command)| match command {
            HeadCommand::Launch(launch) => Some(launch.memory_bytes),
            _ => None,
        })
        .collect();
    assert_eq!(
        memory,
        [512 << 20, 512 << 20],
        "both 1-CPU trials run, half each"
    );
    core.check_invariants();
}

#[test]
fn an_attempt_past_its_time_limit_is_stopped_and_retried() {
    let (mut core, node, key) = running();
    core.handle_node_message(2 + 30_000, node, NodeMessage::Heartbeat);
    core.handle_tick(2 + 30_000);
    assert_eq!(core.book.trial(key.trial).state, TrialState::Running);
    assert!(
        commands(&mut core)
            .iter()
            .all(|(_, command)| !matches!(command, HeadCommand::Kill { .. }))
    );
    core.handle_node_message(2 + 30_001, node, NodeMessage::Heartbeat);
    core.handle_tick(2 + 30_001);
    check_retried(&core, key);
    let outcome = outcome(&core, key);
    assert_eq!(outcome, "time-limit: ran past its time limit of 30s");
    let kills: Vec<(NodeId, String)> = commands(&mut core)
        .into_iter()
        .filter_map(|(to, command)| match command {
            HeadCommand::Kill { reason, .. } => Some((to, reason)),
            _ => None,
        })
        .collect();
    assert_eq!(kills, vec![(node, outcome)]);
    // The stopped worker's report frees it and changes nothing else.
    let stopped = WorkerReport::Stopped {
        key,
        reason: "time-limit".to_owned(),
    };
    report(&mut core, 30_100, node, stopped);
    check_retried(&core, key);
}

#[test]
fn a_worker_killed_for_memory_ends_oom_killed_and_is_retried_then_fails() {
    let (mut core, node, key) = running();
    let oom = |key| WorkerReport::OomKilled {
        key,
        code: Some(137),
        signal: None,
        limit_bytes: 64 << 20,
    };
    report(&mut core, 3, node, oom(key));
    check_retried(&core, key);
    let outcome = outcome(&core, key);
    assert!(
        outcome.starts_with("oom-killed: rank 0 was killed for going over its memory limit of 64"),
        "{outcome}"
    );
    let retry = launches(&commands(&mut core))[0].1;
    assert_eq!(retry.attempt, 2);
    report(
        &mut core,
        4,
        node,
        WorkerReport::Started { key: retry, pid: 8 },
    );
    report(&mut core, 5, node, oom(retry));
    let trial = &core.book.trial(key.trial);
    assert_eq!(trial.state, TrialState::Failed);
    let reason = trial.reason.clone().unwrap_or_default();
    assert!(
        reason.contains("memory limit") && reason.contains("no retries left"),
        "{reason}"
    );
}
