#!/usr/bin/env python3
"""py-consul (PyPI) against a real shoal agent's Consul-compatible port.

Usage: consul_check.py CONSUL_HOST:PORT WRITE_SOCKET DRAINS

WRITE_SOCKET is the unix socket of the agent that owns the instances (writes go there, through
shoal's own API; the Consul port is read-only). Checks the shapes Prometheus' consul_sd_configs
and py-consul read, blocking semantics (index/wait, per-service wake-ups), and measures the
blocking wake-up latency after a drain over DRAINS drain/ready cycles: from sending the drain
request to the agent until a blocking `health.service(..., passing=True, index=...)` on the
Consul port returns without the instance. Prints one JSON summary line at the end and
`N passed, 0 failed` when every check held.
"""

import http.client
import json
import socket
import statistics
import sys
import threading
import time

import consul

HOSTPORT, SOCK, DRAINS = sys.argv[1], sys.argv[2], int(sys.argv[3])
HOST, PORT = HOSTPORT.rsplit(":", 1)
C = consul.Consul(host=HOST, port=int(PORT))
NS, PORT_NAME = "prod", "http"
checks = 0


def ok(cond, what):
    global checks
    if not cond:
        print(f"FAILED: {what}", file=sys.stderr)
        print("0 passed, 1 failed")
        sys.exit(1)
    checks += 1
    print(f"ok: {what}")


class UnixConn(http.client.HTTPConnection):
    def __init__(self, path):
        super().__init__("agent", timeout=30)
        self.path = path

    def connect(self):
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.settimeout(30)
        s.connect(self.path)
        self.sock = s


def shoal(method, path, body=None):
    c = UnixConn(SOCK)
    data = json.dumps(body).encode() if body is not None else b""
    c.request(method, path, body=data, headers={"content-type": "application/json"})
    r = c.getresponse()
    out = r.read()
    c.close()
    if r.status != 200:
        raise RuntimeError(f"{method} {path}: {r.status} {out[:300]!r}")
    return json.loads(out) if out else None


def register(svc, inst, port, zone=None):
    body = {"instance": inst, "address": f"127.0.0.1:{port}", "labels": {"protocol": "http2"}}
    if zone:
        body["zone"] = zone
    shoal("POST", f"/v1/services/{NS}/{svc}/{PORT_NAME}/register", body)
    shoal("POST", f"/v1/services/{NS}/{svc}/{PORT_NAME}/instances/{inst}/ready")


def action(svc, inst, act):
    shoal("POST", f"/v1/services/{NS}/{svc}/{PORT_NAME}/instances/{inst}/{act}")


def name(svc):
    return f"{svc}.{PORT_NAME}.{NS}"


def wait_until(pred, what, timeout_s=20.0):
    """Polls the Consul port with blocking queries until pred(nodes) holds (bounded)."""
    deadline = time.monotonic() + timeout_s
    index = None
    while time.monotonic() < deadline:
        index, nodes = C.health.service(name(WEB), index=index, wait="2s")
        if pred(nodes):
            return index, nodes
    ok(False, f"timed out waiting for {what}")


def ids(nodes):
    return sorted(n["Service"]["ID"] for n in nodes)


WEB, DB = "web", "db"
register(WEB, "web-1", 18081)
register(WEB, "web-2", 18082, zone="zone-2")
register(DB, "db-1", 15432)

# --- /v1/agent/self: what Prometheus reads (Config.Datacenter) ------------------------------
me = C.agent.self()
ok(isinstance(me["Config"]["Datacenter"], str) and me["Config"]["Datacenter"], "agent.self Config.Datacenter")
ok(me["Config"]["NodeName"] == me["Member"]["Name"], "agent.self NodeName == Member.Name")

# --- /v1/catalog/services --------------------------------------------------------------------
index, services = C.catalog.services()
ok(int(index) > 0, f"catalog.services X-Consul-Index > 0 ({index})")
ok(name(WEB) in services and name(DB) in services, f"catalog.services lists web and db: {sorted(services)}")
ok("protocol=http2" in services[name(WEB)], f"tags carry labels: {services[name(WEB)]}")

# --- /v1/health/service/<name> ---------------------------------------------------------------
index, nodes = wait_until(lambda n: ids([x for x in n if all(c["Status"] == "passing" for c in x["Checks"])]) == ["web-1", "web-2"], "web-1, web-2 passing")
n0 = nodes[0]
for k in ("Node", "Service", "Checks"):
    ok(k in n0, f"health entry has {k}")
for k in ("ID", "Node", "Address", "Datacenter", "TaggedAddresses", "Meta"):
    ok(k in n0["Node"], f"Node.{k}")
for k in ("ID", "Service", "Tags", "Address", "Port", "Meta", "Weights"):
    ok(k in n0["Service"], f"Service.{k}")
ok(n0["Service"]["Service"] == name(WEB), "Service.Service is the Consul name")
ok(n0["Service"]["Meta"]["shoal_namespace"] == NS, "Service.Meta.shoal_namespace")
ok({c["CheckID"] for c in n0["Checks"]} >= {"serfHealth"}, "serfHealth check present")
web1_port = [x for x in nodes if x["Service"]["ID"] == "web-1"][0]["Service"]["Port"]
ok(web1_port == 18081, "Service.Port")
_, tagged = C.health.service(name(WEB), tag="zone=zone-2")
ok(ids(tagged) == ["web-2"], f"tag filter: {ids(tagged)}")

# --- /v1/catalog/service/<name>, /v1/catalog/nodes -------------------------------------------
_, cat = C.catalog.service(name(WEB))
ok(sorted(x["ServiceID"] for x in cat) == ["web-1", "web-2"], "catalog.service lists both")
ok(all(x["ServiceName"] == name(WEB) and x["ServicePort"] in (18081, 18082) for x in cat), "catalog.service shape")
_, nodes_list = C.catalog.nodes()
ok(len(nodes_list) >= 1 and all("Node" in n and "Address" in n for n in nodes_list), f"catalog.nodes: {[n['Node'] for n in nodes_list]}")

# --- errors ----------------------------------------------------------------------------------
try:
    C.health.service("not-a-shoal-name")
    ok(False, "a malformed name is refused")
except consul.ConsulException as e:
    ok("not a shoal service name" in str(e), "a malformed name is refused with a reason")

# --- blocking: a watch on db does not wake for web --------------------------------------------
db_index, _ = C.health.service(name(DB))
res = {}


def watch_db():
    t = time.monotonic()
    res["db"] = (C.health.service(name(DB), index=db_index, wait="2s")[0], time.monotonic() - t)


th = threading.Thread(target=watch_db)
th.start()
action(WEB, "web-2", "drain")
action(WEB, "web-2", "ready")
th.join()
ok(res["db"][0] == db_index and res["db"][1] >= 2.0,
   f"db watch slept through web changes (index {res['db'][0]} == {db_index}, {res['db'][1]:.2f} s >= wait 2 s)")

# --- blocking wake-up latency after a drain ---------------------------------------------------
lat_ms = []
for i in range(DRAINS):
    index, nodes = wait_until(lambda n: "web-1" in ids([x for x in n if all(c["Status"] == "passing" for c in x["Checks"])]), "web-1 passing again")
    got = {}

    def watcher(idx=index):
        # A blocking watch: returns when web's index passes idx; loops over unrelated wakes.
        while True:
            idx, n = C.health.service(name(WEB), index=idx, passing=True, wait="30s")
            if "web-1" not in ids(n):
                got["t"] = time.monotonic()
                return

    th = threading.Thread(target=watcher)
    th.start()
    t0 = time.monotonic()
    action(WEB, "web-1", "drain")
    th.join(timeout=30)
    if th.is_alive() or "t" not in got:
        ok(False, f"drain {i + 1}: the blocking watch did not wake within 30 s")
    lat_ms.append((got["t"] - t0) * 1000)
    action(WEB, "web-1", "ready")
ok(len(lat_ms) == DRAINS, f"{DRAINS} drains observed by blocking watches")

# A drained endpoint stays listed without `passing`, with a critical shoal check.
action(WEB, "web-1", "drain")
wait_until(lambda n: any(x["Service"]["ID"] == "web-1" and any(c["Status"] == "critical" for c in x["Checks"]) for x in n), "web-1 listed critical while DRAINING")
_, passing = C.health.service(name(WEB), passing=True)
ok("web-1" not in ids(passing), "passing=true hides the DRAINING endpoint")

q = statistics.quantiles(lat_ms, n=100, method="inclusive")
summary = {
    "drains": len(lat_ms),
    "wake_ms_p50": round(statistics.median(lat_ms), 2),
    "wake_ms_p99": round(q[98], 2),
    "wake_ms_max": round(max(lat_ms), 2),
}
print("consul blocking wake-up after drain:", json.dumps(summary))
print(f"{checks} passed, 0 failed")
