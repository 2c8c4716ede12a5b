//! Peers without a valid certificate for our region are refused, counted, and never heard.

mod transport_support;

use shoal_transport::certs::{CertError, ExtraSans};
use shoal_transport::transport::{Inbound, Transport, TransportError};
use tokio::sync::mpsc;
use transport_support::{wait_until, Pki};

fn assert_nothing_delivered(rx: &mut mpsc::Receiver<Inbound>) {
    assert!(rx.try_recv().is_err(), "a refused peer delivered a message");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cert_from_another_ca_cannot_connect() {
    let pki = Pki::new("eu-west");
    let rogue_pki = Pki::new("eu-west");
    let (a, mut a_rx) = pki.bind("node-a");
    let (rogue, mut rogue_rx) = rogue_pki.bind("node-r");

    rogue
        .send_datagram(a.listen_addr(), b"let me in".to_vec())
        .unwrap();
    rogue
        .send_stream_message(a.listen_addr(), b"records".to_vec())
        .unwrap();
    wait_until("a refuses the rogue's handshake", || {
        a.counters().handshakes_refused >= 1
    })
    .await;
    wait_until("the rogue's dial fails", || {
        rogue.counters().connects_failed >= 1
    })
    .await;

    a.send_datagram(rogue.listen_addr(), b"hello?".to_vec())
        .unwrap();
    wait_until("a's dial to the rogue fails", || {
        a.counters().connects_failed >= 1
    })
    .await;
    wait_until("the rogue refuses a", || {
        rogue.counters().handshakes_refused >= 1
    })
    .await;

    let ca = a.counters();
    assert_eq!(ca.connections_open, 0, "{ca:?}");
    assert_eq!((ca.datagrams_in, ca.stream_msgs_in), (0, 0), "{ca:?}");
    assert_nothing_delivered(&mut a_rx);
    assert_nothing_delivered(&mut rogue_rx);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn binding_with_a_cert_of_another_ca_fails_clearly() {
    let pki = Pki::new("eu-west");
    let other = Pki::new("eu-west");
    let cert = other.node("node-x");
    let err = Transport::bind(pki.config("eu-west", &cert)).unwrap_err();
    assert!(
        matches!(err, TransportError::Cert(CertError::WrongCa)),
        "{err}"
    );
    // Printed as a binary prints an error chain (`{:#}`: each cause after ": "), the cause
    // appears once ("not signed by the given CA: not signed by the given CA" before).
    let mut chain = err.to_string();
    let mut cause = std::error::Error::source(&err);
    while let Some(c) = cause {
        chain.push_str(&format!(": {c}"));
        cause = c.source();
    }
    assert_eq!(
        chain.matches("not signed by the given CA").count(),
        1,
        "{chain}"
    );
    let cert = pki.node_in("node-x", "us-east", &ExtraSans::default());
    let err = Transport::bind(pki.config("eu-west", &cert)).unwrap_err();
    assert!(
        matches!(err, TransportError::Cert(CertError::WrongRegion { .. })),
        "{err}"
    );
}

/// A CA shared by two regions signs a node of region `us-east`: the TLS server name
/// `shoal.<region>` already keeps it out.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cert_of_another_region_is_refused() {
    let pki = Pki::new("eu-west");
    let (a, mut a_rx) = pki.bind("node-a");
    let other_cert = pki.node_in("node-o", "us-east", &ExtraSans::default());
    let (other, mut other_rx) = Transport::bind(pki.config("us-east", &other_cert)).unwrap();

    other
        .send_datagram(a.listen_addr(), b"hi".to_vec())
        .unwrap();
    wait_until("a refuses the other region", || {
        a.counters().handshakes_refused >= 1
    })
    .await;
    a.send_stream_message(other.listen_addr(), b"hi".to_vec())
        .unwrap();
    wait_until("a's dial to the other region fails", || {
        a.counters().connects_failed >= 1
    })
    .await;

    assert_eq!(a.counters().connections_open, 0);
    assert_nothing_delivered(&mut a_rx);
    assert_nothing_delivered(&mut other_rx);
}

/// The same, but the foreign cert also claims our server name `shoal.eu-west` in a DNS SAN:
/// TLS accepts it, and the identity check (region from the `shoal://` URI) refuses it on both
/// the dialling and the accepting side.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_foreign_cert_claiming_our_server_name_is_refused_by_identity() {
    let pki = Pki::new("eu-west");
    let (a, mut a_rx) = pki.bind("node-a");
    let sneaky = ExtraSans {
        ips: vec![],
        dns: vec!["shoal.eu-west".into()],
    };
    let other_cert = pki.node_in("node-o", "us-east", &sneaky);
    let (other, mut other_rx) = Transport::bind(pki.config("us-east", &other_cert)).unwrap();

    // a dials: TLS passes on both sides; a refuses the server's identity, `other` the client's.
    a.send_datagram(other.listen_addr(), b"hi".to_vec())
        .unwrap();
    wait_until("a refuses the dialled peer's identity", || {
        a.counters().handshakes_refused >= 1
    })
    .await;
    wait_until("a counts the failed dial", || {
        a.counters().connects_failed >= 1
    })
    .await;

    // other dials a: a's server accepts TLS, then refuses the identity.
    other
        .send_stream_message(a.listen_addr(), b"hi".to_vec())
        .unwrap();
    wait_until("a refuses the inbound identity", || {
        a.counters().handshakes_refused >= 2
    })
    .await;

    assert_eq!(a.counters().connections_open, 0);
    assert_nothing_delivered(&mut a_rx);
    assert_nothing_delivered(&mut other_rx);
}
