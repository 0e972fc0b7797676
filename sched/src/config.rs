//! The policy file: queues, cohorts, quotas, priority classes, aging, preemption,
//! placement, ordering, backfill and admission, plus the built-in presets.
//!
//! It only describes a policy; [`super::PolicyCore`] carries it out. Parsing is
//! strict: unknown fields are errors with the line and column from the YAML parser,
//! and [`PolicyConfig::validate`] names the queue and field of the first bad value.
//!
//! ```yaml
//! queues:                      # absent: one queue `default` open to every team
//!   - name: vision
//!     team: vision             # absent: the queue is open to every team
//!     cohort: research         # queues of one cohort lend each other idle quota
//!     weight: 2                # fair-share weight, > 0, default 1
//!     quota: {gpu: 8, cpu: 64, memory: 512GiB}
//!     borrowing_limit: {gpu: 8}
//!     lending_limit: {gpu: 4}
//! priority_classes: {low: 0, normal: 100, high: 1000}
//! aging: {rate_per_hour: 10, cap: 500}
//! preemption: {enabled: true, grace_period: 60s, min_run_time: 5m}
//! placement: binpack           # spread | random | fragmentation_aware
//! order: fair                  # fifo | priority
//! backfill: true
//! head_of_line: strict         # skip
//! admission: {max_pending_per_team: 10000, retry_after: 5s}
//! ```
//!
//! Choices, each with its reason:
//!
//! - A resource left out of `quota` is unlimited for that queue, and so is every
//!   resource of a queue without `quota`: writing `quota: {gpu: 8}` should limit
//!   GPUs, not silently forbid CPU. An unlimited resource neither borrows nor lends.
//! - `borrowing_limit` and `lending_limit` need a cohort and a finite quota for the
//!   resource they limit; a resource left out of them is not limited (borrow all the
//!   cohort has, lend all idle quota). A lending limit is at most the quota.
//! - A team's default queue is its first queue; a team with no queue of its own
//!   uses the queue named `default` when it is open to every team, else the first
//!   open queue.
//! - A section left out of a file is off or conservative: no aging, no preemption,
//!   no backfill, strict head of line, `fair` order, bin-packing. A `preemption`
//!   section that is present is enabled unless it says `enabled: false`.
//!   [`PolicyConfig::default`] is not the empty file but the `default` preset, the
//!   best policy we have.
//! - GPU and CPU amounts may be fractional (`gpu: 0.5`) and are kept in thousandths.
//! - Aging counts whole units: the boost is `floor(rate_per_hour × hours waited)`
//!   capped at `cap`, so effective priorities stay integers and orders stay exact.

use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};

use super::place::Strategy;

/// The largest policy document accepted, so a stray file cannot exhaust memory.
pub const MAX_POLICY_BYTES: usize = 1 << 20;

/// The resource names used in YAML, in quota errors and in [`super::WaitReason`],
/// indexed like the arrays the core keeps: GPU, CPU, memory.
pub const RESOURCE_NAMES: [&str; 3] = ["gpu", "cpu", "memory"];

/// The whole policy.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PolicyConfig {
    /// The queues, in declaration order (which breaks fair-share ties and picks a
    /// team's default queue).
    #[serde(default = "default_queues")]
    pub queues: Vec<QueueConfig>,
    /// Priority class names and their base priorities.
    #[serde(default = "default_priority_classes")]
    pub priority_classes: BTreeMap<String, i64>,
    /// Raises the effective priority of waiting trials; off when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub aging: Option<AgingConfig>,
    /// When running trials may be stopped for waiting ones.
    #[serde(default = "PreemptionConfig::off")]
    pub preemption: PreemptionConfig,
    /// How gangs are laid out on nodes.
    #[serde(default)]
    pub placement: PlacementKind,
    /// Which waiting trial goes next.
    #[serde(default)]
    pub order: Order,
    /// Lets trials with a known end start ahead of a blocked trial when they end
    /// before it could start anyway.
    #[serde(default)]
    pub backfill: bool,
    /// What happens behind a trial that cannot start, when not backfilling.
    #[serde(default)]
    pub head_of_line: HeadOfLine,
    /// Backpressure on submissions.
    #[serde(default)]
    pub admission: AdmissionConfig,
}

fn default_queues() -> Vec<QueueConfig> {
    vec![QueueConfig::open("default")]
}

fn default_priority_classes() -> BTreeMap<String, i64> {
    BTreeMap::from([
        ("low".to_owned(), 0),
        ("normal".to_owned(), 100),
        ("high".to_owned(), 1000),
    ])
}

/// One queue.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct QueueConfig {
    /// Unique among queues.
    pub name: String,
    /// The team whose trials it takes; `None` takes every team's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub team: Option<String>,
    /// Queues of one cohort lend each other their idle quota.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cohort: Option<String>,
    /// Fair-share weight; a queue of weight 2 gets twice the share of one of weight 1.
    #[serde(default = "one_f64")]
    pub weight: f64,
    /// Nominal quota; an absent resource is unlimited.
    #[serde(default)]
    pub quota: ResourceLimits,
    /// The most it may use beyond its quota, borrowed from its cohort.
    #[serde(default)]
    pub borrowing_limit: ResourceLimits,
    /// The most of its idle quota the rest of its cohort may use.
    #[serde(default)]
    pub lending_limit: ResourceLimits,
}

fn one_f64() -> f64 {
    1.0
}

impl QueueConfig {
    /// A queue open to every team, with no limits.
    pub fn open(name: &str) -> Self {
        Self {
            name: name.to_owned(),
            team: None,
            cohort: None,
            weight: 1.0,
            quota: ResourceLimits::default(),
            borrowing_limit: ResourceLimits::default(),
            lending_limit: ResourceLimits::default(),
        }
    }

    /// Whether trials of `team` may use it.
    pub fn accepts(&self, team: &str) -> bool {
        self.team.as_deref().is_none_or(|owner| owner == team)
    }
}

/// An amount per resource; `None` is unlimited (or, for limits, not limited).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ResourceLimits {
    /// GPU thousandths; YAML `gpu: 1.5`.
    #[serde(
        rename = "gpu",
        default,
        with = "thousandths",
        skip_serializing_if = "Option::is_none"
    )]
    pub gpu_milli: Option<u64>,
    /// CPU thousandths; YAML `cpu: 0.5`.
    #[serde(
        rename = "cpu",
        default,
        with = "thousandths",
        skip_serializing_if = "Option::is_none"
    )]
    pub cpu_milli: Option<u64>,
    /// Memory bytes; YAML `memory: 16GiB` or a plain integer.
    #[serde(
        rename = "memory",
        default,
        with = "memory_text",
        skip_serializing_if = "Option::is_none"
    )]
    pub memory_bytes: Option<u64>,
}

impl ResourceLimits {
    /// Limits in the core's resource order (GPU, CPU, memory).
    pub fn as_array(&self) -> [Option<u64>; 3] {
        [self.gpu_milli, self.cpu_milli, self.memory_bytes]
    }
}

/// Aging: effective priority = base + min(cap, floor(rate_per_hour × hours waited)).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AgingConfig {
    /// Priority points gained per hour of waiting.
    pub rate_per_hour: u64,
    /// The most aging adds.
    pub cap: u64,
}

impl AgingConfig {
    /// What aging adds after waiting `waited_ms`.
    pub fn boost(&self, waited_ms: u64) -> i64 {
        let gained = u128::from(self.rate_per_hour) * u128::from(waited_ms) / 3_600_000;
        let capped = gained.min(u128::from(self.cap));
        i64::try_from(capped).unwrap_or(i64::MAX)
    }
}

/// When running trials may be stopped for waiting ones.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PreemptionConfig {
    /// Whether preemption happens at all.
    #[serde(default = "yes")]
    pub enabled: bool,
    /// How long a victim may take to checkpoint before it is killed.
    #[serde(
        rename = "grace_period",
        default = "default_grace_ms",
        with = "duration_text"
    )]
    pub grace_period_ms: u64,
    /// A trial runs at least this long after each (re)start before it can be preempted.
    #[serde(
        rename = "min_run_time",
        default = "default_min_run_ms",
        with = "duration_text"
    )]
    pub min_run_time_ms: u64,
}

fn yes() -> bool {
    true
}

fn default_grace_ms() -> u64 {
    60_000
}

fn default_min_run_ms() -> u64 {
    300_000
}

impl PreemptionConfig {
    /// Preemption disabled, with the default durations.
    pub fn off() -> Self {
        Self {
            enabled: false,
            ..Self::on()
        }
    }

    /// Preemption enabled, 60 s grace, 5 min minimum run time.
    pub fn on() -> Self {
        Self {
            enabled: true,
            grace_period_ms: default_grace_ms(),
            min_run_time_ms: default_min_run_ms(),
        }
    }
}

/// How gangs are laid out on nodes; see [`Strategy`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum PlacementKind {
    /// Fill the fullest nodes first.
    #[default]
    #[serde(rename = "binpack")]
    BinPack,
    /// Prefer the emptiest nodes.
    Spread,
    /// Any fitting nodes (a baseline for `xp sim`); the seed comes from the core.
    Random,
    /// Bin-pack, keeping idle GPUs and nodes whole.
    FragmentationAware,
}

impl PlacementKind {
    /// The node pool's strategy; `seed` is used by [`PlacementKind::Random`] only.
    pub fn strategy(self, seed: u64) -> Strategy {
        match self {
            Self::BinPack => Strategy::BinPack,
            Self::Spread => Strategy::Spread,
            Self::Random => Strategy::Random { seed },
            Self::FragmentationAware => Strategy::FragmentationAware,
        }
    }
}

/// Which waiting trial goes next.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Order {
    /// Submission order over all queues; priorities are ignored.
    Fifo,
    /// Effective priority over all queues, then submission order.
    Priority,
    /// Between queues the lowest weighted dominant-resource share goes first;
    /// inside a queue, effective priority then submission order.
    #[default]
    Fair,
}

/// What happens behind a trial that cannot start, when not backfilling.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum HeadOfLine {
    /// Nothing behind it starts (per queue with `order: fair`; over all queues
    /// otherwise, except that a trial held back by its own queue's quota stops only
    /// that queue).
    #[default]
    Strict,
    /// The next trials are tried; big gangs may starve.
    Skip,
}

/// Backpressure on submissions.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AdmissionConfig {
    /// The most waiting (or held) trials a team may have.
    #[serde(default = "default_max_pending")]
    pub max_pending_per_team: u64,
    /// The retry hint given with a refusal.
    #[serde(
        rename = "retry_after",
        default = "default_retry_ms",
        with = "duration_text"
    )]
    pub retry_after_ms: u64,
}

fn default_max_pending() -> u64 {
    10_000
}

fn default_retry_ms() -> u64 {
    5_000
}

impl Default for AdmissionConfig {
    fn default() -> Self {
        Self {
            max_pending_per_team: default_max_pending(),
            retry_after_ms: default_retry_ms(),
        }
    }
}

/// Why a policy file is rejected, or a new policy cannot replace the old one.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PolicyError {
    /// The document is not valid YAML for this schema; the message carries the
    /// line and column.
    #[error("invalid policy file: {message}")]
    Parse {
        /// The parser's message, with the location it points at.
        message: String,
    },
    /// The document is larger than [`MAX_POLICY_BYTES`].
    #[error("policy file is {len} bytes, more than the limit of {max}")]
    TooLarge {
        /// The document's size.
        len: usize,
        /// The limit.
        max: usize,
    },
    /// A field has a value outside what is allowed.
    #[error("invalid value for `{field}`: {reason}")]
    Invalid {
        /// Where, such as `queues[vision].lending_limit.gpu`.
        field: String,
        /// What is wrong with it.
        reason: String,
    },
    /// A new policy drops a queue that holds trials, and no queue of the new
    /// policy takes their team's work.
    #[error(
        "queue {queue} holds trials of team {team}, and the new policy has no queue for that team"
    )]
    NoQueueForTeam {
        /// The team.
        team: String,
        /// The queue that disappears.
        queue: String,
    },
}

fn invalid(field: impl Into<String>, reason: impl Into<String>) -> PolicyError {
    PolicyError::Invalid {
        field: field.into(),
        reason: reason.into(),
    }
}

impl Default for PolicyConfig {
    /// The `default` preset.
    fn default() -> Self {
        Self::preset("default").expect("the default preset exists")
    }
}

impl PolicyConfig {
    /// The names [`PolicyConfig::preset`] knows.
    pub const PRESETS: [&'static str; 5] = ["fifo", "priority", "fair", "backfill", "default"];

    /// What an empty policy file means: one open queue, fair order, strict head of
    /// line, nothing else.
    pub fn base() -> Self {
        Self {
            queues: default_queues(),
            priority_classes: default_priority_classes(),
            aging: None,
            preemption: PreemptionConfig::off(),
            placement: PlacementKind::BinPack,
            order: Order::Fair,
            backfill: false,
            head_of_line: HeadOfLine::Strict,
            admission: AdmissionConfig::default(),
        }
    }

    /// A built-in policy:
    ///
    /// - `fifo`: submission order, strict head of line, no backfill, no preemption.
    /// - `priority`: priority order, strict, no backfill, preemption by priority.
    /// - `fair`: weighted dominant-resource fair share between queues, strict per queue.
    /// - `backfill`: `fair` plus backfill.
    /// - `default`: `backfill` plus preemption, aging (10 per hour up to 500) and
    ///   fragmentation-aware placement.
    pub fn preset(name: &str) -> Option<Self> {
        let base = Self::base();
        let config = match name {
            "fifo" => Self {
                order: Order::Fifo,
                ..base
            },
            "priority" => Self {
                order: Order::Priority,
                preemption: PreemptionConfig::on(),
                ..base
            },
            "fair" => base,
            "backfill" => Self {
                backfill: true,
                ..base
            },
            "default" => Self {
                backfill: true,
                preemption: PreemptionConfig::on(),
                aging: Some(AgingConfig {
                    rate_per_hour: 10,
                    cap: 500,
                }),
                placement: PlacementKind::FragmentationAware,
                ..base
            },
            _ => return None,
        };
        Some(config)
    }

    /// Parses and validates a YAML policy document.
    pub fn from_yaml(text: &str) -> Result<Self, PolicyError> {
        if text.len() > MAX_POLICY_BYTES {
            return Err(PolicyError::TooLarge {
                len: text.len(),
                max: MAX_POLICY_BYTES,
            });
        }
        // An empty document (or one with only comments) is the empty policy.
        let config: Self = if text.lines().all(|line| {
            let line = line.trim();
            line.is_empty() || line.starts_with('#') || line == "---"
        }) {
            Self::base()
        } else {
            serde_saphyr::from_str(text).map_err(|error| PolicyError::Parse {
                message: error.to_string(),
            })?
        };
        config.validate()?;
        Ok(config)
    }

    /// The base priority of a priority class.
    pub fn priority_value(&self, class_name: &str) -> Option<i64> {
        self.priority_classes.get(class_name).copied()
    }

    /// The queue named `name`.
    pub fn queue(&self, name: &str) -> Option<&QueueConfig> {
        self.queues.iter().find(|queue| queue.name == name)
    }

    /// The queue a team's trials go to when they name none: its first own queue,
    /// else the open queue named `default`, else the first open queue.
    pub fn default_queue_for(&self, team: &str) -> Option<&QueueConfig> {
        self.queues
            .iter()
            .find(|queue| queue.team.as_deref() == Some(team))
            .or_else(|| {
                self.queues
                    .iter()
                    .find(|queue| queue.name == "default" && queue.team.is_none())
            })
            .or_else(|| self.queues.iter().find(|queue| queue.team.is_none()))
    }

    /// Checks every value, naming the first offending queue and field.
    pub fn validate(&self) -> Result<(), PolicyError> {
        if self.queues.is_empty() {
            return Err(invalid(
                "queues",
                "declare at least one queue, or leave `queues` out for one open queue",
            ));
        }
        let mut names = BTreeSet::new();
        for (index, queue) in self.queues.iter().enumerate() {
            if queue.name.trim().is_empty() {
                return Err(invalid(
                    format!("queues[{index}].name"),
                    "must not be empty",
                ));
            }
            let at = |field: &str| format!("queues[{}].{field}", queue.name);
            if !names.insert(queue.name.as_str()) {
                return Err(invalid(at("name"), "another queue has this name"));
            }
            if queue
                .team
                .as_deref()
                .is_some_and(|team| team.trim().is_empty())
            {
                return Err(invalid(
                    at("team"),
                    "must not be empty; leave it out for an open queue",
                ));
            }
            if queue
                .cohort
                .as_deref()
                .is_some_and(|cohort| cohort.trim().is_empty())
            {
                return Err(invalid(at("cohort"), "must not be empty"));
            }
            if !(queue.weight.is_finite() && queue.weight > 0.0) {
                return Err(invalid(
                    at("weight"),
                    format!("{} is not a positive number", queue.weight),
                ));
            }
            let quota = queue.quota.as_array();
            for (limits, what) in [
                (&queue.borrowing_limit, "borrowing_limit"),
                (&queue.lending_limit, "lending_limit"),
            ] {
                for (resource, limit) in limits.as_array().into_iter().enumerate() {
                    let Some(limit) = limit else { continue };
                    let field = at(&format!("{what}.{}", RESOURCE_NAMES[resource]));
                    if queue.cohort.is_none() {
                        return Err(invalid(field, "only a queue in a cohort borrows or lends"));
                    }
                    let Some(nominal) = quota[resource] else {
                        return Err(invalid(
                            field,
                            "the quota of this resource is unlimited, so there is nothing to limit",
                        ));
                    };
                    if what == "lending_limit" && limit > nominal {
                        return Err(invalid(
                            field,
                            format!("{limit} is more than the quota {nominal}"),
                        ));
                    }
                }
            }
        }
        for name in self.priority_classes.keys() {
            if name.trim().is_empty() {
                return Err(invalid(
                    "priority_classes",
                    "a class name must not be empty",
                ));
            }
        }
        if self.admission.max_pending_per_team == 0 {
            return Err(invalid(
                "admission.max_pending_per_team",
                "must be at least 1",
            ));
        }
        Ok(())
    }
}

/// Fractional amounts in YAML (`1.5`), thousandths inside.
mod thousandths {
    use serde::{Deserialize, Deserializer, Serializer};

    pub(super) fn serialize<S: Serializer>(
        value: &Option<u64>,
        serializer: S,
    ) -> Result<S::Ok, S::Error> {
        match value {
            // Whole amounts are written as integers so that files round-trip as written.
            Some(milli) if milli.is_multiple_of(1000) => serializer.serialize_u64(milli / 1000),
            Some(milli) => serializer.serialize_f64(*milli as f64 / 1000.0),
            None => serializer.serialize_none(),
        }
    }

    pub(super) fn deserialize<'de, D: Deserializer<'de>>(
        deserializer: D,
    ) -> Result<Option<u64>, D::Error> {
        let amount = f64::deserialize(deserializer)?;
        from_amount(amount)
            .map(Some)
            .map_err(serde::de::Error::custom)
    }

    pub(super) fn from_amount(amount: f64) -> Result<u64, String> {
        if !amount.is_finite() || amount < 0.0 {
            return Err(format!("{amount} is not a non-negative amount"));
        }
        let milli = (amount * 1000.0).round();
        if (amount * 1000.0 - milli).abs() > 1e-6 {
            return Err(format!("{amount} has more than three decimals"));
        }
        if milli >= u64::MAX as f64 {
            return Err(format!("{amount} is too large"));
        }
        Ok(milli as u64)
    }
}

/// Memory in YAML as `16GiB` or a plain byte count.
mod memory_text {
    use serde::{Deserialize, Deserializer, Serializer};
    use xp_runtime::spec::MemoryBytes;

    pub(super) fn serialize<S: Serializer>(
        value: &Option<u64>,
        serializer: S,
    ) -> Result<S::Ok, S::Error> {
        match value {
            Some(bytes) => serializer.serialize_u64(*bytes),
            None => serializer.serialize_none(),
        }
    }

    pub(super) fn deserialize<'de, D: Deserializer<'de>>(
        deserializer: D,
    ) -> Result<Option<u64>, D::Error> {
        Ok(Some(MemoryBytes::deserialize(deserializer)?.0))
    }
}

/// Durations in YAML as `60s`, `5m`, `1h 30m`; milliseconds inside.
mod duration_text {
    use serde::{Deserialize, Deserializer, Serializer};

    pub(super) fn serialize<S: Serializer>(value: &u64, serializer: S) -> Result<S::Ok, S::Error> {
        let text = humantime::format_duration(std::time::Duration::from_millis(*value));
        serializer.serialize_str(&text.to_string())
    }

    pub(super) fn deserialize<'de, D: Deserializer<'de>>(deserializer: D) -> Result<u64, D::Error> {
        let text = String::deserialize(deserializer)?;
        let duration = humantime::parse_duration(text.trim()).map_err(|error| {
            serde::de::Error::custom(format!(
                "{text:?} is not a duration like 60s or 5m: {error}"
            ))
        })?;
        u64::try_from(duration.as_millis())
            .map_err(|_| serde::de::Error::custom(format!("{text:?} is too long")))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check_ok(text: &str, expected: &dyn Fn(&PolicyConfig) -> bool) {
        let config = PolicyConfig::from_yaml(text).unwrap();
        assert!(expected(&config), "unexpected {config:#?}");
    }

    fn check_error(text: &str, needle: &str) {
        let error = PolicyConfig::from_yaml(text).unwrap_err().to_string();
        assert!(
            error.contains(needle),
            "{error:?} does not mention {needle:?}"
        );
    }

    const FULL: &str = "
queues:
  - name: vision
    team: vision
    cohort: research
    weight: 2
    quota: {gpu: 8, cpu: 64, memory: 512GiB}
    borrowing_limit: {gpu: 8}
    lending_limit: {gpu: 4}
  - name: nlp
    team: nlp
    cohort: research
    quota: {gpu: 0.5}
priority_classes: {low: 0, normal: 100, high: 1000}
aging: {rate_per_hour: 10, cap: 500}
preemption: {enabled: true, grace_period: 60s, min_run_time: 5m}
placement: fragmentation_aware
order: priority
backfill: true
head_of_line: skip
admission: {max_pending_per_team: 100, retry_after: 5s}
";

    #[test]
    fn full_file_parses() {
        let config = PolicyConfig::from_yaml(FULL).unwrap();
        let vision = config.queue("vision").unwrap();
        assert_eq!(vision.weight, 2.0);
        assert_eq!(vision.quota.gpu_milli, Some(8000));
        assert_eq!(vision.quota.cpu_milli, Some(64_000));
        assert_eq!(vision.quota.memory_bytes, Some(512 << 30));
        assert_eq!(vision.borrowing_limit.gpu_milli, Some(8000));
        assert_eq!(vision.lending_limit.gpu_milli, Some(4000));
        assert_eq!(vision.lending_limit.cpu_milli, None);
        assert_eq!(config.queue("nlp").unwrap().quota.gpu_milli, Some(500));
        assert_eq!(config.queue("nlp").unwrap().weight, 1.0);
        assert_eq!(config.preemption.grace_period_ms, 60_000);
        assert_eq!(config.preemption.min_run_time_ms, 300_000);
        assert_eq!(config.admission.retry_after_ms, 5_000);
        assert_eq!(config.placement, PlacementKind::FragmentationAware);
        assert_eq!(config.order, Order::Priority);
        assert_eq!(config.head_of_line, HeadOfLine::Skip);
        assert!(config.backfill);
        assert_eq!(config.aging.unwrap().boost(3_600_000 * 3), 30);
        assert_eq!(config.aging.unwrap().boost(3_600_000 * 100), 500);
        assert_eq!(config.priority_value("high"), Some(1000));
        assert_eq!(config.priority_value("urgent"), None);
    }

    #[test]
    fn empty_and_partial_files() {
        check_ok("", &|config| *config == PolicyConfig::base());
        check_ok("# nothing\n", &|config| *config == PolicyConfig::base());
        check_ok("backfill: true\n", &|config| {
            config.backfill && config.queues == default_queues() && !config.preemption.enabled
        });
        check_ok("preemption: {grace_period: 30s}\n", &|config| {
            config.preemption.enabled
                && config.preemption.grace_period_ms == 30_000
                && config.preemption.min_run_time_ms == 300_000
        });
        check_ok("placement: binpack\norder: fifo\n", &|config| {
            config.placement == PlacementKind::BinPack && config.order == Order::Fifo
        });
        check_ok("queues: [{name: a, quota: {memory: 1024}}]\n", &|config| {
            config.queues[0].quota.memory_bytes == Some(1024) && config.queues[0].team.is_none()
        });
    }

    #[test]
    fn parse_errors_name_field_and_place() {
        check_error("backfil: true\n", "backfil");
        check_error("backfil: true\n", "line");
        check_error("queues:\n  - name: a\n    quota: {gpus: 1}\n", "gpus");
        check_error("order: random\n", "random");
        check_error("placement: tetris\n", "tetris");
        check_error("preemption: {grace_period: soon}\n", "soon");
        check_error(
            "queues: [{name: a, quota: {gpu: 0.0005}}]\n",
            "three decimals",
        );
        check_error("queues: [{name: a, quota: {gpu: -1}}]\n", "non-negative");
        check_error("queues: [{name: a, quota: {memory: lots}}]\n", "lots");
        check_error(&"#".repeat(MAX_POLICY_BYTES + 1), "limit");
    }

    #[test]
    fn validation_names_queue_and_field() {
        check_error("queues: []\n", "`queues`");
        check_error("queues: [{name: a}, {name: a}]\n", "queues[a].name");
        check_error("queues: [{name: ''}]\n", "queues[0].name");
        check_error("queues: [{name: a, weight: 0}]\n", "queues[a].weight");
        check_error("queues: [{name: a, team: ''}]\n", "queues[a].team");
        check_error(
            "queues: [{name: a, quota: {gpu: 1}, borrowing_limit: {gpu: 1}}]\n",
            "queues[a].borrowing_limit.gpu",
        );
        check_error(
            "queues: [{name: a, cohort: c, borrowing_limit: {cpu: 1}}]\n",
            "queues[a].borrowing_limit.cpu",
        );
        check_error(
            "queues: [{name: a, cohort: c, quota: {gpu: 2}, lending_limit: {gpu: 3}}]\n",
            "queues[a].lending_limit.gpu",
        );
        check_error(
            "admission: {max_pending_per_team: 0}\n",
            "admission.max_pending_per_team",
        );
    }

    #[test]
    fn presets() {
        for name in PolicyConfig::PRESETS {
            let config = PolicyConfig::preset(name).unwrap();
            config.validate().unwrap();
        }
        assert!(PolicyConfig::preset("tetris").is_none());
        let fifo = PolicyConfig::preset("fifo").unwrap();
        assert_eq!(fifo.order, Order::Fifo);
        assert!(!fifo.backfill && !fifo.preemption.enabled);
        assert_eq!(fifo.head_of_line, HeadOfLine::Strict);
        let priority = PolicyConfig::preset("priority").unwrap();
        assert!(priority.preemption.enabled && priority.order == Order::Priority);
        let fair = PolicyConfig::preset("fair").unwrap();
        assert!(fair.order == Order::Fair && !fair.backfill);
        assert!(PolicyConfig::preset("backfill").unwrap().backfill);
        let default = PolicyConfig::default();
        assert!(default.backfill && default.preemption.enabled && default.aging.is_some());
        assert_eq!(default.order, Order::Fair);
    }

    #[test]
    fn default_queue_resolution() {
        let config = PolicyConfig::from_yaml(
            "queues: [{name: shared}, {name: v1, team: vision}, {name: v2, team: vision}, {name: default}]\n",
        )
        .unwrap();
        assert_eq!(config.default_queue_for("vision").unwrap().name, "v1");
        assert_eq!(config.default_queue_for("nlp").unwrap().name, "default");
        let config = PolicyConfig::from_yaml("queues: [{name: v, team: vision}]\n").unwrap();
        assert!(config.default_queue_for("nlp").is_none());
        assert!(!config.queues[0].accepts("nlp"));
    }

    #[test]
    fn round_trips_through_yaml() {
        let config = PolicyConfig::from_yaml(FULL).unwrap();
        let text = serde_saphyr::to_string(&config).unwrap();
        assert_eq!(PolicyConfig::from_yaml(&text).unwrap(), config);
    }
}
