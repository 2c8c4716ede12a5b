//! The local API's connections: peer credentials, connection caps, header timeout, and the
//! file-descriptor budget that keeps the API, persistence and the mesh up when one local
//! client misbehaves.
//!
//! * Every accepted connection's peer credentials become the [`LocalCaller`] of each request on
//!   it (an axum request extension; see [`crate::access`]).
//! * **Caps.** At most `max_connections_per_uid` open connections per uid and
//!   `max_connections` in total. A connection over a cap is answered at once with
//!   `429` (per uid) or `503` (total), JSON body with the reason, and closed; counted in
//!   `shoal_api_connections_refused_total{why}`.
//! * **Timeouts.** hyper's `header_read_timeout` (with a tokio timer) closes a connection whose
//!   request head does not arrive in time, including an idle keep-alive connection; request
//!   bodies are read under `body_read_timeout_ms` by the API handlers
//!   (`shoal_api_connections_closed_total{why="header_timeout"}` counts the former).
//! * **File descriptors.** At start the agent raises its soft `RLIMIT_NOFILE` to the hard limit
//!   and keeps `fd_reserve` descriptors for persistence, the QUIC socket, probes and logs: the
//!   total cap is `min(max_connections, soft limit - fd_reserve)` ([`connection_caps`]).

use std::collections::HashMap;
use std::io::Write as _;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::Body;
use axum::Router;
use hyper::body::Incoming;
use hyper::Request;
use metrics::{counter, gauge};
use shoal_proto::rpc::LocalCaller;
use tokio::net::UnixListener;

use crate::{access, http1};

/// Smallest total connection cap the agent runs with, whatever the fd limit says.
pub const MIN_TOTAL_CONNECTIONS: usize = 16;

/// Raises the soft `RLIMIT_NOFILE` to the hard limit; returns the (soft, hard) now in force.
pub fn raise_nofile_limit() -> (u64, u64) {
    use rlimit::Resource;
    let Ok((soft, hard)) = rlimit::getrlimit(Resource::NOFILE) else {
        return (1024, 1024);
    };
    if soft < hard {
        match rlimit::setrlimit(Resource::NOFILE, hard, hard) {
            Ok(()) => return (hard, hard),
            Err(e) => tracing::warn!(soft, hard, error = %e, "cannot raise RLIMIT_NOFILE"),
        }
    }
    (soft, hard)
}

/// The (total, per-uid) connection caps for an fd limit of `nofile`: the total is
/// `min(max_total, nofile - reserve)` (never below [`MIN_TOTAL_CONNECTIONS`]), the per-uid cap
/// never above the total.
pub fn connection_caps(
    max_total: usize,
    max_per_uid: usize,
    nofile: u64,
    reserve: usize,
) -> (usize, usize) {
    let budget = usize::try_from(nofile)
        .unwrap_or(usize::MAX)
        .saturating_sub(reserve);
    let total = max_total.min(budget).max(MIN_TOTAL_CONNECTIONS);
    (total, max_per_uid.min(total).max(1))
}

/// Which cap refused a connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Over {
    /// The caller's uid holds `max_per_uid` connections (HTTP 429).
    PerUid,
    /// The agent holds `max_total` connections (HTTP 503).
    Total,
}

/// Counts open connections, in total and per uid.
#[derive(Debug)]
pub struct ConnLimiter {
    max_total: usize,
    max_per_uid: usize,
    state: Mutex<(usize, HashMap<u32, usize>)>,
}

/// One admitted connection; releases its slot when dropped.
#[derive(Debug)]
pub struct ConnGuard {
    limiter: Arc<ConnLimiter>,
    uid: u32,
}

impl ConnLimiter {
    /// A limiter with these caps.
    pub fn new(max_total: usize, max_per_uid: usize) -> Arc<Self> {
        Arc::new(Self {
            max_total,
            max_per_uid,
            state: Mutex::new((0, HashMap::new())),
        })
    }

    /// The caps (total, per uid).
    pub fn caps(&self) -> (usize, usize) {
        (self.max_total, self.max_per_uid)
    }

    /// Admits a connection of `uid`, or says which cap is full.
    ///
    /// # Errors
    /// [`Over`] naming the cap.
    pub fn try_acquire(self: &Arc<Self>, uid: u32) -> Result<ConnGuard, Over> {
        let mut st = self.state.lock().expect("limiter");
        let mine = st.1.get(&uid).copied().unwrap_or(0);
        if mine >= self.max_per_uid {
            return Err(Over::PerUid);
        }
        if st.0 >= self.max_total {
            return Err(Over::Total);
        }
        st.0 += 1;
        *st.1.entry(uid).or_insert(0) += 1;
        gauge!("shoal_api_connections").set(st.0 as f64);
        Ok(ConnGuard {
            limiter: self.clone(),
            uid,
        })
    }

    /// Open connections (total, of `uid`).
    pub fn open(&self, uid: u32) -> (usize, usize) {
        let st = self.state.lock().expect("limiter");
        (st.0, st.1.get(&uid).copied().unwrap_or(0))
    }
}

impl Drop for ConnGuard {
    fn drop(&mut self) {
        let mut st = self.limiter.state.lock().expect("limiter");
        st.0 = st.0.saturating_sub(1);
        if let Some(n) = st.1.get_mut(&self.uid) {
            *n -= 1;
            if *n == 0 {
                st.1.remove(&self.uid);
            }
        }
        gauge!("shoal_api_connections").set(st.0 as f64);
    }
}

/// Settings of [`serve`].
#[derive(Debug, Clone)]
pub struct ServeConfig {
    /// hyper's `header_read_timeout`.
    pub header_read_timeout: Duration,
}

/// Accepts connections on `listener` forever, serving `router` on each admitted one.
pub async fn serve(
    listener: UnixListener,
    router: Router,
    limiter: Arc<ConnLimiter>,
    cfg: ServeConfig,
) {
    let mut accept_error_logged = false;
    loop {
        let stream = match listener.accept().await {
            Ok((s, _)) => {
                accept_error_logged = false;
                s
            }
            Err(e) => {
                // EMFILE / ENFILE / ENOBUFS: back off briefly instead of spinning; the pending
                // connection stays in the backlog until a descriptor frees up.
                counter!("shoal_api_accept_errors_total").increment(1);
                if !accept_error_logged {
                    tracing::error!(error = %e, "local API accept failed; backing off (logged once until the next success)");
                    accept_error_logged = true;
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
                continue;
            }
        };
        let who = match stream.peer_cred() {
            Ok(c) => access::local_caller(&c),
            Err(e) => {
                counter!("shoal_api_connections_refused_total", "why" => "no_peer_cred")
                    .increment(1);
                tracing::debug!(error = %e, "peer credentials unreadable; connection dropped");
                continue;
            }
        };
        match limiter.try_acquire(who.uid) {
            Ok(guard) => {
                let router = router.clone();
                let cfg = cfg.clone();
                tokio::spawn(serve_conn(stream, who, guard, router, cfg));
            }
            Err(over) => refuse(stream, &who, over, &limiter),
        }
    }
}

fn refuse(stream: tokio::net::UnixStream, who: &LocalCaller, over: Over, limiter: &ConnLimiter) {
    let (total, per_uid) = limiter.caps();
    let (status, why, body) = match over {
        Over::PerUid => (
            "429 Too Many Requests",
            "per_uid",
            serde_json::json!({
                "error": "too many connections from this uid",
                "reason": "connection_limit_per_uid",
                "uid": who.uid,
                "limit": per_uid,
            }),
        ),
        Over::Total => (
            "503 Service Unavailable",
            "total",
            serde_json::json!({
                "error": "the agent holds its maximum number of local API connections",
                "reason": "connection_limit_total",
                "limit": total,
            }),
        ),
    };
    counter!("shoal_api_connections_refused_total", "why" => why).increment(1);
    let body = body.to_string();
    let resp = format!(
        "HTTP/1.1 {status}\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\nretry-after: 1\r\n\r\n{body}",
        body.len()
    );
    // Never wait on a refused peer: read what it already sent (so closing does not reset the
    // connection before it reads the answer), write the answer without blocking, close.
    let Ok(std) = stream.into_std() else { return };
    let mut std = std;
    let mut scratch = [0u8; 4096];
    let _ = std::io::Read::read(&mut std, &mut scratch);
    let _ = std.write(resp.as_bytes());
    let _ = std.shutdown(std::net::Shutdown::Both);
}

async fn serve_conn(
    stream: tokio::net::UnixStream,
    who: LocalCaller,
    guard: ConnGuard,
    router: Router,
    cfg: ServeConfig,
) {
    let svc = hyper::service::service_fn(move |mut req: Request<Incoming>| {
        req.extensions_mut().insert(who.clone());
        let mut router = router.clone();
        async move { tower_service::Service::call(&mut router, req.map(Body::new)).await }
    });
    let closed = "shoal_api_connections_closed_total";
    if let Some(c) = http1::serve_http1(stream, svc, cfg.header_read_timeout, closed).await {
        tracing::debug!(error = %c.error, why = c.why, "local API connection closed");
    }
    drop(guard);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn caps_leave_a_reserve_and_per_uid_fits_the_total() {
        assert_eq!(connection_caps(4096, 512, 1024, 256), (768, 512));
        assert_eq!(connection_caps(4096, 512, 1 << 20, 256), (4096, 512));
        assert_eq!(connection_caps(4096, 5000, 1 << 20, 256), (4096, 4096));
        assert_eq!(
            connection_caps(4096, 512, 100, 256),
            (MIN_TOTAL_CONNECTIONS, 16)
        );
    }

    #[test]
    fn limiter_counts_per_uid_and_in_total() {
        let l = ConnLimiter::new(3, 2);
        let a1 = l.try_acquire(1).unwrap();
        let _a2 = l.try_acquire(1).unwrap();
        assert_eq!(l.try_acquire(1).unwrap_err(), Over::PerUid);
        let _b1 = l.try_acquire(2).unwrap();
        assert_eq!(l.try_acquire(3).unwrap_err(), Over::Total);
        assert_eq!(l.open(1), (3, 2));
        drop(a1);
        assert_eq!(l.open(1), (2, 1));
        let _c = l.try_acquire(3).unwrap();
        assert_eq!(l.try_acquire(1).unwrap_err(), Over::Total);
    }
}
