//! What the head revoked of the object capabilities it issued, kept until each
//! revoked capability has expired anyway, so that a node that registers gets
//! every revocation still in force.
//!
//! Soft state, rebuilt at a restart from what is durable: the start itself
//! revokes every session capability issued before it (the connections ended
//! with the old head), and every attempt that ended within
//! `ATTEMPT_CAPABILITY_MS` is revoked again from the book. What a running head
//! revokes of users is soft: a user revoked before a restart has no
//! connection to it, and their session capabilities died with the start.
//!
//! Invariant: an entry is kept until its `until_ms` has passed (plus the
//! allowed clock skew), and never longer.

use std::collections::BTreeSet;

use xp_runtime::clock::UnixMillis;
use xp_runtime::ids::TrialId;
use xp_runtime::protocol::{
    ATTEMPT_CAPABILITY_MS, CLOCK_SKEW_MS, Holder, Revocation, RevocationEntry, RevocationList,
    SESSION_CAPABILITY_MS,
};

/// The revocations in force.
#[derive(Debug, Default, Clone)]
pub(crate) struct ObjectGrants {
    /// Sessions, users, and the start's void of older sessions.
    revoked: RevocationList,
    /// Ended attempts, by when their capability expires anyway (launch plus
    /// `ATTEMPT_CAPABILITY_MS`: an attempt revoked again is the same entry).
    /// Apart from the list, whose holder map a node needs to look holders
    /// up: a head restarted after a busy day holds a million of these, 32
    /// bytes each here against about 90 in the list's two maps.
    attempts: BTreeSet<(UnixMillis, TrialId, u32)>,
    /// Revocations not yet told to the nodes.
    unsent: Vec<RevocationEntry>,
}

impl ObjectGrants {
    /// A head started at `now`: session capabilities from before are void, and
    /// so are those of the attempts in `ended` (trial, attempt, launched at).
    pub(crate) fn started(
        now: UnixMillis,
        ended: impl IntoIterator<Item = (TrialId, u32, UnixMillis)>,
    ) -> Self {
        let mut revoked = RevocationList::default();
        revoked.add(RevocationEntry {
            revocation: Revocation::SessionsBefore { before_ms: now },
            until_ms: now + SESSION_CAPABILITY_MS,
        });
        Self {
            revoked,
            // Collected at once, so packed.
            attempts: ended
                .into_iter()
                .map(|(trial, attempt, launched_at)| (attempt_until(launched_at), trial, attempt))
                .filter(|(until, _, _)| *until >= now)
                .collect(),
            // No node is connected yet: each gets these when it registers.
            unsent: Vec::new(),
        }
    }

    /// Revokes `revocation` at `now` until `until_ms`; the nodes are told
    /// with the next [`Self::take_unsent`].
    pub(crate) fn revoke(&mut self, now: UnixMillis, revocation: Revocation, until_ms: UnixMillis) {
        self.prune(now);
        let entry = RevocationEntry {
            revocation,
            until_ms,
        };
        self.revoked.add(entry.clone());
        self.unsent.push(entry);
    }

    /// Revokes the capability of `attempt` of `trial`, launched at
    /// `launched_at`, as [`Self::revoke`] does.
    pub(crate) fn revoke_attempt(
        &mut self,
        now: UnixMillis,
        trial: TrialId,
        attempt: u32,
        launched_at: UnixMillis,
    ) {
        self.prune(now);
        let until = attempt_until(launched_at);
        self.attempts.insert((until, trial, attempt));
        self.unsent.push(attempt_entry(until, trial, attempt));
    }

    /// The revocations made since the last call, to tell every node.
    pub(crate) fn take_unsent(&mut self) -> Vec<RevocationEntry> {
        std::mem::take(&mut self.unsent)
    }

    /// Every revocation still in force at `now`.
    pub(crate) fn in_force(&mut self, now: UnixMillis) -> Vec<RevocationEntry> {
        self.prune(now);
        let mut entries: Vec<RevocationEntry> = self
            .attempts
            .iter()
            .map(|&(until, trial, attempt)| attempt_entry(until, trial, attempt))
            .collect();
        entries.extend(self.revoked.entries());
        entries
    }

    /// Forgets what no unexpired capability can need any more at `now`, as
    /// the list does.
    fn prune(&mut self, now: UnixMillis) {
        self.revoked.prune(now);
        while let Some(&(until, _, _)) = self.attempts.first()
            && until.saturating_add(CLOCK_SKEW_MS) < now
        {
            self.attempts.pop_first();
        }
    }
}

/// When the capability of an attempt launched at `launched_at` expires.
fn attempt_until(launched_at: UnixMillis) -> UnixMillis {
    launched_at.saturating_add(ATTEMPT_CAPABILITY_MS)
}

fn attempt_entry(until_ms: UnixMillis, trial: TrialId, attempt: u32) -> RevocationEntry {
    RevocationEntry {
        revocation: Revocation::Holder(Holder::Attempt { trial, attempt }),
        until_ms,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const NOW: u64 = 1_800_000_000_000;

    #[test]
    fn a_start_voids_older_sessions_and_attempts_that_ended_recently_until_they_expire() {
        let trial: TrialId = "00000000000000aa-t0".parse().expect("trial");
        let recent = NOW - 1000;
        let long_ago = NOW - ATTEMPT_CAPABILITY_MS - 1;
        let mut grants = ObjectGrants::started(NOW, [(trial, 1, long_ago), (trial, 2, recent)]);
        assert_eq!(
            grants.in_force(NOW),
            [
                RevocationEntry {
                    revocation: Revocation::Holder(Holder::Attempt { trial, attempt: 2 }),
                    until_ms: recent + ATTEMPT_CAPABILITY_MS,
                },
                RevocationEntry {
                    revocation: Revocation::SessionsBefore { before_ms: NOW },
                    until_ms: NOW + SESSION_CAPABILITY_MS,
                },
            ]
        );
        let later = NOW + SESSION_CAPABILITY_MS + CLOCK_SKEW_MS + 1;
        assert_eq!(
            grants.in_force(later).len(),
            1,
            "the attempt's lasts longer"
        );
        assert!(
            grants.take_unsent().is_empty(),
            "a registering node gets what the start revoked"
        );
        grants.revoke(
            later,
            Revocation::Holder(Holder::Session("s".to_owned())),
            later + 5,
        );
        assert_eq!(grants.in_force(later).len(), 2);
        assert_eq!(grants.in_force(later + 5 + CLOCK_SKEW_MS + 1).len(), 1);
        let unsent = grants.take_unsent();
        assert_eq!(unsent.len(), 1);
        assert_eq!(unsent[0].until_ms, later + 5);
        assert!(grants.take_unsent().is_empty(), "told once");
    }

    #[test]
    fn an_ended_attempt_is_revoked_once_and_kept_until_its_capability_expires() {
        let trial: TrialId = "00000000000000aa-t0".parse().expect("trial");
        let mut grants = ObjectGrants::started(NOW, []);
        grants.revoke_attempt(NOW, trial, 1, NOW - 10);
        grants.revoke_attempt(NOW + 1, trial, 1, NOW - 10);
        let attempt = |entry: &RevocationEntry| matches!(entry.revocation, Revocation::Holder(_));
        let until = NOW - 10 + ATTEMPT_CAPABILITY_MS;
        let in_force = grants.in_force(NOW + 2);
        assert_eq!(in_force.iter().filter(|entry| attempt(entry)).count(), 1);
        assert!(in_force.iter().any(|entry| entry.until_ms == until));
        assert_eq!(grants.take_unsent().len(), 2, "each revocation is told");
        let kept = grants.in_force(until + CLOCK_SKEW_MS);
        assert!(kept.iter().any(attempt), "kept through the clock skew");
        let gone = grants.in_force(until + CLOCK_SKEW_MS + 1);
        assert!(!gone.iter().any(attempt));
    }
}
