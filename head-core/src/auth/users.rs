//! The user table: who may connect as a client, their team and role, and the
//! commands that change it (`xp-head user add|list|role|revoke`).
//!
//! A user's secret is 256 random bits, shown once (in their credential string)
//! and stored only as a keyed blake3 hash. A password hash (a slow KDF) is not
//! needed: the secret is drawn at random with 256 bits of entropy, so no
//! dictionary or brute-force search of the hash is feasible, and a fast hash
//! keeps every connection's check cheap.
//!
//! [`Users`] is the in-memory table; its changes are planned first
//! ([`Users::plan`]), stored by the caller, and only then applied
//! ([`Users::apply`]), so the table never holds what is not on disk. The
//! running head (over its local socket) and `xp-head user` on a stopped head's
//! database run the same code.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use xp_runtime::clock::UnixMillis;
use xp_runtime::protocol::AuditEntry;

use super::{Principal, Role};

/// The longest user or team name.
pub const MAX_NAME_BYTES: usize = 64;

/// The name of the first admin, created on a head's first start (and on the
/// first start of a head upgraded from a version without users).
pub const FIRST_ADMIN: &str = "admin";

/// Its team.
pub const FIRST_ADMIN_TEAM: &str = "admin";

/// Who the audit trail names for commands run on the head machine.
pub const HEAD_MACHINE: &str = "xp-head user (on the head machine)";

/// One user, as stored.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct UserRecord {
    /// Unique.
    pub name: String,
    /// Their team.
    pub team: String,
    /// Their role.
    pub role: Role,
    /// The keyed blake3 hash of their secret, in hex ([`secret_hash`]).
    pub secret_hash: String,
    /// When the user was added (or their secret last replaced).
    pub created_at: UnixMillis,
    /// When their credential was revoked, if it was.
    #[serde(default)]
    pub revoked_at: Option<UnixMillis>,
}

/// A user as `xp-head user list` shows it (no hash).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct UserView {
    /// The name.
    pub name: String,
    /// The team.
    pub team: String,
    /// The role.
    pub role: Role,
    /// When added.
    pub created_at: UnixMillis,
    /// Whether revoked.
    pub revoked: bool,
}

impl From<&UserRecord> for UserView {
    fn from(record: &UserRecord) -> Self {
        Self {
            name: record.name.clone(),
            team: record.team.clone(),
            role: record.role,
            created_at: record.created_at,
            revoked: record.revoked_at.is_some(),
        }
    }
}

/// A command on the user table.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "command", rename_all = "kebab-case")]
pub enum UserCommand {
    /// Add a user (or, with `replace`, give an existing one a new secret, team
    /// and role, which also lifts a revocation and cuts off the old secret).
    Add {
        /// The name.
        name: String,
        /// The team.
        team: String,
        /// The role.
        role: Role,
        /// Replace an existing user of that name.
        #[serde(default)]
        replace: bool,
    },
    /// Every user.
    List,
    /// Change a user's role.
    Role {
        /// The name.
        name: String,
        /// The new role.
        role: Role,
    },
    /// Revoke a user's credential; open connections holding it are closed.
    Revoke {
        /// The name.
        name: String,
    },
}

impl UserCommand {
    /// The audit entry of this command run on the head machine (through its
    /// socket or on a stopped head's database).
    pub fn audit_entry(&self, now: UnixMillis) -> AuditEntry {
        AuditEntry {
            seq: 0,
            at: now,
            who: HEAD_MACHINE.to_owned(),
            action: self.describe(),
            allowed: true,
            detail: "run by the operating-system user of the head's data directory".to_owned(),
        }
    }

    /// In words, for the audit trail.
    pub fn describe(&self) -> String {
        match self {
            Self::Add {
                name,
                team,
                role,
                replace,
            } => format!(
                "user {} {name} (team {team}, role {role})",
                if *replace { "replace" } else { "add" }
            ),
            Self::List => "user list".to_owned(),
            Self::Role { name, role } => format!("user role {name} {role}"),
            Self::Revoke { name } => format!("user revoke {name}"),
        }
    }

    /// Whether it changes the table.
    pub fn changes(&self) -> bool {
        !matches!(self, Self::List)
    }
}

/// A secret shown once: its `Debug` hides it.
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Secret(pub String);

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Secret(<redacted>)")
    }
}

/// The answer to a [`UserCommand`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "answer", rename_all = "kebab-case")]
pub enum UserAnswer {
    /// A user was added: their credential string, shown once.
    Added {
        /// The user.
        user: UserView,
        /// The credential (`xp://HOST:PORT?token=SECRET&ca=…`).
        credential: Secret,
    },
    /// Every user.
    List {
        /// The users, by name.
        users: Vec<UserView>,
    },
    /// A user's role changed or their credential was revoked.
    Changed {
        /// The user as they are now.
        user: UserView,
    },
}

/// Why a user command failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum UserError {
    /// The name is taken.
    #[error("user {name} exists already (add --replace to give them a new credential)")]
    Exists {
        /// The name.
        name: String,
    },
    /// No such user.
    #[error("no user {name}")]
    NotFound {
        /// The name.
        name: String,
    },
    /// A name or team is not usable.
    #[error(
        "invalid {field} {value:?}: use 1 to {MAX_NAME_BYTES} letters, digits, '.', '_' or '-'"
    )]
    InvalidName {
        /// `name` or `team`.
        field: &'static str,
        /// What was given.
        value: String,
    },
    /// The operating system gave no randomness for a secret.
    #[error("cannot draw a random secret from the operating system")]
    NoEntropy,
    /// Already revoked.
    #[error("user {name} is revoked already")]
    AlreadyRevoked {
        /// The name.
        name: String,
    },
}

/// Why a presented credential is not accepted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Unknown {
    /// No user has it.
    NoSuchSecret,
    /// Its user was revoked.
    Revoked,
}

/// The keyed hash a user's secret is stored as.
pub fn secret_hash(secret: &str) -> [u8; 32] {
    blake3::keyed_hash(
        &blake3::derive_key("xp user secret v1", b""),
        secret.as_bytes(),
    )
    .into()
}

fn check_name(field: &'static str, value: &str) -> Result<(), UserError> {
    let good = !value.is_empty()
        && value.len() <= MAX_NAME_BYTES
        && value
            .chars()
            .all(|ch| ch.is_ascii_alphanumeric() || matches!(ch, '.' | '_' | '-'));
    if good {
        Ok(())
    } else {
        Err(UserError::InvalidName {
            field,
            value: value.chars().take(MAX_NAME_BYTES + 1).collect(),
        })
    }
}

/// A planned change: the records to store, and what to answer once stored.
#[derive(Debug)]
pub struct Plan {
    /// The changed users, to store before [`Users::apply`].
    pub records: Vec<UserRecord>,
    /// The answer, without the credential string (the caller knows the address).
    pub answer: PlannedAnswer,
}

/// What a plan answers once stored.
#[derive(Debug)]
pub enum PlannedAnswer {
    /// Added: the user and their secret.
    Added(UserView, Secret),
    /// Listed.
    List(Vec<UserView>),
    /// Changed.
    Changed(UserView),
}

/// The user table in memory.
#[derive(Debug, Default, Clone)]
pub struct Users {
    by_name: BTreeMap<String, UserRecord>,
    /// Active (unrevoked) users by their secret's hash.
    by_hash: BTreeMap<[u8; 32], String>,
}

impl Users {
    /// The table of `records` (as loaded).
    pub fn from_records(records: Vec<UserRecord>) -> Self {
        let mut users = Self::default();
        users.apply(records);
        users
    }

    /// Whether there is no user at all (a fresh or upgraded head).
    pub fn is_empty(&self) -> bool {
        self.by_name.is_empty()
    }

    /// The user holding the secret whose hash is `hash`.
    pub fn identify(&self, hash: &[u8; 32]) -> Result<&UserRecord, Unknown> {
        match self.by_hash.get(hash) {
            Some(name) => Ok(&self.by_name[name]),
            None => {
                let revoked = self
                    .by_name
                    .values()
                    .any(|user| user.revoked_at.is_some() && hash_matches(user, hash));
                Err(if revoked {
                    Unknown::Revoked
                } else {
                    Unknown::NoSuchSecret
                })
            }
        }
    }

    /// The principal of a connection that authenticated as `name` with the
    /// secret hashing to `hash`, as the table has them now: `None` once the
    /// user was revoked, removed or given another secret.
    pub fn principal(&self, name: &str, hash: &[u8; 32]) -> Option<Principal> {
        let user = self.by_name.get(name)?;
        (user.revoked_at.is_none() && hash_matches(user, hash)).then(|| Principal::User {
            name: user.name.clone(),
            team: user.team.clone(),
            role: user.role,
        })
    }

    /// What `command` would change, drawing a secret with `secret` when it adds one.
    pub fn plan(
        &self,
        now: UnixMillis,
        command: &UserCommand,
        secret: impl FnOnce() -> Result<String, UserError>,
    ) -> Result<Plan, UserError> {
        match command {
            UserCommand::Add {
                name,
                team,
                role,
                replace,
            } => {
                check_name("name", name)?;
                check_name("team", team)?;
                if self.by_name.contains_key(name) && !replace {
                    return Err(UserError::Exists { name: name.clone() });
                }
                let secret = secret()?;
                let record = UserRecord {
                    name: name.clone(),
                    team: team.clone(),
                    role: *role,
                    secret_hash: hex::encode(secret_hash(&secret)),
                    created_at: now,
                    revoked_at: None,
                };
                Ok(Plan {
                    answer: PlannedAnswer::Added(UserView::from(&record), Secret(secret)),
                    records: vec![record],
                })
            }
            UserCommand::List => Ok(Plan {
                records: Vec::new(),
                answer: PlannedAnswer::List(self.by_name.values().map(UserView::from).collect()),
            }),
            UserCommand::Role { name, role } => {
                let mut record = self.get(name)?.clone();
                record.role = *role;
                Ok(Plan {
                    answer: PlannedAnswer::Changed(UserView::from(&record)),
                    records: vec![record],
                })
            }
            UserCommand::Revoke { name } => {
                let mut record = self.get(name)?.clone();
                if record.revoked_at.is_some() {
                    return Err(UserError::AlreadyRevoked { name: name.clone() });
                }
                record.revoked_at = Some(now);
                Ok(Plan {
                    answer: PlannedAnswer::Changed(UserView::from(&record)),
                    records: vec![record],
                })
            }
        }
    }

    fn get(&self, name: &str) -> Result<&UserRecord, UserError> {
        self.by_name.get(name).ok_or_else(|| UserError::NotFound {
            name: name.to_owned(),
        })
    }

    /// Takes stored records into the table.
    pub fn apply(&mut self, records: Vec<UserRecord>) {
        for record in records {
            if let Some(old) = self.by_name.get(&record.name)
                && let Some(old_hash) = decode_hash(&old.secret_hash)
            {
                self.by_hash.remove(&old_hash);
            }
            if record.revoked_at.is_none()
                && let Some(hash) = decode_hash(&record.secret_hash)
            {
                self.by_hash.insert(hash, record.name.clone());
            }
            self.by_name.insert(record.name.clone(), record);
        }
    }
}

fn decode_hash(text: &str) -> Option<[u8; 32]> {
    hex::decode(text).ok()?.try_into().ok()
}

fn hash_matches(user: &UserRecord, hash: &[u8; 32]) -> bool {
    // Compared as blake3 hashes, whose equality is constant-time.
    decode_hash(&user.secret_hash)
        .is_some_and(|stored| blake3::Hash::from(stored) == blake3::Hash::from(*hash))
}

/// The answer to a planned command once stored, with the credential string
/// built from the head's node join string (`join`), whose token it replaces.
pub fn answer(planned: PlannedAnswer, join: &xp_runtime::join::JoinString) -> UserAnswer {
    match planned {
        PlannedAnswer::Added(user, secret) => {
            let credential = xp_runtime::join::JoinString {
                token: secret.0,
                ..join.clone()
            };
            UserAnswer::Added {
                user,
                credential: Secret(credential.to_string()),
            }
        }
        PlannedAnswer::List(users) => UserAnswer::List { users },
        PlannedAnswer::Changed(user) => UserAnswer::Changed { user },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn add(name: &str, role: Role) -> UserCommand {
        UserCommand::Add {
            name: name.to_owned(),
            team: "vision".to_owned(),
            role,
            replace: false,
        }
    }

    fn run(users: &mut Users, command: &UserCommand, secret: &str) -> PlannedAnswer {
        let plan = users.plan(5, command, || Ok(secret.to_owned())).unwrap();
        users.apply(plan.records);
        plan.answer
    }

    #[test]
    fn add_identify_role_revoke_and_replace() {
        let mut users = Users::default();
        assert!(users.is_empty());
        run(&mut users, &add("ana", Role::Member), "s1");
        let hash = secret_hash("s1");
        assert_eq!(users.identify(&hash).unwrap().name, "ana");
        assert_eq!(
            users.principal("ana", &hash),
            Some(Principal::User {
                name: "ana".to_owned(),
                team: "vision".to_owned(),
                role: Role::Member
            })
        );
        assert_eq!(
            users
                .plan(5, &add("ana", Role::Viewer), || Ok("x".to_owned()))
                .unwrap_err(),
            UserError::Exists {
                name: "ana".to_owned()
            }
        );
        run(
            &mut users,
            &UserCommand::Role {
                name: "ana".to_owned(),
                role: Role::Viewer,
            },
            "",
        );
        assert!(matches!(
            users.principal("ana", &hash),
            Some(Principal::User {
                role: Role::Viewer,
                ..
            })
        ));
        run(
            &mut users,
            &UserCommand::Revoke {
                name: "ana".to_owned(),
            },
            "",
        );
        assert_eq!(users.principal("ana", &hash), None);
        assert_eq!(users.identify(&hash).unwrap_err(), Unknown::Revoked);
        assert_eq!(
            users.identify(&secret_hash("nobody")).unwrap_err(),
            Unknown::NoSuchSecret
        );
        // A replacement lifts the revocation with a new secret; the old one stays out.
        let replace = UserCommand::Add {
            name: "ana".to_owned(),
            team: "nlp".to_owned(),
            role: Role::Member,
            replace: true,
        };
        run(&mut users, &replace, "s2");
        assert_eq!(users.principal("ana", &hash), None);
        assert_eq!(users.identify(&hash).unwrap_err(), Unknown::NoSuchSecret);
        assert!(users.principal("ana", &secret_hash("s2")).is_some());
        // Only the hash is kept.
        let PlannedAnswer::List(list) = run(&mut users, &UserCommand::List, "") else {
            panic!("a list")
        };
        assert_eq!(list.len(), 1);
        assert!(!format!("{users:?}").contains("s2"));
    }

    #[test]
    fn bad_names_are_refused() {
        let users = Users::default();
        for bad in ["", "a b", "../x", &"n".repeat(65)] {
            let error = users
                .plan(1, &add(bad, Role::Member), || Ok("s".to_owned()))
                .unwrap_err();
            assert!(matches!(error, UserError::InvalidName { .. }), "{error}");
        }
    }

    #[test]
    fn the_credential_is_the_join_string_with_the_users_secret() {
        let join: xp_runtime::join::JoinString = format!(
            "xp://head:7700?token={}&ca={}",
            "a".repeat(64),
            "b".repeat(64)
        )
        .parse()
        .unwrap();
        let answer = answer(
            PlannedAnswer::Added(
                UserView {
                    name: "ana".to_owned(),
                    team: "t".to_owned(),
                    role: Role::Member,
                    created_at: 0,
                    revoked: false,
                },
                Secret("c".repeat(64)),
            ),
            &join,
        );
        let UserAnswer::Added { credential, .. } = &answer else {
            panic!("added")
        };
        let parsed: xp_runtime::join::JoinString = credential.0.parse().unwrap();
        assert_eq!(parsed.token, "c".repeat(64));
        assert_eq!((parsed.host.as_str(), parsed.port), ("head", 7700));
        assert!(!format!("{answer:?}").contains(&"c".repeat(64)));
    }
}
