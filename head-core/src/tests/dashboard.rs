//! Tests of what the dashboard reads from the core (`core::dashboard`): a known
//! schedule on a two-GPU node gives each trial's GPU-hours, the slots and the
//! waiting trial while it runs, replicate statistics per configuration, the
//! best trials' curves first, and a cluster history whose GPU-hours, finished
//! trials and number in system a hand computation gives, a throughput that
//! a young cluster's short window does not blow up, the parameters and their
//! importance; other teams' work is neither shown nor named.

use serde_json::Value;

use super::*;

const HOUR: u64 = 3_600_000;

/// Three configurations, two replicates each, one GPU per trial.
const SWEEP: &str = "name: dash\nteam: vision\ntrial: {command: [sleep, '{x}'], resources: {gpu: 1}}\nsearch: {algorithm: grid, space: {x: {choice: [1, 2, 3]}}, seeds: 2, metric: loss}\n";

fn everyone(_: &str) -> bool {
    true
}

fn nobody(_: &str) -> bool {
    false
}

/// Runs `key` from `start` (reporting its start unless `started`) to `end`,
/// reporting `loss` there.
fn run(
    core: &mut HeadCore,
    node: NodeId,
    key: WorkerKey,
    started: bool,
    span: (u64, u64),
    loss: f64,
) {
    let (start, end) = span;
    if !started {
        report(core, start, node, WorkerReport::Started { key, pid: 7 });
    }
    report(
        core,
        end,
        node,
        WorkerReport::Metric {
            key,
            index: 0,
            step: Some(1),
            values: vec![("loss".to_owned(), loss)],
        },
    );
    report(
        core,
        end,
        node,
        WorkerReport::Exited {
            key,
            code: Some(0),
            signal: None,
        },
    );
}

/// A core with one node of two GPUs running the first two trials of
/// [`SWEEP`], started at 0: the core, the node, the experiment and the two
/// launches.
fn two_trials_started() -> (HeadCore, NodeId, ExperimentId, Vec<(NodeId, WorkerKey)>) {
    let (mut core, node) = cluster(2, 8);
    let experiment = submit(&mut core, 0, SWEEP, false);
    let first = launches(&commands(&mut core));
    assert_eq!(first.len(), 2);
    for (_, key) in &first {
        let started = WorkerReport::Started { key: *key, pid: 7 };
        report(&mut core, 0, node, started);
    }
    (core, node, experiment, first)
}

/// Checks the views while the first two trials run: both GPUs are held (by
/// trials of `experiment`, named only to those who see them), and four trials
/// wait.
fn check_the_views_while_two_run(core: &HeadCore, experiment: ExperimentId) {
    let slots = core.gpu_slots(&everyone);
    let gpus = slots["nodes"][0]["gpus"].as_array().unwrap();
    assert_eq!(gpus.len(), 2);
    assert!(gpus.iter().all(|gpu| gpu["busy_milli"] == 1000), "{slots}");
    let held_by = gpus[0]["workers"][0]["trial"].as_str().unwrap();
    assert!(held_by.starts_with(&experiment.to_string()), "{slots}");
    let hidden = core.gpu_slots(&nobody);
    assert!(
        hidden["nodes"][0]["gpus"][0]["workers"][0]["trial"].is_null(),
        "{hidden}"
    );
    let (longest, total) = core.waiting_snapshot(&everyone).longest_waiting(2);
    assert_eq!(total, 4);
    let waiting = core.waiting_items(&longest, total);
    assert_eq!(waiting["total"], 4, "{waiting}");
    assert_eq!(waiting["items"].as_array().unwrap().len(), 2);
    assert!(waiting["items"][0]["waiting"].is_string(), "{waiting}");
    assert_eq!(
        core.waiting_snapshot(&nobody).longest_waiting(10),
        (Vec::new(), 0)
    );
}

/// Runs the trials two at a time, each for one hour, back to back, the first
/// two (`first`, already started) from 0 to 1 h; trial `i` reports loss `i + 1`.
fn must_run_the_schedule(core: &mut HeadCore, node: NodeId, first: Vec<(NodeId, WorkerKey)>) {
    let loss_of = |key: WorkerKey| f64::from(key.trial.index) + 1.0;
    let mut batch = first;
    for hour in 0..3 {
        let (start, end) = (hour * HOUR, (hour + 1) * HOUR);
        for (_, key) in &batch {
            // The first batch's starts were reported above.
            run(core, node, *key, hour == 0, (start, end), loss_of(*key));
        }
        batch = launches(&commands(core));
    }
    assert!(batch.is_empty());
}

/// Checks trial 0's detail at `now`: it held one GPU for an hour.
fn check_trial_detail(core: &HeadCore, experiment: ExperimentId, now: u64) {
    let trial = TrialId {
        experiment,
        index: 0,
    };
    // As the store gives them: newest first (other trials' are left out).
    let mut stored = events_of(core, experiment);
    stored.reverse();
    let detail = core.trial_detail(trial, now, &everyone, &stored).unwrap();
    assert!(
        (detail["allocated_gpu_hours"].as_f64().unwrap() - 1.0).abs() < 1e-9,
        "{detail}"
    );
    assert_eq!(detail["state"], "succeeded");
    assert_eq!(detail["world_size"], 1);
    assert_eq!(detail["metric"], "loss");
    let shown = detail["events"].as_array().unwrap();
    let seqs: Vec<u64> = stored
        .iter()
        .filter(|event| event.trial == trial)
        .map(|event| event.seq)
        .collect();
    assert!(!seqs.is_empty());
    assert_eq!(
        shown
            .iter()
            .map(|event| event["seq"].as_u64().unwrap())
            .collect::<Vec<_>>(),
        seqs,
        "{detail}"
    );
    assert!(core.trial_detail(trial, now, &nobody, &stored).is_err());
}

/// Checks the replicates: three configurations of two finished trials each,
/// best (lowest loss) first; seeds split a configuration into trials of one
/// config.
fn check_replicates(core: &HeadCore, experiment: ExperimentId) {
    let replicates = core
        .replicates(experiment, None, &everyone)
        .unwrap()
        .to_json();
    assert_eq!(replicates["total_groups"], 3, "{replicates}");
    let groups = replicates["groups"].as_array().unwrap();
    assert!(groups.iter().all(|group| group["n"] == 2), "{replicates}");
    let means: Vec<f64> = groups
        .iter()
        .map(|group| group["mean"].as_f64().unwrap())
        .collect();
    assert!(means.windows(2).all(|pair| pair[0] <= pair[1]), "{means:?}");
    assert!(groups[0]["ci95_low"].as_f64().unwrap() <= means[0]);
}

/// Checks the cluster at `now` over three one-hour buckets: two GPUs of two
/// all the time, two trials finished per hour, each in the system from 0 to
/// its end; and that nobody else sees the team's GPU-hours.
fn check_cluster_history(core: &HeadCore, now: u64) {
    let history = core.cluster_history(now, Some(0), 3, &everyone);
    let hours = history["gpu_hours_by_team"]["vision"].as_f64().unwrap();
    assert!((hours - 6.0).abs() < 1e-9, "{history}");
    let buckets = history["buckets"].as_array().unwrap();
    assert_eq!(buckets.len(), 3);
    let field = |bucket: &Value, name: &str| bucket[name].as_f64().unwrap();
    for (hour, bucket) in buckets.iter().enumerate() {
        assert!(
            (field(bucket, "allocated_gpus") - 2.0).abs() < 1e-9,
            "{bucket}"
        );
        assert!(
            (field(bucket, "utilization") - 1.0).abs() < 1e-9,
            "{bucket}"
        );
        // Trials ending exactly at a bucket's end count in the next one, and
        // the last bucket holds the last end: 0, 2, 4 per bucket, as the
        // window closes at `now`.
        let in_system = field(bucket, "in_system");
        assert!(
            (in_system - (6.0 - 2.0 * hour as f64)).abs() < 1e-9,
            "{bucket}"
        );
    }
    let finished: u64 = buckets
        .iter()
        .map(|bucket| bucket["finished"].as_u64().unwrap())
        .sum();
    assert_eq!(finished, 6, "{history}");
    let hidden = core.cluster_history(now, Some(0), 3, &nobody);
    assert_eq!(hidden["gpu_hours_by_team"], serde_json::json!({}));
}

#[test]
fn the_dashboard_views_follow_a_known_schedule() {
    // Two trials at a time, each for one hour, back to back: t0 and t1 from
    // 0 to 1 h, t2 and t3 from 1 h to 2 h, t4 and t5 from 2 h to 3 h.
    let (mut core, node, experiment, first) = two_trials_started();
    // A poll while they run keeps the experiment's history: the views below
    // must see it made again once the trials changed.
    let polled = core.cluster_history(HOUR / 2, Some(0), 3, &everyone);
    assert_eq!(
        core.cluster_history(HOUR / 2, Some(0), 3, &everyone),
        polled
    );
    // A snapshot made now, read after the schedule ran (as the head reads
    // one off its actor), gives the history as it was.
    let as_it_was = core.cluster_history(3 * HOUR, Some(0), 3, &everyone);
    let snapshot = core.cluster_snapshot(3 * HOUR, Some(0), 3, &everyone);
    check_the_views_while_two_run(&core, experiment);
    must_run_the_schedule(&mut core, node, first);
    assert_ne!(
        core.cluster_history(3 * HOUR, Some(0), 3, &everyone),
        as_it_was
    );
    assert_eq!(snapshot.to_json(), as_it_was);
    core.check_invariants();
    let now = 3 * HOUR;
    check_trial_detail(&core, experiment, now);
    check_replicates(&core, experiment);

    // The best curves first: the lowest losses belong to the lowest indices.
    let (metric, chosen) = core
        .curve_trials(experiment, None, None, 2, &everyone)
        .unwrap();
    assert_eq!(metric, "loss");
    assert_eq!(
        chosen.iter().map(|id| id.index).collect::<Vec<_>>(),
        vec![0, 1]
    );
    check_cluster_history(&core, now);
    check_throughput(&core, now);
    // Unread for a minute, the kept histories go; made again, they agree.
    let kept = core.cluster_history(now, Some(0), 3, &everyone);
    core.histories.forget_unread(now + 61_000);
    assert_eq!(core.cluster_history(now, Some(0), 3, &everyone), kept);
    check_parameter_study(&core, experiment);
}

/// Throughput over one-hour buckets is what finished in each (0, 2, 4 per
/// hour); over a young window of five one-second buckets, the two trials
/// that ended in the last are counted over a minute, not a second.
fn check_throughput(core: &HeadCore, now: u64) {
    let rates = |history: &Value| -> Vec<f64> {
        history["buckets"]
            .as_array()
            .unwrap()
            .iter()
            .map(|bucket| bucket["throughput_per_hour"].as_f64().unwrap())
            .collect()
    };
    let hourly = core.cluster_history(now, Some(0), 3, &everyone);
    assert_eq!(rates(&hourly), [0.0, 2.0, 4.0], "{hourly}");
    let young = core.cluster_history(now, Some(now - 5000), 60, &everyone);
    let young_rates = rates(&young);
    assert_eq!(young_rates.len(), 5, "{young}");
    assert!((young_rates[4] - 120.0).abs() < 1e-9, "{young}");
}

/// The parameter study: the one parameter `x` (a choice), six finished
/// trials, and PED-ANOVA rating `x` alone at 1; nobody else sees it.
fn check_parameter_study(core: &HeadCore, experiment: ExperimentId) {
    let study = core.parameter_study(experiment, None, &everyone).unwrap();
    assert_eq!(study.observations.len(), 6);
    let answer = study.to_json();
    assert_eq!(answer["parameters"][0]["name"], "x", "{answer}");
    assert_eq!(answer["parameters"][0]["scale"], "categorical", "{answer}");
    assert_eq!(answer["importance"]["method"], "PED-ANOVA", "{answer}");
    assert_eq!(answer["importance"]["status"], "rated", "{answer}");
    assert_eq!(
        answer["importance"]["values"],
        serde_json::json!([{"name": "x", "importance": 1.0}]),
        "{answer}"
    );
    assert!(core.parameter_study(experiment, None, &nobody).is_err());
}

#[test]
fn a_cluster_without_nodes_has_zero_gpus_and_too_few_trials_are_not_rated() {
    let mut core = HeadCore::restore(CONFIG, LoadedState::default(), 0);
    let history = core.cluster_history(1000, None, 60, &everyone);
    assert_eq!(history["capacity_gpus"].to_string(), "0.0", "not -0.0");
    let experiment = submit(&mut core, 0, SWEEP, false);
    let answer = core
        .parameter_study(experiment, None, &everyone)
        .unwrap()
        .to_json();
    assert_eq!(
        answer["importance"]["status"], "not_enough_trials",
        "{answer}"
    );
    assert_eq!(answer["importance"]["trials"], 0, "{answer}");
}

#[test]
fn the_queue_page_chooses_on_a_snapshot_and_leaves_out_trials_started_since() {
    let (mut core, node, _, first) = two_trials_started();
    let snapshot = core.waiting_snapshot(&everyone);
    // The first two end, and two of the four waiting start.
    for (_, key) in first {
        run(&mut core, node, key, true, (0, HOUR), 1.0);
    }
    assert_eq!(launches(&commands(&mut core)).len(), 2);
    let (chosen, total) = snapshot.longest_waiting(10);
    assert_eq!(
        (chosen.len(), total),
        (4, 4),
        "the snapshot is the book as it was"
    );
    let page = core.waiting_items(&chosen, total);
    let shown: Vec<&str> = page["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|item| item["trial"].as_str().unwrap())
        .collect();
    let (still, now_waiting) = core.waiting_snapshot(&everyone).longest_waiting(10);
    assert_eq!(now_waiting, 2);
    let still: Vec<String> = still.iter().map(ToString::to_string).collect();
    assert_eq!(
        shown, still,
        "only those still queued, longest waiting first"
    );
    // Once persisted, the changed trials are read from the queued index
    // alone: the same choice and count.
    core.take_records();
    let persisted = core.waiting_snapshot(&everyone).longest_waiting(10);
    let persisted_ids: Vec<String> = persisted.0.iter().map(ToString::to_string).collect();
    assert_eq!((persisted_ids, persisted.1), (still, 2));
    assert_eq!(
        core.waiting_snapshot(&nobody).longest_waiting(10),
        (vec![], 0)
    );
}
