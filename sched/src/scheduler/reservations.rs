//! Trials that preempted others: their reservations, served first in every
//! pass, and the placements planned for them while their victims stop.
//!
//! A reservation counts the preemptor's demand against its queue's quota for
//! everyone else. Invariant: a new placement on a node of a plan leaves room,
//! node by node and GPU by GPU, for the plan once the victims there have
//! stopped (`plan_conflict`). Choosing victims is `preemption`'s work.

use std::cmp::Reverse;
use std::collections::BTreeMap;

use xp_runtime::ids::{NodeId, TrialId};

use super::PolicyCore;
use super::lanes::OrderKey;
use super::pass::Pass;
use super::resource_vec::{ResourceVec, minus};
use super::trial::Standing;
use crate::{Decision, GPU_MILLI, WaitReason, WorkerPlacement};

/// A trial that preempted others and waits for them to stop.
#[derive(Debug, Clone, PartialEq)]
pub(super) struct Reservation {
    /// The trials it asked to stop.
    pub(super) victims: Vec<TrialId>,
    /// Its queue.
    pub(super) queue: usize,
    /// What it will take, counted against its queue meanwhile.
    pub(super) demand: ResourceVec,
    /// The lease units it will take, kept from everyone else meanwhile.
    pub(super) leases: BTreeMap<String, u64>,
}

impl PolicyCore {
    /// Forgets a trial's reservation, if it has one, and its weight in the
    /// pass's quota view.
    pub(super) fn drop_reservation(&mut self, id: TrialId, pass: Option<&mut Pass>) {
        if let Some(reservation) = self.reservations.remove(&id) {
            self.index.unreserve(&reservation);
            if let Some(pass) = pass {
                pass.usage_view[reservation.queue] =
                    minus(pass.usage_view[reservation.queue], reservation.demand);
            }
        }
    }

    /// Step 1 of a pass: serves trials waiting on their victims, highest
    /// effective priority first. A trial starts once it can; while its victims
    /// stop, its plan is renewed; when they are gone or no longer enough, it
    /// goes back to the line.
    pub(super) fn serve_reservations(&mut self, pass: &mut Pass, decisions: &mut Vec<Decision>) {
        let mut order: Vec<(OrderKey, TrialId)> = self
            .reservations
            .keys()
            .filter_map(|id| {
                let trial = self.trials.get(id)?;
                let effective = self.effective_priority(&trial.request, pass.now);
                let urgency = Reverse(trial.request.urgency);
                Some((
                    (Reverse(effective), trial.level, urgency, trial.line_at, *id),
                    *id,
                ))
            })
            .collect();
        order.sort_unstable();
        for (_, id) in order {
            let Some(reservation) = self.reservations.get(&id).cloned() else {
                continue;
            };
            let Some(trial) = self.trials.get(&id) else {
                self.drop_reservation(id, Some(pass));
                continue;
            };
            let queue = reservation.queue;
            let strategy = self.strategy(id);
            // Starting now needs the quota as it is now, victims still counted.
            let mut view = pass.usage_view.clone();
            view[queue] = minus(view[queue], reservation.demand);
            if self.quota_block(queue, &trial.demand, &view).is_none()
                && self.lease_shortage(id, None).is_none()
                && self.lease_quota_block(id).is_none()
                && let Some(workers) = self.pool.find(&trial.request.gang, strategy)
                && self.plan_conflict(pass, &workers, &[]).is_none()
            {
                self.drop_reservation(id, Some(pass));
                decisions.push(self.start(id, workers, pass));
                continue;
            }
            let remaining: Vec<(TrialId, &[WorkerPlacement])> = reservation
                .victims
                .iter()
                .filter_map(|victim| match &self.trials.get(victim)?.standing {
                    Standing::Placed(placed) if placed.preempt_deadline.is_some() => {
                        Some((*victim, placed.workers.as_slice()))
                    }
                    _ => None,
                })
                .collect();
            let mut plan = None;
            if !remaining.is_empty() {
                // Once every stopping trial is gone, and reservations take over.
                let mut future = self.future_view(pass);
                future[queue] = minus(future[queue], reservation.demand);
                let freed: Vec<&[WorkerPlacement]> =
                    remaining.iter().map(|(_, workers)| *workers).collect();
                if self.quota_block(queue, &trial.demand, &future).is_none() {
                    plan = self
                        .pool
                        .find_with_freed(&trial.request.gang, strategy, &freed)
                        .filter(|plan| self.plan_conflict(pass, plan, &freed).is_none());
                }
            }
            match plan {
                Some(plan) => {
                    let victims = remaining.iter().map(|(victim, _)| *victim).collect();
                    pass.add_plan(id, plan, victims);
                    self.set_reason(id, WaitReason::WaitingForPreemption);
                }
                // The victims are gone or no longer enough: back to the line.
                None => self.drop_reservation(id, Some(pass)),
            }
        }
    }
    /// What quota checks of planned work see: usage and placements of this pass,
    /// plus reservations, less the trials being preempted (their reservations
    /// take their place).
    pub(super) fn future_view(&self, pass: &Pass) -> Vec<ResourceVec> {
        pass.usage_view
            .iter()
            .zip(&self.index.queues)
            .map(|(view, queue)| minus(*view, queue.stopping))
            .collect()
    }

    /// Whether placing `workers` now (with `extra_freed` released first, for a
    /// plan) leaves too little on some node for the placements planned for trials
    /// waiting on preemption, counting what their victims will give back; the
    /// holder of a plan on that node if so.
    pub(super) fn plan_conflict(
        &self,
        pass: &Pass,
        workers: &[WorkerPlacement],
        extra_freed: &[&[WorkerPlacement]],
    ) -> Option<TrialId> {
        let mut nodes: Vec<NodeId> = workers
            .iter()
            .map(|worker| worker.node)
            .filter(|node| pass.plan_nodes.contains_key(node))
            .collect();
        nodes.sort_unstable();
        nodes.dedup();
        for node in nodes {
            let plans_here = &pass.plan_nodes[&node];
            let (Some(gpu_used), Some(free)) =
                (self.pool.node_gpu_used(node), self.pool.node_free(node))
            else {
                continue;
            };
            let mut gpu_used: Vec<i64> = gpu_used.iter().map(|used| i64::from(*used)).collect();
            let mut cpu_free = i128::from(free.cpu_milli);
            let mut memory_free = i128::from(free.memory_bytes);
            let mut apply = |worker: &WorkerPlacement, taken: bool| {
                if worker.node != node {
                    return;
                }
                let sign: i64 = if taken { 1 } else { -1 };
                for share in &worker.gpus {
                    if let Some(used) = gpu_used.get_mut(share.index as usize) {
                        *used += sign * i64::from(share.milli);
                    }
                }
                cpu_free -= i128::from(sign) * i128::from(worker.cpu_milli);
                memory_free -= i128::from(sign) * i128::from(worker.memory_bytes);
            };
            for plan in &pass.plans {
                for victim in &plan.victims {
                    if let Some(Standing::Placed(placed)) =
                        self.trials.get(victim).map(|trial| &trial.standing)
                    {
                        placed
                            .workers
                            .iter()
                            .for_each(|worker| apply(worker, false));
                    }
                }
            }
            for freed in extra_freed {
                freed.iter().for_each(|worker| apply(worker, false));
            }
            for &plan in plans_here {
                pass.plans[plan]
                    .workers
                    .iter()
                    .for_each(|worker| apply(worker, true));
            }
            workers.iter().for_each(|worker| apply(worker, true));
            let whole_gpu = GPU_MILLI as i64;
            if gpu_used.iter().any(|used| *used > whole_gpu) || cpu_free < 0 || memory_free < 0 {
                return Some(pass.plans[plans_here[0]].holder);
            }
        }
        None
    }
}
