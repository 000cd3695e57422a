#!/usr/bin/env bash
# bench/testbed_timeline.sh - `python -m jax_r2ccl bench timeline` on the netns test bed
# (2 hosts x 4 NICs at 500mbit): one stream from host 0 to host 1 through a fault sequence
# on host 1's NICs (fail + heal, degrade to 1/10 + restore, black hole + restore, flap), with
# the health monitor on. Writes OUT/timeline.json and OUT/timeline.png. Always tears the bed down.
#
#   sudo bench/testbed_timeline.sh
# Env: RATE (500mbit), PORT (29700), OUT, PYTHON, DURATION (16), R2CCL_* (passed through).
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
RATE=${RATE:-500mbit}
PORT=${PORT:-29700}
PYTHON=${PYTHON:-python3}
DURATION=${DURATION:-16}
OUT=${OUT:-$ROOT/bench-results/timeline-$(date +%Y%m%d-%H%M%S)}
export PYTHONSAFEPATH=1      # children import the installed jax_r2ccl, not the checkout's source tree
NETNS="$PYTHON -m jax_r2ccl testbed"   # the project's own test bed (jax-r2ccl testbed --help)
NSRUN="$NETNS run"

[[ $EUID -eq 0 ]] || { echo "testbed_timeline: must run as root (network namespaces)" >&2; exit 2; }
mkdir -p "$OUT"
cd "$ROOT"
cleanup() { $NETNS down >/dev/null 2>&1 || true; }
trap cleanup EXIT
trap 'exit 130' INT TERM
$NETNS up 2 4 "$RATE"

steps=(
  --step "1.0:$NETNS fail 1 2"
  --step "2.5:$NETNS heal 1 2"
  --step "4.0:$NETNS degrade 1 1 50mbit"
  --step "6.5:$NETNS degrade 1 1 base"
  --step "8.0:$NETNS blackhole 1 3"
  --step "9.5:$NETNS degrade 1 3 base"
  --step "11.0:$NETNS flap 1 0 50 10"
)
common=(--coordinator "198.18.0.1:$PORT" --num-processes 2 --nics nic0,nic1,nic2,nic3 --duration "$DURATION")
echo "== python -m jax_r2ccl bench timeline ${common[*]} ${steps[*]} --out $OUT/timeline"
timeout -k 5 $((DURATION + 120)) $NSRUN r2h1 -- "$PYTHON" -m jax_r2ccl bench timeline "${common[@]}" \
  --process-id 1 > "$OUT/rank1.log" 2>&1 &
bg=$!
rc0=0 rc1=0
timeout -k 5 $((DURATION + 120)) $NSRUN r2h0 -- "$PYTHON" -m jax_r2ccl bench timeline "${common[@]}" \
  --process-id 0 "${steps[@]}" --out "$OUT/timeline" 2>&1 | tee "$OUT/rank0.log" || rc0=$?
wait "$bg" || rc1=$?
echo "== exit codes rank0=$rc0 rank1=$rc1; results in $OUT"
(( rc0 == 0 && rc1 == 0 ))
