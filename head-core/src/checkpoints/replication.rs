//! Copying each new checkpoint to a second node until two live nodes hold it:
//! which copy is being made where, when a failed one is tried again (with
//! back-off, at most [`MAX_TRIES`] times, on another node when there is one), and
//! what `xp checkpoints` and the trial's events say about a checkpoint that has a
//! single copy.
//!
//! [`Replications`] is the pure bookkeeping (time comes in as an argument); the
//! `impl HeadCore` below applies it to the core's nodes and checkpoints and emits
//! `Replicate` commands. Nodes move the bytes and report a copy that failed
//! (`NodeMessage::ReplicationFailed`); a copy that succeeded shows in the object
//! directory. This is soft state: a head restart forgets copies in progress.
//!
//! Invariant: a checkpoint the head keeps that fewer than two live nodes hold is
//! either being copied, waiting to be tried again, waiting for a node to copy it
//! to, or given up on with its reason recorded; it is never silently a single copy.

use std::collections::{BTreeMap, BTreeSet};

use tracing::{info, warn};
use xp_runtime::clock::UnixMillis;
use xp_runtime::ids::{NodeId, ObjectId, TrialId};
use xp_runtime::protocol::{FetchPath, HeadCommand, NodeState};

use super::retention::CheckpointRecord;
use crate::HeadCore;

/// How many times a copy is tried before it is given up on.
pub(crate) const MAX_TRIES: u32 = 5;
/// The wait after the first failed try; it doubles after each further one.
const FIRST_BACKOFF_MS: u64 = 1_000;
/// The longest wait between two tries.
const MAX_BACKOFF_MS: u64 = 30_000;

/// One checkpoint of one trial.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) struct CheckpointKey {
    /// The trial.
    pub trial: TrialId,
    /// The attempt that wrote it.
    pub attempt: u32,
    /// Its step.
    pub step: u64,
}

/// Where one checkpoint's copy stands.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum CopyState {
    /// Asked of `target`: waiting for it to hold every object, or to report failure.
    InFlight {
        /// The node making the copy.
        target: NodeId,
    },
    /// The last try failed; the next is due at `retry_at`.
    Waiting {
        /// When to try again.
        retry_at: UnixMillis,
        /// Why the last try failed.
        error: String,
    },
    /// No other ready node to copy it to; tried when one comes.
    NoTarget,
    /// Given up after [`MAX_TRIES`] tries, or nothing is left to copy from.
    GaveUp {
        /// Why the last try failed.
        error: String,
    },
}

/// One checkpoint's copy.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Replication {
    /// The node that stored the checkpoint.
    pub origin: NodeId,
    /// Tries made so far (0 while waiting for a first target).
    pub tries: u32,
    /// Where it stands.
    pub state: CopyState,
}

/// What a failed try led to.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum FailureOutcome {
    /// Tried again at `retry_at`.
    Retrying {
        /// When.
        retry_at: UnixMillis,
    },
    /// No try is left.
    GaveUp,
}

/// Every checkpoint copy not (yet) made.
#[derive(Debug, Default)]
pub(crate) struct Replications {
    jobs: BTreeMap<CheckpointKey, Replication>,
}

impl Replications {
    /// A copy of `key`, stored on `origin`, is wanted; `target` makes it, or none
    /// is there yet.
    pub(crate) fn start(&mut self, key: CheckpointKey, origin: NodeId, target: Option<NodeId>) {
        let (tries, state) = match target {
            Some(target) => (1, CopyState::InFlight { target }),
            None => (0, CopyState::NoTarget),
        };
        self.jobs.insert(
            key,
            Replication {
                origin,
                tries,
                state,
            },
        );
    }

    /// Whether the copy of `key` is followed already.
    pub(crate) fn contains(&self, key: CheckpointKey) -> bool {
        self.jobs.contains_key(&key)
    }

    /// Another try of `key`, by `target`.
    pub(crate) fn retry(&mut self, key: CheckpointKey, target: NodeId) {
        if let Some(job) = self.jobs.get_mut(&key) {
            job.tries += 1;
            job.state = CopyState::InFlight { target };
        }
    }

    /// The try in flight for `key` failed at `now`; `None` when none was in flight.
    pub(crate) fn fail(
        &mut self,
        now: UnixMillis,
        key: CheckpointKey,
        error: String,
    ) -> Option<FailureOutcome> {
        let job = self.jobs.get_mut(&key)?;
        if !matches!(job.state, CopyState::InFlight { .. }) {
            return None;
        }
        if job.tries >= MAX_TRIES {
            job.state = CopyState::GaveUp { error };
            return Some(FailureOutcome::GaveUp);
        }
        let retry_at = now.saturating_add(backoff_ms(job.tries));
        job.state = CopyState::Waiting { retry_at, error };
        Some(FailureOutcome::Retrying { retry_at })
    }

    /// No node to copy `key` to for now: tried again when one comes.
    pub(crate) fn await_target(&mut self, key: CheckpointKey) {
        if let Some(job) = self.jobs.get_mut(&key) {
            job.state = CopyState::NoTarget;
        }
    }

    /// Stops trying to copy `key`, for good.
    pub(crate) fn give_up(&mut self, key: CheckpointKey, error: String) {
        if let Some(job) = self.jobs.get_mut(&key) {
            job.state = CopyState::GaveUp { error };
        }
    }

    /// Forgets `key` (copied, or no longer kept).
    pub(crate) fn forget(&mut self, key: CheckpointKey) -> Option<Replication> {
        self.jobs.remove(&key)
    }

    /// Where the copy of `key` stands, if one is wanted.
    pub(crate) fn get(&self, key: CheckpointKey) -> Option<&Replication> {
        self.jobs.get(&key)
    }

    /// Every copy not yet made.
    pub(crate) fn keys(&self) -> Vec<CheckpointKey> {
        self.jobs.keys().copied().collect()
    }
}

/// The most of a node's failure text the head keeps in a trial's events.
const MAX_REASON_BYTES: usize = 1024;

/// `reason`, cut at a character boundary to at most [`MAX_REASON_BYTES`].
fn truncate_reason(reason: &str) -> &str {
    if reason.len() <= MAX_REASON_BYTES {
        return reason;
    }
    let mut end = MAX_REASON_BYTES;
    while !reason.is_char_boundary(end) {
        end -= 1;
    }
    &reason[..end]
}

/// The wait after `tries` failed tries.
fn backoff_ms(tries: u32) -> u64 {
    FIRST_BACKOFF_MS
        .saturating_mul(1 << tries.saturating_sub(1).min(16))
        .min(MAX_BACKOFF_MS)
}

impl CheckpointKey {
    fn of(trial: TrialId, checkpoint: &CheckpointRecord) -> Self {
        Self {
            trial,
            attempt: checkpoint.attempt,
            step: checkpoint.step,
        }
    }
}

impl HeadCore {
    /// Asks one other ready node to hold a copy of the checkpoint `key`, which
    /// `origin` stored, and follows the copy until it is made.
    ///
    /// A checkpoint report resent after a reconnect finds its copy already
    /// followed: it neither restarts the count of tries nor sends a second copy.
    pub(super) fn replicate(&mut self, key: CheckpointKey, origin: NodeId) {
        if self.objects.replications().contains(key) {
            return;
        }
        let target = self.replica_target(key, 0);
        self.objects.replications_mut().start(key, origin, target);
        if let Some(target) = target {
            self.send_replicate(key, target);
        }
    }

    /// Follows every copy in progress: forgets those made or no longer needed,
    /// counts a copy whose node was lost as failed, and tries again those due.
    pub(crate) fn tend_replications(&mut self, now: UnixMillis) {
        for key in self.objects.replications().keys() {
            let Some(checkpoint) = self.kept_checkpoint(key) else {
                self.objects.replications_mut().forget(key);
                continue;
            };
            let holders = self
                .objects
                .directory()
                .complete_holders(checkpoint, |node| self.node_usable(node));
            if holders.len() >= 2 {
                if let Some(job) = self.objects.replications_mut().forget(key)
                    && job.tries > 1
                {
                    let reason = format!(
                        "checkpoint at step {} replicated after {} tries: held by nodes {}",
                        key.step,
                        job.tries,
                        join_nodes(&holders)
                    );
                    self.push_trial_event(now, key.trial, reason);
                }
                continue;
            }
            let Some(job) = self.objects.replications().get(key).cloned() else {
                continue;
            };
            match job.state {
                CopyState::InFlight { target } if !self.node_usable(target) => {
                    self.replication_failed_once(now, key, format!("node {target} was lost"));
                }
                CopyState::Waiting { retry_at, .. } if now >= retry_at => {
                    self.retry_replication(now, key, job.tries);
                }
                CopyState::NoTarget => {
                    if let Some(target) = self.replica_target(key, 0) {
                        self.objects.replications_mut().retry(key, target);
                        self.send_replicate(key, target);
                    }
                }
                CopyState::InFlight { .. }
                | CopyState::Waiting { .. }
                | CopyState::GaveUp { .. } => {}
            }
        }
    }

    /// `node` could not fetch `objects` of `trial`'s checkpoints.
    pub(crate) fn handle_replication_failed(
        &mut self,
        now: UnixMillis,
        node: NodeId,
        trial: TrialId,
        objects: &[ObjectId],
        error: &str,
    ) {
        // The node's words end up in the trial's persisted events: keep them short.
        let error = truncate_reason(error);
        let failed: BTreeSet<ObjectId> = objects.iter().copied().collect();
        let keys: Vec<CheckpointKey> = self
            .book
            .get_trial(trial)
            .map(|record| {
                record
                    .checkpoints
                    .iter()
                    .filter(|checkpoint| !checkpoint.objects().is_disjoint(&failed))
                    .map(|checkpoint| CheckpointKey::of(trial, checkpoint))
                    .collect()
            })
            .unwrap_or_default();
        for key in keys {
            let in_flight_here = self.objects.replications().get(key).is_some_and(
                |job| matches!(job.state, CopyState::InFlight { target } if target == node),
            );
            if in_flight_here {
                self.replication_failed_once(now, key, format!("node {node}: {error}"));
            }
        }
    }

    /// Sends again the copies in flight to `node`, which (re)registered: a
    /// command sent while it was away is lost.
    pub(super) fn resend_replications_to(&mut self, node: NodeId) {
        for key in self.objects.replications().keys() {
            let here = self.objects.replications().get(key).is_some_and(
                |job| matches!(job.state, CopyState::InFlight { target } if target == node),
            );
            if here {
                self.send_replicate(key, node);
            }
        }
    }

    /// Why the checkpoint `key` has a single copy, for `xp checkpoints`; `None`
    /// when two live nodes (`replicas`) or a backup hold it.
    pub(super) fn unreplicated_reason(
        &self,
        key: CheckpointKey,
        replicas: usize,
        backed_up: bool,
    ) -> Option<String> {
        if replicas >= 2 || backed_up {
            return None;
        }
        let Some(job) = self.objects.replications().get(key) else {
            return Some(if replicas == 0 {
                "no live node holds it".to_owned()
            } else {
                "held by one node only".to_owned()
            });
        };
        Some(match &job.state {
            CopyState::InFlight { target } => {
                format!(
                    "being copied to node {target} (try {} of {MAX_TRIES})",
                    job.tries
                )
            }
            CopyState::Waiting { error, .. } => format!(
                "try {} of {MAX_TRIES} failed, trying again: {error}",
                job.tries
            ),
            CopyState::NoTarget => "no other ready node to copy it to".to_owned(),
            CopyState::GaveUp { error } => {
                format!("copy given up after {} tries: {error}", job.tries)
            }
        })
    }

    fn replication_failed_once(&mut self, now: UnixMillis, key: CheckpointKey, error: String) {
        let tries = self
            .objects
            .replications()
            .get(key)
            .map_or(0, |job| job.tries);
        let reason = match self
            .objects
            .replications_mut()
            .fail(now, key, error.clone())
        {
            None => return,
            Some(FailureOutcome::Retrying { retry_at }) => {
                warn!(trial = %key.trial, step = key.step, tries, %error, "checkpoint replication failed; trying again");
                format!(
                    "checkpoint at step {} not replicated (try {tries} of {MAX_TRIES}): {error}; trying again in {} s",
                    key.step,
                    retry_at.saturating_sub(now).div_ceil(1000)
                )
            }
            Some(FailureOutcome::GaveUp) => {
                warn!(trial = %key.trial, step = key.step, tries, %error, "checkpoint replication given up");
                self.single_copy_reason(key, tries, &error)
            }
        };
        self.push_trial_event(now, key.trial, reason);
    }

    fn retry_replication(&mut self, now: UnixMillis, key: CheckpointKey, tries: u32) {
        let Some(target) = self.replica_target(key, tries) else {
            // Waiting for a node to copy it to is not a failed try.
            self.objects.replications_mut().await_target(key);
            return;
        };
        if self.replica_sources(key).is_empty() {
            let error = "no live node holds it any more".to_owned();
            let reason = self.single_copy_reason(key, tries, &error);
            self.objects.replications_mut().give_up(key, error);
            self.push_trial_event(now, key.trial, reason);
            return;
        }
        info!(trial = %key.trial, step = key.step, %target, try_number = tries + 1, "replicating a checkpoint again");
        self.objects.replications_mut().retry(key, target);
        self.send_replicate(key, target);
    }

    fn single_copy_reason(&self, key: CheckpointKey, tries: u32, error: &str) -> String {
        let holders = self
            .kept_checkpoint(key)
            .map(|checkpoint| {
                self.objects
                    .directory()
                    .complete_holders(checkpoint, |node| self.node_usable(node))
            })
            .unwrap_or_default();
        let held = if holders.is_empty() {
            "no live node holds it".to_owned()
        } else {
            format!("its only copy is on node {}", join_nodes(&holders))
        };
        format!(
            "checkpoint at step {} is not replicated: given up after {tries} tries ({error}); {held}",
            key.step
        )
    }

    /// The checkpoint `key` if the trial still keeps it.
    fn kept_checkpoint(&self, key: CheckpointKey) -> Option<&CheckpointRecord> {
        self.book
            .get_trial(key.trial)?
            .checkpoints
            .iter()
            .find(|checkpoint| checkpoint.attempt == key.attempt && checkpoint.step == key.step)
    }

    /// A ready node serving objects that does not hold all of `key` yet; each
    /// trial has its own preferred one, and each further try moves to the next.
    fn replica_target(&self, key: CheckpointKey, tries: u32) -> Option<NodeId> {
        let checkpoint = self.kept_checkpoint(key)?;
        let holders = self
            .objects
            .directory()
            .complete_holders(checkpoint, |node| self.node_usable(node));
        let origin = self.objects.replications().get(key).map(|job| job.origin);
        let candidates: Vec<NodeId> = self
            .membership
            .nodes()
            .filter(|node| node.state == NodeState::Ready)
            .filter(|node| !holders.contains(&node.id) && Some(node.id) != origin)
            .filter(|node| self.objects.directory().endpoint(node.id).is_some())
            .map(|node| node.id)
            .collect();
        if candidates.is_empty() {
            return None;
        }
        let index = (key.trial.index as usize).wrapping_add(tries as usize) % candidates.len();
        Some(candidates[index])
    }

    /// The live nodes holding some object of `key`.
    fn replica_sources(&self, key: CheckpointKey) -> Vec<NodeId> {
        let Some(checkpoint) = self.kept_checkpoint(key) else {
            return Vec::new();
        };
        let mut sources: Vec<NodeId> = Vec::new();
        for id in checkpoint.objects() {
            for node in self.objects.directory().holders(id) {
                if self.node_usable(node) && !sources.contains(&node) {
                    sources.push(node);
                }
            }
        }
        sources
    }

    /// Tells `target` to fetch what it lacks of `key` from the nodes holding it.
    fn send_replicate(&mut self, key: CheckpointKey, target: NodeId) {
        let Some(checkpoint) = self.kept_checkpoint(key) else {
            return;
        };
        let missing: Vec<(ObjectId, u64)> = checkpoint
            .files
            .iter()
            .filter(|file| !self.objects.directory().holds(target, file.object))
            .map(|file| (file.object, file.size))
            .collect::<BTreeMap<_, _>>()
            .into_iter()
            .collect();
        if missing.is_empty() {
            return;
        }
        let sources = self
            .replica_sources(key)
            .into_iter()
            .filter(|node| *node != target)
            .filter_map(|node| self.object_source(node))
            .collect();
        let path = self
            .book
            .get_spec(key.trial.experiment)
            .map_or(FetchPath::Quic, |spec| {
                FetchPath::for_transport(spec.trial.transport)
            });
        self.outbox.send(
            target,
            HeadCommand::Replicate {
                trial: key.trial,
                objects: missing,
                sources,
                path,
            },
        );
    }

    fn push_trial_event(&mut self, now: UnixMillis, trial: TrialId, reason: String) {
        let Some(record) = self.book.get_trial(trial) else {
            return;
        };
        let (state, attempt) = (record.state, record.attempts.len() as u32);
        self.push_event(now, trial, state, attempt, reason);
    }
}

fn join_nodes(nodes: &[NodeId]) -> String {
    nodes
        .iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join(",")
}

#[cfg(test)]
mod tests {

    #[test]
    fn a_long_failure_text_is_cut_at_a_character_boundary() {
        assert_eq!(truncate_reason("short"), "short");
        let long = "é".repeat(MAX_REASON_BYTES);
        let cut = truncate_reason(&long);
        assert!(cut.len() <= MAX_REASON_BYTES && cut.len() >= MAX_REASON_BYTES - 1);
        assert!(cut.chars().all(|c| c == 'é'));
    }
    use std::collections::BTreeMap;

    use xp_runtime::ids::{ExperimentId, NodeId, ObjectId, WorkerKey};
    use xp_runtime::protocol::{
        CheckpointFile, HeadCommand, NodeMessage, NodeRegistration, NodeResources, ObjectEndpoint,
        SubmitRequest, WorkerReport,
    };

    use super::{MAX_REASON_BYTES, MAX_TRIES, backoff_ms, truncate_reason};
    use crate::{CoreConfig, HeadCore, LoadedState};

    #[test]
    fn the_wait_doubles_from_one_second_up_to_thirty() {
        let waits: Vec<u64> = (1..=7).map(backoff_ms).collect();
        assert_eq!(waits, [1_000, 2_000, 4_000, 8_000, 16_000, 30_000, 30_000]);
    }

    fn node(seed: u8) -> NodeId {
        NodeId(uuid::Uuid::from_bytes([seed; 16]))
    }

    fn register(core: &mut HeadCore, now: u64, node_id: NodeId) {
        core.handle_node_register(
            now,
            NodeRegistration {
                node_id,
                name: format!("node-{node_id}"),
                advertise_host: format!("10.77.0.{}", node_id.0.as_bytes()[0]),
                resources: NodeResources {
                    gpus: Vec::new(),
                    cpu_milli: 1000,
                    memory_bytes: 1 << 34,
                },
                labels: BTreeMap::new(),
                running: Vec::new(),
                objects: Some(ObjectEndpoint {
                    port: 7000,
                    cert_sha256: [0; 32],
                }),
                held_objects: Vec::new(),
                isolation: xp_runtime::protocol::NodeIsolation::default(),
            },
        );
    }

    /// Commands sent, as (to, trial's objects to fetch) for every `Replicate`.
    fn replicates(core: &mut HeadCore) -> Vec<(NodeId, Vec<ObjectId>)> {
        std::iter::from_fn(|| core.poll_command())
            .filter_map(|(to, command)| match command {
                HeadCommand::Replicate { objects, .. } => {
                    Some((to, objects.into_iter().map(|(id, _)| id).collect()))
                }
                _ => None,
            })
            .collect()
    }

    fn unreplicated(core: &HeadCore, experiment: ExperimentId) -> Option<String> {
        core.checkpoints(&experiment.to_string()).unwrap()[0]
            .unreplicated
            .clone()
    }

    fn events(core: &HeadCore, experiment: ExperimentId) -> Vec<String> {
        crate::tests::events_of(core, experiment)
            .into_iter()
            .map(|event| event.reason)
            .collect()
    }

    const CONFIG: CoreConfig = CoreConfig {
        node_timeout_ms: 10_000,
        heartbeat_interval_ms: 1_000,
        rendezvous_key: [3; 32],
        object_key: xp_runtime::protocol::CapabilityKey::from_bytes([4; 32]),
        node_return_ms: 12_000,
    };

    /// A core with nodes 1 and 2 where a trial stored a checkpoint on one of them
    /// at time 10; returns (core, experiment, origin, other, the object).
    fn checkpoint_stored() -> (HeadCore, ExperimentId, NodeId, NodeId, ObjectId) {
        let mut core = HeadCore::restore(CONFIG, LoadedState::default(), 0);
        let (a, b) = (node(1), node(2));
        register(&mut core, 0, a);
        register(&mut core, 0, b);
        let yaml = "name: ck\ntrial: {command: [train], resources: {cpu: 1}}\n";
        let spec = xp_runtime::spec::ExperimentSpec::from_yaml(yaml).unwrap();
        let request = SubmitRequest {
            spec_json: spec.to_canonical_json(),
            program: None,
            code_version: "none".to_owned(),
            data_version: "none".to_owned(),
            rerun: false,
        };
        let experiment = core.handle_submit(1, &request).unwrap().0;
        let (origin, key): (NodeId, WorkerKey) = std::iter::from_fn(|| core.poll_command())
            .find_map(|(to, command)| match command {
                HeadCommand::Launch(launch) => Some((to, launch.key)),
                _ => None,
            })
            .expect("the trial is launched");
        let other = if origin == a { b } else { a };
        let report = |core: &mut HeadCore, now, report| {
            core.handle_node_message(
                now,
                origin,
                NodeMessage::Report {
                    seq: 0,
                    at: now,
                    report,
                },
            );
        };
        report(&mut core, 2, WorkerReport::Started { key, pid: 1 });
        let object = ObjectId::of(b"state");
        report(
            &mut core,
            10,
            WorkerReport::Checkpoint {
                key,
                step: 5,
                files: vec![CheckpointFile {
                    name: "state".to_owned(),
                    object,
                    size: 5,
                }],
                backup: None,
                take_ms: 1,
            },
        );
        (core, experiment, origin, other, object)
    }

    /// Heartbeats from both nodes and a tick at `now`.
    fn tick(core: &mut HeadCore, now: u64, nodes: [NodeId; 2]) {
        for node in nodes {
            core.handle_node_message(now, node, NodeMessage::Heartbeat);
        }
        core.handle_tick(now);
    }

    fn fail(core: &mut HeadCore, now: u64, at: NodeId, object: ObjectId) {
        let trial = core
            .book
            .trials()
            .map(|trial| &trial.id)
            .next()
            .copied()
            .expect("a trial");
        core.handle_node_message(
            now,
            at,
            NodeMessage::ReplicationFailed {
                trial,
                objects: vec![object],
                error: "store full".to_owned(),
            },
        );
    }

    #[test]
    fn a_failed_copy_is_retried_with_back_off_then_given_up_and_reported() {
        let (mut core, experiment, origin, other, object) = checkpoint_stored();
        assert_eq!(replicates(&mut core), [(other, vec![object])]);
        let shown = unreplicated(&core, experiment).expect("one copy so far");
        assert!(shown.contains("being copied"), "{shown}");
        let mut now = 20;
        for try_number in 1..=MAX_TRIES {
            fail(&mut core, now, other, object);
            let shown = unreplicated(&core, experiment).expect("still one copy");
            if try_number < MAX_TRIES {
                assert!(shown.contains("trying again"), "{shown}");
                let due = now + backoff_ms(try_number);
                tick(&mut core, due - 1, [origin, other]);
                assert!(replicates(&mut core).is_empty(), "not before the back-off");
                tick(&mut core, due, [origin, other]);
                assert_eq!(replicates(&mut core), [(other, vec![object])]);
                now = due + 10;
            } else {
                assert!(shown.contains("given up after 5 tries: node"), "{shown}");
            }
        }
        tick(&mut core, now + 100_000, [origin, other]);
        assert!(replicates(&mut core).is_empty(), "bounded: no sixth try");
        let events = events(&core, experiment);
        let failures = events
            .iter()
            .filter(|reason| reason.contains("not replicated"))
            .count();
        assert_eq!(failures, MAX_TRIES as usize, "{events:#?}");
        let last = events.last().expect("events");
        assert!(
            last.contains("given up after 5 tries") && last.contains(&origin.to_string()),
            "{last}"
        );
        core.check_invariants();
    }

    #[test]
    fn a_copy_made_on_a_later_try_is_reported_and_a_lost_target_counts_as_a_failed_try() {
        let (mut core, experiment, origin, other, object) = checkpoint_stored();
        assert_eq!(replicates(&mut core).len(), 1);
        // The target goes silent until judged lost: the try failed.
        core.handle_node_message(1_000, origin, NodeMessage::Heartbeat);
        core.handle_tick(CONFIG.node_timeout_ms + 500);
        let shown = unreplicated(&core, experiment).expect("one copy");
        assert!(shown.contains("trying again"), "{shown}");
        assert!(
            events(&core, experiment)
                .iter()
                .any(|reason| reason.contains("was lost")),
        );
        // It comes back; the next try goes to it and succeeds.
        register(&mut core, 11_000, other);
        let _ = replicates(&mut core);
        tick(&mut core, 12_000, [origin, other]);
        assert_eq!(replicates(&mut core), [(other, vec![object])]);
        core.handle_node_message(
            12_100,
            other,
            NodeMessage::Objects {
                added: vec![object],
                dropped: Vec::new(),
            },
        );
        tick(&mut core, 12_200, [origin, other]);
        assert_eq!(unreplicated(&core, experiment), None);
        let events = events(&core, experiment);
        assert!(
            events
                .last()
                .is_some_and(|reason| reason.contains("replicated after 2 tries")),
            "{events:#?}"
        );
    }

    #[test]
    fn a_lone_node_shows_why_and_a_node_that_joins_later_gets_the_copy() {
        let mut core = HeadCore::restore(CONFIG, LoadedState::default(), 0);
        let (a, b) = (node(1), node(2));
        register(&mut core, 0, a);
        let yaml = "name: ck\ntrial: {command: [train], resources: {cpu: 1}}\n";
        let spec = xp_runtime::spec::ExperimentSpec::from_yaml(yaml).unwrap();
        let request = SubmitRequest {
            spec_json: spec.to_canonical_json(),
            program: None,
            code_version: "none".to_owned(),
            data_version: "none".to_owned(),
            rerun: false,
        };
        let experiment = core.handle_submit(1, &request).unwrap().0;
        let key = std::iter::from_fn(|| core.poll_command())
            .find_map(|(_, command)| match command {
                HeadCommand::Launch(launch) => Some(launch.key),
                _ => None,
            })
            .expect("launched");
        let object = ObjectId::of(b"state");
        core.handle_node_message(
            10,
            a,
            NodeMessage::Report {
                seq: 0,
                at: 10,
                report: WorkerReport::Checkpoint {
                    key,
                    step: 5,
                    files: vec![CheckpointFile {
                        name: "state".to_owned(),
                        object,
                        size: 5,
                    }],
                    backup: None,
                    take_ms: 1,
                },
            },
        );
        assert!(replicates(&mut core).is_empty());
        let shown = unreplicated(&core, experiment).expect("one copy");
        assert!(shown.contains("no other ready node"), "{shown}");
        register(&mut core, 500, b);
        tick(&mut core, 600, [a, b]);
        assert_eq!(replicates(&mut core), [(b, vec![object])]);
    }
}
