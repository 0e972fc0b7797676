//! The declared search: algorithm, objective, parameter domains and replicates,
//! as written in YAML, and its validation (the checked form is [`super::SearchSpace`]).

use std::collections::BTreeMap;
use std::fmt;
use std::ops::Deref;

use serde::de::{DeserializeSeed, MapAccess, Visitor};
use serde::ser::SerializeMap;
use serde::{Deserialize, Deserializer, Serialize, Serializer};

use super::objectives::SearchWire;
use super::{
    BUILTIN_PLACEHOLDERS, BohbSpec, MAX_TRIALS, SearchSpace, SpecError, StoppingConfig, invalid,
};

/// How configurations are chosen.
///
/// Serde goes through `objectives::SearchWire`, which reads `metric` and `mode` as
/// one value or a list (one per objective) and writes a single objective exactly
/// as before, so single-metric specs keep their canonical JSON and identity: a
/// field added here is added there too.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(from = "SearchWire", into = "SearchWire")]
pub struct SearchSpec {
    /// The algorithm.
    pub algorithm: Algorithm,
    /// The acquisition function of `algorithm: gp`; when absent `ei`, or `ucb` if `kappa` is given.
    pub acquisition: Option<AcquisitionKind>,
    /// The exploration weight of the `ucb` acquisition (it minimises mean − kappa·sd); 2.0 when absent.
    pub kappa: Option<f64>,
    /// Parameter name to parameter: its domain, step, scale and condition.
    pub space: SpaceSpec,
    /// The metric that ranks trials; the first objective of a multi-objective
    /// search (`metric: [val_acc, latency_ms]`), whose others are `extra_metrics`.
    pub metric: Option<String>,
    /// Whether smaller or larger metric values are better (the first objective's).
    pub mode: Mode,
    /// How many configurations random, sobol, gp and tpe search evaluate.
    pub trials: Option<u32>,
    /// At most this many trials of the experiment run at once; unlimited when absent.
    pub parallel: Option<u32>,
    /// Replicates per configuration, each with its own seed.
    pub seeds: u32,
    /// The seed of the sampler, and the first replicate's seed.
    pub seed: u64,
    /// A rule that stops unpromising trials early from their intermediate `metric` reports.
    pub early_stopping: Option<StoppingConfig>,
    /// What one unit of `metric` is worth, for `xp report`'s return on GPU-hours.
    pub value: Option<MetricValue>,
    /// Options of `algorithm: tpe`.
    pub tpe: Option<TpeSpec>,
    /// The second to fourth objectives of a multi-objective search, after `metric`;
    /// empty for one metric.
    pub extra_metrics: Vec<String>,
    /// The directions of `extra_metrics`, in order.
    pub extra_modes: Vec<Mode>,
    /// The reference point of a multi-objective search's hypervolume, one value per
    /// objective in the metric's own units; derived from the trials when absent.
    pub reference: Option<Vec<f64>>,
    /// Options of `algorithm: bohb` (its budgets); the defaults when absent.
    pub bohb: Option<BohbSpec>,
}

/// Options of `algorithm: tpe` (`tpe: {multivariate: true}`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TpeSpec {
    /// Model the parameters jointly (multivariate TPE) rather than one at a time.
    #[serde(default)]
    pub multivariate: bool,
}

/// What an improvement of the metric is worth, in the currency of the policy's
/// GPU-hour prices: an improvement of one unit of the metric (0.01 of an
/// accuracy metric is a hundredth of a unit) is worth `per_unit`.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MetricValue {
    /// Currency units per unit of the metric's improvement.
    pub per_unit: f64,
}

impl Default for SearchSpec {
    fn default() -> Self {
        Self {
            algorithm: Algorithm::default(),
            acquisition: None,
            kappa: None,
            space: SpaceSpec::default(),
            metric: None,
            mode: Mode::default(),
            trials: None,
            parallel: None,
            seeds: 1,
            seed: 0,
            early_stopping: None,
            value: None,
            tpe: None,
            extra_metrics: Vec::new(),
            extra_modes: Vec::new(),
            reference: None,
            bohb: None,
        }
    }
}

/// A search algorithm.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum Algorithm {
    /// Every combination of the (discrete) domains.
    Grid,
    /// Independent samples from each domain.
    #[default]
    Random,
    /// Owen-scrambled Sobol points: like random, but covering the space more evenly.
    Sobol,
    /// Bayesian optimisation with a Gaussian process; see `acquisition` and `kappa`.
    Gp,
    /// The tree-structured Parzen estimator (as in Hyperopt and Optuna).
    Tpe,
    /// BOHB (Falkner et al. 2018): Hyperband's brackets stop trials at budgets
    /// (rungs), and Parzen estimators fitted on the largest budget with enough
    /// results propose the configurations; see `bohb`.
    Bohb,
}

impl Algorithm {
    /// The name used in YAML and in messages.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Grid => "grid",
            Self::Random => "random",
            Self::Sobol => "sobol",
            Self::Gp => "gp",
            Self::Tpe => "tpe",
            Self::Bohb => "bohb",
        }
    }

    /// Whether each configuration depends on the results of earlier trials, so the
    /// trials cannot be planned up front and come one by one from a
    /// `xp_tune::search::Searcher` instead.
    pub fn is_adaptive(self) -> bool {
        matches!(self, Self::Gp | Self::Tpe | Self::Bohb)
    }
}

/// The acquisition function of Gaussian-process search, as YAML names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum AcquisitionKind {
    /// Lower confidence bound on the minimised objective (mean − kappa·sd).
    Ucb,
    /// Expected improvement over the best value seen.
    Ei,
}

/// Whether smaller or larger is better.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum Mode {
    /// Smaller is better (losses).
    #[default]
    Min,
    /// Larger is better (accuracies).
    Max,
}

/// The values one parameter may take.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Domain {
    /// A real number drawn uniformly from `[lo, hi]`.
    Uniform([f64; 2]),
    /// A positive real whose logarithm is uniform.
    Loguniform([f64; 2]),
    /// An integer in `[lo, hi]`, both included.
    Int([i64; 2]),
    /// One of the listed values.
    Choice(Vec<ParamValue>),
}

/// One parameter value as the trial sees it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum ParamValue {
    /// `true` or `false`.
    Bool(bool),
    /// A whole number.
    Int(i64),
    /// A real number.
    Float(f64),
    /// Text.
    Str(String),
}

impl fmt::Display for ParamValue {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Bool(value) => write!(f, "{value}"),
            Self::Int(value) => write!(f, "{value}"),
            Self::Float(value) => write!(f, "{value}"),
            Self::Str(value) => f.write_str(value),
        }
    }
}

impl From<bool> for ParamValue {
    fn from(value: bool) -> Self {
        Self::Bool(value)
    }
}

impl From<i64> for ParamValue {
    fn from(value: i64) -> Self {
        Self::Int(value)
    }
}

impl From<f64> for ParamValue {
    fn from(value: f64) -> Self {
        Self::Float(value)
    }
}

impl From<&str> for ParamValue {
    fn from(value: &str) -> Self {
        Self::Str(value.to_owned())
    }
}

impl From<String> for ParamValue {
    fn from(value: String) -> Self {
        Self::Str(value)
    }
}

/// One parameter of the search space: its domain, and when it is present.
///
/// YAML writes it as one map: the domain's key (`uniform`, `loguniform`, `int` or
/// `choice`), then optionally `step` and `log: true` (integers only) and `when`, a
/// map from parent parameter to the parent values under which this one is present:
/// `{int: [1, 8], step: 1, log: true}`, `{uniform: [0.0, 0.99], when: {optimizer: [sgd]}}`.
/// Several parents in `when` must all match. The canonical form leaves defaults
/// out (`step: 1`, `log: false`, no `when`), so a plain `{uniform: [a, b]}` keeps the
/// canonical JSON, and so the experiment id, it always had.
/// [`super::SearchSpace::from_spec`] checks it.
#[derive(Debug, Clone, PartialEq)]
pub struct ParamSpec {
    /// The values the parameter may take.
    pub domain: Domain,
    /// The spacing of an integer parameter's values, counted from its lower bound; 1 unless given.
    pub step: i64,
    /// Whether an integer parameter is searched on a log scale (`loguniform` is the real-valued form).
    pub log: bool,
    /// Parent parameter to the parent values under which this parameter is present;
    /// empty when it always is.
    pub when: BTreeMap<String, Vec<ParamValue>>,
}

impl ParamSpec {
    /// An unconditional parameter with unit step and linear scale.
    pub fn new(domain: Domain) -> Self {
        Self {
            domain,
            step: 1,
            log: false,
            when: BTreeMap::new(),
        }
    }

    /// A real parameter uniform in `[lo, hi]`.
    pub fn uniform(lo: f64, hi: f64) -> Self {
        Self::new(Domain::Uniform([lo, hi]))
    }

    /// A positive real parameter whose logarithm is uniform.
    pub fn loguniform(lo: f64, hi: f64) -> Self {
        Self::new(Domain::Loguniform([lo, hi]))
    }

    /// An integer parameter in `[lo, hi]`, both included.
    pub fn int(lo: i64, hi: i64) -> Self {
        Self::new(Domain::Int([lo, hi]))
    }

    /// A parameter that takes one of `values`.
    pub fn choice<V: Into<ParamValue>>(values: impl IntoIterator<Item = V>) -> Self {
        Self::new(Domain::Choice(values.into_iter().map(Into::into).collect()))
    }

    /// The same integer parameter with values `lo, lo + step, ...` up to `hi`.
    pub fn step(mut self, step: i64) -> Self {
        self.step = step;
        self
    }

    /// The same integer parameter searched on a log scale.
    pub fn log(mut self) -> Self {
        self.log = true;
        self
    }

    /// The same parameter, present only when `parent` takes one of `values` (and
    /// every other condition holds).
    pub fn when<V: Into<ParamValue>>(
        mut self,
        parent: impl Into<String>,
        values: impl IntoIterator<Item = V>,
    ) -> Self {
        self.when
            .entry(parent.into())
            .or_default()
            .extend(values.into_iter().map(Into::into));
        self
    }

    /// Whether some configurations lack this parameter.
    pub fn is_conditional(&self) -> bool {
        !self.when.is_empty()
    }
}

impl From<Domain> for ParamSpec {
    fn from(domain: Domain) -> Self {
        Self::new(domain)
    }
}

impl Serialize for ParamSpec {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let len = 1
            + usize::from(self.step != 1)
            + usize::from(self.log)
            + usize::from(!self.when.is_empty());
        let mut map = serializer.serialize_map(Some(len))?;
        match &self.domain {
            Domain::Uniform(bounds) => map.serialize_entry("uniform", bounds)?,
            Domain::Loguniform(bounds) => map.serialize_entry("loguniform", bounds)?,
            Domain::Int(bounds) => map.serialize_entry("int", bounds)?,
            Domain::Choice(values) => map.serialize_entry("choice", values)?,
        }
        if self.step != 1 {
            map.serialize_entry("step", &self.step)?;
        }
        if self.log {
            map.serialize_entry("log", &true)?;
        }
        if !self.when.is_empty() {
            map.serialize_entry("when", &self.when)?;
        }
        map.end()
    }
}

/// Every key a parameter may have; [`ParamSpec`]'s `Deserialize` checks that exactly
/// one domain is given.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawParam {
    #[serde(default)]
    uniform: Option<[f64; 2]>,
    #[serde(default)]
    loguniform: Option<[f64; 2]>,
    #[serde(default)]
    int: Option<[i64; 2]>,
    #[serde(default)]
    choice: Option<Vec<ParamValue>>,
    #[serde(default)]
    step: Option<i64>,
    #[serde(default)]
    log: Option<bool>,
    #[serde(default)]
    when: Option<BTreeMap<String, Vec<ParamValue>>>,
}

impl<'de> Deserialize<'de> for ParamSpec {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let raw = RawParam::deserialize(deserializer)?;
        let mut domains = [
            raw.uniform.map(Domain::Uniform),
            raw.loguniform.map(Domain::Loguniform),
            raw.int.map(Domain::Int),
            raw.choice.map(Domain::Choice),
        ]
        .into_iter()
        .flatten();
        let domain = domains.next().ok_or_else(|| {
            serde::de::Error::custom("needs one of `uniform`, `loguniform`, `int` or `choice`")
        })?;
        if domains.next().is_some() {
            return Err(serde::de::Error::custom(
                "give exactly one of `uniform`, `loguniform`, `int` or `choice`",
            ));
        }
        if !matches!(domain, Domain::Int(_)) {
            if raw.step.is_some() {
                return Err(serde::de::Error::custom(
                    "`step` applies to `int` parameters only",
                ));
            }
            if raw.log.is_some() {
                return Err(serde::de::Error::custom(
                    "`log` applies to `int` parameters only (reals use `loguniform`)",
                ));
            }
        }
        Ok(Self {
            domain,
            step: raw.step.unwrap_or(1),
            log: raw.log.unwrap_or(false),
            when: raw.when.unwrap_or_default(),
        })
    }
}

/// The search space as declared: parameter name to [`ParamSpec`], sorted by name.
///
/// A map with its own `Deserialize`, so a malformed parameter's error names it; it
/// dereferences to the map. Collect `(name, Domain)` pairs for a space of plain
/// parameters, or `(name, ParamSpec)` pairs for any.
#[derive(Debug, Clone, PartialEq, Default, Serialize)]
#[serde(transparent)]
pub struct SpaceSpec(pub BTreeMap<String, ParamSpec>);

impl SpaceSpec {
    /// Whether the space has no parameters (one trial with an empty configuration).
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

impl Deref for SpaceSpec {
    type Target = BTreeMap<String, ParamSpec>;

    fn deref(&self) -> &Self::Target {
        &self.0
    }
}

impl FromIterator<(String, ParamSpec)> for SpaceSpec {
    fn from_iter<I: IntoIterator<Item = (String, ParamSpec)>>(iter: I) -> Self {
        Self(iter.into_iter().collect())
    }
}

impl FromIterator<(String, Domain)> for SpaceSpec {
    fn from_iter<I: IntoIterator<Item = (String, Domain)>>(iter: I) -> Self {
        Self(
            iter.into_iter()
                .map(|(name, domain)| (name, ParamSpec::new(domain)))
                .collect(),
        )
    }
}

/// Deserialises one parameter, prefixing any error with the parameter's path, so the
/// error is raised (and located by the YAML parser) at the parameter itself.
struct NamedParam<'a> {
    name: &'a str,
}

impl<'de> DeserializeSeed<'de> for NamedParam<'_> {
    type Value = ParamSpec;

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<ParamSpec, D::Error> {
        ParamSpec::deserialize(deserializer).map_err(|error| {
            serde::de::Error::custom(format_args!("search.space.{}: {error}", self.name))
        })
    }
}

impl<'de> Deserialize<'de> for SpaceSpec {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct SpaceVisitor;

        impl<'de> Visitor<'de> for SpaceVisitor {
            type Value = SpaceSpec;

            fn expecting(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
                formatter.write_str("a map from parameter name to domain")
            }

            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<SpaceSpec, A::Error> {
                let mut params = BTreeMap::new();
                while let Some(name) = map.next_key::<String>()? {
                    let param = map.next_value_seed(NamedParam { name: &name })?;
                    if params.insert(name.clone(), param).is_some() {
                        return Err(serde::de::Error::custom(format_args!(
                            "search.space.{name}: declared twice"
                        )));
                    }
                }
                Ok(SpaceSpec(params))
            }
        }

        deserializer.deserialize_map(SpaceVisitor)
    }
}

impl SearchSpec {
    /// Checks every field, section by section; the first problem found is the
    /// one reported.
    pub(super) fn validate(&self) -> Result<(), SpecError> {
        let search_space = self.validate_space()?;
        super::objectives::validate_objectives(self)?;
        self.validate_value()?;
        self.validate_early_stopping()?;
        self.validate_bohb()?;
        self.validate_algorithm_options()?;
        self.validate_counts(&search_space)
    }

    /// Parameter names, each parameter's domain, and discrete domains for a grid;
    /// returns the space they make.
    fn validate_space(&self) -> Result<SearchSpace, SpecError> {
        for name in self.space.keys() {
            let field = format!("search.space.{name}");
            if name.is_empty() || !name.chars().all(|ch| ch.is_alphanumeric() || ch == '_') {
                return Err(invalid(
                    field,
                    "parameter names use letters, digits and '_' only",
                ));
            }
            if BUILTIN_PLACEHOLDERS.contains(&name.as_str()) {
                return Err(invalid(field, "is a reserved name"));
            }
        }
        let search_space = SearchSpace::from_spec(&self.space).map_err(|error| {
            invalid(
                format!("search.space.{}", error.param),
                error.reason.to_string(),
            )
        })?;
        if self.algorithm == Algorithm::Grid {
            let continuous = search_space
                .params()
                .iter()
                .filter(|param| param.is_continuous())
                .map(|param| param.name())
                .min();
            if let Some(name) = continuous {
                return Err(invalid(
                    format!("search.space.{name}"),
                    "grid search needs discrete domains (int or choice)",
                ));
            }
        }
        Ok(search_space)
    }

    /// `value` prices units of the metric: it needs one, and a positive price.
    fn validate_value(&self) -> Result<(), SpecError> {
        if let Some(value) = &self.value {
            if self.metric.is_none() {
                return Err(invalid(
                    "search.value",
                    "needs search.metric, the value whose units it prices",
                ));
            }
            if !(value.per_unit.is_finite() && value.per_unit > 0.0) {
                return Err(invalid(
                    "search.value.per_unit",
                    "must be a finite number > 0",
                ));
            }
        }
        Ok(())
    }

    /// `early_stopping` judges the metric: it needs one, and a valid rule.
    fn validate_early_stopping(&self) -> Result<(), SpecError> {
        if let Some(early_stopping) = &self.early_stopping {
            if self.metric.is_none() {
                return Err(invalid(
                    "search.early_stopping",
                    "needs search.metric, the value the rule judges",
                ));
            }
            early_stopping.validate().map_err(|error| {
                invalid(
                    format!("search.early_stopping.{}", error.field()),
                    error.to_string(),
                )
            })?;
        }
        Ok(())
    }

    /// `tpe`, `acquisition` and `kappa` belong to their algorithm.
    fn validate_algorithm_options(&self) -> Result<(), SpecError> {
        if self.algorithm != Algorithm::Tpe && self.tpe.is_some() {
            return Err(invalid("search.tpe", "only applies to `algorithm: tpe`"));
        }
        if self.algorithm != Algorithm::Gp {
            if self.acquisition.is_some() {
                return Err(invalid(
                    "search.acquisition",
                    "only applies to `algorithm: gp`",
                ));
            }
            if self.kappa.is_some() {
                return Err(invalid("search.kappa", "only applies to `algorithm: gp`"));
            }
        }
        if let Some(kappa) = self.kappa {
            if self.acquisition == Some(AcquisitionKind::Ei) {
                return Err(invalid(
                    "search.kappa",
                    "only applies to `acquisition: ucb`",
                ));
            }
            if !(kappa.is_finite() && kappa >= 0.0) {
                return Err(invalid("search.kappa", "must be a finite number >= 0"));
            }
        }
        Ok(())
    }

    /// How many trials: `trials` where the algorithm needs it, `parallel`,
    /// `seeds`, and at most [`MAX_TRIALS`] in all.
    fn validate_counts(&self, search_space: &SearchSpace) -> Result<(), SpecError> {
        match (self.algorithm, self.trials) {
            (Algorithm::Grid, Some(_)) => {
                return Err(invalid(
                    "search.trials",
                    "grid search runs every combination; remove `trials`",
                ));
            }
            (Algorithm::Grid, None) => {}
            (algorithm, None) if !self.space.is_empty() => {
                return Err(invalid(
                    "search.trials",
                    format!("{} search needs the number of trials", algorithm.as_str()),
                ));
            }
            (_, Some(0)) => {
                return Err(invalid("search.trials", "must be at least 1"));
            }
            _ => {}
        }
        if self.parallel == Some(0) {
            return Err(invalid("search.parallel", "must be at least 1"));
        }
        if self.seeds == 0 || self.seeds > 1000 {
            return Err(invalid("search.seeds", "must be between 1 and 1000"));
        }
        let configs = match self.algorithm {
            Algorithm::Grid => search_space.grid_len().unwrap_or(usize::MAX),
            _ => self.trials.unwrap_or(1) as usize,
        };
        if configs.saturating_mul(self.seeds as usize) > MAX_TRIALS {
            return Err(invalid(
                "search",
                format!("expands to more than {MAX_TRIALS} trials"),
            ));
        }
        Ok(())
    }

    /// The `bohb` section belongs to `algorithm: bohb`, which needs a metric to rank
    /// at its rungs and ranks single runs (one seed). With `early_stopping`, that
    /// rule stops trials instead of BOHB's Hyperband brackets.
    fn validate_bohb(&self) -> Result<(), SpecError> {
        if self.algorithm != Algorithm::Bohb {
            if self.bohb.is_some() {
                return Err(invalid("search.bohb", "only applies to `algorithm: bohb`"));
            }
            return Ok(());
        }
        if self.metric.is_none() {
            return Err(invalid(
                "search.metric",
                "`algorithm: bohb` needs the metric its rungs rank",
            ));
        }
        if self.seeds != 1 {
            return Err(invalid(
                "search.seeds",
                "`algorithm: bohb` ranks single runs at its rungs; use `seeds: 1`",
            ));
        }
        self.bohb
            .unwrap_or_default()
            .validate()
            .map_err(|error| invalid(format!("search.bohb.{}", error.field()), error.to_string()))
    }

    /// The number of grid points (a conditional parameter multiplies only the points
    /// where it is active), or `None` when it overflows, a domain is continuous or
    /// the space is invalid.
    pub fn grid_size(&self) -> Option<usize> {
        SearchSpace::from_spec(&self.space).ok()?.grid_len()
    }
}
