#!/usr/bin/env bash
# bench/testbed_collectives.sh - `python -m jax_r2ccl bench allreduce|allgather|reducescatter|
# alltoall|ppermute|raggedalltoall` on the netns test bed (2 hosts x 4 NICs at 500mbit), jax_r2ccl
# beside jax.lax's own collectives (gloo) in the same run; then an all-reduce loop, a ppermute
# loop (a ring shift of 64 MiB per device, jax.lax.ppermute under the lowering swap) and a
# ragged all-to-all loop (jax.lax.ragged_all_to_all under the swap) with a NIC failing mid-way.
# Always tears the bed down.
#
#   sudo bench/testbed_collectives.sh                  # everything; results in bench-results/coll-<time>/
#   OPS="allreduce" RUNS="healthy" bench/testbed_collectives.sh
#   RUNS="down degrade flap" bench/testbed_collectives.sh  # one NIC down; at 1/10; flapping
# Env: RATE (500mbit), ITERS (10), SIZES, PORT (29600), OUT, PYTHON, R2CCL_* (passed through).
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
RATE=${RATE:-500mbit}
ITERS=${ITERS:-10}
SIZES=${SIZES:-8B,4KiB,1MiB,16MiB,64MiB}
PORT=${PORT:-29600}
PYTHON=${PYTHON:-python3}
OPS=${OPS:-allreduce allgather reducescatter alltoall ppermute raggedalltoall}
RUNS=${RUNS:-healthy fail ppermute-fail ragged-fail degrade flap}
DEGRADED_RATE=${DEGRADED_RATE:-50mbit}
OUT=${OUT:-$ROOT/bench-results/coll-$(date +%Y%m%d-%H%M%S)}
NICS=nic0,nic1,nic2,nic3
export PYTHONSAFEPATH=1      # children import the installed jax_r2ccl, not the checkout's source tree
NETNS="$PYTHON -m jax_r2ccl testbed"   # the project's own test bed (jax-r2ccl testbed --help)
NSRUN="$NETNS run"

[[ $EUID -eq 0 ]] || { echo "testbed_collectives: must run as root (network namespaces)" >&2; exit 2; }
mkdir -p "$OUT"
cd "$ROOT"
cleanup() { $NETNS down >/dev/null 2>&1 || true; }
trap cleanup EXIT
trap 'exit 130' INT TERM

echo "== test bed: 2 hosts x 4 NICs at $RATE; results in $OUT"
$NETNS up 2 4 "$RATE"

status=0
run_no=0
# run NAME OP TIMEOUT_S ARGS... : process 1 on r2h1 in the background, process 0 on r2h0 in front.
run() {
  local name=$1 op=$2 t=$3; shift 3
  local port=$((PORT + run_no)); run_no=$((run_no + 1))
  local common=(--coordinator "198.18.0.1:$port" --num-processes 2 --nics "$NICS")
  echo
  echo "== $name: python -m jax_r2ccl bench $op ${common[*]} $*"
  timeout -k 5 "$t" $NSRUN r2h1 -- "$PYTHON" -m jax_r2ccl bench "$op" "${common[@]}" --process-id 1 "$@" \
    > "$OUT/$name.rank1.log" 2>&1 &
  local bg=$! rc0=0 rc1=0
  timeout -k 5 "$t" $NSRUN r2h0 -- "$PYTHON" -m jax_r2ccl bench "$op" "${common[@]}" --process-id 0 \
    --json "$OUT/$name.json" "$@" > "$OUT/$name.rank0.log" 2>&1 || rc0=$?
  wait "$bg" || rc1=$?
  grep -E '^#|^  ' "$OUT/$name.rank0.log" || true
  grep -h '^\[r2ccl' "$OUT/$name.rank0.log" "$OUT/$name.rank1.log" | sort -k3,3n | head -20 || true
  echo "== $name: exit codes rank0=$rc0 rank1=$rc1"
  if (( rc0 != 0 || rc1 != 0 )); then status=1; tail -5 "$OUT/$name.rank1.log"; fi
}

for r in $RUNS; do
  case "$r" in
    healthy)
      for op in $OPS; do
        run "$op" "$op" 900 --sizes "$SIZES" --iters "$ITERS" --warmup 2 --baseline jax --timeout 120
      done ;;
    fail)       # host 1's nic2 down 0.3 s into the 64 MiB all-reduce loop, healed 1.5 s later
      run allreduce-fail allreduce 300 --sizes 64MiB --iters "$ITERS" --warmup 1 --timeout 120 \
        --fault-at 0.3 --fault-cmd "$NETNS fail 1 2; sleep 1.5; $NETNS heal 1 2"
      $NETNS heal 1 2 >/dev/null ;;
    ppermute-fail)   # the same fault in a 64 MiB ppermute loop (swap on), beside jax.lax's own after it
      run ppermute-fail ppermute 300 --sizes 64MiB --iters "$ITERS" --warmup 1 --timeout 120 --baseline jax \
        --fault-at 0.3 --fault-cmd "$NETNS fail 1 2; sleep 1.5; $NETNS heal 1 2"
      $NETNS heal 1 2 >/dev/null ;;
    ragged-fail)   # the same fault in a 64 MiB ragged all-to-all loop (swap on), beside the dense all_to_all
      run ragged-fail raggedalltoall 300 --sizes 64MiB --iters "$ITERS" --warmup 1 --timeout 120 --baseline jax \
        --fault-at 0.3 --fault-cmd "$NETNS fail 1 2; sleep 1.5; $NETNS heal 1 2"
      $NETNS heal 1 2 >/dev/null ;;
    down)       # host 1's nic2 down from before the start (the job starts degraded) to the end
      $NETNS fail 1 2 >/dev/null
      run allreduce-down allreduce 600 --sizes "${DEGRADE_SIZES:-16MiB,64MiB}" --iters "$ITERS" --warmup 3 \
        --timeout 120
      $NETNS heal 1 2 >/dev/null ;;
    degrade)    # host 1's nic2 at a tenth of its rate for the whole loop (steady state after warm-up)
      $NETNS degrade 1 2 "$DEGRADED_RATE" >/dev/null
      run allreduce-degrade allreduce 600 --sizes "${DEGRADE_SIZES:-16MiB,64MiB}" --iters "$ITERS" --warmup 3 \
        --timeout 120
      $NETNS degrade 1 2 base >/dev/null ;;
    flap)       # host 1's nic2 flaps 50 ms down / 50 ms up, 20 times, during a 200-iteration loop
      run allreduce-flap allreduce 600 --sizes "${FLAP_SIZES:-4MiB}" --iters "${FLAP_ITERS:-200}" --warmup 2 \
        --timeout 120 --fault-at 0.3 --fault-cmd "$NETNS flap 1 2 50 20"
      $NETNS heal 1 2 >/dev/null ;;
    *) echo "testbed_collectives: unknown run '$r'" >&2; status=2 ;;
  esac
done
echo
echo "== results in $OUT (exit $status)"
exit $status
