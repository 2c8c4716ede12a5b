//! Hostile traffic on the mesh port: a peer refused again and again is logged once per interval
//! and kind and counted every time (QA: 12 INFO lines in 12 s from one peer with a certificate
//! of another CA); random datagrams, which quinn drops without counting, are counted at the
//! socket (QA: 86,000 dropped with no metric).

mod transport_support;

use std::io::Write;
use std::sync::{Arc, Mutex};

use transport_support::{wait_until, Pki};

/// Log lines written by the process-wide subscriber of this test binary.
#[derive(Clone, Default)]
struct Lines(Arc<Mutex<Vec<u8>>>);

impl Write for Lines {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refused_handshakes_are_counted_each_and_logged_once() {
    let lines = Lines::default();
    let writer = lines.clone();
    tracing_subscriber::fmt()
        .with_writer(move || writer.clone())
        .with_env_filter("info")
        .with_ansi(false)
        .init();

    let pki = Pki::new("eu-west");
    let (a, _a_rx) = pki.bind("node-a");
    const ROGUES: u64 = 5;
    let mut rogues = Vec::new();
    for i in 0..ROGUES {
        let rogue_pki = Pki::new("eu-west");
        let (rogue, _rx) = rogue_pki.bind(&format!("node-r{i}"));
        rogue
            .send_datagram(a.listen_addr(), b"let me in".to_vec())
            .unwrap();
        rogues.push((rogue, _rx));
    }
    wait_until("a refuses every rogue's handshake", || {
        a.counters().handshakes_refused >= ROGUES
    })
    .await;
    let text = String::from_utf8(lines.0.lock().unwrap().clone()).unwrap();
    let logged = text
        .lines()
        .filter(|l| l.contains("inbound connection refused"))
        .count();
    assert_eq!(logged, 1, "one line for {ROGUES} refusals:\n{text}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn random_datagrams_are_counted_as_unclaimed() {
    let pki = Pki::new("eu-west");
    let (a, _a_rx) = pki.bind("node-a");
    let before = a.quic_counters();
    let junk = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
    // Batches small enough for the socket buffer; each is waited for before the next.
    const BATCHES: u64 = 20;
    const PER_BATCH: u64 = 50;
    let mut x: u32 = 0x9e37_79b9;
    for b in 1..=BATCHES {
        for _ in 0..PER_BATCH {
            let bytes: Vec<u8> = (0..120)
                .map(|_| {
                    x ^= x << 13;
                    x ^= x >> 17;
                    x ^= x << 5;
                    x as u8
                })
                .collect();
            junk.send_to(&bytes, a.listen_addr()).unwrap();
        }
        wait_until("the socket counts the batch", || {
            a.quic_counters().socket_datagrams_in - before.socket_datagrams_in >= b * PER_BATCH
        })
        .await;
    }
    let after = a.quic_counters();
    let received = after.socket_datagrams_in - before.socket_datagrams_in;
    let claimed = after.packets_in - before.packets_in;
    assert!(received >= BATCHES * PER_BATCH, "{after:?}");
    assert_eq!(claimed, 0, "no connection took junk: {after:?}");
    assert_eq!(a.counters().datagrams_in, 0);
}
