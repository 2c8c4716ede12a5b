"""A real gRPC client (grpcio's xDS resolver) against a real shoal agent's xDS server.

    python3 tests/xds/drain_test.py --shoal target/debug/shoal [--drains 100] [--out report.json]

What it does, all on 127.0.0.1:
1. starts one agent (development authority, `[xds] enabled = true`, metrics on);
2. starts four demo backends (tests/xds/backend.py, separate processes) and registers them
   with the `shoal` CLI as prod/greeter/grpc: g-1..g-3 in the agent's zone `zone-1`, g-4 in
   `zone-2`; marks them READY;
3. a client thread calls `xds:///greeter.grpc.prod` (GRPC_XDS_BOOTSTRAP -> the agent, node
   locality zone-1) back to back and records the start time and serving instance of every call;
4. drains one zone-1 backend at a time with `shoal drain` (N times, round robin over g-1..g-3),
   and measures the time from the drain call to the client's last request to that backend;
   then `shoal ready` puts it back and waits until the client uses it again;
5. drains all three zone-1 backends: the client must fail over to g-4 (priority 1), and come
   back to zone-1 when they are READY again;
6. reads the agent's /metrics: the client ACKed responses and NACKed none.

Checks (each printed PASS/FAIL; the last line is `xds: N passed, M failed`): every drain stops
traffic to the drained backend within the drain budget (3 s); no call failed during the drain
cycles; g-4 got no call while zone-1 had READY backends; failover to and back from zone-2;
no NACK. Exit status 1 if any check fails. Every wait is bounded; waits on the client's calls
wake on each call (a condition variable), only the agent's start is polled.
"""
import argparse
import json
import os
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

HERE = Path(__file__).resolve().parent
SERVICE = "prod/greeter/grpc"
TARGET = "xds:///greeter.grpc.prod"
DRAIN_BUDGET_MS = 3000
# Calls after the last one to a drained backend that show it is out of the picker: the client
# uses round robin over the three zone-1 backends, so one still listed gets every third call.
QUIET_CALLS = 30
DEADLINE_S = 170


def free_port(kind):
    with socket.socket(socket.AF_INET, kind) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def percentile(sorted_vals, p):
    """Nearest-rank percentile of a sorted list."""
    if not sorted_vals:
        return None
    k = max(0, min(len(sorted_vals) - 1, int(-(-p * len(sorted_vals) // 100)) - 1))
    return sorted_vals[k]


class Calls:
    """The client's call log, appended by the client thread; waits use a condition, no sleep."""

    def __init__(self):
        self.cond = threading.Condition()
        self.log = []  # (start monotonic s, instance)
        self.errors = []  # (start monotonic s, status code name)

    def add(self, t, instance):
        with self.cond:
            self.log.append((t, instance))
            self.cond.notify_all()

    def error(self, t, code):
        with self.cond:
            self.errors.append((t, code))
            self.cond.notify_all()

    def wait_for(self, pred, timeout_s):
        """Waits until pred(log) holds (evaluated after every call); False at the timeout."""
        end = time.monotonic() + timeout_s
        with self.cond:
            while not pred(self.log):
                left = end - time.monotonic()
                if left <= 0:
                    return False
                self.cond.wait(left)
            return True


def calls_after_last(log, instance, since):
    """Calls started after `since` and after the last call to `instance`."""
    n = 0
    for t, inst in reversed(log):
        if inst == instance:
            break
        if t > since:
            n += 1
    return n


def tail_all(log, allowed, n):
    """The last n calls all went to instances in `allowed`."""
    return len(log) >= n and all(inst in allowed for _, inst in log[-n:])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--shoal", required=True)
    ap.add_argument("--drains", type=int, default=100)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    started = time.monotonic()
    shoal = str(Path(args.shoal).resolve())
    work = Path(tempfile.mkdtemp(prefix="shoal-xds-"))
    procs = []
    results = []

    def check(name, ok, detail=""):
        results.append((name, bool(ok)))
        print(f"{'PASS' if ok else 'FAIL'} {name}{': ' + detail if detail else ''}", flush=True)

    def run(*a):
        return subprocess.run([shoal, *a], cwd=work, capture_output=True, text=True, timeout=20)

    def cli(*a):
        r = run("--socket", str(work / "agent.sock"), *a)
        if r.returncode != 0:
            raise RuntimeError(f"shoal {' '.join(a)}: {r.stderr.strip()}")
        return r.stdout

    try:
        # 1. The agent.
        for a in (("certs", "ca", "--region", "dev", "--out", "."),
                  ("certs", "node", "--node-id", "node-1", "--region", "dev", "--out", ".")):
            r = run(*a)
            assert r.returncode == 0, r.stderr
        xds_port, metrics_port = free_port(socket.SOCK_STREAM), free_port(socket.SOCK_STREAM)
        (work / "agent.toml").write_text(f"""
node_id = "node-1"
region = "dev"
zone = "zone-1"
data_dir = "data"
listen = "127.0.0.1:{free_port(socket.SOCK_DGRAM)}"
socket = "{work / 'agent.sock'}"
metrics = "127.0.0.1:{metrics_port}"
[tls]
ca = "dev-ca.pem"
cert = "dev-node-node-1.pem"
key = "dev-node-node-1-key.pem"
[trust]
dev_authority = true
[authority]
dev = true
[access]
dev_allow_all = true
[xds]
enabled = true
listen = "127.0.0.1:{xds_port}"
""")
        agent_log = open(work / "agent.log", "w")
        procs.append(subprocess.Popen([shoal, "agent", "--config", "agent.toml"], cwd=work,
                                      stdout=agent_log, stderr=subprocess.STDOUT))

        # 2. Backends (the generated modules first).
        gen = work / "gen"
        gen.mkdir()
        from grpc_tools import protoc
        rc = protoc.main(["protoc", f"-I{HERE}", f"--python_out={gen}", f"--grpc_python_out={gen}",
                          str(HERE / "echo.proto")])
        assert rc == 0, "protoc failed"
        zones = {"g-1": "zone-1", "g-2": "zone-1", "g-3": "zone-1", "g-4": "zone-2"}
        ports = {}
        for inst in zones:
            p = subprocess.Popen([sys.executable, str(HERE / "backend.py"), "--instance", inst,
                                  "--gen-dir", str(gen)], stdin=subprocess.PIPE,
                                 stdout=subprocess.PIPE, text=True)
            procs.append(p)
            line = p.stdout.readline()
            assert line.startswith("PORT "), f"backend {inst}: {line!r}"
            ports[inst] = int(line.split()[1])
        # The agent must be up and its node key bound before registrations succeed: retry,
        # bounded (each attempt is one CLI call that waits for the agent's answer).
        for inst, zone in zones.items():
            end = time.monotonic() + 30
            while True:
                r = run("--socket", str(work / "agent.sock"), "register", SERVICE,
                        "--instance", inst, "--address", f"127.0.0.1:{ports[inst]}", "--zone", zone)
                if r.returncode == 0:
                    break
                if time.monotonic() > end:
                    raise RuntimeError(f"register {inst}: {r.stderr.strip()}")
                time.sleep(0.1)  # poll interval of a bounded wait-for-condition (agent start)
            cli("ready", SERVICE, inst)

        # 3. The client: grpcio with its xDS resolver, bootstrap pointing at the agent.
        bootstrap = work / "bootstrap.json"
        bootstrap.write_text(json.dumps({
            "xds_servers": [{"server_uri": f"127.0.0.1:{xds_port}",
                             "channel_creds": [{"type": "insecure"}],
                             "server_features": ["xds_v3"]}],
            "node": {"id": "xds-drain-test", "locality": {"zone": "zone-1"}},
        }))
        os.environ["GRPC_XDS_BOOTSTRAP"] = str(bootstrap)
        sys.path.insert(0, str(gen))
        import grpc
        import echo_pb2
        import echo_pb2_grpc

        calls = Calls()
        stop = threading.Event()

        def client():
            with grpc.insecure_channel(TARGET) as ch:
                stub = echo_pb2_grpc.EchoStub(ch)
                seq = 0
                while not stop.is_set() and time.monotonic() - started < DEADLINE_S:
                    seq += 1
                    t = time.monotonic()
                    try:
                        r = stub.Who(echo_pb2.WhoRequest(seq=seq), timeout=2, wait_for_ready=True)
                        calls.add(t, r.instance)
                    except grpc.RpcError as e:
                        calls.error(t, e.code().name)

        th = threading.Thread(target=client, daemon=True)
        th.start()
        zone1 = ["g-1", "g-2", "g-3"]
        ok = calls.wait_for(lambda log: {i for _, i in log} >= set(zone1), 30)
        check("client resolves xds:///greeter.grpc.prod and reaches every zone-1 backend", ok,
              f"{len(calls.log)} calls, errors {len(calls.errors)}")
        if not ok:
            raise RuntimeError("no traffic through xDS")

        # 4. Drains.
        latencies, readmit = [], []
        errors_before = len(calls.errors)
        first_call_idx = len(calls.log)
        all_within = True
        for k in range(args.drains):
            victim = zone1[k % 3]
            t0 = time.monotonic()
            cli("drain", SERVICE, victim)
            stopped = calls.wait_for(
                lambda log: calls_after_last(log, victim, t0) >= QUIET_CALLS,
                DRAIN_BUDGET_MS / 1000 + 2)
            with calls.cond:
                last = max((t for t, i in calls.log if i == victim), default=t0)
            ms = max(0.0, (last - t0) * 1000)
            latencies.append(ms)
            if not stopped or ms > DRAIN_BUDGET_MS:
                all_within = False
                print(f"drain {k} of {victim}: stopped={stopped} last request {ms:.1f} ms after the drain call")
            t1 = time.monotonic()
            cli("ready", SERVICE, victim)
            back = calls.wait_for(
                lambda log: any(i == victim and t > t1 for t, i in log[-QUIET_CALLS:]), 10)
            if not back:
                raise RuntimeError(f"{victim} not used again after READY")
            with calls.cond:
                readmit.append((min(t for t, i in calls.log if i == victim and t > t1) - t1) * 1000)
        drain_calls = calls.log[first_call_idx:]
        s = sorted(latencies)
        summary = {
            "drains": len(s),
            "drain_to_last_request_ms": {"p50": percentile(s, 50), "p99": percentile(s, 99),
                                         "max": s[-1] if s else None, "min": s[0] if s else None},
            "ready_to_first_request_ms": {"p50": percentile(sorted(readmit), 50),
                                          "p99": percentile(sorted(readmit), 99)},
            "calls_during_drains": len(drain_calls),
            "failed_calls_during_drains": len(calls.errors) - errors_before,
        }
        check(f"every drain stops traffic to the backend within {DRAIN_BUDGET_MS} ms", all_within,
              "p50 {p50:.1f} ms, p99 {p99:.1f} ms, max {max:.1f} ms over {n} drains".format(
                  n=len(s), **summary["drain_to_last_request_ms"]))
        check("no call failed during the drain cycles", summary["failed_calls_during_drains"] == 0,
              f"{summary['failed_calls_during_drains']} of {len(drain_calls)}")
        g4 = sum(1 for _, i in drain_calls if i == "g-4")
        check("zone-2 (priority 1) gets no call while zone-1 has READY backends", g4 == 0,
              f"{g4} calls to g-4")

        # 5. Failover to priority 1 and back.
        t0 = time.monotonic()
        for v in zone1:
            cli("drain", SERVICE, v)
        over = calls.wait_for(lambda log: tail_all(log, {"g-4"}, QUIET_CALLS), 10)
        failover_ms = (time.monotonic() - t0) * 1000
        check("all of zone-1 drained: the client fails over to zone-2", over,
              f"{failover_ms:.0f} ms until {QUIET_CALLS} calls in a row went to g-4")
        t0 = time.monotonic()
        for v in zone1:
            cli("ready", SERVICE, v)
        back = calls.wait_for(lambda log: tail_all(log, set(zone1), QUIET_CALLS), 10)
        check("zone-1 READY again: the client comes back from zone-2", back,
              f"{(time.monotonic() - t0) * 1000:.0f} ms")
        summary["failover_ms"] = failover_ms
        stop.set()
        th.join(timeout=5)

        # 6. What the agent saw.
        text = urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics", timeout=5).read().decode()

        def total(name, *labels):
            return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
                       if line.startswith(name) and all(lb in line for lb in labels))
        check("the xDS metrics are described (HELP) and the NACK counters exist",
              "# HELP shoal_xds_nacks_total" in text
              and all(f'shoal_xds_nacks_total{{type="{t}"}}' in text for t in ("lds", "rds", "cds", "eds")))
        acks, nacks = total("shoal_xds_requests_total", 'kind="ack"'), total("shoal_xds_nacks_total")
        eds = total("shoal_xds_responses_total", 'type="eds"')
        summary.update({"acks": acks, "nacks": nacks, "eds_responses": eds})
        check("the client ACKs the agent's responses and NACKs none", acks > 0 and nacks == 0 and eds > 0,
              f"{acks:.0f} ACKs, {nacks:.0f} NACKs, {eds:.0f} EDS responses")
        summary["total_calls"] = len(calls.log)
        summary["errors_by_code"] = {}
        for _, c in calls.errors:
            summary["errors_by_code"][c] = summary["errors_by_code"].get(c, 0) + 1
        summary["elapsed_s"] = round(time.monotonic() - started, 1)
        print(json.dumps(summary, indent=2))
        if args.out:
            Path(args.out).write_text(json.dumps(summary, indent=2) + "\n")
    except Exception as e:  # a setup failure is a failed check, with the agent's log tail
        check("setup", False, str(e))
        log = work / "agent.log"
        if log.exists():
            print("--- agent log (tail)\n" + "\n".join(log.read_text().splitlines()[-30:]))
    finally:
        for p in reversed(procs):
            if p.poll() is None:
                p.terminate()
        for p in procs:
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                p.kill()
    passed = sum(1 for _, ok in results if ok)
    failed = len(results) - passed
    print(f"xds: {passed} passed, {failed} failed")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
