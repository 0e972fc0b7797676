//! Tests of result reuse between teams: an identical trial reuses a finished
//! result of its own team only, before and after a restart, and experiment ids
//! stay what they were.

use super::*;

/// The same grid in `team`, under the experiment name `name`.
fn grid(name: &str, team: &str) -> String {
    format!(
        "name: {name}\nteam: {team}\ntrial: {{command: [echo, '{{x}}']}}\nsearch: {{algorithm: grid, space: {{x: {{choice: [1, 2]}}}}}}\n"
    )
}

/// Where each trial of `experiment` took its result from (`None`: it runs itself).
fn sources(core: &HeadCore, experiment: ExperimentId) -> Vec<Option<TrialId>> {
    (0..2)
        .map(|index| core.book.trial(TrialId { experiment, index }).reused_from)
        .collect()
}

#[test]
fn an_identical_trial_reuses_a_result_of_its_own_team_only() {
    let (mut core, node) = cluster(0, 4);
    let alpha = submit(&mut core, 0, &grid("g", "alpha"), false);
    assert_eq!(finish_all(&mut core, 1, node, |_| 0.5), 2);
    let records = core.take_records();

    // The same work in another team runs itself: nothing of alpha's is shown.
    let beta = submit(&mut core, 2, &grid("g", "beta"), false);
    assert_eq!(sources(&core, beta), [None, None]);
    assert_eq!(launches(&commands(&mut core)).len(), 2);
    let reasons: Vec<String> = (0..2)
        .map(|index| {
            let trial = core.book.trial(TrialId {
                experiment: beta,
                index,
            });
            assert!(trial.metrics.is_empty(), "{:?}", trial.metrics);
            trial.reason.as_deref().unwrap_or_default().to_owned()
        })
        .collect();
    assert!(
        reasons
            .iter()
            .all(|reason| !reason.contains(&alpha.to_string())),
        "{reasons:?}"
    );

    // Alpha's own identical work under another name reuses alpha's results.
    let again = submit(&mut core, 3, &grid("h", "alpha"), false);
    let alpha_trial = |index| {
        Some(TrialId {
            experiment: alpha,
            index,
        })
    };
    assert_eq!(sources(&core, again), [alpha_trial(0), alpha_trial(1)]);

    // So does a restarted head, whose reusable results come from the records.
    let mut restarted = HeadCore::restore(CONFIG, loaded_from(records), 4);
    let beta_after = submit(&mut restarted, 5, &grid("g", "beta"), false);
    assert_eq!(sources(&restarted, beta_after), [None, None]);
    let alpha_after = submit(&mut restarted, 6, &grid("h", "alpha"), false);
    assert_eq!(
        sources(&restarted, alpha_after),
        [alpha_trial(0), alpha_trial(1)]
    );
    core.check_invariants();
    restarted.check_invariants();
}

#[test]
fn experiment_ids_do_not_depend_on_the_trial_identity() {
    // Pinned: an id a team already holds names the same experiment after an
    // upgrade, so its resubmission finds it instead of starting a new run.
    let (mut core, _node) = cluster(0, 1);
    let id = submit(&mut core, 0, &grid("g", "alpha"), false);
    assert_eq!(id.to_string(), "eab42e54fbdbe6ca");
    assert_eq!(submit(&mut core, 1, &grid("g", "alpha"), false), id);
}
