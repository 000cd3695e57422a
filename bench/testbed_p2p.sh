#!/usr/bin/env bash
# bench/testbed_p2p.sh - `python -m jax_r2ccl bench p2p` on the netns test bed, end to end:
# builds 2 hosts x 4 NICs at 500mbit, configures MPTCP, runs the healthy benchmark with
# baselines and the fault runs (fail, blackhole, flap), and always tears the bed down.
#
#   sudo bench/testbed_p2p.sh                 # everything; results in bench-results/p2p-<time>/
#   RUNS="healthy fail" bench/testbed_p2p.sh  # a subset (healthy latency fail blackhole flap inject)
#   RATE=100gbit RUNS=cpu bench/testbed_p2p.sh  # CPU-bound: r2ccl beside iperf3, CPU s/GB
#   IO_THREADS=0,2 RATE=100gbit RUNS=cpu ...    # also r2ccl at R2CCL_IO_THREADS=0 and 2 (rows r2ccl-io0, -io2)
# Env: RATE (500mbit), ITERS (10), LAT_ITERS (300), FAULT_ITERS (3), PORT (first coordinator port, 29500),
#      OUT (result folder), PYTHON (python3),
#      R2CCL_* (passed through to both processes, e.g. R2CCL_DEBUG=INFO).
# Needs root (network namespaces). Sends traffic only inside 198.18.0.0/15 namespaces.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
RATE=${RATE:-500mbit}
ITERS=${ITERS:-10}
LAT_ITERS=${LAT_ITERS:-300}
FAULT_ITERS=${FAULT_ITERS:-3}
PORT=${PORT:-29500}
PYTHON=${PYTHON:-python3}
RUNS=${RUNS:-healthy latency fail blackhole flap}
OUT=${OUT:-$ROOT/bench-results/p2p-$(date +%Y%m%d-%H%M%S)}
NICS=nic0,nic1,nic2,nic3
export PYTHONSAFEPATH=1      # children import the installed jax_r2ccl, not the checkout's source tree
NETNS="$PYTHON -m jax_r2ccl testbed"   # the project's own test bed (jax-r2ccl testbed --help)
NSRUN="$NETNS run"

[[ $EUID -eq 0 ]] || { echo "testbed_p2p: must run as root (network namespaces)" >&2; exit 2; }
mkdir -p "$OUT"
cd "$ROOT"

cleanup() { $NETNS down >/dev/null 2>&1 || true; }
trap cleanup EXIT
trap 'exit 130' INT TERM

echo "== test bed: 2 hosts x 4 NICs at $RATE; results in $OUT"
$NETNS up 2 4 "$RATE"

# MPTCP baseline: rank 0 (host r2h0) is the sender and the connecting side (the MPTCP
# client), so its extra NICs become subflow endpoints; both hosts accept extra subflows.
for h in r2h0 r2h1; do
  ip -n "$h" mptcp endpoint flush
  ip -n "$h" mptcp limits set subflow 8 add_addr_accepted 8
done
for k in 1 2 3; do ip -n r2h0 mptcp endpoint add "198.18.$k.1" dev "nic$k" subflow; done
{ echo "r2h0 endpoints:"; ip -n r2h0 mptcp endpoint show; echo "r2h0 limits:"; ip -n r2h0 mptcp limits show;
  echo "r2h1 limits:"; ip -n r2h1 mptcp limits show; } | tee "$OUT/mptcp-config.txt"

status=0
run_no=0
# run NAME TIMEOUT_S ARGS... : rank 1 on r2h1 in the background, rank 0 on r2h0 in front.
run() {
  local name=$1 t=$2; shift 2
  local port=$((PORT + run_no)); run_no=$((run_no + 1))
  local common=(--coordinator "198.18.0.1:$port" --num-processes 2 --nics "$NICS" --prefix "p2p-$name")
  echo
  echo "== $name: python -m jax_r2ccl bench p2p ${common[*]} $*"
  timeout -k 5 "$t" $NSRUN r2h1 -- "$PYTHON" -m jax_r2ccl bench p2p "${common[@]}" --process-id 1 "$@" \
    > "$OUT/$name.rank1.log" 2>&1 &
  local bg=$!
  local rc0=0 rc1=0
  timeout -k 5 "$t" $NSRUN r2h0 -- "$PYTHON" -m jax_r2ccl bench p2p "${common[@]}" --process-id 0 \
    --json "$OUT/$name.json" "$@" > "$OUT/$name.rank0.log" 2>&1 || rc0=$?
  wait "$bg" || rc1=$?
  grep -v '^\[r2ccl' "$OUT/$name.rank0.log" | grep -v '^bench: fault' || true
  grep -h '^\[r2ccl' "$OUT/$name.rank0.log" "$OUT/$name.rank1.log" | sort -k3,3n | head -40 || true
  echo "== $name: exit codes rank0=$rc0 rank1=$rc1"
  if (( rc0 != 0 || rc1 != 0 )); then status=1; tail -5 "$OUT/$name.rank1.log"; fi
}

for r in $RUNS; do
  case "$r" in
    healthy)
      run healthy 600 --sizes 4KiB,16MiB,256MiB --iters "$ITERS" --warmup 2 --timeout 60 ;;
    cpu)        # the CPU-bound case (issue 14): give the bed fast rails, e.g. RATE=100gbit RUNS=cpu;
                # iperf3 (one stream per NIC, and one stream) beside r2ccl, 1 rail and MPTCP, CPU s/GB on each end
      run cpu 600 --sizes 16MiB,256MiB --iters "$ITERS" --warmup 2 --timeout 60 --baseline iperf3 --baseline tcp-threads \
        ${IO_THREADS:+--io-threads "$IO_THREADS"} ;;
    latency)    # 4 KiB round trips: the caller's path, the progress thread alone, MPTCP
      run latency 300 --sizes 4KiB --iters "$LAT_ITERS" --warmup 30 --timeout 60 --thread-baseline --poll-baseline ;;
    fail)       # host 1's nic2 loses carrier 0.3 s into the first 256 MiB iteration; healed 1.5 s later
      run fail 180 --sizes 256MiB --iters "$FAULT_ITERS" --warmup 1 --no-baselines --timeout 60 \
        --fault-at 0.3 --fault-cmd "$NETNS fail 1 2; sleep 1.5; $NETNS heal 1 2"
      $NETNS heal 1 2 >/dev/null ;;
    blackhole)  # nic2 stays up but passes nothing; rate restored 1.5 s later
      run blackhole 180 --sizes 256MiB --iters "$FAULT_ITERS" --warmup 1 --no-baselines --timeout 60 \
        --fault-at 0.3 --fault-cmd "$NETNS blackhole 1 2; sleep 1.5; $NETNS degrade 1 2 base"
      $NETNS degrade 1 2 base >/dev/null ;;
    flap)       # 50 ms down / 50 ms up, 20 times (2 s)
      run flap 180 --sizes 256MiB --iters "$FAULT_ITERS" --warmup 1 --no-baselines --timeout 60 \
        --fault-at 0.3 --fault-cmd "$NETNS flap 1 2 50 20"
      $NETNS heal 1 2 >/dev/null ;;
    inject)     # software black hole on rank 0's rail 2 (no root needed for this part)
      run inject 180 --sizes 256MiB --iters "$FAULT_ITERS" --warmup 1 --no-baselines --timeout 60 \
        --fault-at 0.3 --inject-rail 2 --inject stall --inject-heal-after 1.5 ;;
    *) echo "testbed_p2p: unknown run '$r'" >&2; status=2 ;;
  esac
done

echo
echo "== results in $OUT (exit $status)"
exit $status
