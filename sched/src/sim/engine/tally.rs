//! Counting: the GPU time of each run as it closes (one stopped through its
//! checkpoint loses the work since its last one), and the jobs' outcomes at
//! the end of a simulation: completion times, queueing delays, outcomes,
//! per-team sums and why the waiting still wait. Runs still open are closed
//! (their GPU time accounted) at the end.

use xp_runtime::clock::UnixMillis;

use super::{Phase, Sim, seconds};
use crate::sim::report::Tally;

impl Sim<'_> {
    /// Closes a run stopped through its checkpoint at `now`: its GPU time is
    /// counted, the work since its last periodic checkpoint is lost on
    /// `run_gpu_milli` (by the rule `xp report` counts with), the work kept
    /// comes off what remains, and `held_gpu_milli` are free again.
    pub(super) fn close_run_at_checkpoint(
        &mut self,
        index: u32,
        now: UnixMillis,
        run_gpu_milli: u64,
        held_gpu_milli: u64,
    ) {
        let run = &self.runs[index as usize];
        let ran = now - run.start_ms;
        let last_checkpoint = self.trace.jobs[index as usize]
            .ckpt_interval_ms
            .filter(|interval| *interval > 0)
            .map(|interval| run.start_ms + ran / interval * interval);
        let lost = now - xp_runtime::report::lost_since(run.start_ms, now, last_checkpoint);
        self.account_run(index, ran);
        self.busy_gpu_milli -= held_gpu_milli;
        self.lost_gpu_milli_ms += u128::from(lost) * u128::from(run_gpu_milli);
        let kept = self.work_of(index, ran - lost);
        if let Some(remaining) = &mut self.runs[index as usize].remaining_ms {
            *remaining = remaining.saturating_sub(kept);
        }
    }

    /// Adds a finished run segment to the GPU-time totals.
    pub(super) fn account_run(&mut self, index: u32, ran: u64) {
        let trace = self.trace;
        let job = &trace.jobs[index as usize];
        // The run's own size: a growth's new GPUs are counted from its restart.
        let gpu_milli = job.gpu_milli_per_worker * u64::from(self.runs[index as usize].size);
        self.team_gpu_milli_ms[job.team as usize] += u128::from(ran) * u128::from(gpu_milli);
    }

    /// Counts every job's outcome at `end_ms`, in job order; runs still open
    /// are closed (accounted) at `end_ms`.
    pub(super) fn tally_runs(&mut self, end_ms: u64) -> Tally {
        let teams = self.trace.teams.len();
        let mut tally = Tally {
            team_jobs: vec![0u64; teams],
            team_completed: vec![0u64; teams],
            team_jct_sum: vec![0f64; teams],
            ..Tally::default()
        };
        let trace = self.trace;
        for index in 0..self.runs.len() {
            let job = &trace.jobs[index];
            let run = self.runs[index].clone();
            let team = job.team as usize;
            tally.team_jobs[team] += 1;
            if run.phase != Phase::Pending && run.phase != Phase::Refused {
                tally.arrived += 1;
            }
            match run.first_start_ms {
                Some(start) => tally.queue_delay.push(seconds(start - run.arrival_ms)),
                None => tally.never_started += 1,
            }
            match run.phase {
                Phase::Completed | Phase::Killed => {
                    let in_system = run.end_ms - run.arrival_ms;
                    tally.time_in_system_ms += u128::from(in_system);
                    tally.departed += 1;
                    if run.phase == Phase::Completed {
                        tally.outcomes.completed += 1;
                        tally.jct.push(seconds(in_system));
                        tally.team_completed[team] += 1;
                        tally.team_jct_sum[team] += seconds(in_system);
                    } else {
                        tally.outcomes.killed += 1;
                    }
                }
                Phase::Running | Phase::Stopping | Phase::Resizing => {
                    // Close the open run at the end of the simulation.
                    let ran = end_ms.saturating_sub(run.start_ms);
                    self.account_run(index as u32, ran);
                    tally.outcomes.running += 1;
                }
                Phase::Waiting | Phase::Backlogged => {
                    tally.outcomes.waiting += 1;
                    let reason = match run.phase {
                        Phase::Backlogged => "too many pending trials (backlogged)".to_owned(),
                        _ => self
                            .core
                            .wait_reason(self.trial_of(index as u32))
                            .map_or_else(|| "unknown".to_owned(), |reason| reason.to_string()),
                    };
                    *tally.wait_reasons.entry(reason).or_default() += 1;
                }
                Phase::Refused => tally.outcomes.refused += 1,
                Phase::Pending => {
                    if run.unmet_deps > 0 {
                        tally.outcomes.blocked += 1;
                    } else {
                        tally.outcomes.not_arrived += 1;
                    }
                }
            }
        }
        tally
    }
}
