//! Metric values that may be non-finite, and how they look outside the process.
//!
//! A trainer whose loss turns NaN prints it (Python's `json.dumps` writes the bare
//! tokens `NaN`, `Infinity`, `-Infinity`), and xp keeps it: a NaN is a result, and
//! the first sign that a run went wrong. Inside xp a value is an `f64`, NaN and
//! infinities included (bincode carries them exactly). JSON cannot hold them, so
//! every JSON xp writes (the head's records, `xp status --json`, `xp metrics
//! --json`, the HTTP API) writes a non-finite value as one of the strings
//! `"NaN"`, `"Infinity"`, `"-Infinity"`, and everything xp reads accepts them back.
//!
//! This module does not decide what a non-finite value means for a search or an
//! alert; it only names and converts.

use serde::de::{self, MapAccess, Visitor};
use serde::ser::SerializeMap;
use serde::{Deserializer, Serialize, Serializer};
use serde_json::Value;

/// How xp writes a non-finite value in JSON, or `None` for a finite one.
pub fn nonfinite_name(value: f64) -> Option<&'static str> {
    if value.is_nan() {
        Some("NaN")
    } else if value == f64::INFINITY {
        Some("Infinity")
    } else if value == f64::NEG_INFINITY {
        Some("-Infinity")
    } else {
        None
    }
}

/// Reads the words trainers use for non-finite values: `NaN`, `Infinity`,
/// `-Infinity` (JSON as Python writes it) and `nan`, `inf`, `-inf` (as Python's
/// `str(float)` and C's `printf` write them), any case, with an optional sign.
pub fn parse_nonfinite_word(word: &str) -> Option<f64> {
    let (negative, rest) = match word.as_bytes().first() {
        Some(b'-') => (true, &word[1..]),
        Some(b'+') => (false, &word[1..]),
        _ => (false, word),
    };
    let value = if rest.eq_ignore_ascii_case("nan") {
        f64::NAN
    } else if rest.eq_ignore_ascii_case("inf") || rest.eq_ignore_ascii_case("infinity") {
        f64::INFINITY
    } else {
        return None;
    };
    Some(if negative { -value } else { value })
}

/// A value as JSON: a number when finite, else its name as a string.
pub fn value_json(value: f64) -> Value {
    match nonfinite_name(value) {
        Some(name) => Value::String(name.to_owned()),
        None => Value::from(value),
    }
}

/// Named values as a JSON object, each written by [`value_json`].
pub fn values_json<'a>(values: impl IntoIterator<Item = (&'a String, &'a f64)>) -> Value {
    Value::Object(
        values
            .into_iter()
            .map(|(name, value)| (name.clone(), value_json(*value)))
            .collect(),
    )
}

/// The names of the metrics whose values are not finite, with how each reads
/// (`{"loss": "NaN"}`), so a reader need not scan every value.
pub fn nonfinite_json<'a>(values: impl IntoIterator<Item = (&'a String, &'a f64)>) -> Value {
    Value::Object(
        values
            .into_iter()
            .filter_map(|(name, value)| {
                nonfinite_name(*value).map(|word| (name.clone(), Value::String(word.to_owned())))
            })
            .collect(),
    )
}

/// Reads one value: a number, a non-finite word, or null (what most JSON writers
/// make of NaN), which reads as NaN.
struct ValueVisitor;

impl Visitor<'_> for ValueVisitor {
    type Value = f64;

    fn expecting(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter.write_str("a number, or one of \"NaN\", \"Infinity\", \"-Infinity\"")
    }

    fn visit_f64<E: de::Error>(self, value: f64) -> Result<f64, E> {
        Ok(value)
    }

    fn visit_i64<E: de::Error>(self, value: i64) -> Result<f64, E> {
        Ok(value as f64)
    }

    fn visit_u64<E: de::Error>(self, value: u64) -> Result<f64, E> {
        Ok(value as f64)
    }

    fn visit_str<E: de::Error>(self, word: &str) -> Result<f64, E> {
        parse_nonfinite_word(word).ok_or_else(|| E::invalid_value(de::Unexpected::Str(word), &self))
    }

    fn visit_unit<E: de::Error>(self) -> Result<f64, E> {
        Ok(f64::NAN)
    }

    fn visit_none<E: de::Error>(self) -> Result<f64, E> {
        Ok(f64::NAN)
    }
}

/// Serde for a map of named values in a self-describing format (the head's JSON
/// records): non-finite values as their names. Use with
/// `#[serde(with = "xp_runtime::metric_value::serde_map")]`.
pub mod serde_map {
    use super::*;

    /// Writes each value of a map by name (a `BTreeMap`, or any map whose
    /// iterator knows its length) as a number or a non-finite name.
    pub fn serialize<'a, M, K, S: Serializer>(
        values: &'a M,
        serializer: S,
    ) -> Result<S::Ok, S::Error>
    where
        &'a M: IntoIterator<Item = (&'a K, &'a f64)>,
        K: Serialize + ?Sized + 'a,
        <&'a M as IntoIterator>::IntoIter: ExactSizeIterator,
    {
        let values = values.into_iter();
        let mut map = serializer.serialize_map(Some(values.len()))?;
        for (name, value) in values {
            match nonfinite_name(*value) {
                Some(word) => map.serialize_entry(name, word)?,
                None => map.serialize_entry(name, value)?,
            }
        }
        map.end()
    }

    /// Reads what [`serialize`] wrote, and plain numbers, into a map.
    pub fn deserialize<'de, D, M>(deserializer: D) -> Result<M, D::Error>
    where
        D: Deserializer<'de>,
        M: Default + Extend<(String, f64)>,
    {
        struct MapVisitor<M>(std::marker::PhantomData<M>);
        impl<'de, M: Default + Extend<(String, f64)>> Visitor<'de> for MapVisitor<M> {
            type Value = M;

            fn expecting(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                formatter.write_str("a map of metric values")
            }

            fn visit_map<A: MapAccess<'de>>(self, mut access: A) -> Result<Self::Value, A::Error> {
                let mut values = M::default();
                while let Some((name, OneValue(value))) = access.next_entry::<String, OneValue>()? {
                    values.extend([(name, value)]);
                }
                Ok(values)
            }
        }
        /// One value read by [`ValueVisitor`].
        struct OneValue(f64);
        impl<'de> serde::Deserialize<'de> for OneValue {
            fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
                deserializer.deserialize_any(ValueVisitor).map(OneValue)
            }
        }
        deserializer.deserialize_map(MapVisitor(std::marker::PhantomData))
    }
}

/// Serde for one optional value in a self-describing format; `None` is null
/// only when absent, a NaN is written `"NaN"`.
pub mod serde_option {
    use super::*;

    /// Writes the value as a number or a non-finite name, or null when absent.
    pub fn serialize<S: Serializer>(value: &Option<f64>, serializer: S) -> Result<S::Ok, S::Error> {
        match value {
            None => serializer.serialize_none(),
            Some(value) => match nonfinite_name(*value) {
                Some(word) => serializer.serialize_str(word),
                None => serializer.serialize_f64(*value),
            },
        }
    }

    /// Reads what [`serialize`] wrote (null is absent).
    pub fn deserialize<'de, D: Deserializer<'de>>(
        deserializer: D,
    ) -> Result<Option<f64>, D::Error> {
        struct OptionVisitor;
        impl<'de> Visitor<'de> for OptionVisitor {
            type Value = Option<f64>;

            fn expecting(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                formatter.write_str("a number, a non-finite name or null")
            }

            fn visit_unit<E: de::Error>(self) -> Result<Self::Value, E> {
                Ok(None)
            }

            fn visit_none<E: de::Error>(self) -> Result<Self::Value, E> {
                Ok(None)
            }

            fn visit_some<D: Deserializer<'de>>(self, inner: D) -> Result<Self::Value, D::Error> {
                inner.deserialize_any(ValueVisitor).map(Some)
            }

            fn visit_f64<E: de::Error>(self, value: f64) -> Result<Self::Value, E> {
                Ok(Some(value))
            }

            fn visit_i64<E: de::Error>(self, value: i64) -> Result<Self::Value, E> {
                Ok(Some(value as f64))
            }

            fn visit_u64<E: de::Error>(self, value: u64) -> Result<Self::Value, E> {
                Ok(Some(value as f64))
            }

            fn visit_str<E: de::Error>(self, word: &str) -> Result<Self::Value, E> {
                ValueVisitor.visit_str(word).map(Some)
            }
        }
        deserializer.deserialize_any(OptionVisitor)
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;

    #[derive(Debug, serde::Serialize, serde::Deserialize)]
    struct Holder {
        #[serde(with = "serde_map")]
        values: BTreeMap<String, f64>,
        #[serde(with = "serde_option", default)]
        one: Option<f64>,
    }

    #[test]
    fn words_parse_in_every_spelling() {
        for (word, expected) in [
            ("NaN", f64::NAN),
            ("nan", f64::NAN),
            ("Infinity", f64::INFINITY),
            ("inf", f64::INFINITY),
            ("+inf", f64::INFINITY),
            ("-Infinity", f64::NEG_INFINITY),
            ("-inf", f64::NEG_INFINITY),
        ] {
            let parsed = parse_nonfinite_word(word).unwrap();
            assert!(
                parsed.is_nan() == expected.is_nan() && (parsed.is_nan() || parsed == expected),
                "{word}"
            );
        }
        for word in ["high", "", "-", "infinite", "nan0", "1.5"] {
            assert_eq!(parse_nonfinite_word(word), None, "{word}");
        }
    }

    #[test]
    fn records_keep_nonfinite_values_through_json() {
        let holder = Holder {
            values: BTreeMap::from([
                ("loss".to_owned(), f64::NAN),
                ("grad".to_owned(), f64::INFINITY),
                ("low".to_owned(), f64::NEG_INFINITY),
                ("acc".to_owned(), 0.5),
            ]),
            one: Some(f64::NAN),
        };
        let text = serde_json::to_string(&holder).unwrap();
        assert_eq!(
            text,
            r#"{"values":{"acc":0.5,"grad":"Infinity","loss":"NaN","low":"-Infinity"},"one":"NaN"}"#
        );
        let back: Holder = serde_json::from_str(&text).unwrap();
        assert!(back.values["loss"].is_nan());
        assert_eq!(back.values["grad"], f64::INFINITY);
        assert_eq!(back.values["low"], f64::NEG_INFINITY);
        assert_eq!(back.values["acc"], 0.5);
        assert!(back.one.unwrap().is_nan());
        // Records written before non-finite values were kept hold plain numbers.
        let old: Holder = serde_json::from_str(r#"{"values":{"acc":1}}"#).unwrap();
        assert_eq!(old.values["acc"], 1.0);
        assert_eq!(old.one, None);
        assert!(serde_json::from_str::<Holder>(r#"{"values":{"acc":"high"}}"#).is_err());
    }

    #[test]
    fn json_views_name_nonfinite_values() {
        let values = BTreeMap::from([("loss".to_owned(), f64::NAN), ("acc".to_owned(), 0.25)]);
        assert_eq!(
            values_json(&values),
            serde_json::json!({"loss": "NaN", "acc": 0.25})
        );
        assert_eq!(nonfinite_json(&values), serde_json::json!({"loss": "NaN"}));
    }
}
