#!/usr/bin/env python3
"""Summarises a deploy/compose/fault-test.sh run: RUN_DIR/events.jsonl (the faults) and
RUN_DIR/timeline/*.jsonl (every request of every client) -> report.json, report.md; prints
report.md and exits 1 when a check fails. Standard library only.

Environment: RUN_DIR, KILL_SLO_MS (hard-failure SLO, 15000), VICTIMS (JSON list of the backend
instances lost with the partitioned / killed node).
"""
import json
import os
import sys
from collections import Counter
from pathlib import Path

run = Path(os.environ["RUN_DIR"])
slo = int(os.environ.get("KILL_SLO_MS", "15000"))
victims = set(json.loads(os.environ.get("VICTIMS", "[]")))


def lines(p):
    out = []
    for ln in p.read_text().splitlines():
        ln = ln.strip()
        if ln:
            try:
                out.append(json.loads(ln))
            except json.JSONDecodeError:
                pass  # a line cut by the client's exit
    return out


events = lines(run / "events.jsonl")
reqs = []
for f in sorted((run / "timeline").glob("*.jsonl")):
    reqs.extend(lines(f))
reqs.sort(key=lambda r: r["t_ms"])
phases = [e for e in events if e["kind"] == "phase"]
# Faults whose lost backends may fail for up to the SLO.
lossy = {"partition": "partitioned", "node_loss": "killed"}
fault_t = {e["kind"]: e["t_ms"] for e in events if e["kind"] in lossy.values()}

rows, checks = [], {}
# From the first phase on: before it the clients start while backends are still registering.
t_first = phases[0]["t_ms"] if phases else 0
reqs = [r for r in reqs if r["t_ms"] >= t_first]
r1 = [r for r in reqs if str(r.get("agent", "")).startswith("r1-")]
controls = [r for r in reqs if not str(r.get("agent", "")).startswith("r1-")]
for i, ph in enumerate(phases):
    name = ph["name"]
    lo = ph["t_ms"]
    hi = phases[i + 1]["t_ms"] if i + 1 < len(phases) else float("inf")
    w = [r for r in r1 if lo <= r["t_ms"] < hi]
    failed = [r for r in w if r["outcome"] != "ok"]
    allowed = []
    if name in lossy:
        t_fault = fault_t.get(lossy[name], lo)
        allowed = [r for r in failed
                   if r.get("instance") in victims and r["t_ms"] - t_fault <= slo]
    bad = [r for r in failed if r not in allowed]
    late = [r for r in failed if r.get("instance") in victims and name in lossy
            and r["t_ms"] - fault_t.get(lossy[name], lo) > slo]
    last_to_lost = max((r["t_ms"] for r in w if r.get("instance") in victims
                        and name in lossy), default=None)
    row = {
        "phase": name, "requests": len(w), "ok": len(w) - len(failed),
        "failed": len(failed), "failed_by_cause": dict(Counter(r["outcome"] for r in failed)),
        "failed_to_lost_backends_within_slo": len(allowed),
        "failed_to_lost_backends_after_slo": len(late),
        "failed_otherwise": len(bad) - len(late),
    }
    if last_to_lost is not None and name in lossy:
        row["last_request_to_lost_backend_after_fault_ms"] = last_to_lost - fault_t.get(lossy[name], lo)
    rows.append(row)
    if name != "end":
        checks[f"{name}: failed requests not allowed by the hard-failure SLO"] = len(bad)

checks["control regions: failed requests over the whole run"] = sum(
    1 for r in controls if r["outcome"] != "ok")
checks["r1 requests served (must be > 0)"] = sum(1 for r in r1 if r["outcome"] == "ok")
recoveries = {e["after"]: e["recovery_ms"] for e in events if e["kind"] == "recovered"}
not_recovered = [e["after"] for e in events if e["kind"] == "not_recovered"]
checks["faults without recovery"] = len(not_recovered)
passed = all(v == 0 for k, v in checks.items() if not k.startswith("r1 requests served")) \
    and checks["r1 requests served (must be > 0)"] > 0
t0 = phases[0]["t_ms"] if phases else 0
start = {}
if (run / "start.json").exists():
    start = json.loads((run / "start.json").read_text())
report = {
    "pass": passed, "kill_slo_ms": slo, "lost_backends": sorted(victims),
    "requests": len(reqs), "r1_requests": len(r1), "control_requests": len(controls),
    "duration_s": round(((phases[-1]["t_ms"] if phases else t0) - t0) / 1000, 1),
    "start": start, "phases": rows, "recovery_ms": recoveries, "checks": checks,
    "faults": [e for e in events if e["kind"] != "phase"],
}
(run / "report.json").write_text(json.dumps(report, indent=2) + "\n")

md = ["# Compose fault test", ""]
md.append(f"{len(reqs)} requests ({len(r1)} in the faulted region r1, {len(controls)} in the "
          f"control regions) over {report['duration_s']} s; pass: **{passed}**.")
if start:
    md.append(f"Cluster start (containers created -> every backend routable, image build "
              f"excluded): {start.get('start_ms_without_images')} ms.")
md += ["", "| phase | requests | ok | failed | to lost backends <= SLO | after SLO | other | causes |",
       "|---|---|---|---|---|---|---|---|"]
for r in rows:
    md.append(f"| {r['phase']} | {r['requests']} | {r['ok']} | {r['failed']} | "
              f"{r['failed_to_lost_backends_within_slo']} | {r['failed_to_lost_backends_after_slo']} | "
              f"{r['failed_otherwise']} | {json.dumps(r['failed_by_cause'])} |")
md += ["", "| recovered after | ms (fault end -> every backend routable at r1-a1) |", "|---|---|"]
md += [f"| {k} | {v} |" for k, v in recoveries.items()]
md += ["", "| check | value |", "|---|---|"]
md += [f"| {k} | {v} |" for k, v in checks.items()]
(run / "report.md").write_text("\n".join(md) + "\n")
print("\n".join(md))
sys.exit(0 if passed else 1)
