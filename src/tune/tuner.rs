//! The state of one `xp tune` run: the evaluations running, what the searcher
//! and the early-stopping rule are told as they report and end, and the summary
//! (the best value, or the Pareto front of a multi-objective run).
//!
//! Not here: the child processes themselves (`evaluate.rs`) and the loop that
//! waits for their events (`tune` in `mod.rs`).

use std::collections::BTreeMap;
use std::sync::Arc;

use serde_json::{Value, json};
use tokio::sync::{mpsc, oneshot};
use tokio::task::JoinSet;
use xp_runtime::spec::Config;
use xp_tune::search::front::{FrontSummary, summarize_front};
use xp_tune::stopping::Verdict;

use super::evaluate::{Ended, EvalEvent, evaluate, spawn_command};
use super::{TuneError, TuneFront, TuneJob, TuneSummary};

/// One evaluation while it runs.
struct Running {
    suggestion: u64,
    config: Config,
    stop: Option<oneshot::Sender<()>>,
    steps: u64,
    last_value: Option<f64>,
    stopped_at: Option<u64>,
    stop_reason: Option<String>,
}

/// A tuning run in progress.
pub(super) struct Tuner {
    job: TuneJob,
    /// The command's program and its arguments, owned so that the job's
    /// searcher can be lent out while evaluations start.
    program: String,
    args: Vec<String>,
    /// A multi-objective run's metric names and directions (empty otherwise).
    names: Arc<Vec<String>>,
    maximize: Vec<bool>,
    /// -1 when larger objectives are better: the searcher and the rule minimise.
    sign: f64,
    events_tx: mpsc::UnboundedSender<EvalEvent>,
    events_rx: mpsc::UnboundedReceiver<EvalEvent>,
    tasks: JoinSet<()>,
    running: BTreeMap<u32, Running>,
    asked: u32,
    exhausted: bool,
    summary: TuneSummary,
}

impl Tuner {
    /// Checks the job and prepares its run.
    pub(super) fn new(job: TuneJob) -> Result<Self, TuneError> {
        let (program, args) = job
            .command
            .split_first()
            .map(|(program, args)| (program.clone(), args.to_vec()))
            .ok_or(TuneError::NoCommand)?;
        if job.parallel == 0 || job.budget == 0 {
            return Err(TuneError::NotPositive);
        }
        if !job.objectives.is_empty() && job.rule.is_some() {
            return Err(TuneError::StoppingWithObjectives);
        }
        let names = Arc::new(
            job.objectives
                .iter()
                .map(|(name, _)| name.clone())
                .collect(),
        );
        let maximize = job.objectives.iter().map(|(_, max)| *max).collect();
        let sign = if job.maximize { -1.0 } else { 1.0 };
        let (events_tx, events_rx) = mpsc::unbounded_channel();
        Ok(Self {
            job,
            program,
            args,
            names,
            maximize,
            sign,
            events_tx,
            events_rx,
            tasks: JoinSet::new(),
            running: BTreeMap::new(),
            asked: 0,
            exhausted: false,
            summary: TuneSummary {
                evaluations: 0,
                steps: 0,
                best: None,
                best_params: None,
                front: None,
            },
        })
    }

    /// Starts evaluations until `parallel` run, the budget is spent or the
    /// searcher has nothing more; whether any evaluation is running.
    pub(super) fn start_evaluations(&mut self) -> Result<bool, TuneError> {
        while !self.exhausted
            && self.asked < self.job.budget
            && self.running.len() < self.job.parallel as usize
        {
            let Some(suggestion) = self.job.searcher.ask() else {
                self.exhausted = true;
                break;
            };
            let i = self.asked;
            self.asked += 1;
            let child = spawn_command(&self.program, &self.args, i, &suggestion.config)?;
            let (stop_tx, stop_rx) = oneshot::channel();
            self.tasks.spawn(evaluate(
                i,
                child,
                stop_rx,
                self.events_tx.clone(),
                self.names.clone(),
            ));
            self.running.insert(
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
        Ok(!self.running.is_empty())
    }

    /// The next report or end of a running evaluation.
    pub(super) async fn next_event(&mut self) -> Option<EvalEvent> {
        self.events_rx.recv().await
    }

    /// Takes in one event; the JSON line to print when an evaluation ended.
    pub(super) fn handle_event(&mut self, event: EvalEvent) -> Result<Option<Value>, TuneError> {
        match event {
            EvalEvent::Metric { i, step, value } => {
                self.handle_metric(i, step, value);
                Ok(None)
            }
            EvalEvent::Done(ended) => {
                let Some(run) = self.running.remove(&ended.i) else {
                    return Ok(None);
                };
                if self.job.objectives.is_empty() {
                    Ok(Some(self.finish_single(run, ended)))
                } else {
                    self.finish_multi(run, ended).map(Some)
                }
            }
        }
    }

    /// Waits for every evaluation's task to end; the summary.
    pub(super) async fn finish(mut self) -> TuneSummary {
        while self.tasks.join_next().await.is_some() {}
        self.summary
    }

    /// An intermediate value: the rule judges it, and a stop is sent to an
    /// evaluation it stops.
    fn handle_metric(&mut self, i: u32, step: u64, value: f64) {
        let Some(run) = self.running.get_mut(&i) else {
            return;
        };
        run.steps = run.steps.max(step);
        run.last_value = Some(value);
        if let Some(rule) = self.job.rule.as_mut()
            && run.stopped_at.is_none()
            && let Verdict::Stop { rule: name, reason } =
                rule.report(u64::from(i), step, self.sign * value)
        {
            run.stopped_at = Some(step);
            run.stop_reason = Some(format!("{name}: {reason}"));
            if let Some(stop) = run.stop.take() {
                let _ = stop.send(());
            }
        }
    }

    /// Settles one evaluation of a single-objective run: its value is the last
    /// stdout line, or the last intermediate value when it was stopped or
    /// printed no number; returns its JSON line.
    fn finish_single(&mut self, run: Running, ended: Ended) -> Value {
        let Ended {
            i,
            last_line,
            status,
            stopped,
            ..
        } = ended;
        if let Some(rule) = self.job.rule.as_mut() {
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
        let sign = self.sign;
        match value {
            Some(value) => self.job.searcher.tell(run.suggestion, sign * value),
            None => self.job.searcher.forget(run.suggestion),
        }
        let summary = &mut self.summary;
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
        } else if self.job.rule.is_some() {
            line["steps"] = json!(run.steps);
        }
        if value.is_none() {
            line["error"] = json!(format!(
                "no objective: the last stdout line {:?} is not a number (exit status {status:?})",
                last_line.unwrap_or_default()
            ));
        }
        line
    }

    /// Settles one evaluation of a multi-objective run: tells the searcher its
    /// objectives (or forgets it), and recomputes the front; returns its JSON line.
    fn finish_multi(&mut self, run: Running, ended: Ended) -> Result<Value, TuneError> {
        let Ended {
            i,
            mut named,
            status,
            ..
        } = ended;
        // An output never read (its reader timed out) reported nothing.
        named.resize(self.job.objectives.len(), None);
        let finite: Option<Vec<f64>> = named
            .iter()
            .map(|value| value.filter(|value| value.is_finite()))
            .collect();
        match &finite {
            Some(values) => {
                let minimised: Vec<f64> = values
                    .iter()
                    .zip(&self.maximize)
                    .map(|(value, max)| if *max { -value } else { *value })
                    .collect();
                self.job
                    .searcher
                    .tell_objectives(run.suggestion, &minimised);
            }
            None => self.job.searcher.forget(run.suggestion),
        }
        self.summary.evaluations += 1;
        self.summary.steps += run.steps;
        let front = self.update_front(i, run.config.clone(), named.clone())?;
        let values: serde_json::Map<String, Value> = front
            .metrics
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
                "no objectives: the command did not print each of {:?} as a finite number in an XP_METRIC line (exit status {status:?})",
                front.metrics
            ));
        }
        Ok(line)
    }

    /// Records evaluation `i`'s configuration and objective values and
    /// recomputes the front over every evaluation so far.
    fn update_front(
        &mut self,
        i: u32,
        config: Config,
        named: Vec<Option<f64>>,
    ) -> Result<&TuneFront, TuneError> {
        let front = self.summary.front.get_or_insert_with(|| TuneFront {
            metrics: self.names.to_vec(),
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
        front.configs.insert(i, config);
        front.values.insert(i, named);
        let candidates: Vec<(u32, Vec<Option<f64>>)> = front
            .values
            .iter()
            .map(|(key, values)| (*key, values.clone()))
            .collect();
        front.summary = summarize_front(&candidates, &self.maximize, self.job.reference.as_deref())
            .map_err(TuneError::Reference)?;
        Ok(front)
    }
}
