#!/usr/bin/env bash
# bench/build_device_wheel.sh - the wheel that travels to the GPU machine, built here.
#
# The GPU machine (docs/design.md §9, "The GPU check") has Python 3.12 and jax/jaxlib 0.11.2
# with JAX's CUDA 13 plugin, and nothing can be fetched there; a source build there costs
# minutes of a 15-minute lease and meets a newer GCC under -Werror. So the wheel is built
# here, against that Python and that jaxlib's XLA FFI headers, with the CUDA part on
# (sm_80, sm_90 and PTX, cudart linked statically), and bench/gpu_check.sh installs it there
# with `pip install --no-deps`. The script then checks what it made: the wheel's tag, and in
# a clean directory, its extension imported by that Python and jax with no GPU driver here:
# the CUDA part built, its archs, the CUDA FFI target registered, no libcudart needed.
#
#   bench/build_device_wheel.sh          # -> dist/device/jax_r2ccl-*-cp312-cp312-linux_x86_64.whl
# Env: PYTHON312 (python3.12), DEVICE_JAX (0.11.2), WHEEL_DIR (dist/device).
# The build venv is kept in build/device-venv-py312-jax$DEVICE_JAX and reused (a rebuild takes
# about a minute): jax, jaxlib, scikit-build-core and nanobind to build, and what the device
# image has for the tests (pytest, pytest-timeout), so that it also stands in for the device's
# Python in `bench/gpu_check.sh --dry-run`.
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
JAXV=${DEVICE_JAX:-0.11.2}
WHEEL_DIR=${WHEEL_DIR:-$ROOT/dist/device}
PY=${PYTHON312:-}
if [[ -z "$PY" ]]; then
  for c in python3.12 "$HOME"/.pyenv/versions/3.12*/bin/python3.12; do
    if command -v "$c" >/dev/null 2>&1 && "$c" -c 'import sys; assert sys.version_info[:2] == (3, 12)' 2>/dev/null; then
      PY=$c
      break
    fi
  done
fi
[[ -n "$PY" ]] || { echo "build_device_wheel: no Python 3.12 here (set PYTHON312)"; exit 2; }
VENV=$ROOT/build/device-venv-py312-jax$JAXV
if ! "$VENV/bin/python" -c "import jax, jaxlib, scikit_build_core, nanobind, pytest, pytest_timeout
assert jax.__version__ == '$JAXV'" 2>/dev/null; then
  echo "build_device_wheel: build venv $VENV (Python 3.12, jax/jaxlib $JAXV)"
  rm -rf "$VENV"
  "$PY" -m venv "$VENV"
  "$VENV/bin/pip" install -q "jax==$JAXV" "jaxlib==$JAXV" "scikit-build-core>=0.10" "nanobind>=2.4" \
    "pytest>=7" "pytest-timeout>=2"
fi
mkdir -p "$WHEEL_DIR"
rm -f "$WHEEL_DIR"/jax_r2ccl-*.whl
echo "build_device_wheel: $("$VENV/bin/python" -V 2>&1), jax $JAXV, $(nvcc --version | tail -2 | head -1)"
(cd "$ROOT" && "$VENV/bin/pip" wheel -q --no-deps --no-build-isolation -w "$WHEEL_DIR" \
  -C cmake.define.R2CCL_CUDA=on .)
WHEEL=$(ls "$WHEEL_DIR"/jax_r2ccl-*-cp312-cp312-linux_x86_64.whl)
echo "build_device_wheel: $WHEEL ($(du -h "$WHEEL" | cut -f1))"

# What the wheel holds, checked in a clean directory with the device's Python and jax.
CHECK=$(mktemp -d)
trap 'rm -rf "$CHECK"' EXIT
"$VENV/bin/pip" install -q --no-deps --no-compile --target "$CHECK/site" "$WHEEL"
(cd "$CHECK" && PYTHONPATH="$CHECK/site" PYTHONSAFEPATH=1 JAX_PLATFORMS=cpu "$VENV/bin/python" - <<'EOF'
import os, subprocess, jax
from jax_r2ccl import _core
assert _core.__file__.startswith(os.environ["PYTHONPATH"]), _core.__file__
info = _core.cuda_info()
assert info["built"], f"the wheel has no CUDA part: {info}"
assert info["archs"] == ["sm_80", "sm_90", "compute_90"], info
assert "r2ccl_collective" in _core.ffi_targets_cuda(), _core.ffi_targets_cuda()
ldd = subprocess.run(["ldd", _core.__file__], capture_output=True, text=True).stdout
assert "libcudart" not in ldd and "libcuda.so" not in ldd, ldd
import jax_r2ccl  # registers the FFI targets with this jax
print(f"build_device_wheel: checked: loads with jax {jax.__version__} on CPU, CUDA part built "
      f"({', '.join(info['archs'])}, CUDA runtime {info['runtime_version']}), "
      f"driver here: {info['driver_version'] or 'none'}")
EOF
)
