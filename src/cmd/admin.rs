//! `xp admin`: arbitration by an admin; each action is recorded with the
//! authenticated user (never a name the client gives) and why.

use std::path::PathBuf;

use anyhow::Context;
use xp_runtime::protocol::AdminAction;

use super::ClusterArg;
use super::connect;

/// Arbitration by an admin; each action is recorded with who and why.
#[derive(clap::Args, Debug)]
pub(crate) struct AdminArgs {
    #[command(flatten)]
    cluster: ClusterArg,
    /// Why, recorded in every touched trial's events (also after the
    /// subcommand: `xp admin approve 3 --why ...`).
    #[arg(long, default_value = "", global = true)]
    why: String,
    #[command(subcommand)]
    action: AdminCommand,
}

pub(crate) async fn run(args: AdminArgs) -> anyhow::Result<()> {
    let AdminArgs {
        cluster,
        why,
        action,
    } = args;
    let action = match action {
        AdminCommand::Policy {
            action: PolicyCommand::Apply { file },
        } => {
            let yaml = std::fs::read_to_string(&file)
                .with_context(|| format!("cannot read {}", file.display()))?;
            anyhow::ensure!(
                yaml.len() <= xp_sched::config::MAX_POLICY_BYTES,
                "{} is larger than a policy may be",
                file.display()
            );
            xp_sched::PolicyConfig::from_yaml(&yaml)
                .with_context(|| format!("{} is not a valid policy", file.display()))?;
            AdminAction::ApplyPolicy { yaml }
        }
        AdminCommand::Priority { id, value } => AdminAction::Priority { id, value },
        AdminCommand::Hold { id } => AdminAction::Hold { id },
        AdminCommand::Release { id } => AdminAction::Release { id },
        AdminCommand::Move { id, queue } => AdminAction::Move { id, queue },
        AdminCommand::Approve { request } => {
            anyhow::ensure!(!why.trim().is_empty(), "say why with --why");
            AdminAction::Approve { request }
        }
        AdminCommand::Deny { request } => {
            anyhow::ensure!(!why.trim().is_empty(), "say why with --why");
            AdminAction::Deny { request }
        }
    };
    let client = connect(&cluster).await?;
    let (_, message) = client.admin(action, &why).await?;
    outln!("{message}");
    client.close().await;
    Ok(())
}

#[derive(clap::Subcommand, Debug)]
pub(crate) enum AdminCommand {
    /// Replace the head's scheduling policy.
    Policy {
        #[command(subcommand)]
        action: PolicyCommand,
    },
    /// Set the base priority of a trial or of an experiment's unfinished trials.
    Priority {
        /// A trial id, or an experiment id (or unique prefix).
        id: String,
        /// The new base priority.
        #[arg(allow_hyphen_values = true)]
        value: i64,
    },
    /// Keep a trial (or an experiment's trials) from being placed.
    Hold {
        /// A trial id, or an experiment id (or unique prefix).
        id: String,
    },
    /// Let held trials be placed again.
    Release {
        /// A trial id, or an experiment id (or unique prefix).
        id: String,
    },
    /// Move a trial (or an experiment's trials) to another queue.
    Move {
        /// A trial id, or an experiment id (or unique prefix).
        id: String,
        /// The queue.
        queue: String,
    },
    /// Let a preemption waiting for approval go ahead (`xp queue` lists them).
    Approve {
        /// The request's id.
        request: u64,
    },
    /// Refuse a preemption waiting for approval; it is not asked again for
    /// the same victim and claimant while both stay where they are.
    Deny {
        /// The request's id.
        request: u64,
    },
}

#[derive(clap::Subcommand, Debug)]
pub(crate) enum PolicyCommand {
    /// Apply a policy file (checked here first, then by the head).
    Apply {
        /// The YAML file.
        file: PathBuf,
    },
}
