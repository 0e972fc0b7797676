//! Object access by capability: what the head grants trial attempts (in their
//! launch) and driver sessions (`requests/capability.rs`), what it revokes
//! (an attempt or session that ended, a user revoked or changed) and tells
//! every node, the quotas nodes enforce, and what nodes report of the object
//! plane (per-team counts for `/metrics`, refusals for the audit trail).
//!
//! The capability's format, signature and checks are
//! `xp_runtime::protocol::ObjectCapability`; the nodes' object servers check
//! it on every request. This module decides who gets which grant:
//!
//! - an attempt reads what its trial keeps and what the driver sessions that
//!   submitted its experiment keep, and stores nothing on object servers (its
//!   node stores for it); it acts for its trial, not for a user, so a user's
//!   revocation leaves their team's running trials alone;
//! - a driver session stores as itself and reads what it and its team's other
//!   connected sessions keep, what the experiments it submitted keep, and the
//!   objects it asks for that its team's checkpoints or outputs name (an
//!   admin's reads everything).
//!
//! Invariant: every revocation is sent to every node not judged lost when it
//! is made, and a node that registers gets all those still in force before
//! anything is launched on it.

use std::collections::{BTreeMap, BTreeSet};

use xp_runtime::clock::UnixMillis;
use xp_runtime::ids::{NodeId, ObjectId, TrialId, WorkerKey};
use xp_runtime::protocol::{
    ATTEMPT_CAPABILITY_MS, AuditEntry, CapabilityKey, Grant, HeadCommand, Holder,
    MAX_CAPABILITY_OBJECTS, MAX_RENEWALS_PER_COMMAND, MAX_REVOCATIONS_PER_COMMAND,
    ObjectAccessReport, ObjectCapability, ObjectRules, ReadScope, Revocation, RevocationEntry,
    SESSION_CAPABILITY_MS, TeamQuota,
};

use super::{HeadCore, Record};
use crate::auth::Visibility;
use crate::auth::access::{MAX_AUDIT_TEXT_BYTES, truncated};

/// The most other sessions of the team, and experiments of the session, a
/// session's capability names.
const MAX_NAMED: usize = 16;

impl HeadCore {
    fn capability_key(&self) -> CapabilityKey {
        self.config.object_key
    }

    /// Every attempt that ended, with when (what a start revokes again).
    pub(super) fn ended_attempts(&self) -> Vec<(TrialId, u32, UnixMillis)> {
        self.book
            .trials()
            .flat_map(|trial| {
                trial.attempts.iter().filter_map(|attempt| {
                    attempt
                        .ended_at
                        .map(|ended_at| (trial.id, attempt.number, ended_at))
                })
            })
            .collect()
    }

    /// A new capability of live attempt `attempt` of `trial`, issued at `now`
    /// (its launch, or a renewal), renewed at half its life while the attempt
    /// lives.
    pub(super) fn attempt_capability(
        &mut self,
        now: UnixMillis,
        trial: TrialId,
        attempt: u32,
    ) -> ObjectCapability {
        self.grants.issued(now, trial, attempt);
        let mut read = vec![ReadScope::Trial(trial)];
        read.extend(
            self.drivers
                .sharing(trial.experiment)
                .take(MAX_NAMED)
                .map(|session| ReadScope::Driver(session.to_owned())),
        );
        let grant = Grant {
            holder: Holder::Attempt { trial, attempt },
            subject: format!("trial {trial}"),
            team: self.book.spec(trial.experiment).team.clone(),
            read,
            issued_ms: now,
            expires_ms: now.saturating_add(ATTEMPT_CAPABILITY_MS),
        };
        ObjectCapability::issue(&self.capability_key(), grant)
    }

    /// The capability of driver session `session` of `user` (of `team`, seeing
    /// `visible`), reading also those of `objects` its team's work names.
    pub(super) fn session_capability(
        &mut self,
        now: UnixMillis,
        (user, team, visible): (&str, &str, &Visibility),
        session: &str,
        objects: &[ObjectId],
    ) -> ObjectCapability {
        self.drivers.identified(session, user, team);
        let mut read = vec![ReadScope::Driver(session.to_owned())];
        if *visible == Visibility::All {
            read.push(ReadScope::Everything);
        }
        let others = self.drivers.of_team(team).filter(|other| *other != session);
        read.extend(
            others
                .take(MAX_NAMED)
                .map(|other| ReadScope::Driver(other.to_owned())),
        );
        read.extend(
            self.drivers
                .submitted_by(session)
                .take(MAX_NAMED)
                .map(ReadScope::Experiment),
        );
        let wanted: BTreeSet<ObjectId> = objects
            .iter()
            .copied()
            .take(MAX_CAPABILITY_OBJECTS)
            .collect();
        read.extend(
            self.named_by_visible_work(&wanted, visible)
                .into_iter()
                .map(ReadScope::Object),
        );
        let grant = Grant {
            holder: Holder::Session(session.to_owned()),
            subject: user.to_owned(),
            team: team.to_owned(),
            read,
            issued_ms: now,
            expires_ms: now.saturating_add(SESSION_CAPABILITY_MS),
        };
        ObjectCapability::issue(&self.capability_key(), grant)
    }

    /// Those of `wanted` that a kept checkpoint or output of a trial `visible`
    /// shows names.
    fn named_by_visible_work(
        &self,
        wanted: &BTreeSet<ObjectId>,
        visible: &Visibility,
    ) -> BTreeSet<ObjectId> {
        let mut found = BTreeSet::new();
        if wanted.is_empty() {
            return found;
        }
        for trial in self.book.trials() {
            if !visible.shows(&self.book.spec(trial.id.experiment).team) {
                continue;
            }
            let checkpoints = trial.checkpoints.iter().flat_map(|kept| kept.objects());
            let outputs = super::records::output_objects(&trial.outputs);
            for id in checkpoints.chain(outputs) {
                if wanted.contains(&id) {
                    found.insert(id);
                }
            }
        }
        found
    }

    /// Attempt `attempt` of `trial` ended at `now`: its capability stops
    /// working everywhere.
    pub(super) fn revoke_attempt(&mut self, now: UnixMillis, trial: TrialId, attempt: u32) {
        self.grants.revoke_attempt(now, trial, attempt);
    }

    /// Issues the live attempts whose capabilities are due at `now` new ones,
    /// and sends each to the nodes its workers run on: a capability lasts
    /// `ATTEMPT_CAPABILITY_MS`, and the attempt may run far longer.
    pub(super) fn renew_capabilities(&mut self, now: UnixMillis) {
        let mut by_node: BTreeMap<NodeId, Vec<ObjectCapability>> = BTreeMap::new();
        for (trial, number) in self.grants.take_due(now) {
            let nodes: BTreeSet<NodeId> = self
                .book
                .trial(trial)
                .attempts
                .iter()
                .filter(|attempt| attempt.number == number && attempt.is_live())
                .flat_map(|attempt| attempt.workers.iter())
                .filter(|worker| worker.state.holds_resources())
                .map(|worker| worker.node)
                .collect();
            if nodes.is_empty() {
                continue;
            }
            let capability = self.attempt_capability(now, trial, number);
            for node in nodes {
                by_node.entry(node).or_default().push(capability.clone());
            }
        }
        for (node, capabilities) in by_node {
            self.send_renewals(node, capabilities);
        }
    }

    /// Sends `node` new capabilities of the live attempts among `running`
    /// (it registered: a restarted head knows nothing of what it issued
    /// before, and a node back from a lost session may have missed renewals).
    pub(super) fn renew_on_registration(
        &mut self,
        now: UnixMillis,
        node: NodeId,
        running: &BTreeSet<WorkerKey>,
    ) {
        let live: BTreeSet<(TrialId, u32)> = running
            .iter()
            .filter(|key| {
                self.worker(**key).is_some_and(|(attempt, worker)| {
                    attempt.is_live() && worker.state.holds_resources()
                })
            })
            .map(|key| (key.trial, key.attempt))
            .collect();
        let capabilities = live
            .into_iter()
            .map(|(trial, number)| self.attempt_capability(now, trial, number))
            .collect();
        self.send_renewals(node, capabilities);
    }

    fn send_renewals(&mut self, node: NodeId, mut capabilities: Vec<ObjectCapability>) {
        while !capabilities.is_empty() {
            let rest = capabilities.split_off(capabilities.len().min(MAX_RENEWALS_PER_COMMAND));
            self.outbox
                .send(node, HeadCommand::RenewCapabilities(capabilities));
            capabilities = rest;
        }
    }

    /// Driver session `session` ended (its connection closed): its capability
    /// stops working everywhere, and what it stored and nothing else claims goes.
    pub fn end_driver_session(&mut self, now: UnixMillis, session: &str) {
        let holder = Holder::Session(session.to_owned());
        let until = now.saturating_add(SESSION_CAPABILITY_MS);
        self.grants.revoke(now, Revocation::Holder(holder), until);
        self.tell_revocations();
        self.release_driver_objects(session);
    }

    /// User `name` was revoked or changed at `now`: every capability issued to
    /// them before stops working everywhere.
    pub fn revoke_user(&mut self, now: UnixMillis, name: &str) {
        let revocation = Revocation::Subject {
            subject: name.to_owned(),
            before_ms: now,
        };
        self.grants
            .revoke(now, revocation, now.saturating_add(SESSION_CAPABILITY_MS));
        self.tell_revocations();
    }

    /// Tells every node not lost the revocations made since it was last done,
    /// in one command each. Ended attempts wait for the next tick (at most
    /// 250 ms): telling every node of every end cost nodes × ends commands,
    /// which a 1,000-node soak could not carry; ended sessions and revoked
    /// users are told at once.
    pub(super) fn tell_revocations(&mut self) {
        let entries = self.grants.take_unsent();
        if entries.is_empty() {
            return;
        }
        self.tell_live_nodes(|| HeadCommand::RevokeCapabilities(entries.clone()));
    }

    /// The object plane's rules: the policy's quotas, and `revoked`.
    fn object_rules(&self, revoked: Vec<RevocationEntry>) -> ObjectRules {
        let quotas = &self.placement.policy().config().objects;
        let quota = |team: &str| {
            let (memory_bytes, disk_bytes) = quotas.of(team);
            TeamQuota {
                team: team.to_owned(),
                memory_bytes,
                disk_bytes,
            }
        };
        let default_quota = quota("");
        let teams = quotas.teams.keys().map(|team| quota(team)).collect();
        ObjectRules {
            default_quota,
            teams,
            revoked,
        }
    }

    /// Tells `node` the object plane's rules and every revocation in force at
    /// `now` (it registered): the first [`MAX_REVOCATIONS_PER_COMMAND`] with
    /// the rules, the rest in commands of as many after them. After a busy
    /// day a million attempts' revocations are in force, about 25 MB, and a
    /// frame holds 16 MiB: in one command the session's writer failed and
    /// the node heard nothing more.
    pub(super) fn send_object_rules(&mut self, now: UnixMillis, node: NodeId) {
        let mut revoked = self.grants.in_force(now).into_iter();
        let mut next = || -> Vec<RevocationEntry> {
            revoked.by_ref().take(MAX_REVOCATIONS_PER_COMMAND).collect()
        };
        let rules = self.object_rules(next());
        self.outbox.send(node, HeadCommand::ObjectRules(rules));
        loop {
            let chunk = next();
            if chunk.is_empty() {
                break;
            }
            self.outbox
                .send(node, HeadCommand::RevokeCapabilities(chunk));
        }
    }

    /// Tells every node not lost the object plane's quotas (the policy
    /// changed). Not the revocations: each node got those in force when it
    /// registered and each made since as it was made, and a node adds the
    /// ones rules carry to those it holds.
    pub(super) fn send_object_rules_to_nodes(&mut self) {
        let rules = self.object_rules(Vec::new());
        self.tell_live_nodes(|| HeadCommand::ObjectRules(rules.clone()));
    }

    /// What `node`'s object server counted and refused: the counts go to
    /// `/metrics`, each refusal to the audit trail.
    pub(super) fn handle_object_access(&mut self, node: NodeId, report: ObjectAccessReport) {
        let node_name = self
            .membership
            .node(node)
            .map_or_else(|| node.to_string(), |record| record.name.clone());
        for refusal in report.refusals {
            let cut = |text: &str| truncated(text, MAX_AUDIT_TEXT_BYTES).to_owned();
            let action = format!("{} on node {}", cut(&refusal.action), cut(&node_name));
            let entry = AuditEntry {
                seq: 0,
                at: refusal.at_ms,
                who: cut(&refusal.subject),
                action,
                allowed: false,
                detail: cut(&refusal.reason),
            };
            self.outbox.record(Record::Audit(entry));
        }
        self.outbox.tally().object_access(report.counts);
    }
}
