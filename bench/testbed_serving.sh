#!/usr/bin/env bash
# bench/testbed_serving.sh - examples/serving.py (tensor-parallel decode, a psum per layer per
# token) across the netns test bed's 2 hosts x 4 NICs; host 1's nic2 goes down at token 150 of
# the second pass. Prints per-token latency (p50, p99), the cost of the step the failure hit,
# and whether the tokens equal the fault-free pass. Always tears the bed down.
#
#   sudo bench/testbed_serving.sh
# Env: RATE (500mbit), PORT (29800), OUT, PYTHON, TOKENS (300), FAULT (fail 1 2), R2CCL_*.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
RATE=${RATE:-500mbit}
PORT=${PORT:-29800}
PYTHON=${PYTHON:-python3}
TOKENS=${TOKENS:-300}
FAULT=${FAULT:-fail 1 2}
OUT=${OUT:-$ROOT/bench-results/serving-$(date +%Y%m%d-%H%M%S)}
export PYTHONSAFEPATH=1      # children import the installed jax_r2ccl, not the checkout's source tree
NETNS="$PYTHON -m jax_r2ccl testbed"   # the project's own test bed (jax-r2ccl testbed --help)
NSRUN="$NETNS run"

[[ $EUID -eq 0 ]] || { echo "testbed_serving: must run as root (network namespaces)" >&2; exit 2; }
mkdir -p "$OUT"
cd "$ROOT"
cleanup() { $NETNS down >/dev/null 2>&1 || true; }
trap cleanup EXIT
trap 'exit 130' INT TERM
$NETNS up 2 4 "$RATE"

common=(--coordinator "198.18.0.1:$PORT" --num-processes 2 --tokens "$TOKENS")
export R2CCL_NICS=nic0,nic1,nic2,nic3
export PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}"   # this checkout, not an installed copy
heal=${FAULT/fail/heal}
echo "== examples/serving.py ${common[*]} --fault-at-token $((TOKENS / 2)) --fault-cmd 'jax-r2ccl testbed $FAULT'"
timeout -k 5 300 $NSRUN r2h1 -- "$PYTHON" examples/serving.py "${common[@]}" --process-id 1 \
  > "$OUT/rank1.log" 2>&1 &
bg=$!
rc0=0 rc1=0
timeout -k 5 300 $NSRUN r2h0 -- "$PYTHON" examples/serving.py "${common[@]}" --process-id 0 \
  --fault-at-token $((TOKENS / 2)) --fault-cmd "$NETNS $FAULT" --heal-cmd "$NETNS $heal" \
  --json "$OUT/serving.json" > "$OUT/rank0.log" 2>&1 || rc0=$?
wait "$bg" || rc1=$?
grep -v '^\[r2ccl\|^\[Gloo' "$OUT/rank0.log" | tail -12
grep -h 'health:' "$OUT/rank0.log" "$OUT/rank1.log" | head -12 || true
echo "== exit codes rank0=$rc0 rank1=$rc1; results in $OUT"
(( rc0 == 0 && rc1 == 0 ))
