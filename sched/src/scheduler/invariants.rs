//! The from-scratch check of everything the policy core keeps: the index, the
//! trial table, reservations, the pool's allocations node by node, the quota
//! limits, the leases (`leases::check_leases`) and waiting trials'
//! attained-service levels.
//!
//! It is slow on purpose (it rebuilds what the core keeps incrementally) and is
//! meant for tests and the simulator's debug mode; the decision pass never calls
//! it.

use std::collections::BTreeMap;

use xp_runtime::ids::NodeId;

use super::PolicyCore;
use super::index::Index;
use super::resource_vec::gang_demand;
use super::trial::Standing;
use crate::GPU_MILLI;

/// A broken invariant of the policy core, found by
/// [`PolicyCore::check_invariants`]. It means a bug in the core (or in how the
/// caller reported facts), never a bad request.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{description}")]
pub struct InvariantViolation {
    /// What is broken, naming the trials, queues or nodes involved.
    pub description: String,
}

impl PolicyCore {
    /// Recomputes everything derived from scratch and checks it: indexes and
    /// usage, the pool's allocations node by node, gangs placed whole, quota and
    /// borrowing and lending limits, reservations. For tests and the simulator's
    /// debug mode.
    pub fn check_invariants(&self) -> Result<(), InvariantViolation> {
        self.check_index()
            .and_then(|()| self.check_trials())
            .and_then(|()| self.check_reservations())
            .and_then(|()| self.check_pool())
            .and_then(|()| self.check_quotas())
            .and_then(|()| {
                self.check_leases()
                    .map_err(|violation| violation.to_string())
            })
            .and_then(|()| {
                self.check_elastic()
                    .map_err(|violation| violation.to_string())
            })
            .map_err(|description| InvariantViolation { description })
    }

    /// Compares the kept index with one rebuilt from the trial table.
    fn check_index(&self) -> Result<(), String> {
        let rebuilt = Index::rebuild(self.queue_info.len(), &self.trials, &self.reservations);
        if rebuilt != self.index {
            return Err(describe_index_difference(&rebuilt, &self.index));
        }
        Ok(())
    }

    /// Checks every trial against its queue, its gang and its reservation.
    fn check_trials(&self) -> Result<(), String> {
        for (id, trial) in &self.trials {
            let info = self
                .queue_info
                .get(trial.queue)
                .ok_or_else(|| format!("trial {id} is in a queue that does not exist"))?;
            if !info.accepts(&trial.request.team) {
                return Err(format!(
                    "trial {id} of team {} is in queue {}, which does not take it",
                    trial.request.team, info.name
                ));
            }
            if trial.demand != gang_demand(&trial.request.gang) {
                return Err(format!("trial {id} has a stale demand"));
            }
            let service = trial
                .attained_gpu_ms
                .saturating_sub(trial.level_base_gpu_ms);
            if !matches!(trial.standing, Standing::Placed(_))
                && trial.level != self.level_of(service)
            {
                return Err(format!(
                    "trial {id} waits at attained-service level {} where its service puts it at {}",
                    trial.level,
                    self.level_of(service)
                ));
            }
            if let Standing::Placed(placed) = &trial.standing {
                if placed.workers.len() != trial.request.gang.workers as usize {
                    return Err(format!(
                        "trial {id} holds {} workers of a gang of {}",
                        placed.workers.len(),
                        trial.request.gang.workers
                    ));
                }
                if self.reservations.contains_key(id) {
                    return Err(format!("placed trial {id} still has a reservation"));
                }
            }
        }
        Ok(())
    }

    /// Checks that every reservation belongs to a waiting trial and matches it.
    fn check_reservations(&self) -> Result<(), String> {
        for (id, reservation) in &self.reservations {
            let trial = self
                .trials
                .get(id)
                .ok_or_else(|| format!("reservation of unknown trial {id}"))?;
            if !matches!(trial.standing, Standing::Waiting) {
                return Err(format!("reservation of trial {id}, which is not waiting"));
            }
            if reservation.queue != trial.queue
                || reservation.demand != trial.demand
                || reservation.leases != trial.request.gang.leases
            {
                return Err(format!("reservation of trial {id} is stale"));
            }
        }
        Ok(())
    }

    /// Checks the quota, borrowing and lending limits, unless a new policy left
    /// running work above them.
    fn check_quotas(&self) -> Result<(), String> {
        if !self.quota_relaxed
            && let Some(problem) = self.quota_report()
        {
            return Err(problem);
        }
        Ok(())
    }

    /// Compares the pool's allocations, node by node, with what placed trials hold.
    fn check_pool(&self) -> Result<(), String> {
        struct Held {
            gpus: BTreeMap<u32, u64>,
            cpu_milli: u64,
            memory_bytes: u64,
        }
        let mut held: BTreeMap<NodeId, Held> = BTreeMap::new();
        for (id, trial) in &self.trials {
            let Standing::Placed(placed) = &trial.standing else {
                continue;
            };
            for worker in placed.held_workers() {
                if self.pool.node_free(worker.node).is_none() {
                    return Err(format!(
                        "trial {id} holds resources on unknown node {}",
                        worker.node
                    ));
                }
                let entry = held.entry(worker.node).or_insert(Held {
                    gpus: BTreeMap::new(),
                    cpu_milli: 0,
                    memory_bytes: 0,
                });
                for share in &worker.gpus {
                    *entry.gpus.entry(share.index).or_insert(0) += u64::from(share.milli);
                }
                entry.cpu_milli += worker.cpu_milli;
                entry.memory_bytes += worker.memory_bytes;
            }
        }
        for (spec, _) in self.pool.nodes() {
            let node = spec.id;
            let used = self.pool.node_gpu_used(node).unwrap_or(&[]);
            let free = self.pool.node_free(node).unwrap_or_default();
            let expected = held.get(&node);
            for (index, used_milli) in used.iter().enumerate() {
                let want = expected
                    .and_then(|held| held.gpus.get(&(index as u32)).copied())
                    .unwrap_or(0);
                if u64::from(*used_milli) != want {
                    return Err(format!(
                        "node {node} GPU {index}: pool holds {used_milli} thousandths, trials hold {want}"
                    ));
                }
                if *used_milli > GPU_MILLI as u32 {
                    return Err(format!("node {node} GPU {index} is over-allocated"));
                }
            }
            let cpu = expected.map_or(0, |held| held.cpu_milli);
            let memory = expected.map_or(0, |held| held.memory_bytes);
            if cpu > spec.cpu_milli || memory > spec.memory_bytes {
                return Err(format!("node {node} is over-allocated"));
            }
            if free.cpu_milli != spec.cpu_milli - cpu
                || free.memory_bytes != spec.memory_bytes - memory
            {
                return Err(format!(
                    "node {node}: pool has {} CPU and {} memory free, trials leave {} and {}",
                    free.cpu_milli,
                    free.memory_bytes,
                    spec.cpu_milli - cpu,
                    spec.memory_bytes - memory
                ));
            }
        }
        Ok(())
    }
}

fn describe_index_difference(rebuilt: &Index, kept: &Index) -> String {
    if rebuilt.queues.len() != kept.queues.len() {
        return "the index has the wrong number of queues".to_owned();
    }
    for (queue, (want, have)) in rebuilt.queues.iter().zip(&kept.queues).enumerate() {
        if want != have {
            return format!("queue {queue}: kept {have:?}, recomputed {want:?}");
        }
    }
    if rebuilt.pending_by_team != kept.pending_by_team {
        return format!(
            "pending per team: kept {:?}, recomputed {:?}",
            kept.pending_by_team, rebuilt.pending_by_team
        );
    }
    if rebuilt.node_trials != kept.node_trials {
        return "trials per node differ from a recount".to_owned();
    }
    if rebuilt.ends != kept.ends {
        return "expected ends differ from a recount".to_owned();
    }
    if rebuilt.victims != kept.victims {
        return "preemption candidates differ from a recount".to_owned();
    }
    if rebuilt.lease_held != kept.lease_held || rebuilt.lease_reserved != kept.lease_reserved {
        return format!(
            "leases held {:?} and reserved {:?}, recounted {:?} and {:?}",
            kept.lease_held, kept.lease_reserved, rebuilt.lease_held, rebuilt.lease_reserved
        );
    }
    "waiting demands differ from a recount".to_owned()
}
