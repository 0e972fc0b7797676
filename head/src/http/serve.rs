//! Serving the HTTP API's connections with hyper's HTTP/1 server, bounded in
//! time and number: a connection must send a whole request head within
//! [`HEADER_TIMEOUT`] of being ready for one (so a slow sender, and an idle
//! keep-alive connection, is closed); one whose peer stops reading its answer
//! is closed after [`WRITE_STALL_TIMEOUT`] without progress; and at most
//! [`MAX_CONNECTIONS`] are open at once (more are closed as they arrive).
//!
//! axum's own `serve` sets none of these, which is why the head drives hyper
//! itself. Not here: the routes and their limits (`super`).

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio::task::JoinSet;
use tokio::time::Sleep;
use tokio_util::sync::CancellationToken;
use tracing::debug;

/// The longest a connection may take to send a request head, counted from
/// when it is ready for one (its opening, or the end of its last answer).
pub(crate) const HEADER_TIMEOUT: Duration = Duration::from_secs(10);
/// The longest an answer's bytes may wait for the peer to read them.
pub(crate) const WRITE_STALL_TIMEOUT: Duration = Duration::from_secs(30);
/// The most connections open at once.
pub(crate) const MAX_CONNECTIONS: usize = 512;
/// How long open connections get to finish their answers at shutdown.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(5);

/// The bounds on connections (tests shorten the times).
#[derive(Debug, Clone, Copy)]
pub(crate) struct ConnectionLimits {
    /// See [`HEADER_TIMEOUT`].
    pub(crate) header: Duration,
    /// See [`WRITE_STALL_TIMEOUT`].
    pub(crate) write_stall: Duration,
    /// See [`MAX_CONNECTIONS`].
    pub(crate) connections: usize,
}

impl ConnectionLimits {
    /// The head's.
    pub(crate) const STANDARD: Self = Self {
        header: HEADER_TIMEOUT,
        write_stall: WRITE_STALL_TIMEOUT,
        connections: MAX_CONNECTIONS,
    };
}

/// Serves `router` on `listener` until `shutdown`.
pub(crate) async fn serve(
    listener: TcpListener,
    router: axum::Router,
    shutdown: CancellationToken,
    limits: ConnectionLimits,
) {
    let slots = Arc::new(Semaphore::new(limits.connections));
    let mut connections = JoinSet::new();
    loop {
        tokio::select! {
            () = shutdown.cancelled() => break,
            accepted = listener.accept() => {
                let Ok((stream, remote)) = accepted else { continue };
                let Ok(slot) = slots.clone().try_acquire_owned() else {
                    debug!(%remote, "HTTP connection refused: too many open");
                    continue;
                };
                connections.spawn(serve_connection(stream, router.clone(), shutdown.clone(), limits, slot));
            }
            Some(_) = connections.join_next(), if !connections.is_empty() => {}
        }
    }
    drop(listener);
    if tokio::time::timeout(SHUTDOWN_GRACE, async {
        while connections.join_next().await.is_some() {}
    })
    .await
    .is_err()
    {
        connections.shutdown().await;
    }
}

/// One connection, until it closes, times out, or the head shuts down (it
/// then finishes the answer in progress).
async fn serve_connection(
    stream: TcpStream,
    router: axum::Router,
    shutdown: CancellationToken,
    limits: ConnectionLimits,
    _slot: OwnedSemaphorePermit,
) {
    let io = TokioIo::new(StallGuard::new(stream, limits.write_stall));
    let service = TowerToHyperService::new(router);
    let mut builder = hyper::server::conn::http1::Builder::new();
    builder
        .timer(TokioTimer::new())
        .header_read_timeout(limits.header);
    let connection = builder.serve_connection(io, service);
    tokio::pin!(connection);
    let served = tokio::select! {
        served = connection.as_mut() => served,
        () = shutdown.cancelled() => {
            connection.as_mut().graceful_shutdown();
            connection.await
        }
    };
    if let Err(error) = served {
        debug!(%error, "HTTP connection ended");
    }
}

/// A stream whose writes fail once they have waited [`WRITE_STALL_TIMEOUT`]
/// for the peer without progress: a peer that never reads cannot hold a
/// connection (and the answer it holds) forever.
struct StallGuard {
    stream: TcpStream,
    stall: Duration,
    waiting: Option<Pin<Box<Sleep>>>,
}

impl StallGuard {
    fn new(stream: TcpStream, stall: Duration) -> Self {
        Self {
            stream,
            stall,
            waiting: None,
        }
    }

    /// `progress` of a write or flush; a pending one starts (or checks) the
    /// stall clock, which any progress resets.
    fn judge<T>(
        &mut self,
        cx: &mut Context<'_>,
        progress: Poll<io::Result<T>>,
    ) -> Poll<io::Result<T>> {
        if progress.is_ready() {
            self.waiting = None;
            return progress;
        }
        let stall = self.stall;
        let waiting = self
            .waiting
            .get_or_insert_with(|| Box::pin(tokio::time::sleep(stall)));
        match waiting.as_mut().poll(cx) {
            Poll::Ready(()) => Poll::Ready(Err(io::Error::new(
                io::ErrorKind::TimedOut,
                "the peer stopped reading its answer",
            ))),
            Poll::Pending => Poll::Pending,
        }
    }
}

impl AsyncRead for StallGuard {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_read(cx, buf)
    }
}

impl AsyncWrite for StallGuard {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let progress = Pin::new(&mut self.stream).poll_write(cx, buf);
        self.judge(cx, progress)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let progress = Pin::new(&mut self.stream).poll_flush(cx);
        self.judge(cx, progress)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let progress = Pin::new(&mut self.stream).poll_write_vectored(cx, bufs);
        self.judge(cx, progress)
    }

    fn is_write_vectored(&self) -> bool {
        self.stream.is_write_vectored()
    }
}

#[cfg(test)]
mod tests {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    use super::*;

    const SHORT: ConnectionLimits = ConnectionLimits {
        header: Duration::from_millis(300),
        write_stall: Duration::from_millis(300),
        connections: 4,
    };

    /// A head's HTTP server on a loopback port, serving one short and one
    /// long answer.
    async fn server() -> (std::net::SocketAddr, CancellationToken) {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let router = axum::Router::new()
            .route("/", axum::routing::get(|| async { "hello" }))
            .route(
                "/long",
                axum::routing::get(|| async { "x".repeat(64 << 20) }),
            );
        let shutdown = CancellationToken::new();
        xp_runtime::task::spawn(
            "test-http",
            serve(listener, router, shutdown.clone(), SHORT),
        );
        (addr, shutdown)
    }

    /// Reads until the peer closes, for at most ten seconds; what was read.
    async fn read_to_close(stream: &mut TcpStream) -> String {
        let mut answer = Vec::new();
        let read = tokio::time::timeout(Duration::from_secs(10), stream.read_to_end(&mut answer));
        assert!(read.await.is_ok(), "the server closed the connection");
        String::from_utf8_lossy(&answer).into_owned()
    }

    #[tokio::test]
    async fn a_connection_that_sends_no_whole_head_is_closed() {
        let (addr, shutdown) = server().await;
        let mut idle = TcpStream::connect(addr).await.unwrap();
        let mut partial = TcpStream::connect(addr).await.unwrap();
        partial
            .write_all(b"GET / HTTP/1.1\r\nHost: x\r\n")
            .await
            .unwrap();
        read_to_close(&mut idle).await;
        read_to_close(&mut partial).await;
        shutdown.cancel();
    }

    #[tokio::test]
    async fn an_idle_keep_alive_connection_is_closed_after_its_answer() {
        let (addr, shutdown) = server().await;
        let mut stream = TcpStream::connect(addr).await.unwrap();
        stream
            .write_all(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
            .await
            .unwrap();
        let answer = read_to_close(&mut stream).await;
        assert!(
            answer.starts_with("HTTP/1.1 200") && answer.ends_with("hello"),
            "{answer}"
        );
        shutdown.cancel();
    }

    #[tokio::test]
    async fn a_peer_that_stops_reading_its_answer_is_dropped() {
        let (addr, shutdown) = server().await;
        let mut stream = TcpStream::connect(addr).await.unwrap();
        stream
            .write_all(b"GET /long HTTP/1.1\r\nHost: x\r\n\r\n")
            .await
            .unwrap();
        // Not reading: the socket buffers fill and the server's writes stall.
        tokio::time::sleep(Duration::from_secs(2)).await;
        let mut answer = Vec::new();
        let read = tokio::time::timeout(Duration::from_secs(10), stream.read_to_end(&mut answer));
        let read = read.await.expect("the server closed the connection");
        assert!(
            read.is_err() || answer.len() < 64 << 20,
            "the whole answer came: {} bytes",
            answer.len()
        );
        shutdown.cancel();
    }
}
