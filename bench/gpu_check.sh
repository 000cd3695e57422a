#!/usr/bin/env bash
# bench/gpu_check.sh - the one prepared GPU check, for a machine with one GPU (an H200), no
# network, and its own jax + CUDA plugin (see ../shared/FACTS.md): in one run of at most 8
# minutes it builds jax_r2ccl from this tree, runs the `gpu` tests (two processes sharing the
# GPU over loopback rails) and prints the table of bench/gpu's rows measured in this run,
# then checks them against the targets:
#   staging D2H/H2D >= 80% of a plain pinned cudaMemcpy, reduction kernels >= 85% of a
#   device-to-device copy (at >= 64 MiB), 8-byte psum FFI overhead <= 30 us.
#
#   bench/gpu_check.sh              # on the GPU machine; results in $OUT (default bench-results/gpu-<time>)
#   bench/gpu_check.sh --dry-run    # anywhere: every step but those that touch CUDA (CPU platform,
#                                   # the gpu tests collected and skipped, no device rows)
# Env: PYTHON (python3), OUT, PORT (29700), PROCS (2), R2CCL_* (passed through).
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
DRY=0
if [[ "${1:-}" == "--dry-run" ]]; then DRY=1; fi
PYTHON=${PYTHON:-python3}
PORT=${PORT:-29700}
PROCS=${PROCS:-2}
OUT=${OUT:-$ROOT/bench-results/gpu-$(date +%Y%m%d-%H%M%S)}
NICS=127.0.0.1,127.0.0.2
export PYTHONSAFEPATH=1          # children import the installed jax_r2ccl, not this checkout's source
export TF_CPP_MIN_LOG_LEVEL=${TF_CPP_MIN_LOG_LEVEL:-2}
START=$(date +%s)
mkdir -p "$OUT"
status=0

step() { echo "== [$(( $(date +%s) - START ))s] $*"; }
fail() { echo "gpu_check: FAIL: $*"; status=1; }

# procs TIMEOUT_S ENV... -- ARGS... : PROCS processes of `python -m jax_r2ccl ARGS --process-id i`.
procs() {
  local t=$1; shift
  local envs=()
  while [[ "$1" != "--" ]]; do envs+=("$1"); shift; done
  shift
  local pids=() i rc=0
  for ((i = 0; i < PROCS; i++)); do
    env "${envs[@]}" timeout "$t" "$PYTHON" -m jax_r2ccl "$@" --coordinator "127.0.0.1:$PORT" \
      --num-processes "$PROCS" --process-id "$i" --nics "$NICS" &
    pids+=($!)
  done
  for i in "${pids[@]}"; do wait "$i" || rc=1; done
  PORT=$((PORT + 1))
  return $rc
}

step "environment (dry run: $DRY); results in $OUT"
"$PYTHON" -V
"$PYTHON" -c 'import jax, jaxlib; print("jax", jax.__version__, "jaxlib", jaxlib.__version__)'
if [[ $DRY == 0 ]]; then
  nvidia-smi -L || fail "nvidia-smi found no GPU"
  timeout 60 "$PYTHON" -c 'import jax; print("cuda devices:", jax.devices("cuda"))' || fail "JAX sees no cuda device"
fi

step "build: pip install --no-build-isolation --no-deps . (the CUDA part: R2CCL_CUDA=on)"
(cd "$ROOT" && timeout 300 "$PYTHON" -m pip install -q --no-build-isolation --no-deps \
  -C cmake.define.R2CCL_CUDA=on .) || { fail "build"; exit 1; }
(cd "$OUT" && "$PYTHON" -c '
from jax_r2ccl import _core
i = _core.cuda_info()
print("cuda part:", {k: i[k] for k in ("built", "runtime_version", "driver_version", "devices", "archs", "error")})
assert i["built"], "the CUDA part was not built"
') || fail "the CUDA part"

if [[ $DRY == 0 ]]; then
  step "two processes share the GPU (XLA_PYTHON_CLIENT_MEM_FRACTION=0.40 each)"
  share='import jax, jax.numpy as jnp; x = jnp.ones((1 << 26,), jnp.float32); print("shared GPU ok:", float(x.sum()))'
  (cd "$OUT" && XLA_PYTHON_CLIENT_MEM_FRACTION=0.40 timeout 60 "$PYTHON" -c "$share" &
   XLA_PYTHON_CLIENT_MEM_FRACTION=0.40 timeout 60 "$PYTHON" -c "$share"; wait) || fail "two JAX processes on one GPU"
fi

step "gpu tests: pytest -m gpu (and the CUDA build and lowering tests)"
# from $OUT: the installed package, not the checkout, is what runs
(cd "$OUT" && R2CCL_TEST_GPU_PROCESSES=$PROCS timeout 270 "$PYTHON" -m pytest -q -rs -p no:cacheprovider \
  "$ROOT/tests/test_gpu.py" "$ROOT/tests/test_cuda_build.py" 2>&1 | tee "$OUT/pytest.txt") || fail "gpu tests"
if [[ $DRY == 0 ]] && grep -q "skipped" "$OUT/pytest.txt"; then
  grep -q "^SKIPPED.*test_gpu" "$OUT/pytest.txt" && fail "gpu tests were skipped on the GPU machine"
fi

step "64 MiB psum on CPU (the baseline row), $PROCS processes over loopback rails"
procs 90 JAX_PLATFORMS=cpu -- bench allreduce --sizes 8B,64MiB --iters 5 --warmup 1 \
  --json "$OUT/cpu.json" | tee "$OUT/cpu.txt" || fail "CPU bench"

if [[ $DRY == 0 ]]; then
  step "the GPU table"
  procs 150 JAX_PLATFORMS=cuda -- bench gpu --platform cuda --sizes 64MiB --iters 10 --cpu-json "$OUT/cpu.json" \
    --json "$OUT/gpu.json" | tee "$OUT/gpu.txt" || fail "GPU bench"
else
  step "the GPU table's collective rows on CPU (dry run: no device rows)"
  procs 150 JAX_PLATFORMS=cpu -- bench gpu --platform cpu --device-rows off --sizes 16MiB --iters 3 \
    --small-iters 50 --cpu-json "$OUT/cpu.json" --json "$OUT/gpu.json" | tee "$OUT/gpu.txt" || fail "GPU bench (dry)"
fi

step "targets"
"$PYTHON" - "$OUT/gpu.json" "$DRY" <<'EOF' || status=1
import json, sys
res = json.load(open(sys.argv[1]))
dry = sys.argv[2] == "1"
bad = res["wrong"] > 0
print(f"  results checked: {'WRONG ' + str(res['wrong']) if res['wrong'] else 'all exact'}")
for r in res["results"]:
    w = r["what"]
    if w.startswith("staging"):
        ok = r["ratio"] >= 0.80
        print(f"  {w}: {r['ours']:.2f} GB/s = {r['ratio']:.0%} of pinned cudaMemcpy (target >= 80%): {'ok' if ok else 'MISSED'}")
    elif w.startswith("reduce kernel"):
        ok = r["ratio"] >= 0.85
        print(f"  {w}: {r['ours']:.1f} GB/s touched = {r['ratio']:.0%} of a D2D copy (target >= 85%): {'ok' if ok else 'MISSED'}")
    elif "FFI overhead" in w:
        ok = dry or r["ours"] <= 30.0
        print(f"  {w}: {r['ours']:.1f} us over a {r['base']:.1f} us transport round trip (target <= 30 us): "
              f"{'ok' if r['ours'] <= 30.0 else 'MISSED'}{' (dry run: CPU, not judged)' if dry else ''}")
    else:
        ok = True
        print(f"  {w} {r['size']}: {r['ours']:.3f} GB/s" + (f" beside {r['base']:.3f} GB/s on CPU" if r.get("base") else ""))
    bad |= not ok
sys.exit(1 if bad else 0)
EOF
step "done in $(( $(date +%s) - START )) s: $([[ $status == 0 ]] && echo PASS || echo FAIL); results in $OUT"
exit $status
