"""The libFuzzer harnesses (tests/fuzz/): built with clang, ASan and UBSan, run over their seed
corpus (captured from real jobs: tests/fuzz/capture_corpus.py) and every input that ever
crashed one (tests/fuzz/regressions/), then fuzzed for R2CCL_FUZZ_SECONDS each (15 by
default: CI's smoke run, about two minutes in all with the build). Any crash, sanitizer
report or failed check fails the test, naming the input libFuzzer saved; add that input to
tests/fuzz/regressions/<harness>/ with the fix. The long run (10^7 executions per harness)
is `tests/fuzz/run.sh`; tests/fuzz/README.md has its record.

Skipped where clang or its libFuzzer runtime is missing (Debian: clang, libclang-rt-dev);
.ci/run installs them."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.proof    # libFuzzer (clang) harnesses

from test_cpp import _cmake, _ninja

ROOT = Path(__file__).resolve().parent.parent
FUZZ = ROOT / "tests" / "fuzz"
BUILD = ROOT / "build" / "pytest-fuzz"
HARNESSES = ("wire", "handshake", "channel", "rail_state", "signature", "verbs_boot")


def _clang() -> str | None:
    for name in ("clang++", "clang++-19", "clang++-16", "clang++-15", "clang++-14"):
        path = shutil.which(name)
        if path:
            return path
    return None


@pytest.fixture(scope="module")
def fuzz_build(tmp_path_factory) -> Path:
    cmake, ninja, clang = _cmake(), _ninja(), _clang()
    if not (cmake and ninja):
        pytest.skip("needs cmake and ninja")
    if not clang:
        pytest.skip("needs clang++ (Debian: apt-get install clang libclang-rt-dev)")
    probe = tmp_path_factory.mktemp("probe")
    (probe / "f.cc").write_text('#include <cstddef>\n#include <cstdint>\n'
                                'extern "C" int LLVMFuzzerTestOneInput(const uint8_t*, size_t) { return 0; }\n')
    r = subprocess.run([clang, "-fsanitize=fuzzer,address,undefined", "f.cc", "-o", "f"], cwd=probe,
                       capture_output=True, text=True)
    if r.returncode != 0:
        pytest.skip(f"{clang} cannot link a libFuzzer harness (Debian: libclang-rt-dev): {r.stderr[-300:]}")
    cfg = cmake + ["-S", str(ROOT), "-B", str(BUILD), "-G", "Ninja", f"-DCMAKE_MAKE_PROGRAM={ninja}",
                   f"-DCMAKE_CXX_COMPILER={clang}", "-DR2CCL_FUZZ=ON", "-DR2CCL_PYTHON_MODULE=OFF",
                   "-DR2CCL_CUDA=off", "-DCMAKE_BUILD_TYPE=RelWithDebInfo"]
    r = subprocess.run(cfg, capture_output=True, text=True, timeout=300)
    if r.returncode != 0:   # a stale cache (another compiler): start afresh once
        shutil.rmtree(BUILD, ignore_errors=True)
        r = subprocess.run(cfg, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    r = subprocess.run([ninja, "-C", str(BUILD), *(f"fuzz_{h}" for h in HARNESSES)], capture_output=True, text=True,
                       timeout=1200)
    assert r.returncode == 0, r.stdout[-5000:] + r.stderr[-5000:]
    return BUILD


def _inputs(h: str) -> list[str]:
    dirs = [FUZZ / "corpus" / h, FUZZ / "regressions" / h]
    return [str(d) for d in dirs if d.is_dir() and any(d.iterdir())]


@pytest.mark.timeout(600)
@pytest.mark.parametrize("harness", HARNESSES)
def test_fuzz_harness(fuzz_build, harness, tmp_path):
    exe = fuzz_build / f"fuzz_{harness}"
    seconds = int(os.environ.get("R2CCL_FUZZ_SECONDS", "15"))
    seeds = _inputs(harness)
    env = dict(os.environ, ASAN_OPTIONS="detect_leaks=1:abort_on_error=0", UBSAN_OPTIONS="print_stacktrace=1")
    # Every seed and every input that once crashed, each run once: they must all pass.
    if seeds:
        r = subprocess.run([str(exe), "-runs=0", f"-artifact_prefix={tmp_path}/", *seeds], capture_output=True,
                           text=True, timeout=300, env=env)
        assert r.returncode == 0, f"a seed or regression input fails fuzz_{harness}:\n{r.stderr[-6000:]}"
    work = tmp_path / "corpus"
    work.mkdir()
    r = subprocess.run([str(exe), f"-max_total_time={seconds}", "-timeout=10", "-rss_limit_mb=2048",
                        "-print_final_stats=1", f"-artifact_prefix={tmp_path}/", str(work), *seeds],
                       capture_output=True, text=True, timeout=seconds + 240, env=env)
    saved = sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(("crash-", "leak-", "timeout-", "oom-")))
    assert r.returncode == 0 and not saved, (
        f"fuzz_{harness} found an input that fails ({saved}, in {tmp_path}); keep it in "
        f"tests/fuzz/regressions/{harness}/ with the fix:\n{r.stderr[-6000:]}")
    m = re.search(r"stat::number_of_executed_units:\s*(\d+)", r.stderr)
    assert m, r.stderr[-2000:]
    print(f"fuzz_{harness}: {int(m.group(1))} executions in {seconds} s, {len(seeds)} seed folder(s)",
          file=sys.stderr)
