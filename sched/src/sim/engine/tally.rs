//! Counting: the GPU time of each run as it closes (one stopped through its
//! checkpoint loses the work since its last one), and the jobs' outcomes at
//! the end of a simulation: completion times, queueing delays, outcomes,
//! per-team sums and why the waiting still wait. Runs still open are closed
//! (their GPU time accounted) at the end, and the totals become the
//! [`SimReport`].

use xp_runtime::clock::UnixMillis;

use super::{Phase, Sim, seconds};
use crate::GPU_MILLI;
use crate::sim::report::{
    LittlesLaw, SimReport, Summary, Tally, TeamReport, gpu_hours_of, jain_index,
};

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

impl Sim<'_> {
    /// The report of a simulation whose trace began at `first_arrival_ms` and
    /// whose clock stopped at `end_ms`.
    pub(super) fn report(mut self, first_arrival_ms: u64, end_ms: u64) -> SimReport {
        let Tally {
            outcomes,
            mut jct,
            mut queue_delay,
            never_started,
            time_in_system_ms,
            departed,
            arrived,
            team_jobs,
            team_completed,
            team_jct_sum,
            wait_reasons,
        } = self.tally_runs(end_ms);
        let span_ms = end_ms.saturating_sub(first_arrival_ms);
        let span = seconds(span_ms);
        let total_gpu_milli_ms: u128 = self.team_gpu_milli_ms.iter().sum();
        let total_gpu_hours = gpu_hours_of(total_gpu_milli_ms);
        let team_reports =
            self.team_reports(&team_jobs, &team_completed, &team_jct_sum, total_gpu_hours);
        let shares: Vec<f64> = team_reports.iter().map(|team| team.gpu_hours).collect();
        let offered = self.capacity_gpu_milli as f64 * span_ms as f64;
        let last_end_ms = self
            .runs
            .iter()
            .filter(|run| matches!(run.phase, Phase::Completed | Phase::Killed))
            .map(|run| run.end_ms)
            .max();
        let littles_law = self.littles_law(span_ms, arrived, departed, time_in_system_ms);
        let ratio = |part: u64, whole: u64| (whole > 0).then(|| part as f64 / whole as f64);
        SimReport {
            jobs: self.runs.len() as u64,
            outcomes,
            never_started,
            jct: Summary::of(&mut jct),
            queue_delay: Summary::of(&mut queue_delay),
            makespan: last_end_ms
                .map_or(0.0, |last| seconds(last.saturating_sub(first_arrival_ms))),
            span,
            gpu_utilization: if offered > 0.0 {
                (total_gpu_milli_ms as f64 / offered).min(1.0)
            } else {
                0.0
            },
            gpu_utilization_arrivals: self.utilization_while_arriving(first_arrival_ms),
            gpu_hours: total_gpu_hours,
            jain_fairness: jain_index(&shares),
            teams: team_reports,
            preemptions: self.preemptions,
            preempt_decisions: self.preempt_decisions,
            resizes: self.resizes,
            gpu_seconds_lost: self.lost_gpu_milli_ms as f64 / (GPU_MILLI as f64 * 1000.0),
            multi_gpu_placements: self.multi_gpu,
            multi_gpu_one_node: ratio(self.multi_gpu_one_node, self.multi_gpu),
            multi_gpu_one_rack: ratio(self.multi_gpu_one_rack, self.multi_gpu),
            littles_law,
            submit_retries: self.submit_retries,
            wait_reasons,
            decide_calls: self.decide_calls,
            placements: self.placements,
            events: self.events_done,
            pipelines: self.pipelines.report(self.trace, |job| {
                let run = &self.runs[job as usize];
                (run.phase == Phase::Completed).then_some(run.end_ms)
            }),
        }
    }

    /// Each team's GPU-hours, share of `total_gpu_hours`, jobs and mean
    /// completion time, from the tally's per-team sums.
    fn team_reports(
        &self,
        team_jobs: &[u64],
        team_completed: &[u64],
        team_jct_sum: &[f64],
        total_gpu_hours: f64,
    ) -> Vec<TeamReport> {
        (0..self.trace.teams.len())
            .map(|team| {
                let gpu_hours = gpu_hours_of(self.team_gpu_milli_ms[team]);
                TeamReport {
                    name: self.trace.teams[team].clone(),
                    jobs: team_jobs[team],
                    completed: team_completed[team],
                    gpu_hours,
                    share: if total_gpu_hours > 0.0 {
                        gpu_hours / total_gpu_hours
                    } else {
                        0.0
                    },
                    jct_mean: (team_completed[team] > 0)
                        .then(|| team_jct_sum[team] / team_completed[team] as f64),
                }
            })
            .collect()
    }

    /// Little's law's three figures over a span of `span_ms`, in which
    /// `arrived` jobs arrived and `departed` left after `time_in_system_ms` in all.
    fn littles_law(
        &self,
        span_ms: u64,
        arrived: u64,
        departed: u64,
        time_in_system_ms: u128,
    ) -> LittlesLaw {
        LittlesLaw {
            l: if span_ms > 0 {
                self.area_job_ms as f64 / span_ms as f64
            } else {
                0.0
            },
            lambda: if span_ms > 0 {
                arrived as f64 / seconds(span_ms)
            } else {
                0.0
            },
            w: if departed > 0 {
                time_in_system_ms as f64 / departed as f64 / 1000.0
            } else {
                0.0
            },
        }
    }

    /// GPU utilisation from the first submission to the last, when they differ.
    fn utilization_while_arriving(&self, first_arrival_ms: u64) -> Option<f64> {
        (first_arrival_ms < self.last_arrival_ms).then(|| {
            let window_ms = self.last_arrival_ms - first_arrival_ms;
            self.busy_window_milli_ms as f64 / (self.capacity_gpu_milli as f64 * window_ms as f64)
        })
    }
}
