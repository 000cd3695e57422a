#!/usr/bin/env bash
# bench/testbed_nccl.sh - the NCCL plugin's speed beside the endpoint's, on the same test bed, in
# one run: 2 hosts x 4 NICs at RATE (500mbit). For each of RUNS (3) rounds:
#   plugin    the conformance harness's bandwidth case (tests/nccl/plugin_harness.cc): 256 MiB
#             streamed in 512 KiB pieces with 8 in flight (NCCL's SIMPLE steps), every byte
#             checked, then the 4 KiB isend -> test round trip (median of 300)
#   endpoint  `jax-r2ccl bench p2p --sizes 4KiB,256MiB --no-baselines` (the same rails through the
#             endpoint, every byte checked; its 4 KiB time is the receiver's: an empty "go" to
#             the sender and the 4 KiB back, a round trip as the harness's is)
# and prints a table: MB/s and round trip of each, the plugin's share of the endpoint's.
#   sudo bench/testbed_nccl.sh        # needs root (network namespaces); the harness from
#                                     # build/pytest-cpp/plain (pytest tests/test_nccl_plugin.py builds it)
# Env: RATE, RUNS, PYTHON (python3), BUILD (build/pytest-cpp/plain), OUT.
# Sends traffic only inside 198.18.0.0/15 namespaces.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
RATE=${RATE:-500mbit}
RUNS=${RUNS:-3}
PYTHON=${PYTHON:-python3}
BUILD=${BUILD:-$ROOT/build/pytest-cpp/plain}
OUT=${OUT:-$ROOT/bench-results/nccl-testbed-$(date +%Y%m%d-%H%M%S)}
NICS=nic0,nic1,nic2,nic3
export PYTHONSAFEPATH=1
NETNS="$PYTHON -m jax_r2ccl testbed"
[[ $EUID -eq 0 ]] || { echo "testbed_nccl: must run as root (network namespaces)" >&2; exit 2; }
[[ -x $BUILD/nccl_plugin_harness && -f $BUILD/libnccl-net-r2ccl.so ]] ||
  { echo "testbed_nccl: no harness in $BUILD (run pytest tests/test_nccl_plugin.py first)" >&2; exit 2; }
mkdir -p "$OUT"
cd "$ROOT"
cleanup() { $NETNS down >/dev/null 2>&1 || true; }
trap cleanup EXIT
$NETNS up 2 4 "$RATE" >"$OUT/testbed.log"

plugin_bw=() plugin_rtt=() ep_bw=() ep_rtt=()
for ((k = 0; k < RUNS; k++)); do
  dir=$(mktemp -d /tmp/r2ccl-nccl-bed.XXXXXX)
  for r in 1 0; do
    timeout -k 5 120 $NETNS run "r2h$r" -- env R2CCL_NICS=$NICS "$BUILD/nccl_plugin_harness" --plugin "$BUILD/libnccl-net-r2ccl.so" \
      --dir "$dir" --rank $r --world 2 --case bandwidth --timeout 100 >"$OUT/plugin.$k.$r.log" 2>&1 &
  done
  wait
  rm -rf "$dir"
  line=$(grep -h "bandwidth rank 1: ok" "$OUT/plugin.$k.1.log") || { cat "$OUT"/plugin.$k.*.log; exit 1; }
  plugin_bw+=("$(sed -n 's/.*BW \([0-9.]*\) MB.*/\1/p' <<<"$line")")
  plugin_rtt+=("$(sed -n 's/.*RTT \([0-9.]*\) us.*/\1/p' <<<"$(grep -h 'rank 0: ok' "$OUT/plugin.$k.0.log")")")
  port=$((29650 + k))
  common=(--coordinator "198.18.0.1:$port" --num-processes 2 --nics "$NICS" --prefix "nccl-bed-$k" --sizes 4KiB,256MiB
          --iters 5 --warmup 2 --timeout 60 --no-baselines)
  timeout -k 5 300 $NETNS run r2h1 -- "$PYTHON" -m jax_r2ccl bench p2p "${common[@]}" --process-id 1 >"$OUT/endpoint.$k.1.log" 2>&1 &
  timeout -k 5 300 $NETNS run r2h0 -- "$PYTHON" -m jax_r2ccl bench p2p "${common[@]}" --process-id 0 \
    --json "$OUT/endpoint.$k.json" >"$OUT/endpoint.$k.0.log" 2>&1
  wait
  read -r bw rtt < <("$PYTHON" - "$OUT/endpoint.$k.json" <<'EOF'
import json, sys
res = json.load(open(sys.argv[1]))
rows = [r for r in res["results"] if r["impl"] == "r2ccl" and not r.get("error")]
big = next(r for r in rows if r["size_bytes"] == 256 << 20)
small = next(r for r in rows if r["size_bytes"] == 4096)
print(f"{big['algbw_GBps'] * 1000:.1f} {small['time_us_median']:.1f}")
EOF
)
  ep_bw+=("$bw") ep_rtt+=("$rtt")
done

"$PYTHON" - "${plugin_bw[*]}" "${ep_bw[*]}" "${plugin_rtt[*]}" "${ep_rtt[*]}" "$RATE" <<'EOF' | tee "$OUT/table.txt"
import statistics, sys
pb, eb, pr, er = ([float(x) for x in a.split()] for a in sys.argv[1:5])
rate = sys.argv[5]
m = statistics.median
print(f"NCCL plugin beside the endpoint, 2 hosts x 4 NICs at {rate}, {len(pb)} runs (medians; every byte checked)")
print(f"| path | 256 MiB MB/s | 4 KiB round trip us |")
print(f"|---|---|---|")
print(f"| endpoint (bench p2p) | {m(eb):.1f} | {m(er):.1f} |")
print(f"| NCCL plugin (harness, 512 KiB x 8 in flight) | {m(pb):.1f} | {m(pr):.1f} |")
print(f"| plugin / endpoint | {m(pb) / m(eb):.1%} | {m(pr) / m(er):.2f}x |")
print(f"runs: plugin {pb} MB/s, {pr} us; endpoint {eb} MB/s, {er} us")
EOF
echo "== results in $OUT"
