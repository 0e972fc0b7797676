//! The objectives of a search: `metric` and `mode` as one value or a list (a
//! multi-objective search, `metric: [val_acc, latency_ms]` with `mode: [max, min]`),
//! the hypervolume's `reference` point, and the serde form of
//! [`SearchSpec`] that reads them.
//!
//! A single objective is written exactly as before (`"metric":"loss","mode":"min"`),
//! so the canonical JSON, and so the identity, of every single-metric spec is
//! unchanged; a list of one is the same as the bare value. Shapes the YAML parser can
//! reject (an empty list, an over-long one) are refused while parsing; lengths and
//! names are checked by [`SearchSpec::validate`] through [`validate_objectives`],
//! naming the field.

use std::cell::Cell;
use std::fmt;
use std::marker::PhantomData;

use serde::de::{IntoDeserializer, SeqAccess, Visitor};
use serde::{Deserialize, Deserializer, Serialize};

use super::search::{
    AcquisitionKind, Algorithm, MetricValue, Mode, SearchSpec, SpaceSpec, TpeSpec,
};
use super::trial::one_u32;
use super::{BohbSpec, SpecError, StoppingConfig, check_label, invalid};

/// The most objectives a multi-objective search may have (`xp_tune`'s hypervolume
/// is exact up to this many).
pub const MAX_OBJECTIVES: usize = 4;

/// The longest list `metric` or `mode` may be while parsing; anything longer than
/// [`MAX_OBJECTIVES`] is refused by validation, this only bounds the parse.
const MAX_PARSED_LIST: usize = 64;

/// One objective: a metric and its direction.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Objective<'a> {
    /// The metric's name.
    pub metric: &'a str,
    /// Whether smaller or larger is better.
    pub mode: Mode,
}

impl SearchSpec {
    /// The objectives in declared order: none without a metric, one for a plain
    /// `metric`, 2 to 4 for a multi-objective search.
    pub fn objectives(&self) -> Vec<Objective<'_>> {
        let Some(first) = &self.metric else {
            return Vec::new();
        };
        std::iter::once(Objective {
            metric: first,
            mode: self.mode,
        })
        .chain(
            self.extra_metrics
                .iter()
                .zip(&self.extra_modes)
                .map(|(metric, mode)| Objective {
                    metric,
                    mode: *mode,
                }),
        )
        .collect()
    }

    /// Whether the search has more than one objective.
    pub fn is_multi_objective(&self) -> bool {
        !self.extra_metrics.is_empty()
    }
}

/// A value or a list of them: how `metric` and `mode` are written.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(untagged)]
pub(super) enum OneOrList<T> {
    /// The bare value (a single objective).
    One(T),
    /// One per objective.
    List(Vec<T>),
}

impl<T> OneOrList<T> {
    fn into_vec(self) -> Vec<T> {
        match self {
            Self::One(value) => vec![value],
            Self::List(values) => values,
        }
    }

    /// The bare value for one, a list for several (so one objective is written as
    /// it always was).
    fn from_vec(mut values: Vec<T>) -> Self {
        if values.len() == 1 {
            Self::One(values.remove(0))
        } else {
            Self::List(values)
        }
    }
}

thread_local! {
    /// Set while [`yaml_with_text_names`] parses a document again, reading every
    /// bare `metric`/`mode` as text.
    static NAMES_AS_TEXT: Cell<bool> = const { Cell::new(false) };
}

/// The mark of a bare value that YAML resolved to a boolean or a number.
const NOT_TEXT: &str = "expected a name, found a YAML boolean or number";

/// Parses YAML whose `metric` may be a bare name or a list.
///
/// Telling the two apart needs the deserializer's own type guess, and YAML 1.1
/// reads a bare `y`, `no` or `on` as a boolean; where that happened, the document
/// is parsed once more reading bare names as text, as a plain `metric: y` always
/// was (a list's entries are always read as text).
pub(super) fn yaml_with_text_names<T: serde::de::DeserializeOwned>(
    text: &str,
) -> Result<T, String> {
    match serde_saphyr::from_str(text) {
        Err(error) if error.to_string().contains(NOT_TEXT) => {
            NAMES_AS_TEXT.set(true);
            let again = serde_saphyr::from_str(text);
            NAMES_AS_TEXT.set(false);
            again.map_err(|error| error.to_string())
        }
        parsed => parsed.map_err(|error| error.to_string()),
    }
}

impl<'de, T: Deserialize<'de>> Deserialize<'de> for OneOrList<T> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct ListVisitor<T>(PhantomData<T>);

        impl<'de, T: Deserialize<'de>> Visitor<'de> for ListVisitor<T> {
            type Value = OneOrList<T>;

            fn expecting(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
                formatter.write_str("one name, or a list of them (one per objective)")
            }

            fn visit_str<E: serde::de::Error>(self, value: &str) -> Result<Self::Value, E> {
                T::deserialize(value.into_deserializer()).map(OneOrList::One)
            }

            fn visit_bool<E: serde::de::Error>(self, _: bool) -> Result<Self::Value, E> {
                Err(E::custom(NOT_TEXT))
            }

            fn visit_i64<E: serde::de::Error>(self, _: i64) -> Result<Self::Value, E> {
                Err(E::custom(NOT_TEXT))
            }

            fn visit_u64<E: serde::de::Error>(self, _: u64) -> Result<Self::Value, E> {
                Err(E::custom(NOT_TEXT))
            }

            fn visit_f64<E: serde::de::Error>(self, _: f64) -> Result<Self::Value, E> {
                Err(E::custom(NOT_TEXT))
            }

            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
                let mut values = Vec::new();
                while let Some(value) = seq.next_element()? {
                    if values.len() == MAX_PARSED_LIST {
                        return Err(serde::de::Error::custom(format_args!(
                            "a list of more than {MAX_PARSED_LIST} entries (a search has at most {MAX_OBJECTIVES} objectives)"
                        )));
                    }
                    values.push(value);
                }
                if values.is_empty() {
                    return Err(serde::de::Error::custom(
                        "an empty list: give one value, or one per objective",
                    ));
                }
                Ok(OneOrList::List(values))
            }
        }

        if NAMES_AS_TEXT.get() {
            return T::deserialize(deserializer).map(OneOrList::One);
        }
        deserializer.deserialize_any(ListVisitor(PhantomData))
    }
}

fn default_mode() -> OneOrList<Mode> {
    OneOrList::One(Mode::Min)
}

/// [`SearchSpec`] as YAML and the canonical JSON spell it: fields in the order (and
/// with the defaults and omissions) the canonical JSON has always had.
#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct SearchWire {
    #[serde(default)]
    algorithm: Algorithm,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    acquisition: Option<AcquisitionKind>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    kappa: Option<f64>,
    #[serde(default, skip_serializing_if = "SpaceSpec::is_empty")]
    space: SpaceSpec,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    metric: Option<OneOrList<String>>,
    #[serde(default = "default_mode")]
    mode: OneOrList<Mode>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    trials: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    parallel: Option<u32>,
    #[serde(default = "one_u32")]
    seeds: u32,
    #[serde(default)]
    seed: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    early_stopping: Option<StoppingConfig>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    value: Option<MetricValue>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    tpe: Option<TpeSpec>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    reference: Option<Vec<f64>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    bohb: Option<BohbSpec>,
}

impl From<SearchWire> for SearchSpec {
    fn from(wire: SearchWire) -> Self {
        let SearchWire {
            algorithm,
            acquisition,
            kappa,
            space,
            metric,
            mode,
            trials,
            parallel,
            seeds,
            seed,
            early_stopping,
            value,
            tpe,
            reference,
            bohb,
        } = wire;
        // Both lists are non-empty (the parser refuses empty ones).
        let mut metrics = metric.map(OneOrList::into_vec).unwrap_or_default();
        let extra_metrics = if metrics.len() > 1 {
            metrics.split_off(1)
        } else {
            Vec::new()
        };
        let mut modes = mode.into_vec();
        let extra_modes = modes.split_off(1.min(modes.len()));
        Self {
            algorithm,
            acquisition,
            kappa,
            space,
            metric: metrics.pop(),
            mode: modes.pop().unwrap_or_default(),
            trials,
            parallel,
            seeds,
            seed,
            early_stopping,
            value,
            tpe,
            extra_metrics,
            extra_modes,
            reference,
            bohb,
        }
    }
}

impl From<SearchSpec> for SearchWire {
    fn from(spec: SearchSpec) -> Self {
        let SearchSpec {
            algorithm,
            acquisition,
            kappa,
            space,
            metric,
            mode,
            trials,
            parallel,
            seeds,
            seed,
            early_stopping,
            value,
            tpe,
            extra_metrics,
            extra_modes,
            reference,
            bohb,
        } = spec;
        let metrics: Vec<String> = metric.into_iter().chain(extra_metrics).collect();
        let modes: Vec<Mode> = std::iter::once(mode).chain(extra_modes).collect();
        Self {
            algorithm,
            acquisition,
            kappa,
            space,
            metric: (!metrics.is_empty()).then(|| OneOrList::from_vec(metrics)),
            mode: OneOrList::from_vec(modes),
            trials,
            parallel,
            seeds,
            seed,
            early_stopping,
            value,
            tpe,
            reference,
            bohb,
        }
    }
}

/// Checks `metric`, `mode` and `reference`, and refuses what cannot serve several
/// objectives (`gp`, early stopping, `value`), naming the field.
pub(super) fn validate_objectives(search: &SearchSpec) -> Result<(), SpecError> {
    let Some(first) = &search.metric else {
        return validate_no_metric(search);
    };
    if search.extra_metrics.is_empty() {
        return validate_one_metric(search, first);
    }
    let metrics = validate_metrics(search, first)?;
    refuse_single_objective_options(search, metrics)
}

/// Without a metric: no other objective, direction or reference point.
fn validate_no_metric(search: &SearchSpec) -> Result<(), SpecError> {
    if !search.extra_metrics.is_empty() {
        return Err(invalid("search.metric", "the first objective is missing"));
    }
    if !search.extra_modes.is_empty() {
        return Err(invalid(
            "search.mode",
            "lists directions but search.metric names no metric",
        ));
    }
    if search.reference.is_some() {
        return Err(invalid(
            "search.reference",
            "only applies to a multi-objective search (`metric: [a, b]`)",
        ));
    }
    Ok(())
}

/// One metric: a label, one direction, no reference point.
fn validate_one_metric(search: &SearchSpec, first: &str) -> Result<(), SpecError> {
    let modes = 1 + search.extra_modes.len();
    check_label("search.metric", first)?;
    if modes != 1 {
        return Err(invalid(
            "search.mode",
            format!("gives {modes} directions for one metric; write `mode: min` or `mode: max`"),
        ));
    }
    if search.reference.is_some() {
        return Err(invalid(
            "search.reference",
            "only applies to a multi-objective search (`metric: [a, b]`)",
        ));
    }
    Ok(())
}

/// Several metrics: at most [`MAX_OBJECTIVES`], each a distinct label, one
/// direction each, and a finite reference value each; returns how many.
fn validate_metrics(search: &SearchSpec, first: &str) -> Result<usize, SpecError> {
    let metrics = 1 + search.extra_metrics.len();
    let modes = 1 + search.extra_modes.len();
    if metrics > MAX_OBJECTIVES {
        return Err(invalid(
            "search.metric",
            format!("names {metrics} metrics; a multi-objective search has 2 to {MAX_OBJECTIVES}"),
        ));
    }
    let names: Vec<&str> = std::iter::once(first)
        .chain(search.extra_metrics.iter().map(String::as_str))
        .collect();
    for (index, name) in names.iter().enumerate() {
        check_label(&format!("search.metric[{index}]"), name)?;
        if names[..index].contains(name) {
            return Err(invalid(
                format!("search.metric[{index}]"),
                format!("`{name}` is named twice; each objective is a different metric"),
            ));
        }
    }
    if modes != metrics {
        return Err(invalid(
            "search.mode",
            format!(
                "gives {modes} direction{} for {metrics} metrics; write one per metric, such as `mode: [{}]`",
                if modes == 1 { "" } else { "s" },
                vec!["max"; metrics].join(", ")
            ),
        ));
    }
    if let Some(reference) = &search.reference {
        if reference.len() != metrics {
            return Err(invalid(
                "search.reference",
                format!(
                    "has {} values for {metrics} metrics; give one per metric",
                    reference.len()
                ),
            ));
        }
        if let Some(index) = reference.iter().position(|value| !value.is_finite()) {
            return Err(invalid(
                format!("search.reference[{index}]"),
                "must be a finite number",
            ));
        }
    }
    Ok(metrics)
}

/// Refuses what judges or prices one metric (early stopping, `value`), and the
/// algorithms that search one, in a search of `metrics` objectives.
fn refuse_single_objective_options(search: &SearchSpec, metrics: usize) -> Result<(), SpecError> {
    let one_metric = |field: &str, what: &str| {
        invalid(
            field,
            format!("{what} one metric, and this search has {metrics} (`metric: [..]`)"),
        )
    };
    if !matches!(
        search.algorithm,
        Algorithm::Tpe | Algorithm::Random | Algorithm::Grid | Algorithm::Sobol
    ) {
        return Err(invalid(
            "search.algorithm",
            format!(
                "{} searches one metric; a multi-objective search (`metric: [..]`) uses tpe, random, grid or sobol",
                search.algorithm.as_str()
            ),
        ));
    }
    if search.early_stopping.is_some() {
        return Err(one_metric("search.early_stopping", "judges"));
    }
    if search.value.is_some() {
        return Err(one_metric("search.value", "prices"));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use crate::spec::{ExperimentSpec, Mode, Objective};

    const MULTI: &str = r#"
name: front
trial: {command: [echo, "{x}"]}
search:
  algorithm: tpe
  space: {x: {uniform: [0.0, 1.0]}}
  metric: [val_acc, latency_ms]
  mode: [max, min]
  reference: [0.0, 1000.0]
  trials: 8
"#;

    const SINGLE: &str = r#"
name: one
trial: {command: [echo, "{x}"]}
search:
  algorithm: random
  space: {x: {uniform: [0.0, 1.0]}}
  metric: loss
  trials: 4
"#;

    fn check_error(yaml: &str, fragment: &str) {
        let error = ExperimentSpec::from_yaml(yaml)
            .expect_err("spec should be refused")
            .to_string();
        assert!(
            error.contains(fragment),
            "error {error:?} lacks {fragment:?}"
        );
    }

    #[test]
    fn a_multi_objective_search_parses_and_round_trips() {
        let spec = ExperimentSpec::from_yaml(MULTI).unwrap();
        assert!(spec.search.is_multi_objective());
        assert_eq!(
            spec.search.objectives(),
            vec![
                Objective {
                    metric: "val_acc",
                    mode: Mode::Max
                },
                Objective {
                    metric: "latency_ms",
                    mode: Mode::Min
                },
            ]
        );
        assert_eq!(spec.search.reference, Some(vec![0.0, 1000.0]));
        let json = spec.to_canonical_json();
        assert!(
            json.contains(r#""metric":["val_acc","latency_ms"],"mode":["max","min"]"#),
            "{json}"
        );
        assert!(json.contains(r#""reference":[0.0,1000.0]"#), "{json}");
        assert_eq!(ExperimentSpec::from_json(&json).unwrap(), spec);
        // Every algorithm but gp takes several metrics; tpe becomes MOTPE.
        for algorithm in ["random", "sobol"] {
            let text = MULTI.replace("algorithm: tpe", &format!("algorithm: {algorithm}"));
            assert!(ExperimentSpec::from_yaml(&text).is_ok(), "{algorithm}");
        }
        let grid = MULTI
            .replace("algorithm: tpe", "algorithm: grid")
            .replace("{uniform: [0.0, 1.0]}", "{choice: [0, 1]}")
            .replace("  trials: 8\n", "");
        assert!(ExperimentSpec::from_yaml(&grid).is_ok());
        let no_reference = MULTI.replace("  reference: [0.0, 1000.0]\n", "");
        assert_eq!(
            ExperimentSpec::from_yaml(&no_reference)
                .unwrap()
                .search
                .reference,
            None
        );
    }

    #[test]
    fn a_single_metric_keeps_its_canonical_json() {
        // Written out by hand: the form (and so the identity) every existing
        // single-metric experiment has.
        let expected = r#"{"algorithm":"random","space":{"x":{"uniform":[0.0,1.0]}},"metric":"loss","mode":"min","trials":4,"seeds":1,"seed":0}"#;
        let spec = ExperimentSpec::from_yaml(SINGLE).unwrap();
        assert!(!spec.search.is_multi_objective());
        assert_eq!(serde_json::to_string(&spec.search).unwrap(), expected);
        // A list of one, and explicit defaults, are the same spec.
        for respelled in [
            SINGLE.replace("metric: loss", "metric: [loss]"),
            SINGLE.replace("metric: loss", "metric: loss\n  mode: [min]"),
        ] {
            let spec = ExperimentSpec::from_yaml(&respelled).unwrap();
            assert_eq!(serde_json::to_string(&spec.search).unwrap(), expected);
        }
        // A bare name YAML 1.1 reads as a boolean is still the name.
        let y = ExperimentSpec::from_yaml(&SINGLE.replace("metric: loss", "metric: y")).unwrap();
        assert_eq!(y.search.metric.as_deref(), Some("y"));
        let listed =
            ExperimentSpec::from_yaml(&MULTI.replace("[val_acc, latency_ms]", "[y, no]")).unwrap();
        assert_eq!(listed.search.extra_metrics, vec!["no".to_owned()]);
        let no_metric = SINGLE.replace("  metric: loss\n", "");
        let spec = ExperimentSpec::from_yaml(&no_metric).unwrap();
        assert!(spec.search.objectives().is_empty());
        assert_eq!(
            serde_json::to_string(&spec.search).unwrap(),
            expected.replace(r#""metric":"loss","#, "")
        );
    }

    #[test]
    fn bad_objectives_name_the_field() {
        let cases = [
            ("mode: [max, min]", "mode: [max]", "search.mode"),
            ("mode: [max, min]", "mode: max", "search.mode"),
            ("mode: [max, min]", "mode: [max, min, min]", "search.mode"),
            ("mode: [max, min]", "mode: [max, fastest]", "fastest"),
            ("mode: [max, min]", "mode: []", "empty list"),
            ("[val_acc, latency_ms]", "[]", "empty list"),
            (
                "[val_acc, latency_ms]",
                "[val_acc, val_acc]",
                "search.metric[1]",
            ),
            ("[val_acc, latency_ms]", "[val_acc, '']", "search.metric[1]"),
            (
                "metric: [val_acc, latency_ms]\n  mode: [max, min]",
                "metric: [a, b, c, d, e]\n  mode: [max, min, min, min, min]",
                "search.metric",
            ),
            (
                "reference: [0.0, 1000.0]",
                "reference: [0.0]",
                "search.reference",
            ),
            (
                "reference: [0.0, 1000.0]",
                "reference: [0.0, .nan]",
                "search.reference[1]",
            ),
            ("algorithm: tpe", "algorithm: gp", "search.algorithm"),
            (
                "trials: 8",
                "trials: 8\n  early_stopping: {rule: asha}",
                "search.early_stopping",
            ),
            (
                "trials: 8",
                "trials: 8\n  value: {per_unit: 1.0}",
                "search.value",
            ),
        ];
        for (from, to, fragment) in cases {
            assert!(MULTI.contains(from), "{from}");
            check_error(&MULTI.replace(from, to), fragment);
        }
        // One metric: a list of directions, or a reference point, is refused.
        check_error(
            &SINGLE.replace("metric: loss", "metric: loss\n  mode: [min, max]"),
            "search.mode",
        );
        check_error(
            &SINGLE.replace("metric: loss", "metric: loss\n  reference: [1.0]"),
            "search.reference",
        );
        check_error(
            &SINGLE.replace("  metric: loss\n", "  mode: [min, max]\n"),
            "search.mode",
        );
    }
}
