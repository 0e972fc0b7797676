//! Tests of what the core hands `/metrics`: the tally of state changes,
//! checkpoints and decisions (a resent checkpoint report counted once), and
//! the scrape-time snapshot of a real core.

use super::*;
use crate::metrics::NO_QUEUE;

/// One trial on one GPU.
const ON_A_GPU: &str = "name: gpu\ntrial: {command: [echo, '{x}'], resources: {gpu: 1}}\nsearch: {algorithm: grid, space: {x: {choice: [1]}}}\n";

#[test]
fn the_tally_counts_changes_and_new_checkpoints_once() {
    let mut core = HeadCore::restore(CONFIG, LoadedState::default(), 0);
    let node = node_id(1);
    core.handle_node_register(0, registration(node, 2, 2, Vec::new()));
    let experiment = submit(&mut core, 1, ON_A_GPU, false);
    let key = launches(&commands(&mut core))[0].1;
    report(&mut core, 2, node, WorkerReport::Started { key, pid: 7 });
    let running = core.metrics_snapshot();
    let node_label = node.to_string();
    let on_node = |snapshot: &crate::metrics::MetricsSnapshot| {
        snapshot
            .gpus
            .iter()
            .filter(|((label, _), _)| *label == node_label)
            .map(|(_, count)| (count.total, count.allocated))
            .fold((0, 0.0), |(total, allocated), (t, a)| {
                (total + t, allocated + a)
            })
    };
    assert_eq!(on_node(&running), (2, 1.0));
    assert_eq!(running.nodes["ready"], 1);
    let queue = running
        .trials
        .keys()
        .map(|(queue, _)| queue.clone())
        .next()
        .expect("one trial");
    assert_ne!(queue, NO_QUEUE, "the default policy has a queue for it");
    assert_eq!(running.trials[&(queue.clone(), "running")], 1);

    // The same checkpoint twice (a node resends after a reconnect), then another.
    report(&mut core, 3, node, checkpoint_report(key, 1, b"abc"));
    report(&mut core, 3, node, checkpoint_report(key, 1, b"abc"));
    report(&mut core, 4, node, checkpoint_report(key, 2, b"defgh"));
    report(
        &mut core,
        5,
        node,
        WorkerReport::Exited {
            key,
            code: Some(0),
            signal: None,
        },
    );
    assert_eq!(trial_state(&core, experiment, 0), TrialState::Succeeded);

    let tally = core.take_tally();
    let count = |state| {
        tally
            .transitions
            .iter()
            .filter(|changed| **changed == state)
            .count()
    };
    assert_eq!(count(TrialState::Placed), 1);
    assert_eq!(count(TrialState::Running), 1);
    assert_eq!(count(TrialState::Succeeded), 1);
    assert_eq!(tally.checkpoints, 2);
    assert_eq!(tally.checkpoint_bytes, 8);
    assert!(core.decisions_made() > 0, "the launch was a decision");
    assert_eq!(
        core.take_tally(),
        crate::metrics::Tally::default(),
        "taken once"
    );

    let done = core.metrics_snapshot();
    assert_eq!(done.trials[&(queue, "succeeded")], 1);
    assert_eq!(done.trials.len(), 1);
    assert_eq!(on_node(&done), (2, 0.0));
}

#[test]
fn the_tally_counts_failed_attempts_and_the_failure() {
    let mut core = HeadCore::restore(CONFIG, LoadedState::default(), 0);
    let node = node_id(1);
    core.handle_node_register(0, registration(node, 0, 1, Vec::new()));
    let experiment = submit(&mut core, 0, ONE, false);
    // ONE allows one retry: two failed attempts fail the trial.
    for attempt in 1..=2 {
        let key = launches(&commands(&mut core))[0].1;
        assert_eq!(key.attempt, attempt);
        report(
            &mut core,
            u64::from(attempt),
            node,
            WorkerReport::Exited {
                key,
                code: Some(3),
                signal: None,
            },
        );
    }
    assert_eq!(trial_state(&core, experiment, 0), TrialState::Failed);
    let tally = core.take_tally();
    assert_eq!(
        tally.attempt_failures,
        BTreeMap::from([("failed".to_owned(), 2)])
    );
    let placed = tally
        .transitions
        .iter()
        .filter(|state| **state == TrialState::Placed)
        .count();
    assert_eq!(placed, 2, "each attempt is a start");
    assert_eq!(
        tally.transitions.last(),
        Some(&TrialState::Failed),
        "{:?}",
        tally.transitions
    );
}
