"""The GPU tests' workers (tests/jax_workers.py, gpu_*) on the CPU platform, where their
logic can run without a GPU: with JAX's own cross-process collectives turned off (no gloo),
so that anything XLA would run across the processes fails at once, as NCCL does with two
processes sharing one GPU (the one-GPU check machine). What these show before a GPU is lent:
the workers build every input per process (jax.make_array_from_callback; jax.device_put of a
global array runs an XLA all-gather), run only r2ccl collectives, time their faults after
compilation, and check what they claim. Every result is checked bit for bit."""

import importlib.util
import os
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import gpu_expect as expect  # noqa: E402
from jax_rank_main import run_jax_ranks  # noqa: E402


def _run(func, **kw):
    return run_jax_ranks(func, 2, local=1, platform="cpu", xla_collectives=False, **kw)


def test_the_gpu_training_step_needs_no_xla_collective_and_is_exact():
    expect.train_step(_run("gpu_train_step", timeout=180))


@pytest.mark.proof
def test_the_gpu_rail_fault_lands_inside_the_collective_and_is_exact():
    expect.rail_fault(_run("gpu_rail_fault", timeout=180))


@pytest.mark.proof
def test_the_gpu_matrix_and_mismatch_workers_need_no_xla_collective():
    # the matrix at its small size only (the GPU run adds a size of several staging chunks)
    expect.matrix(_run("gpu_matrix", args={"sizes": [1000]}, timeout=300))
    expect.mismatch(_run("mismatch", config={"timeout_s": 5.0}, timeout=120))
    expect.subnormals(_run("gpu_subnormals", timeout=120))


def test_the_gpu_smoke_is_exact_and_its_processes_log_the_same_run_ids(monkeypatch):
    monkeypatch.setenv("R2CCL_DEBUG", "INFO")   # the one call line per collective
    rs = _run("gpu_smoke", timeout=120)
    smoke = _smoke_module()
    for r in rs:
        assert r["result"]["bad"] == [] and len(r["result"]["ran"]) == 5, r["result"]
    agree, why = smoke.compare([smoke.calls(r["output"]) for r in rs])
    assert agree, why
    assert len(smoke.calls(rs[0]["output"])) == 10, rs[0]["output"][-2000:]   # 5 programs, each run twice


def _smoke_module():
    spec = importlib.util.spec_from_file_location("gpu_smoke", os.path.join(os.path.dirname(HERE), "bench",
                                                                           "gpu_smoke.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_the_smoke_names_the_setting_that_makes_run_ids_agree_when_they_differ():
    smoke = _smoke_module()
    line = "[r2ccl 0 1.0 INFO] call: run {} op 1 comm 7 group 0 rank {} all_reduce 2 elements on cuda\n"
    p0 = smoke.calls(line.format("a1", 0) + line.format("a2", 0))
    assert p0 == [("a1", "1", 0, 0), ("a2", "1", 0, 0)]
    assert smoke.compare([p0, smoke.calls(line.format("a1", 1) + line.format("a2", 1))])[0]
    agree, why = smoke.compare([p0, smoke.calls(line.format("a1", 1) + line.format("b2", 1))])
    assert not agree and "jax_share_binary_between_hosts" in why and "xla_gpu_autotune_level=0" in why, why
    assert not smoke.compare([p0, []])[0]
