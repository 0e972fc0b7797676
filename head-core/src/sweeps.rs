//! The core's adaptive sweeps and early stopping: [`SweepState`], which owns the
//! live searcher of every adaptive experiment, the stopping rule of every
//! experiment that declares one, and the trials that finished since they last
//! looked; plus the `HeadCore` glue that turns their answers into trials.
//!
//! `SweepState` reads the core's trials and specs but never changes them: it hands
//! back the sweep log entries to persist and the configurations to run, and the
//! core creates the trials. The searchers themselves live in `crate::sweep`, the
//! rules in `xp_tune::stopping`.
//!
//! Invariants: every ask, tell and forget is appended to the experiment's sweep
//! log in the order it was done, so a restart rebuilds the same searcher by
//! replaying it; a suggestion is told (or forgotten) only once all its replicates
//! have ended; stopping rules see objectives minimised (negated for `mode: max`).

use std::collections::{BTreeMap, BTreeSet};

use tracing::warn;
use xp_runtime::clock::UnixMillis;
use xp_runtime::ids::{ExperimentId, TrialId, WorkerKey};
use xp_runtime::protocol::{ExperimentState, TrialState};
use xp_runtime::spec::{ExperimentSpec, Mode, SearchSpec};
use xp_tune::search::{SearchAlgorithm, Suggestion, TrialPlan};
use xp_tune::stopping::{StoppingRule, Verdict, make_bohb_rule, make_rule};

use super::{HeadCore, MetricRecord, TrialRecord};
use crate::shared_text;
use crate::state::Book;
use crate::sweep::{DEFAULT_ADAPTIVE_PARALLEL, Sweep, SweepError, SweepOp};

/// The adaptive sweeps and stopping rules of the experiments that have them.
#[derive(Default)]
pub(super) struct SweepState {
    /// Adaptive sweeps of experiments that still run.
    sweeps: BTreeMap<ExperimentId, Sweep>,
    /// Early-stopping rules of experiments that declare one.
    rules: BTreeMap<ExperimentId, Box<dyn StoppingRule>>,
    /// Trials that reached a terminal state since the sweeps last looked.
    newly_finished: Vec<TrialId>,
}

impl std::fmt::Debug for SweepState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SweepState")
            .field("sweeps", &self.sweeps)
            .field("rules", &self.rules.len())
            .field("newly_finished", &self.newly_finished)
            .finish()
    }
}

/// The stopping rule of an experiment: its `early_stopping`, or the Hyperband
/// brackets of `algorithm: bohb`, whose sampler learns from the same rungs.
fn stopping_rule(spec: &ExperimentSpec) -> Option<Box<dyn StoppingRule>> {
    let mut rule = match (
        &spec.search.early_stopping,
        SearchAlgorithm::from_spec(&spec.search),
    ) {
        (Some(early_stopping), _) => make_rule(early_stopping),
        (None, SearchAlgorithm::Bohb { schedule }) => make_bohb_rule(schedule),
        (None, _) => return None,
    };
    // The rule ranks negated values of a maximised metric; its reasons say them as reported.
    if spec.search.mode == Mode::Max {
        rule.show_maximized();
    }
    Some(rule)
}

/// The factor that turns a metric into an objective to minimise.
/// The mean of finite replicate values, `None` when there are none or when the
/// mean itself is not finite: two replicates of `1e308` sum past `f64::MAX`, and
/// a non-finite objective must never reach the sweep log, which is JSON (no
/// infinity) and would make the experiment's record unreadable at the next start.
fn finite_mean(values: &[f64]) -> Option<f64> {
    if values.is_empty() {
        return None;
    }
    let count = values.len() as f64;
    let mean: f64 = values.iter().map(|value| value / count).sum();
    mean.is_finite().then_some(mean)
}

fn objective_sign(mode: Mode) -> f64 {
    if mode == Mode::Max { -1.0 } else { 1.0 }
}

impl SweepState {
    /// Rebuilds a stored experiment's searcher (by replaying its sweep log) and its
    /// stopping rule after a restart. A searcher that cannot be rebuilt asks no more.
    pub(super) fn restore(
        &mut self,
        experiment_id: ExperimentId,
        spec: &ExperimentSpec,
        sweep_log: &[SweepOp],
    ) {
        if Sweep::is_adaptive(&spec.search) {
            match Sweep::replay(&spec.search, sweep_log) {
                Ok((sweep, divergences)) => {
                    for divergence in divergences {
                        warn!(%experiment_id, %divergence, "sweep replay diverged");
                    }
                    self.sweeps.insert(experiment_id, sweep);
                }
                Err(error) => {
                    warn!(%experiment_id, %error, "cannot rebuild the sweep; it asks no more")
                }
            }
        }
        if let Some(rule) = stopping_rule(spec) {
            self.rules.insert(experiment_id, rule);
        }
    }

    /// Sets up a newly submitted experiment's searcher (when adaptive) and stopping
    /// rule (when declared); nothing is kept when the searcher cannot be built.
    pub(super) fn start(
        &mut self,
        experiment_id: ExperimentId,
        spec: &ExperimentSpec,
    ) -> Result<(), SweepError> {
        if Sweep::is_adaptive(&spec.search) {
            let sweep = Sweep::new(&spec.search)?;
            self.sweeps.insert(experiment_id, sweep);
        }
        if let Some(rule) = stopping_rule(spec) {
            self.rules.insert(experiment_id, rule);
        }
        Ok(())
    }

    /// Notes that a trial reached a terminal state.
    pub(super) fn trial_finished(&mut self, trial_id: TrialId) {
        self.newly_finished.push(trial_id);
    }

    /// The trials that finished since the last call.
    pub(super) fn take_finished(&mut self) -> Vec<TrialId> {
        std::mem::take(&mut self.newly_finished)
    }

    /// Finished trials leave their stopping rule, and settle their suggestion once
    /// every replicate is done. Returns the sweep log entries, in order, and the
    /// experiments whose sweep may now ask for more.
    fn settle_finished(
        &mut self,
        finished: &[TrialId],
        book: &Book,
    ) -> (Vec<(ExperimentId, SweepOp)>, BTreeSet<ExperimentId>) {
        let mut ops = Vec::new();
        let mut touched = BTreeSet::new();
        for trial_id in finished {
            let experiment = trial_id.experiment;
            if let Some(rule) = self.rules.get_mut(&experiment) {
                rule.finished(u64::from(trial_id.index));
            }
            let Some(sweep) = self.sweeps.get_mut(&experiment) else {
                continue;
            };
            touched.insert(experiment);
            let Some((suggestion, replicates)) = sweep.open_suggestion_of(trial_id.index) else {
                continue;
            };
            // Settled once every replicate has ended.
            let Some(records) = replicates
                .iter()
                .map(|index| {
                    book.get_trial(TrialId {
                        experiment,
                        index: *index,
                    })
                    .filter(|trial| trial.state.is_terminal())
                })
                .collect::<Option<Vec<&TrialRecord>>>()
            else {
                continue;
            };
            let search = &book.spec(experiment).search;
            let op = if search.is_multi_objective() {
                sweep.settle_objectives(suggestion, replicate_objectives(search, &records))
            } else {
                sweep.settle(suggestion, replicate_objective(search, &records))
            };
            ops.push((experiment, op));
        }
        (ops, touched)
    }

    /// The experiment's next configuration, when it has a sweep whose budget and
    /// `limit` configurations in flight allow one.
    fn ask(
        &mut self,
        experiment: ExperimentId,
        first_trial: u32,
        replicates: u32,
        limit: u32,
    ) -> Option<(Suggestion, SweepOp)> {
        self.sweeps
            .get_mut(&experiment)?
            .ask(first_trial, replicates, limit)
    }

    /// Hands a live rank-0 objective to the experiment's searcher (a multi-fidelity
    /// one keeps it); the sweep log entry when it did.
    fn observe(
        &mut self,
        experiment: ExperimentId,
        trial_index: u32,
        step: u64,
        objective: f64,
    ) -> Option<SweepOp> {
        self.sweeps
            .get_mut(&experiment)?
            .observe(trial_index, step, objective)
    }

    /// How the experiment's searcher chose `suggestion`, if it says.
    fn provenance(&self, experiment: ExperimentId, suggestion: u64) -> Option<String> {
        self.sweeps.get(&experiment)?.provenance(suggestion)
    }

    /// Asks the experiment's stopping rule about a rank-0 objective; `Some(reason)`
    /// means stop.
    fn judge(
        &mut self,
        experiment: ExperimentId,
        trial_index: u32,
        step: u64,
        objective: f64,
    ) -> Option<String> {
        match self
            .rules
            .get_mut(&experiment)?
            .report(u64::from(trial_index), step, objective)
        {
            Verdict::Continue => None,
            Verdict::Stop { rule, reason } => {
                Some(format!("stopped early by {rule} at step {step}: {reason}"))
            }
        }
    }

    /// The experiments that have a stopping rule.
    fn ruled_experiments(&self) -> impl Iterator<Item = ExperimentId> + '_ {
        self.rules.keys().copied()
    }

    /// Feeds stored rank-0 metric reports to the stopping rules (their decisions
    /// were already taken and are ignored), then tells them which trials ended.
    fn replay_metrics(&mut self, records: &[MetricRecord], book: &Book) {
        for record in records.iter().filter(|record| record.key.rank == 0) {
            let experiment = record.key.trial.experiment;
            let spec = book.spec(experiment);
            let (Some(metric), Some(step)) = (spec.search.metric.as_ref(), record.step) else {
                continue;
            };
            let Some(value) = record.values.get(metric).copied() else {
                continue;
            };
            let sign = objective_sign(spec.search.mode);
            if let Some(rule) = self.rules.get_mut(&experiment) {
                let _ = rule.report(u64::from(record.key.trial.index), step, sign * value);
            }
        }
        for (experiment, rule) in &mut self.rules {
            for (id, trial) in book.trials_of(*experiment) {
                if trial.state.is_terminal() {
                    rule.finished(u64::from(id.index));
                }
            }
        }
    }
}

impl HeadCore {
    /// Finished trials leave their stopping rule, settle their suggestion once every
    /// replicate is done, and adaptive sweeps ask for more configurations.
    pub(super) fn advance_sweeps(&mut self, now: UnixMillis, finished: &[TrialId]) {
        let (ops, touched) = self.sweep_state.settle_finished(finished, &self.book);
        for (experiment, op) in ops {
            self.log_sweep(experiment, op);
        }
        for experiment in touched {
            self.fill_sweep(now, experiment);
        }
    }

    /// Asks the experiment's adaptive searcher for configurations while its budget
    /// and `parallel` allow, and creates their trials.
    pub(super) fn fill_sweep(&mut self, now: UnixMillis, experiment: ExperimentId) {
        if self
            .book
            .get_experiment(experiment)
            .is_none_or(|record| record.cancelled)
        {
            return;
        }
        let spec = &self.book.spec(experiment);
        let replicates = spec.search.seeds;
        let limit = spec.search.parallel.unwrap_or(DEFAULT_ADAPTIVE_PARALLEL);
        let base_seed = spec.search.seed;
        loop {
            let first_trial = self.book.trials_of(experiment).count() as u32;
            let Some((suggestion, op)) =
                self.sweep_state
                    .ask(experiment, first_trial, replicates, limit)
            else {
                return;
            };
            self.log_sweep(experiment, op);
            let provenance = self.sweep_state.provenance(experiment, suggestion.id);
            for replicate in 0..replicates {
                let plan = TrialPlan {
                    params: suggestion.config.clone(),
                    seed: base_seed.wrapping_add(u64::from(replicate)),
                };
                self.create_trial(
                    now,
                    experiment,
                    first_trial + replicate,
                    plan.config_json(),
                    plan.seed,
                );
                if let Some(provenance) = &provenance {
                    self.note_provenance(
                        now,
                        TrialId {
                            experiment,
                            index: first_trial + replicate,
                        },
                        provenance,
                    );
                }
            }
        }
    }

    /// Says in a new pending trial's reason and event log how its configuration
    /// was chosen (a reused trial keeps its reason).
    fn note_provenance(&mut self, now: UnixMillis, trial_id: TrialId, provenance: &str) {
        if self
            .book
            .get_trial(trial_id)
            .is_none_or(|trial| trial.state != TrialState::Pending)
        {
            return;
        }
        let reason = format!("submitted; {provenance}");
        let trial = self.book.trial_mut(trial_id).expect("checked above");
        trial.reason = Some(shared_text::shared(&reason));
        self.push_event(now, trial_id, TrialState::Pending, 0, reason);
    }

    /// Appends to the experiment's persisted sweep log.
    fn log_sweep(&mut self, experiment: ExperimentId, op: SweepOp) {
        if let Some(record) = self.book.experiment_mut(experiment) {
            record.sweep_log.push(op);
        }
    }

    /// Asks the experiment's stopping rule about a live rank-0 report; `Some(reason)` means stop.
    pub(super) fn judge_early_stopping(
        &mut self,
        key: WorkerKey,
        step: Option<u64>,
        values: &BTreeMap<String, f64>,
    ) -> Option<String> {
        let experiment = key.trial.experiment;
        let spec = &self.book.spec(experiment);
        let step = step?;
        let value = *values.get(spec.search.metric.as_ref()?)?;
        if key.rank != 0 || !value.is_finite() {
            return None;
        }
        let objective = objective_sign(spec.search.mode) * value;
        let live = self
            .worker(key)
            .is_some_and(|(attempt, _)| attempt.is_live());
        if !live || self.book.trial(key.trial).state.is_terminal() {
            return None;
        }
        if let Some(op) = self
            .sweep_state
            .observe(experiment, key.trial.index, step, objective)
        {
            self.log_sweep(experiment, op);
        }
        self.sweep_state
            .judge(experiment, key.trial.index, step, objective)
    }

    /// Trials whose metric history must be replayed into their experiment's
    /// stopping rule after a restart: those of unfinished experiments with a rule.
    pub fn trials_needing_metric_replay(&self) -> Vec<TrialId> {
        self.sweep_state
            .ruled_experiments()
            .filter(|experiment| self.experiment_state(*experiment) == ExperimentState::Running)
            .flat_map(|experiment| self.book.trials_of(experiment).map(|(id, _)| *id))
            .collect()
    }

    /// Feeds stored metric reports to the stopping rules (decisions were already
    /// taken and are ignored), then tells them which trials have ended.
    pub fn replay_metrics(&mut self, records: &[MetricRecord]) {
        self.sweep_state.replay_metrics(records, &self.book);
    }
}

/// The finite values of `metric` the replicates reported.
fn finite_values(metric: &str, replicates: &[&TrialRecord]) -> Vec<f64> {
    replicates
        .iter()
        .filter_map(|trial| trial.metrics.get(metric).copied())
        .filter(|value| value.is_finite())
        .collect()
}

/// A single-objective suggestion's result: the mean of its replicates'
/// finite values of the metric, signed so that lower is better.
fn replicate_objective(search: &SearchSpec, replicates: &[&TrialRecord]) -> Option<f64> {
    let values = search
        .metric
        .as_ref()
        .map(|metric| finite_values(metric, replicates))
        .unwrap_or_default();
    finite_mean(&values).map(|mean| objective_sign(search.mode) * mean)
}

/// A multi-objective suggestion's results: each objective its replicates'
/// mean, signed; `None` (the suggestion is forgotten) when none of them
/// reported one of the objectives.
fn replicate_objectives(search: &SearchSpec, replicates: &[&TrialRecord]) -> Option<Vec<f64>> {
    search
        .objectives()
        .iter()
        .map(|objective| {
            finite_mean(&finite_values(objective.metric, replicates))
                .map(|mean| objective_sign(objective.mode) * mean)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::finite_mean;

    #[test]
    fn replicate_means_stay_finite_or_are_dropped() {
        // Summing first would overflow to infinity, which the JSON sweep log
        // cannot hold.
        assert_eq!(finite_mean(&[1e308, 1e308]), Some(1e308));
        assert_eq!(finite_mean(&[f64::MAX, f64::MAX]), Some(f64::MAX));
        assert_eq!(finite_mean(&[1.0, 2.0, 3.0]), Some(2.0));
        assert_eq!(finite_mean(&[]), None);
    }
}
