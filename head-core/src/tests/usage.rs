//! Tests of `xp report` in the core: a known schedule on a two-GPU node gives
//! the GPU-hours, the hour lost to a failure, the cost at the policy's price,
//! utilisation against the node's up-time (closed when it is lost), and
//! Little's law; the scope is judged against what the caller sees.

use xp_runtime::protocol::{AdminAction, AdminRequest, ReportRequest};

use super::*;
use crate::ReportScope;
use crate::auth::Visibility;

const HOUR: u64 = 3_600_000;

const SWEEP: &str = "name: two\nteam: vision\ntrial: {command: [sleep, '{x}'], resources: {gpu: 1}, max_retries: 1}\nsearch: {algorithm: grid, space: {x: {choice: [1, 2]}}, metric: acc, mode: max, value: {per_unit: 10}}\n";

/// Trial 0 runs 1 s to 1 h + 1 s and succeeds with acc 0.5; trial 1 fails at
/// half an hour (no checkpoint: all lost), runs again at once and succeeds
/// with acc 0.75 at 1 h + 1 s.
fn known_schedule() -> (HeadCore, NodeId, ExperimentId) {
    let mut core = HeadCore::restore(CONFIG, LoadedState::default(), 0);
    core.handle_admin(
        0,
        AdminRequest {
            action: AdminAction::ApplyPolicy {
                yaml: "prices: {default: 2.0}\n".to_owned(),
            },
            who: "alice".to_owned(),
            why: "prices".to_owned(),
        },
    )
    .unwrap();
    let node = node_id(1);
    core.handle_node_register(0, registration(node, 2, 4, Vec::new()));
    let experiment = submit(&mut core, 1_000, SWEEP, false);
    let placed = launches(&commands(&mut core));
    assert_eq!(placed.len(), 2);
    for (host, key) in &placed {
        report(
            &mut core,
            1_000,
            *host,
            WorkerReport::Started { key: *key, pid: 7 },
        );
    }
    let (first, second) = (placed[0].1, placed[1].1);
    exited(&mut core, HOUR / 2 + 1_000, node, second, 1);
    let retry = launches(&commands(&mut core));
    assert_eq!(retry.len(), 1);
    let retried = retry[0].1;
    report(
        &mut core,
        HOUR / 2 + 1_000,
        node,
        WorkerReport::Started {
            key: retried,
            pid: 8,
        },
    );
    for (key, value) in [(first, 0.5), (retried, 0.75)] {
        report(
            &mut core,
            HOUR,
            node,
            WorkerReport::Metric {
                key,
                index: 0,
                step: Some(1),
                values: vec![("acc".to_owned(), value)],
            },
        );
    }
    exited(&mut core, HOUR + 1_000, node, first, 0);
    exited(&mut core, HOUR + 1_000, node, retried, 0);
    assert_eq!(trial_state(&core, experiment, 0), TrialState::Succeeded);
    assert_eq!(trial_state(&core, experiment, 1), TrialState::Succeeded);
    (core, node, experiment)
}

/// A report's snapshot reads the book as it was when taken, however the
/// book changes while the head computes the report off its actor.
#[test]
fn a_snapshot_reads_the_book_as_it_was_when_taken() {
    let (mut core, node, _) = known_schedule();
    let scope = ReportScope::Cluster;
    let before = core.report(2 * HOUR, &scope, None).unwrap();
    let snapshot = core.report_snapshot(2 * HOUR, &scope, None).unwrap();
    // New work runs and fails, and the node leaves, after the snapshot.
    let other = SWEEP.replace("two", "three").replace("sleep", "echo");
    submit(&mut core, HOUR + 2_000, &other, false);
    let placed = launches(&commands(&mut core));
    assert_eq!(placed.len(), 2);
    for (host, key) in &placed {
        let started = WorkerReport::Started { key: *key, pid: 9 };
        report(&mut core, HOUR + 2_000, *host, started);
    }
    exited(&mut core, HOUR + 3_000, node, placed[0].1, 1);
    core.handle_node_left(HOUR + 4_000, node);
    assert_ne!(core.report(2 * HOUR, &scope, None).unwrap(), before);
    assert_eq!(snapshot.report(), before);
}

fn close(actual: f64, expected: f64) {
    assert!((actual - expected).abs() < 1e-9, "{actual} != {expected}");
}

#[test]
fn a_known_schedule_gives_the_hand_computed_figures() {
    let (core, _, experiment) = known_schedule();
    let report = core
        .report(2 * HOUR, &ReportScope::Experiment(experiment), None)
        .unwrap();
    // Every trial finished: the window is first arrival to last finish.
    assert_eq!(
        (report.window_start, report.window_end),
        (1_000, HOUR + 1_000)
    );
    // 1 h + 0.5 h + 0.5 h on one GPU each; the failed half hour is redone.
    close(report.gpu_hours, 2.0);
    close(report.gpu_hours_lost, 0.5);
    close(report.lost_by_cause.failure, 0.5);
    close(report.cost.unwrap(), 4.0);
    close(report.cost_lost.unwrap(), 1.0);
    // The node's two GPUs were up the whole hour.
    close(report.available_gpu_hours, 2.0);
    close(report.utilization.unwrap(), 1.0);
    // Two trials in the system for the whole hour.
    assert_eq!(report.queueing.finished, 2);
    close(report.queueing.throughput_per_hour, 2.0);
    close(report.queueing.mean_time_in_system_s.unwrap(), 3_600.0);
    close(report.queueing.mean_in_system, 2.0);
    assert_eq!(report.queueing.littles_law_ratio, Some(1.0));
    // Both finish at the end, after all 2 GPU-hours: 0.75 is the best.
    let figures = &report.returns[0];
    let curve: Vec<(f64, f64)> = figures
        .best_vs_gpu_hours
        .iter()
        .map(|point| (point.gpu_hours, point.best))
        .collect();
    assert_eq!(curve, [(2.0, 0.5), (2.0, 0.75)]);
    assert_eq!(figures.value_per_unit, Some(10.0));
    // Nothing had finished by three quarters of the GPU-hours.
    assert_eq!(figures.last_quarter_gain, None);
    // The trial views carry their own GPU-hours and cost.
    let status = core.status(Some(&experiment.to_string())).unwrap();
    let hours: Vec<f64> = status[0]
        .trials
        .iter()
        .map(|trial| trial.gpu_hours)
        .collect();
    assert_eq!(hours, [1.0, 1.0]);
    assert_eq!(status[0].trials[1].cost, Some(2.0));
}

#[test]
fn a_lost_node_offers_gpus_only_until_its_last_sign_of_life() {
    let (mut core, node, _) = known_schedule();
    // Silent since its last report at 1 h + 1 s.
    core.handle_tick(HOUR + 20_000);
    assert_eq!(
        core.membership.node(node).unwrap().state,
        xp_runtime::protocol::NodeState::Lost
    );
    let up = core.membership.node(node).unwrap().up.clone();
    assert_eq!(up.len(), 1);
    assert_eq!((up[0].from, up[0].to), (0, Some(HOUR + 1_000)));
    let report = core
        .report(2 * HOUR, &ReportScope::Cluster, Some(2 * HOUR))
        .unwrap();
    close(
        report.available_gpu_hours,
        2.0 * (HOUR + 1_000) as f64 / HOUR as f64,
    );
    // It comes back: a new interval opens.
    core.handle_node_register(3 * HOUR, registration(node, 2, 4, Vec::new()));
    assert_eq!(core.membership.node(node).unwrap().up.len(), 2);
    assert_eq!(core.membership.node(node).unwrap().up[1].to, None);
}

#[test]
fn the_scope_is_judged_against_what_the_caller_sees() {
    let (core, _, experiment) = known_schedule();
    let request = |experiment: Option<String>, team: Option<&str>| ReportRequest {
        experiment,
        team: team.map(str::to_owned),
        since_ms: None,
    };
    let nlp = Visibility::Team("nlp".to_owned());
    let vision = Visibility::Team("vision".to_owned());
    let id = Some(experiment.to_string());
    // Another team's experiment by its full id: not found, as an unknown id.
    assert!(matches!(
        core.report_for(2 * HOUR, &request(id.clone(), None), &nlp),
        Err(CoreError::NoExperimentMatches { .. })
    ));
    let prefix = Some(experiment.to_string()[..8].to_owned());
    assert!(matches!(
        core.report_for(2 * HOUR, &request(prefix.clone(), None), &nlp),
        Err(CoreError::NoExperimentMatches { .. })
    ));
    assert!(
        core.report_for(2 * HOUR, &request(prefix, None), &vision)
            .is_ok()
    );
    assert!(
        core.report_for(2 * HOUR, &request(id.clone(), None), &vision)
            .is_ok()
    );
    let team = core
        .report_for(2 * HOUR, &request(None, Some("vision")), &vision)
        .unwrap();
    close(team.gpu_hours, 2.0);
    assert!(matches!(
        core.report_for(2 * HOUR, &request(None, Some("vision")), &nlp),
        Err(CoreError::ReportForbidden { .. })
    ));
    assert!(matches!(
        core.report_for(2 * HOUR, &request(None, None), &vision),
        Err(CoreError::ReportForbidden { .. })
    ));
    assert!(
        core.report_for(2 * HOUR, &request(None, None), &Visibility::All)
            .is_ok()
    );
    assert!(matches!(
        core.report_for(2 * HOUR, &request(id, Some("vision")), &Visibility::All),
        Err(CoreError::ReportScopeConflict)
    ));
}

/// The same sweep at `parallel` 1 and 2: two trials of an hour each take 2 h
/// one after the other and 1 h side by side: no serial part.
#[test]
fn amdahl_is_fitted_across_runs_at_several_parallel_settings() {
    let mut core = HeadCore::restore(CONFIG, LoadedState::default(), 0);
    let node = node_id(1);
    core.handle_node_register(0, registration(node, 2, 4, Vec::new()));
    let spec = |parallel: u32| {
        format!(
            "name: scale\ntrial: {{command: [sleep, '{{x}}'], resources: {{gpu: 1}}}}\nsearch: {{algorithm: grid, space: {{x: {{choice: [1, 2]}}}}, parallel: {parallel}}}\n"
        )
    };
    let mut now = 0;
    let mut experiments = Vec::new();
    for parallel in [1u32, 2] {
        // The second run is not reused from the first: it is asked to run again.
        experiments.push(submit(&mut core, now, &spec(parallel), true));
        loop {
            let round = launches(&commands(&mut core));
            if round.is_empty() {
                break;
            }
            for (host, key) in &round {
                report(
                    &mut core,
                    now,
                    *host,
                    WorkerReport::Started { key: *key, pid: 1 },
                );
            }
            now += HOUR;
            for (host, key) in &round {
                exited(&mut core, now, *host, *key, 0);
            }
        }
    }
    let report = core
        .report(now, &ReportScope::Experiment(experiments[1]), None)
        .unwrap();
    assert_eq!(report.amdahl.len(), 1, "{:?}", report.amdahl);
    let fit = &report.amdahl[0];
    assert_eq!(fit.varied, "parallel");
    assert_eq!(fit.points.len(), 2);
    close(fit.points[0].seconds, 7_200.0);
    close(fit.serial_fraction, 0.0);
    close(fit.predicted_speedup, 4.0);
}

/// A trial checkpoints at half an hour and fails at an hour; its retry resumes
/// from that checkpoint, so only the half hour after it is lost.
#[test]
fn work_before_the_resumed_checkpoint_is_not_lost() {
    let mut core = HeadCore::restore(CONFIG, LoadedState::default(), 0);
    let node = node_id(1);
    core.handle_node_register(0, registration(node, 1, 2, Vec::new()));
    let experiment = submit(
        &mut core,
        0,
        "name: ck\ntrial: {command: [train], resources: {gpu: 1}, max_retries: 1}\n",
        false,
    );
    let (_, key) = launches(&commands(&mut core))[0];
    report(&mut core, 0, node, WorkerReport::Started { key, pid: 1 });
    report(
        &mut core,
        HOUR / 2,
        node,
        checkpoint_report(key, 5, b"state"),
    );
    exited(&mut core, HOUR, node, key, 1);
    let (_, retry) = launches(&commands(&mut core))[0];
    let attempt = &core.book.trial(retry.trial).attempts[1];
    assert_eq!(attempt.resumed_from, Some((5, 1)));
    assert_eq!(attempt.resumed_checkpoint_at, Some(HOUR / 2));
    // While the retry runs, the report counts it up to now.
    report(
        &mut core,
        HOUR,
        node,
        WorkerReport::Started { key: retry, pid: 2 },
    );
    let running = core
        .report(HOUR + HOUR / 2, &ReportScope::Experiment(experiment), None)
        .unwrap();
    close(running.gpu_hours, 1.5);
    close(running.gpu_hours_lost, 0.5);
    exited(&mut core, 2 * HOUR, node, retry, 0);
    let done = core
        .report(3 * HOUR, &ReportScope::Experiment(experiment), None)
        .unwrap();
    close(done.gpu_hours, 2.0);
    close(done.gpu_hours_lost, 0.5);
    close(done.lost_by_cause.failure, 0.5);
    // No prices in the policy: no cost.
    assert_eq!(done.cost, None);
}

/// Telemetry of trial 0 (one GPU): half busy for its first half hour, fully
/// busy for its second: 0.75 busy GPU-hours.
#[test]
fn busy_gpu_time_comes_from_telemetry_windows() {
    use xp_runtime::protocol::{FieldStats, TelemetryWindow, WorkerTelemetry};
    let (core, _, experiment) = known_schedule();
    let window = |start_ms: u64, end_ms: u64, util: f64| TelemetryWindow {
        start_ms,
        end_ms,
        samples: 2,
        cpu_cores: None,
        rss_bytes: None,
        gpu_util: Some(FieldStats {
            min: util,
            max: util,
            sum: 2.0 * util,
            n: 2,
        }),
        gpu_mem_bytes: None,
        gpu_power_w: None,
    };
    let trial = TrialId {
        experiment,
        index: 0,
    };
    let telemetry = vec![(
        trial,
        vec![WorkerTelemetry {
            rank: 0,
            windows: vec![
                window(1_000, HOUR / 4, 50.0),
                window(HOUR / 2 + 1_000, HOUR + 1_000, 100.0),
            ],
        }],
    )];
    let scope = ReportScope::Experiment(experiment);
    let snapshot = core.report_snapshot(2 * HOUR, &scope, None).unwrap();
    assert_eq!(snapshot.gpu_trials().len(), 2);
    let spans = snapshot.busy_spans(&telemetry);
    assert_eq!(spans.len(), 2);
    let busy = xp_tune::report::busy_gpu_hours(
        &spans,
        xp_tune::report::Window {
            start: 0,
            end: 2 * HOUR,
        },
    )
    .unwrap();
    close(busy, 0.75);
    // A window without GPU figures (a CPU-only worker) gives nothing.
    let mut cpu_only = telemetry[0].1[0].windows[0].clone();
    cpu_only.gpu_util = None;
    let none = vec![(
        trial,
        vec![WorkerTelemetry {
            rank: 0,
            windows: vec![cpu_only],
        }],
    )];
    assert!(snapshot.busy_spans(&none).is_empty());
}
