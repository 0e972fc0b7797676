//! The `early_stopping` section of a search: which rule, and its numbers.
//!
//! Only the declaration and its validation live here, since every process parses
//! specs; the rules themselves are in `xp-tune`.

use serde::{Deserialize, Serialize};

/// Default [`StoppingConfig::grace_period`]: judge from the first step on.
pub const DEFAULT_GRACE_PERIOD: u64 = 1;
/// Default [`StoppingConfig::reduction_factor`], the η = 3 of the ASHA and Hyperband papers.
pub const DEFAULT_REDUCTION_FACTOR: u32 = 3;
/// Default [`StoppingConfig::max_t`]: 81 = 3^4, so η = 3 gives rungs 1, 3, 9, 27.
pub const DEFAULT_MAX_T: u64 = 81;
/// Default [`StoppingConfig::min_samples`], as Ray Tune's median rule.
pub const DEFAULT_MIN_SAMPLES: u32 = 3;
/// Default [`StoppingConfig::brackets`]: the three most aggressive Hyperband brackets.
pub const DEFAULT_BRACKETS: u32 = 3;

/// Which early-stopping rule an experiment uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum RuleKind {
    /// Stop a trial whose best value is worse than the median of its peers at the same step.
    Median,
    /// Asynchronous successive halving: keep the top 1/η at each rung.
    Asha,
    /// ASHA over several brackets with different grace periods, to hedge against slow starters.
    Hyperband,
}

/// The `early_stopping` section of an experiment spec, for example
/// `early_stopping: {rule: asha, grace_period: 1, reduction_factor: 3, max_t: 81}`.
///
/// Every field but `rule` has a default. Fields the chosen rule does not use are
/// accepted and ignored (`min_samples` is the median rule's, `brackets`
/// Hyperband's, `reduction_factor` and `max_t` belong to ASHA and Hyperband).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "lowercase")]
pub struct StoppingConfig {
    /// The rule.
    pub rule: RuleKind,
    /// No trial is judged before this step; for ASHA it is also the first rung.
    #[serde(default = "default_grace_period")]
    pub grace_period: u64,
    /// η: each ASHA rung keeps the top 1/η and the next rung is η times further.
    #[serde(default = "default_reduction_factor")]
    pub reduction_factor: u32,
    /// The most steps any trial runs under ASHA or Hyperband; a trial reaching it is stopped.
    #[serde(default = "default_max_t")]
    pub max_t: u64,
    /// The median rule judges a trial only against at least this many other trials.
    #[serde(default = "default_min_samples")]
    pub min_samples: u32,
    /// How many Hyperband brackets; bracket `s` has grace period `grace_period * η^s`.
    #[serde(default = "default_brackets")]
    pub brackets: u32,
}

fn default_grace_period() -> u64 {
    DEFAULT_GRACE_PERIOD
}

fn default_reduction_factor() -> u32 {
    DEFAULT_REDUCTION_FACTOR
}

fn default_max_t() -> u64 {
    DEFAULT_MAX_T
}

fn default_min_samples() -> u32 {
    DEFAULT_MIN_SAMPLES
}

fn default_brackets() -> u32 {
    DEFAULT_BRACKETS
}

/// Why an early-stopping configuration was refused; [`StoppingError::field`] names
/// the field so the spec layer can report its full path.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum StoppingError {
    /// A grace period of 0 would put ASHA's first rung at step 0.
    #[error("`grace_period` must be at least 1")]
    GracePeriodZero,
    /// The median rule needs at least one other trial to compare against.
    #[error("`min_samples` must be at least 1")]
    MinSamplesZero,
    /// η must be at least 2 for rungs to grow and to stop anything.
    #[error("`reduction_factor` is {reduction_factor}, it must be at least 2")]
    ReductionFactorTooSmall {
        /// The refused value.
        reduction_factor: u32,
    },
    /// A trial must be able to reach the grace period before `max_t` stops it.
    #[error("`max_t` is {max_t}, it must be at least `grace_period` ({grace_period})")]
    MaxTBelowGracePeriod {
        /// The refused value.
        max_t: u64,
        /// The grace period it must reach.
        grace_period: u64,
    },
    /// Every bracket's grace period `grace_period * η^s` must be at most `max_t`.
    #[error(
        "`brackets` is {brackets}, it must be between 1 and {max} so that every bracket's grace period fits under `max_t`"
    )]
    BracketsOutOfRange {
        /// The refused value.
        brackets: u32,
        /// The largest allowed value for this grace period, η and `max_t`.
        max: u32,
    },
}

impl StoppingError {
    /// The name of the offending field, as written in the spec.
    pub fn field(&self) -> &'static str {
        match self {
            Self::GracePeriodZero => "grace_period",
            Self::MinSamplesZero => "min_samples",
            Self::ReductionFactorTooSmall { .. } => "reduction_factor",
            Self::MaxTBelowGracePeriod { .. } => "max_t",
            Self::BracketsOutOfRange { .. } => "brackets",
        }
    }
}

impl StoppingConfig {
    /// The configuration of `rule` with every other field at its default.
    pub fn new(rule: RuleKind) -> Self {
        Self {
            rule,
            grace_period: DEFAULT_GRACE_PERIOD,
            reduction_factor: DEFAULT_REDUCTION_FACTOR,
            max_t: DEFAULT_MAX_T,
            min_samples: DEFAULT_MIN_SAMPLES,
            brackets: DEFAULT_BRACKETS,
        }
    }

    /// Checks the fields the chosen rule uses, naming the first bad one.
    pub fn validate(&self) -> Result<(), StoppingError> {
        if self.grace_period == 0 {
            return Err(StoppingError::GracePeriodZero);
        }
        match self.rule {
            RuleKind::Median => {
                if self.min_samples == 0 {
                    return Err(StoppingError::MinSamplesZero);
                }
            }
            RuleKind::Asha | RuleKind::Hyperband => {
                if self.reduction_factor < 2 {
                    return Err(StoppingError::ReductionFactorTooSmall {
                        reduction_factor: self.reduction_factor,
                    });
                }
                if self.max_t < self.grace_period {
                    return Err(StoppingError::MaxTBelowGracePeriod {
                        max_t: self.max_t,
                        grace_period: self.grace_period,
                    });
                }
                if self.rule == RuleKind::Hyperband {
                    let max = self.max_brackets();
                    if self.brackets == 0 || self.brackets > max {
                        return Err(StoppingError::BracketsOutOfRange {
                            brackets: self.brackets,
                            max,
                        });
                    }
                }
            }
        }
        Ok(())
    }

    /// `s_max + 1`: how many brackets `grace_period * η^s <= max_t` allows.
    fn max_brackets(&self) -> u32 {
        let eta = u64::from(self.reduction_factor);
        let mut count = 0;
        let mut bracket_grace = Some(self.grace_period);
        while let Some(grace) = bracket_grace.filter(|grace| *grace <= self.max_t) {
            count += 1;
            bracket_grace = grace.checked_mul(eta);
        }
        count
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(rule: RuleKind, grace_period: u64, max_t: u64) -> StoppingConfig {
        StoppingConfig {
            grace_period,
            max_t,
            ..StoppingConfig::new(rule)
        }
    }

    #[test]
    fn config_parses_with_defaults_and_refuses_unknown_fields() {
        let parsed: StoppingConfig = serde_json::from_str(r#"{"rule": "hyperband"}"#).unwrap();
        assert_eq!(parsed, StoppingConfig::new(RuleKind::Hyperband));
        assert_eq!(
            (
                parsed.grace_period,
                parsed.reduction_factor,
                parsed.max_t,
                parsed.min_samples,
                parsed.brackets
            ),
            (1, 3, 81, 3, 3)
        );
        let full: StoppingConfig = serde_json::from_str(
            r#"{"rule": "median", "grace_period": 5, "reduction_factor": 4, "max_t": 64, "min_samples": 2, "brackets": 1}"#,
        )
        .unwrap();
        assert_eq!(full.rule, RuleKind::Median);
        assert_eq!(full.grace_period, 5);
        let round_trip: StoppingConfig =
            serde_json::from_str(&serde_json::to_string(&full).unwrap()).unwrap();
        assert_eq!(round_trip, full);
        assert!(serde_json::from_str::<StoppingConfig>(r#"{"rule": "asha", "eta": 3}"#).is_err());
        assert!(serde_json::from_str::<StoppingConfig>(r#"{"rule": "pbt"}"#).is_err());
        let yaml: StoppingConfig =
            serde_saphyr::from_str("rule: asha\ngrace_period: 3\nmax_t: 27\n").unwrap();
        assert_eq!(
            yaml,
            StoppingConfig {
                grace_period: 3,
                max_t: 27,
                ..StoppingConfig::new(RuleKind::Asha)
            }
        );
        assert!(serde_saphyr::from_str::<StoppingConfig>("rule: asha\ngrace: 3\n").is_err());
        assert!(serde_json::from_str::<StoppingConfig>(r#"{"max_t": 9}"#).is_err());
    }

    #[test]
    fn validation_names_the_bad_field() {
        let check = |config: StoppingConfig, field: Option<&str>| {
            assert_eq!(
                config.validate().err().map(|error| error.field()),
                field,
                "{config:?}"
            );
        };
        check(StoppingConfig::new(RuleKind::Median), None);
        check(StoppingConfig::new(RuleKind::Asha), None);
        check(StoppingConfig::new(RuleKind::Hyperband), None);
        check(config(RuleKind::Asha, 0, 81), Some("grace_period"));
        check(config(RuleKind::Asha, 10, 9), Some("max_t"));
        check(config(RuleKind::Asha, 9, 9), None);
        check(config(RuleKind::Median, 10, 9), None);
        check(
            StoppingConfig {
                min_samples: 0,
                ..StoppingConfig::new(RuleKind::Median)
            },
            Some("min_samples"),
        );
        check(
            StoppingConfig {
                reduction_factor: 1,
                ..StoppingConfig::new(RuleKind::Hyperband)
            },
            Some("reduction_factor"),
        );
        // grace 1, η 3, max_t 81: grace periods 1, 3, 9, 27, 81 allow five brackets.
        for (brackets, field) in [(0, Some("brackets")), (5, None), (6, Some("brackets"))] {
            check(
                StoppingConfig {
                    brackets,
                    ..StoppingConfig::new(RuleKind::Hyperband)
                },
                field,
            );
        }
        let error = StoppingConfig {
            brackets: 6,
            ..StoppingConfig::new(RuleKind::Hyperband)
        }
        .validate()
        .unwrap_err();
        assert_eq!(
            error.to_string(),
            "`brackets` is 6, it must be between 1 and 5 so that every bracket's grace period fits under `max_t`"
        );
        // Huge values must not overflow.
        check(
            StoppingConfig {
                grace_period: u64::MAX / 2,
                max_t: u64::MAX,
                brackets: 2,
                ..StoppingConfig::new(RuleKind::Hyperband)
            },
            Some("brackets"),
        );
    }
}
