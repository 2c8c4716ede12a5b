//! Renewal writes at the region authority (issue 17, docs/adr/0018): three real
//! `shoal authority run` replicas with their embedded mesh members and three agents.
//!
//! In steady state nothing renews through the authority (a live node renews its instances'
//! leases by answering SWIM probes). An owner node frozen with SIGSTOP is held down by the
//! leader (`NodeDown`); thawed, it answers again and the leader commits one `NodeUp`, the
//! renewal write: `shoal_renewal_writes_total` moves by one and `shoal_leases_renewed_total`
//! by the live instances the node owns. Every wait polls with a bounded deadline.

mod common;

use std::io::{Read, Write};
use std::process::Command;
use std::time::Duration;

use common::{eventually, Agent};

#[path = "common/authority.rs"]
mod authority;

use authority::*;

const SUBNET: u8 = 93;

/// Sum over every series of `name` in the scrape of replica `i` (0 when unreachable).
fn replica_metric(i: usize, name: &str) -> f64 {
    let Ok(mut s) = std::net::TcpStream::connect(format!("{}:{METRICS_PORT}", auth_ip(SUBNET, i)))
    else {
        return 0.0;
    };
    let _ = s.set_read_timeout(Some(Duration::from_secs(5)));
    let _ = s.write_all(b"GET /metrics HTTP/1.0\r\n\r\n");
    let mut out = String::new();
    let _ = s.read_to_string(&mut out);
    out.lines()
        .filter(|l| {
            l.strip_prefix(name)
                .is_some_and(|rest| rest.starts_with(' ') || rest.starts_with('{'))
        })
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

fn sum_over_replicas(name: &str) -> f64 {
    (0..3).map(|i| replica_metric(i, name)).sum()
}

fn signal(agent: &Agent, sig: &str) {
    let pid = agent.child.as_ref().expect("agent running").id();
    let ok = Command::new("kill")
        .args([sig, &pid.to_string()])
        .status()
        .unwrap()
        .success();
    assert!(ok, "kill {sig} {pid}");
}

#[test]
fn a_node_held_down_and_seen_alive_again_is_one_renewal_write_of_all_its_leases() {
    let mut r = Region3::new(SUBNET, 3);
    for (i, a) in r.auths.iter().enumerate() {
        let text = std::fs::read_to_string(&a.config).unwrap();
        let top = format!(
            "metrics_addr = \"{}:{METRICS_PORT}\"\n{text}",
            auth_ip(SUBNET, i)
        );
        std::fs::write(&a.config, top).unwrap();
    }
    r.start_all();
    for a in &r.agents {
        wait_members(a, 5);
    }
    for inst in ["web-1", "web-22"] {
        register(&r.agents[1], inst, Some(120_000));
        transition(&r.agents[1], inst, "ready");
        wait_state(&r.agents[0], inst, "READY");
    }
    eventually(WAIT, "every replica serves metrics", || {
        (0..3)
            .all(|i| {
                std::net::TcpStream::connect(format!("{}:{METRICS_PORT}", auth_ip(SUBNET, i)))
                    .is_ok()
            })
            .then_some(())
    });
    assert_eq!(
        sum_over_replicas("shoal_renewal_writes_total"),
        0.0,
        "live nodes renew nothing through the authority"
    );

    signal(&r.agents[1], "-STOP");
    let downs = eventually(
        WAIT + common::detection_bound(),
        "the leader holds node-b down (NodeDown committed)",
        || {
            let n = sum_over_replicas("shoal_authority_liveness_proposals_total");
            (n >= 1.0).then_some(n)
        },
    );
    signal(&r.agents[1], "-CONT");
    let writes = eventually(
        WAIT + common::detection_bound(),
        "node-b seen alive again: a renewal write",
        || {
            let n = sum_over_replicas("shoal_renewal_writes_total");
            (n >= 1.0).then_some(n)
        },
    );
    let leases = sum_over_replicas("shoal_leases_renewed_total");
    eprintln!("liveness proposals before the thaw: {downs}; renewal writes: {writes}; leases renewed: {leases}");
    // One NodeUp per time node-b came back (a second freeze-thaw cycle by SWIM flapping would
    // be a second write); each renews both of its leases.
    assert_eq!(
        leases,
        2.0 * writes,
        "each renewal write renewed both of node-b's leases"
    );
    wait_state(&r.agents[0], "web-1", "READY");
}
