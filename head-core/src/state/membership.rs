//! Node membership: the nodes the head knows, what each last said of itself,
//! the intervals it was up, and which of them a restarted head still waits for.
//!
//! Not here: what a registration reconciles (workers, objects) and telling the
//! policy core where it may place; `nodes` does those as steps over this and
//! the other sub-states. Judgements take the limits as arguments, so this
//! knows no configuration.
//!
//! Invariants: a node is judged lost only after a silence longer than its
//! limit (the node timeout, or the restart grace while the head waits for it
//! to come back); an up interval is open exactly while its node is not lost;
//! every change is handed out once for persisting (`take_records`).

use std::collections::BTreeSet;
use std::ops::Bound;

use xp_runtime::clock::UnixMillis;
use xp_runtime::ids::NodeId;
use xp_runtime::protocol::{NodeRegistration, NodeState};

use super::troubles::NodeTroubles;
use crate::{NodeRecord, Record, UpInterval};

/// How long a node may be silent before it is judged lost.
#[derive(Debug, Clone, Copy)]
pub(crate) struct SilenceLimits {
    /// For a node that registered with this head.
    pub(crate) node_timeout_ms: u64,
    /// For a node known from before a restart that has not registered since.
    pub(crate) restart_grace_ms: u64,
}

/// A node judged lost by silence.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Silent {
    /// The node.
    pub(crate) node: NodeId,
    /// The silence it was allowed.
    pub(crate) limit_ms: u64,
    /// It never came back after the head restarted.
    pub(crate) never_returned: bool,
}

/// At most this many up intervals are kept per node; the oldest go first.
pub(crate) const MAX_UP_INTERVALS: usize = 256;

/// The nodes the head knows.
#[derive(Debug, Default)]
pub(crate) struct Membership {
    /// A persistent map: a read off the actor copies it for a few reference
    /// counts (`nodes_copy`).
    nodes: imbl::OrdMap<NodeId, NodeRecord>,
    /// Nodes restored from the registry that have not registered with this head
    /// yet: judged by the restart grace, not the node timeout.
    awaiting_return: BTreeSet<NodeId>,
    /// When the restart grace began.
    grace_from: UnixMillis,
    /// What went wrong with each node lately, for judging gang faults.
    troubles: NodeTroubles,
    dirty: BTreeSet<NodeId>,
    /// Bumped whenever a node registers with resources the head did not know
    /// it to have: GPU-hours are priced by the models of the nodes they ran on.
    resources_revision: u64,
}

impl Membership {
    /// The nodes a restarted head knew, each heard from at `now` (the grace
    /// starts then); those not lost are awaited.
    pub(crate) fn restore(nodes: Vec<NodeRecord>, now: UnixMillis) -> Self {
        let mut membership = Self {
            grace_from: now,
            ..Self::default()
        };
        for mut node in nodes {
            node.last_seen = now;
            if node.state != NodeState::Lost {
                membership.awaiting_return.insert(node.id);
            }
            membership.nodes.insert(node.id, node);
        }
        membership
    }

    /// Starts the restart grace again at `now`: the moment the head can hear
    /// its nodes (loading the history may have taken seconds).
    pub(crate) fn begin_restart_grace(&mut self, now: UnixMillis) {
        self.grace_from = now;
        for id in &self.awaiting_return {
            if let Some(node) = self.nodes.get_mut(id) {
                node.last_seen = now;
            }
        }
    }

    /// Whether nodes may still be coming back, `grace_ms` after the grace began.
    pub(crate) fn in_restart_grace(&self, now: UnixMillis, grace_ms: u64) -> bool {
        now < self.grace_from.saturating_add(grace_ms)
    }

    /// Whether the head still waits for `node` to come back after a restart.
    pub(crate) fn is_awaited(&self, node: NodeId) -> bool {
        self.awaiting_return.contains(&node)
    }

    /// A node.
    pub(crate) fn node(&self, id: NodeId) -> Option<&NodeRecord> {
        self.nodes.get(&id)
    }

    /// Every node, by id.
    pub(crate) fn nodes(&self) -> impl Iterator<Item = &NodeRecord> {
        self.nodes.values()
    }

    /// Every node, copied for a read off the actor.
    pub(crate) fn nodes_copy(&self) -> imbl::OrdMap<NodeId, NodeRecord> {
        self.nodes.clone()
    }

    /// The nodes from `start` on, by id (a page's listing).
    pub(crate) fn nodes_from(&self, start: Bound<NodeId>) -> impl Iterator<Item = &NodeRecord> {
        self.nodes
            .range((start, Bound::Unbounded))
            .map(|(_, node)| node)
    }

    /// How many nodes the head knows.
    pub(crate) fn len(&self) -> usize {
        self.nodes.len()
    }

    /// Whether the head knows no node.
    pub(crate) fn is_empty(&self) -> bool {
        self.nodes.is_empty()
    }

    /// A node (re)registered at `now`: it is ready, no longer awaited, and in
    /// an up interval (the open one, when it was not judged lost in between).
    /// Returns whether the head knew it.
    pub(crate) fn register(&mut self, now: UnixMillis, registration: &NodeRegistration) -> bool {
        let id = registration.node_id;
        self.awaiting_return.remove(&id);
        self.troubles.registered(id, now);
        let old = self.nodes.get(&id);
        let returning = old.is_some();
        if old.is_none_or(|old| old.resources != registration.resources) {
            self.resources_revision += 1;
        }
        let mut up = old.map(|old| old.up.clone()).unwrap_or_default();
        if up.last().is_none_or(|last| last.to.is_some()) {
            up.push(UpInterval {
                from: now,
                to: None,
            });
            if up.len() > MAX_UP_INTERVALS {
                up.remove(0);
            }
        }
        let record = NodeRecord {
            id,
            name: registration.name.clone(),
            address: registration.advertise_host.clone(),
            resources: registration.resources.clone(),
            labels: registration.labels.clone(),
            state: NodeState::Ready,
            last_seen: now,
            isolation: registration.isolation,
            up,
        };
        self.nodes.insert(id, record);
        self.dirty.insert(id);
        returning
    }

    /// The nodes not judged lost: those a command may reach.
    pub(crate) fn live_nodes(&self) -> impl Iterator<Item = NodeId> + '_ {
        self.nodes
            .values()
            .filter(|node| node.state != NodeState::Lost)
            .map(|node| node.id)
    }

    /// Whether `node` is known and not judged lost.
    pub(crate) fn is_live(&self, node: NodeId) -> bool {
        self.nodes
            .get(&node)
            .is_some_and(|node| node.state != NodeState::Lost)
    }

    /// Changes whenever some node's resources change (or a node is new).
    pub(crate) fn resources_revision(&self) -> u64 {
        self.resources_revision
    }

    /// `node` was heard from at `now`; its state, or `None` for a node that
    /// never registered.
    pub(crate) fn heard_from(&mut self, now: UnixMillis, node: NodeId) -> Option<NodeState> {
        let record = self.nodes.get_mut(&node)?;
        record.last_seen = now;
        Some(record.state)
    }

    /// `node`'s session last read a frame at `heard_at` (the session's own
    /// clock reading, not when the core got to its messages), as seen at
    /// `now`: a sign of life, and a trouble when it is older than
    /// `suspect_after_ms`. A lost node's old session counts for nothing.
    pub(crate) fn session_heard(
        &mut self,
        node: NodeId,
        heard_at: UnixMillis,
        now: UnixMillis,
        suspect_after_ms: u64,
    ) {
        let Some(record) = self.nodes.get_mut(&node) else {
            return;
        };
        if record.state == NodeState::Lost {
            return;
        }
        record.last_seen = record.last_seen.max(heard_at);
        self.troubles
            .session_heard(node, heard_at, now, suspect_after_ms);
    }

    /// `node`'s session closed at `at` while it was not draining: it may
    /// come back on a new one, but its peers may have lost it meanwhile.
    pub(crate) fn session_closed(&mut self, node: NodeId, at: UnixMillis) {
        if self.nodes.contains_key(&node) {
            self.troubles.session_closed(node, at);
        }
    }

    /// The head itself did not run until `now` (stopped, or starved of CPU):
    /// it heard nobody meanwhile, so every node's silence starts again now.
    pub(crate) fn excuse_pause(&mut self, now: UnixMillis) {
        let ids: Vec<NodeId> = self.nodes.keys().copied().collect();
        for id in ids {
            if let Some(record) = self.nodes.get_mut(&id)
                && record.state != NodeState::Lost
            {
                record.last_seen = record.last_seen.max(now);
            }
        }
    }

    /// What went wrong with each node lately.
    pub(crate) fn troubles(&self) -> &NodeTroubles {
        &self.troubles
    }

    /// `node` drains: it takes no more work.
    pub(crate) fn set_draining(&mut self, node: NodeId) {
        if let Some(record) = self.nodes.get_mut(&node) {
            record.state = NodeState::Draining;
            self.dirty.insert(node);
        }
    }

    /// `node` is lost; it was up until its last sign of life.
    pub(crate) fn set_lost(&mut self, node: NodeId) {
        if let Some(record) = self.nodes.get_mut(&node) {
            record.state = NodeState::Lost;
            let last_seen = record.last_seen;
            self.troubles.lost(node, last_seen);
            if let Some(open) = record.up.last_mut().filter(|last| last.to.is_none()) {
                open.to = Some(last_seen.max(open.from));
            }
            self.dirty.insert(node);
        }
    }

    /// The nodes not yet lost whose silence at `now` is past their limit;
    /// each stops being awaited.
    pub(crate) fn take_silent(&mut self, now: UnixMillis, limits: SilenceLimits) -> Vec<Silent> {
        let limit_of = |awaited: bool| {
            if awaited {
                limits.restart_grace_ms
            } else {
                limits.node_timeout_ms
            }
        };
        let silent: Vec<Silent> = self
            .nodes
            .values()
            .filter(|node| node.state != NodeState::Lost)
            .map(|node| {
                let awaited = self.awaiting_return.contains(&node.id);
                (node, awaited, limit_of(awaited))
            })
            .filter(|(node, _, limit_ms)| now.saturating_sub(node.last_seen) > *limit_ms)
            .map(|(node, never_returned, limit_ms)| Silent {
                node: node.id,
                limit_ms,
                never_returned,
            })
            .collect();
        for silent in &silent {
            self.awaiting_return.remove(&silent.node);
        }
        silent
    }

    /// The nodes changed since the last call, as records to persist.
    pub(crate) fn take_records(&mut self) -> Vec<Record> {
        std::mem::take(&mut self.dirty)
            .into_iter()
            .filter_map(|id| self.nodes.get(&id).cloned().map(Record::Node))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use xp_runtime::protocol::{NodeIsolation, NodeResources};

    use super::*;

    const LIMITS: SilenceLimits = SilenceLimits {
        node_timeout_ms: 10,
        restart_grace_ms: 30,
    };

    fn registration(seed: u8) -> NodeRegistration {
        NodeRegistration {
            node_id: NodeId(uuid::Uuid::from_bytes([seed; 16])),
            name: format!("n{seed}"),
            advertise_host: "10.0.0.1".to_owned(),
            resources: NodeResources {
                gpus: Vec::new(),
                cpu_milli: 1000,
                memory_bytes: 1 << 30,
            },
            labels: BTreeMap::new(),
            running: Vec::new(),
            objects: None,
            held_objects: Vec::new(),
            isolation: NodeIsolation::default(),
        }
    }

    fn silent_at(membership: &mut Membership, now: UnixMillis) -> Vec<(NodeId, u64, bool)> {
        membership
            .take_silent(now, LIMITS)
            .into_iter()
            .map(|silent| (silent.node, silent.limit_ms, silent.never_returned))
            .collect()
    }

    #[test]
    fn a_silent_node_is_judged_by_the_timeout_and_its_up_interval_closes() {
        let mut membership = Membership::default();
        let node = registration(1);
        assert!(!membership.register(0, &node), "a new node");
        assert_eq!(
            membership.heard_from(5, node.node_id),
            Some(NodeState::Ready)
        );
        assert!(
            silent_at(&mut membership, 15).is_empty(),
            "10 ms of silence is allowed"
        );
        assert_eq!(silent_at(&mut membership, 16), [(node.node_id, 10, false)]);
        membership.set_lost(node.node_id);
        let lost = membership.node(node.node_id).unwrap();
        assert_eq!(
            lost.up,
            [UpInterval {
                from: 0,
                to: Some(5)
            }]
        );
        assert!(
            silent_at(&mut membership, 100).is_empty(),
            "a lost node is judged once"
        );
        assert!(membership.register(100, &node), "it returns");
        let back = membership.node(node.node_id).unwrap();
        assert_eq!(back.up.len(), 2);
        assert_eq!(back.state, NodeState::Ready);
        let records = membership.take_records();
        assert_eq!(records.len(), 1, "one record per changed node");
        assert!(membership.take_records().is_empty());
    }

    #[test]
    fn a_restarted_head_waits_the_grace_for_the_nodes_it_knew() {
        let mut before = Membership::default();
        let (kept, gone) = (registration(1), registration(2));
        before.register(0, &kept);
        before.register(0, &gone);
        before.set_lost(gone.node_id);
        let records: Vec<NodeRecord> = before.nodes().cloned().collect();
        let mut membership = Membership::restore(records, 100);
        assert!(membership.is_awaited(kept.node_id));
        assert!(
            !membership.is_awaited(gone.node_id),
            "a lost node is not awaited"
        );
        membership.begin_restart_grace(200);
        assert!(membership.in_restart_grace(229, LIMITS.restart_grace_ms));
        assert!(silent_at(&mut membership, 230).is_empty());
        assert_eq!(silent_at(&mut membership, 231), [(kept.node_id, 30, true)]);
        assert!(!membership.is_awaited(kept.node_id));
    }
}
