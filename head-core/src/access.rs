//! What authorization needs to know about a request's target: which team owns
//! an experiment or trial, and which team a queue belongs to.
//!
//! Read-only lookups for the actor, which resolves a request's target here and
//! then asks `crate::auth::authorize`; nothing here decides who may do what.

use xp_runtime::ids::{ExperimentId, TrialId};

use super::{CoreError, HeadCore};
use crate::auth::requests::Scope;
use crate::auth::{Principal, Role, Visibility};

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
    /// admin, a name must resolve: an experiment prefix matches only
    /// experiments of teams they see (a full id matches any, so the refusal
    /// can name the role), and anything unresolved is not found, never judged
    /// as their own team's work. Admins and nodes keep the lenient reading:
    /// an unresolved name is judged as `principal`'s own team's work, and the
    /// request then fails as not found by itself.
    pub fn resolve_scope(
        &self,
        principal: &Principal,
        scope: &Scope,
    ) -> Result<Resolved, CoreError> {
        let strict = matches!(principal, Principal::User { role, .. } if *role != Role::Admin);
        let visible = principal.visible_team();
        let own_team = match principal {
            Principal::User { team, .. } => team.clone(),
            Principal::Node => String::new(),
        };
        let lenient = |found: Result<String, CoreError>| found.unwrap_or_else(|_| own_team.clone());
        let named_experiment = |text: &str| -> Result<(String, Option<ExperimentId>), CoreError> {
            if strict {
                let id = self.visible_experiment_named(text, &visible)?;
                Ok((self.team_of_experiment(id)?, Some(id)))
            } else {
                Ok((lenient(self.team_of_experiment_named(text)), None))
            }
        };
        let named = |text: &str| match text.parse::<TrialId>() {
            Ok(trial) if strict => Ok((self.team_of_trial(trial)?, None)),
            Ok(trial) => Ok((lenient(self.team_of_trial(trial)), None)),
            Err(_) => named_experiment(text),
        };
        let team = |found: Result<String, CoreError>| {
            if strict { found } else { Ok(lenient(found)) }
        };
        let (team, queue_owner, experiment) = match scope {
            Scope::Cluster | Scope::PreemptionRequest { .. } => (None, None, None),
            Scope::Experiment(id) => (Some(team(self.team_of_experiment(*id))?), None, None),
            Scope::ExperimentNamed(text) => {
                let (team, experiment) = named_experiment(text)?;
                (Some(team), None, experiment)
            }
            Scope::Trial(id) => (Some(team(self.team_of_trial(*id))?), None, None),
            Scope::Named(text) => {
                let (team, experiment) = named(text)?;
                (Some(team), None, experiment)
            }
            Scope::Team(team) => (Some(team.clone()), None, None),
            Scope::Pipeline(id) => (Some(team(self.pipelines.team_of(*id))?), None, None),
            Scope::Submit { team } => (
                Some(crate::auth::submit_team(principal, team).to_owned()),
                None,
                None,
            ),
            Scope::Move { named: text, queue } => {
                let (team, experiment) = named(text)?;
                let owner = match self.queue_owner(queue) {
                    Some(owner) => owner,
                    None if strict => {
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

    /// The experiment `text` names among those `visible` shows: a full id
    /// names its experiment whoever owns it; a prefix matches only visible
    /// experiments, so that neither "not found" nor "ambiguous" tells of
    /// another team's work.
    pub(super) fn visible_experiment_named(
        &self,
        text: &str,
        visible: &Visibility,
    ) -> Result<ExperimentId, CoreError> {
        if let Ok(id) = text.parse::<ExperimentId>()
            && self.book.contains_experiment(id)
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
