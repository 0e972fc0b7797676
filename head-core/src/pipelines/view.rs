//! What `xp pipeline status` and `/api/pipelines` show, and the critical path:
//! each stage's estimated duration (history of the same stage identity, then of
//! the same stage name, through `xp_sched::dag::estimate_duration`, or its
//! declared `estimate`), the longest remaining path (`xp_sched::dag::critical_path`)
//! and the estimated finish.
//!
//! The critical path is recomputed once per scheduling pass for the pipelines
//! whose stages changed (`HeadCore::refresh_critical`), from duration histories
//! kept as stages settle; the experiments of stages on it get urgency in their
//! trials' `TrialRequest` (and waiting trials get it through
//! `PolicyCore::set_urgency` when the path moves), so they go first within their
//! queue. Only pipelines with at least two stages not yet done get urgency.

use std::collections::{BTreeMap, BTreeSet};

use xp_runtime::clock::UnixMillis;
use xp_runtime::protocol::{PipelineStatus, StageState, StageStatus, TrialState};
use xp_sched::dag::{CriticalPath, DagNode, NodeProgress, critical_path, estimate_duration};

use super::{CoreError, HeadCore, Pipeline};
use crate::pages::MAX_PAGE_BYTES;

/// The weight of a stage with no estimate at all, so the path still follows
/// the longest chain of stages.
const UNKNOWN_ESTIMATE_S: f64 = 1.0;

/// The most past durations one estimate looks at.
pub(super) const MAX_HISTORY: usize = 64;

impl HeadCore {
    /// Pipeline `id`, or every pipeline `visible` allows, newest first.
    pub fn pipelines_status(
        &self,
        now: UnixMillis,
        id: Option<u64>,
        visible: &dyn Fn(&str) -> bool,
    ) -> Result<Vec<PipelineStatus>, CoreError> {
        match id {
            Some(id) => {
                let pipeline = self
                    .pipelines
                    .by_id
                    .get(&id)
                    .filter(|pipeline| visible(&pipeline.spec.team))
                    .ok_or(CoreError::PipelineNotFound { pipeline: id })?;
                Ok(vec![self.pipeline_status(now, pipeline)])
            }
            None => {
                // Newest first, at most 1,000 and about `MAX_PAGE_BYTES` of JSON
                // (always at least one), so one answer stays bounded.
                let mut bytes = 0;
                let mut statuses = Vec::new();
                for pipeline in self
                    .pipelines
                    .by_id
                    .values()
                    .rev()
                    .filter(|pipeline| visible(&pipeline.spec.team))
                    .take(1000)
                {
                    let status = self.pipeline_status(now, pipeline);
                    bytes += serde_json::to_vec(&status).map_or(0, |json| json.len());
                    if bytes > MAX_PAGE_BYTES && !statuses.is_empty() {
                        break;
                    }
                    statuses.push(status);
                }
                Ok(statuses)
            }
        }
    }

    fn pipeline_status(&self, now: UnixMillis, pipeline: &Pipeline) -> PipelineStatus {
        let order = pipeline.spec.order();
        let estimates: Vec<Option<f64>> = order
            .iter()
            .map(|name| self.stage_estimate(pipeline, name))
            .collect();
        let path = self.pipeline_path(now, pipeline, &order, &estimates);
        let unknown = order.iter().zip(&estimates).any(|(name, estimate)| {
            !pipeline.record.stages[name].state.is_terminal() && estimate.is_none()
        });
        let remaining_s = path
            .as_ref()
            .filter(|_| !unknown)
            .map(|path| path.remaining_s);
        let stages = order
            .iter()
            .enumerate()
            .map(|(index, name)| {
                let stage = &pipeline.record.stages[name];
                let result = stage.result.as_ref();
                StageStatus {
                    name: name.clone(),
                    state: stage.state,
                    needs: pipeline.spec.stages[name].needs.clone(),
                    experiment: stage.experiment,
                    reason: match (stage.state, stage.experiment) {
                        (StageState::Running, Some(experiment)) => self.running_detail(experiment),
                        _ => stage.reason.clone(),
                    },
                    reused_from: stage.reused_from.clone(),
                    inputs: stage.inputs.clone(),
                    outputs: result
                        .map(|result| result.outputs.clone())
                        .unwrap_or_default(),
                    best_params_json: result.map(|result| result.params_json.clone()),
                    best_metrics: result
                        .map(|result| {
                            result
                                .metrics
                                .iter()
                                .map(|(name, value)| (name.clone(), *value))
                                .collect()
                        })
                        .unwrap_or_default(),
                    estimate_s: estimates[index],
                    critical: path.as_ref().is_some_and(|path| path.on_critical[index]),
                    identity: stage.identity.map(hex::encode),
                }
            })
            .collect();
        PipelineStatus {
            id: pipeline.record.id,
            name: pipeline.spec.name.clone(),
            team: pipeline.spec.team.clone(),
            state: pipeline.state().to_owned(),
            submitted_at: pipeline.record.submitted_at,
            stages,
            critical_path: path
                .as_ref()
                .map(|path| {
                    path.path
                        .iter()
                        .map(|index| order[*index].clone())
                        .collect()
                })
                .unwrap_or_default(),
            remaining_s,
            estimated_finish: remaining_s
                .map(|remaining| now.saturating_add((remaining * 1000.0).round() as u64)),
        }
    }

    /// Why a running stage is not done: its experiment's trials by state, and
    /// why the first waiting one waits.
    fn running_detail(&self, experiment: xp_runtime::ids::ExperimentId) -> String {
        let mut counts: BTreeMap<&'static str, usize> = BTreeMap::new();
        let mut waits = None;
        for (_, trial) in self.book.trials_of(experiment) {
            *counts.entry(trial.state.as_str()).or_default() += 1;
            if waits.is_none() && trial.state == TrialState::Queued {
                waits = self
                    .placement
                    .policy()
                    .wait_reason(trial.id)
                    .map(|reason| reason.to_string());
            }
        }
        let counts: Vec<String> = counts
            .iter()
            .map(|(state, count)| format!("{count} {state}"))
            .collect();
        let mut detail = format!("experiment {experiment}: {}", counts.join(", "));
        if let Some(waits) = waits {
            detail.push_str(&format!("; a queued trial waits: {waits}"));
        }
        detail
    }

    /// The critical path of `pipeline` with stages in `order`; none for a
    /// finished pipeline.
    fn pipeline_path(
        &self,
        now: UnixMillis,
        pipeline: &Pipeline,
        order: &[String],
        estimates: &[Option<f64>],
    ) -> Option<CriticalPath> {
        let index: BTreeMap<&str, usize> = order
            .iter()
            .enumerate()
            .map(|(i, name)| (name.as_str(), i))
            .collect();
        let nodes: Vec<DagNode> = order
            .iter()
            .zip(estimates)
            .map(|(name, estimate)| {
                let stage = &pipeline.record.stages[name];
                let state = match stage.state {
                    StageState::Running => NodeProgress::Running {
                        elapsed_s: stage
                            .started_at
                            .map_or(0.0, |at| now.saturating_sub(at) as f64 / 1000.0),
                    },
                    StageState::Waiting | StageState::Ready => NodeProgress::Waiting,
                    // Failed and cancelled stages take no more time until a retry.
                    _ => NodeProgress::Done,
                };
                DagNode {
                    needs: pipeline.spec.stages[name]
                        .needs
                        .iter()
                        .filter_map(|need| index.get(need.as_str()).copied())
                        .collect(),
                    estimate_s: estimate.unwrap_or(UNKNOWN_ESTIMATE_S),
                    state,
                }
            })
            .collect();
        critical_path(&nodes).ok()
    }

    /// Stage `name`'s estimated duration: past runs of the same identity, else
    /// of the same stage of pipelines of the same name, else its declared
    /// estimate. Reads the histories kept as stages settle (`record_duration`).
    fn stage_estimate(&self, pipeline: &Pipeline, name: &str) -> Option<f64> {
        let stage = &pipeline.record.stages[name];
        let declared = pipeline.spec.stages[name].estimate_s();
        let history = stage
            .identity
            .and_then(|identity| self.pipelines.durations_by_identity.get(&identity))
            .filter(|history| !history.is_empty())
            .or_else(|| {
                self.pipelines
                    .durations_by_name
                    .get(&(pipeline.spec.name.clone(), name.to_owned()))
            });
        let history: Vec<f64> = history.map_or_else(Vec::new, |h| h.iter().copied().collect());
        estimate_duration(&history, declared)
    }

    /// Recomputes which stage experiments lie on a critical path, for the
    /// pipelines whose stages changed since the last time, and gives their
    /// waiting trials the new urgency. Only a pipeline with at least two stages
    /// not yet done has one: a lone stage has nothing to overtake for.
    pub(super) fn refresh_critical(&mut self, now: UnixMillis) {
        for id in std::mem::take(&mut self.pipelines.changed) {
            let mut critical = BTreeSet::new();
            if let Some(pipeline) = self.pipelines.by_id.get(&id) {
                let open = pipeline
                    .record
                    .stages
                    .values()
                    .filter(|stage| !stage.state.is_terminal())
                    .count();
                if open >= 2 {
                    let order = pipeline.spec.order();
                    let estimates: Vec<Option<f64>> = order
                        .iter()
                        .map(|name| self.stage_estimate(pipeline, name))
                        .collect();
                    if let Some(path) = self.pipeline_path(now, pipeline, &order, &estimates) {
                        for (index, name) in order.iter().enumerate() {
                            let stage = &pipeline.record.stages[name];
                            if path.on_critical[index]
                                && !stage.state.is_terminal()
                                && let Some(experiment) = stage.experiment
                            {
                                critical.insert(experiment);
                            }
                        }
                    }
                }
            }
            let before = if critical.is_empty() {
                self.pipelines.critical.remove(&id).unwrap_or_default()
            } else {
                self.pipelines
                    .critical
                    .insert(id, critical.clone())
                    .unwrap_or_default()
            };
            for experiment in before.symmetric_difference(&critical) {
                let urgency = u32::from(critical.contains(experiment));
                // Waiting, held or running: the scheduler keeps it for each.
                let waiting: Vec<_> = self
                    .book
                    .trials_of(*experiment)
                    .filter(|(_, trial)| !trial.state.is_terminal())
                    .map(|(id, _)| *id)
                    .collect();
                for trial in waiting {
                    self.placement.policy_mut().set_urgency(trial, urgency);
                }
            }
        }
    }
}
