//! Hyperband's schedule (Li et al. 2018) as BOHB uses it: the budgets, the
//! brackets, how many configurations each bracket gets, and which bracket a trial
//! belongs to.
//!
//! Budgets are `min · η^k` below `max`, then `max`; with `s_max + 1` budgets there
//! are `s_max + 1` brackets. Bracket `b` (0 is the most aggressive) starts its
//! trials at budget `b` and holds `n_b = ⌈(s_max + 1) · η^s / (s + 1)⌉`
//! configurations, `s = s_max − b`, as one Hyperband iteration; synchronous
//! Hyperband would keep `⌊n_b / η^i⌋` of them at the bracket's `i`-th budget
//! ([`HyperbandSchedule::rung_sizes`]). Trials take brackets by their index,
//! repeating one iteration's order (every slot of bracket 0, then of bracket 1, ...),
//! so the head, a replay after a restart and a bench agree on every trial's
//! bracket whatever order its reports arrive in.
//!
//! Pure arithmetic: no state, no I/O. Large η or many budgets saturate rather
//! than overflow (a bracket of `u64::MAX` configurations is never filled).

use xp_runtime::spec::{BohbError, BohbSpec};

/// The budgets and brackets of one BOHB search.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HyperbandSchedule {
    min_budget: u64,
    max_budget: u64,
    reduction_factor: u64,
}

impl Default for HyperbandSchedule {
    fn default() -> Self {
        let spec = BohbSpec::default();
        Self {
            min_budget: spec.min_budget,
            max_budget: spec.max_budget,
            reduction_factor: u64::from(spec.reduction_factor),
        }
    }
}

impl HyperbandSchedule {
    /// The schedule of a `bohb` section, refused as [`BohbSpec::validate`] refuses it.
    pub fn from_spec(spec: &BohbSpec) -> Result<Self, BohbError> {
        spec.validate()?;
        Ok(Self {
            min_budget: spec.min_budget,
            max_budget: spec.max_budget,
            reduction_factor: u64::from(spec.reduction_factor),
        })
    }

    /// The schedule from `min_budget` to `max_budget` with reduction factor η.
    pub fn new(min_budget: u64, max_budget: u64, reduction_factor: u32) -> Result<Self, BohbError> {
        Self::from_spec(&BohbSpec {
            min_budget,
            max_budget,
            reduction_factor,
        })
    }

    /// η.
    pub fn reduction_factor(&self) -> u64 {
        self.reduction_factor
    }

    /// The largest budget: trials stop there.
    pub fn max_budget(&self) -> u64 {
        self.max_budget
    }

    /// Every budget, increasing: `min · η^k` below `max`, then `max` (at least two).
    pub fn budgets(&self) -> Vec<u64> {
        let mut budgets = Vec::new();
        let mut budget = Some(self.min_budget);
        while let Some(step) = budget.filter(|step| *step < self.max_budget) {
            budgets.push(step);
            budget = step.checked_mul(self.reduction_factor);
        }
        budgets.push(self.max_budget);
        budgets
    }

    /// The index of the largest budget at or below `step`, if `step` reaches the first.
    pub fn budget_level(&self, step: u64) -> Option<usize> {
        self.budgets().iter().rposition(|budget| *budget <= step)
    }

    /// How many brackets: one per budget.
    pub fn n_brackets(&self) -> usize {
        self.budgets().len()
    }

    /// `n_b`, the configurations bracket `bracket` gets per iteration; 0 past the last bracket.
    pub fn bracket_size(&self, bracket: usize) -> u64 {
        let n_brackets = self.n_brackets();
        if bracket >= n_brackets {
            return 0;
        }
        let s_max = (n_brackets - 1) as u128;
        let s = s_max - bracket as u128;
        let exponent = u32::try_from(s).expect("at most 64 budgets");
        let numerator =
            (s_max + 1).saturating_mul(u128::from(self.reduction_factor).saturating_pow(exponent));
        u64::try_from(numerator.div_ceil(s + 1)).unwrap_or(u64::MAX)
    }

    /// The configurations of one iteration: every bracket's size.
    pub fn iteration_size(&self) -> u64 {
        (0..self.n_brackets())
            .map(|bracket| self.bracket_size(bracket))
            .fold(0, u64::saturating_add)
    }

    /// The bracket of the trial with index `trial_index` (0-based, in creation order).
    pub fn bracket_of(&self, trial_index: u64) -> usize {
        let mut position = trial_index % self.iteration_size().max(1);
        for bracket in 0..self.n_brackets() {
            let size = self.bracket_size(bracket);
            if position < size {
                return bracket;
            }
            position -= size;
        }
        self.n_brackets() - 1
    }

    /// Synchronous Hyperband's survivors in bracket `bracket`: how many of its `n_b`
    /// configurations run to each of its budgets (its first budget's count is `n_b`).
    pub fn rung_sizes(&self, bracket: usize) -> Vec<u64> {
        let n_brackets = self.n_brackets();
        let size = self.bracket_size(bracket);
        let mut divisor: u64 = 1;
        (bracket..n_brackets)
            .map(|_| {
                let survivors = size / divisor;
                divisor = divisor.saturating_mul(self.reduction_factor);
                survivors
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn budgets_are_powers_of_eta_then_the_maximum() {
        let schedule = HyperbandSchedule::new(1, 81, 3).unwrap();
        assert_eq!(schedule.budgets(), vec![1, 3, 9, 27, 81]);
        assert_eq!(
            HyperbandSchedule::new(2, 20, 3).unwrap().budgets(),
            vec![2, 6, 18, 20]
        );
        assert_eq!(
            HyperbandSchedule::new(1, 3, 3).unwrap().budgets(),
            vec![1, 3]
        );
        assert_eq!(schedule.budget_level(0), None);
        assert_eq!(schedule.budget_level(1), Some(0));
        assert_eq!(schedule.budget_level(8), Some(1));
        assert_eq!(schedule.budget_level(9), Some(2));
        assert_eq!(schedule.budget_level(1000), Some(4));
        assert!(HyperbandSchedule::new(1, 2, 3).is_err());
        // The most budgets η = 2 allows stays bounded and nothing overflows.
        let huge = HyperbandSchedule::new(1, u64::MAX, 2).unwrap();
        assert_eq!(huge.budgets().len(), 65);
        assert_eq!(huge.bracket_size(0), u64::MAX);
        assert_eq!(huge.iteration_size(), u64::MAX);
        assert_eq!(huge.bracket_of(u64::MAX - 1), 0);
    }

    #[test]
    fn bracket_sizes_follow_hyperband() {
        // Li et al.'s table for R = 81, η = 3: n = 81, 34, 15, 8, 5 and the
        // survivors of the most aggressive bracket 81, 27, 9, 3, 1.
        let schedule = HyperbandSchedule::new(1, 81, 3).unwrap();
        let sizes: Vec<u64> = (0..5)
            .map(|bracket| schedule.bracket_size(bracket))
            .collect();
        assert_eq!(sizes, vec![81, 34, 15, 8, 5]);
        assert_eq!(schedule.bracket_size(5), 0);
        assert_eq!(schedule.iteration_size(), 143);
        assert_eq!(schedule.rung_sizes(0), vec![81, 27, 9, 3, 1]);
        assert_eq!(schedule.rung_sizes(1), vec![34, 11, 3, 1]);
        assert_eq!(schedule.rung_sizes(2), vec![15, 5, 1]);
        assert_eq!(schedule.rung_sizes(3), vec![8, 2]);
        assert_eq!(schedule.rung_sizes(4), vec![5]);
        // R = 9, η = 3: n = 9, 5, 3.
        let small = HyperbandSchedule::new(1, 9, 3).unwrap();
        let sizes: Vec<u64> = (0..3).map(|bracket| small.bracket_size(bracket)).collect();
        assert_eq!(sizes, vec![9, 5, 3]);
        assert_eq!(small.rung_sizes(0), vec![9, 3, 1]);
        assert_eq!(small.rung_sizes(1), vec![5, 1]);
    }

    /// Runs trials one after another, each reporting its value at steps 1 to 9
    /// until stopped, and returns the step each was stopped at with the reasons.
    fn stop_steps(values: &[f64]) -> (Vec<u64>, Vec<String>) {
        let mut rule = crate::stopping::make_bohb_rule(HyperbandSchedule::new(1, 9, 3).unwrap());
        let mut steps = Vec::new();
        let mut reasons = Vec::new();
        for (trial, value) in values.iter().enumerate() {
            let trial = trial as u64;
            let stop = (1..=9).find_map(|step| match rule.report(trial, step, *value) {
                crate::stopping::Verdict::Stop { rule, reason } => {
                    assert_eq!(rule, "bohb");
                    Some((step, reason))
                }
                crate::stopping::Verdict::Continue => None,
            });
            let (step, reason) = stop.expect("every trial stops by max_budget");
            rule.finished(trial);
            steps.push(step);
            reasons.push(reason);
        }
        (steps, reasons)
    }

    #[test]
    fn the_bohb_rule_keeps_the_top_of_each_rung_of_the_trials_bracket() {
        // Budgets 1, 3, 9: bracket 0 (trials 0 to 8) has rungs 1 and 3, bracket 1
        // (trials 9 to 13) rung 3, bracket 2 (trials 14 to 16) none. A rung keeps a
        // trial when fewer than ⌈n/3⌉ of the n values recorded there beat it.
        let values = [
            3.0, 1.0, 2.0, 5.0, 0.5, 4.0, 6.0, 0.7, 8.0, // bracket 0
            2.0, 1.0, 3.0, 0.1, 5.0, // bracket 1
            9.0, 9.5, 10.0, // bracket 2
        ];
        let (steps, reasons) = stop_steps(&values);
        assert_eq!(
            steps,
            vec![9, 9, 1, 1, 9, 1, 1, 9, 1, 9, 9, 3, 9, 3, 9, 9, 9]
        );
        assert_eq!(
            reasons[2],
            "value 2 at step 1 ranks 2 of 3 at rung 1 of bracket 0 (grace period 1); only the top 1 (1/3) continue"
        );
        assert_eq!(
            reasons[11],
            "value 3 at step 3 ranks 3 of 3 at rung 3 of bracket 1 (grace period 3); only the top 1 (1/3) continue"
        );
        assert_eq!(reasons[14], "reached max_budget 9 at step 9");
        // Brackets go by trial index, not by arrival: the same values fed to a
        // rule in another order put each trial in the same bracket.
        let mut rule = crate::stopping::make_bohb_rule(HyperbandSchedule::new(1, 9, 3).unwrap());
        assert!(!rule.report(16, 1, 100.0).is_stop());
        assert!(
            !rule.report(16, 8, 100.0).is_stop(),
            "bracket 2 has no rung"
        );
        assert!(!rule.report(0, 1, 1.0).is_stop());
        assert!(
            rule.report(1, 1, 2.0).is_stop(),
            "bracket 0 judges at step 1"
        );
    }

    #[test]
    fn trials_take_brackets_in_iteration_order() {
        let schedule = HyperbandSchedule::new(1, 9, 3).unwrap();
        let brackets: Vec<usize> = (0..20).map(|index| schedule.bracket_of(index)).collect();
        assert_eq!(
            brackets,
            vec![0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 2, 2, 2, 0, 0, 0]
        );
    }
}
