//! A deep-learning training workload for `xp sim generate --mix dl`: few jobs,
//! gangs of 1 to 32 GPUs, heavy-tailed durations, every job preemptible and
//! most checkpointing, no time limits and no priorities, so that a scheduler
//! is judged on order alone with no duration to go by.
//!
//! Its shape follows the published deep-learning cluster traces (Microsoft's
//! Philly, as Tiresias used it): most jobs take one GPU, a tail takes 8 to 32,
//! and durations spread over orders of magnitude with no link to the gang
//! size. Gangs of up to 8 GPUs are one worker; larger ones are workers of 8
//! GPUs, so a 32-GPU job needs four 8-GPU nodes. The random numbers come from
//! [`SplitMix64`], so a seed gives the same trace across dependency upgrades.

use xp_runtime::seeded::SplitMix64;

use super::generate::{
    GenerateError, check_jobs, check_rate_and_teams, draw_team, renumber_teams, zipf_teams,
};
use super::trace::{JobPriority, Trace, TraceJob};

/// Cumulative probability and GPUs of each gang size.
const GANGS: [(f64, u32); 6] = [
    (0.45, 1),
    (0.60, 2),
    (0.74, 4),
    (0.87, 8),
    (0.96, 16),
    (1.00, 32),
];

const MEDIAN_DURATION_S: f64 = 5400.0;
const DURATION_SIGMA: f64 = 1.4;
const MIN_DURATION_S: f64 = 120.0;
const MAX_DURATION_S: f64 = 3.0 * 86_400.0;
/// Checkpoint intervals drawn for the jobs that checkpoint.
const CHECKPOINT_INTERVALS_MS: [u64; 3] = [900_000, 1_800_000, 3_600_000];
/// The share of jobs that checkpoint.
const CHECKPOINTING: f64 = 0.8;

/// What to generate: the common options of `xp sim generate`.
#[derive(Debug, Clone, PartialEq)]
pub struct DeepLearningOptions {
    /// How many jobs.
    pub jobs: usize,
    /// Mean arrivals per hour.
    pub rate_per_hour: f64,
    /// How many teams share the load (unequally).
    pub teams: u32,
    /// The seed.
    pub seed: u64,
}

/// Generates a deep-learning trace.
pub fn generate_deep_learning(options: &DeepLearningOptions) -> Result<Trace, GenerateError> {
    check_jobs(options.jobs)?;
    check_rate_and_teams(options.rate_per_hour, options.teams)?;
    let mut rng = SplitMix64::new(options.seed);
    let (cumulative, teams) = zipf_teams(options.teams);
    let rate_per_second = options.rate_per_hour / 3600.0;
    let mut clock_s = 0.0;
    let mut jobs = Vec::with_capacity(options.jobs);
    for index in 0..options.jobs {
        // The first job arrives at time zero, the rest by the Poisson clock.
        if index > 0 {
            clock_s += rng.exponential(rate_per_second);
        }
        let team = draw_team(&mut rng, &cumulative);
        let draw = rng.next_f64();
        let gpus = GANGS
            .iter()
            .find(|(edge, _)| draw < *edge)
            .map_or(GANGS[GANGS.len() - 1].1, |(_, gpus)| *gpus);
        let (num_workers, gpus_per_worker) = if gpus <= 8 { (1, gpus) } else { (gpus / 8, 8) };
        let gpu_milli = u64::from(gpus_per_worker) * 1000;
        let duration_s = (MEDIAN_DURATION_S.ln() + DURATION_SIGMA * rng.normal())
            .exp()
            .clamp(MIN_DURATION_S, MAX_DURATION_S);
        let ckpt_interval_ms = (rng.next_f64() < CHECKPOINTING).then(|| {
            CHECKPOINT_INTERVALS_MS[rng.below(CHECKPOINT_INTERVALS_MS.len() as u64) as usize]
        });
        jobs.push(TraceJob {
            job_id: format!("dl{index}"),
            submit_ms: (clock_s * 1000.0).round() as u64,
            duration_ms: Some((duration_s * 1000.0).round() as u64),
            num_workers,
            gpu_milli_per_worker: gpu_milli,
            // Eight cores and 64 GiB per GPU.
            cpu_milli_per_worker: 8 * gpu_milli,
            mem_mib_per_worker: 64 * gpu_milli * 1024 / 1000,
            gpu_types: Vec::new(),
            priority: Some(JobPriority::Value(0)),
            team,
            preemptible: true,
            time_limit_ms: None,
            ckpt_interval_ms,
            deps: Vec::new(),
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sim::trace::parse_trace;

    fn options(jobs: usize, seed: u64) -> DeepLearningOptions {
        DeepLearningOptions {
            jobs,
            rate_per_hour: 3.0,
            teams: 1,
            seed,
        }
    }

    #[test]
    fn gangs_durations_and_checkpoints_are_as_described() {
        let trace = generate_deep_learning(&options(5000, 4)).unwrap();
        let share = |gpus: u64| {
            trace
                .jobs
                .iter()
                .filter(|job| job.total_gpu_milli() == gpus * 1000)
                .count() as f64
                / 5000.0
        };
        assert!((share(1) - 0.45).abs() < 0.03, "1 GPU: {}", share(1));
        assert!((share(32) - 0.04).abs() < 0.015, "32 GPUs: {}", share(32));
        for job in &trace.jobs {
            assert!(job.num_workers == 1 || job.gpu_milli_per_worker == 8000);
            assert!(job.time_limit_ms.is_none() && job.preemptible && job.deps.is_empty());
        }
        let checkpointing = trace
            .jobs
            .iter()
            .filter(|job| job.ckpt_interval_ms.is_some())
            .count() as f64
            / 5000.0;
        assert!((checkpointing - CHECKPOINTING).abs() < 0.03);
        let mut durations: Vec<u64> = trace
            .jobs
            .iter()
            .map(|job| job.duration_ms.unwrap())
            .collect();
        durations.sort_unstable();
        let median_s = durations[2500] as f64 / 1000.0;
        assert!(
            (median_s / MEDIAN_DURATION_S - 1.0).abs() < 0.1,
            "median {median_s}"
        );
    }

    #[test]
    fn same_seed_same_trace_and_it_parses_back() {
        let trace = generate_deep_learning(&options(60, 9)).unwrap();
        assert!(trace == generate_deep_learning(&options(60, 9)).unwrap());
        assert!(trace != generate_deep_learning(&options(60, 10)).unwrap());
        let mut again = parse_trace(&trace.to_csv()).unwrap();
        for job in &mut again.jobs {
            job.line = 0;
        }
        assert!(trace == again, "the trace changed on its way through CSV");
    }

    #[test]
    fn bad_options_are_refused() {
        assert!(generate_deep_learning(&options(0, 0)).is_err());
        assert!(
            generate_deep_learning(&DeepLearningOptions {
                rate_per_hour: -1.0,
                ..options(1, 0)
            })
            .is_err()
        );
    }
}
