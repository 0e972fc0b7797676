//! The three schedulable resources as one array: GPU thousandths, CPU
//! thousandths and memory bytes, in the order of
//! [`RESOURCE_NAMES`](crate::config::RESOURCE_NAMES).
//!
//! The policy adds and compares demands, usage and quotas resource by resource;
//! an array makes those loops short. Arithmetic saturates instead of
//! overflowing. Nothing here knows about queues or trials.

use crate::{Amount, GangShape, WorkerPlacement};

/// GPU thousandths, CPU thousandths and memory bytes, indexed like
/// [`RESOURCE_NAMES`](crate::config::RESOURCE_NAMES).
pub(super) type ResourceVec = [u64; 3];

/// An [`Amount`] as a vector.
pub(super) fn resource_vec(amount: &Amount) -> ResourceVec {
    [amount.gpu_milli, amount.cpu_milli, amount.memory_bytes]
}

/// `a + b`, resource by resource.
pub(super) fn plus(a: ResourceVec, b: ResourceVec) -> ResourceVec {
    [
        a[0].saturating_add(b[0]),
        a[1].saturating_add(b[1]),
        a[2].saturating_add(b[2]),
    ]
}

/// `a - b`, resource by resource, never below zero.
pub(super) fn minus(a: ResourceVec, b: ResourceVec) -> ResourceVec {
    [
        a[0].saturating_sub(b[0]),
        a[1].saturating_sub(b[1]),
        a[2].saturating_sub(b[2]),
    ]
}

/// Whether `have` holds `need` in every resource.
pub(super) fn covers(have: ResourceVec, need: ResourceVec) -> bool {
    (0..3).all(|r| have[r] >= need[r])
}

/// What a whole gang asks for.
pub(super) fn gang_demand(gang: &GangShape) -> ResourceVec {
    let workers = u64::from(gang.workers);
    resource_vec(&gang.per_worker).map(|amount| amount.saturating_mul(workers))
}

/// What a placement holds, all workers together.
pub(super) fn placement_total(workers: &[WorkerPlacement]) -> ResourceVec {
    workers.iter().fold([0; 3], |total, worker| {
        let gpu = worker.gpus.iter().map(|share| u64::from(share.milli)).sum();
        plus(total, [gpu, worker.cpu_milli, worker.memory_bytes])
    })
}

/// A vector as an [`Amount`].
pub(super) fn amount(vector: ResourceVec) -> Amount {
    Amount {
        gpu_milli: vector[0],
        cpu_milli: vector[1],
        memory_bytes: vector[2],
    }
}

/// The largest fraction of `capacity` that `usage` takes in any resource,
/// divided by the queue's `weight`.
pub(super) fn dominant_share(usage: ResourceVec, capacity: ResourceVec, weight: f64) -> f64 {
    let share = (0..3)
        .filter(|&r| capacity[r] > 0)
        .map(|r| usage[r] as f64 / capacity[r] as f64)
        .fold(0.0, f64::max);
    share / weight
}
