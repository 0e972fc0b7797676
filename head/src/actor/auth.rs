//! The actor's side of authorization and the user table: resolving a
//! request's caller and target against the current state and asking
//! `crate::auth::authorize`, writing the audit trail, and running user
//! commands (planned, stored, then applied).

use tracing::{info, warn};
use xp_runtime::clock::UnixMillis;
use xp_runtime::protocol::{AuditEntry, ErrorCode, RemoteError};

use super::HeadState;
use xp_head_core::auth::requests::{
    Access, Authorized, Caller, MAX_AUDIT_TEXT_BYTES, is_audited, truncated,
};
use xp_head_core::auth::users::{self, UserAnswer, UserCommand};
use xp_head_core::auth::{self, Principal, Target};
use xp_head_core::Record;

impl HeadState {
    /// Resolves `caller` to who they are now and decides `access`; a refusal
    /// (and an allowed action that changes others' work or the cluster) is
    /// written to the audit trail with the authenticated user.
    pub(super) fn authorize(
        &mut self,
        now: UnixMillis,
        caller: &Caller,
        access: &Access,
    ) -> Result<Authorized, RemoteError> {
        let principal = match caller {
            Caller::Node => Principal::Node,
            Caller::User { name, secret_hash } => {
                match self.args.users.principal(name, secret_hash) {
                    Some(principal) => principal,
                    None => {
                        // The name came from the client: cut what is kept of it.
                        let name = truncated(name, MAX_AUDIT_TEXT_BYTES);
                        let message = format!(
                            "the credential of user {name} was revoked or replaced; ask an admin for a new one"
                        );
                        self.args
                            .metrics
                            .refused(access.action.describe(), "unknown");
                        self.audit(now, name, access.describe(), false, message.clone());
                        return Err(RemoteError::new(ErrorCode::Forbidden, message));
                    }
                }
            }
        };
        // A name a non-admin gives must resolve among what they see: one that
        // does not is not found (not judged as their own team's work, which let
        // them act on another team's trial before it existed).
        let resolved = self
            .args
            .core
            .resolve_scope(&principal, &access.scope)
            .map_err(RemoteError::from)?;
        let experiment = resolved.experiment;
        let (team, queue_owner) = (resolved.team, resolved.queue_owner);
        let target = match (&team, &queue_owner) {
            (None, _) => Target::Cluster,
            (Some(team), None) => Target::Team(team),
            (Some(team), Some(owner)) => Target::Queue {
                team,
                queue_owner: owner.as_deref(),
            },
        };
        match auth::authorize(&principal, access.action, target) {
            Ok(()) => {
                if is_audited(access.action) {
                    let detail = match &team {
                        Some(team) => format!("allowed on work of team {team}"),
                        None => "allowed".to_owned(),
                    };
                    self.audit(now, principal.name(), access.describe(), true, detail);
                }
                Ok(Authorized {
                    principal,
                    experiment,
                })
            }
            Err(refusal) => {
                let message = refusal.to_string();
                info!(who = principal.name(), action = %access.describe(), %message, "request refused");
                let role = match &principal {
                    Principal::Node => "node",
                    Principal::User { role, .. } => role.as_str(),
                };
                self.args.metrics.refused(access.action.describe(), role);
                self.audit(
                    now,
                    principal.name(),
                    access.describe(),
                    false,
                    message.clone(),
                );
                Err(RemoteError::new(ErrorCode::Forbidden, message))
            }
        }
    }

    /// Stores one audit entry. During an outage it cannot be stored: it is
    /// logged instead (the refusal itself is still answered).
    fn audit(&mut self, now: UnixMillis, who: &str, action: String, allowed: bool, detail: String) {
        let entry = AuditEntry {
            seq: 0,
            at: now,
            who: who.to_owned(),
            action,
            allowed,
            detail,
        };
        if self.outage.is_some() {
            warn!(
                ?entry,
                "audit entry not stored: the head cannot store anything now"
            );
            return;
        }
        let committed =
            tokio::task::block_in_place(|| self.args.registry.commit(vec![Record::Audit(entry)]));
        if let Err(commit_error) = committed {
            let _ = self.commit_failed(now, commit_error);
        }
    }

    /// Runs a command on the user table: planned, stored (with its audit
    /// entry), then applied; open connections re-check their users after a change.
    pub(super) fn user_command(
        &mut self,
        now: UnixMillis,
        command: UserCommand,
    ) -> Result<UserAnswer, RemoteError> {
        if command.changes()
            && let Some(refusal) = self.refusal(now)
        {
            return Err(refusal);
        }
        let plan = self
            .args
            .users
            .plan(now, &command, crate::auth::local::fresh_secret)
            .map_err(|error| RemoteError::new(ErrorCode::BadRequest, error.to_string()))?;
        if !plan.records.is_empty() {
            let mut records: Vec<Record> = plan.records.iter().cloned().map(Record::User).collect();
            records.push(Record::Audit(crate::auth::local::audit_entry(now, &command)));
            let committed = tokio::task::block_in_place(|| self.args.registry.commit(records));
            if let Err(commit_error) = committed {
                return Err(self.commit_failed(now, commit_error));
            }
            self.args.users.apply(plan.records);
            self.args
                .users_changed
                .send_modify(|generation| *generation += 1);
            info!(command = %command.describe(), "user table changed");
        }
        Ok(users::answer(plan.answer, &self.args.join))
    }
}
