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
    if let Some(front) = xp::compare_front(&status) {
        print_front(&status, &front, json);
        return Ok(());
    }
    let comparison = xp::compare(&status, alpha)?;
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
                Some(summary) if summary.n == 1 => (
                    format!("{:.5}", summary.mean),
                    "-".to_owned(),
                    "-".to_owned(),
                ),
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
                config.verdict(rank + 1, alpha)
            );
        }
    }
    Ok(())
}

/// A multi-objective experiment: its configurations' replicate means, the
/// Pareto front of them first (by hypervolume contribution), with the hypervolume.
fn print_front(
    status: &xp_runtime::protocol::ExperimentStatus,
    front: &xp::FrontComparison,
    json: bool,
) {
    if json {
        outln!("{}", front.to_json());
        for (rank, config) in front.configs.iter().enumerate() {
            outln!("{}", config.to_json(&front.objectives, rank + 1));
        }
        return;
    }
    outln!(
        "experiment {}  objectives {}",
        status.id,
        super::status::objectives_text(&front.objectives)
    );
    let on_front = front
        .configs
        .iter()
        .filter(|config| config.contribution.is_some())
        .count();
    outln!(
        "  Pareto front of configurations (replicate means): {on_front} of {}, hypervolume {} against {}",
        front.configs.len(),
        super::status::volume_text(front.hypervolume),
        super::status::reference_text(front.reference.as_deref(), front.reference_declared)
    );
    let mut header = format!("  {:>4} {:>3}", "RANK", "N");
    for objective in &front.objectives {
        header.push_str(&format!(
            " {:>22}",
            format!("{} (mean ± sd)", objective.metric)
        ));
    }
    outln!("{header} {:>12}  CONFIG", "CONTRIBUTION");
    for (rank, config) in front.configs.iter().enumerate() {
        let mut row = format!("  {:>4} {:>3}", rank + 1, config.trials.len());
        for summary in &config.summaries {
            let cell = match summary {
                Some(summary) if summary.n > 1 => {
                    format!("{:.5} ± {:.5}", summary.mean, summary.std_dev)
                }
                Some(summary) => format!("{:.5}", summary.mean),
                None => "-".to_owned(),
            };
            row.push_str(&format!(" {cell:>22}"));
        }
        let contribution = config
            .contribution
            .map_or_else(|| "dominated".to_owned(), |value| format!("{value:.6}"));
        outln!("{row} {contribution:>12}  {}", config.config);
    }
}
