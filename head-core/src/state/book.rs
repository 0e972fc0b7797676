//! The experiments and trials book: every experiment with its parsed spec,
//! every trial with its attempts, the number of the newest trial event, and
//! the succeeded trials new ones may reuse. Events themselves are persisted
//! and read back from the store on demand: a head that ran a million trials
//! would otherwise hold five million of them.
//!
//! Not here: what a trial's state may change to and what follows a change
//! (`attempts`); the book stores, numbers and remembers what changed.
//!
//! Invariants: every experiment has its spec and every trial its experiment
//! (the panicking lookups `experiment`, `spec` and `trial` rely on it);
//! events are numbered from 1 without gaps, in the order they happened; every
//! experiment or trial handed out for change (`experiment_mut`, `trial_mut`,
//! `add_*`) is handed out once for persisting (`take_records`), and nothing
//! restored is (`restore_*`); every trial that is unfinished or has a worker
//! holding resources is among the active trials (`active_trials`), so what
//! looks only at live work need not walk a million finished trials; and the
//! others are counted by experiment, queue override and state
//! (`inactive_counts`); the queued trials are indexed by when they were
//! queued (`queued`).

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::ops::Deref;
use std::sync::Arc;

use xp_runtime::clock::UnixMillis;
use xp_runtime::ids::{ExperimentId, TrialId};
use xp_runtime::protocol::{TrialEvent, TrialState};
use xp_runtime::spec::ExperimentSpec;

use crate::{ExperimentRecord, Record, TrialRecord};

mod catalog;
mod queued;

pub(crate) use self::catalog::Catalog;
pub(crate) use self::queued::QueuedIndex;

/// Experiments and trials, and the numbering of their events.
#[derive(Debug)]
pub(crate) struct Book {
    /// Experiments, specs and trials; the book's reads are its (`Deref`).
    catalog: Catalog,
    next_event_seq: u64,
    /// Succeeded trials that ran themselves, by trial identity: what new
    /// trials may reuse.
    reusable: BTreeMap<[u8; 32], TrialId>,
    dirty_experiments: BTreeSet<ExperimentId>,
    dirty_trials: BTreeSet<TrialId>,
    /// A superset of the trials unfinished or holding resources: a trial
    /// enters when created, restored so or handed out for change, and leaves
    /// when handed out for persisting finished and holding nothing.
    active: BTreeSet<TrialId>,
    /// How many trials not among the active ones there are, by experiment,
    /// queue override and state: what `/metrics` counts without walking them.
    inactive: BTreeMap<InactiveKey, u64>,
    /// The queued trials by when they were queued: a trial leaves when
    /// handed out for change and comes back when handed out for persisting.
    queued: QueuedIndex,
    /// Experiments that may have pending trials (trials are pending only
    /// from their creation until admitted): what admission looks at, instead
    /// of every trial.
    with_pending: BTreeSet<ExperimentId>,
    /// Each experiment's revision: bumped whenever it or one of its trials is
    /// restored, added or handed out for change, so a summary kept at one
    /// revision is known to be current while it stands.
    revisions: Revisions,
}

/// Revisions of experiments, from one counter (so an experiment never
/// returns to a revision it had).
#[derive(Debug, Default)]
struct Revisions {
    by_experiment: HashMap<ExperimentId, u64>,
    last: u64,
}

impl Revisions {
    fn bump(&mut self, experiment: ExperimentId) {
        self.last += 1;
        self.by_experiment.insert(experiment, self.last);
    }
}

impl Default for Book {
    fn default() -> Self {
        Self {
            catalog: Catalog::default(),
            next_event_seq: 1,
            reusable: BTreeMap::new(),
            dirty_experiments: BTreeSet::new(),
            dirty_trials: BTreeSet::new(),
            active: BTreeSet::new(),
            inactive: BTreeMap::new(),
            queued: QueuedIndex::default(),
            with_pending: BTreeSet::new(),
            revisions: Revisions::default(),
        }
    }
}

/// What inactive trials are counted by: their experiment, queue override
/// and state.
pub(crate) type InactiveKey = (ExperimentId, Option<String>, &'static str);

fn inactive_key(trial: &TrialRecord) -> InactiveKey {
    (
        trial.id.experiment,
        trial.queue_override.clone(),
        trial.state.as_str(),
    )
}

/// One trial fewer under `key`.
fn uncount(counts: &mut BTreeMap<InactiveKey, u64>, key: InactiveKey) {
    if let Some(count) = counts.get_mut(&key) {
        *count -= 1;
        if *count == 0 {
            counts.remove(&key);
        }
    }
}

/// The map of `records` by id (of two records of one trial, the later), its
/// leaves full. Inserted in order, the map's leaves split in half and stay
/// half full (40 MB more at a million trials); every other record first,
/// then the rest, fills the half-full leaves without splitting them again.
fn packed(mut records: Vec<Arc<TrialRecord>>) -> imbl::OrdMap<TrialId, Arc<TrialRecord>> {
    if !records.is_sorted_by_key(|record| record.id) {
        // Stable: two records of one trial stay in their order.
        records.sort_by_key(|record| record.id);
    }
    if records.windows(2).any(|pair| pair[0].id == pair[1].id) {
        records.reverse();
        records.dedup_by_key(|record| record.id);
        records.reverse();
    }
    let mut trials = imbl::OrdMap::new();
    let (even, odd) = (records.iter().step_by(2), records.iter().skip(1).step_by(2));
    for record in even.chain(odd) {
        trials.insert(record.id, Arc::clone(record));
    }
    trials
}

/// Whether `trial` is unfinished or one of its workers holds resources.
fn is_active(trial: &TrialRecord) -> bool {
    !trial.state.is_terminal()
        || trial
            .attempts
            .iter()
            .flat_map(|attempt| &attempt.workers)
            .any(|worker| worker.state.holds_resources())
}

impl Deref for Book {
    type Target = Catalog;

    /// The book's reads: what a copy of it ([`Book::catalog`]) answers too.
    fn deref(&self) -> &Catalog {
        &self.catalog
    }
}

impl Book {
    /// A copy of the experiments, specs and trials as they are now, for a
    /// read off the actor: a few reference counts, whatever their size.
    pub(crate) fn catalog(&self) -> Catalog {
        self.catalog.clone()
    }

    /// Takes back a stored experiment and its spec, not to be persisted again.
    pub(crate) fn restore_experiment(&mut self, record: ExperimentRecord, spec: ExperimentSpec) {
        self.revisions.bump(record.id);
        self.catalog.specs.insert(record.id, spec);
        self.catalog.experiments.insert(record.id, record);
    }

    /// Takes back stored trials, not to be persisted again. Into an empty
    /// book (a start) the counts are made in one pass and the map at once.
    pub(crate) fn restore_trials(&mut self, records: Vec<Arc<TrialRecord>>) {
        if !self.catalog.trials.is_empty() {
            records
                .into_iter()
                .for_each(|record| self.restore_trial(record));
            return;
        }
        for record in &records {
            if record.state == TrialState::Pending {
                self.with_pending.insert(record.id.experiment);
            }
            self.revisions.bump(record.id.experiment);
            self.queued.add(record);
            if is_active(record) {
                self.active.insert(record.id);
            } else {
                *self.inactive.entry(inactive_key(record)).or_default() += 1;
            }
        }
        self.catalog.trials = packed(records);
        if self.catalog.trials.len()
            < self.active.len() + self.inactive.values().sum::<u64>() as usize
        {
            // Two records of one trial: count them again as one by one.
            let records: Vec<Arc<TrialRecord>> = std::mem::take(&mut self.catalog.trials)
                .into_iter()
                .map(|(_, record)| record)
                .collect();
            self.active.clear();
            self.inactive.clear();
            self.queued = QueuedIndex::default();
            records
                .into_iter()
                .for_each(|record| self.restore_trial(record));
        }
    }

    /// Takes back a stored trial, not to be persisted again.
    pub(crate) fn restore_trial(&mut self, record: Arc<TrialRecord>) {
        if record.state == TrialState::Pending {
            self.with_pending.insert(record.id.experiment);
        }
        self.revisions.bump(record.id.experiment);
        // A record that replaces one (none does today) keeps the counts exact.
        let listed = self.active.contains(&record.id);
        if let Some(old) = self.catalog.trials.get(&record.id) {
            self.queued.remove(old);
            if !listed {
                uncount(&mut self.inactive, inactive_key(old));
            }
        }
        self.queued.add(&record);
        if listed || is_active(&record) {
            self.active.insert(record.id);
        } else {
            *self.inactive.entry(inactive_key(&record)).or_default() += 1;
        }
        self.catalog.trials.insert(record.id, record);
    }

    /// `experiment`'s revision: it and its trials are as they were while it
    /// stands (0 for an experiment the book never held).
    pub(crate) fn revision(&self, experiment: ExperimentId) -> u64 {
        self.revisions
            .by_experiment
            .get(&experiment)
            .copied()
            .unwrap_or(0)
    }

    /// Takes back the number of the newest stored event: numbering goes on
    /// after it.
    pub(crate) fn restore_last_event_seq(&mut self, seq: u64) {
        self.next_event_seq = self.next_event_seq.max(seq + 1);
    }

    /// A new experiment with its spec.
    pub(crate) fn add_experiment(&mut self, record: ExperimentRecord, spec: ExperimentSpec) {
        self.dirty_experiments.insert(record.id);
        self.restore_experiment(record, spec);
    }

    /// A new trial.
    pub(crate) fn add_trial(&mut self, record: TrialRecord) {
        self.dirty_trials.insert(record.id);
        self.restore_trial(Arc::new(record));
    }

    /// The experiments that may have pending trials, handed out: admission
    /// gives back ([`Book::note_pending`]) those it leaves some pending in.
    pub(crate) fn take_with_pending(&mut self) -> BTreeSet<ExperimentId> {
        std::mem::take(&mut self.with_pending)
    }

    /// `experiment` has pending trials still.
    pub(crate) fn note_pending(&mut self, experiment: ExperimentId) {
        self.with_pending.insert(experiment);
    }

    /// Whether `experiment` may have pending trials (for the invariants).
    pub(crate) fn may_have_pending(&self, experiment: ExperimentId) -> bool {
        self.with_pending.contains(&experiment)
    }

    /// An experiment to change; it is persisted.
    pub(crate) fn experiment_mut(&mut self, id: ExperimentId) -> Option<&mut ExperimentRecord> {
        let record = self.catalog.experiments.get_mut(&id)?;
        self.dirty_experiments.insert(id);
        self.revisions.bump(id);
        Some(record)
    }

    /// A trial to change; it is persisted.
    pub(crate) fn trial_mut(&mut self, id: TrialId) -> Option<&mut TrialRecord> {
        let record = self.catalog.trials.get_mut(&id)?;
        self.dirty_trials.insert(id);
        self.queued.remove(record);
        if self.active.insert(id) {
            uncount(&mut self.inactive, inactive_key(record));
        }
        self.revisions.bump(id.experiment);
        // Copied only while the registry still holds the committed version.
        Some(Arc::make_mut(record))
    }

    /// The queued trials by when they were queued, copied for a read off
    /// the actor, and the trials changed since they were last indexed (those
    /// the index may lack or hold as they were).
    pub(crate) fn queued_index(&self) -> (QueuedIndex, BTreeSet<TrialId>) {
        (self.queued.clone(), self.dirty_trials.clone())
    }

    /// Every trial unfinished or holding resources, and perhaps a few others
    /// (changed since the last `take_records`), in id order.
    pub(crate) fn active_trials(&self) -> impl Iterator<Item = &TrialRecord> {
        self.active
            .iter()
            .filter_map(|id| self.catalog.trials.get(id).map(Arc::as_ref))
    }

    /// How many trials not among [`Book::active_trials`] there are, by
    /// experiment, queue override and state.
    pub(crate) fn inactive_counts(&self) -> impl Iterator<Item = (&InactiveKey, u64)> {
        self.inactive.iter().map(|(key, count)| (key, *count))
    }

    /// How many of `experiment`'s trials are in a state `wanted` takes (by
    /// its name): the inactive ones from their counts, the active ones looked
    /// at, so a listing's total walks none of a hundred thousand finished
    /// trials.
    pub(crate) fn count_trials_of(
        &self,
        experiment: ExperimentId,
        wanted: impl Fn(&str) -> bool,
    ) -> u64 {
        let inactive: u64 = self
            .inactive
            .range((experiment, None, "")..)
            .take_while(|((of, _, _), _)| *of == experiment)
            .filter(|((_, _, state), _)| wanted(state))
            .map(|(_, count)| *count)
            .sum();
        let active = self
            .active
            .range(catalog::trial_range(experiment))
            .filter_map(|id| self.catalog.get_trial(*id))
            .filter(|trial| wanted(trial.state.as_str()))
            .count();
        inactive + active as u64
    }

    /// Panics if a trial unfinished or holding resources is not among the
    /// active trials, or the others are not counted as they are.
    pub(crate) fn check_active_trials(&self) {
        let mut inactive: BTreeMap<InactiveKey, u64> = BTreeMap::new();
        for trial in self.catalog.trials() {
            assert!(
                !is_active(trial) || self.active.contains(&trial.id),
                "trial {} is unfinished or holds resources but is not listed active",
                trial.id
            );
            if !self.active.contains(&trial.id) {
                *inactive.entry(inactive_key(trial)).or_default() += 1;
            }
        }
        assert_eq!(inactive, self.inactive, "the inactive trials' counts");
        self.check_queued();
        for experiment in self.catalog.experiment_ids() {
            assert_eq!(
                self.count_trials_of(experiment, |_| true),
                self.catalog.trials_of(experiment).count() as u64,
                "the count of {experiment}'s trials"
            );
        }
    }

    /// Panics if a trial not held out for change is queued but not indexed
    /// under when it was queued, or indexed but not queued, or the counts
    /// are not those of the index.
    fn check_queued(&self) {
        let mut indexed = 0;
        let mut per_experiment: BTreeMap<ExperimentId, u64> = BTreeMap::new();
        for trial in self.catalog.trials() {
            if self.queued.contains(trial) {
                indexed += 1;
                *per_experiment.entry(trial.id.experiment).or_default() += 1;
            }
            if self.dirty_trials.contains(&trial.id) {
                continue;
            }
            assert_eq!(
                self.queued.contains(trial),
                trial.state == TrialState::Queued,
                "trial {} ({:?}) and the queued index",
                trial.id,
                trial.state
            );
        }
        assert_eq!(
            indexed,
            self.queued.len(),
            "the index holds a trial as it was"
        );
        for experiment in self.catalog.experiment_ids() {
            let counted = per_experiment.get(&experiment).copied().unwrap_or(0);
            assert_eq!(
                self.queued.count_of(experiment),
                counted,
                "{experiment}'s queued count"
            );
        }
    }

    /// Numbers an event; returns it, for persisting.
    pub(crate) fn push_event(
        &mut self,
        at: UnixMillis,
        trial: TrialId,
        state: TrialState,
        attempt: u32,
        reason: String,
    ) -> TrialEvent {
        let event = TrialEvent {
            seq: self.next_event_seq,
            at,
            trial,
            state,
            attempt,
            reason,
        };
        self.next_event_seq += 1;
        event
    }

    /// The number of the newest event (0 before the first).
    pub(crate) fn last_event_seq(&self) -> u64 {
        self.next_event_seq - 1
    }

    /// A succeeded trial that ran itself with `identity`, whose result a new
    /// trial may reuse.
    pub(crate) fn reusable(&self, identity: &[u8; 32]) -> Option<TrialId> {
        self.reusable.get(identity).copied()
    }

    /// `trial` succeeded by running with `identity`; the first one stays the source.
    pub(crate) fn remember_success(&mut self, identity: [u8; 32], trial: TrialId) {
        self.reusable.entry(identity).or_insert(trial);
    }

    /// Takes back stored successes: of trials that ran with one identity, the
    /// one with the smallest id stays the source. Into an empty book (a
    /// start) the map is built at once, packed, and sorted in place: a stable
    /// sort's scratch was the largest passing allocation of a start.
    pub(crate) fn restore_successes(&mut self, mut successes: Vec<([u8; 32], TrialId)>) {
        successes.sort_unstable();
        successes.dedup_by_key(|(identity, _)| *identity);
        if self.reusable.is_empty() {
            self.reusable = successes.into_iter().collect();
        } else {
            for (identity, trial) in successes {
                self.remember_success(identity, trial);
            }
        }
    }

    /// The experiments and trials changed since the last call, as records to
    /// persist (experiments first).
    pub(crate) fn take_records(&mut self) -> Vec<Record> {
        let experiments = std::mem::take(&mut self.dirty_experiments)
            .into_iter()
            .filter_map(|id| {
                self.catalog
                    .experiments
                    .get(&id)
                    .cloned()
                    .map(Record::Experiment)
            });
        let mut records: Vec<Record> = experiments.collect();
        for id in std::mem::take(&mut self.dirty_trials) {
            let Some(trial) = self.catalog.trials.get(&id) else {
                continue;
            };
            if !is_active(trial) && self.active.remove(&id) {
                *self.inactive.entry(inactive_key(trial)).or_default() += 1;
            }
            self.queued.add(trial);
            records.push(Record::Trial(Arc::clone(trial)));
        }
        records
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn experiment(seed: u8) -> (ExperimentRecord, ExperimentSpec) {
        let id = ExperimentId::from_content_hash(&[seed; 32], 1);
        let spec = ExperimentSpec::from_yaml("name: a\ntrial: {command: [echo]}\n").unwrap();
        let record = ExperimentRecord {
            id,
            content_hash: [seed; 32],
            spec_json: spec.to_canonical_json(),
            program: None,
            code_version: String::new(),
            data_version: String::new(),
            submitted_at: 0,
            cancelled: false,
            rerun: false,
            sweep_log: Vec::new(),
        };
        (record, spec)
    }

    fn trial(experiment: ExperimentId, index: u32) -> TrialRecord {
        TrialRecord {
            id: TrialId { experiment, index },
            config_json: "{}".to_owned(),
            seed: 0,
            state: TrialState::Pending,
            attempts: Default::default(),
            failures: 0,
            metrics: Default::default(),
            last_step: None,
            reason: None,
            queued_at: 0,
            reused_from: None,
            requeues: 0,
            preemptions: 0,
            held: false,
            priority_override: None,
            queue_override: None,
            checkpoints: Vec::new(),
            created_at: None,
            finished_at: None,
            outputs: Vec::new(),
            waited: false,
            malformed_metrics: None,
        }
    }

    fn kinds(records: &[Record]) -> Vec<&'static str> {
        records
            .iter()
            .map(|record| match record {
                Record::Experiment(_) => "experiment",
                Record::Trial(_) => "trial",
                _ => "other",
            })
            .collect()
    }

    #[test]
    fn what_changed_is_persisted_once_and_what_was_restored_is_not() {
        let mut book = Book::default();
        let (stored, spec) = experiment(1);
        let id = stored.id;
        book.restore_experiment(stored, spec.clone());
        book.restore_trial(Arc::new(trial(id, 0)));
        assert!(
            book.take_records().is_empty(),
            "restored records are stored already"
        );
        let (new, new_spec) = experiment(2);
        book.add_experiment(new, new_spec);
        book.add_trial(trial(id, 1));
        book.trial_mut(TrialId {
            experiment: id,
            index: 0,
        })
        .unwrap()
        .held = true;
        assert_eq!(
            kinds(&book.take_records()),
            ["experiment", "trial", "trial"]
        );
        assert!(book.take_records().is_empty());
        assert_eq!(book.spec(id).name, spec.name);
        assert_eq!(book.trials_of(id).count(), 2);
        assert!(
            book.trial_mut(TrialId {
                experiment: id,
                index: 9
            })
            .is_none()
        );
        assert!(
            book.take_records().is_empty(),
            "an unknown trial marks nothing"
        );
    }

    #[test]
    fn a_trial_is_held_once_with_its_committed_version_until_changed() {
        let mut book = Book::default();
        let (stored, spec) = experiment(1);
        let id = TrialId {
            experiment: stored.id,
            index: 0,
        };
        book.restore_experiment(stored, spec);
        let committed = Arc::new(trial(id.experiment, 0));
        book.restore_trial(Arc::clone(&committed));
        assert!(std::ptr::eq(book.trial(id), &*committed), "one copy");
        book.trial_mut(id).unwrap().held = true;
        assert!(!committed.held, "the committed version stays as it was");
        let records = book.take_records();
        let [Record::Trial(changed)] = records.as_slice() else {
            panic!("one trial record, got {records:?}");
        };
        assert!(changed.held);
        assert!(std::ptr::eq(book.trial(id), &**changed), "one copy again");
    }

    #[test]
    fn trials_and_successes_restored_at_once_are_restored_as_one_by_one() {
        let (record, spec) = experiment(1);
        let id = record.id;
        let records: Vec<Arc<TrialRecord>> = [
            TrialState::Succeeded,
            TrialState::Queued,
            TrialState::Pending,
            TrialState::Failed,
        ]
        .into_iter()
        .enumerate()
        .map(|(index, state)| {
            let mut record = trial(id, index as u32);
            record.state = state;
            Arc::new(record)
        })
        .collect();
        let view = |book: &Book| {
            let trials: Vec<_> = book.trials().map(|trial| trial.id.index).collect();
            let active: Vec<_> = book.active_trials().map(|trial| trial.id.index).collect();
            let counts: Vec<_> = book
                .inactive_counts()
                .map(|(key, n)| (key.clone(), n))
                .collect();
            (trials, active, counts, book.may_have_pending(id))
        };
        let mut at_once = Book::default();
        at_once.restore_experiment(record.clone(), spec.clone());
        let mut one_by_one = Book::default();
        one_by_one.restore_experiment(record, spec);
        // The same trial twice: the later record is the one held.
        let mut twice = records.clone();
        let mut later = (*records[0]).clone();
        later.state = TrialState::Cancelled;
        twice.push(Arc::new(later));
        at_once.restore_trials(twice.clone());
        twice
            .into_iter()
            .for_each(|trial| one_by_one.restore_trial(trial));
        assert_eq!(view(&at_once), view(&one_by_one));
        assert_eq!(view(&at_once).0, [0, 1, 2, 3]);
        let first = records[0].id;
        assert_eq!(at_once.trial(first).state, TrialState::Cancelled);
        let trial_id = |index| TrialId {
            experiment: id,
            index,
        };
        at_once.restore_successes(vec![
            ([2; 32], trial_id(3)),
            ([1; 32], trial_id(0)),
            ([2; 32], trial_id(1)),
        ]);
        assert_eq!(
            at_once.reusable(&[2; 32]),
            Some(trial_id(1)),
            "the smallest id stays the source"
        );
        assert_eq!(at_once.reusable(&[1; 32]), Some(trial_id(0)));
    }

    #[test]
    fn events_are_numbered_after_the_newest_stored() {
        let mut book = Book::default();
        let (record, spec) = experiment(1);
        let id = record.id;
        book.restore_experiment(record, spec);
        let trial_id = TrialId {
            experiment: id,
            index: 0,
        };
        assert_eq!(book.last_event_seq(), 0);
        let first = book.push_event(1, trial_id, TrialState::Queued, 0, "a".to_owned());
        assert_eq!((first.seq, book.last_event_seq()), (1, 1));
        let mut restarted = Book::default();
        restarted.restore_last_event_seq(41);
        let next = restarted.push_event(2, trial_id, TrialState::Running, 1, "b".to_owned());
        assert_eq!(next.seq, 42);
        assert_eq!(restarted.last_event_seq(), 42);
    }

    #[test]
    fn finished_trials_leave_the_active_ones_once_persisted_and_come_back_when_changed() {
        let mut book = Book::default();
        let (record, spec) = experiment(1);
        let id = record.id;
        book.restore_experiment(record, spec);
        let mut done = trial(id, 0);
        done.state = TrialState::Succeeded;
        book.restore_trial(Arc::new(done));
        book.add_trial(trial(id, 1));
        let active = |book: &Book| -> Vec<u32> {
            book.active_trials().map(|trial| trial.id.index).collect()
        };
        assert_eq!(
            active(&book),
            [1],
            "a finished trial restored is not active"
        );
        let counts = |book: &Book| -> Vec<(&'static str, u64)> {
            book.inactive_counts()
                .map(|((_, _, state), count)| (*state, count))
                .collect()
        };
        assert_eq!(counts(&book), [("succeeded", 1)]);
        let second = TrialId {
            experiment: id,
            index: 1,
        };
        book.trial_mut(second).unwrap().state = TrialState::Failed;
        assert_eq!(active(&book), [1], "until it is persisted");
        book.take_records();
        assert!(active(&book).is_empty());
        assert_eq!(counts(&book), [("failed", 1), ("succeeded", 1)]);
        // A retry makes it unfinished again.
        book.trial_mut(second).unwrap().state = TrialState::Queued;
        book.take_records();
        assert_eq!(active(&book), [1]);
        assert_eq!(counts(&book), [("succeeded", 1)]);
        book.check_active_trials();
    }

    #[test]
    fn the_first_success_of_an_identity_is_the_one_reused() {
        let mut book = Book::default();
        let (record, _) = experiment(1);
        let first = TrialId {
            experiment: record.id,
            index: 0,
        };
        let second = TrialId {
            experiment: record.id,
            index: 1,
        };
        assert_eq!(book.reusable(&[7; 32]), None);
        book.remember_success([7; 32], first);
        book.remember_success([7; 32], second);
        assert_eq!(book.reusable(&[7; 32]), Some(first));
    }
}
