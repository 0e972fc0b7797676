//! Driver sessions: the connected drivers that store objects, the
//! experiments each submitted, whose trials may read what it stored, and the
//! user and team each asked an object capability as (its team's other
//! sessions may read what it stored).
//!
//! Soft state: nothing here is persisted. A head that restarts forgets every
//! session (their connections ended with it); a core rebuilt after a failed
//! commit keeps them (`DriverSessions::clone` in `HeadCore::rebuild`), since
//! the sessions are still connected to this head.
//!
//! Invariant: a session that ended is forgotten whole (`end`), so an object it
//! stored is never kept for it again and no trial reads it through it.

use std::collections::{BTreeMap, BTreeSet};

use xp_runtime::ids::ExperimentId;

/// The connected driver sessions that stored objects or submitted experiments.
#[derive(Debug, Default, Clone)]
pub(crate) struct DriverSessions {
    /// Sessions that asked where to store objects and are still connected.
    storing: BTreeSet<String>,
    /// The experiments each connected session submitted.
    experiments: BTreeMap<String, BTreeSet<ExperimentId>>,
    /// The user and team of each session that asked an object capability.
    owners: BTreeMap<String, (String, String)>,
}

impl DriverSessions {
    /// `session` asked where to store objects: what it stores is kept while it
    /// is connected.
    pub(crate) fn storing(&mut self, session: &str) {
        self.storing.insert(session.to_owned());
    }

    /// `session` submitted `experiment`.
    pub(crate) fn submitted(&mut self, session: &str, experiment: ExperimentId) {
        self.experiments
            .entry(session.to_owned())
            .or_default()
            .insert(experiment);
    }

    /// Whether `session` is connected and storing objects.
    pub(crate) fn is_live(&self, session: &str) -> bool {
        self.storing.contains(session)
    }

    /// Whether `session` submitted `experiment` and is still connected.
    pub(crate) fn shares_with(&self, session: &str, experiment: ExperimentId) -> bool {
        self.experiments
            .get(session)
            .is_some_and(|experiments| experiments.contains(&experiment))
    }

    /// `session` asked an object capability as `user` of `team`.
    pub(crate) fn identified(&mut self, session: &str, user: &str, team: &str) {
        self.owners
            .insert(session.to_owned(), (user.to_owned(), team.to_owned()));
    }

    /// The connected sessions of `team`'s users.
    pub(crate) fn of_team<'a>(&'a self, team: &'a str) -> impl Iterator<Item = &'a str> + 'a {
        self.owners
            .iter()
            .filter(move |(_, (_, owner_team))| owner_team == team)
            .map(|(session, _)| session.as_str())
    }

    /// The experiments `session` submitted while connected.
    pub(crate) fn submitted_by<'a>(
        &'a self,
        session: &str,
    ) -> impl Iterator<Item = ExperimentId> + 'a {
        self.experiments.get(session).into_iter().flatten().copied()
    }

    /// The connected sessions that submitted `experiment`.
    pub(crate) fn sharing<'a>(
        &'a self,
        experiment: ExperimentId,
    ) -> impl Iterator<Item = &'a str> + 'a {
        self.experiments
            .iter()
            .filter(move |(_, experiments)| experiments.contains(&experiment))
            .map(|(session, _)| session.as_str())
    }

    /// `session` ended.
    pub(crate) fn end(&mut self, session: &str) {
        self.storing.remove(session);
        self.experiments.remove(session);
        self.owners.remove(session);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_session_shares_what_it_submitted_until_it_ends() {
        let experiment = ExperimentId::from_content_hash(&[1; 32], 1);
        let other = ExperimentId::from_content_hash(&[2; 32], 1);
        let mut drivers = DriverSessions::default();
        drivers.storing("s1");
        drivers.submitted("s1", experiment);
        drivers.submitted("s2", other);
        assert!(drivers.is_live("s1"));
        assert!(!drivers.is_live("s2"), "s2 never asked where to store");
        assert!(drivers.shares_with("s1", experiment));
        assert!(!drivers.shares_with("s1", other));
        drivers.end("s1");
        assert!(!drivers.is_live("s1"));
        assert!(!drivers.shares_with("s1", experiment));
        assert!(drivers.shares_with("s2", other));
    }

    #[test]
    fn a_teams_sessions_and_an_experiments_sharers_are_those_still_connected() {
        let experiment = ExperimentId::from_content_hash(&[1; 32], 1);
        let mut drivers = DriverSessions::default();
        drivers.identified("s1", "alice", "alpha");
        drivers.identified("s2", "bob", "beta");
        drivers.identified("s3", "carol", "alpha");
        drivers.submitted("s1", experiment);
        drivers.submitted("s2", experiment);
        assert_eq!(drivers.of_team("alpha").collect::<Vec<_>>(), ["s1", "s3"]);
        assert_eq!(
            drivers.sharing(experiment).collect::<Vec<_>>(),
            ["s1", "s2"]
        );
        assert_eq!(drivers.submitted_by("s1").collect::<Vec<_>>(), [experiment]);
        drivers.end("s1");
        assert_eq!(drivers.of_team("alpha").collect::<Vec<_>>(), ["s3"]);
        assert_eq!(drivers.sharing(experiment).collect::<Vec<_>>(), ["s2"]);
        assert_eq!(drivers.submitted_by("s1").count(), 0);
    }
}
