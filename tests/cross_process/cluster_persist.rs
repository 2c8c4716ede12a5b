//! Restart with a persisted snapshot while no peer is reachable: last endpoints, flagged stale.
//! A corrupt newest snapshot is refused and the older generation is served.

mod common;

use std::time::Duration;

use common::*;

#[test]
fn restart_without_peers_serves_last_endpoints_flagged_stale() {
    let mut c = Cluster::new(32, 2);
    c.start_all();
    c.wait_converged(2, Duration::from_secs(20));
    register_ready(&c.agents[1], "web-b", "10.2.0.2:80");
    eventually(Duration::from_secs(10), "web-b READY at node-a", || {
        (state_at(&c.agents[0], "web-b")? == ("READY".into(), true)).then_some(())
    });
    // Wait for a periodic snapshot holding the record (the final one on shutdown is newer).
    let snap = c.tmp.path().join("data-node-b").join("catalog.snap");
    eventually(
        Duration::from_secs(10),
        "a periodic snapshot with web-b",
        || {
            let bytes = std::fs::read(&snap).ok()?;
            bytes.windows(5).any(|w| w == b"web-b").then_some(())
        },
    );
    // Everyone goes away; B stops gracefully (final snapshot).
    c.agents[0].kill9();
    c.agents[1].stop();
    assert!(snap.exists());
    // Corrupt the newest generation: it must be refused, the previous one served.
    let mut bytes = std::fs::read(&snap).unwrap();
    let last = bytes.len() - 1;
    bytes[last] ^= 0x55;
    std::fs::write(&snap, bytes).unwrap();

    c.agents[1].start();
    let b = &c.agents[1];
    let v = eventually(
        Duration::from_secs(10),
        "node-b answers from its snapshot, stale",
        || {
            let (code, v) = b.get(&format!("{SVC}/endpoints"))?;
            (code == 200 && endpoint(&v, "web-b").is_some() && v["stale"] == true).then_some(v)
        },
    );
    assert_eq!(endpoint(&v, "web-b").unwrap()["state"], "READY");
    let (_, h) = b.get("/v1/agent/health").unwrap();
    assert_eq!(h["status"], "degraded");
    assert_eq!(h["refused_snapshots"].as_array().unwrap().len(), 1, "{h}");
    assert!(b.log().contains("persisted snapshot refused"));
    // Lifecycle writes fail clearly while the authority is unreachable.
    let (code, v) = b.post(&format!("{SVC}/instances/web-b/drain"), "").unwrap();
    assert_eq!(code, 503, "{v}");
    assert_eq!(v["error"], "authority unavailable");
}
