//! `xp sim`: the command-line shell of the scheduling simulator in `xp_sched::sim`.
//!
//! It reads the trace, cluster and policy files, runs the simulation (or the
//! packing measurement, or the workload generator) and prints the report as text
//! or one JSON object. All the simulation logic lives in the library; this file
//! only parses arguments, reads files, measures wall time and prints.
//!
//! Here: the arguments of a simulation and its steps (read the inputs, shape the
//! policy, run); `generate.rs`: `xp sim generate`; `report.rs`: the reports as
//! text or JSON.

mod generate;
mod report;

use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::Context;
use xp_sched::PolicyConfig;
use xp_sched::config::PlacementKind;
use xp_sched::sim::{ClusterSpec, CriticalPathBoost, Oracle, PlaceOnceOptions, SimOptions, Trace};

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
    /// Seeds random placement, the order of equal jobs submitted together, and the --place-once arrivals.
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
    #[arg(long, value_parser = ["binpack", "spread", "random", "fragmentation_aware", "fgd"])]
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
    Generate(generate::GenerateArgs),
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
        "fgd" => PlacementKind::Fgd,
        _ => PlacementKind::BinPack,
    }
}

/// Runs `xp sim`.
pub(crate) fn run(args: SimArgs) -> anyhow::Result<()> {
    if let Some(SimCommand::Generate(generate_args)) = args.command {
        return generate::run(generate_args);
    }
    let trace = read_trace(args.trace.as_deref())?;
    let cluster = read_cluster(&args)?;
    let oracle =
        (args.policy == "srtf" && !Path::new(&args.policy).is_file()).then_some(Oracle::Srtf);
    let config = policy_config(&args, oracle)?;
    let started = wall_clock();
    if args.place_once {
        let options = PlaceOnceOptions {
            load: args.load,
            strategy: config.placement.strategy(args.seed),
            seed: args.seed,
            oversubscription_milli: config.oversubscription_milli(),
        };
        let report = xp_sched::sim::place_once(&trace, &cluster, &options)?;
        report::print_place_once(&report, &config.placement, args.json, started);
        return Ok(());
    }
    let options = sim_options(&args)?;
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
    report::print_report(&report, args.json, started);
    Ok(())
}

/// The workload of `--trace`.
fn read_trace(path: Option<&Path>) -> anyhow::Result<Trace> {
    let trace_path = path.context("--trace is required")?;
    xp_sched::sim::parse_trace(&read(trace_path)?)
        .with_context(|| format!("{} is not a valid trace", trace_path.display()))
}

/// The cluster of `--cluster` (YAML) or `--cluster-csv`.
fn read_cluster(args: &SimArgs) -> anyhow::Result<ClusterSpec> {
    match (&args.cluster, &args.cluster_csv) {
        (Some(path), _) => xp_sched::sim::parse_cluster_yaml(&read(path)?)
            .with_context(|| format!("{} is not a valid cluster", path.display())),
        (None, Some(path)) => xp_sched::sim::parse_cluster_csv(&read(path)?)
            .with_context(|| format!("{} is not a valid cluster", path.display())),
        (None, None) => anyhow::bail!("--cluster or --cluster-csv is required"),
    }
}

/// The policy of `--policy` (the oracle's own when there is one), with the
/// `--placement` and `--oversubscription` overrides.
fn policy_config(args: &SimArgs, oracle: Option<Oracle>) -> anyhow::Result<PolicyConfig> {
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
    Ok(config)
}

/// The simulation's options: `--until`, `--check-invariants`, `--seed` and
/// `--critical-path-boost`.
fn sim_options(args: &SimArgs) -> anyhow::Result<SimOptions> {
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
    Ok(SimOptions {
        until_ms,
        check_invariants: args.check_invariants,
        seed: args.seed,
        critical_path_boost: match args.critical_path_boost.as_deref() {
            None => CriticalPathBoost::Off,
            Some("rank") => CriticalPathBoost::Rank,
            Some(_) => CriticalPathBoost::Critical,
        },
    })
}

#[expect(
    clippy::disallowed_methods,
    reason = "the simulator's own wall time is what is measured"
)]
fn wall_clock() -> Instant {
    Instant::now()
}
