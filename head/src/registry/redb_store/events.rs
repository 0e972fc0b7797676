//! Trial events by experiment and by trial: two key-only tables beside the
//! events themselves (by number), so the event feed and a trial's detail read
//! only their own events; the head keeps none in memory.
//!
//! Invariant: every event stored has its two index entries, written in the
//! transaction that stores it (a commit, an import), or, for a store written
//! before the index existed, built once when it is opened
//! ([`index_stored_events`], marked done in the meta table).

use redb::{ReadableDatabase, ReadableTable, TableDefinition, WriteTransaction};
use serde::Deserialize;
use tracing::{info, warn};
use xp_runtime::ids::{ExperimentId, TrialId};
use xp_runtime::protocol::TrialEvent;

use super::{EVENTS, META, db_error};
use crate::registry::RegistryError;

/// Event numbers by (experiment id, number).
const BY_EXPERIMENT: TableDefinition<'_, (&str, u64), ()> =
    TableDefinition::new("events_by_experiment");
/// Event numbers by (trial id, number).
const BY_TRIAL: TableDefinition<'_, (&str, u64), ()> = TableDefinition::new("events_by_trial");
/// The meta key set once every stored event is indexed.
const INDEXED: &str = "events_indexed";

/// The part of a stored event its index needs.
#[derive(Deserialize)]
struct EventTrial {
    trial: TrialId,
}

/// The index tables open in one write transaction.
pub(super) struct EventIndex<'txn> {
    by_experiment: redb::Table<'txn, (&'static str, u64), ()>,
    by_trial: redb::Table<'txn, (&'static str, u64), ()>,
}

impl<'txn> EventIndex<'txn> {
    pub(super) fn open(txn: &'txn WriteTransaction) -> Result<Self, RegistryError> {
        Ok(Self {
            by_experiment: txn.open_table(BY_EXPERIMENT).map_err(db_error)?,
            by_trial: txn.open_table(BY_TRIAL).map_err(db_error)?,
        })
    }

    /// Indexes event `seq` of `trial`.
    pub(super) fn insert(&mut self, trial: TrialId, seq: u64) -> Result<(), RegistryError> {
        let experiment = trial.experiment.to_string();
        self.by_experiment
            .insert((experiment.as_str(), seq), ())
            .map_err(db_error)?;
        let trial = trial.to_string();
        self.by_trial
            .insert((trial.as_str(), seq), ())
            .map_err(db_error)?;
        Ok(())
    }

    /// Indexes a stored event from its bytes; an unreadable one is left out
    /// (logged), as loading leaves it out.
    pub(super) fn insert_stored(&mut self, seq: u64, bytes: &[u8]) -> Result<(), RegistryError> {
        match serde_json::from_slice::<EventTrial>(bytes) {
            Ok(event) => self.insert(event.trial, seq),
            Err(error) => {
                warn!(seq, %error, "unreadable event left out of the event index");
                Ok(())
            }
        }
    }
}

/// Indexes every stored event once, for a store written before the index
/// existed (a fresh store is marked at once).
pub(super) fn index_stored_events(txn: &WriteTransaction) -> Result<(), RegistryError> {
    let mut meta = txn.open_table(META).map_err(db_error)?;
    if meta.get(INDEXED).map_err(db_error)?.is_some() {
        return Ok(());
    }
    let events = txn.open_table(EVENTS).map_err(db_error)?;
    let mut index = EventIndex::open(txn)?;
    let mut indexed = 0_u64;
    for entry in events.iter().map_err(db_error)? {
        let (seq, bytes) = entry.map_err(db_error)?;
        index.insert_stored(seq.value(), bytes.value())?;
        indexed += 1;
    }
    if indexed > 0 {
        info!(
            indexed,
            "indexed the stored events by experiment and trial (once, for this version)"
        );
    }
    meta.insert(INDEXED, 1).map_err(db_error)?;
    Ok(())
}

/// The number of the newest stored event (0: none).
pub(super) fn last_event_seq(txn: &redb::ReadTransaction) -> Result<u64, RegistryError> {
    let events = txn.open_table(EVENTS).map_err(db_error)?;
    Ok(events
        .last()
        .map_err(db_error)?
        .map_or(0, |(seq, _)| seq.value()))
}

/// Up to `limit` of `experiment`'s events after `after`, oldest first.
pub(super) fn events_after(
    database: &impl ReadableDatabase,
    experiment: ExperimentId,
    after: u64,
    limit: usize,
) -> Result<Vec<TrialEvent>, RegistryError> {
    let Some(first) = after.checked_add(1) else {
        return Ok(Vec::new());
    };
    let txn = database.begin_read().map_err(db_error)?;
    let index = txn.open_table(BY_EXPERIMENT).map_err(db_error)?;
    let events = txn.open_table(EVENTS).map_err(db_error)?;
    let experiment = experiment.to_string();
    let range = (experiment.as_str(), first)..=(experiment.as_str(), u64::MAX);
    let mut out = Vec::new();
    for entry in index.range(range).map_err(db_error)?.take(limit) {
        let (key, _) = entry.map_err(db_error)?;
        out.extend(read_event(&events, key.value().1)?);
    }
    Ok(out)
}

/// The newest `limit` events of `trial`, newest first.
pub(super) fn newest_events_of_trial(
    database: &impl ReadableDatabase,
    trial: TrialId,
    limit: usize,
) -> Result<Vec<TrialEvent>, RegistryError> {
    let txn = database.begin_read().map_err(db_error)?;
    let index = txn.open_table(BY_TRIAL).map_err(db_error)?;
    let events = txn.open_table(EVENTS).map_err(db_error)?;
    let trial = trial.to_string();
    let range = (trial.as_str(), 0)..=(trial.as_str(), u64::MAX);
    let mut out = Vec::new();
    for entry in index.range(range).map_err(db_error)?.rev().take(limit) {
        let (key, _) = entry.map_err(db_error)?;
        out.extend(read_event(&events, key.value().1)?);
    }
    Ok(out)
}

/// Event `seq` as stored; `None` (logged) when missing or unreadable.
fn read_event(
    events: &impl ReadableTable<u64, &'static [u8]>,
    seq: u64,
) -> Result<Option<TrialEvent>, RegistryError> {
    let Some(bytes) = events.get(seq).map_err(db_error)? else {
        warn!(seq, "an indexed event is not stored; skipped");
        return Ok(None);
    };
    match serde_json::from_slice(bytes.value()) {
        Ok(event) => Ok(Some(event)),
        Err(error) => {
            warn!(seq, %error, "unreadable event skipped");
            Ok(None)
        }
    }
}
