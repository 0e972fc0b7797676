//! Queues, cohorts and quotas: which queue takes a trial, whether its quota
//! lets it start, and each queue's standing.
//!
//! # Quotas (Kueue semantics)
//!
//! Per resource, a queue has a nominal quota `N` (unlimited when absent), a lending
//! limit `L` (default `N`) and a borrowing limit `B` (default unlimited). The part
//! `G = N − L` is never lent. A queue in a cohort may use up to `N + B`, and the
//! cohort's queues together may use at most `Σ L` beyond their `G`s:
//! `Σ max(0, usage − G) ≤ Σ L`. So a queue borrows only what others leave idle and
//! lendable, and a queue with no cohort never exceeds `N`. Both hold after every
//! decision (`check_invariants`); only a new policy with smaller quotas can leave
//! running work above them, and that is tolerated until it drains.
//!
//! This module answers quota questions; it does not order trials or choose
//! victims.

use std::collections::{BTreeMap, HashMap};

use super::PolicyCore;
use super::resource_vec::{ResourceVec, amount, dominant_share, resource_vec};
use crate::config::RESOURCE_NAMES;
use crate::{PolicyConfig, QueueUsage, Refusal};

/// A queue's static description, from the policy.
#[derive(Debug, Clone)]
pub(super) struct QueueInfo {
    pub(super) name: String,
    /// The team it takes work from; `None` takes every team's.
    team: Option<String>,
    /// Its cohort, an index into the core's cohorts.
    pub(super) cohort: Option<usize>,
    /// Its fair-share weight.
    pub(super) weight: f64,
    /// Per resource: nominal quota `N`, borrowing limit `B` and lending limit
    /// `L`; `None` is unlimited (for `L`, the default `N`).
    pub(super) nominal: [Option<u64>; 3],
    borrowing: [Option<u64>; 3],
    lending: [Option<u64>; 3],
    /// Its lease quotas (hard caps), by lease.
    pub(super) lease_quota: BTreeMap<String, u64>,
}

impl QueueInfo {
    /// Whether it takes work of `team`.
    pub(super) fn accepts(&self, team: &str) -> bool {
        self.team.as_deref().is_none_or(|owner| owner == team)
    }

    /// What it lends to its cohort's pool and what it keeps, for a finite quota.
    fn lend_and_keep(&self, resource: usize) -> Option<(u64, u64)> {
        let nominal = self.nominal[resource]?;
        let lend = self.lending[resource].unwrap_or(nominal).min(nominal);
        Some((lend, nominal - lend))
    }

    /// Whether `usage` is above its nominal quota in some resource.
    pub(super) fn is_borrowing(&self, usage: ResourceVec) -> bool {
        (0..3).any(|r| self.nominal[r].is_some_and(|nominal| usage[r] > nominal))
    }
}

/// Queues that lend each other idle quota.
#[derive(Debug, Clone)]
pub(super) struct Cohort {
    name: String,
    /// Its queues, in declaration order.
    pub(super) members: Vec<usize>,
}

/// The queues and cohorts of a policy, and the queues by name. An unvalidated
/// policy's duplicate queue names keep the first queue.
pub(super) fn build_queues(
    config: &PolicyConfig,
) -> (Vec<QueueInfo>, Vec<Cohort>, HashMap<String, usize>) {
    let mut cohort_index: BTreeMap<&str, usize> = BTreeMap::new();
    let mut cohorts: Vec<Cohort> = Vec::new();
    let mut infos = Vec::new();
    let mut by_name = HashMap::new();
    for queue in &config.queues {
        if by_name.contains_key(&queue.name) {
            // An unvalidated policy with a duplicate name: the first queue wins.
            continue;
        }
        let index = infos.len();
        let cohort = queue.cohort.as_deref().map(|name| {
            *cohort_index.entry(name).or_insert_with(|| {
                cohorts.push(Cohort {
                    name: name.to_owned(),
                    members: Vec::new(),
                });
                cohorts.len() - 1
            })
        });
        if let Some(cohort) = cohort {
            cohorts[cohort].members.push(index);
        }
        by_name.insert(queue.name.clone(), index);
        infos.push(QueueInfo {
            name: queue.name.clone(),
            team: queue.team.clone(),
            cohort,
            weight: queue.weight,
            nominal: queue.quota.as_array(),
            borrowing: queue.borrowing_limit.as_array(),
            lending: queue.lending_limit.as_array(),
            lease_quota: queue.quota.leases.clone(),
        });
    }
    (infos, cohorts, by_name)
}

/// Which constraint of the quota model stops a trial.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum QuotaBlock {
    /// Its own queue's limit (quota, plus borrowing limit in a cohort).
    Own(usize),
    /// Its cohort's pool of lendable quota.
    Pool(usize),
}

impl QuotaBlock {
    /// The resource that runs out, indexed like `RESOURCE_NAMES`.
    pub(super) fn resource(self) -> usize {
        match self {
            Self::Own(resource) | Self::Pool(resource) => resource,
        }
    }
}

impl PolicyCore {
    /// The queue a trial of `team` goes to: the one it names, if that takes the
    /// team, else the team's default queue.
    pub(super) fn resolve_queue(&self, team: &str, queue: Option<&str>) -> Result<usize, Refusal> {
        let unknown = |name: &str| Refusal::UnknownQueue {
            team: team.to_owned(),
            queue: name.to_owned(),
        };
        match queue {
            Some(name) => self
                .queue_by_name
                .get(name)
                .copied()
                .filter(|&index| self.queue_info[index].accepts(team))
                .ok_or_else(|| unknown(name)),
            None => self
                .config
                .default_queue_for(team)
                .and_then(|queue| self.queue_by_name.get(&queue.name).copied())
                .ok_or_else(|| unknown("default")),
        }
    }
    /// The first quota constraint that adding `demand` to `queue` breaks, with
    /// `usage` per queue. Resources the trial does not ask for are not checked,
    /// so work over a smaller new quota does not block work that adds nothing.
    pub(super) fn quota_block(
        &self,
        queue: usize,
        demand: &ResourceVec,
        usage: &[ResourceVec],
    ) -> Option<QuotaBlock> {
        let info = &self.queue_info[queue];
        for resource in 0..3 {
            if demand[resource] == 0 {
                continue;
            }
            let Some(nominal) = info.nominal[resource] else {
                continue;
            };
            let new_usage = usage[queue][resource].saturating_add(demand[resource]);
            let Some(cohort) = info.cohort else {
                if new_usage > nominal {
                    return Some(QuotaBlock::Own(resource));
                }
                continue;
            };
            let cap =
                info.borrowing[resource].map_or(u64::MAX, |limit| nominal.saturating_add(limit));
            if new_usage > cap {
                return Some(QuotaBlock::Own(resource));
            }
            let (_, keep) = info.lend_and_keep(resource).expect("the quota is finite");
            if new_usage <= keep {
                continue;
            }
            let (pool_used, pool_size) = self.cohort_pool(cohort, resource, |member| {
                if member == queue {
                    new_usage
                } else {
                    usage[member][resource]
                }
            });
            if pool_used > pool_size {
                return Some(QuotaBlock::Pool(resource));
            }
        }
        None
    }

    /// What a cohort's queues use of its pool of lendable quota, and its size.
    fn cohort_pool(
        &self,
        cohort: usize,
        resource: usize,
        usage_of: impl Fn(usize) -> u64,
    ) -> (u64, u64) {
        let mut used: u64 = 0;
        let mut size: u64 = 0;
        for &member in &self.cohorts[cohort].members {
            let Some((lend, keep)) = self.queue_info[member].lend_and_keep(resource) else {
                continue;
            };
            used = used.saturating_add(usage_of(member).saturating_sub(keep));
            size = size.saturating_add(lend);
        }
        (used, size)
    }

    /// The first broken quota limit with the current usage, described.
    pub(super) fn quota_report(&self) -> Option<String> {
        for (index, info) in self.queue_info.iter().enumerate() {
            let usage = self.index.queues[index].usage;
            for (resource, name) in RESOURCE_NAMES.iter().enumerate() {
                let Some(nominal) = info.nominal[resource] else {
                    continue;
                };
                let cap = match info.cohort {
                    None => nominal,
                    Some(_) => info.borrowing[resource]
                        .map_or(u64::MAX, |limit| nominal.saturating_add(limit)),
                };
                if usage[resource] > cap {
                    return Some(format!(
                        "queue {} uses {} {name}, above its limit {cap}",
                        info.name, usage[resource]
                    ));
                }
            }
        }
        for (cohort_index, cohort) in self.cohorts.iter().enumerate() {
            for (resource, name) in RESOURCE_NAMES.iter().enumerate() {
                let (used, size) = self.cohort_pool(cohort_index, resource, |member| {
                    self.index.queues[member].usage[resource]
                });
                if used > size {
                    let names: Vec<&str> = cohort
                        .members
                        .iter()
                        .map(|&member| self.queue_info[member].name.as_str())
                        .collect();
                    return Some(format!(
                        "cohort of {names:?} borrows {used} {name} of a lendable {size}"
                    ));
                }
            }
        }
        None
    }

    /// Every queue's standing, in declaration order. An unlimited quota shows as
    /// `u64::MAX`, and a queue open to every team has team `*`. `lent` attributes
    /// the cohort's borrowed amount to the lenders' idle lendable quota in
    /// declaration order.
    pub fn queues(&self) -> Vec<QueueUsage> {
        let capacity = resource_vec(&self.pool.capacity());
        let mut lent = vec![[0_u64; 3]; self.queue_info.len()];
        for cohort in &self.cohorts {
            for (resource, _) in RESOURCE_NAMES.iter().enumerate() {
                let mut borrowed: u64 = cohort
                    .members
                    .iter()
                    .filter_map(|&member| {
                        let nominal = self.queue_info[member].nominal[resource]?;
                        Some(self.index.queues[member].usage[resource].saturating_sub(nominal))
                    })
                    .sum();
                for &member in &cohort.members {
                    let info = &self.queue_info[member];
                    let (Some(nominal), Some((lend, _))) =
                        (info.nominal[resource], info.lend_and_keep(resource))
                    else {
                        continue;
                    };
                    let idle = nominal.saturating_sub(self.index.queues[member].usage[resource]);
                    let taken = idle.min(lend).min(borrowed);
                    lent[member][resource] = taken;
                    borrowed -= taken;
                }
            }
        }
        self.queue_info
            .iter()
            .enumerate()
            .map(|(index, info)| {
                let queue = &self.index.queues[index];
                let quota = info.nominal.map(|nominal| nominal.unwrap_or(u64::MAX));
                let borrowed: ResourceVec = std::array::from_fn(|r| {
                    info.nominal[r].map_or(0, |nominal| queue.usage[r].saturating_sub(nominal))
                });
                QueueUsage {
                    name: info.name.clone(),
                    team: info.team.clone().unwrap_or_else(|| "*".to_owned()),
                    cohort: info.cohort.map(|cohort| self.cohorts[cohort].name.clone()),
                    weight: info.weight,
                    usage: amount(queue.usage),
                    quota: amount(quota),
                    borrowed: amount(borrowed),
                    lent: amount(lent[index]),
                    pending: queue.n_waiting + queue.n_held,
                    running: queue.n_placed,
                    dominant_share: dominant_share(queue.usage, capacity, info.weight),
                    leases: queue.lease_usage.clone(),
                    lease_quota: info.lease_quota.clone(),
                }
            })
            .collect()
    }
}
