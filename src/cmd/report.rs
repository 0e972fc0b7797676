//! `xp report`: what a scope's GPU-hours were, what they cost, how busy the
//! cluster was, the queueing figures of Little's law, the return on the
//! GPU-hours and Amdahl's law fitted to runs at several parallelism settings.
//!
//! The head computes everything (`xp_tune::report` over its records); this
//! command only asks and prints, as `views::report_json` with `--json`.

use std::time::Duration;

use anyhow::Context;
use xp_runtime::protocol::ReportRequest;
use xp_runtime::report::UsageReport;
use xp_runtime::views::report_json;

use super::{ClusterArg, connect};

/// One experiment's, one team's or (admins) the whole cluster's report.
#[derive(clap::Args, Debug)]
pub(crate) struct ReportArgs {
    #[command(flatten)]
    cluster: ClusterArg,
    /// One experiment (id or unique prefix).
    #[arg(long, conflicts_with = "team")]
    experiment: Option<String>,
    /// One team's experiments; without this or `--experiment`, the whole cluster (admins only).
    #[arg(long)]
    team: Option<String>,
    /// Only the last stretch of time (`1h`, `7days`); everything since the first arrival otherwise.
    #[arg(long, value_parser = humantime::parse_duration)]
    since: Option<Duration>,
    /// One JSON object.
    #[arg(long)]
    json: bool,
}

pub(crate) async fn run(args: ReportArgs) -> anyhow::Result<()> {
    let since_ms = args
        .since
        .map(|since| u64::try_from(since.as_millis()).context("--since is too long"))
        .transpose()?;
    let client = connect(&args.cluster).await?;
    let report = client
        .report(ReportRequest {
            experiment: args.experiment,
            team: args.team,
            since_ms,
        })
        .await;
    client.close().await;
    let report = report?;
    if args.json {
        outln!("{}", report_json(&report));
    } else {
        print_text(&report);
    }
    Ok(())
}

/// A value with `digits` decimals, or `-`.
fn optional(value: Option<f64>, digits: usize) -> String {
    value.map_or_else(|| "-".to_owned(), |value| format!("{value:.digits$}"))
}

/// The report as text: its scope and window, then [`print_spending`],
/// [`print_queueing`], [`print_returns`] and [`print_amdahl`].
fn print_text(report: &UsageReport) {
    print_spending(report);
    print_queueing(report);
    print_returns(report);
    print_amdahl(report);
}

/// The scope and its window, the GPU-hours used and lost, what they cost (by
/// GPU model) and how much of what was available they were.
fn print_spending(report: &UsageReport) {
    let window_s = report.window_end.saturating_sub(report.window_start) / 1000;
    outln!(
        "{} over {}",
        report.scope,
        humantime::format_duration(Duration::from_secs(window_s))
    );
    outln!();
    outln!(
        "GPU-hours      {:.3} used, {:.3} lost (preemption {:.3}, failure {:.3}, node loss {:.3})",
        report.gpu_hours,
        report.gpu_hours_lost,
        report.lost_by_cause.preemption,
        report.lost_by_cause.failure,
        report.lost_by_cause.node_loss
    );
    match report.cost {
        Some(cost) => outln!(
            "cost           {cost:.2} ({} lost{})",
            optional(report.cost_lost, 2),
            if report.unpriced_gpu_hours > 0.0 {
                format!(
                    "; {:.3} GPU-hours of unpriced models",
                    report.unpriced_gpu_hours
                )
            } else {
                String::new()
            }
        ),
        None => outln!("cost           - (the policy names no `prices`)"),
    }
    for model in &report.by_model {
        outln!(
            "  {:<12} {:.3} GPU-hours at {} = {}",
            model.model,
            model.gpu_hours,
            optional(model.price_per_hour, 2),
            optional(model.cost, 2)
        );
    }
    outln!(
        "utilisation    {} of {:.3} GPU-hours available{}",
        report
            .utilization
            .map_or_else(|| "-".to_owned(), |u| format!("{:.1}%", u * 100.0)),
        report.available_gpu_hours,
        report
            .busy_utilization
            .map(|busy| format!(", busy {:.1}% (telemetry)", busy * 100.0))
            .unwrap_or_default()
    );
}

/// Throughput, time in the system and the number in it: Little's law.
fn print_queueing(report: &UsageReport) {
    let queueing = &report.queueing;
    outln!(
        "throughput λ   {:.3} trials/hour ({} finished, {} arrived)",
        queueing.throughput_per_hour,
        queueing.finished,
        queueing.arrived
    );
    outln!(
        "time in sys W  {} s",
        optional(queueing.mean_time_in_system_s, 1)
    );
    outln!("number in L    {:.3}", queueing.mean_in_system);
    outln!(
        "Little's law   L / (λW) = {} (1 when every trial arrives and leaves inside the window)",
        optional(queueing.littles_law_ratio, 3)
    );
}

/// Per experiment: its best value as GPU-hours were spent, and what the last
/// quarter of them bought.
fn print_returns(report: &UsageReport) {
    for figures in &report.returns {
        outln!();
        outln!(
            "experiment {}: best {} = {} after {:.3} GPU-hours",
            figures.experiment,
            figures.metric,
            optional(figures.best, 4),
            figures.gpu_hours
        );
        for point in &figures.best_vs_gpu_hours {
            outln!(
                "  {:>10.3} GPU-h  best {:<12.4} ({} = {:.4})",
                point.gpu_hours,
                point.best,
                point.trial,
                point.value
            );
        }
        outln!(
            "  last quarter of the GPU-hours improved the best by {}{}",
            optional(figures.last_quarter_gain, 4),
            figures
                .roi_percent
                .map(|roi| format!(", ROI {roi:.1}%"))
                .unwrap_or_default()
        );
    }
}

/// Amdahl's law fitted to runs at several parallelism settings.
fn print_amdahl(report: &UsageReport) {
    for fit in &report.amdahl {
        outln!();
        outln!(
            "Amdahl ({}, varying {}): serial fraction {:.3}, predicted speed-up {:.2} at {}",
            fit.name,
            fit.varied,
            fit.serial_fraction,
            fit.predicted_speedup,
            fit.predicted_parallelism
        );
        for point in &fit.points {
            outln!(
                "  p = {:<6} {:>10.1} s  speed-up {:.2}",
                point.parallelism,
                point.seconds,
                point.speedup
            );
        }
    }
}
