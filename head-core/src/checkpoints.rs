//! The core's checkpoint bookkeeping: recording manifests, retention,
//! replication to a second node, object reference counts, settling what a
//! (re)registering node holds, and choosing what a new attempt resumes from.
//!
//! The pure parts (manifests, `retain`, `ObjectDirectory`) live in
//! [`retention`]; this module applies them to the core's trials and nodes
//! and emits the node commands (`Replicate`, `DropObjects`, `Pin`, releases). It
//! never moves bytes: nodes copy objects between their stores. Following each
//! copy to a second node (retries, what a single copy is shown with) is
//! [`replication`].
//!
//! Invariants: the head records a checkpoint only from rank 0 with a well-formed
//! manifest of files the reporting node has stored; the object book counts, for each
//! object, the kept checkpoints (of all trials) that name it, and an object is
//! dropped everywhere when its count reaches zero.

pub(crate) mod replication;
pub(crate) mod retention;

use std::collections::{BTreeMap, BTreeSet};
use std::ops::Bound;

use tracing::{info, warn};
use xp_runtime::clock::UnixMillis;
use xp_runtime::ids::{ExperimentId, NodeId, ObjectId, TrialId, WorkerKey};
use xp_runtime::protocol::{
    CheckpointCursor, CheckpointFile, CheckpointStatus, CheckpointsPage, HeadCommand, HeldObject,
    MAX_CHECKPOINTS_PER_PAGE, NodeState, ObjectSource, ResumeFrom,
};

use self::retention::{CheckpointRecord, retain};
use super::{CoreError, HeadCore};

/// The most files a checkpoint may name (a node refuses more when it takes one).
const MAX_CHECKPOINT_FILES: usize = 10_000;
/// A page of checkpoints ends early once their estimated size passes this, as
/// the listings of `pages` do: a checkpoint may name 10,000 files.
const MAX_CHECKPOINT_PAGE_BYTES: usize = 4 << 20;

/// What filing a checkpoint changed.
#[derive(Debug, PartialEq, Eq)]
struct Filed {
    /// It was not known before (a report resent after a reconnect is).
    new: bool,
    /// It is among the checkpoints kept.
    kept: bool,
    /// The objects the kept checkpoints named before, one name per checkpoint.
    before: Vec<ObjectId>,
    /// The objects they name now.
    after: Vec<ObjectId>,
}

/// Whether a reported checkpoint may be recorded: rank 0's, with a
/// well-formed manifest (some files, not too many, safe names).
fn is_recordable(key: WorkerKey, files: &[CheckpointFile]) -> bool {
    if key.rank != 0 {
        warn!(worker = %key, "checkpoint from a rank other than 0 ignored");
        return false;
    }
    let well_formed = !files.is_empty()
        && files.len() <= MAX_CHECKPOINT_FILES
        && files
            .iter()
            .all(|file| xp_runtime::protocol::is_safe_checkpoint_name(&file.name));
    if !well_formed {
        warn!(worker = %key, "malformed checkpoint manifest ignored");
    }
    well_formed
}

/// `record` filed among a trial's `checkpoints` under `retention`: a repeated
/// report (resent after a reconnect) replaces, never duplicates; age is
/// (attempt, step), not arrival, since a resent report may come after newer
/// ones. Returns what is kept and what changed.
fn filed(
    mut checkpoints: Vec<CheckpointRecord>,
    record: CheckpointRecord,
    retention: xp_runtime::spec::CheckpointRetention,
    mode: Option<xp_runtime::spec::Mode>,
) -> (Vec<CheckpointRecord>, Filed) {
    let names = |kept: &[CheckpointRecord]| -> Vec<ObjectId> {
        kept.iter().flat_map(CheckpointRecord::objects).collect()
    };
    let before = names(&checkpoints);
    let held = checkpoints.len();
    let (attempt, step) = (record.attempt, record.step);
    checkpoints.retain(|old| !(old.attempt == attempt && old.step == step));
    let new = checkpoints.len() == held;
    checkpoints.push(record);
    checkpoints.sort_by_key(|checkpoint| (checkpoint.attempt, checkpoint.step));
    let (kept, _dropped) = retain(checkpoints, retention, mode);
    let filed = Filed {
        new,
        kept: kept
            .iter()
            .any(|checkpoint| checkpoint.attempt == attempt && checkpoint.step == step),
        before,
        after: names(&kept),
    };
    (kept, filed)
}

impl HeadCore {
    /// A node stored a checkpoint of one of its workers: it is kept under the
    /// experiment's retention, the objects it no longer keeps are dropped, the
    /// policy hears of it (a preemption now loses less), and a copy goes to a
    /// second node.
    pub(super) fn record_checkpoint(
        &mut self,
        now: UnixMillis,
        key: WorkerKey,
        node_id: NodeId,
        step: u64,
        files: Vec<CheckpointFile>,
        backup: Option<String>,
    ) {
        if !is_recordable(key, &files) {
            return;
        }
        for file in &files {
            self.objects.node_holds(node_id, file.object);
        }
        // Sizes are what a node reported: the sum saturates rather than overflow.
        let bytes = files
            .iter()
            .fold(0u64, |total, file| total.saturating_add(file.size));
        let count = files.len();
        let Some(filed) = self.file_checkpoint(now, key, step, files, backup) else {
            return;
        };
        if filed.new {
            self.outbox.tally().checkpoints += 1;
            let tally = self.outbox.tally();
            tally.checkpoint_bytes = tally.checkpoint_bytes.saturating_add(bytes);
        }
        let released = self.objects.rekeep(filed.before, filed.after);
        self.drop_everywhere(key.trial, released);
        self.note_checkpoint_to_policy(now, key);
        info!(trial = %key.trial, step, files = count, bytes, "checkpoint recorded");
        let trial = self.book.trial(key.trial);
        let (state, attempt) = (trial.state, trial.attempts.len() as u32);
        self.push_event(
            now,
            key.trial,
            state,
            attempt,
            format!(
                "checkpoint at step {step} stored on node {node_id} ({count} files, {bytes} bytes)"
            ),
        );
        if filed.kept {
            let checkpoint = replication::CheckpointKey {
                trial: key.trial,
                attempt: key.attempt,
                step,
            };
            self.replicate(checkpoint, node_id);
        }
    }

    /// Files the checkpoint among the trial's under the experiment's retention;
    /// `None` for an unknown trial.
    fn file_checkpoint(
        &mut self,
        now: UnixMillis,
        key: WorkerKey,
        step: u64,
        files: Vec<CheckpointFile>,
        backup: Option<String>,
    ) -> Option<Filed> {
        let spec = self.book.spec(key.trial.experiment);
        let retention = spec.checkpoints.unwrap_or_default();
        let ranked = spec
            .search
            .metric
            .clone()
            .map(|metric| (metric, spec.search.mode));
        let trial = self.book.trial_mut(key.trial)?;
        let metric = ranked
            .as_ref()
            .and_then(|(name, _)| trial.metrics.get(name.as_str()).copied())
            // A checkpoint whose metric is NaN is never the best one kept.
            .filter(|value| value.is_finite());
        let record = CheckpointRecord {
            attempt: key.attempt,
            step,
            files,
            at: now,
            metric,
            backup,
        };
        let checkpoints = std::mem::take(&mut trial.checkpoints);
        let (kept, filed) = filed(checkpoints, record, retention, ranked.map(|(_, mode)| mode));
        if filed.new {
            // A new checkpoint is progress: the bound on requeues is for a trial
            // that kills its nodes without getting anywhere, not for one drained
            // at every Slurm job's end and resumed from its checkpoint each time.
            trial.requeues = 0;
        }
        trial.checkpoints = kept;
        Some(filed)
    }

    /// A checkpoint of the live run: a preemption now loses only the work
    /// since, which the policy weighs when it chooses victims.
    fn note_checkpoint_to_policy(&mut self, now: UnixMillis, key: WorkerKey) {
        let live = self
            .book
            .trial(key.trial)
            .attempts
            .last()
            .is_some_and(|live| live.number == key.attempt && live.is_live());
        if live && self.placement.policy_mut().note_checkpoint(key.trial, now) {
            // A cheap victim now: a waiting trial may preempt it.
            self.placement.mark_stale();
        }
    }

    /// Tells every node holding one of `trial`'s retired `objects` to let it go.
    pub(super) fn drop_everywhere(&mut self, trial: TrialId, objects: BTreeSet<ObjectId>) {
        let mut per_node: BTreeMap<NodeId, Vec<ObjectId>> = BTreeMap::new();
        for id in objects {
            let holders: Vec<NodeId> = self.objects.directory().holders(id).collect();
            for node in holders {
                per_node.entry(node).or_default().push(id);
                self.objects.node_dropped(node, id);
            }
        }
        for (node, objects) in per_node {
            self.outbox.send(
                node,
                HeadCommand::DropObjects {
                    trial: Some(trial),
                    objects,
                },
            );
        }
    }

    /// Settles what a (re)registering node holds against what the head keeps.
    /// Pins again what kept checkpoints name (a restarted node forgot its pins),
    /// and lets go of what the node missed being told while it was away: objects of
    /// retired checkpoints, claims of trials that ended and of driver sessions
    /// that are gone, and objects whose claims a restart erased.
    pub(super) fn reconcile_objects(&mut self, node: NodeId, held: &[HeldObject]) {
        self.resend_replications_to(node);
        if held.is_empty() {
            return;
        }
        let held_ids: BTreeSet<ObjectId> = held.iter().map(|object| object.id).collect();
        let mut named: BTreeMap<ObjectId, BTreeSet<TrialId>> = BTreeMap::new();
        for trial in self.book.trials() {
            // A trial's output files stay pinned like its kept checkpoints:
            // pipelines hand them to later stages and reuse them.
            for file in trial
                .checkpoints
                .iter()
                .flat_map(|checkpoint| &checkpoint.files)
                .chain(&trial.outputs)
            {
                if held_ids.contains(&file.object) {
                    named.entry(file.object).or_default().insert(trial.id);
                }
            }
        }
        let trial_live = |trial: &TrialId| {
            self.book
                .get_trial(*trial)
                .is_some_and(|record| !record.state.is_terminal())
        };
        let mut pins: BTreeMap<TrialId, Vec<ObjectId>> = BTreeMap::new();
        let mut drops: BTreeMap<Option<TrialId>, Vec<ObjectId>> = BTreeMap::new();
        let mut ended: BTreeSet<TrialId> = BTreeSet::new();
        let mut gone: BTreeSet<String> = BTreeSet::new();
        for object in held {
            if let Some(trials) = named.get(&object.id) {
                for trial in trials {
                    pins.entry(*trial).or_default().push(object.id);
                }
                continue;
            }
            ended.extend(object.trials.iter().filter(|trial| !trial_live(trial)));
            gone.extend(
                object
                    .drivers
                    .iter()
                    .filter(|session| !self.drivers.is_live(session))
                    .cloned(),
            );
            let claimed = object.trials.iter().any(trial_live)
                || object
                    .drivers
                    .iter()
                    .any(|session| self.drivers.is_live(session));
            let forgotten = object.trials.is_empty() && object.drivers.is_empty();
            if !claimed && (object.pinned || forgotten) {
                drops
                    .entry(object.trials.first().copied())
                    .or_default()
                    .push(object.id);
            }
        }
        for (trial, objects) in pins {
            self.outbox.send(node, HeadCommand::Pin { trial, objects });
        }
        for trial in ended {
            self.outbox.send(node, HeadCommand::ReleaseTrial { trial });
        }
        for session in gone {
            self.outbox
                .send(node, HeadCommand::ReleaseDriver { session });
        }
        for (trial, objects) in drops {
            for id in &objects {
                self.objects.node_dropped(node, *id);
            }
            self.outbox
                .send(node, HeadCommand::DropObjects { trial, objects });
        }
    }

    fn object_source(&self, node: NodeId) -> Option<ObjectSource> {
        let endpoint = self.objects.directory().endpoint(node)?;
        let record = self.membership.node(node)?;
        Some(ObjectSource {
            node,
            host: record.address.clone(),
            endpoint,
        })
    }

    /// The live nodes holding any of `objects`, as fetching nodes reach them.
    pub(super) fn sources_of(&self, objects: impl Iterator<Item = ObjectId>) -> Vec<ObjectSource> {
        let mut nodes: Vec<NodeId> = Vec::new();
        for id in objects {
            for node in self.objects.directory().holders(id) {
                if self.node_usable(node) && !nodes.contains(&node) {
                    nodes.push(node);
                }
            }
        }
        nodes
            .into_iter()
            .filter_map(|node| self.object_source(node))
            .collect()
    }

    fn node_usable(&self, node: NodeId) -> bool {
        self.membership
            .node(node)
            .is_some_and(|record| record.state != NodeState::Lost)
    }

    /// The newest checkpoint of `trial` whose objects some live node still holds,
    /// with the nodes to fetch it from (those holding all of it first).
    pub(super) fn resume_point(&self, trial: TrialId) -> Option<ResumeFrom> {
        let record = self.book.get_trial(trial)?;
        let checkpoint = record.checkpoints.iter().rev().find(|checkpoint| {
            checkpoint.backup.is_some()
                || self
                    .objects
                    .directory()
                    .is_available(checkpoint, |node| self.node_usable(node))
        })?;
        let mut sources: Vec<NodeId> = self
            .objects
            .directory()
            .complete_holders(checkpoint, |node| self.node_usable(node));
        for id in checkpoint.objects() {
            for node in self.objects.directory().holders(id) {
                if self.node_usable(node) && !sources.contains(&node) {
                    sources.push(node);
                }
            }
        }
        Some(ResumeFrom {
            step: checkpoint.step,
            attempt: checkpoint.attempt,
            files: checkpoint.files.clone(),
            sources: sources
                .into_iter()
                .filter_map(|node| self.object_source(node))
                .collect(),
            backup: checkpoint.backup.clone(),
        })
    }

    /// The live nodes holding `object`, for a node fetching it.
    pub fn locate(&self, object: ObjectId) -> Vec<ObjectSource> {
        self.objects
            .directory()
            .holders(object)
            .filter(|node| self.node_usable(*node))
            .filter_map(|node| self.object_source(node))
            .collect()
    }

    /// Ready nodes that serve objects, the one holding the fewest objects first,
    /// so that drivers' objects spread; `session` is the asking driver's, whose
    /// objects are kept until it goes.
    pub fn store_targets(&mut self, session: &str) -> Vec<ObjectSource> {
        self.drivers.storing(session);
        let mut nodes: Vec<(usize, NodeId)> = self
            .membership
            .nodes()
            .filter(|node| node.state == NodeState::Ready)
            .map(|node| (self.objects.directory().held_count(node.id), node.id))
            .collect();
        nodes.sort();
        nodes
            .into_iter()
            .filter_map(|(_, node)| self.object_source(node))
            .collect()
    }

    /// Records that the driver session `session` submitted `experiment`, so its
    /// objects are shared with that experiment's trials while it is connected.
    pub fn record_driver_experiment(&mut self, session: &str, experiment: ExperimentId) {
        self.drivers.submitted(session, experiment);
    }

    /// Those of `sessions` that submitted `experiment` and are still connected:
    /// the drivers whose objects its trials may read.
    pub fn sharing_drivers(&self, experiment: ExperimentId, sessions: Vec<String>) -> Vec<String> {
        sessions
            .into_iter()
            .filter(|session| self.drivers.shares_with(session, experiment))
            .collect()
    }

    /// Tells every live node that the driver session `session` ended.
    pub fn release_driver_objects(&mut self, session: &str) {
        self.drivers.end(session);
        self.tell_live_nodes(|| HeadCommand::ReleaseDriver {
            session: session.to_owned(),
        });
    }

    /// Tells the live nodes that may hold what `trial` owns that it ended, so
    /// that what its workers stored (and no pin keeps) is collected: the nodes
    /// its workers ran on (a worker stores on its own node) and those holding
    /// its checkpoints' objects (replicas). Telling every node cost nodes ×
    /// trial ends commands, which a 1,000-node soak could not carry; a node
    /// that was away when the trial ended is told when it registers again.
    pub(super) fn release_trial_objects(&mut self, trial: TrialId) {
        let record = self.book.trial(trial);
        let mut nodes: BTreeSet<NodeId> = record
            .attempts
            .iter()
            .flat_map(|attempt| attempt.workers.iter().map(|worker| worker.node))
            .collect();
        let directory = self.objects.directory();
        for kept in &record.checkpoints {
            for id in kept.objects() {
                nodes.extend(directory.holders(id));
            }
        }
        for node in nodes {
            if self.membership.is_live(node) {
                self.outbox.send(node, HeadCommand::ReleaseTrial { trial });
            }
        }
    }

    /// Sends a command to every node not judged lost: an owner's objects may be
    /// on any of them.
    pub(super) fn tell_live_nodes(&mut self, command: impl Fn() -> HeadCommand) {
        let nodes: Vec<NodeId> = self.membership.live_nodes().collect();
        for node in nodes {
            self.outbox.send(node, command());
        }
    }

    /// Whether `trial` should not start yet: the head is within its restart
    /// grace and the newest checkpoint is not (yet) held by any node that came
    /// back, so resuming now would redo work that a returning node holds.
    pub(super) fn awaiting_newest_checkpoint(&self, now: UnixMillis, trial: TrialId) -> bool {
        if !self.in_restart_grace(now) {
            return false;
        }
        let Some(newest) = self
            .book
            .get_trial(trial)
            .and_then(|record| record.checkpoints.last())
        else {
            return false;
        };
        newest.backup.is_none()
            && !self
                .objects
                .directory()
                .is_available(newest, |node| self.node_usable(node))
    }

    /// The checkpoints kept for an experiment's trials, oldest first per trial:
    /// the whole list, which tests compare pages with.
    #[cfg(test)]
    pub(crate) fn checkpoints(&self, experiment: &str) -> Result<Vec<CheckpointStatus>, CoreError> {
        let id: ExperimentId = self.resolve_experiment(experiment)?;
        Ok(self
            .book
            .trials_of(id)
            .flat_map(|(id, trial)| self.checkpoint_statuses(*id, &trial.checkpoints))
            .collect())
    }

    /// One page of the checkpoints kept for an experiment's trials, in the
    /// order of trial, attempt and step, strictly after `after`: at most
    /// `limit` (and [`MAX_CHECKPOINTS_PER_PAGE`]), and no more once their
    /// estimated size passes [`MAX_CHECKPOINT_PAGE_BYTES`]. Walks the
    /// trials from the cursor's on, never the whole experiment.
    pub fn checkpoints_page(
        &self,
        experiment: &str,
        after: Option<CheckpointCursor>,
        limit: u32,
    ) -> Result<CheckpointsPage, CoreError> {
        let id: ExperimentId = self.resolve_experiment(experiment)?;
        let limit = limit.clamp(1, MAX_CHECKPOINTS_PER_PAGE) as usize;
        let first = TrialId {
            experiment: id,
            index: 0,
        };
        let last = TrialId {
            experiment: id,
            index: u32::MAX,
        };
        // A cursor outside the experiment starts it from its first trial or
        // ends it, by where it falls.
        let start = after.map_or(first, |cursor| cursor.trial.max(first));
        let mut page = CheckpointsPage {
            checkpoints: Vec::new(),
            next: None,
        };
        if start > last {
            return Ok(page);
        }
        let mut bytes = 0;
        for trial in self
            .book
            .trials_between(Bound::Included(start), Bound::Included(last))
        {
            let kept = trial
                .checkpoints
                .iter()
                .filter(|kept| after.is_none_or(|cursor| cursor < cursor_of(trial.id, kept)));
            for status in self.checkpoint_statuses(trial.id, kept) {
                if page.checkpoints.len() >= limit || bytes >= MAX_CHECKPOINT_PAGE_BYTES {
                    page.next = page.checkpoints.last().map(|last| CheckpointCursor {
                        trial: last.trial,
                        attempt: last.attempt,
                        step: last.step,
                    });
                    return Ok(page);
                }
                bytes += estimated_bytes(&status);
                page.checkpoints.push(status);
            }
        }
        Ok(page)
    }

    /// The checkpoints one trial keeps, as [`HeadCore::checkpoints`] lists them.
    pub fn trial_checkpoints(&self, trial: TrialId) -> Result<Vec<CheckpointStatus>, CoreError> {
        self.team_of_trial(trial)?;
        let kept = &self.book.trial(trial).checkpoints;
        Ok(self.checkpoint_statuses(trial, kept).collect())
    }

    /// `trial`'s `kept` checkpoints with where their copies are.
    fn checkpoint_statuses<'a>(
        &'a self,
        trial: TrialId,
        kept: impl IntoIterator<Item = &'a CheckpointRecord> + 'a,
    ) -> impl Iterator<Item = CheckpointStatus> + 'a {
        kept.into_iter().map(move |checkpoint| {
            let replicas = self
                .objects
                .directory()
                .complete_holders(checkpoint, |node| self.node_usable(node));
            let key = replication::CheckpointKey {
                trial,
                attempt: checkpoint.attempt,
                step: checkpoint.step,
            };
            CheckpointStatus {
                trial,
                attempt: checkpoint.attempt,
                step: checkpoint.step,
                at: checkpoint.at,
                bytes: checkpoint.bytes(),
                files: checkpoint.files.clone(),
                metric: checkpoint.metric,
                unreplicated: self.unreplicated_reason(
                    key,
                    replicas.len(),
                    checkpoint.backup.is_some(),
                ),
                replicas,
                backup: checkpoint.backup.clone(),
            }
        })
    }
}

/// A kept checkpoint's place in the order of an experiment's pages.
fn cursor_of(trial: TrialId, kept: &CheckpointRecord) -> CheckpointCursor {
    CheckpointCursor {
        trial,
        attempt: kept.attempt,
        step: kept.step,
    }
}

/// A rough upper estimate of a checkpoint's size on the wire, for
/// [`MAX_CHECKPOINT_PAGE_BYTES`].
fn estimated_bytes(status: &CheckpointStatus) -> usize {
    let files: usize = status.files.iter().map(|file| file.name.len() + 48).sum();
    let texts = status.backup.as_ref().map_or(0, String::len)
        + status.unreplicated.as_ref().map_or(0, String::len);
    128 + files + 24 * status.replicas.len() + texts
}

#[cfg(test)]
mod tests {
    use xp_runtime::ids::{ExperimentId, ObjectId};
    use xp_runtime::protocol::CheckpointFile;
    use xp_runtime::spec::CheckpointRetention;

    use super::{CheckpointRecord, filed};
    use crate::{CoreConfig, HeadCore, LoadedState};

    fn checkpoint(attempt: u32, step: u64, object: u8) -> CheckpointRecord {
        CheckpointRecord {
            attempt,
            step,
            files: vec![CheckpointFile {
                name: "model.bin".to_owned(),
                object: ObjectId([object; 32]),
                size: 1,
            }],
            at: 0,
            metric: None,
            backup: None,
        }
    }

    #[test]
    fn a_checkpoint_is_filed_by_age_once_and_retention_keeps_the_newest() {
        let keep_two = CheckpointRetention {
            keep_last: 2,
            keep_best: 0,
        };
        let (kept, first) = filed(Vec::new(), checkpoint(1, 10, 1), keep_two, None);
        assert!(first.new && first.kept);
        assert_eq!((first.before.len(), first.after.len()), (0, 1));
        let (kept, second) = filed(kept, checkpoint(1, 20, 2), keep_two, None);
        assert!(second.new && second.kept);
        // The report of step 10 again, after a reconnect: replaced, not added.
        let (kept, resent) = filed(kept, checkpoint(1, 10, 1), keep_two, None);
        assert!(!resent.new && resent.kept);
        assert_eq!(kept.len(), 2);
        // An older checkpoint arriving late is filed by age and retained out.
        let (kept, late) = filed(kept, checkpoint(1, 5, 3), keep_two, None);
        assert!(late.new && !late.kept);
        let steps: Vec<u64> = kept.iter().map(|checkpoint| checkpoint.step).collect();
        assert_eq!(steps, [10, 20]);
        assert_eq!(late.before, late.after, "what is kept did not change");
    }

    #[test]
    fn a_driver_shares_its_objects_with_what_it_submitted_while_connected() {
        let mut core = HeadCore::restore(CoreConfig::default(), LoadedState::default(), 0);
        let ours: ExperimentId = "3f2a9c0d11b2e4f7".parse().expect("experiment");
        let theirs: ExperimentId = "9e8d7c6b5a493827".parse().expect("experiment");
        let asked = || vec!["driver-a".to_owned(), "driver-b".to_owned()];
        assert!(core.sharing_drivers(ours, asked()).is_empty());
        core.record_driver_experiment("driver-a", ours);
        core.record_driver_experiment("driver-b", theirs);
        assert_eq!(core.sharing_drivers(ours, asked()), ["driver-a"]);
        assert_eq!(core.sharing_drivers(theirs, asked()), ["driver-b"]);
        // Only the sessions asked about are ever named.
        assert!(
            core.sharing_drivers(ours, vec!["driver-b".to_owned()])
                .is_empty()
        );
        core.release_driver_objects("driver-a");
        assert!(core.sharing_drivers(ours, asked()).is_empty());
    }
}
