//! The redb store's rows as stored, for `xp-head store copy`: read a page at a
//! time in key order, written back unchanged.

use std::ops::Bound;

use redb::{ReadableDatabase, TableDefinition};

use super::super::copy::{RawKey, RawRow, Table};
use super::super::{RegistryError, Sequences};
use super::events::EventIndex;
use super::{
    ALERTS, AUDIT, EVENTS, EXPERIMENTS, META, METRICS, NODES, PIPELINES, POLICY, RedbStore,
    TELEMETRY, TRIALS, USERS, begin_write, db_error,
};

type TextTable = TableDefinition<'static, &'static str, &'static [u8]>;
type NumberTable = TableDefinition<'static, u64, &'static [u8]>;

fn text_table(table: Table) -> Option<TextTable> {
    Some(match table {
        Table::Experiments => EXPERIMENTS,
        Table::Trials => TRIALS,
        Table::Nodes => NODES,
        Table::Users => USERS,
        Table::Policy => POLICY,
        _ => return None,
    })
}

fn number_table(table: Table) -> Option<NumberTable> {
    Some(match table {
        Table::Events => EVENTS,
        Table::Audit => AUDIT,
        Table::Pipelines => PIPELINES,
        Table::Alerts => ALERTS,
        _ => return None,
    })
}

/// A key of the wrong kind for its table: a caller's mistake, said as an error.
fn wrong_key(table: Table) -> RegistryError {
    RegistryError::CopyRow {
        table: table.name(),
        reason: "a key of another kind".to_owned(),
    }
}

/// Up to `limit` rows of `table` (as `def`) after `start`, keys made raw by `raw`.
fn page<K: redb::Key + 'static>(
    txn: &redb::ReadTransaction,
    def: TableDefinition<'_, K, &'static [u8]>,
    start: Bound<K::SelfType<'_>>,
    limit: usize,
    raw: impl Fn(K::SelfType<'_>) -> RawKey,
) -> Result<Vec<RawRow>, RegistryError> {
    let table = txn.open_table(def).map_err(db_error)?;
    let mut rows = Vec::new();
    for entry in table
        .range::<K::SelfType<'_>>((start, Bound::Unbounded))
        .map_err(db_error)?
        .take(limit)
    {
        let (key, value) = entry.map_err(db_error)?;
        rows.push(RawRow {
            key: raw(key.value()),
            record: value.value().to_vec(),
        });
    }
    Ok(rows)
}

impl RedbStore {
    /// Up to `limit` rows of `table` after `after`, in key order, as stored.
    pub(super) fn export_rows(
        &self,
        table: Table,
        after: Option<&RawKey>,
        limit: usize,
    ) -> Result<Vec<RawRow>, RegistryError> {
        let txn = self.database()?.begin_read().map_err(db_error)?;
        if let Some(def) = text_table(table) {
            let start = match after {
                None => Bound::Unbounded,
                Some(RawKey::Text(key)) => Bound::Excluded(key.as_str()),
                Some(_) => return Err(wrong_key(table)),
            };
            return page(&txn, def, start, limit, |key| RawKey::Text(key.to_owned()));
        }
        if let Some(def) = number_table(table) {
            let start = match after {
                None => Bound::Unbounded,
                Some(RawKey::Number(key)) => Bound::Excluded(*key),
                Some(_) => return Err(wrong_key(table)),
            };
            return page(&txn, def, start, limit, RawKey::Number);
        }
        if table == Table::Metrics {
            let start = match after {
                None => Bound::Unbounded,
                Some(RawKey::Metric(trial, seq)) => Bound::Excluded((trial.as_str(), *seq)),
                Some(_) => return Err(wrong_key(table)),
            };
            return page(&txn, METRICS, start, limit, |(trial, seq)| {
                RawKey::Metric(trial.to_owned(), seq)
            });
        }
        let start = match after {
            None => Bound::Unbounded,
            Some(RawKey::Telemetry(trial, rank, slot)) => {
                Bound::Excluded((trial.as_str(), *rank, *slot))
            }
            Some(_) => return Err(wrong_key(table)),
        };
        page(&txn, TELEMETRY, start, limit, |(trial, rank, slot)| {
            RawKey::Telemetry(trial.to_owned(), rank, slot)
        })
    }

    /// Stores `rows` of `table` unchanged, and the next numbers, in one transaction.
    pub(super) fn import_rows(
        &mut self,
        table: Table,
        rows: &[RawRow],
        next: Sequences,
    ) -> Result<(), RegistryError> {
        let txn = begin_write(self.database()?)?;
        {
            let mut text = text_table(table)
                .map(|def| txn.open_table(def))
                .transpose()
                .map_err(db_error)?;
            let mut number = number_table(table)
                .map(|def| txn.open_table(def))
                .transpose()
                .map_err(db_error)?;
            let mut metrics = txn.open_table(METRICS).map_err(db_error)?;
            let mut telemetry = txn.open_table(TELEMETRY).map_err(db_error)?;
            let mut event_index = EventIndex::open(&txn)?;
            for row in rows {
                let record = row.record.as_slice();
                let inserted = match (&row.key, text.as_mut(), number.as_mut()) {
                    (RawKey::Text(key), Some(text), _) => text.insert(key.as_str(), record),
                    (RawKey::Number(key), _, Some(number)) => {
                        if table == Table::Events {
                            event_index.insert_stored(*key, record)?;
                        }
                        number.insert(*key, record)
                    }
                    (RawKey::Metric(trial, seq), _, _) if table == Table::Metrics => {
                        metrics.insert((trial.as_str(), *seq), record)
                    }
                    (RawKey::Telemetry(trial, rank, slot), _, _) if table == Table::Telemetry => {
                        telemetry.insert((trial.as_str(), *rank, *slot), record)
                    }
                    _ => return Err(wrong_key(table)),
                };
                inserted.map_err(db_error)?;
            }
            let mut meta = txn.open_table(META).map_err(db_error)?;
            meta.insert("next_metric_seq", next.metric)
                .map_err(db_error)?;
            meta.insert("next_audit_seq", next.audit)
                .map_err(db_error)?;
        }
        txn.commit().map_err(db_error)?;
        Ok(())
    }
}
