//! The workload trace: one CSV row per job, each job a gang of identical workers.
//!
//! Columns (any order, a header row first): required `job_id`, `submit_s`,
//! `duration_s` (empty: never finishes), `num_workers`, `gpus_per_worker` (0, a
//! fraction such as 0.47, or a whole number); optional `cpu_milli_per_worker`,
//! `mem_mib_per_worker`, `gpu_types` (models separated by `|`), `priority` (an
//! integer or a class name), `team`, `preemptible`, `time_limit_s`,
//! `ckpt_interval_s`, `deps` (job ids separated by `;`), `estimate_s` (the
//! duration declared up front, which the critical-path boost may use instead
//! of `duration_s`, the truth) and `kind` (jobs whose durations inform each
//! other's estimates, such as one pipeline stage run after run); for GPU
//! oversubscription, `oversubscribe` (the job opts in to sharing a GPU promised
//! beyond its memory), `gpu_mem_peak` (the most GPU memory one worker uses, as
//! a fraction of its GPU's memory, 0 to 1) and `gpu_mem_peak_at_s` (how far into
//! its run it reaches that peak: read and written back, but not yet modelled,
//! as `--place-once` has no clock and takes every worker at its peak); for
//! elastic jobs,
//! `min_workers` and `max_workers` (both or neither, around `num_workers`, the
//! size `duration_s` is measured at) and `scaling` (0 to 1, default 1: the
//! job's speed at `w` workers is `(w / num_workers)^scaling`, linear by default).
//!
//! Parsing is strict: unknown or repeated columns, malformed values and absurd
//! sizes are errors naming the line and column. Quoted fields are accepted but
//! never needed. This module only parses and writes text; it does not simulate.
//!
//! Invariant: every [`TraceJob::deps`] index points at another job of the same
//! trace, and `gpu_milli_per_worker` is at most 1000 or a whole multiple of 1000.

use std::collections::HashMap;

use crate::GPU_MILLI;

pub use self::elastic::ElasticJob;
use self::elastic::parse_elastic;

mod elastic;

/// The most rows a trace may have.
pub const MAX_ROWS: usize = 10_000_000;
/// The most workers one job may ask for.
pub const MAX_WORKERS: u32 = 100_000;
/// The most whole GPUs one worker may ask for.
pub const MAX_GPUS_PER_WORKER: u64 = 1024;
/// The largest time in seconds accepted anywhere in a trace (about 31 years).
pub const MAX_SECONDS: f64 = 1e9;
/// The most CPU thousandths one worker may ask for (a million cores).
pub const MAX_CPU_MILLI: u64 = 1_000_000_000;
/// The most memory one worker may ask for, in MiB (one PiB).
pub const MAX_MEM_MIB: u64 = 1 << 30;
/// The longest accepted job id, team or class name, in bytes.
pub const MAX_NAME_LEN: usize = 256;

const REQUIRED: [&str; 5] = [
    "job_id",
    "submit_s",
    "duration_s",
    "num_workers",
    "gpus_per_worker",
];
const OPTIONAL: [&str; 17] = [
    "cpu_milli_per_worker",
    "mem_mib_per_worker",
    "gpu_types",
    "priority",
    "team",
    "preemptible",
    "time_limit_s",
    "ckpt_interval_s",
    "deps",
    "estimate_s",
    "kind",
    "oversubscribe",
    "gpu_mem_peak",
    "gpu_mem_peak_at_s",
    "min_workers",
    "max_workers",
    "scaling",
];

/// Why a trace is rejected.
#[derive(Debug, thiserror::Error)]
pub enum TraceError {
    /// The text is not well-formed CSV (such as a row with a different number of fields).
    #[error("line {line}: {source}")]
    Csv {
        /// The line of the offending record (1 is the header).
        line: u64,
        /// What the CSV reader found.
        #[source]
        source: csv::Error,
    },
    /// The header lacks a required column.
    #[error("the header has no `{column}` column")]
    MissingColumn {
        /// The column.
        column: &'static str,
    },
    /// The header names a column this format does not know.
    #[error("unknown column `{column}` (known: {known})")]
    UnknownColumn {
        /// The column as written.
        column: String,
        /// The columns accepted.
        known: String,
    },
    /// The header names a column twice.
    #[error("column `{column}` appears twice in the header")]
    DuplicateColumn {
        /// The column.
        column: String,
    },
    /// A value is malformed or out of range.
    #[error("line {line}, column `{column}`: {reason} (got {value:?})")]
    Field {
        /// The line (1 is the header).
        line: u64,
        /// The column.
        column: &'static str,
        /// The value as written, cut to 64 characters.
        value: String,
        /// What is wrong with it.
        reason: String,
    },
    /// Two rows share a job id.
    #[error("line {line}: job id {job_id:?} is already used on line {first_line}")]
    DuplicateJob {
        /// The line of the second use.
        line: u64,
        /// The id.
        job_id: String,
        /// The line of the first use.
        first_line: u64,
    },
    /// A dependency names a job that is not in the trace.
    #[error("line {line}, column `deps`: job {job_id:?} depends on unknown job {dep:?}")]
    UnknownDependency {
        /// The line of the dependent job.
        line: u64,
        /// The dependent job.
        job_id: String,
        /// The id that names no job.
        dep: String,
    },
    /// The trace has more rows than [`MAX_ROWS`].
    #[error("the trace has more than {max} rows")]
    TooManyRows {
        /// The limit.
        max: usize,
    },
    /// The trace has a header but no job.
    #[error("the trace has no jobs")]
    Empty,
}

/// A job's base priority as written in the trace.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum JobPriority {
    /// An integer priority.
    Value(i64),
    /// A priority class name, resolved through the policy's priority classes.
    Class(String),
}

/// One job of a trace: a gang of `num_workers` identical workers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TraceJob {
    /// The id as written in the trace.
    pub job_id: String,
    /// When it is submitted, in milliseconds from the trace's time zero.
    pub submit_ms: u64,
    /// How long it runs once placed, in milliseconds; `None` never finishes.
    pub duration_ms: Option<u64>,
    /// Workers in the gang.
    pub num_workers: u32,
    /// GPU thousandths per worker: at most 1000 (a share of one GPU) or a whole
    /// multiple of 1000.
    pub gpu_milli_per_worker: u64,
    /// CPU thousandths per worker.
    pub cpu_milli_per_worker: u64,
    /// Memory per worker, in MiB.
    pub mem_mib_per_worker: u64,
    /// Acceptable GPU models; empty accepts any.
    pub gpu_types: Vec<String>,
    /// The base priority; `None` is the policy's default (0).
    pub priority: Option<JobPriority>,
    /// The owning team, an index into [`Trace::teams`].
    pub team: u32,
    /// Whether the policy may preempt it.
    pub preemptible: bool,
    /// The longest one run may last before it is killed, in milliseconds.
    pub time_limit_ms: Option<u64>,
    /// How often it checkpoints, in milliseconds of its run; `None` never does.
    pub ckpt_interval_ms: Option<u64>,
    /// The jobs (indexes into [`Trace::jobs`]) that must complete before it is submitted.
    pub deps: Vec<u32>,
    /// The line it was read from (1 is the header); 0 for generated jobs.
    pub line: u64,
    /// The duration declared before it runs, in milliseconds; an estimate,
    /// not the truth (`duration_ms`).
    pub estimate_ms: Option<u64>,
    /// Jobs of one kind inform each other's duration estimates.
    pub kind: Option<String>,
    /// The most GPU memory one worker uses, in thousandths of its GPU's memory
    /// (1 to 1000); `None` is unknown (never evicted for memory).
    pub gpu_mem_peak_milli: Option<u32>,
    /// When in its run a worker reaches that peak, in milliseconds; before it
    /// uses half the peak. `None` is from the start.
    pub gpu_mem_peak_at_ms: Option<u64>,
    /// Whether its fractional workers may share a GPU promised beyond its
    /// memory (the policy's `oversubscription`).
    pub oversubscribe: bool,
    /// For an elastic job, the sizes it may run at and how its speed scales.
    pub elastic: Option<ElasticJob>,
}

impl TraceJob {
    /// GPU thousandths of the whole gang.
    pub fn total_gpu_milli(&self) -> u64 {
        self.gpu_milli_per_worker * u64::from(self.num_workers)
    }
}

/// A parsed trace.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Trace {
    /// The jobs in file order.
    pub jobs: Vec<TraceJob>,
    /// Team names; [`TraceJob::team`] indexes this list, in order of first appearance.
    pub teams: Vec<String>,
}

/// The team of rows that leave `team` empty.
pub const DEFAULT_TEAM: &str = "default";

struct Columns {
    index: HashMap<&'static str, usize>,
}

impl Columns {
    fn get<'r>(&self, record: &'r csv::StringRecord, column: &'static str) -> &'r str {
        self.index
            .get(column)
            .and_then(|&index| record.get(index))
            .unwrap_or("")
    }
}

fn field_error(
    line: u64,
    column: &'static str,
    value: &str,
    reason: impl Into<String>,
) -> TraceError {
    TraceError::Field {
        line,
        column,
        value: value.chars().take(64).collect(),
        reason: reason.into(),
    }
}

fn parse_seconds(line: u64, column: &'static str, value: &str) -> Result<u64, TraceError> {
    let seconds: f64 = value
        .parse()
        .map_err(|_| field_error(line, column, value, "not a number of seconds"))?;
    if !seconds.is_finite() || seconds < 0.0 {
        return Err(field_error(
            line,
            column,
            value,
            "must be a finite number of seconds, at least 0",
        ));
    }
    if seconds > MAX_SECONDS {
        return Err(field_error(
            line,
            column,
            value,
            format!("must be at most {MAX_SECONDS} seconds"),
        ));
    }
    // The bound above keeps the product far below u64::MAX.
    Ok((seconds * 1000.0).round() as u64)
}

fn parse_positive_seconds(line: u64, column: &'static str, value: &str) -> Result<u64, TraceError> {
    let millis = parse_seconds(line, column, value)?;
    if millis == 0 {
        return Err(field_error(
            line,
            column,
            value,
            "must be at least 0.001 seconds",
        ));
    }
    Ok(millis)
}

fn parse_bounded(
    line: u64,
    column: &'static str,
    value: &str,
    max: u64,
) -> Result<u64, TraceError> {
    let number: u64 = value
        .parse()
        .map_err(|_| field_error(line, column, value, "not a whole number at least 0"))?;
    if number > max {
        return Err(field_error(
            line,
            column,
            value,
            format!("must be at most {max}"),
        ));
    }
    Ok(number)
}

/// Parses a GPU count per worker into thousandths.
fn parse_gpus(line: u64, value: &str) -> Result<u64, TraceError> {
    const COLUMN: &str = "gpus_per_worker";
    let gpus: f64 = value
        .parse()
        .map_err(|_| field_error(line, COLUMN, value, "not a number of GPUs"))?;
    if !gpus.is_finite() || gpus < 0.0 {
        return Err(field_error(
            line,
            COLUMN,
            value,
            "must be a finite number at least 0",
        ));
    }
    if gpus > 1.0 {
        if gpus.fract() != 0.0 {
            return Err(field_error(
                line,
                COLUMN,
                value,
                "more than one GPU must be a whole number",
            ));
        }
        if gpus > MAX_GPUS_PER_WORKER as f64 {
            return Err(field_error(
                line,
                COLUMN,
                value,
                format!("must be at most {MAX_GPUS_PER_WORKER}"),
            ));
        }
        return Ok(gpus as u64 * GPU_MILLI);
    }
    let milli = gpus * GPU_MILLI as f64;
    let rounded = milli.round();
    if (milli - rounded).abs() > 1e-6 {
        return Err(field_error(
            line,
            COLUMN,
            value,
            "a fraction of a GPU must be a multiple of 0.001",
        ));
    }
    Ok(rounded as u64)
}

fn parse_bool(
    line: u64,
    column: &'static str,
    value: &str,
    empty: bool,
) -> Result<bool, TraceError> {
    match value.to_ascii_lowercase().as_str() {
        "" => Ok(empty),
        "true" | "1" | "yes" => Ok(true),
        "false" | "0" | "no" => Ok(false),
        _ => Err(field_error(line, column, value, "must be true or false")),
    }
}

/// Parses a fraction of a GPU's memory, `(0, 1]`, into thousandths.
fn parse_memory_fraction(line: u64, value: &str) -> Result<u32, TraceError> {
    const COLUMN: &str = "gpu_mem_peak";
    let fraction: f64 = value
        .parse()
        .map_err(|_| field_error(line, COLUMN, value, "not a number"))?;
    if !(fraction.is_finite() && fraction > 0.0 && fraction <= 1.0) {
        return Err(field_error(
            line,
            COLUMN,
            value,
            "must be a fraction of the GPU's memory above 0 and at most 1",
        ));
    }
    // At least one thousandth, so a tiny peak is still a peak.
    Ok(((fraction * 1000.0).round() as u32).max(1))
}

fn check_name(line: u64, column: &'static str, value: &str) -> Result<(), TraceError> {
    if value.is_empty() {
        return Err(field_error(line, column, value, "must not be empty"));
    }
    if value.len() > MAX_NAME_LEN {
        return Err(field_error(
            line,
            column,
            value,
            format!("must be at most {MAX_NAME_LEN} bytes"),
        ));
    }
    if value.chars().any(|character| character.is_control()) {
        return Err(field_error(
            line,
            column,
            value,
            "must not contain control characters",
        ));
    }
    Ok(())
}

fn parse_priority(line: u64, value: &str) -> Result<Option<JobPriority>, TraceError> {
    if value.is_empty() {
        return Ok(None);
    }
    if let Ok(number) = value.parse::<i64>() {
        return Ok(Some(JobPriority::Value(number)));
    }
    let valid = value
        .chars()
        .all(|character| character.is_ascii_alphanumeric() || matches!(character, '_' | '-' | '.'));
    if !valid || value.starts_with(['-', '+']) || value.len() > MAX_NAME_LEN {
        return Err(field_error(
            line,
            "priority",
            value,
            "must be an integer or a priority class name (letters, digits, `_`, `-`, `.`)",
        ));
    }
    Ok(Some(JobPriority::Class(value.to_owned())))
}

/// Parses a trace from CSV text.
pub fn parse_trace(text: &str) -> Result<Trace, TraceError> {
    let mut reader = csv::ReaderBuilder::new()
        .has_headers(true)
        .trim(csv::Trim::All)
        .comment(None)
        .flexible(false)
        .from_reader(text.as_bytes());
    // 1. The header: which column is where.
    let header = reader
        .headers()
        .map_err(|source| TraceError::Csv { line: 1, source })?
        .clone();
    let columns = Columns::from_header(&header)?;
    // 2. The rows, their dependencies kept by name.
    let mut trace = Trace::default();
    let mut team_index: HashMap<String, u32> = HashMap::new();
    let mut job_index: HashMap<String, u32> = HashMap::new();
    let mut pending_deps: Vec<(u32, Vec<String>)> = Vec::new();
    let mut record = csv::StringRecord::new();
    loop {
        let more = reader
            .read_record(&mut record)
            .map_err(|source| TraceError::Csv {
                line: source.position().map_or(0, csv::Position::line),
                source,
            })?;
        if !more {
            break;
        }
        if trace.jobs.len() >= MAX_ROWS {
            return Err(TraceError::TooManyRows { max: MAX_ROWS });
        }
        let row = Row {
            columns: &columns,
            record: &record,
            line: record.position().map_or(0, csv::Position::line),
        };
        let job = parse_row(&row, &mut trace.teams, &mut team_index)?;
        let job_number = u32::try_from(trace.jobs.len()).expect("MAX_ROWS fits in u32");
        if let Some(&first) = job_index.get(&job.job_id) {
            return Err(TraceError::DuplicateJob {
                line: row.line,
                job_id: job.job_id,
                first_line: trace.jobs[first as usize].line,
            });
        }
        job_index.insert(job.job_id.clone(), job_number);
        let deps = parse_deps(&row, &job.job_id)?;
        if !deps.is_empty() {
            pending_deps.push((job_number, deps));
        }
        trace.jobs.push(job);
    }
    if trace.jobs.is_empty() {
        return Err(TraceError::Empty);
    }
    // 3. Dependencies by index, once every id is known.
    resolve_deps(&mut trace, &job_index, pending_deps)?;
    Ok(trace)
}

impl Columns {
    /// Where each known column is; unknown, repeated or missing required
    /// columns are errors.
    fn from_header(header: &csv::StringRecord) -> Result<Self, TraceError> {
        let mut index = HashMap::new();
        for (position, name) in header.iter().enumerate() {
            let Some(&known) = REQUIRED
                .iter()
                .chain(OPTIONAL.iter())
                .find(|known| **known == name)
            else {
                return Err(TraceError::UnknownColumn {
                    column: name.to_owned(),
                    known: REQUIRED
                        .iter()
                        .chain(OPTIONAL.iter())
                        .copied()
                        .collect::<Vec<_>>()
                        .join(", "),
                });
            };
            if index.insert(known, position).is_some() {
                return Err(TraceError::DuplicateColumn {
                    column: name.to_owned(),
                });
            }
        }
        for column in REQUIRED {
            if !index.contains_key(column) {
                return Err(TraceError::MissingColumn { column });
            }
        }
        Ok(Self { index })
    }
}

/// One data row and its line, for the parsers of its fields.
struct Row<'a> {
    columns: &'a Columns,
    record: &'a csv::StringRecord,
    line: u64,
}

impl<'a> Row<'a> {
    /// The text of `column`; empty when the trace lacks the column.
    fn get(&self, column: &'static str) -> &'a str {
        self.columns.get(self.record, column)
    }

    /// `column` read by `parse`, or `None` when it is empty.
    fn optional<T>(
        &self,
        column: &'static str,
        parse: impl FnOnce(u64, &'static str, &'a str) -> Result<T, TraceError>,
    ) -> Result<Option<T>, TraceError> {
        match self.get(column) {
            "" => Ok(None),
            value => parse(self.line, column, value).map(Some),
        }
    }
}

/// The job ids of the row's `deps` column, neither empty nor its own `job_id`.
fn parse_deps(row: &Row<'_>, job_id: &str) -> Result<Vec<String>, TraceError> {
    let deps = row.get("deps");
    let mut names = Vec::new();
    if deps.is_empty() {
        return Ok(names);
    }
    for dep in deps.split(';') {
        let dep = dep.trim();
        if dep.is_empty() {
            return Err(field_error(
                row.line,
                "deps",
                deps,
                "an empty job id between `;`",
            ));
        }
        if dep == job_id {
            return Err(field_error(
                row.line,
                "deps",
                deps,
                "a job cannot depend on itself",
            ));
        }
        names.push(dep.to_owned());
    }
    Ok(names)
}

/// Sets each job's dependencies, named in `pending_deps`, by index.
fn resolve_deps(
    trace: &mut Trace,
    job_index: &HashMap<String, u32>,
    pending_deps: Vec<(u32, Vec<String>)>,
) -> Result<(), TraceError> {
    for (job_number, names) in pending_deps {
        let mut deps = Vec::with_capacity(names.len());
        for name in names {
            let Some(&dep) = job_index.get(&name) else {
                let job = &trace.jobs[job_number as usize];
                return Err(TraceError::UnknownDependency {
                    line: job.line,
                    job_id: job.job_id.clone(),
                    dep: name,
                });
            };
            if !deps.contains(&dep) {
                deps.push(dep);
            }
        }
        trace.jobs[job_number as usize].deps = deps;
    }
    Ok(())
}

/// One job from its row; its team is interned in `teams`.
fn parse_row(
    row: &Row<'_>,
    teams: &mut Vec<String>,
    team_index: &mut HashMap<String, u32>,
) -> Result<TraceJob, TraceError> {
    let line = row.line;
    let job_id = row.get("job_id");
    check_name(line, "job_id", job_id)?;
    if job_id.contains(';') {
        return Err(field_error(line, "job_id", job_id, "must not contain `;`"));
    }
    let submit_ms = parse_seconds(line, "submit_s", row.get("submit_s"))?;
    let duration_ms = row.optional("duration_s", parse_seconds)?;
    let num_workers = parse_num_workers(line, row.get("num_workers"))?;
    let gpu_milli_per_worker = parse_gpus(line, row.get("gpus_per_worker"))?;
    let cpu_milli_per_worker = row
        .optional("cpu_milli_per_worker", |line, column, value| {
            parse_bounded(line, column, value, MAX_CPU_MILLI)
        })?
        .unwrap_or(0);
    let mem_mib_per_worker = row
        .optional("mem_mib_per_worker", |line, column, value| {
            parse_bounded(line, column, value, MAX_MEM_MIB)
        })?
        .unwrap_or(0);
    let gpu_types = row
        .optional("gpu_types", parse_gpu_types)?
        .unwrap_or_default();
    let priority = parse_priority(line, row.get("priority"))?;
    let team = intern_team(line, row.get("team"), teams, team_index)?;
    let preemptible = parse_bool(line, "preemptible", row.get("preemptible"), true)?;
    let oversubscribe = parse_bool(line, "oversubscribe", row.get("oversubscribe"), false)?;
    if oversubscribe && !(1..GPU_MILLI).contains(&gpu_milli_per_worker) {
        return Err(field_error(
            line,
            "oversubscribe",
            row.get("oversubscribe"),
            "only workers with a fraction of one GPU may oversubscribe it",
        ));
    }
    let gpu_mem_peak_milli = row.optional("gpu_mem_peak", |line, _, value| {
        parse_memory_fraction(line, value)
    })?;
    let gpu_mem_peak_at_ms = row.optional("gpu_mem_peak_at_s", parse_seconds)?;
    let elastic = parse_elastic(line, row.columns, row.record, num_workers)?;
    let time_limit_ms = row.optional("time_limit_s", parse_positive_seconds)?;
    let ckpt_interval_ms = row.optional("ckpt_interval_s", parse_positive_seconds)?;
    let estimate_ms = row.optional("estimate_s", parse_seconds)?;
    let kind = row.optional("kind", |line, column, kind| {
        check_name(line, column, kind).map(|()| kind.to_owned())
    })?;
    Ok(TraceJob {
        job_id: job_id.to_owned(),
        submit_ms,
        duration_ms,
        num_workers: u32::try_from(num_workers).expect("bounded by MAX_WORKERS"),
        gpu_milli_per_worker,
        cpu_milli_per_worker,
        mem_mib_per_worker,
        gpu_types,
        priority,
        team,
        preemptible,
        time_limit_ms,
        ckpt_interval_ms,
        deps: Vec::new(),
        line,
        estimate_ms,
        kind,
        gpu_mem_peak_milli,
        gpu_mem_peak_at_ms,
        oversubscribe,
        elastic,
    })
}

/// A gang's size: 1 to [`MAX_WORKERS`].
fn parse_num_workers(line: u64, workers: &str) -> Result<u64, TraceError> {
    let num_workers = parse_bounded(line, "num_workers", workers, u64::from(MAX_WORKERS))?;
    if num_workers == 0 {
        return Err(field_error(
            line,
            "num_workers",
            workers,
            "must be at least 1",
        ));
    }
    Ok(num_workers)
}

/// GPU models separated by `|`, each a name.
fn parse_gpu_types(
    line: u64,
    column: &'static str,
    types: &str,
) -> Result<Vec<String>, TraceError> {
    types
        .split('|')
        .map(|model| {
            let model = model.trim();
            check_name(line, column, model).map(|()| model.to_owned())
        })
        .collect()
}

/// The index of team `name` (the default team when empty) in `teams`, added
/// on first sight.
fn intern_team(
    line: u64,
    name: &str,
    teams: &mut Vec<String>,
    team_index: &mut HashMap<String, u32>,
) -> Result<u32, TraceError> {
    let team_name = match name {
        "" => DEFAULT_TEAM,
        name => name,
    };
    check_name(line, "team", team_name)?;
    if let Some(&team) = team_index.get(team_name) {
        return Ok(team);
    }
    let team = u32::try_from(teams.len()).expect("at most MAX_ROWS teams");
    teams.push(team_name.to_owned());
    team_index.insert(team_name.to_owned(), team);
    Ok(team)
}

fn seconds_text(millis: u64) -> String {
    let whole = millis / 1000;
    match millis % 1000 {
        0 => whole.to_string(),
        fraction => format!("{whole}.{fraction:03}"),
    }
}

fn gpus_text(milli: u64) -> String {
    if milli.is_multiple_of(GPU_MILLI) {
        (milli / GPU_MILLI).to_string()
    } else {
        format!("0.{:03}", milli % GPU_MILLI)
            .trim_end_matches('0')
            .to_owned()
    }
}

impl Trace {
    /// Writes the trace as CSV with every column; [`parse_trace`] reads it back unchanged
    /// (except the `line` numbers, which become the written lines).
    pub fn to_csv(&self) -> String {
        let mut writer = csv::WriterBuilder::new().from_writer(Vec::new());
        let header: Vec<&str> = REQUIRED.iter().chain(OPTIONAL.iter()).copied().collect();
        writer
            .write_record(&header)
            .expect("writing to memory cannot fail");
        for job in &self.jobs {
            let priority = match &job.priority {
                None => String::new(),
                Some(JobPriority::Value(value)) => value.to_string(),
                Some(JobPriority::Class(class)) => class.clone(),
            };
            let deps: Vec<&str> = job
                .deps
                .iter()
                .map(|&dep| self.jobs[dep as usize].job_id.as_str())
                .collect();
            let row = [
                job.job_id.clone(),
                seconds_text(job.submit_ms),
                job.duration_ms.map(seconds_text).unwrap_or_default(),
                job.num_workers.to_string(),
                gpus_text(job.gpu_milli_per_worker),
                job.cpu_milli_per_worker.to_string(),
                job.mem_mib_per_worker.to_string(),
                job.gpu_types.join("|"),
                priority,
                self.teams[job.team as usize].clone(),
                job.preemptible.to_string(),
                job.time_limit_ms.map(seconds_text).unwrap_or_default(),
                job.ckpt_interval_ms.map(seconds_text).unwrap_or_default(),
                deps.join(";"),
                job.estimate_ms.map(seconds_text).unwrap_or_default(),
                job.kind.clone().unwrap_or_default(),
                job.oversubscribe.to_string(),
                job.gpu_mem_peak_milli
                    .map(|milli| gpus_text(u64::from(milli)))
                    .unwrap_or_default(),
                job.gpu_mem_peak_at_ms.map(seconds_text).unwrap_or_default(),
                job.elastic
                    .map(|elastic| elastic.min_workers.to_string())
                    .unwrap_or_default(),
                job.elastic
                    .map(|elastic| elastic.max_workers.to_string())
                    .unwrap_or_default(),
                job.elastic
                    .map(|elastic| gpus_text(u64::from(elastic.scaling_milli)))
                    .unwrap_or_default(),
            ];
            writer
                .write_record(&row)
                .expect("writing to memory cannot fail");
        }
        let bytes = writer.into_inner().expect("writing to memory cannot fail");
        String::from_utf8(bytes).expect("the writer only copies UTF-8 fields")
    }
}

#[cfg(test)]
mod tests;
