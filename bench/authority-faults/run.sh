#!/usr/bin/env bash
# Randomized fault schedules against real authority replicas (issue 14): one schedule of 10
# steps per seed (kill / pause leaders and followers; odd seeds 3 replicas, even seeds 5),
# a write workload through three agents, then the checker of
# tests/cross_process/authority_chaos.rs. Writes the table rows to $OUT (default a temp
# file) and prints them; docs/benchmarks/authority-faults.md holds the committed results.
#
#   bench/authority-faults/run.sh            # seeds 1..20
#   SEEDS=7..8 bench/authority-faults/run.sh # one seed
#
# Reproduce one failing schedule:
#   SHOAL_FAULT_SEED=<seed> SHOAL_FAULT_REPLICAS=<n> \
#     cargo test -p shoal-system-tests --test authority_chaos randomized_schedules -- --ignored --nocapture
set -euo pipefail
cd "$(dirname "$0")/../.."
export CARGO_INCREMENTAL=0
SEEDS="${SEEDS:-1..21}"
OUT="${OUT:-$(mktemp)}"
: > "$OUT"
start=$(date +%s)
SHOAL_FAULT_SEEDS="$SEEDS" SHOAL_FAULT_REPORT="$OUT" \
  cargo test -p shoal-system-tests --test authority_chaos randomized_schedules -- --ignored --nocapture \
  2>&1 | grep -E '^\| |reproduce|failing seeds|test result' || true
echo "elapsed $(( $(date +%s) - start )) s; rows in $OUT: $(grep -c '^| [0-9]' "$OUT")"
