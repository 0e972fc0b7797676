//! Every wire request as an [`Access`]: the action it takes and what it names,
//! before the actor resolves that name to the team owning it.
//!
//! Pure and total: a request variant added to the protocol does not compile
//! until it is mapped here, so no request goes unauthorized.

use serde::Deserialize;
use xp_runtime::ids::{ExperimentId, TrialId};
use xp_runtime::protocol::{AdminAction, Request};

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
/// resolved to among what they see (see [`pin_experiment`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Authorized {
    /// Who asks.
    pub principal: Principal,
    /// The experiment a non-admin's id or prefix resolved to.
    pub experiment: Option<ExperimentId>,
}

/// Names `experiment` by its full id in `request`, so that the core serves it
/// on the experiment authorization resolved (among what the asker sees), not
/// on whatever the prefix matches among every team's work.
pub fn pin_experiment(request: &mut Request, experiment: ExperimentId) {
    let named = match request {
        Request::Status {
            experiment: Some(text),
        }
        | Request::Checkpoints { experiment: text }
        | Request::Alerts {
            experiment: Some(text),
        }
        | Request::Cancel { id: text }
        | Request::Report(xp_runtime::protocol::ReportRequest {
            experiment: Some(text),
            ..
        }) => text,
        Request::Admin(admin) => match &mut admin.action {
            AdminAction::Priority { id, .. }
            | AdminAction::Hold { id }
            | AdminAction::Release { id }
            | AdminAction::Move { id, .. } => id,
            AdminAction::ApplyPolicy { .. }
            | AdminAction::Approve { .. }
            | AdminAction::Deny { .. } => return,
        },
        _ => return,
    };
    *named = experiment.to_string();
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
    fn new(action: Action, scope: Scope) -> Self {
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
    pub fn check_lengths(&self) -> Result<(), String> {
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
            Some((what, text)) => Err(format!(
                "the {what} is {} bytes long; at most {MAX_NAME_BYTES} are accepted",
                text.len()
            )),
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

/// The team a submission's spec names (its default when it names none or
/// cannot be read: the core refuses an unreadable spec anyway).
pub fn spec_team(spec_json: &str) -> String {
    #[derive(Deserialize)]
    struct TeamOnly {
        #[serde(default)]
        team: Option<String>,
    }
    // A spec over the limit is refused before authorization; never parse it.
    if spec_json.len() > xp_runtime::spec::MAX_SPEC_BYTES {
        return xp_runtime::spec::DEFAULT_TEAM.to_owned();
    }
    serde_json::from_str::<TeamOnly>(spec_json)
        .ok()
        .and_then(|spec| spec.team)
        .unwrap_or_else(|| xp_runtime::spec::DEFAULT_TEAM.to_owned())
}

/// The spec `spec_json` with its team set to `team` (for a submission that
/// named none, which goes into the submitter's team).
/// A spec over `MAX_SPEC_BYTES` is refused unparsed.
pub fn with_team(spec_json: &str, team: &str) -> Result<String, String> {
    if spec_json.len() > xp_runtime::spec::MAX_SPEC_BYTES {
        return Err(format!(
            "the spec is {} bytes; at most {} are accepted",
            spec_json.len(),
            xp_runtime::spec::MAX_SPEC_BYTES
        ));
    }
    let mut spec: serde_json::Value = serde_json::from_str(spec_json)
        .map_err(|error| format!("the spec is not JSON: {error}"))?;
    if let Some(object) = spec.as_object_mut() {
        object.insert("team".to_owned(), team.into());
    }
    serde_json::to_string(&spec).map_err(|error| format!("the spec cannot be written: {error}"))
}

/// What `request` does and names.
pub fn access_of(request: &Request) -> Access {
    match request {
        Request::Submit(submit) => Access::new(
            Action::Submit,
            Scope::Submit {
                team: spec_team(&submit.spec_json),
            },
        ),
        Request::Status { experiment: None } | Request::Alerts { experiment: None } => {
            Access::new(Action::ListExperiments, Scope::Cluster)
        }
        Request::Status {
            experiment: Some(text),
        }
        | Request::Checkpoints { experiment: text }
        | Request::Alerts {
            experiment: Some(text),
        } => Access::new(Action::ReadExperiment, Scope::ExperimentNamed(text.clone())),
        Request::Cancel { id } => Access::new(Action::Cancel, Scope::Named(id.clone())),
        Request::ReadLogs(log) => Access::new(Action::ReadExperiment, Scope::Trial(log.trial)),
        Request::Metrics { trial } | Request::Telemetry { trial } => {
            Access::new(Action::ReadExperiment, Scope::Trial(*trial))
        }
        Request::Events { experiment, .. } => {
            Access::new(Action::ReadExperiment, Scope::Experiment(*experiment))
        }
        Request::Nodes | Request::Queues | Request::Leases => {
            Access::new(Action::ReadCluster, Scope::Cluster)
        }
        Request::PutBlob { .. } | Request::StoreTargets | Request::ObjectKey => {
            Access::new(Action::StoreObjects, Scope::Cluster)
        }
        Request::GetBlob { .. } => Access::new(Action::FetchBlob, Scope::Cluster),
        Request::Locate { .. } => Access::new(Action::LocateObject, Scope::Cluster),
        Request::SharingDrivers { .. } => Access::new(Action::SharingDrivers, Scope::Cluster),
        Request::Audit { .. } => Access::new(Action::ReadAudit, Scope::Cluster),
        Request::SubmitPipeline(submit) => Access::new(
            Action::Submit,
            Scope::Submit {
                team: spec_team(&submit.spec_json),
            },
        ),
        Request::PipelineStatus { pipeline: None } => {
            Access::new(Action::ListExperiments, Scope::Cluster)
        }
        Request::PipelineStatus { pipeline: Some(id) } => {
            Access::new(Action::ReadExperiment, Scope::Pipeline(*id))
        }
        Request::CancelPipeline { pipeline } | Request::RetryPipeline { pipeline } => {
            Access::new(Action::Cancel, Scope::Pipeline(*pipeline))
        }
        Request::Report(report) => match (&report.experiment, &report.team) {
            (Some(text), _) => {
                Access::new(Action::ReadExperiment, Scope::ExperimentNamed(text.clone()))
            }
            (None, Some(team)) => Access::new(Action::ReadExperiment, Scope::Team(team.clone())),
            (None, None) => Access::new(Action::ReadClusterReport, Scope::Cluster),
        },
        Request::Admin(admin) => match &admin.action {
            AdminAction::ApplyPolicy { .. } => Access::new(Action::ApplyPolicy, Scope::Cluster),
            AdminAction::Priority { id, .. } => {
                Access::new(Action::Priority, Scope::Named(id.clone()))
            }
            AdminAction::Hold { id } => Access::new(Action::Hold, Scope::Named(id.clone())),
            AdminAction::Release { id } => Access::new(Action::Release, Scope::Named(id.clone())),
            AdminAction::Move { id, queue } => Access::new(
                Action::Move,
                Scope::Move {
                    named: id.clone(),
                    queue: queue.clone(),
                },
            ),
            AdminAction::Approve { request } | AdminAction::Deny { request } => Access::new(
                Action::ArbitratePreemption,
                Scope::PreemptionRequest {
                    request: *request,
                    verdict: if matches!(admin.action, AdminAction::Approve { .. }) {
                        "approve"
                    } else {
                        "deny"
                    },
                    why: admin.why.clone(),
                },
            ),
        },
    }
}

#[cfg(test)]
mod tests {
    use xp_runtime::protocol::SubmitRequest;

    use super::*;

    #[test]
    fn a_submission_names_its_specs_team_and_can_be_moved_to_another() {
        let spec = xp_runtime::spec::ExperimentSpec::from_yaml(
            "name: a\nteam: nlp\ntrial: {command: [echo]}\n",
        )
        .unwrap();
        let request = Request::Submit(SubmitRequest {
            spec_json: spec.to_canonical_json(),
            program: None,
            code_version: String::new(),
            data_version: String::new(),
            rerun: false,
        });
        assert_eq!(
            access_of(&request).scope,
            Scope::Submit {
                team: "nlp".to_owned()
            }
        );
        let moved = with_team(&spec.to_canonical_json(), "vision").unwrap();
        let again = xp_runtime::spec::ExperimentSpec::from_json(&moved).unwrap();
        assert_eq!(again.team, "vision");
        assert_eq!(again.name, "a");
        assert_eq!(spec_team("not json"), "default");
    }

    #[test]
    fn long_names_are_refused_and_client_text_is_cut_for_the_audit_trail() {
        let long = "é".repeat(MAX_NAME_BYTES);
        let cancel = access_of(&Request::Cancel { id: long.clone() });
        let refused = cancel.check_lengths().unwrap_err();
        assert!(refused.contains("512 bytes long"), "{refused}");
        let described = cancel.describe();
        assert!(described.len() <= "cancel ".len() + MAX_AUDIT_TEXT_BYTES);
        assert!(described.ends_with(&"é".repeat(MAX_AUDIT_TEXT_BYTES / 2)));
        assert_eq!(truncated("aé", 2), "a", "cut on a character boundary");
        let fits = access_of(&Request::Cancel {
            id: "a".repeat(MAX_NAME_BYTES),
        });
        assert_eq!(fits.check_lengths(), Ok(()));
        let moved = access_of(&Request::Admin(xp_runtime::protocol::AdminRequest {
            action: AdminAction::Move {
                id: "abc".to_owned(),
                queue: "q".repeat(MAX_NAME_BYTES + 1),
            },
            who: String::new(),
            why: String::new(),
        }));
        assert!(moved.check_lengths().unwrap_err().contains("queue name"));
    }

    #[test]
    fn a_resolved_prefix_is_pinned_to_the_full_id() {
        let experiment = ExperimentId::from_content_hash(&[7; 32], 1);
        let mut cancel = Request::Cancel {
            id: "ab".to_owned(),
        };
        pin_experiment(&mut cancel, experiment);
        assert!(
            matches!(&cancel, Request::Cancel { id } if *id == experiment.to_string()),
            "{cancel:?}"
        );
        let mut hold = Request::Admin(xp_runtime::protocol::AdminRequest {
            action: AdminAction::Hold {
                id: "ab".to_owned(),
            },
            who: String::new(),
            why: String::new(),
        });
        pin_experiment(&mut hold, experiment);
        assert!(
            matches!(&hold, Request::Admin(admin)
                if matches!(&admin.action, AdminAction::Hold { id } if *id == experiment.to_string())),
            "{hold:?}"
        );
    }

    #[test]
    fn node_work_and_admin_actions_map_to_their_actions() {
        let hash = xp_runtime::ids::BlobHash::of(b"x");
        assert_eq!(
            access_of(&Request::GetBlob { hash }).action,
            Action::FetchBlob
        );
        let admin = Request::Admin(xp_runtime::protocol::AdminRequest {
            action: AdminAction::Move {
                id: "abc".to_owned(),
                queue: "q".to_owned(),
            },
            who: "whoever the client says".to_owned(),
            why: String::new(),
        });
        let access = access_of(&admin);
        assert_eq!(access.action, Action::Move);
        assert_eq!(access.describe(), "move abc to queue q");
    }
}
