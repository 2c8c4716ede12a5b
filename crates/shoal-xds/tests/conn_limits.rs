//! The xDS port under a local process that opens connections and never speaks: the cap closes
//! the surplus at accept (counted), the first-request deadline closes the silent ones, and a
//! real ADS client keeps working throughout. Real sockets on loopback; every wait is bounded.

use std::net::SocketAddr;
use std::time::Duration;

use envoy_types::pb::envoy::service::discovery::v3::aggregated_discovery_service_client::AggregatedDiscoveryServiceClient;
use envoy_types::pb::envoy::service::discovery::v3::DiscoveryRequest;
use shoal_xds::resources::ResourceType;
use shoal_xds::ConnLimits;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;

/// Bound on every wait for the server (never reached when it works).
const WAIT: Duration = Duration::from_secs(10);

mod support;
use support::{counter, start};

/// Whether the server closes `s` (EOF or reset) within [`WAIT`].
async fn closed_by_server(s: &mut TcpStream) -> bool {
    let mut buf = [0u8; 256];
    loop {
        match tokio::time::timeout(WAIT, s.read(&mut buf)).await {
            Err(_) => return false,
            Ok(Ok(0) | Err(_)) => return true,
            Ok(Ok(_)) => {} // the server's SETTINGS frame; keep reading
        }
    }
}

/// One ADS call answered (the empty view still answers a subscription with an empty response).
async fn ads_round_trip(addr: SocketAddr) -> Result<(), String> {
    let mut client = AggregatedDiscoveryServiceClient::connect(format!("http://{addr}"))
        .await
        .map_err(|e| e.to_string())?;
    let (tx, rx) = mpsc::channel(4);
    tx.send(DiscoveryRequest {
        type_url: ResourceType::Cluster.type_url(),
        ..Default::default()
    })
    .await
    .unwrap();
    let mut responses = client
        .stream_aggregated_resources(ReceiverStream::new(rx))
        .await
        .map_err(|e| e.to_string())?
        .into_inner();
    match tokio::time::timeout(WAIT, responses.message()).await {
        Ok(Ok(Some(_))) => Ok(()),
        other => Err(format!("{other:?}")),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connections_past_the_cap_are_closed_at_accept_and_counted() {
    const CAP: usize = 32;
    const OPENED: usize = 300;
    let addr = start(
        ConnLimits {
            max_connections: CAP,
            handshake_timeout: Duration::from_secs(60),
            keepalive: Duration::from_secs(30),
        },
        64,
    )
    .await;
    let refused_before = counter("shoal_xds_connections_refused_total");
    let mut held = Vec::new();
    for _ in 0..CAP {
        held.push(TcpStream::connect(addr).await.unwrap());
    }
    // Every connection past the cap is closed by the server; before the cap existed all 300
    // stayed open (the QA run held 20,000 descriptors this way).
    // Watched concurrently, so the whole check takes one bound (not one per connection).
    let mut watching = tokio::task::JoinSet::new();
    for _ in 0..OPENED - CAP {
        let mut s = TcpStream::connect(addr).await.unwrap();
        watching.spawn(async move { closed_by_server(&mut s).await });
    }
    let closed = watching.join_all().await.into_iter().filter(|c| *c).count();
    assert_eq!(closed, OPENED - CAP, "every connection past the cap closed");
    assert!(
        counter("shoal_xds_connections_refused_total") - refused_before >= (OPENED - CAP) as u64,
        "refusals counted"
    );
    // While the cap is full a real client is refused too; once the idle holders go, it is served.
    assert!(ads_round_trip(addr).await.is_err(), "cap full");
    drop(held);
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        match ads_round_trip(addr).await {
            Ok(()) => break,
            Err(e) => assert!(
                tokio::time::Instant::now() < deadline,
                "slots never freed: {e}"
            ),
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn silent_connections_are_closed_after_the_handshake_timeout_and_clients_stay() {
    let timeout = Duration::from_millis(300);
    let addr = start(
        ConnLimits {
            max_connections: 64,
            handshake_timeout: timeout,
            keepalive: Duration::from_secs(30),
        },
        64,
    )
    .await;
    let closed_before = counter("shoal_xds_connections_closed_total{why=\"handshake_timeout\"}");

    // A real client's stream opened before the deadline survives it.
    let mut client = AggregatedDiscoveryServiceClient::connect(format!("http://{addr}"))
        .await
        .unwrap();
    let (tx, rx) = mpsc::channel(4);
    let cds = DiscoveryRequest {
        type_url: ResourceType::Cluster.type_url(),
        ..Default::default()
    };
    tx.send(cds.clone()).await.unwrap();
    let mut responses = client
        .stream_aggregated_resources(ReceiverStream::new(rx))
        .await
        .unwrap()
        .into_inner();
    let first = tokio::time::timeout(WAIT, responses.message())
        .await
        .unwrap()
        .unwrap()
        .unwrap();

    // Nothing sent at all.
    let started = tokio::time::Instant::now();
    let mut silent = TcpStream::connect(addr).await.unwrap();
    // The HTTP/2 preface and an empty SETTINGS frame, then nothing: no request.
    let mut preface_only = TcpStream::connect(addr).await.unwrap();
    preface_only
        .write_all(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\x00\x00\x00\x04\x00\x00\x00\x00\x00")
        .await
        .unwrap();
    assert!(
        closed_by_server(&mut silent).await,
        "silent connection closed"
    );
    assert!(
        closed_by_server(&mut preface_only).await,
        "preface-only connection closed"
    );
    assert!(started.elapsed() >= timeout, "not before the timeout");
    assert!(
        counter("shoal_xds_connections_closed_total{why=\"handshake_timeout\"}") - closed_before
            >= 2
    );

    // Past the deadline the client's stream still answers (a changed subscription is answered
    // at once).
    tokio::time::sleep(timeout * 2).await;
    tx.send(DiscoveryRequest {
        type_url: ResourceType::Listener.type_url(),
        ..Default::default()
    })
    .await
    .unwrap();
    let _ = first;
    let again = tokio::time::timeout(WAIT, responses.message()).await;
    assert!(matches!(again, Ok(Ok(Some(_)))), "stream alive: {again:?}");
}
