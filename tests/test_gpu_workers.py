"""The GPU tests' workers (tests/jax_workers.py, gpu_*) on the CPU platform, where their
logic can run without a GPU: with JAX's own cross-process collectives turned off (no gloo),
so that anything XLA would run across the processes fails at once, as NCCL does with two
processes sharing one GPU (the one-GPU check machine). What these show before a GPU is lent:
the workers build every input per process (jax.make_array_from_callback; jax.device_put of a
global array runs an XLA all-gather), run only r2ccl collectives, time their faults after
compilation, and check what they claim. Every result is checked bit for bit."""

import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

from jax_rank_main import run_jax_ranks  # noqa: E402


def _run(func, **kw):
    return run_jax_ranks(func, 2, local=1, platform="cpu", xla_collectives=False, **kw)


def test_the_gpu_training_step_needs_no_xla_collective_and_is_exact():
    rs = _run("gpu_train_step", timeout=180)
    for r in rs:
        res = r["result"]
        assert res["custom_call"] and not res["xla_all_reduce"], res
        assert res["bad_sums"] == [] and not res["params_differ"], res
        assert res["losses"][-1] < res["losses"][0], res["losses"]
    assert len({r["result"]["param_digest"] for r in rs}) == 1


def test_the_gpu_rail_fault_lands_inside_the_collective_and_is_exact():
    rs = _run("gpu_rail_fault", timeout=180)
    for r in rs:
        assert r["result"]["bad"] == [], r["result"]
    res = rs[0]["result"]
    assert res["rail_failures"] >= 1, res
    assert res["fault"]["unacked_bytes"] > 0 and res["fault"]["resent_chunks"] >= 1, res


def test_the_gpu_matrix_and_mismatch_workers_need_no_xla_collective():
    # the matrix at its small size only (the GPU run adds a size of several staging chunks)
    rs = _run("gpu_matrix", args={"sizes": [1000]}, timeout=300)
    for r in rs:
        assert r["result"]["bad"] == [] and r["result"]["ran"] > 50, r["result"]
    rs = _run("mismatch", config={"timeout_s": 5.0}, timeout=120)
    for r in rs:
        res = r["result"]
        assert res["error"] and "[r2ccl " in res["error"], res
        assert res["after"]["ok"] and res["after"]["value"] == res["after"]["expected"], res
    rs = _run("gpu_subnormals", timeout=120)
    assert all(r["result"]["r2ccl_psum"] == 0.0 for r in rs), rs
