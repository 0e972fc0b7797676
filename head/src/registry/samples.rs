//! A strided sample of a trial's metric history, for learning curves of
//! histories of any length (the dashboard's `/api/experiments/{id}/curves`).
//! Kept apart from `registry.rs` only for its length.

use redb::ReadableDatabase;
use tracing::warn;
use xp_runtime::ids::TrialId;

use super::{METRICS, Registry, RegistryError, db_error};
use xp_head_core::MetricRecord;

impl Registry {
    /// At most about `max_records` of a trial's metric reports, evenly spaced
    /// over its whole history (every report when it has no more) and always
    /// the newest, oldest first: what a learning curve needs of a history of
    /// any length, for the cost of walking its keys and decoding only those.
    pub(crate) fn metric_samples(
        &self,
        trial: TrialId,
        max_records: usize,
    ) -> Result<Vec<MetricRecord>, RegistryError> {
        let txn = self.database()?.begin_read().map_err(db_error)?;
        let table = txn.open_table(METRICS).map_err(db_error)?;
        let trial = trial.to_string();
        let range = || (trial.as_str(), 0)..=(trial.as_str(), u64::MAX);
        let mut total = 0_usize;
        for entry in table.range(range()).map_err(db_error)? {
            entry.map_err(db_error)?;
            total += 1;
        }
        let stride = total.div_ceil(max_records.max(1)).max(1);
        let mut out = Vec::with_capacity(total.min(max_records + 1));
        for (position, entry) in table.range(range()).map_err(db_error)?.enumerate() {
            if position % stride != 0 && position + 1 != total {
                continue;
            }
            let (_, value) = entry.map_err(db_error)?;
            match serde_json::from_slice::<MetricRecord>(value.value()) {
                Ok(record) => out.push(record),
                Err(error) => warn!(%trial, %error, "unreadable metric record skipped"),
            }
        }
        Ok(out)
    }
}
