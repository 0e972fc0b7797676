//! Reports waiting for the head's acknowledgement.
//!
//! Sans-io. Every worker report gets a sequence number and stays here until the
//! head acknowledges it as persisted; after a reconnect (or a head restart) all of
//! them are sent again, in order. The head handles duplicates idempotently.
//!
//! Invariant: start and exit reports are never dropped; when the head is away for
//! long, the oldest metric reports are dropped beyond [`MAX_UNACKED`].

use std::collections::{BTreeMap, BTreeSet};

use xp_runtime::clock::UnixMillis;
use xp_runtime::ids::WorkerKey;
use xp_runtime::protocol::WorkerReport;

/// The most unacknowledged reports kept.
pub(crate) const MAX_UNACKED: usize = 100_000;

/// Whether `report` is a worker's last: the worker is gone once it is made.
pub(crate) fn is_final(report: &WorkerReport) -> bool {
    matches!(
        report,
        WorkerReport::Exited { .. }
            | WorkerReport::ExitedWithStderr { .. }
            | WorkerReport::LaunchFailed { .. }
            | WorkerReport::Stopped { .. }
            | WorkerReport::Refused { .. }
            | WorkerReport::OomKilled { .. }
            | WorkerReport::Evicted { .. }
    )
}

/// Numbered reports not yet acknowledged.
#[derive(Debug)]
pub(crate) struct Outbox {
    next_seq: u64,
    /// Each with when it was made.
    unacked: BTreeMap<u64, (UnixMillis, WorkerReport)>,
    dropped_metrics: u64,
}

impl Default for Outbox {
    fn default() -> Self {
        Self {
            next_seq: 1,
            unacked: BTreeMap::new(),
            dropped_metrics: 0,
        }
    }
}

impl Outbox {
    /// Numbers `report`, made at `at`, and keeps it until acknowledged.
    pub(crate) fn push(&mut self, at: UnixMillis, report: WorkerReport) -> u64 {
        let seq = self.next_seq;
        self.next_seq += 1;
        self.unacked.insert(seq, (at, report));
        if self.unacked.len() > MAX_UNACKED {
            let oldest_metric = self
                .unacked
                .iter()
                .find(|(_, (_, report))| matches!(report, WorkerReport::Metric { .. }))
                .map(|(seq, _)| *seq);
            if let Some(oldest) = oldest_metric {
                self.unacked.remove(&oldest);
                self.dropped_metrics += 1;
            }
        }
        seq
    }

    /// The head persisted everything up to and including `upto`.
    pub(crate) fn ack(&mut self, upto: u64) {
        self.unacked = self.unacked.split_off(&(upto + 1));
    }

    /// Everything unacknowledged, oldest first, with when it was made.
    pub(crate) fn unacked(&self) -> impl Iterator<Item = (u64, UnixMillis, &WorkerReport)> {
        self.unacked
            .iter()
            .map(|(seq, (at, report))| (*seq, *at, report))
    }

    /// Workers whose final report the head has not acknowledged yet.
    pub(crate) fn unacked_final(&self) -> BTreeSet<WorkerKey> {
        self.unacked
            .values()
            .map(|(_, report)| report)
            .filter(|report| is_final(report))
            .map(WorkerReport::key)
            .collect()
    }

    #[cfg(test)]
    /// Metric reports dropped for lack of room.
    pub(crate) fn dropped_metrics(&self) -> u64 {
        self.dropped_metrics
    }
}

#[cfg(test)]
mod tests {
    use xp_runtime::ids::{ExperimentId, TrialId};

    use super::*;

    fn key() -> WorkerKey {
        WorkerKey {
            trial: TrialId {
                experiment: ExperimentId { digest: 9, run: 1 },
                index: 0,
            },
            attempt: 1,
            rank: 0,
        }
    }

    #[test]
    fn acknowledged_reports_leave_and_the_rest_stay_in_order() {
        let mut outbox = Outbox::default();
        let first = outbox.push(0, WorkerReport::Started { key: key(), pid: 1 });
        let second = outbox.push(
            0,
            WorkerReport::Exited {
                key: key(),
                code: Some(0),
                signal: None,
            },
        );
        assert_eq!((first, second), (1, 2));
        assert_eq!(outbox.unacked_final(), BTreeSet::from([key()]));
        outbox.ack(1);
        assert_eq!(
            outbox.unacked().map(|(seq, _, _)| seq).collect::<Vec<_>>(),
            vec![2]
        );
        outbox.ack(2);
        assert!(outbox.unacked_final().is_empty());
    }

    #[test]
    fn only_metrics_are_dropped_when_full() {
        let mut outbox = Outbox::default();
        outbox.push(0, WorkerReport::Started { key: key(), pid: 1 });
        for index in 0..(MAX_UNACKED as u64 + 5) {
            outbox.push(
                0,
                WorkerReport::Metric {
                    key: key(),
                    index,
                    step: None,
                    values: Vec::new(),
                },
            );
        }
        assert_eq!(outbox.unacked().count(), MAX_UNACKED);
        assert!(matches!(
            outbox.unacked().next(),
            Some((1, _, WorkerReport::Started { .. }))
        ));
        assert_eq!(outbox.dropped_metrics(), 6);
    }
}
