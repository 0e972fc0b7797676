//! Object capabilities: what the head grants a driver session or a trial
//! attempt on the object plane, signed so that object servers can check it
//! without asking the head. **API boundary** (carried by `Launch`,
//! `Response::ObjectCapability` and the object wire's requests).
//!
//! A capability is a [`Grant`] (who holds it, which user it acts for, the team
//! it is charged to, what it may read, when it was issued and when it expires)
//! and a MAC over the grant's fields in a fixed order: blake3 in keyed mode under a
//! [`CapabilityKey`] derived from the cluster token, which the head and every
//! node hold and nothing else does. A MAC rather than a signature: the only
//! verifiers are nodes, which hold the cluster token (and so every object)
//! anyway, so a public key would protect nothing more; blake3 is already how
//! the cluster hashes, and keyed blake3 is a PRF whose tags compare in
//! constant time ([`blake3::Hash`]'s equality).
//!
//! What a grant allows: reading an object whose owners on the serving node
//! include a trial of a granted experiment or the granted trial, a granted
//! driver session, or that is granted by id ([`Grant::may_read`]); writing
//! (storing, releasing) only as its own driver session ([`Grant::writes_as`]).
//! It stops working when it expires, when its holder ends (a session's
//! connection, an attempt) and when its user is revoked or changed: the head
//! sends nodes [`RevocationEntry`]s, which they keep in a [`RevocationList`]
//! until every capability they name has expired anyway.
//!
//! Not here: who gets which grant (the head core), and where it is checked
//! (the nodes' object servers).
//!
//! Invariant: a capability verifies only under the key it was issued with, only
//! with every byte of its grant unchanged, only before its expiry (plus
//! [`CLOCK_SKEW_MS`]) and only while no revocation covers it.

use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};

use crate::ids::{ExperimentId, ObjectId, TrialId};

/// The format of [`ObjectCapability`] this build issues and accepts.
pub const CAPABILITY_FORMAT: u8 = 1;
/// The most read scopes one grant names.
pub const MAX_READ_SCOPES: usize = 64;
/// The longest subject, team or session name a grant carries.
pub const MAX_GRANT_NAME_BYTES: usize = 256;
/// How long a driver session's capability lasts; the SDK asks for a new one
/// before then.
pub const SESSION_CAPABILITY_MS: u64 = 10 * 60 * 1000;
/// How long a trial attempt's capability lasts. The head issues the attempt a
/// new one at half this while it lives (`HeadCommand::RenewCapabilities`), and
/// revokes it when the attempt ends, until this long after the end. An hour,
/// not a day: every node keeps every revocation in force, and a registering
/// node is sent them all, so their number is the rate of ends times this.
pub const ATTEMPT_CAPABILITY_MS: u64 = 60 * 60 * 1000;
/// The most capabilities one `HeadCommand::RenewCapabilities` carries: a grant
/// names at most [`MAX_READ_SCOPES`] scopes of names of at most
/// [`MAX_GRANT_NAME_BYTES`], so this many stay well within a frame.
pub const MAX_RENEWALS_PER_COMMAND: usize = 256;
/// How far a node's clock may be ahead of the head's before a fresh capability
/// looks expired to it.
pub const CLOCK_SKEW_MS: u64 = 30 * 1000;

/// The key capabilities are signed with: derived from the cluster token, so
/// the head and every node hold it and a member does not.
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct CapabilityKey([u8; 32]);

impl CapabilityKey {
    /// The key of the cluster whose token is `cluster_token`.
    pub fn derive(cluster_token: &str) -> Self {
        Self(blake3::derive_key(
            "xp 2026-12 object capability key v1",
            cluster_token.as_bytes(),
        ))
    }

    /// A key from its bytes (the head core keeps it in its configuration).
    pub const fn from_bytes(bytes: [u8; 32]) -> Self {
        Self(bytes)
    }

    /// The key's bytes.
    pub fn to_bytes(self) -> [u8; 32] {
        self.0
    }
}

impl std::fmt::Debug for CapabilityKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("CapabilityKey(<redacted>)")
    }
}

/// Who holds a capability: what ends it.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub enum Holder {
    /// A driver's connection, by its session name; ends with the connection.
    Session(String),
    /// A trial attempt; ends when the attempt does.
    Attempt {
        /// The trial.
        trial: TrialId,
        /// The attempt, from 1.
        attempt: u32,
    },
}

impl std::fmt::Display for Holder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Session(session) => write!(f, "driver session {session}"),
            Self::Attempt { trial, attempt } => write!(f, "trial {trial} attempt {attempt}"),
        }
    }
}

/// One thing a capability may read.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub enum ReadScope {
    /// Every object (an admin's session).
    Everything,
    /// What the trials of this experiment keep.
    Experiment(ExperimentId),
    /// What this trial keeps.
    Trial(TrialId),
    /// What this driver session keeps.
    Driver(String),
    /// This object, whoever keeps it (a checkpoint file of the team's work).
    Object(ObjectId),
}

/// What the head grants, and to whom.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Grant {
    /// Who holds it.
    pub holder: Holder,
    /// The user it acts for (revoking them revokes it).
    pub subject: String,
    /// The team its stores are charged to and its transfers counted for.
    pub team: String,
    /// What it may read, at most [`MAX_READ_SCOPES`].
    #[serde(deserialize_with = "crate::wire_seq::vec")]
    pub read: Vec<ReadScope>,
    /// When the head issued it, in milliseconds since the Unix epoch (the head's clock).
    pub issued_ms: u64,
    /// When it stops working, in the same clock.
    pub expires_ms: u64,
}

impl Grant {
    /// Whether it may read `id`, kept on the serving node by `trials` and `drivers`.
    pub fn may_read(&self, id: ObjectId, trials: &[TrialId], drivers: &[String]) -> bool {
        self.read.iter().any(|scope| match scope {
            ReadScope::Everything => true,
            ReadScope::Object(granted) => *granted == id,
            ReadScope::Experiment(experiment) => {
                trials.iter().any(|trial| trial.experiment == *experiment)
            }
            ReadScope::Trial(granted) => trials.contains(granted),
            ReadScope::Driver(session) => drivers.contains(session),
        })
    }

    /// The driver session it stores and releases objects as; `None` for an
    /// attempt's (a trial stores through its node's local channel).
    pub fn writes_as(&self) -> Option<&str> {
        match &self.holder {
            Holder::Session(session) => Some(session),
            Holder::Attempt { .. } => None,
        }
    }

    /// Why the grant is malformed (too many scopes, a name too long), if it is.
    pub fn check_bounds(&self) -> Result<(), CapabilityError> {
        if self.read.len() > MAX_READ_SCOPES {
            return Err(CapabilityError::TooManyScopes {
                scopes: self.read.len(),
            });
        }
        let session = match &self.holder {
            Holder::Session(session) => session.len(),
            Holder::Attempt { .. } => 0,
        };
        let drivers = self.read.iter().map(|scope| match scope {
            ReadScope::Driver(session) => session.len(),
            _ => 0,
        });
        let longest = [self.subject.len(), self.team.len(), session]
            .into_iter()
            .chain(drivers)
            .max()
            .unwrap_or(0);
        if longest > MAX_GRANT_NAME_BYTES {
            return Err(CapabilityError::NameTooLong { len: longest });
        }
        Ok(())
    }
}

/// A signed [`Grant`]. Its `Debug` leaves the MAC out.
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ObjectCapability {
    /// [`CAPABILITY_FORMAT`] when issued.
    pub format: u8,
    /// What it grants.
    pub grant: Grant,
    /// blake3 keyed with the [`CapabilityKey`] over `format` and every field of `grant`.
    pub mac: [u8; 32],
}

impl std::fmt::Debug for ObjectCapability {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ObjectCapability")
            .field("format", &self.format)
            .field("grant", &self.grant)
            .field("mac", &"<redacted>")
            .finish()
    }
}

/// Why a capability was not accepted.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CapabilityError {
    /// A format this build does not know.
    #[error("capability format {format} is not known here (this build reads {CAPABILITY_FORMAT})")]
    UnknownFormat {
        /// The format it carries.
        format: u8,
    },
    /// The MAC does not match the grant: forged, altered, or another cluster's.
    #[error("the capability's signature does not match its grant (forged or altered)")]
    BadSignature,
    /// Past its expiry.
    #[error("the capability expired at {expires_ms} (now {now_ms})")]
    Expired {
        /// When it expired.
        expires_ms: u64,
        /// The verifier's time.
        now_ms: u64,
    },
    /// A revocation covers it.
    #[error("the capability was revoked: {reason}")]
    Revoked {
        /// Which revocation, in words.
        reason: String,
    },
    /// More read scopes than a grant may name.
    #[error("the grant names {scopes} read scopes; at most {MAX_READ_SCOPES} are accepted")]
    TooManyScopes {
        /// How many it names.
        scopes: usize,
    },
    /// A name longer than a grant may carry.
    #[error("a name in the grant is {len} bytes; at most {MAX_GRANT_NAME_BYTES} are accepted")]
    NameTooLong {
        /// Its length.
        len: usize,
    },
}

/// The MAC of `grant` in `format` under `key`.
fn mac_of(key: &CapabilityKey, format: u8, grant: &Grant) -> blake3::Hash {
    blake3::keyed_hash(&key.0, &signed_bytes(format, grant))
}

/// The bytes a MAC covers: every field of the grant in a fixed, unambiguous
/// order (tags, little-endian integers, length-prefixed names), written here
/// rather than by bincode so that the pure crates that issue capabilities need
/// no encoder, and so that the signed form cannot drift with the wire's.
fn signed_bytes(format: u8, grant: &Grant) -> Vec<u8> {
    fn name(out: &mut Vec<u8>, text: &str) {
        out.extend_from_slice(&(text.len() as u64).to_le_bytes());
        out.extend_from_slice(text.as_bytes());
    }
    fn experiment(out: &mut Vec<u8>, id: ExperimentId) {
        out.extend_from_slice(&id.digest.to_le_bytes());
        out.extend_from_slice(&id.run.to_le_bytes());
    }
    fn trial(out: &mut Vec<u8>, id: TrialId) {
        experiment(out, id.experiment);
        out.extend_from_slice(&id.index.to_le_bytes());
    }
    let mut out = b"xp object capability".to_vec();
    out.push(format);
    match &grant.holder {
        Holder::Session(session) => {
            out.push(0);
            name(&mut out, session);
        }
        Holder::Attempt { trial: id, attempt } => {
            out.push(1);
            trial(&mut out, *id);
            out.extend_from_slice(&attempt.to_le_bytes());
        }
    }
    name(&mut out, &grant.subject);
    name(&mut out, &grant.team);
    out.extend_from_slice(&(grant.read.len() as u64).to_le_bytes());
    for scope in &grant.read {
        match scope {
            ReadScope::Everything => out.push(0),
            ReadScope::Experiment(id) => {
                out.push(1);
                experiment(&mut out, *id);
            }
            ReadScope::Trial(id) => {
                out.push(2);
                trial(&mut out, *id);
            }
            ReadScope::Driver(session) => {
                out.push(3);
                name(&mut out, session);
            }
            ReadScope::Object(id) => {
                out.push(4);
                out.extend_from_slice(&id.0);
            }
        }
    }
    out.extend_from_slice(&grant.issued_ms.to_le_bytes());
    out.extend_from_slice(&grant.expires_ms.to_le_bytes());
    out
}

impl ObjectCapability {
    /// `grant`, signed with `key`.
    pub fn issue(key: &CapabilityKey, grant: Grant) -> Self {
        let mac = *mac_of(key, CAPABILITY_FORMAT, &grant).as_bytes();
        Self {
            format: CAPABILITY_FORMAT,
            grant,
            mac,
        }
    }

    /// The grant, if the capability was issued with `key`, is unchanged, has
    /// not expired at `now_ms` (allowing [`CLOCK_SKEW_MS`]) and no entry of
    /// `revoked` covers it.
    pub fn verify(
        &self,
        key: &CapabilityKey,
        now_ms: u64,
        revoked: &RevocationList,
    ) -> Result<&Grant, CapabilityError> {
        if self.format != CAPABILITY_FORMAT {
            return Err(CapabilityError::UnknownFormat {
                format: self.format,
            });
        }
        self.grant.check_bounds()?;
        // blake3::Hash compares in constant time.
        if mac_of(key, self.format, &self.grant) != blake3::Hash::from_bytes(self.mac) {
            return Err(CapabilityError::BadSignature);
        }
        let expires_ms = self.grant.expires_ms;
        if now_ms > expires_ms.saturating_add(CLOCK_SKEW_MS) {
            return Err(CapabilityError::Expired { expires_ms, now_ms });
        }
        if let Some(reason) = revoked.covers(&self.grant) {
            return Err(CapabilityError::Revoked { reason });
        }
        Ok(&self.grant)
    }
}

/// What the head revokes.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum Revocation {
    /// Every capability of this holder: its session or attempt ended.
    Holder(Holder),
    /// Every capability issued to `subject` before `before_ms`: the user was
    /// revoked or changed.
    Subject {
        /// The user.
        subject: String,
        /// Capabilities issued before this (the head's clock) are void.
        before_ms: u64,
    },
    /// Every session's capability issued before `before_ms`: the head
    /// restarted then, and every driver connection ended with it.
    SessionsBefore {
        /// The head's start.
        before_ms: u64,
    },
}

/// The most revocations one command to a node carries (the head splits what
/// it holds, a million after a busy day, into commands of at most this many):
/// about 1.3 MB of attempts', and of sessions and users with names of the
/// most a user's may have well within a frame (`frame::MAX_FRAME_BYTES`).
pub const MAX_REVOCATIONS_PER_COMMAND: usize = 50_000;

/// A revocation and how long it must be kept: until every capability it
/// covers has expired.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RevocationEntry {
    /// What is revoked.
    pub revocation: Revocation,
    /// After this (the head's clock, plus [`CLOCK_SKEW_MS`]) it may be forgotten.
    pub until_ms: u64,
}

/// The revocations a verifier keeps. Pure: the caller passes the time.
///
/// Invariant: `expiry` holds exactly one `(until, key)` per holder and
/// subject entry, with its keep-until time, so pruning visits only what
/// expired (a head restarted after a busy day revokes its 100,000 ended
/// attempts one by one, and a pass over all of them per revocation took
/// most of its start).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RevocationList {
    holders: BTreeMap<Holder, u64>,
    /// Per subject: (issued before, keep until).
    subjects: BTreeMap<String, (u64, u64)>,
    /// Sessions issued before this are void (kept until the second).
    sessions_before: (u64, u64),
    expiry: BTreeSet<(u64, Revoked)>,
}

/// What an expiry entry names.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
enum Revoked {
    Holder(Holder),
    Subject(String),
}

impl RevocationList {
    /// Adds `entry` (a later `before` for a subject replaces an earlier one).
    pub fn add(&mut self, entry: RevocationEntry) {
        let until = entry.until_ms;
        match entry.revocation {
            Revocation::Holder(holder) => {
                let was = self.holders.get(&holder).copied();
                let until = was.unwrap_or(until).max(until);
                self.holders.insert(holder.clone(), until);
                self.move_expiry(Revoked::Holder(holder), was, until);
            }
            Revocation::Subject { subject, before_ms } => {
                let was = self.subjects.get(&subject).copied();
                let (before, until) = was.map_or((before_ms, until), |(before, kept)| {
                    (before.max(before_ms), kept.max(until))
                });
                self.subjects.insert(subject.clone(), (before, until));
                self.move_expiry(Revoked::Subject(subject), was.map(|(_, kept)| kept), until);
            }
            Revocation::SessionsBefore { before_ms } => {
                self.sessions_before = (
                    self.sessions_before.0.max(before_ms),
                    self.sessions_before.1.max(until),
                );
            }
        }
    }

    /// Moves `revoked`'s expiry entry from `was` (none for a new entry) to `until`.
    fn move_expiry(&mut self, revoked: Revoked, was: Option<u64>, until: u64) {
        if was == Some(until) {
            return;
        }
        let mut entry = (until, revoked);
        if let Some(was) = was {
            entry.0 = was;
            self.expiry.remove(&entry);
            entry.0 = until;
        }
        self.expiry.insert(entry);
    }

    /// Forgets what no unexpired capability can need any more at `now_ms`.
    pub fn prune(&mut self, now_ms: u64) {
        let keep = |until: u64| until.saturating_add(CLOCK_SKEW_MS) >= now_ms;
        while let Some((until, _)) = self.expiry.first()
            && !keep(*until)
        {
            let Some((_, revoked)) = self.expiry.pop_first() else {
                break;
            };
            match revoked {
                Revoked::Holder(holder) => {
                    self.holders.remove(&holder);
                }
                Revoked::Subject(subject) => {
                    self.subjects.remove(&subject);
                }
            }
        }
        if !keep(self.sessions_before.1) {
            self.sessions_before = (0, 0);
        }
    }

    /// Which revocation covers `grant`, in words; `None` when none does.
    pub fn covers(&self, grant: &Grant) -> Option<String> {
        if self.holders.contains_key(&grant.holder) {
            return Some(format!("{} ended", grant.holder));
        }
        if let Some((before, _)) = self.subjects.get(&grant.subject)
            && grant.issued_ms < *before
        {
            return Some(format!(
                "user {} was revoked or changed after it was issued",
                grant.subject
            ));
        }
        if matches!(grant.holder, Holder::Session(_)) && grant.issued_ms < self.sessions_before.0 {
            return Some("the head restarted after it was issued, ending its session".to_owned());
        }
        None
    }

    /// Every entry kept, to hand to a verifier that starts afresh.
    pub fn entries(&self) -> Vec<RevocationEntry> {
        let mut entries: Vec<RevocationEntry> = self
            .holders
            .iter()
            .map(|(holder, until)| RevocationEntry {
                revocation: Revocation::Holder(holder.clone()),
                until_ms: *until,
            })
            .collect();
        entries.extend(
            self.subjects
                .iter()
                .map(|(subject, (before, until))| RevocationEntry {
                    revocation: Revocation::Subject {
                        subject: subject.clone(),
                        before_ms: *before,
                    },
                    until_ms: *until,
                }),
        );
        if self.sessions_before.0 > 0 {
            entries.push(RevocationEntry {
                revocation: Revocation::SessionsBefore {
                    before_ms: self.sessions_before.0,
                },
                until_ms: self.sessions_before.1,
            });
        }
        entries
    }

    /// How many entries are kept.
    pub fn len(&self) -> usize {
        self.holders.len() + self.subjects.len() + usize::from(self.sessions_before.0 > 0)
    }

    /// Whether none is.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

impl FromIterator<RevocationEntry> for RevocationList {
    /// The list [`RevocationList::add`] would make of `entries`, built at
    /// once: its maps come out packed, where adding a million holders one by
    /// one (a head restarted after a busy day) leaves their nodes half full.
    fn from_iter<I: IntoIterator<Item = RevocationEntry>>(entries: I) -> Self {
        let mut others = Vec::new();
        let mut holders = Vec::new();
        for entry in entries {
            match entry.revocation {
                Revocation::Holder(holder) => holders.push((holder, entry.until_ms)),
                revocation => others.push(RevocationEntry {
                    revocation,
                    until_ms: entry.until_ms,
                }),
            }
        }
        // A holder's latest keep-until sorts last, and a map collected keeps
        // the last of equal keys.
        holders.sort_unstable();
        let holders: BTreeMap<Holder, u64> = holders.into_iter().collect();
        let mut list = Self {
            expiry: holders
                .iter()
                .map(|(holder, until)| (*until, Revoked::Holder(holder.clone())))
                .collect(),
            holders,
            ..Self::default()
        };
        for entry in others {
            list.add(entry);
        }
        list
    }
}

/// What a team may keep on one node's object store.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TeamQuota {
    /// The team; empty for the default of teams not named.
    pub team: String,
    /// Bytes the team's objects may hold in the memory tier.
    pub memory_bytes: u64,
    /// Bytes the team's objects may hold on the node in all (memory spills to disk).
    pub disk_bytes: u64,
}

/// What the head tells a node about the object plane: the quotas in force and
/// revocations, which the node adds to those it holds. Sent when the node
/// registers, with the first [`MAX_REVOCATIONS_PER_COMMAND`] in force (the
/// rest follow at once as `HeadCommand::RevokeCapabilities`), and when the
/// policy changes, with none; revocations made in between come as
/// `HeadCommand::RevokeCapabilities`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ObjectRules {
    /// The quota of teams not named in `teams`.
    pub default_quota: TeamQuota,
    /// Quotas of named teams.
    pub teams: Vec<TeamQuota>,
    /// The revocations in force.
    pub revoked: Vec<RevocationEntry>,
}

/// What one team's users fetched and stored through one node's object server.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct TeamObjectCounts {
    /// The team.
    pub team: String,
    /// Fetches (an object's first chunk).
    pub fetches: u64,
    /// Bytes served.
    pub fetched_bytes: u64,
    /// Objects stored.
    pub stores: u64,
    /// Their bytes.
    pub stored_bytes: u64,
    /// Requests refused.
    pub refusals: u64,
}

/// A request an object server refused, for the head's audit trail.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ObjectRefusal {
    /// When, in the node's clock (milliseconds since the Unix epoch).
    pub at_ms: u64,
    /// The user the capability names (as claimed, when its signature failed).
    pub subject: String,
    /// Its team (as claimed, likewise).
    pub team: String,
    /// What was asked (`fetch object …`, `store 3 MB`).
    pub action: String,
    /// Why it was refused.
    pub reason: String,
}

/// What a node's object server saw since its last report (best effort:
/// neither numbered nor acknowledged, like telemetry).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ObjectAccessReport {
    /// Counts per team.
    pub counts: Vec<TeamObjectCounts>,
    /// Refusals, at most [`MAX_REPORTED_REFUSALS`] (the counts have them all).
    pub refusals: Vec<ObjectRefusal>,
}

/// The most refusals one [`ObjectAccessReport`] lists.
pub const MAX_REPORTED_REFUSALS: usize = 64;

#[cfg(test)]
mod tests;
