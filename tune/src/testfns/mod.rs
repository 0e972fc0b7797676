//! Benchmark objectives with known optima, for measuring search and early stopping.
//!
//! Four fixed standard functions (Branin, Hartmann-6, Rosenbrock-5, Ackley-10) and
//! the [`suite`] of shifted and rotated functions in any dimension judge the search
//! algorithms by simple regret, and a synthetic learning-curve family stands
//! in for training runs when judging early-stopping rules. Everything is a pure
//! function of its arguments: the curves draw their hidden parameters and noise from
//! a fixed integer hash of the seeds (not from `rand`, whose streams may change
//! between versions), so recorded bench numbers stay reproducible. Nothing here
//! runs in a cluster; the benches and tests use it.

use std::f64::consts::{E, PI};

use xp_runtime::seeded::{splitmix64, unit_f64};

pub mod suite;

pub use suite::{Family, Problem};

/// An objective to minimise on a box, with its known global minimum, so that a
/// search can be scored by simple regret (best value found minus `minimum`).
#[derive(Debug, Clone)]
pub struct TestFunction {
    /// A short name for tables, such as `branin`.
    pub name: &'static str,
    /// The search box: one `(low, high)` per coordinate, both included.
    pub bounds: Vec<(f64, f64)>,
    /// The global minimum value on the box.
    pub minimum: f64,
    /// Points where the minimum is attained (one per known minimiser), for tests.
    pub minimizers: Vec<Vec<f64>>,
    /// The objective; takes exactly `bounds.len()` coordinates.
    pub f: fn(&[f64]) -> f64,
}

impl TestFunction {
    /// How many coordinates the function takes.
    pub fn dim(&self) -> usize {
        self.bounds.len()
    }

    /// Evaluates the function at `x`.
    pub fn eval(&self, x: &[f64]) -> f64 {
        assert_eq!(
            x.len(),
            self.dim(),
            "{} takes {} coordinates",
            self.name,
            self.dim()
        );
        (self.f)(x)
    }

    /// Branin–Hoo on `[-5, 10] × [0, 15]`: three global minima of `5 / (4π)`.
    pub fn branin() -> Self {
        Self {
            name: "branin",
            bounds: vec![(-5.0, 10.0), (0.0, 15.0)],
            minimum: 5.0 / (4.0 * PI),
            minimizers: vec![vec![-PI, 12.275], vec![PI, 2.275], vec![3.0 * PI, 2.475]],
            f: branin,
        }
    }

    /// Hartmann-6 on `[0, 1]^6`: one global minimum near -3.32237 among several local ones.
    pub fn hartmann6() -> Self {
        Self {
            name: "hartmann6",
            bounds: vec![(0.0, 1.0); 6],
            minimum: HARTMANN6_MINIMUM,
            minimizers: vec![vec![
                0.20168952, 0.15001069, 0.47687398, 0.27533243, 0.31165162, 0.65730054,
            ]],
            f: hartmann6,
        }
    }

    /// Rosenbrock in 5 dimensions on `[-5, 10]^5` (the box of the Simon Fraser
    /// library and BoTorch, so results compare with published ones); minimum 0 at
    /// all ones, at the bottom of a long curved valley. Values reach about 1e6 at
    /// the corners, so regrets are reported on that scale.
    pub fn rosenbrock5() -> Self {
        Self {
            name: "rosenbrock5",
            bounds: vec![(-5.0, 10.0); 5],
            minimum: 0.0,
            minimizers: vec![vec![1.0; 5]],
            f: rosenbrock,
        }
    }

    /// Ackley in 10 dimensions on `[-32.768, 32.768]^10`: minimum 0 at the origin,
    /// surrounded by a regular field of local minima.
    pub fn ackley10() -> Self {
        Self {
            name: "ackley10",
            bounds: vec![(-32.768, 32.768); 10],
            minimum: 0.0,
            minimizers: vec![vec![0.0; 10]],
            f: ackley,
        }
    }

    /// All four functions, in the order the search-quality bench reports them.
    pub fn all() -> Vec<Self> {
        vec![
            Self::branin(),
            Self::hartmann6(),
            Self::rosenbrock5(),
            Self::ackley10(),
        ]
    }
}

/// The Hartmann-6 minimum to double precision (Surjanovic & Bingham quote -3.32237).
const HARTMANN6_MINIMUM: f64 = -3.322_368_011_415_51;

/// Branin–Hoo with the usual constants `a = 1`, `b = 5.1 / (4π²)`, `c = 5/π`,
/// `r = 6`, `s = 10`, `t = 1/(8π)`; takes two coordinates.
pub fn branin(x: &[f64]) -> f64 {
    assert_eq!(x.len(), 2, "branin takes 2 coordinates");
    let (x1, x2) = (x[0], x[1]);
    let b = 5.1 / (4.0 * PI * PI);
    let c = 5.0 / PI;
    let t = 1.0 / (8.0 * PI);
    (x2 - b * x1 * x1 + c * x1 - 6.0).powi(2) + 10.0 * (1.0 - t) * x1.cos() + 10.0
}

/// Hartmann-6 with the standard `alpha`, `A` and `P` constants; takes six coordinates.
pub fn hartmann6(x: &[f64]) -> f64 {
    const ALPHA: [f64; 4] = [1.0, 1.2, 3.0, 3.2];
    const A: [[f64; 6]; 4] = [
        [10.0, 3.0, 17.0, 3.5, 1.7, 8.0],
        [0.05, 10.0, 17.0, 0.1, 8.0, 14.0],
        [3.0, 3.5, 1.7, 10.0, 17.0, 8.0],
        [17.0, 8.0, 0.05, 10.0, 0.1, 14.0],
    ];
    const P: [[f64; 6]; 4] = [
        [0.1312, 0.1696, 0.5569, 0.0124, 0.8283, 0.5886],
        [0.2329, 0.4135, 0.8307, 0.3736, 0.1004, 0.9991],
        [0.2348, 0.1451, 0.3522, 0.2883, 0.3047, 0.6650],
        [0.4047, 0.8828, 0.8732, 0.5743, 0.1091, 0.0381],
    ];
    assert_eq!(x.len(), 6, "hartmann6 takes 6 coordinates");
    -(0..4)
        .map(|i| {
            let exponent: f64 = (0..6).map(|j| A[i][j] * (x[j] - P[i][j]).powi(2)).sum();
            ALPHA[i] * (-exponent).exp()
        })
        .sum::<f64>()
}

/// Rosenbrock in any dimension: `sum of 100 (x[i+1] - x[i]²)² + (x[i] - 1)²`.
pub fn rosenbrock(x: &[f64]) -> f64 {
    x.windows(2)
        .map(|pair| 100.0 * (pair[1] - pair[0] * pair[0]).powi(2) + (pair[0] - 1.0).powi(2))
        .sum()
}

/// Ackley in any (non-zero) dimension with `a = 20`, `b = 0.2`, `c = 2π`.
pub fn ackley(x: &[f64]) -> f64 {
    let n = x.len() as f64;
    let squares = x.iter().map(|xi| xi * xi).sum::<f64>() / n;
    let cosines = x.iter().map(|xi| (2.0 * PI * xi).cos()).sum::<f64>() / n;
    -20.0 * (-0.2 * squares.sqrt()).exp() - cosines.exp() + 20.0 + E
}

/// One configuration's synthetic training curve: a loss that falls as a power law
/// from `initial` towards `asymptote`, observed with Gaussian noise.
///
/// `mean(step) = asymptote + (initial - asymptote) * (1 + step)^(-rate)`.
/// The asymptote comes from a hidden quality drawn per configuration, and the rate
/// is drawn independently of it, so some good configurations start slowly and look
/// worse than mediocre ones for many steps: the trap early stopping must survive.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LearningCurve {
    /// The seed that determined the parameters; it also keys the noise.
    pub config_seed: u64,
    /// The loss at step 0, uniform in `[1.0, 1.5)`, unrelated to quality.
    pub initial: f64,
    /// The loss the curve tends to, `0.05 + 0.45 * quality` with quality uniform in `[0, 1)`.
    pub asymptote: f64,
    /// The power-law exponent, log-uniform in `[0.25, 2)`: 0.25 is a slow starter.
    pub rate: f64,
    /// The standard deviation of the observation noise at every step.
    pub noise_std: f64,
}

impl LearningCurve {
    /// The curve of configuration `config_seed`.
    pub fn from_config_seed(config_seed: u64) -> Self {
        let quality = unit_f64(mix(&[config_seed, 1]));
        let rate_draw = unit_f64(mix(&[config_seed, 2]));
        let initial_draw = unit_f64(mix(&[config_seed, 3]));
        Self {
            config_seed,
            initial: 1.0 + 0.5 * initial_draw,
            asymptote: 0.05 + 0.45 * quality,
            rate: 0.25 * 8.0_f64.powf(rate_draw),
            noise_std: 0.01,
        }
    }

    /// The noise-free loss at `step`.
    pub fn mean(&self, step: u64) -> f64 {
        self.asymptote + (self.initial - self.asymptote) * (1.0 + step as f64).powf(-self.rate)
    }

    /// The loss observed at `step` in the run with noise stream `noise_seed`.
    pub fn observe(&self, step: u64, noise_seed: u64) -> f64 {
        self.mean(step) + self.noise_std * gaussian(&[self.config_seed, step, noise_seed])
    }
}

/// The observed loss of configuration `config_seed` at `step` in noise stream
/// `noise_seed`; see [`LearningCurve`] for the family.
pub fn learning_curve(config_seed: u64, step: u64, noise_seed: u64) -> f64 {
    LearningCurve::from_config_seed(config_seed).observe(step, noise_seed)
}

/// Hashes a tuple of integers to 64 well-mixed bits.
fn mix(parts: &[u64]) -> u64 {
    parts
        .iter()
        .fold(0x5851_F42D_4C95_7F2D, |hash, part| splitmix64(hash ^ part))
}

/// A standard normal draw keyed by `parts` (Box–Muller).
fn gaussian(parts: &[u64]) -> f64 {
    let first = mix(parts);
    let radius_draw = 1.0 - unit_f64(first);
    let angle_draw = unit_f64(splitmix64(first));
    (-2.0 * radius_draw.ln()).sqrt() * (2.0 * PI * angle_draw).cos()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check_minimum(function: &TestFunction, tolerance: f64) {
        assert!(!function.minimizers.is_empty());
        for point in &function.minimizers {
            let value = function.eval(point);
            assert!(
                (value - function.minimum).abs() <= tolerance,
                "{} at {point:?} is {value}, not {}",
                function.name,
                function.minimum
            );
            for (coordinate, (low, high)) in point.iter().zip(&function.bounds) {
                assert!((low..=high).contains(&coordinate));
            }
        }
    }

    #[test]
    fn known_minimisers_attain_the_minimum() {
        check_minimum(&TestFunction::branin(), 1e-5);
        check_minimum(&TestFunction::hartmann6(), 1e-7);
        check_minimum(&TestFunction::rosenbrock5(), 0.0);
        check_minimum(&TestFunction::ackley10(), 1e-12);
        assert!((TestFunction::branin().minimum - 0.397887).abs() < 1e-6);
        assert!((TestFunction::hartmann6().minimum + 3.32237).abs() < 1e-5);
    }

    #[test]
    fn spot_values_match_the_definitions() {
        // Branin at the origin: (−6)² + 10 (1 − 1/(8π)) + 10.
        let expected = 36.0 + 10.0 * (1.0 - 1.0 / (8.0 * PI)) + 10.0;
        assert!((branin(&[0.0, 0.0]) - expected).abs() < 1e-12);
        assert_eq!(rosenbrock(&[0.0, 0.0, 0.0]), 2.0);
        assert_eq!(rosenbrock(&[2.0, 4.0]), 1.0);
        assert!((ackley(&[1.0]) - (20.0 - 20.0 * (-0.2_f64).exp() + E - E)).abs() < 1e-12);
    }

    #[test]
    fn no_sampled_point_beats_the_stated_minimum() {
        for function in TestFunction::all() {
            for sample in 0..20_000_u64 {
                let point: Vec<f64> = function
                    .bounds
                    .iter()
                    .enumerate()
                    .map(|(axis, (low, high))| {
                        low + (high - low) * unit_f64(mix(&[sample, axis as u64, 77]))
                    })
                    .collect();
                let value = function.eval(&point);
                assert!(
                    value >= function.minimum - 1e-9,
                    "{} at {point:?}",
                    function.name
                );
            }
        }
    }

    #[test]
    fn learning_curves_are_deterministic_and_fall() {
        assert_eq!(learning_curve(7, 3, 1), learning_curve(7, 3, 1));
        assert_ne!(learning_curve(7, 3, 1), learning_curve(7, 3, 2));
        assert_ne!(learning_curve(7, 3, 1), learning_curve(8, 3, 1));
        for config_seed in 0..200 {
            let curve = LearningCurve::from_config_seed(config_seed);
            assert!((1.0..1.5).contains(&curve.initial));
            assert!((0.05..0.5).contains(&curve.asymptote));
            assert!((0.25..2.0).contains(&curve.rate));
            assert!((curve.mean(0) - curve.initial).abs() < 1e-12);
            for step in 0..100 {
                assert!(curve.mean(step + 1) < curve.mean(step));
                assert!(curve.mean(step) > curve.asymptote);
            }
        }
    }

    #[test]
    fn learning_curve_noise_is_standard_normal_scaled() {
        let curve = LearningCurve::from_config_seed(11);
        let residuals: Vec<f64> = (0..20_000)
            .map(|noise_seed| (curve.observe(5, noise_seed) - curve.mean(5)) / curve.noise_std)
            .collect();
        let mean = residuals.iter().sum::<f64>() / residuals.len() as f64;
        let variance = residuals.iter().map(|r| (r - mean).powi(2)).sum::<f64>()
            / (residuals.len() - 1) as f64;
        assert!(mean.abs() < 0.03, "mean {mean}");
        assert!((variance - 1.0).abs() < 0.05, "variance {variance}");
    }

    #[test]
    fn some_good_configurations_start_slowly() {
        // Among 200 configurations, some in the best quarter at the end are in the
        // worst half at step 1: the family really contains slow starters.
        let curves: Vec<LearningCurve> = (0..200).map(LearningCurve::from_config_seed).collect();
        let rank = |step: u64, index: usize| {
            curves
                .iter()
                .filter(|other| other.mean(step) < curves[index].mean(step))
                .count()
        };
        let slow_good = (0..curves.len())
            .filter(|&index| rank(81, index) < 50 && rank(1, index) >= 100)
            .count();
        assert!(slow_good > 0);
    }
}
