//! QUIC between the ranks of one trial: the collective's ALPN, how much a link
//! hands quinn at once, and the ordered close of a rank's connections.
//!
//! This is the data plane between the workers of one trial, not the control plane:
//! there is no cluster CA here, the per-attempt token (sent in the hello, see
//! `wire`) is what admits a peer, and the certificate hash travels with the
//! rendezvous so the connecting rank knows whom it talks to. Endpoints,
//! certificates and TLS settings come from `crate::transport` (its bulk links),
//! sized by the communicator's `QuicTuning`; nothing here binds a socket.

use std::time::Duration;

/// The ALPN id of collective links.
pub(crate) const ALPN: &[u8] = b"xp-collective/1";
/// The most bytes handed to a quinn stream in one write (see `StreamWriter`).
pub(crate) const MAX_WRITE_BYTES: usize = 64 << 10;

/// The QUIC connections (and endpoint) under one rank's links.
///
/// Closing a QUIC connection discards what it has not delivered yet, and a rank's
/// last collective returns once its bytes are handed to quinn, not once they
/// arrived. So [`QuicConnections::close`] closes in an order that loses nothing:
/// the connection from the previous rank first (every collective that read from it
/// has returned, so nothing more is needed from it), then it waits for the next rank
/// to do the same with the connection this rank sends on, which proves that rank
/// has read everything. Dropping without `close` closes at once (after a failure).
#[derive(Default)]
pub(crate) struct QuicConnections {
    /// The connection this rank sends data on (it is the client).
    pub(crate) to_next: Option<quinn::Connection>,
    /// The connection this rank receives data on (it is the server).
    pub(crate) from_prev: Option<quinn::Connection>,
    /// Kept so the connections' socket lives as long as they do.
    pub(crate) endpoint: Option<quinn::Endpoint>,
}

/// How long a closed endpoint may take to tell its peers.
const ENDPOINT_DRAIN: Duration = Duration::from_millis(200);

impl QuicConnections {
    /// Closes without losing bytes in flight, waiting at most `linger` for the next
    /// rank (which may still be computing) to finish reading.
    pub(crate) async fn close(mut self, linger: Duration) {
        if let Some(from_prev) = self.from_prev.take() {
            from_prev.close(0u32.into(), b"done");
        }
        if let Some(to_next) = self.to_next.take() {
            if tokio::time::timeout(linger, to_next.closed())
                .await
                .is_err()
            {
                tracing::warn!(
                    ?linger,
                    "the next rank did not close its link in time; closing anyway"
                );
            }
            to_next.close(0u32.into(), b"done");
        }
        if let Some(endpoint) = self.endpoint.take() {
            let _ = tokio::time::timeout(ENDPOINT_DRAIN, endpoint.wait_idle()).await;
        }
    }
}

impl Drop for QuicConnections {
    fn drop(&mut self) {
        for connection in [self.to_next.take(), self.from_prev.take()]
            .into_iter()
            .flatten()
        {
            connection.close(0u32.into(), b"communicator dropped");
        }
    }
}
