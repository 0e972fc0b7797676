//! Tests of `xp status` in pages: every trial comes once, in order, in
//! answers bounded in trials and bytes, to whoever may see it; and the
//! unpaged answer is refused before it is built when it would not fit a frame.

use xp_runtime::protocol::{FrontStatus, FrontTrial, StatusPage, SubmitRequest};
use xp_runtime::spec::ExperimentSpec;

use super::fronts::header_bytes;
use super::*;
use crate::auth::{Principal, Role};
use crate::pages::estimated_bytes;
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

/// The answer `served` gives, with its fronts.
fn answered(served: Served) -> Response {
    match served {
        Served::Answer(response) => response,
        Served::Status(pending) => pending.complete(),
        other => panic!("a status is answered by the core, not {other:?}"),
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
        let Response::StatusPage(page) = answered(core.read_status_page(asker, query).unwrap())
        else {
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
    let one = answered(core.read_status(&admin, Some(first.to_string())).unwrap());
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

/// The page of experiment `id` from trial `from` on, as an admin sees it.
fn page_of(core: &HeadCore, id: ExperimentId, from: Option<StatusCursor>) -> StatusPage {
    let query = StatusQuery {
        experiment: Some(id.to_string()),
        from,
    };
    let admin = asker("ops", Role::Admin);
    let Response::StatusPage(page) = answered(core.read_status_page(&admin, query).unwrap()) else {
        panic!("a status page answers a status page request");
    };
    page
}

/// A front of `size` copies of the page's first trial, set on its first
/// experiment.
fn set_front(page: &mut StatusPage, size: usize) {
    let member = page.experiments[0].trials[0].id;
    page.experiments[0].front = Some(FrontStatus {
        reference: vec![0.0, 0.0],
        reference_declared: false,
        hypervolume: 1.0,
        evaluated: size as u32,
        trials: vec![
            FrontTrial {
                trial: member,
                values: vec![0.0, 0.0],
                contribution: 0.0,
            };
            size
        ],
    });
}

#[test]
fn a_page_that_its_front_takes_over_the_budget_gives_its_last_trials_to_the_next() {
    let mut core = core();
    let id = grid(&mut core, "mo", "a", 7_000, 1);
    let mut first = page_of(&core, id, None);
    assert_eq!(first.experiments[0].trials.len(), MAX_STATUS_PAGE_TRIALS);
    // A front of 40,000 trials counts 2.5 MB: with 5,000 trials of about
    // 400 bytes the page is over its 4 MiB.
    set_front(&mut first, 40_000);
    fronts::trim_to_budget(&mut first);
    let kept = first.experiments[0].trials.len();
    assert!(
        (1..MAX_STATUS_PAGE_TRIALS).contains(&kept),
        "{kept} trials kept"
    );
    let bytes: usize = header_bytes(&first.experiments[0])
        + first.experiments[0]
            .trials
            .iter()
            .map(estimated_bytes)
            .sum::<usize>();
    assert!(bytes <= MAX_STATUS_PAGE_BYTES, "{bytes} bytes");
    let next = first.next.expect("the trials given up come next");
    assert_eq!((next.experiment, next.trial), (id, kept as u32));
    // The pages that follow hold the rest, once, without the front.
    let mut all = vec![first];
    let mut from = Some(next);
    while let Some(cursor) = from {
        let page = page_of(&core, id, Some(cursor));
        assert!(page.experiments[0].front.is_none());
        from = page.next;
        all.push(page);
    }
    check_pages_hold_every_trial_once(all, &[(id, 7_000)]);
}

#[test]
fn a_front_alone_over_the_budget_keeps_one_trial() {
    let mut core = core();
    let id = grid(&mut core, "mo", "a", 10, 1);
    let mut page = page_of(&core, id, None);
    set_front(&mut page, 100_000);
    fronts::trim_to_budget(&mut page);
    assert_eq!(page.experiments[0].trials.len(), 1);
    let next = page.next.expect("nine trials come next");
    assert_eq!((next.experiment, next.trial), (id, 1));
}

#[test]
fn a_page_made_off_the_actor_shows_the_book_as_it_was_when_asked_with_why_trials_wait() {
    let mut core = core();
    let id = grid(&mut core, "queued", "a", 3, 1);
    let expected = core.status(Some(&id.to_string())).unwrap().remove(0);
    assert!(
        expected.trials.iter().all(|trial| trial.waiting.is_some()),
        "no node: every trial waits, saying why"
    );
    let query = StatusQuery {
        experiment: Some(id.to_string()),
        from: None,
    };
    let admin = asker("ops", Role::Admin);
    let Served::Status(pending) = core.read_status_page(&admin, query).unwrap() else {
        panic!("a status page is made off the actor");
    };
    // The experiment is cancelled before the page is made.
    core.handle_cancel(2, &id.to_string()).unwrap();
    let Response::StatusPage(page) = pending.complete() else {
        panic!("a status page answers a status page request");
    };
    assert_eq!(page.next, None);
    assert_eq!(
        serde_json::to_value(&page.experiments).unwrap(),
        serde_json::to_value([expected]).unwrap(),
        "the same as the actor's own status"
    );
    let now = core.status(Some(&id.to_string())).unwrap().remove(0);
    assert!(now.trials.iter().all(|trial| trial.waiting.is_none()));
}
