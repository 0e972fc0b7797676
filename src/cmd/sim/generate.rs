//! `xp sim generate`: writes a synthetic trace (jobs, pipelines, elastic jobs,
//! or GPU-sharing pods with their cluster) through the generators in
//! `xp_sched::sim`.

use std::path::{Path, PathBuf};

use anyhow::Context;
use xp_sched::sim::{
    DeepLearningOptions, GenerateOptions, GpuSharingOptions, PipelineOptions, Trace,
};

// The subcommand's description is the doc comment of `SimCommand::Generate`.
#[derive(clap::Args, Debug)]
pub(super) struct GenerateArgs {
    /// How many jobs.
    #[arg(
        long,
        required_unless_present_any = ["pipelines", "gpu_sharing"],
        conflicts_with_all = ["pipelines", "gpu_sharing"]
    )]
    jobs: Option<usize>,
    /// Generate this many pipelines instead: DAGs of stages (chains, fan-outs
    /// and joins, widths 1 to 12), with declared estimates and stage kinds.
    #[arg(long)]
    pipelines: Option<usize>,
    /// With --pipelines: how many pipeline shapes the pipelines reuse
    /// [default: 4].
    #[arg(long)]
    templates: Option<u32>,
    /// Generate this many GPU-sharing pods instead, shaped like Alibaba's
    /// openb trace (mostly fractional GPUs, CPU and memory asks, some GPU
    /// model constraints), for `--place-once`; needs --cluster-out.
    #[arg(long, conflicts_with = "pipelines", requires = "cluster_out")]
    gpu_sharing: Option<usize>,
    /// With --gpu-sharing: write the matching cluster (1,213 nodes, 6,212
    /// GPUs of eight models) here as YAML.
    #[arg(long)]
    cluster_out: Option<PathBuf>,
    /// Mean arrivals (jobs, or pipelines) per hour.
    #[arg(long, required_unless_present = "gpu_sharing")]
    rate: Option<f64>,
    /// How many teams share the load (unequally).
    #[arg(long, default_value_t = 4)]
    teams: u32,
    /// With --jobs, the job mix: `default` (fractions, gangs of 1 to 16
    /// GPUs, priorities, limits, dependencies) or `dl` (deep-learning
    /// training gangs of 1 to 32 GPUs, heavy-tailed durations, most jobs
    /// checkpointing; no priorities, limits or dependencies).
    #[arg(long, value_parser = ["default", "dl"], default_value = "default")]
    mix: String,
    /// The seed.
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// With --jobs: make this share (0 to 1) of the jobs whose workers
    /// hold one GPU each elastic (half to twice their size, linear
    /// scaling, a checkpoint every 10 minutes when they have none).
    #[arg(long, conflicts_with_all = ["pipelines", "gpu_sharing"])]
    elastic: Option<f64>,
    /// With --elastic: write the very same jobs at their fixed size (the
    /// elastic columns left out), to measure elastic trials against.
    #[arg(long, requires = "elastic")]
    fixed_size: bool,
    /// Change the unit of time: every duration, submission time, time
    /// limit and checkpoint interval times this (0.001 to 1000), so the
    /// same work arrives at the same load with durations that many times
    /// longer (arrivals that many times rarer).
    #[arg(long, conflicts_with = "gpu_sharing")]
    duration_scale: Option<f64>,
    /// Write here instead of standard output.
    #[arg(long)]
    out: Option<PathBuf>,
}

/// Runs `xp sim generate`.
pub(super) fn run(args: GenerateArgs) -> anyhow::Result<()> {
    anyhow::ensure!(
        args.cluster_out.is_none() || args.gpu_sharing.is_some(),
        "--cluster-out needs --gpu-sharing"
    );
    if let Some(pods) = args.gpu_sharing {
        return gpu_sharing(pods, &args);
    }
    let rate = args.rate.context("--rate is required")?;
    // Checked here: clap does not enforce `requires` inside this subcommand.
    anyhow::ensure!(
        args.templates.is_none() || args.pipelines.is_some(),
        "--templates needs --pipelines"
    );
    let mut trace = generate_trace(&args, rate)?;
    if let Some(share) = args.elastic {
        xp_sched::sim::make_elastic(&mut trace, share, args.seed, args.fixed_size)?;
    }
    if let Some(scale) = args.duration_scale {
        xp_sched::sim::scale_time(&mut trace, scale)?;
    }
    write_trace(&trace, args.out.as_deref())
}

/// `--gpu-sharing`: the pods' trace, and their cluster in `--cluster-out`.
fn gpu_sharing(pods: usize, args: &GenerateArgs) -> anyhow::Result<()> {
    let workload = xp_sched::sim::generate_gpu_sharing(&GpuSharingOptions {
        pods,
        seed: args.seed,
    })?;
    let cluster_path = args
        .cluster_out
        .as_deref()
        .context("--gpu-sharing needs --cluster-out")?;
    std::fs::write(cluster_path, &workload.cluster_yaml)
        .with_context(|| format!("cannot write {}", cluster_path.display()))?;
    write_trace(&workload.trace, args.out.as_deref())
}

/// The pipelines of `--pipelines`, or the jobs of `--jobs` in their `--mix`.
fn generate_trace(args: &GenerateArgs, rate: f64) -> anyhow::Result<Trace> {
    let (teams, seed) = (args.teams, args.seed);
    Ok(match (args.pipelines, args.jobs) {
        (Some(pipelines), _) => xp_sched::sim::generate_pipelines(&PipelineOptions {
            pipelines,
            rate_per_hour: rate,
            teams,
            templates: args.templates.unwrap_or(4),
            seed,
        })?,
        (None, Some(jobs)) if args.mix == "dl" => {
            xp_sched::sim::generate_deep_learning(&DeepLearningOptions {
                jobs,
                rate_per_hour: rate,
                teams,
                seed,
            })?
        }
        (None, Some(jobs)) => xp_sched::sim::generate(&GenerateOptions {
            jobs,
            rate_per_hour: rate,
            teams,
            seed,
        })?,
        (None, None) => anyhow::bail!("--jobs or --pipelines is required"),
    })
}

fn write_trace(trace: &Trace, out: Option<&Path>) -> anyhow::Result<()> {
    let text = trace.to_csv();
    match out {
        Some(path) => {
            std::fs::write(path, text)
                .with_context(|| format!("cannot write {}", path.display()))?;
            crate::cmd::eprintln_note(&format!(
                "wrote {} jobs to {}",
                trace.jobs.len(),
                path.display()
            ));
        }
        None => crate::cmd::write_output(format_args!("{text}")),
    }
    Ok(())
}
