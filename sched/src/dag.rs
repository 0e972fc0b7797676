//! Directed acyclic graphs of dependent work: topological order, cycle naming,
//! the critical path and per-node slack, and a duration estimator.
//!
//! Pure maths shared by the head's pipelines (which boost the stages on the
//! longest remaining path) and by `xp sim`'s pipeline workloads (which measure
//! that boost). Nodes are indices `0..n`; `needs[i]` lists the nodes that must
//! finish before node `i` may start.
//!
//! The critical path here assumes unlimited capacity: a node starts the moment
//! everything it needs is done. It is the lower bound on the time left, and the
//! chain that bounds it is the work worth starting first; it does not model
//! queueing behind other work.
//!
//! Invariants (proptested below): the remaining time equals the longest path by
//! brute force; every slack is at least 0 and is 0 on the critical path; a graph
//! with a cycle is always refused with the nodes of one cycle.

use std::cmp::Reverse;
use std::collections::BinaryHeap;

/// One node of a DAG as the critical-path computation sees it.
#[derive(Debug, Clone, PartialEq)]
pub struct DagNode {
    /// The nodes that must finish before this one starts.
    pub needs: Vec<usize>,
    /// The estimated duration of the whole node, in seconds.
    pub estimate_s: f64,
    /// How far it has got.
    pub state: NodeProgress,
}

/// How far one node has got.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum NodeProgress {
    /// Finished (succeeded or reused): takes no more time.
    Done,
    /// Started `elapsed_s` seconds ago: takes `max(estimate - elapsed, 0)` more.
    Running {
        /// Seconds since it started.
        elapsed_s: f64,
    },
    /// Not started: takes its whole estimate.
    Waiting,
}

/// Why a graph was refused.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum DagError {
    /// The graph has a cycle. The indices are one cycle in execution order:
    /// each needs the one before it, and the first needs the last; the list
    /// starts at the cycle's smallest index.
    #[error("dependency cycle through nodes {0:?}")]
    Cycle(Vec<usize>),
    /// A node needs an index that is not in the graph.
    #[error("node {node} needs node {need}, which does not exist")]
    UnknownNeed {
        /// The node with the bad dependency.
        node: usize,
        /// The index it names.
        need: usize,
    },
    /// A duration or elapsed time is negative, infinite or NaN.
    #[error("node {node} has a bad time {value} (must be finite and at least 0)")]
    BadTime {
        /// The node.
        node: usize,
        /// The offending value.
        value: f64,
    },
}

/// The result of [`critical_path`].
#[derive(Debug, Clone, PartialEq)]
pub struct CriticalPath {
    /// The not-done nodes on one longest remaining path, in execution order
    /// (ties go to the smallest index). Empty when everything is done.
    pub path: Vec<usize>,
    /// The estimated time to finish everything, in seconds, with unlimited
    /// capacity: the length of the longest remaining path.
    pub remaining_s: f64,
    /// Per node, how many seconds it may be delayed without delaying the
    /// finish: 0 on every critical path and for done nodes, never negative.
    pub slack_s: Vec<f64>,
    /// Per node, whether it is not done and has no slack (it lies on some
    /// longest remaining path, not only on `path`).
    pub on_critical: Vec<bool>,
}

/// Orders the nodes so that every node comes after everything it needs.
///
/// Among nodes ready at the same time the smallest index goes first, so the
/// order is a pure function of `needs`. Duplicate needs are allowed.
pub fn topo_order(needs: &[Vec<usize>]) -> Result<Vec<usize>, DagError> {
    let count = needs.len();
    let mut pending = vec![0usize; count];
    let mut dependents: Vec<Vec<usize>> = vec![Vec::new(); count];
    for (node, node_needs) in needs.iter().enumerate() {
        for &need in node_needs {
            if need >= count {
                return Err(DagError::UnknownNeed { node, need });
            }
            pending[node] += 1;
            dependents[need].push(node);
        }
    }
    let mut ready: BinaryHeap<Reverse<usize>> = (0..count)
        .filter(|&node| pending[node] == 0)
        .map(Reverse)
        .collect();
    let mut order = Vec::with_capacity(count);
    while let Some(Reverse(node)) = ready.pop() {
        order.push(node);
        for &dependent in &dependents[node] {
            pending[dependent] -= 1;
            if pending[dependent] == 0 {
                ready.push(Reverse(dependent));
            }
        }
    }
    if order.len() == count {
        return Ok(order);
    }
    Err(DagError::Cycle(find_cycle(needs, &pending)))
}

/// Names one cycle among the nodes Kahn's algorithm could not order.
///
/// Every such node still waits on at least one need that is itself unordered,
/// so following those needs from any of them must come back to a node already
/// seen: the nodes from that node's first visit on form a cycle.
fn find_cycle(needs: &[Vec<usize>], pending: &[usize]) -> Vec<usize> {
    let stuck = |node: usize| pending[node] > 0;
    let start = (0..needs.len())
        .find(|&node| stuck(node))
        .expect("an unordered node exists when the order is short");
    let mut seen_at = vec![usize::MAX; needs.len()];
    let mut walk = Vec::new();
    let mut node = start;
    while seen_at[node] == usize::MAX {
        seen_at[node] = walk.len();
        walk.push(node);
        node = *needs[node]
            .iter()
            .find(|&&need| stuck(need))
            .expect("an unordered node waits on an unordered need");
    }
    // The walk follows needs, so it runs against execution order: reverse it.
    let mut cycle: Vec<usize> = walk[seen_at[node]..].iter().rev().copied().collect();
    let smallest = cycle
        .iter()
        .enumerate()
        .min_by_key(|&(_, &node)| node)
        .map(|(position, _)| position)
        .expect("a cycle has at least one node");
    cycle.rotate_left(smallest);
    cycle
}

/// The time a node still takes, in seconds.
fn remaining_of(index: usize, node: &DagNode) -> Result<f64, DagError> {
    let check = |value: f64| {
        if value.is_finite() && value >= 0.0 {
            Ok(value)
        } else {
            Err(DagError::BadTime { node: index, value })
        }
    };
    let estimate = check(node.estimate_s)?;
    Ok(match node.state {
        NodeProgress::Done => 0.0,
        NodeProgress::Running { elapsed_s } => (estimate - check(elapsed_s)?).max(0.0),
        NodeProgress::Waiting => estimate,
    })
}

/// Computes the longest remaining path, the time left and every node's slack.
///
/// Done nodes take no time but still pass their dependencies through (a done
/// node that needs an unfinished one is taken at its word: its dependents wait
/// for nothing more from it than from its needs).
pub fn critical_path(nodes: &[DagNode]) -> Result<CriticalPath, DagError> {
    let needs: Vec<Vec<usize>> = nodes.iter().map(|node| node.needs.clone()).collect();
    let order = topo_order(&needs)?;
    let remaining = nodes
        .iter()
        .enumerate()
        .map(|(index, node)| remaining_of(index, node))
        .collect::<Result<Vec<f64>, DagError>>()?;

    // Earliest finish: a node finishes its remaining time after its last need.
    let earliest_finish = earliest_finishes(&order, &needs, &remaining);
    let remaining_s = earliest_finish.iter().copied().fold(0.0, f64::max);
    // Latest finish that does not delay the whole.
    let latest_finish = latest_finishes(&order, &needs, &remaining, remaining_s);
    // Additions in a different order round differently; a slack this close to
    // zero is zero.
    let tolerance = 1e-9 * remaining_s.max(1.0);
    let (slack_s, on_critical) = slacks(nodes, &earliest_finish, &latest_finish, tolerance);
    let path = longest_path(
        nodes,
        &Timing {
            needs: &needs,
            remaining: &remaining,
            earliest_finish: &earliest_finish,
            remaining_s,
            tolerance,
        },
    );
    Ok(CriticalPath {
        path,
        remaining_s,
        slack_s,
        on_critical,
    })
}

/// Each node's earliest finish: its remaining time after its last need's.
fn earliest_finishes(order: &[usize], needs: &[Vec<usize>], remaining: &[f64]) -> Vec<f64> {
    let mut earliest_finish = vec![0.0f64; needs.len()];
    for &node in order {
        let start = needs[node]
            .iter()
            .map(|&need| earliest_finish[need])
            .fold(0.0, f64::max);
        earliest_finish[node] = start + remaining[node];
    }
    earliest_finish
}

/// Each node's latest finish that does not delay the whole (`remaining_s`):
/// the earliest latest start of its dependents, or the finish itself for a
/// node nothing needs.
fn latest_finishes(
    order: &[usize],
    needs: &[Vec<usize>],
    remaining: &[f64],
    remaining_s: f64,
) -> Vec<f64> {
    let mut latest_finish = vec![remaining_s; needs.len()];
    for &node in order.iter().rev() {
        let latest_start = latest_finish[node] - remaining[node];
        for &need in &needs[node] {
            latest_finish[need] = latest_finish[need].min(latest_start);
        }
    }
    latest_finish
}

/// Each unfinished node's slack, and whether it is on a critical path (its
/// slack within `tolerance` of zero, when it counts as zero).
fn slacks(
    nodes: &[DagNode],
    earliest_finish: &[f64],
    latest_finish: &[f64],
    tolerance: f64,
) -> (Vec<f64>, Vec<bool>) {
    let count = nodes.len();
    let mut slack_s = vec![0.0f64; count];
    let mut on_critical = vec![false; count];
    for node in 0..count {
        if nodes[node].state == NodeProgress::Done {
            continue;
        }
        let slack = latest_finish[node] - earliest_finish[node];
        if slack <= tolerance {
            on_critical[node] = true;
        } else {
            slack_s[node] = slack;
        }
    }
    (slack_s, on_critical)
}

/// What [`longest_path`] walks back through.
struct Timing<'a> {
    needs: &'a [Vec<usize>],
    remaining: &'a [f64],
    earliest_finish: &'a [f64],
    remaining_s: f64,
    tolerance: f64,
}

/// One longest path, walked back from the node that finishes last through,
/// at each step, the need that finishes exactly when the node can start.
fn longest_path(nodes: &[DagNode], timing: &Timing<'_>) -> Vec<usize> {
    let Timing {
        needs,
        remaining,
        earliest_finish,
        remaining_s,
        tolerance,
    } = *timing;
    let mut path = Vec::new();
    let last = (0..nodes.len())
        .filter(|&node| nodes[node].state != NodeProgress::Done)
        .filter(|&node| earliest_finish[node] >= remaining_s - tolerance)
        .min();
    if let Some(mut node) = last
        && remaining_s > 0.0
    {
        loop {
            if nodes[node].state != NodeProgress::Done {
                path.push(node);
            }
            let start = earliest_finish[node] - remaining[node];
            if start <= tolerance {
                break;
            }
            let previous = needs[node]
                .iter()
                .copied()
                .filter(|&need| earliest_finish[need] >= start - tolerance)
                .min();
            match previous {
                Some(need) => node = need,
                None => break,
            }
        }
        path.reverse();
    }
    path
}

/// Estimates a duration in seconds: the median of the history (durations of
/// earlier runs of the same work) when there is any, else the declared value.
///
/// Values that are negative, infinite or NaN are ignored, in the history and
/// in the declaration alike; `None` when nothing usable remains. The median,
/// not the mean, so that one run that hung or crashed early does not move it.
pub fn estimate_duration(history_s: &[f64], declared_s: Option<f64>) -> Option<f64> {
    let usable = |value: &f64| value.is_finite() && *value >= 0.0;
    let mut history: Vec<f64> = history_s.iter().copied().filter(usable).collect();
    if history.is_empty() {
        return declared_s.filter(usable);
    }
    history.sort_by(f64::total_cmp);
    let middle = history.len() / 2;
    Some(if history.len() % 2 == 1 {
        history[middle]
    } else {
        (history[middle - 1] + history[middle]) / 2.0
    })
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    fn waiting(needs: &[usize], estimate_s: f64) -> DagNode {
        DagNode {
            needs: needs.to_vec(),
            estimate_s,
            state: NodeProgress::Waiting,
        }
    }

    fn with_state(mut node: DagNode, state: NodeProgress) -> DagNode {
        node.state = state;
        node
    }

    #[test]
    fn topo_order_puts_needs_first_and_prefers_small_indices() {
        let needs = vec![vec![2], vec![], vec![1], vec![]];
        assert_eq!(topo_order(&needs).unwrap(), vec![1, 2, 0, 3]);
        assert_eq!(topo_order(&[]).unwrap(), Vec::<usize>::new());
        // Duplicate needs count once each way and do not block the order.
        assert_eq!(topo_order(&[vec![], vec![0, 0]]).unwrap(), vec![0, 1]);
    }

    #[test]
    fn unknown_needs_and_cycles_are_named() {
        assert_eq!(
            topo_order(&[vec![], vec![5]]),
            Err(DagError::UnknownNeed { node: 1, need: 5 })
        );
        assert_eq!(topo_order(&[vec![0]]), Err(DagError::Cycle(vec![0])));
        // 1 needs 3, 3 needs 2 and 2 needs 1: in execution order (each needs
        // the one before it) that is 1, 2, 3.
        let needs = vec![vec![], vec![3, 0], vec![1], vec![2], vec![3]];
        assert_eq!(topo_order(&needs), Err(DagError::Cycle(vec![1, 2, 3])));
    }

    #[test]
    fn chain_beside_short_branch() {
        // 0 -> 1 -> 2 (3 + 4 + 5 s) beside 3 (2 s), joined by 4 (1 s).
        let nodes = vec![
            waiting(&[], 3.0),
            waiting(&[0], 4.0),
            waiting(&[1], 5.0),
            waiting(&[], 2.0),
            waiting(&[2, 3], 1.0),
        ];
        let result = critical_path(&nodes).unwrap();
        assert_eq!(result.path, vec![0, 1, 2, 4]);
        assert_eq!(result.remaining_s, 13.0);
        assert_eq!(result.slack_s, vec![0.0, 0.0, 0.0, 10.0, 0.0]);
        assert_eq!(result.on_critical, vec![true, true, true, false, true]);
    }

    #[test]
    fn progress_shortens_the_path_and_can_move_it() {
        let nodes = vec![
            with_state(waiting(&[], 3.0), NodeProgress::Done),
            with_state(
                waiting(&[0], 10.0),
                NodeProgress::Running { elapsed_s: 8.0 },
            ),
            waiting(&[], 4.0),
            // Past its estimate: takes nothing more, never a negative time.
            with_state(waiting(&[], 1.0), NodeProgress::Running { elapsed_s: 9.0 }),
        ];
        let result = critical_path(&nodes).unwrap();
        assert_eq!(result.path, vec![2]);
        assert_eq!(result.remaining_s, 4.0);
        assert_eq!(result.slack_s, vec![0.0, 2.0, 0.0, 4.0]);
        assert_eq!(result.on_critical, vec![false, false, true, false]);

        let all_done = vec![with_state(waiting(&[], 3.0), NodeProgress::Done)];
        let result = critical_path(&all_done).unwrap();
        assert!(result.path.is_empty());
        assert_eq!(result.remaining_s, 0.0);
        assert_eq!(result.on_critical, vec![false]);
    }

    #[test]
    fn bad_times_are_refused() {
        assert_eq!(
            critical_path(&[waiting(&[], f64::NAN)])
                .map(|_| ())
                .unwrap_err()
                .to_string(),
            "node 0 has a bad time NaN (must be finite and at least 0)"
        );
        let running = with_state(waiting(&[], 1.0), NodeProgress::Running { elapsed_s: -1.0 });
        assert!(matches!(
            critical_path(&[waiting(&[], 1.0), running]),
            Err(DagError::BadTime { node: 1, .. })
        ));
    }

    #[test]
    fn estimates_are_the_median_of_history_else_declared() {
        assert_eq!(estimate_duration(&[5.0, 1.0, 100.0], Some(7.0)), Some(5.0));
        assert_eq!(estimate_duration(&[4.0, 2.0], None), Some(3.0));
        assert_eq!(estimate_duration(&[], Some(7.0)), Some(7.0));
        assert_eq!(estimate_duration(&[f64::NAN, -1.0], Some(7.0)), Some(7.0));
        assert_eq!(estimate_duration(&[], Some(f64::INFINITY)), None);
        assert_eq!(estimate_duration(&[], None), None);
    }

    /// Every path's length by enumeration: the longest from any start, and for
    /// each node the longest through it.
    fn brute_force(nodes: &[DagNode], remaining: &[f64]) -> (f64, Vec<f64>) {
        let count = nodes.len();
        let mut longest = 0.0f64;
        let mut through = vec![0.0f64; count];
        // Paths run from a node along dependents; enumerate them from each end.
        fn extend(
            nodes: &[DagNode],
            remaining: &[f64],
            path: &mut Vec<usize>,
            length: f64,
            longest: &mut f64,
            through: &mut [f64],
        ) {
            let last = *path.last().unwrap();
            let dependents: Vec<usize> = (0..nodes.len())
                .filter(|&other| nodes[other].needs.contains(&last))
                .collect();
            if dependents.is_empty() {
                *longest = longest.max(length);
                for &node in path.iter() {
                    through[node] = through[node].max(length);
                }
            }
            for dependent in dependents {
                path.push(dependent);
                let next = length + remaining[dependent];
                extend(nodes, remaining, path, next, longest, through);
                path.pop();
            }
        }
        for start in 0..count {
            if nodes[start].needs.is_empty() {
                let mut path = vec![start];
                extend(
                    nodes,
                    remaining,
                    &mut path,
                    remaining[start],
                    &mut longest,
                    &mut through,
                );
            }
        }
        (longest, through)
    }

    /// A random DAG on up to 8 nodes, its indices shuffled so that needs point
    /// both up and down, with a mix of progress states.
    fn arb_dag() -> impl Strategy<Value = Vec<DagNode>> {
        (1usize..=8)
            .prop_flat_map(|count| {
                (
                    proptest::collection::vec(
                        proptest::collection::vec(any::<bool>(), count),
                        count,
                    ),
                    proptest::collection::vec((0u32..20, 0u8..3, 0u32..20), count),
                    Just((0..count).collect::<Vec<usize>>()).prop_shuffle(),
                )
            })
            .prop_map(|(edges, times, permutation)| {
                let count = times.len();
                (0..count)
                    .map(|rank| {
                        let needs = (0..rank)
                            .filter(|&earlier| edges[rank][earlier])
                            .map(|earlier| permutation[earlier])
                            .collect();
                        let (estimate, state, elapsed) = times[rank];
                        let state = match state {
                            0 => NodeProgress::Waiting,
                            1 => NodeProgress::Running {
                                elapsed_s: f64::from(elapsed),
                            },
                            _ => NodeProgress::Done,
                        };
                        (
                            permutation[rank],
                            DagNode {
                                needs,
                                estimate_s: f64::from(estimate) / 2.0,
                                state,
                            },
                        )
                    })
                    .fold(vec![None; count], |mut slots, (index, node)| {
                        slots[index] = Some(node);
                        slots
                    })
                    .into_iter()
                    .map(Option::unwrap)
                    .collect()
            })
    }

    proptest! {
        #[test]
        fn critical_path_matches_brute_force(nodes in arb_dag()) {
            let result = critical_path(&nodes).unwrap();
            let remaining: Vec<f64> = nodes
                .iter()
                .enumerate()
                .map(|(index, node)| remaining_of(index, node).unwrap())
                .collect();
            let (longest, through) = brute_force(&nodes, &remaining);
            prop_assert!((result.remaining_s - longest).abs() < 1e-9);
            for (node, dag_node) in nodes.iter().enumerate() {
                let slack = result.slack_s[node];
                prop_assert!(slack >= 0.0);
                if dag_node.state == NodeProgress::Done {
                    prop_assert_eq!(slack, 0.0);
                    prop_assert!(!result.on_critical[node]);
                } else {
                    prop_assert!((slack - (longest - through[node])).abs() < 1e-9);
                    prop_assert_eq!(result.on_critical[node], slack == 0.0);
                }
            }
            // The path is a real chain of not-done nodes whose times add up to
            // the whole (done nodes between them take no time).
            let length: f64 = result.path.iter().map(|&node| remaining[node]).sum();
            if longest > 0.0 {
                prop_assert!((length - longest).abs() < 1e-9);
            }
            let order = topo_order(&nodes.iter().map(|n| n.needs.clone()).collect::<Vec<_>>()).unwrap();
            let position = |node: usize| order.iter().position(|&other| other == node).unwrap();
            for pair in result.path.windows(2) {
                prop_assert!(position(pair[0]) < position(pair[1]));
            }
            for &node in &result.path {
                prop_assert!(result.on_critical[node]);
                prop_assert!(nodes[node].state != NodeProgress::Done);
            }
        }

        #[test]
        fn a_cycle_is_always_found_and_named(nodes in arb_dag(), pick in any::<(usize, usize)>()) {
            let mut needs: Vec<Vec<usize>> = nodes.iter().map(|node| node.needs.clone()).collect();
            prop_assert!(topo_order(&needs).is_ok());
            // Close a cycle: some node reachable upstream of `a` now needs `a`.
            let count = needs.len();
            let a = pick.0 % count;
            let mut upstream = vec![a];
            let mut index = 0;
            while index < upstream.len() {
                for &need in &needs[upstream[index]] {
                    if !upstream.contains(&need) {
                        upstream.push(need);
                    }
                }
                index += 1;
            }
            let b = upstream[pick.1 % upstream.len()];
            needs[b].push(a);
            let Err(DagError::Cycle(cycle)) = topo_order(&needs) else {
                return Err(TestCaseError::fail("the cycle was not found"));
            };
            prop_assert!(!cycle.is_empty());
            prop_assert_eq!(cycle[0], *cycle.iter().min().unwrap());
            for position in 0..cycle.len() {
                let before = cycle[(position + cycle.len() - 1) % cycle.len()];
                prop_assert!(needs[cycle[position]].contains(&before));
            }
            let nodes: Vec<DagNode> = needs
                .into_iter()
                .map(|needs| DagNode { needs, estimate_s: 1.0, state: NodeProgress::Waiting })
                .collect();
            prop_assert!(matches!(critical_path(&nodes), Err(DagError::Cycle(_))));
        }
    }
}
