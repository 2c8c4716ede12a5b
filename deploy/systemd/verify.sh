#!/usr/bin/env bash
# Checks the systemd units with systemd-analyze: `verify` (syntax, directives, the ExecStart
# binary exists and runs) must print nothing about our units, and `security --offline` prints
# each unit's exposure score (lower is better; fails above MAX_EXPOSURE, default 3.0).
#
#   deploy/systemd/verify.sh [SHOAL_BINARY]     default: target/debug/shoal, else target/release/shoal
#
# The units name /usr/local/bin/shoal; the check runs on copies that point at SHOAL_BINARY so it
# needs no installation.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
BIN=${1:-}
if [[ -z $BIN ]]; then
  for b in "$ROOT/target/debug/shoal" "$ROOT/target/release/shoal"; do [[ -x $b ]] && { BIN=$b; break; }; done
fi
[[ -x ${BIN:-} ]] || { echo "no shoal binary (pass its path)" >&2; exit 1; }
command -v systemd-analyze >/dev/null || { echo "systemd-analyze not found (apt-get install systemd)" >&2; exit 1; }
MAX_EXPOSURE=${MAX_EXPOSURE:-3.0}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
units=()
for u in "$ROOT"/deploy/systemd/*.service; do
  sed "s|/usr/local/bin/shoal|$BIN|g" "$u" > "$work/$(basename "$u")"
  units+=("$work/$(basename "$u")")
done
# The binary must also really be the one the units expect.
"$BIN" agent --help >/dev/null
"$BIN" authority run --help >/dev/null
out=$(SYSTEMD_LOG_LEVEL=notice systemd-analyze verify --man=no "${units[@]}" 2>&1 || echo "systemd-analyze verify failed: $?")
ours=$(grep -E 'shoal|failed' <<<"$out" || true)
if [[ -n $ours ]]; then
  echo "$out" >&2
  exit 1
fi
echo "systemd-analyze verify: ${#units[@]} units, no findings"
fail=0
for u in "${units[@]}"; do
  # "→ Overall exposure level for shoal-agent.service: 1.8 OK"
  score=$(systemd-analyze security --offline=yes "$u" 2>&1 | grep 'Overall exposure level' | grep -oE '[0-9]+\.[0-9]+' | tail -1 || true)
  echo "systemd-analyze security: $(basename "$u") exposure $score"
  awk -v s="$score" -v m="$MAX_EXPOSURE" 'BEGIN { exit !(s != "" && s + 0 <= m + 0) }' || { echo "  above $MAX_EXPOSURE" >&2; fail=1; }
done
exit $fail
