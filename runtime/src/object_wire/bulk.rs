//! The plain TCP bulk path of a fetch, for trusted networks: the request is
//! asked and authorized over the object link (QUIC, TLS), which answers with a
//! one-time ticket and a TCP port; the fetcher connects there, presents the
//! ticket, and reads the whole object as raw bytes.
//!
//! Nothing secret crosses the plain connection but the object's bytes and the
//! ticket, which is random, good for one connection and a few seconds, and
//! names only what was already granted; integrity still rests on the fetcher
//! hashing what it received against the object id. What is lost against QUIC
//! is only the bytes' confidentiality, which is why only the objects of trials
//! whose spec says `transport: tcp` (or `shm`) take this path, as their
//! collectives do (`FetchPath::for_transport`, sent in their launches and
//! replication orders).
//!
//! Why it exists: one QUIC connection tops out near 2.4 GB/s on the machines
//! measured, well under one TCP stream (see `docs/measurements/objects.md`).

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tracing::{debug, warn};

use super::{
    Credential, FetchHeader, IDLE_TIMEOUT, MAX_FETCH_BYTES, ObjectClient, ObjectClientError,
    ObjectOp, ObjectRequest, read_small, write_small,
};
use crate::fill_buffer::FillBuffer;
use crate::ids::ObjectId;
use crate::protocol::{FetchPath, ObjectSource};

/// How long a ticket stays good after the server issued it.
pub const TICKET_LIFETIME: Duration = Duration::from_secs(10);
/// How long a server waits for a connection's ticket, and a fetcher for the
/// TCP connection to open.
pub const TICKET_WAIT: Duration = Duration::from_secs(5);

/// The one-time secret that opens a bulk connection. Its `Debug` leaves it out.
#[derive(Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct BulkTicket(pub [u8; 32]);

impl std::fmt::Debug for BulkTicket {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("BulkTicket(..)")
    }
}

/// Why a bulk fetch did not deliver, before or after the source said yes.
#[derive(Debug, thiserror::Error)]
enum BulkError {
    /// The source offers no bulk path (an older node, or its TCP port could not
    /// be bound): the fetch takes QUIC instead.
    #[error("the source offers no bulk path: {0}")]
    Unoffered(String),
    /// Anything else: the same failures as a QUIC fetch, or the TCP connection's.
    #[error(transparent)]
    Failed(#[from] ObjectClientError),
}

impl ObjectClient {
    /// The object's bytes from one source over `path`, not yet verified, and
    /// the path they took. A source that offers no bulk path, or whose bulk
    /// transfer fails (its port unreachable through a firewall, the connection
    /// cut), is fetched from over QUIC; a refusal of the request itself is final.
    pub async fn fetch_over(
        &self,
        path: FetchPath,
        source: &ObjectSource,
        id: ObjectId,
        size_hint: Option<u64>,
        max_bytes: u64,
    ) -> Result<(Arc<[u8]>, FetchPath), ObjectClientError> {
        if path == FetchPath::Tcp {
            match self.fetch_bulk(source, id, size_hint, max_bytes).await {
                Ok(bytes) => return Ok((bytes, FetchPath::Tcp)),
                Err(BulkError::Unoffered(reason)) => {
                    debug!(%id, host = %source.host, %reason, "no bulk path; fetching over QUIC");
                }
                Err(BulkError::Failed(error @ ObjectClientError::Refused { .. })) => {
                    return Err(error);
                }
                Err(BulkError::Failed(error)) => {
                    let error = crate::error_chain::error_chain(&error);
                    warn!(%id, host = %source.host, %error, "bulk fetch failed; fetching over QUIC");
                }
            }
        }
        let bytes = self.fetch_from(source, id, size_hint, max_bytes).await?;
        Ok((bytes, FetchPath::Quic))
    }

    /// The whole object over `source`'s TCP bulk port, with a ticket asked for
    /// over the object link.
    async fn fetch_bulk(
        &self,
        source: &ObjectSource,
        id: ObjectId,
        size_hint: Option<u64>,
        max_bytes: u64,
    ) -> Result<Arc<[u8]>, BulkError> {
        let (size, addr, ticket) = self.ask_ticket(source, id).await?;
        if let Some(expected) = size_hint
            && expected != size
        {
            return Err(ObjectClientError::SizeMismatch { size, expected }.into());
        }
        let limit = max_bytes.min(MAX_FETCH_BYTES);
        let too_large = ObjectClientError::TooLarge { size, limit };
        if size > limit {
            return Err(too_large.into());
        }
        let size = usize::try_from(size).map_err(|_| too_large)?;
        let connect = tokio::time::timeout(TICKET_WAIT, tokio::net::TcpStream::connect(addr));
        let mut stream = match connect.await {
            Ok(Ok(stream)) => stream,
            Ok(Err(source)) => return Err(ObjectClientError::BulkConnect { addr, source }.into()),
            Err(_) => {
                let source = std::io::ErrorKind::TimedOut.into();
                return Err(ObjectClientError::BulkConnect { addr, source }.into());
            }
        };
        let _ = stream.set_nodelay(true);
        let cut = |source| ObjectClientError::BulkCutShort { addr, source };
        stream.write_all(&ticket.0).await.map_err(cut)?;
        let mut buffer = FillBuffer::zeroed(size);
        for (_, mut range) in buffer.split(size) {
            read_all(&mut stream, range.bytes_mut())
                .await
                .map_err(cut)?;
        }
        Ok(buffer.finish().map_err(|_| ObjectClientError::Outlived)?)
    }

    /// Asks `source` for a ticket to `id`: its size, the bulk port's address
    /// (the object link's peer address, no second lookup) and the ticket.
    async fn ask_ticket(
        &self,
        source: &ObjectSource,
        id: ObjectId,
    ) -> Result<(u64, SocketAddr, BulkTicket), BulkError> {
        let connection = self.connection(source).await?;
        let (mut send, mut recv) = connection
            .open_bi()
            .await
            .map_err(ObjectClientError::OpenStream)?;
        let request = ObjectRequest {
            credential: Credential::clone(&self.credential()),
            op: ObjectOp::Bulk { id },
        };
        write_small(&mut send, &request)
            .await
            .map_err(ObjectClientError::from)?;
        let _ = send.finish();
        let header = read_small(&mut recv)
            .await
            .map_err(ObjectClientError::from)?;
        match header {
            FetchHeader::Bulk { size, port, ticket } => {
                let addr = SocketAddr::new(connection.remote_address().ip(), port);
                Ok((size, addr, ticket))
            }
            // An older server cannot read the request; this one has no TCP port.
            FetchHeader::Error {
                code: super::FetchErrorCode::Malformed | super::FetchErrorCode::Unoffered,
                message,
            } => Err(BulkError::Unoffered(message)),
            FetchHeader::Error { code, message } => {
                Err(ObjectClientError::Refused { code, message }.into())
            }
            FetchHeader::Bytes { .. } => Err(BulkError::Unoffered(
                "the source answered with a QUIC chunk".to_owned(),
            )),
        }
    }
}

/// Fills `target` from `stream`, each read bounded by [`IDLE_TIMEOUT`].
async fn read_all(stream: &mut tokio::net::TcpStream, target: &mut [u8]) -> std::io::Result<()> {
    let mut filled = 0;
    while filled < target.len() {
        let read = tokio::time::timeout(IDLE_TIMEOUT, stream.read(&mut target[filled..]))
            .await
            .map_err(|_| std::io::Error::from(std::io::ErrorKind::TimedOut))??;
        if read == 0 {
            return Err(std::io::ErrorKind::UnexpectedEof.into());
        }
        filled += read;
    }
    Ok(())
}
