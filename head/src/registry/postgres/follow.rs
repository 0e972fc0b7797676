//! What changed in the store since a standby last read it: every row of the
//! tables a head loads carries the number of the change that wrote it last
//! (`migrations/V4__change_numbers.sql`), so a standby keeps its copy current
//! by reading the rows numbered after the last one it saw.

use ::postgres::Client;
use serde::de::DeserializeOwned;

use xp_head_core::Record;

use super::super::{Changes, RegistryError};
use super::rows::decode_one;

/// The tables whose rows carry change numbers, in the order of their kinds in
/// [`STATEMENT`].
pub(super) const FOLLOWED: [&str; 7] = [
    "experiments",
    "trials",
    "nodes",
    "events",
    "policy",
    "pipelines",
    "alerts",
];

/// Every row changed after `$1`, tagged with its table's place in
/// [`FOLLOWED`], and the highest pipeline id (kind 7): one statement, so one
/// snapshot of the store.
const STATEMENT: &str = "\
    SELECT 0, change, record::text FROM experiments WHERE change > $1 \
    UNION ALL SELECT 1, change, record::text FROM trials WHERE change > $1 \
    UNION ALL SELECT 2, change, record::text FROM nodes WHERE change > $1 \
    UNION ALL SELECT 3, change, record::text FROM events WHERE change > $1 \
    UNION ALL SELECT 4, change, record::text FROM policy WHERE change > $1 \
    UNION ALL SELECT 5, change, record::text FROM pipelines WHERE change > $1 \
    UNION ALL SELECT 6, change, record::text FROM alerts WHERE change > $1 \
    UNION ALL SELECT 7, max(id), NULL FROM pipelines";

/// Every record changed after change `after`, and the last change read.
pub(super) fn changes(client: &mut Client, after: i64) -> Result<Changes, RegistryError> {
    let rows = client.query(STATEMENT, &[&after])?;
    let mut changes = Changes {
        records: Vec::with_capacity(rows.len()),
        through: after,
        next_pipeline_id: 1,
    };
    for row in &rows {
        let kind: i32 = row.get(0);
        let Some(change) = row.get::<_, Option<i64>>(1) else {
            continue;
        };
        if kind == 7 {
            // From the keys, not the records: an unreadable record's id stays taken.
            changes.next_pipeline_id = u64::try_from(change).map_or(1, |id| id.saturating_add(1));
            continue;
        }
        changes.through = changes.through.max(change);
        if let Some(record) = decode(row, kind) {
            changes.records.push(record);
        }
    }
    Ok(changes)
}

/// The record of a row of kind `kind`, or `None` (logged) when unreadable.
fn decode(row: &::postgres::Row, kind: i32) -> Option<Record> {
    fn read<T: DeserializeOwned>(row: &::postgres::Row, kind: &str) -> Option<T> {
        decode_one(row, 2, kind)
    }
    Some(match kind {
        0 => Record::Experiment(read(row, "experiment")?),
        1 => Record::Trial(read(row, "trial")?),
        2 => Record::Node(read(row, "node")?),
        3 => Record::Event(read(row, "event")?),
        4 => Record::Policy(read(row, "policy")?),
        5 => Record::Pipeline(read(row, "pipeline")?),
        _ => Record::Alert(read(row, "alert")?),
    })
}
