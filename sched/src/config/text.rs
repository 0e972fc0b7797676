//! How the policy file writes amounts and durations: fractional GPUs and CPUs
//! (`1.5`, thousandths inside), memory sizes (`16GiB`) and durations (`60s`,
//! `5m`), for serde's `with` attributes in [`super`]. Parsing only; the
//! values' meaning and limits are checked by `PolicyConfig::validate`.

/// Fractional amounts in YAML (`1.5`), thousandths inside.
pub(super) mod thousandths {
    use serde::{Deserialize, Deserializer, Serializer};

    pub(crate) fn serialize<S: Serializer>(
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

    pub(crate) fn deserialize<'de, D: Deserializer<'de>>(
        deserializer: D,
    ) -> Result<Option<u64>, D::Error> {
        let amount = f64::deserialize(deserializer)?;
        from_amount(amount)
            .map(Some)
            .map_err(serde::de::Error::custom)
    }

    /// Why an amount is refused.
    #[derive(Debug, Clone, Copy, PartialEq, thiserror::Error)]
    pub(crate) enum AmountError {
        /// Negative, infinite or not a number.
        #[error("{amount} is not a non-negative amount")]
        Negative { amount: f64 },
        /// Finer than thousandths.
        #[error("{amount} has more than three decimals")]
        TooPrecise { amount: f64 },
        /// Beyond what thousandths in a `u64` hold.
        #[error("{amount} is too large")]
        TooLarge { amount: f64 },
    }

    pub(crate) fn from_amount(amount: f64) -> Result<u64, AmountError> {
        if !amount.is_finite() || amount < 0.0 {
            return Err(AmountError::Negative { amount });
        }
        let milli = (amount * 1000.0).round();
        if (amount * 1000.0 - milli).abs() > 1e-6 {
            return Err(AmountError::TooPrecise { amount });
        }
        if milli >= u64::MAX as f64 {
            return Err(AmountError::TooLarge { amount });
        }
        Ok(milli as u64)
    }
}

/// Memory in YAML as `16GiB` or a plain byte count.
pub(super) mod memory_text {
    use serde::{Deserialize, Deserializer, Serializer};
    use xp_runtime::spec::MemoryBytes;

    pub(crate) fn serialize<S: Serializer>(
        value: &Option<u64>,
        serializer: S,
    ) -> Result<S::Ok, S::Error> {
        match value {
            Some(bytes) => serializer.serialize_u64(*bytes),
            None => serializer.serialize_none(),
        }
    }

    pub(crate) fn deserialize<'de, D: Deserializer<'de>>(
        deserializer: D,
    ) -> Result<Option<u64>, D::Error> {
        Ok(Some(MemoryBytes::deserialize(deserializer)?.0))
    }
}

/// Byte counts in YAML as `16MiB` or a plain integer; written as an integer.
pub(super) mod bytes_text {
    use serde::{Deserialize, Deserializer, Serializer};
    use xp_runtime::spec::MemoryBytes;

    pub(crate) fn serialize<S: Serializer>(value: &u64, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_u64(*value)
    }

    pub(crate) fn deserialize<'de, D: Deserializer<'de>>(deserializer: D) -> Result<u64, D::Error> {
        Ok(MemoryBytes::deserialize(deserializer)?.0)
    }
}

/// Durations in YAML as `60s`, `5m`, `1h 30m`; milliseconds inside.
pub(super) mod duration_text {
    use serde::{Deserialize, Deserializer, Serializer};

    pub(crate) fn serialize<S: Serializer>(value: &u64, serializer: S) -> Result<S::Ok, S::Error> {
        let text = humantime::format_duration(std::time::Duration::from_millis(*value));
        serializer.serialize_str(&text.to_string())
    }

    pub(crate) fn deserialize<'de, D: Deserializer<'de>>(deserializer: D) -> Result<u64, D::Error> {
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

/// Optional durations in YAML (`30m`); milliseconds inside.
pub(super) mod optional_duration_text {
    use serde::{Deserializer, Serializer};

    pub(crate) fn serialize<S: Serializer>(
        value: &Option<u64>,
        serializer: S,
    ) -> Result<S::Ok, S::Error> {
        match value {
            Some(millis) => super::duration_text::serialize(millis, serializer),
            None => serializer.serialize_none(),
        }
    }

    pub(crate) fn deserialize<'de, D: Deserializer<'de>>(
        deserializer: D,
    ) -> Result<Option<u64>, D::Error> {
        super::duration_text::deserialize(deserializer).map(Some)
    }
}
