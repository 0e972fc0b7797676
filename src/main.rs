//! The `xp` command line: submit experiments, watch them, read logs, benchmark.

use std::io::Write;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context;
use clap::{Parser, Subcommand};
use xp::{Client, ExperimentSpec, SubmitOptions};
use xp_runtime::protocol::{AdminAction, ExperimentStatus, TrialState};
use xp_runtime::views::{experiment_json, node_json};

mod sim_cli;

#[derive(Parser, Debug)]
#[command(
    name = "xp",
    version,
    about = "Run many ML experiments in parallel on a cluster and keep an exact record of each"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(clap::Args, Debug)]
struct ClusterArg {
    /// The join string printed by `xp-head start`.
    #[arg(long, env = "XP_CLUSTER", hide_env_values = true)]
    cluster: String,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Submit an experiment declared in YAML and print its id.
    Submit {
        /// The experiment file.
        file: PathBuf,
        #[command(flatten)]
        cluster: ClusterArg,
        /// Run again even if an identical experiment already finished.
        #[arg(long)]
        rerun: bool,
        /// Wait for the experiment to finish, showing progress.
        #[arg(long)]
        wait: bool,
    },
    /// Show experiments and their trials.
    Status {
        /// An experiment id or a unique prefix; all experiments when absent.
        experiment: Option<String>,
        #[command(flatten)]
        cluster: ClusterArg,
        /// One JSON object per experiment, one per line.
        #[arg(long)]
        json: bool,
    },
    /// Cancel an experiment or a single trial.
    Cancel {
        /// An experiment id (or unique prefix) or a trial id.
        id: String,
        #[command(flatten)]
        cluster: ClusterArg,
    },
    /// Print a worker's output.
    Logs {
        /// The trial id.
        trial: String,
        #[command(flatten)]
        cluster: ClusterArg,
        /// The worker's rank.
        #[arg(long, default_value_t = 0)]
        rank: u32,
        /// The attempt; the latest when absent.
        #[arg(long)]
        attempt: Option<u32>,
        /// Keep printing until the worker exits.
        #[arg(long)]
        follow: bool,
    },
    /// List the cluster's nodes.
    Nodes {
        #[command(flatten)]
        cluster: ClusterArg,
        /// One JSON object per node, one per line.
        #[arg(long)]
        json: bool,
    },
    /// Statistics of seed replicates per configuration, and significance against the best.
    Compare {
        /// An experiment id or a unique prefix.
        experiment: String,
        #[command(flatten)]
        cluster: ClusterArg,
        /// The significance level of the Welch t-tests.
        #[arg(long, default_value_t = 0.05)]
        alpha: f64,
        /// One JSON object per configuration, best first.
        #[arg(long)]
        json: bool,
    },
    /// A trial's metric history, optionally smoothed.
    Metrics {
        /// The trial id.
        trial: String,
        #[command(flatten)]
        cluster: ClusterArg,
        /// Only this metric.
        #[arg(long)]
        name: Option<String>,
        /// The worker's rank.
        #[arg(long, default_value_t = 0)]
        rank: u32,
        /// Add an exponential moving average with this smoothing, such as 0.9.
        #[arg(long)]
        ema: Option<f64>,
        /// One JSON object per metric.
        #[arg(long)]
        json: bool,
    },
    /// Optimise any black-box command on this machine: `xp tune --space S.yaml -- CMD ARGS...`.
    Tune {
        /// A YAML mapping of parameters, the same as `search.space` in an experiment.
        #[arg(long)]
        space: PathBuf,
        /// The search algorithm.
        #[arg(long, default_value = "tpe", value_parser = ["gp", "gp-ucb", "gp-ei", "tpe", "random", "sobol", "grid"])]
        algo: String,
        /// How many evaluations.
        #[arg(long)]
        budget: u32,
        /// The seed of the search.
        #[arg(long, default_value_t = 0)]
        seed: u64,
        /// How many evaluations run at once.
        #[arg(long, default_value_t = 1)]
        parallel: u32,
        /// Whether smaller or larger objectives are better.
        #[arg(long, default_value = "min", value_parser = ["min", "max"])]
        mode: String,
        /// Stop unpromising evaluations from their `XP_METRIC {"step": S, "value": V}` lines.
        #[arg(long, value_parser = ["median", "asha", "hyperband"])]
        early_stopping: Option<String>,
        /// The most steps an evaluation runs under early stopping.
        #[arg(long, default_value_t = 81)]
        max_t: u64,
        /// The first step at which early stopping may judge.
        #[arg(long, default_value_t = 1)]
        grace_period: u64,
        /// The command and its arguments.
        #[arg(last = true, required = true)]
        command: Vec<String>,
    },
    /// Replay a workload trace through the scheduling policy on a simulated cluster.
    Sim(sim_cli::SimArgs),
    /// The scheduling queues: usage, quota, borrowed, lent, pending and fair share.
    Queue {
        #[command(flatten)]
        cluster: ClusterArg,
        /// One JSON object per queue, one per line.
        #[arg(long)]
        json: bool,
    },
    /// The checkpoints kept for an experiment's trials, and where their replicas are.
    Checkpoints {
        /// The experiment id (or a unique prefix, or its name).
        experiment: String,
        #[command(flatten)]
        cluster: ClusterArg,
        /// One JSON object per checkpoint, one per line.
        #[arg(long)]
        json: bool,
    },
    /// Arbitration by an admin; each action is recorded with who and why.
    Admin {
        #[command(flatten)]
        cluster: ClusterArg,
        /// Why, recorded in every touched trial's events.
        #[arg(long, default_value = "")]
        why: String,
        #[command(subcommand)]
        action: AdminCommand,
    },
    /// Measure the runtime on an embedded local cluster.
    Bench {
        #[command(subcommand)]
        bench: Bench,
    },
}

#[derive(Subcommand, Debug)]
enum AdminCommand {
    /// Replace the head's scheduling policy.
    Policy {
        #[command(subcommand)]
        action: PolicyCommand,
    },
    /// Set the base priority of a trial or of an experiment's unfinished trials.
    Priority {
        /// A trial id, or an experiment id (or unique prefix).
        id: String,
        /// The new base priority.
        #[arg(allow_hyphen_values = true)]
        value: i64,
    },
    /// Keep a trial (or an experiment's trials) from being placed.
    Hold {
        /// A trial id, or an experiment id (or unique prefix).
        id: String,
    },
    /// Let held trials be placed again.
    Release {
        /// A trial id, or an experiment id (or unique prefix).
        id: String,
    },
    /// Move a trial (or an experiment's trials) to another queue.
    Move {
        /// A trial id, or an experiment id (or unique prefix).
        id: String,
        /// The queue.
        queue: String,
    },
}

#[derive(Subcommand, Debug)]
enum PolicyCommand {
    /// Apply a policy file (checked here first, then by the head).
    Apply {
        /// The YAML file.
        file: PathBuf,
    },
}

#[derive(Subcommand, Debug)]
enum Bench {
    /// Ring all-reduce time and bandwidth, against QUIC, TCP and memory-copy ceilings.
    Allreduce {
        /// Ranks in the ring (all on this machine).
        #[arg(long, default_value_t = 2)]
        workers: u32,
        /// Buffer sizes in bytes; repeat the flag for several.
        #[arg(long = "size", default_values_t = [4096usize, 1 << 20, 16 << 20, 64 << 20])]
        sizes: Vec<usize>,
        /// The links.
        #[arg(long, default_value = "tcp", value_parser = ["quic", "tcp", "shm"])]
        transport: String,
        /// One JSON line per size.
        #[arg(long)]
        json: bool,
    },
    /// Object store put/get, remote get and checkpoint throughput, against memory
    /// copy and loopback TCP measured in the same run.
    Objects {
        /// Object sizes in bytes; repeat the flag for several.
        #[arg(long = "size", default_values_t = [1u64 << 20, 16 << 20, 256 << 20, 1 << 30])]
        sizes: Vec<u64>,
        /// The checkpoint saved and restored, in bytes (0 skips it).
        #[arg(long, default_value_t = 512 << 20)]
        checkpoint_bytes: u64,
        /// Where the stores live (a temporary directory under it); the system's
        /// temporary directory when absent.
        #[arg(long)]
        dir: Option<PathBuf>,
        /// One JSON line per measurement.
        #[arg(long)]
        json: bool,
    },
    /// Throughput and start latency of no-op trials.
    Trials {
        /// How many trials.
        #[arg(long, default_value_t = 200)]
        trials: u32,
        /// How many one-core slots the local node offers.
        #[arg(long, default_value_t = 8)]
        slots: u32,
        /// Print one JSON line.
        #[arg(long)]
        json: bool,
    },
}

#[tokio::main]
async fn main() -> std::process::ExitCode {
    let filter = tracing_subscriber::EnvFilter::try_from_env("XP_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn"));
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
    match run(Cli::parse()).await {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(error) => {
            #[expect(clippy::print_stderr, reason = "the CLI's error output")]
            {
                eprintln!("error: {error:#}");
            }
            std::process::ExitCode::FAILURE
        }
    }
}

async fn connect(cluster: &ClusterArg) -> anyhow::Result<Client> {
    Client::connect(&cluster.cluster)
        .await
        .context("cannot connect to the cluster")
}

#[expect(clippy::print_stdout, reason = "the CLI's user-facing output")]
async fn run(cli: Cli) -> anyhow::Result<()> {
    match cli.command {
        Command::Submit {
            file,
            cluster,
            rerun,
            wait,
        } => {
            let text = std::fs::read_to_string(&file)
                .with_context(|| format!("cannot read {}", file.display()))?;
            let spec = ExperimentSpec::from_yaml(&text)
                .with_context(|| format!("{} is not a valid experiment", file.display()))?;
            let client = connect(&cluster).await?;
            let base_dir = file.parent().map(|dir| {
                if dir.as_os_str().is_empty() {
                    PathBuf::from(".")
                } else {
                    dir.to_owned()
                }
            });
            let submitted = client
                .submit(
                    &spec,
                    &SubmitOptions {
                        rerun,
                        base_dir,
                        // A person at a prompt (or a script) hears "retry later" at
                        // once; drivers built on the SDK wait and retry by themselves.
                        admission_wait: Some(Duration::ZERO),
                    },
                )
                .await
                .context("submission refused")?;
            println!("{}", submitted.experiment);
            if submitted.reused {
                eprintln_note(
                    "an identical experiment already finished; reusing its results (use --rerun to run it again)",
                );
            }
            if wait {
                let status = client
                    .wait(submitted.experiment, |event| {
                        eprintln_note(&format!("{} {} {}", event.trial, event.state, event.reason));
                    })
                    .await?;
                print_status_table(&status);
            }
            client.close().await;
        }
        Command::Status {
            experiment,
            cluster,
            json,
        } => {
            let client = connect(&cluster).await?;
            let list = client.status(experiment.as_deref()).await?;
            for status in &list {
                if json {
                    println!("{}", experiment_json(status));
                } else {
                    print_status_table(status);
                }
            }
            client.close().await;
        }
        Command::Cancel { id, cluster } => {
            let client = connect(&cluster).await?;
            let trials = client.cancel(&id).await?;
            println!("cancelled {trials} trial(s)");
            client.close().await;
        }
        Command::Logs {
            trial,
            cluster,
            rank,
            attempt,
            follow,
        } => {
            let trial = trial.parse().context("not a trial id")?;
            let client = connect(&cluster).await?;
            let mut offset = 0;
            loop {
                let chunk = client.logs(trial, rank, attempt, offset).await?;
                offset = chunk.next_offset;
                let mut stdout = std::io::stdout().lock();
                stdout.write_all(&chunk.data)?;
                stdout.flush()?;
                drop(stdout);
                if chunk.data.is_empty() && (chunk.complete || !follow) {
                    break;
                }
                if chunk.data.is_empty() {
                    tokio::time::sleep(Duration::from_millis(500)).await;
                }
            }
            client.close().await;
        }
        Command::Queue { cluster, json } => {
            let client = connect(&cluster).await?;
            print_queues(&client.queues().await?, json);
            client.close().await;
        }
        Command::Checkpoints {
            experiment,
            cluster,
            json,
        } => {
            let client = connect(&cluster).await?;
            let checkpoints = client.checkpoints(&experiment).await?;
            print_checkpoints(&checkpoints, json);
            client.close().await;
        }
        Command::Admin {
            cluster,
            why,
            action,
        } => {
            let action = match action {
                AdminCommand::Policy {
                    action: PolicyCommand::Apply { file },
                } => {
                    let yaml = std::fs::read_to_string(&file)
                        .with_context(|| format!("cannot read {}", file.display()))?;
                    anyhow::ensure!(
                        yaml.len() <= xp_sched::config::MAX_POLICY_BYTES,
                        "{} is larger than a policy may be",
                        file.display()
                    );
                    xp_sched::PolicyConfig::from_yaml(&yaml)
                        .with_context(|| format!("{} is not a valid policy", file.display()))?;
                    AdminAction::ApplyPolicy { yaml }
                }
                AdminCommand::Priority { id, value } => AdminAction::Priority { id, value },
                AdminCommand::Hold { id } => AdminAction::Hold { id },
                AdminCommand::Release { id } => AdminAction::Release { id },
                AdminCommand::Move { id, queue } => AdminAction::Move { id, queue },
            };
            let who = std::env::var("USER").unwrap_or_else(|_| "unknown".to_owned());
            let client = connect(&cluster).await?;
            let (_, message) = client.admin(action, &who, &why).await?;
            println!("{message}");
            client.close().await;
        }
        Command::Nodes { cluster, json } => {
            let client = connect(&cluster).await?;
            let nodes = client.nodes().await?;
            if json {
                for node in &nodes {
                    println!("{}", node_json(node));
                }
            } else {
                println!(
                    "{:<34} {:<16} {:<6} {:>9} {:>11} {:>8}  LABELS",
                    "NODE", "NAME", "STATE", "GPUS", "CPUS", "WORKERS"
                );
                for node in &nodes {
                    let state = node.state.as_str();
                    let labels: Vec<String> = node
                        .labels
                        .iter()
                        .map(|(key, value)| format!("{key}={value}"))
                        .collect();
                    println!(
                        "{:<34} {:<16} {:<6} {:>4}/{:<4} {:>5.1}/{:<5.1} {:>8}  {}",
                        node.id.to_string(),
                        node.name,
                        state,
                        node.free_gpus,
                        node.capacity.gpus.len(),
                        f64::from(node.free_cpu_milli) / 1000.0,
                        f64::from(node.capacity.cpu_milli) / 1000.0,
                        node.running_workers,
                        labels.join(",")
                    );
                }
            }
            client.close().await;
        }
        Command::Sim(args) => sim_cli::run(args)?,
        Command::Tune {
            space,
            algo,
            budget,
            seed,
            parallel,
            mode,
            early_stopping,
            max_t,
            grace_period,
            command,
        } => {
            let text = std::fs::read_to_string(&space)
                .with_context(|| format!("cannot read {}", space.display()))?;
            let space_spec: xp_runtime::spec::SpaceSpec =
                serde_saphyr::from_str(&text).map_err(|error| {
                    anyhow::anyhow!("{} is not a valid search space: {error}", space.display())
                })?;
            let search_space = xp_runtime::spec::SearchSpace::from_spec(&space_spec)
                .with_context(|| format!("{} is not a valid search space", space.display()))?;
            use xp_tune::search::{Acquisition, DEFAULT_KAPPA, SearchAlgorithm};
            let algorithm = match algo.as_str() {
                "gp" | "gp-ucb" => SearchAlgorithm::Gp {
                    acquisition: Acquisition::Ucb {
                        kappa: DEFAULT_KAPPA,
                    },
                },
                "gp-ei" => SearchAlgorithm::Gp {
                    acquisition: Acquisition::Ei,
                },
                "tpe" => SearchAlgorithm::Tpe,
                "sobol" => SearchAlgorithm::Sobol,
                "grid" => SearchAlgorithm::Grid,
                _ => SearchAlgorithm::Random,
            };
            let rule = match early_stopping.as_deref() {
                Some(name) => {
                    let kind = match name {
                        "median" => xp_runtime::spec::RuleKind::Median,
                        "asha" => xp_runtime::spec::RuleKind::Asha,
                        _ => xp_runtime::spec::RuleKind::Hyperband,
                    };
                    let config = xp_runtime::spec::StoppingConfig {
                        max_t,
                        grace_period,
                        ..xp_runtime::spec::StoppingConfig::new(kind)
                    };
                    config
                        .validate()
                        .context("invalid early-stopping options")?;
                    Some(xp_tune::stopping::make_rule(&config))
                }
                None => None,
            };
            let job = xp::tune::TuneJob {
                searcher: xp_tune::search::make_searcher(algorithm, &search_space, seed),
                rule,
                budget,
                parallel,
                maximize: mode == "max",
                command,
            };
            let summary = xp::tune::tune(job, |line| println!("{line}")).await?;
            println!("{}", summary.to_json());
        }
        Command::Compare {
            experiment,
            cluster,
            alpha,
            json,
        } => {
            anyhow::ensure!(alpha > 0.0 && alpha < 1.0, "--alpha must be in (0, 1)");
            let client = connect(&cluster).await?;
            let mut list = client.status(Some(&experiment)).await?;
            let status = list.pop().context("no such experiment")?;
            let comparison = xp::analysis::compare(&status, alpha)?;
            if json {
                for (rank, config) in comparison.configs.iter().enumerate() {
                    println!("{}", config.to_json(rank + 1));
                }
            } else {
                println!(
                    "experiment {}  metric {} ({} is better)",
                    status.id,
                    comparison.metric,
                    if comparison.maximize {
                        "higher"
                    } else {
                        "lower"
                    }
                );
                println!(
                    "  {:>4} {:>3} {:>12} {:>10} {:>27}  {:<40} VERDICT",
                    "RANK", "N", "MEAN", "STD", "95% CI", "CONFIG"
                );
                for (rank, config) in comparison.configs.iter().enumerate() {
                    let (mean, std_dev, ci) = match &config.summary {
                        Some(summary) => (
                            format!("{:.5}", summary.mean),
                            format!("{:.5}", summary.std_dev),
                            format!("[{:.5}, {:.5}]", summary.ci95.0, summary.ci95.1),
                        ),
                        None => ("-".to_owned(), "-".to_owned(), "-".to_owned()),
                    };
                    println!(
                        "  {:>4} {:>3} {:>12} {:>10} {:>27}  {:<40} {}",
                        rank + 1,
                        config.values.len(),
                        mean,
                        std_dev,
                        ci,
                        config.config.to_string(),
                        config.verdict(alpha)
                    );
                }
            }
            client.close().await;
        }
        Command::Metrics {
            trial,
            cluster,
            name,
            rank,
            ema,
            json,
        } => {
            if let Some(smoothing) = ema {
                anyhow::ensure!((0.0..1.0).contains(&smoothing), "--ema must be in [0, 1)");
            }
            let trial = trial.parse().context("not a trial id")?;
            let client = connect(&cluster).await?;
            let points = client.metrics(trial).await?;
            let mut series: std::collections::BTreeMap<String, Vec<(Option<u64>, f64)>> =
                Default::default();
            for point in points.iter().filter(|point| point.rank == rank) {
                for (metric, value) in &point.values {
                    if name.as_ref().is_none_or(|wanted| wanted == metric) {
                        series
                            .entry(metric.clone())
                            .or_default()
                            .push((point.step, *value));
                    }
                }
            }
            for (metric, values) in &series {
                let raw: Vec<f64> = values.iter().map(|(_, value)| *value).collect();
                let smoothed = ema.map(|smoothing| xp_tune::stats::ema(&raw, smoothing));
                if json {
                    let steps: Vec<Option<u64>> = values.iter().map(|(step, _)| *step).collect();
                    println!(
                        "{}",
                        serde_json::json!({ "metric": metric, "steps": steps, "values": raw, "ema": smoothed })
                    );
                } else {
                    println!("{metric}");
                    for (idx, (step, value)) in values.iter().enumerate() {
                        let step = step.map_or("-".to_owned(), |step| step.to_string());
                        match &smoothed {
                            Some(smoothed) => println!(
                                "  step {step:>6}  {value:>14.6}  ema {:>14.6}",
                                smoothed[idx]
                            ),
                            None => println!("  step {step:>6}  {value:>14.6}"),
                        }
                    }
                }
            }
            client.close().await;
        }
        Command::Bench {
            bench:
                Bench::Allreduce {
                    workers,
                    sizes,
                    transport,
                    json,
                },
        } => {
            anyhow::ensure!(
                (1..=64).contains(&workers),
                "--workers must be between 1 and 64"
            );
            anyhow::ensure!(
                sizes.iter().all(|size| (4..=(1usize << 31)).contains(size)),
                "--size must be between 4 bytes and 2 GiB"
            );
            let kind: xp_runtime::collective::TransportKind = transport
                .parse()
                .map_err(|error: String| anyhow::anyhow!(error))?;
            let config = xp_runtime::collective::CollectiveConfig::default();
            let ceilings = xp_runtime::collective::bench::ceilings(64 << 20, &config)
                .await
                .context("measuring the ceilings")?;
            let measurements =
                xp_runtime::collective::bench::bench_allreduce(workers, &sizes, kind)
                    .await
                    .context("running the all-reduce")?;
            if !json {
                println!(
                    "ceilings: QUIC p2p {:.2} GB/s ({:.2} CPU cores busy), loopback TCP {:.2} GB/s, memcpy {:.2} GB/s\n{:>12} {:>8} {:>10} {:>12} {:>12} {:>12} {:>10}",
                    ceilings.quic_p2p_gbps,
                    ceilings.quic_p2p_cpu_cores,
                    ceilings.tcp_loopback_gbps,
                    ceilings.memcpy_gbps,
                    "size_bytes",
                    "workers",
                    "transport",
                    "time_ms",
                    "algbw_GB/s",
                    "busbw_GB/s",
                    "cpu_cores"
                );
            }
            for measurement in &measurements {
                if json {
                    println!(
                        "{}",
                        serde_json::json!({
                            "size_bytes": measurement.size_bytes,
                            "workers": measurement.workers,
                            "transport": measurement.transport.name(),
                            "time_s": measurement.time_s,
                            "algbw_gbps": measurement.algbw_gbps,
                            "busbw_gbps": measurement.busbw_gbps,
                            "cpu_cores": measurement.cpu_cores,
                            "quic_p2p_gbps": ceilings.quic_p2p_gbps,
                            "quic_p2p_cpu_cores": ceilings.quic_p2p_cpu_cores,
                            "tcp_loopback_gbps": ceilings.tcp_loopback_gbps,
                            "memcpy_gbps": ceilings.memcpy_gbps,
                        })
                    );
                } else {
                    println!(
                        "{:>12} {:>8} {:>10} {:>12.3} {:>12.3} {:>12.3} {:>10.2}",
                        measurement.size_bytes,
                        measurement.workers,
                        measurement.transport.name(),
                        measurement.time_s * 1e3,
                        measurement.algbw_gbps,
                        measurement.busbw_gbps,
                        measurement.cpu_cores
                    );
                }
            }
        }
        Command::Bench {
            bench:
                Bench::Objects {
                    sizes,
                    checkpoint_bytes,
                    dir,
                    json,
                },
        } => {
            anyhow::ensure!(
                sizes
                    .iter()
                    .chain([&checkpoint_bytes])
                    .all(|size| *size <= 4 << 30),
                "sizes must be at most 4 GiB"
            );
            anyhow::ensure!(
                sizes.iter().all(|size| *size > 0),
                "--size must be positive"
            );
            let scratch = match &dir {
                Some(dir) => tempfile::tempdir_in(dir),
                None => tempfile::tempdir(),
            }
            .context("cannot create a scratch directory")?;
            let measurements =
                xp_node::objects::bench::run(scratch.path(), &sizes, checkpoint_bytes)
                    .await
                    .map_err(|error| anyhow::anyhow!(error))
                    .context("the objects bench failed")?;
            if !json {
                println!(
                    "{:<19} {:<7} {:>12} {:>10} {:>12} {:>7}  REFERENCE",
                    "OP", "TIER", "SIZE_BYTES", "GB/s", "REF_GB/s", "RATIO"
                );
            }
            for measurement in &measurements {
                let ratio = measurement.gbps / measurement.reference_gbps;
                if json {
                    println!(
                        "{}",
                        serde_json::json!({
                            "op": measurement.op,
                            "tier": measurement.tier,
                            "size_bytes": measurement.size_bytes,
                            "gbps": measurement.gbps,
                            "reference_gbps": measurement.reference_gbps,
                            "reference": measurement.reference,
                            "ratio": ratio,
                        })
                    );
                } else {
                    println!(
                        "{:<19} {:<7} {:>12} {:>10.3} {:>12.3} {:>7.2}  {}",
                        measurement.op,
                        measurement.tier,
                        measurement.size_bytes,
                        measurement.gbps,
                        measurement.reference_gbps,
                        ratio,
                        measurement.reference
                    );
                }
            }
        }
        Command::Bench {
            bench:
                Bench::Trials {
                    trials,
                    slots,
                    json,
                },
        } => {
            anyhow::ensure!(
                trials > 0 && slots > 0,
                "--trials and --slots must be positive"
            );
            let result = xp::bench::trials(trials, slots)
                .await
                .context("the trials bench failed")?;
            if json {
                println!("{}", result.to_json());
            } else {
                println!(
                    "{} no-op trials on {} slots in {:.2} s: {:.1} trials/s ({:.0}% of the {:.0} processes/s spawned directly)\nsubmit -> running: p50 {:.0} ms, p99 {:.0} ms (includes queueing)\nplaced -> running: p50 {:.0} ms, p99 {:.0} ms",
                    result.trials,
                    result.slots,
                    result.seconds,
                    result.trials_per_second,
                    100.0 * result.trials_per_second / result.direct_spawns_per_second,
                    result.direct_spawns_per_second,
                    result.submit_to_running_ms.0,
                    result.submit_to_running_ms.1,
                    result.placed_to_running_ms.0,
                    result.placed_to_running_ms.1
                );
            }
        }
    }
    Ok(())
}

#[expect(
    clippy::print_stderr,
    reason = "progress notes go to stderr so stdout stays parseable"
)]
fn eprintln_note(note: &str) {
    eprintln!("{note}");
}

#[expect(clippy::print_stdout, reason = "the CLI's user-facing output")]
fn print_status_table(status: &ExperimentStatus) {
    let count = |state: TrialState| {
        status
            .trials
            .iter()
            .filter(|trial| trial.state == state)
            .count()
    };
    println!(
        "experiment {}  {}  team {}  {}  ({} trials: {} succeeded, {} failed, {} running, {} waiting)",
        status.id,
        status.name,
        status.team,
        status.state.as_str(),
        status.trials.len(),
        count(TrialState::Succeeded),
        count(TrialState::Failed),
        count(TrialState::Running) + count(TrialState::Starting) + count(TrialState::Placed),
        count(TrialState::Pending) + count(TrialState::Queued),
    );
    println!(
        "  {:<24} {:<10} {:>8}  {:<40} CONFIG",
        "TRIAL", "STATE", "ATTEMPTS", "METRICS"
    );
    for trial in &status.trials {
        let metrics: Vec<String> = trial
            .metrics
            .iter()
            .map(|(name, value)| format!("{name}={value:.4}"))
            .collect();
        println!(
            "  {:<24} {:<10} {:>8}  {:<40} {}",
            trial.id.to_string(),
            trial.state.as_str(),
            trial.attempts.len(),
            metrics.join(" "),
            trial.config_json
        );
        if let Some(waiting) = &trial.waiting {
            println!("  {:<24} waits: {waiting}", "");
        }
        if trial.attempts.len() > 1 || trial.attempts.iter().any(|a| a.resumed_from.is_some()) {
            for attempt in &trial.attempts {
                let nodes: Vec<String> = attempt
                    .nodes
                    .iter()
                    .map(|node| node.to_string().chars().take(8).collect())
                    .collect();
                let resumed = attempt.resumed_from.map_or_else(
                    || "from the start".to_owned(),
                    |(step, from)| format!("resumed from step {step} (attempt {from})"),
                );
                println!(
                    "  {:<24} attempt {} on {}: {resumed}; {}",
                    "",
                    attempt.number,
                    nodes.join(","),
                    attempt.outcome.as_deref().unwrap_or("running")
                );
            }
        }
    }
}

#[expect(clippy::print_stdout, reason = "the CLI's user-facing output")]
fn print_checkpoints(checkpoints: &[xp_runtime::protocol::CheckpointStatus], json: bool) {
    if json {
        for checkpoint in checkpoints {
            println!("{}", xp_runtime::views::checkpoint_json(checkpoint));
        }
        return;
    }
    println!(
        "{:<24} {:>7} {:>10} {:>6} {:>12} {:>10}  REPLICAS",
        "TRIAL", "ATTEMPT", "STEP", "FILES", "BYTES", "METRIC"
    );
    for checkpoint in checkpoints {
        let mut replicas: Vec<String> = checkpoint
            .replicas
            .iter()
            .map(|node| node.to_string().chars().take(8).collect())
            .collect();
        if let Some(backup) = &checkpoint.backup {
            replicas.push(format!("backup {backup}"));
        }
        println!(
            "{:<24} {:>7} {:>10} {:>6} {:>12} {:>10}  {}",
            checkpoint.trial.to_string(),
            checkpoint.attempt,
            checkpoint.step,
            checkpoint.files.len(),
            checkpoint.bytes,
            checkpoint
                .metric
                .map_or_else(|| "-".to_owned(), |metric| format!("{metric:.4}")),
            if replicas.is_empty() {
                "none reachable".to_owned()
            } else {
                replicas.join(",")
            }
        );
    }
}

/// A resource amount for a table: `-` for unlimited.
fn amount_text(value: Option<f64>) -> String {
    value.map_or_else(|| "-".to_owned(), |value| format!("{value:.1}"))
}

#[expect(clippy::print_stdout, reason = "the CLI's user-facing output")]
fn print_queues(queues: &[xp_runtime::protocol::QueueStatus], json: bool) {
    if json {
        for queue in queues {
            println!(
                "{}",
                serde_json::to_string(queue).expect("queue status serialises")
            );
        }
        return;
    }
    println!(
        "{:<16} {:<12} {:<12} {:>6} {:>13} {:>9} {:>9} {:>8} {:>8} {:>10}",
        "QUEUE",
        "TEAM",
        "COHORT",
        "WEIGHT",
        "GPU USE/QUOTA",
        "BORROWED",
        "LENT",
        "PENDING",
        "RUNNING",
        "FAIR SHARE"
    );
    for queue in queues {
        println!(
            "{:<16} {:<12} {:<12} {:>6.1} {:>6}/{:<6} {:>9} {:>9} {:>8} {:>8} {:>10.3}",
            queue.name,
            queue.team,
            queue.cohort.as_deref().unwrap_or("-"),
            queue.weight,
            amount_text(queue.usage.gpu),
            amount_text(queue.quota.gpu),
            amount_text(queue.borrowed.gpu),
            amount_text(queue.lent.gpu),
            queue.pending,
            queue.running,
            queue.fair_share,
        );
    }
}
