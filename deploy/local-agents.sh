#!/usr/bin/env bash
# Starts a local cluster of N shoal agents (default 3) on 127.0.0.1..N, one region "dev", with a
# generated dev CA and the DEVELOPMENT authority on the first agent (insecure; never production).
#
#   deploy/local-agents.sh [N] [DIR]      start (DIR default: /tmp/shoal-local); returns once every
#                                         agent answers /v1/agent/ready (bounded: START_TIMEOUT_S, 30)
#   deploy/local-agents.sh stop [DIR]     stop the agents this script started (SIGTERM: graceful
#                                         leave; SIGKILL after 10 s)
#
# DIR holds the CA and node keys, the configs and the agents' sockets, so it must be yours alone
# (deploy/lib/owned-dir.sh): a missing DIR is created with mode 0700 in an existing parent; an
# existing one is refused (before anything is read, written or signalled) unless it is a
# directory of the current user that group and others cannot enter, with nothing in it of
# another user, reached only through directories and symlinks of root's or the current user's
# (a predictable /tmp path could have been made by another local user, with their own CA and
# keys). `start` also refuses a non-empty DIR it did not make (marker .shoal-local-agents-dir).
#
# Refuses to start while an agent it started in DIR still runs. Each pid file holds the pid of a
# process that was verified to be `shoal agent --config DIR/<node>.toml`; `stop` checks that again
# before signalling, so a reused pid is never killed.
set -euo pipefail
# Everything this script writes is private (keys, configs, logs): and owned_dir_check refuses a
# directory with group- or world-writable files, which a umask of 002 would make.
umask 077
SHOAL=${SHOAL:-$(cd "$(dirname "$0")/.." && pwd)/target/release/shoal}

# ours PIDFILE: the pid in it if that process is still our agent for this config.
ours() {
  local p=$1 pid name
  [[ -f $p ]] || return 1
  pid=$(cat "$p"); name=$(basename "$p" .pid)
  [[ $pid =~ ^[0-9]+$ ]] || return 1
  { tr '\0' ' ' < "/proc/$pid/cmdline"; } 2>/dev/null | grep -qF -- "agent --config $DIR/$name.toml " || return 1
  echo "$pid"
}

# owned_dir_check, owned_dir_make (the rules in the header above).
# shellcheck source=deploy/lib/owned-dir.sh
source "$(dirname -- "$0")/lib/owned-dir.sh"

stop_all() {
  local p pid pids=()
  for p in "$DIR"/node-*.pid; do
    [[ -f $p ]] || continue
    if pid=$(ours "$p"); then pids+=("$pid"); fi
    rm -f "$p"
  done
  [[ ${#pids[@]} -gt 0 ]] || { echo "no agents of $DIR running"; return 0; }
  kill -TERM "${pids[@]}" 2>/dev/null || true
  for _ in $(seq 1 100); do
    local alive=0
    for pid in "${pids[@]}"; do kill -0 "$pid" 2>/dev/null && alive=1; done
    [[ $alive == 0 ]] && break
    sleep 0.1
  done
  for pid in "${pids[@]}"; do kill -KILL "$pid" 2>/dev/null || true; done
  echo "stopped ${#pids[@]} agents of $DIR"
}

if [[ "${1:-}" == stop ]]; then
  DIR=${2:-/tmp/shoal-local}
  [[ -e $DIR || -L $DIR ]] || { echo "no agents of $DIR running"; exit 0; }
  owned_dir_check "$DIR"
  # The pid files name the resolved path (start resolves it): so must the check of each one.
  DIR=$OWNED_DIR_REAL
  stop_all
  exit 0
fi
N=${1:-3}
DIR=${2:-/tmp/shoal-local}
[[ -x $SHOAL ]] || { echo "build first: cargo build --release -p shoal-cli" >&2; exit 1; }
owned_dir_make "$DIR"
DIR=$OWNED_DIR_REAL
# Only a directory this script made (its marker, or the files of one made before the marker)
# or an empty one: it writes node-N.toml, keys and logs and removes node-N.pid files, so a
# project directory given by mistake must be refused, not overwritten.
MARKER=.shoal-local-agents-dir
if [[ ! -f $DIR/$MARKER && ! ( -f $DIR/dev-ca.pem && -f $DIR/node-1.toml ) && -n $(ls -A -- "$DIR") ]]; then
  echo "local-agents.sh: refusing $DIR: it holds files this script did not make (no $MARKER); give a new or empty directory" >&2
  exit 1
fi
echo "made by deploy/local-agents.sh" > "$DIR/$MARKER"
for p in "$DIR"/node-*.pid; do
  if pid=$(ours "$p"); then
    echo "agents already run in $DIR (pid $pid, $(basename "$p" .pid)); run: $0 stop $DIR" >&2
    exit 1
  fi
  rm -f "$p"
done
# An agent this script no longer knows of (its pid file lost) would answer on the socket path a
# new one is given, and the new one would exit on the data directory's lock, unnoticed.
for sock in "$DIR"/node-*.sock; do
  [[ -S $sock ]] || continue
  if curl -s --max-time 2 --unix-socket "$sock" -o /dev/null http://agent/v1/agent/ready 2>/dev/null; then
    echo "an agent already answers on $sock, not one this script knows of (no pid file); stop it first (see 'ss -xlp | grep $sock')" >&2
    exit 1
  fi
done
cd "$DIR"
[[ -f dev-ca.pem ]] || "$SHOAL" certs ca --region dev --out . >/dev/null
for i in $(seq 1 "$N"); do
  name=node-$i
  [[ -f dev-node-$name.pem ]] || "$SHOAL" certs node --node-id "$name" --region dev --out . >/dev/null
  if [[ $i == 1 ]]; then seeds=""; auth="dev = true"; else seeds="\"127.0.0.1:7946\""; auth="addresses = [\"127.0.0.1:7946\"]"; fi
  cat > "$name.toml" <<CONF
node_id = "$name"
region = "dev"
zone = "zone-$(( (i - 1) % 2 + 1 ))"
data_dir = "data-$name"
listen = "127.0.0.$i:7946"
socket = "$DIR/$name.sock"
metrics = "127.0.0.1:$((9463 + i))"
seeds = [$seeds]
cluster_size = 8

[tls]
ca = "dev-ca.pem"
cert = "dev-node-$name.pem"
key = "dev-node-$name-key.pem"

[trust]
dev_authority = true

[authority]
$auth

[access]
# Development policy: every local caller may do everything (logged loudly at start).
dev_allow_all = true
CONF
  "$SHOAL" agent --config "$DIR/$name.toml" >>"$name.log" 2>&1 </dev/null &
  echo $! > "$name.pid"
done

# Wait (bounded) until every agent serves; any agent that exits fails the start and stops the rest.
deadline=$((SECONDS + ${START_TIMEOUT_S:-30}))
for i in $(seq 1 "$N"); do
  name=node-$i
  until curl -sf --max-time 2 --unix-socket "$DIR/$name.sock" http://agent/v1/agent/ready >/dev/null 2>&1; do
    if ! ours "$name.pid" >/dev/null || (( SECONDS > deadline )); then
      echo "agent $name did not come up (see $DIR/$name.log):" >&2
      tail -5 "$DIR/$name.log" >&2
      stop_all >&2
      exit 1
    fi
    sleep 0.2
  done
done
# Each answer must have come from the process started here (not from one left from before).
for i in $(seq 1 "$N"); do
  if ! ours "node-$i.pid" >/dev/null; then
    echo "agent node-$i exited after start (see $DIR/node-$i.log):" >&2
    tail -5 "$DIR/node-$i.log" >&2
    stop_all >&2
    exit 1
  fi
done
echo "started $N agents in $DIR, all serving (sockets $DIR/node-*.sock, metrics 127.0.0.1:9464..)"
