//! The alert rules' evaluation, pure: what one trial's reports and the passing
//! of time make of its rules. No clock, no records, no I/O: the time comes in as
//! an argument and verdicts come out; the core turns them into alerts.
//!
//! Invariant: a rule raises at most once until it clears (no flood): each rule
//! has an `active` flag per trial, set by a raise and reset by the clear that
//! follows once its condition no longer holds.

use std::collections::BTreeMap;

use xp_runtime::clock::UnixMillis;
use xp_runtime::metric_value::nonfinite_name;
use xp_runtime::spec::{AlertCondition, AlertRule};

/// The most non-finite metrics one message names (a name is at most 128 bytes).
const MAX_LISTED: usize = 4;

/// A rule's condition began to hold: an alert to raise.
#[derive(Debug, Clone, PartialEq)]
pub(super) struct Firing {
    /// The rule's position in the rules given.
    pub rule: usize,
    /// The metric concerned.
    pub metric: Option<String>,
    /// The value that fired it.
    pub value: Option<f64>,
    /// What happened, in words.
    pub message: String,
}

/// What a rule's evaluation decided.
#[derive(Debug, Clone, PartialEq)]
pub(super) enum Verdict {
    /// Raise an alert.
    Raise(Firing),
    /// The active alert of this rule (by its position) cleared.
    Clear(usize),
}

/// One trial's evaluation state across its rules.
#[derive(Debug, Clone, Default)]
pub(super) struct TrialWatch {
    /// When rank 0 last reported a metric.
    last_report_at: Option<UnixMillis>,
    /// Per rule name.
    rules: BTreeMap<String, RuleWatch>,
}

#[derive(Debug, Clone, Default)]
struct RuleWatch {
    /// Raised and not cleared.
    active: bool,
    /// Divergence: the EMA so far.
    ema: Option<f64>,
    /// Divergence: the smallest EMA so far.
    smoothed_min: Option<f64>,
    /// Divergence: finite values seen.
    seen: u64,
    /// GPU underuse: since when utilisation has been low.
    low_since: Option<UnixMillis>,
}

/// Whether the condition holds now: `Some(firing)` when it does, `None` when it
/// does not, and the rule keeps its state when the report says nothing about it.
enum Judgement {
    Holds(Firing),
    Clear,
    Silent,
}

/// How a value reads in a message.
fn shown(value: f64) -> String {
    nonfinite_name(value).map_or_else(|| format!("{value}"), str::to_owned)
}

fn at_step(step: Option<u64>) -> String {
    step.map(|step| format!(" at step {step}"))
        .unwrap_or_default()
}

impl TrialWatch {
    /// Marks that an alert of this rule is active (restored after a restart),
    /// so it is not raised again until it clears.
    pub(super) fn mark_active(&mut self, rule_name: &str) {
        self.rules.entry(rule_name.to_owned()).or_default().active = true;
    }

    /// Judges a metric report of rank 0 against `rules`.
    pub(super) fn on_metric(
        &mut self,
        rules: &[AlertRule],
        now: UnixMillis,
        step: Option<u64>,
        values: &BTreeMap<String, f64>,
    ) -> Vec<Verdict> {
        self.last_report_at = Some(now);
        let mut verdicts = Vec::new();
        for (index, rule) in rules.iter().enumerate() {
            let watch = self
                .rules
                .entry(rule.effective_name().to_owned())
                .or_default();
            let judgement = match rule.condition() {
                AlertCondition::Nonfinite { metric } => {
                    judge_nonfinite(index, metric.as_deref(), step, values)
                }
                AlertCondition::Threshold {
                    metric,
                    above,
                    below,
                } => judge_threshold(index, &metric, (above, below), step, values),
                AlertCondition::Divergence {
                    metric,
                    factor,
                    smoothing,
                    min_steps,
                } => {
                    let shape = Divergence {
                        factor,
                        smoothing,
                        min_steps,
                    };
                    judge_divergence(watch, index, &metric, shape, step, values)
                }
                AlertCondition::Stalled { .. } => Judgement::Clear,
                AlertCondition::GpuUnderused { .. } => Judgement::Silent,
            };
            apply(watch, judgement, index, &mut verdicts);
        }
        verdicts
    }

    /// Judges the time-based rules at `now`: `running_since` is when the trial's
    /// live attempt had every worker running (`None` when it is not running), and
    /// `gpu_utilisation` its latest GPU utilisation as a fraction (`None` when it
    /// holds no GPU or no telemetry came, so `gpu_underused` never fires).
    pub(super) fn on_tick(
        &mut self,
        rules: &[AlertRule],
        now: UnixMillis,
        running_since: Option<UnixMillis>,
        gpu_utilisation: Option<f64>,
    ) -> Vec<Verdict> {
        let mut verdicts = Vec::new();
        for (index, rule) in rules.iter().enumerate() {
            let condition = rule.condition();
            if !matches!(
                condition,
                AlertCondition::Stalled { .. } | AlertCondition::GpuUnderused { .. }
            ) {
                continue;
            }
            let watch = self
                .rules
                .entry(rule.effective_name().to_owned())
                .or_default();
            let judgement = match condition {
                AlertCondition::Stalled { for_ms } => match running_since {
                    Some(since) => {
                        let quiet_from = self.last_report_at.map_or(since, |last| last.max(since));
                        let quiet = now.saturating_sub(quiet_from);
                        if quiet >= for_ms {
                            Judgement::Holds(Firing {
                                rule: index,
                                metric: None,
                                value: None,
                                message: format!(
                                    "no metric report for {} while running",
                                    humantime::format_duration(std::time::Duration::from_secs(
                                        quiet / 1000
                                    ))
                                ),
                            })
                        } else {
                            Judgement::Clear
                        }
                    }
                    None => Judgement::Clear,
                },
                AlertCondition::GpuUnderused { below, for_ms } => {
                    match gpu_utilisation.filter(|_| running_since.is_some()) {
                        Some(utilisation) if utilisation < below => {
                            let since = *watch.low_since.get_or_insert(now);
                            if now.saturating_sub(since) >= for_ms {
                                Judgement::Holds(Firing {
                                    rule: index,
                                    metric: None,
                                    value: Some(utilisation),
                                    message: format!(
                                        "GPU utilisation {:.0}% below {:.0}% for {}",
                                        utilisation * 100.0,
                                        below * 100.0,
                                        humantime::format_duration(std::time::Duration::from_secs(
                                            now.saturating_sub(since) / 1000
                                        ))
                                    ),
                                })
                            } else {
                                Judgement::Silent
                            }
                        }
                        _ => {
                            watch.low_since = None;
                            Judgement::Clear
                        }
                    }
                }
                _ => Judgement::Silent,
            };
            apply(watch, judgement, index, &mut verdicts);
        }
        verdicts
    }
}

/// A divergence rule's shape: how far past its smoothed minimum the EMA of
/// a metric may go, how smooth, and after how many reports it is judged.
#[derive(Debug, Clone, Copy)]
struct Divergence {
    factor: f64,
    smoothing: f64,
    min_steps: u64,
}

/// `nonfinite`: a watched metric (any, when the rule names none) is NaN or
/// infinite. A rule naming a metric the report lacks says nothing.
fn judge_nonfinite(
    rule: usize,
    metric: Option<&str>,
    step: Option<u64>,
    values: &BTreeMap<String, f64>,
) -> Judgement {
    let bad: Vec<(&String, f64)> = values
        .iter()
        .filter(|(name, value)| !value.is_finite() && metric.is_none_or(|wanted| wanted == *name))
        .map(|(name, value)| (name, *value))
        .collect();
    let watched = metric.is_none_or(|name| values.contains_key(name));
    let Some((name, value)) = bad.first() else {
        return if watched {
            Judgement::Clear
        } else {
            Judgement::Silent
        };
    };
    // At most a few names, so a message stays short whatever a line carries.
    let mut listed: Vec<String> = bad
        .iter()
        .take(MAX_LISTED)
        .map(|(name, value)| format!("{name} is {}", shown(*value)))
        .collect();
    if bad.len() > MAX_LISTED {
        listed.push(format!("{} more", bad.len() - MAX_LISTED));
    }
    Judgement::Holds(Firing {
        rule,
        metric: Some((*name).clone()),
        value: Some(*value),
        message: format!("{}{}", listed.join(", "), at_step(step)),
    })
}

/// `threshold`: the metric is above or below its bound. A non-finite value
/// is the `nonfinite` rule's; it says nothing here.
fn judge_threshold(
    rule: usize,
    metric: &str,
    (above, below): (Option<f64>, Option<f64>),
    step: Option<u64>,
    values: &BTreeMap<String, f64>,
) -> Judgement {
    let Some(value) = values.get(metric).filter(|value| value.is_finite()) else {
        return Judgement::Silent;
    };
    let past = above
        .filter(|above| value > above)
        .map(|above| format!("above {above}"))
        .or_else(|| {
            below
                .filter(|below| value < below)
                .map(|below| format!("below {below}"))
        });
    match past {
        Some(bound) => Judgement::Holds(Firing {
            rule,
            metric: Some(metric.to_owned()),
            value: Some(*value),
            message: format!("{metric} is {value}{}, {bound}", at_step(step)),
        }),
        None => Judgement::Clear,
    }
}

/// `divergence`: the metric's EMA is `factor` x its smoothed minimum (for a
/// negative minimum, the same distance above it), once `min_steps` reports
/// were seen; `watch` keeps the EMA and the minimum between reports.
fn judge_divergence(
    watch: &mut RuleWatch,
    rule: usize,
    metric: &str,
    shape: Divergence,
    step: Option<u64>,
    values: &BTreeMap<String, f64>,
) -> Judgement {
    let Some(value) = values.get(metric).filter(|value| value.is_finite()) else {
        return Judgement::Silent;
    };
    let Divergence {
        factor,
        smoothing,
        min_steps,
    } = shape;
    let ema = watch
        .ema
        .map_or(*value, |ema| smoothing * ema + (1.0 - smoothing) * value);
    watch.ema = Some(ema);
    let smoothed_min = watch.smoothed_min.map_or(ema, |min| min.min(ema));
    watch.smoothed_min = Some(smoothed_min);
    watch.seen += 1;
    let limit = smoothed_min + (factor - 1.0) * smoothed_min.abs();
    if watch.seen < min_steps || ema <= limit {
        return Judgement::Clear;
    }
    Judgement::Holds(Firing {
        rule,
        metric: Some(metric.to_owned()),
        value: Some(*value),
        message: format!(
            "{metric} diverges{}: its EMA {ema:.6} is past {factor} x its smoothed minimum {smoothed_min:.6}",
            at_step(step)
        ),
    })
}

/// Raises on the first judgement that holds, clears on the first that does not.
fn apply(watch: &mut RuleWatch, judgement: Judgement, index: usize, verdicts: &mut Vec<Verdict>) {
    match judgement {
        Judgement::Holds(firing) if !watch.active => {
            watch.active = true;
            verdicts.push(Verdict::Raise(firing));
        }
        Judgement::Clear if watch.active => {
            watch.active = false;
            verdicts.push(Verdict::Clear(index));
        }
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rules(yaml: &str) -> Vec<AlertRule> {
        // The policy file parses and validates `alerts:` like a spec does.
        xp_sched::PolicyConfig::from_yaml(&format!("alerts: {yaml}\n"))
            .unwrap()
            .alerts
    }

    fn report(pairs: &[(&str, f64)]) -> BTreeMap<String, f64> {
        pairs
            .iter()
            .map(|(name, value)| (name.to_string(), *value))
            .collect()
    }

    fn raised(verdicts: &[Verdict]) -> Vec<usize> {
        verdicts
            .iter()
            .filter_map(|verdict| match verdict {
                Verdict::Raise(firing) => Some(firing.rule),
                Verdict::Clear(_) => None,
            })
            .collect()
    }

    fn cleared(verdicts: &[Verdict]) -> Vec<usize> {
        verdicts
            .iter()
            .filter_map(|verdict| match verdict {
                Verdict::Clear(rule) => Some(*rule),
                Verdict::Raise(_) => None,
            })
            .collect()
    }

    #[test]
    fn nonfinite_raises_once_until_a_finite_report_clears_it() {
        let rules = rules("[{kind: nonfinite}]");
        let mut watch = TrialWatch::default();
        let first = watch.on_metric(
            &rules,
            1,
            Some(3),
            &report(&[("loss", f64::NAN), ("acc", 0.5)]),
        );
        let Verdict::Raise(firing) = &first[0] else {
            panic!("{first:?}")
        };
        assert_eq!(firing.metric.as_deref(), Some("loss"));
        assert!(firing.value.unwrap().is_nan());
        assert_eq!(firing.message, "loss is NaN at step 3");
        // No flood: more NaNs raise nothing more.
        for step in 4..100 {
            let verdicts = watch.on_metric(
                &rules,
                step,
                Some(step),
                &report(&[("loss", f64::INFINITY)]),
            );
            assert!(verdicts.is_empty(), "{verdicts:?}");
        }
        assert_eq!(
            cleared(&watch.on_metric(&rules, 200, None, &report(&[("loss", 1.0)]))),
            [0]
        );
        assert_eq!(
            raised(&watch.on_metric(&rules, 201, None, &report(&[("x", f64::NEG_INFINITY)]))),
            [0]
        );
        // Many at once: a few named, the rest counted.
        let many: BTreeMap<String, f64> = (0..10)
            .map(|index| (format!("m{index}"), f64::NAN))
            .collect();
        let verdicts = TrialWatch::default().on_metric(&rules, 1, None, &many);
        let Verdict::Raise(firing) = &verdicts[0] else {
            panic!("{verdicts:?}")
        };
        assert_eq!(
            firing.message,
            "m0 is NaN, m1 is NaN, m2 is NaN, m3 is NaN, 6 more"
        );
    }

    #[test]
    fn nonfinite_of_one_metric_ignores_others() {
        let rules = rules("[{kind: nonfinite, metric: loss}]");
        let mut watch = TrialWatch::default();
        assert!(
            watch
                .on_metric(&rules, 1, None, &report(&[("acc", f64::NAN)]))
                .is_empty()
        );
        assert_eq!(
            raised(&watch.on_metric(&rules, 2, None, &report(&[("loss", f64::NAN)]))),
            [0]
        );
        // A report without the metric neither raises nor clears.
        assert!(
            watch
                .on_metric(&rules, 3, None, &report(&[("acc", 1.0)]))
                .is_empty()
        );
        assert_eq!(
            cleared(&watch.on_metric(&rules, 4, None, &report(&[("loss", 1.0)]))),
            [0]
        );
    }

    #[test]
    fn threshold_fires_above_and_below_and_clears_within() {
        let rules = rules("[{kind: threshold, metric: g, above: 1e3, below: -1}]");
        let mut watch = TrialWatch::default();
        assert!(
            watch
                .on_metric(&rules, 1, None, &report(&[("g", 999.0)]))
                .is_empty()
        );
        let verdicts = watch.on_metric(&rules, 2, Some(7), &report(&[("g", 1500.0)]));
        let Verdict::Raise(firing) = &verdicts[0] else {
            panic!("{verdicts:?}")
        };
        assert_eq!(firing.message, "g is 1500 at step 7, above 1000");
        assert!(
            watch
                .on_metric(&rules, 3, None, &report(&[("g", 2000.0)]))
                .is_empty()
        );
        // NaN is not the threshold's business.
        assert!(
            watch
                .on_metric(&rules, 4, None, &report(&[("g", f64::NAN)]))
                .is_empty()
        );
        assert_eq!(
            cleared(&watch.on_metric(&rules, 5, None, &report(&[("g", 1.0)]))),
            [0]
        );
        assert_eq!(
            raised(&watch.on_metric(&rules, 6, None, &report(&[("g", -5.0)]))),
            [0]
        );
    }

    #[test]
    fn divergence_waits_min_steps_then_fires_on_a_rising_ema() {
        let rules =
            rules("[{kind: divergence, metric: loss, factor: 2, smoothing: 0.5, min_steps: 4}]");
        let mut watch = TrialWatch::default();
        // A falling loss: EMA 1, 0.75, 0.625, 0.5625: never past 2 x its minimum.
        for (step, loss) in [1.0, 0.5, 0.5, 0.5].into_iter().enumerate() {
            assert!(
                watch
                    .on_metric(&rules, step as u64, None, &report(&[("loss", loss)]))
                    .is_empty()
            );
        }
        // A spike of 10: EMA 5.28 > 2 x 0.5625.
        let verdicts = watch.on_metric(&rules, 10, Some(10), &report(&[("loss", 10.0)]));
        assert_eq!(raised(&verdicts), [0], "{verdicts:?}");
        assert!(
            watch
                .on_metric(&rules, 11, None, &report(&[("loss", 20.0)]))
                .is_empty()
        );
        // Back down: the EMA falls under the limit and the alert clears.
        let mut cleared_at = None;
        for step in 12..30 {
            let verdicts = watch.on_metric(&rules, step, None, &report(&[("loss", 0.5)]));
            if !cleared(&verdicts).is_empty() {
                cleared_at = Some(step);
                break;
            }
        }
        assert!(cleared_at.is_some());
        // Early spikes do not fire before min_steps.
        let mut early = TrialWatch::default();
        assert!(
            early
                .on_metric(&rules, 1, None, &report(&[("loss", 1.0)]))
                .is_empty()
        );
        assert!(
            early
                .on_metric(&rules, 2, None, &report(&[("loss", 100.0)]))
                .is_empty()
        );
    }

    #[test]
    fn stalled_fires_after_silence_while_running_and_clears_on_a_report() {
        let rules = rules("[{kind: stalled, for: 10s}]");
        let mut watch = TrialWatch::default();
        // Not running: never stalled.
        assert!(watch.on_tick(&rules, 100_000, None, None).is_empty());
        assert!(watch.on_tick(&rules, 5_000, Some(0), None).is_empty());
        let verdicts = watch.on_tick(&rules, 10_000, Some(0), None);
        assert_eq!(raised(&verdicts), [0]);
        assert!(
            watch.on_tick(&rules, 60_000, Some(0), None).is_empty(),
            "raised once"
        );
        assert_eq!(
            cleared(&watch.on_metric(&rules, 61_000, None, &report(&[("l", 1.0)]))),
            [0]
        );
        assert!(watch.on_tick(&rules, 70_000, Some(0), None).is_empty());
        assert_eq!(raised(&watch.on_tick(&rules, 71_000, Some(0), None)), [0]);
        // A new attempt starts the silence again.
        let mut fresh = TrialWatch::default();
        assert!(fresh.on_tick(&rules, 15_000, Some(10_000), None).is_empty());
    }

    #[test]
    fn gpu_underused_needs_low_utilisation_for_the_whole_duration() {
        let rules = rules("[{kind: gpu_underused, below: 0.2, for: 15m}]");
        let minute = 60_000;
        let mut watch = TrialWatch::default();
        // No GPU (no figure): never fires, however long.
        assert!(
            watch
                .on_tick(&rules, 100 * minute, Some(0), None)
                .is_empty()
        );
        assert!(
            watch
                .on_tick(&rules, 100 * minute, Some(0), Some(0.05))
                .is_empty()
        );
        assert!(
            watch
                .on_tick(&rules, 110 * minute, Some(0), Some(0.1))
                .is_empty()
        );
        // Busy for a moment: the low stretch starts again.
        assert!(
            watch
                .on_tick(&rules, 112 * minute, Some(0), Some(0.9))
                .is_empty()
        );
        assert!(
            watch
                .on_tick(&rules, 113 * minute, Some(0), Some(0.1))
                .is_empty()
        );
        assert!(
            watch
                .on_tick(&rules, 127 * minute, Some(0), Some(0.1))
                .is_empty()
        );
        let verdicts = watch.on_tick(&rules, 128 * minute, Some(0), Some(0.1));
        let Verdict::Raise(firing) = &verdicts[0] else {
            panic!("{verdicts:?}")
        };
        assert_eq!(firing.message, "GPU utilisation 10% below 20% for 15m");
        assert!(
            watch
                .on_tick(&rules, 200 * minute, Some(0), Some(0.1))
                .is_empty()
        );
        assert_eq!(
            cleared(&watch.on_tick(&rules, 201 * minute, Some(0), Some(0.5))),
            [0]
        );
    }

    #[test]
    fn a_restored_active_alert_is_not_raised_again() {
        let rules = rules("[{kind: nonfinite}]");
        let mut watch = TrialWatch::default();
        watch.mark_active("nonfinite");
        assert!(
            watch
                .on_metric(&rules, 1, None, &report(&[("loss", f64::NAN)]))
                .is_empty()
        );
    }
}
