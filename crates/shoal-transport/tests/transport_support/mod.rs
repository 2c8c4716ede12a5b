//! Helpers shared by the transport tests: a throwaway PKI, transports on 127.0.0.1 ephemeral
//! ports, and bounded waits (never a bare sleep to synchronise).

#![allow(dead_code)]

use std::time::Duration;

use shoal_proto::{NodeId, Region};
use shoal_transport::certs::{
    generate_ca, generate_node_cert, CertPair, ExtraSans, Validity, CA_VALIDITY, NODE_VALIDITY,
};
use shoal_transport::transport::{Inbound, Transport, TransportConfig};
use tokio::sync::mpsc;

/// How long any single expectation may take before the test fails.
pub const WAIT: Duration = Duration::from_secs(10);

/// A region CA held in memory.
pub struct Pki {
    pub region: Region,
    pub ca: CertPair,
}

impl Pki {
    pub fn new(region: &str) -> Self {
        let region = Region::new(region).unwrap();
        let ca = generate_ca(&region, Validity::from_now(CA_VALIDITY)).unwrap();
        Self { region, ca }
    }

    /// A node certificate of `region` (not necessarily the CA's own) signed by this CA.
    pub fn node_in(&self, node: &str, region: &str, extra: &ExtraSans) -> CertPair {
        generate_node_cert(
            &self.ca,
            &NodeId::new(node).unwrap(),
            &Region::new(region).unwrap(),
            extra,
            Validity::from_now(NODE_VALIDITY),
        )
        .unwrap()
    }

    pub fn node(&self, node: &str) -> CertPair {
        self.node_in(node, self.region.as_str(), &ExtraSans::default())
    }

    /// A config for a transport on 127.0.0.1:0 trusting this CA and presenting `cert`.
    pub fn config(&self, region: &str, cert: &CertPair) -> TransportConfig {
        let mut c = TransportConfig::new(
            "127.0.0.1:0".parse().unwrap(),
            Region::new(region).unwrap(),
            self.ca.cert_pem.clone(),
            cert.cert_pem.clone(),
            cert.key_pem.clone(),
        );
        c.idle_timeout_ms = 10_000;
        c.keep_alive_ms = 2_000;
        c
    }

    /// Binds a transport for node `node` of this CA's region with default limits.
    pub fn bind(&self, node: &str) -> (Transport, mpsc::Receiver<Inbound>) {
        let cert = self.node(node);
        Transport::bind(self.config(self.region.as_str(), &cert)).unwrap()
    }
}

/// The next inbound message, or a test failure after [`WAIT`].
pub async fn recv(rx: &mut mpsc::Receiver<Inbound>, what: &str) -> Inbound {
    tokio::time::timeout(WAIT, rx.recv())
        .await
        .unwrap_or_else(|_| panic!("timed out waiting for {what}"))
        .unwrap_or_else(|| panic!("inbound channel closed while waiting for {what}"))
}

/// Polls `cond` until it holds, failing the test after [`WAIT`]. For conditions that have no
/// event to await (counters moved by the transport's own tasks).
pub async fn wait_until(what: &str, mut cond: impl FnMut() -> bool) {
    let deadline = tokio::time::Instant::now() + WAIT;
    while !cond() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out waiting until {what}"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}
