//! Gaussian-process regression for [`super::GpSearcher`].
//!
//! A Matérn 5/2 kernel with one length scale per parameter (ARD; a parameter may
//! own several features, such as the one-hot block of a choice), a signal variance
//! and a noise variance. The hyperparameters are fitted on log scale by maximising
//! the log marginal likelihood plus weak Gaussian priors, with a bounded L-BFGS
//! written here over nalgebra's Cholesky, from several starts. Inputs are expected
//! in the unit cube and outputs standardised. No randomness is drawn here: the
//! caller passes the starting points.

use std::collections::VecDeque;

use nalgebra::{Cholesky, DMatrix, DVector, Dyn};

const SQRT5: f64 = 2.236_067_977_499_79;
/// Added to the diagonal on top of the noise, so that duplicated inputs stay factorisable.
const JITTER: f64 = 1e-8;
const LOG_2PI: f64 = 1.837_877_066_409_345_5;

/// Bounds of the log hyperparameters: length scales, signal variance, noise variance.
const LOG_LENGTH_BOUNDS: (f64, f64) = (-4.605_170_185_988_091, 4.605_170_185_988_091);
const LOG_SIGNAL_BOUNDS: (f64, f64) = (-4.605_170_185_988_091, 4.605_170_185_988_091);
const LOG_NOISE_BOUNDS: (f64, f64) = (-13.815_510_557_964_274, 0.0);

/// Training inputs: `n` rows of `width` features, row-major, each feature owned by
/// one of `groups` length scales.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Layout<'a> {
    pub(crate) width: usize,
    pub(crate) owners: &'a [usize],
    pub(crate) groups: usize,
}

impl Layout<'_> {
    /// The number of log hyperparameters: a length scale per group, signal, noise.
    pub(crate) fn n_theta(&self) -> usize {
        self.groups + 2
    }

    /// The centre of the priors: length scales near half the cube's diagonal
    /// (`0.5·√groups`, so smoother functions in more dimensions), unit signal on
    /// standardised outputs, little noise.
    pub(crate) fn prior_mean(&self) -> Vec<f64> {
        let log_length = (0.5 * (self.groups.max(1) as f64).sqrt()).ln();
        let mut theta = vec![log_length; self.groups];
        theta.push(0.0);
        theta.push(-6.9);
        theta
    }

    fn prior_sd(&self) -> Vec<f64> {
        let mut sd = vec![1.5; self.groups];
        sd.push(1.0);
        sd.push(3.0);
        sd
    }

    fn bounds(&self) -> (Vec<f64>, Vec<f64>) {
        let mut lower = vec![LOG_LENGTH_BOUNDS.0; self.groups];
        let mut upper = vec![LOG_LENGTH_BOUNDS.1; self.groups];
        lower.extend([LOG_SIGNAL_BOUNDS.0, LOG_NOISE_BOUNDS.0]);
        upper.extend([LOG_SIGNAL_BOUNDS.1, LOG_NOISE_BOUNDS.1]);
        (lower, upper)
    }

    /// A start for the optimiser: the prior mean moved by `normals` (standard normal
    /// draws, one per hyperparameter) times half the prior's spread.
    pub(crate) fn start_from(&self, normals: &[f64]) -> Vec<f64> {
        let (lower, upper) = self.bounds();
        self.prior_mean()
            .iter()
            .zip(self.prior_sd())
            .zip(normals)
            .enumerate()
            .map(|(idx, ((mean, sd), normal))| {
                (mean + 0.5 * sd * normal).clamp(lower[idx], upper[idx])
            })
            .collect()
    }

    /// One over each feature's length scale.
    fn inverse_lengths(&self, theta: &[f64]) -> Vec<f64> {
        self.owners
            .iter()
            .map(|owner| (-theta[*owner]).exp())
            .collect()
    }
}

/// The Matérn 5/2 correlation and `(5/3)(1 + √5 r) e^{-√5 r}` (the factor of its
/// derivative with respect to a log length scale), at squared scaled distance `s`.
fn matern(s: f64) -> (f64, f64) {
    let r = s.sqrt();
    let decay = (-SQRT5 * r).exp();
    (
        (1.0 + SQRT5 * r + 5.0 / 3.0 * s) * decay,
        5.0 / 3.0 * (1.0 + SQRT5 * r) * decay,
    )
}

fn scaled_sq_dist(a: &[f64], b: &[f64], inverse_lengths: &[f64]) -> f64 {
    a.iter()
        .zip(b)
        .zip(inverse_lengths)
        .map(|((x, z), inverse)| {
            let d = (x - z) * inverse;
            d * d
        })
        .sum()
}

/// The covariance matrix of the inputs with noise and jitter on the diagonal.
fn covariance(x: &[f64], layout: Layout<'_>, theta: &[f64]) -> DMatrix<f64> {
    let n = x.len() / layout.width.max(1);
    let inverse_lengths = layout.inverse_lengths(theta);
    let signal = theta[layout.groups].exp();
    let noise = theta[layout.groups + 1].exp();
    let mut k = DMatrix::<f64>::zeros(n, n);
    for a in 0..n {
        let row_a = &x[a * layout.width..(a + 1) * layout.width];
        k[(a, a)] = signal + noise + JITTER;
        for b in 0..a {
            let row_b = &x[b * layout.width..(b + 1) * layout.width];
            let value = signal * matern(scaled_sq_dist(row_a, row_b, &inverse_lengths)).0;
            k[(a, b)] = value;
            k[(b, a)] = value;
        }
    }
    k
}

/// The negative log marginal likelihood plus negative log prior of `theta`, and
/// its gradient; `None` when the covariance is not positive definite.
fn objective(
    x: &[f64],
    y: &DVector<f64>,
    layout: Layout<'_>,
    theta: &[f64],
) -> Option<(f64, Vec<f64>)> {
    let n = y.len();
    let width = layout.width;
    let chol = Cholesky::new(covariance(x, layout, theta))?;
    let alpha = chol.solve(y);
    let l = chol.l_dirty();
    let log_det_half: f64 = (0..n).map(|idx| l[(idx, idx)].ln()).sum();
    let lml = -0.5 * y.dot(&alpha) - log_det_half - 0.5 * n as f64 * LOG_2PI;
    // K⁻¹ = L⁻ᵀL⁻¹: a triangular inverse and one blocked product cost less here
    // than nalgebra's `Cholesky::inverse`, two column-by-column solves.
    let l_inv = lower_inverse(&chol);
    let k_inv = l_inv.tr_mul(&l_inv);
    let k_inv = k_inv.as_slice();
    let inverse_lengths = layout.inverse_lengths(theta);
    let signal = theta[layout.groups].exp();
    let noise = theta[layout.groups + 1].exp();

    // d lml / d theta_i = tr(W dK/dtheta_i) / 2 with W = alpha alpha^T - K^-1.
    let mut grad = vec![0.0; layout.n_theta()];
    let mut trace_w = 0.0;
    let mut per_feature = vec![0.0; width];
    for a in 0..n {
        let row_a = &x[a * width..(a + 1) * width];
        trace_w += alpha[a] * alpha[a] - k_inv[a * n + a];
        for b in 0..a {
            let row_b = &x[b * width..(b + 1) * width];
            let w = alpha[a] * alpha[b] - k_inv[b * n + a];
            let mut s = 0.0;
            for feature in 0..width {
                let d = (row_a[feature] - row_b[feature]) * inverse_lengths[feature];
                per_feature[feature] = d * d;
                s += d * d;
            }
            let (correlation, slope) = matern(s);
            // Off-diagonal pairs appear twice in the trace, cancelling the half.
            grad[layout.groups] += w * signal * correlation;
            let weight = w * signal * slope;
            for feature in 0..width {
                grad[layout.owners[feature]] += weight * per_feature[feature];
            }
        }
    }
    grad[layout.groups] += 0.5 * trace_w * signal;
    grad[layout.groups + 1] += 0.5 * trace_w * noise;

    let mean = layout.prior_mean();
    let sd = layout.prior_sd();
    let mut log_prior = 0.0;
    for idx in 0..theta.len() {
        let z = (theta[idx] - mean[idx]) / sd[idx];
        log_prior -= 0.5 * z * z;
        grad[idx] -= z / sd[idx];
    }
    let value = -(lml + log_prior);
    if !value.is_finite() {
        return None;
    }
    Some((value, grad.into_iter().map(|g| -g).collect()))
}

/// The log hyperparameters maximising the (penalised) marginal likelihood of `y` at
/// `x`, best of the runs from `starts`; `None` when no start could be evaluated.
pub(crate) fn fit(
    x: &[f64],
    y: &[f64],
    layout: Layout<'_>,
    starts: &[Vec<f64>],
    max_iterations: usize,
) -> Option<Vec<f64>> {
    let y = DVector::from_column_slice(y);
    let (lower, upper) = layout.bounds();
    starts
        .iter()
        .filter_map(|start| {
            minimise(
                |theta| objective(x, &y, layout, theta),
                start.clone(),
                &lower,
                &upper,
                max_iterations,
            )
        })
        .min_by(|(_, left), (_, right)| left.total_cmp(right))
        .map(|(theta, _)| theta)
}

fn dot(a: &[f64], b: &[f64]) -> f64 {
    a.iter().zip(b).map(|(x, z)| x * z).sum()
}

/// Bounded L-BFGS (memory 6) with Armijo backtracking on the projected step.
/// Directions that push into an active bound are cut there; a direction that is
/// not a descent one restarts from the steepest descent.
pub(crate) fn minimise(
    f: impl Fn(&[f64]) -> Option<(f64, Vec<f64>)>,
    start: Vec<f64>,
    lower: &[f64],
    upper: &[f64],
    max_iterations: usize,
) -> Option<(Vec<f64>, f64)> {
    const MEMORY: usize = 6;
    let bounds = Bounds { lower, upper };
    let mut x = start;
    bounds.project(&mut x);
    let (mut fx, mut g) = f(&x)?;
    let mut memory: VecDeque<Curvature> = VecDeque::with_capacity(MEMORY);
    for _ in 0..max_iterations {
        // 1. A descent direction inside the bounds, or stop.
        let mut direction: Vec<f64> = lbfgs_step(&memory, &g).iter().map(|value| -value).collect();
        bounds.mask(&x, &mut direction);
        let mut slope = dot(&g, &direction);
        if slope >= -1e-12 {
            memory.clear();
            direction = g.iter().map(|value| -value).collect();
            bounds.mask(&x, &mut direction);
            slope = dot(&g, &direction);
            if slope >= -1e-12 {
                break;
            }
        }
        // 2. A step along it that decreases enough, or stop.
        let step = if memory.is_empty() {
            (1.0 / dot(&direction, &direction).sqrt()).min(1.0)
        } else {
            1.0
        };
        let Some(accepted) = backtrack(&f, &bounds, &x, fx, &g, &direction, step) else {
            break;
        };
        // 3. The curvature it showed, remembered when positive.
        let yv: Vec<f64> = accepted
            .gradient
            .iter()
            .zip(&g)
            .map(|(new, old)| new - old)
            .collect();
        let sy = dot(&accepted.moved, &yv);
        if sy > 1e-10 {
            if memory.len() == MEMORY {
                memory.pop_front();
            }
            memory.push_back((accepted.moved, yv, 1.0 / sy));
        }
        // 4. Moved; stop once the gain or the projected gradient is negligible.
        let improvement = fx - accepted.value;
        x = accepted.point;
        fx = accepted.value;
        g = accepted.gradient;
        let projected_gradient: f64 = (0..x.len())
            .map(|idx| {
                let moved = (x[idx] - g[idx]).clamp(lower[idx], upper[idx]) - x[idx];
                moved * moved
            })
            .sum();
        if improvement <= 1e-7 * (1.0 + fx.abs()) || projected_gradient < 1e-10 {
            break;
        }
    }
    Some((x, fx))
}

/// One remembered step of L-BFGS: the move `s`, the gradient's change `y`, and
/// `1 / (s . y)`.
type Curvature = (Vec<f64>, Vec<f64>, f64);

/// The box [`minimise`] searches in.
struct Bounds<'a> {
    lower: &'a [f64],
    upper: &'a [f64],
}

impl Bounds<'_> {
    /// Clamps `x` into the box.
    fn project(&self, x: &mut [f64]) {
        for ((value, lower), upper) in x.iter_mut().zip(self.lower).zip(self.upper) {
            *value = value.clamp(*lower, *upper);
        }
    }

    /// Zeroes the parts of `direction` that push `x` further into an active bound.
    fn mask(&self, x: &[f64], direction: &mut [f64]) {
        for idx in 0..x.len() {
            if (x[idx] <= self.lower[idx] && direction[idx] < 0.0)
                || (x[idx] >= self.upper[idx] && direction[idx] > 0.0)
            {
                direction[idx] = 0.0;
            }
        }
    }
}

/// The L-BFGS two-loop recursion: `memory`'s inverse-Hessian estimate times `g`.
fn lbfgs_step(memory: &VecDeque<Curvature>, g: &[f64]) -> Vec<f64> {
    let mut q = g.to_vec();
    let mut alphas = Vec::with_capacity(memory.len());
    for (s, yv, rho) in memory.iter().rev() {
        let a = rho * dot(s, &q);
        for idx in 0..q.len() {
            q[idx] -= a * yv[idx];
        }
        alphas.push(a);
    }
    if let Some((s, yv, _)) = memory.back() {
        let gamma = dot(s, yv) / dot(yv, yv);
        q.iter_mut().for_each(|value| *value *= gamma);
    }
    for ((s, yv, rho), a) in memory.iter().zip(alphas.iter().rev()) {
        let b = rho * dot(yv, &q);
        for idx in 0..q.len() {
            q[idx] += s[idx] * (a - b);
        }
    }
    q
}

/// A step [`backtrack`] accepted.
struct Accepted {
    point: Vec<f64>,
    value: f64,
    gradient: Vec<f64>,
    /// `point - x`, after projection.
    moved: Vec<f64>,
}

/// Armijo backtracking from `x` along `direction`, starting at `step` and
/// halving up to 30 times, each trial point projected into the box.
fn backtrack(
    f: &impl Fn(&[f64]) -> Option<(f64, Vec<f64>)>,
    bounds: &Bounds<'_>,
    x: &[f64],
    fx: f64,
    g: &[f64],
    direction: &[f64],
    mut step: f64,
) -> Option<Accepted> {
    for _ in 0..30 {
        let mut candidate: Vec<f64> = x
            .iter()
            .zip(direction)
            .map(|(value, d)| value + step * d)
            .collect();
        bounds.project(&mut candidate);
        let moved: Vec<f64> = candidate
            .iter()
            .zip(x)
            .map(|(c, value)| c - value)
            .collect();
        if let Some((f_candidate, g_candidate)) = f(&candidate)
            && f_candidate <= fx + 1e-4 * dot(g, &moved)
        {
            return Some(Accepted {
                point: candidate,
                value: f_candidate,
                gradient: g_candidate,
                moved,
            });
        }
        step *= 0.5;
    }
    None
}

/// The posterior of a fitted process given its training data, ready to predict.
#[derive(Debug, Clone)]
pub(crate) struct Posterior {
    x: Vec<f64>,
    width: usize,
    inverse_lengths: Vec<f64>,
    signal: f64,
    alpha: DVector<f64>,
    /// The inverse of the training covariance's lower Cholesky factor: variances
    /// come from one matrix product with it (nalgebra's blocked product, far
    /// faster here than its column-by-column triangular solves), and it costs
    /// half the work of the covariance's own inverse.
    l_inv: DMatrix<f64>,
}

/// The inverse of the lower Cholesky factor of a covariance, by forward
/// substitution column by column, skipping the zeros above each column's diagonal
/// (`n³/6` multiply-adds, a third of a general triangular solve of the identity).
fn lower_inverse(chol: &Cholesky<f64, Dyn>) -> DMatrix<f64> {
    let l = chol.l_dirty();
    let n = l.nrows();
    let l = l.as_slice();
    let mut l_inv = DMatrix::<f64>::zeros(n, n);
    for (column_idx, column) in l_inv.as_mut_slice().chunks_exact_mut(n.max(1)).enumerate() {
        column[column_idx] = 1.0;
        for k in column_idx..n {
            let value = column[k] / l[k * n + k];
            column[k] = value;
            // Column-major: the entries below the diagonal of column k of L.
            let below = &l[k * n + k + 1..(k + 1) * n];
            for (entry, factor) in column[k + 1..].iter_mut().zip(below) {
                *entry -= factor * value;
            }
        }
    }
    l_inv
}

impl Posterior {
    /// Conditions the process with hyperparameters `theta` on `y` at `x`. When the
    /// covariance is numerically singular the noise is raised until it factorises.
    pub(crate) fn new(x: Vec<f64>, y: &[f64], layout: Layout<'_>, theta: &[f64]) -> Self {
        let y = DVector::from_column_slice(y);
        let mut theta = theta.to_vec();
        let chol = loop {
            if let Some(chol) = Cholesky::new(covariance(&x, layout, &theta)) {
                break chol;
            }
            let noise = &mut theta[layout.groups + 1];
            assert!(
                *noise < 10.0,
                "a covariance with noise above the signal always factorises"
            );
            *noise += 2.3;
        };
        Self {
            alpha: chol.solve(&y),
            l_inv: lower_inverse(&chol),
            inverse_lengths: layout.inverse_lengths(&theta),
            signal: theta[layout.groups].exp(),
            width: layout.width,
            x,
        }
    }

    /// The posterior mean and standard deviation of the latent function at each
    /// row of `candidates` (row-major, `width` features a row).
    pub(crate) fn predict(&self, candidates: &[f64]) -> (Vec<f64>, Vec<f64>) {
        let width = self.width;
        let m = candidates.len() / width;
        let n = self.alpha.len();
        // Column-major n×m cross-covariance: one column per candidate.
        let mut cross = Vec::with_capacity(m * n);
        for i in 0..m {
            let row_i = &candidates[i * width..(i + 1) * width];
            for a in 0..n {
                let row_a = &self.x[a * width..(a + 1) * width];
                cross.push(
                    self.signal * matern(scaled_sq_dist(row_a, row_i, &self.inverse_lengths)).0,
                );
            }
        }
        let cross = DMatrix::from_vec_generic(Dyn(n), Dyn(m), cross);
        let mean = cross.tr_mul(&self.alpha);
        // var = signal − |L⁻¹k|², L the covariance's Cholesky factor.
        let whitened = &self.l_inv * &cross;
        let sd = whitened
            .column_iter()
            .map(|column| {
                (self.signal - column.norm_squared())
                    .max(1e-12 * self.signal)
                    .sqrt()
            })
            .collect();
        (mean.as_slice().to_vec(), sd)
    }

    /// The posterior mean and standard deviation at one feature row `point`, with
    /// their gradients with respect to each feature (for polishing an acquisition).
    pub(crate) fn predict_with_gradient(&self, point: &[f64]) -> PointPrediction {
        let width = self.width;
        let n = self.alpha.len();
        // dk_a/dx_j = slope_a · (x_j − X_aj) · inverse_length_j², with
        // slope_a = −signal · (5/3)(1 + √5 r) e^{−√5 r} from `matern`.
        let mut k = DVector::<f64>::zeros(n);
        let mut slopes = vec![0.0; n];
        for a in 0..n {
            let row_a = &self.x[a * width..(a + 1) * width];
            let (correlation, slope) = matern(scaled_sq_dist(point, row_a, &self.inverse_lengths));
            k[a] = self.signal * correlation;
            slopes[a] = -self.signal * slope;
        }
        let mean = k.dot(&self.alpha);
        let weights = self.l_inv.tr_mul(&(&self.l_inv * &k));
        let variance = self.signal - k.dot(&weights);
        let floor = 1e-12 * self.signal;
        let sd = variance.max(floor).sqrt();
        let mut d_mean = vec![0.0; width];
        let mut d_variance = vec![0.0; width];
        for a in 0..n {
            let row_a = &self.x[a * width..(a + 1) * width];
            let (for_mean, for_variance) = (self.alpha[a] * slopes[a], weights[a] * slopes[a]);
            for feature in 0..width {
                let diff = point[feature] - row_a[feature];
                d_mean[feature] += for_mean * diff;
                d_variance[feature] += for_variance * diff;
            }
        }
        let d_sd = d_variance
            .iter()
            .zip(&self.inverse_lengths)
            .map(|(dv, inverse)| {
                if variance > floor {
                    -dv * inverse * inverse / sd
                } else {
                    0.0
                }
            })
            .collect();
        d_mean
            .iter_mut()
            .zip(&self.inverse_lengths)
            .for_each(|(dm, inverse)| *dm *= inverse * inverse);
        PointPrediction {
            mean,
            sd,
            d_mean,
            d_sd,
        }
    }
}

/// The posterior at one point and its gradients (see [`Posterior::predict_with_gradient`]).
#[derive(Debug, Clone)]
pub(crate) struct PointPrediction {
    pub(crate) mean: f64,
    pub(crate) sd: f64,
    pub(crate) d_mean: Vec<f64>,
    pub(crate) d_sd: Vec<f64>,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn layout(width: usize, owners: &[usize]) -> Layout<'_> {
        Layout {
            width,
            owners,
            groups: owners.iter().max().map_or(0, |max| max + 1),
        }
    }

    #[test]
    fn the_gradient_matches_finite_differences() {
        let owners = [0, 1, 1];
        let layout = layout(3, &owners);
        let x: Vec<f64> = (0..8)
            .flat_map(|idx| {
                let t = f64::from(idx) / 7.0;
                [t, (3.0 * t).sin().abs(), 1.0 - t]
            })
            .collect();
        let y = DVector::from_iterator(8, (0..8).map(|idx| (f64::from(idx) * 0.7).cos()));
        let theta = vec![-0.7, 0.2, 0.3, -2.0];
        let (_, grad) = objective(&x, &y, layout, &theta).unwrap();
        for idx in 0..theta.len() {
            let h = 1e-5;
            let mut up = theta.clone();
            up[idx] += h;
            let mut down = theta.clone();
            down[idx] -= h;
            let numeric = (objective(&x, &y, layout, &up).unwrap().0
                - objective(&x, &y, layout, &down).unwrap().0)
                / (2.0 * h);
            assert!(
                (numeric - grad[idx]).abs() < 1e-4 * (1.0 + numeric.abs()),
                "d/dtheta[{idx}]: analytic {} numeric {numeric}",
                grad[idx]
            );
        }
    }

    #[test]
    fn the_lower_inverse_inverts_the_cholesky_factor() {
        let owners = [0, 1];
        let layout = layout(2, &owners);
        let x: Vec<f64> = (0..9)
            .flat_map(|idx| [f64::from(idx) / 8.0, (f64::from(idx) * 0.618).fract()])
            .collect();
        let theta = vec![(0.3f64).ln(), (0.5f64).ln(), 0.1, (1e-3f64).ln()];
        let chol = Cholesky::new(covariance(&x, layout, &theta)).unwrap();
        let product = lower_inverse(&chol) * chol.l();
        let identity = DMatrix::<f64>::identity(9, 9);
        assert!((product - identity).amax() < 1e-9);
    }

    #[test]
    fn minimise_finds_a_bounded_quadratic_minimum() {
        let (x, value) = minimise(
            |x| {
                Some((
                    (x[0] - 1.0).powi(2) + 10.0 * (x[1] + 2.0).powi(2),
                    vec![2.0 * (x[0] - 1.0), 20.0 * (x[1] + 2.0)],
                ))
            },
            vec![5.0, 5.0],
            &[-10.0, -1.0],
            &[10.0, 10.0],
            100,
        )
        .unwrap();
        assert!((x[0] - 1.0).abs() < 1e-4, "{x:?}");
        assert!((x[1] + 1.0).abs() < 1e-9, "{x:?} stops at the bound");
        assert!((value - 10.0).abs() < 1e-6);
    }

    #[test]
    fn the_posterior_interpolates_and_is_unsure_far_away() {
        let owners = [0];
        let layout = layout(1, &owners);
        let x = vec![0.1, 0.5, 0.9];
        let y = [1.0, -1.0, 0.5];
        let theta = vec![(0.2f64).ln(), 0.0, (1e-6f64).ln()];
        let posterior = Posterior::new(x, &y, layout, &theta);
        let (mean, sd) = posterior.predict(&[0.5, 0.3, 5.0]);
        assert!((mean[0] + 1.0).abs() < 1e-3, "{mean:?}");
        assert!(sd[0] < 1e-2, "{sd:?}");
        assert!(sd[1] > sd[0]);
        assert!((sd[2] - 1.0).abs() < 1e-6, "prior sd far from data: {sd:?}");
        assert!(mean[2].abs() < 1e-6);
    }

    #[test]
    fn the_prediction_gradient_matches_finite_differences() {
        let owners = [0, 1];
        let layout = layout(2, &owners);
        let x: Vec<f64> = (0..12)
            .flat_map(|idx| {
                let t = f64::from(idx) / 11.0;
                [t, (f64::from(idx) * 0.618).fract()]
            })
            .collect();
        let y: Vec<f64> = (0..12).map(|idx| (f64::from(idx) * 0.9).sin()).collect();
        let theta = vec![(0.3f64).ln(), (0.6f64).ln(), 0.2, (1e-4f64).ln()];
        let posterior = Posterior::new(x, &y, layout, &theta);
        let point = [0.37, 0.52];
        let at = posterior.predict_with_gradient(&point);
        let (mean, sd) = posterior.predict(&point);
        assert!((at.mean - mean[0]).abs() < 1e-9 && (at.sd - sd[0]).abs() < 1e-9);
        for feature in 0..2 {
            let h = 1e-6;
            let mut up = point;
            up[feature] += h;
            let mut down = point;
            down[feature] -= h;
            let (up, down) = (
                posterior.predict_with_gradient(&up),
                posterior.predict_with_gradient(&down),
            );
            let d_mean = (up.mean - down.mean) / (2.0 * h);
            let d_sd = (up.sd - down.sd) / (2.0 * h);
            assert!(
                (d_mean - at.d_mean[feature]).abs() < 1e-5 * (1.0 + d_mean.abs()),
                "mean, feature {feature}: {d_mean} vs {}",
                at.d_mean[feature]
            );
            assert!(
                (d_sd - at.d_sd[feature]).abs() < 1e-5 * (1.0 + d_sd.abs()),
                "sd, feature {feature}: {d_sd} vs {}",
                at.d_sd[feature]
            );
        }
    }

    #[test]
    fn fitting_prefers_long_length_scales_for_smooth_data() {
        let owners = [0, 1];
        let layout = layout(2, &owners);
        // y depends on the first input only.
        let x: Vec<f64> = (0..20)
            .flat_map(|idx| {
                let t = f64::from(idx) / 19.0;
                [t, (f64::from(idx) * 0.618).fract()]
            })
            .collect();
        let raw: Vec<f64> = (0..20)
            .map(|idx| (6.0 * f64::from(idx) / 19.0).sin())
            .collect();
        let theta = fit(&x, &raw, layout, &[layout.prior_mean()], 100).unwrap();
        assert!(
            theta[0] < theta[1],
            "the relevant input gets the shorter length scale: {theta:?}"
        );
    }
}
