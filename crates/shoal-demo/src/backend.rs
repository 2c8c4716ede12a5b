//! `shoal-demo backend`: a tiny HTTP server that registers itself through its local agent.
//!
//! Life cycle: bind -> register (STARTING, with an HTTP readiness probe on `/ready` and a TCP
//! liveness probe) -> READY (the readiness probe, or an explicit `ready` after
//! `--ready-after-ms` if the probe has not done it) -> on SIGTERM: `drain` (DRAINING), keep
//! serving for `--grace-ms`, `deregister`, exit 0.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use crate::agent::{call, service_path};
use crate::now_ms;

/// `backend` arguments.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// Local agent socket.
    #[arg(long)]
    agent_socket: PathBuf,
    /// Service key `namespace/service/port`.
    #[arg(long)]
    service: String,
    /// Instance id.
    #[arg(long)]
    instance: String,
    /// `ip:port` to serve on (and to register).
    #[arg(long)]
    listen: SocketAddr,
    /// Keep serving this long after DRAINING before deregistering and exiting.
    #[arg(long, default_value_t = 5_000)]
    grace_ms: u64,
    /// Explicit `ready` call if the readiness probe has not made the instance READY by then.
    #[arg(long, default_value_t = 5_000)]
    ready_after_ms: u64,
    /// Artificial latency of each response (makes in-flight requests visible during a drain).
    #[arg(long, default_value_t = 0)]
    delay_ms: u64,
    /// Version label to register.
    #[arg(long, default_value = "v1")]
    version: String,
    /// Append lifecycle events (JSON lines) to this file.
    #[arg(long)]
    events: Option<PathBuf>,
    /// Give up registering after this long (the authority may be electing).
    #[arg(long, default_value_t = 60_000)]
    register_timeout_ms: u64,
}

struct Served {
    instance: String,
    delay: Duration,
    total: AtomicU64,
    in_flight: AtomicU64,
    draining: AtomicBool,
}

fn handle(mut s: TcpStream, st: &Served) {
    st.in_flight.fetch_add(1, Ordering::SeqCst);
    let _ = s.set_read_timeout(Some(Duration::from_secs(5)));
    let mut buf = Vec::with_capacity(512);
    let mut chunk = [0u8; 512];
    while !buf.windows(4).any(|w| w == b"\r\n\r\n") && buf.len() < 16 * 1024 {
        match s.read(&mut chunk) {
            Ok(0) | Err(_) => break,
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
        }
    }
    let head = String::from_utf8_lossy(&buf);
    let path = head.split_whitespace().nth(1).unwrap_or("/").to_owned();
    if path != "/ready" && !st.delay.is_zero() {
        std::thread::sleep(st.delay);
    }
    let body = format!("{}\n", st.instance);
    let resp = format!(
        "HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nX-Instance: {}\r\nX-Draining: {}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        st.instance,
        st.draining.load(Ordering::SeqCst),
        body.len()
    );
    let _ = s.write_all(resp.as_bytes());
    if path != "/ready" {
        st.total.fetch_add(1, Ordering::SeqCst);
    }
    st.in_flight.fetch_sub(1, Ordering::SeqCst);
}

fn event(path: &Option<PathBuf>, v: Value) {
    eprintln!("event {v}");
    if let Some(p) = path {
        if let Ok(mut f) = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(p)
        {
            // One write(2) per line: several backends append to the same file.
            let _ = f.write_all(format!("{v}\n").as_bytes());
        }
    }
}

/// Retries `action` on the agent until 200 or `timeout`; returns the last reply.
fn retry(
    a: &Args,
    method: &str,
    path: &str,
    body: Option<&str>,
    timeout: Duration,
) -> anyhow::Result<Value> {
    let deadline = Instant::now() + timeout;
    loop {
        let r = call(&a.agent_socket, method, path, body, Duration::from_secs(10));
        match r {
            Ok((200, v)) => return Ok(v),
            other => {
                if Instant::now() >= deadline {
                    anyhow::bail!("{method} {path}: {other:?}");
                }
            }
        }
        std::thread::sleep(Duration::from_millis(250));
    }
}

fn own_state(a: &Args) -> Option<String> {
    let (_, v) = call(
        &a.agent_socket,
        "GET",
        &format!("{}/endpoints", service_path(&a.service)),
        None,
        Duration::from_secs(5),
    )
    .ok()?;
    v["endpoints"]
        .as_array()?
        .iter()
        .find(|e| e["instance"] == a.instance.as_str())
        .and_then(|e| e["state"].as_str().map(str::to_owned))
}

/// Runs the backend until SIGTERM (drain, grace, deregister) or SIGINT.
pub fn run(a: Args) -> anyhow::Result<()> {
    let signals = crate::termination_signal();
    let listener = TcpListener::bind(a.listen)?;
    let st = Arc::new(Served {
        instance: a.instance.clone(),
        delay: Duration::from_millis(a.delay_ms),
        total: AtomicU64::new(0),
        in_flight: AtomicU64::new(0),
        draining: AtomicBool::new(false),
    });
    {
        let st = Arc::clone(&st);
        std::thread::spawn(move || {
            for conn in listener.incoming().flatten() {
                let st = Arc::clone(&st);
                std::thread::spawn(move || handle(conn, &st));
            }
        });
    }
    let svc = service_path(&a.service);
    let body = json!({
        "instance": a.instance,
        "address": a.listen.to_string(),
        "version": a.version,
        "probes": {
            "readiness": {"action": {"http": {"path": "/ready"}}, "period_ms": 500, "timeout_ms": 300, "jitter_ms": 100},
            "liveness": {"action": {"tcp": {}}, "period_ms": 1000, "timeout_ms": 500, "jitter_ms": 100, "failure_threshold": 2},
        },
    })
    .to_string();
    let t_reg = now_ms();
    let reg = retry(
        &a,
        "POST",
        &format!("{svc}/register"),
        Some(&body),
        Duration::from_millis(a.register_timeout_ms),
    )?;
    event(
        &a.events,
        json!({"t_ms": t_reg, "t_ack_ms": now_ms(), "kind": "register", "instance": a.instance, "address": a.listen.to_string(), "generation": reg["generation"]}),
    );
    // READY: the readiness probe, or an explicit call.
    let deadline = Instant::now() + Duration::from_millis(a.ready_after_ms);
    let mut how = "probe";
    loop {
        if own_state(&a).as_deref() == Some("READY") {
            break;
        }
        if Instant::now() >= deadline {
            how = "explicit";
            retry(
                &a,
                "POST",
                &format!("{svc}/instances/{}/ready", a.instance),
                Some(""),
                Duration::from_secs(30),
            )?;
            break;
        }
        if let Ok(sig) = signals.try_recv() {
            eprintln!("{sig} before READY; deregistering");
            let _ = retry(
                &a,
                "POST",
                &format!("{svc}/instances/{}/deregister", a.instance),
                Some(""),
                Duration::from_secs(5),
            );
            return Ok(());
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    event(
        &a.events,
        json!({"t_ms": now_ms(), "kind": "ready", "instance": a.instance, "address": a.listen.to_string(), "via": how}),
    );
    let sig = signals.recv().unwrap_or("SIGTERM");
    if sig == "SIGINT" {
        eprintln!("SIGINT: exiting without drain");
        return Ok(());
    }
    // Drain: no new requests are routed here once every agent applies DRAINING.
    st.draining.store(true, Ordering::SeqCst);
    let t_drain = now_ms();
    let out = retry(
        &a,
        "POST",
        &format!("{svc}/instances/{}/drain", a.instance),
        Some(""),
        Duration::from_secs(15),
    );
    let (revision, err) = match &out {
        Ok(v) => (v["revision"].clone(), Value::Null),
        Err(e) => (Value::Null, json!(e.to_string())),
    };
    event(
        &a.events,
        json!({"t_ms": t_drain, "t_ack_ms": now_ms(), "kind": "drain", "instance": a.instance, "address": a.listen.to_string(), "revision": revision, "error": err, "served": st.total.load(Ordering::SeqCst)}),
    );
    std::thread::sleep(Duration::from_millis(a.grace_ms));
    let t_dereg = now_ms();
    let _ = retry(
        &a,
        "POST",
        &format!("{svc}/instances/{}/deregister", a.instance),
        Some(""),
        Duration::from_secs(10),
    );
    // In-flight requests finish (bounded).
    let end = Instant::now() + Duration::from_secs(5);
    while st.in_flight.load(Ordering::SeqCst) > 0 && Instant::now() < end {
        std::thread::sleep(Duration::from_millis(20));
    }
    event(
        &a.events,
        json!({"t_ms": t_dereg, "t_ack_ms": now_ms(), "kind": "exit", "instance": a.instance, "address": a.listen.to_string(), "served": st.total.load(Ordering::SeqCst)}),
    );
    Ok(())
}
