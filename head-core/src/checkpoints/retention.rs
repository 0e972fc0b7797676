//! What the head knows of checkpoints and objects: each trial's checkpoint
//! manifests (persisted with the trial), which node holds which object (soft
//! state, rebuilt from node registrations), and the retention rule.
//!
//! Pure: no I/O, no clock. The core decides with these and turns the answers
//! into node commands.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use serde::{Deserialize, Serialize};
use xp_runtime::clock::UnixMillis;
use xp_runtime::ids::{NodeId, ObjectId};
use xp_runtime::protocol::{CheckpointFile, ObjectEndpoint};
use xp_runtime::spec::{CheckpointRetention, Mode};

/// One checkpoint of a trial, as persisted in its trial record.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CheckpointRecord {
    /// The attempt that wrote it.
    pub attempt: u32,
    /// The step it was taken at.
    pub step: u64,
    /// Its files.
    #[serde(deserialize_with = "crate::records::exact_list")]
    pub files: Vec<CheckpointFile>,
    /// When the head recorded it.
    pub at: UnixMillis,
    /// The experiment's metric at the time, if the trial had reported it.
    pub metric: Option<f64>,
    /// The durable backup directory that also holds its objects.
    #[serde(default)]
    pub backup: Option<String>,
}

impl CheckpointRecord {
    /// Total bytes of its files. Sizes are what a node reported, so the sum
    /// saturates rather than overflow.
    pub fn bytes(&self) -> u64 {
        self.files
            .iter()
            .fold(0u64, |total, file| total.saturating_add(file.size))
    }

    /// Its objects, without duplicates.
    pub fn objects(&self) -> BTreeSet<ObjectId> {
        self.files.iter().map(|file| file.object).collect()
    }
}

/// Splits `checkpoints` (oldest first) into those to keep and those to delete:
/// the newest `keep_last`, plus the best `keep_best` by `metric` under `mode`
/// among those that recorded one (none without a metric). Keeps the input order.
pub(crate) fn retain(
    checkpoints: Vec<CheckpointRecord>,
    retention: CheckpointRetention,
    ranked: Option<Mode>,
) -> (Vec<CheckpointRecord>, Vec<CheckpointRecord>) {
    let count = checkpoints.len();
    let mut keep = vec![false; count];
    for flag in keep
        .iter_mut()
        .skip(count.saturating_sub(retention.keep_last as usize))
    {
        *flag = true;
    }
    if let Some(mode) = ranked {
        let mut scored: Vec<(usize, f64)> = checkpoints
            .iter()
            .enumerate()
            .filter_map(|(index, checkpoint)| checkpoint.metric.map(|metric| (index, metric)))
            .filter(|(_, metric)| metric.is_finite())
            .collect();
        scored.sort_by(|a, b| {
            let order = a.1.total_cmp(&b.1);
            let order = if mode == Mode::Max {
                order.reverse()
            } else {
                order
            };
            // Among equals, the newer one.
            order.then(b.0.cmp(&a.0))
        });
        for (index, _) in scored.into_iter().take(retention.keep_best as usize) {
            keep[index] = true;
        }
    }
    let (kept, dropped): (Vec<_>, Vec<_>) = checkpoints
        .into_iter()
        .zip(keep)
        .partition(|(_, keep)| *keep);
    (
        kept.into_iter().map(|(checkpoint, _)| checkpoint).collect(),
        dropped
            .into_iter()
            .map(|(checkpoint, _)| checkpoint)
            .collect(),
    )
}

/// Which node holds which object, and where each node serves them.
#[derive(Debug, Default)]
pub(crate) struct ObjectDirectory {
    holders: HashMap<ObjectId, BTreeSet<NodeId>>,
    held: BTreeMap<NodeId, BTreeSet<ObjectId>>,
    endpoints: BTreeMap<NodeId, ObjectEndpoint>,
}

impl ObjectDirectory {
    /// A node registered: it serves at `endpoint` and holds exactly `held`.
    pub(crate) fn register(
        &mut self,
        node: NodeId,
        endpoint: Option<ObjectEndpoint>,
        held: impl IntoIterator<Item = ObjectId>,
    ) {
        self.forget_node(node);
        match endpoint {
            Some(endpoint) => {
                self.endpoints.insert(node, endpoint);
            }
            None => {
                self.endpoints.remove(&node);
            }
        }
        for id in held {
            self.add(node, id);
        }
    }

    fn forget_node(&mut self, node: NodeId) {
        for id in self.held.remove(&node).unwrap_or_default() {
            if let Some(holders) = self.holders.get_mut(&id) {
                holders.remove(&node);
                if holders.is_empty() {
                    self.holders.remove(&id);
                }
            }
        }
    }

    /// `node` now holds `id`.
    pub(crate) fn add(&mut self, node: NodeId, id: ObjectId) {
        self.holders.entry(id).or_default().insert(node);
        self.held.entry(node).or_default().insert(id);
    }

    /// `node` no longer holds `id`.
    pub(crate) fn drop_object(&mut self, node: NodeId, id: ObjectId) {
        if let Some(holders) = self.holders.get_mut(&id) {
            holders.remove(&node);
            if holders.is_empty() {
                self.holders.remove(&id);
            }
        }
        if let Some(held) = self.held.get_mut(&node) {
            held.remove(&id);
        }
    }

    /// The nodes holding `id`.
    pub(crate) fn holders(&self, id: ObjectId) -> impl Iterator<Item = NodeId> + '_ {
        self.holders.get(&id).into_iter().flatten().copied()
    }

    /// Whether `node` holds `id`.
    pub(crate) fn holds(&self, node: NodeId, id: ObjectId) -> bool {
        self.held.get(&node).is_some_and(|held| held.contains(&id))
    }

    /// How many objects `node` holds.
    pub(crate) fn held_count(&self, node: NodeId) -> usize {
        self.held.get(&node).map_or(0, BTreeSet::len)
    }

    /// Where `node` serves objects.
    pub(crate) fn endpoint(&self, node: NodeId) -> Option<ObjectEndpoint> {
        self.endpoints.get(&node).copied()
    }

    /// The nodes, among those `usable`, that hold every object of `checkpoint`.
    pub(crate) fn complete_holders(
        &self,
        checkpoint: &CheckpointRecord,
        usable: impl Fn(NodeId) -> bool,
    ) -> Vec<NodeId> {
        let objects = checkpoint.objects();
        let Some(first) = objects.first() else {
            return Vec::new();
        };
        self.holders(*first)
            .filter(|node| usable(*node))
            .filter(|node| objects.iter().all(|id| self.holds(*node, *id)))
            .collect()
    }

    /// Whether every object of `checkpoint` is held by some node among `usable`.
    pub(crate) fn is_available(
        &self,
        checkpoint: &CheckpointRecord,
        usable: impl Fn(NodeId) -> bool,
    ) -> bool {
        checkpoint
            .objects()
            .iter()
            .all(|id| self.holders(*id).any(&usable))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn checkpoint(step: u64, metric: Option<f64>) -> CheckpointRecord {
        CheckpointRecord {
            attempt: 1,
            step,
            files: vec![CheckpointFile {
                name: "state".to_owned(),
                object: ObjectId::of(&step.to_le_bytes()),
                size: 8,
            }],
            at: step,
            metric,
            backup: None,
        }
    }

    fn steps(checkpoints: &[CheckpointRecord]) -> Vec<u64> {
        checkpoints
            .iter()
            .map(|checkpoint| checkpoint.step)
            .collect()
    }

    #[test]
    fn keeps_the_newest_and_the_best() {
        let all = vec![
            checkpoint(1, Some(0.9)),
            checkpoint(2, Some(0.2)),
            checkpoint(3, Some(0.5)),
            checkpoint(4, Some(0.7)),
            checkpoint(5, None),
        ];
        let retention = CheckpointRetention {
            keep_last: 2,
            keep_best: 1,
        };
        let (kept, dropped) = retain(all.clone(), retention, Some(Mode::Min));
        assert_eq!(steps(&kept), [2, 4, 5]);
        assert_eq!(steps(&dropped), [1, 3]);
        let (kept, _) = retain(all.clone(), retention, Some(Mode::Max));
        assert_eq!(steps(&kept), [1, 4, 5]);
        let (kept, _) = retain(all, retention, None);
        assert_eq!(steps(&kept), [4, 5]);
    }

    #[test]
    fn never_drops_when_under_the_limits() {
        let all = vec![checkpoint(1, None)];
        let (kept, dropped) = retain(all, CheckpointRetention::default(), Some(Mode::Min));
        assert_eq!(steps(&kept), [1]);
        assert!(dropped.is_empty());
    }

    #[test]
    fn the_directory_tracks_holders_through_registration_and_drops() {
        let mut directory = ObjectDirectory::default();
        let (a, b) = (NodeId::random(), NodeId::random());
        let record = checkpoint(1, None);
        let id = record.files[0].object;
        let endpoint = ObjectEndpoint {
            port: 1,
            cert_sha256: [0; 32],
        };
        directory.register(a, Some(endpoint), [id]);
        directory.add(b, id);
        assert_eq!(directory.complete_holders(&record, |_| true).len(), 2);
        assert!(directory.is_available(&record, |node| node == b));
        directory.drop_object(b, id);
        assert!(!directory.is_available(&record, |node| node == b));
        // Registering again replaces what the node was thought to hold.
        directory.register(a, Some(endpoint), []);
        assert!(!directory.is_available(&record, |_| true));
        assert_eq!(directory.endpoint(a), Some(endpoint));
    }
}
