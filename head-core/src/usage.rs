//! `xp report`: the core's records turned into the plain lists of
//! `xp_tune::report` (attempts, trials, node up-times), for one scope and
//! window, and the figures it computes.
//!
//! Reads only. What each list is made of:
//! - an attempt holds its workers' GPUs (count × share, each GPU's model from
//!   its node's registration) from its placement to its end (its running
//!   attempts: to the last time the head heard from its nodes, or `now` for
//!   the report);
//! - its work is redone when it ended preempted, failed or lost and the trial
//!   went on (a later attempt, or the trial is not finished); what is lost
//!   starts at the checkpoint the next attempt resumed from (or, with none yet,
//!   the newest checkpoint it wrote);
//! - a trial arrives when it was created and leaves when it reached a final
//!   state; trials that reused another's result never entered the system and
//!   are left out of the queueing figures and the curves;
//! - the GPUs available are each node's registered GPUs over the intervals it
//!   was up (`NodeRecord::up`: from registration to the last sign of life
//!   before it was judged lost).

use std::collections::BTreeMap;

use xp_runtime::clock::UnixMillis;
use xp_runtime::ids::{ExperimentId, NodeId, TrialId};
use xp_runtime::protocol::{ReportRequest, TrialState, WorkerTelemetry};
use xp_runtime::report::UsageReport;
use xp_runtime::spec::{ExperimentSpec, Mode};
use xp_sched::GPU_MILLI;
use xp_tune::report::{
    self as maths, AttemptSpan, BusySpan, EndCause, GpuHold, Measurement, NodeUp, PriceList,
    TrialSpan, Window,
};

use super::{AttemptRecord, CoreError, HeadCore, NodeRecord, TrialRecord};
use crate::auth::Visibility;
use crate::state::Catalog;

/// What a report covers.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum ReportScope {
    /// One experiment (by full id: authorization resolved it).
    Experiment(ExperimentId),
    /// One team's experiments.
    Team(String),
    /// Everything.
    Cluster,
}

impl HeadCore {
    /// The report a request asks for, as `visible` may see it: an experiment
    /// among the teams it shows (else not found), a team it shows, the whole
    /// cluster only when it shows every team (an admin's).
    pub fn report_for(
        &self,
        now: UnixMillis,
        request: &ReportRequest,
        visible: &Visibility,
    ) -> Result<UsageReport, CoreError> {
        let scope = self.report_scope(request, visible)?;
        self.report(now, &scope, request.since_ms)
    }

    /// The scope a request names, as `visible` may see it (see [`Self::report_for`]).
    pub fn report_scope(
        &self,
        request: &ReportRequest,
        visible: &Visibility,
    ) -> Result<ReportScope, CoreError> {
        Ok(match (&request.experiment, &request.team) {
            (Some(_), Some(_)) => return Err(CoreError::ReportScopeConflict),
            // Another team's experiment, even by its full id, is not found.
            (Some(text), None) => {
                ReportScope::Experiment(self.visible_experiment_named(text, visible)?)
            }
            (None, Some(team)) if visible.shows(team) => ReportScope::Team(team.clone()),
            (None, Some(team)) => {
                return Err(CoreError::ReportForbidden {
                    scope: format!("team {team}"),
                });
            }
            (None, None) if *visible == Visibility::All => ReportScope::Cluster,
            (None, None) => {
                return Err(CoreError::ReportForbidden {
                    scope: "the whole cluster".to_owned(),
                });
            }
        })
    }

    /// What the report of `scope` over the last `since_ms` at `now` reads,
    /// copied as it is now (see [`ReportSnapshot`]); cheap whatever the
    /// number of trials and nodes.
    pub fn report_snapshot(
        &self,
        now: UnixMillis,
        scope: &ReportScope,
        since_ms: Option<u64>,
    ) -> Result<ReportSnapshot, CoreError> {
        if let ReportScope::Experiment(id) = scope
            && !self.book.contains_experiment(*id)
        {
            return Err(CoreError::ExperimentNotFound { experiment_id: *id });
        }
        Ok(ReportSnapshot {
            catalog: self.book.catalog(),
            nodes: self.membership.nodes_copy(),
            prices: self.price_list(),
            scope: scope.clone(),
            now,
            since_ms,
        })
    }

    /// The report for `scope` over the last `since_ms` (or since the scope's
    /// first arrival), at `now`, computed here (see [`ReportSnapshot::report`]).
    pub fn report(
        &self,
        now: UnixMillis,
        scope: &ReportScope,
        since_ms: Option<u64>,
    ) -> Result<UsageReport, CoreError> {
        Ok(self.report_snapshot(now, scope, since_ms)?.report())
    }

    /// The policy's prices as the maths takes them.
    pub(crate) fn price_list(&self) -> PriceList {
        PriceList {
            prices: self.placement.policy().config().prices.clone(),
        }
    }

    /// GPU-hours a trial's attempts were allocated and what they cost (`None`
    /// without prices), a running attempt up to the last time its nodes were
    /// heard from.
    pub(crate) fn trial_usage(&self, trial: &TrialRecord) -> (f64, Option<f64>) {
        trial_usage(|id| self.membership.node(id), &self.price_list(), trial)
    }
}

/// GPU-hours a trial's attempts were allocated and what they cost at
/// `prices`, with each attempt's nodes found by `node` (see
/// [`HeadCore::trial_usage`]).
pub(crate) fn trial_usage<'a>(
    node: impl Fn(NodeId) -> Option<&'a NodeRecord> + Copy,
    prices: &PriceList,
    trial: &TrialRecord,
) -> (f64, Option<f64>) {
    let spans: Vec<AttemptSpan> = trial
        .attempts
        .iter()
        .map(|attempt| attempt_span(node, trial, attempt, None))
        .collect();
    let end = spans
        .iter()
        .map(|span| span.end.unwrap_or(span.start))
        .max()
        .unwrap_or(0);
    let start = spans.iter().map(|span| span.start).min().unwrap_or(0);
    let used = maths::usage(&spans, Window { start, end }, prices);
    (used.gpu_hours, used.cost)
}

/// What one report reads, copied from the core at one moment: the book's
/// catalog and the nodes (each GPU's model, when it was last heard, the
/// intervals it was up), both persistent maps, so the copy is a few
/// reference counts whatever the number of trials and nodes, and the prices. The head computes a
/// report on it off its actor, so a cluster report of a million trials never
/// holds up a scheduling decision.
#[derive(Debug, Clone)]
pub struct ReportSnapshot {
    catalog: Catalog,
    nodes: imbl::OrdMap<NodeId, NodeRecord>,
    prices: PriceList,
    scope: ReportScope,
    now: UnixMillis,
    since_ms: Option<u64>,
}

impl ReportSnapshot {
    /// The experiments the scope covers.
    fn scope_experiments(&self) -> Vec<ExperimentId> {
        match &self.scope {
            ReportScope::Experiment(id) => vec![*id],
            ReportScope::Team(team) => self
                .catalog
                .specs()
                .filter(|(_, spec)| &spec.team == team)
                .map(|(id, _)| *id)
                .collect(),
            ReportScope::Cluster => self.catalog.experiment_ids().collect(),
        }
    }

    /// The trials of the scope that ever held a GPU: those whose telemetry can
    /// say how busy their GPUs were.
    pub fn gpu_trials(&self) -> Vec<TrialId> {
        let mut trials = Vec::new();
        for id in self.scope_experiments() {
            for (trial_id, trial) in self.catalog.trials_of(id) {
                let held_gpus = trial
                    .attempts
                    .iter()
                    .flat_map(|attempt| &attempt.workers)
                    .any(|worker| !worker.gpu_indices.is_empty());
                if held_gpus {
                    trials.push(*trial_id);
                }
            }
        }
        trials
    }

    /// `report` with busy GPU-time from telemetry (per trial, its ranks'
    /// windows; see [`Self::busy_spans`]) over the report's window.
    pub fn add_busy_time(
        &self,
        report: &mut UsageReport,
        telemetry: &[(TrialId, Vec<WorkerTelemetry>)],
    ) {
        let window = Window {
            start: report.window_start,
            end: report.window_end,
        };
        report.busy_gpu_hours = maths::busy_gpu_hours(&self.busy_spans(telemetry), window);
        report.busy_utilization = report
            .busy_gpu_hours
            .and_then(|busy| maths::utilization(busy, report.available_gpu_hours));
    }

    /// Telemetry (per trial, its ranks' windows) as spans of busy GPUs: each
    /// window from its first sample to the next window's (or its own last
    /// sample), at its mean GPU utilisation, times the GPUs the rank held in
    /// the attempt that ran then. Windows without GPU figures give nothing.
    pub(crate) fn busy_spans(
        &self,
        telemetry: &[(TrialId, Vec<WorkerTelemetry>)],
    ) -> Vec<BusySpan> {
        let mut spans = Vec::new();
        for (trial_id, workers) in telemetry {
            let Some(trial) = self.catalog.get_trial(*trial_id) else {
                continue;
            };
            for worker in workers {
                for (index, window) in worker.windows.iter().enumerate() {
                    let Some(util) = window.gpu_util.filter(|stats| stats.n > 0) else {
                        continue;
                    };
                    let from = window.start_ms;
                    let to = worker
                        .windows
                        .get(index + 1)
                        .map_or(window.end_ms, |next| next.start_ms);
                    let gpus = trial
                        .attempts
                        .iter()
                        .rev()
                        .find(|attempt| attempt.placed_at <= from)
                        .and_then(|attempt| attempt.workers.get(worker.rank as usize))
                        .map_or(0.0, |held| {
                            held.gpu_indices.len() as f64 * f64::from(held.gpu_milli)
                                / GPU_MILLI as f64
                        });
                    if gpus > 0.0 {
                        spans.push(BusySpan {
                            gpus,
                            util: util.sum / util.n as f64 / 100.0,
                            from,
                            to,
                        });
                    }
                }
            }
        }
        spans
    }

    /// The report of the snapshot's scope over its last `since_ms` (or since
    /// the scope's first arrival), at its `now`. The window ends at `now`, or, without
    /// `since_ms` and with every trial of the scope finished, at the last finish.
    pub fn report(&self) -> UsageReport {
        let (now, scope, since_ms) = (self.now, &self.scope, self.since_ms);
        let experiments = self.scope_experiments();
        let window = report_window(
            experiments.iter().flat_map(|id| self.trial_spans(*id)),
            now,
            since_ms,
        );
        let mut used = maths::UsageTally::default();
        let mut queueing = maths::QueueingTally::default();
        let mut returns = Vec::new();
        // One experiment's spans at a time: a million trials' would be a few
        // hundred megabytes, and the order of the sums is the same.
        let (mut trials, mut attempts) = (Vec::new(), Vec::new());
        for id in &experiments {
            trials.clear();
            trials.extend(self.trial_spans(*id));
            attempts.clear();
            self.attempt_spans(*id, &mut attempts);
            used.add(&attempts, window);
            queueing.add(&trials, window);
            let spec = self.catalog.spec(*id);
            if let Some(metric) = spec.search.metric.as_deref() {
                returns.push(maths::experiment_return(
                    *id,
                    metric,
                    spec.search.mode == Mode::Max,
                    spec.search.value.map(|value| value.per_unit),
                    &trials,
                    &attempts,
                    window,
                    &self.prices,
                ));
            }
        }
        let used = used.finish(&self.prices);
        let queueing = queueing.finish(window);
        let available = maths::available_gpu_hours(&self.node_up_times(), window);
        UsageReport {
            scope: match scope {
                ReportScope::Experiment(id) => format!("experiment {id}"),
                ReportScope::Team(team) => format!("team {team}"),
                ReportScope::Cluster => "cluster".to_owned(),
            },
            window_start: window.start,
            window_end: window.end,
            gpu_hours: used.gpu_hours,
            gpu_hours_lost: used.gpu_hours_lost,
            lost_by_cause: used.lost_by_cause,
            by_model: used.by_model,
            cost: used.cost,
            cost_lost: used.cost_lost,
            unpriced_gpu_hours: used.unpriced_gpu_hours,
            available_gpu_hours: available,
            utilization: maths::utilization(used.gpu_hours, available),
            busy_gpu_hours: None,
            busy_utilization: None,
            queueing,
            returns,
            amdahl: self.amdahl_fits(&experiments),
        }
    }

    /// An experiment's trials as the maths takes them (those that reused
    /// another's result left out: they never entered the system).
    fn trial_spans(&self, id: ExperimentId) -> impl Iterator<Item = TrialSpan> + '_ {
        let submitted_at = self.catalog.experiment(id).submitted_at;
        let metric = self.catalog.spec(id).search.metric.as_deref();
        let ran = |(_, trial): &(&TrialId, &TrialRecord)| trial.reused_from.is_none();
        self.catalog
            .trials_of(id)
            .filter(ran)
            .map(move |(_, trial)| {
                let finished = trial.state.is_terminal().then(|| {
                    trial.finished_at.unwrap_or_else(|| {
                        trial
                            .attempts
                            .iter()
                            .filter_map(|attempt| attempt.ended_at)
                            .max()
                            .unwrap_or(trial.queued_at)
                    })
                });
                TrialSpan {
                    trial: trial.id,
                    arrived: trial.created_at.unwrap_or(submitted_at),
                    finished,
                    metric: finished
                        .and(metric)
                        .and_then(|metric| trial.metrics.get(metric).copied()),
                }
            })
    }

    /// An experiment's attempts as the maths takes them, a live one up to the
    /// window's end, added to `attempts`.
    fn attempt_spans(&self, id: ExperimentId, attempts: &mut Vec<AttemptSpan>) {
        let node = |id| self.nodes.get(&id);
        for (_, trial) in self.catalog.trials_of(id) {
            let spans = trial
                .attempts
                .iter()
                .map(|attempt| attempt_span(node, trial, attempt, Some(self.now)));
            attempts.extend(spans);
        }
    }

    /// Every node's GPUs over the intervals it was up; a node up now is up to `now`.
    fn node_up_times(&self) -> Vec<NodeUp> {
        let mut up = Vec::new();
        for node in self.nodes.values() {
            let gpus = node.resources.gpus.len() as f64;
            for interval in &node.up {
                up.push(NodeUp {
                    gpus,
                    from: interval.from,
                    to: Some(interval.to.unwrap_or(self.now)),
                });
            }
        }
        up
    }

    /// Amdahl fits for the work in scope: the experiments of one team with the
    /// same name and spec but for `parallel` and `workers`, finished, grouped;
    /// for one experiment, its group among its team's experiments.
    fn amdahl_fits(&self, in_scope: &[ExperimentId]) -> Vec<xp_runtime::report::AmdahlFit> {
        let scope = &self.scope;
        let candidates: Vec<ExperimentId> = match scope {
            ReportScope::Experiment(id) => {
                let team = &self.catalog.spec(*id).team;
                self.catalog
                    .specs()
                    .filter(|(_, spec)| &spec.team == team)
                    .map(|(id, _)| *id)
                    .collect()
            }
            _ => in_scope.to_vec(),
        };
        let mut groups: BTreeMap<(String, String, String), Vec<ExperimentId>> = BTreeMap::new();
        for id in candidates {
            let spec = self.catalog.spec(id);
            groups
                .entry((spec.team.clone(), spec.name.clone(), work_key(spec)))
                .or_default()
                .push(id);
        }
        let mut fits = Vec::new();
        for ((_, name, _), members) in groups {
            if let ReportScope::Experiment(id) = scope
                && !members.contains(id)
            {
                continue;
            }
            let measurements: Vec<(Measurement, u32, u32)> =
                members.iter().filter_map(|id| self.measure(*id)).collect();
            let parallels: std::collections::BTreeSet<u32> = measurements
                .iter()
                .map(|(_, parallel, _)| *parallel)
                .collect();
            let workers: std::collections::BTreeSet<u32> = measurements
                .iter()
                .map(|(_, _, workers)| *workers)
                .collect();
            let varied = match (parallels.len() > 1, workers.len() > 1) {
                (true, false) => "parallel",
                (false, true) => "workers",
                (true, true) => "parallel x workers",
                (false, false) => continue,
            };
            let points: Vec<Measurement> = measurements.into_iter().map(|(m, _, _)| m).collect();
            fits.extend(maths::fit_amdahl(&name, varied, &points));
        }
        fits
    }

    /// How long a finished experiment's work took (first placement to last
    /// finish) and at what parallelism (trials at once × workers per trial).
    fn measure(&self, id: ExperimentId) -> Option<(Measurement, u32, u32)> {
        let spec = self.catalog.spec(id);
        let mut first_start: Option<UnixMillis> = None;
        let mut last_finish: Option<UnixMillis> = None;
        let mut count = 0u32;
        for (_, trial) in self.catalog.trials_of(id) {
            if !trial.state.is_terminal()
                || trial.reused_from.is_some()
                || trial.state == TrialState::Cancelled
            {
                return None;
            }
            count += 1;
            let start = trial.attempts.first()?.placed_at;
            first_start = Some(first_start.map_or(start, |first| first.min(start)));
            let finish = trial.finished_at.or(trial.attempts.last()?.ended_at)?;
            last_finish = Some(last_finish.map_or(finish, |last| last.max(finish)));
        }
        let seconds = last_finish?.checked_sub(first_start?)? as f64 / 1000.0;
        let parallel = spec.search.parallel.unwrap_or(count).min(count).max(1);
        let workers = spec.trial.workers.max.max(1);
        Some((
            Measurement {
                parallelism: f64::from(parallel) * f64::from(workers),
                seconds,
                experiment: id,
            },
            parallel,
            workers,
        ))
    }
}

/// One attempt as the maths takes it, its nodes looked up by `node`; a live
/// one runs to the window's end when `now` is given, else to the last time
/// its nodes were heard from.
fn attempt_span<'a>(
    node: impl Fn(NodeId) -> Option<&'a NodeRecord>,
    trial: &TrialRecord,
    attempt: &AttemptRecord,
    now: Option<UnixMillis>,
) -> AttemptSpan {
    let mut models: BTreeMap<String, f64> = BTreeMap::new();
    for worker in &attempt.workers {
        let node = node(worker.node);
        let share = f64::from(worker.gpu_milli) / GPU_MILLI as f64;
        for index in &worker.gpu_indices {
            let model = node
                .and_then(|node| node.resources.gpus.get(*index as usize))
                .map_or_else(|| "unknown".to_owned(), |gpu| gpu.model.clone());
            *models.entry(model).or_default() += share;
        }
    }
    let end = match (attempt.ended_at, now) {
        (Some(end), _) => Some(end),
        // Up to the window's end.
        (None, Some(_)) => None,
        (None, None) => Some(
            attempt
                .workers
                .iter()
                .filter_map(|worker| node(worker.node))
                .map(|node| node.last_seen)
                .max()
                .unwrap_or(attempt.placed_at)
                .max(attempt.placed_at),
        ),
    };
    let cause = end_cause(attempt.outcome.as_deref());
    let later = trial
        .attempts
        .iter()
        .find(|next| next.number == attempt.number + 1);
    let redone = cause != EndCause::None && (later.is_some() || !trial.state.is_terminal());
    let resumed_checkpoint_at = match later {
        Some(next) => next.resumed_checkpoint_at.filter(|_| {
            next.resumed_from
                .is_some_and(|(_, written_by)| written_by == attempt.number)
        }),
        // Not started again yet: it will resume from the newest checkpoint.
        None => trial
            .checkpoints
            .iter()
            .rev()
            .find(|checkpoint| checkpoint.attempt == attempt.number)
            .map(|checkpoint| checkpoint.at),
    };
    AttemptSpan {
        trial: trial.id,
        start: attempt.placed_at,
        end,
        gpus: models
            .into_iter()
            .map(|(model, gpus)| GpuHold { model, gpus })
            .collect(),
        cause,
        redone,
        resumed_checkpoint_at,
    }
}

/// The spec with what Amdahl varies (`parallel`, `workers`) taken out: runs
/// with the same key do the same work.
fn work_key(spec: &ExperimentSpec) -> String {
    let mut work = spec.clone();
    work.search.parallel = None;
    work.trial.workers = xp_runtime::spec::Workers::fixed(1);
    work.to_canonical_json()
}

/// Which end of an attempt loses work, from its outcome's words.
fn end_cause(outcome: Option<&str>) -> EndCause {
    let Some(outcome) = outcome else {
        return EndCause::None;
    };
    // A resize stops the gang through its checkpoint as a preemption does.
    // So does an eviction for GPU memory.
    if outcome == "preempted" || outcome.starts_with("resized:") || outcome.starts_with("evicted:")
    {
        EndCause::Preemption
    } else if outcome.starts_with("lost:") {
        EndCause::NodeLoss
    } else if ["failed:", "oom-killed:", "time-limit:"]
        .iter()
        .any(|kind| outcome.starts_with(kind))
    {
        EndCause::Failure
    } else {
        EndCause::None
    }
}

/// `[now − since, now]`, or from the first arrival; without `since`, a scope
/// whose trials all finished ends at its last finish.
fn report_window(
    trials: impl Iterator<Item = TrialSpan>,
    now: UnixMillis,
    since_ms: Option<u64>,
) -> Window {
    if let Some(since) = since_ms {
        return Window {
            start: now.saturating_sub(since),
            end: now,
        };
    }
    let (mut first_arrival, mut last_finish) = (now, None);
    let (mut any, mut all_finished) = (false, true);
    for trial in trials {
        any = true;
        first_arrival = first_arrival.min(trial.arrived);
        match trial.finished {
            Some(finished) => last_finish = last_finish.max(Some(finished)),
            None => all_finished = false,
        }
    }
    let start = first_arrival;
    let end = match last_finish {
        Some(last) if any && all_finished => last.max(start),
        _ => now,
    };
    Window { start, end }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn outcomes_map_to_what_lost_the_work() {
        assert_eq!(end_cause(Some("preempted")), EndCause::Preemption);
        assert_eq!(
            end_cause(Some("evicted: node n evicted rank 0 for GPU memory")),
            EndCause::Preemption
        );
        assert_eq!(end_cause(Some("lost: node n lost")), EndCause::NodeLoss);
        assert_eq!(
            end_cause(Some("failed: rank 0 exited with status 1")),
            EndCause::Failure
        );
        assert_eq!(end_cause(Some("oom-killed: rank 0")), EndCause::Failure);
        assert_eq!(end_cause(Some("time-limit: ran past")), EndCause::Failure);
        assert_eq!(end_cause(Some("succeeded")), EndCause::None);
        assert_eq!(end_cause(Some("cancelled by user")), EndCause::None);
        assert_eq!(end_cause(None), EndCause::None);
    }
}
