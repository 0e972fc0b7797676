//! The line protocol by which trial processes report metrics on stdout.
//!
//! A line `XP_METRIC {"step": 3, "val_loss": 0.41}` reports the numeric fields of
//! the JSON object under their names at that step. Both command trials and Rust
//! trials (through the SDK's `report`) use it, so the node parses one format.
//!
//! Non-finite values are kept, never dropped: the bare tokens `NaN`, `Infinity`
//! and `-Infinity` (what Python's `json.dumps` prints), the strings `"nan"`,
//! `"inf"`, `"-inf"` (any case; also `"NaN"`, `"Infinity"`) and `null` (what
//! most other JSON writers make of a NaN, read as NaN) all become non-finite
//! `f64`s, which the head records and alerts on (`crate::metric_value`).
//! Numbers as bc, awk or C print them (`.5`, `1.`, `+1`, `nan`, `inf`) are
//! read too; a line that is still not an object of numbers is malformed, and
//! the node counts it and keeps the first (`WorkerReport::MalformedMetrics`).

use std::collections::BTreeMap;

use tokio::io::AsyncBufReadExt;

/// The prefix that marks a metric line.
pub const METRIC_PREFIX: &str = "XP_METRIC ";
/// The longest metric line accepted; longer lines are kept in the log but not parsed.
pub const MAX_METRIC_LINE: usize = 64 * 1024;
/// The longest metric name.
pub const MAX_METRIC_NAME: usize = 128;
/// The most metric names one line may carry.
pub const MAX_METRICS_PER_LINE: usize = 256;

/// One parsed report.
#[derive(Debug, Clone, PartialEq)]
pub struct MetricReport {
    /// The step the values belong to, when the line gave one.
    pub step: Option<u64>,
    /// Metric values by name.
    pub values: BTreeMap<String, f64>,
}

/// Why a line that starts with the metric prefix was not accepted.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum MetricLineError {
    /// The line is longer than [`MAX_METRIC_LINE`].
    #[error("metric line of {len} bytes exceeds the limit of {MAX_METRIC_LINE}")]
    TooLong {
        /// The line's length.
        len: usize,
    },
    /// The payload is not a JSON object.
    #[error("metric line is not a JSON object: {reason}")]
    NotAnObject {
        /// What the JSON parser said.
        reason: String,
    },
    /// A metric name is empty or longer than [`MAX_METRIC_NAME`].
    #[error("metric names must be 1 to {MAX_METRIC_NAME} bytes")]
    BadName,
    /// A value is neither a number, a non-finite word nor null.
    #[error("metric `{name}` is not a number (nor NaN, Infinity or -Infinity)")]
    NotANumber {
        /// The metric's name.
        name: String,
    },
    /// `step` is not a non-negative integer.
    #[error("`step` must be a non-negative integer")]
    BadStep,
    /// Too many metrics on one line.
    #[error("a metric line may carry at most {MAX_METRICS_PER_LINE} values")]
    TooMany,
}

/// The prefix of a checkpoint line: `XP_CHECKPOINT {"step": 120}` says the files
/// in `XP_CHECKPOINT_DIR` are a complete checkpoint taken at that step.
pub const CHECKPOINT_PREFIX: &str = "XP_CHECKPOINT ";

/// Where, under a worker's `XP_WORK_DIR`, its node leaves one file per taken
/// checkpoint, named by the step: `stored ...` or `error: ...`. The SDK waits for
/// it so that `checkpoint` returns the node's verdict.
pub const CHECKPOINT_STATUS_DIR: &str = ".checkpoint-status";

/// Why a checkpoint line was not accepted.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum CheckpointLineError {
    /// The payload is not `{"step": N}`.
    #[error(
        "checkpoint line must be `XP_CHECKPOINT {{\"step\": N}}` with N a non-negative integer: {reason}"
    )]
    Malformed {
        /// What is wrong.
        reason: String,
    },
}

/// Parses a checkpoint line: `Ok(Some(step))`, or `Ok(None)` for other output.
pub fn parse_checkpoint_line(line: &str) -> Result<Option<u64>, CheckpointLineError> {
    let Some(payload) = line.trim_end().strip_prefix(CHECKPOINT_PREFIX) else {
        return Ok(None);
    };
    #[derive(serde::Deserialize)]
    #[serde(deny_unknown_fields)]
    struct Payload {
        step: u64,
    }
    serde_json::from_str::<Payload>(payload)
        .map(|payload| Some(payload.step))
        .map_err(|error| CheckpointLineError::Malformed {
            reason: error.to_string(),
        })
}

/// The checkpoint line for `step`.
pub fn format_checkpoint_line(step: u64) -> String {
    format!("{CHECKPOINT_PREFIX}{{\"step\":{step}}}")
}

/// Parses one line of trial output: `Ok(None)` for ordinary output.
pub fn parse_metric_line(line: &str) -> Result<Option<MetricReport>, MetricLineError> {
    let Some(payload) = line.trim_end().strip_prefix(METRIC_PREFIX) else {
        return Ok(None);
    };
    if line.len() > MAX_METRIC_LINE {
        return Err(MetricLineError::TooLong { len: line.len() });
    }
    let payload = normalize_numbers(payload);
    let object: serde_json::Map<String, serde_json::Value> = serde_json::from_str(&payload)
        .map_err(|error| MetricLineError::NotAnObject {
            reason: error.to_string(),
        })?;
    if object.len() > MAX_METRICS_PER_LINE {
        return Err(MetricLineError::TooMany);
    }
    let mut report = MetricReport {
        step: None,
        values: BTreeMap::new(),
    };
    for (name, value) in object {
        if name == "step" {
            report.step = Some(value.as_u64().ok_or(MetricLineError::BadStep)?);
            continue;
        }
        if name.is_empty() || name.len() > MAX_METRIC_NAME {
            return Err(MetricLineError::BadName);
        }
        let number = match &value {
            // Most JSON writers (JavaScript's, serde_json) turn NaN and the
            // infinities into null: a null is a value that went wrong, not none.
            serde_json::Value::Null => Some(f64::NAN),
            serde_json::Value::Number(number) => number.as_f64(),
            serde_json::Value::String(word) => crate::metric_value::parse_nonfinite_word(word),
            _ => None,
        }
        .ok_or_else(|| MetricLineError::NotANumber { name: name.clone() })?;
        report.values.insert(name, number);
    }
    Ok(Some(report))
}

/// Rewrites the bare words outside strings that are numbers as other tools
/// print them but JSON does not allow: `.5`, `1.`, `+1` (bc, awk, C's
/// `printf`), and `NaN`, `Infinity`, `-Infinity`, `nan`, `inf` (Python's
/// `json.dumps` and `print`): finite ones as JSON numbers (an integral one as
/// an integer, so `"step": 3.` is a step), non-finite ones as the strings
/// [`crate::metric_value::parse_nonfinite_word`] reads. JSON's own numbers and
/// `true`, `false`, `null` are left as they are; anything else stays and
/// makes the line malformed.
fn normalize_numbers(payload: &str) -> std::borrow::Cow<'_, str> {
    let is_word =
        |byte: u8| byte.is_ascii_alphanumeric() || matches!(byte, b'.' | b'+' | b'-' | b'_');
    let bytes = payload.as_bytes();
    let mut out = String::new();
    let (mut start, mut index, mut in_string, mut escaped) = (0, 0, false, false);
    while index < bytes.len() {
        let byte = bytes[index];
        if in_string {
            if escaped {
                escaped = false;
            } else if byte == b'\\' {
                escaped = true;
            } else if byte == b'"' {
                in_string = false;
            }
            index += 1;
            continue;
        }
        if byte == b'"' {
            in_string = true;
            index += 1;
            continue;
        }
        if !is_word(byte) {
            index += 1;
            continue;
        }
        let end = index
            + bytes[index..]
                .iter()
                .take_while(|byte| is_word(**byte))
                .count();
        let word = &payload[index..end];
        if let Some(rewritten) = rewrite_number(word) {
            out.push_str(&payload[start..index]);
            out.push_str(&rewritten);
            start = end;
        }
        index = end;
    }
    if start == 0 {
        return std::borrow::Cow::Borrowed(payload);
    }
    out.push_str(&payload[start..]);
    std::borrow::Cow::Owned(out)
}

/// `word` as JSON, when it is a number JSON spells otherwise.
fn rewrite_number(word: &str) -> Option<String> {
    if matches!(word, "true" | "false" | "null")
        || serde_json::from_str::<serde_json::Number>(word).is_ok()
    {
        return None;
    }
    let value: f64 = word.parse().ok()?;
    Some(if value.is_nan() {
        "\"nan\"".to_owned()
    } else if value.is_infinite() {
        if value > 0.0 { "\"inf\"" } else { "\"-inf\"" }.to_owned()
    } else if value.fract() == 0.0 && value.abs() < 1e15 {
        format!("{}", value as i64)
    } else {
        serde_json::Value::from(value).to_string()
    })
}

/// Formats a report as a metric line (without the newline); non-finite values
/// are written as Python writes them (`NaN`, `Infinity`, `-Infinity`).
pub fn format_metric_line(step: Option<u64>, values: &BTreeMap<String, f64>) -> String {
    let mut line = String::from(METRIC_PREFIX);
    line.push('{');
    let mut first = true;
    let mut separate = |line: &mut String| {
        if !std::mem::take(&mut first) {
            line.push(',');
        }
    };
    if let Some(step) = step {
        separate(&mut line);
        line.push_str(&format!("\"step\":{step}"));
    }
    for (name, value) in values {
        separate(&mut line);
        line.push_str(&serde_json::Value::String(name.clone()).to_string());
        line.push(':');
        match crate::metric_value::nonfinite_name(*value) {
            Some(word) => line.push_str(word),
            None => line.push_str(&serde_json::Value::from(*value).to_string()),
        }
    }
    line.push('}');
    line
}

/// Reads one line of at most `max` bytes (a longer line comes back in pieces), so a
/// worker that never prints a newline cannot exhaust the node's memory.
pub async fn read_bounded_line(
    reader: &mut (impl tokio::io::AsyncBufRead + Unpin),
    line: &mut Vec<u8>,
    max: usize,
) -> std::io::Result<usize> {
    line.clear();
    loop {
        let available = reader.fill_buf().await?;
        if available.is_empty() {
            return Ok(line.len());
        }
        let room = max - line.len();
        let window = &available[..available.len().min(room)];
        if let Some(newline) = window.iter().position(|byte| *byte == b'\n') {
            line.extend_from_slice(&window[..=newline]);
            reader.consume(newline + 1);
            return Ok(line.len());
        }
        let taken = window.len();
        line.extend_from_slice(window);
        reader.consume(taken);
        if line.len() >= max {
            return Ok(line.len());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn metric_lines_parse_and_round_trip() {
        let report = parse_metric_line(r#"XP_METRIC {"step": 3, "val_loss": 0.41}"#)
            .unwrap()
            .unwrap();
        assert_eq!(report.step, Some(3));
        assert_eq!(report.values["val_loss"], 0.41);
        let line = format_metric_line(report.step, &report.values);
        assert_eq!(parse_metric_line(&line).unwrap().unwrap(), report);
    }

    #[tokio::test]
    async fn long_lines_come_back_in_bounded_pieces() {
        let input = format!("short\n{}\nend", "x".repeat(100));
        let mut reader = tokio::io::BufReader::new(input.as_bytes());
        let mut line = Vec::new();
        let mut pieces = Vec::new();
        while read_bounded_line(&mut reader, &mut line, 40).await.unwrap() > 0 {
            assert!(line.len() <= 40);
            pieces.push(String::from_utf8(line.clone()).unwrap());
        }
        assert_eq!(pieces.concat(), input);
        assert_eq!(pieces[0], "short\n");
    }

    #[test]
    fn other_lines_and_bad_payloads() {
        assert_eq!(parse_metric_line("epoch 3 done").unwrap(), None);
        assert!(matches!(
            parse_metric_line("XP_METRIC [1]"),
            Err(MetricLineError::NotAnObject { .. })
        ));
        assert!(matches!(
            parse_metric_line(r#"XP_METRIC {"loss": "high"}"#),
            Err(MetricLineError::NotANumber { .. })
        ));
        assert_eq!(
            parse_metric_line(r#"XP_METRIC {"step": -1}"#),
            Err(MetricLineError::BadStep)
        );
        let partial = parse_metric_line(r#"XP_METRIC {"loss": null, "acc": 0.5}"#)
            .unwrap()
            .unwrap();
        assert!(
            partial.values["loss"].is_nan(),
            "a null is a NaN, never dropped"
        );
        assert_eq!(partial.values["acc"], 0.5);
    }

    #[test]
    fn nonfinite_values_are_kept_in_every_spelling() {
        let check = |line: &str, name: &str, expected: f64| {
            let report = parse_metric_line(line).unwrap().unwrap();
            let value = report.values[name];
            assert!(
                (expected.is_nan() && value.is_nan()) || value == expected,
                "{line}: {value}"
            );
        };
        // Python's json.dumps.
        check(r#"XP_METRIC {"step": 3, "loss": NaN}"#, "loss", f64::NAN);
        check(
            r#"XP_METRIC {"loss": Infinity, "a": 1}"#,
            "loss",
            f64::INFINITY,
        );
        check(
            r#"XP_METRIC {"loss": -Infinity}"#,
            "loss",
            f64::NEG_INFINITY,
        );
        check(r#"XP_METRIC {"loss":NaN}"#, "loss", f64::NAN);
        // Strings, as str(float) writes them.
        check(r#"XP_METRIC {"loss": "nan"}"#, "loss", f64::NAN);
        check(r#"XP_METRIC {"loss": "inf"}"#, "loss", f64::INFINITY);
        check(r#"XP_METRIC {"loss": "-inf"}"#, "loss", f64::NEG_INFINITY);
        check(r#"XP_METRIC {"loss": "Infinity"}"#, "loss", f64::INFINITY);
        // A token inside a string or a name is text, not a value.
        let report = parse_metric_line(r#"XP_METRIC {"NaN loss \"NaN\"": 1.5}"#)
            .unwrap()
            .unwrap();
        assert_eq!(report.values["NaN loss \"NaN\""], 1.5);
        assert!(matches!(
            parse_metric_line(r#"XP_METRIC {"loss": "NaNa"}"#),
            Err(MetricLineError::NotANumber { .. })
        ));
        assert!(parse_metric_line(r#"XP_METRIC {"loss": NaNa}"#).is_err());
        // Written back as Python writes them, and read again.
        let values = BTreeMap::from([
            ("loss".to_owned(), f64::NAN),
            ("up".to_owned(), f64::INFINITY),
            ("down".to_owned(), f64::NEG_INFINITY),
            ("acc".to_owned(), 0.5),
        ]);
        let line = format_metric_line(Some(7), &values);
        assert_eq!(
            line,
            r#"XP_METRIC {"step":7,"acc":0.5,"down":-Infinity,"loss":NaN,"up":Infinity}"#
        );
        let back = parse_metric_line(&line).unwrap().unwrap();
        assert_eq!(back.step, Some(7));
        assert!(back.values["loss"].is_nan());
        assert_eq!(back.values["up"], f64::INFINITY);
        assert_eq!(back.values["down"], f64::NEG_INFINITY);
    }

    #[test]
    fn numbers_as_bc_awk_and_python_print_them_are_read() {
        let report = parse_metric_line(
            r#"XP_METRIC {"step": 3., "acc": .0333, "b": 1., "c": -.5, "d": +2, "e": 1e-3, "f": 2E+2, "g": nan, "h": -inf, "i": inf}"#,
        )
        .unwrap()
        .unwrap();
        assert_eq!(report.step, Some(3));
        let values = &report.values;
        assert_eq!(
            [
                values["acc"],
                values["b"],
                values["c"],
                values["d"],
                values["e"],
                values["f"]
            ],
            [0.0333, 1.0, -0.5, 2.0, 0.001, 200.0]
        );
        assert!(values["g"].is_nan());
        assert_eq!(
            (values["h"], values["i"]),
            (f64::NEG_INFINITY, f64::INFINITY)
        );
        // Words that are no number stay malformed.
        for line in [
            r#"XP_METRIC {"acc": 0.3.3}"#,
            r#"XP_METRIC {"acc": ..5}"#,
            r#"XP_METRIC {"acc": nope}"#,
            r#"XP_METRIC {"acc": 1,}"#,
        ] {
            assert!(parse_metric_line(line).is_err(), "{line}");
        }
    }

    #[test]
    fn checkpoint_lines_round_trip_and_reject_garbage() {
        assert_eq!(
            parse_checkpoint_line(&format_checkpoint_line(42)),
            Ok(Some(42))
        );
        assert_eq!(parse_checkpoint_line("XP_METRIC {\"step\": 1}"), Ok(None));
        assert_eq!(parse_checkpoint_line("hello"), Ok(None));
        for bad in [
            "XP_CHECKPOINT {}",
            "XP_CHECKPOINT {\"step\": -1}",
            "XP_CHECKPOINT {\"step\": 1, \"x\": 2}",
            "XP_CHECKPOINT step=3",
        ] {
            assert!(parse_checkpoint_line(bad).is_err(), "{bad}");
        }
    }
}
