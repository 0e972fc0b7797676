//! `xp alerts [EXP] [--json]`: the alerts raised on trials (one experiment's, or
//! every one this credential sees), newest first, with what each did and where
//! its webhook deliveries stand.

use super::ClusterArg;
use super::connect;
use xp_runtime::protocol::{AlertStatus, DeliveryState};

/// Alerts raised on trials, newest first.
#[derive(clap::Args, Debug)]
pub(crate) struct AlertsArgs {
    /// The experiment id (or a unique prefix, or its name); every visible one when absent.
    experiment: Option<String>,
    #[command(flatten)]
    cluster: ClusterArg,
    /// One JSON object per alert, one per line (a non-finite value is "NaN",
    /// "Infinity" or "-Infinity").
    #[arg(long)]
    json: bool,
}

pub(crate) async fn run(args: AlertsArgs) -> anyhow::Result<()> {
    let AlertsArgs {
        experiment,
        cluster,
        json,
    } = args;
    let client = connect(&cluster).await?;
    let alerts = client.alerts(experiment.as_deref()).await?;
    print_alerts(&alerts, json);
    client.close().await;
    Ok(())
}

fn delivery(state: &DeliveryState) -> String {
    match state {
        DeliveryState::NotRequested => "-".to_owned(),
        DeliveryState::Pending { attempts } => format!("pending ({attempts} tries)"),
        DeliveryState::Delivered { attempts, .. } => format!("delivered ({attempts} tries)"),
        DeliveryState::Failed { attempts, error } => format!("failed ({attempts} tries): {error}"),
        DeliveryState::Dropped => "dropped (queue full)".to_owned(),
        DeliveryState::DroppedBecause { reason } => format!("dropped: {reason}"),
    }
}

fn print_alerts(alerts: &[AlertStatus], json: bool) {
    if json {
        for alert in alerts {
            outln!("{}", xp_runtime::views::alert_json(alert));
        }
        return;
    }
    if alerts.is_empty() {
        outln!("no alerts");
        return;
    }
    outln!(
        "{:>5} {:<24} {:<16} {:<8} {:<14} {:<7}  MESSAGE",
        "ID",
        "TRIAL",
        "RULE",
        "ACTIONS",
        "WEBHOOK",
        "STATE"
    );
    for alert in alerts {
        let actions = alert
            .actions
            .iter()
            .filter(|action| *action != "event")
            .cloned()
            .collect::<Vec<_>>()
            .join(",");
        outln!(
            "{:>5} {:<24} {:<16} {:<8} {:<14} {:<7}  {}",
            alert.id,
            alert.trial.to_string(),
            alert.rule,
            if actions.is_empty() {
                "event"
            } else {
                actions.as_str()
            },
            delivery(&alert.delivery),
            if alert.cleared_at.is_some() {
                "cleared"
            } else {
                "active"
            },
            alert.message
        );
    }
}
