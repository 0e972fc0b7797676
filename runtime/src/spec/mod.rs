//! The experiment specification: what a user declares in YAML or builds in code.
//!
//! Parsing is strict (unknown fields are errors, with line and column from the YAML
//! parser) and [`ExperimentSpec::validate`] checks every value, naming the field.
//! The spec crosses the wire as canonical JSON (see [`ExperimentSpec::to_canonical_json`]),
//! because its parameter values are dynamically typed and bincode is not self-describing.

use serde::{Deserialize, Serialize};

mod alerts;
mod bohb;
mod objectives;
mod pipeline;
mod render;
mod search;
mod space;
mod stopping;
mod trial;

pub use alerts::{
    AlertAction, AlertCondition, AlertKind, AlertRule, DEFAULT_DIVERGENCE_FACTOR,
    DEFAULT_GPU_BELOW, DEFAULT_GPU_FOR_MS, DEFAULT_MIN_STEPS, DEFAULT_SMOOTHING, MAX_ALERT_ACTIONS,
    MAX_ALERT_RULES, MAX_FOR_MS, MAX_WEBHOOK_URL, WebhookUrlError, check_webhook_url,
    effective_rules, validate_alert_rules,
};
pub use bohb::{
    BohbError, BohbSpec, DEFAULT_BOHB_REDUCTION_FACTOR, DEFAULT_MAX_BUDGET, DEFAULT_MIN_BUDGET,
};
pub use objectives::{MAX_OBJECTIVES, Objective};
pub use pipeline::{
    MAX_STAGE_NAME, MAX_STAGES, PipelineSpec, RefKind, StageRef, StageSpec, input_dir_name,
    input_marker, is_stage_name,
};
pub use render::{BUILTIN_PLACEHOLDERS, RenderError, placeholders, render_arg};
pub use search::{
    AcquisitionKind, Algorithm, Domain, MetricValue, Mode, ParamSpec, ParamValue, SearchSpec,
    SpaceSpec, TpeSpec,
};
pub use space::{
    Condition, Config, Param, ParamError, ParamKind, SearchSpace, SpaceBuilder, SpaceError,
};
pub use stopping::{
    DEFAULT_BRACKETS, DEFAULT_GRACE_PERIOD, DEFAULT_MAX_T, DEFAULT_MIN_SAMPLES,
    DEFAULT_REDUCTION_FACTOR, RuleKind, StoppingConfig, StoppingError,
};
pub use trial::{
    CollectiveTransport, LeaseNameError, MAX_LEASE_NAME_BYTES, MAX_LEASE_UNITS,
    MAX_OVERSUBSCRIPTION_MILLI, MAX_TRIAL_LEASES, MemoryBytes, MemoryError, Resources, TrialSpec,
    Workers, check_lease_name, oversubscribed_charge, parse_memory,
};

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
    /// Alert rules on its trials (see `alerts`); the policy's defaults and the
    /// built-in `nonfinite` rule apply besides. Left out of the canonical JSON
    /// when empty, so the identity of a spec without alerts is unchanged.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub alerts: Vec<AlertRule>,
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
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(untagged)]
pub enum Priority {
    /// A literal priority.
    Value(i64),
    /// A priority class such as `high`.
    Class(String),
}

impl<'de> Deserialize<'de> for Priority {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_any(PriorityVisitor)
    }
}

/// Reads `priority` as a whole number or a class name, and says which forms it
/// takes when given anything else (a fraction, a number out of range, a list).
struct PriorityVisitor;

impl PriorityVisitor {
    fn refuse<E: serde::de::Error>(given: impl std::fmt::Display) -> E {
        E::custom(format!(
            "priority must be a whole number between {} and {} (such as 10) or a class name (such as high); got {given}",
            i64::MIN,
            i64::MAX
        ))
    }
}

impl serde::de::Visitor<'_> for PriorityVisitor {
    type Value = Priority;

    fn expecting(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter
            .write_str("priority to be a whole number (such as 10) or a class name (such as high)")
    }

    fn visit_i64<E: serde::de::Error>(self, value: i64) -> Result<Priority, E> {
        Ok(Priority::Value(value))
    }

    fn visit_u64<E: serde::de::Error>(self, value: u64) -> Result<Priority, E> {
        i64::try_from(value)
            .map(Priority::Value)
            .map_err(|_| Self::refuse(value))
    }

    fn visit_f64<E: serde::de::Error>(self, value: f64) -> Result<Priority, E> {
        Err(Self::refuse(value))
    }

    fn visit_str<E: serde::de::Error>(self, class: &str) -> Result<Priority, E> {
        Ok(Priority::Class(class.to_owned()))
    }
}

impl Default for Priority {
    fn default() -> Self {
        Self::Value(0)
    }
}

impl Priority {
    pub(crate) fn is_default(&self) -> bool {
        *self == Self::Value(0)
    }
}

/// The team of a spec that names none.
pub const DEFAULT_TEAM: &str = "default";

pub(crate) fn default_team() -> String {
    DEFAULT_TEAM.to_owned()
}

/// The two text forms a spec arrives in.
pub(crate) enum Format {
    /// A user's file.
    Yaml,
    /// The canonical form sent over the wire.
    Json,
}

/// Parses a spec of at most `MAX_SPEC_BYTES`, checked before any parsing.
pub(crate) fn parse_bounded<T: serde::de::DeserializeOwned>(
    text: &str,
    format: Format,
) -> Result<T, SpecError> {
    if text.len() > MAX_SPEC_BYTES {
        return Err(SpecError::TooLarge {
            len: text.len(),
            max: MAX_SPEC_BYTES,
        });
    }
    let parsed = match format {
        Format::Yaml => objectives::yaml_with_text_names(text),
        Format::Json => serde_json::from_str(text).map_err(|error| error.to_string()),
    };
    parsed.map_err(|message| SpecError::Parse { message })
}

/// Checks what experiments and pipelines both carry: name, team, queue and
/// priority class.
pub(crate) fn check_header(
    name: &str,
    team: &str,
    queue: Option<&str>,
    priority: &Priority,
) -> Result<(), SpecError> {
    check_label("name", name)?;
    check_label("team", team)?;
    if let Some(queue) = queue {
        check_label("queue", queue)?;
    }
    if let Priority::Class(class) = priority {
        check_label("priority", class)?;
    }
    Ok(())
}

impl ExperimentSpec {
    /// Parses and validates a YAML document.
    pub fn from_yaml(text: &str) -> Result<Self, SpecError> {
        let spec: Self = parse_bounded(text, Format::Yaml)?;
        spec.validate()?;
        Ok(spec)
    }

    /// Parses and validates the canonical JSON form sent over the wire.
    pub fn from_json(text: &str) -> Result<Self, SpecError> {
        let spec: Self = parse_bounded(text, Format::Json)?;
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
        check_header(
            &self.name,
            &self.team,
            self.queue.as_deref(),
            &self.priority,
        )?;
        self.trial.validate(&self.search)?;
        self.search.validate()?;
        validate_alert_rules(&self.alerts, "alerts")?;
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

#[cfg(test)]
mod tests;
