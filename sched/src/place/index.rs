//! The node pool's search indexes and totals, and their upkeep.
//!
//! The pool keeps schedulable nodes in buckets by whole free GPUs, each an
//! ordered set keyed by free CPU; the partly used GPUs in one ordered set keyed
//! by room, then the node's free CPU; a count of partly used GPUs per room;
//! total free amounts; node sets per label and per GPU model; and, per GPU
//! model, its nodes' buckets and partly used GPUs again (`ModelUsage`). Every change
//! to a node re-keys only that node: O(G log n) for n schedulable nodes and G
//! GPUs on the node.
//!
//! Invariant: the indexes and totals hold exactly the schedulable nodes, each
//! keyed by its current usage; every change to a node goes through
//! `unindex`/`index` (or `update_usage`), and `check_indexes` (in tests)
//! compares them with a rebuild. Searching them is `search`'s work.

use std::collections::BTreeSet;

use super::node::{Usage, add_amount, sub_amount};
use super::{NodePool, WHOLE_GPU};
use crate::GangShape;

/// A partly used GPU: `(room, node's free CPU, node index, GPU index)`. Sorted,
/// the tightest GPUs come first and, among equal rooms, the nodes with least CPU.
pub(super) type SharedKey = (u32, u64, usize, u32);

/// Where a gang's constraints let it go.
pub(super) enum Narrowing<'a> {
    /// No constraint narrows the search.
    Any,
    /// No schedulable node carries a label, or any of the models.
    Nothing,
    /// Only nodes in one of these sets can match (then check all constraints).
    Among(Vec<&'a BTreeSet<usize>>),
    /// Only nodes of this GPU model can match (then check all constraints);
    /// its nodes' usage is kept in `ModelUsage`.
    OneModel(&'a str),
}

/// The usage-keyed sets of one GPU model's schedulable nodes, kept like the
/// pool's own (`by_free_whole`, `shared`), so that a gang asking for that
/// model searches them instead of listing and sorting the model's nodes for
/// every search.
#[derive(Debug, Clone, Default)]
pub(super) struct ModelUsage {
    /// Like the pool's `by_free_whole`, for this model's nodes.
    pub(super) by_free_whole: Vec<BTreeSet<(u64, usize)>>,
    /// Like the pool's `shared`, for this model's nodes.
    pub(super) shared: BTreeSet<SharedKey>,
}

impl NodePool {
    /// The node sets that a gang's constraints narrow the search to.
    pub(super) fn narrowing(&self, gang: &GangShape, needs_gpu: bool) -> Narrowing<'_> {
        let mut best: Option<(usize, Narrowing<'_>)> = None;
        for (key, value) in &gang.node_labels {
            let Some(set) = self.by_label.get(key).and_then(|values| values.get(value)) else {
                return Narrowing::Nothing;
            };
            if best.as_ref().is_none_or(|(size, _)| set.len() < *size) {
                best = Some((set.len(), Narrowing::Among(vec![set])));
            }
        }
        if needs_gpu && !gang.gpu_models.is_empty() {
            let models: BTreeSet<&String> = gang.gpu_models.iter().collect();
            let sets: Vec<(&String, &BTreeSet<usize>)> = models
                .into_iter()
                .filter_map(|model| self.by_model.get_key_value(model))
                .collect();
            let size = sets.iter().map(|(_, set)| set.len()).sum();
            let narrowing = match sets.as_slice() {
                [] => return Narrowing::Nothing,
                [(model, _)] => Narrowing::OneModel(model.as_str()),
                _ => Narrowing::Among(sets.into_iter().map(|(_, set)| set).collect()),
            };
            if best.as_ref().is_none_or(|(best_size, _)| size < *best_size) {
                best = Some((size, narrowing));
            }
        }
        best.map_or(Narrowing::Any, |(_, narrowing)| narrowing)
    }

    /// The schedulable nodes of a GPU model (none when it has none).
    pub(super) fn model_nodes(&self, model: &str) -> impl Iterator<Item = &usize> + '_ {
        self.by_model.get(model).into_iter().flatten()
    }

    /// Adds a node to the indexes and totals if it is schedulable.
    pub(super) fn index(&mut self, idx: usize) {
        self.index_usage(idx);
        let node = &self.nodes[idx];
        if !node.schedulable {
            return;
        }
        for (key, value) in &node.spec.labels {
            self.by_label
                .entry(key.clone())
                .or_default()
                .entry(value.clone())
                .or_default()
                .insert(idx);
        }
        if let Some(model) = &node.spec.gpu_model {
            self.by_model.entry(model.clone()).or_default().insert(idx);
        }
    }

    /// Takes a node out of the indexes and totals; the mirror of [`Self::index`].
    pub(super) fn unindex(&mut self, idx: usize) {
        self.unindex_usage(idx);
        let node = &self.nodes[idx];
        if !node.schedulable {
            return;
        }
        for (key, value) in &node.spec.labels {
            if let Some(values) = self.by_label.get_mut(key) {
                if let Some(set) = values.get_mut(value) {
                    set.remove(&idx);
                    if set.is_empty() {
                        values.remove(value);
                    }
                }
                if values.is_empty() {
                    self.by_label.remove(key);
                }
            }
        }
        if let Some(model) = &node.spec.gpu_model
            && let Some(set) = self.by_model.get_mut(model)
        {
            set.remove(&idx);
            if set.is_empty() {
                self.by_model.remove(model);
            }
        }
    }

    /// Adds a node's usage-dependent keys (bucket, partly used GPUs, totals).
    fn index_usage(&mut self, idx: usize) {
        let view = self.nodes[idx].view();
        if !view.schedulable {
            return;
        }
        let bucket = view.usage.free_whole as usize;
        if self.by_free_whole.len() <= bucket {
            self.by_free_whole.resize_with(bucket + 1, BTreeSet::new);
        }
        self.by_free_whole[bucket].insert((view.free_cpu(), idx));
        let mut model = view
            .spec
            .gpu_model
            .as_ref()
            .map(|model| self.model_usage.entry(model.clone()).or_default());
        if let Some(model) = &mut model {
            if model.by_free_whole.len() <= bucket {
                model.by_free_whole.resize_with(bucket + 1, BTreeSet::new);
            }
            model.by_free_whole[bucket].insert((view.free_cpu(), idx));
        }
        for (gpu, room) in view.partly_used() {
            if let Some(model) = &mut model {
                model.shared.insert((room, view.free_cpu(), idx, gpu));
            }
            self.shared.insert((room, view.free_cpu(), idx, gpu));
            self.shared_room_total += u64::from(room);
            if self.shared_by_room.len() < WHOLE_GPU as usize {
                self.shared_by_room.resize(WHOLE_GPU as usize, 0);
            }
            self.shared_by_room[room as usize] += 1;
        }
        add_amount(&mut self.capacity_total, view.capacity());
        add_amount(&mut self.free_total, view.free());
    }

    /// Removes what [`Self::index_usage`] added; call before the usage changes.
    fn unindex_usage(&mut self, idx: usize) {
        let view = self.nodes[idx].view();
        if !view.schedulable {
            return;
        }
        let bucket = view.usage.free_whole as usize;
        self.by_free_whole[bucket].remove(&(view.free_cpu(), idx));
        let mut model = view
            .spec
            .gpu_model
            .as_ref()
            .and_then(|model| self.model_usage.get_mut(model));
        if let Some(model) = &mut model {
            model.by_free_whole[bucket].remove(&(view.free_cpu(), idx));
        }
        for (gpu, room) in view.partly_used() {
            if let Some(model) = &mut model {
                model.shared.remove(&(room, view.free_cpu(), idx, gpu));
            }
            self.shared.remove(&(room, view.free_cpu(), idx, gpu));
            self.shared_room_total -= u64::from(room);
            self.shared_by_room[room as usize] -= 1;
        }
        sub_amount(&mut self.capacity_total, view.capacity());
        sub_amount(&mut self.free_total, view.free());
    }

    /// Changes a node's usage, re-keying it in the indexes.
    pub(super) fn update_usage(&mut self, idx: usize, change: impl FnOnce(&mut Usage)) {
        self.unindex_usage(idx);
        let usage = &mut self.nodes[idx].usage;
        change(usage);
        usage.recount();
        self.index_usage(idx);
    }

    /// Rebuilds every index from the nodes and asserts that it equals the kept one.
    #[cfg(test)]
    pub(super) fn check_indexes(&self) {
        let mut rebuilt = Self {
            nodes: self.nodes.clone(),
            index_of: self.index_of.clone(),
            ..Self::default()
        };
        for idx in 0..rebuilt.nodes.len() {
            rebuilt.index(idx);
        }
        for (idx, node) in self.nodes.iter().enumerate() {
            assert_eq!(self.index_of[&node.spec.id], idx);
            assert_eq!(node.usage.gpu_used.len(), node.spec.gpus as usize);
        }
        assert_eq!(self.index_of.len(), self.nodes.len());
        let non_empty = |buckets: &Vec<BTreeSet<(u64, usize)>>| -> Vec<(usize, Vec<(u64, usize)>)> {
            buckets
                .iter()
                .enumerate()
                .filter(|(_, set)| !set.is_empty())
                .map(|(bucket, set)| (bucket, set.iter().copied().collect()))
                .collect()
        };
        assert_eq!(
            non_empty(&self.by_free_whole),
            non_empty(&rebuilt.by_free_whole)
        );
        assert_eq!(self.shared, rebuilt.shared);
        let non_zero = |counts: &Vec<u64>| -> Vec<(usize, u64)> {
            counts
                .iter()
                .copied()
                .enumerate()
                .filter(|(_, count)| *count > 0)
                .collect()
        };
        assert_eq!(
            non_zero(&self.shared_by_room),
            non_zero(&rebuilt.shared_by_room)
        );
        assert_eq!(self.by_label, rebuilt.by_label);
        assert_eq!(self.by_model, rebuilt.by_model);
        // A model's entry stays once it has had nodes; compare what is in them.
        type ModelKeys = (String, Vec<(usize, Vec<(u64, usize)>)>, BTreeSet<SharedKey>);
        let models = |pool: &Self| -> Vec<ModelKeys> {
            pool.model_usage
                .iter()
                .map(|(model, usage)| {
                    let buckets = non_empty(&usage.by_free_whole);
                    (model.clone(), buckets, usage.shared.clone())
                })
                .filter(|(_, buckets, shared)| !buckets.is_empty() || !shared.is_empty())
                .collect()
        };
        assert_eq!(models(self), models(&rebuilt));
        assert_eq!(self.capacity_total, rebuilt.capacity_total);
        assert_eq!(self.free_total, rebuilt.free_total);
        assert_eq!(self.shared_room_total, rebuilt.shared_room_total);
    }
}
