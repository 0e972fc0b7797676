//! Bayesian optimisation with a Gaussian process (see [`super::gp_model`]).
//!
//! The first `n_initial` suggestions are scrambled Sobol points. After that each
//! `ask` standardises the observed objectives, refits the hyperparameters when
//! enough new observations arrived, conditions the process on the observations
//! plus every pending suggestion told the lie "as good as the best so far"
//! (constant liar, so parallel asks spread out), and maximises the acquisition over
//! random candidates, perturbations of the best observations, and a local search
//! from the best few. The chosen configuration is one not already observed or
//! pending whenever such a candidate exists.
//!
//! Features: each numeric parameter is one coordinate in `[0, 1]` (log-aware),
//! integers rounded to their step inside the transform; a choice of k ≥ 2 values is
//! a one-hot block sharing one length scale. An inactive conditional parameter sits
//! at a neutral value (0.5, or an all-zero block), which its parent's coordinate
//! already tells apart.

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use statrs::function::erf::erfc;

use super::gp_model::{self, Layout, Posterior};
use super::history::History;
use super::sobol::sobol_point;
use xp_runtime::seeded::mix_seed;
use xp_runtime::spec::{Config, ParamKind, SearchSpace};

use super::{Acquisition, Searcher, Suggestion, standard_normal};

/// Tuning of [`GpSearcher`]; [`GpOptions::default`] suits most searches.
#[derive(Debug, Clone, PartialEq)]
pub struct GpOptions {
    /// Sobol points before the first model; `max(2 * parameters, 5)` when `None`.
    pub n_initial: Option<usize>,
    /// Uniformly random candidates scored per `ask`.
    pub n_candidates: usize,
    /// Gaussian perturbations scored around each of the five best observations.
    pub n_local: usize,
    /// Candidates improved by local search after the first scoring.
    pub n_refine: usize,
    /// Rounds of local search; each scores 8 perturbations of every refined candidate.
    pub refine_rounds: usize,
    /// The most observations the hyperparameters are fitted on (a seeded random
    /// subset beyond); the posterior always uses all of them.
    pub max_fit_points: usize,
    /// Random restarts of the hyperparameter fit besides the warm start.
    pub fit_restarts: usize,
    /// Iterations of each hyperparameter optimisation run.
    pub fit_iterations: usize,
    /// The smallest root-mean-square feature distance from a pending suggestion at
    /// which a new one may be proposed, so parallel asks are never near-duplicates
    /// even where the lie leaves the acquisition flat.
    pub min_pending_separation: f64,
}

impl Default for GpOptions {
    fn default() -> Self {
        Self {
            n_initial: None,
            n_candidates: 1024,
            n_local: 20,
            n_refine: 5,
            refine_rounds: 8,
            max_fit_points: 100,
            fit_restarts: 2,
            fit_iterations: 60,
            min_pending_separation: 0.02,
        }
    }
}

/// Where a parameter's features sit in a feature row.
#[derive(Debug, Clone, Copy)]
enum Slot {
    /// One coordinate.
    Numeric(usize),
    /// A one-hot block of `count` coordinates.
    OneHot { offset: usize, count: usize },
    /// A single-valued parameter, which carries no information.
    Constant,
}

/// The feature transform of a space.
#[derive(Debug, Clone)]
struct Features {
    slots: Vec<Slot>,
    owners: Vec<usize>,
}

impl Features {
    fn new(space: &SearchSpace) -> Self {
        let mut slots = Vec::with_capacity(space.len());
        let mut owners = Vec::new();
        for (param_idx, param) in space.params().iter().enumerate() {
            let slot = match (param.kind(), param.cardinality()) {
                (_, Some(1)) => Slot::Constant,
                (ParamKind::Choice { values }, _) => Slot::OneHot {
                    offset: owners.len(),
                    count: values.len(),
                },
                _ => Slot::Numeric(owners.len()),
            };
            let width = match slot {
                Slot::Numeric(_) => 1,
                Slot::OneHot { count, .. } => count,
                Slot::Constant => 0,
            };
            owners.extend(std::iter::repeat_n(param_idx, width));
            slots.push(slot);
        }
        Self { slots, owners }
    }

    fn width(&self) -> usize {
        self.owners.len()
    }

    /// Appends the features of the unit point `point` to `out`.
    fn push_unit(&self, space: &SearchSpace, point: &[f64], out: &mut Vec<f64>) {
        let active = space.active_in_unit(point);
        let start = out.len();
        out.resize(start + self.width(), 0.0);
        let row = &mut out[start..];
        for (param_idx, slot) in self.slots.iter().enumerate() {
            let param = &space.params()[param_idx];
            match *slot {
                Slot::Numeric(offset) => {
                    row[offset] = if active[param_idx] {
                        param.snap_unit(point[param_idx])
                    } else {
                        0.5
                    };
                }
                Slot::OneHot { offset, .. } => {
                    if active[param_idx] {
                        row[offset + param.level_of_unit(point[param_idx]) as usize] = 1.0;
                    }
                }
                Slot::Constant => {}
            }
        }
    }

    /// Appends the features of `config` to `out`.
    fn push_config(&self, space: &SearchSpace, config: &Config, out: &mut Vec<f64>) {
        let point = unit_point(space, config);
        self.push_unit(space, &point, out);
    }
}

/// `config` as a unit point, inactive parameters at 0.5.
fn unit_point(space: &SearchSpace, config: &Config) -> Vec<f64> {
    space
        .encode(config)
        .into_iter()
        .map(|unit| unit.unwrap_or(0.5))
        .collect()
}

/// Bayesian optimisation with a Gaussian process over a [`SearchSpace`]; never runs out.
#[derive(Debug, Clone)]
pub struct GpSearcher {
    space: SearchSpace,
    acquisition: Acquisition,
    options: GpOptions,
    rng: StdRng,
    sobol_seed: u64,
    sobol_index: u64,
    history: History,
    features: Features,
    /// Fitted log hyperparameters, and the number of observations they were fitted on.
    theta: Option<(Vec<f64>, usize)>,
}

impl GpSearcher {
    /// A GP searcher over `space` scoring by `acquisition`; `seed` fixes its Sobol
    /// scramble, candidates and fitting restarts.
    pub fn new(
        space: SearchSpace,
        seed: u64,
        acquisition: Acquisition,
        options: GpOptions,
    ) -> Self {
        let features = Features::new(&space);
        Self {
            space,
            acquisition,
            options,
            rng: StdRng::seed_from_u64(mix_seed(seed, 1)),
            sobol_seed: mix_seed(seed, 2),
            sobol_index: 0,
            history: History::default(),
            features,
            theta: None,
        }
    }

    fn n_initial(&self) -> usize {
        self.options
            .n_initial
            .unwrap_or_else(|| (2 * self.space.len()).max(5))
    }

    fn layout(&self) -> Layout<'_> {
        Layout {
            width: self.features.width(),
            owners: &self.features.owners,
            groups: self.space.len(),
        }
    }

    /// Refits the hyperparameters on (a subset of) the observations when none are
    /// fitted yet or the observations grew by an eighth since the last fit.
    fn refit_if_due(&mut self, x: &[f64], y: &[f64]) {
        let n = y.len();
        if let Some((_, fitted_on)) = &self.theta
            && n < fitted_on + (fitted_on / 8).max(1)
        {
            return;
        }
        let width = self.features.width();
        let (x_fit, y_fit) = if n > self.options.max_fit_points {
            let mut indices: Vec<usize> = (0..n).collect();
            for idx in 0..self.options.max_fit_points {
                let pick = self.rng.random_range(idx..n);
                indices.swap(idx, pick);
            }
            indices.truncate(self.options.max_fit_points);
            indices.sort_unstable();
            let x_fit = indices
                .iter()
                .flat_map(|row| x[row * width..(row + 1) * width].iter().copied())
                .collect();
            let y_fit = indices.iter().map(|row| y[*row]).collect();
            (x_fit, y_fit)
        } else {
            (x.to_vec(), y.to_vec())
        };
        // A warm refit starts from the last fit and one random point; the first fit
        // from the prior mean and `fit_restarts` random points.
        let restarts = if self.theta.is_some() {
            self.options.fit_restarts.min(1)
        } else {
            self.options.fit_restarts
        };
        let normals: Vec<Vec<f64>> = (0..restarts)
            .map(|_| {
                (0..self.space.len() + 2)
                    .map(|_| standard_normal(&mut self.rng))
                    .collect()
            })
            .collect();
        let layout = self.layout();
        let mut starts = vec![match &self.theta {
            Some((theta, _)) => theta.clone(),
            None => layout.prior_mean(),
        }];
        starts.extend(normals.iter().map(|normals| layout.start_from(normals)));
        let fitted = gp_model::fit(&x_fit, &y_fit, layout, &starts, self.options.fit_iterations)
            .unwrap_or_else(|| starts[0].clone());
        self.theta = Some((fitted, n));
    }

    /// Scores unit points (row-major, one coordinate per parameter): larger is
    /// better, minus infinity too close to a pending suggestion (`pending` holds
    /// their feature rows).
    fn score(&self, posterior: &Posterior, best: f64, pending: &[f64], points: &[f64]) -> Vec<f64> {
        let dims = self.space.len();
        let width = self.features.width();
        let mut rows = Vec::with_capacity(points.len() / dims * width);
        for point in points.chunks_exact(dims) {
            self.features.push_unit(&self.space, point, &mut rows);
        }
        let (mean, sd) = posterior.predict(&rows);
        let min_sq_distance = self.options.min_pending_separation.powi(2) * width as f64;
        rows.chunks_exact(width)
            .zip(mean.iter().zip(&sd))
            .map(|(row, (mean, sd))| {
                let crowded = pending.chunks_exact(width).any(|other| {
                    row.iter()
                        .zip(other)
                        .map(|(a, b)| (a - b).powi(2))
                        .sum::<f64>()
                        < min_sq_distance
                });
                if crowded {
                    return f64::NEG_INFINITY;
                }
                match self.acquisition {
                    Acquisition::Ucb { kappa } => kappa * sd - mean,
                    Acquisition::Ei => sd.ln() + log_h((best - mean) / sd),
                }
            })
            .collect()
    }

    /// `point` moved by a Gaussian step of scale `sigma` in every coordinate, clamped.
    fn perturb(&mut self, point: &[f64], sigma: f64) -> Vec<f64> {
        point
            .iter()
            .map(|unit| (unit + sigma * standard_normal(&mut self.rng)).clamp(0.0, 1.0))
            .collect()
    }

    fn ask_model(&mut self) -> Config {
        let dims = self.space.len();
        let width = self.features.width();
        let objectives: Vec<f64> = self
            .history
            .observed()
            .iter()
            .map(|observation| observation.objective)
            .collect();
        let n = objectives.len() as f64;
        let mean = objectives.iter().sum::<f64>() / n;
        let variance = objectives.iter().map(|y| (y - mean).powi(2)).sum::<f64>() / n;
        let scale = if variance.sqrt() > 1e-12 * mean.abs().max(1.0) {
            variance.sqrt()
        } else {
            1.0
        };
        let y: Vec<f64> = objectives.iter().map(|y| (y - mean) / scale).collect();
        let best = y.iter().copied().fold(f64::INFINITY, f64::min);

        let mut x = Vec::with_capacity((self.history.observed().len() + 8) * width);
        for observation in self.history.observed() {
            self.features
                .push_config(&self.space, &observation.config, &mut x);
        }
        self.refit_if_due(&x, &y);
        let theta = self.theta.as_ref().expect("refit_if_due fitted").0.clone();

        // Constant liar: every pending point is told the best value so far.
        let mut y_train = y.clone();
        let mut pending = Vec::new();
        for config in self.history.pending() {
            self.features.push_config(&self.space, config, &mut pending);
            y_train.push(best);
        }
        x.extend_from_slice(&pending);
        let posterior = Posterior::new(x, &y_train, self.layout(), &theta);

        let mut points: Vec<f64> = (0..self.options.n_candidates * dims)
            .map(|_| self.rng.random_range(0.0..1.0))
            .collect();
        let mut ranked: Vec<usize> = (0..y.len()).collect();
        ranked.sort_by(|left, right| y[*left].total_cmp(&y[*right]));
        for observation_idx in ranked.into_iter().take(5) {
            let centre = unit_point(
                &self.space,
                &self.history.observed()[observation_idx].config,
            );
            for _ in 0..self.options.n_local {
                let perturbed = self.perturb(&centre, 0.05);
                points.extend(perturbed);
            }
        }
        let mut scores = self.score(&posterior, best, &pending, &points);

        // Local search from the best few candidates.
        let mut order: Vec<usize> = (0..scores.len()).collect();
        order.sort_by(|left, right| scores[*right].total_cmp(&scores[*left]));
        let mut incumbents: Vec<(Vec<f64>, f64)> = order
            .iter()
            .take(self.options.n_refine)
            .map(|idx| (points[idx * dims..(idx + 1) * dims].to_vec(), scores[*idx]))
            .collect();
        let mut sigma = 0.1;
        for _ in 0..self.options.refine_rounds {
            let mut trial_points = Vec::with_capacity(incumbents.len() * 8 * dims);
            for (incumbent, _) in &incumbents.clone() {
                for _ in 0..8 {
                    let perturbed = self.perturb(incumbent, sigma);
                    trial_points.extend(perturbed);
                }
            }
            let trial_scores = self.score(&posterior, best, &pending, &trial_points);
            for (incumbent_idx, incumbent) in incumbents.iter_mut().enumerate() {
                for trial in incumbent_idx * 8..(incumbent_idx + 1) * 8 {
                    if trial_scores[trial] > incumbent.1 {
                        *incumbent = (
                            trial_points[trial * dims..(trial + 1) * dims].to_vec(),
                            trial_scores[trial],
                        );
                    }
                }
            }
            points.extend(trial_points);
            scores.extend(trial_scores);
            sigma *= 0.6;
        }
        for (incumbent, score) in incumbents {
            points.extend(incumbent);
            scores.push(score);
        }

        // The best candidate that is neither observed nor pending.
        let mut order: Vec<usize> = (0..scores.len()).collect();
        order.sort_by(|left, right| {
            scores[*right]
                .total_cmp(&scores[*left])
                .then(left.cmp(right))
        });
        let mut first = None;
        for idx in order {
            let config = self.space.decode(&points[idx * dims..(idx + 1) * dims]);
            if !self.history.is_known(&config) {
                return config;
            }
            first.get_or_insert(config);
        }
        first.expect("there is at least one candidate")
    }
}

/// `ln(φ(z) + z·Φ(z))`, the log of expected improvement at unit standard deviation,
/// computed without underflow far below the incumbent.
fn log_h(z: f64) -> f64 {
    const LN_SQRT_2PI: f64 = 0.918_938_533_204_672_8;
    let pdf = |z: f64| (-0.5 * z * z - LN_SQRT_2PI).exp();
    if z > -1.0 {
        let cdf = 0.5 * erfc(-z / std::f64::consts::SQRT_2);
        return (pdf(z) + z * cdf).ln();
    }
    let t = -z;
    // h(z) = φ(z)·(1 − t·R(t)) with Mills' ratio R(t) = Φ(−t)/φ(t).
    let tail = if t < 26.0 {
        1.0 - t * (0.5 * erfc(t / std::f64::consts::SQRT_2)) / pdf(t)
    } else {
        // The asymptotic series of 1 − t·R(t); the next term is below 1e-8 relative.
        let u = 1.0 / (t * t);
        u * (1.0 - u * (3.0 - u * (15.0 - u * (105.0 - 945.0 * u))))
    };
    -0.5 * z * z - LN_SQRT_2PI + tail.ln()
}

impl Searcher for GpSearcher {
    fn ask(&mut self) -> Option<Suggestion> {
        let config = if self.features.width() == 0 {
            self.space.sample(&mut self.rng)
        } else if self.history.observed().len() < self.n_initial() {
            let point = sobol_point(self.sobol_index, self.space.len(), self.sobol_seed);
            self.sobol_index += 1;
            self.space.decode(&point)
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

    #[test]
    fn log_h_is_continuous_and_matches_the_direct_formula() {
        for z in [-30.0, -25.9, -19.9, -5.0, -1.5, -1.0, 0.0, 2.0] {
            let direct = {
                let pdf = (-0.5f64 * z * z).exp() / (2.0 * std::f64::consts::PI).sqrt();
                let cdf = 0.5 * erfc(-z / std::f64::consts::SQRT_2);
                (pdf + z * cdf).ln()
            };
            if direct.is_finite() && z > -25.0 {
                assert!(
                    (log_h(z) - direct).abs() < 1e-6 * direct.abs().max(1.0),
                    "z = {z}"
                );
            }
        }
        assert!((log_h(-26.0 - 1e-9) - log_h(-26.0 + 1e-9)).abs() < 1e-7);
        assert!(log_h(-40.0).is_finite());
        assert!(log_h(-40.0) < log_h(-30.0));
    }
}
