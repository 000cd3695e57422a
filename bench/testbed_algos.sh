#!/usr/bin/env bash
# bench/testbed_algos.sh - each collective algorithm (R2CCL_ALGO) on one namespace test bed, one
# after the other in the same session: HOSTS hosts x NICS NICs at RATE, one process per host, a
# healthy all-reduce loop per algorithm (busbw beside the NIC sum); then, per algorithm of
# DEGRADE_ALGOS, the same loop with host 3 at half its NICs from the start (its NIC 1 down:
# the plans see its capacity); then, per algorithm of FAULT_ALGOS, the loop with host 3 losing
# a NIC mid-loop (every element of every call checked on every process). Prints process 0's
# tables, every process's stall count, and each process's open rails. Always tears the bed down.
#
#   sudo bench/testbed_algos.sh                                  # 8 hosts x 2 NICs at 50mbit
#   HOSTS=4 NICS=2 RATE=50mbit ALGOS=direct,ring bench/testbed_algos.sh
#   sudo R2CCL_MAX_PEERS=4 ALGOS=two_level,ring,direct DEGRADE_ALGOS=two_level,ring \
#        FAULT_ALGOS=two_level bench/testbed_algos.sh            # two groups of four (issue 38)
# Env: HOSTS (8), NICS (2), RATE (50mbit), SIZES (64MiB), ITERS (3), WARMUP (1), ALGOS
#      (direct,ring), DEGRADE_ALGOS (none), FAULT (1: the fault runs; 0: none), FAULT_ALGOS
#      (ring), FAULT_AT (s, 4), PORT (29710), OUT, PYTHON, R2CCL_* (passed through).
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
HOSTS=${HOSTS:-8}
NICS=${NICS:-2}
RATE=${RATE:-50mbit}
SIZES=${SIZES:-64MiB}
ITERS=${ITERS:-3}
WARMUP=${WARMUP:-1}
ALGOS=${ALGOS:-direct,ring}
DEGRADE_ALGOS=${DEGRADE_ALGOS:-}
FAULT=${FAULT:-1}
FAULT_ALGOS=${FAULT_ALGOS:-ring}
FAULT_AT=${FAULT_AT:-4}
PORT=${PORT:-29710}
PYTHON=${PYTHON:-python3}
OUT=${OUT:-$ROOT/bench-results/algos-${HOSTS}x${NICS}-$(date +%Y%m%d-%H%M%S)}
export PYTHONSAFEPATH=1      # children import the installed jax_r2ccl, not the checkout's source tree
NETNS="$PYTHON -m jax_r2ccl testbed"
NSRUN="$NETNS run"

[[ $EUID -eq 0 ]] || { echo "testbed_algos: must run as root (network namespaces)" >&2; exit 2; }
mkdir -p "$OUT"
cd "$ROOT"
cleanup() { $NETNS down >/dev/null 2>&1 || true; }
trap cleanup EXIT
trap 'exit 130' INT TERM

nics=$(seq -s, -f 'nic%g' 0 $((NICS - 1)))
echo "== test bed: $HOSTS hosts x $NICS NICs at $RATE; results in $OUT"
$NETNS up "$HOSTS" "$NICS" "$RATE"

# run NAME PORT EXTRA-ARGS...: one bench job, every host; prints process 0's table.
run() {
  local name=$1 port=$2; shift 2
  local args=(--coordinator "198.18.0.1:$port" --num-processes "$HOSTS" --nics "$nics" --sizes "$SIZES"
              --iters "$ITERS" --warmup "$WARMUP" --timeout 600 "$@")
  echo "== [$name] python -m jax_r2ccl bench allreduce ${args[*]}"
  local pids=() rc=0 i
  for ((i = 1; i < HOSTS; i++)); do
    timeout -k 5 1800 $NSRUN "r${HOSTS}h$i" -- "$PYTHON" -m jax_r2ccl bench allreduce "${args[@]}" \
      --process-id "$i" > "$OUT/$name-rank$i.log" 2>&1 &
    pids+=($!)
  done
  timeout -k 5 1800 $NSRUN "r${HOSTS}h0" -- "$PYTHON" -m jax_r2ccl bench allreduce "${args[@]}" \
    --process-id 0 --json "$OUT/$name.json" > "$OUT/$name-rank0.log" 2>&1 || rc=$?
  for p in "${pids[@]}"; do wait "$p" || rc=$?; done
  grep -E '^#|^  ' "$OUT/$name-rank0.log" || tail -5 "$OUT/$name-rank0.log"
  local counts=()
  for ((i = 0; i < HOSTS; i++)); do counts+=("$(grep -c 'failed: stalled' "$OUT/$name-rank$i.log" || true)"); done
  echo "# [$name] exit $rc; stalls declared, per process: ${counts[*]}"
  return 0
}

k=0
for algo in ${ALGOS//,/ }; do
  run "$algo" $((PORT + k)) --algo "$algo"
  k=$((k + 1))
done
for algo in ${DEGRADE_ALGOS//,/ }; do
  # Host 3 at half its NICs for the whole run (NIC 1 down before the processes start).
  $NETNS fail 3 1 >/dev/null
  run "$algo-x50" $((PORT + k)) --algo "$algo"
  $NETNS heal 3 1 >/dev/null 2>&1 || true
  k=$((k + 1))
done
if [[ $FAULT == 1 ]]; then
  for algo in ${FAULT_ALGOS//,/ }; do
    # Host 3 loses NIC 1 FAULT_AT s into the timed loop (its link down; healed after the run).
    run "$algo-fault" $((PORT + k)) --algo "$algo" --fault-at "$FAULT_AT" \
      --fault-cmd "$PYTHON -m jax_r2ccl testbed fail 3 1"
    $NETNS heal 3 1 >/dev/null 2>&1 || true
    k=$((k + 1))
  done
fi
echo "== results in $OUT"
