#!/usr/bin/env bash
# Validates deploy/k8s against the Kubernetes OpenAPI schemas with kubernetes-validate (PyPI;
# installed with pip when missing), strictly (unknown fields are errors):
#   1. the committed manifests, 2. the output of make-secrets.sh (needs a shoal binary),
#   3. the TOML configs embedded in the ConfigMaps parse,
#   4. a self-check: a manifest with a misspelled field must be rejected (the validator works).
#
#   deploy/k8s/validate.sh         K8S_VERSION (1.30.0) selects the schema version.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
K8S_VERSION=${K8S_VERSION:-1.30.0}
# The validator: on PATH, else in a private venv (Debian's system Python refuses `pip install`
# outside one, PEP 668; needs python3-venv).
KV=$(command -v kubernetes-validate || true)
if [[ -z $KV ]]; then
  venv=${XDG_CACHE_HOME:-$HOME/.cache}/shoal-kubernetes-validate
  [[ -x $venv/bin/kubernetes-validate ]] || {
    python3 -m venv "$venv"
    "$venv/bin/pip" install --quiet 'kubernetes-validate==1.37.0'
  }
  KV=$venv/bin/kubernetes-validate
fi
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
kv() { "$KV" --strict --quiet -k "$K8S_VERSION" "$@"; }
kv "$ROOT"/deploy/k8s/*.yaml
echo "kubernetes-validate $K8S_VERSION: $(ls "$ROOT"/deploy/k8s/*.yaml | wc -l) manifest files valid"
if [[ -n ${SHOAL:-} || -x $ROOT/target/debug/shoal || -x $ROOT/target/release/shoal ]]; then
  "$ROOT/deploy/k8s/make-secrets.sh" "$work/out" node-a node-b >/dev/null
  kv "$work"/out/*.yaml
  echo "make-secrets.sh output valid ($(grep -c '^kind: Secret' "$work/out/secrets.yaml") Secrets)"
fi
python3 - "$ROOT"/deploy/k8s/*.yaml <<'PY'
import re, sys, tomllib
n = 0
for path in sys.argv[1:]:
    text = open(path).read()
    # Block scalars "  name.toml: |" in ConfigMap data, indented by 4.
    for m in re.finditer(r"^  ([\w.-]+\.toml): \|\n((?:    .*\n|\n)+)", text, re.M):
        body = "\n".join(l[4:] for l in m.group(2).splitlines())
        tomllib.loads(body)
        n += 1
print(f"{n} embedded TOML configs parse")
PY
sed 's/hostNetwork: true/hostNetwrk: true/' "$ROOT/deploy/k8s/agent.yaml" > "$work/broken.yaml"
if kv "$work/broken.yaml" >/dev/null 2>&1; then
  echo "self-check failed: a misspelled field was accepted" >&2; exit 1
fi
echo "self-check: a misspelled field is rejected"
