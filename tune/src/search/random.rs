//! Random search: each configuration drawn independently from the parameters' priors.
//!
//! It draws exactly as [`super::plan_trials`] does for `algorithm: random`, so the
//! first N suggestions of a seed are that plan's N configurations.

use rand::SeedableRng;
use rand::rngs::StdRng;

use xp_runtime::spec::SearchSpace;

use super::{Searcher, Suggestion};

/// Independent draws from a [`SearchSpace`]; never runs out.
#[derive(Debug, Clone)]
pub struct RandomSearcher {
    space: SearchSpace,
    rng: StdRng,
    next_id: u64,
}

impl RandomSearcher {
    /// A random searcher over `space` whose draws are fixed by `seed`.
    pub fn new(space: SearchSpace, seed: u64) -> Self {
        Self {
            space,
            rng: StdRng::seed_from_u64(seed),
            next_id: 0,
        }
    }
}

impl Searcher for RandomSearcher {
    fn ask(&mut self) -> Option<Suggestion> {
        let id = self.next_id;
        self.next_id += 1;
        Some(Suggestion {
            id,
            config: self.space.sample(&mut self.rng),
        })
    }

    fn tell(&mut self, _id: u64, _objective: f64) {}

    fn forget(&mut self, _id: u64) {}
}
