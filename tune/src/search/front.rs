//! The Pareto front of a multi-objective experiment as people see it: from each
//! trial's objective values (in the metrics' own units and directions) to the
//! non-dominated trials, their hypervolume against a reference point, and each
//! one's contribution to it, which ranks them where one trial must be named.
//!
//! A candidate missing an objective, or with a non-finite one, is not on the front
//! and does not move the default reference. Pure: `xp status` (through the head),
//! `xp compare` and `xp tune` all call [`summarize_front`].

use super::pareto::{ParetoError, dominates, hypervolume, hypervolume_contributions};

/// The most work (about `front^(m−1)·log2(front)` steps per hypervolume) spent on
/// a front of 3 or 4 objectives: past it the hypervolume, and past it divided by
/// the front's size the contributions, are not computed (NaN), since they run on
/// the head's one actor at every `xp status`. Two objectives are always exact
/// (O(n log n)).
pub const MAX_SLICING_WORK: f64 = 2e7;

/// How the reference point is chosen when the spec declares none, for output.
pub const DEFAULT_REFERENCE_RULE: &str =
    "the worst value of each objective over the evaluated trials, 10% of its range further";

/// One trial on the front.
#[derive(Debug, Clone, PartialEq)]
pub struct FrontPoint<K> {
    /// Which candidate it is.
    pub key: K,
    /// Its objective values, in the metrics' own units.
    pub values: Vec<f64>,
    /// How much hypervolume the front loses without it.
    pub contribution: f64,
}

/// The front of a set of candidates and its hypervolume.
#[derive(Debug, Clone, PartialEq)]
pub struct FrontSummary<K> {
    /// The reference point in the metrics' own units; `None` when no reference was
    /// declared and no candidate has every objective.
    pub reference: Option<Vec<f64>>,
    /// Whether the reference was declared (else derived by [`DEFAULT_REFERENCE_RULE`]).
    pub reference_declared: bool,
    /// The volume the front dominates up to the reference (0 without one).
    pub hypervolume: f64,
    /// How many candidates had every objective finite.
    pub evaluated: usize,
    /// The non-dominated candidates, largest contribution first (input order among equals).
    pub front: Vec<FrontPoint<K>>,
}

/// The default reference in minimised terms: each objective's worst value plus
/// 10% of its range (of its magnitude when all values are equal, 1 when that is 0).
fn default_reference(points: &[Vec<f64>], objectives: usize) -> Option<Vec<f64>> {
    if points.is_empty() {
        return None;
    }
    Some(
        (0..objectives)
            .map(|axis| {
                let worst = points.iter().map(|p| p[axis]).fold(f64::MIN, f64::max);
                let best = points.iter().map(|p| p[axis]).fold(f64::MAX, f64::min);
                // Halves first: `worst - best` overflows for values near ±f64::MAX.
                let margin = if worst > best {
                    0.2 * (worst / 2.0 - best / 2.0)
                } else if worst != 0.0 {
                    0.1 * worst.abs()
                } else {
                    1.0
                };
                // Clamped so the reference stays finite (a sum past f64::MAX would
                // make the whole front unreportable).
                (worst + margin).min(f64::MAX)
            })
            .collect(),
    )
}

/// Indices of the non-dominated `points` (all minimised), in input order, in
/// O(n log n) for two objectives and O(n·front) otherwise: in lexicographic
/// order no point is dominated by a later one, so each is checked against the
/// front so far only.
fn front_indices(points: &[Vec<f64>]) -> Vec<usize> {
    let mut order: Vec<usize> = (0..points.len()).collect();
    order.sort_by(|left, right| {
        points[*left]
            .iter()
            .zip(&points[*right])
            .map(|(l, r)| l.total_cmp(r))
            .find(|ordering| ordering.is_ne())
            .unwrap_or(std::cmp::Ordering::Equal)
    });
    let mut front: Vec<usize> = Vec::new();
    if points.first().is_some_and(|point| point.len() == 2) {
        // By first objective, then second: a point is on the front when its
        // second objective beats every earlier one's, or it repeats the last kept.
        let mut lowest = f64::INFINITY;
        for idx in order {
            let point = &points[idx];
            let repeat = front.last().is_some_and(|last| points[*last] == *point);
            if point[1] < lowest || repeat {
                lowest = lowest.min(point[1]);
                front.push(idx);
            }
        }
    } else {
        for idx in order {
            if !front
                .iter()
                .any(|kept| dominates(&points[*kept], &points[idx]))
            {
                front.push(idx);
            }
        }
    }
    front.sort_unstable();
    front
}

/// The hypervolume of a front (mutually non-dominated, minimised) against
/// `reference` and each member's contribution; NaN where [`MAX_SLICING_WORK`]
/// forbids the work.
fn volume_and_contributions(
    front: &[Vec<f64>],
    reference: &[f64],
) -> Result<(f64, Vec<f64>), ParetoError> {
    // Validates points and reference as the general functions do.
    pareto_validate(front, reference)?;
    if reference.len() == 2 {
        return Ok(staircase(front, reference));
    }
    let size = front.len().max(2) as f64;
    let work = size.powi(reference.len() as i32 - 1) * size.log2();
    let volume = if work <= MAX_SLICING_WORK {
        hypervolume(front, reference)?
    } else {
        f64::NAN
    };
    let contributions = if work * size <= MAX_SLICING_WORK {
        hypervolume_contributions(front, reference)?
    } else {
        vec![f64::NAN; front.len()]
    };
    Ok((volume, contributions))
}

/// What `pareto::hypervolume` checks, without computing it.
fn pareto_validate(points: &[Vec<f64>], reference: &[f64]) -> Result<(), ParetoError> {
    hypervolume(&[], reference)?;
    for (index, point) in points.iter().enumerate() {
        if point.len() != reference.len() {
            return Err(ParetoError::Length {
                index,
                found: point.len(),
                expected: reference.len(),
            });
        }
        if !point.iter().all(|value| value.is_finite()) {
            return Err(ParetoError::NotFinite { index });
        }
    }
    Ok(())
}

/// Two objectives: the front sorted by the first is a staircase, so the volume
/// and each member's exclusive rectangle come from its neighbours (a repeated
/// point adds nothing on its own; points not beating the reference add nothing).
fn staircase(front: &[Vec<f64>], reference: &[f64]) -> (f64, Vec<f64>) {
    let mut inside: Vec<usize> = (0..front.len())
        .filter(|idx| front[*idx][0] < reference[0] && front[*idx][1] < reference[1])
        .collect();
    inside.sort_by(|left, right| front[*left][0].total_cmp(&front[*right][0]));
    let mut contributions = vec![0.0; front.len()];
    let mut volume = 0.0;
    for (pos, idx) in inside.iter().enumerate() {
        let point = &front[*idx];
        let repeats = |other: Option<&usize>| other.is_some_and(|other| front[*other] == *point);
        if repeats(pos.checked_sub(1).map(|prev| &inside[prev])) {
            continue;
        }
        let next_x = inside[pos + 1..]
            .iter()
            .map(|next| front[*next][0])
            .find(|x| *x > point[0])
            .unwrap_or(reference[0]);
        let prev_y = pos
            .checked_sub(1)
            .map_or(reference[1], |prev| front[inside[prev]][1]);
        volume += (next_x - point[0]) * (reference[1] - point[1]);
        if !repeats(inside.get(pos + 1)) {
            contributions[*idx] = (next_x - point[0]) * (prev_y - point[1]);
        }
    }
    (volume, contributions)
}

/// The front of `candidates` (a key and one value per objective, `None` where the
/// objective was not reported), where `maximize[i]` says whether larger is better
/// for objective `i`, against `reference` (the metrics' own units) or the default.
pub fn summarize_front<K: Clone>(
    candidates: &[(K, Vec<Option<f64>>)],
    maximize: &[bool],
    reference: Option<&[f64]>,
) -> Result<FrontSummary<K>, ParetoError> {
    let objectives = maximize.len();
    let signs: Vec<f64> = maximize
        .iter()
        .map(|max| if *max { -1.0 } else { 1.0 })
        .collect();
    let eligible: Vec<(&K, Vec<f64>)> = candidates
        .iter()
        .filter_map(|(key, values)| {
            let complete: Option<Vec<f64>> = (values.len() == objectives)
                .then(|| values.iter().map(|value| value.filter(|v| v.is_finite())))
                .and_then(|values| values.collect());
            complete.map(|values| (key, values))
        })
        .collect();
    let minimised: Vec<Vec<f64>> = eligible
        .iter()
        .map(|(_, values)| values.iter().zip(&signs).map(|(v, s)| v * s).collect())
        .collect();
    let reference_min = match reference {
        Some(declared) => Some(declared.iter().zip(&signs).map(|(v, s)| v * s).collect()),
        None => default_reference(&minimised, objectives),
    };
    let front_idx = front_indices(&minimised);
    let front_points: Vec<Vec<f64>> = front_idx
        .iter()
        .map(|idx| minimised[*idx].clone())
        .collect();
    let (volume, contributions) = match &reference_min {
        Some(reference_min) => volume_and_contributions(&front_points, reference_min)?,
        None => (0.0, vec![0.0; front_points.len()]),
    };
    let mut front: Vec<FrontPoint<K>> = front_idx
        .iter()
        .zip(contributions)
        .map(|(idx, contribution)| FrontPoint {
            key: eligible[*idx].0.clone(),
            values: eligible[*idx].1.clone(),
            contribution,
        })
        .collect();
    // A stable sort keeps input order among equal contributions.
    front.sort_by(|left, right| right.contribution.total_cmp(&left.contribution));
    Ok(FrontSummary {
        reference: reference_min
            .map(|point: Vec<f64>| point.iter().zip(&signs).map(|(v, s)| v * s).collect()),
        reference_declared: reference.is_some(),
        hypervolume: volume,
        evaluated: eligible.len(),
        front,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn close(left: f64, right: f64) -> bool {
        (left - right).abs() < 1e-9
    }

    #[test]
    fn a_derived_reference_stays_finite_at_the_ends_of_the_range() {
        // `worst - best` and `worst + margin` both overflow to infinity here,
        // which would make the reference invalid and the front unreportable.
        let candidates = vec![
            (0, vec![Some(1e308), Some(-1e308)]),
            (1, vec![Some(-1e308), Some(1e308)]),
        ];
        let summary = summarize_front(&candidates, &[false, false], None).unwrap();
        let reference = summary.reference.as_deref().unwrap();
        assert!(
            reference.iter().all(|value| value.is_finite()),
            "{reference:?}"
        );
        assert_eq!(summary.front.len(), 2);
    }

    #[test]
    fn the_front_of_known_trials_and_its_hypervolume() {
        // Objectives: accuracy (max) and latency (min). Trial 3 is dominated by
        // trial 1; trial 4 misses latency; trial 5 has a NaN.
        let candidates = vec![
            (0, vec![Some(0.9), Some(30.0)]),
            (1, vec![Some(0.8), Some(10.0)]),
            (2, vec![Some(0.6), Some(5.0)]),
            (3, vec![Some(0.7), Some(20.0)]),
            (4, vec![Some(0.99), None]),
            (5, vec![Some(f64::NAN), Some(1.0)]),
        ];
        let summary = summarize_front(&candidates, &[true, false], Some(&[0.5, 40.0])).unwrap();
        assert_eq!(summary.evaluated, 4);
        assert!(summary.reference_declared);
        let mut keys: Vec<i32> = summary.front.iter().map(|point| point.key).collect();
        keys.sort_unstable();
        assert_eq!(keys, vec![0, 1, 2]);
        // By hand, slicing accuracy above the reference's 0.5, each slice's
        // latency gain below 40: (0.8, 0.9] × 10 + (0.6, 0.8] × 30 + (0.5, 0.6] × 35.
        let expected = 0.1 * 10.0 + 0.2 * 30.0 + 0.1 * 35.0;
        assert!(
            close(summary.hypervolume, expected),
            "{}",
            summary.hypervolume
        );
        // What each alone covers: trial 0 the slice (0.8, 0.9] × 10; trial 1
        // (0.6, 0.8] × latency 10 to 30; trial 2 (0.5, 0.6] × latency 5 to 10.
        let by_key = |key: i32| {
            summary
                .front
                .iter()
                .find(|point| point.key == key)
                .unwrap()
                .contribution
        };
        assert!(close(by_key(0), 0.1 * 10.0), "{}", by_key(0));
        assert!(close(by_key(1), 0.2 * 20.0), "{}", by_key(1));
        assert!(close(by_key(2), 0.1 * 5.0), "{}", by_key(2));
        // Largest contribution first.
        let order: Vec<i32> = summary.front.iter().map(|point| point.key).collect();
        assert_eq!(order, vec![1, 0, 2]);
        assert_eq!(summary.front[0].values, vec![0.8, 10.0]);
        assert_eq!(summary.reference, Some(vec![0.5, 40.0]));
    }

    #[test]
    fn the_fast_front_and_staircase_match_the_general_functions() {
        use rand::{Rng, SeedableRng};
        let mut rng = rand::rngs::StdRng::seed_from_u64(7);
        for case in 0..400 {
            let objectives = 2 + case % 2;
            let n = 1 + case % 23;
            // Coarse values, so ties and repeated points are common.
            let points: Vec<Vec<f64>> = (0..n)
                .map(|_| {
                    (0..objectives)
                        .map(|_| f64::from(rng.random_range(0..6_u8)) / 2.0)
                        .collect()
                })
                .collect();
            let front = front_indices(&points);
            assert_eq!(
                front,
                super::super::pareto::pareto_front(&points),
                "{points:?}"
            );
            let members: Vec<Vec<f64>> = front.iter().map(|idx| points[*idx].clone()).collect();
            let reference = vec![2.2; objectives];
            let (volume, contributions) = volume_and_contributions(&members, &reference).unwrap();
            assert!(close(volume, hypervolume(&members, &reference).unwrap()));
            let expected = hypervolume_contributions(&members, &reference).unwrap();
            for (got, want) in contributions.iter().zip(&expected) {
                assert!(
                    close(*got, *want),
                    "{members:?}: {contributions:?} {expected:?}"
                );
            }
        }
    }

    #[test]
    fn large_fronts_of_four_objectives_skip_the_slicing() {
        // Points on the plane x0 + x1 + x2 + x3 = 1: all mutually non-dominated.
        let candidates: Vec<(usize, Vec<Option<f64>>)> = (0..200)
            .map(|i| {
                let t = f64::from(i as u16) / 200.0;
                let values = vec![t, 1.0 - t, t * (1.0 - t), 0.5 - t * (1.0 - t)];
                (i, values.into_iter().map(Some).collect())
            })
            .collect();
        let summary = summarize_front(&candidates, &[false; 4], None).unwrap();
        assert!(summary.front.len() > 100);
        assert!(summary.hypervolume.is_nan());
        assert!(
            summary
                .front
                .iter()
                .all(|point| point.contribution.is_nan())
        );
        // A small one is exact.
        let small = summarize_front(&candidates[..10], &[false; 4], None).unwrap();
        assert!(small.hypervolume > 0.0);
    }

    #[test]
    fn the_default_reference_lies_beyond_the_worst_values() {
        // x and 1 − x, both minimised: every point is on the front.
        let candidates: Vec<(usize, Vec<Option<f64>>)> = (0..=4)
            .map(|i| {
                let x = f64::from(i as u8) / 4.0;
                (i, vec![Some(x), Some(1.0 - x)])
            })
            .collect();
        let summary = summarize_front(&candidates, &[false, false], None).unwrap();
        assert!(!summary.reference_declared);
        assert_eq!(summary.front.len(), 5);
        let reference = summary.reference.clone().unwrap();
        assert!(close(reference[0], 1.1) && close(reference[1], 1.1));
        // The staircase under (1.1, 1.1): 1.1² minus what lies above the steps.
        let mut expected = 0.0;
        let xs = [0.0, 0.25, 0.5, 0.75, 1.0, 1.1];
        for idx in 0..5 {
            expected += (xs[idx + 1] - xs[idx]) * (1.1 - (1.0 - xs[idx]));
        }
        assert!(
            close(summary.hypervolume, expected),
            "{}",
            summary.hypervolume
        );
        // Maximised objectives get the reference below their worst value.
        let flipped = summarize_front(&candidates, &[true, true], None).unwrap();
        let reference = flipped.reference.unwrap();
        assert!(close(reference[0], -0.1) && close(reference[1], -0.1));
        // Nothing evaluated: no default reference, an empty front.
        let none: Vec<(usize, Vec<Option<f64>>)> = vec![(0, vec![Some(1.0), None])];
        let empty = summarize_front(&none, &[false, false], None).unwrap();
        assert_eq!(empty.reference, None);
        assert_eq!(empty.evaluated, 0);
        assert!(empty.front.is_empty());
        assert_eq!(empty.hypervolume, 0.0);
    }
}
