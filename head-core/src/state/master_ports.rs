//! The `MASTER_PORT`s handed out per host: what a gang's rank 0 listens on
//! for its rendezvous.
//!
//! Invariants: a port is held by at most one live attempt per host, and is
//! handed out again only after the attempt that held it ended; ports are handed
//! out in rotation through 29500–29999, so a retry never reuses the port that an
//! old rank 0, still being stopped, may hold.

use std::collections::{BTreeMap, BTreeSet};

use xp_runtime::clock::UnixMillis;

/// The first port handed out as `MASTER_PORT`, as torchrun does.
const FIRST_MASTER_PORT: u16 = 29500;
/// The last port handed out as `MASTER_PORT`.
const LAST_MASTER_PORT: u16 = 29999;

/// The `MASTER_PORT`s in use on each host, handed out in rotation.
#[derive(Debug, Default)]
pub(crate) struct MasterPorts {
    /// Ports held by live attempts, per host.
    in_use: BTreeMap<String, BTreeSet<u16>>,
    /// Where the next search starts, per host.
    cursor: BTreeMap<String, u16>,
    /// Where a host's first search starts (none: the range's first port).
    first: Option<u16>,
    /// Hosts found with every port taken since a port was last given back:
    /// a full host is said once, not on every pass that retries it.
    exhausted: BTreeSet<String>,
}

impl MasterPorts {
    /// Records a port a live attempt already holds (found in the registry at
    /// start); the rotation is not moved.
    pub(crate) fn mark_in_use(&mut self, host: &str, port: u16) {
        self.in_use.entry(host.to_owned()).or_default().insert(port);
    }

    /// Starts each host's rotation where the clock (`now`, in ms) puts it: a
    /// restarted head would otherwise hand out first the very ports its last
    /// life handed out last, whose closed connections may linger in TIME_WAIT
    /// for a minute, when nodes cannot hold them for their rank 0 and a
    /// co-tenant may bind them (`xp_node`'s rendezvous port hold).
    pub(crate) fn start_rotation_at(&mut self, now: UnixMillis) {
        let ports = u64::from(LAST_MASTER_PORT - FIRST_MASTER_PORT) + 1;
        let offset = u16::try_from(now / 1000 % ports).unwrap_or(0);
        self.first = Some(FIRST_MASTER_PORT + offset);
    }

    /// Takes the first free port on `host` at or after the one following the last
    /// handed out, wrapping around the range; `None` when every port is taken.
    pub(crate) fn reserve(&mut self, host: &str) -> Option<u16> {
        let used_ports = self.in_use.entry(host.to_owned()).or_default();
        let first = self.first.unwrap_or(FIRST_MASTER_PORT);
        let cursor = self.cursor.get(host).copied().unwrap_or(first);
        let port = (cursor..=LAST_MASTER_PORT)
            .chain(FIRST_MASTER_PORT..cursor)
            .find(|port| !used_ports.contains(port))?;
        used_ports.insert(port);
        let next = if port == LAST_MASTER_PORT {
            FIRST_MASTER_PORT
        } else {
            port + 1
        };
        self.cursor.insert(host.to_owned(), next);
        Some(port)
    }

    /// Gives a port back; the rotation goes on from where it was.
    pub(crate) fn release(&mut self, host: &str, port: u16) {
        if let Some(ports) = self.in_use.get_mut(host) {
            ports.remove(&port);
        }
        self.exhausted.remove(host);
    }

    /// Notes that `host` had no free port; true the first time since one was
    /// given back there.
    pub(crate) fn note_exhausted(&mut self, host: &str) -> bool {
        self.exhausted.insert(host.to_owned())
    }
}

#[cfg(test)]
mod tests {
    use super::{FIRST_MASTER_PORT, LAST_MASTER_PORT, MasterPorts};

    #[test]
    fn ports_rotate_per_host_and_wrap_around_the_range() {
        let mut ports = MasterPorts::default();
        assert_eq!(ports.reserve("a"), Some(FIRST_MASTER_PORT));
        assert_eq!(ports.reserve("a"), Some(FIRST_MASTER_PORT + 1));
        assert_eq!(
            ports.reserve("b"),
            Some(FIRST_MASTER_PORT),
            "hosts rotate apart"
        );
        ports.release("a", FIRST_MASTER_PORT);
        assert_eq!(
            ports.reserve("a"),
            Some(FIRST_MASTER_PORT + 2),
            "a released port is not handed out again at once"
        );
        let mut ports = MasterPorts::default();
        ports.mark_in_use("a", FIRST_MASTER_PORT);
        assert_eq!(ports.reserve("a"), Some(FIRST_MASTER_PORT + 1));
    }

    #[test]
    fn a_restarted_head_starts_its_rotation_where_the_clock_puts_it() {
        let mut ports = MasterPorts::default();
        ports.start_rotation_at(1_800_000_123_999);
        let second = 1_800_000_123 % 500;
        let first = FIRST_MASTER_PORT + u16::try_from(second).unwrap();
        assert_eq!(ports.reserve("a"), Some(first));
        assert_eq!(ports.reserve("b"), Some(first));
        ports.start_rotation_at(499_000);
        assert_eq!(ports.reserve("c"), Some(LAST_MASTER_PORT));
        assert_eq!(ports.reserve("c"), Some(FIRST_MASTER_PORT), "and wraps");
    }

    #[test]
    fn a_host_runs_out_of_ports_only_when_all_are_held() {
        let mut ports = MasterPorts::default();
        let count = usize::from(LAST_MASTER_PORT - FIRST_MASTER_PORT) + 1;
        for _ in 0..count {
            assert!(ports.reserve("a").is_some());
        }
        assert_eq!(ports.reserve("a"), None);
        assert!(ports.note_exhausted("a"), "said the first time");
        assert!(!ports.note_exhausted("a"), "not on every retry");
        ports.release("a", FIRST_MASTER_PORT + 7);
        assert!(
            ports.note_exhausted("a"),
            "said again once a port came back"
        );
        assert_eq!(ports.reserve("a"), Some(FIRST_MASTER_PORT + 7));
    }
}
