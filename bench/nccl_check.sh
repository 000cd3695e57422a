#!/usr/bin/env bash
# bench/nccl_check.sh - the NCCL plugin under NCCL on a lent GPU (docs/design.md §12), at most
# BUDGET seconds (240). bench/gpu_check.sh runs it at its end when time remains; alone it
# installs the carried wheel itself. Steps, one PASS/FAIL/SKIPPED line each:
#   1 plugin     the installed libnccl-net-r2ccl.so, and `jax-r2ccl doctor`'s NCCL section: the
#                libnccl.so.2 this process would load, its version, the tables it looks up
#   2 ours       bench/nccl_smoke.py --transport r2ccl: two JAX processes on the one GPU as two
#                hosts (NCCL_HOSTID), a plain jit (sum over the sharded axis, reshard, gather)
#                checked against numpy every step, rail 1 of every plugin connection closed
#                mid-loop and healed; NCCL's own INFO lines quoted to show the plugin carried it
#   3 nccl       the same loop over NCCL's socket transport (NCCL_NET=Socket) on the same
#                loopback: the healthy step time beside ours (target: ours <= 1.05x)
#   4 cut        root only: one address (127.0.0.1) cut by iptables mid-loop, for both: ours
#                must stay exact and on; NCCL's error and how long it took are reported
#   bench/nccl_check.sh            # on the GPU machine
#   bench/nccl_check.sh --dry-run  # here: the plugin, doctor and the loop on JAX's CPU backend
# Env: PYTHON, OUT (bench-results/nccl-<time>), SITE (an install to use: gpu_check's), BUDGET,
#      R2CCL_NCCL_MULTI_RANK=1 (also set NCCL_MULTI_RANK_GPU_ENABLE=1, NCCL 2.30+, if NCCL
#      refuses two ranks on one GPU despite NCCL_HOSTID).
set -uo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
DRY=0
[[ "${1:-}" == "--dry-run" ]] && DRY=1
if [[ -z "${PYTHON:-}" ]]; then
  PYTHON=python3
  if [[ $DRY == 1 ]]; then
    for v in "$ROOT"/build/device-venv-py312-*/bin/python; do [[ -x "$v" ]] && PYTHON=$v; done
  fi
fi
BUDGET=${BUDGET:-240}
OUT=${OUT:-$ROOT/bench-results/nccl-$(date +%Y%m%d-%H%M%S)}
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
WORK=$(mktemp -d /tmp/r2ccl-nccl-check.XXXXXX)
LOGS=$OUT/logs
mkdir -p "$LOGS"
START=$(date +%s)
FAILED=()
export PYTHONSAFEPATH=1 PYTHONUNBUFFERED=1 TF_CPP_MIN_LOG_LEVEL=${TF_CPP_MIN_LOG_LEVEL:-2}

now() { echo $(( $(date +%s) - START )); }
say() { echo "$*" | tee -a "$OUT/summary.txt"; }
pass() { say "[$(now)s] nccl $1: PASS${2:+ - $2}"; }
fail() { say "[$(now)s] nccl $1: FAIL - $2"; FAILED+=("$1"); }
skip() { say "[$(now)s] nccl $1: SKIPPED - $2"; }
left() { echo $(( BUDGET - $(now) - 10 )); }
finish() {
  rm -rf "$WORK"
  if [[ ${#FAILED[@]} == 0 ]]; then say "nccl_check: PASS in $(now) s (dry run: $DRY); results in $OUT"
  else say "nccl_check: FAIL (${FAILED[*]}) in $(now) s (dry run: $DRY); results in $OUT"; fi
}
trap finish EXIT
: >"$OUT/summary.txt"

# ---------------------------------------------------------------- install (alone only)
if [[ -z "${SITE:-}" ]]; then
  tag=$("$PYTHON" -c 'import sys; print(f"cp{sys.version_info[0]}{sys.version_info[1]}")')
  WHEEL=${WHEEL:-$(ls "$ROOT"/dist/device/jax_r2ccl-*-"$tag"-"$tag"-linux_x86_64.whl 2>/dev/null | tail -1)}
  SITE=$WORK/site
  if [[ -z "$WHEEL" ]] || ! "$PYTHON" -m pip install -q --no-deps --no-index --no-compile --target "$SITE" "$WHEEL" \
      >"$LOGS/install.log" 2>&1; then
    fail "1 plugin" "no carried wheel for $tag installed (bench/build_device_wheel.sh makes one): $(tail -1 "$LOGS/install.log" 2>/dev/null)"
    exit 1
  fi
fi
export PYTHONPATH=$SITE${PYTHONPATH:+:$PYTHONPATH}

# ---------------------------------------------------------------- 1 plugin
echo "== 1 plugin"
if (cd "$WORK" && timeout 60 "$PYTHON" -m jax_r2ccl doctor) >"$LOGS/doctor.log" 2>&1 &&
   grep -q "plugin:  /" "$LOGS/doctor.log"; then
  sed -n '/NCCL net plugin/,/^$/p' "$LOGS/doctor.log" | sed 's/^/    /'
  pass "1 plugin" "$(grep -m1 '  NCCL:' "$LOGS/doctor.log" | sed 's/^ *//')"
else
  tail -20 "$LOGS/doctor.log" | sed 's/^/    /'
  fail "1 plugin" "the installed package has no plugin, or doctor failed"
fi

# ---------------------------------------------------------------- 2 ours, 3 NCCL's socket transport
plat=cuda
[[ $DRY == 1 ]] && plat=cpu
steps=${STEPS:-$([[ $DRY == 1 ]] && echo 12 || echo 60)}
smoke() {   # NAME TRANSPORT SECONDS [ARGS...]
  local name=$1 tp=$2 t=$3
  shift 3
  (( t > $(left) )) && t=$(left)
  if (( t < 20 )); then echo "    (no time left in BUDGET=$BUDGET)"; return 2; fi
  (cd "$WORK" && timeout --kill-after=10 "$t" "$PYTHON" "$ROOT/bench/nccl_smoke.py" --platform "$plat" --transport "$tp" \
    --steps "$steps" --timeout $(( t - 15 )) --logs "$LOGS" "$@") >"$LOGS/$name.log" 2>&1
  local rc=$?
  sed 's/^/    /' "$LOGS/$name.log" | tail -n 30
  return $rc
}
median_of() {   # LOG: process 0's healthy median step (ms)
  grep -m1 "process 0 " "$1" | sed -n 's/.*healthy \([0-9.]*\) ms.*/\1/p'
}

echo "== 2 ours (the plugin, a rail closed and healed mid-loop)"
if smoke ours r2ccl 110; then pass "2 ours" "$(tail -1 "$LOGS/ours.log")"
else fail "2 ours" "$(grep -E "FAIL|Error|error" "$LOGS/ours.log" | tail -1 | cut -c1-300)"; fi

echo "== 3 nccl (NCCL's socket transport, the same loop)"
if [[ $DRY == 1 ]]; then
  skip "3 nccl" "dry run: no NCCL on the CPU backend"
elif smoke socket socket 80; then
  ours=$(median_of "$LOGS/ours.log"); theirs=$(median_of "$LOGS/socket.log")
  ratio=$("$PYTHON" -c "print(f'{float(\"$ours\") / float(\"$theirs\"):.2f}')" 2>/dev/null || echo "?")
  verdict=$("$PYTHON" -c "print('on target' if float(\"$ours\") <= 1.05 * float(\"$theirs\") else 'MISSED the 1.05x target')" 2>/dev/null || echo "?")
  pass "3 nccl" "healthy step: ours ${ours} ms, NCCL socket ${theirs} ms = ${ratio}x ($verdict)"
else
  fail "3 nccl" "NCCL's own socket loop failed: $(grep -E "FAIL|Error" "$LOGS/socket.log" | tail -1 | cut -c1-300)"
fi

# ---------------------------------------------------------------- 4 one address cut, both transports
echo "== 4 cut (127.0.0.1 dropped mid-loop by iptables)"
if [[ $DRY == 1 ]]; then
  skip "4 cut" "dry run"
elif [[ $(id -u) != 0 ]] || ! command -v iptables >/dev/null; then
  skip "4 cut" "needs root and iptables (the plugin's own fault hook ran in step 2)"
else
  smoke cut_ours r2ccl 60 --cut-address 127.0.0.1
  r1=$?
  smoke cut_socket socket 60 --cut-address 127.0.0.1
  if [[ $r1 == 0 ]]; then pass "4 cut" "ours: $(tail -1 "$LOGS/cut_ours.log"); NCCL: $(grep -m1 'FAILED after' "$LOGS/cut_socket.log" | cut -c1-200)"
  else fail "4 cut" "ours did not survive the cut: $(tail -1 "$LOGS/cut_ours.log")"; fi
fi
exit $(( ${#FAILED[@]} > 0 ))
