//! `xp tune`: optimise any black-box command on this machine.
//!
//! Each suggestion runs the command once with its parameters in the environment
//! (`XP_PARAM_<NAME>` and `XP_CONFIG`); the last line of its stdout is the
//! objective. With an early-stopping rule, `XP_METRIC {"step": S, "value": V}`
//! lines are intermediate results, and a trial the rule stops receives SIGTERM.
//! A multi-objective run (`--metric a,b --mode max,min`) reads each objective as
//! the last value of its metric in the command's `XP_METRIC` lines, drives the
//! searcher through `tell_objectives`, and reports the Pareto front and its
//! hypervolume (`xp_tune::search::front`). No cluster is involved: this is the quickest way to use the search engine.
//!
//! Here: the job, its errors and its summary, and [`tune`], the loop that keeps
//! `parallel` evaluations running and settles each as it ends. The loop's state
//! (what runs, what the searcher and the rule are told, the front) is in
//! `tuner.rs`; one evaluation's process (its environment, its output, its stop) in
//! `evaluate.rs`.

mod evaluate;
mod tuner;

use std::collections::BTreeMap;

use serde_json::{Value, json};
use xp_runtime::spec::Config;
use xp_tune::search::Searcher;
use xp_tune::search::front::{DEFAULT_REFERENCE_RULE, FrontSummary};
use xp_tune::search::pareto::ParetoError;
use xp_tune::stopping::StoppingRule;

use tuner::Tuner;

/// Why a tuning run stopped early.
#[derive(Debug, thiserror::Error)]
pub enum TuneError {
    /// The command could not be started.
    #[error("cannot start {program}: {source}")]
    Spawn {
        /// The program.
        program: String,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// No command follows `--`.
    #[error("no command given after --")]
    NoCommand,
    /// The budget or the parallelism is zero.
    #[error("--budget and --parallel must be positive")]
    NotPositive,
    /// An early-stopping rule was given to a multi-objective run.
    #[error(
        "--early-stopping judges one objective; a multi-objective run (--metric A,B) takes none"
    )]
    StoppingWithObjectives,
    /// The hypervolume's reference point does not fit the objectives.
    #[error("--reference")]
    Reference(#[source] ParetoError),
}

/// How to run one tuning job.
pub struct TuneJob {
    /// The search algorithm, already built for the space and seed.
    pub searcher: Box<dyn Searcher>,
    /// The early-stopping rule, if any.
    pub rule: Option<Box<dyn StoppingRule>>,
    /// How many evaluations.
    pub budget: u32,
    /// How many evaluations run at once.
    pub parallel: u32,
    /// Larger objectives are better.
    pub maximize: bool,
    /// The command and its arguments.
    pub command: Vec<String>,
    /// A multi-objective search's objectives (metric name, larger is better),
    /// read from the command's `XP_METRIC` lines (the last value of each);
    /// empty for one objective, the last stdout line.
    pub objectives: Vec<(String, bool)>,
    /// The hypervolume's reference point (the metrics' units); derived from the
    /// evaluations when absent.
    pub reference: Option<Vec<f64>>,
}

/// The Pareto front of a multi-objective run.
#[derive(Debug, Clone, PartialEq)]
pub struct TuneFront {
    /// The metrics, in order.
    pub metrics: Vec<String>,
    /// The front by evaluation number, largest hypervolume contribution first.
    pub summary: FrontSummary<u32>,
    /// Every evaluation's configuration, by evaluation number.
    pub configs: BTreeMap<u32, Config>,
    /// Every evaluation's objective values (`None` where one was not reported).
    pub values: BTreeMap<u32, Vec<Option<f64>>>,
}

/// What the run found.
#[derive(Debug, Clone, PartialEq)]
pub struct TuneSummary {
    /// Evaluations run.
    pub evaluations: u32,
    /// Intermediate steps consumed, over all evaluations.
    pub steps: u64,
    /// The best objective seen.
    pub best: Option<f64>,
    /// Its parameters.
    pub best_params: Option<Config>,
    /// The front of a multi-objective run (`best` is then empty).
    pub front: Option<TuneFront>,
}

impl TuneSummary {
    /// The closing JSON line; a multi-objective run's has `front`,
    /// `hypervolume` and `reference` instead of `best`.
    pub fn to_json(&self) -> Value {
        let Some(front) = &self.front else {
            return json!({ "summary": { "evaluations": self.evaluations, "steps": self.steps, "best": self.best, "best_params": self.best_params } });
        };
        let members: Vec<Value> = front
            .summary
            .front
            .iter()
            .map(|point| {
                let values: serde_json::Map<String, Value> = front
                    .metrics
                    .iter()
                    .cloned()
                    .zip(point.values.iter().map(|value| json!(value)))
                    .collect();
                json!({ "i": point.key, "params": front.configs.get(&point.key), "values": values, "contribution": xp_runtime::metric_value::value_json(point.contribution) })
            })
            .collect();
        json!({ "summary": {
            "evaluations": self.evaluations,
            "steps": self.steps,
            "evaluated": front.summary.evaluated,
            "hypervolume": xp_runtime::metric_value::value_json(front.summary.hypervolume),
            "reference": front.summary.reference,
            "reference_declared": front.summary.reference_declared,
            "reference_rule": (!front.summary.reference_declared).then_some(DEFAULT_REFERENCE_RULE),
            "front": members,
        } })
    }
}

/// Runs the job, calling `emit` with one JSON object per finished evaluation.
pub async fn tune(job: TuneJob, mut emit: impl FnMut(Value)) -> Result<TuneSummary, TuneError> {
    let mut tuner = Tuner::new(job)?;
    while tuner.start_evaluations()? {
        let Some(event) = tuner.next_event().await else {
            break;
        };
        if let Some(line) = tuner.handle_event(event)? {
            emit(line);
        }
    }
    Ok(tuner.finish().await)
}
