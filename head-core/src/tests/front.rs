//! Tests of multi-objective experiments in the head: a MOTPE sweep told each
//! objective (`SweepOp::ToldObjectives`) and rebuilt from its log, and the front
//! and hypervolume `xp status` carries, checked by hand.

use xp_runtime::protocol::{Request, Response, StatusQuery};

use super::*;
use crate::auth::access::Authorized;
use crate::auth::{Principal, Role};
use crate::requests::Served;
use crate::sweep::SweepOp;

/// Maximise `a`, minimise `b`.
const MOTPE: &str = "name: mo\ntrial: {command: [echo, '{x}']}\nsearch:\n  algorithm: tpe\n  space: {x: {uniform: [0, 1]}}\n  metric: [a, b]\n  mode: [max, min]\n  trials: 6\n  parallel: 2\n  seed: 4\n";

/// Runs every launched worker to its end: `values_of(x)` reported as (a, b) (a
/// `None` leaves that metric out); `fail` makes the worker exit 1.
fn finish_with(
    core: &mut HeadCore,
    now: u64,
    node: NodeId,
    values_of: impl Fn(f64) -> (Option<f64>, Option<f64>),
    fail: impl Fn(f64) -> bool,
) -> Vec<(TrialId, f64)> {
    let launched = launches(&commands(core));
    let mut done = Vec::new();
    for (_, key) in &launched {
        let config: serde_json::Value =
            serde_json::from_str(&core.book.trial(key.trial).config_json).unwrap();
        let x = config["x"].as_f64().unwrap();
        report(core, now, node, WorkerReport::Started { key: *key, pid: 1 });
        let (a, b) = values_of(x);
        let values: Vec<(String, f64)> = [("a", a), ("b", b)]
            .into_iter()
            .filter_map(|(name, value)| value.map(|value| (name.to_owned(), value)))
            .collect();
        report(
            core,
            now,
            node,
            WorkerReport::Metric {
                key: *key,
                index: 1,
                step: Some(1),
                values,
            },
        );
        report(
            core,
            now,
            node,
            WorkerReport::Exited {
                key: *key,
                code: Some(i32::from(fail(x))),
                signal: None,
            },
        );
        done.push((key.trial, x));
    }
    done
}

/// A core with one node of eight slots and [`MOTPE`] submitted: the core,
/// the node and the experiment.
fn motpe_on_a_node() -> (HeadCore, NodeId, ExperimentId) {
    let mut core = HeadCore::restore(CONFIG, LoadedState::default(), 0);
    let node = node_id(1);
    core.handle_node_register(0, registration(node, 0, 8, Vec::new()));
    let experiment = submit(&mut core, 0, MOTPE, false);
    (core, node, experiment)
}

#[test]
fn a_motpe_sweep_is_told_every_objective_and_replays() {
    let (mut core, node, experiment) = motpe_on_a_node();
    // a = x, b = x²: conflicting, so every evaluated trial is on the front.
    let values = |x: f64| (Some(x), Some(x * x));
    assert_eq!(finish_with(&mut core, 1, node, values, |_| false).len(), 2);
    let records = core.take_records();
    let mut twin = HeadCore::restore(CONFIG, loaded_from(records), 2);
    twin.handle_node_register(2, registration(node, 0, 8, Vec::new()));
    // The next asks come from the model told (a, b) of each: the restored twin,
    // replaying the sweep log, proposes the same configurations.
    let mut original = Vec::new();
    let mut replayed = Vec::new();
    for now in 2..6 {
        original.extend(finish_with(&mut core, now, node, values, |_| false));
        replayed.extend(finish_with(&mut twin, now, node, values, |_| false));
    }
    assert_eq!(original.len(), 4, "the budget of 6 configurations");
    assert_eq!(original, replayed);
    let log = &core.book.experiment(experiment).sweep_log;
    let told: Vec<&Vec<f64>> = log
        .iter()
        .filter_map(|op| match op {
            SweepOp::ToldObjectives { objectives, .. } => Some(objectives),
            _ => None,
        })
        .collect();
    assert_eq!(told.len(), 6);
    for objectives in told {
        // Minimised: −a and b.
        assert_eq!(objectives.len(), 2);
        assert!((objectives[1] - objectives[0] * objectives[0]).abs() < 1e-12);
        assert!(objectives[0] <= 0.0);
    }
    let status = &core.status(None).unwrap()[0];
    assert_eq!(status.objectives.len(), 2);
    let front = status.front.as_ref().unwrap();
    assert_eq!(front.evaluated, 6);
    assert_eq!(front.trials.len(), 6);
    assert!(!front.reference_declared);
    core.check_invariants();
}

#[test]
fn the_front_leaves_out_failed_incomplete_and_nonfinite_trials() {
    let mut core = HeadCore::restore(CONFIG, LoadedState::default(), 0);
    let node = node_id(1);
    core.handle_node_register(0, registration(node, 0, 8, Vec::new()));
    let yaml = "name: grid\ntrial: {command: [echo, '{x}']}\nsearch:\n  algorithm: grid\n  space: {x: {choice: [0.1, 0.2, 0.3, 0.4, 0.5, 0.6]}}\n  metric: [a, b]\n  mode: [max, min]\n  reference: [0.0, 1.0]\n";
    let experiment = submit(&mut core, 0, yaml, false);
    // 0.1 and 0.2 lie on the line; 0.3 is dominated by 0.4; 0.4 fails after
    // reporting (not on the front, so 0.3 is); 0.5 misses b; 0.6 reports a NaN.
    let is = |x: f64, value: f64| (x - value).abs() < 1e-12;
    let values = |x: f64| {
        if is(x, 0.3) {
            (Some(0.25), Some(0.5))
        } else if is(x, 0.5) {
            (Some(0.9), None)
        } else if is(x, 0.6) {
            (Some(f64::NAN), Some(0.0))
        } else {
            (Some(x), Some(x))
        }
    };
    let done = finish_with(&mut core, 1, node, values, |x| is(x, 0.4));
    assert_eq!(done.len(), 6);
    let status = &core.status(None).unwrap()[0];
    let front = status.front.as_ref().unwrap();
    assert_eq!(front.evaluated, 3, "succeeded with every objective finite");
    let trial_of = |x: f64| done.iter().find(|(_, value)| is(*value, x)).unwrap().0;
    let mut members: Vec<TrialId> = front.trials.iter().map(|member| member.trial).collect();
    members.sort();
    let mut expected = vec![trial_of(0.1), trial_of(0.2), trial_of(0.3)];
    expected.sort();
    assert_eq!(members, expected);
    // Slices of a above 0: (0.2, 0.25] below b = 1 − 0.5; (0.1, 0.2] → 1 − 0.2;
    // (0, 0.1] → 1 − 0.1.
    let hypervolume = 0.05 * 0.5 + 0.1 * 0.8 + 0.1 * 0.9;
    assert!((front.hypervolume - hypervolume).abs() < 1e-12, "{front:?}");
    assert_eq!(front.reference, vec![0.0, 1.0]);
    // The largest contributor stands for the experiment.
    assert_eq!(core.front_top(experiment), Some(front.trials[0].trial));
    core.check_invariants();
}

#[test]
fn a_status_page_leaves_its_front_to_be_computed_on_the_book_as_it_was() {
    let (mut core, node, experiment) = motpe_on_a_node();
    let values = |x: f64| (Some(x), Some(x * x));
    finish_with(&mut core, 1, node, values, |_| false);
    let before = core.status(None).unwrap()[0].front.clone().unwrap();
    assert_eq!(before.trials.len(), 2);
    let admin = Authorized {
        principal: Principal::User {
            name: "root".to_owned(),
            team: "ops".to_owned(),
            role: Role::Admin,
        },
        experiment: None,
    };
    let page = |core: &mut HeadCore| {
        let query = StatusQuery {
            experiment: Some(experiment.to_string()),
            from: None,
        };
        core.serve(2, &admin, None, Request::StatusPage(query))
            .unwrap()
    };
    let Served::Status(pending) = page(&mut core) else {
        panic!("a multi-objective experiment's front is computed off the actor");
    };
    // Two more trials end before the front is computed: it is the front of
    // the book when the page was made.
    finish_with(&mut core, 2, node, values, |_| false);
    let Response::StatusPage(answered) = pending.complete() else {
        panic!("a status page answers a status page request");
    };
    assert_eq!(answered.experiments[0].front.as_ref(), Some(&before));
    let Served::Status(pending) = page(&mut core) else {
        panic!("a multi-objective experiment's front is computed off the actor");
    };
    let Response::StatusPage(answered) = pending.complete() else {
        panic!("a status page answers a status page request");
    };
    assert_eq!(
        answered.experiments[0].front.as_ref().unwrap().trials.len(),
        4
    );
}
