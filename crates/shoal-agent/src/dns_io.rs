//! The DNS port's sockets (`[dns] listen`): the UDP receive loop, the TCP accept loop with its
//! connection cap, and the decoding step that sits in front of
//! [`DnsHandler`](crate::dns::DnsHandler).
//!
//! hickory-server's `ServerFuture` accepts every TCP connection (3,000 idle ones were held until
//! its read timeout), spawns one task per UDP packet without a bound, rejects undecodable
//! packets before any handler runs (so nothing of ours counted them) and logs every request at
//! INFO. Its public parts are enough to run the same protocol ourselves: this module uses
//! hickory-proto's `UdpStream` / `TcpStream` framing, hickory-server's `TimeoutStream`,
//! `Request` and `ResponseHandle`, and hands every decoded query to the handler as
//! `ServerFuture` would.
//!
//! * **TCP cap.** At most `[dns] max_tcp_connections` (default
//!   [`DEFAULT_MAX_TCP_CONNECTIONS`]); one more is closed at accept, counted in
//!   `shoal_dns_tcp_connections_refused_total`, logged once a minute. A connection with no
//!   complete query for [`TCP_IDLE_TIMEOUT`] is closed (hickory's `TimeoutStream`, as before).
//! * **Undecodable packets** are counted in `shoal_rejected_inputs_total{source="dns",reason}`
//!   (`malformed`: answered FORMERR and counted in `shoal_dns_queries_total{rcode="FORMERR"}`
//!   as hickory answered them; `short`: fewer than the 12 header bytes, not answered;
//!   `response`: a DNS response sent to us, not answered, as hickory, against reflection) and
//!   logged once a minute per reason.
//! * **UDP** packets are handled one after the other on the receive task (the handler answers
//!   from the in-memory view without waiting), so a flood costs CPU, not tasks or memory.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use hickory_proto::op::{Header, Message, MessageType, ResponseCode};
use hickory_proto::runtime::iocompat::AsyncIoTokioAsStd;
use hickory_proto::runtime::TokioRuntimeProvider;
use hickory_proto::serialize::binary::{BinDecodable, BinDecoder};
use hickory_proto::tcp::TcpStream as DnsTcpStream;
use hickory_proto::udp::UdpStream;
use hickory_proto::xfer::{BufDnsStreamHandle, DnsStreamHandle, Protocol, SerialMessage};
use hickory_proto::ProtoErrorKind;
use hickory_server::authority::MessageRequest;
use hickory_server::server::{Request, RequestHandler, ResponseHandle, TimeoutStream};
use metrics::{counter, gauge};
use shoal_transport::capped_accept::{CappedListener, PortNames};
use shoal_transport::log_every::LogEvery;
use tokio_stream::StreamExt;

/// Default most open DNS-over-TCP connections.
pub const DEFAULT_MAX_TCP_CONNECTIONS: usize = 128;
/// A TCP connection with no complete query for this long is closed.
pub const TCP_IDLE_TIMEOUT: Duration = Duration::from_secs(5);
static MALFORMED_LOG: LogEvery = LogEvery::new();
static SHORT_LOG: LogEvery = LogEvery::new();
static RESPONSE_LOG: LogEvery = LogEvery::new();
static BAD_SOURCE_LOG: LogEvery = LogEvery::new();

/// Serves `handler` (the agent's [`crate::dns::DnsHandler`]) on `udp` and `tcp` until the
/// task is aborted.
pub async fn run<H: RequestHandler>(
    udp: tokio::net::UdpSocket,
    tcp: tokio::net::TcpListener,
    handler: Arc<H>,
    max_tcp_connections: usize,
) {
    tokio::join!(
        udp_loop(udp, handler.clone()),
        tcp_loop(tcp, handler, max_tcp_connections)
    );
}

async fn udp_loop<H: RequestHandler>(socket: tokio::net::UdpSocket, handler: Arc<H>) {
    // The remote address is a placeholder: each answer goes to its query's source.
    let (mut stream, handle) =
        UdpStream::<TokioRuntimeProvider>::with_bound(socket, ([127, 255, 255, 254], 0).into());
    while let Some(message) = stream.next().await {
        let message = match message {
            Ok(m) => m,
            Err(e) => {
                counter!("shoal_dns_udp_receive_errors_total").increment(1);
                tracing::debug!(error = %e, "DNS UDP receive failed");
                continue;
            }
        };
        let src = message.addr();
        if src.port() == 0 {
            // Nothing can be answered to port 0 (hickory drops these too).
            reject("bad_source", &BAD_SOURCE_LOG, src);
            continue;
        }
        handle_message(
            &*handler,
            &message,
            Protocol::Udp,
            handle.with_remote_addr(src),
        )
        .await;
    }
    tracing::error!("DNS UDP socket closed; DNS over UDP stopped");
}

async fn tcp_loop<H: RequestHandler>(
    listener: tokio::net::TcpListener,
    handler: Arc<H>,
    max: usize,
) {
    let listener = CappedListener::new(
        listener,
        max,
        PortNames {
            port: "DNS TCP",
            setting: "dns.max_tcp_connections",
            refused_metric: "shoal_dns_tcp_connections_refused_total",
            accept_errors_metric: "shoal_dns_tcp_accept_errors_total",
        },
    );
    loop {
        let (tcp, src, slot) = listener.accept().await;
        let handler = handler.clone();
        tokio::spawn(async move {
            gauge!("shoal_dns_tcp_connections").increment(1.0);
            let (stream, handle) = DnsTcpStream::from_stream(AsyncIoTokioAsStd(tcp), src);
            let mut stream = TimeoutStream::new(stream, TCP_IDLE_TIMEOUT);
            while let Some(Ok(message)) = stream.next().await {
                handle_message(&*handler, &message, Protocol::Tcp, handle.clone()).await;
            }
            gauge!("shoal_dns_tcp_connections").decrement(1.0);
            drop(slot);
        });
    }
}

/// Decodes one query and hands it to `handler`; what does not decode is counted (and answered
/// FORMERR when its header could be read).
async fn handle_message<H: RequestHandler>(
    handler: &H,
    message: &SerialMessage,
    protocol: Protocol,
    mut out: BufDnsStreamHandle,
) {
    let src = message.addr();
    match MessageRequest::read(&mut BinDecoder::new(message.bytes())) {
        Ok(request) if request.message_type() == MessageType::Response => {
            reject("response", &RESPONSE_LOG, src);
        }
        Ok(request) => {
            let request = Request::new(request, src, protocol);
            let response = ResponseHandle::new(src, out, protocol);
            handler.handle_request(&request, response).await;
        }
        Err(e) => match e.kind() {
            ProtoErrorKind::FormError { header, .. } => {
                reject("malformed", &MALFORMED_LOG, src);
                counter!("shoal_dns_queries_total", "rcode" => "FORMERR").increment(1);
                if let Some(bytes) = formerr(header) {
                    let _ = out.send(SerialMessage::new(bytes, src));
                }
            }
            _ => reject("short", &SHORT_LOG, src),
        },
    }
}

/// A FORMERR answer to a query whose header decoded but whose body did not.
fn formerr(request: &Header) -> Option<Vec<u8>> {
    let mut header = Header::response_from_request(request);
    header.set_response_code(ResponseCode::FormErr);
    let mut m = Message::new();
    m.set_header(header);
    m.to_vec().ok()
}

fn reject(reason: &'static str, log: &LogEvery, src: SocketAddr) {
    crate::metrics::rejected("dns", reason);
    if let Some(held) = log.check() {
        tracing::warn!(%src, reason, not_logged_since_last = held,
            "DNS packet rejected before the handler (logged once a minute per reason)");
    }
}
