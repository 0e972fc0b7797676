//! The acquisition functions of [`super::GpSearcher`] and their gradients, on the
//! minimised, standardised objective: log expected improvement (computed without
//! underflow far below the incumbent, as in Ament et al. 2023, "Unexpected
//! improvements to expected improvement") and the lower confidence bound.

use statrs::function::erf::erfc;

use super::Acquisition;
use super::gp_model::PointPrediction;

const LN_SQRT_2PI: f64 = 0.918_938_533_204_672_8;
/// Beyond this many standard deviations below the incumbent, Mills' ratio comes
/// from its asymptotic series instead of `erfc`, whose quotient loses digits there.
const ASYMPTOTIC_FROM: f64 = 26.0;

fn pdf(z: f64) -> f64 {
    (-0.5 * z * z - LN_SQRT_2PI).exp()
}

fn cdf(z: f64) -> f64 {
    0.5 * erfc(-z / std::f64::consts::SQRT_2)
}

/// Mills' ratio `R(t) = Φ(−t)/φ(t)` and `1 − t·R(t)`, for `t ≥ 1`.
fn mills(t: f64) -> (f64, f64) {
    if t < ASYMPTOTIC_FROM {
        let ratio = cdf(-t) / pdf(t);
        return (ratio, 1.0 - t * ratio);
    }
    // Asymptotic series; the next terms are below 1e-8 relative.
    let u = 1.0 / (t * t);
    (
        (1.0 - u * (1.0 - u * (3.0 - u * (15.0 - 105.0 * u)))) / t,
        u * (1.0 - u * (3.0 - u * (15.0 - u * (105.0 - 945.0 * u)))),
    )
}

/// `ln(φ(z) + z·Φ(z))`, the log of expected improvement at unit standard deviation.
pub(crate) fn log_h(z: f64) -> f64 {
    if z > -1.0 {
        return (pdf(z) + z * cdf(z)).ln();
    }
    // h(z) = φ(z)·(1 − t·R(t)) with t = −z.
    let (_, tail) = mills(-z);
    -0.5 * z * z - LN_SQRT_2PI + tail.ln()
}

/// The derivative of [`log_h`]: `Φ(z) / h(z)`.
pub(crate) fn log_h_slope(z: f64) -> f64 {
    if z > -1.0 {
        let c = cdf(z);
        return c / (pdf(z) + z * c);
    }
    // Φ(z)/h(z) = R(t)/(1 − t·R(t)).
    let (ratio, tail) = mills(-z);
    ratio / tail
}

/// The acquisition value at a predicted point, larger is better: `ln EI` below
/// `best`, or `kappa·sd − mean`.
pub(crate) fn value(acquisition: Acquisition, best: f64, mean: f64, sd: f64) -> f64 {
    match acquisition {
        Acquisition::Ucb { kappa } => kappa * sd - mean,
        Acquisition::Ei => sd.ln() + log_h((best - mean) / sd),
    }
}

/// The acquisition value and its gradient with respect to the features.
pub(crate) fn value_and_gradient(
    acquisition: Acquisition,
    best: f64,
    at: &PointPrediction,
) -> (f64, Vec<f64>) {
    let gradient = match acquisition {
        Acquisition::Ucb { kappa } => at
            .d_mean
            .iter()
            .zip(&at.d_sd)
            .map(|(dm, ds)| kappa * ds - dm)
            .collect(),
        Acquisition::Ei => {
            let z = (best - at.mean) / at.sd;
            let slope = log_h_slope(z);
            at.d_mean
                .iter()
                .zip(&at.d_sd)
                .map(|(dm, ds)| ds / at.sd + slope * (-dm - z * ds) / at.sd)
                .collect()
        }
    };
    (value(acquisition, best, at.mean, at.sd), gradient)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn log_h_is_continuous_and_matches_the_direct_formula() {
        for z in [-30.0, -25.9, -19.9, -5.0, -1.5, -1.0, 0.0, 2.0] {
            let direct = {
                let pdf = (-0.5f64 * z * z).exp() / (2.0 * std::f64::consts::PI).sqrt();
                let cdf = 0.5 * erfc(-z / std::f64::consts::SQRT_2);
                (pdf + z * cdf).ln()
            };
            if direct.is_finite() && z > -25.0 {
                assert!(
                    (log_h(z) - direct).abs() < 1e-6 * direct.abs().max(1.0),
                    "z = {z}"
                );
            }
        }
        assert!((log_h(-26.0 - 1e-9) - log_h(-26.0 + 1e-9)).abs() < 1e-7);
        assert!(log_h(-40.0).is_finite());
        assert!(log_h(-40.0) < log_h(-30.0));
    }

    #[test]
    fn log_ei_matches_ei_and_stays_finite_where_ei_underflows() {
        let best = 0.0;
        for (mean, sd) in [(-1.0, 0.5), (0.0, 1.0), (0.5, 0.2), (3.0, 0.4), (2.0, 0.1)] {
            let z: f64 = (best - mean) / sd;
            let pdf = (-0.5 * z * z).exp() / (2.0 * std::f64::consts::PI).sqrt();
            let ei = sd * (z * cdf(z) + pdf);
            assert!(ei > 0.0 && ei.is_finite(), "EI representable at z = {z}");
            let log_ei = value(Acquisition::Ei, best, mean, sd);
            assert!(
                (log_ei.exp() - ei).abs() <= 1e-9 * ei,
                "mean {mean}, sd {sd}: exp(log-EI) {} against EI {ei}",
                log_ei.exp()
            );
        }
        // Forty standard deviations above the incumbent EI underflows to zero in
        // f64; log-EI stays finite and still orders such points.
        let (far, farther) = (
            value(Acquisition::Ei, 0.0, 40.0, 1.0),
            value(Acquisition::Ei, 0.0, 60.0, 1.0),
        );
        let direct = 40.0f64.mul_add(-cdf(-40.0), pdf(-40.0));
        assert!(direct <= 0.0 || direct < 1e-300, "EI underflows: {direct}");
        assert!(far.is_finite() && farther.is_finite());
        assert!(farther < far && far < -700.0, "{far}, {farther}");
    }

    #[test]
    fn log_h_slope_is_the_derivative_everywhere() {
        for z in [
            -60.0_f64, -30.0, -26.5, -25.5, -12.0, -3.0, -1.2, -0.8, 0.0, 1.5, 4.0,
        ] {
            let h = 1e-5 * (1.0f64).max(z.abs());
            let numeric = (log_h(z + h) - log_h(z - h)) / (2.0 * h);
            let analytic = log_h_slope(z);
            assert!(
                (numeric - analytic).abs() < 1e-5 * (1.0 + analytic.abs()),
                "z = {z}: numeric {numeric}, analytic {analytic}"
            );
        }
        // Far below the incumbent the slope approaches −z.
        assert!((log_h_slope(-1000.0) - 1000.0).abs() < 0.1);
    }

    #[test]
    fn the_gradient_combines_mean_and_sd_by_the_chain_rule() {
        let at = PointPrediction {
            mean: 0.3,
            sd: 0.4,
            d_mean: vec![1.0, 0.0],
            d_sd: vec![0.0, 1.0],
        };
        for acquisition in [Acquisition::Ei, Acquisition::Ucb { kappa: 2.0 }] {
            let (base, gradient) = value_and_gradient(acquisition, -0.5, &at);
            let h = 1e-6;
            let by_mean = (value(acquisition, -0.5, 0.3 + h, 0.4) - base) / h;
            let by_sd = (value(acquisition, -0.5, 0.3, 0.4 + h) - base) / h;
            assert!((by_mean - gradient[0]).abs() < 1e-4, "{acquisition:?}");
            assert!((by_sd - gradient[1]).abs() < 1e-4, "{acquisition:?}");
        }
    }
}
