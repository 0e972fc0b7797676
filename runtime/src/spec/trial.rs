//! What each trial runs and what it needs: the command or Rust entry, workers,
//! resources and retries, and their validation against the search space.

use std::collections::BTreeMap;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

use super::{
    BUILTIN_PLACEHOLDERS, MAX_WORKERS, ParamSpec, SearchSpec, SpecError, check_label, invalid,
    placeholders,
};

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
    /// The directory a command's relative paths are found in: its program when
    /// written with a slash (`./train.sh`) and each argument that names a file
    /// or directory there (`train.py`, `data/digits`) are passed as absolute
    /// paths under it. Clients fill it in with the spec file's directory (their
    /// own when the spec is not a file); relative, it is taken from there. Not
    /// part of identity: where a copy of the same code lies is not what it is.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub command_dir: Option<String>,
    /// Data-parallel workers started together as a gang: a number, or
    /// `{min, max}` for an elastic trial whose gang the scheduler resizes.
    #[serde(default)]
    pub workers: Workers,
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
            command_dir: None,
            workers: Workers::fixed(1),
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
    /// Sets `command_dir` for a command submitted from `base`, an absolute
    /// directory (the spec file's): `base` itself, or the spec's own
    /// `command_dir` taken from there. Nothing changes for an `entry` trial, nor
    /// where the path is not UTF-8 (its relative paths are then found in the
    /// worker's directory).
    pub fn fill_command_dir(&mut self, base: &std::path::Path) {
        if self.command.is_none() || !base.is_absolute() {
            return;
        }
        let dir = match &self.command_dir {
            Some(dir) => base.join(dir),
            None => base.to_owned(),
        };
        let dir: std::path::PathBuf = dir.components().collect();
        if let Some(dir) = dir.to_str() {
            self.command_dir = Some(dir.to_owned());
        }
    }

    /// The time limit in milliseconds, if one is set and valid.
    pub fn time_limit_ms(&self) -> Option<u64> {
        self.time_limit
            .as_deref()
            .and_then(|text| humantime::parse_duration(text).ok())
            .map(|limit| u64::try_from(limit.as_millis()).unwrap_or(u64::MAX))
    }
}

/// How many workers a trial's gang has: a fixed number, or a range the
/// scheduler moves within (an elastic trial: it starts with as many as fit, at
/// least `min`, grows into idle GPUs and shrinks back to `min` before it is
/// preempted). Written as a plain number when fixed, so the canonical JSON, and
/// with it the identity, of every spec that predates elastic trials is unchanged.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Workers {
    /// The fewest workers it runs with.
    pub min: u32,
    /// The most workers it runs with; the size of a fixed gang.
    pub max: u32,
}

impl Workers {
    /// A gang of exactly `count` workers.
    pub const fn fixed(count: u32) -> Self {
        Self {
            min: count,
            max: count,
        }
    }

    /// Whether the scheduler may change the gang's size.
    pub fn is_elastic(&self) -> bool {
        self.min != self.max
    }
}

impl Default for Workers {
    fn default() -> Self {
        Self::fixed(1)
    }
}

impl From<u32> for Workers {
    fn from(count: u32) -> Self {
        Self::fixed(count)
    }
}

impl std::fmt::Display for Workers {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.is_elastic() {
            write!(f, "{}-{}", self.min, self.max)
        } else {
            write!(f, "{}", self.max)
        }
    }
}

impl Serialize for Workers {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeStruct;
        if !self.is_elastic() {
            return serializer.serialize_u32(self.max);
        }
        let mut range = serializer.serialize_struct("Workers", 2)?;
        range.serialize_field("min", &self.min)?;
        range.serialize_field("max", &self.max)?;
        range.end()
    }
}

impl<'de> Deserialize<'de> for Workers {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_any(WorkersVisitor)
    }
}

/// Reads `workers` as a whole number or `{min, max}`, refusing anything else
/// (a fraction, a negative number, unknown or missing keys) with the forms it
/// takes; the range itself is checked by `validate`, which names the field.
struct WorkersVisitor;

impl WorkersVisitor {
    fn refuse<E: serde::de::Error>(given: impl std::fmt::Display) -> E {
        E::custom(format!(
            "workers must be a whole number or {{min: N, max: M}}; got {given}"
        ))
    }
}

impl<'de> serde::de::Visitor<'de> for WorkersVisitor {
    type Value = Workers;

    fn expecting(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter.write_str("workers as a whole number or {min: N, max: M}")
    }

    fn visit_u64<E: serde::de::Error>(self, count: u64) -> Result<Workers, E> {
        u32::try_from(count)
            .map(Workers::fixed)
            .map_err(|_| Self::refuse(count))
    }

    fn visit_i64<E: serde::de::Error>(self, count: i64) -> Result<Workers, E> {
        u32::try_from(count)
            .map(Workers::fixed)
            .map_err(|_| Self::refuse(count))
    }

    fn visit_f64<E: serde::de::Error>(self, count: f64) -> Result<Workers, E> {
        Err(Self::refuse(count))
    }

    fn visit_str<E: serde::de::Error>(self, text: &str) -> Result<Workers, E> {
        Err(Self::refuse(format!("{text:?}")))
    }

    fn visit_map<A: serde::de::MapAccess<'de>>(self, mut map: A) -> Result<Workers, A::Error> {
        use serde::de::Error;
        let (mut min, mut max) = (None, None);
        while let Some(key) = map.next_key::<String>()? {
            let slot = match key.as_str() {
                "min" => &mut min,
                "max" => &mut max,
                other => {
                    return Err(A::Error::unknown_field(other, &["min", "max"]));
                }
            };
            if slot.is_some() {
                return Err(A::Error::custom(format!(
                    "duplicate key `{key}` in workers"
                )));
            }
            *slot = Some(map.next_value::<u32>()?);
        }
        match (min, max) {
            (Some(min), Some(max)) => Ok(Workers { min, max }),
            _ => Err(A::Error::custom(
                "elastic workers need both `min` and `max`, such as {min: 2, max: 8}",
            )),
        }
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

pub(super) fn one_u32() -> u32 {
    1
}

/// The most leases one trial names.
pub const MAX_TRIAL_LEASES: usize = 16;
/// The longest lease name.
pub const MAX_LEASE_NAME_BYTES: usize = 64;
/// The most units of one lease: its largest capacity, and the most one trial asks.
pub const MAX_LEASE_UNITS: u64 = 1 << 32;

/// Why a lease name is refused: empty, too long, or outside `[A-Za-z0-9._-]`
/// (it appears in wait reasons, tables and JSON keys, so it stays plain).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LeaseNameError {
    /// The name is empty.
    #[error("a lease name must not be empty")]
    Empty,
    /// The name is longer than [`MAX_LEASE_NAME_BYTES`].
    #[error("a lease name of {len} bytes is longer than {MAX_LEASE_NAME_BYTES}")]
    TooLong {
        /// The name's length in bytes.
        len: usize,
    },
    /// The name holds a character outside `[A-Za-z0-9._-]`.
    #[error("lease name {name:?} may hold only letters, digits, '-', '_' and '.'")]
    BadCharacter {
        /// The name as given.
        name: String,
    },
}

/// Checks a lease name: not empty, at most [`MAX_LEASE_NAME_BYTES`], only
/// `[A-Za-z0-9._-]`.
pub fn check_lease_name(name: &str) -> Result<(), LeaseNameError> {
    if name.is_empty() {
        return Err(LeaseNameError::Empty);
    }
    if name.len() > MAX_LEASE_NAME_BYTES {
        return Err(LeaseNameError::TooLong { len: name.len() });
    }
    if !name
        .chars()
        .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
    {
        return Err(LeaseNameError::BadCharacter {
            name: name.to_owned(),
        });
    }
    Ok(())
}

/// Resources one worker needs (leases: the whole gang).
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
    /// Units of the policy's named leases (shared things such as a licence),
    /// held once by the whole gang while it runs, not per worker.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub leases: BTreeMap<String, u64>,
    /// Opts a fractional worker (0 < `gpu` < 1) in to the policy's
    /// `oversubscription`: it is placed at its share divided by the policy's
    /// factor, so more of a GPU is promised than it has, and its node may
    /// evict it through its checkpoint when the GPU's memory runs short.
    /// Written only when set, so specs without it keep their identities.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub oversubscribe: bool,
}

fn one_f64() -> f64 {
    1.0
}

/// The largest oversubscription factor, in thousandths (4×): the policy's
/// `oversubscription` and a launch's factor are both at most this.
pub const MAX_OVERSUBSCRIPTION_MILLI: u64 = 4000;

/// What a worker asking `milli` thousandths of one GPU holds of that GPU under
/// oversubscription factor `factor_milli` (1000: none; at most
/// [`MAX_OVERSUBSCRIPTION_MILLI`] counts): a fraction is divided by the factor,
/// rounded up so the promises never exceed the factor; whole GPUs and factors
/// at or below 1 charge the share itself. The one rule the policy core, the
/// head's launches and the node's slot table all apply, so they agree exactly.
pub fn oversubscribed_charge(milli: u64, factor_milli: u64) -> u64 {
    const WHOLE: u64 = 1000;
    let factor = factor_milli.min(MAX_OVERSUBSCRIPTION_MILLI);
    if factor <= WHOLE || milli == 0 || milli >= WHOLE {
        return milli;
    }
    (milli * WHOLE).div_ceil(factor).max(1)
}

impl Default for Resources {
    fn default() -> Self {
        Self {
            gpu: 0.0,
            cpu: 1.0,
            memory: MemoryBytes(0),
            leases: BTreeMap::new(),
            oversubscribe: false,
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
        deserializer.deserialize_any(MemoryVisitor)
    }
}

/// Reads `memory` as a byte count or a human size, and says which forms it takes
/// when given anything else (a negative or fractional number, a list).
struct MemoryVisitor;

impl MemoryVisitor {
    fn refuse<E: serde::de::Error>(given: impl std::fmt::Display) -> E {
        E::custom(format!(
            "memory must be a size such as 16GiB or 512MB, or a whole number of bytes; got {given}"
        ))
    }
}

impl serde::de::Visitor<'_> for MemoryVisitor {
    type Value = MemoryBytes;

    fn expecting(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter
            .write_str("memory to be a size such as 16GiB or 512MB, or a whole number of bytes")
    }

    fn visit_u64<E: serde::de::Error>(self, bytes: u64) -> Result<MemoryBytes, E> {
        Ok(MemoryBytes(bytes))
    }

    fn visit_i64<E: serde::de::Error>(self, bytes: i64) -> Result<MemoryBytes, E> {
        u64::try_from(bytes)
            .map(MemoryBytes)
            .map_err(|_| Self::refuse(bytes))
    }

    fn visit_f64<E: serde::de::Error>(self, bytes: f64) -> Result<MemoryBytes, E> {
        Err(Self::refuse(bytes))
    }

    fn visit_str<E: serde::de::Error>(self, text: &str) -> Result<MemoryBytes, E> {
        parse_memory(text).map(MemoryBytes).map_err(E::custom)
    }
}

/// A memory size that does not parse.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{text:?} is not a memory size like 16GiB or 512MB: {reason}")]
pub struct MemoryError {
    /// What was given.
    pub text: String,
    /// What the size parser said.
    pub reason: String,
}

/// Parses a human memory size such as `16GiB`, `512 MB` or `1048576`.
pub fn parse_memory(text: &str) -> Result<u64, MemoryError> {
    text.trim()
        .parse::<bytesize::ByteSize>()
        .map(|size| size.as_u64())
        .map_err(|reason| MemoryError {
            text: text.to_owned(),
            reason,
        })
}

/// A command's argv: a program, bounded, and placeholders that name an
/// unconditional parameter of the search space or a builtin.
fn validate_command(argv: &[String], search: &SearchSpec) -> Result<(), SpecError> {
    if argv.is_empty() {
        return Err(invalid("trial.command", "must name a program"));
    }
    if argv.len() > 1024 || argv.iter().any(|arg| arg.len() > 16 * 1024) {
        return Err(invalid("trial.command", "is too long"));
    }
    for (arg_idx, arg) in argv.iter().enumerate() {
        for name in placeholders(arg) {
            if !search.space.contains_key(&name) && !BUILTIN_PLACEHOLDERS.contains(&name.as_str()) {
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
    Ok(())
}

impl TrialSpec {
    /// Checks every field, section by section; the first problem found is the
    /// one reported.
    pub(super) fn validate(&self, search: &SearchSpec) -> Result<(), SpecError> {
        self.validate_program(search)?;
        self.validate_workers()?;
        self.validate_gpu()?;
        self.validate_time_limit()?;
        self.validate_node_constraints()?;
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
        self.validate_leases()
    }

    /// What runs: a command or an entry, not both, and `program` only with `entry`.
    fn validate_program(&self, search: &SearchSpec) -> Result<(), SpecError> {
        match (&self.command, &self.entry) {
            (Some(_), Some(_)) => {
                return Err(invalid(
                    "trial",
                    "give either `command` or `entry`, not both",
                ));
            }
            (None, None) => return Err(invalid("trial", "needs a `command` or an `entry`")),
            (Some(argv), None) => validate_command(argv, search)?,
            (None, Some(entry)) => check_label("trial.entry", entry)?,
        }
        if self.program.is_some() && self.entry.is_none() {
            return Err(invalid("trial.program", "is only meaningful with `entry`"));
        }
        if self.command_dir.is_some() && self.command.is_none() {
            return Err(invalid(
                "trial.command_dir",
                "is only meaningful with `command`",
            ));
        }
        Ok(())
    }

    /// The gang's size, or its elastic range.
    fn validate_workers(&self) -> Result<(), SpecError> {
        if self.workers.min == 0 || self.workers.max > MAX_WORKERS {
            return Err(invalid(
                "trial.workers",
                format!("must be between 1 and {MAX_WORKERS}"),
            ));
        }
        if self.workers.min > self.workers.max {
            return Err(invalid(
                "trial.workers",
                format!(
                    "min ({}) must not exceed max ({})",
                    self.workers.min, self.workers.max
                ),
            ));
        }
        Ok(())
    }

    /// GPUs per worker: whole, or one share of a GPU (which alone may be oversubscribed).
    fn validate_gpu(&self) -> Result<(), SpecError> {
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
        if self.resources.oversubscribe && !(gpu > 0.0 && gpu < 1.0) {
            return Err(invalid(
                "trial.resources.oversubscribe",
                format!(
                    "needs a fraction of one GPU (0 < gpu < 1), not gpu: {gpu}: only workers sharing a GPU may be promised beyond it"
                ),
            ));
        }
        Ok(())
    }

    /// `time_limit`: a positive duration.
    fn validate_time_limit(&self) -> Result<(), SpecError> {
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
        Ok(())
    }

    /// Which nodes may run it: GPU models and node labels, bounded.
    fn validate_node_constraints(&self) -> Result<(), SpecError> {
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
        Ok(())
    }

    /// At most [`MAX_TRIAL_LEASES`] leases, each named plainly and at most
    /// [`MAX_LEASE_UNITS`] units.
    fn validate_leases(&self) -> Result<(), SpecError> {
        if self.resources.leases.len() > MAX_TRIAL_LEASES {
            return Err(invalid(
                "trial.resources.leases",
                format!("at most {MAX_TRIAL_LEASES} leases"),
            ));
        }
        for (name, units) in &self.resources.leases {
            if let Err(error) = check_lease_name(name) {
                return Err(invalid("trial.resources.leases", error.to_string()));
            }
            if *units == 0 || *units > MAX_LEASE_UNITS {
                return Err(invalid(
                    format!("trial.resources.leases.{name}"),
                    format!("must be a count between 1 and {MAX_LEASE_UNITS}"),
                ));
            }
        }
        Ok(())
    }

    /// CPU need in thousandths of a core, the unit nodes account in.
    pub fn cpu_milli(&self) -> u32 {
        (self.resources.cpu * 1000.0).ceil() as u32
    }

    /// GPU need in thousandths of a GPU per worker (1000 is one whole GPU).
    pub fn gpu_milli(&self) -> u64 {
        (self.resources.gpu * 1000.0).round() as u64
    }
}
