//! Certificate rotation of a running agent process: `shoal certs node --force` writes a new
//! certificate from the same CA, `kill -HUP` makes the agent reload it. New connections then
//! see the new certificate (another serial), a connection opened before keeps delivering, and a
//! bad file (a certificate of another node) is refused, counted, and the new-old one kept.

mod common;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::process::Command;
use std::time::Duration;

use common::*;
use shoal_proto::{NodeId, Region};
use shoal_transport::certs::{self, CertPair, ExtraSans, Validity, NODE_VALIDITY};
use shoal_transport::tls::{TlsMaterial, TlsState};
use shoal_transport::transport::{Transport, TransportConfig};

const METRICS: &str = "127.0.35.1:29464";

fn metrics() -> Option<String> {
    let mut s = TcpStream::connect(METRICS).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(10))).ok()?;
    s.write_all(b"GET /metrics HTTP/1.1\r\nHost: m\r\nConnection: close\r\n\r\n")
        .ok()?;
    let mut out = String::new();
    s.read_to_string(&mut out).ok()?;
    Some(out)
}

/// The value of the first sample line starting with `prefix` (name and labels).
fn sample(text: &str, prefix: &str) -> Option<f64> {
    text.lines()
        .find(|l| l.starts_with(prefix))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
}

fn sum(text: &str, prefix: &str) -> f64 {
    text.lines()
        .filter(|l| l.starts_with(prefix))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

fn hup(agent: &Agent) {
    let pid = agent.child.as_ref().expect("running").id();
    let ok = Command::new("kill")
        .args(["-HUP", &pid.to_string()])
        .status()
        .unwrap()
        .success();
    assert!(ok, "kill -HUP {pid}");
}

fn certs_node(dir: &std::path::Path, node: &str, force: bool) -> std::process::Output {
    let mut cmd = Command::new(common::shoal_bin());
    cmd.args([
        "certs",
        "node",
        "--node-id",
        node,
        "--region",
        "dev",
        "--out",
    ])
    .arg(dir);
    if force {
        cmd.arg("--force");
    }
    cmd.output().unwrap()
}

/// A client transport of the test itself (node `probe-N`, same CA) that dials `to` once.
async fn probe(ca: &CertPair, n: u32, to: std::net::SocketAddr) -> Transport {
    let region: Region = "dev".parse().unwrap();
    let pair = certs::generate_node_cert(
        ca,
        &NodeId::new(format!("probe-{n}")).unwrap(),
        &region,
        &ExtraSans::default(),
        Validity::from_now(NODE_VALIDITY),
    )
    .unwrap();
    let tls = TlsState::new(
        &region,
        &TlsMaterial {
            ca_pem: ca.cert_pem.clone(),
            cert_pem: pair.cert_pem,
            key_pem: pair.key_pem,
        },
    )
    .unwrap();
    let listen = format!("127.0.35.{}:0", 100 + n).parse().unwrap();
    let (t, _rx) = Transport::bind(TransportConfig::with_tls(listen, tls)).unwrap();
    t.send_stream_message(to, &b"not a shoal message"[..])
        .unwrap();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(15);
    while t.peer_certificate(to).is_none() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "probe {n} never connected"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    t
}

#[test]
fn sighup_rotates_the_agent_certificate_for_new_connections_only() {
    let mut c = Cluster::new(35, 2);
    let dir = c.tmp.path().to_path_buf();
    let text = std::fs::read_to_string(&c.agents[0].config).unwrap();
    std::fs::write(
        &c.agents[0].config,
        format!("metrics = \"{METRICS}\"\n{text}"),
    )
    .unwrap();
    c.start_all();
    c.wait_converged(2, Duration::from_secs(20));
    let a_addr: std::net::SocketAddr = c.agents[0].addr().parse().unwrap();
    let ca = CertPair {
        cert_pem: certs::read_pem_file(&dir.join("dev-ca.pem")).unwrap(),
        key_pem: certs::read_key_file(&dir.join("dev-ca-key.pem")).unwrap(),
    };
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();

    let m = eventually(Duration::from_secs(15), "tls metrics exported", || {
        let m = metrics()?;
        sample(&m, "shoal_tls_cert_expiry_seconds ").map(|_| m)
    });
    let expiry = sample(&m, "shoal_tls_cert_expiry_seconds ").unwrap();
    let year = 365.0 * 24.0 * 3600.0;
    assert!(expiry > year - 3600.0 && expiry <= year, "expiry {expiry}");
    assert_eq!(
        sample(&m, "shoal_tls_reloads_total{result=\"ok\"}"),
        Some(0.0)
    );

    // An existing connection, made before the rotation.
    let old_conn = rt.block_on(probe(&ca, 1, a_addr));
    let first = old_conn.peer_certificate(a_addr).unwrap();

    // Without --force the files are not touched, and the error names the file.
    let out = certs_node(&dir, "node-a", false);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("dev-node-node-a.pem") && err.contains("--force"),
        "{err}"
    );
    let out = certs_node(&dir, "node-a", true);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    hup(&c.agents[0]);
    eventually(Duration::from_secs(15), "reload counted ok", || {
        (sample(&metrics()?, "shoal_tls_reloads_total{result=\"ok\"}")? == 1.0).then_some(())
    });

    // A new connection sees the new certificate.
    let new_conn = rt.block_on(probe(&ca, 2, a_addr));
    let second = new_conn.peer_certificate(a_addr).unwrap();
    assert_ne!(second.serial, first.serial);
    assert_eq!(second.identity.node_id.as_str(), "node-a");

    // The old connection still delivers (the agent counts its junk message), and it is the
    // same connection: it still shows the old certificate.
    let junk = |m: &str| sum(m, "shoal_rejected_inputs_total{source=\"mesh\"");
    let before = junk(&metrics().unwrap());
    old_conn
        .send_stream_message(a_addr, &b"still here"[..])
        .unwrap();
    eventually(Duration::from_secs(15), "old connection delivers", || {
        (junk(&metrics()?) > before).then_some(())
    });
    assert_eq!(
        old_conn.peer_certificate(a_addr).unwrap().serial,
        first.serial
    );
    assert_eq!(old_conn.counters().connects_failed, 0);

    // A bad file: node-b's certificate and key in node-a's files. Refused, counted, kept.
    std::fs::copy(
        dir.join("dev-node-node-b.pem"),
        dir.join("dev-node-node-a.pem"),
    )
    .unwrap();
    std::fs::copy(
        dir.join("dev-node-node-b-key.pem"),
        dir.join("dev-node-node-a-key.pem"),
    )
    .unwrap();
    hup(&c.agents[0]);
    eventually(Duration::from_secs(15), "reload counted error", || {
        (sample(&metrics()?, "shoal_tls_reloads_total{result=\"error\"}")? == 1.0).then_some(())
    });
    assert!(c.agents[0].log().contains("TLS reload refused"));
    let third = rt.block_on(probe(&ca, 3, a_addr));
    assert_eq!(
        third.peer_certificate(a_addr).unwrap().serial,
        second.serial
    );
    let m = metrics().unwrap();
    assert_eq!(
        sample(&m, "shoal_tls_reloads_total{result=\"ok\"}"),
        Some(1.0)
    );

    // The mesh is still whole.
    c.wait_converged(2, Duration::from_secs(20));
    rt.block_on(async {
        for t in [old_conn, new_conn, third] {
            t.shutdown().await;
        }
    });
}
