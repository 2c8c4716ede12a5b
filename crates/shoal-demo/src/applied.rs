//! `shoal-demo watch-applied`: follows every agent's view of one service with blocking queries
//! and writes one JSON line per (agent, record) the first time the agent shows it in the
//! watched state: `{agent, region, instance, generation, revision, state, committed_at_ms,
//! applied_at_ms, seen_at_ms}` (again if it was first seen before the agent stamped it).
//!
//! `applied_at_ms` is the agent's own stamp of when it applied the record (see the agent API's
//! endpoint schema), so the poll rate does not limit the precision; `seen_at_ms` (when this
//! watcher saw it) is kept as a cross-check. One thread per agent, each one blocking query at a
//! time, at most one every `--min-interval-ms`; stops at SIGTERM/SIGINT.

use std::collections::HashMap;
use std::fs::{File, OpenOptions};
use std::io::Write;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use crate::agent::{call, service_path};
use crate::now_ms;

/// `watch-applied` arguments.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// `agents.tsv` of `deploy/local/cluster.sh`: region, node, ip, socket per line.
    #[arg(long)]
    agents: PathBuf,
    /// Service key `namespace/service/port`.
    #[arg(long)]
    service: String,
    /// Endpoint states to watch (the API's `state=` filter), e.g. `DRAINING`.
    #[arg(long, default_value = "DRAINING")]
    state: String,
    /// Output file (JSON lines, appended).
    #[arg(long)]
    out: PathBuf,
    /// Longest wait of one blocking query, s.
    #[arg(long, default_value_t = 10)]
    wait_s: u64,
    /// Least time between two queries to one agent, ms (bounds the load on a busy agent).
    #[arg(long, default_value_t = 50)]
    min_interval_ms: u64,
    /// Most distinct records remembered per agent (older ones may be written again).
    #[arg(long, default_value_t = 100_000)]
    max_records: usize,
}

/// One agent to follow.
#[derive(Debug, Clone)]
struct Target {
    region: String,
    node: String,
    socket: PathBuf,
}

fn targets(text: &str) -> Vec<Target> {
    text.lines()
        .filter_map(|l| {
            let f: Vec<&str> = l.split('\t').collect();
            match f.as_slice() {
                [region, node, _ip, socket, ..] => Some(Target {
                    region: (*region).to_owned(),
                    node: (*node).to_owned(),
                    socket: PathBuf::from(socket),
                }),
                _ => None,
            }
        })
        .collect()
}

/// The JSON line for one endpoint of a response, or `None` if it lacks the fields.
fn line(t: &Target, e: &Value, seen_at_ms: u64) -> Option<(Value, (String, u64, u64))> {
    let instance = e["instance"].as_str()?.to_owned();
    let generation = e["generation"].as_u64()?;
    let revision = e["revision"].as_u64()?;
    let v = json!({
        "agent": t.node, "region": t.region, "instance": instance, "generation": generation,
        "revision": revision, "state": e["state"], "committed_at_ms": e["committed_at_ms"],
        "applied_at_ms": e["applied_at_ms"], "seen_at_ms": seen_at_ms,
    });
    Some((v, (instance, generation, revision)))
}

fn follow(t: Target, a: Arc<Args>, out: Arc<Mutex<File>>) {
    let base = format!("{}/endpoints?state={}", service_path(&a.service), a.state);
    let timeout = Duration::from_secs(a.wait_s + 5);
    let min_interval = Duration::from_millis(a.min_interval_ms);
    let mut seen: HashMap<(String, u64, u64), bool> = HashMap::new();
    let mut index: Option<u64> = None;
    loop {
        let started = Instant::now();
        let path = match index {
            Some(i) => format!("{base}&index={i}&wait={}s", a.wait_s),
            None => base.clone(),
        };
        match call(&t.socket, "GET", &path, None, timeout) {
            Ok((200, v)) => {
                let now = now_ms();
                index = v["index"].as_u64();
                let eps = v["endpoints"].as_array().cloned().unwrap_or_default();
                for e in &eps {
                    let Some((l, id)) = line(&t, e, now) else {
                        continue;
                    };
                    // A record merged in the same driver batch as another change can show
                    // up a moment before the agent stamped it: written again once stamped.
                    let stamped = !l["applied_at_ms"].is_null();
                    if seen.len() >= a.max_records {
                        seen.clear();
                    }
                    let new = match seen.get(&id) {
                        None => true,
                        Some(was_stamped) => stamped && !was_stamped,
                    };
                    if new {
                        seen.insert(id, stamped);
                        // One write(2) per line: many threads share the file.
                        let text = format!("{l}\n");
                        let _ = out.lock().expect("out").write_all(text.as_bytes());
                    }
                }
            }
            // The agent is gone (killed) or busy: retry without a stale index.
            _ => index = None,
        }
        let spent = started.elapsed();
        let pause = if index.is_none() {
            Duration::from_millis(500)
        } else {
            min_interval
        };
        if spent < pause {
            std::thread::sleep(pause - spent);
        }
    }
}

/// Follows every agent until SIGTERM/SIGINT.
pub fn run(a: Args) -> anyhow::Result<()> {
    let list = targets(&std::fs::read_to_string(&a.agents)?);
    anyhow::ensure!(!list.is_empty(), "no agents in {}", a.agents.display());
    let out = Arc::new(Mutex::new(
        OpenOptions::new().create(true).append(true).open(&a.out)?,
    ));
    let signals = crate::termination_signal();
    let a = Arc::new(a);
    for t in list {
        let (a, out) = (a.clone(), out.clone());
        std::thread::spawn(move || follow(t, a, out));
    }
    // Threads may sit in a blocking query; the process exit ends them.
    let _ = signals.recv();
    Ok(())
}
