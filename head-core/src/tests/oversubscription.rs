//! Oversubscribed fractional GPUs in the head: an opted-in trial is placed at
//! its share over the policy's factor and its launch says so; a node's
//! eviction for GPU memory requeues it without using a retry.

use xp_runtime::ids::{NodeId, WorkerKey};
use xp_runtime::protocol::{HeadCommand, Launch, WorkerReport};

use super::{
    CONFIG, HeadCore, LoadedState, commands, must_apply_policy, node_id, registration, report,
    submit,
};

fn launches_of(sent: Vec<(NodeId, HeadCommand)>) -> Vec<Launch> {
    sent.into_iter()
        .filter_map(|(_, command)| match command {
            HeadCommand::Launch(launch) => Some(*launch),
            _ => None,
        })
        .collect()
}

/// Three trials that each ask for 0.45 of a GPU and opt in to oversubscription.
const SHARING: &str = "name: o\ntrial: {command: [sleep, '{x}'], resources: {gpu: 0.45, oversubscribe: true}, max_retries: 0}\nsearch: {algorithm: grid, space: {x: {choice: [1, 2, 3]}}}\n";

/// Checks that the three trials of [`SHARING`] share GPU 0, each told its
/// share and the factor.
fn check_three_share_one_gpu(placed: &[Launch]) {
    assert_eq!(placed.len(), 3, "{placed:?}");
    for launch in placed {
        assert_eq!(launch.gpu_indices, vec![0]);
        assert_eq!(launch.gpu_milli, 450, "the worker is told its share");
        assert_eq!(launch.oversubscription_milli, 1500);
    }
}

/// Reports that `node` evicted `key`'s worker at `now` for GPU 0's memory, of
/// which `used_gib` GiB of 100 were in use.
fn evicted(core: &mut HeadCore, now: u64, node: NodeId, key: WorkerKey, used_gib: u64) {
    let eviction = WorkerReport::Evicted {
        key,
        gpu: 0,
        used_bytes: used_gib << 30,
        total_bytes: 100 << 30,
    };
    report(core, now, node, eviction);
}

/// Checks that the evicted trial of `key` was requeued without using a retry,
/// saying why, counted, and launched again as attempt 2.
fn check_requeued_without_a_retry(core: &mut HeadCore, key: WorkerKey) {
    let trial = &core.book.trial(key.trial);
    // Requeued, and placed again in the same step: its charge is free again.
    assert_eq!(trial.state, xp_runtime::protocol::TrialState::Placed);
    assert_eq!(trial.failures, 0, "an eviction uses no retry");
    let outcome = trial.attempts[0].outcome.clone().unwrap_or_default();
    assert!(
        outcome.starts_with("evicted: ") && outcome.contains("GPU 0 had 97.0% in use"),
        "{outcome}"
    );
    assert_eq!(core.outbox.tally().gpu_memory_evictions, 1);
    // Attempt 2 is launched.
    let again = launches_of(commands(core));
    assert_eq!(again.len(), 1, "{again:?}");
    assert_eq!(again[0].key.trial, key.trial);
    assert_eq!(again[0].key.attempt, 2);
}

/// Checks that a fraction that did not opt in is placed at its share and told
/// factor 1, and that its node is not believed when it says it evicted it.
fn check_a_plain_fraction_is_not_evicted(core: &mut HeadCore, node: NodeId) {
    submit(
        core,
        4,
        "name: plain\ntrial: {command: [sleep, '1'], resources: {gpu: 0.1}}\n",
        false,
    );
    let plain = launches_of(commands(core));
    assert_eq!(plain.len(), 1, "{plain:?}");
    assert_eq!(
        (plain[0].gpu_milli, plain[0].oversubscription_milli),
        (100, 1000)
    );
    core.check_invariants();
    // A node that says it evicted that worker for memory is not believed: the
    // worker is taken as stopped, which is no free requeue and no eviction.
    let key = plain[0].key;
    report(core, 5, node, WorkerReport::Started { key, pid: 99 });
    evicted(core, 6, node, key, 99);
    assert_eq!(core.outbox.tally().gpu_memory_evictions, 1);
    let plain_trial = &core.book.trial(key.trial);
    let outcome = plain_trial.attempts[0].outcome.clone().unwrap_or_default();
    assert!(!outcome.starts_with("evicted: "), "{outcome}");
}

#[test]
fn opted_in_fractions_share_beyond_the_gpu_and_an_eviction_requeues_without_a_retry() {
    let mut core = HeadCore::restore(CONFIG, LoadedState::default(), 0);
    must_apply_policy(&mut core, 0, "oversubscription: 1.5\n");
    let node = node_id(1);
    core.handle_node_register(0, registration(node, 1, 8, Vec::new()));
    submit(&mut core, 1, SHARING, false);
    // 0.45 / 1.5 = 0.3 each: three fit on one GPU, 1.35 GPUs promised.
    let placed = launches_of(commands(&mut core));
    check_three_share_one_gpu(&placed);
    core.check_invariants();
    for (pid, launch) in placed.iter().enumerate() {
        let pid = pid as u32 + 10;
        report(
            &mut core,
            2,
            node,
            WorkerReport::Started {
                key: launch.key,
                pid,
            },
        );
    }
    evicted(&mut core, 3, node, placed[2].key, 97);
    check_requeued_without_a_retry(&mut core, placed[2].key);
    core.check_invariants();

    check_a_plain_fraction_is_not_evicted(&mut core, node);
    core.check_invariants();
}

#[test]
fn a_launch_tells_the_node_the_charge_the_policy_core_counts_after_a_policy_change() {
    let mut core = HeadCore::restore(CONFIG, LoadedState::default(), 0);
    must_apply_policy(&mut core, 0, "oversubscription: 1.5\n");
    // Submitted with no node to run on, under 1.5; the factor changes before
    // it is placed.
    submit(
        &mut core,
        1,
        "name: o\ntrial: {command: [sleep, '1'], resources: {gpu: 0.5, oversubscribe: true}}\n",
        false,
    );
    must_apply_policy(&mut core, 2, "oversubscription: 2\n");
    let node = node_id(1);
    core.handle_node_register(3, registration(node, 1, 8, Vec::new()));
    let placed = launches_of(commands(&mut core));
    assert_eq!(placed.len(), 1, "{placed:?}");
    let launch = &placed[0];
    assert_eq!(launch.gpu_milli, 500);
    // Whatever factor the core charged, the node's slot table charges the same.
    let held = core.book.trial(launch.key.trial).attempts[0].workers[0].gpu_milli;
    // Charged at submission, under 1.5: 500 / 1.5 rounded up.
    assert_eq!(held, 334);
    assert_eq!(
        xp_sched::oversubscribed_charge(500, u64::from(launch.oversubscription_milli)),
        u64::from(held),
        "factor {} for a charge of {held}",
        launch.oversubscription_milli
    );
    core.check_invariants();
}
