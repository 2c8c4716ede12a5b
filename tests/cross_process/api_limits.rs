//! The local API stays up for everyone: a real agent under `ulimit -n 1024`, and a client
//! process (run as unix user A) that opens 1,100 connections, sends half a request on each and
//! hangs. While they hang, user B's `pick` answers and snapshot persistence keeps succeeding;
//! A's connections past the per-uid cap get an immediate 429; the header read timeout then
//! closes the hung ones.
//!
//! Needs root and the users `shoal-test-a` / `shoal-test-b` (`.ci/run` creates them): the
//! flood and the `pick` must come from different uids, as two applications on one node do.
//! Without them it prints a SKIP line, unless `SHOAL_REQUIRE_UNIX_USERS=1` (set by `.ci/run`).
//!
//! The same flood against the metrics TCP port (`metrics_port_flood_is_capped_and_timed_out`)
//! needs no other uid.

mod common;

use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::net::UnixStream;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc::Receiver;
use std::time::{Duration, Instant};

use common::*;
use serde_json::{json, Value};

const METRICS: &str = "127.0.42.1:29542";
const FLOOD: usize = 1_100;
const HEADER_TIMEOUT_MS: u64 = 6_000;
/// `[api]` defaults: 512 per uid; total = 1024 - fd_reserve (256) - the metrics port's cap
/// (`metrics_max_connections`, 64) = 704.
const PER_UID: usize = 512;

/// Starts `agent` the way both floods need it: its metrics port on `metrics`, the `[api]`
/// header read timeout at [`HEADER_TIMEOUT_MS`] plus `api_lines` (each ending in a newline),
/// run under the common `ulimit -n 1024` (soft and hard). Waits until it answers, checks the
/// limit took and the fd budget it logged (1024 - fd_reserve 256 - the metrics port's cap 64
/// = 704 local API connections). Returns its pid.
fn start_under_ulimit(agent: &mut Agent, metrics: &str, api_lines: &str) -> u32 {
    let text = std::fs::read_to_string(&agent.config)
        .unwrap()
        .replace(
            "cluster_size = 8\n",
            &format!("cluster_size = 8\nmetrics = \"{metrics}\"\n"),
        )
        .replace(
            "[api]\n",
            &format!("[api]\n{api_lines}header_read_timeout_ms = {HEADER_TIMEOUT_MS}\n"),
        );
    std::fs::write(&agent.config, text).unwrap();
    let pid = agent.start_with_nofile(1024);
    eventually(Duration::from_secs(20), "agent answers", || {
        agent.get("/v1/agent/self").map(|_| ())
    });
    let limits = std::fs::read_to_string(format!("/proc/{pid}/limits")).unwrap();
    let nofile = limits
        .lines()
        .find(|l| l.starts_with("Max open files"))
        .unwrap();
    assert!(nofile.split_whitespace().nth(3) == Some("1024"), "{nofile}");
    let log_text = strip_ansi(&agent.log());
    assert!(log_text.contains("max_connections=704"), "{log_text}");
    pid
}

/// The `FLOOD ...` lines a flood helper child prints on stdout, as they come (libtest may
/// print `test flood_helper ... ` on the same line before them).
fn flood_lines(flood: &mut Child) -> Receiver<String> {
    let (tx, rx) = std::sync::mpsc::channel::<String>();
    let out = flood.stdout.take().unwrap();
    std::thread::spawn(move || {
        for line in BufReader::new(out).lines().map_while(Result::ok) {
            if let Some(i) = line.find("FLOOD ") {
                if tx.send(line[i..].to_owned()).is_err() {
                    return;
                }
            }
        }
    });
    rx
}

/// The flood client, run as a child process (this test binary re-executed as user A).
/// Does nothing unless `SHOAL_FLOOD_SOCKET` is set.
#[test]
fn flood_helper() {
    let Ok(socket) = std::env::var("SHOAL_FLOOD_SOCKET") else {
        return;
    };
    let n: usize = std::env::var("SHOAL_FLOOD_N").unwrap().parse().unwrap();
    let mut conns = Vec::new();
    let mut connect_failed = 0;
    for _ in 0..n {
        match UnixStream::connect(&socket) {
            Ok(mut s) => {
                let at = Instant::now();
                // Half a request: the head never ends.
                let _ = s.write_all(b"GET /v1/agent/self HTTP/1.1\r\nHost: agent\r\nX-Slow: ");
                conns.push((s, at));
            }
            Err(_) => connect_failed += 1,
        }
    }
    println!("FLOOD OPENED {}", conns.len());
    std::io::stdout().flush().unwrap();
    let deadline = Instant::now() + Duration::from_millis(HEADER_TIMEOUT_MS + 20_000);
    let (mut per_uid, mut total, mut closed, mut still_open) = (0, 0, 0, 0);
    let mut close_ms: Vec<u128> = Vec::new();
    let mut other_answers = std::collections::BTreeSet::new();
    for (mut s, at) in conns {
        let left = deadline.saturating_duration_since(Instant::now());
        let _ = s.set_read_timeout(Some(left.max(Duration::from_millis(1))));
        let mut buf = Vec::new();
        match s.read_to_end(&mut buf) {
            Ok(_) => {
                let head = String::from_utf8_lossy(&buf[..buf.len().min(12)]).into_owned();
                if head.starts_with("HTTP/1.1 429") {
                    per_uid += 1;
                } else if head.starts_with("HTTP/1.1 503") {
                    total += 1;
                } else {
                    closed += 1;
                    close_ms.push(at.elapsed().as_millis());
                    if !head.is_empty() {
                        other_answers.insert(head);
                    }
                }
            }
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) =>
            {
                still_open += 1
            }
            Err(_) => {
                closed += 1;
                close_ms.push(at.elapsed().as_millis());
            }
        }
    }
    let result = json!({
        "connect_failed": connect_failed,
        "per_uid_429": per_uid,
        "total_503": total,
        "closed_by_server": closed,
        "still_open": still_open,
        "min_close_ms": close_ms.iter().min(),
        "max_close_ms": close_ms.iter().max(),
        "other_answers": other_answers,
    });
    println!("FLOOD RESULT {result}");
}

#[test]
fn half_open_flood_does_not_starve_other_callers_or_persistence() {
    let Some((a, b)) =
        users_or_skip("half_open_flood_does_not_starve_other_callers_or_persistence")
    else {
        return;
    };
    let mut c = Cluster::new(42, 1);
    let dir = c.tmp.path().to_owned();
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755)).unwrap();
    }
    let agent = &mut c.agents[0];
    let pid = start_under_ulimit(agent, METRICS, "socket_mode = 0o666\n");
    register_ready(agent, "web-1", "10.0.0.7:8080");

    // The flood: this test binary, copied where user A can run it, re-executed as A.
    let helper = dir.join("flood-helper");
    std::fs::copy(std::env::current_exe().unwrap(), &helper).unwrap();
    let mut flood = {
        use std::os::unix::process::CommandExt;
        Command::new("sh")
            .arg("-c")
            .arg("ulimit -n \"$(ulimit -Hn)\" && exec \"$0\" flood_helper --exact --nocapture --test-threads=1")
            .arg(&helper)
            .env("SHOAL_FLOOD_SOCKET", &agent.socket)
            .env("SHOAL_FLOOD_N", FLOOD.to_string())
            .uid(a.0)
            .gid(a.1)
            .current_dir("/")
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap()
    };
    let rx = flood_lines(&mut flood);
    let opened = rx
        .recv_timeout(Duration::from_secs(60))
        .expect("flood opened");
    assert_eq!(opened, format!("FLOOD OPENED {FLOOD}"));
    let open_gauge = || metric_sum(&metrics_text(METRICS), "shoal_api_connections", &[]);
    eventually(
        Duration::from_secs(10),
        "per-uid cap of hung connections held",
        || (open_gauge() == PER_UID as f64).then_some(()),
    );
    let flood_at = Instant::now();
    let m = metrics_text(METRICS);
    let persisted_ok = metric_sum(&m, "shoal_persist_total", &[("result", "ok")]);

    // While they hang: B's pick answers, persistence succeeds, the fds are not exhausted.
    let t = Instant::now();
    let (code, v) = curl_as(b, &agent.socket, "GET", &format!("{SVC}/pick"), None);
    let pick_ms = t.elapsed().as_millis();
    assert_eq!(code, 200, "B's pick during the flood: {v}");
    assert_eq!(v["endpoint"]["instance"], "web-1", "{v}");
    eventually(
        Duration::from_secs(3),
        "a snapshot persisted during the flood",
        || {
            let m = metrics_text(METRICS);
            (metric_sum(&m, "shoal_persist_total", &[("result", "ok")]) > persisted_ok)
                .then_some(())
        },
    );
    let m = metrics_text(METRICS);
    assert_eq!(
        metric_sum(&m, "shoal_persist_total", &[("result", "error")]),
        0.0,
        "{m}"
    );
    let fds = std::fs::read_dir(format!("/proc/{pid}/fd"))
        .unwrap()
        .count();
    assert!(fds < 1024 - 128, "agent holds {fds} fds");
    // ... and all of it while the flood still held its connections.
    assert_eq!(open_gauge(), PER_UID as f64);
    assert!(
        flood_at.elapsed() < Duration::from_millis(HEADER_TIMEOUT_MS),
        "checks took too long to count as 'during the flood'"
    );
    println!("pick during flood: {pick_ms} ms; {fds} agent fds; {PER_UID} hung connections");

    // Then the header timeout closes the hung connections; the rest were refused at once.
    let result = rx
        .recv_timeout(Duration::from_secs(60))
        .expect("flood result");
    let r: Value = serde_json::from_str(result.strip_prefix("FLOOD RESULT ").unwrap()).unwrap();
    println!("flood: {r}");
    assert_eq!(r["connect_failed"], 0, "{r}");
    assert_eq!(r["per_uid_429"], FLOOD - PER_UID, "{r}");
    assert_eq!(r["total_503"], 0, "{r}");
    assert_eq!(r["closed_by_server"], PER_UID, "{r}");
    assert_eq!(r["still_open"], 0, "{r}");
    assert!(
        r["min_close_ms"].as_u64().unwrap() >= HEADER_TIMEOUT_MS - 100,
        "{r}"
    );
    let _ = flood.wait();
    eventually(Duration::from_secs(5), "connections released", || {
        (open_gauge() == 0.0).then_some(())
    });
    let m = metrics_text(METRICS);
    assert_eq!(
        metric_sum(
            &m,
            "shoal_api_connections_closed_total",
            &[("why", "header_timeout")]
        ),
        PER_UID as f64,
        "{m}"
    );
    assert_eq!(
        metric_sum(
            &m,
            "shoal_api_connections_refused_total",
            &[("why", "per_uid")]
        ),
        (FLOOD - PER_UID) as f64,
        "{m}"
    );
    // The agent still serves everyone afterwards.
    let (code, _) = curl_as(a, &agent.socket, "GET", &format!("{SVC}/pick"), None);
    assert_eq!(code, 200);

    // Picks of services nobody registered are "no backend" under one bounded label: a caller
    // naming random services cannot grow the metric's label set.
    let before = metric_sum(
        &metrics_text(METRICS),
        "shoal_no_backend_total",
        &[("service", "_unknown")],
    );
    for i in 0..20 {
        let path = format!("/v1/services/prod/nosuch-{i}/http/pick");
        let (code, v) = curl_as(b, &agent.socket, "GET", &path, None);
        assert_eq!(code, 503, "{path}: {v}");
    }
    let m = metrics_text(METRICS);
    assert_eq!(
        metric_sum(&m, "shoal_no_backend_total", &[("service", "_unknown")]) - before,
        20.0,
        "{m}"
    );
    assert!(
        !m.contains("nosuch-"),
        "a random service name became a label: {m}"
    );
}

/// The metrics-port flood client, run as a child process (this test binary re-executed with a
/// raised fd limit). Does nothing unless `SHOAL_METRICS_FLOOD` (the port's address) is set.
#[test]
fn metrics_flood_helper() {
    let Ok(addr) = std::env::var("SHOAL_METRICS_FLOOD") else {
        return;
    };
    let n: usize = std::env::var("SHOAL_FLOOD_N").unwrap().parse().unwrap();
    let wait_ms: u64 = std::env::var("SHOAL_FLOOD_WAIT_MS")
        .unwrap()
        .parse()
        .unwrap();
    let mut conns = Vec::new();
    let mut connect_failed = 0;
    for _ in 0..n {
        match std::net::TcpStream::connect(&addr) {
            Ok(mut s) => {
                // Half a request: the head never ends.
                let _ = s.write_all(b"GET /metrics HTTP/1.1\r\nHost: m\r\nX-Slow: ");
                conns.push(s);
            }
            Err(_) => connect_failed += 1,
        }
    }
    println!("FLOOD OPENED {}", conns.len());
    std::io::stdout().flush().unwrap();
    // Bounded: every connection must be closed by the agent well within this.
    let deadline = Instant::now() + Duration::from_millis(wait_ms);
    let (mut closed, mut answered, mut still_open) = (0, 0, 0);
    for mut s in conns {
        let left = deadline.saturating_duration_since(Instant::now());
        let _ = s.set_read_timeout(Some(left.max(Duration::from_millis(1))));
        let mut buf = Vec::new();
        match s.read_to_end(&mut buf) {
            Ok(_) if buf.is_empty() => closed += 1,
            Ok(_) => answered += 1,
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) =>
            {
                still_open += 1
            }
            Err(_) => closed += 1,
        }
    }
    let result = json!({
        "connect_failed": connect_failed,
        "closed_unanswered": closed,
        "answered": answered,
        "still_open": still_open,
    });
    println!("FLOOD RESULT {result}");
}

/// QA, 2026-12-04: 1,100 half-sent requests to the metrics port of an agent under
/// `ulimit -n 1024` exhausted its descriptors (the unix-socket API stopped answering, snapshot
/// writes failed with "Too many open files") and were still open 40 s later. The port is now
/// capped inside the fd budget and heads are timed out: the flood gets `metrics_max_connections`
/// connections, the rest are closed at accept, the held ones are closed by the header timeout,
/// and the socket API, registrations and persistence carry on meanwhile. Needs no other uid.
#[test]
fn metrics_port_flood_is_capped_and_timed_out() {
    const METRICS: &str = "127.0.47.1:29547";
    /// `metrics_max_connections` default.
    const METRICS_CAP: usize = 64;
    let mut c = Cluster::new(47, 1);
    let agent = &mut c.agents[0];
    let pid = start_under_ulimit(agent, METRICS, "");
    // The metrics port's cap (64) is taken out of the fd budget.
    let log_text = strip_ansi(&agent.log());
    assert!(log_text.contains("tcp_port_fds=64"), "{log_text}");
    register_ready(agent, "web-1", "10.0.0.7:8080");
    let persisted_ok = metric_sum(
        &metrics_text(METRICS),
        "shoal_persist_total",
        &[("result", "ok")],
    );

    let mut flood = Command::new("sh")
        .arg("-c")
        .arg("ulimit -n 4096 && exec \"$0\" metrics_flood_helper --exact --nocapture --test-threads=1")
        .arg(std::env::current_exe().unwrap())
        .env("SHOAL_METRICS_FLOOD", METRICS)
        .env("SHOAL_FLOOD_N", FLOOD.to_string())
        .env("SHOAL_FLOOD_WAIT_MS", (HEADER_TIMEOUT_MS + 30_000).to_string())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let rx = flood_lines(&mut flood);
    let opened = rx
        .recv_timeout(Duration::from_secs(60))
        .expect("flood opened");
    assert_eq!(opened, format!("FLOOD OPENED {FLOOD}"));

    // While the flood holds the port: the socket API answers, a write goes through the
    // (development) authority and is persisted, the agent is far from its fd limit.
    let (code, v) = agent.get(&format!("{SVC}/pick")).unwrap();
    assert_eq!(code, 200, "pick during the flood: {v}");
    let body = "{\"instance\":\"web-2\",\"address\":\"10.0.0.8:8080\"}";
    let (code, v) = agent.post(&format!("{SVC}/register"), body).unwrap();
    assert_eq!(code, 200, "register during the flood: {v}");
    let (code, v) = agent.get("/v1/agent/health").unwrap();
    assert_eq!(v["persist_error"], Value::Null, "{code} {v}");
    let fds = std::fs::read_dir(format!("/proc/{pid}/fd"))
        .unwrap()
        .count();
    assert!(fds < 1024 - 128, "agent holds {fds} fds");
    // ... and the port was still full after all that: one more connection is closed unanswered.
    let scrape = metrics_text(METRICS);
    assert!(
        scrape.is_empty(),
        "the metrics port answered while the flood held its cap: {}",
        &scrape[..scrape.len().min(200)]
    );

    // Every flood connection is closed by the agent: past the cap at accept, the held ones by
    // the header timeout; none was answered.
    let result = rx
        .recv_timeout(Duration::from_secs(120))
        .expect("flood result");
    let r: Value = serde_json::from_str(result.strip_prefix("FLOOD RESULT ").unwrap()).unwrap();
    println!("metrics flood: {r}");
    assert_eq!(r["connect_failed"], 0, "{r}");
    assert_eq!(r["still_open"], 0, "{r}");
    assert_eq!(r["answered"], 0, "{r}");
    assert_eq!(r["closed_unanswered"], FLOOD, "{r}");
    let _ = flood.wait();
    let m = eventually(
        Duration::from_secs(10),
        "metrics port answers again",
        || {
            let m = metrics_text(METRICS);
            (!m.is_empty()).then_some(m)
        },
    );
    let refused = metric_sum(&m, "shoal_metrics_connections_refused_total", &[]);
    let timed_out = metric_sum(
        &m,
        "shoal_metrics_connections_closed_total",
        &[("why", "header_timeout")],
    );
    // Held connections that timed out free slots for later ones of the flood, so the split is
    // not exact; each flood connection is one or the other (plus the scrape refused above).
    assert!(timed_out >= METRICS_CAP as f64, "{m}");
    assert_eq!(refused + timed_out, (FLOOD + 1) as f64, "{m}");
    assert!(
        metric_sum(&m, "shoal_persist_total", &[("result", "ok")]) > persisted_ok,
        "{m}"
    );
    assert_eq!(
        metric_sum(&m, "shoal_persist_total", &[("result", "error")]),
        0.0,
        "{m}"
    );
    let log_text = strip_ansi(&agent.log());
    let refusal_logged = log_text.lines().any(|l| {
        l.contains("connection refused: the port's connection cap is reached")
            && (l.contains("port=\"metrics\"") || l.contains("port=metrics"))
    });
    assert!(refusal_logged, "{log_text}");
}
