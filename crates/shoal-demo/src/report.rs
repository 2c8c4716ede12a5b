//! `shoal-demo report`: joins a run directory's `events.jsonl` (scenario + backends), the
//! clients' timelines (`timeline/*.jsonl`) and the authorities' `audit.log` files into one
//! report (`report.json`, `report.md`) and prints the summary.
//!
//! Per event: the authority commit time (`committed_at_ms` of the DRAINING transition in the
//! audit log; the request time when not found), the last request sent to the old endpoint,
//! requests later than the SLO, and failed requests by cause.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use serde_json::{json, Value};

/// `report` arguments.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// Run directory (holds events.jsonl, timeline/, the authorities' data dirs).
    #[arg(long)]
    run_dir: PathBuf,
    /// Deliberate withdrawal SLO: no request later than this after the DRAINING commit.
    #[arg(long, default_value_t = 3_000)]
    drain_slo_ms: u64,
    /// Hard failure SLO: no request to a killed process later than this after its death.
    #[arg(long, default_value_t = 15_000)]
    kill_slo_ms: u64,
}

fn read_lines(p: &Path) -> Vec<Value> {
    std::fs::read_to_string(p)
        .unwrap_or_default()
        .lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect()
}

fn find_files(dir: &Path, name: &str, out: &mut Vec<PathBuf>, depth: usize) {
    let Ok(rd) = std::fs::read_dir(dir) else {
        return;
    };
    for e in rd.flatten() {
        let p = e.path();
        if p.is_dir() && depth > 0 {
            find_files(&p, name, out, depth - 1);
        } else if p.file_name().and_then(|n| n.to_str()) == Some(name) {
            out.push(p);
        }
    }
}

/// Finds an object holding `instance` and `to` anywhere inside `v`.
fn transition_of(v: &Value) -> Option<(String, String)> {
    match v {
        Value::Object(m) => {
            if let (Some(i), Some(t)) = (m.get("instance"), m.get("to")) {
                return Some((i.as_str()?.to_owned(), t.to_string().to_ascii_uppercase()));
            }
            m.values().find_map(transition_of)
        }
        _ => None,
    }
}

fn t(v: &Value) -> u64 {
    v["t_ms"].as_u64().unwrap_or(0)
}

fn causes<'a>(reqs: impl Iterator<Item = &'a Value>) -> BTreeMap<String, u64> {
    let mut m = BTreeMap::new();
    for r in reqs {
        let o = r["outcome"].as_str().unwrap_or("?");
        if o != "ok" {
            *m.entry(o.to_owned()).or_default() += 1;
        }
    }
    m
}

/// Builds and writes the report; prints the summary.
pub fn run(a: Args) -> anyhow::Result<()> {
    let dir = &a.run_dir;
    let events = read_lines(&dir.join("events.jsonl"));
    let mut reqs: Vec<Value> = Vec::new();
    if let Ok(rd) = std::fs::read_dir(dir.join("timeline")) {
        for e in rd.flatten() {
            reqs.extend(read_lines(&e.path()));
        }
    }
    reqs.sort_by_key(t);
    // DRAINING commit times from every replica's audit log (identical on all replicas).
    let mut audits = Vec::new();
    find_files(dir, "audit.log", &mut audits, 4);
    let mut drain_commit: BTreeMap<String, u64> = BTreeMap::new();
    for p in &audits {
        for v in read_lines(p) {
            if let Some((inst, to)) = transition_of(&v["command"]) {
                if to.contains("DRAINING") && v.to_string().contains("ccept") {
                    let c = v["committed_at_ms"].as_u64().unwrap_or(0);
                    let e = drain_commit.entry(inst).or_insert(c);
                    *e = (*e).min(c);
                }
            }
        }
    }
    let owner: BTreeMap<String, String> = events
        .iter()
        .filter(|e| e["kind"] == "backend_start")
        .filter_map(|e| {
            Some((
                e["instance"].as_str()?.to_owned(),
                e["node"].as_str()?.to_owned(),
            ))
        })
        .collect();
    let killed: Vec<String> = events
        .iter()
        .filter(|e| e["kind"] == "kill_backend")
        .filter_map(|e| e["instance"].as_str().map(str::to_owned))
        .collect();
    let mut rows = Vec::new();
    let mut checks = BTreeMap::new();
    let mut drain_late = 0u64;
    let mut kill_late = 0u64;
    let mut drains_max_ms = 0u64;
    for e in &events {
        let kind = e["kind"].as_str().unwrap_or("");
        match kind {
            "drain" => {
                let inst = e["instance"].as_str().unwrap_or("").to_owned();
                let (commit, src) = match drain_commit.get(&inst) {
                    Some(c) => (*c, "audit.log committed_at_ms"),
                    None => (t(e), "drain request time (audit entry not found)"),
                };
                let after: Vec<&Value> = reqs
                    .iter()
                    .filter(|r| r["instance"] == inst.as_str() && t(r) >= commit)
                    .collect();
                let last = after.iter().map(|r| t(r)).max();
                let last_any = reqs
                    .iter()
                    .filter(|r| r["instance"] == inst.as_str())
                    .map(t)
                    .max()
                    .map(|l| l as i64 - commit as i64);
                let late = after
                    .iter()
                    .filter(|r| t(r) > commit + a.drain_slo_ms)
                    .count() as u64;
                drain_late += late;
                let last_ms = last.map(|l| l - commit);
                drains_max_ms = drains_max_ms.max(last_ms.unwrap_or(0));
                rows.push(json!({
                    "kind": "drain", "instance": inst, "t_request_ms": t(e), "commit_ms": commit,
                    "commit_source": src, "ack_ms": e["t_ack_ms"], "requests_after_commit": after.len(),
                    "last_request_after_commit_ms": last_ms, "last_request_rel_commit_ms": last_any, "requests_later_than_slo": late,
                    "failed_after_commit": causes(after.iter().copied()),
                }));
            }
            "kill_backend" => {
                let inst = e["instance"].as_str().unwrap_or("").to_owned();
                let after: Vec<&Value> = reqs
                    .iter()
                    .filter(|r| r["instance"] == inst.as_str() && t(r) >= t(e))
                    .collect();
                let last = after.iter().map(|r| t(r)).max();
                let late = after.iter().filter(|r| t(r) > t(e) + a.kill_slo_ms).count() as u64;
                kill_late += late;
                rows.push(json!({
                    "kind": "kill_backend", "instance": inst, "t_ms": t(e),
                    "requests_after_death": after.len(),
                    "last_request_after_death_ms": last.map(|l| l - t(e)),
                    "requests_later_than_slo": late,
                    "failed_in_detection_window": causes(after.iter().copied()),
                }));
            }
            "kill_agent" => {
                let node = e["node"].as_str().unwrap_or("").to_owned();
                let owned: Vec<&String> = owner
                    .iter()
                    .filter(|(_, n)| **n == node)
                    .map(|(i, _)| i)
                    .collect();
                let after: Vec<&Value> = reqs
                    .iter()
                    .filter(|r| {
                        t(r) >= t(e)
                            && r["instance"]
                                .as_str()
                                .is_some_and(|i| owned.iter().any(|o| o.as_str() == i))
                    })
                    .collect();
                let last = after.iter().map(|r| t(r)).max();
                let late = after.iter().filter(|r| t(r) > t(e) + a.kill_slo_ms).count() as u64;
                kill_late += late;
                let own_clients = reqs
                    .iter()
                    .filter(|r| r["agent"] == node.as_str() && t(r) >= t(e))
                    .count();
                rows.push(json!({
                    "kind": "kill_agent", "node": node, "t_ms": t(e), "instances_owned": owned,
                    "requests_to_its_instances_after_death": after.len(),
                    "last_request_after_death_ms": last.map(|l| l - t(e)),
                    "requests_later_than_slo": late,
                    "outcomes_after_death": causes(after.iter().copied()),
                    "requests_from_its_own_clients_after_death": own_clients,
                }));
            }
            _ => {}
        }
    }
    // Windows between phase markers.
    let mark = |name: &str| {
        events
            .iter()
            .find(|e| e["kind"] == "phase" && e["name"] == name)
            .map(t)
    };
    let window = |from: Option<u64>, to: Option<u64>| -> Option<Vec<&Value>> {
        let (f, to) = (from?, to?);
        Some(reqs.iter().filter(|r| t(r) >= f && t(r) < to).collect())
    };
    let mut phases = serde_json::Map::new();
    let mut roll_discovery_failures = 0u64;
    let mut outage_ok = 0u64;
    for (name, from, to) in [
        ("steady", "steady_start", "roll_start"),
        ("roll", "roll_start", "roll_end"),
        ("after_roll", "roll_end", "authority_stop"),
        ("authority_outage", "authority_stop", "authority_start"),
        ("recovered", "authority_start", "end"),
    ] {
        if let Some(w) = window(mark(from), mark(to)) {
            let ok = w.iter().filter(|r| r["outcome"] == "ok").count() as u64;
            let failed: Vec<&Value> = w
                .iter()
                .copied()
                .filter(|r| {
                    r["outcome"] != "ok"
                        && !r["instance"]
                            .as_str()
                            .is_some_and(|i| killed.iter().any(|k| k == i))
                })
                .collect();
            if name == "roll" {
                roll_discovery_failures = failed.len() as u64;
            }
            if name == "authority_outage" {
                outage_ok = ok;
            }
            phases.insert(
                name.into(),
                json!({"requests": w.len(), "ok": ok, "failed_not_killed": causes(failed.into_iter()), "from_ms": mark(from), "to_ms": mark(to)}),
            );
        }
    }
    checks.insert(
        "drain: requests later than SLO after DRAINING commit",
        json!(drain_late),
    );
    checks.insert(
        "hard failure: requests to a killed process later than SLO",
        json!(kill_late),
    );
    checks.insert(
        "rolling deploy: failed requests not against a killed process",
        json!(roll_discovery_failures),
    );
    checks.insert("authority outage: successful requests", json!(outage_ok));
    let pass = drain_late == 0
        && kill_late == 0
        && roll_discovery_failures == 0
        && (mark("authority_stop").is_none() || outage_ok > 0);
    let total = causes(reqs.iter());
    let ok_total = reqs.iter().filter(|r| r["outcome"] == "ok").count();
    let report = json!({
        "requests": reqs.len(), "ok": ok_total, "failed_by_cause": total,
        "drain_slo_ms": a.drain_slo_ms, "kill_slo_ms": a.kill_slo_ms,
        "max_last_request_after_drain_commit_ms": drains_max_ms,
        "audit_logs": audits.len(), "events": rows, "phases": phases, "checks": checks, "pass": pass,
    });
    std::fs::write(
        dir.join("report.json"),
        serde_json::to_string_pretty(&report)?,
    )?;
    let mut md = String::new();
    let _ = writeln!(md, "# shoal scenario report\n");
    let _ = writeln!(
        md,
        "Run dir `{}`: {} requests, {} ok, failures by cause {}.\n",
        dir.display(),
        reqs.len(),
        ok_total,
        report["failed_by_cause"]
    );
    let _ = writeln!(md, "## Checks\n\n| check | value |\n|---|---|");
    for (k, v) in &checks {
        let _ = writeln!(md, "| {k} | {v} |");
    }
    let _ = writeln!(md, "\n**{}**\n", if pass { "PASS" } else { "FAIL" });
    let _ = writeln!(md, "## Phases\n\n| phase | requests | ok | failed (not against a killed process) |\n|---|---|---|---|");
    for (k, v) in &phases {
        let _ = writeln!(
            md,
            "| {k} | {} | {} | {} |",
            v["requests"], v["ok"], v["failed_not_killed"]
        );
    }
    let _ = writeln!(md, "\n## Events\n\n| event | subject | commit / death (unix ms) | requests after | last request to it (ms from commit or death; negative = before) | later than SLO | failed by cause |\n|---|---|---|---|---|---|---|");
    for r in &rows {
        let (subject, at, n, last, failed) = match r["kind"].as_str() {
            Some("drain") => (
                &r["instance"],
                &r["commit_ms"],
                &r["requests_after_commit"],
                &r["last_request_rel_commit_ms"],
                &r["failed_after_commit"],
            ),
            Some("kill_backend") => (
                &r["instance"],
                &r["t_ms"],
                &r["requests_after_death"],
                &r["last_request_after_death_ms"],
                &r["failed_in_detection_window"],
            ),
            _ => (
                &r["node"],
                &r["t_ms"],
                &r["requests_to_its_instances_after_death"],
                &r["last_request_after_death_ms"],
                &r["outcomes_after_death"],
            ),
        };
        let _ = writeln!(
            md,
            "| {} | {subject} | {at} | {n} | {last} | {} | {failed} |",
            r["kind"].as_str().unwrap_or(""),
            r["requests_later_than_slo"]
        );
    }
    std::fs::write(dir.join("report.md"), &md)?;
    println!("{md}");
    anyhow::ensure!(
        pass,
        "checks failed (see {})",
        dir.join("report.md").display()
    );
    Ok(())
}
