#!/usr/bin/env bash
# The main job on real processes: cluster -> backends -> steady traffic -> rolling replacement
# (2 at a time) -> drain one -> kill -9 one backend -> kill -9 one agent -> authorities stopped
# for OUTAGE_S -> restored; then `shoal-demo report` writes report.json, report.md and timeline.svg in the run
# dir and prints the summary (exit status 1 if a check fails). Throughout, `shoal-demo
# watch-applied` follows every agent with blocking queries and logs each agent's own
# `applied_at_ms` of every DRAINING record to applied.jsonl (the report's per-agent apply times).
#
#   deploy/local/scenario.sh                  full: 2 regions x (3 authorities + 8 agents), 40 backends
#   SHORT=1 deploy/local/scenario.sh          CI: 1 region x (3 + 4), 6 backends, short phases
#
# Environment (defaults full / SHORT): REGIONS 2/1, AUTHORITIES 3/3, AGENTS 8/4, BACKENDS 40/6,
# RATE per client 20/20, STEADY_S 20/5, GRACE_MS 3000/2000, KILL_WAIT_S 20/20, OUTAGE_S 120/10,
# RECOVER_S 20/5, RUN_DIR /tmp/shoal-scenario, SERVICE prod/web/http, SHOAL, SHOAL_DEMO.
# Clients run on agents a1 and a2 of every region; the victims are in region r1: agent
# r1-a<AGENTS> (kill -9) and backends on other agents.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
TARGET=${CARGO_TARGET_DIR:-$ROOT/target}
export SHOAL=${SHOAL:-$TARGET/release/shoal}
DEMO=${SHOAL_DEMO:-$TARGET/release/shoal-demo}
if [[ ${SHORT:-0} == 1 ]]; then
  d_regions=1 d_agents=4 d_backends=6 d_steady=5 d_grace=2000 d_outage=10 d_recover=5
else
  d_regions=2 d_agents=8 d_backends=40 d_steady=20 d_grace=3000 d_outage=120 d_recover=20
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
SERVICE=${SERVICE:-prod/web/http}
[[ -x $SHOAL && -x $DEMO ]] || { echo "build first: cargo build --release -p shoal-cli -p shoal-demo" >&2; exit 1; }
(( AGENTS >= 3 )) || { echo "AGENTS must be >= 3" >&2; exit 2; }

CLUSTER=$ROOT/deploy/local/cluster.sh
EV=$RUN_DIR/events.jsonl
declare -A BPID BNODE BSOCK BADDR
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
  "$DEMO" backend --agent-socket "$sock" --service "$SERVICE" --instance "$inst" --listen "$ip:$port" \
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
kill -KILL "${BPID[$kill_inst]}"; event kill_backend ",\"instance\":\"$kill_inst\",\"address\":\"${BADDR[$kill_inst]}\""
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
phase end

for p in "${CLIENT_PIDS[@]}"; do kill -TERM "$p" 2>/dev/null || true; done
for p in "${CLIENT_PIDS[@]}"; do wait "$p" 2>/dev/null || true; done
CLIENT_PIDS=()
kill -TERM "$WATCH_PID" 2>/dev/null || true
wait "$WATCH_PID" 2>/dev/null || true
WATCH_PID=
cat "$RUN_DIR"/client-*.log
"$DEMO" report --run-dir "$RUN_DIR"
