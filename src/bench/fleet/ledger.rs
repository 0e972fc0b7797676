//! What the simulated nodes saw, judged: how many workers started, how long a
//! freed node waited for its next launch, and whether any trial ran twice at
//! once. Pure: events come in with their times.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::time::{Duration, Instant};

use xp_node::fleet::FleetEvent;
use xp_runtime::ids::{NodeId, TrialId};

/// A live worker: where, and which attempt.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Live {
    node: NodeId,
    attempt: u32,
}

/// The soak's ledger of workers.
#[derive(Debug, Default)]
pub(super) struct Ledger {
    /// Live workers by trial and rank.
    live: HashMap<(TrialId, u32), Live>,
    /// Since when each node has had a slot free that no launch took yet.
    freed: HashMap<NodeId, Instant>,
    /// Worker starts seen.
    pub(super) starts: u64,
    /// Trials that started at least once.
    trials_started: std::collections::HashSet<TrialId>,
    /// Registrations seen (first joins and every return).
    pub(super) registrations: u64,
    /// Trials whose rank 0 did all its steps, with the attempts that did.
    completed: BTreeMap<TrialId, BTreeSet<u32>>,
    /// Trials that had two live workers of one rank at once.
    pub(super) duplicated: BTreeSet<TrialId>,
    /// From a node's worker ending to its next launch, while work waited.
    pub(super) freed_to_launch: Vec<Duration>,
}

impl Ledger {
    /// Takes in one event; `waiting` says whether trials were waiting for room
    /// when it happened (only then is a freed node's wait counted).
    pub(super) fn record(&mut self, event: &FleetEvent, waiting: bool) {
        match *event {
            FleetEvent::Registered { .. } => self.registrations += 1,
            FleetEvent::Started { node, key, at } => {
                self.starts += 1;
                self.trials_started.insert(key.trial);
                let live = Live {
                    node,
                    attempt: key.attempt,
                };
                if let Some(before) = self.live.insert((key.trial, key.rank), live)
                    && before != live
                {
                    self.duplicated.insert(key.trial);
                }
                if let Some(freed) = self.freed.remove(&node) {
                    self.freed_to_launch
                        .push(at.saturating_duration_since(freed));
                }
            }
            FleetEvent::Ended {
                node,
                key,
                at,
                completed,
            } => {
                let here = Live {
                    node,
                    attempt: key.attempt,
                };
                if self.live.get(&(key.trial, key.rank)) == Some(&here) {
                    self.live.remove(&(key.trial, key.rank));
                }
                if completed && key.rank == 0 {
                    self.completed
                        .entry(key.trial)
                        .or_default()
                        .insert(key.attempt);
                }
                if waiting {
                    self.freed.entry(node).or_insert(at);
                }
            }
        }
    }

    /// A node died: its workers vanished with it, and it frees nothing.
    pub(super) fn node_died(&mut self, node: NodeId) {
        self.live.retain(|_, live| live.node != node);
        self.freed.remove(&node);
    }

    /// Trials that started at least once.
    pub(super) fn trials_started(&self) -> usize {
        self.trials_started.len()
    }

    /// Trials whose rank 0 finished its work at least once.
    pub(super) fn completed(&self) -> usize {
        self.completed.len()
    }

    /// Trials whose work was done again after an attempt had done it (its
    /// report lost with a dying node, say).
    pub(super) fn redone(&self) -> usize {
        self.completed
            .values()
            .filter(|attempts| attempts.len() > 1)
            .count()
    }
}

#[cfg(test)]
mod tests {
    use xp_runtime::ids::WorkerKey;

    use super::*;

    fn key(trial: TrialId, attempt: u32) -> WorkerKey {
        WorkerKey {
            trial,
            attempt,
            rank: 0,
        }
    }

    #[test]
    fn a_second_live_attempt_of_one_rank_is_a_duplicate_but_a_relaunch_after_a_death_is_not() {
        let trial: TrialId = "3f2a9c0d11b2e4f7-t9".parse().expect("a trial id");
        let at = tokio::time::Instant::now().into_std();
        let node = [NodeId::random(), NodeId::random(), NodeId::random()];
        let mut ledger = Ledger::default();
        let started = |node, attempt| FleetEvent::Started {
            node,
            key: key(trial, attempt),
            at,
        };
        ledger.record(&started(node[0], 1), false);
        ledger.node_died(node[0]);
        ledger.record(&started(node[1], 2), false);
        assert!(ledger.duplicated.is_empty(), "the first died with its node");
        ledger.record(&started(node[2], 3), false);
        assert_eq!(ledger.duplicated, BTreeSet::from([trial]));
    }

    #[test]
    fn a_freed_node_waits_until_its_next_launch_only_while_work_waits() {
        let trial: TrialId = "3f2a9c0d11b2e4f7-t9".parse().expect("a trial id");
        let other: TrialId = "3f2a9c0d11b2e4f7-t8".parse().expect("a trial id");
        let at = tokio::time::Instant::now().into_std();
        let node = NodeId::random();
        let mut ledger = Ledger::default();
        let ended = |trial, waiting_at| FleetEvent::Ended {
            node,
            key: key(trial, 1),
            at: waiting_at,
            completed: true,
        };
        ledger.record(&ended(trial, at), false);
        ledger.record(
            &FleetEvent::Started {
                node,
                key: key(other, 1),
                at: at + Duration::from_millis(5),
            },
            false,
        );
        assert!(ledger.freed_to_launch.is_empty(), "nothing waited");
        ledger.record(&ended(other, at + Duration::from_millis(10)), true);
        ledger.record(
            &FleetEvent::Started {
                node,
                key: key(trial, 2),
                at: at + Duration::from_millis(40),
            },
            true,
        );
        assert_eq!(ledger.freed_to_launch, vec![Duration::from_millis(30)]);
        assert_eq!(ledger.completed(), 2);
        assert_eq!(ledger.redone(), 0);
    }
}
