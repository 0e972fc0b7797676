//! The search benchmark suite: standard test functions in any dimension, each
//! instance shifted and (most) rotated, with an exactly known minimum.
//!
//! Every problem is searched on the box `[-5, 5]^d`, as in the COCO/BBOB suite, so
//! that a searcher cannot profit from an optimum at the centre or on a lattice of
//! the box. An instance draws its optimum `x_opt` uniformly in `[-4, 4]^d` and a
//! random rotation `Q` (the Q of the QR decomposition of a Gaussian matrix, with
//! the signs fixed so it is uniformly distributed), and evaluates the published
//! function at `z = z* + c·Q·(x − x_opt)`, where `z*` is the function's own
//! minimiser and `c` maps the box onto the function's usual domain. Every family
//! here attains its global minimum over all of `R^d` at `z*`, so the problem's
//! minimum is exactly the family's and is attained at `x_opt`, inside the box.
//! Instances draw from [`SplitMix64`] keyed by family, dimension and instance, so
//! a problem means the same thing across dependency upgrades.

use std::f64::consts::PI;

use nalgebra::DMatrix;
use xp_runtime::seeded::{SplitMix64, mix_seed};

/// The half-width of every problem's search box `[-5, 5]^d`.
pub const BOX_HALF_WIDTH: f64 = 5.0;

/// A family of standard test functions, defined in every dimension.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Family {
    /// `Σ 10^(6(i−1)/(d−1)) z_i²`: separable, condition number 10⁶ (not rotated).
    Ellipsoid,
    /// The same ellipsoid seen through a random rotation: ill-conditioned and not separable.
    RotatedEllipsoid,
    /// `Σ 100 (z_{i+1} − z_i²)² + (z_i − 1)²`: a long curved valley, rotated.
    Rosenbrock,
    /// `10d + Σ z_i² − 10 cos(2π z_i)` on `[-5.12, 5.12]^d`: a regular field of local
    /// minima, rotated.
    Rastrigin,
    /// Ackley (`a = 20`, `b = 0.2`, `c = 2π`) on `[-32.768, 32.768]^d`: a flat
    /// plateau with a narrow funnel, rotated.
    Ackley,
    /// Levy on `[-10, 10]^d`: multimodal with a minimum at all ones, rotated.
    Levy,
    /// Styblinski–Tang, `½ Σ z_i⁴ − 16 z_i² + 5 z_i` on `[-5, 5]^d`: separable and
    /// multimodal, its minimum in a corner basin (not rotated).
    StyblinskiTang,
    /// Griewank, `1 + Σ z_i²/4000 − Π cos(z_i/√i)` on `[-600, 600]^d`: a bowl
    /// covered in small ripples, rotated.
    Griewank,
}

/// Styblinski–Tang's minimiser in each coordinate, the root of `4z³ − 32z + 5 = 0`
/// near −2.9.
const STYBLINSKI_TANG_ARGMIN: f64 = -2.903_534_027_771_177_6;

impl Family {
    /// Every family, in the order the bench reports them.
    pub const ALL: [Self; 8] = [
        Self::Ellipsoid,
        Self::RotatedEllipsoid,
        Self::Rosenbrock,
        Self::Rastrigin,
        Self::Ackley,
        Self::Levy,
        Self::StyblinskiTang,
        Self::Griewank,
    ];

    /// A short name for tables.
    pub fn name(self) -> &'static str {
        match self {
            Self::Ellipsoid => "ellipsoid",
            Self::RotatedEllipsoid => "rot-ellipsoid",
            Self::Rosenbrock => "rosenbrock",
            Self::Rastrigin => "rastrigin",
            Self::Ackley => "ackley",
            Self::Levy => "levy",
            Self::StyblinskiTang => "styblinski-tang",
            Self::Griewank => "griewank",
        }
    }

    /// Whether instances are rotated; the separable families are only shifted.
    fn rotated(self) -> bool {
        !matches!(self, Self::Ellipsoid | Self::StyblinskiTang)
    }

    /// The half-width of the family's usual domain, onto which the box is scaled.
    fn domain_half_width(self) -> f64 {
        match self {
            Self::Ellipsoid | Self::RotatedEllipsoid | Self::Rosenbrock | Self::StyblinskiTang => {
                5.0
            }
            Self::Rastrigin => 5.12,
            Self::Ackley => 32.768,
            Self::Levy => 10.0,
            Self::Griewank => 600.0,
        }
    }

    /// The family's minimiser, the same in every coordinate.
    fn argmin_coordinate(self) -> f64 {
        match self {
            Self::Rosenbrock | Self::Levy => 1.0,
            Self::StyblinskiTang => STYBLINSKI_TANG_ARGMIN,
            _ => 0.0,
        }
    }

    /// The global minimum in `dim` dimensions.
    pub fn minimum(self, dim: usize) -> f64 {
        match self {
            Self::StyblinskiTang => dim as f64 * styblinski_tang(&[STYBLINSKI_TANG_ARGMIN]),
            _ => 0.0,
        }
    }

    /// The published function at `z`, in the family's own coordinates.
    pub fn eval(self, z: &[f64]) -> f64 {
        match self {
            Self::Ellipsoid | Self::RotatedEllipsoid => ellipsoid(z),
            Self::Rosenbrock => super::rosenbrock(z),
            Self::Rastrigin => rastrigin(z),
            Self::Ackley => super::ackley(z),
            Self::Levy => levy(z),
            Self::StyblinskiTang => styblinski_tang(z),
            Self::Griewank => griewank(z),
        }
    }
}

/// The separable ellipsoid with condition number 10⁶ (a single coordinate has weight 1).
pub fn ellipsoid(z: &[f64]) -> f64 {
    let last = z.len().saturating_sub(1).max(1) as f64;
    z.iter()
        .enumerate()
        .map(|(i, zi)| 10f64.powf(6.0 * i as f64 / last) * zi * zi)
        .sum()
}

/// Rastrigin: `10d + Σ z_i² − 10 cos(2π z_i)`.
pub fn rastrigin(z: &[f64]) -> f64 {
    z.iter()
        .map(|zi| zi * zi - 10.0 * (2.0 * PI * zi).cos() + 10.0)
        .sum()
}

/// Levy, with `w_i = 1 + (z_i − 1)/4`: `sin²(πw₁) + Σ_{i<d} (w_i − 1)²(1 + 10 sin²(πw_i + 1))
/// + (w_d − 1)²(1 + sin²(2πw_d))`.
pub fn levy(z: &[f64]) -> f64 {
    let w: Vec<f64> = z.iter().map(|zi| 1.0 + (zi - 1.0) / 4.0).collect();
    let Some((last, _)) = w.split_last() else {
        return 0.0;
    };
    let middle: f64 = w[..w.len() - 1]
        .iter()
        .map(|wi| (wi - 1.0).powi(2) * (1.0 + 10.0 * (PI * wi + 1.0).sin().powi(2)))
        .sum();
    (PI * w[0]).sin().powi(2)
        + middle
        + (last - 1.0).powi(2) * (1.0 + (2.0 * PI * last).sin().powi(2))
}

/// Styblinski–Tang: `½ Σ z_i⁴ − 16 z_i² + 5 z_i`.
pub fn styblinski_tang(z: &[f64]) -> f64 {
    0.5 * z
        .iter()
        .map(|zi| zi.powi(4) - 16.0 * zi * zi + 5.0 * zi)
        .sum::<f64>()
}

/// Griewank: `1 + Σ z_i²/4000 − Π cos(z_i/√i)` (i from 1).
pub fn griewank(z: &[f64]) -> f64 {
    let sum: f64 = z.iter().map(|zi| zi * zi).sum::<f64>() / 4000.0;
    let product: f64 = z
        .iter()
        .enumerate()
        .map(|(i, zi)| (zi / ((i + 1) as f64).sqrt()).cos())
        .product();
    1.0 + sum - product
}

/// One instance of a family in one dimension: a shifted, possibly rotated
/// function on `[-5, 5]^dim` with a known minimum.
#[derive(Debug, Clone)]
pub struct Problem {
    /// The family.
    pub family: Family,
    /// The number of coordinates.
    pub dim: usize,
    /// Which instance (it keys the shift and rotation).
    pub instance: u64,
    /// Where the minimum is attained, inside the box.
    pub x_opt: Vec<f64>,
    /// The rotation, row-major `dim × dim`; the identity for separable families.
    rotation: Vec<f64>,
}

impl Problem {
    /// Instance `instance` of `family` in `dim` (≥ 1) dimensions.
    pub fn new(family: Family, dim: usize, instance: u64) -> Self {
        assert!(dim > 0, "a problem has at least one coordinate");
        let family_index = Family::ALL
            .iter()
            .position(|other| *other == family)
            .unwrap_or(0) as u64;
        let mut rng = SplitMix64::new(mix_seed(
            mix_seed(mix_seed(0x7E57_F00D, family_index), dim as u64),
            instance,
        ));
        let x_opt = (0..dim)
            .map(|_| 8.0 * rng.next_f64() - 4.0)
            .collect::<Vec<f64>>();
        let rotation = if family.rotated() {
            random_rotation(dim, &mut rng)
        } else {
            let mut identity = vec![0.0; dim * dim];
            (0..dim).for_each(|i| identity[i * dim + i] = 1.0);
            identity
        };
        Self {
            family,
            dim,
            instance,
            x_opt,
            rotation,
        }
    }

    /// Every family in every dimension of `dims`, instances `0..instances` each.
    pub fn suite(dims: &[usize], instances: u64) -> Vec<Self> {
        dims.iter()
            .flat_map(|dim| {
                Family::ALL.iter().flat_map(move |family| {
                    (0..instances).map(move |instance| Self::new(*family, *dim, instance))
                })
            })
            .collect()
    }

    /// A name such as `rastrigin-5d-i1`.
    pub fn name(&self) -> String {
        format!("{}-{}d-i{}", self.family.name(), self.dim, self.instance)
    }

    /// The global minimum value, attained at `x_opt`.
    pub fn minimum(&self) -> f64 {
        self.family.minimum(self.dim)
    }

    /// The function at `x` (any point of `R^dim`; the search box is `[-5, 5]^dim`).
    pub fn eval(&self, x: &[f64]) -> f64 {
        assert_eq!(
            x.len(),
            self.dim,
            "{} takes {} coordinates",
            self.name(),
            self.dim
        );
        let scale = self.family.domain_half_width() / BOX_HALF_WIDTH;
        let offset = self.family.argmin_coordinate();
        let z: Vec<f64> = self
            .rotation
            .chunks_exact(self.dim)
            .map(|row| {
                let turned: f64 = row
                    .iter()
                    .zip(x.iter().zip(&self.x_opt))
                    .map(|(q, (xi, oi))| q * (xi - oi))
                    .sum();
                offset + scale * turned
            })
            .collect();
        self.family.eval(&z)
    }
}

/// A uniformly distributed rotation (row-major): the Q factor of a Gaussian
/// matrix, each column's sign fixed by the sign of R's diagonal (Mezzadri 2007).
fn random_rotation(dim: usize, rng: &mut SplitMix64) -> Vec<f64> {
    let gaussian = DMatrix::from_fn(dim, dim, |_, _| rng.normal());
    let qr = gaussian.qr();
    let (mut q, r) = (qr.q(), qr.r());
    for column in 0..dim {
        if r[(column, column)] < 0.0 {
            q.column_mut(column).neg_mut();
        }
    }
    (0..dim)
        .flat_map(|row| (0..dim).map(move |column| (row, column)))
        .map(|(row, column)| q[(row, column)])
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use xp_runtime::seeded::SplitMix64;

    #[test]
    fn every_instance_attains_its_minimum_at_x_opt_inside_the_box() {
        for problem in Problem::suite(&[1, 2, 5, 10, 20], 3) {
            let at_opt = problem.eval(&problem.x_opt);
            assert!(
                (at_opt - problem.minimum()).abs() < 1e-9 * (1.0 + problem.minimum().abs()),
                "{}: {at_opt} at x_opt, minimum {}",
                problem.name(),
                problem.minimum()
            );
            assert!(problem.x_opt.iter().all(|x| x.abs() <= 4.0));
        }
    }

    #[test]
    fn no_sampled_point_beats_the_minimum() {
        let mut rng = SplitMix64::new(5);
        for problem in Problem::suite(&[2, 5, 10], 2) {
            for _ in 0..2_000 {
                // Half the samples near the optimum, where a wrong minimum would show.
                let point: Vec<f64> = problem
                    .x_opt
                    .iter()
                    .map(|centre| {
                        if rng.next_f64() < 0.5 {
                            centre + 0.05 * rng.normal()
                        } else {
                            10.0 * rng.next_f64() - 5.0
                        }
                    })
                    .collect();
                let value = problem.eval(&point);
                assert!(
                    value >= problem.minimum() - 1e-9,
                    "{} at {point:?}: {value}",
                    problem.name()
                );
            }
        }
    }

    #[test]
    fn rotations_are_orthogonal_and_instances_differ() {
        let problem = Problem::new(Family::Rastrigin, 5, 1);
        let q = &problem.rotation;
        for a in 0..5 {
            for b in 0..5 {
                let dot: f64 = (0..5).map(|k| q[a * 5 + k] * q[b * 5 + k]).sum();
                let expected = if a == b { 1.0 } else { 0.0 };
                assert!((dot - expected).abs() < 1e-12, "rows {a}, {b}: {dot}");
            }
        }
        let other = Problem::new(Family::Rastrigin, 5, 2);
        assert_ne!(problem.x_opt, other.x_opt);
        assert_ne!(problem.rotation, other.rotation);
        let again = Problem::new(Family::Rastrigin, 5, 1);
        assert_eq!(problem.x_opt, again.x_opt);
        assert_eq!(problem.rotation, again.rotation);
    }

    #[test]
    fn spot_values_match_the_published_definitions() {
        assert_eq!(rastrigin(&[0.0, 0.0]), 0.0);
        assert!((rastrigin(&[1.0, 0.5]) - 21.25).abs() < 1e-12);
        assert!(levy(&[1.0; 4]).abs() < 1e-15);
        // Levy at the origin in one dimension: w = 3/4.
        let w: f64 = 0.75;
        let expected =
            (PI * w).sin().powi(2) + (w - 1.0).powi(2) * (1.0 + (2.0 * PI * w).sin().powi(2));
        assert!((levy(&[0.0]) - expected).abs() < 1e-12);
        assert!((styblinski_tang(&[STYBLINSKI_TANG_ARGMIN]) + 39.166_165_703_771_42).abs() < 1e-9);
        assert!(griewank(&[0.0; 3]).abs() < 1e-15);
        assert!((griewank(&[PI]) - (2.0 + PI * PI / 4000.0)).abs() < 1e-12);
        assert_eq!(ellipsoid(&[1.0, 1.0]), 1.0 + 1e6);
        assert_eq!(ellipsoid(&[2.0]), 4.0);
    }
}
