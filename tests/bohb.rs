//! End-to-end BOHB: a small `algorithm: bohb` sweep on a real cluster (head, node,
//! `sh` trials printing a learning curve), one trial at a time so the order of
//! reports is fixed. Checks that every trial is stopped at a rung of the bracket
//! its index gives, exactly where successive halving recomputed here from the
//! trials' configurations says (so the counts promoted per rung are the
//! schedule's), and that after the first budget holds enough results the
//! configurations come from BOHB's model, as the trials' events say.

mod common;

use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

use common::{TestCluster, must_succeed, trials};
use serde_json::Value;

/// A curve whose ranking of configurations never changes: `sh curve.sh X` prints
/// `(x - 1)^2 + 4/s` at steps 1 to 9, at full precision.
const CURVE: &str = r#"for s in 1 2 3 4 5 6 7 8 9; do echo "XP_METRIC {\"step\": $s, \"loss\": $(awk -v x="$1" -v s=$s 'BEGIN { printf "%.17g", (x - 1) * (x - 1) + 4 / s }')}"; done
"#;

fn loss(x: f64, step: u64) -> f64 {
    (x - 1.0) * (x - 1.0) + 4.0 / step as f64
}

/// Each trial by index: its id, its `x`, and the step it was stopped at.
type ByIndex = BTreeMap<u32, (String, f64, u64)>;

#[test]
fn a_bohb_sweep_stops_trials_at_its_brackets_rungs_and_samples_from_its_model() {
    let mut cluster = TestCluster::start("10s");
    cluster.start_node("a", 0, 2);
    cluster.wait_for_nodes(1);
    let curve = cluster.write_file("curve.sh", CURVE);
    // Budgets 1, 3, 9 at η = 3: one Hyperband iteration is 9 + 5 + 3 = 17 configurations.
    let spec = cluster.write_file(
        "bohb.yaml",
        &format!(
            "name: bohb\ntrial:\n  command: [sh, {}, '{{x}}']\nsearch:\n  algorithm: bohb\n  space: {{x: {{uniform: [-4, 4]}}}}\n  metric: loss\n  trials: 17\n  parallel: 1\n  seed: 2\n  bohb: {{min_budget: 1, max_budget: 9, reduction_factor: 3}}\n",
            curve.display()
        ),
    );
    let experiment = cluster
        .must_xp(&["submit", spec.to_str().unwrap()])
        .trim()
        .to_owned();
    let (status, events) = must_run_and_replay_events(&cluster, &experiment, &spec);
    let by_index = check_every_trial_stopped(&status);
    // Successive halving within Hyperband's brackets, recomputed: trials 0-8 have
    // rungs 1 and 3, trials 9-13 rung 3, trials 14-16 run to 9; a rung keeps a
    // trial unless ⌈n/3⌉ of the n values recorded there are strictly better.
    check_successive_halving(&by_index);
    // Every trial says how its configuration was chosen: at random while no
    // budget holds 4 results (one parameter: 2 good, 2 rest), by the model after.
    check_provenance(&by_index, &events);
}

/// Runs the sweep to its end, then submits it again with `--wait`: the same
/// experiment, already finished, prints every event it had, one line each.
/// The status and those events.
fn must_run_and_replay_events(
    cluster: &TestCluster,
    experiment: &str,
    spec: &Path,
) -> (Value, String) {
    let status = cluster.wait_finished(experiment, Duration::from_secs(180));
    let args = ["submit", "--wait", spec.to_str().unwrap()];
    let output = cluster.xp(&args);
    let events = String::from_utf8_lossy(&output.stderr).into_owned();
    let again = must_succeed(&args, output);
    assert!(again.starts_with(experiment), "{again}");
    (status, events)
}

/// All 17 trials were stopped by BOHB; each by index, with the step.
fn check_every_trial_stopped(status: &Value) -> ByIndex {
    let all = trials(status);
    assert_eq!(all.len(), 17, "one iteration: {status:#}");
    // Trials by index, with their x and the step they were stopped at.
    let mut by_index = ByIndex::new();
    for trial in all {
        let id = trial["id"].as_str().unwrap().to_owned();
        let index: u32 = id.rsplit("-t").next().unwrap().parse().unwrap();
        assert_eq!(trial["state"], "stopped", "{trial:#}");
        let reason = trial["reason"].as_str().unwrap();
        let step: u64 = reason
            .strip_prefix("stopped early by bohb at step ")
            .and_then(|rest| rest.split(':').next())
            .and_then(|step| step.parse().ok())
            .unwrap_or_else(|| panic!("{reason}"));
        let x = trial["config"]["x"].as_f64().unwrap();
        by_index.insert(index, (id, x, step));
    }
    assert_eq!(by_index.len(), 17);
    by_index
}

/// Each trial stopped at the rung successive halving recomputed here gives;
/// some early, and only what the last rungs promoted (and bracket 2) ran to
/// the end.
fn check_successive_halving(by_index: &ByIndex) {
    let budgets = [1_u64, 3, 9];
    let mut recorded: BTreeMap<(usize, u64), Vec<f64>> = BTreeMap::new();
    let mut promoted: BTreeMap<(usize, u64), usize> = BTreeMap::new();
    for (index, (id, x, step)) in by_index {
        let bracket = match index {
            0..9 => 0,
            9..14 => 1,
            _ => 2,
        };
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
            *promoted.entry((bracket, *rung)).or_default() += 1;
        }
        assert_eq!(*step, expected, "{id} (x = {x}): {by_index:#?}");
    }
    let stopped_early = by_index.values().filter(|(_, _, step)| *step < 9).count();
    assert!(stopped_early >= 3, "rungs stopped trials: {by_index:#?}");
    // Only what the last rungs promoted, and bracket 2, ran to max_budget.
    let to_the_end = by_index.values().filter(|(_, _, step)| *step == 9).count();
    let promoted_last = promoted.get(&(0, 3)).unwrap_or(&0) + promoted.get(&(1, 3)).unwrap_or(&0);
    assert_eq!(to_the_end, promoted_last + 3, "{promoted:?}");
}

/// Each trial's events say how its configuration was chosen: the first four
/// at random, at least five by the model.
fn check_provenance(by_index: &ByIndex, events: &str) {
    let provenance = |id: &str| {
        events
            .lines()
            .find(|line| line.starts_with(&format!("{id} ")) && line.contains("proposed"))
            .unwrap_or_else(|| panic!("no provenance for {id}: {events}"))
            .to_owned()
    };
    for (index, (id, _, _)) in by_index {
        let said = provenance(id);
        if *index < 4 {
            assert!(said.contains("no budget has enough results"), "{said}");
        }
    }
    let from_model = by_index
        .values()
        .filter(|(id, _, _)| provenance(id).contains("proposed by the model of budget"))
        .count();
    assert!(from_model >= 5, "{events}");
}
