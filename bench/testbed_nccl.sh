#!/usr/bin/env bash
# bench/testbed_nccl.sh - the NCCL plugin's speed beside the endpoint's, on the same test beds, in
# one run (issue 35's speed table). Three parts:
#  1. link-bound: 2 hosts x 4 NICs at RATE (500mbit). For each of RUNS (3) rounds:
#     plugin    the conformance harness's bandwidth case (tests/nccl/plugin_harness.cc): 256 MiB
#               streamed in 512 KiB pieces with 8 in flight (NCCL's SIMPLE steps), every byte
#               checked, timed after 32 MiB the same way untimed (the rails come up meanwhile),
#               then the 4 KiB isend -> test round trip (median of 300)
#     endpoint  tests/nccl/endpoint_rtt.cc from C++ through the core's Endpoint: the same 256 MiB
#               in the same 512 KiB pieces, 8 in flight, every byte checked, after the same
#               untimed 32 MiB (the baseline), and
#               the same 4 KiB isend -> test round trip; and `jax-r2ccl bench p2p --sizes
#               256MiB --no-baselines` (whole 256 MiB messages from Python, every byte checked)
#  2. CPU-bound: the same on a bed at CPU_RATE (100gbit: the shaping no longer binds, the two
#     cores do), bandwidth only
#  3. ring: 4 hosts x 4 NICs at RING_RATE (200mbit) behind the bed's switch: the harness's loop
#     of the ring all-reduce alone (RING_BYTES, 16 MiB per rank, 8 slots of 256 KiB, every
#     iteration bit-exact) for 8 s; the slowest rank's median all-reduce on the wire (its
#     steps, not making and checking the data) beside the ring bound
#     2 (P-1)/P x bytes / (4 NICs' payload rate)
# and prints the table.
#   sudo bench/testbed_nccl.sh   # root (network namespaces); the harness and endpoint_rtt from
#                                # build/pytest-cpp/plain (pytest tests/test_nccl_plugin.py builds them; endpoint_rtt is tests/nccl/endpoint_rtt.cc)
# Env: RATE, CPU_RATE, RING_RATE, RING_BYTES, RUNS, PYTHON (python3), BUILD, OUT.
# Sends traffic only inside 198.18.0.0/15 namespaces.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
RATE=${RATE:-500mbit}
CPU_RATE=${CPU_RATE:-100gbit}
RING_RATE=${RING_RATE:-200mbit}
RING_BYTES=${RING_BYTES:-$((16 << 20))}
RUNS=${RUNS:-3}
PYTHON=${PYTHON:-python3}
BUILD=${BUILD:-$ROOT/build/pytest-cpp/plain}
OUT=${OUT:-$ROOT/bench-results/nccl-testbed-$(date +%Y%m%d-%H%M%S)}
NICS=nic0,nic1,nic2,nic3
export PYTHONSAFEPATH=1
NETNS="$PYTHON -m jax_r2ccl testbed"
[[ $EUID -eq 0 ]] || { echo "testbed_nccl: must run as root (network namespaces)" >&2; exit 2; }
for f in nccl_plugin_harness libnccl-net-r2ccl.so endpoint_rtt; do
  [[ -e $BUILD/$f ]] || { echo "testbed_nccl: no $f in $BUILD (run pytest tests/test_nccl_plugin.py first)" >&2; exit 2; }
done
mkdir -p "$OUT"
cd "$ROOT"
cleanup() { $NETNS down >/dev/null 2>&1 || true; }
trap cleanup EXIT

plugin_bw() {   # BED K -> "MB/s RTT_us"
  local dir r line
  dir=$(mktemp -d /tmp/r2ccl-nccl-bed.XXXXXX)
  for r in 1 0; do
    timeout -k 5 120 $NETNS run "r2h$r" -- env R2CCL_NICS=$NICS "$BUILD/nccl_plugin_harness" --plugin "$BUILD/libnccl-net-r2ccl.so" \
      --dir "$dir" --rank $r --world 2 --case bandwidth --timeout 100 >"$OUT/plugin.$1.$2.$r.log" 2>&1 &
  done
  wait
  rm -rf "$dir"
  line=$(grep -h "bandwidth rank 1: ok" "$OUT/plugin.$1.$2.1.log") || { cat "$OUT/plugin.$1.$2".*.log >&2; exit 1; }
  echo "$(sed -n 's/.*BW \([0-9.]*\) MB.*/\1/p' <<<"$line") $(sed -n 's/.*RTT \([0-9.]*\) us.*/\1/p' "$OUT/plugin.$1.$2.0.log")"
}

endpoint_bw() {   # BED K -> MB/s
  local port=$((29650 + RANDOM % 300))
  local common=(--coordinator "198.18.0.1:$port" --num-processes 2 --nics "$NICS" --prefix "nccl-bed-$1-$2" --sizes 256MiB
                --iters 5 --warmup 2 --timeout 60 --no-baselines)
  timeout -k 5 300 $NETNS run r2h1 -- "$PYTHON" -m jax_r2ccl bench p2p "${common[@]}" --process-id 1 >"$OUT/endpoint.$1.$2.1.log" 2>&1 &
  timeout -k 5 300 $NETNS run r2h0 -- "$PYTHON" -m jax_r2ccl bench p2p "${common[@]}" --process-id 0 \
    --json "$OUT/endpoint.$1.$2.json" >"$OUT/endpoint.$1.$2.0.log" 2>&1
  wait
  "$PYTHON" -c '
import json, sys
res = json.load(open(sys.argv[1]))
big = next(r for r in res["results"] if r["impl"] == "r2ccl" and not r.get("error") and r["size_bytes"] == 256 << 20)
print("%.1f" % (big["algbw_GBps"] * 1000))' "$OUT/endpoint.$1.$2.json"
}

endpoint_stream() {   # BED K -> MB/s (tests/nccl/endpoint_rtt.cc --stream: the harness's pieces through the Endpoint)
  local dir r
  dir=$(mktemp -d /tmp/r2ccl-nccl-ep.XXXXXX)
  for r in 1 0; do
    timeout -k 5 120 $NETNS run "r2h$r" -- env R2CCL_NICS=$NICS "$BUILD/endpoint_rtt" --rank $r --dir "$dir" \
      --stream $((256 << 20)) >"$OUT/endpoint_stream.$1.$2.$r.log" 2>&1 &
  done
  wait
  rm -rf "$dir"
  sed -n 's/.*BW \([0-9.]*\) MB.*/\1/p' "$OUT/endpoint_stream.$1.$2.1.log" | grep . || { cat "$OUT/endpoint_stream.$1.$2".*.log >&2; exit 1; }
}

endpoint_rtt() {   # K -> us
  local dir r
  dir=$(mktemp -d /tmp/r2ccl-nccl-rtt.XXXXXX)
  for r in 1 0; do
    timeout -k 5 120 $NETNS run "r2h$r" -- env R2CCL_NICS=$NICS "$BUILD/endpoint_rtt" --rank $r --dir "$dir" \
      >"$OUT/endpoint_rtt.$1.$r.log" 2>&1 &
  done
  wait
  rm -rf "$dir"
  sed -n 's/.*RTT \([0-9.]*\) us.*/\1/p' "$OUT/endpoint_rtt.$1.0.log" | grep . || { cat "$OUT/endpoint_rtt.$1".*.log >&2; exit 1; }
}

# 1 and 2: the two-host beds, plugin and endpoint in turn within each round.
declare -A PB PR EB ES ER
for bed in link cpu; do
  rate=$RATE
  [[ $bed == cpu ]] && rate=$CPU_RATE
  $NETNS up 2 4 "$rate" >"$OUT/testbed.$bed.log"
  for ((k = 0; k < RUNS; k++)); do
    read -r bw rtt < <(plugin_bw "$bed" "$k")
    PB[$bed]+="$bw " PR[$bed]+="$rtt "
    ES[$bed]+="$(endpoint_stream "$bed" "$k") "
    EB[$bed]+="$(endpoint_bw "$bed" "$k") "
    if [[ $bed == link ]]; then ER[$bed]+="$(endpoint_rtt "$k") "; fi
  done
done

# 3: the ring on four hosts.
$NETNS up 4 4 "$RING_RATE" >"$OUT/testbed.ring.log"
dir=$(mktemp -d /tmp/r2ccl-nccl-ring.XXXXXX)
for r in 3 2 1 0; do
  timeout -k 5 120 $NETNS run "r4h$r" -- env R2CCL_NICS=$NICS "$BUILD/nccl_plugin_harness" --plugin "$BUILD/libnccl-net-r2ccl.so" \
    --dir "$dir" --rank $r --world 4 --case loop --collective allreduce --loop-bytes "$RING_BYTES" --seconds 8 \
    --timeout 100 >"$OUT/ring.$r.log" 2>&1 &
done
wait
rm -rf "$dir"
grep -h "harness: loop" "$OUT"/ring.*.log >"$OUT/ring.txt" || { cat "$OUT"/ring.*.log; exit 1; }
[[ $(wc -l <"$OUT/ring.txt") -eq 4 ]] || { cat "$OUT"/ring.*.log; exit 1; }
ring=$(sed -n 's/.*on the wire: median \([0-9.]*\) ms.*/\1/p' "$OUT/ring.txt" | sort -n | tail -1)

"$PYTHON" - "${PB[link]}" "${ES[link]}" "${PR[link]}" "${ER[link]}" "${PB[cpu]}" "${ES[cpu]}" "$RATE" "$CPU_RATE" \
  "$ring" "$RING_RATE" "$RING_BYTES" "${EB[link]}" "${EB[cpu]}" <<'PY' | tee "$OUT/table.txt"
import re, statistics, sys
pb, eb, pr, er, cpb, ceb = ([float(x) for x in a.split()] for a in sys.argv[1:7])
rate, cpu_rate, ring_ms, ring_rate, ring_bytes = sys.argv[7], sys.argv[8], float(sys.argv[9]), sys.argv[10], int(sys.argv[11])
wb, cwb = ([float(x) for x in a.split()] for a in sys.argv[12:14])
m = statistics.median
def bps(r):
    n, unit = re.fullmatch(r"([0-9.]+)([kmg])bit", r).groups()
    return float(n) * {"k": 1e3, "m": 1e6, "g": 1e9}[unit]
P = 4
payload = 4 * bps(ring_rate) / 8 * 0.957   # 4 NICs; TCP/IP headers take ~4.3% of a 1500-byte frame
bound_ms = 2 * (P - 1) / P * ring_bytes / payload * 1e3
print(f"NCCL plugin beside the endpoint, one run, medians of {len(pb)} rounds (every byte checked)")
print("| measure | endpoint | NCCL plugin | plugin / endpoint | best round of each | target |")
print("|---|---|---|---|---|---|")
print(f"| 256 MiB in 512 KiB pieces, 8 in flight, 2 hosts x 4 NICs at {rate} (link-bound), MB/s | {m(eb):.1f} | {m(pb):.1f} | {m(pb) / m(eb):.1%} | {max(pb) / max(eb):.1%} | >= 95% |")
print(f"| the same at {cpu_rate} (CPU-bound), MB/s | {m(ceb):.1f} | {m(cpb):.1f} | {m(cpb) / m(ceb):.1%} | {max(cpb) / max(ceb):.1%} | >= 90% |")
print(f"| 4 KiB isend -> test round trip at {rate}, us (endpoint: C++) | {m(er):.1f} | {m(pr):.1f} | {m(pr) / m(er):.2f}x | {min(pr) / min(er):.2f}x | <= 1.2x |")
print(f"| ring all-reduce, 4 hosts x 4 NICs at {ring_rate}, {ring_bytes >> 20} MiB per rank, median ms | bound {bound_ms:.1f} | {ring_ms:.1f} | {bound_ms / ring_ms:.1%} of the bound | - | >= 95% |")
print(f"whole 256 MiB messages through the endpoint from Python (bench p2p): {m(wb):.1f} MB/s at {rate}, "
      f"{m(cwb):.1f} MB/s at {cpu_rate}")
print(f"rounds: link plugin {pb} MB/s, endpoint {eb} MB/s; cpu plugin {cpb}, endpoint {ceb}; "
      f"round trip plugin {pr} us, endpoint {er} us; bench p2p {wb}, {cwb} MB/s")
PY
echo "== results in $OUT"
