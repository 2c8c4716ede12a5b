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
//!   counted in `shoal_xds_connections_refused_total` and logged once per [`LOG_INTERVAL`].
//! * **First request.** A connection that has not opened an ADS call within
//!   `xds.handshake_timeout_ms` of accept (no HTTP/2 preface, a preface and nothing else, or
//!   only calls to other methods) is closed: its next read fails ([`XdsConn`]), so hyper drops
//!   it. Counted in `shoal_xds_connections_closed_total{why="handshake_timeout"}`.
//! * **Idle.** HTTP/2 keepalive (`xds.keepalive_ms`, then [`KEEPALIVE_TIMEOUT`] for the PING's
//!   answer) closes connections whose peer has stopped answering (set in `server::serve`).
//! * **Accept errors** (`EMFILE`, ...) back off [`ACCEPT_BACKOFF`] instead of spinning, counted in
//!   `shoal_xds_accept_errors_total`, logged once per interval.

use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use metrics::{counter, gauge};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, OwnedSemaphorePermit, Semaphore};
use tokio::time::Sleep;
use tonic::transport::server::Connected;

/// Shortest time between two warnings of one kind.
pub const LOG_INTERVAL: Duration = Duration::from_secs(60);
/// Pause after a failed accept (`EMFILE` would otherwise spin the loop).
pub const ACCEPT_BACKOFF: Duration = Duration::from_millis(20);
/// How long a keepalive PING may go unanswered before the connection is closed.
pub const KEEPALIVE_TIMEOUT: Duration = Duration::from_secs(10);

/// Logs at most once per [`LOG_INTERVAL`], counting what it held back.
#[derive(Debug, Default)]
pub struct LogEvery {
    /// Milliseconds since [`base`] of the last log, plus one (0 = never).
    last_ms: AtomicU64,
    held: AtomicU64,
}

fn base() -> Instant {
    static BASE: OnceLock<Instant> = OnceLock::new();
    *BASE.get_or_init(Instant::now)
}

impl LogEvery {
    /// A throttle that has never logged.
    pub const fn new() -> Self {
        Self {
            last_ms: AtomicU64::new(0),
            held: AtomicU64::new(0),
        }
    }

    /// `Some(held back since the last log)` when the caller should log now.
    pub fn check(&self) -> Option<u64> {
        let now = u64::try_from(base().elapsed().as_millis()).unwrap_or(u64::MAX - 1) + 1;
        let last = self.last_ms.load(Ordering::Relaxed);
        let interval = u64::try_from(LOG_INTERVAL.as_millis()).unwrap_or(u64::MAX);
        if (last != 0 && now.saturating_sub(last) < interval)
            || self
                .last_ms
                .compare_exchange(last, now, Ordering::Relaxed, Ordering::Relaxed)
                .is_err()
        {
            self.held.fetch_add(1, Ordering::Relaxed);
            return None;
        }
        Some(self.held.swap(0, Ordering::Relaxed))
    }
}

static REFUSED_LOG: LogEvery = LogEvery::new();
static TIMEOUT_LOG: LogEvery = LogEvery::new();
static ACCEPT_ERROR_LOG: LogEvery = LogEvery::new();

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
    let slots = Arc::new(Semaphore::new(limits.max_connections.max(1)));
    loop {
        let accepted = tokio::select! {
            a = listener.accept() => a,
            () = out.closed() => return,
        };
        let (io, remote) = match accepted {
            Ok(a) => a,
            Err(e) => {
                counter!("shoal_xds_accept_errors_total").increment(1);
                if let Some(held) = ACCEPT_ERROR_LOG.check() {
                    tracing::error!(error = %e, not_logged_since_last = held,
                        "xDS accept failed; backing off (logged once a minute)");
                }
                tokio::time::sleep(ACCEPT_BACKOFF).await;
                continue;
            }
        };
        let Ok(permit) = slots.clone().try_acquire_owned() else {
            counter!("shoal_xds_connections_refused_total").increment(1);
            if let Some(held) = REFUSED_LOG.check() {
                tracing::warn!(peer = %remote, max_connections = limits.max_connections,
                    not_logged_since_last = held,
                    "xDS connection refused: xds.max_connections are open (logged once a minute)");
            }
            drop(io);
            continue;
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
    fn log_every_logs_once_then_counts() {
        let l = LogEvery::new();
        assert_eq!(l.check(), Some(0));
        assert_eq!(l.check(), None);
        assert_eq!(l.check(), None);
        assert_eq!(l.held.load(Ordering::Relaxed), 2);
    }

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
