//! `xp metrics`: a trial's metric history, optionally smoothed.

use anyhow::Context;

use super::ClusterArg;
use super::connect;

/// A trial's metric history, optionally smoothed.
#[derive(clap::Args, Debug)]
pub(crate) struct MetricsArgs {
    /// The trial id.
    trial: String,
    #[command(flatten)]
    cluster: ClusterArg,
    /// Only this metric.
    #[arg(long)]
    name: Option<String>,
    /// The worker's rank.
    #[arg(long, default_value_t = 0)]
    rank: u32,
    /// Add an exponential moving average with this smoothing, such as 0.9.
    #[arg(long)]
    ema: Option<f64>,
    /// One JSON object per metric.
    #[arg(long)]
    json: bool,
}

pub(crate) async fn run(args: MetricsArgs) -> anyhow::Result<()> {
    let MetricsArgs {
        trial,
        cluster,
        name,
        rank,
        ema,
        json,
    } = args;
    if let Some(smoothing) = ema {
        anyhow::ensure!((0.0..1.0).contains(&smoothing), "--ema must be in [0, 1)");
    }
    let trial = trial.parse().context("not a trial id")?;
    let client = connect(&cluster).await?;
    let points = client.metrics(trial).await?;
    let mut series: std::collections::BTreeMap<String, Vec<(Option<u64>, f64)>> =
        Default::default();
    for point in points.iter().filter(|point| point.rank == rank) {
        for (metric, value) in &point.values {
            if name.as_ref().is_none_or(|wanted| wanted == metric) {
                series
                    .entry(metric.clone())
                    .or_default()
                    .push((point.step, *value));
            }
        }
    }
    for (metric, values) in &series {
        let raw: Vec<f64> = values.iter().map(|(_, value)| *value).collect();
        let smoothed = ema.map(|smoothing| xp_tune::stats::ema(&raw, smoothing));
        if json {
            let steps: Vec<Option<u64>> = values.iter().map(|(step, _)| *step).collect();
            // JSON has no NaN: a non-finite value is its name ("NaN", "Infinity").
            let as_json = |values: &[f64]| -> Vec<serde_json::Value> {
                values
                    .iter()
                    .map(|value| xp_runtime::metric_value::value_json(*value))
                    .collect()
            };
            outln!(
                "{}",
                serde_json::json!({
                    "metric": metric,
                    "steps": steps,
                    "values": as_json(&raw),
                    "ema": smoothed.as_deref().map(as_json),
                })
            );
        } else {
            outln!("{metric}");
            for (idx, (step, value)) in values.iter().enumerate() {
                let step = step.map_or("-".to_owned(), |step| step.to_string());
                match &smoothed {
                    Some(smoothed) => outln!(
                        "  step {step:>6}  {value:>14.6}  ema {:>14.6}",
                        smoothed[idx]
                    ),
                    None => outln!("  step {step:>6}  {value:>14.6}"),
                }
            }
        }
    }
    client.close().await;
    Ok(())
}
