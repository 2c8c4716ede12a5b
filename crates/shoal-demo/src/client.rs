//! `shoal-demo client`: `rate` requests/s for `duration_s`; each asks the agent's `pick`, sends a
//! real HTTP GET, records one JSON line `{t_ms, agent, endpoint, instance, generation, outcome,
//! latency_ms}` and reports failures back to the agent (`POST .../report`).

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use crate::agent::{call, service_path};
use crate::now_ms;

/// `client` arguments.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// Local agent socket.
    #[arg(long)]
    agent_socket: PathBuf,
    /// Service key `namespace/service/port`.
    #[arg(long)]
    service: String,
    /// Requests per second.
    #[arg(long, default_value_t = 20.0)]
    rate: f64,
    /// Run this long (SIGTERM/SIGINT stops earlier).
    #[arg(long, default_value_t = 60)]
    duration_s: u64,
    /// Timeline file (JSON lines, appended).
    #[arg(long)]
    out: PathBuf,
    /// Name recorded in each line (e.g. the agent's node id).
    #[arg(long, default_value = "")]
    label: String,
    /// Connect and read timeout of the HTTP request.
    #[arg(long, default_value_t = 1_000)]
    timeout_ms: u64,
    /// Do not report failures to the agent.
    #[arg(long)]
    no_report: bool,
}

/// Outcome of one HTTP GET.
fn get(addr: SocketAddr, timeout: Duration) -> (&'static str, Option<String>) {
    let mut s = match TcpStream::connect_timeout(&addr, timeout) {
        Ok(s) => s,
        Err(e) => {
            return match e.kind() {
                std::io::ErrorKind::ConnectionRefused => ("connect_refused", None),
                std::io::ErrorKind::TimedOut | std::io::ErrorKind::WouldBlock => ("timeout", None),
                _ => ("connect_error", None),
            }
        }
    };
    let _ = s.set_read_timeout(Some(timeout));
    let _ = s.set_write_timeout(Some(timeout));
    if s.write_all(b"GET / HTTP/1.1\r\nHost: demo\r\nConnection: close\r\n\r\n")
        .is_err()
    {
        return ("reset", None);
    }
    let mut out = Vec::new();
    match s.read_to_end(&mut out) {
        Ok(_) => {}
        Err(e)
            if matches!(
                e.kind(),
                std::io::ErrorKind::TimedOut | std::io::ErrorKind::WouldBlock
            ) =>
        {
            return ("timeout", None)
        }
        Err(_) => return ("reset", None),
    }
    let text = String::from_utf8_lossy(&out);
    let code: u16 = text
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    let served_by = text
        .lines()
        .find_map(|l| l.strip_prefix("X-Instance: "))
        .map(|s| s.trim().to_owned());
    match code {
        200..=299 => ("ok", served_by),
        500..=599 => ("http_5xx", served_by),
        0 => ("reset", None),
        _ => ("http_other", served_by),
    }
}

fn one(a: &Args, svc: &str) -> Value {
    let t = now_ms();
    let start = Instant::now();
    let agent_timeout = Duration::from_secs(2);
    let picked = call(
        &a.agent_socket,
        "GET",
        &format!("{svc}/pick"),
        None,
        agent_timeout,
    );
    let (code, v) = match picked {
        Ok(r) => r,
        Err(e) => {
            return json!({"t_ms": t, "agent": a.label, "endpoint": null, "instance": null, "outcome": "agent_unreachable", "detail": e.to_string(), "latency_ms": start.elapsed().as_millis() as u64});
        }
    };
    if code != 200 {
        let outcome = if code == 503 {
            "no_backend"
        } else {
            "pick_error"
        };
        return json!({"t_ms": t, "agent": a.label, "endpoint": null, "instance": null, "outcome": outcome, "status": code, "latency_ms": start.elapsed().as_millis() as u64});
    }
    let e = &v["endpoint"];
    let instance = e["instance"].as_str().unwrap_or_default().to_owned();
    let generation = e["generation"].as_u64();
    let addr: Option<SocketAddr> = e["address"].as_str().and_then(|s| s.parse().ok());
    let Some(addr) = addr else {
        return json!({"t_ms": t, "agent": a.label, "endpoint": e["address"], "instance": instance, "outcome": "bad_endpoint"});
    };
    let t_send = now_ms();
    let (outcome, served_by) = get(addr, Duration::from_millis(a.timeout_ms));
    let mut outcome = outcome;
    if outcome == "ok" && served_by.as_deref().is_some_and(|s| s != instance) {
        // A different process answers on that address: a stale endpoint.
        outcome = "wrong_instance";
    }
    let mut reported = Value::Null;
    if outcome != "ok" && !a.no_report {
        let kind = match outcome {
            "connect_refused" => "connect_refused",
            "http_5xx" => "http_5xx",
            _ => "timeout",
        };
        let body =
            json!({"instance": instance, "generation": generation, "outcome": kind}).to_string();
        reported = match call(
            &a.agent_socket,
            "POST",
            &format!("{svc}/report"),
            Some(&body),
            agent_timeout,
        ) {
            Ok((c, _)) => json!(c),
            Err(_) => json!("unreachable"),
        };
    }
    json!({
        "t_ms": t_send,
        "agent": a.label,
        "endpoint": addr.to_string(),
        "instance": instance,
        "generation": generation,
        "outcome": outcome,
        "stale": v["stale"],
        "tier": v["tier"],
        "reported": reported,
        "latency_ms": start.elapsed().as_millis() as u64,
    })
}

/// Runs the load generator.
pub fn run(a: Args) -> anyhow::Result<()> {
    anyhow::ensure!(a.rate > 0.0, "--rate must be positive");
    let signals = crate::termination_signal();
    let mut out = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&a.out)?;
    let a = Arc::new(a);
    let svc = service_path(&a.service);
    let (tx, rx) = mpsc::channel::<Value>();
    let active = Arc::new(AtomicUsize::new(0));
    let period = Duration::from_secs_f64(1.0 / a.rate);
    let start = Instant::now();
    let end = start + Duration::from_secs(a.duration_s);
    let mut next = start;
    let mut counts: std::collections::BTreeMap<String, u64> = Default::default();
    let mut write = |v: Value, counts: &mut std::collections::BTreeMap<String, u64>| {
        *counts
            .entry(v["outcome"].as_str().unwrap_or("?").to_owned())
            .or_default() += 1;
        let _ = out.write_all(format!("{v}\n").as_bytes());
    };
    while Instant::now() < end && signals.try_recv().is_err() {
        if active.load(Ordering::SeqCst) < 256 {
            active.fetch_add(1, Ordering::SeqCst);
            let (a, svc, tx, active) =
                (Arc::clone(&a), svc.clone(), tx.clone(), Arc::clone(&active));
            std::thread::spawn(move || {
                let _ = tx.send(one(&a, &svc));
                active.fetch_sub(1, Ordering::SeqCst);
            });
        } else {
            write(
                json!({"t_ms": now_ms(), "agent": a.label, "endpoint": null, "instance": null, "outcome": "client_overload"}),
                &mut counts,
            );
        }
        next += period;
        while let Ok(v) = rx.try_recv() {
            write(v, &mut counts);
        }
        let now = Instant::now();
        if next > now {
            std::thread::sleep(next - now);
        } else {
            next = now;
        }
    }
    drop(tx);
    let drain_until = Instant::now() + Duration::from_secs(5);
    while Instant::now() < drain_until {
        match rx.recv_timeout(Duration::from_millis(100)) {
            Ok(v) => write(v, &mut counts),
            Err(mpsc::RecvTimeoutError::Disconnected) => break,
            Err(mpsc::RecvTimeoutError::Timeout) => {}
        }
    }
    eprintln!("client {}: {}", a.label, json!(counts));
    Ok(())
}
