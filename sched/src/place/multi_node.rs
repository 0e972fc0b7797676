//! Gangs that no single node holds: the fewest nodes, of one rack when one
//! rack holds the gang; and spread gangs, one worker per node when there are
//! enough nodes.
//!
//! Every function here returns `(node index, workers)` pairs that add up to the
//! whole gang, or nothing; none of them allocates.

use std::cmp::Reverse;
use std::collections::BTreeMap;

use xp_runtime::seeded::SplitMix64;

use super::Strategy;
use super::search::Search;

/// A node that can hold at least one worker of a gang that needs several nodes.
#[derive(Debug, Clone, Copy)]
struct Candidate<'a> {
    idx: usize,
    /// Workers it holds, at most the gang's.
    fits: u64,
    free_gpu_milli: u64,
    rack: Option<&'a str>,
}

impl<'a> Search<'a> {
    /// Node `idx` as a candidate for some of the gang's workers, if it holds one.
    fn candidate(&self, idx: usize) -> Option<Candidate<'a>> {
        let fits = self.fits(idx);
        (fits > 0).then(|| {
            let view = self.view(idx);
            Candidate {
                idx,
                fits,
                free_gpu_milli: view.free().gpu_milli,
                rack: view.spec.labels.get("rack").map(String::as_str),
            }
        })
    }

    /// A gang no single node holds: the fewest nodes of one rack, else the fewest
    /// nodes anywhere (random: a random rack, then nodes in random order).
    pub(super) fn pack_over_nodes(
        &self,
        strategy: Strategy,
        rng: &mut SplitMix64,
    ) -> Option<Vec<(usize, u64)>> {
        let workers = self.demand.workers;
        let candidates: Vec<Candidate<'a>> = self
            .packed_order(1)
            .filter_map(|idx| self.candidate(idx))
            .collect();
        if total_fits(&candidates) < workers {
            return None;
        }
        let racks: Vec<Vec<Candidate<'a>>> = by_rack(&candidates)
            .into_values()
            .filter(|members| total_fits(members) >= workers)
            .collect();
        let random = matches!(strategy, Strategy::Random { .. });
        let chosen: &[Candidate<'a>] = if racks.is_empty() {
            &candidates
        } else if random {
            &racks[rng.index(racks.len())]
        } else {
            // The rack needing fewest nodes; then the fullest, keeping emptier
            // racks whole for bigger gangs.
            racks
                .iter()
                .min_by_key(|members| {
                    let free: u64 = members.iter().map(|member| member.free_gpu_milli).sum();
                    (fewest_nodes(members, workers).len(), free)
                })
                .expect("racks is not empty")
        };
        Some(if random {
            let mut shuffled = chosen.to_vec();
            rng.shuffle(&mut shuffled);
            fill_in_order(&shuffled, workers)
        } else {
            fewest_nodes(chosen, workers)
        })
    }

    /// A spread gang: one worker per node, within one rack if one has enough
    /// nodes (the first rack to have them, emptiest nodes first), else across
    /// racks; with too few nodes for that, workers go round the nodes (of one
    /// rack if it holds them), emptiest first. The walk stops at the first rack
    /// with enough nodes, so it visits every candidate only when none has.
    pub(super) fn spread_over_nodes(&self) -> Option<Vec<(usize, u64)>> {
        let workers = self.demand.workers;
        let one_each = |members: &[Candidate<'a>]| -> Vec<(usize, u64)> {
            members[..workers as usize]
                .iter()
                .map(|member| (member.idx, 1))
                .collect()
        };
        let mut candidates = Vec::new();
        let mut racks: BTreeMap<&'a str, Vec<Candidate<'a>>> = BTreeMap::new();
        for idx in self.spread_order(1) {
            let Some(candidate) = self.candidate(idx) else {
                continue;
            };
            candidates.push(candidate);
            if let Some(rack) = candidate.rack {
                let members = racks.entry(rack).or_default();
                members.push(candidate);
                if members.len() as u64 >= workers {
                    return Some(one_each(members));
                }
            }
        }
        if total_fits(&candidates) < workers {
            return None;
        }
        if candidates.len() as u64 >= workers {
            return Some(one_each(&candidates));
        }
        let members = racks
            .into_values()
            .filter(|members| total_fits(members) >= workers)
            .min_by_key(|members| {
                let free: u64 = members.iter().map(|member| member.free_gpu_milli).sum();
                (Reverse(members.len()), Reverse(free))
            })
            .unwrap_or(candidates);
        Some(round_robin(&members, workers))
    }
}

/// Workers the candidates hold together.
fn total_fits(candidates: &[Candidate<'_>]) -> u64 {
    candidates
        .iter()
        .map(|candidate| candidate.fits)
        .fold(0, u64::saturating_add)
}

/// Candidates with a `rack` label, grouped by it, each group in the given order.
fn by_rack<'a>(candidates: &[Candidate<'a>]) -> BTreeMap<&'a str, Vec<Candidate<'a>>> {
    let mut racks: BTreeMap<&'a str, Vec<Candidate<'a>>> = BTreeMap::new();
    for candidate in candidates {
        if let Some(rack) = candidate.rack {
            racks.entry(rack).or_default().push(*candidate);
        }
    }
    racks
}

/// The fewest nodes that hold `workers`: the nodes holding most until one node
/// holds the rest, then the node among the others that holds the rest most
/// tightly. Among nodes holding as many, the earlier in `candidates` (fuller,
/// in bin-pack order) goes first. `candidates` hold `workers` in total.
fn fewest_nodes(candidates: &[Candidate<'_>], workers: u64) -> Vec<(usize, u64)> {
    let mut by_fits = candidates.to_vec();
    // Stable: equal holders keep the bin-pack order.
    by_fits.sort_by_key(|candidate| Reverse(candidate.fits));
    let mut chosen = Vec::new();
    let mut left = workers;
    let mut next = 0;
    while left > 0 {
        let rest = &by_fits[next..];
        let holding_rest = rest.partition_point(|candidate| candidate.fits >= left);
        if holding_rest > 0 {
            let tightest = rest[holding_rest - 1].fits;
            let first_tightest = rest.partition_point(|candidate| candidate.fits > tightest);
            chosen.push((rest[first_tightest].idx, left));
            left = 0;
        } else {
            let largest = rest.first().expect("the candidates hold the gang");
            chosen.push((largest.idx, largest.fits));
            left -= largest.fits;
            next += 1;
        }
    }
    chosen
}

/// Fills candidates in the given order, each as far as it holds.
fn fill_in_order(candidates: &[Candidate<'_>], workers: u64) -> Vec<(usize, u64)> {
    let mut chosen = Vec::new();
    let mut left = workers;
    for candidate in candidates {
        if left == 0 {
            break;
        }
        let count = candidate.fits.min(left);
        chosen.push((candidate.idx, count));
        left -= count;
    }
    chosen
}

/// Deals workers one at a time round the candidates, skipping full ones.
/// `candidates` hold `workers` in total.
fn round_robin(candidates: &[Candidate<'_>], workers: u64) -> Vec<(usize, u64)> {
    let mut counts = vec![0_u64; candidates.len()];
    let mut left = workers;
    while left > 0 {
        let before = left;
        for (count, candidate) in counts.iter_mut().zip(candidates) {
            if left > 0 && *count < candidate.fits {
                *count += 1;
                left -= 1;
            }
        }
        assert!(left < before, "the candidates hold the gang");
    }
    candidates
        .iter()
        .zip(counts)
        .filter(|(_, count)| *count > 0)
        .map(|(candidate, count)| (candidate.idx, count))
        .collect()
}
