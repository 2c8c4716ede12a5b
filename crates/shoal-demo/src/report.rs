//! `shoal-demo report`: joins a run directory's `events.jsonl` (scenario + backends), the
//! clients' timelines (`timeline/*.jsonl`), the authorities' `audit.log` files and the agents'
//! apply times (`applied.jsonl` from `watch-applied`, `agents.tsv`) into one report
//! (`report.json`, `report.md`, `timeline.svg`) and prints the summary.
//!
//! Per event: the authority commit time (`committed_at_ms` of the DRAINING transition in the
//! audit log; the request time when not found), when each agent of the instance's region
//! applied the DRAINING record (ms after the commit the record carries; p50 and max across
//! agents), the last request sent to the old endpoint, requests later than the SLO, and failed
//! requests by cause.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use serde_json::{json, Value};

use crate::plot::{timeline_svg, Marker, MarkerKind, Timeline};

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

/// Nearest-rank percentile of sorted `v` (`p` in 0..=100).
fn percentile(v: &[u64], p: u64) -> Option<u64> {
    if v.is_empty() {
        return None;
    }
    let rank = (v.len() as u64 * p).div_ceil(100).max(1) as usize;
    Some(v[rank.min(v.len()) - 1])
}

/// Agents of the run from `agents.tsv`: node -> region.
fn agent_regions(dir: &Path) -> BTreeMap<String, String> {
    std::fs::read_to_string(dir.join("agents.tsv"))
        .unwrap_or_default()
        .lines()
        .filter_map(|l| {
            let mut f = l.split('\t');
            let region = f.next()?.to_owned();
            Some((f.next()?.to_owned(), region))
        })
        .collect()
}

/// One agent's view of one DRAINING record.
#[derive(Debug, Clone, Copy)]
struct Applied {
    committed_at_ms: u64,
    applied_at_ms: Option<u64>,
}

/// DRAINING records per instance and agent from `applied.jsonl`; a stamped line wins over an
/// unstamped one, and the first stamped line wins over later ones.
fn drain_applies(dir: &Path) -> BTreeMap<String, BTreeMap<String, Applied>> {
    let mut out: BTreeMap<String, BTreeMap<String, Applied>> = BTreeMap::new();
    for v in read_lines(&dir.join("applied.jsonl")) {
        if v["state"] != "DRAINING" {
            continue;
        }
        let (Some(inst), Some(agent)) = (v["instance"].as_str(), v["agent"].as_str()) else {
            continue;
        };
        let a = Applied {
            committed_at_ms: v["committed_at_ms"].as_u64().unwrap_or(0),
            applied_at_ms: v["applied_at_ms"].as_u64(),
        };
        let per = out.entry(inst.to_owned()).or_default();
        match per.get(agent) {
            Some(old) if old.applied_at_ms.is_some() || a.applied_at_ms.is_none() => {}
            _ => {
                per.insert(agent.to_owned(), a);
            }
        }
    }
    out
}

/// Apply times of one drain event: every agent of the instance's region that showed the
/// DRAINING record, ms after the commit the record carries, p50 and max across agents.
fn apply_summary(
    region: Option<&str>,
    regions: &BTreeMap<String, String>,
    applies: Option<&BTreeMap<String, Applied>>,
    audit_commit_ms: Option<u64>,
) -> (Value, Vec<u64>) {
    let empty = BTreeMap::new();
    let applies = applies.unwrap_or(&empty);
    let in_region: Vec<&String> = regions
        .iter()
        .filter(|(_, r)| Some(r.as_str()) == region)
        .map(|(n, _)| n)
        .collect();
    let mut per_agent = serde_json::Map::new();
    let mut after = Vec::new();
    for (agent, a) in applies {
        let ms = a.applied_at_ms.map(|t| t as i64 - a.committed_at_ms as i64);
        if let Some(ms) = ms {
            after.push(ms.max(0) as u64);
        }
        per_agent.insert(
            agent.clone(),
            json!({"applied_at_ms": a.applied_at_ms, "after_commit_ms": ms}),
        );
    }
    after.sort_unstable();
    let not_seen: Vec<&&String> = in_region
        .iter()
        .filter(|n| !applies.contains_key(n.as_str()))
        .collect();
    let record_commit = applies.values().map(|a| a.committed_at_ms).min();
    let v = json!({
        "region": region, "agents_in_region": in_region.len(), "agents_holding": applies.len(),
        "agents_with_apply_time": after.len(), "agents_not_seen": not_seen,
        "record_committed_at_ms": record_commit,
        "record_commit_matches_audit": record_commit.zip(audit_commit_ms).map(|(r, a)| r == a),
        "apply_after_commit_ms_p50": percentile(&after, 50),
        "apply_after_commit_ms_max": after.last(),
        "per_agent": per_agent,
    });
    (v, after)
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
    let regions = agent_regions(dir);
    let applies = drain_applies(dir);
    let region_of = |inst: &str| -> Option<String> {
        let node = owner.get(inst)?;
        regions
            .get(node)
            .cloned()
            .or_else(|| node.split_once('-').map(|(r, _)| r.to_owned()))
    };
    let mut all_after: Vec<u64> = Vec::new();
    let mut markers = Vec::new();
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
                markers.push(Marker {
                    t_ms: commit,
                    kind: MarkerKind::DrainCommit,
                });
                let (apply, after_ms) = apply_summary(
                    region_of(&inst).as_deref(),
                    &regions,
                    applies.get(&inst),
                    drain_commit.get(&inst).copied(),
                );
                all_after.extend(after_ms);
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
                    "failed_after_commit": causes(after.iter().copied()), "apply": apply,
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
                markers.push(Marker {
                    t_ms: t(e),
                    kind: MarkerKind::KillBackend,
                });
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
                markers.push(Marker {
                    t_ms: t(e),
                    kind: MarkerKind::KillAgent,
                });
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
    let mut failover_failed = 0u64;
    // The failover phase (ADR 0013), when the scenario ran one, ends the `recovered` window.
    let recovered_to = if mark("failover_start").is_some() {
        "failover_start"
    } else {
        "end"
    };
    for (name, from, to) in [
        ("steady", "steady_start", "roll_start"),
        ("roll", "roll_start", "roll_end"),
        ("after_roll", "roll_end", "authority_stop"),
        ("authority_outage", "authority_stop", "authority_start"),
        ("recovered", "authority_start", recovered_to),
        ("failover", "failover_start", "isolation_start"),
        ("region_isolation", "isolation_start", "failover_end"),
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
            if name == "failover" || name == "region_isolation" {
                failover_failed += failed.len() as u64;
            }
            // "<client region>/<tier>" -> requests, e.g. "r1/failover:r2".
            let mut tiers: BTreeMap<String, u64> = BTreeMap::new();
            for r in &w {
                if let Some(tier) = r["tier"].as_str() {
                    let agent = r["agent"].as_str().unwrap_or("?");
                    let region = agent.split('-').next().unwrap_or("?");
                    *tiers.entry(format!("{region}/{tier}")).or_default() += 1;
                }
            }
            phases.insert(
                name.into(),
                json!({"requests": w.len(), "ok": ok, "failed_not_killed": causes(failed.into_iter()), "answered_by_tier": tiers, "from_ms": mark(from), "to_ms": mark(to)}),
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
    if mark("failover_start").is_some() {
        checks.insert(
            "failover and region isolation: failed requests not against a killed process",
            json!(failover_failed),
        );
    }
    let pass = drain_late == 0
        && kill_late == 0
        && roll_discovery_failures == 0
        && failover_failed == 0
        && (mark("authority_stop").is_none() || outage_ok > 0);
    let total = causes(reqs.iter());
    let ok_total = reqs.iter().filter(|r| r["outcome"] == "ok").count();
    all_after.sort_unstable();
    let apply_all = json!({
        "samples": all_after.len(), "p50_ms": percentile(&all_after, 50),
        "p99_ms": percentile(&all_after, 99), "max_ms": all_after.last(),
        "source": "applied.jsonl (shoal-demo watch-applied): each agent's applied_at_ms minus the record's committed_at_ms",
        "scope": "agents of the instance's region only: each region is its own mesh (own CA and authority), other regions never hold the record",
    });
    let report = json!({
        "requests": reqs.len(), "ok": ok_total, "failed_by_cause": total,
        "drain_slo_ms": a.drain_slo_ms, "kill_slo_ms": a.kill_slo_ms,
        "max_last_request_after_drain_commit_ms": drains_max_ms,
        "drain_apply_after_commit_ms": apply_all,
        "audit_logs": audits.len(), "events": rows, "phases": phases, "checks": checks, "pass": pass,
        "timeline_svg": "timeline.svg",
    });
    let timeline = Timeline {
        requests: reqs.iter().map(|r| (t(r), r["outcome"] == "ok")).collect(),
        markers,
        outage: mark("authority_stop").zip(mark("authority_start")),
    };
    timeline_svg(
        &dir.join("timeline.svg"),
        "requests per second through pick (all clients)",
        &timeline,
    )?;
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
    let _ = writeln!(
        md,
        "![requests per second, ok and failed, with DRAINING commits, kills and the authority outage](timeline.svg)\n"
    );
    let _ = writeln!(
        md,
        "DRAINING applied by the agents of the instance's region, ms after the authority commit \
         (each agent's own `applied_at_ms` minus the record's `committed_at_ms`), over {} \
         (agent, event) pairs: p50 {}, p99 {}, max {}. Regions are separate meshes (own CA, own \
         authority): an instance's record is held only by its region's agents, so only those count.\n",
        apply_all["samples"], apply_all["p50_ms"], apply_all["p99_ms"], apply_all["max_ms"]
    );
    let _ = writeln!(md, "## Phases\n\n| phase | requests | ok | failed (not against a killed process) |\n|---|---|---|---|");
    for (k, v) in &phases {
        let _ = writeln!(
            md,
            "| {k} | {} | {} | {} |",
            v["requests"], v["ok"], v["failed_not_killed"]
        );
    }
    let _ = writeln!(md, "\n## Events\n\n| event | subject | commit / death (unix ms) | agents applied / in region | apply p50 / max (ms after commit) | requests after | last request to it (ms from commit or death; negative = before) | later than SLO | failed by cause |\n|---|---|---|---|---|---|---|---|---|");
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
        let ap = &r["apply"];
        let (held, spread) = if ap.is_null() {
            ("-".to_owned(), "-".to_owned())
        } else {
            (
                format!(
                    "{} / {}",
                    ap["agents_with_apply_time"], ap["agents_in_region"]
                ),
                format!(
                    "{} / {}",
                    ap["apply_after_commit_ms_p50"], ap["apply_after_commit_ms_max"]
                ),
            )
        };
        let _ = writeln!(
            md,
            "| {} | {subject} | {at} | {held} | {spread} | {n} | {last} | {} | {failed} |",
            r["kind"].as_str().unwrap_or(""),
            r["requests_later_than_slo"]
        );
    }
    apply_tables(&mut md, &rows, &regions);
    std::fs::write(dir.join("report.md"), &md)?;
    println!("{md}");
    anyhow::ensure!(
        pass,
        "checks failed (see {})",
        dir.join("report.md").display()
    );
    Ok(())
}

/// Per region, one row per drain event and one column per agent: ms from commit to apply.
fn apply_tables(md: &mut String, rows: &[Value], regions: &BTreeMap<String, String>) {
    let mut by_region: BTreeMap<&str, Vec<&String>> = BTreeMap::new();
    for (node, region) in regions {
        by_region.entry(region.as_str()).or_default().push(node);
    }
    for (region, nodes) in by_region {
        let drains: Vec<&Value> = rows
            .iter()
            .filter(|r| r["kind"] == "drain" && r["apply"]["region"] == region)
            .collect();
        if drains.is_empty() {
            continue;
        }
        let _ = writeln!(
            md,
            "\n## DRAINING applied per agent, region {region} (ms after commit; - = never shown)\n"
        );
        let head: Vec<&str> = nodes.iter().map(|n| n.as_str()).collect();
        let _ = writeln!(md, "| instance | {} |", head.join(" | "));
        let _ = writeln!(md, "|---|{}", "---|".repeat(nodes.len()));
        for r in drains {
            let cells: Vec<String> = nodes
                .iter()
                .map(|n| {
                    let ms = &r["apply"]["per_agent"][n.as_str()]["after_commit_ms"];
                    if ms.is_null() {
                        "-".to_owned()
                    } else {
                        ms.to_string()
                    }
                })
                .collect();
            let inst = r["instance"].as_str().unwrap_or("");
            let _ = writeln!(md, "| {inst} | {} |", cells.join(" | "));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentile_is_nearest_rank() {
        let v: Vec<u64> = (1..=10).collect();
        assert_eq!(percentile(&v, 50), Some(5));
        assert_eq!(percentile(&v, 99), Some(10));
        assert_eq!(percentile(&v, 0), Some(1));
        assert_eq!(percentile(&[], 50), None);
    }

    #[test]
    fn apply_summary_counts_only_the_region_and_measures_from_the_record_commit() {
        let regions: BTreeMap<String, String> = [("r1-a1", "r1"), ("r1-a2", "r1"), ("r2-a1", "r2")]
            .into_iter()
            .map(|(n, r)| (n.to_owned(), r.to_owned()))
            .collect();
        let applies: BTreeMap<String, Applied> = [("r1-a1", Some(1_010)), ("r1-a2", Some(1_030))]
            .into_iter()
            .map(|(n, t)| {
                let a = Applied {
                    committed_at_ms: 1_000,
                    applied_at_ms: t,
                };
                (n.to_owned(), a)
            })
            .collect();
        let (v, after) = apply_summary(Some("r1"), &regions, Some(&applies), Some(1_000));
        assert_eq!(after, vec![10, 30]);
        assert_eq!(v["agents_in_region"], 2);
        assert_eq!(v["apply_after_commit_ms_p50"], 10);
        assert_eq!(v["apply_after_commit_ms_max"], 30);
        assert_eq!(v["record_commit_matches_audit"], true);
        assert_eq!(v["per_agent"]["r1-a2"]["after_commit_ms"], 30);
        let (v, _) = apply_summary(Some("r1"), &regions, None, None);
        assert_eq!(v["agents_not_seen"], json!(["r1-a1", "r1-a2"]));
    }
}
