//! Pipelines: stages that run as experiments once the stages they need have
//! succeeded, with their inputs resolved from those stages' results.
//!
//! Sans-io like the rest of the core. A pipeline is persisted as one
//! `PipelineRecord` (its stages inside). Upstream triggers need no polling:
//! whenever a trial of a stage's experiment ends, `transition` marks the
//! pipelines touched, and the next scheduling pass (in the same step) runs
//! [`HeadCore::advance_pipelines`], which settles finished stages and releases
//! every stage whose needs all have a result, in execution order, so a chain of
//! reused stages settles in one pass. A stage whose need failed or was
//! cancelled is cancelled, saying which; independent branches carry on.
//!
//! Cache: a stage's identity is a domain-separated blake3 of the pipeline's
//! team, the stage's own canonical spec (without its estimate), the code and data versions, and for each stage
//! it needs, that stage's identity and result (best parameters, output and
//! checkpoint object ids). A stage whose identity matches a stage that
//! succeeded by running is `reused` from it instead of running. Stage
//! experiments are submitted with `rerun`, so trial-level reuse never replaces
//! a stage whose inputs changed but whose command text did not.
//!
//! Not here: the status view and the critical path (`view`).
//!
//! Invariants: a stage is `running` exactly while its `experiment` is set and
//! was submitted by this module; a stage is released only once every need has
//! a result; `cache` holds only stages that succeeded by running.

mod view;

use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};

use tracing::{info, warn};
use xp_runtime::clock::UnixMillis;
use xp_runtime::ids::{ExperimentId, TrialId};
use xp_runtime::protocol::{
    ExperimentState, LaunchInput, PipelineSubmit, Response, ReusedFrom, StageInput, StageState,
    SubmitRequest, TrialState,
};
use xp_runtime::spec::{Mode, PipelineSpec, RefKind, StageSpec, input_dir_name, input_marker};

use super::error::MAX_VERSION_BYTES;
use super::records::{InputDir, PipelineRecord, StageRecord, StageResult};
use super::{CoreError, HeadCore, Record};

/// The most rounds one scheduling pass settles pipelines for; each round
/// finishes at least one stage, so this bounds a pass, never a pipeline.
const MAX_ROUNDS: usize = 4 * xp_runtime::spec::MAX_STAGES;

/// The most input files one stage's launches may carry, over all its input
/// directories: every launch of the stage holds the list.
const MAX_INPUT_FILES: usize = 10_000;

/// The most bytes of file names and ids one stage's launch inputs may hold.
const MAX_INPUT_BYTES: usize = 4 << 20;

/// The most file names one resolved reference shows.
const SHOWN_FILES: usize = 10;

/// The most bytes a shown reference value keeps (the full value is still used).
const MAX_SHOWN_BYTES: usize = 1024;

/// `files` in words: how many, and the first [`SHOWN_FILES`] names.
fn describe_files(files: &[xp_runtime::protocol::CheckpointFile]) -> String {
    let names: Vec<&str> = files
        .iter()
        .take(SHOWN_FILES)
        .map(|file| file.name.as_str())
        .collect();
    let more = if files.len() > SHOWN_FILES {
        format!(", … (first {SHOWN_FILES})")
    } else {
        String::new()
    };
    shown(format!(
        "{} file(s): {}{more}",
        files.len(),
        names.join(", ")
    ))
}

/// `value` cut to [`MAX_SHOWN_BYTES`] on a character boundary, saying so.
fn shown(mut value: String) -> String {
    if value.len() > MAX_SHOWN_BYTES {
        let mut end = MAX_SHOWN_BYTES;
        while !value.is_char_boundary(end) {
            end -= 1;
        }
        value.truncate(end);
        value.push_str(" …");
    }
    value
}

/// A change a client asks of the pipelines.
#[derive(Debug, Clone)]
pub enum PipelineChange {
    /// Submit one.
    Submit(PipelineSubmit),
    /// Cancel its running and waiting stages.
    Cancel(u64),
    /// Rerun its failed and cancelled stages and their descendants.
    Retry(u64),
}

/// One pipeline in memory: its record and its parsed spec.
#[derive(Debug, Clone)]
struct Pipeline {
    record: PipelineRecord,
    spec: PipelineSpec,
}

impl Pipeline {
    fn finished(&self) -> bool {
        self.record
            .stages
            .values()
            .all(|stage| stage.state.is_terminal())
    }

    fn state(&self) -> &'static str {
        let states: Vec<StageState> = self.record.stages.values().map(|s| s.state).collect();
        if states.iter().any(|state| !state.is_terminal()) {
            "running"
        } else if states.iter().all(|state| state.has_result()) {
            "succeeded"
        } else if self.record.cancelled {
            "cancelled"
        } else {
            "failed"
        }
    }
}

/// Every pipeline, and what the scheduler needs to know of them.
#[derive(Debug, Default)]
pub(crate) struct Pipelines {
    by_id: BTreeMap<u64, Pipeline>,
    /// The stage each submitted experiment belongs to.
    stage_of: BTreeMap<ExperimentId, (u64, String)>,
    /// Pipelines to persist.
    dirty: BTreeSet<u64>,
    /// A stage's experiment may have finished since the last pass.
    touched: bool,
    /// A stage's experiment was refused for now (too many pending trials):
    /// the next pass (a tick at the latest) tries again.
    deferred: bool,
    /// Stages that succeeded by running, by identity: what new stages may reuse.
    cache: BTreeMap<[u8; 32], (u64, String)>,
    /// Per pipeline, the experiments of its stages on its critical path: their
    /// trials go first in their queue.
    critical: BTreeMap<u64, BTreeSet<ExperimentId>>,
    /// Pipelines whose stages changed since their critical path was last computed.
    changed: BTreeSet<u64>,
    /// The id the next pipeline gets; never one a stored record had.
    next_id: u64,
    /// Stages released since the head started, for each release's marker nonce.
    releases: u64,
    /// The newest durations (seconds) of succeeded stages, by stage identity,
    /// kept as stages settle so that estimates never rescan every pipeline.
    durations_by_identity: HashMap<[u8; 32], VecDeque<f64>>,
    /// The same by (pipeline name, stage name).
    durations_by_name: HashMap<(String, String), VecDeque<f64>>,
}

impl Pipelines {
    /// Pipelines from their records; any stage may have finished while the head
    /// was down, so the first pass looks at all of them.
    pub(super) fn restore(records: Vec<PipelineRecord>, next_id: u64) -> Self {
        let mut pipelines = Self {
            touched: true,
            next_id: next_id.max(1),
            ..Self::default()
        };
        let mut records = records;
        // Oldest first, so each history keeps the newest durations.
        records.sort_by_key(|record| record.id);
        for record in records {
            // Also past a record skipped below: its id stays taken.
            pipelines.next_id = pipelines.next_id.max(record.id.saturating_add(1));
            let spec = match PipelineSpec::from_json(&record.spec_json) {
                Ok(spec) => spec,
                Err(error) => {
                    warn!(pipeline = record.id, %error, "stored pipeline spec no longer validates; skipped");
                    continue;
                }
            };
            for (name, stage) in &record.stages {
                pipelines.record_duration(&spec.name, name, stage);
                if let Some(experiment) = stage.experiment {
                    pipelines
                        .stage_of
                        .insert(experiment, (record.id, name.clone()));
                }
                if stage.state == StageState::Succeeded
                    && let Some(identity) = stage.identity
                {
                    pipelines
                        .cache
                        .entry(identity)
                        .or_insert((record.id, name.clone()));
                }
            }
            pipelines.changed.insert(record.id);
            pipelines.by_id.insert(record.id, Pipeline { record, spec });
        }
        pipelines
    }

    /// Adds a succeeded stage's duration to the histories estimates read.
    fn record_duration(&mut self, pipeline: &str, name: &str, stage: &StageRecord) {
        if stage.state != StageState::Succeeded {
            return;
        }
        let (Some(start), Some(end)) = (stage.started_at, stage.finished_at) else {
            return;
        };
        let seconds = end.saturating_sub(start) as f64 / 1000.0;
        let push = |history: &mut VecDeque<f64>| {
            if history.len() == view::MAX_HISTORY {
                history.pop_front();
            }
            history.push_back(seconds);
        };
        if let Some(identity) = stage.identity {
            push(self.durations_by_identity.entry(identity).or_default());
        }
        push(
            self.durations_by_name
                .entry((pipeline.to_owned(), name.to_owned()))
                .or_default(),
        );
    }

    /// Pipeline `id` changed: persist it and recompute its critical path.
    fn mark(&mut self, id: u64) {
        self.dirty.insert(id);
        self.changed.insert(id);
    }

    /// The records changed since the last call.
    pub(super) fn take_records(&mut self) -> Vec<Record> {
        std::mem::take(&mut self.dirty)
            .into_iter()
            .filter_map(|id| self.by_id.get(&id))
            .map(|pipeline| Record::Pipeline(pipeline.record.clone()))
            .collect()
    }

    /// A trial of `experiment` ended: if it is a stage's, look again.
    pub(super) fn trial_ended(&mut self, experiment: ExperimentId) {
        if self.stage_of.contains_key(&experiment) {
            self.touched = true;
        }
    }

    /// Whether `experiment`'s stage is on its pipeline's critical path.
    pub(super) fn is_critical(&self, experiment: ExperimentId) -> bool {
        self.stage_of.get(&experiment).is_some_and(|(id, _)| {
            self.critical
                .get(id)
                .is_some_and(|critical| critical.contains(&experiment))
        })
    }

    /// The team owning pipeline `id`.
    pub(crate) fn team_of(&self, id: u64) -> Result<String, CoreError> {
        self.by_id
            .get(&id)
            .map(|pipeline| pipeline.spec.team.clone())
            .ok_or(CoreError::PipelineNotFound { pipeline: id })
    }

    fn stage_mut(&mut self, id: u64, name: &str) -> &mut StageRecord {
        self.mark(id);
        self.by_id
            .get_mut(&id)
            .and_then(|pipeline| pipeline.record.stages.get_mut(name))
            .expect("a stage of a known pipeline")
    }

    fn stage(&self, id: u64, name: &str) -> &StageRecord {
        &self.by_id[&id].record.stages[name]
    }
}

fn waiting_stage(reason: String) -> StageRecord {
    StageRecord {
        state: StageState::Waiting,
        reason,
        experiment: None,
        identity: None,
        reused_from: None,
        inputs: Vec::new(),
        input_dirs: Vec::new(),
        result: None,
        started_at: None,
        finished_at: None,
    }
}

impl HeadCore {
    /// Carries out a client's change to the pipelines.
    pub fn handle_pipeline_change(
        &mut self,
        now: UnixMillis,
        change: PipelineChange,
    ) -> Result<Response, CoreError> {
        match change {
            PipelineChange::Submit(submit) => {
                self.submit_pipeline(now, &submit)
                    .map(|(pipeline, stages, reused)| Response::PipelineSubmitted {
                        pipeline,
                        stages,
                        reused,
                    })
            }
            PipelineChange::Cancel(id) => self
                .cancel_pipeline(now, id)
                .map(|stages| Response::PipelineChanged { stages }),
            PipelineChange::Retry(id) => self
                .retry_pipeline(now, id)
                .map(|stages| Response::PipelineChanged { stages }),
        }
    }

    /// Creates a pipeline and releases what it can at once; returns its id, its
    /// number of stages and how many of them were reused.
    pub fn submit_pipeline(
        &mut self,
        now: UnixMillis,
        submit: &PipelineSubmit,
    ) -> Result<(u64, u32, u32), CoreError> {
        let spec = PipelineSpec::from_json(&submit.spec_json)?;
        if submit.code_version.len() > MAX_VERSION_BYTES
            || submit.data_version.len() > MAX_VERSION_BYTES
        {
            return Err(CoreError::VersionTooLong);
        }
        let id = self.pipelines.next_id.max(1);
        self.pipelines.next_id = id.saturating_add(1);
        let stages = spec
            .stages
            .keys()
            .map(|name| (name.clone(), waiting_stage("submitted".to_owned())))
            .collect();
        let record = PipelineRecord {
            id,
            spec_json: spec.to_canonical_json(),
            code_version: submit.code_version.clone(),
            data_version: submit.data_version.clone(),
            submitted_at: now,
            cancelled: false,
            stages,
        };
        info!(pipeline = id, name = %spec.name, stages = spec.stages.len(), "pipeline submitted");
        let count = spec.stages.len() as u32;
        self.pipelines.by_id.insert(id, Pipeline { record, spec });
        self.pipelines.mark(id);
        self.pipelines.touched = true;
        self.schedule(now);
        let reused = self.pipelines.by_id[&id]
            .record
            .stages
            .values()
            .filter(|stage| stage.state == StageState::Reused)
            .count() as u32;
        Ok((id, count, reused))
    }

    /// Cancels the running and waiting stages of pipeline `id` (and the
    /// experiments of the running ones); returns how many stages it cancelled.
    pub fn cancel_pipeline(&mut self, now: UnixMillis, id: u64) -> Result<u32, CoreError> {
        let pipeline = self
            .pipelines
            .by_id
            .get_mut(&id)
            .ok_or(CoreError::PipelineNotFound { pipeline: id })?;
        pipeline.record.cancelled = true;
        let mut experiments = Vec::new();
        let mut cancelled = 0;
        for stage in pipeline.record.stages.values_mut() {
            if stage.state.is_terminal() {
                continue;
            }
            experiments.extend(stage.experiment);
            stage.state = StageState::Cancelled;
            stage.reason = "cancelled by user".to_owned();
            stage.finished_at = Some(now);
            cancelled += 1;
        }
        self.pipelines.mark(id);
        info!(pipeline = id, stages = cancelled, "pipeline cancelled");
        for experiment in experiments {
            if self.book.contains_experiment(experiment) {
                self.handle_cancel(now, &experiment.to_string())?;
            }
        }
        self.schedule(now);
        Ok(cancelled)
    }

    /// Puts the failed and cancelled stages of pipeline `id` back to waiting
    /// (their descendants are among them: a stage whose need failed is
    /// cancelled), so they run again while what succeeded is kept; so too a
    /// stage with a result whose output files no live node holds any more (a
    /// lost node), and everything downstream of it. Returns how many stages it
    /// reset.
    pub fn retry_pipeline(&mut self, now: UnixMillis, id: u64) -> Result<u32, CoreError> {
        let pipeline = self
            .pipelines
            .by_id
            .get(&id)
            .ok_or(CoreError::PipelineNotFound { pipeline: id })?;
        // In execution order, so a stage's needs are decided before it.
        let mut lost: BTreeSet<String> = BTreeSet::new();
        for name in pipeline.spec.order() {
            let stage = &pipeline.record.stages[&name];
            let upstream_lost = pipeline.spec.stages[&name]
                .needs
                .iter()
                .any(|need| lost.contains(need));
            let outputs_lost = stage.state.has_result()
                && stage
                    .result
                    .as_ref()
                    .is_some_and(|result| !self.outputs_live(result));
            if upstream_lost || outputs_lost {
                lost.insert(name);
            }
        }
        let pipeline = self
            .pipelines
            .by_id
            .get_mut(&id)
            .ok_or(CoreError::PipelineNotFound { pipeline: id })?;
        pipeline.record.cancelled = false;
        let mut reset = 0;
        for (name, stage) in &mut pipeline.record.stages {
            if stage.state.has_result() && lost.contains(name) {
                *stage = waiting_stage(
                    "retried (its outputs, or a need's, are on no live node)".to_owned(),
                );
                reset += 1;
                continue;
            }
            if !matches!(stage.state, StageState::Failed | StageState::Cancelled) {
                continue;
            }
            let before = match stage.experiment {
                Some(experiment) => format!("retried (was experiment {experiment})"),
                None => "retried".to_owned(),
            };
            *stage = waiting_stage(before);
            reset += 1;
        }
        self.pipelines.mark(id);
        self.pipelines.touched = true;
        info!(pipeline = id, stages = reset, "pipeline retried");
        self.schedule(now);
        Ok(reset)
    }

    /// Settles finished stages and releases ready ones until nothing changes;
    /// called at the start of every scheduling pass.
    pub(super) fn advance_pipelines(&mut self, now: UnixMillis) {
        if std::mem::take(&mut self.pipelines.deferred) {
            self.pipelines.touched = true;
        }
        let mut rounds = 0;
        while std::mem::take(&mut self.pipelines.touched) && rounds < MAX_ROUNDS {
            rounds += 1;
            let open: Vec<u64> = self
                .pipelines
                .by_id
                .iter()
                .filter(|(_, pipeline)| !pipeline.finished())
                .map(|(id, _)| *id)
                .collect();
            for id in open {
                self.step_pipeline(now, id);
            }
        }
        // Once per pass, and only for the pipelines whose stages changed.
        self.refresh_critical(now);
    }

    /// One pass over pipeline `id`'s stages in execution order.
    fn step_pipeline(&mut self, now: UnixMillis, id: u64) {
        let order = self.pipelines.by_id[&id].spec.order();
        for name in order {
            let stage = self.pipelines.stage(id, &name).clone();
            match stage.state {
                StageState::Running => self.settle_running(now, id, &name, stage.experiment),
                StageState::Waiting | StageState::Ready => self.try_release(now, id, &name),
                _ => {}
            }
        }
    }

    /// A running stage whose experiment ended succeeds, fails or is cancelled with it.
    fn settle_running(
        &mut self,
        now: UnixMillis,
        id: u64,
        name: &str,
        experiment: Option<ExperimentId>,
    ) {
        let Some(experiment) = experiment.filter(|exp| self.book.contains_experiment(*exp)) else {
            let stage = self.pipelines.stage_mut(id, name);
            stage.state = StageState::Failed;
            stage.reason = "its experiment is gone".to_owned();
            stage.finished_at = Some(now);
            return;
        };
        let (state, reason, result) = match self.experiment_state(experiment) {
            ExperimentState::Running => return,
            ExperimentState::Succeeded => match self.stage_result(experiment) {
                Some(result) => (
                    StageState::Succeeded,
                    format!("experiment {experiment} succeeded"),
                    Some(result),
                ),
                None => (
                    StageState::Failed,
                    format!("experiment {experiment} succeeded without a best trial"),
                    None,
                ),
            },
            ExperimentState::Failed => {
                let why = self
                    .book
                    .trials_of(experiment)
                    .map(|(_, trial)| trial)
                    .find(|trial| trial.state == TrialState::Failed)
                    .and_then(|trial| trial.reason.as_deref().map(str::to_owned))
                    .unwrap_or_else(|| "no trial succeeded".to_owned());
                (
                    StageState::Failed,
                    format!("experiment {experiment} failed: {why}"),
                    None,
                )
            }
            ExperimentState::Cancelled => (
                StageState::Cancelled,
                format!("experiment {experiment} was cancelled"),
                None,
            ),
        };
        info!(pipeline = id, stage = name, state = state.as_str(), %reason, "pipeline stage finished");
        let stage = self.pipelines.stage_mut(id, name);
        stage.state = state;
        stage.reason = reason;
        stage.result = result;
        stage.finished_at = Some(now);
        let (stage, pipeline_name) = (stage.clone(), self.pipelines.by_id[&id].spec.name.clone());
        self.pipelines.record_duration(&pipeline_name, name, &stage);
        if state == StageState::Succeeded
            && let Some(identity) = stage.identity
        {
            self.pipelines
                .cache
                .entry(identity)
                .or_insert((id, name.to_owned()));
        }
    }

    /// A waiting stage: cancelled when a need failed, reused when an identical
    /// stage succeeded, released when every need has a result, else it waits.
    fn try_release(&mut self, now: UnixMillis, id: u64, name: &str) {
        let pipeline = &self.pipelines.by_id[&id];
        if pipeline.record.cancelled {
            return;
        }
        let needs = pipeline.spec.stages[name].needs.clone();
        let blocked = needs
            .iter()
            .find_map(|need| match pipeline.record.stages[need].state {
                StageState::Failed => Some(format!("needs `{need}`, which failed")),
                StageState::Cancelled => Some(format!("needs `{need}`, which was cancelled")),
                _ => None,
            });
        if let Some(reason) = blocked {
            let stage = self.pipelines.stage_mut(id, name);
            stage.state = StageState::Cancelled;
            stage.reason = reason;
            stage.finished_at = Some(now);
            return;
        }
        let waiting: Vec<String> = needs
            .iter()
            .filter(|need| !pipeline.record.stages[*need].state.has_result())
            .map(|need| format!("`{need}`"))
            .collect();
        if !waiting.is_empty() {
            let reason = format!("waiting for {}", waiting.join(", "));
            if pipeline.record.stages[name].reason != reason {
                self.pipelines.stage_mut(id, name).reason = reason;
            }
            return;
        }
        let identity = self.stage_identity(id, name);
        if let Some((source_id, source_stage)) = self.pipelines.cache.get(&identity).cloned()
            && (source_id, source_stage.as_str()) != (id, name)
            && self
                .pipelines
                .stage(source_id, &source_stage)
                .result
                .as_ref()
                .is_some_and(|result| self.outputs_live(result))
        {
            let source = self.pipelines.stage(source_id, &source_stage).clone();
            let stage = self.pipelines.stage_mut(id, name);
            stage.state = StageState::Reused;
            stage.reason = format!(
                "reused the result of pipeline {source_id} stage `{source_stage}` (same spec, code, data and inputs)"
            );
            stage.identity = Some(identity);
            stage.reused_from = Some(ReusedFrom {
                pipeline: source_id,
                stage: source_stage,
            });
            stage.inputs = source.inputs;
            stage.input_dirs = source.input_dirs;
            stage.result = source.result;
            stage.finished_at = Some(now);
            info!(pipeline = id, stage = name, "pipeline stage reused");
            return;
        }
        self.release_stage(now, id, name, identity);
    }

    /// Resolves stage `name`'s references and submits its experiment.
    fn release_stage(&mut self, now: UnixMillis, id: u64, name: &str, identity: [u8; 32]) {
        // Fresh for each release: only the markers the head made name input
        // directories, never text that a parameter's value happens to repeat.
        // Keyed by the head's secret (as collective tokens are), so a user
        // cannot compute it; the counter makes each release's different.
        self.pipelines.releases += 1;
        let nonce = hex::encode(
            &blake3::keyed_hash(
                &self.config.rendezvous_key,
                format!(
                    "xp input marker/{id}/{name}/{now}/{}",
                    self.pipelines.releases
                )
                .as_bytes(),
            )
            .as_bytes()[..16],
        );
        let pipeline = &self.pipelines.by_id[&id];
        let spec = &pipeline.spec;
        let mut values: BTreeMap<String, String> = BTreeMap::new();
        let mut inputs = Vec::new();
        let mut input_dirs = Vec::new();
        let mut problem = None;
        for reference in spec.references(name) {
            let upstream = &pipeline.record.stages[&reference.stage];
            let Some(result) = &upstream.result else {
                problem = Some(format!("`{}` has no result", reference.stage));
                break;
            };
            let text = reference.text();
            let value = match &reference.kind {
                RefKind::Outputs | RefKind::Checkpoint => {
                    let files = if reference.kind == RefKind::Outputs {
                        result.outputs.clone()
                    } else {
                        result.checkpoint.clone()
                    };
                    if reference.kind == RefKind::Checkpoint && files.is_empty() {
                        problem = Some(format!("`{}` kept no checkpoint", reference.stage));
                        break;
                    }
                    let shown = describe_files(&files);
                    input_dirs.push(InputDir {
                        name: input_dir_name(&reference),
                        marker: input_marker(&reference, &nonce),
                        files,
                    });
                    inputs.push(StageInput {
                        reference: text,
                        value: shown,
                    });
                    continue;
                }
                RefKind::BestParam(param) => serde_json::from_str::<
                    serde_json::Map<String, serde_json::Value>,
                >(&result.params_json)
                .ok()
                .and_then(|params| params.get(param).cloned())
                .map(|value| match value {
                    serde_json::Value::String(text) => text,
                    other => other.to_string(),
                }),
                RefKind::BestMetric => spec.stages[&reference.stage]
                    .search
                    .as_ref()
                    .and_then(|search| search.metric.as_ref())
                    .and_then(|metric| result.metrics.get(metric))
                    .map(f64::to_string),
                RefKind::BestMetricNamed(metric) => result.metrics.get(metric).map(f64::to_string),
            };
            match value {
                Some(value) => {
                    inputs.push(StageInput {
                        reference: text.clone(),
                        value: shown(value.clone()),
                    });
                    values.insert(text, value);
                }
                None => {
                    problem = Some(format!(
                        "`{}` produced no value for {{{text}}}",
                        reference.stage
                    ));
                    break;
                }
            }
        }
        let (count, bytes) = input_dirs
            .iter()
            .flat_map(|dir| &dir.files)
            .fold((0usize, 0usize), |(count, bytes), file| {
                (count + 1, bytes + file.name.len() + 48)
            });
        if problem.is_none() && (count > MAX_INPUT_FILES || bytes > MAX_INPUT_BYTES) {
            problem = Some(format!(
                "its inputs are {count} files ({}) of names and ids, more than a launch carries ({MAX_INPUT_FILES} files, {})",
                bytesize::ByteSize(bytes as u64),
                bytesize::ByteSize(MAX_INPUT_BYTES as u64)
            ));
        }
        let built = match problem {
            Some(problem) => Err((problem, false)),
            None => spec
                .stage_experiment(name, &nonce, |reference| {
                    values.get(&reference.text()).cloned()
                })
                .map(|experiment_spec| SubmitRequest {
                    spec_json: experiment_spec.to_canonical_json(),
                    program: None,
                    code_version: pipeline.record.code_version.clone(),
                    data_version: pipeline.record.data_version.clone(),
                    rerun: true,
                })
                .map_err(|error| (error.to_string(), false)),
        };
        let submitted = built.and_then(|request| {
            self.submit_experiment(now, &request)
                .map(|(experiment, _, _)| experiment)
                .map_err(|error| {
                    let temporary = error.is_temporary();
                    (format!("its experiment was refused: {error}"), temporary)
                })
        });
        match submitted {
            Ok(experiment) => {
                info!(pipeline = id, stage = name, %experiment, "pipeline stage released");
                self.pipelines
                    .stage_of
                    .insert(experiment, (id, name.to_owned()));
                let stage = self.pipelines.stage_mut(id, name);
                stage.state = StageState::Running;
                stage.reason = format!("experiment {experiment} runs");
                stage.experiment = Some(experiment);
                stage.identity = Some(identity);
                stage.inputs = inputs;
                stage.input_dirs = input_dirs;
                stage.started_at = Some(now);
            }
            Err((reason, true)) => {
                // Not the stage's fault and not for ever: it waits, saying why,
                // and a later pass submits it again.
                let reason = format!("waiting to be admitted: {reason}");
                if self.pipelines.stage(id, name).reason != reason {
                    info!(pipeline = id, stage = name, %reason, "pipeline stage waits to be admitted");
                    self.pipelines.stage_mut(id, name).reason = reason;
                }
                self.pipelines.deferred = true;
                return;
            }
            Err((reason, false)) => {
                warn!(pipeline = id, stage = name, %reason, "pipeline stage could not start");
                let stage = self.pipelines.stage_mut(id, name);
                stage.state = StageState::Failed;
                stage.reason = reason;
                stage.identity = Some(identity);
                stage.finished_at = Some(now);
            }
        }
        // The new experiment's trials are picked up by this same pass.
        self.pipelines.touched = true;
    }

    /// What a succeeded stage experiment produced: its best trial by the search
    /// metric (for several metrics, the front's trial that adds the most
    /// hypervolume; the first succeeded trial without one).
    fn stage_result(&self, experiment: ExperimentId) -> Option<StageResult> {
        let spec = &self.book.spec(experiment);
        let succeeded: Vec<_> = self
            .book
            .trials_of(experiment)
            .map(|(_, trial)| trial)
            .filter(|trial| trial.state == TrialState::Succeeded)
            .collect();
        let front_top = self
            .front_top(experiment)
            .and_then(|top| self.book.get_trial(top));
        let by_metric = front_top.or_else(|| {
            spec.search.metric.as_ref().and_then(|metric| {
                let scored = succeeded
                    .iter()
                    .filter_map(|trial| {
                        trial
                            .metrics
                            .get(metric.as_str())
                            .map(|value| (*value, *trial))
                    })
                    .filter(|(value, _)| value.is_finite());
                match spec.search.mode {
                    Mode::Max => scored.max_by(|a, b| a.0.total_cmp(&b.0)),
                    Mode::Min => scored.min_by(|a, b| a.0.total_cmp(&b.0)),
                }
                .map(|(_, trial)| trial)
            })
        });
        let best = by_metric.or_else(|| succeeded.first().copied())?;
        Some(StageResult {
            best_trial: Some(best.id),
            params_json: best.config_json.clone(),
            metrics: best
                .metrics
                .iter()
                .map(|(name, value)| (name.to_string(), *value))
                .collect(),
            outputs: best.outputs.clone(),
            checkpoint: best
                .checkpoints
                .last()
                .map(|checkpoint| checkpoint.files.clone())
                .unwrap_or_default(),
        })
    }

    /// Stage `name`'s cache identity; its needs all have results.
    fn stage_identity(&self, id: u64, name: &str) -> [u8; 32] {
        let pipeline = &self.pipelines.by_id[&id];
        stage_identity(
            &pipeline.spec.team,
            &pipeline.spec.stages[name],
            &pipeline.record.code_version,
            &pipeline.record.data_version,
            |need| {
                let stage = &pipeline.record.stages[need];
                (stage.identity, stage.result.clone())
            },
        )
    }

    /// The upstream directories a trial of `experiment` gets, with the nodes
    /// that hold their objects.
    pub(super) fn pipeline_inputs(&self, experiment: ExperimentId) -> Vec<LaunchInput> {
        let Some((id, name)) = self.pipelines.stage_of.get(&experiment) else {
            return Vec::new();
        };
        let Some(stage) = self
            .pipelines
            .by_id
            .get(id)
            .and_then(|pipeline| pipeline.record.stages.get(name))
            .filter(|stage| stage.experiment == Some(experiment))
        else {
            return Vec::new();
        };
        stage
            .input_dirs
            .iter()
            .map(|dir| LaunchInput {
                name: dir.name.clone(),
                marker: dir.marker.clone(),
                files: dir.files.clone(),
                sources: self.sources_of(dir.files.iter().map(|file| file.object)),
            })
            .collect()
    }

    /// Whether some node that is not lost holds each of `result`'s output files.
    fn outputs_live(&self, result: &StageResult) -> bool {
        result.outputs.iter().all(|file| {
            self.objects.directory().holders(file.object).any(|node| {
                self.membership
                    .node(node)
                    .is_some_and(|node| node.state != xp_runtime::protocol::NodeState::Lost)
            })
        })
    }

    /// Whether `experiment` is a pipeline stage's (its rank 0's outputs are kept).
    pub(super) fn is_stage_experiment(&self, experiment: ExperimentId) -> bool {
        self.pipelines.stage_of.contains_key(&experiment)
    }

    /// The priority boost of a trial: 1 when its stage is on a critical path.
    pub(super) fn pipeline_urgency(&self, trial: TrialId) -> u32 {
        u32::from(self.pipelines.is_critical(trial.experiment))
    }
}

/// The identity of `stage` given the versions and, per need, its identity and
/// result (`upstream`). Domain-separated and length-prefixed, like
/// `identity::experiment_content_hash`.
pub(super) fn stage_identity(
    team: &str,
    stage: &StageSpec,
    code_version: &str,
    data_version: &str,
    upstream: impl Fn(&str) -> (Option<[u8; 32]>, Option<StageResult>),
) -> [u8; 32] {
    let mut own = stage.clone();
    // When it is expected to end changes nothing it computes.
    own.estimate = None;
    // Where the submitter's copy of the code lies is not what it computes.
    own.trial.command_dir = None;
    let own = serde_json::to_string(&own).expect("a stage spec serialises");
    let mut hasher = blake3::Hasher::new_derive_key("xp pipeline stage identity v2");
    let mut part = |bytes: &[u8]| {
        hasher.update(&(bytes.len() as u64).to_le_bytes());
        hasher.update(bytes);
    };
    // A team reuses only its own stages: code and data versions are what the
    // client claims, so another team's outputs must never stand in for them.
    part(team.as_bytes());
    part(own.as_bytes());
    part(code_version.as_bytes());
    part(data_version.as_bytes());
    let mut needs = stage.needs.clone();
    needs.sort();
    for need in needs {
        let (identity, result) = upstream(&need);
        part(need.as_bytes());
        part(&identity.unwrap_or_default());
        let result = result.map(|result| {
            let files = |files: &[xp_runtime::protocol::CheckpointFile]| -> Vec<(String, String)> {
                files
                    .iter()
                    .map(|file| (file.name.clone(), file.object.to_string()))
                    .collect()
            };
            serde_json::json!({
                "params": result.params_json,
                "outputs": files(&result.outputs),
                "checkpoint": files(&result.checkpoint),
            })
            .to_string()
        });
        part(result.unwrap_or_default().as_bytes());
    }
    *hasher.finalize().as_bytes()
}
