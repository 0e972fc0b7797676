//! Unit and property tests of the policy core.

use std::collections::{BTreeMap, HashMap, HashSet};

use proptest::prelude::{
    Just, ProptestConfig, any, prop, prop_assert, prop_assert_eq, prop_oneof, proptest,
};
use proptest::strategy::Strategy as PropStrategy;
use xp_runtime::ids::ExperimentId;

use super::*;
use crate::config::{
    AgingConfig, Approval, AttainedServiceConfig, HeadOfLine, LevelSource, Order, PlacementKind,
    PreemptionConfig, QueueConfig, QueuePreemption, ResourceLimits,
};
use crate::{Amount, ApprovalVerdict, PreemptReason, QueueUsage, ResizeReason};

const GIB: u64 = 1 << 30;
const SECOND: u64 = 1000;
const MINUTE: u64 = 60 * SECOND;
const HOUR: u64 = 60 * MINUTE;

fn trial_of(experiment: u64, index: u32) -> TrialId {
    TrialId {
        experiment: ExperimentId {
            digest: experiment,
            run: 1,
        },
        index,
    }
}

fn id(index: u32) -> TrialId {
    trial_of(7, index)
}

fn node_id(n: u128) -> NodeId {
    NodeId(uuid::Uuid::from_u128(n))
}

fn node(n: u128, gpus: u32) -> NodeSpec {
    NodeSpec {
        id: node_id(n),
        gpus,
        gpu_model: None,
        cpu_milli: 64_000,
        memory_bytes: 256 * GIB,
        labels: BTreeMap::new(),
    }
}

/// One worker with `gpus` whole GPUs, team `default`, priority 0, submitted at
/// `index` ms, preemptible, no time limit.
fn req(index: u32, gpus: u64) -> TrialRequest {
    TrialRequest {
        id: id(index),
        team: "default".to_owned(),
        queue: None,
        priority: 0,
        gang: GangShape {
            workers: 1,
            per_worker: Amount {
                gpu_milli: gpus * GPU_MILLI,
                cpu_milli: 1000,
                memory_bytes: GIB,
            },
            gpu_models: Vec::new(),
            node_labels: BTreeMap::new(),
            spread: false,
            leases: Default::default(),
            oversubscribe: false,
        },
        preemptible: true,
        time_limit_ms: None,
        submitted_at: u64::from(index),
        urgency: 0,
    }
}

fn of_team(request: TrialRequest, team: &str) -> TrialRequest {
    TrialRequest {
        team: team.to_owned(),
        ..request
    }
}

fn core_with(config: PolicyConfig, gpus_per_node: &[u32]) -> PolicyCore {
    let mut core = PolicyCore::new(config);
    for (n, gpus) in gpus_per_node.iter().enumerate() {
        core.upsert_node(node(n as u128 + 1, *gpus));
    }
    core
}

fn core_yaml(yaml: &str, gpus_per_node: &[u32]) -> PolicyCore {
    core_with(PolicyConfig::from_yaml(yaml).unwrap(), gpus_per_node)
}

fn core_preset(preset: &str, gpus_per_node: &[u32]) -> PolicyCore {
    core_with(PolicyConfig::preset(preset).unwrap(), gpus_per_node)
}

fn must_submit(core: &mut PolicyCore, request: TrialRequest) {
    let now = request.submitted_at;
    core.submit(request, now).unwrap();
}

/// Decides and checks the invariants.
fn must_decide(core: &mut PolicyCore, now: UnixMillis) -> Vec<Decision> {
    let decisions = core.decide(now);
    core.check_invariants().unwrap();
    decisions
}

fn placed(decisions: &[Decision]) -> Vec<TrialId> {
    decisions
        .iter()
        .filter_map(|decision| match decision {
            Decision::Place { trial, .. } => Some(*trial),
            Decision::Preempt { .. } | Decision::Resize { .. } => None,
        })
        .collect()
}

fn preempted(decisions: &[Decision]) -> Vec<(TrialId, PreemptReason, u64)> {
    decisions
        .iter()
        .filter_map(|decision| match decision {
            Decision::Preempt {
                trial,
                reason,
                grace_ms,
            } => Some((*trial, reason.clone(), *grace_ms)),
            Decision::Place { .. } | Decision::Resize { .. } => None,
        })
        .collect()
}

fn check_reason(core: &PolicyCore, trial: TrialId, expected: WaitReason) {
    assert_eq!(
        core.wait_reason(trial),
        Some(expected),
        "wait reason of {trial}"
    );
}

/// The trial waits for room: what is free does not hold it now.
fn check_waits_for_room(core: &PolicyCore, trial: TrialId) {
    let reason = core.wait_reason(trial);
    assert!(
        matches!(
            reason,
            Some(WaitReason::NoRoom { .. } | WaitReason::GangDoesNotFit)
        ),
        "wait reason of {trial}: {reason:?}"
    );
}

fn queue_usage(core: &PolicyCore, name: &str) -> QueueUsage {
    core.queues()
        .into_iter()
        .find(|queue| queue.name == name)
        .unwrap()
}

/// Runs trials one at a time on a one-GPU node and returns the start order.
fn check_order(config: PolicyConfig, requests: Vec<TrialRequest>, expected: &[u32]) {
    let mut core = core_with(config, &[1]);
    for request in requests {
        must_submit(&mut core, request);
    }
    let mut order = Vec::new();
    let mut now = 10;
    loop {
        let started = placed(&must_decide(&mut core, now));
        if started.is_empty() {
            break;
        }
        for trial in started {
            order.push(trial.index);
            assert!(core.finish(trial, now + 1, true));
        }
        now += 10;
    }
    assert_eq!(order, expected);
}

#[test]
fn a_gang_that_found_no_room_is_placed_once_room_is_freed() {
    // Two 3-GPU nodes, one GPU left on each: room for two GPUs in all, none
    // on one node.
    let mut core = core_preset("fifo", &[3, 3]);
    must_submit(&mut core, req(1, 2));
    must_submit(&mut core, req(2, 2));
    assert_eq!(placed(&must_decide(&mut core, 10)).len(), 2);
    must_submit(&mut core, req(3, 2));
    // The first pass searches and finds no room; the next ones, with none
    // gained, answer from memory.
    for now in [20, 30, 40] {
        assert!(placed(&must_decide(&mut core, now)).is_empty());
        check_waits_for_room(&core, id(3));
    }
    // A finish frees a node: the memory is forgotten and the gang placed.
    assert!(core.finish(id(1), 50, true));
    assert_eq!(placed(&must_decide(&mut core, 50)), vec![id(3)]);
}

#[test]
fn fifo_ignores_priority_and_priority_order_respects_it() {
    let requests = || {
        vec![
            req(1, 1),
            TrialRequest {
                priority: 1000,
                ..req(2, 1)
            },
            TrialRequest {
                priority: 100,
                ..req(3, 1)
            },
            // Same submission time as 3: the id breaks the tie.
            TrialRequest {
                priority: 100,
                submitted_at: 3,
                ..req(4, 1)
            },
        ]
    };
    check_order(
        PolicyConfig::preset("fifo").unwrap(),
        requests(),
        &[1, 2, 3, 4],
    );
    check_order(
        PolicyConfig::preset("priority").unwrap(),
        requests(),
        &[2, 3, 4, 1],
    );
    check_order(
        PolicyConfig::preset("fair").unwrap(),
        requests(),
        &[2, 3, 4, 1],
    );
}

#[test]
fn strict_head_of_line_blocks_and_skip_passes() {
    for (yaml, small_starts) in [
        ("order: fifo\n", false),
        ("order: fifo\nhead_of_line: skip\n", true),
        ("order: priority\n", false),
        ("order: fair\nhead_of_line: skip\n", true),
    ] {
        let mut core = core_yaml(yaml, &[4]);
        must_submit(&mut core, req(1, 2));
        assert_eq!(placed(&must_decide(&mut core, 10)), vec![id(1)]);
        must_submit(&mut core, req(2, 4));
        must_submit(&mut core, req(3, 1));
        let started = placed(&must_decide(&mut core, 20));
        check_waits_for_room(&core, id(2));
        if small_starts {
            assert_eq!(started, vec![id(3)], "{yaml}");
        } else {
            assert!(started.is_empty(), "{yaml}");
            check_reason(&core, id(3), WaitReason::BehindHigherPriority);
        }
    }
}

/// Under fair order, team a's lane holds only gangs of two GPUs while one
/// GPU is free, and team b waits with one of one GPU: once the budget of
/// trials looked at runs out in a's lane, the pass ends and b's trial does
/// not start, so a's lane is not cut short where its trials would spend
/// the budget.
#[test]
fn a_lane_cut_short_spends_the_budget_as_its_walk_would() {
    let yaml = "queues:\n  - {name: qa, team: a}\n  - {name: qb, team: b}\norder: fair\nhead_of_line: skip\nbackfill: false\npreemption: {enabled: false}\n";
    for walk_every_trial in [false, true] {
        let mut core = core_yaml(yaml, &[2]);
        core.walk_every_trial = walk_every_trial;
        core.examined_budget_override = Some(3);
        // b holds one GPU, so a's share is the lower and its lane goes first.
        must_submit(&mut core, of_team(req(0, 1), "b"));
        assert_eq!(placed(&must_decide(&mut core, 1)), vec![id(0)]);
        for index in 1..=5 {
            must_submit(&mut core, of_team(req(index, 2), "a"));
        }
        must_submit(&mut core, of_team(req(6, 1), "b"));
        assert_eq!(
            placed(&must_decide(&mut core, 10)),
            Vec::<TrialId>::new(),
            "walking every trial: {walk_every_trial}"
        );
        // With a budget the lane's trials cannot exhaust, b's trial starts.
        core.examined_budget_override = Some(7);
        assert_eq!(placed(&must_decide(&mut core, 20)), vec![id(6)]);
    }
}

/// On one GPU under `order: priority`: trial 1 waits from time 0 behind trial 0,
/// `newcomer` (trial 2) arrives three hours later as trial 0 finishes; which of
/// the two starts first, with aging (100 an hour) or without.
fn first_after_three_hours(aging: bool, newcomer: TrialRequest) -> TrialId {
    let yaml = if aging {
        "order: priority\naging: {rate_per_hour: 100, cap: 1000}\n"
    } else {
        "order: priority\n"
    };
    let mut core = core_yaml(yaml, &[1]);
    must_submit(&mut core, req(0, 1));
    assert_eq!(placed(&must_decide(&mut core, 0)), vec![id(0)]);
    must_submit(
        &mut core,
        TrialRequest {
            submitted_at: 0,
            ..req(1, 1)
        },
    );
    must_submit(
        &mut core,
        TrialRequest {
            submitted_at: 3 * HOUR,
            ..newcomer
        },
    );
    core.finish(id(0), 3 * HOUR, true);
    let started = placed(&must_decide(&mut core, 3 * HOUR));
    assert_eq!(started.len(), 1, "aging {aging}: {started:?}");
    started[0]
}

#[test]
fn aging_lets_a_low_priority_trial_pass() {
    // By three hours the old trial has aged by 300, past the newcomer's 100.
    for (aging, expected_first) in [(true, id(1)), (false, id(2))] {
        let newcomer = TrialRequest {
            priority: 100,
            ..req(2, 1)
        };
        assert_eq!(
            first_after_three_hours(aging, newcomer),
            expected_first,
            "aging {aging}"
        );
    }
}

#[test]
fn urgency_breaks_ties_of_equal_effective_priority_only() {
    let requests = || {
        vec![
            req(1, 1),
            TrialRequest {
                urgency: 1,
                ..req(2, 1)
            },
            TrialRequest {
                priority: 100,
                ..req(3, 1)
            },
            TrialRequest {
                urgency: 2,
                ..req(4, 1)
            },
            TrialRequest {
                urgency: 1,
                ..req(5, 1)
            },
        ]
    };
    // FIFO promises arrival order and ignores urgency as it ignores priority.
    check_order(
        PolicyConfig::preset("fifo").unwrap(),
        requests(),
        &[1, 2, 3, 4, 5],
    );
    // Priority first, then urgency, then arrival.
    for preset in ["priority", "fair", "default"] {
        check_order(
            PolicyConfig::preset(preset).unwrap(),
            requests(),
            &[3, 4, 2, 5, 1],
        );
    }
}

#[test]
fn aging_lifts_a_long_waiter_past_urgent_newcomers() {
    for (aging, expected_first) in [(true, id(1)), (false, id(2))] {
        let newcomer = TrialRequest {
            urgency: 5,
            ..req(2, 1)
        };
        assert_eq!(
            first_after_three_hours(aging, newcomer),
            expected_first,
            "aging {aging}"
        );
    }
}

#[test]
fn urgency_does_not_beat_fair_share_between_queues() {
    let mut core = core_yaml(TWO_QUEUES, &[2]);
    must_submit(&mut core, of_team(req(1, 1), "a"));
    assert_eq!(placed(&must_decide(&mut core, 10)), vec![id(1)]);
    must_submit(
        &mut core,
        TrialRequest {
            urgency: 9,
            ..of_team(req(2, 1), "a")
        },
    );
    must_submit(&mut core, of_team(req(3, 1), "b"));
    // Queue a already holds a GPU: b's trial has the lower share and goes first.
    assert_eq!(placed(&must_decide(&mut core, 20)), vec![id(3)]);
    check_waits_for_room(&core, id(2));
}

#[test]
fn urgency_can_change_while_waiting() {
    let mut core = core_yaml("order: priority\n", &[1]);
    must_submit(&mut core, req(0, 1));
    assert_eq!(placed(&must_decide(&mut core, 10)), vec![id(0)]);
    must_submit(&mut core, req(1, 1));
    must_submit(&mut core, req(2, 1));
    assert!(core.set_urgency(id(2), 1));
    assert!(!core.set_urgency(id(99), 1));
    core.check_invariants().unwrap();
    core.finish(id(0), 20, true);
    assert_eq!(placed(&must_decide(&mut core, 20)), vec![id(2)]);
    assert!(core.set_urgency(id(2), 0));
    core.finish(id(2), 30, true);
    assert_eq!(placed(&must_decide(&mut core, 30)), vec![id(1)]);
}

const TWO_QUEUES: &str = "
queues:
  - {name: a, team: a}
  - {name: b, team: b}
";

#[test]
fn fair_share_alternates_between_equal_queues() {
    let mut core = core_yaml(TWO_QUEUES, &[8]);
    for index in 0..8 {
        must_submit(&mut core, of_team(req(index, 1), "a"));
        must_submit(&mut core, of_team(req(100 + index, 1), "b"));
    }
    let started = placed(&must_decide(&mut core, 1000));
    let teams: Vec<bool> = started.iter().map(|trial| trial.index < 100).collect();
    assert_eq!(teams, [true, false, true, false, true, false, true, false]);
    assert_eq!(queue_usage(&core, "a").running, 4);
    assert_eq!(queue_usage(&core, "b").running, 4);
    check_waits_for_room(&core, id(4));
}

#[test]
fn fair_share_follows_weights() {
    let yaml = "
queues:
  - {name: a, team: a, weight: 2}
  - {name: b, team: b}
";
    let mut core = core_yaml(yaml, &[9]);
    for index in 0..9 {
        must_submit(&mut core, of_team(req(index, 1), "a"));
        must_submit(&mut core, of_team(req(100 + index, 1), "b"));
    }
    must_decide(&mut core, 1000);
    assert_eq!(queue_usage(&core, "a").running, 6);
    assert_eq!(queue_usage(&core, "b").running, 3);
    let a = queue_usage(&core, "a");
    let b = queue_usage(&core, "b");
    assert!((a.dominant_share - b.dominant_share).abs() < 1e-9);
}

#[test]
fn fair_share_is_by_dominant_resource() {
    // Team a's trials are CPU-heavy: each takes 15 of the 64 cores, so a's
    // share grows by CPU while b's 1-GPU trials count in GPUs (1/8 each).
    let mut core = core_yaml(TWO_QUEUES, &[8]);
    for index in 0..4 {
        let mut request = of_team(req(index, 0), "a");
        request.gang.per_worker.cpu_milli = 15_000;
        must_submit(&mut core, request);
        must_submit(&mut core, of_team(req(100 + index, 1), "b"));
    }
    let started = placed(&must_decide(&mut core, 1000));
    // a: 1/4 per trial; b: 1/8 per trial. After a's first, b runs twice per a.
    assert_eq!(
        started.iter().map(|trial| trial.index).collect::<Vec<_>>(),
        [0, 100, 101, 1, 102, 103, 2, 3]
    );
}

const COHORT: &str = "
queues:
  - {name: a, team: a, cohort: c, quota: {gpu: 4}}
  - {name: b, team: b, cohort: c, quota: {gpu: 4}}
preemption: {grace_period: 30s, min_run_time: 0s}
";

#[test]
fn cohort_lends_idle_quota_and_reclaims_it() {
    let mut core = core_yaml(COHORT, &[8]);
    for index in 0..10 {
        must_submit(&mut core, of_team(req(index, 1), "a"));
    }
    assert_eq!(placed(&must_decide(&mut core, 0)).len(), 8);
    let a = queue_usage(&core, "a");
    assert_eq!(a.usage.gpu_milli, 8000);
    assert_eq!(a.borrowed.gpu_milli, 4000);
    assert_eq!(queue_usage(&core, "b").lent.gpu_milli, 4000);
    check_reason(
        &core,
        id(8),
        WaitReason::OverQuota {
            resource: "gpu".to_owned(),
        },
    );

    must_submit(
        &mut core,
        of_team(
            TrialRequest {
                submitted_at: 10 * SECOND,
                ..req(100, 1)
            },
            "b",
        ),
    );
    must_submit(
        &mut core,
        of_team(
            TrialRequest {
                submitted_at: 10 * SECOND,
                ..req(101, 1)
            },
            "b",
        ),
    );
    let decisions = must_decide(&mut core, 10 * SECOND);
    let victims = preempted(&decisions);
    assert_eq!(victims.len(), 2);
    for (victim, reason, grace_ms) in &victims {
        assert!(victim.index < 100);
        assert_eq!(grace_ms, &30_000);
        assert!(matches!(reason, PreemptReason::Reclaim { queue, .. } if queue == "b"));
        assert!(core.is_preempting(*victim));
    }
    check_reason(&core, id(100), WaitReason::WaitingForPreemption);
    check_reason(&core, id(101), WaitReason::WaitingForPreemption);
    // Victims keep their GPUs until they are reported stopped.
    assert!(placed(&must_decide(&mut core, 11 * SECOND)).is_empty());
    assert!(preempted(&must_decide(&mut core, 11 * SECOND)).is_empty());
    for (victim, _, _) in &victims {
        assert!(core.requeue(*victim, 20 * SECOND));
    }
    let started = placed(&must_decide(&mut core, 20 * SECOND));
    assert_eq!(started, vec![id(100), id(101)]);
    assert_eq!(queue_usage(&core, "a").borrowed.gpu_milli, 2000);
    assert_eq!(queue_usage(&core, "b").lent.gpu_milli, 2000);
    check_reason(
        &core,
        victims[0].0,
        WaitReason::OverQuota {
            resource: "gpu".to_owned(),
        },
    );
}

#[test]
fn no_cohort_means_never_above_quota() {
    let mut core = core_yaml("queues: [{name: a, team: a, quota: {gpu: 4}}]\n", &[8]);
    for index in 0..6 {
        must_submit(&mut core, of_team(req(index, 1), "a"));
    }
    assert_eq!(placed(&must_decide(&mut core, 0)).len(), 4);
    check_reason(
        &core,
        id(4),
        WaitReason::OverQuota {
            resource: "gpu".to_owned(),
        },
    );
}

#[test]
fn borrowing_and_lending_limits_hold() {
    for (yaml, expected) in [
        (
            COHORT.replace(
                "quota: {gpu: 4}}\n  - {name: b",
                "quota: {gpu: 4}, borrowing_limit: {gpu: 2}}\n  - {name: b",
            ),
            6,
        ),
        (
            COHORT.replace(
                "{name: b, team: b, cohort: c, quota: {gpu: 4}}",
                "{name: b, team: b, cohort: c, quota: {gpu: 4}, lending_limit: {gpu: 1}}",
            ),
            5,
        ),
    ] {
        let mut core = core_yaml(&yaml, &[8]);
        for index in 0..8 {
            must_submit(&mut core, of_team(req(index, 1), "a"));
        }
        assert_eq!(placed(&must_decide(&mut core, 0)).len(), expected, "{yaml}");
        // The first that does not fit says why; strict head of line holds the rest.
        check_reason(
            &core,
            id(expected as u32),
            WaitReason::OverQuota {
                resource: "gpu".to_owned(),
            },
        );
        check_reason(&core, id(7), WaitReason::BehindHigherPriority);
    }
}

#[test]
fn backfill_starts_only_what_ends_before_the_reservation() {
    let mut core = core_preset("backfill", &[4]);
    must_submit(
        &mut core,
        TrialRequest {
            time_limit_ms: Some(100 * SECOND),
            ..req(1, 2)
        },
    );
    assert_eq!(placed(&must_decide(&mut core, 0)), vec![id(1)]);
    must_submit(&mut core, req(2, 4));
    must_submit(
        &mut core,
        TrialRequest {
            time_limit_ms: Some(50 * SECOND),
            ..req(3, 1)
        },
    );
    must_submit(
        &mut core,
        TrialRequest {
            time_limit_ms: Some(200 * SECOND),
            ..req(4, 1)
        },
    );
    must_submit(&mut core, req(5, 1));
    assert_eq!(placed(&must_decide(&mut core, 10 * SECOND)), vec![id(3)]);
    check_waits_for_room(&core, id(2));
    check_reason(&core, id(4), WaitReason::ReservedFor { trial: id(2) });
    check_reason(&core, id(5), WaitReason::ReservedFor { trial: id(2) });
}

#[test]
fn backfill_uses_the_experiment_estimate() {
    let mut core = core_preset("backfill", &[4]);
    // A completed trial of experiment 9 ran 30 s.
    must_submit(
        &mut core,
        TrialRequest {
            id: trial_of(9, 0),
            ..req(0, 1)
        },
    );
    assert_eq!(placed(&must_decide(&mut core, 0)), vec![trial_of(9, 0)]);
    assert!(core.finish(trial_of(9, 0), 30 * SECOND, true));
    assert_eq!(
        core.estimate_ms(ExperimentId { digest: 9, run: 1 }),
        Some(30 * SECOND)
    );

    must_submit(
        &mut core,
        TrialRequest {
            time_limit_ms: Some(100 * SECOND),
            ..req(1, 2)
        },
    );
    assert_eq!(placed(&must_decide(&mut core, 30 * SECOND)), vec![id(1)]);
    must_submit(
        &mut core,
        TrialRequest {
            submitted_at: 31 * SECOND,
            ..req(2, 4)
        },
    );
    must_submit(
        &mut core,
        TrialRequest {
            id: trial_of(9, 1),
            submitted_at: 32 * SECOND,
            ..req(0, 1)
        },
    );
    must_submit(
        &mut core,
        TrialRequest {
            id: trial_of(8, 1),
            submitted_at: 33 * SECOND,
            ..req(0, 1)
        },
    );
    assert_eq!(
        placed(&must_decide(&mut core, 40 * SECOND)),
        vec![trial_of(9, 1)]
    );
    check_reason(
        &core,
        trial_of(8, 1),
        WaitReason::ReservedFor { trial: id(2) },
    );
}

#[test]
fn backfill_waits_when_the_reservation_time_is_unknown() {
    let mut core = core_preset("backfill", &[4]);
    must_submit(&mut core, req(1, 2));
    assert_eq!(placed(&must_decide(&mut core, 0)), vec![id(1)]);
    must_submit(&mut core, req(2, 4));
    must_submit(
        &mut core,
        TrialRequest {
            time_limit_ms: Some(SECOND),
            ..req(3, 1)
        },
    );
    assert!(placed(&must_decide(&mut core, 10 * SECOND)).is_empty());
    check_reason(&core, id(3), WaitReason::ReservedFor { trial: id(2) });
}

const PRIORITY_PREEMPTION: &str =
    "order: priority\npreemption: {grace_period: 30s, min_run_time: 60s}\n";

#[test]
fn preemption_by_priority_with_grace_and_min_run_time() {
    let mut core = core_yaml(PRIORITY_PREEMPTION, &[2]);
    must_submit(&mut core, req(1, 2));
    assert_eq!(placed(&must_decide(&mut core, 0)), vec![id(1)]);
    let high = |index: u32, at: u64| TrialRequest {
        priority: 1000,
        submitted_at: at,
        ..req(index, 2)
    };
    must_submit(&mut core, high(2, 10 * SECOND));
    // The low trial has not run its minimum yet.
    assert!(must_decide(&mut core, 10 * SECOND).is_empty());
    check_waits_for_room(&core, id(2));
    let decisions = must_decide(&mut core, 70 * SECOND);
    assert_eq!(
        preempted(&decisions),
        vec![(
            id(1),
            PreemptReason::HigherPriority {
                by: id(2),
                priority: 1000
            },
            30_000
        )]
    );
    check_reason(&core, id(2), WaitReason::WaitingForPreemption);
    // Nothing new while the victim stops, and it is not asked twice.
    assert!(must_decide(&mut core, 80 * SECOND).is_empty());
    assert!(core.requeue(id(1), 90 * SECOND));
    assert_eq!(placed(&must_decide(&mut core, 90 * SECOND)), vec![id(2)]);
    check_waits_for_room(&core, id(1));
    // The victim restarts, and is safe for its minimum run time again.
    assert!(core.finish(id(2), 100 * SECOND, true));
    assert_eq!(placed(&must_decide(&mut core, 100 * SECOND)), vec![id(1)]);
    must_submit(&mut core, high(3, 110 * SECOND));
    assert!(must_decide(&mut core, 120 * SECOND).is_empty());
    assert_eq!(preempted(&must_decide(&mut core, 161 * SECOND)).len(), 1);
}

#[test]
fn preemption_spares_equal_priority_and_non_preemptible_work() {
    for (victim, preemptor_priority) in [
        (
            TrialRequest {
                preemptible: false,
                ..req(1, 2)
            },
            1000,
        ),
        (req(1, 2), 0),
    ] {
        let mut core = core_yaml(PRIORITY_PREEMPTION, &[2]);
        must_submit(&mut core, victim);
        assert_eq!(placed(&must_decide(&mut core, 0)), vec![id(1)]);
        must_submit(
            &mut core,
            TrialRequest {
                priority: preemptor_priority,
                ..req(2, 2)
            },
        );
        assert!(must_decide(&mut core, HOUR).is_empty());
        check_waits_for_room(&core, id(2));
    }
}

#[test]
fn preemption_picks_few_and_recent_victims() {
    let mut core = core_yaml(PRIORITY_PREEMPTION, &[4]);
    for index in 0..4 {
        must_submit(&mut core, req(index, 1));
        assert_eq!(
            placed(&must_decide(&mut core, u64::from(index) * MINUTE)).len(),
            1
        );
    }
    must_submit(
        &mut core,
        TrialRequest {
            priority: 1000,
            ..req(10, 2)
        },
    );
    let victims: Vec<TrialId> = preempted(&must_decide(&mut core, HOUR))
        .into_iter()
        .map(|(victim, _, _)| victim)
        .collect();
    assert_eq!(victims, vec![id(3), id(2)]);
}

#[test]
fn freed_resources_stay_reserved_for_the_preemptor() {
    let mut core = core_yaml(PRIORITY_PREEMPTION, &[2]);
    must_submit(&mut core, req(1, 2));
    must_decide(&mut core, 0);
    must_submit(
        &mut core,
        TrialRequest {
            priority: 1000,
            ..req(2, 2)
        },
    );
    assert_eq!(preempted(&must_decide(&mut core, HOUR)).len(), 1);
    must_submit(
        &mut core,
        TrialRequest {
            priority: 500,
            submitted_at: HOUR,
            ..req(3, 1)
        },
    );
    assert!(core.requeue(id(1), HOUR + 1));
    assert_eq!(placed(&must_decide(&mut core, HOUR + 1)), vec![id(2)]);
}

#[test]
fn admission_refuses_with_reasons() {
    let mut core = core_yaml(
        "queues: [{name: a, team: a}, {name: shared}]\nadmission: {max_pending_per_team: 2, retry_after: 7s}\n",
        &[1],
    );
    must_submit(&mut core, of_team(req(1, 1), "a"));
    must_submit(&mut core, of_team(req(2, 1), "a"));
    assert_eq!(
        core.submit(of_team(req(3, 1), "a"), 3),
        Err(Refusal::TooManyPending {
            team: "a".to_owned(),
            pending: 2,
            limit: 2,
            retry_after_ms: 7000
        })
    );
    // Another team is not affected, and lands in the open queue.
    must_submit(&mut core, of_team(req(4, 1), "b"));
    assert_eq!(queue_usage(&core, "shared").pending, 1);
    assert_eq!(
        core.submit(
            TrialRequest {
                queue: Some("nope".to_owned()),
                ..of_team(req(5, 1), "b")
            },
            5
        ),
        Err(Refusal::UnknownQueue {
            team: "b".to_owned(),
            queue: "nope".to_owned()
        })
    );
    assert_eq!(
        core.submit(
            TrialRequest {
                queue: Some("a".to_owned()),
                ..of_team(req(5, 1), "b")
            },
            5
        ),
        Err(Refusal::UnknownQueue {
            team: "b".to_owned(),
            queue: "a".to_owned()
        })
    );
    let mut fraction = of_team(req(6, 1), "b");
    fraction.gang.per_worker.gpu_milli = 1500;
    assert!(matches!(core.submit(fraction, 6), Err(Refusal::Invalid(_))));
    let mut empty = of_team(req(7, 1), "b");
    empty.gang.workers = 0;
    assert!(matches!(core.submit(empty, 7), Err(Refusal::Invalid(_))));
    assert_eq!(
        core.submit(of_team(req(4, 1), "b"), 8),
        Err(Refusal::Duplicate(id(4)))
    );
    // A running trial no longer counts as pending.
    must_decide(&mut core, 10);
    let team_only = core_yaml("queues: [{name: a, team: a}]\n", &[1]);
    let mut team_only = team_only;
    assert!(matches!(
        team_only.submit(of_team(req(1, 1), "b"), 1),
        Err(Refusal::UnknownQueue { .. })
    ));
}

#[test]
fn pending_limit_frees_up_when_trials_start() {
    let mut core = core_yaml("admission: {max_pending_per_team: 1}\n", &[1]);
    must_submit(&mut core, req(1, 1));
    assert!(core.submit(req(2, 1), 2).is_err());
    must_decide(&mut core, 3);
    must_submit(&mut core, req(2, 1));
}

#[test]
fn hold_and_release() {
    let mut core = core_preset("fifo", &[1]);
    must_submit(&mut core, req(1, 1));
    must_submit(&mut core, req(2, 1));
    assert!(core.hold(id(1)));
    check_reason(&core, id(1), WaitReason::Held);
    assert_eq!(placed(&must_decide(&mut core, 10)), vec![id(2)]);
    assert!(!core.hold(id(2)), "a running trial is not held");
    assert!(core.release_hold(id(1)));
    assert!(!core.release_hold(id(1)));
    check_reason(&core, id(1), WaitReason::NotYetConsidered);
    core.finish(id(2), 20, true);
    assert_eq!(placed(&must_decide(&mut core, 20)), vec![id(1)]);
    assert!(!core.hold(id(99)));
}

#[test]
fn set_priority_reorders() {
    let mut core = core_preset("priority", &[1]);
    must_submit(&mut core, req(1, 1));
    must_submit(&mut core, req(2, 1));
    assert!(core.set_priority(id(2), 1000));
    assert!(!core.set_priority(id(99), 1000));
    assert_eq!(placed(&must_decide(&mut core, 10)), vec![id(2)]);
    assert!(
        core.set_priority(id(2), -5),
        "running trials change priority too"
    );
    core.check_invariants().unwrap();
}

#[test]
fn move_to_queue() {
    let mut core = core_yaml(
        "queues: [{name: a, team: x, quota: {gpu: 0}}, {name: b, team: x}, {name: c, team: y}]\n",
        &[2],
    );
    must_submit(&mut core, of_team(req(1, 1), "x"));
    must_decide(&mut core, 10);
    check_reason(
        &core,
        id(1),
        WaitReason::OverQuota {
            resource: "gpu".to_owned(),
        },
    );
    assert!(matches!(
        core.move_to_queue(id(1), "c"),
        Err(Refusal::UnknownQueue { .. })
    ));
    assert!(matches!(
        core.move_to_queue(id(1), "zz"),
        Err(Refusal::UnknownQueue { .. })
    ));
    core.move_to_queue(id(1), "b").unwrap();
    assert_eq!(queue_usage(&core, "b").pending, 1);
    assert_eq!(placed(&must_decide(&mut core, 20)), vec![id(1)]);
    assert!(matches!(
        core.move_to_queue(id(1), "a"),
        Err(Refusal::Invalid(_))
    ));
    assert!(matches!(
        core.move_to_queue(id(99), "a"),
        Err(Refusal::Invalid(_))
    ));
}

#[test]
fn wait_reasons_before_and_for_impossible_gangs() {
    let mut core = core_preset("default", &[4]);
    let mut picky = req(1, 1);
    picky.gang.gpu_models = vec!["H100".to_owned()];
    must_submit(&mut core, picky);
    must_submit(&mut core, req(2, 8));
    must_submit(&mut core, req(3, 1));
    check_reason(&core, id(1), WaitReason::NotYetConsidered);
    assert_eq!(core.wait_reason(id(99)), None);
    assert_eq!(placed(&must_decide(&mut core, 10)), vec![id(3)]);
    check_reason(&core, id(1), WaitReason::NoMatchingNodes);
    check_reason(&core, id(2), WaitReason::NoMatchingNodes);
    assert_eq!(core.wait_reason(id(3)), None);
    // A second node makes the 8-GPU gang possible, as two workers... not as one.
    core.upsert_node(node(2, 4));
    let mut pair = req(4, 4);
    pair.gang.workers = 2;
    must_submit(&mut core, pair);
    must_decide(&mut core, 20);
    check_reason(&core, id(2), WaitReason::NoMatchingNodes);
    check_waits_for_room(&core, id(4));
    // The reasons name the numbers.
    let gang = core.wait_reason(id(4)).expect("a reason").to_string();
    assert!(
        gang.starts_with(
            "waiting for room: its gang of 2 workers needs 4 GPUs, 1 CPU, 1.0 GiB each"
        ),
        "{gang}"
    );
    assert!(gang.contains("; free now: 7 GPUs, "), "{gang}");
}

#[test]
fn one_busy_worker_and_an_empty_cluster_are_told_apart_from_a_gang() {
    let mut core = core_preset("default", &[]);
    must_submit(&mut core, req(1, 1));
    must_decide(&mut core, 10);
    check_reason(&core, id(1), WaitReason::NoNodes);
    assert!(
        core.wait_reason(id(1))
            .expect("a reason")
            .to_string()
            .contains("xp-node join")
    );
    core.upsert_node(node(1, 1));
    must_submit(&mut core, req(2, 1));
    assert_eq!(placed(&must_decide(&mut core, 20)), vec![id(1)]);
    let busy = core.wait_reason(id(2)).expect("a reason").to_string();
    assert!(
        busy.starts_with("waiting for room: it needs 1 GPU, 1 CPU, 1.0 GiB; free now: "),
        "{busy}"
    );
    assert!(!busy.contains("gang"), "{busy}");
}

#[test]
fn gangs_are_placed_whole_and_fractions_share_a_gpu() {
    let mut core = core_preset("fair", &[4, 4]);
    let mut gang = req(1, 4);
    gang.gang.workers = 2;
    must_submit(&mut core, gang);
    let decisions = must_decide(&mut core, 10);
    let Decision::Place { workers, .. } = &decisions[0] else {
        panic!("{decisions:?}")
    };
    assert_eq!(workers.len(), 2);
    assert_ne!(workers[0].node, workers[1].node);
    core.finish(id(1), 20, true);
    for index in 2..4 {
        let mut half = req(index, 0);
        half.gang.per_worker.gpu_milli = 500;
        must_submit(&mut core, half);
    }
    assert_eq!(placed(&must_decide(&mut core, 30)).len(), 2);
    assert_eq!(core.pool().free().gpu_milli, 7000);
}

#[test]
fn set_config_moves_trials_of_removed_queues() {
    let mut core = core_yaml("queues: [{name: a, team: a}, {name: default}]\n", &[1]);
    must_submit(
        &mut core,
        TrialRequest {
            queue: Some("a".to_owned()),
            ..of_team(req(1, 1), "a")
        },
    );
    must_submit(&mut core, of_team(req(2, 1), "a"));
    must_decide(&mut core, 10);
    let old = core.config().clone();
    let lonely = PolicyConfig::from_yaml("queues: [{name: z, team: z}]\n").unwrap();
    assert_eq!(
        core.set_config(lonely, 20),
        Err(PolicyError::NoQueueForTeam {
            team: "a".to_owned(),
            queue: "a".to_owned()
        })
    );
    assert_eq!(core.config(), &old);
    let merged = PolicyConfig::from_yaml("queues: [{name: default}]\n").unwrap();
    core.set_config(merged, 20).unwrap();
    core.check_invariants().unwrap();
    let default = queue_usage(&core, "default");
    assert_eq!((default.running, default.pending), (1, 1));
    core.finish(id(1), 30, true);
    assert_eq!(placed(&must_decide(&mut core, 30)), vec![id(2)]);
}

#[test]
fn set_config_with_smaller_quota_lets_work_drain() {
    let mut core = core_yaml("queues: [{name: a, team: a}]\n", &[4]);
    for index in 0..4 {
        must_submit(&mut core, of_team(req(index, 1), "a"));
    }
    assert_eq!(placed(&must_decide(&mut core, 10)).len(), 4);
    core.set_config(
        PolicyConfig::from_yaml("queues: [{name: a, team: a, quota: {gpu: 2}}]\n").unwrap(),
        20,
    )
    .unwrap();
    core.check_invariants().unwrap();
    must_submit(&mut core, of_team(req(9, 1), "a"));
    for index in 0..3 {
        core.finish(id(index), 30, true);
    }
    // Usage is 1 of 2: one more may start.
    assert_eq!(placed(&must_decide(&mut core, 30)), vec![id(9)]);
}

#[test]
fn removed_nodes_report_their_trials() {
    let mut core = core_preset("fair", &[2, 2]);
    let mut gang = req(1, 2);
    gang.gang.workers = 2;
    must_submit(&mut core, gang);
    must_submit(&mut core, req(2, 1));
    must_decide(&mut core, 10);
    let nodes: Vec<NodeId> = core
        .placement(id(1))
        .unwrap()
        .iter()
        .map(|worker| worker.node)
        .collect();
    let lost = core.remove_node(nodes[0]);
    assert!(lost.contains(&id(1)));
    core.check_invariants().unwrap();
    // The node comes back empty before the caller has requeued the trial.
    core.upsert_node(NodeSpec {
        id: nodes[0],
        ..node(0, 2)
    });
    core.check_invariants().unwrap();
    for trial in lost {
        assert!(core.requeue(trial, 20));
    }
    core.check_invariants().unwrap();
    assert_eq!(
        core.pool().free().gpu_milli + core.queues()[0].usage.gpu_milli,
        4000
    );
}

#[test]
fn default_preset_queue_report() {
    let mut core = core_preset("default", &[8]);
    must_submit(&mut core, req(1, 2));
    must_decide(&mut core, 10);
    let queues = core.queues();
    assert_eq!(queues.len(), 1);
    assert_eq!(queues[0].name, "default");
    assert_eq!(queues[0].team, "*");
    assert_eq!(queues[0].quota.gpu_milli, u64::MAX);
    assert!((queues[0].dominant_share - 0.25).abs() < 1e-9);
}

// Property tests.

#[derive(Debug, Clone)]
enum Event {
    Submit(Submission),
    Decide,
    Finish {
        pick: usize,
        completed: bool,
    },
    RequeuePreempted,
    Requeue {
        pick: usize,
    },
    AddNode {
        gpus: u32,
        rack: u8,
    },
    RemoveNode {
        pick: usize,
    },
    SetSchedulable {
        pick: usize,
        schedulable: bool,
    },
    Advance {
        ms: u64,
    },
    Hold {
        pick: usize,
    },
    ReleaseHold {
        pick: usize,
    },
    SetPriority {
        pick: usize,
        priority: i64,
    },
    SetUrgency {
        pick: usize,
        urgency: u32,
    },
    /// A trial asking for units of a lease.
    SubmitLeased(LeasedSubmission),
    /// An admin's verdict on a pending approval request.
    Verdict {
        pick: usize,
        approve: bool,
    },
    /// An elastic trial.
    SubmitElastic(ElasticSubmission),
    /// Every resize in flight is reported done.
    FinishResizes,
    /// A placed trial reports a checkpoint now.
    Checkpoint {
        pick: usize,
    },
}

/// A trial of a random shape.
#[derive(Debug, Clone)]
struct Submission {
    team: usize,
    queue: Option<usize>,
    gpu_milli: u64,
    workers: u32,
    cpu_milli: u64,
    priority: i64,
    preemptible: bool,
    time_limit_ms: Option<u64>,
    experiment: u64,
    rack: Option<u8>,
    urgency: u32,
}

/// A trial asking for `units` of lease `l{lease}`.
#[derive(Debug, Clone)]
struct LeasedSubmission {
    team: usize,
    gpu_milli: u64,
    lease: usize,
    units: u64,
    priority: i64,
    preemptible: bool,
}

/// An elastic trial of `min..=min + extra` workers.
#[derive(Debug, Clone)]
struct ElasticSubmission {
    team: usize,
    gpu_milli: u64,
    min: u32,
    extra: u32,
    priority: i64,
    preemptible: bool,
}

const TEAMS: [&str; 3] = ["t0", "t1", "t2"];

fn limits(gpu: Option<u64>) -> ResourceLimits {
    ResourceLimits {
        gpu_milli: gpu,
        ..ResourceLimits::default()
    }
}

fn queue_strategy(index: usize) -> impl PropStrategy<Value = QueueConfig> {
    (
        prop::option::of(0..TEAMS.len()),
        prop::bool::weighted(0.7),
        1..4_u32,
        prop::option::weighted(0.8, 0..12_u64),
        prop::option::of(0..8_u64),
        prop::option::of(0..12_u64),
        prop::option::weighted(0.3, 0..3_u64),
        prop::bool::weighted(0.3),
    )
        .prop_map(
            move |(team, in_cohort, weight, quota, borrowing, lending, lease_quota, manual)| {
                let quota = quota.map(|gpus| gpus * GPU_MILLI);
                let cohort = in_cohort.then(|| "c".to_owned());
                let borrowing = borrowing.filter(|_| in_cohort && quota.is_some());
                let lending = lending
                    .filter(|_| in_cohort)
                    .and_then(|gpus| Some((gpus * GPU_MILLI).min(quota?)));
                QueueConfig {
                    name: format!("q{index}"),
                    team: team.map(|team| TEAMS[team].to_owned()),
                    cohort,
                    weight: f64::from(weight),
                    quota: ResourceLimits {
                        leases: lease_quota
                            .map(|units| BTreeMap::from([("l1".to_owned(), units)]))
                            .unwrap_or_default(),
                        ..limits(quota)
                    },
                    borrowing_limit: limits(borrowing.map(|gpus| gpus * GPU_MILLI)),
                    lending_limit: limits(lending),
                    preemption: QueuePreemption {
                        approval: if manual {
                            Approval::Manual
                        } else {
                            Approval::Automatic
                        },
                    },
                }
            },
        )
}

/// The leases of the random policies: a mutex and a lease of three units.
fn random_leases() -> BTreeMap<String, u64> {
    BTreeMap::from([("l0".to_owned(), 1), ("l1".to_owned(), 3)])
}

fn config_strategy(with_quotas: bool) -> impl PropStrategy<Value = PolicyConfig> {
    let queues = (1..4_usize).prop_flat_map(move |count| {
        (0..count)
            .map(queue_strategy)
            .collect::<Vec<_>>()
            .prop_map(move |mut queues| {
                if !with_quotas {
                    for queue in &mut queues {
                        queue.quota = ResourceLimits::default();
                        queue.borrowing_limit = ResourceLimits::default();
                        queue.lending_limit = ResourceLimits::default();
                    }
                }
                // Every team has somewhere to go.
                queues.push(QueueConfig::open("default"));
                queues
            })
    });
    (
        queues,
        prop_oneof![Just(Order::Fifo), Just(Order::Priority), Just(Order::Fair)],
        any::<bool>(),
        prop_oneof![Just(HeadOfLine::Strict), Just(HeadOfLine::Skip)],
        any::<bool>(),
        0..20_u64,
        0..30_u64,
        prop::option::of((1..2000_u64, 0..5000_u64)),
        prop_oneof![
            Just(PlacementKind::BinPack),
            Just(PlacementKind::Spread),
            Just(PlacementKind::Random),
            Just(PlacementKind::FragmentationAware),
            Just(PlacementKind::Fgd)
        ],
        prop::option::of(las_strategy()),
        prop::option::of(0..600_u64),
    )
        .prop_map(
            |(
                queues,
                order,
                backfill,
                head_of_line,
                preempt,
                min_run_s,
                grace_s,
                aging,
                placement,
                attained_service,
                max_loss_s,
            )| {
                PolicyConfig {
                    queues,
                    aging: aging.map(|(rate_per_hour, cap)| AgingConfig { rate_per_hour, cap }),
                    attained_service,
                    preemption: PreemptionConfig {
                        enabled: preempt,
                        grace_period_ms: grace_s * SECOND,
                        min_run_time_ms: min_run_s * SECOND,
                        max_loss_ms: max_loss_s.map(|seconds| seconds * SECOND),
                    },
                    placement,
                    order,
                    backfill,
                    head_of_line,
                    leases: random_leases(),
                    ..PolicyConfig::base()
                }
            },
        )
}

/// Attained-service settings on the property tests' time scale (events
/// advance the clock by up to 10 minutes): edges of a few GPU-minutes, so
/// trials change level within a sequence.
fn las_strategy() -> impl PropStrategy<Value = AttainedServiceConfig> {
    (
        prop::collection::vec(1..30_u64, 0..4),
        0..5_u32,
        0..3600_u64,
        any::<bool>(),
    )
        .prop_map(|(steps, promote_after, reserve_after_s, adaptive)| {
            let mut edge = 0;
            let thresholds_gpu_hours = steps
                .into_iter()
                .map(|step| {
                    edge += step;
                    edge as f64 / 60.0 / 10.0
                })
                .collect();
            AttainedServiceConfig {
                thresholds_gpu_hours,
                promote_after,
                reserve_after_ms: reserve_after_s * SECOND,
                delay_per_gpu_ms: (reserve_after_s % 3) * 20 * MINUTE,
                levels: if adaptive {
                    LevelSource::Adaptive
                } else {
                    LevelSource::Fixed
                },
                quantiles: None,
                retired_smallest_first: None,
            }
        })
}

/// One cohort of team queues with small finite quotas and preemption on: the
/// setting where borrowing and reclaim happen most.
fn cohort_config_strategy() -> impl PropStrategy<Value = PolicyConfig> {
    (
        config_strategy(true),
        prop::collection::vec((0..6_u64, prop::option::of(0..6_u64)), 3),
    )
        .prop_map(|(base, quotas)| {
            let queues = quotas
                .into_iter()
                .enumerate()
                .map(|(index, (quota, lending))| QueueConfig {
                    name: format!("q{index}"),
                    team: Some(TEAMS[index].to_owned()),
                    cohort: Some("c".to_owned()),
                    weight: 1.0,
                    quota: limits(Some(quota * GPU_MILLI)),
                    borrowing_limit: ResourceLimits::default(),
                    lending_limit: limits(lending.map(|gpus| gpus.min(quota) * GPU_MILLI)),
                    preemption: QueuePreemption::default(),
                })
                .collect();
            PolicyConfig {
                queues,
                preemption: PreemptionConfig {
                    enabled: true,
                    ..base.preemption
                },
                ..base
            }
        })
}

fn event_strategy() -> impl PropStrategy<Value = Event> {
    let submit = (
        (0..TEAMS.len(), prop::option::of(0..4_usize)),
        prop_oneof![
            Just(0_u64),
            Just(250),
            Just(500),
            Just(1000),
            Just(2000),
            Just(4000)
        ],
        1..4_u32,
        1000..8000_u64,
        prop_oneof![Just(0_i64), Just(100), Just(1000)],
        prop::bool::weighted(0.8),
        prop::option::of(1..3600_u64),
        0..3_u64,
        prop::option::weighted(0.1, 0..2_u8),
        prop_oneof![3 => Just(0_u32), 1 => 1..3_u32],
    )
        .prop_map(
            |(
                (team, queue),
                gpu_milli,
                workers,
                cpu_milli,
                priority,
                preemptible,
                limit_s,
                experiment,
                rack,
                urgency,
            )| {
                Event::Submit(Submission {
                    team,
                    queue,
                    gpu_milli,
                    workers,
                    cpu_milli,
                    priority,
                    preemptible,
                    time_limit_ms: limit_s.map(|seconds| seconds * SECOND),
                    experiment,
                    rack,
                    urgency,
                })
            },
        );
    prop_oneof![
        6 => submit,
        5 => Just(Event::Decide),
        3 => (any::<usize>(), any::<bool>()).prop_map(|(pick, completed)| Event::Finish { pick, completed }),
        3 => Just(Event::RequeuePreempted),
        1 => any::<usize>().prop_map(|pick| Event::Requeue { pick }),
        1 => (prop_oneof![Just(0_u32), Just(1), Just(2), Just(4), Just(8)], 0..2_u8)
            .prop_map(|(gpus, rack)| Event::AddNode { gpus, rack }),
        1 => any::<usize>().prop_map(|pick| Event::RemoveNode { pick }),
        1 => (any::<usize>(), any::<bool>()).prop_map(|(pick, schedulable)| Event::SetSchedulable { pick, schedulable }),
        3 => (1..600_u64).prop_map(|seconds| Event::Advance { ms: seconds * SECOND }),
        1 => any::<usize>().prop_map(|pick| Event::Hold { pick }),
        1 => any::<usize>().prop_map(|pick| Event::ReleaseHold { pick }),
        1 => (any::<usize>(), prop_oneof![Just(0_i64), Just(100), Just(1000)])
            .prop_map(|(pick, priority)| Event::SetPriority { pick, priority }),
        1 => (any::<usize>(), 0..3_u32).prop_map(|(pick, urgency)| Event::SetUrgency { pick, urgency }),
        3 => (0..TEAMS.len(), prop_oneof![Just(0_u64), Just(500), Just(1000)], 0..2_usize, 1..4_u64,
              prop_oneof![Just(0_i64), Just(100), Just(1000)], prop::bool::weighted(0.8))
            .prop_map(|(team, gpu_milli, lease, units, priority, preemptible)| Event::SubmitLeased(LeasedSubmission {
                team, gpu_milli, lease, units, priority, preemptible,
            })),
        2 => (any::<usize>(), any::<bool>()).prop_map(|(pick, approve)| Event::Verdict { pick, approve }),
        3 => (0..TEAMS.len(), prop_oneof![Just(500_u64), Just(1000), Just(2000)], 1..3_u32, 1..4_u32,
              prop_oneof![Just(0_i64), Just(100), Just(1000)], prop::bool::weighted(0.8))
            .prop_map(|(team, gpu_milli, min, extra, priority, preemptible)| Event::SubmitElastic(ElasticSubmission {
                team, gpu_milli, min, extra, priority, preemptible,
            })),
        2 => Just(Event::FinishResizes),
        2 => any::<usize>().prop_map(|pick| Event::Checkpoint { pick }),
    ]
}

/// Events that fragment small nodes: one- and two-GPU workers arriving,
/// finishing and being decided on, so that gangs often find no room where
/// the free room of all nodes together would hold them.
fn fragmenting_event_strategy() -> impl PropStrategy<Value = Event> {
    let submit = (
        0..TEAMS.len(),
        prop_oneof![Just(1000_u64), Just(2000)],
        1..3_u32,
    )
        .prop_map(|(team, gpu_milli, workers)| {
            Event::Submit(Submission {
                team,
                queue: None,
                gpu_milli,
                workers,
                cpu_milli: 1000,
                priority: 0,
                preemptible: true,
                time_limit_ms: None,
                experiment: 0,
                rack: None,
                urgency: 0,
            })
        });
    prop_oneof![
        4 => submit,
        3 => Just(Event::Decide),
        2 => (0..64_usize).prop_map(|pick| Event::Finish { pick, completed: true }),
        1 => (1..600_000_u64).prop_map(|ms| Event::Advance { ms }),
    ]
}

fn nodes_strategy() -> impl PropStrategy<Value = Vec<(u32, u8)>> {
    prop::collection::vec(
        (prop_oneof![Just(1_u32), Just(2), Just(4), Just(8)], 0..2_u8),
        1..5,
    )
}

fn rack_node(n: u128, gpus: u32, rack: u8) -> NodeSpec {
    NodeSpec {
        cpu_milli: 16_000,
        memory_bytes: 64 * GIB,
        labels: BTreeMap::from([("rack".to_owned(), format!("r{rack}"))]),
        ..node(n, gpus)
    }
}

/// Checks every decision of one pass against the state before it.
fn check_decisions(
    core: &PolicyCore,
    now: UnixMillis,
    decisions: &[Decision],
    waiting_before: &HashSet<TrialId>,
    placed_before: &HashMap<TrialId, (i64, bool, usize)>,
    borrowing_before: &[bool],
) -> Result<(), String> {
    for decision in decisions {
        match decision {
            Decision::Place { trial, workers } => {
                check_place(core, trial, workers, waiting_before)?;
            }
            Decision::Preempt { trial, reason, .. } => {
                let Some(&victim) = placed_before.get(trial) else {
                    return Err(format!("{trial} preempted but was not running"));
                };
                check_preempt(core, now, trial, victim, reason, borrowing_before)?;
            }
            Decision::Resize {
                trial,
                from,
                workers,
                reason,
                ..
            } => {
                let Some(&(victim_priority, preemptible, _)) = placed_before.get(trial) else {
                    return Err(format!("{trial} resized but was not running"));
                };
                let size = workers.len() as u32;
                check_resize(
                    core,
                    trial,
                    (*from, size),
                    reason,
                    (victim_priority, preemptible),
                )?;
            }
        }
    }
    Ok(())
}

/// A placed trial was waiting and got its whole gang.
fn check_place(
    core: &PolicyCore,
    trial: &TrialId,
    workers: &[WorkerPlacement],
    waiting_before: &HashSet<TrialId>,
) -> Result<(), String> {
    let entry = &core.trials[trial];
    if workers.len() != entry.request.gang.workers as usize {
        return Err(format!("{trial} placed with {} workers", workers.len()));
    }
    if !waiting_before.contains(trial) {
        return Err(format!("{trial} placed but was not waiting"));
    }
    Ok(())
}

/// A preempted trial was preemptible and its reason holds; `victim` is its
/// (priority, preemptible, queue) before the pass.
fn check_preempt(
    core: &PolicyCore,
    now: UnixMillis,
    trial: &TrialId,
    victim: (i64, bool, usize),
    reason: &PreemptReason,
    borrowing_before: &[bool],
) -> Result<(), String> {
    let (victim_priority, preemptible, victim_queue) = victim;
    if !preemptible {
        return Err(format!("{trial} is not preemptible"));
    }
    match reason {
        PreemptReason::HigherPriority { by, priority } => {
            if core.trials[by].request.priority != *priority || victim_priority >= *priority {
                return Err(format!(
                    "{trial} ({victim_priority}) preempted by {by} ({priority})"
                ));
            }
        }
        PreemptReason::LessService {
            by,
            level,
            victim_level,
        } => check_less_service(core, now, trial, victim, (by, *level, *victim_level))?,
        PreemptReason::Reclaim { queue, by } => {
            if !borrowing_before[victim_queue] {
                return Err(format!("{trial} reclaimed but its queue was not borrowing"));
            }
            if core.queue_info[core.trials[by].queue].name != *queue {
                return Err(format!("reclaim names queue {queue}"));
            }
        }
    }
    Ok(())
}

/// A preemption for less service: the policy measures service, the claimant
/// shares the victim's queue and priority at a lower level, and the victim
/// loses no more than `max_loss`. `claim` is (claimant, its level, the
/// victim's level).
fn check_less_service(
    core: &PolicyCore,
    now: UnixMillis,
    trial: &TrialId,
    victim: (i64, bool, usize),
    claim: (&TrialId, u8, u8),
) -> Result<(), String> {
    let (victim_priority, _, victim_queue) = victim;
    let (by, level, victim_level) = claim;
    let claimant = &core.trials[by];
    let service = core.attained_service(*trial, now).unwrap();
    let loss = match &core.trials[trial].standing {
        Standing::Placed(placed) => placed.loss_ms(now),
        _ => return Err(format!("{trial} preempted but not placed")),
    };
    if core.config.attained_service.is_none()
        || core.config.order == Order::Fifo
        || claimant.queue != victim_queue
        || claimant.request.priority != victim_priority
        || claimant.level != level
        || service.level != victim_level
        || victim_level <= level
        || core
            .config
            .preemption
            .max_loss_ms
            .is_some_and(|limit| loss > limit)
    {
        return Err(format!(
            "{trial} (level {victim_level}, loses {loss} ms) preempted for service by {by} (level {level})"
        ));
    }
    Ok(())
}

/// A resize stays within the elastic range and moves the gang's size the way
/// its reason says; `sizes` is (from, to), `victim` (priority, preemptible).
fn check_resize(
    core: &PolicyCore,
    trial: &TrialId,
    sizes: (u32, u32),
    reason: &ResizeReason,
    victim: (i64, bool),
) -> Result<(), String> {
    let (from, size) = sizes;
    let (victim_priority, preemptible) = victim;
    let Some((min, max)) = core.elastic_range(*trial) else {
        return Err(format!("{trial} resized but is not elastic"));
    };
    if size < min || size > max || size == from {
        return Err(format!(
            "{trial} resized {from} -> {size} outside {min}..={max}"
        ));
    }
    match reason {
        ResizeReason::Grow => {
            if size < from {
                return Err(format!("{trial} shrank to grow"));
            }
            if core.waiting_trials().next().is_some() {
                return Err(format!("{trial} grew while trials wait"));
            }
        }
        ResizeReason::Shrink { by } => {
            if size > from || !preemptible {
                return Err(format!("{trial} shrunk {from} -> {size} for {by}"));
            }
            if core.trials[by].request.priority <= victim_priority {
                return Err(format!("{trial} ({victim_priority}) shrunk for {by}"));
            }
        }
    }
    Ok(())
}

/// A core driven by a random event sequence, with what the sequence has built
/// so far.
struct Replay {
    core: PolicyCore,
    node_ids: Vec<NodeId>,
    next_node: u128,
    submitted: Vec<TrialId>,
    now: UnixMillis,
    /// (victim, claimant) pairs an admin approved.
    approved: HashSet<(TrialId, TrialId)>,
    /// Each submitted trial's GPU share as asked and whether it oversubscribes.
    asked_shares: HashMap<TrialId, (u64, bool)>,
}

impl Replay {
    fn new(config: PolicyConfig, nodes: Vec<(u32, u8)>) -> Self {
        let mut replay = Self {
            core: PolicyCore::new(config),
            node_ids: Vec::new(),
            next_node: 1,
            submitted: Vec::new(),
            now: 0,
            approved: HashSet::new(),
            asked_shares: HashMap::new(),
        };
        for (gpus, rack) in nodes {
            replay.add_node(gpus, rack);
        }
        replay
    }

    fn add_node(&mut self, gpus: u32, rack: u8) {
        self.core.upsert_node(rack_node(self.next_node, gpus, rack));
        self.node_ids.push(node_id(self.next_node));
        self.next_node += 1;
    }

    /// The submitted trial `pick` names, if any was submitted.
    fn pick(&self, pick: usize) -> Option<TrialId> {
        (!self.submitted.is_empty()).then(|| self.submitted[pick % self.submitted.len()])
    }

    /// Applies one event; an error describes a broken rule of the pass.
    fn apply(&mut self, event: Event) -> Result<(), String> {
        let now = self.now;
        match event {
            Event::Submit(submission) => self.submit(submission),
            Event::Decide => self.decide_and_check()?,
            Event::Finish { pick, completed } => {
                self.on_pick(pick, |core, trial| core.finish(trial, now, completed));
            }
            Event::RequeuePreempted => self.requeue_preempted(),
            Event::Requeue { pick } => self.on_pick(pick, |core, trial| core.requeue(trial, now)),
            Event::AddNode { gpus, rack } => self.add_node(gpus, rack),
            Event::RemoveNode { pick } => self.remove_node(pick),
            Event::SetSchedulable { pick, schedulable } => {
                self.set_schedulable(pick, schedulable);
            }
            Event::Advance { ms } => self.now += ms,
            Event::Hold { pick } => self.on_pick(pick, |core, trial| core.hold(trial)),
            Event::ReleaseHold { pick } => {
                self.on_pick(pick, |core, trial| core.release_hold(trial));
            }
            Event::SetPriority { pick, priority } => {
                self.on_pick(pick, |core, trial| core.set_priority(trial, priority));
            }
            Event::SetUrgency { pick, urgency } => {
                self.on_pick(pick, |core, trial| core.set_urgency(trial, urgency));
            }
            Event::SubmitLeased(submission) => self.submit_leased(submission)?,
            Event::SubmitElastic(submission) => self.submit_elastic(submission)?,
            Event::Checkpoint { pick } => self.check_checkpoint(pick)?,
            Event::FinishResizes => self.finish_resizes()?,
            Event::Verdict { pick, approve } => self.verdict(pick, approve)?,
        }
        Ok(())
    }

    /// Does `action` to the submitted trial `pick` names, if any was submitted.
    fn on_pick<T>(&mut self, pick: usize, action: impl FnOnce(&mut PolicyCore, TrialId) -> T) {
        if let Some(trial) = self.pick(pick) {
            action(&mut self.core, trial);
        }
    }

    fn submit(&mut self, submission: Submission) {
        let Submission {
            team,
            queue,
            gpu_milli,
            workers,
            cpu_milli,
            priority,
            preemptible,
            time_limit_ms,
            experiment,
            rack,
            urgency,
        } = submission;
        let now = self.now;
        let trial = trial_of(experiment, self.submitted.len() as u32);
        let mut request = TrialRequest {
            id: trial,
            team: TEAMS[team].to_owned(),
            queue: queue.map(|queue| format!("q{queue}")),
            priority,
            preemptible,
            time_limit_ms,
            submitted_at: now,
            urgency,
            ..req(0, 0)
        };
        request.gang.workers = workers;
        request.gang.per_worker = Amount {
            gpu_milli,
            cpu_milli,
            memory_bytes: GIB,
        };
        if let Some(rack) = rack {
            request
                .gang
                .node_labels
                .insert("rack".to_owned(), format!("r{rack}"));
        }
        // Half the trials opt in to oversubscription (only fractions
        // are charged less; whole GPUs opting in must change nothing).
        request.gang.oversubscribe = cpu_milli % 2 == 0;
        self.asked_shares
            .insert(trial, (gpu_milli, request.gang.oversubscribe));
        if self.core.submit(request, now).is_ok() {
            self.submitted.push(trial);
        }
    }

    /// Requeues every trial that is being preempted.
    fn requeue_preempted(&mut self) {
        let stopping: Vec<TrialId> = self
            .submitted
            .iter()
            .copied()
            .filter(|trial| self.core.is_preempting(*trial))
            .collect();
        for trial in stopping {
            self.core.requeue(trial, self.now);
        }
    }

    /// Removes the node `pick` names, requeueing what ran there.
    fn remove_node(&mut self, pick: usize) {
        if !self.node_ids.is_empty() {
            let node = self.node_ids.remove(pick % self.node_ids.len());
            for trial in self.core.remove_node(node) {
                self.core.requeue(trial, self.now);
            }
        }
    }

    fn set_schedulable(&mut self, pick: usize, schedulable: bool) {
        if !self.node_ids.is_empty() {
            let node = self.node_ids[pick % self.node_ids.len()];
            self.core.set_node_schedulable(node, schedulable);
        }
    }

    /// Submits a leased trial, which only a lease it cannot fit, a full team or
    /// an unknown queue may refuse.
    fn submit_leased(&mut self, submission: LeasedSubmission) -> Result<(), String> {
        let LeasedSubmission {
            team,
            gpu_milli,
            lease,
            units,
            priority,
            preemptible,
        } = submission;
        let now = self.now;
        let trial = trial_of(9, self.submitted.len() as u32);
        let mut request = TrialRequest {
            id: trial,
            team: TEAMS[team].to_owned(),
            priority,
            preemptible,
            submitted_at: now,
            ..req(0, 0)
        };
        request.gang.per_worker.gpu_milli = gpu_milli;
        request.gang.leases = BTreeMap::from([(format!("l{lease}"), units)]);
        let fits_lease = units <= random_leases()[&format!("l{lease}")];
        match self.core.submit(request, now) {
            Ok(()) => self.submitted.push(trial),
            Err(Refusal::Lease { .. }) if !fits_lease => {}
            Err(Refusal::TooManyPending { .. } | Refusal::UnknownQueue { .. }) => {}
            Err(refusal) => return Err(format!("leased trial refused: {refusal}")),
        }
        Ok(())
    }

    /// Submits an elastic trial, which must then take its range.
    fn submit_elastic(&mut self, submission: ElasticSubmission) -> Result<(), String> {
        let ElasticSubmission {
            team,
            gpu_milli,
            min,
            extra,
            priority,
            preemptible,
        } = submission;
        let now = self.now;
        let trial = trial_of(11, self.submitted.len() as u32);
        let mut request = TrialRequest {
            id: trial,
            team: TEAMS[team].to_owned(),
            priority,
            preemptible,
            submitted_at: now,
            ..req(0, 0)
        };
        request.gang.workers = min + extra;
        request.gang.per_worker.gpu_milli = gpu_milli;
        if self.core.submit(request, now).is_ok() {
            if !self.core.set_elastic(trial, min, min + extra, now) {
                return Err(format!("{trial} could not be made elastic"));
            }
            self.submitted.push(trial);
        }
        Ok(())
    }

    /// A checkpoint of the trial `pick` names counts exactly when it is placed.
    fn check_checkpoint(&mut self, pick: usize) -> Result<(), String> {
        if let Some(trial) = self.pick(pick) {
            let placed = self.core.placement(trial).is_some();
            if self.core.note_checkpoint(trial, self.now) != placed {
                return Err(format!("{trial}'s checkpoint taken as placed: {}", !placed));
            }
        }
        Ok(())
    }

    /// Reports every resize in flight done; each trial then holds the gang it
    /// was resized to (unless it is being preempted meanwhile).
    fn finish_resizes(&mut self) -> Result<(), String> {
        let resizing: Vec<TrialId> = self
            .submitted
            .iter()
            .copied()
            .filter(|trial| self.core.resizing(*trial).is_some())
            .collect();
        for trial in resizing {
            let target = self.core.resizing(trial).map(<[_]>::to_vec);
            let done = self.core.resized(trial, self.now);
            if !self.core.is_preempting(trial) && done != target {
                return Err(format!("{trial} resized to {done:?}, not {target:?}"));
            }
            if let Some(workers) = done
                && self.core.placement(trial) != Some(&workers[..])
            {
                return Err(format!("{trial} does not hold its new gang"));
            }
        }
        Ok(())
    }

    /// An admin's verdict on the pending approval request `pick` names.
    fn verdict(&mut self, pick: usize, approve: bool) -> Result<(), String> {
        let pending = self.core.approval_requests();
        if !pending.is_empty() {
            let request = &pending[pick % pending.len()];
            let verdict = if approve {
                ApprovalVerdict::Approve
            } else {
                ApprovalVerdict::Deny
            };
            self.core
                .decide_approval(request.id, verdict)
                .map_err(|error| error.to_string())?;
            if approve {
                self.approved.insert((request.victim, request.claimant));
            }
        }
        Ok(())
    }

    /// One pass, its decisions checked against the state before it, and every
    /// trial still waiting given a reason.
    fn decide_and_check(&mut self) -> Result<(), String> {
        let core = &mut self.core;
        let waiting_before: HashSet<TrialId> = core.waiting_trials().collect();
        let placed_before: HashMap<TrialId, (i64, bool, usize)> = core
            .trials
            .iter()
            .filter(|(_, trial)| matches!(trial.standing, Standing::Placed(_)))
            .map(|(id, trial)| {
                (
                    *id,
                    (
                        trial.request.priority,
                        trial.request.preemptible,
                        trial.queue,
                    ),
                )
            })
            .collect();
        let borrowing_before: Vec<bool> = core
            .queues()
            .iter()
            .map(|queue| queue.borrowed != Amount::default())
            .collect();
        let decisions = core.decide(self.now);
        for (victim, reason, _) in preempted(&decisions) {
            let by = match reason {
                PreemptReason::HigherPriority { by, .. }
                | PreemptReason::Reclaim { by, .. }
                | PreemptReason::LessService { by, .. } => by,
            };
            let queue = &core.queue_info[core.trials[&victim].queue].name;
            let manual = core
                .config
                .queue(queue)
                .is_some_and(|queue| queue.preemption.approval == Approval::Manual);
            if manual && !self.approved.contains(&(victim, by)) {
                return Err(format!(
                    "{victim} of manual queue {queue} preempted for {by} without approval"
                ));
            }
        }
        check_decisions(
            core,
            self.now,
            &decisions,
            &waiting_before,
            &placed_before,
            &borrowing_before,
        )?;
        for id in waiting_before {
            if core
                .trials
                .get(&id)
                .is_some_and(|trial| matches!(trial.standing, Standing::Waiting))
                && matches!(
                    core.wait_reason(id),
                    None | Some(WaitReason::NotYetConsidered)
                )
            {
                return Err(format!("{id} has no wait reason after a pass"));
            }
        }
        Ok(())
    }
}

/// Replays `events` on a fresh core over `nodes`, checking the invariants
/// after every event.
fn run_events(
    config: PolicyConfig,
    nodes: Vec<(u32, u8)>,
    events: Vec<Event>,
) -> Result<(), String> {
    let mut replay = Replay::new(config, nodes);
    for event in events {
        replay.apply(event)?;
        replay
            .core
            .check_invariants()
            .map_err(|violation| violation.to_string())?;
        replay.check_promises()?;
    }
    Ok(())
}

impl Replay {
    /// Every submitted trial's placement, wait reason and whether it is
    /// being preempted, to compare two replays by.
    fn snapshot(&self) -> String {
        self.standing(|core, trial| format!("{:?}", core.wait_reason(trial)))
    }

    /// [`Self::snapshot`] with whether the core holds each trial instead of
    /// its wait reason.
    fn placements(&self) -> String {
        self.standing(|core, trial| core.holds(trial).to_string())
    }

    /// One line per submitted trial: its placement, `detail` of it, and
    /// whether it is being preempted.
    fn standing(&self, detail: impl Fn(&PolicyCore, TrialId) -> String) -> String {
        let standing: Vec<String> = self
            .submitted
            .iter()
            .map(|trial| {
                format!(
                    "{trial} {:?} {} {}",
                    self.core.placement(*trial),
                    detail(&self.core, *trial),
                    self.core.is_preempting(*trial)
                )
            })
            .collect();
        standing.join("\n")
    }

    /// Oversubscription's invariants, from the shares as asked: no GPU is
    /// promised more than the policy's factor, nor more than its whole to
    /// workers that did not opt in; an opted-in fraction is placed at exactly
    /// its charge, and anything else at its share.
    fn check_promises(&self) -> Result<(), String> {
        let factor = self.core.config().oversubscription_milli();
        let mut promised: HashMap<(NodeId, u32), (u64, u64)> = HashMap::new();
        for (trial, (asked, opted)) in &self.asked_shares {
            let Some(workers) = self.core.placement(*trial) else {
                continue;
            };
            let charge = if *opted {
                crate::oversubscribed_charge(*asked, factor)
            } else {
                *asked
            };
            for worker in workers {
                for share in &worker.gpus {
                    let held = u64::from(share.milli);
                    let expected = charge.min(GPU_MILLI);
                    if held != expected {
                        return Err(format!(
                            "trial {trial} asked {asked} (oversubscribe {opted}) and holds {held} of a GPU, not {expected}"
                        ));
                    }
                    let entry = promised.entry((worker.node, share.index)).or_default();
                    let real = asked.min(&GPU_MILLI);
                    entry.0 += real;
                    if !*opted || *asked >= GPU_MILLI {
                        entry.1 += real;
                    }
                }
            }
        }
        for ((node, gpu), (all, plain)) in promised {
            if all * 1000 > factor * GPU_MILLI || plain > GPU_MILLI {
                return Err(format!(
                    "GPU {gpu} of {node} is promised {all} thousandths ({plain} to workers that did not opt in) under factor {factor}"
                ));
            }
        }
        Ok(())
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    #[test]
    fn invariants_hold_over_random_events(
        config in config_strategy(true),
        nodes in nodes_strategy(),
        events in prop::collection::vec(event_strategy(), 1..120),
        oversubscription in prop_oneof![Just(1.0), Just(1.5), Just(2.0)],
    ) {
        let mut config = config;
        config.oversubscription = oversubscription;
        config.validate().unwrap();
        let outcome = run_events(config, nodes, events);
        prop_assert!(outcome.is_ok(), "{}", outcome.unwrap_err());
    }

    #[test]
    fn remembered_placement_failures_change_no_decision(
        config in config_strategy(true),
        nodes in prop::collection::vec((prop_oneof![Just(2_u32), Just(4)], Just(0_u8)), 2..5),
        events in prop::collection::vec(
            prop_oneof![3 => fragmenting_event_strategy(), 1 => event_strategy()],
            1..120,
        ),
    ) {
        config.validate().unwrap();
        let mut remembering = Replay::new(config.clone(), nodes.clone());
        let mut forgetting = Replay::new(config, nodes);
        for event in events {
            // A new room epoch before every event: what found no room is
            // searched again, as if nothing were remembered across passes.
            forgetting.core.room_epoch += 1;
            let outcomes = (remembering.apply(event.clone()), forgetting.apply(event));
            prop_assert_eq!(outcomes.0.is_ok(), outcomes.1.is_ok());
            prop_assert_eq!(remembering.snapshot(), forgetting.snapshot());
        }
    }

    #[test]
    fn lanes_stopped_early_change_no_decision(
        config in config_strategy(true),
        nodes in prop::collection::vec((prop_oneof![Just(2_u32), Just(4)], Just(0_u8)), 1..4),
        events in prop::collection::vec(
            prop_oneof![3 => fragmenting_event_strategy(), 1 => event_strategy()],
            1..160,
        ),
        budget in prop::option::of(1..12_usize),
    ) {
        config.validate().unwrap();
        let mut stopping = Replay::new(config.clone(), nodes.clone());
        let mut walking = Replay::new(config, nodes);
        walking.core.walk_every_trial = true;
        // A small budget of trials looked at, so that passes reach it.
        stopping.core.examined_budget_override = budget;
        walking.core.examined_budget_override = budget;
        for event in events {
            let outcomes = (stopping.apply(event.clone()), walking.apply(event));
            prop_assert_eq!(outcomes.0.is_ok(), outcomes.1.is_ok());
            // The trials a stopped lane did not reach keep the lane's reason,
            // not their own: only where each trial is may be compared.
            prop_assert_eq!(stopping.placements(), walking.placements());
        }
    }

    #[test]
    fn invariants_hold_in_a_busy_cohort(
        config in cohort_config_strategy(),
        nodes in nodes_strategy(),
        events in prop::collection::vec(event_strategy(), 1..120),
    ) {
        config.validate().unwrap();
        let outcome = run_events(config, nodes, events);
        prop_assert!(outcome.is_ok(), "{}", outcome.unwrap_err());
    }

    #[test]
    fn with_aging_every_trial_that_fits_is_placed(
        config in config_strategy(false),
        nodes in nodes_strategy(),
        trials in prop::collection::vec(
            (prop_oneof![Just(0_u64), Just(500), Just(1000), Just(2000), Just(4000)], 1..3_u32,
             prop_oneof![Just(0_i64), Just(100), Just(1000)], 0..TEAMS.len(), 0..1000_u64,
             prop::option::of(1..3600_u64), prop_oneof![3 => Just(0_u32), 1 => 1..3_u32]),
            1..30,
        ),
    ) {
        // Urgent trials keep arriving ahead of nothing here, but urgency must not
        // stop aging from reaching every trial either.
        let mut config = config;
        config.aging = Some(AgingConfig { rate_per_hour: 100, cap: 10_000 });
        let mut core = PolicyCore::new(config);
        for (n, (gpus, rack)) in nodes.into_iter().enumerate() {
            core.upsert_node(rack_node(n as u128 + 1, gpus, rack));
        }
        let mut pending = Vec::new();
        for (index, (gpu_milli, workers, priority, team, submitted_at, limit_s, urgency)) in trials.into_iter().enumerate() {
            let mut request = TrialRequest {
                team: TEAMS[team].to_owned(),
                priority,
                submitted_at,
                urgency,
                time_limit_ms: limit_s.map(|seconds| seconds * SECOND),
                ..req(index as u32, 0)
            };
            request.gang.workers = workers;
            request.gang.per_worker.gpu_milli = gpu_milli;
            let fits = core.pool().could_ever_fit(&request.gang);
            core.submit(request, submitted_at).unwrap();
            if fits {
                pending.push(id(index as u32));
            }
        }
        let mut now = 1000;
        let mut rounds = 0;
        let limit = 4 * pending.len() + 10;
        loop {
            let decisions = core.decide(now);
            core.check_invariants().unwrap();
            for (victim, _, _) in preempted(&decisions) {
                core.requeue(victim, now);
            }
            // Finish the longest-running trial, so contention stays.
            let oldest = core
                .trials
                .iter()
                .filter_map(|(id, trial)| match &trial.standing {
                    Standing::Placed(placed) if placed.preempt_deadline.is_none() => Some((placed.started_at, *id)),
                    _ => None,
                })
                .min();
            if let Some((_, oldest)) = oldest {
                core.finish(oldest, now, true);
            }
            pending.retain(|trial| core.trials.contains_key(trial));
            if pending.is_empty() {
                break;
            }
            rounds += 1;
            prop_assert!(rounds < limit, "stuck with {:?}", pending.iter().map(|trial| core.wait_reason(*trial)).collect::<Vec<_>>());
            now += 10 * MINUTE;
        }
        prop_assert_eq!(pending.len(), 0);
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 128, ..ProptestConfig::default() })]

    /// Least attained service starves no one: small trials keep arriving at
    /// level 0 while every trial that fits, gangs and trials pushed to higher
    /// levels by their runs (and by preemption for service) included, gets
    /// placed, through skip-ahead ending at `reserve_after` and promotion.
    #[test]
    fn with_attained_service_every_trial_that_fits_is_placed(
        config in config_strategy(false),
        las in las_strategy(),
        promote_after in 1..5_u32,
        nodes in nodes_strategy(),
        trials in prop::collection::vec(
            (prop_oneof![Just(0_u64), Just(500), Just(1000), Just(2000), Just(4000)], 1..3_u32,
             0..TEAMS.len(), 0..1000_u64),
            1..20,
        ),
        stream in prop::collection::vec((prop_oneof![Just(500_u64), Just(1000)], 0..TEAMS.len()), 200),
    ) {
        let mut core = PolicyCore::new(least_attained_service_only(config, las, promote_after));
        for (n, (gpus, rack)) in nodes.into_iter().enumerate() {
            core.upsert_node(rack_node(n as u128 + 1, gpus, rack));
        }
        let mut pending = submit_fitting(&mut core, trials);
        let mut now = 1000;
        for (round, (gpu_milli, team)) in stream.into_iter().enumerate() {
            starvation_round(&mut core, now, &mut pending);
            if pending.is_empty() {
                break;
            }
            // One more small trial of the same class arrives every round.
            let mut newcomer = TrialRequest {
                team: TEAMS[team].to_owned(),
                submitted_at: now,
                ..req(1000 + round as u32, 0)
            };
            newcomer.gang.per_worker.gpu_milli = gpu_milli;
            core.submit(newcomer, now).unwrap();
            now += 10 * MINUTE;
        }
        prop_assert!(
            pending.is_empty(),
            "starved: {:?}",
            pending.iter().map(|trial| (*trial, core.wait_reason(*trial))).collect::<Vec<_>>()
        );
    }
}

/// `config` with one queue and one class, under least attained service
/// promoting after `promote_after`: only the levels, promotion and the reserve
/// keep a trial from starving then (aging is off).
fn least_attained_service_only(
    mut config: PolicyConfig,
    las: AttainedServiceConfig,
    promote_after: u32,
) -> PolicyConfig {
    config.queues = vec![QueueConfig::open("default")];
    config.aging = None;
    // Adaptive levels scale the minimum run by the first edge over the
    // prior's, and lengthen `reserve_after` and the size delay by it when it
    // is above one; a prior of the order of what these trials receive
    // (minutes to hours of a GPU, not seconds) keeps them within the rounds
    // the test watches.
    let thresholds_gpu_hours = match las.levels {
        LevelSource::Adaptive => las.thresholds_gpu_hours.iter().map(|h| h * 600.0).collect(),
        LevelSource::Fixed => las.thresholds_gpu_hours.clone(),
    };
    config.attained_service = Some(AttainedServiceConfig {
        promote_after,
        thresholds_gpu_hours,
        ..las
    });
    // Preemption for service needs a minimum run (the presets have five
    // minutes): with none, newcomers time-slice the cluster so finely
    // that a gang waiting for a whole node may never see it free.
    config.preemption.min_run_time_ms = config.preemption.min_run_time_ms.max(MINUTE);
    if !config.backfill {
        // `head_of_line: skip` without backfill lets big gangs starve by design.
        config.head_of_line = HeadOfLine::Strict;
    }
    config
}

/// Submits `trials` (GPU share, workers, team, submission time) as trials 0,
/// 1, ... and returns those that could ever fit the nodes.
fn submit_fitting(core: &mut PolicyCore, trials: Vec<(u64, u32, usize, u64)>) -> Vec<TrialId> {
    let mut fitting = Vec::new();
    for (index, (gpu_milli, workers, team, submitted_at)) in trials.into_iter().enumerate() {
        let mut request = TrialRequest {
            team: TEAMS[team].to_owned(),
            submitted_at,
            ..req(index as u32, 0)
        };
        request.gang.workers = workers;
        request.gang.per_worker.gpu_milli = gpu_milli;
        let fits = core.pool().could_ever_fit(&request.gang);
        core.submit(request, submitted_at).unwrap();
        if fits {
            fitting.push(id(index as u32));
        }
    }
    fitting
}

/// One round of the starvation test: a pass (invariants checked), its
/// preemptions requeued, and the oldest running trial finished; what started
/// or is gone leaves `pending`.
fn starvation_round(core: &mut PolicyCore, now: UnixMillis, pending: &mut Vec<TrialId>) {
    let decisions = core.decide(now);
    core.check_invariants().unwrap();
    // Placed once is enough: preemption for service may then
    // time-slice it with newcomers, as least attained service means to.
    let started = placed(&decisions);
    pending.retain(|trial| !started.contains(trial));
    for (victim, _, _) in preempted(&decisions) {
        core.requeue(victim, now);
    }
    let oldest = core
        .trials
        .iter()
        .filter_map(|(id, trial)| match &trial.standing {
            Standing::Placed(placed) if placed.preempt_deadline.is_none() => {
                Some((placed.started_at, *id))
            }
            _ => None,
        })
        .min();
    if let Some((_, oldest)) = oldest {
        core.finish(oldest, now, true);
    }
    pending.retain(|trial| core.trials.contains_key(trial));
}

/// A running oversubscribed trial taken back after a head restart asks for
/// the charge it holds, so that a requeue places it at that charge again.
#[test]
fn an_adopted_oversubscribed_trial_asks_what_it_holds() {
    let mut core = core_yaml("oversubscription: 1.5\n", &[1]);
    let mut request = req(1, 0);
    request.gang.per_worker.gpu_milli = 450;
    request.gang.oversubscribe = true;
    must_submit(&mut core, request.clone());
    must_decide(&mut core, 0);
    let held = core.placement(id(1)).unwrap().to_vec();
    assert_eq!(held[0].gpus[0].milli, 300);
    // A new core, as after a restart, adopts it with the request as asked.
    let mut again = core_yaml("oversubscription: 1.5\n", &[1]);
    again.adopt(request, held.clone(), 0).unwrap();
    again.check_invariants().unwrap();
    assert!(again.requeue(id(1), MINUTE));
    must_decide(&mut again, MINUTE);
    assert_eq!(again.placement(id(1)).unwrap()[0].gpus[0].milli, 300);
}
