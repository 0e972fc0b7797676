//! The telemetry table's reads: a trial's series per rank (for the HTTP API and
//! `Request::Telemetry`) and one worker's (for the actor to hand the core a
//! series it does not hold). Written by `Registry::commit` like every record.

use redb::ReadableDatabase;
use tracing::warn;
use xp_runtime::ids::TrialId;
use xp_runtime::protocol::{TelemetryWindow, WorkerTelemetry};

use super::{Registry, RegistryError, TELEMETRY, db_error};

impl Registry {
    /// One trial's telemetry, per rank, each series oldest window first.
    pub(crate) fn telemetry_of(
        &self,
        trial: TrialId,
    ) -> Result<Vec<WorkerTelemetry>, RegistryError> {
        let txn = self.database()?.begin_read().map_err(db_error)?;
        let table = txn.open_table(TELEMETRY).map_err(db_error)?;
        let trial = trial.to_string();
        let range = (trial.as_str(), 0, 0)..=(trial.as_str(), u32::MAX, u32::MAX);
        let mut workers: Vec<WorkerTelemetry> = Vec::new();
        for entry in table.range(range).map_err(db_error)? {
            let (key, value) = entry.map_err(db_error)?;
            let (_, rank, _) = key.value();
            let window = match serde_json::from_slice::<TelemetryWindow>(value.value()) {
                Ok(window) => window,
                Err(error) => {
                    warn!(%error, "unreadable telemetry window skipped");
                    continue;
                }
            };
            match workers.last_mut() {
                Some(worker) if worker.rank == rank => worker.windows.push(window),
                _ => workers.push(WorkerTelemetry {
                    rank,
                    windows: vec![window],
                }),
            }
        }
        Ok(workers)
    }

    /// One worker's telemetry series, oldest window first (empty when none is stored).
    pub(crate) fn telemetry_series(
        &self,
        trial: TrialId,
        rank: u32,
    ) -> Result<Vec<TelemetryWindow>, RegistryError> {
        let txn = self.database()?.begin_read().map_err(db_error)?;
        let table = txn.open_table(TELEMETRY).map_err(db_error)?;
        let trial = trial.to_string();
        let range = (trial.as_str(), rank, 0)..=(trial.as_str(), rank, u32::MAX);
        let mut windows = Vec::new();
        for entry in table.range(range).map_err(db_error)? {
            let (_, value) = entry.map_err(db_error)?;
            match serde_json::from_slice::<TelemetryWindow>(value.value()) {
                Ok(window) => windows.push(window),
                Err(error) => warn!(%error, "unreadable telemetry window skipped"),
            }
        }
        Ok(windows)
    }
}
