//! `xp queue`: replay a workload trace through the scheduling policy on a simulated cluster.

use super::ClusterArg;
use super::connect;

/// Replay a workload trace through the scheduling policy on a simulated cluster.
/// The scheduling queues: usage, quota, borrowed, lent, pending and fair share.
#[derive(clap::Args, Debug)]
pub(crate) struct QueueArgs {
    #[command(flatten)]
    cluster: ClusterArg,
    /// One JSON object per queue, one per line.
    #[arg(long)]
    json: bool,
}

pub(crate) async fn run(args: QueueArgs) -> anyhow::Result<()> {
    let QueueArgs { cluster, json } = args;
    let client = connect(&cluster).await?;
    print_queues(&client.queues().await?, json);
    client.close().await;
    Ok(())
}

fn print_queues(queues: &[xp_runtime::protocol::QueueStatus], json: bool) {
    if json {
        for queue in queues {
            outln!(
                "{}",
                serde_json::to_string(queue).expect("queue status serialises")
            );
        }
        return;
    }
    outln!(
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
        outln!(
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

/// A resource amount for a table: `-` for unlimited.
fn amount_text(value: Option<f64>) -> String {
    value.map_or_else(|| "-".to_owned(), |value| format!("{value:.1}"))
}
