#!/usr/bin/env bash
# The fault test of the containerised cluster: real container faults under steady traffic, in
# region r1 (r2.. run untouched as controls), with a traffic timeline and checks.
#
#   deploy/compose/fault-test.sh           start a cluster (cluster.sh up), run, report, tear down
#   SHORT=1 deploy/compose/fault-test.sh   CI: shorter waits (same faults)
#   KEEP=1 ...                             leave the cluster running afterwards
#
# Faults, in order (node = an agent container with the backend containers attached to it):
#   drain           docker stop r1-web1 (SIGTERM: the backend drains, serves GRACE, deregisters);
#                   then docker start (it registers again)
#   partition       docker network disconnect of node r1-a<AGENTS> (agent + its backends) for
#                   PARTITION_S, then reconnect with the same addresses
#   stall           docker pause r1-a2 (the agent only; its backends keep serving) for STALL_S
#   node loss       docker kill of node r1-a<AGENTS> (agent + backends); KILL_WAIT_S later started again
#   agent roll      docker restart, one at a time, of every r1 agent except a1 (a1 is the
#                   client's own agent: an app whose local agent restarts sees its socket go)
#   authority roll  docker restart, one at a time, of every r1 authority replica, each back in
#                   the Raft group before the next; then a drain + re-register (a write) to prove
#                   the region accepts writes
# Checks (exit 1 if one fails):
#   - drain, stall, agent roll, authority roll, partition heal: zero failed requests
#   - partition, node loss: no failed request to a lost backend later than KILL_SLO_MS (15 s,
#     the hard-failure SLO) after the fault; nothing else fails
#   - control regions: zero failed requests over the whole run
#   - after each fault the region recovers: every backend READY and routable at r1-a1 again
# Output in RUN_DIR: events.jsonl (fault timeline), timeline/*.jsonl (every request),
# report.json and report.md (per phase: requests, ok, failures by cause, recovery time).
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
export RUN_DIR=${RUN_DIR:-/tmp/shoal-compose}
export PROJECT=${PROJECT:-shoal}
export AGENTS=${AGENTS:-3} BACKENDS=${BACKENDS:-4} AUTHORITIES=${AUTHORITIES:-3}
if [[ ${SHORT:-0} == 1 ]]; then
  d_steady=5 d_partition=8 d_stall=5 d_kill=8
else
  d_steady=15 d_partition=25 d_stall=10 d_kill=20
fi
STEADY_S=${STEADY_S:-$d_steady}
PARTITION_S=${PARTITION_S:-$d_partition}
STALL_S=${STALL_S:-$d_stall}
KILL_WAIT_S=${KILL_WAIT_S:-$d_kill}
KILL_SLO_MS=${KILL_SLO_MS:-15000}
RECOVER_TIMEOUT_S=${RECOVER_TIMEOUT_S:-90}
SUBNET=${SUBNET:-10.231}
CLUSTER=$ROOT/deploy/compose/cluster.sh
EV=$RUN_DIR/events.jsonl
A1_SOCK() { echo "$RUN_DIR/r1/sock/r1-a1/agent.sock"; }
c() { echo "$PROJECT-$1"; }

now() { date +%s%3N; }
event() { printf '{"t_ms":%s,"kind":"%s"%s}\n' "$(now)" "$1" "${2:-}" >> "$EV"; echo "[$(date -u +%T)] $1 ${2:-}"; }
phase() { event phase ",\"name\":\"$1\""; }

cleanup() {
  set +e
  if [[ ${KEEP:-0} != 1 ]]; then "$CLUSTER" down >/dev/null 2>&1; fi
}
trap cleanup EXIT
trap 'exit 130' INT TERM

"$CLUSTER" up
: > "$EV"

node_backends() { awk -F'\t' -v n="$1" '$3 == n {print $2}' "$RUN_DIR/backends.tsv"; }
routable_at_a1() {
  curl -sf --max-time 2 --unix-socket "$(A1_SOCK)" http://agent/v1/services/prod/web/http/endpoints 2>/dev/null \
    | jq '[.endpoints[] | select(.routable == true)] | length' 2>/dev/null || echo 0
}
# Waits (bounded) until every r1 backend is routable at r1-a1; records the recovery time.
wait_recovered() { # label t0_ms
  local deadline=$((SECONDS + RECOVER_TIMEOUT_S))
  until [[ $(routable_at_a1) == "$BACKENDS" ]]; do
    (( SECONDS < deadline )) || { event not_recovered ",\"after\":\"$1\""; echo "r1 did not recover after $1" >&2; exit 1; }
    sleep 0.2
  done
  event recovered ",\"after\":\"$1\",\"recovery_ms\":$(( $(now) - $2 ))"
}
wait_agent_ready() { # node
  local sock=$RUN_DIR/r1/sock/$1/agent.sock deadline=$((SECONDS + RECOVER_TIMEOUT_S))
  until curl -sf --max-time 2 --unix-socket "$sock" http://agent/v1/agent/ready >/dev/null 2>&1; do
    (( SECONDS < deadline )) || { echo "$1 not ready again" >&2; docker logs --tail 30 "$(c "$1")" >&2; exit 1; }
    sleep 0.2
  done
}
# Waits until replica i answers `status` with a leader (run inside its own container).
wait_authority() { # i
  local name=r1-auth$1 ip=$SUBNET.1.$((100 + $1)) deadline=$((SECONDS + RECOVER_TIMEOUT_S))
  until docker exec "$(c "$name")" shoal authority status --addr "$ip:7100" --ca /etc/shoal/r1-ca.pem \
      --cert "/etc/shoal/r1-node-$name.pem" --key "/etc/shoal/r1-node-$name-key.pem" 2>/dev/null \
      | jq -e '.leader != null' >/dev/null 2>&1; do
    (( SECONDS < deadline )) || { echo "$name has no leader again" >&2; docker logs --tail 30 "$(c "$name")" >&2; exit 1; }
    sleep 0.3
  done
}

victim=r1-a$AGENTS
mapfile -t victim_backends < <(node_backends "$victim")
victim_json=$(printf '%s\n' "${victim_backends[@]}" | jq -R . | jq -sc .)
net_of() { echo "$PROJECT-r1"; }

phase steady
sleep "$STEADY_S"

phase drain
t0=$(now)
docker stop -t 20 "$(c r1-web1)" >/dev/null
event drained ",\"instance\":\"r1-web1\",\"stop_ms\":$(( $(now) - t0 ))"
docker start "$(c r1-web1)" >/dev/null
wait_recovered drain "$t0"

phase partition
t0=$(now)
# The event first: the SLO clock starts before the fault, never after it.
event partitioned ",\"node\":\"$victim\",\"backends\":$victim_json"
for n in "$victim" "${victim_backends[@]}"; do docker network disconnect -f "$(net_of)" "$(c "$n")"; done
sleep "$PARTITION_S"
phase partition_heal
t1=$(now)
docker network connect --ip "$SUBNET.1.$((10 + AGENTS))" "$(net_of)" "$(c "$victim")"
for b in "${victim_backends[@]}"; do
  k=${b#r1-web}; docker network connect --ip "$SUBNET.1.$((50 + k))" "$(net_of)" "$(c "$b")"
done
wait_recovered partition "$t1"

phase stall
t0=$(now)
docker pause "$(c r1-a2)" >/dev/null
event paused ",\"node\":\"r1-a2\""
sleep "$STALL_S"
docker unpause "$(c r1-a2)" >/dev/null
event unpaused ",\"node\":\"r1-a2\""
wait_recovered stall "$(now)"

phase node_loss
t0=$(now)
event killed ",\"node\":\"$victim\",\"backends\":$victim_json"
docker kill "$(c "$victim")" "${victim_backends[@]/#/$PROJECT-}" >/dev/null
sleep "$KILL_WAIT_S"
phase node_return
t1=$(now)
docker start "$(c "$victim")" >/dev/null
wait_agent_ready "$victim"
docker start "${victim_backends[@]/#/$PROJECT-}" >/dev/null
wait_recovered node_loss "$t1"

phase agent_roll
t0=$(now)
for j in $(seq 2 "$AGENTS"); do
  t0=$(now)
  docker restart -t 15 "$(c "r1-a$j")" >/dev/null
  wait_agent_ready "r1-a$j"
  event restarted ",\"node\":\"r1-a$j\""
  wait_recovered "restart r1-a$j" "$t0"
done

phase authority_roll
t0=$(now)
for i in $(seq 1 "$AUTHORITIES"); do
  docker restart -t 15 "$(c "r1-auth$i")" >/dev/null
  wait_authority "$i"
  event restarted ",\"node\":\"r1-auth$i\""
done
# A write after the roll: drain web1 (SIGTERM) and register it again.
docker stop -t 20 "$(c r1-web1)" >/dev/null
docker start "$(c r1-web1)" >/dev/null
wait_recovered authority_roll "$t0"
phase end
sleep 1

# Stop the clients (SIGTERM: they flush and exit), then summarise.
for r in $(seq 1 "${REGIONS:-3}"); do docker stop -t 10 "$(c "r$r-client")" >/dev/null 2>&1 || true; done
for r in $(seq 1 "${REGIONS:-3}"); do docker logs "$(c "r$r-client")" 2>&1 | tail -1; done
ROOT=$ROOT RUN_DIR=$RUN_DIR KILL_SLO_MS=$KILL_SLO_MS VICTIMS="$victim_json" \
  python3 "$ROOT/deploy/compose/fault_report.py"
