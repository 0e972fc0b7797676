//! Who may do what: the one decision over every request the head serves.
//!
//! [`authorize`] is pure (no I/O, no clock, no lookups): the head actor resolves
//! who asks (a [`Principal`], from the user table's current state) and what the
//! request touches (a [`Target`]: the team that owns it, the queue it goes to),
//! and this module says yes or why not. A refusal names what was refused and
//! which role would allow it. The user table and its commands live in `users`,
//! the head machine's local command socket in `socket`.
//!
//! Roles, each including the one before it:
//! - `viewer`: read everything of their team (experiments, events, metrics,
//!   logs, checkpoints) and the cluster's nodes and queues; change nothing;
//! - `member`: also submit into their team, cancel, hold and release their
//!   team's work, and store objects;
//! - `team-admin`: also set priorities and move their team's work between the
//!   queues their team may use;
//! - `admin`: everything, on every team's work: policies, the audit trail.
//!
//! A node credential acts as a node only: it registers, reports, fetches
//! driver binaries, locates objects and asks which drivers share objects, and
//! nothing a user does.

pub mod access;
pub mod users;

use serde::{Deserialize, Serialize};

/// A user's role.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Role {
    /// Reads their team's work and the cluster.
    Viewer,
    /// Also submits, cancels, holds and releases their team's work.
    Member,
    /// Also sets priorities and moves their team's work between its queues.
    TeamAdmin,
    /// Everything, on every team's work.
    Admin,
}

impl Role {
    /// Every role, lowest first.
    pub const ALL: [Self; 4] = [Self::Viewer, Self::Member, Self::TeamAdmin, Self::Admin];

    /// Its name as commands take it.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Viewer => "viewer",
            Self::Member => "member",
            Self::TeamAdmin => "team-admin",
            Self::Admin => "admin",
        }
    }
}

impl std::fmt::Display for Role {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl std::str::FromStr for Role {
    type Err = UnknownRole;

    fn from_str(text: &str) -> Result<Self, UnknownRole> {
        Self::ALL
            .into_iter()
            .find(|role| role.as_str() == text)
            .ok_or_else(|| UnknownRole {
                name: text.to_owned(),
            })
    }
}

/// A role name that is not one of the roles.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown role {name:?}: one of viewer, member, team-admin, admin")]
pub struct UnknownRole {
    /// The name given.
    pub name: String,
}

/// Who asks, as the head authenticated them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Principal {
    /// A connection holding the node credential.
    Node,
    /// A user, with their team and role as the user table has them now.
    User {
        /// The user's name.
        name: String,
        /// Their team.
        team: String,
        /// Their role.
        role: Role,
    },
}

impl Principal {
    /// The name recorded for it (in events and the audit trail).
    pub fn name(&self) -> &str {
        match self {
            Self::Node => "node",
            Self::User { name, .. } => name,
        }
    }

    /// The team whose work it may see, or `None` for every team (admins).
    /// Nodes see no team's experiments.
    pub fn visible_team(&self) -> Visibility {
        match self {
            Self::Node => Visibility::Nothing,
            Self::User {
                role: Role::Admin, ..
            } => Visibility::All,
            Self::User { team, .. } => Visibility::Team(team.clone()),
        }
    }
}

impl std::fmt::Display for Principal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Node => f.write_str("the node credential"),
            Self::User { name, team, role } => {
                write!(f, "user {name} ({role} of team {team})")
            }
        }
    }
}

/// Which teams' experiments a principal sees in lists.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Visibility {
    /// Every team's.
    All,
    /// One team's.
    Team(String),
    /// None.
    Nothing,
}

impl Visibility {
    /// Whether an experiment of `team` is shown.
    pub fn shows(&self, team: &str) -> bool {
        match self {
            Self::All => true,
            Self::Team(own) => own == team,
            Self::Nothing => false,
        }
    }
}

/// What a request does. Every wire request maps to one of these.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Action {
    /// List experiments (filtered to what the principal sees).
    ListExperiments,
    /// Read one experiment: its status, events, metrics, logs, checkpoints.
    ReadExperiment,
    /// Read the cluster: nodes and queues.
    ReadCluster,
    /// Read the audit trail.
    ReadAudit,
    /// Submit an experiment into a team.
    Submit,
    /// Cancel an experiment or trial.
    Cancel,
    /// Hold trials.
    Hold,
    /// Release held trials.
    Release,
    /// Set trials' priority.
    Priority,
    /// Move trials to another queue.
    Move,
    /// Replace the scheduling policy.
    ApplyPolicy,
    /// Upload a driver binary, ask where to store objects, get the object key.
    StoreObjects,
    /// Ask which nodes hold an object.
    LocateObject,
    /// Download a driver binary (what a node runs).
    FetchBlob,
    /// Ask which driver sessions share objects with an experiment.
    SharingDrivers,
    /// Read the report (GPU-hours, cost, utilisation) of the whole cluster;
    /// a team's or an experiment's is [`Action::ReadExperiment`].
    ReadClusterReport,
    /// Approve or deny a preemption waiting for a person's approval.
    ArbitratePreemption,
}

impl Action {
    /// Every action.
    pub const ALL: [Self; 17] = [
        Self::ListExperiments,
        Self::ReadExperiment,
        Self::ReadCluster,
        Self::ReadAudit,
        Self::Submit,
        Self::Cancel,
        Self::Hold,
        Self::Release,
        Self::Priority,
        Self::Move,
        Self::ApplyPolicy,
        Self::StoreObjects,
        Self::LocateObject,
        Self::FetchBlob,
        Self::SharingDrivers,
        Self::ReadClusterReport,
        Self::ArbitratePreemption,
    ];

    /// In words, for refusals.
    pub fn describe(self) -> &'static str {
        match self {
            Self::ListExperiments => "list experiments",
            Self::ReadExperiment => "read",
            Self::ReadCluster => "read nodes and queues",
            Self::ReadAudit => "read the audit trail",
            Self::Submit => "submit",
            Self::Cancel => "cancel",
            Self::Hold => "hold",
            Self::Release => "release",
            Self::Priority => "reprioritise",
            Self::Move => "move",
            Self::ApplyPolicy => "apply a scheduling policy",
            Self::StoreObjects => "store objects or driver binaries",
            Self::LocateObject => "locate objects",
            Self::FetchBlob => "download driver binaries",
            Self::SharingDrivers => "ask which drivers share objects",
            Self::ReadClusterReport => "read the cluster-wide report",
            Self::ArbitratePreemption => "approve or deny a preemption",
        }
    }

    /// The lowest role that may do this on its own team's work.
    fn own_team_role(self) -> Option<Role> {
        match self {
            Self::ListExperiments | Self::ReadExperiment | Self::ReadCluster => Some(Role::Viewer),
            Self::Submit
            | Self::Cancel
            | Self::Hold
            | Self::Release
            | Self::StoreObjects
            | Self::LocateObject => Some(Role::Member),
            Self::Priority | Self::Move => Some(Role::TeamAdmin),
            Self::ReadAudit
            | Self::ApplyPolicy
            | Self::ReadClusterReport
            | Self::ArbitratePreemption => Some(Role::Admin),
            // Node work: no user role does it.
            Self::FetchBlob | Self::SharingDrivers => None,
        }
    }

    /// Whether a node credential does this.
    fn is_node_work(self) -> bool {
        matches!(
            self,
            Self::FetchBlob | Self::LocateObject | Self::SharingDrivers
        )
    }
}

/// What a request touches.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Target<'a> {
    /// Nothing of a team: the cluster (nodes, queues, policy, audit, objects).
    Cluster,
    /// Work of this team.
    Team(&'a str),
    /// Work of `team` going into a queue owned by `queue_owner` (`None`: a
    /// queue open to every team).
    Queue {
        /// The work's team.
        team: &'a str,
        /// The destination queue's team, if it has one.
        queue_owner: Option<&'a str>,
    },
}

/// Why a request was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{principal} may not {what}: {needs}")]
pub struct Refusal {
    /// Who asked, in words.
    pub principal: String,
    /// What was refused, in words.
    pub what: String,
    /// What would allow it.
    pub needs: String,
}

/// Whether `principal` may do `action` on `target`.
pub fn authorize(principal: &Principal, action: Action, target: Target<'_>) -> Result<(), Refusal> {
    let what = match target {
        Target::Cluster => action.describe().to_owned(),
        Target::Team(team) => format!("{} work of team {team}", action.describe()),
        Target::Queue { team, queue_owner } => format!(
            "{} work of team {team} into {}",
            action.describe(),
            queue_owner.map_or_else(
                || "a queue open to every team".to_owned(),
                |owner| format!("a queue of team {owner}")
            )
        ),
    };
    let refuse = |needs: String| {
        Err(Refusal {
            principal: principal.to_string(),
            what: what.clone(),
            needs,
        })
    };
    let (team, role) = match principal {
        Principal::Node => {
            return if action.is_node_work() {
                Ok(())
            } else {
                refuse("a node credential only serves the cluster (register, report, fetch binaries, locate objects); this needs a user credential (`xp-head user add`)".to_owned())
            };
        }
        Principal::User { team, role, .. } => (team.as_str(), *role),
    };
    let Some(needed) = action.own_team_role() else {
        return refuse("only nodes do this, with the node credential".to_owned());
    };
    if role == Role::Admin {
        return Ok(());
    }
    let own = match target {
        Target::Cluster => true,
        Target::Team(owner) => owner == team,
        Target::Queue {
            team: owner,
            queue_owner,
        } => owner == team && queue_owner.is_none_or(|queue_team| queue_team == team),
    };
    if !own {
        return refuse(format!(
            "only an admin may act on another team's work (you are {role} of team {team})"
        ));
    }
    if role < needed {
        return refuse(format!("needs role {needed} or above (you are {role})"));
    }
    Ok(())
}

/// The team a submission goes into: the spec's, except that a non-admin's
/// spec naming no team (the spec's default `default`) goes into their own.
pub fn submit_team<'a>(principal: &'a Principal, spec_team: &'a str) -> &'a str {
    match principal {
        Principal::User { team, role, .. }
            if *role != Role::Admin && spec_team == xp_runtime::spec::DEFAULT_TEAM =>
        {
            team
        }
        _ => spec_team,
    }
}

#[cfg(test)]
mod tests;
