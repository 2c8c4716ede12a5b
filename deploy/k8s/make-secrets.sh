#!/usr/bin/env bash
# Generates the certificates and keys of one region for the manifests in deploy/k8s and writes
# ready-to-apply YAML: the Secrets (region CA, region signing key, one certificate + key per
# authority replica and per Kubernetes node) and agent.yaml with the region's public key filled
# in. Nothing is sent anywhere: apply the output with `kubectl apply -f OUT/`.
#
#   deploy/k8s/make-secrets.sh OUT NODE...      NODE: the Kubernetes node names (spec.nodeName)
#
# Environment: REGION (r1; must match the manifests), SHOAL (the shoal binary; default
# target/release/shoal, else target/debug/shoal), AUTHORITIES (3).
# OUT/ca/ keeps the CA key and every node key: store it offline (a new node's certificate:
# `shoal certs node --out OUT/ca --node-id <node> --region r1`, docs/operations.md).
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
[[ $# -ge 2 ]] || { echo "usage: $0 OUT NODE..." >&2; exit 2; }
OUT=$1; shift
REGION=${REGION:-r1}
AUTHORITIES=${AUTHORITIES:-3}
SHOAL=${SHOAL:-}
if [[ -z $SHOAL ]]; then
  for b in "$ROOT/target/release/shoal" "$ROOT/target/debug/shoal"; do [[ -x $b ]] && { SHOAL=$b; break; }; done
fi
[[ -x ${SHOAL:-} ]] || { echo "no shoal binary (cargo build --release -p shoal-cli, or set SHOAL=)" >&2; exit 1; }
[[ -e $OUT ]] && { echo "$OUT exists; refusing to overwrite keys" >&2; exit 1; }
mkdir -p "$OUT/ca"
chmod 0700 "$OUT/ca"
"$SHOAL" certs ca --region "$REGION" --out "$OUT/ca" >/dev/null
pub=$("$SHOAL" authority keygen --out "$OUT/ca/region.key")

# secret NAME FILE-KEY=PATH...: a Secret manifest with the files as stringData.
secret() {
  local name=$1; shift
  printf -- '---\napiVersion: v1\nkind: Secret\nmetadata:\n  name: %s\n  namespace: shoal-system\n  labels: {app.kubernetes.io/part-of: shoal}\ntype: Opaque\nstringData:\n' "$name"
  local kv
  for kv in "$@"; do
    printf '  %s: |\n' "${kv%%=*}"
    sed 's/^/    /' "${kv#*=}"
  done
}
cert_pair() { # node-id [extra args] -> "<id>.pem=<file> <id>-key.pem=<file>"
  "$SHOAL" certs node --node-id "$1" --region "$REGION" --out "$OUT/ca" "${@:2}" >/dev/null
  echo "$1.pem=$OUT/ca/$REGION-node-$1.pem" "$1-key.pem=$OUT/ca/$REGION-node-$1-key.pem"
}
auth=(); agents=()
for i in $(seq 0 $((AUTHORITIES - 1))); do read -ra p <<<"$(cert_pair "shoal-authority-$i" --dns "shoal-authority-$i.shoal-authority.shoal-system.svc.cluster.local")"; auth+=("${p[@]}"); done
for n in "$@"; do read -ra p <<<"$(cert_pair "$n")"; agents+=("${p[@]}"); done
(
  umask 077
  {
    secret shoal-region-ca "ca.pem=$OUT/ca/$REGION-ca.pem"
    secret shoal-region-signing-key "region.key=$OUT/ca/region.key"
    secret shoal-authority-tls "${auth[@]}"
    secret shoal-agent-tls "${agents[@]}"
  } > "$OUT/secrets.yaml"
)
cp "$ROOT/deploy/k8s/namespace.yaml" "$ROOT/deploy/k8s/authority.yaml" "$OUT/"
sed "s/REGION_PUBLIC_KEY/$pub/" "$ROOT/deploy/k8s/agent.yaml" > "$OUT/agent.yaml"
echo "wrote $OUT/{namespace,secrets,authority,agent}.yaml (region $REGION, public key $pub)"
echo "apply: kubectl apply -f $OUT/namespace.yaml && kubectl apply -f $OUT/"
