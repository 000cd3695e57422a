"""The Bazel build (BUILD, WORKSPACE, bazel/): one list of sources with CMakeLists.txt, the
layering of docs/design.md in its targets, and, where Bazel is installed (CI installs Debian's
bazel-bootstrap), `bazel test //...` offline (nothing downloaded) and a two-process
loopback all-reduce through the Bazel-built _core."""

from __future__ import annotations

import glob
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from harness import LOOPBACK4, run_ranks
from test_layout import CPP_MAY_INCLUDE

ROOT = Path(__file__).resolve().parent.parent
# Built by CMake only: the CUDA platform (no nvcc rules under Bazel 4 offline; BUILD says so).
CMAKE_ONLY = {"csrc/cuda/api.cc", "csrc/cuda/device.cc", "csrc/cuda/kernels.cu", "csrc/ffi/cuda_collectives.cc"}


def _bazel_targets() -> dict:
    """The BUILD file's targets, by running it as Python with the rules recording their
    arguments (BUILD is Starlark, which this file's subset of is also Python)."""
    targets = {}

    def rule(kind):
        def record(name, **kw):
            targets[name] = dict(kw, kind=kind)
        return record
    env = {"load": lambda *a, **k: None, "package": lambda **k: None, "licenses": lambda *a: None,
           "glob": lambda *a, **k: [], "EXT_SUFFIX": ".so", "HAVE_IBVERBS": True,
           "cc_library": rule("cc_library"), "cc_binary": rule("cc_binary"), "cc_test": rule("cc_test"),
           "alias": rule("alias")}
    exec(compile((ROOT / "BUILD").read_text(), "BUILD", "exec"), env)
    return targets


def _cmake_sources() -> set[str]:
    text = (ROOT / "CMakeLists.txt").read_text()
    return set(re.findall(r"\b((?:csrc|tests/cpp)/[\w/]+\.(?:cc|cu))\b", text)) - {"tests/cpp/${h}.cc"}


def _bazel_sources(targets) -> set[str]:
    return {s for t in targets.values() for s in t.get("srcs", []) if s.startswith(("csrc/", "tests/cpp/"))}


def test_one_list_of_sources():
    """Every C++ source is built by both builds (the CUDA platform by CMake only), and every
    source on disk by at least one: a file added to one build and not the other fails here."""
    cmake, bazel = _cmake_sources(), _bazel_sources(_bazel_targets())
    on_disk = {os.path.relpath(p, ROOT) for pat in ("csrc/**/*.cc", "csrc/**/*.cu", "tests/cpp/*.cc")
               for p in glob.glob(str(ROOT / pat), recursive=True)}
    assert cmake - bazel == CMAKE_ONLY, f"in CMakeLists.txt, not in BUILD: {sorted(cmake - bazel - CMAKE_ONLY)}"
    assert bazel <= cmake, f"in BUILD, not in CMakeLists.txt: {sorted(bazel - cmake)}"
    assert on_disk == cmake, f"in neither build: {sorted(on_disk - cmake)}; gone: {sorted(cmake - on_disk)}"


def test_bazel_targets_keep_the_layering():
    """One cc_library per folder of csrc/ (its sources in that folder), depending only on the
    layers the folder may include from (tests/test_layout.py, docs/design.md)."""
    targets = _bazel_targets()
    libs = {n: t for n, t in targets.items() if t["kind"] == "cc_library" and n in CPP_MAY_INCLUDE}
    assert set(libs) == set(CPP_MAY_INCLUDE) - {"python"}, sorted(libs)
    for name, t in libs.items():
        for src in t.get("srcs", []):
            assert src.startswith(f"csrc/{name}/"), (name, src)
        for dep in t.get("deps", []):
            if dep.startswith(":"):
                assert dep[1:] in CPP_MAY_INCLUDE[name] - {name}, f"//:{name} depends on {dep}"
            else:   # an outside input: only the FFI layer sees XLA, only net rdma-core's header
                assert (name, dep) in {("ffi", "@r2ccl_inputs//:xla_ffi"), ("net", "@r2ccl_inputs//:ibverbs_headers")}, (name, dep)
    module = next(t for t in targets.values() if t["kind"] == "cc_binary")
    assert module["srcs"] == ["csrc/python/bindings.cc"] and module["linkshared"]
    assert {d[1:] for d in module["deps"] if d.startswith(":")} <= CPP_MAY_INCLUDE["python"]
    tests = {n for n, t in targets.items() if t["kind"] == "cc_test"}
    assert {Path(p).stem for p in glob.glob(str(ROOT / "tests/cpp/*.cc"))} <= tests
    for t in targets.values():
        if t["kind"] in ("cc_library", "cc_binary", "cc_test") and any(s.endswith(".cc") for s in t.get("srcs", [])):
            assert "-Werror" in t["copts"], t   # warnings are errors, as in CMake


def _bazel() -> str | None:
    return shutil.which("bazel")


@pytest.fixture(scope="module")
def bazel_build(tmp_path_factory):
    if not _bazel():
        pytest.skip("bazel is not installed (CI installs Debian's bazel-bootstrap: .ci/run)")
    out = tmp_path_factory.mktemp("bazel")
    env = dict(os.environ, R2CCL_PYTHON=sys.executable)
    # Nothing is downloaded: the fetch, the build and the tests run with an empty repository
    # cache of their own, where Bazel stores whatever it downloads; it must stay empty. (On
    # CI, which reaches no other host than the package registries, a download would also fail.)
    cache = out / "repository-cache"
    f = subprocess.run([_bazel(), "fetch", f"--repository_cache={cache}", "//..."], cwd=ROOT, env=env,
                       capture_output=True, text=True, timeout=1200)
    # --nocache_test_results: every test runs in this process tree. Bazel's output base
    # outlives the checkout (~/.cache/bazel, keyed by the workspace's path), so a machine that
    # ran this before would otherwise report the earlier run's results as "(cached) PASSED".
    r = subprocess.run([_bazel(), "test", f"--repository_cache={cache}", "--symlink_prefix=/",
                        "--spawn_strategy=standalone", "--nocache_test_results", "//..."],
                       cwd=ROOT, env=env, capture_output=True, text=True, timeout=2400)
    downloaded = [str(p) for p in cache.rglob("*") if p.is_file()] if cache.exists() else []
    (out / "bazel-test.log").write_text(f.stdout + f.stderr + r.stdout + r.stderr)
    yield f, downloaded, r, env
    # No Bazel server is left behind.
    subprocess.run([_bazel(), "shutdown"], cwd=ROOT, env=env, capture_output=True, timeout=120)


@pytest.mark.proof
@pytest.mark.timeout(2700)
def test_bazel_test_runs_every_cpp_test_offline(bazel_build):
    f, downloaded, r, _ = bazel_build
    assert f.returncode == 0, (f.stdout + f.stderr)[-6000:]
    assert downloaded == [], downloaded
    text = r.stdout + r.stderr
    assert r.returncode == 0, text[-6000:]
    passed = set(re.findall(r"//:(test_\w+)\s+PASSED", text))   # "(cached) PASSED" does not count
    ran = re.search(r"Executed (\d+) out of (\d+) tests", text)
    assert ran and ran.group(1) == ran.group(2), text[-4000:]
    assert {Path(p).stem for p in glob.glob(str(ROOT / "tests/cpp/*.cc"))} <= passed, text[-4000:]


@pytest.mark.proof
@pytest.mark.timeout(2700)
def test_the_bazel_built_core_runs_a_two_process_all_reduce(bazel_build, tmp_path):
    _, _, r, env = bazel_build
    if r.returncode != 0:
        pytest.skip("the Bazel build failed: test_bazel_test_runs_every_cpp_test_offline says why")
    b = subprocess.run([_bazel(), "build", "--symlink_prefix=/", "--spawn_strategy=standalone", "//:_core"],
                       cwd=ROOT, env=env, capture_output=True, text=True, timeout=2400)
    assert b.returncode == 0, (b.stdout + b.stderr)[-6000:]
    bin_dir = subprocess.run([_bazel(), "info", "bazel-bin"], cwd=ROOT, env=env, capture_output=True, text=True,
                             timeout=120).stdout.strip()
    so = next(Path(bin_dir).glob("_core.*so"))
    import jax_r2ccl
    stage = tmp_path / "site"
    shutil.copytree(Path(jax_r2ccl.__file__).parent, stage / "jax_r2ccl",
                    ignore=shutil.ignore_patterns("_core*.so", "__pycache__"))
    shutil.copy(so, stage / "jax_r2ccl" / so.name)
    child = dict(os.environ, PYTHONPATH=str(stage))
    where = subprocess.run([sys.executable, "-c", "import jax_r2ccl._core as c; print(c.__file__)"], env=child,
                           cwd=str(tmp_path), capture_output=True, text=True, timeout=120)
    assert where.returncode == 0 and str(stage) in where.stdout, where.stdout + where.stderr
    res = run_ranks("test_bazel:loopback_all_reduce", 2, nics=LOOPBACK4[:2], timeout=120,
                    env={"PYTHONPATH": str(stage)})
    for x in res:
        out = x["result"]
        assert out["core"].startswith(str(stage)), out     # the Bazel-built extension ran
        assert out["exact"], out


def loopback_all_reduce(ep, rank, world):
    """Runs in each rank (tests/rank_main.py): a large and a small all-reduce, checked."""
    import numpy as np
    from jax_r2ccl import _core
    from jax_r2ccl.transport.host_collectives import HostCollectives
    hc = HostCollectives(ep)
    pr = list(range(world))
    big = hc.run("all_reduce", [np.full(1 << 20, rank + 1, np.float32)], process_of_rank=pr, my_ranks=[rank])
    small = hc.run("all_reduce", [np.arange(1000, dtype=np.int32) * (rank + 1)], process_of_rank=pr,
                   my_ranks=[rank], op="max")
    hc.close()
    exact = bool(np.all(big[0] == sum(range(1, world + 1))) and np.array_equal(small[0], np.arange(1000) * world))
    return {"core": _core.__file__, "exact": exact}
