//! Tests of the paged views: every listing walked page by page returns each
//! item exactly once in its order, cursors survive inserts, limits and the page
//! byte budget hold, filters and visibility apply, and summaries agree with
//! `xp status`.

use std::collections::BTreeMap;

use xp_runtime::ids::{ExperimentId, NodeId, TrialId};
use xp_runtime::protocol::{
    ExperimentState, NodeRegistration, NodeResources, SubmitRequest, TrialState,
};

use super::*;
use crate::{CoreConfig, HeadCore, LoadedState};

fn core() -> HeadCore {
    HeadCore::restore(CoreConfig::default(), LoadedState::default(), 0)
}

/// Submits a grid of `trials` command trials of `team` at `now`, optimizing
/// `loss` (smaller is better unless `maximize`).
fn submit(
    core: &mut HeadCore,
    now: u64,
    name: &str,
    team: &str,
    trials: u32,
    maximize: bool,
) -> ExperimentId {
    let choices: Vec<String> = (0..trials).map(|index| index.to_string()).collect();
    let yaml = format!(
        "name: {name}\nteam: {team}\ntrial: {{command: [echo, '{{x}}']}}\nsearch: {{algorithm: grid, space: {{x: {{choice: [{}]}}}}, metric: loss, mode: {}}}\n",
        choices.join(", "),
        if maximize { "max" } else { "min" },
    );
    let spec = xp_runtime::spec::ExperimentSpec::from_yaml(&yaml).unwrap();
    let request = SubmitRequest {
        spec_json: spec.to_canonical_json(),
        program: None,
        code_version: "none".to_owned(),
        data_version: "none".to_owned(),
        rerun: false,
    };
    core.handle_submit(now, &request).unwrap().0
}

fn id(experiment: ExperimentId, index: u32) -> TrialId {
    TrialId { experiment, index }
}

/// Sets a trial's state and, when given, its last `loss`.
fn set(core: &mut HeadCore, trial: TrialId, state: TrialState, loss: Option<f64>) {
    let record = core.book.trial_mut(trial).unwrap();
    record.state = state;
    if let Some(loss) = loss {
        record.metrics.insert("loss".into(), loss);
    }
}

fn everyone(_: &str) -> bool {
    true
}

/// Every page of a trial listing from the start, checking on the way that each
/// page has at most `limit` items, carries the same total, and that only the
/// last one lacks a cursor; the trial indexes in order, and the total.
fn walk(core: &HeadCore, experiment: ExperimentId, query: &TrialQuery) -> (Vec<u32>, u64) {
    let mut query = query.clone();
    let mut indexes = Vec::new();
    let mut total = None;
    for _ in 0..10_000 {
        let page = core.trials_page(experiment, &query, &everyone).unwrap();
        assert!(page.items.len() <= query.limit.clamp(1, MAX_LIMIT));
        assert_eq!(*total.get_or_insert(page.total), page.total);
        indexes.extend(page.items.iter().map(|trial| trial.id.index));
        match page.next_cursor {
            Some(text) => {
                assert!(!page.items.is_empty(), "a page with a cursor has items");
                query.cursor = Some(TrialCursor::decode(&text, query.sort).unwrap());
            }
            None => return (indexes, total.unwrap()),
        }
    }
    panic!("the listing never ended");
}

fn query(sort: TrialSort, limit: usize) -> TrialQuery {
    TrialQuery {
        limit,
        sort,
        ..TrialQuery::default()
    }
}

/// The expected order of `indexes` with their losses under a metric sort:
/// trials with a (non-NaN) value first, by value (`descending` or not), ties by
/// index; then the rest by index.
fn by_loss(losses: &BTreeMap<u32, Option<f64>>, descending: bool) -> Vec<u32> {
    let mut with: Vec<(f64, u32)> = losses
        .iter()
        .filter_map(|(index, loss)| {
            loss.filter(|loss| !loss.is_nan())
                .map(|loss| (loss, *index))
        })
        .collect();
    with.sort_by(|one, other| {
        let by_value = if descending {
            other.0.total_cmp(&one.0)
        } else {
            one.0.total_cmp(&other.0)
        };
        by_value.then(one.1.cmp(&other.1))
    });
    let without = losses
        .iter()
        .filter(|(_, loss)| loss.is_none_or(f64::is_nan))
        .map(|(index, _)| *index);
    with.into_iter()
        .map(|(_, index)| index)
        .chain(without)
        .collect()
}

#[test]
fn id_orders_return_every_trial_once() {
    let mut core = core();
    let experiment = submit(&mut core, 1, "grid", "a", 50, false);
    let other = submit(&mut core, 2, "other", "a", 5, false);
    for limit in [1, 7, 50, 51, 1000] {
        let (ascending, total) = walk(&core, experiment, &query(TrialSort::Id, limit));
        assert_eq!(ascending, (0..50).collect::<Vec<_>>(), "limit {limit}");
        assert_eq!(total, 50, "another experiment's trials are not counted");
        let (descending, _) = walk(&core, experiment, &query(TrialSort::IdDesc, limit));
        assert_eq!(
            descending,
            (0..50).rev().collect::<Vec<_>>(),
            "limit {limit}"
        );
    }
    assert_eq!(
        walk(&core, other, &query(TrialSort::Id, 2)).0,
        vec![0, 1, 2, 3, 4]
    );
}

#[test]
fn metric_orders_put_trials_without_the_metric_last() {
    let mut core = core();
    let experiment = submit(&mut core, 1, "grid", "a", 40, false);
    let mut losses = BTreeMap::new();
    for index in 0..40u32 {
        // Ties, negatives, infinities, NaN (sorted as missing) and no value.
        let loss = match index % 8 {
            0 => None,
            1 => Some(f64::NAN),
            2 => Some(1.5),
            3 => Some(-2.0),
            4 => Some(f64::INFINITY),
            5 => Some(f64::NEG_INFINITY),
            _ => Some(f64::from(index) / 10.0),
        };
        set(&mut core, id(experiment, index), TrialState::Running, loss);
        losses.insert(index, loss);
    }
    for limit in [1, 3, 40, 1000] {
        let (ascending, total) = walk(&core, experiment, &query(TrialSort::Metric, limit));
        assert_eq!(total, 40);
        assert_eq!(ascending, by_loss(&losses, false), "limit {limit}");
        let (descending, _) = walk(&core, experiment, &query(TrialSort::MetricDesc, limit));
        assert_eq!(descending, by_loss(&losses, true), "limit {limit}");
    }
}

#[test]
fn a_named_metric_is_sorted_by_and_a_missing_one_is_an_error() {
    let mut core = core();
    let experiment = submit(&mut core, 1, "grid", "a", 4, false);
    for (index, accuracy) in [(0, 0.5), (1, 0.9), (2, 0.7)] {
        core.book
            .trial_mut(id(experiment, index))
            .unwrap()
            .metrics
            .insert("accuracy".into(), accuracy);
    }
    let mut by_accuracy = query(TrialSort::MetricDesc, 10);
    by_accuracy.metric = Some("accuracy".to_owned());
    assert_eq!(walk(&core, experiment, &by_accuracy).0, vec![1, 2, 0, 3]);

    let yaml = "name: plain\ntrial: {command: [echo, '{x}']}\nsearch: {algorithm: grid, space: {x: {choice: [1, 2]}}}\n";
    let spec = xp_runtime::spec::ExperimentSpec::from_yaml(yaml).unwrap();
    let request = SubmitRequest {
        spec_json: spec.to_canonical_json(),
        program: None,
        code_version: "none".to_owned(),
        data_version: "none".to_owned(),
        rerun: false,
    };
    let plain = core.handle_submit(2, &request).unwrap().0;
    assert_eq!(
        core.trials_page(plain, &query(TrialSort::Metric, 10), &everyone)
            .err(),
        Some(PageError::NoMetric {
            experiment_id: plain
        })
    );
}

#[test]
fn the_state_filter_counts_and_lists_only_its_states() {
    let mut core = core();
    let experiment = submit(&mut core, 1, "grid", "a", 30, false);
    for index in 0..30 {
        let state = match index % 3 {
            0 => TrialState::Running,
            1 => TrialState::Succeeded,
            _ => TrialState::Failed,
        };
        set(
            &mut core,
            id(experiment, index),
            state,
            Some(f64::from(30 - index)),
        );
    }
    // Stored: the finished trials are counted by state, not looked at.
    core.take_records();
    for sort in TrialSort::ALL {
        let mut wanted = query(sort, 4);
        wanted.states = StateSet::parse("running,failed").unwrap();
        let (indexes, total) = walk(&core, experiment, &wanted);
        assert_eq!(total, 20, "{sort:?}");
        let mut sorted = indexes.clone();
        sorted.sort_unstable();
        let expected: Vec<u32> = (0..30).filter(|index| index % 3 != 1).collect();
        assert_eq!(sorted, expected, "{sort:?}: each once");
    }
    let unknown = |name: &str| {
        Err(UnknownState {
            name: name.to_owned(),
        })
    };
    assert_eq!(StateSet::parse("running,nope"), unknown("nope"));
    assert_eq!(StateSet::parse(""), unknown(""));
    for state in STATES {
        assert_eq!(
            StateSet::parse(state.as_str()).map(|set| set.contains(state)),
            Ok(true)
        );
    }
}

#[test]
fn an_id_cursor_survives_trials_added_meanwhile() {
    let mut core = core();
    let experiment = submit(&mut core, 1, "grid", "a", 20, false);
    let first = core
        .trials_page(experiment, &query(TrialSort::Id, 8), &everyone)
        .unwrap();
    let cursor = TrialCursor::decode(first.next_cursor.as_ref().unwrap(), TrialSort::Id).unwrap();
    // An adaptive search adds trials at the end while a client pages.
    for index in 20..25 {
        let mut added = core.book.trial(id(experiment, 0)).clone();
        added.id = id(experiment, index);
        core.book.restore_trial(added.into());
    }
    let mut rest = query(TrialSort::Id, 8);
    rest.cursor = Some(cursor);
    let (after, total) = walk(&core, experiment, &rest);
    let seen: Vec<u32> = first
        .items
        .iter()
        .map(|trial| trial.id.index)
        .chain(after)
        .collect();
    assert_eq!(seen, (0..25).collect::<Vec<_>>());
    assert_eq!(total, 25);
}

#[test]
fn cursors_at_the_ends_of_the_index_range_give_empty_pages() {
    let mut core = core();
    let experiment = submit(&mut core, 1, "grid", "a", 3, false);
    for (sort, text) in [
        (TrialSort::Id, "id:4294967295"),
        (TrialSort::IdDesc, "-id:0"),
    ] {
        let mut past = query(sort, 10);
        past.cursor = Some(TrialCursor::decode(text, sort).unwrap());
        let page = core.trials_page(experiment, &past, &everyone).unwrap();
        assert_eq!(
            (page.items.len(), page.next_cursor, page.total),
            (0, None, 3)
        );
    }
}

#[test]
fn a_metric_cursor_continues_strictly_after_its_key() {
    let mut core = core();
    let experiment = submit(&mut core, 1, "grid", "a", 20, false);
    for index in 0..20 {
        set(
            &mut core,
            id(experiment, index),
            TrialState::Running,
            Some(f64::from(index % 5)),
        );
    }
    let first = core
        .trials_page(experiment, &query(TrialSort::Metric, 6), &everyone)
        .unwrap();
    let first_indexes: Vec<u32> = first.items.iter().map(|trial| trial.id.index).collect();
    // Losses 0 (indexes 0, 5, 10, 15) then 1 (1, 6, ...): the page ends inside a tie.
    assert_eq!(first_indexes, vec![0, 5, 10, 15, 1, 6]);
    let cursor =
        TrialCursor::decode(first.next_cursor.as_ref().unwrap(), TrialSort::Metric).unwrap();
    // A new trial that sorts before the cursor is not shown later; one after it is.
    for (index, loss) in [(20, 0.5), (21, 3.5)] {
        let mut added = core.book.trial(id(experiment, 0)).clone();
        added.id = id(experiment, index);
        added.metrics.insert("loss".into(), loss);
        core.book.restore_trial(added.into());
    }
    let mut rest = query(TrialSort::Metric, 6);
    rest.cursor = Some(cursor);
    let (after, _) = walk(&core, experiment, &rest);
    assert_eq!(
        after,
        vec![11, 16, 2, 7, 12, 17, 3, 8, 13, 18, 21, 4, 9, 14, 19]
    );
}

#[test]
fn limits_are_clamped_and_the_byte_budget_ends_a_page_early() {
    let mut core = core();
    let experiment = submit(&mut core, 1, "grid", "a", 1200, false);
    let page = |core: &HeadCore, limit| {
        core.trials_page(experiment, &query(TrialSort::Id, limit), &everyone)
            .unwrap()
    };
    assert_eq!(page(&core, 0).items.len(), 1);
    let largest = page(&core, 100_000);
    assert_eq!(largest.items.len(), MAX_LIMIT);
    assert_eq!(largest.total, 1200);
    assert!(largest.next_cursor.is_some());
    assert_eq!(page(&core, DEFAULT_LIMIT).items.len(), DEFAULT_LIMIT);

    // Large configurations: a page stops once past the budget, and the walk
    // still returns every trial once.
    for index in 0..1200 {
        let config = format!("{{\"pad\": \"{}\"}}", "x".repeat(50_000 + index as usize));
        core.book
            .trial_mut(id(experiment, index))
            .unwrap()
            .config_json = config;
    }
    let budgeted = page(&core, MAX_LIMIT);
    assert!(
        budgeted.items.len() < 100 && !budgeted.items.is_empty(),
        "{} items",
        budgeted.items.len()
    );
    let bytes: usize = budgeted
        .items
        .iter()
        .map(|trial| trial.config_json.len())
        .sum();
    assert!(bytes < 2 * MAX_PAGE_BYTES, "{bytes} bytes");
    let (all, _) = walk(&core, experiment, &query(TrialSort::Id, MAX_LIMIT));
    assert_eq!(all, (0..1200).collect::<Vec<_>>());
}

#[test]
fn cursors_round_trip_and_refuse_what_they_did_not_write() {
    for sort in TrialSort::ALL {
        for (index, value) in [(0, None), (7, Some(-0.25)), (u32::MAX, Some(f64::INFINITY))] {
            let cursor = TrialCursor {
                sort,
                index,
                value: value.filter(|_| sort.by_metric()),
            };
            assert_eq!(TrialCursor::decode(&cursor.encode(), sort), Ok(cursor));
        }
    }
    for garbage in [
        "",
        "garbage",
        "id:",
        "id:x",
        "id:+3",
        "id:-3",
        "id:99999999999",
        "metric:3",
        "metric:zz:3",
        "metric:3ff0:3",
        "up:3",
        "id:3:4",
    ] {
        let sort = if garbage.starts_with("metric") {
            TrialSort::Metric
        } else {
            TrialSort::Id
        };
        assert_eq!(
            TrialCursor::decode(garbage, sort),
            Err(CursorError::Malformed),
            "{garbage:?}"
        );
    }
    assert_eq!(
        TrialCursor::decode("id:3", TrialSort::MetricDesc),
        Err(CursorError::OtherSort {
            cursor: "id".to_owned(),
            wanted: "-metric"
        })
    );
    assert_eq!(MetricCursor::decode("m:12"), Ok(MetricCursor(12)));
    assert_eq!(MetricCursor::decode("m:+12"), Err(CursorError::Malformed));
    assert_eq!(MetricCursor::decode("id:12"), Err(CursorError::Malformed));
    assert_eq!(
        ExperimentCursor::decode("e:1:nothex"),
        Err(CursorError::Malformed)
    );
    assert_eq!(NodeCursor::decode("n:nope"), Err(CursorError::Malformed));
}

#[test]
fn experiments_come_newest_first_and_page_through_ties() {
    let mut core = core();
    let mut submitted = Vec::new();
    for (at, name) in [
        (5, "e1"),
        (9, "e2"),
        (5, "e3"),
        (7, "e4"),
        (9, "e5"),
        (1, "e6"),
    ] {
        submitted.push((at, submit(&mut core, at, name, "a", 2, false)));
    }
    // Newest first; equal times by id.
    submitted.sort_by_key(|(at, id)| (std::cmp::Reverse(*at), *id));
    let expected: Vec<ExperimentId> = submitted.iter().map(|(_, id)| *id).collect();
    for limit in [1, 2, 4, 6, 10] {
        let mut cursor = None;
        let mut seen = Vec::new();
        loop {
            let page = core.experiments_page(limit, cursor, &everyone);
            assert_eq!(page.total, 6);
            assert!(page.items.len() <= limit);
            seen.extend(page.items.iter().map(|summary| summary.id));
            match page.next_cursor {
                Some(text) => cursor = Some(ExperimentCursor::decode(&text).unwrap()),
                None => break,
            }
        }
        assert_eq!(seen, expected, "limit {limit}");
    }
}

#[test]
fn what_is_not_visible_is_neither_counted_nor_found() {
    let mut core = core();
    let ours = submit(&mut core, 1, "ours", "vision", 3, false);
    let theirs = submit(&mut core, 2, "theirs", "speech", 3, false);
    let vision = |team: &str| team == "vision";
    let page = core.experiments_page(10, None, &vision);
    assert_eq!(page.total, 1);
    assert_eq!(
        page.items
            .iter()
            .map(|summary| summary.id)
            .collect::<Vec<_>>(),
        vec![ours]
    );
    assert!(
        core.trials_page(ours, &TrialQuery::default(), &vision)
            .is_ok()
    );
    assert_eq!(
        core.trials_page(theirs, &TrialQuery::default(), &vision)
            .err(),
        Some(PageError::ExperimentNotFound {
            experiment_id: theirs
        })
    );
    assert_eq!(
        core.experiment_summary_of(theirs, &vision)
            .map(|summary| summary.id),
        Err(PageError::ExperimentNotFound {
            experiment_id: theirs
        })
    );
    assert_eq!(core.check_trial_visible(id(ours, 2), &vision), Ok(()));
    for hidden in [id(theirs, 0), id(ours, 3)] {
        assert_eq!(
            core.check_trial_visible(hidden, &vision),
            Err(PageError::TrialNotFound { trial_id: hidden })
        );
    }
}

#[test]
fn a_summary_counts_states_and_picks_the_best_as_status_does() {
    let mut core = core();
    let minimize = submit(&mut core, 1, "min", "a", 8, false);
    let maximize = submit(&mut core, 2, "max", "a", 8, true);
    for experiment in [minimize, maximize] {
        let trials = [
            (TrialState::Succeeded, Some(3.0)),
            (TrialState::Succeeded, Some(1.0)),
            (TrialState::Succeeded, Some(1.0)),
            (TrialState::Succeeded, Some(f64::NAN)),
            (TrialState::Running, Some(0.5)),
            (TrialState::Failed, Some(9.0)),
            (TrialState::Succeeded, None),
            (TrialState::Queued, None),
        ];
        for (index, (state, loss)) in trials.into_iter().enumerate() {
            set(&mut core, id(experiment, index as u32), state, loss);
        }
    }
    let summary = core.experiment_summary_of(minimize, &everyone).unwrap();
    assert_eq!(summary.trials, 8);
    assert_eq!(
        summary.counts.nonzero().collect::<Vec<_>>(),
        vec![
            (TrialState::Queued, 1),
            (TrialState::Running, 1),
            (TrialState::Succeeded, 5),
            (TrialState::Failed, 1),
        ]
    );
    assert_eq!(
        summary.best,
        Some(BestTrial {
            trial: id(minimize, 1),
            value: 1.0
        }),
        "the first of equals among succeeded trials; a running trial's better value does not count"
    );
    let best = core
        .experiment_summary_of(maximize, &everyone)
        .unwrap()
        .best;
    assert_eq!(
        best,
        Some(BestTrial {
            trial: id(maximize, 0),
            value: 3.0
        })
    );

    // The state agrees with `xp status` as the trials finish or are cancelled.
    let check_state = |core: &HeadCore, expected: ExperimentState| {
        let summary = core.experiment_summary_of(minimize, &everyone).unwrap();
        assert_eq!(summary.state, expected);
        assert_eq!(core.experiment_state(minimize), expected);
    };
    check_state(&core, ExperimentState::Running);
    set(&mut core, id(minimize, 4), TrialState::Succeeded, None);
    set(&mut core, id(minimize, 7), TrialState::Stopped, None);
    check_state(&core, ExperimentState::Succeeded);
    for index in 0..8 {
        set(&mut core, id(minimize, index), TrialState::Failed, None);
    }
    check_state(&core, ExperimentState::Failed);
    core.book.experiment_mut(minimize).unwrap().cancelled = true;
    check_state(&core, ExperimentState::Cancelled);
}

fn registration(seed: u8) -> NodeRegistration {
    NodeRegistration {
        node_id: NodeId(uuid::Uuid::from_bytes([seed; 16])),
        name: format!("node-{seed}"),
        advertise_host: "127.0.0.1".to_owned(),
        resources: NodeResources {
            gpus: Vec::new(),
            cpu_milli: 4000,
            memory_bytes: 1 << 30,
        },
        labels: BTreeMap::new(),
        running: Vec::new(),
        objects: None,
        held_objects: Vec::new(),
        isolation: xp_runtime::protocol::NodeIsolation::default(),
    }
}

#[test]
fn nodes_page_by_id() {
    let mut core = core();
    for seed in [5, 1, 4, 2, 3] {
        core.handle_node_register(0, registration(seed));
    }
    let mut cursor = None;
    let mut seen = Vec::new();
    loop {
        let page = core.nodes_page(2, cursor);
        assert_eq!(page.total, 5);
        assert!(page.items.len() <= 2);
        seen.extend(page.items.iter().map(|node| node.name.clone()));
        match page.next_cursor {
            Some(text) => cursor = Some(NodeCursor::decode(&text).unwrap()),
            None => break,
        }
    }
    assert_eq!(seen, ["node-1", "node-2", "node-3", "node-4", "node-5"]);
    let whole = core.nodes_status();
    let paged = core.nodes_page(MAX_LIMIT, None).items;
    assert_eq!(
        serde_json::to_value(&whole).unwrap(),
        serde_json::to_value(&paged).unwrap(),
        "a page shows nodes exactly as `xp nodes` does"
    );
}

#[test]
fn queues_page_by_name_and_team() {
    let mut core = core();
    let policy = "queues:\n  - {name: q-b, team: b}\n  - {name: q-a, team: a}\n  - {name: q-open}\n  - {name: q-a2, team: a}\n";
    let config = xp_sched::PolicyConfig::from_yaml(policy).unwrap();
    core.placement = crate::state::Placement::new(config, None);
    let all = core.queues_page(MAX_LIMIT, None, &everyone);
    let names = |page: &Page<QueueStatus>| -> Vec<String> {
        page.items.iter().map(|queue| queue.name.clone()).collect()
    };
    assert_eq!(names(&all), ["q-a", "q-a2", "q-b", "q-open"]);
    let only_a = |team: &str| team == "a";
    let first = core.queues_page(2, None, &only_a);
    assert_eq!(
        (names(&first), first.total),
        (vec!["q-a".to_owned(), "q-a2".to_owned()], 3)
    );
    let cursor = QueueCursor::decode(first.next_cursor.as_ref().unwrap()).unwrap();
    let second = core.queues_page(2, Some(&cursor), &only_a);
    assert_eq!(
        names(&second),
        ["q-open"],
        "a queue open to every team is seen by all"
    );
    assert_eq!(second.next_cursor, None);
}
