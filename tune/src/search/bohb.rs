//! BOHB's sampler (Falkner et al., ICML 2018): Parzen estimators fitted on the
//! results at the largest budget that has enough of them propose the
//! configurations that Hyperband's brackets then run.
//!
//! The searcher keeps, per budget of its [`HyperbandSchedule`], the result every
//! suggestion had when it reached that budget ([`Searcher::observe`]: the first
//! report at or past the budget, as the stopping rule judges it). Each `ask` takes
//! the largest budget with at least `n_good + min_points` results, where
//! `min_points` is the dimension plus one and `n_good = max(min_points,
//! ⌊top_fraction · n⌋)` (HpBandSter's rule, so both densities are fitted on more
//! points than dimensions); splits them into the `n_good` best, l(x), and the rest
//! plus the pending suggestions, g(x) (the constant liar, which pushes parallel
//! asks apart); draws `n_candidates` from l(x) and returns the best l(x)/g(x) that
//! is neither observed nor pending. A `random_fraction` of asks, and every ask
//! until some budget has enough results, draws from the prior instead, which keeps
//! BOHB's guarantee of doing no worse than Hyperband by much.
//!
//! The densities are the joint product-kernel estimators of multivariate TPE
//! (`tpe_joint.rs`, conditional parameters grouped by where they are active)
//! rather than HpBandSter's statsmodels KDE with normal-reference bandwidths: one
//! estimator in the crate, already measured against the suite, whose neighbour
//! bandwidths stay sharp where the good points crowd. HpBandSter's bandwidth
//! factor (sampling from l(x) with kernels three times wider) is left out for the
//! same reason. The final `tell` closes a suggestion; its value was already
//! observed at the budget the trial reached.

use std::collections::BTreeMap;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use xp_runtime::seeded::mix_seed;
use xp_runtime::spec::{Config, SearchSpace};

use super::history::{Observation, split_encoded};
use super::tpe_joint::JointModel;
use super::{Searcher, Suggestion};
use crate::hyperband::HyperbandSchedule;

/// How many prior draws look for a configuration that is neither observed nor
/// pending when every candidate from l(x) was one.
const FRESH_DRAWS: usize = 64;

/// Tuning of [`BohbSearcher`]; the defaults are BOHB's.
#[derive(Debug, Clone, PartialEq)]
pub struct BohbOptions {
    /// The share of asks drawn from the prior even when a model exists (BOHB: 1/3).
    pub random_fraction: f64,
    /// The share of a budget's results that shape l(x) (BOHB: 15%), at least `min_points`.
    pub top_fraction: f64,
    /// The fewest results in l(x) and in g(x); the dimension plus one when `None`.
    pub min_points: Option<usize>,
    /// Candidates drawn from l(x) per model-based ask (BOHB: 64).
    pub n_candidates: usize,
    /// The weight of the prior kernel in each estimator.
    pub prior_weight: f64,
}

impl Default for BohbOptions {
    fn default() -> Self {
        Self {
            random_fraction: 1.0 / 3.0,
            top_fraction: 0.15,
            min_points: None,
            n_candidates: 64,
            prior_weight: 1.0,
        }
    }
}

/// Where a suggestion came from, for its trial's event log.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Origin {
    /// No budget had enough results for a model.
    NoModel,
    /// The random fraction.
    RandomFraction,
    /// The model of one budget.
    Model {
        budget: u64,
        results: usize,
        good: usize,
    },
}

/// BOHB's model-based sampler over a [`SearchSpace`]; never runs out.
#[derive(Debug, Clone)]
pub struct BohbSearcher {
    space: SearchSpace,
    budgets: Vec<u64>,
    options: BohbOptions,
    rng: StdRng,
    next_id: u64,
    /// Suggestions asked and not yet told or forgotten.
    pending: BTreeMap<u64, Config>,
    /// The highest budget level each suggestion has a result at.
    reached: BTreeMap<u64, usize>,
    /// Per budget level, the results in the order they were observed.
    results: Vec<Vec<Observation>>,
    origins: BTreeMap<u64, Origin>,
}

impl BohbSearcher {
    /// A BOHB sampler over `space` for the budgets of `schedule`; `seed` fixes its draws.
    pub fn new(
        space: SearchSpace,
        schedule: HyperbandSchedule,
        seed: u64,
        options: BohbOptions,
    ) -> Self {
        let budgets = schedule.budgets();
        Self {
            space,
            results: vec![Vec::new(); budgets.len()],
            budgets,
            options,
            rng: StdRng::seed_from_u64(mix_seed(seed, 5)),
            next_id: 0,
            pending: BTreeMap::new(),
            reached: BTreeMap::new(),
            origins: BTreeMap::new(),
        }
    }

    /// The fewest results in either density.
    fn min_points(&self) -> usize {
        self.options
            .min_points
            .unwrap_or(self.space.len() + 1)
            .max(1)
    }

    /// How many of `n` results are "good", and whether `n` is enough for a model.
    fn split(&self, n: usize) -> (usize, bool) {
        let min_points = self.min_points();
        let n_good = min_points.max((self.options.top_fraction * n as f64).floor() as usize);
        (n_good, n >= n_good + min_points)
    }

    /// The budget level the next model-based ask would fit on: the largest with
    /// enough results.
    fn model_level(&self) -> Option<usize> {
        (0..self.results.len())
            .rev()
            .find(|level| self.split(self.results[*level].len()).1)
    }

    /// The budget whose results the next model-based ask would use, if any has enough.
    pub fn model_budget(&self) -> Option<u64> {
        self.model_level().map(|level| self.budgets[level])
    }

    /// How many results each budget holds, in budget order.
    pub fn results_per_budget(&self) -> Vec<(u64, usize)> {
        self.budgets
            .iter()
            .zip(&self.results)
            .map(|(budget, results)| (*budget, results.len()))
            .collect()
    }

    /// Whether `config` is pending or has a result at some budget.
    fn is_known(&self, config: &Config) -> bool {
        self.pending.values().any(|pending| pending == config)
            || self
                .results
                .iter()
                .flatten()
                .any(|result| &result.config == config)
    }

    /// A configuration from the prior, redrawn while it is known.
    fn draw_prior(&mut self) -> Config {
        let first = self.space.sample(&mut self.rng);
        if !self.is_known(&first) {
            return first;
        }
        for _ in 1..FRESH_DRAWS {
            let config = self.space.sample(&mut self.rng);
            if !self.is_known(&config) {
                return config;
            }
        }
        first
    }

    /// One model-based suggestion from the results at budget `level`.
    fn draw_model(&mut self, level: usize) -> (Config, Origin) {
        let results = &self.results[level];
        let n = results.len();
        let (n_good, _) = self.split(n);
        let (below, above) =
            split_encoded(&self.space, results, n_good, self.pending.values(), true);
        let model = JointModel::fit(&self.space, &below, None, &above, self.options.prior_weight);
        let origin = Origin::Model {
            budget: self.budgets[level],
            results: n,
            good: n_good,
        };
        let mut ranked: Vec<(f64, Config)> = (0..self.options.n_candidates.max(1))
            .map(|_| {
                let point = model.draw(&self.space, &mut self.rng);
                let score = model.score(&self.space, &point);
                let units: Vec<f64> = point.iter().map(|unit| unit.unwrap_or(0.5)).collect();
                (score, self.space.decode(&units))
            })
            .collect();
        ranked.sort_by(|left, right| right.0.total_cmp(&left.0));
        if let Some(index) = ranked.iter().position(|(_, config)| !self.is_known(config)) {
            return (ranked.swap_remove(index).1, origin);
        }
        // Every draw from l(x) is known (a small discrete space): the most
        // promising new draw from the prior.
        let mut fresh: Option<(f64, Config)> = None;
        for _ in 0..FRESH_DRAWS {
            let config = self.space.sample(&mut self.rng);
            if self.is_known(&config) {
                continue;
            }
            let score = model.score(&self.space, &self.space.encode(&config));
            if fresh.as_ref().is_none_or(|(best, _)| score > *best) {
                fresh = Some((score, config));
            }
        }
        let config = fresh
            .or_else(|| ranked.into_iter().next())
            .expect("there is at least one candidate")
            .1;
        (config, origin)
    }
}

impl Searcher for BohbSearcher {
    fn ask(&mut self) -> Option<Suggestion> {
        // Drawn on every ask, so the stream of draws does not depend on whether a
        // model exists yet.
        let coin: f64 = self.rng.random();
        let (config, origin) = match self.model_level() {
            None => (self.draw_prior(), Origin::NoModel),
            Some(_) if coin < self.options.random_fraction => {
                (self.draw_prior(), Origin::RandomFraction)
            }
            Some(level) => self.draw_model(level),
        };
        let id = self.next_id;
        self.next_id += 1;
        self.pending.insert(id, config.clone());
        self.origins.insert(id, origin);
        Some(Suggestion { id, config })
    }

    fn tell(&mut self, id: u64, _objective: f64) {
        self.pending.remove(&id);
    }

    fn forget(&mut self, id: u64) {
        self.pending.remove(&id);
    }

    /// Records the first result of a pending suggestion at or past each budget it
    /// reaches (a budget it skipped keeps no result, as the rung does not); NaN is
    /// the worst value, so a diverged configuration shapes g(x).
    fn observe(&mut self, id: u64, step: u64, objective: f64) -> bool {
        let Some(config) = self.pending.get(&id) else {
            return false;
        };
        // From the budgets held: this runs on every metric report.
        let Some(level) = self.budgets.iter().rposition(|budget| *budget <= step) else {
            return false;
        };
        if self
            .reached
            .get(&id)
            .is_some_and(|reached| *reached >= level)
        {
            return false;
        }
        let objective = if objective.is_nan() {
            f64::INFINITY
        } else {
            objective
        };
        self.reached.insert(id, level);
        self.results[level].push(Observation {
            config: config.clone(),
            objective,
        });
        true
    }

    fn provenance(&self, id: u64) -> Option<String> {
        Some(match self.origins.get(&id)? {
            Origin::NoModel => {
                "proposed at random: no budget has enough results for a model yet".to_owned()
            }
            Origin::RandomFraction => "proposed at random (BOHB's random fraction)".to_owned(),
            Origin::Model {
                budget,
                results,
                good,
            } => format!(
                "proposed by the model of budget {budget} ({results} results, the best {good} as good)"
            ),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use xp_runtime::spec::ParamValue;

    fn space() -> SearchSpace {
        SearchSpace::builder()
            .uniform("x", 0.0, 1.0)
            .uniform("y", 0.0, 1.0)
            .build()
            .unwrap()
    }

    fn searcher(seed: u64) -> BohbSearcher {
        BohbSearcher::new(
            space(),
            HyperbandSchedule::new(1, 9, 3).unwrap(),
            seed,
            BohbOptions::default(),
        )
    }

    fn x_of(config: &Config) -> f64 {
        match config["x"] {
            ParamValue::Float(x) => x,
            ref other => panic!("{other:?}"),
        }
    }

    /// Asks one suggestion and gives it results at `steps`, its value `x` at each.
    fn run(searcher: &mut BohbSearcher, steps: &[u64]) -> u64 {
        let suggestion = searcher.ask().unwrap();
        let value = x_of(&suggestion.config);
        for step in steps {
            searcher.observe(suggestion.id, *step, value);
        }
        searcher.tell(suggestion.id, value);
        suggestion.id
    }

    #[test]
    fn the_model_uses_the_largest_budget_with_enough_results() {
        // Two dimensions: min_points 3, so a budget needs 6 results (3 good, 3 rest).
        let mut bohb = searcher(1);
        assert_eq!(bohb.model_budget(), None);
        for _ in 0..5 {
            run(&mut bohb, &[1]);
        }
        assert_eq!(bohb.model_budget(), None, "{:?}", bohb.results_per_budget());
        run(&mut bohb, &[1, 2]);
        assert_eq!(bohb.model_budget(), Some(1));
        // Budget 3 gets five results: not enough, budget 1 (now 11) still serves.
        for _ in 0..5 {
            run(&mut bohb, &[1, 3, 4]);
        }
        assert_eq!(bohb.results_per_budget(), vec![(1, 11), (3, 5), (9, 0)]);
        assert_eq!(bohb.model_budget(), Some(1));
        // A sixth at budget 3, reached by skipping budget 1: budget 3 serves.
        run(&mut bohb, &[5]);
        assert_eq!(bohb.results_per_budget(), vec![(1, 11), (3, 6), (9, 0)]);
        assert_eq!(bohb.model_budget(), Some(3));
        // Six results at budget 9 move the model there.
        for _ in 0..6 {
            run(&mut bohb, &[9]);
        }
        assert_eq!(bohb.model_budget(), Some(9));
        let next = bohb.ask().unwrap();
        let said = bohb.provenance(next.id).unwrap();
        assert!(
            said.contains("budget 9 (6 results, the best 3 as good)")
                || said.contains("random fraction"),
            "{said}"
        );
        assert!(
            bohb.provenance(0).unwrap().contains("no budget has enough"),
            "{:?}",
            bohb.provenance(0)
        );
        assert_eq!(bohb.provenance(999), None);
    }

    #[test]
    fn observations_are_one_per_budget_and_only_while_pending() {
        let mut bohb = searcher(2);
        let suggestion = bohb.ask().unwrap();
        assert!(
            !bohb.observe(suggestion.id, 0, 1.0),
            "below the first budget"
        );
        assert!(bohb.observe(suggestion.id, 1, 1.0));
        assert!(!bohb.observe(suggestion.id, 2, 0.5), "budget 1 again");
        assert!(bohb.observe(suggestion.id, 4, 0.5));
        assert!(
            !bohb.observe(suggestion.id, 1, 0.1),
            "a stale, lower budget"
        );
        assert!(bohb.observe(suggestion.id, 100, f64::NAN));
        assert!(!bohb.observe(77, 1, 0.5), "unknown suggestion");
        bohb.tell(suggestion.id, 0.5);
        let other = bohb.ask().unwrap();
        bohb.forget(other.id);
        assert!(!bohb.observe(suggestion.id, 200, 0.1), "already told");
        assert!(!bohb.observe(other.id, 1, 0.1), "forgotten");
        assert_eq!(bohb.results_per_budget(), vec![(1, 1), (3, 1), (9, 1)]);
        assert_eq!(bohb.results[2][0].objective, f64::INFINITY);
    }

    #[test]
    fn the_model_moves_towards_good_results_and_parallel_asks_are_distinct() {
        let mut bohb = BohbSearcher::new(
            space(),
            HyperbandSchedule::new(1, 9, 3).unwrap(),
            3,
            BohbOptions {
                random_fraction: 0.0,
                ..BohbOptions::default()
            },
        );
        for _ in 0..30 {
            run(&mut bohb, &[1]);
        }
        assert_eq!(bohb.model_budget(), Some(1));
        // Eight asks in flight: all distinct, all from the model, mostly where x is small.
        let asked: Vec<Suggestion> = (0..8).map(|_| bohb.ask().unwrap()).collect();
        for (idx, suggestion) in asked.iter().enumerate() {
            assert!(
                bohb.provenance(suggestion.id)
                    .unwrap()
                    .contains("model of budget 1"),
                "{:?}",
                bohb.provenance(suggestion.id)
            );
            for other in &asked[..idx] {
                assert_ne!(other.config, suggestion.config);
            }
        }
        let small = asked.iter().filter(|s| x_of(&s.config) < 0.3).count();
        assert!(small >= 5, "{small} of 8 below 0.3: {asked:?}");
    }

    #[test]
    fn the_spec_chooses_the_budgets() {
        let schedule = |extra: &str| {
            let spec = xp_runtime::spec::ExperimentSpec::from_yaml(&format!(
                "name: b\ntrial: {{command: [echo]}}\nsearch:\n  algorithm: bohb\n  space: {{x: {{uniform: [0, 1]}}}}\n  metric: loss\n  trials: 9\n{extra}"
            ))
            .unwrap();
            match super::super::SearchAlgorithm::from_spec(&spec.search) {
                super::super::SearchAlgorithm::Bohb { schedule } => schedule,
                other => panic!("{other:?}"),
            }
        };
        assert_eq!(schedule(""), HyperbandSchedule::default());
        assert_eq!(
            schedule("  bohb: {max_budget: 27}\n"),
            HyperbandSchedule::new(1, 27, 3).unwrap()
        );
        // Under a stopping rule of the user's, its rungs are the budgets.
        assert_eq!(
            schedule("  early_stopping: {rule: asha, grace_period: 2, max_t: 18}\n"),
            HyperbandSchedule::new(2, 18, 3).unwrap()
        );
        assert_eq!(
            schedule("  early_stopping: {rule: median}\n"),
            HyperbandSchedule::default()
        );
    }

    #[test]
    fn suggestions_replay_from_the_same_sequence() {
        let trace = |seed| {
            let mut bohb = searcher(seed);
            let mut said = Vec::new();
            for round in 0..25 {
                let id = run(&mut bohb, &[1, 3 + round % 7]);
                said.push(bohb.provenance(id).unwrap());
            }
            said
        };
        let mut first = searcher(4);
        let mut second = searcher(4);
        for round in 0..25_u64 {
            let left = first.ask().unwrap();
            let right = second.ask().unwrap();
            assert_eq!(left, right);
            let value = x_of(&left.config);
            assert_eq!(
                first.observe(left.id, 1 + round % 9, value),
                second.observe(right.id, 1 + round % 9, value)
            );
            first.tell(left.id, value);
            second.tell(right.id, value);
        }
        assert_eq!(trace(9), trace(9));
    }
}
