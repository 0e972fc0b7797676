//! Search: from a search space to configurations, by one ask/tell interface.
//!
//! Pure and deterministic for a given seed: no I/O, no clock, no global RNG.
//! [`plan_trials`] expands grid, random and Sobol searches up front; [`Searcher`] is
//! the ask/tell interface the sweep logic and `xp tune` drive for every algorithm.
//!
//! [`SearchSpace`] (declared in `xp_runtime::spec`) is the checked, typed space
//! every algorithm works on;
//! [`make_searcher`] builds the searcher of a [`SearchAlgorithm`]: [`GridSearcher`],
//! [`RandomSearcher`], [`SobolSearcher`], [`GpSearcher`] (Bayesian optimisation with
//! a Gaussian process) or [`TpeSearcher`] (tree-structured Parzen estimator, one
//! parameter at a time or jointly). [`MotpeSearcher`] is multi-objective TPE, and
//! [`pareto`] holds the Pareto-front and hypervolume functions it and the reports use.
//! The adaptive searchers ignore a `tell` or `forget` of an id that is not pending
//! (unknown, already told or forgotten), and treat a non-finite objective as a
//! failure that yields no observation.
//! Invariant: a searcher's suggestions depend only on its seed, its options and the
//! sequence of `ask`, `tell` and `forget` calls.

use rand::Rng;
use xp_runtime::spec::{AcquisitionKind, Algorithm, Config, SearchSpace, SearchSpec};

use crate::hyperband::HyperbandSchedule;

mod bohb;
pub mod front;
mod gp;
mod gp_acq;
mod gp_model;
mod grid;
mod history;
mod motpe;
pub mod pareto;
mod plan;
mod random;
mod sobol;
mod tpe;
mod tpe_joint;

pub use bohb::{BohbOptions, BohbSearcher};
pub use gp::{GpOptions, GpSearcher};
pub use grid::GridSearcher;
pub use motpe::{MotpeSearcher, MultiObservation};
pub use plan::{TrialPlan, plan_trials};
pub use random::RandomSearcher;
pub use sobol::SobolSearcher;
pub use tpe::{TpeOptions, TpeSearcher};

/// A configuration handed out by [`Searcher::ask`], with the id to report back under.
#[derive(Debug, Clone, PartialEq)]
pub struct Suggestion {
    /// Identifies the suggestion in `tell` and `forget`; unique per searcher.
    pub id: u64,
    /// The configuration to evaluate.
    pub config: Config,
}

/// The ask/tell interface of every search algorithm.
///
/// Objectives are minimised; callers negate them for `mode: max`. A searcher may
/// be asked again before earlier suggestions are told (parallel evaluation); the
/// model-based ones then propose distinct points (the GP a kriging believer).
pub trait Searcher: Send {
    /// The next configuration to evaluate, or `None` when the algorithm has no more
    /// (a finished grid).
    fn ask(&mut self) -> Option<Suggestion>;
    /// The objective value (to minimise) of suggestion `id`.
    fn tell(&mut self, id: u64, objective: f64);
    /// Suggestion `id` failed or was abandoned: it yields no observation.
    fn forget(&mut self, id: u64);
    /// The objective values (each to minimise) of suggestion `id` in a
    /// multi-objective search. A single-objective searcher takes one value and
    /// treats any other number as a failure; [`MotpeSearcher`] takes its count.
    fn tell_objectives(&mut self, id: u64, objectives: &[f64]) {
        match objectives {
            [objective] => self.tell(id, *objective),
            _ => self.forget(id),
        }
    }
    /// Suggestion `id`, still pending, reached `step` (a budget such as an epoch)
    /// with `objective` (to minimise): an intermediate result. Multi-fidelity
    /// searchers ([`BohbSearcher`]) learn from these; the others ignore them.
    /// Returns whether the searcher recorded it, so that a caller logging the
    /// calls to replay them need keep only those.
    fn observe(&mut self, _id: u64, _step: u64, _objective: f64) -> bool {
        false
    }
    /// How suggestion `id` was chosen (at random, or by which model), for its
    /// trial's event log; `None` when the searcher has nothing to say.
    fn provenance(&self, _id: u64) -> Option<String> {
        None
    }
}

/// The exploration weight of [`Acquisition::Ucb`] unless one is given.
pub const DEFAULT_KAPPA: f64 = 2.0;

/// How Gaussian-process search scores a candidate, on the minimised objective.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Acquisition {
    /// Lower confidence bound: the candidate with the smallest mean − kappa·sd wins.
    /// A larger `kappa` explores more.
    Ucb {
        /// The weight of the posterior standard deviation.
        kappa: f64,
    },
    /// Expected improvement below the best value observed.
    Ei,
}

/// Log expected improvement: on the benchmark suite it beat UCB in every
/// dimension at both budgets but one (README).
impl Default for Acquisition {
    fn default() -> Self {
        Self::Ei
    }
}

/// A search algorithm with the choices that change what it proposes.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum SearchAlgorithm {
    /// Every combination of the discrete parameters; finite.
    Grid,
    /// Independent draws from each parameter's prior.
    Random,
    /// Owen-scrambled Sobol points: random search that covers the space evenly.
    Sobol,
    /// Bayesian optimisation with a Gaussian process.
    Gp {
        /// How candidates are scored.
        acquisition: Acquisition,
    },
    /// The tree-structured Parzen estimator, one parameter at a time.
    Tpe,
    /// The tree-structured Parzen estimator modelling parameters jointly (product
    /// kernels, grouped where parameters are conditional): `tpe: {multivariate: true}`.
    MultivariateTpe,
    /// Multi-objective TPE ([`MotpeSearcher`]): `algorithm: tpe` with several
    /// metrics; told through [`Searcher::tell_objectives`].
    MultiObjectiveTpe {
        /// How many objectives (2 to [`pareto::MAX_OBJECTIVES`]).
        objectives: usize,
    },
    /// BOHB's sampler: Parzen estimators on the largest budget of `schedule` with
    /// enough results (`algorithm: bohb`, with the stopping rule
    /// [`crate::stopping::make_bohb_rule`] of the same schedule).
    Bohb {
        /// The budgets at which results are kept.
        schedule: HyperbandSchedule,
    },
}

impl SearchAlgorithm {
    /// The algorithm a validated spec's `search` section asks for.
    pub fn from_spec(search: &SearchSpec) -> Self {
        match search.algorithm {
            Algorithm::Grid => Self::Grid,
            Algorithm::Random => Self::Random,
            Algorithm::Sobol => Self::Sobol,
            Algorithm::Gp => Self::Gp {
                // A `kappa` alone asks for UCB; neither asks for the default, EI.
                acquisition: match (search.acquisition, search.kappa) {
                    (Some(AcquisitionKind::Ei), _) | (None, None) => Acquisition::Ei,
                    (Some(AcquisitionKind::Ucb), kappa) | (None, kappa @ Some(_)) => {
                        Acquisition::Ucb {
                            kappa: kappa.unwrap_or(DEFAULT_KAPPA),
                        }
                    }
                },
            },
            Algorithm::Tpe if search.is_multi_objective() => Self::MultiObjectiveTpe {
                objectives: search.objectives().len(),
            },
            Algorithm::Tpe if search.tpe.is_some_and(|tpe| tpe.multivariate) => {
                Self::MultivariateTpe
            }
            Algorithm::Tpe => Self::Tpe,
            // The `bohb` section's budgets; without one, an ASHA or Hyperband
            // `early_stopping`'s rungs, else the defaults. A validated spec's
            // schedule is valid; an unvalidated one falls back to the default
            // budgets rather than panicking.
            Algorithm::Bohb => Self::Bohb {
                schedule: match (&search.bohb, &search.early_stopping) {
                    (Some(bohb), _) => HyperbandSchedule::from_spec(bohb).unwrap_or_default(),
                    (None, Some(rule)) if rule.rule != xp_runtime::spec::RuleKind::Median => {
                        HyperbandSchedule::new(rule.grace_period, rule.max_t, rule.reduction_factor)
                            .unwrap_or_default()
                    }
                    (None, _) => HyperbandSchedule::default(),
                },
            },
        }
    }
}

/// Tuning of the model-based searchers; the defaults suit most searches.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct SearchOptions {
    /// Options of [`GpSearcher`].
    pub gp: GpOptions,
    /// Options of [`TpeSearcher`].
    pub tpe: TpeOptions,
    /// Options of [`BohbSearcher`].
    pub bohb: BohbOptions,
}

/// The searcher of `algorithm` over `space`, seeded by `seed`, with default options.
///
/// A grid over a space with real-valued parameters draws those at random for each
/// grid point (as Ray Tune does); spec validation refuses such grids in YAML.
pub fn make_searcher(
    algorithm: SearchAlgorithm,
    space: &SearchSpace,
    seed: u64,
) -> Box<dyn Searcher> {
    make_searcher_with(algorithm, space, seed, &SearchOptions::default())
}

/// [`make_searcher`] with explicit options for the model-based searchers.
pub fn make_searcher_with(
    algorithm: SearchAlgorithm,
    space: &SearchSpace,
    seed: u64,
    options: &SearchOptions,
) -> Box<dyn Searcher> {
    match algorithm {
        SearchAlgorithm::Grid => Box::new(GridSearcher::new(space, seed)),
        SearchAlgorithm::Random => Box::new(RandomSearcher::new(space.clone(), seed)),
        SearchAlgorithm::Sobol => Box::new(SobolSearcher::new(space.clone(), seed)),
        SearchAlgorithm::Gp { acquisition } => Box::new(GpSearcher::new(
            space.clone(),
            seed,
            acquisition,
            options.gp.clone(),
        )),
        SearchAlgorithm::Tpe => {
            Box::new(TpeSearcher::new(space.clone(), seed, options.tpe.clone()))
        }
        SearchAlgorithm::Bohb { schedule } => Box::new(BohbSearcher::new(
            space.clone(),
            schedule,
            seed,
            options.bohb.clone(),
        )),
        SearchAlgorithm::MultiObjectiveTpe { objectives } => Box::new(
            MotpeSearcher::new(
                space.clone(),
                seed,
                objectives.clamp(1, pareto::MAX_OBJECTIVES),
                options.tpe.clone(),
            )
            .expect("the objective count is clamped to what MOTPE takes"),
        ),
        SearchAlgorithm::MultivariateTpe => Box::new(TpeSearcher::new(
            space.clone(),
            seed,
            TpeOptions {
                multivariate: true,
                ..options.tpe.clone()
            },
        )),
    }
}

/// A standard normal draw (Box–Muller), so Gaussian steps need no extra dependency.
pub(crate) fn standard_normal<R: Rng + ?Sized>(rng: &mut R) -> f64 {
    let radius_draw = 1.0 - rng.random::<f64>();
    let angle_draw = rng.random::<f64>();
    (-2.0 * radius_draw.ln()).sqrt() * (std::f64::consts::TAU * angle_draw).cos()
}

#[cfg(test)]
mod tests;
