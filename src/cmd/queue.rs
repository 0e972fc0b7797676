//! `xp queue`: the scheduling queues and their standing, the leases, the
//! preemptions waiting for an admin's approval and the conflict odds.

use xp_runtime::protocol::LeaseReport;

use super::ClusterArg;
use super::connect;
use super::leases::{claims_text, report_json};

/// The scheduling queues: usage, quota, borrowed, lent, pending, fair share,
/// leases and preemptions waiting for approval.
#[derive(clap::Args, Debug)]
pub(crate) struct QueueArgs {
    #[command(flatten)]
    cluster: ClusterArg,
    /// One JSON object per queue, one per line, then one object with
    /// `leases`, `approvals`, `odds` and `any_conflict`.
    #[arg(long)]
    json: bool,
}

pub(crate) async fn run(args: QueueArgs) -> anyhow::Result<()> {
    let QueueArgs { cluster, json } = args;
    let client = connect(&cluster).await?;
    let queues = client.queues().await?;
    let report = client.leases().await?;
    client.close().await;
    print_queues(&queues, json);
    print_report(&report, json);
    Ok(())
}

/// The leases, pending approvals and conflict odds after the queues.
fn print_report(report: &LeaseReport, json: bool) {
    if json {
        outln!("{}", report_json(report));
        return;
    }
    if !report.leases.is_empty() {
        outln!();
        outln!("{:<24} {:>9} {:<40}", "LEASE", "HELD/CAP", "WAITERS");
        for lease in &report.leases {
            outln!(
                "{:<24} {:>4}/{:<4} {:<40}",
                lease.name,
                lease.held,
                lease.capacity,
                claims_text(&lease.waiters, lease.waiting)
            );
        }
    }
    if !report.approvals.is_empty() {
        outln!();
        outln!("preemptions waiting for approval (xp admin approve|deny ID --why ...):");
        for approval in &report.approvals {
            outln!(
                "  {:>4}  stop {} for {}: {}",
                approval.id,
                approval.victim,
                approval.claimant,
                approval.why
            );
        }
    }
    let observed: Vec<_> = report
        .odds
        .iter()
        .filter(|odds| odds.requests > 0)
        .collect();
    if !observed.is_empty() {
        outln!();
        outln!(
            "{:<28} {:>8} {:>7} {:>6} {:>8} {:>10}",
            "RESOURCE",
            "REQUESTS",
            "WAITED",
            "P",
            "WAITING",
            "P(ANY)"
        );
        for odds in observed {
            outln!(
                "{:<28} {:>8} {:>7} {:>6.3} {:>8} {:>10.3}",
                odds.resource,
                odds.requests,
                odds.waited,
                odds.p.unwrap_or(0.0),
                odds.waiting_now,
                odds.any_conflict
            );
        }
        outln!(
            "chance that at least one waiting request conflicts: {:.3}",
            report.any_conflict
        );
    }
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
        "{:<16} {:<12} {:<12} {:>6} {:>13} {:>9} {:>9} {:>8} {:>8} {:>10} {}",
        "QUEUE",
        "TEAM",
        "COHORT",
        "WEIGHT",
        "GPU USE/QUOTA",
        "BORROWED",
        "LENT",
        "PENDING",
        "RUNNING",
        "FAIR SHARE",
        "LEASES"
    );
    for queue in queues {
        let leases = if queue.leases.is_empty() {
            "-".to_owned()
        } else {
            queue
                .leases
                .iter()
                .map(|(name, units)| match queue.lease_quota.get(name) {
                    Some(quota) => format!("{name}={units}/{quota}"),
                    None => format!("{name}={units}"),
                })
                .collect::<Vec<_>>()
                .join(",")
        };
        outln!(
            "{:<16} {:<12} {:<12} {:>6.1} {:>6}/{:<6} {:>9} {:>9} {:>8} {:>8} {:>10.3} {}",
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
            leases,
        );
    }
}

/// A resource amount for a table: `-` for unlimited.
fn amount_text(value: Option<f64>) -> String {
    value.map_or_else(|| "-".to_owned(), |value| format!("{value:.1}"))
}
