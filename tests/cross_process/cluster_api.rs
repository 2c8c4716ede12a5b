//! The local API on a single dev agent: blocking queries wake on change; bad input gets 400
//! and the agent keeps serving.

mod common;

use std::time::{Duration, Instant};

use common::*;

#[test]
fn blocking_query_wakes_on_change_and_bad_input_is_refused() {
    let mut c = Cluster::new(34, 1);
    c.start_all();
    let a = &c.agents[0];
    let (_, v) = eventually(Duration::from_secs(10), "agent up", || {
        a.get(&format!("{SVC}/endpoints"))
    });
    let index = v["index"].as_u64().unwrap();
    let socket = a.socket.clone();
    let started = Instant::now();
    let waiter = std::thread::spawn(move || {
        http(
            &socket,
            "GET",
            &format!("{SVC}/endpoints?index={index}&wait=30s"),
            None,
        )
    });
    register_ready(a, "web-1", "10.4.0.1:80");
    let (code, v) = waiter.join().unwrap().unwrap();
    assert_eq!(code, 200);
    assert!(v["index"].as_u64().unwrap() > index);
    assert!(
        started.elapsed() < Duration::from_secs(25),
        "blocking query did not wake early"
    );

    // Bad input: 400 (413 for an oversized body) with a JSON error, and the agent keeps serving.
    let bad = [
        ("POST", format!("{SVC}/register"), "{not json".to_owned()),
        (
            "POST",
            format!("{SVC}/register"),
            "{\"instance\":\"x\",\"address\":\"10.0.0.1:1\",\"bogus\":1}".to_owned(),
        ),
        (
            "POST",
            format!("{SVC}/register"),
            format!("{{\"instance\":\"{}\"}}", "x".repeat(70 * 1024)),
        ),
        (
            "GET",
            "/v1/services/Prod/web/http/endpoints".to_owned(),
            String::new(),
        ),
        (
            "GET",
            format!("{SVC}/endpoints?label=nope:x"),
            String::new(),
        ),
        (
            "POST",
            format!("{SVC}/report"),
            "{\"instance\":\"web-1\",\"outcome\":\"meh\"}".to_owned(),
        ),
    ];
    for (m, p, b) in &bad {
        let (code, v) = http(&a.socket, m, p, Some(b)).unwrap();
        // An oversized body is 413 (Payload Too Large), every other bad input 400.
        let want = if b.len() > 64 * 1024 { 413 } else { 400 };
        assert_eq!(code, want, "{m} {p}: {v}");
        assert!(v["error"].is_string(), "{v}");
    }
    // Filters, pick and local ejection.
    let (_, v) = a
        .get(&format!("{SVC}/endpoints?state=READY&label=protocol:http2"))
        .unwrap();
    assert_eq!(v["endpoints"].as_array().unwrap().len(), 1);
    let (_, v) = a
        .get(&format!("{SVC}/endpoints?label=protocol:grpc"))
        .unwrap();
    assert_eq!(v["endpoints"].as_array().unwrap().len(), 0);
    let (code, v) = a.get(&format!("{SVC}/pick")).unwrap();
    assert_eq!(code, 200, "{v}");
    assert_eq!(v["endpoint"]["instance"], "web-1");
    // A report naming another generation than the catalog's is refused and ejects nothing
    // (each would otherwise take a slot of the node-wide ejection table).
    let g = v["endpoint"]["generation"].as_u64().unwrap();
    let (code, v) = a
        .post(
            &format!("{SVC}/report"),
            &format!(
                "{{\"instance\":\"web-1\",\"outcome\":\"timeout\",\"generation\":{}}}",
                g + 1_000
            ),
        )
        .unwrap();
    assert_eq!(
        (code, v["reason"].as_str(), v["generation"].as_u64()),
        (409, Some("generation_mismatch"), Some(g)),
        "{v}"
    );
    let (code, v) = a.get(&format!("{SVC}/pick")).unwrap();
    assert_eq!(
        (code, v["endpoint"]["instance"].as_str()),
        (200, Some("web-1")),
        "{v}"
    );
    // Reports cannot empty a service: the last routable endpoint is never ejected.
    let (code, v) = a
        .post(
            &format!("{SVC}/report"),
            "{\"instance\":\"web-1\",\"outcome\":\"connect_refused\",\"eject_ms\":60000}",
        )
        .unwrap();
    assert_eq!(
        (code, v["reason"].as_str(), v["limit"].as_u64()),
        (409, Some("ejection_cap"), Some(0)),
        "{v}"
    );
    let (code, v) = a.get(&format!("{SVC}/pick")).unwrap();
    assert_eq!(
        (code, v["endpoint"]["instance"].as_str()),
        (200, Some("web-1")),
        "{v}"
    );
    let (_, v) = a.get(&format!("{SVC}/endpoints")).unwrap();
    let e = endpoint(&v, "web-1").unwrap();
    assert_eq!(
        (e["state"].as_str(), e["ejected"].as_bool()),
        (Some("READY"), Some(false))
    );
    let (code, _) = a.get("/v1/openapi.json").unwrap();
    assert_eq!(code, 200);
}

/// Fresh-eyes QA of 2026-12-04 on the local API, on two agents:
/// * failure reports cannot take a whole service out of rotation: at most
///   `[api] max_ejection_percent` (50) of its routable endpoints (at least one) are ejected at
///   once, the rest are answered 409 `ejection_cap`, counted and logged with the caller;
/// * endpoint addresses nobody can call (unspecified, port 0, multicast, broadcast,
///   link-local) are refused at registration with 400 `bad_address`;
/// * a lease the authority would refuse is a 400 `bad_lease`, not the authority's 409;
/// * one uid owns at most `[api] max_instances_per_caller` instances of a node (429
///   `instance_limit` past it);
/// * a method a path does not take gets 405 with a JSON body and an `Allow` header;
/// * the lifecycle route's 403 (instance on another node) and 404 carry `error` and `reason`.
#[test]
fn ejection_cap_address_checks_and_error_shapes() {
    const METRICS: &str = "127.0.48.1:29548";
    let mut c = Cluster::new(48, 2);
    let text = std::fs::read_to_string(&c.agents[0].config)
        .unwrap()
        .replace(
            "cluster_size = 8\n",
            &format!("cluster_size = 8\nmetrics = \"{METRICS}\"\n"),
        );
    std::fs::write(&c.agents[0].config, text).unwrap();
    // B lets one uid own two instances.
    let text = std::fs::read_to_string(&c.agents[1].config)
        .unwrap()
        .replace("[api]\n", "[api]\nmax_instances_per_caller = 2\n");
    std::fs::write(&c.agents[1].config, text).unwrap();
    c.start_all();
    c.wait_converged(2, Duration::from_secs(30));
    let a = &c.agents[0];
    let b = &c.agents[1];
    for i in 1..=4 {
        register_ready(a, &format!("web-{i}"), &format!("10.48.0.{i}:8080"));
    }

    // Ejection cap: 4 routable endpoints, 50 %: two may be ejected, the third report is
    // refused and ejects nothing; a report renewing an ejection in force is not refused.
    let report = |instance: &str| {
        a.post(
            &format!("{SVC}/report"),
            &format!("{{\"instance\":\"{instance}\",\"outcome\":\"timeout\",\"eject_ms\":600000}}"),
        )
        .unwrap()
    };
    for instance in ["web-1", "web-2"] {
        let (code, v) = report(instance);
        assert_eq!(code, 200, "{instance}: {v}");
        assert_eq!(v["ejected_for_ms"], 600_000, "{v}");
    }
    for instance in ["web-3", "web-4"] {
        let (code, v) = report(instance);
        assert_eq!(code, 409, "{instance}: {v}");
        assert_eq!(v["reason"], "ejection_cap", "{v}");
        assert!(
            v["error"].as_str().unwrap().starts_with("not applied"),
            "{v}"
        );
        assert_eq!(
            (
                v["ejected"].as_u64(),
                v["routable"].as_u64(),
                v["limit"].as_u64()
            ),
            (Some(2), Some(4), Some(2)),
            "{v}"
        );
    }
    let (code, v) = report("web-1");
    assert_eq!(code, 200, "renewal: {v}");
    let (_, v) = a.get(&format!("{SVC}/endpoints")).unwrap();
    let mut routable: Vec<&str> = v["endpoints"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["routable"] == true)
        .map(|e| e["instance"].as_str().unwrap())
        .collect();
    routable.sort_unstable();
    assert_eq!(routable, ["web-3", "web-4"], "{v}");
    for _ in 0..8 {
        let (code, v) = a.get(&format!("{SVC}/pick")).unwrap();
        assert_eq!(code, 200, "{v}");
    }
    let m = metrics_text(METRICS);
    let ejections =
        |outcome| metric_sum(&m, "shoal_local_ejections_total", &[("outcome", outcome)]);
    assert_eq!(
        (
            ejections("ejected"),
            ejections("capped"),
            ejections("renewed")
        ),
        (2.0, 2.0, 1.0),
        "{m}"
    );
    let uid = euid();
    let log = strip_ansi(&a.log());
    let lines = |what: &str, instance: &str| {
        log.lines()
            .filter(|l| l.contains(what) && l.contains(&format!("instance={instance}")))
            .map(str::to_owned)
            .collect::<Vec<_>>()
    };
    for instance in ["web-1", "web-2"] {
        let applied = lines("endpoint ejected locally", instance);
        assert_eq!(
            applied.len(),
            1,
            "logged once (not again at renewal): {log}"
        );
        assert!(
            applied[0].contains(&format!("uid={uid}")),
            "names the caller: {applied:?}"
        );
        assert!(
            applied[0].contains("service=prod/web/http") && applied[0].contains("eject_ms=600000"),
            "{applied:?}"
        );
    }
    assert_eq!(
        lines("failure report not applied", "web-3").len(),
        1,
        "{log}"
    );

    // Addresses nobody can call are refused at registration.
    for addr in [
        "0.0.0.0:0",
        "0.0.0.0:8080",
        "10.48.1.1:0",
        "255.255.255.255:53",
        "[ff02::1]:53",
        "224.0.0.251:5353",
        "169.254.10.1:80",
        "[fe80::1]:80",
        "[::]:80",
    ] {
        let (code, v) = a
            .post(
                &format!("{SVC}/register"),
                &format!("{{\"instance\":\"bad-addr\",\"address\":\"{addr}\"}}"),
            )
            .unwrap();
        assert_eq!(
            (code, v["reason"].as_str()),
            (400, Some("bad_address")),
            "{addr}: {v}"
        );
        assert!(v["error"].as_str().unwrap().contains("refused"), "{v}");
    }
    // Loopback stays allowed (local clusters run on 127.0.x.y).
    register_ready(a, "web-local", "127.0.48.9:8080");

    // A lease the authority would refuse: 400, not 409.
    for lease in [0, 999, 86_400_001u64] {
        let (code, v) = a
            .post(
                &format!("{SVC}/register"),
                &format!("{{\"instance\":\"web-9\",\"address\":\"10.48.0.9:8080\",\"lease_ms\":{lease}}}"),
            )
            .unwrap();
        assert_eq!(
            (code, v["reason"].as_str()),
            (400, Some("bad_lease")),
            "lease {lease}: {v}"
        );
    }

    // Per-caller instance cap (QA: one uid registered ~11,700 instances in 5 minutes): a
    // third new instance of the uid on B is refused 429 and registers nothing.
    register_ready(b, "cap-1", "10.48.2.1:8080");
    register_ready(b, "cap-2", "10.48.2.2:8080");
    let (code, v) = b
        .post(
            &format!("{SVC}/register"),
            "{\"instance\":\"cap-3\",\"address\":\"10.48.2.3:8080\"}",
        )
        .unwrap();
    assert_eq!(
        (code, v["reason"].as_str()),
        (429, Some("instance_limit")),
        "{v}"
    );
    assert!(
        v["error"]
            .as_str()
            .unwrap()
            .contains("max_instances_per_caller = 2"),
        "{v}"
    );
    let (_, v) = b.get(&format!("{SVC}/endpoints")).unwrap();
    assert!(endpoint(&v, "cap-3").is_none(), "nothing registered: {v}");

    // 405 with a JSON body and the Allow header.
    let raw = |method: &str, path: &str| -> String {
        use std::io::{Read, Write};
        let mut s = std::os::unix::net::UnixStream::connect(&a.socket).unwrap();
        write!(s, "{method} {path} HTTP/1.1\r\nHost: agent\r\nConnection: close\r\nContent-Length: 0\r\n\r\n").unwrap();
        let mut out = String::new();
        s.read_to_string(&mut out).unwrap();
        out
    };
    let resp = raw("DELETE", &format!("{SVC}/endpoints"));
    let (head, body) = resp.split_once("\r\n\r\n").unwrap();
    assert!(head.starts_with("HTTP/1.1 405"), "{resp}");
    let head = head.to_ascii_lowercase();
    assert!(head.contains("\r\nallow: get,head"), "{resp}");
    assert!(head.contains("content-type: application/json"), "{resp}");
    let v: serde_json::Value = serde_json::from_str(body).unwrap();
    assert_eq!(v["reason"], "method_not_allowed", "{v}");
    assert_eq!(v["allow"], serde_json::json!(["GET", "HEAD"]), "{v}");
    let (code, v) = http(&a.socket, "GET", &format!("{SVC}/report"), None).unwrap();
    assert_eq!(
        (code, v["allow"].clone()),
        (405, serde_json::json!(["POST"])),
        "{v}"
    );

    // The lifecycle route's 404 and 403 have the documented shape.
    let (code, v) = a
        .post(&format!("{SVC}/instances/nosuch/drain"), "")
        .unwrap();
    assert_eq!(
        (code, v["reason"].as_str()),
        (404, Some("unknown_instance")),
        "{v}"
    );
    assert!(
        v["error"].as_str().unwrap().starts_with("unknown instance"),
        "{v}"
    );
    let (code, v) = eventually(Duration::from_secs(10), "web-1 seen on node-b", || {
        let r = b.post(&format!("{SVC}/instances/web-1/drain"), "")?;
        (r.0 != 404).then_some(r)
    });
    assert_eq!(
        (code, v["reason"].as_str()),
        (403, Some("not_local")),
        "{v}"
    );
    assert!(
        v["error"]
            .as_str()
            .unwrap()
            .starts_with("instance is not on this node"),
        "{v}"
    );
    assert_eq!(v["owner"], "node-a", "{v}");
}

/// A registration whose authority was stopped (`kill -STOP` of the dev authority's agent)
/// answers 503 after the caller's budget; its attempts queue at the stopped process. When it
/// resumes, the first attempt commits and the retries (same request id) are answered from the
/// replay cache, not applied: one boot generation, one audit entry. The caller keeps the
/// instance's ownership (the 503 may still commit), and may deregister it.
#[test]
fn a_registration_retried_into_a_stopped_authority_commits_once() {
    let mut c = Cluster::new(44, 2);
    c.start_all();
    c.wait_converged(2, Duration::from_secs(30));
    let (auth, b) = (&c.agents[0], &c.agents[1]);
    let signal = |sig: &str| {
        let pid = auth.child.as_ref().expect("running").id();
        let ok = std::process::Command::new("kill")
            .args([sig, &pid.to_string()])
            .status()
            .is_ok_and(|s| s.success());
        assert!(ok, "kill {sig} {pid}");
    };
    // The agent binds its node key at start: wait for that write to be done.
    eventually(Duration::from_secs(20), "node-b binds its key", || {
        let (_, v) = b.get("/v1/agent/self")?;
        (v["node_key_bound"] == true).then_some(())
    });
    signal("-STOP");
    let body = r#"{"instance":"web-q","address":"10.44.0.9:80"}"#;
    let answer = b.post(&format!("{SVC}/register"), body);
    signal("-CONT");
    let (code, v) = answer.expect("node-b answers");
    assert_eq!(code, 503, "the authority was stopped: {v}");
    let seen = eventually(
        Duration::from_secs(20),
        "web-q committed after the resume",
        || {
            let (_, v) = b.get(&format!("{SVC}/endpoints"))?;
            endpoint(&v, "web-q").cloned()
        },
    );
    // A write sent after the resume is read by node-a after the attempts queued before it.
    let later = r#"{"instance":"web-r","address":"10.44.0.10:80"}"#;
    eventually(Duration::from_secs(20), "a later registration", || {
        let (code, _) = b.post(&format!("{SVC}/register"), later)?;
        (code == 200).then_some(())
    });
    // The dev authority's audit log holds one line per applied command.
    let audit = std::fs::read_to_string(c.tmp.path().join("data-node-a").join("audit.log"))
        .unwrap_or_default();
    let applied = audit.lines().filter(|l| l.contains("web-q")).count();
    assert_eq!(
        applied, 1,
        "one registration, applied once; audit log:\n{audit}"
    );
    // No later generation superseded the one seen first.
    let (_, v) = b.get(&format!("{SVC}/endpoints")).unwrap();
    assert_eq!(
        endpoint(&v, "web-q").unwrap()["generation"],
        seen["generation"],
        "{v}"
    );
    // The caller kept the instance's ownership through the 503.
    let owners_file = c.tmp.path().join("data-node-b").join("owners.json");
    let owners = std::fs::read_to_string(owners_file).unwrap();
    assert!(
        owners.contains("web-q"),
        "owner kept after the 503: {owners}"
    );
}
