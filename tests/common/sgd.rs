//! `elastic_sgd` (`examples/trainables.rs`) as one process that never
//! resized computes it, for the tests that stop, resize or move its gang.

use serde_json::Value;

/// The trainable's data set and update (`examples/trainables.rs`), run on
/// one process from the start: what a run that never resized ends with after
/// `steps` steps.
pub(crate) fn never_resized(steps: u64, batch: u64, data_seed: u64) -> [f64; 5] {
    let sample = |index: u64| {
        let mix = |salt: u64| {
            let mut z = data_seed
                .wrapping_mul(0x9E37_79B9_7F4A_7C15)
                .wrapping_add(index.wrapping_mul(0xBF58_476D_1CE4_E5B9))
                .wrapping_add(salt.wrapping_mul(0x94D0_49BB_1331_11EB));
            z ^= z >> 31;
            z = z.wrapping_mul(0xD6E8_FEB8_6659_FD93);
            z ^ (z >> 29)
        };
        let truth = [0.5, -0.25, 0.75, 1.0];
        let mut features = [0.0; 4];
        let mut target = 0.125 + ((mix(99) % 16) as f64 - 8.0) / 256.0;
        for (feature, (value, weight)) in features.iter_mut().zip(truth).enumerate() {
            *value = (mix(feature as u64) % 64) as f64 / 64.0 - 0.5;
            target += weight * *value;
        }
        (features, target)
    };
    let quantum = f64::from(1u32 << 24);
    let round = |value: f64| (value * quantum).round() / quantum;
    let mut params = [0.0f64; 5];
    for step in 0..steps {
        let mut sum = [0.0f64; 5];
        for position in 0..batch {
            let (features, target) = sample((step * batch + position) % 256);
            let prediction = params[4]
                + features
                    .iter()
                    .zip(&params)
                    .map(|(x, w)| x * w)
                    .sum::<f64>();
            let error = prediction - target;
            for (total, x) in sum.iter_mut().zip(features) {
                *total += round(error * x);
            }
            sum[4] += round(error);
        }
        for (param, part) in params.iter_mut().zip(sum) {
            *param -= 0.125 * (part / batch as f64);
        }
    }
    params
}

/// The trial's final parameters equal one process's that never resized. The
/// trainable's sums are exact, so the runs agree bit for bit; the values
/// travel as JSON (metric line, then `xp status --json`), whose float parsing
/// is best-effort to the last bit, so they are compared to 1e-12.
pub(crate) fn check_same_as_never_resized(trial: &Value, steps: u64, batch: u64, data_seed: u64) {
    let expected = never_resized(steps, batch, data_seed);
    for (name, expected) in ["w0", "w1", "w2", "w3", "b"].iter().zip(expected) {
        let got = trial["metrics"][name].as_f64().expect("a final parameter");
        assert!(
            (got - expected).abs() <= 1e-12 * expected.abs().max(1.0),
            "{name}: {got} after resizes vs {expected} never resized"
        );
    }
    // The tolerance still tells a step lost or repeated.
    let one_short = never_resized(steps - 1, batch, data_seed);
    assert!(
        expected
            .iter()
            .zip(one_short)
            .any(|(all, short)| (all - short).abs() > 1e-9),
        "{expected:?} vs {one_short:?}"
    );
}
