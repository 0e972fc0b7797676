//! The object server's TCP bulk port: whole objects as raw bytes to whoever
//! presents a ticket the object link issued (`ObjectOp::Bulk`), once, within
//! [`TICKET_LIFETIME`].
//!
//! The port is open to anyone who can reach the node, a member's trial on it
//! included, so it reads nothing but 32 bytes of ticket per connection, under a
//! deadline, from at most [`MAX_CONNECTIONS`] connections at once, and answers
//! a ticket it did not issue by closing. Tickets are issued only after the
//! request's credential and access were checked like a QUIC fetch's, at most
//! [`MAX_TICKETS`] outstanding.

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, Mutex, PoisonError};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Semaphore;
use tokio::time::Instant;
use tracing::{debug, info};
use xp_runtime::object_wire::{BulkTicket, IDLE_TIMEOUT, TICKET_LIFETIME, TICKET_WAIT};

use super::super::ObjectBytes;
use super::super::access::ObjectAccess;

/// The most tickets outstanding; a request beyond them is told to use QUIC.
const MAX_TICKETS: usize = 256;
/// The most bulk connections served at once; more are closed on arrival.
pub(super) const MAX_CONNECTIONS: usize = 64;
/// The most bytes handed to the socket per write, each under [`IDLE_TIMEOUT`].
const WRITE_BYTES: usize = 4 << 20;

/// What a ticket sends.
pub(super) enum Payload {
    /// A disk object's file, sent by the kernel (`sendfile`): no copy through
    /// this process and no page faults on a map of it.
    File {
        /// The file, open for reading.
        file: std::fs::File,
        /// Its length.
        size: u64,
    },
    /// An object in memory.
    Bytes(ObjectBytes),
}

impl Payload {
    /// The bytes it sends.
    pub(super) fn size(&self) -> u64 {
        match self {
            Self::File { size, .. } => *size,
            Self::Bytes(bytes) => bytes.len() as u64,
        }
    }
}

/// An issued ticket's object and who it is counted for.
struct Issued {
    payload: Payload,
    team: Option<String>,
    expires: Instant,
}

/// The outstanding tickets, shared by the port and its connections.
type Tickets = Arc<Mutex<HashMap<BulkTicket, Issued>>>;

/// The bound port and its outstanding tickets.
pub(super) struct BulkPort {
    port: u16,
    tickets: Tickets,
    accepting: tokio::task::JoinHandle<()>,
}

impl BulkPort {
    /// Listens on `ip`, on port `preferred` (the object link's UDP port, so
    /// one number serves both) or any free one if that is taken.
    pub(super) fn start(
        ip: IpAddr,
        preferred: u16,
        access: Arc<ObjectAccess>,
    ) -> std::io::Result<Self> {
        let listener = match std::net::TcpListener::bind(SocketAddr::new(ip, preferred)) {
            Ok(listener) => listener,
            Err(error) => {
                info!(port = preferred, %error, "object bulk port taken; binding any port");
                std::net::TcpListener::bind(SocketAddr::new(ip, 0))?
            }
        };
        listener.set_nonblocking(true)?;
        let port = listener.local_addr()?.port();
        let listener = TcpListener::from_std(listener)?;
        let tickets = Tickets::default();
        let accepting = xp_runtime::task::spawn(
            "object-bulk-port",
            accept(listener, tickets.clone(), access),
        );
        Ok(Self {
            port,
            tickets,
            accepting,
        })
    }

    /// The TCP port.
    pub(super) fn port(&self) -> u16 {
        self.port
    }

    /// A ticket for `payload`, counted for `team` once served; why not while
    /// [`MAX_TICKETS`] are outstanding or the system has no entropy.
    pub(super) fn issue(
        &self,
        payload: Payload,
        team: Option<&str>,
    ) -> Result<BulkTicket, &'static str> {
        let now = Instant::now();
        let mut tickets = self.tickets.lock().unwrap_or_else(PoisonError::into_inner);
        tickets.retain(|_, issued| issued.expires > now);
        if tickets.len() >= MAX_TICKETS {
            return Err("the bulk port has too many tickets out");
        }
        let secret = xp_runtime::tls::random_secret().ok_or("no entropy for a bulk ticket")?;
        let ticket = BulkTicket(secret);
        let issued = Issued {
            payload,
            team: team.map(str::to_owned),
            expires: now + TICKET_LIFETIME,
        };
        tickets.insert(ticket.clone(), issued);
        Ok(ticket)
    }

    /// Stops accepting; connections being served finish.
    pub(super) fn close(&self) {
        self.accepting.abort();
    }
}

async fn accept(listener: TcpListener, tickets: Tickets, access: Arc<ObjectAccess>) {
    let room = Arc::new(Semaphore::new(MAX_CONNECTIONS));
    loop {
        let (stream, peer) = match listener.accept().await {
            Ok(accepted) => accepted,
            Err(error) => {
                // Out of descriptors, most likely: wait rather than spin.
                debug!(%error, "object bulk accept failed");
                tokio::time::sleep(std::time::Duration::from_millis(100)).await;
                continue;
            }
        };
        let Ok(permit) = room.clone().try_acquire_owned() else {
            debug!(%peer, "object bulk port busy; connection closed");
            continue;
        };
        let tickets = tickets.clone();
        let access = access.clone();
        xp_runtime::task::spawn("object-bulk-connection", async move {
            if let Err(error) = serve(stream, &tickets, &access).await {
                debug!(%peer, %error, "object bulk connection ended early");
            }
            drop(permit);
        });
    }
}

/// Reads a ticket and, if it is one issued and unexpired, sends its object.
async fn serve(
    mut stream: TcpStream,
    tickets: &Mutex<HashMap<BulkTicket, Issued>>,
    access: &ObjectAccess,
) -> std::io::Result<()> {
    let mut ticket = [0u8; 32];
    within(TICKET_WAIT, stream.read_exact(&mut ticket)).await?;
    let issued = tickets
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .remove(&BulkTicket(ticket));
    let Some(issued) = issued.filter(|issued| issued.expires > Instant::now()) else {
        return Err(std::io::Error::new(
            std::io::ErrorKind::PermissionDenied,
            "a ticket that is unknown, used or expired",
        ));
    };
    let size = issued.payload.size();
    match issued.payload {
        Payload::File { file, size } => send_file(stream, file, size).await?,
        Payload::Bytes(bytes) => {
            for piece in bytes.chunks(WRITE_BYTES) {
                within(IDLE_TIMEOUT, stream.write_all(piece)).await?;
            }
            stream.shutdown().await?;
        }
    }
    if let Some(team) = &issued.team {
        access.count_fetch(team, size, true);
    }
    Ok(())
}

/// `io`, or a time-out error once `limit` has passed.
async fn within<T>(
    limit: std::time::Duration,
    io: impl Future<Output = std::io::Result<T>>,
) -> std::io::Result<T> {
    tokio::time::timeout(limit, io)
        .await
        .map_err(|_| std::io::Error::from(std::io::ErrorKind::TimedOut))?
}

/// Sends `size` bytes of `file` on `stream` with `sendfile`, on a blocking
/// thread, each call bounded by [`IDLE_TIMEOUT`] (the socket's send timeout).
async fn send_file(stream: TcpStream, file: std::fs::File, size: u64) -> std::io::Result<()> {
    let socket = stream.into_std()?;
    socket.set_nonblocking(false)?;
    socket.set_write_timeout(Some(IDLE_TIMEOUT))?;
    tokio::task::spawn_blocking(move || {
        let mut offset: libc::off_t = 0;
        while (offset as u64) < size {
            let left = usize::try_from(size - offset as u64).unwrap_or(usize::MAX);
            match nix::sys::sendfile::sendfile(&socket, &file, Some(&mut offset), left) {
                Ok(0) => return Err(std::io::ErrorKind::UnexpectedEof.into()),
                Ok(_) | Err(nix::errno::Errno::EINTR) => {}
                Err(errno) => return Err(errno.into()),
            }
        }
        socket.shutdown(std::net::Shutdown::Write)
    })
    .await?
}
