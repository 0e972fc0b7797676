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

use xp_runtime::clock::UnixMillis;
use xp_runtime::ids::TrialId;
use xp_runtime::protocol::{
    ATTEMPT_CAPABILITY_MS, Holder, Revocation, RevocationEntry, RevocationList,
    SESSION_CAPABILITY_MS,
};

/// The revocations in force.
#[derive(Debug, Default, Clone)]
pub(crate) struct ObjectGrants {
    revoked: RevocationList,
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
        let sessions = RevocationEntry {
            revocation: Revocation::SessionsBefore { before_ms: now },
            until_ms: now + SESSION_CAPABILITY_MS,
        };
        let attempts = ended
            .into_iter()
            .map(|(trial, attempt, launched_at)| RevocationEntry {
                revocation: Revocation::Holder(Holder::Attempt { trial, attempt }),
                until_ms: launched_at.saturating_add(ATTEMPT_CAPABILITY_MS),
            })
            .filter(|entry| entry.until_ms >= now);
        // No node is connected yet: each gets these when it registers, so
        // none is waiting to be sent.
        let mut revoked: RevocationList = std::iter::once(sessions).chain(attempts).collect();
        revoked.prune(now);
        Self {
            revoked,
            unsent: Vec::new(),
        }
    }

    /// Revokes `revocation` at `now` until `until_ms`; the nodes are told
    /// with the next [`Self::take_unsent`].
    pub(crate) fn revoke(&mut self, now: UnixMillis, revocation: Revocation, until_ms: UnixMillis) {
        self.revoked.prune(now);
        let entry = RevocationEntry {
            revocation,
            until_ms,
        };
        self.revoked.add(entry.clone());
        self.unsent.push(entry);
    }

    /// The revocations made since the last call, to tell every node.
    pub(crate) fn take_unsent(&mut self) -> Vec<RevocationEntry> {
        std::mem::take(&mut self.unsent)
    }

    /// Every revocation still in force at `now`.
    pub(crate) fn in_force(&mut self, now: UnixMillis) -> Vec<RevocationEntry> {
        self.revoked.prune(now);
        self.revoked.entries()
    }
}

#[cfg(test)]
mod tests {
    use xp_runtime::protocol::CLOCK_SKEW_MS;

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
}
