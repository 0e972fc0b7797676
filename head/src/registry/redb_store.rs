//! The registry's default store: an embedded redb database, one file.
//!
//! A failed write (a full disk) leaves redb refusing every later call until the
//! database is closed and opened again, so a failed write closes it here (the
//! registry asks), and [`RedbStore::reopen`] opens it again once a probe write
//! shows there is room.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use redb::{Database, ReadableDatabase, ReadableTable, TableDefinition};
use tracing::{debug, info, warn};
use xp_runtime::ids::{ExperimentId, TrialId};
use xp_runtime::protocol::{AuditEntry, TelemetryWindow, TrialEvent, WorkerTelemetry};

use xp_head_core::auth::users::UserRecord;
use xp_head_core::{LoadedState, MetricRecord, Record, TelemetryRecord};

use super::copy::{RawKey, RawRow, Table};
use super::{
    HistoryReader, HistoryReads, MetricsPage, RegistryError, Sequences, Store, by_rank, encode,
    sample_stride,
};

mod events;
mod raw;

pub(super) const EXPERIMENTS: TableDefinition<'_, &str, &[u8]> =
    TableDefinition::new("experiments");
pub(super) const TRIALS: TableDefinition<'_, &str, &[u8]> = TableDefinition::new("trials");
pub(super) const NODES: TableDefinition<'_, &str, &[u8]> = TableDefinition::new("nodes");
pub(super) const EVENTS: TableDefinition<'_, u64, &[u8]> = TableDefinition::new("events");
/// Keyed by (trial id, sequence) so one trial's history is a range scan.
pub(super) const METRICS: TableDefinition<'_, (&str, u64), &[u8]> = TableDefinition::new("metrics");
pub(super) const META: TableDefinition<'_, &str, u64> = TableDefinition::new("meta");
/// The scheduling policy in force, under the key `current`.
pub(super) const POLICY: TableDefinition<'_, &str, &[u8]> = TableDefinition::new("policy");
/// Users by name.
pub(super) const USERS: TableDefinition<'_, &str, &[u8]> = TableDefinition::new("users");
/// The audit trail by sequence number.
pub(super) const AUDIT: TableDefinition<'_, u64, &[u8]> = TableDefinition::new("audit");
/// Telemetry windows by (trial id, rank, slot), so one trial's series is a range scan.
pub(super) const TELEMETRY: TableDefinition<'_, (&str, u32, u32), &[u8]> =
    TableDefinition::new("telemetry");
/// Pipelines by id.
pub(super) const PIPELINES: TableDefinition<'_, u64, &[u8]> = TableDefinition::new("pipelines");
/// Alerts by id (insert or replace: an alert's delivery state and clearing change).
pub(super) const ALERTS: TableDefinition<'_, u64, &[u8]> = TableDefinition::new("alerts");

/// How much room a probe must find before the database is opened again after a
/// failed write: enough for the database to grow a little, so that a disk with a
/// few bytes free does not make the head flap between failing and re-opening.
const PROBE_BYTES: usize = 1 << 20;

/// The probe file's name in the database's directory.
const PROBE_FILE: &str = ".xp-space-probe";

pub(super) fn db_error(error: impl Into<redb::Error>) -> RegistryError {
    RegistryError::Database(error.into())
}

/// An open (or closed, after a failed write) redb database.
#[derive(Debug)]
pub(crate) struct RedbStore {
    path: PathBuf,
    /// `None` after a failed write, until [`RedbStore::reopen`] succeeds.
    /// Shared with the readers ([`Store::reader`]) while they read.
    database: Option<Arc<Database>>,
}

impl RedbStore {
    /// Opens (or creates) the database at `path`.
    pub(crate) fn open(path: &Path) -> Result<Self, RegistryError> {
        Ok(Self {
            path: path.to_owned(),
            database: Some(Arc::new(open_database(path)?)),
        })
    }

    fn database(&self) -> Result<&Database, RegistryError> {
        self.shared_database().map(|database| &**database)
    }

    fn shared_database(&self) -> Result<&Arc<Database>, RegistryError> {
        self.database.as_ref().ok_or(RegistryError::Closed)
    }
}

/// Writes `bytes` to a probe file in `dir`, makes them durable and removes the file.
fn probe_room(dir: &Path, bytes: usize) -> std::io::Result<()> {
    let path = dir.join(PROBE_FILE);
    let written = (|| {
        let mut file = std::fs::File::create(&path)?;
        // Not zeros, which some file systems store without taking room.
        let chunk: Vec<u8> = (0..64 << 10)
            .map(|index: u32| (index % 251) as u8)
            .collect();
        let mut left = bytes;
        while left > 0 {
            let len = left.min(chunk.len());
            file.write_all(&chunk[..len])?;
            left -= len;
        }
        file.sync_all()
    })();
    let removed = std::fs::remove_file(&path);
    written?;
    removed
}

/// The most memory redb keeps of the pages it read or is about to write.
const REDB_CACHE_BYTES: usize = 64 << 20;

/// A write transaction. Without redb's quick repair: it would save the
/// allocator's state with every commit, so that a file a crash left opens at
/// once instead of being walked whole (5.8-7.9 s instead of 10.8-14.6 s to
/// serve over a million finished trials), but each commit then took 1.05-1.24
/// ms instead of 0.21 ms on that 4.5 GB file, and the head's one actor commits
/// hundreds of times a second under a large fleet's reports.
pub(super) fn begin_write(database: &Database) -> Result<redb::WriteTransaction, RegistryError> {
    database.begin_write().map_err(db_error)
}

/// Logs redb's repair of a file a crash left (it is walked whole before the
/// head can start): at its start and at each tenth, so an operator sees why
/// the head is not serving yet.
fn repair_logger() -> impl Fn(&mut redb::RepairSession) + 'static {
    let logged = std::cell::Cell::new(None);
    move |session| {
        let tenth = (session.progress() * 10.0) as u32;
        if logged.replace(Some(tenth)) != Some(tenth) {
            info!(
                done = format!("{:.0} %", session.progress() * 100.0),
                "repairing the registry database after an unclean stop"
            );
        }
    }
}

/// Opens (or creates) the database at `path` and its tables.
fn open_database(path: &Path) -> Result<Database, RegistryError> {
    // redb caches up to 1 GiB of the pages it read by default: the head's
    // start reads every record once, and its history reads come and go, so
    // the cache grew the head's memory by most of the file's size (195 MiB
    // over 100,000 finished trials) while the kernel caches the file anyway.
    let database = redb::Builder::new()
        .set_cache_size(REDB_CACHE_BYTES)
        .set_repair_callback(repair_logger())
        .create(path)
        .map_err(db_error)?;
    let txn = begin_write(&database)?;
    {
        // Opening every table once makes later read transactions find them.
        txn.open_table(EXPERIMENTS).map_err(db_error)?;
        txn.open_table(TRIALS).map_err(db_error)?;
        txn.open_table(NODES).map_err(db_error)?;
        txn.open_table(EVENTS).map_err(db_error)?;
        txn.open_table(METRICS).map_err(db_error)?;
        txn.open_table(POLICY).map_err(db_error)?;
        txn.open_table(USERS).map_err(db_error)?;
        txn.open_table(AUDIT).map_err(db_error)?;
        txn.open_table(TELEMETRY).map_err(db_error)?;
        txn.open_table(PIPELINES).map_err(db_error)?;
        txn.open_table(ALERTS).map_err(db_error)?;
        txn.open_table(META).map_err(db_error)?;
    }
    events::index_stored_events(&txn)?;
    txn.commit().map_err(db_error)?;
    Ok(database)
}

impl HistoryReads for RedbStore {
    fn events_after(
        &self,
        experiment: ExperimentId,
        after: u64,
        limit: usize,
    ) -> Result<Vec<TrialEvent>, RegistryError> {
        events::events_after(self.database()?, experiment, after, limit)
    }

    fn newest_events_of_trial(
        &self,
        trial: TrialId,
        limit: usize,
    ) -> Result<Vec<TrialEvent>, RegistryError> {
        events::newest_events_of_trial(self.database()?, trial, limit)
    }

    /// The newest `limit` audit entries, oldest first.
    fn audit(&self, limit: usize) -> Result<Vec<AuditEntry>, RegistryError> {
        let txn = self.database()?.begin_read().map_err(db_error)?;
        let table = txn.open_table(AUDIT).map_err(db_error)?;
        let mut out = Vec::new();
        for entry in table.iter().map_err(db_error)?.rev().take(limit) {
            let (_, value) = entry.map_err(db_error)?;
            match serde_json::from_slice::<AuditEntry>(value.value()) {
                Ok(record) => out.push(record),
                Err(error) => warn!(%error, "unreadable audit entry skipped"),
            }
        }
        out.reverse();
        Ok(out)
    }

    /// One page of a trial's metric reports in arrival order: at most `limit`
    /// reports after sequence number `after`, ending early once their stored size
    /// reaches `max_bytes` (one report is returned even if larger), and how many
    /// the trial has in all. A page holds only its own reports, however long
    /// the history is.
    fn metrics_page(
        &self,
        trial: TrialId,
        after: Option<u64>,
        limit: usize,
        max_bytes: usize,
    ) -> Result<MetricsPage, RegistryError> {
        let txn = self.database()?.begin_read().map_err(db_error)?;
        let table = txn.open_table(METRICS).map_err(db_error)?;
        let trial = trial.to_string();
        let mut page = MetricsPage::default();
        // Counting walks the keys and decodes no record.
        for entry in table
            .range((trial.as_str(), 0)..=(trial.as_str(), u64::MAX))
            .map_err(db_error)?
        {
            entry.map_err(db_error)?;
            page.total += 1;
        }
        let start = match after {
            Some(seq) => seq.checked_add(1),
            None => Some(0),
        };
        let Some(start) = start else {
            return Ok(page);
        };
        let mut bytes = 0;
        for entry in table
            .range((trial.as_str(), start)..=(trial.as_str(), u64::MAX))
            .map_err(db_error)?
        {
            let (key, value) = entry.map_err(db_error)?;
            if page.records.len() >= limit || (!page.records.is_empty() && bytes >= max_bytes) {
                page.more = true;
                break;
            }
            match serde_json::from_slice::<MetricRecord>(value.value()) {
                Ok(record) => {
                    bytes += value.value().len();
                    page.records.push((key.value().1, record));
                }
                Err(error) => warn!(%trial, %error, "unreadable metric record skipped"),
            }
        }
        Ok(page)
    }

    /// At most about `max_records` of a trial's metric reports, evenly spaced
    /// over its whole history (every report when it has no more) and always
    /// the newest, oldest first: what a learning curve needs of a history of
    /// any length, for the cost of walking its keys and decoding only those.
    fn metric_samples(
        &self,
        trial: TrialId,
        max_records: usize,
    ) -> Result<Vec<MetricRecord>, RegistryError> {
        let txn = self.database()?.begin_read().map_err(db_error)?;
        let table = txn.open_table(METRICS).map_err(db_error)?;
        let trial = trial.to_string();
        let range = || (trial.as_str(), 0)..=(trial.as_str(), u64::MAX);
        let mut total = 0_usize;
        for entry in table.range(range()).map_err(db_error)? {
            entry.map_err(db_error)?;
            total += 1;
        }
        let stride = sample_stride(total, max_records);
        let mut out = Vec::with_capacity(total.min(max_records + 1));
        for (position, entry) in table.range(range()).map_err(db_error)?.enumerate() {
            if position % stride != 0 && position + 1 != total {
                continue;
            }
            let (_, value) = entry.map_err(db_error)?;
            match serde_json::from_slice::<MetricRecord>(value.value()) {
                Ok(record) => out.push(record),
                Err(error) => warn!(%trial, %error, "unreadable metric record skipped"),
            }
        }
        Ok(out)
    }

    /// One trial's telemetry, per rank, each series oldest window first.
    fn telemetry_of(&self, trial: TrialId) -> Result<Vec<WorkerTelemetry>, RegistryError> {
        let txn = self.database()?.begin_read().map_err(db_error)?;
        let table = txn.open_table(TELEMETRY).map_err(db_error)?;
        let trial = trial.to_string();
        let range = (trial.as_str(), 0, 0)..=(trial.as_str(), u32::MAX, u32::MAX);
        let mut windows = Vec::new();
        for entry in table.range(range).map_err(db_error)? {
            let (key, value) = entry.map_err(db_error)?;
            let (_, rank, _) = key.value();
            match serde_json::from_slice::<TelemetryWindow>(value.value()) {
                Ok(window) => windows.push((rank, window)),
                Err(error) => warn!(%error, "unreadable telemetry window skipped"),
            }
        }
        Ok(by_rank(windows))
    }
}

impl Store for RedbStore {
    fn sequences(&self) -> Result<Sequences, RegistryError> {
        let txn = self.database()?.begin_read().map_err(db_error)?;
        let meta = txn.open_table(META).map_err(db_error)?;
        let next = |key| {
            meta.get(key)
                .map_err(db_error)
                .map(|value| value.map_or(1, |value| value.value()))
        };
        Ok(Sequences {
            metric: next("next_metric_seq")?,
            audit: next("next_audit_seq")?,
        })
    }

    fn read_all(&self) -> Result<LoadedState, RegistryError> {
        read_all(self.database()?)
    }

    fn export(
        &self,
        table: Table,
        after: Option<&RawKey>,
        limit: usize,
    ) -> Result<Vec<RawRow>, RegistryError> {
        self.export_rows(table, after, limit)
    }

    fn import(
        &mut self,
        table: Table,
        rows: &[RawRow],
        next: Sequences,
    ) -> Result<(), RegistryError> {
        self.import_rows(table, rows, next)
    }

    fn is_open(&self) -> bool {
        self.database.is_some()
    }

    /// Closes the database, or leaves it to the last reader still reading
    /// (a reopen finds it still open until then, and is tried again).
    fn close(&mut self) {
        if let Some(database) = self.database.take().and_then(Arc::into_inner)
            && let Err(error) = database.close()
        {
            debug!(%error, "closing the registry database after a failure");
        }
    }

    /// Opens the database again, once a probe shows that its directory has
    /// room ([`PROBE_BYTES`]).
    fn reopen(&mut self) -> Result<(), RegistryError> {
        self.close();
        let dir = self
            .path
            .parent()
            .map_or_else(|| PathBuf::from("."), Path::to_owned);
        probe_room(&dir, PROBE_BYTES).map_err(|source| RegistryError::NoRoom {
            dir,
            bytes: PROBE_BYTES,
            source,
        })?;
        self.database = Some(Arc::new(open_database(&self.path)?));
        Ok(())
    }

    fn write(&mut self, records: &[Record], next: Sequences) -> Result<Sequences, RegistryError> {
        let txn = begin_write(self.database()?)?;
        let mut sequences = next;
        {
            let mut tables = WriteTables::open(&txn)?;
            for record in records {
                tables.write(record, &mut sequences)?;
            }
            let mut meta = txn.open_table(META).map_err(db_error)?;
            meta.insert("next_metric_seq", sequences.metric)
                .map_err(db_error)?;
            meta.insert("next_audit_seq", sequences.audit)
                .map_err(db_error)?;
        }
        txn.commit().map_err(db_error)?;
        Ok(sequences)
    }

    /// A store sharing this one's database, for reads only: redb's read
    /// transactions run beside its one write.
    fn reader(&self) -> Result<HistoryReader, RegistryError> {
        Ok(Arc::new(Self {
            path: self.path.clone(),
            database: Some(Arc::clone(self.shared_database()?)),
        }))
    }

    /// Every user.
    fn users(&self) -> Result<Vec<UserRecord>, RegistryError> {
        let txn = self.database()?.begin_read().map_err(db_error)?;
        let table = txn.open_table(USERS).map_err(db_error)?;
        let mut out = Vec::new();
        for entry in table.iter().map_err(db_error)? {
            let (name, value) = entry.map_err(db_error)?;
            match serde_json::from_slice::<UserRecord>(value.value()) {
                Ok(record) => out.push(record),
                Err(error) => warn!(user = name.value(), %error, "unreadable user record skipped"),
            }
        }
        Ok(out)
    }

    /// Every metric report of one trial, oldest first (for curves and tests).
    fn metrics_of(&self, trial: TrialId) -> Result<Vec<MetricRecord>, RegistryError> {
        let txn = self.database()?.begin_read().map_err(db_error)?;
        let table = txn.open_table(METRICS).map_err(db_error)?;
        let trial = trial.to_string();
        let mut out = Vec::new();
        let range = (trial.as_str(), 0)..=(trial.as_str(), u64::MAX);
        for entry in table.range(range).map_err(db_error)? {
            let (_, value) = entry.map_err(db_error)?;
            match serde_json::from_slice::<MetricRecord>(value.value()) {
                Ok(record) => out.push(record),
                Err(error) => warn!(%trial, %error, "unreadable metric record skipped"),
            }
        }
        Ok(out)
    }

    /// One worker's telemetry series, oldest window first (empty when none is stored).
    fn telemetry_series(
        &self,
        trial: TrialId,
        rank: u32,
    ) -> Result<Vec<TelemetryWindow>, RegistryError> {
        let txn = self.database()?.begin_read().map_err(db_error)?;
        let table = txn.open_table(TELEMETRY).map_err(db_error)?;
        let trial = trial.to_string();
        let range = (trial.as_str(), rank, 0)..=(trial.as_str(), rank, u32::MAX);
        let mut windows = Vec::new();
        for entry in table.range(range).map_err(db_error)? {
            let (_, value) = entry.map_err(db_error)?;
            match serde_json::from_slice::<TelemetryWindow>(value.value()) {
                Ok(window) => windows.push(window),
                Err(error) => warn!(%error, "unreadable telemetry window skipped"),
            }
        }
        Ok(windows)
    }
}

/// Everything stored in the database at `path`, read without writing to it.
pub(super) fn load_read_only(path: &Path) -> Result<LoadedState, RegistryError> {
    let database = redb::ReadOnlyDatabase::open(path).map_err(db_error)?;
    read_all(&database)
}

/// Every experiment, trial, node, pipeline and alert, the policy and the
/// newest event's number stored in `database`.
fn read_all(database: &impl ReadableDatabase) -> Result<LoadedState, RegistryError> {
    let txn = database.begin_read().map_err(db_error)?;
    let mut loaded = LoadedState::default();
    fn decode_all<T: serde::de::DeserializeOwned, K: redb::Key + 'static>(
        table: &impl ReadableTable<K, &'static [u8]>,
        kind: &str,
        out: &mut Vec<T>,
    ) -> Result<(), RegistryError> {
        for entry in table.iter().map_err(db_error)? {
            let (_, value) = entry.map_err(db_error)?;
            match serde_json::from_slice(value.value()) {
                Ok(record) => out.push(record),
                Err(error) => warn!(kind, %error, "unreadable record skipped"),
            }
        }
        Ok(())
    }
    decode_all(
        &txn.open_table(EXPERIMENTS).map_err(db_error)?,
        "experiment",
        &mut loaded.experiments,
    )?;
    decode_all(
        &txn.open_table(TRIALS).map_err(db_error)?,
        "trial",
        &mut loaded.trials,
    )?;
    decode_all(
        &txn.open_table(NODES).map_err(db_error)?,
        "node",
        &mut loaded.nodes,
    )?;
    loaded.last_event_seq = events::last_event_seq(&txn)?;
    let pipelines = txn.open_table(PIPELINES).map_err(db_error)?;
    decode_all(&pipelines, "pipeline", &mut loaded.pipelines)?;
    // From the keys, not the decoded records: an unreadable record's id stays taken.
    loaded.next_pipeline_id = pipelines
        .last()
        .map_err(db_error)?
        .map_or(1, |(key, _)| key.value().saturating_add(1));
    decode_all(
        &txn.open_table(ALERTS).map_err(db_error)?,
        "alert",
        &mut loaded.alerts,
    )?;
    let policy = txn.open_table(POLICY).map_err(db_error)?;
    if let Some(bytes) = policy.get("current").map_err(db_error)? {
        match serde_json::from_slice(bytes.value()) {
            Ok(record) => loaded.policy = Some(record),
            Err(error) => warn!(%error, "unreadable stored policy skipped"),
        }
    }
    Ok(loaded)
}

/// The tables one commit writes records to, open in its transaction.
struct WriteTables<'txn> {
    users: redb::Table<'txn, &'static str, &'static [u8]>,
    audit: redb::Table<'txn, u64, &'static [u8]>,
    experiments: redb::Table<'txn, &'static str, &'static [u8]>,
    trials: redb::Table<'txn, &'static str, &'static [u8]>,
    nodes: redb::Table<'txn, &'static str, &'static [u8]>,
    events: redb::Table<'txn, u64, &'static [u8]>,
    event_index: events::EventIndex<'txn>,
    metrics: redb::Table<'txn, (&'static str, u64), &'static [u8]>,
    policy: redb::Table<'txn, &'static str, &'static [u8]>,
    telemetry: redb::Table<'txn, (&'static str, u32, u32), &'static [u8]>,
    pipelines: redb::Table<'txn, u64, &'static [u8]>,
    alerts: redb::Table<'txn, u64, &'static [u8]>,
}

impl<'txn> WriteTables<'txn> {
    fn open(txn: &'txn redb::WriteTransaction) -> Result<Self, RegistryError> {
        Ok(Self {
            users: txn.open_table(USERS).map_err(db_error)?,
            audit: txn.open_table(AUDIT).map_err(db_error)?,
            experiments: txn.open_table(EXPERIMENTS).map_err(db_error)?,
            trials: txn.open_table(TRIALS).map_err(db_error)?,
            nodes: txn.open_table(NODES).map_err(db_error)?,
            events: txn.open_table(EVENTS).map_err(db_error)?,
            event_index: events::EventIndex::open(txn)?,
            metrics: txn.open_table(METRICS).map_err(db_error)?,
            policy: txn.open_table(POLICY).map_err(db_error)?,
            telemetry: txn.open_table(TELEMETRY).map_err(db_error)?,
            pipelines: txn.open_table(PIPELINES).map_err(db_error)?,
            alerts: txn.open_table(ALERTS).map_err(db_error)?,
        })
    }

    /// Stores one record (inserted or replaced by its key; numbered ones
    /// take the next number).
    fn write(&mut self, record: &Record, sequences: &mut Sequences) -> Result<(), RegistryError> {
        match record {
            Record::Experiment(experiment) => put(
                &mut self.experiments,
                experiment.id.to_string().as_str(),
                "experiment",
                experiment,
            ),
            Record::Trial(trial) => put(
                &mut self.trials,
                trial.id.to_string().as_str(),
                "trial",
                trial,
            ),
            Record::Node(node) => put(&mut self.nodes, node.id.to_string().as_str(), "node", node),
            Record::Event(event) => {
                put(&mut self.events, event.seq, "event", event)?;
                self.event_index.insert(event.trial, event.seq)
            }
            Record::Metric(metric) => self.write_metric(metric, sequences),
            Record::Policy(record) => put(&mut self.policy, "current", "policy", record),
            Record::User(user) => put(&mut self.users, user.name.as_str(), "user", user),
            Record::Pipeline(pipeline) => {
                put(&mut self.pipelines, pipeline.id, "pipeline", pipeline)
            }
            Record::Alert(alert) => put(&mut self.alerts, alert.id, "alert", alert),
            Record::Audit(entry) => self.write_audit(entry, sequences),
            Record::Telemetry(window) => self.write_telemetry(window),
        }
    }

    /// A metric report, under its trial and the next metric number.
    fn write_metric(
        &mut self,
        metric: &MetricRecord,
        sequences: &mut Sequences,
    ) -> Result<(), RegistryError> {
        let trial = metric.key.trial.to_string();
        put(
            &mut self.metrics,
            (trial.as_str(), sequences.metric),
            "metric",
            metric,
        )?;
        sequences.metric += 1;
        Ok(())
    }

    /// An audit entry, numbered.
    fn write_audit(
        &mut self,
        entry: &AuditEntry,
        sequences: &mut Sequences,
    ) -> Result<(), RegistryError> {
        let numbered = AuditEntry {
            seq: sequences.audit,
            ..entry.clone()
        };
        put(&mut self.audit, sequences.audit, "audit", &numbered)?;
        sequences.audit += 1;
        Ok(())
    }

    /// A telemetry window stored, or removed when it is empty.
    fn write_telemetry(&mut self, window: &TelemetryRecord) -> Result<(), RegistryError> {
        let trial = window.trial.to_string();
        let key = (trial.as_str(), window.rank, window.slot);
        match &window.window {
            Some(stored) => put(&mut self.telemetry, key, "telemetry", stored),
            None => self.telemetry.remove(key).map(drop).map_err(db_error),
        }
    }
}

/// Encodes `value` as a record of `kind` and stores it under `key`.
fn put<'k, K: redb::Key + 'static>(
    table: &mut redb::Table<'_, K, &'static [u8]>,
    key: impl std::borrow::Borrow<K::SelfType<'k>>,
    kind: &'static str,
    value: &impl serde::Serialize,
) -> Result<(), RegistryError> {
    let bytes = encode(kind, value)?;
    table.insert(key, bytes.as_slice()).map_err(db_error)?;
    Ok(())
}
