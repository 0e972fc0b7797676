//! The elastic columns of a trace: `min_workers`, `max_workers` and
//! `scaling`, read into an [`ElasticJob`], and its speed-up rule.

use super::{Columns, MAX_WORKERS, TraceError, field_error, parse_bounded};

/// An elastic job's range of sizes and how its speed follows its size.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ElasticJob {
    /// The fewest workers it runs with.
    pub min_workers: u32,
    /// The most workers it runs with.
    pub max_workers: u32,
    /// The exponent of its speed-up in thousandths: at `w` workers it runs
    /// `(w / num_workers)^(scaling_milli / 1000)` times as fast as at its
    /// nominal size; 1000 is linear.
    pub scaling_milli: u32,
}

impl ElasticJob {
    /// How fast a job of nominal size `nominal` runs at `workers`, relative to
    /// its nominal size.
    pub fn speed(&self, nominal: u32, workers: u32) -> f64 {
        let ratio = f64::from(workers.max(1)) / f64::from(nominal.max(1));
        ratio.powf(f64::from(self.scaling_milli) / 1000.0)
    }
}

/// Reads the elastic columns: both sizes or neither, `min ≤ num_workers ≤ max`,
/// and `scaling` only for an elastic job.
pub(super) fn parse_elastic(
    line: u64,
    columns: &Columns,
    record: &csv::StringRecord,
    num_workers: u64,
) -> Result<Option<ElasticJob>, TraceError> {
    let (min, max, scaling) = (
        columns.get(record, "min_workers"),
        columns.get(record, "max_workers"),
        columns.get(record, "scaling"),
    );
    if min.is_empty() && max.is_empty() {
        if !scaling.is_empty() {
            return Err(field_error(
                line,
                "scaling",
                scaling,
                "is only meaningful with min_workers and max_workers",
            ));
        }
        return Ok(None);
    }
    if min.is_empty() || max.is_empty() {
        let (column, value) = if min.is_empty() {
            ("min_workers", min)
        } else {
            ("max_workers", max)
        };
        return Err(field_error(
            line,
            column,
            value,
            "an elastic job needs both min_workers and max_workers",
        ));
    }
    let min_workers = parse_bounded(line, "min_workers", min, u64::from(MAX_WORKERS))?;
    let max_workers = parse_bounded(line, "max_workers", max, u64::from(MAX_WORKERS))?;
    if min_workers == 0 || min_workers > num_workers {
        return Err(field_error(
            line,
            "min_workers",
            min,
            "must be between 1 and num_workers",
        ));
    }
    if max_workers < num_workers {
        return Err(field_error(
            line,
            "max_workers",
            max,
            "must be at least num_workers",
        ));
    }
    let scaling_milli = if scaling.is_empty() {
        1000
    } else {
        match scaling.parse::<f64>() {
            Ok(value) if value.is_finite() && value > 0.0 && value <= 1.0 => {
                (value * 1000.0).round().max(1.0) as u32
            }
            _ => {
                return Err(field_error(
                    line,
                    "scaling",
                    scaling,
                    "must be a number above 0 and at most 1",
                ));
            }
        }
    };
    Ok(Some(ElasticJob {
        min_workers: u32::try_from(min_workers).expect("bounded by MAX_WORKERS"),
        max_workers: u32::try_from(max_workers).expect("bounded by MAX_WORKERS"),
        scaling_milli,
    }))
}
