//! The head actor: the one owner of [`HeadCore`] and the [`Registry`].
//!
//! Every request and node report becomes a message; the actor feeds it to the
//! core, commits the records the core produced, and only then replies, sends
//! node commands and acknowledges node reports. If a commit fails (a full disk),
//! nothing is acknowledged and the records are retried on the next message.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use dashmap::DashMap;
use ractor::{Actor, ActorProcessingErr, ActorRef, RpcReplyPort};
use tokio::sync::{mpsc, oneshot, watch};
use tracing::{error, warn};
use xp_runtime::clock::Clock;
use xp_runtime::ids::{ExperimentId, NodeId, TrialId, WorkerKey};
use xp_runtime::protocol::{
    AdminRequest, ErrorCode, HeadCommand, LogChunk, LogRequest, MetricPoint, NodeMessage,
    NodeRegistration, RemoteError, Response, SubmitRequest, TrialEvent,
};

use crate::core::{HeadCore, Record};
use crate::registry::Registry;

/// How often the actor checks node heartbeats.
const TICK: Duration = Duration::from_millis(250);

/// A reply port carrying a wire-ready result.
pub type Reply<T> = RpcReplyPort<Result<T, RemoteError>>;

/// What a connected node's session offers the rest of the head.
#[derive(Debug, Clone)]
pub struct NodeSessionHandle {
    /// Distinguishes this session from a later one of the same node.
    pub session_id: u64,
    /// Commands to write on the node's session stream.
    pub commands: mpsc::UnboundedSender<HeadCommand>,
    /// Log reads waiting for the node's answer, by request id.
    pub pending_logs: Arc<DashMap<u64, oneshot::Sender<Result<LogChunk, RemoteError>>>>,
}

/// Connected node sessions, shared by the server tasks and the actor.
pub type Sessions = Arc<DashMap<NodeId, NodeSessionHandle>>;

/// The head actor's messages.
#[derive(Debug)]
pub enum HeadMsg {
    /// A client submits an experiment.
    Submit(SubmitRequest, Reply<Response>),
    /// A client asks for experiments.
    Status(Option<String>, Reply<Response>),
    /// A client cancels an experiment or a trial.
    Cancel(String, Reply<Response>),
    /// A client lists nodes.
    Nodes(Reply<Response>),
    /// A client asks where a worker's log lives.
    LocateWorker(LogRequest, Reply<(NodeId, WorkerKey, bool)>),
    /// A client asks for events.
    Events(ExperimentId, u64, Reply<Vec<TrialEvent>>),
    /// A client asks for a trial's metric history.
    Metrics(TrialId, Reply<Vec<MetricPoint>>),
    /// A client lists the scheduling queues.
    Queues(Reply<Response>),
    /// A client lists an experiment's checkpoints.
    Checkpoints(String, Reply<Response>),
    /// A driver asks where to store objects.
    StoreTargets(String, Reply<Response>),
    /// A driver that stored objects went away.
    DriverGone(String),
    /// A node asks which nodes hold an object.
    Locate(xp_runtime::ids::ObjectId, Reply<Response>),
    /// An admin arbitrates.
    Admin(AdminRequest, Reply<Response>),
    /// A node registered on a new session.
    NodeRegistered(NodeRegistration, Reply<()>),
    /// A message arrived on a node's session.
    FromNode(NodeId, NodeMessage, Reply<()>),
    /// A node's session ended.
    NodeDisconnected(NodeId, u64),
    /// Time passed.
    Tick,
}

/// The head actor (behaviour only; the state is [`HeadState`]).
#[derive(Debug)]
pub struct HeadActor;

/// What the head actor starts from.
pub struct HeadArgs {
    /// The core, restored from the registry.
    pub core: HeadCore,
    /// The registry.
    pub registry: Registry,
    /// Node sessions.
    pub sessions: Sessions,
    /// Published after every commit: the newest event's sequence number.
    pub event_seq: watch::Sender<u64>,
    /// The clock.
    pub clock: Arc<dyn Clock>,
}

/// The head actor's state.
pub struct HeadState {
    args: HeadArgs,
    unpersisted: Vec<Record>,
    unsent: Vec<(NodeId, HeadCommand)>,
    acks: BTreeMap<NodeId, u64>,
}

impl HeadState {
    /// Commits what the core produced, then sends commands and acknowledgements.
    fn flush(&mut self) -> Result<(), RemoteError> {
        self.unpersisted.extend(self.args.core.take_records());
        while let Some(command) = self.args.core.poll_command() {
            self.unsent.push(command);
        }
        let committed =
            tokio::task::block_in_place(|| self.args.registry.commit(&self.unpersisted));
        if let Err(commit_error) = committed {
            error!(error = %commit_error, pending = self.unpersisted.len(), "cannot persist head state; nothing is acknowledged until it succeeds");
            return Err(RemoteError::new(
                ErrorCode::Internal,
                format!("the head cannot persist state: {commit_error}"),
            ));
        }
        self.unpersisted.clear();
        for (node_id, command) in self.unsent.drain(..) {
            send_to_node(&self.args.sessions, node_id, command);
        }
        for (node_id, upto) in std::mem::take(&mut self.acks) {
            send_to_node(&self.args.sessions, node_id, HeadCommand::Ack { upto });
        }
        self.args
            .event_seq
            .send_replace(self.args.core.last_event_seq());
        Ok(())
    }

    fn reply<T>(&mut self, port: Reply<T>, result: Result<T, impl Into<RemoteError>>) {
        let flushed = self.flush();
        let _ = port.send(flushed.and(result.map_err(Into::into)));
    }
}

fn send_to_node(sessions: &Sessions, node_id: NodeId, command: HeadCommand) {
    let sender = sessions
        .get(&node_id)
        .map(|session| session.commands.clone());
    match sender {
        Some(sender) => {
            let _ = sender.send(command);
        }
        None => {
            warn!(%node_id, ?command, "node not connected; command dropped (reconciled when it returns)")
        }
    }
}

impl Actor for HeadActor {
    type Msg = HeadMsg;
    type State = HeadState;
    type Arguments = HeadArgs;

    async fn pre_start(
        &self,
        myself: ActorRef<HeadMsg>,
        args: HeadArgs,
    ) -> Result<HeadState, ActorProcessingErr> {
        myself.send_interval(TICK, || HeadMsg::Tick);
        Ok(HeadState {
            args,
            unpersisted: Vec::new(),
            unsent: Vec::new(),
            acks: BTreeMap::new(),
        })
    }

    async fn handle(
        &self,
        _myself: ActorRef<HeadMsg>,
        message: HeadMsg,
        state: &mut HeadState,
    ) -> Result<(), ActorProcessingErr> {
        let now = state.args.clock.now();
        match message {
            HeadMsg::Submit(request, reply) => {
                let result = state.args.core.handle_submit(now, &request).map(
                    |(experiment, reused, trials)| Response::Submitted {
                        experiment,
                        reused,
                        trials,
                    },
                );
                state.reply(reply, result);
            }
            HeadMsg::Status(filter, reply) => {
                let result = state
                    .args
                    .core
                    .status(filter.as_deref())
                    .map(Response::Status)
                    .map_err(RemoteError::from);
                let _ = reply.send(result);
            }
            HeadMsg::Cancel(id, reply) => {
                let result = state
                    .args
                    .core
                    .handle_cancel(now, &id)
                    .map(|trials| Response::Cancelled { trials });
                state.reply(reply, result);
            }
            HeadMsg::Nodes(reply) => {
                let _ = reply.send(Ok(Response::Nodes(state.args.core.nodes_status())));
            }
            HeadMsg::Queues(reply) => {
                let _ = reply.send(Ok(Response::Queues(state.args.core.queues())));
            }
            HeadMsg::StoreTargets(session, reply) => {
                let nodes = state.args.core.store_targets(&session);
                let _ = reply.send(Ok(Response::StoreTargets { session, nodes }));
            }
            HeadMsg::DriverGone(session) => {
                state.args.core.release_driver_objects(&session);
                let _ = state.flush();
            }
            HeadMsg::Locate(object, reply) => {
                let _ = reply.send(Ok(Response::Located(state.args.core.locate(object))));
            }
            HeadMsg::Checkpoints(experiment, reply) => {
                let result = state
                    .args
                    .core
                    .checkpoints(&experiment)
                    .map(Response::Checkpoints)
                    .map_err(RemoteError::from);
                let _ = reply.send(result);
            }
            HeadMsg::Admin(request, reply) => {
                let result = state
                    .args
                    .core
                    .handle_admin(now, request)
                    .map(|(trials, message)| Response::Admin { trials, message });
                state.reply(reply, result);
            }
            HeadMsg::LocateWorker(request, reply) => {
                let result = state.args.core.locate_worker(&request);
                let _ = reply.send(result.map_err(RemoteError::from));
            }
            HeadMsg::Events(experiment, after, reply) => {
                let result = state.args.core.events_after(experiment, after);
                let _ = reply.send(result.map_err(RemoteError::from));
            }
            HeadMsg::Metrics(trial, reply) => {
                let result = tokio::task::block_in_place(|| state.args.registry.metrics_of(trial))
                    .map(|records| {
                        records
                            .into_iter()
                            .map(|record| MetricPoint {
                                attempt: record.key.attempt,
                                rank: record.key.rank,
                                step: record.step,
                                values: record.values.into_iter().collect(),
                                at: record.at,
                            })
                            .collect()
                    })
                    .map_err(|error| RemoteError::new(ErrorCode::Internal, error.to_string()));
                let _ = reply.send(result);
            }
            HeadMsg::NodeRegistered(registration, reply) => {
                state.args.core.handle_node_register(now, registration);
                state.reply(reply, Ok::<_, RemoteError>(()));
            }
            HeadMsg::FromNode(node_id, message, reply) => {
                if let NodeMessage::Report { seq, .. } = &message {
                    let ack = state.acks.entry(node_id).or_default();
                    *ack = (*ack).max(*seq);
                }
                state.args.core.handle_node_message(now, node_id, message);
                // A failed commit is logged by flush; the node's report stays unacknowledged.
                let _ = state.flush();
                let _ = reply.send(Ok(()));
            }
            HeadMsg::NodeDisconnected(node_id, session_id) => {
                state
                    .args
                    .sessions
                    .remove_if(&node_id, |_, session| session.session_id == session_id);
            }
            HeadMsg::Tick => {
                state.args.core.handle_tick(now);
                let _ = state.flush();
            }
        }
        Ok(())
    }
}
