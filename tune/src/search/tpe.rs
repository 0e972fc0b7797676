//! The tree-structured Parzen estimator (Bergstra et al. 2011) with Optuna's defaults.
//!
//! After `n_initial` random configurations, each `ask` splits the observations at
//! the `gamma` quantile (the `min(ceil(gamma·n), 25)` best ones are "good", Optuna's
//! rule), fits one Parzen estimator per parameter to the good ones, l(x), and one to
//! the rest, g(x), draws candidates from l and returns the one maximising
//! l(x)/g(x). Numeric parameters use truncated Gaussian kernels on their `[0, 1]`
//! image (Optuna's neighbour bandwidths with its "magic clip", a wide prior kernel,
//! probability mass of the cell for integers); choices use smoothed counts.
//! The good set grows linearly with `n` on purpose: the magic clip keeps every kernel
//! of l at least `1/(n_good + 2)` wide, so a good set of two or three points (as
//! Hyperopt's `ceil(0.25·√n)` gives at 30 to 100 observations) leaves l broad while g
//! piles up where the search has been sampling, next to the best points, and the
//! ratio then steers candidates away from them.
//! A conditional parameter's estimators see only the observations where it is
//! active. With `TpeOptions::multivariate` (`tpe: {multivariate: true}`), l(x) and
//! g(x) are instead the joint product-kernel estimators of `tpe_joint.rs`. Pending suggestions join the "rest" (Optuna's constant liar), which pushes
//! parallel asks apart. The result is one not already observed or pending whenever
//! a draw allows it: when every candidate from l is known (small discrete spaces),
//! up to `FRESH_DRAWS` draws from the prior are scored the same way, and the random
//! start redraws a known configuration up to as many times.

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use statrs::function::erf::{erfc, erfc_inv};

use super::history::{History, split_encoded};
use super::tpe_joint::JointModel;
use xp_runtime::seeded::mix_seed;
use xp_runtime::spec::{Config, Param, ParamKind, SearchSpace};

use super::{Searcher, Suggestion};

/// Tuning of [`TpeSearcher`]; [`TpeOptions::default`] follows Optuna's defaults.
#[derive(Debug, Clone, PartialEq)]
pub struct TpeOptions {
    /// Random configurations before the first model.
    pub n_initial: usize,
    /// The quantile of "good" observations: the best `min(ceil(gamma·n), 25)` of `n`
    /// (at least one) shape l(x).
    pub gamma: f64,
    /// Candidates drawn from l(x) per `ask`.
    pub n_candidates: usize,
    /// The weight of the prior kernel (uniform over the domain) in each estimator.
    pub prior_weight: f64,
    /// Model the parameters jointly (product kernels, grouped by where they are
    /// active, Optuna's `multivariate=True, group=True`) rather than one at a time.
    pub multivariate: bool,
}

impl Default for TpeOptions {
    fn default() -> Self {
        Self {
            n_initial: 10,
            gamma: 0.1,
            n_candidates: 24,
            prior_weight: 1.0,
            multivariate: false,
        }
    }
}

/// How many prior draws look for a configuration that is neither observed nor
/// pending when the usual draws gave none.
const FRESH_DRAWS: usize = 64;

pub(super) const LN_SQRT_2PI: f64 = 0.918_938_533_204_672_8;

pub(super) fn normal_cdf(z: f64) -> f64 {
    0.5 * erfc(-z / std::f64::consts::SQRT_2)
}

fn normal_quantile(p: f64) -> f64 {
    -std::f64::consts::SQRT_2 * erfc_inv(2.0 * p)
}

pub(super) fn log_sum_exp(terms: impl Iterator<Item = f64> + Clone) -> f64 {
    let max = terms.clone().fold(f64::NEG_INFINITY, f64::max);
    if max == f64::NEG_INFINITY {
        return max;
    }
    max + terms.map(|term| (term - max).exp()).sum::<f64>().ln()
}

/// Optuna's univariate bandwidths on `[0, 1]`: each kernel as wide as the larger gap
/// to its neighbours (the nearer one at the ends), clipped to `[1/min(n + 1, 100), 1]`
/// (the magic clip); `mus` ends with the prior's centre, whose kernel is the domain.
pub(super) fn neighbour_sigmas(mus: &[f64]) -> Vec<f64> {
    let n = mus.len();
    let mut order: Vec<usize> = (0..n).collect();
    order.sort_by(|left, right| mus[*left].total_cmp(&mus[*right]));
    let sorted: Vec<f64> = order.iter().map(|idx| mus[*idx]).collect();
    let min_sigma = 1.0 / (1.0 + n as f64).min(100.0);
    let mut sigmas = vec![0.0; n];
    for (rank, idx) in order.iter().enumerate() {
        let left = if rank == 0 { 0.0 } else { sorted[rank - 1] };
        let right = if rank + 1 == n { 1.0 } else { sorted[rank + 1] };
        let mut sigma = (sorted[rank] - left).max(right - sorted[rank]);
        if n >= 2 && rank == 0 {
            sigma = sorted[1] - sorted[0];
        } else if n >= 2 && rank + 1 == n {
            sigma = sorted[n - 1] - sorted[n - 2];
        }
        sigmas[*idx] = sigma.clamp(min_sigma, 1.0);
    }
    // The prior kernel is wide.
    if let Some(prior) = sigmas.last_mut() {
        *prior = 1.0;
    }
    sigmas
}

/// A draw from the Gaussian `(mu, sigma)` truncated to `[0, 1]`, by inverting its CDF.
pub(super) fn sample_truncated(mu: f64, sigma: f64, rng: &mut StdRng) -> f64 {
    let low = normal_cdf(-mu / sigma);
    let high = normal_cdf((1.0 - mu) / sigma);
    let p = low + rng.random_range(0.0..1.0) * (high - low);
    (mu + sigma * normal_quantile(p.clamp(1e-300, 1.0 - 1e-16))).clamp(0.0, 1.0)
}

/// A one-dimensional density on a parameter's `[0, 1]` image.
#[derive(Debug, Clone)]
enum Parzen {
    /// A mixture of Gaussians truncated to `[0, 1]`.
    Numeric {
        mus: Vec<f64>,
        sigmas: Vec<f64>,
        /// Normalised mixture weights.
        weights: Vec<f64>,
        /// The log mass each kernel keeps inside `[0, 1]`.
        log_masses: Vec<f64>,
    },
    /// Smoothed frequencies of each choice.
    Categorical { log_probs: Vec<f64> },
}

impl Parzen {
    /// The estimator of `param` from the `[0, 1]` images of its observed values.
    fn fit(param: &Param, units: &[f64], prior_weight: f64) -> Self {
        if let ParamKind::Choice { values } = param.kind() {
            let count = values.len();
            let mut weights = vec![prior_weight / count as f64; count];
            for unit in units {
                weights[param.level_of_unit(*unit) as usize] += 1.0;
            }
            let total: f64 = weights.iter().sum();
            return Self::Categorical {
                log_probs: weights.iter().map(|weight| (weight / total).ln()).collect(),
            };
        }
        let mut mus = units.to_vec();
        mus.push(0.5);
        let n = mus.len();
        let sigmas = neighbour_sigmas(&mus);
        let mut weights = vec![1.0; n];
        weights[n - 1] = prior_weight;
        let total: f64 = weights.iter().sum();
        weights.iter_mut().for_each(|weight| *weight /= total);
        let log_masses = mus
            .iter()
            .zip(&sigmas)
            .map(|(mu, sigma)| (normal_cdf((1.0 - mu) / sigma) - normal_cdf(-mu / sigma)).ln())
            .collect();
        Self::Numeric {
            mus,
            sigmas,
            weights,
            log_masses,
        }
    }

    /// A draw, as a position in `[0, 1]`.
    fn sample(&self, rng: &mut StdRng) -> f64 {
        match self {
            Self::Numeric {
                mus,
                sigmas,
                weights,
                ..
            } => {
                let mut pick = rng.random_range(0.0..1.0);
                let mut kernel = weights.len() - 1;
                for (idx, weight) in weights.iter().enumerate() {
                    if pick < *weight {
                        kernel = idx;
                        break;
                    }
                    pick -= weight;
                }
                sample_truncated(mus[kernel], sigmas[kernel], rng)
            }
            Self::Categorical { log_probs } => {
                let mut pick = rng.random_range(0.0..1.0);
                let mut choice = log_probs.len() - 1;
                for (idx, log_prob) in log_probs.iter().enumerate() {
                    let prob = log_prob.exp();
                    if pick < prob {
                        choice = idx;
                        break;
                    }
                    pick -= prob;
                }
                (choice as f64 + 0.5) / log_probs.len() as f64
            }
        }
    }

    /// The log density at `unit` for reals, the log probability of the value whose
    /// cell holds `unit` otherwise.
    fn log_density(&self, param: &Param, unit: f64) -> f64 {
        match self {
            Self::Numeric {
                mus,
                sigmas,
                weights,
                log_masses,
            } => {
                let kernels = mus.iter().zip(sigmas).zip(weights).zip(log_masses);
                if param.is_continuous() {
                    log_sum_exp(kernels.map(|(((mu, sigma), weight), log_mass)| {
                        let z = (unit - mu) / sigma;
                        weight.ln() - 0.5 * z * z - LN_SQRT_2PI - sigma.ln() - log_mass
                    }))
                } else {
                    let (low, high) = param.unit_cell(unit);
                    log_sum_exp(kernels.map(|(((mu, sigma), weight), log_mass)| {
                        let mass = normal_cdf((high - mu) / sigma) - normal_cdf((low - mu) / sigma);
                        weight.ln() + mass.max(0.0).ln() - log_mass
                    }))
                }
            }
            Self::Categorical { log_probs } => log_probs[param.level_of_unit(unit) as usize],
        }
    }
}

/// log l(x) − log g(x) of one parameter at `unit`.
fn log_ratio(good: &Parzen, rest: &Parzen, param: &Param, unit: f64) -> f64 {
    good.log_density(param, unit) - rest.log_density(param, unit)
}

/// l(x) and g(x) of one `ask`.
enum Model {
    /// One estimator per parameter (the original TPE).
    Marginal {
        good: Vec<Parzen>,
        rest: Vec<Parzen>,
    },
    /// Product kernels over groups of parameters (multivariate TPE).
    Joint(JointModel),
}

impl Model {
    /// A candidate drawn from l(x), as a unit point with `None` where inactive.
    fn draw(&self, space: &SearchSpace, rng: &mut StdRng) -> Vec<Option<f64>> {
        let good = match self {
            Self::Joint(joint) => return joint.draw(space, rng),
            Self::Marginal { good, .. } => good,
        };
        let dims = space.len();
        let mut point = vec![0.5; dims];
        let mut active = vec![false; dims];
        for param_idx in 0..dims {
            if !space.is_active_in_unit(param_idx, &point, &active) {
                continue;
            }
            point[param_idx] = good[param_idx].sample(rng);
            active[param_idx] = true;
        }
        point
            .into_iter()
            .zip(active)
            .map(|(unit, active)| active.then_some(unit))
            .collect()
    }

    /// log l(x) − log g(x) at a unit point.
    fn score(&self, space: &SearchSpace, point: &[Option<f64>]) -> f64 {
        match self {
            Self::Marginal { good, rest } => point
                .iter()
                .enumerate()
                .filter_map(|(param_idx, unit)| {
                    let param = &space.params()[param_idx];
                    unit.map(|unit| log_ratio(&good[param_idx], &rest[param_idx], param, unit))
                })
                .sum(),
            Self::Joint(joint) => joint.score(space, point),
        }
    }
}

/// The tree-structured Parzen estimator over a [`SearchSpace`]; never runs out.
#[derive(Debug, Clone)]
pub struct TpeSearcher {
    space: SearchSpace,
    options: TpeOptions,
    rng: StdRng,
    history: History,
}

impl TpeSearcher {
    /// A TPE searcher over `space`; `seed` fixes its random start and its draws.
    pub fn new(space: SearchSpace, seed: u64, options: TpeOptions) -> Self {
        Self {
            space,
            options,
            rng: StdRng::seed_from_u64(mix_seed(seed, 3)),
            history: History::default(),
        }
    }

    /// The estimators of every parameter from the unit points of `configs`.
    fn estimators(&self, units: &[Vec<Option<f64>>]) -> Vec<Parzen> {
        self.space
            .params()
            .iter()
            .enumerate()
            .map(|(param_idx, param)| {
                let values: Vec<f64> = units.iter().filter_map(|point| point[param_idx]).collect();
                Parzen::fit(param, &values, self.options.prior_weight)
            })
            .collect()
    }

    /// One model-based suggestion: split the observations, fit l(x) and g(x), and
    /// take the best-scoring candidate that is neither observed nor pending.
    fn ask_model(&mut self) -> Config {
        let observed = self.history.observed();
        let n = observed.len();
        let n_below = ((self.options.gamma * (n as f64)).ceil() as usize)
            .clamp(1, 25)
            .min(n);
        // Pending points are the newest, after the observations.
        let (below, above) = split_encoded(
            &self.space,
            observed,
            n_below,
            self.history.pending(),
            self.options.multivariate,
        );
        let model = if self.options.multivariate {
            Model::Joint(JointModel::fit(
                &self.space,
                &below,
                None,
                &above,
                self.options.prior_weight,
            ))
        } else {
            Model::Marginal {
                good: self.estimators(&below),
                rest: self.estimators(&above),
            }
        };

        let mut ranked: Vec<(f64, Config)> = (0..self.options.n_candidates.max(1))
            .map(|_| {
                let point = model.draw(&self.space, &mut self.rng);
                let score = model.score(&self.space, &point);
                let units: Vec<f64> = point.iter().map(|unit| unit.unwrap_or(0.5)).collect();
                (score, self.space.decode(&units))
            })
            .collect();
        // A stable sort: ties keep the order of the draws.
        ranked.sort_by(|left, right| right.0.total_cmp(&left.0));
        if let Some(index) = ranked
            .iter()
            .position(|(_, config)| !self.history.is_known(config))
        {
            return ranked.swap_remove(index).1;
        }
        // Every draw from l(x) is known: take the most promising new draw from the prior.
        let mut fresh: Option<(f64, Config)> = None;
        for _ in 0..FRESH_DRAWS {
            let config = self.space.sample(&mut self.rng);
            if self.history.is_known(&config) {
                continue;
            }
            let score = model.score(&self.space, &self.space.encode(&config));
            if fresh.as_ref().is_none_or(|(best, _)| score > *best) {
                fresh = Some((score, config));
            }
        }
        fresh
            .or_else(|| ranked.into_iter().next())
            .expect("there is at least one candidate")
            .1
    }

    /// A configuration from the prior, redrawn while it is already observed or pending.
    fn ask_prior(&mut self) -> Config {
        let first = self.space.sample(&mut self.rng);
        if !self.history.is_known(&first) {
            return first;
        }
        for _ in 1..FRESH_DRAWS {
            let config = self.space.sample(&mut self.rng);
            if !self.history.is_known(&config) {
                return config;
            }
        }
        first
    }
}

impl Searcher for TpeSearcher {
    fn ask(&mut self) -> Option<Suggestion> {
        let config = if self.history.observed().len() < self.options.n_initial.max(1) {
            self.ask_prior()
        } else {
            self.ask_model()
        };
        Some(self.history.issue(config))
    }

    fn tell(&mut self, id: u64, objective: f64) {
        self.history.tell(id, objective);
    }

    fn forget(&mut self, id: u64) {
        self.history.forget(id);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use xp_runtime::spec::ParamValue;

    fn float_param() -> Param {
        SearchSpace::builder()
            .uniform("x", 0.0, 1.0)
            .build()
            .unwrap()
            .params()[0]
            .clone()
    }

    #[test]
    fn a_numeric_estimator_is_a_density_on_the_unit_interval() {
        let param = float_param();
        let parzen = Parzen::fit(&param, &[0.1, 0.15, 0.8], 1.0);
        let steps = 20_000;
        let integral: f64 = (0..steps)
            .map(|idx| {
                parzen
                    .log_density(&param, (f64::from(idx) + 0.5) / f64::from(steps))
                    .exp()
            })
            .sum::<f64>()
            / f64::from(steps);
        assert!((integral - 1.0).abs() < 1e-3, "integral {integral}");
        assert!(parzen.log_density(&param, 0.12) > parzen.log_density(&param, 0.5));
    }

    #[test]
    fn integer_cells_carry_probability_mass() {
        let space = SearchSpace::builder().int("k", 1, 4).build().unwrap();
        let param = &space.params()[0];
        let parzen = Parzen::fit(param, &[param.to_unit(&ParamValue::Int(2)).unwrap()], 1.0);
        let total: f64 = (1..=4)
            .map(|k| {
                parzen
                    .log_density(param, param.to_unit(&ParamValue::Int(k)).unwrap())
                    .exp()
            })
            .sum();
        assert!((total - 1.0).abs() < 1e-9, "total {total}");
    }

    #[test]
    fn categorical_estimators_smooth_the_counts() {
        let space = SearchSpace::builder()
            .choice("c", ["a", "b"])
            .build()
            .unwrap();
        let param = &space.params()[0];
        let parzen = Parzen::fit(param, &[0.25, 0.25, 0.25], 1.0);
        assert!((parzen.log_density(param, 0.25).exp() - 3.5 / 4.0).abs() < 1e-12);
        assert!((parzen.log_density(param, 0.75).exp() - 0.5 / 4.0).abs() < 1e-12);
    }

    #[test]
    fn draws_stay_in_the_unit_interval() {
        let param = float_param();
        let parzen = Parzen::fit(&param, &[0.0, 1.0, 0.999], 1.0);
        let mut rng = StdRng::seed_from_u64(5);
        for _ in 0..1000 {
            let unit = parzen.sample(&mut rng);
            assert!((0.0..=1.0).contains(&unit));
        }
    }
}
