"""The transport, health-monitor, plan and staging-pipeline tests once more, with the C++ core
built under AddressSanitizer + UBSan, and the transport, collective, monitor, staging and JAX
suites with it built under ThreadSanitizer.

Builds jax_r2ccl._core with -DR2CCL_SANITIZE=ON in build/pytest-asan, stages it beside a
copy of the Python package, and runs tests/test_transport.py, test_health.py, test_plans.py
test_staging.py, test_core_faults.py, test_communicator.py, test_ring.py and test_shutdown.py (JAX programs
shut down with steps in flight) in a child pytest with the
sanitizer runtimes preloaded (leak checking off: CPython itself does not free everything).
Any ASan or UBSan report fails the run."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.proof    # the suites again under ASan/UBSan and TSan

from test_cpp import SANITIZED_DIRS, _cmake, _compiler, _ninja, configure
from test_nccl_plugin import run_harness

ROOT = Path(__file__).resolve().parent.parent
# The engine, executor and monitor threads (transport, host collectives, health), the staging
# pipeline's threads, and XLA's calling threads: two JAX programs (an r2ccl psum beside XLA's
# own collective; a mismatch failing on every process). The whole JAX suite under TSan takes
# over half an hour here (JAX itself runs 5-15x slower), so it runs in the plain suite only.
TSAN_SUITES = ("test_transport.py", "test_health.py", "test_communicator.py", "test_host_collectives.py",
               "test_core_faults.py", "test_staging.py", "test_ring.py")
TSAN_JAX = ("test_jax_collectives.py::test_xla_collective_after_an_r2ccl_one_in_the_same_program_does_not_deadlock",
            "test_jax_collectives.py::test_mismatched_shapes_across_processes_fail_everywhere_without_hang",
            # shutdown with steps in flight (issue 32): XLA's threads, the completion pool, the
            # executor and the engine all finishing calls while the communicator closes
            "test_shutdown.py::test_shutdown_with_steps_in_flight_waits_for_them_and_every_result_is_exact[2proc]",
            "test_shutdown.py::test_a_peer_that_closes_first_fails_the_others_calls_at_once")


def _runtime(name: str, cxx: str) -> str | None:
    out = subprocess.run([cxx, f"-print-file-name={name}"], capture_output=True, text=True).stdout.strip()
    return out if out and os.path.isabs(out) and os.path.exists(out) else None


def _build_and_stage(variant: str, stage: Path) -> None:
    """Builds _core in the sanitizer's build folder (shared with tests/test_cpp.py, which builds
    the C++ tests there: one compile of the core library per sanitizer) and stages it beside a
    copy of the package."""
    build = configure(variant)
    assert build == SANITIZED_DIRS[variant]
    r = subprocess.run([_ninja(), "-C", str(build), "_core"], capture_output=True, text=True, timeout=1200)
    assert r.returncode == 0, r.stdout[-5000:] + r.stderr[-5000:]
    so = next(build.glob("_core*.so"))
    import jax_r2ccl
    shutil.copytree(Path(jax_r2ccl.__file__).parent, stage / "jax_r2ccl",
                    ignore=shutil.ignore_patterns("_core*.so", "__pycache__"))
    shutil.copy(so, stage / "jax_r2ccl" / so.name)


DURATIONS = ROOT / "build" / "sanitizer-durations"   # the child runs' slowest tests (.ci/run prints them)


def _run_suites(stage: Path, env: dict, suites: tuple, cwd: Path, label: str):
    env = dict(env, PYTHONPATH=str(stage), R2CCL_SANITIZED_RUN="1")
    env.pop("PYTEST_ADDOPTS", None)     # CI's --require-all is the outer run's (the child leaves tests out)
    r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--timeout=600",
                        "--durations=15",     # where the instrumented run spends its time (printed below)
                        "-m", "not timing",   # rates and times: asserted in the plain run
                        *(str(ROOT / "tests" / f) for f in suites)],
                       capture_output=True, text=True, timeout=1400, env=env, cwd=str(cwd))
    slowest = r.stdout[r.stdout.find("slowest"):] if "slowest" in r.stdout else r.stdout[-3000:]
    DURATIONS.mkdir(parents=True, exist_ok=True)
    (DURATIONS / f"{label}.txt").write_text(slowest)
    print(f"{label}:\n{slowest}")
    assert str(stage) in subprocess.run(
        [sys.executable, "-c", "import jax_r2ccl; print(jax_r2ccl.__file__)"], env=env, cwd=str(cwd),
        capture_output=True, text=True).stdout, "the child did not import the sanitized build"
    return r


def _need_tools():
    if not (_cmake() and _ninja() and _compiler()):
        pytest.skip("needs cmake, ninja and a C++ compiler")


@pytest.mark.timeout(1500)
def test_transport_suite_is_clean_under_asan_and_ubsan(tmp_path):
    _need_tools()
    cxx = _compiler()
    asan, ubsan = _runtime("libasan.so", cxx), _runtime("libubsan.so", cxx)
    if not (asan and ubsan):
        pytest.skip("the compiler has no libasan/libubsan runtime")
    stage = tmp_path / "site"
    _build_and_stage("sanitize", stage)
    env = dict(os.environ)
    env["LD_PRELOAD"] = f"{asan}:{ubsan}"
    env["ASAN_OPTIONS"] = "detect_leaks=0:abort_on_error=0:halt_on_error=1:exitcode=86"
    env["UBSAN_OPTIONS"] = "print_stacktrace=1:halt_on_error=1:exitcode=87"
    r = _run_suites(stage, env, ("test_transport.py", "test_health.py", "test_plans.py", "test_staging.py",
                                 "test_core_faults.py", "test_communicator.py", "test_ring.py", "test_shutdown.py"),
                    tmp_path, "asan")
    report = r.stdout[-8000:] + r.stderr[-4000:]
    assert r.returncode == 0, report
    assert "ERROR: AddressSanitizer" not in report and "runtime error:" not in report, report


@pytest.mark.timeout(2400)
def test_transport_collective_and_monitor_suites_are_clean_under_tsan(tmp_path):
    """The engine, executor, monitor, completion pool and XLA's calling threads (the JAX
    collectives), with the core built under ThreadSanitizer. Any report fails the run."""
    _need_tools()
    tsan = _runtime("libtsan.so", _compiler())
    if not tsan:
        pytest.skip("the compiler has no libtsan runtime")
    stage = tmp_path / "site"
    _build_and_stage("tsan", stage)
    env = dict(os.environ)
    env["LD_PRELOAD"] = tsan
    for suites, extra, log in ((TSAN_SUITES, "", tmp_path / "tsan"),
                               # XLA's pools lock in code TSan does not see (tests/tsan.supp)
                               (TSAN_JAX, ":report_mutex_bugs=0:detect_deadlocks=0", tmp_path / "tsan-jax")):
        # Reports go to files (one per process: the ranks are child processes), checked below.
        env["TSAN_OPTIONS"] = (f"halt_on_error=0:exitcode=0:log_path={log}:second_deadlock_stack=1:"
                               f"report_signal_unsafe=0:suppressions={ROOT / 'tests' / 'tsan.supp'}{extra}")
        r = _run_suites(stage, env, suites, tmp_path, log.name)
        reports = "".join(p.read_text(errors="replace") for p in sorted(tmp_path.glob(log.name + ".*")))
        assert r.returncode == 0, r.stdout[-8000:] + r.stderr[-4000:]
        assert "ThreadSanitizer" not in reports, reports[:20000]


# The NCCL plugin's close race, many threads and a throw on its engine thread (issue 48), with
# the plugin built under each sanitizer and its runtime preloaded into the harness.
NCCL_CASES = (("close_race", ("--iters", "1000", "--bound", "10", "--accept-bound", "5")),
              ("many", ("--rounds", "5", "--accept-bound", "10")),
              ("contain", ()))


@pytest.mark.timeout(1800)
@pytest.mark.parametrize("variant", ["sanitize", "tsan"])
def test_the_nccl_plugins_close_race_and_many_threads_are_clean_under_the_sanitizers(tmp_path, variant):
    _need_tools()
    cxx = _compiler()
    runtimes = [_runtime("libasan.so", cxx), _runtime("libubsan.so", cxx)] if variant == "sanitize" \
        else [_runtime("libtsan.so", cxx)]
    if not all(runtimes):
        pytest.skip(f"the compiler has no runtime for {variant}")
    build = configure(variant)
    r = subprocess.run([_ninja(), "-C", str(build), "r2ccl_nccl_net", "nccl_plugin_harness"], capture_output=True,
                       text=True, timeout=1200)
    assert r.returncode == 0, r.stdout[-5000:] + r.stderr[-5000:]
    env = {"LD_PRELOAD": ":".join(runtimes),
           "ASAN_OPTIONS": "detect_leaks=0:abort_on_error=0:halt_on_error=1:exitcode=86",
           "UBSAN_OPTIONS": "print_stacktrace=1:halt_on_error=1:exitcode=87",
           # the failure detector's clock scaled as the other sanitized runs' (tests/harness.FAST)
           "R2CCL_HEARTBEAT_MS": "300", "R2CCL_STALL_MS": "600",
           "TSAN_OPTIONS": (f"halt_on_error=0:exitcode=0:log_path={tmp_path / 'tsan'}:second_deadlock_stack=1:"
                            f"report_signal_unsafe=0:suppressions={ROOT / 'tests' / 'tsan.supp'}")}
    for case, extra in NCCL_CASES:
        d = tmp_path / case
        d.mkdir()
        outs = run_harness((str(build / "libnccl-net-r2ccl.so"), str(build / "nccl_plugin_harness")), d, case, 2,
                           seed=48, env=env, timeout=900, extra=extra, warns=None)
        for out in outs:
            assert "ERROR: AddressSanitizer" not in out and "runtime error:" not in out, out[-8000:]
    reports = "".join(p.read_text(errors="replace") for p in sorted(tmp_path.glob("tsan.*")))
    assert "ThreadSanitizer" not in reports, reports[:20000]
