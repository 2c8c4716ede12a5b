#!/usr/bin/env bash
# A local multi-region shoal cluster: REGIONS x (AUTHORITIES Raft replicas + AGENTS agents), every
# process on its own 127.0.x.y address, certificates from `shoal certs`, one region signing key
# per region (`shoal authority keygen`), logs / sockets / data under one run directory.
# One global policy key (`shoal policy keygen`) that every authority and agent trusts; each
# authority replica holds a `gateway-*` certificate from every other region's CA and pulls
# that region's failover summaries (docs/adr/0013-global-policy-and-failover.md). Once up, the
# global policy ($POLICY, or the default below) is signed and pushed to r1's authority only;
# the other regions' authorities pull it from there, and the script waits until every agent
# of every region holds it.
#
#   deploy/local/cluster.sh            start and stay in the foreground; Ctrl-C stops everything
#   deploy/local/cluster.sh start      start in the background and return once every agent is active
#   deploy/local/cluster.sh stop       stop a background cluster (SIGTERM, then SIGKILL after 10 s)
#   deploy/local/cluster.sh status     one line per process
#
# Environment: REGIONS (3), AUTHORITIES (3), AGENTS (8), RUN_DIR (/tmp/shoal-cluster),
# SHOAL (target/release/shoal, or $CARGO_TARGET_DIR/release/shoal), FAST_SWIM=1 (test-speed SWIM
# timings instead of the defaults), KEEP=1 (reuse an existing run dir instead of emptying it; start
# only ever empties a run dir it made itself, or an empty one),
# NET_BASE (20: region r lives on 127.0.(NET_BASE+r).*), PULL_MS (500: failover pulls), POLICY
# (a policy JSON for `shoal policy sign`; default: prod/web/http read-only failover to the other
# regions in order, prod/capped/http writable failover capped at 2 requests/s per agent;
# prod/nopolicy/http, like any unlisted service, has no policy).
#
# Addressing, region r (1-based): agents 127.0.(NET_BASE+r).1..AGENTS port 7946 (metrics :9464 on the
# same IP), authorities 127.0.(NET_BASE+r).101.. (rpc :7100, raft :7101, mesh :7102, metrics :9464). Region names r1, r2, ...
# Files: $RUN_DIR/<region>/{<node>.toml,<node>.log,<node>.sock,data-<node>/}, $RUN_DIR/pids/,
# $RUN_DIR/agents.tsv (region node ip socket), $RUN_DIR/policy.{key,json,signed}, and
# $RUN_DIR/operator/ (an operator certificate of r1 for `shoal policy push|show`).
#
# RUN_DIR holds every key and socket, so it must be yours alone (deploy/lib/owned-dir.sh): an
# existing RUN_DIR is refused, before anything in it is read, removed or signalled, unless it is
# a directory of the current user that group and others cannot enter, with nothing in it of
# another user, reached only through directories only root or you can change (or sticky, as
# /tmp) and symlinks of root's or yours; a missing one is created with mode 0700 in an existing
# parent. `stop` and `status` only count a pid
# file whose process is still `shoal ... --config RUN_DIR/...`, so a reused or planted pid is
# never signalled. The agents grant every right to the user who started the cluster (by uid);
# other users cannot reach the sockets (RUN_DIR is 0700); root is an admin of every agent. A
# start and a stop of one RUN_DIR never run at once (RUN_DIR/.lock): a second start is refused,
# and a stop during a start waits for it, then stops what it started.
set -euo pipefail
# Everything this script writes is private (keys, configs, logs): and owned_dir_check refuses a
# directory with group- or world-writable files, which a umask of 002 would make.
umask 077
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
TARGET=${CARGO_TARGET_DIR:-$ROOT/target}
SHOAL=${SHOAL:-$TARGET/release/shoal}
REGIONS=${REGIONS:-3}
NET_BASE=${NET_BASE:-20}
AUTHORITIES=${AUTHORITIES:-3}
AGENTS=${AGENTS:-8}
RUN_DIR=${RUN_DIR:-/tmp/shoal-cluster}
# Marks a run dir this script made (the only kind `start` empties).
MARKER=.shoal-cluster-run-dir
MODE=${1:-foreground}
# shellcheck source=deploy/lib/owned-dir.sh
source "$ROOT/deploy/lib/owned-dir.sh"

# ours PIDFILE: the pid in it if that process is still one this script started in RUN_DIR.
ours() {
  local p=$1 pid
  [[ -f $p ]] || return 1
  pid=$(cat "$p")
  [[ $pid =~ ^[0-9]+$ ]] || return 1
  { tr '\0' ' ' < "/proc/$pid/cmdline"; } 2>/dev/null | grep -qF -- "--config $RUN_DIR/" || return 1
  echo "$pid"
}

# lock_run_dir WAIT_S: holds RUN_DIR/.lock (fd 9) until this script exits, so a `start` and a
# `stop` never run at once: a stop during a start waits for it (up to WAIT_S) and then stops
# what it started, instead of finding no pid files yet and leaving the cluster to come up.
# Long-lived children do not inherit it (spawn closes fd 9).
lock_run_dir() {
  exec 9>>"$RUN_DIR/.lock"
  flock -w "$1" 9 || { echo "cluster.sh: refusing $RUN_DIR: another start or stop of it is still running" >&2; exit 1; }
}

stop_all() {
  local p pid pids=()
  for p in "$RUN_DIR"/pids/*.pid; do
    [[ -f $p ]] || continue
    if pid=$(ours "$p"); then pids+=("$pid"); fi
  done
  [[ ${#pids[@]} -gt 0 ]] || { rm -f "$RUN_DIR"/pids/*.pid; return 0; }
  kill -TERM "${pids[@]}" 2>/dev/null || true
  for _ in $(seq 1 100); do
    local alive=0
    for pid in "${pids[@]}"; do kill -0 "$pid" 2>/dev/null && alive=1; done
    [[ $alive == 0 ]] && break
    sleep 0.1
  done
  for pid in "${pids[@]}"; do kill -KILL "$pid" 2>/dev/null || true; done
  rm -f "$RUN_DIR"/pids/*.pid
  echo "cluster in $RUN_DIR stopped"
}

case $MODE in
  stop|status)
    [[ -e $RUN_DIR || -L $RUN_DIR ]] || { echo "no cluster in $RUN_DIR"; exit 0; }
    owned_dir_check "$RUN_DIR"
    RUN_DIR=$OWNED_DIR_REAL
    [[ $MODE == status ]] || lock_run_dir 300 ;;
  start|foreground) ;;
  *) echo "usage: $0 [start|stop|status]" >&2; exit 2 ;;
esac
case $MODE in
  stop) stop_all; exit 0 ;;
  status)
    for p in "$RUN_DIR"/pids/*.pid; do
      [[ -f $p ]] || continue
      n=$(basename "$p" .pid)
      if pid=$(ours "$p"); then echo "$n $pid up"; else echo "$n $(cat "$p") DOWN"; fi
    done
    exit 0 ;;
esac

[[ -x $SHOAL ]] || { echo "build first: cargo build --release -p shoal-cli (or set SHOAL=...)" >&2; exit 1; }
if [[ -e $RUN_DIR || -L $RUN_DIR ]]; then
  owned_dir_check "$RUN_DIR"
  RUN_DIR=$OWNED_DIR_REAL
  lock_run_dir 0
  for p in "$RUN_DIR"/pids/*.pid; do
    if pid=$(ours "$p"); then
      echo "a cluster runs in $RUN_DIR (pid $pid, $(basename "$p" .pid)); $0 stop first" >&2; exit 1
    fi
  done
  # Empty it, keeping the checked directory itself (removing and re-making the name would let
  # someone else's directory take it in between); but only a run dir this script made (its
  # marker, or the layout of one made before the marker) or an empty one: RUN_DIR=$HOME or a
  # project directory given by mistake must never be wiped.
  # KEEP=1 reuses such a directory as it is (and is refused for any other, which would get the
  # marker and be emptied by the next start). -xdev: never into a file system mounted inside.
  if [[ ! -f $RUN_DIR/$MARKER && ! ( -d $RUN_DIR/pids && -f $RUN_DIR/agents.tsv ) && -n $(ls -A -I .lock -- "$RUN_DIR") ]]; then
    echo "cluster.sh: refusing $RUN_DIR: it holds files this script did not make (no $MARKER); give a new or empty directory as RUN_DIR" >&2
    exit 1
  fi
  [[ ${KEEP:-0} == 1 ]] || find "$RUN_DIR" -xdev -mindepth 1 ! -path "$RUN_DIR/.lock" -delete
fi
owned_dir_make "$RUN_DIR"
RUN_DIR=$OWNED_DIR_REAL
{ : >&9; } 2>/dev/null || lock_run_dir 0
echo "made by deploy/local/cluster.sh: its next start empties this directory" > "$RUN_DIR/$MARKER"
mkdir -p "$RUN_DIR/pids"
if [[ $MODE == foreground ]]; then
  trap 'echo; stop_all; exit 0' INT TERM
fi
: > "$RUN_DIR/agents.tsv"

# Every region's CA and signing key first: authorities need the other regions' CAs (gateway
# certificates) and the global policy lists every region's key.
policy_pub=$("$SHOAL" policy keygen --out "$RUN_DIR/policy.key")
declare -A REGION_PUB
for r in $(seq 1 "$REGIONS"); do
  D=$RUN_DIR/r$r; mkdir -p "$D"
  "$SHOAL" certs ca --region "r$r" --out "$D" >/dev/null
  REGION_PUB[r$r]=$("$SHOAL" authority keygen --out "$D/region.key")
done

SWIM=""
if [[ ${FAST_SWIM:-0} == 1 ]]; then
  SWIM=$'probe_period_ms = 200\nprobe_rtt_ms = 80\nsuspect_to_down_after_ms = 600\nperiodic_gossip_ms = 100\njoin_retry_ms = 200\nanti_entropy_interval_ms = 500\n'
fi

spawn() { # name log cmd...
  local name=$1 log=$2; shift 2
  "$@" >>"$log" 2>&1 </dev/null 9>&- &
  echo $! > "$RUN_DIR/pids/$name.pid"
}

for r in $(seq 1 "$REGIONS"); do
  region=r$r; net=127.0.$((NET_BASE + r)); D=$RUN_DIR/$region
  pub=${REGION_PUB[$region]}
  agent_addrs=(); rpc_addrs=(); mesh_addrs=()
  for j in $(seq 1 "$AGENTS"); do agent_addrs+=("\"$net.$j:7946\""); done
  for i in $(seq 1 "$AUTHORITIES"); do
    rpc_addrs+=("\"$net.$((100 + i)):7100\""); mesh_addrs+=("\"$net.$((100 + i)):7102\"")
  done
  members=""
  for i in $(seq 1 "$AUTHORITIES"); do
    ip=$net.$((100 + i))
    members+=$'[[members]]\n'"id = $i"$'\n'"node = \"$region-auth$i\""$'\n'"raft_addr = \"$ip:7101\""$'\n'"rpc_addr = \"$ip:7100\""$'\n\n'
  done
  for i in $(seq 1 "$AUTHORITIES"); do
    name=$region-auth$i; ip=$net.$((100 + i))
    "$SHOAL" certs node --node-id "$name" --region "$region" --out "$D" >/dev/null
    remotes=""
    for o in $(seq 1 "$REGIONS"); do
      [[ $o == "$r" ]] && continue
      OD=$RUN_DIR/r$o; onet=127.0.$((NET_BASE + o)); gw=gateway-$name
      "$SHOAL" certs node --node-id "$gw" --region "r$o" --out "$OD" >/dev/null
      oaddrs=$(for k in $(seq 1 "$AUTHORITIES"); do printf '"%s:7100",' "$onet.$((100 + k))"; done)
      remotes+=$'[[failover.remote_regions]]\n'"region = \"r$o\""$'\n'"addresses = [${oaddrs%,}]"$'\n'
      remotes+="tls = { ca = \"$OD/r$o-ca.pem\", cert = \"$OD/r$o-node-$gw.pem\", key = \"$OD/r$o-node-$gw-key.pem\" }"$'\n'
      remotes+="listen = \"$ip:0\""$'\n\n'
    done
    cat > "$D/$name.toml" <<CONF
id = $i
region = "$region"
data_dir = "$D/data-$name"
tls = { ca = "$D/$region-ca.pem", cert = "$D/$region-node-$name.pem", key = "$D/$region-node-$name-key.pem" }
signing_key = "$D/region.key"
metrics_addr = "$ip:9464"
mesh_addr = "$ip:7102"
mesh_seeds = [$(IFS=,; echo "${agent_addrs[*]}")]

[mesh]
cluster_size = $((AGENTS + AUTHORITIES))
$SWIM
$members
[failover]
policy_keys = ["$policy_pub"]
pull_ms = ${PULL_MS:-500}

$remotes
CONF
    spawn "$name" "$D/$name.log" env RUST_LOG=info,openraft=warn "$SHOAL" authority run --config "$D/$name.toml"
  done
  for j in $(seq 1 "$AGENTS"); do
    name=$region-a$j; ip=$net.$j
    "$SHOAL" certs node --node-id "$name" --region "$region" --out "$D" >/dev/null
    seeds=$( (for s in "${agent_addrs[@]}" "${mesh_addrs[@]}"; do [[ $s == "\"$ip:7946\"" ]] || echo "$s"; done) | paste -sd, -)
    cat > "$D/$name.toml" <<CONF
node_id = "$name"
region = "$region"
zone = "$region-z$(( (j - 1) % 2 + 1 ))"
data_dir = "$D/data-$name"
listen = "$ip:7946"
socket = "$D/$name.sock"
metrics = "$ip:9464"
seeds = [$seeds]
cluster_size = $((AGENTS + AUTHORITIES))

[tls]
ca = "$D/$region-ca.pem"
cert = "$D/$region-node-$name.pem"
key = "$D/$region-node-$name-key.pem"

[trust]
authority_keys = ["$pub"]

[authority]
addresses = [$(IFS=,; echo "${rpc_addrs[*]}")]

[membership]
$SWIM

[access]
# The user who started the cluster may do everything; any other caller may only read.
[[access.grants]]
uids = [$(id -u)]
services = ["*"]
rights = ["admin"]

[failover]
policy_keys = ["$policy_pub"]
pull_ms = ${PULL_MS:-500}
CONF
    spawn "$name" "$D/$name.log" env SHOAL_LOG=info "$SHOAL" agent --config "$D/$name.toml"
    printf '%s\t%s\t%s\t%s\n' "$region" "$name" "$ip" "$D/$name.sock" >> "$RUN_DIR/agents.tsv"
  done
done

# Wait (bounded) until every agent answers and is active.
deadline=$((SECONDS + ${START_TIMEOUT_S:-90}))
while IFS=$'\t' read -r region name ip sock; do
  until curl -sf --max-time 2 --unix-socket "$sock" http://agent/v1/agent/self 2>/dev/null | grep -q '"active":true'; do
    if (( SECONDS > deadline )); then
      echo "agent $name not active after ${START_TIMEOUT_S:-90}s; see $RUN_DIR/$region/$name.log" >&2
      [[ $MODE == foreground ]] && stop_all
      exit 1
    fi
    sleep 0.5
  done
done < "$RUN_DIR/agents.tsv"
# The global policy: written once, signed with the policy key, pushed to r1's authority only.
if [[ -z ${POLICY:-} ]]; then
  POLICY=$RUN_DIR/policy.json
  targets=$(for o in $(seq 2 "$REGIONS") 1; do printf '"r%s",' "$o"; done)
  regions_json=$(for o in $(seq 1 "$REGIONS"); do printf '{"region":"r%s","authority_keys":["%s"]},' "$o" "${REGION_PUB[r$o]}"; done)
  cat > "$POLICY" <<JSON
{"version": 1,
 "regions": [${regions_json%,}],
 "services": [
  {"service": "prod/web/http", "allowed_failover_regions": [${targets%,}], "mode": "read_only",
   "max_cross_region_rps": 1000, "max_snapshot_age_s": 600, "on_stale": "degrade"},
  {"service": "prod/capped/http", "allowed_failover_regions": [${targets%,}], "mode": "writable",
   "max_cross_region_rps": 2, "max_snapshot_age_s": 600, "on_stale": "refuse"}
 ]}
JSON
fi
"$SHOAL" certs node --node-id operator-1 --region r1 --out "$RUN_DIR/r1" >/dev/null
mkdir -p "$RUN_DIR/operator"
cp "$RUN_DIR/r1/r1-ca.pem" "$RUN_DIR/r1/r1-node-operator-1.pem" "$RUN_DIR/r1/r1-node-operator-1-key.pem" "$RUN_DIR/operator/"
"$SHOAL" policy sign --key "$RUN_DIR/policy.key" --in "$POLICY" --out "$RUN_DIR/policy.signed" >/dev/null
want=$(jq -r .version "$POLICY")
pushed=0
for _ in $(seq 1 60); do
  if "$SHOAL" policy push "$RUN_DIR/policy.signed" --addr "127.0.$((NET_BASE + 1)).101:7100" \
      --ca "$RUN_DIR/operator/r1-ca.pem" --cert "$RUN_DIR/operator/r1-node-operator-1.pem" \
      --key "$RUN_DIR/operator/r1-node-operator-1-key.pem" > "$RUN_DIR/policy.pushed.json" 2>"$RUN_DIR/policy.push.err"; then
    pushed=1; break
  fi
  grep -q "not above the held version" "$RUN_DIR/policy.push.err" && { pushed=1; break; }
  sleep 1
done
[[ $pushed == 1 ]] || { echo "policy push to r1 failed: $(cat "$RUN_DIR/policy.push.err")" >&2; [[ $MODE == foreground ]] && stop_all; exit 1; }
policy_deadline=$((SECONDS + 60))
while IFS=$'\t' read -r region name ip sock; do
  until [[ $(curl -sf --max-time 2 --unix-socket "$sock" http://agent/v1/failover | jq -r .policy_version 2>/dev/null) == "$want" ]]; do
    if (( SECONDS > policy_deadline )); then
      echo "agent $name does not hold global policy version $want; see $RUN_DIR/$region/$name.log" >&2
      [[ $MODE == foreground ]] && stop_all
      exit 1
    fi
    sleep 0.5
  done
done < "$RUN_DIR/agents.tsv"
echo "global policy version $want on every agent of every region (pushed to r1 only)"
echo "cluster up: $REGIONS region(s) x ($AUTHORITIES authorities + $AGENTS agents) in $RUN_DIR"
echo "  sockets: $RUN_DIR/<region>/<region>-a<j>.sock   e.g. shoal --socket $RUN_DIR/r1/r1-a1.sock members"

if [[ $MODE == foreground ]]; then
  exec 9>&- # started: a stop from elsewhere may run now
  echo "Ctrl-C to stop"
  while true; do sleep 1; done
fi
