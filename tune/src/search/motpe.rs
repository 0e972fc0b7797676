//! Multi-objective TPE (MOTPE, Ozaki et al. 2020, as Optuna implements it).
//!
//! Every objective is minimised. The "good" set holds the best `min(ceil(0.1·n), 25)`
//! observations by non-domination rank; within the rank that does not fit whole, the
//! points are chosen greedily by hypervolume contribution (Optuna's HSSP solver),
//! against a reference point 1.1× beyond that rank's worst values. Good observations
//! weigh by their hypervolume contribution to the good set (the ones that shape the
//! front count most); the rest weigh by age as in single-objective TPE. The model is
//! the multivariate one of [`super::TpeSearcher`] (product kernels, grouped where
//! parameters are conditional), and pending suggestions join the rest (constant
//! liar), so parallel asks spread out.

use std::collections::BTreeMap;

use rand::SeedableRng;
use rand::rngs::StdRng;
use xp_runtime::seeded::mix_seed;
use xp_runtime::spec::{Config, SearchSpace};

use super::pareto::{
    MAX_OBJECTIVES, ParetoError, hypervolume, hypervolume_contributions, non_dominated_sort,
    pareto_front,
};
use super::tpe_joint::JointModel;
use super::{Searcher, Suggestion, TpeOptions};

/// The smallest weight of a good observation, so none drops out of l(x).
const MIN_WEIGHT: f64 = 1e-12;

/// One evaluated configuration with its objectives.
#[derive(Debug, Clone, PartialEq)]
pub struct MultiObservation {
    /// What was evaluated.
    pub config: Config,
    /// Its objective values, to minimise, one per objective.
    pub objectives: Vec<f64>,
}

/// Multi-objective TPE over a [`SearchSpace`]; never runs out.
#[derive(Debug, Clone)]
pub struct MotpeSearcher {
    space: SearchSpace,
    options: TpeOptions,
    objectives: usize,
    rng: StdRng,
    next_id: u64,
    pending: BTreeMap<u64, Config>,
    observed: Vec<MultiObservation>,
}

/// A reference point just beyond the worst of `points` in every objective
/// (Optuna's `max(1.1·worst, 0.9·worst)`, nudged off zero).
fn reference_beyond(points: &[Vec<f64>], objectives: usize) -> Vec<f64> {
    (0..objectives)
        .map(|axis| {
            let worst = points
                .iter()
                .map(|point| point[axis])
                .fold(f64::NEG_INFINITY, f64::max);
            let reference = (1.1 * worst).max(0.9 * worst);
            if reference == 0.0 { 1e-12 } else { reference }
        })
        .collect()
}

/// Up to `count` of `candidates` (indices into `points`) chosen greedily, each
/// adding the most hypervolume to those already chosen.
fn greedy_hypervolume(points: &[Vec<f64>], candidates: &[usize], count: usize) -> Vec<usize> {
    let front: Vec<Vec<f64>> = candidates.iter().map(|idx| points[*idx].clone()).collect();
    let reference = reference_beyond(&front, points[0].len());
    let mut chosen: Vec<usize> = Vec::with_capacity(count);
    let mut chosen_points: Vec<Vec<f64>> = Vec::with_capacity(count);
    let mut left: Vec<usize> = candidates.to_vec();
    while chosen.len() < count && !left.is_empty() {
        let base = hypervolume(&chosen_points, &reference).unwrap_or(0.0);
        let (best_pos, _) = left
            .iter()
            .enumerate()
            .map(|(pos, idx)| {
                chosen_points.push(points[*idx].clone());
                let gain = hypervolume(&chosen_points, &reference).unwrap_or(base) - base;
                chosen_points.pop();
                (pos, gain)
            })
            // The first of equal gains, so the choice is deterministic.
            .fold((0, f64::NEG_INFINITY), |best, next| {
                if next.1 > best.1 { next } else { best }
            });
        let idx = left.remove(best_pos);
        chosen_points.push(points[idx].clone());
        chosen.push(idx);
    }
    chosen
}

impl MotpeSearcher {
    /// A MOTPE searcher over `space` for `objectives` objectives (1 to
    /// [`MAX_OBJECTIVES`]); `seed` fixes its random start and its draws.
    pub fn new(
        space: SearchSpace,
        seed: u64,
        objectives: usize,
        options: TpeOptions,
    ) -> Result<Self, ParetoError> {
        if objectives == 0 || objectives > MAX_OBJECTIVES {
            return Err(ParetoError::Objectives(objectives));
        }
        Ok(Self {
            space,
            options,
            objectives,
            rng: StdRng::seed_from_u64(mix_seed(seed, 5)),
            next_id: 0,
            pending: BTreeMap::new(),
            observed: Vec::new(),
        })
    }

    /// The next configuration to evaluate.
    pub fn ask(&mut self) -> Suggestion {
        let config = if self.observed.len() < self.options.n_initial.max(1) {
            self.fresh_prior()
        } else {
            self.ask_model()
        };
        let id = self.next_id;
        self.next_id += 1;
        self.pending.insert(id, config.clone());
        Suggestion { id, config }
    }

    /// The objective values of suggestion `id`. Ignored when `id` is not pending;
    /// a wrong number of values or a non-finite one counts as a failure.
    pub fn tell(&mut self, id: u64, objectives: &[f64]) {
        if let Some(config) = self.pending.remove(&id)
            && objectives.len() == self.objectives
            && objectives.iter().all(|value| value.is_finite())
        {
            self.observed.push(MultiObservation {
                config,
                objectives: objectives.to_vec(),
            });
        }
    }

    /// Suggestion `id` failed or was abandoned: it yields no observation.
    pub fn forget(&mut self, id: u64) {
        self.pending.remove(&id);
    }

    /// The observations so far, in telling order.
    pub fn observed(&self) -> &[MultiObservation] {
        &self.observed
    }

    /// The non-dominated observations so far, in telling order.
    pub fn front(&self) -> Vec<&MultiObservation> {
        let points: Vec<Vec<f64>> = self.observed.iter().map(|o| o.objectives.clone()).collect();
        pareto_front(&points)
            .into_iter()
            .map(|idx| &self.observed[idx])
            .collect()
    }

    fn is_known(&self, config: &Config) -> bool {
        self.pending.values().any(|pending| pending == config)
            || self.observed.iter().any(|o| &o.config == config)
    }

    /// A prior draw, redrawn a few times while it is already known.
    fn fresh_prior(&mut self) -> Config {
        let first = self.space.sample(&mut self.rng);
        let mut config = first.clone();
        for _ in 0..64 {
            if !self.is_known(&config) {
                return config;
            }
            config = self.space.sample(&mut self.rng);
        }
        first
    }

    /// The good observations (indices, in telling order) and their weights.
    fn split(&self) -> (Vec<usize>, Vec<f64>) {
        let points: Vec<Vec<f64>> = self.observed.iter().map(|o| o.objectives.clone()).collect();
        let n = points.len();
        let n_below = ((self.options.gamma * n as f64).ceil() as usize)
            .clamp(1, 25)
            .min(n);
        let mut below: Vec<usize> = Vec::with_capacity(n_below);
        for front in non_dominated_sort(&points) {
            let room = n_below - below.len();
            if room == 0 {
                break;
            }
            if front.len() <= room {
                below.extend(front);
            } else {
                below.extend(greedy_hypervolume(&points, &front, room));
            }
        }
        below.sort_unstable();
        let good: Vec<Vec<f64>> = below.iter().map(|idx| points[*idx].clone()).collect();
        let reference = reference_beyond(&good, self.objectives);
        let contributions =
            hypervolume_contributions(&good, &reference).unwrap_or_else(|_| vec![1.0; good.len()]);
        let largest = contributions.iter().copied().fold(0.0, f64::max);
        let weights = contributions
            .iter()
            .map(|contribution| {
                if largest > 0.0 {
                    (contribution / largest).max(MIN_WEIGHT)
                } else {
                    1.0
                }
            })
            .collect();
        (below, weights)
    }

    fn ask_model(&mut self) -> Config {
        let (below_idx, below_weights) = self.split();
        let below: Vec<Vec<Option<f64>>> = below_idx
            .iter()
            .map(|idx| self.space.encode(&self.observed[*idx].config))
            .collect();
        let above: Vec<Vec<Option<f64>>> = (0..self.observed.len())
            .filter(|idx| below_idx.binary_search(idx).is_err())
            .map(|idx| &self.observed[idx].config)
            .chain(self.pending.values())
            .map(|config| self.space.encode(config))
            .collect();
        let model = JointModel::fit(
            &self.space,
            &below,
            Some(&below_weights),
            &above,
            self.options.prior_weight,
        );
        let mut best: Option<(f64, Config)> = None;
        for _ in 0..self.options.n_candidates.max(1) {
            let point = model.draw(&self.space, &mut self.rng);
            let score = model.score(&self.space, &point);
            let units: Vec<f64> = point.iter().map(|unit| unit.unwrap_or(0.5)).collect();
            let config = self.space.decode(&units);
            if !self.is_known(&config) && best.as_ref().is_none_or(|(top, _)| score > *top) {
                best = Some((score, config));
            }
        }
        match best {
            Some((_, config)) => config,
            None => self.fresh_prior(),
        }
    }
}

/// The ask/tell interface the head's sweeps drive: `tell` of one value is a
/// single objective, [`Searcher::tell_objectives`] the usual multi-objective tell.
impl Searcher for MotpeSearcher {
    fn ask(&mut self) -> Option<Suggestion> {
        Some(Self::ask(self))
    }

    fn tell(&mut self, id: u64, objective: f64) {
        Self::tell(self, id, &[objective]);
    }

    fn forget(&mut self, id: u64) {
        Self::forget(self, id);
    }

    fn tell_objectives(&mut self, id: u64, objectives: &[f64]) {
        Self::tell(self, id, objectives);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use xp_runtime::spec::ParamValue;

    fn real(config: &Config, name: &str) -> f64 {
        match config.get(name) {
            Some(ParamValue::Float(value)) => *value,
            other => panic!("{name} is {other:?}"),
        }
    }

    /// ZDT1 in three dimensions: the front is x1 = x2 = 0, f2 = 1 − √f1.
    fn zdt1(x: &[f64]) -> Vec<f64> {
        let f1 = x[0];
        let g = 1.0 + 9.0 * x[1..].iter().sum::<f64>() / (x.len() - 1) as f64;
        vec![f1, g * (1.0 - (f1 / g).sqrt())]
    }

    fn front_volume(searcher: &MotpeSearcher) -> f64 {
        let front: Vec<Vec<f64>> = searcher
            .front()
            .iter()
            .map(|o| o.objectives.clone())
            .collect();
        hypervolume(&front, &[1.1, 11.0]).unwrap()
    }

    #[test]
    fn motpe_finds_a_better_front_than_its_random_start() {
        let space = SearchSpace::builder()
            .uniform("x0", 0.0, 1.0)
            .uniform("x1", 0.0, 1.0)
            .uniform("x2", 0.0, 1.0)
            .build()
            .unwrap();
        let run = |seed: u64, trials: usize, model: bool| -> f64 {
            let options = TpeOptions {
                n_initial: if model { 10 } else { trials },
                ..TpeOptions::default()
            };
            let mut searcher = MotpeSearcher::new(space.clone(), seed, 2, options).unwrap();
            for _ in 0..trials {
                let suggestion = searcher.ask();
                let x: Vec<f64> = (0..3)
                    .map(|axis| real(&suggestion.config, &format!("x{axis}")))
                    .collect();
                searcher.tell(suggestion.id, &zdt1(&x));
            }
            let front = searcher.front();
            // The front is mutually non-dominated.
            for left in &front {
                for right in &front {
                    assert!(!super::super::pareto::dominates(
                        &left.objectives,
                        &right.objectives
                    ));
                }
            }
            front_volume(&searcher)
        };
        let mut wins = 0;
        for seed in 0..5 {
            if run(seed, 60, true) > run(seed, 60, false) {
                wins += 1;
            }
        }
        assert!(
            wins >= 4,
            "MOTPE beat random search on only {wins} of 5 seeds"
        );
    }

    #[test]
    fn parallel_asks_are_distinct_and_bad_tells_are_failures() {
        let space = SearchSpace::builder()
            .int("k", 0, 3)
            .choice("c", ["a", "b"])
            .build()
            .unwrap();
        let mut searcher = MotpeSearcher::new(space, 1, 2, TpeOptions::default()).unwrap();
        let batch: Vec<Suggestion> = (0..8).map(|_| searcher.ask()).collect();
        for (idx, left) in batch.iter().enumerate() {
            for right in &batch[idx + 1..] {
                assert_ne!(left.config, right.config);
            }
        }
        searcher.tell(batch[0].id, &[1.0]);
        searcher.tell(batch[1].id, &[f64::NAN, 1.0]);
        searcher.tell(batch[2].id, &[1.0, 2.0]);
        searcher.tell(batch[2].id, &[0.0, 0.0]);
        assert_eq!(searcher.observed().len(), 1);
        assert_eq!(searcher.observed()[0].objectives, vec![1.0, 2.0]);
        let space = SearchSpace::builder()
            .uniform("x", 0.0, 1.0)
            .build()
            .unwrap();
        assert_eq!(
            MotpeSearcher::new(space, 0, 5, TpeOptions::default()).err(),
            Some(ParetoError::Objectives(5))
        );
    }

    #[test]
    fn the_good_set_fills_by_rank_then_by_hypervolume() {
        let points = vec![
            vec![0.0, 4.0],
            vec![1.0, 1.0],
            vec![4.0, 0.0],
            vec![2.0, 2.0],
        ];
        // From the first front, (1, 1) adds the most under the reference (4.4, 4.4).
        assert_eq!(greedy_hypervolume(&points, &[0, 1, 2], 1), vec![1]);
    }
}
