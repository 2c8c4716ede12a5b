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

/// Two agents on one data directory: the second exits non-zero before it reads or writes
/// anything there (QA: it started, adopted the first's node key and bumped the shared boot
/// counter), naming the lock file and the running agent's pid; the first keeps serving.
#[test]
fn a_second_agent_on_the_same_data_dir_refuses_to_start() {
    let mut c = Cluster::new(39, 1);
    c.start_all();
    let a = &c.agents[0];
    eventually(Duration::from_secs(20), "the first agent answers", || {
        a.get("/v1/agent/self").map(|_| ())
    });
    let data = c.tmp.path().join("data-node-a");
    let key_before = std::fs::read(data.join("node.key")).unwrap();
    let boot_before = std::fs::read(data.join("boot")).unwrap();
    let pid = a.child.as_ref().unwrap().id();
    let out = std::process::Command::new(shoal_bin())
        .args(["agent", "--config"])
        .arg(&a.config)
        .env_remove("SHOAL_SOCKET")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "second agent started: {stderr}");
    let want = format!(
        "{}: held by a running agent (pid {pid}); stop it first",
        data.join("agent.lock").display()
    );
    assert!(stderr.contains(&want), "want `{want}` in: {stderr}");
    assert_eq!(std::fs::read(data.join("node.key")).unwrap(), key_before);
    assert_eq!(std::fs::read(data.join("boot")).unwrap(), boot_before);
    let (code, _) = a.get("/v1/agent/self").unwrap();
    assert_eq!(code, 200, "the first agent still serves");
    // Once the first is gone, the lock (and its stale pid) does not block a start.
    c.agents[0].stop();
    c.agents[0].start();
    let a = &c.agents[0];
    eventually(
        Duration::from_secs(20),
        "the restarted agent answers",
        || a.get("/v1/agent/self").map(|_| ()),
    );
}
