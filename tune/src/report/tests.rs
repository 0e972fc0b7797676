//! Hand-computed schedules for every figure of the report, and Little's law on
//! closed windows as a property.

use proptest::prelude::*;
use xp_runtime::ids::{ExperimentId, TrialId};

use super::*;

const HOUR: u64 = 3_600_000;
const SECOND: u64 = 1_000;

fn experiment() -> ExperimentId {
    ExperimentId {
        digest: 0x0123_4567_89ab_cdef,
        run: 1,
    }
}

fn trial(index: u32) -> TrialId {
    TrialId {
        experiment: experiment(),
        index,
    }
}

fn hold(model: &str, gpus: f64) -> Vec<GpuHold> {
    vec![GpuHold {
        model: model.to_owned(),
        gpus,
    }]
}

fn attempt(index: u32, start: u64, end: Option<u64>, gpus: Vec<GpuHold>) -> AttemptSpan {
    AttemptSpan {
        trial: trial(index),
        start,
        end,
        gpus,
        cause: EndCause::None,
        redone: false,
        resumed_checkpoint_at: None,
    }
}

fn close(actual: f64, expected: f64) {
    assert!(
        (actual - expected).abs() <= 1e-9 * expected.abs().max(1.0),
        "{actual} != {expected}"
    );
}

/// A: 1 declared GPU 0–2 h, succeeded. B: 2 H100 1–3 h, preempted, its
/// successor resumed from a checkpoint at 2 h (1 h × 2 lost). C: that successor,
/// 4–5 h. D: half an A100 from 0 h, still running. E: 1 declared GPU 6–7 h,
/// failed and retried without a checkpoint (1 h lost).
fn schedule() -> Vec<AttemptSpan> {
    let mut b = attempt(1, HOUR, Some(3 * HOUR), hold("H100", 2.0));
    b.cause = EndCause::Preemption;
    b.redone = true;
    b.resumed_checkpoint_at = Some(2 * HOUR);
    let mut e = attempt(3, 6 * HOUR, Some(7 * HOUR), hold("declared", 1.0));
    e.cause = EndCause::Failure;
    e.redone = true;
    vec![
        attempt(0, 0, Some(2 * HOUR), hold("declared", 1.0)),
        b,
        attempt(1, 4 * HOUR, Some(5 * HOUR), hold("H100", 2.0)),
        attempt(2, 0, None, hold("A100", 0.5)),
        e,
    ]
}

fn prices() -> PriceList {
    PriceList {
        prices: [("default".to_owned(), 1.0), ("H100".to_owned(), 3.0)].into(),
    }
}

#[test]
fn gpu_hours_lost_and_cost_of_a_known_schedule() {
    let window = Window {
        start: 0,
        end: 10 * HOUR,
    };
    let used = usage(&schedule(), window, &prices());
    // 2 + 4 + 2 + 10 × 0.5 + 1.
    close(used.gpu_hours, 14.0);
    close(used.gpu_hours_lost, 3.0);
    close(used.lost_by_cause.preemption, 2.0);
    close(used.lost_by_cause.failure, 1.0);
    close(used.lost_by_cause.node_loss, 0.0);
    // declared 3 h × 1 + H100 6 h × 3 + A100 5 h × default 1.
    close(used.cost.unwrap(), 26.0);
    close(used.cost_lost.unwrap(), 7.0);
    close(used.unpriced_gpu_hours, 0.0);
    let models: Vec<(&str, f64)> = used
        .by_model
        .iter()
        .map(|model| (model.model.as_str(), model.gpu_hours))
        .collect();
    assert_eq!(models, [("A100", 5.0), ("H100", 6.0), ("declared", 3.0)]);

    let unpriced = usage(&schedule(), window, &PriceList::default());
    assert_eq!((unpriced.cost, unpriced.cost_lost), (None, None));
    close(unpriced.unpriced_gpu_hours, 14.0);
    let only_h100 = PriceList {
        prices: [("H100".to_owned(), 3.0)].into(),
    };
    let partly = usage(&schedule(), window, &only_h100);
    close(partly.cost.unwrap(), 18.0);
    close(partly.unpriced_gpu_hours, 8.0);
}

#[test]
fn a_window_counts_only_what_falls_inside_it() {
    let window = Window {
        start: HOUR + HOUR / 2,
        end: 10 * HOUR,
    };
    let used = usage(&schedule(), window, &prices());
    // A 0.5, B 1.5 × 2, C 2, D 8.5 × 0.5, E 1.
    close(used.gpu_hours, 10.75);
    close(used.gpu_hours_lost, 3.0);
    let late = Window {
        start: 2 * HOUR + HOUR / 2,
        end: 10 * HOUR,
    };
    // Half of B's lost hour falls before the window.
    close(usage(&schedule(), late, &prices()).gpu_hours_lost, 2.0);
}

#[test]
fn lost_work_starts_at_the_resumed_checkpoint_only_when_inside_the_attempt() {
    let window = Window {
        start: 0,
        end: 10 * HOUR,
    };
    let mut earlier = attempt(0, 2 * HOUR, Some(4 * HOUR), hold("declared", 1.0));
    earlier.cause = EndCause::NodeLoss;
    earlier.redone = true;
    // Its successor resumed from a checkpoint of an earlier attempt: all lost.
    earlier.resumed_checkpoint_at = Some(HOUR);
    let used = usage(&[earlier.clone()], window, &prices());
    close(used.gpu_hours_lost, 2.0);
    close(used.lost_by_cause.node_loss, 2.0);
    // Not redone (the trial ended): nothing lost.
    earlier.redone = false;
    close(usage(&[earlier], window, &prices()).gpu_hours_lost, 0.0);
}

#[test]
fn available_gpu_hours_and_utilisation_from_node_up_times() {
    let nodes = [
        NodeUp {
            gpus: 2.0,
            from: 0,
            to: Some(5 * HOUR),
        },
        NodeUp {
            gpus: 2.0,
            from: 7 * HOUR,
            to: None,
        },
    ];
    let window = Window {
        start: HOUR,
        end: 10 * HOUR,
    };
    let available = available_gpu_hours(&nodes, window);
    close(available, 14.0);
    close(utilization(7.0, available).unwrap(), 0.5);
    assert_eq!(utilization(1.0, 0.0), None);
}

fn span(index: u32, arrived: u64, finished: Option<u64>) -> TrialSpan {
    TrialSpan {
        trial: trial(index),
        arrived,
        finished,
        metric: None,
    }
}

#[test]
fn littles_law_on_a_known_schedule() {
    let trials = [
        span(0, 0, Some(10 * SECOND)),
        span(1, 5 * SECOND, Some(25 * SECOND)),
        span(2, 20 * SECOND, Some(40 * SECOND)),
    ];
    let window = Window {
        start: 0,
        end: 100 * SECOND,
    };
    let closed = queueing(&trials, window);
    assert_eq!((closed.arrived, closed.finished), (3, 3));
    // 3 per 100 s; W = 50/3 s; L = 50 s of trial-time over 100 s.
    close(closed.throughput_per_hour, 108.0);
    close(closed.mean_time_in_system_s.unwrap(), 50.0 / 3.0);
    close(closed.mean_in_system, 0.5);
    assert_eq!(closed.littles_law_ratio, Some(1.0));

    let mut open = trials.to_vec();
    open.push(span(3, 90 * SECOND, None));
    let with_one_inside = queueing(&open, window);
    assert_eq!(with_one_inside.arrived, 4);
    close(with_one_inside.mean_in_system, 0.6);
    close(with_one_inside.littles_law_ratio.unwrap(), 1.2);

    let late = Window {
        start: 15 * SECOND,
        end: 100 * SECOND,
    };
    let cut = queueing(&trials, late);
    // Trial 0 left before the window; 1 and 2 finish in it, 20 s each.
    assert_eq!((cut.arrived, cut.finished), (1, 2));
    close(cut.mean_in_system, 30.0 / 85.0);
    close(cut.mean_time_in_system_s.unwrap(), 20.0);
    close(cut.throughput_per_hour, 2.0 / 85.0 * 3600.0);
    close(cut.littles_law_ratio.unwrap(), 0.75);

    let empty = queueing(&[], window);
    assert_eq!(
        (
            empty.finished,
            empty.mean_time_in_system_s,
            empty.littles_law_ratio
        ),
        (0, None, None)
    );
}

proptest! {
    #[test]
    fn littles_law_holds_exactly_on_a_closed_window(
        spans in prop::collection::vec((0u64..1_000_000, 1u64..1_000_000), 1..60),
        before in 0u64..10_000,
        after in 0u64..10_000,
    ) {
        let trials: Vec<TrialSpan> = spans
            .iter()
            .enumerate()
            .map(|(index, (arrived, stay))| {
                span(index as u32, 20_000 + arrived, Some(20_000 + arrived + stay))
            })
            .collect();
        let first = trials.iter().map(|trial| trial.arrived).min().unwrap();
        let last = trials.iter().filter_map(|trial| trial.finished).max().unwrap();
        let window = Window { start: first - before, end: last + after };
        let figures = queueing(&trials, window);
        prop_assert_eq!(figures.finished, trials.len() as u64);
        prop_assert_eq!(figures.littles_law_ratio, Some(1.0));
        let lambda_per_s = figures.throughput_per_hour / 3600.0;
        let lambda_w = lambda_per_s * figures.mean_time_in_system_s.unwrap();
        prop_assert!((figures.mean_in_system - lambda_w).abs() <= 1e-9 * lambda_w.max(1.0));
    }
}

fn finished(index: u32, at: u64, metric: f64) -> TrialSpan {
    TrialSpan {
        trial: trial(index),
        arrived: 0,
        finished: Some(at),
        metric: Some(metric),
    }
}

/// Four trials one after the other on one GPU, an hour each.
fn serial_sweep(values: [f64; 4]) -> (Vec<TrialSpan>, Vec<AttemptSpan>) {
    let trials = (0..4)
        .map(|index| finished(index, (u64::from(index) + 1) * HOUR, values[index as usize]))
        .collect();
    let attempts = (0..4)
        .map(|index| {
            let start = u64::from(index) * HOUR;
            attempt(index, start, Some(start + HOUR), hold("declared", 1.0))
        })
        .collect();
    (trials, attempts)
}

#[test]
fn best_against_gpu_hours_and_the_last_quarter() {
    let window = Window {
        start: 0,
        end: 4 * HOUR,
    };
    let (trials, attempts) = serial_sweep([0.5, 0.7, 0.6, 0.9]);
    let curve = best_vs_gpu_hours(&trials, &attempts, window, true);
    let points: Vec<(f64, f64)> = curve
        .iter()
        .map(|point| (point.gpu_hours, point.best))
        .collect();
    assert_eq!(points, [(1.0, 0.5), (2.0, 0.7), (3.0, 0.7), (4.0, 0.9)]);
    assert_eq!(curve[2].value, 0.6);
    // The best was 0.7 at 3 of 4 GPU-hours and is 0.9 at the end.
    close(last_quarter_gain(&curve, 4.0, true).unwrap(), 0.2);

    let (trials, attempts) = serial_sweep([5.0, 3.0, 4.0, 1.0]);
    let minimising = best_vs_gpu_hours(&trials, &attempts, window, false);
    let bests: Vec<f64> = minimising.iter().map(|point| point.best).collect();
    assert_eq!(bests, [5.0, 3.0, 3.0, 1.0]);
    close(last_quarter_gain(&minimising, 4.0, false).unwrap(), 2.0);

    assert_eq!(last_quarter_gain(&[], 4.0, true), None);
    // Nothing finished by three quarters: nothing to compare with.
    assert_eq!(last_quarter_gain(&minimising[3..], 4.0, false), None);
}

#[test]
fn gpu_hours_at_each_finish_count_overlapping_attempts() {
    // Trial 1 holds 2 GPUs for 0–1 h, trial 0 one GPU for 0–2 h.
    let attempts = [
        attempt(0, 0, Some(2 * HOUR), hold("declared", 1.0)),
        attempt(1, 0, Some(HOUR), hold("declared", 2.0)),
    ];
    let trials = [finished(0, 2 * HOUR, 1.0), finished(1, HOUR, 2.0)];
    let window = Window {
        start: 0,
        end: 2 * HOUR,
    };
    let curve = best_vs_gpu_hours(&trials, &attempts, window, false);
    let points: Vec<(u32, f64, f64)> = curve
        .iter()
        .map(|point| (point.trial.index, point.gpu_hours, point.best))
        .collect();
    assert_eq!(points, [(1, 3.0, 2.0), (0, 4.0, 1.0)]);
}

#[test]
fn return_on_the_last_quarter() {
    let window = Window {
        start: 0,
        end: 4 * HOUR,
    };
    let (trials, attempts) = serial_sweep([0.5, 0.7, 0.6, 0.9]);
    let priced = PriceList {
        prices: [("default".to_owned(), 1.0)].into(),
    };
    let figures = experiment_return(
        experiment(),
        "accuracy",
        true,
        Some(10.0),
        &trials,
        &attempts,
        window,
        &priced,
    );
    close(figures.gpu_hours, 4.0);
    assert_eq!(figures.cost, Some(4.0));
    assert_eq!(figures.best, Some(0.9));
    // The last quarter cost 1 and bought 0.2 × 10 = 2: 100%.
    close(figures.roi_percent.unwrap(), 100.0);
    close(roi_percent(0.05, 10.0, 1.0).unwrap(), -50.0);
    assert_eq!(roi_percent(1.0, 1.0, 0.0), None);
    let unvalued = experiment_return(
        experiment(),
        "accuracy",
        true,
        None,
        &trials,
        &attempts,
        window,
        &priced,
    );
    assert_eq!(unvalued.roi_percent, None);
}

fn measured(points: &[(f64, f64)]) -> Vec<Measurement> {
    points
        .iter()
        .map(|(parallelism, seconds)| Measurement {
            parallelism: *parallelism,
            seconds: *seconds,
            experiment: experiment(),
        })
        .collect()
}

#[test]
fn amdahl_recovers_a_known_serial_fraction() {
    // T(p) = 100 (0.1 + 0.9 / p).
    let fit = fit_amdahl(
        "sweep",
        "parallel",
        &measured(&[(1.0, 100.0), (2.0, 55.0), (4.0, 32.5)]),
    )
    .unwrap();
    close(fit.serial_fraction, 0.1);
    close(fit.predicted_parallelism, 8.0);
    close(fit.predicted_speedup, 1.0 / 0.2125);
    close(fit.points[1].speedup, 100.0 / 55.0);
    // Without a run at 1, T(1) comes from the fit as well.
    let fit = fit_amdahl(
        "sweep",
        "parallel",
        &measured(&[(2.0, 55.0), (4.0, 32.5), (8.0, 21.25)]),
    )
    .unwrap();
    close(fit.serial_fraction, 0.1);
    close(fit.points[0].speedup, 100.0 / 55.0);
    close(fit.predicted_speedup, 1.0 / (0.1 + 0.9 / 16.0));
}

#[test]
fn amdahl_least_squares_on_noisy_times() {
    // x = 1 − 1/p, y = T(p)/T(1) − 1/p: (0.5, 0.1), (0.75, 0.05).
    let fit = fit_amdahl(
        "sweep",
        "workers",
        &measured(&[(1.0, 100.0), (2.0, 60.0), (4.0, 30.0), (4.0, 30.0)]),
    )
    .unwrap();
    close(fit.serial_fraction, 0.0875 / 0.8125);
    assert_eq!(fit.points.len(), 3);
    // Faster than linear clamps to no serial part at all.
    let superlinear =
        fit_amdahl("sweep", "parallel", &measured(&[(1.0, 100.0), (2.0, 40.0)])).unwrap();
    assert_eq!(superlinear.serial_fraction, 0.0);
    close(superlinear.predicted_speedup, 4.0);
    assert_eq!(
        fit_amdahl("one", "parallel", &measured(&[(2.0, 10.0), (2.0, 12.0)])),
        None
    );
    assert_eq!(
        fit_amdahl("bad", "parallel", &measured(&[(1.0, f64::NAN), (2.0, 1.0)])),
        None
    );
}

#[test]
fn busy_gpu_hours_from_telemetry_spans() {
    let window = Window {
        start: HOUR,
        end: 10 * HOUR,
    };
    let spans = [
        // Two GPUs half busy for 0–2 h: only 1–2 h is inside.
        BusySpan {
            gpus: 2.0,
            util: 0.5,
            from: 0,
            to: 2 * HOUR,
        },
        // Half a GPU fully busy for 3–5 h.
        BusySpan {
            gpus: 0.5,
            util: 1.0,
            from: 3 * HOUR,
            to: 5 * HOUR,
        },
    ];
    close(busy_gpu_hours(&spans, window).unwrap(), 2.0);
    assert_eq!(busy_gpu_hours(&[], window), None);
}

#[test]
fn a_finish_before_its_arrival_neither_panics_nor_counts() {
    // The clock stepped back between the trial's creation and its end.
    let window = Window {
        start: 0,
        end: 4 * HOUR,
    };
    let stepped = TrialSpan {
        trial: trial(0),
        arrived: 3 * HOUR,
        finished: Some(HOUR),
        metric: Some(1.0),
    };
    let figures = queueing(&[stepped, finished(1, 2 * HOUR, 1.0)], window);
    assert_eq!(figures.finished, 1);
    close(figures.mean_time_in_system_s.unwrap(), 2.0 * 3_600.0);
}

#[test]
fn a_curve_keeps_its_steps_and_its_last_point() {
    let (trials, attempts) = serial_sweep([0.5, 0.4, 0.7, 0.6]);
    let window = Window {
        start: 0,
        end: 4 * HOUR,
    };
    let curve = best_vs_gpu_hours(&trials, &attempts, window, true);
    let thinned = thin_best_curve(curve.clone(), MAX_CURVE_POINTS);
    let points: Vec<(f64, f64)> = thinned
        .iter()
        .map(|point| (point.gpu_hours, point.best))
        .collect();
    // 0.4 and 0.6 improve nothing; the last point shows the final GPU-hours.
    assert_eq!(points, [(1.0, 0.5), (3.0, 0.7), (4.0, 0.7)]);
    // As a step line it reads the same best at every GPU-hour of the full curve.
    let step_at = |line: &[BestPoint], hours: f64| {
        line.iter()
            .take_while(|point| point.gpu_hours <= hours)
            .last()
            .map(|point| point.best)
    };
    for point in &curve {
        assert_eq!(step_at(&thinned, point.gpu_hours), Some(point.best));
    }
    assert!(thin_best_curve(Vec::new(), 10).is_empty());
}

#[test]
fn a_long_curve_is_capped_evenly_with_both_ends() {
    // 10,000 finishes, each better than the last: every point is a step.
    let curve: Vec<BestPoint> = (0..10_000u32)
        .map(|index| BestPoint {
            gpu_hours: f64::from(index),
            best: f64::from(index),
            trial: trial(index),
            value: f64::from(index),
        })
        .collect();
    let thinned = thin_best_curve(curve, 1_000);
    assert_eq!(thinned.len(), 1_000);
    assert_eq!(thinned[0].best, 0.0);
    assert_eq!(thinned[999].best, 9_999.0);
    assert!(
        thinned
            .windows(2)
            .all(|pair| pair[0].gpu_hours < pair[1].gpu_hours)
    );
    // Evenly: no gap much wider than the mean.
    let widest = thinned
        .windows(2)
        .map(|pair| pair[1].gpu_hours - pair[0].gpu_hours)
        .fold(0.0, f64::max);
    assert!(widest <= 11.0, "{widest}");
    // A cap under 2 still keeps both ends.
    let two = thin_best_curve(thinned, 0);
    assert_eq!(two.len(), 2);
}

/// Tallies fed a few at a time give the figures of one call over everything
/// in the same order, to the bit: a report adds experiment by experiment.
#[test]
fn tallies_fed_in_parts_give_the_whole_figures() {
    let attempts = schedule();
    let trials: Vec<TrialSpan> = (0..5)
        .map(|index| {
            span(
                index,
                u64::from(index) * HOUR,
                Some((u64::from(index) + 2) * HOUR),
            )
        })
        .collect();
    let window = Window {
        start: HOUR / 2,
        end: 6 * HOUR + HOUR / 3,
    };
    for cut in 0..=attempts.len() {
        let mut used = UsageTally::default();
        used.add(&attempts[..cut], window);
        used.add(&[], window);
        used.add(&attempts[cut..], window);
        assert_eq!(used.finish(&prices()), usage(&attempts, window, &prices()));
        let mut queued = QueueingTally::default();
        queued.add(&trials[..cut], window);
        queued.add(&trials[cut..], window);
        assert_eq!(queued.finish(window), queueing(&trials, window));
    }
}
