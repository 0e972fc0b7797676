//! Launching attempts: turning the policy core's placement of a gang into one
//! `Launch` per worker, with its program, its `MASTER_ADDR`/`MASTER_PORT`, its
//! collective token and the checkpoint it resumes from. `MASTER_ADDR` is the
//! address rank 0's node advertised when it registered (the local address of its
//! route to the head unless it was given `--advertise`), never its host name.
//!
//! The ports come from the placement sub-state (`state::MasterPorts`). This
//! module does not decide where a trial runs (the policy core did), and does not
//! follow the attempt once launched (see `attempts` and `reports`).
//!
//! Invariant: every worker of one attempt gets the same collective token,
//! derived from the head's rendezvous key and the attempt.

use std::collections::{BTreeMap, BTreeSet};

use tracing::{debug, warn};
use xp_runtime::clock::UnixMillis;
use xp_runtime::ids::{ExperimentId, NodeId, TrialId, WorkerKey};
use xp_runtime::protocol::{FetchPath, HeadCommand, Launch, Program, ResumeFrom, TrialState};
use xp_runtime::spec::{CollectiveTransport, ExperimentSpec, RenderError, render_arg};
use xp_sched::{GPU_MILLI, WorkerPlacement};

use super::{AttemptRecord, HeadCore, TrialRecord, WorkerRecord, WorkerState, Workers};
use crate::shared_text;

/// Why a trial cannot be handed to the policy core or launched: its spec and the
/// head's state disagree. The trial fails with this as its reason.
#[derive(Debug, thiserror::Error)]
pub(super) enum LaunchError {
    /// An `entry` trial's experiment has no driver binary.
    #[error("entry trial without a binary")]
    MissingBinary {
        /// The experiment.
        experiment_id: ExperimentId,
    },
    /// The trial's stored configuration is not a JSON object.
    #[error("stored config is corrupt: {error}")]
    CorruptConfig {
        /// The trial.
        trial_id: TrialId,
        /// What the JSON parser said.
        error: serde_json::Error,
    },
    /// The trial template names neither a command nor an entry.
    #[error("trial has neither command nor entry")]
    NoProgram {
        /// The experiment.
        experiment_id: ExperimentId,
    },
    /// A command argument names a placeholder the trial has no value for.
    #[error(transparent)]
    Render(#[from] RenderError),
    /// The experiment asks for a priority class the policy does not define.
    #[error("priority class {class:?} is not in the policy (it has: {})", .known.join(", "))]
    UnknownPriorityClass {
        /// The class asked for.
        class: String,
        /// The classes the policy defines.
        known: Vec<String>,
    },
}

impl HeadCore {
    /// A gang placed but not launched waits again. Usually the trial is already
    /// `Queued`; a resized gang relaunching is still `Preempting` and must become
    /// `Queued` too, or the head would hold it `Preempting` with no attempt while
    /// the policy has it waiting, and settling would drop it.
    fn requeue_unlaunched(&mut self, now: UnixMillis, trial_id: TrialId, why: &str) {
        self.placement.requeue(trial_id, now);
        if self.book.trial(trial_id).state != TrialState::Queued {
            self.transition(now, trial_id, TrialState::Queued, why.to_owned());
        }
    }

    /// Starts the gang the policy core placed: one worker per placement, in rank order.
    pub(super) fn launch(&mut self, now: UnixMillis, trial_id: TrialId, slots: &[WorkerPlacement]) {
        let Some(first) = slots.first() else {
            return;
        };
        if self.awaiting_newest_checkpoint(now, trial_id) {
            debug!(%trial_id, "waiting for nodes to return with the newest checkpoint");
            self.requeue_unlaunched(
                now,
                trial_id,
                "waits for the node holding its newest checkpoint",
            );
            return;
        }
        let master_host = shared_text::shared(
            &self
                .membership
                .node(first.node)
                .expect("the policy places only on known nodes")
                .address,
        );
        let Some(master_port) = self.placement.master_ports().reserve(&master_host) else {
            if self.placement.master_ports().note_exhausted(&master_host) {
                warn!(host = %master_host, "no free MASTER_PORT left on this host; its trials wait until one is given back");
            }
            self.requeue_unlaunched(now, trial_id, "no free MASTER_PORT on its first node");
            return;
        };
        let number = self.book.trial(trial_id).attempts.len() as u32 + 1;
        let workers = self.worker_records(slots);
        let resume = self.resume_point(trial_id);
        let launches = match self.worker_launches(
            trial_id,
            number,
            &workers,
            &master_host,
            master_port,
            resume.as_ref(),
        ) {
            Ok(launches) => launches,
            Err(error) => {
                self.placement
                    .master_ports()
                    .release(&master_host, master_port);
                self.transition(now, trial_id, TrialState::Failed, error.to_string());
                return;
            }
        };
        let nodes: BTreeSet<String> = workers
            .iter()
            .map(|worker| worker.node.to_string())
            .collect();
        let attempt = AttemptRecord {
            number,
            workers,
            master_host,
            master_port,
            placed_at: now,
            running_at: None,
            ended_at: None,
            outcome: None,
            resumed_from: resume.as_ref().map(|resume| (resume.step, resume.attempt)),
            resumed_checkpoint_at: None,
        };
        self.record_attempt(trial_id, attempt);
        self.send_launches(now, trial_id, number, launches);
        let nodes: Vec<String> = nodes.into_iter().collect();
        let resuming = resume.map_or_else(String::new, |resume| {
            format!(
                ", resuming from the checkpoint at step {} (attempt {})",
                resume.step, resume.attempt
            )
        });
        self.transition(
            now,
            trial_id,
            TrialState::Placed,
            format!("attempt {number} placed on {}{resuming}", nodes.join(",")),
        );
    }

    /// Sends each worker of attempt `number` its launch, every one carrying
    /// the attempt's capability on the object plane, issued at `now`.
    fn send_launches(
        &mut self,
        now: UnixMillis,
        trial_id: TrialId,
        number: u32,
        launches: Vec<(NodeId, Launch)>,
    ) {
        let capability = Box::new(self.attempt_capability(now, trial_id, number));
        for (node, mut launch) in launches {
            launch.object_capability = Some(capability.clone());
            self.outbox
                .send(node, HeadCommand::Launch(Box::new(launch)));
        }
    }

    /// Adds a new attempt to its trial, with when the checkpoint it resumes
    /// from was taken.
    fn record_attempt(&mut self, trial_id: TrialId, mut attempt: AttemptRecord) {
        let trial = self.book.trial_mut(trial_id).expect("trial exists");
        attempt.resumed_checkpoint_at = attempt.resumed_from.and_then(|(step, number)| {
            trial
                .checkpoints
                .iter()
                .find(|checkpoint| checkpoint.attempt == number && checkpoint.step == step)
                .map(|checkpoint| checkpoint.at)
        });
        trial.attempts.push(attempt);
    }

    /// The workers of a new attempt, one per placement in rank order, holding what
    /// the policy core gave them.
    fn worker_records(&self, slots: &[WorkerPlacement]) -> Workers {
        slots
            .iter()
            .enumerate()
            .map(|(rank, slot)| {
                // The pool numbers a node's GPUs 0..n; the node names them by device index.
                let devices = &self
                    .membership
                    .node(slot.node)
                    .expect("the policy places only on known nodes")
                    .resources
                    .gpus;
                WorkerRecord {
                    rank: rank as u32,
                    node: slot.node,
                    gpu_indices: slot
                        .gpus
                        .iter()
                        .map(|share| {
                            devices
                                .get(share.index as usize)
                                .map_or(share.index, |gpu| gpu.index)
                        })
                        .collect(),
                    gpu_milli: slot
                        .gpus
                        .first()
                        .map_or(GPU_MILLI as u32, |share| share.milli),
                    cpu_milli: u32::try_from(slot.cpu_milli).unwrap_or(u32::MAX),
                    memory_bytes: slot.memory_bytes,
                    state: WorkerState::Assigned,
                    last_metric_index: None,
                }
            })
            .collect()
    }

    /// One `Launch` per worker of attempt `number`, with the node to send it
    /// to (without the attempt's object capability, which `launch` adds).
    fn worker_launches(
        &self,
        trial_id: TrialId,
        number: u32,
        workers: &[WorkerRecord],
        master_host: &str,
        master_port: u16,
        resume: Option<&ResumeFrom>,
    ) -> Result<Vec<(NodeId, Launch)>, LaunchError> {
        let spec = &self.book.spec(trial_id.experiment);
        // A gang on one machine talks through shared memory whatever the spec says.
        let one_machine = workers.iter().all(|worker| worker.node == workers[0].node);
        let gang_transport = if one_machine {
            CollectiveTransport::Shm
        } else {
            spec.trial.transport
        };
        let collective_token = *blake3::keyed_hash(
            &self.config.rendezvous_key,
            format!("{trial_id}/{number}").as_bytes(),
        )
        .as_bytes();
        let trial = &self.book.trial(trial_id);
        let mut launches = Vec::with_capacity(workers.len());
        let mut local_ranks: BTreeMap<NodeId, u32> = BTreeMap::new();
        for worker in workers {
            let local_rank = local_ranks.entry(worker.node).or_default();
            let key = WorkerKey {
                trial: trial_id,
                attempt: number,
                rank: worker.rank,
            };
            let (gpu_milli, oversubscription_milli) = self.share_and_factor(spec, worker.gpu_milli);
            launches.push((
                worker.node,
                Launch {
                    key,
                    world_size: workers.len() as u32,
                    local_rank: *local_rank,
                    program: self.program_for(trial, worker.rank)?,
                    config_json: trial.config_json.clone(),
                    seed: trial.seed,
                    gpu_indices: worker.gpu_indices.clone(),
                    gpu_milli,
                    master_addr: master_host.to_owned(),
                    master_port,
                    collective_token,
                    transport: gang_transport,
                    resume: resume.cloned(),
                    cpu_milli: worker.cpu_milli,
                    memory_bytes: worker.memory_bytes,
                    inputs: self.pipeline_inputs(trial.id.experiment),
                    collect_outputs: self.is_stage_experiment(trial.id.experiment),
                    oversubscription_milli,
                    object_capability: None,
                    command_dir: spec.trial.command_dir.clone(),
                    object_path: FetchPath::for_transport(spec.trial.transport),
                },
            ));
            *local_rank += 1;
        }
        Ok(launches)
    }

    /// What a worker holding `charge` thousandths of its GPU is told: its share
    /// and the oversubscription factor it was placed under (1000: none). An
    /// opted-in fraction holds its share over the factor the policy charged at
    /// submission (`oversubscribed_charge`); the factor sent is the policy's
    /// when it gives that charge, else (the policy changed since) the smallest
    /// factor that does, `ceil(share * 1000 / charge)`, so the node's slot
    /// table charges exactly what the policy core counts.
    fn share_and_factor(&self, spec: &ExperimentSpec, charge: u32) -> (u32, u32) {
        let share = u32::try_from(spec.trial.gpu_milli()).unwrap_or(u32::MAX);
        let whole = GPU_MILLI as u32;
        if !spec.trial.resources.oversubscribe || share == 0 || share >= whole || charge >= share {
            return (charge, whole);
        }
        let policy = u32::try_from(self.placement.policy().config().oversubscription_milli())
            .unwrap_or(whole);
        let charged = |factor: u32| {
            xp_sched::oversubscribed_charge(u64::from(share), u64::from(factor))
                == u64::from(charge)
        };
        let factor = if charged(policy) {
            policy
        } else {
            (share * 1000).div_ceil(charge.max(1))
        };
        (share, factor)
    }

    /// What rank `rank` of `trial` runs: the experiment's binary at its entry, or
    /// the command with its placeholders filled from the trial's config.
    fn program_for(&self, trial: &TrialRecord, rank: u32) -> Result<Program, LaunchError> {
        let experiment_id = trial.id.experiment;
        let experiment = &self.book.experiment(experiment_id);
        let spec = &self.book.spec(experiment_id);
        if let Some(entry) = &spec.trial.entry {
            let binary = experiment
                .program
                .ok_or(LaunchError::MissingBinary { experiment_id })?;
            return Ok(Program::Entry {
                binary,
                entry: entry.clone(),
            });
        }
        let config: serde_json::Map<String, serde_json::Value> =
            serde_json::from_str(&trial.config_json).map_err(|error| {
                LaunchError::CorruptConfig {
                    trial_id: trial.id,
                    error,
                }
            })?;
        let lookup = |name: &str| -> Option<String> {
            match name {
                "trial_id" => Some(trial.id.to_string()),
                "rank" => Some(rank.to_string()),
                _ => config.get(name).map(|value| match value {
                    serde_json::Value::String(text) => text.clone(),
                    other => other.to_string(),
                }),
            }
        };
        let argv = spec
            .trial
            .command
            .as_ref()
            .ok_or(LaunchError::NoProgram { experiment_id })?
            .iter()
            .map(|arg| render_arg(arg, lookup))
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Program::Command { argv })
    }
}
