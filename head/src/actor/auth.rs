//! The actor's side of authorization and the user table: resolving a
//! request's caller and target against the current state and asking
//! `xp_head_core::auth::authorize`, writing the audit trail, and running user
//! commands (planned, stored, then applied).

use tracing::{info, warn};
use xp_runtime::clock::UnixMillis;
use xp_runtime::protocol::{AuditEntry, ErrorCode, RemoteError};

use super::HeadState;
use xp_head_core::Record;
use xp_head_core::auth::Principal;
use xp_head_core::auth::access::{Access, Authorized, Caller};
use xp_head_core::auth::users::{self, UserAnswer, UserCommand, UserError};
use xp_head_core::{AuditNote, Verdict};

/// A fresh user secret: 256 random bits in hex (the shape of the cluster
/// token), drawn here at the edge; the user table in the core only plans with it.
pub(crate) fn fresh_secret() -> Result<String, UserError> {
    xp_runtime::tls::random_secret()
        .map(hex::encode)
        .ok_or(UserError::NoEntropy)
}

impl HeadState {
    /// Resolves `caller` to who they are now and decides `access`
    /// (`HeadCore::authorize`); what the decision says to audit is written to
    /// the audit trail with the authenticated user, and a refusal counted.
    pub(super) fn authorize(
        &mut self,
        now: UnixMillis,
        caller: &Caller,
        access: &Access,
    ) -> Result<Authorized, RemoteError> {
        let verdict = match caller {
            Caller::Node => self.args.core.authorize(Principal::Node, access),
            Caller::User { name, secret_hash } => {
                match self.args.users.principal(name, secret_hash) {
                    Some(principal) => self.args.core.authorize(principal, access),
                    None => Verdict::unknown_user(name, access),
                }
            }
        };
        if let Some(role) = verdict.refused_as {
            self.args.metrics.refused(access.action.describe(), role);
        }
        if let Some(note) = verdict.audit {
            self.audit(now, note);
        }
        verdict.outcome.map_err(RemoteError::from)
    }

    /// The user holding the secret whose hash is `hash`, or why none does.
    pub(super) fn identify(&self, hash: &[u8; 32]) -> Result<String, RemoteError> {
        match self.args.users.identify(hash) {
            Ok(user) => Ok(user.name.clone()),
            Err(users::Unknown::Revoked) => Err(RemoteError::new(
                ErrorCode::BadToken,
                "this credential was revoked; ask an admin for a new one (`xp-head user add --replace`)",
            )),
            Err(users::Unknown::NoSuchSecret) => Err(RemoteError::new(
                ErrorCode::BadToken,
                "wrong token: the credential's token is not known to this cluster",
            )),
        }
    }

    /// Stores one audit entry. During an outage it cannot be stored: it is
    /// logged instead (the refusal itself is still answered).
    fn audit(&mut self, now: UnixMillis, note: AuditNote) {
        let entry = AuditEntry {
            seq: 0,
            at: now,
            who: note.who,
            action: note.action,
            allowed: note.allowed,
            detail: note.detail,
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
            .plan(now, &command, fresh_secret)
            .map_err(|error| RemoteError::new(ErrorCode::BadRequest, error.to_string()))?;
        if !plan.records.is_empty() {
            let mut records: Vec<Record> = plan.records.iter().cloned().map(Record::User).collect();
            records.push(Record::Audit(command.audit_entry(now)));
            let committed = tokio::task::block_in_place(|| self.args.registry.commit(records));
            if let Err(commit_error) = committed {
                return Err(self.commit_failed(now, commit_error));
            }
            self.args.users.apply(plan.records);
            self.args
                .users_changed
                .send_modify(|generation| *generation += 1);
            info!(command = %command.describe(), "user table changed");
            if let Some(name) = revoked_subject(&command) {
                // Their object capabilities stop working on every node now.
                self.args.core.revoke_user(now, name);
                if let Err(error) = self.flush(now) {
                    warn!(%error, "the revocation of a user's capabilities waits for the next commit");
                }
            }
        }
        Ok(users::answer(plan.answer, &self.args.join))
    }
}

/// The user whose object capabilities `command` revokes: one revoked, or
/// given a new role, or a new secret and team.
fn revoked_subject(command: &UserCommand) -> Option<&str> {
    match command {
        UserCommand::Revoke { name }
        | UserCommand::Role { name, .. }
        | UserCommand::Add {
            name,
            replace: true,
            ..
        } => Some(name),
        UserCommand::Add { .. } | UserCommand::List => None,
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn secrets_are_fresh() {
        let (one, two) = (
            super::fresh_secret().unwrap(),
            super::fresh_secret().unwrap(),
        );
        assert_ne!(one, two);
        assert_eq!(one.len(), 64);
    }
}
