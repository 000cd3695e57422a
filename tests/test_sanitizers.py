"""The transport, health-monitor, plan and staging-pipeline tests once more, with the C++ core
built under AddressSanitizer + UBSan.

Builds jax_r2ccl._core with -DR2CCL_SANITIZE=ON in build/pytest-asan, stages it beside a
copy of the Python package, and runs tests/test_transport.py, test_health.py, test_plans.py
test_staging.py, test_core_faults.py and test_communicator.py in a child pytest with the
sanitizer runtimes preloaded (leak checking off: CPython itself does not free everything).
Any ASan or UBSan report fails the run."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from test_cpp import _cmake, _compiler, _ninja

ROOT = Path(__file__).resolve().parent.parent
BUILD = ROOT / "build" / "pytest-asan"


def _runtime(name: str, cxx: str) -> str | None:
    out = subprocess.run([cxx, f"-print-file-name={name}"], capture_output=True, text=True).stdout.strip()
    return out if out and os.path.isabs(out) and os.path.exists(out) else None


@pytest.mark.timeout(1500)
def test_transport_suite_is_clean_under_asan_and_ubsan(tmp_path):
    cmake, ninja, cxx = _cmake(), _ninja(), _compiler()
    if not (cmake and ninja and cxx):
        pytest.skip("needs cmake, ninja and a C++ compiler")
    asan, ubsan = _runtime("libasan.so", cxx), _runtime("libubsan.so", cxx)
    if not (asan and ubsan):
        pytest.skip("the compiler has no libasan/libubsan runtime")
    BUILD.mkdir(parents=True, exist_ok=True)
    cfg = cmake + ["-S", str(ROOT), "-B", str(BUILD), "-G", "Ninja", f"-DCMAKE_MAKE_PROGRAM={ninja}",
                   f"-DPython_EXECUTABLE={sys.executable}", "-DR2CCL_SANITIZE=ON", "-DCMAKE_BUILD_TYPE=RelWithDebInfo"]
    r = subprocess.run(cfg, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout + r.stderr
    r = subprocess.run([ninja, "-C", str(BUILD), "_core"], capture_output=True, text=True, timeout=1200)
    assert r.returncode == 0, r.stdout[-5000:] + r.stderr[-5000:]
    so = next(BUILD.glob("_core*.so"))
    import jax_r2ccl
    stage = tmp_path / "site"
    shutil.copytree(Path(jax_r2ccl.__file__).parent, stage / "jax_r2ccl",
                    ignore=shutil.ignore_patterns("_core*.so", "__pycache__"))
    shutil.copy(so, stage / "jax_r2ccl" / so.name)
    env = dict(os.environ)
    env["PYTHONPATH"] = str(stage)
    env["LD_PRELOAD"] = f"{asan}:{ubsan}"
    env["ASAN_OPTIONS"] = "detect_leaks=0:abort_on_error=0:halt_on_error=1:exitcode=86"
    env["UBSAN_OPTIONS"] = "print_stacktrace=1:halt_on_error=1:exitcode=87"
    r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--timeout=600",
                        "-m", "not timing",   # rates and times: asserted in the plain run
                        *(str(ROOT / "tests" / f) for f in ("test_transport.py", "test_health.py", "test_plans.py",
                                                             "test_staging.py", "test_core_faults.py",
                                                             "test_communicator.py"))],
                       capture_output=True, text=True, timeout=1400, env=env, cwd=str(tmp_path))
    report = r.stdout[-8000:] + r.stderr[-4000:]
    assert r.returncode == 0, report
    assert "ERROR: AddressSanitizer" not in report and "runtime error:" not in report, report
    assert str(stage) in subprocess.run(
        [sys.executable, "-c", "import jax_r2ccl; print(jax_r2ccl.__file__)"], env=env, cwd=str(tmp_path),
        capture_output=True, text=True).stdout, "the child did not import the sanitized build"
