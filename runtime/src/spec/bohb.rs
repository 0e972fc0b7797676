//! The `bohb` section of a search (`algorithm: bohb`): Hyperband's budgets, in steps
//! of the metric's reports, and the reduction factor.
//!
//! Only the declaration and its validation live here, since every process parses
//! specs; the schedule, the sampler and the stopping rule are in `xp-tune`.

use serde::{Deserialize, Serialize};

/// Default [`BohbSpec::min_budget`]: the first rung is the first step.
pub const DEFAULT_MIN_BUDGET: u64 = 1;
/// Default [`BohbSpec::max_budget`]: 81 = 3^4, so η = 3 gives budgets 1, 3, 9, 27, 81.
pub const DEFAULT_MAX_BUDGET: u64 = 81;
/// Default [`BohbSpec::reduction_factor`], the η = 3 of the Hyperband and BOHB papers.
pub const DEFAULT_BOHB_REDUCTION_FACTOR: u32 = 3;

/// The options of `algorithm: bohb`, for example
/// `bohb: {min_budget: 1, max_budget: 27, reduction_factor: 3}`; every field has a default.
///
/// Budgets are steps of the metric's reports (epochs, say): the budgets are
/// `min_budget · η^k` below `max_budget`, then `max_budget`, and each is a rung
/// where Hyperband's brackets keep the top 1/η and the sampler's observations are kept.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BohbSpec {
    /// The smallest budget: the first rung of the most aggressive bracket.
    #[serde(default = "default_min_budget")]
    pub min_budget: u64,
    /// The largest budget: no trial runs beyond it.
    #[serde(default = "default_max_budget")]
    pub max_budget: u64,
    /// η: each rung keeps the top 1/η, and the next budget is η times larger.
    #[serde(default = "default_reduction_factor")]
    pub reduction_factor: u32,
}

fn default_min_budget() -> u64 {
    DEFAULT_MIN_BUDGET
}

fn default_max_budget() -> u64 {
    DEFAULT_MAX_BUDGET
}

fn default_reduction_factor() -> u32 {
    DEFAULT_BOHB_REDUCTION_FACTOR
}

impl Default for BohbSpec {
    fn default() -> Self {
        Self {
            min_budget: DEFAULT_MIN_BUDGET,
            max_budget: DEFAULT_MAX_BUDGET,
            reduction_factor: DEFAULT_BOHB_REDUCTION_FACTOR,
        }
    }
}

/// Why a `bohb` section was refused; [`BohbError::field`] names the field so the
/// spec layer can report its full path.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BohbError {
    /// A budget of 0 steps would judge trials before their first report.
    #[error("`min_budget` must be at least 1")]
    MinBudgetZero,
    /// η must be at least 2 for budgets to grow and rungs to keep a fraction.
    #[error("`reduction_factor` is {reduction_factor}, it must be at least 2")]
    ReductionFactorTooSmall {
        /// The refused value.
        reduction_factor: u32,
    },
    /// Hyperband needs at least two budgets, so `max_budget ≥ min_budget · η`.
    #[error(
        "`max_budget` is {max_budget}, it must be at least `min_budget` × `reduction_factor` ({least}) so that there are two budgets"
    )]
    MaxBudgetTooSmall {
        /// The refused value.
        max_budget: u64,
        /// The smallest allowed value.
        least: u64,
    },
}

impl BohbError {
    /// The name of the offending field, as written in the spec.
    pub fn field(&self) -> &'static str {
        match self {
            Self::MinBudgetZero => "min_budget",
            Self::ReductionFactorTooSmall { .. } => "reduction_factor",
            Self::MaxBudgetTooSmall { .. } => "max_budget",
        }
    }
}

impl BohbSpec {
    /// Checks every field, naming the first bad one.
    pub fn validate(&self) -> Result<(), BohbError> {
        if self.min_budget == 0 {
            return Err(BohbError::MinBudgetZero);
        }
        if self.reduction_factor < 2 {
            return Err(BohbError::ReductionFactorTooSmall {
                reduction_factor: self.reduction_factor,
            });
        }
        // Saturating: a product past u64::MAX cannot be reached by any max_budget.
        let least = self
            .min_budget
            .saturating_mul(u64::from(self.reduction_factor));
        if self.max_budget < least || least == u64::MAX {
            return Err(BohbError::MaxBudgetTooSmall {
                max_budget: self.max_budget,
                least,
            });
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_with_defaults_and_refuses_unknown_fields() {
        let parsed: BohbSpec = serde_json::from_str("{}").unwrap();
        assert_eq!(parsed, BohbSpec::default());
        assert_eq!(
            (
                parsed.min_budget,
                parsed.max_budget,
                parsed.reduction_factor
            ),
            (1, 81, 3)
        );
        let yaml: BohbSpec = serde_saphyr::from_str("min_budget: 2\nmax_budget: 18\n").unwrap();
        assert_eq!(
            yaml,
            BohbSpec {
                min_budget: 2,
                max_budget: 18,
                reduction_factor: 3
            }
        );
        assert!(serde_json::from_str::<BohbSpec>(r#"{"eta": 3}"#).is_err());
        assert!(serde_json::from_str::<BohbSpec>(r#"{"min_budget": -1}"#).is_err());
    }

    /// An experiment with `algorithm: bohb` and `extra` appended to its search.
    fn experiment(extra: &str) -> Result<super::super::ExperimentSpec, super::super::SpecError> {
        super::super::ExperimentSpec::from_yaml(&format!(
            "name: b\ntrial: {{command: [echo, '{{x}}']}}\nsearch:\n  algorithm: bohb\n  space: {{x: {{uniform: [0, 1]}}}}\n  trials: 20\n{extra}"
        ))
    }

    fn refused_field(extra: &str) -> String {
        match experiment(extra) {
            Err(super::super::SpecError::Invalid { field, .. }) => field,
            other => panic!("{extra:?} gave {other:?}"),
        }
    }

    #[test]
    fn experiments_refuse_bad_bohb_settings_naming_the_field() {
        let spec = experiment("  metric: loss\n").unwrap();
        assert_eq!(spec.search.bohb, None);
        assert!(spec.search.algorithm.is_adaptive());
        let spec = experiment(
            "  metric: loss\n  bohb: {min_budget: 1, max_budget: 27, reduction_factor: 3}\n",
        )
        .unwrap();
        assert_eq!(spec.search.bohb.map(|bohb| bohb.max_budget), Some(27));
        // The canonical JSON keeps the section, and reads back the same.
        let json = spec.to_canonical_json();
        assert!(
            json.contains(r#""bohb":{"#) && json.contains(r#""max_budget":27"#),
            "{json}"
        );
        assert_eq!(
            super::super::ExperimentSpec::from_json(&json)
                .unwrap()
                .search,
            spec.search
        );
        assert_eq!(refused_field(""), "search.metric");
        assert_eq!(
            refused_field("  metric: loss\n  bohb: {max_budget: 2}\n"),
            "search.bohb.max_budget"
        );
        assert_eq!(
            refused_field("  metric: loss\n  bohb: {min_budget: 0}\n"),
            "search.bohb.min_budget"
        );
        assert_eq!(
            refused_field("  metric: loss\n  bohb: {reduction_factor: 1}\n"),
            "search.bohb.reduction_factor"
        );
        assert_eq!(
            refused_field("  metric: loss\n  seeds: 3\n"),
            "search.seeds"
        );
        // A stopping rule of the user's replaces BOHB's brackets.
        let spec =
            experiment("  metric: loss\n  early_stopping: {rule: asha, max_t: 27}\n").unwrap();
        assert_eq!(spec.search.early_stopping.map(|rule| rule.max_t), Some(27));
        assert_eq!(
            refused_field("  metric: loss\n  early_stopping: {rule: asha, max_t: 0}\n"),
            "search.early_stopping.max_t"
        );
        assert_eq!(
            refused_field("  metric: loss\n  tpe: {multivariate: true}\n"),
            "search.tpe"
        );
        let tpe = "name: t\ntrial: {command: [echo]}\nsearch:\n  algorithm: tpe\n  space: {x: {uniform: [0, 1]}}\n  trials: 5\n  metric: loss\n  bohb: {max_budget: 9}\n";
        match super::super::ExperimentSpec::from_yaml(tpe) {
            Err(super::super::SpecError::Invalid { field, reason }) => {
                assert_eq!(field, "search.bohb");
                assert_eq!(reason, "only applies to `algorithm: bohb`");
            }
            other => panic!("{other:?}"),
        }
        assert!(
            experiment("  metric: loss\n  bohb: {budget: 3}\n")
                .unwrap_err()
                .to_string()
                .contains("budget"),
        );
    }

    #[test]
    fn validation_names_the_bad_field() {
        let check = |min_budget, max_budget, reduction_factor, field: Option<&str>| {
            let spec = BohbSpec {
                min_budget,
                max_budget,
                reduction_factor,
            };
            assert_eq!(
                spec.validate().err().map(|error| error.field()),
                field,
                "{spec:?}"
            );
        };
        check(1, 81, 3, None);
        check(1, 3, 3, None);
        check(1, 2, 3, Some("max_budget"));
        check(0, 81, 3, Some("min_budget"));
        check(1, 81, 1, Some("reduction_factor"));
        check(1, 81, 0, Some("reduction_factor"));
        check(10, 19, 2, Some("max_budget"));
        // Overflow is refused, not wrapped.
        check(u64::MAX / 2, u64::MAX, 3, Some("max_budget"));
        let error = BohbSpec {
            min_budget: 4,
            max_budget: 10,
            reduction_factor: 3,
        }
        .validate()
        .unwrap_err();
        assert_eq!(
            error.to_string(),
            "`max_budget` is 10, it must be at least `min_budget` × `reduction_factor` (12) so that there are two budgets"
        );
    }
}
