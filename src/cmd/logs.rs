//! `xp logs`: print a worker's output.

use std::io::Write;
use std::time::Duration;

use anyhow::Context;

use super::offline::{self, Source, SourceArg};
use super::{connect, exit_on_output_error};

/// Print a worker's output. A log longer than its node's cap (`xp-node join
/// --log-cap`) shows its beginning, a marker line naming the bytes dropped, and
/// its end.
#[derive(clap::Args, Debug)]
pub(crate) struct LogsArgs {
    /// The trial id.
    trial: String,
    #[command(flatten)]
    source: SourceArg,
    /// The worker's rank.
    #[arg(long, default_value_t = 0)]
    rank: u32,
    /// The attempt; the latest when absent.
    #[arg(long)]
    attempt: Option<u32>,
    /// Keep printing until the worker exits. A reader that falls behind a log
    /// over its cap is shown a marker for the bytes dropped meanwhile.
    #[arg(long)]
    follow: bool,
}

pub(crate) async fn run(args: LogsArgs) -> anyhow::Result<()> {
    let LogsArgs {
        trial,
        source,
        rank,
        attempt,
        follow,
    } = args;
    let trial = trial.parse().context("not a trial id")?;
    let cluster = match source.source()? {
        // Nothing runs on a kept data directory: its logs are complete.
        Source::DataDir(data_dir) => return offline::print_log(&data_dir, trial, rank, attempt),
        Source::Cluster(cluster) => cluster,
    };
    let client = connect(&cluster).await?;
    let mut offset = 0;
    loop {
        let chunk = client.logs(trial, rank, attempt, offset).await?;
        offset = chunk.next_offset;
        let mut stdout = std::io::stdout().lock();
        if let Err(error) = stdout.write_all(&chunk.data).and_then(|()| stdout.flush()) {
            exit_on_output_error(&error);
        }
        drop(stdout);
        if chunk.data.is_empty() && (chunk.complete || !follow) {
            break;
        }
        if chunk.data.is_empty() {
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    }
    client.close().await;
    Ok(())
}
