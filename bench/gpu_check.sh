#!/usr/bin/env bash
# bench/gpu_check.sh - the one prepared GPU check: run it first whenever a GPU machine is lent.
#
# For a machine with one GPU (an H100 or H200), 16 cores, no network, its own Python 3.12,
# jax/jaxlib and JAX's CUDA plugin (docs/design.md §9, "The GPU check"). It installs the wheel
# built here by bench/build_device_wheel.sh and carried along (dist/device), and runs, in
# about 6 minutes, steps that each print one line: PASS, FAIL with the reason, or SKIPPED
# with why:
#   1 environment   python, jax and its CUDA plugin, kernel, GPU and driver, compute mode,
#                   a bind to 127.0.0.2 (the second rail), nvcc/Python.h only when building
#   2 install       the carried wheel (pip --no-deps into a folder of its own); a source build
#                   with R2CCL_WERROR=OFF only when no carried wheel fits this Python
#   3 cuda smoke    no JAX: the CUDA part's info, every dtype x op of the reduction kernels
#                   bit for bit against the host's, the pinned pool, the copy streams, host
#                   callbacks and events (staging copies of 64 MiB)
#   4 jax smoke     two processes on the GPU: an 8-byte psum, a psum of several staging
#                   chunks, all_gather, psum_scatter, bit for bit; the run ids the processes
#                   logged per call compared (bench/gpu_smoke.py)
#   5 gpu tests     tests/test_gpu.py, cheapest first, a timeout per test, then the CUDA build
#                   and lowering tests
#   6 bench         bench gpu's rows (kernels and staging copies at 1 GiB, the 8-byte psum's
#                   FFI overhead, 64 MiB psum beside the same on CPU) and their targets:
#                   staging >= 80% of a pinned cudaMemcpy, kernels >= 85% of a D2D copy,
#                   8-byte FFI overhead <= 30 us
#   7 leftovers     every process a step started is gone; the logs are in $OUT/logs.tgz
#   8 nccl          bench/nccl_check.sh (the NCCL net plugin under NCCL, one GPU as two hosts)
#                   when at least 90 s of BUDGET are left (BUDGET=560 leaves it about 4 minutes);
#                   its results in $OUT/nccl
#
#   bench/gpu_check.sh            # on the GPU machine (PYTHON: its python3)
#   bench/gpu_check.sh --dry-run  # here, no GPU: every step that does not touch CUDA, on the
#                                 # CPU platform, with the device's Python and jax stand-in
#                                 # that build_device_wheel.sh keeps (build/device-venv-*)
# Env: PYTHON, OUT (bench-results/gpu-<time>), WHEEL (dist/device/*.whl), PORT (29700),
#      PROCS (2), BUDGET (420: seconds for the whole check; each step's bound is cut to what is
#      left, so the summary and the logs always come back inside BUDGET + 30 s).
# Results in $OUT: check.log (all of this output), summary.txt (the step lines), logs.tgz
# (every step's log, each process's), cpu.json, gpu.json.
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
PORT=${PORT:-29700}
PROCS=${PROCS:-2}
BUDGET=${BUDGET:-420}
OUT=${OUT:-$ROOT/bench-results/gpu-$(date +%Y%m%d-%H%M%S)}
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
WORK=$(mktemp -d /tmp/r2ccl-gpu-check.XXXXXX)   # cwd of every step: the installed package, not this checkout
LOGS=$WORK/logs
mkdir -p "$LOGS"
PIDFILE=$WORK/pids                 # process groups the steps started (the test launchers append theirs)
: >"$PIDFILE"
export R2CCL_TEST_PIDFILE=$PIDFILE
export PYTHONSAFEPATH=1 PYTHONUNBUFFERED=1 TF_CPP_MIN_LOG_LEVEL=${TF_CPP_MIN_LOG_LEVEL:-2}
NICS=127.0.0.1,127.0.0.2
START=$(date +%s)
FAILED=()
exec > >(tee "$OUT/check.log") 2>&1

now() { echo $(( $(date +%s) - START )); }
say() { echo "$*" | tee -a "$OUT/summary.txt"; }
pass() { say "[$(now)s] $1: PASS${2:+ - $2}"; }
fail() { say "[$(now)s] $1: FAIL - $2"; FAILED+=("$1"); }
skip() { say "[$(now)s] $1: SKIPPED - $2"; }
info() { echo "    $*"; }

# The last line of a log that looks like the reason for a failure.
reason() {
  local r
  r=$(grep -E "FAIL|Error|error:|assert|Traceback|Timeout|timed out|killed at its bound" "$1" 2>/dev/null | tail -1 |
      cut -c1-300)
  echo "${r:-exit status $2; see $(basename "$1") in logs.tgz}"
}

# A step's bound: SECONDS, or what is left of the budget (less 15 s for the rest) if less.
bound() {
  local left=$(( BUDGET - $(now) - 15 ))
  (( left < $1 )) && echo $(( left > 5 ? left : 5 )) || echo "$1"
}

# run NAME SECONDS CMD...: CMD (from $WORK) in its own process group, bounded, logged.
run() {
  local name=$1 t rc
  t=$(bound "$2")
  shift 2
  (cd "$WORK" && exec setsid timeout --kill-after=10 "$t" "$@") >"$LOGS/$name.log" 2>&1 &
  local pid=$!
  echo "$pid" >>"$PIDFILE"
  wait "$pid"
  rc=$?
  [[ $rc == 124 || $rc == 137 ]] && printf "\nkilled at its bound of %s s\n" "$t" >>"$LOGS/$name.log"
  sed 's/^/    /' "$LOGS/$name.log" | tail -n 60
  return $rc
}

# procs NAME SECONDS PORT ENV... -- ARGS...: PROCS processes of `python -m jax_r2ccl ARGS`,
# each waited for by PID; fails when any of them fails.
procs() {
  local name=$1 t port=$3
  t=$(bound "$2")
  shift 3
  local envs=() pids=() i rc=0
  while [[ "$1" != "--" ]]; do envs+=("$1"); shift; done
  shift
  for ((i = 0; i < PROCS; i++)); do
    (cd "$WORK" && exec setsid env "${envs[@]}" timeout --kill-after=10 "$t" "$PYTHON" -m jax_r2ccl "$@" \
      --coordinator "127.0.0.1:$port" --num-processes "$PROCS" --process-id "$i" --nics "$NICS") \
      >"$LOGS/$name.$i.log" 2>&1 &
    pids+=($!)
    echo "$!" >>"$PIDFILE"
  done
  for i in "${!pids[@]}"; do
    wait "${pids[$i]}"
    local r=$?
    if [[ $r != 0 ]]; then
      rc=1
      [[ $r == 124 || $r == 137 ]] && echo "killed at its bound of ${t} s" >>"$LOGS/$name.$i.log"
      echo "    process $i failed (exit status $r)"
    fi
  done
  sed 's/^/    /' "$LOGS/$name.0.log" | tail -n 40
  return $rc
}

leftovers() {   # kills what is left of every process group a step started; says how many
  local n=0 g
  while read -r g; do
    [[ -n "$g" ]] || continue
    if kill -0 -- "-$g" 2>/dev/null; then kill -9 -- "-$g" 2>/dev/null; n=$((n + 1)); fi
  done <"$PIDFILE"
  echo $n
}

finish() {
  local n
  n=$(leftovers)
  if [[ $n == 0 ]]; then pass "7 leftovers" "no process of the check left running"; else
    fail "7 leftovers" "$n process group(s) were still running and were killed"; fi
  cp "$PIDFILE" "$LOGS/pids.txt" 2>/dev/null
  tar -czf "$OUT/logs.tgz" -C "$WORK" logs 2>/dev/null
  if [[ ${#FAILED[@]} == 0 ]]; then say "gpu_check: PASS in $(now) s (dry run: $DRY); results in $OUT"
  else say "gpu_check: FAIL (${FAILED[*]}) in $(now) s (dry run: $DRY); results in $OUT"; fi
  rm -rf "$WORK"
}
trap finish EXIT
: >"$OUT/summary.txt"

# ---------------------------------------------------------------- 1 environment
echo "== 1 environment (dry run: $DRY; python $PYTHON; work in $WORK)"
env_ok=1
if ! "$PYTHON" - >"$LOGS/environment.log" 2>&1 <<'EOF'
import importlib.metadata as md, platform, sys
import jax, jaxlib
print("python", platform.python_version(), "on", platform.platform())
print("jax", jax.__version__, "jaxlib", jaxlib.__version__)
for p in ("jax-cuda13-plugin", "jax-cuda12-plugin", "pytest", "pytest-timeout", "numpy", "ml_dtypes"):
    try:
        print(p, md.version(p))
    except md.PackageNotFoundError:
        print(p, "not installed")
EOF
then env_ok=0; fi
sed 's/^/    /' "$LOGS/environment.log"
info "kernel $(uname -r) ($(uname -m))"
gpu_note=""
if [[ $DRY == 0 ]]; then
  if q=$(nvidia-smi --query-gpu=name,driver_version,compute_mode,memory.total --format=csv,noheader 2>&1); then
    info "GPU: $q"
    gpu_note=$q
    if grep -qi "exclusive" <<<"$q"; then
      info "compute mode EXCLUSIVE_PROCESS: two processes cannot share the GPU; the checks run with 1 process"
      PROCS=1
    fi
  else
    info "nvidia-smi: $q"
    env_ok=0
  fi
  if ! (cd "$WORK" && timeout 60 "$PYTHON" -c 'import jax; print("    JAX cuda devices:", jax.devices("cuda"))'); then
    info "JAX sees no cuda device"
    env_ok=0
  fi
fi
if "$PYTHON" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.2", 0)); s.close()' 2>/dev/null; then
  info "127.0.0.2 binds: rails on 127.0.0.1 and 127.0.0.2"
else
  info "127.0.0.2 does not bind (a sandboxed network stack?): both rails on 127.0.0.1"
  NICS=127.0.0.1,127.0.0.1
fi
export R2CCL_TEST_RAILS=$NICS
if [[ $env_ok == 1 ]]; then pass "1 environment" "${gpu_note:-no GPU (dry run)}; $PROCS process(es); rails $NICS"
else fail "1 environment" "$(reason "$LOGS/environment.log" 1) (see above)"; fi

# ---------------------------------------------------------------- 2 install
echo "== 2 install"
tag=$("$PYTHON" -c 'import sys; print(f"cp{sys.version_info[0]}{sys.version_info[1]}")')
WHEEL=${WHEEL:-$(ls "$ROOT"/dist/device/jax_r2ccl-*-"$tag"-"$tag"-linux_x86_64.whl 2>/dev/null | tail -1)}
SITE=$WORK/site
if [[ -n "$WHEEL" && -f "$WHEEL" ]]; then
  if run install 120 "$PYTHON" -m pip install -q --no-deps --no-index --no-compile --target "$SITE" "$WHEEL"; then
    how="carried wheel $(basename "$WHEEL")"
  else
    how=""
  fi
else
  echo "    no carried wheel for $tag in dist/device (bench/build_device_wheel.sh makes one): building from source"
  for c in nvcc; do command -v $c >/dev/null || echo "    $c not found: the CUDA part cannot be built"; done
  "$PYTHON" -c 'import sysconfig, os; h = os.path.join(sysconfig.get_paths()["include"], "Python.h"); assert os.path.exists(h), h' ||
    echo "    Python.h missing: no extension can be built"
  if run build 400 "$PYTHON" -m pip install -q --no-build-isolation --no-deps --target "$SITE" \
      -C cmake.define.R2CCL_CUDA=on -C cmake.define.R2CCL_WERROR=OFF "$ROOT"; then
    how="source build (R2CCL_WERROR=OFF; log in logs.tgz)"
  else
    how=""
  fi
fi
export PYTHONPATH=$SITE${PYTHONPATH:+:$PYTHONPATH}
if [[ -n "$how" ]] && where=$(cd "$WORK" && "$PYTHON" -c 'import jax_r2ccl, os; print(os.path.dirname(jax_r2ccl.__file__))' 2>&1) &&
   [[ "$where" == "$SITE"/* ]]; then
  pass "2 install" "$how -> $where"
else
  fail "2 install" "${how:-the install failed}: jax_r2ccl imports from ${where:-nowhere}"
  exit 1
fi

# ---------------------------------------------------------------- 3 cuda smoke
echo "== 3 cuda smoke (no JAX)"
if [[ $DRY == 1 ]]; then
  skip "3 cuda smoke" "dry run: no GPU (the CUDA part's presence is checked by the tests in step 5)"
elif run cuda_smoke 90 "$PYTHON" - <<'EOF'
import numpy as np
from jax_r2ccl import _core
from jax_r2ccl.tools.bench.gpu import kernel_cases
i = _core.cuda_info()
print("cuda part:", {k: i[k] for k in ("built", "runtime_version", "driver_version", "devices", "archs", "error")})
assert i["built"] and i["devices"] > 0, "the CUDA part is not built, or sees no GPU"
bad, n = [], 0
for dtype, op, a, b, want in kernel_cases():
    n += 1
    if _core.cuda_testing_reduce(dtype, op, a.view(np.uint8), b.view(np.uint8)) != want:
        bad.append(f"{dtype}/{op}")
print(f"reduction kernels: {n - len(bad)}/{n} dtype x op bit-exact against the host" + (f"; WRONG: {bad}" if bad else ""))
assert not bad
rows = _core.cuda_bench(64 << 20, 2, 0, 4 << 20)   # pool, copy streams, host callbacks, events, kernels
for r in rows:
    print(f"{r['what']}: {r['GBps']:.1f} GB/s beside {r['baseline']} {r['baseline_GBps']:.1f} GB/s (64 MiB)")
print("cuda smoke ok")
EOF
then pass "3 cuda smoke" "kernels bit-exact for every dtype x op; pool, copy streams, callbacks, events ran"
else fail "3 cuda smoke" "$(reason "$LOGS/cuda_smoke.log" $?)"; fi

# ---------------------------------------------------------------- 4 jax smoke
echo "== 4 jax smoke ($PROCS processes)"
plat=cuda
[[ $DRY == 1 ]] && plat=cpu
if run jax_smoke 150 "$PYTHON" "$ROOT/bench/gpu_smoke.py" --platform "$plat" --processes "$PROCS" --timeout 120 --logs "$LOGS"; then
  pass "4 jax smoke" "on $plat: $(grep -E "run ids" "$LOGS/jax_smoke.log" | tail -1 | sed 's/^ *//')"
else
  fail "4 jax smoke" "$(reason "$LOGS/jax_smoke.log" $?)"
fi

# ---------------------------------------------------------------- 5 tests
echo "== 5 gpu tests"
T=tests/test_gpu.py
GPU_TESTS=("$ROOT/$T::test_reduction_kernels_match_the_host_bit_for_bit"
           "$ROOT/$T::test_where_gpu_and_cpu_arithmetic_differ_r2ccl_follows_the_cpu_rules"
           "$ROOT/$T::test_processes_that_disagree_on_gpu_get_an_error_on_every_process"
           "$ROOT/$T::test_a_training_step_on_gpu_through_the_lowering_swap"
           "$ROOT/$T::test_a_rail_failure_mid_collective_on_gpu_is_bit_exact"
           "$ROOT/$T::test_every_op_and_dtype_on_gpu_is_bit_exact"
           "$ROOT/tests/test_cuda_build.py")
# dry run: the GPU tests' workers on CPU, with no XLA collective across processes
[[ $DRY == 1 ]] && GPU_TESTS+=("$ROOT/tests/test_gpu_workers.py")
# a launch ends (its ranks' stacks dumped 10 s before) before pytest's own per-test timeout
if run pytest 240 env R2CCL_TEST_GPU_PROCESSES="$PROCS" R2CCL_TEST_RANK_TIMEOUT=105 "$PYTHON" -m pytest -q -rA --tb=short -p no:cacheprovider \
    --timeout=120 "${GPU_TESTS[@]}"; then
  summary=$(tail -1 "$LOGS/pytest.log")
  if [[ $DRY == 0 ]] && grep -q "^SKIPPED.*test_gpu" "$LOGS/pytest.log"; then
    fail "5 gpu tests" "gpu tests were skipped on the GPU machine: $(grep "^SKIPPED.*test_gpu" "$LOGS/pytest.log" | head -1)"
  else
    pass "5 gpu tests" "$summary"
  fi
else
  fail "5 gpu tests" "$(grep -E "^(FAILED|ERROR)" "$LOGS/pytest.log" | head -3 | tr '\n' ' ') $(tail -1 "$LOGS/pytest.log")"
fi

# ---------------------------------------------------------------- 6 bench
echo "== 6 bench gpu"
bench_ok=1
procs bench_cpu 90 "$PORT" JAX_PLATFORMS=cpu -- bench allreduce --sizes 8B,64MiB --iters 5 --warmup 1 \
  --json "$OUT/cpu.json" || bench_ok=0
if [[ $DRY == 0 ]]; then
  procs bench_gpu 150 "$((PORT + 1))" JAX_PLATFORMS=cuda -- bench gpu --platform cuda --sizes 64MiB --iters 10 \
    --device-bytes 1GiB --cpu-json "$OUT/cpu.json" --json "$OUT/gpu.json" || bench_ok=0
else
  procs bench_gpu 150 "$((PORT + 1))" JAX_PLATFORMS=cpu -- bench gpu --platform cpu --device-rows off --sizes 16MiB \
    --iters 3 --small-iters 50 --cpu-json "$OUT/cpu.json" --json "$OUT/gpu.json" || bench_ok=0
fi
if [[ $bench_ok == 1 ]] && (cd "$WORK" && "$PYTHON" - "$OUT/gpu.json" "$DRY" <<'EOF'
import json, sys
res = json.load(open(sys.argv[1]))
dry = sys.argv[2] == "1"
bad = res["wrong"] > 0
print(f"    results checked: {'WRONG ' + str(res['wrong']) if res['wrong'] else 'all exact'}")
for r in res["results"]:
    w = r["what"]
    if w.startswith("staging"):
        ok = r["ratio"] >= 0.80
        print(f"    {w} {r['size']}: {r['ours']:.2f} GB/s = {r['ratio']:.0%} of pinned cudaMemcpy (target >= 80%): {'ok' if ok else 'MISSED'}")
    elif w.startswith("reduce kernel"):
        ok = r["ratio"] >= 0.85
        print(f"    {w} {r['size']}: {r['ours']:.1f} GB/s touched = {r['ratio']:.0%} of a D2D copy (target >= 85%): {'ok' if ok else 'MISSED'}")
    elif "FFI overhead" in w:
        ok = dry or r["ours"] <= 30.0
        print(f"    {w}: {r['ours']:.1f} us over a {r['base']:.1f} us transport round trip (target <= 30 us): "
              f"{'not judged (dry run: CPU)' if dry else 'ok' if ok else 'MISSED'}")
    else:
        ok = True
        print(f"    {w} {r['size']}: {r['ours']:.3f} GB/s" + (f" beside {r['base']:.3f} GB/s on CPU" if r.get("base") else ""))
    bad |= not ok
sys.exit(1 if bad else 0)
EOF
); then
  pass "6 bench" "every row exact and on target (the table is in bench_gpu.0.log and gpu.json)"
else
  fail "6 bench" "$([[ $bench_ok == 0 ]] && echo "a bench process failed: $(reason "$LOGS/bench_gpu.0.log" 1)" || echo "a row missed its target or was wrong (above)")"
fi
# ---------------------------------------------------------------- 8 nccl
echo "== 8 nccl (bench/nccl_check.sh: the NCCL plugin under NCCL)"
nleft=$(( BUDGET - $(now) - 20 ))
if (( nleft < 90 )); then
  skip "8 nccl" "${nleft} s left of BUDGET=$BUDGET (the NCCL check needs 90 s or more: BUDGET=560 leaves it about 4 minutes)"
elif (cd "$WORK" && SITE=$SITE PYTHON=$PYTHON BUDGET=$nleft OUT=$OUT/nccl setsid "$ROOT/bench/nccl_check.sh" \
      $([[ $DRY == 1 ]] && echo --dry-run)) >"$LOGS/nccl_check.log" 2>&1; then
  sed 's/^/    /' "$LOGS/nccl_check.log" | tail -n 40
  pass "8 nccl" "$(tail -1 "$OUT/nccl/summary.txt")"
else
  sed 's/^/    /' "$LOGS/nccl_check.log" | tail -n 40
  fail "8 nccl" "$(grep -E 'FAIL' "$OUT/nccl/summary.txt" 2>/dev/null | head -2 | tr '\n' ' ')"
fi
exit $(( ${#FAILED[@]} > 0 ))
