//! `xp run FILE.yaml`: run an experiment to its end and print its results, on an
//! embedded local cluster unless a cluster is named.
//!
//! The local cluster (a head and a node in this process, workers as child
//! processes) offers what this machine has and keeps its state in a data
//! directory (`./.xp` by default: `head/` and `node/` under it), so that
//! `xp status --data-dir` and `xp logs --data-dir` read it after `xp run` has
//! exited. Ctrl-C cancels the experiment's trials, waits for them to stop and
//! shuts the cluster down; `--keep` leaves the cluster serving after the end.
//! Not here: drawing progress (`watch`) and reading a kept directory (`offline`).

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::Context;
use xp::{Client, Cluster, ExperimentId, ExperimentSpec, LocalOptions};
use xp_runtime::protocol::{ExperimentStatus, TrialState};

use super::eprintln_note;
use super::offline::{head_dir, node_dir};
use super::submit::{read_spec, submit_spec};
use super::watch::{expected_trials, print_results, watch};

/// The data directory of a local run when `--data-dir` is not given.
const DEFAULT_DATA_DIR: &str = ".xp";

/// How long an interrupted run waits for its cancelled trials to stop: the head
/// gives a worker 5 s after SIGTERM before it kills it.
const CANCEL_WAIT: Duration = Duration::from_secs(30);

/// Run an experiment to its end and print its results.
#[derive(clap::Args, Debug)]
pub(crate) struct RunArgs {
    /// The experiment file.
    file: PathBuf,
    /// Run on a cluster (your credential, from `XP_CLUSTER`, `--cluster-file` or
    /// `--cluster`) instead of a local one.
    #[command(flatten)]
    cluster: super::ClusterArg,
    /// Where the local cluster keeps its state; `.xp` when absent.
    #[arg(long, value_name = "DIR")]
    data_dir: Option<PathBuf>,
    /// GPU slots the local node declares; the GPUs NVML finds when absent.
    #[arg(long)]
    gpus: Option<u32>,
    /// CPU cores the local node offers; all when absent.
    #[arg(long)]
    cpus: Option<f64>,
    /// Serve the local head's HTTP API on this address (with `--keep`, say `127.0.0.1:8080`).
    #[arg(long, value_name = "ADDR")]
    http: Option<SocketAddr>,
    /// Run again even if an identical experiment already finished.
    #[arg(long)]
    rerun: bool,
    /// Leave the local cluster running after the experiment, until Ctrl-C.
    #[arg(long)]
    keep: bool,
}

pub(crate) async fn run(args: RunArgs) -> anyhow::Result<()> {
    let spec = read_spec(&args.file)?;
    if args.cluster.cluster.is_none() && args.cluster.cluster_file.is_none() {
        return run_local(args, &spec).await;
    }
    if args.data_dir.is_some() || args.gpus.is_some() || args.cpus.is_some() || args.keep {
        anyhow::bail!(
            "--data-dir, --gpus, --cpus and --keep shape a local cluster, but a cluster is named (--cluster, --cluster-file or XP_CLUSTER)"
        );
    }
    let cluster = Cluster::connect_to(args.cluster.join()?)
        .await
        .context("cannot connect to the cluster")?;
    let experiment = submit_spec(&cluster, &spec, &args.file, args.rerun).await?;
    eprintln_note(&format!("experiment {}", experiment.experiment));
    let outcome = follow(&cluster, experiment.experiment, &spec).await;
    cluster.shutdown().await;
    match outcome? {
        Outcome::Ended(status) => {
            print_results(&status);
            Ok(super::ended::judge(&status)?)
        }
        Outcome::Interrupted { finished, total } => {
            Err(super::ended::Ended::Interrupted { finished, total }.into())
        }
    }
}

async fn run_local(args: RunArgs, spec: &ExperimentSpec) -> anyhow::Result<()> {
    let data_dir = args
        .data_dir
        .unwrap_or_else(|| PathBuf::from(DEFAULT_DATA_DIR));
    std::fs::create_dir_all(&data_dir)
        .with_context(|| format!("cannot create {}", data_dir.display()))?;
    let cluster = Cluster::local_with(LocalOptions {
        data_dir: Some(data_dir.clone()),
        gpus: args.gpus,
        cpus: args.cpus,
        http: args.http,
        ..LocalOptions::default()
    })
    .await
    .with_context(|| format!("cannot start a local cluster in {}", data_dir.display()))?;
    note_capacity(&cluster, &data_dir).await;
    let outcome = async {
        let submitted = submit_spec(&cluster, spec, &args.file, args.rerun).await?;
        eprintln_note(&format!("experiment {}", submitted.experiment));
        follow(&cluster, submitted.experiment, spec).await
    }
    .await;
    let outcome = match outcome {
        Ok(outcome) => outcome,
        Err(error) => {
            cluster.shutdown().await;
            return Err(error);
        }
    };
    let status = match outcome {
        Outcome::Ended(status) => *status,
        Outcome::Interrupted { finished, total } => {
            cluster.shutdown().await;
            eprintln_note(&format!(
                "interrupted: {finished} of {total} trials had finished; their records are kept in {} (`xp status --data-dir {}`)",
                data_dir.display(),
                data_dir.display()
            ));
            return Err(super::ended::Ended::Interrupted { finished, total }.into());
        }
    };
    print_results(&status);
    if args.keep {
        keep_serving(&cluster).await;
    }
    cluster.shutdown().await;
    eprintln_note(&format!(
        "kept in {}: `xp status --data-dir {}`, `xp logs --data-dir {} TRIAL`",
        data_dir.display(),
        data_dir.display(),
        data_dir.display()
    ));
    Ok(super::ended::judge(&status)?)
}

/// Says what the local node offers and where its state is kept.
async fn note_capacity(cluster: &Cluster, data_dir: &Path) {
    let nodes = match cluster.nodes().await {
        Ok(nodes) => nodes,
        Err(error) => {
            tracing::warn!(%error, "cannot list the local node");
            return;
        }
    };
    for node in nodes {
        eprintln_note(&format!(
            "local cluster: {} GPUs, {} CPUs, {:.1} GiB of memory; head data in {}, node data in {}",
            node.capacity.gpus.len(),
            f64::from(node.capacity.cpu_milli) / 1000.0,
            node.capacity.memory_bytes as f64 / f64::from(1u32 << 30),
            head_dir(data_dir).display(),
            node_dir(data_dir).display()
        ));
    }
}

/// How following an experiment ended.
enum Outcome {
    /// No trial is left to run.
    Ended(Box<ExperimentStatus>),
    /// Ctrl-C: the experiment was cancelled and its trials have stopped.
    Interrupted { finished: usize, total: usize },
}

/// Watches `experiment` to its end, or cancels it on Ctrl-C and waits for its
/// trials to stop.
async fn follow(
    client: &Client,
    experiment: ExperimentId,
    spec: &ExperimentSpec,
) -> anyhow::Result<Outcome> {
    tokio::select! {
        status = watch(client, experiment, expected_trials(spec)) => Ok(Outcome::Ended(Box::new(status?))),
        signal = tokio::signal::ctrl_c() => {
            signal.context("cannot listen for Ctrl-C")?;
            eprintln_note("Ctrl-C: cancelling the experiment's trials (Ctrl-C again stops waiting)");
            let cancelled = client
                .cancel(&experiment.to_string())
                .await
                .context("cannot cancel the experiment")?;
            eprintln_note(&format!("cancelled {cancelled} trials; waiting for them to stop"));
            let status = tokio::select! {
                status = wait_stopped(client, experiment) => Some(status?),
                _ = tokio::signal::ctrl_c() => None,
            };
            let (finished, total) = status.map_or((0, 0), |status| {
                let finished = status
                    .trials
                    .iter()
                    .filter(|trial| trial.state.is_terminal() && trial.state != TrialState::Cancelled)
                    .count();
                (finished, status.trials.len())
            });
            Ok(Outcome::Interrupted { finished, total })
        }
    }
}

/// Polls `experiment` until none of its trials runs, for at most [`CANCEL_WAIT`].
async fn wait_stopped(
    client: &Client,
    experiment: ExperimentId,
) -> anyhow::Result<ExperimentStatus> {
    let deadline = tokio::time::Instant::now() + CANCEL_WAIT;
    loop {
        let status = client.experiment(experiment).await?;
        let running = status
            .trials
            .iter()
            .filter(|trial| !trial.state.is_terminal())
            .count();
        if running == 0 {
            return Ok(status);
        }
        if tokio::time::Instant::now() >= deadline {
            tracing::warn!(
                running,
                "trials still stopping; the node's shutdown ends them"
            );
            return Ok(status);
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Prints how to reach the local cluster and serves until Ctrl-C.
async fn keep_serving(cluster: &Cluster) {
    eprintln_note("the local cluster keeps running until Ctrl-C; reach it with:");
    eprintln_note(&format!("  export XP_CLUSTER='{}'", cluster.join_string()));
    if let Some(http) = cluster.http_addr() {
        eprintln_note(&format!("  HTTP API: http://{http}"));
    }
    if let Err(error) = tokio::signal::ctrl_c().await {
        tracing::warn!(%error, "cannot listen for Ctrl-C; stopping the cluster now");
    }
}
