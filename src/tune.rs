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

use std::collections::BTreeMap;
use std::process::Stdio;

use serde_json::{Value, json};
use tokio::io::BufReader;
use tokio::sync::{mpsc, oneshot};
use tokio::task::JoinSet;
use xp_runtime::metric_line::{MAX_METRIC_LINE, parse_metric_line, read_bounded_line};
use xp_runtime::spec::Config;
use xp_tune::search::Searcher;
use xp_tune::search::front::{DEFAULT_REFERENCE_RULE, FrontSummary, summarize_front};
use xp_tune::search::pareto::ParetoError;
use xp_tune::stopping::{StoppingRule, Verdict};

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

/// How long a stopped evaluation has between SIGTERM and SIGKILL.
const STOP_GRACE: std::time::Duration = std::time::Duration::from_secs(5);

enum EvalEvent {
    Metric {
        i: u32,
        step: u64,
        value: f64,
    },
    Done {
        i: u32,
        last_line: Option<String>,
        /// The last value of each objective's metric, for a multi-objective run.
        named: Vec<Option<f64>>,
        status: Option<i32>,
        stopped: bool,
    },
}

struct Running {
    suggestion: u64,
    config: Config,
    stop: Option<oneshot::Sender<()>>,
    steps: u64,
    last_value: Option<f64>,
    stopped_at: Option<u64>,
    stop_reason: Option<String>,
}

fn env_name(param: &str) -> String {
    format!("XP_PARAM_{}", param.to_ascii_uppercase())
}

/// Runs the job, calling `emit` with one JSON object per finished evaluation.
pub async fn tune(mut job: TuneJob, mut emit: impl FnMut(Value)) -> Result<TuneSummary, TuneError> {
    // Owned, so the job's searcher can be lent out while evaluations start.
    let (program, args) = job
        .command
        .split_first()
        .map(|(program, args)| (program.clone(), args.to_vec()))
        .ok_or(TuneError::NoCommand)?;
    if job.parallel == 0 || job.budget == 0 {
        return Err(TuneError::NotPositive);
    }
    let multi = !job.objectives.is_empty();
    if multi && job.rule.is_some() {
        return Err(TuneError::StoppingWithObjectives);
    }
    let names: std::sync::Arc<Vec<String>> = std::sync::Arc::new(
        job.objectives
            .iter()
            .map(|(name, _)| name.clone())
            .collect(),
    );
    let maximize: Vec<bool> = job.objectives.iter().map(|(_, max)| *max).collect();
    let (events_tx, mut events_rx) = mpsc::unbounded_channel();
    let mut tasks = JoinSet::new();
    let mut running: BTreeMap<u32, Running> = BTreeMap::new();
    let mut asked = 0u32;
    let mut exhausted = false;
    let mut summary = TuneSummary {
        evaluations: 0,
        steps: 0,
        best: None,
        best_params: None,
        front: None,
    };
    let sign = if job.maximize { -1.0 } else { 1.0 };
    loop {
        while !exhausted && asked < job.budget && running.len() < job.parallel as usize {
            let Some(suggestion) = job.searcher.ask() else {
                exhausted = true;
                break;
            };
            let i = asked;
            asked += 1;
            let config_json = serde_json::to_string(&suggestion.config).expect("configs serialise");
            let mut command = tokio::process::Command::new(&program);
            command
                .args(&args)
                .env("XP_CONFIG", &config_json)
                .env("XP_TRIAL_ID", format!("tune-{i}"))
                .stdin(Stdio::null())
                .stdout(Stdio::piped())
                .stderr(Stdio::inherit())
                .kill_on_drop(true)
                // Its own process group, so a stop reaches the script and its children.
                .process_group(0);
            for (name, value) in &suggestion.config {
                command.env(env_name(name), value.to_string());
            }
            let child = command.spawn().map_err(|source| TuneError::Spawn {
                program: program.clone(),
                source,
            })?;
            let (stop_tx, stop_rx) = oneshot::channel();
            tasks.spawn(evaluate(
                i,
                child,
                stop_rx,
                events_tx.clone(),
                names.clone(),
            ));
            running.insert(
                i,
                Running {
                    suggestion: suggestion.id,
                    config: suggestion.config,
                    stop: Some(stop_tx),
                    steps: 0,
                    last_value: None,
                    stopped_at: None,
                    stop_reason: None,
                },
            );
        }
        if running.is_empty() {
            break;
        }
        let Some(event) = events_rx.recv().await else {
            break;
        };
        match event {
            EvalEvent::Metric { i, step, value } => {
                let Some(run) = running.get_mut(&i) else {
                    continue;
                };
                run.steps = run.steps.max(step);
                run.last_value = Some(value);
                if let Some(rule) = job.rule.as_mut()
                    && run.stopped_at.is_none()
                    && let Verdict::Stop { rule: name, reason } =
                        rule.report(u64::from(i), step, sign * value)
                {
                    run.stopped_at = Some(step);
                    run.stop_reason = Some(format!("{name}: {reason}"));
                    if let Some(stop) = run.stop.take() {
                        let _ = stop.send(());
                    }
                }
            }
            EvalEvent::Done {
                i,
                last_line,
                named,
                status,
                stopped,
            } => {
                let Some(run) = running.remove(&i) else {
                    continue;
                };
                if multi {
                    emit(finish_multi(
                        &mut job,
                        &mut summary,
                        (i, run),
                        named,
                        &maximize,
                        status,
                    )?);
                    continue;
                }
                if let Some(rule) = job.rule.as_mut() {
                    rule.finished(u64::from(i));
                }
                let final_value = last_line
                    .as_deref()
                    .and_then(|line| line.trim().parse::<f64>().ok())
                    .filter(|value| value.is_finite());
                let value = if stopped || run.stopped_at.is_some() {
                    run.last_value
                } else {
                    final_value.or(run.last_value)
                };
                match value {
                    Some(value) => job.searcher.tell(run.suggestion, sign * value),
                    None => job.searcher.forget(run.suggestion),
                }
                summary.evaluations += 1;
                summary.steps += run.steps;
                if let Some(value) = value
                    && summary.best.is_none_or(|best| sign * value < sign * best)
                {
                    summary.best = Some(value);
                    summary.best_params = Some(run.config.clone());
                }
                let mut line =
                    json!({ "i": i, "params": run.config, "value": value, "best": summary.best });
                if let Some(step) = run.stopped_at {
                    line["stopped_at"] = json!(step);
                    line["steps"] = json!(run.steps);
                    line["reason"] = json!(run.stop_reason);
                } else if job.rule.is_some() {
                    line["steps"] = json!(run.steps);
                }
                if value.is_none() {
                    line["error"] = json!(format!(
                        "no objective: the last stdout line {:?} is not a number (exit status {status:?})",
                        last_line.unwrap_or_default()
                    ));
                }
                emit(line);
            }
        }
    }
    while tasks.join_next().await.is_some() {}
    Ok(summary)
}

/// Settles one evaluation of a multi-objective run: tells the searcher its
/// objectives (or forgets it), and recomputes the front; returns its JSON line.
fn finish_multi(
    job: &mut TuneJob,
    summary: &mut TuneSummary,
    (i, run): (u32, Running),
    named: Vec<Option<f64>>,
    maximize: &[bool],
    status: Option<i32>,
) -> Result<Value, TuneError> {
    // An output never read (its reader timed out) reported nothing.
    let mut named = named;
    named.resize(job.objectives.len(), None);
    let finite: Option<Vec<f64>> = named
        .iter()
        .map(|value| value.filter(|value| value.is_finite()))
        .collect();
    match &finite {
        Some(values) => {
            let minimised: Vec<f64> = values
                .iter()
                .zip(maximize)
                .map(|(value, max)| if *max { -value } else { *value })
                .collect();
            job.searcher.tell_objectives(run.suggestion, &minimised);
        }
        None => job.searcher.forget(run.suggestion),
    }
    summary.evaluations += 1;
    summary.steps += run.steps;
    let metrics: Vec<String> = job
        .objectives
        .iter()
        .map(|(name, _)| name.clone())
        .collect();
    let front = summary.front.get_or_insert_with(|| TuneFront {
        metrics: metrics.clone(),
        summary: FrontSummary {
            reference: None,
            reference_declared: false,
            hypervolume: 0.0,
            evaluated: 0,
            front: Vec::new(),
        },
        configs: BTreeMap::new(),
        values: BTreeMap::new(),
    });
    front.configs.insert(i, run.config.clone());
    front.values.insert(i, named.clone());
    let candidates: Vec<(u32, Vec<Option<f64>>)> = front
        .values
        .iter()
        .map(|(key, values)| (*key, values.clone()))
        .collect();
    front.summary = summarize_front(&candidates, maximize, job.reference.as_deref())
        .map_err(TuneError::Reference)?;
    let values: serde_json::Map<String, Value> = metrics
        .iter()
        .zip(&named)
        .map(|(name, value)| (name.clone(), json!(value.filter(|value| value.is_finite()))))
        .collect();
    let mut line = json!({
        "i": i,
        "params": run.config,
        "values": values,
        "front_size": front.summary.front.len(),
        "hypervolume": xp_runtime::metric_value::value_json(front.summary.hypervolume),
    });
    if finite.is_none() {
        line["error"] = json!(format!(
            "no objectives: the command did not print each of {metrics:?} as a finite number in an XP_METRIC line (exit status {status:?})"
        ));
    }
    Ok(line)
}

async fn evaluate(
    i: u32,
    mut child: tokio::process::Child,
    stop: oneshot::Receiver<()>,
    events: mpsc::UnboundedSender<EvalEvent>,
    names: std::sync::Arc<Vec<String>>,
) {
    let stdout = child.stdout.take().expect("stdout is piped");
    let metrics = events.clone();
    let reader = xp_runtime::task::spawn("tune-stdout", async move {
        let mut reader = BufReader::new(stdout);
        let mut buffer = Vec::with_capacity(256);
        let mut last = None;
        // The last value of each objective's metric (multi-objective runs).
        let mut named: Vec<Option<f64>> = vec![None; names.len()];
        while let Ok(read) = read_bounded_line(&mut reader, &mut buffer, MAX_METRIC_LINE).await {
            if read == 0 {
                break;
            }
            let line = String::from_utf8_lossy(&buffer).trim_end().to_owned();
            if let Ok(Some(report)) = parse_metric_line(&line) {
                for (slot, name) in named.iter_mut().zip(names.iter()) {
                    if let Some(value) = report.values.get(name) {
                        *slot = Some(*value);
                    }
                }
                // A NaN or infinite value is kept by the line parser; here it
                // must neither feed the stopping rule nor become the result.
                let value = report.values.get("value").filter(|value| value.is_finite());
                if let (Some(step), Some(value)) = (report.step, value) {
                    let _ = metrics.send(EvalEvent::Metric {
                        i,
                        step,
                        value: *value,
                    });
                }
            } else if !line.trim().is_empty() {
                last = Some(line);
            }
        }
        (last, named)
    });
    let mut stopped = false;
    let group = child.id().map(|pid| nix::unistd::Pid::from_raw(pid as i32));
    let signal_group = |signal| {
        if let Some(group) = group {
            let _ = nix::sys::signal::killpg(group, signal);
        }
    };
    let status = tokio::select! {
        status = child.wait() => status.ok(),
        _ = stop => {
            stopped = true;
            signal_group(nix::sys::signal::Signal::SIGTERM);
            match tokio::time::timeout(STOP_GRACE, child.wait()).await {
                Ok(status) => status.ok(),
                Err(_) => {
                    signal_group(nix::sys::signal::Signal::SIGKILL);
                    child.wait().await.ok()
                }
            }
        }
    };
    // Whatever the command left behind goes too, and its output is read for a bounded time.
    signal_group(nix::sys::signal::Signal::SIGKILL);
    let (last_line, named) = tokio::time::timeout(STOP_GRACE, reader)
        .await
        .ok()
        .and_then(Result::ok)
        .unwrap_or_default();
    let _ = events.send(EvalEvent::Done {
        i,
        last_line,
        named,
        status: status.and_then(|status| status.code()),
        stopped,
    });
}
