#!/usr/bin/env bash
# bench/scale_check.sh - throughput against socket I/O threads where cores exist (issue 14,
# item 4), in one run of a few minutes: builds jax_r2ccl from this tree (the CPU part only),
# then runs `bench p2p` between two local processes over RAILS loopback rails
# (127.0.0.1 .. 127.0.0.RAILS), r2ccl at the default R2CCL_IO_THREADS and at each count in
# THREADS, beside one rail, MPTCP, plain TCP from one thread per rail (tcp-threads) and iperf3
# (one stream per rail, one process each, where iperf3 is on PATH), with CPU seconds per GB on
# each end. Loopback only; no root needed.
#
#   bench/scale_check.sh                 # results in $OUT (default bench-results/scale-<time>)
#   RAILS=4 THREADS=0,1,2,4 bench/scale_check.sh
#   SKIP_BUILD=1 bench/scale_check.sh    # measure the jax_r2ccl already installed
# Env: PYTHON (python3), RAILS (8), THREADS (0,1,2,4,8), SIZES (256MiB,1GiB), ITERS (5),
#      PORT (29600), OUT, R2CCL_* (passed through).
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
PYTHON=${PYTHON:-python3}
RAILS=${RAILS:-8}
THREADS=${THREADS:-0,1,2,4,8}
SIZES=${SIZES:-256MiB,1GiB}
ITERS=${ITERS:-5}
PORT=${PORT:-29600}
OUT=${OUT:-$ROOT/bench-results/scale-$(date +%Y%m%d-%H%M%S)}
export PYTHONSAFEPATH=1          # children import the installed jax_r2ccl, not this checkout's source
export TF_CPP_MIN_LOG_LEVEL=${TF_CPP_MIN_LOG_LEVEL:-2}
START=$(date +%s)
mkdir -p "$OUT"
step() { echo "== [$(( $(date +%s) - START ))s] $*"; }

NICS=$(seq -s, -f '127.0.0.%g' 1 "$RAILS")
step "machine: $(nproc) CPUs usable, $(grep -c ^processor /proc/cpuinfo) online; $(uname -r)"
"$PYTHON" -V
"$PYTHON" -c 'import jax; print("jax", jax.__version__)'
command -v iperf3 >/dev/null && iperf3 --version | head -1 || echo "iperf3: not on PATH (its rows are skipped)"

if [[ "${SKIP_BUILD:-0}" != 1 ]]; then
  step "build: pip install --no-build-isolation --no-deps . (R2CCL_CUDA=off)"
  (cd "$ROOT" && CMAKE_BUILD_PARALLEL_LEVEL=$(nproc) timeout 400 "$PYTHON" -m pip install -q \
     --no-build-isolation --no-deps -C cmake.define.R2CCL_CUDA=off -C build-dir=build/scale-check .)
fi
(cd / && "$PYTHON" -c 'import jax_r2ccl, jax_r2ccl._core as c; print("jax_r2ccl from", jax_r2ccl.__file__);
print("auto I/O threads for", '"$RAILS"', "NICs:", c.io_threads_for(-1, '"$RAILS"'))')

step "bench p2p: 2 processes, $RAILS loopback rails, I/O threads auto and $THREADS, sizes $SIZES"
common=(--coordinator "127.0.0.1:$PORT" --num-processes 2 --nics "$NICS" --sizes "$SIZES"
        --iters "$ITERS" --warmup 1 --timeout 120 --io-threads "$THREADS" --baseline iperf3 --baseline tcp-threads --prefix scale)
timeout -k 5 420 "$PYTHON" -m jax_r2ccl bench p2p "${common[@]}" --process-id 1 > "$OUT/rank1.log" 2>&1 &
bg=$!
rc0=0 rc1=0
timeout -k 5 420 "$PYTHON" -m jax_r2ccl bench p2p "${common[@]}" --process-id 0 --json "$OUT/scale.json" \
  > "$OUT/rank0.log" 2>&1 || rc0=$?
wait "$bg" || rc1=$?
cat "$OUT/rank0.log"
if (( rc0 != 0 || rc1 != 0 )); then
  echo "scale_check: FAIL: exit codes rank0=$rc0 rank1=$rc1; rank 1 said:"
  tail -20 "$OUT/rank1.log"
  exit 1
fi
step "done; results in $OUT"
