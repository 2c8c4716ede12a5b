//! A peer killed without a goodbye (kill -9: no CONNECTION_CLOSE) and restarted at the same
//! address must be reachable again at once, not after the idle timeout of the connection its
//! previous process left open at the other side (issue 15: a kill -9'd agent's new boot took
//! 30-60 s and more to be accepted by its peers).

mod transport_support;

use std::time::Duration;

use shoal_transport::transport::Transport;
use tokio::runtime::{Builder, Runtime};
use transport_support::{recv, Pki, WAIT};

fn runtime() -> Runtime {
    Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .expect("tokio runtime")
}

#[test]
fn a_peer_restarted_at_the_same_address_is_reached_before_the_idle_timeout() {
    let pki = Pki::new("eu-west");
    let cert_a = pki.node("node-a");
    let cert_b = pki.node("node-b");
    // An idle timeout far above the wait: only a reset of the dead connection can pass.
    let config = |cert| {
        let mut c = pki.config("eu-west", cert);
        c.idle_timeout_ms = 120_000;
        c.keep_alive_ms = 10_000;
        c
    };
    let rt_a = runtime();
    let (a, mut a_rx) = rt_a
        .block_on(async { Transport::bind(config(&cert_a)) })
        .expect("a binds");
    let rt_b = runtime();
    let (b, mut b_rx) = rt_b
        .block_on(async { Transport::bind(config(&cert_b)) })
        .expect("b binds");
    let b_addr = b.listen_addr();

    // a dials b; b answers on that connection.
    rt_a.block_on(async { a.send_datagram(b_addr, b"hello".to_vec()) })
        .expect("queued");
    let got = rt_b.block_on(recv(&mut b_rx, "first datagram at b"));
    rt_b.block_on(async { b.send_datagram(got.from, b"hi".to_vec()) })
        .expect("queued");
    rt_a.block_on(recv(&mut a_rx, "answer at a"));

    // kill -9: b's tasks stop without sending anything, then its socket is released.
    rt_b.shutdown_background();
    drop(b);
    drop(b_rx);

    // The same node restarts at the same address (same key, as a restarted agent has).
    // The stopped runtime's threads release the socket shortly after: retry the bind within
    // a bound (a wait for a condition, not a sleep to synchronise).
    let rt_b2 = runtime();
    let deadline = std::time::Instant::now() + WAIT;
    let (b2, mut b2_rx) = loop {
        let mut c = config(&cert_b);
        c.listen = b_addr;
        match rt_b2.block_on(async { Transport::bind(c) }) {
            Ok(t) => break t,
            Err(e) if std::time::Instant::now() < deadline => {
                let _ = e;
                std::thread::sleep(Duration::from_millis(20));
            }
            Err(e) => panic!("b cannot restart on its address: {e}"),
        }
    };

    // a keeps sending (a probe every 100 ms): one must reach the new process within WAIT,
    // which is far below the 120 s idle timeout of a's connection to the dead one.
    let reached = rt_b2.block_on(async {
        tokio::time::timeout(WAIT, async {
            loop {
                a.send_datagram(b_addr, b"again".to_vec()).expect("queued");
                if let Ok(Some(m)) =
                    tokio::time::timeout(Duration::from_millis(100), b2_rx.recv()).await
                {
                    return m;
                }
            }
        })
        .await
    });
    let m = reached.expect("a reached b's new process before the idle timeout");
    assert_eq!(m.bytes, b"again");
    assert_eq!(m.peer.node_id.as_str(), "node-a");
    // And the other way: the new process reaches a.
    rt_b2
        .block_on(async { b2.send_datagram(a.listen_addr(), b"back".to_vec()) })
        .expect("queued");
    let back = rt_a.block_on(async {
        loop {
            let m = recv(&mut a_rx, "datagram from b's new process").await;
            if m.bytes == b"back" {
                return m;
            }
        }
    });
    assert_eq!(back.peer.node_id.as_str(), "node-b");
    rt_a.block_on(a.shutdown());
    rt_b2.block_on(b2.shutdown());
}
