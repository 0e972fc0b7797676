//! `xp submit` and `xp run` (`Request::Submit`): an experiment into a team.
//!
//! Access: a member submits into their own team. A spec naming no team goes
//! into the submitter's (an admin's into `default`), and is rewritten to name
//! it before the core reads it, so that the stored spec says where it went.
//! A spec over `MAX_SPEC_BYTES` is refused before anything parses it.

use serde::Deserialize;
use xp_runtime::clock::UnixMillis;
use xp_runtime::ids::ExperimentId;
use xp_runtime::protocol::{Response, SubmitRequest};
use xp_runtime::spec::{DEFAULT_TEAM, MAX_SPEC_BYTES};

use crate::auth::access::{Access, Authorized, Scope};
use crate::auth::{Action, submit_team};
use crate::{CoreError, HeadCore};

/// What a submission does: submit into the team its spec names.
pub(super) fn access(submit: &SubmitRequest) -> Access {
    Access::new(
        Action::Submit,
        Scope::Submit {
            team: spec_team(&submit.spec_json),
        },
    )
}

impl HeadCore {
    /// Submits into the team authorization chose; the connection's driver
    /// session (if it stores objects) shares them with the experiment's trials.
    pub(super) fn apply_submit(
        &mut self,
        now: UnixMillis,
        asker: &Authorized,
        session: Option<&str>,
        mut submit: SubmitRequest,
    ) -> Result<Response, CoreError> {
        submit.spec_json = into_asker_team(asker, submit.spec_json)?;
        let (experiment, reused, trials) = self.handle_submit(now, &submit)?;
        if let Some(session) = session {
            self.record_driver_experiment(session, experiment);
        }
        Ok(Response::Submitted {
            experiment,
            reused,
            trials,
        })
    }

    /// Creates an experiment and its trials, or returns an identical one;
    /// then a scheduling pass.
    pub fn handle_submit(
        &mut self,
        now: UnixMillis,
        request: &SubmitRequest,
    ) -> Result<(ExperimentId, bool, u32), CoreError> {
        let submitted = self.submit_experiment(now, request)?;
        self.schedule(now);
        Ok(submitted)
    }
}

/// `spec_json` naming the team it goes into (`submit_team`): unchanged when
/// it names that team already.
pub(super) fn into_asker_team(asker: &Authorized, spec_json: String) -> Result<String, CoreError> {
    let named = spec_team(&spec_json);
    let team = submit_team(&asker.principal, &named);
    if team == named {
        return Ok(spec_json);
    }
    with_team(&spec_json, team)
}

/// Refuses a spec larger than the head reads.
pub(super) fn check_size(spec_json: &str) -> Result<(), CoreError> {
    if spec_json.len() > MAX_SPEC_BYTES {
        return Err(CoreError::SpecTooLarge {
            len: spec_json.len(),
        });
    }
    Ok(())
}

/// The team a submission's spec names (its default when it names none or
/// cannot be read: the core refuses an unreadable spec anyway).
pub(super) fn spec_team(spec_json: &str) -> String {
    #[derive(Deserialize)]
    struct TeamOnly {
        #[serde(default)]
        team: Option<String>,
    }
    // A spec over the limit is refused before authorization; never parse it.
    if spec_json.len() > MAX_SPEC_BYTES {
        return DEFAULT_TEAM.to_owned();
    }
    serde_json::from_str::<TeamOnly>(spec_json)
        .ok()
        .and_then(|spec| spec.team)
        .unwrap_or_else(|| DEFAULT_TEAM.to_owned())
}

/// The spec `spec_json` with its team set to `team` (for a submission that
/// named none, which goes into the submitter's team).
/// A spec over `MAX_SPEC_BYTES` is refused unparsed.
pub(super) fn with_team(spec_json: &str, team: &str) -> Result<String, CoreError> {
    check_size(spec_json)?;
    let mut spec: serde_json::Value =
        serde_json::from_str(spec_json).map_err(|source| CoreError::SpecNotJson { source })?;
    if let Some(object) = spec.as_object_mut() {
        object.insert("team".to_owned(), team.into());
    }
    Ok(serde_json::to_string(&spec).expect("a JSON value serialises"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_submission_names_its_specs_team_and_can_be_moved_to_another() {
        let spec = xp_runtime::spec::ExperimentSpec::from_yaml(
            "name: a\nteam: nlp\ntrial: {command: [echo]}\n",
        )
        .unwrap();
        let request = SubmitRequest {
            spec_json: spec.to_canonical_json(),
            program: None,
            code_version: String::new(),
            data_version: String::new(),
            rerun: false,
        };
        assert_eq!(
            access(&request).scope,
            Scope::Submit {
                team: "nlp".to_owned()
            }
        );
        let moved = with_team(&spec.to_canonical_json(), "vision").unwrap();
        let again = xp_runtime::spec::ExperimentSpec::from_json(&moved).unwrap();
        assert_eq!(again.team, "vision");
        assert_eq!(again.name, "a");
        assert_eq!(spec_team("not json"), "default");
        let refused = with_team("not json", "vision").unwrap_err().to_string();
        assert!(refused.starts_with("the spec is not JSON: "), "{refused}");
    }

    #[test]
    fn a_spec_over_the_limit_is_refused_unread() {
        let request = SubmitRequest {
            spec_json: " ".repeat(MAX_SPEC_BYTES + 1),
            program: None,
            code_version: String::new(),
            data_version: String::new(),
            rerun: false,
        };
        let refused = check_size(&request.spec_json).unwrap_err().to_string();
        assert_eq!(
            refused,
            format!(
                "the spec is {} bytes; at most {MAX_SPEC_BYTES} are accepted",
                MAX_SPEC_BYTES + 1
            )
        );
    }
}
