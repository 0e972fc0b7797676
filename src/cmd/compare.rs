//! `xp compare`: statistics of seed replicates per configuration, and significance against the best.

use anyhow::Context;

use super::connect;
use super::offline::{self, Source, SourceArg};

/// Statistics of seed replicates per configuration, and significance against the best.
#[derive(clap::Args, Debug)]
pub(crate) struct CompareArgs {
    /// An experiment id or a unique prefix.
    experiment: String,
    #[command(flatten)]
    source: SourceArg,
    /// The significance level of the Welch t-tests.
    #[arg(long, default_value_t = 0.05)]
    alpha: f64,
    /// One JSON object per configuration, best first.
    #[arg(long)]
    json: bool,
}

pub(crate) async fn run(args: CompareArgs) -> anyhow::Result<()> {
    let CompareArgs {
        experiment,
        source,
        alpha,
        json,
    } = args;
    anyhow::ensure!(alpha > 0.0 && alpha < 1.0, "--alpha must be in (0, 1)");
    let mut list = match source.source()? {
        Source::DataDir(data_dir) => offline::status(&data_dir, Some(&experiment))?,
        Source::Cluster(cluster) => {
            let client = connect(&cluster).await?;
            let list = client.status(Some(&experiment)).await?;
            client.close().await;
            list
        }
    };
    let status = list.pop().context("no such experiment")?;
    let comparison = xp::analysis::compare(&status, alpha)?;
    if json {
        for (rank, config) in comparison.configs.iter().enumerate() {
            outln!("{}", config.to_json(rank + 1));
        }
    } else {
        outln!(
            "experiment {}  metric {} ({} is better)",
            status.id,
            comparison.metric,
            if comparison.maximize {
                "higher"
            } else {
                "lower"
            }
        );
        outln!(
            "  {:>4} {:>3} {:>12} {:>10} {:>27}  {:<40} VERDICT",
            "RANK",
            "N",
            "MEAN",
            "STD",
            "95% CI",
            "CONFIG"
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
            outln!(
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
    Ok(())
}
