//! Certificate rotation without a restart: after `TlsState::reload`, new connections present
//! the new certificate (and trust the new CA bundle) while connections opened before keep
//! running; bad material is refused, counted, and the old material stays in use.

mod transport_support;

use std::time::{Duration, SystemTime};

use shoal_proto::NodeId;
use shoal_transport::certs::{
    generate_ca, generate_node_cert, CertError, CertPair, ExtraSans, Validity, CA_VALIDITY,
};
use shoal_transport::tls::{TlsMaterial, TlsState};
use shoal_transport::transport::{Transport, TransportConfig};
use transport_support::{recv, wait_until, Pki};

fn material(pki: &Pki, cert: &CertPair) -> TlsMaterial {
    TlsMaterial {
        ca_pem: pki.ca.cert_pem.clone(),
        cert_pem: cert.cert_pem.clone(),
        key_pem: cert.key_pem.clone(),
    }
}

fn cert_valid_for(pki: &Pki, node: &str, lifetime: Duration) -> CertPair {
    generate_node_cert(
        &pki.ca,
        &NodeId::new(node).unwrap(),
        &pki.region,
        &ExtraSans::default(),
        Validity::from_now(lifetime),
    )
    .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rotated_certificate_is_presented_on_new_connections_and_old_ones_survive() {
    let pki = Pki::new("eu-west");
    let day = Duration::from_secs(24 * 3600);
    let a1 = cert_valid_for(&pki, "a", 30 * day);
    let tls = TlsState::new(&pki.region, &material(&pki, &a1)).unwrap();
    let first = tls.info();
    let (a, mut a_rx) = Transport::bind(TransportConfig::with_tls(
        "127.0.0.1:0".parse().unwrap(),
        tls.clone(),
    ))
    .unwrap();
    let (b, _b_rx) = pki.bind("b");

    // b dials a: the connection authenticates a with its first certificate.
    b.send_stream_message(a.listen_addr(), &b"before"[..])
        .unwrap();
    assert_eq!(
        recv(&mut a_rx, "message before rotation").await.bytes,
        b"before"
    );
    assert_eq!(
        b.peer_certificate(a.listen_addr()).unwrap().serial,
        first.serial
    );

    // Rotate: a new certificate from the same CA, another serial and notAfter.
    let a2 = cert_valid_for(&pki, "a", 60 * day);
    let second = a.tls().reload(&material(&pki, &a2)).unwrap();
    assert_ne!(second.serial, first.serial);
    assert!(second.not_after > first.not_after + 29 * day);
    assert_eq!(
        tls.info(),
        second,
        "the shared state and the transport are one"
    );
    assert_eq!(tls.reload_counts().ok, 1);

    // The existing connection keeps going, still authenticated by the old certificate.
    b.send_stream_message(a.listen_addr(), &b"after"[..])
        .unwrap();
    let m = recv(&mut a_rx, "message on the old connection").await;
    assert_eq!(m.bytes, b"after");
    assert_eq!(m.peer.node_id.as_str(), "b");
    assert_eq!(
        b.peer_certificate(a.listen_addr()).unwrap().serial,
        first.serial
    );
    assert_eq!(b.counters().connects_failed, 0);

    // A new connection to a (server side) sees the new certificate.
    let (c, _c_rx) = pki.bind("c");
    c.send_stream_message(a.listen_addr(), &b"from c"[..])
        .unwrap();
    assert_eq!(recv(&mut a_rx, "message from c").await.bytes, b"from c");
    assert_eq!(
        c.peer_certificate(a.listen_addr()).unwrap().serial,
        second.serial
    );

    // A new connection a dials (client side) presents the new certificate too.
    let (d, mut d_rx) = pki.bind("d");
    a.send_stream_message(d.listen_addr(), &b"from a"[..])
        .unwrap();
    let m = recv(&mut d_rx, "message from a").await;
    assert_eq!(m.peer.node_id.as_str(), "a");
    wait_until("d files a's connection", || {
        d.peer_certificate(a.listen_addr()).is_some()
    })
    .await;
    assert_eq!(
        d.peer_certificate(a.listen_addr()).unwrap().serial,
        second.serial
    );

    a.shutdown().await;
    b.shutdown().await;
    c.shutdown().await;
    d.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_material_is_refused_counted_and_the_old_one_kept() {
    let pki = Pki::new("eu-west");
    let good = pki.node("a");
    let (a, mut a_rx) = Transport::bind(pki.config("eu-west", &good)).unwrap();
    let kept = a.tls().info();

    let mut m = material(&pki, &good);
    m.cert_pem = "-----BEGIN CERTIFICATE-----\ngarbage\n-----END CERTIFICATE-----\n".into();
    let err = a.tls().reload(&m).unwrap_err();
    assert!(
        matches!(err, CertError::NotPem { .. } | CertError::Invalid(_)),
        "{err}"
    );

    let other_node = pki.node("z");
    let err = a.tls().reload(&material(&pki, &other_node)).unwrap_err();
    assert!(matches!(err, CertError::WrongIdentity { .. }), "{err}");

    let other_region = pki.node_in("a", "us-east", &ExtraSans::default());
    let err = a.tls().reload(&material(&pki, &other_region)).unwrap_err();
    assert!(matches!(err, CertError::WrongRegion { .. }), "{err}");

    let now = SystemTime::now();
    let expired = generate_node_cert(
        &pki.ca,
        &NodeId::new("a").unwrap(),
        &pki.region,
        &ExtraSans::default(),
        Validity {
            not_before: now - Duration::from_secs(7200),
            not_after: now - Duration::from_secs(60),
        },
    )
    .unwrap();
    let err = a.tls().reload(&material(&pki, &expired)).unwrap_err();
    assert!(matches!(err, CertError::Expired), "{err}");

    let fresh = pki.node("a");
    let mut mismatched = material(&pki, &fresh);
    mismatched.key_pem = good.key_pem.clone();
    let err = a.tls().reload(&mismatched).unwrap_err();
    assert!(matches!(err, CertError::KeyMismatch), "{err}");

    let other_ca = generate_ca(&pki.region, Validity::from_now(CA_VALIDITY)).unwrap();
    let mut wrong_ca = material(&pki, &fresh);
    wrong_ca.ca_pem = other_ca.cert_pem;
    let err = a.tls().reload(&wrong_ca).unwrap_err();
    assert!(matches!(err, CertError::WrongCa), "{err}");

    let counts = a.tls().reload_counts();
    assert_eq!((counts.ok, counts.failed), (0, 6));
    assert_eq!(a.tls().info(), kept);

    // The old material still serves new connections.
    let (b, _b_rx) = pki.bind("b");
    b.send_stream_message(a.listen_addr(), &b"still up"[..])
        .unwrap();
    assert_eq!(
        recv(&mut a_rx, "message after refusals").await.bytes,
        b"still up"
    );
    assert_eq!(
        b.peer_certificate(a.listen_addr()).unwrap().serial,
        kept.serial
    );
    a.shutdown().await;
    b.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reloaded_ca_bundle_decides_who_may_connect_next() {
    let old = Pki::new("eu-west");
    let new_ca = Pki {
        region: old.region.clone(),
        ca: generate_ca(&old.region, Validity::from_now(CA_VALIDITY)).unwrap(),
    };
    let (a, mut a_rx) = Transport::bind(old.config("eu-west", &old.node("a"))).unwrap();
    let (b_old, _rx1) = old.bind("b");
    b_old
        .send_stream_message(a.listen_addr(), &b"old ca"[..])
        .unwrap();
    assert_eq!(recv(&mut a_rx, "old-CA peer").await.bytes, b"old ca");

    // a moves to the new CA only (its own certificate reissued by it).
    let a_new = new_ca.node("a");
    a.tls().reload(&material(&new_ca, &a_new)).unwrap();

    // A new peer of the old CA is refused; one of the new CA gets through; the old-CA
    // connection opened before the reload keeps delivering.
    let (c_old, _rx2) = old.bind("c");
    c_old
        .send_stream_message(a.listen_addr(), &b"refused"[..])
        .unwrap();
    wait_until("c's dial fails", || c_old.counters().connects_failed >= 1).await;
    let (d_new, _rx3) = new_ca.bind("d");
    d_new
        .send_stream_message(a.listen_addr(), &b"new ca"[..])
        .unwrap();
    b_old
        .send_stream_message(a.listen_addr(), &b"old conn"[..])
        .unwrap();
    let mut got = vec![
        recv(&mut a_rx, "first").await.bytes,
        recv(&mut a_rx, "second").await.bytes,
    ];
    got.sort();
    assert_eq!(got, vec![b"new ca".to_vec(), b"old conn".to_vec()]);
    for t in [a, b_old, c_old, d_new] {
        t.shutdown().await;
    }
}
