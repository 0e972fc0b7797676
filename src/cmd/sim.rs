//! `xp sim`: the command-line shell of the scheduling simulator in `xp_sched::sim`.
//!
//! It reads the trace, cluster and policy files, runs the simulation (or the
//! packing measurement, or the workload generator) and prints the report as text
//! or one JSON object. All the simulation logic lives in the library; this file
//! only parses arguments, reads files, measures wall time and prints.

use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::Context;
use xp_sched::PolicyConfig;
use xp_sched::config::PlacementKind;
use xp_sched::sim::place_once::load_key;
use xp_sched::sim::{
    ClusterSpec, CriticalPathBoost, DeepLearningOptions, GenerateOptions, GpuSharingOptions,
    PipelineOptions, PlaceOnceOptions, PlaceOnceReport, SimOptions, SimReport, Trace,
};

/// Arguments of `xp sim`.
#[derive(clap::Args, Debug)]
#[command(args_conflicts_with_subcommands = true, subcommand_negates_reqs = true)]
pub(crate) struct SimArgs {
    #[command(subcommand)]
    command: Option<SimCommand>,
    /// The workload: a CSV file, one row per job.
    #[arg(long, required = true)]
    trace: Option<PathBuf>,
    /// The cluster as YAML: `nodes: [{count, gpus, gpu_model, cpu_milli, mem_mib, labels}]`.
    #[arg(
        long,
        required_unless_present = "cluster_csv",
        conflicts_with = "cluster_csv"
    )]
    cluster: Option<PathBuf>,
    /// The cluster as CSV, one node per row: `node_id,gpus,gpu_model,cpu_milli,mem_mib[,rack]`.
    #[arg(long)]
    cluster_csv: Option<PathBuf>,
    /// A policy file, or a preset: fifo, priority, fair, backfill, default; or
    /// `srtf`, shortest remaining time first knowing every duration (a
    /// preemptive reference no live scheduler can be, for comparison).
    #[arg(long, default_value = "default")]
    policy: String,
    /// Seeds random placement, the order of equal jobs submitted together, and --place-once draws.
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Print one JSON object.
    #[arg(long)]
    json: bool,
    /// Stop the simulated clock at this many seconds.
    #[arg(long)]
    until: Option<f64>,
    /// Check the policy core's invariants after every decision (slower).
    #[arg(long)]
    check_invariants: bool,
    /// Measure packing alone: place each drawn job once, no departures, no queue.
    #[arg(long)]
    place_once: bool,
    /// With --place-once: stop when the GPUs asked for reach this multiple of the cluster's.
    #[arg(long, default_value_t = 1.3, requires = "place_once")]
    load: f64,
    /// Override the policy's oversubscription factor (1 to 4): fractional jobs
    /// that opt in share a GPU promised up to that many times its capacity.
    #[arg(long)]
    oversubscription: Option<f64>,
    /// Override the policy's placement strategy.
    #[arg(long, value_parser = ["binpack", "spread", "random", "fragmentation_aware"])]
    placement: Option<String>,
    /// Start jobs on their pipeline's critical path first (within a queue, at
    /// equal priority): `critical` (the default) marks the critical path,
    /// `rank` orders by the estimated remaining chain from each job.
    #[arg(
        long,
        value_parser = ["critical", "rank"],
        num_args = 0..=1,
        default_missing_value = "critical"
    )]
    critical_path_boost: Option<String>,
}

#[derive(clap::Subcommand, Debug)]
enum SimCommand {
    /// Write a synthetic trace: Poisson arrivals, heavy-tailed durations, mixed
    /// gangs; or, with --pipelines, DAGs of stages.
    Generate {
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
        /// Write here instead of standard output.
        #[arg(long)]
        out: Option<PathBuf>,
    },
}

fn read(path: &Path) -> anyhow::Result<String> {
    std::fs::read_to_string(path).with_context(|| format!("cannot read {}", path.display()))
}

/// A policy file's contents, or a preset by name.
fn load_policy(policy: &str) -> anyhow::Result<PolicyConfig> {
    let path = Path::new(policy);
    if path.is_file() {
        let text = read(path)?;
        return PolicyConfig::from_yaml(&text)
            .with_context(|| format!("{} is not a valid policy", path.display()));
    }
    PolicyConfig::preset(policy).with_context(|| {
        format!(
            "--policy {policy:?} is neither a file nor a preset ({})",
            PolicyConfig::PRESETS.join(", ")
        )
    })
}

fn placement_kind(name: &str) -> PlacementKind {
    match name {
        "spread" => PlacementKind::Spread,
        "random" => PlacementKind::Random,
        "fragmentation_aware" => PlacementKind::FragmentationAware,
        _ => PlacementKind::BinPack,
    }
}

/// Runs `xp sim`.
pub(crate) fn run(args: SimArgs) -> anyhow::Result<()> {
    if let Some(SimCommand::Generate {
        jobs,
        pipelines,
        templates,
        gpu_sharing,
        cluster_out,
        rate,
        teams,
        mix,
        seed,
        elastic,
        fixed_size,
        out,
    }) = args.command
    {
        anyhow::ensure!(
            cluster_out.is_none() || gpu_sharing.is_some(),
            "--cluster-out needs --gpu-sharing"
        );
        if let Some(pods) = gpu_sharing {
            let workload = xp_sched::sim::generate_gpu_sharing(&GpuSharingOptions { pods, seed })?;
            let cluster_path = cluster_out.context("--gpu-sharing needs --cluster-out")?;
            std::fs::write(&cluster_path, &workload.cluster_yaml)
                .with_context(|| format!("cannot write {}", cluster_path.display()))?;
            return write_trace(&workload.trace, out.as_deref());
        }
        let rate = rate.context("--rate is required")?;
        // Checked here: clap does not enforce `requires` inside this subcommand.
        anyhow::ensure!(
            templates.is_none() || pipelines.is_some(),
            "--templates needs --pipelines"
        );
        let mut trace = match (pipelines, jobs) {
            (Some(pipelines), _) => xp_sched::sim::generate_pipelines(&PipelineOptions {
                pipelines,
                rate_per_hour: rate,
                teams,
                templates: templates.unwrap_or(4),
                seed,
            })?,
            (None, Some(jobs)) if mix == "dl" => {
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
        };
        if let Some(share) = elastic {
            xp_sched::sim::make_elastic(&mut trace, share, seed, fixed_size)?;
        }
        return write_trace(&trace, out.as_deref());
    }
    let trace_path = args.trace.context("--trace is required")?;
    let trace: Trace = xp_sched::sim::parse_trace(&read(&trace_path)?)
        .with_context(|| format!("{} is not a valid trace", trace_path.display()))?;
    let cluster: ClusterSpec = match (&args.cluster, &args.cluster_csv) {
        (Some(path), _) => xp_sched::sim::parse_cluster_yaml(&read(path)?)
            .with_context(|| format!("{} is not a valid cluster", path.display()))?,
        (None, Some(path)) => xp_sched::sim::parse_cluster_csv(&read(path)?)
            .with_context(|| format!("{} is not a valid cluster", path.display()))?,
        (None, None) => anyhow::bail!("--cluster or --cluster-csv is required"),
    };
    let oracle = (args.policy == "srtf" && !Path::new(&args.policy).is_file())
        .then_some(xp_sched::sim::Oracle::Srtf);
    let mut config = match oracle {
        Some(_) => xp_sched::sim::srtf_policy(),
        None => load_policy(&args.policy)?,
    };
    if let Some(placement) = &args.placement {
        config.placement = placement_kind(placement);
    }
    if let Some(factor) = args.oversubscription {
        config.oversubscription = factor;
        config
            .validate()
            .context("--oversubscription must be from 1 to 4")?;
    }
    let started = wall_clock();
    if args.place_once {
        let options = PlaceOnceOptions {
            load: args.load,
            strategy: config.placement.strategy(args.seed),
            seed: args.seed,
            oversubscription_milli: config.oversubscription_milli(),
        };
        let report = xp_sched::sim::place_once(&trace, &cluster, &options)?;
        print_place_once(&report, &config.placement, args.json, started);
        return Ok(());
    }
    let until_ms = match args.until {
        Some(seconds) => {
            anyhow::ensure!(
                seconds.is_finite() && (0.0..=1e9).contains(&seconds),
                "--until must be between 0 and 1e9 seconds"
            );
            Some((seconds * 1000.0).round() as u64)
        }
        None => None,
    };
    let options = SimOptions {
        until_ms,
        check_invariants: args.check_invariants,
        seed: args.seed,
        critical_path_boost: match args.critical_path_boost.as_deref() {
            None => CriticalPathBoost::Off,
            Some("rank") => CriticalPathBoost::Rank,
            Some(_) => CriticalPathBoost::Critical,
        },
    };
    let report = match oracle {
        Some(oracle) => {
            anyhow::ensure!(
                args.placement.is_none(),
                "--policy srtf keeps the default placement"
            );
            anyhow::ensure!(
                args.oversubscription.is_none(),
                "--policy srtf does not oversubscribe"
            );
            xp_sched::sim::simulate_oracle(&trace, &cluster, oracle, &options)?
        }
        None => xp_sched::sim::simulate(&trace, &cluster, config, &options)?,
    };
    print_report(&report, args.json, started);
    Ok(())
}

#[expect(
    clippy::disallowed_methods,
    reason = "the simulator's own wall time is what is measured"
)]
fn wall_clock() -> Instant {
    Instant::now()
}

#[expect(clippy::print_stderr, reason = "the CLI's user-facing notes")]
fn write_trace(trace: &Trace, out: Option<&Path>) -> anyhow::Result<()> {
    let text = trace.to_csv();
    match out {
        Some(path) => {
            std::fs::write(path, text)
                .with_context(|| format!("cannot write {}", path.display()))?;
            eprintln!("wrote {} jobs to {}", trace.jobs.len(), path.display());
        }
        None => crate::cmd::write_output(format_args!("{text}")),
    }
    Ok(())
}

fn optional(value: Option<f64>, unit: &str) -> String {
    value.map_or_else(|| "-".to_owned(), |value| format!("{value:.1}{unit}"))
}

#[expect(clippy::print_stderr, reason = "the CLI's user-facing notes")]
fn print_report(report: &SimReport, json: bool, started: Instant) {
    let wall_s = started.elapsed().as_secs_f64();
    if json {
        outln!("{}", report.to_json());
        eprintln!("simulated in {wall_s:.3} s of wall time");
        return;
    }
    let outcomes = &report.outcomes;
    outln!(
        "jobs             {} (completed {}, killed {}, running {}, waiting {}, blocked {}, refused {}, not arrived {}; never started {})",
        report.jobs,
        outcomes.completed,
        outcomes.killed,
        outcomes.running,
        outcomes.waiting,
        outcomes.blocked,
        outcomes.refused,
        outcomes.not_arrived,
        report.never_started
    );
    outln!(
        "completion time  mean {}  median {}  p99 {}",
        optional(report.jct.map(|summary| summary.mean), " s"),
        optional(report.jct.map(|summary| summary.median), " s"),
        optional(report.jct.map(|summary| summary.p99), " s")
    );
    outln!(
        "queueing delay   mean {}  median {}  p99 {}",
        optional(report.queue_delay.map(|summary| summary.mean), " s"),
        optional(report.queue_delay.map(|summary| summary.median), " s"),
        optional(report.queue_delay.map(|summary| summary.p99), " s")
    );
    outln!(
        "makespan         {:.1} s (simulated span {:.1} s)",
        report.makespan,
        report.span
    );
    if let Some(pipelines) = &report.pipelines {
        outln!(
            "pipelines        {} ({} completed): makespan mean {}  median {}  p99 {}  total {:.1} s",
            pipelines.pipelines,
            pipelines.completed,
            optional(pipelines.makespan.map(|summary| summary.mean), " s"),
            optional(pipelines.makespan.map(|summary| summary.median), " s"),
            optional(pipelines.makespan.map(|summary| summary.p99), " s"),
            pipelines.makespan_total
        );
    }
    outln!(
        "GPU utilisation  {:.1} % over the span, {} from first to last submission ({:.1} GPU-hours held)",
        report.gpu_utilization * 100.0,
        optional(
            report.gpu_utilization_arrivals.map(|share| share * 100.0),
            " %"
        ),
        report.gpu_hours
    );
    outln!(
        "fairness         Jain {:.3} over {} teams' GPU-hours",
        report.jain_fairness,
        report.teams.len()
    );
    for team in &report.teams {
        outln!(
            "  {:<14} {:>10.1} GPU-hours  share {:>5.1} %  jobs {:>8}  completed {:>8}  mean JCT {}",
            team.name,
            team.gpu_hours,
            team.share * 100.0,
            team.jobs,
            team.completed,
            optional(team.jct_mean, " s")
        );
    }
    outln!(
        "preemptions      {} ({} decisions), {:.1} GPU-seconds lost",
        report.preemptions,
        report.preempt_decisions,
        report.gpu_seconds_lost
    );
    if report.resizes > 0 {
        outln!(
            "elastic resizes  {} (their lost work and restarts are in the GPU-seconds above)",
            report.resizes
        );
    }
    outln!(
        "gang locality    {} multi-GPU placements: {} in one node, {} in one rack",
        report.multi_gpu_placements,
        optional(report.multi_gpu_one_node.map(|share| share * 100.0), " %"),
        optional(report.multi_gpu_one_rack.map(|share| share * 100.0), " %")
    );
    let law = report.littles_law;
    outln!(
        "Little's law     L {:.3} against lambda x W {:.3} (lambda {:.6}/s, W {:.1} s)",
        law.l,
        law.lambda * law.w,
        law.lambda,
        law.w
    );
    if report.submit_retries > 0 {
        outln!(
            "admission        {} resubmissions after too many pending trials",
            report.submit_retries
        );
    }
    for (reason, count) in &report.wait_reasons {
        outln!("still waiting    {count} ({reason})");
    }
    outln!(
        "simulator        {} events, {} decide calls, {} placements, {wall_s:.3} s wall time",
        report.events,
        report.decide_calls,
        report.placements
    );
}

#[expect(clippy::print_stderr, reason = "the CLI's user-facing notes")]
fn print_place_once(
    report: &PlaceOnceReport,
    placement: &PlacementKind,
    json: bool,
    started: Instant,
) {
    let wall_s = started.elapsed().as_secs_f64();
    if json {
        let mut value = report.to_json();
        value["placement"] = serde_json::json!(format!("{placement:?}"));
        outln!("{value}");
        eprintln!("measured in {wall_s:.3} s of wall time");
        return;
    }
    outln!("placement        {placement:?}");
    for (load, ratio) in &report.alloc_ratio {
        outln!(
            "alloc ratio      {:>5.1} % at load {}",
            ratio * 100.0,
            load_key(*load)
        );
    }
    outln!("final load       {:.3}", report.final_load);
    outln!("idle GPU frag.   {:.3}", report.idle_gpu_fragmentation);
    outln!(
        "evictions        {} (GPU memory overflowed)",
        report.evictions
    );
    let (attempted, failed) = (&report.attempted, &report.failed);
    outln!(
        "failed jobs      {} of {} (fractional {} of {}, whole-GPU {} of {}, multi-GPU {} of {}, CPU-only {} of {})",
        failed.total(),
        attempted.total(),
        failed.fractional,
        attempted.fractional,
        failed.whole_gpu,
        attempted.whole_gpu,
        failed.multi_gpu,
        attempted.multi_gpu,
        failed.cpu_only,
        attempted.cpu_only
    );
    outln!("wall time        {wall_s:.3} s");
}
