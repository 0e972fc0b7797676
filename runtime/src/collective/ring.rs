//! The schedule of every collective on a ring, as a plain list of steps per rank.
//!
//! This is the sans-io core: no I/O, no clock, no tasks. A [`Schedule`] says, for
//! one rank, which element ranges of a workspace it sends to the next rank, which
//! ranges it receives from the previous rank (and whether it adds or copies them),
//! and which earlier steps each one waits for. The shell in `communicator` performs
//! the steps over real links; the tests here perform them over in-memory queues.
//!
//! Algorithms:
//! - [`Algorithm::Ring`]: the bandwidth-optimal ring all-reduce. The buffer is split
//!   into `W` chunks; W−1 reduce-scatter steps leave each rank with one fully reduced
//!   chunk, then W−1 all-gather steps copy every reduced chunk around. Each rank
//!   sends 2(W−1)/W of the buffer. Chunks are cut into segments of at most
//!   `max_segment_bytes`, and into at least `min_segments` when they are large
//!   enough, so that a rank forwards segment k while it still receives segment k+1.
//!   Steps are interleaved in wavefront order (segment k of step s in slot
//!   k + s·lag), so a segment is forwarded soon after it arrived, while it is still
//!   in cache, instead of after the whole chunk.
//! - [`Algorithm::GatherReduce`]: the latency-optimal path for small buffers. Every
//!   rank's whole buffer travels around the ring (W−1 hops instead of 2(W−1)), then
//!   every rank adds the W buffers in rank order 0..W.
//! - [`Algorithm::AllGather`] and [`Algorithm::Broadcast`]: pipelined ring forms.
//!
//! Invariants (checked by [`Schedule::check_invariants`] and the tests):
//! - Determinism: each element's additions happen in the same order on every rank.
//!   In `Ring`, a chunk's sum is computed once, by one rank, and then copied; in
//!   `GatherReduce` every rank adds in rank order.
//! - Safety of overlap: a send and a receive whose ranges overlap are never in
//!   flight together; one of them waits for the other (`after_recvs`,
//!   `after_sends`). The shell relies on this to send from and receive into one
//!   buffer at once.
//! - The i-th send of a rank and the i-th receive of the next rank move the same
//!   elements, so a frame's index and length identify it.

use std::ops::Range;

/// Which algorithm a schedule runs; the choice depends only on the arguments that
/// every rank shares, so all ranks choose the same one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Algorithm {
    /// Reduce-scatter then all-gather; bandwidth-optimal.
    Ring,
    /// Whole buffers around the ring, then a local sum in rank order; for small buffers.
    GatherReduce,
    /// Every rank's block to every rank, in rank order.
    AllGather,
    /// One rank's buffer to every rank, pipelined around the ring.
    Broadcast,
}

/// What a receive does with the bytes it gets.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RecvAction {
    /// Add the received values to the range, element by element.
    Reduce,
    /// Overwrite the range with the received values.
    Copy,
}

/// One send to the next rank.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SendOp {
    /// The workspace elements sent.
    pub range: Range<usize>,
    /// How many receives (a prefix of [`Schedule::recvs`]) must be complete first.
    pub after_recvs: usize,
}

/// One receive from the previous rank.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RecvOp {
    /// The workspace elements received.
    pub range: Range<usize>,
    /// Add or copy.
    pub action: RecvAction,
    /// How many sends (a prefix of [`Schedule::sends`]) must be complete first.
    pub after_sends: usize,
}

/// How buffers are cut into segments, the unit of pipelining and of one frame.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Segmenting {
    /// The largest segment, in bytes.
    pub max_segment_bytes: usize,
    /// A chunk of at least `min_segments * min_segment_bytes` bytes is cut into at
    /// least `min_segments` segments, so that several are in flight per neighbour.
    pub min_segments: usize,
    /// See `min_segments`.
    pub min_segment_bytes: usize,
    /// How many segments a step runs ahead of the next step: segment k of step s is
    /// scheduled in slot `k + s * lag_segments`. Small values forward data while it
    /// is still in cache; larger ones keep more segments in flight on slow links.
    pub lag_segments: usize,
}

impl Default for Segmenting {
    fn default() -> Self {
        Self {
            max_segment_bytes: 1 << 20,
            min_segments: 2,
            min_segment_bytes: 64 << 10,
            lag_segments: 8,
        }
    }
}

impl Segmenting {
    /// The segments of `range` for elements of `elem_size` bytes: always at least
    /// one, even for an empty range, so every step sends a frame.
    fn split(&self, range: Range<usize>, elem_size: usize) -> Vec<Range<usize>> {
        let len = range.len();
        let max_elems = (self.max_segment_bytes / elem_size).max(1);
        let mut count = len.div_ceil(max_elems).max(1);
        if len * elem_size >= self.min_segments * self.min_segment_bytes {
            count = count.max(self.min_segments);
        }
        (0..count)
            .map(|index| {
                let part = block(len, count, index);
                range.start + part.start..range.start + part.end
            })
            .collect()
    }
}

/// The `index`-th of `parts` balanced blocks of `0..len`: the first `len % parts`
/// blocks hold one element more.
pub fn block(len: usize, parts: usize, index: usize) -> Range<usize> {
    assert!(parts > 0 && index < parts, "block {index} of {parts}");
    let base = len / parts;
    let extra = len % parts;
    let start = index * base + index.min(extra);
    let size = base + usize::from(index < extra);
    start..start + size
}

/// One rank's part of one collective.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Schedule {
    /// The algorithm.
    pub algorithm: Algorithm,
    /// This rank.
    pub rank: u32,
    /// Ranks in the ring.
    pub world_size: u32,
    /// Elements in the workspace the ranges index: the buffer itself for `Ring`
    /// and `Broadcast`, `world_size` blocks of the buffer's length for
    /// `GatherReduce` and `AllGather` (this rank's block is its own input).
    pub workspace_len: usize,
    /// Sends to the next rank, in order.
    pub sends: Vec<SendOp>,
    /// Receives from the previous rank, in order.
    pub recvs: Vec<RecvOp>,
}

/// The steps of a ring pass: at step `s`, send the ranges of `send_block(s)` and
/// receive those of `recv_block(s)`; each send after the first step forwards what
/// the previous step received.
struct Pass<'a> {
    steps: usize,
    send_block: &'a dyn Fn(usize) -> Range<usize>,
    recv_block: &'a dyn Fn(usize) -> Range<usize>,
    recv_action: &'a dyn Fn(usize) -> RecvAction,
}

/// One segment of one step of a pass.
struct Wave {
    step: usize,
    segment: usize,
    range: Range<usize>,
}

/// Each of `steps` blocks cut into segments, in wavefront order: segment k of
/// step s in slot k + s * lag, older segments (higher steps) first within a slot.
fn wavefront(
    segmenting: &Segmenting,
    elem_size: usize,
    steps: usize,
    block: &dyn Fn(usize) -> Range<usize>,
) -> Vec<Wave> {
    let lag = segmenting.lag_segments.max(1);
    let mut waves = Vec::new();
    for step in 0..steps {
        for (segment, range) in segmenting
            .split(block(step), elem_size)
            .into_iter()
            .enumerate()
        {
            waves.push(Wave {
                step,
                segment,
                range,
            });
        }
    }
    // Stable, as the order within a slot and step must be the segments' own.
    waves.sort_by_key(|wave| (wave.segment + wave.step * lag, std::cmp::Reverse(wave.step)));
    waves
}

fn modulo(value: i64, world: u32) -> usize {
    usize::try_from(value.rem_euclid(i64::from(world))).expect("a remainder is non-negative")
}

impl Schedule {
    /// The all-reduce of `len` elements of `elem_size` bytes: [`Algorithm::Ring`]
    /// above `small_buffer_bytes`, [`Algorithm::GatherReduce`] up to it.
    pub fn all_reduce(
        rank: u32,
        world_size: u32,
        len: usize,
        elem_size: usize,
        small_buffer_bytes: usize,
        segmenting: &Segmenting,
    ) -> Self {
        assert!(rank < world_size, "rank {rank} of {world_size}");
        if len * elem_size <= small_buffer_bytes {
            let mut schedule = Self::all_gather(rank, world_size, len, elem_size, segmenting);
            schedule.algorithm = Algorithm::GatherReduce;
            return schedule;
        }
        let world = world_size as usize;
        let chunk = |index: usize| block(len, world, index);
        let r = i64::from(rank);
        let half = world - 1;
        // Reduce-scatter step s sends chunk r−s and adds chunk r−s−1; all-gather step
        // s sends chunk r+1−s and copies chunk r−s.
        let send_block = |step: usize| {
            let s = step as i64;
            if step < half {
                chunk(modulo(r - s, world_size))
            } else {
                chunk(modulo(r + 1 - (s - half as i64), world_size))
            }
        };
        let recv_block = |step: usize| {
            let s = step as i64;
            if step < half {
                chunk(modulo(r - s - 1, world_size))
            } else {
                chunk(modulo(r - (s - half as i64), world_size))
            }
        };
        let recv_action = |step: usize| {
            if step < half {
                RecvAction::Reduce
            } else {
                RecvAction::Copy
            }
        };
        let pass = Pass {
            steps: 2 * half,
            send_block: &send_block,
            recv_block: &recv_block,
            recv_action: &recv_action,
        };
        Self::from_pass(
            Algorithm::Ring,
            rank,
            world_size,
            len,
            elem_size,
            segmenting,
            &pass,
        )
    }

    /// The all-gather of one block of `len` elements per rank into a workspace of
    /// `world_size * len` elements, in rank order.
    pub fn all_gather(
        rank: u32,
        world_size: u32,
        len: usize,
        elem_size: usize,
        segmenting: &Segmenting,
    ) -> Self {
        assert!(rank < world_size, "rank {rank} of {world_size}");
        let r = i64::from(rank);
        let slot = |owner: usize| owner * len..(owner + 1) * len;
        let send_block = |step: usize| slot(modulo(r - step as i64, world_size));
        let recv_block = |step: usize| slot(modulo(r - step as i64 - 1, world_size));
        let recv_action = |_| RecvAction::Copy;
        let pass = Pass {
            steps: world_size as usize - 1,
            send_block: &send_block,
            recv_block: &recv_block,
            recv_action: &recv_action,
        };
        Self::from_pass(
            Algorithm::AllGather,
            rank,
            world_size,
            world_size as usize * len,
            elem_size,
            segmenting,
            &pass,
        )
    }

    /// The broadcast of `len` elements from `root`, pipelined segment by segment
    /// along the ring root, root+1, ..., root−1.
    pub fn broadcast(
        rank: u32,
        world_size: u32,
        root: u32,
        len: usize,
        elem_size: usize,
        segmenting: &Segmenting,
    ) -> Self {
        assert!(
            rank < world_size && root < world_size,
            "rank {rank}, root {root} of {world_size}"
        );
        let distance = modulo(i64::from(rank) - i64::from(root), world_size);
        let last = world_size as usize - 1;
        let segments = segmenting.split(0..len, elem_size);
        let recvs = if distance == 0 {
            Vec::new()
        } else {
            segments
                .iter()
                .map(|range| RecvOp {
                    range: range.clone(),
                    action: RecvAction::Copy,
                    after_sends: 0,
                })
                .collect()
        };
        let sends = if distance == last {
            Vec::new()
        } else {
            segments
                .iter()
                .enumerate()
                .map(|(index, range)| SendOp {
                    range: range.clone(),
                    after_recvs: if distance == 0 { 0 } else { index + 1 },
                })
                .collect()
        };
        let mut schedule = Self {
            algorithm: Algorithm::Broadcast,
            rank,
            world_size,
            workspace_len: len,
            sends,
            recvs,
        };
        schedule.order_overlaps();
        schedule
    }

    fn from_pass(
        algorithm: Algorithm,
        rank: u32,
        world_size: u32,
        workspace_len: usize,
        elem_size: usize,
        segmenting: &Segmenting,
        pass: &Pass<'_>,
    ) -> Self {
        // Wavefront order: segment k of step s goes in slot k + s * lag, older
        // segments (higher steps) first within a slot. A rank forwards a segment
        // `lag` slots after receiving it, while it is still in cache, and several
        // segments are in flight at different steps. Both ends of a link list the same (step,
        // segment) pairs in the same order, so frame i means the same elements.
        let send_waves = wavefront(segmenting, elem_size, pass.steps, pass.send_block);
        let recv_waves = wavefront(segmenting, elem_size, pass.steps, pass.recv_block);
        let recv_position: std::collections::HashMap<(usize, usize), usize> = recv_waves
            .iter()
            .enumerate()
            .map(|(position, wave)| ((wave.step, wave.segment), position))
            .collect();
        let sends = send_waves
            .into_iter()
            .map(|wave| {
                // Each send after the first step forwards what the previous step
                // received in the same segment.
                let after_recvs = match wave.step {
                    0 => 0,
                    step => recv_position[&(step - 1, wave.segment)] + 1,
                };
                SendOp {
                    range: wave.range,
                    after_recvs,
                }
            })
            .collect();
        let recvs = recv_waves
            .into_iter()
            .map(|wave| RecvOp {
                range: wave.range,
                action: (pass.recv_action)(wave.step),
                after_sends: 0,
            })
            .collect();
        let mut schedule = Self {
            algorithm,
            rank,
            world_size,
            workspace_len,
            sends,
            recvs,
        };
        schedule.order_overlaps();
        schedule
    }

    /// Makes every receive wait for the sends that read its range and do not
    /// already wait for it.
    fn order_overlaps(&mut self) {
        for (recv_index, recv) in self.recvs.iter_mut().enumerate() {
            let conflicting = self
                .sends
                .iter()
                .enumerate()
                .filter(|(_, send)| overlaps(&send.range, &recv.range))
                .filter(|(_, send)| send.after_recvs <= recv_index)
                .map(|(send_index, _)| send_index + 1)
                .max();
            recv.after_sends = recv.after_sends.max(conflicting.unwrap_or(0));
        }
    }

    /// Asserts the invariants in the module documentation that a single schedule
    /// can show: ranges inside the workspace, and every overlapping send and receive
    /// ordered one after the other. Steps wait only for earlier steps of the other
    /// kind, so there is no cycle.
    pub fn check_invariants(&self) {
        for send in &self.sends {
            assert!(
                send.range.end <= self.workspace_len,
                "send {:?} outside workspace",
                send.range
            );
            assert!(
                send.after_recvs <= self.recvs.len(),
                "send waits for a missing receive"
            );
        }
        for (recv_index, recv) in self.recvs.iter().enumerate() {
            assert!(
                recv.range.end <= self.workspace_len,
                "recv {:?} outside workspace",
                recv.range
            );
            assert!(
                recv.after_sends <= self.sends.len(),
                "recv waits for a missing send"
            );
            for (send_index, send) in self.sends.iter().enumerate() {
                if overlaps(&send.range, &recv.range) {
                    let send_first = recv.after_sends > send_index;
                    let recv_first = send.after_recvs > recv_index;
                    assert!(
                        send_first || recv_first,
                        "send {send_index} {:?} and recv {recv_index} {:?} may overlap in flight",
                        send.range,
                        recv.range
                    );
                }
            }
        }
        // A wait cycle would need a send waiting for a receive that waits for it or
        // a later send.
        for (recv_index, recv) in self.recvs.iter().enumerate() {
            if let Some(last_awaited) = recv.after_sends.checked_sub(1) {
                assert!(
                    self.sends[..=last_awaited]
                        .iter()
                        .all(|send| send.after_recvs <= recv_index),
                    "recv {recv_index} waits for a send that waits for it"
                );
            }
        }
    }

    /// Bytes this rank sends, for the bandwidth accounting of benches.
    pub fn bytes_sent(&self, elem_size: usize) -> usize {
        self.sends
            .iter()
            .map(|send| send.range.len() * elem_size)
            .sum()
    }
}

fn overlaps(a: &Range<usize>, b: &Range<usize>) -> bool {
    a.start < b.end && b.start < a.end
}

#[cfg(test)]
pub(crate) mod sim {
    //! A whole ring driven over in-memory queues, one step at a time, in an order
    //! chosen by a seeded generator: the simulation tier for the schedule.

    use std::collections::VecDeque;

    use rand::{Rng, SeedableRng};

    use super::{RecvAction, Schedule};
    use crate::collective::element::Element;

    /// Runs `schedules` (one per rank, workspaces prepared by the caller) to the
    /// end, picking among the ready steps at random. Panics on a deadlock.
    pub(crate) fn run<T: Element>(schedules: &[Schedule], workspaces: &mut [Vec<T>], seed: u64) {
        let world = schedules.len();
        let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
        // queues[r] holds what rank r sent to rank r+1 and r+1 has not received.
        let mut queues: Vec<VecDeque<Vec<T>>> = vec![VecDeque::new(); world];
        let mut sent = vec![0usize; world];
        let mut received = vec![0usize; world];
        loop {
            let mut ready = Vec::new();
            for rank in 0..world {
                let schedule = &schedules[rank];
                if let Some(send) = schedule.sends.get(sent[rank])
                    && received[rank] >= send.after_recvs
                {
                    ready.push((rank, true));
                }
                let prev = (rank + world - 1) % world;
                if let Some(recv) = schedule.recvs.get(received[rank])
                    && sent[rank] >= recv.after_sends
                    && !queues[prev].is_empty()
                {
                    ready.push((rank, false));
                }
            }
            if ready.is_empty() {
                break;
            }
            let (rank, is_send) = ready[rng.random_range(0..ready.len())];
            if is_send {
                let send = &schedules[rank].sends[sent[rank]];
                queues[rank].push_back(workspaces[rank][send.range.clone()].to_vec());
                sent[rank] += 1;
            } else {
                let prev = (rank + world - 1) % world;
                let recv = &schedules[rank].recvs[received[rank]];
                let payload = queues[prev].pop_front().expect("checked non-empty");
                assert_eq!(
                    payload.len(),
                    recv.range.len(),
                    "frame length differs at rank {rank}"
                );
                let target = &mut workspaces[rank][recv.range.clone()];
                match recv.action {
                    RecvAction::Copy => target.copy_from_slice(&payload),
                    RecvAction::Reduce => T::add_assign(target, &payload),
                }
                received[rank] += 1;
            }
        }
        for rank in 0..world {
            assert_eq!(
                sent[rank],
                schedules[rank].sends.len(),
                "rank {rank} stuck sending (seed {seed})"
            );
            assert_eq!(
                received[rank],
                schedules[rank].recvs.len(),
                "rank {rank} stuck receiving (seed {seed})"
            );
            assert!(
                queues[rank].is_empty(),
                "rank {rank} left frames unread (seed {seed})"
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;
    use crate::collective::element::Element;

    fn tiny_segments() -> Segmenting {
        Segmenting {
            max_segment_bytes: 12,
            min_segments: 2,
            min_segment_bytes: 4,
            lag_segments: 2,
        }
    }

    /// Runs an all-reduce of `inputs` (one vector per rank) through the simulator
    /// and returns each rank's result.
    fn simulate_all_reduce(
        inputs: &[Vec<f32>],
        small: usize,
        segmenting: &Segmenting,
        seed: u64,
    ) -> Vec<Vec<f32>> {
        let world = inputs.len() as u32;
        let len = inputs[0].len();
        let schedules: Vec<Schedule> = (0..world)
            .map(|rank| Schedule::all_reduce(rank, world, len, 4, small, segmenting))
            .collect();
        for schedule in &schedules {
            schedule.check_invariants();
        }
        let mut workspaces: Vec<Vec<f32>> = match schedules[0].algorithm {
            Algorithm::Ring => inputs.to_vec(),
            _ => (0..world as usize)
                .map(|rank| {
                    let mut workspace = vec![0.0; len * world as usize];
                    workspace[rank * len..(rank + 1) * len].copy_from_slice(&inputs[rank]);
                    workspace
                })
                .collect(),
        };
        sim::run(&schedules, &mut workspaces, seed);
        match schedules[0].algorithm {
            Algorithm::Ring => workspaces,
            _ => workspaces
                .iter()
                .map(|workspace| {
                    let mut sum = workspace[..len].to_vec();
                    for owner in 1..world as usize {
                        f32::add_assign(&mut sum, &workspace[owner * len..(owner + 1) * len]);
                    }
                    sum
                })
                .collect(),
        }
    }

    fn check_all_reduce(world: usize, len: usize, small: usize, seed: u64) {
        // Small integers add exactly in any order, so the plain sum is exact.
        let inputs: Vec<Vec<f32>> = (0..world)
            .map(|rank| {
                (0..len)
                    .map(|i| ((rank * 31 + i * 7) % 13) as f32)
                    .collect()
            })
            .collect();
        let expected: Vec<f32> = (0..len)
            .map(|i| inputs.iter().map(|input| input[i]).sum())
            .collect();
        let results = simulate_all_reduce(&inputs, small, &tiny_segments(), seed);
        for (rank, result) in results.iter().enumerate() {
            assert_eq!(result, &expected, "rank {rank}, world {world}, len {len}");
        }
    }

    #[test]
    fn ring_and_small_paths_sum_for_awkward_lengths() {
        for world in 1usize..=8 {
            for len in [0, 1, world.saturating_sub(1), world + 1, 3 * world + 2, 100] {
                check_all_reduce(world, len, 0, 7);
                check_all_reduce(world, len, usize::MAX, 7);
            }
        }
    }

    #[test]
    fn block_splits_evenly() {
        let blocks: Vec<_> = (0..3).map(|index| block(7, 3, index)).collect();
        assert_eq!(blocks, vec![0..3, 3..5, 5..7]);
        assert_eq!(block(0, 4, 3), 0..0);
    }

    #[test]
    fn segments_honour_the_limits() {
        let segmenting = Segmenting::default();
        let large = segmenting.split(0..(3 << 20) / 4 + 1, 4);
        assert_eq!(large.len(), 4);
        assert!(large.iter().all(|range| range.len() * 4 <= 1 << 20));
        assert_eq!(segmenting.split(0..(200 << 10) / 4, 4).len(), 2);
        assert_eq!(segmenting.split(0..10, 4), vec![0..10]);
        assert_eq!(segmenting.split(5..5, 4), vec![5..5]);
    }

    #[test]
    fn ring_sends_two_w_minus_one_over_w() {
        let segmenting = Segmenting::default();
        let schedule = Schedule::all_reduce(1, 4, 1 << 20, 4, 0, &segmenting);
        assert_eq!(schedule.algorithm, Algorithm::Ring);
        assert_eq!(schedule.bytes_sent(4), 2 * 3 * (1 << 20) * 4 / 4);
    }

    #[test]
    fn broadcast_and_all_gather_deliver() {
        for world in 1..=5u32 {
            for root in 0..world {
                let len = 11;
                let schedules: Vec<_> = (0..world)
                    .map(|rank| Schedule::broadcast(rank, world, root, len, 4, &tiny_segments()))
                    .collect();
                let mut workspaces: Vec<Vec<f32>> =
                    (0..world).map(|rank| vec![rank as f32; len]).collect();
                sim::run(&schedules, &mut workspaces, u64::from(root));
                assert!(workspaces.iter().all(|w| w == &vec![root as f32; len]));
            }
            let len = 5;
            let schedules: Vec<_> = (0..world)
                .map(|rank| Schedule::all_gather(rank, world, len, 4, &tiny_segments()))
                .collect();
            let mut workspaces: Vec<Vec<f32>> = (0..world as usize)
                .map(|rank| {
                    let mut workspace = vec![-1.0; len * world as usize];
                    workspace[rank * len..(rank + 1) * len].fill(rank as f32);
                    workspace
                })
                .collect();
            sim::run(&schedules, &mut workspaces, 3);
            let expected: Vec<f32> = (0..world as usize * len)
                .map(|i| (i / len) as f32)
                .collect();
            assert!(workspaces.iter().all(|w| w == &expected));
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

        #[test]
        fn ring_results_are_bit_identical_and_near_the_plain_sum(
            world in 1usize..=8,
            len in prop_oneof![Just(0usize), Just(1), 0usize..8, 0usize..3000],
            small in prop_oneof![Just(0usize), Just(usize::MAX)],
            seed in any::<u64>(),
        ) {
            let mut rng = <rand::rngs::StdRng as rand::SeedableRng>::seed_from_u64(seed);
            let inputs: Vec<Vec<f32>> = (0..world)
                .map(|_| (0..len).map(|_| rand::Rng::random_range(&mut rng, -1e3f32..1e3)).collect())
                .collect();
            let segmenting = Segmenting { max_segment_bytes: 256, min_segments: 2, min_segment_bytes: 64, lag_segments: 1 + (seed % 4) as usize };
            let results = simulate_all_reduce(&inputs, small, &segmenting, seed);
            for result in &results[1..] {
                let same_bits = result.iter().zip(&results[0]).all(|(a, b)| a.to_bits() == b.to_bits());
                prop_assert!(same_bits, "ranks disagree bitwise");
            }
            for (i, value) in results[0].iter().enumerate() {
                let plain: f64 = inputs.iter().map(|input| f64::from(input[i])).sum();
                prop_assert!((f64::from(*value) - plain).abs() <= 1e-2, "element {i}: {value} vs {plain}");
            }
        }

        #[test]
        fn every_schedule_orders_its_overlaps(
            world in 1u32..=9,
            len in 0usize..120,
            max_segment_bytes in 4usize..64,
        ) {
            let segmenting = Segmenting { max_segment_bytes, min_segments: 2, min_segment_bytes: 4, lag_segments: max_segment_bytes % 5 };
            for rank in 0..world {
                Schedule::all_reduce(rank, world, len, 4, 0, &segmenting).check_invariants();
                Schedule::all_reduce(rank, world, len, 4, usize::MAX, &segmenting).check_invariants();
                Schedule::all_gather(rank, world, len, 4, &segmenting).check_invariants();
                Schedule::broadcast(rank, world, world / 2, len, 4, &segmenting).check_invariants();
            }
        }
    }
}
