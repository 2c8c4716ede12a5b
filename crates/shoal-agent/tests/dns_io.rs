//! The DNS port's sockets (`shoal_agent::dns_io`) with real UDP and TCP on loopback: packets
//! that do not decode are answered or dropped as hickory did but now counted; TCP connections
//! past `max_tcp_connections` are closed at accept and counted; the queries of everyone else
//! keep being answered. Every wait is bounded.

use std::net::SocketAddr;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use hickory_proto::op::{Message, MessageType, Query, ResponseCode};
use hickory_proto::rr::{Name, RecordType};
use hickory_server::authority::MessageResponseBuilder;
use hickory_server::server::{Request, RequestHandler, ResponseHandler, ResponseInfo};
use metrics_exporter_prometheus::{PrometheusBuilder, PrometheusHandle};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpStream, UdpSocket};

/// Bound on every wait for the server (never reached when it works).
const WAIT: Duration = Duration::from_secs(10);

fn recorder() -> &'static PrometheusHandle {
    static H: OnceLock<PrometheusHandle> = OnceLock::new();
    H.get_or_init(|| PrometheusBuilder::new().install_recorder().unwrap())
}

/// The value of the series `series` (name and labels exactly as rendered) in a scrape.
fn counter(series: &str) -> u64 {
    recorder()
        .render()
        .lines()
        .find_map(|l| {
            l.strip_prefix(series)
                .and_then(|v| v.strip_prefix(' '))
                .and_then(|v| v.trim().parse().ok())
        })
        .unwrap_or(0)
}

/// Answers every query NOERROR, no records.
struct Empty;

#[async_trait::async_trait]
impl RequestHandler for Empty {
    async fn handle_request<R: ResponseHandler>(
        &self,
        request: &Request,
        mut response: R,
    ) -> ResponseInfo {
        let builder = MessageResponseBuilder::from_message_request(request);
        let mut header = hickory_proto::op::Header::response_from_request(request.header());
        header.set_response_code(ResponseCode::NoError);
        response
            .send_response(builder.build_no_records(header))
            .await
            .unwrap_or_else(|_| header.into())
    }
}

async fn start(max_tcp: usize) -> SocketAddr {
    recorder();
    let udp = UdpSocket::bind("127.0.0.1:0").await.unwrap();
    let tcp = tokio::net::TcpListener::bind(udp.local_addr().unwrap())
        .await
        .unwrap();
    let addr = udp.local_addr().unwrap();
    tokio::spawn(shoal_agent::dns_io::run(udp, tcp, Arc::new(Empty), max_tcp));
    addr
}

fn query(id: u16) -> Vec<u8> {
    let mut m = Message::new();
    m.set_id(id);
    m.set_message_type(MessageType::Query);
    m.add_query(Query::query(
        Name::from_ascii("web.http.prod.service.shoal.").unwrap(),
        RecordType::SRV,
    ));
    m.to_vec().unwrap()
}

async fn udp_answer(sock: &UdpSocket) -> Message {
    let mut buf = [0u8; 4096];
    let n = tokio::time::timeout(WAIT, sock.recv(&mut buf))
        .await
        .expect("an answer within the bound")
        .unwrap();
    Message::from_vec(&buf[..n]).unwrap()
}

const MALFORMED: &str = "shoal_rejected_inputs_total{source=\"dns\",reason=\"malformed\"}";
const SHORT: &str = "shoal_rejected_inputs_total{source=\"dns\",reason=\"short\"}";
const FORMERR: &str = "shoal_dns_queries_total{rcode=\"FORMERR\"}";

#[tokio::test]
async fn undecodable_udp_packets_are_counted_and_valid_queries_still_answered() {
    let addr = start(8).await;
    let (malformed0, short0, formerr0) = (counter(MALFORMED), counter(SHORT), counter(FORMERR));
    let sock = UdpSocket::bind("127.0.0.1:0").await.unwrap();
    sock.connect(addr).await.unwrap();

    // A header claiming one question, then garbage: hickory's FORMERR, before any handler.
    let mut bad = query(7)[..12].to_vec();
    bad.extend_from_slice(&[0xff; 9]);
    const N: u64 = 200;
    for _ in 0..N {
        sock.send(&bad).await.unwrap();
        let a = udp_answer(&sock).await;
        assert_eq!(a.id(), 7);
        assert_eq!(a.response_code(), ResponseCode::FormErr);
    }
    // Shorter than a header: nothing to answer (fewer, so the socket buffer holds them all).
    const SHORT_N: u64 = 50;
    for _ in 0..SHORT_N {
        sock.send(&[1, 2, 3]).await.unwrap();
    }
    // The port still answers; it has also read every short packet sent before this query.
    sock.send(&query(9)).await.unwrap();
    let a = udp_answer(&sock).await;
    assert_eq!((a.id(), a.response_code()), (9, ResponseCode::NoError));

    // Before, hickory rejected these before the handler and neither counter moved.
    assert_eq!(counter(MALFORMED) - malformed0, N);
    assert_eq!(counter(FORMERR) - formerr0, N);
    assert_eq!(counter(SHORT) - short0, SHORT_N);
}

/// Whether the server closes `s` (EOF or reset) within [`WAIT`].
async fn closed_by_server(s: &mut TcpStream) -> bool {
    let mut buf = [0u8; 64];
    matches!(
        tokio::time::timeout(WAIT, s.read(&mut buf)).await,
        Ok(Ok(0) | Err(_))
    )
}

async fn tcp_query(addr: SocketAddr, id: u16) -> std::io::Result<Message> {
    let mut s = TcpStream::connect(addr).await?;
    let q = query(id);
    let mut framed = u16::try_from(q.len()).unwrap().to_be_bytes().to_vec();
    framed.extend_from_slice(&q);
    s.write_all(&framed).await?;
    let mut len = [0u8; 2];
    tokio::time::timeout(WAIT, s.read_exact(&mut len)).await??;
    let mut body = vec![0u8; usize::from(u16::from_be_bytes(len))];
    s.read_exact(&mut body).await?;
    Message::from_vec(&body).map_err(std::io::Error::other)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tcp_connections_past_the_cap_are_closed_at_accept_and_counted() {
    const CAP: usize = 16;
    const OPENED: usize = 200;
    const REFUSED: &str = "shoal_dns_tcp_connections_refused_total";
    let addr = start(CAP).await;
    let refused0 = counter(REFUSED);
    // A query over TCP works, and the connection it used is released.
    assert_eq!(tcp_query(addr, 1).await.unwrap().id(), 1);

    let mut held = Vec::new();
    for _ in 0..CAP {
        held.push(TcpStream::connect(addr).await.unwrap());
    }
    // Watched concurrently, so the whole check takes one bound (not one per connection).
    let started = tokio::time::Instant::now();
    let mut watching = tokio::task::JoinSet::new();
    for _ in 0..OPENED - CAP {
        let mut s = TcpStream::connect(addr).await.unwrap();
        watching.spawn(async move { closed_by_server(&mut s).await });
    }
    let closed = watching.join_all().await.into_iter().filter(|c| *c).count();
    // Before the cap, all 200 were held until hickory's 5 s read timeout.
    assert_eq!(closed, OPENED - CAP);
    assert!(
        started.elapsed() < shoal_agent::dns_io::TCP_IDLE_TIMEOUT,
        "closed at accept, not by the idle timeout: {:?}",
        started.elapsed()
    );
    assert!(counter(REFUSED) - refused0 >= (OPENED - CAP) as u64);

    // UDP is not behind the TCP cap.
    let sock = UdpSocket::bind("127.0.0.1:0").await.unwrap();
    sock.connect(addr).await.unwrap();
    sock.send(&query(3)).await.unwrap();
    assert_eq!(udp_answer(&sock).await.id(), 3);

    // Once the idle holders go, TCP queries are answered again.
    drop(held);
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        match tcp_query(addr, 2).await {
            Ok(m) => {
                assert_eq!(m.id(), 2);
                break;
            }
            Err(e) => assert!(tokio::time::Instant::now() < deadline, "never freed: {e}"),
        }
    }
}
