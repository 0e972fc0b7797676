//! The PostgreSQL store's rows as stored, for `xp-head store copy`: a page at
//! a time in key order (keys compare byte by byte, as in redb).

use ::postgres::Client;
use ::postgres::types::ToSql;

use super::super::RegistryError;
use super::super::copy::{RawKey, RawRow, Table};

/// The key columns of `table`, in order.
fn key_columns(table: Table) -> &'static str {
    match table {
        Table::Experiments | Table::Trials | Table::Nodes | Table::Pipelines | Table::Alerts => {
            "id"
        }
        Table::Users | Table::Policy => "name",
        Table::Events | Table::Audit => "seq",
        Table::Metrics => "trial, seq",
        Table::Telemetry => "trial, rank, slot",
    }
}

/// A stored number as the unsigned number the head wrote.
fn unsigned(table: Table, value: i64) -> Result<u64, RegistryError> {
    u64::try_from(value).map_err(|_| RegistryError::CopyRow {
        table: table.name(),
        reason: format!("a negative key {value}"),
    })
}

/// Up to `limit` rows of `table` after `after`, in key order.
pub(super) fn export(
    client: &mut Client,
    table: Table,
    after: Option<&RawKey>,
    limit: usize,
) -> Result<Vec<RawRow>, RegistryError> {
    let columns = key_columns(table);
    let limit = i64::try_from(limit).unwrap_or(i64::MAX);
    let (number, rank, slot);
    let mut params: Vec<&(dyn ToSql + Sync)> = Vec::new();
    match after {
        None => {}
        Some(RawKey::Text(key)) => params.push(key),
        Some(RawKey::Number(key)) => {
            number = i64::try_from(*key).unwrap_or(i64::MAX);
            params.push(&number);
        }
        Some(RawKey::Metric(trial, seq)) => {
            number = i64::try_from(*seq).unwrap_or(i64::MAX);
            params.extend([trial as &(dyn ToSql + Sync), &number]);
        }
        Some(RawKey::Telemetry(trial, rank_key, slot_key)) => {
            (rank, slot) = (i64::from(*rank_key), i64::from(*slot_key));
            params.extend([trial as &(dyn ToSql + Sync), &rank, &slot]);
        }
    }
    let placeholders: Vec<String> = (1..=params.len())
        .map(|index| format!("${index}"))
        .collect();
    let filter = if params.is_empty() {
        String::new()
    } else {
        format!("WHERE ({columns}) > ({})", placeholders.join(", "))
    };
    let statement = format!(
        "SELECT {columns}, record::text FROM {} {filter} ORDER BY {columns} LIMIT ${}",
        table.name(),
        params.len() + 1
    );
    params.push(&limit);
    let rows = client.query(statement.as_str(), &params)?;
    rows.iter()
        .map(|row| {
            let key = match table {
                Table::Metrics => RawKey::Metric(row.get(0), unsigned(table, row.get(1))?),
                Table::Telemetry => RawKey::Telemetry(
                    row.get(0),
                    u32::try_from(row.get::<_, i64>(1)).unwrap_or(u32::MAX),
                    u32::try_from(row.get::<_, i64>(2)).unwrap_or(u32::MAX),
                ),
                Table::Events | Table::Audit | Table::Pipelines | Table::Alerts => {
                    RawKey::Number(unsigned(table, row.get(0))?)
                }
                _ => RawKey::Text(row.get(0)),
            };
            let record: String = row.get(row.len() - 1);
            Ok(RawRow {
                key,
                record: record.into_bytes(),
            })
        })
        .collect()
}
