//! Submitting an experiment: expanding it into trials (with result reuse
//! across identical trials), for `xp submit` (`requests::submit`) and for
//! pipeline stages; and naming an experiment by id or prefix.
//!
//! Nothing here places work: a submission changes state and then lets
//! `schedule` run.
//!
//! Invariants: an experiment's id is a content hash of its spec (without its local
//! paths: the program and the command directory), code (and binary) and data versions plus a run number, so an
//! identical submission finds its newest run and reuses it unless asked to rerun
//! or that run was cancelled; a trial reuses a finished result only when its trial
//! identity (team, template, config, code, data) matches a trial that succeeded
//! by running, and its experiment did not ask to rerun: never another team's.

use tracing::info;
use xp_runtime::clock::UnixMillis;
use xp_runtime::identity::experiment_content_hash;
use xp_runtime::ids::{ExperimentId, TrialId};
use xp_runtime::protocol::{ExperimentState, SubmitRequest, TrialState};
use xp_runtime::spec::ExperimentSpec;
use xp_tune::search::plan_trials;

use super::error::MAX_VERSION_BYTES;
use super::{CoreError, ExperimentRecord, HeadCore, TrialRecord};
use crate::shared_text;
use crate::sweep::Sweep;

/// Refuses a submission whose program does not fit its trials (`entry`
/// trials need the driver binary, command trials take none) or whose versions
/// are too long to keep.
fn check_submission(spec: &ExperimentSpec, request: &SubmitRequest) -> Result<(), CoreError> {
    if spec.trial.entry.is_some() && request.program.is_none() {
        return Err(CoreError::EntryWithoutBinary);
    }
    if let Some(program) = request.program
        && spec.trial.entry.is_none()
    {
        return Err(CoreError::BinaryForCommandTrial { program });
    }
    if request.code_version.len() > MAX_VERSION_BYTES
        || request.data_version.len() > MAX_VERSION_BYTES
    {
        return Err(CoreError::VersionTooLong);
    }
    Ok(())
}

/// The experiment's identity: its config without its local paths, the
/// code version (with the binary's hash for `entry` trials) and the data version.
fn content_hash(spec: &ExperimentSpec, request: &SubmitRequest) -> [u8; 32] {
    let mut identity_spec = spec.clone();
    identity_spec.trial.program = None;
    identity_spec.trial.command_dir = None;
    let code_identity = match request.program {
        Some(program) => format!("{}|binary:{program}", request.code_version),
        None => request.code_version.clone(),
    };
    experiment_content_hash(
        &identity_spec.to_canonical_json(),
        &code_identity,
        &request.data_version,
    )
}

impl HeadCore {
    /// Creates an experiment and its trials, or finds an identical one, without
    /// the scheduling pass (`handle_submit` runs one; pipelines submit stages
    /// from inside one).
    pub(super) fn submit_experiment(
        &mut self,
        now: UnixMillis,
        request: &SubmitRequest,
    ) -> Result<(ExperimentId, bool, u32), CoreError> {
        let spec = ExperimentSpec::from_json(&request.spec_json)?;
        check_submission(&spec, request)?;
        self.admit(&spec)?;
        self.check_capacity(&spec)?;
        self.check_leases(&spec)?;
        let content_hash = content_hash(&spec, request);
        let latest = self
            .book
            .experiments()
            .filter(|experiment| experiment.content_hash == content_hash)
            .max_by_key(|experiment| experiment.id.run);
        // An identical experiment still running, or succeeded with no trial
        // failed or cancelled, is the answer; any other runs again, its
        // succeeded trials reused (unless `rerun`) and the rest run anew.
        if let Some(latest) = latest {
            let state = self.experiment_state(latest.id);
            let unfinished_work = self.book.trials_of(latest.id).any(|(_, trial)| {
                matches!(trial.state, TrialState::Failed | TrialState::Cancelled)
            });
            let done = state == ExperimentState::Succeeded && !unfinished_work;
            if !request.rerun && (state == ExperimentState::Running || done) {
                let trials = self.book.trials_of(latest.id).count() as u32;
                info!(experiment_id = %latest.id, state = state.as_str(), "identical experiment submitted; reusing it");
                return Ok((latest.id, state != ExperimentState::Running, trials));
            }
        }
        let run = latest.map_or(1, |experiment| experiment.id.run + 1);
        let id = ExperimentId::from_content_hash(&content_hash, run);
        self.sweep_state.start(id, &spec)?;
        let record = ExperimentRecord {
            id,
            content_hash,
            spec_json: spec.to_canonical_json(),
            program: request.program,
            code_version: request.code_version.clone(),
            data_version: request.data_version.clone(),
            submitted_at: now,
            cancelled: false,
            rerun: request.rerun,
            sweep_log: Vec::new(),
        };
        self.book.add_experiment(record, spec);
        let planned = self.create_trials(now, id);
        info!(experiment_id = %id, name = %self.book.spec(id).name, trials = planned, "experiment submitted");
        Ok((id, false, planned))
    }

    /// Creates a new experiment's first trials: every planned one, or an
    /// adaptive sweep's first suggestions. Returns how many trials it plans.
    fn create_trials(&mut self, now: UnixMillis, id: ExperimentId) -> u32 {
        let search = &self.book.spec(id).search;
        if Sweep::is_adaptive(search) {
            self.fill_sweep(now, id);
            return self.book.spec(id).trial_count() as u32;
        }
        for (index, plan) in plan_trials(search).iter().enumerate() {
            self.create_trial(now, id, index as u32, plan.config_json(), plan.seed);
        }
        self.book.trials_of(id).count() as u32
    }

    /// Creates trial `index` of `experiment`, or, unless the experiment asked to
    /// rerun, a trial that reuses the result of an identical finished trial.
    pub(super) fn create_trial(
        &mut self,
        now: UnixMillis,
        experiment: ExperimentId,
        index: u32,
        config_json: String,
        seed: u64,
    ) {
        let trial_id = TrialId { experiment, index };
        let identity = self.trial_identity(experiment, &config_json);
        let source = (!self.book.experiment(experiment).rerun)
            .then(|| self.book.reusable(&identity))
            .flatten()
            .and_then(|source| self.book.get_trial(source));
        let mut record = TrialRecord {
            id: trial_id,
            config_json,
            seed,
            state: TrialState::Pending,
            attempts: Default::default(),
            failures: 0,
            metrics: Default::default(),
            last_step: None,
            reason: None,
            queued_at: now,
            reused_from: None,
            requeues: 0,
            preemptions: 0,
            checkpoints: Vec::new(),
            held: false,
            priority_override: None,
            queue_override: None,
            outputs: Vec::new(),
            created_at: Some(now),
            finished_at: None,
            waited: false,
            malformed_metrics: None,
        };
        let (state, reason) = match source {
            Some(source) => {
                record.metrics = source.metrics.clone();
                record.last_step = source.last_step;
                record.reused_from = Some(source.id);
                (
                    TrialState::Succeeded,
                    format!(
                        "reused the result of trial {} (same config, code and data)",
                        source.id
                    ),
                )
            }
            None => (TrialState::Pending, "submitted".to_owned()),
        };
        record.state = state;
        record.reason = Some(shared_text::shared(&reason));
        if state.is_terminal() {
            self.sweep_state.trial_finished(trial_id);
        }
        self.book.add_trial(record);
        self.push_event(now, trial_id, state, 0, reason);
    }

    /// What makes two trials the same work: the team, the trial template, the
    /// config, the code (and binary) and the data.
    ///
    /// A team reuses only its own results: code and data versions are what the
    /// client claims, so another team's trial must never stand in for them
    /// (nor show its id and metrics). The identity is never stored: the
    /// reusable successes are rebuilt from the stored experiments, which keep
    /// their team, and experiment ids (`content_hash`) do not involve it.
    pub(super) fn trial_identity(&self, experiment: ExperimentId, config_json: &str) -> [u8; 32] {
        let record = &self.book.experiment(experiment);
        let spec = self.book.spec(experiment);
        let mut template = spec.trial.clone();
        template.program = None;
        template.command_dir = None;
        let template = serde_json::to_string(&template).expect("a trial spec serialises");
        let code = match record.program {
            Some(program) => format!("{}|binary:{program}", record.code_version),
            None => record.code_version.clone(),
        };
        let mut hasher = blake3::Hasher::new_derive_key("xp trial identity v2");
        for part in [
            spec.team.as_str(),
            template.as_str(),
            config_json,
            code.as_str(),
            record.data_version.as_str(),
        ] {
            hasher.update(&(part.len() as u64).to_le_bytes());
            hasher.update(part.as_bytes());
        }
        *hasher.finalize().as_bytes()
    }

    /// The experiment an id or a unique prefix of one names, whoever owns it.
    pub(super) fn resolve_experiment(&self, text: &str) -> Result<ExperimentId, CoreError> {
        self.visible_experiment_named(text, &crate::auth::Visibility::All)
    }
}
