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
    let (code, _) = a
        .post(
            &format!("{SVC}/report"),
            "{\"instance\":\"web-1\",\"outcome\":\"connect_refused\",\"eject_ms\":60000}",
        )
        .unwrap();
    assert_eq!(code, 200);
    let (code, v) = a.get(&format!("{SVC}/pick")).unwrap();
    assert_eq!(code, 503, "{v}");
    assert_eq!(v["error"], "no backend");
    // Ejection is local only: the record itself is still READY.
    let (_, v) = a.get(&format!("{SVC}/endpoints")).unwrap();
    let e = endpoint(&v, "web-1").unwrap();
    assert_eq!(
        (e["state"].as_str(), e["ejected"].as_bool()),
        (Some("READY"), Some(true))
    );
    let (code, _) = a.get("/v1/openapi.json").unwrap();
    assert_eq!(code, 200);
}
