#!/usr/bin/env bash
# bench/testbed_nccl_devices.sh - the NCCL plugin's two device models side by side on one test
# bed (2 hosts x 4 NICs at RATE, 500mbit), in one run (docs/design.md §12):
#   fused  R2CCL_NCCL_DEVICES=fused: one device striped over every NIC
#   nic    R2CCL_NCCL_DEVICES=nic: one device per NIC, the host's other NICs its backups
# Each with 1 connection (one process per host: one GPU's traffic) and with 4 (four process
# pairs at once on devices 0-3: four GPUs, each given its own NIC as NCCL would), the
# conformance harness's bandwidth case (BYTES per pair in 512 KiB pieces, 8 in flight, every
# byte checked). Prints MB/s per pair and in all, and what host 0's NICs sent (the kernel's
# counters): where the bytes went.
#   sudo bench/testbed_nccl_devices.sh   # root (namespaces); the harness from build/pytest-cpp/plain
# Env: RATE, BYTES (128 MiB), PYTHON (python3), BUILD (build/pytest-cpp/plain), OUT.
# Sends traffic only inside 198.18.0.0/15 namespaces.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
RATE=${RATE:-500mbit}
BYTES=${BYTES:-$((128 << 20))}
PYTHON=${PYTHON:-python3}
BUILD=${BUILD:-$ROOT/build/pytest-cpp/plain}
OUT=${OUT:-$ROOT/bench-results/nccl-devices-$(date +%Y%m%d-%H%M%S)}
NICS=nic0,nic1,nic2,nic3
export PYTHONSAFEPATH=1
NETNS="$PYTHON -m jax_r2ccl testbed"
[[ $EUID -eq 0 ]] || { echo "testbed_nccl_devices: must run as root (network namespaces)" >&2; exit 2; }
[[ -x $BUILD/nccl_plugin_harness && -f $BUILD/libnccl-net-r2ccl.so ]] ||
  { echo "testbed_nccl_devices: no harness in $BUILD (run pytest tests/test_nccl_plugin.py first)" >&2; exit 2; }
mkdir -p "$OUT"
cd "$ROOT"
cleanup() { $NETNS down >/dev/null 2>&1 || true; }
trap cleanup EXIT
$NETNS up 2 4 "$RATE" >"$OUT/testbed.log"

tx() { ip -n r2h0 -j -s link show | "$PYTHON" -c '
import json, sys
d = {i["ifname"]: i["stats64"]["tx"]["bytes"] for i in json.load(sys.stdin)}
print(" ".join(str(d[f"nic{k}"]) for k in range(4)))'; }

run() {   # MODE PAIRS -> one table row
  local mode=$1 pairs=$2 k r before after
  read -ra before < <(tx)
  for ((k = 0; k < pairs; k++)); do
    local dir dev=$k
    dir=$(mktemp -d /tmp/r2ccl-nccl-dev.XXXXXX)
    [[ $mode == fused ]] && dev=0
    for r in 1 0; do
      timeout -k 5 300 $NETNS run "r2h$r" -- env R2CCL_NICS=$NICS R2CCL_NCCL_DEVICES=$mode "$BUILD/nccl_plugin_harness" \
        --plugin "$BUILD/libnccl-net-r2ccl.so" --dir "$dir" --rank $r --world 2 --case bandwidth --bytes "$BYTES" \
        --dev $dev --timeout 250 >"$OUT/$mode.$pairs.$k.$r.log" 2>&1 &
    done
  done
  wait
  read -ra after < <(tx)
  local bws=() total=0 line bw
  for ((k = 0; k < pairs; k++)); do
    line=$(grep -h "bandwidth rank 1: ok" "$OUT/$mode.$pairs.$k.1.log") || { cat "$OUT/$mode.$pairs.$k".*.log; exit 1; }
    bw=$(sed -n 's/.*BW \([0-9.]*\) MB.*/\1/p' <<<"$line")
    bws+=("$bw")
    total=$("$PYTHON" -c "print(f'{$total + $bw:.1f}')")
  done
  local sent=""
  for k in 0 1 2 3; do sent+="$("$PYTHON" -c "print(f'{(${after[$k]} - ${before[$k]}) / 1e6:.0f}')") "; done
  echo "| $mode | $pairs | ${bws[*]} | $total | $sent|"
}

{
  echo "NCCL plugin device models, 2 hosts x 4 NICs at $RATE, $((BYTES >> 20)) MiB per pair (every byte checked)"
  echo "| R2CCL_NCCL_DEVICES | pairs (devices) | MB/s per pair | sum of the pairs | host 0 sent, MB: nic0 nic1 nic2 nic3 |"
  echo "|---|---|---|---|---|"
  run fused 1
  run nic 1
  run fused 4
  run nic 4
} | tee "$OUT/table.txt"
echo "== results in $OUT"
