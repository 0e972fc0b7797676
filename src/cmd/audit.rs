//! `xp audit`: the head's audit trail (admin actions and refusals, each with
//! the authenticated user); admins only.

use super::{ClusterArg, connect};

/// The newest entries of the audit trail.
#[derive(clap::Args, Debug)]
pub(crate) struct AuditArgs {
    #[command(flatten)]
    cluster: ClusterArg,
    /// How many of the newest entries.
    #[arg(long, default_value_t = 100)]
    limit: u32,
    /// One JSON object per line.
    #[arg(long)]
    json: bool,
}

pub(crate) async fn run(args: AuditArgs) -> anyhow::Result<()> {
    let client = connect(&args.cluster).await?;
    let entries = client.audit(args.limit).await?;
    for entry in entries {
        if args.json {
            outln!(
                "{}",
                serde_json::json!({
                    "seq": entry.seq,
                    "at": entry.at,
                    "who": entry.who,
                    "action": entry.action,
                    "allowed": entry.allowed,
                    "detail": entry.detail,
                })
            );
        } else {
            outln!(
                "{:>6} {} {:<8} {:<16} {}: {}",
                entry.seq,
                humantime::format_rfc3339_seconds(
                    std::time::UNIX_EPOCH + std::time::Duration::from_millis(entry.at)
                ),
                if entry.allowed { "allowed" } else { "REFUSED" },
                entry.who,
                entry.action,
                entry.detail
            );
        }
    }
    client.close().await;
    Ok(())
}
