//! A synthetic workload generator for `xp sim generate`.
//!
//! Poisson arrivals, log-normal (heavy-tailed) durations, a mix of fractional
//! GPUs (0.25, 0.5), single-worker jobs of 1 to 8 GPUs and gangs of 2 to 16
//! workers, a few CPU-only jobs, integer priorities, teams with Zipf-distributed
//! (unequal) load, some time limits (a few shorter than the job, so it is
//! killed), checkpoint intervals, non-preemptible jobs and dependencies on
//! earlier jobs. Every job finishes, so a simulation of a generated trace empties.
//!
//! The random numbers come from [`SplitMix64`], so that a seed gives the same trace
//! across dependency upgrades.

use xp_runtime::seeded::SplitMix64;

use super::trace::{JobPriority, MAX_ROWS, Trace, TraceJob};

/// The most teams the generator makes.
pub const MAX_TEAMS: u32 = 1000;

/// What to generate.
#[derive(Debug, Clone, PartialEq)]
pub struct GenerateOptions {
    /// How many jobs.
    pub jobs: usize,
    /// Mean arrivals per hour.
    pub rate_per_hour: f64,
    /// How many teams share the load (unequally).
    pub teams: u32,
    /// The seed.
    pub seed: u64,
}

/// Why generation options are refused.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum GenerateError {
    /// `jobs` is 0 or above the trace row limit.
    #[error("jobs must be between 1 and {MAX_ROWS} (got {jobs})")]
    Jobs {
        /// The value given.
        jobs: usize,
    },
    /// The rate is not a positive finite number.
    #[error("the rate must be a positive number of arrivals per hour up to 1e9 (got {rate})")]
    Rate {
        /// The value given.
        rate: f64,
    },
    /// `teams` is 0 or above [`MAX_TEAMS`].
    #[error("teams must be between 1 and {MAX_TEAMS} (got {teams})")]
    Teams {
        /// The value given.
        teams: u32,
    },
    /// `pipelines` is 0 or above [`MAX_PIPELINES`](super::pipeline_gen::MAX_PIPELINES).
    #[error("pipelines must be between 1 and {max} (got {pipelines})", max = super::pipeline_gen::MAX_PIPELINES)]
    Pipelines {
        /// The value given.
        pipelines: usize,
    },
    /// The duration scale is outside 1/[`MAX_DURATION_SCALE`] to
    /// [`MAX_DURATION_SCALE`].
    #[error("the duration scale must be between 0.001 and {MAX_DURATION_SCALE} (got {scale})")]
    DurationScale {
        /// The value given.
        scale: f64,
    },
    /// `templates` is 0 or above [`MAX_TEMPLATES`](super::pipeline_gen::MAX_TEMPLATES).
    #[error("templates must be between 1 and {max} (got {templates})", max = super::pipeline_gen::MAX_TEMPLATES)]
    Templates {
        /// The value given.
        templates: u32,
    },
}

/// One gang shape of the mix: cumulative probability, workers, GPU thousandths per worker.
const SHAPES: [(f64, u32, u64); 13] = [
    (0.10, 1, 250),
    (0.20, 1, 500),
    (0.55, 1, 1000),
    (0.63, 1, 2000),
    (0.70, 1, 4000),
    (0.75, 1, 8000),
    (0.83, 2, 1000),
    (0.89, 4, 1000),
    (0.93, 8, 1000),
    (0.95, 16, 1000),
    (0.97, 2, 8000),
    (0.98, 4, 8000),
    (1.00, 1, 0),
];

const MEDIAN_DURATION_S: f64 = 1800.0;
const DURATION_SIGMA: f64 = 1.5;
const MIN_DURATION_S: f64 = 30.0;
const MAX_DURATION_S: f64 = 14.0 * 86_400.0;

/// The widest duration scale [`scale_time`] takes, either way.
pub const MAX_DURATION_SCALE: f64 = 1000.0;

/// Changes the unit of time of a trace: every job's duration, submission
/// time, time limit, checkpoint interval, estimate and memory peak time is
/// multiplied by `scale` (rounded to the millisecond, durations to at least
/// one), so arrivals come `1 / scale` times as often and the load (work
/// arriving per unit of time against the cluster) stays the same. A policy
/// that does not depend on the unit of time gives the same report with its
/// times scaled. Refused unless `scale` is within 1/1000 to 1000.
pub fn scale_time(trace: &mut Trace, scale: f64) -> Result<(), GenerateError> {
    if !(scale.is_finite() && (1.0 / MAX_DURATION_SCALE..=MAX_DURATION_SCALE).contains(&scale)) {
        return Err(GenerateError::DurationScale { scale });
    }
    let times = |ms: u64| (ms as f64 * scale).round() as u64;
    for job in &mut trace.jobs {
        job.submit_ms = times(job.submit_ms);
        job.duration_ms = job.duration_ms.map(|ms| times(ms).max(1));
        job.time_limit_ms = job.time_limit_ms.map(|ms| times(ms).max(1));
        job.ckpt_interval_ms = job.ckpt_interval_ms.map(|ms| times(ms).max(1));
        job.estimate_ms = job.estimate_ms.map(|ms| times(ms).max(1));
        job.gpu_mem_peak_at_ms = job.gpu_mem_peak_at_ms.map(times);
    }
    Ok(())
}

/// Checks a generator's job count: 1 to [`MAX_ROWS`].
pub(super) fn check_jobs(jobs: usize) -> Result<(), GenerateError> {
    if jobs == 0 || jobs > MAX_ROWS {
        return Err(GenerateError::Jobs { jobs });
    }
    Ok(())
}

/// Checks a generator's arrival rate (finite, above 0, at most 1e9 per hour)
/// and team count (1 to [`MAX_TEAMS`]).
pub(super) fn check_rate_and_teams(rate_per_hour: f64, teams: u32) -> Result<(), GenerateError> {
    if !(rate_per_hour.is_finite() && rate_per_hour > 0.0 && rate_per_hour <= 1e9) {
        return Err(GenerateError::Rate {
            rate: rate_per_hour,
        });
    }
    if teams == 0 || teams > MAX_TEAMS {
        return Err(GenerateError::Teams { teams });
    }
    Ok(())
}

/// Generates a trace.
pub fn generate(options: &GenerateOptions) -> Result<Trace, GenerateError> {
    check_jobs(options.jobs)?;
    check_rate_and_teams(options.rate_per_hour, options.teams)?;
    let mut rng = SplitMix64::new(options.seed);
    let (cumulative, teams) = zipf_teams(options.teams);
    let rate_per_second = options.rate_per_hour / 3600.0;
    let mut clock_s = 0.0;
    let mut jobs = Vec::with_capacity(options.jobs);
    for index in 0..options.jobs {
        clock_s += rng.exponential(rate_per_second);
        let team = draw_team(&mut rng, &cumulative);
        let draw = rng.next_f64();
        let &(_, num_workers, gpu_milli) = SHAPES
            .iter()
            .find(|(edge, _, _)| draw < *edge)
            .unwrap_or(&SHAPES[SHAPES.len() - 1]);
        let (cpu_milli, mem_mib) = if gpu_milli == 0 {
            (8000, 32_768)
        } else {
            // Eight cores and 64 GiB per GPU, in proportion for fractions.
            (8 * gpu_milli, 64 * gpu_milli * 1024 / 1000)
        };
        let duration_s = (MEDIAN_DURATION_S.ln() + DURATION_SIGMA * rng.normal())
            .exp()
            .clamp(MIN_DURATION_S, MAX_DURATION_S);
        let duration_ms = (duration_s * 1000.0).round() as u64;
        let time_limit_ms = (rng.next_f64() < 0.35).then(|| {
            // A limit rounded up to ten minutes, sometimes short of the duration.
            let factor = 0.7 + 2.3 * rng.next_f64();
            let limit_s = (duration_s * factor / 600.0).ceil() * 600.0;
            (limit_s * 1000.0) as u64
        });
        let ckpt_interval_ms = (gpu_milli >= 1000 && rng.next_f64() < 0.5)
            .then(|| [600_000, 1_800_000, 3_600_000][rng.below(3) as usize]);
        let priority = match rng.next_f64() {
            draw if draw < 0.75 => 0,
            draw if draw < 0.95 => 10,
            _ => 100,
        };
        let preemptible = rng.next_f64() < 0.9;
        let mut deps = Vec::new();
        if index > 0 && rng.next_f64() < 0.03 {
            let back = 1 + rng.below(index.min(20) as u64) as usize;
            deps.push(u32::try_from(index - back).expect("at most MAX_ROWS jobs"));
        }
        jobs.push(TraceJob {
            job_id: format!("j{index}"),
            submit_ms: (clock_s * 1000.0).round() as u64,
            duration_ms: Some(duration_ms),
            num_workers,
            gpu_milli_per_worker: gpu_milli,
            cpu_milli_per_worker: cpu_milli,
            mem_mib_per_worker: mem_mib,
            gpu_types: Vec::new(),
            priority: Some(JobPriority::Value(priority)),
            team,
            preemptible,
            time_limit_ms,
            ckpt_interval_ms,
            deps,
            line: 0,
            estimate_ms: None,
            kind: None,
            gpu_mem_peak_milli: None,
            gpu_mem_peak_at_ms: None,
            oversubscribe: false,
            elastic: None,
        });
    }
    let teams = renumber_teams(&mut jobs, &teams);
    Ok(Trace { jobs, teams })
}

/// Cumulative Zipf weights over `teams` teams (team k carries 1/(k+1) of the
/// load, relative to team 0) and the team names.
pub(super) fn zipf_teams(teams: u32) -> (Vec<f64>, Vec<String>) {
    let mut cumulative = Vec::with_capacity(teams as usize);
    let mut total = 0.0;
    for team in 0..teams {
        total += 1.0 / f64::from(team + 1);
        cumulative.push(total);
    }
    let names = (1..=teams).map(|team| format!("team-{team}")).collect();
    (cumulative, names)
}

/// Draws a team index from cumulative weights.
pub(super) fn draw_team(rng: &mut SplitMix64, cumulative: &[f64]) -> u32 {
    let total = *cumulative.last().expect("at least one team");
    let draw = rng.next_f64() * total;
    let team = cumulative
        .partition_point(|&edge| edge <= draw)
        .min(cumulative.len() - 1);
    u32::try_from(team).expect("at most MAX_TEAMS teams")
}

/// Renumbers the jobs' teams in order of first appearance, as in a parsed
/// trace, and returns the names in that order.
pub(super) fn renumber_teams(jobs: &mut [TraceJob], names: &[String]) -> Vec<String> {
    let mut renumber = vec![u32::MAX; names.len()];
    let mut ordered = Vec::new();
    for job in jobs {
        let old = job.team as usize;
        if renumber[old] == u32::MAX {
            renumber[old] = u32::try_from(ordered.len()).expect("at most MAX_TEAMS teams");
            ordered.push(names[old].clone());
        }
        job.team = renumber[old];
    }
    ordered
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sim::trace::parse_trace;

    fn options(jobs: usize, seed: u64) -> GenerateOptions {
        GenerateOptions {
            jobs,
            rate_per_hour: 600.0,
            teams: 3,
            seed,
        }
    }

    #[test]
    fn same_seed_same_trace() {
        assert!(generate(&options(200, 7)).unwrap() == generate(&options(200, 7)).unwrap());
        assert!(generate(&options(200, 7)).unwrap() != generate(&options(200, 8)).unwrap());
    }

    #[test]
    fn scaling_time_scales_every_time_of_every_job() {
        let trace = generate(&options(300, 3)).unwrap();
        let mut scaled = trace.clone();
        scale_time(&mut scaled, 10.0).unwrap();
        for (job, tenfold) in trace.jobs.iter().zip(&scaled.jobs) {
            assert_eq!(tenfold.submit_ms, job.submit_ms * 10);
            assert_eq!(tenfold.duration_ms, job.duration_ms.map(|ms| ms * 10));
            assert_eq!(tenfold.time_limit_ms, job.time_limit_ms.map(|ms| ms * 10));
            assert_eq!(
                tenfold.ckpt_interval_ms,
                job.ckpt_interval_ms.map(|ms| ms * 10)
            );
            assert_eq!(tenfold.gpu_milli_per_worker, job.gpu_milli_per_worker);
        }
        for scale in [0.0, -1.0, f64::NAN, 1e4] {
            assert!(scale_time(&mut scaled, scale).is_err(), "{scale}");
        }
    }

    #[test]
    fn generated_trace_parses_back() {
        let trace = generate(&options(500, 1)).unwrap();
        let mut again = parse_trace(&trace.to_csv()).unwrap();
        for job in &mut again.jobs {
            job.line = 0;
        }
        assert!(trace == again, "the trace changed on its way through CSV");
    }

    #[test]
    fn mix_and_rate_are_as_described() {
        let trace = generate(&GenerateOptions {
            jobs: 20_000,
            rate_per_hour: 3600.0,
            teams: 4,
            seed: 3,
        })
        .unwrap();
        let last_s = trace.jobs.last().unwrap().submit_ms as f64 / 1000.0;
        // 20,000 arrivals at one per second: within 3% of 20,000 s.
        assert!(
            (last_s / 20_000.0 - 1.0).abs() < 0.03,
            "last arrival at {last_s}"
        );
        let fraction = |keep: &dyn Fn(&TraceJob) -> bool| {
            trace.jobs.iter().filter(|job| keep(job)).count() as f64 / 20_000.0
        };
        let fractional =
            fraction(&|job| job.gpu_milli_per_worker > 0 && job.gpu_milli_per_worker < 1000);
        assert!((fractional - 0.2).abs() < 0.02, "fractional {fractional}");
        assert!(fraction(&|job| job.num_workers == 16) > 0.01);
        assert!(
            fraction(&|job| job
                .time_limit_ms
                .is_some_and(|limit| limit < job.duration_ms.unwrap()))
                > 0.01
        );
        let mut per_team = [0usize; 4];
        for job in &trace.jobs {
            let name = &trace.teams[job.team as usize];
            per_team[name["team-".len()..].parse::<usize>().unwrap() - 1] += 1;
        }
        assert!(
            per_team[0] > per_team[1] && per_team[1] > per_team[2] && per_team[2] > per_team[3],
            "{per_team:?}"
        );
        let mut durations: Vec<u64> = trace
            .jobs
            .iter()
            .map(|job| job.duration_ms.unwrap())
            .collect();
        durations.sort_unstable();
        let median_s = durations[durations.len() / 2] as f64 / 1000.0;
        assert!(
            (median_s / MEDIAN_DURATION_S - 1.0).abs() < 0.1,
            "median {median_s}"
        );
        for job in &trace.jobs {
            for &dep in &job.deps {
                assert!(trace.jobs[dep as usize].submit_ms <= job.submit_ms);
            }
        }
    }

    #[test]
    fn bad_options_are_refused() {
        assert!(
            generate(&GenerateOptions {
                jobs: 0,
                ..options(1, 0)
            })
            .is_err()
        );
        assert!(
            generate(&GenerateOptions {
                rate_per_hour: f64::NAN,
                ..options(1, 0)
            })
            .is_err()
        );
        assert!(
            generate(&GenerateOptions {
                teams: 0,
                ..options(1, 0)
            })
            .is_err()
        );
    }

    #[test]
    fn uniform_draws_stay_in_range() {
        let mut rng = SplitMix64::new(0);
        for _ in 0..10_000 {
            let value = rng.next_f64();
            assert!((0.0..1.0).contains(&value));
            assert!(rng.below(5) < 5);
        }
    }
}
