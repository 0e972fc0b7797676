//! Early stopping: rules that decide, from a trial's intermediate metric reports,
//! whether it is worth continuing.
//!
//! Three rules share one sans-io interface, [`StoppingRule`]: the median stopping
//! rule (Golovin et al. 2017, Google Vizier), ASHA (asynchronous successive halving,
//! Li et al. 2020) and asynchronous Hyperband (ASHA over several brackets, as Ray
//! Tune's `AsyncHyperBandScheduler`). [`make_bohb_rule`] builds the Hyperband of
//! `algorithm: bohb`: the same rungs, with brackets of Hyperband's sizes given by
//! trial index ([`crate::hyperband::HyperbandSchedule`]). A rule is fed one report at a time and answers
//! at once from what it knows now; it never waits for other trials, reads no clock,
//! does no I/O and draws no randomness, so the same reports in the same order give
//! the same decisions. It does not stop anything itself: the caller (the head's
//! core) acts on a [`Verdict::Stop`].
//!
//! Objective values are minimised; callers negate them for `mode: max`. A NaN value
//! counts as `+inf`, the worst possible, so a diverged trial is stopped rather than
//! kept. Reports must tolerate the usual races, so every rule ignores (answers
//! [`Verdict::Continue`] without recording) a report at a step not beyond the
//! trial's last recorded one (a duplicate, or a replay after a restart from a
//! checkpoint) and any report after [`StoppingRule::finished`]; a report from a
//! trial the rule already stopped gets the same stop again.

use std::collections::BTreeMap;

use xp_runtime::spec::{RuleKind, StoppingConfig};

use crate::hyperband::HyperbandSchedule;

/// A rule that decides, report by report, whether a trial continues.
///
/// Objective values are minimised (callers negate for mode max).
pub trait StoppingRule: Send {
    /// Trial `trial` reported `value` at `step` (a resource count such as an epoch,
    /// increasing per trial).
    fn report(&mut self, trial: u64, step: u64, value: f64) -> Verdict;
    /// The trial ended (completed, failed or stopped); it no longer counts as running.
    fn finished(&mut self, trial: u64);
    /// The metric is maximised (its values reach the rule negated): reasons
    /// show values as the metric reads them. Decisions do not change.
    fn show_maximized(&mut self);
}

/// What a rule says about a trial after one of its reports.
#[derive(Debug, Clone, PartialEq)]
pub enum Verdict {
    /// Keep training.
    Continue,
    /// Stop the trial now; its best result so far stands.
    Stop {
        /// The rule that decided: `median`, `asha` or `hyperband`.
        rule: &'static str,
        /// Why, with the numbers, for the trial's event log and `xp status`.
        reason: String,
    },
}

impl Verdict {
    /// Whether this is a [`Verdict::Stop`].
    pub fn is_stop(&self) -> bool {
        matches!(self, Self::Stop { .. })
    }
}

/// Builds the rule `config` describes.
///
/// The config must have passed [`StoppingConfig::validate`] (the spec is validated
/// at submission); an invalid one is a bug in the caller and panics.
pub fn make_rule(config: &StoppingConfig) -> Box<dyn StoppingRule> {
    if let Err(error) = config.validate() {
        panic!("make_rule needs a validated config: {error}");
    }
    match config.rule {
        RuleKind::Median => Box::new(MedianRule {
            grace_period: config.grace_period,
            min_samples: config.min_samples as usize,
            trials: BTreeMap::new(),
            shown_sign: 1.0,
        }),
        RuleKind::Asha => Box::new(SuccessiveHalving::new("asha", config, 1)),
        RuleKind::Hyperband => {
            Box::new(SuccessiveHalving::new("hyperband", config, config.brackets))
        }
    }
}

/// The stopping half of BOHB: asynchronous successive halving over every bracket of
/// `schedule`, bracket `b` with its first rung at the `b`-th budget (the last
/// bracket runs its trials to the largest budget), each trial in the bracket
/// [`HyperbandSchedule::bracket_of`] its index gives, so brackets get Hyperband's
/// shares of the configurations. A rung keeps a trial when fewer than ⌈n/η⌉ of the
/// n values recorded there are strictly better, as ASHA: xp stops trials and never
/// pauses them, so a rung decides on what it knows when the trial reaches it.
pub fn make_bohb_rule(schedule: HyperbandSchedule) -> Box<dyn StoppingRule> {
    let reduction_factor = schedule.reduction_factor();
    let max_t = schedule.max_budget();
    let brackets = schedule
        .budgets()
        .into_iter()
        .map(|first| Bracket::new(first, reduction_factor, max_t))
        .collect();
    Box::new(SuccessiveHalving {
        rule: "bohb",
        limit: "max_budget",
        max_t,
        brackets,
        schedule: Some(schedule),
        arrivals: 0,
        trials: BTreeMap::new(),
        shown_sign: 1.0,
    })
}

/// What every rule tracks per trial to answer stale reports consistently.
#[derive(Debug, Default)]
struct Tracked<T> {
    last_step: Option<u64>,
    stop: Option<Verdict>,
    finished: bool,
    state: T,
}

/// Looks up `trial` for a fresh report at `step` and records the step, or returns
/// the answer to a stale report, which must not be recorded.
fn admit<T>(
    trials: &mut BTreeMap<u64, Tracked<T>>,
    trial: u64,
    step: u64,
    new_state: impl FnOnce() -> T,
) -> Result<&mut Tracked<T>, Verdict> {
    let tracked = trials.entry(trial).or_insert_with(|| Tracked {
        last_step: None,
        stop: None,
        finished: false,
        state: new_state(),
    });
    if let Some(stop) = &tracked.stop {
        return Err(stop.clone());
    }
    if tracked.finished || tracked.last_step.is_some_and(|last| step <= last) {
        return Err(Verdict::Continue);
    }
    tracked.last_step = Some(step);
    Ok(tracked)
}

/// Marks `trial` finished, so that late reports from it are ignored.
fn mark_finished<T: Default>(trials: &mut BTreeMap<u64, Tracked<T>>, trial: u64) {
    trials
        .entry(trial)
        .or_insert_with(|| Tracked {
            last_step: None,
            stop: None,
            finished: true,
            state: T::default(),
        })
        .finished = true;
}

/// NaN is the worst possible value: a diverged trial must lose every comparison.
fn sanitize(value: f64) -> f64 {
    if value.is_nan() { f64::INFINITY } else { value }
}

/// Formats a value with six significant digits for reasons, without noise digits.
fn show(value: f64) -> String {
    if value == 0.0 || !value.is_finite() {
        return format!("{value}");
    }
    let magnitude = value.abs().log10().floor() as i32;
    if !(-4..6).contains(&magnitude) {
        return format!("{value:.5e}");
    }
    let decimals = (5 - magnitude).max(0) as usize;
    let text = format!("{value:.decimals$}");
    if text.contains('.') {
        text.trim_end_matches('0').trim_end_matches('.').to_owned()
    } else {
        text
    }
}

/// The median stopping rule, in Ray Tune's form of Vizier's rule.
///
/// At a report at step `t >= grace_period`, the trial's best value so far (over all
/// its reports) is compared with the median of the running averages of the other
/// trials that have reached step `t`; each running average is over that trial's
/// reports at steps in `[grace_period, t]`. Trials that finished or were stopped
/// still count: their history is the reference. The trial is stopped when its best
/// is strictly worse, and only when at least `min_samples` other trials are in the
/// comparison. Comparing a best against averages, as Vizier does, is lenient on
/// purpose: a trial is stopped only when even its best moment trails its peers'
/// typical performance.
#[derive(Debug)]
struct MedianRule {
    grace_period: u64,
    min_samples: usize,
    trials: BTreeMap<u64, Tracked<History>>,
    /// 1, or -1 when values reach the rule negated (`show_maximized`).
    shown_sign: f64,
}

/// One trial's reports, as the median rule needs them.
#[derive(Debug, Default)]
struct History {
    /// The best (lowest) value over all reports.
    best: f64,
    /// Steps of the reports at or after the grace period, increasing.
    scoped_steps: Vec<u64>,
    /// `scoped_sums[i]` is the sum of the first `i + 1` scoped values.
    scoped_sums: Vec<f64>,
}

impl History {
    fn new() -> Self {
        Self {
            best: f64::INFINITY,
            scoped_steps: Vec::new(),
            scoped_sums: Vec::new(),
        }
    }

    /// The mean of the scoped values at steps up to `step`, if any.
    fn running_mean(&self, step: u64) -> Option<f64> {
        let count = self.scoped_steps.partition_point(|&scoped| scoped <= step);
        (count > 0).then(|| self.scoped_sums[count - 1] / count as f64)
    }
}

impl StoppingRule for MedianRule {
    fn report(&mut self, trial: u64, step: u64, value: f64) -> Verdict {
        let value = sanitize(value);
        let grace_period = self.grace_period;
        let history = match admit(&mut self.trials, trial, step, History::new) {
            Ok(tracked) => &mut tracked.state,
            Err(stale) => return stale,
        };
        history.best = history.best.min(value);
        if step >= grace_period {
            let sum = history.scoped_sums.last().copied().unwrap_or(0.0) + value;
            history.scoped_steps.push(step);
            history.scoped_sums.push(sum);
        }
        let best = history.best;
        if step < grace_period {
            return Verdict::Continue;
        }
        let mut peer_means: Vec<f64> = self
            .trials
            .iter()
            .filter(|(other, tracked)| {
                **other != trial && tracked.last_step.is_some_and(|last| last >= step)
            })
            .filter_map(|(_, tracked)| tracked.state.running_mean(step))
            .collect();
        if peer_means.len() < self.min_samples {
            return Verdict::Continue;
        }
        peer_means.sort_by(f64::total_cmp);
        let middle = peer_means.len() / 2;
        let median = if peer_means.len() % 2 == 1 {
            peer_means[middle]
        } else {
            (peer_means[middle - 1] + peer_means[middle]) / 2.0
        };
        if best <= median {
            return Verdict::Continue;
        }
        let decision = Verdict::Stop {
            rule: "median",
            reason: format!(
                "best value {} by step {step} is worse than the median {} of the running averages of {} other trials at step {step}",
                show(self.shown_sign * best),
                show(self.shown_sign * median),
                peer_means.len()
            ),
        };
        if let Some(tracked) = self.trials.get_mut(&trial) {
            tracked.stop = Some(decision.clone());
        }
        decision
    }

    fn show_maximized(&mut self) {
        self.shown_sign = -1.0;
    }

    fn finished(&mut self, trial: u64) {
        mark_finished(&mut self.trials, trial);
    }
}

/// One successive-halving bracket: rungs at `grace * η^k` below `max_t`, each
/// holding every value recorded there so far.
#[derive(Debug)]
struct Bracket {
    grace_period: u64,
    reduction_factor: u64,
    rungs: Vec<Rung>,
}

#[derive(Debug)]
struct Rung {
    milestone: u64,
    /// Every value recorded at this rung, sorted increasing (best first).
    sorted_values: Vec<f64>,
}

/// A rung's verdict on a trial that reached it.
struct RungVerdict {
    milestone: u64,
    rank: usize,
    recorded: usize,
    kept: usize,
}

impl Bracket {
    fn new(grace_period: u64, reduction_factor: u64, max_t: u64) -> Self {
        let mut rungs = Vec::new();
        let mut milestone = Some(grace_period);
        while let Some(step) = milestone.filter(|step| *step < max_t) {
            rungs.push(Rung {
                milestone: step,
                sorted_values: Vec::new(),
            });
            milestone = step.checked_mul(reduction_factor);
        }
        Self {
            grace_period,
            reduction_factor,
            rungs,
        }
    }

    /// Judges a trial at the highest rung at or below `step` that it has not yet
    /// passed (`*next_rung` is the first such rung); lower rungs it skipped are not
    /// recorded, because its value at `step` says nothing about those steps.
    ///
    /// The value is recorded, and the trial is kept when fewer than ⌈n/η⌉ of the n
    /// values now at the rung (its own included) are strictly better: so a trial in
    /// the top 1/η is always kept, ties are kept, and the first trials to reach a
    /// rung are kept because nothing better is known yet (ASHA decides on what it
    /// knows now and never waits). Returns `None` when no rung was reached.
    fn judge(&mut self, next_rung: &mut usize, step: u64, value: f64) -> Option<RungVerdict> {
        let rung_idx = self
            .rungs
            .iter()
            .rposition(|rung| rung.milestone <= step)
            .filter(|&rung_idx| rung_idx >= *next_rung)?;
        *next_rung = rung_idx + 1;
        let rung = &mut self.rungs[rung_idx];
        let better = rung
            .sorted_values
            .partition_point(|&recorded| recorded < value);
        rung.sorted_values.insert(better, value);
        let recorded = rung.sorted_values.len();
        Some(RungVerdict {
            milestone: rung.milestone,
            rank: better + 1,
            recorded,
            kept: recorded.div_ceil(self.reduction_factor as usize),
        })
    }
}

/// ASHA (one bracket) and asynchronous Hyperband (several): every trial is
/// assigned a bracket by arrival order, round-robin (by its index under BOHB's
/// `schedule`), and that bracket's rungs judge it; any trial that reaches `max_t`
/// is stopped there.
#[derive(Debug)]
struct SuccessiveHalving {
    rule: &'static str,
    /// The name of `max_t` in the spec, for reasons.
    limit: &'static str,
    max_t: u64,
    brackets: Vec<Bracket>,
    /// BOHB's schedule, which assigns brackets by trial index.
    schedule: Option<HyperbandSchedule>,
    /// How many trials have been assigned a bracket.
    arrivals: usize,
    trials: BTreeMap<u64, Tracked<Progress>>,
    /// 1, or -1 when values reach the rule negated (`show_maximized`).
    shown_sign: f64,
}

/// A trial's place in successive halving.
#[derive(Debug, Default)]
struct Progress {
    bracket_idx: usize,
    /// The first rung of its bracket the trial has not yet been judged at.
    next_rung: usize,
}

impl SuccessiveHalving {
    fn new(rule: &'static str, config: &StoppingConfig, n_brackets: u32) -> Self {
        let reduction_factor = u64::from(config.reduction_factor);
        let mut brackets = Vec::new();
        let mut grace_period = config.grace_period;
        for _ in 0..n_brackets {
            brackets.push(Bracket::new(grace_period, reduction_factor, config.max_t));
            grace_period = grace_period.saturating_mul(reduction_factor);
        }
        Self {
            rule,
            limit: "max_t",
            max_t: config.max_t,
            brackets,
            schedule: None,
            arrivals: 0,
            trials: BTreeMap::new(),
            shown_sign: 1.0,
        }
    }
}

impl StoppingRule for SuccessiveHalving {
    fn report(&mut self, trial: u64, step: u64, value: f64) -> Verdict {
        let value = sanitize(value);
        let n_brackets = self.brackets.len();
        let arrivals = &mut self.arrivals;
        let schedule = self.schedule;
        let tracked = match admit(&mut self.trials, trial, step, || {
            let bracket_idx = match schedule {
                Some(schedule) => schedule.bracket_of(trial),
                None => *arrivals % n_brackets,
            };
            *arrivals += 1;
            Progress {
                bracket_idx,
                next_rung: 0,
            }
        }) {
            Ok(tracked) => tracked,
            Err(stale) => return stale,
        };
        let bracket = &mut self.brackets[tracked.state.bracket_idx];
        let verdict = bracket.judge(&mut tracked.state.next_rung, step, value);
        let reason = if step >= self.max_t {
            format!("reached {} {} at step {step}", self.limit, self.max_t)
        } else {
            match verdict {
                Some(verdict) if verdict.rank > verdict.kept => {
                    let place = if n_brackets > 1 {
                        format!(
                            " of bracket {} (grace period {})",
                            tracked.state.bracket_idx, bracket.grace_period
                        )
                    } else {
                        String::new()
                    };
                    format!(
                        "value {} at step {step} ranks {} of {} at rung {}{place}; only the top {} (1/{}) continue",
                        show(self.shown_sign * value),
                        verdict.rank,
                        verdict.recorded,
                        verdict.milestone,
                        verdict.kept,
                        bracket.reduction_factor
                    )
                }
                _ => return Verdict::Continue,
            }
        };
        let decision = Verdict::Stop {
            rule: self.rule,
            reason,
        };
        tracked.stop = Some(decision.clone());
        decision
    }

    fn show_maximized(&mut self) {
        self.shown_sign = -1.0;
    }

    fn finished(&mut self, trial: u64) {
        mark_finished(&mut self.trials, trial);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use xp_runtime::spec::DEFAULT_MAX_T;

    fn config(rule: RuleKind, grace_period: u64, max_t: u64) -> StoppingConfig {
        StoppingConfig {
            grace_period,
            max_t,
            ..StoppingConfig::new(rule)
        }
    }

    /// Feeds `(trial, step, value)` reports in order and checks that exactly the
    /// listed `(trial, step)` reports were answered with a stop.
    fn check_stops(config: &StoppingConfig, reports: &[(u64, u64, f64)], expected: &[(u64, u64)]) {
        let mut rule = make_rule(config);
        let stops: Vec<(u64, u64)> = reports
            .iter()
            .filter(|&&(trial, step, value)| rule.report(trial, step, value).is_stop())
            .map(|&(trial, step, _)| (trial, step))
            .collect();
        assert_eq!(stops, expected);
    }

    fn reason(decision: Verdict) -> String {
        match decision {
            Verdict::Stop { reason, .. } => reason,
            Verdict::Continue => panic!("expected a stop"),
        }
    }

    #[test]
    fn median_rule_hand_computed() {
        let median = StoppingConfig {
            min_samples: 2,
            ..config(RuleKind::Median, 1, 81)
        };
        check_stops(
            &median,
            &[
                (1, 1, 0.5),  // No peers.
                (2, 1, 0.6),  // One peer, fewer than min_samples.
                (3, 1, 0.9),  // Peers 0.5, 0.6: median 0.55 < 0.9.
                (1, 2, 0.3),  // Nobody else has reached step 2.
                (2, 2, 0.4),  // One peer at step 2.
                (4, 1, 0.7),  // Peers 0.5, 0.6, 0.9: median 0.6 < 0.7.
                (5, 1, 0.6),  // Peers 0.5, 0.6, 0.9, 0.7 (stopped ones count): 0.65.
                (5, 2, 0.45), // Peers' averages 0.4, 0.5: median 0.45, a tie continues.
                (5, 3, 0.44), // Nobody else has reached step 3.
            ],
            &[(3, 1), (4, 1)],
        );
    }

    #[test]
    fn median_rule_compares_best_against_running_averages_from_the_grace_period() {
        let median = StoppingConfig {
            min_samples: 1,
            ..config(RuleKind::Median, 2, 81)
        };
        let mut rule = make_rule(&median);
        for (trial, step, value) in [
            (1, 1, 0.9), // Before the grace period.
            (1, 2, 0.5), // No peers.
            (2, 1, 0.2),
            (2, 2, 0.6), // Best 0.2 (step 1 counts for the best) < peer 0.5.
            (2, 3, 0.6),
            (1, 3, 0.7), // Best 0.5 < peer average over steps 2..3, 0.6.
            (3, 1, 0.1),
            (3, 2, 0.9), // Best 0.1.
            (3, 3, 0.9),
        ] {
            assert_eq!(rule.report(trial, step, value), Verdict::Continue);
        }
        // Averages over steps 2..=3: trial 1 0.6 (its 0.9 at step 1 is out of scope),
        // trial 2 0.6, trial 3 0.9; median 0.6 < 0.61.
        assert_eq!(
            reason(rule.report(4, 3, 0.61)),
            "best value 0.61 by step 3 is worse than the median 0.6 of the running averages of 3 other trials at step 3"
        );
    }

    #[test]
    fn asha_hand_computed() {
        let asha = config(RuleKind::Asha, 1, 9); // Rungs 1 and 3; 9 is max_t.
        check_stops(
            &asha,
            &[
                (1, 1, 0.5),  // 1st of 1, keep 1.
                (2, 1, 0.4),  // 1st of 2, keep 1.
                (3, 1, 0.6),  // 3rd of 3, keep 1.
                (4, 1, 0.45), // 2nd of 4, keep 2.
                (5, 1, 0.7),  // 5th of 5, keep 2.
                (6, 1, 0.1),  // 1st of 6.
                (7, 1, 0.42), // 3rd of 7, keep 3.
                (2, 2, 0.35), // Not a rung.
                (2, 3, 0.3),  // 1st at rung 3.
                (1, 4, 0.35), // Skipped to step 4: judged at rung 3, 2nd of 2, keep 1.
                (6, 3, 0.3),  // Ties with the best at rung 3: kept.
                (2, 9, 0.2),  // max_t.
            ],
            &[(3, 1), (5, 1), (1, 4), (2, 9)],
        );
        let mut rule = make_rule(&asha);
        rule.report(1, 1, 0.1);
        assert_eq!(
            rule.report(2, 1, 0.2),
            Verdict::Stop {
                rule: "asha",
                reason: "value 0.2 at step 1 ranks 2 of 2 at rung 1; only the top 1 (1/3) continue"
                    .to_owned(),
            }
        );
        assert_eq!(
            reason(rule.report(1, 81, 0.05)),
            "reached max_t 9 at step 81"
        );
    }

    #[test]
    fn hyperband_hand_computed() {
        // Bracket 0: rungs 1, 3; bracket 1: rung 3; trials alternate by arrival.
        let hyperband = StoppingConfig {
            brackets: 2,
            ..config(RuleKind::Hyperband, 1, 9)
        };
        check_stops(
            &hyperband,
            &[
                (10, 1, 0.5),  // Bracket 0, 1st of 1 at rung 1.
                (11, 1, 0.9),  // Bracket 1: no rung at step 1.
                (12, 1, 0.8),  // Bracket 0, 2nd of 2 at rung 1.
                (13, 1, 0.95), // Bracket 1.
                (11, 3, 0.5),  // Bracket 1, 1st at rung 3.
                (13, 3, 0.6),  // Bracket 1, 2nd of 2 at rung 3.
                (10, 3, 0.7),  // Bracket 0, 1st at its own rung 3.
                (10, 9, 0.4),  // max_t.
                (14, 5, 0.1),  // Bracket 0, judged at rung 3: best.
                (15, 9, 0.1),  // Bracket 1, max_t at once.
            ],
            &[(12, 1), (13, 3), (10, 9), (15, 9)],
        );
        let mut rule = make_rule(&hyperband);
        rule.report(10, 1, 0.5);
        rule.report(11, 3, 0.5);
        rule.report(12, 1, 0.5);
        assert_eq!(
            reason(rule.report(13, 3, 0.6)),
            "value 0.6 at step 3 ranks 2 of 2 at rung 3 of bracket 1 (grace period 3); only the top 1 (1/3) continue"
        );
    }

    #[test]
    fn a_trial_alone_is_never_stopped_before_max_t() {
        for rule_kind in [RuleKind::Median, RuleKind::Asha, RuleKind::Hyperband] {
            let mut rule = make_rule(&StoppingConfig::new(rule_kind));
            for step in 1..DEFAULT_MAX_T {
                assert_eq!(rule.report(7, step, 1.0 / step as f64), Verdict::Continue);
            }
        }
    }

    #[test]
    fn stale_and_late_reports_are_not_recorded() {
        let mut rule = make_rule(&config(RuleKind::Asha, 1, 81));
        assert_eq!(rule.report(1, 1, 0.5), Verdict::Continue);
        // A replayed step with a worse value does not enter rung 1.
        assert_eq!(rule.report(1, 1, 0.9), Verdict::Continue);
        assert_eq!(rule.report(2, 1, 0.6), rule_stop_at_rung_one(0.6, 2));
        // A stopped trial is told again; its later value is not recorded.
        assert_eq!(rule.report(2, 3, 0.0), rule_stop_at_rung_one(0.6, 2));
        rule.finished(1);
        assert_eq!(rule.report(1, 3, 0.9), Verdict::Continue);
        // Trial 3 at rung 3 is first there: trial 2's 0.0 was never recorded.
        assert_eq!(rule.report(3, 3, 0.5), Verdict::Continue);
        rule.finished(99);
        assert_eq!(rule.report(99, 1, 10.0), Verdict::Continue);
    }

    #[test]
    fn a_maximised_metric_is_shown_with_its_sign() {
        // Accuracies 0.9 and 0.6, negated for the rule as callers do for max.
        let mut rule = make_rule(&config(RuleKind::Asha, 1, 81));
        rule.show_maximized();
        assert_eq!(rule.report(1, 1, -0.9), Verdict::Continue);
        let Verdict::Stop { reason, .. } = rule.report(2, 1, -0.6) else {
            panic!("the worse accuracy stops");
        };
        assert!(
            reason.starts_with("value 0.6 at step 1 ranks 2 of 2"),
            "{reason}"
        );
        let mut median = make_rule(&StoppingConfig {
            grace_period: 1,
            min_samples: 1,
            ..StoppingConfig::new(RuleKind::Median)
        });
        median.show_maximized();
        for step in 1..=3 {
            let _ = median.report(1, step, -0.9);
        }
        let Verdict::Stop { reason, .. } = median.report(2, 3, -0.5) else {
            panic!("the worse accuracy stops");
        };
        assert!(
            reason.starts_with("best value 0.5 by step 3 is worse than the median 0.9"),
            "{reason}"
        );
    }

    fn rule_stop_at_rung_one(value: f64, recorded: usize) -> Verdict {
        Verdict::Stop {
            rule: "asha",
            reason: format!(
                "value {value} at step 1 ranks {recorded} of {recorded} at rung 1; only the top 1 (1/3) continue"
            ),
        }
    }

    #[test]
    fn nan_is_the_worst_value() {
        let mut rule = make_rule(&config(RuleKind::Asha, 1, 81));
        rule.report(1, 1, 0.5);
        assert!(rule.report(2, 1, f64::NAN).is_stop());
        let mut median = make_rule(&StoppingConfig {
            min_samples: 1,
            ..config(RuleKind::Median, 1, 81)
        });
        median.report(1, 1, 0.5);
        assert!(median.report(2, 1, f64::NAN).is_stop());
    }

    #[test]
    fn numbers_in_reasons_are_short() {
        assert_eq!(show(0.30000000000000004), "0.3");
        assert_eq!(show(0.41), "0.41");
        assert_eq!(show(123.456789), "123.457");
        assert_eq!(show(-2.5), "-2.5");
        assert_eq!(show(1e-7), "1.00000e-7");
        assert_eq!(show(f64::INFINITY), "inf");
    }

    proptest! {
        /// ASHA never stops a trial in the top 1/η of its rung at decision time.
        /// Trials report exactly at the rung milestones, so the test knows which
        /// rung judged each report and keeps its own record of every rung.
        #[test]
        fn asha_keeps_the_top_fraction(
            reduction_factor in 2_u32..5,
            grace_period in 1_u64..4,
            schedule in proptest::collection::vec((0_u64..12, 0_u32..50), 1..200),
        ) {
            let max_t = grace_period * u64::from(reduction_factor).pow(4);
            let asha = StoppingConfig {
                reduction_factor,
                ..config(RuleKind::Asha, grace_period, max_t)
            };
            let mut rule = make_rule(&asha);
            let mut next_rung: BTreeMap<u64, u32> = BTreeMap::new();
            let mut recorded: BTreeMap<u64, Vec<f64>> = BTreeMap::new();
            for (trial, quantized) in schedule {
                let rung = next_rung.get(&trial).copied().unwrap_or(0);
                if rung >= 4 {
                    continue;
                }
                let step = grace_period * u64::from(reduction_factor).pow(rung);
                let value = f64::from(quantized) / 10.0;
                let decision = rule.report(trial, step, value);
                let values = recorded.entry(step).or_default();
                values.push(value);
                let better = values.iter().filter(|&&other| other < value).count();
                let in_top_fraction =
                    (better + 1) as f64 <= values.len() as f64 / f64::from(reduction_factor);
                prop_assert!(!(decision.is_stop() && in_top_fraction), "{decision:?}");
                // A trial that is not stopped and still not in the top ⌈n/η⌉ is a bug too.
                prop_assert_eq!(decision.is_stop(), better >= values.len().div_ceil(reduction_factor as usize));
                next_rung.insert(trial, if decision.is_stop() { u32::MAX } else { rung + 1 });
            }
        }
    }
}
