//! Statistics over seed replicates and metric series: summaries with confidence
//! intervals, Welch's t-test, quantiles and TensorBoard-style smoothing.
//!
//! Pure functions over slices: no I/O, no randomness, no allocation beyond the
//! returned values. They never panic on awkward input (empty slices, one value,
//! zero variance, NaN); each documents what it returns instead. They do not decide
//! anything about trials; `xp status`, the dashboard and the benches call them to
//! describe results.

use statrs::distribution::{ContinuousCDF, StudentsT};

/// The largest smoothing [`ema`] applies; TensorBoard's slider stops here too,
/// because at 1 the average never moves and the debiasing divides by zero.
pub const MAX_SMOOTHING: f64 = 0.999;

/// Mean, spread and a 95% confidence interval of the mean of some replicates,
/// so that a result is reported with its uncertainty rather than as one number.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Summary {
    /// How many values were summarised.
    pub n: usize,
    /// The arithmetic mean.
    pub mean: f64,
    /// The sample standard deviation (divisor `n - 1`); NaN when `n == 1`, where
    /// the spread of one value is undefined.
    pub std_dev: f64,
    /// The two-sided 95% confidence interval of the mean from Student's t with
    /// `n - 1` degrees of freedom; `(-inf, +inf)` when `n == 1`, because one value
    /// says nothing about how far the mean could be.
    pub ci95: (f64, f64),
}

/// Summarises `values`; `None` when there are none.
///
/// NaN or infinite values propagate into every field, so a diverged replicate is
/// visible rather than silently dropped.
pub fn summarize(values: &[f64]) -> Option<Summary> {
    let n = values.len();
    if n == 0 {
        return None;
    }
    let mean = mean(values);
    if n == 1 {
        return Some(Summary {
            n,
            mean,
            std_dev: f64::NAN,
            ci95: (f64::NEG_INFINITY, f64::INFINITY),
        });
    }
    let std_dev = sample_variance(values, mean).sqrt();
    let half_width = if std_dev == 0.0 {
        0.0
    } else {
        t_quantile(0.975, (n - 1) as f64) * std_dev / (n as f64).sqrt()
    };
    Some(Summary {
        n,
        mean,
        std_dev,
        ci95: (mean - half_width, mean + half_width),
    })
}

/// The outcome of Welch's unequal-variance t-test of two independent samples,
/// which tells whether two configurations differ beyond seed noise.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct WelchTest {
    /// The t statistic, `(mean(a) - mean(b)) / sqrt(var(a)/n_a + var(b)/n_b)`;
    /// negative when `a` has the smaller mean.
    pub t: f64,
    /// The Welch–Satterthwaite degrees of freedom (not an integer in general).
    pub dof: f64,
    /// The two-sided p-value: the chance of a `|t|` at least this large if both
    /// samples had the same mean.
    pub p_value: f64,
    /// Whether `p_value < alpha`.
    pub significant: bool,
}

/// Welch's two-sided t-test at level `alpha` (matches scipy's
/// `ttest_ind(a, b, equal_var=False)`).
///
/// `None` when the test is undefined: either sample has fewer than two values,
/// both sample variances are zero, or a value is not finite.
pub fn welch_t_test(a: &[f64], b: &[f64], alpha: f64) -> Option<WelchTest> {
    if a.len() < 2 || b.len() < 2 || !a.iter().chain(b).all(|value| value.is_finite()) {
        return None;
    }
    let (n_a, n_b) = (a.len() as f64, b.len() as f64);
    let (mean_a, mean_b) = (mean(a), mean(b));
    let se2_a = sample_variance(a, mean_a) / n_a;
    let se2_b = sample_variance(b, mean_b) / n_b;
    let se2 = se2_a + se2_b;
    if se2 == 0.0 {
        return None;
    }
    let t = (mean_a - mean_b) / se2.sqrt();
    let dof = se2 * se2 / (se2_a * se2_a / (n_a - 1.0) + se2_b * se2_b / (n_b - 1.0));
    let distribution = StudentsT::new(0.0, 1.0, dof).ok()?;
    let p_value = (2.0 * distribution.sf(t.abs())).min(1.0);
    Some(WelchTest {
        t,
        dof,
        p_value,
        significant: p_value < alpha,
    })
}

/// The `q`-quantile of `values` with linear interpolation between order
/// statistics (numpy's default), used for medians and interquartile ranges.
///
/// `None` when `values` is empty or `q` is outside `[0, 1]`. NaN sorts above
/// every number, so it only shows in the upper quantiles.
pub fn quantile(values: &[f64], q: f64) -> Option<f64> {
    if values.is_empty() || !(0.0..=1.0).contains(&q) {
        return None;
    }
    let mut sorted = values.to_vec();
    sorted.sort_by(f64::total_cmp);
    let position = q * (sorted.len() - 1) as f64;
    let below = position.floor() as usize;
    let above = position.ceil() as usize;
    let fraction = position - below as f64;
    if below == above {
        return Some(sorted[below]);
    }
    Some(sorted[below] + (sorted[above] - sorted[below]) * fraction)
}

/// The positions of at most `points` of `len` items, evenly spaced, the first
/// and last always included (every position when `len <= points`): how a long
/// series is thinned for a chart or an answer of bounded size.
pub fn evenly_spaced(len: usize, points: usize) -> Vec<usize> {
    if len <= points {
        return (0..len).collect();
    }
    let points = points.max(2);
    // Position i is i * (len - 1) / (points - 1): increasing, first and last included.
    let mut kept: Vec<usize> = (0..points)
        .map(|slot| slot * (len - 1) / (points - 1))
        .collect();
    kept.dedup();
    kept
}

/// TensorBoard's debiased exponential moving average, for smoothed learning
/// curves (`--ema 0.9`).
///
/// `smoothed[i] = last_i / (1 - smoothing^k)` with
/// `last_i = smoothing * last_{i-1} + (1 - smoothing) * values[i]`, `last = 0`
/// before the first value and `k` the number of finite values so far; the
/// division removes the pull towards the zero start. A non-finite value is passed
/// through unsmoothed and does not enter the average, as in TensorBoard.
/// `smoothing` is clamped to `[0, MAX_SMOOTHING]` (NaN counts as 0, no smoothing);
/// callers that take it from a user validate it first.
pub fn ema(values: &[f64], smoothing: f64) -> Vec<f64> {
    let smoothing = if smoothing.is_nan() {
        0.0
    } else {
        smoothing.clamp(0.0, MAX_SMOOTHING)
    };
    let mut last = 0.0;
    let mut finite_seen = 0;
    values
        .iter()
        .map(|&value| {
            if !value.is_finite() {
                return value;
            }
            last = smoothing * last + (1.0 - smoothing) * value;
            finite_seen += 1;
            last / (1.0 - smoothing.powi(finite_seen))
        })
        .collect()
}

fn mean(values: &[f64]) -> f64 {
    values.iter().sum::<f64>() / values.len() as f64
}

/// The unbiased sample variance; the caller guarantees at least two values.
fn sample_variance(values: &[f64], mean: f64) -> f64 {
    let squares: f64 = values.iter().map(|value| (value - mean).powi(2)).sum();
    squares / (values.len() - 1) as f64
}

/// The `p`-quantile of the standard Student t with `dof` degrees of freedom.
fn t_quantile(p: f64, dof: f64) -> f64 {
    StudentsT::new(0.0, 1.0, dof)
        .map(|distribution| distribution.inverse_cdf(p))
        .unwrap_or(f64::NAN)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn evenly_spaced_keeps_the_ends_and_at_most_the_points_asked() {
        assert_eq!(evenly_spaced(3, 10), vec![0, 1, 2]);
        let kept = evenly_spaced(10_000, 500);
        assert_eq!(kept.len(), 500);
        assert_eq!(kept.first(), Some(&0));
        assert_eq!(kept.last(), Some(&9_999));
        assert!(kept.windows(2).all(|pair| pair[0] < pair[1]));
        assert_eq!(evenly_spaced(0, 50), Vec::<usize>::new());
    }

    fn check_close(actual: f64, expected: f64, tolerance: f64) {
        assert!(
            (actual - expected).abs() <= tolerance,
            "{actual} differs from {expected} by more than {tolerance}"
        );
    }

    fn check_summary(values: &[f64], mean: f64, std_dev: f64, ci95: (f64, f64)) {
        let summary = summarize(values).unwrap();
        assert_eq!(summary.n, values.len());
        check_close(summary.mean, mean, 1e-12);
        check_close(summary.std_dev, std_dev, 1e-12);
        check_close(summary.ci95.0, ci95.0, 1e-9);
        check_close(summary.ci95.1, ci95.1, 1e-9);
    }

    fn check_welch(a: &[f64], b: &[f64], t: f64, dof: f64, p_value: f64) {
        let test = welch_t_test(a, b, 0.05).unwrap();
        check_close(test.t, t, 1e-9);
        check_close(test.dof, dof, 1e-9);
        check_close(test.p_value, p_value, 1e-9);
        assert_eq!(test.significant, p_value < 0.05);
    }

    // Expected values were computed with python3 and mpmath at 30 digits: the mean,
    // the n-1 standard deviation, t quantiles by inverting mpmath's regularised
    // incomplete beta, and p = I_{dof/(dof+t^2)}(dof/2, 1/2).
    #[test]
    fn summaries_match_hand_computed_values() {
        // t_{0.975, 4} = 2.7764451051977944; s = sqrt(2.5); half = t * s / sqrt(5).
        check_summary(
            &[1.0, 2.0, 3.0, 4.0, 5.0],
            3.0,
            1.5811388300841898,
            (1.0367568385224423, 4.963243161477558),
        );
        // t_{0.975, 1} = 12.706204736174698; s = 1/sqrt(2); half = t / 2.
        check_summary(
            &[0.5, 1.5],
            1.0,
            std::f64::consts::FRAC_1_SQRT_2,
            (-5.353102368087349, 7.353102368087349),
        );
        check_summary(&[2.0, 2.0, 2.0], 2.0, 0.0, (2.0, 2.0));
    }

    #[test]
    fn summaries_of_degenerate_input_do_not_panic() {
        assert_eq!(summarize(&[]), None);
        let one = summarize(&[0.7]).unwrap();
        assert_eq!((one.n, one.mean), (1, 0.7));
        assert!(one.std_dev.is_nan());
        assert_eq!(one.ci95, (f64::NEG_INFINITY, f64::INFINITY));
        assert!(summarize(&[1.0, f64::NAN]).unwrap().mean.is_nan());
    }

    #[test]
    fn welch_matches_known_values() {
        // scipy.stats.ttest_ind([1,2,3,4,5], [2,4,6,8,10], equal_var=False).
        check_welch(
            &[1.0, 2.0, 3.0, 4.0, 5.0],
            &[2.0, 4.0, 6.0, 8.0, 10.0],
            -1.8973665961010275,
            5.882352941176471,
            0.10753119493062724,
        );
        // Unequal sizes, clearly different means.
        check_welch(
            &[0.1, 0.2, 0.15, 0.12],
            &[0.3, 0.35, 0.28, 0.4, 0.33, 0.31],
            -6.672341660978073,
            6.477927501814583,
            0.000397477370554908,
        );
        // One sample without spread still has a defined test.
        check_welch(
            &[1.0, 1.0, 1.0],
            &[1.0, 2.0, 3.0],
            -1.7320508075688772,
            2.0,
            0.2254033307585166,
        );
    }

    #[test]
    fn welch_is_undefined_without_data_or_spread() {
        assert_eq!(welch_t_test(&[1.0], &[1.0, 2.0], 0.05), None);
        assert_eq!(welch_t_test(&[1.0, 2.0], &[], 0.05), None);
        assert_eq!(welch_t_test(&[1.0, 1.0], &[2.0, 2.0, 2.0], 0.05), None);
        assert_eq!(welch_t_test(&[1.0, f64::NAN], &[2.0, 3.0], 0.05), None);
        let same = welch_t_test(&[1.0, 2.0, 3.0], &[1.0, 2.0, 3.0], 0.05).unwrap();
        assert_eq!((same.t, same.p_value, same.significant), (0.0, 1.0, false));
    }

    #[test]
    fn quantiles_interpolate_like_numpy() {
        let values = [7.0, 1.0, 3.0, 5.0];
        assert_eq!(quantile(&values, 0.5), Some(4.0));
        assert_eq!(quantile(&values, 0.25), Some(2.5));
        assert_eq!(quantile(&values, 0.75), Some(5.5));
        assert_eq!(quantile(&values, 0.0), Some(1.0));
        assert_eq!(quantile(&values, 1.0), Some(7.0));
        assert_eq!(quantile(&[], 0.5), None);
        assert_eq!(quantile(&values, 1.5), None);
    }

    #[test]
    fn ema_is_debiased_like_tensorboard() {
        let smoothed = ema(&[1.0, 2.0, 3.0], 0.9);
        // last: 0.1, 0.29, 0.561; debias: 0.1, 0.19, 0.271.
        check_close(smoothed[0], 1.0, 1e-12);
        check_close(smoothed[1], 0.29 / 0.19, 1e-12);
        check_close(smoothed[2], 0.561 / 0.271, 1e-12);
        assert_eq!(ema(&[4.0, 4.0, 4.0], 0.6), vec![4.0, 4.0, 4.0]);
        assert_eq!(ema(&[1.0, 5.0], 0.0), vec![1.0, 5.0]);
        assert_eq!(ema(&[], 0.9), Vec::<f64>::new());
    }

    #[test]
    fn ema_passes_non_finite_values_through_and_clamps_smoothing() {
        let smoothed = ema(&[1.0, f64::NAN, 3.0], 0.5);
        assert!(smoothed[1].is_nan());
        // The NaN is skipped: 3.0 is the second finite value. last: 0.5, 1.75.
        check_close(smoothed[2], 1.75 / 0.75, 1e-12);
        assert_eq!(ema(&[1.0, 5.0], f64::NAN), vec![1.0, 5.0]);
        assert_eq!(ema(&[1.0, 5.0], -1.0), vec![1.0, 5.0]);
        assert!(ema(&[1.0, 5.0], 1.0).iter().all(|value| value.is_finite()));
    }
}
