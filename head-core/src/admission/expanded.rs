//! What a submission expands to, estimated from its spec before anything is
//! expanded: how many trials, how many of them are created at once, and the
//! bytes of each trial's rendered configuration and command.
//!
//! The estimate never plans a trial, so a spec whose expansion would take
//! gigabytes costs microseconds to refuse. For a grid it is exact (each value
//! of a parameter appears equally often, so a trial holds each parameter's
//! mean value size); for sampled and adaptive searches it takes each
//! parameter's largest value, an upper bound. Conditional parameters are
//! counted as if always present, which only overestimates.
//!
//! Not here: the limits and the refusal (`admission`), and the expansion
//! itself (`submission`).

use xp_runtime::spec::{
    Algorithm, ExperimentSpec, ParamKind, ParamValue, SearchSpace, placeholders,
};

/// The most digits (and sign) a rendered `{seed}` takes: `u64::MAX` has 20.
const SEED_BYTES: u64 = 20;
/// The most bytes a rendered `{trial_id}` takes: 16 hex digits, `-`, a run
/// number and `-t` with a trial index, generously.
const TRIAL_ID_BYTES: u64 = 48;
/// The most bytes a rendered `{rank}` takes.
const RANK_BYTES: u64 = 10;
/// The longest JSON a float takes (`-2.2250738585072014e-308`).
const FLOAT_BYTES: u64 = 24;

/// What a submission expands to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct ExpandedSize {
    /// How many trials it has over its life.
    pub(crate) trials: u64,
    /// How many of them it creates when it is admitted (an adaptive search
    /// creates the rest as earlier ones finish).
    pub(crate) at_once: u64,
    /// The bytes of one trial's rendered configuration and command.
    pub(crate) per_trial: u64,
}

impl ExpandedSize {
    /// The estimate for `spec` (validated or not: an invalid space counts as
    /// empty, and the core refuses such a spec anyway).
    pub(crate) fn of(spec: &ExperimentSpec, adaptive_parallel: u32) -> Self {
        let trials = spec.trial_count() as u64;
        let at_once = if spec.search.algorithm.is_adaptive() {
            let parallel = spec.search.parallel.unwrap_or(adaptive_parallel);
            trials.min(u64::from(parallel).saturating_mul(u64::from(spec.search.seeds)))
        } else {
            trials
        };
        let sizes = ValueSizes::of(spec);
        let command = spec.trial.command.as_deref().unwrap_or_default();
        let per_trial = sizes
            .config_bytes()
            .saturating_add(command_bytes(command, &sizes));
        Self {
            trials,
            at_once,
            per_trial,
        }
    }

    /// The whole submission's expanded bytes.
    pub(crate) fn bytes(&self) -> u64 {
        self.trials.saturating_mul(self.per_trial)
    }
}

/// Each parameter's name and the bytes a trial holds of its value: as JSON
/// in the configuration, and as text in a command (a string unquoted).
struct ValueSizes(Vec<(String, ValueBytes)>);

#[derive(Debug, Clone, Copy)]
struct ValueBytes {
    json: u64,
    text: u64,
}

impl ValueSizes {
    fn of(spec: &ExperimentSpec) -> Self {
        let Ok(space) = SearchSpace::from_spec(&spec.search.space) else {
            return Self(Vec::new());
        };
        let mean = spec.search.algorithm == Algorithm::Grid;
        let sizes = space
            .params()
            .iter()
            .map(|param| (param.name().to_owned(), kind_bytes(param.kind(), mean)))
            .collect();
        Self(sizes)
    }

    /// `{"name":value,...,"seed":N}`: the configuration every trial keeps.
    fn config_bytes(&self) -> u64 {
        let params: u64 = self
            .0
            .iter()
            .map(|(name, value)| json_string_bytes(name) + 1 + value.json + 1)
            .sum();
        2 + params + json_string_bytes("seed") + 1 + SEED_BYTES
    }

    /// The bytes `{name}` renders to in a command.
    fn placeholder_bytes(&self, name: &str) -> u64 {
        match name {
            "seed" => SEED_BYTES,
            "trial_id" => TRIAL_ID_BYTES,
            "rank" => RANK_BYTES,
            _ => self
                .0
                .iter()
                .find(|(param, _)| param == name)
                .map_or(0, |(_, value)| value.text),
        }
    }
}

/// A command's bytes once its placeholders are rendered.
fn command_bytes(command: &[String], sizes: &ValueSizes) -> u64 {
    command
        .iter()
        .map(|arg| {
            let names = placeholders(arg);
            let braces: u64 = names.iter().map(|name| name.len() as u64 + 2).sum();
            let values: u64 = names.iter().map(|name| sizes.placeholder_bytes(name)).sum();
            (arg.len() as u64).saturating_sub(braces) + values
        })
        .sum()
}

/// The bytes of a parameter's value: the mean over its values for a grid,
/// the largest otherwise.
fn kind_bytes(kind: &ParamKind, mean: bool) -> ValueBytes {
    match kind {
        ParamKind::Float { .. } => ValueBytes {
            json: FLOAT_BYTES,
            text: FLOAT_BYTES,
        },
        ParamKind::Int { lo, hi, .. } => {
            let digits = decimal_bytes(*lo).max(decimal_bytes(*hi));
            ValueBytes {
                json: digits,
                text: digits,
            }
        }
        ParamKind::Choice { values } => {
            let sizes = values.iter().map(value_bytes);
            let count = values.len().max(1) as u64;
            let (json, text) = if mean {
                let (json, text) = sizes.fold((0u64, 0u64), |(json, text), size| {
                    (json + size.json, text + size.text)
                });
                (json.div_ceil(count), text.div_ceil(count))
            } else {
                sizes.fold((0, 0), |(json, text), size| {
                    (json.max(size.json), text.max(size.text))
                })
            };
            ValueBytes { json, text }
        }
    }
}

fn value_bytes(value: &ParamValue) -> ValueBytes {
    let json = serde_json::to_string(value).map_or(0, |text| text.len() as u64);
    let text = match value {
        ParamValue::Str(text) => text.len() as u64,
        _ => json,
    };
    ValueBytes { json, text }
}

fn decimal_bytes(value: i64) -> u64 {
    value.to_string().len() as u64
}

/// A name's bytes as a JSON string: quotes, and escapes counted generously.
fn json_string_bytes(name: &str) -> u64 {
    serde_json::to_string(name).map_or(name.len() as u64 + 2, |text| text.len() as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn size_of(yaml: &str) -> ExpandedSize {
        let spec = ExperimentSpec::from_yaml(yaml).unwrap();
        ExpandedSize::of(&spec, 4)
    }

    /// The bytes the head really keeps and sends: every planned trial's
    /// configuration, and its command rendered as a launch renders it.
    fn actual_bytes(yaml: &str) -> u64 {
        let spec = ExperimentSpec::from_yaml(yaml).unwrap();
        xp_tune::search::plan_trials(&spec.search)
            .iter()
            .map(|plan| {
                let config = plan.config_json();
                let values: serde_json::Map<String, serde_json::Value> =
                    serde_json::from_str(&config).unwrap();
                let lookup = |name: &str| match name {
                    "trial_id" => Some("0123456789abcdef-1-t12345".to_owned()),
                    "rank" => Some("0".to_owned()),
                    _ => values.get(name).map(|value| match value {
                        serde_json::Value::String(text) => text.clone(),
                        other => other.to_string(),
                    }),
                };
                let command: usize = spec
                    .trial
                    .command
                    .iter()
                    .flatten()
                    .map(|arg| xp_runtime::spec::render_arg(arg, lookup).unwrap().len())
                    .sum();
                (config.len() + command) as u64
            })
            .sum()
    }

    /// `yaml`'s estimate is at least what it expands to, and not twice it.
    fn check_bounds_the_expansion(yaml: &str) {
        let estimate = size_of(yaml).bytes();
        let actual = actual_bytes(yaml);
        assert!(estimate >= actual, "{estimate} < {actual} for {yaml}");
        assert!(
            estimate < 2 * actual + 64,
            "{estimate} vs {actual} for {yaml}"
        );
    }

    #[test]
    fn the_estimate_bounds_what_a_grid_and_a_sample_expand_to() {
        check_bounds_the_expansion("name: a\ntrial: {command: [echo]}\n");
        check_bounds_the_expansion(
            "name: a\ntrial: {command: [train, '--lr={lr}', '{opt}', '{trial_id}']}\nsearch: {algorithm: grid, space: {lr: {choice: [0.1, 0.01, 0.001]}, opt: {choice: [sgd, adamw]}, n: {int: [1, 300]}}}\n",
        );
        check_bounds_the_expansion(
            "name: a\ntrial: {command: [train, '{x}', '{y}', '{seed}']}\nsearch: {algorithm: random, trials: 50, seeds: 3, space: {x: {uniform: [0, 1]}, y: {choice: [short, a-much-longer-value]}}}\n",
        );
    }

    #[test]
    fn two_large_choices_times_a_thousand_integers_is_four_hundred_megabytes() {
        // The 205 KB spec: two 100 KB strings, each in the config
        // and in the command, times 1,000 integers.
        let (a, b) = ("a".repeat(100_000), "b".repeat(100_000));
        let yaml = format!(
            "name: big\ntrial: {{command: [echo, '{{s}}', '{{n}}']}}\nsearch: {{algorithm: grid, space: {{s: {{choice: ['{a}', '{b}']}}, n: {{int: [1, 1000]}}}}}}\n"
        );
        let size = size_of(&yaml);
        assert_eq!(size.trials, 2_000);
        assert_eq!(size.at_once, 2_000);
        assert!(
            (400_000_000..401_000_000).contains(&size.bytes()),
            "{size:?}"
        );
    }

    #[test]
    fn an_adaptive_search_creates_its_parallel_trials_at_once() {
        let size = size_of(
            "name: a\ntrial: {command: [echo, '{x}']}\nsearch: {algorithm: tpe, metric: loss, trials: 500, seeds: 2, parallel: 3, space: {x: {uniform: [0, 1]}}}\n",
        );
        assert_eq!((size.trials, size.at_once), (1_000, 6));
        assert_eq!(size.bytes(), 1_000 * size.per_trial);
    }
}
