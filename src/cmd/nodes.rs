//! `xp nodes`: list the cluster's nodes, with the address the others reach each at
//! and what each enforces on its workers (`ISOLATION`: a user id per worker,
//! cgroup limits; `none` where workers share the node's user and run unlimited).

use xp_runtime::views::node_json;

use super::ClusterArg;
use super::connect;

/// List the cluster's nodes.
#[derive(clap::Args, Debug)]
pub(crate) struct NodesArgs {
    #[command(flatten)]
    cluster: ClusterArg,
    /// One JSON object per node, one per line.
    #[arg(long)]
    json: bool,
}

pub(crate) async fn run(args: NodesArgs) -> anyhow::Result<()> {
    let NodesArgs { cluster, json } = args;
    let client = connect(&cluster).await?;
    let nodes = client.nodes().await?;
    if json {
        for node in &nodes {
            outln!("{}", node_json(node));
        }
    } else {
        outln!(
            "{:<34} {:<16} {:<16} {:<6} {:>9} {:>11} {:>8}  {:<14} LABELS",
            "NODE",
            "NAME",
            "ADDRESS",
            "STATE",
            "GPUS USED",
            "CPUS USED",
            "WORKERS",
            "ISOLATION"
        );
        for node in &nodes {
            let state = node.state.as_str();
            let labels: Vec<String> = node
                .labels
                .iter()
                .map(|(key, value)| format!("{key}={value}"))
                .collect();
            outln!(
                "{:<34} {:<16} {:<16} {:<6} {:>4}/{:<4} {:>5.1}/{:<5.1} {:>8}  {:<14} {}",
                node.id.to_string(),
                node.name,
                node.address,
                state,
                // Used of total, as `xp top` shows them.
                node.capacity
                    .gpus
                    .len()
                    .saturating_sub(node.free_gpus as usize),
                node.capacity.gpus.len(),
                f64::from(node.capacity.cpu_milli.saturating_sub(node.free_cpu_milli)) / 1000.0,
                f64::from(node.capacity.cpu_milli) / 1000.0,
                node.running_workers,
                node.isolation.label(),
                labels.join(",")
            );
        }
    }
    client.close().await;
    Ok(())
}
