//! Search: from a search space to configurations, by one ask/tell interface.
//!
//! Pure and deterministic for a given seed: no I/O, no clock, no global RNG.
//! [`plan_trials`] expands grid and random searches up front; [`Searcher`] is the
//! ask/tell interface the sweep logic and `xp tune` drive for every algorithm.

use std::collections::BTreeMap;

use crate::spec::ParamValue;

mod plan;

pub use plan::{TrialPlan, plan_trials};

/// One configuration: parameter name to value (inactive conditional parameters absent).
pub type Config = BTreeMap<String, ParamValue>;

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
/// model-based ones then propose distinct points (constant liar).
pub trait Searcher: Send {
    /// The next configuration to evaluate, or `None` when the algorithm has no more
    /// (a finished grid).
    fn ask(&mut self) -> Option<Suggestion>;
    /// The objective value (to minimise) of suggestion `id`.
    fn tell(&mut self, id: u64, objective: f64);
    /// Suggestion `id` failed or was abandoned: it yields no observation.
    fn forget(&mut self, id: u64);
}
