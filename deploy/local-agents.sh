#!/usr/bin/env bash
# Starts a local cluster of N shoal agents (default 3) on 127.0.0.1..N, one region "dev", with a
# generated dev CA and the DEVELOPMENT authority on the first agent (insecure; never production).
#
#   deploy/local-agents.sh [N] [DIR]      start (DIR default: /tmp/shoal-local)
#   deploy/local-agents.sh stop [DIR]     stop them (graceful leave)
set -euo pipefail
SHOAL=${SHOAL:-$(cd "$(dirname "$0")/.." && pwd)/target/release/shoal}
if [[ "${1:-}" == stop ]]; then
  DIR=${2:-/tmp/shoal-local}
  for p in "$DIR"/*.pid; do [[ -f $p ]] && kill -TERM "$(cat "$p")" 2>/dev/null || true; rm -f "$p"; done
  exit 0
fi
N=${1:-3}
DIR=${2:-/tmp/shoal-local}
[[ -x $SHOAL ]] || { echo "build first: cargo build --release -p shoal-cli" >&2; exit 1; }
mkdir -p "$DIR" && cd "$DIR"
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
  "$SHOAL" agent --config "$name.toml" >"$name.log" 2>&1 &
  echo $! > "$name.pid"
done
echo "started $N agents in $DIR (sockets $DIR/node-*.sock, metrics 127.0.0.1:9464..)"
