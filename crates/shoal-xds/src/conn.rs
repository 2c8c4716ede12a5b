//! The xDS port's connections: a cap at accept, a deadline for the first request, and one
//! warning per interval for each kind of trouble.
//!
//! tonic's own accept loop (`serve_with_incoming` over a bare `TcpListenerStream`) holds every
//! connection a caller opens, for as long as the caller keeps it: 20 local processes holding
//! 1,000 idle connections each took the agent to 20,000 descriptors, and then its unix-socket
//! API, its metrics port and its snapshot writes failed with `EMFILE`. So the port gets its
//! own accept loop ([`accept_loop`]):
//!
//! * **Cap.** At most `xds.max_connections` connections are open; one more is closed at accept,
//!   counted in `shoal_xds_connections_refused_total` and logged once a minute
//!   (`shoal_transport::capped_accept`, shared with the Consul and DNS ports).
//! * **First request.** A connection that has not opened an ADS call within
//!   `xds.handshake_timeout_ms` of accept (no HTTP/2 preface, a preface and nothing else, or
//!   only calls to other methods) is closed: its next read fails ([`XdsConn`]), so hyper drops
//!   it. Counted in `shoal_xds_connections_closed_total{why="handshake_timeout"}`.
//! * **Idle.** HTTP/2 keepalive (`xds.keepalive_ms`, then [`KEEPALIVE_TIMEOUT`] for the PING's
//!   answer) closes connections whose peer has stopped answering (set in `server::serve`).
//! * **Accept errors** (`EMFILE`, ...) back off instead of spinning, counted in
//!   `shoal_xds_accept_errors_total`, logged once a minute.

use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use metrics::{counter, gauge};
use shoal_transport::capped_accept::{CappedListener, PortNames};
use shoal_transport::log_every::LogEvery;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, OwnedSemaphorePermit};
use tokio::time::Sleep;
use tonic::transport::server::Connected;

/// How long a keepalive PING may go unanswered before the connection is closed.
pub const KEEPALIVE_TIMEOUT: Duration = Duration::from_secs(10);

static TIMEOUT_LOG: LogEvery = LogEvery::new();

/// Limits of the xDS port's connections (from `[xds]`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ConnLimits {
    /// Most open connections.
    pub max_connections: usize,
    /// Longest wait from accept to the first ADS call.
    pub handshake_timeout: Duration,
    /// HTTP/2 keepalive PING interval.
    pub keepalive: Duration,
}

/// What the ADS service learns of the connection a call came on (a request extension).
#[derive(Debug, Clone)]
pub struct ConnInfo {
    /// The peer.
    pub remote: Option<SocketAddr>,
    requested: Arc<AtomicBool>,
}

impl ConnInfo {
    /// Marks the connection as having made an ADS call (its first-request deadline ends).
    pub fn requested(&self) {
        self.requested.store(true, Ordering::Relaxed);
    }
}

/// One admitted connection: the socket, its slot under the cap, and its first-request deadline.
#[derive(Debug)]
pub struct XdsConn {
    io: TcpStream,
    info: ConnInfo,
    deadline: Option<Pin<Box<Sleep>>>,
    _slot: Slot,
}

/// A slot under `max_connections`; `shoal_xds_connections` counts the live ones.
#[derive(Debug)]
struct Slot {
    _permit: OwnedSemaphorePermit,
}

impl Slot {
    fn new(permit: OwnedSemaphorePermit) -> Self {
        gauge!("shoal_xds_connections").increment(1.0);
        Self { _permit: permit }
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        gauge!("shoal_xds_connections").decrement(1.0);
    }
}

impl Connected for XdsConn {
    type ConnectInfo = ConnInfo;
    fn connect_info(&self) -> ConnInfo {
        self.info.clone()
    }
}

impl XdsConn {
    /// Fails the read once the first-request deadline has passed without an ADS call.
    fn check_deadline(&mut self, cx: &mut Context<'_>) -> io::Result<()> {
        let Some(deadline) = self.deadline.as_mut() else {
            return Ok(());
        };
        if self.info.requested.load(Ordering::Relaxed) {
            self.deadline = None;
            return Ok(());
        }
        if deadline.as_mut().poll(cx).is_pending() {
            return Ok(());
        }
        self.deadline = None;
        counter!("shoal_xds_connections_closed_total", "why" => "handshake_timeout").increment(1);
        if let Some(held) = TIMEOUT_LOG.check() {
            tracing::warn!(peer = ?self.info.remote, not_logged_since_last = held,
                "xDS connection closed: no ADS call within xds.handshake_timeout_ms (logged once a minute)");
        }
        Err(io::Error::new(
            io::ErrorKind::TimedOut,
            "no ADS call within xds.handshake_timeout_ms",
        ))
    }
}

impl AsyncRead for XdsConn {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        if let Err(e) = this.check_deadline(cx) {
            return Poll::Ready(Err(e));
        }
        Pin::new(&mut this.io).poll_read(cx, buf)
    }
}

impl AsyncWrite for XdsConn {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().io).poll_write(cx, buf)
    }
    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_flush(cx)
    }
    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_shutdown(cx)
    }
    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().io).poll_write_vectored(cx, bufs)
    }
    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }
}

/// Accepts on `listener`, closing connections over `limits.max_connections` at once, and hands
/// the admitted ones to `out` (tonic's incoming stream) until `out` is closed.
pub async fn accept_loop(
    listener: TcpListener,
    limits: ConnLimits,
    out: mpsc::Sender<io::Result<XdsConn>>,
) {
    let listener = CappedListener::new(
        listener,
        limits.max_connections,
        PortNames {
            port: "xDS",
            setting: "xds.max_connections",
            refused_metric: "shoal_xds_connections_refused_total",
            accept_errors_metric: "shoal_xds_accept_errors_total",
        },
    );
    loop {
        let (io, remote, permit) = tokio::select! {
            a = listener.accept() => a,
            () = out.closed() => return,
        };
        let _ = io.set_nodelay(true);
        let conn = XdsConn {
            io,
            info: ConnInfo {
                remote: Some(remote),
                requested: Arc::new(AtomicBool::new(false)),
            },
            deadline: Some(Box::pin(tokio::time::sleep(limits.handshake_timeout))),
            _slot: Slot::new(permit),
        };
        if out.send(Ok(conn)).await.is_err() {
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn limits_are_validated_and_carried() {
        use crate::server::{XdsConfig, XdsConfigError};
        let ok = XdsConfig::default();
        assert_eq!(ok.validate(), Ok(()));
        assert_eq!(ok.limits().max_connections, 256);
        assert_eq!(ok.limits().handshake_timeout, Duration::from_secs(5));
        let bad = |f: fn(&mut XdsConfig)| {
            let mut c = XdsConfig::default();
            f(&mut c);
            c.validate().unwrap_err()
        };
        assert_eq!(
            bad(|c| c.max_connections = 0),
            XdsConfigError::NoConnections
        );
        assert_eq!(
            bad(|c| c.handshake_timeout_ms = 0),
            XdsConfigError::HandshakeTimeout
        );
        assert_eq!(bad(|c| c.keepalive_ms = 10), XdsConfigError::Keepalive);
    }
}
