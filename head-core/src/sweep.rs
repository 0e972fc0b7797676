//! Adaptive sweeps: experiments whose configurations come from a model-based
//! searcher (`gp`, `tpe`, `bohb`) one suggestion at a time, instead of being
//! planned up front as grid, random and Sobol searches are.
//!
//! Searchers are not serialisable, so the head persists what it did to one (the
//! sweep log: asks, tells, forgets, and the intermediate results a multi-fidelity
//! searcher recorded) and rebuilds it after a restart by replaying the log;
//! searchers are deterministic for a seed, so the replay reproduces it.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use xp_runtime::spec::SearchSpec;
use xp_runtime::spec::{SearchSpace, SpaceError};
use xp_tune::search::{SearchAlgorithm, Searcher, Suggestion, make_searcher};

/// How many configurations an adaptive sweep evaluates at once when `parallel` is
/// not given: enough to use a few slots, few enough that the model learns.
pub(crate) const DEFAULT_ADAPTIVE_PARALLEL: u32 = 4;

/// Why an adaptive sweep cannot be built.
#[derive(Debug, thiserror::Error)]
pub enum SweepError {
    /// The search space does not make a searcher's space.
    #[error(transparent)]
    Space(#[from] SpaceError),
}

/// A replayed ask that did not return the suggestion the log recorded: another
/// searcher version proposes differently. The recorded trials stand.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Divergence {
    /// The suggestion the log recorded.
    pub recorded: u64,
    /// What the replayed ask returned, if anything.
    pub replayed: Option<u64>,
}

impl std::fmt::Display for Divergence {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "replayed ask returned {:?} where suggestion {} was recorded",
            self.replayed, self.recorded
        )
    }
}

/// One thing the head did to a searcher, in order.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum SweepOp {
    /// `ask` returned `suggestion`, run as trials `first_trial..first_trial + replicates`.
    Asked {
        /// The searcher's suggestion id.
        suggestion: u64,
        /// The first replicate's trial index.
        first_trial: u32,
        /// How many replicates (seeds).
        replicates: u32,
    },
    /// `tell(suggestion, objective)`, the objective minimised.
    Told {
        /// The suggestion.
        suggestion: u64,
        /// Its objective (negated for `mode: max`).
        objective: f64,
    },
    /// `forget(suggestion)`: no replicate produced the metric.
    Forgot {
        /// The suggestion.
        suggestion: u64,
    },
    /// `tell_objectives(suggestion, objectives)` of a multi-objective search,
    /// each objective minimised.
    ToldObjectives {
        /// The suggestion.
        suggestion: u64,
        /// Its objectives in declared order (each negated for `mode: max`).
        objectives: Vec<f64>,
    },
    /// `observe(suggestion, step, objective)` that the searcher recorded: an
    /// intermediate result at a budget (`algorithm: bohb`).
    Observed {
        /// The suggestion.
        suggestion: u64,
        /// The step of the report.
        step: u64,
        /// Its objective (negated for `mode: max`); always finite.
        objective: f64,
    },
}

/// The live state of one adaptive sweep.
pub(crate) struct Sweep {
    searcher: Box<dyn Searcher>,
    /// Configurations to evaluate in all.
    budget: u32,
    /// Configurations asked so far.
    asked: u32,
    /// Suggestions not yet told or forgotten, with their replicates' trial indices.
    open: BTreeMap<u64, Vec<u32>>,
    /// Trial index to its suggestion.
    suggestion_of: BTreeMap<u32, u64>,
}

impl std::fmt::Debug for Sweep {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Sweep")
            .field("budget", &self.budget)
            .field("asked", &self.asked)
            .field("open", &self.open)
            .finish()
    }
}

impl Sweep {
    /// Whether `search` is driven by ask/tell rather than planned up front.
    pub(crate) fn is_adaptive(search: &SearchSpec) -> bool {
        search.algorithm.is_adaptive()
    }

    /// A fresh sweep for a validated `search`.
    pub(crate) fn new(search: &SearchSpec) -> Result<Self, SweepError> {
        let space = SearchSpace::from_spec(&search.space)?;
        Ok(Self {
            searcher: make_searcher(SearchAlgorithm::from_spec(search), &space, search.seed),
            budget: search.trials.unwrap_or(1),
            asked: 0,
            open: BTreeMap::new(),
            suggestion_of: BTreeMap::new(),
        })
    }

    /// Rebuilds a sweep by replaying its log. A divergence (another searcher
    /// version proposing differently) is reported, and the recorded trials stand.
    pub(crate) fn replay(
        search: &SearchSpec,
        log: &[SweepOp],
    ) -> Result<(Self, Vec<Divergence>), SweepError> {
        let mut sweep = Self::new(search)?;
        let mut divergences = Vec::new();
        for op in log {
            match op {
                SweepOp::Asked {
                    suggestion,
                    first_trial,
                    replicates,
                } => {
                    match sweep.searcher.ask() {
                        Some(asked) if asked.id == *suggestion => {}
                        other => divergences.push(Divergence {
                            recorded: *suggestion,
                            replayed: other.map(|asked| asked.id),
                        }),
                    }
                    sweep.record_ask(*suggestion, *first_trial, *replicates);
                }
                SweepOp::Told {
                    suggestion,
                    objective,
                } => {
                    sweep.searcher.tell(*suggestion, *objective);
                    sweep.open.remove(suggestion);
                }
                SweepOp::Forgot { suggestion } => {
                    sweep.searcher.forget(*suggestion);
                    sweep.open.remove(suggestion);
                }
                SweepOp::ToldObjectives {
                    suggestion,
                    objectives,
                } => {
                    sweep.searcher.tell_objectives(*suggestion, objectives);
                    sweep.open.remove(suggestion);
                }
                SweepOp::Observed {
                    suggestion,
                    step,
                    objective,
                } => {
                    sweep.searcher.observe(*suggestion, *step, *objective);
                }
            }
        }
        Ok((sweep, divergences))
    }

    fn record_ask(&mut self, suggestion: u64, first_trial: u32, replicates: u32) {
        let trials: Vec<u32> = (first_trial..first_trial + replicates).collect();
        for trial in &trials {
            self.suggestion_of.insert(*trial, suggestion);
        }
        self.open.insert(suggestion, trials);
        self.asked += 1;
    }

    /// The next configuration, if the budget and `limit` configurations in flight allow.
    pub(crate) fn ask(
        &mut self,
        first_trial: u32,
        replicates: u32,
        limit: u32,
    ) -> Option<(Suggestion, SweepOp)> {
        if self.asked >= self.budget || self.open.len() >= limit as usize {
            return None;
        }
        let suggestion = self.searcher.ask()?;
        self.record_ask(suggestion.id, first_trial, replicates);
        let op = SweepOp::Asked {
            suggestion: suggestion.id,
            first_trial,
            replicates,
        };
        Some((suggestion, op))
    }

    /// The suggestion trial `index` belongs to, with all its replicates, if it is still open.
    pub(crate) fn open_suggestion_of(&self, index: u32) -> Option<(u64, &[u32])> {
        let suggestion = *self.suggestion_of.get(&index)?;
        self.open
            .get(&suggestion)
            .map(|trials| (suggestion, trials.as_slice()))
    }

    /// Tells (or forgets, without objectives) an open suggestion of a
    /// multi-objective search.
    pub(crate) fn settle_objectives(
        &mut self,
        suggestion: u64,
        objectives: Option<Vec<f64>>,
    ) -> SweepOp {
        self.open.remove(&suggestion);
        match objectives {
            Some(objectives) => {
                self.searcher.tell_objectives(suggestion, &objectives);
                SweepOp::ToldObjectives {
                    suggestion,
                    objectives,
                }
            }
            None => {
                self.searcher.forget(suggestion);
                SweepOp::Forgot { suggestion }
            }
        }
    }

    /// Hands an intermediate result of trial `index` to its open suggestion's
    /// searcher; the log entry to persist when the searcher recorded it. Non-finite
    /// objectives are not handed on: the log is JSON, which has no NaN.
    pub(crate) fn observe(&mut self, index: u32, step: u64, objective: f64) -> Option<SweepOp> {
        if !objective.is_finite() {
            return None;
        }
        let suggestion = *self.suggestion_of.get(&index)?;
        if !self.open.contains_key(&suggestion) {
            return None;
        }
        self.searcher
            .observe(suggestion, step, objective)
            .then_some(SweepOp::Observed {
                suggestion,
                step,
                objective,
            })
    }

    /// How the searcher chose `suggestion`, for its trials' event logs.
    pub(crate) fn provenance(&self, suggestion: u64) -> Option<String> {
        self.searcher.provenance(suggestion)
    }

    /// Tells (or forgets, without an objective) an open suggestion.
    pub(crate) fn settle(&mut self, suggestion: u64, objective: Option<f64>) -> SweepOp {
        self.open.remove(&suggestion);
        match objective {
            Some(objective) => {
                self.searcher.tell(suggestion, objective);
                SweepOp::Told {
                    suggestion,
                    objective,
                }
            }
            None => {
                self.searcher.forget(suggestion);
                SweepOp::Forgot { suggestion }
            }
        }
    }
}
