//! Rendezvous ports held for the attempts they are handed to: a root node
//! binds every port the head hands out as `MASTER_PORT` (29500-29999, as
//! `xp_head_core`'s `MasterPorts` does) from its start, so no worker, of any
//! trial, can take one first; each is let go just before the rank 0 it was
//! handed to starts, and taken back once that rank is gone.
//!
//! A held port is a TCP socket bound to every address (`[::]`, dual-stack, or
//! `0.0.0.0` without IPv6), not listening, so a rank that dials it early is
//! refused and retries, with `SO_REUSEPORT` and without `SO_REUSEADDR`: the
//! kernel then refuses any other bind of the port, except by a socket that
//! also asks for `SO_REUSEPORT` and belongs to the same user id (the node's:
//! root). Several nodes on one machine all hold the range that way; the one
//! whose rank 0 gets a port leaves a marker in [`MARKER_DIR`], every node lets
//! the marked port go within [`POLL`], and the rank starts once nobody holds
//! it. PyTorch's `env://` rendezvous binds `MASTER_PORT` itself (with
//! `SO_REUSEADDR` only), so the port must be free when rank 0 binds it: it is
//! let go as late as the node can know, just before rank 0's process starts,
//! and a co-tenant could take it only by binding that very port in the moments
//! between (a squatter that bound the range beforehand holds none of it).
//! A port whose rank 0 has ended is taken back at once, or, while that rank's
//! closed connections linger in `TIME_WAIT` (up to a minute), as soon as the
//! kernel lets it.
//!
//! Not here: which port an attempt gets (the head decides), and nodes not
//! running as root (their workers share the node's user id anyway).
//!
//! Invariant: a port of the range is bound by this node unless a marker names
//! it (a live node's rank 0 holds it), or something else held it first.

use std::collections::{BTreeMap, BTreeSet};
use std::ops::RangeInclusive;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError, Weak};
use std::time::Duration;

use tracing::{debug, info, warn};

/// The ports the head hands out as `MASTER_PORT`.
pub(crate) const MASTER_PORTS: RangeInclusive<u16> = 29_500..=29_999;

/// Where nodes on one machine mark the ports their rank 0s were handed.
pub(crate) const MARKER_DIR: &str = "/run/xp-node/ports";

/// How often a node looks for ports other nodes' rank 0s need.
pub(crate) const POLL: Duration = Duration::from_millis(200);

/// How long a rank 0 waits, at most, for the other nodes to let its port go.
const HANDOVER_WAIT: Duration = Duration::from_secs(5);

/// The ports this node holds.
#[derive(Debug)]
pub(crate) struct PortHold {
    range: RangeInclusive<u16>,
    marker_dir: PathBuf,
    state: Mutex<HoldState>,
    poller: Mutex<Option<tokio::task::JoinHandle<()>>>,
}

#[derive(Debug, Default)]
struct HoldState {
    /// The sockets holding ports.
    held: BTreeMap<u16, OwnedFd>,
    /// Ports handed to this node's rank 0s (their markers are this node's).
    handed: BTreeSet<u16>,
}

impl PortHold {
    /// Holds every free port of `range`, marking handed ports in `marker_dir`
    /// (made 0700), and keeps the holdings in step with the markers every
    /// [`POLL`] (in a task of the current runtime, which ends with the hold).
    pub(crate) fn start(
        range: RangeInclusive<u16>,
        marker_dir: &Path,
    ) -> std::io::Result<Arc<Self>> {
        use std::os::unix::fs::DirBuilderExt;
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(marker_dir)?;
        let hold = Arc::new(Self {
            range: range.clone(),
            marker_dir: marker_dir.to_owned(),
            state: Mutex::new(HoldState::default()),
            poller: Mutex::new(None),
        });
        hold.sync();
        let held = hold.state().held.len();
        let total = range.clone().count();
        if held < total {
            warn!(
                held,
                total,
                first = range.start(),
                last = range.end(),
                "some rendezvous ports are held by other programs; trials handed them may fail to rendezvous"
            );
        }
        info!(
            held,
            first = range.start(),
            last = range.end(),
            "rendezvous ports held until their rank 0s start"
        );
        let weak = Arc::downgrade(&hold);
        let poller = xp_runtime::task::spawn("rendezvous-ports", poll(weak));
        *hold.poller.lock().unwrap_or_else(PoisonError::into_inner) = Some(poller);
        Ok(hold)
    }

    fn state(&self) -> std::sync::MutexGuard<'_, HoldState> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Brings the holdings in step with the markers: lets marked ports go,
    /// removes markers of nodes that are gone, and binds every other port of
    /// the range not yet held (those some other program holds stay unheld
    /// until it lets them go).
    fn sync(&self) {
        let marked = live_markers(&self.marker_dir);
        let mut state = self.state();
        state.held.retain(|port, _| !marked.contains(port));
        for port in self.range.clone() {
            if marked.contains(&port)
                || state.handed.contains(&port)
                || state.held.contains_key(&port)
            {
                continue;
            }
            if let Ok(socket) = hold_port(port) {
                state.held.insert(port, socket);
            }
        }
    }

    /// Lets `port` go for this node's rank 0 and waits (within
    /// [`HANDOVER_WAIT`]) until no node on the machine holds it; the lease takes
    /// it back when dropped. `None` for a port outside the range.
    pub(crate) async fn hand_over(self: &Arc<Self>, port: u16) -> Option<PortLease> {
        if !self.range.contains(&port) {
            return None;
        }
        if let Err(error) = write_marker(&self.marker_dir, port) {
            warn!(port, %error, "cannot mark a rendezvous port for the other nodes of this machine");
        }
        {
            let mut state = self.state();
            state.handed.insert(port);
            state.held.remove(&port);
        }
        let lease = PortLease {
            hold: self.clone(),
            port,
        };
        let deadline = tokio::time::Instant::now() + HANDOVER_WAIT;
        while !is_free(port) {
            if tokio::time::Instant::now() >= deadline {
                warn!(
                    port,
                    "a rendezvous port is still held elsewhere; rank 0 starts anyway"
                );
                break;
            }
            tokio::time::sleep(POLL / 4).await;
        }
        debug!(port, "rendezvous port handed to rank 0");
        Some(lease)
    }

    /// Takes `port` back from a rank 0 that is gone.
    fn take_back(&self, port: u16) {
        remove_marker(&self.marker_dir, port);
        let mut state = self.state();
        state.handed.remove(&port);
        if !state.held.contains_key(&port)
            && let Ok(socket) = hold_port(port)
        {
            state.held.insert(port, socket);
        }
    }

    #[cfg(test)]
    /// Whether this node holds `port`.
    pub(crate) fn holds(&self, port: u16) -> bool {
        self.state().held.contains_key(&port)
    }
}

impl Drop for PortHold {
    fn drop(&mut self) {
        if let Some(poller) = self
            .poller
            .get_mut()
            .unwrap_or_else(PoisonError::into_inner)
            .take()
        {
            poller.abort();
        }
        for port in std::mem::take(&mut self.state().handed) {
            remove_marker(&self.marker_dir, port);
        }
    }
}

/// Keeps a hold in step with the markers until the hold is dropped.
async fn poll(hold: Weak<PortHold>) {
    loop {
        tokio::time::sleep(POLL).await;
        let Some(hold) = hold.upgrade() else {
            return;
        };
        // A few hundred binds at most, and reading one small directory.
        let _ = tokio::task::spawn_blocking(move || hold.sync()).await;
    }
}

/// A port handed to this node's rank 0; taken back when dropped (once the rank
/// is gone).
#[derive(Debug)]
pub(crate) struct PortLease {
    hold: Arc<PortHold>,
    port: u16,
}

impl Drop for PortLease {
    fn drop(&mut self) {
        self.hold.take_back(self.port);
    }
}

/// The ports marked by live nodes; markers of nodes that are gone are removed.
fn live_markers(dir: &Path) -> BTreeSet<u16> {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return BTreeSet::new();
    };
    let mut marked = BTreeSet::new();
    for entry in entries.flatten() {
        let Some(port) = entry
            .file_name()
            .to_str()
            .and_then(|name| name.parse::<u16>().ok())
        else {
            continue;
        };
        let pid = std::fs::read_to_string(entry.path())
            .ok()
            .and_then(|text| parse_marker(&text));
        // Markers are written whole (renamed into place), so one that names
        // no live process is a gone node's.
        match pid {
            Some(pid) if alive(pid) => {
                marked.insert(port);
            }
            _ => {
                let _ = std::fs::remove_file(entry.path());
            }
        }
    }
    marked
}

/// The process id a marker's `text` names.
pub(crate) fn parse_marker(text: &str) -> Option<i32> {
    text.trim().parse().ok().filter(|pid| *pid > 0)
}

fn alive(pid: i32) -> bool {
    !matches!(
        nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), None),
        Err(nix::errno::Errno::ESRCH)
    )
}

/// Marks `port` as this process's rank 0's.
fn write_marker(dir: &Path, port: u16) -> std::io::Result<()> {
    let path = dir.join(port.to_string());
    let temporary = dir.join(format!(".{port}.{}", std::process::id()));
    std::fs::write(&temporary, format!("{}\n", std::process::id()))?;
    std::fs::rename(&temporary, path)
}

/// Removes the marker of `port` if this process wrote it.
fn remove_marker(dir: &Path, port: u16) {
    let path = dir.join(port.to_string());
    let mine = std::fs::read_to_string(&path)
        .ok()
        .and_then(|text| parse_marker(&text))
        == Some(std::process::id() as i32);
    if mine {
        let _ = std::fs::remove_file(path);
    }
}

/// A socket holding `port` on every address (see the module docs).
fn hold_port(port: u16) -> std::io::Result<OwnedFd> {
    match bind(libc::AF_INET6, port, libc::SO_REUSEPORT) {
        Err(error) if error.raw_os_error() == Some(libc::EAFNOSUPPORT) => {
            bind(libc::AF_INET, port, libc::SO_REUSEPORT)
        }
        held => held,
    }
}

/// Whether rank 0 could bind `port` now, as PyTorch's store does (with
/// `SO_REUSEADDR`): nobody holds it, though the closed connections of its
/// last rank 0 may linger in `TIME_WAIT`, which no rank 0 waits for.
fn is_free(port: u16) -> bool {
    match bind(libc::AF_INET6, port, libc::SO_REUSEADDR) {
        Err(error) if error.raw_os_error() == Some(libc::EAFNOSUPPORT) => {
            bind(libc::AF_INET, port, libc::SO_REUSEADDR).is_ok()
        }
        bound => bound.is_ok(),
    }
}

/// A TCP socket of `family` bound to the any address and `port`, with the
/// socket option `reuse` set (`SO_REUSEPORT` or `SO_REUSEADDR`); for IPv6
/// dual-stack.
fn bind(family: libc::c_int, port: u16, reuse: libc::c_int) -> std::io::Result<OwnedFd> {
    let check = |result: libc::c_int| {
        if result < 0 {
            Err(std::io::Error::last_os_error())
        } else {
            Ok(result)
        }
    };
    let one: libc::c_int = 1;
    let zero: libc::c_int = 0;
    let int_len = size_of::<libc::c_int>() as libc::socklen_t;
    // SAFETY: socket(2), setsockopt(2) and bind(2) on a descriptor this
    // function owns, with option values and addresses of the sizes passed.
    unsafe {
        let socket = OwnedFd::from_raw_fd(check(libc::socket(
            family,
            libc::SOCK_STREAM | libc::SOCK_CLOEXEC,
            0,
        ))?);
        let fd = socket.as_raw_fd();
        check(libc::setsockopt(
            fd,
            libc::SOL_SOCKET,
            reuse,
            (&raw const one).cast(),
            int_len,
        ))?;
        if family == libc::AF_INET6 {
            check(libc::setsockopt(
                fd,
                libc::IPPROTO_IPV6,
                libc::IPV6_V6ONLY,
                (&raw const zero).cast(),
                int_len,
            ))?;
            let mut address: libc::sockaddr_in6 = std::mem::zeroed();
            address.sin6_family = libc::AF_INET6 as libc::sa_family_t;
            address.sin6_port = port.to_be();
            check(libc::bind(
                fd,
                (&raw const address).cast(),
                size_of::<libc::sockaddr_in6>() as libc::socklen_t,
            ))?;
        } else {
            let mut address: libc::sockaddr_in = std::mem::zeroed();
            address.sin_family = libc::AF_INET as libc::sa_family_t;
            address.sin_port = port.to_be();
            check(libc::bind(
                fd,
                (&raw const address).cast(),
                size_of::<libc::sockaddr_in>() as libc::socklen_t,
            ))?;
        }
        Ok(socket)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Ports no other test nor node here uses.
    const PORTS: RangeInclusive<u16> = 28_711..=28_714;
    /// One more, for the `TIME_WAIT` test alone.
    const LINGERING: u16 = 28_715;

    #[test]
    fn a_port_whose_connections_linger_in_time_wait_is_free_for_rank_0() {
        let listener = std::net::TcpListener::bind(("127.0.0.1", LINGERING)).expect("listen");
        let client = std::net::TcpStream::connect(("127.0.0.1", LINGERING)).expect("connect");
        let (served, _) = listener.accept().expect("accept");
        // The side that closes first keeps the port's connection in TIME_WAIT.
        drop(served);
        drop(listener);
        drop(client);
        assert!(is_free(LINGERING), "TIME_WAIT does not keep rank 0 out");
    }

    fn binds(address: &str) -> bool {
        std::net::TcpListener::bind(address).is_ok()
    }

    #[test]
    fn markers_name_a_live_process() {
        assert_eq!(parse_marker("1234\n"), Some(1234));
        assert_eq!(parse_marker(" 7 "), Some(7));
        assert_eq!(parse_marker(""), None);
        assert_eq!(parse_marker("0"), None);
        assert_eq!(parse_marker("-5"), None);
        assert_eq!(parse_marker("a pid"), None);
        assert!(alive(std::process::id() as i32));
    }

    #[tokio::test]
    async fn held_ports_refuse_every_bind_until_handed_over_and_come_back() {
        let markers = tempfile::tempdir().expect("tempdir");
        let hold = PortHold::start(PORTS, markers.path()).expect("hold");
        let port = *PORTS.start();
        assert!(hold.holds(port));
        for address in [
            format!("0.0.0.0:{port}"),
            format!("127.0.0.1:{port}"),
            format!("[::]:{port}"),
            format!("[::1]:{port}"),
        ] {
            assert!(!binds(&address), "{address} is held");
        }
        // A second node on the machine holds the same range beside it.
        let other_markers = markers.path().to_owned();
        let second = PortHold::start(PORTS, &other_markers).expect("a second hold");
        assert!(second.holds(port));
        let lease = hold.hand_over(port).await.expect("in the range");
        assert!(!hold.holds(port) && !second.holds(port), "both let it go");
        let rank0 = std::net::TcpListener::bind(format!("[::]:{port}")).expect("rank 0 binds it");
        assert!(markers.path().join(port.to_string()).exists());
        drop(rank0);
        drop(lease);
        assert!(hold.holds(port), "taken back");
        assert!(!markers.path().join(port.to_string()).exists());
        assert!(hold.hand_over(29_499).await.is_none(), "outside the range");
        drop(second);
    }

    /// As root: a socket of another user id cannot join the node's holding
    /// with SO_REUSEPORT either.
    #[tokio::test]
    #[expect(clippy::print_stderr, reason = "say why the test is skipped")]
    async fn another_user_cannot_share_a_held_port() {
        if !nix::unistd::geteuid().is_root() {
            eprintln!("skipped: only root can make a socket of another user id");
            return;
        }
        let markers = tempfile::tempdir().expect("tempdir");
        let hold = PortHold::start(28_721..=28_721, markers.path()).expect("hold");
        assert!(hold.holds(28_721));
        // A socket's owner is the file-system user id of the thread making it.
        let worker = super::super::as_worker::AsWorker::start(Some(
            super::super::fs::FileOwner::of_uid(1_899_000_631),
        ))
        .expect("thread");
        let joined = worker
            .run(|| hold_port(28_721).map_err(|error| error.raw_os_error()))
            .expect("ran");
        assert_eq!(joined.err(), Some(Some(libc::EADDRINUSE)));
        // Root itself may (another node's holding).
        assert!(hold_port(28_721).is_ok());
    }
}
