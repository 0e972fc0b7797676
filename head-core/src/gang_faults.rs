//! Whose fault a gang's failed exit is: the trial's, or a lost node's.
//!
//! A data-parallel rank fails as soon as a peer's connection drops (gloo and
//! NCCL do), which happens when the peer's node dies, well before the head
//! hears that the node is gone. So a failed exit (non-zero status or a
//! signal) of a rank whose attempt spans two or more nodes is not judged at
//! once. It is held for a window W, the node timeout, from when the head
//! heard it; then:
//!
//! - if any node of the attempt was in trouble at some time in
//!   `[exit − W, now]` (judged lost, its session closed without draining, or
//!   its session silent for more than half the node timeout), the attempt ends
//!   `lost: node N lost` (or `... lost its session`, `... was unreachable for
//!   T s`), naming the first such node; no retry is used, its GPU-hours go to
//!   `node_loss`, and the trial is requeued to resume from its newest
//!   checkpoint;
//! - otherwise, every node alive and answering, it is the trial's failure,
//!   named after the rank that exited first, and retried under `max_retries`.
//!
//! A node lost while it still runs a rank of the attempt ends the attempt as
//! lost right away (`nodes`), so holding only matters when the failed exit
//! comes first. A node silent past the node timeout is lost before the window
//! of an exit heard after its silence began has closed, since the tick judges
//! silence before held exits. A restarted head holds the failed exits it
//! finds again and decides nothing while a node of the attempt has not come
//! back. An attempt on one node is never held: its node reported the exit,
//! so it is alive.

use std::collections::BTreeSet;

use tracing::info;
use xp_runtime::clock::UnixMillis;
use xp_runtime::ids::{NodeId, WorkerKey};

use super::{HeadCore, WorkerState};
use crate::state::HeldExit;

impl HeadCore {
    /// Holds the failed exit of `key` (`how` it exited) for judgement when
    /// its attempt spans several nodes; returns whether it did.
    pub(super) fn hold_gang_exit(&mut self, now: UnixMillis, key: WorkerKey, how: &str) -> bool {
        if self.attempt_nodes(key).len() < 2 {
            return false;
        }
        if !self.held_exits.is_held(key) {
            info!(worker = %key, %how, window_ms = self.config.node_timeout_ms, "failed exit of a gang held until its nodes are judged");
        }
        self.held_exits.hold(HeldExit {
            key,
            how: how.to_owned(),
            at: now,
        });
        true
    }

    /// Decides the held exits whose window has closed (see the module's rule).
    pub(super) fn decide_held_exits(&mut self, now: UnixMillis) {
        let window_ms = self.config.node_timeout_ms;
        for exit in self.held_exits.take_due(now, window_ms) {
            let live = self
                .worker(exit.key)
                .is_some_and(|(attempt, _)| attempt.is_live());
            if !live {
                continue;
            }
            let nodes = self.attempt_nodes(exit.key);
            if nodes.iter().any(|node| self.membership.is_awaited(*node)) {
                // A restarted head: the node's account is still to come.
                self.held_exits.hold(exit);
                continue;
            }
            let since = exit.at.saturating_sub(window_ms);
            match self.membership.troubles().first_between(nodes, since, now) {
                Some(trouble) => {
                    let reason = trouble.to_string();
                    info!(worker = %exit.key, how = %exit.how, %reason, "a gang's failed exit is put down to its node");
                    self.finish_attempt(now, exit.key, &format!("lost: {reason}"));
                    self.requeue_without_retry(
                        now,
                        exit.key.trial,
                        &format!("{reason} ({} meanwhile)", exit.how),
                    );
                }
                None => self.fail_attempt(now, exit.key, exit.how),
            }
        }
    }

    /// Holds again, after a restart, the failed exits of attempts still live.
    pub(super) fn hold_restored_exits(&mut self, now: UnixMillis) {
        let mut failed = Vec::new();
        for trial in self.book.active_trials() {
            let Some(attempt) = trial.attempts.last().filter(|attempt| attempt.is_live()) else {
                continue;
            };
            for worker in &attempt.workers {
                if let WorkerState::Exited { code, signal } = worker.state
                    && code != Some(0)
                {
                    let key = WorkerKey {
                        trial: trial.id,
                        attempt: attempt.number,
                        rank: worker.rank,
                    };
                    failed.push((key, exit_words(key.rank, code, signal)));
                }
            }
        }
        for (key, how) in failed {
            if !self.hold_gang_exit(now, key, &how) {
                self.fail_attempt(now, key, how);
            }
        }
    }

    /// The nodes the attempt of `key` was placed on.
    fn attempt_nodes(&self, key: WorkerKey) -> BTreeSet<NodeId> {
        self.worker(key)
            .map(|(attempt, _)| attempt.workers.iter().map(|worker| worker.node).collect())
            .unwrap_or_default()
    }
}

/// How rank `rank` exited, in words (`rank 1 exited with status 1`).
pub(super) fn exit_words(rank: u32, code: Option<i32>, signal: Option<i32>) -> String {
    let how = match (code, signal) {
        (Some(code), _) => format!("exited with status {code}"),
        (None, Some(signal)) => format!("was killed by signal {signal}"),
        (None, None) => "ended without a status".to_owned(),
    };
    format!("rank {rank} {how}")
}
