//! Tests of `algorithm: bohb` in the head: trials stopped at the rungs of the
//! bracket their index gives (checked against successive halving recomputed
//! here), the sampler's results kept in the sweep log (`SweepOp::Observed`) so a
//! replay reproduces its asks, and the trials' events saying how each
//! configuration was chosen.

use super::*;
use crate::sweep::{Sweep, SweepOp};

/// Budgets 1, 3, 9 at η = 3: brackets of 9, 5 and 3 configurations, one at a time.
const BOHB: &str = "name: b\ntrial: {command: [echo, '{x}']}\nsearch:\n  algorithm: bohb\n  space: {x: {uniform: [-4, 4]}}\n  metric: loss\n  trials: 17\n  parallel: 1\n  seed: 2\n  bohb: {min_budget: 1, max_budget: 9, reduction_factor: 3}\n";

/// A curve whose order never changes: the rungs see the final ranking early.
fn loss(x: f64, step: u64) -> f64 {
    (x - 1.0).powi(2) + 4.0 / step as f64
}

/// What a sweep of [`BOHB`] ran, in the order it ran: each trial's `x` and the
/// step it was stopped at, and every record the core produced.
struct Swept {
    xs: Vec<f64>,
    stop_steps: Vec<u64>,
    records: Vec<Record>,
}

/// Runs the trials of `experiment` on `node` one at a time until none is
/// launched, each reporting [`loss`] at steps 1 to 9 until bohb stops it.
fn must_sweep(core: &mut HeadCore, node: NodeId, experiment: ExperimentId) -> Swept {
    let mut swept = Swept {
        xs: Vec::new(),
        stop_steps: Vec::new(),
        records: core.take_records(),
    };
    for now in 1.. {
        let launched = launches(&commands(core));
        if launched.is_empty() {
            break;
        }
        assert_eq!(launched.len(), 1, "parallel 1");
        let (x, stopped_at) = run_until_stopped(core, now, node, experiment, launched[0].1);
        swept
            .stop_steps
            .push(stopped_at.expect("bohb stops every trial by max_budget"));
        swept.xs.push(x);
        swept.records.extend(core.take_records());
    }
    swept
}

/// Runs `key` at `now`, reporting [`loss`] at steps 1 to 9 until its trial is
/// stopped, then its end by SIGTERM; returns its `x` and the step it was
/// stopped at.
fn run_until_stopped(
    core: &mut HeadCore,
    now: u64,
    node: NodeId,
    experiment: ExperimentId,
    key: WorkerKey,
) -> (f64, Option<u64>) {
    let config: serde_json::Value =
        serde_json::from_str(&core.book.trial(key.trial).config_json).unwrap();
    let x = config["x"].as_f64().unwrap();
    report(core, now, node, WorkerReport::Started { key, pid: 1 });
    let mut stopped_at = None;
    for step in 1..=9_u64 {
        let values = vec![("loss".to_owned(), loss(x, step))];
        let metric = WorkerReport::Metric {
            key,
            index: step,
            step: Some(step),
            values,
        };
        report(core, now, node, metric);
        if trial_state(core, experiment, key.trial.index) == TrialState::Stopped {
            stopped_at = Some(step);
            break;
        }
    }
    let terminated = WorkerReport::Exited {
        key,
        code: None,
        signal: Some(15),
    };
    report(core, now, node, terminated);
    (x, stopped_at)
}

/// Checks each trial's stop step against successive halving recomputed:
/// trials 0-8 have rungs 1 and 3, trials 9-13 rung 3, trials 14-16 none; a
/// rung keeps a trial unless ⌈n/3⌉ of its n values are strictly better.
/// Returns how many results the trials gave bohb (one per budget reached).
fn check_stops_at_the_rungs(core: &HeadCore, experiment: ExperimentId, swept: &Swept) -> usize {
    let stop_steps = &swept.stop_steps;
    let budgets = [1_u64, 3, 9];
    let bracket_of = |index: usize| match index {
        0..9 => 0,
        9..14 => 1,
        _ => 2,
    };
    let mut recorded: BTreeMap<(usize, u64), Vec<f64>> = BTreeMap::new();
    let mut observed = 0;
    for (index, x) in swept.xs.iter().enumerate() {
        let bracket = bracket_of(index);
        let mut expected = 9;
        for rung in &budgets[bracket..2] {
            let value = loss(*x, *rung);
            let values = recorded.entry((bracket, *rung)).or_default();
            values.push(value);
            let better = values.iter().filter(|other| **other < value).count();
            if better >= values.len().div_ceil(3) {
                expected = *rung;
                break;
            }
        }
        assert_eq!(stop_steps[index], expected, "trial {index}: {stop_steps:?}");
        observed += budgets.iter().filter(|budget| **budget <= expected).count();
        let index = index as u32;
        let trial = core.book.trial(TrialId { experiment, index });
        let reason = trial.reason.clone().unwrap();
        assert!(reason.contains("by bohb at step"), "{reason}");
    }
    assert!(
        stop_steps.iter().filter(|step| **step < 9).count() >= 3,
        "rungs stopped some trials: {stop_steps:?}"
    );
    observed
}

/// Checks that every trial's event log says how its configuration was chosen:
/// at random until a budget holds 4 results (one parameter: 2 good, 2 rest),
/// then mostly by the model, whose budget never goes down.
fn check_provenance(swept: &Swept) {
    let events: Vec<&TrialEvent> = swept
        .records
        .iter()
        .filter_map(|record| match record {
            Record::Event(event) => Some(event),
            _ => None,
        })
        .collect();
    let provenance: Vec<String> = (0..17)
        .map(|index| {
            events
                .iter()
                .find(|event| event.trial.index == index && event.reason.contains("proposed"))
                .map(|event| event.reason.to_string())
                .unwrap_or_else(|| panic!("trial {index} has no provenance: {events:?}"))
        })
        .collect();
    for said in &provenance[..4] {
        assert!(said.contains("no budget has enough results"), "{said}");
    }
    let model_budgets: Vec<u64> = provenance
        .iter()
        .filter_map(|said| {
            let rest = said.split("model of budget ").nth(1)?;
            rest.split(' ').next()?.parse().ok()
        })
        .collect();
    assert!(model_budgets.len() >= 5, "{provenance:#?}");
    assert!(
        model_budgets.windows(2).all(|pair| pair[0] <= pair[1]),
        "{provenance:#?}"
    );
}

/// The `x` a searcher for `search` asks, fed `ops` in order. Suggestion ids
/// replay whatever the configurations, so the configurations themselves are
/// compared.
fn replayed_xs(search: &xp_runtime::spec::SearchSpec, ops: &[SweepOp]) -> Vec<f64> {
    let space = xp_runtime::spec::SearchSpace::from_spec(&search.space).unwrap();
    let mut searcher = xp_tune::search::make_searcher(
        xp_tune::search::SearchAlgorithm::from_spec(search),
        &space,
        search.seed,
    );
    let mut configs = Vec::new();
    for op in ops {
        match op {
            SweepOp::Asked { .. } => {
                let config = searcher.ask().unwrap().config;
                configs.push(serde_json::to_value(config).unwrap()["x"].as_f64().unwrap());
            }
            SweepOp::Told {
                suggestion,
                objective,
            } => searcher.tell(*suggestion, *objective),
            SweepOp::Forgot { suggestion } => searcher.forget(*suggestion),
            SweepOp::Observed {
                suggestion,
                step,
                objective,
            } => {
                searcher.observe(*suggestion, *step, *objective);
            }
            other => panic!("{other:?}"),
        }
    }
    configs
}

/// Whether `left` and `right` are the same within an ulp or two: serde_json's
/// default float parsing may round the last digit of a trial's configuration
/// differently.
fn same_xs(left: &[f64], right: &[f64]) -> bool {
    left.len() == right.len()
        && left
            .iter()
            .zip(right)
            .all(|(left, right)| (left - right).abs() <= 1e-12)
}

/// Checks that the sweep log holds the `observed` results, one per budget each
/// trial reached, and that replaying it rebuilds the same searcher, which
/// asks what the trials ran; without the results the asks diverge.
fn check_the_log_replays(
    core: &HeadCore,
    experiment: ExperimentId,
    swept: &Swept,
    observed: usize,
) {
    let log = swept
        .records
        .iter()
        .rev()
        .find_map(|record| match record {
            Record::Experiment(record) if record.id == experiment => Some(record.sweep_log.clone()),
            _ => None,
        })
        .unwrap();
    let observations = log
        .iter()
        .filter(|op| matches!(op, SweepOp::Observed { .. }))
        .count();
    assert_eq!(observations, observed);
    let search = &core.book.spec(experiment).search;
    let (_, divergences) = Sweep::replay(search, &log).unwrap();
    assert!(divergences.is_empty(), "{divergences:?}");
    let xs = &swept.xs;
    let replayed = replayed_xs(search, &log);
    assert!(same_xs(&replayed, xs), "{replayed:?} against {xs:?}");
    let without: Vec<SweepOp> = log
        .iter()
        .filter(|op| !matches!(op, SweepOp::Observed { .. }))
        .cloned()
        .collect();
    assert!(
        !same_xs(&replayed_xs(search, &without), xs),
        "the model's asks need the results"
    );
}

#[test]
fn bohb_stops_trials_at_their_brackets_rungs_and_learns_from_them() {
    let (mut core, node) = cluster(0, 8);
    let experiment = submit(&mut core, 0, BOHB, false);
    let swept = must_sweep(&mut core, node, experiment);
    assert_eq!(swept.xs.len(), 17, "the budget of 17 configurations");
    let observed = check_stops_at_the_rungs(&core, experiment, &swept);
    check_provenance(&swept);
    check_the_log_replays(&core, experiment, &swept, observed);
    core.check_invariants();
}
