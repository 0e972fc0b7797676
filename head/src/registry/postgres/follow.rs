//! What changed in the store since a standby last read it: every row of the
//! tables a head loads carries the number of the change that wrote it last
//! (`migrations/V4__change_numbers.sql`), so a standby keeps its copy current
//! by reading the rows numbered after the last one it saw. Of events it reads
//! only the newest number: the head reads events from the store on demand.

use ::postgres::Client;
use serde::de::DeserializeOwned;

use xp_head_core::Record;

use super::super::{Changes, RegistryError};
use super::rows::decode_one;

/// The tables whose rows carry change numbers; a row's kind in [`statement`]
/// is its table's place here.
pub(super) const FOLLOWED: [&str; 7] = [
    "experiments",
    "trials",
    "nodes",
    "events",
    "policy",
    "pipelines",
    "alerts",
];

/// The kind of the one row that carries the highest pipeline id.
const PIPELINE_IDS: usize = FOLLOWED.len();
/// The kind of the events' rows: one, with the newest number among them.
const EVENTS: usize = 3;
const _: () = assert!(matches!(FOLLOWED[EVENTS].as_bytes(), b"events"));

/// Every row changed after `$1`, tagged with its kind, and the highest
/// pipeline id: one statement, so one snapshot of the store.
fn statement() -> String {
    FOLLOWED
        .iter()
        .enumerate()
        .map(|(kind, table)| match kind {
            EVENTS => {
                format!("SELECT {kind}, max(change), max(seq)::text FROM {table} WHERE change > $1")
            }
            _ => format!("SELECT {kind}, change, record::text FROM {table} WHERE change > $1"),
        })
        .chain([format!(
            "SELECT {PIPELINE_IDS}, max(id), NULL FROM pipelines"
        )])
        .collect::<Vec<_>>()
        .join(" UNION ALL ")
}

/// Every record changed after change `after`, and the last change read.
pub(super) fn changes(client: &mut Client, after: i64) -> Result<Changes, RegistryError> {
    let rows = client.query(statement().as_str(), &[&after])?;
    let mut changes = Changes {
        records: Vec::with_capacity(rows.len()),
        last_event_seq: None,
        through: after,
        next_pipeline_id: 1,
    };
    for row in &rows {
        let kind = usize::try_from(row.get::<_, i32>(0)).unwrap_or(usize::MAX);
        let Some(change) = row.get::<_, Option<i64>>(1) else {
            continue;
        };
        if kind == PIPELINE_IDS {
            // From the keys, not the records: an unreadable record's id stays taken.
            changes.next_pipeline_id = u64::try_from(change).map_or(1, |id| id.saturating_add(1));
            continue;
        }
        changes.through = changes.through.max(change);
        if kind == EVENTS {
            changes.last_event_seq = row
                .get::<_, Option<&str>>(2)
                .and_then(|seq| seq.parse().ok());
            continue;
        }
        if let Some(record) = decode(row, kind) {
            changes.records.push(record);
        }
    }
    Ok(changes)
}

/// The record of a row of kind `kind` (its table's place in [`FOLLOWED`]), or
/// `None` (logged) when unreadable.
fn decode(row: &::postgres::Row, kind: usize) -> Option<Record> {
    fn read<T: DeserializeOwned>(row: &::postgres::Row, kind: &str) -> Option<T> {
        decode_one(row, 2, kind)
    }
    Some(match kind {
        0 => Record::Experiment(read(row, "experiment")?),
        1 => Record::Trial(read(row, "trial")?),
        2 => Record::Node(read(row, "node")?),
        4 => Record::Policy(read(row, "policy")?),
        5 => Record::Pipeline(read(row, "pipeline")?),
        6 => Record::Alert(read(row, "alert")?),
        _ => return None,
    })
}
