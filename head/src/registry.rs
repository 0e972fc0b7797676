//! Durable storage of the head's records in an embedded redb database.
//!
//! Invariant: [`Registry::commit`] returns only after the records are on disk
//! (redb's immediate durability), and the head acknowledges nothing before that.
//! Records are stored as JSON so that the file stays readable by later versions.
//!
//! A failed write (a full disk) leaves redb refusing every later call until the
//! database is closed and opened again, so a failed commit closes it here, and
//! [`Registry::reopen`] opens it again once a probe write shows there is room.
//! While it is closed, [`Registry::committed`] still answers: the registry keeps
//! a copy of everything committed (what [`Registry::load`] would return), so the
//! head can rebuild its state from what is stored without reading the disk.
//!
//! Invariant: [`Registry::committed`] equals what the database holds, as far as
//! this process knows: it is updated only after a commit succeeded.

use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};

use redb::{Database, ReadableDatabase, ReadableTable, TableDefinition};
use tracing::{debug, warn};
use xp_runtime::ids::{ExperimentId, NodeId, TrialId};
use xp_runtime::protocol::TrialEvent;

use xp_head_core::auth::users::UserRecord;
use xp_head_core::{
    ExperimentRecord, LoadedState, MetricRecord, NodeRecord, PolicyRecord, Record, TelemetryRecord,
    TrialRecord,
};
use xp_runtime::protocol::AuditEntry;

mod samples;

mod telemetry;

const EXPERIMENTS: TableDefinition<'_, &str, &[u8]> = TableDefinition::new("experiments");
const TRIALS: TableDefinition<'_, &str, &[u8]> = TableDefinition::new("trials");
const NODES: TableDefinition<'_, &str, &[u8]> = TableDefinition::new("nodes");
const EVENTS: TableDefinition<'_, u64, &[u8]> = TableDefinition::new("events");
/// Keyed by (trial id, sequence) so one trial's history is a range scan.
const METRICS: TableDefinition<'_, (&str, u64), &[u8]> = TableDefinition::new("metrics");
const META: TableDefinition<'_, &str, u64> = TableDefinition::new("meta");
/// The scheduling policy in force, under the key `current`.
const POLICY: TableDefinition<'_, &str, &[u8]> = TableDefinition::new("policy");
/// Users by name.
const USERS: TableDefinition<'_, &str, &[u8]> = TableDefinition::new("users");
/// The audit trail by sequence number.
const AUDIT: TableDefinition<'_, u64, &[u8]> = TableDefinition::new("audit");
/// Telemetry windows by (trial id, rank, slot), so one trial's series is a range scan.
const TELEMETRY: TableDefinition<'_, (&str, u32, u32), &[u8]> = TableDefinition::new("telemetry");
/// Pipelines by id.
const PIPELINES: TableDefinition<'_, u64, &[u8]> = TableDefinition::new("pipelines");
/// Alerts by id (insert or replace: an alert's delivery state and clearing change).
const ALERTS: TableDefinition<'_, u64, &[u8]> = TableDefinition::new("alerts");

/// How much room a probe must find before the database is opened again after a
/// failed write: enough for the database to grow a little, so that a disk with a
/// few bytes free does not make the head flap between failing and re-opening.
pub(crate) const PROBE_BYTES: usize = 1 << 20;

/// The probe file's name in the database's directory.
const PROBE_FILE: &str = ".xp-space-probe";

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

fn db_error(error: impl Into<redb::Error>) -> RegistryError {
    RegistryError::Database(error.into())
}

/// What the database holds, kept in memory: experiments, trials and nodes by id,
/// events by sequence and the policy (metrics are not kept; they stay on disk).
#[derive(Debug, Default, Clone)]
struct Committed {
    experiments: BTreeMap<ExperimentId, ExperimentRecord>,
    trials: BTreeMap<TrialId, TrialRecord>,
    nodes: BTreeMap<NodeId, NodeRecord>,
    events: BTreeMap<u64, TrialEvent>,
    policy: Option<PolicyRecord>,
    pipelines: BTreeMap<u64, xp_head_core::PipelineRecord>,
    next_pipeline_id: u64,
    alerts: BTreeMap<u64, xp_head_core::AlertRecord>,
}

impl Committed {
    fn from_loaded(loaded: &LoadedState) -> Self {
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
            events: loaded
                .events
                .iter()
                .map(|event| (event.seq, event.clone()))
                .collect(),
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

    fn apply(&mut self, record: Record) {
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
            Record::Event(event) => {
                self.events.insert(event.seq, event);
            }
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

    fn to_loaded(&self) -> LoadedState {
        LoadedState {
            experiments: self.experiments.values().cloned().collect(),
            trials: self.trials.values().cloned().collect(),
            nodes: self.nodes.values().cloned().collect(),
            events: self.events.values().cloned().collect(),
            policy: self.policy.clone(),
            pipelines: self.pipelines.values().cloned().collect(),
            next_pipeline_id: self.next_pipeline_id,
            alerts: self.alerts.values().cloned().collect(),
        }
    }
}

/// The head's database.
#[derive(Debug)]
pub(crate) struct Registry {
    path: PathBuf,
    /// `None` after a failed write, until [`Registry::reopen`] succeeds.
    database: Option<Database>,
    next_metric_seq: u64,
    next_audit_seq: u64,
    committed: Committed,
}

impl Registry {
    /// Opens (or creates) the database at `path`.
    pub(crate) fn open(path: &Path) -> Result<Self, RegistryError> {
        let (database, (next_metric_seq, next_audit_seq)) = open_database(path)?;
        Ok(Self {
            path: path.to_owned(),
            database: Some(database),
            next_metric_seq,
            next_audit_seq,
            committed: Committed::default(),
        })
    }

    /// Whether the database is open (it is closed after a failed write).
    pub(crate) fn is_open(&self) -> bool {
        self.database.is_some()
    }

    /// Everything committed so far, as [`Registry::load`] returned it plus every
    /// commit since; answered from memory, so also while the database is closed.
    pub(crate) fn committed(&self) -> LoadedState {
        self.committed.to_loaded()
    }

    /// Opens the database again after a failed write, once a probe shows that
    /// its directory has room ([`PROBE_BYTES`]), and loads it.
    pub(crate) fn reopen(&mut self) -> Result<LoadedState, RegistryError> {
        if let Some(database) = self.database.take()
            && let Err(error) = database.close()
        {
            debug!(%error, "closing the registry database before re-opening it");
        }
        let dir = self
            .path
            .parent()
            .map_or_else(|| PathBuf::from("."), Path::to_owned);
        probe_room(&dir, PROBE_BYTES).map_err(|source| RegistryError::NoRoom {
            dir,
            bytes: PROBE_BYTES,
            source,
        })?;
        let (database, (next_metric_seq, next_audit_seq)) = open_database(&self.path)?;
        self.database = Some(database);
        self.next_metric_seq = next_metric_seq;
        self.next_audit_seq = next_audit_seq;
        match self.load() {
            Ok(loaded) => Ok(loaded),
            Err(error) => {
                self.close();
                Err(error)
            }
        }
    }

    /// Closes the database (after a failed read or write); [`Registry::reopen`]
    /// opens it again.
    pub(crate) fn close(&mut self) {
        if let Some(database) = self.database.take()
            && let Err(error) = database.close()
        {
            debug!(%error, "closing the registry database after a failure");
        }
    }

    fn database(&self) -> Result<&Database, RegistryError> {
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

/// Opens (or creates) the database at `path` and its tables; returns it with the
/// next metric and audit sequence numbers.
fn open_database(path: &Path) -> Result<(Database, (u64, u64)), RegistryError> {
    let database = Database::create(path).map_err(db_error)?;
    let txn = database.begin_write().map_err(db_error)?;
    let next_metric_seq = {
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
        let meta = txn.open_table(META).map_err(db_error)?;
        let next = |key| {
            meta.get(key)
                .map_err(db_error)
                .map(|value| value.map_or(1, |value| value.value()))
        };
        (next("next_metric_seq")?, next("next_audit_seq")?)
    };
    txn.commit().map_err(db_error)?;
    Ok((database, next_metric_seq))
}

impl Registry {
    /// Loads every experiment, trial, node and event, and keeps a copy as the
    /// committed state.
    pub(crate) fn load(&mut self) -> Result<LoadedState, RegistryError> {
        let loaded = self.read_all()?;
        self.committed = Committed::from_loaded(&loaded);
        Ok(loaded)
    }

    fn read_all(&self) -> Result<LoadedState, RegistryError> {
        read_all(self.database()?)
    }

    /// Everything stored in the database at `path`, read without writing to it
    /// (for `xp status --data-dir` while no head runs). A database still open in
    /// a running head, or left needing repair by a head that was killed, is refused.
    pub(crate) fn load_read_only(path: &Path) -> Result<LoadedState, RegistryError> {
        let database = redb::ReadOnlyDatabase::open(path).map_err(db_error)?;
        read_all(&database)
    }
}

/// Every experiment, trial, node and event and the policy stored in `database`.
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
    decode_all(
        &txn.open_table(EVENTS).map_err(db_error)?,
        "event",
        &mut loaded.events,
    )?;
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

impl Registry {
    /// Stores `records` in one durable transaction, and keeps them as committed.
    ///
    /// A database error closes the database (redb refuses everything after a
    /// failed write until it is opened again): later commits fail with
    /// [`RegistryError::Closed`] until [`Registry::reopen`] succeeds. A record
    /// that cannot be encoded fails the commit and leaves the database open.
    /// Either way nothing of `records` is stored.
    pub(crate) fn commit(&mut self, records: Vec<Record>) -> Result<(), RegistryError> {
        if records.is_empty() {
            return Ok(());
        }
        match self.write(&records) {
            Ok((next_metric_seq, next_audit_seq)) => {
                self.next_metric_seq = next_metric_seq;
                self.next_audit_seq = next_audit_seq;
                for record in records {
                    self.committed.apply(record);
                }
                Ok(())
            }
            Err(error) => {
                if matches!(error, RegistryError::Database(_)) {
                    self.close();
                }
                Err(error)
            }
        }
    }

    /// Writes `records` in one durable transaction; returns the next metric and
    /// audit sequence numbers.
    fn write(&self, records: &[Record]) -> Result<(u64, u64), RegistryError> {
        let txn = self.database()?.begin_write().map_err(db_error)?;
        let mut sequences = Sequences {
            metric: self.next_metric_seq,
            audit: self.next_audit_seq,
        };
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
        Ok((sequences.metric, sequences.audit))
    }

    /// Every user.
    pub(crate) fn users(&self) -> Result<Vec<UserRecord>, RegistryError> {
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

    /// The newest `limit` audit entries, oldest first.
    pub(crate) fn audit(&self, limit: usize) -> Result<Vec<AuditEntry>, RegistryError> {
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

    /// Every metric report of one trial, oldest first (for curves and tests).
    pub(crate) fn metrics_of(&self, trial: TrialId) -> Result<Vec<MetricRecord>, RegistryError> {
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

    /// One page of a trial's metric reports in arrival order: at most `limit`
    /// reports after sequence number `after`, ending early once their stored size
    /// reaches `max_bytes` (one report is returned even if larger), and how many
    /// the trial has in all. A page holds only its own reports, however long
    /// the history is.
    pub(crate) fn metrics_page(
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
}

/// One page of a trial's metric history: [`Registry::metrics_page`].
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
struct Sequences {
    metric: u64,
    audit: u64,
}

/// The tables one commit writes records to, open in its transaction.
struct WriteTables<'txn> {
    users: redb::Table<'txn, &'static str, &'static [u8]>,
    audit: redb::Table<'txn, u64, &'static [u8]>,
    experiments: redb::Table<'txn, &'static str, &'static [u8]>,
    trials: redb::Table<'txn, &'static str, &'static [u8]>,
    nodes: redb::Table<'txn, &'static str, &'static [u8]>,
    events: redb::Table<'txn, u64, &'static [u8]>,
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
            Record::Event(event) => put(&mut self.events, event.seq, "event", event),
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

fn encode<T: serde::Serialize>(kind: &'static str, value: &T) -> Result<Vec<u8>, RegistryError> {
    serde_json::to_vec(value).map_err(|source| RegistryError::Encode { kind, source })
}

#[cfg(test)]
pub(crate) mod tests;
