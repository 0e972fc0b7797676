//! Node membership: registration (and reconciling what a returning node still
//! runs), messages on a node's session, and heartbeat timeouts.
//!
//! A node executes and reports; the head decides. This module records what nodes
//! say, marks silent ones lost, and tells the policy core which nodes it may place
//! on. It does not place work or judge worker reports (see `reports`).
//!
//! Invariant: a node judged lost is asked to register again before anything it
//! sends counts, so that whatever it still runs is reconciled first.
//!
//! After a restart the head does not judge a node it knew by the node timeout
//! alone: the node must first notice that its old session is dead and reconnect,
//! which can take `CoreConfig::node_return_ms`. Until the node registers, it has
//! `CoreConfig::restart_grace_ms` (that return time plus the node timeout) from
//! the head's start, so the work it finished or still runs while the head was
//! away is reconciled from its registration and resent reports, not lost.

use std::collections::BTreeSet;

use tracing::{info, warn};
use xp_runtime::clock::UnixMillis;
use xp_runtime::ids::{NodeId, WorkerKey};
use xp_runtime::protocol::{HeadCommand, NodeMessage, NodeRegistration, NodeState};
use xp_sched::NodeSpec;

use super::{HeadCore, NodeRecord};
use crate::state::SilenceLimits;

impl HeadCore {
    /// A node (re)connected: record it, reconcile what it still runs, and schedule.
    pub fn handle_node_register(&mut self, now: UnixMillis, registration: NodeRegistration) {
        let node_id = registration.node_id;
        let returning = self.membership.register(now, &registration);
        info!(%node_id, name = %registration.name, gpus = registration.resources.gpus.len(), returning, "node registered");
        let record = self.membership.node(node_id).expect("just registered");
        self.placement.policy_mut().upsert_node(node_spec(record));
        self.objects.node_registered(
            node_id,
            registration.objects,
            registration.held_objects.iter().map(|held| held.id),
        );
        self.reconcile_objects(node_id, &registration.held_objects);
        self.placement.set_schedulable(node_id, true);
        self.outbox.send(
            node_id,
            HeadCommand::Registered {
                heartbeat_interval_ms: self.config.heartbeat_interval_ms,
            },
        );
        // Before any launch: the quotas and every revocation in force.
        self.send_object_rules(now, node_id);
        let still_running: BTreeSet<WorkerKey> = registration.running.into_iter().collect();
        // Workers the head placed here that the node no longer knows: their launch or
        // their process was lost with the old connection.
        let vanished: Vec<WorkerKey> = self
            .live_workers_on(node_id)
            .into_iter()
            .filter(|key| !still_running.contains(key))
            .collect();
        for key in vanished {
            self.lose_worker(
                now,
                key,
                format!("node {node_id} no longer runs rank {}", key.rank),
            );
        }
        self.renew_on_registration(now, node_id, &still_running);
        // Workers the node runs that belong to no live attempt must stop.
        for key in still_running {
            let live = self.worker(key).is_some_and(|(attempt, worker)| {
                attempt.is_live() && worker.state.holds_resources()
            });
            if !live {
                self.kill_on(
                    node_id,
                    key.trial,
                    key.attempt,
                    "stale worker found at node registration",
                );
            }
        }
        self.schedule(now);
    }

    /// A message on a node's session.
    pub fn handle_node_message(&mut self, now: UnixMillis, node_id: NodeId, message: NodeMessage) {
        let Some(state) = self.membership.heard_from(now, node_id) else {
            warn!(%node_id, "message from an unregistered node ignored");
            return;
        };
        if state == NodeState::Lost {
            // Its work was already rescheduled; make it register again so that what it
            // still runs is reconciled (killed) and it becomes schedulable again.
            self.outbox.send(
                node_id,
                HeadCommand::Reconnect {
                    reason: "the head had given this node up as lost".to_owned(),
                },
            );
            return;
        }
        match message {
            NodeMessage::Register(_) => warn!(%node_id, "duplicate registration ignored"),
            NodeMessage::Heartbeat | NodeMessage::Logs { .. } => {}
            NodeMessage::Draining => {
                info!(%node_id, "node draining: nothing more is placed on it");
                self.membership.set_draining(node_id);
                self.placement.set_schedulable(node_id, false);
            }
            NodeMessage::Report { report, at, .. } => {
                // What happened while the head was away keeps its time; a
                // node's clock ahead of the head's is not believed.
                self.handle_report(at.min(now), node_id, report);
                self.schedule(now);
            }
            NodeMessage::Objects { added, dropped } => {
                for id in added {
                    self.objects.node_holds(node_id, id);
                }
                for id in dropped {
                    self.objects.node_dropped(node_id, id);
                }
            }
            NodeMessage::ReplicationFailed {
                trial,
                objects,
                error,
            } => self.handle_replication_failed(now, node_id, trial, &objects, &error),
            NodeMessage::Telemetry(telemetry) => self.handle_telemetry(now, node_id, telemetry),
            NodeMessage::ObjectAccess(report) => self.handle_object_access(node_id, report),
        }
    }

    /// `node_id`'s session last read a frame at `heard_at`, as its shell saw
    /// it (not when the core got to its messages, which a busy head delays):
    /// a sign of life, and a trouble for its gangs when older than half the
    /// node timeout.
    pub fn handle_node_heard(&mut self, now: UnixMillis, node_id: NodeId, heard_at: UnixMillis) {
        let suspect_after_ms = self.config.node_timeout_ms / 2;
        self.membership
            .session_heard(node_id, heard_at, now, suspect_after_ms);
    }

    /// The head did not run for `paused_ms` until `now` (stopped, or starved
    /// of CPU): it heard nobody meanwhile, so no node is judged lost for that
    /// silence; each node's silence is counted from now.
    pub fn handle_head_paused(&mut self, now: UnixMillis, paused_ms: u64) {
        warn!(
            paused_ms,
            "the head did not run for a while; node silence is counted from now"
        );
        self.membership.excuse_pause(now);
    }

    /// Marks nodes lost whose heartbeats stopped, and reschedules their work.
    pub fn handle_tick(&mut self, now: UnixMillis) {
        let limits = SilenceLimits {
            node_timeout_ms: self.config.node_timeout_ms,
            restart_grace_ms: self.config.restart_grace_ms(),
        };
        for silent in self.membership.take_silent(now, limits) {
            let (node_id, timeout_ms) = (silent.node, silent.limit_ms);
            if silent.never_returned {
                warn!(%node_id, timeout_ms, "node lost: it did not come back after the head restarted");
            } else {
                warn!(%node_id, timeout_ms, "node lost: no heartbeat within the timeout");
            }
            self.mark_lost(now, node_id, "lost");
        }
        // After the losses: an exit held while its peer's node was silent
        // finds that node lost.
        self.decide_held_exits(now);
        self.enforce_time_limits(now);
        self.tick_alerts(now);
        self.tend_replications(now);
        self.renew_capabilities(now);
        self.tell_revocations();
        self.histories.forget_unread(now);
        // Time alone changes decisions: aging, reservations, minimum run times.
        self.placement.mark_stale();
        self.schedule(now);
    }

    /// A draining node's session closed: it left on purpose (its Slurm job
    /// ended, an operator stopped it) once its workers were stopped, so it is
    /// marked lost now rather than after the heartbeat timeout, and no resumed
    /// attempt is pointed at its copies of checkpoints. A node that is not
    /// draining may only have lost its connection: the timeout judges it, and
    /// the closed session is a trouble its gangs' failed exits are judged by.
    pub fn handle_node_left(&mut self, now: UnixMillis, node_id: NodeId) {
        if self
            .membership
            .node(node_id)
            .is_none_or(|node| node.state != NodeState::Draining)
        {
            self.membership.session_closed(node_id, now);
            return;
        }
        info!(%node_id, "node left after draining");
        self.mark_lost(now, node_id, "left");
        self.schedule(now);
    }

    /// Marks `node_id` lost (it was up until its last sign of life), takes it
    /// out of placement and requeues what still ran there.
    fn mark_lost(&mut self, now: UnixMillis, node_id: NodeId, why: &str) {
        self.membership.set_lost(node_id);
        self.placement.set_schedulable(node_id, false);
        for key in self.live_workers_on(node_id) {
            self.lose_worker(now, key, format!("node {node_id} {why}"));
        }
    }

    /// The workers placed on `node_id` that still hold their resources.
    pub(super) fn live_workers_on(&self, node_id: NodeId) -> Vec<WorkerKey> {
        let mut keys = Vec::new();
        for trial in self.book.active_trials() {
            for attempt in &trial.attempts {
                for worker in &attempt.workers {
                    if worker.node == node_id && worker.state.holds_resources() {
                        keys.push(WorkerKey {
                            trial: trial.id,
                            attempt: attempt.number,
                            rank: worker.rank,
                        });
                    }
                }
            }
        }
        keys
    }
}

/// A node as the policy core sees it.
pub(super) fn node_spec(node: &NodeRecord) -> NodeSpec {
    NodeSpec {
        id: node.id,
        gpus: node.resources.gpus.len() as u32,
        gpu_model: node
            .resources
            .gpus
            .first()
            .map(|gpu| gpu.model.clone())
            .filter(|model| model != "declared"),
        cpu_milli: u64::from(node.resources.cpu_milli),
        memory_bytes: node.resources.memory_bytes,
        labels: node.labels.clone(),
    }
}
