//! One HTTP/1.1 connection served the way every agent port serves it: the unix-socket local
//! API ([`crate::listener`]) and the capped TCP ports ([`crate::tcp_http`]: Consul, `/metrics`).
//!
//! hyper's http1 server with a tokio timer, a **header read timeout** (hyper restarts it for
//! each request head, so an idle keep-alive connection is closed too) and a 64 KiB read
//! buffer. Every connection the agent closes is counted in the port's
//! `<closed_metric>{why}`: `header_timeout`, or `error` for anything else hyper reports.

use std::time::Duration;

use hyper::body::Incoming;
use hyper::service::HttpService;
use hyper_util::rt::{TokioIo, TokioTimer};
use metrics::counter;

/// Largest request head buffered per connection, bytes.
pub const MAX_BUF_BYTES: usize = 64 * 1024;

/// Why the agent closed a connection ([`serve_http1`]).
#[derive(Debug)]
pub struct Closed {
    /// The `why` label it was counted under: `header_timeout` (no request head within the
    /// timeout, idle keep-alive included) or `error`.
    pub why: &'static str,
    /// What hyper reported.
    pub error: hyper::Error,
}

/// Serves HTTP/1.1 on `io` with `service` until the connection ends, closing it when a
/// request head does not arrive within `header_read_timeout`. A connection the agent closes
/// is counted in `closed_metric{why}` and returned; `None` when it ended normally.
pub async fn serve_http1<I, S>(
    io: I,
    service: S,
    header_read_timeout: Duration,
    closed_metric: &'static str,
) -> Option<Closed>
where
    I: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
    S: HttpService<Incoming, ResBody = axum::body::Body>,
    S::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    let mut builder = hyper::server::conn::http1::Builder::new();
    builder
        .timer(TokioTimer::new())
        .header_read_timeout(header_read_timeout)
        .max_buf_size(MAX_BUF_BYTES);
    let error = builder
        .serve_connection(TokioIo::new(io), service)
        .await
        .err()?;
    let why = if error.is_timeout() {
        "header_timeout"
    } else {
        "error"
    };
    counter!(closed_metric, "why" => why).increment(1);
    Some(Closed { why, error })
}
