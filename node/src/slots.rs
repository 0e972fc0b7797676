//! The node's own record of which GPU each local worker holds.
//!
//! The head decides placement; this table only refuses a launch that would hand a
//! GPU to a second live worker, so a bug or a stale command elsewhere can never
//! put two workers on one device.

use std::collections::BTreeMap;

use xp_runtime::ids::WorkerKey;

/// A GPU is already held.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("GPU {gpu} is held by worker {holder}")]
pub struct SlotBusy {
    /// The GPU index.
    pub gpu: u32,
    /// Who holds it.
    pub holder: WorkerKey,
}

/// GPU index to the worker holding it.
#[derive(Debug, Default)]
pub struct SlotTable {
    held: BTreeMap<u32, WorkerKey>,
}

impl SlotTable {
    /// Gives `gpus` to `key`, all or none.
    pub fn claim(&mut self, key: WorkerKey, gpus: &[u32]) -> Result<(), SlotBusy> {
        if let Some((gpu, holder)) = gpus
            .iter()
            .find_map(|gpu| self.held.get(gpu).map(|holder| (*gpu, *holder)))
        {
            return Err(SlotBusy { gpu, holder });
        }
        for gpu in gpus {
            self.held.insert(*gpu, key);
        }
        Ok(())
    }

    /// Frees every GPU `key` holds.
    pub fn release(&mut self, key: WorkerKey) {
        self.held.retain(|_, holder| *holder != key);
    }
}

#[cfg(test)]
mod tests {
    use xp_runtime::ids::{ExperimentId, TrialId};

    use super::*;

    fn key(index: u32) -> WorkerKey {
        WorkerKey {
            trial: TrialId {
                experiment: ExperimentId { digest: 1, run: 1 },
                index,
            },
            attempt: 1,
            rank: 0,
        }
    }

    #[test]
    fn a_gpu_is_never_held_twice() {
        let mut table = SlotTable::default();
        table.claim(key(1), &[0, 1]).unwrap();
        assert_eq!(
            table.claim(key(2), &[1, 2]),
            Err(SlotBusy {
                gpu: 1,
                holder: key(1)
            })
        );
        table.claim(key(2), &[2]).unwrap();
        table.release(key(1));
        table.claim(key(3), &[0, 1]).unwrap();
    }
}
