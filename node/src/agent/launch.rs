//! The agent's worker tasks: starting one for a launch the core admitted,
//! sending it a stop, forgetting it once its end was reported, and waiting for
//! all of them when the node leaves.
//!
//! Each task prepares its launch (`prepare`) and then supervises the worker
//! process (`worker::supervise`) until it ends, reporting on the agent's
//! report channel; a launch that cannot be prepared is reported `Refused` (not
//! the trial's fault) or `LaunchFailed`.
//!
//! Not here: which launches start and which workers stop (the core decides).

use std::time::Instant;

use tokio::sync::oneshot;
use tokio::task::JoinHandle;
use tracing::warn;
use xp_runtime::ids::WorkerKey;
use xp_runtime::protocol::{Launch, ObjectCapability, WorkerReport};

use super::prepare::{LaunchObjects, PrepareError, resolve_command};
use super::{Agent, AgentError};
use crate::checkpoint::CheckpointSources;
use crate::worker::{self, StopRequest};

/// A worker task the agent started.
pub(super) struct RunningWorker {
    /// Takes the one stop request the worker may get.
    stop: Option<oneshot::Sender<StopRequest>>,
    task: JoinHandle<()>,
}

impl Agent {
    /// Starts the task that prepares and runs `launch`'s worker.
    pub(super) fn start_worker(&mut self, launch: Launch) {
        let key = launch.key;
        if let Some(capability) = &launch.object_capability {
            self.objects
                .access
                .hold_worker(key, ObjectCapability::clone(capability));
        }
        let (stop_tx, stop_rx) = oneshot::channel();
        let reports = self.reports_tx.clone();
        let data_dir = self.config.data_dir.clone();
        let log_cap = self.config.log_cap;
        let telemetry = self.telemetry_targets.clone();
        let node_draining = self.node_draining.clone();
        let connection = self
            .session
            .as_ref()
            .map(|session| session.connection.clone());
        let advertise_host = self.config.identity.advertise_host.clone();
        let objects = self.launch_objects();
        let task = xp_runtime::task::spawn("worker", async move {
            let command = match connection {
                Some(connection) => {
                    resolve_command(&data_dir, &advertise_host, &connection, &launch, &objects)
                        .await
                }
                None => Err(PrepareError::Refused(
                    "the session with the head ended before the worker started".to_owned(),
                )),
            };
            match command {
                Ok(command) => {
                    worker::supervise(
                        launch,
                        command,
                        log_cap,
                        reports,
                        stop_rx,
                        telemetry,
                        node_draining,
                    )
                    .await;
                }
                Err(PrepareError::Refused(reason)) => {
                    warn!(worker = %key, %reason, "worker could not be prepared");
                    let _ = reports.send(WorkerReport::Refused { key, reason });
                }
                Err(PrepareError::Invalid(error)) => {
                    warn!(worker = %key, %error, "worker could not be prepared");
                    let _ = reports.send(WorkerReport::LaunchFailed { key, error });
                }
            }
        });
        self.workers.insert(
            key,
            RunningWorker {
                stop: Some(stop_tx),
                task,
            },
        );
    }

    /// What preparing a launch needs of the node's objects and settings.
    fn launch_objects(&self) -> LaunchObjects {
        LaunchObjects {
            checkpoints: CheckpointSources {
                store: self.objects.store.clone(),
                fetcher: self.objects.fetcher.clone(),
                changes: self.objects.changes_tx.clone(),
                own_node: self.config.identity.node_id,
            },
            backup: self.objects.backup.clone(),
            local_workers: self.objects.local_workers.clone(),
            socket: self.objects.socket.clone(),
            uids: self.config.isolation.uids().cloned(),
            ports: self.config.isolation.ports().cloned(),
            output_limits: self.config.output_limits,
        }
    }

    /// Sends `request` to worker `key`.
    pub(super) fn stop_worker(&mut self, key: WorkerKey, request: StopRequest) {
        if let Some(stop) = self
            .workers
            .get_mut(&key)
            .and_then(|worker| worker.stop.take())
        {
            let _ = stop.send(request);
        }
    }

    /// Forgets worker `key`, whose end was reported: its task and its pass to
    /// the local object channel.
    pub(super) fn forget_worker(&mut self, key: WorkerKey) {
        self.workers.remove(&key);
        self.objects.access.forget_worker(key);
        self.objects
            .local_workers
            .retain(|_, worker| worker.key != key);
    }

    /// Leaves: drops a connection attempt under way and waits for every worker
    /// task until `deadline`; a task still running then is aborted (which
    /// SIGKILLs its process). `refused`: the head refused this node.
    pub(super) async fn leave(
        &mut self,
        deadline: Instant,
        refused: bool,
    ) -> Result<(), AgentError> {
        self.connecting = None;
        self.close_session(None).await;
        let deadline = tokio::time::Instant::from_std(deadline);
        for (key, mut worker) in self.workers.drain() {
            if tokio::time::timeout_at(deadline, &mut worker.task)
                .await
                .is_err()
            {
                warn!(worker = %key, "worker did not stop before the drain deadline; killing it");
                worker.task.abort();
            }
        }
        match (refused, self.last_connect_error.take()) {
            (true, Some(error)) => Err(AgentError::Refused(error)),
            _ => Ok(()),
        }
    }
}
