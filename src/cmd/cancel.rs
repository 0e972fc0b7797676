//! `xp cancel`: cancel an experiment or a single trial.

use super::ClusterArg;
use super::connect;

/// Cancel an experiment or a single trial.
#[derive(clap::Args, Debug)]
pub(crate) struct CancelArgs {
    /// An experiment id (or unique prefix) or a trial id.
    id: String,
    #[command(flatten)]
    cluster: ClusterArg,
}

pub(crate) async fn run(args: CancelArgs) -> anyhow::Result<()> {
    let CancelArgs { id, cluster } = args;
    let client = connect(&cluster).await?;
    let trials = client.cancel(&id).await?;
    outln!("cancelled {trials} trial(s)");
    client.close().await;
    Ok(())
}
