//! The `xp-head` binary: runs one head until SIGTERM or Ctrl-C.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context;
use clap::{Parser, Subcommand};
use xp_head::core::CoreConfig;

#[derive(Parser, Debug)]
#[command(
    name = "xp-head",
    version,
    about = "The xp head: placement, registry and APIs of an xp cluster"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Start the head and print the join string.
    Start {
        /// UDP address for QUIC; port 0 picks a free port.
        #[arg(long, default_value = "0.0.0.0:7700")]
        listen: SocketAddr,
        /// Where the database, trust material and blobs are kept.
        #[arg(long)]
        data_dir: PathBuf,
        /// Serve the HTTP API on this address.
        #[arg(long)]
        http: Option<SocketAddr>,
        /// The host name or address to put in the join string.
        #[arg(long)]
        advertise: Option<String>,
        /// A node silent this long is lost and its trials are retried elsewhere.
        #[arg(long, default_value = "10s", value_parser = humantime::parse_duration)]
        node_timeout: Duration,
    },
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    init_tracing();
    let cli = Cli::parse();
    match cli.command {
        Command::Start {
            listen,
            data_dir,
            http,
            advertise,
            node_timeout,
        } => {
            let advertise = advertise.or_else(|| listen.ip().is_unspecified().then(hostname));
            let config = xp_head::HeadConfig {
                listen,
                data_dir: data_dir.clone(),
                http,
                advertise_host: advertise,
                core: CoreConfig {
                    node_timeout_ms: node_timeout.as_millis() as u64,
                    ..CoreConfig::default()
                },
            };
            let head = xp_head::start(config).await.with_context(|| {
                format!(
                    "cannot start the head with data directory {}",
                    data_dir.display()
                )
            })?;
            print_addresses(&head);
            wait_for_signal().await?;
            tracing::info!("shutting down");
            head.shutdown().await;
            Ok(())
        }
    }
}

#[expect(
    clippy::print_stdout,
    reason = "the join string is the binary's user-facing output"
)]
fn print_addresses(head: &xp_head::RunningHead) {
    println!("{}", head.join);
    if let Some(http) = head.http_addr {
        println!("http://{http}");
    }
}

fn hostname() -> String {
    nix::unistd::gethostname()
        .ok()
        .and_then(|name| name.into_string().ok())
        .unwrap_or_else(|| "localhost".to_owned())
}

async fn wait_for_signal() -> anyhow::Result<()> {
    let mut terminate = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .context("cannot listen for SIGTERM")?;
    tokio::select! {
        _ = terminate.recv() => {}
        result = tokio::signal::ctrl_c() => result.context("cannot listen for Ctrl-C")?,
    }
    Ok(())
}

fn init_tracing() {
    let filter = tracing_subscriber::EnvFilter::try_from_env("XP_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
}
