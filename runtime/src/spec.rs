//! The experiment specification: what a user declares in YAML or builds in code.
//!
//! Parsing is strict (unknown fields are errors, with line and column from the YAML
//! parser) and [`ExperimentSpec::validate`] checks every value, naming the field.
//! The spec crosses the wire as canonical JSON (see [`ExperimentSpec::to_canonical_json`]),
//! because its parameter values are dynamically typed and bincode is not self-describing.

use std::collections::BTreeMap;
use std::fmt;
use std::ops::Deref;

use serde::de::{DeserializeSeed, MapAccess, Visitor};
use serde::ser::SerializeMap;
use serde::{Deserialize, Deserializer, Serialize, Serializer};

use crate::search::SearchSpace;

/// The largest YAML document accepted, so a stray file cannot exhaust memory.
pub const MAX_SPEC_BYTES: usize = 1 << 20;
/// The most trials one experiment may expand to.
pub const MAX_TRIALS: usize = 100_000;
/// The most workers one trial may ask for.
pub const MAX_WORKERS: u32 = 256;

/// Why a specification was refused.
#[derive(Debug, thiserror::Error, PartialEq)]
pub enum SpecError {
    /// The document is not valid YAML for this schema; the message carries line and column.
    #[error("invalid experiment spec: {message}")]
    Parse {
        /// The parser's message, with the location it points at.
        message: String,
    },
    /// A field has a value outside what is allowed.
    #[error("invalid value for `{field}`: {reason}")]
    Invalid {
        /// The dotted path of the field, for example `search.space.lr`.
        field: String,
        /// What is wrong with it.
        reason: String,
    },
    /// The document is larger than [`MAX_SPEC_BYTES`].
    #[error("experiment spec is {len} bytes, more than the limit of {max}")]
    TooLarge {
        /// The document's size.
        len: usize,
        /// The limit.
        max: usize,
    },
}

fn invalid(field: impl Into<String>, reason: impl Into<String>) -> SpecError {
    SpecError::Invalid {
        field: field.into(),
        reason: reason.into(),
    }
}

/// A whole experiment: one trial template and the search that instantiates it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ExperimentSpec {
    /// A human name; not part of identity uniqueness rules beyond the hash.
    pub name: String,
    /// The team that owns the experiment.
    #[serde(default = "default_team")]
    pub team: String,
    /// Larger runs first among waiting trials: an integer, or the name of a
    /// priority class of the head's policy (such as `high`).
    #[serde(default, skip_serializing_if = "Priority::is_default")]
    pub priority: Priority,
    /// The scheduling queue; the team's default queue when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub queue: Option<String>,
    /// A git work tree whose commit (plus a hash of any uncommitted diff) is the code version.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub code: Option<String>,
    /// Files or directories hashed into the data version.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub data: Vec<String>,
    /// The trial template.
    pub trial: TrialSpec,
    /// How configurations are chosen; one trial with no parameters when absent.
    #[serde(default)]
    pub search: SearchSpec,
    /// Which checkpoints are kept; [`CheckpointRetention::default`] when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub checkpoints: Option<CheckpointRetention>,
}

/// Which of a trial's checkpoints the head keeps; the rest are deleted everywhere.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CheckpointRetention {
    /// The newest this many.
    #[serde(default = "default_keep_last")]
    pub keep_last: u32,
    /// The best this many by `search.metric` (none without a metric).
    #[serde(default = "default_keep_best")]
    pub keep_best: u32,
}

/// The most checkpoints of one trial either rule may keep.
pub const MAX_KEPT_CHECKPOINTS: u32 = 100;

fn default_keep_last() -> u32 {
    2
}

fn default_keep_best() -> u32 {
    1
}

impl Default for CheckpointRetention {
    fn default() -> Self {
        Self {
            keep_last: default_keep_last(),
            keep_best: default_keep_best(),
        }
    }
}

/// A base priority: a number, or a class name the head's policy resolves.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum Priority {
    /// A literal priority.
    Value(i64),
    /// A priority class such as `high`.
    Class(String),
}

impl Default for Priority {
    fn default() -> Self {
        Self::Value(0)
    }
}

impl Priority {
    fn is_default(&self) -> bool {
        *self == Self::Value(0)
    }
}

fn default_team() -> String {
    "default".to_owned()
}

/// What each trial runs and what it needs.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TrialSpec {
    /// An argv list with `{param}` placeholders; exclusive with `entry`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub command: Option<Vec<String>>,
    /// The name of a Rust trainable registered in the driver binary; exclusive with `command`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub entry: Option<String>,
    /// Path of the driver binary that registers `entry`, when submitted from the command line.
    /// Not part of identity: the binary's content hash is.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub program: Option<String>,
    /// Data-parallel workers started together as a gang.
    #[serde(default = "one_u32")]
    pub workers: u32,
    /// Resources per worker.
    #[serde(default)]
    pub resources: Resources,
    /// How many times a failed attempt is retried.
    #[serde(default)]
    pub max_retries: u32,
    /// How the workers of a gang exchange data between machines; workers on one
    /// machine always use shared memory.
    #[serde(default, skip_serializing_if = "CollectiveTransport::is_default")]
    pub transport: CollectiveTransport,
    /// Whether the scheduler may stop the trial (after a grace period to
    /// checkpoint) for more important work; it is requeued to resume.
    #[serde(default = "yes", skip_serializing_if = "is_true")]
    pub preemptible: bool,
    /// The longest one attempt may run, such as `2h`; lets short trials backfill.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub time_limit: Option<String>,
    /// Spread the workers over nodes instead of packing them.
    #[serde(default, skip_serializing_if = "is_false")]
    pub spread: bool,
    /// Acceptable GPU models (as the nodes report them); any when empty.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub gpu_models: Vec<String>,
    /// Labels a node must carry, such as `rack: r1`.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub node_labels: BTreeMap<String, String>,
}

fn yes() -> bool {
    true
}

fn is_true(value: &bool) -> bool {
    *value
}

fn is_false(value: &bool) -> bool {
    !*value
}

impl Default for TrialSpec {
    /// One worker with default resources, preemptible, and neither `command` nor
    /// `entry` yet (set one).
    fn default() -> Self {
        Self {
            command: None,
            entry: None,
            program: None,
            workers: 1,
            resources: Resources::default(),
            max_retries: 0,
            transport: CollectiveTransport::default(),
            preemptible: true,
            time_limit: None,
            spread: false,
            gpu_models: Vec::new(),
            node_labels: BTreeMap::new(),
        }
    }
}

impl TrialSpec {
    /// The time limit in milliseconds, if one is set and valid.
    pub fn time_limit_ms(&self) -> Option<u64> {
        self.time_limit
            .as_deref()
            .and_then(|text| humantime::parse_duration(text).ok())
            .map(|limit| u64::try_from(limit.as_millis()).unwrap_or(u64::MAX))
    }
}

/// The data path between the workers of a gang on different machines.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum CollectiveTransport {
    /// QUIC with TLS: encrypted, the default.
    #[default]
    Quic,
    /// Plain TCP, set up and authenticated through the rendezvous: for trusted networks.
    Tcp,
    /// Shared memory between workers on one machine, plain TCP between machines.
    Shm,
}

impl CollectiveTransport {
    fn is_default(&self) -> bool {
        *self == Self::default()
    }

    /// The name used in YAML and in the worker environment.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Quic => "quic",
            Self::Tcp => "tcp",
            Self::Shm => "shm",
        }
    }
}

fn one_u32() -> u32 {
    1
}

/// Resources one worker needs.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Resources {
    /// GPUs: a whole number, or a fraction below 1 (such as 0.25) of one GPU
    /// shared with other fractional workers.
    #[serde(default)]
    pub gpu: f64,
    /// CPU cores, possibly fractional.
    #[serde(default = "one_f64")]
    pub cpu: f64,
    /// Memory in bytes; YAML accepts `16GiB`, `512MB` or a plain integer.
    #[serde(default)]
    pub memory: MemoryBytes,
}

fn one_f64() -> f64 {
    1.0
}

impl Default for Resources {
    fn default() -> Self {
        Self {
            gpu: 0.0,
            cpu: 1.0,
            memory: MemoryBytes(0),
        }
    }
}

/// A byte count that reads human sizes (`16GiB`) and writes a plain integer, so
/// the canonical form hashed into identity never depends on how it was written.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct MemoryBytes(pub u64);

impl Serialize for MemoryBytes {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_u64(self.0)
    }
}

impl<'de> Deserialize<'de> for MemoryBytes {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Raw {
            Bytes(u64),
            Text(String),
        }
        match Raw::deserialize(deserializer)? {
            Raw::Bytes(bytes) => Ok(Self(bytes)),
            Raw::Text(text) => parse_memory(&text)
                .map(Self)
                .map_err(serde::de::Error::custom),
        }
    }
}

/// Parses a human memory size such as `16GiB`, `512 MB` or `1048576`.
pub fn parse_memory(text: &str) -> Result<u64, String> {
    text.trim()
        .parse::<bytesize::ByteSize>()
        .map(|size| size.as_u64())
        .map_err(|reason| format!("{text:?} is not a memory size like 16GiB or 512MB: {reason}"))
}

/// How configurations are chosen.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SearchSpec {
    /// The algorithm.
    #[serde(default)]
    pub algorithm: Algorithm,
    /// The acquisition function of `algorithm: gp`; `ucb` when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub acquisition: Option<AcquisitionKind>,
    /// The exploration weight of the `ucb` acquisition (it minimises mean − kappa·sd); 2.0 when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kappa: Option<f64>,
    /// Parameter name to parameter: its domain, step, scale and condition.
    #[serde(default, skip_serializing_if = "SpaceSpec::is_empty")]
    pub space: SpaceSpec,
    /// The metric that ranks trials.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metric: Option<String>,
    /// Whether smaller or larger metric values are better.
    #[serde(default)]
    pub mode: Mode,
    /// How many configurations random, sobol, gp and tpe search evaluate.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub trials: Option<u32>,
    /// At most this many trials of the experiment run at once; unlimited when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parallel: Option<u32>,
    /// Replicates per configuration, each with its own seed.
    #[serde(default = "one_u32")]
    pub seeds: u32,
    /// The seed of the sampler, and the first replicate's seed.
    #[serde(default)]
    pub seed: u64,
    /// A rule that stops unpromising trials early from their intermediate `metric` reports.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub early_stopping: Option<crate::stopping::StoppingConfig>,
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
        }
    }

    /// Whether each configuration depends on the results of earlier trials, so the
    /// trials cannot be planned up front and come one by one from a
    /// [`crate::search::Searcher`] instead.
    pub fn is_adaptive(self) -> bool {
        matches!(self, Self::Gp | Self::Tpe)
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
/// [`crate::search::SearchSpace::from_spec`] checks it.
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

impl ExperimentSpec {
    /// Parses and validates a YAML document.
    pub fn from_yaml(text: &str) -> Result<Self, SpecError> {
        if text.len() > MAX_SPEC_BYTES {
            return Err(SpecError::TooLarge {
                len: text.len(),
                max: MAX_SPEC_BYTES,
            });
        }
        let spec: Self = serde_saphyr::from_str(text).map_err(|error| SpecError::Parse {
            message: error.to_string(),
        })?;
        spec.validate()?;
        Ok(spec)
    }

    /// Parses and validates the canonical JSON form sent over the wire.
    pub fn from_json(text: &str) -> Result<Self, SpecError> {
        if text.len() > MAX_SPEC_BYTES {
            return Err(SpecError::TooLarge {
                len: text.len(),
                max: MAX_SPEC_BYTES,
            });
        }
        let spec: Self = serde_json::from_str(text).map_err(|error| SpecError::Parse {
            message: error.to_string(),
        })?;
        spec.validate()?;
        Ok(spec)
    }

    /// The canonical JSON form: fields in declaration order, maps sorted by key,
    /// memory as an integer. Equal specs give byte-equal JSON, which identity hashes.
    pub fn to_canonical_json(&self) -> String {
        serde_json::to_string(self).expect("a spec of plain data always serialises to JSON")
    }

    /// Checks every value, naming the first offending field.
    pub fn validate(&self) -> Result<(), SpecError> {
        check_label("name", &self.name)?;
        check_label("team", &self.team)?;
        if let Some(queue) = &self.queue {
            check_label("queue", queue)?;
        }
        if let Priority::Class(class) = &self.priority {
            check_label("priority", class)?;
        }
        self.trial.validate(&self.search)?;
        self.search.validate()?;
        if let Some(retention) = &self.checkpoints {
            if retention.keep_last == 0 || retention.keep_last > MAX_KEPT_CHECKPOINTS {
                return Err(invalid(
                    "checkpoints.keep_last",
                    format!(
                        "must be 1 to {MAX_KEPT_CHECKPOINTS}: the newest checkpoint is what a trial resumes from"
                    ),
                ));
            }
            if retention.keep_best > MAX_KEPT_CHECKPOINTS {
                return Err(invalid(
                    "checkpoints.keep_best",
                    format!("must be at most {MAX_KEPT_CHECKPOINTS}"),
                ));
            }
        }
        Ok(())
    }

    /// How many trials this experiment expands to.
    pub fn trial_count(&self) -> usize {
        let configs = match self.search.algorithm {
            Algorithm::Grid => self.search.grid_size().unwrap_or(usize::MAX),
            _ if self.search.space.is_empty() => self.search.trials.unwrap_or(1) as usize,
            _ => self.search.trials.unwrap_or(0) as usize,
        };
        configs.saturating_mul(self.search.seeds as usize)
    }
}

fn check_label(field: &str, value: &str) -> Result<(), SpecError> {
    if value.trim().is_empty() {
        return Err(invalid(field, "must not be empty"));
    }
    if value.len() > 128 {
        return Err(invalid(field, "must be at most 128 characters"));
    }
    if value.chars().any(char::is_control) {
        return Err(invalid(field, "must not contain control characters"));
    }
    Ok(())
}

impl TrialSpec {
    fn validate(&self, search: &SearchSpec) -> Result<(), SpecError> {
        match (&self.command, &self.entry) {
            (Some(_), Some(_)) => {
                return Err(invalid(
                    "trial",
                    "give either `command` or `entry`, not both",
                ));
            }
            (None, None) => return Err(invalid("trial", "needs a `command` or an `entry`")),
            (Some(argv), None) => {
                if argv.is_empty() {
                    return Err(invalid("trial.command", "must name a program"));
                }
                if argv.len() > 1024 || argv.iter().any(|arg| arg.len() > 16 * 1024) {
                    return Err(invalid("trial.command", "is too long"));
                }
                for (arg_idx, arg) in argv.iter().enumerate() {
                    for name in placeholders(arg)
                        .map_err(|reason| invalid(format!("trial.command[{arg_idx}]"), reason))?
                    {
                        if !search.space.contains_key(&name)
                            && !BUILTIN_PLACEHOLDERS.contains(&name.as_str())
                        {
                            return Err(invalid(
                                format!("trial.command[{arg_idx}]"),
                                format!(
                                    "placeholder {{{name}}} names no parameter of search.space (builtins: seed, trial_id, rank)"
                                ),
                            ));
                        }
                        if search
                            .space
                            .get(&name)
                            .is_some_and(ParamSpec::is_conditional)
                        {
                            return Err(invalid(
                                format!("trial.command[{arg_idx}]"),
                                format!(
                                    "placeholder {{{name}}} names a conditional parameter, which some trials lack; read it from XP_CONFIG instead"
                                ),
                            ));
                        }
                    }
                }
            }
            (None, Some(entry)) => check_label("trial.entry", entry)?,
        }
        if self.program.is_some() && self.entry.is_none() {
            return Err(invalid("trial.program", "is only meaningful with `entry`"));
        }
        if self.workers == 0 || self.workers > MAX_WORKERS {
            return Err(invalid(
                "trial.workers",
                format!("must be between 1 and {MAX_WORKERS}"),
            ));
        }
        let gpu = self.resources.gpu;
        if !(gpu.is_finite() && (0.0..=64.0).contains(&gpu)) {
            return Err(invalid("trial.resources.gpu", "must be between 0 and 64"));
        }
        if gpu > 1.0 && gpu.fract() != 0.0 {
            return Err(invalid(
                "trial.resources.gpu",
                "must be whole above 1 (a fraction shares one GPU, such as 0.25)",
            ));
        }
        if gpu > 0.0 && gpu < 0.001 {
            return Err(invalid(
                "trial.resources.gpu",
                "the smallest share is 0.001 of a GPU",
            ));
        }
        if let Some(limit) = &self.time_limit {
            match humantime::parse_duration(limit) {
                Ok(limit) if !limit.is_zero() => {}
                _ => {
                    return Err(invalid(
                        "trial.time_limit",
                        "must be a positive duration such as 90s, 30m or 2h",
                    ));
                }
            }
        }
        if self.gpu_models.len() > 64 || self.gpu_models.iter().any(|model| model.len() > 128) {
            return Err(invalid(
                "trial.gpu_models",
                "at most 64 names of at most 128 characters",
            ));
        }
        if self.node_labels.len() > 64
            || self
                .node_labels
                .iter()
                .any(|(key, value)| key.is_empty() || key.len() > 63 || value.len() > 253)
        {
            return Err(invalid(
                "trial.node_labels",
                "at most 64 labels; keys of 1-63 and values of at most 253 characters",
            ));
        }
        if !(self.resources.cpu.is_finite()
            && self.resources.cpu > 0.0
            && self.resources.cpu <= 4096.0)
        {
            return Err(invalid(
                "trial.resources.cpu",
                "must be a number in (0, 4096]",
            ));
        }
        if self.max_retries > 100 {
            return Err(invalid("trial.max_retries", "must be at most 100"));
        }
        Ok(())
    }

    /// CPU need in thousandths of a core, the unit nodes account in.
    pub fn milli_cpus(&self) -> u32 {
        (self.resources.cpu * 1000.0).ceil() as u32
    }

    /// GPU need in thousandths of a GPU per worker (1000 is one whole GPU).
    pub fn gpu_milli(&self) -> u64 {
        (self.resources.gpu * 1000.0).round() as u64
    }
}

/// Placeholders every command may use besides the search parameters.
pub const BUILTIN_PLACEHOLDERS: &[&str] = &["seed", "trial_id", "rank"];

/// The `{name}` placeholders of one argument; `{{` and `}}` are literal braces.
pub fn placeholders(arg: &str) -> Result<Vec<String>, String> {
    let mut names = Vec::new();
    render_arg(arg, |name| {
        names.push(name.to_owned());
        Some(String::new())
    })?;
    Ok(names)
}

/// Replaces each `{name}` in `arg` with `lookup(name)`; an unknown name is an error.
///
/// Only `{` + an identifier + `}` is a placeholder, so JSON and shell braces in a
/// command stay as they are (`${HOME}` too: a brace after `$` is the shell's);
/// `{{` and `}}` write a literal brace where one is needed before an identifier.
pub fn render_arg(
    arg: &str,
    mut lookup: impl FnMut(&str) -> Option<String>,
) -> Result<String, String> {
    let mut out = String::with_capacity(arg.len());
    let mut rest = arg;
    while let Some(ch) = rest.chars().next() {
        if rest.starts_with("{{") || rest.starts_with("}}") {
            out.push(ch);
            rest = &rest[2..];
            continue;
        }
        if ch == '{' && !out.ends_with('$') {
            let body = &rest[1..];
            let name_len = body
                .char_indices()
                .find(|(idx, inner)| {
                    !(inner.is_ascii_alphabetic()
                        || *inner == '_'
                        || (*idx > 0 && inner.is_ascii_digit()))
                })
                .map_or(body.len(), |(idx, _)| idx);
            if name_len > 0 && body[name_len..].starts_with('}') {
                let name = &body[..name_len];
                let value =
                    lookup(name).ok_or_else(|| format!("unknown placeholder {{{name}}}"))?;
                out.push_str(&value);
                rest = &body[name_len + 1..];
                continue;
            }
        }
        out.push(ch);
        rest = &rest[ch.len_utf8()..];
    }
    Ok(out)
}

impl SearchSpec {
    fn validate(&self) -> Result<(), SpecError> {
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
        if let Some(metric) = &self.metric {
            check_label("search.metric", metric)?;
        }
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

    /// The number of grid points (a conditional parameter multiplies only the points
    /// where it is active), or `None` when it overflows, a domain is continuous or
    /// the space is invalid.
    pub fn grid_size(&self) -> Option<usize> {
        SearchSpace::from_spec(&self.space).ok()?.grid_len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const GOOD: &str = r#"
name: digits
team: vision
trial:
  command: ["python", "train.py", "--lr", "{lr}", "--seed={seed}"]
  workers: 2
  resources: {gpu: 1, cpu: 2, memory: 4GiB}
  max_retries: 2
search:
  algorithm: random
  space:
    lr: {loguniform: [0.0001, 0.1]}
    hidden: {choice: [16, 32, 64]}
    depth: {int: [1, 4]}
    dropout: {uniform: [0.0, 0.5]}
  metric: val_acc
  mode: max
  trials: 16
  parallel: 4
"#;

    fn check_error(yaml: &str, expected_fragment: &str) {
        let error = ExperimentSpec::from_yaml(yaml)
            .expect_err("spec should be refused")
            .to_string();
        assert!(
            error.contains(expected_fragment),
            "error {error:?} lacks {expected_fragment:?}"
        );
    }

    #[test]
    fn a_full_spec_parses() {
        let spec = ExperimentSpec::from_yaml(GOOD).unwrap();
        assert_eq!(spec.trial.workers, 2);
        assert_eq!(spec.trial.resources.memory, MemoryBytes(4 << 30));
        assert_eq!(spec.trial.milli_cpus(), 2000);
        assert_eq!(spec.search.mode, Mode::Max);
        assert_eq!(spec.trial_count(), 16);
        assert_eq!(
            spec.search.space["hidden"].domain,
            Domain::Choice(vec![
                ParamValue::Int(16),
                ParamValue::Int(32),
                ParamValue::Int(64)
            ])
        );
    }

    #[test]
    fn canonical_json_round_trips_and_ignores_spelling() {
        let spec = ExperimentSpec::from_yaml(GOOD).unwrap();
        let json = spec.to_canonical_json();
        assert_eq!(ExperimentSpec::from_json(&json).unwrap(), spec);
        let respelled = GOOD.replace("memory: 4GiB", "memory: 4294967296");
        assert_eq!(
            ExperimentSpec::from_yaml(&respelled)
                .unwrap()
                .to_canonical_json(),
            json
        );
    }

    #[test]
    fn bad_specs_name_the_field() {
        check_error(&GOOD.replace("workers: 2", "workerz: 2"), "workerz");
        check_error(&GOOD.replace("workers: 2", "workerz: 2"), "line");
        check_error(&GOOD.replace("workers: 2", "workers: 0"), "trial.workers");
        check_error(
            &GOOD.replace("[0.0001, 0.1]", "[0.1, 0.0001]"),
            "search.space.lr",
        );
        check_error(&GOOD.replace("{lr}", "{learning_rate}"), "learning_rate");
        check_error(&GOOD.replace("memory: 4GiB", "memory: lots"), "memory");
        check_error(&GOOD.replace("trials: 16", "trials: 0"), "search.trials");
        check_error(
            &GOOD.replace("algorithm: random", "algorithm: grid"),
            "search.space.dropout",
        );
        check_error(&GOOD.replace("mode: max", "mode: biggest"), "biggest");
        check_error("name: [unclosed", "invalid experiment spec");
        check_error("name: x\ntrial: {}\n", "trial");
        assert_eq!(
            ExperimentSpec::from_yaml("name: x\ntrial: {command: [echo]}\n")
                .unwrap()
                .trial_count(),
            1
        );
    }

    #[test]
    fn grid_size_multiplies_discrete_domains() {
        let spec = ExperimentSpec::from_yaml(
            "name: g\ntrial: {command: [echo, '{a}', '{b}']}\nsearch:\n  algorithm: grid\n  space: {a: {int: [1, 3]}, b: {choice: [x, y]}}\n  seeds: 2\n",
        )
        .unwrap();
        assert_eq!(spec.trial_count(), 12);
    }

    #[test]
    fn placeholders_render_and_escape() {
        let render = |arg: &str| render_arg(arg, |name| (name == "lr").then(|| "0.1".to_owned()));
        assert_eq!(render("--lr={lr}").unwrap(), "--lr=0.1");
        assert_eq!(render("{{lr}}").unwrap(), "{lr}");
        assert!(render("{nope}").is_err());
        assert_eq!(render("{lr").unwrap(), "{lr");
        assert_eq!(render(r#"{"loss": {lr}}"#).unwrap(), r#"{"loss": 0.1}"#);
        assert_eq!(render("${HOME} {1x}").unwrap(), "${HOME} {1x}");
    }

    fn search_yaml(search: &str) -> String {
        format!("name: s\ntrial: {{command: [echo]}}\nsearch:\n{search}")
    }

    const CONDITIONAL: &str = "  algorithm: tpe\n  trials: 20\n  space:\n    optimizer: {choice: [sgd, adam]}\n    momentum: {uniform: [0.0, 0.99], when: {optimizer: [sgd]}}\n    layers: {int: [1, 8], step: 1, log: true}\n    width: {int: [16, 256], step: 16}\n    lr: {loguniform: [0.0001, 0.1]}\n";

    #[test]
    fn conditional_step_and_log_parameters_parse_and_serialise_canonically() {
        let yaml = search_yaml(CONDITIONAL);
        let spec = ExperimentSpec::from_yaml(&yaml).unwrap();
        let space = &spec.search.space;
        assert_eq!(
            space["momentum"],
            ParamSpec::uniform(0.0, 0.99).when("optimizer", ["sgd"])
        );
        assert_eq!(space["layers"], ParamSpec::int(1, 8).log());
        assert_eq!(space["width"], ParamSpec::int(16, 256).step(16));
        let json = spec.to_canonical_json();
        assert!(
            json.contains(
                r#""space":{"layers":{"int":[1,8],"log":true},"lr":{"loguniform":[0.0001,0.1]},"momentum":{"uniform":[0.0,0.99],"when":{"optimizer":["sgd"]}},"optimizer":{"choice":["sgd","adam"]},"width":{"int":[16,256],"step":16}}"#
            ),
            "{json}"
        );
        assert_eq!(ExperimentSpec::from_json(&json).unwrap(), spec);
        // Defaults are left out of the canonical form, so they do not change identity.
        let respelled = yaml.replace("step: 1, log: true", "log: true, step: 1");
        assert_eq!(
            ExperimentSpec::from_yaml(&respelled)
                .unwrap()
                .to_canonical_json(),
            json
        );
        let defaults = yaml.replace(
            "{int: [1, 8], step: 1, log: true}",
            "{int: [1, 8], log: true}",
        );
        assert_eq!(
            ExperimentSpec::from_yaml(&defaults)
                .unwrap()
                .to_canonical_json(),
            json
        );
    }

    #[test]
    fn plain_domains_keep_their_canonical_json() {
        let json = ExperimentSpec::from_yaml(GOOD).unwrap().to_canonical_json();
        assert!(
            json.contains(
                r#""search":{"algorithm":"random","space":{"depth":{"int":[1,4]},"dropout":{"uniform":[0.0,0.5]},"hidden":{"choice":[16,32,64]},"lr":{"loguniform":[0.0001,0.1]}},"metric":"val_acc""#
            ),
            "{json}"
        );
        let from_domains: SpaceSpec = [("a".to_owned(), Domain::Int([1, 2]))]
            .into_iter()
            .collect();
        assert_eq!(
            serde_json::to_string(&from_domains).unwrap(),
            r#"{"a":{"int":[1,2]}}"#
        );
    }

    #[test]
    fn bad_parameters_name_the_parameter() {
        let check = |params: &str, fragment: &str| {
            check_error(
                &search_yaml(&format!(
                    "  trials: 3\n  space:\n    opt: {{choice: [sgd, adam]}}\n{params}"
                )),
                fragment,
            );
        };
        let unknown_key = "    m: {uniform: [0, 1], whem: {opt: [sgd]}}\n";
        check(unknown_key, "search.space.m");
        check(unknown_key, "whem");
        check(unknown_key, "line");
        let unknown_parent = "    m: {uniform: [0, 1], when: {optt: [sgd]}}\n";
        check(unknown_parent, "search.space.m");
        check(unknown_parent, "unknown parameter `optt`");
        check(
            "    m: {uniform: [0, 1], when: {opt: [adamw]}}\n",
            "condition value adamw is not a value of `opt`",
        );
        check(
            "    a: {int: [0, 3], when: {b: [1]}}\n    b: {int: [0, 3], when: {a: [1]}}\n",
            "search.space.a`: conditions form a cycle",
        );
        check(
            "    k: {int: [0, 8], step: 0}\n",
            "search.space.k`: step must be at least 1",
        );
        check(
            "    k: {int: [0, 8], log: true}\n",
            "search.space.k`: a log scale needs bounds above 0",
        );
        check("    x: {uniform: [0, 1], step: 2}\n", "search.space.x");
        check(
            "    x: {uniform: [0, 1], log: true}\n",
            "`log` applies to `int`",
        );
        check("    x: {uniform: [0, 1], int: [0, 3]}\n", "exactly one of");
        check(
            "    x: {when: {opt: [sgd]}}\n",
            "search.space.x: needs one of",
        );
        check(
            "    m: {uniform: [0, 1], when: {opt: [sgd]}}\n    m2: {int: [1, 2], when: {m: [1]}}\n",
            "must be an int or choice",
        );
    }

    #[test]
    fn algorithms_and_their_options_are_checked() {
        let space = "  space: {x: {uniform: [0, 1]}}\n";
        check_error(
            &search_yaml(&format!("  algorithm: gp\n{space}")),
            "gp search needs the number of trials",
        );
        check_error(
            &search_yaml(&format!(
                "  algorithm: tpe\n  trials: 4\n  acquisition: ei\n{space}"
            )),
            "search.acquisition",
        );
        check_error(
            &search_yaml(&format!(
                "  algorithm: sobol\n  trials: 4\n  kappa: 1\n{space}"
            )),
            "search.kappa",
        );
        check_error(
            &search_yaml(&format!(
                "  algorithm: gp\n  trials: 4\n  acquisition: ei\n  kappa: 1\n{space}"
            )),
            "search.kappa",
        );
        check_error(
            &search_yaml(&format!(
                "  algorithm: gp\n  trials: 4\n  kappa: -1\n{space}"
            )),
            "search.kappa",
        );
        check_error(
            &search_yaml(&format!("  algorithm: bayes\n  trials: 4\n{space}")),
            "bayes",
        );
        for algorithm in ["sobol", "gp", "tpe"] {
            let spec = ExperimentSpec::from_yaml(&search_yaml(&format!(
                "  algorithm: {algorithm}\n  trials: 7\n  seeds: 2\n{space}"
            )))
            .unwrap();
            assert_eq!(spec.trial_count(), 14, "{algorithm}");
            assert_eq!(spec.search.algorithm.as_str(), algorithm);
            assert_eq!(spec.search.algorithm.is_adaptive(), algorithm != "sobol");
        }
    }

    #[test]
    fn conditional_parameters_cannot_be_placeholders() {
        check_error(
            "name: c\ntrial: {command: [echo, '{m}']}\nsearch:\n  trials: 2\n  space:\n    opt: {choice: [a, b]}\n    m: {int: [1, 2], when: {opt: [a]}}\n",
            "names a conditional parameter",
        );
    }

    #[test]
    fn grid_size_counts_conditional_parameters_where_active() {
        let spec = ExperimentSpec::from_yaml(&search_yaml(
            "  algorithm: grid\n  space:\n    opt: {choice: [sgd, adam]}\n    momentum: {int: [1, 3], when: {opt: [sgd]}}\n    width: {int: [0, 10], step: 5}\n",
        ))
        .unwrap();
        assert_eq!(spec.trial_count(), (3 + 1) * 3);
    }
}
