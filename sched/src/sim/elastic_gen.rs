//! Making a share of a generated workload elastic, for `xp sim generate
//! --elastic SHARE`.
//!
//! A job whose workers each hold one whole GPU (data-parallel training) is
//! made elastic with probability `share`: `min_workers` half its size (at
//! least 1), `max_workers` twice its size (at most [`MAX_ELASTIC_WORKERS`]),
//! linear scaling, and a checkpoint every 10 minutes when it has none (an
//! elastic job resumes from its checkpoint after each resize). Its
//! `num_workers` and `duration_s` stay as they were, so the same trace with the
//! elastic columns left out (`fixed`) runs the very same jobs at a fixed size:
//! that pair is how elastic trials are measured against fixed gangs.
//!
//! The draws come from their own [`SplitMix64`] stream, so a seed's jobs are
//! the same with or without `--elastic`.

use xp_runtime::seeded::{SplitMix64, mix_seed};

use super::trace::{ElasticJob, Trace};
use crate::GPU_MILLI;

/// The most workers an elastic job grows to.
pub const MAX_ELASTIC_WORKERS: u32 = 64;
/// The checkpoint interval given to an elastic job that has none, ms.
const ELASTIC_CKPT_MS: u64 = 600_000;

/// Why `--elastic` is refused.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("the elastic share must be between 0 and 1 (got {share})")]
pub struct ElasticShareError {
    /// The value given.
    pub share: f64,
}

/// Makes about `share` of the trace's one-GPU-per-worker jobs elastic (see
/// the module); with `fixed`, the same jobs (and checkpoint intervals) keep
/// their fixed size instead. Returns how many jobs it chose.
pub fn make_elastic(
    trace: &mut Trace,
    share: f64,
    seed: u64,
    fixed: bool,
) -> Result<usize, ElasticShareError> {
    if !(share.is_finite() && (0.0..=1.0).contains(&share)) {
        return Err(ElasticShareError { share });
    }
    let mut rng = SplitMix64::new(mix_seed(seed, 0x00e1_a571_c000));
    let mut chosen = 0;
    for job in &mut trace.jobs {
        let draw = rng.next_f64();
        if job.gpu_milli_per_worker != GPU_MILLI || draw >= share {
            continue;
        }
        chosen += 1;
        job.ckpt_interval_ms.get_or_insert(ELASTIC_CKPT_MS);
        if !fixed {
            job.elastic = Some(ElasticJob {
                min_workers: (job.num_workers / 2).max(1),
                max_workers: (job.num_workers * 2)
                    .min(MAX_ELASTIC_WORKERS)
                    .max(job.num_workers),
                scaling_milli: 1000,
            });
        }
    }
    Ok(chosen)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sim::{GenerateOptions, generate, parse_trace};

    fn trace() -> Trace {
        generate(&GenerateOptions {
            jobs: 400,
            rate_per_hour: 20.0,
            teams: 2,
            seed: 3,
        })
        .unwrap()
    }

    #[test]
    fn the_same_jobs_come_out_elastic_or_fixed_and_round_trip() {
        let plain = trace();
        let mut elastic = trace();
        let mut fixed = trace();
        let chosen = make_elastic(&mut elastic, 0.5, 9, false).unwrap();
        assert_eq!(make_elastic(&mut fixed, 0.5, 9, true).unwrap(), chosen);
        assert!(chosen > 50, "{chosen} of 400");
        for ((plain, elastic), fixed) in plain.jobs.iter().zip(&elastic.jobs).zip(&fixed.jobs) {
            assert_eq!(elastic.num_workers, plain.num_workers);
            assert_eq!(elastic.duration_ms, plain.duration_ms);
            assert_eq!(fixed.elastic, None);
            if let Some(range) = elastic.elastic {
                assert_eq!(plain.gpu_milli_per_worker, GPU_MILLI);
                assert!(range.min_workers <= elastic.num_workers);
                assert!(range.max_workers >= elastic.num_workers);
                assert!(elastic.ckpt_interval_ms.is_some());
                assert_eq!(fixed.ckpt_interval_ms, elastic.ckpt_interval_ms);
            }
        }
        let elastic_jobs = elastic
            .jobs
            .iter()
            .filter(|job| job.elastic.is_some())
            .count();
        assert_eq!(elastic_jobs, chosen);
        let again = parse_trace(&elastic.to_csv()).unwrap();
        let ranges = |trace: &Trace| -> Vec<Option<ElasticJob>> {
            trace.jobs.iter().map(|job| job.elastic).collect()
        };
        assert_eq!(ranges(&again), ranges(&elastic));
        assert!(make_elastic(&mut fixed, 1.5, 9, false).is_err());
        assert!(make_elastic(&mut fixed, -0.1, 9, false).is_err());
        assert!(make_elastic(&mut fixed, f64::NAN, 9, false).is_err());
    }

    #[test]
    fn elastic_columns_are_checked() {
        let header = "job_id,submit_s,duration_s,num_workers,gpus_per_worker,min_workers,max_workers,scaling";
        let parse = |row: &str| parse_trace(&format!("{header}\n{row}\n"));
        let job = parse("a,0,10,4,1,2,8,0.5").unwrap().jobs.remove(0);
        assert_eq!(
            job.elastic,
            Some(ElasticJob {
                min_workers: 2,
                max_workers: 8,
                scaling_milli: 500
            })
        );
        assert!((job.elastic.unwrap().speed(4, 8) - 2f64.sqrt()).abs() < 1e-12);
        assert_eq!(parse("a,0,10,4,1,,,").unwrap().jobs[0].elastic, None);
        for (row, fragment) in [
            ("a,0,10,4,1,2,,", "both min_workers and max_workers"),
            ("a,0,10,4,1,,8,", "both min_workers and max_workers"),
            ("a,0,10,4,1,0,8,", "between 1 and num_workers"),
            ("a,0,10,4,1,5,8,", "between 1 and num_workers"),
            ("a,0,10,4,1,2,3,", "at least num_workers"),
            ("a,0,10,4,1,2,8,0", "above 0 and at most 1"),
            ("a,0,10,4,1,2,8,1.5", "above 0 and at most 1"),
            ("a,0,10,4,1,2,8,NaN", "above 0 and at most 1"),
            ("a,0,10,4,1,,,0.5", "only meaningful"),
        ] {
            let error = parse(row).expect_err(row).to_string();
            assert!(error.contains(fragment), "{row}: {error}");
        }
    }
}
