//! What authorization needs to know about a request's target (which team owns
//! an experiment or trial, which team a queue belongs to), and the decision
//! itself over the core's state: [`HeadCore::authorize`] resolves what an
//! [`Access`] names and asks [`crate::auth::authorize`].

use xp_runtime::ids::{ExperimentId, TrialId};

use tracing::info;

use crate::auth::access::{Access, Authorized, MAX_AUDIT_TEXT_BYTES, Scope, is_audited, truncated};
use crate::auth::{Principal, Role, Target, Visibility};
use crate::{CoreError, HeadCore};

impl HeadCore {
    /// The team owning experiment `id`.
    pub fn team_of_experiment(&self, id: ExperimentId) -> Result<String, CoreError> {
        self.book
            .get_spec(id)
            .map(|spec| spec.team.clone())
            .ok_or(CoreError::ExperimentNotFound { experiment_id: id })
    }

    /// The team owning the experiment named by `text` (an id or unique prefix).
    pub fn team_of_experiment_named(&self, text: &str) -> Result<String, CoreError> {
        self.team_of_experiment(self.resolve_experiment(text)?)
    }

    /// The team owning trial `id`.
    pub fn team_of_trial(&self, id: TrialId) -> Result<String, CoreError> {
        if !self.book.contains_trial(id) {
            return Err(CoreError::TrialNotFound { trial_id: id });
        }
        self.team_of_experiment(id.experiment)
    }

    /// The team owning what `text` names: a trial id, else an experiment id or
    /// prefix (as cancel and admin actions read their `id`).
    pub fn team_of_named(&self, text: &str) -> Result<String, CoreError> {
        match text.parse::<TrialId>() {
            Ok(trial) => self.team_of_trial(trial),
            Err(_) => self.team_of_experiment_named(text),
        }
    }

    /// The team queue `name` belongs to: `Some(None)` for a queue open to every
    /// team, `None` when the policy has no such queue.
    pub fn queue_owner(&self, name: &str) -> Option<Option<String>> {
        self.placement
            .policy()
            .config()
            .queue(name)
            .map(|queue| queue.team.clone())
    }
}

/// What the audit trail keeps of one authorization.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AuditNote {
    /// Who asked (the authenticated user, never the client's text).
    pub who: String,
    /// What they asked, in words (`Access::describe`).
    pub action: String,
    /// Whether it was allowed.
    pub allowed: bool,
    /// On whose work, or why it was refused.
    pub detail: String,
}

/// One request's authorization: whether it goes ahead, what the audit trail
/// keeps of it (a refusal, and an allowed action that changes others' work or
/// the cluster), and for a refusal the asker's role, as `/metrics` counts it.
#[derive(Debug)]
pub struct Verdict {
    /// Who asks and what their names resolved to, or why not.
    pub outcome: Result<Authorized, CoreError>,
    /// What the audit trail keeps, if anything.
    pub audit: Option<AuditNote>,
    /// The refused asker's role (`node`, `viewer`, ..., `unknown`).
    pub refused_as: Option<&'static str>,
}

impl Verdict {
    /// A user credential that no longer names its user (revoked or replaced):
    /// refused and audited under the name the connection was made with.
    pub fn unknown_user(name: &str, access: &Access) -> Self {
        // The name came from the client: cut what is kept of it.
        let name = truncated(name, MAX_AUDIT_TEXT_BYTES).to_owned();
        let error = CoreError::UnknownUser { name: name.clone() };
        Self {
            audit: Some(AuditNote {
                who: name,
                action: access.describe(),
                allowed: false,
                detail: error.to_string(),
            }),
            outcome: Err(error),
            refused_as: Some("unknown"),
        }
    }
}

/// A request's target as authorization sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Resolved {
    /// The team owning the work; `None` for the cluster.
    pub team: Option<String>,
    /// For a move, the destination queue's team (`None`: open to every team).
    pub queue_owner: Option<Option<String>>,
    /// The experiment a name resolved to, so that the request is served on
    /// exactly that one (its prefix could match others' work in the core).
    pub experiment: Option<ExperimentId>,
}

impl HeadCore {
    /// Resolves what `scope` names for `principal`. For a user who is not an
    /// admin, a name must resolve among what they see: an experiment prefix
    /// matches only experiments of teams they see, and an exact id of another
    /// team's experiment, trial or pipeline is not found with the very error
    /// an unknown id gets (neither its team nor that it exists is told, and
    /// the audit trail and the refusal count are left alone, as for an
    /// unknown id); nothing unresolved is ever judged as their own team's
    /// work. Admins and nodes keep the lenient reading: an unresolved name is
    /// judged as `principal`'s own team's work, and the request then fails as
    /// not found by itself.
    pub fn resolve_scope(
        &self,
        principal: &Principal,
        scope: &Scope,
    ) -> Result<Resolved, CoreError> {
        let names = Names::new(self, principal);
        let (team, queue_owner, experiment) = match scope {
            Scope::Cluster | Scope::PreemptionRequest { .. } => (None, None, None),
            Scope::Experiment(id) => {
                let unknown = CoreError::ExperimentNotFound { experiment_id: *id };
                let team = names.team(self.team_of_experiment(*id), unknown)?;
                (Some(team), None, None)
            }
            Scope::ExperimentNamed(text) => {
                let (team, experiment) = names.experiment(text)?;
                (Some(team), None, experiment)
            }
            Scope::Trial(id) => (Some(names.trial(*id)?), None, None),
            Scope::Named(text) => {
                let (team, experiment) = names.named(text)?;
                (Some(team), None, experiment)
            }
            Scope::Team(team) => (Some(team.clone()), None, None),
            Scope::Pipeline(id) => {
                let unknown = CoreError::PipelineNotFound { pipeline: *id };
                let team = names.team(self.pipelines.team_of(*id), unknown)?;
                (Some(team), None, None)
            }
            Scope::Submit { team } => (
                Some(crate::auth::submit_team(principal, team).to_owned()),
                None,
                None,
            ),
            Scope::Move { named: text, queue } => {
                let (team, experiment) = names.named(text)?;
                let owner = match self.queue_owner(queue) {
                    Some(owner) => owner,
                    None if names.strict => {
                        return Err(CoreError::QueueNotFound {
                            queue: queue.clone(),
                        });
                    }
                    // Judged as a queue open to every team; the move then
                    // fails on the missing queue.
                    None => None,
                };
                (Some(team), Some(owner), experiment)
            }
        };
        Ok(Resolved {
            team,
            queue_owner,
            experiment,
        })
    }

    /// Whether `principal` may do what `access` says. A name a non-admin gives
    /// must resolve among what they see: one that does not is not found (not
    /// judged as their own team's work, which let them act on another team's
    /// trial before it existed).
    pub fn authorize(&self, principal: Principal, access: &Access) -> Verdict {
        let resolved = match self.resolve_scope(&principal, &access.scope) {
            Ok(resolved) => resolved,
            Err(error) => {
                return Verdict {
                    outcome: Err(error),
                    audit: None,
                    refused_as: None,
                };
            }
        };
        let target = match (&resolved.team, &resolved.queue_owner) {
            (None, _) => Target::Cluster,
            (Some(team), None) => Target::Team(team),
            (Some(team), Some(owner)) => Target::Queue {
                team,
                queue_owner: owner.as_deref(),
            },
        };
        let note = |allowed: bool, detail: String| AuditNote {
            who: principal.name().to_owned(),
            action: access.describe(),
            allowed,
            detail,
        };
        match crate::auth::authorize(&principal, access.action, target) {
            Ok(()) => Verdict {
                audit: is_audited(access.action).then(|| {
                    note(
                        true,
                        resolved.team.as_ref().map_or_else(
                            || "allowed".to_owned(),
                            |team| format!("allowed on work of team {team}"),
                        ),
                    )
                }),
                outcome: Ok(Authorized {
                    principal,
                    experiment: resolved.experiment,
                }),
                refused_as: None,
            },
            Err(refusal) => {
                info!(who = principal.name(), action = %access.describe(), message = %refusal, "request refused");
                Verdict {
                    audit: Some(note(false, refusal.to_string())),
                    refused_as: Some(match &principal {
                        Principal::Node => "node",
                        Principal::User { role, .. } => role.as_str(),
                    }),
                    outcome: Err(refusal.into()),
                }
            }
        }
    }

    /// The experiment `text` names among those `visible` shows, by full id or
    /// prefix: another team's experiment is not there, so that neither "not
    /// found" nor "ambiguous" tells of another team's work, and its exact id
    /// answers as an unknown one does.
    pub(crate) fn visible_experiment_named(
        &self,
        text: &str,
        visible: &Visibility,
    ) -> Result<ExperimentId, CoreError> {
        if let Ok(id) = text.parse::<ExperimentId>()
            && self
                .book
                .get_spec(id)
                .is_some_and(|spec| visible.shows(&spec.team))
        {
            return Ok(id);
        }
        let matches: Vec<ExperimentId> = self
            .book
            .specs()
            .filter(|(id, spec)| visible.shows(&spec.team) && id.to_string().starts_with(text))
            .map(|(id, _)| *id)
            .collect();
        match matches.as_slice() {
            [id] if !text.is_empty() => Ok(*id),
            [] | [_] => Err(CoreError::NoExperimentMatches {
                prefix: text.to_owned(),
            }),
            _ => Err(CoreError::AmbiguousExperiment {
                prefix: text.to_owned(),
                matches: matches.len(),
            }),
        }
    }
}

/// How the names in one asker's request resolve (`HeadCore::resolve_scope`).
struct Names<'a> {
    core: &'a HeadCore,
    /// A user who is not an admin: names resolve only among what they see.
    strict: bool,
    visible: Visibility,
    /// Whose work an unresolved name is judged as, for a lenient asker.
    own_team: String,
}

impl<'a> Names<'a> {
    fn new(core: &'a HeadCore, principal: &Principal) -> Self {
        Self {
            core,
            strict: matches!(principal, Principal::User { role, .. } if *role != Role::Admin),
            visible: principal.visible_team(),
            own_team: match principal {
                Principal::User { team, .. } => team.clone(),
                Principal::Node => String::new(),
            },
        }
    }

    /// The team `found` names: for a strict asker another team's work is
    /// `unknown`, the error an id nobody holds gets; for a lenient one an
    /// unresolved name is their own team's.
    fn team(
        &self,
        found: Result<String, CoreError>,
        unknown: CoreError,
    ) -> Result<String, CoreError> {
        if self.strict {
            found.and_then(|team| self.visible.shows(&team).then_some(team).ok_or(unknown))
        } else {
            Ok(found.unwrap_or_else(|_| self.own_team.clone()))
        }
    }

    /// The team of trial `trial_id`.
    fn trial(&self, trial_id: TrialId) -> Result<String, CoreError> {
        self.team(
            self.core.team_of_trial(trial_id),
            CoreError::TrialNotFound { trial_id },
        )
    }

    /// The team of the experiment `text` names, and for a strict asker the
    /// experiment itself.
    fn experiment(&self, text: &str) -> Result<(String, Option<ExperimentId>), CoreError> {
        if self.strict {
            let id = self.core.visible_experiment_named(text, &self.visible)?;
            Ok((self.core.team_of_experiment(id)?, Some(id)))
        } else {
            let found = self.core.team_of_experiment_named(text);
            Ok((found.unwrap_or_else(|_| self.own_team.clone()), None))
        }
    }

    /// The team of what `text` names: a trial id, else an experiment.
    fn named(&self, text: &str) -> Result<(String, Option<ExperimentId>), CoreError> {
        match text.parse::<TrialId>() {
            Ok(trial) => Ok((self.trial(trial)?, None)),
            Err(_) => self.experiment(text),
        }
    }
}
