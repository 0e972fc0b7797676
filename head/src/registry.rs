//! Durable storage of the head's records in an embedded redb database.
//!
//! Invariant: [`Registry::commit`] returns only after the records are on disk
//! (redb's immediate durability), and the head acknowledges nothing before that.
//! Records are stored as JSON so that the file stays readable by later versions.

use std::path::Path;

use redb::{Database, ReadableDatabase, ReadableTable, TableDefinition};
use tracing::warn;

use crate::core::{LoadedState, MetricRecord, Record};

const EXPERIMENTS: TableDefinition<'_, &str, &[u8]> = TableDefinition::new("experiments");
const TRIALS: TableDefinition<'_, &str, &[u8]> = TableDefinition::new("trials");
const NODES: TableDefinition<'_, &str, &[u8]> = TableDefinition::new("nodes");
const EVENTS: TableDefinition<'_, u64, &[u8]> = TableDefinition::new("events");
/// Keyed by (trial id, sequence) so one trial's history is a range scan.
const METRICS: TableDefinition<'_, (&str, u64), &[u8]> = TableDefinition::new("metrics");
const META: TableDefinition<'_, &str, u64> = TableDefinition::new("meta");
/// The scheduling policy in force, under the key `current`.
const POLICY: TableDefinition<'_, &str, &[u8]> = TableDefinition::new("policy");

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
}

fn db_error(error: impl Into<redb::Error>) -> RegistryError {
    RegistryError::Database(error.into())
}

/// The head's database.
#[derive(Debug)]
pub struct Registry {
    database: Database,
    next_metric_seq: u64,
}

impl Registry {
    /// Opens (or creates) the database at `path`.
    pub fn open(path: &Path) -> Result<Self, RegistryError> {
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
            let meta = txn.open_table(META).map_err(db_error)?;
            meta.get("next_metric_seq")
                .map_err(db_error)?
                .map_or(1, |value| value.value())
        };
        txn.commit().map_err(db_error)?;
        Ok(Self {
            database,
            next_metric_seq,
        })
    }

    /// Loads every experiment, trial, node and event.
    pub fn load(&self) -> Result<LoadedState, RegistryError> {
        let txn = self.database.begin_read().map_err(db_error)?;
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
        let policy = txn.open_table(POLICY).map_err(db_error)?;
        if let Some(bytes) = policy.get("current").map_err(db_error)? {
            match serde_json::from_slice(bytes.value()) {
                Ok(record) => loaded.policy = Some(record),
                Err(error) => warn!(%error, "unreadable stored policy skipped"),
            }
        }
        Ok(loaded)
    }

    /// Stores `records` in one durable transaction.
    pub fn commit(&mut self, records: &[Record]) -> Result<(), RegistryError> {
        if records.is_empty() {
            return Ok(());
        }
        let txn = self.database.begin_write().map_err(db_error)?;
        let mut next_metric_seq = self.next_metric_seq;
        {
            let mut experiments = txn.open_table(EXPERIMENTS).map_err(db_error)?;
            let mut trials = txn.open_table(TRIALS).map_err(db_error)?;
            let mut nodes = txn.open_table(NODES).map_err(db_error)?;
            let mut events = txn.open_table(EVENTS).map_err(db_error)?;
            let mut metrics = txn.open_table(METRICS).map_err(db_error)?;
            let mut policy = txn.open_table(POLICY).map_err(db_error)?;
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
                }
            }
            let mut meta = txn.open_table(META).map_err(db_error)?;
            meta.insert("next_metric_seq", next_metric_seq)
                .map_err(db_error)?;
        }
        txn.commit().map_err(db_error)?;
        self.next_metric_seq = next_metric_seq;
        Ok(())
    }

    /// Every metric report of one trial, oldest first (for curves and tests).
    pub fn metrics_of(
        &self,
        trial: xp_runtime::ids::TrialId,
    ) -> Result<Vec<MetricRecord>, RegistryError> {
        let txn = self.database.begin_read().map_err(db_error)?;
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
}

fn encode<T: serde::Serialize>(kind: &'static str, value: &T) -> Result<Vec<u8>, RegistryError> {
    serde_json::to_vec(value).map_err(|source| RegistryError::Encode { kind, source })
}
