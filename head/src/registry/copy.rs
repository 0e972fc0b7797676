//! `xp-head store copy`: every row of one store copied, as stored, into another
//! that holds nothing yet (redb to PostgreSQL or back), then both read again
//! and compared table by table: how many rows, and a digest of their keys and
//! bytes in key order.

use super::{Registry, RegistryError, StoreSpec};

/// How many rows one read and one write transaction of a copy hold.
const PAGE_ROWS: usize = 10_000;

/// A table of the registry, the same in every store.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Table {
    Experiments,
    Trials,
    Nodes,
    Users,
    Policy,
    Events,
    Audit,
    Pipelines,
    Alerts,
    Metrics,
    Telemetry,
}

impl Table {
    /// Every table, in the order a copy goes.
    pub(crate) const ALL: [Self; 11] = [
        Self::Experiments,
        Self::Trials,
        Self::Nodes,
        Self::Users,
        Self::Policy,
        Self::Events,
        Self::Audit,
        Self::Pipelines,
        Self::Alerts,
        Self::Metrics,
        Self::Telemetry,
    ];

    /// Its name, in both stores.
    pub(crate) fn name(self) -> &'static str {
        match self {
            Self::Experiments => "experiments",
            Self::Trials => "trials",
            Self::Nodes => "nodes",
            Self::Users => "users",
            Self::Policy => "policy",
            Self::Events => "events",
            Self::Audit => "audit",
            Self::Pipelines => "pipelines",
            Self::Alerts => "alerts",
            Self::Metrics => "metrics",
            Self::Telemetry => "telemetry",
        }
    }
}

/// A row's key as stored.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum RawKey {
    /// An id or a name.
    Text(String),
    /// A sequence number or an id.
    Number(u64),
    /// A metric report: its trial and number.
    Metric(String, u64),
    /// A telemetry window: its trial, rank and slot.
    Telemetry(String, u32, u32),
}

impl RawKey {
    /// The key's bytes for a digest, unambiguous across kinds and lengths.
    fn digest_into(&self, hasher: &mut blake3::Hasher) {
        let text = |hasher: &mut blake3::Hasher, text: &str| {
            hasher.update(&(text.len() as u64).to_le_bytes());
            hasher.update(text.as_bytes());
        };
        match self {
            Self::Text(key) => text(hasher.update(&[0]), key),
            Self::Number(key) => {
                hasher.update(&[1]).update(&key.to_le_bytes());
            }
            Self::Metric(trial, seq) => {
                text(hasher.update(&[2]), trial);
                hasher.update(&seq.to_le_bytes());
            }
            Self::Telemetry(trial, rank, slot) => {
                text(hasher.update(&[3]), trial);
                hasher
                    .update(&rank.to_le_bytes())
                    .update(&slot.to_le_bytes());
            }
        }
    }
}

/// A row as stored: its key and its record's JSON.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct RawRow {
    pub(crate) key: RawKey,
    pub(crate) record: Vec<u8>,
}

/// One table of a store: how many rows, and a digest of them in key order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TableDigest {
    /// The table's name.
    pub table: &'static str,
    /// How many rows it holds.
    pub rows: u64,
    /// blake3 over every row's key and bytes, in key order, in hex.
    pub digest: String,
}

/// Why a copy failed.
#[derive(Debug, thiserror::Error)]
pub enum CopyError {
    /// A store could not be read or written.
    #[error("{store}: {source}")]
    Store {
        /// Which store, as given.
        store: String,
        /// The cause.
        #[source]
        source: RegistryError,
    },
    /// The source names a database file that does not exist.
    #[error("{store} does not exist: name a head's data directory or its head.redb")]
    NoSource {
        /// The source, as given.
        store: String,
    },
    /// The target already holds records.
    #[error(
        "{store} already holds records (its {table} table): a copy goes into an empty store only"
    )]
    NotEmpty {
        /// The target, as given.
        store: String,
        /// The first table found holding rows.
        table: &'static str,
    },
    /// The target does not read back what the source holds.
    #[error(
        "the copy differs from its source in table {table}: {source_rows} rows ({source_digest}) copied as {target_rows} ({target_digest})"
    )]
    Differs {
        /// The table.
        table: &'static str,
        /// Rows in the source.
        source_rows: u64,
        /// The source's digest.
        source_digest: String,
        /// Rows in the target.
        target_rows: u64,
        /// The target's digest.
        target_digest: String,
    },
}

/// Copies every row of `from` into `to`, which must hold nothing, with the
/// next metric and audit numbers; then reads both again and compares them
/// table by table. The tables' digests, as both hold them.
pub fn copy_store(from: &StoreSpec, to: &StoreSpec) -> Result<Vec<TableDigest>, CopyError> {
    let error = |spec: &StoreSpec| {
        let store = spec.to_string();
        move |source| CopyError::Store { store, source }
    };
    // Opening a redb file creates it: a mistyped source would copy nothing.
    if let StoreSpec::Redb(path) = from
        && !path.is_file()
    {
        return Err(CopyError::NoSource {
            store: from.to_string(),
        });
    }
    let source = Registry::open_store(from).map_err(error(from))?;
    let mut target = Registry::open_store(to).map_err(error(to))?;
    for table in Table::ALL {
        if !target
            .store
            .export(table, None, 1)
            .map_err(error(to))?
            .is_empty()
        {
            return Err(CopyError::NotEmpty {
                store: to.to_string(),
                table: table.name(),
            });
        }
    }
    for table in Table::ALL {
        let mut after = None;
        loop {
            let rows = source
                .store
                .export(table, after.as_ref(), PAGE_ROWS)
                .map_err(error(from))?;
            let Some(last) = rows.last() else { break };
            after = Some(last.key.clone());
            target
                .store
                .import(table, &rows, source.next)
                .map_err(error(to))?;
        }
    }
    let copied = digests(&source).map_err(error(from))?;
    let read_back = digests(&target).map_err(error(to))?;
    for (source, target) in copied.iter().zip(&read_back) {
        if source != target {
            return Err(CopyError::Differs {
                table: source.table,
                source_rows: source.rows,
                source_digest: source.digest.clone(),
                target_rows: target.rows,
                target_digest: target.digest.clone(),
            });
        }
    }
    Ok(copied)
}

/// Every table's rows and digest, read page by page.
fn digests(registry: &Registry) -> Result<Vec<TableDigest>, RegistryError> {
    Table::ALL
        .iter()
        .map(|&table| {
            let mut hasher = blake3::Hasher::new();
            let mut rows = 0_u64;
            let mut after = None;
            loop {
                let page = registry.store.export(table, after.as_ref(), PAGE_ROWS)?;
                let Some(last) = page.last() else { break };
                after = Some(last.key.clone());
                for row in &page {
                    row.key.digest_into(&mut hasher);
                    hasher.update(&(row.record.len() as u64).to_le_bytes());
                    hasher.update(&row.record);
                    rows += 1;
                }
            }
            Ok(TableDigest {
                table: table.name(),
                rows,
                digest: hasher.finalize().to_hex().to_string(),
            })
        })
        .collect()
}
