//! What a request does and names (an [`Access`]), before the name is
//! resolved to the team owning it (`resolve`) and judged (`authorize`).
//!
//! Each request's file in `crate::requests` gives its access; this module
//! holds the shapes, their bounds and their words for the audit trail.

use xp_runtime::ids::{ExperimentId, TrialId};

use super::{Action, Principal};

/// Who a connection authenticated as: what the actor resolves to a
/// [`super::Principal`] against the user table on every request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Caller {
    /// The node credential.
    Node,
    /// A user's credential.
    User {
        /// The user it named when the connection was made.
        name: String,
        /// The hash of the secret presented (not the secret).
        secret_hash: [u8; 32],
    },
}

/// What a request names, to be resolved to a team.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Scope {
    /// Nothing of one team.
    Cluster,
    /// An experiment by id.
    Experiment(ExperimentId),
    /// An experiment by id or unique prefix.
    ExperimentNamed(String),
    /// A trial.
    Trial(TrialId),
    /// A trial id, else an experiment id or prefix.
    Named(String),
    /// A submission into the team its spec names.
    Submit {
        /// The spec's team.
        team: String,
    },
    /// Trials (as [`Scope::Named`]) going into a queue.
    Move {
        /// The trial or experiment.
        named: String,
        /// The queue.
        queue: String,
    },
    /// A team's work as a whole.
    Team(String),
    /// A pipeline by id.
    Pipeline(u64),
    /// An admin's verdict on a preemption waiting for approval (cluster-wide),
    /// with the verdict and why, so that the audit entry records both.
    PreemptionRequest {
        /// The request's id.
        request: u64,
        /// `approve` or `deny`.
        verdict: &'static str,
        /// The admin's reason.
        why: String,
    },
}

/// What authorization found: who asks, and the experiment the request's name
/// resolved to among what they see, so that the request is served on exactly
/// that one (a prefix could match other teams' work in the core).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Authorized {
    /// Who asks.
    pub principal: Principal,
    /// The experiment a non-admin's id or prefix resolved to.
    pub experiment: Option<ExperimentId>,
}

impl Authorized {
    /// `text` as the request is served on: the full id of the experiment
    /// authorization resolved it to, else `text` itself.
    pub fn pinned(&self, text: &str) -> String {
        self.experiment
            .map_or_else(|| text.to_owned(), |experiment| experiment.to_string())
    }
}

/// The longest id, prefix, queue or team name a request may give.
pub const MAX_NAME_BYTES: usize = 256;

/// The most bytes of a client's text an audit entry or a log line keeps.
pub const MAX_AUDIT_TEXT_BYTES: usize = 256;

/// `text` cut to at most `max` bytes, on a character boundary.
pub fn truncated(text: &str, max: usize) -> &str {
    if text.len() <= max {
        return text;
    }
    let mut end = max;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    &text[..end]
}

/// A request's action and target.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Access {
    /// What it does.
    pub action: Action,
    /// What it touches.
    pub scope: Scope,
}

impl Access {
    /// `action` on what `scope` names.
    pub fn new(action: Action, scope: Scope) -> Self {
        Self { action, scope }
    }

    /// In words, for the audit trail and logs: the client's text in it is cut
    /// to [`MAX_AUDIT_TEXT_BYTES`], so that no request makes a large entry.
    pub fn describe(&self) -> String {
        let cut = |text: &str| truncated(text, MAX_AUDIT_TEXT_BYTES).to_owned();
        let named = match &self.scope {
            Scope::Cluster => String::new(),
            Scope::Experiment(id) => format!(" {id}"),
            Scope::Trial(id) => format!(" {id}"),
            Scope::ExperimentNamed(text) | Scope::Named(text) => format!(" {}", cut(text)),
            Scope::Submit { team } => format!(" into team {}", cut(team)),
            Scope::Team(team) => format!(" of team {}", cut(team)),
            Scope::Pipeline(id) => format!(" pipeline {id}"),
            Scope::PreemptionRequest {
                request,
                verdict,
                why,
            } => format!(" request {request}: {verdict} ({})", cut(why)),
            Scope::Move { named, queue } => {
                format!(" {} to queue {}", cut(named), cut(queue))
            }
        };
        format!("{}{named}", self.action.describe())
    }

    /// Refuses a name longer than [`MAX_NAME_BYTES`] before it is resolved,
    /// authorized, logged or audited.
    pub fn check_lengths(&self) -> Result<(), NameTooLong> {
        let names: Vec<(&str, &str)> = match &self.scope {
            Scope::Cluster
            | Scope::Experiment(_)
            | Scope::Trial(_)
            | Scope::Pipeline(_)
            | Scope::PreemptionRequest { .. } => Vec::new(),
            Scope::ExperimentNamed(text) | Scope::Named(text) => vec![("id", text)],
            Scope::Submit { team } | Scope::Team(team) => vec![("team name", team)],
            Scope::Move { named, queue } => vec![("id", named), ("queue name", queue)],
        };
        match names
            .into_iter()
            .find(|(_, text)| text.len() > MAX_NAME_BYTES)
        {
            Some((what, text)) => Err(NameTooLong {
                what,
                len: text.len(),
            }),
            None => Ok(()),
        }
    }
}

/// Whether an allowed action is written to the audit trail: everything that
/// changes another's work or the cluster, not submissions (which the
/// experiment records keep) nor reads.
pub fn is_audited(action: Action) -> bool {
    matches!(
        action,
        Action::Cancel
            | Action::Hold
            | Action::Release
            | Action::Priority
            | Action::Move
            | Action::ApplyPolicy
            | Action::ArbitratePreemption
    )
}

/// A name a request gives that is too long to resolve, log or audit.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("the {what} is {len} bytes long; at most {MAX_NAME_BYTES} are accepted")]
pub struct NameTooLong {
    /// What the name is (`id`, `queue name`, `team name`).
    pub what: &'static str,
    /// Its length in bytes.
    pub len: usize,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn long_names_are_refused_and_client_text_is_cut_for_the_audit_trail() {
        let long = "é".repeat(MAX_NAME_BYTES);
        let cancel = Access::new(Action::Cancel, Scope::Named(long.clone()));
        let refused = cancel.check_lengths().unwrap_err().to_string();
        assert!(refused.contains("512 bytes long"), "{refused}");
        let described = cancel.describe();
        assert!(described.len() <= "cancel ".len() + MAX_AUDIT_TEXT_BYTES);
        assert!(described.ends_with(&"é".repeat(MAX_AUDIT_TEXT_BYTES / 2)));
        assert_eq!(truncated("aé", 2), "a", "cut on a character boundary");
        let fits = Access::new(Action::Cancel, Scope::Named("a".repeat(MAX_NAME_BYTES)));
        assert_eq!(fits.check_lengths(), Ok(()));
        let moved = Access::new(
            Action::Move,
            Scope::Move {
                named: "abc".to_owned(),
                queue: "q".repeat(MAX_NAME_BYTES + 1),
            },
        );
        assert_eq!(moved.check_lengths().unwrap_err().what, "queue name");
    }

    #[test]
    fn a_resolved_prefix_is_pinned_to_the_full_id() {
        let experiment = ExperimentId::from_content_hash(&[7; 32], 1);
        let principal = Principal::Node;
        let resolved = Authorized {
            principal: principal.clone(),
            experiment: Some(experiment),
        };
        assert_eq!(resolved.pinned("ab"), experiment.to_string());
        let unresolved = Authorized {
            principal,
            experiment: None,
        };
        assert_eq!(unresolved.pinned("ab"), "ab");
    }
}
