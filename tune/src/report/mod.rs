//! The maths of `xp report`: GPU-hours used and lost, cost, utilisation,
//! Little's law, the return on GPU-hours and Amdahl's law, from plain lists of
//! attempts, trials and node up-times.
//!
//! Pure: no I/O, no clock (the window is an argument), no knowledge of where the
//! lists come from (the head gathers them from its records; `xp sim` could hand
//! its own). Times are Unix milliseconds; sums of time are kept in integer
//! milliseconds (`u128`) until the last division, so a figure computed twice in
//! two orders is the same to the bit, and Little's law on a closed window holds
//! exactly.
//!
//! Conventions:
//! - An attempt holds its GPUs from its placement to its end (or the window's
//!   end while it runs); only the part inside the window counts.
//! - An attempt's work is lost when it is redone (see [`AttemptSpan::redone`]):
//!   from the checkpoint its successor resumed from (or will resume from) when
//!   that checkpoint is inside the attempt, else from the attempt's start.
//! - A trial is in the system from its arrival (creation) to its finish.

use std::collections::BTreeMap;

use xp_runtime::clock::UnixMillis;
use xp_runtime::ids::{ExperimentId, TrialId};
use xp_runtime::report::{
    AmdahlFit, BestPoint, ExperimentReturn, LostByCause, ModelUsage, Queueing, SpeedupPoint,
};

const MS_PER_HOUR: f64 = 3_600_000.0;

/// The most points of a best-so-far curve a report carries (the dashboard
/// draws it within its latency budget; a sweep of 10,000 trials would
/// otherwise send one point each).
pub const MAX_CURVE_POINTS: usize = 1_000;

/// The time the report covers, `[start, end]`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Window {
    /// The start.
    pub start: UnixMillis,
    /// The end.
    pub end: UnixMillis,
}

impl Window {
    /// How long `[from, to)` (`to` open: up to the window's end) overlaps it, in ms.
    fn overlap(&self, from: UnixMillis, to: Option<UnixMillis>) -> u64 {
        let to = to.unwrap_or(self.end).min(self.end);
        to.saturating_sub(from.max(self.start))
    }

    fn length_ms(&self) -> u64 {
        self.end.saturating_sub(self.start)
    }
}

/// Why an attempt ended, as far as lost work is concerned.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EndCause {
    /// Still running, or ended with success, a cancel or a stop: nothing is redone.
    None,
    /// Preempted by the scheduler.
    Preemption,
    /// Failed through the trial's fault (exit status, out of memory, time limit).
    Failure,
    /// Lost with its node, refused or stopped by it.
    NodeLoss,
}

/// Some GPUs of one model that an attempt holds.
#[derive(Debug, Clone, PartialEq)]
pub struct GpuHold {
    /// The model (`declared` for declared slots).
    pub model: String,
    /// How many GPUs, fractions allowed (two workers on half a GPU each: 1.0).
    pub gpus: f64,
}

/// One attempt of a trial.
#[derive(Debug, Clone, PartialEq)]
pub struct AttemptSpan {
    /// The trial.
    pub trial: TrialId,
    /// When it was placed (its GPUs were allocated).
    pub start: UnixMillis,
    /// When it ended; `None` while it runs.
    pub end: Option<UnixMillis>,
    /// What it holds.
    pub gpus: Vec<GpuHold>,
    /// Why it ended.
    pub cause: EndCause,
    /// Its work is done again by a later attempt (the trial was retried or
    /// requeued and is not finished or ran again).
    pub redone: bool,
    /// When the checkpoint that the redoing attempt resumed (or will resume)
    /// from was taken; work before it is kept.
    pub resumed_checkpoint_at: Option<UnixMillis>,
}

impl AttemptSpan {
    fn gpu_count(&self) -> f64 {
        self.gpus.iter().map(|hold| hold.gpus).sum()
    }

    /// The interval whose work is lost, if any.
    fn lost_interval(&self) -> Option<(UnixMillis, UnixMillis)> {
        if !self.redone || self.cause == EndCause::None {
            return None;
        }
        let end = self.end?;
        Some((
            xp_runtime::report::lost_since(self.start, end, self.resumed_checkpoint_at),
            end,
        ))
    }
}

/// One trial's passage through the system.
#[derive(Debug, Clone, PartialEq)]
pub struct TrialSpan {
    /// The trial.
    pub trial: TrialId,
    /// When it was created (submitted, or asked for by an adaptive search).
    pub arrived: UnixMillis,
    /// When it reached a final state; `None` while it is in the system.
    pub finished: Option<UnixMillis>,
    /// Its final value of the experiment's metric, if it reported one.
    pub metric: Option<f64>,
}

/// A node's GPUs and one interval it was up.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct NodeUp {
    /// GPUs it registered.
    pub gpus: f64,
    /// Up from.
    pub from: UnixMillis,
    /// Up to; `None` while it is up.
    pub to: Option<UnixMillis>,
}

/// Prices per GPU-hour by model, with an optional `default` for the others.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct PriceList {
    /// Model name (or `default`) to currency units per GPU-hour.
    pub prices: BTreeMap<String, f64>,
}

impl PriceList {
    /// The price of one GPU-hour of `model`: its own, else `default`, else none.
    pub fn price(&self, model: &str) -> Option<f64> {
        self.prices
            .get(model)
            .or_else(|| self.prices.get("default"))
            .copied()
    }
}

/// GPU-hours, lost GPU-hours and their cost.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Usage {
    /// GPU-hours allocated in the window.
    pub gpu_hours: f64,
    /// GPU-hours of work redone.
    pub gpu_hours_lost: f64,
    /// Lost GPU-hours by cause.
    pub lost_by_cause: LostByCause,
    /// Per model, by name.
    pub by_model: Vec<ModelUsage>,
    /// Cost; `None` when there are no prices at all.
    pub cost: Option<f64>,
    /// Cost of the lost GPU-hours.
    pub cost_lost: Option<f64>,
    /// GPU-hours of models without a price.
    pub unpriced_gpu_hours: f64,
}

/// GPU-hours, lost GPU-hours and cost of `attempts` inside `window`.
pub fn usage(attempts: &[AttemptSpan], window: Window, prices: &PriceList) -> Usage {
    let mut tally = UsageTally::default();
    tally.add(attempts, window);
    tally.finish(prices)
}

/// [`usage`] of attempts given a few at a time (a report's, experiment by
/// experiment, so that a million attempts are never held at once): the same
/// figures, to the bit, when given in the same order.
#[derive(Debug, Clone, Default)]
pub struct UsageTally {
    /// Per model: GPU-milliseconds used and lost (f64: fractional GPUs).
    per_model: BTreeMap<String, (f64, f64)>,
    lost_by_cause: LostByCause,
}

impl UsageTally {
    /// Counts `attempts` inside `window` (the same window every time).
    pub fn add(&mut self, attempts: &[AttemptSpan], window: Window) {
        for attempt in attempts {
            let used_ms = window.overlap(attempt.start, attempt.end) as f64;
            let lost_ms = attempt
                .lost_interval()
                .map_or(0.0, |(from, to)| window.overlap(from, Some(to)) as f64);
            for hold in &attempt.gpus {
                let entry = match self.per_model.get_mut(hold.model.as_str()) {
                    Some(entry) => entry,
                    None => self.per_model.entry(hold.model.clone()).or_default(),
                };
                entry.0 += used_ms * hold.gpus;
                entry.1 += lost_ms * hold.gpus;
            }
            let lost_hours = lost_ms * attempt.gpu_count() / MS_PER_HOUR;
            let lost = &mut self.lost_by_cause;
            match attempt.cause {
                EndCause::Preemption => lost.preemption += lost_hours,
                EndCause::Failure => lost.failure += lost_hours,
                EndCause::NodeLoss => lost.node_loss += lost_hours,
                EndCause::None => {}
            }
        }
    }

    /// The figures of everything counted, at `prices`.
    pub fn finish(self, prices: &PriceList) -> Usage {
        let priced = !prices.prices.is_empty();
        let mut usage = Usage {
            cost: priced.then_some(0.0),
            cost_lost: priced.then_some(0.0),
            lost_by_cause: self.lost_by_cause,
            ..Usage::default()
        };
        for (model, (used_ms, lost_ms)) in self.per_model {
            let gpu_hours = used_ms / MS_PER_HOUR;
            let lost_hours = lost_ms / MS_PER_HOUR;
            usage.gpu_hours += gpu_hours;
            usage.gpu_hours_lost += lost_hours;
            let price = prices.price(&model);
            if price.is_none() {
                usage.unpriced_gpu_hours += gpu_hours;
            }
            if let (Some(cost), Some(cost_lost), Some(price)) =
                (&mut usage.cost, &mut usage.cost_lost, price)
            {
                *cost += gpu_hours * price;
                *cost_lost += lost_hours * price;
            }
            usage.by_model.push(ModelUsage {
                model,
                gpu_hours,
                price_per_hour: price,
                cost: price.map(|price| gpu_hours * price),
            });
        }
        usage
    }
}

/// GPU-hours the nodes offered inside `window`.
pub fn available_gpu_hours(nodes: &[NodeUp], window: Window) -> f64 {
    nodes
        .iter()
        .map(|node| window.overlap(node.from, node.to) as f64 * node.gpus)
        .sum::<f64>()
        / MS_PER_HOUR
}

/// A stretch of telemetry: a worker holding `gpus` GPUs had them busy a
/// fraction `util` (0 to 1, the mean of its samples) from `from` to `to`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct BusySpan {
    /// GPUs the worker held.
    pub gpus: f64,
    /// Mean utilisation of those GPUs, 0 to 1.
    pub util: f64,
    /// From.
    pub from: UnixMillis,
    /// To.
    pub to: UnixMillis,
}

/// GPU-hours the GPUs were busy inside `window`: each span's GPUs times its
/// utilisation over the part of it inside the window; `None` without spans
/// (no telemetry, or none from GPUs).
pub fn busy_gpu_hours(spans: &[BusySpan], window: Window) -> Option<f64> {
    if spans.is_empty() {
        return None;
    }
    let busy_ms: f64 = spans
        .iter()
        .map(|span| {
            window.overlap(span.from, Some(span.to.max(span.from))) as f64
                * span.gpus
                * span.util.clamp(0.0, 1.0)
        })
        .sum();
    Some(busy_ms / MS_PER_HOUR)
}

/// `used / available`, when anything was available.
pub fn utilization(used_gpu_hours: f64, available_gpu_hours: f64) -> Option<f64> {
    (available_gpu_hours > 0.0).then(|| used_gpu_hours / available_gpu_hours)
}

/// Throughput, time in system, number in system and Little's law for the trials
/// inside `window`.
///
/// λ counts trials finished inside the window per hour of it; W is the mean
/// time in the system (arrival to finish, whole) of those trials; L is the
/// integral of the number of trials in the system over the window divided by
/// its length. When every trial that touches the window arrives and finishes
/// inside it, `L = λ W` exactly, and the ratio is computed as the integral over
/// the summed times in system so that it is exactly 1 then.
pub fn queueing(trials: &[TrialSpan], window: Window) -> Queueing {
    let mut tally = QueueingTally::default();
    tally.add(trials, window);
    tally.finish(window)
}

/// [`queueing`] of trials given a few at a time (see [`UsageTally`]).
#[derive(Debug, Clone, Copy, Default)]
pub struct QueueingTally {
    area_ms: u128,
    in_system_ms: u128,
    finished: u64,
    arrived: u64,
}

impl QueueingTally {
    /// Counts `trials` inside `window` (the same window every time).
    pub fn add(&mut self, trials: &[TrialSpan], window: Window) {
        for trial in trials {
            if trial
                .finished
                .is_some_and(|finished| finished < trial.arrived)
            {
                // A clock that went backwards: count it as passing through at once.
                continue;
            }
            self.area_ms += u128::from(window.overlap(trial.arrived, trial.finished));
            if (window.start..=window.end).contains(&trial.arrived) {
                self.arrived += 1;
            }
            if let Some(end) = trial.finished
                && (window.start..=window.end).contains(&end)
            {
                self.finished += 1;
                // Saturating: the check above skips a finish before the arrival,
                // but a clock step must never panic here in debug builds either.
                self.in_system_ms += u128::from(end.saturating_sub(trial.arrived));
            }
        }
    }

    /// The figures of everything counted, over `window`.
    pub fn finish(self, window: Window) -> Queueing {
        let Self {
            area_ms,
            in_system_ms,
            finished,
            arrived,
        } = self;
        let length_ms = window.length_ms();
        let hours = length_ms as f64 / MS_PER_HOUR;
        let mean_time_in_system_s =
            (finished > 0).then(|| in_system_ms as f64 / finished as f64 / 1000.0);
        Queueing {
            arrived,
            finished,
            throughput_per_hour: if length_ms > 0 {
                finished as f64 / hours
            } else {
                0.0
            },
            mean_time_in_system_s,
            mean_in_system: if length_ms > 0 {
                area_ms as f64 / length_ms as f64
            } else {
                0.0
            },
            // L / (λ W) = (area / T) / ((n / T) (Σ / n)) = area / Σ.
            littles_law_ratio: (in_system_ms > 0 && length_ms > 0)
                .then(|| area_ms as f64 / in_system_ms as f64),
        }
    }
}

/// The best-so-far curve of one experiment: at each finish (in finish order,
/// ties by trial id) of a trial with a finite metric, the best value so far and
/// the GPU-hours its attempts had used inside the window by then.
pub fn best_vs_gpu_hours(
    trials: &[TrialSpan],
    attempts: &[AttemptSpan],
    window: Window,
    maximize: bool,
) -> Vec<BestPoint> {
    let mut finishes: Vec<(UnixMillis, TrialId, f64)> = trials
        .iter()
        .filter_map(|trial| {
            let finished = trial.finished?;
            let value = trial.metric.filter(|value| value.is_finite())?;
            (window.start..=window.end).contains(&finished).then_some((
                finished,
                trial.trial,
                value,
            ))
        })
        .collect();
    finishes.sort_by(|a, b| a.0.cmp(&b.0).then(a.1.cmp(&b.1)));
    // The GPU allocation rate changes at each attempt's start and end: walk
    // those changes and the finishes together in time order.
    let mut changes: Vec<(UnixMillis, f64)> = Vec::new();
    for attempt in attempts {
        let start = attempt.start.max(window.start);
        let end = attempt.end.unwrap_or(window.end).min(window.end);
        if end > start {
            let gpus = attempt.gpu_count();
            changes.push((start, gpus));
            changes.push((end, -gpus));
        }
    }
    changes.sort_by(|a, b| a.0.cmp(&b.0).then(a.1.total_cmp(&b.1)));
    let mut curve = Vec::with_capacity(finishes.len());
    let (mut rate, mut gpu_ms, mut clock) = (0.0f64, 0.0f64, window.start);
    let mut next_change = 0;
    let mut best: Option<f64> = None;
    for (finished, trial, value) in finishes {
        while next_change < changes.len() && changes[next_change].0 <= finished {
            let (at, delta) = changes[next_change];
            gpu_ms += rate * at.saturating_sub(clock) as f64;
            clock = clock.max(at);
            rate += delta;
            next_change += 1;
        }
        let spent_ms = gpu_ms + rate * finished.saturating_sub(clock) as f64;
        best = Some(match best {
            Some(best) if better(best, value, maximize) => best,
            _ => value,
        });
        curve.push(BestPoint {
            gpu_hours: spent_ms / MS_PER_HOUR,
            best: best.expect("set above"),
            trial,
            value,
        });
    }
    curve
}

/// The points of a best-so-far curve that change its picture as a step line
/// (drawn `hv`: flat until the next point): the first, each where the best
/// changes, and the last (the final GPU-hours). When more than `max` remain
/// (at least 2), evenly spaced ones are kept, the first and last always.
pub fn thin_best_curve(curve: Vec<BestPoint>, max: usize) -> Vec<BestPoint> {
    let last = curve.len().saturating_sub(1);
    let mut steps: Vec<BestPoint> = Vec::new();
    for (index, point) in curve.into_iter().enumerate() {
        let changed = steps.last().is_none_or(|kept| kept.best != point.best);
        if changed || index == last {
            steps.push(point);
        }
    }
    let max = max.max(2);
    if steps.len() <= max {
        return steps;
    }
    let mut wanted = crate::stats::evenly_spaced(steps.len(), max)
        .into_iter()
        .peekable();
    let mut thinned = Vec::with_capacity(max);
    for (index, point) in steps.into_iter().enumerate() {
        if wanted.peek() == Some(&index) {
            thinned.push(point);
            wanted.next();
        }
    }
    thinned
}

/// Whether `a` is at least as good as `b`.
fn better(a: f64, b: f64, maximize: bool) -> bool {
    if maximize { a >= b } else { a <= b }
}

/// How much the best improved during the last quarter of `total_gpu_hours`:
/// the final best against the best at three quarters (positive when better).
/// `None` when no finish came by three quarters, or none at all.
pub fn last_quarter_gain(curve: &[BestPoint], total_gpu_hours: f64, maximize: bool) -> Option<f64> {
    let last = curve.last()?;
    let three_quarters = 0.75 * total_gpu_hours;
    let at_three_quarters = curve
        .iter()
        .take_while(|point| point.gpu_hours <= three_quarters)
        .last()?;
    Some(if maximize {
        last.best - at_three_quarters.best
    } else {
        at_three_quarters.best - last.best
    })
}

/// `(gain × value_per_unit − cost) / cost` in percent; `None` without a cost.
pub fn roi_percent(gain: f64, value_per_unit: f64, cost: f64) -> Option<f64> {
    (cost > 0.0).then(|| (gain * value_per_unit - cost) / cost * 100.0)
}

/// One experiment's return on its GPU-hours: the curve, the last quarter's
/// gain and, with a worth per unit of the metric and a cost, the ROI of that
/// last quarter (whose cost is a quarter of the whole).
#[expect(clippy::too_many_arguments, reason = "one experiment's plain inputs")]
pub fn experiment_return(
    experiment: ExperimentId,
    metric: &str,
    maximize: bool,
    value_per_unit: Option<f64>,
    trials: &[TrialSpan],
    attempts: &[AttemptSpan],
    window: Window,
    prices: &PriceList,
) -> ExperimentReturn {
    let used = usage(attempts, window, prices);
    let curve = best_vs_gpu_hours(trials, attempts, window, maximize);
    // The gain is judged on the whole curve; only what is shown is thinned.
    let gain = last_quarter_gain(&curve, used.gpu_hours, maximize);
    let curve = thin_best_curve(curve, MAX_CURVE_POINTS);
    let roi = match (gain, value_per_unit, used.cost) {
        (Some(gain), Some(value), Some(cost)) => roi_percent(gain, value, cost / 4.0),
        _ => None,
    };
    ExperimentReturn {
        experiment,
        metric: metric.to_owned(),
        maximize,
        gpu_hours: used.gpu_hours,
        cost: used.cost,
        best: curve.last().map(|point| point.best),
        best_vs_gpu_hours: curve,
        last_quarter_gain: gain,
        value_per_unit,
        roi_percent: roi,
    }
}

/// One run of some work at one parallelism.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Measurement {
    /// The parallelism (a sweep's `parallel`, a trial's workers).
    pub parallelism: f64,
    /// How long the work took, in seconds.
    pub seconds: f64,
    /// The run.
    pub experiment: ExperimentId,
}

/// Fits Amdahl's law to runs of the same work at several parallelism settings.
///
/// Runs at one setting are averaged. With a run at parallelism 1, the speed-up
/// is `S(p) = T(1) / T(p)` and the serial fraction `s` is the least-squares
/// solution of `1/S(p) = s + (1 − s)/p`, i.e. of `1/S − 1/p = s (1 − 1/p)`.
/// Without one, `T(1)` is unknown too: `T(p) = a + b/p` is fitted by least
/// squares (which is the same law scaled by `T(1) = a + b`), then `s = a/(a + b)`.
/// `s` is clamped to `[0, 1]`. `None` with fewer than two settings, or times
/// that do not give a positive `T(1)`.
pub fn fit_amdahl(name: &str, varied: &str, measurements: &[Measurement]) -> Option<AmdahlFit> {
    let mut settings: BTreeMap<u64, (f64, f64, Vec<ExperimentId>)> = BTreeMap::new();
    for measurement in measurements {
        if !(measurement.parallelism >= 1.0
            && measurement.seconds.is_finite()
            && measurement.seconds > 0.0)
        {
            continue;
        }
        let entry = settings
            .entry(measurement.parallelism.to_bits())
            .or_insert((measurement.parallelism, 0.0, Vec::new()));
        entry.1 += measurement.seconds;
        entry.2.push(measurement.experiment);
    }
    let mut points: Vec<(f64, f64, Vec<ExperimentId>)> = settings
        .into_values()
        .map(|(p, total, runs)| (p, total / runs.len() as f64, runs))
        .collect();
    points.sort_by(|a, b| a.0.total_cmp(&b.0));
    if points.len() < 2 {
        return None;
    }
    let (serial, t1) = if points[0].0 == 1.0 {
        let t1 = points[0].1;
        let (mut xy, mut xx) = (0.0, 0.0);
        for (p, seconds, _) in &points {
            let x = 1.0 - 1.0 / p;
            let y = seconds / t1 - 1.0 / p;
            xy += x * y;
            xx += x * x;
        }
        (xy / xx, t1)
    } else {
        let n = points.len() as f64;
        let mean_x = points.iter().map(|point| 1.0 / point.0).sum::<f64>() / n;
        let mean_y = points.iter().map(|point| point.1).sum::<f64>() / n;
        let (mut sxy, mut sxx) = (0.0, 0.0);
        for (p, seconds, _) in &points {
            sxy += (1.0 / p - mean_x) * (seconds - mean_y);
            sxx += (1.0 / p - mean_x) * (1.0 / p - mean_x);
        }
        let b = sxy / sxx;
        let a = mean_y - b * mean_x;
        if a + b <= 0.0 {
            return None;
        }
        (a / (a + b), a + b)
    };
    if !(serial.is_finite() && t1 > 0.0) {
        return None;
    }
    let serial = serial.clamp(0.0, 1.0);
    let largest = points.last().expect("two or more").0;
    let predicted_parallelism = 2.0 * largest;
    Some(AmdahlFit {
        name: name.to_owned(),
        varied: varied.to_owned(),
        points: points
            .into_iter()
            .map(|(parallelism, seconds, experiments)| SpeedupPoint {
                parallelism,
                seconds,
                speedup: t1 / seconds,
                experiments,
            })
            .collect(),
        serial_fraction: serial,
        predicted_parallelism,
        predicted_speedup: amdahl_speedup(serial, predicted_parallelism),
    })
}

/// Amdahl's speed-up at parallelism `p` for serial fraction `s`.
pub fn amdahl_speedup(serial: f64, parallelism: f64) -> f64 {
    1.0 / (serial + (1.0 - serial) / parallelism)
}

#[cfg(test)]
mod tests;
