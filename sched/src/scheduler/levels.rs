//! The attained-service level edges, fixed or following the workload.
//!
//! Under `levels: adaptive` the edges are quantiles of the service (GPU-ms)
//! that the last [`WINDOW`] completed trials received, so they carry no unit of
//! time: scale every duration of a workload by `s` and, once the window has
//! filled, the edges scale by `s` too and every trial keeps its level.
//! Until [`MIN_HISTORY`] trials have completed, the configured
//! `thresholds_gpu_hours` stand in as the prior. From then on each edge lives
//! on a geometric grid of [`STEPS_PER_DOUBLING`] steps per doubling (about
//! 19 % a step): the first estimate jumps to the grid point nearest its
//! quantile, and afterwards an edge moves by at most one step per completed
//! trial, and only once its quantile has reached the next grid point (or the
//! one below), so levels do not thrash with the noise of a few completions and
//! re-levelling the waiting trials stays rare.
//!
//! Invariant: the edges are strictly increasing. The state is only the window
//! and the grid points, in completion order, so a restarted head that hands the
//! core its completed trials' service oldest first
//! ([`super::PolicyCore::add_completed_service`]) gets the same edges back.
//! Nothing here places or orders trials; `service` asks for the edges.

use std::collections::VecDeque;

use crate::PolicyConfig;
use crate::config::{LevelSource, Order};

/// How many recent completions the quantiles are taken over.
pub(super) const WINDOW: usize = 256;
/// How many completions it takes before the quantiles replace the prior.
pub(super) const MIN_HISTORY: usize = 16;
/// Grid points per doubling of an edge.
pub(super) const STEPS_PER_DOUBLING: u32 = 4;
/// The most the policy's workload durations are scaled by, either way.
pub(super) const MAX_FACTOR: u128 = 1000;
/// `2^(r / 4)` for `r` in 0..4, in ten-thousandths.
const STEP_MANTISSA: [u128; STEPS_PER_DOUBLING as usize] = [10_000, 11_892, 14_142, 16_818];

/// The level edges in force and what they follow.
#[derive(Debug, Clone, PartialEq)]
pub(super) struct ServiceLevels {
    /// The edges in GPU-milliseconds; empty without `attained_service` or
    /// under `order: fifo` (every trial at level 0).
    edges: Vec<u64>,
    /// The configured edges, used until there is history (and always when
    /// fixed).
    prior: Vec<u64>,
    /// The quantile each edge follows; empty when the edges are fixed.
    quantiles: Vec<f64>,
    /// The grid point of each edge, once the history has replaced the prior.
    grid: Option<Vec<u32>>,
    /// The service of the last completed trials, oldest first.
    window: VecDeque<u64>,
    /// The same values in ascending order, kept as the window moves, so that
    /// a completion reads its quantiles instead of sorting the window again.
    sorted: Vec<u64>,
}

impl ServiceLevels {
    /// The levels of a policy, with no history yet.
    pub(super) fn new(config: &PolicyConfig) -> Self {
        let mut levels = Self {
            edges: Vec::new(),
            prior: Vec::new(),
            quantiles: Vec::new(),
            grid: None,
            window: VecDeque::with_capacity(WINDOW),
            sorted: Vec::with_capacity(WINDOW),
        };
        levels.reconfigure(config);
        levels
    }

    /// Takes a new policy's edges, keeping the history: adaptive edges with
    /// enough history go straight to their quantiles.
    pub(super) fn reconfigure(&mut self, config: &PolicyConfig) {
        let las = config
            .attained_service
            .as_ref()
            .filter(|_| config.order != Order::Fifo);
        self.prior = las.map_or_else(Vec::new, |las| las.thresholds_gpu_ms());
        self.quantiles = match las {
            Some(las) if las.levels == LevelSource::Adaptive => las.edge_quantiles(),
            _ => Vec::new(),
        };
        self.grid = None;
        self.edges.clone_from(&self.prior);
        self.follow_history();
    }

    /// The edges in force, in GPU-milliseconds.
    pub(super) fn edges(&self) -> &[u64] {
        &self.edges
    }

    /// Scales a duration written for the prior's workload to the workload the
    /// edges follow: times the first edge over the prior's first edge, that
    /// factor kept within 1/[`MAX_FACTOR`] to [`MAX_FACTOR`]. As written while
    /// the prior holds, with fixed edges, or without edges.
    pub(super) fn scaled(&self, ms: u64) -> u64 {
        let (Some(_), Some(&edge), Some(&prior)) =
            (&self.grid, self.edges.first(), self.prior.first())
        else {
            return ms;
        };
        let prior = u128::from(prior.max(1));
        let edge = u128::from(edge).clamp(prior.div_ceil(MAX_FACTOR), prior * MAX_FACTOR);
        u64::try_from(u128::from(ms) * edge / prior).unwrap_or(u64::MAX)
    }

    /// [`Self::scaled`], but never shorter than written: for the waits after
    /// which the policy gives up on skip-ahead or on sparing a victim's work
    /// (`reserve_after`, `delay_per_gpu`, the day after which any loss is
    /// accepted). The first edge measures how long trials run, not how long
    /// they wait: under overload the waits are set by the backlog, so shorter
    /// trials do not mean shorter waits, and a shortened wait threshold is
    /// reached by most trials (gangs hold room, victims lose their work). A
    /// lengthened one costs little where waits are short, since it is never
    /// reached.
    pub(super) fn lengthened(&self, ms: u64) -> u64 {
        self.scaled(ms).max(ms)
    }

    /// A trial completed having received `gpu_ms` of service; true when the
    /// edges changed (waiting trials' levels must follow).
    pub(super) fn note_completed(&mut self, gpu_ms: u64) -> bool {
        if self.window.len() == WINDOW
            && let Some(oldest) = self.window.pop_front()
        {
            let at = self.sorted.partition_point(|value| *value < oldest);
            self.sorted.remove(at);
        }
        self.window.push_back(gpu_ms);
        let at = self.sorted.partition_point(|value| *value <= gpu_ms);
        self.sorted.insert(at, gpu_ms);
        self.follow_history()
    }

    /// Moves adaptive edges toward the window's quantiles; true when they
    /// changed.
    fn follow_history(&mut self) -> bool {
        if self.quantiles.is_empty() || self.window.len() < MIN_HISTORY {
            return false;
        }
        let targets = quantiles_of(&self.sorted, &self.quantiles);
        let mut grid: Vec<u32> = match &self.grid {
            // The prior was a guess: the first estimate replaces it outright.
            None => targets
                .iter()
                .map(|target| nearest_point(*target))
                .collect(),
            Some(grid) => grid
                .iter()
                .zip(&targets)
                .map(|(point, target)| step_toward(*point, *target))
                .collect(),
        };
        for index in 1..grid.len() {
            grid[index] = grid[index].max(grid[index - 1] + 1);
        }
        let edges: Vec<u64> = grid.iter().map(|point| grid_value(*point)).collect();
        self.grid = Some(grid);
        let changed = edges != self.edges;
        self.edges = edges;
        changed
    }
}

/// The nearest-rank quantiles of `sorted` (ascending, not empty), one per
/// entry of `quantiles`.
fn quantiles_of(sorted: &[u64], quantiles: &[f64]) -> Vec<u64> {
    quantiles
        .iter()
        .map(|quantile| {
            let rank = (quantile * sorted.len() as f64).ceil() as usize;
            sorted[rank.clamp(1, sorted.len()) - 1]
        })
        .collect()
}

/// The value of grid point `point`: `2^(point / 4)` GPU-milliseconds, rounded
/// down, computed in integers so every platform agrees.
pub(super) fn grid_value(point: u32) -> u64 {
    let doublings = (point / STEPS_PER_DOUBLING).min(120);
    let mantissa = STEP_MANTISSA[(point % STEPS_PER_DOUBLING) as usize];
    let value = (1_u128 << doublings).saturating_mul(mantissa) / 10_000;
    u64::try_from(value).unwrap_or(u64::MAX)
}

/// The grid point nearest `value` (by ratio).
fn nearest_point(value: u64) -> u32 {
    let below = last_point_at_or_below(value);
    let (low, high) = (grid_value(below), grid_value(below + 1));
    // Nearer by ratio: value² against low × high.
    if u128::from(value) * u128::from(value) >= u128::from(low) * u128::from(high) {
        below + 1
    } else {
        below
    }
}

/// The last grid point whose value is at most `value` (0 for values under 2).
fn last_point_at_or_below(value: u64) -> u32 {
    let mut point = (63 - value.max(1).leading_zeros()) * STEPS_PER_DOUBLING;
    while grid_value(point + 1) <= value {
        point += 1;
    }
    point
}

/// One grid step from `point` toward `target`, once the target has reached
/// the next point up or down; else `point`.
fn step_toward(point: u32, target: u64) -> u32 {
    if target >= grid_value(point + 1) {
        point + 1
    } else if point > 0 && target <= grid_value(point - 1) {
        point - 1
    } else {
        point
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const HOUR: u64 = 3_600_000;

    fn levels(yaml: &str) -> ServiceLevels {
        ServiceLevels::new(&PolicyConfig::from_yaml(yaml).unwrap())
    }

    #[test]
    fn the_grid_doubles_every_four_points_and_finds_nearest_points() {
        assert_eq!(grid_value(0), 1);
        assert_eq!(grid_value(4), 2);
        assert_eq!(grid_value(40), 1024);
        assert_eq!(grid_value(42), 1448);
        for value in [1, 2, 3, 1000, HOUR, 7 * HOUR, u64::MAX / 4] {
            let point = nearest_point(value);
            let ratio = grid_value(point) as f64 / value as f64;
            assert!((0.9..1.1).contains(&ratio), "{value}: {ratio}");
        }
    }

    #[test]
    fn the_prior_holds_until_there_is_history_then_quantiles_rule() {
        let mut levels = levels("attained_service: {thresholds_gpu_hours: [2, 32]}\n");
        assert_eq!(levels.edges(), [2 * HOUR, 32 * HOUR]);
        // Completions of 1..=16 minutes of one GPU: median 8, 75th 12.
        for minute in 1..MIN_HISTORY as u64 {
            assert!(!levels.note_completed(minute * 60_000));
        }
        assert!(levels.note_completed(16 * 60_000));
        for (edge, minutes) in levels.edges().iter().zip([8.0, 12.0]) {
            let ratio = *edge as f64 / (minutes * 60_000.0);
            assert!((0.9..1.1).contains(&ratio), "{edge} for {minutes} min");
        }
    }

    #[test]
    fn edges_scale_with_the_workload_and_move_one_step_per_completion() {
        let history: Vec<u64> = (0..300_u64).map(|n| (n * 7919) % 1000 + 1).collect();
        let mut edges_at_scale = Vec::new();
        for scale in [1, 10, 1000] {
            let mut levels = levels("attained_service: {}\n");
            for service in &history {
                levels.note_completed(service * scale * 60_000);
            }
            edges_at_scale.push(levels.edges().to_vec());
        }
        for (edges, scale) in edges_at_scale.iter().zip([1.0, 10.0, 1000.0]) {
            for (edge, base) in edges.iter().zip(&edges_at_scale[0]) {
                let ratio = *edge as f64 / (*base as f64 * scale);
                assert!((0.8..1.25).contains(&ratio), "scale {scale}: {ratio}");
            }
        }
        // A sudden change of workload moves each edge one step at a time.
        let mut levels = levels("attained_service: {}\n");
        for service in &history {
            levels.note_completed(service * 60_000);
        }
        let before = levels.grid.clone().unwrap();
        levels.note_completed(1000 * HOUR);
        let after = levels.grid.clone().unwrap();
        for (old, new) in before.iter().zip(&after) {
            assert!(new.abs_diff(*old) <= 1);
        }
    }

    #[test]
    fn wait_thresholds_lengthen_with_longer_trials_and_never_shorten() {
        for (minutes, scaled_down) in [(6, true), (1200, false)] {
            let mut levels = levels("attained_service: {thresholds_gpu_hours: [2, 32]}\n");
            for _ in 0..MIN_HISTORY {
                levels.note_completed(minutes * 60_000);
            }
            let scaled = levels.scaled(48 * HOUR);
            assert_eq!(scaled < 48 * HOUR, scaled_down, "{minutes} min: {scaled}");
            assert_eq!(levels.lengthened(48 * HOUR), scaled.max(48 * HOUR));
        }
    }

    #[test]
    fn fixed_edges_and_fifo_ignore_history() {
        for yaml in [
            "attained_service: {thresholds_gpu_hours: [1], levels: fixed}\n",
            "attained_service: {thresholds_gpu_hours: [1]}\norder: fifo\n",
        ] {
            let mut levels = levels(yaml);
            for _ in 0..100 {
                assert!(!levels.note_completed(60_000));
            }
            let expected: &[u64] = if yaml.contains("fifo") { &[] } else { &[HOUR] };
            assert_eq!(levels.edges(), expected, "{yaml}");
        }
    }

    #[test]
    fn edges_stay_strictly_increasing_when_quantiles_coincide() {
        let mut levels = levels("attained_service: {thresholds_gpu_hours: [1, 2, 3]}\n");
        for _ in 0..50 {
            levels.note_completed(HOUR);
        }
        let edges = levels.edges();
        assert!(edges.windows(2).all(|pair| pair[0] < pair[1]), "{edges:?}");
    }

    proptest::proptest! {
        /// The kept order is the window's values sorted, however they come
        /// and however many the window has dropped.
        #[test]
        fn the_sorted_copy_is_the_window_sorted(
            services in proptest::collection::vec(0_u64..50, 0..(3 * WINDOW)),
        ) {
            let mut levels = levels("attained_service: {thresholds_gpu_hours: [1, 2]}\n");
            for service in services {
                levels.note_completed(service);
                let mut expected: Vec<u64> = levels.window.iter().copied().collect();
                expected.sort_unstable();
                proptest::prop_assert_eq!(&levels.sorted, &expected);
            }
        }
    }
}
