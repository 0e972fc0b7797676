//! The node's own record of which GPU each local worker holds, and how much of it.
//!
//! The head decides placement; this table only refuses a launch that would hand
//! more than a whole GPU to the live workers on it (a whole-GPU worker takes all
//! of it, fractional workers share it), so a bug or a stale command elsewhere can
//! never oversubscribe a device beyond what the policy allows: a fractional
//! worker that opted in to the policy's `oversubscription` factor `f` is
//! charged its share divided by `f` (rounded up), the rule the policy core
//! places by, so the GPU's promises reach at most `f` times the GPU, and never
//! more than the whole GPU for workers that did not opt in. Whole-GPU workers
//! never share.

use std::collections::BTreeMap;

use xp_runtime::ids::WorkerKey;

/// Thousandths in one whole GPU.
const WHOLE: u32 = 1000;

/// What an opted-in worker holds of its GPU: the policy core's own rule, so
/// the slot table charges exactly what the head placed.
fn oversubscribed_charge(milli: u32, factor_milli: u32) -> u32 {
    let charge = xp_runtime::spec::oversubscribed_charge(u64::from(milli), u64::from(factor_milli));
    u32::try_from(charge).unwrap_or(milli)
}

/// A GPU has no room for the share asked for.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("GPU {gpu} is held by worker {holder} (asked {asked}/1000, {free}/1000 free)")]
pub(crate) struct SlotBusy {
    /// The GPU index.
    pub gpu: u32,
    /// One worker holding it.
    pub holder: WorkerKey,
    /// The thousandths asked for (an oversubscribed worker's charge).
    pub asked: u32,
    /// The thousandths still free.
    pub free: u32,
}

/// GPU index to the workers holding shares of it.
#[derive(Debug, Default)]
pub(crate) struct SlotTable {
    held: BTreeMap<u32, Vec<(WorkerKey, u32)>>,
}

impl SlotTable {
    #[cfg(test)]
    /// Gives `milli` thousandths of each GPU in `gpus` to `key`, all or none.
    pub(crate) fn claim(
        &mut self,
        key: WorkerKey,
        gpus: &[u32],
        milli: u32,
    ) -> Result<(), SlotBusy> {
        self.claim_oversubscribed(key, gpus, milli, WHOLE)
    }

    /// As [`Self::claim`] for a worker that opted in to oversubscription under
    /// factor `factor_milli` (1500 for 1.5×): it is charged
    /// [`oversubscribed_charge`].
    pub(crate) fn claim_oversubscribed(
        &mut self,
        key: WorkerKey,
        gpus: &[u32],
        milli: u32,
        factor_milli: u32,
    ) -> Result<(), SlotBusy> {
        let milli = oversubscribed_charge(milli.clamp(1, WHOLE), factor_milli);
        for gpu in gpus {
            let holders = self.held.get(gpu).map(Vec::as_slice).unwrap_or_default();
            let used: u32 = holders.iter().map(|(_, share)| share).sum();
            if let Some((holder, _)) = holders.first()
                && used + milli > WHOLE
            {
                return Err(SlotBusy {
                    gpu: *gpu,
                    holder: *holder,
                    asked: milli,
                    free: WHOLE.saturating_sub(used),
                });
            }
        }
        for gpu in gpus {
            self.held.entry(*gpu).or_default().push((key, milli));
        }
        Ok(())
    }

    /// Frees every share `key` holds.
    pub(crate) fn release(&mut self, key: WorkerKey) {
        for holders in self.held.values_mut() {
            holders.retain(|(holder, _)| *holder != key);
        }
        self.held.retain(|_, holders| !holders.is_empty());
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
    fn a_whole_gpu_is_never_held_twice() {
        let mut table = SlotTable::default();
        table.claim(key(1), &[0, 1], WHOLE).unwrap();
        assert_eq!(
            table.claim(key(2), &[1, 2], WHOLE),
            Err(SlotBusy {
                gpu: 1,
                holder: key(1),
                asked: WHOLE,
                free: 0,
            })
        );
        table.claim(key(2), &[2], WHOLE).unwrap();
        table.release(key(1));
        table.claim(key(3), &[0, 1], WHOLE).unwrap();
    }

    #[test]
    fn fractions_share_a_gpu_up_to_its_whole() {
        let mut table = SlotTable::default();
        for index in 0..4 {
            table.claim(key(index), &[0], 250).unwrap();
        }
        assert!(table.claim(key(9), &[0], 1).is_err(), "the GPU is full");
        table.release(key(0));
        assert!(
            table.claim(key(9), &[0], 500).is_err(),
            "only a quarter is free"
        );
        table.claim(key(9), &[0], 250).unwrap();
        assert!(
            table.claim(key(10), &[0], WHOLE).is_err(),
            "a whole-GPU worker never joins sharers"
        );
    }

    #[test]
    fn oversubscribed_fractions_share_up_to_the_factor() {
        assert_eq!(oversubscribed_charge(500, 1500), 334);
        assert_eq!(oversubscribed_charge(500, 1000), 500);
        assert_eq!(
            oversubscribed_charge(WHOLE, 1500),
            WHOLE,
            "whole GPUs never share"
        );
        assert_eq!(
            oversubscribed_charge(300, 9000),
            75,
            "the factor is capped at 4"
        );
        let mut table = SlotTable::default();
        // Under 1.5x two halves are charged 334 each; a third half would pass 1000.
        table.claim_oversubscribed(key(1), &[0], 500, 1500).unwrap();
        table.claim_oversubscribed(key(2), &[0], 500, 1500).unwrap();
        assert!(
            table.claim_oversubscribed(key(3), &[0], 500, 1500).is_err(),
            "rounding up keeps the promises within 1.5 GPUs"
        );
        table.claim_oversubscribed(key(3), &[0], 490, 1500).unwrap();
        assert!(table.claim_oversubscribed(key(4), &[0], 10, 1500).is_err());
        // A worker that did not opt in gets no more than what is truly left.
        let mut table = SlotTable::default();
        table.claim_oversubscribed(key(1), &[0], 750, 1500).unwrap();
        assert!(table.claim(key(2), &[0], 600).is_err());
        table.claim(key(2), &[0], 500).unwrap();
        assert!(
            table
                .claim_oversubscribed(key(3), &[0], WHOLE, 1500)
                .is_err(),
            "a whole-GPU worker never oversubscribes"
        );
    }
}
