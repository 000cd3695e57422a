#!/usr/bin/env bash
# bench/testbed_scale.sh - a healthy all-reduce loop on a bigger netns test bed with default
# settings (issue 13): HOSTS hosts x NICS NICs at RATE, one process per host, jax_r2ccl beside
# jax.lax's own all-reduce (gloo) in the same run; prints process 0's table and every
# process's stall count (rails the core declared stalled and failed over). Always tears the
# bed down.
#
#   sudo bench/testbed_scale.sh                               # 4 hosts x 4 NICs at 100mbit
#   HOSTS=8 NICS=2 RATE=50mbit bench/testbed_scale.sh
#   HOSTS=2 NICS=4 RATE=500mbit bench/testbed_scale.sh
# Env: HOSTS (4), NICS (4), RATE (100mbit), SIZES (64MiB), ITERS (3), WARMUP (2), BASELINE
#      (jax; "none" for r2ccl alone), PORT (29700), OUT, PYTHON, R2CCL_* (passed through).
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
HOSTS=${HOSTS:-4}
NICS=${NICS:-4}
RATE=${RATE:-100mbit}
SIZES=${SIZES:-64MiB}
ITERS=${ITERS:-3}
WARMUP=${WARMUP:-2}
BASELINE=${BASELINE:-jax}
PORT=${PORT:-29700}
PYTHON=${PYTHON:-python3}
OUT=${OUT:-$ROOT/bench-results/scale-${HOSTS}x${NICS}-$(date +%Y%m%d-%H%M%S)}
export PYTHONSAFEPATH=1      # children import the installed jax_r2ccl, not the checkout's source tree
NETNS="$PYTHON -m jax_r2ccl testbed"
NSRUN="$NETNS run"

[[ $EUID -eq 0 ]] || { echo "testbed_scale: must run as root (network namespaces)" >&2; exit 2; }
mkdir -p "$OUT"
cd "$ROOT"
cleanup() { $NETNS down >/dev/null 2>&1 || true; }
trap cleanup EXIT
trap 'exit 130' INT TERM

nics=$(seq -s, -f 'nic%g' 0 $((NICS - 1)))
echo "== test bed: $HOSTS hosts x $NICS NICs at $RATE; results in $OUT"
$NETNS up "$HOSTS" "$NICS" "$RATE"

args=(--coordinator "198.18.0.1:$PORT" --num-processes "$HOSTS" --nics "$nics" --sizes "$SIZES"
      --iters "$ITERS" --warmup "$WARMUP" --timeout 300)
[[ $BASELINE == none ]] || args+=(--baseline "$BASELINE")
echo "== python -m jax_r2ccl bench allreduce ${args[*]}"
pids=()
for ((i = 1; i < HOSTS; i++)); do
  timeout -k 5 1800 $NSRUN "r${HOSTS}h$i" -- "$PYTHON" -m jax_r2ccl bench allreduce "${args[@]}" \
    --process-id "$i" > "$OUT/rank$i.log" 2>&1 &
  pids+=($!)
done
rc=0
timeout -k 5 1800 $NSRUN "r${HOSTS}h0" -- "$PYTHON" -m jax_r2ccl bench allreduce "${args[@]}" \
  --process-id 0 --json "$OUT/allreduce.json" > "$OUT/rank0.log" 2>&1 || rc=$?
for p in "${pids[@]}"; do wait "$p" || rc=$?; done
grep -E '^#|^  ' "$OUT/rank0.log" || tail -5 "$OUT/rank0.log"
# Every process's declared stalls, from its log (the core logs each as "... failed: stalled").
counts=()
for ((i = 0; i < HOSTS; i++)); do counts+=("$(grep -c 'failed: stalled' "$OUT/rank$i.log" || true)"); done
echo "# stalls declared, per process: ${counts[*]}"
grep -h 'r2ccl timeout\|Error' "$OUT"/rank*.log | head -5 || true
echo "== exit $rc; results in $OUT"
exit $rc
