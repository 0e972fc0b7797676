//! Pipeline workloads for `xp sim generate --pipelines`: many DAGs of stages,
//! each stage a set of parallel jobs that need every job of the stages it
//! needs.
//!
//! Pipelines are instances of a few templates, as teams rerun the same
//! pipeline with new data: a template fixes the stages, their dependencies
//! (about a third are plain chains, the rest fan out and join), their widths
//! (half are one job, the rest 2 to 12, like a sweep), their GPUs and a base
//! duration (log-normal, median 15 minutes). Each instance arrives at a Poisson
//! time, belongs to a Zipf-drawn team, and gives every job its own duration
//! (the base with 25% log-normal noise) and every stage a declared estimate
//! (`estimate_s`: the base with 50% noise, a person's guess). Jobs carry the
//! kind `tTEMPLATE.sSTAGE`, so that a simulator may estimate from earlier runs
//! of the same stage instead. Every job finishes; nothing is preemptible-only
//! or time-limited, so the measured differences come from ordering alone.
//!
//! Templates and instances draw from separate seed streams: more pipelines
//! with the same seed keep the same templates.

use xp_runtime::seeded::{SplitMix64, mix_seed};

use super::generate::{GenerateError, check_rate_and_teams, draw_team, renumber_teams, zipf_teams};
use super::trace::{JobPriority, Trace, TraceJob};

/// The most pipelines one trace may hold.
pub const MAX_PIPELINES: usize = 100_000;
/// The most templates.
pub const MAX_TEMPLATES: u32 = 1000;

const MIN_STAGES: u64 = 3;
const MAX_STAGES: u64 = 10;
const MAX_WIDTH: u64 = 12;
const MEDIAN_STAGE_S: f64 = 900.0;
const STAGE_SIGMA: f64 = 1.0;
const JOB_SIGMA: f64 = 0.25;
const DECLARED_SIGMA: f64 = 0.5;
const MIN_DURATION_S: f64 = 30.0;
const MAX_DURATION_S: f64 = 86_400.0;

/// What to generate.
#[derive(Debug, Clone, PartialEq)]
pub struct PipelineOptions {
    /// How many pipelines.
    pub pipelines: usize,
    /// Mean pipeline arrivals per hour.
    pub rate_per_hour: f64,
    /// How many teams share them (unequally).
    pub teams: u32,
    /// How many distinct pipeline shapes the instances are drawn from.
    pub templates: u32,
    /// The seed.
    pub seed: u64,
}

#[derive(Debug, Clone)]
struct StageTemplate {
    needs: Vec<usize>,
    width: u32,
    gpu_milli: u64,
    base_s: f64,
}

fn stage_template(rng: &mut SplitMix64, index: usize, chain: bool) -> StageTemplate {
    let mut needs = Vec::new();
    if index > 0 {
        if chain || rng.next_f64() < 0.6 {
            needs.push(index - 1);
        } else {
            needs.push(rng.index(index));
        }
        if !chain && index > 1 && rng.next_f64() < 0.3 {
            let extra = rng.index(index);
            if !needs.contains(&extra) {
                needs.push(extra);
            }
        }
    }
    let width = if rng.next_f64() < 0.5 {
        1
    } else {
        2 + rng.below(MAX_WIDTH - 1) as u32
    };
    let gpu_milli = if width > 1 {
        if rng.next_f64() < 0.75 { 1000 } else { 500 }
    } else {
        match rng.next_f64() {
            draw if draw < 0.4 => 1000,
            draw if draw < 0.7 => 2000,
            draw if draw < 0.9 => 4000,
            _ => 8000,
        }
    };
    let base_s = (MEDIAN_STAGE_S.ln() + STAGE_SIGMA * rng.normal())
        .exp()
        .clamp(MIN_DURATION_S, MAX_DURATION_S);
    StageTemplate {
        needs,
        width,
        gpu_milli,
        base_s,
    }
}

fn template(rng: &mut SplitMix64) -> Vec<StageTemplate> {
    let stages = (MIN_STAGES + rng.below(MAX_STAGES - MIN_STAGES + 1)) as usize;
    let chain = rng.next_f64() < 0.3;
    (0..stages)
        .map(|index| stage_template(rng, index, chain))
        .collect()
}

fn noisy_ms(rng: &mut SplitMix64, base_s: f64, sigma: f64) -> u64 {
    let seconds = (base_s.ln() + sigma * rng.normal())
        .exp()
        .clamp(MIN_DURATION_S, MAX_DURATION_S);
    (seconds * 1000.0).round() as u64
}

/// Generates a pipeline workload.
pub fn generate_pipelines(options: &PipelineOptions) -> Result<Trace, GenerateError> {
    if options.pipelines == 0 || options.pipelines > MAX_PIPELINES {
        return Err(GenerateError::Pipelines {
            pipelines: options.pipelines,
        });
    }
    check_rate_and_teams(options.rate_per_hour, options.teams)?;
    if options.templates == 0 || options.templates > MAX_TEMPLATES {
        return Err(GenerateError::Templates {
            templates: options.templates,
        });
    }
    let mut shapes = SplitMix64::new(mix_seed(options.seed, 1));
    let templates: Vec<Vec<StageTemplate>> = (0..options.templates)
        .map(|_| template(&mut shapes))
        .collect();
    let mut rng = SplitMix64::new(mix_seed(options.seed, 2));
    let (cumulative, team_names) = zipf_teams(options.teams);
    let rate_per_second = options.rate_per_hour / 3600.0;
    let mut clock_s = 0.0;
    let mut jobs: Vec<TraceJob> = Vec::new();
    for pipeline in 0..options.pipelines {
        clock_s += rng.exponential(rate_per_second);
        let submit_ms = (clock_s * 1000.0).round() as u64;
        let team = draw_team(&mut rng, &cumulative);
        let template_index = rng.index(templates.len());
        let stages = &templates[template_index];
        // The trace indexes of each stage's jobs, for the stages after it.
        let mut stage_jobs: Vec<Vec<u32>> = Vec::with_capacity(stages.len());
        for (stage_index, stage) in stages.iter().enumerate() {
            let deps: Vec<u32> = stage
                .needs
                .iter()
                .flat_map(|&need| stage_jobs[need].iter().copied())
                .collect();
            let declared_ms = noisy_ms(&mut rng, stage.base_s, DECLARED_SIGMA);
            let estimate_ms = declared_ms.div_ceil(1000) * 1000;
            let mut members = Vec::with_capacity(stage.width as usize);
            for job in 0..stage.width {
                members.push(u32::try_from(jobs.len()).expect("MAX_PIPELINES bounds the rows"));
                jobs.push(TraceJob {
                    job_id: format!("p{pipeline}.s{stage_index}.{job}"),
                    submit_ms,
                    duration_ms: Some(noisy_ms(&mut rng, stage.base_s, JOB_SIGMA)),
                    num_workers: 1,
                    gpu_milli_per_worker: stage.gpu_milli,
                    cpu_milli_per_worker: 8 * stage.gpu_milli,
                    mem_mib_per_worker: 64 * stage.gpu_milli * 1024 / 1000,
                    gpu_types: Vec::new(),
                    priority: Some(JobPriority::Value(0)),
                    team,
                    preemptible: true,
                    time_limit_ms: None,
                    ckpt_interval_ms: None,
                    deps: deps.clone(),
                    line: 0,
                    estimate_ms: Some(estimate_ms),
                    kind: Some(format!("t{template_index}.s{stage_index}")),
                    gpu_mem_peak_milli: None,
                    gpu_mem_peak_at_ms: None,
                    oversubscribe: false,
                    elastic: None,
                });
            }
            stage_jobs.push(members);
        }
    }
    let teams = renumber_teams(&mut jobs, &team_names);
    Ok(Trace { jobs, teams })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dag::topo_order;
    use crate::sim::trace::parse_trace;

    fn options(pipelines: usize, seed: u64) -> PipelineOptions {
        PipelineOptions {
            pipelines,
            rate_per_hour: 4.0,
            teams: 2,
            templates: 4,
            seed,
        }
    }

    #[test]
    fn same_seed_same_trace_and_it_parses_back() {
        let trace = generate_pipelines(&options(30, 7)).unwrap();
        assert!(trace == generate_pipelines(&options(30, 7)).unwrap());
        assert!(trace != generate_pipelines(&options(30, 8)).unwrap());
        let mut again = parse_trace(&trace.to_csv()).unwrap();
        for job in &mut again.jobs {
            job.line = 0;
        }
        assert!(trace == again, "the trace changed on its way through CSV");
    }

    #[test]
    fn pipelines_are_acyclic_dags_of_varied_stages() {
        let trace = generate_pipelines(&PipelineOptions {
            templates: 20,
            ..options(200, 3)
        })
        .unwrap();
        let needs: Vec<Vec<usize>> = trace
            .jobs
            .iter()
            .map(|job| job.deps.iter().map(|&dep| dep as usize).collect())
            .collect();
        topo_order(&needs).unwrap();
        let mut widths = std::collections::BTreeMap::<String, u32>::new();
        let mut longest_chain = 0;
        for job in &trace.jobs {
            let stage_key = job.job_id.rsplit_once('.').unwrap().0.to_owned();
            *widths.entry(stage_key).or_default() += 1;
            let stage: usize = job.job_id.split('.').nth(1).unwrap()[1..].parse().unwrap();
            longest_chain = longest_chain.max(stage + 1);
            // Jobs of one stage share a kind; a dependency is always an earlier
            // stage of the same pipeline.
            let pipeline = job.job_id.split('.').next().unwrap();
            for &dep in &job.deps {
                let dep = &trace.jobs[dep as usize];
                assert_eq!(dep.job_id.split('.').next().unwrap(), pipeline);
                assert_eq!(dep.submit_ms, job.submit_ms);
            }
            assert!(job.estimate_ms.is_some() && job.kind.is_some());
        }
        assert!(widths.values().any(|&width| width == 1));
        assert!(widths.values().any(|&width| width >= 6));
        assert!(longest_chain >= 8, "longest chain {longest_chain}");
        let first = trace.jobs.first().unwrap().submit_ms;
        let last = trace.jobs.last().unwrap().submit_ms;
        // 200 arrivals at 4 an hour: about 50 hours.
        let hours = (last - first) as f64 / 3_600_000.0;
        assert!((35.0..65.0).contains(&hours), "{hours} hours");
    }

    #[test]
    fn bad_options_are_refused() {
        assert!(matches!(
            generate_pipelines(&options(0, 0)),
            Err(GenerateError::Pipelines { pipelines: 0 })
        ));
        assert!(matches!(
            generate_pipelines(&PipelineOptions {
                templates: 0,
                ..options(1, 0)
            }),
            Err(GenerateError::Templates { templates: 0 })
        ));
        assert!(
            generate_pipelines(&PipelineOptions {
                rate_per_hour: -1.0,
                ..options(1, 0)
            })
            .is_err()
        );
        assert!(
            generate_pipelines(&PipelineOptions {
                teams: 0,
                ..options(1, 0)
            })
            .is_err()
        );
    }
}
