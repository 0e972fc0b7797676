//! Texts that repeat across many records, held once: an attempt's outcome and
//! `MASTER_ADDR`, a trial's reason, the names of its metrics. A head holding a
//! million finished trials kept about 170 bytes of these per trial, each its
//! own allocation ("succeeded", "all workers exited with status 0", a host,
//! "loss").
//!
//! Invariant: the table only grows, and never past [`MAX_TEXTS`] texts of at
//! most [`MAX_LEN`] bytes; any other text gets an allocation of its own, so a
//! stream of distinct reasons costs what it did before and no more.

use std::collections::HashSet;
use std::sync::{Arc, LazyLock, Mutex, PoisonError};

use serde::Deserializer;
use serde::de::Visitor;

/// The most texts kept in the table.
const MAX_TEXTS: usize = 65_536;
/// The longest text kept in the table, in bytes.
const MAX_LEN: usize = 256;

static TEXTS: LazyLock<Mutex<HashSet<Arc<str>>>> = LazyLock::new(Mutex::default);

/// `text`, shared with every other holder of the same text while the table
/// has room for it.
pub(crate) fn shared(text: &str) -> Arc<str> {
    if text.len() > MAX_LEN {
        return Arc::from(text);
    }
    // The table holds only complete entries, so one a panicking holder left is
    // still good.
    let mut texts = TEXTS.lock().unwrap_or_else(PoisonError::into_inner);
    if let Some(known) = texts.get(text) {
        return Arc::clone(known);
    }
    let text: Arc<str> = Arc::from(text);
    if texts.len() < MAX_TEXTS {
        texts.insert(Arc::clone(&text));
    }
    text
}

/// Reads a text as [`shared`] holds it, without a copy of its own first.
pub(crate) fn deserialize<'de, D: Deserializer<'de>>(
    deserializer: D,
) -> Result<Arc<str>, D::Error> {
    deserializer.deserialize_str(TextVisitor)
}

/// Reads an optional text as [`shared`] holds it.
pub(crate) fn deserialize_option<'de, D: Deserializer<'de>>(
    deserializer: D,
) -> Result<Option<Arc<str>>, D::Error> {
    deserializer.deserialize_option(OptionVisitor)
}

struct TextVisitor;

impl Visitor<'_> for TextVisitor {
    type Value = Arc<str>;

    fn expecting(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter.write_str("a string")
    }

    fn visit_str<E: serde::de::Error>(self, text: &str) -> Result<Arc<str>, E> {
        Ok(shared(text))
    }
}

struct OptionVisitor;

impl<'de> Visitor<'de> for OptionVisitor {
    type Value = Option<Arc<str>>;

    fn expecting(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter.write_str("a string or null")
    }

    fn visit_none<E: serde::de::Error>(self) -> Result<Self::Value, E> {
        Ok(None)
    }

    fn visit_unit<E: serde::de::Error>(self) -> Result<Self::Value, E> {
        Ok(None)
    }

    fn visit_some<D: Deserializer<'de>>(self, deserializer: D) -> Result<Self::Value, D::Error> {
        deserialize(deserializer).map(Some)
    }
}

#[cfg(test)]
mod tests {
    use serde::Deserialize;

    use super::*;

    #[test]
    fn equal_short_texts_are_one_allocation_and_long_ones_are_not_kept() {
        let first = shared("all workers exited with status 0");
        let again = shared(&String::from("all workers exited with status 0"));
        assert!(Arc::ptr_eq(&first, &again));
        let long = "x".repeat(MAX_LEN + 1);
        assert!(!Arc::ptr_eq(&shared(&long), &shared(&long)));
        assert_eq!(&*shared(&long), long);
    }

    #[test]
    fn texts_read_from_json_are_shared_with_escapes_undone() {
        #[derive(Deserialize)]
        struct Record {
            #[serde(deserialize_with = "deserialize")]
            outcome: Arc<str>,
            #[serde(deserialize_with = "deserialize_option")]
            reason: Option<Arc<str>>,
        }
        let read = |json: &str| serde_json::from_str::<Record>(json).expect("record");
        let one = read(r#"{"outcome":"succeeded","reason":"said \"no\""}"#);
        let two = read(r#"{"outcome":"succeeded","reason":null}"#);
        assert!(Arc::ptr_eq(&one.outcome, &two.outcome));
        assert_eq!(one.reason.as_deref(), Some(r#"said "no""#));
        assert_eq!(two.reason, None);
    }
}
