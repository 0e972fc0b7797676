//! The gang fault rule (`gang_faults`) over orderings of a rank's failed exit
//! and its peer node's trouble: exit before loss, loss before exit, both at
//! once, a node whose session closes and comes back, a silence that ends,
//! a genuine failure with every node answering, and a head restart between
//! the exit and its judgement.

use xp_runtime::protocol::TrialState;

use super::*;

/// The gang: two ranks with one GPU each, so one on each of two one-GPU
/// nodes; no retries, so a failure would end the trial.
const GANG: &str = "name: gang\ntrial: {command: [train], workers: 2, resources: {gpu: 1}, max_retries: 0}\nsearch: {algorithm: grid, space: {x: {choice: [1]}}}\n";

/// The window: the node timeout.
const W: u64 = CONFIG.node_timeout_ms;

/// A running gang on nodes a (rank 0) and b (rank 1), started at 1 000.
struct Gang {
    core: HeadCore,
    a: NodeId,
    b: NodeId,
    rank0: WorkerKey,
    rank1: WorkerKey,
}

fn running_gang() -> Gang {
    let mut core = HeadCore::restore(CONFIG, LoadedState::default(), 0);
    let (one, two) = (node_id(1), node_id(2));
    core.handle_node_register(0, registration(one, 1, 2, Vec::new()));
    core.handle_node_register(0, registration(two, 1, 2, Vec::new()));
    submit(&mut core, 0, GANG, false);
    let placed = launches(&commands(&mut core));
    assert_eq!(placed.len(), 2, "{placed:?}");
    // Whichever node the policy gave rank 0 is a.
    let (a, rank0) = *placed.iter().find(|(_, key)| key.rank == 0).unwrap();
    let (b, rank1) = *placed.iter().find(|(_, key)| key.rank == 1).unwrap();
    assert_ne!(a, b, "one rank per one-GPU node");
    for (node, key) in [(a, rank0), (b, rank1)] {
        report(
            &mut core,
            1_000,
            node,
            WorkerReport::Started { key, pid: 1 },
        );
    }
    Gang {
        core,
        a,
        b,
        rank0,
        rank1,
    }
}

impl Gang {
    /// Both nodes (or only `b`, when `a_too` is false) heartbeat every
    /// 500 ms from `from` to `to`, with a tick after each.
    fn heartbeats(&mut self, from: u64, to: u64, a_too: bool) {
        let mut now = from;
        while now <= to {
            self.core
                .handle_node_message(now, self.b, NodeMessage::Heartbeat);
            if a_too {
                self.core
                    .handle_node_message(now, self.a, NodeMessage::Heartbeat);
            }
            self.core.handle_tick(now);
            now += 500;
        }
    }

    fn trial(&self) -> &crate::TrialRecord {
        self.core.book.trial(self.rank0.trial)
    }

    fn first_outcome(&self) -> Option<&str> {
        self.trial().attempts[0].outcome.as_deref()
    }
}

#[test]
fn a_failed_exit_before_its_peer_node_is_lost_is_the_node_s_loss() {
    let mut gang = running_gang();
    // a dies at 1 000; b's rank fails at once, as gloo's does.
    exited(&mut gang.core, 1_200, gang.b, gang.rank1, 1);
    assert_eq!(gang.trial().state, TrialState::Running, "held, not failed");
    assert_eq!(gang.first_outcome(), None);
    gang.heartbeats(1_500, 1_000 + W + 500, false);
    let outcome = format!("lost: node {} lost", gang.a);
    assert_eq!(gang.first_outcome(), Some(outcome.as_str()));
    let trial = gang.trial();
    assert_eq!(trial.failures, 0, "no retry used");
    assert_eq!(trial.state, TrialState::Queued, "waits for two GPUs again");
    gang.core.check_invariants();
}

#[test]
fn a_failed_exit_after_its_peer_node_was_lost_changes_nothing() {
    let mut gang = running_gang();
    gang.heartbeats(1_500, 1_000 + W + 500, false);
    let outcome = format!("lost: node {} lost", gang.a);
    assert_eq!(gang.first_outcome(), Some(outcome.as_str()));
    exited(&mut gang.core, 1_000 + W + 600, gang.b, gang.rank1, 1);
    assert_eq!(gang.first_outcome(), Some(outcome.as_str()));
    assert_eq!(gang.trial().failures, 0);
    assert_eq!(gang.trial().state, TrialState::Queued);
    gang.core.check_invariants();
}

#[test]
fn a_failed_exit_heard_in_the_tick_that_loses_the_peer_node_is_the_node_s_loss() {
    let mut gang = running_gang();
    gang.heartbeats(1_500, 1_000 + W, false);
    assert_eq!(gang.first_outcome(), None, "a is not lost yet");
    let both = 1_000 + W + 1;
    exited(&mut gang.core, both, gang.b, gang.rank1, 1);
    gang.core.handle_tick(both);
    let outcome = format!("lost: node {} lost", gang.a);
    assert_eq!(gang.first_outcome(), Some(outcome.as_str()));
    assert_eq!(gang.trial().failures, 0);
    gang.core.check_invariants();
}

#[test]
fn a_node_whose_session_closed_and_came_back_is_still_the_cause() {
    let mut gang = running_gang();
    gang.core.handle_node_left(2_000, gang.a);
    exited(&mut gang.core, 2_100, gang.b, gang.rank1, 1);
    // a reconnects at once, its rank 0 still running (stuck on its peer).
    gang.core
        .handle_node_register(2_500, registration(gang.a, 1, 2, vec![gang.rank0]));
    gang.heartbeats(2_500, 2_100 + W + 500, true);
    let outcome = format!("lost: node {} lost its session", gang.a);
    assert_eq!(gang.first_outcome(), Some(outcome.as_str()));
    assert_eq!(gang.trial().failures, 0);
    let reason = gang.trial().reason.clone().unwrap_or_default();
    assert!(
        reason.contains("rank 1 exited with status 1"),
        "the requeue names the exit it excused: {reason}"
    );
    assert!(
        commands(&mut gang.core)
            .iter()
            .any(|(node, command)| *node == gang.a
                && matches!(command, HeadCommand::Kill { attempt: 1, .. })),
        "rank 0 is stopped"
    );
    gang.core.check_invariants();
}

#[test]
fn a_silence_that_ended_before_the_exit_was_judged_is_still_the_cause() {
    let mut gang = running_gang();
    gang.heartbeats(1_000, 7_000, false);
    // The shell's session read nothing from a since 1 000: past half the
    // node timeout at 7 000, then a frame at 8 000.
    gang.core.handle_node_heard(7_000, gang.a, 1_000);
    gang.core.handle_node_heard(8_000, gang.a, 8_000);
    exited(&mut gang.core, 8_100, gang.b, gang.rank1, 1);
    gang.heartbeats(8_500, 8_100 + W + 500, true);
    let outcome = format!("lost: node {} was unreachable for 7.0 s", gang.a);
    assert_eq!(gang.first_outcome(), Some(outcome.as_str()));
    assert_eq!(gang.trial().failures, 0);
    gang.core.check_invariants();
}

#[test]
fn a_failed_exit_with_every_node_answering_is_the_trial_s_failure() {
    let mut gang = running_gang();
    gang.core.handle_node_heard(1_900, gang.a, 1_800);
    exited(&mut gang.core, 2_000, gang.b, gang.rank1, 1);
    exited(&mut gang.core, 2_300, gang.a, gang.rank0, 2);
    gang.heartbeats(2_500, 2_000 + W, true);
    assert_eq!(gang.first_outcome(), None, "held for the whole window");
    gang.heartbeats(2_000 + W + 1, 2_000 + W + 1, true);
    assert_eq!(
        gang.first_outcome(),
        Some("failed: rank 1 exited with status 1"),
        "named after the rank that exited first"
    );
    let trial = gang.trial();
    assert_eq!(trial.failures, 1);
    assert_eq!(trial.state, TrialState::Failed);
    gang.core.check_invariants();
}

#[test]
fn a_gang_on_one_node_fails_at_once() {
    let mut core = HeadCore::restore(CONFIG, LoadedState::default(), 0);
    let a = node_id(1);
    core.handle_node_register(0, registration(a, 2, 2, Vec::new()));
    submit(&mut core, 0, GANG, false);
    let placed = launches(&commands(&mut core));
    for (_, key) in &placed {
        report(
            &mut core,
            1_000,
            a,
            WorkerReport::Started { key: *key, pid: 1 },
        );
    }
    let rank1 = placed.iter().find(|(_, key)| key.rank == 1).unwrap().1;
    exited(&mut core, 1_200, a, rank1, 1);
    let trial = core.book.trial(rank1.trial);
    assert_eq!(trial.state, TrialState::Failed);
    assert_eq!(
        trial.attempts[0].outcome.as_deref(),
        Some("failed: rank 1 exited with status 1")
    );
}

#[test]
fn a_restarted_head_holds_the_exit_again_until_the_nodes_have_come_back() {
    let mut gang = running_gang();
    exited(&mut gang.core, 1_200, gang.b, gang.rank1, 1);
    let records = gang.core.take_records();
    let restarted_at = 50_000;
    let mut core = HeadCore::restore(CONFIG, loaded_from(records), restarted_at);
    // b comes back at once; a never does, and is lost after the restart grace.
    core.handle_node_register(restarted_at + 1_000, registration(gang.b, 1, 2, Vec::new()));
    let mut now = restarted_at + 1_000;
    while now <= restarted_at + CONFIG.restart_grace_ms() + 500 {
        core.handle_node_message(now, gang.b, NodeMessage::Heartbeat);
        core.handle_tick(now);
        let attempt = &core.book.trial(gang.rank0.trial).attempts[0];
        if attempt.outcome.is_some() {
            break;
        }
        now += 500;
    }
    let trial = core.book.trial(gang.rank0.trial);
    let outcome = format!("lost: node {} lost", gang.a);
    assert_eq!(trial.attempts[0].outcome.as_deref(), Some(outcome.as_str()));
    assert!(
        now > restarted_at + CONFIG.restart_grace_ms(),
        "decided only once a was judged"
    );
    assert_eq!(trial.failures, 0);
    core.check_invariants();
}

/// Reports that `key`'s worker on `node` exited with `code`, its stderr ending
/// with `stderr_tail`.
fn exited_saying(
    core: &mut HeadCore,
    now: u64,
    node: NodeId,
    key: WorkerKey,
    code: i32,
    stderr_tail: &str,
) {
    report(
        core,
        now,
        node,
        WorkerReport::ExitedWithStderr {
            key,
            code: Some(code),
            signal: None,
            stderr_tail: stderr_tail.to_owned(),
        },
    );
}

#[test]
fn a_failed_exit_keeps_the_end_of_its_stderr_in_the_outcome_bounded() {
    // One node: judged at once, the tail after the exit.
    let (mut core, node) = cluster(1, 2);
    submit(
        &mut core,
        0,
        "name: one\ntrial: {command: [train]}\n",
        false,
    );
    let (_, key) = launches(&commands(&mut core))[0];
    report(
        &mut core,
        1_000,
        node,
        WorkerReport::Started { key, pid: 1 },
    );
    exited_saying(
        &mut core,
        1_200,
        node,
        key,
        2,
        "Traceback:\n  File \"train.py\"\nValueError: bad lr",
    );
    let trial = core.book.trial(key.trial);
    assert_eq!(trial.state, TrialState::Failed);
    assert_eq!(
        trial.attempts[0].outcome.as_deref(),
        Some(
            "failed: rank 0 exited with status 2: Traceback:\n  File \"train.py\"\nValueError: bad lr"
        )
    );
    // A node's tail is bounded again: at most 20 lines and 4 KiB, controls escaped.
    let (mut core, node) = cluster(1, 2);
    submit(
        &mut core,
        0,
        "name: two\ntrial: {command: [train]}\n",
        false,
    );
    let (_, key) = launches(&commands(&mut core))[0];
    let flood: String = (0..5_000)
        .map(|i| format!("line {i} \u{1b}]0;x\u{7}\u{1}\n"))
        .collect();
    exited_saying(&mut core, 1_200, node, key, 1, &flood);
    let outcome = core.book.trial(key.trial).attempts[0]
        .outcome
        .clone()
        .unwrap();
    let tail = outcome
        .strip_prefix("failed: rank 0 exited with status 1: ")
        .unwrap();
    assert!(tail.len() <= 4096 && tail.lines().count() == 20, "{tail}");
    assert!(tail.ends_with("line 4999 \\u0001"), "{tail}");
    core.check_invariants();
}

#[test]
fn a_gangs_held_exit_keeps_the_end_of_its_stderr() {
    let mut gang = running_gang();
    gang.core.handle_node_heard(1_900, gang.a, 1_800);
    exited_saying(
        &mut gang.core,
        2_000,
        gang.b,
        gang.rank1,
        1,
        "RuntimeError: NCCL error",
    );
    assert_eq!(gang.first_outcome(), None, "held");
    gang.heartbeats(2_500, 2_000 + W, true);
    gang.heartbeats(2_000 + W + 1, 2_000 + W + 1, true);
    assert_eq!(
        gang.first_outcome(),
        Some("failed: rank 1 exited with status 1: RuntimeError: NCCL error")
    );
}
