//! How long a node waits between attempts to reach the head.
//!
//! Sans-io: [`Backoff`] hands out delays and is told when a session took hold;
//! the node's core (`node_core`) sets its timer by them and the agent does the
//! sleeping. The ceiling doubles from [`FIRST_BACKOFF`] up to
//! [`NODE_RECONNECT_MAX_BACKOFF`], and each delay is drawn in the upper half of
//! the ceiling from a generator seeded by the node's id, so that nodes that lost
//! the head together do not knock in step, and a run is reproducible per node.
//!
//! Not here: when to wait (`node_core`'s session). A session that registered
//! and then broke is followed by an immediate attempt (the head may be back
//! already); only failed attempts, and sessions the head ended before
//! registering the node, wait.
//!
//! Invariant: every delay is at least half of [`FIRST_BACKOFF`] and at most
//! [`NODE_RECONNECT_MAX_BACKOFF`], which `runtime::transport::NODE_RETURN_BOUND`
//! (what a restarted head waits for its nodes) counts on.

use std::time::Duration;

use xp_runtime::ids::NodeId;
use xp_runtime::seeded::{SplitMix64, mix_seed};
pub(crate) use xp_runtime::transport::NODE_RECONNECT_MAX_BACKOFF;

/// The ceiling of the first wait after a session took hold.
pub(crate) const FIRST_BACKOFF: Duration = Duration::from_millis(200);

/// Delays between connection attempts.
#[derive(Debug, Clone)]
pub(crate) struct Backoff {
    ceiling: Duration,
    rng: SplitMix64,
}

impl Backoff {
    /// Delays for node `node_id`, starting from [`FIRST_BACKOFF`].
    pub(crate) fn new(node_id: NodeId) -> Self {
        let (high, low) = node_id.0.as_u64_pair();
        Self {
            ceiling: FIRST_BACKOFF,
            rng: SplitMix64::new(mix_seed(high, low)),
        }
    }

    /// The wait before the next attempt; later waits are longer, up to the bound.
    pub(crate) fn next_delay(&mut self) -> Duration {
        let ceiling = self.ceiling.min(NODE_RECONNECT_MAX_BACKOFF);
        self.ceiling = (ceiling * 2).min(NODE_RECONNECT_MAX_BACKOFF);
        let half = ceiling / 2;
        half + half.mul_f64(self.rng.next_f64())
    }

    /// A session took hold: the next wait starts from the first again.
    pub(crate) fn reset(&mut self) {
        self.ceiling = FIRST_BACKOFF;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(seed: u8) -> NodeId {
        NodeId(uuid::Uuid::from_bytes([seed; 16]))
    }

    /// The first `count` delays of node `seed`'s back-off, in milliseconds.
    fn delays_ms(seed: u8, count: usize) -> Vec<u128> {
        let mut backoff = Backoff::new(node(seed));
        (0..count)
            .map(|_| backoff.next_delay().as_millis())
            .collect()
    }

    #[test]
    fn delays_double_within_their_upper_half_and_stay_under_the_bound() {
        let ceilings = [200, 400, 800, 1600, 2000, 2000, 2000];
        for seed in 0..50 {
            let delays = delays_ms(seed, ceilings.len());
            for (delay, ceiling) in delays.iter().zip(ceilings) {
                assert!(
                    (ceiling / 2..=ceiling).contains(delay),
                    "seed {seed}: {delays:?}"
                );
            }
        }
    }

    #[test]
    fn a_reset_starts_over_and_nodes_do_not_wait_in_step() {
        let mut backoff = Backoff::new(node(1));
        for _ in 0..10 {
            backoff.next_delay();
        }
        backoff.reset();
        assert!(backoff.next_delay() <= FIRST_BACKOFF);
        assert_ne!(delays_ms(1, 5), delays_ms(2, 5));
        assert_eq!(delays_ms(3, 5), delays_ms(3, 5), "reproducible per node");
    }
}
