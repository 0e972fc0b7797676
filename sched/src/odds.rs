//! Conflict odds of shared resources: how likely a request for a lease or a GPU
//! model is to wait, observed from history, and how likely at least one of
//! several concurrent requests is to wait.
//!
//! Pure arithmetic: the head counts, for each lease and GPU model, the trials
//! that asked for it and those that waited at least one scheduling pass; these
//! functions turn the counts into probabilities. Treating requests as
//! independent is the simplification `1 − Π(1 − p_i)` makes; it is a rough
//! guide to contention, not a forecast.

/// The observed probability that a request waited: `waited / asked`, `None`
/// with no request yet (no history is not a zero chance).
pub fn observed_wait_probability(asked: u64, waited: u64) -> Option<f64> {
    (asked > 0).then(|| waited.min(asked) as f64 / asked as f64)
}

/// The chance that at least one of several independent requests conflicts,
/// each with its own probability `p_i`: `1 − Π(1 − p_i)`. Probabilities
/// outside `[0, 1]` (or NaN) are clamped into it, so the result is always a
/// probability; no request gives 0.
pub fn any_conflict(probabilities: impl IntoIterator<Item = f64>) -> f64 {
    let none = probabilities
        .into_iter()
        .map(|p| if p.is_nan() { 0.0 } else { p.clamp(0.0, 1.0) })
        .fold(1.0, |none, p| none * (1.0 - p));
    (1.0 - none).clamp(0.0, 1.0)
}

/// The chance that at least one of `n` concurrent requests of the same kind,
/// each waiting with probability `p`, conflicts: `1 − (1 − p)^n`.
pub fn any_of_n_conflict(p: f64, n: u64) -> f64 {
    let n = i32::try_from(n).unwrap_or(i32::MAX);
    let p = if p.is_nan() { 0.0 } else { p.clamp(0.0, 1.0) };
    (1.0 - (1.0 - p).powi(n)).clamp(0.0, 1.0)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn close(a: f64, b: f64) -> bool {
        (a - b).abs() < 1e-12
    }

    #[test]
    fn observed_probability() {
        assert_eq!(observed_wait_probability(0, 0), None);
        assert_eq!(observed_wait_probability(4, 1), Some(0.25));
        assert_eq!(observed_wait_probability(4, 9), Some(1.0));
    }

    #[test]
    fn at_least_one_conflict() {
        assert_eq!(any_conflict([]), 0.0);
        assert!(close(any_conflict([0.5]), 0.5));
        assert!(close(any_conflict([0.5, 0.5]), 0.75));
        assert!(close(any_conflict([0.1, 0.2, 0.3]), 1.0 - 0.9 * 0.8 * 0.7));
        assert_eq!(any_conflict([1.0, 0.0]), 1.0);
        assert_eq!(any_conflict([f64::NAN, -3.0, 0.0]), 0.0);
        assert_eq!(any_conflict([7.0]), 1.0);
        assert!(close(any_of_n_conflict(0.5, 3), 0.875));
        assert_eq!(any_of_n_conflict(0.3, 0), 0.0);
        assert!(close(
            any_of_n_conflict(0.2, 4),
            any_conflict([0.2, 0.2, 0.2, 0.2])
        ));
    }

    proptest::proptest! {
        #[test]
        fn is_a_probability_and_grows_with_each_request(
            ps in proptest::collection::vec(0.0_f64..=1.0, 0..20),
            extra in 0.0_f64..=1.0,
        ) {
            let before = any_conflict(ps.iter().copied());
            proptest::prop_assert!((0.0..=1.0).contains(&before));
            let after = any_conflict(ps.iter().copied().chain([extra]));
            proptest::prop_assert!(after + 1e-12 >= before);
            let most = ps.iter().copied().fold(0.0, f64::max);
            proptest::prop_assert!(before + 1e-12 >= most);
        }
    }
}
