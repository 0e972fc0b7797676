//! Tests of the attained-service level edges across a restart: a restarted
//! head hands the policy core its completed trials' service, oldest first, so
//! the adaptive edges come back as they were.

use super::*;

const MINUTE: u64 = 60_000;

/// A grid of `n` one-GPU trials, run one at a time on a one-GPU node.
fn one_gpu_grid(n: u32) -> String {
    let choices: Vec<String> = (1..=n).map(|x| x.to_string()).collect();
    format!(
        "name: g\ntrial: {{command: [sleep, '{{x}}'], resources: {{gpu: 1}}, max_retries: 0}}\nsearch: {{algorithm: grid, space: {{x: {{choice: [{}]}}}}}}\n",
        choices.join(", ")
    )
}

/// Runs every launched trial to success, each for its own number of minutes,
/// starting the next at once; returns when nothing more is launched.
fn run_each_for_its_minutes(core: &mut HeadCore, node: NodeId, mut now: u64) -> usize {
    let mut ran = 0;
    loop {
        let launched = launches(&commands(core));
        if launched.is_empty() {
            return ran;
        }
        for (_, key) in launched {
            report(core, now, node, WorkerReport::Started { key, pid: 1 });
            // Minutes spread over 1 to 40, in no order.
            now += (u64::from(key.trial.index) * 7919 % 40 + 1) * MINUTE;
            exited(core, now, node, key, 0);
            ran += 1;
        }
    }
}

#[test]
fn a_restarted_head_has_the_level_edges_it_had() {
    let (mut core, node) = cluster(1, 4);
    let experiment = submit(&mut core, 0, &one_gpu_grid(24), false);
    assert_eq!(run_each_for_its_minutes(&mut core, node, 0), 24);
    assert_eq!(trial_state(&core, experiment, 23), TrialState::Succeeded);
    let edges = core.placement.policy().level_edges_gpu_ms().to_vec();
    // The default policy's prior is 2 and 32 GPU-hours; minutes of one GPU
    // moved the edges well under it.
    assert_eq!(edges.len(), 2);
    assert!(edges[1] < 60 * MINUTE, "{edges:?}");

    let records = core.take_records();
    let restarted = HeadCore::restore(CONFIG, loaded_from(records), 2_000 * MINUTE);
    assert_eq!(restarted.placement.policy().level_edges_gpu_ms(), edges);
    restarted.check_invariants();
}
