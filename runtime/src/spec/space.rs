//! The search space as the algorithms see it: typed parameters in dependency order.
//!
//! [`SearchSpace`] is built from the declared [`SpaceSpec`] (or with
//! [`SearchSpace::builder`]) and checked once: bounds, steps, log scales, and
//! conditions that name known discrete parents without cycles. It samples
//! configurations, maps each parameter to and from the unit interval (log-aware,
//! integers rounded to their step), enumerates grids and says which conditional
//! parameters are active. It draws randomness only from the RNG it is handed.
//!
//! Invariant: `params` is ordered so that every parent comes before its children,
//! ties broken by name; for a space without conditions this is name order, the order
//! grid and random search have always used.

use std::collections::BTreeMap;

use rand::Rng;

use super::{Domain, ParamSpec, ParamValue, SpaceSpec};

/// One configuration: parameter name to value (inactive conditional parameters absent).
pub type Config = BTreeMap<String, ParamValue>;

/// The widest integer range accepted, so that every value has an exact `f64` image.
const MAX_INT_WIDTH: i128 = 1 << 53;

/// The most assignments of parent parameters [`SearchSpace::grid_len`] enumerates
/// before it gives up counting.
const MAX_PARENT_ASSIGNMENTS: usize = 1 << 20;

/// Why one parameter of a search space was refused, or cannot be used as asked.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("invalid search space parameter `{param}`")]
pub struct SpaceError {
    /// The parameter at fault.
    pub param: String,
    /// What is wrong with it.
    #[source]
    pub reason: ParamError,
}

/// What is wrong with one parameter; [`SpaceError`] names the parameter.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ParamError {
    /// A `uniform` domain with bounds that are not finite and increasing.
    #[error("uniform needs finite bounds [LO, HI] with LO < HI")]
    UniformBounds,
    /// A `loguniform` domain with bounds that are not finite, positive and increasing.
    #[error("loguniform needs finite bounds [LO, HI] with 0 < LO < HI")]
    LoguniformBounds,
    /// An `int` domain whose bounds are reversed.
    #[error("int needs bounds [LO, HI] with LO <= HI")]
    IntBounds,
    /// An `int` domain too wide for every value to have an exact real image.
    #[error("int range is wider than 2^53")]
    IntTooWide,
    /// A `choice` without values.
    #[error("choice needs at least one value")]
    EmptyChoice,
    /// A `choice` with an infinite or NaN value.
    #[error("choice values must be finite")]
    NonFiniteChoice,
    /// A step of zero or less.
    #[error("step must be at least 1, not {step}")]
    StepNotPositive {
        /// The step given.
        step: i64,
    },
    /// A step on a parameter that is not an integer.
    #[error("step applies to int parameters only")]
    StepNotInt,
    /// A log scale on a parameter that is not an integer.
    #[error("log applies to int parameters only (reals use loguniform)")]
    LogNotInt,
    /// A log scale on a range that includes values at or below zero.
    #[error("a log scale needs bounds above 0")]
    LogNotPositive,
    /// A log scale together with a step other than 1.
    #[error("a log scale and a step other than 1 exclude each other")]
    LogWithStep,
    /// A condition on a parameter that does not exist.
    #[error("condition names unknown parameter `{parent}`")]
    UnknownParent {
        /// The parent named.
        parent: String,
    },
    /// A condition on a real-valued parameter, which never takes a listed value.
    #[error("condition parent `{parent}` must be an int or choice parameter")]
    ParentNotDiscrete {
        /// The parent named.
        parent: String,
    },
    /// A condition that lists no values, so the parameter could never be present.
    #[error("condition on `{parent}` lists no values")]
    EmptyCondition {
        /// The parent named.
        parent: String,
    },
    /// A condition value the parent can never take.
    #[error("condition value {value} is not a value of `{parent}`")]
    ValueOutsideParent {
        /// The parent named.
        parent: String,
        /// The value it cannot take.
        value: ParamValue,
    },
    /// Conditions that lead from the parameter back to itself.
    #[error("conditions form a cycle through this parameter")]
    ConditionCycle,
    /// A real-valued parameter where only a finite grid is possible.
    #[error("grid search needs discrete domains (int or choice)")]
    Continuous,
    /// The same name declared twice in a builder.
    #[error("is declared twice")]
    Duplicate,
}

fn space_error(param: &str, reason: ParamError) -> SpaceError {
    SpaceError {
        param: param.to_owned(),
        reason,
    }
}

/// The values one parameter takes, resolved and checked.
#[derive(Debug, Clone, PartialEq)]
pub enum ParamKind {
    /// A real number in `[lo, hi]`, uniform on a linear or (when `log`) logarithmic scale.
    Float {
        /// The smallest value.
        lo: f64,
        /// The largest value.
        hi: f64,
        /// Whether the logarithm is uniform (`loguniform`).
        log: bool,
    },
    /// An integer `lo, lo + step, ...` up to `hi`, on a linear or logarithmic scale.
    Int {
        /// The smallest value.
        lo: i64,
        /// The bound no value exceeds (the largest value when `hi - lo` is a multiple of `step`).
        hi: i64,
        /// The spacing of the values; 1 unless declared, and 1 whenever `log` is set.
        step: i64,
        /// Whether the values are spread on a logarithmic scale.
        log: bool,
    },
    /// One of the listed values.
    Choice {
        /// The values, in declared order.
        values: Vec<ParamValue>,
    },
}

/// A condition: the parameter is present only when `parent` takes one of `values`.
#[derive(Debug, Clone, PartialEq)]
pub struct Condition {
    parent: usize,
    values: Vec<ParamValue>,
    /// The parent's levels (see [`Param::level_of_value`]) listed by `values`, sorted.
    levels: Vec<i64>,
}

impl Condition {
    /// The parent's index in [`SearchSpace::params`]; always before the child's.
    pub fn parent(&self) -> usize {
        self.parent
    }

    /// The parent values under which the child is present.
    pub fn values(&self) -> &[ParamValue] {
        &self.values
    }
}

/// One parameter of a [`SearchSpace`].
#[derive(Debug, Clone, PartialEq)]
pub struct Param {
    name: String,
    kind: ParamKind,
    conditions: Vec<Condition>,
}

impl Param {
    /// The parameter's name, the key in every [`Config`].
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The values it takes.
    pub fn kind(&self) -> &ParamKind {
        &self.kind
    }

    /// The conditions that must all hold for it to be present; empty when it always is.
    pub fn conditions(&self) -> &[Condition] {
        &self.conditions
    }

    /// Whether the parameter is absent from some configurations.
    pub fn is_conditional(&self) -> bool {
        !self.conditions.is_empty()
    }

    /// Whether the parameter is real-valued, so it has no finite grid.
    pub fn is_continuous(&self) -> bool {
        matches!(self.kind, ParamKind::Float { .. })
    }

    /// How many distinct values a discrete parameter takes; `None` for a real one.
    pub fn cardinality(&self) -> Option<u64> {
        match &self.kind {
            ParamKind::Float { .. } => None,
            ParamKind::Int { .. } => Some(self.int_levels().expect("int") as u64),
            ParamKind::Choice { values } => Some(values.len() as u64),
        }
    }

    /// Whether `value` is one this parameter can take.
    pub fn contains(&self, value: &ParamValue) -> bool {
        match (&self.kind, value) {
            (ParamKind::Float { lo, hi, .. }, ParamValue::Float(x)) => (*lo..=*hi).contains(x),
            (ParamKind::Int { lo, hi, step, .. }, ParamValue::Int(x)) => {
                (*lo..=*hi).contains(x)
                    && (i128::from(*x) - i128::from(*lo)) % i128::from(*step) == 0
            }
            (ParamKind::Choice { values }, value) => values.contains(value),
            _ => false,
        }
    }

    /// The value's position in `[0, 1]`: linear or logarithmic for reals; for
    /// integers and choices a point inside the value's cell (its centre on a linear
    /// scale, its logarithm's position on a log scale). `None` when the value has
    /// the wrong type for the parameter or is not one of its choices.
    ///
    /// [`Param::from_unit`] inverts it for every value the parameter can take.
    pub fn to_unit(&self, value: &ParamValue) -> Option<f64> {
        let unit = match (&self.kind, value) {
            (ParamKind::Float { lo, hi, log }, value) => {
                let x = match value {
                    ParamValue::Float(x) => *x,
                    ParamValue::Int(x) => *x as f64,
                    ParamValue::Bool(_) | ParamValue::Str(_) => return None,
                };
                if *log {
                    (x.ln() - lo.ln()) / (hi.ln() - lo.ln())
                } else {
                    (x - lo) / (hi - lo)
                }
            }
            (ParamKind::Int { lo, step, log, .. }, ParamValue::Int(x)) => {
                if *log {
                    let (a, b) = self.int_log_range();
                    ((*x as f64).ln() - a) / (b - a)
                } else {
                    let levels = self.int_levels().expect("int") as f64;
                    let level = ((*x as f64 - *lo as f64) / *step as f64)
                        .round()
                        .clamp(0.0, levels - 1.0);
                    (level + 0.5) / levels
                }
            }
            (ParamKind::Choice { values }, value) => {
                let index = values.iter().position(|candidate| candidate == value)?;
                (index as f64 + 0.5) / values.len() as f64
            }
            _ => return None,
        };
        Some(unit.clamp(0.0, 1.0))
    }

    /// The value at position `unit` of `[0, 1]` (clamped): the inverse of
    /// [`Param::to_unit`], rounding integers to their step and picking the choice
    /// whose cell holds `unit`.
    pub fn from_unit(&self, unit: f64) -> ParamValue {
        let unit = if unit.is_nan() {
            0.5
        } else {
            unit.clamp(0.0, 1.0)
        };
        match &self.kind {
            ParamKind::Float { lo, hi, log } => {
                let value = if unit == 0.0 {
                    *lo
                } else if unit == 1.0 {
                    *hi
                } else if *log {
                    (lo.ln() + unit * (hi.ln() - lo.ln())).exp()
                } else {
                    lo + unit * (hi - lo)
                };
                ParamValue::Float(value.clamp(*lo, *hi))
            }
            ParamKind::Int { .. } => ParamValue::Int(self.level_of_unit(unit)),
            ParamKind::Choice { values } => values[self.choice_index(unit)].clone(),
        }
    }

    /// `unit` moved to where its value sits: unchanged for reals, the canonical
    /// position of the integer or choice cell it falls in otherwise.
    pub fn snap_unit(&self, unit: f64) -> f64 {
        match &self.kind {
            ParamKind::Float { .. } => unit.clamp(0.0, 1.0),
            ParamKind::Int { .. } | ParamKind::Choice { .. } => self
                .to_unit(&self.from_unit(unit))
                .expect("from_unit returns a value of the parameter"),
        }
    }

    /// A value drawn from the parameter's prior: uniform on its scale.
    ///
    /// Unconditional `uniform`, `loguniform`, `int` and `choice` parameters draw
    /// exactly as the first planner did, so seeded random searches keep their trials.
    pub fn sample<R: Rng + ?Sized>(&self, rng: &mut R) -> ParamValue {
        match &self.kind {
            ParamKind::Float { lo, hi, log: false } => {
                ParamValue::Float(rng.random_range(*lo..=*hi))
            }
            ParamKind::Float { lo, hi, log: true } => {
                ParamValue::Float(rng.random_range(lo.ln()..=hi.ln()).exp().clamp(*lo, *hi))
            }
            ParamKind::Int {
                lo,
                hi,
                step: 1,
                log: false,
            } => ParamValue::Int(rng.random_range(*lo..=*hi)),
            ParamKind::Int {
                lo,
                step,
                log: false,
                ..
            } => {
                let last = self.int_levels().expect("int") - 1;
                ParamValue::Int(lo + step * rng.random_range(0..=last))
            }
            ParamKind::Int { log: true, .. } => self.from_unit(rng.random_range(0.0..1.0)),
            ParamKind::Choice { values } => values[rng.random_range(0..values.len())].clone(),
        }
    }

    /// Every value, in increasing order (declared order for choices); `None` for reals.
    pub fn grid_values(&self) -> Option<Vec<ParamValue>> {
        match &self.kind {
            ParamKind::Float { .. } => None,
            ParamKind::Int { lo, step, .. } => Some(
                (0..self.int_levels().expect("int"))
                    .map(|level| ParamValue::Int(lo + step * level))
                    .collect(),
            ),
            ParamKind::Choice { values } => Some(values.clone()),
        }
    }

    /// The discrete level of a value: the integer itself, or the index of the first
    /// equal choice. Conditions compare levels.
    pub fn level_of_value(&self, value: &ParamValue) -> Option<i64> {
        match (&self.kind, value) {
            (ParamKind::Int { .. }, ParamValue::Int(x)) => Some(*x),
            (ParamKind::Choice { values }, value) => values
                .iter()
                .position(|candidate| candidate == value)
                .map(|index| index as i64),
            _ => None,
        }
    }

    /// The discrete level at position `unit`, as [`Param::level_of_value`] of
    /// [`Param::from_unit`] would give, without building the value. Reals have none;
    /// they answer 0.
    pub fn level_of_unit(&self, unit: f64) -> i64 {
        let unit = if unit.is_nan() {
            0.5
        } else {
            unit.clamp(0.0, 1.0)
        };
        match &self.kind {
            ParamKind::Float { .. } => 0,
            ParamKind::Int {
                lo,
                hi,
                step,
                log: false,
            } => {
                let levels = self.int_levels().expect("int");
                let level = ((unit * levels as f64).floor() as i64).clamp(0, levels - 1);
                (lo + step * level).min(*hi)
            }
            ParamKind::Int {
                lo, hi, log: true, ..
            } => {
                let (a, b) = self.int_log_range();
                ((a + unit * (b - a)).exp().round() as i64).clamp(*lo, *hi)
            }
            ParamKind::Choice { .. } => self.choice_index(unit) as i64,
        }
    }

    /// The interval of `[0, 1]` whose positions map to the integer or choice at
    /// `unit`; `(unit, unit)` for reals.
    pub fn unit_cell(&self, unit: f64) -> (f64, f64) {
        match &self.kind {
            ParamKind::Float { .. } => (unit, unit),
            ParamKind::Int { log: false, .. } => {
                let levels = self.int_levels().expect("int") as f64;
                let index = (unit.clamp(0.0, 1.0) * levels).floor().min(levels - 1.0);
                (index / levels, (index + 1.0) / levels)
            }
            ParamKind::Int { log: true, .. } => {
                let (a, b) = self.int_log_range();
                let value = self.level_of_unit(unit) as f64;
                let edge = |x: f64| ((x.ln() - a) / (b - a)).clamp(0.0, 1.0);
                (edge(value - 0.5), edge(value + 0.5))
            }
            ParamKind::Choice { values } => {
                let count = values.len() as f64;
                let index = self.choice_index(unit) as f64;
                (index / count, (index + 1.0) / count)
            }
        }
    }

    fn choice_index(&self, unit: f64) -> usize {
        let ParamKind::Choice { values } = &self.kind else {
            unreachable!("choice_index is only called on choices")
        };
        ((unit * values.len() as f64).floor().max(0.0) as usize).min(values.len() - 1)
    }

    /// The number of values of an integer parameter.
    fn int_levels(&self) -> Option<i64> {
        match self.kind {
            ParamKind::Int { lo, hi, step, .. } => Some((hi - lo) / step + 1),
            _ => None,
        }
    }

    /// The log-scale interval of a log integer parameter: each value owns the
    /// logarithms of `[value - 0.5, value + 0.5]`.
    fn int_log_range(&self) -> (f64, f64) {
        let ParamKind::Int { lo, hi, .. } = self.kind else {
            unreachable!("int_log_range is only called on integers")
        };
        ((lo as f64 - 0.5).ln(), (hi as f64 + 0.5).ln())
    }
}

/// A checked search space: parameters in dependency order with resolved conditions.
///
/// Build it from a spec with [`SearchSpace::from_spec`] or in code with
/// [`SearchSpace::builder`]. Every algorithm in `xp_tune::search` works on it.
#[derive(Debug, Clone, PartialEq)]
pub struct SearchSpace {
    params: Vec<Param>,
}

impl SearchSpace {
    /// Checks the declared space and orders it, parents before children.
    ///
    /// Refuses bad bounds, steps below 1, log scales on ranges reaching 0 or below,
    /// steps or log scales on non-integers, and conditions on unknown or real-valued
    /// parents, on values the parent never takes, or that form a cycle.
    pub fn from_spec(spec: &SpaceSpec) -> Result<Self, SpaceError> {
        // 1. Each parameter's domain.
        let mut kinds = BTreeMap::new();
        for (name, param) in spec.iter() {
            let kind = resolve_kind(param).map_err(|reason| space_error(name, reason))?;
            kinds.insert(name.as_str(), kind);
        }
        // 2. Each condition, against its parent's domain.
        for (name, param) in spec.iter() {
            for (parent, values) in &param.when {
                check_condition(name, parent, values, &kinds)?;
            }
        }
        // 3. Parents before children, each condition read as its parent's levels.
        let order = dependency_order(spec)?;
        let position: BTreeMap<&str, usize> = order
            .iter()
            .enumerate()
            .map(|(index, name)| (*name, index))
            .collect();
        let mut params: Vec<Param> = Vec::with_capacity(order.len());
        for name in &order {
            let conditions = spec[*name]
                .when
                .iter()
                .map(|(parent, values)| {
                    let parent_idx = position[parent.as_str()];
                    Condition {
                        parent: parent_idx,
                        values: values.clone(),
                        levels: levels_of(&params[parent_idx], values),
                    }
                })
                .collect();
            params.push(Param {
                name: (*name).to_owned(),
                kind: kinds[*name].clone(),
                conditions,
            });
        }
        Ok(Self { params })
    }

    /// A builder for spaces written in code; see [`SpaceBuilder`].
    pub fn builder() -> SpaceBuilder {
        SpaceBuilder::default()
    }

    /// The parameters, every parent before its children.
    pub fn params(&self) -> &[Param] {
        &self.params
    }

    /// The number of parameters, conditional ones included.
    pub fn len(&self) -> usize {
        self.params.len()
    }

    /// Whether the space has no parameters (every algorithm then proposes the empty config).
    pub fn is_empty(&self) -> bool {
        self.params.is_empty()
    }

    /// The index in [`SearchSpace::params`] of the parameter called `name`.
    pub fn index_of(&self, name: &str) -> Option<usize> {
        self.params.iter().position(|param| param.name == name)
    }

    /// A configuration drawn from the prior: each active parameter independently
    /// uniform on its scale, inactive ones absent.
    pub fn sample<R: Rng + ?Sized>(&self, rng: &mut R) -> Config {
        let mut config = Config::new();
        for param_idx in 0..self.params.len() {
            if self.is_active(param_idx, &config) {
                let param = &self.params[param_idx];
                config.insert(param.name.clone(), param.sample(rng));
            }
        }
        config
    }

    /// Whether parameter `param_idx` is present in `config`'s assignment of its
    /// parents: every condition's parent is present with one of the listed values.
    pub fn is_active(&self, param_idx: usize, config: &Config) -> bool {
        self.params[param_idx].conditions.iter().all(|condition| {
            let parent = &self.params[condition.parent];
            config
                .get(&parent.name)
                .and_then(|value| parent.level_of_value(value))
                .is_some_and(|level| condition.levels.binary_search(&level).is_ok())
        })
    }

    /// For each parameter of [`SearchSpace::params`], whether it is active in `config`.
    pub fn active(&self, config: &Config) -> Vec<bool> {
        (0..self.params.len())
            .map(|param_idx| self.is_active(param_idx, config))
            .collect()
    }

    /// Whether `config` is a configuration of this space: every active parameter
    /// present with a value of its domain, and nothing else.
    pub fn contains(&self, config: &Config) -> bool {
        let mut expected = 0;
        for (param_idx, param) in self.params.iter().enumerate() {
            if self.is_active(param_idx, config) {
                match config.get(&param.name) {
                    Some(value) if param.contains(value) => expected += 1,
                    _ => return false,
                }
            }
        }
        config.len() == expected
    }

    /// Each parameter's position in `[0, 1]` (see [`Param::to_unit`]), `None` where
    /// the parameter is inactive or missing.
    pub fn encode(&self, config: &Config) -> Vec<Option<f64>> {
        self.params
            .iter()
            .enumerate()
            .map(|(param_idx, param)| {
                if self.is_active(param_idx, config) {
                    config
                        .get(&param.name)
                        .and_then(|value| param.to_unit(value))
                } else {
                    None
                }
            })
            .collect()
    }

    /// The configuration at `point`, one coordinate in `[0, 1]` per parameter of
    /// [`SearchSpace::params`]; coordinates of inactive parameters are ignored.
    pub fn decode(&self, point: &[f64]) -> Config {
        assert_eq!(
            point.len(),
            self.params.len(),
            "one coordinate per parameter"
        );
        let active = self.active_in_unit(point);
        self.params
            .iter()
            .zip(point)
            .zip(active)
            .filter(|(_, active)| *active)
            .map(|((param, unit), _)| (param.name.clone(), param.from_unit(*unit)))
            .collect()
    }

    /// For each parameter, whether it is active at `point` (as in [`SearchSpace::decode`]).
    pub fn active_in_unit(&self, point: &[f64]) -> Vec<bool> {
        let mut active: Vec<bool> = Vec::with_capacity(self.params.len());
        for param_idx in 0..self.params.len() {
            let is_active = self.is_active_in_unit(param_idx, point, &active);
            active.push(is_active);
        }
        active
    }

    /// Whether parameter `param_idx` is active at `point`, given whether each
    /// earlier parameter is (`active` covers at least the parents).
    pub fn is_active_in_unit(&self, param_idx: usize, point: &[f64], active: &[bool]) -> bool {
        self.params[param_idx].conditions.iter().all(|condition| {
            let parent = &self.params[condition.parent];
            active[condition.parent]
                && condition
                    .levels
                    .binary_search(&parent.level_of_unit(point[condition.parent]))
                    .is_ok()
        })
    }

    /// Every configuration of a discrete space, the first parameter varying slowest;
    /// a conditional parameter multiplies only the configurations where it is active.
    ///
    /// Refuses a space with a real-valued parameter, naming it.
    pub fn grid(&self) -> Result<Vec<Config>, SpaceError> {
        if let Some(param) = self.params.iter().find(|param| param.is_continuous()) {
            return Err(space_error(&param.name, ParamError::Continuous));
        }
        Ok(self.discrete_grid())
    }

    /// Every combination of the discrete parameters' values (reals left out).
    pub fn discrete_grid(&self) -> Vec<Config> {
        let mut points = vec![Config::new()];
        for (param_idx, param) in self.params.iter().enumerate() {
            let Some(values) = param.grid_values() else {
                continue;
            };
            points = points
                .into_iter()
                .flat_map(|point| {
                    if self.is_active(param_idx, &point) {
                        values
                            .iter()
                            .map(|value| {
                                let mut next = point.clone();
                                next.insert(param.name.clone(), value.clone());
                                next
                            })
                            .collect()
                    } else {
                        vec![point]
                    }
                })
                .collect();
        }
        points
    }

    /// The number of configurations [`SearchSpace::grid`] gives, without building
    /// them; `None` when a parameter is real-valued or the count does not fit.
    pub fn grid_len(&self) -> Option<usize> {
        if self.params.iter().any(Param::is_continuous) {
            return None;
        }
        let is_parent: Vec<bool> = (0..self.params.len())
            .map(|param_idx| {
                self.params.iter().any(|param| {
                    param
                        .conditions
                        .iter()
                        .any(|condition| condition.parent == param_idx)
                })
            })
            .collect();
        // Enumerate assignments of the parents only; every other parameter
        // multiplies the count of the assignments where it is active.
        let mut assignments = vec![Config::new()];
        for (param_idx, param) in self.params.iter().enumerate() {
            if !is_parent[param_idx] {
                continue;
            }
            let values = param.grid_values().expect("discrete");
            let mut next = Vec::new();
            for assignment in assignments {
                if self.is_active(param_idx, &assignment) {
                    for value in &values {
                        let mut extended = assignment.clone();
                        extended.insert(param.name.clone(), value.clone());
                        next.push(extended);
                    }
                } else {
                    next.push(assignment);
                }
                if next.len() > MAX_PARENT_ASSIGNMENTS {
                    return None;
                }
            }
            assignments = next;
        }
        assignments.iter().try_fold(0usize, |total, assignment| {
            let leaves = self
                .params
                .iter()
                .enumerate()
                .filter(|(param_idx, _)| {
                    !is_parent[*param_idx] && self.is_active(*param_idx, assignment)
                })
                .try_fold(1usize, |product, (_, param)| {
                    product.checked_mul(usize::try_from(param.cardinality()?).ok()?)
                })?;
            total.checked_add(leaves)
        })
    }
}

impl TryFrom<&SpaceSpec> for SearchSpace {
    type Error = SpaceError;

    fn try_from(spec: &SpaceSpec) -> Result<Self, SpaceError> {
        Self::from_spec(spec)
    }
}

/// Checks that `name`'s condition on `parent` can hold: the parent exists, is
/// another parameter, is discrete, and takes each of `values`.
fn check_condition(
    name: &str,
    parent: &str,
    values: &[ParamValue],
    kinds: &BTreeMap<&str, ParamKind>,
) -> Result<(), SpaceError> {
    let Some(parent_kind) = kinds.get(parent) else {
        return Err(space_error(
            name,
            ParamError::UnknownParent {
                parent: parent.to_owned(),
            },
        ));
    };
    if parent == name {
        return Err(space_error(name, ParamError::ConditionCycle));
    }
    if matches!(parent_kind, ParamKind::Float { .. }) {
        return Err(space_error(
            name,
            ParamError::ParentNotDiscrete {
                parent: parent.to_owned(),
            },
        ));
    }
    if values.is_empty() {
        return Err(space_error(
            name,
            ParamError::EmptyCondition {
                parent: parent.to_owned(),
            },
        ));
    }
    let parent_param = Param {
        name: parent.to_owned(),
        kind: parent_kind.clone(),
        conditions: Vec::new(),
    };
    if let Some(value) = values.iter().find(|value| !parent_param.contains(value)) {
        return Err(space_error(
            name,
            ParamError::ValueOutsideParent {
                parent: parent.to_owned(),
                value: value.clone(),
            },
        ));
    }
    Ok(())
}

/// The levels of `parent` at which a condition on `values` holds, sorted.
fn levels_of(parent_param: &Param, values: &[ParamValue]) -> Vec<i64> {
    let mut levels: Vec<i64> = match &parent_param.kind {
        ParamKind::Choice { values: choices } => choices
            .iter()
            .enumerate()
            .filter(|(_, choice)| values.contains(choice))
            .map(|(index, _)| index as i64)
            .collect(),
        _ => values
            .iter()
            .filter_map(|value| parent_param.level_of_value(value))
            .collect(),
    };
    levels.sort_unstable();
    levels.dedup();
    levels
}

fn resolve_kind(param: &ParamSpec) -> Result<ParamKind, ParamError> {
    if !matches!(param.domain, Domain::Int(_)) {
        if param.step != 1 {
            return Err(ParamError::StepNotInt);
        }
        if param.log {
            return Err(ParamError::LogNotInt);
        }
    }
    match &param.domain {
        Domain::Uniform([lo, hi]) => {
            if !(lo.is_finite() && hi.is_finite() && lo < hi && (hi - lo).is_finite()) {
                return Err(ParamError::UniformBounds);
            }
            Ok(ParamKind::Float {
                lo: *lo,
                hi: *hi,
                log: false,
            })
        }
        Domain::Loguniform([lo, hi]) => {
            if !(lo.is_finite() && hi.is_finite() && *lo > 0.0 && lo < hi) {
                return Err(ParamError::LoguniformBounds);
            }
            Ok(ParamKind::Float {
                lo: *lo,
                hi: *hi,
                log: true,
            })
        }
        Domain::Int([lo, hi]) => {
            if lo > hi {
                return Err(ParamError::IntBounds);
            }
            if i128::from(*hi) - i128::from(*lo) > MAX_INT_WIDTH {
                return Err(ParamError::IntTooWide);
            }
            if param.step < 1 {
                return Err(ParamError::StepNotPositive { step: param.step });
            }
            if param.log && *lo <= 0 {
                return Err(ParamError::LogNotPositive);
            }
            if param.log && param.step != 1 {
                return Err(ParamError::LogWithStep);
            }
            Ok(ParamKind::Int {
                lo: *lo,
                hi: *hi,
                step: param.step,
                log: param.log,
            })
        }
        Domain::Choice(values) => {
            if values.is_empty() {
                return Err(ParamError::EmptyChoice);
            }
            if values
                .iter()
                .any(|value| matches!(value, ParamValue::Float(x) if !x.is_finite()))
            {
                return Err(ParamError::NonFiniteChoice);
            }
            Ok(ParamKind::Choice {
                values: values.clone(),
            })
        }
    }
}

/// Names in an order where parents come first, ties broken by name.
fn dependency_order(spec: &SpaceSpec) -> Result<Vec<&str>, SpaceError> {
    let mut order: Vec<&str> = Vec::with_capacity(spec.len());
    let mut placed: BTreeMap<&str, bool> = spec.keys().map(|name| (name.as_str(), false)).collect();
    while order.len() < spec.len() {
        let next = spec.iter().find(|(name, param)| {
            !placed[name.as_str()] && param.when.keys().all(|parent| placed[parent.as_str()])
        });
        let Some((name, _)) = next else {
            // Every unplaced parameter waits on another unplaced one: follow parents
            // until one repeats, which lies on a cycle.
            let mut current = spec
                .keys()
                .find(|name| !placed[name.as_str()])
                .expect("some parameter is unplaced");
            let mut seen = Vec::new();
            while !seen.contains(&current) {
                seen.push(current);
                current = spec[current]
                    .when
                    .keys()
                    .find(|parent| !placed[parent.as_str()])
                    .expect("an unplaced parameter waits on an unplaced parent");
            }
            return Err(space_error(current, ParamError::ConditionCycle));
        };
        placed.insert(name.as_str(), true);
        order.push(name.as_str());
    }
    Ok(order)
}

/// Builds a [`SearchSpace`] in code, checked when [`SpaceBuilder::build`] is called.
///
/// ```
/// use xp_runtime::spec::SearchSpace;
/// use xp_runtime::spec::ParamSpec;
///
/// let space = SearchSpace::builder()
///     .loguniform("lr", 1e-4, 1e-1)
///     .choice("optimizer", ["sgd", "adam"])
///     .param("momentum", ParamSpec::uniform(0.0, 0.99).when("optimizer", ["sgd"]))
///     .param("layers", ParamSpec::int(1, 8).log())
///     .build()
///     .expect("a valid space");
/// assert_eq!(space.len(), 4);
/// ```
#[derive(Debug, Clone, Default)]
pub struct SpaceBuilder {
    spec: SpaceSpec,
    duplicate: Option<String>,
}

impl SpaceBuilder {
    /// Adds a parameter of any shape (step, log scale, condition) by its spec.
    pub fn param(mut self, name: impl Into<String>, param: impl Into<ParamSpec>) -> Self {
        let name = name.into();
        if self.spec.0.insert(name.clone(), param.into()).is_some() && self.duplicate.is_none() {
            self.duplicate = Some(name);
        }
        self
    }

    /// Adds a real parameter uniform in `[lo, hi]`.
    pub fn uniform(self, name: impl Into<String>, lo: f64, hi: f64) -> Self {
        self.param(name, ParamSpec::uniform(lo, hi))
    }

    /// Adds a positive real parameter whose logarithm is uniform in `[ln lo, ln hi]`.
    pub fn loguniform(self, name: impl Into<String>, lo: f64, hi: f64) -> Self {
        self.param(name, ParamSpec::loguniform(lo, hi))
    }

    /// Adds an integer parameter in `[lo, hi]`, both included.
    pub fn int(self, name: impl Into<String>, lo: i64, hi: i64) -> Self {
        self.param(name, ParamSpec::int(lo, hi))
    }

    /// Adds a parameter that takes one of `values`.
    pub fn choice<V: Into<ParamValue>>(
        self,
        name: impl Into<String>,
        values: impl IntoIterator<Item = V>,
    ) -> Self {
        self.param(name, ParamSpec::choice(values))
    }

    /// The declared form, to put in a [`crate::spec::SearchSpec`].
    pub fn into_spec(self) -> SpaceSpec {
        self.spec
    }

    /// Checks and orders the space (see [`SearchSpace::from_spec`]).
    pub fn build(self) -> Result<SearchSpace, SpaceError> {
        if let Some(name) = self.duplicate {
            return Err(space_error(&name, ParamError::Duplicate));
        }
        SearchSpace::from_spec(&self.spec)
    }
}

#[cfg(test)]
mod tests;
