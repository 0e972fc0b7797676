//! First-fit gang placement: the narrow interface the full policy core will replace.
//!
//! Pure: given each ready node's free resources and a gang's per-worker demand,
//! it returns a slot for every worker or nothing at all.
//!
//! Invariant: a returned placement never assigns a GPU index twice, nor more CPU
//! or memory than a node has free; a gang is placed whole or not at all.

use xp_runtime::ids::NodeId;

/// What one node has free now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FreeResources {
    /// The node.
    pub node: NodeId,
    /// GPU indices not assigned to any worker, ascending.
    pub free_gpus: Vec<u32>,
    /// CPU thousandths not assigned.
    pub free_milli_cpus: u32,
    /// Memory bytes not assigned.
    pub free_memory_bytes: u64,
}

/// What each worker of a gang needs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WorkerDemand {
    /// Whole GPUs per worker.
    pub gpus: u32,
    /// CPU thousandths per worker.
    pub milli_cpus: u32,
    /// Memory bytes per worker.
    pub memory_bytes: u64,
}

/// Where one worker goes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WorkerSlot {
    /// The node.
    pub node: NodeId,
    /// The GPU indices it gets.
    pub gpu_indices: Vec<u32>,
}

/// Places `workers` workers of `demand`, packing each onto the first node that
/// still fits it, so a gang uses as few nodes as first-fit finds.
pub fn place_gang(
    nodes: &[FreeResources],
    demand: WorkerDemand,
    workers: u32,
) -> Option<Vec<WorkerSlot>> {
    let mut remaining: Vec<FreeResources> = nodes.to_vec();
    let mut slots = Vec::with_capacity(workers as usize);
    for _ in 0..workers {
        let node = remaining.iter_mut().find(|node| {
            node.free_gpus.len() >= demand.gpus as usize
                && node.free_milli_cpus >= demand.milli_cpus
                && node.free_memory_bytes >= demand.memory_bytes
        })?;
        let gpu_indices: Vec<u32> = node.free_gpus.drain(..demand.gpus as usize).collect();
        node.free_milli_cpus -= demand.milli_cpus;
        node.free_memory_bytes -= demand.memory_bytes;
        slots.push(WorkerSlot {
            node: node.node,
            gpu_indices,
        });
    }
    Some(slots)
}

#[cfg(test)]
mod tests {
    use std::collections::{BTreeMap, BTreeSet};

    use proptest::prelude::*;

    use super::*;

    fn node(seed: u8, gpus: u32, milli_cpus: u32, memory_bytes: u64) -> FreeResources {
        FreeResources {
            node: NodeId(uuid::Uuid::from_bytes([seed; 16])),
            free_gpus: (0..gpus).collect(),
            free_milli_cpus: milli_cpus,
            free_memory_bytes: memory_bytes,
        }
    }

    #[test]
    fn a_gang_spans_nodes_only_when_it_must() {
        let nodes = [node(1, 2, 8000, 0), node(2, 4, 8000, 0)];
        let demand = WorkerDemand {
            gpus: 1,
            milli_cpus: 1000,
            memory_bytes: 0,
        };
        let slots = place_gang(&nodes, demand, 3).unwrap();
        assert_eq!(
            slots
                .iter()
                .filter(|slot| slot.node == nodes[0].node)
                .count(),
            2
        );
        assert_eq!(slots[2].gpu_indices, vec![0]);
        assert!(
            place_gang(&nodes, demand, 7).is_none(),
            "six GPUs cannot hold seven workers"
        );
    }

    proptest! {
        #[test]
        fn placements_never_overallocate_and_are_all_or_nothing(
            shapes in proptest::collection::vec((0u32..5, 0u32..9000, 0u64..(16 << 30)), 1..6),
            gpus in 0u32..3, milli_cpus in 0u32..5000, memory_bytes in 0u64..(8 << 30), workers in 1u32..9,
        ) {
            let nodes: Vec<FreeResources> = shapes.iter().enumerate()
                .map(|(idx, (gpus, cpus, memory))| node(idx as u8, *gpus, *cpus, *memory)).collect();
            let demand = WorkerDemand { gpus, milli_cpus, memory_bytes };
            let Some(slots) = place_gang(&nodes, demand, workers) else {
                return Ok(());
            };
            prop_assert_eq!(slots.len(), workers as usize, "a gang is placed whole");
            let mut used_gpus: BTreeMap<NodeId, BTreeSet<u32>> = BTreeMap::new();
            for slot in &slots {
                prop_assert_eq!(slot.gpu_indices.len(), gpus as usize);
                let free = nodes.iter().find(|node| node.node == slot.node).unwrap();
                for gpu in &slot.gpu_indices {
                    prop_assert!(free.free_gpus.contains(gpu));
                    prop_assert!(used_gpus.entry(slot.node).or_default().insert(*gpu), "GPU given twice");
                }
            }
            for free in &nodes {
                let on_node = slots.iter().filter(|slot| slot.node == free.node).count() as u64;
                prop_assert!(on_node * u64::from(milli_cpus) <= u64::from(free.free_milli_cpus));
                prop_assert!(on_node * memory_bytes <= free.free_memory_bytes);
            }
        }
    }
}
