//! The `xp` command line: submit experiments, watch them, read logs, benchmark.

use std::io::Write;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context;
use clap::{Parser, Subcommand};
use xp::{Client, ExperimentSpec, SubmitOptions};
use xp_runtime::protocol::{ExperimentStatus, NodeState, TrialState};
use xp_runtime::views::{experiment_json, node_json};

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
    /// Measure the runtime on an embedded local cluster.
    Bench {
        #[command(subcommand)]
        bench: Bench,
    },
}

#[derive(Subcommand, Debug)]
enum Bench {
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
                .submit(&spec, &SubmitOptions { rerun, base_dir })
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
                    let state = if node.state == NodeState::Ready {
                        "ready"
                    } else {
                        "lost"
                    };
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
                        f64::from(node.free_milli_cpus) / 1000.0,
                        f64::from(node.capacity.milli_cpus) / 1000.0,
                        node.running_workers,
                        labels.join(",")
                    );
                }
            }
            client.close().await;
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
    }
}
