//! A commit's records as rows of the PostgreSQL registry's tables, written with
//! one statement per table (arrays through `unnest`), and the reads that decode
//! rows back into records.

use std::collections::BTreeMap;

use ::postgres::fallible_iterator::FallibleIterator;
use ::postgres::types::ToSql;
use ::postgres::{Client, GenericClient, Row, Transaction};
use serde::de::DeserializeOwned;

use xp_head_core::{LoadedState, Record};
use xp_runtime::protocol::AuditEntry;

use super::super::copy::{RawKey, RawRow, Table};
use super::super::{MetricsPage, RegistryError, Sequences, encode};
use super::unreadable;

/// Rows keyed by text (ids, names), the last record of a key in a batch winning.
type TextKeyed = BTreeMap<String, String>;
/// Rows keyed by number.
type NumberKeyed = BTreeMap<i64, String>;

/// One commit's rows, table by table. A batch may hold several records of one
/// key (a trial placed, then started): the last wins, as it would one by one.
#[derive(Debug, Default)]
pub(super) struct Rows {
    experiments: TextKeyed,
    trials: TextKeyed,
    nodes: TextKeyed,
    users: TextKeyed,
    policy: TextKeyed,
    events: NumberKeyed,
    audit: NumberKeyed,
    pipelines: NumberKeyed,
    alerts: NumberKeyed,
    /// (trial, seq, record): every report has a number of its own.
    metrics: Vec<(String, i64, String)>,
    /// A window stored, or `None` for a slot removed.
    telemetry: BTreeMap<(String, i64, i64), Option<String>>,
}

/// `value` as a key column: the stores number from 1, far below `i64::MAX`.
fn number(kind: &'static str, value: u64) -> Result<i64, RegistryError> {
    i64::try_from(value).map_err(|_| RegistryError::OutOfRange { kind, value })
}

fn text(kind: &'static str, value: &impl serde::Serialize) -> Result<String, RegistryError> {
    // serde_json writes UTF-8 only.
    Ok(String::from_utf8(encode(kind, value)?).expect("serde_json writes UTF-8"))
}

impl Rows {
    /// `records` as rows, metric reports and audit entries numbered from
    /// `next`; with the numbers after them.
    pub(super) fn encode(
        records: &[Record],
        mut next: Sequences,
    ) -> Result<(Self, Sequences), RegistryError> {
        let mut rows = Self::default();
        for record in records {
            rows.add(record, &mut next)?;
        }
        Ok((rows, next))
    }

    fn add(&mut self, record: &Record, next: &mut Sequences) -> Result<(), RegistryError> {
        match record {
            Record::Experiment(r) => {
                self.experiments
                    .insert(r.id.to_string(), text("experiment", r)?);
            }
            Record::Trial(r) => {
                self.trials.insert(r.id.to_string(), text("trial", r)?);
            }
            Record::Node(r) => {
                self.nodes.insert(r.id.to_string(), text("node", r)?);
            }
            Record::User(r) => {
                self.users.insert(r.name.clone(), text("user", r)?);
            }
            Record::Policy(r) => {
                self.policy.insert("current".to_owned(), text("policy", r)?);
            }
            Record::Event(r) => {
                self.events
                    .insert(number("event", r.seq)?, text("event", r)?);
            }
            Record::Pipeline(r) => {
                self.pipelines
                    .insert(number("pipeline", r.id)?, text("pipeline", r)?);
            }
            Record::Alert(r) => {
                self.alerts
                    .insert(number("alert", r.id)?, text("alert", r)?);
            }
            Record::Metric(r) => {
                let seq = number("metric", next.metric)?;
                self.metrics
                    .push((r.key.trial.to_string(), seq, text("metric", r)?));
                next.metric += 1;
            }
            Record::Audit(entry) => {
                let seq = number("audit", next.audit)?;
                let numbered = AuditEntry {
                    seq: next.audit,
                    ..entry.clone()
                };
                self.audit.insert(seq, text("audit", &numbered)?);
                next.audit += 1;
            }
            Record::Telemetry(r) => {
                let key = (r.trial.to_string(), i64::from(r.rank), i64::from(r.slot));
                let window = r
                    .window
                    .as_ref()
                    .map(|window| text("telemetry", window))
                    .transpose()?;
                self.telemetry.insert(key, window);
            }
        }
        Ok(())
    }

    /// Writes the rows and the next numbers `after` in `txn`.
    pub(super) fn write(
        &self,
        txn: &mut Transaction<'_>,
        after: Sequences,
    ) -> Result<(), RegistryError> {
        for (table, key, rows) in [
            ("experiments", "id", &self.experiments),
            ("trials", "id", &self.trials),
            ("nodes", "id", &self.nodes),
            ("users", "name", &self.users),
            ("policy", "name", &self.policy),
        ] {
            upsert(txn, table, key, "text", rows)?;
        }
        for (table, key, rows) in [
            ("events", "seq", &self.events),
            ("audit", "seq", &self.audit),
            ("pipelines", "id", &self.pipelines),
            ("alerts", "id", &self.alerts),
        ] {
            upsert(txn, table, key, "bigint", rows)?;
        }
        self.write_metrics(txn)?;
        self.write_telemetry(txn)?;
        let (metric, audit) = (
            number("metric", after.metric)?,
            number("audit", after.audit)?,
        );
        txn.execute(
            "INSERT INTO xp_meta (key, value) VALUES ('next_metric_seq', $1), ('next_audit_seq', $2) \
             ON CONFLICT (key) DO UPDATE SET value = EXCLUDED.value",
            &[&metric, &audit],
        )?;
        Ok(())
    }

    fn write_metrics(&self, txn: &mut Transaction<'_>) -> Result<(), RegistryError> {
        if self.metrics.is_empty() {
            return Ok(());
        }
        let trials: Vec<&str> = self.metrics.iter().map(|row| row.0.as_str()).collect();
        let seqs: Vec<i64> = self.metrics.iter().map(|row| row.1).collect();
        let records: Vec<&str> = self.metrics.iter().map(|row| row.2.as_str()).collect();
        txn.execute(
            "INSERT INTO metrics (trial, seq, record) \
             SELECT trial, seq, record::json FROM unnest($1::text[], $2::bigint[], $3::text[]) AS r(trial, seq, record)",
            &[&trials, &seqs, &records],
        )?;
        Ok(())
    }

    fn write_telemetry(&self, txn: &mut Transaction<'_>) -> Result<(), RegistryError> {
        let (mut stored, mut removed) = (Columns::default(), Columns::default());
        for ((trial, rank, slot), window) in &self.telemetry {
            let columns = if window.is_some() {
                &mut stored
            } else {
                &mut removed
            };
            columns.trials.push(trial);
            columns.ranks.push(*rank);
            columns.slots.push(*slot);
            columns.records.extend(window.as_deref());
        }
        if !removed.trials.is_empty() {
            txn.execute(
                "DELETE FROM telemetry WHERE (trial, rank, slot) IN \
                 (SELECT * FROM unnest($1::text[], $2::bigint[], $3::bigint[]))",
                &[&removed.trials, &removed.ranks, &removed.slots],
            )?;
        }
        if !stored.trials.is_empty() {
            txn.execute(
                "INSERT INTO telemetry (trial, rank, slot, record) \
                 SELECT trial, rank, slot, record::json FROM unnest($1::text[], $2::bigint[], $3::bigint[], $4::text[]) AS r(trial, rank, slot, record) \
                 ON CONFLICT (trial, rank, slot) DO UPDATE SET record = EXCLUDED.record",
                &[&stored.trials, &stored.ranks, &stored.slots, &stored.records],
            )?;
        }
        Ok(())
    }
}

/// Telemetry rows as columns.
#[derive(Default)]
struct Columns<'a> {
    trials: Vec<&'a str>,
    ranks: Vec<i64>,
    slots: Vec<i64>,
    records: Vec<&'a str>,
}

/// Inserts or replaces `rows` of `table` by their `key` column of `key_type`.
fn upsert<K: ::postgres::types::ToSql + Sync>(
    txn: &mut Transaction<'_>,
    table: &str,
    key: &str,
    key_type: &str,
    rows: &BTreeMap<K, String>,
) -> Result<(), RegistryError> {
    if rows.is_empty() {
        return Ok(());
    }
    let keys: Vec<&K> = rows.keys().collect();
    let records: Vec<&str> = rows.values().map(String::as_str).collect();
    // A replaced row takes the new change number its insert drew, so
    // standbys see it change (`follow::FOLLOWED`).
    let renumber = if super::follow::FOLLOWED.contains(&table) {
        ", change = EXCLUDED.change"
    } else {
        ""
    };
    // Table and column names are this file's constants, never input.
    let statement = format!(
        "INSERT INTO {table} ({key}, record) \
         SELECT k, r::json FROM unnest($1::{key_type}[], $2::text[]) AS rows(k, r) \
         ON CONFLICT ({key}) DO UPDATE SET record = EXCLUDED.record{renumber}"
    );
    txn.execute(statement.as_str(), &[&keys, &records])?;
    Ok(())
}

/// The record in column `column` of `row`, or `None` (logged) when it cannot
/// be read.
pub(super) fn decode_one<T: DeserializeOwned>(row: &Row, column: usize, kind: &str) -> Option<T> {
    serde_json::from_str(row.get::<_, &str>(column))
        .map_err(|error| unreadable(kind, &error))
        .ok()
}

/// The records in the first column of `rows`, skipping (and logging) those
/// that cannot be read.
pub(super) fn decode<T: DeserializeOwned>(rows: &[Row], kind: &str) -> Vec<T> {
    rows.iter()
        .filter_map(|row| decode_one(row, 0, kind))
        .collect()
}

/// Every record of `table`, in the order of `order`, each decoded as it
/// arrives (a million trials' rows are gigabytes of text).
fn read_table<T: DeserializeOwned>(
    client: &mut impl GenericClient,
    table: &str,
    order: &str,
    kind: &str,
) -> Result<Vec<T>, RegistryError> {
    let statement = format!("SELECT record::text FROM {table} ORDER BY {order}");
    let no_parameters: [&(dyn ToSql + Sync); 0] = [];
    let mut rows = client.query_raw(statement.as_str(), no_parameters)?;
    let mut records = Vec::new();
    while let Some(row) = rows.next()? {
        records.extend(decode_one(&row, 0, kind));
    }
    Ok(records)
}

/// Every experiment, trial, node, pipeline and alert, the policy and the newest
/// event's number, in one read-only transaction (one snapshot), in the order
/// redb keeps them.
pub(super) fn read_all(client: &mut Client) -> Result<LoadedState, RegistryError> {
    let mut txn = client
        .build_transaction()
        .read_only(true)
        .isolation_level(::postgres::IsolationLevel::RepeatableRead)
        .start()?;
    // Decoding a million trials takes longer than the session's idle limit
    // (set against a paused head holding the lead row, which this read-only
    // snapshot does not touch), so the limit is lifted for this transaction.
    txn.batch_execute("SET LOCAL idle_in_transaction_session_timeout = 0")?;
    let mut loaded = LoadedState::default();
    let by_id = "id";
    loaded.experiments = read_table(&mut txn, "experiments", by_id, "experiment")?;
    loaded.trials = read_table(&mut txn, "trials", by_id, "trial")?;
    loaded.nodes = read_table(&mut txn, "nodes", by_id, "node")?;
    let last_event: Option<i64> = txn.query_one("SELECT max(seq) FROM events", &[])?.get(0);
    loaded.last_event_seq = last_event.map_or(0, |seq| u64::try_from(seq).unwrap_or(0));
    loaded.pipelines = read_table(&mut txn, "pipelines", "id", "pipeline")?;
    loaded.alerts = read_table(&mut txn, "alerts", "id", "alert")?;
    loaded.policy = read_table(&mut txn, "policy", "name", "policy")?.pop();
    // From the keys, not the decoded records: an unreadable record's id stays taken.
    let last: Option<i64> = txn.query_one("SELECT max(id) FROM pipelines", &[])?.get(0);
    loaded.next_pipeline_id = last.map_or(1, |id| (id as u64).saturating_add(1));
    txn.commit()?;
    Ok(loaded)
}

/// One page of a trial's metric reports: see `HistoryReads::metrics_page`.
pub(super) fn metrics_page(
    client: &mut Client,
    trial: &str,
    after: Option<u64>,
    limit: usize,
    max_bytes: usize,
) -> Result<MetricsPage, RegistryError> {
    let mut page = MetricsPage::default();
    let total: i64 = client
        .query_one("SELECT count(*) FROM metrics WHERE trial = $1", &[&trial])?
        .get(0);
    page.total = u64::try_from(total).unwrap_or(0);
    let start = match after {
        Some(seq) => seq.checked_add(1),
        None => Some(0),
    };
    // Stored numbers fit an i64; a start past them finds nothing.
    let Some(start) = start.and_then(|start| i64::try_from(start).ok()) else {
        return Ok(page);
    };
    // One more than the page holds, to know whether more follow.
    let fetch = i64::try_from(limit.saturating_add(1)).unwrap_or(i64::MAX);
    let rows = client.query(
        "SELECT seq, record::text FROM metrics WHERE trial = $1 AND seq >= $2 ORDER BY seq LIMIT $3",
        &[&trial, &start, &fetch],
    )?;
    let mut bytes = 0;
    for row in &rows {
        if page.records.len() >= limit || (!page.records.is_empty() && bytes >= max_bytes) {
            page.more = true;
            break;
        }
        let text: &str = row.get(1);
        match serde_json::from_str(text) {
            Ok(record) => {
                bytes += text.len();
                page.records.push((row.get::<_, i64>(0) as u64, record));
            }
            Err(error) => unreadable("metric", &error),
        }
    }
    Ok(page)
}

impl Rows {
    /// Rows of `table` copied from another store, as they are stored there.
    pub(super) fn from_raw(table: Table, raw: &[RawRow]) -> Result<Self, RegistryError> {
        let mut rows = Self::default();
        for row in raw {
            let record =
                String::from_utf8(row.record.clone()).map_err(|_| RegistryError::CopyRow {
                    table: table.name(),
                    reason: format!("the record of {:?} is not UTF-8", row.key),
                })?;
            let number = |value: u64| number(table.name(), value);
            match (&row.key, table) {
                (RawKey::Text(key), Table::Experiments) => {
                    rows.experiments.insert(key.clone(), record)
                }
                (RawKey::Text(key), Table::Trials) => rows.trials.insert(key.clone(), record),
                (RawKey::Text(key), Table::Nodes) => rows.nodes.insert(key.clone(), record),
                (RawKey::Text(key), Table::Users) => rows.users.insert(key.clone(), record),
                (RawKey::Text(key), Table::Policy) => rows.policy.insert(key.clone(), record),
                (RawKey::Number(key), Table::Events) => rows.events.insert(number(*key)?, record),
                (RawKey::Number(key), Table::Audit) => rows.audit.insert(number(*key)?, record),
                (RawKey::Number(key), Table::Pipelines) => {
                    rows.pipelines.insert(number(*key)?, record)
                }
                (RawKey::Number(key), Table::Alerts) => rows.alerts.insert(number(*key)?, record),
                (RawKey::Metric(trial, seq), Table::Metrics) => {
                    rows.metrics.push((trial.clone(), number(*seq)?, record));
                    None
                }
                (RawKey::Telemetry(trial, rank, slot), Table::Telemetry) => rows
                    .telemetry
                    .insert(
                        (trial.clone(), i64::from(*rank), i64::from(*slot)),
                        Some(record),
                    )
                    .flatten(),
                _ => {
                    return Err(RegistryError::CopyRow {
                        table: table.name(),
                        reason: "a key of another kind".to_owned(),
                    });
                }
            };
        }
        Ok(rows)
    }
}
