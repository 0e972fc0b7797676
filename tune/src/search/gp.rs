//! Bayesian optimisation with a Gaussian process (see [`super::gp_model`]).
//!
//! The first `n_initial` suggestions are scrambled Sobol points. After that each
//! `ask` standardises the observed objectives and warps them towards normal (a
//! Yeo–Johnson power transform, as HEBO does), refits the hyperparameters when
//! enough new observations arrived, conditions the process on the observations
//! plus every pending suggestion told its posterior mean (kriging believer, so
//! parallel asks spread out), and maximises the acquisition
//! (log-EI or UCB, [`super::gp_acq`]) over scrambled Sobol candidates in a trust
//! region around the best observation (TuRBO's box, shaped by the fitted length
//! scales and resized by the run of improvements and misses), boxes of five sizes
//! around that observation and perturbations of the best five, then improves the
//! best few by random local search or, when `polish_iterations` is set, by
//! gradient ascent. The chosen configuration is one not already observed or
//! pending whenever such a candidate exists.
//!
//! Features: each numeric parameter is one coordinate in `[0, 1]` (log-aware),
//! integers rounded to their step inside the transform; a choice of k ≥ 2 values is
//! a one-hot block sharing one length scale. An inactive conditional parameter sits
//! at a neutral value (0.5, or an all-zero block), which its parent's coordinate
//! already tells apart.

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use super::gp_acq;
use super::gp_model::{self, Layout, Posterior};
use super::history::{History, Observation};
use super::sobol::sobol_point;
use xp_runtime::seeded::mix_seed;
use xp_runtime::spec::{Config, ParamKind, SearchSpace};

use super::{Acquisition, Searcher, Suggestion, standard_normal};

/// Tuning of [`GpSearcher`]; [`GpOptions::default`] suits most searches.
#[derive(Debug, Clone, PartialEq)]
pub struct GpOptions {
    /// Sobol points before the first model; twice the parameters, between 5 and 10,
    /// when `None` (beyond 10, a model-guided evaluation in the trust region taught
    /// more than a space-filling one: on the benchmark suite 20 initial points left
    /// 10 and 20 dimensions behind at 50 evaluations, README).
    pub n_initial: Option<usize>,
    /// Scrambled Sobol candidates scored per `ask`.
    pub n_candidates: usize,
    /// Gaussian perturbations scored around each of the five best observations.
    pub n_local: usize,
    /// The best-scoring candidates improved by gradient ascent (or local search).
    pub n_refine: usize,
    /// Rounds of random local search in spaces without real parameters; each
    /// scores 8 perturbations of every refined candidate.
    pub refine_rounds: usize,
    /// Iterations of gradient ascent (bounded L-BFGS) on the acquisition from each
    /// refined candidate, over the real parameters; 0 refines by random local search
    /// instead, the default: on the benchmark suite polishing helped only in two
    /// dimensions at 100 evaluations and did worse in 5 to 20 (README).
    pub polish_iterations: usize,
    /// The most observations the hyperparameters are fitted on (a seeded random
    /// subset beyond); the posterior always uses all of them. 64 keeps refits, the
    /// slowest asks, near 20 ms at 200 observations in 10 dimensions (100 took
    /// 45–63 ms once the trust region clustered the data; README).
    pub max_fit_points: usize,
    /// Random restarts of the first hyperparameter fit besides the prior mean
    /// (later refits start from the previous fit).
    pub fit_restarts: usize,
    /// Iterations of each hyperparameter optimisation run from the prior; a warm
    /// refit from the last fit runs half as many (it moves little, and trust-region
    /// data, clustered round the incumbent, made full refits the slowest asks).
    pub fit_iterations: usize,
    /// The smallest root-mean-square feature distance from a pending suggestion at
    /// which a new one may be proposed, so parallel asks are never near-duplicates
    /// even where the lie leaves the acquisition flat.
    pub min_pending_separation: f64,
    /// Candidates drawn around the best observation in boxes shaped by the fitted
    /// length scales (longer along the coordinates the objective varies slowly
    /// in), at five sizes from half the cube down to 1/512 of it, so the search
    /// can both step and converge near the incumbent (0: none).
    pub n_incumbent_candidates: usize,
    /// Whether the Sobol candidates cover a trust region instead of the whole
    /// cube (TuRBO, Eriksson et al. 2019): a length-scale-shaped box around the
    /// best observation whose size doubles after three improvements in a row and
    /// halves after `max(4, parameters)` misses in a row. On the benchmark suite it
    /// lowered the regret at 100 evaluations in every dimension (README).
    pub trust_region: bool,
}

impl Default for GpOptions {
    fn default() -> Self {
        Self {
            n_initial: None,
            n_candidates: 1024,
            n_local: 20,
            n_refine: 5,
            refine_rounds: 8,
            polish_iterations: 0,
            max_fit_points: 64,
            fit_restarts: 2,
            fit_iterations: 60,
            min_pending_separation: 0.02,
            n_incumbent_candidates: 250,
            trust_region: true,
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
            .unwrap_or_else(|| (2 * self.space.len()).clamp(5, 10))
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
        // The first fit starts from the prior mean and `fit_restarts` random points; a
        // warm refit from the last fit alone, which moves little between refits and
        // keeps a refit on 100 points within the latency budget of one `ask`.
        let restarts = if self.theta.is_some() {
            0
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
        let iterations = if self.theta.is_some() {
            self.options.fit_iterations.div_ceil(2)
        } else {
            self.options.fit_iterations
        };
        let fitted = gp_model::fit(&x_fit, &y_fit, layout, &starts, iterations)
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
                gp_acq::value(self.acquisition, best, *mean, *sd)
            })
            .collect()
    }

    /// Per parameter, its fitted length scale over the geometric mean of all of
    /// them (TuRBO's box shape), bounded to `[1/16, 16]` so one badly fitted scale
    /// cannot flatten the box.
    fn box_weights(&self, theta: &[f64]) -> Vec<f64> {
        let informative: Vec<usize> = (0..self.space.len())
            .filter(|param_idx| !matches!(self.features.slots[*param_idx], Slot::Constant))
            .collect();
        let mean_log = informative.iter().map(|idx| theta[*idx]).sum::<f64>()
            / informative.len().max(1) as f64;
        (0..self.space.len())
            .map(|idx| (theta[idx] - mean_log).exp().clamp(1.0 / 16.0, 16.0))
            .collect()
    }

    /// The unit draw `draw` mapped into the box of side `length·weights` centred on
    /// `centre` (cut by the cube). Beyond 20 parameters each coordinate moves with
    /// probability 20/parameters (at least one moves), as TuRBO does, so a step
    /// changes a few coordinates rather than all of them a little.
    fn in_box(&mut self, centre: &[f64], weights: &[f64], length: f64, draw: &[f64]) -> Vec<f64> {
        let dims = centre.len();
        let keep = 1.0 - (20.0 / dims as f64).min(1.0);
        let forced = if keep > 0.0 {
            self.rng.random_range(0..dims)
        } else {
            0
        };
        (0..dims)
            .map(|idx| {
                if keep > 0.0 && idx != forced && self.rng.random::<f64>() < keep {
                    return centre[idx];
                }
                let half = 0.5 * length * weights[idx];
                let (low, high) = ((centre[idx] - half).max(0.0), (centre[idx] + half).min(1.0));
                low + draw[idx] * (high - low)
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

    /// The parameters gradient ascent may move: reals, each one feature.
    fn continuous_params(&self) -> Vec<(usize, usize)> {
        self.features
            .slots
            .iter()
            .enumerate()
            .filter_map(
                |(param_idx, slot)| match (slot, self.space.params()[param_idx].kind()) {
                    (Slot::Numeric(feature), ParamKind::Float { .. }) => {
                        Some((param_idx, *feature))
                    }
                    _ => None,
                },
            )
            .collect()
    }

    /// `start` (a unit point) moved uphill on the acquisition by bounded L-BFGS over
    /// the `continuous` parameters (`(parameter, feature)` pairs), the rest held.
    fn polish(
        &self,
        posterior: &Posterior,
        best: f64,
        continuous: &[(usize, usize)],
        start: Vec<f64>,
    ) -> Vec<f64> {
        let width = self.features.width();
        let mut point = start;
        let initial: Vec<f64> = continuous.iter().map(|(param, _)| point[*param]).collect();
        let objective = |moved: &[f64]| {
            let mut unit = point.clone();
            for ((param, _), value) in continuous.iter().zip(moved) {
                unit[*param] = *value;
            }
            let mut row = Vec::with_capacity(width);
            self.features.push_unit(&self.space, &unit, &mut row);
            let at = posterior.predict_with_gradient(&row);
            let (value, gradient) = gp_acq::value_and_gradient(self.acquisition, best, &at);
            value.is_finite().then(|| {
                (
                    -value,
                    continuous
                        .iter()
                        .map(|(_, feature)| -gradient[*feature])
                        .collect(),
                )
            })
        };
        let (lower, upper) = (vec![0.0; continuous.len()], vec![1.0; continuous.len()]);
        if let Some((moved, _)) = gp_model::minimise(
            objective,
            initial,
            &lower,
            &upper,
            self.options.polish_iterations,
        ) {
            for ((param, _), value) in continuous.iter().zip(moved) {
                point[*param] = value;
            }
        }
        point
    }

    /// Random local search from `starts` (unit points scored `start_scores`):
    /// rounds of Gaussian perturbations with a shrinking step, keeping improvements.
    fn local_search(
        &mut self,
        posterior: &Posterior,
        best: f64,
        pending: &[f64],
        starts: Vec<Vec<f64>>,
        start_scores: Vec<f64>,
    ) -> Vec<Vec<f64>> {
        let dims = self.space.len();
        let mut incumbents: Vec<(Vec<f64>, f64)> = starts.into_iter().zip(start_scores).collect();
        let mut sigma = 0.1;
        for _ in 0..self.options.refine_rounds {
            let mut trial_points = Vec::with_capacity(incumbents.len() * 8 * dims);
            for (incumbent, _) in &incumbents.clone() {
                for _ in 0..8 {
                    let perturbed = self.perturb(incumbent, sigma);
                    trial_points.extend(perturbed);
                }
            }
            let trial_scores = self.score(posterior, best, pending, &trial_points);
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
            sigma *= 0.6;
        }
        incumbents.into_iter().map(|(point, _)| point).collect()
    }

    fn ask_model(&mut self) -> Config {
        // 1. The model of the objective, sure about the pending points.
        let model = self.fit_model();
        // 2. Candidates over the cube, scored by the acquisition.
        let mut points = self.candidates(&model.y, &model.theta);
        let mut scores = self.score(&model.posterior, model.best, &model.pending, &points);
        // 3. The best few, refined and scored again.
        self.refine_best(&model, &mut points, &mut scores);
        // 4. The best that is neither observed nor pending.
        self.best_unknown(&points, &scores)
    }

    /// Fits (or reuses) the Gaussian process on the observations so far.
    fn fit_model(&mut self) -> Model {
        let width = self.features.width();
        let objectives: Vec<f64> = self
            .history
            .observed()
            .iter()
            .map(|observation| observation.objective)
            .collect();
        // Warped towards normal, so that a few huge values (an ill-conditioned
        // or exploding objective) do not flatten the model where the optimum is.
        let y = standardise(&yeo_johnson(&standardise(&objectives)));
        let best = y.iter().copied().fold(f64::INFINITY, f64::min);

        let mut x = Vec::with_capacity((self.history.observed().len() + 8) * width);
        for observation in self.history.observed() {
            self.features
                .push_config(&self.space, &observation.config, &mut x);
        }
        self.refit_if_due(&x, &y);
        let theta = self.theta.as_ref().expect("refit_if_due fitted").0.clone();

        // Kriging believer: every pending point is told the posterior mean there,
        // so the model stays as it is but is sure about the pending points, and
        // the next suggestion goes elsewhere. (The constant liar, "as good as the
        // best so far", lost far more regret at 4 and 8 in flight; README.)
        let mut y_train = y.clone();
        let mut pending = Vec::new();
        for config in self.history.pending() {
            self.features.push_config(&self.space, config, &mut pending);
        }
        if !pending.is_empty() {
            let believed = Posterior::new(x.clone(), &y, self.layout(), &theta);
            y_train.extend(believed.predict(&pending).0);
        }
        x.extend_from_slice(&pending);
        let posterior = Posterior::new(x, &y_train, self.layout(), &theta);
        Model {
            y,
            best,
            theta,
            pending,
            posterior,
        }
    }

    /// The candidate points (in the unit cube, one after the other): a scrambled
    /// Sobol set (even cover, fresh scramble per ask) over the cube or the trust
    /// region, boxes around the incumbent, and Gaussian perturbations of the best
    /// observations.
    fn candidates(&mut self, y: &[f64], theta: &[f64]) -> Vec<f64> {
        let dims = self.space.len();
        let mut ranked: Vec<usize> = (0..y.len()).collect();
        ranked.sort_by(|left, right| y[*left].total_cmp(&y[*right]));
        let incumbent = unit_point(&self.space, &self.history.observed()[ranked[0]].config);
        let weights = self.box_weights(theta);
        let sobol_seed = self.rng.random::<u64>();
        let mut points: Vec<f64> = Vec::with_capacity(
            (self.options.n_candidates + self.options.n_incumbent_candidates) * dims,
        );
        let trust_length = self
            .options
            .trust_region
            .then(|| trust_length(self.history.observed(), self.n_initial(), dims));
        for index in 0..self.options.n_candidates as u64 {
            let point = sobol_point(index, dims, sobol_seed);
            match trust_length {
                Some(length) => {
                    let moved = self.in_box(&incumbent, &weights, length, &point);
                    points.extend(moved);
                }
                None => points.extend(point),
            }
        }
        let per_size = self.options.n_incumbent_candidates / INCUMBENT_BOXES.len();
        for length in INCUMBENT_BOXES {
            for _ in 0..per_size {
                let draw: Vec<f64> = (0..dims).map(|_| self.rng.random::<f64>()).collect();
                let moved = self.in_box(&incumbent, &weights, length, &draw);
                points.extend(moved);
            }
        }
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
        points
    }

    /// Appends to `points` and `scores` the best few candidates, improved by
    /// gradient ascent over the real parameters when asked for, else by random
    /// local search.
    fn refine_best(&mut self, model: &Model, points: &mut Vec<f64>, scores: &mut Vec<f64>) {
        let dims = self.space.len();
        let Model {
            best,
            pending,
            posterior,
            ..
        } = model;
        let best = *best;
        let mut order: Vec<usize> = (0..scores.len()).collect();
        order.sort_by(|left, right| scores[*right].total_cmp(&scores[*left]));
        let starts: Vec<Vec<f64>> = order
            .iter()
            .take(self.options.n_refine)
            .map(|idx| points[idx * dims..(idx + 1) * dims].to_vec())
            .collect();
        let continuous = self.continuous_params();
        let refined: Vec<Vec<f64>> = if continuous.is_empty() || self.options.polish_iterations == 0
        {
            let start_scores = order
                .iter()
                .take(self.options.n_refine)
                .map(|idx| scores[*idx])
                .collect();
            self.local_search(posterior, best, pending, starts, start_scores)
        } else {
            starts
                .into_iter()
                .map(|start| self.polish(posterior, best, &continuous, start))
                .collect()
        };
        for point in refined {
            let score = self.score(posterior, best, pending, &point)[0];
            points.extend(point);
            scores.push(score);
        }
    }

    /// The best-scored candidate whose configuration is neither observed nor
    /// pending; the best one when all are.
    fn best_unknown(&self, points: &[f64], scores: &[f64]) -> Config {
        let dims = self.space.len();
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

/// The model one ask works with.
struct Model {
    /// The observed objectives, warped and standardised.
    y: Vec<f64>,
    /// The smallest of `y`.
    best: f64,
    /// The kernel's hyperparameters.
    theta: Vec<f64>,
    /// The pending points, in the unit cube, one after the other.
    pending: Vec<f64>,
    /// The posterior over observed and (believed) pending points.
    posterior: Posterior,
}

/// The sides of the boxes drawn around the incumbent, relative to the cube's.
const INCUMBENT_BOXES: [f64; 5] = [0.5, 0.125, 0.031_25, 0.007_812_5, 0.001_953_125];

/// The trust region's side (relative to the cube's, before the length-scale
/// shape) after `observed` in telling order, the first `n_initial` of them the
/// space-filling start: TuRBO's rule for one evaluation at a time, starting at 0.8,
/// doubling (to at most 1.6) after 3 improvements in a row, halving after
/// `max(4, dims)` misses in a row, and starting again at 0.8 once it falls below
/// 2⁻⁷. An improvement beats the best so far by more than a thousandth of its size.
fn trust_length(observed: &[Observation], n_initial: usize, dims: usize) -> f64 {
    const INITIAL: f64 = 0.8;
    const MIN: f64 = 0.007_812_5;
    const MAX: f64 = 1.6;
    const SUCCESSES: usize = 3;
    let misses_allowed = dims.max(4);
    let (mut length, mut successes, mut misses) = (INITIAL, 0, 0);
    let mut best = f64::INFINITY;
    for (idx, observation) in observed.iter().enumerate() {
        let improved = observation.objective < best - 1e-3 * best.abs();
        best = best.min(observation.objective);
        if idx < n_initial {
            continue;
        }
        if improved {
            successes += 1;
            misses = 0;
        } else {
            misses += 1;
            successes = 0;
        }
        if successes == SUCCESSES {
            length = (2.0 * length).min(MAX);
            successes = 0;
        } else if misses == misses_allowed {
            length /= 2.0;
            misses = 0;
            if length < MIN {
                length = INITIAL;
            }
        }
    }
    length
}

/// `values` shifted and scaled to mean 0 and standard deviation 1 (only shifted
/// when they are all equal).
fn standardise(values: &[f64]) -> Vec<f64> {
    let n = values.len() as f64;
    let mean = values.iter().sum::<f64>() / n;
    let variance = values.iter().map(|y| (y - mean).powi(2)).sum::<f64>() / n;
    let scale = if variance.sqrt() > 1e-12 * mean.abs().max(1.0) {
        variance.sqrt()
    } else {
        1.0
    };
    values.iter().map(|y| (y - mean) / scale).collect()
}

/// The Yeo–Johnson transform of one value with power `lambda`.
fn yeo_johnson_one(value: f64, lambda: f64) -> f64 {
    if value >= 0.0 {
        if lambda.abs() < 1e-9 {
            value.ln_1p()
        } else {
            ((value + 1.0).powf(lambda) - 1.0) / lambda
        }
    } else if (lambda - 2.0).abs() < 1e-9 {
        -(-value).ln_1p()
    } else {
        -((1.0 - value).powf(2.0 - lambda) - 1.0) / (2.0 - lambda)
    }
}

/// Standardised `values` made closer to normal by a Yeo–Johnson power transform
/// whose power maximises the normal log-likelihood (as HEBO warps its outputs),
/// chosen on a grid over `[-2, 2]`. Monotone, so the best value stays the best.
fn yeo_johnson(values: &[f64]) -> Vec<f64> {
    let n = values.len() as f64;
    let log_jacobian: f64 = values
        .iter()
        .map(|value| value.signum() * value.abs().ln_1p())
        .sum();
    let log_likelihood = |lambda: f64| {
        let moved: Vec<f64> = values.iter().map(|v| yeo_johnson_one(*v, lambda)).collect();
        let mean = moved.iter().sum::<f64>() / n;
        let variance = moved.iter().map(|m| (m - mean).powi(2)).sum::<f64>() / n;
        -0.5 * n * variance.max(1e-300).ln() + (lambda - 1.0) * log_jacobian
    };
    let lambda = (0..=80)
        .map(|step| -2.0 + 0.05 * f64::from(step))
        .map(|lambda| (lambda, log_likelihood(lambda)))
        .filter(|(_, value)| value.is_finite())
        .max_by(|left, right| left.1.total_cmp(&right.1))
        .map_or(1.0, |(lambda, _)| lambda);
    values.iter().map(|v| yeo_johnson_one(*v, lambda)).collect()
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
    use xp_runtime::spec::ParamValue;

    #[test]
    fn yeo_johnson_keeps_the_order_and_tames_a_heavy_tail() {
        // Log-normal values: a few huge ones, as an ill-conditioned objective gives.
        let raw: Vec<f64> = (0..40)
            .map(|idx| {
                (f64::from(idx) * 0.37)
                    .sin()
                    .mul_add(3.0, 0.1 * f64::from(idx))
                    .exp()
            })
            .collect();
        let skew = |values: &[f64]| {
            let z = standardise(values);
            z.iter().map(|v| v.powi(3)).sum::<f64>() / z.len() as f64
        };
        let warped = standardise(&yeo_johnson(&standardise(&raw)));
        for a in 0..raw.len() {
            for b in 0..raw.len() {
                assert_eq!(raw[a] < raw[b], warped[a] < warped[b], "{a}, {b}");
            }
        }
        assert!(
            skew(&warped).abs() < 0.5 * skew(&raw).abs(),
            "skew {} before, {} after",
            skew(&raw),
            skew(&warped)
        );
        // Already normal-looking values are left nearly as they are.
        let even: Vec<f64> = (0..41).map(|idx| f64::from(idx) / 20.0 - 1.0).collect();
        let kept = standardise(&yeo_johnson(&standardise(&even)));
        let before = standardise(&even);
        assert!(
            kept.iter().zip(&before).all(|(a, b)| (a - b).abs() < 0.2),
            "{kept:?}"
        );
    }

    fn observations(objectives: &[f64]) -> Vec<Observation> {
        objectives
            .iter()
            .map(|objective| Observation {
                config: Config::new(),
                objective: *objective,
            })
            .collect()
    }

    #[test]
    fn the_trust_region_grows_on_improvements_and_shrinks_on_misses() {
        let check = |objectives: &[f64], dims: usize, expected: f64| {
            let length = trust_length(&observations(objectives), 2, dims);
            assert!(
                (length - expected).abs() < 1e-12,
                "{objectives:?} in {dims} dimensions: {length}, expected {expected}"
            );
        };
        // The space-filling start never moves the region.
        check(&[5.0, 4.0], 4, 0.8);
        check(&[5.0, 4.0, 3.0, 2.0], 4, 0.8);
        check(&[5.0, 4.0, 3.0, 2.0, 1.0], 4, 1.6);
        // Capped at 1.6; a miss resets the run of improvements.
        check(&[5.0, 4.0, 3.0, 2.0, 1.0, 0.5, 0.4, 0.3], 4, 1.6);
        check(&[5.0, 4.0, 3.0, 2.0, 9.0, 1.0], 4, 0.8);
        // max(4, dims) misses in a row halve it; an improvement smaller than a
        // thousandth of the best counts as a miss.
        check(&[5.0, 4.0, 6.0, 6.0, 6.0, 6.0], 4, 0.4);
        check(&[5.0, 4.0, 6.0, 6.0, 3.999_9, 6.0], 4, 0.4);
        check(&[5.0, 4.0, 6.0, 6.0, 6.0, 6.0], 6, 0.8);
        // Seven halvings take it below 2⁻⁷, where it starts again.
        let mut long = vec![5.0, 4.0];
        long.extend(std::iter::repeat_n(9.0, 4 * 6));
        check(&long, 4, 0.8 / 64.0);
        long.extend(std::iter::repeat_n(9.0, 4));
        check(&long, 4, 0.8);
    }

    fn uniform_space(dims: usize) -> SearchSpace {
        let mut builder = SearchSpace::builder();
        for idx in 0..dims {
            builder = builder.uniform(format!("x{idx}"), -1.0, 1.0);
        }
        builder.build().unwrap()
    }

    #[test]
    fn box_candidates_stay_in_the_cube_and_in_their_box() {
        for dims in [3, 40] {
            let mut searcher = GpSearcher::new(
                uniform_space(dims),
                7,
                Acquisition::Ei,
                GpOptions::default(),
            );
            let centre: Vec<f64> = (0..dims).map(|idx| [0.02, 0.5, 0.97][idx % 3]).collect();
            let mut theta: Vec<f64> = (0..dims).map(|idx| [-2.0, 0.0, 5.0][idx % 3]).collect();
            theta.extend([0.0, -6.9]);
            let weights = searcher.box_weights(&theta);
            assert!(weights.iter().all(|w| (1.0 / 16.0..=16.0).contains(w)));
            assert!(weights[0] < weights[1] && weights[1] < weights[2]);
            let mut moved_counts = Vec::new();
            for length in [1.6, 0.3, 0.01] {
                for draw_idx in 0..200 {
                    let draw: Vec<f64> = sobol_point(draw_idx, dims, 11);
                    let point = searcher.in_box(&centre, &weights, length, &draw);
                    let mut moved = 0;
                    for idx in 0..dims {
                        assert!((0.0..=1.0).contains(&point[idx]), "{point:?}");
                        let reach = 0.5 * length * weights[idx] + 1e-12;
                        assert!((point[idx] - centre[idx]).abs() <= reach, "{point:?}");
                        moved += usize::from(point[idx] != centre[idx]);
                    }
                    moved_counts.push(moved);
                }
            }
            let mean_moved = moved_counts.iter().sum::<usize>() as f64 / moved_counts.len() as f64;
            if dims == 40 {
                // About 20 of 40 coordinates move, never none.
                assert!(moved_counts.iter().all(|moved| *moved >= 1));
                assert!((15.0..25.0).contains(&mean_moved), "{mean_moved}");
            } else {
                assert!(mean_moved > 2.9, "{mean_moved}");
            }
        }
    }

    #[test]
    fn polishing_raises_the_acquisition_and_stays_in_the_cube() {
        let space = SearchSpace::builder()
            .uniform("a", 0.0, 1.0)
            .uniform("b", 0.0, 1.0)
            .choice("c", ["x", "y"])
            .build()
            .unwrap();
        let options = GpOptions {
            polish_iterations: 30,
            ..GpOptions::default()
        };
        let mut searcher = GpSearcher::new(space, 3, Acquisition::Ei, options);
        for _ in 0..15 {
            let suggestion = searcher.ask().unwrap();
            let value = |name: &str| match suggestion.config.get(name) {
                Some(ParamValue::Float(value)) => *value,
                _ => 0.0,
            };
            let objective = (value("a") - 0.3).powi(2) + (value("b") - 0.7).powi(2);
            searcher.tell(suggestion.id, objective);
        }
        let width = searcher.features.width();
        let mut x = Vec::new();
        let mut y = Vec::new();
        for observation in searcher.history.observed() {
            searcher
                .features
                .push_config(&searcher.space, &observation.config, &mut x);
            y.push(observation.objective);
        }
        let y = standardise(&y);
        let best = y.iter().copied().fold(f64::INFINITY, f64::min);
        let layout = searcher.layout();
        let theta = layout.prior_mean();
        let posterior = Posterior::new(x, &y, layout, &theta);
        let continuous = searcher.continuous_params();
        assert_eq!(continuous.len(), 2, "the choice is not polished");
        let score = |point: &[f64]| {
            let mut row = Vec::with_capacity(width);
            searcher
                .features
                .push_unit(&searcher.space, point, &mut row);
            let (mean, sd) = posterior.predict(&row);
            gp_acq::value(Acquisition::Ei, best, mean[0], sd[0])
        };
        for start in [[0.9, 0.1, 0.2], [0.5, 0.5, 0.8], [0.05, 0.95, 0.5]] {
            let polished = searcher.polish(&posterior, best, &continuous, start.to_vec());
            assert!(polished.iter().all(|unit| (0.0..=1.0).contains(unit)));
            assert_eq!(polished[2], start[2], "the choice stays where it was");
            assert!(
                score(&polished) >= score(&start),
                "{start:?} scored {} became {polished:?} scoring {}",
                score(&start),
                score(&polished)
            );
        }
    }
}
