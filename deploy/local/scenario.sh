#!/usr/bin/env bash
# The main job on real processes: cluster -> backends -> steady traffic -> rolling replacement
# (2 at a time) -> drain one -> kill -9 one backend -> kill -9 one agent -> authorities stopped
# for OUTAGE_S -> restored -> failover: every endpoint of SERVICE in r1 drains and r1's clients
# move to r2 as the global policy says (read-only; write intent refused), a service without
# policy answers an explicit no backend, a capped one answers "failover capped" -> region
# isolation: r2's authorities stop (no quorum): r2 keeps serving reads and refuses writes, r1
# keeps r2's last summary unchanged with a growing age and keeps failing over to it, and after
# r2's authorities return the summary is fresh again; then `shoal-demo report` writes report.json, report.md and timeline.svg in the run
# dir and prints the summary (exit status 1 if a check fails). Throughout, `shoal-demo
# watch-applied` follows every agent with blocking queries and logs each agent's own
# `applied_at_ms` of every DRAINING record to applied.jsonl (the report's per-agent apply times).
#
#   deploy/local/scenario.sh                  full: 3 regions x (3 authorities + 8 agents), 40 backends
#   SHORT=1 deploy/local/scenario.sh          CI: 2 regions x (3 + 4), 6 backends, short phases
#
# Environment (defaults full / SHORT): REGIONS 3/2, AUTHORITIES 3/3, AGENTS 8/4, BACKENDS 40/6,
# RATE per client 20/20, STEADY_S 20/5, GRACE_MS 3000/2000, KILL_WAIT_S 20/20, OUTAGE_S 120/10,
# RECOVER_S 20/5, FAILOVER_S 20/5, RUN_DIR /tmp/shoal-scenario, NET_BASE 20, SERVICE prod/web/http, SHOAL, SHOAL_DEMO.
# Clients run on agents a1 and a2 of every region; the victims are in region r1: agent
# r1-a<AGENTS> (kill -9) and backends on other agents.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
TARGET=${CARGO_TARGET_DIR:-$ROOT/target}
export SHOAL=${SHOAL:-$TARGET/release/shoal}
DEMO=${SHOAL_DEMO:-$TARGET/release/shoal-demo}
if [[ ${SHORT:-0} == 1 ]]; then
  d_regions=2 d_agents=4 d_backends=6 d_steady=5 d_grace=2000 d_outage=10 d_recover=5 d_failover=5
else
  d_regions=3 d_agents=8 d_backends=40 d_steady=20 d_grace=3000 d_outage=120 d_recover=20 d_failover=20
fi
export REGIONS=${REGIONS:-$d_regions} AUTHORITIES=${AUTHORITIES:-3} AGENTS=${AGENTS:-$d_agents}
export RUN_DIR=${RUN_DIR:-/tmp/shoal-scenario}
BACKENDS=${BACKENDS:-$d_backends}
RATE=${RATE:-20}
STEADY_S=${STEADY_S:-$d_steady}
GRACE_MS=${GRACE_MS:-$d_grace}
KILL_WAIT_S=${KILL_WAIT_S:-20}
OUTAGE_S=${OUTAGE_S:-$d_outage}
RECOVER_S=${RECOVER_S:-$d_recover}
FAILOVER_S=${FAILOVER_S:-$d_failover}
SERVICE=${SERVICE:-prod/web/http}
[[ -x $SHOAL && -x $DEMO ]] || { echo "build first: cargo build --release -p shoal-cli -p shoal-demo" >&2; exit 1; }
(( AGENTS >= 3 )) || { echo "AGENTS must be >= 3" >&2; exit 2; }
(( REGIONS >= 2 )) || { echo "REGIONS must be >= 2 (the failover phase moves r1's clients to r2)" >&2; exit 2; }

CLUSTER=$ROOT/deploy/local/cluster.sh
EV=$RUN_DIR/events.jsonl
declare -A BPID BNODE BSOCK BADDR BSVC
CLIENT_PIDS=()
WATCH_PID=

now() { date +%s%3N; }
event() { printf '{"t_ms":%s,"kind":"%s"%s}\n' "$(now)" "$1" "${2:-}" >> "$EV"; echo "[$(date +%T)] $1 ${2:-}"; }
phase() { event phase ",\"name\":\"$1\""; }

cleanup() {
  set +e
  [[ -n $WATCH_PID ]] && kill -TERM "$WATCH_PID" 2>/dev/null
  for p in "${CLIENT_PIDS[@]}"; do kill -TERM "$p" 2>/dev/null; done
  for i in "${!BPID[@]}"; do kill -INT "${BPID[$i]}" 2>/dev/null; done
  sleep 1
  "$CLUSTER" stop >/dev/null
}
trap cleanup EXIT
trap 'exit 130' INT TERM

"$CLUSTER" start
mkdir -p "$RUN_DIR/timeline" "$RUN_DIR/backends"
: > "$EV"
: > "$RUN_DIR/applied.jsonl"
"$DEMO" watch-applied --agents "$RUN_DIR/agents.tsv" --service "$SERVICE" --state DRAINING \
  --out "$RUN_DIR/applied.jsonl" 2>"$RUN_DIR/watch-applied.log" &
WATCH_PID=$!

agent_field() { # region j field(1=node 2=ip 3=socket)
  local line; line=$(awk -F'\t' -v n="r$1-a$2" '$2==n {print $2"\t"$3"\t"$4}' "$RUN_DIR/agents.tsv")
  cut -f"$3" <<<"$line"
}

start_backend() { # instance region j port
  local inst=$1 r=$2 j=$3 port=$4 node ip sock
  node=$(agent_field "$r" "$j" 1); ip=$(agent_field "$r" "$j" 2); sock=$(agent_field "$r" "$j" 3)
  "$DEMO" backend --agent-socket "$sock" --service "${BSVC[$inst]:-$SERVICE}" --instance "$inst" --listen "$ip:$port" \
    --grace-ms "$GRACE_MS" --events "$EV" >"$RUN_DIR/backends/$inst.log" 2>&1 &
  BPID[$inst]=$!; BNODE[$inst]=$node; BSOCK[$inst]=$sock; BADDR[$inst]=$ip:$port
  event backend_start ",\"instance\":\"$inst\",\"node\":\"$node\",\"address\":\"$ip:$port\""
}

wait_ready() { # instances...
  local deadline=$((SECONDS + 90)) i
  for i in "$@"; do
    until grep '"kind":"ready"' "$EV" | grep -q "\"instance\":\"$i\""; do
      (( SECONDS < deadline )) || { echo "backend $i not READY after 90 s (see $RUN_DIR/backends/$i.log)" >&2; exit 1; }
      kill -0 "${BPID[$i]}" 2>/dev/null || { echo "backend $i died (see $RUN_DIR/backends/$i.log)" >&2; exit 1; }
      sleep 0.2
    done
  done
}

# Backend i lives in region (i % REGIONS)+1 on agent ((i / REGIONS) % AGENTS)+1.
declare -A BREG BAG
GEN1=()
for i in $(seq 0 $((BACKENDS - 1))); do
  r=$(( i % REGIONS + 1 )); j=$(( (i / REGIONS) % AGENTS + 1 ))
  inst=web-$i-g1; BREG[$inst]=$r; BAG[$inst]=$j
  start_backend "$inst" "$r" "$j" $((20000 + i))
  GEN1+=("$inst")
done
wait_ready "${GEN1[@]}"
echo "$BACKENDS backends READY"

for r in $(seq 1 "$REGIONS"); do
  for j in 1 2; do
    node=$(agent_field "$r" "$j" 1); sock=$(agent_field "$r" "$j" 3)
    "$DEMO" client --agent-socket "$sock" --service "$SERVICE" --rate "$RATE" --duration-s 86400 \
      --out "$RUN_DIR/timeline/$node.jsonl" --label "$node" 2>"$RUN_DIR/client-$node.log" &
    CLIENT_PIDS+=($!)
  done
done
phase steady_start
sleep "$STEADY_S"

phase roll_start
GEN2=()
for ((k = 0; k < ${#GEN1[@]}; k += 2)); do
  batch=("${GEN1[@]:k:2}"); new=()
  for old in "${batch[@]}"; do
    i=${old#web-}; i=${i%-g1}
    inst=web-$i-g2; BREG[$inst]=${BREG[$old]}; BAG[$inst]=${BAG[$old]}
    start_backend "$inst" "${BREG[$old]}" "${BAG[$old]}" $((21000 + i))
    new+=("$inst"); GEN2+=("$inst")
  done
  wait_ready "${new[@]}"
  for old in "${batch[@]}"; do kill -TERM "${BPID[$old]}"; done
  for old in "${batch[@]}"; do
    for _ in $(seq 1 $(( (GRACE_MS / 1000 + 20) * 10 ))); do kill -0 "${BPID[$old]}" 2>/dev/null || break; sleep 0.1; done
    unset "BPID[$old]"
  done
done
phase roll_end
sleep 3

# Victims in region r1: the agent r1-a<AGENTS>, a drained and a killed backend elsewhere.
victim_agent=r1-a$AGENTS
pick_r1() { local i; for i in "${GEN2[@]}"; do
  [[ ${BREG[$i]} == 1 && ${BNODE[$i]} != "$victim_agent" && $i != "${1:-}" && -n ${BPID[$i]:-} ]] && { echo "$i"; return; }
done; }
drain_inst=$(pick_r1)
t0=$(now)
out=$(curl -s --max-time 20 --unix-socket "${BSOCK[$drain_inst]}" -X POST "http://agent/v1/services/$SERVICE/instances/$drain_inst/drain")
rev=$(jq -r '.revision // "null"' <<<"$out" 2>/dev/null || echo null)
printf '{"t_ms":%s,"t_ack_ms":%s,"kind":"drain","instance":"%s","revision":%s,"by":"scenario"}\n' "$t0" "$(now)" "$drain_inst" "$rev" >> "$EV"
echo "[$(date +%T)] drain $drain_inst: $out"
sleep 8

kill_inst=$(pick_r1 "$drain_inst")
# Reap the killed backend inside the redirect: otherwise bash reports the deliberate kill as
# `line N: PID Killed "$DEMO" backend ...` on stderr. A failed kill still stops the script.
{ kill -KILL "${BPID[$kill_inst]}" && { wait "${BPID[$kill_inst]}" || true; }; } 2>/dev/null
event kill_backend ",\"instance\":\"$kill_inst\",\"address\":\"${BADDR[$kill_inst]}\""
unset "BPID[$kill_inst]"
sleep "$KILL_WAIT_S"

kill -KILL "$(cat "$RUN_DIR/pids/$victim_agent.pid")"; rm -f "$RUN_DIR/pids/$victim_agent.pid"
event kill_agent ",\"node\":\"$victim_agent\""
sleep "$KILL_WAIT_S"

phase authority_stop
for p in "$RUN_DIR"/pids/*-auth*.pid; do kill -TERM "$(cat "$p")"; done
sleep "$OUTAGE_S"
phase authority_start
for p in "$RUN_DIR"/pids/*-auth*.pid; do
  name=$(basename "$p" .pid); region=${name%%-*}
  env RUST_LOG=info,openraft=warn "$SHOAL" authority run --config "$RUN_DIR/$region/$name.toml" \
    >>"$RUN_DIR/$region/$name.log" 2>&1 </dev/null &
  echo $! > "$p"
done
sleep "$RECOVER_S"

# ---- failover (docs/adr/0013-global-policy-and-failover.md) ---------------------------------
FO=$RUN_DIR/failover.json
FO_FAIL=()
fo_check() { # name ok(0/1) detail-json
  local d; d=$(jq -c . <<<"${3:-null}" 2>/dev/null) || d=null; [[ -n $d ]] || d=null
  set -- "$1" "$2" "$d"
  event failover_check ",\"name\":\"$1\",\"ok\":$([[ $2 == 1 ]] && echo true || echo false),\"detail\":$3"
  [[ $2 == 1 ]] || FO_FAIL+=("$1")
}
sock_of() { agent_field "$1" "$2" 3; }
pick_json() { curl -s --max-time 3 --unix-socket "$1" "http://agent/v1/services/$2/pick${3:-}" || true; }
summary_of() { # socket region service -> the held summary JSON or null
  curl -s --max-time 3 --unix-socket "$1" http://agent/v1/failover |
    jq -c --arg r "$2" --arg s "$3" '[.summaries[] | select(.region == $r and .service == $s)][0]' || true
}
R1A1=$(sock_of 1 1); R2A1=$(sock_of 2 1)
# A service without policy and a capped one, both only in r2.
BSVC[nopolicy-0]=prod/nopolicy/http; start_backend nopolicy-0 2 1 22000
BSVC[capped-0]=prod/capped/http; start_backend capped-0 2 2 22001
wait_ready nopolicy-0 capped-0
# r1's agents must hold r2's summary of SERVICE before r1 runs dry (bounded wait).
for j in 1 2; do
  for _ in $(seq 1 60); do
    n=$(summary_of "$(sock_of 1 $j)" r2 "$SERVICE" | jq -r '.endpoints | length' 2>/dev/null || echo 0)
    [[ $n =~ ^[0-9]+$ ]] && (( n > 0 )) && break
    sleep 0.5
  done
done
phase failover_start
r1_live=()
for i in "${GEN2[@]}"; do
  # Not the instances of the agent killed earlier: its node is down, they are not routable.
  [[ ${BREG[$i]} == 1 && -n ${BPID[$i]:-} && $i != "$drain_inst" && ${BNODE[$i]} != "$victim_agent" ]] && r1_live+=("$i")
done
for i in "${r1_live[@]}"; do
  t0=$(now)
  out=$(curl -s --max-time 20 --unix-socket "${BSOCK[$i]}" -X POST "http://agent/v1/services/$SERVICE/instances/$i/drain" || true)
  rev=$(jq -r '.revision // "null"' <<<"$out" 2>/dev/null || echo null)
  [[ $rev =~ ^[0-9]+$ ]] || { FO_FAIL+=("drain of $i failed: $out"); rev=null; }
  printf '{"t_ms":%s,"t_ack_ms":%s,"kind":"drain","instance":"%s","revision":%s,"by":"failover"}\n' "$t0" "$(now)" "$i" "$rev" >> "$EV"
done
event failover_r1_drained ",\"instances\":$(printf '%s\n' "${r1_live[@]}" | jq -R . | jq -sc .)"
sleep "$FAILOVER_S"
p=$(pick_json "$R1A1" "$SERVICE")
fo_check "r1 pick of $SERVICE answered by failover:r2, read-only" \
  "$(jq -r 'if .tier == "failover:r2" and .read_only == true then 1 else 0 end' <<<"$p")" "$p"
p=$(pick_json "$R1A1" "$SERVICE" "?intent=write")
fo_check "r1 write-intent pick refused (read-only failover)" \
  "$(jq -r 'if .reason == "read_only" then 1 else 0 end' <<<"$p")" "$p"
p=$(pick_json "$R1A1" prod/nopolicy/http)
p2=$(pick_json "$R2A1" prod/nopolicy/http)
fo_check "service without policy: explicit no backend in r1 (while r2 serves it)" \
  "$(jq -rn --argjson a "$p" --argjson b "$p2" 'if $a.reason == "no_policy" and $a.error == "no backend" and ($b.tier == "zone" or $b.tier == "region") then 1 else 0 end')" "$p"
capped=0; served=0
for _ in $(seq 1 10); do
  case $(pick_json "$R1A1" prod/capped/http | jq -r '.error // .tier') in
    "no backend: failover capped") capped=$((capped + 1)) ;;
    failover:r2) served=$((served + 1)) ;;
  esac
done
fo_check "max_cross_region_rps=2: 10 picks in a burst, some served, the rest capped" \
  "$(( served >= 1 && served <= 6 && capped >= 4 ? 1 : 0 ))" "{\"served\":$served,\"capped\":$capped}"

# ---- region isolation: r2 loses its authorities -------------------------------------------
phase isolation_start
for p in "$RUN_DIR"/pids/r2-auth*.pid; do kill -TERM "$(cat "$p")"; done
# The cut is when the last r2 replica has exited: a replica shutting down after SIGTERM may
# still build and serve a summary for a few ms (seen in CI: one generated after the signal).
for _ in $(seq 1 100); do
  alive=0
  for p in "$RUN_DIR"/pids/r2-auth*.pid; do kill -0 "$(cat "$p")" 2>/dev/null && alive=1; done
  [[ $alive == 0 ]] && break
  sleep 0.1
done
t_cut=$(now)
sleep 3
# From here on nothing in r1 may refresh r2's summary: it may only age. (r1's replicas may
# still hand their agents a summary another r2 replica built just before the cut.)
before=$(summary_of "$R1A1" r2 "$SERVICE")
p=$(pick_json "$R2A1" "$SERVICE")
fo_check "r2 without quorum still serves reads" \
  "$(jq -r 'if .tier == "zone" or .tier == "region" then 1 else 0 end' <<<"$p")" "$p"
code=$(curl -s -o "$RUN_DIR/isolation-write.json" -w '%{http_code}' --max-time 30 --unix-socket "$R2A1" \
  -X POST -d '{"instance":"iso-1","address":"127.0.0.9:9"}' "http://agent/v1/services/$SERVICE/register" || true)
[[ $code =~ ^[0-9]+$ ]] || code=0
fo_check "r2 without quorum refuses writes" "$([[ $code == 503 ]] && echo 1 || echo 0)" "{\"http\":$code}"
after=$(summary_of "$R1A1" r2 "$SERVICE")
fo_check "r1 keeps r2's last summary: built before the cut, same revision and endpoints, older" \
  "$(jq -rn --argjson a "$before" --argjson b "$after" --argjson cut "$t_cut" 'if $a.revision == $b.revision and $a.endpoints == $b.endpoints and $b.generated_at_ms <= $cut and $b.age_ms >= 2500 then 1 else 0 end')" \
  "{\"before\":$before,\"after\":$after}"
p=$(pick_json "$R1A1" "$SERVICE")
fo_check "r1 still fails over to r2's last summary" \
  "$(jq -r 'if .tier == "failover:r2" and .endpoint.summary_age_ms >= 2500 then 1 else 0 end' <<<"$p")" "$p"
for p in "$RUN_DIR"/pids/r2-auth*.pid; do
  name=$(basename "$p" .pid)
  env RUST_LOG=info,openraft=warn "$SHOAL" authority run --config "$RUN_DIR/r2/$name.toml" \
    >>"$RUN_DIR/r2/$name.log" 2>&1 </dev/null &
  echo $! > "$p"
done
fresh=0
for _ in $(seq 1 60); do
  age=$(summary_of "$R1A1" r2 "$SERVICE" | jq -r '.age_ms // 1e9')
  [[ $age =~ ^[0-9]+$ ]] && (( age < 2000 )) && { fresh=1; break; }
  sleep 0.5
done
fo_check "after r2's authorities return, r1's summary of r2 is fresh again" "$fresh" "$(summary_of "$R1A1" r2 "$SERVICE")"
phase failover_end
jq -s '[.[] | select(.kind == "failover_check")]' "$EV" > "$FO"
phase end

for p in "${CLIENT_PIDS[@]}"; do kill -TERM "$p" 2>/dev/null || true; done
for p in "${CLIENT_PIDS[@]}"; do wait "$p" 2>/dev/null || true; done
CLIENT_PIDS=()
kill -TERM "$WATCH_PID" 2>/dev/null || true
wait "$WATCH_PID" 2>/dev/null || true
WATCH_PID=
cat "$RUN_DIR"/client-*.log
if (( ${#FO_FAIL[@]} > 0 )); then
  printf 'FAILOVER CHECK FAILED: %s\n' "${FO_FAIL[@]}" >&2
fi
jq -r '.[] | "failover check: \(if .ok then "ok  " else "FAIL" end) \(.name)"' "$FO"
"$DEMO" report --run-dir "$RUN_DIR"
(( ${#FO_FAIL[@]} == 0 ))
