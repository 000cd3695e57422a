"""The Python package by tier: the folder tells what a module may import. Tiers, bottom up:
core (errors, config, _compat, _core) < transport < JAX (_src) < monitoring < tools. No
module imports from a tier above its own (static check over every import statement, the
ones inside functions included), importing the lower tiers pulls in no jax, and the
runtime survives initialize -> shutdown -> initialize in one process."""

import ast
import os
import subprocess
import sys

import pytest

PKG = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "jax_r2ccl")
TIERS = {"core": 0, "transport": 1, "jax": 2, "monitoring": 3, "tools": 4, "entry": 5}


def tier_of(module: str) -> int:
    """module: dotted name inside the package ('' is the package itself)."""
    head = module.split(".")[0]
    if head in ("", "__init__", "__main__"):
        return TIERS["entry"]   # the public facade: lazy names from every tier
    if head in ("errors", "config", "_compat", "_core"):
        return TIERS["core"]
    if head == "transport":
        return TIERS["transport"]
    if head == "_src":
        return TIERS["jax"]
    if head == "monitoring":
        return TIERS["monitoring"]
    if head == "tools":
        return TIERS["tools"]
    raise AssertionError(f"jax_r2ccl.{module} sits in no tier: put it in a tier's folder")


def modules():
    for root, _, files in os.walk(PKG):
        for f in files:
            if f.endswith(".py"):
                path = os.path.join(root, f)
                rel = os.path.relpath(path, PKG)[:-3].replace(os.sep, ".")
                yield rel.removesuffix(".__init__") if rel != "__init__" else "", path


def imports_of(module: str, path: str):
    """(line, imported module inside jax_r2ccl) for every import of the package in the file."""
    package = module if path.endswith("__init__.py") else module.rpartition(".")[0]
    for node in ast.walk(ast.parse(open(path).read(), path)):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".") if package else []
                base = base[:len(base) - (node.level - 1)] if node.level > 1 else base
                target = ".".join([*base, *(node.module.split(".") if node.module else [])])
            elif node.module and (node.module == "jax_r2ccl" or node.module.startswith("jax_r2ccl.")):
                target = node.module.removeprefix("jax_r2ccl").lstrip(".")
            else:
                continue
            if not target:   # from . import x / from jax_r2ccl import x: x is the module
                for alias in node.names:
                    yield node.lineno, alias.name
            else:
                for alias in node.names:
                    sub = f"{target}.{alias.name}"
                    yield node.lineno, sub if os.path.exists(os.path.join(PKG, *sub.split("."))) or \
                        os.path.exists(os.path.join(PKG, *sub.split(".")) + ".py") else target
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.startswith("jax_r2ccl."):
                    yield node.lineno, alias.name.removeprefix("jax_r2ccl.")


def test_no_import_runs_back_up_a_tier():
    bad = []
    for module, path in modules():
        mine = tier_of(module)
        for line, target in imports_of(module, path):
            if tier_of(target) > mine:
                bad.append(f"{os.path.relpath(path, PKG)}:{line} (tier {mine}) imports {target} (tier {tier_of(target)})")
    assert not bad, "imports up a tier:\n" + "\n".join(bad)


def test_the_top_level_holds_only_the_core_and_the_facade():
    top = sorted(f for f in os.listdir(PKG) if f.endswith(".py"))
    assert top == ["__init__.py", "__main__.py", "config.py", "errors.py"], top


def test_the_lower_tiers_import_without_jax():
    code = ("import sys, jax_r2ccl, jax_r2ccl.config, jax_r2ccl.transport, jax_r2ccl.transport.bootstrap, "
            "jax_r2ccl.transport.host_collectives, jax_r2ccl.transport.health, jax_r2ccl.tools.cli; "
            "jax_r2ccl.tools.cli.build_parser(); "
            "assert 'jax' not in sys.modules, sorted(m for m in sys.modules if m.startswith('jax.'))[:5]")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                       cwd=os.path.dirname(os.path.abspath(__file__)))
    assert r.returncode == 0, r.stderr[-3000:]


def test_initialize_shutdown_initialize_in_one_process():
    code = r"""
import os
os.environ["JAX_PLATFORMS"] = "cpu"
import numpy as np, jax, jax_r2ccl
from jax.sharding import Mesh, PartitionSpec as P
from jax_r2ccl._src import runtime
from jax_r2ccl.errors import R2cclError
mesh = Mesh(np.array(jax.devices()), ("x",))
f = lambda: jax.jit(jax.shard_map(lambda a: jax_r2ccl.psum(a, "x"), mesh=mesh, in_specs=P("x"), out_specs=P()))
x = np.arange(8, dtype=np.float32)
for cycle in range(3):
    ep = jax_r2ccl.initialize()
    assert jax_r2ccl.initialize() is ep                    # idempotent while initialized
    assert runtime.current().generation == cycle + 1
    assert jax_r2ccl.health()["rank"] == 0
    np.testing.assert_array_equal(np.asarray(f()(x)), x)   # one device: psum is the identity
    jax_r2ccl.shutdown()
    jax_r2ccl.shutdown()                                   # idempotent
    try:
        jax_r2ccl.health()
    except R2cclError as e:
        assert "initialize() has not been called" in str(e), e
    else:
        raise AssertionError("health() after shutdown() did not raise")
print("OK")
"""
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=240,
                       cwd=os.path.dirname(os.path.abspath(__file__)))
    assert r.returncode == 0 and r.stdout.strip().endswith("OK"), (r.stdout + r.stderr)[-4000:]


def test_private_jax_apis_stay_behind_the_compatibility_module():
    bad = []
    for module, path in modules():
        if module.startswith("_compat"):
            continue
        for node in ast.walk(ast.parse(open(path).read(), path)):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                [node.module or ""] if isinstance(node, ast.ImportFrom) and not node.level else []
            bad += [f"{os.path.relpath(path, PKG)}:{node.lineno} imports {n}" for n in names
                    if n.startswith(("jax._src", "jax.interpreters", "jaxlib"))]
    assert not bad, "private JAX APIs outside jax_r2ccl/_compat:\n" + "\n".join(bad)


# The C++ layers (docs/design.md, "layers"): the folders a folder of csrc/ may include from.
CSRC = os.path.join(os.path.dirname(PKG), "csrc")
CPP_MAY_INCLUDE = {
    "base": {"base"},
    "net": {"base", "net"},
    "core": {"base", "net", "core"},
    "coll": {"base", "core", "coll"},
    "stage": {"base", "coll", "stage"},
    "cuda": {"base", "coll", "stage", "cuda"},
    "monitor": {"base", "core", "monitor"},
    "comm": {"base", "core", "coll", "monitor", "comm"},
    "ffi": {"base", "coll", "stage", "cuda", "ffi", "xla"},
    "python": {"base", "net", "core", "coll", "stage", "cuda", "monitor", "comm", "ffi"},
    # NCCL's host program: the net plugin over the endpoint (no collectives: NCCL has its own).
    "nccl": {"base", "net", "core", "monitor", "nccl"},
}
# The per-peer state machine and its window have no socket or transport in them.
CPP_NO_NET = ("core/channel.h", "core/channel.cc", "core/rail_pace.h", "core/rail_pace.cc")
# Inside net/ (net/registry.h): the core and the NCCL plugin see transports only through the seam
# and the registry, never a backend; a backend's folder (net/socket, net/ibverbs) includes the
# seam, the shared TCP stream (net/tcp) and its own files, never another backend's; only the
# registry names the backends, by their entry headers.
NET_SEAM = {"net/transport.h", "net/registry.h"}
NET_SHARED = ("net/tcp/",)


def test_no_cpp_include_runs_across_a_layer():
    import re
    bad = []
    folders = sorted(d for d in os.listdir(CSRC) if os.path.isdir(os.path.join(CSRC, d)))
    assert set(folders) == set(CPP_MAY_INCLUDE), f"a csrc folder without a layer rule: {folders}"
    for folder in folders:
        for root, _, files in os.walk(os.path.join(CSRC, folder)):
            for name in files:
                path = os.path.join(root, name)
                rel = os.path.relpath(path, CSRC)
                with open(path, errors="replace") as f:
                    for line in f:
                        m = re.match(r'\s*#\s*include\s+"([a-z_]+)/', line)
                        if not m:
                            continue
                        if m.group(1) not in CPP_MAY_INCLUDE[folder] or (rel in CPP_NO_NET and m.group(1) == "net"):
                            bad.append(f"{rel}: {line.strip()}")
    assert not bad, "includes across a layer:\n" + "\n".join(bad)


def _net_include_problem(rel: str, target: str) -> str:
    """Why csrc/`rel` may not include "`target`" (a path under net/), or ''."""
    top = rel.split("/")[0]
    if top != "net":
        if top in ("core", "nccl") and target not in NET_SEAM:
            return "the core and the NCCL plugin see transports only through net/transport.h and net/registry.h"
        return ""
    parts = rel.split("/")
    if len(parts) == 2:   # net/<file>: the seam, the registry, nic.cc
        if target.startswith(NET_SHARED) or target.count("/") == 1:
            return ""
        if rel.startswith("net/registry.") and target.endswith("_backend.h"):
            return ""
        return "outside a backend's folder only the registry names a backend, by its entry header"
    mine = "/".join(parts[:2]) + "/"
    if target.count("/") == 1 or target.startswith(NET_SHARED) or target.startswith(mine):
        return ""
    return f"a backend ({mine}) includes the seam, net/tcp and its own files, not another backend's"


def test_net_backends_stay_behind_the_seam_and_the_registry():
    import re
    bad = []
    for folder in sorted(os.listdir(CSRC)):
        for root, _, files in os.walk(os.path.join(CSRC, folder)):
            for name in files:
                rel = os.path.relpath(os.path.join(root, name), CSRC)
                with open(os.path.join(root, name), errors="replace") as f:
                    for line in f:
                        m = re.match(r'\s*#\s*include\s+"(net/[^"]+)"', line)
                        if m and (why := _net_include_problem(rel, m.group(1))):
                            bad.append(f"{rel}: {line.strip()} ({why})")
    assert not bad, "includes past the transport seam:\n" + "\n".join(bad)
    # The rule can fail: the engine naming the verbs backend, verbs reaching into sockets.
    assert _net_include_problem("core/engine.cc", "net/ibverbs/verbs_transport.h")
    assert _net_include_problem("net/ibverbs/verbs_link.cc", "net/socket/send_ring.h")
    assert not _net_include_problem("net/ibverbs/verbs_link.cc", "net/tcp/stream.h")


# Inside coll/ (coll/algorithm.h): one file per algorithm in coll/algo/, seen only through the
# seam; only coll/algorithm.cc picks one; the state machine every call runs (coll/op.*), the
# executor and the rest of the folder name no algorithm's messages (Phase), only the op's own.
COLL_ALGO = "coll/algo/"
COLL_OP_PHASES = {"kSignature", "kAbort"}


def _coll_algorithm_problems(rel: str, text: str) -> list[str]:
    """What csrc/`rel` (its text `text`) does against the algorithm seam's rules."""
    import re
    bad = []
    if rel.startswith(COLL_ALGO):
        if not rel.endswith(".cc") or rel.count("/") != 2:
            bad.append(f"{rel}: coll/algo/ holds one .cc per algorithm, seen only through coll/algorithm.h")
        for inc in re.findall(r'^\s*#\s*include\s+"(coll/[^"]+)"', text, re.M):
            if inc.startswith(COLL_ALGO) or inc in ("coll/runtime.h", "coll/scratch.h"):
                bad.append(f"{rel}: includes {inc} (an algorithm sees the op and the pure helpers only)")
        return bad
    if rel.startswith("coll/") and rel != "coll/algorithm.h":
        for phase in sorted(set(re.findall(r"Phase::(k[A-Za-z]+)", text)) - COLL_OP_PHASES):
            bad.append(f"{rel}: names Phase::{phase}, an algorithm's message")
    if rel not in ("coll/algorithm.cc", "coll/algorithm.h"):   # (make_algorithm is the way in)
        for call in sorted(set(re.findall(r"\b([a-z]+_algorithm)\(", text)) - {"make_algorithm"}):
            bad.append(f"{rel}: calls {call}(): only coll/algorithm.cc picks an algorithm")
    return bad


def test_collective_algorithms_stay_behind_their_seam():
    bad = []
    for root, _, files in os.walk(CSRC):
        for name in files:
            path = os.path.join(root, name)
            with open(path, errors="replace") as f:
                bad += _coll_algorithm_problems(os.path.relpath(path, CSRC), f.read())
    assert not bad, "the algorithm seam crossed:\n" + "\n".join(bad)
    assert os.path.isdir(os.path.join(CSRC, "coll", "algo")) and len(os.listdir(os.path.join(CSRC, "coll", "algo"))) >= 5
    # The rules can fail: the op posting a chain message, a header in algo/, the executor
    # choosing an algorithm, an algorithm including another.
    assert _coll_algorithm_problems("coll/op.cc", "op.tag(Phase::kChainReduce)")
    assert _coll_algorithm_problems("coll/algo/chain.h", "")
    assert _coll_algorithm_problems("coll/executor.cc", "auto a = chain_algorithm(kind);")
    assert _coll_algorithm_problems("coll/algo/two.cc", '#include "coll/algo/chain.cc"')
    assert not _coll_algorithm_problems("coll/op.cc", "tag(Phase::kAbort)")


def test_the_tiers_and_the_skip_rules(tmp_path):
    """tests/conftest.py: the quick tier leaves `proof` (and `testbed`) tests out; a quick-tier
    test that skips for want of root fails; --require-all fails every skip but a gpu or variant
    one."""
    import shutil
    shutil.copy(os.path.join(os.path.dirname(os.path.abspath(__file__)), "conftest.py"), tmp_path / "conftest.py")
    (tmp_path / "test_tiers.py").write_text(
        "import pytest\n"
        "def test_quick(): pass\n"
        "@pytest.mark.proof\ndef test_proof(): pass\n"
        "@pytest.mark.testbed\ndef test_bed(): pass\n"
        "def test_wants_root(): pytest.skip('needs root and ip')\n"
        "def test_wants_clang(): pytest.skip('no clang here')\n"
        "@pytest.mark.gpu\ndef test_gpu(): pytest.skip('no GPU')\n"
        "@pytest.mark.variant\ndef test_other_build(): pytest.skip('the CUDA=off build only')\n")
    (tmp_path / "pytest.ini").write_text("[pytest]\nmarkers =\n  proof\n  testbed\n  gpu\n  variant\n")

    env = dict(os.environ)
    env.pop("PYTEST_ADDOPTS", None)     # CI's --require-all belongs to the outer run, not to this one

    def run(*args):
        r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-rA", "-p", "no:cacheprovider", *args],
                           cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
        return r.stdout

    quick = run()
    assert "PASSED test_tiers.py::test_quick" in quick and "test_proof" not in quick and "test_bed" not in quick
    assert "FAILED test_tiers.py::test_wants_root" in quick and "2 proof-tier tests not run" in quick, quick
    assert "SKIPPED" in quick and "FAILED test_tiers.py::test_wants_clang" not in quick, quick
    full = run("--proof", "--require-all")
    for name in ("test_proof", "test_bed", "test_quick"):
        assert f"PASSED test_tiers.py::{name}" in full, full
    for name in ("test_wants_root", "test_wants_clang"):
        assert f"FAILED test_tiers.py::{name}" in full, full
    assert "FAILED test_tiers.py::test_gpu" not in full and "FAILED test_tiers.py::test_other_build" not in full, full
