//! The `xp-node` binary: joins a cluster and runs workers until SIGTERM or Ctrl-C.
//!
//! Only parses the command line, installs the tracing subscriber (`XP_LOG`) and
//! turns signals into the shutdown token; the node itself is `xp_node::run`.

use std::collections::BTreeMap;
use std::path::PathBuf;

use anyhow::Context;
use clap::{Parser, Subcommand};
use tokio_util::sync::CancellationToken;
use xp_runtime::join::JoinString;

#[derive(Parser, Debug)]
#[command(
    name = "xp-node",
    version,
    about = "The xp node agent: offers this machine's slots to an xp cluster"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Join the cluster named by a join string.
    Join {
        /// The join string printed by `xp-head start`.
        join: String,
        /// Where logs and cached binaries are kept.
        #[arg(long)]
        data_dir: PathBuf,
        /// Declare N GPU slots (machines without NVML); NVML decides when absent.
        #[arg(long)]
        gpus: Option<u32>,
        /// CPU cores to offer; all when absent.
        #[arg(long)]
        cpus: Option<f64>,
        /// Memory to offer, such as 16GiB; all when absent.
        #[arg(long, value_parser = xp_runtime::spec::parse_memory)]
        memory: Option<u64>,
        /// A label KEY=VALUE, repeatable.
        #[arg(long = "label", value_parser = parse_label)]
        labels: Vec<(String, String)>,
        /// The host or address other nodes and their workers reach this one at.
        /// When absent, the local address of the route to the head (never the
        /// host name, which may resolve to a loopback address).
        #[arg(long)]
        advertise: Option<String>,
        /// Memory the object store may use before spilling to disk, such as 1GiB.
        #[arg(long, value_parser = xp_runtime::spec::parse_memory, default_value = "1GiB")]
        object_memory: u64,
        /// Disk the object store may use under the data directory, such as 100GiB.
        #[arg(long, value_parser = xp_runtime::spec::parse_memory, default_value = "256GiB")]
        object_disk: u64,
        /// The UDP port other nodes fetch objects from; 0 picks a free one.
        #[arg(long, default_value_t = 0)]
        object_port: u16,
        /// A durable directory (such as a shared file system mounted at the same
        /// path on every node) that each checkpoint is also written to, so that
        /// losing every node holding it loses nothing.
        #[arg(long)]
        checkpoint_backup: Option<PathBuf>,
        /// The most disk each worker's log keeps, such as 64MiB: the first half of
        /// its output and a rolling tail, with a marker saying what was dropped
        /// between. 64MiB holds about half a million lines of 128 bytes, far more
        /// than a training run usually prints, so ordinary logs are never cut,
        /// while a worker printing in a loop cannot fill the disk: 16 workers stay
        /// within 1GiB per round of attempts, and `xp logs` reads a whole log in
        /// seconds.
        #[arg(long, value_parser = xp_runtime::spec::parse_memory, default_value = "64MiB")]
        log_cap: u64,
    },
}

fn parse_label(text: &str) -> Result<(String, String), String> {
    let (key, value) = text
        .split_once('=')
        .ok_or_else(|| format!("label {text:?} is not KEY=VALUE"))?;
    if key.is_empty() || key.len() > 63 || value.len() > 253 {
        return Err(format!(
            "label {text:?}: the key must be 1-63 and the value at most 253 characters"
        ));
    }
    Ok((key.to_owned(), value.to_owned()))
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let filter = tracing_subscriber::EnvFilter::try_from_env("XP_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
    let Command::Join {
        join,
        data_dir,
        gpus,
        cpus,
        memory,
        labels,
        advertise,
        object_memory,
        object_disk,
        object_port,
        checkpoint_backup,
        log_cap,
    } = Cli::parse().command;
    let join: JoinString = join.parse().context("the join string is invalid")?;
    if let Some(cpus) = cpus {
        anyhow::ensure!(
            cpus.is_finite() && cpus > 0.0,
            "--cpus must be a positive number"
        );
    }
    let config = xp_node::NodeConfig {
        join,
        data_dir,
        gpus,
        cpus,
        memory_bytes: memory,
        labels: labels.into_iter().collect::<BTreeMap<_, _>>(),
        advertise_host: advertise,
        object_limits: xp_node::objects::StoreLimits {
            memory_bytes: object_memory,
            disk_bytes: object_disk,
            ..xp_node::objects::StoreLimits::default()
        },
        object_port,
        checkpoint_backup,
        log_cap: xp_node::worker_log::LogCap::new(log_cap).context("--log-cap")?,
    };
    let shutdown = CancellationToken::new();
    let signals = shutdown.clone();
    let mut terminate = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .context("cannot listen for SIGTERM")?;
    let _signal_task = xp_runtime::task::spawn("signals", async move {
        tokio::select! {
            _ = terminate.recv() => {}
            _ = tokio::signal::ctrl_c() => {}
        }
        tracing::info!("shutting down");
        signals.cancel();
    });
    xp_node::run(config, shutdown)
        .await
        .context("the node stopped")?;
    Ok(())
}
