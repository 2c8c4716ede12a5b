//! HTTP/1.1 on the agent's capped TCP ports: the Consul-compatible read port and `/metrics`.
//!
//! Both serve callers the agent cannot identify, so both are held to the same two limits
//! (QA, 2026-12-04: 1,100 half-sent requests to an uncapped metrics port exhausted the agent's
//! descriptors; the unix-socket API and snapshot persistence then failed with `EMFILE`):
//!
//! * **a connection cap**: [`CappedListener`] closes a connection over the port's cap at
//!   accept, counts it and warns once a minute; the cap is taken out of the local API's fd
//!   budget at start (`agent::tcp_port_fds`), so a caller filling the port cannot starve the
//!   unix socket, persistence or the mesh;
//! * **a header read timeout** (hyper's, with a tokio timer): a connection whose request head
//!   does not arrive in time is closed, and so is an idle keep-alive connection between
//!   requests (hyper restarts the timer when it waits for the next head). Counted in the
//!   port's `closed_metric{why="header_timeout"}` ([`crate::http1`], shared with the local
//!   API's socket).

use std::time::Duration;

use axum::Router;
use shoal_transport::capped_accept::CappedListener;

use crate::http1::serve_http1;

/// Serves `router` on every connection `listener` admits, closing a connection whose request
/// head does not arrive within `header_read_timeout` (idle keep-alive included); connections
/// the agent closes are counted in `closed_metric{why}` (`header_timeout`, `error`). Never
/// returns.
pub async fn serve(
    listener: CappedListener,
    router: Router,
    header_read_timeout: Duration,
    closed_metric: &'static str,
) {
    loop {
        let (stream, _, permit) = listener.accept().await;
        let router = router.clone();
        tokio::spawn(async move {
            let svc =
                hyper::service::service_fn(move |req: hyper::Request<hyper::body::Incoming>| {
                    let mut router = router.clone();
                    async move {
                        tower_service::Service::call(&mut router, req.map(axum::body::Body::new))
                            .await
                    }
                });
            let _ = serve_http1(stream, svc, header_read_timeout, closed_metric).await;
            drop(permit);
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use shoal_transport::capped_accept::PortNames;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::{TcpListener, TcpStream};

    const NAMES: PortNames = PortNames {
        port: "test",
        setting: "test.max_connections",
        refused_metric: "test_refused_total",
        accept_errors_metric: "test_accept_errors_total",
    };
    const TIMEOUT: Duration = Duration::from_secs(10);

    async fn start(max: usize) -> std::net::SocketAddr {
        let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = l.local_addr().unwrap();
        let router = Router::new().route("/metrics", axum::routing::get(|| async { "ok\n" }));
        tokio::spawn(serve(
            CappedListener::new(l, max, NAMES),
            router,
            TIMEOUT,
            "test_closed_total",
        ));
        addr
    }

    /// Reads until the peer closes; the bytes read (a reset counts as closed too).
    async fn read_to_close(s: &mut TcpStream) -> Vec<u8> {
        let mut out = Vec::new();
        let _ = s.read_to_end(&mut out).await;
        out
    }

    async fn get(addr: std::net::SocketAddr) -> String {
        let mut s = TcpStream::connect(addr).await.unwrap();
        s.write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            .await
            .unwrap();
        String::from_utf8_lossy(&read_to_close(&mut s).await).into_owned()
    }

    /// A connection past the cap is closed at once, unanswered, while the held ones stay open;
    /// once a half-sent request's header timeout closes one, the port answers again.
    #[tokio::test(start_paused = true)]
    async fn over_the_cap_closed_at_accept_and_half_sent_requests_time_out() {
        let addr = start(2).await;
        let opened = tokio::time::Instant::now();
        let mut held = Vec::new();
        for _ in 0..2 {
            let mut s = TcpStream::connect(addr).await.unwrap();
            s.write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\nX-Slow: ")
                .await
                .unwrap();
            held.push(s);
        }
        // Both admitted before the third arrives (accept order is connect order).
        let mut over = TcpStream::connect(addr).await.unwrap();
        let _ = over
            .write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
            .await;
        assert!(
            read_to_close(&mut over).await.is_empty(),
            "a connection over the cap gets no answer"
        );
        assert!(
            opened.elapsed() < TIMEOUT,
            "closed at accept, not by a timeout"
        );
        // The held ones are closed by the header timeout (paused clock: no real wait).
        for s in &mut held {
            assert!(read_to_close(s).await.is_empty());
        }
        assert!(opened.elapsed() >= TIMEOUT, "closed by the header timeout");
        // Their slots are free again.
        let answer = get(addr).await;
        assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
        assert!(answer.ends_with("ok\n"), "{answer}");
    }

    /// An idle keep-alive connection is closed after the header timeout too.
    #[tokio::test(start_paused = true)]
    async fn idle_keep_alive_connection_is_closed() {
        let addr = start(4).await;
        let mut s = TcpStream::connect(addr).await.unwrap();
        s.write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
            .await
            .unwrap();
        let mut first = [0u8; 12];
        s.read_exact(&mut first).await.unwrap();
        assert_eq!(&first, b"HTTP/1.1 200");
        let answered = tokio::time::Instant::now();
        let rest = read_to_close(&mut s).await;
        assert!(String::from_utf8_lossy(&rest).ends_with("ok\n"));
        assert!(
            answered.elapsed() >= TIMEOUT,
            "closed while idle, after the timeout"
        );
    }
}
