//! Connections without keep-alives (the default): an idle connection closes at the idle
//! timeout on both sides, and the next message dials a new one; the QUIC counters say what
//! each message cost in packets.

mod transport_support;

use shoal_transport::transport::Transport;
use transport_support::{recv, wait_until, Pki};

fn bind_without_keep_alive(
    pki: &Pki,
    node: &str,
    idle_timeout_ms: u64,
) -> (
    Transport,
    tokio::sync::mpsc::Receiver<shoal_transport::transport::Inbound>,
) {
    let mut c = pki.config(pki.region.as_str(), &pki.node(node));
    c.keep_alive_ms = 0;
    c.idle_timeout_ms = idle_timeout_ms;
    Transport::bind(c).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_connection_closes_and_the_next_message_dials_again() {
    let pki = Pki::new("eu-west");
    let (a, _a_rx) = bind_without_keep_alive(&pki, "node-a", 300);
    let (b, mut b_rx) = bind_without_keep_alive(&pki, "node-b", 300);

    a.send_datagram(b.listen_addr(), b"one".to_vec()).unwrap();
    assert_eq!(recv(&mut b_rx, "first datagram").await.bytes, b"one");
    assert_eq!(a.counters().connections_established, 1);

    // Nothing keeps the connection open (a keep-alive would, forever): both sides time it out.
    wait_until("both sides closed the idle connection", || {
        a.counters().connections_open == 0 && b.counters().connections_open == 0
    })
    .await;

    a.send_datagram(b.listen_addr(), b"two".to_vec()).unwrap();
    assert_eq!(
        recv(&mut b_rx, "datagram after the idle close").await.bytes,
        b"two"
    );
    assert_eq!(a.counters().connections_established, 2, "a dialled again");
    assert_eq!(a.counters().connects_failed, 0);
    let q = a.quic_counters();
    assert_eq!(q.datagram_frames_out, 2, "{q:?}");
    assert!(q.crypto_frames_out > 0, "two handshakes: {q:?}");
    assert!(q.packets_out >= 4, "{q:?}");

    a.shutdown().await;
    b.shutdown().await;
}
