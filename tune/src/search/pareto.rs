//! Pareto fronts and hypervolumes of multi-objective results; pure functions.
//!
//! Every objective is minimised (callers negate `mode: max` ones, as for single
//! objectives). [`non_dominated_sort`] ranks points into fronts (Deb's fast
//! non-dominated sort, O(m·n²)); [`hypervolume`] measures the region a set of points
//! dominates below a reference point: a sweep for two objectives (O(n log n)) and
//! exact slicing over the last objective for three and four (Hypervolume by Slicing
//! Objectives, O(n^(m−1) log n)), which is ample for the few hundred trials of a
//! sweep. Points that do not strictly beat the reference in every objective add
//! nothing. Inputs are validated: at most [`MAX_OBJECTIVES`] objectives, every point
//! of the same length as the reference, every value finite.

use thiserror::Error;

/// The most objectives a multi-objective search may have.
pub const MAX_OBJECTIVES: usize = 4;

/// Why a front or hypervolume cannot be computed.
#[derive(Debug, Clone, PartialEq, Error)]
pub enum ParetoError {
    /// No objectives, or more than [`MAX_OBJECTIVES`].
    #[error("{0} objectives: a multi-objective result has 1 to {MAX_OBJECTIVES}")]
    Objectives(usize),
    /// A point's length differs from the reference's.
    #[error("point {index} has {found} objectives, the reference {expected}")]
    Length {
        /// The point's position in the input.
        index: usize,
        /// Its number of objectives.
        found: usize,
        /// The reference's.
        expected: usize,
    },
    /// A NaN or infinite value.
    #[error("point {index} has a non-finite objective")]
    NotFinite {
        /// The point's position in the input (the reference is `usize::MAX`).
        index: usize,
    },
}

/// Whether `left` Pareto-dominates `right`: no worse in every objective, better in one.
pub fn dominates(left: &[f64], right: &[f64]) -> bool {
    left.iter().zip(right).all(|(l, r)| l <= r) && left.iter().zip(right).any(|(l, r)| l < r)
}

/// Indices of `points` by front: the first holds the non-dominated points, the second
/// those dominated only by the first, and so on; within a front, in input order.
pub fn non_dominated_sort(points: &[Vec<f64>]) -> Vec<Vec<usize>> {
    let n = points.len();
    let mut dominated_by_count = vec![0usize; n];
    let mut dominates_list: Vec<Vec<usize>> = vec![Vec::new(); n];
    for left in 0..n {
        for right in (left + 1)..n {
            if dominates(&points[left], &points[right]) {
                dominates_list[left].push(right);
                dominated_by_count[right] += 1;
            } else if dominates(&points[right], &points[left]) {
                dominates_list[right].push(left);
                dominated_by_count[left] += 1;
            }
        }
    }
    let mut fronts = Vec::new();
    let mut current: Vec<usize> = (0..n).filter(|idx| dominated_by_count[*idx] == 0).collect();
    while !current.is_empty() {
        let mut next = Vec::new();
        for idx in &current {
            for dominated in &dominates_list[*idx] {
                dominated_by_count[*dominated] -= 1;
                if dominated_by_count[*dominated] == 0 {
                    next.push(*dominated);
                }
            }
        }
        next.sort_unstable();
        fronts.push(std::mem::replace(&mut current, next));
    }
    fronts
}

/// Indices of the non-dominated points of `points`, in input order.
pub fn pareto_front(points: &[Vec<f64>]) -> Vec<usize> {
    (0..points.len())
        .filter(|idx| !points.iter().any(|other| dominates(other, &points[*idx])))
        .collect()
}

/// Checks `points` against `reference` (see [`ParetoError`]).
fn validate(points: &[Vec<f64>], reference: &[f64]) -> Result<(), ParetoError> {
    if reference.is_empty() || reference.len() > MAX_OBJECTIVES {
        return Err(ParetoError::Objectives(reference.len()));
    }
    if !reference.iter().all(|value| value.is_finite()) {
        return Err(ParetoError::NotFinite { index: usize::MAX });
    }
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

/// The volume of the region dominated by `points` and bounded by `reference`.
pub fn hypervolume(points: &[Vec<f64>], reference: &[f64]) -> Result<f64, ParetoError> {
    validate(points, reference)?;
    let inside: Vec<&[f64]> = points
        .iter()
        .filter(|point| {
            point
                .iter()
                .zip(reference)
                .all(|(value, limit)| value < limit)
        })
        .map(Vec::as_slice)
        .collect();
    Ok(slice_volume(&inside, reference))
}

/// How much each point adds to the hypervolume of the others (0 for dominated or
/// duplicated points): `hv(all) − hv(all but i)`.
pub fn hypervolume_contributions(
    points: &[Vec<f64>],
    reference: &[f64],
) -> Result<Vec<f64>, ParetoError> {
    let total = hypervolume(points, reference)?;
    Ok((0..points.len())
        .map(|skip| {
            let others: Vec<Vec<f64>> = points
                .iter()
                .enumerate()
                .filter(|(idx, _)| *idx != skip)
                .map(|(_, point)| point.clone())
                .collect();
            let without = hypervolume(&others, reference).unwrap_or(total);
            (total - without).max(0.0)
        })
        .collect())
}

/// Hypervolume of points that all strictly beat `reference`, in its dimension.
fn slice_volume(points: &[&[f64]], reference: &[f64]) -> f64 {
    let dims = reference.len();
    if points.is_empty() {
        return 0.0;
    }
    match dims {
        1 => {
            let best = points
                .iter()
                .map(|point| point[0])
                .fold(f64::INFINITY, f64::min);
            reference[0] - best
        }
        2 => {
            let mut sorted: Vec<&[f64]> = points.to_vec();
            sorted.sort_by(|left, right| left[0].total_cmp(&right[0]));
            let mut area = 0.0;
            let mut best_y = reference[1];
            for (idx, point) in sorted.iter().enumerate() {
                best_y = best_y.min(point[1]);
                let next_x = sorted.get(idx + 1).map_or(reference[0], |next| next[0]);
                area += (next_x - point[0]) * (reference[1] - best_y);
            }
            area
        }
        _ => {
            // Slice along the last objective: between consecutive values, the
            // cross-section is the (m−1)-dimensional volume of the points at or below.
            let last = dims - 1;
            let mut sorted: Vec<&[f64]> = points.to_vec();
            sorted.sort_by(|left, right| left[last].total_cmp(&right[last]));
            let mut volume = 0.0;
            for idx in 0..sorted.len() {
                let next = sorted
                    .get(idx + 1)
                    .map_or(reference[last], |next| next[last]);
                let height = next - sorted[idx][last];
                if height <= 0.0 {
                    continue;
                }
                let below: Vec<&[f64]> =
                    sorted[..=idx].iter().map(|point| &point[..last]).collect();
                volume += height * slice_volume(&below, &reference[..last]);
            }
            volume
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// Inclusion–exclusion over every subset: exact, exponential, for checking.
    fn brute_force(points: &[Vec<f64>], reference: &[f64]) -> f64 {
        let inside: Vec<&Vec<f64>> = points
            .iter()
            .filter(|point| point.iter().zip(reference).all(|(v, r)| v < r))
            .collect();
        let mut total = 0.0;
        for mask in 1u32..(1 << inside.len()) {
            let chosen: Vec<&Vec<f64>> = (0..inside.len())
                .filter(|bit| mask & (1 << bit) != 0)
                .map(|bit| inside[bit])
                .collect();
            let volume: f64 = (0..reference.len())
                .map(|axis| {
                    let corner = chosen
                        .iter()
                        .map(|p| p[axis])
                        .fold(f64::NEG_INFINITY, f64::max);
                    reference[axis] - corner
                })
                .product();
            total += if chosen.len() % 2 == 1 {
                volume
            } else {
                -volume
            };
        }
        total
    }

    #[test]
    fn two_objective_hypervolume_by_hand() {
        let points = vec![
            vec![1.0, 3.0],
            vec![2.0, 2.0],
            vec![3.0, 1.0],
            vec![3.0, 3.0],
        ];
        // Staircase under (4, 4): 3·1 + 2·1 + 1·1.
        assert_eq!(hypervolume(&points, &[4.0, 4.0]), Ok(6.0));
        assert_eq!(pareto_front(&points), vec![0, 1, 2]);
        assert_eq!(non_dominated_sort(&points), vec![vec![0, 1, 2], vec![3]]);
        assert_eq!(hypervolume(&[vec![5.0, 0.0]], &[4.0, 4.0]), Ok(0.0));
    }

    #[test]
    fn three_objective_hypervolume_by_hand() {
        let points = vec![vec![0.0, 0.0, 1.0], vec![1.0, 1.0, 0.0]];
        // A 2×2×1 box on top of z = 1, and a 1×1×2 column overlapping it by 1×1×1.
        assert_eq!(hypervolume(&points, &[2.0, 2.0, 2.0]), Ok(5.0));
        let contributions = hypervolume_contributions(&points, &[2.0, 2.0, 2.0]).unwrap();
        assert_eq!(contributions, vec![3.0, 1.0]);
    }

    #[test]
    fn bad_input_is_refused() {
        assert_eq!(hypervolume(&[], &[]), Err(ParetoError::Objectives(0)));
        assert_eq!(hypervolume(&[], &[1.0; 5]), Err(ParetoError::Objectives(5)));
        assert_eq!(
            hypervolume(&[vec![1.0]], &[1.0, 2.0]),
            Err(ParetoError::Length {
                index: 0,
                found: 1,
                expected: 2
            })
        );
        assert_eq!(
            hypervolume(&[vec![f64::NAN, 0.0]], &[1.0, 2.0]),
            Err(ParetoError::NotFinite { index: 0 })
        );
    }

    fn points_strategy() -> impl Strategy<Value = (usize, Vec<Vec<f64>>)> {
        (1usize..=4).prop_flat_map(|dims| {
            (
                Just(dims),
                proptest::collection::vec(
                    proptest::collection::vec((0u8..8).prop_map(f64::from), dims),
                    0..8,
                ),
            )
        })
    }

    proptest! {
        #[test]
        fn fronts_are_mutually_non_dominated_and_cover_every_point((_, points) in points_strategy()) {
            let fronts = non_dominated_sort(&points);
            let mut seen: Vec<usize> = fronts.iter().flatten().copied().collect();
            seen.sort_unstable();
            prop_assert_eq!(seen, (0..points.len()).collect::<Vec<_>>());
            for (rank, front) in fronts.iter().enumerate() {
                for left in front {
                    for right in front {
                        prop_assert!(!dominates(&points[*left], &points[*right]));
                    }
                    // Every later point is dominated by something in an earlier front.
                    if rank > 0 {
                        prop_assert!(fronts[rank - 1].iter().any(|better| dominates(&points[*better], &points[*left])));
                    }
                }
            }
            prop_assert_eq!(fronts.first().cloned().unwrap_or_default(), pareto_front(&points));
        }

        #[test]
        fn hypervolume_is_exact_and_monotone(
            (dims, points) in points_strategy(),
            extra in proptest::collection::vec((0u8..8).prop_map(f64::from), 4),
        ) {
            let reference = vec![7.0; dims];
            let volume = hypervolume(&points, &reference).unwrap();
            let expected = brute_force(&points, &reference);
            prop_assert!((volume - expected).abs() < 1e-9, "{} vs {}", volume, expected);
            let mut more = points.clone();
            more.push(extra[..dims].to_vec());
            prop_assert!(hypervolume(&more, &reference).unwrap() >= volume - 1e-9);
            // Only the front matters.
            let front: Vec<Vec<f64>> = pareto_front(&points).into_iter().map(|idx| points[idx].clone()).collect();
            prop_assert!((hypervolume(&front, &reference).unwrap() - volume).abs() < 1e-9);
        }
    }
}
