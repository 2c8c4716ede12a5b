//! Two or more transports from one region CA exchanging datagrams and stream messages.

mod transport_support;

use shoal_transport::transport::{Channel, SendError, Transport};
use transport_support::{recv, wait_until, Pki};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn datagrams_and_streams_flow_both_ways_on_one_connection() {
    let pki = Pki::new("eu-west");
    let (a, mut a_rx) = pki.bind("node-a");
    let (b, mut b_rx) = pki.bind("node-b");

    a.send_datagram(b.listen_addr(), b"ping".to_vec()).unwrap();
    let got = recv(&mut b_rx, "datagram at b").await;
    assert_eq!(got.channel, Channel::Datagram);
    assert_eq!(got.bytes, b"ping");
    assert_eq!(
        got.from,
        a.listen_addr(),
        "from is a's listen address, not its dial port"
    );
    assert_eq!(got.peer.node_id.as_str(), "node-a");
    assert_eq!(got.peer.region.as_str(), "eu-west");

    // The reply travels on the connection a dialled: no second connection.
    b.send_datagram(got.from, b"pong".to_vec()).unwrap();
    let got = recv(&mut a_rx, "datagram at a").await;
    assert_eq!(
        (got.channel, &got.bytes[..]),
        (Channel::Datagram, &b"pong"[..])
    );
    assert_eq!(got.from, b.listen_addr());
    assert_eq!(got.peer.node_id.as_str(), "node-b");

    let big: Vec<u8> = (0..200_000u32).map(|i| i as u8).collect();
    b.send_stream_message(a.listen_addr(), big.clone()).unwrap();
    a.send_stream_message(b.listen_addr(), b"records".to_vec())
        .unwrap();
    let got = recv(&mut a_rx, "stream at a").await;
    assert_eq!(got.channel, Channel::Stream);
    assert_eq!(got.from, b.listen_addr());
    assert_eq!(got.bytes, big);
    let got = recv(&mut b_rx, "stream at b").await;
    assert_eq!(
        (got.channel, &got.bytes[..]),
        (Channel::Stream, &b"records"[..])
    );
    assert_eq!(got.from, a.listen_addr());

    let (ca, cb) = (a.counters(), b.counters());
    assert_eq!(ca.connections_open, 1, "{ca:?}");
    assert_eq!(cb.connections_open, 1, "{cb:?}");
    assert_eq!(cb.connects_failed, 0, "b never dialled: {cb:?}");
    assert_eq!(ca.handshakes_refused + cb.handshakes_refused, 0);
    assert_eq!((ca.datagrams_out, ca.datagrams_in), (1, 1));
    assert_eq!((ca.stream_msgs_out, ca.stream_msgs_in), (1, 1));
    assert_eq!(cb.bytes_out, 4 + 200_000);
    assert_eq!(
        (ca.connections_established, cb.connections_established),
        (1, 1),
        "one handshake, counted on both sides"
    );
    let qa = a.quic_counters();
    assert_eq!(qa.datagram_frames_out, 1, "{qa:?}");
    assert!(qa.crypto_frames_out > 0, "a's handshake: {qa:?}");
    assert!(qa.packets_out > 0 && qa.packets_in > 0, "{qa:?}");

    a.shutdown().await;
    b.shutdown().await;
    assert_eq!(
        a.send_datagram(b.listen_addr(), b"late".to_vec()),
        Err(SendError::ShutDown)
    );
    assert!(
        recv_none(&mut a_rx).await,
        "a's inbound channel ends after shutdown"
    );
}

async fn recv_none(
    rx: &mut tokio::sync::mpsc::Receiver<shoal_transport::transport::Inbound>,
) -> bool {
    tokio::time::timeout(transport_support::WAIT, rx.recv())
        .await
        .expect("channel should close")
        .is_none()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn oversize_stream_message_is_dropped_and_the_connection_survives() {
    let pki = Pki::new("eu-west");
    let (a, _a_rx) = pki.bind("node-a");
    let b_cert = pki.node("node-b");
    let mut b_config = pki.config("eu-west", &b_cert);
    b_config.max_stream_message_bytes = 1024;
    let (b, mut b_rx) = Transport::bind(b_config).unwrap();

    a.send_stream_message(b.listen_addr(), vec![7u8; 4096])
        .unwrap();
    wait_until("b drops the oversize message", || {
        b.counters().oversize_dropped == 1
    })
    .await;

    a.send_stream_message(b.listen_addr(), vec![1u8; 1024])
        .unwrap();
    let got = recv(&mut b_rx, "message at the limit").await;
    assert_eq!(
        got.bytes,
        vec![1u8; 1024],
        "the oversize message is never delivered"
    );
    a.send_datagram(b.listen_addr(), b"still here".to_vec())
        .unwrap();
    assert_eq!(
        recv(&mut b_rx, "datagram after oversize").await.bytes,
        b"still here"
    );

    let (ca, cb) = (a.counters(), b.counters());
    assert_eq!(cb.stream_msgs_in, 1, "{cb:?}");
    assert_eq!(cb.connections_open, 1, "same connection kept: {cb:?}");
    assert_eq!(ca.connects_failed, 0, "{ca:?}");

    // The sender refuses what exceeds its own limit without sending anything.
    let err = b
        .send_stream_message(a.listen_addr(), vec![0u8; 1025])
        .unwrap_err();
    assert_eq!(
        err,
        SendError::Oversize {
            len: 1025,
            max: 1024
        }
    );
    let err = b
        .send_datagram(a.listen_addr(), vec![0u8; 1201])
        .unwrap_err();
    assert_eq!(
        err,
        SendError::Oversize {
            len: 1201,
            max: 1200
        }
    );
    assert_eq!(b.counters().oversize_dropped, 3);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connection_cache_evicts_least_recently_used_and_redials() {
    let pki = Pki::new("eu-west");
    let a_cert = pki.node("node-a");
    let mut a_config = pki.config("eu-west", &a_cert);
    a_config.max_connections = 2;
    let (a, _a_rx) = Transport::bind(a_config).unwrap();
    let (b, mut b_rx) = pki.bind("node-b");
    let (c, mut c_rx) = pki.bind("node-c");
    let (d, mut d_rx) = pki.bind("node-d");

    a.send_stream_message(b.listen_addr(), b"1".to_vec())
        .unwrap();
    recv(&mut b_rx, "first message at b").await;
    a.send_stream_message(c.listen_addr(), b"2".to_vec())
        .unwrap();
    recv(&mut c_rx, "first message at c").await;
    assert_eq!(a.counters().connections_evicted, 0);

    a.send_stream_message(d.listen_addr(), b"3".to_vec())
        .unwrap();
    let got = recv(&mut d_rx, "message at d").await;
    assert_eq!(got.from, a.listen_addr());
    assert_eq!(
        a.counters().connections_evicted,
        1,
        "b was least recently used"
    );
    assert_eq!(a.cached_peers(), 2);
    wait_until("b sees its connection closed", || {
        b.counters().connections_open == 0
    })
    .await;

    a.send_stream_message(b.listen_addr(), b"4".to_vec())
        .unwrap();
    let got = recv(&mut b_rx, "message at b after eviction").await;
    assert_eq!(got.bytes, b"4");
    assert_eq!(got.from, a.listen_addr());
    let ca = a.counters();
    assert_eq!(ca.connections_evicted, 2, "c made room for b: {ca:?}");
    assert_eq!(ca.connects_failed, 0, "{ca:?}");
    assert_eq!(a.cached_peers(), 2);
    wait_until("a holds at most two connections", || {
        a.counters().connections_open == 2
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
/// Needs `initial_mtu` 1280 (the default): at quinn's 1200 a fresh connection carries only
/// ~1160-byte datagrams until path MTU discovery has run.
async fn a_max_size_datagram_fits_a_fresh_connection() {
    let pki = Pki::new("eu-west");
    let (a, _a_rx) = pki.bind("node-a");
    let (b, mut b_rx) = pki.bind("node-b");
    a.send_datagram(b.listen_addr(), vec![9u8; 1200]).unwrap();
    let got = recv(&mut b_rx, "1200-byte datagram").await;
    assert_eq!(got.bytes.len(), 1200);
}
