"""The simulator's model of the test bed against what the test bed measured (issue 6,
calibration): bench JSON recorded on the 2-host (500mbit) and 4-host (100mbit) beds, healthy,
one NIC down, one NIC at a tenth, and the degraded-mode plans. The files in tests/data/sim are
the benchmark's JSON output with the per-iteration records left out (BENCHMARKS.md has the
commands that made them)."""

import glob
import os
import subprocess
import sys

import pytest

DATA = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data", "sim")


def test_the_model_predicts_the_test_bed_within_10_percent():
    from jax_r2ccl.sim.calibrate import calibrate
    rows = calibrate(sorted(glob.glob(os.path.join(DATA, "*-2h.json"))), "500mbit", 150e-6)
    rows += calibrate(sorted(glob.glob(os.path.join(DATA, "*-4h.json"))), "100mbit", 150e-6)
    assert len(rows) == 10, rows   # 3 two-host files x 2 sizes, 4 four-host files x 64 MiB
    scenarios = {tuple(r["capacities"]) for r in rows}
    assert {(4.0, 4.0), (3.0, 3.0), (4.0, 4.0, 4.0, 3.0), (4.0, 4.0, 4.0, 2.0)} <= scenarios, scenarios
    assert any(2.9 < r["capacities"][0] < 3.3 for r in rows), rows          # the NIC at a tenth
    for r in rows:
        assert abs(r["error"]) <= 0.10, r


def test_the_simulator_costs_are_the_planners():
    from jax_r2ccl import _core
    from jax_r2ccl.sim import Cluster, allreduce_seconds, parse_rate
    assert parse_rate("500mbit") == 500e6 and parse_rate("12.5MB/s") == 100e6 and parse_rate("400gbit") == 400e9
    with pytest.raises(ValueError):
        parse_rate("fast")
    c = Cluster.testbed(4, 4, "100mbit")
    for plan in ("balance", "r2cc", "weighted", "optimal", "auto"):
        got = allreduce_seconds(c, 64 << 20, [4, 4, 4, 2], plan)
        want = _core.plan_predict(plan, [4, 4, 4, 2], float(64 << 20), c.nic_Bps, c.alpha_s)
        assert got["seconds"] == want["predicted_s"] and got["shares"] == list(want["shares"])
    big = Cluster(servers=128)   # the paper's shape: 8 GPUs and 8 NICs of 400 Gbit/s per server
    healthy = allreduce_seconds(big, 1 << 30)["seconds"]
    half = allreduce_seconds(big, 1 << 30, [8.0] * 127 + [4.0])["seconds"]
    assert 1.0 < half / healthy < 1.02   # 128 servers: one at half its NICs costs ~0
    with pytest.raises(ValueError):
        allreduce_seconds(big, 1 << 30, [8.0] * 3)


def test_calibrate_command_line(tmp_path):
    # run outside the checkout: `-m jax_r2ccl` must find the built package, not the source tree
    files = sorted(glob.glob(os.path.join(DATA, "*-2h.json")))
    r = subprocess.run([sys.executable, "-m", "jax_r2ccl", "sim", "calibrate", *files, "--rate", "500mbit"],
                       capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "worst error" in r.stdout and "degrade-2h.json" in r.stdout
    r = subprocess.run([sys.executable, "-m", "jax_r2ccl", "sim", "calibrate", *files, "--rate", "250mbit"],
                       capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert r.returncode == 1, r.stdout   # a wrong rate is caught


def test_plans_at_1024_gpus_match_the_paper_model_and_the_planner_nearly_hides_the_loss():
    from jax_r2ccl.sim import Cluster
    from jax_r2ccl.sim.plans import table
    c = Cluster(servers=128)
    rows = {(r["x"], r["plan"]): r for r in table(c, float(1 << 30), [0.25, 0.5])}
    n = 128
    for x in (0.25, 0.5):
        # the paper's models, on the network part: Balance 1/(1-X); R2CC 1 + nX/(2(n-1)(1-X)) (to ~1%)
        assert abs(rows[(x, "balance")]["net_vs_healthy"] - 1 / (1 - x)) < 0.01
        assert abs(rows[(x, "r2cc")]["net_vs_healthy"] - (1 + n * x / (2 * (n - 1) * (1 - x)))) < 0.02
        assert rows[(x, "auto")]["ran"] == "optimal" and rows[(x, "optimal")]["net_vs_healthy"] < 1.01


def test_run_without_failures_costs_nothing_and_with_them_orders_the_policies():
    from jax_r2ccl.sim import Cluster
    from jax_r2ccl.sim.failures import Failure, capacity_segments, poisson
    from jax_r2ccl.sim.run import POLICIES, WORKLOADS, simulate
    c = Cluster(servers=16)
    wl = WORKLOADS["gpt-13b-dp"]
    pols = list(POLICIES.values())
    for r in simulate(c, wl, [], 3600.0, pols, 1800.0, 600.0):
        assert abs(r["overhead"]) < 1e-12, r
    fs = poisson(c, 0.05, 3600.0, seed=1)
    assert fs == poisson(c, 0.05, 3600.0, seed=1) and len(fs) > 0          # seeded
    by = {r["policy"]: r["overhead"] for r in simulate(c, wl, fs, 3600.0, pols, 1800.0, 600.0)}
    assert 0 < by["jax_r2ccl"] <= by["r2ccl-r2cc"] <= by["r2ccl-balance"] < by["crash-restart"], by
    # segments: a NIC down then degraded on one server, overlapping: the worst factor counts
    segs = list(capacity_segments(Cluster(servers=2, nics_per_server=4),
                                  [Failure(10, 1, 2, "down", 20), Failure(15, 1, 2, "degrade", 30, 0.1)], 100))
    assert [(s, e, list(caps)) for s, e, caps, _ in segs] == [
        (0.0, 10, [4, 4]), (10, 15, [4, 3]), (15, 30, [4, 3]), (30, 45, [4, 3.1]), (45, 100, [4, 4])]


def test_run_command_line_writes_the_results_json(tmp_path):
    out = tmp_path / "sim.json"
    r = subprocess.run([sys.executable, "-m", "jax_r2ccl", "sim", "run", "--gpus", "1024", "--steps", "10000",
                        "--failures", "poisson:0.01", "--seed", "2", "--json", str(out)],
                       capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert r.returncode == 0, r.stdout + r.stderr
    import json
    res = json.loads(out.read_text())["results"]
    assert {x["policy"] for x in res} == {"crash-restart", "r2ccl-balance", "r2ccl-r2cc", "jax_r2ccl"}
    assert all({"policy", "workload", "gpus", "overhead", "failures"} <= set(x) and x["gpus"] == 1024 for x in res)
