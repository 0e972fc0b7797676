//! Placement searches that found no room, remembered from one pass to the
//! next while the pool gains none.
//!
//! A pass remembers the gangs that did not fit (`Pass`), since room only
//! shrinks during it. Between passes room shrinks too, unless resources were
//! released, a node came, went or changed, or a placed trial grew (stopping it
//! would then free more than before): [`PolicyCore`](super::PolicyCore) counts
//! each of those in its room epoch, and this memory forgets everything when
//! the epoch moves. So the passes that arrivals and checkpoints trigger on a
//! full cluster (most of its passes) do not search again for gangs that found
//! no room in the pass before, nor for preemptors whose candidate victims,
//! all gone, made none. An answer from here is the one the search would give:
//! the decisions are those of searching every time.

use std::collections::VecDeque;

use xp_runtime::ids::TrialId;

use super::resource_vec::{covers, resource_vec};
use crate::GangShape;

/// The most failures of each kind remembered; the oldest go first.
const MAX_REMEMBERED: usize = 64;

/// Failed placement searches of the current room epoch.
#[derive(Debug, Default)]
pub(super) struct NoRoom {
    /// The room epoch the failures below were found in.
    epoch: u64,
    /// Gangs that found no room.
    shapes: VecDeque<GangShape>,
    /// Gangs that found no room with the listed trials (sorted) gone.
    with_freed: VecDeque<(GangShape, Vec<TrialId>)>,
}

impl NoRoom {
    /// Whether a gang no larger than `gang`, under the same constraints,
    /// found no room in room epoch `epoch`.
    pub(super) fn shape_failed(&mut self, epoch: u64, gang: &GangShape) -> bool {
        self.enter(epoch);
        self.shapes
            .iter()
            .any(|failed| at_least_as_hard(gang, failed))
    }

    /// Remembers that `gang` found no room in room epoch `epoch`.
    pub(super) fn record_shape(&mut self, epoch: u64, gang: &GangShape) {
        self.enter(epoch);
        remember(&mut self.shapes, gang.clone());
    }

    /// Whether a gang no larger than `gang` found no room in room epoch
    /// `epoch` with a superset of `freed` (sorted) gone.
    pub(super) fn failed_with_freed(
        &mut self,
        epoch: u64,
        gang: &GangShape,
        freed: &[TrialId],
    ) -> bool {
        self.enter(epoch);
        self.with_freed
            .iter()
            .any(|(failed, among)| at_least_as_hard(gang, failed) && is_sorted_subset(freed, among))
    }

    /// Remembers that `gang` found no room in room epoch `epoch` with `freed`
    /// (sorted) gone.
    pub(super) fn record_with_freed(&mut self, epoch: u64, gang: &GangShape, freed: Vec<TrialId>) {
        self.enter(epoch);
        remember(&mut self.with_freed, (gang.clone(), freed));
    }

    /// Forgets the failures of an earlier epoch.
    fn enter(&mut self, epoch: u64) {
        if self.epoch != epoch {
            self.epoch = epoch;
            self.shapes.clear();
            self.with_freed.clear();
        }
    }
}

/// Adds `failure`, dropping the oldest when the memory is full.
fn remember<T>(failures: &mut VecDeque<T>, failure: T) {
    if failures.len() >= MAX_REMEMBERED {
        failures.pop_front();
    }
    failures.push_back(failure);
}

/// Whether `gang` asks at least what `failed` asked, under the same
/// constraints: where `failed` found no room, neither does `gang`.
pub(super) fn at_least_as_hard(gang: &GangShape, failed: &GangShape) -> bool {
    failed.spread == gang.spread
        && failed.gpu_models == gang.gpu_models
        && failed.node_labels == gang.node_labels
        && gang.workers >= failed.workers
        && covers(
            resource_vec(&gang.per_worker),
            resource_vec(&failed.per_worker),
        )
}

/// Whether every id of sorted `part` is in sorted `whole`.
pub(super) fn is_sorted_subset(part: &[TrialId], whole: &[TrialId]) -> bool {
    let mut rest = whole.iter();
    part.iter().all(|id| rest.any(|other| other == id))
}

#[cfg(test)]
mod tests {
    use super::*;
    use xp_runtime::ids::ExperimentId;

    fn ids(indexes: &[u32]) -> Vec<TrialId> {
        indexes
            .iter()
            .map(|&index| TrialId {
                experiment: ExperimentId { digest: 1, run: 0 },
                index,
            })
            .collect()
    }

    #[test]
    fn sorted_subsets() {
        assert!(is_sorted_subset(&ids(&[]), &ids(&[])));
        assert!(is_sorted_subset(&ids(&[2, 5]), &ids(&[1, 2, 3, 5])));
        assert!(is_sorted_subset(&ids(&[1, 2, 3, 5]), &ids(&[1, 2, 3, 5])));
        assert!(!is_sorted_subset(&ids(&[2, 4]), &ids(&[1, 2, 3, 5])));
        assert!(!is_sorted_subset(&ids(&[6]), &ids(&[1, 2, 3, 5])));
        assert!(!is_sorted_subset(&ids(&[1]), &ids(&[])));
    }
}
