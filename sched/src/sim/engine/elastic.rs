//! Elastic jobs in the simulator: speed against size, and resizes.
//!
//! A job's work is counted in milliseconds at its nominal size
//! (`num_workers`, the size its `duration_s` was measured at); at `w` workers
//! it does `(w / num_workers)^scaling` of that per millisecond (linear by
//! default). A fixed job always runs at its nominal size, so for it wall time
//! and work are the same and nothing here changes its numbers.
//!
//! A resize follows the head: the gang runs out the grace period, stops
//! through its checkpoint (losing the work since its last periodic
//! checkpoint, the rule preemption counts with), and starts again at once on
//! the placement the policy chose, paying [`RESIZE_RESTART_MS`] of restart
//! (process start, rendezvous, loading the checkpoint) on its new GPUs; both
//! count as GPU-time lost.

use xp_runtime::clock::UnixMillis;
use xp_runtime::ids::TrialId;

use super::{Event, EventKind, Phase, Sim, SimError, seconds};

/// What one restart of a resized gang costs, in wall milliseconds at its new
/// size: its processes starting, meeting and loading the checkpoint.
pub const RESIZE_RESTART_MS: u64 = 30_000;

impl Sim<'_> {
    /// How fast job `index` runs at its current size, relative to its
    /// nominal size.
    fn speed(&self, index: u32) -> f64 {
        let job = &self.trace.jobs[index as usize];
        match job.elastic {
            Some(elastic) => elastic.speed(job.num_workers, self.runs[index as usize].size),
            None => 1.0,
        }
    }

    /// Wall milliseconds job `index` needs for `work_ms` of nominal work at
    /// its current size (rounded up, so the work is done by then).
    pub(super) fn wall_for(&self, index: u32, work_ms: u64) -> u64 {
        let speed = self.speed(index);
        if speed == 1.0 {
            return work_ms;
        }
        (work_ms as f64 / speed).ceil() as u64
    }

    /// Nominal work job `index` does in `wall_ms` at its current size
    /// (rounded down, except that the wall time `wall_for` gives is enough).
    pub(super) fn work_of(&self, index: u32, wall_ms: u64) -> u64 {
        let speed = self.speed(index);
        if speed == 1.0 {
            return wall_ms;
        }
        let work = (wall_ms as f64 * speed).floor() as u64;
        // `wall_for(remaining)` rounds up; its floor can fall a hair short.
        match self.runs[index as usize].remaining_ms {
            Some(remaining) if wall_ms >= self.wall_for(index, remaining) => work.max(remaining),
            _ => work,
        }
    }

    /// GPU thousandths job `index` holds: its current size, plus the new
    /// workers of a growth in flight (held from the decision on).
    pub(super) fn run_gpu_milli(&self, index: u32) -> u64 {
        self.trace.jobs[index as usize].gpu_milli_per_worker
            * u64::from(self.runs[index as usize].size)
            + self.grown_gpu_milli(index)
    }

    /// GPU thousandths of the new workers of job `index`'s growth in flight.
    fn grown_gpu_milli(&self, index: u32) -> u64 {
        let run = &self.runs[index as usize];
        if !matches!(run.phase, Phase::Resizing | Phase::Stopping) {
            return 0;
        }
        let target = self
            .core
            .resizing(self.trial_of(index))
            .map_or(0, |workers| workers.len() as u64);
        target.saturating_sub(u64::from(run.size))
            * self.trace.jobs[index as usize].gpu_milli_per_worker
    }

    /// An elastic job just (re)started may grow once it has run the policy's
    /// `min_run_time`: a wake-up then asks the policy again, even if nothing
    /// else happens.
    pub(super) fn wake_elastic(&mut self, index: u32, now: UnixMillis) {
        if self.trace.jobs[index as usize].elastic.is_none() {
            return;
        }
        let after = self.core.config().preemption.min_run_time_ms;
        let epoch = self.runs[index as usize].epoch;
        self.push(now + after, EventKind::Wake, index, epoch);
    }

    /// An elastic job's wake-up: the policy looks again if it still runs.
    pub(super) fn handle_wake(&mut self, event: Event) {
        let run = &self.runs[event.target as usize];
        if run.epoch == event.epoch && run.phase == Phase::Running {
            self.changed = true;
        }
    }

    /// A Resize decision: the job runs out the grace period first.
    pub(super) fn resize_decision(
        &mut self,
        trial: TrialId,
        grace_ms: u64,
        now: UnixMillis,
    ) -> Result<(), SimError> {
        let index = self.job_index(trial, now)?;
        let run = &mut self.runs[index as usize];
        if run.phase != Phase::Running {
            return Err(SimError::UnexpectedDecision {
                at_s: seconds(now),
                what: "resized",
                job_id: self.trace.jobs[index as usize].job_id.clone(),
                state: run.phase.name(),
            });
        }
        run.phase = Phase::Resizing;
        let epoch = run.epoch;
        // A growth holds its new GPUs from the decision on, as the core does.
        self.busy_gpu_milli += self.grown_gpu_milli(index);
        self.push(now + grace_ms, EventKind::Resize, index, epoch);
        Ok(())
    }

    /// A resized job's grace period is over: it stops through its checkpoint
    /// and starts again at the new size.
    pub(super) fn handle_resize(&mut self, event: Event, now: UnixMillis) {
        let index = event.target;
        let run = &self.runs[index as usize];
        if run.epoch != event.epoch || run.phase != Phase::Resizing {
            return;
        }
        let trial = self.trial_of(index);
        let per_worker = self.trace.jobs[index as usize].gpu_milli_per_worker;
        // The run's GPU-time is its old size's; the growth's new GPUs sat
        // idle through the grace period.
        let grown = self.grown_gpu_milli(index);
        let old_gpu_milli = self.run_gpu_milli(index) - grown;
        self.close_run_at_checkpoint(index, now, old_gpu_milli, old_gpu_milli + grown);
        let Some(workers) = self.core.resized(trial, now) else {
            // The core no longer resizes it (preempted meanwhile): back in line.
            let run = &mut self.runs[index as usize];
            run.phase = Phase::Waiting;
            self.waiting += 1;
            self.core.requeue(trial, now);
            self.changed = true;
            return;
        };
        self.resizes += 1;
        self.runs[index as usize].phase = Phase::Waiting;
        self.waiting += 1;
        // The restart is work the job must do again at its new size.
        let size = u32::try_from(workers.len()).expect("gangs are at most u32 workers");
        self.runs[index as usize].size = size;
        let restart_work = (RESIZE_RESTART_MS as f64 * self.speed(index)).ceil() as u64;
        if let Some(remaining) = &mut self.runs[index as usize].remaining_ms {
            *remaining = remaining.saturating_add(restart_work);
        }
        self.lost_gpu_milli_ms +=
            u128::from(RESIZE_RESTART_MS) * u128::from(per_worker) * u128::from(size);
        self.place(index, &workers, now)
            .expect("a job resized from running waits for its new placement");
        // A restart is not a new placement.
        self.placements -= 1;
        self.changed = true;
    }
}

#[cfg(test)]
mod tests {
    use crate::PolicyConfig;
    use crate::sim::{SimOptions, SimReport, parse_cluster_yaml, parse_trace, simulate};

    const CLUSTER: &str = "nodes: [{gpus: 4, cpu_milli: 16000, mem_mib: 65536}]\n";
    const POLICY: &str = "order: priority\npreemption: {grace_period: 10s, min_run_time: 100s}\n";
    const HEADER: &str = "job_id,submit_s,duration_s,num_workers,gpus_per_worker,ckpt_interval_s,min_workers,max_workers";

    fn run(rows: &str) -> SimReport {
        let trace = parse_trace(&format!("{HEADER}\n{rows}")).unwrap();
        let cluster = parse_cluster_yaml(CLUSTER).unwrap();
        let options = SimOptions {
            check_invariants: true,
            ..SimOptions::default()
        };
        simulate(
            &trace,
            &cluster,
            PolicyConfig::from_yaml(POLICY).unwrap(),
            &options,
        )
        .unwrap()
    }

    fn check_close(actual: f64, expected: f64) {
        assert!(
            (actual - expected).abs() < 1e-9,
            "got {actual}, expected {expected}"
        );
    }

    #[test]
    fn an_elastic_job_grows_after_its_minimum_run_and_pays_for_the_restart() {
        // a holds 2 GPUs until 50 s; e starts at its nominal 2 (400 s of work).
        // At 100 s (its minimum run) a wake-up lets it grow to 4; it stops at
        // 110 s, losing the 10 s since its checkpoint at 100 s, and restarts at
        // twice the speed with 30 s of restart: 300 s left + 60 s of restart
        // work at speed 2 is 180 s, so it ends at 290 s.
        let report = run("a,0,50,2,1,,,\ne,0,400,2,1,50,1,4\n");
        assert_eq!(report.outcomes.completed, 2);
        assert_eq!(report.resizes, 1);
        check_close(report.makespan, 290.0);
        // Lost: 10 s on 2 GPUs, and the 30 s restart on 4.
        check_close(report.gpu_seconds_lost, 20.0 + 120.0);
        // GPU time: a 100, e 110 s on 2 and 180 s on 4.
        check_close(report.gpu_hours, (100.0 + 220.0 + 720.0) / 3600.0);
        // At a fixed size it would end at 400 s.
        let fixed = run("a,0,50,2,1,,,\ne,0,400,2,1,50,,\n");
        assert_eq!(fixed.resizes, 0);
        check_close(fixed.makespan, 400.0);
    }

    #[test]
    fn an_elastic_job_starts_as_large_as_fits_and_shrinks_for_higher_priority() {
        // e starts alone at 4 (speed 2); b (priority 10, 2 GPUs) arrives at 150 s;
        // e shrinks to 2 (stopping at 160 s) instead of being preempted.
        let trace = format!("{HEADER},priority\ne,0,1000,2,1,50,1,4,0\nb,150,20,2,1,,,,10\n");
        let trace = parse_trace(&trace).unwrap();
        let cluster = parse_cluster_yaml(CLUSTER).unwrap();
        let options = SimOptions {
            check_invariants: true,
            ..SimOptions::default()
        };
        let report = simulate(
            &trace,
            &cluster,
            PolicyConfig::from_yaml(POLICY).unwrap(),
            &options,
        )
        .unwrap();
        // e: 160 s at speed 2 (kept 150 s since its checkpoint: 300 of 1000),
        // a 30 s restart at 2, b runs 160 to 180 s; at 260 s (its minimum run
        // since the restart) e grows back to 4, stopping at 270 s (kept 100 s
        // since 160 s), and finishes 630 s of work plus 60 of restart at speed
        // 2 by 615 s.
        assert_eq!(report.outcomes.completed, 2);
        assert_eq!(report.preemptions, 0);
        assert_eq!(report.resizes, 2);
        check_close(report.makespan, 615.0);
        check_close(report.jct.unwrap().mean, (30.0 + 615.0) / 2.0);
        check_close(report.gpu_seconds_lost, 40.0 + 60.0 + 20.0 + 120.0);
    }
}
