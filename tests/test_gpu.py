"""The CUDA platform on a GPU (marked `gpu`; skipped with the reason where no GPU is visible).

Several processes share the machine's GPU(s) over loopback rails (a one-GPU check machine
runs two processes on one H200); in the suite's multi-host mode (tests/cluster.py) the same
tests run their ranks on the job's hosts, one process per host with its local GPUs. Every
result is checked bit for bit against the canonical-order host reference."""

import functools
import os
import subprocess
import sys

import numpy as np
import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import gpu_expect as expect  # noqa: E402
from jax_rank_main import run_jax_ranks  # noqa: E402

pytestmark = pytest.mark.gpu
WORLD = int(os.environ.get("R2CCL_TEST_GPU_PROCESSES", "2"))


@functools.lru_cache(maxsize=1)
def _gpus() -> tuple[int, str]:
    """(GPUs JAX sees on the cuda platform, why none) from a fresh process."""
    from jax_r2ccl import _core
    info = _core.cuda_info()
    if not info["built"]:
        return 0, info["error"]
    if info["devices"] == 0:
        return 0, f"no GPU visible to CUDA ({info['error'] or 'no devices'})"
    code = "import jax; print(len(jax.devices('cuda')))"
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                       env=dict(os.environ, JAX_PLATFORMS="cuda", XLA_PYTHON_CLIENT_PREALLOCATE="false"))
    if r.returncode != 0:
        return 0, "JAX has no cuda platform here (install jax_r2ccl[cuda13] or [cuda12]): " + \
            (r.stderr.strip().splitlines() or ["?"])[-1][:200]
    return int(r.stdout.strip().splitlines()[-1]), ""


@pytest.fixture(autouse=True)
def _need_gpu():
    n, why = _gpus()
    if n == 0:
        pytest.skip(why)


def _run(func, **kw):
    return run_jax_ranks(func, WORLD, local=_gpus()[0], platform="cuda", **kw)


def test_reduction_kernels_match_the_host_bit_for_bit():
    # every dtype x op of the host kernels, with the special values (subnormals, signed
    # zeros, NaN, inf) the host's element operations handle
    from jax_r2ccl import _core
    from jax_r2ccl.tools.bench.gpu import kernel_cases
    bad = []
    for dtype, op, a, b, want in kernel_cases():
        got = _core.cuda_testing_reduce(dtype, op, a.view(np.uint8), b.view(np.uint8))
        if got != want:
            bad.append((dtype, op))
    assert bad == []


def test_every_op_and_dtype_on_gpu_is_bit_exact():
    expect.matrix(_run("gpu_matrix", timeout=600))


def test_a_rail_failure_mid_collective_on_gpu_is_bit_exact():
    expect.rail_fault(_run("gpu_rail_fault", timeout=300))


def test_a_training_step_on_gpu_through_the_lowering_swap():
    expect.train_step(_run("gpu_train_step", timeout=300))


def test_processes_that_disagree_on_gpu_get_an_error_on_every_process():
    expect.mismatch(_run("mismatch", config={"timeout_s": 5.0}, timeout=180))


def test_where_gpu_and_cpu_arithmetic_differ_r2ccl_follows_the_cpu_rules():
    # XLA:GPU's own add does not flush subnormals, which this test records beside ours
    rs = _run("gpu_subnormals", timeout=180)
    expect.subnormals(rs)
    print("XLA:GPU v + v of the smallest float32 subnormal:", rs[0]["result"]["xla_gpu_add"])
