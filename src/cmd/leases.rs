//! `xp leases`: each shared lease of the policy with its capacity, the trials
//! holding units and those waiting for them.

use serde_json::{Value, json};
use xp_runtime::protocol::{LeaseClaim, LeaseReport, LeaseStatus};

use super::ClusterArg;
use super::connect;

/// Shared leases: capacity, holders and waiters.
#[derive(clap::Args, Debug)]
pub(crate) struct LeasesArgs {
    #[command(flatten)]
    cluster: ClusterArg,
    /// One JSON object per lease, one per line.
    #[arg(long)]
    json: bool,
}

pub(crate) async fn run(args: LeasesArgs) -> anyhow::Result<()> {
    let LeasesArgs { cluster, json } = args;
    let client = connect(&cluster).await?;
    let report = client.leases().await?;
    client.close().await;
    print_leases(&report, json);
    Ok(())
}

fn print_leases(report: &LeaseReport, json: bool) {
    if json {
        for lease in &report.leases {
            outln!("{}", lease_json(lease));
        }
        return;
    }
    if report.leases.is_empty() {
        outln!("the scheduling policy declares no leases");
        return;
    }
    outln!(
        "{:<24} {:>9} {:<40} {:<40}",
        "LEASE",
        "HELD/CAP",
        "HOLDERS",
        "WAITERS"
    );
    for lease in &report.leases {
        outln!(
            "{:<24} {:>4}/{:<4} {:<40} {:<40}",
            lease.name,
            lease.held,
            lease.capacity,
            claims_text(&lease.holders, lease.holding),
            claims_text(&lease.waiters, lease.waiting),
        );
    }
}

/// Claims as `TRIAL (team, N)` joined by commas, then how many of `total`
/// belong to teams the caller does not see; `-` when none.
pub(crate) fn claims_text(claims: &[LeaseClaim], total: u64) -> String {
    let mut parts: Vec<String> = claims
        .iter()
        .map(|claim| format!("{} ({}, {})", claim.trial, claim.team, claim.units))
        .collect();
    let hidden = total.saturating_sub(claims.len() as u64);
    if hidden > 0 {
        parts.push(format!("{hidden} of other teams"));
    }
    if parts.is_empty() {
        return "-".to_owned();
    }
    parts.join(", ")
}

/// A lease as JSON, trial ids as text.
pub(crate) fn lease_json(lease: &LeaseStatus) -> Value {
    let claims = |claims: &[LeaseClaim]| -> Vec<Value> {
        claims
            .iter()
            .map(|claim| json!({"trial": claim.trial.to_string(), "team": claim.team, "units": claim.units}))
            .collect()
    };
    json!({
        "name": lease.name,
        "capacity": lease.capacity,
        "held": lease.held,
        "holders": claims(&lease.holders),
        "waiters": claims(&lease.waiters),
        "holding": lease.holding,
        "waiting": lease.waiting,
    })
}

/// The whole lease report as JSON (`xp queue --json`'s last line), trial ids
/// as text.
pub(crate) fn report_json(report: &LeaseReport) -> Value {
    let approvals: Vec<Value> = report
        .approvals
        .iter()
        .map(|approval| {
            json!({
                "id": approval.id,
                "victim": approval.victim.to_string(),
                "claimant": approval.claimant.to_string(),
                "why": approval.why,
                "at": approval.at,
            })
        })
        .collect();
    json!({
        "leases": report.leases.iter().map(lease_json).collect::<Vec<_>>(),
        "approvals": approvals,
        "odds": report.odds,
        "any_conflict": report.any_conflict,
    })
}
