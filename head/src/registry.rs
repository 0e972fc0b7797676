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
    ExperimentRecord, LoadedState, MetricRecord, NodeRecord, PolicyRecord, Record, TrialRecord,
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
        let mut next_metric_seq = self.next_metric_seq;
        let mut next_audit_seq = self.next_audit_seq;
        {
            let mut users = txn.open_table(USERS).map_err(db_error)?;
            let mut audit = txn.open_table(AUDIT).map_err(db_error)?;
            let mut experiments = txn.open_table(EXPERIMENTS).map_err(db_error)?;
            let mut trials = txn.open_table(TRIALS).map_err(db_error)?;
            let mut nodes = txn.open_table(NODES).map_err(db_error)?;
            let mut events = txn.open_table(EVENTS).map_err(db_error)?;
            let mut metrics = txn.open_table(METRICS).map_err(db_error)?;
            let mut policy = txn.open_table(POLICY).map_err(db_error)?;
            let mut telemetry = txn.open_table(TELEMETRY).map_err(db_error)?;
            let mut pipelines = txn.open_table(PIPELINES).map_err(db_error)?;
            let mut alerts = txn.open_table(ALERTS).map_err(db_error)?;
            for record in records {
                match record {
                    Record::Experiment(experiment) => {
                        let bytes = encode("experiment", experiment)?;
                        experiments
                            .insert(experiment.id.to_string().as_str(), bytes.as_slice())
                            .map_err(db_error)?;
                    }
                    Record::Trial(trial) => {
                        let bytes = encode("trial", trial)?;
                        trials
                            .insert(trial.id.to_string().as_str(), bytes.as_slice())
                            .map_err(db_error)?;
                    }
                    Record::Node(node) => {
                        let bytes = encode("node", node)?;
                        nodes
                            .insert(node.id.to_string().as_str(), bytes.as_slice())
                            .map_err(db_error)?;
                    }
                    Record::Event(event) => {
                        let bytes = encode("event", event)?;
                        events
                            .insert(event.seq, bytes.as_slice())
                            .map_err(db_error)?;
                    }
                    Record::Metric(metric) => {
                        let bytes = encode("metric", metric)?;
                        let trial = metric.key.trial.to_string();
                        metrics
                            .insert((trial.as_str(), next_metric_seq), bytes.as_slice())
                            .map_err(db_error)?;
                        next_metric_seq += 1;
                    }
                    Record::Policy(record) => {
                        let bytes = encode("policy", record)?;
                        policy
                            .insert("current", bytes.as_slice())
                            .map_err(db_error)?;
                    }
                    Record::User(user) => {
                        let bytes = encode("user", user)?;
                        users
                            .insert(user.name.as_str(), bytes.as_slice())
                            .map_err(db_error)?;
                    }
                    Record::Pipeline(pipeline) => {
                        let bytes = encode("pipeline", pipeline)?;
                        pipelines
                            .insert(pipeline.id, bytes.as_slice())
                            .map_err(db_error)?;
                    }
                    Record::Alert(alert) => {
                        let bytes = encode("alert", alert)?;
                        alerts
                            .insert(alert.id, bytes.as_slice())
                            .map_err(db_error)?;
                    }
                    Record::Audit(entry) => {
                        let numbered = AuditEntry {
                            seq: next_audit_seq,
                            ..entry.clone()
                        };
                        let bytes = encode("audit", &numbered)?;
                        audit
                            .insert(next_audit_seq, bytes.as_slice())
                            .map_err(db_error)?;
                        next_audit_seq += 1;
                    }
                    Record::Telemetry(window) => {
                        let trial = window.trial.to_string();
                        let key = (trial.as_str(), window.rank, window.slot);
                        match &window.window {
                            Some(stored) => {
                                let bytes = encode("telemetry", stored)?;
                                telemetry.insert(key, bytes.as_slice()).map_err(db_error)?;
                            }
                            None => {
                                telemetry.remove(key).map_err(db_error)?;
                            }
                        }
                    }
                }
            }
            let mut meta = txn.open_table(META).map_err(db_error)?;
            meta.insert("next_metric_seq", next_metric_seq)
                .map_err(db_error)?;
            meta.insert("next_audit_seq", next_audit_seq)
                .map_err(db_error)?;
        }
        txn.commit().map_err(db_error)?;
        Ok((next_metric_seq, next_audit_seq))
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

fn encode<T: serde::Serialize>(kind: &'static str, value: &T) -> Result<Vec<u8>, RegistryError> {
    serde_json::to_vec(value).map_err(|source| RegistryError::Encode { kind, source })
}

#[cfg(test)]
pub(crate) mod tests {
    use std::process::Command;

    use xp_runtime::ids::ExperimentId;
    use xp_runtime::protocol::TrialState;

    use super::*;

    /// An event whose reason pads it to about `bytes`, so the database must grow.
    fn event(seq: u64, bytes: usize) -> Record {
        Record::Event(TrialEvent {
            seq,
            at: seq,
            trial: TrialId {
                experiment: ExperimentId { digest: 7, run: 1 },
                index: 0,
            },
            state: TrialState::Running,
            attempt: 1,
            reason: "x".repeat(bytes),
        })
    }

    fn event_seqs(loaded: &LoadedState) -> Vec<u64> {
        loaded.events.iter().map(|event| event.seq).collect()
    }

    /// A small tmpfs, unmounted on drop (also used by the actor's tests).
    pub(crate) struct Tmpfs {
        pub(crate) path: PathBuf,
        _dir: tempfile::TempDir,
    }

    impl Tmpfs {
        /// Mounts one, or `None` where that is not allowed (not root).
        pub(crate) fn mount(size: &str) -> Option<Self> {
            let dir = tempfile::tempdir().expect("a temporary directory");
            let path = dir.path().join("mnt");
            std::fs::create_dir(&path).expect("a mount point");
            let mounted = Command::new("mount")
                .args(["-t", "tmpfs", "-o", &format!("size={size}"), "tmpfs"])
                .arg(&path)
                .output()
                .is_ok_and(|output| output.status.success());
            mounted.then_some(Self { path, _dir: dir })
        }

        /// Fills it with a filler file until the disk is full; returns the file's path.
        pub(crate) fn fill(&self) -> PathBuf {
            let path = self.path.join("filler");
            let mut file = std::fs::File::create(&path).expect("the filler file");
            let chunk = vec![1u8; 64 << 10];
            loop {
                if let Err(error) = file.write_all(&chunk).and_then(|()| file.sync_all()) {
                    assert_eq!(error.kind(), std::io::ErrorKind::StorageFull, "{error}");
                    break;
                }
            }
            // Fill the last partial page too.
            while file.write_all(&[1u8]).is_ok() {}
            path
        }
    }

    impl Drop for Tmpfs {
        fn drop(&mut self) {
            let _ = Command::new("umount").arg("-l").arg(&self.path).status();
        }
    }

    #[test]
    fn committed_is_what_a_fresh_load_returns() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("head.redb");
        let mut registry = Registry::open(&path).unwrap();
        registry.load().unwrap();
        registry.commit(vec![event(1, 10), event(2, 10)]).unwrap();
        registry.commit(vec![event(3, 10)]).unwrap();
        assert_eq!(event_seqs(&registry.committed()), [1, 2, 3]);
        drop(registry);
        let mut again = Registry::open(&path).unwrap();
        assert_eq!(event_seqs(&again.load().unwrap()), [1, 2, 3]);
        assert_eq!(event_seqs(&again.committed()), [1, 2, 3]);
    }

    #[test]
    fn an_unreadable_pipeline_record_still_holds_its_id() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("head.redb");
        {
            let database = Database::create(&path).unwrap();
            let txn = database.begin_write().unwrap();
            txn.open_table(PIPELINES)
                .unwrap()
                .insert(7, b"{not json".as_slice())
                .unwrap();
            txn.commit().unwrap();
        }
        let loaded = Registry::open(&path).unwrap().load().unwrap();
        assert!(loaded.pipelines.is_empty());
        assert_eq!(loaded.next_pipeline_id, 8);
    }

    #[test]
    fn users_and_the_audit_trail_are_stored_and_numbered() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("head.redb");
        let user = |role| UserRecord {
            name: "ana".to_owned(),
            team: "vision".to_owned(),
            role,
            secret_hash: "00".repeat(32),
            created_at: 1,
            revoked_at: None,
        };
        let entry = |action: &str| {
            Record::Audit(AuditEntry {
                seq: 0,
                at: 2,
                who: "ana".to_owned(),
                action: action.to_owned(),
                allowed: false,
                detail: "needs role admin".to_owned(),
            })
        };
        let mut registry = Registry::open(&path).unwrap();
        registry.load().unwrap();
        registry
            .commit(vec![
                Record::User(user(xp_head_core::auth::Role::Viewer)),
                entry("one"),
            ])
            .unwrap();
        registry
            .commit(vec![
                Record::User(user(xp_head_core::auth::Role::Member)),
                entry("two"),
                entry("three"),
            ])
            .unwrap();
        drop(registry);
        let mut again = Registry::open(&path).unwrap();
        again.load().unwrap();
        assert_eq!(
            again.users().unwrap(),
            [user(xp_head_core::auth::Role::Member)]
        );
        again.commit(vec![entry("four")]).unwrap();
        let trail = again.audit(3).unwrap();
        let seqs: Vec<(u64, &str)> = trail
            .iter()
            .map(|entry| (entry.seq, entry.action.as_str()))
            .collect();
        assert_eq!(seqs, [(2, "two"), (3, "three"), (4, "four")]);
    }

    #[test]
    fn a_read_only_load_is_refused_while_open_and_reads_what_was_committed() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("head.redb");
        let mut registry = Registry::open(&path).unwrap();
        registry.load().unwrap();
        registry.commit(vec![event(1, 10), event(2, 10)]).unwrap();
        assert!(
            Registry::load_read_only(&path).is_err(),
            "a running head holds it"
        );
        drop(registry);
        assert_eq!(
            event_seqs(&Registry::load_read_only(&path).unwrap()),
            [1, 2]
        );
        // Reading wrote nothing: the database opens for writing as before.
        assert_eq!(
            event_seqs(&Registry::open(&path).unwrap().load().unwrap()),
            [1, 2]
        );
    }

    #[test]
    fn a_closed_registry_refuses_commits_and_reads_but_answers_committed() {
        let dir = tempfile::tempdir().unwrap();
        let mut registry = Registry::open(&dir.path().join("head.redb")).unwrap();
        registry.load().unwrap();
        registry.commit(vec![event(1, 10)]).unwrap();
        registry.close();
        assert!(!registry.is_open());
        assert!(matches!(
            registry.commit(vec![event(2, 10)]),
            Err(RegistryError::Closed)
        ));
        assert!(matches!(
            registry.metrics_of(TrialId {
                experiment: ExperimentId { digest: 7, run: 1 },
                index: 0,
            }),
            Err(RegistryError::Closed)
        ));
        assert_eq!(event_seqs(&registry.committed()), [1]);
        let loaded = registry.reopen().unwrap();
        assert!(registry.is_open());
        assert_eq!(event_seqs(&loaded), [1]);
        registry.commit(vec![event(2, 10)]).unwrap();
        assert_eq!(event_seqs(&registry.committed()), [1, 2]);
    }

    #[test]
    #[expect(clippy::print_stderr, reason = "say why the test is skipped")]
    fn a_full_disk_closes_the_database_and_it_reopens_once_there_is_room() {
        let Some(tmpfs) = Tmpfs::mount("8m") else {
            eprintln!("skipped: cannot mount a tmpfs here (needs root)");
            return;
        };
        let mut registry = Registry::open(&tmpfs.path.join("head.redb")).unwrap();
        registry.load().unwrap();
        registry.commit(vec![event(1, 100)]).unwrap();
        let filler = tmpfs.fill();

        // Commit until the database must grow and cannot.
        let mut seq = 2;
        let failure = loop {
            match registry.commit(vec![event(seq, 16 << 10)]) {
                Ok(()) => seq += 1,
                Err(error) => break error,
            }
            assert!(seq < 10_000, "commits kept succeeding on a full disk");
        };
        assert!(failure.is_disk_full(), "{failure}");
        assert!(!registry.is_open());
        let stored: Vec<u64> = (1..seq).collect();
        assert_eq!(event_seqs(&registry.committed()), stored);
        assert!(matches!(
            registry.commit(vec![event(seq, 10)]),
            Err(RegistryError::Closed)
        ));

        // Still full: the probe finds no room and the database stays closed.
        let refused = registry.reopen().unwrap_err();
        assert!(refused.is_disk_full(), "{refused}");
        assert!(!registry.is_open());

        // Room again: it re-opens with exactly what was committed, and takes more.
        std::fs::remove_file(filler).unwrap();
        let loaded = registry.reopen().unwrap();
        assert_eq!(event_seqs(&loaded), stored);
        registry.commit(vec![event(seq, 100)]).unwrap();
        drop(registry);
        let mut again = Registry::open(&tmpfs.path.join("head.redb")).unwrap();
        let mut expected = stored;
        expected.push(seq);
        assert_eq!(event_seqs(&again.load().unwrap()), expected);
    }

    #[test]
    fn metric_pages_hold_each_report_of_their_trial_once() {
        let dir = tempfile::tempdir().unwrap();
        let mut registry = Registry::open(&dir.path().join("head.redb")).unwrap();
        registry.load().unwrap();
        let trial = |index| TrialId {
            experiment: ExperimentId { digest: 7, run: 1 },
            index,
        };
        let metric = |index, step: u64| {
            Record::Metric(MetricRecord {
                key: xp_runtime::ids::WorkerKey {
                    trial: trial(index),
                    attempt: 1,
                    rank: 0,
                },
                step: Some(step),
                values: [("loss".to_owned(), step as f64)].into(),
                at: step,
            })
        };
        // Trial 1's reports interleaved with trial 10's, whose id shares its prefix.
        for step in 0..250 {
            registry
                .commit(vec![metric(1, step), metric(10, step)])
                .unwrap();
        }
        let walk = |limit, max_bytes| {
            let mut steps = Vec::new();
            let mut after = None;
            loop {
                let page = registry
                    .metrics_page(trial(1), after, limit, max_bytes)
                    .unwrap();
                assert_eq!(page.total, 250);
                assert!(!page.records.is_empty() && page.records.len() <= limit);
                steps.extend(page.records.iter().map(|(_, record)| record.step.unwrap()));
                if !page.more {
                    return steps;
                }
                after = page.records.last().map(|(seq, _)| *seq);
            }
        };
        let all: Vec<u64> = (0..250).collect();
        assert_eq!(walk(100, usize::MAX), all);
        assert_eq!(walk(1, usize::MAX), all);
        // A byte budget smaller than one report still moves one at a time.
        assert_eq!(walk(1000, 1), all);
        let empty = registry
            .metrics_page(trial(2), None, 100, usize::MAX)
            .unwrap();
        assert_eq!(
            (empty.records.len(), empty.total, empty.more),
            (0, 0, false)
        );
        let past_the_end = registry
            .metrics_page(trial(1), Some(u64::MAX), 100, usize::MAX)
            .unwrap();
        assert_eq!((past_the_end.records.len(), past_the_end.total), (0, 250));
    }
}
