//! `xp checkpoints`: the checkpoints kept for an experiment's trials, where their
//! replicas are, and why one that has a single copy has it.

use xp_runtime::protocol::MAX_CHECKPOINTS_PER_PAGE;

use super::ClusterArg;
use super::connect;

/// The checkpoints kept for an experiment's trials, and where their replicas are.
#[derive(clap::Args, Debug)]
pub(crate) struct CheckpointsArgs {
    /// The experiment id (or a unique prefix, or its name).
    experiment: String,
    #[command(flatten)]
    cluster: ClusterArg,
    /// One JSON object per checkpoint, one per line.
    #[arg(long)]
    json: bool,
}

pub(crate) async fn run(args: CheckpointsArgs) -> anyhow::Result<()> {
    let CheckpointsArgs {
        experiment,
        cluster,
        json,
    } = args;
    let client = connect(&cluster).await?;
    // Page by page, each printed as it comes: an experiment of many trials
    // keeps more checkpoints than one answer holds.
    if !json {
        print_header();
    }
    let mut after = None;
    loop {
        let page = client
            .checkpoints_page(&experiment, after, MAX_CHECKPOINTS_PER_PAGE)
            .await?;
        print_checkpoints(&page.checkpoints, json);
        match page.next {
            Some(next) => after = Some(next),
            None => break,
        }
    }
    client.close().await;
    Ok(())
}

fn print_header() {
    outln!(
        "{:<24} {:>7} {:>10} {:>6} {:>12} {:>10}  REPLICAS",
        "TRIAL",
        "ATTEMPT",
        "STEP",
        "FILES",
        "BYTES",
        "METRIC"
    );
}

fn print_checkpoints(checkpoints: &[xp_runtime::protocol::CheckpointStatus], json: bool) {
    if json {
        for checkpoint in checkpoints {
            outln!("{}", xp_runtime::views::checkpoint_json(checkpoint));
        }
        return;
    }
    for checkpoint in checkpoints {
        let mut replicas: Vec<String> = checkpoint
            .replicas
            .iter()
            .map(|node| node.to_string().chars().take(8).collect())
            .collect();
        if let Some(backup) = &checkpoint.backup {
            replicas.push(format!("backup {backup}"));
        }
        let mut held = if replicas.is_empty() {
            "none reachable".to_owned()
        } else {
            replicas.join(",")
        };
        if let Some(reason) = &checkpoint.unreplicated {
            held.push_str(&format!("  UNREPLICATED: {reason}"));
        }
        outln!(
            "{:<24} {:>7} {:>10} {:>6} {:>12} {:>10}  {}",
            checkpoint.trial.to_string(),
            checkpoint.attempt,
            checkpoint.step,
            checkpoint.files.len(),
            checkpoint.bytes,
            checkpoint
                .metric
                .map_or_else(|| "-".to_owned(), |metric| format!("{metric:.4}")),
            held
        );
    }
}
