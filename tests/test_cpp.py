"""Builds and runs the standalone C++ unit tests in tests/cpp (test_wire, test_digest, test_reduce,
test_handshake, test_plan, test_rail_pace, test_channel_sim, test_verbs_host, test_socket_link,
test_endpoint_poll), and the channel suite over two channels with a
planted bug each (test_channel_sim_planted_dedup, _retransmit, _late_write), which it must catch.

test_channel_sim runs 10,000 seeded schedules in the quick tier (seeds 1..10,000) and the next
90,000 in the proof tier (test_channel_sim_long_schedules), 100,000 in all; 10,000 under
AddressSanitizer + UBSan, where each costs about ten times as much, and 300 under
ThreadSanitizer (proof tier, both). A failure names its seed, and
`build/pytest-cpp/plain/test_channel_sim --seed S --schedules 1 --verbose` replays it.

The tests are configured with -DR2CCL_CPP_TESTS=ON and built once per pytest session for each
variant: plain (build/pytest-cpp/plain, -DR2CCL_PYTHON_MODULE=OFF: the test targets and the core
library they link only), AddressSanitizer + UBSan (-DR2CCL_SANITIZE=ON) and ThreadSanitizer
(-DR2CCL_TSAN=ON; any report fails the test). A sanitizer's folder (build/pytest-asan,
build/pytest-tsan) is the one tests/test_sanitizers.py builds the Python extension in, with the
same configuration (configure()): the core library is compiled once per sanitizer per
run. Warnings are errors (R2CCL_WERROR defaults ON).
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
BUILD_ROOT = ROOT / "build" / "pytest-cpp"
TARGETS = ("test_wire", "test_handshake", "test_digest", "test_reduce", "test_plan", "test_rail_pace", "test_channel_sim", "test_verbs_host", "test_socket_link",
           "test_endpoint_poll")
PLANTED = ("test_channel_sim_planted_dedup", "test_channel_sim_planted_retransmit", "test_channel_sim_planted_late_write")
QUICK_SCHEDULES, ALL_SCHEDULES = 10_000, 100_000
ARGS = {("test_channel_sim", "plain"): ["--schedules", str(QUICK_SCHEDULES)],
        ("test_channel_sim", "sanitize"): ["--schedules", "10000"],
        # The simulator is one thread: TSan has nothing to race there; a few schedules show
        # the instrumented build runs it (the threads are TSan's in test_sanitizers.py).
        ("test_channel_sim", "tsan"): ["--schedules", "300"]}
VARIANTS = {
    "plain": ["-DR2CCL_SANITIZE=OFF"],
    "sanitize": ["-DR2CCL_SANITIZE=ON"],
    "tsan": ["-DR2CCL_TSAN=ON"],
}


def _cmake() -> list[str] | None:
    """The cmake command: on PATH, else the copy shipped by the `cmake` PyPI package."""
    path = shutil.which("cmake")
    if path:
        return [path]
    if importlib.util.find_spec("cmake") is not None:
        return [sys.executable, "-m", "cmake"]
    return None


def _ninja() -> str | None:
    """Path of the ninja binary (CMake wants a path): on PATH, else the `ninja` PyPI package's."""
    path = shutil.which("ninja")
    if path:
        return path
    if importlib.util.find_spec("ninja") is not None:
        import ninja

        candidate = Path(ninja.BIN_DIR) / "ninja"
        if candidate.exists():
            return str(candidate)
    return None


def _compiler() -> str | None:
    cxx = os.environ.get("CXX")
    if cxx:
        return shutil.which(cxx.split()[0])
    for name in ("c++", "g++", "clang++"):
        path = shutil.which(name)
        if path:
            return path
    return None


def _run(cmd: list[str], cwd: Path, what: str, timeout: float) -> None:
    proc = subprocess.run(cmd, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                          timeout=timeout)
    if proc.returncode != 0:
        pytest.fail(f"{what} failed (exit {proc.returncode}): {' '.join(cmd)}\n{proc.stdout[-20000:]}",
                    pytrace=False)


SANITIZED_DIRS = {"sanitize": ROOT / "build" / "pytest-asan", "tsan": ROOT / "build" / "pytest-tsan"}


def configure(variant: str) -> Path:
    """Configures the build folder of `variant` (see the module's docstring) and returns it."""
    cmake, ninja, cxx = _cmake(), _ninja(), _compiler()
    build_dir = SANITIZED_DIRS.get(variant, BUILD_ROOT / variant)
    args = [*cmake, "-S", str(ROOT), "-B", str(build_dir), "-G", "Ninja", f"-DCMAKE_MAKE_PROGRAM={ninja}",
            f"-DCMAKE_CXX_COMPILER={cxx}", f"-DPython_EXECUTABLE={sys.executable}", "-DR2CCL_CPP_TESTS=ON",
            *VARIANTS[variant]]
    if variant == "plain":
        args.append("-DR2CCL_PYTHON_MODULE=OFF")   # the C++ tests need neither nanobind nor jax
    else:
        # with the Python extension (tests/test_sanitizers.py), without the CUDA part: the
        # sanitized suites run on the CPU, where CUDA code never runs
        args += ["-DCMAKE_BUILD_TYPE=RelWithDebInfo", "-DR2CCL_CUDA=off"]
    try:
        _run(args, ROOT, f"cmake configure ({variant})", timeout=300)
    except pytest.fail.Exception:
        # A stale cache (other compiler, moved checkout) is the usual cause: start afresh once.
        shutil.rmtree(build_dir, ignore_errors=True)
        _run(args, ROOT, f"cmake configure ({variant})", timeout=300)
    return build_dir


# The plain build in the quick tier; the sanitizer builds in the proof tier.
@pytest.fixture(scope="module", params=[v if v == "plain" else pytest.param(v, marks=pytest.mark.proof) for v in VARIANTS])
def cpp_build(request) -> tuple[str, Path]:
    """Configures and builds the C++ tests for one variant; yields (variant, build dir)."""
    cmake = _cmake()
    if cmake is None:
        pytest.skip("cmake not found (neither on PATH nor the `cmake` PyPI package)")
    ninja = _ninja()
    if ninja is None:
        pytest.skip("ninja not found (neither on PATH nor the `ninja` PyPI package)")
    cxx = _compiler()
    if cxx is None:
        pytest.skip("no C++ compiler found ($CXX, c++, g++ or clang++)")

    variant = request.param
    build_dir = configure(variant)
    # A sanitizer's folder also builds the extension tests/test_sanitizers.py runs (one build step)
    build = [*cmake, "--build", str(build_dir), "--target", *TARGETS, *(PLANTED if variant == "plain" else ("_core",))]
    _run(build, ROOT, f"build of {', '.join(TARGETS)} ({variant})", timeout=900)
    return variant, build_dir


@pytest.mark.timeout(900)  # the first test of each variant pays for the build
@pytest.mark.parametrize("name", TARGETS)
def test_cpp(cpp_build, name):
    variant, build_dir = cpp_build
    binary = build_dir / name
    assert binary.exists(), f"{binary} was not built"
    env = dict(os.environ)
    if variant == "sanitize":
        env["ASAN_OPTIONS"] = "halt_on_error=1:abort_on_error=0:detect_stack_use_after_return=1"
        env["UBSAN_OPTIONS"] = "halt_on_error=1:print_stacktrace=1"
    if variant == "tsan":
        env["TSAN_OPTIONS"] = "halt_on_error=1:exitcode=66:second_deadlock_stack=1"
    proc = subprocess.run([str(binary), *ARGS.get((name, variant), [])], cwd=build_dir, env=env,
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=600)
    assert proc.returncode == 0, (
        f"{name} ({variant}) exited with {proc.returncode}; its output:\n{proc.stdout[-20000:]}")
    assert "all checks passed" in proc.stdout, f"{name} ({variant}) output:\n{proc.stdout}"
    assert "ThreadSanitizer" not in proc.stdout, f"{name} ({variant}) output:\n{proc.stdout[-20000:]}"


@pytest.mark.timeout(900)
@pytest.mark.parametrize("cpp_build", ["plain"], indirect=True)   # once, without the sanitizers
@pytest.mark.parametrize("name", PLANTED)
def test_channel_suite_catches_a_planted_fault(cpp_build, name):
    """The same suite over channel.cc built with R2CCL_PLANT_FAULT (a dedup off-by-one, a
    failed rail's newest chunk not sent again, or a chunk written on a failed rail sent again
    with no fence notice first: the late-write rule) must fail."""
    _variant, build_dir = cpp_build
    binary = build_dir / name
    assert binary.exists(), f"{binary} was not built"
    proc = subprocess.run([str(binary), "--expect-failure", "--schedules", "2000"], cwd=build_dir,
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=600)
    assert proc.returncode == 0 and "the planted fault was caught" in proc.stdout, proc.stdout[-5000:]
    print(proc.stdout.strip().splitlines()[-1])


@pytest.mark.proof
@pytest.mark.timeout(900)
@pytest.mark.parametrize("cpp_build", ["plain"], indirect=True)
def test_channel_sim_long_schedules(cpp_build):
    """The schedules after the quick tier's: seeds QUICK_SCHEDULES+1 .. ALL_SCHEDULES (plain build)."""
    _variant, build_dir = cpp_build
    proc = subprocess.run([str(build_dir / "test_channel_sim"), "--seed", str(QUICK_SCHEDULES + 1),
                           "--schedules", str(ALL_SCHEDULES - QUICK_SCHEDULES)], cwd=build_dir,
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=800)
    assert proc.returncode == 0 and "all checks passed" in proc.stdout, proc.stdout[-20000:]
    print(proc.stdout.strip().splitlines()[-1])
