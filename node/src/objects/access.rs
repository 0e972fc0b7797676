//! Who may do what on this node's object server: the credential of every
//! request checked (a node's, or a capability the head signed), what a
//! capability may read or store as, each team's quota on this node, the
//! per-team counts of fetches and stores, and the refusals the head writes to
//! its audit trail.
//!
//! The head keeps it current: `HeadCommand::ObjectRules` (quotas and every
//! revocation in force, after each registration and policy change) and
//! `HeadCommand::RevokeCapabilities` (sessions and attempts that ended, users
//! revoked). The object server asks it on every request (`remote`); the agent
//! tells it which team each launched trial belongs to, and sends what it
//! counted to the head every [`REPORT_INTERVAL`] (`NodeMessage::ObjectAccess`).
//!
//! Not here: the signature and revocation rules themselves
//! (`xp_runtime::protocol::ObjectCapability`), and moving bytes (`remote`).
//!
//! Invariants: a request counts only with this cluster's node credential or a
//! capability that verifies now; a capability reads only objects its grant
//! covers and stores only as its own driver session; a store that would take a
//! team over its quota on this node is refused before it is stored (stores are
//! admitted one at a time, so two cannot both pass the same check).

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use tokio::sync::mpsc;
use tracing::warn;
use xp_runtime::ids::{ObjectId, TrialId, WorkerKey};
use xp_runtime::object_wire::{Credential, FetchErrorCode, LocalResponse};
use xp_runtime::protocol::{
    CapabilityError, CapabilityKey, Grant, Holder, MAX_REPORTED_REFUSALS, NodeMessage,
    ObjectAccessReport, ObjectCapability, ObjectRefusal, ObjectRules, RevocationEntry,
    RevocationList, TeamObjectCounts, TeamQuota,
};

use super::{ObjectInfo, Owner, Tier};

/// How often the agent sends what was counted to the head.
pub(crate) const REPORT_INTERVAL: Duration = Duration::from_secs(1);

/// The quota of a team the head named no quota for before its first rules
/// arrive: the policy's documented defaults (`xp_sched::ObjectQuotas`).
const DEFAULT_QUOTA: TeamQuota = TeamQuota {
    team: String::new(),
    memory_bytes: 1 << 30,
    disk_bytes: 64 << 30,
};

/// Who a request's credential proved it is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Asker {
    /// A node of this cluster.
    Node,
    /// The holder of a verified capability.
    Capability(Grant),
}

/// Why a request was refused: its wire code and words.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Refusal {
    /// The code the fetcher matches on.
    pub(crate) code: FetchErrorCode,
    /// The reason, naming the rule.
    pub(crate) message: String,
}

impl Refusal {
    fn new(code: FetchErrorCode, message: impl Into<String>) -> Self {
        Self {
            code,
            message: message.into(),
        }
    }
}

/// Where a store that fits its team's quota may go.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum StorePlan {
    /// Wherever the store puts it.
    Anywhere,
    /// On disk: the team's memory quota is full.
    Disk,
}

/// What a team's objects hold on this node.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct TeamUsage {
    /// Bytes in the memory tier.
    pub(crate) memory_bytes: u64,
    /// Bytes in all.
    pub(crate) total_bytes: u64,
}

/// Admits a store of `size` bytes by a team holding `usage` under `quota`:
/// refused over the disk quota (the whole of what the team keeps here), on
/// disk over the memory quota.
pub(crate) fn plan_store(
    quota: &TeamQuota,
    team: &str,
    usage: TeamUsage,
    size: u64,
) -> Result<StorePlan, Refusal> {
    if usage.total_bytes.saturating_add(size) > quota.disk_bytes {
        return Err(Refusal::new(
            FetchErrorCode::OverQuota,
            format!(
                "team {team} is over its object quota on this node: it keeps {} of its {}-byte disk quota (objects.disk), and this object is {size} bytes",
                usage.total_bytes, quota.disk_bytes
            ),
        ));
    }
    if usage.memory_bytes.saturating_add(size) > quota.memory_bytes {
        return Ok(StorePlan::Disk);
    }
    Ok(StorePlan::Anywhere)
}

/// What the access rules keep, behind one lock.
#[derive(Debug, Default)]
struct AccessState {
    revoked: RevocationList,
    default_quota: Option<TeamQuota>,
    quotas: BTreeMap<String, TeamQuota>,
    /// The team of each driver session that stored here.
    session_teams: HashMap<String, String>,
    /// The team of each trial launched here.
    trial_teams: HashMap<TrialId, String>,
    /// The capability of each live worker's attempt, handed to it on request.
    workers: HashMap<WorkerKey, ObjectCapability>,
    counts: BTreeMap<String, TeamObjectCounts>,
    refusals: Vec<ObjectRefusal>,
}

impl AccessState {
    fn counts(&mut self, team: &str) -> &mut TeamObjectCounts {
        self.counts
            .entry(team.to_owned())
            .or_insert_with(|| TeamObjectCounts {
                team: team.to_owned(),
                ..TeamObjectCounts::default()
            })
    }

    /// The team an owner's objects are charged to, if known here.
    fn team_of(&self, owner: &Owner) -> Option<&str> {
        match owner {
            Owner::Driver(session) => self.session_teams.get(session),
            Owner::Trial(trial) => self.trial_teams.get(trial),
        }
        .map(String::as_str)
    }
}

/// The access rules of one node's object server.
#[derive(Debug)]
pub struct ObjectAccess {
    key: CapabilityKey,
    node_credential: [u8; 32],
    state: Mutex<AccessState>,
    /// Held from a store's quota check to its put.
    store_gate: Mutex<()>,
}

impl ObjectAccess {
    /// The rules of the cluster whose token is `cluster_token`, before the
    /// head's first `ObjectRules`: the default quota, nothing revoked.
    pub fn new(cluster_token: &str) -> Self {
        Self {
            key: CapabilityKey::derive(cluster_token),
            node_credential: xp_runtime::object_wire::node_credential(cluster_token),
            state: Mutex::default(),
            store_gate: Mutex::new(()),
        }
    }

    fn lock(&self) -> MutexGuard<'_, AccessState> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Who `credential` proves the asker is at `now_ms`, or why it proves nothing.
    pub(crate) fn authenticate(
        &self,
        credential: &Credential,
        now_ms: u64,
    ) -> Result<Asker, Refusal> {
        match credential {
            // Compared as blake3 hashes, whose equality is constant-time.
            Credential::Node(presented) => {
                if blake3::Hash::from_bytes(*presented)
                    == blake3::Hash::from_bytes(self.node_credential)
                {
                    Ok(Asker::Node)
                } else {
                    Err(Refusal::new(
                        FetchErrorCode::BadCredential,
                        "wrong node credential: not this cluster's",
                    ))
                }
            }
            Credential::Capability(capability) => {
                let mut state = self.lock();
                state.revoked.prune(now_ms);
                match capability.verify(&self.key, now_ms, &state.revoked) {
                    Ok(grant) => Ok(Asker::Capability(grant.clone())),
                    Err(error) => Err(capability_refusal(&error)),
                }
            }
        }
    }

    /// Applies the head's rules: quotas replaced, revocations added.
    pub(crate) fn apply_rules(&self, rules: ObjectRules) {
        let mut state = self.lock();
        state.default_quota = Some(rules.default_quota);
        state.quotas = rules
            .teams
            .into_iter()
            .map(|quota| (quota.team.clone(), quota))
            .collect();
        if state.revoked.is_empty() {
            // The first rules after a start hold every revocation of the
            // day (a million after a busy one): built at once, packed.
            state.revoked = rules.revoked.into_iter().collect();
        } else {
            for entry in rules.revoked {
                state.revoked.add(entry);
            }
        }
    }

    /// Adds revocations the head made.
    pub(crate) fn revoke(&self, entries: Vec<RevocationEntry>) {
        let mut state = self.lock();
        for entry in entries {
            state.revoked.add(entry);
        }
    }

    /// Worker `key` starts with its attempt's `capability`: kept to hand to it
    /// (`capability_of`), and its trial's objects count toward the team.
    pub(crate) fn hold_worker(&self, key: WorkerKey, capability: ObjectCapability) {
        let mut state = self.lock();
        state
            .trial_teams
            .insert(key.trial, capability.grant.team.clone());
        state.workers.insert(key, capability);
    }

    /// The head issued these attempts' capabilities anew: each replaces the
    /// one its attempt's workers here hold. One of an attempt with no worker
    /// here (it ended meanwhile) is dropped, and so is one the head did not
    /// issue to an attempt.
    pub(crate) fn renew(&self, capabilities: Vec<ObjectCapability>) {
        let mut state = self.lock();
        for capability in capabilities {
            let Holder::Attempt { trial, attempt } = capability.grant.holder else {
                warn!(holder = %capability.grant.holder, "a renewal not of an attempt ignored");
                continue;
            };
            for (key, held) in &mut state.workers {
                if key.trial == trial && key.attempt == attempt {
                    *held = capability.clone();
                }
            }
        }
    }

    /// The capability worker `key` holds (launched with, or renewed), while
    /// it is live.
    pub(crate) fn capability_of(&self, key: WorkerKey) -> Option<ObjectCapability> {
        self.lock().workers.get(&key).cloned()
    }

    /// Worker `key` ended.
    pub(crate) fn forget_worker(&self, key: WorkerKey) {
        self.lock().workers.remove(&key);
    }

    /// `trial` ended: forgets its team once its objects are collected.
    pub(crate) fn forget_trial(&self, trial: TrialId) {
        self.lock().trial_teams.remove(&trial);
    }

    /// `session` ended: forgets its team.
    pub(crate) fn forget_session(&self, session: &str) {
        self.lock().session_teams.remove(session);
    }

    /// Checks that `grant` may read object `id`, whose owners here are
    /// `owners` (`None`: not held here, which the fetch itself answers).
    pub(crate) fn check_read(
        grant: &Grant,
        id: ObjectId,
        owners: Option<Vec<Owner>>,
    ) -> Result<(), Refusal> {
        let Some(owners) = owners else {
            return Ok(());
        };
        let (trials, drivers) = Owner::split(owners);
        if grant.may_read(id, &trials, &drivers) {
            return Ok(());
        }
        Err(Refusal::new(
            FetchErrorCode::Forbidden,
            format!(
                "the capability of {} (user {}, team {}) does not cover object {id}: it reads only its own session's and its team's sessions' objects, its experiments' and the checkpoints it was granted",
                grant.holder, grant.subject, grant.team
            ),
        ))
    }

    /// Checks that `grant` may store or release as driver session `owner`.
    pub(crate) fn check_write(grant: &Grant, owner: &str) -> Result<(), Refusal> {
        match grant.writes_as() {
            Some(session) if session == owner => Ok(()),
            Some(session) => Err(Refusal::new(
                FetchErrorCode::Forbidden,
                format!("the capability stores only as driver session {session}, not as {owner:?}"),
            )),
            None => Err(Refusal::new(
                FetchErrorCode::Forbidden,
                format!(
                    "the capability of {} stores nothing on object servers: a trial stores through its node",
                    grant.holder
                ),
            )),
        }
    }

    /// Runs `store` (given the plan) under the gate, if `size` more bytes fit
    /// `team`'s quota over what `holdings` charge it; remembers the session's team.
    pub(crate) fn admit_store<T>(
        &self,
        team: &str,
        session: &str,
        size: u64,
        holdings: impl FnOnce() -> Vec<(ObjectId, ObjectInfo)>,
        store: impl FnOnce(StorePlan) -> T,
    ) -> Result<T, Refusal> {
        let _gate = self
            .store_gate
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        let holdings = holdings();
        let (quota, usage) = {
            let mut state = self.lock();
            state
                .session_teams
                .insert(session.to_owned(), team.to_owned());
            let quota = state
                .quotas
                .get(team)
                .or(state.default_quota.as_ref())
                .cloned()
                .unwrap_or(DEFAULT_QUOTA);
            (quota, usage_of(&state, team, &holdings))
        };
        let plan = plan_store(&quota, team, usage, size)?;
        Ok(store(plan))
    }

    /// Counts a chunk of `bytes` served to `team` (`first`: an object's first chunk).
    pub(crate) fn count_fetch(&self, team: &str, bytes: u64, first: bool) {
        let mut state = self.lock();
        let counts = state.counts(team);
        counts.fetched_bytes += bytes;
        counts.fetches += u64::from(first);
    }

    /// Counts an object of `bytes` stored for `team`.
    pub(crate) fn count_store(&self, team: &str, bytes: u64) {
        let mut state = self.lock();
        let counts = state.counts(team);
        counts.stores += 1;
        counts.stored_bytes += bytes;
    }

    /// Records a refusal of `action` asked with `credential` at `now_ms`.
    pub(crate) fn refused(
        &self,
        now_ms: u64,
        credential: &Credential,
        action: String,
        refusal: &Refusal,
    ) {
        let (subject, team) = match credential {
            Credential::Node(_) => ("node credential".to_owned(), String::new()),
            Credential::Capability(capability) => (
                capability.grant.subject.clone(),
                capability.grant.team.clone(),
            ),
        };
        // A capability whose signature failed only claims its user and team.
        let subject = if refusal.code == FetchErrorCode::BadCredential {
            format!("{} (unverified claim)", truncated(&subject, 128))
        } else {
            subject
        };
        let team = truncated(&team, 128).to_owned();
        let mut state = self.lock();
        // Only a verified team is counted: a forged claim would make up labels.
        if !team.is_empty() && refusal.code != FetchErrorCode::BadCredential {
            state.counts(&team).refusals += 1;
        }
        if state.refusals.len() < MAX_REPORTED_REFUSALS {
            let refusal = ObjectRefusal {
                at_ms: now_ms,
                subject,
                team,
                action,
                reason: refusal.message.clone(),
            };
            state.refusals.push(refusal);
        }
    }

    /// What was counted since the last report, if anything.
    pub(crate) fn take_report(&self) -> Option<ObjectAccessReport> {
        let mut state = self.lock();
        if state.counts.is_empty() && state.refusals.is_empty() {
            return None;
        }
        Some(ObjectAccessReport {
            counts: std::mem::take(&mut state.counts).into_values().collect(),
            refusals: std::mem::take(&mut state.refusals),
        })
    }
}

/// The local channel's answer to a worker asking for its attempt's capability.
pub(crate) fn hand_capability(access: &ObjectAccess, key: WorkerKey) -> LocalResponse {
    match access.capability_of(key) {
        Some(capability) => LocalResponse::Capability(Box::new(capability)),
        None => LocalResponse::Error {
            message: format!("worker {key} was launched without an object capability"),
        },
    }
}

/// Sends what `access` counted to the head every [`REPORT_INTERVAL`], through
/// the agent's messages for the head (dropped while no session is open), until
/// the agent is gone.
pub(crate) fn report_to_head(
    access: Arc<ObjectAccess>,
    head_messages: mpsc::UnboundedSender<NodeMessage>,
) {
    xp_runtime::task::spawn("object-access-reports", async move {
        let mut every = tokio::time::interval(REPORT_INTERVAL);
        loop {
            every.tick().await;
            if head_messages.is_closed() {
                return;
            }
            if let Some(report) = access.take_report() {
                let _ = head_messages.send(NodeMessage::ObjectAccess(report));
            }
        }
    });
}

/// What `team`'s objects among `holdings` hold: an object counts toward a
/// team when one of its owners belongs to it.
fn usage_of(state: &AccessState, team: &str, holdings: &[(ObjectId, ObjectInfo)]) -> TeamUsage {
    let mut usage = TeamUsage::default();
    for (_, info) in holdings {
        if !info
            .owners
            .iter()
            .any(|owner| state.team_of(owner) == Some(team))
        {
            continue;
        }
        usage.total_bytes += info.size;
        if info.tier == Tier::Memory {
            usage.memory_bytes += info.size;
        }
    }
    usage
}

/// The wire's answer to a capability that did not verify.
fn capability_refusal(error: &CapabilityError) -> Refusal {
    let code = match error {
        CapabilityError::Expired { .. } => FetchErrorCode::Expired,
        CapabilityError::Revoked { .. } => FetchErrorCode::Revoked,
        CapabilityError::UnknownFormat { .. }
        | CapabilityError::BadSignature
        | CapabilityError::TooManyScopes { .. }
        | CapabilityError::NameTooLong { .. } => FetchErrorCode::BadCredential,
    };
    Refusal::new(code, error.to_string())
}

/// `text` cut to at most `max` bytes, on a character boundary.
fn truncated(text: &str, max: usize) -> &str {
    if text.len() <= max {
        return text;
    }
    let mut end = max;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    &text[..end]
}

#[cfg(test)]
mod tests;
