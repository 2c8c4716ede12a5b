//! Liveness vs readiness (`/v1/agent/live`, `/v1/agent/ready`; issue 18): an authority outage
//! turns `/v1/agent/health` to 503 but never fails liveness or readiness, and an agent that
//! has not joined its mesh yet is live but not ready.

mod common;

use std::time::Duration;

use common::*;

#[test]
fn authority_outage_fails_health_but_never_liveness_or_readiness() {
    let mut c = Cluster::new(84, 2);
    // node-b alone first: its seed (node-a, also the dev authority) is not running.
    c.agents[1].start();
    let b = &c.agents[1];
    let (code, v) = eventually(Duration::from_secs(10), "node-b answers", || {
        b.get("/v1/agent/live")
    });
    assert_eq!(code, 200, "{v}");
    assert_eq!(v["status"], "live");
    let (code, v) = b.get("/v1/agent/ready").unwrap();
    assert_eq!(code, 503, "not joined, no snapshot: not ready yet: {v}");
    assert_eq!(v["status"], "starting");
    assert!(
        v["reason"].as_str().unwrap().contains("not yet joined"),
        "{v}"
    );

    c.agents[0].start();
    c.wait_converged(2, Duration::from_secs(20));
    let b = &c.agents[1];
    let (code, v) = b.get("/v1/agent/ready").unwrap();
    assert_eq!(code, 200, "{v}");
    assert_eq!(v["status"], "ready");
    register_ready(b, "web-b", "10.84.0.2:80");

    // The authority (and the only peer) goes away: health degrades, liveness and readiness stay.
    c.agents[0].kill9();
    let b = &c.agents[1];
    let (_, h) = eventually(
        Duration::from_secs(20),
        "node-b health degraded and its view stale",
        || {
            let (code, v) = b.get("/v1/agent/health")?;
            (code == 503 && v["stale"] == true).then_some((code, v))
        },
    );
    assert_eq!(h["status"], "degraded");
    for path in ["/v1/agent/live", "/v1/agent/ready"] {
        let (code, v) = b.get(path).unwrap();
        assert_eq!(code, 200, "{path} during the outage: {v}");
        assert_eq!(v["stale"], true, "{path}: {v}");
    }
    // And the view is still served.
    let (code, v) = b.get(&format!("{SVC}/endpoints")).unwrap();
    assert_eq!(code, 200, "{v}");
    assert!(endpoint(&v, "web-b").is_some(), "{v}");
    // The log is a file, not a terminal: no ANSI colour codes in it.
    let log = b.log();
    assert!(log.contains("local API listening"), "{log}");
    assert!(!log.contains('\x1b'), "ANSI escape in a log file");
}

/// systemd `Type=notify`: the agent sends `READY=1` on `$NOTIFY_SOCKET` once its local API
/// listens (the socket answers by then) and `STOPPING=1` when SIGTERM arrives.
#[test]
fn agent_notifies_the_service_manager_when_ready_and_stopping() {
    use std::os::unix::net::UnixDatagram;
    use std::process::{Command, Stdio};

    let c = Cluster::new(85, 1);
    let a = &c.agents[0];
    let notify_path = c.tmp.path().join("notify.sock");
    let notify = UnixDatagram::bind(&notify_path).unwrap();
    notify
        .set_read_timeout(Some(Duration::from_secs(20)))
        .unwrap();
    let log = std::fs::File::create(c.tmp.path().join("notify-agent.log")).unwrap();
    let mut child = Command::new(common::shoal_bin())
        .args(["agent", "--config"])
        .arg(&a.config)
        .current_dir(c.tmp.path())
        .env("NOTIFY_SOCKET", &notify_path)
        .env_remove("SHOAL_SOCKET")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(log)
        .spawn()
        .unwrap();
    let mut buf = [0u8; 512];
    let n = notify.recv(&mut buf).expect("a notification within 20 s");
    let msg = String::from_utf8_lossy(&buf[..n]).to_string();
    assert!(msg.lines().any(|l| l == "READY=1"), "{msg:?}");
    let (code, v) = a
        .get("/v1/agent/live")
        .expect("socket answers once READY=1 was sent");
    assert_eq!(code, 200, "{v}");
    Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .unwrap();
    let n = notify.recv(&mut buf).expect("STOPPING=1 within 20 s");
    let msg = String::from_utf8_lossy(&buf[..n]).to_string();
    assert!(msg.lines().any(|l| l == "STOPPING=1"), "{msg:?}");
    let status = child.wait().unwrap();
    assert!(status.success(), "{status}");
}

/// `shoal members` (issue 18): a killed node does not vanish, it is listed `down` with the time
/// since the change; this agent's own row carries its zone and version.
#[test]
fn members_list_a_killed_node_as_down_with_its_last_change() {
    let mut c = Cluster::new(86, 3);
    c.start_all();
    c.wait_converged(3, Duration::from_secs(30));
    c.agents[2].kill9();
    let a = &c.agents[0];
    let row = eventually(detection_bound(), "node-c down at node-a", || {
        let (_, v) = a.get("/v1/agent/members")?;
        let m = v["members"]
            .as_array()?
            .iter()
            .find(|m| m["node"] == "node-c")?;
        (m["state"] == "down").then(|| m.clone())
    });
    assert!(row["last_change_ms_ago"].as_u64().is_some(), "{row}");
    assert_eq!(row["address"], c.agents[2].addr(), "{row}");
    let (_, v) = a.get("/v1/agent/members").unwrap();
    let me = &v["members"][0];
    assert_eq!(
        (me["node"].as_str(), me["state"].as_str()),
        (Some("node-a"), Some("self"))
    );
    assert_eq!(me["zone"], "z1");
    assert_eq!(me["version"], env!("CARGO_PKG_VERSION"));
    let b = v["members"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["node"] == "node-b")
        .unwrap();
    assert!(
        ["alive", "suspect"].contains(&b["state"].as_str().unwrap()),
        "{b}"
    );
    // The table names the state and the change.
    let out = std::process::Command::new(common::shoal_bin())
        .arg("--socket")
        .arg(&a.socket)
        .arg("members")
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{text}");
    let line = text.lines().find(|l| l.starts_with("node-c")).unwrap();
    assert!(line.contains("down") && line.contains("s ago"), "{text}");
    assert!(
        text.lines().next().unwrap().contains("LAST CHANGE"),
        "{text}"
    );
}
