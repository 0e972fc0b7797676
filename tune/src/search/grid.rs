//! Grid search: every combination of the discrete parameters, then nothing.
//!
//! The order is [`SearchSpace::grid`]'s (the first parameter varies slowest). A
//! real-valued parameter has no grid; this searcher draws it at random for each
//! point, seeded, as Ray Tune does. Spec validation refuses such grids in YAML.

use rand::SeedableRng;
use rand::rngs::StdRng;

use xp_runtime::spec::{Config, SearchSpace};

use super::{Searcher, Suggestion};

/// A finite searcher over a grid; `ask` returns `None` once every point is handed out.
#[derive(Debug, Clone)]
pub struct GridSearcher {
    points: std::vec::IntoIter<Config>,
    next_id: u64,
}

impl GridSearcher {
    /// The grid of `space`, built up front (check [`SearchSpace::grid_len`] first
    /// for spaces that may be huge); `seed` fixes the draws of any real-valued parameter.
    pub fn new(space: &SearchSpace, seed: u64) -> Self {
        let mut rng = StdRng::seed_from_u64(seed);
        let points: Vec<Config> = space
            .discrete_grid()
            .into_iter()
            .map(|mut point| {
                for (param_idx, param) in space.params().iter().enumerate() {
                    if param.is_continuous() && space.is_active(param_idx, &point) {
                        point.insert(param.name().to_owned(), param.sample(&mut rng));
                    }
                }
                point
            })
            .collect();
        Self {
            points: points.into_iter(),
            next_id: 0,
        }
    }

    /// How many points are left to hand out.
    pub fn remaining(&self) -> usize {
        self.points.len()
    }
}

impl Searcher for GridSearcher {
    fn ask(&mut self) -> Option<Suggestion> {
        let config = self.points.next()?;
        let id = self.next_id;
        self.next_id += 1;
        Some(Suggestion { id, config })
    }

    fn tell(&mut self, _id: u64, _objective: f64) {}

    fn forget(&mut self, _id: u64) {}
}
