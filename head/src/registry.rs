//! Durable storage of the head's records, in a [`Store`]: an embedded redb
//! database (the default, `redb_store`) or PostgreSQL (`postgres`).
//!
//! Invariant: [`Registry::commit`] returns only after the records are durable
//! (redb's immediate durability, a committed PostgreSQL transaction), and the
//! head acknowledges nothing before that. Records are stored as JSON so that
//! the store stays readable by later versions (and, in PostgreSQL, by SQL).
//!
//! A failed write (a full disk, a lost database connection) closes the store,
//! and [`Registry::reopen`] opens it again once it can (a probe write shows
//! there is room, the database answers again).
//! While it is closed, [`Registry::committed`] still answers: the registry keeps
//! a copy of everything committed (what [`Registry::load`] would return), so the
//! head can rebuild its state from what is stored without reading the disk.
//! Events and metric reports are the exception: they are only ever appended,
//! and neither the copy nor the core keeps them (a head that ran a million
//! trials has five million events); they are read from the store on demand
//! ([`HistoryReads::events_after`], [`HistoryReads::newest_events_of_trial`]).
//!
//! Invariant: [`Registry::committed`] equals what the database holds, as far as
//! this process knows: it is updated only after a commit succeeded.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use xp_runtime::ids::{ExperimentId, NodeId, TrialId};
use xp_runtime::protocol::{TelemetryWindow, TrialEvent, WorkerTelemetry};

use xp_head_core::auth::users::UserRecord;
use xp_head_core::{
    ExperimentRecord, LoadedState, MetricRecord, NodeRecord, PolicyRecord, Record, TrialRecord,
};
use xp_runtime::protocol::AuditEntry;

mod copy;
mod postgres;
mod redb_store;

pub use copy::{CopyError, TableDigest, copy_store};

pub use postgres::PostgresTarget;
pub(crate) use postgres::off_runtime;

/// Why the registry failed.
#[derive(Debug, thiserror::Error)]
pub enum RegistryError {
    /// The database reported an error (I/O, full disk, corruption).
    #[error("registry database error: {0}")]
    Database(#[from] redb::Error),
    /// A record could not be encoded.
    #[error("cannot encode a {kind} record: {source}")]
    Encode {
        /// Which kind of record.
        kind: &'static str,
        /// The cause.
        #[source]
        source: serde_json::Error,
    },
    /// The database was closed after a failed write and is not open again yet.
    #[error("the registry database is closed after a failed write")]
    Closed,
    /// PostgreSQL refused a statement or the connection to it failed.
    #[error("registry database error (PostgreSQL): {}", postgres_detail(.0))]
    Postgres(#[from] ::postgres::Error),
    /// The PostgreSQL schema could not be created or migrated.
    #[error("cannot create or migrate the registry's PostgreSQL schema: {0}")]
    Migration(#[from] refinery::Error),
    /// The PostgreSQL store is not usable as configured.
    #[error("the PostgreSQL store cannot be used: {0}")]
    PostgresSetup(String),
    /// A number does not fit the store's column.
    #[error("{kind} number {value} does not fit the store")]
    OutOfRange {
        /// What the number numbers.
        kind: &'static str,
        /// The number.
        value: u64,
    },
    /// Another head leads the store now: this one's writes are refused.
    #[error(
        "refused by the store's fencing: another head leads it now (this head led in epoch {epoch})"
    )]
    Fenced {
        /// The epoch this head led in.
        epoch: i64,
    },
    /// A row of a store cannot be copied as it is.
    #[error("cannot copy a row of table {table}: {reason}")]
    CopyRow {
        /// The table.
        table: &'static str,
        /// Why.
        reason: String,
    },
    /// The probe for free room before re-opening the database failed.
    #[error("cannot write {bytes} bytes in {}: {source}", dir.display())]
    NoRoom {
        /// The database's directory.
        dir: PathBuf,
        /// How much the probe tried to write.
        bytes: usize,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
}

impl RegistryError {
    /// Whether the cause is a full disk or an exhausted quota.
    pub fn is_disk_full(&self) -> bool {
        if let Self::Postgres(error) = self {
            // PostgreSQL's own disk full: SQLSTATE 53100 (disk_full).
            return error.code() == Some(&::postgres::error::SqlState::DISK_FULL);
        }
        let (Self::Database(redb::Error::Io(io)) | Self::NoRoom { source: io, .. }) = self else {
            return false;
        };
        // The standard library maps ENOSPC and EDQUOT to these kinds.
        matches!(
            io.kind(),
            std::io::ErrorKind::StorageFull | std::io::ErrorKind::QuotaExceeded
        )
    }
}

/// What went wrong in PostgreSQL, in words: rust-postgres's own message
/// ("db error") is followed by its cause's (the server's message and code).
pub(crate) fn postgres_detail(error: &::postgres::Error) -> String {
    match error.as_db_error() {
        Some(db) => format!("{} ({})", db.message(), db.code().code()),
        None => match std::error::Error::source(error) {
            Some(source) => format!("{error}: {source}"),
            None => error.to_string(),
        },
    }
}

/// The store behind a registry: where the head keeps its records.
#[derive(Debug, Clone)]
pub enum StoreSpec {
    /// An embedded redb database file.
    Redb(PathBuf),
    /// A PostgreSQL database.
    Postgres(Box<PostgresTarget>),
}

impl StoreSpec {
    /// The store `text` names: a PostgreSQL address (`postgres://...`,
    /// `postgresql://...` or `key=value` pairs, with `password` for it), or
    /// else a redb file; a directory names the `head.redb` in it (a head's
    /// data directory).
    pub fn parse(text: &str, password: Option<&str>) -> Result<Self, RegistryError> {
        let is_postgres = text.starts_with("postgres://")
            || text.starts_with("postgresql://")
            || text.contains('=');
        if is_postgres {
            return Ok(Self::Postgres(Box::new(PostgresTarget::parse(
                text, password,
            )?)));
        }
        let path = PathBuf::from(text);
        Ok(Self::Redb(if path.is_dir() {
            path.join("head.redb")
        } else {
            path
        }))
    }
}

impl StoreSpec {
    /// A PostgreSQL store talks TLS, checking the server against the CA in
    /// `ca_file`; an embedded store is unchanged.
    pub fn with_ca_file(self, ca_file: Option<&Path>) -> Result<Self, RegistryError> {
        match (self, ca_file) {
            (Self::Postgres(target), Some(ca_file)) => {
                Ok(Self::Postgres(Box::new(target.with_ca_file(ca_file)?)))
            }
            (spec, _) => Ok(spec),
        }
    }
}

impl std::fmt::Display for StoreSpec {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Redb(path) => write!(formatter, "{}", path.display()),
            Self::Postgres(target) => write!(formatter, "{target}"),
        }
    }
}

/// What the database holds, kept in memory: experiments, trials (each shared
/// with the core's book while the core has not changed it) and nodes by id,
/// the policy, and the number of the newest event (events and metrics are not
/// kept; they stay on disk).
#[derive(Debug, Default, Clone)]
pub(crate) struct Committed {
    experiments: BTreeMap<ExperimentId, ExperimentRecord>,
    trials: BTreeMap<TrialId, Arc<TrialRecord>>,
    nodes: BTreeMap<NodeId, NodeRecord>,
    /// The newest event committed.
    last_event_seq: u64,
    policy: Option<PolicyRecord>,
    pipelines: BTreeMap<u64, xp_head_core::PipelineRecord>,
    next_pipeline_id: u64,
    alerts: BTreeMap<u64, xp_head_core::AlertRecord>,
}

impl Committed {
    /// The copy of what a head loaded.
    pub(crate) fn from_loaded(loaded: &LoadedState) -> Self {
        Self {
            experiments: loaded
                .experiments
                .iter()
                .map(|record| (record.id, record.clone()))
                .collect(),
            trials: loaded
                .trials
                .iter()
                .map(|record| (record.id, record.clone()))
                .collect(),
            nodes: loaded
                .nodes
                .iter()
                .map(|record| (record.id, record.clone()))
                .collect(),
            last_event_seq: loaded.last_event_seq,
            policy: loaded.policy.clone(),
            pipelines: loaded
                .pipelines
                .iter()
                .map(|record| (record.id, record.clone()))
                .collect(),
            next_pipeline_id: loaded.next_pipeline_id,
            alerts: loaded
                .alerts
                .iter()
                .map(|record| (record.id, record.clone()))
                .collect(),
        }
    }

    /// Takes in a committed record (of an event, only its number).
    pub(crate) fn apply(&mut self, record: Record) {
        match record {
            Record::Experiment(record) => {
                self.experiments.insert(record.id, record);
            }
            Record::Trial(record) => {
                self.trials.insert(record.id, record);
            }
            Record::Node(record) => {
                self.nodes.insert(record.id, record);
            }
            Record::Event(event) => self.last_event_seq = self.last_event_seq.max(event.seq),
            // Metrics, telemetry and the audit trail stay on disk; users live in the actor's table.
            Record::Metric(_) | Record::User(_) | Record::Audit(_) | Record::Telemetry(_) => {}
            Record::Policy(record) => self.policy = Some(record),
            Record::Pipeline(record) => {
                self.next_pipeline_id = self.next_pipeline_id.max(record.id.saturating_add(1));
                self.pipelines.insert(record.id, record);
            }
            Record::Alert(record) => {
                self.alerts.insert(record.id, record);
            }
        }
    }

    pub(crate) fn to_loaded(&self) -> LoadedState {
        LoadedState {
            experiments: self.experiments.values().cloned().collect(),
            trials: self.trials.values().cloned().collect(),
            nodes: self.nodes.values().cloned().collect(),
            last_event_seq: self.last_event_seq,
            policy: self.policy.clone(),
            pipelines: self.pipelines.values().cloned().collect(),
            next_pipeline_id: self.next_pipeline_id,
            alerts: self.alerts.values().cloned().collect(),
        }
    }
}

/// Reads of the stored history (events, the audit trail, metric reports,
/// telemetry), each in one read transaction, so one sees the store as a
/// commit left it. A [`HistoryReader`] shares nothing with the path of the
/// writes (redb: the database, whose read transactions run beside a write;
/// PostgreSQL: a connection of its own), so the head's actor hands reads to
/// other threads and never waits on them, nor they on its commits.
pub(crate) trait HistoryReads: Send + Sync + std::fmt::Debug {
    /// Up to `limit` of `experiment`'s events numbered after `after`, oldest
    /// first.
    fn events_after(
        &self,
        experiment: ExperimentId,
        after: u64,
        limit: usize,
    ) -> Result<Vec<TrialEvent>, RegistryError>;
    /// The newest `limit` events of `trial`, newest first.
    fn newest_events_of_trial(
        &self,
        trial: TrialId,
        limit: usize,
    ) -> Result<Vec<TrialEvent>, RegistryError>;
    /// The newest `limit` audit entries, oldest first.
    fn audit(&self, limit: usize) -> Result<Vec<AuditEntry>, RegistryError>;
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
    ) -> Result<MetricsPage, RegistryError>;
    /// At most about `max_records` of a trial's metric reports, evenly spaced
    /// over its whole history (every report when it has no more) and always
    /// the newest, oldest first: what a learning curve needs of a history of
    /// any length (the dashboard's `/api/experiments/{id}/curves`).
    fn metric_samples(
        &self,
        trial: TrialId,
        max_records: usize,
    ) -> Result<Vec<MetricRecord>, RegistryError>;
    /// One trial's telemetry, per rank, each series oldest window first.
    fn telemetry_of(&self, trial: TrialId) -> Result<Vec<WorkerTelemetry>, RegistryError>;
}

/// A shared [`HistoryReads`].
pub(crate) type HistoryReader = Arc<dyn HistoryReads>;

/// The reader of a store that cannot be read now (closed after a failed
/// write): every read says so, so that what reads it answers as it would
/// for any failed read (a trial's detail without its events, saying why).
#[derive(Debug)]
struct Unreadable;

impl HistoryReads for Unreadable {
    fn events_after(
        &self,
        _experiment: ExperimentId,
        _after: u64,
        _limit: usize,
    ) -> Result<Vec<TrialEvent>, RegistryError> {
        Err(RegistryError::Closed)
    }

    fn newest_events_of_trial(
        &self,
        _trial: TrialId,
        _limit: usize,
    ) -> Result<Vec<TrialEvent>, RegistryError> {
        Err(RegistryError::Closed)
    }

    fn audit(&self, _limit: usize) -> Result<Vec<AuditEntry>, RegistryError> {
        Err(RegistryError::Closed)
    }

    fn metrics_page(
        &self,
        _trial: TrialId,
        _after: Option<u64>,
        _limit: usize,
        _max_bytes: usize,
    ) -> Result<MetricsPage, RegistryError> {
        Err(RegistryError::Closed)
    }

    fn metric_samples(
        &self,
        _trial: TrialId,
        _max_records: usize,
    ) -> Result<Vec<MetricRecord>, RegistryError> {
        Err(RegistryError::Closed)
    }

    fn telemetry_of(&self, _trial: TrialId) -> Result<Vec<WorkerTelemetry>, RegistryError> {
        Err(RegistryError::Closed)
    }
}

/// Where a registry's records are kept. Each call is one read or one durable
/// transaction; a failed write may leave the store closed until [`Store::reopen`].
pub(crate) trait Store: Send + std::fmt::Debug {
    /// The next metric and audit numbers, as stored.
    fn sequences(&self) -> Result<Sequences, RegistryError>;
    /// Stores `records` in one durable transaction, numbering metric reports
    /// and audit entries from `next`; returns the numbers after them.
    fn write(&mut self, records: &[Record], next: Sequences) -> Result<Sequences, RegistryError>;
    /// Every experiment, trial, node, pipeline and alert, the policy, and the
    /// number of the newest event.
    fn read_all(&self) -> Result<LoadedState, RegistryError>;
    /// What [`Store::read_all`] reads, changed after change `after` (0: all),
    /// for a standby that follows the store; `None` where no standby can
    /// follow (the embedded store).
    fn changes(&self, _after: i64) -> Result<Option<Changes>, RegistryError> {
        Ok(None)
    }
    /// Every user.
    fn users(&self) -> Result<Vec<UserRecord>, RegistryError>;
    /// A handle for reads of the stored history that shares nothing with
    /// the writes' path, for reads made off the head's actor.
    fn reader(&self) -> Result<HistoryReader, RegistryError>;
    /// Every metric report of one trial, oldest first.
    fn metrics_of(&self, trial: TrialId) -> Result<Vec<MetricRecord>, RegistryError>;
    /// One worker's telemetry series, oldest window first.
    fn telemetry_series(
        &self,
        trial: TrialId,
        rank: u32,
    ) -> Result<Vec<TelemetryWindow>, RegistryError>;
    /// Whether the store is open (it is closed after a failed write).
    fn is_open(&self) -> bool;
    /// Closes the store (after a failure).
    fn close(&mut self);
    /// Opens the store again once it can take writes (room on the disk, the
    /// database answering).
    fn reopen(&mut self) -> Result<(), RegistryError>;
    /// Makes every later write check first that the store is still led by
    /// `holder` in `epoch` (stores without standbys have no leader to check).
    fn fence(&mut self, _epoch: i64, _holder: &str) {}
    /// Up to `limit` rows of `table` after `after`, in key order, as stored.
    fn export(
        &self,
        table: copy::Table,
        after: Option<&copy::RawKey>,
        limit: usize,
    ) -> Result<Vec<copy::RawRow>, RegistryError>;
    /// Stores `rows` of `table` as they are, and the next numbers, in one
    /// transaction.
    fn import(
        &mut self,
        table: copy::Table,
        rows: &[copy::RawRow],
        next: Sequences,
    ) -> Result<(), RegistryError>;
}

/// Records changed in a store after a change number: see [`Store::changes`].
#[derive(Debug)]
pub(crate) struct Changes {
    pub(crate) records: Vec<Record>,
    /// The newest event among those changed (events are not read: a
    /// standby keeps only the numbering).
    pub(crate) last_event_seq: Option<u64>,
    /// The last change read (the number given when nothing changed).
    pub(crate) through: i64,
    /// One past the highest pipeline id stored.
    pub(crate) next_pipeline_id: u64,
}

/// The head's database.
#[derive(Debug)]
pub(crate) struct Registry {
    store: Box<dyn Store>,
    next: Sequences,
    committed: Committed,
    /// While this head follows another's writes (a standby), the last change
    /// its committed copy holds.
    following: Option<i64>,
}

impl Registry {
    /// Opens (or creates) the redb database at `path`.
    pub(crate) fn open(path: &Path) -> Result<Self, RegistryError> {
        Self::open_store(&StoreSpec::Redb(path.to_owned()))
    }

    /// Opens (or creates, or migrates) the store `spec` names.
    pub(crate) fn open_store(spec: &StoreSpec) -> Result<Self, RegistryError> {
        let store: Box<dyn Store> = match spec {
            StoreSpec::Redb(path) => Box::new(redb_store::RedbStore::open(path)?),
            StoreSpec::Postgres(target) => Box::new(postgres::PostgresStore::open(target)?),
        };
        let next = store.sequences()?;
        Ok(Self {
            store,
            next,
            committed: Committed::default(),
            following: None,
        })
    }

    /// Everything stored in the redb database at `path`, read without writing
    /// to it (for `xp status --data-dir` while no head runs). A database still
    /// open in a running head, or left needing repair by a head that was
    /// killed, is refused.
    pub(crate) fn load_read_only(path: &Path) -> Result<LoadedState, RegistryError> {
        redb_store::load_read_only(path)
    }

    /// Whether the store is open (it is closed after a failed write).
    pub(crate) fn is_open(&self) -> bool {
        self.store.is_open()
    }

    /// Everything committed so far, as [`Registry::load`] returned it plus every
    /// commit since; answered from memory, so also while the store is closed.
    pub(crate) fn committed(&self) -> LoadedState {
        self.committed.to_loaded()
    }

    /// The number of the newest event stored (0: none).
    pub(crate) fn committed_event_seq(&self) -> u64 {
        self.committed.last_event_seq
    }

    /// How many experiments and trials the committed copy holds.
    pub(crate) fn committed_counts(&self) -> (usize, usize) {
        (
            self.committed.experiments.len(),
            self.committed.trials.len(),
        )
    }

    /// Opens the store again after a failed write, once it can take writes, and
    /// loads it.
    pub(crate) fn reopen(&mut self) -> Result<LoadedState, RegistryError> {
        self.store.reopen()?;
        let loaded = self.load();
        if loaded.is_err() {
            self.close();
        }
        loaded
    }

    /// Opens the store again without loading it (a fresh connection to a
    /// database), as a standby does when it takes the lead.
    pub(crate) fn reconnect(&mut self) -> Result<(), RegistryError> {
        self.store.reopen()
    }

    /// Closes the store (after a failed read or write); [`Registry::reopen`]
    /// opens it again.
    pub(crate) fn close(&mut self) {
        self.store.close();
    }

    /// Loads every experiment, trial and node and the event numbering, and keeps a copy as the
    /// committed state. A standby that followed the store reads only what
    /// changed since it last did.
    pub(crate) fn load(&mut self) -> Result<LoadedState, RegistryError> {
        // Another head may have written since this one opened the store (a
        // standby taking over): number from what is stored now.
        self.next = self.store.sequences()?;
        if self.following.is_some()
            && let Some(changes) = self.follow()?
        {
            // This head writes from now on: its commits keep the copy.
            self.following = None;
            tracing::info!(
                changes,
                "loaded from the followed copy and the last changes"
            );
            return Ok(self.committed.to_loaded());
        }
        let loaded = self.store.read_all()?;
        self.committed = Committed::from_loaded(&loaded);
        Ok(loaded)
    }

    /// Brings the committed copy up to what another head stored (a standby
    /// keeping warm): the first call reads the whole store, later ones what
    /// changed since; how many records it read, or `None` where the store
    /// cannot be followed (redb). A failure closes the store; the next call
    /// opens it again.
    pub(crate) fn follow(&mut self) -> Result<Option<usize>, RegistryError> {
        if !self.store.is_open() {
            self.store.reopen()?;
        }
        let changes = match self.store.changes(self.following.unwrap_or(0)) {
            Ok(Some(changes)) => changes,
            Ok(None) => return Ok(None),
            Err(error) => {
                self.store.close();
                return Err(error);
            }
        };
        if self.following.is_none() {
            self.committed = Committed::default();
        }
        let read = changes.records.len();
        for record in changes.records {
            self.committed.apply(record);
        }
        if let Some(seq) = changes.last_event_seq {
            self.committed.last_event_seq = self.committed.last_event_seq.max(seq);
        }
        self.committed.next_pipeline_id =
            (self.committed.next_pipeline_id).max(changes.next_pipeline_id);
        self.following = Some(changes.through);
        Ok(Some(read))
    }

    /// Stores `records` in one durable transaction, and keeps them as committed.
    ///
    /// A store error closes the store: later commits fail with
    /// [`RegistryError::Closed`] until [`Registry::reopen`] succeeds. A record
    /// that cannot be encoded fails the commit and leaves the store open.
    /// Either way nothing of `records` is stored.
    pub(crate) fn commit(&mut self, records: Vec<Record>) -> Result<(), RegistryError> {
        if records.is_empty() {
            return Ok(());
        }
        match self.store.write(&records, self.next) {
            Ok(next) => {
                self.next = next;
                for record in records {
                    self.committed.apply(record);
                }
                Ok(())
            }
            Err(error) => {
                if !matches!(
                    error,
                    RegistryError::Encode { .. } | RegistryError::OutOfRange { .. }
                ) {
                    self.close();
                }
                Err(error)
            }
        }
    }

    /// Fences every later write: refused once the store is no longer led by
    /// `holder` in `epoch` ([`RegistryError::Fenced`]).
    pub(crate) fn fence(&mut self, epoch: i64, holder: &str) {
        self.store.fence(epoch, holder);
    }

    /// Every user.
    pub(crate) fn users(&self) -> Result<Vec<UserRecord>, RegistryError> {
        self.store.users()
    }

    /// A handle for reads of the stored history off the head's actor; while
    /// the store cannot be read, one whose every read says so.
    pub(crate) fn reader(&self) -> HistoryReader {
        self.store.reader().unwrap_or_else(|_| Arc::new(Unreadable))
    }

    /// Every metric report of one trial, oldest first (for curves and tests).
    pub(crate) fn metrics_of(&self, trial: TrialId) -> Result<Vec<MetricRecord>, RegistryError> {
        self.store.metrics_of(trial)
    }

    /// One worker's telemetry series, oldest window first (empty when none is
    /// stored), for the actor to hand the core a series it does not hold.
    pub(crate) fn telemetry_series(
        &self,
        trial: TrialId,
        rank: u32,
    ) -> Result<Vec<TelemetryWindow>, RegistryError> {
        self.store.telemetry_series(trial, rank)
    }
}

/// One page of a trial's metric history: [`HistoryReads::metrics_page`].
#[derive(Debug, Default)]
pub(crate) struct MetricsPage {
    /// The reports with their sequence numbers, oldest first.
    pub records: Vec<(u64, MetricRecord)>,
    /// How many reports the trial has.
    pub total: u64,
    /// Whether reports follow the last one here.
    pub more: bool,
}

/// The next numbers of the numbered records (metric reports, audit entries).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Sequences {
    pub(crate) metric: u64,
    pub(crate) audit: u64,
}

/// The stride of a sample of about `max_records` of a history of `total`
/// records: it keeps every stride-th record, and always the newest.
pub(crate) fn sample_stride(total: usize, max_records: usize) -> usize {
    total.div_ceil(max_records.max(1)).max(1)
}

/// Telemetry windows, in order of rank and slot, as one series per rank.
pub(crate) fn by_rank(
    windows: impl IntoIterator<Item = (u32, TelemetryWindow)>,
) -> Vec<WorkerTelemetry> {
    let mut workers: Vec<WorkerTelemetry> = Vec::new();
    for (rank, window) in windows {
        match workers.last_mut() {
            Some(worker) if worker.rank == rank => worker.windows.push(window),
            _ => workers.push(WorkerTelemetry {
                rank,
                windows: vec![window],
            }),
        }
    }
    workers
}

/// Encodes `value` as JSON for a record of `kind`.
pub(crate) fn encode<T: serde::Serialize>(
    kind: &'static str,
    value: &T,
) -> Result<Vec<u8>, RegistryError> {
    serde_json::to_vec(value).map_err(|source| RegistryError::Encode { kind, source })
}

#[cfg(test)]
pub(crate) mod tests;
