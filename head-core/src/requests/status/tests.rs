//! Tests of `xp status` in pages: every trial comes once, in order, in
//! answers bounded in trials and bytes, to whoever may see it; and the
//! unpaged answer is refused before it is built when it would not fit a frame.

use xp_runtime::protocol::SubmitRequest;
use xp_runtime::spec::ExperimentSpec;

use super::*;
use crate::auth::{Principal, Role};
use crate::{CoreConfig, LoadedState};

fn core() -> HeadCore {
    HeadCore::restore(CoreConfig::default(), LoadedState::default(), 0)
}

fn submit(core: &mut HeadCore, yaml: &str) -> ExperimentId {
    let spec = ExperimentSpec::from_yaml(yaml).unwrap();
    let request = SubmitRequest {
        spec_json: spec.to_canonical_json(),
        program: None,
        code_version: "none".to_owned(),
        data_version: "none".to_owned(),
        rerun: false,
    };
    core.handle_submit(1, &request).unwrap().0
}

/// A grid of `trials` trials in `team`, each holding `value_bytes` of config.
fn grid(
    core: &mut HeadCore,
    name: &str,
    team: &str,
    trials: u32,
    value_bytes: usize,
) -> ExperimentId {
    let (a, b) = ("a".repeat(value_bytes), "b".repeat(value_bytes));
    let yaml = format!(
        "name: {name}\nteam: {team}\ntrial: {{command: [echo, '{{n}}']}}\nsearch: {{algorithm: grid, space: {{s: {{choice: ['{a}', '{b}']}}, n: {{int: [1, {}]}}}}}}\n",
        trials / 2
    );
    submit(core, &yaml)
}

fn asker(team: &str, role: Role) -> Authorized {
    Authorized {
        principal: Principal::User {
            name: format!("{team}-{role}"),
            team: team.to_owned(),
            role,
        },
        experiment: None,
    }
}

/// Every page of `experiment` (or of everything) as `asker` sees it.
fn pages(core: &HeadCore, asker: &Authorized, experiment: Option<&str>) -> Vec<StatusPage> {
    let mut pages = Vec::new();
    let mut from = None;
    loop {
        let query = StatusQuery {
            experiment: experiment.map(str::to_owned),
            from,
        };
        let Response::StatusPage(page) = core.read_status_page(asker, query).unwrap() else {
            panic!("a status page answers a status page request");
        };
        from = page.next;
        pages.push(page);
        if from.is_none() {
            return pages;
        }
        assert!(pages.len() < 1_000, "pages never end");
    }
}

/// Checks that every page is bounded, and that the pages together hold every
/// trial of `expected` (experiments and their trial counts) once, in order.
fn check_pages_hold_every_trial_once(pages: Vec<StatusPage>, expected: &[(ExperimentId, usize)]) {
    let mut whole = Vec::new();
    for page in pages {
        let trials: usize = page.experiments.iter().map(|e| e.trials.len()).sum();
        assert!(
            trials <= MAX_STATUS_PAGE_TRIALS,
            "{trials} trials in a page"
        );
        let bytes = serde_json::to_vec(&page.experiments).unwrap().len();
        assert!(
            bytes <= 2 * MAX_STATUS_PAGE_BYTES,
            "a page of {bytes} bytes"
        );
        page.merge_into(&mut whole);
    }
    let shown: Vec<(ExperimentId, usize)> = whole.iter().map(|e| (e.id, e.trials.len())).collect();
    assert_eq!(shown, expected);
    for experiment in &whole {
        let indexes: Vec<u32> = experiment
            .trials
            .iter()
            .map(|trial| trial.id.index)
            .collect();
        let wanted: Vec<u32> = (0..experiment.trials.len() as u32).collect();
        assert_eq!(indexes, wanted, "experiment {}", experiment.id);
    }
}

#[test]
fn every_trial_comes_once_in_pages_bounded_in_trials_and_bytes() {
    let mut core = core();
    let many = grid(&mut core, "many", "a", 7_000, 1);
    let more = grid(&mut core, "more", "b", 6_000, 1);
    let large = grid(&mut core, "large", "c", 100, 100_000);
    let mut expected = vec![(many, 7_000), (more, 6_000), (large, 100)];
    expected.sort();
    let admin = asker("ops", Role::Admin);
    let all = pages(&core, &admin, None);
    assert!(all.len() >= 5, "{} pages", all.len());
    check_pages_hold_every_trial_once(all, &expected);
    let one = pages(&core, &admin, Some(&large.to_string()));
    assert!(
        one.len() >= 4,
        "{} pages of 100 trials of 100 KB",
        one.len()
    );
    assert!(
        one[1].experiments[0].trials[0].id.index > 0,
        "the second page continues"
    );
    check_pages_hold_every_trial_once(one, &[(large, 100)]);
}

#[test]
fn a_viewer_pages_through_their_own_team_only() {
    let mut core = core();
    let ours = grid(&mut core, "ours", "a", 10, 1);
    grid(&mut core, "theirs", "b", 10, 1);
    let viewer = asker("a", Role::Viewer);
    check_pages_hold_every_trial_once(pages(&core, &viewer, None), &[(ours, 10)]);
}

#[test]
fn an_unpaged_status_larger_than_a_frame_is_refused_before_it_is_built() {
    let mut core = core();
    let first = grid(&mut core, "first", "a", 150, 100_000);
    grid(&mut core, "second", "b", 150, 100_000);
    let admin = asker("ops", Role::Admin);
    let one = core.read_status(&admin, Some(first.to_string())).unwrap();
    assert!(matches!(one, Response::Status(list) if list[0].trials.len() == 150));
    let refused = core.read_status(&admin, None).unwrap_err().to_string();
    assert!(
        refused.starts_with("the status asked for is about 30"),
        "{refused}"
    );
    assert!(
        refused.contains("more than one answer holds (16777216)"),
        "{refused}"
    );
}
