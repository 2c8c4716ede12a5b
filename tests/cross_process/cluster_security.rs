//! An agent whose certificate comes from another CA cannot join.

mod common;

use std::time::Duration;

use common::*;
use shoal_proto::{NodeId, Region};
use shoal_transport::certs;

#[test]
fn agent_with_foreign_ca_cannot_join() {
    let mut c = Cluster::new(33, 1);
    c.start_all();
    let dir = c.tmp.path();
    let other = dir.join("other");
    std::fs::create_dir_all(&other).unwrap();
    let region: Region = "dev".parse().unwrap();
    let ca = certs::create_ca(&region, &other).unwrap();
    certs::create_node_cert(
        &ca,
        &"node-x".parse::<NodeId>().unwrap(),
        &region,
        &certs::ExtraSans::default(),
        &other,
    )
    .unwrap();
    for f in [
        "dev-ca.pem",
        "dev-node-node-x.pem",
        "dev-node-node-x-key.pem",
    ] {
        std::fs::copy(other.join(f), dir.join(format!("x-{f}"))).unwrap();
    }
    let mut x = write_agent(
        dir,
        "node-x",
        "127.0.33.9",
        &c.agents[0].addr(),
        false,
        "x-dev-ca.pem",
    );
    let text = std::fs::read_to_string(&x.config)
        .unwrap()
        .replace(
            "cert = \"dev-node-node-x.pem\"",
            "cert = \"x-dev-node-node-x.pem\"",
        )
        .replace(
            "key = \"dev-node-node-x-key.pem\"",
            "key = \"x-dev-node-node-x-key.pem\"",
        );
    std::fs::write(&x.config, text).unwrap();
    x.start();
    // x logs at debug so its failed dials are visible.
    // Wait until the handshake was refused on either side (logged), then check nobody joined.
    let a = &c.agents[0];
    eventually(Duration::from_secs(15), "a refused handshake", || {
        (a.log().contains("inbound connection refused") || x.log().contains("dial failed"))
            .then_some(())
    });
    let (_, v) = a.get("/v1/agent/self").unwrap();
    assert_eq!(v["members"], 0, "{v}");
    let (_, v) = x.get("/v1/agent/self").unwrap();
    assert_eq!(v["members"], 0, "{v}");
    assert_eq!(v["active"], false, "{v}");

    // The joining side says why (QA, 2026-12-04: it logged nothing for 70 s, only the seed
    // did): a warning naming the peer and the TLS error, at most once a minute per peer.
    let refusals = || {
        strip_ansi(&x.log())
            .lines()
            .filter(|l| l.contains("cannot connect to peer") && l.contains(&a.addr()))
            .map(str::to_owned)
            .collect::<Vec<_>>()
    };
    let line = eventually(
        Duration::from_secs(15),
        "x logs its failed handshake",
        || refusals().into_iter().next(),
    );
    assert!(
        line.contains("WARN") && line.contains("handshake"),
        "{line}"
    );
    // A write through x names the handshake failure, not a bare timeout.
    let (code, v) = x
        .post(
            &format!("{SVC}/register"),
            "{\"instance\":\"x-1\",\"address\":\"10.33.0.1:80\"}",
        )
        .unwrap();
    assert_eq!(code, 503, "{v}");
    let detail = v["detail"].as_str().unwrap_or_default();
    assert!(
        detail.contains("connecting failed") && detail.contains("handshake"),
        "{v}"
    );
    // x kept dialling the seed all along (every 0.5 s at least), and logged it once.
    assert_eq!(refusals().len(), 1, "{}", x.log());
}
