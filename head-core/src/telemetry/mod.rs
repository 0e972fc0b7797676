//! Telemetry in the core: each node's latest GPU and object-store figures (soft
//! state, for `xp nodes` and `/metrics`), and each worker's downsampled series
//! ([`series::Series`]), persisted one window per record
//! ([`TelemetryRecord`]) so that many nodes reporting every few seconds cost
//! one small write per worker, committed together with everything else the
//! actor's group commit holds.
//!
//! A message is checked before anything is kept: only live workers the node
//! hosts, at most [`MAX_TELEMETRY_WORKERS`] and [`MAX_TELEMETRY_GPUS`], and
//! only finite values in range (others are dropped field by field).
//!
//! The core holds the series of workers that reported since it started (up to
//! [`MAX_CACHED_SERIES`]); a series it does not hold is read back from the
//! registry by the actor first ([`HeadCore::telemetry_series_needed`],
//! [`HeadCore::restore_telemetry_series`]), since the core does no I/O.

pub(crate) mod series;

use std::collections::{BTreeMap, HashMap};

use tracing::debug;
use xp_runtime::clock::UnixMillis;
use xp_runtime::ids::{NodeId, TrialId};
use xp_runtime::protocol::{
    GpuSample, MAX_TELEMETRY_GPUS, MAX_TELEMETRY_WORKERS, NodeTelemetry, StoreUsage,
    TelemetryWindow, WorkerSample,
};

use self::series::{Change, Series, Values};
use super::{HeadCore, Record, TelemetryRecord};

/// The most series the core holds at once; beyond it, those of trials with no
/// live attempt go (they are read back from the registry if they report again).
pub(crate) const MAX_CACHED_SERIES: usize = 20_000;

/// GPU utilisation (percent) above which a GPU counts as in use.
pub(crate) const IN_USE_UTIL: f64 = 5.0;

/// The largest plausible figures; a value past them is dropped as garbage.
const MAX_CORES: f64 = 1e5;
const MAX_BYTES: f64 = 1e16;
const MAX_WATTS: f64 = 1e5;

/// A node's latest figures.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct NodeFigures {
    /// When the head received them.
    pub at: UnixMillis,
    /// Its GPUs, by index.
    pub gpus: Vec<GpuSample>,
    /// Its object store.
    pub store: StoreUsage,
}

/// What the core keeps of telemetry.
#[derive(Debug, Default)]
pub(crate) struct TelemetryState {
    nodes: HashMap<NodeId, NodeFigures>,
    series: HashMap<(TrialId, u32), Series>,
}

impl TelemetryState {
    /// The soft part (node figures) for a rebuilt core; series are read back.
    pub(crate) fn soft_copy(&self) -> Self {
        Self {
            nodes: self.nodes.clone(),
            series: HashMap::new(),
        }
    }

    /// A node's latest figures, if it sent any.
    pub(crate) fn node(&self, node: NodeId) -> Option<&NodeFigures> {
        self.nodes.get(&node)
    }
}

fn in_range(value: Option<f64>, max: f64) -> Option<f64> {
    value.filter(|value| value.is_finite() && (0.0..=max).contains(value))
}

/// A worker sample's values, each dropped when it is not finite or out of range.
fn checked_values(sample: &WorkerSample) -> Values {
    Values {
        cpu_cores: in_range(sample.cpu_cores, MAX_CORES),
        rss_bytes: in_range(sample.rss_bytes.map(|bytes| bytes as f64), MAX_BYTES),
        gpu_util: in_range(sample.gpu_util, 100.0),
        gpu_mem_bytes: in_range(sample.gpu_mem_bytes.map(|bytes| bytes as f64), MAX_BYTES),
        gpu_power_w: in_range(sample.gpu_power_w, MAX_WATTS),
    }
}

/// The GPU samples worth keeping: in range, one per index, at most [`MAX_TELEMETRY_GPUS`].
fn checked_gpus(gpus: &[GpuSample]) -> Vec<GpuSample> {
    let mut by_index = BTreeMap::new();
    for gpu in gpus.iter().take(MAX_TELEMETRY_GPUS) {
        let Some(util) = in_range(Some(gpu.util), 100.0) else {
            continue;
        };
        by_index.insert(
            gpu.index,
            GpuSample {
                index: gpu.index,
                util,
                memory_used_bytes: gpu.memory_used_bytes,
                power_w: in_range(gpu.power_w, MAX_WATTS),
            },
        );
    }
    by_index.into_values().collect()
}

impl HeadCore {
    /// The live workers of `telemetry` that `node_id` hosts, as (trial, rank).
    fn telemetry_targets<'a>(
        &'a self,
        node_id: NodeId,
        telemetry: &'a NodeTelemetry,
    ) -> impl Iterator<Item = (&'a WorkerSample, (TrialId, u32))> + 'a {
        telemetry
            .workers
            .iter()
            .take(MAX_TELEMETRY_WORKERS)
            .filter(move |sample| {
                self.worker(sample.key).is_some_and(|(attempt, worker)| {
                    attempt.is_live() && worker.node == node_id && worker.state.holds_resources()
                })
            })
            .map(|sample| (sample, (sample.key.trial, sample.key.rank)))
    }

    /// The series `telemetry` from `node_id` would add to that the core does not
    /// hold: the actor reads them from the registry and hands them to
    /// [`Self::restore_telemetry_series`] before the message.
    pub fn telemetry_series_needed(
        &self,
        node_id: NodeId,
        telemetry: &NodeTelemetry,
    ) -> Vec<(TrialId, u32)> {
        let mut needed: Vec<_> = self
            .telemetry_targets(node_id, telemetry)
            .map(|(_, series)| series)
            .filter(|series| !self.telemetry.series.contains_key(series))
            .collect();
        needed.sort_unstable();
        needed.dedup();
        needed
    }

    /// A series as the registry holds it (oldest window first; empty for none).
    pub fn restore_telemetry_series(
        &mut self,
        trial: TrialId,
        rank: u32,
        windows: Vec<TelemetryWindow>,
    ) {
        self.make_room_for_series();
        self.telemetry
            .series
            .insert((trial, rank), Series::from_windows(windows));
    }

    /// Keeps the series cache under [`MAX_CACHED_SERIES`].
    fn make_room_for_series(&mut self) {
        if self.telemetry.series.len() < MAX_CACHED_SERIES {
            return;
        }
        let book = &self.book;
        self.telemetry.series.retain(|(trial, _), _| {
            book.get_trial(*trial)
                .is_some_and(|trial| trial.attempts.iter().any(|attempt| attempt.is_live()))
        });
        if self.telemetry.series.len() >= MAX_CACHED_SERIES {
            self.telemetry.series.clear();
        }
    }

    /// A node's telemetry: its figures replace the last ones, and each live
    /// worker's sample goes into its series (the windows it changed to persist).
    pub(super) fn handle_telemetry(
        &mut self,
        now: UnixMillis,
        node_id: NodeId,
        telemetry: NodeTelemetry,
    ) {
        self.telemetry.nodes.insert(
            node_id,
            NodeFigures {
                at: now,
                gpus: checked_gpus(&telemetry.gpus),
                store: telemetry.store,
            },
        );
        let samples: Vec<(Values, (TrialId, u32))> = self
            .telemetry_targets(node_id, &telemetry)
            .map(|(sample, series)| (checked_values(sample), series))
            .collect();
        let ignored = telemetry.workers.len() - samples.len();
        if ignored > 0 {
            debug!(%node_id, ignored, "telemetry of workers the node does not run (now) ignored");
        }
        for (values, (trial, rank)) in samples {
            if rank == 0
                && let Some(util) = values.gpu_util
            {
                // Rank 0's GPUs stand for the trial's in the `gpu_underused` rule.
                self.alerts.note_gpu_utilisation(now, trial, util / 100.0);
            }
            if !self.telemetry.series.contains_key(&(trial, rank)) {
                // The actor reads stored series back first; none was stored.
                self.make_room_for_series();
            }
            let series = self.telemetry.series.entry((trial, rank)).or_default();
            let record = |slot: usize, window: Option<TelemetryWindow>| {
                Record::Telemetry(TelemetryRecord {
                    trial,
                    rank,
                    slot: u32::try_from(slot).unwrap_or(u32::MAX),
                    window,
                })
            };
            match series.push(now, values) {
                Change::Slot(slot) => {
                    self.outbox
                        .record(record(slot, Some(series.windows()[slot].clone())));
                }
                Change::Rebuilt { len, old_len } => {
                    for (slot, window) in series.windows().iter().enumerate() {
                        self.outbox.record(record(slot, Some(window.clone())));
                    }
                    for slot in len..old_len {
                        self.outbox.record(record(slot, None));
                    }
                }
            }
        }
    }

    /// A node's GPUs as its latest telemetry saw them (empty when it sent none).
    pub fn node_gpu_telemetry(&self, node: NodeId) -> Vec<GpuSample> {
        self.telemetry
            .node(node)
            .map(|figures| figures.gpus.clone())
            .unwrap_or_default()
    }
}
