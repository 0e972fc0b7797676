//! What the head revoked of the object capabilities it issued, kept until each
//! revoked capability has expired anyway, so that a node that registers gets
//! every revocation still in force; and when each live attempt's capability
//! is next renewed.
//!
//! Soft state, rebuilt at a restart from what is durable: the start itself
//! revokes every session capability issued before it (the connections ended
//! with the old head), and every attempt that ended within
//! `ATTEMPT_CAPABILITY_MS` is revoked again from the book. What a running head
//! revokes of users is soft: a user revoked before a restart has no
//! connection to it, and their session capabilities died with the start. The
//! renewals start again as nodes register (each is sent fresh capabilities of
//! the live attempts it runs).
//!
//! Invariants: an entry is kept until its `until_ms` has passed (plus the
//! allowed clock skew), and never longer. An attempt's revocation lasts until
//! `ATTEMPT_CAPABILITY_MS` after its end: every capability of it was issued
//! before its end, so none outlives that.

use std::collections::{BTreeSet, HashMap};

use xp_runtime::clock::UnixMillis;
use xp_runtime::ids::TrialId;
use xp_runtime::protocol::{
    ATTEMPT_CAPABILITY_MS, CLOCK_SKEW_MS, Holder, Revocation, RevocationEntry, RevocationList,
    SESSION_CAPABILITY_MS,
};

/// An attempt: its trial and number.
type AttemptKey = (TrialId, u32);

/// The revocations in force, and the renewals due.
#[derive(Debug, Default, Clone)]
pub(crate) struct ObjectGrants {
    /// Sessions, users, and the start's void of older sessions.
    revoked: RevocationList,
    /// Ended attempts, by when their last capability expires anyway (the
    /// end plus `ATTEMPT_CAPABILITY_MS`). Apart from the list, whose holder
    /// map a node needs to look holders up: a head restarted after a busy
    /// hour holds tens of thousands of these, 32 bytes each here against
    /// about 90 in the list's two maps.
    attempts: BTreeSet<(UnixMillis, TrialId, u32)>,
    /// Revocations not yet told to the nodes.
    unsent: Vec<RevocationEntry>,
    /// When each live attempt's capability is next renewed.
    renewals: Renewals,
}

impl ObjectGrants {
    /// A head started at `now`: session capabilities from before are void, and
    /// so are those of the attempts in `ended` (trial, attempt, ended at).
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
                .map(|(trial, attempt, ended_at)| (attempt_until(ended_at), trial, attempt))
                .filter(|(until, _, _)| until.saturating_add(CLOCK_SKEW_MS) >= now)
                .collect(),
            // No node is connected yet: each gets these when it registers.
            unsent: Vec::new(),
            renewals: Renewals::default(),
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

    /// Attempt `attempt` of `trial` ended at `now`: its capabilities are
    /// revoked, as [`Self::revoke`] does, and no longer renewed.
    pub(crate) fn revoke_attempt(&mut self, now: UnixMillis, trial: TrialId, attempt: u32) {
        self.prune(now);
        self.renewals.forget((trial, attempt));
        let until = attempt_until(now);
        self.attempts.insert((until, trial, attempt));
        self.unsent.push(attempt_entry(until, trial, attempt));
    }

    /// A capability of live attempt `attempt` of `trial` was issued at
    /// `now`: it is renewed at half its life, the earlier one no longer.
    pub(crate) fn issued(&mut self, now: UnixMillis, trial: TrialId, attempt: u32) {
        let due = now.saturating_add(ATTEMPT_CAPABILITY_MS / 2);
        self.renewals.schedule((trial, attempt), due);
    }

    /// The attempts whose capabilities are due for renewal at `now`, each
    /// taken off the schedule until [`Self::issued`] puts it back.
    pub(crate) fn take_due(&mut self, now: UnixMillis) -> Vec<AttemptKey> {
        self.renewals.take_due(now)
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

/// When each live attempt's capability is next renewed: one entry per
/// attempt, found by time and by attempt.
#[derive(Debug, Default, Clone)]
struct Renewals {
    due: BTreeSet<(UnixMillis, AttemptKey)>,
    of: HashMap<AttemptKey, UnixMillis>,
}

impl Renewals {
    fn schedule(&mut self, attempt: AttemptKey, due: UnixMillis) {
        if let Some(earlier) = self.of.insert(attempt, due) {
            self.due.remove(&(earlier, attempt));
        }
        self.due.insert((due, attempt));
    }

    fn forget(&mut self, attempt: AttemptKey) {
        if let Some(due) = self.of.remove(&attempt) {
            self.due.remove(&(due, attempt));
        }
    }

    fn take_due(&mut self, now: UnixMillis) -> Vec<AttemptKey> {
        let mut taken = Vec::new();
        while let Some(&(due, attempt)) = self.due.first()
            && due <= now
        {
            self.due.pop_first();
            self.of.remove(&attempt);
            taken.push(attempt);
        }
        taken
    }
}

/// When the last capability of an attempt that ended at `ended_at` expires
/// at the latest.
fn attempt_until(ended_at: UnixMillis) -> UnixMillis {
    ended_at.saturating_add(ATTEMPT_CAPABILITY_MS)
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
        let long_ago = NOW - ATTEMPT_CAPABILITY_MS - CLOCK_SKEW_MS - 1;
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
    fn an_ended_attempt_is_revoked_until_its_last_capability_expires() {
        let trial: TrialId = "00000000000000aa-t0".parse().expect("trial");
        let mut grants = ObjectGrants::started(NOW, []);
        grants.revoke_attempt(NOW, trial, 1);
        let attempt = |entry: &RevocationEntry| matches!(entry.revocation, Revocation::Holder(_));
        let until = NOW + ATTEMPT_CAPABILITY_MS;
        let in_force = grants.in_force(NOW + 2);
        assert_eq!(in_force.iter().filter(|entry| attempt(entry)).count(), 1);
        assert!(in_force.iter().any(|entry| entry.until_ms == until));
        assert_eq!(grants.take_unsent().len(), 1, "the revocation is told");
        let kept = grants.in_force(until + CLOCK_SKEW_MS);
        assert!(kept.iter().any(attempt), "kept through the clock skew");
        let gone = grants.in_force(until + CLOCK_SKEW_MS + 1);
        assert!(!gone.iter().any(attempt));
    }

    #[test]
    fn a_live_attempt_is_renewed_at_half_its_capabilitys_life_until_it_ends() {
        let trial: TrialId = "00000000000000aa-t0".parse().expect("trial");
        let other: TrialId = "00000000000000aa-t1".parse().expect("trial");
        let half = ATTEMPT_CAPABILITY_MS / 2;
        let mut grants = ObjectGrants::started(NOW, []);
        grants.issued(NOW, trial, 1);
        grants.issued(NOW + 5, other, 1);
        assert!(grants.take_due(NOW + half - 1).is_empty());
        // Issued again (its node registered again): the earlier time is gone.
        grants.issued(NOW + 10, trial, 1);
        assert_eq!(grants.take_due(NOW + half + 5), [(other, 1)]);
        assert_eq!(grants.take_due(NOW + half + 10), [(trial, 1)]);
        assert!(grants.take_due(NOW + 3 * half).is_empty(), "taken once");
        grants.issued(NOW + half + 10, trial, 1);
        grants.revoke_attempt(NOW + half + 20, trial, 1);
        assert!(
            grants.take_due(NOW + 4 * half).is_empty(),
            "an ended attempt is not renewed"
        );
    }
}
