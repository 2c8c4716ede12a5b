#!/usr/bin/env bash
# Callers in any language (issue 17), against real agents: py-consul on the Consul-compatible
# port (with blocking wake-up latency after drains), dig on the DNS port, promtool on a real scrape
# and the required metrics (tests/callers/required_metrics.txt) on the first one, a real
# Prometheus server scraping the agent, `shoal watch` across an agent
# restart, and a bounded schemathesis run of the OpenAPI document against the live unix-socket API.
#
#   tests/callers/run.sh            SHOAL=target/debug/shoal (default), DRAINS=120
#
# Two agents on 127.0.0.1 / 127.0.0.2: node-1 runs the development authority and serves the
# Consul port (127.0.0.1:18500) and metrics (127.0.0.1:19464); writes go to node-2's socket, so a
# drain travels authority -> mesh -> node-1's view before a Consul watch on node-1 sees it.
# Needs python3 with py-consul and schemathesis, and prometheus + promtool (.ci/run installs them).
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
SHOAL=${SHOAL:-$ROOT/target/debug/shoal}
DRAINS=${DRAINS:-120}
DIR=$(mktemp -d /tmp/shoal-callers.XXXXXX)
[[ -x $SHOAL ]] || { echo "build first: cargo build -p shoal-cli" >&2; exit 1; }
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill -TERM "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  [[ ${KEEP:-0} == 1 ]] || rm -rf "$DIR"
}
trap cleanup EXIT
cd "$DIR"
"$SHOAL" certs ca --region dev --out . >/dev/null

conf() { # name ip extra
  local name=$1 ip=$2 extra=$3 seeds auth
  "$SHOAL" certs node --node-id "$name" --region dev --out . >/dev/null
  if [[ $name == node-1 ]]; then seeds=""; auth="dev = true"; else seeds="\"127.0.0.1:17946\""; auth="addresses = [\"127.0.0.1:17946\"]"; fi
  cat > "$name.toml" <<CONF
node_id = "$name"
region = "dev"
zone = "zone-1"
data_dir = "data-$name"
listen = "$ip:17946"
socket = "$DIR/$name.sock"
seeds = [$seeds]
$extra

[membership]
probe_period_ms = 200
probe_rtt_ms = 80
suspect_to_down_after_ms = 600
periodic_gossip_ms = 100
join_retry_ms = 200
anti_entropy_interval_ms = 500

[tls]
ca = "dev-ca.pem"
cert = "dev-node-$name.pem"
key = "dev-node-$name-key.pem"

[trust]
dev_authority = true

[authority]
$auth

[access]
dev_allow_all = true

[consul]
listen = "$ip:18500"

[dns]
listen = "$ip:18600"
CONF
}
start() { # name
  "$SHOAL" agent --config "$1.toml" >>"$1.log" 2>&1 </dev/null &
  pids+=($!)
  echo $! > "$1.pid"
}
wait_for() { # what cmd... (bounded poll of a condition, 30 s)
  local what=$1; shift
  for _ in $(seq 1 300); do "$@" >/dev/null 2>&1 && return 0; sleep 0.1; done
  echo "timed out waiting for $what" >&2; tail -20 "$DIR"/*.log >&2; exit 1
}
expect() { # what got want
  [[ $2 == "$3" ]] || { echo "$1: got '$2', want '$3'" >&2; exit 1; }
  echo "ok: $1 ($2)"
}
conf node-1 127.0.0.1 'metrics = "127.0.0.1:19464"'
conf node-2 127.0.0.2 ''
# Bounded blocking on node-2, whose API schemathesis fuzzes (a fuzzed index must not hold a
# request for the default 5 minutes).
printf '\n[api]\nmax_wait_ms = 1000\n' >> node-2.toml
start node-1
start node-2
wait_for "node-2 active" bash -c "curl -sf --unix-socket $DIR/node-2.sock http://a/v1/agent/self | jq -e '.active and .node_key_bound'"
wait_for "node-1 consul port" curl -sf http://127.0.0.1:18500/v1/agent/self

# required_agent_metrics FILE SCOPES: every agent metric of required_metrics.txt whose scope is
# in SCOPES has HELP, TYPE and at least one series in FILE.
required_metrics() { # file process scopes-regex
  local n=0 m
  while read -r m; do
    grep -q "^# HELP $m " "$1" && grep -q "^# TYPE $m " "$1" && grep -qE "^$m(_bucket|_sum|_count)?(\{| )" "$1" \
      || { echo "required metric $m missing from the $2 scrape (HELP, TYPE or series)" >&2; exit 1; }
    n=$((n + 1))
  done < <(awk -v p="$2" -v s="$3" '$1 == p && $3 ~ s { print $2 }' "$ROOT/tests/callers/required_metrics.txt")
  echo "ok: $n required $2 metrics ($3) in the scrape"
}
echo "--- the first scrape of node-1 (no service registered yet)"
curl -sf http://127.0.0.1:19464/metrics > first-metrics.txt
promtool check metrics < first-metrics.txt
required_metrics first-metrics.txt agent '^always$'

echo "--- py-consul against node-1's Consul port ($DRAINS drains)"
t=$(date +%s%N)
python3 "$ROOT/tests/callers/consul_check.py" 127.0.0.1:18500 "$DIR/node-2.sock" "$DRAINS"
echo "py-consul checks took $(( ($(date +%s%N) - t) / 1000000 )) ms"

echo "--- Consul filter expressions on node-1's Consul port"
F() { # route filter -> "status count-or-body"
  local out code
  out=$(curl -s -G -w '\n%{http_code}' "http://127.0.0.1:18500$1" --data-urlencode "filter=$2")
  code=${out##*$'\n'}; out=${out%$'\n'*}
  if [[ $code == 200 ]]; then echo "200 $(jq -c 'if type == "array" then [.[] | (.Service.ID // .ServiceID)] else keys end' <<<"$out")"; else echo "$code $out"; fi
}
expect "filter: Service.Tags contains" "$(F /v1/health/service/web.http.prod 'Service.Tags contains "zone=zone-2"')" '200 ["web-2"]'
expect "filter: not / or / ==" "$(F /v1/health/service/web.http.prod 'not (Service.ID == "web-2" or Service.Port == 1)')" '200 ["web-1"]'
expect "filter: \"x\" in ServiceTags on the catalog" "$(F /v1/catalog/service/web.http.prod '"zone=zone-2" in ServiceTags and ServiceID != "web-1"')" '200 ["web-2"]'
expect "filter: catalog/services lists the services with a passing instance" "$(F /v1/catalog/services 'ServiceName == "db.http.prod"')" '200 ["db.http.prod"]'
expect "filter: a bad expression is Consul's 400" "$(F /v1/health/service/web.http.prod 'Service.Tags contains' | cut -c1-50)" "400 Failed to create boolean expression evaluator:"
expect "filter: an unknown selector is a 400" "$(F /v1/health/service/web.http.prod 'Service.Nope == "x"')" '400 Failed to create boolean expression evaluator: Selector "Service.Nope" is not valid'

echo "--- dig against node-1's DNS (127.0.0.1:18600)"
D() { dig @127.0.0.1 -p 18600 +norec +time=2 +tries=1 "$@"; }
status() { D "$@" +noall +comments | sed -n 's/.*status: \([A-Z]*\).*/\1/p'; }
# After the py-consul checks: web-1 DRAINING (never answered), web-2 READY in zone-2, db-1 READY.
expect "dig: SRV web: only the routable web-2, priority 1 (other zone), weight, port" \
  "$(D web.http.prod.service.shoal SRV +short)" "1 100 18082 7f000001.addr.shoal."
expect "SRV target resolves in the additional section" \
  "$(D web.http.prod.service.shoal SRV +noall +additional | awk '{print $1, $4, $5}')" "7f000001.addr.shoal. A 127.0.0.1"
expect "A web" "$(D web.http.prod.service.shoal A +short)" "127.0.0.1"
expect "A of an addr name" "$(D 7f000001.addr.shoal A +short)" "127.0.0.1"
expect "AAAA web: NODATA" "$(status web.http.prod.service.shoal AAAA)/$(D web.http.prod.service.shoal AAAA +short | wc -l)" "NOERROR/0"
expect "NODATA carries the SOA" "$(D web.http.prod.service.shoal AAAA +noall +authority | awk '{print $4}')" "SOA"
expect "unknown service: NXDOMAIN" "$(status nope.http.prod.service.shoal SRV)" "NXDOMAIN"
expect "bad shape: NXDOMAIN" "$(status web.prod.service.shoal SRV)" "NXDOMAIN"
expect "foreign name: REFUSED" "$(status example.com A)" "REFUSED"
expect "case-insensitive" "$(D WEB.HTTP.PROD.service.SHOAL SRV +short | wc -l)" "1"
expect "TTL 0 (default)" "$(D web.http.prod.service.shoal SRV +noall +answer | awk '{print $2}')" "0"
curl -sf --unix-socket "$DIR/node-2.sock" -X POST http://a/v1/services/prod/web/http/instances/web-2/drain >/dev/null
wait_for "web-2 drained on node-1" bash -c "[[ \$(dig @127.0.0.1 -p 18600 +norec +short web.http.prod.service.shoal SRV | wc -l) == 0 ]]"
expect "all drained: NODATA, not NXDOMAIN" "$(status web.http.prod.service.shoal SRV)" "NOERROR"
for i in $(seq 1 40); do
  curl -sf --unix-socket "$DIR/node-2.sock" -X POST http://a/v1/services/prod/big/http/register \
    -d "{\"instance\":\"big-$i\",\"address\":\"127.0.1.$i:9000\"}" >/dev/null
  curl -sf --unix-socket "$DIR/node-2.sock" -X POST "http://a/v1/services/prod/big/http/instances/big-$i/ready" >/dev/null
done
wait_for "40 big endpoints on node-1" bash -c "[[ \$(dig @127.0.0.1 -p 18600 +norec +tcp +short big.http.prod.service.shoal SRV | wc -l) == 40 ]]"
expect "UDP, EDNS 512: truncated" "$(D big.http.prod.service.shoal SRV +bufsize=512 +ignore +noall +comments | grep -c 'flags:.* tc')" "1"
expect "UDP, EDNS 4096: still truncated" "$(D big.http.prod.service.shoal SRV +bufsize=4096 +ignore +noall +comments | grep -c 'flags:.* tc')" "1"
expect "UDP, EDNS 4096: answer within 1232 bytes" "$(( $(D big.http.prod.service.shoal SRV +bufsize=4096 +ignore | sed -n 's/.*MSG SIZE  rcvd: \([0-9]*\).*/\1/p') <= 1232 ))" "1"
expect "UDP, no EDNS: truncated at 512 bytes" "$(D big.http.prod.service.shoal SRV +noedns +ignore +noall +comments | grep -c 'flags:.* tc')" "1"
expect "UDP, no EDNS: answer within 512 bytes" "$(( $(D big.http.prod.service.shoal SRV +noedns +ignore | sed -n 's/.*MSG SIZE  rcvd: \([0-9]*\).*/\1/p') <= 512 ))" "1"
expect "TCP: all 40, not truncated" "$(D big.http.prod.service.shoal SRV +tcp +short | wc -l)" "40"
expect "dig falls back to TCP on TC" "$(D big.http.prod.service.shoal SRV +bufsize=512 +short | wc -l)" "40"
echo "dig: all checks passed"

echo "--- promtool check metrics on node-1's first scrape after the checks"
curl -sf http://127.0.0.1:19464/metrics > metrics.txt
promtool check metrics < metrics.txt
required_metrics metrics.txt agent '^(always|per_service)$'
for m in shoal_build_info process_resident_memory_bytes; do
  grep -q "^# TYPE $m " metrics.txt || { echo "metric $m missing from the scrape" >&2; exit 1; }
done
grep -q '^shoal_no_backend_total{service="prod/big/http"} ' metrics.txt \
  || { echo "no-backend results are not labelled by service" >&2; exit 1; }
echo "promtool: ok; every required metric present ($(grep -c '^# TYPE' metrics.txt) metric families)"

echo "--- a real Prometheus server scraping node-1 (what it ingests, and a drain seen through PromQL)"
# Debian's prometheus (2.42, the only build CI can install) is built without consul_sd_configs
# ("field consul_sd_configs not found"), so discovery through the Consul port is checked by
# py-consul above, route by route; here Prometheus itself scrapes the agent, and must hold every
# required metric's HELP/TYPE (target metadata) and see a drain in shoal_ready_endpoints.
cat > prometheus.yml <<PROM
global:
  scrape_interval: 1s
  scrape_timeout: 1s
scrape_configs:
  - job_name: shoal-agent
    static_configs:
      - targets: ["127.0.0.1:19464"]
PROM
promtool check config prometheus.yml >/dev/null
t_prom=$(date +%s%N)
prometheus --config.file=prometheus.yml --storage.tsdb.path=prom-data --web.listen-address=127.0.0.1:19090 \
  --log.level=warn >>prometheus.log 2>&1 </dev/null &
pids+=($!)
P=http://127.0.0.1:19090/api/v1
q() { curl -sf "$P/query" --data-urlencode "query=$1" | jq -r '.data.result[0].value[1] // "none"'; }
wait_for "Prometheus scraped node-1" bash -c "curl -sf '$P/query?query=up' | jq -e '.data.result[0].value[1] == \"1\"'"
# Bounded polls, not single reads: a freshly started Prometheus answered an instant query
# with no sample once right after its first scrape.
wait_for "Prometheus: shoal_build_info via PromQL" bash -c "curl -sf '$P/query?query=shoal_build_info' | jq -e '.data.result[0].value[1] == \"1\"'"
# One bounded poll that both fetches and checks: a single later read failed once in CI
# (curl exit 22 right after the poll had succeeded).
wait_for "Prometheus holds target metadata" bash -c "curl -sfG '$P/targets/metadata' --data-urlencode 'match_target={job=\"shoal-agent\"}' > prom-metadata.json && jq -e '.data | length > 20' prom-metadata.json"
n=0
while read -r m; do
  [[ $(jq -r --arg m "$m" '[.data[] | select(.metric == $m and .type != "unknown" and .help != "")] | length' prom-metadata.json) == 1 ]] \
    || { echo "Prometheus holds no HELP/TYPE for required metric $m" >&2; exit 1; }
  n=$((n + 1))
done < <(awk '$1 == "agent" { print $2 }' "$ROOT/tests/callers/required_metrics.txt")
echo "ok: Prometheus ingested HELP and TYPE of all $n required agent metrics"
wait_for "Prometheus sees 40 READY big endpoints" bash -c "[[ \$(curl -sf '$P/query' --data-urlencode 'query=shoal_ready_endpoints{service=\"prod/big/http\"}' | jq -r '.data.result[0].value[1]') == 40 ]]"
curl -sf --unix-socket "$DIR/node-2.sock" -X POST http://a/v1/services/prod/big/http/instances/big-7/drain >/dev/null
t_drain=$(date +%s%N)
wait_for "Prometheus sees the drain (39 READY)" bash -c "[[ \$(curl -sf '$P/query' --data-urlencode 'query=shoal_ready_endpoints{service=\"prod/big/http\"}' | jq -r '.data.result[0].value[1]') == 39 ]]"
echo "ok: Prometheus saw the drain $(( ($(date +%s%N) - t_drain) / 1000000 )) ms after the drain request (1 s scrapes)"
expect "Prometheus: lifecycle transitions to DRAINING counted" \
  "$(q 'shoal_lifecycle_transitions_total{to="DRAINING"} > bool 0')" "1"
echo "prometheus: all checks passed in $(( ($(date +%s%N) - t_prom) / 1000000 )) ms"

echo "--- shoal watch across an agent restart"
"$SHOAL" --socket "$DIR/node-2.sock" watch prod/web/http --wait 5 --json > watch.out 2> watch.err &
wpid=$!
pids+=($wpid)
wait_for "first watch line" test -s watch.out
old=$(cat node-2.pid)
kill -TERM "$old"; wait "$old" 2>/dev/null || true
# As a supervisor does: the new process starts once the old one has exited (it may still be
# leaving the mesh and persisting after SIGTERM).
wait_for "the stopped node-2 to exit" bash -c "! kill -0 $old"
start node-2
wait_for "node-2 back" bash -c "curl -sf --unix-socket $DIR/node-2.sock http://a/v1/agent/self | jq -e .active"
"$SHOAL" --socket "$DIR/node-2.sock" ready prod/web/http web-1 >/dev/null \
  || { echo "ready after the restart failed; node-2's log:" >&2; tail -40 node-2.log >&2; exit 1; }
wait_for "watch printed the READY" bash -c "tail -1 watch.out | jq -e '.endpoints[] | select(.instance==\"web-1\" and .state==\"READY\")'"
kill -0 "$wpid" || { echo "shoal watch exited across the restart" >&2; cat watch.err >&2; exit 1; }
lines=$(wc -l < watch.out)
dups=$(jq -c '[.endpoints[] | del(.applied_at_ms)]' watch.out | uniq -d | wc -l)
[[ $dups == 0 ]] || { echo "shoal watch printed the same endpoints twice in a row" >&2; exit 1; }
grep -q "agent back" watch.err || { echo "shoal watch did not report the reconnect" >&2; cat watch.err >&2; exit 1; }
echo "shoal watch: survived the restart, $lines tables printed, no repeats"
kill -TERM "$wpid" 2>/dev/null || true

echo "--- schemathesis (bounded) against node-2's unix socket, via a TCP relay"
# Every answer must be a documented status with a body matching its schema. 5xx answers are
# allowed only where documented (503 "no backend" from pick, 503 degraded from
# /v1/agent/health, 503 authority unavailable on writes); an undocumented 500 fails
# status_code_conformance. Writes are fuzzed too (the agent runs dev_allow_all).
python3 "$ROOT/tests/callers/unix_relay.py" "$DIR/node-2.sock" 127.0.0.1 18080 &
pids+=($!)
wait_for "relay" curl -sf http://127.0.0.1:18080/v1/agent/self
schemathesis run "$ROOT/docs/api/openapi.json" --url http://127.0.0.1:18080 \
  --checks status_code_conformance,content_type_conformance,response_schema_conformance \
  --max-examples "${SCHEMATHESIS_EXAMPLES:-25}" --phases examples,fuzzing \
  --request-timeout 10 --seed 1
echo "callers: all checks passed"
