//! Quasi-random search: Owen-scrambled Sobol points decoded into configurations.
//!
//! `sobol_burley` gives up to 2^16 points in up to 256 dimensions per seed. Beyond
//! either limit this module switches to an independently scrambled sequence (a seed
//! derived from the block of 2^16 points or of 256 dimensions), which keeps every
//! point uniform but stratifies only within a block.

use xp_runtime::seeded::mix_seed;
use xp_runtime::spec::SearchSpace;

use super::{Searcher, Suggestion};

const POINTS_PER_BLOCK: u64 = 1 << 16;

/// The point of a scrambled Sobol sequence at `index`, in `[0, 1)^dims`.
pub(crate) fn sobol_point(index: u64, dims: usize, seed: u64) -> Vec<f64> {
    let block = index / POINTS_PER_BLOCK;
    let within = (index % POINTS_PER_BLOCK) as u32;
    let dims_per_set = sobol_burley::NUM_DIMENSIONS as usize;
    (0..dims)
        .map(|dimension| {
            let set = (dimension / dims_per_set) as u64;
            let stream_seed = mix_seed(seed, (block << 16) ^ set);
            let short_seed = (stream_seed ^ (stream_seed >> 32)) as u32;
            f64::from(sobol_burley::sample(
                within,
                (dimension % dims_per_set) as u32,
                short_seed,
            ))
        })
        .collect()
}

/// Scrambled Sobol points over a [`SearchSpace`], one coordinate per parameter;
/// never runs out.
#[derive(Debug, Clone)]
pub struct SobolSearcher {
    space: SearchSpace,
    seed: u64,
    index: u64,
}

impl SobolSearcher {
    /// A Sobol searcher over `space` whose scramble is fixed by `seed`.
    pub fn new(space: SearchSpace, seed: u64) -> Self {
        Self {
            space,
            seed,
            index: 0,
        }
    }
}

impl Searcher for SobolSearcher {
    fn ask(&mut self) -> Option<Suggestion> {
        let id = self.index;
        let point = sobol_point(self.index, self.space.len(), self.seed);
        self.index += 1;
        Some(Suggestion {
            id,
            config: self.space.decode(&point),
        })
    }

    fn tell(&mut self, _id: u64, _objective: f64) {}

    fn forget(&mut self, _id: u64) {}
}
