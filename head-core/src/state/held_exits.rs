//! Rank exits held back from judgement: a gang's rank that exits with an
//! error while its gang spans several nodes may have died of a peer's lost
//! node (gloo and NCCL fail a rank as soon as a peer's connection drops), so
//! its attempt's outcome waits until the window around that exit has closed
//! (`gang_faults` decides it).
//!
//! Memory only: a restarted head holds them again from the worker states it
//! restored (`HeadCore::restore`).
//!
//! Invariants: one held exit per attempt, the first rank's (later ranks'
//! exits are consequences); an attempt's entry leaves when it is decided.

use std::collections::BTreeMap;

use xp_runtime::clock::UnixMillis;
use xp_runtime::ids::{TrialId, WorkerKey};

/// The first failed exit of an attempt, waiting for its judgement.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct HeldExit {
    /// The rank that exited first.
    pub(crate) key: WorkerKey,
    /// How it exited, in words (`rank 1 exited with status 1`).
    pub(crate) how: String,
    /// When the head heard of it.
    pub(crate) at: UnixMillis,
}

/// The held exits, by attempt.
#[derive(Debug, Default)]
pub(crate) struct HeldExits {
    held: BTreeMap<(TrialId, u32), HeldExit>,
}

impl HeldExits {
    /// Holds `exit` unless its attempt already has one held.
    pub(crate) fn hold(&mut self, exit: HeldExit) {
        self.held
            .entry((exit.key.trial, exit.key.attempt))
            .or_insert(exit);
    }

    /// Whether the attempt of `key` has an exit held.
    pub(crate) fn is_held(&self, key: WorkerKey) -> bool {
        self.held.contains_key(&(key.trial, key.attempt))
    }

    /// The held exits whose window of `window_ms` has closed at `now`, taken
    /// out; the caller holds again those it cannot decide yet.
    pub(crate) fn take_due(&mut self, now: UnixMillis, window_ms: u64) -> Vec<HeldExit> {
        let due: Vec<(TrialId, u32)> = self
            .held
            .iter()
            .filter(|(_, exit)| now > exit.at.saturating_add(window_ms))
            .map(|(attempt, _)| *attempt)
            .collect();
        due.into_iter()
            .filter_map(|attempt| self.held.remove(&attempt))
            .collect()
    }

    /// How many exits are held.
    pub(crate) fn len(&self) -> usize {
        self.held.len()
    }
}

#[cfg(test)]
mod tests {
    use xp_runtime::ids::ExperimentId;

    use super::*;

    fn key(attempt: u32, rank: u32) -> WorkerKey {
        WorkerKey {
            trial: TrialId {
                experiment: ExperimentId { digest: 7, run: 1 },
                index: 0,
            },
            attempt,
            rank,
        }
    }

    fn exit(attempt: u32, rank: u32, at: UnixMillis) -> HeldExit {
        HeldExit {
            key: key(attempt, rank),
            how: format!("rank {rank} exited with status 1"),
            at,
        }
    }

    #[test]
    fn the_first_exit_of_an_attempt_is_held_until_its_window_closes() {
        let mut held = HeldExits::default();
        held.hold(exit(1, 1, 100));
        held.hold(exit(1, 0, 150));
        held.hold(exit(2, 0, 200));
        assert_eq!(held.len(), 2, "one per attempt");
        assert!(held.is_held(key(1, 0)), "any rank of a held attempt");
        assert!(
            held.take_due(1_100, 1_000).is_empty(),
            "the window is closed only after it"
        );
        assert_eq!(held.take_due(1_101, 1_000), [exit(1, 1, 100)]);
        assert!(!held.is_held(key(1, 1)));
        assert_eq!(held.take_due(u64::MAX, 1_000), [exit(2, 0, 200)]);
        assert_eq!(held.len(), 0);
    }
}
